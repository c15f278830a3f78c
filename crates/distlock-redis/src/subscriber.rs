//! One pub/sub connection per client, shared by all its waiters.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use futures_util::StreamExt;
use redis::aio::PubSubSink;
use redis::RedisResult;
use tokio::sync::{broadcast, Mutex, Notify};

use crate::conn::Conn;

/// The pseudo channel name sent to every waiter when the pub/sub
/// connection ends.
pub(crate) const CONNECTION_LOST: &str = "";

/// The payload `permit_limit.lua` publishes; every other message on a
/// semaphore's channel is one freed permit.
const LIMIT_CHANGED: &str = "limit";

/// Per semaphore channel, the signal its waiters in this client park on.
type PermitWakers = Arc<std::sync::Mutex<HashMap<String, Arc<Notify>>>>;

/// Subscriptions counted per channel; each message is forwarded to waiters
/// as the channel name.
pub(crate) struct Subscriber {
    live: Mutex<Option<Live>>,
    events: broadcast::Sender<Arc<str>>,
    /// Numbers each pub/sub connection, so that a subscription made on a
    /// connection that has since died cannot, when dropped, unsubscribe a
    /// waiter that subscribed again on the new one.
    connections: AtomicU64,
}

struct Live {
    generation: u64,
    sink: PubSubSink,
    counts: HashMap<String, usize>,
    alive: Arc<AtomicBool>,
    permit_wakers: PermitWakers,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Live {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A waiter's subscription; unsubscribes (when it was the last) on drop.
pub(crate) struct Watch {
    pub(crate) rx: broadcast::Receiver<Arc<str>>,
    _subscription: Subscription,
}

/// A semaphore waiter's subscription: one freed permit wakes one waiter of
/// this client (`notify_one`), a changed limit or a lost connection wakes
/// them all.
pub(crate) struct PermitWatch {
    pub(crate) wake: Arc<Notify>,
    alive: Arc<AtomicBool>,
    _subscription: Subscription,
}

impl PermitWatch {
    /// Whether the pub/sub connection behind it still delivers messages.
    pub(crate) fn alive(&self) -> bool {
        self.alive.load(Ordering::Acquire)
    }
}

/// One counted subscription to a channel, given back on drop.
struct Subscription {
    channel: String,
    generation: u64,
    owner: Arc<Subscriber>,
}

impl Drop for Subscription {
    fn drop(&mut self) {
        let (owner, channel) = (self.owner.clone(), std::mem::take(&mut self.channel));
        let generation = self.generation;
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move { owner.unsubscribe(&channel, generation).await });
        }
    }
}

impl Subscriber {
    pub(crate) fn new() -> Arc<Self> {
        Arc::new(Self {
            live: Mutex::new(None),
            events: broadcast::channel(1024).0,
            connections: AtomicU64::new(0),
        })
    }

    /// Subscribes to `channel`; returns once the server has confirmed, so a
    /// release published after this call is never missed.
    pub(crate) async fn watch(self: &Arc<Self>, conn: &Conn, channel: &str) -> RedisResult<Watch> {
        let mut live = self.live.lock().await;
        let l = self.live_connection(&mut live, conn).await?;
        let rx = self.events.subscribe();
        Ok(Watch {
            rx,
            _subscription: self.subscribe(l, channel).await?,
        })
    }

    /// [`Subscriber::watch`] for a semaphore's channel, with wake-one
    /// signalling.
    pub(crate) async fn watch_permits(
        self: &Arc<Self>,
        conn: &Conn,
        channel: &str,
    ) -> RedisResult<PermitWatch> {
        let mut live = self.live.lock().await;
        let l = self.live_connection(&mut live, conn).await?;
        let wake = lock(&l.permit_wakers)
            .entry(channel.to_string())
            .or_default()
            .clone();
        let alive = l.alive.clone();
        Ok(PermitWatch {
            wake,
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
        let current = live.take().filter(|l| l.alive.load(Ordering::Acquire));
        let l = match current {
            Some(l) => l,
            None => self.open(conn).await?,
        };
        Ok(live.insert(l))
    }

    async fn open(&self, conn: &Conn) -> RedisResult<Live> {
        let (sink, mut stream) = conn
            .pubsub_client()
            .await?
            .get_async_pubsub()
            .await?
            .split();
        let alive = Arc::new(AtomicBool::new(true));
        let permit_wakers = PermitWakers::default();
        let (tx, flag, wakers) = (self.events.clone(), alive.clone(), permit_wakers.clone());
        let task = tokio::spawn(async move {
            while let Some(msg) = stream.next().await {
                let channel = msg.get_channel_name();
                if let Some(wake) = lock(&wakers).get(channel) {
                    match msg.get_payload::<String>() {
                        Ok(p) if p == LIMIT_CHANGED => wake.notify_waiters(),
                        _ => wake.notify_one(),
                    }
                }
                let _ = tx.send(Arc::from(channel));
            }
            // The connection is gone (server restart, failover): wake
            // every waiter to re-check now, since the lock's state may
            // have changed; the next subscription opens a new connection.
            flag.store(false, Ordering::Release);
            for wake in lock(&wakers).values() {
                wake.notify_waiters();
            }
            let _ = tx.send(Arc::from(CONNECTION_LOST));
        });
        Ok(Live {
            generation: self.connections.fetch_add(1, Ordering::Relaxed),
            sink,
            counts: HashMap::new(),
            alive,
            permit_wakers,
            task,
        })
    }

    /// Counts one more subscriber of `channel`, subscribing on the server
    /// for the first.
    async fn subscribe(self: &Arc<Self>, l: &mut Live, channel: &str) -> RedisResult<Subscription> {
        let n = l.counts.entry(channel.to_string()).or_insert(0);
        if *n == 0 {
            if let Err(e) = l.sink.subscribe(channel).await {
                l.counts.remove(channel);
                lock(&l.permit_wakers).remove(channel);
                return Err(e);
            }
        }
        if let Some(n) = l.counts.get_mut(channel) {
            *n += 1;
        }
        Ok(Subscription {
            channel: channel.to_string(),
            generation: l.generation,
            owner: self.clone(),
        })
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
            lock(&l.permit_wakers).remove(channel);
            let _ = l.sink.unsubscribe(channel).await;
        }
    }
}

fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}
