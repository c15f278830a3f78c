//! A private MariaDB server.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use super::process::{find_binary, free_port, is_root, run_client, temp_dir, ServerProcess};
use super::tls::{make_certs, TestCerts};
use super::HarnessError;

/// Install hint.
pub const INSTALL: &str = "apt-get install mariadb-server (or run scripts/test.sh, which installs every server), or set DISTLOCK_TEST_MYSQL_URL";

/// The database the harness creates for the tests.
pub const DATABASE: &str = "distlock";

/// Initialises a data directory, starts the server, and creates the
/// [`DATABASE`]; user `root` without password on 127.0.0.1.
pub fn spawn() -> Result<ServerProcess, HarnessError> {
    let dir = temp_dir("mariadb")?;
    let server = spawn_in(dir, None)?;
    let mut create = client(server.port)?;
    create.args(["-e", &format!("CREATE DATABASE IF NOT EXISTS {DATABASE}")]);
    run_client(create).map_err(|e| HarnessError::start("mariadb", e))?;
    Ok(server)
}

/// The user a [`spawn_tls`] server's clients connect as, with
/// [`TLS_PASSWORD`]; it may use [`DATABASE`] only.
pub const TLS_USER: &str = "app";

/// [`TLS_USER`]'s password.
pub const TLS_PASSWORD: &str = "tls-secret-pw";

/// Starts a server that accepts TCP clients only over TLS
/// (`require_secure_transport`), presenting a certificate for
/// `DNS:localhost` only, signed by a throwaway CA, with [`DATABASE`] and
/// [`TLS_USER`]. Returns the server and its certificates (the CA is what a
/// client trusts).
pub fn spawn_tls() -> Result<(ServerProcess, TestCerts), HarnessError> {
    let dir = temp_dir("mariadb-tls")?;
    let certs = make_certs(&dir, "DNS:localhost")?;
    let server = spawn_in(dir, Some(&certs))?;
    let mut setup = socket_client(&server.dir)?;
    setup.args([
        "-e",
        &format!(
            "CREATE DATABASE IF NOT EXISTS {DATABASE}; \
             CREATE USER '{TLS_USER}'@'%' IDENTIFIED BY '{TLS_PASSWORD}' REQUIRE SSL; \
             GRANT ALL ON {DATABASE}.* TO '{TLS_USER}'@'%'"
        ),
    ]);
    run_client(setup).map_err(|e| HarnessError::start("mariadb (TLS)", e))?;
    Ok((server, certs))
}

/// Starts a server in `dir`; with `tls`, TCP clients must use TLS, and the
/// harness talks to it over its Unix socket.
fn spawn_in(dir: PathBuf, tls: Option<&TestCerts>) -> Result<ServerProcess, HarnessError> {
    let mariadbd = find_binary("mariadbd", &[], INSTALL)?;
    let install_db = find_binary("mariadb-install-db", &[], INSTALL)?;
    let data = dir.join("data");
    // A temp dir of its own: a server deletes every temporary table file
    // it finds in its temp dir when it starts, so servers sharing one (the
    // system's) delete each other's tables from under running statements.
    let tmp = dir.join("tmp");
    std::fs::create_dir_all(&tmp)
        .map_err(|e| HarnessError::start("mariadb", format!("creating {}: {e}", tmp.display())))?;
    let root = is_root();
    let mut init = Command::new(install_db);
    init.arg("--no-defaults")
        .arg(format!("--datadir={}", data.display()))
        .arg(format!("--tmpdir={}", tmp.display()))
        .args([
            "--auth-root-authentication-method=normal",
            "--skip-test-db",
            "--innodb-log-file-size=4M",
        ]);
    if root {
        init.arg("--user=root");
    }
    {
        // Several installs at once in one process collide on the temporary
        // tables of their bootstrap servers (seen: "Unknown table
        // 'mysql.tmp_user_sys'"); one at a time.
        static INSTALLING: std::sync::Mutex<()> = std::sync::Mutex::new(());
        let _one = INSTALLING
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        run_client(init).map_err(|e| HarnessError::start("mariadb-install-db", e))?;
    }
    let port = free_port()?;
    let mut cmd = Command::new(mariadbd);
    cmd.arg("--no-defaults")
        .arg(format!("--datadir={}", data.display()))
        .arg(format!("--tmpdir={}", tmp.display()))
        .arg(format!("--socket={}", dir.join("mysqld.sock").display()))
        .arg(format!("--port={port}"))
        .args([
            "--bind-address=127.0.0.1",
            "--skip-log-bin",
            "--skip-name-resolve",
            "--innodb-buffer-pool-size=32M",
            "--innodb-flush-log-at-trx-commit=0",
            "--max-connections=300",
        ]);
    if root {
        cmd.arg("--user=root");
    }
    if let Some(certs) = tls {
        cmd.arg(format!("--ssl-cert={}", certs.cert.display()))
            .arg(format!("--ssl-key={}", certs.key.display()))
            .arg(format!("--ssl-ca={}", certs.ca.display()))
            .arg("--require-secure-transport=ON");
    }
    let probe_dir = dir.clone();
    let over_socket = tls.is_some();
    ServerProcess::start(
        if over_socket {
            "mariadb (TLS)"
        } else {
            "mariadb"
        },
        cmd,
        dir,
        port,
        "TERM",
        Duration::from_secs(60),
        move || {
            let probe = if over_socket {
                socket_client(&probe_dir)
            } else {
                client(port)
            };
            probe.is_ok_and(|mut c| {
                c.args(["-e", "SELECT 1"])
                    .stdout(std::process::Stdio::null())
                    .stderr(std::process::Stdio::null())
                    .status()
                    .is_ok_and(|s| s.success())
            })
        },
    )?
    .when_ready()
}

/// The `mariadb` command-line client connected as root over the Unix
/// socket of the server in `dir`.
fn socket_client(dir: &Path) -> Result<Command, HarnessError> {
    let bin =
        find_binary("mariadb", &[], INSTALL).or_else(|_| find_binary("mysql", &[], INSTALL))?;
    let mut c = Command::new(bin);
    c.args([
        "--no-defaults",
        "--protocol=SOCKET",
        "-u",
        "root",
        "-N",
        "-B",
    ])
    .arg(format!("--socket={}", dir.join("mysqld.sock").display()));
    Ok(c)
}

/// The `mariadb` command-line client connected as root over TCP.
pub fn client(port: u16) -> Result<Command, HarnessError> {
    let bin =
        find_binary("mariadb", &[], INSTALL).or_else(|_| find_binary("mysql", &[], INSTALL))?;
    let mut c = Command::new(bin);
    c.args([
        "--no-defaults",
        "--protocol=TCP",
        "-h",
        "127.0.0.1",
        "-u",
        "root",
        "-N",
        "-B",
    ])
    .arg(format!("-P{port}"));
    Ok(c)
}
