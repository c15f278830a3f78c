#![doc = include_str!("../README.md")]

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use distlock_core::wait::{
    jitter, queue_entry_life, wait_for_grant, Outcome, Pace, Wakeup, Wakeups,
};
use distlock_core::{
    async_trait, Backend, Capabilities, Consistency, Error, Fencing, FencingToken, Grant, HoldKind,
    HoldRecord, InputKind, Leader, LockName, LockRequest, LockStatus, Result, TrustedClock,
    Waiting,
};
use distlock_redis::{Attempt, ElectionEntry, QueuePlace, RedisConfig, ReleaseWatch};
use futures_util::future::{join_all, FutureExt};
use futures_util::stream::{FuturesUnordered, StreamExt};
use tokio::time::{timeout, timeout_at, Instant};

mod config;
mod list;
mod node;
mod quorum;

pub use config::RedlockConfig;
use node::Node;
use quorum::{grant_quorum, most_common};

/// Redlock over N independent Redis nodes (N odd, usually 5).
///
/// Cheap to clone. See the crate docs for the algorithm and what it does and
/// does not promise.
#[derive(Clone)]
pub struct RedlockBackend {
    inner: Arc<Inner>,
}

struct Inner {
    nodes: Vec<Node>,
    config: RedlockConfig,
    caps: Capabilities,
}

impl fmt::Debug for RedlockBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedlockBackend")
            .field(
                "nodes",
                &self
                    .inner
                    .nodes
                    .iter()
                    .map(|n| n.endpoint.as_str())
                    .collect::<Vec<_>>(),
            )
            .field("config", &self.inner.config)
            .finish()
    }
}

/// What one node answered.
enum Vote {
    Granted(FencingToken),
    Held(Option<Duration>),
    /// The node stores another limit for this semaphore.
    Mismatch(u32),
    /// The node refused the configuration (a wrong password, missing ACL
    /// rights): `Error::Misconfigured`, which waiting cannot change.
    Refused(Error),
    Down,
}

/// One full Redlock attempt's outcome.
enum Round {
    Granted(FencingToken),
    /// Not granted: the shortest lease left among the holders' nodes, and
    /// whether some nodes granted us (another contender split the vote).
    Contended(Option<Duration>, bool),
}

/// After a release message from one node, how long a waiter waits for the
/// same release to reach the other nodes before it tries anyway.
const SETTLE: Duration = Duration::from_millis(10);

impl RedlockBackend {
    /// Connects to `redlock://[user:pass@]host:port,host:port,...`, with the
    /// options of [`RedlockConfig`] as query parameters.
    pub async fn connect(url: &str) -> Result<Self> {
        Self::connect_with(url, RedlockConfig::default()).await
    }

    /// [`connect`](Self::connect) with options; URL parameters override them.
    pub async fn connect_with(url: &str, config: RedlockConfig) -> Result<Self> {
        let backend = Self::unconnected(url, config).await?;
        // Connect eagerly (and learn run ids) where nodes answer; the others
        // are retried on every request. Nodes that are down may come up, but
        // when every node refuses the configuration no request can succeed,
        // and when none answers at all (mistyped addresses, the nodes down)
        // the client is as unreachable as a single server's would be.
        let t = backend.connect_timeout();
        let connected = join_all(backend.inner.nodes.iter().map(|n| timeout(t, n.redis()))).await;
        // A node that is another under a second address is refused first.
        let mut refusals = Vec::new();
        let (mut answered, mut down) = (0, 0);
        for c in connected {
            match c {
                Ok(Err(e @ Error::InvalidInput { .. })) => return Err(e),
                Ok(Err(e @ Error::Misconfigured { .. })) => {
                    tracing::warn!(error = %e, "a redlock node refused the configuration; it counts for no quorum until it accepts it");
                    refusals.push(e);
                }
                Ok(Ok(_)) => answered += 1,
                _ => down += 1,
            }
        }
        let total = backend.inner.nodes.len();
        // Fewer than a majority can grant nothing: as unreachable as a
        // single server that does not answer (a caller that waits connects
        // again while its wait lasts).
        let majority = grant_quorum(total, 1);
        if answered >= majority {
            return Ok(backend);
        }
        // So many refuse that no majority is left, whoever comes up.
        if answered + down < majority {
            return Err(refused_by(refusals, down, total));
        }
        Err(Error::unavailable(
            "redlock",
            format!(
                "{answered} of {total} nodes answered at connect, fewer than the {majority} a lock needs ({down} unreachable, {} refusing the configuration); check the nodes' addresses, or that they run",
                refusals.len()
            ),
            None,
        ))
    }

    /// The backend `url` describes, its nodes not connected yet.
    async fn unconnected(url: &str, mut config: RedlockConfig) -> Result<Self> {
        let urls = config::parse(url, &mut config)?;
        if urls.len() == 1 {
            tracing::warn!(
                "redlock with a single node: no quorum, no tolerance of a node failure; \
                 the same guarantees as the Redis backend on that server"
            );
        }
        let nodes = Self::nodes(urls, &config);
        distinct_servers(&nodes).await?;
        let caps = Self::declared_capabilities(&config);
        Ok(Self {
            inner: Arc::new(Inner {
                nodes,
                config,
                caps,
            }),
        })
    }

    /// The nodes at `urls`, not connected yet. With `fifo`, every node
    /// keeps the lock's wait queue and knows this client by one id, so a
    /// waiter's entry is the same string on every node.
    fn nodes(urls: Vec<String>, config: &RedlockConfig) -> Vec<Node> {
        let mut node = RedisConfig::default()
            .with_prefix(config.prefix.clone())
            .with_fifo(config.fifo)
            .with_queue_lease(config.queue_lease);
        if config.fifo {
            node = node.with_client_id(distlock_core::Owner::random().to_string());
        }
        let servers = node::Servers::default();
        urls.into_iter()
            .map(|u| Node::new(u, node.clone(), config.delayed_restart, servers.clone()))
            .collect()
    }

    /// What the backend declares for `config`, without connecting (for
    /// `distlock backends`): fencing only with `fencing=true`, and the
    /// delayed-restart quarantine as the longest TTL.
    pub fn declared_capabilities(config: &RedlockConfig) -> Capabilities {
        let max_ttl = config.delayed_restart.unwrap_or(config::DEFAULT_MAX_TTL);
        let fencing = if config.fencing {
            Fencing::BestEffort
        } else {
            Fencing::None
        };
        Capabilities::new(
            "redlock",
            fencing,
            Consistency::Ap,
            Waiting::Notification,
            TrustedClock::Servers,
        )
        .with_ttl_range(config::MIN_TTL, max_ttl)
        .with_drift(config.drift_ppm, config.drift_fixed)
        // A batch is one `extend_many.lua` call per node, all nodes at once.
        .with_extend_batch(512)
        .with_semaphore()
        .with_shared()
        // Campaigns, proclamations and reads of the leader go by quorum;
        // observing polls `leader` (the default `observe_leader`).
        .with_elections()
    }

    /// How many nodes must grant a hold of `kind`: a majority for a lock,
    /// exclusive or shared, more for a semaphore of several permits (see
    /// [`grant_quorum`]). Shared holds need no more than a majority: each
    /// node refuses a writer beside a reader, and a shared hold's majority
    /// and an exclusive one's always share a node.
    fn quorum(&self, kind: &HoldKind) -> usize {
        grant_quorum(self.inner.nodes.len(), kind.object().holders())
    }

    /// What to tell a caller who got too few nodes.
    fn quorum_hint(kind: &HoldKind, what: &'static str) -> &'static str {
        match kind {
            HoldKind::Permits { limit } if *limit > 1 => {
                "a semaphore of several permits needs more nodes than a lock (see the Semaphores section of the distlock-redlock README), and nodes down, slow or quarantined after a restart count against it; check the Redis nodes or raise node_timeout_ms"
            }
            _ => what,
        }
    }

    fn connect_timeout(&self) -> Duration {
        self.inner
            .config
            .node_timeout
            .max(Duration::from_millis(500))
    }

    /// How many nodes are currently quarantined after a restart.
    pub fn quarantined_nodes(&self) -> usize {
        self.inner.nodes.iter().filter(|n| n.quarantined()).count()
    }

    /// Deletes the lock key on every node, as an operator would.
    pub async fn evict(&self, name: &LockName) -> Result<bool> {
        let results = join_all(
            self.inner
                .nodes
                .iter()
                .map(|n| async move { n.redis().await?.evict(name).await }),
        )
        .await;
        Ok(results
            .into_iter()
            .filter(|r| matches!(r, Ok(true)))
            .count()
            > 0)
    }

    /// One node's answer to a lock attempt (in the queue at `place`, for a
    /// queued wait); the caller bounds it in time.
    async fn vote(
        &self,
        node: &Node,
        req: &LockRequest,
        how: Attempt,
        place: Option<QueuePlace>,
    ) -> Vote {
        let protect = self.inner.config.delayed_restart;
        if protect.is_some() && node.quarantined() {
            return Vote::Down;
        }
        let fencing = self.inner.config.fencing;
        let ask = async {
            let r = node.redis().await?;
            // Without fencing the token is declared meaningless, so no
            // counter is kept: a plain SET NX PX per node.
            let attempt = async {
                let a = match place {
                    Some(place) => r.attempt_in_queue(req, how, fencing, place).await,
                    None if fencing => r.attempt_in(req, how).await,
                    None => r.attempt_unfenced_in(req, how).await,
                };
                a.map(|a| a.outcome)
            };
            match protect {
                // Same multiplexed connection, so both answers come from the
                // same server incarnation. Boxed: inline, the pair would
                // make every vote's future larger, tracked or not.
                Some(quarantine) => {
                    let checked = Box::pin(async {
                        let (attempt, run) = tokio::join!(attempt, r.server_run());
                        let attempt = attempt?;
                        let (run_id, uptime) = run?;
                        Ok::<_, Error>(
                            node.observe_run_id(run_id, uptime, quarantine)
                                .then_some(attempt),
                        )
                    })
                    .await?;
                    match checked {
                        Some(attempt) => Ok(attempt),
                        None => return Ok(Vote::Down),
                    }
                }
                None => attempt.await,
            }
            .map(|a| match a {
                Outcome::Granted(t) => Vote::Granted(t),
                Outcome::Held(left) => Vote::Held(left),
                Outcome::RetryIn(_) => Vote::Held(None),
            })
        };
        match ask.await {
            Ok(v) => v,
            Err(Error::LimitMismatch { stored, .. }) => Vote::Mismatch(stored),
            Err(e @ Error::Misconfigured { .. }) => {
                tracing::debug!(node = %node.endpoint, error = %e, "redlock node refused the configuration");
                Vote::Refused(e)
            }
            Err(e) => {
                tracing::debug!(node = %node.endpoint, error = %e, "redlock node failed");
                Vote::Down
            }
        }
    }

    /// One round of the algorithm: all nodes at once, within one node
    /// timeout; success needs a quorum (a majority for a lock) and some
    /// validity left.
    async fn round(
        &self,
        req: &LockRequest,
        how: Attempt,
        place: Option<QueuePlace>,
    ) -> Result<Round> {
        if req.kind.holders() == 0 {
            return Err(Error::invalid(
                InputKind::Config,
                "a semaphore needs a limit of at least one permit",
            ));
        }
        // Step 1: the monotonic start instant.
        let start = Instant::now();
        // Step 2: every node concurrently, so a slow node costs at most the
        // node timeout; and no node is waited for once a quorum has
        // granted. All nodes start together, so one deadline for the step
        // bounds each of them like a timer per node would, for one timer.
        let quorum = self.quorum(&req.kind);
        let t = self.inner.config.node_timeout;
        let mut votes: FuturesUnordered<_> = self
            .inner
            .nodes
            .iter()
            .enumerate()
            .map(|(i, n)| self.vote(n, req, how, place).map(move |v| (i, v)))
            .collect();
        let mut tokens = Vec::new();
        let mut mismatched = Vec::new();
        let mut refusals = Vec::new();
        // The nodes whose script ran and refused: nothing to give back there.
        let mut refused = vec![false; self.inner.nodes.len()];
        let mut answered = vec![false; self.inner.nodes.len()];
        let (mut down, mut held, mut left): (usize, usize, Option<Duration>) = (0, 0, None);
        let counted = timeout_at(start + t, async {
            while let Some((i, v)) = votes.next().await {
                answered[i] = true;
                match v {
                    Vote::Granted(t) => tokens.push((i, t)),
                    Vote::Held(l) => {
                        held += 1;
                        left = min_opt(left, l);
                        refused[i] = true;
                    }
                    Vote::Mismatch(stored) => {
                        mismatched.push(stored);
                        refused[i] = true;
                    }
                    // Its script may have run in part before the refused
                    // command: the rollback goes there too.
                    Vote::Refused(e) => refusals.push(e),
                    Vote::Down => down += 1,
                }
                if tokens.len() >= quorum {
                    // The other nodes' answers cannot change the outcome;
                    // they are dropped as in `count_until`. A grant that
                    // still lands on one of them is deleted by the release,
                    // which reaches that node after it on the same
                    // connection.
                    break;
                }
            }
        })
        .await;
        if counted.is_err() {
            // The nodes that did not answer in time count as down, but for
            // those that refused the configuration at their last attempt to
            // connect: they are still connecting, to be refused again.
            for (node, _) in self.inner.nodes.iter().zip(&answered).filter(|(_, a)| !**a) {
                match node.refusal() {
                    Some(e) => refusals.push(e),
                    None => down += 1,
                }
            }
            tracing::debug!(
                slow = votes.len(),
                "redlock nodes did not answer within {t:?}"
            );
        }
        drop(votes);
        // Steps 3-4: a quorum, and validity = TTL - elapsed - drift > 0.
        if tokens.len() >= quorum && self.valid_after(req.ttl, start) {
            if !self.inner.config.fencing {
                // Declared meaningless; a semaphore's script counts anyway.
                return Ok(Round::Granted(FencingToken(0)));
            }
            let (counted, token) = grant_token(&req.kind, &tokens, self.inner.nodes.len());
            let needed = self.write_back_quorum(&req.kind);
            if self.write_back(req, counted, needed).await >= needed
                && self.valid_after(req.ttl, start)
            {
                return Ok(Round::Granted(token));
            }
            self.rollback(req, place, &refused).await;
            return Err(Error::unavailable(
                "redlock",
                "the fencing token could not be written back to enough nodes in time; the hold was released",
                None,
            ));
        }
        // Step 5: failed, so release everywhere, including nodes that seemed
        // to fail: their grant may have happened and only the reply was lost.
        // Only a node that answered with a refusal is left alone: its
        // script ran and granted nothing. A waiting writer's marks stay:
        // they hold new readers back until its next round; a queued waiter
        // keeps its place on every node.
        self.rollback(req, place, &refused).await;
        let total = self.inner.nodes.len();
        // Nodes that refuse the configuration and nodes that store another
        // limit grant nothing whatever the wait: with the nodes that are
        // down, too many of them leave no quorum, and the error names what
        // to fix (the configuration first).
        let barred = refusals.len() + mismatched.len() + down;
        if !refusals.is_empty() && barred > total - quorum {
            return Err(refused_by(refusals, down + mismatched.len(), total));
        }
        if !mismatched.is_empty() && barred > total - quorum {
            // Too few nodes are up and store this limit for a quorum to
            // form: waiting cannot help, set_limit can.
            return Err(Error::LimitMismatch {
                name: req.name.clone(),
                requested: req.kind.holders(),
                stored: most_common(mismatched).unwrap_or(0),
            });
        }
        if down > total - quorum {
            return Err(Error::QuorumNotReached {
                backend: "redlock",
                granted: tokens.len(),
                unreachable: down,
                needed: quorum,
                total,
                hint: Self::quorum_hint(&req.kind, "too many Redis nodes are down, slow or quarantined after a restart; check them or raise node_timeout_ms"),
            });
        }
        if tokens.len() >= quorum {
            return Err(Error::unavailable(
                "redlock",
                format!("a quorum of nodes granted the lock only after {:?}, too late for a TTL of {:?}; use a longer TTL", start.elapsed(), req.ttl),
                None,
            ));
        }
        // Some nodes granted while too many were held for a quorum: a
        // holder on a bare majority (its key lost on a node that
        // restarted, say), a semaphore's holders occupying their nodes, or
        // contenders that each won some nodes in one instant. Not a split
        // to retry at once, which would take and roll back the free nodes
        // again and again. A semaphore's waiter waits for a release; a
        // lock's looks again after a random pause of one to four retry
        // delays, not at the refusing keys' end: a contender's key is a
        // TTL away, and its rollback announces nothing.
        let split = !tokens.is_empty() && held <= total - quorum;
        let outvoted = !tokens.is_empty() && !split && place.is_none();
        let left = match req.kind {
            HoldKind::Permits { .. } => left,
            _ if outvoted => {
                let delay = self.inner.config.retry_jitter;
                let pause = delay + jitter(delay.saturating_mul(3));
                Some(left.map_or(pause, |l| l.min(pause)))
            }
            _ => left,
        };
        Ok(Round::Contended(left, split))
    }

    /// The answer of a request every node was asked (`Some(yes)`, or
    /// `None` for a node that did not answer): `true` when a quorum said
    /// yes (and `valid`), `false` when too many said no for a quorum to
    /// hold it, else `QuorumNotReached` with `hint`.
    fn verdict(
        &self,
        answers: &[Option<bool>],
        kind: &HoldKind,
        valid: bool,
        hint: &'static str,
    ) -> Result<bool> {
        let yes = answers.iter().filter(|a| **a == Some(true)).count();
        let no = answers.iter().filter(|a| **a == Some(false)).count();
        let (quorum, total) = (self.quorum(kind), self.inner.nodes.len());
        if yes >= quorum && valid {
            return Ok(true);
        }
        if no > total - quorum {
            // Too many said "not yours" for a quorum to hold it: it is gone.
            return Ok(false);
        }
        Err(Error::QuorumNotReached {
            backend: "redlock",
            granted: yes,
            unreachable: total - yes - no,
            needed: quorum,
            total,
            hint,
        })
    }

    fn valid_after(&self, ttl: Duration, start: Instant) -> bool {
        start.elapsed() < self.inner.caps.safe_validity(ttl)
    }

    /// Release notifications from every node that answers; a node whose
    /// pub/sub fails only costs its notifications.
    async fn watch_releases(
        &self,
        req: &LockRequest,
        queued: bool,
    ) -> Vec<distlock_redis::ReleaseWatch> {
        let t = self.connect_timeout();
        join_all(self.inner.nodes.iter().map(|n| async move {
            let r = timeout(t, n.redis()).await.ok()?.ok()?;
            timeout(t, r.watch_for(req, queued)).await.ok()?.ok()
        }))
        .await
        .into_iter()
        .flatten()
        .collect()
    }

    /// Fencing: raise the nodes' counters to the token. Any later quorum
    /// overlaps the nodes raised in at least one node, whose INCR then
    /// returns more than this token, so the next token is higher. Returns
    /// how many nodes confirmed, as soon as `needed` have.
    ///
    /// An election's write-back also stores the token in the leader hash
    /// of each node where the campaigner leads, and a node confirms only
    /// if it did: once a majority stores the grant's token, any majority
    /// of nodes listing the leader includes one of them, which is how
    /// [`leader`](Backend::leader) reports the grant's token.
    async fn write_back(&self, req: &LockRequest, token: FencingToken, needed: usize) -> usize {
        let deadline = Instant::now() + self.inner.config.node_timeout;
        let mut answers: FuturesUnordered<_> = self
            .inner
            .nodes
            .iter()
            .map(|n| async move {
                let raise = async {
                    let r = n.redis().await?;
                    match req.kind {
                        HoldKind::Permits { .. } => {
                            r.raise_permit_fence(&req.name, token).await.map(|()| true)
                        }
                        HoldKind::Leader => r.settle_election(req, token).await,
                        _ => r.raise_fence(&req.name, token).await.map(|()| true),
                    }
                };
                matches!(raise.await, Ok(true))
            })
            .collect();
        // The rest are dropped unanswered (see `count_until`).
        count_until(&mut answers, needed, deadline).await
    }

    /// How many nodes a token must be written back to. A lock: a majority
    /// (two majorities of the same nodes cannot be disjoint). A semaphore
    /// whose grants need q of M nodes: M - q + 1, the fewest that every
    /// later q nodes overlap.
    fn write_back_quorum(&self, kind: &HoldKind) -> usize {
        match kind {
            HoldKind::Permits { .. } => self.inner.nodes.len() + 1 - self.quorum(kind),
            _ => self.quorum(kind),
        }
    }

    /// Releases the hold on every node but those that `refused` it, and
    /// keeps a writer's marks (and with `place`, the waiter's place in each
    /// node's queue), each node bounded by the node timeout.
    async fn rollback(&self, req: &LockRequest, place: Option<QueuePlace>, refused: &[bool]) {
        let t = self.inner.config.node_timeout;
        let nodes = self.inner.nodes.iter().zip(refused);
        join_all(nodes.filter(|(_, no)| !**no).map(|(n, _)| async move {
            let rel = async {
                let r = n.redis().await?;
                match place {
                    Some(place) => r.rollback_in_queue(req, place).await,
                    None => r.rollback(req).await,
                }
            };
            let _ = timeout(t, rel).await;
        }))
        .await;
    }

    /// Removes a writer's marks and a waiter's queue entries from every
    /// node, each bounded by the node timeout; those that fail lapse (a
    /// mark with the writer's TTL, an entry with its life).
    async fn unmark_all(&self, req: &LockRequest) {
        let t = self.inner.config.node_timeout;
        join_all(self.inner.nodes.iter().map(|n| async move {
            let unmark = async { n.redis().await?.leave_queue(req).await };
            let _ = timeout(t, unmark).await;
        }))
        .await;
    }

    /// Asks every node at once (`ask(inner, i)` for node `i`), each answer
    /// (`None` for a node that failed) counting until one node timeout
    /// from now, and returns the answers in once `decided` holds of them
    /// or all are in. The requests still out finish in a background task
    /// within the same deadline, so that a node that restarted, answering
    /// NOSCRIPT, is sent the script again.
    async fn until_decided<T: Send + 'static>(
        &self,
        ask: impl Fn(Arc<Inner>, usize) -> futures_util::future::BoxFuture<'static, Result<T>>,
        decided: impl Fn(&[Option<T>]) -> bool,
    ) -> Vec<Option<T>> {
        let deadline = Instant::now() + self.inner.config.node_timeout;
        let total = self.inner.nodes.len();
        let mut answers: Vec<Option<T>> = (0..total).map(|_| None).collect();
        let mut pending: FuturesUnordered<_> = (0..total)
            .map(|i| ask(self.inner.clone(), i).map(move |a| (i, a.ok())))
            .collect();
        let _in_time = timeout_at(deadline, async {
            while let Some((i, a)) = pending.next().await {
                answers[i] = a;
                if decided(&answers) {
                    break;
                }
            }
        })
        .await;
        while let Some(Some((i, a))) = pending.next().now_or_never() {
            answers[i] = a;
        }
        if !pending.is_empty() {
            tokio::spawn(timeout_at(deadline, pending.for_each(|_| async {})));
        }
        answers
    }
}

/// Whether `answers` (one per node: `Some(yes)`, or `None` for no answer
/// yet) settle a request that needs `quorum` of `total`: a quorum said yes,
/// or so many said no that the rest are too few for one.
fn decided(answers: impl Iterator<Item = Option<bool>>, quorum: usize, total: usize) -> bool {
    let (mut yes, mut no) = (0, 0);
    for a in answers {
        match a {
            Some(true) => yes += 1,
            Some(false) => no += 1,
            None => {}
        }
    }
    yes >= quorum || no > total - quorum
}

/// Counts the nodes that answered `true`, returning as soon as `enough`
/// have; the answers still to come stay in `answers`. Dropping them is only
/// for requests whose completion on a minority does not matter (a vote, a
/// fencing write-back): a request already queued on its node's connection
/// still runs there, in order with everything sent to that node before and
/// after; but one not yet queued, or one the client would have had to send
/// again (NOSCRIPT after a restart), never runs.
///
/// The answers count only until `deadline` (one node timeout after they
/// were sent: one timer for the step instead of one per node); those not in
/// by then stay in `answers` like the rest.
async fn count_until<F: std::future::Future<Output = bool>>(
    answers: &mut FuturesUnordered<F>,
    enough: usize,
    deadline: Instant,
) -> usize {
    let mut yes = 0;
    let _in_time = timeout_at(deadline, async {
        while let Some(ok) = answers.next().await {
            yes += usize::from(ok);
            if yes >= enough {
                break;
            }
        }
    })
    .await;
    yes
}

/// The error for a Redlock client whose configuration `refusals` (each an
/// `Error::Misconfigured` from one node), with `others` nodes down or
/// storing another limit, keep from a quorum of its `total` nodes: the
/// first node's, saying how many refused.
fn refused_by(refusals: Vec<Error>, others: usize, total: usize) -> Error {
    let count = refusals.len();
    match refusals.into_iter().next() {
        Some(Error::Misconfigured {
            message, source, ..
        }) => Error::misconfigured(
            "redlock",
            format!("{count} of {total} nodes refused the configuration ({others} more down or storing another limit), too many for a quorum; {message}"),
            source,
        ),
        Some(other) => other,
        None => Error::misconfigured("redlock", "no node accepted the configuration", None),
    }
}

fn min_opt(a: Option<Duration>, b: Option<Duration>) -> Option<Duration> {
    match (a, b) {
        (Some(x), Some(y)) => Some(x.min(y)),
        (x, None) => x,
        (None, y) => y,
    }
}

#[async_trait]
impl Backend for RedlockBackend {
    fn capabilities(&self) -> Capabilities {
        self.inner.caps.clone()
    }

    async fn try_acquire(&self, req: &LockRequest) -> Result<Option<Grant>> {
        let began = Instant::now();
        match self.round(req, Attempt::Once, None).await? {
            Round::Granted(t) => Ok(Some(Grant::new(t, began))),
            Round::Contended(..) => Ok(None),
        }
    }

    async fn acquire(&self, req: &LockRequest, deadline: Option<Instant>) -> Result<Grant> {
        // With `fifo`, every waiter (for a lock, exclusive or shared, a
        // permit or a leadership) queues on every node at one place: its
        // wall-clock time now, so that every node orders the waiters alike
        // (skewed clocks only reorder, never admit two).
        let queued = self.inner.config.fifo;
        let order = queued.then(wall_clock_micros);
        let mut wakeups = NodeWatches {
            backend: self,
            req,
            queued,
            watches: None,
        };
        let retry_jitter = self.inner.config.retry_jitter;
        let pace = Pace::notified(Duration::from_millis(200));
        let tried = &AtomicBool::new(false);
        let mut end = WaitEnd {
            backend: self,
            req,
            tried,
            done: false,
            spawner: distlock_core::completion::Spawner::here(),
        };
        let granted = wait_for_grant(&req.name, deadline, pace, &mut wakeups, || async move {
            let how = if tried.swap(true, Ordering::Relaxed) {
                Attempt::LaterOfWait
            } else {
                Attempt::FirstOfWait
            };
            let place = order.map(|order| QueuePlace {
                order,
                life: queue_entry_life(self.inner.config.queue_lease, deadline),
            });
            Ok(match self.round(req, how, place).await? {
                Round::Granted(t) => Outcome::Granted(t),
                // Another contender took some nodes in the same instant: a
                // random delay, so the two do not split the vote again in
                // lockstep (the Redlock paper's retry delay). A queued
                // waiter instead keeps its place and is woken when it is
                // first.
                Round::Contended(_, true) if !queued => Outcome::RetryIn(jitter(retry_jitter)),
                Round::Contended(left, _) => Outcome::Held(left),
            })
        })
        .await;
        // A wait that ends without a grant takes its marks and queue
        // entries away now. After a grant, a mark left on a node the grant
        // did not count holds back no reader the writer does not hold back
        // anyway; the release removes it (and a queue entry left there)
        // from every node, or it lapses.
        if granted.is_err() {
            end.leave().await;
        }
        end.done = true;
        granted
    }

    /// Returns once a quorum has answered either way (the other nodes'
    /// renewals finish in the background, as a release's do): a node that
    /// is down or slow costs a renewal nothing while a majority answers.
    async fn extend(&self, req: &LockRequest) -> Result<bool> {
        let start = Instant::now();
        let (quorum, total) = (self.quorum(&req.kind), self.inner.nodes.len());
        let req = Arc::new(req.clone());
        let answers = self
            .until_decided(
                |inner, i| {
                    let req = req.clone();
                    async move { inner.nodes[i].redis().await?.extend(&req).await }.boxed()
                },
                |answers| decided(answers.iter().copied(), quorum, total),
            )
            .await;
        self.verdict(
            &answers,
            &req.kind,
            self.valid_after(req.ttl, start),
            Self::quorum_hint(&req.kind, "extend could not reach a majority; the guard reports lost() if this lasts until its deadline"),
        )
    }

    /// The batch goes to every node at once (one script call each, two
    /// when it mixes locks and permits), and returns once a quorum has
    /// answered either way for every hold; then each hold is judged as
    /// `extend` judges it: extended where a quorum extended it within its
    /// validity, not ours where too many said no for a quorum.
    /// A lock with neither fails the whole batch; core's renewer then asks
    /// for each hold alone, so one lock whose nodes are down does not fail
    /// the renewal of others held on nodes that answer.
    async fn extend_many(&self, reqs: &[LockRequest]) -> Result<Vec<bool>> {
        let start = Instant::now();
        let total = self.inner.nodes.len();
        let quorums: Vec<usize> = reqs.iter().map(|r| self.quorum(&r.kind)).collect();
        let batch: Arc<[LockRequest]> = reqs.into();
        let answers = self
            .until_decided(
                |inner, i| {
                    let batch = batch.clone();
                    async move {
                        let a = inner.nodes[i].redis().await?.extend_many(&batch).await?;
                        if a.len() == batch.len() {
                            Ok(a)
                        } else {
                            Err(Error::backend(
                                "redlock",
                                "a renewal answered for another number of holds",
                            ))
                        }
                    }
                    .boxed()
                },
                |answers: &[Option<Vec<bool>>]| {
                    quorums.iter().enumerate().all(|(i, q)| {
                        decided(answers.iter().map(|a| a.as_ref().map(|a| a[i])), *q, total)
                    })
                },
            )
            .await;
        let mut out = Vec::with_capacity(reqs.len());
        for (i, req) in reqs.iter().enumerate() {
            let quorum = quorums[i];
            let said = |v: bool| answers.iter().flatten().filter(|a| a[i] == v).count();
            let (yes, no) = (said(true), said(false));
            if yes >= quorum && self.valid_after(req.ttl, start) {
                out.push(true);
            } else if no > total - quorum {
                out.push(false);
            } else {
                return Err(Error::QuorumNotReached {
                    backend: "redlock",
                    granted: yes,
                    unreachable: total - yes - no,
                    needed: quorum,
                    total,
                    hint: Self::quorum_hint(&req.kind, "a batched renewal could not reach a majority; the guards report lost() if this lasts until their deadlines"),
                });
            }
        }
        Ok(out)
    }

    /// Returns once a quorum has released. The other nodes' releases
    /// finish in a background task: a node that restarted answers the
    /// script call with NOSCRIPT and needs the script sent again, which a
    /// dropped request would never do, leaving the key there until its TTL.
    /// "Not held" once so many nodes answered that they did not hold it
    /// that the others are too few for a quorum; with fewer answers by the
    /// node timeout, whether it was held is unknown: `QuorumNotReached`
    /// (the nodes it reached have freed the key, and the others let it
    /// lapse by its TTL).
    async fn release(&self, req: &LockRequest) -> Result<bool> {
        let deadline = Instant::now() + self.inner.config.node_timeout;
        let quorum = self.quorum(&req.kind);
        let shared = Arc::new((self.inner.clone(), req.clone()));
        let mut answers: FuturesUnordered<_> = (0..self.inner.nodes.len())
            .map(|i| {
                let shared = shared.clone();
                async move {
                    let (inner, req) = &*shared;
                    let rel = async {
                        let r = inner.nodes[i].redis().await?;
                        // With `fifo` the waiter's entry may stay on a
                        // node that refused its last round.
                        if inner.config.fifo {
                            r.release_with_entry(req).await
                        } else {
                            r.release_outside_queue(req).await
                        }
                    };
                    rel.await.ok()
                }
            })
            .collect();
        let total = self.inner.nodes.len();
        let (mut released, mut not_held) = (0, 0);
        let _in_time = timeout_at(deadline, async {
            while let Some(answer) = answers.next().await {
                match answer {
                    Some(true) => released += 1,
                    Some(false) => not_held += 1,
                    None => {}
                }
                if released >= quorum || total - not_held < quorum {
                    break;
                }
            }
        })
        .await;
        // Answers already in need no task (on loopback the last node's
        // usually is); the rest finish in one, within the same deadline.
        while let Some(Some(_)) = answers.next().now_or_never() {}
        if !answers.is_empty() {
            tokio::spawn(timeout_at(deadline, answers.for_each(|_| async {})));
        }
        if released >= quorum {
            Ok(true)
        } else if total - not_held < quorum {
            Ok(false)
        } else {
            Err(Error::QuorumNotReached {
                backend: "redlock",
                granted: released,
                unreachable: total - released - not_held,
                needed: quorum,
                total,
                hint: "the release reached too few nodes to tell whether the lock was still held; the nodes it reached freed it, the others let it lapse by its TTL",
            })
        }
    }

    /// Each node's settings as the Redis backend reads them, each named
    /// after its node: a node that evicts keys or loses them in a restart
    /// can complete a second majority.
    async fn deployment_findings(&self) -> Result<Vec<distlock_core::Finding>> {
        let t = self.connect_timeout().max(Duration::from_secs(2));
        let each = join_all(self.inner.nodes.iter().map(|n| async move {
            let read = async { n.redis().await?.deployment_findings().await };
            let read = tokio::time::timeout(t, read).await.unwrap_or_else(|_| {
                Err(Error::unavailable(
                    "redlock",
                    format!("{} did not answer within {t:?}", n.endpoint),
                    None,
                ))
            });
            match read {
                Ok(found) => found
                    .into_iter()
                    .map(|mut f| {
                        // A node that restarts without its data sits out
                        // the quarantine: its lost locks cost nothing. Its
                        // lost fencing counter does, with fencing on.
                        if f.setting == "persistence" && f.warning.is_some() {
                            if let Some(q) = self.inner.config.delayed_restart {
                                if self.inner.config.fencing {
                                    f.warning = Some(format!(
                                        "delayed_restart_ms ({q:?}) covers the locks a restart loses, not the fencing counters: tokens can go backwards; set appendonly yes"
                                    ));
                                } else {
                                    f.warning = None;
                                    if let Ok(v) = &mut f.value {
                                        v.push_str(&format!(
                                            "; a restart is covered by delayed_restart_ms ({q:?} of quarantine)"
                                        ));
                                    }
                                }
                            }
                        }
                        f.setting = format!("{} {}", n.endpoint, f.setting);
                        f
                    })
                    .collect(),
                Err(e) => vec![distlock_core::Finding::unknown(
                    format!("{} settings", n.endpoint),
                    e.to_string(),
                )],
            }
        }))
        .await;
        Ok(each.into_iter().flatten().collect())
    }

    /// Held when a majority of nodes hold the key (exclusively or shared);
    /// a shared hold counts where a majority of nodes list it, and a
    /// writer waits where a majority of nodes list its mark. The holder
    /// info is the one stored with the owner a majority of nodes hold.
    async fn inspect(&self, name: &LockName) -> Result<LockStatus> {
        let t = self.connect_timeout();
        let answers = join_all(self.inner.nodes.iter().map(|n| async move {
            let r = timeout(t, n.redis()).await.ok()?.ok()?;
            timeout(t, r.lock_holders(name)).await.ok()?.ok()
        }))
        .await;
        let answered: Vec<_> = answers.into_iter().flatten().collect();
        let held: Vec<_> = answered.iter().filter(|s| s.held()).collect();
        let (quorum, total) = (self.quorum(&HoldKind::Exclusive), self.inner.nodes.len());
        // "Not held" needs so many nodes free that no majority can hold it.
        let free = answered.len() - held.len();
        if held.len() < quorum && free <= total - quorum {
            return Err(Error::QuorumNotReached {
                backend: "redlock",
                granted: answered.len(),
                unreachable: total - answered.len(),
                needed: quorum,
                total,
                hint: "too few nodes answered to tell whether a quorum holds the lock; check the Redis nodes",
            });
        }
        let listed_by_quorum = |owners: fn(&distlock_redis::LockHolders) -> &Vec<String>| {
            let mut listed: std::collections::HashMap<&str, usize> = Default::default();
            for owner in answered.iter().flat_map(owners) {
                *listed.entry(owner.as_str()).or_default() += 1;
            }
            listed.values().filter(|n| **n >= quorum).count()
        };
        let readers = listed_by_quorum(|h| &h.readers);
        let writers = listed_by_quorum(|h| &h.writers);
        // The exclusive holder is the stored owner a majority of nodes hold.
        let holder = most_common(held.iter().filter_map(|s| s.holder.as_deref())).filter(|h| {
            held.iter()
                .filter(|s| s.holder.as_deref() == Some(h))
                .count()
                >= quorum
        });
        let info = holder.and_then(|h| distlock_core::split_stored_owner(h).1);
        let status = LockStatus::new(held.len() >= quorum)
            .with_remaining(held.iter().filter_map(|s| s.remaining()).min())
            .with_shared(readers, writers > 0)
            .with_holder_info(info.map(str::to_string));
        Ok(if self.inner.config.fencing {
            let token = held.iter().map(|s| s.fence).max().filter(|f| *f > 0);
            status.with_token(token.map(FencingToken))
        } else {
            status
        })
    }

    /// A permit counts as held where as many nodes list it as a grant
    /// needs; the limit is the one most nodes store.
    async fn inspect_permits(&self, name: &LockName) -> Result<LockStatus> {
        let t = self.connect_timeout();
        let answers = join_all(self.inner.nodes.iter().map(|n| async move {
            let read = async { n.redis().await?.permit_holders(name).await };
            timeout(t, read).await.ok()
        }))
        .await;
        // A node that refused the configuration (its limit key holds
        // another application's data, say) is not down: with too few
        // answers its refusal is the error.
        let mut refusals = Vec::new();
        let mut answered = Vec::new();
        for answer in answers.into_iter().flatten() {
            match answer {
                Ok(a) => answered.push(a),
                Err(e @ Error::Misconfigured { .. }) => refusals.push(e),
                Err(_) => {}
            }
        }
        let limit = most_common(answered.iter().filter_map(|(l, _)| *l));
        let kind = HoldKind::Permits {
            limit: limit.unwrap_or(1),
        };
        let (quorum, total) = (self.quorum(&kind), self.inner.nodes.len());
        if answered.len() < quorum && !refusals.is_empty() {
            let others = total - answered.len() - refusals.len();
            return Err(refused_by(refusals, others, total));
        }
        if answered.len() < quorum {
            return Err(Error::QuorumNotReached {
                backend: "redlock",
                granted: answered.len(),
                unreachable: total - answered.len(),
                needed: quorum,
                total,
                hint: "too few nodes answered to tell which permits a quorum holds; check the Redis nodes",
            });
        }
        let mut listed: std::collections::HashMap<&str, usize> = Default::default();
        for owner in answered.iter().flat_map(|(_, owners)| owners) {
            *listed.entry(owner.as_str()).or_default() += 1;
        }
        let holders = listed.values().filter(|n| **n >= quorum).count();
        Ok(LockStatus::new(holders > 0).with_holders(holders, limit))
    }

    /// Sent to every node at once, each bounded by the node timeout; a node
    /// where another owner (or nobody) leads refuses. Accepted when a
    /// majority accepted; refused when so many refused that no majority
    /// can have; otherwise too few nodes answered to tell. A minority that
    /// missed the proclamation keeps the old value: `leader` reports the
    /// value most of the nodes listing the leader hold, so a reader that
    /// reaches few of the nodes that accepted may see the old value until
    /// the next proclamation reaches them.
    async fn proclaim(&self, req: &LockRequest, value: &str) -> Result<bool> {
        let t = self.inner.config.node_timeout;
        let answers = join_all(self.inner.nodes.iter().map(|n| async move {
            let said = async { n.redis().await?.proclaim(req, value).await };
            timeout(t, said).await.ok().and_then(Result::ok)
        }))
        .await;
        self.verdict(
            &answers,
            &HoldKind::Leader,
            true,
            "the proclamation could not reach a majority; check the Redis nodes and proclaim again",
        )
    }

    /// Every node is read at once, each bounded by the connect timeout.
    /// The leader is the owner that a majority of all nodes list as live;
    /// its value is the one most of those nodes hold, its remaining lease
    /// the least among them. With fencing, its token is the grant's, which
    /// the write-back stored on a majority: at least one node of any
    /// majority listing the leader holds it (marked settled); a leader no
    /// listing node has settled is a campaign still writing its token back,
    /// not yet granted, and reported as none. Without fencing the token is
    /// 0. Its holder info is the one stored with its owner. None when no
    /// owner can have a majority; `QuorumNotReached` when too few nodes
    /// answered to tell.
    async fn leader(&self, name: &LockName) -> Result<Option<Leader>> {
        let t = self.connect_timeout();
        let answers = join_all(self.inner.nodes.iter().map(|n| async move {
            let r = timeout(t, n.redis()).await.ok()?.ok()?;
            timeout(t, r.election_entry(name)).await.ok()?.ok()
        }))
        .await;
        let (quorum, total) = (self.quorum(&HoldKind::Leader), self.inner.nodes.len());
        let answered = answers.iter().filter(|a| a.is_some()).count();
        let entries: Vec<ElectionEntry> = answers.into_iter().flatten().flatten().collect();
        let mut listed: HashMap<&str, usize> = HashMap::new();
        for e in &entries {
            *listed.entry(e.owner.as_str()).or_default() += 1;
        }
        let top = listed
            .iter()
            .max_by_key(|(_, n)| **n)
            .map(|(o, n)| (*o, *n));
        let owner = match top {
            Some((owner, n)) if n >= quorum => owner,
            // No owner is listed by a majority; "nobody leads" needs so many
            // answers that none could be, counting the silent nodes for it.
            _ => {
                let most = top.map_or(0, |(_, n)| n);
                if most + (total - answered) >= quorum {
                    return Err(Error::QuorumNotReached {
                        backend: "redlock",
                        granted: answered,
                        unreachable: total - answered,
                        needed: quorum,
                        total,
                        hint: "too few nodes answered to tell whether a majority lists a leader; check the Redis nodes",
                    });
                }
                return Ok(None);
            }
        };
        let theirs: Vec<&ElectionEntry> = entries.iter().filter(|e| e.owner == owner).collect();
        let token = if self.inner.config.fencing {
            match theirs
                .iter()
                .filter(|e| e.settled)
                .map(|e| e.leader.token)
                .max()
            {
                Some(token) => token,
                None => return Ok(None),
            }
        } else {
            FencingToken(0)
        };
        let value = most_common(theirs.iter().map(|e| e.leader.value.as_str())).unwrap_or_default();
        let remaining = theirs.iter().filter_map(|e| e.leader.remaining).min();
        let info = distlock_core::split_stored_owner(owner).1;
        // Without fencing every token is 0: the owner tells one leadership
        // from the next with the same value.
        let identity = (!self.inner.config.fencing).then(|| owner.to_string());
        Ok(Some(
            Leader::new(value, token)
                .with_remaining(remaining)
                .with_holder_info(info.map(str::to_string))
                .with_identity(identity),
        ))
    }

    /// On every node, one `SCAN` of the whole keyspace (O(keys)) and one
    /// read-only script call per name found, read in name order until
    /// `limit` records are in; a hold is listed where as many nodes list it
    /// as a grant of its kind needs (see the README's "Holder info and
    /// `list`").
    async fn list(&self, prefix: &str, limit: usize) -> Result<Vec<HoldRecord>> {
        self.list_holds(prefix, limit).await
    }

    /// Stores the limit on every node. A node that misses it keeps the old
    /// limit and refuses requests with the new one (`LimitMismatch`), which
    /// can leave too few nodes for a quorum; so anything short of every
    /// node is an error, to be retried.
    async fn set_limit(&self, name: &LockName, limit: u32) -> Result<Option<u32>> {
        if limit == 0 {
            return Err(Error::invalid(
                InputKind::Config,
                "a semaphore needs a limit of at least one permit",
            ));
        }
        let t = self.connect_timeout();
        self.checked_raise(name, limit).await?;
        let answers = join_all(self.inner.nodes.iter().map(|n| async move {
            let set = async { n.redis().await?.set_limit(name, limit).await };
            timeout(t, set).await.ok()
        }))
        .await;
        let total = answers.len();
        // A node that refused (its limit key holds another application's
        // data, which it leaves as it is) is not down: retrying cannot
        // store the limit there.
        let mut refusals = Vec::new();
        let mut old: Vec<Option<u32>> = Vec::new();
        for answer in answers.into_iter().flatten() {
            match answer {
                Ok(o) => old.push(o),
                Err(e @ Error::Misconfigured { .. }) => refusals.push(e),
                Err(_) => {}
            }
        }
        if !refusals.is_empty() {
            let others = total - old.len() - refusals.len();
            return Err(refused_by(refusals, others, total));
        }
        if old.len() < total {
            return Err(Error::unavailable(
                "redlock",
                format!(
                    "the limit of semaphore `{name}` was stored on {} of {total} nodes; the others keep the old one, so run set_limit again once every node answers",
                    old.len()
                ),
                None,
            ));
        }
        Ok(most_common(old.into_iter().flatten()))
    }
}

impl RedlockBackend {
    /// Refuses a raise of `name`'s limit to `limit` that makes a permit
    /// need more nodes while permits are held: those were granted on the
    /// old, smaller quorum, and beside them the new limit's holders could
    /// number more than `limit` (five nodes, one permit on three of them
    /// raised to three permits on four each: four holders). A lowered
    /// limit needs fewer nodes, which the permits held have.
    async fn checked_raise(&self, name: &LockName, limit: u32) -> Result<()> {
        let t = self.connect_timeout();
        let total = self.inner.nodes.len();
        let before = join_all(self.inner.nodes.iter().map(|n| async move {
            let read = async { n.redis().await?.inspect_permits(name).await };
            timeout(t, read).await.ok()?.ok()
        }))
        .await;
        let Some(current) = most_common(before.iter().flatten().filter_map(|s| s.limit)) else {
            return Ok(());
        };
        let (was, needs) = (grant_quorum(total, current), grant_quorum(total, limit));
        // A permit is granted on `was` nodes, and its release returns once
        // `was` nodes let it go. Fewer nodes than that holding permits are
        // a release's last answers still on their way, or an acquire that
        // did not win; a node that did not answer may hold one.
        let holding = before
            .iter()
            .flatten()
            .filter(|s| s.holders.unwrap_or(0) > 0)
            .count();
        let silent = before.iter().filter(|s| s.is_none()).count();
        let held = holding > 0 && holding + silent >= was;
        if held && needs > was {
            return Err(Error::invalid(
                InputKind::Config,
                format!(
                    "raising the limit of semaphore `{name}` from {current} to {limit} while permits are held: each permit then needs {needs} of {total} nodes instead of {was}, and beside the permits held on {was} more than {limit} could hold at once; release them first, or raise it to a limit that needs {was} nodes"
                ),
            ));
        }
        Ok(())
    }
}

/// Refuses two nodes that resolve to one address (`localhost:6379` and
/// `127.0.0.1:6379`): the text check in the URL parser cannot see that. A
/// node whose name does not resolve now is left to fail like any
/// unreachable node.
async fn distinct_servers(nodes: &[Node]) -> Result<()> {
    let endpoints: Vec<&str> = nodes.iter().map(|n| n.endpoint.as_str()).collect();
    let resolved = join_all(endpoints.iter().map(|e| async move {
        let (host, port) = config::host_port(e)?;
        let addrs = tokio::net::lookup_host((host.as_str(), port)).await.ok()?;
        Some(addrs.collect::<Vec<std::net::SocketAddr>>())
    }))
    .await;
    for (i, a) in resolved.iter().enumerate() {
        for (j, b) in resolved.iter().enumerate().take(i) {
            if let (Some(a), Some(b)) = (a, b) {
                if a.iter().any(|x| b.contains(x)) {
                    return Err(config::duplicate(endpoints[i], endpoints[j], "address"));
                }
            }
        }
    }
    Ok(())
}

/// What a wait may leave on the nodes until it lapses: an exclusive
/// request's writer marks, and with `fifo` any waiter's queue entries. A
/// wait that ends without a grant removes them; one cancelled (dropped)
/// removes them in a task of its own.
struct WaitEnd<'a> {
    backend: &'a RedlockBackend,
    req: &'a LockRequest,
    /// Whether a round ran, which may have left a mark or an entry.
    tried: &'a AtomicBool,
    done: bool,
    /// Where the leaving runs if the wait is dropped unfinished.
    spawner: distlock_core::completion::Spawner,
}

impl WaitEnd<'_> {
    fn left_something(&self) -> bool {
        (self.req.kind == HoldKind::Exclusive || self.backend.inner.config.fifo)
            && self.tried.load(Ordering::Relaxed)
    }

    async fn leave(&mut self) {
        if self.left_something() {
            self.backend.unmark_all(self.req).await;
        }
        self.done = true;
    }
}

impl Drop for WaitEnd<'_> {
    fn drop(&mut self) {
        if self.done || !self.left_something() {
            return;
        }
        let (backend, req) = (self.backend.clone(), self.req.clone());
        self.spawner
            .spawn(async move { backend.unmark_all(&req).await });
    }
}

/// Microseconds of the wall clock since the Unix epoch: a queued Redlock
/// waiter's place on every node.
fn wall_clock_micros() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}

/// Wake-ups from the nodes' pub/sub channels, subscribed once a round is
/// refused. A wake-up is a release heard from a majority of the nodes that
/// can say (or one heard and then [`SETTLE`]), so the next round does not
/// find the other nodes still held and split against itself.
struct NodeWatches<'a> {
    backend: &'a RedlockBackend,
    req: &'a LockRequest,
    /// A queued waiter listens on its client's own channel of the lock on
    /// each node, where a release tells only the queue's head.
    queued: bool,
    watches: Option<Vec<ReleaseWatch>>,
}

impl Wakeups for NodeWatches<'_> {
    fn arm(&mut self) -> Option<Wakeup> {
        let watches = self.watches.as_ref().filter(|w| !w.is_empty())?;
        let need = self.backend.quorum(&self.req.kind).min(watches.len());
        let mut heard: FuturesUnordered<_> = watches.iter().map(ReleaseWatch::next).collect();
        Some(Box::pin(async move {
            // A node whose pub/sub connection ended wakes the waiter to
            // re-check at once; from then on its TTL is the fallback.
            if heard.next().await != Some(true) {
                return;
            }
            let mut count = 1;
            if count >= need {
                return;
            }
            let _ = timeout(SETTLE, async {
                while let Some(alive) = heard.next().await {
                    count += 1;
                    if !alive || count >= need {
                        return;
                    }
                }
            })
            .await;
        }))
    }

    /// Ready before the first round when every node's watch is already
    /// subscribed (a waiter of this client listened there a moment ago), so
    /// that a refused first round sleeps instead of going round once more.
    async fn ready(&mut self) -> Result<bool> {
        let (req, queued) = (self.req, self.queued);
        let all = self
            .backend
            .inner
            .nodes
            .iter()
            .all(|n| n.connected().is_some_and(|r| r.watching(req, queued)));
        if !all {
            return Ok(false);
        }
        self.prepare().await?;
        Ok(self
            .watches
            .as_ref()
            .is_some_and(|w| w.len() == self.backend.inner.nodes.len()))
    }

    async fn prepare(&mut self) -> Result<()> {
        match &mut self.watches {
            Some(w) => w.retain(ReleaseWatch::alive),
            None => {
                self.watches = Some(self.backend.watch_releases(self.req, self.queued).await);
            }
        }
        Ok(())
    }
}

/// The counter value a granting round writes back, and the grant's token,
/// from the `(node index, INCR answer)` of each granting node among
/// `nodes`. The value is the largest answer. A lock's, a shared hold's or
/// a campaign's token is that value: two such grants never overlap, and
/// the write-back makes every later one larger. Permits of one semaphore
/// overlap, and two rounds running together can see the same largest
/// answer (from different nodes: a node's `INCR` answers each value once),
/// so a permit's token is `value * nodes + i`, `i` the lowest index of the
/// nodes that answered `value`: unique among overlapping permits, and
/// still below every later grant's, whose value is larger.
fn grant_token(
    kind: &HoldKind,
    votes: &[(usize, FencingToken)],
    nodes: usize,
) -> (FencingToken, FencingToken) {
    let Some((value, std::cmp::Reverse(first))) =
        votes.iter().map(|&(i, t)| (t, std::cmp::Reverse(i))).max()
    else {
        return (FencingToken(0), FencingToken(0));
    };
    let token = match kind {
        HoldKind::Permits { .. } => FencingToken(
            value
                .0
                .saturating_mul(nodes as u64)
                .saturating_add(first as u64),
        ),
        _ => value,
    };
    (value, token)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two permit rounds running together on three nodes, reaching them in
    /// different orders, both see 2 as the largest answer (from different
    /// nodes); their tokens differ, and a later round, whose largest answer
    /// is above 2, gets a token above both. A lock's token is the answer.
    #[test]
    fn overlapping_permits_get_distinct_tokens_below_every_later_grant() {
        let permit = HoldKind::Permits { limit: 2 };
        let t = |v: &[(usize, u64)]| {
            let votes: Vec<_> = v.iter().map(|&(i, t)| (i, FencingToken(t))).collect();
            grant_token(&permit, &votes, 3)
        };
        let (a_value, a) = t(&[(0, 1), (1, 2), (2, 1)]);
        let (b_value, b) = t(&[(0, 2), (1, 1), (2, 2)]);
        assert_eq!((a_value, b_value), (FencingToken(2), FencingToken(2)));
        assert_ne!(a, b);
        let (_, later) = t(&[(0, 3), (1, 3), (2, 3)]);
        assert!(later > a && later > b, "{later} after {a} and {b}");
        let lock = grant_token(
            &HoldKind::Exclusive,
            &[(0, FencingToken(5)), (2, FencingToken(7))],
            3,
        );
        assert_eq!(lock, (FencingToken(7), FencingToken(7)));
    }

    /// Nothing listens on these ports: the check is at connect, before any
    /// node is asked anything.
    #[tokio::test]
    async fn one_server_under_two_names_is_refused_naming_both() {
        let err = RedlockBackend::connect("redlock://localhost:1,127.0.0.1:1,127.0.0.1:2")
            .await
            .map(|_| ())
            .unwrap_err();
        let text = err.to_string();
        assert!(matches!(err, Error::InvalidInput { .. }), "{err:?}");
        assert!(
            text.contains("localhost:1") && text.contains("127.0.0.1:1"),
            "{text}"
        );
        let err = RedlockBackend::connect("redlock://A:1,a:1")
            .await
            .map(|_| ())
            .unwrap_err();
        assert!(err.to_string().contains("A:1"), "{err}");
        // Distinct ports of one host are distinct servers.
        assert!(distinct_servers(
            &config::parse(
                "redlock://127.0.0.1:1,127.0.0.1:2",
                &mut RedlockConfig::default()
            )
            .unwrap()
            .into_iter()
            .map(|u| Node::new(u, RedisConfig::default(), None, Default::default()))
            .collect::<Vec<_>>()
        )
        .await
        .is_ok());
    }
}
