//! Cases for queue backends (etcd, ZooKeeper), where each waiter watches
//! only its predecessor: a release wakes exactly one waiter, and losing the
//! cluster leader never breaks mutual exclusion.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use distlock_core::{DynBackend, Error, LockClient};
use libtest_mimic::Failed;
use tokio::time::Instant;

use crate::factory::UrlBackend;
use crate::harness::{HarnessError, ServerProcess};

/// A queue backend that counts how often its waiters were woken.
pub trait CountsWakeups: UrlBackend + Clone {
    /// Wake-ups of this client's waiters by a predecessor's deletion.
    fn wakeups(&self) -> u64;
}

impl CountsWakeups for distlock_etcd::EtcdBackend {
    fn wakeups(&self) -> u64 {
        distlock_etcd::EtcdBackend::wakeups(self)
    }
}

impl CountsWakeups for distlock_zookeeper::ZooKeeperBackend {
    fn wakeups(&self) -> u64 {
        distlock_zookeeper::ZooKeeperBackend::wakeups(self)
    }
}

/// A waiting client and how to read how often it was woken.
pub struct Waiter {
    /// The client.
    pub backend: DynBackend,
    /// Its count of predecessor wake-ups.
    pub wakeups: Box<dyn Fn() -> u64 + Send + Sync>,
}

impl std::fmt::Debug for Waiter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Waiter")
            .field("wakeups", &(self.wakeups)())
            .finish()
    }
}

/// Counts the queue entries (holder included) of a lock.
pub type QueueLen<'a> = Box<
    dyn Fn() -> Pin<Box<dyn Future<Output = Result<usize, Failed>> + Send + 'a>> + Send + Sync + 'a,
>;

/// `holder` holds `lock`; all `waiters` queue behind it; then each of the
/// releases that follow must wake exactly one waiter.
pub async fn each_release_wakes_one_waiter(
    holder: DynBackend,
    waiters: Vec<Waiter>,
    lock: &str,
    queue_len: QueueLen<'_>,
) -> Result<(), Failed> {
    let n = waiters.len();
    let g = LockClient::from_dyn(holder)
        .lock(lock)
        .ttl(Duration::from_secs(30))
        .acquire()
        .await?;
    let mut counters = Vec::new();
    let mut tasks = Vec::new();
    for w in waiters {
        counters.push(w.wakeups);
        let lock = lock.to_string();
        tasks.push(tokio::spawn(async move {
            let g = LockClient::from_dyn(w.backend)
                .lock(&lock)
                .ttl(Duration::from_secs(30))
                .acquire()
                .await?;
            tokio::time::sleep(Duration::from_millis(20)).await;
            g.release().await
        }));
    }
    let start = Instant::now();
    while queue_len().await? < n + 1 {
        if start.elapsed() > Duration::from_secs(30) {
            return Err(format!("the {n} waiters did not all queue").into());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    g.release().await?;
    for t in tasks {
        t.await.map_err(|e| e.to_string())??;
    }
    let wakeups: Vec<u64> = counters.iter().map(|c| c()).collect();
    let total: u64 = wakeups.iter().sum();
    if total != n as u64 || wakeups.iter().any(|w| *w != 1) {
        return Err(format!(
            "{n} releases caused {total} wake-ups ({wakeups:?}); expected one each"
        )
        .into());
    }
    Ok(())
}

/// [`each_release_wakes_one_waiter`] with `n` waiters and a holder, each a
/// client of its own at `url`.
pub async fn herd<B: CountsWakeups>(
    url: &str,
    n: usize,
    lock: &str,
    queue_len: QueueLen<'_>,
) -> Result<(), Failed> {
    let mut waiters = Vec::new();
    for _ in 0..n {
        let b = B::connect(url).await?;
        let counter = b.clone();
        waiters.push(Waiter {
            backend: Arc::new(b),
            wakeups: Box::new(move || counter.wakeups()),
        });
    }
    let holder = Arc::new(B::connect(url).await?);
    each_release_wakes_one_waiter(holder, waiters, lock, queue_len).await
}

/// `n` waiters, each a client of its own at `url`, queue one after another
/// (each starts once the one before it is in the queue) behind a holder of
/// the one permit of the semaphore `name`; the releases that follow must
/// hand the permit on in arrival order, and wake few waiters: two
/// wake-ups per release (the first waiter's, and the next one's as the
/// first claims its permit; a herd would wake every waiter behind).
/// `queue_len` counts the semaphore's contenders, holder included. Answers
/// the wake-ups counted.
pub async fn semaphore_grants_in_arrival_order<B: CountsWakeups>(
    url: &str,
    n: usize,
    name: &str,
    queue_len: QueueLen<'_>,
) -> Result<u64, Failed> {
    let ttl = Duration::from_secs(30);
    let holder = LockClient::new(B::connect(url).await?);
    let held = holder.semaphore(name, 1).ttl(ttl).acquire().await?;
    let order = Arc::new(std::sync::Mutex::new(Vec::new()));
    let (mut counters, mut tasks) = (Vec::new(), Vec::new());
    for i in 0..n {
        let b = B::connect(url).await?;
        let counter = b.clone();
        counters.push(counter);
        let (name, order) = (name.to_string(), order.clone());
        tasks.push(tokio::spawn(async move {
            let g = LockClient::new(b)
                .semaphore(&name, 1)
                .ttl(ttl)
                .wait(Duration::from_secs(60))
                .acquire()
                .await?;
            order
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .push(i);
            tokio::time::sleep(Duration::from_millis(20)).await;
            g.release().await.map(drop)
        }));
        let start = Instant::now();
        while queue_len().await? < i + 2 {
            if start.elapsed() > Duration::from_secs(30) {
                return Err(format!("waiter {i} did not queue").into());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    let before: u64 = counters.iter().map(CountsWakeups::wakeups).sum();
    held.release().await?;
    for t in tasks {
        t.await.map_err(|e| e.to_string())??;
    }
    let order = order
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .clone();
    if order != (0..n).collect::<Vec<_>>() {
        return Err(format!("permits out of arrival order: {order:?}").into());
    }
    let woken = counters.iter().map(CountsWakeups::wakeups).sum::<u64>() - before;
    // A few more than two per release are let pass: a spurious watch
    // event on a loaded machine is not a herd, which would be about n² / 2.
    let most = 2 * n as u64 + 5;
    if woken > most {
        return Err(
            format!("{n} releases caused {woken} wake-ups; expected at most {most}").into(),
        );
    }
    Ok(woken)
}

/// [`leader_loss_keeps_exclusion`] on the cluster that `start` starts: the
/// holder and the waiter connect at `url_of(host:port,host:port,...)`, and
/// `leader` names the client port of the member to kill.
pub async fn leader_killed<B: UrlBackend>(
    start: impl FnOnce() -> Result<Vec<ServerProcess>, HarnessError> + Send + 'static,
    url_of: impl FnOnce(&str) -> String,
    lock: &str,
    ttl: Duration,
    leader: impl FnOnce(&[ServerProcess]) -> Option<u16>,
) -> Result<(), Failed> {
    let members = tokio::task::spawn_blocking(start)
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| e.to_string())?;
    let hosts: Vec<String> = members
        .iter()
        .map(|m| format!("127.0.0.1:{}", m.port))
        .collect();
    let url = url_of(&hosts.join(","));
    let holder = Arc::new(B::connect(&url).await?);
    let waiter = Arc::new(B::connect(&url).await?);
    let result = leader_loss_keeps_exclusion(holder, waiter, lock, ttl, || {
        let port = leader(&members).ok_or("no leader found")?;
        let leader = members
            .iter()
            .find(|m| m.port == port)
            .ok_or("leader not among members")?;
        leader
            .signal("KILL")
            .map_err(|e| Failed::from(e.to_string()))
    })
    .await;
    drop(members);
    result
}

/// A holder holds and a waiter waits; `kill_leader` kills the cluster's
/// leader. The holder keeps the lock or sees `lost()`; the waiter gets it
/// only after the holder's hold ended, with a higher token.
pub async fn leader_loss_keeps_exclusion(
    holder: DynBackend,
    waiter: DynBackend,
    lock: &str,
    ttl: Duration,
    kill_leader: impl FnOnce() -> Result<(), Failed>,
) -> Result<(), Failed> {
    let g = LockClient::from_dyn(holder)
        .lock(lock)
        .ttl(ttl)
        .acquire()
        .await?;
    let first = g.token();
    let l2 = lock.to_string();
    let w = tokio::spawn(async move {
        let g = LockClient::from_dyn(waiter)
            .lock(&l2)
            .ttl(ttl)
            .wait(Duration::from_secs(90))
            .acquire()
            .await?;
        Ok::<_, Error>((Instant::now(), g))
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    kill_leader()?;
    // Hold on through the election, then release (or notice the loss).
    let hold_end = tokio::select! {
        reason = g.lost() => {
            eprintln!("note: the holder saw lost() during the election: {reason}");
            Instant::now()
        }
        () = tokio::time::sleep(Duration::from_secs(4)) => Instant::now(),
    };
    let still_held = g.is_held();
    let _ = g.release().await;
    let (got_at, g2) = tokio::time::timeout(Duration::from_secs(90), w)
        .await
        .map_err(|_| Failed::from("the waiter never got the lock after the leader was killed"))?
        .map_err(|e| e.to_string())??;
    if got_at < hold_end && still_held {
        return Err("the waiter got the lock while the holder still held it".into());
    }
    if g2.token() <= first {
        return Err(format!("token did not increase: {first} then {}", g2.token()).into());
    }
    g2.release().await?;
    Ok(())
}
