//! A single etcd member on loopback ports.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use super::process::{find_binary, free_port, tcp_exchange, temp_dir, ServerProcess};
use super::tls::TestCerts;
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
        let cmd = member(&bin, i, &dir, (client, peer), &initial, None);
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

/// Starts a single member that serves clients only over TLS, with a
/// throwaway CA and a certificate for `127.0.0.1` and `localhost`. Returns
/// the member and the CA's PEM file. `/health` stays on a plain metrics
/// port, for the readiness probe.
pub fn spawn_tls() -> Result<(ServerProcess, PathBuf), HarnessError> {
    spawn_tls_with(&[])
}

/// [`spawn_tls`] with `flags` added to the member's command line (such as
/// `--auth-token-ttl=2`).
pub fn spawn_tls_with(flags: &[&str]) -> Result<(ServerProcess, PathBuf), HarnessError> {
    spawn_tls_member(flags, false)
}

/// [`spawn_tls`] with JWT auth tokens (`--auth-token=jwt,…`, RS256, signed
/// with the server certificate's key), which carry the auth store's
/// revision they were issued at.
pub fn spawn_tls_jwt() -> Result<(ServerProcess, PathBuf), HarnessError> {
    spawn_tls_member(&[], true)
}

fn spawn_tls_member(flags: &[&str], jwt: bool) -> Result<(ServerProcess, PathBuf), HarnessError> {
    let bin = find_binary("etcd", &[], INSTALL)?;
    let (client, peer, metrics) = (free_port()?, free_port()?, free_port()?);
    let dir = temp_dir("etcd-tls")?;
    let certs = super::tls::make_certs(&dir, "IP:127.0.0.1,DNS:localhost")?;
    let initial = format!("m0=http://127.0.0.1:{peer}");
    let mut cmd = member(&bin, 0, &dir, (client, peer), &initial, Some(&certs));
    cmd.args([
        "--listen-metrics-urls",
        &format!("http://127.0.0.1:{metrics}"),
    ]);
    cmd.args(flags);
    if jwt {
        let public = dir.join("jwt.pub");
        let mut derive = Command::new(find_binary("openssl", &[], "apt-get install openssl")?);
        derive
            .arg("rsa")
            .arg("-in")
            .arg(&certs.key)
            .arg("-pubout")
            .arg("-out")
            .arg(&public);
        super::process::run_client(derive).map_err(|e| HarnessError::start("openssl", e))?;
        cmd.arg(format!(
            "--auth-token=jwt,pub-key={},priv-key={},sign-method=RS256",
            public.display(),
            certs.key.display()
        ));
    }
    let member = ServerProcess::start(
        "etcd member (TLS)",
        cmd,
        dir,
        client,
        "TERM",
        Duration::from_secs(60),
        move || healthy(metrics),
    )?
    .when_ready()?;
    Ok((member, certs.ca))
}

/// The command line of member `i` of a cluster whose peers are `initial`,
/// serving clients over TLS with `tls`'s certificate when given.
fn member(
    bin: &Path,
    i: usize,
    dir: &Path,
    (client, peer): (u16, u16),
    initial: &str,
    tls: Option<&TestCerts>,
) -> Command {
    let c = format!(
        "{}://127.0.0.1:{client}",
        if tls.is_some() { "https" } else { "http" }
    );
    let p = format!("http://127.0.0.1:{peer}");
    let mut cmd = Command::new(bin);
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
            initial,
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
    if let Some(tls) = tls {
        cmd.arg("--cert-file")
            .arg(&tls.cert)
            .arg("--key-file")
            .arg(&tls.key);
    }
    cmd
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
