//! Several locks held at once, all or nothing: the builder that takes them
//! in canonical order and the guard that holds them.
//!
//! Each name is an ordinary hold (slot, lease, keeper), so renewal,
//! `lost()`, reentrancy and cancellation are a single lock's; the keeper
//! renews holds that come due together in one `extend_many` batch. What is
//! added here is the order, the all-or-nothing rule, the backend's
//! one-request path ([`Backend::try_acquire_all`]) and the rule that losing
//! one hold releases the others.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::{join_all, select_all};
use tokio::time::Instant;
use tracing::Instrument;

use crate::backend::{AllAtOnce, Backend, LockRequest};
use crate::client::{grace_before, grants_nothing, Local, LockBuilder, Mode, ReleaseIfDropped};
use crate::error::{Error, InputKind, LostReason, Result};
use crate::guard::LockGuard;
use crate::lease::HoldState;
use crate::name::LockName;
use crate::slot::Hold;
use crate::token::FencingToken;

/// Options for holding several locks at once; finish with
/// [`acquire`](Self::acquire), [`try_acquire`](Self::try_acquire) or
/// [`run`](Self::run). Made by [`LockClient::lock_all`](crate::LockClient::lock_all).
#[must_use = "a lock builder does nothing until acquired"]
pub struct MultiLockBuilder {
    each: LockBuilder,
    names: Vec<std::result::Result<LockName, Error>>,
}

impl fmt::Debug for MultiLockBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MultiLockBuilder")
            .field("names", &self.names)
            .field("each", &self.each)
            .finish()
    }
}

impl MultiLockBuilder {
    pub(crate) fn new(each: LockBuilder, names: Vec<std::result::Result<LockName, Error>>) -> Self {
        Self { each, names }
    }

    /// The TTL of every lease (see [`LockBuilder::ttl`]).
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.each = self.each.ttl(ttl);
        self
    }

    /// How long [`acquire`](Self::acquire) waits for all of them together
    /// (default: forever).
    pub fn wait(mut self, wait: Duration) -> Self {
        self.each = self.each.wait(wait);
        self
    }

    /// Wait forever (the default).
    pub fn wait_forever(mut self) -> Self {
        self.each = self.each.wait_forever();
        self
    }

    /// Do not renew (see [`LockBuilder::no_renew`]).
    pub fn no_renew(mut self) -> Self {
        self.each = self.each.no_renew();
        self
    }

    /// Stop renewing after this long (see [`LockBuilder::max_hold`]).
    pub fn max_hold(mut self, max: Duration) -> Self {
        self.each = self.each.max_hold(max);
        self
    }

    /// Names the holder (see [`LockBuilder::holder`]): a name this holder
    /// holds already nests instead of deadlocking.
    pub fn holder(mut self, holder: impl Into<String>) -> Self {
        self.each = self.each.holder(holder);
        self
    }

    /// Waits until every lock is held (see [`wait`](Self::wait)). Dropping
    /// the returned future leaves nothing held or queued.
    pub async fn acquire(self) -> Result<MultiGuard> {
        let deadline = self.each.wait.and_then(|w| Instant::now().checked_add(w));
        match self.acquire_inner(Mode::Wait(deadline)).await? {
            Some(guard) => Ok(guard),
            None => Err(Error::invalid(
                InputKind::Config,
                "internal: waiting acquire returned nothing",
            )),
        }
    }

    /// One attempt: `Ok(None)` if any of the locks is held elsewhere; then
    /// none is held.
    pub async fn try_acquire(self) -> Result<Option<MultiGuard>> {
        self.acquire_inner(Mode::Once).await
    }

    /// Acquires all, runs `fut` while they are held, and releases them. If
    /// any may have been lost first, `fut` is dropped and
    /// [`Error::LeaseLost`] is returned; so it is, with
    /// [`LostReason::ReleaseRejected`], when a release finds one of them no
    /// longer held.
    pub async fn run<F: Future>(self, fut: F) -> Result<F::Output> {
        let guard = self.acquire().await?;
        let out = guard.run_until_lost(fut).await;
        let released = guard.release_each().await;
        let out = out?;
        if let Some(name) = released? {
            return Err(Error::LeaseLost {
                name,
                reason: LostReason::ReleaseRejected,
            });
        }
        Ok(out)
    }

    /// The names in canonical order; a typed error for an invalid name, a
    /// duplicate, or none at all.
    fn canonical(&self) -> Result<Vec<LockName>> {
        let mut names = Vec::with_capacity(self.names.len());
        for n in &self.names {
            match n {
                Ok(n) => names.push(n.clone()),
                Err(e) => return Err(e.input_again()),
            }
        }
        if names.is_empty() {
            return Err(Error::invalid(
                InputKind::LockName,
                "a multi-lock needs at least one name",
            ));
        }
        names.sort_unstable_by(|a, b| a.as_str().cmp(b.as_str()));
        if let Some(w) = names.windows(2).find(|w| w[0] == w[1]) {
            return Err(Error::invalid(
                InputKind::LockName,
                format!("`{}` is named twice; name each lock once", w[0]),
            ));
        }
        Ok(names)
    }

    async fn acquire_inner(self, mode: Mode) -> Result<Option<MultiGuard>> {
        let names = self.canonical()?;
        self.each.validate_options()?;
        let span = tracing::debug_span!(
            "distlock.acquire_all",
            locks = names.len(),
            backend = self.each.client.keeper.caps.backend
        );
        let start = Instant::now();
        async {
            loop {
                let Some(m) = self.acquire_validated(names.clone(), mode, start).await? else {
                    return Ok(None);
                };
                if m.is_held() {
                    return Ok(Some(m));
                }
                // A name taken first was lost while a later one was waited
                // for: all are given back (for `ANSWER_GRACE` at most and
                // not past the wait's cut, then in the background), and
                // (time allowing) taken anew.
                let _ = tokio::time::timeout(grace_before(mode.cut()), m.release()).await;
                match mode {
                    Mode::Once => return Ok(None),
                    Mode::Wait(Some(d)) if Instant::now() >= d => {
                        return Err(Error::WaitTimeout {
                            name: names[0].clone(),
                            waited: start.elapsed(),
                        })
                    }
                    Mode::Wait(_) => {}
                }
            }
        }
        .instrument(span)
        .await
    }

    /// One round of the acquire that began at `start` (what a timeout
    /// reports as waited).
    async fn acquire_validated(
        &self,
        names: Vec<LockName>,
        mode: Mode,
        start: Instant,
    ) -> Result<Option<MultiGuard>> {
        let each = &self.each;
        // Local permits first, in canonical order, then the backend: at
        // most one task of this client asks the server for a name.
        let mut guards: Vec<Taken> = Vec::with_capacity(names.len());
        let mut pending = Vec::new();
        for name in names {
            match each
                .take_local(&name, mode)
                .await
                .map_err(|e| whole_wait(e, start))?
            {
                None => return Ok(None),
                Some(Local::Nested(g)) => guards.push(Taken::Nested(g)),
                Some(Local::Gate(gate)) => {
                    pending.push((each.request(name), gate));
                    guards.push(Taken::Pending);
                }
            }
        }
        let mut started = Vec::with_capacity(pending.len());
        if pending.len() >= 2 {
            let reqs: Vec<LockRequest> = pending.iter().map(|(r, _)| r.clone()).collect();
            let backend = &each.client.keeper.backend;
            let mut cleanup = ReleaseIfDropped::arm(backend.clone(), reqs.clone());
            // A wait's one request is bounded as a single lock's is: by the
            // deadline and the grace after it (a try has no deadline).
            let all = backend.try_acquire_all(&reqs);
            let cut = mode.cut();
            let answer = match cut {
                Some(cut) => match tokio::time::timeout_at(cut, all).await {
                    Ok(answer) => answer,
                    // Whatever the request took is released in the
                    // background, as for a cancelled acquire.
                    Err(_) => {
                        return Err(Error::WaitTimeout {
                            name: reqs[0].name.clone(),
                            waited: start.elapsed(),
                        })
                    }
                },
                None => all.await,
            };
            if answer.as_ref().is_ok() || answer.as_ref().is_err_and(grants_nothing) {
                cleanup.disarm();
            }
            let answer = match answer {
                // A wait outlasts a failed all-at-once request: the names
                // are taken one at a time instead. Whatever the failed
                // request may have granted is released in the background
                // by its owners; each name is asked with a fresh one.
                Err(e)
                    if crate::client::outlasted_by_a_wait(&e) && matches!(mode, Mode::Wait(_)) =>
                {
                    tracing::debug!(error = %e, "acquiring all at once failed; one at a time");
                    drop(cleanup);
                    AllAtOnce::NotOffered
                }
                Err(e) if !e.is_retryable() && !grants_nothing(&e) => {
                    cleanup.release_now(grace_before(cut)).await;
                    return Err(e);
                }
                answer => answer?,
            };
            match answer {
                AllAtOnce::Granted(grants) if grants.len() == pending.len() => {
                    for ((req, gate), grant) in pending.drain(..).zip(grants) {
                        started.push(each.start(gate, req, grant));
                    }
                }
                AllAtOnce::Granted(grants) => {
                    for req in &reqs {
                        let _ = backend.release(req).await;
                    }
                    return Err(Error::backend(
                        each.client.keeper.caps.backend,
                        format!(
                            "try_acquire_all answered {} grants for {} locks",
                            grants.len(),
                            reqs.len()
                        ),
                    ));
                }
                AllAtOnce::Refused if matches!(mode, Mode::Once) => return Ok(None),
                AllAtOnce::Refused | AllAtOnce::NotOffered => {}
            }
        }
        // One at a time, in canonical order. If a later name is refused or
        // fails, the guards started here are released before the answer
        // (for `ANSWER_GRACE` at most and not past the wait's cut, then in
        // the background), so that a caller that exits at once leaves none
        // of them held; if the future is dropped, they release themselves
        // in the background.
        for (req, gate) in pending {
            match each.ask_live(&req.name, mode, start).await {
                Ok(Some((req, grant))) => started.push(each.start(gate, req, grant)),
                refused_or_failed => {
                    let releases = join_all(started.into_iter().map(LockGuard::release));
                    let _ = tokio::time::timeout(grace_before(mode.cut()), releases).await;
                    return refused_or_failed
                        .map(|_| None)
                        .map_err(|e| whole_wait(e, start));
                }
            }
        }
        let mut started = started.into_iter();
        let guards = guards
            .into_iter()
            .map(|t| match t {
                Taken::Nested(g) => (g, false),
                Taken::Pending => (started.next().expect("one guard per pending name"), true),
            })
            .collect();
        Ok(Some(MultiGuard::new(guards)))
    }
}

/// A timeout of one name's part of the wait that began at `start`,
/// reporting the whole wait.
fn whole_wait(e: Error, start: Instant) -> Error {
    match e {
        Error::WaitTimeout { name, .. } => Error::WaitTimeout {
            name,
            waited: start.elapsed(),
        },
        e => e,
    }
}

enum Taken {
    Nested(LockGuard),
    Pending,
}

/// Proof of holding several locks, in canonical order. Release it with
/// [`release`](Self::release); dropped, it releases them in the background.
///
/// If any of its holds may be lost, [`lost`](Self::lost) resolves and the
/// others are released at once (they then report
/// [`LostReason::WithOther`]); nested holds, which belong to an outer guard
/// of the same holder, are left to it.
pub struct MultiGuard {
    guards: Vec<LockGuard>,
    watch: Option<tokio::task::JoinHandle<()>>,
}

impl fmt::Debug for MultiGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MultiGuard")
            .field("guards", &self.guards)
            .finish()
    }
}

impl MultiGuard {
    fn new(guards: Vec<(LockGuard, bool)>) -> Self {
        let holds: Vec<(Arc<Hold>, bool)> =
            guards.iter().map(|(g, own)| (g.hold_arc(), *own)).collect();
        let owned = holds.iter().filter(|(_, own)| *own).count();
        let watch = (holds.len() >= 2 && owned >= 1)
            .then(|| tokio::spawn(release_all_when_one_is_lost(holds)));
        Self {
            guards: guards.into_iter().map(|(g, _)| g).collect(),
            watch,
        }
    }

    /// Each lock's guard, in canonical order.
    pub fn guards(&self) -> &[LockGuard] {
        &self.guards
    }

    /// Each lock's name and fencing token, in canonical order.
    pub fn tokens(&self) -> Vec<(LockName, FencingToken)> {
        self.guards
            .iter()
            .map(|g| (g.name().clone(), g.token()))
            .collect()
    }

    /// The fencing token of `name`, if this guard holds it.
    pub fn token(&self, name: &str) -> Option<FencingToken> {
        self.guards
            .iter()
            .find(|g| g.name().as_str() == name)
            .map(LockGuard::token)
    }

    /// The earliest of the locks' conservative local deadlines, or `None`
    /// once one is lost.
    pub fn deadline(&self) -> Option<Instant> {
        self.guards
            .iter()
            .map(LockGuard::deadline)
            .try_fold(None, |earliest: Option<Instant>, d| {
                d.map(|d| Some(earliest.map_or(d, |e| e.min(d))))
            })
            .flatten()
    }

    /// Whether every lock is still held as far as this process can tell.
    pub fn is_held(&self) -> bool {
        self.guards.iter().all(LockGuard::is_held)
    }

    /// Resolves when any of the locks may no longer be held, with its name
    /// and why: the lock lost first, not one released with it.
    pub async fn lost(&self) -> (LockName, LostReason) {
        let each = self
            .guards
            .iter()
            .map(|g| Box::pin(async move { (g.name().clone(), g.lost().await) }));
        let (name, reason) = select_all(each).await.0;
        if let LostReason::WithOther(first) = &reason {
            // Lost before this one was released with it: resolves at once.
            if let Some(g) = self.guards.iter().find(|g| g.name() == first) {
                return (first.clone(), g.lost().await);
            }
        }
        (name, reason)
    }

    /// Runs `fut` while every lock is held; if any may be lost first, drops
    /// `fut` and returns [`Error::LeaseLost`] naming it.
    pub async fn run_until_lost<F: Future>(&self, fut: F) -> Result<F::Output> {
        if !self.is_held() {
            // Past a deadline that a stalled thread kept the keeper from
            // reporting: `fut` does not start.
            let (name, reason) = self.lost().await;
            return Err(Error::LeaseLost { name, reason });
        }
        tokio::select! {
            biased;
            (name, reason) = self.lost() => Err(Error::LeaseLost { name, reason }),
            out = fut => Ok(out),
        }
    }

    /// Releases every lock (nested ones lower their hold count), all at
    /// once: a release the network does not answer costs the time of one.
    /// Returns whether the backend still had all of them as ours.
    pub async fn release(self) -> Result<bool> {
        Ok(self.release_each().await?.is_none())
    }

    /// Releases every lock, as [`release`](Self::release); the first lock
    /// (in canonical order) the backend no longer had as ours.
    async fn release_each(mut self) -> Result<Option<LockName>> {
        if let Some(w) = self.watch.take() {
            w.abort();
        }
        let guards = std::mem::take(&mut self.guards);
        let names: Vec<LockName> = guards.iter().map(|g| g.name().clone()).collect();
        let mut not_held = None;
        let mut first_error = None;
        let released = join_all(guards.into_iter().map(LockGuard::release)).await;
        for (name, released) in names.into_iter().zip(released) {
            match released {
                Ok(true) => {}
                Ok(false) => {
                    not_held.get_or_insert(name);
                }
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        match first_error {
            Some(e) => Err(e),
            None => Ok(not_held),
        }
    }
}

impl Drop for MultiGuard {
    fn drop(&mut self) {
        if let Some(w) = self.watch.take() {
            w.abort();
        }
        // The guards release themselves on drop.
    }
}

/// Waits until one of `holds` stops being held; if it was lost (not
/// released), reports the others this guard took itself (`true`) lost with
/// it and releases them on the backend.
async fn release_all_when_one_is_lost(holds: Vec<(Arc<Hold>, bool)>) {
    let settled = holds
        .iter()
        .enumerate()
        .map(|(i, (h, _))| Box::pin(async move { (i, h.lease.state.settled().await) }));
    let ((first, state), _, _) = select_all(settled).await;
    let HoldState::Lost(_) = state else {
        return;
    };
    let name = holds[first].0.lease.req.name.clone();
    for (i, (h, own)) in holds.iter().enumerate() {
        if i == first || !own || !matches!(&*h.lease.state.get(), HoldState::Held { .. }) {
            continue;
        }
        h.keeper.lose(&h.lease, LostReason::WithOther(name.clone()));
        match h.keeper.backend.release(&h.lease.req).await {
            Ok(_) => {
                tracing::debug!(lock = %h.lease.req.name, with = %name, "released with a lost lock")
            }
            Err(e) => {
                tracing::warn!(lock = %h.lease.req.name, error = %e, "release after a lost multi-lock member failed; the lease will expire after its TTL")
            }
        }
    }
}
