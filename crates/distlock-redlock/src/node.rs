//! One Redlock node: a lazily (re)connected Redis backend, its last known
//! run id, and its delayed-restart quarantine.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use distlock_core::{Error, Result};
use distlock_redis::{RedisBackend, RedisConfig};
use tokio::time::Instant;

pub(crate) struct Node {
    pub(crate) endpoint: String,
    url: String,
    /// Set once, at the first successful connection (the connection then
    /// reconnects by itself); reading it is one atomic load.
    redis: tokio::sync::OnceCell<RedisBackend>,
    run_id: Mutex<Option<String>>,
    /// The node refused the configuration at the last connection attempt
    /// that ended: its message. A refusal comes after the redis client's
    /// retry, often later than a round's node timeout, so a round that times
    /// out on the node counts it refused rather than down.
    refused: Mutex<Option<String>>,
    quarantined_until: Mutex<Option<Instant>>,
    /// The node answered as another node's server at its last connection:
    /// that node, and when this one may be connected to again. Until then
    /// requests are refused without connecting.
    duplicate: Mutex<Option<(String, Instant)>>,
    /// Delayed-restart protection's quarantine, when it is on: the run id
    /// and uptime are fetched whenever a connection is made, whatever
    /// request makes it.
    delayed_restart: Option<Duration>,
    /// The node's Redis options: the key prefix, and with `fifo` the queue
    /// and the client id every node of one Redlock client shares.
    config: RedisConfig,
    /// The run ids of the client's connected nodes, each with its node: a
    /// server reached under two addresses (a proxy, a second interface)
    /// answers both with one run id.
    servers: Servers,
}

/// How long a node found to be another node's server is refused without
/// connecting to it again (the address may be re-pointed meanwhile).
const DUPLICATE_RECHECK: Duration = Duration::from_secs(10);

/// Run id to node, shared by one client's nodes.
pub(crate) type Servers = Arc<Mutex<HashMap<String, String>>>;

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Node {
    pub(crate) fn new(
        url: String,
        config: RedisConfig,
        delayed_restart: Option<Duration>,
        servers: Servers,
    ) -> Self {
        let endpoint = url
            .rsplit('@')
            .next()
            .unwrap_or(&url)
            .trim_start_matches("redis://")
            .to_string();
        Self {
            endpoint,
            url,
            redis: tokio::sync::OnceCell::new(),
            run_id: Mutex::new(None),
            refused: Mutex::new(None),
            quarantined_until: Mutex::new(None),
            duplicate: Mutex::new(None),
            delayed_restart,
            config,
            servers,
        }
    }

    /// The node's connection, connecting if needed (a node that was down at
    /// start-up joins once it answers). With delayed-restart protection the
    /// run id is fetched at first contact, by whichever request makes it: a
    /// renewal or a release may reach a node before any acquire does.
    /// Connecting is boxed: its future is a few KiB, and every request to a
    /// node would carry it.
    pub(crate) async fn redis(&self) -> Result<&RedisBackend> {
        match self.redis.get() {
            Some(r) => Ok(r),
            None => {
                self.not_known_as_another()?;
                Box::pin(self.connect()).await
            }
        }
    }

    /// Refuses the node while it is known to be another node's server.
    fn not_known_as_another(&self) -> Result<()> {
        match &*lock(&self.duplicate) {
            Some((other, until)) if Instant::now() < *until => {
                Err(crate::config::duplicate(&self.endpoint, other, "run id"))
            }
            _ => Ok(()),
        }
    }

    async fn connect(&self) -> Result<&RedisBackend> {
        self.redis
            .get_or_try_init(|| async {
                // Requests that waited for another's attempt to connect.
                self.not_known_as_another()?;
                let r = RedisBackend::connect_with(&self.url, self.config.clone()).await;
                *lock(&self.refused) = match &r {
                    Err(Error::Misconfigured { message, .. }) => Some(message.clone()),
                    _ => None,
                };
                let r = r?;
                // A server that does not say its run id (a proxy that
                // refuses INFO) is taken as distinct unless restarts are
                // tracked, which need the id.
                let (id, uptime) = match r.server_run().await {
                    Ok(run) => run,
                    Err(e) if self.delayed_restart.is_some() => return Err(e),
                    Err(e) => {
                        tracing::debug!(node = %self.endpoint, error = %e, "no run id; not compared with the other nodes'");
                        return Ok(r);
                    }
                };
                if let Some(other) = self.same_server_as(&id) {
                    let e = crate::config::duplicate(&self.endpoint, &other, "run id");
                    // At connect the error reaches the caller; later the
                    // node counts as down.
                    tracing::debug!(node = %self.endpoint, error = %e, "not used; asked again in {DUPLICATE_RECHECK:?}");
                    *lock(&self.duplicate) = Some((other, Instant::now() + DUPLICATE_RECHECK));
                    return Err(e);
                }
                *lock(&self.duplicate) = None;
                if let Some(quarantine) = self.delayed_restart {
                    self.quarantine_if_young(uptime, quarantine);
                }
                lock(&self.run_id).get_or_insert(id);
                Ok(r)
            })
            .await
    }

    /// The other node of the client whose server `run_id` already is, if
    /// any (a majority that counts one server twice rests on fewer servers
    /// than it claims); else this node is recorded as that server.
    fn same_server_as(&self, run_id: &str) -> Option<String> {
        let mut servers = lock(&self.servers);
        match servers.get(run_id) {
            Some(other) if *other != self.endpoint => Some(other.clone()),
            _ => {
                servers.insert(run_id.to_string(), self.endpoint.clone());
                None
            }
        }
    }

    /// The refusal of the configuration at the node's last connection
    /// attempt that ended, while it has no connection.
    pub(crate) fn refusal(&self) -> Option<Error> {
        if self.redis.initialized() {
            return None;
        }
        let message = lock(&self.refused).clone()?;
        Some(Error::misconfigured("redis", message, None))
    }

    /// The node's connection if it has one, without connecting.
    pub(crate) fn connected(&self) -> Option<&RedisBackend> {
        self.redis.get()
    }

    pub(crate) fn quarantined(&self) -> bool {
        lock(&self.quarantined_until).is_some_and(|until| Instant::now() < until)
    }

    /// A server up for less than `quarantine` started within it, with
    /// whatever locks it held before forgotten, whether or not this client
    /// saw it before: it is not used for acquiring until it has been up
    /// that long. `false` when it is quarantined so.
    fn quarantine_if_young(&self, uptime: Duration, quarantine: Duration) -> bool {
        // Whole seconds rounded down: the server is up at least `uptime`.
        let Some(left) = quarantine.checked_sub(uptime).filter(|l| !l.is_zero()) else {
            return true;
        };
        let until = Instant::now() + left;
        let mut q = lock(&self.quarantined_until);
        if q.is_none_or(|u| u < until) {
            tracing::warn!(node = %self.endpoint, ?uptime, "redlock node up for less than delayed_restart_ms; not used for acquiring for {left:?}");
            *q = Some(until);
        }
        false
    }

    /// Records the run id and uptime seen now. A different run id than
    /// before means the node restarted (and, without persistence, forgot
    /// its locks), and so does an uptime shorter than `quarantine` when the
    /// client first meets the node: it is not used for acquiring until
    /// `quarantine` has passed since the restart, antirez's "delayed
    /// restart" rule enforced on the client side.
    pub(crate) fn observe_run_id(
        &self,
        seen: String,
        uptime: Duration,
        quarantine: Duration,
    ) -> bool {
        let mut known = lock(&self.run_id);
        match known.as_deref() {
            Some(k) if k != seen => {
                tracing::warn!(node = %self.endpoint, "redlock node restarted (run id changed); not used for acquiring for {quarantine:?}");
                *lock(&self.quarantined_until) = Some(Instant::now() + quarantine);
                // The server is known by its new run id from now on.
                let mut servers = lock(&self.servers);
                servers.retain(|_, node| *node != self.endpoint);
                servers
                    .entry(seen.clone())
                    .or_insert_with(|| self.endpoint.clone());
                *known = Some(seen);
                false
            }
            _ => {
                *known = Some(seen);
                drop(known);
                self.quarantine_if_young(uptime, quarantine)
            }
        }
    }
}
