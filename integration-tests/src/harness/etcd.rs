//! A single etcd member on loopback ports.

use std::process::Command;
use std::time::Duration;

use super::process::{find_binary, free_port, tcp_exchange, temp_dir, ServerProcess};
use super::HarnessError;

/// Install hint.
pub const INSTALL: &str = "apt-get install etcd-server etcd-client (or run scripts/test.sh, which installs every server), or set DISTLOCK_TEST_ETCD_URL";

/// Starts a private single-member etcd cluster.
pub fn spawn() -> Result<ServerProcess, HarnessError> {
    cluster(1)?
        .pop()
        .ok_or_else(|| HarnessError::start("etcd", "a cluster of one has no member"))
}

/// Whether `/health` reports healthy.
pub fn healthy(port: u16) -> bool {
    tcp_exchange(port, b"GET /health HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
        .is_some_and(|r| r.contains("\"health\":\"true\""))
}

/// The `etcdctl` binary, for smoke and interop tests.
pub fn etcdctl(endpoint: &str) -> Result<Command, HarnessError> {
    let bin = find_binary("etcdctl", &[], INSTALL)?;
    let mut cmd = Command::new(bin);
    cmd.env("ETCDCTL_API", "3")
        .arg(format!("--endpoints={endpoint}"));
    Ok(cmd)
}

/// Starts an `n`-member etcd cluster on loopback and waits until every
/// member reports healthy.
pub fn cluster(n: usize) -> Result<Vec<ServerProcess>, HarnessError> {
    let bin = find_binary("etcd", &[], INSTALL)?;
    let ports: Vec<(u16, u16)> = (0..n)
        .map(|_| Ok((free_port()?, free_port()?)))
        .collect::<Result<_, HarnessError>>()?;
    let initial: Vec<String> = ports
        .iter()
        .enumerate()
        .map(|(i, (_, p))| format!("m{i}=http://127.0.0.1:{p}"))
        .collect();
    let initial = initial.join(",");
    let mut members = Vec::new();
    for (i, (client, peer)) in ports.iter().copied().enumerate() {
        let dir = temp_dir("etcd-member")?;
        let c = format!("http://127.0.0.1:{client}");
        let p = format!("http://127.0.0.1:{peer}");
        let mut cmd = Command::new(&bin);
        cmd.args(["--name", &format!("m{i}"), "--data-dir"])
            .arg(dir.join("data"))
            .args(["--listen-client-urls", &c, "--advertise-client-urls", &c])
            .args([
                "--listen-peer-urls",
                &p,
                "--initial-advertise-peer-urls",
                &p,
            ])
            .args([
                "--initial-cluster",
                &initial,
                "--initial-cluster-state",
                "new",
                "--initial-cluster-token",
                "distlock-test",
            ])
            .args([
                "--heartbeat-interval",
                "100",
                "--election-timeout",
                "1000",
                "--log-level",
                "warn",
            ]);
        members.push(ServerProcess::start(
            "etcd member",
            cmd,
            dir,
            client,
            "TERM",
            Duration::from_secs(60),
            move || healthy(client),
        )?);
    }
    for m in &mut members {
        m.wait_ready()?;
    }
    Ok(members)
}

/// The client port of the current leader among `members`, from `etcdctl endpoint status`.
pub fn leader(members: &[ServerProcess]) -> Option<u16> {
    let eps: Vec<String> = members
        .iter()
        .map(|m| format!("127.0.0.1:{}", m.port))
        .collect();
    let mut cmd = etcdctl(&eps.join(",")).ok()?;
    cmd.args(["endpoint", "status"]);
    let out = super::process::run_client(cmd).ok()?;
    out.lines().find_map(|l| {
        let fields: Vec<&str> = l.split(',').map(str::trim).collect();
        (fields.get(4) == Some(&"true"))
            .then(|| fields[0].rsplit(':').next()?.parse().ok())
            .flatten()
    })
}
