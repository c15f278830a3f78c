//! The fenced register: the shared resource the workers protect with the lock.
//!
//! It runs inside the orchestrating process and speaks a line protocol over
//! loopback TCP. It holds two cells that every worker updates in the same
//! read-modify-write:
//!
//! - the **fenced** cell checks the caller's token: an operation is rejected
//!   if its token is lower than the highest the cell has accepted, or equal to
//!   it but from a different grant (two grants with one token is a duplicate
//!   grant, which a strict resource refuses). For a semaphore of N permits
//!   the cell keeps the N highest (token, grant) pairs it accepted, as
//!   [`distlock::FenceGate::with_limit`] does, and rejects a token below
//!   all of them. Shared holders of a read-write lock only read (`SREAD`):
//!   the fenced cell admits such a read if its token is above every token
//!   of the writers' operations it accepted, and a writer's operation only
//!   if its token is also at least every read's, as
//!   [`distlock::ReadWriteGate`] does;
//! - the **unfenced** cell accepts everything, as storage that trusts the lock
//!   alone would.
//!
//! One run therefore shows both outcomes of the same fault. Every operation is
//! logged with a timestamp from [`crate::clock::mono_ns`].
//!
//! Protocol (one line each way, fields separated by spaces):
//!
//! | worker sends | register answers |
//! |---|---|
//! | `HELLO worker pid fencing` | `OK` |
//! | `ACQ t_ns grant token deadline_ns S\|X asked_ns` (shared or exclusive; when its acquire was called) | `GO`, `STOP`, `STALL ms` or `DONE` |
//! | `READ grant token deadline_ns` | `f_ok f_value u_value` |
//! | `SREAD grant token deadline_ns` (a shared holder's read) | `f_ok f_value u_value` |
//! | `AT_PAUSE grant deadline_ns` | `OK` (about to stop or stall) |
//! | `WRITE grant token f_value\|- u_value` | `f_ok` |
//! | `END t_ns grant how...` | `OK` |
//! | `ERR text...` | `GO` or `DONE` |
//! | `WAITED` (acquire timed out) | `GO` or `DONE` |
//! | `WANT` (about to acquire; may be held at a gate) | `GO` or `DONE` |
//!
//! A `deadline_ns` is the holder's local deadline when it sent the line,
//! renewals included (0 once lost): a hold's [`Hold::deadline`] is the
//! latest it reported.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

use crate::clock::mono_ns;

/// What a worker is told to do in the hold it just reported.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Instruction {
    /// Work normally.
    Go,
    /// Between the read and the write, stop the whole process with SIGSTOP
    /// (the orchestrator resumes it).
    Stop,
    /// Between the read and the write, sleep this long, then write without
    /// checking the lock again (a slow or stalled holder).
    Stall(u64),
}

/// One register operation, as logged.
#[derive(Clone, Debug)]
pub struct Op {
    /// When the register processed it.
    pub t: u64,
    /// The grant (one per acquisition) that sent it.
    pub grant: u64,
    /// The token it carried.
    pub token: u64,
    /// A write (else a read).
    pub write: bool,
    /// A shared holder's read.
    pub shared: bool,
    /// Whether the fenced cell accepted it (`None`: the worker skipped the
    /// fenced cell because its read there was rejected).
    pub fenced_ok: Option<bool>,
}

/// One hold as its holder saw it.
#[derive(Clone, Debug)]
pub struct Hold {
    /// Which worker.
    pub worker: usize,
    /// Unique per acquisition.
    pub grant: u64,
    /// The fencing token.
    pub token: u64,
    /// A shared hold (a reader of a read-write lock).
    pub shared: bool,
    /// When `acquire` was called, on the shared clock.
    pub asked: u64,
    /// When `acquire` returned, on the shared clock.
    pub start: u64,
    /// When the holder's guard expected its lease to end at the latest
    /// (its local deadline, which is conservative), as of the last line
    /// it sent before its last operation or its pause: renewals push it on.
    pub deadline: u64,
    /// When the holder stopped believing it held the lock: `lost()` fired or
    /// it called release. `None` if it never said.
    pub end: Option<u64>,
    /// How it ended (`released`, `lost: ...`).
    pub how: String,
}

/// Everything the register saw in one run.
#[derive(Clone, Debug, Default)]
pub struct Log {
    /// Operations in the order the register processed them.
    pub ops: Vec<Op>,
    /// Holds by grant.
    pub holds: BTreeMap<u64, Hold>,
    /// The fenced cell's final value.
    pub fenced_value: u64,
    /// The unfenced cell's final value.
    pub unfenced_value: u64,
    /// Errors workers reported (acquire failures), with time and worker.
    pub errors: Vec<(u64, usize, String)>,
    /// Fault events: (time, worker it targets, label).
    pub events: Vec<(u64, Option<usize>, String)>,
    /// Workers that said hello: worker → (pid, declared fencing).
    pub workers: BTreeMap<usize, (u32, String)>,
    /// When the run ended.
    pub end: u64,
    /// The lock's TTL in nanoseconds.
    pub ttl_ns: u64,
    /// How many may hold at once: 1 for the lock, N for a semaphore.
    pub limit: u32,
    /// Workers that reported reaching their pause point: worker → time.
    pub paused: HashMap<usize, u64>,
}

#[derive(Debug, Default)]
struct State {
    log: Log,
    /// The highest (token, grant) pairs the fenced cell accepted, at most
    /// `log.limit`, ascending.
    f_highest: Vec<(u64, u64)>,
    /// The highest token of a shared read the fenced cell accepted.
    f_read_highest: u64,
    armed: HashMap<usize, Instruction>,
    gates: HashMap<usize, Arc<tokio::sync::Notify>>,
    done: bool,
}

/// The running register.
#[derive(Debug, Clone)]
pub struct Register {
    state: Arc<Mutex<State>>,
    changed: Arc<watch::Sender<u64>>,
    addr: std::net::SocketAddr,
}

fn lock(m: &Mutex<State>) -> MutexGuard<'_, State> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Register {
    /// Listens on a free loopback port.
    pub async fn start() -> std::io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let reg = Register {
            state: Arc::default(),
            changed: Arc::new(watch::channel(0).0),
            addr,
        };
        let r = reg.clone();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let r = r.clone();
                tokio::spawn(async move {
                    let _ = r.serve(stream).await;
                });
            }
        });
        Ok(reg)
    }

    /// Where workers connect.
    pub fn addr(&self) -> std::net::SocketAddr {
        self.addr
    }

    /// A copy of the log so far.
    pub fn log(&self) -> Log {
        lock(&self.state).log.clone()
    }

    /// Records how many may hold at once (the checker and the fenced cell
    /// need it).
    pub fn set_limit(&self, limit: u32) {
        lock(&self.state).log.limit = limit.max(1);
    }

    /// Records the lock's TTL (the checker needs it).
    pub fn set_ttl(&self, ttl: std::time::Duration) {
        lock(&self.state).log.ttl_ns = ttl.as_nanos() as u64;
    }

    /// Tells `worker` what to do in its next hold.
    pub fn arm(&self, worker: usize, what: Instruction) {
        let mut s = lock(&self.state);
        s.log.paused.remove(&worker);
        s.armed.insert(worker, what);
    }

    /// Holds `worker` at its next `WANT` (just before it calls acquire)
    /// until [`Register::open_gate`]; it shows in [`Log::paused`] once there.
    pub fn close_gate(&self, worker: usize) {
        let mut s = lock(&self.state);
        s.log.paused.remove(&worker);
        s.gates.insert(worker, Arc::new(tokio::sync::Notify::new()));
    }

    /// Lets `worker` go on from its gate.
    pub fn open_gate(&self, worker: usize) {
        if let Some(g) = lock(&self.state).gates.remove(&worker) {
            g.notify_one();
        }
    }

    /// Records a fault event.
    pub fn event(&self, worker: Option<usize>, label: &str) -> u64 {
        let t = mono_ns();
        lock(&self.state).log.events.push((t, worker, label.into()));
        self.bump();
        t
    }

    /// From now on every worker is told `DONE` at its next acquisition.
    pub fn finish(&self) {
        let mut s = lock(&self.state);
        s.done = true;
        s.log.end = mono_ns();
    }

    /// Waits until `pred` holds on the log (re-checked on every change).
    pub async fn wait_for<T>(&self, mut pred: impl FnMut(&Log) -> Option<T>) -> T {
        let mut rx = self.changed.subscribe();
        loop {
            if let Some(t) = pred(&lock(&self.state).log) {
                return t;
            }
            // The sender lives as long as `self`.
            let _ = rx.changed().await;
        }
    }

    fn bump(&self) {
        self.changed.send_modify(|v| *v += 1);
    }

    async fn serve(&self, stream: TcpStream) -> std::io::Result<()> {
        stream.set_nodelay(true)?;
        let (r, mut w) = stream.into_split();
        let mut lines = BufReader::new(r).lines();
        let mut worker = usize::MAX;
        let trace = std::env::var_os("DISTLOCK_CHECK_TRACE").is_some();
        while let Some(line) = lines.next_line().await? {
            if line == "WANT" {
                let gate = {
                    let mut s = lock(&self.state);
                    let g = s.gates.get(&worker).cloned();
                    if g.is_some() {
                        s.log.paused.insert(worker, mono_ns());
                    }
                    g
                };
                if let Some(g) = gate {
                    self.bump();
                    g.notified().await;
                }
            }
            let reply = self.handle(&mut worker, &line);
            if trace {
                eprintln!("{} w{worker} {line} -> {reply}", mono_ns() / 1_000_000);
            }
            self.bump();
            w.write_all(format!("{reply}\n").as_bytes()).await?;
        }
        Ok(())
    }

    fn handle(&self, worker: &mut usize, line: &str) -> String {
        let mut f = line.split(' ');
        let cmd = f.next().unwrap_or("");
        let mut num = || f.next().and_then(|x| x.parse::<u64>().ok()).unwrap_or(0);
        let t = mono_ns();
        let mut s = lock(&self.state);
        match cmd {
            "HELLO" => {
                *worker = num() as usize;
                let pid = num() as u32;
                let fencing = line.split(' ').nth(3).unwrap_or("").to_string();
                s.log.workers.insert(*worker, (pid, fencing));
                "OK".into()
            }
            "ACQ" => {
                let (start, grant, token, deadline) = (num(), num(), num(), num());
                let shared = line.split(' ').nth(5) == Some("S");
                let asked = line
                    .split(' ')
                    .nth(6)
                    .and_then(|x| x.parse().ok())
                    .unwrap_or(start);
                s.log.holds.insert(
                    grant,
                    Hold {
                        worker: *worker,
                        grant,
                        token,
                        shared,
                        asked,
                        start,
                        deadline,
                        end: None,
                        how: String::new(),
                    },
                );
                if s.done {
                    return "DONE".into();
                }
                match s.armed.remove(worker) {
                    None | Some(Instruction::Go) => "GO".into(),
                    Some(Instruction::Stop) => "STOP".into(),
                    Some(Instruction::Stall(ms)) => format!("STALL {ms}"),
                }
            }
            "READ" | "SREAD" => {
                let (grant, token, deadline) = (num(), num(), num());
                s.renewed(grant, deadline);
                let shared = cmd == "SREAD";
                let ok = if shared {
                    s.fenced_admits_read(token)
                } else {
                    s.fenced_accepts(grant, token)
                };
                s.log.ops.push(Op {
                    t,
                    grant,
                    token,
                    write: false,
                    shared,
                    fenced_ok: Some(ok),
                });
                format!(
                    "{} {} {}",
                    ok as u8, s.log.fenced_value, s.log.unfenced_value
                )
            }
            "AT_PAUSE" => {
                let (grant, deadline) = (num(), num());
                s.renewed(grant, deadline);
                s.log.paused.insert(*worker, t);
                "OK".into()
            }
            "WRITE" => {
                let (grant, token) = (num(), num());
                let fval = f.next().and_then(|x| x.parse::<u64>().ok());
                let uval = f.next().and_then(|x| x.parse::<u64>().ok()).unwrap_or(0);
                let fenced_ok = fval.map(|v| {
                    let ok = s.fenced_accepts(grant, token);
                    if ok {
                        s.log.fenced_value = v;
                    }
                    ok
                });
                s.log.unfenced_value = uval;
                s.log.ops.push(Op {
                    t,
                    grant,
                    token,
                    write: true,
                    shared: false,
                    fenced_ok,
                });
                if fenced_ok == Some(true) { "1" } else { "0" }.into()
            }
            "END" => {
                let (end, grant) = (num(), num());
                let how = line.splitn(4, ' ').nth(3).unwrap_or("").to_string();
                if let Some(h) = s.log.holds.get_mut(&grant) {
                    h.end = Some(end);
                    h.how = how;
                }
                "OK".into()
            }
            "WANT" | "WAITED" => if s.done { "DONE" } else { "GO" }.into(),
            "ERR" => {
                let text = line.split_once(' ').map_or("", |(_, r)| r).to_string();
                s.log.errors.push((t, *worker, text));
                if s.done { "DONE" } else { "GO" }.into()
            }
            _ => "ERR unknown command".into(),
        }
    }
}

impl State {
    /// A holder reported its local deadline: renewals push it on.
    fn renewed(&mut self, grant: u64, deadline: u64) {
        if let Some(h) = self.log.holds.get_mut(&grant) {
            h.deadline = h.deadline.max(deadline);
        }
    }

    /// A shared holder's read: admitted above every writer's token.
    fn fenced_admits_read(&mut self, token: u64) -> bool {
        if self.f_highest.last().is_some_and(|(t, _)| token <= *t) {
            return false;
        }
        self.f_read_highest = self.f_read_highest.max(token);
        true
    }

    fn fenced_accepts(&mut self, grant: u64, token: u64) -> bool {
        // A writer granted before a reader that has read: superseded.
        if token < self.f_read_highest {
            return false;
        }
        let limit = self.log.limit.max(1) as usize;
        let top = &mut self.f_highest;
        if top.contains(&(token, grant)) {
            return true;
        }
        // Another grant with a token the cell already accepted: a duplicate
        // grant, refused by a strict resource.
        if top.iter().any(|(t, _)| *t == token) {
            return false;
        }
        let at = top.partition_point(|(t, _)| *t < token);
        if top.len() < limit {
            top.insert(at, (token, grant));
            return true;
        }
        if at == 0 {
            return false;
        }
        top.remove(0);
        top.insert(at - 1, (token, grant));
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fenced_cell_of_n_keeps_the_n_highest_grants() {
        let mut s = State::default();
        s.log.limit = 2;
        assert!(s.fenced_accepts(1, 5));
        assert!(s.fenced_accepts(2, 3));
        assert!(s.fenced_accepts(2, 3), "the same grant again");
        assert!(!s.fenced_accepts(3, 2), "below both");
        assert!(s.fenced_accepts(4, 6), "takes 3's place");
        assert!(!s.fenced_accepts(2, 3), "the grant it replaced");
        assert!(s.fenced_accepts(1, 5));
        assert!(
            !s.fenced_accepts(5, 6),
            "another grant with an accepted token"
        );
    }

    #[test]
    fn the_fenced_cell_fences_shared_reads_below_writers_and_writers_below_reads() {
        let mut s = State::default();
        s.log.limit = 1;
        assert!(s.fenced_admits_read(3));
        assert!(s.fenced_admits_read(2), "readers overlap in any order");
        assert!(s.fenced_accepts(4, 5), "a writer after the readers");
        assert!(!s.fenced_admits_read(3), "a reader from before the writer");
        assert!(s.fenced_admits_read(6));
        assert!(
            !s.fenced_accepts(4, 5),
            "the writer after a newer reader read"
        );
        assert!(s.fenced_accepts(7, 7));
    }

    /// A permit renewed past its acquire-time deadline still holds: the
    /// grants that began after that first deadline, one at a time beside
    /// it (two holders of two permits), make none of its operations stale.
    #[tokio::test]
    async fn a_renewed_hold_is_judged_by_the_deadline_it_reported_last() {
        let reg = Register::start().await.unwrap();
        reg.set_limit(2);
        let (mut w0, mut w1) = (0, 1);
        let say = |w: &mut usize, line: &str| reg.handle(w, line);
        say(&mut w0, "HELLO 0 1 Strong");
        say(&mut w1, "HELLO 1 2 Strong");
        assert_eq!(say(&mut w0, "ACQ 100 1 1 200 X 100"), "GO");
        for (grant, start) in [(2, 300), (3, 360)] {
            say(
                &mut w1,
                &format!("ACQ {start} {grant} {grant} {} X {start}", start + 100),
            );
            say(&mut w1, &format!("READ {grant} {grant} {}", start + 100));
            say(&mut w1, &format!("WRITE {grant} {grant} - {}", grant - 1));
            say(&mut w1, &format!("END {} {grant} released", start + 40));
        }
        say(&mut w0, "READ 1 1 10000");
        say(&mut w0, "WRITE 1 1 - 3");
        say(&mut w0, "END 500 1 released");
        let log = reg.log();
        assert_eq!(log.holds[&1].deadline, 10_000);
        let r = crate::report::check(&log);
        assert_eq!(r.unfenced.stale_accepted, 0, "{r:?}");
        // A deadline reported lower than one before it (a line sent
        // late) does not take it back.
        say(&mut w0, "AT_PAUSE 1 5000");
        assert_eq!(reg.log().holds[&1].deadline, 10_000);
    }

    #[test]
    fn the_fenced_cell_refuses_lower_tokens_and_a_second_grant_with_an_equal_token() {
        let mut s = State::default();
        s.log.limit = 1;
        assert!(s.fenced_accepts(1, 5));
        assert!(s.fenced_accepts(1, 5), "the same grant again");
        assert!(!s.fenced_accepts(2, 5), "another grant, same token");
        assert!(!s.fenced_accepts(3, 4), "a lower token");
        assert!(s.fenced_accepts(4, 6));
        assert!(!s.fenced_accepts(1, 5), "the old grant after a newer one");
    }
}
