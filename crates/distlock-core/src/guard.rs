//! The guard a user holds: a handle on a [`Hold`], one per nesting level.
//! The top of core's layers, beside the client.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tracing::Instrument;

use crate::error::{Error, LostReason, Result};
use crate::keeper::Keeper;
use crate::lease::{lock, HoldState, Lease};
use crate::name::LockName;
use crate::slot::Hold;
use crate::token::FencingToken;

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
            d.field("name", &h.lease.req.name)
                .field("token", &h.lease.token)
                .field("state", &*h.lease.state.get());
        }
        d.finish()
    }
}

impl LockGuard {
    pub(crate) fn new(hold: Arc<Hold>) -> Self {
        Self { hold: Some(hold) }
    }

    /// The hold behind this guard, shared.
    pub(crate) fn hold_arc(&self) -> Arc<Hold> {
        self.hold().clone()
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
        &self.hold().lease.req.name
    }

    /// The fencing token of this acquisition.
    pub fn token(&self) -> FencingToken {
        self.hold().lease.token
    }

    /// The kind of hold: an exclusive lock, a shared hold, a permit of a
    /// semaphore, or a leadership.
    pub fn kind(&self) -> crate::backend::HoldKind {
        self.hold().lease.req.kind
    }

    /// The TTL the lock was acquired with.
    pub fn ttl(&self) -> Duration {
        self.hold().lease.req.ttl
    }

    /// The conservative local deadline, or `None` once lost.
    pub fn deadline(&self) -> Option<Instant> {
        self.hold().lease.deadline()
    }

    /// Whether the lock is still held as far as this process can tell: not
    /// reported lost and the local deadline not yet passed.
    pub fn is_held(&self) -> bool {
        self.deadline().is_some_and(|d| Instant::now() < d)
    }

    /// How many nested guards share this acquisition.
    pub fn hold_count(&self) -> usize {
        self.hold().depth()
    }

    /// Resolves when the lock may no longer be held.
    pub async fn lost(&self) -> LostReason {
        match self.hold().lease.state.settled().await {
            HoldState::Lost(reason) => reason,
            // Released: nothing more will happen to this hold.
            _ => std::future::pending().await,
        }
    }

    /// Runs `fut` while the lock is held; if the lock may be lost first,
    /// drops `fut` and returns [`Error::LeaseLost`].
    pub async fn run_until_lost<F: Future>(&self, fut: F) -> Result<F::Output> {
        if !self.is_held() {
            // Past a deadline that a stalled thread kept the keeper from
            // reporting: `fut` does not start.
            return Err(Error::LeaseLost {
                name: self.name().clone(),
                reason: self.lost().await,
            });
        }
        tokio::select! {
            biased;
            reason = self.lost() => Err(Error::LeaseLost { name: self.name().clone(), reason }),
            out = fut => Ok(out),
        }
    }

    /// Extends the lease to `ttl` from now (a TTL the lock could be
    /// acquired with, else [`Error::InvalidInput`]); renewal, if on, goes on
    /// before the new deadline with the lock's own TTL. On rejection the
    /// guard is marked lost and [`Error::LeaseLost`] is returned, as it is
    /// when the guard was reported lost before the answer came. An extend
    /// that fails or is cancelled may still have reached the server, so the
    /// deadline then moves to the earlier of the old one and this one's;
    /// one cancelled may land later still, so every renewal after it
    /// promises no more than this TTL past its own sending (a short one
    /// cancelled on a long lease ends the hold at its next deadline).
    pub async fn extend(&self, ttl: Duration) -> Result<()> {
        let Hold { keeper, lease, .. } = &**self.hold();
        self.not_lost()?;
        crate::client::check_ttl(&keeper.caps, ttl)?;
        let sent = Instant::now();
        let span = tracing::debug_span!("distlock.extend", lock = %lease.req.name, ?ttl);
        let renewal = lease.req.with_ttl(ttl);
        let out = OutExtend::send(keeper, lease, sent, sent + keeper.caps.safe_validity(ttl));
        let answer = keeper.backend.extend(&renewal).instrument(span).await;
        let deadline = out.answered(answer.as_ref().is_ok_and(|granted| *granted));
        match answer {
            // Answered after the deadline the lease had: it is lost there,
            // as the keeper's timer would have found had it run first (a
            // blocked thread), so that `is_held` never turns true again
            // once false.
            Ok(true) if lease.deadline().is_some_and(|d| Instant::now() >= d) => {
                keeper.lose(
                    lease,
                    LostReason::RenewalFailed(
                        "the extend was answered only after the lease's deadline".into(),
                    ),
                );
                keeper.release_after_loss(lease.clone());
                self.not_lost()
            }
            Ok(true) => {
                if lease.transition(HoldState::Held { deadline }) {
                    let mut r = lock(&lease.renewal);
                    r.next_renew = r.next_renew.min(keeper.first_renewal(sent, ttl));
                    drop(r);
                    keeper.rearm(lease);
                }
                // Reported lost while the answer was on its way (and
                // released on the server since): the extend holds nothing.
                self.not_lost()
            }
            Ok(false) => Err(self.rejected()),
            Err(e) => Err(e),
        }
    }

    /// [`Error::LeaseLost`] if the guard has been reported lost.
    fn not_lost(&self) -> Result<()> {
        let lease = &self.hold().lease;
        if let HoldState::Lost(reason) = &*lease.state.get() {
            return Err(Error::LeaseLost {
                name: lease.req.name.clone(),
                reason: reason.clone(),
            });
        }
        Ok(())
    }

    /// Marks the guard lost because the backend refused it, and the error
    /// that says so.
    fn rejected(&self) -> Error {
        let Hold { keeper, lease, .. } = &**self.hold();
        keeper.lose(lease, LostReason::RenewalRejected);
        Error::LeaseLost {
            name: lease.req.name.clone(),
            reason: LostReason::RenewalRejected,
        }
    }

    /// Replaces the value an election's leadership carries, only while it
    /// still leads; a refusal marks the guard lost.
    pub(crate) async fn proclaim(&self, value: &str) -> Result<()> {
        let Hold { keeper, lease, .. } = &**self.hold();
        self.not_lost()?;
        if !self.is_held() {
            return Err(Error::LeaseLost {
                name: lease.req.name.clone(),
                reason: LostReason::DeadlinePassed,
            });
        }
        let span = tracing::debug_span!("distlock.proclaim", election = %lease.req.name);
        if keeper
            .backend
            .proclaim(&lease.req, value)
            .instrument(span)
            .await?
        {
            // Lost while the answer was on its way: the value went with a
            // leadership already given up.
            self.not_lost()
        } else {
            Err(self.rejected())
        }
    }

    /// Releases this guard. For a nested guard this only lowers the hold
    /// count. Returns whether the backend still had the lock as ours
    /// (`false`: it had expired or been taken before the release); for a
    /// nested guard, whether the hold is live as far as this process can
    /// tell, without asking the backend.
    pub async fn release(mut self) -> Result<bool> {
        let Some(hold) = self.hold.take() else {
            return Ok(false);
        };
        if !hold.unnest() {
            return Ok(hold.is_live());
        }
        // Dropped before the release answers (a timeout around it, say),
        // the release goes on in the background, as for a dropped guard.
        let mut unfinished = Unfinished(Some(hold.clone()));
        let result = hold.finish().await;
        unfinished.0 = None;
        result
    }
}

/// A hold whose release has not answered yet; dropped so, it is released
/// in the background.
struct Unfinished(Option<Arc<Hold>>);

impl Drop for Unfinished {
    fn drop(&mut self) {
        if let Some(hold) = self.0.take() {
            finish_detached(hold);
        }
    }
}

/// Releases `hold` in a task of its own, on the runtime it was acquired on
/// (or the current one); with neither, ends it here and leaves its lease to
/// expire. A runtime shut down since runs nothing: the lease expires too.
fn finish_detached(hold: Arc<Hold>) {
    let finishing = hold.clone();
    let spawned = hold.runtime.spawn(async move {
        let _ = finishing.finish().await;
    });
    if !spawned {
        tracing::warn!(lock = %hold.lease.req.name, "guard dropped outside a runtime; the lease will expire after its TTL");
        hold.finish_local();
    }
}

/// A user's extend on its way: counted with the keeper's renewals that
/// overlap it, and if it fails or is dropped unanswered, the deadline moves
/// no later than the one it would set.
struct OutExtend<'a> {
    keeper: &'a Arc<Keeper>,
    lease: &'a Arc<Lease>,
    id: u64,
    deadline: Instant,
    answered: bool,
}

impl<'a> OutExtend<'a> {
    fn send(
        keeper: &'a Arc<Keeper>,
        lease: &'a Arc<Lease>,
        sent: Instant,
        deadline: Instant,
    ) -> Self {
        let id = lock(&lease.renewal).sending(sent, deadline);
        Self {
            keeper,
            lease,
            id,
            deadline,
            answered: false,
        }
    }

    /// The deadline a grant sets.
    fn answered(mut self, granted: bool) -> Instant {
        self.answered = true;
        let deadline = lock(&self.lease.renewal)
            .answered(self.id, granted)
            .unwrap_or(self.deadline);
        if !granted {
            self.settle();
        }
        deadline
    }

    fn settle(&self) {
        self.lease.maybe_extended(self.deadline);
        self.keeper.rearm(self.lease);
    }
}

impl Drop for OutExtend<'_> {
    /// Given up unanswered: the extend stays out in the lease's count (it
    /// may still land, after any later one).
    fn drop(&mut self) {
        if !self.answered {
            self.settle();
        }
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        let Some(hold) = self.hold.take() else { return };
        if hold.unnest() {
            finish_detached(hold);
        }
    }
}
