//! A private MariaDB server.

use std::process::Command;
use std::time::Duration;

use super::process::{find_binary, free_port, is_root, run_client, temp_dir, ServerProcess};
use super::HarnessError;

/// Install hint.
pub const INSTALL: &str = "apt-get install mariadb-server (or run scripts/test.sh, which installs every server), or set DISTLOCK_TEST_MYSQL_URL";

/// The database the harness creates for the tests.
pub const DATABASE: &str = "distlock";

/// Initialises a data directory, starts the server, and creates the
/// [`DATABASE`]; user `root` without password on 127.0.0.1.
pub fn spawn() -> Result<ServerProcess, HarnessError> {
    let mariadbd = find_binary("mariadbd", &[], INSTALL)?;
    let install_db = find_binary("mariadb-install-db", &[], INSTALL)?;
    let dir = temp_dir("mariadb")?;
    let data = dir.join("data");
    let root = is_root();
    let mut init = Command::new(install_db);
    init.arg("--no-defaults")
        .arg(format!("--datadir={}", data.display()))
        .args([
            "--auth-root-authentication-method=normal",
            "--skip-test-db",
            "--innodb-log-file-size=4M",
        ]);
    if root {
        init.arg("--user=root");
    }
    run_client(init).map_err(|e| HarnessError::start("mariadb-install-db", e))?;
    let port = free_port()?;
    let mut cmd = Command::new(mariadbd);
    cmd.arg("--no-defaults")
        .arg(format!("--datadir={}", data.display()))
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
    let server = ServerProcess::start(
        "mariadb",
        cmd,
        dir,
        port,
        "TERM",
        Duration::from_secs(60),
        move || {
            client(port).is_ok_and(|mut c| {
                c.args(["-e", "SELECT 1"])
                    .stdout(std::process::Stdio::null())
                    .stderr(std::process::Stdio::null())
                    .status()
                    .is_ok_and(|s| s.success())
            })
        },
    )?
    .when_ready()?;
    let mut create = client(port)?;
    create.args(["-e", &format!("CREATE DATABASE IF NOT EXISTS {DATABASE}")]);
    run_client(create).map_err(|e| HarnessError::start("mariadb", e))?;
    Ok(server)
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
