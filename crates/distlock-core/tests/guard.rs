//! The guard and watchdog logic over scripted faults. Time is paused, so
//! the schedules below are exact, not timing-dependent.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use distlock_core::{
    async_trait, Backend, Capabilities, Error, Grant, LockClient, LockRequest, LostReason,
    MemoryBackend, Result,
};
use tokio::sync::Notify;
use tokio::time::Instant;

/// Memory with switchable faults.
#[derive(Debug, Default)]
struct Scripted {
    inner: MemoryBackend,
    fail_extend: AtomicBool,
    lose_acquire_reply: AtomicBool,
    /// How many of the next releases fail as if the server were unreachable.
    fail_releases: AtomicUsize,
    extends: AtomicUsize,
    /// Extends reach the server, and then the reply is lost.
    extend_reply_lost: AtomicBool,
    /// How many of the next releases never answer.
    hang_releases: AtomicUsize,
    /// Releases answer after this many milliseconds.
    slow_releases_ms: AtomicUsize,
    /// Extends for this TTL (in ms) never answer.
    hang_extends_ms: AtomicUsize,
    /// Extends reach the server at once, and the reply takes this many
    /// milliseconds.
    slow_extend_replies_ms: AtomicUsize,
    /// Extends for this TTL (in ms) reach the server 600 ms later, from a
    /// task of their own (so even when their caller gave up), and never
    /// answer.
    straggle_extends_ms: AtomicUsize,
    /// Acquires reach the server (and may be granted), and the reply never
    /// comes.
    hang_acquire_replies: AtomicBool,
    /// A drift allowance of this many milliseconds on every TTL, declared
    /// to clients made after it is set.
    drift_ms: AtomicUsize,
    /// How many of the next acquire attempts fail before reaching the
    /// server, as if it were unreachable.
    unreachable_acquires: AtomicUsize,
    /// How many of the next acquire attempts are granted and then lose
    /// their reply.
    lost_acquire_replies: AtomicUsize,
    /// How many of the next acquire attempts answer that the waiter's own
    /// session ended.
    session_ended_acquires: AtomicUsize,
    session_end: Arc<Notify>,
    /// Every release call, answered or not.
    releases: AtomicUsize,
    /// How many of the next acquire attempts are granted and then answer
    /// a configuration error (a script refused a command after its write).
    refused_after_grant: AtomicUsize,
}

#[async_trait]
impl Backend for Scripted {
    fn capabilities(&self) -> Capabilities {
        let caps = self.inner.capabilities().with_session();
        match self.drift_ms.load(Ordering::SeqCst) as u64 {
            0 => caps,
            ms => caps.with_drift(0, Duration::from_millis(ms)),
        }
    }
    async fn try_acquire(&self, req: &LockRequest) -> Result<Option<Grant>> {
        let take = |n: &AtomicUsize| {
            n.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                .is_ok()
        };
        if take(&self.unreachable_acquires) {
            return Err(Error::unavailable("scripted", "connection refused", None));
        }
        if take(&self.session_ended_acquires) {
            return Err(Error::LeaseLost {
                name: req.name.clone(),
                reason: LostReason::SessionLost("scripted session end".into()),
            });
        }
        let granted = self.inner.try_acquire(req).await?;
        if granted.is_some() && take(&self.refused_after_grant) {
            return Err(Error::misconfigured(
                "scripted",
                "a command refused after the write",
                None,
            ));
        }
        if granted.is_some() && take(&self.lost_acquire_replies) {
            return Err(Error::unavailable("scripted", "reply lost", None));
        }
        if self.lose_acquire_reply.load(Ordering::SeqCst) {
            return Err(Error::unavailable("scripted", "reply lost", None));
        }
        if self.hang_acquire_replies.load(Ordering::SeqCst) {
            std::future::pending::<()>().await;
        }
        Ok(granted)
    }
    async fn extend(&self, req: &LockRequest) -> Result<bool> {
        self.extends.fetch_add(1, Ordering::SeqCst);
        if self.fail_extend.load(Ordering::SeqCst) {
            return Err(Error::unavailable("scripted", "server unreachable", None));
        }
        if req.ttl.as_millis() == self.straggle_extends_ms.load(Ordering::SeqCst) as u128 {
            let (inner, req) = (self.inner.clone(), req.clone());
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(600)).await;
                let _ = inner.extend(&req).await;
            });
            std::future::pending::<()>().await;
        }
        if req.ttl.as_millis() == self.hang_extends_ms.load(Ordering::SeqCst) as u128 {
            std::future::pending::<()>().await;
        }
        let extended = self.inner.extend(req).await;
        let slow = self.slow_extend_replies_ms.load(Ordering::SeqCst) as u64;
        if slow > 0 {
            tokio::time::sleep(Duration::from_millis(slow)).await;
        }
        if self.extend_reply_lost.load(Ordering::SeqCst) {
            return Err(Error::unavailable("scripted", "reply lost", None));
        }
        extended
    }
    async fn release(&self, req: &LockRequest) -> Result<bool> {
        self.releases.fetch_add(1, Ordering::SeqCst);
        let failing = self
            .fail_releases
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1));
        if failing.is_ok() {
            return Err(Error::unavailable("scripted", "connection reset", None));
        }
        let hanging = self
            .hang_releases
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1));
        if hanging.is_ok() {
            std::future::pending::<()>().await;
        }
        let slow = self.slow_releases_ms.load(Ordering::SeqCst) as u64;
        tokio::time::sleep(Duration::from_millis(slow)).await;
        self.inner.release(req).await
    }
    async fn session_lost(&self, _req: &LockRequest) -> LostReason {
        self.session_end.notified().await;
        LostReason::SessionLost("scripted session end".into())
    }
}

fn setup() -> (Arc<Scripted>, LockClient, LockClient) {
    let s = Arc::new(Scripted::default());
    let a = LockClient::from_dyn(s.clone());
    let b = LockClient::new(s.inner.clone());
    (s, a, b)
}

#[tokio::test(start_paused = true)]
async fn watchdog_renews_about_every_third_of_the_ttl() {
    let (s, a, _) = setup();
    let g = a
        .lock("renew")
        .ttl(Duration::from_secs(3))
        .acquire()
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert!(g.is_held());
    let n = s.extends.load(Ordering::SeqCst);
    assert!((29..=31).contains(&n), "{n} renewals in 10 TTLs");
}

#[tokio::test(start_paused = true)]
async fn failing_renewals_report_renewal_failed_at_the_deadline() {
    let (s, a, _) = setup();
    let start = Instant::now();
    let g = a
        .lock("flaky")
        .ttl(Duration::from_secs(3))
        .acquire()
        .await
        .unwrap();
    let deadline = g.deadline().unwrap();
    s.fail_extend.store(true, Ordering::SeqCst);
    let reason = g.lost().await;
    assert!(
        matches!(reason, LostReason::RenewalFailed(ref e) if e.contains("unreachable")),
        "{reason:?}"
    );
    assert!(Instant::now() >= deadline && deadline <= start + Duration::from_secs(3));
    assert!(
        s.extends.load(Ordering::SeqCst) > 1,
        "renewal was not retried"
    );
    assert!(!g.is_held());
}

#[tokio::test(start_paused = true)]
async fn max_hold_stops_renewal() {
    let (_, a, b) = setup();
    let start = Instant::now();
    let g = a
        .lock("bounded")
        .ttl(Duration::from_secs(2))
        .max_hold(Duration::from_secs(5))
        .acquire()
        .await
        .unwrap();
    assert_eq!(g.lost().await, LostReason::MaxHoldReached);
    let held_for = start.elapsed();
    assert!(
        held_for <= Duration::from_secs(5) && held_for >= Duration::from_secs(4),
        "{held_for:?}"
    );
    assert!(b.lock("bounded").try_acquire().await.unwrap().is_some());
}

#[tokio::test(start_paused = true)]
async fn session_end_fires_lost() {
    let (s, a, _) = setup();
    let g = a.lock("session").acquire().await.unwrap();
    s.session_end.notify_one();
    assert!(matches!(g.lost().await, LostReason::SessionLost(_)));
}

#[tokio::test(start_paused = true)]
async fn lost_acquire_reply_is_released_not_left_held() {
    let (s, a, b) = setup();
    s.lose_acquire_reply.store(true, Ordering::SeqCst);
    let r = a
        .lock("maybe")
        .ttl(Duration::from_secs(60))
        .try_acquire()
        .await;
    assert!(matches!(r, Err(Error::Unavailable { .. })), "{r:?}");
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert!(
        b.lock("maybe").try_acquire().await.unwrap().is_some(),
        "lock left held by nobody"
    );
}

/// The release that reclaims a maybe-granted hold meets the same broken
/// connection as the acquire (its pool's sockets were cut with it): it is
/// tried again until it goes through, well before the TTL.
#[tokio::test(start_paused = true)]
async fn a_failing_cleanup_release_is_retried_before_the_ttl() {
    let (s, a, b) = setup();
    s.lose_acquire_reply.store(true, Ordering::SeqCst);
    s.fail_releases.store(3, Ordering::SeqCst);
    let ttl = Duration::from_secs(60);
    let r = a.lock("maybe/again").ttl(ttl).try_acquire().await;
    assert!(matches!(r, Err(Error::Unavailable { .. })), "{r:?}");
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        s.fail_releases.load(Ordering::SeqCst),
        0,
        "the cleanup release was not tried again"
    );
    assert!(
        b.lock("maybe/again").try_acquire().await.unwrap().is_some(),
        "lock left held by nobody after its cleanup release failed"
    );
}

#[tokio::test(start_paused = true)]
async fn dropped_guard_releases_in_background() {
    let (_, a, b) = setup();
    let g = a
        .lock("drop")
        .ttl(Duration::from_secs(60))
        .acquire()
        .await
        .unwrap();
    drop(g);
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert!(b.lock("drop").try_acquire().await.unwrap().is_some());
}

#[tokio::test(start_paused = true)]
async fn rejected_renewal_after_eviction_reports_renewal_rejected() {
    let (s, a, _) = setup();
    let g = a
        .lock("evicted")
        .ttl(Duration::from_secs(3))
        .acquire()
        .await
        .unwrap();
    s.inner.evict(g.name());
    assert_eq!(g.lost().await, LostReason::RenewalRejected);
    let e = g.extend(Duration::from_secs(3)).await.unwrap_err();
    assert!(matches!(e, Error::LeaseLost { .. }));
}

#[tokio::test(start_paused = true)]
async fn nested_holder_keeps_lock_until_outermost_release() {
    let (_, a, b) = setup();
    let outer = a.lock("nest").holder("h").acquire().await.unwrap();
    let inner = a.lock("nest").holder("h").acquire().await.unwrap();
    let third = a
        .lock("nest")
        .holder("h")
        .try_acquire()
        .await
        .unwrap()
        .unwrap();
    assert_eq!(outer.hold_count(), 3);
    drop(third);
    assert!(inner.release().await.unwrap());
    assert!(b.lock("nest").try_acquire().await.unwrap().is_none());
    assert!(outer.release().await.unwrap());
    assert!(b.lock("nest").try_acquire().await.unwrap().is_some());
}

/// An extend whose reply is lost may have reached the server: the guard
/// then counts its lease no longer than that extend would leave it.
#[tokio::test(start_paused = true)]
async fn an_extend_answered_with_an_error_may_have_shortened_the_lease() {
    let (s, a, b) = setup();
    let g = a
        .lock("shorter")
        .ttl(Duration::from_secs(30))
        .acquire()
        .await
        .unwrap();
    s.extend_reply_lost.store(true, Ordering::SeqCst);
    assert!(g.extend(Duration::from_secs(1)).await.is_err());
    tokio::time::sleep(Duration::from_secs(2)).await;
    // The server ended the lease after the extend's second.
    assert!(b.lock("shorter").try_acquire().await.unwrap().is_some());
    assert!(!g.is_held(), "the guard outlived its lease on the server");
}

/// A user's extend that never answers does not hold the keeper's later
/// renewals to the deadline of one sent beside it: the hold lives on.
#[tokio::test(start_paused = true)]
async fn an_extend_that_never_answers_leaves_later_renewals_their_deadlines() {
    let (s, a, _) = setup();
    let g = a
        .lock("hanging")
        .ttl(Duration::from_secs(30))
        .acquire()
        .await
        .unwrap();
    s.hang_extends_ms.store(600_000, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(9_990)).await;
    let hanging =
        tokio::time::timeout(Duration::from_secs(120), g.extend(Duration::from_secs(600)));
    let (cut, ()) = tokio::join!(hanging, async {
        tokio::time::sleep(Duration::from_secs(100)).await;
        assert!(g.is_held(), "lost while renewals went through");
        assert!(s.extends.load(Ordering::SeqCst) >= 10);
    });
    assert!(cut.is_err(), "the hanging extend answered");
}

/// A TTL no acquire could ask for is refused, and a shorter lease than the
/// lock's TTL is renewed before it ends.
#[tokio::test(start_paused = true)]
async fn extend_checks_its_ttl_and_renews_before_the_new_deadline() {
    let (_, a, _) = setup();
    let g = a
        .lock("extend")
        .ttl(Duration::from_secs(30))
        .acquire()
        .await
        .unwrap();
    for ttl in [Duration::ZERO, Duration::MAX] {
        let e = g.extend(ttl).await.unwrap_err();
        assert!(matches!(e, Error::InvalidInput { .. }), "{ttl:?}: {e}");
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    g.extend(Duration::from_secs(3)).await.unwrap();
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert!(g.is_held(), "lost after a shorter extend");
    assert!(
        tokio::time::timeout(Duration::ZERO, g.lost())
            .await
            .is_err(),
        "lost after a shorter extend"
    );
}

/// The last guard dropped and the same holder acquiring at once: a new
/// hold once the old one's release is done, not an error.
#[tokio::test(start_paused = true)]
async fn the_same_holder_acquires_again_right_after_dropping_its_guard() {
    let (_, a, _) = setup();
    let g = a.lock("again").holder("h").acquire().await.unwrap();
    drop(g);
    let again = a.lock("again").holder("h").acquire().await.unwrap();
    assert_eq!(again.hold_count(), 1);
    assert!(again.release().await.unwrap());
}

/// Durations past the clock's range mean "never", not a panic (and not a
/// hold left behind by one).
#[tokio::test(start_paused = true)]
async fn durations_past_the_clocks_range_do_not_panic() {
    let (_, a, b) = setup();
    let g = a
        .lock("forever")
        .max_hold(Duration::MAX)
        .wait(Duration::MAX)
        .acquire()
        .await
        .unwrap();
    assert!(g.release().await.unwrap());
    let all = a
        .lock_all(["forever", "ever"])
        .wait(Duration::MAX)
        .max_hold(Duration::MAX)
        .acquire()
        .await
        .unwrap();
    all.release().await.unwrap();
    assert!(b.lock("forever").try_acquire().await.unwrap().is_some());
}

/// A release cut short (a timeout around it) goes on in the background,
/// as a dropped guard's does.
#[tokio::test(start_paused = true)]
async fn a_cancelled_release_still_releases() {
    let (s, a, b) = setup();
    let g = a.lock("cut").acquire().await.unwrap();
    s.hang_releases.store(1, Ordering::SeqCst);
    let cut = tokio::time::timeout(Duration::from_millis(10), g.release()).await;
    assert!(cut.is_err(), "the first release answered");
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert!(b.lock("cut").try_acquire().await.unwrap().is_some());
}

/// A release the server has not answered by the lease's deadline, where
/// the lease ends anyway, no longer keeps the name from the client's other
/// tasks; one the server never answers gives up one TTL later.
#[tokio::test(start_paused = true)]
async fn a_release_that_never_answers_frees_the_name_at_the_leases_deadline() {
    let (s, a, _) = setup();
    let ttl = Duration::from_secs(3);
    let g = a.lock("unanswered").ttl(ttl).acquire().await.unwrap();
    s.hang_releases.store(1, Ordering::SeqCst);
    let started = tokio::time::Instant::now();
    let releasing = tokio::spawn(g.release());
    let again = tokio::time::timeout(
        Duration::from_secs(30),
        a.lock("unanswered").ttl(ttl).acquire(),
    )
    .await;
    assert!(matches!(again, Ok(Ok(_))), "{again:?}");
    assert!(
        !releasing.is_finished(),
        "the release gave up at the deadline"
    );
    let released = tokio::time::timeout(Duration::from_secs(30), releasing).await;
    assert!(
        matches!(released, Ok(Ok(Err(Error::Unavailable { .. })))),
        "{released:?}"
    );
    assert!(started.elapsed() <= ttl * 2, "{:?}", started.elapsed());
}

/// A `release()` cut short (a timeout around it) goes on in the
/// background; when that release does not answer either, it still frees
/// the name for the client's other tasks at the lease's deadline, as an
/// uncut release does.
#[tokio::test(start_paused = true)]
async fn a_cancelled_release_that_never_answers_frees_the_name_at_the_deadline() {
    let (s, a, _) = setup();
    let ttl = Duration::from_secs(3);
    let g = a.lock("cut/unanswered").ttl(ttl).acquire().await.unwrap();
    // The network is gone: the user's release and the background one hang.
    s.hang_releases.store(2, Ordering::SeqCst);
    let cut = tokio::time::timeout(Duration::from_millis(10), g.release()).await;
    assert!(cut.is_err(), "the first release answered");
    let again = tokio::time::timeout(
        Duration::from_secs(30),
        a.lock("cut/unanswered").ttl(ttl).acquire(),
    )
    .await;
    assert!(
        matches!(again, Ok(Ok(_))),
        "the name is still kept from the client's other tasks 30 s after a 3 s lease ended: {again:?}"
    );
}

/// `run` after a loss releases the lost guard; a release the network never
/// answers does not keep `run` from returning the loss.
#[tokio::test(start_paused = true)]
async fn run_returns_a_loss_even_when_the_release_never_answers() {
    let (s, a, _) = setup();
    let ttl = Duration::from_secs(3);
    // A partition: renewals fail, releases never answer.
    s.fail_extend.store(true, Ordering::SeqCst);
    s.hang_releases.store(usize::MAX, Ordering::SeqCst);
    let ran = tokio::time::timeout(
        Duration::from_secs(60),
        a.lock("run/partitioned")
            .ttl(ttl)
            .run(std::future::pending::<()>()),
    )
    .await;
    assert!(
        matches!(ran, Ok(Err(Error::LeaseLost { .. }))),
        "run had not returned 60 s after a 3 s lease was lost: {ran:?}"
    );
}

/// An extend answered after the keeper reported the hold lost (and
/// released it) does not report success.
#[tokio::test(start_paused = true)]
async fn an_extend_answered_after_the_loss_does_not_report_success() {
    let (s, a, b) = setup();
    let ttl = Duration::from_secs(3);
    let g = a
        .lock("extend/late")
        .ttl(ttl)
        .no_renew()
        .acquire()
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    assert!(g.is_held());
    // Applied by the server at once; its reply arrives a second later,
    // after the local deadline.
    s.slow_extend_replies_ms.store(1_000, Ordering::SeqCst);
    let extended = g.extend(ttl).await;
    let lost = tokio::time::timeout(Duration::ZERO, g.lost()).await;
    let other = b.lock("extend/late").try_acquire().await.unwrap();
    assert!(
        extended.is_err() || (g.is_held() && lost.is_err() && other.is_none()),
        "extend answered {extended:?}, yet is_held = {}, lost = {lost:?}, another client acquired = {}",
        g.is_held(),
        other.is_some()
    );
}

/// An extend cut short may still reach the server, after an extend sent
/// later; the later one's grant then promises no more than the cut one
/// leaves.
#[tokio::test(start_paused = true)]
async fn a_cut_extend_that_lands_late_still_bounds_later_grants() {
    let (s, a, b) = setup();
    let g = a
        .lock("extend/straggler")
        .ttl(Duration::from_secs(30))
        .acquire()
        .await
        .unwrap();
    s.straggle_extends_ms.store(3_000, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(100)).await;
    // Cut by the caller; it reaches the server at 0.7 s and ends the lease
    // at 3.7 s.
    let cut =
        tokio::time::timeout(Duration::from_millis(10), g.extend(Duration::from_secs(3))).await;
    assert!(cut.is_err(), "the straggling extend answered");
    tokio::time::sleep(Duration::from_millis(90)).await;
    // Sent after the cut one, answered at once.
    g.extend(Duration::from_secs(30)).await.unwrap();
    tokio::time::sleep(Duration::from_secs(4)).await;
    let other = b.lock("extend/straggler").try_acquire().await.unwrap();
    assert!(
        !(other.is_some() && g.is_held()),
        "another client holds the lock while the guard reports it held until {:?} from now",
        g.deadline().map(|d| d - Instant::now())
    );
}

/// A wait whose request is never answered ends shortly after its deadline
/// with `WaitTimeout`, not when the backend gives up, and what the request
/// took on the server is released.
#[tokio::test(start_paused = true)]
async fn a_wait_whose_request_never_answers_ends_after_its_deadline() {
    let (s, a, b) = setup();
    s.hang_acquire_replies.store(true, Ordering::SeqCst);
    let start = Instant::now();
    let wait = Duration::from_secs(2);
    let r = tokio::time::timeout(
        Duration::from_secs(600),
        a.lock("unanswered-wait").wait(wait).acquire(),
    )
    .await;
    assert!(
        matches!(r, Ok(Err(Error::WaitTimeout { .. }))),
        "{:?}",
        r.map(|r| r.map(|_| "granted"))
    );
    assert_eq!(start.elapsed(), wait + distlock_core::ANSWER_GRACE);
    s.hang_acquire_replies.store(false, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(10)).await;
    let other = b.lock("unanswered-wait").try_acquire().await.unwrap();
    assert!(other.is_some(), "the unanswered grant was never released");
}

/// A release the server answers only after the lease's deadline (as one
/// from a holder paused past it) returns the server's answer, not a
/// timeout: the caller learns whether the hold was still its own.
#[tokio::test(start_paused = true)]
async fn a_release_answered_after_the_leases_deadline_returns_the_answer() {
    let (s, a, _) = setup();
    let ttl = Duration::from_secs(3);
    let g = a.lock("late").ttl(ttl).acquire().await.unwrap();
    s.slow_releases_ms.store(4_000, Ordering::SeqCst);
    let released = tokio::time::timeout(Duration::from_secs(30), g.release()).await;
    assert!(matches!(released, Ok(Ok(_))), "{released:?}");
}

/// Found by the fault suite's workload: the deadline of a lock granted
/// after a long wait was counted from the start of the wait, so a waiter
/// that waited longer than the TTL was handed a guard already lost.
#[tokio::test(start_paused = true)]
async fn a_grant_after_a_wait_longer_than_the_ttl_gets_its_full_ttl() {
    let mem = MemoryBackend::new();
    let (a, b) = (LockClient::new(mem.clone()), LockClient::new(mem.clone()));
    let ttl = Duration::from_secs(2);
    let first = a.lock("job").ttl(ttl).acquire().await.unwrap();
    let waiter = tokio::spawn(async move {
        b.lock("job")
            .ttl(ttl)
            .wait(Duration::from_secs(60))
            .acquire()
            .await
    });
    tokio::time::sleep(Duration::from_secs(10)).await;
    first.release().await.unwrap();
    let second = waiter.await.unwrap().unwrap();
    let left = second.deadline().unwrap() - Instant::now();
    assert!(second.is_held(), "granted just now, yet not held");
    assert!(left > ttl * 9 / 10, "only {left:?} of a {ttl:?} lease left");
}

/// Memory that counts batched renewals and can fail them.
#[derive(Debug, Default)]
struct Batching {
    inner: MemoryBackend,
    fail: AtomicBool,
    batches: AtomicUsize,
    renewed: AtomicUsize,
    largest: AtomicUsize,
    /// Batches renewing a name under `hung/` never answer.
    hang: AtomicBool,
    /// Batches renewing a name under `undecided/`, and its own renewals,
    /// fail (as Redlock's fail for a lock whose nodes are down).
    undecided: AtomicBool,
    /// Renewals asked one by one.
    singles: AtomicUsize,
    /// Every renewal, batched or not, answers after this many milliseconds.
    slow_ms: AtomicUsize,
}

const BATCH: usize = 64;

impl Batching {
    async fn round_trip(&self) {
        let ms = self.slow_ms.load(Ordering::SeqCst) as u64;
        if ms > 0 {
            tokio::time::sleep(Duration::from_millis(ms)).await;
        }
    }

    fn undecides(&self, reqs: &[LockRequest]) -> bool {
        self.undecided.load(Ordering::SeqCst)
            && reqs
                .iter()
                .any(|r| r.name.as_str().starts_with("undecided/"))
    }
}

#[async_trait]
impl Backend for Batching {
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities().with_extend_batch(BATCH)
    }
    async fn try_acquire(&self, req: &LockRequest) -> Result<Option<Grant>> {
        self.inner.try_acquire(req).await
    }
    async fn extend(&self, req: &LockRequest) -> Result<bool> {
        self.singles.fetch_add(1, Ordering::SeqCst);
        self.round_trip().await;
        if self.fail.load(Ordering::SeqCst) || self.undecides(std::slice::from_ref(req)) {
            return Err(Error::unavailable("batching", "server unreachable", None));
        }
        self.inner.extend(req).await
    }
    async fn extend_many(&self, reqs: &[LockRequest]) -> Result<Vec<bool>> {
        self.batches.fetch_add(1, Ordering::SeqCst);
        self.renewed.fetch_add(reqs.len(), Ordering::SeqCst);
        self.largest.fetch_max(reqs.len(), Ordering::SeqCst);
        self.round_trip().await;
        if self.fail.load(Ordering::SeqCst) || self.undecides(reqs) {
            return Err(Error::unavailable("batching", "server unreachable", None));
        }
        if self.hang.load(Ordering::SeqCst)
            && reqs.iter().any(|r| r.name.as_str().starts_with("hung/"))
        {
            std::future::pending::<()>().await;
        }
        self.inner.extend_many(reqs).await
    }
    async fn release(&self, req: &LockRequest) -> Result<bool> {
        self.inner.release(req).await
    }
}

async fn hold_many(
    client: &LockClient,
    n: usize,
    spread: Duration,
) -> Result<Vec<distlock_core::LockGuard>> {
    let mut guards = Vec::new();
    for i in 0..n {
        let g = client
            .lock(format!("many/{i}"))
            .ttl(Duration::from_secs(3))
            .acquire()
            .await?;
        guards.push(g);
        tokio::time::sleep(spread / n as u32).await;
    }
    Ok(guards)
}

/// A batch whose request never answers holds up no renewal queued behind
/// it: it is given up at its lease's deadline (that hold is lost), and the
/// other holds renew.
#[tokio::test(start_paused = true)]
async fn a_renewal_that_never_answers_holds_up_no_other_hold() {
    let b = Arc::new(Batching::default());
    let client = LockClient::from_dyn(b.clone());
    let ttl = Duration::from_secs(3);
    let hung = client.lock("hung/a").ttl(ttl).acquire().await.unwrap();
    b.hang.store(true, Ordering::SeqCst);
    // The hung hold's first renewal is out and unanswered by now.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let other = client.lock("other/b").ttl(ttl).acquire().await.unwrap();
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert!(
        !hung.is_held(),
        "a hold whose renewals never answer is held"
    );
    assert!(
        other.is_held(),
        "a hold lost its lease behind another hold's unanswered renewal"
    );
    other.release().await.unwrap();
}

/// The same with a hung hold of a long TTL beside a short one: the hung
/// batch waits until its own deadline (40 s and more away), and the short
/// hold's renewals, due every second meanwhile, go out all the same.
#[tokio::test(start_paused = true)]
async fn a_hung_renewal_of_a_long_hold_holds_up_no_shorter_one() {
    let b = Arc::new(Batching::default());
    let client = LockClient::from_dyn(b.clone());
    let hung = client
        .lock("hung/long")
        .ttl(Duration::from_secs(60))
        .acquire()
        .await
        .unwrap();
    b.hang.store(true, Ordering::SeqCst);
    // The long hold's first renewal (at a third of 60 s) is out by now.
    tokio::time::sleep(Duration::from_secs(25)).await;
    let short = client
        .lock("other/short")
        .ttl(Duration::from_secs(3))
        .acquire()
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert!(
        short.is_held(),
        "a short hold lost its lease behind a long hold's unanswered renewal"
    );
    short.release().await.unwrap();
    drop(hung);
}

#[tokio::test(start_paused = true)]
async fn renewals_of_many_holds_go_out_in_few_batches() {
    let b = Arc::new(Batching::default());
    let client = LockClient::from_dyn(b.clone());
    // 300 holds taken over 2 s (not at one instant), each renewed about
    // every second.
    let guards = hold_many(&client, 300, Duration::from_secs(2))
        .await
        .unwrap();
    let start = (
        b.batches.load(Ordering::SeqCst),
        b.renewed.load(Ordering::SeqCst),
    );
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert!(guards.iter().all(|g| g.is_held()));
    let batches = b.batches.load(Ordering::SeqCst) - start.0;
    let renewed = b.renewed.load(Ordering::SeqCst) - start.1;
    assert!(
        renewed >= 300 * 9,
        "{renewed} renewals of 300 holds in 10 s"
    );
    // Unbatched this is one request per renewal; the holds come due on a
    // quarter-period grid, so each grid point sends ceil(due / 64).
    assert!(
        batches * 20 <= renewed,
        "{batches} batches for {renewed} renewals"
    );
    assert!(b.largest.load(Ordering::SeqCst) <= BATCH);
}

/// A multi-lock's holds are renewed together: each renewal round of its
/// 16 locks is one `extend_many` batch.
#[tokio::test(start_paused = true)]
async fn a_multi_locks_renewals_go_out_as_one_batch() {
    let b = Arc::new(Batching::default());
    let client = LockClient::from_dyn(b.clone());
    let names: Vec<String> = (0..16).map(|i| format!("multi/{i:02}")).collect();
    let m = client
        .lock_all(&names)
        .ttl(Duration::from_secs(3))
        .acquire()
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert!(m.is_held());
    let (batches, renewed) = (
        b.batches.load(Ordering::SeqCst),
        b.renewed.load(Ordering::SeqCst),
    );
    assert!(renewed >= 16 * 9, "{renewed} renewals of 16 holds in 10 s");
    assert_eq!(
        batches * 16,
        renewed,
        "{batches} batches for {renewed} renewals of 16 holds"
    );
    assert!(m.release().await.unwrap());
}

#[tokio::test(start_paused = true)]
async fn a_rejected_renewal_in_a_batch_loses_only_that_hold() {
    let b = Arc::new(Batching::default());
    let client = LockClient::from_dyn(b.clone());
    let guards = hold_many(&client, 10, Duration::ZERO).await.unwrap();
    assert!(b
        .inner
        .evict(&distlock_core::LockName::new("many/3").unwrap()));
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(b.batches.load(Ordering::SeqCst) >= 1);
    for (i, g) in guards.iter().enumerate() {
        if i == 3 {
            assert_eq!(g.lost().await, LostReason::RenewalRejected);
        } else {
            assert!(g.is_held(), "hold {i} was lost with its neighbour");
        }
    }
}

/// A batch the backend fails for one hold it cannot decide is asked again
/// hold by hold: that hold is lost at its deadline, the others renew.
#[tokio::test(start_paused = true)]
async fn a_batch_failed_for_one_hold_renews_the_others_one_by_one() {
    let b = Arc::new(Batching::default());
    let client = LockClient::from_dyn(b.clone());
    let ttl = Duration::from_secs(3);
    let undecided = client.lock("undecided/a").ttl(ttl).acquire().await.unwrap();
    let guards = hold_many(&client, 4, Duration::ZERO).await.unwrap();
    b.undecided.store(true, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert!(
        !undecided.is_held(),
        "a hold no renewal could decide is held"
    );
    for (i, g) in guards.iter().enumerate() {
        assert!(
            g.is_held(),
            "hold {i} was lost with a neighbour in its batch"
        );
    }
    assert!(b.singles.load(Ordering::SeqCst) > 0);
}

/// A batch is bounded by the earliest deadline in it. On a backend slower
/// than a short hold's remaining time, a steady flow of short holds beside
/// a long one: any batch they share with it is cut at their deadline, and
/// the long hold's renewal is then asked alone, bounded by its own
/// deadline; the long hold lives on.
#[tokio::test(start_paused = true)]
async fn a_batch_cut_at_a_short_holds_deadline_renews_the_long_hold_alone() {
    let b = Arc::new(Batching::default());
    b.slow_ms.store(300, Ordering::SeqCst);
    let client = LockClient::from_dyn(b.clone());
    let long = client
        .lock("long/a")
        .ttl(Duration::from_secs(3))
        .acquire()
        .await
        .unwrap();
    let mut short = Vec::new();
    for i in 0..100 {
        let g = client
            .lock(format!("short/{i}"))
            .ttl(Duration::from_millis(400))
            .acquire()
            .await
            .unwrap();
        short.push(g);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        long.is_held(),
        "a hold was lost to the deadlines of shorter holds batched with it"
    );
    long.release().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_failed_batch_is_retried_and_then_every_hold_in_it_is_lost() {
    let b = Arc::new(Batching::default());
    let client = LockClient::from_dyn(b.clone());
    let guards = hold_many(&client, 5, Duration::ZERO).await.unwrap();
    b.fail.store(true, Ordering::SeqCst);
    for g in &guards {
        let reason = g.lost().await;
        assert!(
            matches!(reason, LostReason::RenewalFailed(ref e) if e.contains("unreachable")),
            "{reason:?}"
        );
    }
    assert!(
        b.batches.load(Ordering::SeqCst) > 1,
        "the batch was not retried"
    );
}

/// An acquire answered with an error that ends it (a configuration the
/// server refused after its write) releases its owner before the error is
/// reported, so nothing stays held by a process that exits at once.
#[tokio::test]
async fn an_acquire_refused_after_its_write_is_released_before_its_error() {
    let s = Arc::new(Scripted::default());
    let c = LockClient::from_dyn(s.clone());
    for wait in [None, Some(Duration::from_secs(5))] {
        s.refused_after_grant.store(1, Ordering::SeqCst);
        let before = s.releases.load(Ordering::SeqCst);
        let b = c.lock("refused");
        let e = match wait {
            None => b.try_acquire().await.map(|_| ()),
            Some(w) => b.wait(w).acquire().await.map(|_| ()),
        }
        .unwrap_err();
        assert!(matches!(e, Error::Misconfigured { .. }), "{e:?}");
        assert_eq!(
            s.releases.load(Ordering::SeqCst),
            before + 1,
            "the error came before its owner's release"
        );
        let other = LockClient::new(s.inner.clone());
        let g = other.lock("refused").try_acquire().await.unwrap();
        assert!(g.is_some(), "the refused acquire's lock stayed held");
        assert!(g.unwrap().release().await.unwrap());
    }
}

/// A caller that gives up while that release is out (a timeout around the
/// acquire): the lock is released in the background all the same.
#[tokio::test]
async fn an_acquire_given_up_during_its_release_is_released_in_the_background() {
    let (s, a, b) = setup();
    s.refused_after_grant.store(1, Ordering::SeqCst);
    s.hang_releases.store(1, Ordering::SeqCst);
    let given_up =
        tokio::time::timeout(Duration::from_millis(100), a.lock("given-up").try_acquire()).await;
    assert!(
        given_up.is_err(),
        "the acquire answered while its release hung"
    );
    let start = Instant::now();
    loop {
        if let Some(g) = b.lock("given-up").try_acquire().await.unwrap() {
            assert!(g.release().await.unwrap());
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "the lock stayed held after its acquire was given up"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Memory whose all-at-once acquires take every lock and then answer a
/// configuration error.
#[derive(Debug, Default)]
struct RefusesAllAfterWrite {
    inner: MemoryBackend,
    releases: AtomicUsize,
}

#[async_trait]
impl Backend for RefusesAllAfterWrite {
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }
    async fn try_acquire(&self, req: &LockRequest) -> Result<Option<Grant>> {
        self.inner.try_acquire(req).await
    }
    async fn try_acquire_all(&self, reqs: &[LockRequest]) -> Result<distlock_core::AllAtOnce> {
        self.inner.try_acquire_all(reqs).await?;
        Err(Error::misconfigured(
            "scripted",
            "a command refused after the write",
            None,
        ))
    }
    async fn extend(&self, req: &LockRequest) -> Result<bool> {
        self.inner.extend(req).await
    }
    async fn release(&self, req: &LockRequest) -> Result<bool> {
        self.releases.fetch_add(1, Ordering::SeqCst);
        self.inner.release(req).await
    }
}

/// The same for a multi-lock's all-at-once request: every lock it took is
/// released before the error is reported.
#[tokio::test]
async fn a_multi_lock_refused_after_its_write_is_released_before_its_error() {
    let s = Arc::new(RefusesAllAfterWrite::default());
    let c = LockClient::from_dyn(s.clone());
    let e = c.lock_all(["a", "b"]).try_acquire().await.unwrap_err();
    assert!(matches!(e, Error::Misconfigured { .. }), "{e:?}");
    assert_eq!(
        s.releases.load(Ordering::SeqCst),
        2,
        "the error came before the owners' releases"
    );
    let other = LockClient::new(s.inner.clone());
    for name in ["a", "b"] {
        let g = other.lock(name).try_acquire().await.unwrap();
        assert!(g.is_some(), "{name} stayed held");
    }
}

/// Memory whose holds live in named sessions that the test can end.
#[derive(Debug, Default)]
struct Sessions {
    inner: MemoryBackend,
    ended: Arc<Notify>,
    /// Watchers started, and watchers still waiting.
    watchers: AtomicUsize,
    waiting: Arc<AtomicUsize>,
}

/// Counts a waiting watcher until it returns or is aborted.
struct Waiting(Arc<AtomicUsize>);

impl Drop for Waiting {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

#[async_trait]
impl Backend for Sessions {
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities().with_session()
    }
    async fn try_acquire(&self, req: &LockRequest) -> Result<Option<Grant>> {
        self.inner.try_acquire(req).await
    }
    async fn extend(&self, req: &LockRequest) -> Result<bool> {
        self.inner.extend(req).await
    }
    async fn release(&self, req: &LockRequest) -> Result<bool> {
        self.inner.release(req).await
    }
    async fn session_lost(&self, _req: &LockRequest) -> LostReason {
        panic!("a backend that names its sessions is watched per session")
    }
    fn session_key(&self, _req: &LockRequest) -> Option<u64> {
        Some(7)
    }
    async fn session_ended(&self, key: u64) -> LostReason {
        self.watchers.fetch_add(1, Ordering::SeqCst);
        self.waiting.fetch_add(1, Ordering::SeqCst);
        let _waiting = Waiting(self.waiting.clone());
        self.ended.notified().await;
        LostReason::SessionLost(format!("session {key} ended"))
    }
}

#[tokio::test(start_paused = true)]
async fn one_watcher_per_session_reports_every_hold_in_it_lost() {
    let s = Arc::new(Sessions::default());
    let client = LockClient::from_dyn(s.clone());
    let guards = hold_many(&client, 50, Duration::ZERO).await.unwrap();
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert_eq!(
        s.watchers.load(Ordering::SeqCst),
        1,
        "one watcher for one session"
    );
    s.ended.notify_waiters();
    for g in &guards {
        assert_eq!(
            g.lost().await,
            LostReason::SessionLost("session 7 ended".into())
        );
    }
    // A hold in the same session after its end gets a watcher of its own.
    let late = client.lock("late").acquire().await.unwrap();
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert_eq!(s.watchers.load(Ordering::SeqCst), 2);
    assert!(late.release().await.unwrap());
    // The watcher outlives the session's last hold: the next hold in the
    // session reuses it, and still hears of the session's end.
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert_eq!(s.waiting.load(Ordering::SeqCst), 1, "the idle watcher left");
    let again = client.lock("again").acquire().await.unwrap();
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert_eq!(s.watchers.load(Ordering::SeqCst), 2, "a second watcher");
    s.ended.notify_waiters();
    assert_eq!(
        again.lost().await,
        LostReason::SessionLost("session 7 ended".into())
    );
}

#[tokio::test(start_paused = true)]
async fn dropping_the_client_stops_its_session_watchers() {
    let s = Arc::new(Sessions::default());
    let client = LockClient::from_dyn(s.clone());
    let g = client.lock("one").acquire().await.unwrap();
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert_eq!(s.waiting.load(Ordering::SeqCst), 1);
    assert!(g.release().await.unwrap());
    drop(client);
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert_eq!(
        s.waiting.load(Ordering::SeqCst),
        0,
        "a session watcher outlived its client"
    );
}

/// A client used from a second runtime after the first one ended: its
/// session's watcher, stopped with the first runtime, starts again in the
/// second, so the session's end still reaches the holds taken there.
#[test]
fn a_session_watcher_stopped_with_its_runtime_starts_again_in_the_next() {
    let s = Arc::new(Sessions::default());
    let client = LockClient::from_dyn(s.clone());
    let runtime = || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    };
    let first = runtime();
    first.block_on(async {
        let g = client.lock("one").acquire().await.unwrap();
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert!(g.release().await.unwrap());
    });
    drop(first);
    assert_eq!(
        s.waiting.load(Ordering::SeqCst),
        0,
        "the watcher outlived its runtime"
    );
    runtime().block_on(async move {
        let g = client.lock("two").acquire().await.unwrap();
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert_eq!(s.watchers.load(Ordering::SeqCst), 2, "no new watcher");
        s.ended.notify_waiters();
        let reason = tokio::time::timeout(Duration::from_secs(5), g.lost())
            .await
            .expect("the session's end never reached the hold");
        assert_eq!(reason, LostReason::SessionLost("session 7 ended".into()));
        drop(g);
        drop(client);
    });
}

/// A task that blocks its thread past its hold's deadline keeps the keeper
/// from marking the hold lost; a nested acquire of the same holder then
/// takes a fresh hold instead of nesting in the ended one.
#[tokio::test]
async fn a_nested_acquire_into_a_hold_past_its_deadline_takes_a_fresh_hold() {
    let c = LockClient::new(MemoryBackend::new());
    let short = Duration::from_millis(100);
    let outer = c
        .lock("expired")
        .holder("h")
        .ttl(short)
        .acquire()
        .await
        .unwrap();
    std::thread::sleep(3 * short);
    assert!(!outer.is_held());
    let again = tokio::time::timeout(
        Duration::from_secs(10),
        c.lock("expired")
            .holder("h")
            .ttl(Duration::from_secs(10))
            .acquire(),
    )
    .await
    .expect("the acquire did not answer")
    .unwrap();
    assert!(
        again.is_held() && again.hold_count() == 1,
        "nested in the ended hold: held {}, count {}",
        again.is_held(),
        again.hold_count()
    );
    assert!(again.release().await.unwrap());
}

/// A nested acquire shares the outer hold's lease: its own `ttl`,
/// `no_renew` and `max_hold` are not applied, and its deadline is the
/// outer hold's.
#[tokio::test]
async fn a_nested_acquire_shares_the_outer_holds_lease_whatever_it_asks() {
    let c = LockClient::new(MemoryBackend::new());
    let outer = c
        .lock("shared-lease")
        .holder("h")
        .ttl(Duration::from_secs(60))
        .acquire()
        .await
        .unwrap();
    let inner = c
        .lock("shared-lease")
        .holder("h")
        .ttl(Duration::from_millis(200))
        .no_renew()
        .max_hold(Duration::from_millis(200))
        .acquire()
        .await
        .unwrap();
    assert_eq!(inner.hold_count(), 2);
    assert_eq!(inner.deadline(), outer.deadline());
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert!(
        inner.is_held() && outer.is_held(),
        "the inner builder's short TTL, no_renew or max_hold ended the hold"
    );
    assert!(inner.release().await.unwrap());
    assert!(outer.release().await.unwrap());
}

/// The same for a multi-lock of a holder whose holds of both names passed
/// their deadlines: it answers with fresh holds, never nesting in a hold
/// past its deadline.
#[test]
fn a_multi_lock_of_holds_past_their_deadlines_takes_fresh_holds() {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let answer = rt.block_on(async {
            let c = LockClient::new(MemoryBackend::new());
            let short = Duration::from_millis(100);
            let mut outer = Vec::new();
            for name in ["a", "b"] {
                outer.push(c.lock(name).holder("h").ttl(short).acquire().await?);
            }
            std::thread::sleep(3 * short);
            let m = c
                .lock_all(["a", "b"])
                .holder("h")
                .ttl(Duration::from_secs(10))
                .acquire()
                .await?;
            Ok::<_, Error>(m.is_held())
        });
        let _ = tx.send(answer);
    });
    let held = rx
        .recv_timeout(Duration::from_secs(10))
        .expect("lock_all never answered")
        .unwrap();
    assert!(held, "lock_all answered with holds not held");
}

/// Memory whose next `late` grants answer after two seconds (a file or
/// server busy for longer than the TTL).
#[derive(Debug, Default)]
struct LateGrants {
    inner: MemoryBackend,
    late: AtomicUsize,
}

#[async_trait]
impl Backend for LateGrants {
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }
    async fn try_acquire(&self, req: &LockRequest) -> Result<Option<Grant>> {
        let began = Instant::now();
        // The server's lease outlasts the late answer: only a release
        // frees it before the probe below.
        let granted = self.inner.try_acquire(&req.with_ttl(req.ttl * 10)).await?;
        let late = self
            .late
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok();
        if late {
            tokio::time::sleep(Duration::from_secs(2)).await;
        }
        Ok(granted.map(|g| Grant::new(g.token, began)))
    }
    async fn extend(&self, req: &LockRequest) -> Result<bool> {
        self.inner.extend(req).await
    }
    async fn release(&self, req: &LockRequest) -> Result<bool> {
        self.inner.release(req).await
    }
}

/// A grant answered after its lease's deadline is given back: a try
/// reports the lock not acquired, and leaves it free; a wait asks again
/// and holds a live lease.
#[tokio::test(start_paused = true)]
async fn a_grant_answered_after_its_deadline_is_given_back() {
    let b = Arc::new(LateGrants::default());
    let client = LockClient::from_dyn(b.clone());
    let ttl = Duration::from_secs(1);
    b.late.store(1, Ordering::SeqCst);
    let tried = client.lock("late/x").ttl(ttl).try_acquire().await.unwrap();
    assert!(
        tried.is_none(),
        "a try granted after its deadline returned a guard"
    );
    tokio::time::sleep(Duration::from_millis(100)).await;
    let probe = LockRequest::new(distlock_core::LockName::new("late/x").unwrap(), ttl);
    assert!(
        b.inner.try_acquire(&probe).await.unwrap().is_some(),
        "the late grant was not given back"
    );
    assert!(b.inner.release(&probe).await.unwrap());
    b.late.store(1, Ordering::SeqCst);
    let g = client
        .lock("late/y")
        .ttl(ttl)
        .wait(Duration::from_secs(10))
        .acquire()
        .await
        .unwrap();
    assert!(g.is_held(), "the wait's second grant is not held");
    assert!(g.release().await.unwrap());
}

/// An extend answered after the hold's local deadline, before the keeper's
/// timer ran (the thread was blocked), does not bring the hold back: it is
/// lost there, as a renewal answered that late is, so `is_held` never turns
/// true again once false.
#[test]
fn an_extend_answered_after_the_deadline_does_not_bring_the_hold_back() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let s = Arc::new(Scripted::default());
        s.drift_ms.store(100, Ordering::SeqCst);
        let c = LockClient::from_dyn(s.clone());
        let g = c
            .lock("revive")
            .ttl(Duration::from_millis(300))
            .no_renew()
            .acquire()
            .await
            .unwrap();
        // Past the local deadline (200 ms), inside the server's lease
        // (300 ms); the keeper's timer cannot run on the blocked thread.
        std::thread::sleep(Duration::from_millis(250));
        assert!(!g.is_held());
        let r = g.extend(Duration::from_secs(5)).await;
        assert!(matches!(r, Err(Error::LeaseLost { .. })), "{r:?}");
        assert!(!g.is_held());
        let reason = tokio::time::timeout(Duration::from_secs(1), g.lost()).await;
        assert!(reason.is_ok(), "lost() did not resolve");
        // The server's extended lease is given back.
        tokio::time::sleep(Duration::from_millis(50)).await;
        let other = LockClient::new(s.inner.clone());
        assert!(other.lock("revive").try_acquire().await.unwrap().is_some());
    });
}

/// A drift margin that eats most of the TTL (here 100 of 140 ms) leaves
/// renewal time: the first renewal comes at a third of the trusted 40 ms,
/// not of the TTL, which would be past the deadline.
#[tokio::test(start_paused = true)]
async fn renewal_comes_before_a_deadline_the_drift_margin_brings_forward() {
    let s = Arc::new(Scripted::default());
    s.drift_ms.store(100, Ordering::SeqCst);
    let c = LockClient::from_dyn(s.clone());
    let g = c
        .lock("drifty")
        .ttl(Duration::from_millis(140))
        .acquire()
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(g.is_held(), "the hold was lost");
    assert!(s.extends.load(Ordering::SeqCst) >= 10);
    assert!(g.release().await.unwrap());
}

/// A renewed hold whose thread stalls past its deadline (the keeper's
/// timer cannot run) is lost as stalled, not as a hold without renewal;
/// `run_until_lost` then does not start its future.
#[test]
fn a_stall_past_the_deadline_is_reported_and_runs_nothing() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let s = Arc::new(Scripted::default());
        let c = LockClient::from_dyn(s.clone());
        let g = c
            .lock("stalled")
            .ttl(Duration::from_millis(300))
            .acquire()
            .await
            .unwrap();
        std::thread::sleep(Duration::from_millis(350));
        let ran = AtomicBool::new(false);
        let r = g
            .run_until_lost(async {
                ran.store(true, Ordering::SeqCst);
            })
            .await;
        assert!(
            !ran.load(Ordering::SeqCst),
            "the future ran past the deadline"
        );
        match r {
            Err(Error::LeaseLost { reason, .. }) => assert_eq!(reason, LostReason::Stalled),
            other => panic!("{other:?}"),
        }
    });
}

/// A waiting acquire outlasts failures that a later request may not meet
/// (the server unreachable for a while, a reply lost after the grant, the
/// waiter's own session ended) while its wait lasts, each request with an
/// owner of its own; at the deadline it ends with the last failure. A try
/// answers with the failure at once.
#[tokio::test(start_paused = true)]
async fn a_wait_outlasts_failures_while_it_lasts() {
    let (s, a, b) = setup();
    // A wait without a deadline, too.
    s.unreachable_acquires.store(6, Ordering::SeqCst);
    let g = a
        .lock("blip")
        .wait_forever()
        .acquire()
        .await
        .expect("the wait outlasts an unreachable server");
    assert!(g.is_held());
    g.release().await.unwrap();

    // Granted, and the reply lost: the next request (another owner) waits
    // for the first one's background release, and gets the lock.
    s.lost_acquire_replies.store(1, Ordering::SeqCst);
    let g = a
        .lock("lost-reply")
        .wait(Duration::from_secs(30))
        .acquire()
        .await
        .expect("the wait outlasts a lost reply");
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(g.is_held());
    assert!(
        b.lock("lost-reply").try_acquire().await.unwrap().is_none(),
        "the lock was freed under its holder"
    );
    g.release().await.unwrap();

    s.session_ended_acquires.store(2, Ordering::SeqCst);
    let g = a
        .lock("session")
        .wait(Duration::from_secs(30))
        .acquire()
        .await
        .expect("the wait outlasts its own session's end");
    g.release().await.unwrap();

    s.unreachable_acquires.store(usize::MAX, Ordering::SeqCst);
    let start = Instant::now();
    let r = a.lock("down").wait(Duration::from_secs(5)).acquire().await;
    assert!(matches!(r, Err(Error::Unavailable { .. })), "{r:?}");
    assert!(
        start.elapsed() <= Duration::from_secs(5),
        "{:?}",
        start.elapsed()
    );
    // The last request goes out at the deadline, not a pause before it.
    assert!(
        start.elapsed() >= Duration::from_secs(5),
        "gave up {:?} before the deadline",
        Duration::from_secs(5) - start.elapsed()
    );
    // A server back just before the deadline grants that last request.
    let back = {
        let s = s.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(4_999)).await;
            s.unreachable_acquires.store(0, Ordering::SeqCst);
        })
    };
    s.unreachable_acquires.store(usize::MAX, Ordering::SeqCst);
    let g = a
        .lock("back-at-the-end")
        .wait(Duration::from_secs(5))
        .acquire()
        .await
        .expect("the last request at the deadline is granted");
    g.release().await.unwrap();
    back.await.unwrap();
    // A last try that never answers ends the wait within the grace after
    // its deadline, as the wait's other requests do.
    let hang = {
        let s = s.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(4_999)).await;
            s.hang_acquire_replies.store(true, Ordering::SeqCst);
            s.unreachable_acquires.store(0, Ordering::SeqCst);
        })
    };
    s.unreachable_acquires.store(usize::MAX, Ordering::SeqCst);
    let start = Instant::now();
    let r = tokio::time::timeout(
        Duration::from_secs(60),
        a.lock("hung-at-the-end")
            .wait(Duration::from_secs(5))
            .acquire(),
    )
    .await
    .expect("the wait's last try outlived its deadline by a minute");
    hang.await.unwrap();
    s.hang_acquire_replies.store(false, Ordering::SeqCst);
    assert!(matches!(r, Err(Error::WaitTimeout { .. })), "{r:?}");
    assert!(
        start.elapsed() <= Duration::from_secs(5) + distlock_core::ANSWER_GRACE,
        "the wait ended after {:?}",
        start.elapsed()
    );
    s.unreachable_acquires.store(usize::MAX, Ordering::SeqCst);
    let r = a.lock("down").try_acquire().await;
    assert!(matches!(r, Err(Error::Unavailable { .. })), "{r:?}");
    s.unreachable_acquires.store(0, Ordering::SeqCst);

    // A wait whose every session ends ran out: nothing was held, so
    // nothing was lost.
    s.session_ended_acquires.store(usize::MAX, Ordering::SeqCst);
    let r = a.lock("ended").wait(Duration::from_secs(3)).acquire().await;
    assert!(matches!(r, Err(Error::WaitTimeout { .. })), "{r:?}");
    s.session_ended_acquires.store(0, Ordering::SeqCst);
}

/// A long outage does not pile up background releases: the owners of a
/// wait's failed requests are released one after another, so the server
/// is asked about as often as one release retries, not once per failed
/// attempt.
#[tokio::test(start_paused = true)]
async fn a_waits_failed_requests_are_released_in_turn() {
    let (s, a, _) = setup();
    s.unreachable_acquires.store(usize::MAX, Ordering::SeqCst);
    s.fail_releases.store(usize::MAX, Ordering::SeqCst);
    let r = a
        .lock("outage")
        .ttl(Duration::from_secs(30))
        .wait(Duration::from_secs(60))
        .acquire()
        .await;
    assert!(matches!(r, Err(Error::Unavailable { .. })), "{r:?}");
    // About 30 requests failed, each leaving an owner to release until
    // its lease could have lapsed (30 s after it failed); released one
    // at a time, retried at most about once a second, that is about 120
    // calls until the last one lapses (one task per failed request calls
    // about 30 times as often).
    tokio::time::sleep(Duration::from_secs(60)).await;
    let asked = s.releases.load(Ordering::SeqCst);
    assert!(
        asked <= 250,
        "{asked} release calls during a 60 s outage and 60 s after it"
    );
    assert!(
        asked >= 30,
        "only {asked} release calls for the failed requests"
    );
}

/// A release of an earlier failed request that never answers does not
/// hold up the release of a later one: the wait's own lost-reply grant is
/// freed at once, and the wait gets the lock long before that grant's TTL.
#[tokio::test(start_paused = true)]
async fn a_hung_cleanup_release_does_not_hold_up_the_next() {
    let (s, a, _) = setup();
    s.unreachable_acquires.store(1, Ordering::SeqCst);
    s.hang_releases.store(1, Ordering::SeqCst);
    s.lost_acquire_replies.store(1, Ordering::SeqCst);
    let start = Instant::now();
    let g = a
        .lock("hung-cleanup")
        .ttl(Duration::from_secs(30))
        .wait(Duration::from_secs(60))
        .acquire()
        .await
        .expect("the wait outlasts both failures");
    assert!(
        start.elapsed() < Duration::from_secs(10),
        "the wait took {:?}: its own lost-reply grant was freed only by its TTL",
        start.elapsed()
    );
    g.release().await.unwrap();
}

/// A multi-lock taken one name at a time (this backend offers no
/// all-at-once try) waits out an outage shorter than its wait, as a single
/// lock's wait does.
#[tokio::test(start_paused = true)]
async fn a_multi_lock_taken_one_name_at_a_time_outlasts_an_outage() {
    let (s, a, _) = setup();
    s.unreachable_acquires.store(4, Ordering::SeqCst);
    let m = a
        .lock_all(["outage/a", "outage/b"])
        .wait(Duration::from_secs(30))
        .acquire()
        .await
        .expect("a multi-lock's wait outlasts an unreachable server");
    m.release().await.unwrap();
}
