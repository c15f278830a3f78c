//! Read-write locks ([`HoldKind::Shared`] beside the exclusive hold of one
//! name): the shared-hold scripts, writer marks, and what `inspect` reads.

use std::time::Duration;

use distlock_core::wait::Outcome;
use distlock_core::{Error, FencingToken, HoldKind, LockName, LockRequest, Result};
use redis::Value;

use crate::queue::QueueUse;
use crate::scripts::{Keys, Scripts, SHARED_HOLDS};
use crate::{owner_arg, ttl_ms, RedisBackend, ReleaseWatch};

/// How an attempt asks for a lock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Attempt {
    /// `try_acquire`: never leaves a writer's mark.
    Once,
    /// The first attempt of a wait: an exclusive request refused because
    /// of shared holds marks the name as awaited by a writer.
    FirstOfWait,
    /// A later attempt of a wait: as the first, and a grant also removes
    /// the mark an earlier attempt may have left.
    LaterOfWait,
}

impl Attempt {
    fn arg(self) -> &'static str {
        match self {
            Attempt::Once => "0",
            Attempt::FirstOfWait => "1",
            Attempt::LaterOfWait => "2",
        }
    }
}

/// What one attempt found, and whether it left a writer's mark (which the
/// wait then removes if it ends without a grant).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Attempted {
    /// The grant, or how long until the holder's lease ends.
    pub outcome: Outcome,
    /// Whether the attempt marked the name as awaited by a writer.
    pub marked: bool,
}

impl From<Outcome> for Attempted {
    fn from(outcome: Outcome) -> Self {
        Self {
            outcome,
            marked: false,
        }
    }
}

/// What `release.lua` removes of an exclusive request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Removal {
    /// The hold and the owner's writer mark (`Backend::release`).
    All,
    /// The hold only (Redlock rolling back one round of a wait).
    Hold,
    /// The writer mark and the queue entry only (a wait that ended).
    Mark,
    /// As `All`, and the queue entry too (Redlock's release).
    Entry,
    /// The hold only, the queue entry put back in its place (Redlock
    /// rolling back a round of a queued wait).
    Requeue(QueuePlace),
}

impl Removal {
    /// `release.lua`'s ARGV[3]; none for the common case.
    fn arg(self) -> Option<&'static str> {
        match self {
            Removal::All => None,
            Removal::Hold => Some("hold"),
            Removal::Mark => Some("mark"),
            Removal::Entry => Some("entry"),
            Removal::Requeue(_) => Some("requeue"),
        }
    }
}

/// A Redlock waiter's place in each node's wait queue: the same on every
/// node, so that the nodes order their waiters alike and agree on a head.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QueuePlace {
    /// The entry's place: waiters are served in increasing order (Redlock
    /// uses the microseconds of the client's wall clock when its wait
    /// began; entries of equal place in the order of their strings).
    pub order: u64,
    /// How long the entry lasts unless the waiter's next round renews it.
    pub life: Duration,
}

/// One server's view of a lock, read in one script call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LockHolders {
    /// The lock key's PTTL: -2 when nobody holds the name, -1 for a key
    /// without expiry (a foreign client's).
    pub pttl: i64,
    /// The fencing counter (0 before the first grant).
    pub fence: u64,
    /// The owners of the live shared holds.
    pub readers: Vec<String>,
    /// The owners of the live writer marks.
    pub writers: Vec<String>,
    /// The exclusive holder's stored owner (the owner and its holder info,
    /// see [`distlock_core::stored_owner`]); `None` when nobody holds the
    /// name exclusively.
    pub holder: Option<String>,
}

impl LockHolders {
    /// Whether someone holds the name, exclusively or shared.
    pub fn held(&self) -> bool {
        self.pttl != -2
    }

    /// How long the lock key still lives, if it expires.
    pub fn remaining(&self) -> Option<Duration> {
        u64::try_from(self.pttl).ok().map(Duration::from_millis)
    }

    /// The holder info stored with the exclusive hold, if any.
    pub fn holder_info(&self) -> Option<&str> {
        self.holder
            .as_deref()
            .and_then(|h| distlock_core::split_stored_owner(h).1)
    }
}

/// The wait an answer of -(PTTL + 3) stands for.
pub(crate) fn held_for(answer: i64) -> Option<Duration> {
    let pttl = -answer - 3;
    (pttl >= 0).then(|| Duration::from_millis(pttl.unsigned_abs()))
}

impl RedisBackend {
    /// One `acquire.lua` call for an exclusive request: `fenced` takes a
    /// token from the counter, else the grant carries token 0. With
    /// [`RedisConfig::fifo`](crate::RedisConfig::fifo) the script sees the
    /// name's wait queue: only its head may take a free lock, and a refused
    /// waiting attempt joins it, its entry lasting `entry` (the configured
    /// queue lease when `None`).
    pub(crate) async fn attempt_exclusive(
        &self,
        req: &LockRequest,
        how: Attempt,
        fenced: bool,
        entry: Option<Duration>,
    ) -> Result<Attempted> {
        self.attempt_exclusive_at(req, how, fenced, entry, None)
            .await
    }

    /// One acquire script of `req`'s kind in a Redlock round of a queued
    /// wait (on a node connected with
    /// [`RedisConfig::fifo`](crate::RedisConfig::fifo)): granted only as
    /// the kind's queue allows (a lock's head, readers with no writer
    /// ahead, the entries the free permits reach, a leadership's head), and
    /// a refused attempt joins the queue at `place` (or renews its entry
    /// there). A grant removes the entry;
    /// [`rollback_in_queue`](Self::rollback_in_queue) puts it back.
    pub async fn attempt_in_queue(
        &self,
        req: &LockRequest,
        how: Attempt,
        fenced: bool,
        place: QueuePlace,
    ) -> Result<Attempted> {
        let (life, order) = (QueueUse::Wait(place.life), Some(place.order));
        match req.kind {
            HoldKind::Shared => Ok(self
                .attempt_shared_in(req, fenced, life, order)
                .await?
                .into()),
            HoldKind::Leader => Ok(self.attempt_leader_at(req, life, order).await?.into()),
            HoldKind::Permits { .. } => Ok(self
                .attempt_permit_at(req, fenced, life, order)
                .await?
                .into()),
            _ => {
                self.attempt_exclusive_at(req, how, fenced, Some(place.life), order)
                    .await
            }
        }
    }

    async fn attempt_exclusive_at(
        &self,
        req: &LockRequest,
        how: Attempt,
        fenced: bool,
        entry: Option<Duration>,
        order: Option<u64>,
    ) -> Result<Attempted> {
        let lock = self.lock_key(&req.name);
        let mut inv = Scripts::get().acquire.key(&lock);
        inv.key(Keys::fence_of(&lock))
            .key(Keys::writers_of(&lock))
            .arg(owner_arg(req))
            .arg(ttl_ms(req.ttl))
            .arg(how.arg());
        let queue = self.inner.config.fifo.then(|| {
            let life = entry.unwrap_or(self.inner.config.queue_lease);
            inv.key(Keys::queue_of(&lock))
                .key(Keys::queue_ends_of(&lock))
                .key(Keys::queue_shared_of(&lock))
                .arg(if fenced { "1" } else { "0" })
                .arg(ttl_ms(life))
                .arg(self.queue_entry(req));
            if let Some(order) = order {
                inv.arg(order);
            }
            life
        });
        if queue.is_none() && !fenced {
            inv.arg("0");
        }
        let (answer, acked): (Value, _) = self.run_granting(&Scripts::get().acquire, &inv).await?;
        let (answer, flags) = match answer {
            Value::Int(n) => (n, 0),
            Value::Array(ref a) => match a.as_slice() {
                [Value::Int(n)] => (*n, 1),
                [Value::Int(n), Value::Int(flags)] => (*n, *flags),
                _ => return Err(unexpected("acquire.lua", &answer)),
            },
            other => return Err(unexpected("acquire.lua", &other)),
        };
        if answer >= 1 {
            if acked.is_some() {
                // Rare: boxed so that the common path's future stays small.
                Box::pin(self.await_replicas(req, acked)).await?;
            }
            let token = if fenced { answer.unsigned_abs() } else { 0 };
            return Ok(Outcome::Granted(FencingToken(token)).into());
        }
        if answer == 0 {
            return Err(crate::foreign_data(format!(
                "the fencing counter {} held a negative number",
                Keys::fence_of(&lock)
            )));
        }
        let (marked, behind) = (flags & 1 == 1, flags & 2 == 2);
        let mut left = held_for(answer);
        if marked {
            // Back before the mark lapses, or when the last reader's hold ends.
            let renew = req.ttl / 2;
            left = Some(left.map_or(renew, |l| l.min(renew)));
        }
        if let (Some(life), true) = (queue, how != Attempt::Once) {
            // Back before the queue entry lapses; a waiter behind others
            // has nothing to try at the holder's lease end: the head is
            // woken by the release, or tries itself then.
            let renew = life / 3;
            left = Some(match left {
                Some(l) if !behind => l.min(renew),
                _ => renew,
            });
        }
        Ok(Attempted {
            outcome: Outcome::Held(left),
            marked,
        })
    }

    /// One `shared_acquire.lua` call: the grant (token 0 unless `fenced`),
    /// or how long until the exclusive hold or the earliest writer mark
    /// ends.
    /// With [`RedisConfig::fifo`](crate::RedisConfig::fifo), as a try: refused
    /// while an exclusive waiter is queued.
    pub(crate) async fn attempt_shared(&self, req: &LockRequest, fenced: bool) -> Result<Outcome> {
        let queue = if self.inner.config.fifo {
            QueueUse::Try
        } else {
            QueueUse::None
        };
        self.attempt_shared_in(req, fenced, queue, None).await
    }

    /// [`attempt_shared`](Self::attempt_shared), treating the lock's wait
    /// queue as `queue` says: a shared request is refused while an
    /// exclusive waiter is queued ahead of it, and a refused wait joins the
    /// queue as a shared entry, at `order` if given (else at the server's
    /// time).
    pub(crate) async fn attempt_shared_in(
        &self,
        req: &LockRequest,
        fenced: bool,
        queue: QueueUse,
        order: Option<u64>,
    ) -> Result<Outcome> {
        let keys = self.keys(&req.name);
        let mut inv = Scripts::get().shared_acquire.key(&keys.lock);
        inv.key(&keys.fence)
            .key(&keys.readers)
            .key(&keys.writers)
            .arg(owner_arg(req))
            .arg(ttl_ms(req.ttl))
            .arg(if fenced { "1" } else { "0" });
        let life = self.queue_args(&mut inv, &keys.queue, &keys.queue_ends, req, queue);
        if life.is_some() || matches!(queue, QueueUse::Try) {
            inv.key(&keys.queue_shared);
        }
        if let (Some(order), Some(_)) = (order, life) {
            inv.arg(order);
        }
        let (answer, acked): (i64, _) = self
            .run_granting(&Scripts::get().shared_acquire, &inv)
            .await?;
        if answer >= 1 {
            if acked.is_some() {
                Box::pin(self.await_replicas(req, acked)).await?;
            }
            let token = if fenced { answer.unsigned_abs() } else { 0 };
            return Ok(Outcome::Granted(FencingToken(token)));
        }
        if answer == 0 {
            return Err(crate::foreign_data(format!(
                "the fencing counter {} held a negative number",
                keys.fence
            )));
        }
        Ok(Outcome::Held(QueueUse::bounded(held_for(answer), life)))
    }

    /// One `release.lua` call for an exclusive request (with
    /// [`Removal::Mark`], also its queue entry).
    pub(crate) async fn release_exclusive(&self, req: &LockRequest, what: Removal) -> Result<bool> {
        let lock = self.lock_key(&req.name);
        let mut inv = Scripts::get().release.key(&lock);
        inv.key(Keys::writers_of(&lock));
        if self.inner.config.fifo {
            inv.key(Keys::queue_of(&lock))
                .key(Keys::queue_ends_of(&lock))
                .key(Keys::queue_shared_of(&lock));
        }
        inv.arg(owner_arg(req)).arg(Keys::channel_of(&lock));
        if let Some(what) = what.arg() {
            inv.arg(what);
        }
        if self.inner.config.fifo {
            match what {
                Removal::Mark | Removal::Entry => {
                    inv.arg(self.queue_entry(req));
                }
                Removal::Requeue(place) => {
                    inv.arg(self.queue_entry(req))
                        .arg(place.order)
                        .arg(ttl_ms(place.life));
                }
                Removal::All | Removal::Hold => {}
            }
        }
        let n: i64 = self.run(&inv).await?;
        Ok(n == 1)
    }

    /// The arguments with which a release script (of a reader, a permit
    /// or a leadership) also removes `req`'s queue entry
    /// ([`Removal::Entry`]) or puts it back at its place
    /// ([`Removal::Requeue`]); none for the other removals.
    pub(crate) fn removal_args(
        &self,
        inv: &mut redis::ScriptInvocation<'_>,
        req: &LockRequest,
        what: Removal,
    ) {
        match what {
            Removal::Entry => {
                inv.arg("entry").arg(self.queue_entry(req));
            }
            Removal::Requeue(place) => {
                inv.arg("requeue")
                    .arg(self.queue_entry(req))
                    .arg(place.order)
                    .arg(ttl_ms(place.life));
            }
            Removal::All | Removal::Hold | Removal::Mark => {}
        }
    }

    /// Releases `req`'s shared hold if it is `req.owner`'s.
    pub(crate) async fn release_shared(&self, req: &LockRequest) -> Result<bool> {
        self.release_shared_and(req, Removal::All).await
    }

    /// One `shared_release.lua` call; with a queue, [`Removal::Entry`]
    /// also removes `req`'s queue entry and [`Removal::Requeue`] puts it
    /// back at its place (Redlock). Other removals release the hold alone.
    async fn release_shared_and(&self, req: &LockRequest, what: Removal) -> Result<bool> {
        let keys = self.keys(&req.name);
        let mut inv = Scripts::get().shared_release.key(&keys.lock);
        inv.key(&keys.readers);
        let fifo = self.inner.config.fifo;
        if fifo {
            inv.key(&keys.queue)
                .key(&keys.queue_ends)
                .key(&keys.queue_shared);
        }
        inv.arg(owner_arg(req)).arg(&keys.channel);
        if fifo {
            self.removal_args(&mut inv, req, what);
        }
        let n: i64 = self.run(&inv).await?;
        Ok(n == 1)
    }

    /// Extends each request's shared hold, in one script call.
    pub(crate) async fn extend_shared(&self, reqs: &[&LockRequest]) -> Result<Vec<bool>> {
        if reqs.is_empty() {
            return Ok(Vec::new());
        }
        let mut inv = Scripts::get().shared_extend.prepare_invoke();
        for req in reqs {
            let lock = self.lock_key(&req.name);
            inv.key(&lock)
                .key(Keys::readers_of(&lock))
                .arg(owner_arg(req))
                .arg(ttl_ms(req.ttl));
        }
        self.renewed(&inv, "shared_extend.lua", reqs.len()).await
    }

    /// Removes `req`'s writer mark, if it left one, and lets the readers it
    /// held back try again (Redlock's nodes, after a wait).
    pub async fn unmark(&self, req: &LockRequest) -> Result<()> {
        self.release_exclusive(req, Removal::Mark).await.map(|_| ())
    }

    /// Releases `req`'s hold but keeps its writer mark: Redlock rolls back
    /// a round of a wait with it, and the mark keeps holding back new
    /// readers until the next round.
    pub async fn rollback(&self, req: &LockRequest) -> Result<bool> {
        match req.kind {
            HoldKind::Exclusive => self.release_exclusive(req, Removal::Hold).await,
            _ => self.release_outside_queue(req).await,
        }
    }

    /// Releases `req`'s hold and puts its queue entry back at `place`,
    /// waking nobody if it is first there: Redlock rolls back a refused
    /// round of a queued wait with it, and the waiter keeps its turn.
    pub async fn rollback_in_queue(&self, req: &LockRequest, place: QueuePlace) -> Result<bool> {
        self.release_kind(req, Removal::Requeue(place)).await
    }

    /// Releases `req`'s hold and removes its queue entry, which stays on a
    /// node that refused the waiter's last round (Redlock's release).
    pub async fn release_with_entry(&self, req: &LockRequest) -> Result<bool> {
        self.release_kind(req, Removal::Entry).await
    }

    /// The release script of `req`'s kind (a lock's, exclusive or shared,
    /// a leadership's or a permit's).
    async fn release_kind(&self, req: &LockRequest, what: Removal) -> Result<bool> {
        match req.kind {
            HoldKind::Shared => self.release_shared_and(req, what).await,
            HoldKind::Leader => self.release_leader_and(req, what).await,
            HoldKind::Permits { .. } => self.release_permit_and(req, what).await,
            _ => self.release_exclusive(req, what).await,
        }
    }

    /// Removes the queue entry (and a writer's mark) of `req`'s wait,
    /// which ended without a grant, from this server (Redlock's nodes,
    /// after a wait); the next in line is told if its turn came.
    pub async fn leave_queue(&self, req: &LockRequest) -> Result<()> {
        match req.kind {
            HoldKind::Leader => self.leave_election_queue(req).await,
            HoldKind::Permits { .. } => self.leave_permit_queue(req).await,
            _ => self.unmark(req).await,
        }
    }

    /// Subscribes to this client's own channel of `req`'s lock, on which a
    /// release tells the queue's head that it is first (Redlock's queued
    /// waiters listen on every node). Confirmed by the server when this
    /// returns.
    pub async fn watch_queue(&self, req: &LockRequest) -> Result<ReleaseWatch> {
        let channel = Keys::queue_channel_of(&self.lock_key(&req.name), &self.inner.id);
        self.watch_own(req, channel).await
    }

    /// Who holds `name` on this server, and which writers wait for it.
    pub async fn lock_holders(&self, name: &LockName) -> Result<LockHolders> {
        let keys = self.keys(name);
        let mut inv = Scripts::get().inspect.key(&keys.lock);
        inv.key(&keys.fence).key(&keys.readers).key(&keys.writers);
        let (pttl, fence, readers, writers, value): LockHoldersAnswer = self.run(&inv).await?;
        Ok(LockHolders {
            pttl,
            fence: u64::try_from(fence).unwrap_or(0),
            readers,
            writers,
            holder: value.filter(|v| v != SHARED_HOLDS),
        })
    }
}

/// `inspect.lua`'s answer: PTTL, fence, shared holds, writer marks, value.
type LockHoldersAnswer = (i64, i64, Vec<String>, Vec<String>, Option<String>);

fn unexpected(script: &str, answer: &Value) -> Error {
    Error::backend("redis", format!("{script} answered {answer:?}"))
}
