//! The wait queues of semaphores and elections with `fifo` (the scripts'
//! side is `wait_queue.lua`): how an attempt treats the queue, and a wait
//! that leaves it when it ends without a grant.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use distlock_core::wait::{queue_entry_life, wait_for_grant, Outcome, Pace};
use distlock_core::{Grant, HoldKind, LockRequest, Result};
use tokio::time::Instant;

use crate::{ttl_ms, RedisBackend, Subscribed, WaitEnd};

/// How an attempt treats the wait queue of a semaphore or an election.
#[derive(Clone, Copy, Debug)]
pub(crate) enum QueueUse {
    /// Not at all: a client without `fifo`, or Redlock's nodes.
    None,
    /// A try: refused while live waiters queue ahead.
    Try,
    /// An attempt of a wait: refused, it joins the queue, or renews its
    /// entry there, for this long.
    Wait(Duration),
}

impl QueueUse {
    /// How long a refused attempt sleeps at most: `left` (until a lease
    /// ends), but for a wait in the queue never past a third of its
    /// entry's `life`, so that its next attempt renews the entry in time.
    pub(crate) fn bounded(left: Option<Duration>, life: Option<Duration>) -> Option<Duration> {
        match life {
            Some(life) => Some(left.map_or(life / 3, |l| l.min(life / 3))),
            None => left,
        }
    }
}

impl RedisBackend {
    /// Adds the wait queue `queue` (its entries' ends in `ends`) to a
    /// script call as `queue` says: the two keys, then whether the attempt
    /// waits ('1') or tries ('0'), the entry's life in ms and `req`'s entry.
    /// Answers the entry's life for a wait.
    pub(crate) fn queue_args(
        &self,
        inv: &mut redis::ScriptInvocation<'_>,
        queue: &str,
        ends: &str,
        req: &LockRequest,
        how: QueueUse,
    ) -> Option<Duration> {
        let life = match how {
            QueueUse::None => return None,
            QueueUse::Try => None,
            QueueUse::Wait(life) => Some(life),
        };
        inv.key(queue)
            .key(ends)
            .arg(if life.is_some() { "1" } else { "0" })
            .arg(ttl_ms(life.unwrap_or(self.inner.config.queue_lease)))
            .arg(self.queue_entry(req));
        life
    }

    /// Waits in a wait queue: each attempt (`attempt`, given how to treat
    /// the queue) joins it or renews the entry until granted; a wait that
    /// ends without a grant, or is dropped, leaves the queue.
    pub(crate) async fn wait_in_queue<F, Fut>(
        &self,
        req: &LockRequest,
        deadline: Option<Instant>,
        pace: Pace,
        wakeups: &mut Subscribed<'_>,
        attempt: F,
    ) -> Result<Grant>
    where
        F: Fn(QueueUse) -> Fut,
        Fut: Future<Output = Result<Outcome>>,
    {
        let joined = &AtomicBool::new(false);
        let mut end = WaitEnd::new(self, req, joined);
        let attempt = &attempt;
        let granted = wait_for_grant(&req.name, deadline, pace, wakeups, || async move {
            let life = queue_entry_life(self.inner.config.queue_lease, deadline);
            // Before the attempt: one whose answer is lost, or that is
            // dropped on the way, may have joined.
            joined.store(true, Ordering::Relaxed);
            attempt(QueueUse::Wait(life)).await
        })
        .await;
        end.finish(granted.is_err()).await;
        granted
    }
}

impl RedisBackend {
    /// Releases `req`'s hold without looking at any wait queue: Redlock's
    /// nodes without `fifo` (with it, see
    /// [`release_with_entry`](Self::release_with_entry)).
    pub async fn release_outside_queue(&self, req: &LockRequest) -> Result<bool> {
        match req.kind {
            HoldKind::Permits { .. } => self.release_permit(req, false).await,
            HoldKind::Leader => self.release_leader(req, false).await,
            _ => distlock_core::Backend::release(self, req).await,
        }
    }
}
