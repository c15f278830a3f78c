//! redis-server on a loopback port.

use std::process::Command;
use std::time::Duration;

use super::process::{find_binary, free_port, tcp_exchange, temp_dir, ServerProcess};
use super::HarnessError;

/// Install hint.
pub const INSTALL: &str = "apt-get install redis-server (or run scripts/test.sh, which installs every server), or set DISTLOCK_TEST_REDIS_URL";

/// Starts a private redis-server with no persistence, plus `extra` arguments
/// (for example `--replicaof 127.0.0.1 PORT`).
pub fn spawn(extra: &[&str]) -> Result<ServerProcess, HarnessError> {
    let bin = find_binary("redis-server", &[], INSTALL)?;
    let dir = temp_dir("redis")?;
    let port = free_port()?;
    let mut cmd = Command::new(bin);
    cmd.args([
        "--port",
        &port.to_string(),
        "--bind",
        "127.0.0.1",
        "--save",
        "",
        "--appendonly",
        "no",
    ])
    .arg("--dir")
    .arg(&dir)
    .args(extra);
    ServerProcess::spawn(
        "redis-server",
        cmd,
        dir,
        port,
        "TERM",
        Duration::from_secs(20),
        move || ping(port),
    )
}

/// Whether the server answers PING.
pub fn ping(port: u16) -> bool {
    tcp_exchange(port, b"PING\r\nQUIT\r\n").is_some_and(|r| r.starts_with("+PONG"))
}

/// Sends one command in RESP and returns the raw reply.
pub fn command(port: u16, args: &[&str]) -> Option<String> {
    let mut req = format!("*{}\r\n", args.len());
    for a in args {
        req.push_str(&format!("${}\r\n{a}\r\n", a.len()));
    }
    req.push_str("*1\r\n$4\r\nQUIT\r\n");
    tcp_exchange(port, req.as_bytes())
}
