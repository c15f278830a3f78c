//! The in-memory reference backend.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::backend::{
    Backend, Capabilities, Consistency, Fencing, LockRequest, LockStatus, TrustedClock, Waiting,
};
use crate::client::lock;
use crate::error::{Error, Result};
use crate::name::LockName;
use crate::token::{FencingToken, Owner};

/// A lock table in this process's memory.
///
/// Clones share one table, so several [`LockClient`](crate::LockClient)s
/// made from clones contend with each other as separate processes would
/// through a server. It is the reference for the conformance suite: strong
/// fencing, notified waiting, expiry by this process's monotonic clock.
/// It protects nothing across processes; use it for tests and demos.
#[derive(Clone, Debug, Default)]
pub struct MemoryBackend {
    table: Arc<Mutex<HashMap<LockName, Entry>>>,
}

#[derive(Debug, Default)]
struct Entry {
    holder: Option<(Owner, Instant)>,
    /// Never reset, not even on release: tokens keep increasing.
    counter: u64,
    released: Arc<Notify>,
}

impl MemoryBackend {
    /// An empty table.
    pub fn new() -> Self {
        Self::default()
    }

    /// Removes the current holder as an operator would; its next renewal is
    /// rejected. Returns whether someone held the lock.
    pub fn evict(&self, name: &LockName) -> bool {
        let mut table = lock(&self.table);
        let Some(e) = table.get_mut(name) else {
            return false;
        };
        let had = e.holder.take().is_some();
        e.released.notify_waiters();
        had
    }

    fn attempt(&self, req: &LockRequest) -> (Option<FencingToken>, Arc<Notify>, Option<Instant>) {
        let now = Instant::now();
        let mut table = lock(&self.table);
        let e = table.entry(req.name.clone()).or_default();
        match e.holder {
            Some((_, expires)) if expires > now => (None, e.released.clone(), Some(expires)),
            _ => {
                e.counter += 1;
                e.holder = Some((req.owner, now + req.ttl));
                (Some(FencingToken(e.counter)), e.released.clone(), None)
            }
        }
    }
}

#[async_trait]
impl Backend for MemoryBackend {
    fn capabilities(&self) -> Capabilities {
        Capabilities::new(
            "memory",
            Fencing::Strong,
            Consistency::Cp,
            Waiting::Notification,
            TrustedClock::Local,
        )
        .with_ttl_range(
            Duration::from_millis(10),
            Duration::from_secs(365 * 24 * 3600),
        )
        .with_extend_batch(1024)
    }

    async fn try_acquire(&self, req: &LockRequest) -> Result<Option<FencingToken>> {
        Ok(self.attempt(req).0)
    }

    async fn acquire(&self, req: &LockRequest, deadline: Option<Instant>) -> Result<FencingToken> {
        let start = Instant::now();
        loop {
            let notify = self.release_signal(req);
            // Registered before the attempt, so a release between the
            // attempt and the wait is not missed.
            let released = notify.notified();
            tokio::pin!(released);
            released.as_mut().enable();
            req.attempt_starting();
            let (token, _, expires) = self.attempt(req);
            if let Some(t) = token {
                return Ok(t);
            }
            let mut wake = expires.unwrap_or_else(Instant::now);
            if let Some(d) = deadline {
                if Instant::now() >= d {
                    return Err(Error::WaitTimeout {
                        name: req.name.clone(),
                        waited: start.elapsed(),
                    });
                }
                wake = wake.min(d);
            }
            tokio::select! {
                () = released => {}
                () = tokio::time::sleep_until(wake) => {}
            }
        }
    }

    async fn extend(&self, req: &LockRequest) -> Result<bool> {
        Ok(Self::extend_in(&mut lock(&self.table), req, Instant::now()))
    }

    async fn extend_many(&self, reqs: &[LockRequest]) -> Result<Vec<bool>> {
        let now = Instant::now();
        let mut table = lock(&self.table);
        Ok(reqs
            .iter()
            .map(|req| Self::extend_in(&mut table, req, now))
            .collect())
    }

    async fn inspect(&self, name: &LockName) -> Result<LockStatus> {
        let now = Instant::now();
        let table = lock(&self.table);
        Ok(match table.get(name) {
            Some(Entry {
                holder: Some((_, expires)),
                counter,
                ..
            }) if *expires > now => LockStatus::new(true)
                .with_token(Some(FencingToken(*counter)))
                .with_remaining(Some(*expires - now)),
            _ => LockStatus::new(false),
        })
    }

    async fn release(&self, req: &LockRequest) -> Result<bool> {
        let now = Instant::now();
        let mut table = lock(&self.table);
        let Some(e) = table.get_mut(&req.name) else {
            return Ok(false);
        };
        match e.holder {
            Some((owner, expires)) if owner == req.owner => {
                e.holder = None;
                e.released.notify_waiters();
                Ok(expires > now)
            }
            _ => Ok(false),
        }
    }
}

impl MemoryBackend {
    fn extend_in(table: &mut HashMap<LockName, Entry>, req: &LockRequest, now: Instant) -> bool {
        match table.get_mut(&req.name).and_then(|e| e.holder.as_mut()) {
            Some((owner, expires)) if *owner == req.owner && *expires > now => {
                *expires = now + req.ttl;
                true
            }
            _ => false,
        }
    }

    fn release_signal(&self, req: &LockRequest) -> Arc<Notify> {
        lock(&self.table)
            .entry(req.name.clone())
            .or_default()
            .released
            .clone()
    }
}
