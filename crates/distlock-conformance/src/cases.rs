//! The conformance cases. Each is a claim about the user-facing API that
//! must hold on every backend (or is reported ignored, with the capability it
//! needs, where a backend does not declare it).

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use distlock_core::{
    async_trait, Backend, Capabilities, DynBackend, Error, Fencing, FencingToken, Grant, InputKind,
    LockClient, LockName, LockRequest, LostReason, Result as LockResult,
};
use libtest_mimic::{Completion, Failed};
use tokio::time::Instant;

use crate::{ensure, BackendFactory, CaseResult};

cases![
    mutual_exclusion_under_contention,
    try_acquire_on_held_lock_returns_none,
    wait_with_timeout_returns_timeout_error,
    waiter_gets_lock_after_holder_releases,
    stale_or_foreign_release_does_not_free_holder,
    vanished_holder_is_replaced_within_ttl_plus_one_second,
    release_after_the_lease_lapsed_reports_not_held,
    extend_keeps_lock_past_original_ttl,
    auto_renewal_keeps_lock_for_several_ttls,
    batched_renewal_answers_for_each_hold,
    lost_fires_when_renewal_is_rejected,
    lost_fires_at_deadline_without_renewal,
    run_until_lost_cancels_work,
    tokens_increase_across_holders,
    cancelled_wait_leaves_no_trace,
    waiter_ahead_giving_up_hands_nothing_on,
    reentrant_nested_acquire_nests,
    local_waiters_coalesce_to_one_backend_request,
    invalid_names_and_ttls_give_typed_errors,
    inspect_reports_the_holder,
    a_name_and_the_longer_names_below_it_are_independent,
    a_guard_dropped_outside_a_runtime_is_released,
    a_wait_dropped_outside_a_runtime_leaves_no_trace,
];

pub(crate) async fn client(f: &dyn BackendFactory) -> Result<LockClient, Failed> {
    Ok(LockClient::from_dyn(f.client().await?))
}

pub(crate) fn name(ns: &str, case: &str) -> Result<LockName, Failed> {
    Ok(LockName::new(format!("{ns}/{case}"))?)
}

/// Whether `c` is refused `lock` at once: someone else holds it.
pub(crate) async fn refused(c: &LockClient, lock: &LockName) -> Result<bool, Failed> {
    Ok(c.lock(lock).ttl(LONG_TTL).try_acquire().await?.is_none())
}

/// `c`'s guard of `lock` with the long TTL, waiting at most `wait` for it.
pub(crate) async fn acquire_within(
    c: &LockClient,
    lock: &LockName,
    wait: Duration,
) -> Result<distlock_core::LockGuard, Failed> {
    Ok(c.lock(lock).ttl(LONG_TTL).wait(wait).acquire().await?)
}

/// Checks that `c` is granted `lock` within [`BOUND`], and releases it.
async fn takes_in_turn(c: &LockClient, lock: &LockName) -> Result<(), Failed> {
    acquire_within(c, lock, BOUND).await?.release().await?;
    Ok(())
}

/// The verdict of a case that needs [`BackendFactory::evict`] where it is
/// not allowed.
fn no_evict() -> Completion {
    Completion::ignored_with(
        "needs an operator's removal of a lock (evict), which is not done to a shared deployment",
    )
}

/// The TTL of holds that must outlive their case. It is the TTL the
/// deployment checks try (a ZooKeeper server refuses a session longer than
/// its `maxSessionTimeout`, 40 s with the stock `tickTime`), so a server
/// that would refuse it is reported before the cases, not as their
/// failures.
pub(crate) const LONG_TTL: Duration = Duration::from_secs(30);
pub(crate) const BOUND: Duration = Duration::from_secs(20);

/// Many clients increment a shared counter inside the critical section with
/// a deliberate gap between read and write; any overlap loses an update or
/// trips the in-section flag.
pub async fn mutual_exclusion_under_contention(f: &dyn BackendFactory, ns: String) -> CaseResult {
    const CLIENTS: usize = 5;
    const ROUNDS: u64 = 8;
    let lock = name(&ns, "mutex")?;
    let inside = Arc::new(AtomicBool::new(false));
    let counter = Arc::new(AtomicU64::new(0));
    let overlaps = Arc::new(AtomicUsize::new(0));
    let tokens = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for _ in 0..CLIENTS {
        let c = client(f).await?;
        let (lock, inside, counter, overlaps, tokens) = (
            lock.clone(),
            inside.clone(),
            counter.clone(),
            overlaps.clone(),
            tokens.clone(),
        );
        tasks.push(tokio::spawn(async move {
            for _ in 0..ROUNDS {
                let g = c
                    .lock(&lock)
                    .ttl(LONG_TTL)
                    .wait(BOUND * 3)
                    .acquire()
                    .await?;
                if inside.swap(true, Ordering::SeqCst) {
                    overlaps.fetch_add(1, Ordering::SeqCst);
                }
                tokens
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push(g.token());
                let v = counter.load(Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(2)).await;
                counter.store(v + 1, Ordering::SeqCst);
                inside.store(false, Ordering::SeqCst);
                g.release().await?;
            }
            Ok::<_, Error>(())
        }));
    }
    for t in tasks {
        t.await
            .map_err(|e| Failed::from(format!("worker panicked: {e}")))??;
    }
    let total = counter.load(Ordering::SeqCst);
    ensure!(
        overlaps.load(Ordering::SeqCst) == 0,
        "{} overlapping holds",
        overlaps.load(Ordering::SeqCst)
    );
    ensure!(
        total == CLIENTS as u64 * ROUNDS,
        "counter {total}, expected {}: lost updates",
        CLIENTS as u64 * ROUNDS
    );
    if f.client().await?.capabilities().fencing != Fencing::None {
        let mut t = tokens.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let n = t.len();
        t.sort();
        t.dedup();
        ensure!(t.len() == n, "fencing tokens repeated among {n} grants");
    }
    Ok(Completion::Completed)
}

/// Contention is `Ok(None)`, both from another client and from another task
/// of the holding client.
pub async fn try_acquire_on_held_lock_returns_none(
    f: &dyn BackendFactory,
    ns: String,
) -> CaseResult {
    let lock = name(&ns, "try")?;
    let (a, b) = (client(f).await?, client(f).await?);
    let g = a.lock(&lock).ttl(LONG_TTL).try_acquire().await?;
    ensure!(
        g.is_some(),
        "first try_acquire on a free lock returned None"
    );
    ensure!(refused(&b, &lock).await?, "another client got a held lock");
    ensure!(
        refused(&a, &lock).await?,
        "another task of the holder got a held lock"
    );
    if let Some(g) = g {
        ensure!(
            g.release().await?,
            "release of a held lock reported it was not held"
        );
    }
    ensure!(!refused(&b, &lock).await?, "lock not free after release");
    Ok(Completion::Completed)
}

/// The case's lock held with the long TTL by one fresh client (the guard),
/// and `N` other fresh clients.
async fn held_and_rivals<const N: usize>(
    f: &dyn BackendFactory,
    ns: &str,
    case: &str,
) -> Result<(LockName, distlock_core::LockGuard, [LockClient; N]), Failed> {
    let lock = name(ns, case)?;
    let holder = client(f).await?;
    let g = holder.lock(&lock).ttl(LONG_TTL).acquire().await?;
    let mut rivals = Vec::with_capacity(N);
    for _ in 0..N {
        rivals.push(client(f).await?);
    }
    let rivals = rivals
        .try_into()
        .map_err(|_| Failed::from("made the wrong number of rivals"))?;
    Ok((lock, g, rivals))
}

/// A guard dropped where no runtime runs (a synchronous caller's thread,
/// after `block_on` returned) releases its lock on the runtime it was
/// acquired on: another client is granted it long before its TTL ends.
pub async fn a_guard_dropped_outside_a_runtime_is_released(
    f: &dyn BackendFactory,
    ns: String,
) -> CaseResult {
    let (lock, g, [b]) = held_and_rivals(f, &ns, "dropped-outside").await?;
    std::thread::spawn(move || drop(g))
        .join()
        .map_err(|_| Failed::from("dropping the guard on a plain thread panicked"))?;
    let next = b
        .lock(&lock)
        .ttl(LONG_TTL)
        .wait(BOUND)
        .acquire()
        .await
        .map_err(|e| {
            format!(
            "the lock was not free {BOUND:?} after its guard was dropped outside a runtime: {e}"
        )
        })?;
    ensure!(
        next.release().await?,
        "the next holder's grant was not its own"
    );
    Ok(Completion::Completed)
}

/// A waiting acquire polled on the runtime and then dropped where no
/// runtime runs (a synchronous caller that gave up on it after `block_on`
/// returned) cleans up on the runtime it ran on: dropping it does not
/// panic, and it leaves nothing that keeps the lock from the others.
pub async fn a_wait_dropped_outside_a_runtime_leaves_no_trace(
    f: &dyn BackendFactory,
    ns: String,
) -> CaseResult {
    let (lock, g, [b, c]) = held_and_rivals(f, &ns, "wait-dropped-outside").await?;
    let mut wait = Box::pin(b.lock(&lock).ttl(LONG_TTL).acquire());
    let waited = tokio::time::timeout(Duration::from_millis(400), &mut wait).await;
    ensure!(waited.is_err(), "waiter got a held lock");
    std::thread::spawn(move || drop(wait))
        .join()
        .map_err(|_| Failed::from("dropping a waiting acquire on a plain thread panicked"))?;
    g.release().await?;
    takes_in_turn(&c, &lock).await?;
    takes_in_turn(&b, &lock).await?;
    Ok(Completion::Completed)
}

/// A bounded wait on a held lock ends with `WaitTimeout`, no sooner than
/// asked and not much later.
pub async fn wait_with_timeout_returns_timeout_error(
    f: &dyn BackendFactory,
    ns: String,
) -> CaseResult {
    let (lock, _g, [b]) = held_and_rivals(f, &ns, "timeout").await?;
    let wait = Duration::from_millis(700);
    let start = Instant::now();
    let r = b.lock(&lock).ttl(LONG_TTL).wait(wait).acquire().await;
    let took = start.elapsed();
    ensure!(
        matches!(r, Err(Error::WaitTimeout { .. })),
        "expected WaitTimeout, got {r:?}"
    );
    ensure!(
        took >= wait,
        "gave up after {took:?}, before the {wait:?} wait"
    );
    ensure!(took < wait + BOUND, "gave up only after {took:?}");
    Ok(Completion::Completed)
}

/// An unbounded waiter gets the lock once the holder releases, not before.
pub async fn waiter_gets_lock_after_holder_releases(
    f: &dyn BackendFactory,
    ns: String,
) -> CaseResult {
    let (lock, g, [b]) = held_and_rivals(f, &ns, "handoff").await?;
    let first = g.token();
    let lk = lock.clone();
    let mut waiter = tokio::spawn(async move {
        b.lock(&lk)
            .ttl(LONG_TTL)
            .acquire()
            .await
            .map(|g| (g.token(), g))
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    ensure!(
        !waiter.is_finished(),
        "waiter got the lock while it was held"
    );
    g.release().await?;
    let (second, g2) = tokio::time::timeout(BOUND, &mut waiter)
        .await
        .map_err(|_| Failed::from("waiter still waiting after the release"))?
        .map_err(|e| Failed::from(e.to_string()))??;
    // A backend without fencing may hand every grant the same token.
    if f.client().await?.capabilities().fencing != Fencing::None {
        ensure!(second != first, "waiter got the holder's token {first}");
    }
    ensure!(g2.release().await?, "the waiter's grant was not its own");
    Ok(Completion::Completed)
}

/// A release carrying a stale owner (a holder whose lease expired) or a
/// foreign owner never frees the current holder.
pub async fn stale_or_foreign_release_does_not_free_holder(
    f: &dyn BackendFactory,
    ns: String,
) -> CaseResult {
    let lock = name(&ns, "stale")?;
    let raw = f.client().await?;
    let ttl = f.short_ttl();
    let stale = LockRequest::new(lock.clone(), ttl);
    ensure!(
        raw.try_acquire(&stale).await?.is_some(),
        "raw try_acquire on a free lock failed"
    );
    if raw.capabilities().session {
        // A session backend keeps the lock while its client lives; make the
        // old holder's lock vanish behind its back instead of waiting.
        if !f.can_evict() {
            return Ok(no_evict());
        }
        f.evict(&lock).await?;
    }
    let b = client(f).await?;
    let g = acquire_within(&b, &lock, ttl + BOUND).await?;
    ensure!(
        !raw.release(&stale).await?,
        "stale release claimed to free the new holder's lock"
    );
    let foreign = LockRequest::new(lock.clone(), ttl);
    ensure!(
        !raw.release(&foreign).await?,
        "foreign release claimed success"
    );
    ensure!(
        !raw.extend(&stale.with_ttl(LONG_TTL)).await?,
        "stale extend claimed success"
    );
    let c = client(f).await?;
    ensure!(
        refused(&c, &lock).await?,
        "holder lost the lock to a stale release"
    );
    ensure!(g.is_held(), "holder's guard no longer held");
    ensure!(g.release().await?, "holder's own release failed");
    Ok(Completion::Completed)
}

/// A holder that vanishes without releasing or renewing (a crashed
/// process) is replaced after its TTL: not at once, and no later than a
/// second past it. The second is for the server's expiry sweep and the
/// waiter's wake-up; a lock that lives on for a session or lease longer
/// than the TTL asked for fails here.
pub async fn vanished_holder_is_replaced_within_ttl_plus_one_second(
    f: &dyn BackendFactory,
    ns: String,
) -> CaseResult {
    let req = LockRequest::new(name(&ns, "vanish")?, f.short_ttl());
    // Connected first: a slow connect (TLS, password hashing) must not
    // count towards the TTL that the wait measures.
    let b = client(f).await?;
    let (raw, grant) = raw_hold(f, &req).await?;
    let caps = raw.capabilities();
    drop(raw);
    replaced_after_ttl(req.ttl, &caps, grant.began, || b.lock(&req.name)).await
}

/// How long after a vanished hold was taken its replacement may come: a
/// second past the TTL, and the lag the backend declares for its expiry.
pub(crate) fn latest_replacement(caps: &distlock_core::Capabilities, ttl: Duration) -> Duration {
    ttl + caps.expiry_lag(ttl) + Duration::from_secs(1)
}

/// The declared expiry lag, for a failure's message.
pub(crate) fn lag_note(caps: &distlock_core::Capabilities, ttl: Duration) -> String {
    match caps.expiry_lag(ttl) {
        lag if lag.is_zero() => String::new(),
        lag => format!(" and the {lag:?} the backend may end it late"),
    }
}

/// A raw client of `f` (no guard, no renewal) that holds `req`, and its
/// grant.
pub(crate) async fn raw_hold(
    f: &dyn BackendFactory,
    req: &LockRequest,
) -> Result<(DynBackend, Grant), Failed> {
    let raw = f.client().await?;
    let grant = raw.try_acquire(req).await?.ok_or("raw acquire failed")?;
    Ok((raw, grant))
}

/// What a vanished holder's replacement must see: `hold()` is refused at
/// once, then granted after the vanished hold's `ttl`, and no later than a
/// second past it (and the backend's declared expiry lag). Not before the
/// holder's own deadline either: the TTL less the backend's drift margin
/// after the vanished hold's request `began`, an instant no later than its
/// grant, so a stall of the test cannot pass for an early end.
pub(crate) async fn replaced_after_ttl(
    ttl: Duration,
    caps: &distlock_core::Capabilities,
    began: Instant,
    hold: impl Fn() -> distlock_core::LockBuilder,
) -> CaseResult {
    let (safe, late) = (caps.safe_validity(ttl), latest_replacement(caps, ttl));
    let start = Instant::now();
    ensure!(
        hold().ttl(LONG_TTL).try_acquire().await?.is_none(),
        "free right after the vanished holder took it"
    );
    // Asked again shortly before the holder's deadline: a waiter's wake-up
    // can come late, a try's answer cannot. A grant that arrives after
    // the deadline (the test stalled) proves nothing and is given back.
    tokio::time::sleep_until(began + safe.mul_f64(0.8)).await;
    if let Some(g) = hold().ttl(LONG_TTL).try_acquire().await? {
        let at = began.elapsed();
        g.release().await?;
        ensure!(
            at >= safe,
            "freed {at:?} after the vanished hold was asked for, before its holder's deadline ({safe:?} of its {ttl:?} TTL)"
        );
    }
    let g = hold().ttl(LONG_TTL).wait(ttl + BOUND).acquire().await?;
    let took = start.elapsed();
    let lived = began.elapsed();
    ensure!(
        lived >= safe,
        "freed {lived:?} after the vanished hold was asked for, before its holder's deadline ({safe:?} of its {ttl:?} TTL)"
    );
    ensure!(
        took <= late,
        "the vanished holder was replaced only after {took:?}, more than a second past its {ttl:?} TTL{}",
        lag_note(caps, ttl)
    );
    g.release().await?;
    Ok(Completion::Completed)
}

/// A release after the holder's lease ran out, with nobody holding the lock
/// since, answers "not held" (the holder learns its lease had lapsed), and
/// leaves the lock free.
pub async fn release_after_the_lease_lapsed_reports_not_held(
    f: &dyn BackendFactory,
    ns: String,
) -> CaseResult {
    let raw = f.client().await?;
    if raw.capabilities().session {
        return Ok(Completion::ignored_with(
            "a session backend's lock lasts as long as its session, not a TTL",
        ));
    }
    let lock = name(&ns, "lapsed")?;
    let ttl = f.short_ttl();
    let req = LockRequest::new(lock.clone(), ttl);
    ensure!(raw.try_acquire(&req).await?.is_some(), "raw acquire failed");
    // Well past the TTL, so that no server clock can still count it live.
    tokio::time::sleep(ttl * 2 + Duration::from_millis(500)).await;
    ensure!(
        !raw.release(&req).await?,
        "a release after the lease lapsed reported the lock still held"
    );
    let b = client(f).await?;
    let g = b.lock(&lock).ttl(LONG_TTL).try_acquire().await?;
    ensure!(
        g.is_some(),
        "the lock was not free after its lease lapsed and was released"
    );
    Ok(Completion::Completed)
}

/// A manual `extend` keeps a non-renewed lock past its original TTL.
pub async fn extend_keeps_lock_past_original_ttl(f: &dyn BackendFactory, ns: String) -> CaseResult {
    with_extend(f, &ns, "extend", |lock, ttl| async move {
        let (a, b) = (client(f).await?, client(f).await?);
        let g = a.lock(&lock).ttl(ttl).no_renew().acquire().await?;
        g.extend(ttl * 6).await?;
        tokio::time::sleep(ttl * 2).await;
        ensure!(g.is_held(), "guard not held after extend");
        ensure!(
            refused(&b, &lock).await?,
            "lock expired at its original TTL despite extend"
        );
        ensure!(g.release().await?, "release after extend reported not held");
        Ok(Completion::Completed)
    })
    .await
}

/// The watchdog keeps a lock for several TTLs.
pub async fn auto_renewal_keeps_lock_for_several_ttls(
    f: &dyn BackendFactory,
    ns: String,
) -> CaseResult {
    with_extend(f, &ns, "renew", |lock, _| async move {
        let ttl = f.renewed_ttl();
        let (a, b) = (client(f).await?, client(f).await?);
        let g = a.lock(&lock).ttl(ttl).acquire().await?;
        tokio::time::sleep(ttl * 7 / 2).await;
        ensure!(g.is_held(), "guard lost the lock despite renewal");
        let other_refused = refused(&b, &lock).await?;
        // A stall between the two checks may end the lease: then the
        // guard says so, and the other client's grant is no double one.
        ensure!(
            other_refused || !g.is_held(),
            "another client got a renewed lock while its guard still held it"
        );
        ensure!(other_refused, "guard lost the lock despite renewal");
        ensure!(
            g.release().await?,
            "release reported the renewed lock as not held"
        );
        Ok(Completion::Completed)
    })
    .await
}

/// A batched renewal (`extend_many`) answers for each hold as `extend`
/// would: held ones are extended, a released one and a name held by another
/// owner are not (and the other owner keeps it). Then many guards renewed
/// through core's batches all stay held.
pub async fn batched_renewal_answers_for_each_hold(
    f: &dyn BackendFactory,
    ns: String,
) -> CaseResult {
    let backend = f.client().await?;
    let caps = backend.capabilities();
    if caps.extend_batch <= 1 {
        return Ok(Completion::ignored_with(format!(
            "{} renews one lock per request",
            caps.backend
        )));
    }
    let other = f.client().await?;
    let ttl = f.short_ttl();
    let names = (0..4)
        .map(|i| name(&ns, &format!("batch{i}")))
        .collect::<Result<Vec<_>, _>>()?;
    let mine: Vec<LockRequest> = names
        .iter()
        .map(|n| LockRequest::new(n.clone(), ttl))
        .collect();
    for r in &mine[..3] {
        ensure!(
            backend.try_acquire(r).await?.is_some(),
            "a free lock was not granted"
        );
    }
    ensure!(
        backend.release(&mine[1]).await?,
        "release reported not held"
    );
    let theirs = LockRequest::new(names[3].clone(), LONG_TTL);
    ensure!(
        other.try_acquire(&theirs).await?.is_some(),
        "a free lock was not granted to the other client"
    );
    let batch: Vec<LockRequest> = mine.iter().map(|r| r.with_ttl(ttl * 6)).collect();
    let answers = backend.extend_many(&batch).await?;
    ensure!(
        answers == [true, false, true, false],
        "extend_many over held, released, held, someone else's answered {answers:?}"
    );
    tokio::time::sleep(ttl * 2).await;
    for i in [0, 2] {
        let probe = LockRequest::new(names[i].clone(), LONG_TTL);
        ensure!(
            other.try_acquire(&probe).await?.is_none(),
            "lock {i} expired at its original TTL despite the batched renewal"
        );
    }
    let probe = LockRequest::new(names[3].clone(), ttl);
    ensure!(
        backend.try_acquire(&probe).await?.is_none(),
        "the other owner's lock was freed by someone's batched renewal"
    );
    ensure!(
        other.release(&theirs).await?,
        "the other owner lost its lock to a batched renewal"
    );
    backend.release(&mine[0]).await?;
    backend.release(&mine[2]).await?;

    let client = LockClient::from_dyn(backend);
    let ttl = f.renewed_ttl();
    let mut guards = Vec::new();
    for i in 0..40 {
        let lock = name(&ns, &format!("renewed{i}"))?;
        guards.push(client.lock(&lock).ttl(ttl).acquire().await?);
    }
    tokio::time::sleep(ttl * 7 / 2).await;
    let lost = guards.iter().filter(|g| !g.is_held()).count();
    ensure!(lost == 0, "{lost} of 40 batch-renewed guards were lost");
    for g in guards {
        ensure!(
            g.release().await?,
            "a batch-renewed lock was no longer held"
        );
    }
    Ok(Completion::Completed)
}

/// When the lock is taken away behind the holder's back, the next renewal
/// fails and `lost()` fires.
pub async fn lost_fires_when_renewal_is_rejected(f: &dyn BackendFactory, ns: String) -> CaseResult {
    if !f.can_evict() {
        return Ok(no_evict());
    }
    with_extend(f, &ns, "lost", |lock, ttl| async move {
        let a = client(f).await?;
        let g = a.lock(&lock).ttl(ttl).acquire().await?;
        ensure!(g.is_held(), "fresh guard not held");
        f.evict(&lock).await?;
        let reason = tokio::time::timeout(ttl * 2 + BOUND, g.lost())
            .await
            .map_err(|_| Failed::from("lost() did not fire after the lock was evicted"))?;
        ensure!(
            matches!(
                reason,
                LostReason::RenewalRejected | LostReason::SessionLost(_)
            ),
            "unexpected loss reason: {reason}"
        );
        ensure!(!g.is_held(), "guard still claims to hold after lost()");
        let out = g.run_until_lost(async {}).await;
        ensure!(
            matches!(out, Err(Error::LeaseLost { .. })),
            "run_until_lost after loss gave {out:?}"
        );
        Ok(Completion::Completed)
    })
    .await
}

/// Without renewal, `lost()` fires at the local deadline, which is never
/// later than the TTL counted from before the request.
pub async fn lost_fires_at_deadline_without_renewal(
    f: &dyn BackendFactory,
    ns: String,
) -> CaseResult {
    let lock = name(&ns, "deadline")?;
    let ttl = f.short_ttl();
    let a = client(f).await?;
    // A first hold of this TTL opens what the backend keeps per TTL (etcd's
    // lease, ZooKeeper's session), so that below `try_acquire` sends one
    // request right after `before`. (A waiting acquire may first subscribe
    // to release messages; its deadline counts from the attempt that was
    // granted, which comes later.)
    let warm = name(&ns, "deadline-warm-up")?;
    a.lock(&warm)
        .ttl(ttl)
        .no_renew()
        .acquire()
        .await?
        .release()
        .await?;
    let before = Instant::now();
    let g = a
        .lock(&lock)
        .ttl(ttl)
        .no_renew()
        .try_acquire()
        .await?
        .ok_or("a free lock was not granted")?;
    let deadline = g.deadline().ok_or("fresh guard has no deadline")?;
    ensure!(
        deadline <= before + ttl,
        "the deadline is {:?} after the request began, later than its TTL {ttl:?}",
        deadline - before
    );
    let reason = tokio::time::timeout(ttl + BOUND, g.lost())
        .await
        .map_err(|_| Failed::from("lost() did not fire at the deadline"))?;
    ensure!(
        reason == LostReason::DeadlinePassed,
        "unexpected loss reason: {reason}"
    );
    ensure!(
        Instant::now() >= deadline,
        "lost() fired before the deadline"
    );
    Ok(Completion::Completed)
}

/// `run_until_lost` drops the work when the lease is lost.
pub async fn run_until_lost_cancels_work(f: &dyn BackendFactory, ns: String) -> CaseResult {
    let lock = name(&ns, "run")?;
    let ttl = f.short_ttl();
    let a = client(f).await?;
    let g = a.lock(&lock).ttl(ttl).no_renew().acquire().await?;
    let finished = AtomicBool::new(false);
    let out = g
        .run_until_lost(async {
            tokio::time::sleep(ttl + BOUND).await;
            finished.store(true, Ordering::SeqCst);
        })
        .await;
    ensure!(
        matches!(out, Err(Error::LeaseLost { .. })),
        "expected LeaseLost, got {out:?}"
    );
    ensure!(
        !finished.load(Ordering::SeqCst),
        "work ran to completion past the lease"
    );
    let ok = a
        .lock(&lock)
        .ttl(LONG_TTL)
        .wait(BOUND)
        .run(async { 7 })
        .await?;
    ensure!(ok == 7, "run() returned {ok}");
    Ok(Completion::Completed)
}

/// Tokens strictly increase across successive holders: after a release,
/// after an expiry, and between clients (on every backend that declares
/// fencing at all).
pub async fn tokens_increase_across_holders(f: &dyn BackendFactory, ns: String) -> CaseResult {
    // Best-effort fencing must also increase while the backend's assumptions
    // hold (as they do here); what it gives up under faults is the fault
    // suite's business.
    let caps = f.client().await?.capabilities();
    if caps.fencing == Fencing::None {
        return Ok(Completion::ignored_with(format!(
            "{} declares no fencing",
            caps.backend
        )));
    }
    let lock = name(&ns, "tokens")?;
    let ttl = f.short_ttl();
    let (a, b) = (client(f).await?, client(f).await?);
    let mut seen: Vec<FencingToken> = Vec::new();
    for i in 0..6 {
        let c = if i % 2 == 0 { &a } else { &b };
        let g = acquire_within(c, &lock, BOUND).await?;
        seen.push(g.token());
        g.release().await?;
    }
    // An expiry in between, not a release.
    let (raw, grant) = raw_hold(f, &LockRequest::new(lock.clone(), ttl)).await?;
    seen.push(grant.token);
    // The holder vanishes (on session backends its session ends with it).
    drop(raw);
    let g = acquire_within(&b, &lock, ttl + BOUND).await?;
    seen.push(g.token());
    g.release().await?;
    ensure!(
        seen.windows(2).all(|w| w[0] < w[1]),
        "tokens not strictly increasing: {seen:?}"
    );
    Ok(Completion::Completed)
}

/// Dropping a waiting acquire leaves nothing held or queued: once the
/// holder releases, a third client gets the lock at once (not after a TTL),
/// and the cancelled client itself can acquire again.
pub async fn cancelled_wait_leaves_no_trace(f: &dyn BackendFactory, ns: String) -> CaseResult {
    let (lock, g, [b, c]) = held_and_rivals(f, &ns, "cancel").await?;
    let waited = tokio::time::timeout(
        Duration::from_millis(400),
        b.lock(&lock).ttl(LONG_TTL).acquire(),
    )
    .await;
    ensure!(waited.is_err(), "waiter got a held lock");
    g.release().await?;
    takes_in_turn(&c, &lock).await?;
    takes_in_turn(&b, &lock).await?;
    Ok(Completion::Completed)
}

/// A waiter ahead that gives up (its wait times out) while the lock is
/// held does not hand the lock to the waiter behind it: queue backends
/// wake that waiter (its predecessor went away), and it must see that the
/// holder is still there.
pub async fn waiter_ahead_giving_up_hands_nothing_on(
    f: &dyn BackendFactory,
    ns: String,
) -> CaseResult {
    let (lock, g, [b, c]) = held_and_rivals(f, &ns, "giveup").await?;
    let ahead = b
        .lock(&lock)
        .ttl(LONG_TTL)
        .wait(Duration::from_millis(600))
        .acquire();
    let lk = lock.clone();
    let mut behind = tokio::spawn(async move {
        // Queued after `ahead` (which is already waiting).
        tokio::time::sleep(Duration::from_millis(200)).await;
        c.lock(&lk).ttl(LONG_TTL).wait(BOUND * 2).acquire().await
    });
    ensure!(
        matches!(ahead.await, Err(Error::WaitTimeout { .. })),
        "the waiter ahead did not time out while the lock was held"
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    ensure!(
        !behind.is_finished(),
        "the waiter behind got the lock while its holder still held it"
    );
    ensure!(g.is_held(), "the holder lost the lock");
    g.release().await?;
    let g2 = tokio::time::timeout(BOUND, &mut behind)
        .await
        .map_err(|_| Failed::from("the waiter behind still waits after the release"))?
        .map_err(|e| Failed::from(e.to_string()))??;
    g2.release().await?;
    Ok(Completion::Completed)
}

/// A second acquire by the same explicit holder nests instead of
/// deadlocking; the backend lock is released with the outermost guard.
pub async fn reentrant_nested_acquire_nests(f: &dyn BackendFactory, ns: String) -> CaseResult {
    let lock = name(&ns, "reentrant")?;
    let (a, b) = (client(f).await?, client(f).await?);
    let outer = a
        .lock(&lock)
        .ttl(LONG_TTL)
        .holder("worker-7")
        .acquire()
        .await?;
    let inner = tokio::time::timeout(
        BOUND,
        a.lock(&lock).ttl(LONG_TTL).holder("worker-7").acquire(),
    )
    .await
    .map_err(|_| Failed::from("nested acquire by the same holder deadlocked"))??;
    ensure!(
        inner.token() == outer.token(),
        "nested guard has another token"
    );
    ensure!(
        outer.hold_count() == 2,
        "hold count {} after nesting",
        outer.hold_count()
    );
    ensure!(
        a.lock(&lock)
            .ttl(LONG_TTL)
            .holder("someone-else")
            .try_acquire()
            .await?
            .is_none(),
        "another holder in the same client got a held lock"
    );
    ensure!(
        inner.release().await?,
        "inner release reported the lock as not held"
    );
    ensure!(refused(&b, &lock).await?, "lock freed by the inner release");
    ensure!(
        outer.release().await?,
        "outer release reported the lock as not held"
    );
    takes_in_turn(&b, &lock).await?;
    Ok(Completion::Completed)
}

/// Many tasks of one client waiting for one name send at most one acquire
/// to the backend at a time; the rest wait locally.
pub async fn local_waiters_coalesce_to_one_backend_request(
    f: &dyn BackendFactory,
    ns: String,
) -> CaseResult {
    let lock = name(&ns, "coalesce")?;
    let holder = client(f).await?;
    let held = vec![holder.lock(&lock).ttl(LONG_TTL).acquire().await?];
    let max = most_acquires_in_flight(f, 8, held, move |c| c.lock(&lock)).await?;
    ensure!(
        max == 1,
        "{max} acquires were in flight to the backend at once"
    );
    Ok(Completion::Completed)
}

/// Bad input is a typed `InvalidInput`, before anything is sent.
pub async fn invalid_names_and_ttls_give_typed_errors(
    f: &dyn BackendFactory,
    ns: String,
) -> CaseResult {
    let a = client(f).await?;
    for bad in ["", "has space", "/leading", "a//b", "{tag}"] {
        let r = a.lock(bad).try_acquire().await;
        ensure!(
            matches!(
                r,
                Err(Error::InvalidInput {
                    kind: InputKind::LockName,
                    ..
                })
            ),
            "name {bad:?} gave {r:?}"
        );
    }
    let lock = name(&ns, "input")?;
    let max = a.capabilities().max_ttl;
    for ttl in [Duration::ZERO, max + Duration::from_secs(1)] {
        let r = a.lock(&lock).ttl(ttl).try_acquire().await;
        ensure!(
            matches!(
                r,
                Err(Error::InvalidInput {
                    kind: InputKind::Duration,
                    ..
                })
            ),
            "ttl {ttl:?} gave {r:?}"
        );
    }
    let r = a.lock(&lock).max_hold(Duration::ZERO).try_acquire().await;
    ensure!(
        matches!(r, Err(Error::InvalidInput { .. })),
        "zero max hold gave {r:?}"
    );
    // A kind the backend does not declare is refused before it is sent.
    let caps = a.capabilities().clone();
    if !caps.shared {
        let r = a.lock(&lock).shared().try_acquire().await;
        ensure!(
            matches!(r, Err(Error::Unsupported { .. })),
            "a shared hold on a backend without them gave {r:?}"
        );
    }
    if !caps.semaphore {
        let r = a.semaphore(&lock, 2).try_acquire().await;
        ensure!(
            matches!(r, Err(Error::Unsupported { .. })),
            "a permit on a backend without semaphores gave {r:?}"
        );
    }
    ensure!(!refused(&a, &lock).await?, "valid input refused");
    Ok(Completion::Completed)
}

/// `inspect` (what `distlock status` shows) sees a free lock as free and a
/// held one as held, with the holder's token where it reports one.
pub async fn inspect_reports_the_holder(f: &dyn BackendFactory, ns: String) -> CaseResult {
    let lock = name(&ns, "inspect")?;
    let raw = f.client().await?;
    let free = match raw.inspect(&lock).await {
        Err(Error::Unsupported { .. }) => {
            return Ok(Completion::ignored_with("the backend cannot inspect locks"));
        }
        other => other?,
    };
    ensure!(!free.held, "a never-taken lock reported held: {free:?}");
    let a = client(f).await?;
    let g = a.lock(&lock).ttl(LONG_TTL).acquire().await?;
    let held = raw.inspect(&lock).await?;
    ensure!(held.held, "a held lock reported free");
    ensure!(
        held.token.is_none_or(|t| t == g.token()),
        "inspect reported token {:?}, the holder has {}",
        held.token,
        g.token()
    );
    ensure!(
        held.remaining.is_none_or(|r| r <= LONG_TTL),
        "remaining {:?} exceeds the TTL",
        held.remaining
    );
    g.release().await?;
    let after = raw.inspect(&lock).await?;
    ensure!(!after.held, "a released lock reported held: {after:?}");
    Ok(Completion::Completed)
}

/// Lock `<ns>/nest` and the longer names below it (`<ns>/nest/q`,
/// `<ns>/nest/q/r`) are different locks: holders of the longer names keep
/// nobody from `nest`, a wait on `nest` queued behind its holder and a
/// holder of a longer name is granted at the first's release, and
/// `nest`'s status reflects only its own holder.
pub async fn a_name_and_the_longer_names_below_it_are_independent(
    f: &dyn BackendFactory,
    ns: String,
) -> CaseResult {
    let (nest, below, deeper) = (
        name(&ns, "nest")?,
        name(&ns, "nest/q")?,
        name(&ns, "nest/q/r")?,
    );
    let (a, b, c) = (client(f).await?, client(f).await?, client(f).await?);
    let held_below = a
        .lock(&below)
        .ttl(LONG_TTL)
        .try_acquire()
        .await?
        .ok_or("a free lock was refused")?;
    match f.client().await?.inspect(&nest).await {
        Err(Error::Unsupported { .. }) => {}
        status => ensure!(
            !status?.held,
            "{nest} reported held while only {below} is held"
        ),
    }
    let holder = b
        .lock(&nest)
        .ttl(LONG_TTL)
        .try_acquire()
        .await?
        .ok_or_else(|| format!("{nest} was refused while only {below} was held"))?;
    let held_deeper = a
        .lock(&deeper)
        .ttl(LONG_TTL)
        .try_acquire()
        .await?
        .ok_or_else(|| format!("{deeper} was refused while {nest} and {below} were held"))?;
    let waiting = {
        let nest = nest.clone();
        tokio::spawn(async move { c.lock(&nest).ttl(LONG_TTL).wait(BOUND).acquire().await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    ensure!(holder.release().await?, "the holder of {nest} lost it");
    let granted = waiting
        .await
        .map_err(|e| format!("the waiter on {nest} panicked: {e}"))?
        .map_err(|e| format!("the wait on {nest} behind its holder, with {below} held: {e}"))?;
    ensure!(
        held_below.is_held() && held_deeper.is_held(),
        "holds of {below} and {deeper} ended when {nest} changed hands"
    );
    granted.release().await?;
    ensure!(
        held_below.release().await?,
        "{below} was not held at its release"
    );
    ensure!(
        held_deeper.release().await?,
        "{deeper} was not held at its release"
    );
    Ok(Completion::Completed)
}

/// Runs `body` (given the case's lock and the short TTL) where the backend
/// supports `extend`; elsewhere the case is ignored.
async fn with_extend<Fut>(
    f: &dyn BackendFactory,
    ns: &str,
    case: &str,
    body: impl FnOnce(LockName, Duration) -> Fut,
) -> CaseResult
where
    Fut: std::future::Future<Output = CaseResult>,
{
    let caps = f.client().await?.capabilities();
    if !caps.extend {
        let why = format!("{} does not support extend", caps.backend);
        return Ok(Completion::ignored_with(why));
    }
    body(name(ns, case)?, f.short_ttl()).await
}

/// `tasks` tasks of one fresh client wait for what `hold` builds while
/// another client keeps `held`; once they queue, `held` is released and every
/// task acquires and releases in turn. Returns the most acquire requests
/// that were in flight to the backend at once.
pub(crate) async fn most_acquires_in_flight(
    f: &dyn BackendFactory,
    tasks: usize,
    held: Vec<distlock_core::LockGuard>,
    hold: impl Fn(&LockClient) -> distlock_core::LockBuilder + Clone + Send + 'static,
) -> Result<usize, Failed> {
    let counting = Arc::new(InFlight {
        inner: f.client().await?,
        now: AtomicUsize::new(0),
        max: AtomicUsize::new(0),
    });
    let a = LockClient::from_dyn(counting.clone());
    let mut running = Vec::new();
    for _ in 0..tasks {
        let (a, hold) = (a.clone(), hold.clone());
        running.push(tokio::spawn(async move {
            let g = hold(&a).ttl(LONG_TTL).wait(BOUND * 2).acquire().await?;
            g.release().await
        }));
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    for g in held {
        g.release().await?;
    }
    for t in running {
        t.await.map_err(|e| Failed::from(e.to_string()))??;
    }
    Ok(counting.max.load(Ordering::SeqCst))
}

/// Counts acquire requests in flight to the wrapped backend.
#[derive(Debug)]
pub(crate) struct InFlight {
    pub(crate) inner: DynBackend,
    pub(crate) now: AtomicUsize,
    pub(crate) max: AtomicUsize,
}

impl InFlight {
    async fn count<T>(&self, fut: impl std::future::Future<Output = T>) -> T {
        let n = self.now.fetch_add(1, Ordering::SeqCst) + 1;
        self.max.fetch_max(n, Ordering::SeqCst);
        let out = fut.await;
        self.now.fetch_sub(1, Ordering::SeqCst);
        out
    }
}

#[async_trait]
impl Backend for InFlight {
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }
    async fn try_acquire(&self, req: &LockRequest) -> LockResult<Option<Grant>> {
        self.count(self.inner.try_acquire(req)).await
    }
    async fn acquire(&self, req: &LockRequest, deadline: Option<Instant>) -> LockResult<Grant> {
        self.count(self.inner.acquire(req, deadline)).await
    }
    async fn extend(&self, req: &LockRequest) -> LockResult<bool> {
        self.inner.extend(req).await
    }
    async fn release(&self, req: &LockRequest) -> LockResult<bool> {
        self.inner.release(req).await
    }
}
