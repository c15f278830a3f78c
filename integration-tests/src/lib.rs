//! distlock's conformance suite and test harness.
//!
//! - [`cases`]: async test cases generic over a [`BackendFactory`]; every
//!   backend runs all of them.
//! - [`harness`]: starts real servers (redis-server, etcd, ZooKeeper,
//!   PostgreSQL, MariaDB) as local processes on loopback ports, or connects to
//!   servers named by `DISTLOCK_TEST_*` environment variables, or (feature
//!   `containers`) runs them in Docker.
//! - [`run_suite`]: registers every case for one backend as a libtest-mimic
//!   trial named `<backend>::<case>`, so `cargo test -p integration-tests --
//!   redis::` filters them.
//!
//! A backend's test file is one factory and one call to [`run_suite`]; see
//! `tests/memory.rs`.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use distlock_core::{async_trait, DynBackend, LockName};
use libtest_mimic::{Arguments, Completion, Failed, Trial};

/// A module's cases, by name, as `pub const ALL` (each case an `async fn`
/// of the module taking the factory and a namespace).
macro_rules! cases {
    ($($name:ident),* $(,)?) => {
        /// Every case of this module, by name.
        pub const ALL: &[(&str, $crate::CaseFn)] = &[
            $((stringify!($name), |f, ns| Box::pin($name(f, ns)))),*
        ];
    };
}

pub mod cases;
pub mod factory;
pub mod faults;
pub mod harness;
pub mod multi;
pub mod queue;
pub mod self_check;
pub mod semaphore;

/// What a case returns: `Ok(Completion::Completed)`, an ignore with the
/// capability it needs, or an error explaining the failed claim.
pub type CaseResult = Result<Completion, Failed>;

/// Hands out fresh, independent clients of one backend, as if each were a
/// separate process.
#[async_trait]
pub trait BackendFactory: Send + Sync + 'static {
    /// The backend name used in trial names (`memory`, `sqlite`, `postgres`,
    /// `mysql`, `redis`, `redlock`, `etcd`, `zookeeper`).
    fn name(&self) -> &'static str;

    /// A new client with its own connection (and session, where the backend
    /// has one). Starts the server on first use.
    async fn client(&self) -> distlock_core::Result<DynBackend>;

    /// Removes the lock's state behind its holder's back, as an operator or a
    /// failover would, so that the holder's next renewal is rejected.
    async fn evict(&self, name: &LockName) -> Result<(), Failed>;

    /// A TTL short enough for expiry cases and long enough for the backend to
    /// honour it reliably on a loaded 2-core machine.
    fn short_ttl(&self) -> Duration {
        Duration::from_millis(600)
    }
}

/// A random lock-name namespace, so cases run in parallel on one server
/// without flushing it.
pub fn namespace() -> String {
    let o = distlock_core::Owner::random();
    format!("conformance-{}", &o.to_string()[..8])
}

/// One conformance case.
pub type CaseFn = for<'a> fn(
    &'a dyn BackendFactory,
    String,
) -> std::pin::Pin<Box<dyn Future<Output = CaseResult> + Send + 'a>>;

/// Builds the trials for `factory`: every case in [`cases::ALL`] plus
/// `extra` (backend-specific trials, already named).
pub fn trials(factory: Arc<dyn BackendFactory>, rt: &tokio::runtime::Runtime) -> Vec<Trial> {
    let backend = factory.name();
    let skipped = skipped_by_env(backend);
    let exclusive = cases::ALL.iter().map(|c| (c, Needs::Nothing));
    let multi = multi::ALL.iter().map(|c| (c, Needs::Nothing));
    let permits = semaphore::ALL.iter().map(|c| (c, Needs::Semaphore));
    exclusive
        .chain(multi)
        .chain(permits)
        .map(|((case, f), needs)| {
            let name = format!("{backend}::{case}");
            let factory = factory.clone();
            let handle = rt.handle().clone();
            let f = *f;
            let skip = skipped.clone();
            Trial::ignorable_test(name, move || {
                if let Some(why) = skip {
                    return Ok(Completion::ignored_with(why));
                }
                handle.block_on(async move {
                    if needs == Needs::Semaphore {
                        if let Some(ignored) = semaphore::unsupported(&*factory).await? {
                            return Ok(ignored);
                        }
                    }
                    let ns = namespace();
                    tokio::time::timeout(Duration::from_secs(120), f(&*factory, ns))
                        .await
                        .map_err(|_| Failed::from("case did not finish within 120 s"))?
                })
            })
        })
        .collect()
}

/// What a group of cases needs the backend to declare.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Needs {
    Nothing,
    Semaphore,
}

/// A backend-specific trial: runs `fut` on the suite's runtime, bounded
/// like the conformance cases. The future is only polled when the trial runs.
pub fn trial<F>(rt: &tokio::runtime::Runtime, name: impl Into<String>, fut: F) -> Trial
where
    F: Future<Output = Result<(), Failed>> + Send + 'static,
{
    let handle = rt.handle().clone();
    Trial::test(name, move || {
        handle.block_on(async {
            tokio::time::timeout(Duration::from_secs(300), fut)
                .await
                .map_err(|_| Failed::from("trial did not finish within 300 s"))?
        })
    })
}

fn skipped_by_env(backend: &str) -> Option<String> {
    let list = std::env::var("DISTLOCK_TEST_SKIP").ok()?;
    list.split(',')
        .any(|b| b.trim() == backend)
        .then(|| format!("skipped because DISTLOCK_TEST_SKIP={list}"))
}

/// The `main` of a backend's test file: runs the conformance suite for
/// `factory` plus `extra` trials, then drops the factory (stopping its
/// servers) before exiting with the run's status.
pub fn run_suite(
    factory: Arc<dyn BackendFactory>,
    extra: impl FnOnce(&tokio::runtime::Runtime) -> Vec<Trial>,
) -> ! {
    init_tracing();
    let args = Arguments::from_args();
    let rt = runtime();
    let mut all = trials(factory.clone(), &rt);
    all.extend(extra(&rt));
    let conclusion = libtest_mimic::run(&args, all);
    drop(factory);
    drop(rt);
    conclusion.exit()
}

/// The multi-threaded runtime the trials share.
#[allow(clippy::expect_used)]
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .expect("building the tokio runtime for the test suite")
}

/// Logs to stderr, filtered by `RUST_LOG` (default: errors only; the suite
/// provokes lost locks on purpose, so warnings are expected).
pub fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("error"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_test_writer()
        .try_init();
}

/// Fails the case with a message unless `cond` holds.
#[macro_export]
macro_rules! ensure {
    ($cond:expr, $($msg:tt)+) => {
        if !$cond {
            return Err(libtest_mimic::Failed::from(format!($($msg)+)));
        }
    };
}
