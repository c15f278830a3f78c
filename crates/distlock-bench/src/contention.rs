//! Scenarios with more than one client: throughput on K names, contention
//! on one name (fairness), handoff latency and the herd.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use distlock::LockClient;
use hdrhistogram::Histogram;
use tokio::time::Instant;

use crate::{BoxError, Step};

/// What one side of a throughput run did: operations per second, and the
/// process's CPU time and thread blocks per operation.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Rate {
    pub(crate) ops_per_sec: f64,
    pub(crate) cpu_us_per_op: f64,
    pub(crate) blocks_per_op: f64,
}

/// What one side did over its slices, summed.
#[derive(Clone, Copy, Debug, Default)]
struct Tally {
    ops: u64,
    took: Duration,
    cpu: Duration,
    blocks: i64,
}

impl Tally {
    fn rate(&self) -> Rate {
        let n = self.ops.max(1) as f64;
        Rate {
            ops_per_sec: n / self.took.as_secs_f64().max(1e-9),
            cpu_us_per_op: self.cpu.as_secs_f64() * 1e6 / n,
            blocks_per_op: self.blocks as f64 / n,
        }
    }
}

/// One side's operation: `op(task, i)` for task `task`'s `i`-th.
type Op = Arc<dyn Fn(usize, u32) -> crate::BoxFut<()> + Send + Sync>;

/// Runs `tasks` tasks for `run_for`, each looping `op(task, i)` where `i`
/// counts its operations (going on from `first[task]`), and adds what they
/// did to `tally`.
async fn slice(
    tasks: usize,
    run_for: Duration,
    op: &Op,
    first: &mut [u32],
    tally: &mut Tally,
) -> Result<(), BoxError> {
    let (cpu, blocked) = crate::usage();
    let start = Instant::now();
    let end = start + run_for;
    let mut running = Vec::new();
    for (task, from) in first.iter().enumerate().take(tasks) {
        let (op, mut i) = (op.clone(), *from);
        running.push(tokio::spawn(async move {
            let mut done = 0u64;
            while Instant::now() < end {
                op(task, i).await?;
                i = i.wrapping_add(1);
                done += 1;
            }
            Ok::<(u64, u32), BoxError>((done, i))
        }));
    }
    for (task, t) in running.into_iter().enumerate() {
        let (done, next) = t.await??;
        tally.ops += done;
        first[task] = next;
    }
    tally.took += start.elapsed();
    let (cpu_after, blocked_after) = crate::usage();
    tally.cpu += cpu_after.saturating_sub(cpu);
    tally.blocks += blocked_after - blocked;
    Ok(())
}

/// How many slices each side of a throughput run is cut into, the sides
/// taking turns, so that a slow spell of the machine hits every side.
const SLICES: u32 = 5;

/// Runs every side of `sides` (only side `only`, if given) for `run_for`
/// in all, in [`SLICES`] turns each, and measures each side over its turns;
/// a side not run measures nothing.
async fn rates(
    tasks: usize,
    run_for: Duration,
    sides: &[Op],
    only: Option<usize>,
) -> Result<Vec<Option<Rate>>, BoxError> {
    let mut tallies = vec![Tally::default(); sides.len()];
    let mut next = vec![vec![0u32; tasks]; sides.len()];
    let runs = |k: usize| only.is_none_or(|o| o == k);
    for _ in 0..SLICES {
        for (k, op) in sides.iter().enumerate().filter(|(k, _)| runs(*k)) {
            slice(tasks, run_for / SLICES, op, &mut next[k], &mut tallies[k]).await?;
        }
    }
    Ok(tallies
        .iter()
        .enumerate()
        .map(|(k, t)| runs(k).then(|| t.rate()))
        .collect())
}

/// The sides of a throughput run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Side {
    /// distlock's client.
    Distlock,
    /// The raw minimal sequence.
    Raw,
    /// distlock's own requests sent raw.
    Requests,
}

/// The name slot of a task's `i`-th operation when `tasks` tasks share
/// `names` names: each task walks through its own names (those congruent
/// to it modulo `tasks`), so no two tasks ever want the same name and
/// neither side waits.
fn slot(task: usize, i: u32, tasks: usize, names: usize) -> usize {
    let own = names.div_ceil(tasks).max(1);
    let slot = task + tasks * (i as usize % own);
    if slot < names {
        slot
    } else {
        task
    }
}

/// What one configuration of scenario 3 measured: distlock, the raw
/// sequence, and distlock's requests sent raw (where written); `None` for a
/// side that did not run.
pub(crate) struct Throughput {
    pub(crate) ours: Option<Rate>,
    pub(crate) raw: Option<Rate>,
    pub(crate) proto: Option<Rate>,
}

/// Acquire+release throughput of `tasks` tasks on `names` names through
/// shared distlock clients (`libs`), through the raw sequence on
/// connections or pools of its own (`raws`, as many), and through
/// distlock's requests sent raw on those (`protos`, where written), taking
/// turns in slices (or `only` that side). Task `t` goes through client
/// `t % libs.len()` on every side.
pub(crate) async fn throughput(
    libs: &[LockClient],
    raws: &[Step],
    protos: Option<&[Step]>,
    (tasks, names): (usize, usize),
    run_for: Duration,
    tag: &str,
    only: Option<Side>,
) -> Result<Throughput, BoxError> {
    let names = names.max(tasks);
    let prefix = format!("bench/{tag}/k{tasks}x{names}c{}", libs.len());
    let libs: Arc<[LockClient]> = libs.into();
    let ours: Op = Arc::new(move |task, i| {
        let (lib, name) = (
            libs[task % libs.len()].clone(),
            format!("{prefix}/{}", slot(task, i, tasks, names)),
        );
        Box::pin(async move { crate::cycle(&lib, &name).await })
    });
    let on = |steps: &[Step]| -> Op {
        let steps: Arc<[Step]> = steps.into();
        Arc::new(move |task, i| steps[task % steps.len()](i, slot(task, i, tasks, names)))
    };
    let mut sides = vec![ours, on(raws)];
    if let Some(p) = protos {
        sides.push(on(p));
    }
    let only = only.map(|s| match s {
        Side::Distlock => 0,
        Side::Raw => 1,
        Side::Requests => 2,
    });
    if only.is_some_and(|k| k >= sides.len()) {
        return Err("distlock's requests are not sent raw for this backend".into());
    }
    let measured = rates(tasks, run_for, &sides, only).await?;
    Ok(Throughput {
        ours: measured[0],
        raw: measured[1],
        proto: measured.get(2).copied().flatten(),
    })
}

/// K clients contending for one name.
#[derive(Debug)]
pub(crate) struct Contention {
    pub(crate) grants_per_sec: f64,
    pub(crate) jain: f64,
    pub(crate) out_of_order: u64,
    pub(crate) grants: u64,
    pub(crate) worst_wait: Duration,
}

/// What scenarios 4-6 take turns on.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum HandoffKind {
    #[default]
    Lock,
    /// A semaphore of one permit.
    Semaphore,
    /// An election: each turn is a campaign, each release a resignation.
    Election,
}

impl HandoffKind {
    /// Takes a turn through `c` on `name`, waiting up to `wait`.
    async fn take(
        self,
        c: &LockClient,
        name: &str,
        wait: Duration,
    ) -> distlock::Result<distlock::LockGuard> {
        let ttl = Duration::from_secs(30);
        match self {
            HandoffKind::Lock => c.lock(name).ttl(ttl).wait(wait).acquire().await,
            HandoffKind::Semaphore => c.semaphore(name, 1).ttl(ttl).wait(wait).acquire().await,
            HandoffKind::Election => {
                let e = c.election(name).ttl(ttl).wait(wait);
                Ok(e.campaign("bench").await?.into_guard())
            }
        }
    }

    /// How the report's headings name it.
    pub(crate) fn label(self) -> &'static str {
        match self {
            HandoffKind::Lock => "",
            HandoffKind::Semaphore => ", on a semaphore of one permit",
            HandoffKind::Election => ", on an election",
        }
    }
}

/// K separate clients (each its own connection and session) loop acquire
/// (waiting) → release on one name. Fairness is Jain's index over the
/// per-client grant counts; a grant is out of order when another client had
/// been waiting longer. With `semaphore`, on a semaphore of one permit.
pub(crate) async fn contention_one_name(
    clients: &[LockClient],
    run_for: Duration,
    tag: &str,
    kind: HandoffKind,
) -> Result<Contention, BoxError> {
    let k = clients.len();
    let name = format!("bench/{tag}/one");
    let waiting: Arc<Mutex<Vec<Option<Instant>>>> = Arc::new(Mutex::new(vec![None; k]));
    let out_of_order = Arc::new(AtomicU64::new(0));
    let worst = Arc::new(AtomicU64::new(0));
    let end = Instant::now() + run_for;
    let mut tasks = Vec::new();
    for (i, c) in clients.iter().enumerate() {
        let (c, name, waiting, ooo, worst) = (
            c.clone(),
            name.clone(),
            waiting.clone(),
            out_of_order.clone(),
            worst.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let mut mine = 0u64;
            while Instant::now() < end {
                let asked = Instant::now();
                waiting.lock().map_err(|_| "poisoned")?[i] = Some(asked);
                let wait = end.saturating_duration_since(Instant::now()) + Duration::from_secs(5);
                let g = match kind.take(&c, &name, wait).await {
                    Ok(g) => g,
                    Err(distlock::Error::WaitTimeout { .. }) => break,
                    Err(e) => return Err(BoxError::from(e)),
                };
                {
                    let mut w = waiting.lock().map_err(|_| "poisoned")?;
                    w[i] = None;
                    if w.iter().flatten().any(|t| *t < asked) {
                        ooo.fetch_add(1, Ordering::Relaxed);
                    }
                }
                worst.fetch_max(asked.elapsed().as_micros() as u64, Ordering::Relaxed);
                mine += 1;
                g.release().await?;
            }
            waiting.lock().map_err(|_| "poisoned")?[i] = None;
            Ok::<u64, BoxError>(mine)
        }));
    }
    let mut counts = Vec::new();
    for t in tasks {
        counts.push(t.await?? as f64);
    }
    let total: f64 = counts.iter().sum();
    let squares: f64 = counts.iter().map(|x| x * x).sum();
    Ok(Contention {
        grants_per_sec: total / run_for.as_secs_f64(),
        jain: if squares > 0.0 {
            total * total / (k as f64 * squares)
        } else {
            0.0
        },
        out_of_order: out_of_order.load(Ordering::Relaxed),
        grants: total as u64,
        worst_wait: Duration::from_micros(worst.load(Ordering::Relaxed)),
    })
}

/// Handoffs with `clients.len() - 1` waiters.
#[derive(Debug)]
pub(crate) struct Handoffs {
    pub(crate) latency: Histogram<u64>,
    /// How long the releaser's own release call took: the server's cost
    /// of the write that frees the lock, seen from the releaser.
    pub(crate) release: Histogram<u64>,
    pub(crate) handoffs: u64,
}

/// How long each holder in [`handoffs`] holds the lock before releasing.
pub(crate) const HOLD_FOR: Duration = Duration::from_millis(2);

/// All clients loop acquire → release on one name, so every grant is a
/// handoff from the previous holder's release: its latency is the time from
/// the release call to the next holder's acquire returning. With N+1
/// clients there are N waiters at every release.
pub(crate) async fn handoffs(
    clients: &[LockClient],
    rounds: u64,
    tag: &str,
    kind: HandoffKind,
) -> Result<Handoffs, BoxError> {
    let name = format!("bench/{tag}/handoff/{}", clients.len());
    let clients_n = clients.len();
    let base = Instant::now();
    // Nanoseconds since `base` of the last release call; 0 = none yet.
    let released_at = Arc::new(AtomicU64::new(0));
    let grants = Arc::new(AtomicU64::new(0));
    let granted = Arc::new(tokio::sync::watch::channel(0u64).0);
    let hist = Arc::new(Mutex::new(Histogram::<u64>::new_with_bounds(
        1, 60_000_000, 3,
    )?));
    let release_hist = Arc::new(Mutex::new(Histogram::<u64>::new_with_bounds(
        1, 60_000_000, 3,
    )?));
    let mut tasks = Vec::new();
    for c in clients {
        let (c, name, released_at, grants, hist, granted, release_hist) = (
            c.clone(),
            name.clone(),
            released_at.clone(),
            grants.clone(),
            hist.clone(),
            granted.clone(),
            release_hist.clone(),
        );
        tasks.push(tokio::spawn(async move {
            loop {
                if grants.load(Ordering::Relaxed) >= rounds {
                    return Ok::<(), BoxError>(());
                }
                let g = match kind.take(&c, &name, Duration::from_secs(10)).await {
                    Ok(g) => g,
                    Err(distlock::Error::WaitTimeout { .. }) => return Ok(()),
                    Err(e) => return Err(e.into()),
                };
                let now = base.elapsed().as_nanos() as u64;
                let last = released_at.swap(0, Ordering::AcqRel);
                if last > 0 {
                    let us = (now.saturating_sub(last) / 1000).max(1);
                    hist.lock().map_err(|_| "poisoned")?.record(us)?;
                }
                let n = grants.fetch_add(1, Ordering::Relaxed) + 1;
                granted.send_replace(n);
                // Give the others time to queue behind this hold.
                tokio::time::sleep(HOLD_FOR).await;
                let mut next = granted.subscribe();
                let release_start = Instant::now();
                released_at.store(base.elapsed().as_nanos() as u64, Ordering::Release);
                g.release().await?;
                let us = (release_start.elapsed().as_micros() as u64).max(1);
                release_hist.lock().map_err(|_| "poisoned")?.record(us)?;
                if n >= rounds {
                    return Ok(());
                }
                // Queue again only once a waiter has taken over, so every
                // grant is a handoff to a waiter, not the releaser winning
                // its own lock back.
                if clients_n > 1 {
                    let _ =
                        tokio::time::timeout(Duration::from_secs(10), next.wait_for(|g| *g > n))
                            .await;
                }
            }
        }));
    }
    for t in tasks {
        t.await??;
    }
    let latency = hist.lock().map_err(|_| "poisoned")?.clone();
    let release = release_hist.lock().map_err(|_| "poisoned")?.clone();
    Ok(Handoffs {
        handoffs: latency.len(),
        latency,
        release,
    })
}
