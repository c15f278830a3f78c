//! The orchestrator: starts the register and K worker processes, lets a
//! fault plan act on them, stops everything and checks the log.

use std::future::Future;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::process::{Child, Command};

use crate::register::{Instruction, Register};
use crate::report::{check, Report};
use crate::worker::{
    ENV_ELECT, ENV_HOLD_MS, ENV_LIMIT, ENV_LOCK, ENV_REGISTER, ENV_SHARED, ENV_TTL_MS, ENV_URL,
    ENV_WAIT_MS, ENV_WORKER,
};

/// Why a run could not produce a report.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CheckError {
    /// Local I/O (the register's socket, spawning a process).
    #[error("{0}")]
    Io(#[from] std::io::Error),
    /// A worker failed; the message includes the end of its stderr.
    #[error("worker {worker}: {message}")]
    Worker {
        /// Which worker.
        worker: usize,
        /// What happened.
        message: String,
    },
    /// Something the run waited for did not happen in time.
    #[error("timed out: {0}")]
    Timeout(String),
    /// The fault plan failed.
    #[error("fault: {0}")]
    Fault(String),
    /// Bad settings.
    #[error("invalid settings: {0}")]
    Invalid(String),
}

/// The workload's settings.
#[derive(Clone, Debug)]
pub struct Workload {
    /// The backend URL each worker connects to (one per worker, so a fault
    /// can route one worker through a proxy).
    pub urls: Vec<String>,
    /// The lock they contend for (with `limit`, the semaphore).
    pub lock: String,
    /// Contend for one of this many permits of the semaphore `lock`
    /// instead of the lock: up to `limit` holders at once, and a resource
    /// that keeps the `limit` highest tokens ([`distlock::FenceGate::with_limit`]).
    pub limit: Option<u32>,
    /// The workers (by index) that take the lock shared, as readers of a
    /// read-write lock: each hold reads the register twice (before and
    /// after its work or pause) and writes nothing; the others take it
    /// exclusively and read-modify-write. The register fences the readers'
    /// reads and the writers' operations as [`distlock::ReadWriteGate`]
    /// does. Empty: every worker takes the lock.
    pub shared: Vec<usize>,
    /// Campaign for the leadership of the election `lock` instead of
    /// taking the lock (each worker with its own value); the leader
    /// read-modify-writes the register as a lock holder does.
    pub elect: bool,
    /// The lock's TTL.
    pub ttl: Duration,
    /// How long a normal hold lasts between its read and its write.
    pub hold: Duration,
    /// How long a client waits in one `acquire` before giving up and
    /// starting a fresh one (short: clients that keep arriving; long:
    /// clients that queue and wait for notifications).
    pub wait: Duration,
    /// How long the workload runs before the fault plan starts.
    pub warmup: Duration,
    /// How long it runs after the fault plan returns.
    pub cooldown: Duration,
    /// The program to start as a worker (a binary that calls
    /// [`crate::worker_main_if_requested`] first) and its arguments.
    pub program: PathBuf,
    /// Arguments for `program`.
    pub args: Vec<String>,
}

impl Workload {
    /// `clients` workers on `url`, running this very binary as the worker.
    pub fn new(url: &str, clients: usize) -> Result<Self, CheckError> {
        Ok(Workload {
            urls: vec![url.to_string(); clients],
            lock: "distlock-check".into(),
            limit: None,
            shared: Vec::new(),
            elect: false,
            ttl: Duration::from_secs(2),
            hold: Duration::from_millis(10),
            wait: Duration::from_secs(10),
            warmup: Duration::from_secs(1),
            cooldown: Duration::from_secs(2),
            program: std::env::current_exe()?,
            args: Vec::new(),
        })
    }
}

/// What a fault plan gets: the register and the worker processes.
#[derive(Clone, Debug)]
pub struct Faults {
    reg: Register,
    pids: Vec<u32>,
    ttl: Duration,
}

/// Whether process `pid` is stopped (state `T` in `/proc/PID/stat`).
fn is_stopped(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
        s.rsplit_once(") ")
            .is_some_and(|(_, rest)| rest.starts_with('T') || rest.starts_with('t'))
    })
}

impl Faults {
    /// The lock's TTL.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// The register (its log so far, events).
    pub fn register(&self) -> &Register {
        &self.reg
    }

    /// Worker `worker`'s process id.
    pub fn pid(&self, worker: usize) -> u32 {
        self.pids[worker]
    }

    /// Records that the fault against `worker` starts now; recovery time is
    /// measured from here.
    pub fn fault_started(&self, worker: usize) -> u64 {
        self.reg.event(Some(worker), "fault")
    }

    /// Records another event (it shows in the log, not in the report).
    pub fn mark(&self, label: &str) -> u64 {
        self.reg.event(None, label)
    }

    async fn reach_pause_point(&self, worker: usize, what: Instruction) -> Result<u64, CheckError> {
        self.reg.arm(worker, what);
        let limit = self
            .ttl
            .saturating_mul(10)
            .saturating_add(Duration::from_secs(30));
        tokio::time::timeout(
            limit,
            self.reg.wait_for(|log| log.paused.get(&worker).copied()),
        )
        .await
        .map_err(|_| {
            CheckError::Timeout(format!(
                "worker {worker} did not get the lock within {limit:?}"
            ))
        })
    }

    /// Stops `worker` with SIGSTOP in the middle of its next hold (between
    /// its read and its write), keeps it stopped for `pause`, then resumes it.
    pub async fn pause_holder(&self, worker: usize, pause: Duration) -> Result<(), CheckError> {
        self.reach_pause_point(worker, Instruction::Stop).await?;
        let pid = self.pid(worker);
        let mut waited = Duration::ZERO;
        while !is_stopped(pid) {
            if waited > Duration::from_secs(10) {
                return Err(CheckError::Fault(format!(
                    "worker {worker} (pid {pid}) did not stop"
                )));
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
            waited += Duration::from_millis(2);
        }
        self.fault_started(worker);
        tokio::time::sleep(pause).await;
        self.resume(worker)?;
        self.mark("resumed");
        Ok(())
    }

    /// Holds `worker` just before its next acquire; returns once it waits
    /// there. [`Faults::open_gate`] lets it go.
    pub async fn gate(&self, worker: usize) -> Result<(), CheckError> {
        self.reg.close_gate(worker);
        let limit = self
            .ttl
            .saturating_mul(10)
            .saturating_add(Duration::from_secs(30));
        tokio::time::timeout(
            limit,
            self.reg.wait_for(|log| log.paused.get(&worker).copied()),
        )
        .await
        .map(|_| ())
        .map_err(|_| {
            CheckError::Timeout(format!(
                "worker {worker} did not reach its gate within {limit:?}"
            ))
        })
    }

    /// Lets `worker` go on from its gate.
    pub fn open_gate(&self, worker: usize) {
        self.reg.open_gate(worker);
    }

    /// Sends SIGCONT to `worker`.
    pub fn resume(&self, worker: usize) -> Result<(), CheckError> {
        let pid = nix::unistd::Pid::from_raw(self.pid(worker) as i32);
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGCONT)
            .map_err(|e| CheckError::Fault(format!("SIGCONT to worker {worker}: {e}")))
    }

    /// Makes `worker` stall for `stall` in the middle of its next hold
    /// (between its read and its write, then writing without looking at
    /// the lock again). Returns once it holds the lock and has begun to
    /// stall; the caller then applies the fault and calls
    /// [`Faults::fault_started`].
    pub async fn stall_holder(&self, worker: usize, stall: Duration) -> Result<u64, CheckError> {
        self.reach_pause_point(worker, Instruction::Stall(stall.as_millis() as u64))
            .await
    }

    /// Waits until a worker other than `not` is granted the lock after time
    /// `after`; returns the grant's start.
    pub async fn next_grant(
        &self,
        after: u64,
        not: usize,
        limit: Duration,
    ) -> Result<u64, CheckError> {
        tokio::time::timeout(
            limit,
            self.reg.wait_for(|log| {
                log.holds
                    .values()
                    .filter(|h| h.start >= after && h.worker != not)
                    .map(|h| h.start)
                    .min()
            }),
        )
        .await
        .map_err(|_| CheckError::Timeout(format!("no other worker got the lock within {limit:?}")))
    }
}

static RUNS: AtomicU64 = AtomicU64::new(0);

fn tail(path: &PathBuf) -> String {
    let s = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(15)..].join("\n")
}

/// Runs the workload, with `fault` acting on it after the warm-up, and
/// checks the result.
pub async fn run<F, Fut>(w: &Workload, fault: F) -> Result<Report, CheckError>
where
    F: FnOnce(Faults) -> Fut,
    Fut: Future<Output = Result<(), CheckError>>,
{
    if w.urls.is_empty() {
        return Err(CheckError::Invalid("at least one client is needed".into()));
    }
    if w.ttl.is_zero() {
        return Err(CheckError::Invalid("the TTL must be positive".into()));
    }
    if w.limit.is_some() && !w.shared.is_empty() {
        return Err(CheckError::Invalid(
            "shared workers take a lock, not a semaphore's permits".into(),
        ));
    }
    if w.elect && (w.limit.is_some() || !w.shared.is_empty()) {
        return Err(CheckError::Invalid(
            "campaigners take an election, not permits or shared holds".into(),
        ));
    }
    if w.limit == Some(0) {
        return Err(CheckError::Invalid(
            "a semaphore needs at least one permit".into(),
        ));
    }
    let reg = Register::start().await?;
    reg.set_ttl(w.ttl);
    reg.set_limit(w.limit.unwrap_or(1));
    let run_id = RUNS.fetch_add(1, Ordering::Relaxed);
    let mut children: Vec<(Child, PathBuf)> = Vec::new();
    for (i, url) in w.urls.iter().enumerate() {
        let log = std::env::temp_dir().join(format!(
            "distlock-check-{}-{run_id}-{i}.log",
            std::process::id()
        ));
        let child = Command::new(&w.program)
            .args(&w.args)
            .env(ENV_WORKER, i.to_string())
            .env(ENV_URL, url)
            .env(ENV_REGISTER, reg.addr().to_string())
            .env(ENV_LOCK, &w.lock)
            .env(ENV_TTL_MS, w.ttl.as_millis().to_string())
            .env(ENV_HOLD_MS, w.hold.as_millis().to_string())
            .env(ENV_WAIT_MS, w.wait.as_millis().to_string())
            .env(ENV_LIMIT, w.limit.map_or(String::new(), |n| n.to_string()))
            .env(ENV_SHARED, if w.shared.contains(&i) { "1" } else { "" })
            .env(ENV_ELECT, if w.elect { "1" } else { "" })
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log)?)
            .kill_on_drop(true)
            .spawn()?;
        children.push((child, log));
    }
    let n = children.len();

    // Every worker connected to its backend and said hello.
    let hello = Duration::from_secs(60);
    let started = tokio::time::Instant::now();
    loop {
        if reg.log().workers.len() == n {
            break;
        }
        for (i, (c, log)) in children.iter_mut().enumerate() {
            if let Ok(Some(status)) = c.try_wait() {
                return Err(CheckError::Worker {
                    worker: i,
                    message: format!("exited at start ({status}):\n{}", tail(log)),
                });
            }
        }
        if started.elapsed() > hello {
            return Err(CheckError::Timeout(format!(
                "workers did not connect within {hello:?}"
            )));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let pids: Vec<u32> = (0..n)
        .map(|i| reg.log().workers.get(&i).map_or(0, |(p, _)| *p))
        .collect();
    let faults = Faults {
        reg: reg.clone(),
        pids,
        ttl: w.ttl,
    };

    tokio::time::sleep(w.warmup).await;
    let outcome = fault(faults.clone()).await;
    if outcome.is_ok() {
        tokio::time::sleep(w.cooldown).await;
    }
    reg.finish();
    for i in 0..n {
        faults.open_gate(i);
        let _ = faults.resume(i);
    }
    let grace = w.ttl * 6 + Duration::from_secs(15);
    let mut failure = None;
    for (i, (mut c, log)) in children.into_iter().enumerate() {
        match tokio::time::timeout(grace, c.wait()).await {
            Ok(Ok(s)) if s.success() => {
                let _ = std::fs::remove_file(&log);
            }
            Ok(Ok(s)) => {
                failure.get_or_insert(CheckError::Worker {
                    worker: i,
                    message: format!("exited with {s}:\n{}", tail(&log)),
                });
            }
            Ok(Err(e)) => {
                failure.get_or_insert(CheckError::Io(e));
            }
            Err(_) => {
                let _ = c.kill().await;
                failure.get_or_insert(CheckError::Worker {
                    worker: i,
                    message: format!("did not stop within {grace:?}:\n{}", tail(&log)),
                });
            }
        }
    }
    outcome?;
    if let Some(e) = failure {
        return Err(e);
    }
    let log = reg.log();
    if log.holds.is_empty() {
        let (worker, message) = match log.errors.first() {
            Some((_, w, text)) => (
                *w,
                format!("no worker was ever granted the lock; its first error: {text}"),
            ),
            None => (0, "no worker was ever granted the lock".into()),
        };
        return Err(CheckError::Worker { worker, message });
    }
    Ok(check(&log))
}
