//! The worker: one OS process looping acquire → read-modify-write → release.
//!
//! Any binary becomes a worker by calling [`worker_main_if_requested`] first
//! thing in `main`; the orchestrator re-executes its own binary with the
//! worker's settings in `DISTLOCK_CHECK_*` environment variables.

use std::process::ExitCode;
use std::time::Duration;

use distlock::{Error, LockClient, LockGuard};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;

use crate::clock::mono_ns;

/// Environment variable naming the worker's index; its presence makes a
/// process a worker.
pub const ENV_WORKER: &str = "DISTLOCK_CHECK_WORKER";
pub(crate) const ENV_URL: &str = "DISTLOCK_CHECK_URL";
pub(crate) const ENV_REGISTER: &str = "DISTLOCK_CHECK_REGISTER";
pub(crate) const ENV_LOCK: &str = "DISTLOCK_CHECK_LOCK";
pub(crate) const ENV_TTL_MS: &str = "DISTLOCK_CHECK_TTL_MS";
pub(crate) const ENV_HOLD_MS: &str = "DISTLOCK_CHECK_HOLD_MS";
pub(crate) const ENV_WAIT_MS: &str = "DISTLOCK_CHECK_WAIT_MS";
/// Empty for the lock; a number for a semaphore of that many permits.
pub(crate) const ENV_LIMIT: &str = "DISTLOCK_CHECK_LIMIT";
/// `1`: this worker takes the lock shared (a reader).
pub(crate) const ENV_SHARED: &str = "DISTLOCK_CHECK_SHARED";
/// `1`: this worker campaigns for the election named like the lock.
pub(crate) const ENV_ELECT: &str = "DISTLOCK_CHECK_ELECT";

/// If this process was started as a check worker, runs the worker and
/// returns its exit code; otherwise returns `None` at once.
pub fn worker_main_if_requested() -> Option<ExitCode> {
    let id = std::env::var(ENV_WORKER).ok()?;
    let code = match settings(&id) {
        Err(e) => {
            eprintln!("distlock check worker: {e}");
            ExitCode::from(2)
        }
        Ok(s) => match tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
        {
            Err(e) => {
                eprintln!("distlock check worker: cannot start a runtime: {e}");
                ExitCode::FAILURE
            }
            Ok(rt) => match rt.block_on(run(s)) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("distlock check worker {id}: {e}");
                    ExitCode::FAILURE
                }
            },
        },
    };
    Some(code)
}

#[derive(Debug)]
struct Settings {
    id: u64,
    url: String,
    register: String,
    lock: String,
    ttl: Duration,
    hold: Duration,
    wait: Duration,
    limit: Option<u32>,
    shared: bool,
    elect: bool,
}

fn settings(id: &str) -> Result<Settings, String> {
    let var = |k: &str| std::env::var(k).map_err(|_| format!("{k} is not set"));
    let ms = |k: &str| -> Result<Duration, String> {
        var(k)?
            .parse::<u64>()
            .map(Duration::from_millis)
            .map_err(|e| format!("{k}: {e}"))
    };
    Ok(Settings {
        id: id
            .parse()
            .map_err(|e| format!("{ENV_WORKER}={id:?}: {e}"))?,
        url: var(ENV_URL)?,
        register: var(ENV_REGISTER)?,
        lock: var(ENV_LOCK)?,
        ttl: ms(ENV_TTL_MS)?,
        hold: ms(ENV_HOLD_MS)?,
        wait: ms(ENV_WAIT_MS)?,
        limit: match var(ENV_LIMIT)?.as_str() {
            "" => None,
            n => Some(n.parse().map_err(|e| format!("{ENV_LIMIT}={n:?}: {e}"))?),
        },
        shared: std::env::var(ENV_SHARED).is_ok_and(|v| v == "1"),
        elect: std::env::var(ENV_ELECT).is_ok_and(|v| v == "1"),
    })
}

struct Conn {
    lines: Lines<BufReader<OwnedReadHalf>>,
    w: OwnedWriteHalf,
}

impl Conn {
    async fn call(&mut self, line: String) -> Result<String, String> {
        let io = |e: std::io::Error| format!("register connection: {e}");
        self.w
            .write_all(format!("{line}\n").as_bytes())
            .await
            .map_err(io)?;
        self.lines
            .next_line()
            .await
            .map_err(io)?
            .ok_or_else(|| "the register closed the connection".to_string())
    }
}

async fn run(s: Settings) -> Result<(), String> {
    let stream = TcpStream::connect(&s.register)
        .await
        .map_err(|e| format!("cannot reach the register at {}: {e}", s.register))?;
    stream.set_nodelay(true).map_err(|e| e.to_string())?;
    let (r, w) = stream.into_split();
    let mut conn = Conn {
        lines: BufReader::new(r).lines(),
        w,
    };
    let backend = distlock::connect(&s.url)
        .await
        .map_err(|e| format!("cannot connect to {}: {e}", distlock::redact(&s.url)))?;
    let client = LockClient::from_dyn(backend);
    let fencing = format!("{:?}", client.capabilities().fencing);
    conn.call(format!("HELLO {} {} {fencing}", s.id, std::process::id()))
        .await?;

    let mut seq = 0u64;
    loop {
        if conn.call("WANT".into()).await? == "DONE" {
            return Ok(());
        }
        let asked = mono_ns();
        let taken = if s.elect {
            client
                .election(&s.lock)
                .ttl(s.ttl)
                .wait(s.wait)
                .campaign(format!("worker-{}", s.id))
                .await
                .map(distlock::Leadership::into_guard)
        } else {
            let builder = match s.limit {
                Some(n) => client.semaphore(&s.lock, n),
                None if s.shared => client.lock(&s.lock).shared(),
                None => client.lock(&s.lock),
            };
            builder.ttl(s.ttl).wait(s.wait).acquire().await
        };
        let guard = match taken {
            Ok(g) => g,
            Err(e) => {
                let line = match e {
                    Error::WaitTimeout { .. } => "WAITED".to_string(),
                    _ => format!("ERR {}", e.to_string().replace('\n', " ")),
                };
                if conn.call(line).await? == "DONE" {
                    return Ok(());
                }
                if !matches!(e, Error::WaitTimeout { .. }) {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                continue;
            }
        };
        let start = mono_ns();
        seq += 1;
        // Unique per run: the worker in the high 32 bits, its hold's count
        // in the low ones.
        let grant = (s.id << 32) | (seq & u64::from(u32::MAX));
        let token = guard.token().get();
        let deadline = lease_end(&guard).unwrap_or(start);
        let kind = if s.shared { "S" } else { "X" };
        let told = conn
            .call(format!(
                "ACQ {start} {grant} {token} {deadline} {kind} {asked}"
            ))
            .await?;
        if told == "DONE" {
            let end = mono_ns();
            let _ = guard.release().await;
            conn.call(format!("END {end} {grant} released")).await?;
            return Ok(());
        }
        let (end, how) = hold(&mut conn, &guard, grant, token, &told, s.hold, s.shared).await?;
        let (end, how) = match (end, how) {
            // Lost: the holder still releases, as any client would on its
            // way out. The release arrives late (after expiry, maybe after a
            // new grant) and is owner-checked: it must be refused.
            (Some(end), how) => {
                let outcome = match guard.release().await {
                    Ok(true) => "accepted".to_string(),
                    Ok(false) => "refused".to_string(),
                    Err(e) => format!("failed ({e})"),
                };
                (end, format!("{how}; late release {outcome}"))
            }
            (None, _) => {
                let end = mono_ns();
                let how = match guard.release().await {
                    Ok(true) => "released".to_string(),
                    Ok(false) => "released (had already expired)".to_string(),
                    Err(e) => format!("release failed: {e}"),
                };
                (end, how)
            }
        };
        conn.call(format!("END {end} {grant} {}", how.replace('\n', " ")))
            .await?;
        // A little think time, varied so that the workers interleave.
        tokio::time::sleep(Duration::from_millis(mono_ns() % 7)).await;
    }
}

/// One read-modify-write under `guard`, as `told` (for a `shared` hold: a
/// read, the work, and a second read). Returns when and how the hold ended
/// if `lost()` fired during it (else the caller releases).
async fn hold(
    conn: &mut Conn,
    guard: &LockGuard,
    grant: u64,
    token: u64,
    told: &str,
    work: Duration,
    shared: bool,
) -> Result<(Option<u64>, String), String> {
    let read_cmd = if shared { "SREAD" } else { "READ" };
    let rmw = async {
        if !guard.is_held() {
            return Ok(());
        }
        let read = conn
            .call(format!(
                "{read_cmd} {grant} {token} {}",
                lease_end(guard).unwrap_or(0)
            ))
            .await?;
        let v: Vec<u64> = read.split(' ').filter_map(|x| x.parse().ok()).collect();
        let [f_ok, f_val, u_val] = v[..] else {
            return Err(format!("bad READ reply {read:?}"));
        };
        let at_pause = format!("AT_PAUSE {grant} {}", lease_end(guard).unwrap_or(0));
        if told == "STOP" {
            conn.call(at_pause).await?;
            nix::sys::signal::raise(nix::sys::signal::Signal::SIGSTOP)
                .map_err(|e| format!("SIGSTOP: {e}"))?;
        } else if let Some(ms) = told.strip_prefix("STALL ").and_then(|m| m.parse().ok()) {
            conn.call(at_pause).await?;
            tokio::time::sleep(Duration::from_millis(ms)).await;
        } else {
            tokio::time::sleep(work).await;
        }
        if shared {
            // The second read, as late as the write would be.
            conn.call(format!(
                "SREAD {grant} {token} {}",
                lease_end(guard).unwrap_or(0)
            ))
            .await?;
            return Ok(());
        }
        // The write follows the read without another look at the lock: the
        // check-then-act gap that fencing exists for.
        let f = if f_ok == 1 {
            (f_val + 1).to_string()
        } else {
            "-".into()
        };
        conn.call(format!("WRITE {grant} {token} {f} {}", u_val + 1))
            .await?;
        Ok::<(), String>(())
    };
    tokio::pin!(rmw);
    let lost = guard.lost();
    tokio::pin!(lost);
    let mut lost_at: Option<(u64, String)> = None;
    loop {
        tokio::select! {
            r = &mut rmw => { r?; break; }
            reason = &mut lost, if lost_at.is_none() => {
                lost_at = Some((mono_ns(), format!("lost: {reason}")));
            }
        }
    }
    Ok(match lost_at {
        Some((t, how)) => (Some(t), how),
        None if !guard.is_held() => (Some(mono_ns()), "lost: the local deadline passed".into()),
        None => (None, String::new()),
    })
}

/// The holder's own (conservative) idea of when its lease ends, renewals
/// included, on the shared clock (in the past, after a pause); `None` once
/// lost.
fn lease_end(guard: &LockGuard) -> Option<u64> {
    let (now, at) = (tokio::time::Instant::now(), mono_ns());
    guard.deadline().map(|d| {
        if d >= now {
            at + (d - now).as_nanos() as u64
        } else {
            at.saturating_sub((now - d).as_nanos() as u64)
        }
    })
}
