//! The in-memory reference backend.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use tokio::time::Instant;

use crate::backend::{
    AllAtOnce, Backend, Capabilities, Consistency, Fencing, Grant, HoldKind, LockRequest,
    LockStatus, TrustedClock, Waiting,
};
use crate::error::{Error, Result};
use crate::lease::lock;
use crate::name::LockName;
use crate::token::{FencingToken, Owner};
use crate::wait::{wait_for_grant, Outcome, Pace, Signal, Signalled};

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
    semaphores: Arc<Mutex<HashMap<LockName, Semaphore>>>,
}

#[derive(Debug, Default)]
struct Entry {
    holder: Option<(Owner, Instant)>,
    /// Never reset, not even on release: tokens keep increasing.
    counter: u64,
    released: Signal,
}

#[derive(Debug, Default)]
struct Semaphore {
    /// Stored by the first acquire (or `set_limit`), kept after that.
    limit: Option<u32>,
    /// Each permit's owner and expiry.
    permits: Vec<(Owner, Instant)>,
    counter: u64,
    released: Signal,
}

impl Semaphore {
    fn live(&mut self, now: Instant) -> &mut Vec<(Owner, Instant)> {
        self.permits.retain(|(_, expires)| *expires > now);
        &mut self.permits
    }
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
        e.released.wake_all();
        had
    }

    /// One attempt: the token if granted, else how long until the earliest
    /// hold expires.
    fn attempt(&self, req: &LockRequest) -> Result<Outcome> {
        let HoldKind::Permits { limit } = req.kind else {
            return Ok(self.attempt_exclusive(req));
        };
        let now = Instant::now();
        let mut sems = lock(&self.semaphores);
        let sem = sems.entry(req.name.clone()).or_default();
        let stored = *sem.limit.get_or_insert(limit);
        if stored != limit {
            return Err(Error::LimitMismatch {
                name: req.name.clone(),
                requested: limit,
                stored,
            });
        }
        let live = sem.live(now);
        if live.len() >= stored as usize {
            let earliest = live.iter().map(|(_, e)| *e - now).min();
            return Ok(Outcome::Held(earliest));
        }
        live.push((req.owner, now + req.ttl));
        sem.counter += 1;
        Ok(Outcome::Granted(FencingToken(sem.counter)))
    }

    fn attempt_exclusive(&self, req: &LockRequest) -> Outcome {
        let now = Instant::now();
        let mut table = lock(&self.table);
        let e = table.entry(req.name.clone()).or_default();
        match e.holder {
            Some((_, expires)) if expires > now => Outcome::Held(Some(expires - now)),
            _ => {
                e.counter += 1;
                e.holder = Some((req.owner, now + req.ttl));
                Outcome::Granted(FencingToken(e.counter))
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
        .with_semaphore()
    }

    async fn try_acquire(&self, req: &LockRequest) -> Result<Option<Grant>> {
        let began = Instant::now();
        Ok(self.attempt(req)?.token().map(|t| Grant::new(t, began)))
    }

    async fn acquire(&self, req: &LockRequest, deadline: Option<Instant>) -> Result<Grant> {
        let mut wakeups = Signalled::new(self.release_signal(req));
        // Every end of a hold signals or is an expiry the lease's end says.
        let pace = Pace::notified(Duration::from_millis(100));
        wait_for_grant(&req.name, deadline, pace, &mut wakeups, || async {
            self.attempt(req)
        })
        .await
    }

    async fn try_acquire_all(&self, reqs: &[LockRequest]) -> Result<AllAtOnce> {
        if reqs.iter().any(|r| r.kind != HoldKind::Exclusive) {
            return Ok(AllAtOnce::NotOffered);
        }
        let began = Instant::now();
        let mut table = lock(&self.table);
        let held = |r: &LockRequest| {
            table
                .get(&r.name)
                .and_then(|e| e.holder)
                .is_some_and(|(_, expires)| expires > began)
        };
        if reqs.iter().any(held) {
            return Ok(AllAtOnce::Refused);
        }
        Ok(AllAtOnce::Granted(
            reqs.iter()
                .map(|r| {
                    let e = table.entry(r.name.clone()).or_default();
                    e.counter += 1;
                    e.holder = Some((r.owner, began + r.ttl));
                    Grant::new(FencingToken(e.counter), began)
                })
                .collect(),
        ))
    }

    async fn extend(&self, req: &LockRequest) -> Result<bool> {
        Ok(self.extend_many(std::slice::from_ref(req)).await?[0])
    }

    async fn extend_many(&self, reqs: &[LockRequest]) -> Result<Vec<bool>> {
        let now = Instant::now();
        let mut table = lock(&self.table);
        let mut sems = lock(&self.semaphores);
        Ok(reqs
            .iter()
            .map(|req| match req.kind {
                HoldKind::Permits { .. } => sems
                    .get_mut(&req.name)
                    .and_then(|s| s.live(now).iter_mut().find(|(o, _)| *o == req.owner))
                    .map(|(_, expires)| *expires = now + req.ttl)
                    .is_some(),
                _ => Self::extend_in(&mut table, req, now),
            })
            .collect())
    }

    async fn inspect_permits(&self, name: &LockName) -> Result<LockStatus> {
        let now = Instant::now();
        let mut sems = lock(&self.semaphores);
        Ok(match sems.get_mut(name) {
            Some(sem) => {
                let limit = sem.limit;
                let live = sem.live(now);
                LockStatus::new(!live.is_empty()).with_holders(live.len(), limit)
            }
            None => LockStatus::new(false).with_holders(0, None),
        })
    }

    async fn set_limit(&self, name: &LockName, limit: u32) -> Result<Option<u32>> {
        let mut sems = lock(&self.semaphores);
        let sem = sems.entry(name.clone()).or_default();
        let old = sem.limit.replace(limit);
        // A higher limit may let several waiters in.
        sem.released.wake_all();
        Ok(old)
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
        if let HoldKind::Permits { .. } = req.kind {
            let mut sems = lock(&self.semaphores);
            let Some(sem) = sems.get_mut(&req.name) else {
                return Ok(false);
            };
            let before = sem.live(now).len();
            sem.permits.retain(|(o, _)| *o != req.owner);
            let freed = sem.permits.len() < before;
            if freed {
                sem.released.wake_one();
            }
            return Ok(freed);
        }
        let mut table = lock(&self.table);
        let Some(e) = table.get_mut(&req.name) else {
            return Ok(false);
        };
        match e.holder {
            Some((owner, expires)) if owner == req.owner => {
                e.holder = None;
                e.released.wake_all();
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

    fn release_signal(&self, req: &LockRequest) -> Signal {
        match req.kind {
            HoldKind::Permits { .. } => lock(&self.semaphores)
                .entry(req.name.clone())
                .or_default()
                .released
                .clone(),
            _ => lock(&self.table)
                .entry(req.name.clone())
                .or_default()
                .released
                .clone(),
        }
    }
}
