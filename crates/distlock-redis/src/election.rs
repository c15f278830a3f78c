//! Elections ([`HoldKind::Leader`](distlock_core::HoldKind::Leader)): one
//! leader hash per election, holding the leader's owner, value and token
//! and expiring with its lease by the server's clock; the scripts that
//! campaign, renew, resign, proclaim and read it, the wait for it, and
//! the observers notified on the election's channel.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use distlock_core::wait::{wait_for_grant, Outcome, Pace};
use distlock_core::{
    split_stored_owner, Error, FencingToken, Grant, Leader, LeaderStream, LockName, LockRequest,
    Result, LEADER_POLL,
};
use futures_util::stream::{self, StreamExt};
use redis::Value;
use tokio::time::Instant;

use crate::queue::QueueUse;
use crate::rwlock::{held_for, Removal};
use crate::scripts::{ElectionKeys, Scripts};
use crate::subscriber::Wake;
use crate::{owner_arg, ttl_ms, Channel, RedisBackend, ReleaseWatch, Subscribed};

/// One server's entry for an election
/// ([`RedisBackend::election_entry`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ElectionEntry {
    /// The stored owner that leads on this server: the owner and its
    /// holder info ([`distlock_core::stored_owner`]).
    pub owner: String,
    /// Its value, the token this server stores and the lease left here.
    pub leader: Leader,
    /// Whether Redlock's fencing write-back stored the grant's token here
    /// ([`RedisBackend::settle_election`]).
    pub settled: bool,
}

impl RedisBackend {
    /// The keys used for the election `name`.
    pub fn election_keys(&self, name: &LockName) -> ElectionKeys {
        ElectionKeys::new(&self.inner.config.prefix, name)
    }

    /// One `election_acquire.lua` call: the token, with the campaign's
    /// value stored by the same call, or how long the leader has left.
    /// With [`RedisConfig::fifo`](crate::RedisConfig::fifo), as a try:
    /// refused while campaigners are queued.
    pub(crate) async fn attempt_leader(&self, req: &LockRequest) -> Result<Outcome> {
        let queue = if self.inner.config.fifo {
            QueueUse::Try
        } else {
            QueueUse::None
        };
        self.attempt_leader_in(req, queue).await
    }

    /// [`attempt_leader`](Self::attempt_leader), treating the election's
    /// wait queue as `queue` says.
    pub(crate) async fn attempt_leader_in(
        &self,
        req: &LockRequest,
        queue: QueueUse,
    ) -> Result<Outcome> {
        self.attempt_leader_at(req, queue, None).await
    }

    /// A refused wait joins the queue at `order` if given, else at the
    /// server's time.
    pub(crate) async fn attempt_leader_at(
        &self,
        req: &LockRequest,
        queue: QueueUse,
        order: Option<u64>,
    ) -> Result<Outcome> {
        let keys = self.election_keys(&req.name);
        let mut inv = Scripts::get().election_acquire.key(&keys.leader);
        inv.key(&keys.fence)
            .arg(owner_arg(req))
            .arg(ttl_ms(req.ttl))
            .arg(req.value.as_deref().unwrap_or_default())
            .arg(&keys.channel);
        let life = self.queue_args(&mut inv, &keys.queue, &keys.queue_ends, req, queue);
        if let (Some(order), Some(_)) = (order, life) {
            inv.arg(order);
        }
        let (answer, acked): (i64, _) = self
            .run_granting(&Scripts::get().election_acquire, &inv)
            .await?;
        if answer >= 1 {
            if acked.is_some() {
                Box::pin(self.await_replicas(req, acked)).await?;
            }
            return Ok(Outcome::Granted(FencingToken(answer.unsigned_abs())));
        }
        if answer == 0 {
            return Err(crate::foreign_data(format!(
                "the leader hash {} holds no token, or the election's fencing counter held a negative number",
                keys.leader
            )));
        }
        Ok(Outcome::Held(QueueUse::bounded(held_for(answer), life)))
    }

    /// Renews each request's leadership, in one script call per batch.
    pub(crate) async fn extend_leaders(&self, reqs: &[&LockRequest]) -> Result<Vec<bool>> {
        if reqs.is_empty() {
            return Ok(Vec::new());
        }
        let mut inv = Scripts::get().election_extend.prepare_invoke();
        for req in reqs {
            inv.key(self.election_keys(&req.name).leader)
                .arg(owner_arg(req))
                .arg(ttl_ms(req.ttl));
        }
        self.renewed(&inv, "election_extend.lua", reqs.len()).await
    }

    /// Resigns `req`'s leadership if it still leads; with `queued` (a
    /// `fifo` client), the head of the campaigners' queue is told.
    pub(crate) async fn release_leader(&self, req: &LockRequest, queued: bool) -> Result<bool> {
        let what = if queued { Removal::All } else { Removal::Hold };
        self.release_leader_and(req, what).await
    }

    /// One `election_release.lua` call: [`Removal::Hold`] touches no queue;
    /// the others tell the queue's head, [`Removal::Entry`] also removes
    /// `req`'s entry and [`Removal::Requeue`] puts it back at its place
    /// (Redlock).
    pub(crate) async fn release_leader_and(
        &self,
        req: &LockRequest,
        what: Removal,
    ) -> Result<bool> {
        let keys = self.election_keys(&req.name);
        let mut inv = Scripts::get().election_release.key(&keys.leader);
        let queued = !matches!(what, Removal::Hold);
        if queued {
            inv.key(&keys.queue).key(&keys.queue_ends);
        }
        inv.arg(owner_arg(req)).arg(&keys.channel);
        self.removal_args(&mut inv, req, what);
        let n: i64 = self.run(&inv).await?;
        Ok(n == 1)
    }

    /// Replaces the value of `req`'s leadership while `req.owner` leads.
    pub(crate) async fn proclaim_value(&self, req: &LockRequest, value: &str) -> Result<bool> {
        let keys = self.election_keys(&req.name);
        let mut inv = Scripts::get().election_proclaim.key(&keys.leader);
        inv.arg(owner_arg(req)).arg(value).arg(&keys.channel);
        let n: i64 = self.run(&inv).await?;
        Ok(n == 1)
    }

    /// The live leader of `name` by the server's clock, with its value,
    /// token, remaining lease and holder info, in one script call.
    pub(crate) async fn current_leader(&self, name: &LockName) -> Result<Option<Leader>> {
        Ok(self.read_leader(name).await?.map(|(_, leader, _)| leader))
    }

    /// This server's entry for the election `name`, in one script call:
    /// who leads here by this server's clock, with the value, token and
    /// remaining lease it stores. Redlock reads every node with it and
    /// counts the owners.
    pub async fn election_entry(&self, name: &LockName) -> Result<Option<ElectionEntry>> {
        let Some((owner, leader, settled)) = self.read_leader(name).await? else {
            return Ok(None);
        };
        let owner = owner.ok_or_else(|| {
            Error::backend(
                "redis",
                format!(
                    "the leader hash {} lacks an owner; delete it (an operator's eviction)",
                    self.election_keys(name).leader
                ),
            )
        })?;
        Ok(Some(ElectionEntry {
            owner,
            leader,
            settled,
        }))
    }

    /// `election_leader.lua`: the owner (if stored), the leader and whether
    /// its token was settled by Redlock's write-back.
    async fn read_leader(&self, name: &LockName) -> Result<Option<(Option<String>, Leader, bool)>> {
        let keys = self.election_keys(name);
        let inv = Scripts::get().election_leader.key(&keys.leader);
        let answer: Value = self.run(&inv).await?;
        let malformed = || {
            Error::backend(
                "redis",
                format!(
                    "the leader hash {} lacks a value or a token; delete it (an operator's eviction)",
                    keys.leader
                ),
            )
        };
        let items = match answer {
            Value::Array(items) => items,
            other => {
                return Err(Error::backend(
                    "redis",
                    format!("election_leader.lua answered {other:?}"),
                ))
            }
        };
        let text = |v: &Value| match v {
            Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
            Value::SimpleString(s) => Some(s.clone()),
            _ => None,
        };
        match items.as_slice() {
            [Value::Int(-2)] => Ok(None),
            [Value::Int(pttl), value, token, rest @ ..] => {
                let value = text(value).ok_or_else(malformed)?;
                let token = match token {
                    Value::BulkString(b) => std::str::from_utf8(b)
                        .ok()
                        .and_then(|t| t.parse::<u64>().ok()),
                    Value::Int(t) => u64::try_from(*t).ok(),
                    _ => None,
                }
                .filter(|t| *t >= 1)
                .ok_or_else(malformed)?;
                let owner = rest.first().and_then(text);
                let settled = rest.get(1).and_then(text).is_some_and(|s| s == "1");
                // -1: a hash without expiry (written by hand): no end known.
                let remaining = u64::try_from(*pttl).ok().map(Duration::from_millis);
                let info = owner.as_deref().and_then(|o| split_stored_owner(o).1);
                let leader = Leader::new(value, FencingToken(token))
                    .with_remaining(remaining)
                    .with_holder_info(info.map(str::to_string));
                Ok(Some((owner, leader, settled)))
            }
            _ => Err(Error::backend(
                "redis",
                format!("election_leader.lua answered {items:?}"),
            )),
        }
    }

    /// Redlock's fencing write-back for an election: raises the election's
    /// fencing counter to `token` (never lowers it) and, while `req.owner`
    /// leads here, stores `token` as its leadership's token, marked
    /// settled. Returns whether `req.owner` leads here (and so stored it).
    pub async fn settle_election(&self, req: &LockRequest, token: FencingToken) -> Result<bool> {
        let keys = self.election_keys(&req.name);
        let mut inv = Scripts::get().election_settle.key(&keys.leader);
        inv.key(&keys.fence).arg(owner_arg(req)).arg(token.get());
        let n: i64 = self.run(&inv).await?;
        Ok(n == 1)
    }

    /// Subscribes to the election `name`'s messages (a resignation, an
    /// eviction, a proclaimed value), each delivered to every watch of this
    /// client. The subscription is confirmed by the server when this
    /// returns.
    pub async fn watch_election_releases(&self, name: &LockName) -> Result<ReleaseWatch> {
        let channel = self.election_keys(name).channel;
        self.watch_channel(channel, Wake::All).await
    }

    /// Deletes the election's leader hash whoever leads, as an operator
    /// would, and tells its campaigners; the fencing counter stays.
    /// Returns whether someone led.
    pub(crate) async fn evict_leader(&self, name: &LockName) -> Result<bool> {
        let keys = self.election_keys(name);
        let mut inv = Scripts::get().election_evict.key(&keys.leader);
        inv.key(&keys.queue)
            .key(&keys.queue_ends)
            .arg(&keys.channel);
        let n: i64 = self.run(&inv).await?;
        Ok(n == 1)
    }

    /// Campaigns until elected: woken by a resignation or an eviction on
    /// the election's channel, and otherwise tries again when the leader's
    /// lease runs out (an expiry is not announced).
    pub(crate) async fn acquire_leader(
        &self,
        req: &LockRequest,
        deadline: Option<Instant>,
    ) -> Result<Grant> {
        let pace = Pace::notified(Duration::from_millis(100));
        if !self.inner.config.fifo {
            let mut wakeups = Subscribed::new(self, &req.name, Channel::Election);
            return wait_for_grant(&req.name, deadline, pace, &mut wakeups, || {
                self.attempt_leader(req)
            })
            .await;
        }
        let mut wakeups = Subscribed::queued(self, req, Channel::ElectionQueue);
        self.wait_in_queue(req, deadline, pace, &mut wakeups, |queue| {
            self.attempt_leader_in(req, queue)
        })
        .await
    }

    /// Removes the queue entry of `req`'s campaign, which ended without
    /// leading; if it headed the queue of a free election, the new head is
    /// told.
    pub(crate) async fn leave_election_queue(&self, req: &LockRequest) -> Result<()> {
        let keys = self.election_keys(&req.name);
        let mut inv = Scripts::get().election_leave.key(&keys.leader);
        inv.key(&keys.queue)
            .key(&keys.queue_ends)
            .arg(self.queue_entry(req))
            .arg(&keys.channel);
        let _: i64 = self.run(&inv).await?;
        Ok(())
    }

    /// The leaders of `name`, notified: subscribes to the election's
    /// channel first, then reads the leader; after that reads it again on
    /// every message on the channel (a grant, a resignation, an eviction, a
    /// proclaimed value), when the leader's lease runs out (an expiry is
    /// not announced), and at least every
    /// [`observe_recheck`](crate::RedisConfig::observe_recheck). Without a
    /// subscription (refused, or its connection lost and not yet back) it
    /// reads every [`LEADER_POLL`] and subscribes again at most every
    /// `observe_recheck`. Dropping the stream unsubscribes.
    pub(crate) async fn observe_leaders(&self, name: &LockName) -> LeaderStream {
        let mut observer = Observer {
            backend: self.clone(),
            name: name.clone(),
            channel: self.election_keys(name).channel,
            watch: None,
            subscribed_at: None,
            woken: None,
            pause: None,
        };
        observer.subscribe().await;
        stream::unfold(observer, |mut o| async move {
            let item = o.next().await;
            Some((item, o))
        })
        .boxed()
    }
}

/// One observer of an election: its subscription to the election's
/// channel, and the wake-up armed before each read.
struct Observer {
    backend: RedisBackend,
    name: LockName,
    channel: String,
    watch: Option<ReleaseWatch>,
    /// When it last tried to subscribe.
    subscribed_at: Option<Instant>,
    /// The next message on the channel (or the loss of its connection),
    /// registered before the last read, so none published after it is
    /// missed.
    woken: Option<Pin<Box<dyn Future<Output = bool> + Send>>>,
    /// How long to wait for a message before reading anyway; `None` before
    /// the first read.
    pause: Option<Duration>,
}

impl Observer {
    /// Subscribes to the election's channel (with [`Wake::Every`], so a
    /// grant wakes it too); without a subscription it polls.
    async fn subscribe(&mut self) {
        self.watch = None;
        self.subscribed_at = Some(Instant::now());
        self.watch = self
            .backend
            .watch_channel(self.channel.clone(), Wake::Every)
            .await
            .inspect_err(|e| tracing::debug!(error = %e, "no pub/sub; observing by polling"))
            .ok();
    }

    /// Waits for a message, the lease's end or the pause, then reads the
    /// leader, with the next wake-up armed first.
    async fn next(&mut self) -> Result<Option<Leader>> {
        let recheck = self.backend.inner.config.observe_recheck;
        if let Some(pause) = self.pause.take() {
            match self.woken.take() {
                Some(woken) => {
                    tokio::select! {
                        _ = woken => {}
                        () = tokio::time::sleep(pause) => {}
                    }
                }
                None => tokio::time::sleep(pause).await,
            }
        }
        let lost = !self.watch.as_ref().is_some_and(ReleaseWatch::alive);
        let due = self.subscribed_at.is_none_or(|at| at.elapsed() >= recheck);
        if lost && (self.watch.is_some() || due) {
            // A dead connection is replaced at once; a refused subscription
            // is asked again once per recheck.
            self.subscribe().await;
        }
        self.woken = self
            .watch
            .as_ref()
            .map(|w| -> Pin<Box<dyn Future<Output = bool> + Send>> { Box::pin(w.next()) });
        let read = self.backend.current_leader(&self.name).await;
        let every = if self.woken.is_some() && read.is_ok() {
            recheck
        } else {
            LEADER_POLL
        };
        let pause = match &read {
            Ok(Some(l)) => l
                .remaining
                .map_or(every, |r| every.min(r + Duration::from_millis(2))),
            _ => every,
        };
        self.pause = Some(pause);
        read
    }
}
