//! One multiplexed, self-reconnecting connection per client, whatever the
//! topology.

use std::sync::Arc;
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::sentinel::{SentinelClient, SentinelNodeConnectionInfo, SentinelServerType};
use redis::{Client, Cmd, FromRedisValue, RedisError, RedisResult, ScriptInvocation};
use tokio::sync::Mutex;

use crate::config::Topology;

/// The connection all locks of one client share.
#[derive(Clone)]
pub(crate) enum Conn {
    Single {
        client: Client,
        manager: ConnectionManager,
    },
    Cluster {
        seed: Client,
        conn: ClusterConnection,
    },
    Sentinel(Arc<SentinelConn>),
}

/// Follows the master of a Sentinel service: on a connection error or a
/// READONLY reply (the old master was demoted) it asks the Sentinels for the
/// current master and reconnects.
pub(crate) struct SentinelConn {
    sentinel: Mutex<SentinelClient>,
    current: Mutex<Option<(Client, ConnectionManager)>>,
    timeout: Duration,
}

fn manager_config(timeout: Duration) -> ConnectionManagerConfig {
    // Few quick retries: a lock client would rather report "unavailable"
    // (and let the watchdog retry until the deadline) than block for long.
    ConnectionManagerConfig::new()
        .set_number_of_retries(1)
        .set_connection_timeout(Some(timeout))
        .set_response_timeout(Some(timeout))
}

#[cfg(feature = "tls")]
fn single_client(url: &str, ca_file: Option<&std::path::Path>) -> RedisResult<Client> {
    match ca_file {
        Some(path) if url.starts_with("rediss:") => {
            let root = std::fs::read(path).map_err(|e| {
                RedisError::from((
                    redis::ErrorKind::InvalidClientConfig,
                    "cannot read ca_file",
                    format!("{}: {e}", path.display()),
                ))
            })?;
            Client::build_with_tls(
                url,
                redis::TlsCertificates {
                    client_tls: None,
                    root_cert: Some(root),
                },
            )
        }
        _ => Client::open(url),
    }
}

#[cfg(not(feature = "tls"))]
fn single_client(url: &str, _ca_file: Option<&std::path::Path>) -> RedisResult<Client> {
    Client::open(url)
}

/// Errors after which the master may have moved.
fn master_moved(e: &RedisError) -> bool {
    e.is_io_error()
        || e.is_connection_refusal()
        || e.is_connection_dropped()
        || e.is_timeout()
        || matches!(
            e.kind(),
            redis::ErrorKind::Server(redis::ServerErrorKind::ReadOnly)
        )
        || e.to_string().contains("READONLY")
}

impl SentinelConn {
    async fn current(&self) -> RedisResult<(Client, ConnectionManager)> {
        let mut cur = self.current.lock().await;
        if let Some(c) = cur.as_ref() {
            return Ok(c.clone());
        }
        let client = self.sentinel.lock().await.async_get_client().await?;
        let manager =
            ConnectionManager::new_with_config(client.clone(), manager_config(self.timeout))
                .await?;
        *cur = Some((client.clone(), manager.clone()));
        Ok((client, manager))
    }

    async fn forget(&self) {
        *self.current.lock().await = None;
    }
}

impl Conn {
    pub(crate) async fn open(
        topology: &Topology,
        timeout: Duration,
        ca_file: Option<&std::path::Path>,
    ) -> RedisResult<Self> {
        match topology {
            Topology::Single(url) => {
                let client = single_client(url, ca_file)?;
                let manager =
                    ConnectionManager::new_with_config(client.clone(), manager_config(timeout))
                        .await?;
                Ok(Conn::Single { client, manager })
            }
            Topology::Cluster(nodes) => {
                let seed = Client::open(nodes[0].as_str())?;
                let conn = ClusterClient::builder(nodes.clone())
                    .connection_timeout(timeout)
                    .response_timeout(timeout)
                    .build()?
                    .get_async_connection()
                    .await?;
                Ok(Conn::Cluster { seed, conn })
            }
            Topology::Sentinel {
                sentinels,
                service,
                db,
                username,
                password,
            } => {
                let mut info = redis::RedisConnectionInfo::default().set_db(*db);
                if let Some(u) = username {
                    info = info.set_username(u);
                }
                if let Some(p) = password {
                    info = info.set_password(p);
                }
                let node = SentinelNodeConnectionInfo::default().set_redis_connection_info(info);
                // `build` takes a String without the redis crate's TLS
                // feature and `impl AsRef<str>` with it.
                #[allow(clippy::unnecessary_to_owned)]
                let sentinel = SentinelClient::build(
                    sentinels.clone(),
                    service.to_string(),
                    Some(node),
                    SentinelServerType::Master,
                )?;
                let conn = Arc::new(SentinelConn {
                    sentinel: Mutex::new(sentinel),
                    current: Mutex::new(None),
                    timeout,
                });
                conn.current().await?;
                Ok(Conn::Sentinel(conn))
            }
        }
    }

    /// Whether keys of different hash slots may live on different nodes.
    pub(crate) fn is_cluster(&self) -> bool {
        matches!(self, Conn::Cluster { .. })
    }

    /// Runs a script (EVALSHA, with EVAL on NOSCRIPT).
    pub(crate) async fn script<T: FromRedisValue>(
        &self,
        inv: &ScriptInvocation<'_>,
    ) -> RedisResult<T> {
        // Cluster and Sentinel arms are boxed: an async fn's future is as
        // big as its largest arm, and every lock operation carries it.
        match self {
            Conn::Single { manager, .. } => inv.invoke_async(&mut manager.clone()).await,
            Conn::Cluster { conn, .. } => Box::pin(inv.invoke_async(&mut conn.clone())).await,
            Conn::Sentinel(s) => {
                Box::pin(async {
                    let (_, mut m) = s.current().await?;
                    match inv.invoke_async(&mut m).await {
                        Err(e) if master_moved(&e) => {
                            s.forget().await;
                            let (_, mut m) = s.current().await?;
                            inv.invoke_async(&mut m).await
                        }
                        r => r,
                    }
                })
                .await
            }
        }
    }

    /// Runs one command (on the cluster node the first key maps to, if any).
    pub(crate) async fn cmd<T: FromRedisValue>(&self, cmd: &Cmd) -> RedisResult<T> {
        match self {
            Conn::Single { manager, .. } => cmd.query_async(&mut manager.clone()).await,
            Conn::Cluster { conn, .. } => cmd.query_async(&mut conn.clone()).await,
            Conn::Sentinel(s) => {
                let (_, mut m) = s.current().await?;
                match cmd.query_async(&mut m).await {
                    Err(e) if master_moved(&e) => {
                        s.forget().await;
                        let (_, mut m) = s.current().await?;
                        cmd.query_async(&mut m).await
                    }
                    r => r,
                }
            }
        }
    }

    /// A client for a dedicated pub/sub connection. Classic pub/sub messages
    /// reach every node of a cluster, so any node will do.
    pub(crate) async fn pubsub_client(&self) -> RedisResult<Client> {
        match self {
            Conn::Single { client, .. } => Ok(client.clone()),
            Conn::Cluster { seed, .. } => Ok(seed.clone()),
            Conn::Sentinel(s) => Ok(s.current().await?.0),
        }
    }
}
