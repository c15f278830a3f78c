//! The conformance cases of holder info and `list`: who holds what, read
//! by another client, for every kind the backend declares.

use std::time::Duration;

use distlock_core::{
    default_holder_info, Capabilities, Error, HoldKind, HoldRecord, LockClient, LockName,
    LockRequest, MAX_HOLDER_INFO_LEN,
};
use libtest_mimic::{Completion, Failed};
use tokio::time::Instant;

use crate::cases::{client, name, raw_hold, BOUND, LONG_TTL};
use crate::{ensure, BackendFactory, CaseResult};

cases![
    holder_info_round_trips,
    list_shows_what_is_held_and_nothing_released,
    holder_info_is_bounded,
];

/// Records enough for every case's holds.
const ROWS: usize = 100;

/// Whether two kinds are the same kind of hold (a permit's reported limit
/// may be the stored one or 0, where the backend stores none).
fn same_kind(listed: &HoldKind, held: &HoldKind) -> bool {
    match (listed, held) {
        (HoldKind::Permits { limit: l }, HoldKind::Permits { limit: h }) => *l == *h || *l == 0,
        (l, h) => l == h,
    }
}

/// The records of `list` naming `name` with a kind like `kind`.
fn records_of<'a>(
    records: &'a [HoldRecord],
    name: &LockName,
    kind: &HoldKind,
) -> Vec<&'a HoldRecord> {
    records
        .iter()
        .filter(|r| r.name == name.as_str() && same_kind(&r.kind, kind))
        .collect()
}

/// The listing under `ns/`, or `None` where the backend cannot list.
async fn listed(c: &LockClient, ns: &str) -> Result<Option<Vec<HoldRecord>>, Failed> {
    match c.list(&format!("{ns}/"), ROWS).await {
        Err(Error::Unsupported { .. }) => Ok(None),
        other => Ok(Some(other?)),
    }
}

/// Checks that `records` show one hold of `kind` on `name` by `info`
/// with `token` (where the backend reports one).
fn shows(
    records: &[HoldRecord],
    name: &LockName,
    kind: HoldKind,
    info: &str,
    token: distlock_core::FencingToken,
) -> Result<(), Failed> {
    let found = records_of(records, name, &kind);
    let Some(r) = found
        .iter()
        .find(|r| r.holder_info.as_deref() == Some(info))
    else {
        return Err(format!(
            "list shows no {kind} hold of {name} with holder info {info:?}: {records:#?}"
        )
        .into());
    };
    ensure!(
        r.token.is_none_or(|t| t == token || token.get() == 0),
        "list reports token {:?} for the {kind} hold of {name}; its holder has {token}",
        r.token
    );
    ensure!(
        r.remaining.is_none_or(|left| left <= LONG_TTL),
        "list reports {:?} remaining for {name}, above the TTL",
        r.remaining
    );
    Ok(())
}

/// A hold's holder info, set for the client or left to the default
/// (host name and process id), comes back from another client's
/// `inspect`, `leader` and `list`, for every kind the backend declares.
pub async fn holder_info_round_trips(f: &dyn BackendFactory, ns: String) -> CaseResult {
    let caps: Capabilities = f.client().await?.capabilities();
    let info = format!("worker 7 of {ns}: ./serve --port 8080");
    let a = client(f).await?.with_holder_info(&info)?;
    ensure!(
        a.holder_info() == info,
        "the client does not keep its holder info"
    );
    let plain = client(f).await?;
    let reader = client(f).await?;
    let raw = f.client().await?;

    let lock = name(&ns, "lock")?;
    let g = a.lock(&lock).ttl(LONG_TTL).acquire().await?;
    let default_lock = name(&ns, "default")?;
    let d = plain.lock(&default_lock).ttl(LONG_TTL).acquire().await?;
    let own = name(&ns, "own")?;
    let o = a
        .lock(&own)
        .ttl(LONG_TTL)
        .holder_info("just this hold")
        .acquire()
        .await?;
    let inspected = match raw.inspect(&lock).await {
        Err(Error::Unsupported { .. }) => None,
        other => Some(other?),
    };
    if let Some(status) = &inspected {
        ensure!(
            status.holder_info.as_deref() == Some(info.as_str()),
            "inspect reports holder info {:?}; the holder set {info:?}",
            status.holder_info
        );
        let status = raw.inspect(&default_lock).await?;
        let default = default_holder_info();
        ensure!(
            status.holder_info.as_deref() == Some(&*default),
            "inspect reports holder info {:?} for a client left to the default {default:?}",
            status.holder_info
        );
        let status = raw.inspect(&own).await?;
        ensure!(
            status.holder_info.as_deref() == Some("just this hold"),
            "inspect reports {:?} for a hold whose builder set its own holder info",
            status.holder_info
        );
    }

    let mut holds = vec![(lock.clone(), HoldKind::Exclusive, g.token())];
    let mut guards = vec![g, d, o];
    if caps.semaphore {
        let sem = name(&ns, "sem")?;
        let p = a.semaphore(&sem, 2).ttl(LONG_TTL).acquire().await?;
        holds.push((sem, HoldKind::Permits { limit: 2 }, p.token()));
        guards.push(p);
    }
    if caps.shared {
        let shared = name(&ns, "shared")?;
        let s = a.lock(&shared).shared().ttl(LONG_TTL).acquire().await?;
        holds.push((shared, HoldKind::Shared, s.token()));
        guards.push(s);
    }
    let mut leadership = None;
    if caps.elections {
        let election = name(&ns, "election")?;
        let l = a
            .election(election.as_str())
            .ttl(LONG_TTL)
            .campaign("proposal")
            .await?;
        let leader = reader.election(election.as_str()).leader().await?;
        let leader = leader.ok_or("leader() reports nobody while a leader holds")?;
        ensure!(
            leader.holder_info.as_deref() == Some(info.as_str()),
            "leader() reports holder info {:?}; the leader set {info:?}",
            leader.holder_info
        );
        holds.push((election, HoldKind::Leader, l.token()));
        leadership = Some(l);
    }

    if let Some(records) = listed(&reader, &ns).await? {
        for (name, kind, token) in &holds {
            shows(&records, name, *kind, &info, *token)?;
        }
        let default = default_holder_info();
        ensure!(
            records_of(&records, &default_lock, &HoldKind::Exclusive)
                .iter()
                .any(|r| r.holder_info.as_deref() == Some(&*default)),
            "list does not show the default holder info {default:?}: {records:#?}"
        );
        if caps.elections {
            let election = &holds.last().ok_or("no holds")?.0;
            let leader = records_of(&records, election, &HoldKind::Leader);
            ensure!(
                leader
                    .iter()
                    .any(|r| r.value.as_deref() == Some("proposal")),
                "list does not show the leader's value: {leader:#?}"
            );
        }
    } else if inspected.is_none() {
        return Ok(Completion::ignored_with(
            "the backend can neither inspect nor list holds",
        ));
    }
    if let Some(l) = leadership {
        l.resign().await?;
    }
    for g in guards {
        g.release().await?;
    }
    Ok(Completion::Completed)
}

/// `list` shows exactly the live holds under a prefix, of every declared
/// kind, in name order and bounded by its limit; released holds and a hold
/// whose lease ran out vanish from it.
pub async fn list_shows_what_is_held_and_nothing_released(
    f: &dyn BackendFactory,
    ns: String,
) -> CaseResult {
    let caps = f.client().await?.capabilities();
    let a = client(f).await?;
    let b = client(f).await?;
    let reader = client(f).await?;
    let Some(empty) = listed(&reader, &ns).await? else {
        return Ok(Completion::ignored_with("the backend cannot list holds"));
    };
    ensure!(empty.is_empty(), "an unused prefix lists holds: {empty:#?}");

    let (lock_a, lock_b) = (name(&ns, "a")?, name(&ns, "b")?);
    let ga = a.lock(&lock_a).ttl(LONG_TTL).acquire().await?;
    let gb = a.lock(&lock_b).ttl(LONG_TTL).acquire().await?;
    // A waiter queued behind a holder is not a hold.
    let queued = {
        let b = b.clone();
        let lock_a = lock_a.clone();
        tokio::spawn(async move { b.lock(&lock_a).ttl(LONG_TTL).wait(BOUND).acquire().await })
    };
    let mut expected = vec![
        (lock_a.clone(), HoldKind::Exclusive),
        (lock_b.clone(), HoldKind::Exclusive),
    ];
    let mut permits = Vec::new();
    if caps.semaphore {
        let sem = name(&ns, "s")?;
        for c in [&a, &b] {
            permits.push(c.semaphore(&sem, 3).ttl(LONG_TTL).acquire().await?);
            expected.push((sem.clone(), HoldKind::Permits { limit: 3 }));
        }
    }
    let mut shared = Vec::new();
    if caps.shared {
        let r = name(&ns, "r")?;
        for c in [&a, &b] {
            shared.push(c.lock(&r).shared().ttl(LONG_TTL).acquire().await?);
            expected.push((r.clone(), HoldKind::Shared));
        }
    }
    let mut leadership = None;
    if caps.elections {
        let e = name(&ns, "e")?;
        leadership = Some(a.election(e.as_str()).ttl(LONG_TTL).campaign("v1").await?);
        expected.push((e, HoldKind::Leader));
    }
    tokio::time::sleep(Duration::from_millis(200)).await;

    let all = listed(&reader, &ns)
        .await?
        .ok_or("listing stopped working")?;
    let matches = |records: &[HoldRecord], expected: &[(LockName, HoldKind)]| {
        records.len() == expected.len()
            && expected.iter().all(|(n, k)| {
                records_of(records, n, k).len()
                    == expected.iter().filter(|(m, j)| m == n && j == k).count()
            })
    };
    ensure!(
        matches(&all, &expected),
        "list shows {all:#?}; held are {expected:?} (a queued waiter is not a hold)"
    );
    ensure!(
        all.windows(2).all(|w| w[0].name <= w[1].name),
        "list is not in name order: {all:#?}"
    );
    let first_two = reader.list(&format!("{ns}/"), 2).await?;
    ensure!(
        first_two.len() == 2
            && first_two[0].name == lock_a.as_str()
            && first_two[1].name == lock_b.as_str(),
        "list with a limit of 2 shows {first_two:#?}, not the first two names"
    );
    let narrow = reader.list(lock_b.as_str(), ROWS).await?;
    ensure!(
        narrow.len() == 1 && narrow[0].name == lock_b.as_str(),
        "list under the prefix {lock_b} shows {narrow:#?}"
    );

    // Release one of each kind: each vanishes, the rest stay.
    gb.release().await?;
    expected.retain(|(n, _)| *n != lock_b);
    if let Some(p) = permits.pop() {
        p.release().await?;
        let at = expected
            .iter()
            .position(|(_, k)| matches!(k, HoldKind::Permits { .. }));
        expected.remove(at.ok_or("no permit expected")?);
    }
    if let Some(s) = shared.pop() {
        s.release().await?;
        let at = expected.iter().position(|(_, k)| *k == HoldKind::Shared);
        expected.remove(at.ok_or("no shared hold expected")?);
    }
    if let Some(l) = leadership.take() {
        l.resign().await?;
        expected.retain(|(_, k)| *k != HoldKind::Leader);
    }
    let after = listed(&reader, &ns)
        .await?
        .ok_or("listing stopped working")?;
    ensure!(
        matches(&after, &expected),
        "after releases, list shows {after:#?}; held are {expected:?}"
    );

    // The queued waiter takes the lock once it is free.
    ga.release().await?;
    let gq = queued
        .await
        .map_err(|e| format!("waiter panicked: {e}"))??;
    gq.release().await?;
    for p in permits {
        p.release().await?;
    }
    for s in shared {
        s.release().await?;
    }
    let none = listed(&reader, &ns)
        .await?
        .ok_or("listing stopped working")?;
    ensure!(
        none.is_empty(),
        "everything is released, and list shows {none:#?}"
    );

    // A hold nobody renews vanishes once its lease runs out.
    let ttl = f.short_ttl();
    let lapsing = name(&ns, "lapsing")?;
    let (raw, _) = raw_hold(f, &LockRequest::new(lapsing.clone(), ttl)).await?;
    let live = listed(&reader, &ns)
        .await?
        .ok_or("listing stopped working")?;
    ensure!(
        records_of(&live, &lapsing, &HoldKind::Exclusive).len() == 1,
        "a live hold taken by a raw request is not listed: {live:#?}"
    );
    drop(raw);
    let until = Instant::now() + ttl + BOUND;
    loop {
        let left = listed(&reader, &ns)
            .await?
            .ok_or("listing stopped working")?;
        if left.is_empty() {
            break;
        }
        ensure!(
            Instant::now() < until,
            "a hold whose lease ran out {:?} ago is still listed: {left:#?}",
            BOUND
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(Completion::Completed)
}

/// Oversized, empty or multi-line holder info, a malformed prefix and a
/// zero limit are typed errors before anything is sent; nothing is held.
pub async fn holder_info_is_bounded(f: &dyn BackendFactory, ns: String) -> CaseResult {
    let a = client(f).await?;
    let lock = name(&ns, "bounded")?;
    let fits = "h".repeat(MAX_HOLDER_INFO_LEN);
    let too_long = "h".repeat(MAX_HOLDER_INFO_LEN + 1);
    for bad in [too_long.as_str(), "", "two\nlines", "a\u{7}bell"] {
        let refused = a
            .lock(&lock)
            .ttl(LONG_TTL)
            .holder_info(bad)
            .try_acquire()
            .await;
        ensure!(
            matches!(refused, Err(Error::InvalidInput { .. })),
            "holder info {:?}... gave {refused:?}, not InvalidInput",
            bad.chars().take(12).collect::<String>()
        );
        ensure!(
            matches!(a.with_holder_info(bad), Err(Error::InvalidInput { .. })),
            "a client accepted the holder info {:?}...",
            bad.chars().take(12).collect::<String>()
        );
    }
    let other = client(f).await?;
    let free = other.lock(&lock).ttl(LONG_TTL).try_acquire().await?;
    let free = free.ok_or("a request refused for its holder info left the lock held")?;
    free.release().await?;
    let g = a
        .lock(&lock)
        .ttl(LONG_TTL)
        .holder_info(&fits)
        .try_acquire()
        .await?
        .ok_or("a free lock was refused")?;
    let status = f.client().await?.inspect(&lock).await?;
    ensure!(
        status.holder_info.as_deref() == Some(fits.as_str()),
        "holder info of exactly {MAX_HOLDER_INFO_LEN} bytes did not round-trip: {:?}",
        status.holder_info.map(|s| s.len())
    );
    g.release().await?;
    for bad in ["/abs", "a//b", "sp ace", "{tag}"] {
        let listed = a.list(bad, ROWS).await;
        ensure!(
            matches!(listed, Err(Error::InvalidInput { .. })),
            "list accepted the prefix {bad:?}: {listed:?}"
        );
    }
    let zero = a.list(&ns, 0).await;
    ensure!(
        matches!(zero, Err(Error::InvalidInput { .. })),
        "list accepted a limit of 0: {zero:?}"
    );
    Ok(Completion::Completed)
}
