//! One pub/sub connection per client, shared by all its waiters.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use std::future::Future;
use std::time::Duration;

use distlock_core::completion::{linger, Lifetime, Spawner};
use distlock_core::wait::{Signal, Signals};
use futures_util::StreamExt;
use redis::aio::PubSubSink;
use redis::RedisResult;
use tokio::sync::Mutex;

use crate::conn::Conn;

/// The payload `permit_release.lua` publishes: one freed permit, which
/// wakes one waiter. Every other message (a released lock, `limit` for a
/// changed limit) wakes every waiter of its channel.
const PERMIT_FREED: &str = "permit";

/// The suffix of a semaphore's channel (see `SemaphoreKeys`).
const SEMAPHORE_CHANNEL: &str = "}:semaphore:released";

/// The payload `election_acquire.lua` publishes: a new leader, which
/// wakes the election's observers only (a campaigner has nothing to try).
pub(crate) const LEADER_GRANTED: &str = "granted";

/// The suffix of an election's channel (see `ElectionKeys`).
const ELECTION_CHANNEL: &str = "}:election:released";

/// How `announce.lua` addresses a message, on the head's client's own
/// channel of the lock, to the waiter at the head of a lock's queue: this,
/// then the waiter's queue entry. Only that waiter wakes; any other message
/// on the channel wakes every queued waiter of the client.
pub(crate) const NEXT_IN_QUEUE: &str = "next ";

/// Subscriptions counted per channel; each message wakes the channel's
/// waiters in this client.
pub(crate) struct Subscriber {
    live: Mutex<Option<Live>>,
    /// Per channel, the waiters woken one at a time by a freed permit; per
    /// `*` and channel, the waiters woken all at once by every message; per
    /// `^` and channel, the queued waiters woken by a message addressed to
    /// nobody, and per `@`, channel and owner, the one a message names.
    signals: Arc<Signals>,
    /// Channels subscribed now (lingering ones too), read without a lock.
    channels: std::sync::atomic::AtomicUsize,
    /// Numbers each pub/sub connection, so that a subscription made on a
    /// connection that has since died cannot, when dropped, unsubscribe a
    /// waiter that subscribed again on the new one.
    connections: AtomicU64,
    /// How long opening the connection, a subscription or an unsubscription
    /// may take before the connection counts as dead: pub/sub replies have
    /// no timeout of their own, and a connection the network stopped
    /// answering would otherwise hold every waiter's subscription for ever.
    timeout: Duration,
    /// Ends the subscriptions' lingers when the subscriber is dropped.
    lifetime: Lifetime,
}

struct Live {
    generation: u64,
    sink: PubSubSink,
    counts: HashMap<String, usize>,
    alive: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Live {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A waiter's subscription; unsubscribes (when it was the last) on drop.
pub(crate) struct Watch {
    signal: Signal,
    /// A queued waiter's own signal: the messages addressed to it.
    own: Option<Signal>,
    alive: Arc<AtomicBool>,
    _subscription: Subscription,
}

impl Watch {
    /// What this subscription's messages wake.
    pub(crate) fn signal(&self) -> &Signal {
        &self.signal
    }

    /// What the messages addressed to this queued waiter wake.
    pub(crate) fn own(&self) -> Option<&Signal> {
        self.own.as_ref()
    }

    /// Whether the pub/sub connection behind it still delivers messages.
    pub(crate) fn alive(&self) -> bool {
        self.alive.load(Ordering::Acquire)
    }

    /// Registers now for the next wake-up (for a queued waiter, also the
    /// next message addressed to it); resolves with whether the connection
    /// still lives (a lost connection wakes every waiter).
    pub(crate) fn next(&self) -> impl Future<Output = bool> + Send + 'static {
        let (woken, alive) = (self.signal.wakeup(), self.alive.clone());
        let own = self.own.as_ref().map(Signal::wakeup);
        async move {
            match own {
                Some(own) => {
                    tokio::select! {
                        () = woken => {}
                        () = own => {}
                    }
                }
                None => woken.await,
            }
            alive.load(Ordering::Acquire)
        }
    }
}

/// How a channel's messages wake the waiters of one subscription.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Wake {
    /// A freed permit wakes one waiter; anything else, all.
    OnePerPermit,
    /// Every message wakes every waiter (Redlock counts them per node),
    /// except an election's grant.
    All,
    /// Every message, an election's grant too, wakes every waiter: an
    /// election's observers.
    Every,
}

/// One counted subscription to a channel, given back on drop.
struct Subscription {
    channel: String,
    generation: u64,
    owner: Arc<Subscriber>,
    /// Where its unsubscription runs, even if dropped outside a runtime.
    spawner: Spawner,
    gives_back: GiveBack,
}

/// What dropping a [`Subscription`] gives back.
#[derive(Clone, Copy, PartialEq, Eq)]
enum GiveBack {
    /// Its count, after the linger; the last one unsubscribes.
    Count,
    /// A subscription the server has not confirmed yet, whose caller went
    /// away: the channel may be subscribed with nobody counted, so it is
    /// unsubscribed unless someone counts on it by then.
    Unconfirmed,
    /// Nothing: the connection was abandoned.
    Nothing,
}

/// How long a channel stays subscribed after its last waiter stopped
/// waiting: a client that waits again soon (a queue's waiters take turns)
/// finds it subscribed, and neither subscribes again nor asks the server
/// once more after subscribing.
const LINGER: std::time::Duration = std::time::Duration::from_secs(2);

impl Drop for Subscription {
    fn drop(&mut self) {
        let (owner, channel) = (self.owner.clone(), std::mem::take(&mut self.channel));
        let generation = self.generation;
        match self.gives_back {
            GiveBack::Count => {
                // The linger does not keep the subscriber: dropped with its
                // client, it takes its connection and subscriptions along.
                let ended = owner.lifetime.ended();
                let owner = Arc::downgrade(&owner);
                self.spawner.spawn(async move {
                    if linger(LINGER, ended).await {
                        if let Some(owner) = owner.upgrade() {
                            owner.unsubscribe(&channel, generation).await;
                        }
                    }
                })
            }
            GiveBack::Unconfirmed => self
                .spawner
                .spawn(async move { owner.unsubscribe_uncounted(&channel, generation).await }),
            GiveBack::Nothing => true,
        };
    }
}

impl Subscriber {
    /// A subscriber whose connection counts as dead when the server takes
    /// longer than `timeout` to answer it.
    pub(crate) fn new(timeout: Duration) -> Arc<Self> {
        Arc::new(Self {
            live: Mutex::new(None),
            signals: Arc::default(),
            channels: std::sync::atomic::AtomicUsize::new(0),
            connections: AtomicU64::new(0),
            timeout,
            lifetime: Lifetime::default(),
        })
    }

    /// `request` on the pub/sub connection, or a timeout error once the
    /// server has taken longer than the subscriber's timeout.
    async fn in_time<T>(&self, request: impl Future<Output = RedisResult<T>>) -> RedisResult<T> {
        tokio::time::timeout(self.timeout, request)
            .await
            .unwrap_or_else(|_| {
                Err(redis::RedisError::from(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!("pub/sub connection: no answer within {:?}", self.timeout),
                )))
            })
    }

    /// Subscribes to `channel`; returns once the server has confirmed, so a
    /// message published after this call is never missed.
    pub(crate) async fn watch(
        self: &Arc<Self>,
        conn: &Conn,
        channel: &str,
        wake: Wake,
    ) -> RedisResult<Watch> {
        let mut live = self.live.lock().await;
        let l = self.live_connection(&mut live, conn).await?;
        let signal = match wake {
            Wake::OnePerPermit => self.signals.get(channel),
            Wake::All => self.signals.get(&format!("*{channel}")),
            Wake::Every => self.signals.get(&format!("!{channel}")),
        };
        let alive = l.alive.clone();
        Ok(Watch {
            signal,
            own: None,
            alive,
            _subscription: self.subscribe(l, channel).await?,
        })
    }

    /// Whether any channel is subscribed now: when not, no waiter can be
    /// ready before its first attempt, and nothing else needs looking at.
    pub(crate) fn any(&self) -> bool {
        self.channels.load(Ordering::Relaxed) > 0
    }

    /// Whether `channel` is subscribed on a live connection now (also in
    /// its lingering time), so that [`watch`](Self::watch) and
    /// [`watch_queued`](Self::watch_queued) would send nothing. `false` when
    /// another task is changing the subscriptions.
    pub(crate) fn subscribed(&self, channel: &str) -> bool {
        self.live.try_lock().is_ok_and(|live| {
            live.as_ref().is_some_and(|l| {
                l.alive.load(Ordering::Acquire) && l.counts.get(channel).is_some_and(|n| *n > 0)
            })
        })
    }

    /// Subscribes a queued waiter, whose queue entry is `owner`, to its
    /// client's own `channel` of the lock: it wakes on the messages
    /// addressed to it and on those addressed to nobody, not on those for
    /// another queued waiter of the client.
    pub(crate) async fn watch_queued(
        self: &Arc<Self>,
        conn: &Conn,
        channel: &str,
        owner: &str,
    ) -> RedisResult<Watch> {
        let mut live = self.live.lock().await;
        let l = self.live_connection(&mut live, conn).await?;
        let signal = self.signals.get(&format!("^{channel}"));
        let own = Some(self.signals.get(&format!("@{channel} {owner}")));
        let alive = l.alive.clone();
        Ok(Watch {
            signal,
            own,
            alive,
            _subscription: self.subscribe(l, channel).await?,
        })
    }

    /// The live pub/sub connection, opened anew if there is none or it died.
    async fn live_connection<'a>(
        &self,
        live: &'a mut Option<Live>,
        conn: &Conn,
    ) -> RedisResult<&'a mut Live> {
        let l = match live.take() {
            Some(l) if l.alive.load(Ordering::Acquire) => l,
            dead => {
                // Its subscriptions went with it: they count no more.
                if let Some(d) = dead {
                    let counted = d.counts.values().filter(|n| **n > 0).count();
                    self.channels.fetch_sub(counted, Ordering::Relaxed);
                }
                self.open(conn).await?
            }
        };
        Ok(live.insert(l))
    }

    async fn open(&self, conn: &Conn) -> RedisResult<Live> {
        let (pubsub, left) = conn.pubsub(self.timeout).await?;
        let (sink, mut stream) = pubsub.split();
        let alive = Arc::new(AtomicBool::new(true));
        let (signals, flag) = (self.signals.clone(), alive.clone());
        // On Sentinel, the connection ends when the client leaves the
        // master it was opened on: the messages of the new master's
        // releases would never reach it.
        let left_master = async move {
            let Some(mut left) = left else {
                return std::future::pending().await;
            };
            if left.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
        };
        let task = tokio::spawn(async move {
            tokio::pin!(left_master);
            loop {
                let msg = tokio::select! {
                    msg = stream.next() => match msg {
                        Some(msg) => msg,
                        None => break,
                    },
                    () = &mut left_master => break,
                };
                let channel = msg.get_channel_name();
                let payload = |want: &str| msg.get_payload::<String>().is_ok_and(|p| p == want);
                let freed = channel.ends_with(SEMAPHORE_CHANNEL) && payload(PERMIT_FREED);
                let granted = channel.ends_with(ELECTION_CHANNEL) && payload(LEADER_GRANTED);
                let text = msg.get_payload::<String>().ok();
                match text.as_deref().and_then(|p| p.strip_prefix(NEXT_IN_QUEUE)) {
                    Some(owner) => {
                        if let Some(s) = signals.find(&format!("@{channel} {owner}")) {
                            s.wake_all();
                        }
                    }
                    None => {
                        if let Some(s) = signals.find(&format!("^{channel}")) {
                            s.wake_all();
                        }
                    }
                }
                if let Some(s) = signals.find(channel) {
                    if freed {
                        s.wake_one();
                    } else {
                        s.wake_all();
                    }
                }
                if !granted {
                    if let Some(s) = signals.find(&format!("*{channel}")) {
                        s.wake_all();
                    }
                }
                if let Some(s) = signals.find(&format!("!{channel}")) {
                    s.wake_all();
                }
            }
            // The connection is gone or left behind (server restart, failover): wake
            // every waiter to re-check now, since the lock's state may
            // have changed; the next subscription opens a new connection.
            flag.store(false, Ordering::Release);
            signals.wake_everyone();
        });
        Ok(Live {
            generation: self.connections.fetch_add(1, Ordering::Relaxed),
            sink,
            counts: HashMap::new(),
            alive,
            task,
        })
    }

    /// Counts one more subscriber of `channel`, subscribing on the server
    /// for the first.
    async fn subscribe(self: &Arc<Self>, l: &mut Live, channel: &str) -> RedisResult<Subscription> {
        let mut subscription = Subscription {
            channel: channel.to_string(),
            generation: l.generation,
            owner: self.clone(),
            spawner: Spawner::here(),
            gives_back: GiveBack::Unconfirmed,
        };
        let n = l.counts.entry(channel.to_string()).or_insert(0);
        if *n == 0 {
            if let Err(e) = self.in_time(l.sink.subscribe(channel)).await {
                l.counts.remove(channel);
                self.abandon(l);
                subscription.gives_back = GiveBack::Nothing;
                return Err(e);
            }
            self.channels.fetch_add(1, Ordering::Relaxed);
        }
        if let Some(n) = l.counts.get_mut(channel) {
            *n += 1;
        }
        subscription.gives_back = GiveBack::Count;
        Ok(subscription)
    }

    /// Unsubscribes `channel`, which a caller that went away may have left
    /// subscribed on the server, unless a subscriber counts on it by now.
    async fn unsubscribe_uncounted(&self, channel: &str, generation: u64) {
        let mut live = self.live.lock().await;
        // A connection given up takes its subscriptions with it.
        let Some(l) = live
            .as_mut()
            .filter(|l| l.generation == generation && l.alive.load(Ordering::Acquire))
        else {
            return;
        };
        if l.counts.get(channel).is_some_and(|n| *n > 0) {
            return;
        }
        l.counts.remove(channel);
        if self.in_time(l.sink.unsubscribe(channel)).await.is_err() {
            self.abandon(l);
        }
    }

    async fn unsubscribe(&self, channel: &str, generation: u64) {
        let mut live = self.live.lock().await;
        let Some(l) = live.as_mut().filter(|l| l.generation == generation) else {
            return;
        };
        let last = match l.counts.get_mut(channel) {
            Some(n) => {
                *n -= 1;
                *n == 0
            }
            None => false,
        };
        if last {
            l.counts.remove(channel);
            self.channels.fetch_sub(1, Ordering::Relaxed);
            if self.in_time(l.sink.unsubscribe(channel)).await.is_err() {
                self.abandon(l);
            }
        }
    }

    /// Gives up on a connection that did not answer a subscription change
    /// in time (the network may have stopped passing its bytes without
    /// closing it): its waiters wake to re-check and subscribe again, on a
    /// new connection.
    fn abandon(&self, l: &mut Live) {
        l.alive.store(false, Ordering::Release);
        l.task.abort();
        self.signals.wake_everyone();
    }
}
