//! A standalone ZooKeeper server (Debian's jars on a JVM).

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use super::process::{find_binary, free_port, tcp_exchange, temp_dir, ServerProcess};
use super::HarnessError;

/// Install hint.
pub const INSTALL: &str = "apt-get install zookeeper default-jre-headless (or run scripts/test.sh, which installs every server), or set DISTLOCK_TEST_ZOOKEEPER_URL";

const JARS: &str = "/usr/share/java/zookeeper.jar:/usr/share/java/slf4j-simple.jar";

/// Starts a private standalone ZooKeeper with a short tick.
pub fn spawn() -> Result<ServerProcess, HarnessError> {
    let java = find_binary("java", &[], INSTALL)?;
    if !Path::new("/usr/share/java/zookeeper.jar").is_file() {
        return Err(HarnessError::Missing {
            binary: "/usr/share/java/zookeeper.jar".into(),
            install: INSTALL,
        });
    }
    let dir = temp_dir("zookeeper")?;
    let port = free_port()?;
    let cfg = dir.join("zoo.cfg");
    let conf = format!(
        "tickTime=500\ninitLimit=10\nsyncLimit=5\ndataDir={}\nclientPort={port}\nclientPortAddress=127.0.0.1\nadmin.enableServer=false\n4lw.commands.whitelist=srvr,ruok,mntr,stat\nmaxSessionTimeout=60000\n",
        dir.join("data").display()
    );
    std::fs::write(&cfg, conf).map_err(|e| HarnessError::start("zookeeper", e.to_string()))?;
    let mut cmd = Command::new(java);
    cmd.args(jvm_args())
        .arg("org.apache.zookeeper.server.ZooKeeperServerMain")
        .arg(&cfg);
    ServerProcess::spawn(
        "zookeeper",
        cmd,
        dir,
        port,
        "TERM",
        Duration::from_secs(60),
        move || serving(port),
    )
}

/// JVM flags that keep a test server small and quick to start.
pub fn jvm_args() -> Vec<String> {
    [
        "-Xms16m",
        "-Xmx128m",
        "-XX:+UseSerialGC",
        "-XX:TieredStopAtLevel=1",
        "-cp",
        JARS,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

/// Whether the server answers `srvr` with a serving mode.
pub fn serving(port: u16) -> bool {
    tcp_exchange(port, b"srvr").is_some_and(|r| r.contains("Mode: "))
}

/// ZooKeeper's own command-line client running one command, for smoke and
/// interop tests.
pub fn cli(server: &str, args: &[&str]) -> Result<Command, HarnessError> {
    let java = find_binary("java", &[], INSTALL)?;
    let mut cmd = Command::new(java);
    cmd.args(jvm_args())
        .arg("org.apache.zookeeper.ZooKeeperMain")
        .args(["-server", server])
        .args(args);
    Ok(cmd)
}
