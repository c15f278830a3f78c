//! One pub/sub connection per client, shared by all its waiters.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use futures_util::StreamExt;
use redis::aio::PubSubSink;
use redis::RedisResult;
use tokio::sync::{broadcast, Mutex};

use crate::conn::Conn;

/// The pseudo channel name sent to every waiter when the pub/sub
/// connection ends.
pub(crate) const CONNECTION_LOST: &str = "";

/// Subscriptions counted per channel; each message is forwarded to waiters
/// as the channel name.
pub(crate) struct Subscriber {
    live: Mutex<Option<Live>>,
    events: broadcast::Sender<Arc<str>>,
}

struct Live {
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
    pub(crate) rx: broadcast::Receiver<Arc<str>>,
    channel: String,
    owner: Arc<Subscriber>,
}

impl Drop for Watch {
    fn drop(&mut self) {
        let (owner, channel) = (self.owner.clone(), std::mem::take(&mut self.channel));
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move { owner.unsubscribe(&channel).await });
        }
    }
}

impl Subscriber {
    pub(crate) fn new() -> Arc<Self> {
        Arc::new(Self {
            live: Mutex::new(None),
            events: broadcast::channel(1024).0,
        })
    }

    /// Subscribes to `channel`; returns once the server has confirmed, so a
    /// release published after this call is never missed.
    pub(crate) async fn watch(self: &Arc<Self>, conn: &Conn, channel: &str) -> RedisResult<Watch> {
        let mut live = self.live.lock().await;
        if live
            .as_ref()
            .is_some_and(|l| !l.alive.load(Ordering::Acquire))
        {
            *live = None;
        }
        if live.is_none() {
            let (sink, mut stream) = conn
                .pubsub_client()
                .await?
                .get_async_pubsub()
                .await?
                .split();
            let alive = Arc::new(AtomicBool::new(true));
            let (tx, flag) = (self.events.clone(), alive.clone());
            let task = tokio::spawn(async move {
                while let Some(msg) = stream.next().await {
                    let _ = tx.send(Arc::from(msg.get_channel_name()));
                }
                // The connection is gone (server restart, failover): wake
                // every waiter to re-check now, since the lock's state may
                // have changed; the next subscription opens a new connection.
                flag.store(false, Ordering::Release);
                let _ = tx.send(Arc::from(CONNECTION_LOST));
            });
            *live = Some(Live {
                sink,
                counts: HashMap::new(),
                alive,
                task,
            });
        }
        let rx = self.events.subscribe();
        if let Some(l) = live.as_mut() {
            let n = l.counts.entry(channel.to_string()).or_insert(0);
            if *n == 0 {
                l.sink.subscribe(channel).await?;
            }
            *n += 1;
        }
        Ok(Watch {
            rx,
            channel: channel.to_string(),
            owner: self.clone(),
        })
    }

    async fn unsubscribe(&self, channel: &str) {
        let mut live = self.live.lock().await;
        let Some(l) = live.as_mut() else { return };
        let last = match l.counts.get_mut(channel) {
            Some(n) => {
                *n -= 1;
                *n == 0
            }
            None => false,
        };
        if last {
            l.counts.remove(channel);
            let _ = l.sink.unsubscribe(channel).await;
        }
    }
}
