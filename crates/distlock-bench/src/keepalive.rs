//! Scenario 7: the cost of keeping M locks alive in one client.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use distlock::{
    async_trait, AllAtOnce, Backend, Capabilities, DynBackend, Finding, Grant, LockClient,
    LockName, LockRequest, LockStatus, LostReason, Result,
};
use tokio::time::Instant;

use crate::BoxError;

/// Forwards to a backend and counts the requests core sends it.
#[derive(Debug)]
pub(crate) struct Counting {
    inner: DynBackend,
    pub(crate) acquires: AtomicU64,
    /// Renewal requests: one per `extend` call, one per `extend_many`
    /// call (core sends at most the backend's declared batch per call).
    pub(crate) extends: AtomicU64,
    /// Holds renewed, whether alone or in a batch.
    pub(crate) renewed: AtomicU64,
}

impl Counting {
    pub(crate) fn new(inner: DynBackend) -> Arc<Self> {
        Arc::new(Self {
            inner,
            acquires: AtomicU64::new(0),
            extends: AtomicU64::new(0),
            renewed: AtomicU64::new(0),
        })
    }
}

// A forwarding wrapper must forward everything: a default method left
// out silently changes what core does (a forgotten session_key costs
// memory per held lock: docs/benchmarks.md).
#[deny(clippy::missing_trait_methods)]
#[async_trait]
impl Backend for Counting {
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }
    async fn try_acquire(&self, req: &LockRequest) -> Result<Option<Grant>> {
        self.acquires.fetch_add(1, Ordering::Relaxed);
        self.inner.try_acquire(req).await
    }
    async fn acquire(&self, req: &LockRequest, deadline: Option<Instant>) -> Result<Grant> {
        self.acquires.fetch_add(1, Ordering::Relaxed);
        self.inner.acquire(req, deadline).await
    }
    async fn try_acquire_all(&self, reqs: &[LockRequest]) -> Result<AllAtOnce> {
        self.acquires.fetch_add(1, Ordering::Relaxed);
        self.inner.try_acquire_all(reqs).await
    }
    async fn extend(&self, req: &LockRequest) -> Result<bool> {
        self.extends.fetch_add(1, Ordering::Relaxed);
        self.renewed.fetch_add(1, Ordering::Relaxed);
        self.inner.extend(req).await
    }
    async fn extend_many(&self, reqs: &[LockRequest]) -> Result<Vec<bool>> {
        self.extends.fetch_add(1, Ordering::Relaxed);
        self.renewed.fetch_add(reqs.len() as u64, Ordering::Relaxed);
        self.inner.extend_many(reqs).await
    }
    async fn release(&self, req: &LockRequest) -> Result<bool> {
        self.inner.release(req).await
    }
    async fn session_lost(&self, req: &LockRequest) -> LostReason {
        self.inner.session_lost(req).await
    }
    // Forwarded too: without them core would watch every hold's session on
    // its own (a task and a future per hold) instead of each session once.
    fn session_key(&self, req: &LockRequest) -> Option<u64> {
        self.inner.session_key(req)
    }
    async fn session_ended(&self, key: u64) -> LostReason {
        self.inner.session_ended(key).await
    }
    async fn inspect(&self, name: &LockName) -> Result<LockStatus> {
        self.inner.inspect(name).await
    }
    async fn inspect_permits(&self, name: &LockName) -> Result<LockStatus> {
        self.inner.inspect_permits(name).await
    }
    async fn set_limit(&self, name: &LockName, limit: u32) -> Result<Option<u32>> {
        self.inner.set_limit(name, limit).await
    }
    async fn deployment_findings(&self) -> Result<Vec<Finding>> {
        self.inner.deployment_findings().await
    }
    async fn list(&self, prefix: &str, limit: usize) -> Result<Vec<distlock::HoldRecord>> {
        self.inner.list(prefix, limit).await
    }
    async fn proclaim(&self, req: &LockRequest, value: &str) -> Result<bool> {
        self.inner.proclaim(req, value).await
    }
    async fn leader(&self, name: &LockName) -> Result<Option<distlock::Leader>> {
        self.inner.leader(name).await
    }
    async fn observe_leader(&self, name: &LockName) -> Result<Option<distlock::LeaderStream>> {
        self.inner.observe_leader(name).await
    }
}

/// Resident set size of this process, in bytes.
pub(crate) fn rss() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<u64>().ok())
        })
        .map_or(0, |kb| kb * 1024)
}

/// What holding M locks cost.
#[derive(Debug)]
pub(crate) struct KeepAlive {
    pub(crate) bytes_per_lock: f64,
    pub(crate) renewals_per_period: f64,
    pub(crate) renewed_per_period: f64,
    pub(crate) acquire_secs: f64,
}

/// Acquires `m` locks in one client with TTL `ttl`, holds them for three
/// renewal periods (TTL/3 each), and reports the memory per held lock
/// (resident set against the same process, warmed up by 100 acquire +
/// release cycles, before acquiring) and the renewal requests sent per
/// renewal period.
///
/// With `limit`, the holds are permits: `m / limit` semaphores of `limit`
/// permits each, every permit held.
pub(crate) async fn keep_alive(
    backend: DynBackend,
    m: usize,
    ttl: Duration,
    tag: &str,
    limit: Option<u32>,
) -> std::result::Result<KeepAlive, BoxError> {
    let counting = Counting::new(backend);
    let client = LockClient::from_dyn(counting.clone());
    // "The same process holding none": connected, with its session (etcd
    // lease, ZooKeeper session) and buffers set up by some acquires, so
    // that one-off setup is not counted as the held locks' cost.
    for i in 0..100 {
        crate::cycle(&client, &format!("bench/{tag}/warmup/{i}")).await?;
    }
    let before = rss();
    let started = Instant::now();
    let mut guards = Vec::with_capacity(m);
    for i in 0..m {
        let builder = match limit {
            Some(n) => client.semaphore(format!("bench/{tag}/permits/{}", i / n as usize), n),
            None => client.lock(format!("bench/{tag}/held/{i}")),
        };
        let g = builder.ttl(ttl).try_acquire().await?.ok_or("lock busy")?;
        guards.push(g);
    }
    let acquire_secs = started.elapsed().as_secs_f64();
    let extends_before = counting.extends.load(Ordering::Relaxed);
    let renewed_before = counting.renewed.load(Ordering::Relaxed);
    let periods = 3u32;
    tokio::time::sleep(ttl / 3 * periods).await;
    let extends = counting.extends.load(Ordering::Relaxed) - extends_before;
    let renewed = counting.renewed.load(Ordering::Relaxed) - renewed_before;
    let after = rss();
    let lost = guards.iter().filter(|g| !g.is_held()).count();
    for g in guards {
        let _ = g.release().await;
    }
    if lost > 0 {
        return Err(format!("{lost} of {m} held locks were lost while holding").into());
    }
    Ok(KeepAlive {
        bytes_per_lock: after.saturating_sub(before) as f64 / m as f64,
        renewals_per_period: extends as f64 / f64::from(periods),
        renewed_per_period: renewed as f64 / f64::from(periods),
        acquire_secs,
    })
}
