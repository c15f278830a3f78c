//! Child server processes: temp dirs, free ports, readiness, teardown.

use std::fs::File;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::HarnessError;

/// A server started by the harness. Dropping it stops the process and
/// removes its data directory.
pub struct ServerProcess {
    /// What runs (for messages).
    pub what: &'static str,
    /// The loopback port it serves on.
    pub port: u16,
    /// Its private directory (data, config, log).
    pub dir: PathBuf,
    child: Child,
    /// Signal for a graceful stop (`INT`, `TERM`); SIGKILL follows after 5 s.
    stop_signal: &'static str,
    /// How to start it again (restart tests).
    program: std::ffi::OsString,
    args: Vec<std::ffi::OsString>,
    timeout: Duration,
    ready: Box<dyn Fn() -> bool + Send + Sync>,
}

impl std::fmt::Debug for ServerProcess {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerProcess")
            .field("what", &self.what)
            .field("port", &self.port)
            .field("pid", &self.child.id())
            .finish()
    }
}

impl ServerProcess {
    /// Spawns `cmd` with output to `dir/server.log` and returns at once;
    /// [`when_ready`](Self::when_ready) or [`wait_ready`](Self::wait_ready)
    /// then waits until `ready` answers true (or the process exits, or
    /// `timeout` passes). Cluster members are only ready once enough of them
    /// run.
    pub fn start(
        what: &'static str,
        mut cmd: Command,
        dir: PathBuf,
        port: u16,
        stop_signal: &'static str,
        timeout: Duration,
        ready: impl Fn() -> bool + Send + Sync + 'static,
    ) -> Result<Self, HarnessError> {
        let program = cmd.get_program().to_os_string();
        let args = cmd.get_args().map(|a| a.to_os_string()).collect();
        let child = Self::launch(what, &mut cmd, &dir)?;
        Ok(ServerProcess {
            what,
            port,
            dir,
            child,
            stop_signal,
            program,
            args,
            timeout,
            ready: Box::new(ready),
        })
    }

    fn launch(what: &'static str, cmd: &mut Command, dir: &Path) -> Result<Child, HarnessError> {
        let log = dir.join("server.log");
        let out = File::options()
            .create(true)
            .append(true)
            .open(&log)
            .map_err(|e| HarnessError::start(what, format!("opening {}: {e}", log.display())))?;
        let err = out
            .try_clone()
            .map_err(|e| HarnessError::start(what, e.to_string()))?;
        cmd.stdin(Stdio::null()).stdout(out).stderr(err);
        cmd.spawn()
            .map_err(|e| HarnessError::start(what, format!("spawning {cmd:?}: {e}")))
    }

    /// The server, once its readiness probe answers.
    pub fn when_ready(mut self) -> Result<Self, HarnessError> {
        self.wait_ready()?;
        Ok(self)
    }

    /// Waits until the readiness probe answers.
    pub fn wait_ready(&mut self) -> Result<(), HarnessError> {
        let start = Instant::now();
        loop {
            let ready = (self.ready)();
            // A probe can reach another server on the same port; it only
            // counts while this one still runs.
            if let Ok(Some(status)) = self.child.try_wait() {
                let log = self.log_tail();
                return Err(HarnessError::start(
                    self.what,
                    format!("exited with {status} before it was ready; log:\n{log}"),
                ));
            }
            if ready {
                return Ok(());
            }
            if start.elapsed() > self.timeout {
                let log = self.log_tail();
                return Err(HarnessError::start(
                    self.what,
                    format!("not ready after {:?}; log:\n{log}", self.timeout),
                ));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Stops the server gracefully and starts it again on the same port and
    /// data directory.
    pub fn restart(&mut self) -> Result<(), HarnessError> {
        self.stop();
        // A stopped server can hold its port for a moment.
        let start = Instant::now();
        while TcpStream::connect(("127.0.0.1", self.port)).is_ok()
            && start.elapsed() < Duration::from_secs(10)
        {
            std::thread::sleep(Duration::from_millis(50));
        }
        let mut cmd = Command::new(&self.program);
        cmd.args(&self.args);
        self.child = Self::launch(self.what, &mut cmd, &self.dir)?;
        self.wait_ready()
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The last lines of the server's log.
    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(self.dir.join("server.log")).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(25)..].join("\n")
    }

    /// Sends a signal (`STOP`, `CONT`, `KILL`...) to the server, for fault tests.
    pub fn signal(&self, sig: &str) -> std::io::Result<()> {
        signal(self.child.id(), sig)
    }

    /// Stops the server and waits for it to exit.
    pub fn stop(&mut self) {
        if let Ok(Some(_)) = self.child.try_wait() {
            return;
        }
        let _ = signal(self.child.id(), "CONT");
        let _ = signal(self.child.id(), self.stop_signal);
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(5) {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Sends `sig` to `pid` with kill(1), so the harness needs no unsafe code.
pub fn signal(pid: u32, sig: &str) -> std::io::Result<()> {
    let status = Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(pid.to_string())
        .stderr(Stdio::null())
        .status()?;
    if status.success() {
        Ok(())
    } else {
        Err(std::io::Error::other(format!("kill -{sig} {pid} failed")))
    }
}

/// A fresh private directory under the system temp dir.
pub fn temp_dir(what: &str) -> Result<PathBuf, HarnessError> {
    let owner = distlock_core::Owner::random().to_string();
    let dir = std::env::temp_dir().join(format!(
        "distlock-{what}-{}-{}",
        std::process::id(),
        &owner[..8]
    ));
    std::fs::create_dir_all(&dir)
        .map_err(|e| HarnessError::start("harness", format!("creating {}: {e}", dir.display())))?;
    Ok(dir)
}

/// The lowest port [`free_port`] hands out.
const PORT_FLOOR: u16 = 10_000;

/// A loopback port for a server to bind, reserved for this test process.
///
/// Two things can take a port between the moment it is found free and the
/// moment the server binds it: another test process looking for a free port,
/// and any outgoing connection, which takes its local port from the kernel's
/// ephemeral range. The port comes from below that range, so no outgoing
/// connection takes it, and this process keeps a UDP socket bound to the same
/// number until it exits, so no other test process picks it (none of the
/// servers uses UDP).
pub fn free_port() -> Result<u16, HarnessError> {
    use std::hash::{BuildHasher, Hasher};
    static HELD: std::sync::Mutex<Vec<std::net::UdpSocket>> = std::sync::Mutex::new(Vec::new());
    let ephemeral_low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| r.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32_768);
    let span = ephemeral_low.saturating_sub(PORT_FLOOR);
    if span < 1_000 {
        return TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .map_err(|e| HarnessError::start("harness", format!("finding a free port: {e}")));
    }
    let seed = std::collections::hash_map::RandomState::new();
    for attempt in 0u32..10_000 {
        let mut h = seed.build_hasher();
        h.write_u32(attempt);
        let port = PORT_FLOOR + (h.finish() % u64::from(span)) as u16;
        let Ok(reservation) = std::net::UdpSocket::bind(("127.0.0.1", port)) else {
            continue;
        };
        if TcpListener::bind(("127.0.0.1", port)).is_err() {
            continue;
        }
        HELD.lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(reservation);
        return Ok(port);
    }
    Err(HarnessError::start(
        "harness",
        format!("no free loopback port in {PORT_FLOOR}..{ephemeral_low}"),
    ))
}

/// Finds `name` on PATH or in `extra` directories.
pub fn find_binary(
    name: &str,
    extra: &[&str],
    install: &'static str,
) -> Result<PathBuf, HarnessError> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(extra.iter().map(PathBuf::from))
        .chain(
            ["/usr/sbin", "/usr/local/sbin", "/sbin"]
                .iter()
                .map(PathBuf::from),
        )
        .map(|d| d.join(name))
        .find(|p| p.is_file())
        .ok_or(HarnessError::Missing {
            binary: name.to_string(),
            install,
        })
}

/// Sends `request` to 127.0.0.1:`port` and returns what the server answers
/// within one second (the readiness probes' building block).
pub fn tcp_exchange(port: u16, request: &[u8]) -> Option<String> {
    let mut s =
        TcpStream::connect_timeout(&([127, 0, 0, 1], port).into(), Duration::from_millis(500))
            .ok()?;
    s.set_read_timeout(Some(Duration::from_secs(1))).ok()?;
    s.write_all(request).ok()?;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        match s.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => {
                buf.extend_from_slice(&chunk[..n]);
                if buf.len() > 64 * 1024 {
                    break;
                }
            }
            Err(_) => break,
        }
    }
    (!buf.is_empty()).then(|| String::from_utf8_lossy(&buf).into_owned())
}

/// Runs a client command and returns its stdout, or the failure with stderr.
pub fn run_client(mut cmd: Command) -> Result<String, String> {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("running {cmd:?}: {e}"))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(format!(
            "{cmd:?} failed with {}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

/// Whether this process runs as root (servers such as PostgreSQL refuse to).
pub fn is_root() -> bool {
    run_client({
        let mut c = Command::new("id");
        c.arg("-u");
        c
    })
    .map(|s| s.trim() == "0")
    .unwrap_or(false)
}

/// Gives `dir` to `user` (for servers that must not run as root).
pub fn chown(dir: &Path, user: &str) -> Result<(), HarnessError> {
    let mut c = Command::new("chown");
    c.arg("-R").arg(format!("{user}:{user}")).arg(dir);
    run_client(c)
        .map(|_| ())
        .map_err(|e| HarnessError::start("harness", e))
}
