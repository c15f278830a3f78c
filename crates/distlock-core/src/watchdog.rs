//! The watchdog: renews every hold at about TTL/3 and reports it lost when
//! it can no longer vouch for it.
//!
//! One task per client, not per hold: a timer map of (instant, hold) that
//! the task sleeps on. A hold is armed at its next renewal or its deadline,
//! whichever is first. When a renewal is due the hold goes to the client's
//! [`Renewer`](crate::renewer::Renewer) (batched with others when the
//! backend can), whose answer comes back through [`renewed`]. A hold that
//! is released before its first renewal costs one map insert and one
//! removal, no task. On session backends that name their sessions, one
//! task per session waits for the backend's `session_ended`; it outlives
//! the session's last hold (the next hold in the session reuses it) and
//! ends with the session or the client. Holds on session backends that do
//! not name them get a small task each, waiting for `session_lost`.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::client::lock;
use crate::error::LostReason;
use crate::guard::{Hold, HoldState};

/// How long the task stays when no hold is armed before it exits (it is
/// started again by the next arm).
const IDLE: Duration = Duration::from_secs(1);

/// Per-hold renewal state, owned by the watchdog.
#[derive(Debug)]
pub(crate) struct Renewal {
    pub(crate) next_renew: Instant,
    pub(crate) renewing: bool,
    in_flight: bool,
    last_error: Option<String>,
    capped_by_max_hold: bool,
}

impl Renewal {
    pub(crate) fn new(next_renew: Instant, renewing: bool) -> Self {
        Self {
            next_renew,
            renewing,
            in_flight: false,
            last_error: None,
            capped_by_max_hold: false,
        }
    }

    /// When the watchdog must look at the hold next.
    fn wake_at(&self, deadline: Instant) -> Instant {
        if self.renewing && !self.in_flight {
            self.next_renew.min(deadline)
        } else {
            deadline
        }
    }
}

/// Where a hold sits in the timer map.
pub(crate) type TimerKey = (Instant, u64);

#[derive(Default)]
struct Timers {
    map: BTreeMap<TimerKey, Weak<Hold>>,
    seq: u64,
    task: Option<JoinHandle<()>>,
    /// When the task will wake by itself; an entry armed later than this
    /// needs no wake-up (the common case: a new hold renews in TTL/3).
    wakes_at: Option<Instant>,
}

#[derive(Default)]
pub(crate) struct Scheduler {
    timers: Mutex<Timers>,
    wake: Notify,
}

impl Scheduler {
    /// Arms `hold` at `at`, replacing its previous timer.
    pub(crate) fn arm(self: &Arc<Self>, hold: &Arc<Hold>, at: Instant) {
        let mut t = lock(&self.timers);
        let mut key_slot = lock(&hold.timer);
        if let Some(old) = key_slot.take() {
            t.map.remove(&old);
        }
        t.seq += 1;
        let key = (at, t.seq);
        t.map.insert(key, Arc::downgrade(hold));
        *key_slot = Some(key);
        drop(key_slot);
        if t.task.as_ref().is_none_or(JoinHandle::is_finished) {
            // First hold, the task went idle, or its runtime is gone.
            t.wakes_at = None;
            t.task = Some(tokio::spawn(self.clone().run()));
        } else if t.wakes_at.is_some_and(|w| at < w) {
            // Earlier than the task's own wake-up (or the task is busy:
            // `wakes_at` is None then, and it looks at the map again
            // before sleeping).
            t.wakes_at = Some(at);
            self.wake.notify_one();
        }
    }

    /// Forgets `hold` (released or lost).
    pub(crate) fn disarm(&self, hold: &Hold) {
        let mut t = lock(&self.timers);
        if let Some(key) = lock(&hold.timer).take() {
            t.map.remove(&key);
        }
    }

    async fn run(self: Arc<Self>) {
        loop {
            let now = Instant::now();
            let mut due = Vec::new();
            let next = {
                let mut t = lock(&self.timers);
                t.wakes_at = None;
                while let Some(entry) = t.map.first_entry() {
                    if entry.key().0 > now {
                        break;
                    }
                    let (key, weak) = entry.remove_entry();
                    if let Some(hold) = weak.upgrade() {
                        let mut slot = lock(&hold.timer);
                        if *slot == Some(key) {
                            *slot = None;
                        }
                        drop(slot);
                        due.push(hold);
                    }
                }
                let next = t.map.first_key_value().map(|(k, _)| k.0);
                if due.is_empty() {
                    t.wakes_at = Some(next.unwrap_or(now + IDLE));
                }
                next
            };
            if !due.is_empty() {
                for hold in due {
                    tick(&self, hold, now);
                }
                continue;
            }
            let woken = self.wake.notified();
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
                            let mut t = lock(&self.timers);
                            if t.map.is_empty() {
                                t.task = None;
                                return;
                            }
                        }
                        () = woken => {}
                    }
                }
            }
        }
    }
}

/// Arms a freshly granted hold, and watches its session if it has one.
pub(crate) fn start(hold: &Arc<Hold>) {
    rearm(hold);
    if hold.client.caps.session {
        match hold.client.backend.session_key(&hold.req) {
            Some(key) => watch_session_once(hold, key),
            None => {
                tokio::spawn(watch_session(hold.clone()));
            }
        }
    }
}

/// The holds of one backend session, and the one task waiting for its end.
/// The task stays while the session has no holds: starting a watcher per
/// lock is a measurable share of an uncontended lock's latency on
/// ZooKeeper (docs/benchmarks.md), and a session usually serves the
/// client's next lock too.
pub(crate) struct SessionWatch {
    holds: std::collections::HashMap<u64, Weak<Hold>>,
    next: u64,
    task: JoinHandle<()>,
}

/// Adds `hold` to its session's watcher, starting one for a new session.
fn watch_session_once(hold: &Arc<Hold>, key: u64) {
    let client = &hold.client;
    let mut sessions = lock(&client.sessions);
    let watch = sessions.entry(key).or_insert_with(|| SessionWatch {
        holds: std::collections::HashMap::new(),
        next: 0,
        task: tokio::spawn(session_watcher(
            client.backend.clone(),
            Arc::downgrade(client),
            key,
        )),
    });
    let slot = watch.next;
    watch.next += 1;
    watch.holds.insert(slot, Arc::downgrade(hold));
    *lock(&hold.session) = Some((key, slot));
}

/// Removes a released or lost hold from its session's watcher. The watcher
/// itself stays, for the session's next hold; it ends with the session
/// (see [`session_watcher`]) or with the client ([`stop_session_watchers`]).
pub(crate) fn unwatch_session(hold: &Hold) {
    let mut sessions = lock(&hold.client.sessions);
    let Some((key, slot)) = lock(&hold.session).take() else {
        return;
    };
    if let Some(watch) = sessions.get_mut(&key) {
        watch.holds.remove(&slot);
    }
}

/// Stops every session watcher of a client that is going away: a watcher
/// keeps a handle on its session (a ZooKeeper client, an etcd lease), which
/// must not outlive the client that made it.
pub(crate) fn stop_session_watchers(sessions: &mut std::collections::HashMap<u64, SessionWatch>) {
    for (_, watch) in sessions.drain() {
        watch.task.abort();
    }
}

/// Waits for the end of session `key`, then reports every hold in it lost.
async fn session_watcher(
    backend: crate::backend::DynBackend,
    client: Weak<crate::client::ClientInner>,
    key: u64,
) {
    let reason = backend.session_ended(key).await;
    let Some(client) = client.upgrade() else {
        return;
    };
    let holds: Vec<Arc<Hold>> = {
        let mut sessions = lock(&client.sessions);
        let Some(watch) = sessions.remove(&key) else {
            return;
        };
        watch.holds.values().filter_map(Weak::upgrade).collect()
    };
    for hold in holds {
        *lock(&hold.session) = None;
        hold.mark_lost(reason.clone());
        release_after_loss(hold);
    }
}

/// Arms a hold at its next renewal or deadline (a new hold, or one whose
/// deadline changed: a manual extend, a failed renewal).
pub(crate) fn rearm(hold: &Arc<Hold>) {
    let deadline = match &*hold.state.get() {
        HoldState::Held { deadline } => *deadline,
        _ => return,
    };
    let at = lock(&hold.renewal).wake_at(deadline);
    hold.client.scheduler.arm(hold, at);
}

/// A hold's timer fired: lose it at its deadline, renew it when due, or
/// arm it again.
fn tick(sched: &Arc<Scheduler>, hold: Arc<Hold>, now: Instant) {
    let deadline = match &*hold.state.get() {
        HoldState::Held { deadline } => *deadline,
        _ => return,
    };
    let caps = &hold.client.caps;
    let mut r = lock(&hold.renewal);
    if now >= deadline {
        let reason = match r.last_error.take() {
            Some(e) => LostReason::RenewalFailed(e),
            None if r.in_flight => LostReason::RenewalFailed(
                "the renewal request had not answered by the deadline".into(),
            ),
            None if r.capped_by_max_hold => LostReason::MaxHoldReached,
            None => LostReason::DeadlinePassed,
        };
        drop(r);
        hold.mark_lost(reason);
        release_after_loss(hold);
        return;
    }
    if !r.renewing || r.in_flight || now < r.next_renew {
        let at = r.wake_at(deadline);
        drop(r);
        sched.arm(&hold, at);
        return;
    }
    let mut ttl = hold.req.ttl;
    if let Some(until) = hold.max_hold_until {
        let left = until.saturating_duration_since(now);
        if left < ttl {
            r.capped_by_max_hold = true;
            ttl = left;
            if ttl < caps.min_ttl {
                r.renewing = false;
                drop(r);
                sched.arm(&hold, deadline);
                return;
            }
        }
    }
    r.in_flight = true;
    drop(r);
    // The deadline still fires if the renewal never answers.
    sched.arm(&hold, deadline);
    let client = hold.client.clone();
    client.renewer.submit(hold, now, ttl);
}

/// The answer to a renewal sent at `sent` for `ttl`.
pub(crate) fn renewed(hold: Arc<Hold>, sent: Instant, ttl: Duration, answer: Result<bool, String>) {
    let caps = &hold.client.caps;
    let mut r = lock(&hold.renewal);
    r.in_flight = false;
    match answer {
        Ok(true) => {
            let period = hold.req.ttl / 3;
            r.next_renew = if hold.client.renewer.batching() {
                crate::renewer::align(sent + period, period)
            } else {
                sent + period
            };
            r.last_error = None;
            let deadline = sent + caps.safe_validity(ttl);
            let at = r.wake_at(deadline);
            drop(r);
            // A hold that was lost or released meanwhile stays so.
            if hold.transition(HoldState::Held { deadline }) {
                tracing::trace!(lock = %hold.req.name, ?ttl, "renewed");
                hold.client.scheduler.arm(&hold, at);
            }
        }
        Ok(false) => {
            drop(r);
            // Not ours any more: do not release, it may be someone else's.
            hold.mark_lost(LostReason::RenewalRejected);
        }
        Err(e) => {
            tracing::warn!(lock = %hold.req.name, error = %e, "renewal failed; retrying until the deadline");
            r.last_error = Some(e);
            let retry = (hold.req.ttl / 3 / 4).max(Duration::from_millis(5));
            r.next_renew = Instant::now() + crate::poll::jitter(retry);
            drop(r);
            rearm(&hold);
        }
    }
}

/// Session backends: the hold is lost when its session ends.
async fn watch_session(hold: Arc<Hold>) {
    let session = hold.client.backend.session_lost(&hold.req);
    let settling = hold.clone();
    let ended = async move {
        settling.state.settled().await;
    };
    tokio::select! {
        biased;
        () = ended => {}
        reason = session => {
            hold.mark_lost(reason);
            release_after_loss(hold);
        }
    }
}

/// After a loss the backend may still hold the lease for us (a partition, a
/// slow server). Releasing by owner can only free our own entry, so it is
/// always safe and shortens everyone else's wait.
fn release_after_loss(hold: Arc<Hold>) {
    tokio::spawn(async move {
        if let Err(e) = hold.client.backend.release(&hold.req).await {
            tracing::debug!(lock = %hold.req.name, error = %e, "release after loss failed");
        }
    });
}

#[cfg(test)]
mod tests {
    use crate::{LockClient, MemoryBackend};
    use std::time::Duration;

    fn armed(c: &LockClient) -> usize {
        crate::client::lock(&c.inner.scheduler.timers).map.len()
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
        assert!(crate::client::lock(&c.inner.scheduler.timers)
            .task
            .is_none());
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
