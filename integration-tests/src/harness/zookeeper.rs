//! A standalone ZooKeeper server (Debian's jars on a JVM).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use super::process::{find_binary, free_port, tcp_exchange, temp_dir, ServerProcess};
use super::HarnessError;

/// Install hint.
pub const INSTALL: &str = "apt-get install zookeeper default-jre-headless (or run scripts/test.sh, which installs every server), or set DISTLOCK_TEST_ZOOKEEPER_URL";

const JARS: &str = "/usr/share/java/zookeeper.jar:/usr/share/java/slf4j-simple.jar";

/// Starts a private standalone ZooKeeper with a short tick.
pub fn spawn() -> Result<ServerProcess, HarnessError> {
    spawn_with("")
}

/// [`spawn`] with more `zoo.cfg` lines (`key=value\n` each), which override
/// the defaults.
pub fn spawn_with(extra_config: &str) -> Result<ServerProcess, HarnessError> {
    let java = find_binary("java", &[], INSTALL)?;
    if !Path::new("/usr/share/java/zookeeper.jar").is_file() {
        return Err(HarnessError::Missing {
            binary: "/usr/share/java/zookeeper.jar".into(),
            install: INSTALL,
        });
    }
    let dir = temp_dir("zookeeper")?;
    let main = "org.apache.zookeeper.server.ZooKeeperServerMain";
    let timeout = Duration::from_secs(60);
    start(&java, main, dir, free_port()?, timeout, extra_config)?.when_ready()
}

/// Writes `dir/zoo.cfg` (the suite's settings, data in `dir/data`, clients
/// on `client`, then `extra_config`) and starts the class `main` on it,
/// returning at once.
fn start(
    java: &Path,
    main: &str,
    dir: PathBuf,
    client: u16,
    timeout: Duration,
    extra_config: &str,
) -> Result<ServerProcess, HarnessError> {
    let cfg = dir.join("zoo.cfg");
    let conf = format!(
        "tickTime=500\ninitLimit=10\nsyncLimit=5\ndataDir={}\nclientPort={client}\nclientPortAddress=127.0.0.1\nadmin.enableServer=false\n4lw.commands.whitelist=srvr,ruok,mntr,stat\nmaxSessionTimeout=60000\nmaxClientCnxns=0\n{extra_config}",
        dir.join("data").display()
    );
    std::fs::write(&cfg, conf).map_err(|e| HarnessError::start("zookeeper", e.to_string()))?;
    let mut cmd = Command::new(java);
    cmd.args(jvm_args()).arg(main).arg(&cfg);
    let ready = move || serving(client);
    ServerProcess::start("zookeeper", cmd, dir, client, "TERM", timeout, ready)
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

/// The connections the server has open (`mntr`'s `zk_num_alive_connections`).
pub fn alive_connections(port: u16) -> Option<u64> {
    tcp_exchange(port, b"mntr")?.lines().find_map(|l| {
        l.strip_prefix("zk_num_alive_connections")
            .and_then(|v| v.trim().parse().ok())
    })
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

/// Starts an `n`-server ZooKeeper ensemble on loopback and waits until every
/// server serves (as leader or follower).
pub fn ensemble(n: usize) -> Result<Vec<ServerProcess>, HarnessError> {
    let java = find_binary("java", &[], INSTALL)?;
    let ports: Vec<(u16, u16, u16)> = (0..n)
        .map(|_| Ok((free_port()?, free_port()?, free_port()?)))
        .collect::<Result<_, HarnessError>>()?;
    let servers: String = ports
        .iter()
        .enumerate()
        .map(|(i, (_, peer, election))| format!("server.{}=127.0.0.1:{peer}:{election}\n", i + 1))
        .collect();
    let mut members = Vec::new();
    for (i, (client, _, _)) in ports.iter().copied().enumerate() {
        let dir = temp_dir("zookeeper-member")?;
        let data = dir.join("data");
        std::fs::create_dir_all(&data)
            .map_err(|e| HarnessError::start("zookeeper", e.to_string()))?;
        std::fs::write(data.join("myid"), format!("{}\n", i + 1))
            .map_err(|e| HarnessError::start("zookeeper", e.to_string()))?;
        let main = "org.apache.zookeeper.server.quorum.QuorumPeerMain";
        let timeout = Duration::from_secs(90);
        members.push(start(&java, main, dir, client, timeout, &servers)?);
    }
    for m in &mut members {
        m.wait_ready()?;
    }
    Ok(members)
}

/// Whether the server at `port` is the ensemble's leader.
pub fn is_leader(port: u16) -> bool {
    tcp_exchange(port, b"srvr").is_some_and(|r| r.contains("Mode: leader"))
}
