//! The testcontainers provider (feature `containers`), for users with Docker.
//!
//! Before touching testcontainers it checks that a Docker daemon answers, so
//! that on a machine without one the run fails at once with a clear message
//! instead of hanging.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::net::UnixStream;
use std::time::Duration;

use testcontainers::core::{IntoContainerPort, WaitFor};
use testcontainers::runners::AsyncRunner;
use testcontainers::{ContainerAsync, GenericImage, ImageExt};

use super::{HarnessError, ServerKind};

const START_TIMEOUT: Duration = Duration::from_secs(300);

/// A running container; removed on drop.
pub struct Container {
    /// Host the mapped port is on.
    pub host: String,
    /// The mapped client port.
    pub port: u16,
    rt: tokio::runtime::Runtime,
    inner: Option<ContainerAsync<GenericImage>>,
}

impl std::fmt::Debug for Container {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Container")
            .field("host", &self.host)
            .field("port", &self.port)
            .finish()
    }
}

impl Drop for Container {
    fn drop(&mut self) {
        if let Some(c) = self.inner.take() {
            let _ = self.rt.block_on(c.rm());
        }
    }
}

/// The Docker endpoint: `docker_host`, else `DOCKER_HOST`, else the default socket.
pub fn docker_endpoint(docker_host: Option<&str>) -> String {
    docker_host
        .map(str::to_string)
        .or_else(|| std::env::var("DOCKER_HOST").ok())
        .unwrap_or_else(|| "unix:///var/run/docker.sock".into())
}

/// Checks within about two seconds that a Docker daemon answers `/_ping`.
pub fn check_docker(endpoint: &str) -> Result<(), HarnessError> {
    let unavailable = |reason: String| HarnessError::DockerUnavailable {
        host: endpoint.to_string(),
        reason,
    };
    let timeout = Duration::from_secs(2);
    let reply = if let Some(path) = endpoint.strip_prefix("unix://") {
        UnixStream::connect(path).and_then(|s| {
            s.set_read_timeout(Some(timeout))?;
            ping(s)
        })
    } else if let Some(addr) = endpoint.strip_prefix("tcp://") {
        let addr = addr
            .parse()
            .map_err(|e| unavailable(format!("bad address: {e}")))?;
        TcpStream::connect_timeout(&addr, timeout).and_then(|s| {
            s.set_read_timeout(Some(timeout))?;
            ping(s)
        })
    } else {
        return Err(unavailable(
            "only unix:// and tcp:// endpoints are supported".into(),
        ));
    }
    .map_err(|e| unavailable(e.to_string()))?;
    if reply.contains("OK") {
        Ok(())
    } else {
        Err(unavailable(format!(
            "unexpected answer to /_ping: {:?}",
            reply.lines().next()
        )))
    }
}

/// Sends `GET /_ping` over `stream` and reads the whole answer.
fn ping(mut stream: impl Read + Write) -> std::io::Result<String> {
    stream.write_all(b"GET /_ping HTTP/1.0\r\nHost: docker\r\n\r\n")?;
    let mut reply = String::new();
    stream.read_to_string(&mut reply)?;
    Ok(reply)
}

/// The image of `kind` (ready once it logs a known line), its client port
/// and its environment.
fn image(kind: ServerKind) -> (GenericImage, u16, Vec<(&'static str, &'static str)>) {
    let (name, tag, port) = match kind {
        ServerKind::Redis => ("redis", "7.0", 6379),
        ServerKind::Etcd => ("quay.io/coreos/etcd", "v3.4.23", 2379),
        ServerKind::ZooKeeper => ("zookeeper", "3.8", 2181),
        ServerKind::Postgres => ("postgres", "15", 5432),
        ServerKind::MariaDb => ("mariadb", "10.11", 3306),
    };
    let ready = match kind {
        ServerKind::Redis => WaitFor::message_on_stdout("Ready to accept connections"),
        ServerKind::Etcd => WaitFor::message_on_stderr("ready to serve client requests"),
        ServerKind::ZooKeeper => WaitFor::message_on_stdout("binding to port"),
        ServerKind::Postgres => {
            WaitFor::message_on_stderr("database system is ready to accept connections")
        }
        ServerKind::MariaDb => WaitFor::message_on_stderr("ready for connections"),
    };
    let env = match kind {
        ServerKind::Redis => vec![],
        ServerKind::Etcd => vec![
            ("ETCD_LISTEN_CLIENT_URLS", "http://0.0.0.0:2379"),
            ("ETCD_ADVERTISE_CLIENT_URLS", "http://127.0.0.1:2379"),
        ],
        ServerKind::ZooKeeper => vec![("ZOO_4LW_COMMANDS_WHITELIST", "srvr,ruok,mntr,stat")],
        ServerKind::Postgres => vec![("POSTGRES_HOST_AUTH_METHOD", "trust")],
        ServerKind::MariaDb => vec![
            ("MARIADB_ALLOW_EMPTY_ROOT_PASSWORD", "1"),
            ("MARIADB_DATABASE", super::mariadb::DATABASE),
        ],
    };
    (GenericImage::new(name, tag).with_wait_for(ready), port, env)
}

/// Starts a container of `kind` (Docker at `docker_host`, else the default).
pub fn start(kind: ServerKind, docker_host: Option<&str>) -> Result<Container, HarnessError> {
    check_docker(&docker_endpoint(docker_host))?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| HarnessError::start("containers", e.to_string()))?;
    let (img, port, env) = image(kind);
    let mut req = img
        .with_exposed_port(port.tcp())
        .with_startup_timeout(START_TIMEOUT);
    for (k, v) in env {
        req = req.with_env_var(k, v);
    }
    let started = rt.block_on(async {
        let c = tokio::time::timeout(START_TIMEOUT, req.start())
            .await
            .map_err(|_| format!("container not started within {START_TIMEOUT:?}"))?
            .map_err(|e| e.to_string())?;
        let host = c.get_host().await.map_err(|e| e.to_string())?.to_string();
        let mapped = c
            .get_host_port_ipv4(port.tcp())
            .await
            .map_err(|e| e.to_string())?;
        Ok::<_, String>((c, host, mapped))
    });
    let (c, host, mapped) = started.map_err(|e| HarnessError::start("container", e))?;
    Ok(Container {
        host,
        port: mapped,
        rt,
        inner: Some(c),
    })
}
