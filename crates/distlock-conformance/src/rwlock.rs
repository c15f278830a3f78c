//! The conformance cases of read-write locks ([`HoldKind::Shared`] beside
//! [`HoldKind::Exclusive`] on one name), run where the backend declares
//! [`Capabilities::shared`](distlock_core::Capabilities::shared).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use distlock_core::{
    Error, Fencing, HoldKind, InputKind, LockClient, LockGuard, LockName, LockRequest, LostReason,
};
use libtest_mimic::{Completion, Failed};
use tokio::time::Instant;

use crate::cases::{
    client, lag_note, latest_replacement, name, raw_hold, replaced_after_ttl, BOUND, LONG_TTL,
};
use crate::{ensure, BackendFactory, CaseResult};

cases![
    shared_holds_overlap_and_exclude_the_exclusive_hold,
    readers_overlap_and_writers_exclude_everyone_under_contention,
    a_waiting_writer_holds_back_new_readers,
    a_writer_is_not_starved_by_a_stream_of_readers,
    crashed_reader_stops_blocking_a_writer_after_its_ttl,
    a_crashed_reader_beside_a_renewing_one_stops_counting_after_its_ttl,
    a_writer_behind_a_released_and_a_vanished_reader_goes_at_the_vanished_ones_ttl,
    a_writer_that_gives_up_leaves_no_mark,
    upgrade_is_refused_and_an_exclusive_holder_nests_a_shared_request,
    tokens_rise_across_shared_and_exclusive_holds,
    shared_hold_is_renewed_and_sees_lost_when_evicted,
    inspect_reports_shared_holders_and_a_waiting_writer,
];

/// `c`'s shared hold of `lock` with the long TTL, at once or `None`.
async fn try_shared(c: &LockClient, lock: &LockName) -> Result<Option<LockGuard>, Failed> {
    Ok(c.lock(lock).shared().ttl(LONG_TTL).try_acquire().await?)
}

/// `c`'s exclusive hold of `lock` with the long TTL, at once or `None`.
async fn try_exclusive(c: &LockClient, lock: &LockName) -> Result<Option<LockGuard>, Failed> {
    Ok(c.lock(lock).ttl(LONG_TTL).try_acquire().await?)
}

/// Waits until `inspect` says an exclusive request waits for `lock`.
async fn writer_shows_waiting(c: &LockClient, lock: &LockName) -> Result<(), Failed> {
    let start = Instant::now();
    loop {
        let s = c.backend().inspect(lock).await?;
        match s.writer_waiting {
            Some(true) => return Ok(()),
            Some(false) => {}
            None => return Err("inspect does not say whether a writer waits".into()),
        }
        ensure!(
            start.elapsed() < Duration::from_secs(10),
            "the waiting writer did not show in inspect within 10 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Two clients hold a name shared at once; meanwhile a third is refused it
/// exclusively. Once they release, an exclusive holder keeps both a shared
/// and an exclusive request out.
pub async fn shared_holds_overlap_and_exclude_the_exclusive_hold(
    f: &dyn BackendFactory,
    ns: String,
) -> CaseResult {
    let lock = name(&ns, "overlap")?;
    let (a, b, c) = (client(f).await?, client(f).await?, client(f).await?);
    let ra = try_shared(&a, &lock)
        .await?
        .ok_or("the first shared hold was refused")?;
    let rb = try_shared(&b, &lock)
        .await?
        .ok_or("a second shared hold was refused beside the first")?;
    ensure!(
        try_exclusive(&c, &lock).await?.is_none(),
        "an exclusive hold was granted beside two shared ones"
    );
    ra.release().await?;
    ensure!(
        try_exclusive(&c, &lock).await?.is_none(),
        "an exclusive hold was granted beside a shared one"
    );
    rb.release().await?;
    let w = try_exclusive(&c, &lock)
        .await?
        .ok_or("the exclusive hold was refused once every reader had released")?;
    ensure!(
        try_shared(&a, &lock).await?.is_none(),
        "a shared hold was granted beside the exclusive one"
    );
    ensure!(
        try_exclusive(&b, &lock).await?.is_none(),
        "a second exclusive hold was granted"
    );
    w.release().await?;
    let again = try_shared(&a, &lock)
        .await?
        .ok_or("a shared hold was refused after the writer released")?;
    again.release().await?;
    Ok(Completion::Completed)
}

/// Readers and writers contend for one name: a writer is never inside with
/// anyone, and readers are inside together at least once.
pub async fn readers_overlap_and_writers_exclude_everyone_under_contention(
    f: &dyn BackendFactory,
    ns: String,
) -> CaseResult {
    const READERS: usize = 4;
    const WRITERS: usize = 2;
    const ROUNDS: usize = 5;
    let lock = name(&ns, "contention")?;
    let readers_in = Arc::new(AtomicUsize::new(0));
    let most_readers = Arc::new(AtomicUsize::new(0));
    let writer_in = Arc::new(AtomicBool::new(false));
    let violations = Arc::new(AtomicUsize::new(0));
    let mut clients = Vec::new();
    for _ in 0..READERS + WRITERS {
        clients.push(client(f).await?);
    }
    let mut tasks = Vec::new();
    for (i, c) in clients.into_iter().enumerate() {
        let writer = i >= READERS;
        let (lock, readers_in, most_readers, writer_in, violations) = (
            lock.clone(),
            readers_in.clone(),
            most_readers.clone(),
            writer_in.clone(),
            violations.clone(),
        );
        tasks.push(tokio::spawn(async move {
            for _ in 0..ROUNDS {
                let b = c.lock(&lock).ttl(LONG_TTL).wait(BOUND * 3);
                let g = if writer { b } else { b.shared() }.acquire().await?;
                if writer {
                    if writer_in.swap(true, Ordering::SeqCst)
                        || readers_in.load(Ordering::SeqCst) > 0
                    {
                        violations.fetch_add(1, Ordering::SeqCst);
                    }
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    writer_in.store(false, Ordering::SeqCst);
                } else {
                    let n = readers_in.fetch_add(1, Ordering::SeqCst) + 1;
                    most_readers.fetch_max(n, Ordering::SeqCst);
                    if writer_in.load(Ordering::SeqCst) {
                        violations.fetch_add(1, Ordering::SeqCst);
                    }
                    tokio::time::sleep(Duration::from_millis(40)).await;
                    readers_in.fetch_sub(1, Ordering::SeqCst);
                }
                g.release().await?;
            }
            Ok::<_, Error>(())
        }));
    }
    for t in tasks {
        t.await
            .map_err(|e| Failed::from(format!("worker panicked: {e}")))??;
    }
    let bad = violations.load(Ordering::SeqCst);
    ensure!(
        bad == 0,
        "{bad} times a writer was inside with someone else"
    );
    let most = most_readers.load(Ordering::SeqCst);
    ensure!(
        most >= 2,
        "readers never held the lock together (at most {most} at once)"
    );
    Ok(Completion::Completed)
}

/// Once a writer waits behind a reader, a new reader is refused; the
/// writer gets the lock when the first reader releases, and the new reader
/// after the writer.
pub async fn a_waiting_writer_holds_back_new_readers(
    f: &dyn BackendFactory,
    ns: String,
) -> CaseResult {
    let lock = name(&ns, "preference")?;
    let (r1, w, r2) = (client(f).await?, client(f).await?, client(f).await?);
    let first = try_shared(&r1, &lock)
        .await?
        .ok_or("the reader was refused")?;
    let waiting = {
        let (w, lock) = (w.clone(), lock.clone());
        tokio::spawn(async move { w.lock(&lock).ttl(LONG_TTL).wait(BOUND).acquire().await })
    };
    writer_shows_waiting(&r2, &lock).await?;
    ensure!(
        try_shared(&r2, &lock).await?.is_none(),
        "a new reader was let in ahead of a waiting writer"
    );
    first.release().await?;
    let writer = waiting.await.map_err(|e| Failed::from(e.to_string()))??;
    ensure!(
        try_shared(&r2, &lock).await?.is_none(),
        "a reader was let in beside the writer"
    );
    writer.release().await?;
    let later = r2
        .lock(&lock)
        .shared()
        .ttl(LONG_TTL)
        .wait(BOUND)
        .acquire()
        .await?;
    later.release().await?;
    Ok(Completion::Completed)
}

/// Three readers take turns so that one of them always holds the name; a
/// writer that arrives meanwhile still gets it, because readers arriving
/// after it wait.
pub async fn a_writer_is_not_starved_by_a_stream_of_readers(
    f: &dyn BackendFactory,
    ns: String,
) -> CaseResult {
    const READERS: usize = 3;
    let lock = name(&ns, "starve")?;
    let stop = Arc::new(AtomicBool::new(false));
    let mut readers = Vec::new();
    let mut clients = Vec::new();
    for _ in 0..READERS {
        clients.push(client(f).await?);
    }
    let w = client(f).await?;
    for (i, c) in clients.into_iter().enumerate() {
        let (lock, stop) = (lock.clone(), stop.clone());
        readers.push(tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(20 * i as u64)).await;
            while !stop.load(Ordering::SeqCst) {
                let g = c
                    .lock(&lock)
                    .shared()
                    .ttl(LONG_TTL)
                    .wait(BOUND * 2)
                    .acquire()
                    .await?;
                tokio::time::sleep(Duration::from_millis(60)).await;
                g.release().await?;
            }
            Ok::<_, Error>(())
        }));
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let granted = w.lock(&lock).ttl(LONG_TTL).wait(BOUND / 2).acquire().await;
    stop.store(true, Ordering::SeqCst);
    let writer = match granted {
        Ok(g) => g,
        Err(Error::WaitTimeout { waited, .. }) => {
            return Err(format!(
                "the writer was starved: readers kept the lock for {waited:?} after it asked"
            )
            .into())
        }
        Err(e) => return Err(e.into()),
    };
    writer.release().await?;
    for r in readers {
        r.await.map_err(|e| Failed::from(e.to_string()))??;
    }
    Ok(Completion::Completed)
}

/// A reader that vanishes without releasing blocks a writer for its own
/// TTL, and no more than a second past it.
pub async fn crashed_reader_stops_blocking_a_writer_after_its_ttl(
    f: &dyn BackendFactory,
    ns: String,
) -> CaseResult {
    let mut req = LockRequest::new(name(&ns, "crashed-reader")?, f.short_ttl());
    req.kind = HoldKind::Shared;
    let b = client(f).await?;
    let (raw, grant) = raw_hold(f, &req).await?;
    let caps = raw.capabilities();
    drop(raw);
    replaced_after_ttl(req.ttl, &caps, grant.began, || b.lock(&req.name)).await
}

/// A reader that vanishes stops counting after its own TTL while another
/// reader keeps renewing: `inspect` then counts one shared hold, a writer
/// is still refused beside the live reader, and once that reader releases
/// a writer's single try is granted (nothing of the vanished reader is
/// left to block it).
pub async fn a_crashed_reader_beside_a_renewing_one_stops_counting_after_its_ttl(
    f: &dyn BackendFactory,
    ns: String,
) -> CaseResult {
    let ttl = f.renewed_ttl();
    let mut crashed = LockRequest::new(name(&ns, "crashed-beside")?, ttl);
    crashed.kind = HoldKind::Shared;
    let (raw, _) = raw_hold(f, &crashed).await?;
    drop(raw);
    let lock = crashed.name;
    let live = client(f).await?;
    let g = live
        .lock(&lock)
        .shared()
        .ttl(ttl)
        .try_acquire()
        .await?
        .ok_or("the renewing reader was refused beside the other reader")?;
    // The vanished reader's TTL passes twice over, and a second more; a
    // server that ends leases by itself (etcd's lessor) may take a moment
    // longer under load, so the count is watched for a bounded while.
    tokio::time::sleep(ttl * 2 + Duration::from_secs(1)).await;
    let watched = Instant::now();
    loop {
        ensure!(g.is_held(), "the renewing reader lost its hold");
        let s = live.backend().inspect(&lock).await?;
        ensure!(s.held, "past the vanished reader's TTL inspect said {s:?}");
        if s.shared == Some(1) {
            break;
        }
        ensure!(
            watched.elapsed() < BOUND,
            "{BOUND:?} after the vanished reader's TTL passed twice inspect still said {s:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let writer = client(f).await?;
    ensure!(
        try_exclusive(&writer, &lock).await?.is_none(),
        "a writer was granted beside the renewing reader"
    );
    g.release().await?;
    let w = try_exclusive(&writer, &lock)
        .await?
        .ok_or("the vanished reader still blocked a writer after the live one left")?;
    w.release().await?;
    Ok(Completion::Completed)
}

/// A writer waits behind two readers: one with a long TTL, and one that
/// vanished with the expiry cases' short TTL still running. The long one
/// releases, which leaves the name shared only until the vanished reader's
/// TTL ends: the writer is granted then, no later than a second past it
/// (and the backend's declared expiry lag), not at the long reader's end
/// nor at a bound of its own long TTL.
pub async fn a_writer_behind_a_released_and_a_vanished_reader_goes_at_the_vanished_ones_ttl(
    f: &dyn BackendFactory,
    ns: String,
) -> CaseResult {
    let lock = name(&ns, "left-and-vanished")?;
    let ttl = f.short_ttl();
    let readers = client(f).await?;
    let kept = try_shared(&readers, &lock)
        .await?
        .ok_or("the first reader was refused")?;
    let mut vanished = LockRequest::new(lock.clone(), ttl);
    vanished.kind = HoldKind::Shared;
    let (raw, grant) = raw_hold(f, &vanished).await?;
    let caps = raw.capabilities();
    drop(raw);
    let writer = client(f).await?;
    let waiting = {
        let lock = lock.clone();
        tokio::spawn(async move {
            writer
                .lock(&lock)
                .ttl(LONG_TTL)
                .wait(LONG_TTL)
                .acquire()
                .await
        })
    };
    writer_shows_waiting(&readers, &lock).await?;
    kept.release().await?;
    let released = grant.began.elapsed();
    let g = waiting.await.map_err(|e| Failed::from(e.to_string()))??;
    let lived = grant.began.elapsed();
    ensure!(
        lived >= caps.safe_validity(ttl),
        "the writer was granted {lived:?} after the vanished reader's hold was asked for, before its holder's deadline ({ttl:?} TTL)"
    );
    // Past the vanished reader's TTL, or past the release if that came
    // later (a slow machine).
    let late = latest_replacement(&caps, ttl).max(released + Duration::from_secs(1));
    ensure!(
        lived <= late,
        "the writer was granted {lived:?} after the vanished reader's hold was asked for, more than a second past its {ttl:?} TTL{} (the other reader released at {released:?})",
        lag_note(&caps, ttl)
    );
    g.release().await?;
    Ok(Completion::Completed)
}

/// A writer whose wait runs out, and one whose wait is cancelled, leave
/// nothing that holds new readers back.
pub async fn a_writer_that_gives_up_leaves_no_mark(
    f: &dyn BackendFactory,
    ns: String,
) -> CaseResult {
    let lock = name(&ns, "gives-up")?;
    let (r1, w, r2) = (client(f).await?, client(f).await?, client(f).await?);
    let first = try_shared(&r1, &lock)
        .await?
        .ok_or("the reader was refused")?;
    match w
        .lock(&lock)
        .ttl(LONG_TTL)
        .wait(Duration::from_millis(400))
        .acquire()
        .await
    {
        Err(Error::WaitTimeout { .. }) => {}
        other => {
            return Err(format!("the writer's wait behind a reader ended with {other:?}").into())
        }
    }
    let second = try_shared(&r2, &lock)
        .await?
        .ok_or("a reader was refused after the waiting writer timed out")?;
    second.release().await?;
    let cancelled = tokio::time::timeout(
        Duration::from_millis(400),
        w.lock(&lock).ttl(LONG_TTL).acquire(),
    )
    .await;
    ensure!(
        cancelled.is_err(),
        "the writer's wait behind a reader finished"
    );
    // The cancelled wait's cleanup runs in the background.
    let start = Instant::now();
    loop {
        if let Some(g) = try_shared(&r2, &lock).await? {
            g.release().await?;
            break;
        }
        ensure!(
            start.elapsed() < Duration::from_secs(5),
            "readers were still held back 5 s after the writer's wait was cancelled"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    first.release().await?;
    let writer = try_exclusive(&w, &lock)
        .await?
        .ok_or("the writer was refused once the reader released")?;
    writer.release().await?;
    Ok(Completion::Completed)
}

/// A holder that holds the name shared and asks for it exclusively gets
/// `UpgradeRefused` and keeps its shared hold; a holder that holds it
/// exclusively and asks for it shared nests into its exclusive hold. A
/// semaphore builder cannot be shared.
pub async fn upgrade_is_refused_and_an_exclusive_holder_nests_a_shared_request(
    f: &dyn BackendFactory,
    ns: String,
) -> CaseResult {
    let lock = name(&ns, "upgrade")?;
    let (a, other) = (client(f).await?, client(f).await?);
    let reader = a
        .lock(&lock)
        .shared()
        .holder("job")
        .ttl(LONG_TTL)
        .acquire()
        .await?;
    match a
        .lock(&lock)
        .holder("job")
        .ttl(LONG_TTL)
        .try_acquire()
        .await
    {
        Err(Error::UpgradeRefused { name, holder }) => ensure!(
            name == lock && holder == "job",
            "UpgradeRefused named {name} and {holder}"
        ),
        other => return Err(format!("an upgrade gave {other:?}").into()),
    }
    ensure!(reader.is_held(), "the refused upgrade lost the shared hold");
    ensure!(
        try_exclusive(&other, &lock).await?.is_none(),
        "the shared hold no longer kept writers out after a refused upgrade"
    );
    reader.release().await?;
    let writer = a.lock(&lock).holder("job").ttl(LONG_TTL).acquire().await?;
    let nested = a
        .lock(&lock)
        .shared()
        .holder("job")
        .ttl(LONG_TTL)
        .try_acquire()
        .await?
        .ok_or("the exclusive holder's shared request was refused")?;
    ensure!(
        nested.token() == writer.token(),
        "the nested shared request got its own token {} beside {}",
        nested.token(),
        writer.token()
    );
    nested.release().await?;
    ensure!(
        try_shared(&other, &lock).await?.is_none(),
        "releasing the nested shared request freed the exclusive hold"
    );
    writer.release().await?;
    match a.semaphore(&lock, 2).shared().try_acquire().await {
        Err(Error::InvalidInput {
            kind: InputKind::Config,
            ..
        }) => {}
        other => return Err(format!("a shared semaphore request gave {other:?}").into()),
    }
    Ok(Completion::Completed)
}

/// Every grant of the name, shared or exclusive, gets a token above every
/// earlier grant's.
pub async fn tokens_rise_across_shared_and_exclusive_holds(
    f: &dyn BackendFactory,
    ns: String,
) -> CaseResult {
    let lock = name(&ns, "tokens")?;
    let (a, b) = (client(f).await?, client(f).await?);
    if a.capabilities().fencing == Fencing::None {
        return Ok(Completion::ignored_with(
            "the backend declares no fencing tokens",
        ));
    }
    let mut seen = Vec::new();
    for _ in 0..2 {
        let r1 = try_shared(&a, &lock).await?.ok_or("a reader was refused")?;
        let r2 = try_shared(&b, &lock).await?.ok_or("a reader was refused")?;
        seen.extend([r1.token(), r2.token()]);
        r1.release().await?;
        r2.release().await?;
        let w = try_exclusive(&a, &lock)
            .await?
            .ok_or("the writer was refused")?;
        seen.push(w.token());
        w.release().await?;
    }
    ensure!(
        seen.windows(2).all(|p| p[0] < p[1]),
        "tokens in grant order (reader, reader, writer, ...) did not rise: {seen:?}"
    );
    Ok(Completion::Completed)
}

/// A shared hold with a short TTL is renewed past several TTLs and keeps
/// writers out; when an operator removes it, its guard reports it lost.
pub async fn shared_hold_is_renewed_and_sees_lost_when_evicted(
    f: &dyn BackendFactory,
    ns: String,
) -> CaseResult {
    let lock = name(&ns, "renewed")?;
    let ttl = f.renewed_ttl();
    let (a, b) = (client(f).await?, client(f).await?);
    let g = a.lock(&lock).shared().ttl(ttl).acquire().await?;
    tokio::time::sleep(ttl * 3).await;
    ensure!(g.is_held(), "the renewed shared hold was lost");
    ensure!(
        try_exclusive(&b, &lock).await?.is_none(),
        "a writer got the lock while a renewed reader held it"
    );
    if !f.can_evict() {
        g.release().await?;
        return Ok(Completion::ignored_with(
            "renewal checked; the eviction half needs a factory that can evict a holder",
        ));
    }
    f.evict(&lock).await?;
    let reason = tokio::time::timeout(ttl * 2 + BOUND, g.lost())
        .await
        .map_err(|_| Failed::from("lost() did not fire after the shared hold was removed"))?;
    ensure!(
        matches!(
            reason,
            LostReason::RenewalRejected | LostReason::SessionLost(_)
        ),
        "lost() said {reason:?}"
    );
    let w = b.lock(&lock).ttl(LONG_TTL).wait(BOUND).acquire().await?;
    w.release().await?;
    Ok(Completion::Completed)
}

/// `inspect` counts the shared holds and says whether a writer waits.
pub async fn inspect_reports_shared_holders_and_a_waiting_writer(
    f: &dyn BackendFactory,
    ns: String,
) -> CaseResult {
    let lock = name(&ns, "inspect")?;
    let (a, b, w) = (client(f).await?, client(f).await?, client(f).await?);
    let ra = try_shared(&a, &lock).await?.ok_or("a reader was refused")?;
    let rb = try_shared(&b, &lock).await?.ok_or("a reader was refused")?;
    let s = a.backend().inspect(&lock).await?;
    ensure!(
        s.held && s.shared == Some(2) && s.writer_waiting == Some(false),
        "with two readers inspect said {s:?}"
    );
    let waiting = {
        let (w, lock) = (w.clone(), lock.clone());
        tokio::spawn(async move { w.lock(&lock).ttl(LONG_TTL).wait(BOUND).acquire().await })
    };
    writer_shows_waiting(&a, &lock).await?;
    ra.release().await?;
    rb.release().await?;
    let writer = waiting.await.map_err(|e| Failed::from(e.to_string()))??;
    let s = a.backend().inspect(&lock).await?;
    ensure!(
        s.held && s.shared == Some(0) && s.writer_waiting == Some(false),
        "with the writer holding inspect said {s:?}"
    );
    writer.release().await?;
    let s = a.backend().inspect(&lock).await?;
    ensure!(
        !s.held && s.shared == Some(0),
        "after every release inspect said {s:?}"
    );
    Ok(Completion::Completed)
}

/// Whether `f` declares shared holds; the verdict for its cases if not.
pub(crate) async fn unsupported(f: &dyn BackendFactory) -> Result<Option<Completion>, Failed> {
    let caps = f.client().await?.capabilities();
    Ok((!caps.supports(&HoldKind::Shared)).then(|| {
        Completion::ignored_with(format!(
            "{} does not declare shared holds (Capabilities::shared)",
            caps.backend
        ))
    }))
}
