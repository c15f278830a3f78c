//! What a user holds: the client and its builder, the top of core's layers.
//! A builder validates, takes a slot's local permit (coalescing), asks the
//! backend, and starts a [`Hold`] (its lease armed in the keeper) behind
//! the guard it returns.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::OwnedSemaphorePermit;
use tokio::time::Instant;
use tracing::Instrument;

use crate::backend::{Backend, Capabilities, DynBackend, Grant, HoldKind, LockRequest};
use crate::error::{Error, InputKind, LostReason, Result};
use crate::guard::LockGuard;
use crate::keeper::Keeper;
use crate::lease::lock;
use crate::name::LockName;
use crate::slot::{
    fit_existing_gate, local_share, slot_ref, Acquired, Claim, Hold, SlotRef, SlotTable,
};

/// The default lease TTL: long enough to survive a slow renewal round trip,
/// short enough that a crashed holder frees the lock within half a minute.
pub const DEFAULT_TTL: Duration = Duration::from_secs(30);

/// A lock client over one backend.
///
/// Cheap to clone; clones share the backend connection and the in-process
/// state. Everything a user relies on lives here and behaves the same on
/// every backend:
/// - a conservative local deadline per lock, measured on a monotonic clock
///   started before the acquire request was sent;
/// - automatic renewal by the keeper at about TTL/3;
/// - [`LockGuard::lost`] when the lock may no longer be held;
/// - reentrancy for an explicit [`holder`](LockBuilder::holder);
/// - in-process coalescing: tasks of one client waiting for the same name
///   queue locally, and at most as many of them wait on the server as the
///   client could have holds of that name (one for a lock).
#[derive(Clone)]
pub struct LockClient {
    pub(crate) inner: Arc<ClientInner>,
}

pub(crate) struct ClientInner {
    pub(crate) keeper: Arc<Keeper>,
    slots: Arc<SlotTable>,
    /// The holder info of this client's holds unless a builder sets one.
    holder_info: Arc<str>,
}

impl fmt::Debug for LockClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockClient")
            .field("backend", &self.inner.keeper.backend)
            .field("local_names", &lock(&self.inner.slots).len())
            .finish()
    }
}

impl LockClient {
    /// A client over `backend`.
    pub fn new(backend: impl Backend) -> Self {
        Self::from_dyn(Arc::new(backend))
    }

    /// A client over an already shared backend.
    pub fn from_dyn(backend: DynBackend) -> Self {
        Self {
            inner: Arc::new(ClientInner {
                keeper: Keeper::new(backend),
                slots: Arc::default(),
                holder_info: crate::holder::default_holder_info(),
            }),
        }
    }

    /// The same client (sharing its backend, renewals and local state)
    /// storing `info` with each hold instead of the default
    /// `<host name> pid <process id>`; a builder's
    /// [`holder_info`](LockBuilder::holder_info) overrides it per hold.
    /// Empty, oversized (above
    /// [`MAX_HOLDER_INFO_LEN`](crate::MAX_HOLDER_INFO_LEN)) or multi-line
    /// info is [`Error::InvalidInput`].
    pub fn with_holder_info(&self, info: impl AsRef<str>) -> Result<Self> {
        let info = info.as_ref();
        crate::holder::validate_holder_info(info)?;
        Ok(Self {
            inner: Arc::new(ClientInner {
                keeper: self.inner.keeper.clone(),
                slots: self.inner.slots.clone(),
                holder_info: Arc::from(info),
            }),
        })
    }

    /// The holder info this client stores with its holds.
    pub fn holder_info(&self) -> &str {
        &self.inner.holder_info
    }

    /// Who holds what: every live hold whose name starts with `prefix`
    /// (`""`: all), at most `limit` records, sorted by name. See
    /// [`Backend::list`] and the backend's documented cost.
    pub async fn list(&self, prefix: &str, limit: usize) -> Result<Vec<crate::HoldRecord>> {
        crate::holder::validate_prefix(prefix)?;
        if limit == 0 {
            return Err(Error::invalid(
                InputKind::Config,
                "a listing needs a limit of at least one record",
            ));
        }
        self.inner.keeper.backend.list(prefix, limit).await
    }

    /// The backend's declared capabilities.
    pub fn capabilities(&self) -> &Capabilities {
        &self.inner.keeper.caps
    }

    /// The backend itself, for its primitive operations.
    pub fn backend(&self) -> &DynBackend {
        &self.inner.keeper.backend
    }

    /// Starts building a lock on `name`. An invalid name is reported when
    /// the lock is acquired, as [`Error::InvalidInput`].
    pub fn lock(&self, name: impl AsRef<str>) -> LockBuilder {
        self.builder(name, HoldKind::Exclusive)
    }

    /// Starts building an acquisition of one of `limit` permits of the
    /// semaphore `name`. The guard, renewal, `lost()`, waiting and
    /// reentrancy are a lock's. The limit is stored with the semaphore; a
    /// request with another limit gets [`Error::LimitMismatch`]. A limit of
    /// zero, or a backend without semaphores, is reported when acquired.
    pub fn semaphore(&self, name: impl AsRef<str>, limit: u32) -> LockBuilder {
        self.builder(name, HoldKind::Permits { limit })
    }

    /// Changes the limit stored with the semaphore `name` and returns the
    /// one it had (`None`: the semaphore had none stored). See
    /// [`Backend::set_limit`].
    pub async fn set_semaphore_limit(
        &self,
        name: impl AsRef<str>,
        limit: u32,
    ) -> Result<Option<u32>> {
        let name = LockName::new(name)?;
        let kind = HoldKind::Permits { limit };
        check_kind(&self.inner.keeper.caps, &kind)?;
        let had = self.inner.keeper.backend.set_limit(&name, limit).await?;
        fit_existing_gate(&self.inner.slots, &name, kind, limit);
        Ok(had)
    }

    /// Starts building a hold of every lock in `names` at once: all held,
    /// or none. The names are taken in one canonical (sorted) order
    /// whatever order they are given in, so two callers asking for the same
    /// names in opposite orders cannot deadlock; a name given twice is
    /// [`Error::InvalidInput`]. One [`MultiGuard`](crate::MultiGuard) holds
    /// them all.
    pub fn lock_all<I, S>(&self, names: I) -> crate::MultiLockBuilder
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        crate::MultiLockBuilder::new(
            self.builder("", HoldKind::Exclusive),
            names.into_iter().map(LockName::new).collect(),
        )
    }

    /// The election `name`: campaign for its leadership, read its leader,
    /// observe its leaders. A backend without elections refuses each with
    /// [`Error::Unsupported`] before sending anything.
    pub fn election(&self, name: impl AsRef<str>) -> crate::Election {
        crate::Election::new(self.inner.clone(), name.as_ref().to_string())
    }

    fn builder(&self, name: impl AsRef<str>, kind: HoldKind) -> LockBuilder {
        LockBuilder::of(self.inner.clone(), name, kind)
    }
}

/// A TTL the backend can keep: more than zero and within its range.
pub(crate) fn check_ttl(caps: &Capabilities, ttl: Duration) -> Result<()> {
    if ttl.is_zero() {
        return Err(Error::invalid(
            InputKind::Duration,
            "TTL must be greater than zero",
        ));
    }
    if ttl < caps.min_ttl || ttl > caps.max_ttl {
        return Err(Error::invalid(
            InputKind::Duration,
            format!(
                "TTL {:?} is outside {}'s range, {:?} to {:?}",
                ttl, caps.backend, caps.min_ttl, caps.max_ttl
            ),
        ));
    }
    // A hold is trusted for the TTL less the drift margin: with none left,
    // every grant would arrive past its own deadline.
    if caps.safe_validity(ttl).is_zero() {
        return Err(Error::invalid(
            InputKind::Duration,
            format!(
                "TTL {:?} leaves no time to hold: {}'s margin for clock drift takes {:?} of it; use a longer TTL",
                ttl,
                caps.backend,
                caps.drift_margin(ttl)
            ),
        ));
    }
    Ok(())
}

/// Refuses a kind the backend does not declare, before anything is sent.
pub(crate) fn check_kind(caps: &Capabilities, kind: &HoldKind) -> Result<()> {
    if !caps.supports(kind) {
        return Err(Error::Unsupported {
            backend: caps.backend,
            operation: match kind {
                HoldKind::Shared => "shared holds (read-write locks)",
                HoldKind::Leader => "elections",
                _ => "semaphores",
            },
        });
    }
    if kind.holders() == 0 {
        return Err(Error::invalid(
            InputKind::Config,
            "a semaphore needs a limit of at least one permit",
        ));
    }
    Ok(())
}

/// Options for one acquisition; finish with [`acquire`](Self::acquire),
/// [`try_acquire`](Self::try_acquire) or [`run`](Self::run).
#[must_use = "a lock builder does nothing until acquired"]
pub struct LockBuilder {
    pub(crate) client: Arc<ClientInner>,
    name: Result<LockName>,
    kind: HoldKind,
    ttl: Duration,
    pub(crate) wait: Option<Duration>,
    renew: bool,
    max_hold: Option<Duration>,
    holder: Option<String>,
    /// The holder info stored with the hold on the server (checked when
    /// acquired).
    holder_info: Arc<str>,
    /// The value the hold carries (an election's proposal).
    value: Option<Arc<str>>,
    /// An option that does not fit the kind, reported when acquired.
    misuse: Option<&'static str>,
}

impl fmt::Debug for LockBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockBuilder")
            .field("name", &self.name.as_ref().ok())
            .field("kind", &self.kind)
            .field("ttl", &self.ttl)
            .field("wait", &self.wait)
            .field("renew", &self.renew)
            .field("max_hold", &self.max_hold)
            .field("holder", &self.holder)
            .finish()
    }
}

impl LockBuilder {
    pub(crate) fn of(client: Arc<ClientInner>, name: impl AsRef<str>, kind: HoldKind) -> Self {
        LockBuilder {
            name: LockName::new(name),
            kind,
            ttl: DEFAULT_TTL,
            wait: None,
            renew: true,
            max_hold: None,
            holder: None,
            holder_info: client.holder_info.clone(),
            value: None,
            misuse: None,
            client,
        }
    }

    pub(crate) fn with_value(mut self, value: impl Into<Arc<str>>) -> Self {
        self.value = Some(value.into());
        self
    }

    /// Takes the lock shared (a reader of a read-write lock, like
    /// `flock -s`) instead of exclusively: shared holds of the name overlap,
    /// and exclude its exclusive hold both ways. Writer-preferring: an
    /// exclusive request waiting behind shared holds holds back new shared
    /// ones (see [`HoldKind::Shared`]). A holder that
    /// holds the lock exclusively and asks for it shared nests into its
    /// exclusive hold; the reverse is [`Error::UpgradeRefused`]. On a
    /// semaphore builder, or on a backend that does not declare
    /// [`Capabilities::shared`], the acquire is refused before anything is
    /// sent.
    pub fn shared(mut self) -> Self {
        self.kind = match self.kind {
            HoldKind::Exclusive | HoldKind::Shared => HoldKind::Shared,
            other => {
                self.misuse = Some("a semaphore permit cannot be shared; use lock(name).shared()");
                other
            }
        };
        self
    }

    /// The lease TTL (default [`DEFAULT_TTL`]). The keeper renews at
    /// about a third of it.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// How long [`acquire`](Self::acquire) waits (default: forever; a wait
    /// of more than [`LONGEST_WAIT`] is forever too). At the end it fails with
    /// [`Error::WaitTimeout`]; a backend still busy then (a request the
    /// server has not answered, its clean-up) gets [`ANSWER_GRACE`] more,
    /// and what a request cut there may have taken is released in the
    /// background.
    pub fn wait(mut self, wait: Duration) -> Self {
        self.wait = (wait <= LONGEST_WAIT).then_some(wait);
        self
    }

    /// Wait forever (the default).
    pub fn wait_forever(mut self) -> Self {
        self.wait = None;
        self
    }

    /// Do not renew: the lease ends after its TTL and the guard reports
    /// [`LostReason::DeadlinePassed`](crate::LostReason::DeadlinePassed).
    pub fn no_renew(mut self) -> Self {
        self.renew = false;
        self
    }

    /// Stop renewing once the lock has been held this long; the guard then
    /// reports [`LostReason::MaxHoldReached`](crate::LostReason::MaxHoldReached)
    /// and the hold is released (if that release fails, the lease expires
    /// on the server after its TTL).
    pub fn max_hold(mut self, max: Duration) -> Self {
        self.max_hold = Some(max);
        self
    }

    /// Names who holds the lock in your program. A second acquire with the
    /// same holder while the first is held nests (a hold count) instead of
    /// deadlocking; the backend lock is released when the last nested guard
    /// is released. Not tied to threads, so it works across `.await`. A
    /// nested guard shares the outer hold's lease: its deadline, renewal
    /// and `max_hold` are the outer hold's, and this builder's `ttl`,
    /// `no_renew`, `max_hold` and value are not applied. An empty holder
    /// is [`Error::InvalidInput`] when acquired.
    pub fn holder(mut self, holder: impl Into<String>) -> Self {
        self.holder = Some(holder.into());
        self
    }

    /// The holder info stored with this hold on the server, in place of
    /// the client's ([`LockClient::with_holder_info`]): who holds it, as
    /// `distlock status` and `distlock list` show. Empty, oversized or
    /// multi-line info is [`Error::InvalidInput`] when acquired, before
    /// anything is sent.
    pub fn holder_info(mut self, info: impl AsRef<str>) -> Self {
        self.holder_info = Arc::from(info.as_ref());
        self
    }

    /// Waits for the lock (see [`wait`](Self::wait)). Dropping the returned
    /// future leaves nothing held or queued.
    pub async fn acquire(self) -> Result<LockGuard> {
        let deadline = self.wait.and_then(|w| Instant::now().checked_add(w));
        match self.acquire_inner(Mode::Wait(deadline)).await? {
            Some(guard) => Ok(guard),
            // Mode::Wait only returns a guard or an error.
            None => Err(Error::invalid(
                InputKind::Config,
                "internal: waiting acquire returned nothing",
            )),
        }
    }

    /// One attempt: `Ok(None)` if the lock is held elsewhere (or by another
    /// task of this client).
    pub async fn try_acquire(self) -> Result<Option<LockGuard>> {
        self.acquire_inner(Mode::Once).await
    }

    /// Acquires, runs `fut` while the lock is held, and releases. If the lock
    /// may have been lost first, `fut` is dropped (cancelled) and
    /// [`Error::LeaseLost`] is returned, the way `consul lock` stops its child.
    /// A release that finds the lock no longer held (taken away after the
    /// last renewal, before anything here could notice) is
    /// [`Error::LeaseLost`] with [`LostReason::ReleaseRejected`] too: `fut`
    /// finished, but not under the lock throughout.
    pub async fn run<F: Future>(self, fut: F) -> Result<F::Output> {
        let guard = self.acquire().await?;
        let name = guard.name().clone();
        let out = guard.run_until_lost(fut).await;
        let released = guard.release().await;
        let out = out?;
        if !released? {
            return Err(Error::LeaseLost {
                name,
                reason: LostReason::ReleaseRejected,
            });
        }
        Ok(out)
    }

    fn validate(&self) -> Result<LockName> {
        let name = match &self.name {
            Ok(n) => n.clone(),
            Err(e) => return Err(e.input_again()),
        };
        self.validate_options()?;
        Ok(name)
    }

    /// Checks everything but the name.
    pub(crate) fn validate_options(&self) -> Result<()> {
        let caps = &self.client.keeper.caps;
        if let Some(misuse) = self.misuse {
            return Err(Error::invalid(InputKind::Config, misuse));
        }
        check_kind(caps, &self.kind)?;
        if self.holder.as_deref() == Some("") {
            return Err(Error::invalid(
                InputKind::Config,
                "holder is empty; name the holder, or leave it unset for no reentrancy",
            ));
        }
        crate::holder::validate_holder_info(&self.holder_info)?;
        check_ttl(caps, self.ttl)?;
        if self.max_hold.is_some_and(|m| m.is_zero()) {
            return Err(Error::invalid(
                InputKind::Duration,
                "max hold time must be greater than zero",
            ));
        }
        Ok(())
    }

    async fn acquire_inner(self, mode: Mode) -> Result<Option<LockGuard>> {
        let name = self.validate()?;
        let span = tracing::debug_span!("distlock.acquire", lock = %name, kind = %self.kind, backend = self.client.keeper.caps.backend, ttl = ?self.ttl);
        self.acquire_validated(name, mode).instrument(span).await
    }

    async fn acquire_validated(self, name: LockName, mode: Mode) -> Result<Option<LockGuard>> {
        let start = Instant::now();
        let gate = match self.take_local(&name, mode).await? {
            None => return Ok(None),
            Some(Local::Nested(guard)) => return Ok(Some(guard)),
            Some(Local::Gate(gate)) => gate,
        };
        let asked = self.ask_live(&name, mode, start).await;
        if let Err(Error::LimitMismatch { stored, .. }) = &asked {
            // The gate was widened for the limit asked for; the server
            // keeps another.
            drop(gate);
            fit_existing_gate(&self.client.slots, &name, self.kind, *stored);
            return asked.map(|_| None);
        }
        let Some((req, grant)) = asked? else {
            return Ok(None);
        };
        tracing::debug!(token = %grant.token, waited = ?start.elapsed(), "acquired");
        Ok(Some(self.start(gate, req, grant)))
    }

    /// Asks the backend for `name` in `mode` until it grants a lease still
    /// live when the answer comes (`None`: refused in [`Mode::Once`]).
    ///
    /// A wait outlasts a failure that a later request may not meet: the
    /// server unreachable for a moment, a failover, the waiter's own
    /// session ended. Each request has an owner of its own, and whatever a
    /// failed request may have left is released by its owner in the
    /// background, by one task for the whole wait ([`Leftovers`]: an
    /// outage does not pile up a task per attempt). At the
    /// deadline the wait ends with the last failure; a session that ended
    /// is a wait that ran out: nothing was held, so nothing was lost.
    pub(crate) async fn ask_live(
        &self,
        name: &LockName,
        mode: Mode,
        start: Instant,
    ) -> Result<Option<(LockRequest, Grant)>> {
        let validity = self.client.keeper.caps.safe_validity(self.ttl);
        let mut failures = 0u32;
        let mut leftovers = Leftovers::default();
        let timed_out = || Error::WaitTimeout {
            name: name.clone(),
            waited: start.elapsed(),
        };
        // After a failure whose next pause would pass the deadline, one
        // last request, a try, goes out at the deadline.
        let mut last_try = false;
        loop {
            let req = self.request(name.clone());
            let answer = match mode {
                // The last try is bounded as the wait's requests are.
                Mode::Wait(Some(d)) if last_try => {
                    let asked = self.client.ask(&req, Mode::Once, &mut leftovers);
                    match tokio::time::timeout_at(d + ANSWER_GRACE, asked).await {
                        Ok(answer) => answer,
                        Err(_) => return Err(timed_out()),
                    }
                }
                _ => self.client.ask(&req, mode, &mut leftovers).await,
            };
            let grant = match answer {
                Ok(Some(grant)) => grant,
                Ok(None) if last_try => return Err(timed_out()),
                Ok(None) => return Ok(None),
                Err(e) if outlasted_by_a_wait(&e) && matches!(mode, Mode::Wait(_)) => {
                    let pause = RETRY_AFTER_FAILURE.delay(failures);
                    failures = failures.saturating_add(1);
                    let mut until = Instant::now() + pause;
                    if let Mode::Wait(Some(d)) = mode {
                        if last_try || Instant::now() >= d {
                            return Err(match e {
                                Error::LeaseLost { .. } => timed_out(),
                                e => e,
                            });
                        }
                        if until >= d {
                            until = d;
                            last_try = true;
                        }
                    }
                    tracing::warn!(lock = %name, error = %e, retry_in = ?until.saturating_duration_since(Instant::now()), "acquire failed; asking again while the wait lasts");
                    tokio::time::sleep_until(until).await;
                    continue;
                }
                Err(e) => return Err(e),
            };
            if Instant::now() < grant.began + validity {
                return Ok(Some((req, grant)));
            }
            // Granted, but answered only after the lease's deadline (a
            // server or file busy for longer than the TTL): worth nothing
            // to the caller, who would hold a lease already lost. It is
            // given back (by owner), and asked for anew while the wait
            // lasts.
            tracing::warn!(lock = %name, token = %grant.token, took = ?grant.began.elapsed(), "granted only after the lease's deadline; giving it back");
            leftovers.leave(&self.client.keeper.backend, req);
            match mode {
                Mode::Once => return Ok(None),
                Mode::Wait(Some(d)) if last_try || Instant::now() >= d => return Err(timed_out()),
                // A server that answers every grant late is not asked
                // again at once.
                Mode::Wait(_) => tokio::time::sleep(self.ttl.min(Duration::from_secs(1))).await,
            }
        }
    }

    /// The local side of `name`: a nested guard if this builder's holder
    /// holds it already (or is granted it by an acquire of its own under
    /// way, which this one waits for), else the slot's local permit (waited
    /// for in `mode`; `None`: not free at once, or the wait ran out in
    /// [`Mode::Once`]).
    pub(crate) async fn take_local(&self, name: &LockName, mode: Mode) -> Result<Option<Local>> {
        let start = Instant::now();
        let timed_out = || Error::WaitTimeout {
            name: name.clone(),
            waited: start.elapsed(),
        };
        let slot = slot_ref(&self.client.slots, name, self.kind);
        let claim = match &self.holder {
            None => None,
            Some(holder) => loop {
                let changed = slot.slot().changed.notified();
                tokio::pin!(changed);
                changed.as_mut().enable();
                if let Some(nested) = self.nest_in_own_hold(&slot, name)? {
                    return Ok(Some(nested));
                }
                if let Some(claim) = slot.slot().claim(holder) {
                    break Some(claim);
                }
                // The holder's own acquire is under way: its hold, once
                // granted, is nested in rather than a second one taken.
                match mode {
                    Mode::Once => return Ok(None),
                    Mode::Wait(None) => changed.await,
                    Mode::Wait(Some(d)) => tokio::time::timeout_at(d, changed)
                        .await
                        .map_err(|_| timed_out())?,
                }
            },
        };
        if let HoldKind::Permits { limit } = self.kind {
            slot.slot().widen_gate(limit);
        }
        let gate = slot.slot().gate.clone();
        let share = local_share(self.kind);
        let permit = match mode {
            Mode::Once => match gate.try_acquire_many_owned(share) {
                Ok(p) => p,
                Err(_) => return Ok(None),
            },
            Mode::Wait(deadline) => {
                let wait = gate.acquire_many_owned(share);
                let acquired = match deadline {
                    None => Ok(wait.await),
                    Some(d) => tokio::time::timeout_at(d, wait).await,
                };
                match acquired {
                    Ok(Ok(p)) => p,
                    // The gate is never closed; both arms mean we ran out of time.
                    Ok(Err(_)) | Err(_) => return Err(timed_out()),
                }
            }
        };
        Ok(Some(Local::Gate(Gate {
            claim,
            slot,
            permit,
        })))
    }

    /// A nested guard in the hold this builder's holder already has of
    /// `name`, if it has one.
    fn nest_in_own_hold(&self, slot: &SlotRef, name: &LockName) -> Result<Option<Local>> {
        let Some(holder) = &self.holder else {
            return Ok(None);
        };
        let Some(hold) = slot.slot().held_by(holder) else {
            return Ok(None);
        };
        // An exclusive hold covers a shared request; the reverse would be
        // an upgrade.
        if hold.lease.req.kind == HoldKind::Shared && self.kind == HoldKind::Exclusive {
            return Err(Error::UpgradeRefused {
                name: name.clone(),
                holder: holder.clone(),
            });
        }
        Ok(hold.nest().then(|| Local::Nested(LockGuard::new(hold))))
    }

    /// The backend request for `name` with this builder's kind and TTL.
    pub(crate) fn request(&self, name: LockName) -> LockRequest {
        let mut req = LockRequest::new(name, self.ttl);
        req.kind = self.kind;
        req.value = self.value.clone();
        req.holder_info = Some(self.holder_info.clone());
        req
    }

    /// Starts the hold behind a grant and returns its guard.
    pub(crate) fn start(&self, gate: Gate, req: LockRequest, grant: Grant) -> LockGuard {
        let Gate {
            claim,
            slot,
            permit,
        } = gate;
        if let HoldKind::Permits { limit } = req.kind {
            slot.slot().fit_gate(limit);
        }
        // The deadline counts from when the backend says the lease began:
        // before the granting request was sent, so it is conservative.
        let hold = Hold::start(
            self.client.keeper.clone(),
            slot,
            permit,
            Acquired {
                req,
                token: grant.token,
                sent: grant.began,
                renew: self.renew,
                max_hold: self.max_hold,
                holder: self.holder.clone(),
            },
        );
        // In the slot now: the holder's other acquires nest in it.
        drop(claim);
        LockGuard::new(hold)
    }
}

/// A name's local side before the backend is asked.
pub(crate) enum Local {
    /// Held already by the same holder: one more nesting level.
    Nested(LockGuard),
    /// The name's slot and its local permit, kept for the whole hold.
    Gate(Gate),
}

/// A name's local side, taken for an acquire of the backend.
pub(crate) struct Gate {
    /// The holder's acquire under way (with a holder set). First, so it
    /// ends before the slot reference goes.
    claim: Option<Claim>,
    slot: SlotRef,
    permit: OwnedSemaphorePermit,
}

impl ClientInner {
    /// Asks the backend for `req` (once, or waiting in `mode`). Should the
    /// future be dropped, or the backend fail after it may have granted (a
    /// lost reply), the owner is released in the background, so nothing is
    /// left held by nobody.
    ///
    /// A wait ends at its deadline even where the backend's own steps do
    /// not: a backend still busy [`ANSWER_GRACE`] after the deadline (a
    /// request the server never answers, a retry of its own, its clean-up)
    /// is dropped, the wait fails with [`Error::WaitTimeout`], and since a
    /// request in flight may have been granted, the owner is released in
    /// the background like a dropped acquire's.
    ///
    /// A failed request's owner is left to `leftovers` to release.
    pub(crate) async fn ask(
        &self,
        req: &LockRequest,
        mode: Mode,
        leftovers: &mut Leftovers,
    ) -> Result<Option<Grant>> {
        let backend = &self.keeper.backend;
        let mut cleanup = ReleaseIfDropped::arm(backend.clone(), vec![req.clone()]);
        let start = Instant::now();
        let cut = mode.cut();
        let answered = match mode {
            Mode::Once => Some(backend.try_acquire(req).await),
            Mode::Wait(deadline) => {
                let waited = backend.acquire(req, deadline);
                match cut {
                    Some(cut) => tokio::time::timeout_at(cut, waited)
                        .await
                        .ok()
                        .map(|r| r.map(Some)),
                    None => Some(waited.await.map(Some)),
                }
            }
        };
        let Some(granted) = answered else {
            tracing::debug!(
                "the backend was still busy {ANSWER_GRACE:?} after the wait's deadline; releasing in the background"
            );
            return Err(Error::WaitTimeout {
                name: req.name.clone(),
                waited: start.elapsed(),
            });
        };
        match &granted {
            Ok(_) => cleanup.disarm(),
            Err(e) if grants_nothing(e) => cleanup.disarm(),
            // The error ends the acquire (no wait goes on after it), and the
            // server answered, so it is reachable: released before the
            // error is reported, within the wait's own bound.
            Err(e)
                if !(e.is_retryable()
                    || outlasted_by_a_wait(e) && matches!(mode, Mode::Wait(_))) =>
            {
                cleanup.release_now(grace_before(cut)).await;
            }
            Err(_) => {
                cleanup.disarm();
                leftovers.leave(backend, req.clone());
            }
        }
        if let Err(e) = &granted {
            tracing::debug!(error = %e, "acquire failed");
        }
        granted
    }
}

/// Errors after which a waiting acquire asks again while its wait lasts:
/// the backend unreachable or without a quorum for now, or the waiter's own
/// session or lease ended before anything was granted.
pub(crate) fn outlasted_by_a_wait(e: &Error) -> bool {
    matches!(
        e,
        Error::Unavailable { .. } | Error::QuorumNotReached { .. } | Error::LeaseLost { .. }
    )
}

/// The pause before a waiting acquire asks again after a failure: from
/// 100 ms, doubling up to 2 s (half jitter).
const RETRY_AFTER_FAILURE: crate::wait::Backoff = crate::wait::Backoff {
    initial: Duration::from_millis(100),
    max: Duration::from_secs(2),
};

/// How long after a wait's deadline the backend may still be busy (a
/// request in flight that may yet grant, the clean-up after its own
/// timeout) before the wait ends without it.
pub const ANSWER_GRACE: Duration = Duration::from_secs(1);

/// The longest wait with a deadline: a century. A longer one waits for
/// ever (a deadline that far may be past what the clock can count).
pub const LONGEST_WAIT: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// Errors after which the server cannot have granted anything.
pub(crate) fn grants_nothing(e: &Error) -> bool {
    matches!(
        e,
        Error::WaitTimeout { .. } | Error::InvalidInput { .. } | Error::LimitMismatch { .. }
    )
}

/// One attempt, or a wait until the deadline (forever with `None`).
#[derive(Clone, Copy)]
pub(crate) enum Mode {
    Once,
    Wait(Option<Instant>),
}

impl Mode {
    /// When a wait ends even if the backend is still busy: its deadline
    /// and [`ANSWER_GRACE`] after it (`None`: a try, or a wait for ever).
    pub(crate) fn cut(self) -> Option<Instant> {
        match self {
            Mode::Wait(deadline) => deadline.and_then(|d| d.checked_add(ANSWER_GRACE)),
            Mode::Once => None,
        }
    }
}

/// How long a release before an acquire's error may take without ending
/// the acquire after `cut`: [`ANSWER_GRACE`] at most.
pub(crate) fn grace_before(cut: Option<Instant>) -> Duration {
    cut.map_or(ANSWER_GRACE, |c| {
        ANSWER_GRACE.min(c.saturating_duration_since(Instant::now()))
    })
}

/// Releases requests' owners if dropped while armed: covers a caller that
/// drops the acquire future mid-flight and an acquire whose reply was lost.
pub(crate) struct ReleaseIfDropped {
    armed: Option<(DynBackend, Vec<LockRequest>)>,
    /// The runtime the acquire runs on, for a future dropped outside it.
    runtime: crate::completion::Spawner,
}

impl ReleaseIfDropped {
    pub(crate) fn arm(backend: DynBackend, reqs: Vec<LockRequest>) -> Self {
        Self {
            armed: Some((backend, reqs)),
            runtime: crate::completion::Spawner::here(),
        }
    }

    pub(crate) fn disarm(&mut self) {
        self.armed = None;
    }

    /// Releases the requests now, for at most `within`, those not answered
    /// by then in the background as on a drop (and all of them if this is
    /// dropped first): for an acquire that ends with an error, so that its
    /// caller, which may exit at once, leaves nothing held (a server that
    /// answered is reachable, so this costs a round trip on that path
    /// alone).
    pub(crate) async fn release_now(mut self, within: Duration) {
        let Some((backend, reqs)) = self.armed.clone() else {
            return;
        };
        let calls = reqs
            .iter()
            .map(|r| tokio::time::timeout(within, backend.release(r)));
        let answers = futures_util::future::join_all(calls).await;
        let left: Vec<LockRequest> = reqs
            .into_iter()
            .zip(answers)
            .filter(|(_, a)| !matches!(a, Ok(Ok(_))))
            .map(|(r, _)| r)
            .collect();
        self.armed = (!left.is_empty()).then_some((backend, left));
    }
}

impl Drop for ReleaseIfDropped {
    fn drop(&mut self) {
        let Some((backend, reqs)) = self.armed.take() else {
            return;
        };
        let n = reqs.len();
        let spawned = self.runtime.spawn(async move {
            for req in reqs {
                release_until_answered(&backend, &req).await;
            }
        });
        if !spawned {
            tracing::warn!(locks = n, "no runtime to clean up a cancelled acquire; the leases will expire after their TTL");
        }
    }
}

/// The owners of a wait's failed or late-answered requests, released in
/// the background by one task for the whole wait (started with the first
/// owner left, ended once the wait is over and every owner is answered or
/// given up). Each owner's first release call goes out at once, beside the
/// others', so a lost reply's grant is freed as soon as the server
/// answers; the calls that fail are asked again one at a time, at the pace
/// of one shared backoff, so a long outage costs the server about one
/// call a second rather than one per failed attempt. An owner is asked
/// again only while its lease could still be live (its TTL after it was
/// left).
#[derive(Default)]
pub(crate) struct Leftovers {
    queue: Option<tokio::sync::mpsc::UnboundedSender<LockRequest>>,
}

impl Leftovers {
    pub(crate) fn leave(&mut self, backend: &DynBackend, req: LockRequest) {
        if self.queue.is_none() {
            let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
            if !crate::completion::Spawner::here().spawn(release_in_turn(backend.clone(), rx)) {
                tracing::warn!(lock = %req.name, "no runtime to release a failed acquire's owner; its lease will expire after its TTL");
                return;
            }
            self.queue = Some(tx);
        }
        if let Some(queue) = &self.queue {
            // The task ends only once every sender is gone.
            let _ = queue.send(req);
        }
    }
}

/// The task behind [`Leftovers`].
async fn release_in_turn(
    backend: DynBackend,
    mut left: tokio::sync::mpsc::UnboundedReceiver<LockRequest>,
) {
    use futures_util::stream::{FuturesUnordered, StreamExt};
    let backoff = crate::wait::Backoff::new(Duration::from_millis(20), Duration::from_secs(1));
    // `retry`: one of the calls asked again, at most one out at a time.
    let call = |req: LockRequest, until: Instant, retry: bool| {
        let backend = backend.clone();
        async move {
            let answer = backend.release(&req).await;
            (req, until, retry, answer)
        }
    };
    let mut calls = FuturesUnordered::new();
    let mut again: std::collections::VecDeque<(LockRequest, Instant)> = Default::default();
    let (mut open, mut retrying, mut failures) = (true, false, 0u32);
    let mut next_retry = Instant::now();
    loop {
        tokio::select! {
            req = left.recv(), if open => match req {
                Some(req) => {
                    let until = Instant::now() + req.ttl;
                    calls.push(call(req, until, false));
                }
                None => open = false,
            },
            Some((req, until, retry, answer)) = calls.next(), if !calls.is_empty() => {
                retrying &= !retry;
                match answer {
                    Ok(_) => failures = 0,
                    Err(e) => {
                        failures = failures.saturating_add(1);
                        let at = Instant::now() + backoff.delay(failures - 1);
                        if e.is_retryable() && at < until {
                            tracing::debug!(lock = %req.name, error = %e, "cleanup release failed; trying again");
                            again.push_back((req, until));
                            next_retry = next_retry.max(at);
                        } else {
                            tracing::warn!(lock = %req.name, error = %e, "cleanup release after a failed acquire failed; the lease will expire after its TTL");
                        }
                    }
                }
            },
            () = tokio::time::sleep_until(next_retry), if !again.is_empty() && !retrying => {
                if let Some((req, until)) = again.pop_front() {
                    if Instant::now() < until {
                        retrying = true;
                        calls.push(call(req, until, true));
                    }
                }
            },
            else => break,
        }
    }
}

/// Releases `req` by owner, trying again after a retryable error (a
/// connection cut with the acquire's, which a pool hands out once more)
/// while the lease could still be live; a lease left behind blocks its
/// name for the whole TTL.
async fn release_until_answered(backend: &DynBackend, req: &LockRequest) {
    let until = Instant::now() + req.ttl;
    let backoff = crate::wait::Backoff::new(Duration::from_millis(20), Duration::from_secs(1));
    for attempt in 0u32.. {
        let pause = backoff.delay(attempt);
        match backend.release(req).await {
            Ok(_) => return,
            Err(e) if e.is_retryable() && Instant::now() + pause < until => {
                tracing::debug!(lock = %req.name, error = %e, "cleanup release failed; trying again");
                tokio::time::sleep(pause).await;
            }
            Err(e) => {
                tracing::warn!(lock = %req.name, error = %e, "cleanup release after a cancelled or failed acquire failed; the lease will expire after its TTL");
                return;
            }
        }
    }
}
