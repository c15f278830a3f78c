//! The guard a user holds, and the shared state behind nested guards.

use std::fmt;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{Notify, OwnedSemaphorePermit};
use tokio::time::Instant;
use tracing::Instrument;

use crate::backend::LockRequest;
use crate::client::{lock, ClientInner, SlotRef};
use crate::error::{Error, LostReason, Result};
use crate::name::LockName;
use crate::token::FencingToken;

#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum HoldState {
    Held { deadline: Instant },
    Lost(LostReason),
    Released,
}

/// A hold's state, and a wake-up for those waiting for it to leave Held.
///
/// A mutex and one `Notify` rather than a `watch` channel: the state is
/// read and written a few times per acquisition, and only a loss or a
/// release (once per hold) needs to wake anyone.
pub(crate) struct StateCell {
    now: Mutex<HoldState>,
    settled: Notify,
}

impl StateCell {
    fn new(state: HoldState) -> Self {
        Self {
            now: Mutex::new(state),
            settled: Notify::new(),
        }
    }

    /// The current state (hold the guard briefly).
    pub(crate) fn get(&self) -> std::sync::MutexGuard<'_, HoldState> {
        lock(&self.now)
    }

    /// Applies `f`; if it changed the state and the state is no longer
    /// Held, wakes the waiters. Returns what `f` returned.
    fn update_if(&self, f: impl FnOnce(&mut HoldState) -> bool) -> bool {
        let mut s = lock(&self.now);
        let changed = f(&mut s);
        let settled = changed && !matches!(*s, HoldState::Held { .. });
        drop(s);
        if settled {
            self.settled.notify_waiters();
        }
        changed
    }

    fn set(&self, next: HoldState) {
        self.update_if(|s| {
            *s = next;
            true
        });
    }

    /// Resolves once the state is no longer Held (it never returns to
    /// Held), with that state.
    pub(crate) async fn settled(&self) -> HoldState {
        loop {
            let notified = self.settled.notified();
            tokio::pin!(notified);
            // Registered before the check, so a change in between wakes us.
            notified.as_mut().enable();
            let now = self.get().clone();
            if !matches!(now, HoldState::Held { .. }) {
                return now;
            }
            notified.await;
        }
    }
}

/// One backend-level acquisition, shared by all nested guards on it.
pub(crate) struct Hold {
    pub(crate) client: Arc<ClientInner>,
    slot: SlotRef,
    permit: Mutex<Option<OwnedSemaphorePermit>>,
    pub(crate) req: LockRequest,
    pub(crate) token: FencingToken,
    pub(crate) max_hold_until: Option<Instant>,
    pub(crate) holder: Option<String>,
    nested: Mutex<usize>,
    pub(crate) state: StateCell,
    /// Renewal bookkeeping, owned by the watchdog.
    pub(crate) renewal: Mutex<crate::watchdog::Renewal>,
    /// This hold's entry in the watchdog's timer map.
    pub(crate) timer: Mutex<Option<crate::watchdog::TimerKey>>,
    /// This hold's place in its session's watcher: (session key, slot).
    pub(crate) session: Mutex<Option<(u64, u64)>>,
}

impl Hold {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn start(
        client: Arc<ClientInner>,
        slot: SlotRef,
        permit: OwnedSemaphorePermit,
        req: LockRequest,
        token: FencingToken,
        sent: Instant,
        renew: bool,
        max_hold: Option<Duration>,
        holder: Option<String>,
    ) -> Arc<Self> {
        let deadline = sent + client.caps.safe_validity(req.ttl);
        let period = req.ttl / 3;
        let first_renewal = if client.renewer.batching() {
            crate::renewer::align(sent + period, period)
        } else {
            sent + period
        };
        let renewing = renew && client.caps.extend;
        let hold = Arc::new(Hold {
            renewal: Mutex::new(crate::watchdog::Renewal::new(first_renewal, renewing)),
            timer: Mutex::new(None),
            session: Mutex::new(None),
            client,
            slot,
            permit: Mutex::new(Some(permit)),
            req,
            token,
            max_hold_until: max_hold.map(|m| sent + m),
            holder,
            nested: Mutex::new(1),
            state: StateCell::new(HoldState::Held { deadline }),
        });
        lock(&hold.slot.slot.held).push(hold.clone());
        crate::watchdog::start(&hold);
        hold
    }

    /// A nested acquire by the same holder.
    pub(crate) fn nest(self: Arc<Self>) -> Result<LockGuard> {
        if let HoldState::Lost(reason) = &*self.state.get() {
            return Err(Error::LeaseLost {
                name: self.req.name.clone(),
                reason: reason.clone(),
            });
        }
        let mut n = lock(&self.nested);
        if *n == 0 {
            // Being released right now: behave as if the hold had ended.
            return Err(Error::LeaseLost {
                name: self.req.name.clone(),
                reason: LostReason::RenewalRejected,
            });
        }
        *n += 1;
        tracing::debug!(lock = %self.req.name, depth = *n, "nested acquire");
        drop(n);
        Ok(LockGuard::new(self))
    }

    /// Moves from Held to `next`; a hold that is already lost or released
    /// stays so. Returns whether the state changed.
    pub(crate) fn transition(&self, next: HoldState) -> bool {
        self.state.update_if(|s| {
            if matches!(s, HoldState::Held { .. }) {
                *s = next;
                true
            } else {
                false
            }
        })
    }

    /// Reports the hold lost and lets the next local waiter in: a lost
    /// guard can protect nothing, so it must not keep this client's other
    /// tasks from acquiring anew.
    pub(crate) fn mark_lost(&self, reason: LostReason) {
        if self.transition(HoldState::Lost(reason.clone())) {
            tracing::warn!(lock = %self.req.name, token = %self.token, %reason, "lock lost");
        }
        self.free_local();
    }

    fn deadline(&self) -> Option<Instant> {
        match &*self.state.get() {
            HoldState::Held { deadline } => Some(*deadline),
            _ => None,
        }
    }

    /// Ends the hold: stops the watchdog, releases on the backend, lets the
    /// next local waiter in.
    async fn finish(&self) -> Result<bool> {
        self.state.set(HoldState::Released);
        let span =
            tracing::debug_span!("distlock.release", lock = %self.req.name, token = %self.token);
        let result = self
            .client
            .backend
            .release(&self.req)
            .instrument(span)
            .await;
        match &result {
            Ok(true) => tracing::debug!(lock = %self.req.name, token = %self.token, "released"),
            Ok(false) => {
                tracing::info!(lock = %self.req.name, token = %self.token, "released, but the backend says it was no longer ours")
            }
            Err(e) => {
                tracing::warn!(lock = %self.req.name, error = %e, "release failed; the lease will expire after its TTL")
            }
        }
        self.finish_local();
        result
    }

    fn finish_local(&self) {
        self.state.set(HoldState::Released);
        self.free_local();
    }

    fn free_local(&self) {
        self.client.scheduler.disarm(self);
        crate::watchdog::unwatch_session(self);
        lock(&self.slot.slot.held).retain(|h| !std::ptr::eq(Arc::as_ptr(h), self));
        lock(&self.permit).take();
    }

    /// Drops one nesting level; true when it was the last.
    fn unnest(&self) -> bool {
        let mut n = lock(&self.nested);
        *n = n.saturating_sub(1);
        *n == 0
    }
}

/// Proof of holding a lock. Release it with [`release`](Self::release); if
/// it is dropped instead, it is released in the background.
///
/// Watch [`lost`](Self::lost) (or use [`run_until_lost`](Self::run_until_lost)):
/// once it resolves, another process may hold the lock, and only the fencing
/// [`token`](Self::token) can still protect the resource.
pub struct LockGuard {
    hold: Option<Arc<Hold>>,
}

impl fmt::Debug for LockGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("LockGuard");
        if let Some(h) = &self.hold {
            d.field("name", &h.req.name)
                .field("token", &h.token)
                .field("state", &*h.state.get());
        }
        d.finish()
    }
}

impl LockGuard {
    pub(crate) fn new(hold: Arc<Hold>) -> Self {
        Self { hold: Some(hold) }
    }

    fn hold(&self) -> &Arc<Hold> {
        // `hold` is only taken by `release(self)` and `drop`, after which no
        // method can be called.
        match &self.hold {
            Some(h) => h,
            None => unreachable!("LockGuard used after release"),
        }
    }

    /// The lock's name.
    pub fn name(&self) -> &LockName {
        &self.hold().req.name
    }

    /// The fencing token of this acquisition.
    pub fn token(&self) -> FencingToken {
        self.hold().token
    }

    /// The kind of hold: a lock, or a permit of a semaphore.
    pub fn kind(&self) -> crate::backend::HoldKind {
        self.hold().req.kind
    }

    /// The TTL the lock was acquired with.
    pub fn ttl(&self) -> Duration {
        self.hold().req.ttl
    }

    /// The conservative local deadline, or `None` once lost.
    pub fn deadline(&self) -> Option<Instant> {
        self.hold().deadline()
    }

    /// Whether the lock is still held as far as this process can tell: not
    /// reported lost and the local deadline not yet passed.
    pub fn is_held(&self) -> bool {
        self.deadline().is_some_and(|d| Instant::now() < d)
    }

    /// How many nested guards share this acquisition.
    pub fn hold_count(&self) -> usize {
        *lock(&self.hold().nested)
    }

    /// Resolves when the lock may no longer be held.
    pub async fn lost(&self) -> LostReason {
        match self.hold().state.settled().await {
            HoldState::Lost(reason) => reason,
            // Released: nothing more will happen to this hold.
            _ => std::future::pending().await,
        }
    }

    /// Runs `fut` while the lock is held; if the lock may be lost first,
    /// drops `fut` and returns [`Error::LeaseLost`].
    pub async fn run_until_lost<F: Future>(&self, fut: F) -> Result<F::Output> {
        tokio::select! {
            biased;
            reason = self.lost() => Err(Error::LeaseLost { name: self.name().clone(), reason }),
            out = fut => Ok(out),
        }
    }

    /// Extends the lease to `ttl` from now. On rejection the guard is marked
    /// lost and [`Error::LeaseLost`] is returned.
    pub async fn extend(&self, ttl: Duration) -> Result<()> {
        let hold = self.hold();
        if let HoldState::Lost(reason) = &*hold.state.get() {
            return Err(Error::LeaseLost {
                name: hold.req.name.clone(),
                reason: reason.clone(),
            });
        }
        let sent = Instant::now();
        let span = tracing::debug_span!("distlock.extend", lock = %hold.req.name, ?ttl);
        let renewal = hold.req.with_ttl(ttl);
        if hold
            .client
            .backend
            .extend(&renewal)
            .instrument(span)
            .await?
        {
            if hold.transition(HoldState::Held {
                deadline: sent + hold.client.caps.safe_validity(ttl),
            }) {
                crate::watchdog::rearm(hold);
            }
            Ok(())
        } else {
            hold.mark_lost(LostReason::RenewalRejected);
            Err(Error::LeaseLost {
                name: hold.req.name.clone(),
                reason: LostReason::RenewalRejected,
            })
        }
    }

    /// Releases this guard. For a nested guard this only lowers the hold
    /// count. Returns whether the backend still had the lock as ours
    /// (`false`: it had expired or been taken before the release).
    pub async fn release(mut self) -> Result<bool> {
        let Some(hold) = self.hold.take() else {
            return Ok(false);
        };
        if hold.unnest() {
            hold.finish().await
        } else {
            Ok(hold.deadline().is_some())
        }
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        let Some(hold) = self.hold.take() else { return };
        if !hold.unnest() {
            return;
        }
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => {
                rt.spawn(async move {
                    let _ = hold.finish().await;
                });
            }
            Err(_) => {
                tracing::warn!(lock = %hold.req.name, "guard dropped outside a runtime; the lease will expire after its TTL");
                hold.finish_local();
            }
        }
    }
}
