//! The conformance cases of elections ([`HoldKind::Leader`]), run where the
//! backend declares [`Capabilities::elections`](distlock_core::Capabilities::elections).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use distlock_core::{
    Error, Fencing, HoldKind, InputKind, Leader, LeaderStream, LockClient, LockRequest,
    MAX_VALUE_LEN,
};
use futures_util::StreamExt;
use libtest_mimic::{Completion, Failed};
use tokio::time::Instant;

use crate::cases::{client, name, raw_hold, BOUND, LONG_TTL};
use crate::{ensure, BackendFactory, CaseResult};

cases![
    one_leader_at_a_time_among_many_campaigners,
    a_vanished_leader_is_replaced_after_its_ttl,
    an_evicted_leader_sees_lost_and_cannot_proclaim,
    resign_hands_over_and_proclaim_changes_the_value,
    observe_sees_every_leader_in_order_and_ends_on_the_current_one,
    a_failed_or_cancelled_campaign_leaves_nothing_behind,
    election_values_are_bounded,
];

/// The current leader's value as `c` reads it.
async fn leader_value(c: &LockClient, election: &str) -> Result<Option<String>, Failed> {
    Ok(c.election(election).leader().await?.map(|l| l.value))
}

/// Many clients campaign in turn; each leads briefly with a deliberate gap
/// between reading and writing a shared flag. Two leaders at once trip the
/// flag, and every leadership's token is above the one before it (where
/// the backend declares fencing).
pub async fn one_leader_at_a_time_among_many_campaigners(
    f: &dyn BackendFactory,
    ns: String,
) -> CaseResult {
    const CLIENTS: usize = 4;
    const ROUNDS: usize = 3;
    let election = name(&ns, "leaders")?.to_string();
    let inside = Arc::new(AtomicBool::new(false));
    let overlaps = Arc::new(AtomicUsize::new(0));
    let tokens = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for i in 0..CLIENTS {
        let c = client(f).await?;
        let (election, inside, overlaps, tokens) = (
            election.clone(),
            inside.clone(),
            overlaps.clone(),
            tokens.clone(),
        );
        tasks.push(tokio::spawn(async move {
            for r in 0..ROUNDS {
                let e = c.election(&election).ttl(LONG_TTL).wait(BOUND * 2);
                let l = e.campaign(format!("c{i}-r{r}")).await?;
                if inside.swap(true, Ordering::SeqCst) {
                    overlaps.fetch_add(1, Ordering::SeqCst);
                }
                tokens
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .push(l.token());
                tokio::time::sleep(Duration::from_millis(5)).await;
                inside.store(false, Ordering::SeqCst);
                l.resign().await?;
            }
            Ok::<(), Error>(())
        }));
    }
    for t in tasks {
        t.await.map_err(|e| format!("campaigner panicked: {e}"))??;
    }
    let overlaps = overlaps.load(Ordering::SeqCst);
    ensure!(overlaps == 0, "{overlaps} leaderships overlapped another");
    let tokens = tokens
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .clone();
    ensure!(
        tokens.len() == CLIENTS * ROUNDS,
        "{} leaderships instead of {}",
        tokens.len(),
        CLIENTS * ROUNDS
    );
    let fenced = f.client().await?.capabilities().fencing != Fencing::None;
    ensure!(
        !fenced || tokens.windows(2).all(|w| w[0] < w[1]),
        "leadership tokens did not rise in the order leaders took over: {tokens:?}"
    );
    Ok(Completion::Completed)
}

/// A leader that vanishes without resigning (no renewal) keeps the
/// leadership for its TTL, and a campaigner takes over after it, no later
/// than a second past it (as a vanished lock holder is replaced); meanwhile
/// `leader` reports the vanished one.
pub async fn a_vanished_leader_is_replaced_after_its_ttl(
    f: &dyn BackendFactory,
    ns: String,
) -> CaseResult {
    let election = name(&ns, "vanish")?;
    let ttl = f.short_ttl();
    let b = client(f).await?;
    let req = LockRequest::leader(election.clone(), ttl, "ghost");
    let (raw, grant) = raw_hold(f, &req).await?;
    let caps = raw.capabilities();
    let safe = caps.safe_validity(ttl);
    drop(raw);
    let start = Instant::now();
    let seen = leader_value(&b, election.as_str()).await?;
    // Only while its lease surely runs: a stall of the test past the TTL
    // may rightly show no leader.
    ensure!(
        seen == Some("ghost".into()) || grant.began.elapsed() >= ttl / 2,
        "leader does not report the vanished leader while its lease runs (it said {seen:?})"
    );
    // Asked again shortly before the vanished leader's deadline (as for a
    // vanished lock holder): a leadership that arrives after the deadline
    // proves nothing and is given back.
    tokio::time::sleep_until(grant.began + safe.mul_f64(0.8)).await;
    if let Some(l) = b
        .election(election.as_str())
        .ttl(LONG_TTL)
        .try_campaign("early")
        .await?
    {
        let at = grant.began.elapsed();
        l.resign().await?;
        ensure!(
            at >= safe,
            "took over {at:?} after the vanished leader was asked for, before its holder's deadline ({safe:?} of its {ttl:?} TTL)"
        );
    }
    let l = b
        .election(election.as_str())
        .ttl(LONG_TTL)
        .wait(ttl + BOUND)
        .campaign("heir")
        .await?;
    let took = grant.began.elapsed();
    ensure!(
        took >= safe,
        "took over {took:?} after the vanished leader was asked for, before its holder's deadline ({safe:?} of its {ttl:?} TTL)"
    );
    let waited = start.elapsed();
    ensure!(
        waited <= crate::cases::latest_replacement(&caps, ttl),
        "the vanished leader was replaced only after {waited:?}, more than a second past its {ttl:?} TTL{}",
        crate::cases::lag_note(&caps, ttl)
    );
    ensure!(
        leader_value(&b, election.as_str()).await? == Some("heir".into()),
        "leader does not report the new leader"
    );
    l.resign().await?;
    Ok(Completion::Completed)
}

/// Once the leadership is taken away on the server, `lost()` fires and
/// `proclaim` fails with [`Error::LeaseLost`]; the backend itself refuses a
/// proclamation from a request that no longer leads, and the next
/// campaigner's try leads at once, with its own value.
pub async fn an_evicted_leader_sees_lost_and_cannot_proclaim(
    f: &dyn BackendFactory,
    ns: String,
) -> CaseResult {
    if !f.can_evict() {
        return Ok(Completion::ignored_with(
            "the factory cannot evict a holder",
        ));
    }
    let election = name(&ns, "evicted")?;
    let ttl = f.short_ttl();
    let (a, b) = (client(f).await?, client(f).await?);
    let l = a.election(election.as_str()).ttl(ttl).campaign("a").await?;
    f.evict(&election).await?;
    tokio::time::timeout(ttl + BOUND, l.lost())
        .await
        .map_err(|_| "lost() did not fire after the leadership was evicted")?;
    match l.proclaim("a-again").await {
        Err(Error::LeaseLost { .. }) => {}
        other => return Err(format!("proclaim after loss answered {other:?}").into()),
    }
    let req = LockRequest::leader(election.clone(), LONG_TTL, "raw");
    let (raw, _) = raw_hold(f, &req).await?;
    f.evict(&election).await?;
    ensure!(
        !raw.proclaim(&req, "raw-again").await?,
        "the backend accepted a proclamation from an evicted leader"
    );
    // The eviction freed the leadership at once: a try takes it.
    let next = b
        .election(election.as_str())
        .ttl(LONG_TTL)
        .try_campaign("b")
        .await?
        .ok_or("a try to campaign right after an eviction was refused")?;
    ensure!(
        leader_value(&b, election.as_str()).await? == Some("b".into()),
        "an evicted leader's proclamation shows, or the new leader does not"
    );
    next.resign().await?;
    let _ = raw.release(&req).await;
    Ok(Completion::Completed)
}

/// `proclaim` changes the value `leader` reports, keeping the token;
/// `resign` hands leadership to the waiting campaigner (with a higher
/// token, where the backend declares fencing); with nobody left, `leader`
/// reports none.
pub async fn resign_hands_over_and_proclaim_changes_the_value(
    f: &dyn BackendFactory,
    ns: String,
) -> CaseResult {
    let election = name(&ns, "handover")?.to_string();
    let (a, b) = (client(f).await?, client(f).await?);
    ensure!(
        leader_value(&a, &election).await?.is_none(),
        "a leader before anyone campaigned"
    );
    let la = a.election(&election).ttl(LONG_TTL).campaign("a1").await?;
    let token = la.token();
    let eb = b.election(&election).ttl(LONG_TTL).wait(BOUND);
    let waiting = tokio::spawn(async move { eb.campaign("b1").await });
    la.proclaim("a2").await?;
    let now = a.election(&election).leader().await?.ok_or("no leader")?;
    ensure!(
        now.value == "a2" && now.token == token,
        "after proclaim the leader is {now:?}, not a2 with token {token}"
    );
    ensure!(
        la.value() == "a2",
        "the leadership still says {}",
        la.value()
    );
    ensure!(
        !waiting.is_finished(),
        "the second campaigner led while the first had not resigned"
    );
    ensure!(la.resign().await?, "resign said the leader no longer led");
    let lb = waiting
        .await
        .map_err(|e| format!("campaigner panicked: {e}"))??;
    let fenced = a.capabilities().fencing != Fencing::None;
    ensure!(
        !fenced || lb.token() > token,
        "the next leader's token did not rise"
    );
    ensure!(
        leader_value(&a, &election).await? == Some("b1".into()),
        "leader does not report the campaigner that took over"
    );
    lb.resign().await?;
    ensure!(
        leader_value(&a, &election).await?.is_none(),
        "a leader is reported after the last one resigned"
    );
    Ok(Completion::Completed)
}

/// The next value `seen` reports, within the bound.
async fn next_value(seen: &mut LeaderStream) -> Result<Option<String>, Failed> {
    Ok(next_leader(seen).await?.map(|l| l.value))
}

async fn next_leader(seen: &mut LeaderStream) -> Result<Option<Leader>, Failed> {
    match tokio::time::timeout(BOUND, seen.next()).await {
        Ok(Some(Ok(leader))) => Ok(leader),
        Ok(Some(Err(e))) => Err(format!("observe failed: {e}").into()),
        Ok(None) => Err("observe ended".into()),
        Err(_) => Err("observe reported no change within the bound".into()),
    }
}

/// An observer started before anyone campaigns sees nobody, then each
/// leader and each proclaimed value in order, never a leader that has
/// resigned, and ends on the current leader.
pub async fn observe_sees_every_leader_in_order_and_ends_on_the_current_one(
    f: &dyn BackendFactory,
    ns: String,
) -> CaseResult {
    let election = name(&ns, "observe")?.to_string();
    let (a, b, o) = (client(f).await?, client(f).await?, client(f).await?);
    let mut seen = o.election(&election).observe().await?;
    ensure!(
        next_value(&mut seen).await?.is_none(),
        "observe began with a leader"
    );
    let la = a.election(&election).ttl(LONG_TTL).campaign("a1").await?;
    let first = next_leader(&mut seen).await?;
    ensure!(
        first.as_ref().map(|l| l.value.as_str()) == Some("a1"),
        "observe missed the first leader"
    );
    // Where `leader` tells the remaining lease, so does observe.
    let read = o.election(&election).leader().await?;
    if read.as_ref().is_some_and(|l| l.remaining.is_some()) {
        let left = first.and_then(|l| l.remaining);
        ensure!(
            left.is_some_and(|left| left <= LONG_TTL),
            "leader() tells the remaining lease, observe tells {left:?}"
        );
    }
    la.proclaim("a2").await?;
    ensure!(
        next_value(&mut seen).await? == Some("a2".into()),
        "observe missed the proclaimed value"
    );
    la.resign().await?;
    let lb = b.election(&election).ttl(LONG_TTL).campaign("b1").await?;
    // Between the two leaders it may report nobody; never a1 or a2 again.
    let mut after = next_value(&mut seen).await?;
    if after.is_none() {
        after = next_value(&mut seen).await?;
    }
    ensure!(
        after == Some("b1".into()),
        "after a resigned, observe reported {after:?} instead of b1"
    );
    ensure!(
        leader_value(&o, &election).await? == Some("b1".into()),
        "observe and leader disagree"
    );
    lb.resign().await?;
    Ok(Completion::Completed)
}

/// A campaign that times out, and one whose future is dropped, leave
/// nothing behind: once the leader resigns nobody leads, and a new
/// campaigner is elected at once.
pub async fn a_failed_or_cancelled_campaign_leaves_nothing_behind(
    f: &dyn BackendFactory,
    ns: String,
) -> CaseResult {
    let election = name(&ns, "cancel")?.to_string();
    let (a, b, c) = (client(f).await?, client(f).await?, client(f).await?);
    let la = a.election(&election).ttl(LONG_TTL).campaign("a").await?;
    match b
        .election(&election)
        .ttl(LONG_TTL)
        .wait(Duration::from_millis(300))
        .campaign("timed-out")
        .await
    {
        Err(Error::WaitTimeout { .. }) => {}
        other => return Err(format!("a campaign past its wait answered {other:?}").into()),
    }
    let dropped = tokio::time::timeout(
        Duration::from_millis(300),
        c.election(&election).ttl(LONG_TTL).campaign("dropped"),
    )
    .await;
    ensure!(dropped.is_err(), "a campaign was elected beside the leader");
    la.resign().await?;
    // Core cleans a dropped campaign up in the background: nobody leads
    // once it is done (a campaign left behind leads for its `LONG_TTL`).
    let cleaned = Instant::now() + BOUND;
    loop {
        let leader = leader_value(&a, &election).await?;
        if leader.is_none() {
            break;
        }
        ensure!(
            Instant::now() < cleaned,
            "a failed or cancelled campaign became leader: {leader:?} still leads {BOUND:?} after the resignation"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let fresh = client(f).await?;
    let l = fresh
        .election(&election)
        .ttl(LONG_TTL)
        .try_campaign("fresh")
        .await?
        .ok_or("a campaign was refused though nobody led")?;
    l.resign().await?;
    Ok(Completion::Completed)
}

/// A value above [`MAX_VALUE_LEN`] is refused with a typed error before
/// anything is sent, in a campaign and in a proclamation, which leaves the
/// value as it was.
pub async fn election_values_are_bounded(f: &dyn BackendFactory, ns: String) -> CaseResult {
    let election = name(&ns, "bounded")?.to_string();
    let a = client(f).await?;
    let big = "x".repeat(MAX_VALUE_LEN + 1);
    match a.election(&election).campaign(big.clone()).await {
        Err(Error::InvalidInput {
            kind: InputKind::Config,
            ..
        }) => {}
        other => return Err(format!("an oversized campaign answered {other:?}").into()),
    }
    let l = a
        .election(&election)
        .ttl(LONG_TTL)
        .campaign("x".repeat(MAX_VALUE_LEN))
        .await?;
    match l.proclaim(big).await {
        Err(Error::InvalidInput { .. }) => {}
        other => return Err(format!("an oversized proclamation answered {other:?}").into()),
    }
    let now = leader_value(&a, &election).await?.unwrap_or_default();
    ensure!(
        now.len() == MAX_VALUE_LEN,
        "the leader's value changed to {} bytes",
        now.len()
    );
    l.resign().await?;
    Ok(Completion::Completed)
}

/// Why an election case does not run on `f`, if it does not.
pub(crate) async fn unsupported(f: &dyn BackendFactory) -> Result<Option<Completion>, Failed> {
    let caps = f.client().await?.capabilities();
    Ok((!caps.supports(&HoldKind::Leader)).then(|| {
        Completion::ignored_with(format!(
            "{} does not declare elections (Capabilities::elections)",
            caps.backend
        ))
    }))
}
