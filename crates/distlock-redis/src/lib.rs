#![doc = include_str!("../README.md")]
#![recursion_limit = "256"]

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use distlock_core::wait::{
    queue_entry_life, wait_for_grant, Outcome, Pace, Signalled, Wakeup, Wakeups,
};
use distlock_core::{
    async_trait, AllAtOnce, Backend, Capabilities, Consistency, Error, Fencing, FencingToken,
    Finding, Grant, HoldKind, HoldRecord, Leader, LockName, LockRequest, LockStatus, Result,
    TrustedClock, Waiting,
};
use redis::RedisError;
use tokio::time::Instant;

mod config;
mod conn;
mod election;
mod list;
mod queue;
mod rwlock;
pub mod scripts;
mod semaphore;
mod subscriber;

pub use config::RedisConfig;
pub use election::ElectionEntry;
pub use list::{ListedHold, LIST_BATCH};
pub use rwlock::{Attempt, Attempted, LockHolders, QueuePlace};
pub use scripts::{ElectionKeys, Keys, Scripts, SemaphoreKeys, SHARED_HOLDS};

use queue::QueueUse;
use rwlock::Removal;

use conn::Conn;

/// Renewals per `extend_many.lua` call: big enough that 10,000 held locks
/// renew in about 20 requests, small enough that one call keeps the server
/// busy for well under a millisecond.
const EXTEND_BATCH: usize = 512;
use subscriber::{Subscriber, Wake};

/// A lock on one Redis deployment: a single server, a Sentinel-managed
/// master, or a Redis Cluster.
///
/// Cheap to clone; clones share one multiplexed, self-reconnecting
/// connection and one pub/sub connection for waiters.
#[derive(Clone)]
pub struct RedisBackend {
    inner: Arc<Inner>,
}

struct Inner {
    /// Names this client's queue entries and its queued waiters' channel.
    id: String,
    conn: Conn,
    config: RedisConfig,
    endpoint: String,
    subscriber: Arc<Subscriber>,
}

impl fmt::Debug for RedisBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisBackend")
            .field("endpoint", &self.inner.endpoint)
            .field("prefix", &self.inner.config.prefix)
            .field("wait_replicas", &self.inner.config.wait_replicas)
            .finish()
    }
}

impl RedisBackend {
    /// Connects to `redis://[user:pass@]host:port[/db]`,
    /// `redis+sentinel://[user:pass@]host:port[,host:port...]/SERVICE[/db]` or
    /// `redis+cluster://host:port[,host:port...]`, or over TLS (feature `tls`)
    /// to `rediss://...`, `rediss+sentinel://...` or `rediss+cluster://...`,
    /// with the options of [`RedisConfig`] as query parameters.
    pub async fn connect(url: &str) -> Result<Self> {
        Self::connect_with(url, RedisConfig::default()).await
    }

    /// [`connect`](Self::connect) with options; URL parameters override them.
    pub async fn connect_with(url: &str, mut config: RedisConfig) -> Result<Self> {
        let parsed = config::parse(url, &mut config)?;
        let endpoint = parsed.endpoint;
        let conn =
            match Conn::open(&parsed.topology, config.timeout, config.ca_file.as_deref()).await {
                Ok(conn) => conn,
                Err(e) => {
                    return Err(connect_error(&parsed.topology, &endpoint, config.timeout, e).await)
                }
            };
        let subscriber = Subscriber::new(config.timeout);
        Ok(Self {
            inner: Arc::new(Inner {
                id: config
                    .client_id
                    .clone()
                    .unwrap_or_else(|| distlock_core::Owner::random().to_string()),
                conn,
                config,
                endpoint,
                subscriber,
            }),
        })
    }

    /// The keys used for `name`.
    pub fn keys(&self, name: &LockName) -> Keys {
        Keys::new(&self.inner.config.prefix, name)
    }

    /// `req`'s entry in its lock's wait queue: this client's id, a space,
    /// and the stored owner.
    fn queue_entry(&self, req: &LockRequest) -> String {
        format!("{} {}", self.inner.id, owner_arg(req))
    }

    /// Only the lock key, for the hot paths.
    fn lock_key(&self, name: &LockName) -> String {
        Keys::lock_of(&self.inner.config.prefix, name)
    }

    fn err(&self, e: RedisError) -> Error {
        // Outside a Cluster client, a redirection means the URL names a
        // node of a Cluster: no retry reaches the key's node.
        let moved = matches!(
            e.kind(),
            redis::ErrorKind::Server(redis::ServerErrorKind::Moved)
        ) || e.code() == Some("MOVED");
        if moved && !self.inner.conn.is_cluster() {
            return Error::misconfigured(
                "redis",
                format!(
                    "redis at {}: {e}; the server is a node of a Redis Cluster: use a redis+cluster:// URL",
                    self.inner.endpoint
                ),
                Some(Box::new(e)),
            );
        }
        map_err(&self.inner.endpoint, e)
    }

    /// Runs one script on the connection, its errors mapped.
    async fn run<T: redis::FromRedisValue>(&self, inv: &redis::ScriptInvocation<'_>) -> Result<T> {
        self.inner.conn.script(inv).await.map_err(|e| self.err(e))
    }

    /// Raises the counter at `fence` to at least `token` (never lowers it).
    async fn raise_counter(&self, fence: &str, token: FencingToken) -> Result<()> {
        let mut inv = Scripts::get().raise.key(fence);
        inv.arg(token.get());
        let _: i64 = self.run(&inv).await?;
        Ok(())
    }

    /// One acquire script: the token, or how long the holder has left (for
    /// a semaphore: until its earliest permit expires). It never leaves a
    /// writer's mark and never looks at a semaphore's or an election's
    /// wait queue (Redlock's nodes ask this way; a `fifo` client's own
    /// `try_acquire` also refuses while waiters queue ahead); with `fifo`,
    /// a lock's queue refuses it while waiters (for a shared request:
    /// writers) are queued.
    pub async fn attempt(&self, req: &LockRequest) -> Result<Outcome> {
        Ok(self.attempt_in(req, Attempt::Once).await?.outcome)
    }

    /// One acquire script, asking as `how` says: the token, or how long
    /// the holder has left, and whether the attempt marked the name as
    /// awaited by a writer.
    pub async fn attempt_in(&self, req: &LockRequest, how: Attempt) -> Result<Attempted> {
        match req.kind {
            HoldKind::Permits { .. } => Ok(self.attempt_permit(req, true).await?.into()),
            HoldKind::Shared => Ok(self.attempt_shared(req, true).await?.into()),
            HoldKind::Leader => Ok(self.attempt_leader(req).await?.into()),
            _ => self.attempt_exclusive(req, how, true, None).await,
        }
    }

    /// An acquire attempt without a fencing token: a plain `SET NX PX`
    /// (and, only when the lock is held, a `PTTL` for how long). The grant
    /// carries token 0. For Redlock without fencing, where tokens are
    /// declared meaningless: no counter is kept, and the server runs no
    /// script (a script costs the server more than the command).
    /// A semaphore's permits and shared holds need their script either
    /// way, so those requests run it, taking no token; an election's
    /// campaign runs its own script and takes its token.
    pub async fn attempt_unfenced(&self, req: &LockRequest) -> Result<Outcome> {
        Ok(self.attempt_unfenced_in(req, Attempt::Once).await?.outcome)
    }

    /// [`attempt_unfenced`](Self::attempt_unfenced), asking as `how` says.
    /// A wait's refused first `SET NX PX` is followed by `acquire.lua`
    /// (instead of `PTTL`), which can mark the name; its later attempts
    /// run the script alone.
    pub async fn attempt_unfenced_in(&self, req: &LockRequest, how: Attempt) -> Result<Attempted> {
        match req.kind {
            HoldKind::Permits { .. } => return Ok(self.attempt_permit(req, false).await?.into()),
            HoldKind::Shared => return Ok(self.attempt_shared(req, false).await?.into()),
            HoldKind::Leader => return Ok(self.attempt_leader(req).await?.into()),
            // A queue is read by the script alone.
            _ if how == Attempt::LaterOfWait || self.inner.config.fifo => {
                return self.attempt_exclusive(req, how, false, None).await
            }
            _ => {}
        }
        let lock = self.lock_key(&req.name);
        let mut set = redis::cmd("SET");
        set.arg(&lock)
            .arg(owner_arg(req))
            .arg("NX")
            .arg("PX")
            .arg(ttl_ms(req.ttl));
        let (ok, acked): (Option<String>, _) = match self.inner.config.wait_replicas {
            0 => (
                self.inner.conn.cmd(&set).await.map_err(|e| self.err(e))?,
                None,
            ),
            want => {
                let mut first = redis::pipe();
                first.add_command(set);
                Box::pin(self.then_wait(first, want)).await?
            }
        };
        if ok.is_some() {
            if acked.is_some() {
                Box::pin(self.await_replicas(req, acked)).await?;
            }
            return Ok(Outcome::Granted(FencingToken(0)).into());
        }
        if how != Attempt::Once {
            return self.attempt_exclusive(req, how, false, None).await;
        }
        let pttl: i64 = self
            .inner
            .conn
            .cmd(redis::cmd("PTTL").arg(&lock))
            .await
            .map_err(|e| self.err(e))?;
        Ok(Outcome::Held((pttl >= 0).then(|| Duration::from_millis(pttl.unsigned_abs()))).into())
    }

    /// Runs a granting script. With `wait_replicas`, `WAIT` follows it in
    /// one pipeline on one connection ([`Conn::then_wait`]), and the second
    /// value is how many replicas acknowledged the script's writes, for
    /// [`Self::await_replicas`].
    /// `script` is `inv`'s: loaded in the same pipeline, since a pipeline's
    /// `EVALSHA` cannot be retried after a `NOSCRIPT` from a server that
    /// lacks it.
    async fn run_granting<T: redis::FromRedisValue>(
        &self,
        script: &redis::Script,
        inv: &redis::ScriptInvocation<'_>,
    ) -> Result<(T, Option<i64>)> {
        let want = self.inner.config.wait_replicas;
        if want == 0 {
            return Ok((self.run(inv).await?, None));
        }
        let mut first = redis::pipe();
        first.load_script(script).ignore().invoke_script(inv);
        Box::pin(self.then_wait(first, want)).await
    }

    /// `first` and `WAIT` for `wait_replicas` in one pipeline.
    async fn then_wait<T: redis::FromRedisValue>(
        &self,
        first: redis::Pipeline,
        want: u32,
    ) -> Result<(T, Option<i64>)> {
        let timeout = u64::try_from(self.inner.config.wait_timeout.as_millis())
            .unwrap_or(u64::MAX)
            .max(1);
        let (answer, acked) = self
            .inner
            .conn
            .then_wait(first, want, timeout)
            .await
            .map_err(|e| self.err(e))?;
        Ok((answer, Some(acked)))
    }

    /// With `wait_replicas`, a grant counts only once that many replicas
    /// have it (`acked`, from the `WAIT` sent with the grant): a failover
    /// inside the window can then no longer lose it.
    async fn await_replicas(&self, req: &LockRequest, acked: Option<i64>) -> Result<()> {
        let want = self.inner.config.wait_replicas;
        let Some(acked) = acked.filter(|_| want > 0) else {
            return Ok(());
        };
        let timeout = self.inner.config.wait_timeout.as_millis();
        if acked >= i64::from(want) {
            return Ok(());
        }
        let _ = self.release(req).await;
        Err(Error::unavailable(
            "redis",
            format!(
                "only {acked} of {want} replicas of {} acknowledged the lock within {timeout} ms, so it was released",
                self.inner.endpoint
            ),
            None,
        ))
    }

    /// Raises the fencing counter of `name` to at least `token` (never
    /// lowers it). Redlock's fencing writes its token back with this.
    pub async fn raise_fence(&self, name: &LockName, token: FencingToken) -> Result<()> {
        self.raise_counter(&self.keys(name).fence, token).await
    }

    /// Subscribes to release messages for `name`; resolves nothing until
    /// awaited. The subscription is confirmed by the server when this
    /// returns, so no later release is missed.
    pub async fn watch_releases(&self, name: &LockName) -> Result<ReleaseWatch> {
        self.watch_channel(self.keys(name).channel, Wake::All).await
    }

    /// The watch a waiter for `req` takes: a semaphore's releases for a
    /// permit, an election's for a leadership, the waiter's own channel of
    /// the lock when it waits in the lock's queue (`queued`), else the
    /// lock's releases. Redlock takes it on every node.
    pub async fn watch_for(&self, req: &LockRequest, queued: bool) -> Result<ReleaseWatch> {
        match req.kind {
            HoldKind::Permits { .. } if queued => {
                let channel = self.semaphore_keys(&req.name).queue_channel(&self.inner.id);
                self.watch_own(req, channel).await
            }
            HoldKind::Permits { .. } => self.watch_permit_releases(&req.name).await,
            HoldKind::Leader if queued => {
                let channel = self.election_keys(&req.name).queue_channel(&self.inner.id);
                self.watch_own(req, channel).await
            }
            HoldKind::Leader => self.watch_election_releases(&req.name).await,
            _ if queued => self.watch_queue(req).await,
            _ => self.watch_releases(&req.name).await,
        }
    }

    /// Subscribes to this client's own `channel`, where a release tells
    /// `req`'s queue entry that it is first.
    async fn watch_own(&self, req: &LockRequest, channel: String) -> Result<ReleaseWatch> {
        self.inner
            .subscriber
            .watch_queued(&self.inner.conn, &channel, &self.queue_entry(req))
            .await
            .map(|watch| ReleaseWatch { watch, channel })
            .map_err(|e| self.err(e))
    }

    /// Whether [`watch_for`](Self::watch_for) with the same arguments would
    /// send nothing to the server: its channel is subscribed on a live
    /// connection now (also while a subscription lingers after its last
    /// waiter).
    pub fn watching(&self, req: &LockRequest, queued: bool) -> bool {
        let channel = match req.kind {
            HoldKind::Permits { .. } if queued => {
                self.semaphore_keys(&req.name).queue_channel(&self.inner.id)
            }
            HoldKind::Permits { .. } => self.semaphore_keys(&req.name).channel,
            HoldKind::Leader if queued => {
                self.election_keys(&req.name).queue_channel(&self.inner.id)
            }
            HoldKind::Leader => self.election_keys(&req.name).channel,
            _ if queued => Keys::queue_channel_of(&self.lock_key(&req.name), &self.inner.id),
            _ => self.keys(&req.name).channel,
        };
        let subscriber = &self.inner.subscriber;
        subscriber.any() && subscriber.subscribed(&channel)
    }

    async fn watch_channel(&self, channel: String, wake: Wake) -> Result<ReleaseWatch> {
        let watch = self
            .inner
            .subscriber
            .watch(&self.inner.conn, &channel, wake)
            .await
            .map_err(|e| self.err(e))?;
        Ok(ReleaseWatch { watch, channel })
    }

    /// One `CONFIG GET` value from every node (see
    /// [`Conn::on_every_node`](conn::Conn::on_every_node)), or why a node
    /// would not say.
    async fn config_get(&self, key: &str) -> std::result::Result<Vec<(String, String)>, String> {
        let refused = |e: &dyn fmt::Display| format!("CONFIG GET {key} refused: {e}");
        let text = |v: &redis::Value| match v {
            redis::Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
            redis::Value::SimpleString(s) => Some(s.clone()),
            _ => None,
        };
        let nodes = self
            .inner
            .conn
            .on_every_node(redis::cmd("CONFIG").arg("GET").arg(key))
            .await
            .map_err(|e| refused(&e))?;
        nodes
            .into_iter()
            .map(|(node, answer)| {
                let value = match &answer {
                    redis::Value::Array(items) if items.len() == 2 => text(&items[1]),
                    redis::Value::Map(pairs) if pairs.len() == 1 => text(&pairs[0].1),
                    redis::Value::ServerError(e) => return Err(refused(&format!("{e:?}"))),
                    _ => None,
                };
                let value = value.ok_or_else(|| format!("CONFIG GET {key} answered {answer:?}"))?;
                Ok((node, value))
            })
            .collect()
    }

    /// Deletes the lock key, the shared holds and the election's leader
    /// whoever holds them, as an operator would (the fencing counters
    /// stay), and tells the lock's waiters as a release does and the
    /// election's campaigners and observers. Returns whether any existed.
    pub async fn evict(&self, name: &LockName) -> Result<bool> {
        let keys = self.keys(name);
        let mut inv = Scripts::get().evict.key(&keys.lock);
        inv.key(&keys.readers);
        if self.inner.config.fifo {
            inv.key(&keys.queue)
                .key(&keys.queue_ends)
                .key(&keys.queue_shared);
        }
        inv.arg(&keys.channel);
        let n: i64 = self.run(&inv).await?;
        let led = self.evict_leader(name).await?;
        Ok(n >= 1 || led)
    }

    /// The server's `run_id` (changes on every restart).
    pub async fn run_id(&self) -> Result<String> {
        Ok(self.server_run().await?.0)
    }

    /// The server's `run_id` (changes on every restart) and how long it has
    /// been up (`uptime_in_seconds`, whole seconds rounded down), from one
    /// `INFO server`.
    pub async fn server_run(&self) -> Result<(String, Duration)> {
        let info: String = self
            .inner
            .conn
            .cmd(redis::cmd("INFO").arg("server"))
            .await
            .map_err(|e| self.err(e))?;
        let field = |name: &str| {
            info.lines()
                .find_map(|l| l.strip_prefix(name))
                .map(str::trim)
        };
        let id =
            field("run_id:").ok_or_else(|| Error::backend("redis", "INFO server has no run_id"))?;
        // From the wall clock: a clock stepped back can make it negative,
        // read as just started.
        let up = field("uptime_in_seconds:")
            .and_then(|s| s.parse::<i64>().ok())
            .ok_or_else(|| Error::backend("redis", "INFO server has no uptime_in_seconds"))?;
        Ok((
            id.to_string(),
            Duration::from_secs(up.max(0).unsigned_abs()),
        ))
    }
}

impl RedisBackend {
    async fn extend_locks(&self, reqs: &[&LockRequest]) -> Result<Vec<bool>> {
        if reqs.is_empty() {
            return Ok(Vec::new());
        }
        let mut inv = Scripts::get().extend_many.prepare_invoke();
        for req in reqs {
            inv.key(self.lock_key(&req.name))
                .arg(owner_arg(req))
                .arg(ttl_ms(req.ttl));
        }
        self.renewed(&inv, "extend_many.lua", reqs.len()).await
    }

    /// Runs a batched renewal script whose invocation carries `asked`
    /// holds, and answers for each, in order, whether it was renewed; an
    /// answer of another length is a backend error naming `script`.
    async fn renewed(
        &self,
        inv: &redis::ScriptInvocation<'_>,
        script: &str,
        asked: usize,
    ) -> Result<Vec<bool>> {
        let answers: Vec<i64> = self.run(inv).await?;
        if answers.len() != asked {
            return Err(Error::backend(
                "redis",
                format!(
                    "{script} answered {} times for {asked} holds",
                    answers.len()
                ),
            ));
        }
        Ok(answers.into_iter().map(|n| n == 1).collect())
    }
}

/// The owner string a request's hold is stored under and compared by: the
/// owner followed by the holder info ([`distlock_core::stored_owner`]).
/// Every script argument that names an owner is built here, so a grant, its
/// renewals, its release and a writer's mark always send the same string.
pub(crate) fn owner_arg(req: &LockRequest) -> String {
    distlock_core::stored_owner(req)
}

fn ttl_ms(ttl: Duration) -> u64 {
    u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX).max(1)
}

/// One finding of `setting` from every node's values (`nodes`, each by its
/// address, empty for a single server): what `judge` makes of each node's,
/// fine only if fine on every node, else the warning of the first node it
/// warns of, naming every such node.
fn judged(
    setting: &str,
    nodes: &std::collections::BTreeMap<String, Vec<String>>,
    judge: impl Fn(&[String]) -> (String, Option<&'static str>),
) -> Finding {
    let judged: Vec<(&String, String, Option<&'static str>)> = nodes
        .iter()
        .filter(|(_, v)| v.len() == nodes.values().map(Vec::len).max().unwrap_or(0))
        .map(|(node, v)| {
            let (value, warning) = judge(v);
            (node, value, warning)
        })
        .collect();
    let named = |node: &str, value: &str| {
        if node.is_empty() {
            value.to_string()
        } else {
            format!("{node} {value}")
        }
    };
    let warned: Vec<String> = judged
        .iter()
        .filter(|(_, _, w)| w.is_some())
        .map(|(node, value, _)| named(node, value))
        .collect();
    match judged.iter().find_map(|(_, _, w)| *w) {
        Some(warning) => Finding::warning(setting, warned.join("; "), warning),
        None => {
            let mut values: Vec<&str> = judged.iter().map(|(_, v, _)| v.as_str()).collect();
            values.sort_unstable();
            values.dedup();
            match values.as_slice() {
                [] => Finding::unknown(setting, "no node answered"),
                _ => Finding::fine(setting, values.join("; ")),
            }
        }
    }
}

/// The `i`th of a node's values, empty if it has fewer.
fn at(values: &[String], i: usize) -> &str {
    values.get(i).map_or("", String::as_str)
}

/// A node's eviction, from its `maxmemory-policy` and `maxmemory`.
fn eviction(policy: &str, maxmemory: &str) -> (String, Option<&'static str>) {
    if policy == "noeviction" {
        (policy.to_string(), None)
    } else if maxmemory == "0" {
        (
            format!("{policy}, maxmemory 0 (no limit: nothing is evicted)"),
            None,
        )
    } else if policy.starts_with("volatile") {
        (
            format!("{policy}, maxmemory {maxmemory}"),
            Some("under memory pressure Redis may evict lock keys, which have an expiry (two holders at once); set maxmemory-policy noeviction"),
        )
    } else {
        (
            format!("{policy}, maxmemory {maxmemory}"),
            Some("under memory pressure Redis may evict lock keys (two holders at once) and fencing counters (tokens repeat); set maxmemory-policy noeviction"),
        )
    }
}

/// A node's persistence, from its `appendonly`, `appendfsync` and `save`.
fn persistence(aof: &str, fsync: &str, save: &str) -> (String, Option<&'static str>) {
    if aof == "yes" && fsync == "no" {
        (
            "appendonly yes, appendfsync no".to_string(),
            Some("the system writes the log to disk when it chooses: an OS crash or power loss loses recent locks and fencing counters (tokens repeat); set appendfsync everysec or always"),
        )
    } else if aof == "yes" {
        (format!("appendonly yes, appendfsync {fsync}"), None)
    } else if !save.trim().is_empty() {
        (
            format!("RDB snapshots only (save {save})"),
            Some("a restart loses what happened since the last snapshot: held locks and fencing counters (tokens repeat); set appendonly yes"),
        )
    } else {
        (
            "none (appendonly no, save \"\")".to_string(),
            Some("a restart loses every lock and fencing counter (tokens repeat); set appendonly yes"),
        )
    }
}

/// The value of `key` in an `INFO` section (`key:value` lines).
fn info_field(info: &str, key: &str) -> Option<String> {
    info.lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(':'))
        .map(|v| v.trim().to_string())
}

/// What a Cluster's `INFO replication`, one section per node, says of its
/// masters: one without a replica cannot fail over; with replicas,
/// replication is asynchronous (and a Cluster takes no `wait_replicas`).
fn cluster_replication(nodes: &std::collections::HashMap<String, String>) -> Finding {
    let masters: Vec<(&str, u32)> = nodes
        .iter()
        .filter(|(_, info)| info_field(info, "role").as_deref() == Some("master"))
        .map(|(node, info)| {
            let n = info_field(info, "connected_slaves").and_then(|n| n.parse().ok());
            (node.as_str(), n.unwrap_or(0))
        })
        .collect();
    let mut bare: Vec<&str> = masters
        .iter()
        .filter(|(_, n)| *n == 0)
        .map(|(m, _)| *m)
        .collect();
    bare.sort_unstable();
    if masters.is_empty() {
        Finding::unknown("replication", "no node answered as a master")
    } else if !bare.is_empty() {
        Finding::warning(
            "replication",
            format!(
                "{} masters, {} without a replica ({})",
                masters.len(),
                bare.len(),
                bare.join(", ")
            ),
            "a master without a replica cannot fail over: the locks of its slots wait for it to return (and a restart without persistence loses them); give every master a replica",
        )
    } else {
        Finding::warning(
            "replication",
            format!("{} masters, each with a replica", masters.len()),
            "replication is asynchronous: a failover to a lagging replica can grant a lock twice (a Cluster takes no wait_replicas; guarantees.md, Redis and failover)",
        )
    }
}

/// The share of a renewal's TTL that asking the Sentinels for the master
/// before it may take: a tenth, so that a Sentinel that hangs delays each
/// renewal by that much at most.
const ASKING_SHARE: u32 = 10;

/// A failed connect's error: `Misconfigured` naming the scheme to use when
/// the server answers with the other of plain and TLS than the URL says,
/// or naming the protocol it speaks when it is not Redis.
async fn connect_error(
    topology: &config::Topology,
    endpoint: &str,
    timeout: Duration,
    e: RedisError,
) -> Error {
    // The cluster client reports a timeout at its first connections only
    // in its text.
    let timed_out = e.is_timeout() || e.to_string().contains("timed out");
    let e = map_err(endpoint, e);
    if !matches!(e, Error::Unavailable { .. } | Error::Backend { .. }) {
        return e;
    }
    // Not after a timeout: a stalled server, not another protocol (each
    // of the others answers or closes at once).
    let why = match topology.wrong_scheme(timed_out, timeout).await {
        Some(why) => Some(why.to_owned()),
        None if timed_out => None,
        None => topology.foreign_protocol(timeout).await,
    };
    match why {
        Some(why) => Error::misconfigured(
            "redis",
            format!("redis at {endpoint}: {why}"),
            Some(Box::new(e)),
        ),
        None => e,
    }
}

fn map_err(endpoint: &str, e: RedisError) -> Error {
    use redis::{ErrorKind, ServerErrorKind};
    let transient = e.is_io_error()
        || e.is_connection_refusal()
        || e.is_connection_dropped()
        || e.is_timeout()
        || matches!(
            e.kind(),
            ErrorKind::Server(
                ServerErrorKind::ReadOnly
                    | ServerErrorKind::MasterDown
                    | ServerErrorKind::TryAgain
                    | ServerErrorKind::ClusterDown
                    | ServerErrorKind::BusyLoading
            )
            // The Sentinels name no master that is up: it is down and not
            // replaced yet (a failover is due). A service name no Sentinel
            // knows is told apart at connect (`refused_configuration`).
            | ErrorKind::MasterNameNotFoundBySentinel
            | ErrorKind::NoValidReplicasFoundBySentinel
            // The cluster client holds no connection to the slot's node.
            | ErrorKind::ClusterConnectionNotFound
        )
        // Another client's script runs past busy-reply-threshold
        // (lua-time-limit), fewer replicas than min-replicas-to-write are
        // connected, or the server is at its maxmemory with nothing it may
        // evict: each passes without anything changing here.
        || matches!(e.code(), Some("BUSY" | "NOREPLICAS" | "OOM"));
    if let Some(what) = refused_configuration(&e) {
        return Error::misconfigured(
            "redis",
            format!("redis at {endpoint}: {e}; {what}"),
            Some(Box::new(e)),
        );
    }
    if transient {
        Error::unavailable(
            "redis",
            format!("redis at {endpoint}: {e}"),
            Some(Box::new(e)),
        )
    } else if matches!(e.kind(), ErrorKind::InvalidClientConfig) {
        Error::invalid(
            distlock_core::InputKind::Url,
            format!("redis at {endpoint}: {e}"),
        )
    } else {
        Error::backend("redis", e)
    }
}

/// A key distlock uses for a name found holding `what`, data distlock did
/// not write: `Misconfigured`, as the server's `WRONGTYPE` is.
pub(crate) fn foreign_data(what: String) -> Error {
    Error::misconfigured("redis", format!("{what}; {FOREIGN_DATA}"), None)
}

/// What to change when a key distlock uses holds data it did not write.
const FOREIGN_DATA: &str = "a key distlock uses for this name holds data distlock did not write: another application writes under the same key names; give distlock a prefix of its own (`prefix=` in the URL)";

/// What to change, when the server refused the configuration itself, or
/// TLS refused the server: retrying the same password, database index or
/// CA cannot succeed.
fn refused_configuration(e: &RedisError) -> Option<&'static str> {
    use redis::{ErrorKind, ServerErrorKind};
    match (e.kind(), e.code()) {
        _ if e.to_string().contains(conn::SENTINEL_AUTH) => Some(
            "the URL's password is the master's, and distlock asks the Sentinels without one: let them accept clients without a password",
        ),
        (ErrorKind::AuthenticationFailed, _) | (_, Some("WRONGPASS")) => {
            Some("check the user and password in the URL")
        }
        // The cluster client wraps each seed's refusal in an I/O error of
        // its first connections.
        _ if e.to_string().contains("AuthenticationFailed")
            || e.to_string().contains("WRONGPASS") =>
        {
            Some("check the user and password in the URL")
        }
        (_, Some("NOAUTH")) => Some("the server requires a password: put it in the URL"),
        // A key distlock uses for the name holds another application's data
        // (another type, or a counter that is not a number).
        (_, Some("WRONGTYPE")) => Some(FOREIGN_DATA),
        _ if e.to_string().contains("value is not an integer") => Some(FOREIGN_DATA),
        (ErrorKind::MasterNameNotFoundBySentinel, _)
            if e.to_string().contains(conn::UNKNOWN_SERVICE) =>
        {
            Some("check the service name in the URL against `sentinel monitor` in sentinel.conf")
        }
        (ErrorKind::Server(ServerErrorKind::NoPerm), _) => {
            Some("grant the user the commands and keys in the backend's README")
        }
        // A command a script runs that the user may not (Redis 7 answers
        // ERR, not NOPERM).
        _ if e.to_string().contains("can't run this command") => {
            Some("grant the user the commands and keys in the backend's README")
        }
        // The client's SELECT after connecting, refused to the user (the
        // text is the only mark).
        _ if e.to_string().contains("refused to switch database")
            && e.to_string().contains("no permissions") =>
        {
            Some("grant the user `+select` (for a database other than 0) as the backend's README shows")
        }
        _ if e.to_string().contains("refused to switch database") => {
            Some("the database index in the URL is out of the server's range (see `databases` in redis.conf)")
        }
        // A `redis://` or `redis+cluster://` URL naming a Sentinel, which
        // knows none of the commands distlock sends (nor does a server
        // whose commands were renamed away).
        _ if e.to_string().contains("unknown command") => Some(
            "the server does not know a command distlock needs: if the URL names a Sentinel, use redis+sentinel://HOST:PORT/SERVICE; a server with renamed commands serves no lock",
        ),
        // A `redis+cluster://` URL naming a server that is not a Cluster
        // node, or a `redis://` URL naming a node of a Cluster.
        _ if e.to_string().contains("cluster support disabled") => {
            Some("the server is not a Cluster node: use a redis:// URL")
        }
        // A `redis+sentinel://` URL naming a server that is not a Sentinel.
        _ if e.to_string().contains("does not point to a sentinel") => {
            Some("the server is not a Sentinel: use a redis:// URL for it, or name the Sentinels")
        }
        // An alert: the server refused this side, most often for want of
        // a client certificate, which this backend does not present.
        _ if distlock_core::tls_refusal(e)
            .is_some_and(|t| t.to_ascii_lowercase().contains("received fatal alert")) =>
        {
            Some("the server refused this client in the TLS handshake: distlock-redis presents no client certificate, so a server with tls-auth-clients yes refuses it (set tls-auth-clients optional or no); otherwise check the server's TLS protocols and ciphers")
        }
        _ if distlock_core::tls_refusal(e).is_some() => Some(
            "the TLS handshake failed: check that ca_file names the PEM CA that signed the servers' certificates, and that the URL's hosts are names in those certificates",
        ),
        _ => None,
    }
}

impl RedisBackend {
    /// What this backend declares, without connecting (for `distlock backends`).
    pub fn declared_capabilities() -> Capabilities {
        // Tokens come from a counter in Redis memory: they increase only
        // while Redis keeps its data (no failover to a lagging replica, no
        // restart without persistence). Asynchronous replication makes the
        // lock AP. Semaphores keep their own counter under the same terms.
        Capabilities::new(
            "redis",
            Fencing::BestEffort,
            Consistency::Ap,
            Waiting::Notification,
            TrustedClock::Server,
        )
        .with_ttl_range(
            Duration::from_millis(10),
            Duration::from_secs(365 * 24 * 3600),
        )
        .with_semaphore()
        .with_shared()
        .with_elections()
    }
}

#[async_trait]
impl Backend for RedisBackend {
    fn capabilities(&self) -> Capabilities {
        let caps = Self::declared_capabilities();
        if self.inner.conn.is_cluster() {
            // One script may only touch keys of one slot.
            caps
        } else {
            caps.with_extend_batch(EXTEND_BATCH)
        }
    }

    async fn try_acquire(&self, req: &LockRequest) -> Result<Option<Grant>> {
        let began = Instant::now();
        let outcome = match req.kind {
            // Refused while live waiters queue ahead.
            HoldKind::Permits { .. } if self.inner.config.fifo => {
                self.attempt_permit_in(req, true, QueueUse::Try).await?
            }
            HoldKind::Leader if self.inner.config.fifo => {
                self.attempt_leader_in(req, QueueUse::Try).await?
            }
            HoldKind::Shared if self.inner.config.fifo => {
                self.attempt_shared_in(req, true, QueueUse::Try, None)
                    .await?
            }
            _ => self.attempt(req).await?,
        };
        Ok(outcome.token().map(|t| Grant::new(t, began)))
    }

    async fn acquire(&self, req: &LockRequest, deadline: Option<Instant>) -> Result<Grant> {
        match req.kind {
            HoldKind::Permits { .. } => return self.acquire_permit(req, deadline).await,
            HoldKind::Leader => return self.acquire_leader(req, deadline).await,
            _ => {}
        }
        // With `fifo`, exclusive and shared waiters queue together, first
        // come, first served; without it every waiter wakes on every
        // release.
        let queued = self.inner.config.fifo;
        let mut wakeups = if queued {
            Subscribed::queued(self, req, Channel::Queue)
        } else {
            Subscribed::new(self, &req.name, Channel::Lock)
        };
        let pace = Pace::notified(Duration::from_millis(100));
        let (tried, left) = (&AtomicBool::new(false), &AtomicBool::new(false));
        let mut end = WaitEnd::new(self, req, left);
        let granted = wait_for_grant(&req.name, deadline, pace, &mut wakeups, || async move {
            let how = if tried.swap(true, Ordering::Relaxed) {
                Attempt::LaterOfWait
            } else {
                Attempt::FirstOfWait
            };
            // Before the attempt: one whose answer is lost, or that is
            // dropped on the way, may have joined the queue or left a
            // writer's mark.
            left.store(true, Ordering::Relaxed);
            let a = if queued {
                let life = queue_entry_life(self.inner.config.queue_lease, deadline);
                match req.kind {
                    HoldKind::Shared => self
                        .attempt_shared_in(req, true, QueueUse::Wait(life), None)
                        .await?
                        .into(),
                    _ => self.attempt_exclusive(req, how, true, Some(life)).await?,
                }
            } else {
                self.attempt_in(req, how).await?
            };
            Ok(a.outcome)
        })
        .await;
        end.finish(granted.is_err()).await;
        granted
    }

    /// One script for every lock, on a single server or Sentinel's master;
    /// not in Cluster, where the locks' keys live in different slots, nor
    /// with `fifo`, whose queues only the single acquire reads.
    async fn try_acquire_all(&self, reqs: &[LockRequest]) -> Result<AllAtOnce> {
        if self.inner.conn.is_cluster()
            || self.inner.config.fifo
            || reqs.iter().any(|r| r.kind != HoldKind::Exclusive)
        {
            return Ok(AllAtOnce::NotOffered);
        }
        let began = Instant::now();
        let mut inv = Scripts::get().acquire_all.prepare_invoke();
        for req in reqs {
            let lock = self.lock_key(&req.name);
            inv.key(&lock)
                .key(Keys::fence_of(&lock))
                .arg(owner_arg(req))
                .arg(ttl_ms(req.ttl));
        }
        let (answer, acked): (redis::Value, _) =
            self.run_granting(&Scripts::get().acquire_all, &inv).await?;
        let tokens: Vec<i64> = match answer {
            redis::Value::Int(0) => return Ok(AllAtOnce::Refused),
            redis::Value::Int(-1) => {
                return Err(crate::foreign_data(
                    "a fencing counter of one of the names held a negative number".into(),
                ))
            }
            redis::Value::Array(tokens) => tokens
                .into_iter()
                .map(|t| match t {
                    redis::Value::Int(t) => t,
                    _ => 0,
                })
                .collect(),
            other => {
                return Err(Error::backend(
                    "redis",
                    format!("acquire_all.lua answered {other:?}"),
                ))
            }
        };
        if tokens.len() != reqs.len() || tokens.iter().any(|t| *t < 1) {
            return Err(Error::backend(
                "redis",
                format!(
                    "acquire_all.lua answered tokens {tokens:?} for {} locks",
                    reqs.len()
                ),
            ));
        }
        if acked.is_some() {
            Box::pin(self.await_replicas(&reqs[0], acked)).await?;
        }
        Ok(AllAtOnce::Granted(
            tokens
                .into_iter()
                .map(|t| Grant::new(FencingToken(t.unsigned_abs()), began))
                .collect(),
        ))
    }

    /// `maxmemory-policy`, persistence and replication, where the server
    /// lets `CONFIG GET` and `INFO` through.
    async fn deployment_findings(&self) -> Result<Vec<Finding>> {
        let mut out = Vec::new();
        // In a Cluster every node's settings count: each serves its own
        // slots' locks, and a replica serves its master's after a failover.
        let settings = |keys: &'static [&'static str]| async move {
            let mut per_node: std::collections::BTreeMap<String, Vec<String>> = Default::default();
            for key in keys {
                for (node, value) in self.config_get(key).await? {
                    per_node.entry(node).or_default().push(value);
                }
            }
            std::result::Result::<_, String>::Ok(per_node)
        };
        out.push(match settings(&["maxmemory-policy", "maxmemory"]).await {
            Ok(nodes) => judged("maxmemory-policy", &nodes, |v| eviction(at(v, 0), at(v, 1))),
            Err(why) => Finding::unknown("maxmemory-policy", why),
        });
        out.push(
            match settings(&["appendonly", "appendfsync", "save"]).await {
                Ok(nodes) => judged("persistence", &nodes, |v| {
                    persistence(at(v, 0), at(v, 1), at(v, 2))
                }),
                Err(why) => Finding::unknown("persistence", why),
            },
        );
        if self.inner.conn.is_cluster() {
            // Every node answers, each with its own section.
            let info: redis::RedisResult<std::collections::HashMap<String, String>> = self
                .inner
                .conn
                .cmd(redis::cmd("INFO").arg("replication"))
                .await;
            out.push(match info {
                Ok(nodes) => cluster_replication(&nodes),
                Err(e) => Finding::unknown("replication", format!("INFO replication refused: {e}")),
            });
            return Ok(out);
        }
        let info: redis::RedisResult<String> = self
            .inner
            .conn
            .cmd(redis::cmd("INFO").arg("replication"))
            .await;
        out.push(match info {
            Ok(info) => {
                let field = |k: &str| info_field(&info, k);
                let role = field("role").unwrap_or_default();
                let replicas = field("connected_slaves").unwrap_or_default();
                match replicas.parse::<u32>() {
                    _ if role == "slave" => Finding::warning(
                        "replication",
                        format!("role {role}"),
                        "this server is a replica: it refuses every write, so no lock can be taken; point the URL at the master (or at Sentinels)",
                    ),
                    Ok(n) if n > 0 && self.inner.config.wait_replicas == 0 => Finding::warning(
                        "replication",
                        format!("role {role}, {n} replicas"),
                        "replication is asynchronous: a failover to a lagging replica can grant a lock twice; set wait_replicas in the URL (guarantees.md, Redis and failover)",
                    ),
                    _ => Finding::fine("replication", format!("role {role}, {replicas} replicas")),
                }
            }
            Err(e) => Finding::unknown("replication", format!("INFO replication refused: {e}")),
        });
        Ok(out)
    }

    async fn extend(&self, req: &LockRequest) -> Result<bool> {
        self.inner.conn.confirm_master(req.ttl / ASKING_SHARE).await;
        match req.kind {
            HoldKind::Permits { .. } => {
                return Ok(self.extend_permits(&[req]).await?.first() == Some(&true))
            }
            HoldKind::Shared => return Ok(self.extend_shared(&[req]).await?.first() == Some(&true)),
            HoldKind::Leader => {
                return Ok(self.extend_leaders(&[req]).await?.first() == Some(&true))
            }
            _ => {}
        }
        let keys = self.keys(&req.name);
        let mut inv = Scripts::get().extend.key(&keys.lock);
        inv.arg(owner_arg(req)).arg(ttl_ms(req.ttl));
        let n: i64 = self.run(&inv).await?;
        Ok(n == 1)
    }

    /// Locks, shared holds, permits and leaderships go in one script call
    /// each, all sent at once on the multiplexed connection: one round trip
    /// for a mixed batch.
    async fn extend_many(&self, reqs: &[LockRequest]) -> Result<Vec<bool>> {
        let shortest = reqs.iter().map(|r| r.ttl).min().unwrap_or_default();
        self.inner
            .conn
            .confirm_master(shortest / ASKING_SHARE)
            .await;
        let (mut permits, mut shared, mut leaders, mut locks) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for r in reqs {
            match r.kind {
                HoldKind::Permits { .. } => permits.push(r),
                HoldKind::Shared => shared.push(r),
                HoldKind::Leader => leaders.push(r),
                _ => locks.push(r),
            }
        }
        let (permit_answers, shared_answers, leader_answers, lock_answers) = tokio::try_join!(
            async {
                if permits.is_empty() {
                    return Ok(Vec::new());
                }
                self.extend_permits(&permits).await
            },
            self.extend_shared(&shared),
            self.extend_leaders(&leaders),
            self.extend_locks(&locks),
        )?;
        let mut permit_answers = permit_answers.into_iter();
        let mut shared_answers = shared_answers.into_iter();
        let mut leader_answers = leader_answers.into_iter();
        let mut lock_answers = lock_answers.into_iter();
        Ok(reqs
            .iter()
            .map(|r| match r.kind {
                HoldKind::Permits { .. } => permit_answers.next(),
                HoldKind::Shared => shared_answers.next(),
                HoldKind::Leader => leader_answers.next(),
                _ => lock_answers.next(),
            })
            .map(|a| a.unwrap_or(false))
            .collect())
    }

    async fn inspect_permits(&self, name: &LockName) -> Result<LockStatus> {
        self.inspect_semaphore(name).await
    }

    async fn set_limit(&self, name: &LockName, limit: u32) -> Result<Option<u32>> {
        self.store_limit(name, limit).await
    }

    /// One script call: the lock key's PTTL and value (the exclusive
    /// holder's owner and holder info), the fence, and the live shared
    /// holds and writer marks.
    async fn inspect(&self, name: &LockName) -> Result<LockStatus> {
        let h = self.lock_holders(name).await?;
        let held = h.held();
        Ok(LockStatus::new(held)
            .with_token((held && h.fence > 0).then_some(FencingToken(h.fence)))
            .with_remaining(h.remaining())
            .with_shared(h.readers.len(), !h.writers.is_empty())
            .with_holder_info(h.holder_info().map(str::to_string)))
    }

    /// One `SCAN` of the whole keyspace (on every master of a Cluster:
    /// O(keys) on the server, in calls of `COUNT 1000`), then one read-only
    /// `list.lua` call per name found, in name order, stopping once `limit`
    /// records are in. Holder info is read from the stored owners.
    async fn list(&self, prefix: &str, limit: usize) -> Result<Vec<HoldRecord>> {
        self.list_holds(prefix, limit).await
    }

    async fn release(&self, req: &LockRequest) -> Result<bool> {
        match req.kind {
            HoldKind::Permits { .. } => self.release_permit(req, self.inner.config.fifo).await,
            HoldKind::Shared => self.release_shared(req).await,
            HoldKind::Leader => self.release_leader(req, self.inner.config.fifo).await,
            _ => self.release_exclusive(req, Removal::All).await,
        }
    }

    async fn proclaim(&self, req: &LockRequest, value: &str) -> Result<bool> {
        self.proclaim_value(req, value).await
    }

    /// One script call; the key lives as long as the leadership by the
    /// server's clock, so an expired leader is never reported.
    async fn leader(&self, name: &LockName) -> Result<Option<Leader>> {
        self.current_leader(name).await
    }

    /// Notified by the election's channel: subscribed first, then one read
    /// of the leader, and one more on every message (a grant, a
    /// resignation, an eviction, a proclaimed value), at the leader's lease
    /// end, and at least every [`RedisConfig::observe_recheck`].
    async fn observe_leader(&self, name: &LockName) -> Result<Option<distlock_core::LeaderStream>> {
        Ok(Some(self.observe_leaders(name).await))
    }
}

/// What a wait may leave on the server until it lapses: an exclusive
/// request's writer's mark and queue entry, a reader's, a permit request's
/// or a campaign's queue entry. A wait that ends without a grant removes
/// them; one cancelled (dropped) removes them in a task of its own.
pub(crate) struct WaitEnd<'a> {
    backend: &'a RedisBackend,
    req: &'a LockRequest,
    /// Whether an attempt may have left a mark or an entry.
    left: &'a AtomicBool,
    done: bool,
    /// Where the leaving runs if the wait is dropped unfinished.
    spawner: distlock_core::completion::Spawner,
}

impl<'a> WaitEnd<'a> {
    pub(crate) fn new(
        backend: &'a RedisBackend,
        req: &'a LockRequest,
        left: &'a AtomicBool,
    ) -> Self {
        Self {
            backend,
            req,
            left,
            done: false,
            spawner: distlock_core::completion::Spawner::here(),
        }
    }

    /// The wait has ended; one that ended `without_grant` removes what it
    /// left now, not when it lapses, and the waiters it held back are told.
    pub(crate) async fn finish(&mut self, without_grant: bool) {
        if without_grant && self.left.load(Ordering::Relaxed) {
            if let Err(e) = self.backend.leave_wait(self.req).await {
                tracing::debug!(error = %e, "the writer mark or queue entry stays until it lapses");
            }
        }
        self.done = true;
    }
}

impl Drop for WaitEnd<'_> {
    fn drop(&mut self) {
        if self.done || !self.left.load(Ordering::Relaxed) {
            return;
        }
        let (backend, req) = (self.backend.clone(), self.req.clone());
        self.spawner.spawn(async move {
            let _ = backend.leave_wait(&req).await;
        });
    }
}

impl RedisBackend {
    /// Removes what a wait for `req` left: a permit request's queue entry,
    /// an exclusive request's writer's mark and queue entry.
    async fn leave_wait(&self, req: &LockRequest) -> Result<()> {
        match req.kind {
            HoldKind::Permits { .. } => self.leave_permit_queue(req).await,
            HoldKind::Leader => self.leave_election_queue(req).await,
            _ => self.unmark(req).await,
        }
    }
}

/// A subscription to one lock's release messages.
pub struct ReleaseWatch {
    watch: subscriber::Watch,
    channel: String,
}

impl fmt::Debug for ReleaseWatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReleaseWatch")
            .field("channel", &self.channel)
            .finish()
    }
}

impl ReleaseWatch {
    /// Registers now for the next message on the channel (or the loss of
    /// the pub/sub connection); resolves with whether the connection still
    /// lives (when not, only polling is left).
    pub fn next(&self) -> impl std::future::Future<Output = bool> + Send + 'static {
        self.watch.next()
    }

    /// Whether the pub/sub connection behind it still delivers messages.
    pub fn alive(&self) -> bool {
        self.watch.alive()
    }
}

/// Which object's channel a wait listens on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Channel {
    /// The lock's (exclusive and shared holds).
    Lock,
    /// This client's own channel of the lock, for a waiter in its queue:
    /// woken by the messages addressed to it.
    Queue,
    /// The semaphore's.
    Permits,
    /// This client's own channel of the semaphore, for a waiter in its
    /// queue, as [`Channel::Queue`] is the lock's.
    PermitQueue,
    /// This client's own channel of the election, for a campaigner in its
    /// queue.
    ElectionQueue,
    /// The election's.
    Election,
}

/// Wake-ups from a lock's, a semaphore's or an election's pub/sub channel.
/// Subscribed only once an attempt is refused, so an uncontended acquire
/// costs one script call; subscribed again when the pub/sub connection
/// dies. A freed permit wakes one waiter of this client; a release, all of
/// them.
struct Subscribed<'a> {
    backend: &'a RedisBackend,
    name: &'a LockName,
    channel: Channel,
    /// A queued waiter's request ([`Channel::Queue`]): its queue entry
    /// names it in the release's message.
    queued: Option<&'a LockRequest>,
    watch: Option<ReleaseWatch>,
    signalled: Signalled,
}

impl<'a> Subscribed<'a> {
    fn new(backend: &'a RedisBackend, name: &'a LockName, channel: Channel) -> Self {
        Self {
            backend,
            name,
            channel,
            queued: None,
            watch: None,
            signalled: Signalled::from(None),
        }
    }

    /// The channel it listens on.
    fn channel_name(&self) -> String {
        let b = self.backend;
        match self.channel {
            Channel::Permits => b.semaphore_keys(self.name).channel,
            Channel::Election => b.election_keys(self.name).channel,
            Channel::Lock => b.keys(self.name).channel,
            Channel::Queue => Keys::queue_channel_of(&b.lock_key(self.name), &b.inner.id),
            Channel::PermitQueue => b.semaphore_keys(self.name).queue_channel(&b.inner.id),
            Channel::ElectionQueue => b.election_keys(self.name).queue_channel(&b.inner.id),
        }
    }

    /// A waiter in a wait queue as `req`'s owner, on its client's own
    /// `channel` ([`Channel::Queue`], [`Channel::PermitQueue`] or
    /// [`Channel::ElectionQueue`]).
    fn queued(backend: &'a RedisBackend, req: &'a LockRequest, channel: Channel) -> Self {
        Self {
            queued: Some(req),
            ..Self::new(backend, &req.name, channel)
        }
    }
}

impl Wakeups for Subscribed<'_> {
    fn arm(&mut self) -> Option<Wakeup> {
        let watch = self.watch.as_ref().filter(|w| w.alive())?;
        let general = self.signalled.arm()?;
        match watch.watch.own() {
            Some(own) => {
                let own = own.wakeup();
                Some(Box::pin(async move {
                    tokio::select! {
                        () = general => {}
                        () = own => {}
                    }
                }))
            }
            None => Some(general),
        }
    }

    async fn ready(&mut self) -> Result<bool> {
        let subscriber = &self.backend.inner.subscriber;
        if !subscriber.any() || !subscriber.subscribed(&self.channel_name()) {
            return Ok(false);
        }
        self.prepare().await?;
        Ok(self.watch.is_some())
    }

    async fn prepare(&mut self) -> Result<()> {
        if self.watch.as_ref().is_some_and(ReleaseWatch::alive) {
            return Ok(());
        }
        let b = self.backend;
        let subscribed = match self.channel {
            Channel::Permits => {
                b.watch_channel(self.channel_name(), Wake::OnePerPermit)
                    .await
            }
            Channel::Election => b.watch_channel(self.channel_name(), Wake::All).await,
            Channel::Lock => b.watch_releases(self.name).await,
            Channel::Queue | Channel::PermitQueue | Channel::ElectionQueue => {
                let channel = self.channel_name();
                let owner = self.queued.map(|r| b.queue_entry(r)).unwrap_or_default();
                b.inner
                    .subscriber
                    .watch_queued(&b.inner.conn, &channel, &owner)
                    .await
                    .map(|watch| ReleaseWatch { watch, channel })
                    .map_err(|e| b.err(e))
            }
        };
        self.watch = match subscribed {
            Ok(watch) => Some(watch),
            // Refused for good (an ACL without SUBSCRIBE): every wait would
            // sleep until each holder's lease ends, however early it
            // released, so the wait ends with the refusal instead.
            Err(e @ Error::Misconfigured { .. }) => return Err(e),
            Err(e) => {
                tracing::debug!(error = %e, "no pub/sub; waiting on lease ends only");
                None
            }
        };
        self.signalled
            .set(self.watch.as_ref().map(|w| w.watch.signal().clone()));
        Ok(())
    }

    fn woken(&mut self) {
        self.signalled.woken();
    }

    fn answered(&mut self) {
        self.signalled.answered();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_clusters_replication_is_read_per_master() {
        let section = |role: &str, n: u32| {
            format!("# Replication\r\nrole:{role}\r\nconnected_slaves:{n}\r\n")
        };
        let nodes = |ns: &[(&str, &str, u32)]| {
            ns.iter()
                .map(|(node, role, n)| (node.to_string(), section(role, *n)))
                .collect::<std::collections::HashMap<_, _>>()
        };
        let bare = cluster_replication(&nodes(&[
            ("a:1", "master", 1),
            ("b:2", "master", 0),
            ("c:3", "slave", 0),
        ]));
        assert_eq!(
            bare.value.as_deref(),
            Ok("2 masters, 1 without a replica (b:2)")
        );
        assert!(bare.warning.is_some_and(|w| w.contains("cannot fail over")));
        let covered = cluster_replication(&nodes(&[("a:1", "master", 1), ("b:2", "master", 2)]));
        assert_eq!(
            covered.value.as_deref(),
            Ok("2 masters, each with a replica")
        );
        assert!(covered.warning.is_some_and(|w| w.contains("asynchronous")));
        assert!(cluster_replication(&nodes(&[("c:3", "slave", 0)]))
            .value
            .is_err());
    }

    #[test]
    fn a_refused_certificate_is_misconfigured_and_a_refused_connection_unavailable() {
        // As the redis client reports a rustls refusal on one server, and
        // as a cluster's first connect passes on its text.
        let io = std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "invalid peer certificate: UnknownIssuer",
        );
        let cluster = RedisError::from((
            redis::ErrorKind::Io,
            "Failed to create initial connections",
            "invalid peer certificate: UnknownIssuer".to_string(),
        ));
        for e in [RedisError::from(io), cluster] {
            match map_err("a:1", e) {
                Error::Misconfigured { message, .. } => {
                    assert!(
                        message.contains("TLS") && message.contains("ca_file"),
                        "{message}"
                    )
                }
                other => panic!("{other:?}"),
            }
        }
        let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        assert!(map_err("a:1", RedisError::from(refused)).is_retryable());
    }

    #[test]
    fn a_tls_alert_from_the_server_names_the_client_certificate() {
        let io = std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "received fatal alert: CertificateRequired",
        );
        match map_err("a:1", RedisError::from(io)) {
            Error::Misconfigured { message, .. } => {
                assert!(message.contains("tls-auth-clients"), "{message}");
                assert!(!message.contains("ca_file"), "{message}");
            }
            other => panic!("{other:?}"),
        }
    }
}
