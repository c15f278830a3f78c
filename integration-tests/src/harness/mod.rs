//! Starts the real servers the suite runs against.
//!
//! For each [`ServerKind`], in this order:
//! 1. if `DISTLOCK_TEST_<KIND>_URL` is set, that server is used as is;
//! 2. with `DISTLOCK_TEST_PROVIDER=containers` (feature `containers`), a
//!    Docker container is started;
//! 3. otherwise the server runs as a local process on a free loopback port,
//!    in a private temp dir that is removed when the [`TestServer`] drops.
//!
//! A server that cannot be found or started is an error that says how to
//! install it; nothing is skipped unless `DISTLOCK_TEST_SKIP` names it.

use std::fmt;

#[cfg(feature = "containers")]
pub mod containers;
pub mod etcd;
pub mod mariadb;
pub mod postgres;
pub mod process;
pub mod proxy;
pub mod redis;
pub mod tls;
pub mod zookeeper;

pub use process::ServerProcess;

/// Why a server could not be provided.
#[derive(Debug)]
#[non_exhaustive]
pub enum HarnessError {
    /// A server binary is not installed.
    Missing {
        /// The binary looked for.
        binary: String,
        /// How to install it.
        install: &'static str,
    },
    /// The server was found but did not start.
    Start {
        /// Which server.
        what: &'static str,
        /// What happened, with its log.
        message: String,
    },
    /// The containers provider was asked for but Docker is not reachable.
    DockerUnavailable {
        /// The Docker endpoint tried.
        host: String,
        /// What went wrong.
        reason: String,
    },
    /// The test configuration (environment variables) is wrong.
    Config(String),
}

impl HarnessError {
    pub(crate) fn start(what: &'static str, message: impl Into<String>) -> Self {
        HarnessError::Start {
            what,
            message: message.into(),
        }
    }
}

impl fmt::Display for HarnessError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HarnessError::Missing { binary, install } => {
                write!(f, "`{binary}` not found; install it: {install}")
            }
            HarnessError::Start { what, message } => write!(f, "{what} did not start: {message}"),
            HarnessError::DockerUnavailable { host, reason } => write!(
                f,
                "no Docker daemon reachable at {host} ({reason}); the containers provider needs Docker. Unset DISTLOCK_TEST_PROVIDER to run the servers as local processes"
            ),
            HarnessError::Config(m) => write!(f, "test configuration: {m}"),
        }
    }
}

impl std::error::Error for HarnessError {}

/// The server kinds the suite knows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ServerKind {
    /// redis-server.
    Redis,
    /// etcd (v3 API).
    Etcd,
    /// Apache ZooKeeper.
    ZooKeeper,
    /// PostgreSQL.
    Postgres,
    /// MariaDB (the MySQL backend's server).
    MariaDb,
}

impl ServerKind {
    /// The environment variable naming an existing server of this kind.
    pub fn env_var(self) -> &'static str {
        match self {
            ServerKind::Redis => "DISTLOCK_TEST_REDIS_URL",
            ServerKind::Etcd => "DISTLOCK_TEST_ETCD_URL",
            ServerKind::ZooKeeper => "DISTLOCK_TEST_ZOOKEEPER_URL",
            ServerKind::Postgres => "DISTLOCK_TEST_POSTGRES_URL",
            ServerKind::MariaDb => "DISTLOCK_TEST_MYSQL_URL",
        }
    }

    /// The URL distlock uses for a server of this kind at `host:port`.
    pub fn url(self, host: &str, port: u16) -> String {
        match self {
            ServerKind::Redis => format!("redis://{host}:{port}"),
            ServerKind::Etcd => format!("etcd://{host}:{port}"),
            ServerKind::ZooKeeper => format!("zk://{host}:{port}"),
            ServerKind::Postgres => format!("postgres://postgres@{host}:{port}/postgres"),
            ServerKind::MariaDb => format!("mysql://root@{host}:{port}/{}", mariadb::DATABASE),
        }
    }

    fn spawn(self) -> Result<ServerProcess, HarnessError> {
        match self {
            ServerKind::Redis => redis::spawn(&[]),
            ServerKind::Etcd => etcd::spawn(),
            ServerKind::ZooKeeper => zookeeper::spawn(),
            ServerKind::Postgres => postgres::spawn(),
            ServerKind::MariaDb => mariadb::spawn(),
        }
    }
}

/// A server for the tests; stopped and cleaned up on drop if the harness
/// started it.
#[derive(Debug)]
pub struct TestServer {
    kind: ServerKind,
    host: String,
    port: u16,
    url: String,
    running: Running,
}

#[derive(Debug)]
enum Running {
    External,
    Process(ServerProcess),
    #[cfg(feature = "containers")]
    // Held for its Drop, which removes the container.
    Container(#[allow(dead_code)] Box<containers::Container>),
}

impl TestServer {
    /// Provides a server of `kind` (see the module docs for the order).
    pub fn start(kind: ServerKind) -> Result<Self, HarnessError> {
        if let Ok(url) = std::env::var(kind.env_var()) {
            let (host, port) = host_port(&url).ok_or_else(|| {
                HarnessError::Config(format!("{}={url:?} has no host:port", kind.env_var()))
            })?;
            return Ok(TestServer {
                kind,
                host,
                port,
                url,
                running: Running::External,
            });
        }
        match std::env::var("DISTLOCK_TEST_PROVIDER").as_deref() {
            Err(_) | Ok("process") | Ok("") => {
                let p = kind.spawn()?;
                let port = p.port;
                Ok(TestServer { kind, host: "127.0.0.1".into(), port, url: kind.url("127.0.0.1", port), running: Running::Process(p) })
            }
            #[cfg(feature = "containers")]
            Ok("containers") => {
                let c = containers::start(kind, None)?;
                let (host, port) = (c.host.clone(), c.port);
                Ok(TestServer { kind, url: kind.url(&host, port), host, port, running: Running::Container(Box::new(c)) })
            }
            #[cfg(not(feature = "containers"))]
            Ok("containers") => Err(HarnessError::Config(
                "DISTLOCK_TEST_PROVIDER=containers needs the `containers` feature: cargo test -p integration-tests --features containers".into(),
            )),
            Ok(other) => Err(HarnessError::Config(format!(
                "DISTLOCK_TEST_PROVIDER={other:?}; use `process` (default) or `containers`"
            ))),
        }
    }

    /// Which kind of server.
    pub fn kind(&self) -> ServerKind {
        self.kind
    }
    /// The distlock URL for this server.
    pub fn url(&self) -> &str {
        &self.url
    }
    /// Its host.
    pub fn host(&self) -> &str {
        &self.host
    }
    /// Its client port.
    pub fn port(&self) -> u16 {
        self.port
    }
    /// The local process, mutably (restart tests).
    pub fn process_mut(&mut self) -> Option<&mut ServerProcess> {
        match &mut self.running {
            Running::Process(p) => Some(p),
            _ => None,
        }
    }

    /// Starts a server of `kind` as a local process even when an external one
    /// is configured: for tests that stop or restart their server and must
    /// not disturb the others.
    pub fn start_private(kind: ServerKind) -> Result<Self, HarnessError> {
        let p = kind.spawn()?;
        let port = p.port;
        Ok(TestServer {
            kind,
            host: "127.0.0.1".into(),
            port,
            url: kind.url("127.0.0.1", port),
            running: Running::Process(p),
        })
    }

    /// The local process, when the harness started one (fault tests pause or
    /// kill it).
    pub fn process(&self) -> Option<&ServerProcess> {
        match &self.running {
            Running::Process(p) => Some(p),
            _ => None,
        }
    }
}

/// The first `host:port` in a URL such as `scheme://user@host:port,host:port/path`.
pub fn host_port(url: &str) -> Option<(String, u16)> {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let authority = rest.split(['/', '?']).next()?;
    let first = authority.rsplit('@').next()?.split(',').next()?;
    let (host, port) = first.rsplit_once(':')?;
    Some((host.to_string(), port.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_port_parses_urls() {
        assert_eq!(
            host_port("redis://127.0.0.1:6379"),
            Some(("127.0.0.1".into(), 6379))
        );
        assert_eq!(
            host_port("postgres://u:p@db:5432/x"),
            Some(("db".into(), 5432))
        );
        assert_eq!(host_port("etcd://a:1,b:2"), Some(("a".into(), 1)));
        assert_eq!(host_port("zk://h:2181/chroot"), Some(("h".into(), 2181)));
        assert_eq!(host_port("redis://nohost"), None);
    }
}
