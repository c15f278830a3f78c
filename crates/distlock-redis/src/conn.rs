//! One multiplexed, self-reconnecting connection per client, whatever the
//! topology.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{
    MultipleNodeRoutingInfo, Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr,
};
use redis::sentinel::{SentinelClient, SentinelClientBuilder, SentinelServerType};
use redis::{
    Client, Cmd, FromRedisValue, IntoConnectionInfo, RedisError, RedisResult, ScriptInvocation,
};
use tokio::sync::Mutex;

use crate::config::Topology;

/// The connection all locks of one client share.
// One per backend, behind its `Arc`: the variants' sizes do not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Clone)]
pub(crate) enum Conn {
    Single(Arc<SingleConn>),
    Cluster {
        /// A client per seed node, for pub/sub: the first that answers,
        /// from the one that answered last.
        seeds: Arc<Vec<Client>>,
        answered: Arc<std::sync::atomic::AtomicUsize>,
        conn: ClusterConnection,
    },
    Sentinel(Arc<SentinelConn>),
}

/// A single server's connection, replaced by a new one after a request on
/// it times out. The connection manager reconnects only when the socket
/// reports an error, so a connection the network stopped serving without
/// closing it would time out every request for as long as TCP keeps it
/// open (a quarter of an hour on a real network).
pub(crate) struct SingleConn {
    client: Client,
    manager: std::sync::RwLock<ConnectionManager>,
    timeout: Duration,
    /// A new connection is being opened: the requests that time out
    /// together replace the old one once.
    replacing: std::sync::atomic::AtomicBool,
}

impl SingleConn {
    fn manager(&self) -> ConnectionManager {
        self.manager
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Runs `f` on the current connection; after a timeout, opens a new one
    /// in the background for the requests that follow.
    async fn on<T, Fut>(
        self: &Arc<Self>,
        f: impl FnOnce(ConnectionManager) -> Fut,
    ) -> RedisResult<T>
    where
        Fut: std::future::Future<Output = RedisResult<T>>,
    {
        let result = f(self.manager()).await;
        if result.as_ref().is_err_and(RedisError::is_timeout) {
            self.replace();
        }
        result
    }

    fn replace(self: &Arc<Self>) {
        use std::sync::atomic::Ordering;
        if self.replacing.swap(true, Ordering::AcqRel) {
            return;
        }
        let me = self.clone();
        tokio::spawn(async move {
            let config = manager_config(me.timeout);
            match ConnectionManager::new_with_config(me.client.clone(), config).await {
                Ok(m) => {
                    *me.manager
                        .write()
                        .unwrap_or_else(std::sync::PoisonError::into_inner) = m;
                    tracing::debug!("a request timed out; the connection was replaced");
                }
                Err(e) => {
                    tracing::debug!(error = %e, "a request timed out and no new connection opened; keeping the old one");
                }
            }
            me.replacing.store(false, Ordering::Release);
        });
    }
}

/// Follows the master of a Sentinel service: on a connection error or a
/// READONLY reply (the old master was demoted), and when a Sentinel
/// announces a new master (`+switch-master`), it asks the Sentinels for the
/// current master and reconnects.
pub(crate) struct SentinelConn {
    sentinel: Mutex<SentinelClient>,
    current: Mutex<Option<(Client, ConnectionManager)>>,
    timeout: Duration,
    /// The task listening for `+switch-master`, ended with the connection.
    switches: std::sync::Mutex<Option<tokio::task::JoinHandle<()>>>,
    /// Counts the times the connection left a master for another node:
    /// the pub/sub connection opened on that master is given up with it.
    left: tokio::sync::watch::Sender<u64>,
    /// The node the connection was last opened on.
    last: std::sync::Mutex<Option<redis::ConnectionAddr>>,
}

impl Drop for SentinelConn {
    fn drop(&mut self) {
        if let Some(task) = self
            .switches
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take()
        {
            task.abort();
        }
    }
}

/// How often the Sentinel followed for master switches is asked which
/// node is master: a Sentinel that stopped answering is left for the next
/// within about this long (its silence would hide the next switch), and a
/// switch announced while no Sentinel was listened to is caught.
const ASK_SENTINEL_EVERY: Duration = Duration::from_secs(1);

/// `request`, or a timeout error once `timeout` has passed.
async fn within<T>(
    timeout: Duration,
    request: impl std::future::Future<Output = RedisResult<T>>,
) -> RedisResult<T> {
    tokio::time::timeout(timeout, request)
        .await
        .unwrap_or_else(|_| {
            Err(RedisError::from(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("no answer within {timeout:?}"),
            )))
        })
}

/// Listens on the Sentinels, one after another while they fail, for
/// `+switch-master` of `service`, and asks the one listened to for the
/// master every [`ASK_SENTINEL_EVERY`]; drops `conn`'s connection when the
/// master is another node than the one it talks to: after a failover whose
/// old master still runs, that node goes on answering as master (for
/// seconds, until it is turned into a replica), and requests sent there
/// would grant and renew holds the new master does not have. A Sentinel
/// that does not answer within `timeout` is left for the next.
fn follow_switches(
    conn: &Arc<SentinelConn>,
    sentinels: Vec<String>,
    service: String,
    ca_file: Option<std::path::PathBuf>,
    timeout: Duration,
) {
    use futures_util::StreamExt;
    let weak = Arc::downgrade(conn);
    let task = tokio::spawn(async move {
        for url in sentinels.iter().cycle() {
            let listened = async {
                let client = single_client(url, ca_file.as_deref())?;
                let mut asking = within(timeout, client.get_multiplexed_async_connection()).await?;
                let mut pubsub = within(timeout, client.get_async_pubsub()).await?;
                within(timeout, pubsub.subscribe("+switch-master")).await?;
                let mut messages = pubsub.on_message();
                // Its first tick is at once: a switch announced before the
                // subscription is caught.
                let mut ask = tokio::time::interval(ASK_SENTINEL_EVERY);
                ask.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                loop {
                    let master = tokio::select! {
                        msg = messages.next() => {
                            let Some(msg) = msg else { return Ok::<(), RedisError>(()) };
                            // `<service> <old ip> <old port> <new ip> <new port>`
                            let payload: String = msg.get_payload()?;
                            let mut fields = payload.split(' ');
                            if fields.next() != Some(service.as_str()) {
                                continue;
                            }
                            let mut fields = fields.skip(2);
                            match (fields.next(), fields.next().and_then(|p| p.parse().ok())) {
                                (Some(host), Some(port)) => Some((host.to_string(), port)),
                                _ => None,
                            }
                        }
                        _ = ask.tick() => {
                            let mut get = redis::cmd("SENTINEL");
                            get.arg("GET-MASTER-ADDR-BY-NAME").arg(&service);
                            within(timeout, get.query_async::<Option<(String, u16)>>(&mut asking))
                                .await?
                        }
                    };
                    let Some(conn) = weak.upgrade() else {
                        return Ok(());
                    };
                    if let Some((host, port)) = master {
                        conn.follow(&host, port).await;
                    }
                }
            };
            if let Err(e) = listened.await {
                tracing::debug!(sentinel = %url, error = %e, "listening for master switches failed");
            }
            if weak.strong_count() == 0 {
                return;
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    });
    *conn
        .switches
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(task);
}

fn manager_config(timeout: Duration) -> ConnectionManagerConfig {
    // Few quick retries: a lock client would rather report "unavailable"
    // (and let the watchdog retry until the deadline) than block for long.
    ConnectionManagerConfig::new()
        .set_number_of_retries(1)
        .set_connection_timeout(Some(timeout))
        .set_response_timeout(Some(timeout))
}

/// The certificates of TLS connections: the CA in `ca_file` instead of the
/// system roots. `None` leaves the redis client on the system roots.
#[cfg(feature = "tls")]
fn tls_certificates(ca_file: Option<&Path>) -> RedisResult<Option<redis::TlsCertificates>> {
    let Some(path) = ca_file else {
        return Ok(None);
    };
    let root = std::fs::read(path).map_err(|e| {
        RedisError::from((
            redis::ErrorKind::InvalidClientConfig,
            "cannot read ca_file",
            format!("{}: {e}", path.display()),
        ))
    })?;
    if !distlock_core::input::holds_pem_certificate(&root) {
        return Err(RedisError::from((
            redis::ErrorKind::InvalidClientConfig,
            "ca_file holds no PEM certificate",
            path.display().to_string(),
        )));
    }
    Ok(Some(redis::TlsCertificates {
        client_tls: None,
        root_cert: Some(root),
    }))
}

/// A client for one server: `rediss://` URLs trust `ca_file`.
fn single_client(url: &str, ca_file: Option<&Path>) -> RedisResult<Client> {
    #[cfg(feature = "tls")]
    if url.starts_with("rediss:") {
        if let Some(certs) = tls_certificates(ca_file)? {
            return Client::build_with_tls(url, certs);
        }
    }
    #[cfg(not(feature = "tls"))]
    let _ = ca_file;
    Client::open(url)
}

/// The client following a Sentinel service's master. With `tls`, both the
/// Sentinels and the master are reached over TLS, trusting `ca_file`.
fn sentinel_client(
    sentinels: &[String],
    service: &str,
    db: i64,
    username: Option<&str>,
    password: Option<&str>,
    tls: bool,
    ca_file: Option<&Path>,
) -> RedisResult<SentinelClient> {
    let addrs = sentinels
        .iter()
        .map(|url| Ok(url.as_str().into_connection_info()?.addr().clone()))
        .collect::<RedisResult<Vec<_>>>()?;
    let mut builder = SentinelClientBuilder::new(addrs, service, SentinelServerType::Master)?
        .set_client_to_redis_db(db);
    if let Some(u) = username {
        builder = builder.set_client_to_redis_username(u);
    }
    if let Some(p) = password {
        builder = builder.set_client_to_redis_password(p);
    }
    if tls {
        builder = builder.set_client_to_redis_tls_mode(redis::TlsMode::Secure);
        #[cfg(feature = "tls")]
        if let Some(certs) = tls_certificates(ca_file)? {
            builder = builder
                .set_client_to_sentinel_certificates(certs.clone())
                .set_client_to_redis_certificates(certs);
        }
    }
    #[cfg(not(feature = "tls"))]
    let _ = ca_file;
    builder.build()
}

/// The description of the error for a service no Sentinel monitors.
pub(crate) const UNKNOWN_SERVICE: &str = "no Sentinel monitors the service";

/// The error of a Sentinel that requires a password: the URL's is the
/// master's, and Sentinels are asked without one.
pub(crate) const SENTINEL_AUTH: &str = "a Sentinel requires a password";

/// Whether the Sentinels that answer all say they monitor no service
/// `service` (`SENTINEL GET-MASTER-ADDR-BY-NAME` answers nil), as opposed to
/// naming a master that is down: the service name is wrong, and asking again
/// cannot help. `false` when no Sentinel answers. The Sentinels are asked
/// all at once, so unreachable ones cost one `timeout` in all.
async fn unknown_service(
    sentinels: &[String],
    service: &str,
    timeout: Duration,
    ca_file: Option<&Path>,
) -> bool {
    let asks = sentinels.iter().map(|url| {
        let ask = async move {
            let client = single_client(url, ca_file)?;
            let mut c = client.get_multiplexed_async_connection().await?;
            redis::cmd("SENTINEL")
                .arg("GET-MASTER-ADDR-BY-NAME")
                .arg(service)
                .query_async::<Option<(String, u16)>>(&mut c)
                .await
        };
        tokio::time::timeout(timeout, ask)
    });
    let answers = futures_util::future::join_all(asks).await;
    let mut answered = false;
    for answer in answers {
        match answer {
            Ok(Ok(None)) => answered = true,
            Ok(Ok(Some(_))) => return false,
            _ => {}
        }
    }
    answered
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
        self.opened_on(client.get_connection_info().addr());
        *cur = Some((client.clone(), manager.clone()));
        Ok((client, manager))
    }

    /// Records the node the connection is (re)opened on; another than
    /// before counts as leaving the master.
    fn opened_on(&self, addr: &redis::ConnectionAddr) {
        let before = self
            .last
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .replace(addr.clone());
        if before.is_some_and(|b| b != *addr) {
            self.left.send_modify(|n| *n += 1);
        }
    }

    /// Drops the connection after an error that may mean the master moved;
    /// the next request asks the Sentinels again.
    async fn forget(&self) {
        *self.current.lock().await = None;
    }

    /// When the connection talks to another node than `host:port`, the
    /// master one Sentinel names, asks the Sentinels as a new connection
    /// would (see [`Self::confirm_master`]) and follows them: one
    /// Sentinel's word alone (a stale one, or one ahead of the others in a
    /// failover) moves nothing.
    async fn follow(&self, host: &str, port: u16) {
        let elsewhere = self.current.lock().await.as_ref().is_some_and(|(client, _)| {
            !matches!(
                client.get_connection_info().addr(),
                redis::ConnectionAddr::Tcp(h, p) | redis::ConnectionAddr::TcpTls { host: h, port: p, .. }
                    if h == host && *p == port
            )
        });
        if elsewhere {
            match tokio::time::timeout(self.timeout, self.confirm_master()).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    tracing::debug!(error = %e, "could not ask the Sentinels for the master")
                }
                Err(_) => tracing::debug!("the Sentinels did not name the master in time"),
            }
        }
    }

    /// Asks the Sentinels which node is master now (they check its role),
    /// and drops the connection if it is another node than the one this
    /// connection talks to: after a failover whose old master still runs,
    /// that node goes on answering as master (for seconds, until it is
    /// turned into a replica) and would renew holds the new master lets
    /// lapse. The next request goes to the new master.
    async fn confirm_master(&self) -> RedisResult<()> {
        let named = self.sentinel.lock().await.async_get_client().await?;
        let mut cur = self.current.lock().await;
        let moved = cur.as_ref().is_some_and(|(client, _)| {
            client.get_connection_info().addr() != named.get_connection_info().addr()
        });
        if moved {
            tracing::info!(master = %named.get_connection_info().addr(), "the Sentinels name another master; reconnecting");
            *cur = None;
            self.opened_on(named.get_connection_info().addr());
        }
        Ok(())
    }

    /// Runs `f` on the master's connection; after a connection error or a
    /// READONLY reply (the master moved), once more on the master the
    /// Sentinels name then.
    async fn on_master<T, Fut>(&self, f: impl Fn(ConnectionManager) -> Fut) -> RedisResult<T>
    where
        Fut: std::future::Future<Output = RedisResult<T>>,
    {
        let (_, m) = self.current().await?;
        match f(m).await {
            Err(e) if master_moved(&e) => {
                self.forget().await;
                let (_, m) = self.current().await?;
                f(m).await
            }
            r => r,
        }
    }
}

impl Conn {
    pub(crate) async fn open(
        topology: &Topology,
        timeout: Duration,
        ca_file: Option<&Path>,
    ) -> RedisResult<Self> {
        match topology {
            Topology::Single(url) => {
                let client = single_client(url, ca_file)?;
                let manager =
                    ConnectionManager::new_with_config(client.clone(), manager_config(timeout))
                        .await?;
                Ok(Conn::Single(Arc::new(SingleConn {
                    client,
                    manager: std::sync::RwLock::new(manager),
                    timeout,
                    replacing: std::sync::atomic::AtomicBool::new(false),
                })))
            }
            Topology::Cluster(nodes) => {
                let seeds = nodes
                    .iter()
                    .map(|n| single_client(n, ca_file))
                    .collect::<RedisResult<Vec<_>>>()?;
                let builder = ClusterClient::builder(nodes.clone())
                    .connection_timeout(timeout)
                    .response_timeout(timeout);
                // The seeds' `rediss://` switches TLS on; the CA is set here.
                #[cfg(feature = "tls")]
                let builder = match tls_certificates(ca_file)? {
                    Some(certs) if nodes[0].starts_with("rediss:") => builder.certs(certs),
                    _ => builder,
                };
                let conn = builder.build()?.get_async_connection().await?;
                Ok(Conn::Cluster {
                    seeds: Arc::new(seeds),
                    answered: Arc::default(),
                    conn,
                })
            }
            Topology::Sentinel {
                sentinels,
                service,
                db,
                username,
                password,
                tls,
            } => {
                let sentinel = sentinel_client(
                    sentinels,
                    service,
                    *db,
                    username.as_deref(),
                    password.as_deref(),
                    *tls,
                    ca_file,
                )?;
                let conn = Arc::new(SentinelConn {
                    sentinel: Mutex::new(sentinel),
                    current: Mutex::new(None),
                    timeout,
                    switches: std::sync::Mutex::new(None),
                    left: tokio::sync::watch::Sender::new(0),
                    last: std::sync::Mutex::new(None),
                });
                follow_switches(
                    &conn,
                    sentinels.clone(),
                    service.clone(),
                    ca_file.map(Path::to_path_buf),
                    timeout,
                );
                match conn.current().await {
                    Err(e)
                        if e.kind() == redis::ErrorKind::MasterNameNotFoundBySentinel
                            && unknown_service(sentinels, service, timeout, ca_file).await =>
                    {
                        Err(RedisError::from((
                            redis::ErrorKind::MasterNameNotFoundBySentinel,
                            UNKNOWN_SERVICE,
                            service.clone(),
                        )))
                    }
                    // With the URL's password the master cannot answer
                    // NOAUTH: a Sentinel did.
                    Err(e) if e.code() == Some("NOAUTH") && password.is_some() => {
                        Err(RedisError::from((
                            redis::ErrorKind::AuthenticationFailed,
                            SENTINEL_AUTH,
                            e.to_string(),
                        )))
                    }
                    Err(e) => Err(e),
                    Ok(_) => Ok(Conn::Sentinel(conn)),
                }
            }
        }
    }

    /// Whether keys of different hash slots may live on different nodes.
    /// Before renewals: on Sentinel, that the connection still talks to
    /// the master the Sentinels name (see [`SentinelConn::confirm_master`]),
    /// asking for at most `within` (and the connection's timeout): the
    /// Sentinels are asked in turn, and one that hangs must not hold a
    /// renewal past its lease. Nothing for a single server or a Cluster.
    /// Failing to ask is not an error: the renewal goes where the
    /// connection is (a failover's `+switch-master` moves it too).
    pub(crate) async fn confirm_master(&self, within: Duration) {
        if let Conn::Sentinel(s) = self {
            let bound = s.timeout.min(within);
            let asked = Box::pin(tokio::time::timeout(bound, s.confirm_master())).await;
            if let Ok(Err(e)) = asked {
                tracing::debug!(error = %e, "could not ask the Sentinels for the master");
            }
        }
    }

    pub(crate) fn is_cluster(&self) -> bool {
        matches!(self, Conn::Cluster { .. })
    }

    /// Runs a script (EVALSHA; on NOSCRIPT, SCRIPT LOAD and EVALSHA again).
    pub(crate) async fn script<T: FromRedisValue>(
        &self,
        inv: &ScriptInvocation<'_>,
    ) -> RedisResult<T> {
        // Cluster and Sentinel arms are boxed: an async fn's future is as
        // big as its largest arm, and every lock operation carries it.
        match self {
            Conn::Single(s) => {
                s.on(|mut m| async move { inv.invoke_async(&mut m).await })
                    .await
            }
            Conn::Cluster { conn, .. } => Box::pin(inv.invoke_async(&mut conn.clone())).await,
            Conn::Sentinel(s) => {
                Box::pin(s.on_master(|mut m| async move { inv.invoke_async(&mut m).await })).await
            }
        }
    }

    /// Runs `first` (one command or script call in a pipeline) and then
    /// `WAIT want timeout_ms` in the same pipeline: both on one connection,
    /// so the `WAIT` counts the replicas that have `first`'s writes (on
    /// another connection it would count those that have that
    /// connection's writes, none, and answer at once). Never sent again
    /// on another connection. Not on a cluster (`wait_replicas` is refused
    /// there).
    pub(crate) async fn then_wait<T: FromRedisValue>(
        &self,
        mut first: redis::Pipeline,
        want: u32,
        timeout_ms: u64,
    ) -> RedisResult<(T, i64)> {
        first.cmd("WAIT").arg(want).arg(timeout_ms);
        let pipe = &first;
        match self {
            Conn::Single(s) => {
                s.on(|mut m| async move { pipe.query_async(&mut m).await })
                    .await
            }
            Conn::Cluster { conn, .. } => Box::pin(pipe.query_async(&mut conn.clone())).await,
            Conn::Sentinel(s) => {
                Box::pin(async {
                    let (_, mut m) = s.current().await?;
                    let answer = pipe.query_async(&mut m).await;
                    if answer.as_ref().is_err_and(master_moved) {
                        s.forget().await;
                    }
                    answer
                })
                .await
            }
        }
    }

    /// Runs one command (on the cluster node the first key maps to, if any).
    /// The Cluster and Sentinel arms are boxed, as in [`script`](Self::script):
    /// inline, the cluster client's future would make this one 3.4 KiB
    /// instead of 72 bytes, and every Redlock vote around it as much larger.
    pub(crate) async fn cmd<T: FromRedisValue>(&self, cmd: &Cmd) -> RedisResult<T> {
        match self {
            Conn::Single(s) => {
                s.on(|mut m| async move { cmd.query_async(&mut m).await })
                    .await
            }
            Conn::Cluster { conn, .. } => Box::pin(cmd.query_async(&mut conn.clone())).await,
            Conn::Sentinel(s) => {
                Box::pin(s.on_master(|mut m| async move { cmd.query_async(&mut m).await })).await
            }
        }
    }

    /// `cmd`'s answer from every node of a cluster, replicas too (a
    /// failover puts one in charge of its master's locks), each by its
    /// address; elsewhere the server's one answer, by an empty address.
    pub(crate) async fn on_every_node(
        &self,
        cmd: &Cmd,
    ) -> RedisResult<Vec<(String, redis::Value)>> {
        let Conn::Cluster { conn, .. } = self else {
            return Ok(vec![(String::new(), self.cmd(cmd).await?)]);
        };
        let every = RoutingInfo::MultiNode((MultipleNodeRoutingInfo::AllNodes, None));
        let answer = Box::pin(conn.clone().route_command(cmd.clone(), every)).await?;
        match answer {
            redis::Value::Map(nodes) => nodes
                .into_iter()
                .map(|(node, v)| Ok((redis::from_redis_value(node)?, v)))
                .collect(),
            one => Ok(vec![(String::new(), one)]),
        }
    }

    /// Every key matching `pattern`: `SCAN` with `MATCH` and `COUNT`, to
    /// the end of the keyspace, on the server, or on every master of a
    /// cluster (each holds its own slots' keys). A key may come twice, as
    /// `SCAN` promises only that every key present throughout is returned.
    pub(crate) async fn scan(&self, pattern: &str, count: usize) -> RedisResult<Vec<String>> {
        let Conn::Cluster { conn, .. } = self else {
            return scan_node(pattern, count, |c| {
                let c = c.clone();
                async move { self.cmd(&c).await }
            })
            .await;
        };
        let masters = cluster_masters(&mut conn.clone()).await?;
        let mut keys = Vec::new();
        for master in masters {
            // By address: a SCAN carries no key, so one routed by slot to
            // a master the client holds no connection to (it just died)
            // would go to another node, which would list its own keys and
            // no redirection would tell. A master that names no address
            // of its own (a cluster of one node says "") goes by its slot.
            let route = RoutingInfo::SingleNode(match master {
                Master::At(host, port) => SingleNodeRoutingInfo::ByAddress { host, port },
                Master::OfSlot(slot) => {
                    SingleNodeRoutingInfo::SpecificNode(Route::new(slot, SlotAddr::Master))
                }
            });
            let found = scan_node(pattern, count, |c| {
                let (mut conn, c, route) = (conn.clone(), c.clone(), route.clone());
                async move {
                    Ok(redis::from_redis_value(
                        conn.route_command(c, route).await?,
                    )?)
                }
            })
            .await?;
            keys.extend(found);
        }
        Ok(keys)
    }

    /// A dedicated pub/sub connection, opened within `timeout`. Classic
    /// pub/sub messages reach every node of a cluster, so any node will
    /// do: the first seed that answers. With it, on Sentinel, what ends
    /// once the connection leaves the master it was opened on (see
    /// `SentinelConn::left`).
    pub(crate) async fn pubsub(
        &self,
        timeout: Duration,
    ) -> RedisResult<(
        redis::aio::PubSub,
        Option<tokio::sync::watch::Receiver<u64>>,
    )> {
        match self {
            Conn::Single(s) => Ok((within(timeout, s.client.get_async_pubsub()).await?, None)),
            Conn::Cluster {
                seeds, answered, ..
            } => {
                use std::sync::atomic::Ordering;
                let mut failed = None;
                let from = answered.load(Ordering::Relaxed);
                for i in (0..seeds.len()).map(|k| (from + k) % seeds.len()) {
                    match within(timeout, seeds[i].get_async_pubsub()).await {
                        Ok(p) => {
                            answered.store(i, Ordering::Relaxed);
                            return Ok((p, None));
                        }
                        Err(e) => failed = Some(e),
                    }
                }
                Err(failed.unwrap_or_else(|| RedisError::from((redis::ErrorKind::Io, "no seed"))))
            }
            Conn::Sentinel(s) => {
                // Subscribed first: a switch while opening is not missed.
                let mut left = s.left.subscribe();
                left.mark_unchanged();
                let (client, _) = within(timeout, s.current()).await?;
                Ok((
                    within(timeout, client.get_async_pubsub()).await?,
                    Some(left),
                ))
            }
        }
    }
}

/// One server's keys matching `pattern`, `SCAN` call after call (each sent
/// with `send`) until the cursor comes back to 0.
async fn scan_node<F, Fut>(pattern: &str, count: usize, send: F) -> RedisResult<Vec<String>>
where
    F: Fn(&Cmd) -> Fut,
    Fut: std::future::Future<Output = RedisResult<(String, Vec<String>)>>,
{
    let mut keys = Vec::new();
    let mut cursor = "0".to_string();
    loop {
        let mut scan = redis::cmd("SCAN");
        scan.arg(&cursor)
            .arg("MATCH")
            .arg(pattern)
            .arg("COUNT")
            .arg(count);
        let (next, found) = send(&scan).await?;
        keys.extend(found);
        if next == "0" {
            return Ok(keys);
        }
        cursor = next;
    }
}

/// A master of a cluster: its address, or one of its slots when `CLUSTER
/// SLOTS` names no address for it.
enum Master {
    At(String, u16),
    OfSlot(u16),
}

/// Each master of a cluster, from `CLUSTER SLOTS`: each entry is
/// `[first slot, last slot, [master host, port, id], replicas...]`.
async fn cluster_masters(conn: &mut ClusterConnection) -> RedisResult<Vec<Master>> {
    let answer = conn
        .route_command(
            redis::cmd("CLUSTER").arg("SLOTS").clone(),
            RoutingInfo::SingleNode(SingleNodeRoutingInfo::Random),
        )
        .await?;
    let ranges: Vec<Vec<redis::Value>> = redis::from_redis_value(answer)?;
    let mut seen = Vec::new();
    let mut masters = Vec::new();
    for range in ranges {
        let (Some(first), Some(master)) = (range.first(), range.get(2)) else {
            continue;
        };
        let first: u16 = redis::from_redis_value(first.clone())?;
        let master: Vec<redis::Value> = redis::from_redis_value(master.clone())?;
        let (host, port): (Option<String>, u16) = match master.as_slice() {
            [host, port, ..] => (
                redis::from_redis_value(host.clone())?,
                redis::from_redis_value(port.clone())?,
            ),
            _ => continue,
        };
        let at = (host.clone().unwrap_or_default(), port);
        if seen.contains(&at) {
            continue;
        }
        seen.push(at);
        // The redis client names such a master after the node that
        // answered, which this request, sent to any node, cannot know.
        masters.push(match host {
            Some(h) if !matches!(h.as_str(), "" | "?" | "0.0.0.0" | "::") => Master::At(h, port),
            _ => Master::OfSlot(first),
        });
    }
    Ok(masters)
}

#[cfg(all(test, feature = "tls"))]
mod tests {
    use super::*;

    #[test]
    fn a_ca_file_without_a_certificate_is_a_configuration_error() {
        let path = std::env::temp_dir().join(format!("distlock-not-a-ca-{}", std::process::id()));
        std::fs::write(&path, "root:x:0:0:root:/root:/bin/bash\n").unwrap();
        let r = tls_certificates(Some(&path));
        let _ = std::fs::remove_file(&path);
        match r {
            Err(e) => assert_eq!(e.kind(), redis::ErrorKind::InvalidClientConfig, "{e}"),
            Ok(_) => panic!("a file without a certificate was taken for a CA"),
        }
    }
}
