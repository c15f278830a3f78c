//! What sits above a single hold: multi-locks, elections, semaphores and
//! shared holds, `run`, `max_hold`, reentrancy. Time is paused, so the
//! schedules are exact.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use distlock_core::{
    async_trait, AllAtOnce, Backend, Capabilities, Error, Grant, LockClient, LockName, LockRequest,
    LostReason, MemoryBackend, Result, ANSWER_GRACE,
};
use futures_util::StreamExt;
use tokio::time::Instant;

/// Memory with a few switchable behaviours.
#[derive(Debug, Default)]
struct Wrapped {
    inner: MemoryBackend,
    /// `try_acquire_all` never answers (a stalled connection).
    stall_all: AtomicBool,
    /// `try_acquire_all` is declined: names are taken one at a time, as on
    /// Redis Cluster, Redlock or ZooKeeper.
    decline_all: AtomicBool,
    /// `try_acquire_all` grants, then its answer is lost (a connection
    /// cut after the server ran the request).
    lose_all_answers: AtomicBool,
    /// Renewals fail as if the server were unreachable.
    fail_extend: AtomicBool,
    /// Releases never answer.
    hang_releases: AtomicBool,
    /// A wait for a name held elsewhere never answers (a server that
    /// stopped answering mid-wait).
    stall_held_waits: AtomicBool,
    /// Acquires take a round trip of 10 ms.
    slow_acquires: AtomicBool,
    /// Releases take a round trip of 10 ms.
    slow_releases: AtomicBool,
    /// Waiting acquires on the server now, and the most there were at once.
    waiting: AtomicUsize,
    most_waiting: AtomicUsize,
}

impl Wrapped {
    async fn round_trip(&self) {
        if self.slow_acquires.load(Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

#[async_trait]
impl Backend for Wrapped {
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }
    async fn try_acquire(&self, req: &LockRequest) -> Result<Option<Grant>> {
        self.round_trip().await;
        self.inner.try_acquire(req).await
    }
    async fn acquire(&self, req: &LockRequest, deadline: Option<Instant>) -> Result<Grant> {
        self.round_trip().await;
        if self.stall_held_waits.load(Ordering::SeqCst) {
            match self.inner.try_acquire(req).await? {
                Some(grant) => return Ok(grant),
                None => std::future::pending::<()>().await,
            }
        }
        struct Waiting<'a>(&'a AtomicUsize);
        impl Drop for Waiting<'_> {
            fn drop(&mut self) {
                self.0.fetch_sub(1, Ordering::SeqCst);
            }
        }
        let now = self.waiting.fetch_add(1, Ordering::SeqCst) + 1;
        self.most_waiting.fetch_max(now, Ordering::SeqCst);
        let _waiting = Waiting(&self.waiting);
        self.inner.acquire(req, deadline).await
    }
    async fn try_acquire_all(&self, reqs: &[LockRequest]) -> Result<AllAtOnce> {
        if self.stall_all.load(Ordering::SeqCst) {
            std::future::pending::<()>().await;
        }
        if self.decline_all.load(Ordering::SeqCst) {
            return Ok(AllAtOnce::NotOffered);
        }
        let answer = self.inner.try_acquire_all(reqs).await;
        if self.lose_all_answers.load(Ordering::SeqCst) {
            return Err(Error::unavailable("wrapped", "connection reset", None));
        }
        answer
    }
    async fn extend(&self, req: &LockRequest) -> Result<bool> {
        Ok(self.extend_many(std::slice::from_ref(req)).await?[0])
    }
    async fn extend_many(&self, reqs: &[LockRequest]) -> Result<Vec<bool>> {
        if self.fail_extend.load(Ordering::SeqCst) {
            return Err(Error::unavailable("wrapped", "server unreachable", None));
        }
        self.inner.extend_many(reqs).await
    }
    async fn release(&self, req: &LockRequest) -> Result<bool> {
        if self.hang_releases.load(Ordering::SeqCst) {
            std::future::pending::<()>().await;
        }
        if self.slow_releases.load(Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        self.inner.release(req).await
    }
    async fn proclaim(&self, req: &LockRequest, value: &str) -> Result<bool> {
        self.inner.proclaim(req, value).await
    }
    async fn leader(&self, name: &LockName) -> Result<Option<distlock_core::Leader>> {
        self.inner.leader(name).await
    }
}

fn setup() -> (Arc<Wrapped>, LockClient, LockClient) {
    let w = Arc::new(Wrapped::default());
    let a = LockClient::from_dyn(w.clone());
    let b = LockClient::new(w.inner.clone());
    (w, a, b)
}

fn name(n: &str) -> LockName {
    LockName::new(n).expect("a valid name")
}

/// A multi-lock's wait is bounded like a single lock's: at its deadline,
/// plus `ANSWER_GRACE` for a backend still busy. The all-at-once try that
/// a waiting multi-lock sends first (one statement on PostgreSQL, one
/// script on Redis, one txn on etcd) is not: on a connection that stopped
/// answering the wait hangs until the connection fails.
#[tokio::test(start_paused = true)]
async fn a_multi_lock_wait_ends_by_its_deadline_when_its_all_at_once_try_never_answers() {
    let (w, a, _) = setup();
    w.stall_all.store(true, Ordering::SeqCst);
    a_wait_ends_by_its_deadline(&a).await;
}

/// A 1 s wait for `stall/a` and `stall/b` ends in `WaitTimeout` by its
/// deadline and `ANSWER_GRACE`.
async fn a_wait_ends_by_its_deadline(a: &LockClient) {
    let start = Instant::now();
    let wait = Duration::from_secs(1);
    let r = tokio::time::timeout(
        Duration::from_secs(60),
        a.lock_all(["stall/a", "stall/b"]).wait(wait).acquire(),
    )
    .await;
    assert!(
        matches!(r, Ok(Err(Error::WaitTimeout { .. }))),
        "a 1 s multi-lock wait had not ended after {:?}: {r:?}",
        start.elapsed()
    );
    assert!(
        start.elapsed() <= wait + ANSWER_GRACE + Duration::from_millis(50),
        "the wait ended {:?} after it began",
        start.elapsed()
    );
}

/// A request naming a larger limit than the semaphore's widens the client's
/// local gate for its ask; refused (`LimitMismatch`), the gate fits the
/// stored limit again, so the client's waiters on the server stay at most
/// as many as the permits they could use.
#[tokio::test(start_paused = true)]
async fn a_limit_mismatch_leaves_the_local_gate_at_the_stored_limit() {
    let (w, a, b) = setup();
    let mine = a.semaphore("gate/s", 2).acquire().await.unwrap();
    let _theirs = b.semaphore("gate/s", 2).acquire().await.unwrap();
    let wider = a.semaphore("gate/s", 10).try_acquire().await;
    assert!(
        matches!(wider, Err(Error::LimitMismatch { .. })),
        "{wider:?}"
    );
    let waiters: Vec<_> = (0..3)
        .map(|_| {
            let a = a.clone();
            tokio::spawn(async move {
                a.semaphore("gate/s", 2)
                    .wait(Duration::from_secs(1))
                    .acquire()
                    .await
            })
        })
        .collect();
    for w in waiters {
        let _ = w.await.unwrap();
    }
    // One permit is the client's own: one waiter could use the other.
    assert_eq!(w.most_waiting.load(Ordering::SeqCst), 1);
    mine.release().await.unwrap();
}

/// A multi-lock's timeout reports the whole wait, not the part spent on
/// the name it gave up on: names held by another client, waited for one
/// at a time on the server.
#[tokio::test(start_paused = true)]
async fn a_multi_lock_timeout_reports_the_whole_wait() {
    let (w, a, b) = setup();
    w.decline_all.store(true, Ordering::SeqCst);
    whole_wait_reported(&b, &a, "whole").await;
}

/// The same when the names are held by other tasks of the same client:
/// the wait at the client's own gates reports the whole wait too.
#[tokio::test(start_paused = true)]
async fn a_multi_lock_timeout_at_the_clients_own_gates_reports_the_whole_wait() {
    let (_w, a, _b) = setup();
    whole_wait_reported(&a, &a, "gates").await;
}

/// `holder` holds `<prefix>/a` for 600 ms and `<prefix>/b` throughout;
/// `waiter`'s multi-lock of both, waiting 1 s, reports a timeout on
/// `<prefix>/b` after the whole second.
async fn whole_wait_reported(holder: &LockClient, waiter: &LockClient, prefix: &str) {
    let (a, b) = (format!("{prefix}/a"), format!("{prefix}/b"));
    let held_a = holder.lock(&a).acquire().await.expect("a is free");
    let _held_b = holder.lock(&b).acquire().await.expect("b is free");
    let release_a = async {
        tokio::time::sleep(Duration::from_millis(600)).await;
        held_a.release().await.expect("a released");
    };
    let wait = waiter
        .lock_all([&a, &b])
        .wait(Duration::from_secs(1))
        .acquire();
    let (r, ()) = tokio::join!(wait, release_a);
    match r {
        Err(Error::WaitTimeout { name: n, waited }) => {
            assert_eq!(n, name(&b));
            assert!(waited >= Duration::from_secs(1), "waited {waited:?}");
        }
        other => panic!("{other:?}"),
    }
}

/// Taken one at a time, the names already held are given back before a
/// timed-out wait's error within the same bound: a later name's wait that
/// never answers and releases that never answer end it `ANSWER_GRACE`
/// after its deadline, not later (the rest is released in the background).
#[tokio::test(start_paused = true)]
async fn a_multi_lock_wait_one_at_a_time_ends_by_its_deadline_when_nothing_answers() {
    let (w, a, b) = setup();
    w.decline_all.store(true, Ordering::SeqCst);
    let _held = b.lock("stall/b").acquire().await.unwrap();
    w.stall_held_waits.store(true, Ordering::SeqCst);
    w.hang_releases.store(true, Ordering::SeqCst);
    a_wait_ends_by_its_deadline(&a).await;
}

/// A waiting multi-lock outlasts a failed all-at-once try as a single
/// lock's wait outlasts a failed request: it takes the names one at a
/// time. What the failed try may have granted is given back by its owners
/// in the background, and that release frees none of the new holds.
#[tokio::test(start_paused = true)]
async fn a_multi_lock_wait_outlasts_a_failed_all_at_once_try() {
    let (w, a, b) = setup();
    w.lose_all_answers.store(true, Ordering::SeqCst);
    // The give-back lands after the names are asked again.
    w.slow_releases.store(true, Ordering::SeqCst);
    let m = a
        .lock_all(["lost/a", "lost/b"])
        .wait(Duration::from_secs(5))
        .acquire()
        .await
        .expect("the wait takes the names one at a time");
    // The background release of the failed try's owners has run.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(m.is_held());
    for n in ["lost/a", "lost/b"] {
        assert!(
            b.lock(n).try_acquire().await.unwrap().is_none(),
            "{n} was freed under the multi-lock"
        );
    }
    // A try has no wait to outlast the failure: it answers with it.
    assert!(matches!(
        a.lock_all(["lost/c", "lost/d"]).try_acquire().await,
        Err(Error::Unavailable { .. })
    ));
    m.release().await.unwrap();
}

/// `lost()` names the lock that was lost, as docs/guarantees.md says
/// ("`lost()` names it and the others are released at once, reporting
/// `LostReason::WithOther`"). Once the watcher has released the others,
/// `lost()` (and `run_until_lost`) answer with the first name in canonical
/// order instead, whose reason is `WithOther`.
#[tokio::test(start_paused = true)]
async fn a_multi_locks_lost_names_the_lock_that_was_lost() {
    let (w, a, b) = setup();
    let m = a
        .lock_all(["pair/a", "pair/b"])
        .ttl(Duration::from_secs(3))
        .acquire()
        .await
        .unwrap();
    assert!(w.inner.evict(&name("pair/b")));
    // b's next renewal (within a third of the TTL) is rejected.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(!m.is_held());
    // The others were released at once.
    assert!(b.lock("pair/a").try_acquire().await.unwrap().is_some());
    let lost = m.lost().await;
    assert_eq!(
        lost,
        (name("pair/b"), LostReason::RenewalRejected),
        "lost() named a lock that was released with the lost one"
    );
    assert!(!m.release().await.unwrap());
}

/// A waiting multi-lock takes its names one at a time once the
/// all-at-once try is refused. If a name taken early is lost while a
/// later one is waited for, `acquire()` still returns `Ok`, with a guard
/// that is not held (`lost()` fires at once, the later names are released
/// by the watcher right after they were granted): "holds every named lock
/// or none" reads as held.
#[tokio::test(start_paused = true)]
async fn a_multi_lock_acquire_does_not_return_a_hold_lost_while_it_waited() {
    let (w, a, b) = setup();
    let held = b
        .lock("wait/b")
        .ttl(Duration::from_secs(60))
        .acquire()
        .await
        .unwrap();
    let acquiring = tokio::spawn({
        let a = a.clone();
        async move {
            a.lock_all(["wait/a", "wait/b"])
                .ttl(Duration::from_secs(3))
                .acquire()
                .await
        }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    // "wait/a" was granted first; an operator removes it while "wait/b"
    // is waited for, and its next renewal is rejected.
    assert!(w.inner.evict(&name("wait/a")));
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(held.release().await.unwrap());
    let r = acquiring.await.unwrap();
    if let Ok(m) = &r {
        assert!(
            m.is_held(),
            "acquire() returned a multi-lock one of whose locks was already lost: {m:?}"
        );
    }
}

/// `max_hold` bounds the hold: "the last renewals are shortened so the
/// lease ends at the bound; then `lost(MaxHoldReached)`"
/// (docs/architecture.md). A bound shorter than the first renewal (a
/// third of the TTL) is never applied: the lease runs its full TTL, and
/// `lost(MaxHoldReached)` fires there, here 6 times the bound.
#[tokio::test(start_paused = true)]
async fn a_max_hold_shorter_than_a_third_of_the_ttl_ends_the_hold_at_the_bound() {
    let (_, a, b) = setup();
    let start = Instant::now();
    let max = Duration::from_secs(5);
    let g = a
        .lock("bounded/short")
        .ttl(Duration::from_secs(30))
        .max_hold(max)
        .acquire()
        .await
        .unwrap();
    assert_eq!(g.lost().await, LostReason::MaxHoldReached);
    let held_for = start.elapsed();
    assert!(
        held_for <= max + Duration::from_millis(50),
        "max_hold(5 s) reported after {held_for:?}"
    );
    assert!(b
        .lock("bounded/short")
        .try_acquire()
        .await
        .unwrap()
        .is_some());
}

/// The same, through `run`: the future runs for the whole TTL.
#[tokio::test(start_paused = true)]
async fn run_with_a_short_max_hold_stops_the_future_at_the_bound() {
    let (_, a, _) = setup();
    let start = Instant::now();
    let r = a
        .lock("bounded/run")
        .ttl(Duration::from_secs(30))
        .max_hold(Duration::from_secs(5))
        .run(std::future::pending::<()>())
        .await;
    assert!(matches!(r, Err(Error::LeaseLost { .. })), "{r:?}");
    assert!(
        start.elapsed() <= Duration::from_secs(6),
        "run with max_hold(5 s) returned after {:?}",
        start.elapsed()
    );
}

/// A partition: renewals fail, releases never answer. A single lock's
/// `run` returns the loss about one TTL after the deadline
/// (`run_returns_a_loss_even_when_the_release_never_answers`); a
/// multi-lock's `release()` waits out each name's bounded release one
/// after another, so `run` over 10 names returns only after 10 TTLs.
#[tokio::test(start_paused = true)]
async fn a_multi_locks_run_returns_a_loss_within_a_ttl_when_releases_never_answer() {
    let (w, a, _) = setup();
    let ttl = Duration::from_secs(3);
    let names: Vec<String> = (0..10).map(|i| format!("part/{i}")).collect();
    let m = a.lock_all(&names).ttl(ttl).acquire().await.unwrap();
    let start = Instant::now();
    w.fail_extend.store(true, Ordering::SeqCst);
    w.hang_releases.store(true, Ordering::SeqCst);
    let lost = m.run_until_lost(std::future::pending::<()>()).await;
    assert!(matches!(lost, Err(Error::LeaseLost { .. })), "{lost:?}");
    let released = tokio::time::timeout(Duration::from_secs(120), m.release()).await;
    assert!(matches!(released, Ok(Err(_))), "{released:?}");
    assert!(
        start.elapsed() <= ttl * 2 + Duration::from_millis(100),
        "the multi-lock's release returned {:?} after a 3 s lease was lost",
        start.elapsed()
    );
}

/// Names taken one at a time: a wait dropped midway releases the names
/// already taken, and leaves nothing queued.
#[tokio::test(start_paused = true)]
async fn a_multi_lock_cancelled_midway_releases_what_it_took() {
    let (w, a, b) = setup();
    w.decline_all.store(true, Ordering::SeqCst);
    let held = b
        .lock("cancel/c")
        .ttl(Duration::from_secs(60))
        .acquire()
        .await
        .unwrap();
    let cut = tokio::time::timeout(
        Duration::from_millis(200),
        a.lock_all(["cancel/c", "cancel/a", "cancel/b"])
            .ttl(Duration::from_secs(60))
            .acquire(),
    )
    .await;
    assert!(cut.is_err());
    tokio::time::sleep(Duration::from_millis(10)).await;
    for n in ["cancel/a", "cancel/b"] {
        assert!(
            b.lock(n).try_acquire().await.unwrap().is_some(),
            "{n} left held"
        );
    }
    drop(held);
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert!(b.lock("cancel/c").try_acquire().await.unwrap().is_some());
    // and the same client takes them all again at once
    let m = a
        .lock_all(["cancel/b", "cancel/c", "cancel/a"])
        .wait(Duration::from_secs(1))
        .acquire()
        .await
        .unwrap();
    assert_eq!(
        m.tokens()
            .iter()
            .map(|(n, _)| n.as_str())
            .collect::<Vec<_>>(),
        ["cancel/a", "cancel/b", "cancel/c"]
    );
}

/// A multi-lock taken one name at a time that gives up (its wait ran out,
/// or a try found a later name held) has released the names it took by
/// the time it answers, not in the background: a caller that exits at
/// once (`distlock run A B` exiting 75) leaves none of them held.
#[tokio::test(start_paused = true)]
async fn a_multi_lock_that_gives_up_has_released_what_it_took_when_it_answers() {
    let (w, a, b) = setup();
    w.decline_all.store(true, Ordering::SeqCst);
    w.slow_releases.store(true, Ordering::SeqCst);
    let _held = b
        .lock("give/b")
        .ttl(Duration::from_secs(60))
        .acquire()
        .await
        .unwrap();
    let waited = a
        .lock_all(["give/a", "give/b"])
        .ttl(Duration::from_secs(60))
        .wait(Duration::from_millis(100))
        .acquire()
        .await;
    assert!(
        matches!(waited, Err(Error::WaitTimeout { .. })),
        "{waited:?}"
    );
    let left = w.inner.inspect(&name("give/a")).await.unwrap();
    assert!(!left.held, "give/a still held when the wait answered");
    let tried = a
        .lock_all(["give/a", "give/b"])
        .ttl(Duration::from_secs(60))
        .try_acquire()
        .await;
    assert!(matches!(tried, Ok(None)), "{tried:?}");
    let left = w.inner.inspect(&name("give/a")).await.unwrap();
    assert!(!left.held, "give/a still held when the try answered");
}

/// One name lost: the others are released on the server and report
/// `WithOther`; `release()` answers `Ok(false)`.
#[tokio::test(start_paused = true)]
async fn one_lost_name_releases_the_others() {
    let (w, a, b) = setup();
    w.decline_all.store(true, Ordering::SeqCst);
    let m = a
        .lock_all(["one/a", "one/b", "one/c"])
        .ttl(Duration::from_secs(3))
        .acquire()
        .await
        .unwrap();
    assert!(w.inner.evict(&name("one/a")));
    let (lost, reason) = m.lost().await;
    assert_eq!((lost, reason), (name("one/a"), LostReason::RenewalRejected));
    tokio::time::sleep(Duration::from_millis(10)).await;
    for n in ["one/b", "one/c"] {
        assert!(b.lock(n).try_acquire().await.unwrap().is_some(), "{n}");
    }
    for g in &m.guards()[1..] {
        assert_eq!(g.lost().await, LostReason::WithOther(name("one/a")));
    }
    assert!(!m.release().await.unwrap());
}

/// Duplicates in any spelling order are refused before anything is sent.
#[tokio::test(start_paused = true)]
async fn duplicates_are_refused() {
    let (_, a, b) = setup();
    let r = a.lock_all(["d/x", "d/y", "d/x"]).try_acquire().await;
    assert!(matches!(r, Err(Error::InvalidInput { .. })), "{r:?}");
    assert!(b.lock("d/y").try_acquire().await.unwrap().is_some());
}

/// `run` with a future that panics: the panic reaches the caller and the
/// lock is released in the background.
#[tokio::test(start_paused = true)]
async fn run_with_a_panicking_future_releases() {
    let (_, a, b) = setup();
    let task = tokio::spawn({
        let a = a.clone();
        async move {
            a.lock("panics")
                .ttl(Duration::from_secs(60))
                .run(async { panic!("boom") })
                .await
        }
    });
    assert!(task.await.unwrap_err().is_panic());
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert!(b.lock("panics").try_acquire().await.unwrap().is_some());
    let task = tokio::spawn({
        let a = a.clone();
        async move {
            a.lock_all(["panics/a", "panics/b"])
                .ttl(Duration::from_secs(60))
                .run(async { panic!("boom") })
                .await
        }
    });
    assert!(task.await.unwrap_err().is_panic());
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert!(b
        .lock_all(["panics/a", "panics/b"])
        .try_acquire()
        .await
        .unwrap()
        .is_some());
}

/// Resigning a leadership that was removed on the server answers
/// `Ok(false)`; the next campaign is granted.
#[tokio::test(start_paused = true)]
async fn resign_after_a_loss() {
    let (w, a, b) = setup();
    let e = a.election("el").ttl(Duration::from_secs(3));
    let l = e.campaign("one").await.unwrap();
    assert!(w.inner.evict(&name("el")));
    assert_eq!(l.lost().await, LostReason::RenewalRejected);
    assert!(!l.resign().await.unwrap());
    let l2 = b
        .election("el")
        .try_campaign("two")
        .await
        .unwrap()
        .expect("a campaign after the loss was refused");
    assert!(l2.resign().await.unwrap());
}

/// An observe stream keeps working after its client is dropped.
#[tokio::test(start_paused = true)]
async fn observe_after_the_client_is_dropped() {
    let (_, a, b) = setup();
    let mut leaders = a.election("obs").observe().await.unwrap();
    drop(a);
    assert_eq!(leaders.next().await.unwrap().unwrap(), None);
    let l = b.election("obs").campaign("v1").await.unwrap();
    let seen = tokio::time::timeout(Duration::from_secs(5), leaders.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(seen.value, "v1");
    drop(l);
}

/// A semaphore and a shared hold nest for one holder without taking a
/// second permit or hold; limits that differ are typed errors.
#[tokio::test(start_paused = true)]
async fn nesting_of_permits_and_shared_holds() {
    let (_, a, b) = setup();
    let p1 = a.semaphore("sem", 1).holder("h").acquire().await.unwrap();
    let p2 = a.semaphore("sem", 1).holder("h").acquire().await.unwrap();
    assert_eq!(p1.token(), p2.token());
    assert_eq!(p1.hold_count(), 2);
    let other = b.semaphore("sem", 2).try_acquire().await;
    assert!(
        matches!(other, Err(Error::LimitMismatch { .. })),
        "{other:?}"
    );
    let mine = a.semaphore("sem", 2).try_acquire().await;
    assert!(matches!(mine, Err(Error::LimitMismatch { .. })), "{mine:?}");
    assert!(b.semaphore("sem", 1).try_acquire().await.unwrap().is_none());
    p1.release().await.unwrap();
    assert!(b.semaphore("sem", 1).try_acquire().await.unwrap().is_none());
    p2.release().await.unwrap();
    assert!(b.semaphore("sem", 1).try_acquire().await.unwrap().is_some());

    let s1 = a.lock("rw").shared().holder("h").acquire().await.unwrap();
    let s2 = a.lock("rw").shared().holder("h").acquire().await.unwrap();
    assert_eq!(s1.token(), s2.token());
    let up = a.lock("rw").holder("h").try_acquire().await;
    assert!(matches!(up, Err(Error::UpgradeRefused { .. })), "{up:?}");
    drop((s1, s2));
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert!(b.lock("rw").try_acquire().await.unwrap().is_some());
}

/// Two acquires of one holder started together: the first takes the local
/// gate and asks the server; the second, waiting at the gate, nests in the
/// first's hold once it is granted instead of waiting for its release.
#[tokio::test(start_paused = true)]
async fn two_acquires_of_one_holder_started_together_both_get_guards() {
    let (w, a, _) = setup();
    w.slow_acquires.store(true, Ordering::SeqCst);
    let both = tokio::time::timeout(Duration::from_secs(60), async {
        tokio::join!(
            a.lock("join").holder("h").acquire(),
            a.lock("join").holder("h").acquire()
        )
    })
    .await;
    let (g1, g2) = both.expect("the holder's second acquire waited for its first one's release");
    let (g1, g2) = (g1.expect("granted"), g2.expect("granted"));
    assert_eq!(g1.hold_count(), 2);
    assert_eq!(g1.token(), g2.token());
    // Another holder still waits for both to go.
    let other = a
        .lock("join")
        .holder("other")
        .try_acquire()
        .await
        .expect("answered");
    assert!(
        other.is_none(),
        "another holder was granted beside the nested holds"
    );
}

/// The same for a semaphore: the holder's second acquire nests in the
/// permit its first one is granted instead of taking a second permit.
#[tokio::test(start_paused = true)]
async fn two_acquires_of_one_holder_started_together_take_one_permit() {
    let (w, a, b) = setup();
    w.slow_acquires.store(true, Ordering::SeqCst);
    let (g1, g2) = tokio::join!(
        a.semaphore("join/permits", 2).holder("h").acquire(),
        a.semaphore("join/permits", 2).holder("h").acquire()
    );
    let (g1, g2) = (g1.expect("granted"), g2.expect("granted"));
    assert_eq!(g1.hold_count(), 2);
    assert_eq!(g1.token(), g2.token());
    let other = b
        .semaphore("join/permits", 2)
        .holder("other")
        .try_acquire()
        .await
        .expect("answered");
    assert!(
        other.is_some(),
        "one holder's two acquires took both permits of a semaphore of 2"
    );
}

/// And for shared holds: one holder, one shared hold on the server.
#[tokio::test(start_paused = true)]
async fn two_shared_acquires_of_one_holder_started_together_take_one_hold() {
    let (w, a, _) = setup();
    w.slow_acquires.store(true, Ordering::SeqCst);
    let (g1, g2) = tokio::join!(
        a.lock("join/shared").shared().holder("h").acquire(),
        a.lock("join/shared").shared().holder("h").acquire()
    );
    let (g1, g2) = (g1.expect("granted"), g2.expect("granted"));
    assert_eq!(g1.hold_count(), 2);
    assert_eq!(g1.token(), g2.token());
    let status = w
        .inner
        .inspect(&name("join/shared"))
        .await
        .expect("inspected");
    assert_eq!(status.shared, Some(1), "{status:?}");
}

/// A try by a holder whose own acquire is under way does not take a second
/// hold beside it: it answers "not free" until that acquire is granted,
/// then nests.
#[tokio::test(start_paused = true)]
async fn a_try_beside_the_holders_own_acquire_under_way_takes_nothing() {
    let (w, a, b) = setup();
    w.slow_acquires.store(true, Ordering::SeqCst);
    let first = tokio::spawn({
        let a = a.clone();
        async move { a.semaphore("join/try", 2).holder("h").acquire().await }
    });
    tokio::time::sleep(Duration::from_millis(2)).await;
    let tried = a
        .semaphore("join/try", 2)
        .holder("h")
        .try_acquire()
        .await
        .expect("answered");
    assert!(
        tried.is_none(),
        "a try beside the holder's acquire under way took a permit"
    );
    let g1 = first.await.expect("joined").expect("granted");
    let g2 = a
        .semaphore("join/try", 2)
        .holder("h")
        .try_acquire()
        .await
        .expect("answered")
        .expect("nested once the first was granted");
    assert_eq!(g1.token(), g2.token());
    let other = b
        .semaphore("join/try", 2)
        .holder("other")
        .try_acquire()
        .await
        .expect("answered");
    assert!(other.is_some(), "the holder's acquires took both permits");
}

/// `run` reports a loss when the release that ends it says the lock was no
/// longer ours (taken away on the server while the future ran, before the
/// next renewal could notice): the future finished, but not under the lock.
#[tokio::test(start_paused = true)]
async fn run_does_not_report_success_for_a_hold_the_server_took_away() {
    let (w, a, _) = setup();
    let r = a
        .lock("run/evicted")
        .ttl(Duration::from_secs(30))
        .run(async {
            tokio::time::sleep(Duration::from_secs(1)).await;
            assert!(w.inner.evict(&name("run/evicted")));
            tokio::time::sleep(Duration::from_secs(1)).await;
        })
        .await;
    assert!(
        matches!(
            r,
            Err(Error::LeaseLost {
                reason: LostReason::ReleaseRejected,
                ..
            })
        ),
        "{r:?}"
    );
    // The same for a multi-lock, naming the lock taken away.
    let r = a
        .lock_all(["run/a", "run/b"])
        .ttl(Duration::from_secs(30))
        .run(async {
            tokio::time::sleep(Duration::from_secs(1)).await;
            assert!(w.inner.evict(&name("run/b")));
        })
        .await;
    match r {
        Err(Error::LeaseLost {
            name,
            reason: LostReason::ReleaseRejected,
        }) => assert_eq!(name.as_str(), "run/b"),
        other => panic!("{other:?}"),
    }
}
