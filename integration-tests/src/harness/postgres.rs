//! A private PostgreSQL cluster.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use super::process::{chown, find_binary, free_port, is_root, run_client, temp_dir, ServerProcess};
use super::tls::{make_certs, TestCerts};
use super::HarnessError;

/// Install hint.
pub const INSTALL: &str = "apt-get install postgresql (or run scripts/test.sh, which installs every server), or set DISTLOCK_TEST_POSTGRES_URL";

fn bin_dir() -> Option<PathBuf> {
    let mut versions: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .filter_map(|e| e.ok().map(|e| e.path().join("bin")))
        .filter(|p| p.join("postgres").is_file())
        .collect();
    versions.sort();
    versions.pop()
}

/// A command that runs `bin` as the `postgres` user when we are root
/// (initdb and postgres refuse to run as root). setpriv execs in place, so
/// the child's pid is the server's own.
fn as_postgres(bin: PathBuf) -> Command {
    if is_root() {
        let mut c = Command::new("setpriv");
        c.args([
            "--reuid=postgres",
            "--regid=postgres",
            "--init-groups",
            "--",
        ])
        .arg(bin);
        c
    } else {
        Command::new(bin)
    }
}

/// Initialises and starts a cluster with durability switched off (tests
/// only), trusting local connections as user `postgres`.
pub fn spawn() -> Result<ServerProcess, HarnessError> {
    let dir = temp_dir("postgres")?;
    spawn_in(dir, None)
}

/// The password of user `postgres` on a [`spawn_tls`] server.
pub const TLS_PASSWORD: &str = "tls-secret-pw";

/// Starts a cluster that accepts TCP clients only over TLS, with a password
/// ([`TLS_PASSWORD`] for user `postgres`), presenting a certificate for
/// `DNS:localhost` only, signed by a throwaway CA. Returns the server and
/// its certificates (the CA is what a client trusts).
pub fn spawn_tls() -> Result<(ServerProcess, TestCerts), HarnessError> {
    let dir = temp_dir("postgres-tls")?;
    let certs = make_certs(&dir, "DNS:localhost")?;
    let server = spawn_in(dir, Some(&certs))?;
    let mut alter = psql_socket(&server)?;
    alter.args([
        "-c",
        &format!("ALTER USER postgres PASSWORD '{TLS_PASSWORD}'"),
    ]);
    run_client(alter).map_err(|e| HarnessError::start("postgres (TLS)", e))?;
    Ok((server, certs))
}

/// `psql` as `postgres` over the server's Unix socket, which trusts it.
fn psql_socket(server: &ServerProcess) -> Result<Command, HarnessError> {
    let dir_bins = bin_dir().map(|d| d.to_string_lossy().into_owned());
    let extra: Vec<&str> = dir_bins.iter().map(String::as_str).collect();
    let mut c = Command::new(find_binary("psql", &extra, INSTALL)?);
    c.args([
        "-X",
        "-A",
        "-t",
        "-v",
        "ON_ERROR_STOP=1",
        "-U",
        "postgres",
        "-h",
    ])
    .arg(&server.dir)
    .args(["-p", &server.port.to_string(), "-d", "postgres"]);
    Ok(c)
}

/// Starts a cluster in `dir`; with `tls`, TCP clients must use TLS and a
/// password, and the key and certificate are in `dir`.
fn spawn_in(dir: PathBuf, tls: Option<&TestCerts>) -> Result<ServerProcess, HarnessError> {
    let dir_bins = bin_dir().map(|d| d.to_string_lossy().into_owned());
    let extra: Vec<&str> = dir_bins.iter().map(String::as_str).collect();
    let postgres = find_binary("postgres", &extra, INSTALL)?;
    let initdb = find_binary("initdb", &extra, INSTALL)?;
    let pg_isready = find_binary("pg_isready", &extra, INSTALL)?;
    let data = dir.join("data");
    if is_root() {
        // The server reads its key as `postgres`, and only from a file no
        // one else may read (make_certs made it 0600).
        chown(&dir, "postgres")?;
    }
    let mut init = as_postgres(initdb);
    init.arg("-D")
        .arg(&data)
        .args(["-A", "trust", "-U", "postgres", "--no-sync", "-E", "UTF8"]);
    run_client(init).map_err(|e| HarnessError::start("postgres initdb", e))?;
    if tls.is_some() {
        // TCP only over TLS, with a password; the Unix socket stays trusted
        // for the harness itself.
        std::fs::write(
            data.join("pg_hba.conf"),
            "local all all trust\n\
             hostssl all all 127.0.0.1/32 scram-sha-256\n\
             hostssl all all ::1/128 scram-sha-256\n",
        )
        .map_err(|e| HarnessError::start("postgres (TLS)", e.to_string()))?;
    }
    let port = free_port()?;
    let mut cmd = as_postgres(postgres);
    cmd.arg("-D")
        .arg(&data)
        .args(["-p", &port.to_string(), "-k"])
        .arg(&dir)
        .args([
            "-c",
            "listen_addresses=127.0.0.1",
            "-c",
            "fsync=off",
            "-c",
            "synchronous_commit=off",
            "-c",
            "full_page_writes=off",
            "-c",
            "max_connections=1000",
            // Statement counts, for the cases that count requests.
            "-c",
            "shared_preload_libraries=pg_stat_statements",
        ]);
    if let Some(certs) = tls {
        cmd.args(["-c", "ssl=on", "-c"])
            .arg(format!("ssl_cert_file={}", certs.cert.display()))
            .arg("-c")
            .arg(format!("ssl_key_file={}", certs.key.display()));
    }
    ServerProcess::start(
        if tls.is_some() {
            "postgres (TLS)"
        } else {
            "postgres"
        },
        cmd,
        dir,
        port,
        "INT",
        Duration::from_secs(30),
        move || {
            Command::new(&pg_isready)
                .args(["-q", "-h", "127.0.0.1", "-p", &port.to_string()])
                .status()
                .is_ok_and(|s| s.success())
        },
    )?
    .when_ready()
}

/// `psql` connected to `url`, for smoke tests.
pub fn psql(url: &str) -> Result<Command, HarnessError> {
    let dir_bins = bin_dir().map(|d| d.to_string_lossy().into_owned());
    let extra: Vec<&str> = dir_bins.iter().map(String::as_str).collect();
    let mut c = Command::new(find_binary("psql", &extra, INSTALL)?);
    c.arg(url).args(["-X", "-A", "-t", "-v", "ON_ERROR_STOP=1"]);
    Ok(c)
}
