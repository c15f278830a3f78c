//! The [`BackendFactory`] of a backend behind servers the harness starts.
//!
//! The servers start on first use, so filtering a run down to one backend
//! starts nothing else, and they live as long as the factory: `run_suite`
//! drops it, stopping them, before the process exits.

use std::fmt;
use std::marker::PhantomData;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use distlock_core::{async_trait, Backend, DynBackend, Error, LockName};
use libtest_mimic::Failed;

use crate::harness::{ServerKind, ServerProcess, TestServer};
use crate::BackendFactory;

/// A backend the suite opens from a URL and can evict a lock from behind its
/// holder's back.
#[async_trait]
pub trait UrlBackend: Backend + Sized + 'static {
    /// Connects as a new client.
    async fn connect(url: &str) -> distlock_core::Result<Self>;
    /// Deletes the lock's state; `false` if there was none.
    async fn evict(&self, name: &LockName) -> distlock_core::Result<bool>;
}

macro_rules! url_backend {
    ($($backend:ty),+) => {$(
        #[async_trait]
        impl UrlBackend for $backend {
            async fn connect(url: &str) -> distlock_core::Result<Self> {
                <$backend>::connect(url).await
            }
            async fn evict(&self, name: &LockName) -> distlock_core::Result<bool> {
                <$backend>::evict(self, name).await
            }
        }
    )+};
}

url_backend!(
    distlock_etcd::EtcdBackend,
    distlock_zookeeper::ZooKeeperBackend,
    distlock_redis::RedisBackend,
    distlock_redlock::RedlockBackend
);

/// What a factory started, kept running until the factory drops.
#[derive(Debug)]
pub struct Servers {
    url: String,
    server: Option<TestServer>,
    // Held for their Drop, which stops them.
    _processes: Vec<ServerProcess>,
}

impl Servers {
    /// One server, reached at its own URL.
    pub fn server(server: TestServer) -> Self {
        Self::server_at(server.url().to_string(), server)
    }

    /// One server, reached at `url`.
    pub fn server_at(url: String, server: TestServer) -> Self {
        Self {
            url,
            server: Some(server),
            _processes: Vec::new(),
        }
    }

    /// Server processes reached together at `url` (a cluster, Redlock's
    /// nodes, a TLS server).
    pub fn processes(url: String, processes: Vec<ServerProcess>) -> Self {
        Self {
            url,
            server: None,
            _processes: processes,
        }
    }
}

type Start = dyn Fn() -> Result<Servers, String> + Send + Sync;

/// Hands out clients of backend `B` on servers that `start` provides.
pub struct ServerFactory<B> {
    name: &'static str,
    start: Arc<Start>,
    started: Arc<OnceLock<Result<Servers, String>>>,
    url_suffix: &'static str,
    short_ttl: Duration,
    backend: PhantomData<fn() -> B>,
}

impl<B> fmt::Debug for ServerFactory<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ServerFactory")
            .field("name", &self.name)
            .field("started", &self.started.get())
            .field("url_suffix", &self.url_suffix)
            .field("short_ttl", &self.short_ttl)
            .finish_non_exhaustive()
    }
}

impl<B: UrlBackend> ServerFactory<B> {
    /// A factory named `name` (the trials' prefix) whose servers `start`
    /// provides on first use.
    pub fn new(
        name: &'static str,
        start: impl Fn() -> Result<Servers, String> + Send + Sync + 'static,
    ) -> Self {
        Self {
            name,
            start: Arc::new(start),
            started: Arc::new(OnceLock::new()),
            url_suffix: "",
            // BackendFactory's default.
            short_ttl: Duration::from_millis(600),
            backend: PhantomData,
        }
    }

    /// A factory on the suite's server of `kind` ([`TestServer::start`]).
    pub fn of_kind(name: &'static str, kind: ServerKind) -> Self {
        Self::new(name, move || {
            TestServer::start(kind)
                .map(Servers::server)
                .map_err(|e| e.to_string())
        })
    }

    /// Appends `suffix` to the servers' URL in every client it opens.
    pub fn url_suffix(mut self, suffix: &'static str) -> Self {
        self.url_suffix = suffix;
        self
    }

    /// The TTL of the suite's expiry cases on this backend.
    pub fn short_ttl(mut self, ttl: Duration) -> Self {
        self.short_ttl = ttl;
        self
    }

    /// Another factory, named `name`, on the same servers (started once for
    /// both), with its own URL suffix.
    pub fn sharing(&self, name: &'static str, url_suffix: &'static str) -> Self {
        Self {
            name,
            start: self.start.clone(),
            started: self.started.clone(),
            url_suffix,
            short_ttl: self.short_ttl,
            backend: PhantomData,
        }
    }

    fn servers(&self) -> Result<&Servers, Failed> {
        self.started
            .get_or_init(|| (self.start)())
            .as_ref()
            .map_err(|e| Failed::from(e.as_str()))
    }

    /// The URL its clients connect to, starting the servers on first use.
    pub fn url(&self) -> Result<String, Failed> {
        Ok(format!("{}{}", self.servers()?.url, self.url_suffix))
    }

    /// `host:port` of its server, as ZooKeeper's connect string and the
    /// servers' own CLIs take it.
    pub fn host_port(&self) -> Result<String, Failed> {
        let s = self
            .servers()?
            .server
            .as_ref()
            .ok_or("these servers have no single host:port")?;
        Ok(format!("{}:{}", s.host(), s.port()))
    }

    /// A new client of the concrete backend type.
    pub async fn backend(&self) -> Result<B, Failed> {
        Ok(B::connect(&self.url()?).await?)
    }
}

#[async_trait]
impl<B: UrlBackend> BackendFactory for ServerFactory<B> {
    fn name(&self) -> &'static str {
        self.name
    }
    async fn client(&self) -> distlock_core::Result<DynBackend> {
        let url = self
            .url()
            .map_err(|e| Error::unavailable("test", format!("{e:?}"), None))?;
        Ok(Arc::new(B::connect(&url).await?))
    }
    async fn evict(&self, name: &LockName) -> Result<(), Failed> {
        if self.backend().await?.evict(name).await? {
            Ok(())
        } else {
            Err(format!("nothing to evict for {name}").into())
        }
    }
    fn short_ttl(&self) -> Duration {
        self.short_ttl
    }
}

/// Clients alternately from `a` and from `b`, two factories on the same
/// servers (with and without `fifo`): the suite's safety cases must hold
/// across the mix. The next kind is kept per thread: each case runs on a
/// thread of its own and makes its clients there before it spawns its
/// tasks, so the clients of one case alternate.
pub struct Alternating {
    name: &'static str,
    a: Arc<dyn BackendFactory>,
    b: Arc<dyn BackendFactory>,
}

impl fmt::Debug for Alternating {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Alternating")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

thread_local! {
    static NEXT_IS_B: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

impl Alternating {
    /// The cases whose claims are safety.
    const SAFETY: [&'static str; 6] = [
        "::mutual_exclusion_under_contention",
        "::opposite_orders_never_deadlock_or_overlap",
        "::tokens_increase_across_holders",
        "::semaphore_never_has_more_than_its_limit_and_fills_it",
        "::readers_overlap_and_writers_exclude_everyone_under_contention",
        "::one_leader_at_a_time_among_many_campaigners",
    ];

    /// The safety cases on clients alternately of `a` and `b`, named
    /// `<name>::<case>`; evictions go through `a`.
    pub fn safety_trials(
        name: &'static str,
        a: Arc<dyn BackendFactory>,
        b: Arc<dyn BackendFactory>,
        rt: &tokio::runtime::Runtime,
    ) -> Vec<libtest_mimic::Trial> {
        crate::trials(Arc::new(Self { name, a, b }), rt)
            .into_iter()
            .filter(|t| Self::SAFETY.iter().any(|c| t.name().ends_with(c)))
            .collect()
    }
}

#[async_trait]
impl BackendFactory for Alternating {
    fn name(&self) -> &'static str {
        self.name
    }
    async fn client(&self) -> distlock_core::Result<DynBackend> {
        if NEXT_IS_B.with(|next| next.replace(!next.get())) {
            self.b.client().await
        } else {
            self.a.client().await
        }
    }
    async fn evict(&self, name: &LockName) -> Result<(), Failed> {
        self.a.evict(name).await
    }
    fn can_evict(&self) -> bool {
        self.a.can_evict()
    }
    fn short_ttl(&self) -> Duration {
        self.a.short_ttl().max(self.b.short_ttl())
    }
    fn renewed_ttl(&self) -> Duration {
        self.a.renewed_ttl().max(self.b.renewed_ttl())
    }
}
