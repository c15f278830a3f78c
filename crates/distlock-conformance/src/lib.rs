//! distlock's conformance suite: the claims every backend must meet, as
//! async cases generic over a [`BackendFactory`], and the runner that
//! registers them as libtest-mimic trials named `<backend>::<case>`.
//!
//! - [`cases`]: locks; [`semaphore`]: counting semaphores and
//!   [`rwlock`]: read-write locks (each for backends that declare them);
//!   [`multi`]: several locks at once; [`holder`]: holder info and
//!   `list`; [`election`]: elections.
//! - [`run_suite`]: the `main` of a backend's test file: every case for one
//!   factory, plus the file's own trials.
//! - [`self_check`]: deliberately broken backends the cases must fail on.
//!
//! A backend's test file is one factory and one call to [`run_suite`]:
//!
//! ```no_run
//! use std::sync::Arc;
//! use distlock_conformance::{async_trait, BackendFactory, Failed};
//! use distlock_core::{DynBackend, LockName, MemoryBackend};
//!
//! struct Memory(MemoryBackend);
//!
//! #[async_trait]
//! impl BackendFactory for Memory {
//!     fn name(&self) -> &'static str {
//!         "memory"
//!     }
//!     async fn client(&self) -> distlock_core::Result<DynBackend> {
//!         Ok(Arc::new(self.0.clone()))
//!     }
//!     async fn evict(&self, name: &LockName) -> Result<(), Failed> {
//!         self.0.evict(name);
//!         Ok(())
//!     }
//! }
//!
//! fn main() {
//!     distlock_conformance::run_suite(Arc::new(Memory(MemoryBackend::new())), |_| Vec::new())
//! }
//! ```

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use distlock_core::{DynBackend, LockName};
use libtest_mimic::Arguments;

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
pub mod election;
pub mod holder;
pub mod multi;
pub mod names;
pub mod rwlock;
pub mod self_check;
pub mod semaphore;

pub use distlock_core::async_trait;
pub use libtest_mimic::{Completion, Failed, Trial};

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

    /// Whether [`evict`](Self::evict) is allowed; the cases that need it
    /// are ignored where it is not (a deployment other users share).
    fn can_evict(&self) -> bool {
        true
    }

    /// A TTL short enough for expiry cases and long enough for the backend to
    /// honour it reliably on a loaded 2-core machine.
    fn short_ttl(&self) -> Duration {
        Duration::from_millis(600)
    }

    /// The TTL of the cases in which a hold outlives several TTLs by its
    /// renewals: a renewal goes out a third of the way through and must be
    /// answered before the end, so the TTL must outlast a stall of the
    /// machine or the server. At least [`short_ttl`](Self::short_ttl).
    fn renewed_ttl(&self) -> Duration {
        self.short_ttl().max(Duration::from_millis(1500))
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

/// The name of every case, in the suite's order.
pub fn case_names() -> impl Iterator<Item = &'static str> {
    all_cases().map(|(name, _, _)| name)
}

/// Every case, by name, with what it needs the backend to declare.
fn all_cases() -> impl Iterator<Item = (&'static str, CaseFn, Needs)> {
    let exclusive = cases::ALL.iter().map(|(n, f)| (*n, *f, Needs::Nothing));
    let multi = multi::ALL.iter().map(|(n, f)| (*n, *f, Needs::Nothing));
    let holders = holder::ALL.iter().map(|(n, f)| (*n, *f, Needs::Nothing));
    let names = names::ALL.iter().map(|(n, f)| (*n, *f, Needs::Nothing));
    let permits = semaphore::ALL
        .iter()
        .map(|(n, f)| (*n, *f, Needs::Semaphore));
    let shared = rwlock::ALL.iter().map(|(n, f)| (*n, *f, Needs::Shared));
    let elections = election::ALL
        .iter()
        .map(|(n, f)| (*n, *f, Needs::Elections));
    exclusive
        .chain(multi)
        .chain(holders)
        .chain(names)
        .chain(permits)
        .chain(shared)
        .chain(elections)
}

/// Runs one case in a fresh namespace, ignored when the backend does not
/// declare what it needs, bounded in time.
async fn run_case(factory: &dyn BackendFactory, f: CaseFn, needs: Needs) -> CaseResult {
    // The capability probe connects too: a server that never answers ends
    // the case within the same bound.
    let case = async {
        let unsupported = match needs {
            Needs::Nothing => None,
            Needs::Semaphore => semaphore::unsupported(factory).await?,
            Needs::Shared => rwlock::unsupported(factory).await?,
            Needs::Elections => election::unsupported(factory).await?,
        };
        match unsupported {
            Some(ignored) => Ok(ignored),
            None => f(factory, namespace()).await,
        }
    };
    bounded_by(case_bound(factory.short_ttl()), case).await
}

/// A case's run, failed if it has not finished within `CASE_BOUND`.
pub(crate) async fn bounded(case: impl std::future::Future<Output = CaseResult>) -> CaseResult {
    bounded_by(CASE_BOUND, case).await
}

async fn bounded_by(
    bound: Duration,
    case: impl std::future::Future<Output = CaseResult>,
) -> CaseResult {
    tokio::time::timeout(bound, case)
        .await
        .map_err(|_| Failed::from(format!("case did not finish within {bound:?}")))?
}

/// The longest a case may take with the default short TTLs.
const CASE_BOUND: Duration = Duration::from_secs(120);

/// The longest a case may take with `short_ttl`: the expiry cases wait a
/// few of them (and renew for six), so a longer one lengthens the bound.
fn case_bound(short_ttl: Duration) -> Duration {
    CASE_BOUND.max(short_ttl.saturating_mul(20))
}

/// Builds the trials for `factory`: every case, named
/// `<backend>::<case>`.
pub fn trials(factory: Arc<dyn BackendFactory>, rt: &tokio::runtime::Runtime) -> Vec<Trial> {
    let backend = factory.name();
    let skipped = skipped_by_env(backend);
    all_cases()
        .map(|(case, f, needs)| {
            let name = format!("{backend}::{case}");
            let factory = factory.clone();
            let handle = rt.handle().clone();
            let skip = skipped.clone();
            Trial::ignorable_test(name, move || {
                if let Some(why) = skip {
                    return Ok(Completion::ignored_with(why));
                }
                handle.block_on(run_case(&*factory, f, needs))
            })
        })
        .collect()
}

/// How one case ended in [`check_deployment`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// The claim held.
    Ok,
    /// The claim failed, and why.
    Failed(String),
    /// Not run, and why (the backend does not declare what it needs).
    Ignored(String),
}

/// Runs every case whose name contains `only` (all without it) against
/// `factory`, one after another, each in a random namespace of its own:
/// what `distlock conformance` does to a deployment. Hands each case's name
/// and verdict to `each` as it ends, and answers them all, in the suite's
/// order; when `each` answers `Break` (its reader went away), no further
/// case runs and the verdicts so far are the answer.
pub async fn check_deployment(
    factory: &dyn BackendFactory,
    only: Option<&str>,
    mut each: impl FnMut(&'static str, &Verdict) -> std::ops::ControlFlow<()>,
) -> Vec<(&'static str, Verdict)> {
    let mut verdicts = Vec::new();
    for (case, f, needs) in all_cases() {
        if only.is_some_and(|p| !case.contains(p)) {
            continue;
        }
        let verdict = match run_case(factory, f, needs).await {
            Ok(Completion::Completed) => Verdict::Ok,
            Ok(Completion::Ignored { reason }) => {
                Verdict::Ignored(reason.unwrap_or_else(|| "ignored".into()))
            }
            Err(e) => Verdict::Failed(e.message().unwrap_or("failed").to_string()),
        };
        let go_on = each(case, &verdict);
        verdicts.push((case, verdict));
        if go_on.is_break() {
            break;
        }
    }
    verdicts
}

/// Takes and releases one lock with each TTL the cases hold with (the
/// long one, [`short_ttl`](BackendFactory::short_ttl) and
/// [`renewed_ttl`](BackendFactory::renewed_ttl)), in a namespace of its
/// own. A deployment that refuses them (a read-only replica, a TTL outside
/// its session timeouts, a user without the rights) would fail nearly
/// every case the same way, most only at their time bound:
/// [`check_deployment`]'s callers ask this first.
pub async fn first_lock(factory: &dyn BackendFactory) -> distlock_core::Result<()> {
    let client = distlock_core::LockClient::from_dyn(factory.client().await?);
    let name = LockName::new(format!("{}/first", namespace()))?;
    let first = async {
        for ttl in [cases::LONG_TTL, factory.short_ttl(), factory.renewed_ttl()] {
            if let Some(g) = client.lock(&name).ttl(ttl).try_acquire().await? {
                g.release().await?;
            }
        }
        Ok(())
    };
    tokio::time::timeout(CASE_BOUND, first)
        .await
        .unwrap_or_else(|_| {
            Err(distlock_core::Error::unavailable(
                factory.name(),
                format!("a first lock did not answer within {CASE_BOUND:?}"),
                None,
            ))
        })
}

/// What a group of cases needs the backend to declare.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Needs {
    Nothing,
    Semaphore,
    Shared,
    Elections,
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
