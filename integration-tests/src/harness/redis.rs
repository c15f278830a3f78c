//! redis-server on a loopback port.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use super::process::{find_binary, free_port, tcp_exchange, temp_dir, ServerProcess};
use super::tls::TestCerts;
use super::HarnessError;

/// Install hint.
pub const INSTALL: &str = "apt-get install redis-server (or run scripts/test.sh, which installs every server), or set DISTLOCK_TEST_REDIS_URL";

/// Redlock's per-node timeout in the suite's URLs: the default 50 ms is
/// meant for a quiet network; a loaded 2-core CI machine running debug
/// builds needs more.
pub const REDLOCK_NODE_TIMEOUT_MS: u64 = 250;

/// The Redlock URL over redis-servers on these loopback ports: the suite's
/// node timeout, then `options` (`&key=value` pairs).
pub fn redlock_url(ports: impl IntoIterator<Item = u16>, options: &str) -> String {
    let hosts: Vec<String> = ports
        .into_iter()
        .map(|p| format!("127.0.0.1:{p}"))
        .collect();
    // A node timeout among `options` replaces the default (a parameter
    // given twice is refused).
    let mut query = Vec::new();
    if !options.contains("node_timeout_ms=") {
        query.push(format!("node_timeout_ms={REDLOCK_NODE_TIMEOUT_MS}"));
    }
    query.extend(
        options
            .split('&')
            .filter(|p| !p.is_empty())
            .map(str::to_string),
    );
    format!("redlock://{}?{}", hosts.join(","), query.join("&"))
}

/// The subjectAltNames of the TLS servers' certificates: clients reach them
/// at 127.0.0.1, the address Sentinel and Cluster report.
const TLS_SANS: &str = "IP:127.0.0.1,DNS:localhost";

/// Starts a private redis-server with no persistence, plus `extra` arguments
/// (for example `--replicaof 127.0.0.1 PORT`).
pub fn spawn(extra: &[&str]) -> Result<ServerProcess, HarnessError> {
    spawn_in(temp_dir("redis")?, extra, None)
}

/// A private redis-server in `dir` with `extra` arguments. With `tls` it
/// speaks only TLS on its port (the plain port is off), presenting that
/// certificate and trusting that CA for its own outgoing links (replication,
/// the cluster bus).
fn spawn_in(
    dir: PathBuf,
    extra: &[&str],
    tls: Option<&TestCerts>,
) -> Result<ServerProcess, HarnessError> {
    let bin = find_binary("redis-server", &[], INSTALL)?;
    let port = free_port()?;
    let Some(certs) = tls else {
        let mut cmd = private_command(&bin, port, &dir);
        cmd.args(extra);
        return start("redis-server", cmd, dir, port, move || ping(port));
    };
    let mut cmd = private_command(&bin, 0, &dir);
    cmd.args(["--tls-port", &port.to_string()]);
    tls_args(&mut cmd, certs);
    cmd.args(extra);
    let ca = certs.ca.clone();
    start("redis-server (TLS)", cmd, dir, port, move || {
        tls_command(port, &ca, &["PING"]).is_some_and(|r| r.contains("PONG"))
    })
}

/// The certificate, key and CA of a TLS server; clients need no
/// certificate of their own.
fn tls_args(cmd: &mut Command, certs: &TestCerts) {
    cmd.arg("--tls-cert-file")
        .arg(&certs.cert)
        .arg("--tls-key-file")
        .arg(&certs.key)
        .arg("--tls-ca-cert-file")
        .arg(&certs.ca)
        .args(["--tls-auth-clients", "no"]);
}

/// Runs one command with `redis-cli` over TLS against `port`, trusting the
/// CA in `ca`, and returns its output (`None` if it could not run or the
/// handshake failed).
pub fn tls_command(port: u16, ca: &Path, args: &[&str]) -> Option<String> {
    let cli = find_binary("redis-cli", &[], INSTALL).ok()?;
    let mut c = Command::new(cli);
    c.arg("--tls")
        .arg("--cacert")
        .arg(ca)
        .args(["-p", &port.to_string()])
        .args(args);
    super::process::run_client(c).ok()
}

/// Starts `cmd` as `what` on `port` and waits until `ready` answers.
fn start(
    what: &'static str,
    cmd: Command,
    dir: PathBuf,
    port: u16,
    ready: impl Fn() -> bool + Send + Sync + 'static,
) -> Result<ServerProcess, HarnessError> {
    let timeout = Duration::from_secs(20);
    ServerProcess::start(what, cmd, dir, port, "TERM", timeout, ready)?.when_ready()
}

/// redis-server on `port` and loopback only, without persistence, its
/// files in `dir`.
fn private_command(bin: &std::path::Path, port: u16, dir: &std::path::Path) -> Command {
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
    .arg(dir);
    cmd
}

/// Whether the server answers PING.
pub fn ping(port: u16) -> bool {
    // A server with a password answers NOAUTH: it is up all the same.
    tcp_exchange(port, b"PING\r\nQUIT\r\n")
        .is_some_and(|r| r.starts_with("+PONG") || r.starts_with("-NOAUTH"))
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

/// [`command`] sent after `AUTH password`.
pub fn command_as(port: u16, password: &str, args: &[&str]) -> Option<String> {
    let mut req = format!("*2\r\n$4\r\nAUTH\r\n${}\r\n{password}\r\n", password.len());
    req.push_str(&format!("*{}\r\n", args.len()));
    for a in args {
        req.push_str(&format!("${}\r\n{a}\r\n", a.len()));
    }
    req.push_str("*1\r\n$4\r\nQUIT\r\n");
    tcp_exchange(port, req.as_bytes())
}

/// How often the server on `port` has run the commands `names` (lower
/// case, e.g. `evalsha`), from `INFO commandstats`: what clients sent, not
/// the commands their scripts ran.
pub fn calls(port: u16, names: &[&str]) -> u64 {
    calls_in(
        &command(port, &["INFO", "commandstats"]).unwrap_or_default(),
        names,
    )
}

/// [`calls`] from the text of an `INFO commandstats` reply.
pub fn calls_in(info: &str, names: &[&str]) -> u64 {
    info.lines()
        .filter_map(|l| {
            let (cmd, rest) = l.strip_prefix("cmdstat_")?.split_once(':')?;
            names.contains(&cmd).then_some(rest)?;
            rest.strip_prefix("calls=")?
                .split(',')
                .next()?
                .parse::<u64>()
                .ok()
        })
        .sum()
}

/// Starts `n` cluster-enabled servers and joins them into one cluster of
/// masters, waiting until every node reports `cluster_state:ok`.
pub fn cluster(n: usize) -> Result<Vec<ServerProcess>, HarnessError> {
    cluster_in(n, temp_dir("redis")?, None)
}

/// A cluster as [`cluster`] whose nodes speak only TLS, to clients and on
/// the cluster bus, all with certificates of one throwaway CA. Returns the
/// nodes and the CA's PEM file (in the first node's directory).
pub fn cluster_tls(n: usize) -> Result<(Vec<ServerProcess>, PathBuf), HarnessError> {
    let dir = temp_dir("redis-cluster-tls")?;
    let certs = super::tls::make_certs(&dir, TLS_SANS)?;
    let nodes = cluster_in(n, dir, Some(&certs))?;
    Ok((nodes, certs.ca))
}

/// [`cluster`], the first node in `first_dir`, over TLS with `tls`.
fn cluster_in(
    n: usize,
    first_dir: PathBuf,
    tls: Option<&TestCerts>,
) -> Result<Vec<ServerProcess>, HarnessError> {
    // The cluster bus port is a reserved port of its own: its default, the
    // client port + 10000, can fall in the kernel's ephemeral range or on a
    // port another test process reserved.
    let node = |dir: PathBuf| {
        let bus = free_port()?.to_string();
        let mut args = vec![
            "--cluster-enabled",
            "yes",
            "--cluster-node-timeout",
            "2000",
            "--cluster-port",
            &bus,
        ];
        if tls.is_some() {
            args.extend(["--tls-cluster", "yes", "--tls-replication", "yes"]);
        }
        spawn_in(dir, &args, tls)
    };
    let mut nodes = vec![node(first_dir)?];
    for _ in 1..n {
        nodes.push(node(temp_dir("redis")?)?);
    }
    let cli = find_binary("redis-cli", &[], INSTALL)?;
    let mut create = Command::new(cli);
    if let Some(certs) = tls {
        create.arg("--tls").arg("--cacert").arg(&certs.ca);
    }
    create.args(["--cluster", "create"]);
    for node in &nodes {
        create.arg(format!("127.0.0.1:{}", node.port));
    }
    create.args(["--cluster-replicas", "0", "--cluster-yes"]);
    super::process::run_client(create)
        .map_err(|e| HarnessError::start("redis cluster create", e))?;
    let cluster_info = |port: u16| match tls {
        Some(certs) => tls_command(port, &certs.ca, &["CLUSTER", "INFO"]),
        None => command(port, &["CLUSTER", "INFO"]),
    };
    let start = std::time::Instant::now();
    while !nodes
        .iter()
        .all(|s| cluster_info(s.port).is_some_and(|r| r.contains("cluster_state:ok")))
    {
        if start.elapsed() > Duration::from_secs(30) {
            return Err(HarnessError::start(
                "redis cluster",
                "cluster_state not ok after 30 s",
            ));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok(nodes)
}

/// Starts a Sentinel monitoring the master at `master_port` as `service`,
/// with a 1 s down-after time so failovers are quick.
pub fn sentinel(master_port: u16, service: &str) -> Result<ServerProcess, HarnessError> {
    sentinel_with_failover_timeout(master_port, service, 5000)
}

/// A Sentinel as [`sentinel`], with its `failover-timeout`. Sentinel also
/// waits that long before "fixing" a replica that replicates from another
/// address than the master's (one linked through a proxy), so tests that
/// cut the replication link for longer need a larger value.
pub fn sentinel_with_failover_timeout(
    master_port: u16,
    service: &str,
    failover_timeout_ms: u64,
) -> Result<ServerProcess, HarnessError> {
    sentinel_in(master_port, service, failover_timeout_ms, None)
}

/// A Sentinel as [`sentinel`] that speaks only TLS, to its clients and to
/// the master and its replicas (`tls-replication`), with `certs` (the
/// master's: one CA for all). Waits until it has reached the master over
/// TLS (the master's flags are plain `master`).
pub fn sentinel_tls(
    master_port: u16,
    service: &str,
    certs: &TestCerts,
) -> Result<ServerProcess, HarnessError> {
    let s = sentinel_in(master_port, service, 5000, Some(certs))?;
    let start = std::time::Instant::now();
    loop {
        let reply = tls_command(s.port, &certs.ca, &["SENTINEL", "MASTER", service]);
        if reply.is_some_and(|r| r.lines().any(|l| l.trim() == "master")) {
            return Ok(s);
        }
        if start.elapsed() > Duration::from_secs(20) {
            return Err(HarnessError::start(
                "redis-sentinel (TLS)",
                "the master's flags are not plain `master` after 20 s (no TLS link to it?)",
            ));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// [`sentinel_with_failover_timeout`], speaking only TLS with `tls`.
fn sentinel_in(
    master_port: u16,
    service: &str,
    failover_timeout_ms: u64,
    tls: Option<&TestCerts>,
) -> Result<ServerProcess, HarnessError> {
    let bin = find_binary(
        "redis-sentinel",
        &[],
        "apt-get install redis-sentinel (or run scripts/test.sh)",
    )?;
    let dir = temp_dir("sentinel")?;
    let port = free_port()?;
    let conf = dir.join("sentinel.conf");
    let listen = match tls {
        None => format!("port {port}\n"),
        Some(c) => format!(
            "port 0\ntls-port {port}\ntls-cert-file {}\ntls-key-file {}\ntls-ca-cert-file {}\ntls-auth-clients no\ntls-replication yes\n",
            c.cert.display(),
            c.key.display(),
            c.ca.display()
        ),
    };
    std::fs::write(
        &conf,
        format!(
            "{listen}bind 127.0.0.1\ndir {}\nsentinel monitor {service} 127.0.0.1 {master_port} 2\nsentinel down-after-milliseconds {service} 1000\nsentinel failover-timeout {service} {failover_timeout_ms}\nsentinel parallel-syncs {service} 1\n",
            dir.display()
        ),
    )
    .map_err(|e| HarnessError::start("redis-sentinel", e.to_string()))?;
    let mut cmd = Command::new(bin);
    cmd.arg(&conf);
    match tls {
        None => start("redis-sentinel", cmd, dir, port, move || ping(port)),
        Some(c) => {
            let ca = c.ca.clone();
            start("redis-sentinel (TLS)", cmd, dir, port, move || {
                tls_command(port, &ca, &["PING"]).is_some_and(|r| r.contains("PONG"))
            })
        }
    }
}

/// Starts a redis-server that only speaks TLS, with a throwaway CA and
/// server certificate made by `openssl`. Returns the server and the CA's
/// PEM file (inside the server's directory).
pub fn spawn_tls() -> Result<(ServerProcess, PathBuf), HarnessError> {
    spawn_tls_with(&[]).map(|(s, certs)| (s, certs.ca))
}

/// [`spawn_tls`] with `extra` arguments, returning all its certificate
/// files (for a Sentinel or replica that shares its CA).
pub fn spawn_tls_with(extra: &[&str]) -> Result<(ServerProcess, TestCerts), HarnessError> {
    let dir = temp_dir("redis-tls")?;
    let certs = super::tls::make_certs(&dir, TLS_SANS)?;
    let server = spawn_in(dir, extra, Some(&certs))?;
    Ok((server, certs))
}

/// Where Debian puts libfaketime.
fn libfaketime() -> Result<PathBuf, HarnessError> {
    ["x86_64-linux-gnu", "aarch64-linux-gnu"]
        .iter()
        .map(|arch| PathBuf::from(format!("/usr/lib/{arch}/faketime/libfaketime.so.1")))
        .find(|p| p.exists())
        .ok_or_else(|| HarnessError::Missing {
            binary: "libfaketime.so.1".into(),
            install: "apt-get install libfaketime (or run scripts/test.sh)",
        })
}

/// Debian's redis-server allocates with jemalloc, which hangs at start under
/// libfaketime (jemalloc reads the time while libfaketime initialises and
/// allocates). Preloading this shim first routes the allocator to glibc's.
const MALLOC_SHIM: &str = r#"
#include <stddef.h>
#include <errno.h>
#include <dlfcn.h>
extern void *__libc_malloc(size_t);
extern void __libc_free(void *);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);
extern void *__libc_memalign(size_t, size_t);
void *malloc(size_t n) { return __libc_malloc(n); }
void free(void *p) { __libc_free(p); }
void *calloc(size_t n, size_t m) { return __libc_calloc(n, m); }
void *realloc(void *p, size_t n) { return __libc_realloc(p, n); }
void *memalign(size_t a, size_t n) { return __libc_memalign(a, n); }
void *aligned_alloc(size_t a, size_t n) { return __libc_memalign(a, n); }
int posix_memalign(void **out, size_t a, size_t n) {
    void *p = __libc_memalign(a, n);
    if (!p) return ENOMEM;
    *out = p;
    return 0;
}
size_t malloc_usable_size(void *p) {
    static size_t (*libc_usable)(void *);
    if (!libc_usable) {
        void *libc = dlopen("libc.so.6", RTLD_NOW | RTLD_NOLOAD);
        libc_usable = (size_t (*)(void *))dlsym(libc, "malloc_usable_size");
    }
    return libc_usable(p);
}
"#;

/// A redis-server whose wall clock is libfaketime's: write an offset such as
/// `+3600` into the returned file to make its clock jump (the monotonic
/// clock is left alone). Compiles the malloc shim with `gcc`.
pub fn spawn_with_fake_clock() -> Result<(ServerProcess, PathBuf), HarnessError> {
    let bin = find_binary("redis-server", &[], INSTALL)?;
    let gcc = find_binary(
        "gcc",
        &[],
        "apt-get install gcc libc6-dev (or run scripts/test.sh)",
    )?;
    let faketime = libfaketime()?;
    let dir = temp_dir("redis-faketime")?;
    let source = dir.join("shim.c");
    let shim = dir.join("shim.so");
    let err = |e: String| HarnessError::start("redis-server (faketime)", e);
    std::fs::write(&source, MALLOC_SHIM).map_err(|e| err(e.to_string()))?;
    let out = Command::new(gcc)
        .args(["-shared", "-fPIC", "-O1", "-o"])
        .arg(&shim)
        .arg(&source)
        .arg("-ldl")
        .output()
        .map_err(|e| err(e.to_string()))?;
    if !out.status.success() {
        return Err(err(format!(
            "compiling the malloc shim failed: {}",
            String::from_utf8_lossy(&out.stderr)
        )));
    }
    let offset = dir.join("faketime");
    std::fs::write(&offset, "+0\n").map_err(|e| err(e.to_string()))?;
    let port = free_port()?;
    let mut cmd = private_command(&bin, port, &dir);
    cmd.env(
        "LD_PRELOAD",
        format!("{}:{}", shim.display(), faketime.display()),
    )
    .env("FAKETIME_TIMESTAMP_FILE", &offset)
    .env("FAKETIME_NO_CACHE", "1")
    .env("FAKETIME_DONT_FAKE_MONOTONIC", "1");
    let p = start("redis-server (faketime)", cmd, dir, port, move || {
        ping(port)
    })?;
    Ok((p, offset))
}
