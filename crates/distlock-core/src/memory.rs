//! The in-memory reference backend.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use tokio::time::Instant;

use crate::backend::{
    AllAtOnce, Backend, Capabilities, Consistency, Fencing, Grant, HoldKind, Leader, LockRequest,
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
    /// Elections: an entry per election, whose exclusive holder leads.
    elections: Arc<Mutex<HashMap<LockName, Entry>>>,
}

/// One live hold: its owner, its lease's end, its token and holder info.
#[derive(Debug, Clone)]
struct Held {
    owner: Owner,
    until: Instant,
    token: FencingToken,
    info: Option<Arc<str>>,
}

impl Held {
    fn of(req: &LockRequest, until: Instant, token: FencingToken) -> Self {
        Self {
            owner: req.owner,
            until,
            token,
            info: req.holder_info.clone(),
        }
    }

    fn record(&self, name: &LockName, kind: HoldKind, now: Instant) -> crate::HoldRecord {
        crate::HoldRecord::new(name.as_str(), kind)
            .with_token(Some(self.token))
            .with_remaining(Some(self.until - now))
            .with_holder_info(self.info.as_deref().map(str::to_string))
    }
}

#[derive(Debug, Default)]
struct Entry {
    holder: Option<Held>,
    /// Shared holds.
    shared: Vec<Held>,
    /// Exclusive requests waiting behind shared holds, until when each
    /// mark lasts: while one lasts, no shared hold is granted.
    writers: Vec<(Owner, Instant)>,
    /// Never reset, not even on release: tokens keep increasing. Shared
    /// and exclusive grants draw from it alike.
    counter: u64,
    released: Signal,
    /// The value the exclusive holder carries (an election's leader).
    value: Option<std::sync::Arc<str>>,
}

impl Entry {
    /// Drops expired shared holds and writer marks.
    fn prune(&mut self, now: Instant) {
        self.shared.retain(|h| h.until > now);
        self.writers.retain(|(_, e)| *e > now);
    }

    fn exclusive_until(&self, now: Instant) -> Option<Instant> {
        self.holder.as_ref().map(|h| h.until).filter(|e| *e > now)
    }

    fn grant(&mut self) -> FencingToken {
        self.counter += 1;
        FencingToken(self.counter)
    }
}

#[derive(Debug, Default)]
struct Semaphore {
    /// Stored by the first acquire (or `set_limit`), kept after that.
    limit: Option<u32>,
    /// Each permit.
    permits: Vec<Held>,
    counter: u64,
    released: Signal,
}

impl Semaphore {
    fn live(&mut self, now: Instant) -> &mut Vec<Held> {
        self.permits.retain(|h| h.until > now);
        &mut self.permits
    }
}

impl MemoryBackend {
    /// An empty table.
    pub fn new() -> Self {
        Self::default()
    }

    /// Removes the current holders of the lock and of the election `name`
    /// as an operator would; their next renewal is rejected. Returns whether
    /// someone held either.
    pub fn evict(&self, name: &LockName) -> bool {
        let mut had = false;
        for table in [&self.table, &self.elections] {
            let mut table = lock(table);
            let Some(e) = table.get_mut(name) else {
                continue;
            };
            had |= e.holder.take().is_some() | !e.shared.is_empty();
            e.shared.clear();
            e.value = None;
            e.released.wake_all();
        }
        had
    }

    /// One attempt: the token if granted, else how long until the earliest
    /// hold expires. `waiting`: the caller waits, so an exclusive request
    /// refused for shared holds marks the lock as awaited by a writer.
    fn attempt(&self, req: &LockRequest, waiting: bool) -> Result<Outcome> {
        let HoldKind::Permits { limit } = req.kind else {
            return Ok(self.attempt_lock(req, waiting));
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
            let earliest = live.iter().map(|h| h.until - now).min();
            return Ok(Outcome::Held(earliest));
        }
        sem.counter += 1;
        let token = FencingToken(sem.counter);
        sem.permits.push(Held::of(req, now + req.ttl, token));
        Ok(Outcome::Granted(token))
    }

    /// The table of `kind`'s objects: elections apart from locks.
    fn table_of(&self, kind: HoldKind) -> &Mutex<HashMap<LockName, Entry>> {
        match kind {
            HoldKind::Leader => &self.elections,
            _ => &self.table,
        }
    }

    fn attempt_lock(&self, req: &LockRequest, waiting: bool) -> Outcome {
        let now = Instant::now();
        let mut table = lock(self.table_of(req.kind));
        let e = table.entry(req.name.clone()).or_default();
        e.prune(now);
        if let Some(until) = e.exclusive_until(now) {
            return Outcome::Held(Some(until - now));
        }
        if req.kind == HoldKind::Shared {
            if let Some(mark) = e.writers.iter().map(|(_, until)| *until).min() {
                return Outcome::Held(Some(mark - now));
            }
            let token = e.grant();
            e.shared.push(Held::of(req, now + req.ttl, token));
            return Outcome::Granted(token);
        }
        if let Some(first_end) = e.shared.iter().map(|h| h.until).min() {
            if waiting {
                e.writers.retain(|(o, _)| *o != req.owner);
                e.writers.push((req.owner, now + req.ttl));
            }
            // Back before the mark lapses, or when the first reader's ends.
            return Outcome::Held(Some((first_end - now).min(req.ttl / 2)));
        }
        e.writers.retain(|(o, _)| *o != req.owner);
        let token = e.grant();
        e.holder = Some(Held::of(req, now + req.ttl, token));
        e.value = req.value.clone();
        Outcome::Granted(token)
    }

    /// Removes `req`'s writer mark, if it has one, and lets the readers it
    /// held back try again.
    fn unmark(&self, req: &LockRequest) -> bool {
        let mut table = lock(&self.table);
        let Some(e) = table.get_mut(&req.name) else {
            return false;
        };
        let before = e.writers.len();
        e.writers.retain(|(o, _)| *o != req.owner);
        let had = e.writers.len() < before;
        if had {
            e.released.wake_all();
        }
        had
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
        .with_shared()
        .with_elections()
    }

    async fn try_acquire(&self, req: &LockRequest) -> Result<Option<Grant>> {
        let began = Instant::now();
        Ok(self
            .attempt(req, false)?
            .token()
            .map(|t| Grant::new(t, began)))
    }

    async fn acquire(&self, req: &LockRequest, deadline: Option<Instant>) -> Result<Grant> {
        let mut wakeups = Signalled::new(self.release_signal(req));
        // Every end of a hold signals or is an expiry the lease's end says.
        let pace = Pace::notified(Duration::from_millis(100));
        let granted = wait_for_grant(&req.name, deadline, pace, &mut wakeups, || async {
            self.attempt(req, true)
        })
        .await;
        if granted.is_err() {
            self.unmark(req);
        }
        granted
    }

    async fn try_acquire_all(&self, reqs: &[LockRequest]) -> Result<AllAtOnce> {
        if reqs.iter().any(|r| r.kind != HoldKind::Exclusive) {
            return Ok(AllAtOnce::NotOffered);
        }
        let began = Instant::now();
        let mut table = lock(&self.table);
        let held = |r: &LockRequest| {
            table.get(&r.name).is_some_and(|e| {
                e.exclusive_until(began).is_some() || e.shared.iter().any(|h| h.until > began)
            })
        };
        if reqs.iter().any(held) {
            return Ok(AllAtOnce::Refused);
        }
        Ok(AllAtOnce::Granted(
            reqs.iter()
                .map(|r| {
                    let e = table.entry(r.name.clone()).or_default();
                    let token = e.grant();
                    e.holder = Some(Held::of(r, began + r.ttl, token));
                    Grant::new(token, began)
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
        let mut elections = lock(&self.elections);
        Ok(reqs
            .iter()
            .map(|req| match req.kind {
                HoldKind::Permits { .. } => sems
                    .get_mut(&req.name)
                    .and_then(|s| s.live(now).iter_mut().find(|h| h.owner == req.owner))
                    .map(|h| h.until = now + req.ttl)
                    .is_some(),
                HoldKind::Leader => Self::extend_in(&mut elections, req, now),
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
        let mut table = lock(&self.table);
        let Some(e) = table.get_mut(name) else {
            return Ok(LockStatus::new(false).with_shared(0, false));
        };
        e.prune(now);
        // Held until the exclusive hold ends, or the last shared one does.
        let until = e
            .exclusive_until(now)
            .or_else(|| e.shared.iter().map(|h| h.until).max());
        let status = LockStatus::new(until.is_some())
            .with_shared(e.shared.len(), !e.writers.is_empty())
            .with_holder_info(
                e.holder
                    .as_ref()
                    .filter(|h| h.until > now)
                    .and_then(|h| h.info.as_deref().map(str::to_string)),
            );
        Ok(match until {
            // While anyone holds it, the newest grant is theirs.
            Some(until) => status
                .with_token(Some(FencingToken(e.counter)))
                .with_remaining(Some(until - now)),
            None => status,
        })
    }

    async fn list(&self, prefix: &str, limit: usize) -> Result<Vec<crate::HoldRecord>> {
        let now = Instant::now();
        let mut records = Vec::new();
        let matches = |name: &LockName| name.as_str().starts_with(prefix);
        for (name, e) in lock(&self.table).iter().filter(|(n, _)| matches(n)) {
            let live = e.holder.iter().filter(|h| h.until > now);
            records.extend(live.map(|h| h.record(name, HoldKind::Exclusive, now)));
            let shared = e.shared.iter().filter(|h| h.until > now);
            records.extend(shared.map(|h| h.record(name, HoldKind::Shared, now)));
        }
        for (name, sem) in lock(&self.semaphores).iter().filter(|(n, _)| matches(n)) {
            let kind = HoldKind::Permits {
                limit: sem.limit.unwrap_or(0),
            };
            let live = sem.permits.iter().filter(|h| h.until > now);
            records.extend(live.map(|h| h.record(name, kind, now)));
        }
        for (name, e) in lock(&self.elections).iter().filter(|(n, _)| matches(n)) {
            let live = e.holder.iter().filter(|h| h.until > now);
            records.extend(live.map(|h| {
                h.record(name, HoldKind::Leader, now)
                    .with_value(e.value.as_deref().map(str::to_string))
            }));
        }
        crate::sort_records(&mut records, limit);
        Ok(records)
    }

    async fn proclaim(&self, req: &LockRequest, value: &str) -> Result<bool> {
        let now = Instant::now();
        let mut elections = lock(&self.elections);
        let Some(e) = elections.get_mut(&req.name) else {
            return Ok(false);
        };
        match &e.holder {
            Some(h) if h.owner == req.owner && h.until > now => {
                e.value = Some(value.into());
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    async fn leader(&self, name: &LockName) -> Result<Option<Leader>> {
        let now = Instant::now();
        let elections = lock(&self.elections);
        Ok(elections.get(name).and_then(|e| {
            let until = e.exclusive_until(now)?;
            Some(
                Leader::new(
                    e.value.as_deref().unwrap_or_default(),
                    FencingToken(e.counter),
                )
                .with_remaining(Some(until - now))
                .with_holder_info(
                    e.holder
                        .as_ref()
                        .and_then(|h| h.info.as_deref().map(str::to_string)),
                ),
            )
        }))
    }

    async fn release(&self, req: &LockRequest) -> Result<bool> {
        let now = Instant::now();
        if let HoldKind::Permits { .. } = req.kind {
            let mut sems = lock(&self.semaphores);
            let Some(sem) = sems.get_mut(&req.name) else {
                return Ok(false);
            };
            let before = sem.live(now).len();
            sem.permits.retain(|h| h.owner != req.owner);
            let freed = sem.permits.len() < before;
            if freed {
                sem.released.wake_one();
            }
            return Ok(freed);
        }
        if req.kind != HoldKind::Leader && self.unmark(req) {
            return Ok(false);
        }
        let mut table = lock(self.table_of(req.kind));
        let Some(e) = table.get_mut(&req.name) else {
            return Ok(false);
        };
        if req.kind == HoldKind::Shared {
            let Some(i) = e.shared.iter().position(|h| h.owner == req.owner) else {
                return Ok(false);
            };
            let held = e.shared.swap_remove(i);
            e.released.wake_all();
            return Ok(held.until > now);
        }
        match &e.holder {
            Some(h) if h.owner == req.owner => {
                let live = h.until > now;
                e.holder = None;
                e.value = None;
                e.released.wake_all();
                Ok(live)
            }
            _ => Ok(false),
        }
    }
}

impl MemoryBackend {
    fn extend_in(table: &mut HashMap<LockName, Entry>, req: &LockRequest, now: Instant) -> bool {
        let Some(e) = table.get_mut(&req.name) else {
            return false;
        };
        let hold = match req.kind {
            HoldKind::Shared => e.shared.iter_mut().find(|h| h.owner == req.owner),
            _ => e.holder.as_mut(),
        };
        match hold {
            Some(h) if h.owner == req.owner && h.until > now => {
                h.until = now + req.ttl;
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
            kind => lock(self.table_of(kind))
                .entry(req.name.clone())
                .or_default()
                .released
                .clone(),
        }
    }
}
