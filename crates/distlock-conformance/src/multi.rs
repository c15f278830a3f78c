//! Conformance cases for holding several locks at once
//! ([`LockClient::lock_all`]): all or nothing, one canonical order, one
//! guard whose loss releases the rest. They run on every backend; where the
//! backend has no one-request path, core takes the names one at a time.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use distlock_core::{Error, Fencing, InputKind, LockClient, LockName, LostReason};
use libtest_mimic::{Completion, Failed};
use tokio::time::Instant;

use crate::cases::{client, name, BOUND, LONG_TTL};
use crate::{ensure, BackendFactory, CaseResult};

cases![
    multi_lock_is_all_or_nothing,
    opposite_orders_never_deadlock_or_overlap,
    losing_one_lock_fires_lost_and_releases_the_rest,
    cancelled_multi_lock_leaves_nothing_behind,
    duplicate_or_invalid_names_are_refused,
    multi_lock_tokens_come_in_canonical_order,
];

fn names(ns: &str, case: &str, parts: &[&str]) -> Result<Vec<LockName>, Failed> {
    parts
        .iter()
        .map(|p| name(ns, &format!("{case}/{p}")))
        .collect()
}

/// Whether another client can take every one of `names` (each alone), and
/// frees them again.
async fn all_free(f: &dyn BackendFactory, names: &[LockName]) -> Result<bool, Failed> {
    let probe = client(f).await?;
    for n in names {
        match probe.lock(n).ttl(LONG_TTL).try_acquire().await? {
            Some(g) => {
                g.release().await?;
            }
            None => return Ok(false),
        }
    }
    Ok(true)
}

/// [`all_free`] within [`BOUND`]: a dropped guard or future releases in the
/// background.
async fn become_free(f: &dyn BackendFactory, names: &[LockName]) -> Result<bool, Failed> {
    let end = Instant::now() + BOUND;
    loop {
        if all_free(f, names).await? {
            return Ok(true);
        }
        if Instant::now() > end {
            return Ok(false);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// With one of three names held elsewhere, neither a try nor a bounded wait
/// takes any of them; once it is free, all three are taken together.
pub async fn multi_lock_is_all_or_nothing(f: &dyn BackendFactory, ns: String) -> CaseResult {
    let all = names(&ns, "all", &["a", "b", "c"])?;
    let (a, b) = (client(f).await?, client(f).await?);
    let held = b.lock(&all[1]).ttl(LONG_TTL).acquire().await?;
    let tried = a.lock_all(&all).ttl(LONG_TTL).try_acquire().await?;
    ensure!(
        tried.is_none(),
        "a multi-lock was granted with one of its names held elsewhere"
    );
    let free = [all[0].clone(), all[2].clone()];
    // Where the names are taken one at a time, the refused try's first
    // guard is given back in the background.
    ensure!(
        become_free(f, &free).await?,
        "a refused try left one of its other names held"
    );
    let waited = a
        .lock_all(&all)
        .ttl(LONG_TTL)
        .wait(Duration::from_millis(300))
        .acquire()
        .await;
    ensure!(
        matches!(waited, Err(Error::WaitTimeout { .. })),
        "a bounded wait on a held name answered {waited:?}"
    );
    ensure!(
        become_free(f, &free).await?,
        "a timed-out wait left one of its other names held"
    );
    held.release().await?;
    // A bounded wait, not a try: the timed-out wait's first name is given
    // back in the background, and its local permit in `a` returns just
    // after the server has freed the name, which `become_free` sees.
    let m = a
        .lock_all(&all)
        .ttl(LONG_TTL)
        .wait(Duration::from_secs(5))
        .acquire()
        .await;
    let m = m.map_err(|e| format!("three free names were not taken together: {e}"))?;
    ensure!(
        m.guards().len() == 3 && m.is_held(),
        "not all three names are held"
    );
    for n in &all {
        ensure!(
            b.lock(n).ttl(LONG_TTL).try_acquire().await?.is_none(),
            "{n} is not held by the multi-lock"
        );
    }
    ensure!(
        m.release().await?,
        "release of all three reported one not held"
    );
    ensure!(
        all_free(f, &all).await?,
        "a name is still held after release"
    );
    Ok(Completion::Completed)
}

/// Two clients take {x, y} and {y, x} over and over: names are taken in one
/// order whatever order they are given in, so neither deadlocks, and no two
/// holds of the pair overlap.
pub async fn opposite_orders_never_deadlock_or_overlap(
    f: &dyn BackendFactory,
    ns: String,
) -> CaseResult {
    const ROUNDS: u64 = 200;
    let pair = names(&ns, "orders", &["x", "y"])?;
    let inside = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for reversed in [false, true] {
        let c = client(f).await?;
        let mut order = pair.clone();
        if reversed {
            order.reverse();
        }
        let (inside, done) = (inside.clone(), done.clone());
        tasks.push(tokio::spawn(async move {
            for _ in 0..ROUNDS {
                let m = c
                    .lock_all(&order)
                    .ttl(LONG_TTL)
                    .wait(BOUND)
                    .acquire()
                    .await?;
                if inside.swap(true, Ordering::SeqCst) {
                    return Err(Failed::from("two multi-locks of the same names overlapped"));
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
                inside.store(false, Ordering::SeqCst);
                m.release().await?;
                done.fetch_add(1, Ordering::Relaxed);
            }
            Ok::<_, Failed>(())
        }));
    }
    for t in tasks {
        t.await.map_err(|e| e.to_string())??;
    }
    let n = done.load(Ordering::Relaxed);
    ensure!(
        n == 2 * ROUNDS,
        "only {n} of {} rounds finished",
        2 * ROUNDS
    );
    Ok(Completion::Completed)
}

/// One name of a multi-lock is held through a nested guard of the same
/// holder whose lease runs out: the multi-lock's `lost()` names it, and the
/// other name is released at once, for another client to take.
pub async fn losing_one_lock_fires_lost_and_releases_the_rest(
    f: &dyn BackendFactory,
    ns: String,
) -> CaseResult {
    let pair = names(&ns, "lost", &["a", "b"])?;
    let (a, b) = (client(f).await?, client(f).await?);
    let ttl = f.short_ttl();
    let outer = a
        .lock(&pair[0])
        .holder("job")
        .ttl(ttl)
        .no_renew()
        .acquire()
        .await?;
    let m = a
        .lock_all(&pair)
        .holder("job")
        .ttl(LONG_TTL)
        .acquire()
        .await?;
    let (lost, reason) = tokio::time::timeout(ttl * 2 + BOUND, m.lost())
        .await
        .map_err(|_| Failed::from("the multi-lock never saw lost()"))?;
    ensure!(
        lost == pair[0] && reason == LostReason::DeadlinePassed,
        "lost() named {lost} for {reason}, not {} for its deadline",
        pair[0]
    );
    let end = Instant::now() + BOUND;
    let taken = loop {
        if let Some(g) = b.lock(&pair[1]).ttl(LONG_TTL).try_acquire().await? {
            break g;
        }
        ensure!(
            Instant::now() < end,
            "the other name was not released when its partner was lost"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let other = &m.guards()[1];
    ensure!(
        !other.is_held(),
        "the released name's guard still says it is held"
    );
    let why = tokio::time::timeout(Duration::from_secs(1), other.lost())
        .await
        .map_err(|_| Failed::from("the released name's guard never saw lost()"))?;
    ensure!(
        why == LostReason::WithOther(pair[0].clone()),
        "the released name was lost for {why}"
    );
    taken.release().await?;
    m.release().await?;
    drop(outer);
    Ok(Completion::Completed)
}

/// A multi-lock wait dropped at any point (before, during and after taking
/// its free names) leaves none of its names held or queued.
pub async fn cancelled_multi_lock_leaves_nothing_behind(
    f: &dyn BackendFactory,
    ns: String,
) -> CaseResult {
    let all = names(&ns, "cancel", &["a", "b", "c"])?;
    let (a, b) = (client(f).await?, client(f).await?);
    for after in [0u64, 1, 5, 20, 200] {
        let held = b.lock(&all[2]).ttl(LONG_TTL).acquire().await?;
        let wait = a.lock_all(&all).ttl(LONG_TTL).acquire();
        let r = tokio::time::timeout(Duration::from_millis(after), wait).await;
        ensure!(
            r.is_err(),
            "a multi-lock was granted with a name held elsewhere"
        );
        held.release().await?;
        ensure!(
            become_free(f, &all).await?,
            "a multi-lock wait dropped after {after} ms left a name held"
        );
    }
    Ok(Completion::Completed)
}

/// A name given twice, an invalid name and no names at all are typed
/// errors before anything is sent.
pub async fn duplicate_or_invalid_names_are_refused(
    f: &dyn BackendFactory,
    ns: String,
) -> CaseResult {
    let c = client(f).await?;
    let twice = names(&ns, "dup", &["a", "b", "a"])?;
    let bad = |r: Result<Option<distlock_core::MultiGuard>, Error>| {
        matches!(
            r,
            Err(Error::InvalidInput {
                kind: InputKind::LockName,
                ..
            })
        )
    };
    ensure!(
        bad(c.lock_all(&twice).try_acquire().await),
        "a name given twice was not refused"
    );
    ensure!(
        bad(c
            .lock_all([format!("{ns}/ok"), "bad name".to_string()])
            .try_acquire()
            .await),
        "an invalid name was not refused"
    );
    ensure!(
        bad(c.lock_all(Vec::<String>::new()).try_acquire().await),
        "no names at all was not refused"
    );
    ensure!(
        all_free(f, &twice[..2]).await?,
        "a refused multi-lock took a name"
    );
    Ok(Completion::Completed)
}

/// `tokens()` lists the names in sorted order whatever order they were
/// given in, each with a token above the name's earlier grants.
pub async fn multi_lock_tokens_come_in_canonical_order(
    f: &dyn BackendFactory,
    ns: String,
) -> CaseResult {
    let all = names(&ns, "tokens", &["c", "a", "b"])?;
    let c = client(f).await?;
    let mut before = Vec::new();
    for n in &all {
        let g = c.lock(n).ttl(LONG_TTL).acquire().await?;
        before.push((n.clone(), g.token()));
        g.release().await?;
    }
    let m = c.lock_all(&all).ttl(LONG_TTL).acquire().await?;
    let tokens = m.tokens();
    let order: Vec<&str> = tokens.iter().map(|(n, _)| n.as_str()).collect();
    let mut sorted = order.clone();
    sorted.sort_unstable();
    ensure!(
        order == sorted,
        "tokens() is not in sorted order: {order:?}"
    );
    if LockClient::capabilities(&c).fencing != Fencing::None {
        for (n, t) in &before {
            let now = m
                .token(n.as_str())
                .ok_or("a name is missing from tokens()")?;
            ensure!(now > *t, "{n}: token {now} is not above the earlier {t}");
        }
    }
    m.release().await?;
    Ok(Completion::Completed)
}
