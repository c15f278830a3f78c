//! `distlock-bench`: distlock against the raw round trips each backend
//! needs, and against peer libraries, in one run.
//!
//! Scenarios: 1 round-trip calibration; 2 uncontended acquire+release
//! against the raw minimal sequence, for a lock, for a semaphore's
//! permit and for a shared hold (closed loop, and open loop at a fixed
//! rate); 3 throughput of 8 and 64 tasks on 8 to 1,000 names through one
//! client, against the raw sequence; 4 K clients on one name (fairness); 5 and
//! 6 handoff latency and the herd with 1, 10 and 100 waiters; 7 the cost
//! of holding M locks; multi: multi-locks of 1, 4 and 16 free names.
//! `--out DIR` also writes the tables as Markdown and the plots as SVG.

use std::fmt::Write as _;
use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use distlock::LockClient;
use futures_util::stream::{FuturesUnordered, StreamExt};
use hdrhistogram::Histogram;
use integration_tests::harness::{ServerKind, TestServer};
use tokio::time::Instant;

mod contention;
mod keepalive;
mod multi;
mod mysql;
mod peers;
mod plot;

pub(crate) type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// With this variable set to a URL, the binary does one acquire+release
/// there and exits (the process-level comparison with `etcdctl lock`).
pub(crate) const ONCE_ENV: &str = "DISTLOCK_BENCH_ONCE_URL";
pub(crate) type BoxFut<T> = std::pin::Pin<Box<dyn Future<Output = Result<T, BoxError>> + Send>>;

/// One measured operation, given the iteration number and a slot (which
/// name or key to use, so that concurrent callers do not contend).
pub(crate) type Step = Arc<dyn Fn(u32, usize) -> BoxFut<()> + Send + Sync>;

/// The raw lock sequence on a connection (or pool) of its own, distlock's
/// requests sent raw on it (where written), and a distlock client on that
/// pool where the target's distlock shares the raw sequences' pool
/// (PostgreSQL, MySQL; `None`: distlock connects by the URL).
pub(crate) struct Fresh {
    pub(crate) raw: Step,
    pub(crate) proto: Option<Step>,
    pub(crate) client: Option<LockClient>,
}

/// Makes a [`Fresh`] connection.
pub(crate) type Connect = Arc<dyn Fn() -> BoxFut<Fresh> + Send + Sync>;

/// `--fifo`, for the targets that build distlock's clients.
static FIFO: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

pub(crate) fn fifo() -> bool {
    FIFO.load(std::sync::atomic::Ordering::Relaxed)
}

/// A count the server keeps (requests served), read before and after a
/// scenario.
pub(crate) type Counter = Arc<dyn Fn() -> BoxFut<u64> + Send + Sync>;

#[derive(Parser, Debug)]
#[command(about = "distlock against raw round trips and peer libraries, per backend")]
struct Args {
    /// Measured iterations of the latency scenarios (after a tenth as many
    /// warm-up rounds).
    #[arg(long, default_value_t = 3000)]
    iterations: u32,
    /// Backends to run (sqlite, postgres, mysql, redis, redlock, etcd, zookeeper).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "sqlite,postgres,mysql,redis,redlock,etcd,zookeeper"
    )]
    backends: Vec<String>,
    /// Seconds each throughput scenario runs.
    #[arg(long, default_value_t = 3.0)]
    seconds: f64,
    /// Clients contending for one name (scenario 4).
    #[arg(long, default_value_t = 8)]
    clients: usize,
    /// Scenario 3's configurations to run, each TASKSxNAMESxCLIENTS (for
    /// example `64x64x4`); all of them when not given.
    #[arg(long, value_delimiter = ',')]
    throughput: Vec<String>,
    /// Scenario 3 runs only this side, and scenarios 4-6 do not run: for a
    /// profiler (such as `perf record -g`) watching the process.
    #[arg(long, value_enum)]
    profile_side: Option<contention::Side>,
    /// Waiter counts for the handoff and herd scenarios.
    #[arg(long, value_delimiter = ',', default_value = "1,10,100")]
    waiters: Vec<usize>,
    /// Handoffs measured per waiter count.
    #[arg(long, default_value_t = 200)]
    handoffs: u64,
    /// Locks held at once in scenario 7.
    #[arg(long, default_value_t = 10_000)]
    held: usize,
    /// Open-loop rate (operations per second) for scenario 2; 0 skips it.
    #[arg(long, default_value_t = 500)]
    rate: u32,
    /// Also run the peer libraries (redis-py, kazoo, etcdctl lock); needs
    /// `python3 -m pip install redis kazoo`.
    #[arg(long)]
    peers: bool,
    /// Redis, Redlock, PostgreSQL and MySQL: whether distlock's waiters queue, first come,
    /// first served (`fifo` in the backend URL; off by default, as in the
    /// backends).
    #[arg(long, default_value_t = false, action = clap::ArgAction::Set)]
    fifo: bool,
    /// What scenarios 4-6 (fairness, handoff and the herd) take turns on.
    #[arg(long, value_enum, default_value_t = contention::HandoffKind::Lock)]
    handoff_kind: contention::HandoffKind,
    /// A few seconds of everything, for CI: tiny sizes, no thresholds.
    #[arg(long)]
    smoke: bool,
    /// Write results.md and the SVG plots here.
    #[arg(long)]
    out: Option<PathBuf>,
    /// Run only these scenario groups: core (core's CPU cost per operation,
    /// in memory), 2 (uncontended, closed and open loop), 3 (scenarios
    /// 3-6), herd (scenarios 4-6: fairness, handoff and the herd), 7 (holding many locks), multi (multi-locks of 1, 4 and 16
    /// names), peers.
    #[arg(long, value_delimiter = ',', default_value = "core,2,3,7,multi,peers")]
    only: Vec<String>,
}

/// Latencies of one variant, in microseconds, and what its timed
/// operations cost this process (see [`usage`]).
struct Series {
    name: &'static str,
    hist: Histogram<u64>,
    cpu: Duration,
    blocked: i64,
    timed: u32,
}

/// This process's CPU time so far (user + system, every thread: the
/// runtime's workers and, for SQLite, the database) and how often its
/// threads blocked (voluntary context switches: a worker parking in
/// `epoll_wait` or a futex, to be woken again). Read around each timed
/// operation, outside its timing, so that each variant is charged for the
/// work and the waits its own operations cause.
pub(crate) fn usage() -> (Duration, i64) {
    use nix::sys::resource::{getrusage, UsageWho};
    use nix::sys::time::TimeValLike;
    getrusage(UsageWho::RUSAGE_SELF).map_or((Duration::ZERO, 0), |u| {
        let us = u.user_time().num_microseconds() + u.system_time().num_microseconds();
        (
            Duration::from_micros(u64::try_from(us).unwrap_or(0)),
            u.voluntary_context_switches(),
        )
    })
}

impl Series {
    fn new(name: &'static str) -> Result<Self, BoxError> {
        Ok(Self {
            name,
            hist: Histogram::new_with_bounds(1, 60_000_000, 3)?,
            cpu: Duration::ZERO,
            blocked: 0,
            timed: 0,
        })
    }

    async fn time<F: Future<Output = Result<(), BoxError>>>(
        &mut self,
        f: F,
    ) -> Result<(), BoxError> {
        let (cpu, blocked) = usage();
        let start = Instant::now();
        f.await?;
        let took = start.elapsed();
        let (cpu_after, blocked_after) = usage();
        self.cpu += cpu_after.saturating_sub(cpu);
        self.blocked += blocked_after - blocked;
        self.timed += 1;
        self.record(took)
    }

    /// Process CPU time per timed operation, in microseconds.
    fn cpu_per_op(&self) -> f64 {
        self.cpu.as_secs_f64() * 1e6 / f64::from(self.timed.max(1))
    }

    /// Thread blocks (voluntary context switches) per timed operation.
    fn blocked_per_op(&self) -> f64 {
        self.blocked as f64 / f64::from(self.timed.max(1))
    }

    fn record(&mut self, d: Duration) -> Result<(), BoxError> {
        let us = u64::try_from(d.as_micros()).unwrap_or(u64::MAX).max(1);
        self.hist.record(us)?;
        Ok(())
    }

    fn p(&self, q: f64) -> u64 {
        self.hist.value_at_quantile(q)
    }
}

/// One backend under test: its URL, the calibration and raw steps, and
/// how to count server requests.
struct Target {
    name: &'static str,
    url: String,
    rtt: Step,
    raw: Step,
    /// distlock's own requests for one acquire+release, sent with the same
    /// client crate and no distlock code around them (where written): the
    /// protocol's cost, apart from the client's.
    proto: Option<Step>,
    /// The minimal hand-written acquire + release of one permit of a
    /// semaphore of [`UNCONTENDED_LIMIT`], expiring by the server's clock,
    /// with the same client crate and connection as `raw`: the semaphore's
    /// baseline.
    raw_permit: Step,
    /// The minimal hand-written shared acquire + release (a read-write
    /// lock's reader, in the backend's own layout, so that its writers
    /// would exclude it), with the same client crate and connection as
    /// `raw`: the shared hold's baseline. `None` where not written; the
    /// shared variants then compare with `raw`.
    raw_shared: Option<Step>,
    requests: Option<Counter>,
    /// distlock on the raw sequences' own pool (PostgreSQL, MySQL), so
    /// that every variant meets the same connections: sqlx returns a
    /// connection to its pool in a task of its own, an acquire that comes
    /// first opens another, and the pool then hands its connections out in
    /// turn; a pool with more of them is slower per statement. `None`:
    /// distlock connects by the URL.
    client: Option<LockClient>,
    /// The raw lock sequence on a connection (or pool) of its own, for
    /// scenario 3 through several clients.
    fresh: Connect,
    _server: Option<TestServer>,
    _servers: Vec<TestServer>,
}

impl Target {
    /// The distlock client every scenario measures.
    async fn lib(&self) -> Result<LockClient, BoxError> {
        Ok(match &self.client {
            Some(c) => c.clone(),
            None if self.name == "redis" || self.name == "redlock" => {
                let url = format!("{}?fifo={}", self.url, fifo());
                LockClient::from_dyn(distlock::connect(&url).await?)
            }
            None => LockClient::from_dyn(distlock::connect(&self.url).await?),
        })
    }
}

/// Everything one run found, for the Markdown report and the plots.
#[derive(Default)]
struct Results {
    md: String,
    latency: Vec<(String, Vec<f64>)>,
    handoff: Vec<(String, Vec<Option<f64>>)>,
    rtt_p50: Vec<(String, f64)>,
    /// Per backend, distlock / its raw sequence at p50 in the uncontended
    /// closed loop: the lock's, the semaphore's, and the shared hold's
    /// (where the backend serves shared holds; against the raw lock
    /// sequence where no raw shared sequence is written, flagged `false`).
    ratios: Vec<Ratios>,
}

/// One backend's line of the summary table.
struct Ratios {
    name: String,
    lock: f64,
    permit: f64,
    /// The shared hold's ratio, and whether it is against a raw shared
    /// sequence (else against the raw lock sequence).
    shared: Option<(f64, bool)>,
}

/// One uncontended acquire + release with a 30 s TTL.
pub(crate) async fn cycle(lib: &LockClient, name: &str) -> Result<(), BoxError> {
    let g = lib
        .lock(name)
        .ttl(Duration::from_secs(30))
        .try_acquire()
        .await?
        .ok_or("lock busy")?;
    g.release().await?;
    Ok(())
}

fn lib_step(lib: &LockClient, tag: &str) -> Step {
    let (lib, tag) = (lib.clone(), tag.to_string());
    Arc::new(move |_, slot| {
        let (lib, name) = (lib.clone(), format!("bench/{tag}/uncontended/{slot}"));
        Box::pin(async move {
            crate::cycle(&lib, &name).await?;
            Ok(())
        })
    })
}

/// Permits per semaphore in the uncontended semaphore variants.
const UNCONTENDED_LIMIT: u32 = 3;

/// One uncontended permit acquire + release through the client.
fn lib_permit_step(lib: &LockClient, tag: &str) -> Step {
    let (lib, tag) = (lib.clone(), tag.to_string());
    Arc::new(move |_, slot| {
        let lib = lib.clone();
        let name = format!("bench/{tag}/uncontended-permit/{slot}");
        Box::pin(async move {
            let g = lib
                .semaphore(&name, UNCONTENDED_LIMIT)
                .ttl(Duration::from_secs(30))
                .try_acquire()
                .await?
                .ok_or("semaphore full")?;
            g.release().await?;
            Ok(())
        })
    })
}

/// One uncontended permit acquire + release through the backend alone.
fn backend_permit_step(lib: &LockClient, tag: &str) -> Step {
    let (backend, tag) = (lib.backend().clone(), tag.to_string());
    Arc::new(move |_, slot| {
        let backend = backend.clone();
        let name = format!("bench/{tag}/backend-alone/uncontended-permit/{slot}");
        Box::pin(async move {
            let req = distlock::LockRequest::permit(
                distlock::LockName::new(&name)?,
                Duration::from_secs(30),
                UNCONTENDED_LIMIT,
            );
            backend.try_acquire(&req).await?.ok_or("semaphore full")?;
            backend.release(&req).await?;
            Ok(())
        })
    })
}

/// One uncontended shared acquire + release (a read-write lock's reader)
/// through the client.
fn lib_shared_step(lib: &LockClient, tag: &str) -> Step {
    let (lib, tag) = (lib.clone(), tag.to_string());
    Arc::new(move |_, slot| {
        let lib = lib.clone();
        let name = format!("bench/{tag}/uncontended-shared/{slot}");
        Box::pin(async move {
            let g = lib
                .lock(&name)
                .shared()
                .ttl(Duration::from_secs(30))
                .try_acquire()
                .await?
                .ok_or("shared lock busy")?;
            g.release().await?;
            Ok(())
        })
    })
}

/// One uncontended shared acquire + release through the backend alone.
fn backend_shared_step(lib: &LockClient, tag: &str) -> Step {
    let (backend, tag) = (lib.backend().clone(), tag.to_string());
    Arc::new(move |_, slot| {
        let backend = backend.clone();
        let name = format!("bench/{tag}/backend-alone/uncontended-shared/{slot}");
        Box::pin(async move {
            let mut req = distlock::LockRequest::new(
                distlock::LockName::new(&name)?,
                Duration::from_secs(30),
            );
            req.kind = distlock::HoldKind::Shared;
            backend.try_acquire(&req).await?.ok_or("shared lock busy")?;
            backend.release(&req).await?;
            Ok(())
        })
    })
}

/// One uncontended acquire + release through the backend alone: the
/// `Backend` trait's calls, without the client (no guard, no watchdog, no
/// local state), and without holder info.
fn backend_step(lib: &LockClient, tag: &str) -> Step {
    backend_step_storing(lib, tag, "backend-alone/none", None)
}

/// [`backend_step`] with the client's holder info stored beside the owner,
/// as the client stores it: the two, interleaved in one run, measure what
/// storing holder info costs on its own.
fn backend_step_with_holder_info(lib: &LockClient, tag: &str) -> Step {
    let info: Arc<str> = Arc::from(lib.holder_info());
    backend_step_storing(lib, tag, "backend-alone/info", Some(info))
}

fn backend_step_storing(
    lib: &LockClient,
    tag: &str,
    variant: &str,
    holder_info: Option<Arc<str>>,
) -> Step {
    let (backend, tag) = (lib.backend().clone(), tag.to_string());
    let variant = variant.to_string();
    Arc::new(move |_, slot| {
        let (backend, holder_info) = (backend.clone(), holder_info.clone());
        let name = format!("bench/{tag}/{variant}/uncontended/{slot}");
        Box::pin(async move {
            let req = distlock::LockRequest::new(
                distlock::LockName::new(&name)?,
                Duration::from_secs(30),
            )
            .with_holder_info(holder_info);
            backend.try_acquire(&req).await?.ok_or("lock busy")?;
            backend.release(&req).await?;
            Ok(())
        })
    })
}

/// Scenarios 1 and 2, closed loop: the variants interleaved so that
/// machine noise hits all of them alike. Besides the raw sequence and
/// distlock, two variants split distlock's extra time: its own requests
/// sent raw (the protocol: fencing counter, release message, queue reads),
/// and the backend called without the client (the backend crate's
/// client-side cost; the rest is core's). A semaphore's permit has its own
/// three: its raw minimal sequence, the backend alone and the client; so
/// has a shared hold, on a backend that serves them. Every variant has a
/// name of its own: the rows, index entries and key history one name's
/// holds leave behind (until vacuum or compaction) slow every later hold
/// of that name, and two variants on one name would pay for each other's.
async fn uncontended(
    t: &Target,
    lib: &LockClient,
    n: u32,
    r: &mut Results,
) -> Result<(), BoxError> {
    let mut variants: Vec<(Series, Step)> = vec![
        (Series::new("round trip (calibration)")?, t.rtt.clone()),
        (Series::new("raw minimal sequence")?, t.raw.clone()),
    ];
    if let Some(proto) = &t.proto {
        variants.push((Series::new("distlock's requests, sent raw")?, proto.clone()));
    }
    // The semaphore's three variants sit before the lock's last two, which
    // the split below reads by position.
    let raw_permit = variants.len();
    variants.push((
        Series::new("raw minimal semaphore sequence")?,
        t.raw_permit.clone(),
    ));
    let permits = variants.len();
    variants.push((
        Series::new("semaphore: distlock backend, no client")?,
        backend_permit_step(lib, t.name),
    ));
    variants.push((
        Series::new("semaphore: distlock acquire+release")?,
        lib_permit_step(lib, t.name),
    ));
    // The shared hold's: its raw sequence (the raw lock sequence's index
    // where none is written) and the index of its backend-alone variant.
    let shared = if lib.backend().capabilities().shared {
        let raw_shared = match &t.raw_shared {
            Some(step) => {
                variants.push((Series::new("raw minimal shared sequence")?, step.clone()));
                variants.len() - 1
            }
            None => 1,
        };
        variants.push((
            Series::new("shared: distlock backend, no client")?,
            backend_shared_step(lib, t.name),
        ));
        variants.push((
            Series::new("shared: distlock acquire+release")?,
            lib_shared_step(lib, t.name),
        ));
        Some((raw_shared, variants.len() - 2))
    } else {
        None
    };
    let with_info = variants.len();
    variants.push((
        Series::new("distlock backend, no client, storing holder info")?,
        backend_step_with_holder_info(lib, t.name),
    ));
    variants.push((
        Series::new("distlock backend, no client")?,
        backend_step(lib, t.name),
    ));
    variants.push((
        Series::new("distlock acquire+release")?,
        lib_step(lib, t.name),
    ));
    let warmup = n / 10;
    let mut scratch = Series::new("warm-up")?;
    // Each iteration runs the variants in a new random order, so that none
    // always follows the same one: a variant right after a write can find
    // the server still busy with it, one after the read-only calibration
    // finds it idle (a seeded order, the same in every run).
    let mut order: Vec<usize> = (0..variants.len()).collect();
    let mut rng = fastrand::Rng::with_seed(0x5eed);
    for i in 0..(warmup + n) {
        rng.shuffle(&mut order);
        for &k in &order {
            let (series, step) = &mut variants[k];
            let s = if i >= warmup {
                &mut *series
            } else {
                &mut scratch
            };
            s.time(step(i, 0)).await?;
        }
    }
    let _ = writeln!(
        r.md,
        "\n#### {}: uncontended, closed loop (n = {n} each)\n",
        t.name
    );
    let _ = writeln!(
        r.md,
        "| variant | p50 µs | p99 µs | p99.9 µs | client CPU µs/op | thread blocks/op |\n|---|---|---|---|---|---|"
    );
    for (s, _) in &variants {
        let _ = writeln!(
            r.md,
            "| {} | {} | {} | {} | {:.1} | {:.2} |",
            s.name,
            s.p(0.5),
            s.p(0.99),
            s.p(0.999),
            s.cpu_per_op(),
            s.blocked_per_op()
        );
    }
    let p50 = |k: usize| variants[k].0.p(0.5) as f64;
    let (rtt, raw, ours) = (
        &variants[0].0,
        &variants[1].0,
        &variants[variants.len() - 1].0,
    );
    let ratio = ours.p(0.5) as f64 / raw.p(0.5) as f64;
    let _ = writeln!(
        r.md,
        "\ndistlock / raw at p50: **{ratio:.2}** (p99: {:.2}); raw / round trip at p50: {:.2}",
        ours.p(0.99) as f64 / raw.p(0.99) as f64,
        raw.p(0.5) as f64 / rtt.p(0.5) as f64
    );
    // Where distlock's extra time goes, at p50, as fractions of the raw
    // sequence (differences of medians: a rough split, not exact).
    let last = variants.len() - 1;
    let (backend, raw50) = (p50(last - 1), p50(1));
    let split = match t.proto {
        Some(_) => format!(
            "protocol {:+.2}, backend client {:+.2}, core {:+.2}",
            (p50(2) - raw50) / raw50,
            (backend - p50(2)) / raw50,
            (p50(last) - backend) / raw50
        ),
        None => format!(
            "backend (protocol and client) {:+.2}, core {:+.2}",
            (backend - raw50) / raw50,
            (p50(last) - backend) / raw50
        ),
    };
    let _ = writeln!(r.md, "\nthe gap at p50, as fractions of raw: {split}");
    let _ = writeln!(
        r.md,
        "\nstoring holder info ({} bytes), backend alone, at p50: {:+.3} of raw",
        lib.holder_info().len(),
        (p50(with_info) - backend) / raw50
    );
    let _ = writeln!(
        r.md,
        "\nsemaphore of {UNCONTENDED_LIMIT} at p50: distlock / backend alone {:.2}; distlock semaphore / raw lock sequence {:.2}; distlock semaphore / distlock lock {:.2}",
        p50(permits + 1) / p50(permits),
        p50(permits + 1) / raw50,
        p50(permits + 1) / p50(last)
    );
    let (sem_raw, sem_ours) = (&variants[raw_permit].0, &variants[permits + 1].0);
    let sem_ratio = sem_ours.p(0.5) as f64 / sem_raw.p(0.5) as f64;
    let sem_raw50 = p50(raw_permit);
    let _ = writeln!(
        r.md,
        "\nsemaphore of {UNCONTENDED_LIMIT} at p50: distlock / raw semaphore sequence **{sem_ratio:.2}** (p99: {:.2}); raw semaphore / raw lock sequence {:.2}; the gap as fractions of the raw semaphore: backend (protocol and client) {:+.2}, core {:+.2}",
        sem_ours.p(0.99) as f64 / sem_raw.p(0.99) as f64,
        sem_raw50 / raw50,
        (p50(permits) - sem_raw50) / sem_raw50,
        (p50(permits + 1) - p50(permits)) / sem_raw50
    );
    let shared_ratio = shared.map(|(raw_k, backend_k)| {
        let (sh_raw, sh_ours) = (&variants[raw_k].0, &variants[backend_k + 1].0);
        let sh_ratio = sh_ours.p(0.5) as f64 / sh_raw.p(0.5) as f64;
        let sh_raw50 = p50(raw_k);
        let (against, note) = if t.raw_shared.is_some() {
            ("raw shared sequence", "")
        } else {
            (
                "raw lock sequence",
                " (no raw shared sequence is written for this backend)",
            )
        };
        let _ = writeln!(
            r.md,
            "\nshared at p50: distlock / {against}{note} **{sh_ratio:.2}** (p99: {:.2}); raw shared / raw lock sequence {:.2}; distlock shared / distlock lock {:.2}; the gap as fractions of the {against}: backend (protocol and client) {:+.2}, core {:+.2}",
            sh_ours.p(0.99) as f64 / sh_raw.p(0.99) as f64,
            sh_raw50 / raw50,
            p50(backend_k + 1) / p50(last),
            (p50(backend_k) - sh_raw50) / sh_raw50,
            (p50(backend_k + 1) - p50(backend_k)) / sh_raw50
        );
        (sh_ratio, t.raw_shared.is_some())
    });
    r.ratios.push(Ratios {
        name: t.name.to_string(),
        lock: ratio,
        permit: sem_ratio,
        shared: shared_ratio,
    });
    r.latency.push((
        t.name.to_string(),
        vec![
            raw.p(0.5) as f64,
            ours.p(0.5) as f64,
            raw.p(0.99) as f64,
            ours.p(0.99) as f64,
        ],
    ));
    r.rtt_p50.push((t.name.to_string(), rtt.p(0.5) as f64));
    Ok(())
}

/// Core's own cost: one uncontended acquire+release through the client
/// and through the backend alone, on the in-memory backend (no I/O, so the
/// difference is the client's CPU time per operation: the guard, its
/// state, the per-name gate, the timer entry, the owner).
async fn core_cost(n: u32, r: &mut Results) -> Result<(), BoxError> {
    let backend: distlock::DynBackend = Arc::new(distlock::MemoryBackend::new());
    let lib = LockClient::from_dyn(backend);
    let steps = [
        ("in-memory backend, no client", backend_step(&lib, "core")),
        ("distlock client on it", lib_step(&lib, "core")),
    ];
    let mut per_op = [0.0f64; 2];
    // Alternating blocks of 1,000 so that noise hits both alike; the
    // first round of blocks is a warm-up.
    let blocks = (n / 1000).max(1);
    for round in 0..=blocks {
        for (k, (_, step)) in steps.iter().enumerate() {
            let start = Instant::now();
            for i in 0..1000 {
                step(i, 0).await?;
            }
            if round > 0 {
                per_op[k] += start.elapsed().as_secs_f64();
            }
        }
    }
    let ns = |k: usize| per_op[k] / f64::from(blocks * 1000) * 1e9;
    let _ = writeln!(
        r.md,
        "\n### core: cost per acquire+release on the in-memory backend (n = {} each)\n\n| variant | ns per operation |\n|---|---|\n| {} | {:.0} |\n| {} | {:.0} |\n\ncore's own cost: **{:.0} ns** per acquire+release",
        blocks * 1000,
        steps[0].0,
        ns(0),
        steps[1].0,
        ns(1),
        ns(1) - ns(0)
    );
    Ok(())
}

/// Scenario 2, open loop: operations start on a fixed schedule whether or
/// not the previous ones finished, and latency counts from the scheduled
/// start, so a slow response delays nothing and hides nothing.
async fn open_loop(
    t: &Target,
    lib: &LockClient,
    rate: u32,
    n: u32,
    r: &mut Results,
) -> Result<(), BoxError> {
    let interval = Duration::from_secs_f64(1.0 / f64::from(rate));
    let mut out = Vec::new();
    let mut lag = Series::new("start lag")?;
    for (label, step) in [
        ("raw minimal sequence", t.raw.clone()),
        ("distlock acquire+release", lib_step(lib, t.name)),
    ] {
        let start = Instant::now() + Duration::from_millis(20);
        let mut tasks = Vec::with_capacity(n as usize);
        for i in 0..n {
            let due = start + interval * i;
            let step = step.clone();
            // Every operation is its own task, started on schedule whatever
            // the earlier ones are doing, so a slow response cannot delay
            // the next start (no coordinated omission). Latency counts from
            // the moment the task woke: tokio's timer wakes up to 1 ms late,
            // which is the load generator's error, reported as start lag.
            tasks.push(tokio::spawn(async move {
                tokio::time::sleep_until(due).await;
                let started = Instant::now();
                // Up to 64 operations in flight, each on its own name.
                step(i, (i % 64) as usize + 1000).await?;
                Ok::<_, BoxError>((started.elapsed(), started - due))
            }));
        }
        let mut s = Series::new(label)?;
        for task in tasks {
            let (latency, late) = task.await??;
            s.record(latency)?;
            lag.record(late)?;
        }
        out.push(s);
    }
    let _ = writeln!(
        r.md,
        "\n#### {}: uncontended, open loop at {rate}/s (n = {n} each)\n",
        t.name
    );
    let _ = writeln!(
        r.md,
        "| variant | p50 µs | p99 µs | p99.9 µs |\n|---|---|---|---|"
    );
    for s in &out {
        let _ = writeln!(
            r.md,
            "| {} | {} | {} | {} |",
            s.name,
            s.p(0.5),
            s.p(0.99),
            s.p(0.999)
        );
    }
    let _ = writeln!(
        r.md,
        "\ndistlock / raw at p50: **{:.2}** (p99: {:.2}); start lag of the load generator's timer p50 {} µs, p99 {} µs",
        out[1].p(0.5) as f64 / out[0].p(0.5) as f64,
        out[1].p(0.99) as f64 / out[0].p(0.99) as f64,
        lag.p(0.5),
        lag.p(0.99)
    );
    Ok(())
}

/// A fresh client with its own connection; for etcd and ZooKeeper also a
/// reader of its wake-up counter.
async fn client(
    t: &Target,
) -> Result<(LockClient, Option<Box<dyn Fn() -> u64 + Send + Sync>>), BoxError> {
    Ok(match t.name {
        "etcd" => {
            let b = Arc::new(distlock::etcd::EtcdBackend::connect(&t.url).await?);
            let w = b.clone();
            (LockClient::from_dyn(b), Some(Box::new(move || w.wakeups())))
        }
        "zookeeper" => {
            let b = Arc::new(distlock::zookeeper::ZooKeeperBackend::connect(&t.url).await?);
            let w = b.clone();
            (LockClient::from_dyn(b), Some(Box::new(move || w.wakeups())))
        }
        // A database client of its own (its own small pool, and on
        // PostgreSQL its own LISTEN connection), not a clone of the one
        // the other scenarios share, whose tasks would hand the lock on
        // inside the process without asking the server.
        "postgres" | "mysql" | "sqlite" => {
            let sep = if t.url.contains('?') { '&' } else { '?' };
            // PostgreSQL's LISTEN connection comes from the pool too.
            let size = if t.name == "postgres" { 2 } else { 1 };
            let url = format!("{}{sep}pool_size={size}", t.url);
            let url = if t.name == "sqlite" {
                url
            } else {
                format!("{url}&fifo={}", fifo())
            };
            (LockClient::from_dyn(distlock::connect(&url).await?), None)
        }
        _ => (t.lib().await?, None),
    })
}

/// Scenario 3's (tasks, names, clients): every task on names of its own,
/// through one client or spread over four.
const THROUGHPUT: &[(usize, usize, usize)] = &[
    (8, 8, 1),
    (8, 1000, 1),
    (64, 64, 1),
    (64, 1000, 1),
    (8, 8, 4),
    (8, 1000, 4),
    (64, 64, 4),
    (64, 1000, 4),
];

async fn scenarios_3_to_6(
    t: &Target,
    lib: &LockClient,
    a: &Args,
    r: &mut Results,
) -> Result<(), BoxError> {
    let secs = Duration::from_secs_f64(a.seconds);
    let throughput: Vec<(usize, usize, usize)> = if a.only.iter().any(|g| g == "3") {
        THROUGHPUT
            .iter()
            .copied()
            .filter(|(t, n, c)| {
                a.throughput.is_empty() || a.throughput.contains(&format!("{t}x{n}x{c}"))
            })
            .collect()
    } else {
        Vec::new()
    };
    if !throughput.is_empty() {
        let _ = writeln!(
            r.md,
            "\n#### {}: tasks on names through one or more clients ({} s each)\n\n| tasks | names | clients | raw ops/s | distlock ops/s | distlock / raw | distlock's requests sent raw, ops/s | distlock / its requests | client CPU µs/op, raw → its requests → distlock | thread blocks/op, raw → its requests → distlock |\n|---|---|---|---|---|---|---|---|---|---|",
            t.name, a.seconds
        );
    }
    // The clients beyond the first, each with the raw sequence (and
    // distlock's requests sent raw) on a connection or pool of its own,
    // made once for every configuration.
    let mut libs = vec![lib.clone()];
    let mut raws = vec![t.raw.clone()];
    let mut protos: Option<Vec<Step>> = t.proto.clone().map(|p| vec![p]);
    let most = throughput.iter().map(|c| c.2).max().unwrap_or(1);
    while libs.len() < most {
        let fresh = (t.fresh)().await?;
        // `lib()` connects anew where the target's client is not on the
        // raw sequences' pool.
        libs.push(match fresh.client {
            Some(c) => c,
            None => t.lib().await?,
        });
        raws.push(fresh.raw);
        if let (Some(protos), Some(p)) = (&mut protos, fresh.proto) {
            protos.push(p);
        }
    }
    for &(tasks, names, clients) in &throughput {
        let m = contention::throughput(
            &libs[..clients],
            &raws[..clients],
            protos.as_deref().map(|p| &p[..clients]),
            (tasks, names),
            secs,
            t.name,
            a.profile_side,
        )
        .await
        .map_err(|e| {
            format!(
                "{}: {tasks} tasks on {names} names through {clients} clients: {e}",
                t.name
            )
        })?;
        // A side that did not run (`--profile-side`) shows as `-`.
        let show = |r: Option<contention::Rate>, f: fn(&contention::Rate) -> String| {
            r.as_ref().map_or_else(|| "-".to_string(), f)
        };
        let ratio = |a: Option<contention::Rate>, b: Option<contention::Rate>| match (a, b) {
            (Some(a), Some(b)) => format!("{:.2}", a.ops_per_sec / b.ops_per_sec),
            _ => "-".to_string(),
        };
        let ops = |r: &contention::Rate| format!("{:.0}", r.ops_per_sec);
        let cpu = |r: &contention::Rate| format!("{:.1}", r.cpu_us_per_op);
        let blocks = |r: &contention::Rate| format!("{:.2}", r.blocks_per_op);
        let (proto, proto_cpu, proto_blocks) = match t.proto {
            Some(_) => (
                format!("{} | {}", show(m.proto, ops), ratio(m.ours, m.proto)),
                format!(" → {}", show(m.proto, cpu)),
                format!(" → {}", show(m.proto, blocks)),
            ),
            None => ("- | -".to_string(), String::new(), String::new()),
        };
        let _ = writeln!(
            r.md,
            "| {tasks} | {names} | {clients} | {} | {} | **{}** | {proto} | {}{proto_cpu} → {} | {}{proto_blocks} → {} |",
            show(m.raw, ops),
            show(m.ours, ops),
            ratio(m.ours, m.raw),
            show(m.raw, cpu),
            show(m.ours, cpu),
            show(m.raw, blocks),
            show(m.ours, blocks),
        );
    }

    if a.profile_side.is_some() {
        return Ok(());
    }
    let mut clients = Vec::new();
    for _ in 0..a.clients {
        clients.push(client(t).await?.0);
    }
    let c = contention::contention_one_name(&clients, secs, t.name, a.handoff_kind)
        .await
        .map_err(|e| format!("{}: {} clients on one name: {e}", t.name, a.clients))?;
    let _ = writeln!(
        r.md,
        "\n#### {}: {} clients on one name{} ({} s)\n\n| grants/s | Jain's index | out-of-order grants | worst wait |\n|---|---|---|---|\n| {:.0} | {:.3} | {} of {} | {:.1} ms |",
        t.name,
        a.clients,
        a.handoff_kind.label(),
        a.seconds,
        c.grants_per_sec,
        c.jain,
        c.out_of_order,
        c.grants,
        c.worst_wait.as_secs_f64() * 1000.0
    );
    drop(clients);

    let _ = writeln!(
        r.md,
        "\n#### {}: handoff (release → next waiter holds) and the herd{}\n\n| waiters | handoffs | p50 µs | p99 µs | release call p50 µs | wake-ups per handoff | server requests per handoff |\n|---|---|---|---|---|---|---|",
        t.name,
        a.handoff_kind.label()
    );
    let mut line = Vec::new();
    for &w in &a.waiters {
        let mut clients = Vec::new();
        let mut wake = Vec::new();
        for _ in 0..=w {
            let (c, counter) = client(t).await?;
            clients.push(c);
            wake.extend(counter);
        }
        let wakeups = || wake.iter().map(|f| f()).sum::<u64>();
        let w0 = wakeups();
        let req0 = match &t.requests {
            Some(f) => Some(f().await?),
            None => None,
        };
        let h = match contention::handoffs(&clients, a.handoffs, t.name, a.handoff_kind).await {
            Ok(h) => h,
            // The real run records a scenario the backend cannot sustain
            // (and the doc explains it); the smoke must not fail.
            Err(e) if !a.smoke => {
                let _ = writeln!(
                    r.md,
                    "| {w} | failed: {} | | | | | |",
                    e.to_string().replace('|', "/")
                );
                line.push(None);
                continue;
            }
            Err(e) => return Err(format!("{}: handoffs with {w} waiters: {e}", t.name).into()),
        };
        let per = |x: u64| x as f64 / h.handoffs.max(1) as f64;
        let wk = if wake.is_empty() {
            "-".to_string()
        } else {
            format!("{:.2}", per(wakeups() - w0))
        };
        let rq = match (&t.requests, req0) {
            (Some(f), Some(r0)) => format!("{:.2}", per(f().await? - r0)),
            _ => "-".into(),
        };
        let _ = writeln!(
            r.md,
            "| {w} | {} | {} | {} | {} | {wk} | {rq} |",
            h.handoffs,
            h.latency.value_at_quantile(0.5),
            h.latency.value_at_quantile(0.99),
            h.release.value_at_quantile(0.5),
        );
        line.push(Some(h.latency.value_at_quantile(0.5) as f64));
    }
    if let Some((_, rtt)) = r.rtt_p50.iter().find(|(n, _)| n == t.name) {
        let _ = writeln!(
            r.md,
            "
round trip p50: {rtt:.0} µs, so the handoff target (one round trip + 0.5 ms) is {:.0} µs",
            rtt + 500.0
        );
    }
    let samples = if a.smoke { 5 } else { 300 };
    let (hot, idle) = idle_round_trip(&t.rtt, samples).await?;
    let _ = writeln!(
        r.md,
        "
the same round trip after {:?} idle, as each release in this scenario is sent: p50 {idle} µs (back to back, alternating with it: {hot} µs; n = {samples} each); with it the target would be {} µs",
        contention::HOLD_FOR,
        idle + 500
    );
    r.handoff.push((t.name.to_string(), line));
    Ok(())
}

/// The round trip as a handoff meets it: the cheapest request sent after the
/// same idle ([`contention::HOLD_FOR`]) that comes before every release in
/// [`contention::handoffs`], alternating with the same request sent right
/// after another one (hot, as in the calibration of scenario 1). On a
/// virtual machine a process woken from idle answers far more slowly.
/// Returns the two p50s in µs (hot, idle).
async fn idle_round_trip(rtt: &Step, n: u32) -> Result<(u64, u64), BoxError> {
    let mut hot = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3)?;
    let mut idle = hot.clone();
    for i in 0..n {
        rtt(i, 0).await?;
        let start = Instant::now();
        rtt(i, 0).await?;
        hot.record((start.elapsed().as_micros() as u64).max(1))?;
        tokio::time::sleep(contention::HOLD_FOR).await;
        let start = Instant::now();
        rtt(i, 0).await?;
        idle.record((start.elapsed().as_micros() as u64).max(1))?;
    }
    Ok((hot.value_at_quantile(0.5), idle.value_at_quantile(0.5)))
}

/// Scenario 7 runs in a fresh process of this binary, so that its resident
/// set before acquiring is the baseline, not the peak of earlier scenarios.
pub(crate) const HOLD_ENV: &str = "DISTLOCK_BENCH_HOLD";

/// Permits per semaphore when scenario 7 holds permits.
const PERMITS_PER_SEMAPHORE: u32 = 10;

async fn scenario_7(t: &Target, a: &Args, r: &mut Results) -> Result<(), BoxError> {
    for limit in [None, Some(PERMITS_PER_SEMAPHORE)] {
        hold_in_a_fresh_process(t, a, limit, r).await?;
    }
    Ok(())
}

async fn hold_in_a_fresh_process(
    t: &Target,
    a: &Args,
    limit: Option<u32>,
    r: &mut Results,
) -> Result<(), BoxError> {
    let ttl = Duration::from_secs(if a.smoke { 3 } else { 9 });
    let out = tokio::process::Command::new(std::env::current_exe()?)
        .env(
            HOLD_ENV,
            format!(
                "{} {} {} {} {}",
                t.url,
                a.held,
                ttl.as_secs(),
                t.name,
                limit.unwrap_or(0)
            ),
        )
        .output()
        .await?;
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr)
            .trim()
            .to_string()
            .into());
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let v: Vec<f64> = text
        .split_whitespace()
        .filter_map(|x| x.parse().ok())
        .collect();
    let [bytes, renewals, renewed, secs] = v[..] else {
        return Err(format!("unexpected output {text:?}").into());
    };
    let what = match limit {
        None => "locks".to_string(),
        Some(n) => format!("permits ({} semaphores of {n})", a.held / n as usize),
    };
    let _ = writeln!(
        r.md,
        "\n#### {}: holding {} {what} in one client (TTL {} s, fresh process)\n\n| memory per hold | renewal requests per renewal period | holds renewed per period | time to acquire them all |\n|---|---|---|---|\n| {bytes:.0} bytes | {renewals:.0} | {renewed:.0} | {secs:.1} s |",
        t.name,
        a.held,
        ttl.as_secs(),
    );
    Ok(())
}

/// The child side of scenario 7: prints bytes per lock, renewal requests
/// per period, holds renewed per period and seconds to acquire.
async fn hold_many(spec: &str) -> Result<(), BoxError> {
    let f: Vec<&str> = spec.split(' ').collect();
    let [url, m, ttl, tag, limit] = f[..] else {
        return Err(format!("{HOLD_ENV}={spec:?}: expected URL M TTL_SECS TAG LIMIT").into());
    };
    let limit: u32 = limit.parse()?;
    let k = keepalive::keep_alive(
        distlock::connect(url).await?,
        m.parse()?,
        Duration::from_secs(ttl.parse()?),
        tag,
        (limit > 0).then_some(limit),
    )
    .await?;
    println!(
        "{} {} {} {}",
        k.bytes_per_lock, k.renewals_per_period, k.renewed_per_period, k.acquire_secs
    );
    Ok(())
}

async fn target(name: &str) -> Result<Target, BoxError> {
    match name {
        "redis" => redis_target().await,
        "redlock" => redlock_target().await,
        "sqlite" | "postgres" => sql_target(name).await,
        "mysql" => mysql::target().await,
        "etcd" => etcd_target().await,
        "zookeeper" => zookeeper_target().await,
        other => Err(format!("unknown backend {other:?}").into()),
    }
}

/// An owner value for iteration `i` of a raw sequence, as long as
/// distlock's (a UUID's 36 characters).
fn uuid_like(i: u32) -> String {
    format!("00000000-0000-4000-8000-{i:012x}")
}

/// The raw acquire: `SET key owner NX PX 30000`.
fn set_nx_px(key: &str, owner: &str) -> redis::Cmd {
    let mut cmd = redis::cmd("SET");
    cmd.arg(key).arg(owner).arg("NX").arg("PX").arg(30_000);
    cmd
}

/// The raw permit acquire, judged by the server's clock: drop the expired
/// permits, and add the owner's with its expiry as score if fewer than the
/// limit are left. `KEYS[1]` the semaphore, `ARGV` owner, limit, TTL in ms.
fn permit_script() -> redis::Script {
    redis::Script::new(
        "local t = redis.call('TIME')
         local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
         redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
         if redis.call('ZCARD', KEYS[1]) < tonumber(ARGV[2]) then
           redis.call('ZADD', KEYS[1], now + tonumber(ARGV[3]), ARGV[1])
           return 1
         end
         return 0",
    )
}

/// The raw shared acquire, in the Redis backend's layout and by the
/// server's clock: refused if the lock key holds an owner (not
/// `distlock:shared`) or a writer's mark is live; else drop the expired
/// shared holds, add the owner's with its expiry as score, and set the lock
/// key to `distlock:shared` and both keys' expiry to the furthest hold's.
/// `KEYS` the lock key, its readers and its writers; `ARGV` owner, TTL in
/// ms. No fencing counter, no publish, as in the raw lock.
fn shared_acquire_script() -> redis::Script {
    redis::Script::new(
        "local holder = redis.call('GET', KEYS[1])
         if holder and holder ~= 'distlock:shared' then return 0 end
         local t = redis.call('TIME')
         local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
         if redis.call('ZCOUNT', KEYS[3], '(' .. now, '+inf') > 0 then return 0 end
         redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
         redis.call('ZADD', KEYS[2], now + tonumber(ARGV[2]), ARGV[1])
         local last = tonumber(redis.call('ZRANGE', KEYS[2], -1, -1, 'WITHSCORES')[2]) - now
         redis.call('PEXPIRE', KEYS[2], last)
         redis.call('SET', KEYS[1], 'distlock:shared', 'PX', last)
         return 1",
    )
}

/// The raw shared release: remove the owner's hold; the lock key then
/// expires with the furthest live hold left, or goes with the last one.
/// `KEYS` the lock key and its readers; `ARGV` the owner.
fn shared_release_script() -> redis::Script {
    redis::Script::new(
        "if redis.call('ZREM', KEYS[2], ARGV[1]) == 0 then return 0 end
         local t = redis.call('TIME')
         local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
         redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
         if redis.call('GET', KEYS[1]) == 'distlock:shared' then
           local furthest = redis.call('ZRANGE', KEYS[2], -1, -1, 'WITHSCORES')[2]
           if furthest then
             redis.call('PEXPIRE', KEYS[1], tonumber(furthest) - now)
             redis.call('PEXPIRE', KEYS[2], tonumber(furthest) - now)
           else
             redis.call('DEL', KEYS[1])
           end
         end
         return 1",
    )
}

/// The raw shared hold's scripts and the keys of one name's read-write
/// lock on one Redis.
#[derive(Clone)]
struct RawShared {
    acquire: redis::Script,
    release: redis::Script,
}

impl RawShared {
    fn new() -> Self {
        Self {
            acquire: shared_acquire_script(),
            release: shared_release_script(),
        }
    }

    /// The lock key of `slot` and its readers' and writers' keys.
    fn keys(slot: usize) -> [String; 3] {
        let lock = format!("bench/raw-shared/{slot}");
        [
            format!("{{{lock}}}:readers"),
            format!("{{{lock}}}:writers"),
            lock,
        ]
    }

    async fn acquire(
        &self,
        c: &mut redis::aio::MultiplexedConnection,
        slot: usize,
        owner: &str,
    ) -> Result<bool, redis::RedisError> {
        let [readers, writers, lock] = Self::keys(slot);
        let granted: i64 = self
            .acquire
            .key(lock)
            .key(readers)
            .key(writers)
            .arg(owner)
            .arg(30_000)
            .invoke_async(c)
            .await?;
        Ok(granted == 1)
    }

    async fn release(
        &self,
        c: &mut redis::aio::MultiplexedConnection,
        slot: usize,
        owner: &str,
    ) -> Result<bool, redis::RedisError> {
        let [readers, _, lock] = Self::keys(slot);
        let released: i64 = self
            .release
            .key(lock)
            .key(readers)
            .arg(owner)
            .invoke_async(c)
            .await?;
        Ok(released == 1)
    }
}

/// One raw permit acquire on one Redis: whether it was granted.
async fn permit_acquire(
    c: &mut redis::aio::MultiplexedConnection,
    script: &redis::Script,
    key: &str,
    owner: &str,
) -> Result<bool, redis::RedisError> {
    let granted: i64 = script
        .key(key)
        .arg(owner)
        .arg(UNCONTENDED_LIMIT)
        .arg(30_000)
        .invoke_async(c)
        .await?;
    Ok(granted == 1)
}

/// Whether two of three answers were yes, waiting no longer than that.
async fn majority<F>(answers: &mut FuturesUnordered<F>) -> bool
where
    F: Future<Output = Result<bool, redis::RedisError>>,
{
    at_least(answers, 2).await
}

/// Whether `needed` answers were yes, waiting no longer than that.
async fn at_least<F>(answers: &mut FuturesUnordered<F>, needed: usize) -> bool
where
    F: Future<Output = Result<bool, redis::RedisError>>,
{
    let mut yes = 0;
    while let Some(r) = answers.next().await {
        yes += usize::from(matches!(r, Ok(true)));
        if yes >= needed {
            return true;
        }
    }
    false
}

/// Redlock on three independent redis-servers. The raw sequence is the
/// minimal Redlock: `SET NX PX` on the three nodes at once, then the
/// compare-and-delete on the three at once, each half done when two nodes
/// said yes.
/// The raw Redlock lock on `conns` (one connection per node): `SET NX PX`
/// on every node, then compare-and-delete on every node.
fn redlock_raw(conns: Vec<redis::aio::MultiplexedConnection>) -> Step {
    let cad = compare_and_delete();
    Arc::new(move |i, slot| {
        let (c, cad) = (conns.clone(), cad.clone());
        Box::pin(async move {
            let key = format!("bench/raw/{slot}");
            let owner = format!("raw-{i}");
            // Each half returns once a majority has answered yes, as the
            // backend does: the third node's answer cannot change anything.
            if !set_on_a_majority(&c, &key, &owner).await {
                return Err("raw redlock: no majority".into());
            }
            let mut dels: FuturesUnordered<_> = c
                .into_iter()
                .map(|mut c| {
                    let (key, owner, cad) = (key.clone(), owner.clone(), cad.clone());
                    async move {
                        let n: i64 = cad.key(&key).arg(&owner).invoke_async(&mut c).await?;
                        Ok::<bool, redis::RedisError>(n == 1)
                    }
                })
                .collect();
            if !majority(&mut dels).await {
                return Err("raw redlock: release reached no majority".into());
            }
            Ok(())
        })
    })
}

/// `SET key owner NX PX` on every node at once; whether a majority said
/// yes, waiting no longer than that.
async fn set_on_a_majority(
    conns: &[redis::aio::MultiplexedConnection],
    key: &str,
    owner: &str,
) -> bool {
    let mut sets: FuturesUnordered<_> = conns
        .iter()
        .cloned()
        .map(|mut c| async move {
            let ok: Option<String> = set_nx_px(key, owner).query_async(&mut c).await?;
            Ok::<bool, redis::RedisError>(ok.is_some())
        })
        .collect();
    majority(&mut sets).await
}

/// The Redis backend's release of a lock, with its keys and arguments: 1
/// when `owner` held it.
async fn release_as_distlock(
    c: &mut redis::aio::MultiplexedConnection,
    keys: &distlock::redis::Keys,
    owner: &str,
) -> redis::RedisResult<i64> {
    distlock::redis::Scripts::get()
        .release
        .key(&keys.lock)
        .key(&keys.writers)
        .arg(owner)
        .arg(&keys.channel)
        .invoke_async(c)
        .await
}

/// The requests an unfenced Redlock lock (the default) sends, on `conns`:
/// `SET NX PX` on every node, as the raw sequence, with an owner as long as
/// the backend's; then the backend's release script (compare-and-delete,
/// and the release message) on every node; each half done at a majority.
fn redlock_proto(conns: Vec<redis::aio::MultiplexedConnection>) -> Step {
    let info = distlock::default_holder_info();
    Arc::new(move |i, slot| {
        let (c, info) = (conns.clone(), info.clone());
        Box::pin(async move {
            let keys = distlock::redis::Keys::new(
                "",
                &distlock::LockName::new(format!("bench/proto/{slot}"))?,
            );
            let owner = format!("{i:036x} {info}");
            if !set_on_a_majority(&c, &keys.lock, &owner).await {
                return Err("proto redlock: no majority".into());
            }
            let mut dels: FuturesUnordered<_> = c
                .into_iter()
                .map(|mut c| {
                    let (keys, owner) = (&keys, owner.clone());
                    async move {
                        Ok::<bool, redis::RedisError>(
                            release_as_distlock(&mut c, keys, &owner).await? == 1,
                        )
                    }
                })
                .collect();
            if !majority(&mut dels).await {
                return Err("proto redlock: release reached no majority".into());
            }
            Ok(())
        })
    })
}

async fn redlock_target() -> Result<Target, BoxError> {
    let mut servers = Vec::new();
    let mut conns = Vec::new();
    let mut clients = Vec::new();
    for _ in 0..3 {
        let server = tokio::task::spawn_blocking(|| TestServer::start(ServerKind::Redis)).await??;
        let client = redis::Client::open(server.url())?;
        conns.push(client.get_multiplexed_async_connection().await?);
        clients.push(client);
        servers.push(server);
    }
    let url = format!(
        "redlock://{}",
        servers
            .iter()
            .map(|s| s
                .url()
                .trim_start_matches("redis://")
                .trim_end_matches('/')
                .to_string())
            .collect::<Vec<_>>()
            .join(",")
    );
    let c1 = conns.clone();
    let rtt: Step = Arc::new(move |_, _| {
        let c = c1.clone();
        Box::pin(async move {
            let pings = c.into_iter().map(|mut c| async move {
                let _: String = redis::cmd("PING").query_async(&mut c).await?;
                Ok::<(), redis::RedisError>(())
            });
            for r in futures_util::future::join_all(pings).await {
                r?;
            }
            Ok(())
        })
    });
    let raw = redlock_raw(conns.clone());
    let proto_conns = conns.clone();
    let fresh: Connect = Arc::new(move || {
        let clients = clients.clone();
        Box::pin(async move {
            let mut conns = Vec::new();
            for client in &clients {
                conns.push(client.get_multiplexed_async_connection().await?);
            }
            Ok(Fresh {
                raw: redlock_raw(conns.clone()),
                proto: Some(redlock_proto(conns)),
                client: None,
            })
        })
    });
    // The raw shared hold: the raw shared acquire script on the three
    // nodes at once, then the release script on the three at once, each
    // half done when two nodes said yes (a majority, as for a lock: any
    // two majorities share a node, which refuses a writer beside a reader).
    let (c3, shared) = (conns.clone(), RawShared::new());
    let raw_shared: Step = Arc::new(move |i, slot| {
        let (c, shared) = (c3.clone(), shared.clone());
        Box::pin(async move {
            let owner = uuid_like(i);
            let mut adds: FuturesUnordered<_> = c
                .iter()
                .cloned()
                .map(|mut c| {
                    let (shared, owner) = (shared.clone(), owner.clone());
                    async move { shared.acquire(&mut c, slot, &owner).await }
                })
                .collect();
            if !majority(&mut adds).await {
                return Err("raw redlock shared: no majority".into());
            }
            drop(adds);
            let mut rems: FuturesUnordered<_> = c
                .into_iter()
                .map(|mut c| {
                    let (shared, owner) = (shared.clone(), owner.clone());
                    async move { shared.release(&mut c, slot, &owner).await }
                })
                .collect();
            if !majority(&mut rems).await {
                return Err("raw redlock shared: release reached no majority".into());
            }
            Ok(())
        })
    });
    // The raw semaphore: the permit script on the three nodes at once, then
    // `ZREM` on the three at once. A majority is not enough: each node
    // grants `limit` permits, so `limit + 1` holders fit on `q` nodes each
    // unless `(limit + 1) q > 3 limit`; each half is done at the smallest
    // such `q` (all three nodes for a semaphore of 3).
    let counted = conns.clone();
    let script = permit_script();
    let needed = (3 * UNCONTENDED_LIMIT / (UNCONTENDED_LIMIT + 1) + 1) as usize;
    let raw_permit: Step = Arc::new(move |i, slot| {
        let (c, script) = (conns.clone(), script.clone());
        Box::pin(async move {
            let key = format!("bench/raw-permit/{slot}");
            let owner = format!("raw-{i}");
            let mut adds: FuturesUnordered<_> = c
                .iter()
                .cloned()
                .map(|mut c| {
                    let (key, owner, script) = (key.clone(), owner.clone(), script.clone());
                    async move { permit_acquire(&mut c, &script, &key, &owner).await }
                })
                .collect();
            if !at_least(&mut adds, needed).await {
                return Err("raw redlock semaphore: no quorum".into());
            }
            drop(adds);
            let mut rems: FuturesUnordered<_> = c
                .into_iter()
                .map(|mut c| {
                    let (key, owner) = (key.clone(), owner.clone());
                    async move {
                        let n: i64 = redis::cmd("ZREM")
                            .arg(&key)
                            .arg(&owner)
                            .query_async(&mut c)
                            .await?;
                        Ok::<bool, redis::RedisError>(n == 1)
                    }
                })
                .collect();
            if !at_least(&mut rems, needed).await {
                return Err("raw redlock semaphore: release reached no quorum".into());
            }
            Ok(())
        })
    });
    Ok(Target {
        name: "redlock",
        url,
        rtt,
        raw,
        proto: Some(redlock_proto(proto_conns)),
        raw_permit,
        raw_shared: Some(raw_shared),
        // The script calls on every node. Not counted: an unfenced lock's
        // first attempt of each wait, a plain `SET` (the statistics count
        // the `SET`s inside scripts under the same name).
        requests: Some(redis_requests(counted, &["evalsha", "eval"])),
        client: None,
        fresh,
        _server: None,
        _servers: servers,
    })
}

/// The calls of the commands `names` that the servers behind `conns` have
/// answered, summed (`INFO commandstats`).
fn redis_requests(
    conns: Vec<redis::aio::MultiplexedConnection>,
    names: &'static [&'static str],
) -> Counter {
    Arc::new(move || {
        let conns = conns.clone();
        Box::pin(async move {
            let mut total = 0;
            for mut c in conns {
                let info: String = redis::cmd("INFO")
                    .arg("commandstats")
                    .query_async(&mut c)
                    .await?;
                total += info
                    .lines()
                    .filter_map(|l| {
                        let (cmd, rest) = l.strip_prefix("cmdstat_")?.split_once(':')?;
                        if !names.contains(&cmd) {
                            return None;
                        }
                        rest.split("calls=")
                            .nth(1)?
                            .split(',')
                            .next()?
                            .parse::<u64>()
                            .ok()
                    })
                    .sum::<u64>();
            }
            Ok(total)
        })
    })
}

/// The compare-and-delete release of the raw lock sequences.
fn compare_and_delete() -> redis::Script {
    redis::Script::new(
        "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0",
    )
}

/// The raw Redis lock on `conn`: `SET NX PX`, then compare-and-delete.
fn redis_raw(conn: redis::aio::MultiplexedConnection) -> Step {
    let cad = compare_and_delete();
    Arc::new(move |i, slot| {
        let (mut c, cad) = (conn.clone(), cad.clone());
        Box::pin(async move {
            let key = format!("bench/raw/{slot}");
            let owner = format!("raw-{i}");
            let ok: Option<String> = set_nx_px(&key, &owner).query_async(&mut c).await?;
            ok.ok_or("raw lock busy")?;
            let _: i64 = cad.key(&key).arg(&owner).invoke_async(&mut c).await?;
            Ok(())
        })
    })
}

/// distlock's two scripts on `conn`, with the backend's keys and
/// arguments.
fn redis_proto(conn: redis::aio::MultiplexedConnection) -> Step {
    let info = distlock::default_holder_info();
    Arc::new(move |i, slot| {
        let (mut c, info) = (conn.clone(), info.clone());
        Box::pin(async move {
            let scripts = distlock::redis::Scripts::get();
            let keys = distlock::redis::Keys::new(
                "",
                &distlock::LockName::new(format!("bench/proto/{slot}"))?,
            );
            // The same keys and arguments as the backend's `try_acquire`
            // and `release`: the writer marks' key, the attempt's kind
            // ('0', a try), and an owner as long as the backend's (36
            // characters, a space and the client's holder info).
            let owner = format!("{i:036x} {info}");
            let token: i64 = scripts
                .acquire
                .key(&keys.lock)
                .key(&keys.fence)
                .key(&keys.writers)
                .arg(&owner)
                .arg(30_000)
                .arg("0")
                .invoke_async(&mut c)
                .await?;
            if token < 1 {
                return Err("proto lock busy".into());
            }
            release_as_distlock(&mut c, &keys, &owner).await?;
            Ok(())
        })
    })
}

async fn redis_target() -> Result<Target, BoxError> {
    let server = tokio::task::spawn_blocking(|| TestServer::start(ServerKind::Redis)).await??;
    let client = redis::Client::open(server.url())?;
    let conn = client.get_multiplexed_async_connection().await?;
    let c1 = conn.clone();
    let rtt: Step = Arc::new(move |_, _| {
        let mut c = c1.clone();
        Box::pin(async move {
            let _: String = redis::cmd("PING").query_async(&mut c).await?;
            Ok(())
        })
    });
    let raw = redis_raw(conn.clone());
    let fresh: Connect = Arc::new(move || {
        let client = client.clone();
        Box::pin(async move {
            let conn = client.get_multiplexed_async_connection().await?;
            Ok(Fresh {
                raw: redis_raw(conn.clone()),
                proto: Some(redis_proto(conn)),
                client: None,
            })
        })
    });
    // The raw shared hold: the raw shared acquire script, then the release
    // script, in the backend's layout.
    let (c5, shared) = (conn.clone(), RawShared::new());
    let raw_shared: Step = Arc::new(move |i, slot| {
        let (mut c, shared) = (c5.clone(), shared.clone());
        Box::pin(async move {
            let owner = uuid_like(i);
            if !shared.acquire(&mut c, slot, &owner).await? {
                return Err("raw shared lock busy".into());
            }
            shared.release(&mut c, slot, &owner).await?;
            Ok(())
        })
    });
    // The raw semaphore: the permit script, then `ZREM`.
    let (c4, script) = (conn.clone(), permit_script());
    let raw_permit: Step = Arc::new(move |i, slot| {
        let (mut c, script) = (c4.clone(), script.clone());
        Box::pin(async move {
            let key = format!("bench/raw-permit/{slot}");
            let owner = format!("raw-{i}");
            if !permit_acquire(&mut c, &script, &key, &owner).await? {
                return Err("raw semaphore full".into());
            }
            let _: i64 = redis::cmd("ZREM")
                .arg(&key)
                .arg(&owner)
                .query_async(&mut c)
                .await?;
            Ok(())
        })
    });
    // distlock's two scripts with the backend's keys and arguments.
    let proto = redis_proto(conn.clone());
    // Every distlock request is a script call (EVALSHA; EVAL is counted
    // too, for scripts sent whole); the INFO call itself is not counted.
    let requests = redis_requests(vec![conn], &["evalsha", "eval"]);
    Ok(Target {
        name: "redis",
        url: server.url().to_string(),
        rtt,
        raw,
        proto: Some(proto),
        raw_permit,
        raw_shared: Some(raw_shared),
        requests: Some(requests),
        client: None,
        fresh,
        _server: Some(server),
        _servers: Vec::new(),
    })
}

/// The raw steps on a pool of either database: a round trip (`SELECT 1`),
/// and an acquire by `$acquire` followed by a release by `$release`, each
/// bound to the slot's name and the task's owner. A macro because sqlx types
/// its queries by database.
macro_rules! raw_sql_steps {
    ($pool:expr, $acquire:literal, $release:literal) => {{
        let pool = $pool;
        let p1 = pool.clone();
        let rtt: Step = Arc::new(move |_, _| {
            let p = p1.clone();
            Box::pin(async move {
                sqlx::query("SELECT 1").execute(&p).await?;
                Ok(())
            })
        });
        let raw: Step = Arc::new(move |i, slot| {
            let p = pool.clone();
            Box::pin(async move {
                let (name, owner) = (format!("raw/{slot}"), format!("raw-{i}"));
                let t: Option<i64> = sqlx::query_scalar($acquire)
                    .bind(&name)
                    .bind(&owner)
                    .fetch_optional(&p)
                    .await?;
                t.ok_or("raw lock busy")?;
                sqlx::query($release)
                    .bind(&name)
                    .bind(&owner)
                    .execute(&p)
                    .await?;
                Ok(())
            })
        });
        (rtt, raw)
    }};
}

/// distlock's own PostgreSQL requests sent raw: the backend's
/// `try_acquire` upsert and its release, on its table, with an owner as
/// long as the backend's and the client's holder info.
fn postgres_proto(pool: sqlx::PgPool) -> Result<Step, BoxError> {
    use distlock::sql::requests;
    let table = distlock::sql::SqlConfig::default().table;
    let (acquire, release) = (
        Arc::new(requests::postgres_try_acquire(&table)?),
        Arc::new(requests::postgres_release(&table)?),
    );
    let channel = Arc::new(requests::postgres_channel(&table)?);
    let info = distlock::default_holder_info();
    Ok(Arc::new(move |i, slot| {
        let (p, acquire, release, channel, info) = (
            pool.clone(),
            acquire.clone(),
            release.clone(),
            channel.clone(),
            info.clone(),
        );
        Box::pin(async move {
            let (name, owner) = (format!("bench/proto/{slot}"), format!("{i:036x}"));
            let token: Option<i64> = sqlx::query_scalar(acquire.as_str())
                .bind(&name)
                .bind(&owner)
                .bind(30_000_000i64)
                .bind(None::<String>)
                .bind(&*info)
                .fetch_optional(&p)
                .await?;
            token.ok_or("proto lock busy")?;
            let held: Option<(bool, Option<String>)> = sqlx::query_as(release.as_str())
                .bind(&name)
                .bind(&owner)
                .bind(channel.as_str())
                .fetch_optional(&p)
                .await?;
            if held.map(|(h, _)| h) != Some(true) {
                return Err("proto release: not held".into());
            }
            Ok(())
        })
    }))
}

async fn sql_target(backend: &str) -> Result<Target, BoxError> {
    let (url, server) = if backend == "sqlite" {
        let dir = integration_tests::harness::process::temp_dir("bench-sqlite")?;
        (format!("sqlite://{}", dir.join("bench.db").display()), None)
    } else {
        let s = tokio::task::spawn_blocking(|| TestServer::start(ServerKind::Postgres)).await??;
        (s.url().to_string(), Some(s))
    };
    // The raw sequences run on the same kind of pool distlock builds. The
    // raw semaphore keeps one row per permit, with no semaphore row and no
    // fencing counter: the acquire inserts the owner's row if fewer than the
    // limit are live, the release deletes it.
    //
    // The raw shared hold follows the SQL backend's layout: the lock row's
    // owner is `shared` while shared holds keep it, its `expires_at` the
    // latest hold's end; one row per hold in `raw_locks_shared` and one per
    // waiting writer's mark in `raw_locks_writers`. The grant takes the lock
    // row unless it is held exclusively or a mark lasts (bumping the token)
    // and inserts the hold's row; the release deletes it and the name's
    // expired holds under the lock row's lock and sets the row's end to the
    // latest live hold's, or frees the row. No wake-up (no NOTIFY), as in
    // the raw lock.
    let (rtt, raw, proto, raw_permit, raw_shared, client, fresh): (
        Step,
        Step,
        Option<Step>,
        Step,
        Step,
        _,
        Connect,
    ) = if backend == "sqlite" {
        let options = <sqlx::sqlite::SqliteConnectOptions as std::str::FromStr>::from_str(&url)?
            .create_if_missing(true)
            .journal_mode(sqlx::sqlite::SqliteJournalMode::Wal)
            .synchronous(sqlx::sqlite::SqliteSynchronous::Full)
            .busy_timeout(Duration::from_secs(5));
        let pool = sqlx::sqlite::SqlitePoolOptions::new()
            .max_connections(4)
            .connect_with(options.clone())
            .await?;
        sqlx::query("CREATE TABLE IF NOT EXISTS raw_locks (name TEXT PRIMARY KEY, owner TEXT, token INTEGER NOT NULL, expires_at INTEGER NOT NULL)").execute(&pool).await?;
        sqlx::query("CREATE TABLE IF NOT EXISTS raw_permits (name TEXT NOT NULL, owner TEXT NOT NULL, expires_at INTEGER NOT NULL, PRIMARY KEY (name, owner))").execute(&pool).await?;
        let p = pool.clone();
        // One statement each, as SQLite runs a writing statement under the
        // file's write lock: the count and the insert see the same rows.
        // With no data-modifying CTE in SQLite, the release also deletes
        // the name's expired permits (the acquire counts only live ones).
        let raw_permit: Step = Arc::new(move |i, slot| {
            let p = p.clone();
            Box::pin(async move {
                let (name, owner) = (format!("raw-permit/{slot}"), format!("raw-{i}"));
                let granted: Option<i32> = sqlx::query_scalar(
                    "INSERT INTO raw_permits
                     SELECT ?1, ?2, CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER) + 30000
                      WHERE (SELECT count(*) FROM raw_permits WHERE name = ?1
                              AND expires_at > CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER)) < ?3
                     RETURNING 1",
                )
                .bind(&name)
                .bind(&owner)
                .bind(i64::from(UNCONTENDED_LIMIT))
                .fetch_optional(&p)
                .await?;
                granted.ok_or("raw semaphore full")?;
                sqlx::query(
                    "DELETE FROM raw_permits WHERE name = ?1 AND (owner = ?2
                      OR expires_at <= CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER))",
                )
                .bind(&name)
                .bind(&owner)
                .execute(&p)
                .await?;
                Ok(())
            })
        });
        sqlx::query("CREATE TABLE IF NOT EXISTS raw_locks_shared (name TEXT NOT NULL, owner TEXT NOT NULL, expires_at INTEGER NOT NULL, PRIMARY KEY (name, owner))").execute(&pool).await?;
        sqlx::query("CREATE TABLE IF NOT EXISTS raw_locks_writers (name TEXT NOT NULL, owner TEXT NOT NULL, expires_at INTEGER NOT NULL, PRIMARY KEY (name, owner))").execute(&pool).await?;
        // Each half one transaction whose first statement is a write, so
        // that it runs under the file's write lock: the upsert and the
        // hold's insert; the deletion and the lock row's update.
        let p = pool.clone();
        let raw_shared: Step = Arc::new(move |i, slot| {
            let p = p.clone();
            Box::pin(async move {
                const NOW: &str = "CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER)";
                let (name, owner) = (format!("raw-shared/{slot}"), uuid_like(i));
                let mut tx = p.begin().await?;
                let token: Option<i64> = sqlx::query_scalar(&format!(
                    "INSERT INTO raw_locks VALUES (?1, 'shared', 1, {NOW} + 30000)
                     ON CONFLICT(name) DO UPDATE
                        SET owner = 'shared', token = raw_locks.token + 1,
                            expires_at = max(raw_locks.expires_at, excluded.expires_at)
                      WHERE (raw_locks.owner IS NULL OR raw_locks.expires_at <= {NOW}
                             OR raw_locks.owner = 'shared')
                        AND NOT EXISTS (SELECT 1 FROM raw_locks_writers
                                         WHERE name = ?1 AND expires_at > {NOW})
                     RETURNING token"
                ))
                .bind(&name)
                .fetch_optional(&mut *tx)
                .await?;
                if token.is_some() {
                    sqlx::query(&format!(
                        "INSERT INTO raw_locks_shared VALUES (?1, ?2, {NOW} + 30000)"
                    ))
                    .bind(&name)
                    .bind(&owner)
                    .execute(&mut *tx)
                    .await?;
                }
                tx.commit().await?;
                token.ok_or("raw shared lock busy")?;
                let mut tx = p.begin().await?;
                sqlx::query(&format!(
                    "DELETE FROM raw_locks_shared
                      WHERE name = ?1 AND (owner = ?2 OR expires_at <= {NOW})"
                ))
                .bind(&name)
                .bind(&owner)
                .execute(&mut *tx)
                .await?;
                sqlx::query(
                    "UPDATE raw_locks
                        SET owner = CASE WHEN EXISTS (SELECT 1 FROM raw_locks_shared WHERE name = ?1)
                                         THEN owner ELSE NULL END,
                            expires_at = coalesce((SELECT max(expires_at) FROM raw_locks_shared
                                                    WHERE name = ?1), expires_at)
                      WHERE name = ?1 AND owner = 'shared'",
                )
                .bind(&name)
                .execute(&mut *tx)
                .await?;
                tx.commit().await?;
                Ok(())
            })
        });
        macro_rules! sqlite_raw {
            ($pool:expr) => {
                raw_sql_steps!(
                    $pool,
                    "INSERT INTO raw_locks VALUES (?1, ?2, 1, 0) ON CONFLICT(name) DO UPDATE SET owner = excluded.owner, token = raw_locks.token + 1 WHERE raw_locks.owner IS NULL RETURNING token",
                    "UPDATE raw_locks SET owner = NULL WHERE name = ?1 AND owner = ?2"
                )
            };
        }
        let (rtt, raw) = sqlite_raw!(pool);
        let fresh: Connect = Arc::new(move || {
            let options = options.clone();
            Box::pin(async move {
                let pool = sqlx::sqlite::SqlitePoolOptions::new()
                    .max_connections(4)
                    .connect_with(options)
                    .await?;
                Ok(Fresh {
                    raw: sqlite_raw!(pool).1,
                    proto: None,
                    client: None,
                })
            })
        });
        (rtt, raw, None, raw_permit, raw_shared, None, fresh)
    } else {
        let pool = sqlx::postgres::PgPoolOptions::new()
            .max_connections(10)
            .connect(&url)
            .await?;
        sqlx::query("CREATE TABLE IF NOT EXISTS raw_locks (name TEXT PRIMARY KEY, owner TEXT, token BIGINT NOT NULL, expires_at TIMESTAMPTZ NOT NULL)").execute(&pool).await?;
        sqlx::query("CREATE TABLE IF NOT EXISTS raw_permits (name TEXT NOT NULL, owner TEXT NOT NULL, expires_at TIMESTAMPTZ NOT NULL, PRIMARY KEY (name, owner))").execute(&pool).await?;
        let p = pool.clone();
        // Under READ COMMITTED a statement counts from the snapshot it
        // started with, so concurrent acquirers of a name must take turns
        // before the counting statement starts: a transaction holding the
        // name's advisory lock, then one statement that deletes the expired
        // permits and inserts the owner's if fewer than the limit are live.
        let raw_permit: Step = Arc::new(move |i, slot| {
            let p = p.clone();
            Box::pin(async move {
                let (name, owner) = (format!("raw-permit/{slot}"), format!("raw-{i}"));
                let mut tx = p.begin().await?;
                sqlx::query("SELECT pg_advisory_xact_lock(hashtext($1))")
                    .bind(&name)
                    .execute(&mut *tx)
                    .await?;
                let granted: Option<i32> = sqlx::query_scalar(
                    "WITH expired AS (
                        DELETE FROM raw_permits WHERE name = $1 AND expires_at <= now())
                     INSERT INTO raw_permits (name, owner, expires_at)
                     SELECT $1, $2, now() + interval '30 seconds'
                      WHERE (SELECT count(*) FROM raw_permits
                              WHERE name = $1 AND expires_at > now()) < $3
                     RETURNING 1",
                )
                .bind(&name)
                .bind(&owner)
                .bind(i64::from(UNCONTENDED_LIMIT))
                .fetch_optional(&mut *tx)
                .await?;
                tx.commit().await?;
                granted.ok_or("raw semaphore full")?;
                sqlx::query("DELETE FROM raw_permits WHERE name = $1 AND owner = $2")
                    .bind(&name)
                    .bind(&owner)
                    .execute(&p)
                    .await?;
                Ok(())
            })
        });
        sqlx::query("CREATE TABLE IF NOT EXISTS raw_locks_shared (name TEXT NOT NULL, owner TEXT NOT NULL, expires_at TIMESTAMPTZ NOT NULL, PRIMARY KEY (name, owner))").execute(&pool).await?;
        sqlx::query("CREATE TABLE IF NOT EXISTS raw_locks_writers (name TEXT NOT NULL, owner TEXT NOT NULL, expires_at TIMESTAMPTZ NOT NULL, PRIMARY KEY (name, owner))").execute(&pool).await?;
        // The grant is one statement: the upsert on the lock row (whose row
        // lock orders it with every other grant of the name) and the hold's
        // insert in one CTE. So is the release: it deletes the hold and
        // settles the lock row from the holds its snapshot shows, unless the
        // row's version (`xmin`) changed meanwhile (a raced release, which a
        // closed loop on its own names never meets).
        let p = pool.clone();
        let raw_shared: Step = Arc::new(move |i, slot| {
            let p = p.clone();
            Box::pin(async move {
                let (name, owner) = (format!("raw-shared/{slot}"), uuid_like(i));
                let token: Option<i64> = sqlx::query_scalar(
                    "WITH granted AS (
                        INSERT INTO raw_locks AS l VALUES ($1, 'shared', 1, now() + interval '30 seconds')
                        ON CONFLICT (name) DO UPDATE
                           SET owner = 'shared', token = l.token + 1,
                               expires_at = greatest(l.expires_at, EXCLUDED.expires_at)
                         WHERE (l.owner IS NULL OR l.expires_at <= now() OR l.owner = 'shared')
                           AND NOT EXISTS (SELECT 1 FROM raw_locks_writers
                                            WHERE name = $1 AND expires_at > now())
                        RETURNING token),
                     hold AS (
                        INSERT INTO raw_locks_shared
                        SELECT $1, $2, now() + interval '30 seconds' FROM granted)
                     SELECT token FROM granted",
                )
                .bind(&name)
                .bind(&owner)
                .fetch_optional(&p)
                .await?;
                token.ok_or("raw shared lock busy")?;
                let raced: bool = sqlx::query_scalar(
                    "WITH gone AS (
                        DELETE FROM raw_locks_shared
                         WHERE name = $1 AND (owner = $2 OR expires_at <= now())),
                     seen AS (
                        SELECT xmin AS version FROM raw_locks WHERE name = $1 AND owner = 'shared'),
                     rest AS (
                        SELECT max(expires_at) AS until FROM raw_locks_shared
                         WHERE name = $1 AND owner <> $2 AND expires_at > now()),
                     settled AS (
                        UPDATE raw_locks l
                           SET owner = CASE WHEN rest.until IS NULL THEN NULL ELSE l.owner END,
                               expires_at = coalesce(rest.until, l.expires_at)
                          FROM rest, seen
                         WHERE l.name = $1 AND l.owner = 'shared' AND l.xmin = seen.version
                        RETURNING 1)
                     SELECT EXISTS (SELECT 1 FROM seen) AND NOT EXISTS (SELECT 1 FROM settled)",
                )
                .bind(&name)
                .bind(&owner)
                .fetch_one(&p)
                .await?;
                if raced {
                    return Err("raw shared release raced (never in a closed loop)".into());
                }
                Ok(())
            })
        });
        let client = LockClient::new(
            distlock::sql::SqlBackend::postgres(
                pool.clone(),
                distlock::sql::SqlConfig::default().with_fifo(fifo()),
            )
            .await?,
        );
        macro_rules! postgres_raw {
            ($pool:expr) => {
                raw_sql_steps!(
                    $pool,
                    "INSERT INTO raw_locks AS l VALUES ($1, $2, 1, now()) ON CONFLICT (name) DO UPDATE SET owner = EXCLUDED.owner, token = l.token + 1 WHERE l.owner IS NULL RETURNING token",
                    "UPDATE raw_locks SET owner = NULL WHERE name = $1 AND owner = $2"
                )
            };
        }
        let proto = postgres_proto(pool.clone())?;
        let (rtt, raw) = postgres_raw!(pool);
        let fresh_url = url.clone();
        let fresh: Connect = Arc::new(move || {
            let url = fresh_url.clone();
            Box::pin(async move {
                let pool = sqlx::postgres::PgPoolOptions::new()
                    .max_connections(10)
                    .connect(&url)
                    .await?;
                let client = LockClient::new(
                    distlock::sql::SqlBackend::postgres(
                        pool.clone(),
                        distlock::sql::SqlConfig::default().with_fifo(fifo()),
                    )
                    .await?,
                );
                Ok(Fresh {
                    proto: Some(postgres_proto(pool.clone())?),
                    raw: postgres_raw!(pool).1,
                    client: Some(client),
                })
            })
        });
        (
            rtt,
            raw,
            Some(proto),
            raw_permit,
            raw_shared,
            Some(client),
            fresh,
        )
    };
    // PostgreSQL counts statements in `pg_stat_statements` (preloaded by
    // the harness): those naming distlock's tables or channels are its
    // requests (a channel named after the table, or a client's own
    // `distlock_q_` one: LISTEN and UNLISTEN name their channels).
    let requests: Option<Counter> = if backend == "sqlite" {
        None
    } else {
        let pool = sqlx::postgres::PgPoolOptions::new()
            .max_connections(1)
            .connect(&url)
            .await?;
        sqlx::query("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            .execute(&pool)
            .await?;
        Some(Arc::new(move || {
            let pool = pool.clone();
            Box::pin(async move {
                let n: i64 = sqlx::query_scalar(
                    "SELECT coalesce(sum(calls), 0)::bigint FROM pg_stat_statements
                      WHERE (query LIKE '%distlock_locks%' OR query LIKE '%distlock\\_q\\_%')
                        AND query NOT LIKE '%pg_stat_statements%'",
                )
                .fetch_one(&pool)
                .await?;
                Ok(u64::try_from(n).unwrap_or(0))
            })
        }))
    };
    Ok(Target {
        name: if backend == "sqlite" {
            "sqlite"
        } else {
            "postgres"
        },
        url,
        rtt,
        raw,
        proto,
        raw_permit,
        raw_shared: Some(raw_shared),
        requests,
        client,
        fresh,
        _server: server,
        _servers: Vec::new(),
    })
}

/// The raw etcd lock on `client`: a put-if-absent txn on `lease`, then a
/// delete.
fn etcd_raw(client: etcd_client::Client, lease: i64) -> Step {
    use etcd_client::{Compare, CompareOp, PutOptions, Txn, TxnOp};
    Arc::new(move |_, slot| {
        let mut c = client.clone();
        Box::pin(async move {
            let key = format!("bench/raw/{slot}/{lease:x}");
            let txn = Txn::new()
                .when([Compare::create_revision(key.as_str(), CompareOp::Equal, 0)])
                .and_then([TxnOp::put(
                    key.as_str(),
                    "raw",
                    Some(PutOptions::new().with_lease(lease)),
                )]);
            if !c.txn(txn).await?.succeeded() {
                return Err("raw lock busy".into());
            }
            c.delete(key, None).await?;
            Ok(())
        })
    })
}

/// distlock's two txns on `client`: put my key with the session's lease
/// and read the queue head; then delete my key if it still carries my
/// owner.
fn etcd_proto(client: etcd_client::Client, lease: i64) -> Step {
    Arc::new(move |i, slot| {
        let mut c = client.clone();
        Box::pin(async move {
            let prefix = format!("bench/proto/{slot}/");
            let key = format!("{prefix}{lease:x}");
            let owner = format!("{i:032x}");
            let txn = distlock::etcd::requests::enqueue(&key, &prefix, &owner, lease);
            if !c.txn(txn).await?.succeeded() {
                return Err("proto lock busy".into());
            }
            let del = distlock::etcd::requests::delete_mine(&key, &owner);
            c.txn(del).await?;
            Ok(())
        })
    })
}

async fn etcd_target() -> Result<Target, BoxError> {
    use etcd_client::{
        Compare, CompareOp, GetOptions, PutOptions, SortOrder, SortTarget, Txn, TxnOp,
        TxnOpResponse,
    };
    let server = tokio::task::spawn_blocking(|| TestServer::start(ServerKind::Etcd)).await??;
    let endpoint = format!("http://{}:{}", server.host(), server.port());
    let client = etcd_client::Client::connect([endpoint.clone()], None).await?;
    let lease = client.clone().lease_grant(60, None).await?.id();
    // The raw sequences' lease lives as long as the server: kept alive
    // every 20 s until a keep-alive fails (the server stopped).
    let mut keeper = client.clone();
    tokio::spawn(async move {
        let Ok((mut keep, mut answers)) = keeper.lease_keep_alive(lease).await else {
            return;
        };
        loop {
            tokio::time::sleep(Duration::from_secs(20)).await;
            if keep.keep_alive().await.is_err() || !matches!(answers.message().await, Ok(Some(_))) {
                return;
            }
        }
    });
    let c1 = client.clone();
    let rtt: Step = Arc::new(move |_, _| {
        let mut c = c1.clone();
        Box::pin(async move {
            c.get("bench/none", None).await?;
            Ok(())
        })
    });
    // distlock's two txns: put my key with the session's lease and read
    // the queue head; then delete my key if it still carries my owner.
    let proto = etcd_proto(client.clone(), lease);
    // The raw semaphore: one txn counts the permit keys and puts the
    // owner's on the session's lease (granted if fewer than the limit were
    // there before it: each holder's key exists while it holds, so at most
    // the limit hold); then delete the key.
    let c3 = client.clone();
    let raw_permit: Step = Arc::new(move |i, slot| {
        let mut c = c3.clone();
        Box::pin(async move {
            let prefix = format!("bench/raw-permit/{slot}/");
            let key = format!("{prefix}{i:x}");
            let txn = Txn::new().and_then([
                TxnOp::get(
                    prefix.as_str(),
                    Some(GetOptions::new().with_prefix().with_count_only()),
                ),
                TxnOp::put(key.as_str(), "", Some(PutOptions::new().with_lease(lease))),
            ]);
            let resp = c.txn(txn).await?;
            let before = match resp.op_responses().first() {
                Some(TxnOpResponse::Get(g)) => g.count(),
                _ => return Err("raw semaphore: no count in the txn's answer".into()),
            };
            c.delete(key, None).await?;
            if before >= i64::from(UNCONTENDED_LIMIT) {
                return Err("raw semaphore full".into());
            }
            Ok(())
        })
    });
    // The raw shared hold, in the backend's layout: one txn puts
    // `<name>/@r/<owner>` on the session's lease if absent and reads the
    // oldest key of each of the two ranges that hold every key under the
    // prefix but the shared ones (`[<name>/, <name>/@r/)` and
    // `[<name>/@r0, <name>0)`); held if none of them is older than mine.
    // Then delete the key if it still carries my owner.
    let c4 = client.clone();
    let raw_shared: Step = Arc::new(move |i, slot| {
        let mut c = c4.clone();
        Box::pin(async move {
            let name = format!("bench/raw-shared/{slot}");
            let owner = uuid_like(i);
            let key = format!("{name}/@r/{owner}");
            let oldest = |start: String, end: String| {
                TxnOp::get(
                    start,
                    Some(
                        GetOptions::new()
                            .with_range(end)
                            .with_sort(SortTarget::Create, SortOrder::Ascend)
                            .with_limit(1),
                    ),
                )
            };
            let txn = Txn::new()
                .when([Compare::create_revision(key.as_str(), CompareOp::Equal, 0)])
                .and_then([
                    TxnOp::put(
                        key.as_str(),
                        owner.as_str(),
                        Some(PutOptions::new().with_lease(lease)),
                    ),
                    oldest(format!("{name}/"), format!("{name}/@r/")),
                    oldest(format!("{name}/@r0"), format!("{name}0")),
                ]);
            let resp = c.txn(txn).await?;
            if !resp.succeeded() {
                return Err("raw shared: key exists".into());
            }
            let mine = resp.header().map_or(0, |h| h.revision());
            let blocked = resp.op_responses().iter().any(|op| match op {
                TxnOpResponse::Get(g) => g.kvs().iter().any(|kv| kv.create_revision() < mine),
                _ => false,
            });
            let del = Txn::new()
                .when([Compare::value(
                    key.as_str(),
                    CompareOp::Equal,
                    owner.as_str(),
                )])
                .and_then([TxnOp::delete(key.as_str(), None)]);
            c.txn(del).await?;
            if blocked {
                return Err("raw shared lock busy".into());
            }
            Ok(())
        })
    });
    let raw = etcd_raw(client.clone(), lease);
    let fresh_endpoint = endpoint.clone();
    let fresh: Connect = Arc::new(move || {
        let endpoint = fresh_endpoint.clone();
        Box::pin(async move {
            let client = etcd_client::Client::connect([endpoint], None).await?;
            Ok(Fresh {
                raw: etcd_raw(client.clone(), lease),
                proto: Some(etcd_proto(client, lease)),
                client: None,
            })
        })
    });
    Ok(Target {
        name: "etcd",
        url: server.url().to_string(),
        rtt,
        raw,
        proto: Some(proto),
        raw_permit,
        raw_shared: Some(raw_shared),
        requests: None,
        client: None,
        fresh,
        _server: Some(server),
        _servers: Vec::new(),
    })
}

/// The raw ZooKeeper lock on `client`: create an ephemeral sequential node,
/// then delete it.
fn zookeeper_raw(client: zookeeper_client::Client) -> Step {
    use zookeeper_client as zk;
    Arc::new(move |_, _| {
        let c = client.clone();
        Box::pin(async move {
            let opts = zk::CreateMode::EphemeralSequential.with_acls(zk::Acls::anyone_all());
            let (_, seq) = c.create("/bench/raw/lock-", b"", &opts).await?;
            c.delete(&format!("/bench/raw/lock-{seq}"), None).await?;
            Ok(())
        })
    })
}

/// distlock's requests on `client`: create my sequential node (the owner
/// in its name) under the slot's parent and, sent right behind it, list the
/// parent's children to see whether it is first; then delete it. A
/// missing parent is made, and the node created again.
fn zookeeper_proto(client: zookeeper_client::Client) -> Step {
    use zookeeper_client as zk;
    Arc::new(move |i, slot| {
        let c = client.clone();
        Box::pin(async move {
            let opts = zk::CreateMode::EphemeralSequential.with_acls(zk::Acls::anyone_all());
            let parent = format!("/bench/proto/{slot}");
            let prefix = format!("_c_{i:032x}-lock-");
            let path = format!("{parent}/{prefix}");
            let (mut created, mut listed) =
                tokio::join!(c.create(&path, b"", &opts), c.list_children(&parent));
            if matches!(created, Err(zk::Error::NoNode)) {
                let dir = zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all());
                c.mkdir(&parent, &dir).await?;
                (created, listed) =
                    tokio::join!(c.create(&path, b"", &opts), c.list_children(&parent));
            }
            let mine = format!("{prefix}{}", created?.1);
            if !listed?.contains(&mine) {
                return Err("proto node missing".into());
            }
            c.delete(&format!("{parent}/{mine}"), None).await?;
            Ok(())
        })
    })
}

async fn zookeeper_target() -> Result<Target, BoxError> {
    use zookeeper_client as zk;
    let server = tokio::task::spawn_blocking(|| TestServer::start(ServerKind::ZooKeeper)).await??;
    let hosts = format!("{}:{}", server.host(), server.port());
    let client = zk::Client::connect(&hosts).await?;
    let dir = zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all());
    client.mkdir("/bench/raw", &dir).await?;
    let c1 = client.clone();
    let rtt: Step = Arc::new(move |_, _| {
        let c = c1.clone();
        Box::pin(async move {
            c.check_stat("/").await?;
            Ok(())
        })
    });
    // distlock's requests: create my sequential node (the owner in its
    // name) and, sent right behind it, list the children to see whether it
    // is first; then delete it.
    client.mkdir("/bench/proto", &dir).await?;
    let proto = zookeeper_proto(client.clone());
    // The raw semaphore (the minimal path of Curator's
    // `InterProcessSemaphoreV2`, without its lock): create an ephemeral
    // sequential node and, in the same flight, list the children; the
    // permit is held if the node is among the first `limit`; then delete it.
    client.mkdir("/bench/raw-permit", &dir).await?;
    let c3 = client.clone();
    let raw_permit: Step = Arc::new(move |_, _| {
        let c = c3.clone();
        Box::pin(async move {
            let opts = zk::CreateMode::EphemeralSequential.with_acls(zk::Acls::anyone_all());
            let (created, listed) = tokio::join!(
                c.create("/bench/raw-permit/permit-", b"", &opts),
                c.list_children("/bench/raw-permit")
            );
            let mine = format!("permit-{}", created?.1);
            // Equal-width sequence numbers: the names sort in creation order.
            let mut children = listed?;
            children.sort_unstable();
            let rank = children.iter().position(|n| *n == mine);
            c.delete(&format!("/bench/raw-permit/{mine}"), None).await?;
            match rank {
                Some(k) if k < UNCONTENDED_LIMIT as usize => Ok(()),
                Some(_) => Err("raw semaphore full".into()),
                None => Err("raw semaphore: own node not listed".into()),
            }
        })
    });
    // The raw shared hold, as Curator's `InterProcessReadWriteLock` read
    // lock and the backend lay it out: create the ephemeral sequential
    // child `_c_<uuid>-__READ__` and, in the same flight, list the
    // children; held if no child that is not a read node is ahead of mine
    // (by the ten-digit sequence). Then delete it.
    client.mkdir("/bench/raw-shared", &dir).await?;
    let c4 = client.clone();
    let raw_shared: Step = Arc::new(move |i, _| {
        let c = c4.clone();
        Box::pin(async move {
            let opts = zk::CreateMode::EphemeralSequential.with_acls(zk::Acls::anyone_all());
            let prefix = format!("_c_{}-__READ__", uuid_like(i));
            let path = format!("/bench/raw-shared/{prefix}");
            let (created, listed) = tokio::join!(
                c.create(&path, b"", &opts),
                c.list_children("/bench/raw-shared")
            );
            let mine = format!("{prefix}{}", created?.1);
            let children = listed?;
            let seq = |n: &str| n.len().checked_sub(10).map(|k| n[k..].to_string());
            let my_seq = seq(&mine);
            let blocked = children
                .iter()
                .any(|n| !n.contains("__READ__") && seq(n) < my_seq);
            let listed_mine = children.contains(&mine);
            c.delete(&format!("/bench/raw-shared/{mine}"), None).await?;
            match (listed_mine, blocked) {
                (false, _) => Err("raw shared: own node not listed".into()),
                (true, true) => Err("raw shared lock busy".into()),
                (true, false) => Ok(()),
            }
        })
    });
    let raw = zookeeper_raw(client.clone());
    let fresh_hosts = hosts.clone();
    let fresh: Connect = Arc::new(move || {
        let hosts = fresh_hosts.clone();
        Box::pin(async move {
            let client = zk::Client::connect(&hosts).await?;
            Ok(Fresh {
                raw: zookeeper_raw(client.clone()),
                proto: Some(zookeeper_proto(client)),
                client: None,
            })
        })
    });
    Ok(Target {
        name: "zookeeper",
        url: format!("zk://{hosts}"),
        rtt,
        raw,
        proto: Some(proto),
        raw_permit,
        raw_shared: Some(raw_shared),
        requests: None,
        client: None,
        fresh,
        _server: Some(server),
        _servers: Vec::new(),
    })
}

/// The whole run in a task on the runtime's worker threads, where a
/// service's handlers run: on the thread that blocks on the runtime, every
/// I/O wake-up would cross to it from a worker, and a request that spawns a
/// task would pay for waking a parked worker.
#[tokio::main]
async fn main() -> Result<(), BoxError> {
    tokio::spawn(run()).await?
}

async fn run() -> Result<(), BoxError> {
    if let Ok(url) = std::env::var(ONCE_ENV) {
        let lib = LockClient::from_dyn(distlock::connect(&url).await?);
        let g = lib
            .lock("bench/peer/once")
            .wait(Duration::from_secs(10))
            .acquire()
            .await?;
        g.release().await?;
        return Ok(());
    }
    if let Ok(spec) = std::env::var(HOLD_ENV) {
        return hold_many(&spec).await;
    }
    let mut a = Args::parse();
    FIFO.store(a.fifo, std::sync::atomic::Ordering::Relaxed);
    if let Some(unknown) = a.throughput.iter().find(|c| {
        !THROUGHPUT
            .iter()
            .any(|(t, n, k)| **c == format!("{t}x{n}x{k}"))
    }) {
        return Err(format!(
            "--throughput {unknown}: not one of scenario 3's configurations ({})",
            THROUGHPUT
                .iter()
                .map(|(t, n, k)| format!("{t}x{n}x{k}"))
                .collect::<Vec<_>>()
                .join(", ")
        )
        .into());
    }
    if a.smoke {
        a.iterations = a.iterations.min(50);
        a.seconds = a.seconds.min(0.3);
        a.clients = a.clients.min(3);
        a.waiters = vec![1, 3];
        a.handoffs = a.handoffs.min(10);
        a.held = a.held.min(50);
        a.rate = a.rate.min(200);
    }
    let mut r = Results::default();
    let _ = writeln!(
        r.md,
        "distlock-bench: {} iterations, {} s throughput runs, {} clients, waiters {:?}, {} handoffs each, {} held locks, open loop at {}/s{}\n",
        a.iterations,
        a.seconds,
        a.clients,
        a.waiters,
        a.handoffs,
        a.held,
        a.rate,
        if a.smoke { " (smoke)" } else { "" }
    );
    if a.only.iter().any(|g| g == "core") {
        core_cost(if a.smoke { 1_000 } else { 200_000 }, &mut r).await?;
    }
    for b in &a.backends {
        let t = target(b).await?;
        eprintln!("distlock-bench: {} ...", t.name);
        let _ = writeln!(r.md, "\n### {}\n", t.name);
        let lib = t.lib().await?;
        let run = |group: &str| a.only.iter().any(|g| g == group);
        let outcomes = [
            (
                "uncontended",
                if run("2") {
                    uncontended(&t, &lib, a.iterations, &mut r).await
                } else {
                    Ok(())
                },
            ),
            (
                "open loop",
                if a.rate > 0 && run("2") {
                    open_loop(&t, &lib, a.rate, a.iterations, &mut r).await
                } else {
                    Ok(())
                },
            ),
            (
                "scenarios 3-6",
                if run("3") || run("herd") {
                    scenarios_3_to_6(&t, &lib, &a, &mut r).await
                } else {
                    Ok(())
                },
            ),
            (
                "multi-lock",
                if run("multi") {
                    multi::run(&t, &lib, (a.iterations / 10).max(10), &mut r).await
                } else {
                    Ok(())
                },
            ),
            (
                "holding many locks",
                if run("7") {
                    scenario_7(&t, &a, &mut r).await
                } else {
                    Ok(())
                },
            ),
            (
                "peers",
                if a.peers && run("peers") {
                    peers::run(t.name, &t.url, a.iterations, &lib, &mut r.md).await
                } else {
                    Ok(())
                },
            ),
        ];
        for (what, outcome) in outcomes {
            if let Err(e) = outcome {
                // The smoke must keep the harness working; the real run
                // records what a backend could not do, and goes on.
                if a.smoke {
                    return Err(format!("{}: {what}: {e}", t.name).into());
                }
                let _ = writeln!(
                    r.md,
                    "
**{}: {what} failed:** {e}",
                    t.name
                );
            }
        }
        if let Some(dir) = &a.out {
            std::fs::create_dir_all(dir)?;
            std::fs::write(dir.join("results.md"), &r.md)?;
        }
    }
    if !r.ratios.is_empty() {
        let _ = writeln!(
            r.md,
            "\n### uncontended, closed loop: distlock / its raw sequence at p50\n\n| backend | lock | semaphore of {UNCONTENDED_LIMIT} | shared |\n|---|---|---|---|"
        );
        for x in &r.ratios {
            let shared = match x.shared {
                Some((v, true)) => format!("{v:.2}"),
                Some((v, false)) => format!("{v:.2} (against the raw lock sequence)"),
                None => "-".into(),
            };
            let _ = writeln!(
                r.md,
                "| {} | {:.2} | {:.2} | {shared} |",
                x.name, x.lock, x.permit
            );
        }
    }
    println!("{}", r.md);
    if let Some(dir) = &a.out {
        std::fs::create_dir_all(dir)?;
        std::fs::write(dir.join("results.md"), &r.md)?;
        let series = ["raw p50", "distlock p50", "raw p99", "distlock p99"].map(String::from);
        std::fs::write(
            dir.join("uncontended-latency.svg"),
            plot::bars(
                "Uncontended acquire+release latency (µs), distlock vs raw",
                "µs",
                &series,
                &r.latency,
            ),
        )?;
        let xs: Vec<String> = a.waiters.iter().map(|w| w.to_string()).collect();
        std::fs::write(
            dir.join("handoff-latency.svg"),
            plot::lines(
                "Handoff latency p50 (µs) against waiters",
                "µs",
                "waiters",
                &xs,
                &r.handoff,
            ),
        )?;
        eprintln!("distlock-bench: wrote {}", dir.display());
    }
    Ok(())
}
