//! The keeper: renews every lease at about TTL/3, reports it lost when it
//! can no longer vouch for it, and watches backend sessions.
//!
//! One timer task per client, not per lease: a timer map of (instant,
//! lease) that the task sleeps on. A lease is armed at its next renewal or
//! its deadline, whichever is first. When a renewal is due the lease goes
//! to the client's [`Renewer`] (batched with others when the backend can),
//! whose answer comes back through [`Keeper::renewed`]. A lease that ends
//! before its first renewal costs one map insert and one removal, no task.
//! On session backends that name their sessions, one task per session waits
//! for the backend's `session_ended`; it outlives the session's last lease
//! (the next lease in the session reuses it) and ends with the session or
//! the client. Leases on session backends that do not name them get a
//! small task each, waiting for `session_lost`.
//!
//! The keeper knows leases ([`crate::lease`]) and the backend, nothing above
//! them: slots, guards and the client call into it.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::backend::{Capabilities, DynBackend};
use crate::error::LostReason;
use crate::lease::{lock, HoldState, Lease, TimerKey};
use crate::renewer::Renewer;

/// How long the timer task stays when no lease is armed before it exits
/// (it is started again by the next arm).
const IDLE: Duration = Duration::from_secs(1);

#[derive(Default)]
struct Timers {
    map: BTreeMap<TimerKey, Weak<Lease>>,
    seq: u64,
    task: Option<JoinHandle<()>>,
    /// When the task will wake by itself; an entry armed later than this
    /// needs no wake-up (the common case: a new lease renews in TTL/3).
    wakes_at: Option<Instant>,
}

/// The leases of one backend session, and the one task waiting for its
/// end. The task stays while the session has no leases: starting a watcher
/// per lock is a measurable share of an uncontended lock's latency on
/// ZooKeeper (docs/benchmarks.md), and a session usually serves the
/// client's next lock too.
struct SessionWatch {
    leases: HashMap<u64, Weak<Lease>>,
    next: u64,
    task: JoinHandle<()>,
}

/// Timers, renewals and session watchers of one client.
pub(crate) struct Keeper {
    pub(crate) backend: DynBackend,
    pub(crate) caps: Capabilities,
    renewer: Renewer,
    timers: Mutex<Timers>,
    /// Shared with the timer task, which sleeps on it without holding the
    /// keeper.
    wake: Arc<Notify>,
    /// One watcher per backend session, for backends that name them.
    sessions: Mutex<HashMap<u64, SessionWatch>>,
}

impl Drop for Keeper {
    fn drop(&mut self) {
        // A watcher keeps a handle on its session (a ZooKeeper client, an
        // etcd lease), which must not outlive the client that made it.
        let sessions = self
            .sessions
            .get_mut()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for (_, watch) in sessions.drain() {
            watch.task.abort();
        }
        // The timer task, asleep until its next entry, ends now rather
        // than then: a process waiting for its tasks to finish (the CLI
        // after a cancelled wait) is not held up by it.
        self.wake.notify_one();
    }
}

impl Keeper {
    pub(crate) fn new(backend: DynBackend) -> Arc<Self> {
        let caps = backend.capabilities();
        Arc::new_cyclic(|me: &Weak<Keeper>| {
            let me = me.clone();
            let answered = Arc::new(move |lease: Arc<Lease>, sent, ttl, answer| {
                if let Some(keeper) = me.upgrade() {
                    keeper.renewed(lease, sent, ttl, answer);
                }
            });
            Keeper {
                renewer: Renewer::new(backend.clone(), caps.extend_batch, answered),
                backend,
                caps,
                timers: Mutex::default(),
                wake: Arc::new(Notify::new()),
                sessions: Mutex::default(),
            }
        })
    }

    /// When a lease granted at `sent` renews first: a third of the time
    /// it may be trusted for (its TTL less the drift margin) later, on the
    /// renewer's shared grid when it batches.
    pub(crate) fn first_renewal(&self, sent: Instant, ttl: Duration) -> Instant {
        let period = self.caps.safe_validity(ttl) / 3;
        if self.renewer.batching() {
            crate::renewer::align(sent + period, period)
        } else {
            sent + period
        }
    }

    /// Arms a freshly granted lease, and watches its session if it has one.
    pub(crate) fn start(self: &Arc<Self>, lease: &Arc<Lease>) {
        self.rearm(lease);
        if self.caps.session {
            match self.backend.session_key(&lease.req) {
                Some(key) => self.watch_session_once(lease, key),
                None => {
                    tokio::spawn(self.clone().watch_session(lease.clone()));
                }
            }
        }
    }

    /// Forgets a lease that ended (released or lost): its timer and its
    /// place in its session's watcher.
    pub(crate) fn stop(&self, lease: &Lease) {
        self.disarm(lease);
        self.unwatch_session(lease);
    }

    /// Reports `lease` lost and forgets it.
    pub(crate) fn lose(&self, lease: &Lease, reason: LostReason) {
        lease.mark_lost(reason);
        self.stop(lease);
    }

    /// Arms a lease at its next renewal or deadline (a new lease, or one
    /// whose deadline changed: a manual extend, a failed renewal).
    pub(crate) fn rearm(self: &Arc<Self>, lease: &Arc<Lease>) {
        let Some(deadline) = lease.deadline() else {
            return;
        };
        let at = lock(&lease.renewal).wake_at(deadline);
        self.arm(lease, at);
    }

    /// Arms `lease` at `at` (at its maximum hold time at the latest),
    /// replacing its previous timer.
    fn arm(self: &Arc<Self>, lease: &Arc<Lease>, at: Instant) {
        let at = lease.max_hold_until.map_or(at, |until| at.min(until));
        let mut t = lock(&self.timers);
        let mut key_slot = lock(&lease.timer);
        if let Some(old) = key_slot.take() {
            t.map.remove(&old);
        }
        t.seq += 1;
        let key = (at, t.seq);
        t.map.insert(key, Arc::downgrade(lease));
        *key_slot = Some(key);
        drop(key_slot);
        if t.task.as_ref().is_none_or(JoinHandle::is_finished) {
            // First lease, the task went idle, or its runtime is gone.
            t.wakes_at = None;
            t.task = Some(tokio::spawn(run(Arc::downgrade(self), self.wake.clone())));
        } else if t.wakes_at.is_some_and(|w| at < w) {
            // Earlier than the task's own wake-up (or the task is busy:
            // `wakes_at` is None then, and it looks at the map again
            // before sleeping).
            t.wakes_at = Some(at);
            self.wake.notify_one();
        }
    }

    fn disarm(&self, lease: &Lease) {
        let mut t = lock(&self.timers);
        if let Some(key) = lock(&lease.timer).take() {
            t.map.remove(&key);
        }
    }

    /// The leases due at `now`, and when the next one is due.
    fn take_due(&self, now: Instant) -> (Vec<Arc<Lease>>, Option<Instant>) {
        let mut due = Vec::new();
        let mut t = lock(&self.timers);
        t.wakes_at = None;
        while let Some(entry) = t.map.first_entry() {
            if entry.key().0 > now {
                break;
            }
            let (key, weak) = entry.remove_entry();
            if let Some(lease) = weak.upgrade() {
                let mut slot = lock(&lease.timer);
                if *slot == Some(key) {
                    *slot = None;
                }
                drop(slot);
                due.push(lease);
            }
        }
        let next = t.map.first_key_value().map(|(k, _)| k.0);
        if due.is_empty() {
            t.wakes_at = Some(next.unwrap_or(now + IDLE));
        }
        (due, next)
    }

    /// Stops the timer task if nothing is armed; whether it stopped.
    fn stop_if_idle(&self) -> bool {
        let mut t = lock(&self.timers);
        if t.map.is_empty() {
            t.task = None;
            return true;
        }
        false
    }

    /// A lease's timer fired: lose it at its deadline, renew it when due,
    /// or arm it again.
    fn tick(self: &Arc<Self>, lease: Arc<Lease>, now: Instant) {
        let Some(deadline) = lease.deadline() else {
            return;
        };
        if lease.max_hold_until.is_some_and(|until| now >= until) {
            // A bound shorter than the renewals' period (or than the TTL,
            // without renewal): the hold ends there, on the server too.
            self.lose(&lease, LostReason::MaxHoldReached);
            self.release_after_loss(lease);
            return;
        }
        let mut r = lock(&lease.renewal);
        if now >= deadline {
            let reason = match r.last_error.take() {
                Some(e) => LostReason::RenewalFailed(e),
                None if r.in_flight => LostReason::RenewalFailed(
                    "the renewal request had not answered by the deadline".into(),
                ),
                None if r.capped_by_max_hold => LostReason::MaxHoldReached,
                // Due before the deadline, the renewal never ran: the
                // process or its runtime stalled past it.
                None if r.renewing && now >= r.next_renew => LostReason::Stalled,
                None => LostReason::DeadlinePassed,
            };
            drop(r);
            self.lose(&lease, reason);
            self.release_after_loss(lease);
            return;
        }
        if !r.renewing || r.in_flight || now < r.next_renew {
            let at = r.wake_at(deadline);
            drop(r);
            self.arm(&lease, at);
            return;
        }
        let mut ttl = lease.req.ttl;
        if let Some(until) = lease.max_hold_until {
            let left = until.saturating_duration_since(now);
            if left < ttl {
                r.capped_by_max_hold = true;
                ttl = left;
                if ttl < self.caps.min_ttl {
                    r.renewing = false;
                    drop(r);
                    self.arm(&lease, deadline);
                    return;
                }
            }
        }
        r.in_flight = true;
        r.renewal_out = Some(r.sending(now, now + self.caps.safe_validity(ttl)));
        drop(r);
        // The deadline still fires if the renewal never answers.
        self.arm(&lease, deadline);
        self.renewer.submit(lease, now, ttl);
    }

    /// The answer to a renewal sent at `sent` for `ttl`.
    fn renewed(
        self: Arc<Self>,
        lease: Arc<Lease>,
        sent: Instant,
        ttl: Duration,
        answer: Result<bool, String>,
    ) {
        // Released or lost meanwhile: nothing to renew, nothing to report.
        let Some(current) = lease.deadline() else {
            return;
        };
        let mut r = lock(&lease.renewal);
        r.in_flight = false;
        let sent_for = sent + self.caps.safe_validity(ttl);
        let deadline = r
            .renewal_out
            .take()
            .and_then(|id| r.answered(id, matches!(answer, Ok(true))))
            .unwrap_or(sent_for);
        match answer {
            // Answered, but only after the deadline the lease had: it is
            // lost there, as the timer would have found had it run first,
            // so that `is_held` never turns true again once false.
            Ok(true) if Instant::now() >= current => {
                drop(r);
                self.lose(
                    &lease,
                    LostReason::RenewalFailed(
                        "the renewal was answered only after the lease's deadline".into(),
                    ),
                );
                self.release_after_loss(lease);
            }
            Ok(true) => {
                r.next_renew = self.first_renewal(sent, lease.req.ttl);
                r.last_error = None;
                let at = r.wake_at(deadline);
                drop(r);
                // A lease that was lost or released meanwhile stays so.
                if lease.transition(HoldState::Held { deadline }) {
                    tracing::trace!(lock = %lease.req.name, ?ttl, "renewed");
                    self.arm(&lease, at);
                }
            }
            Ok(false) => {
                drop(r);
                // Not ours any more: do not release, it may be someone else's.
                self.lose(&lease, LostReason::RenewalRejected);
            }
            Err(e) => {
                tracing::warn!(lock = %lease.req.name, error = %e, "renewal failed; retrying until the deadline");
                r.last_error = Some(e);
                let retry = (lease.req.ttl / 3 / 4).max(Duration::from_millis(5));
                r.next_renew = Instant::now() + crate::wait::jitter(retry);
                drop(r);
                lease.maybe_extended(sent_for);
                self.rearm(&lease);
            }
        }
    }

    /// Adds `lease` to its session's watcher, starting one for a new session,
    /// or again for one whose watcher stopped with the runtime it ran on (a
    /// watcher that saw its session end took the session out of the map).
    fn watch_session_once(self: &Arc<Self>, lease: &Arc<Lease>, key: u64) {
        let mut sessions = lock(&self.sessions);
        let start = || {
            tokio::spawn(session_watcher(
                self.backend.clone(),
                Arc::downgrade(self),
                key,
            ))
        };
        let watch = sessions.entry(key).or_insert_with(|| SessionWatch {
            leases: HashMap::new(),
            next: 0,
            task: start(),
        });
        if watch.task.is_finished() {
            watch.task = start();
        }
        let slot = watch.next;
        watch.next += 1;
        watch.leases.insert(slot, Arc::downgrade(lease));
        *lock(&lease.session) = Some((key, slot));
    }

    /// Removes an ended lease from its session's watcher. The watcher
    /// itself stays, for the session's next lease; it ends with the session
    /// (see [`session_watcher`]) or with the keeper.
    fn unwatch_session(&self, lease: &Lease) {
        let mut sessions = lock(&self.sessions);
        let Some((key, slot)) = lock(&lease.session).take() else {
            return;
        };
        if let Some(watch) = sessions.get_mut(&key) {
            watch.leases.remove(&slot);
        }
    }

    /// Session backends that do not name their sessions: the lease is lost
    /// when its own `session_lost` resolves.
    async fn watch_session(self: Arc<Self>, lease: Arc<Lease>) {
        let session = self.backend.session_lost(&lease.req);
        let settling = lease.clone();
        let ended = async move {
            settling.state.settled().await;
        };
        tokio::select! {
            biased;
            () = ended => {}
            reason = session => {
                self.lose(&lease, reason);
                self.release_after_loss(lease);
            }
        }
    }

    /// After a loss the backend may still hold the lease for us (a
    /// partition, a slow server). Releasing by owner can only free our own
    /// entry, so it is always safe and shortens everyone else's wait.
    pub(crate) fn release_after_loss(&self, lease: Arc<Lease>) {
        let backend = self.backend.clone();
        tokio::spawn(async move {
            if let Err(e) = backend.release(&lease.req).await {
                tracing::debug!(lock = %lease.req.name, error = %e, "release after loss failed");
            }
        });
    }
}

/// The timer task. It holds the keeper only while it works, so that the
/// keeper (and the session watchers it ends on drop) goes with the last
/// user, not when the task next wakes.
async fn run(keeper: Weak<Keeper>, wake: Arc<Notify>) {
    loop {
        let Some(k) = keeper.upgrade() else {
            return;
        };
        let now = Instant::now();
        let (due, next) = k.take_due(now);
        if !due.is_empty() {
            for lease in due {
                k.tick(lease, now);
            }
            continue;
        }
        drop(k);
        let woken = wake.notified();
        match next {
            Some(at) => {
                tokio::select! {
                    () = tokio::time::sleep_until(at) => {}
                    () = woken => {}
                }
            }
            None => {
                tokio::select! {
                    () = tokio::time::sleep(IDLE) => {
                        match keeper.upgrade() {
                            Some(k) if !k.stop_if_idle() => {}
                            _ => return,
                        }
                    }
                    () = woken => {}
                }
            }
        }
    }
}

/// Waits for the end of session `key`, then reports every lease in it lost.
async fn session_watcher(backend: DynBackend, keeper: Weak<Keeper>, key: u64) {
    let reason = backend.session_ended(key).await;
    let Some(keeper) = keeper.upgrade() else {
        return;
    };
    let leases: Vec<Arc<Lease>> = {
        let mut sessions = lock(&keeper.sessions);
        let Some(watch) = sessions.remove(&key) else {
            return;
        };
        watch.leases.values().filter_map(Weak::upgrade).collect()
    };
    for lease in leases {
        *lock(&lease.session) = None;
        keeper.lose(&lease, reason.clone());
        keeper.release_after_loss(lease);
    }
}

#[cfg(test)]
mod tests {
    use crate::{LockClient, MemoryBackend};
    use std::time::Duration;

    fn armed(c: &LockClient) -> usize {
        crate::lease::lock(&c.inner.keeper.timers).map.len()
    }

    #[tokio::test(start_paused = true)]
    async fn holds_are_timers_of_one_task_and_leave_none_behind() {
        let c = LockClient::new(MemoryBackend::new());
        let mut guards = Vec::new();
        for i in 0..100 {
            guards.push(c.lock(format!("t/{i}")).acquire().await.unwrap());
        }
        assert_eq!(armed(&c), 100);
        // Renewals re-arm the same entries instead of adding new ones.
        tokio::time::sleep(Duration::from_secs(25)).await;
        assert_eq!(armed(&c), 100);
        assert!(guards.iter().all(crate::LockGuard::is_held));
        for g in guards {
            assert!(g.release().await.unwrap());
        }
        assert_eq!(armed(&c), 0);
        // The task goes away when idle (after the timer it was sleeping on,
        // at most a renewal period) and comes back for the next hold.
        tokio::time::sleep(Duration::from_secs(10) + super::IDLE * 2).await;
        assert!(crate::lease::lock(&c.inner.keeper.timers).task.is_none());
        let g = c
            .lock("t/again")
            .ttl(Duration::from_secs(3))
            .acquire()
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_secs(10)).await;
        assert!(
            g.is_held(),
            "a hold after the task went idle was not renewed"
        );
    }
}
