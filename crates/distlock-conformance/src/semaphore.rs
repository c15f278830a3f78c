//! The conformance cases of semaphores ([`HoldKind::Permits`]), registered
//! for every backend and run where it declares
//! [`Capabilities::semaphore`](distlock_core::Capabilities::semaphore).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use distlock_core::{
    Error, Fencing, HoldKind, LockClient, LockGuard, LockName, LockRequest, LostReason, Owner,
};
use libtest_mimic::{Completion, Failed};
use tokio::time::Instant;

use crate::cases::{
    client, most_acquires_in_flight, name, raw_hold, replaced_after_ttl, BOUND, LONG_TTL,
};
use crate::{ensure, BackendFactory, CaseResult};

cases![
    semaphore_never_has_more_than_its_limit_and_fills_it,
    crashed_permit_holder_returns_its_permit_after_its_ttl,
    paused_permit_holder_is_lost_and_its_permit_goes_to_a_waiter,
    cancelled_permit_wait_leaves_no_permit_or_queue_entry,
    a_different_limit_is_a_typed_error_naming_both,
    permit_tokens_strictly_rise,
    release_of_an_expired_or_foreign_permit_frees_nothing,
    reentrant_permit_takes_no_second_permit,
    a_raised_limit_nests_the_holders_permit_and_opens_the_new_ones,
    local_waiters_put_at_most_limit_waiters_on_the_server,
    inspect_reports_permits_in_use_and_the_limit,
    inspect_and_list_count_no_contender_that_was_refused,
    a_lowered_limit_leaves_the_permits_held_in_inspect_and_list,
];

/// How many permits of `sem` another client can take right now (it takes
/// and releases them), up to `limit` + 1.
async fn free_permits(f: &dyn BackendFactory, sem: &str, limit: u32) -> Result<u32, Failed> {
    let c = client(f).await?;
    let mut taken = Vec::new();
    for _ in 0..=limit {
        match c.semaphore(sem, limit).ttl(LONG_TTL).try_acquire().await? {
            Some(g) => taken.push(g),
            None => break,
        }
    }
    let n = taken.len() as u32;
    for g in taken {
        g.release().await?;
    }
    Ok(n)
}

/// `c`'s permit of `sem` (of `limit`) with the long TTL, waiting at most
/// `wait` for it.
async fn permit_within(
    c: &LockClient,
    sem: &LockName,
    limit: u32,
    wait: Duration,
) -> Result<LockGuard, Failed> {
    Ok(c.semaphore(sem, limit)
        .ttl(LONG_TTL)
        .wait(wait)
        .acquire()
        .await?)
}

/// Clients contend for 3 permits, each holding a while: never more than
/// 3 inside at once, and 3 inside together at least once.
pub async fn semaphore_never_has_more_than_its_limit_and_fills_it(
    f: &dyn BackendFactory,
    ns: String,
) -> CaseResult {
    const LIMIT: u32 = 3;
    const CLIENTS: usize = 6;
    const ROUNDS: usize = 4;
    let sem = name(&ns, "limit")?;
    let inside = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    // Every client connects before any contends, so that a slow connect
    // (TLS, password hashing) does not let the first ones finish alone.
    let mut clients = Vec::new();
    for _ in 0..CLIENTS {
        clients.push(client(f).await?);
    }
    let mut tasks = Vec::new();
    for c in clients {
        let (sem, inside, most) = (sem.clone(), inside.clone(), most.clone());
        tasks.push(tokio::spawn(async move {
            for _ in 0..ROUNDS {
                let g = c
                    .semaphore(&sem, LIMIT)
                    .ttl(LONG_TTL)
                    .wait(BOUND * 3)
                    .acquire()
                    .await?;
                let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(now, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(60)).await;
                inside.fetch_sub(1, Ordering::SeqCst);
                g.release().await?;
            }
            Ok::<_, Error>(())
        }));
    }
    for t in tasks {
        t.await
            .map_err(|e| Failed::from(format!("worker panicked: {e}")))??;
    }
    let most = most.load(Ordering::SeqCst);
    ensure!(
        most <= LIMIT as usize,
        "{most} holders of a {LIMIT}-permit semaphore at once"
    );
    ensure!(
        most == LIMIT as usize,
        "never more than {most} of {LIMIT} permits held together by {CLIENTS} contending clients"
    );
    Ok(Completion::Completed)
}

/// Permit holders that vanish without releasing or renewing (a crashed
/// process) give their permits back after their TTL: not at once, and no
/// later than a second past it.
pub async fn crashed_permit_holder_returns_its_permit_after_its_ttl(
    f: &dyn BackendFactory,
    ns: String,
) -> CaseResult {
    let sem = name(&ns, "crash")?;
    let ttl = f.short_ttl();
    let raw = f.client().await?;
    // Connected first: a slow connect (TLS, password hashing) must not
    // count towards the TTL that the wait below measures.
    let b = client(f).await?;
    let mut began = None;
    for _ in 0..2 {
        let req = LockRequest::permit(sem.clone(), ttl, 2);
        let grant = raw
            .try_acquire(&req)
            .await?
            .ok_or("raw permit not granted")?;
        began.get_or_insert(grant.began);
    }
    let caps = raw.capabilities();
    drop(raw);
    // Both permits were the crashed holder's: a third is refused until
    // the first of them expires.
    let began = began.ok_or("no permit taken")?;
    replaced_after_ttl(ttl, &caps, began, || b.semaphore(&sem, 2)).await
}

/// A holder that stops renewing (paused) is reported lost at its deadline,
/// and a waiter gets its permit.
pub async fn paused_permit_holder_is_lost_and_its_permit_goes_to_a_waiter(
    f: &dyn BackendFactory,
    ns: String,
) -> CaseResult {
    let sem = name(&ns, "paused")?;
    let ttl = f.short_ttl();
    let (a, b) = (client(f).await?, client(f).await?);
    let paused = a.semaphore(&sem, 1).ttl(ttl).no_renew().acquire().await?;
    let paused_deadline = paused
        .deadline()
        .ok_or("a permit just granted has no deadline")?;
    // When the waiter's grant arrived: a grant is made after the server
    // judged the paused permit expired, so it never arrives before the
    // paused holder's own deadline.
    let waiter = async {
        let got = permit_within(&b, &sem, 1, ttl + BOUND).await;
        (got, Instant::now())
    };
    let reason = tokio::time::timeout(ttl * 2 + BOUND, paused.lost());
    let ((got, granted_at), reason) = tokio::join!(waiter, reason);
    let reason = reason.map_err(|_| Failed::from("the paused holder never saw lost()"))?;
    ensure!(
        matches!(reason, LostReason::DeadlinePassed),
        "the paused holder was lost for {reason}, not its deadline"
    );
    let g = got?;
    ensure!(
        granted_at >= paused_deadline,
        "the waiter was granted the only permit {:?} before the paused holder's deadline",
        paused_deadline - granted_at
    );
    ensure!(
        g.token() > paused.token() || f.client().await?.capabilities().fencing == Fencing::None,
        "the waiter's token {} is not above the paused holder's {}",
        g.token(),
        paused.token()
    );
    g.release().await?;
    Ok(Completion::Completed)
}

/// A wait for a permit that is cancelled (its future dropped) leaves
/// nothing: once the holder releases, the limit is free again in full.
pub async fn cancelled_permit_wait_leaves_no_permit_or_queue_entry(
    f: &dyn BackendFactory,
    ns: String,
) -> CaseResult {
    let sem = name(&ns, "cancel")?;
    let (a, b) = (client(f).await?, client(f).await?);
    let g = a.semaphore(&sem, 1).ttl(LONG_TTL).acquire().await?;
    let waited = tokio::time::timeout(
        Duration::from_millis(400),
        b.semaphore(&sem, 1).ttl(LONG_TTL).acquire(),
    )
    .await;
    ensure!(waited.is_err(), "the wait for a held permit finished");
    g.release().await?;
    // The cancelled waiter's cleanup runs in the background.
    let start = Instant::now();
    loop {
        let free = free_permits(f, sem.as_str(), 1).await?;
        if free == 1 {
            return Ok(Completion::Completed);
        }
        ensure!(
            start.elapsed() < BOUND,
            "{free} of 1 permits free {BOUND:?} after the holder released and the waiter gave up"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A client that asks for another limit than the stored one gets
/// `LimitMismatch` with both numbers; `set_limit` changes it on purpose.
pub async fn a_different_limit_is_a_typed_error_naming_both(
    f: &dyn BackendFactory,
    ns: String,
) -> CaseResult {
    let sem = name(&ns, "mismatch")?;
    let (a, b) = (client(f).await?, client(f).await?);
    let g = a.semaphore(&sem, 3).ttl(LONG_TTL).acquire().await?;
    match b.semaphore(&sem, 4).ttl(LONG_TTL).try_acquire().await {
        Err(Error::LimitMismatch {
            requested, stored, ..
        }) => {
            ensure!(
                (requested, stored) == (4, 3),
                "LimitMismatch named {requested} and {stored}, not 4 and 3"
            );
        }
        other => return Err(format!("a limit of 4 against 3 gave {other:?}").into()),
    }
    let e = b.semaphore(&sem, 4).ttl(LONG_TTL).try_acquire().await;
    let text = e
        .map(|_| ())
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    ensure!(
        text.contains('3') && text.contains('4'),
        "the message does not name both limits: {text:?}"
    );
    // Released first: Redlock refuses a raise that makes a permit need
    // more nodes while permits are held.
    g.release().await?;
    let old = b.set_semaphore_limit(sem.as_str(), 4).await?;
    ensure!(
        old == Some(3),
        "set_limit returned {old:?}, not the old limit 3"
    );
    let g2 = b
        .semaphore(&sem, 4)
        .ttl(LONG_TTL)
        .try_acquire()
        .await?
        .ok_or("a permit with the new limit was not granted")?;
    let r = a.semaphore(&sem, 3).ttl(LONG_TTL).try_acquire().await;
    ensure!(
        matches!(r, Err(Error::LimitMismatch { stored: 4, .. })),
        "the old limit after set_limit gave {r:?}"
    );
    g2.release().await?;
    Ok(Completion::Completed)
}

/// Successive grants of a semaphore's permits, by different clients, get
/// strictly rising tokens.
pub async fn permit_tokens_strictly_rise(f: &dyn BackendFactory, ns: String) -> CaseResult {
    if f.client().await?.capabilities().fencing == Fencing::None {
        return Ok(Completion::ignored_with("the backend declares no fencing"));
    }
    let sem = name(&ns, "tokens")?;
    let (a, b) = (client(f).await?, client(f).await?);
    let mut last = None;
    let mut held = Vec::new();
    for i in 0..8 {
        let c = if i % 2 == 0 { &a } else { &b };
        let g = c.semaphore(&sem, 2).ttl(LONG_TTL).acquire().await?;
        if let Some(prev) = last {
            ensure!(
                g.token() > prev,
                "grant {i} got token {} after {prev}",
                g.token()
            );
        }
        last = Some(g.token());
        held.push(g);
        if held.len() == 2 {
            held.remove(0).release().await?;
        }
    }
    for g in held {
        g.release().await?;
    }
    Ok(Completion::Completed)
}

/// Releasing a permit that expired, or one that was never granted, answers
/// "not held" and frees none of the permits others hold.
pub async fn release_of_an_expired_or_foreign_permit_frees_nothing(
    f: &dyn BackendFactory,
    ns: String,
) -> CaseResult {
    let sem = name(&ns, "stale")?;
    let ttl = f.short_ttl();
    let stale = LockRequest::permit(sem.clone(), ttl, 2);
    let (raw, _) = raw_hold(f, &stale).await?;
    let (b, c) = (client(f).await?, client(f).await?);
    let g1 = permit_within(&b, &sem, 2, ttl + BOUND).await?;
    // The second permit is the stale one's, once its TTL ran out.
    let g2 = permit_within(&c, &sem, 2, ttl + BOUND).await?;
    if !raw.capabilities().session {
        ensure!(
            !raw.release(&stale).await?,
            "releasing an expired permit reported it held"
        );
    }
    let mut foreign = LockRequest::permit(sem.clone(), LONG_TTL, 2);
    foreign.owner = Owner::random();
    ensure!(
        !raw.release(&foreign).await?,
        "releasing a permit never granted reported it held"
    );
    let free = free_permits(f, sem.as_str(), 2).await?;
    ensure!(free == 0, "{free} permits free while two holders hold both");
    ensure!(g1.is_held() && g2.is_held(), "a holder lost its permit");
    g1.release().await?;
    g2.release().await?;
    if raw.capabilities().session {
        return Ok(Completion::ignored_with(
            "the foreign release checked; an expired permit's release is not: its session ends with it",
        ));
    }
    Ok(Completion::Completed)
}

/// With an explicit holder, a second acquire nests and takes no second
/// permit.
pub async fn reentrant_permit_takes_no_second_permit(
    f: &dyn BackendFactory,
    ns: String,
) -> CaseResult {
    let sem = name(&ns, "reentrant")?;
    let a = client(f).await?;
    let nested = || a.semaphore(&sem, 2).holder("job").ttl(LONG_TTL).acquire();
    let outer = nested().await?;
    let inner = nested().await?;
    ensure!(inner.hold_count() == 2, "hold count {}", inner.hold_count());
    ensure!(
        inner.token() == outer.token(),
        "the nested acquire took a new permit"
    );
    let free = free_permits(f, sem.as_str(), 2).await?;
    ensure!(
        free == 1,
        "{free} of 2 permits free while one holder nests twice"
    );
    inner.release().await?;
    outer.release().await?;
    Ok(Completion::Completed)
}

/// After another client raises the limit from 2 to 3, the holder's acquire
/// with the new limit nests into the permit it holds, and its client's
/// other tasks get the two permits left, the new one included.
pub async fn a_raised_limit_nests_the_holders_permit_and_opens_the_new_ones(
    f: &dyn BackendFactory,
    ns: String,
) -> CaseResult {
    let sem = name(&ns, "raised")?;
    let (a, b) = (client(f).await?, client(f).await?);
    let outer = a
        .semaphore(&sem, 2)
        .holder("job")
        .ttl(LONG_TTL)
        .acquire()
        .await?;
    let old = b.set_semaphore_limit(sem.as_str(), 3).await?;
    ensure!(old == Some(2), "set_limit returned {old:?}, not 2");
    let inner = a
        .semaphore(&sem, 3)
        .holder("job")
        .ttl(LONG_TTL)
        .try_acquire()
        .await?
        .ok_or("the holder's acquire with the raised limit was refused")?;
    ensure!(
        inner.hold_count() == 2 && inner.token() == outer.token(),
        "the holder's acquire with the raised limit took a second permit (hold count {})",
        inner.hold_count()
    );
    let mut others = Vec::new();
    for i in 0..2 {
        let g = a
            .semaphore(&sem, 3)
            .ttl(LONG_TTL)
            .try_acquire()
            .await?
            .ok_or_else(|| format!("permit {} of 3 was refused with one held", i + 2))?;
        others.push(g);
    }
    // Asked through the other client, so the server judges it.
    let fourth = b.semaphore(&sem, 3).ttl(LONG_TTL).try_acquire().await?;
    ensure!(fourth.is_none(), "a fourth permit of 3 was granted");
    for g in others {
        g.release().await?;
    }
    inner.release().await?;
    outer.release().await?;
    Ok(Completion::Completed)
}

/// Ten tasks of one client waiting on a full semaphore of 2 put at most 2
/// acquires on the server at once.
pub async fn local_waiters_put_at_most_limit_waiters_on_the_server(
    f: &dyn BackendFactory,
    ns: String,
) -> CaseResult {
    let sem = name(&ns, "coalesce")?;
    let holder = client(f).await?;
    let full = vec![
        holder.semaphore(&sem, 2).ttl(LONG_TTL).acquire().await?,
        holder.semaphore(&sem, 2).ttl(LONG_TTL).acquire().await?,
    ];
    let max = most_acquires_in_flight(f, 10, full, move |c| c.semaphore(&sem, 2)).await?;
    ensure!(
        max <= 2,
        "{max} acquires of a 2-permit semaphore were in flight to the backend at once"
    );
    Ok(Completion::Completed)
}

/// `inspect_permits` reports how many permits are held and the limit.
pub async fn inspect_reports_permits_in_use_and_the_limit(
    f: &dyn BackendFactory,
    ns: String,
) -> CaseResult {
    let sem = name(&ns, "inspect")?;
    let a = client(f).await?;
    let g1 = a.semaphore(&sem, 3).ttl(LONG_TTL).acquire().await?;
    let g2 = a.semaphore(&sem, 3).ttl(LONG_TTL).acquire().await?;
    let s = a.backend().inspect_permits(&sem).await?;
    ensure!(
        s.holders == Some(2) && s.limit == Some(3) && s.held,
        "inspect said {s:?} with 2 of 3 permits held"
    );
    g1.release().await?;
    g2.release().await?;
    let s = a.backend().inspect_permits(&sem).await?;
    ensure!(
        s.holders == Some(0) && !s.held,
        "inspect said {s:?} after both released"
    );
    Ok(Completion::Completed)
}

/// The permits of `sem` that `c`'s listing shows, or `None` where the
/// backend cannot list.
async fn listed_permits(c: &LockClient, sem: &LockName) -> Result<Option<usize>, Failed> {
    match c.list(sem.as_str(), 1_000).await {
        Err(Error::Unsupported { .. }) => Ok(None),
        other => Ok(Some(
            other?
                .iter()
                .filter(|r| r.name == sem.as_str() && matches!(r.kind, HoldKind::Permits { .. }))
                .count(),
        )),
    }
}

/// While one permit of a semaphore of 1 is held and other clients' tries
/// are refused over and over, `inspect_permits` and `list` show the one
/// holder every time, never a contender on its way to being refused.
pub async fn inspect_and_list_count_no_contender_that_was_refused(
    f: &dyn BackendFactory,
    ns: String,
) -> CaseResult {
    let sem = name(&ns, "refused")?;
    let a = client(f).await?;
    let g = a.semaphore(&sem, 1).ttl(LONG_TTL).acquire().await?;
    let until = Instant::now() + Duration::from_millis(600);
    let mut tries = Vec::new();
    for _ in 0..2 {
        let c = client(f).await?;
        let sem = sem.clone();
        tries.push(tokio::spawn(async move {
            let mut granted = 0;
            while Instant::now() < until {
                if let Some(g) = c.semaphore(&sem, 1).ttl(LONG_TTL).try_acquire().await? {
                    granted += 1;
                    g.release().await?;
                }
            }
            Ok::<_, Error>(granted)
        }));
    }
    let mut seen = Vec::new();
    while Instant::now() < until {
        let s = a.backend().inspect_permits(&sem).await?;
        let listed = listed_permits(&a, &sem).await?;
        seen.push((s.holders, listed));
    }
    for t in tries {
        let granted = t.await.map_err(|e| e.to_string())??;
        ensure!(
            granted == 0,
            "{granted} tries were granted a held permit of 1"
        );
    }
    let wrong: Vec<_> = seen
        .iter()
        .filter(|(holders, listed)| *holders != Some(1) || listed.is_some_and(|n| n != 1))
        .collect();
    ensure!(
        wrong.is_empty(),
        "with one permit of 1 held, inspect and list reported (holders, listed permits) {wrong:?} in {} looks",
        seen.len()
    );
    g.release().await?;
    Ok(Completion::Completed)
}

/// A limit lowered below the permits in use takes none of them back:
/// `inspect_permits` and `list` show every one until it is released.
pub async fn a_lowered_limit_leaves_the_permits_held_in_inspect_and_list(
    f: &dyn BackendFactory,
    ns: String,
) -> CaseResult {
    let sem = name(&ns, "lowered")?;
    let (a, b) = (client(f).await?, client(f).await?);
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(a.semaphore(&sem, 3).ttl(LONG_TTL).acquire().await?);
    }
    let old = b.set_semaphore_limit(sem.as_str(), 1).await?;
    ensure!(old == Some(3), "set_limit returned {old:?}, not 3");
    let s = b.backend().inspect_permits(&sem).await?;
    ensure!(
        s.holders == Some(3) && s.limit == Some(1),
        "inspect said {s:?} with 3 permits held under a limit lowered to 1"
    );
    let listed = listed_permits(&b, &sem).await?;
    ensure!(
        listed.is_none_or(|n| n == 3),
        "list shows {listed:?} permits with 3 held under a limit lowered to 1"
    );
    ensure!(
        b.semaphore(&sem, 1)
            .ttl(LONG_TTL)
            .try_acquire()
            .await?
            .is_none(),
        "a permit was granted with 3 held under a limit of 1"
    );
    for g in held {
        ensure!(g.is_held(), "a permit ended when the limit was lowered");
        g.release().await?;
    }
    let s = b.backend().inspect_permits(&sem).await?;
    ensure!(
        s.holders == Some(0),
        "inspect said {s:?} after all released"
    );
    Ok(Completion::Completed)
}

/// Why a semaphore case does not run on `f`, if it does not.
pub(crate) async fn unsupported(f: &dyn BackendFactory) -> Result<Option<Completion>, Failed> {
    let caps = f.client().await?.capabilities();
    Ok((!caps.supports(&HoldKind::Permits { limit: 1 })).then(|| {
        Completion::ignored_with(format!(
            "{} does not declare semaphores (Capabilities::semaphore)",
            caps.backend
        ))
    }))
}
