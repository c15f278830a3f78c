//! Cases for backends whose waiters queue on the server, first come, first
//! served: grants in arrival order with one request per grant and per
//! release, a cut-off waiter that holds up the queue only until its entry
//! lapses, and a cancelled or timed-out waiter that leaves no entry. Each
//! runs on a lock, on a semaphore whose permits a holder takes all of, on
//! an election (the waiters campaign), or with readers waiting behind a
//! writer; readers never pass a writer queued before them.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use distlock_core::{Error, LockClient, LockGuard};
use libtest_mimic::Failed;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::harness::proxy::Proxy;

/// Opens a client of its own (its own connections) at a URL.
pub type Connect = Arc<
    dyn Fn(String) -> Pin<Box<dyn Future<Output = Result<LockClient, Failed>> + Send>>
        + Send
        + Sync,
>;

/// Reads a number from the server: the requests it has answered, or the
/// live entries of a lock's queue.
pub type Count = Arc<dyn Fn() -> Result<u64, Failed> + Send + Sync>;

const TTL: Duration = Duration::from_secs(30);

/// How soon a waiter that a release (or an eviction, or a leaving waiter)
/// must wake has to hold: well before it would come back by itself.
const WOKEN: Duration = Duration::from_secs(10);

/// What the waiters queue for: a lock, a semaphore of `limit` permits, an
/// election, or a lock they take shared (its holder exclusively).
#[derive(Clone, Debug)]
pub struct Queued {
    name: String,
    limit: Option<u32>,
    election: bool,
    shared: bool,
}

impl Queued {
    /// The semaphore `name` of `limit` permits.
    pub fn semaphore(name: &str, limit: u32) -> Self {
        Self {
            limit: Some(limit),
            ..Self::from(name)
        }
    }

    /// The election `name`.
    pub fn election(name: &str) -> Self {
        Self {
            election: true,
            ..Self::from(name)
        }
    }

    /// The lock `name`, which the waiters take shared.
    pub fn shared(name: &str) -> Self {
        Self {
            shared: true,
            ..Self::from(name)
        }
    }

    /// How many waiters can be granted at once: a grant may pass over
    /// fewer earlier waiters than this.
    fn reach(&self) -> usize {
        match self.limit {
            _ if self.shared => usize::MAX,
            Some(limit) => limit as usize,
            None => 1,
        }
    }

    /// Takes a hold through `client`, waiting up to `wait`.
    async fn take(&self, client: &LockClient, wait: Duration) -> distlock_core::Result<LockGuard> {
        if self.election {
            let e = client.election(&self.name).ttl(TTL).wait(wait);
            return Ok(e.campaign("queued").await?.into_guard());
        }
        let b = self.builder(client);
        let b = if self.shared { b.shared() } else { b };
        b.wait(wait).acquire().await
    }

    /// Tries once to take a hold through `client`.
    async fn try_take(&self, client: &LockClient) -> distlock_core::Result<Option<LockGuard>> {
        if self.election {
            let e = client.election(&self.name).ttl(TTL);
            return Ok(e.try_campaign("queued").await?.map(|l| l.into_guard()));
        }
        let b = self.builder(client);
        let b = if self.shared { b.shared() } else { b };
        b.try_acquire().await
    }

    fn builder(&self, client: &LockClient) -> distlock_core::LockBuilder {
        match self.limit {
            Some(limit) => client.semaphore(&self.name, limit),
            None => client.lock(&self.name),
        }
        .ttl(TTL)
    }

    /// Takes every permit (the lock, exclusively; the leadership) through
    /// `client`.
    async fn hold_all(&self, client: &LockClient) -> Result<Vec<LockGuard>, Failed> {
        let mut held = Vec::new();
        let holder = Self {
            shared: false,
            ..self.clone()
        };
        for _ in 0..self.limit.unwrap_or(1) {
            held.push(holder.take(client, Duration::from_secs(10)).await?);
        }
        Ok(held)
    }

    async fn release_all(held: Vec<LockGuard>) -> Result<(), Failed> {
        for g in held {
            g.release().await?;
        }
        Ok(())
    }
}

/// A lock.
impl From<&str> for Queued {
    fn from(name: &str) -> Self {
        Self {
            name: name.to_string(),
            limit: None,
            election: false,
            shared: false,
        }
    }
}

async fn until(
    what: &str,
    within: Duration,
    mut done: impl FnMut() -> Result<bool, Failed>,
) -> Result<(), Failed> {
    let start = Instant::now();
    while !done()? {
        if start.elapsed() > within {
            return Err(format!("{what} did not happen within {within:?}").into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}

/// `client` waits for `what` (for up to two minutes) in a task of its own;
/// answers once the queue holds `position` entries, this one last.
async fn queue_up(
    client: LockClient,
    what: &Queued,
    position: u64,
    queued: &Count,
) -> Result<JoinHandle<distlock_core::Result<LockGuard>>, Failed> {
    let what = what.clone();
    let waiting = tokio::spawn(async move { what.take(&client, Duration::from_secs(120)).await });
    until(
        &format!("waiter {position} queueing"),
        Duration::from_secs(20),
        || Ok(queued()? == position),
    )
    .await?;
    Ok(waiting)
}

/// `n` waiters, each a client of its own, queue one after another behind a
/// holder of every permit (each joins once the one before it is in the
/// queue); then the holder's releases and each grantee's release hand the
/// permits on. The grants must come in arrival order; for a semaphore of
/// `limit` permits, taken in the order of their fencing tokens (which rise
/// with each grant), no grant may go to a waiter with `limit` or more
/// earlier arrivals still waiting: the `k`-th grant goes to one of the
/// arrivals `0..k + limit` (the waiters within reach of the free permits
/// take them in the order they ask). The server must answer as many requests in that time as `expected` allows
/// (`requests` counts the requests clients send): where a release and a
/// grant are one request each, `2n + permits` exactly, so no waiter but
/// the next one asks.
pub async fn grants_in_arrival_order(
    connect: Connect,
    url: &str,
    what: impl Into<Queued>,
    n: usize,
    queued: Count,
    requests: Count,
    expected: std::ops::RangeInclusive<u64>,
) -> Result<(), Failed> {
    let what = what.into();
    let holder = connect(url.to_string()).await?;
    // A first hold and release of another name: whatever the server loads
    // on first use (Redis's scripts) is loaded before the count.
    let warm = Queued {
        name: format!("{}-warm-up", what.name),
        ..what.clone()
    };
    Queued::release_all(warm.hold_all(&holder).await?).await?;
    if warm.shared {
        warm.take(&holder, Duration::from_secs(10))
            .await?
            .release()
            .await?;
    }
    let held = what.hold_all(&holder).await?;
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for i in 0..n {
        let client = connect(url.to_string()).await?;
        let (what, order) = (what.clone(), order.clone());
        tasks.push(tokio::spawn(async move {
            let g = what.take(&client, Duration::from_secs(60)).await?;
            order.lock().map_err(|_| "poisoned")?.push((g.token(), i));
            g.release().await?;
            Ok::<(), Failed>(())
        }));
        let want = i as u64 + 1;
        until(
            &format!("waiter {i} queueing"),
            Duration::from_secs(20),
            || Ok(queued()? == want),
        )
        .await?;
    }
    // Each waiter subscribes after its first refusal and asks once more:
    // the count starts once those have landed.
    let before = settled(&requests).await?;
    Queued::release_all(held).await?;
    for t in tasks {
        t.await.map_err(|e| e.to_string())??;
    }
    // A release that returns at a majority (Redlock) sends the last node's
    // call after it; on a loaded machine it lands late. So the count waits
    // for the fewest requests expected (up to 10 s), then 600 ms more for
    // any beyond them.
    // Running out of time is not an error here: the count below says how
    // many landed.
    let _ = until(
        "the fewest requests expected",
        Duration::from_secs(10),
        || Ok(requests()? - before >= *expected.start()),
    )
    .await;
    tokio::time::sleep(Duration::from_millis(600)).await;
    let asked = requests()? - before;
    let mut order = order.lock().map_err(|_| "poisoned")?.clone();
    let reach = what.reach();
    if reach > 1 {
        // Holds side by side: the grants' order is their tokens'.
        order.sort();
        let order: Vec<usize> = order.into_iter().map(|(_, i)| i).collect();
        if order
            .iter()
            .enumerate()
            .any(|(k, i)| *i >= k.saturating_add(reach))
        {
            return Err(format!(
                "a grant passed over {reach} or more earlier waiters: {order:?} (by token)"
            )
            .into());
        }
        if order.len() != n {
            return Err(format!("{} grants for {n} waiters", order.len()).into());
        }
    } else {
        let order: Vec<usize> = order.into_iter().map(|(_, i)| i).collect();
        if order != (0..n).collect::<Vec<_>>() {
            return Err(format!("grants out of arrival order: {order:?}").into());
        }
    }
    if !expected.contains(&asked) {
        return Err(format!("{n} handoffs took {asked} requests; expected {expected:?}").into());
    }
    if queued()? != 0 {
        return Err(format!("{} queue entries left after every grant", queued()?).into());
    }
    Ok(())
}

/// What `requests` counts once it has not moved for 600 ms (at most 10 s
/// of waiting): the requests still in flight have landed.
pub async fn settled(requests: &Count) -> Result<u64, Failed> {
    let end = tokio::time::Instant::now() + Duration::from_secs(10);
    let (mut last, mut quiet) = (requests()?, 0);
    while quiet < 3 && tokio::time::Instant::now() < end {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let now = requests()?;
        quiet = if now == last { quiet + 1 } else { 0 };
        last = now;
    }
    Ok(last)
}

/// As many waiters as the semaphore `what` has permits queue one after
/// another behind a holder of every permit, which then releases them all at
/// once: each waiter must get a permit well before it would look again by
/// itself (`lease`, how long an entry outlives its waiter's last attempt, is
/// long), each waiter holding on to its permit, so that no grantee's release
/// passes a permit on.
pub async fn permits_freed_at_once_each_reach_a_waiter(
    connect: Connect,
    url: &str,
    what: Queued,
    lease: Duration,
    queued: Count,
) -> Result<(), Failed> {
    let holder = connect(url.to_string()).await?;
    let held = what.hold_all(&holder).await?;
    let mut waiting = Vec::new();
    for i in 0..held.len() {
        waiting.push(
            queue_up(
                connect(url.to_string()).await?,
                &what,
                i as u64 + 1,
                &queued,
            )
            .await?,
        );
    }
    for released in futures_util::future::join_all(held.into_iter().map(|g| g.release())).await {
        released?;
    }
    let within = lease / 6;
    let mut got = Vec::new();
    for (i, w) in waiting.into_iter().enumerate() {
        got.push(
            tokio::time::timeout(within, w)
                .await
                .map_err(|_| {
                    format!("waiter {i} had no permit {within:?} after every permit was freed")
                })?
                .map_err(|e| e.to_string())??,
        );
    }
    Queued::release_all(got).await
}

/// A waiter whose connections run through `proxies` (one per server it
/// talks to) queues first, another behind it; the proxies then drop
/// everything (the first waiter is cut off, as if killed) and the holder
/// releases (one permit). A try from another client must be refused while
/// the first waiter's turn lasts, and the second waiter must get the
/// lock once the first one's entry lapses: within `lease` (how long an
/// entry outlives its waiter's last attempt) and a bit more, never waiting
/// out its own wait.
pub async fn a_cut_off_waiter_holds_up_the_queue_only_until_its_entry_lapses(
    connect: Connect,
    url: &str,
    proxied_url: &str,
    proxies: &[Proxy],
    what: impl Into<Queued>,
    lease: Duration,
    queued: Count,
) -> Result<(), Failed> {
    let what = what.into();
    let holder = connect(url.to_string()).await?;
    let held = what.hold_all(&holder).await?;
    let first = queue_up(connect(proxied_url.to_string()).await?, &what, 1, &queued).await?;
    let waiting = queue_up(connect(url.to_string()).await?, &what, 2, &queued).await?;
    for proxy in proxies {
        proxy.set_blackhole(true);
    }
    let cut_at = Instant::now();
    // One permit: the cut-off waiter's turn, which passes on only when its
    // entry lapses.
    let mut held = held.into_iter();
    if let Some(g) = held.next() {
        g.release().await?;
    }
    // While the cut-off waiter's entry lives, its turn is kept: a try from
    // elsewhere is refused.
    let other = connect(url.to_string()).await?;
    if let Some(g) = what.try_take(&other).await? {
        g.release().await?;
        return Err("a try took the turn of a queued waiter whose entry still lives".into());
    }
    // Nor does a multi-lock that takes the name with another.
    if what.limit.is_none() && !what.shared && !what.election {
        let all = other
            .lock_all([what.name.clone(), format!("{}-other", what.name)])
            .ttl(TTL)
            .try_acquire()
            .await?;
        if let Some(g) = all {
            g.release().await?;
            return Err(
                "a multi-lock took the turn of a queued waiter whose entry still lives".into(),
            );
        }
    }
    let bound = lease + lease / 3 + Duration::from_secs(5);
    let got = tokio::time::timeout(bound, waiting)
        .await
        .map_err(|_| {
            format!("the waiter behind a cut-off one had no grant {bound:?} after the release")
        })?
        .map_err(|e| e.to_string())??;
    let took = cut_at.elapsed();
    got.release().await?;
    Queued::release_all(held.collect()).await?;
    first.abort();
    for proxy in proxies {
        proxy.set_blackhole(false);
    }
    if took > bound {
        return Err(format!("the grant came {took:?} after the cut").into());
    }
    Ok(())
}

/// A waiter that times out and one whose wait is dropped (cancelled) both
/// leave the queue at once: the waiter behind them gets the lock as soon as
/// the holder releases, though entries here outlive their waiters by far
/// more than the test waits (`lease`).
pub async fn a_cancelled_or_timed_out_waiter_leaves_no_entry(
    connect: Connect,
    url: &str,
    what: impl Into<Queued>,
    lease: Duration,
    queued: Count,
) -> Result<(), Failed> {
    let what = what.into();
    let holder = connect(url.to_string()).await?;
    let held = what.hold_all(&holder).await?;
    let timed_out = connect(url.to_string()).await?;
    match what.take(&timed_out, Duration::from_millis(300)).await {
        Err(Error::WaitTimeout { .. }) => {}
        other => return Err(format!("a wait behind a holder answered {other:?}").into()),
    }
    let left = queued()?;
    if left != 0 {
        return Err(format!("a timed-out waiter left {left} queue entries").into());
    }
    // A wait polled on the runtime and dropped where none runs (a
    // synchronous caller that gave up on it) leaves on the runtime it ran on.
    let dropped = connect(url.to_string()).await?;
    let mut wait = Box::pin(what.take(&dropped, Duration::from_secs(120)));
    tokio::select! {
        answer = &mut wait => {
            return Err(format!("a wait behind a holder answered {answer:?}").into())
        }
        queueing = until("a waiter queueing", Duration::from_secs(20), || Ok(queued()? == 1)) => queueing?,
    }
    std::thread::scope(|s| {
        s.spawn(move || drop(wait));
    });
    until(
        "the entry of a wait dropped outside a runtime going",
        lease / 4,
        || Ok(queued()? == 0),
    )
    .await?;
    let first = queue_up(connect(url.to_string()).await?, &what, 1, &queued).await?;
    let waiting = queue_up(connect(url.to_string()).await?, &what, 2, &queued).await?;
    first.abort();
    until(
        "the cancelled waiter's entry going",
        Duration::from_secs(10),
        || Ok(queued()? == 1),
    )
    .await?;
    // One permit, which the cancelled waiter would have been told of.
    let mut held = held.into_iter();
    if let Some(g) = held.next() {
        g.release().await?;
    }
    let within = lease / 4;
    let got = tokio::time::timeout(within, waiting)
        .await
        .map_err(|_| format!("the waiter behind a cancelled one had no grant within {within:?}"))?
        .map_err(|e| e.to_string())??;
    got.release().await?;
    Queued::release_all(held.collect()).await?;
    Ok(())
}

/// A wait dropped while its first attempt is still on its way leaves no
/// entry: `pause` holds the server back before the attempt and `resume`
/// lets it go on after the drop, so the attempt joins the queue after the
/// wait is gone. Entries here outlive their waiters by far more than the
/// test waits: once the holder releases, another client's try must get the
/// name at once.
pub async fn a_wait_dropped_before_its_first_answer_leaves_no_entry<P, R>(
    connect: Connect,
    url: &str,
    what: impl Into<Queued>,
    queued: Count,
    pause: impl FnOnce() -> P,
    resume: impl FnOnce() -> R,
) -> Result<(), Failed>
where
    P: std::future::Future<Output = Result<(), Failed>>,
    R: std::future::Future<Output = Result<(), Failed>>,
{
    let what = what.into();
    let holder = connect(url.to_string()).await?;
    let held = what.hold_all(&holder).await?;
    let waiter = connect(url.to_string()).await?;
    pause().await?;
    let wait = {
        let what = what.clone();
        tokio::spawn(async move { what.take(&waiter, Duration::from_secs(30)).await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    wait.abort();
    let dropped = wait.await;
    resume().await?;
    if let Ok(r) = dropped {
        return Err(format!("the wait ended before it was dropped: {r:?}").into());
    }
    until(
        "the dropped waiter's entry going",
        Duration::from_secs(10),
        || Ok(queued()? == 0),
    )
    .await?;
    Queued::release_all(held).await?;
    let other = connect(url.to_string()).await?;
    match what.try_take(&other).await? {
        Some(g) => g.release().await.map(|_| ()).map_err(Into::into),
        None => Err("a free name was refused after the dropped wait".into()),
    }
}

/// Behind a writer holding the lock, a reader and a writer queue, each a
/// client of its own. The holder's release lets the reader in; while it
/// holds, a shared try from elsewhere must be refused (the writer came
/// first), and a reader that waits now queues behind the writer. The
/// grants' fencing tokens must rise reader, writer, reader.
pub async fn readers_never_pass_a_queued_writer(
    connect: Connect,
    url: &str,
    lock: &str,
    queued: Count,
) -> Result<(), Failed> {
    let reader = Queued::shared(lock);
    let writer = Queued::from(lock);
    let holder = connect(url.to_string()).await?;
    let held = writer.hold_all(&holder).await?;
    let (granted, first_in) = tokio::sync::oneshot::channel();
    // The first reader holds until the third waiter has queued.
    let (done, release_first) = tokio::sync::oneshot::channel::<()>();
    let first = queue_up(connect(url.to_string()).await?, &reader, 1, &queued).await?;
    let first = tokio::spawn(async move {
        let g = first.await.map_err(|e| e.to_string())??;
        let _ = granted.send(());
        let _ = tokio::time::timeout(Duration::from_secs(30), release_first).await;
        let token = g.token();
        g.release().await?;
        Ok::<_, Failed>(token)
    });
    let second = queue_up(connect(url.to_string()).await?, &writer, 2, &queued).await?;
    Queued::release_all(held).await?;
    tokio::time::timeout(Duration::from_secs(10), first_in)
        .await
        .map_err(|_| "the first reader had no grant within 10 s of the release")?
        .map_err(|_| "the first reader's task ended without a grant")?;
    let other = connect(url.to_string()).await?;
    if let Some(g) = reader.try_take(&other).await? {
        g.release().await?;
        return Err("a shared try passed a writer queued before it".into());
    }
    let third = queue_up(connect(url.to_string()).await?, &reader, 2, &queued).await?;
    let _ = done.send(());
    let mut tokens = Vec::new();
    tokens.push(first.await.map_err(|e| e.to_string())??);
    for w in [second, third] {
        let g = tokio::time::timeout(Duration::from_secs(30), w)
            .await
            .map_err(|_| "a queued waiter had no grant within 30 s")?
            .map_err(|e| e.to_string())??;
        tokens.push(g.token());
        g.release().await?;
    }
    if !(tokens[0] < tokens[1] && tokens[1] < tokens[2]) {
        return Err(format!(
            "grants out of arrival order (reader, writer, reader): tokens {tokens:?}"
        )
        .into());
    }
    Ok(())
}

/// A writer queued behind holding readers, with a reader queued behind it,
/// gives up (its wait is dropped): the reader behind it joins the readers
/// holding at once. Entries here last a minute, so a reader nobody told
/// would come back only when it renews its entry (after 20 s); it must
/// hold within `WOKEN`.
pub async fn a_writer_that_leaves_lets_the_readers_behind_it_in(
    connect: Connect,
    url: &str,
    lock: &str,
    queued: Count,
) -> Result<(), Failed> {
    let reader = Queued::shared(lock);
    let holder = connect(url.to_string()).await?;
    let held = reader.take(&holder, Duration::from_secs(10)).await?;
    let writer = queue_up(
        connect(url.to_string()).await?,
        &Queued::from(lock),
        1,
        &queued,
    )
    .await?;
    let waiting = queue_up(connect(url.to_string()).await?, &reader, 2, &queued).await?;
    writer.abort();
    let got = tokio::time::timeout(WOKEN, waiting)
        .await
        .map_err(|_| format!("the reader behind a writer that left did not hold within {WOKEN:?}"))?
        .map_err(|e| e.to_string())??;
    got.release().await?;
    held.release().await?;
    Ok(())
}

/// A leader taken away by an operator hands the election on at once: the
/// eviction wakes the campaigner at the head of the queue. Entries here
/// last a minute and the leader's lease 30 s, so a head the eviction did
/// not wake would come back only after 20 s (when it renews its entry) or
/// more; it must lead within `WOKEN`.
pub async fn an_eviction_wakes_the_queued_head<E, F>(
    connect: Connect,
    url: &str,
    name: &str,
    queued: Count,
    evict: E,
) -> Result<(), Failed>
where
    E: FnOnce() -> F,
    F: Future<Output = Result<(), Failed>>,
{
    let what = Queued::election(name);
    let holder = connect(url.to_string()).await?;
    let held = what.hold_all(&holder).await?;
    let waiter = connect(url.to_string()).await?;
    let waiting = queue_up(waiter, &what, 1, &queued).await?;
    let token = held.first().ok_or("no leader")?.token();
    evict().await?;
    let led = tokio::time::timeout(WOKEN, waiting)
        .await
        .map_err(|_| {
            format!("the queued campaigner did not lead within {WOKEN:?} of the eviction")
        })?
        .map_err(|e| e.to_string())??;
    if led.token() <= token {
        return Err(format!(
            "the next leader's token {:?} is not above the evicted one's {token:?}",
            led.token()
        )
        .into());
    }
    led.release().await?;
    for g in held {
        // Evicted: its release finds nothing of its own to free.
        let _ = g.release().await;
    }
    Ok(())
}

/// A writer queued behind readers holds the lock as soon as the last of
/// them releases: that release wakes the head of the queue. Entries here
/// last a minute and the readers' leases 30 s, so a head nobody woke would
/// come back only when it renews its entry (after 20 s) or when the
/// readers' leases would have ended; it must hold within `WOKEN`.
pub async fn the_last_readers_release_wakes_a_queued_writer(
    connect: Connect,
    url: &str,
    lock: &str,
    queued: Count,
) -> Result<(), Failed> {
    let reader = Queued::shared(lock);
    let mut readers = Vec::new();
    for _ in 0..2 {
        let client = connect(url.to_string()).await?;
        readers.push(reader.take(&client, Duration::from_secs(10)).await?);
    }
    let waiting = queue_up(
        connect(url.to_string()).await?,
        &Queued::from(lock),
        1,
        &queued,
    )
    .await?;
    let last = readers.pop().ok_or("no reader")?;
    Queued::release_all(readers).await?;
    tokio::time::sleep(Duration::from_millis(300)).await;
    if waiting.is_finished() {
        return Err("the writer was granted while a reader still held the lock".into());
    }
    let token = last.token();
    last.release().await?;
    let held = tokio::time::timeout(WOKEN, waiting)
        .await
        .map_err(|_| {
            format!("the queued writer did not hold the lock within {WOKEN:?} of the last reader's release")
        })?
        .map_err(|e| e.to_string())??;
    // Token 0: a backend without fencing (Redlock's default).
    if u64::from(token) > 0 && held.token() <= token {
        return Err(format!(
            "the writer's token {:?} is not above the last reader's {token:?}",
            held.token()
        )
        .into());
    }
    held.release().await?;
    Ok(())
}
