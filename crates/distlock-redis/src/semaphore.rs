//! Semaphores ([`HoldKind::Permits`]): the permit scripts and the wait for
//! a free permit.

use std::time::Duration;

use distlock_core::wait::{wait_for_grant, Outcome, Pace};
use distlock_core::{
    Error, FencingToken, Grant, HoldKind, InputKind, LockName, LockRequest, LockStatus, Result,
};
use redis::Value;
use tokio::time::Instant;

use crate::queue::QueueUse;
use crate::rwlock::Removal;
use crate::scripts::{Scripts, SemaphoreKeys};
use crate::subscriber::Wake;
use crate::{owner_arg, ttl_ms, Channel, RedisBackend, ReleaseWatch, Subscribed};

/// The limit a permit request asks for; a typed error for zero, which no
/// semaphore can grant.
pub(crate) fn limit_of(req: &LockRequest) -> Result<u32> {
    match req.kind {
        HoldKind::Permits { limit } => checked_limit(limit),
        _ => Ok(1),
    }
}

fn checked_limit(limit: u32) -> Result<u32> {
    if limit == 0 {
        return Err(Error::invalid(
            InputKind::Config,
            "a semaphore needs a limit of at least one permit",
        ));
    }
    Ok(limit)
}

impl RedisBackend {
    /// The keys used for the semaphore `name`.
    pub fn semaphore_keys(&self, name: &LockName) -> SemaphoreKeys {
        SemaphoreKeys::new(&self.inner.config.prefix, name)
    }

    /// The permits key of the semaphore `name` alone.
    fn permits_key(&self, name: &LockName) -> String {
        SemaphoreKeys::permits_of(&self.inner.config.prefix, name)
    }

    /// One permit acquire script, outside any wait queue (Redlock's nodes):
    /// the token (token 0 and no counter kept unless `fenced`), or how long
    /// until the earliest permit expires; `LimitMismatch` if another limit
    /// is stored.
    /// With [`RedisConfig::fifo`](crate::RedisConfig::fifo), as a try:
    /// refused while waiters queued ahead would take the free permits.
    pub(crate) async fn attempt_permit(&self, req: &LockRequest, fenced: bool) -> Result<Outcome> {
        let queue = if self.inner.config.fifo {
            QueueUse::Try
        } else {
            QueueUse::None
        };
        self.attempt_permit_in(req, fenced, queue).await
    }

    /// [`attempt_permit`](Self::attempt_permit), treating the semaphore's
    /// wait queue as `queue` says.
    pub(crate) async fn attempt_permit_in(
        &self,
        req: &LockRequest,
        fenced: bool,
        queue: QueueUse,
    ) -> Result<Outcome> {
        self.attempt_permit_at(req, fenced, queue, None).await
    }

    /// A refused wait joins the queue at `order` if given, else at the
    /// server's time.
    pub(crate) async fn attempt_permit_at(
        &self,
        req: &LockRequest,
        fenced: bool,
        queue: QueueUse,
        order: Option<u64>,
    ) -> Result<Outcome> {
        let limit = limit_of(req)?;
        let permits = self.permits_key(&req.name);
        let limit_key = SemaphoreKeys::limit_of(&permits);
        let mut inv = Scripts::get().permit_acquire.key(&permits);
        inv.key(&limit_key)
            .key(SemaphoreKeys::fence_of(&permits))
            .arg(owner_arg(req))
            .arg(ttl_ms(req.ttl))
            .arg(limit)
            .arg(if fenced { "1" } else { "0" });
        let life = match queue {
            QueueUse::None => None,
            _ => self.queue_args(
                &mut inv,
                &SemaphoreKeys::queue_of(&permits),
                &SemaphoreKeys::queue_ends_of(&permits),
                req,
                queue,
            ),
        };
        if let (Some(order), Some(_)) = (order, life) {
            inv.arg(order);
        }
        let (answer, acked): (Value, _) = self
            .run_granting(&Scripts::get().permit_acquire, &inv)
            .await?;
        match answer {
            Value::Int(token) if token >= 1 || (token == 0 && !fenced) => {
                if acked.is_some() {
                    Box::pin(self.await_replicas(req, acked)).await?;
                }
                Ok(Outcome::Granted(FencingToken(token.unsigned_abs())))
            }
            Value::Int(left) if left < 0 => Ok(Outcome::Held(QueueUse::bounded(
                Some(Duration::from_millis(left.unsigned_abs())),
                life,
            ))),
            Value::Array(stored) => match stored.first() {
                Some(Value::Int(n)) if *n >= 1 => match u32::try_from(*n) {
                    Ok(stored) => Err(Error::LimitMismatch {
                        name: req.name.clone(),
                        requested: limit,
                        stored,
                    }),
                    Err(_) => Err(crate::foreign_data(format!(
                        "the limit key {limit_key} holds {n}, more permits than a semaphore has"
                    ))),
                },
                _ => Err(crate::foreign_data(format!(
                    "the limit key {limit_key} holds something other than a permit count"
                ))),
            },
            // The permits' counter, raised, was 0: it held a negative number.
            Value::Int(0) => Err(crate::foreign_data(format!(
                "the permits' fencing counter of {} holds a negative number",
                req.name
            ))),
            other => Err(Error::backend(
                "redis",
                format!("permit_acquire.lua answered {other:?}"),
            )),
        }
    }

    /// Extends each request's permit, in one script call per batch.
    pub(crate) async fn extend_permits(&self, reqs: &[&LockRequest]) -> Result<Vec<bool>> {
        let mut inv = Scripts::get().permit_extend.prepare_invoke();
        for req in reqs {
            inv.key(self.permits_key(&req.name))
                .arg(owner_arg(req))
                .arg(ttl_ms(req.ttl));
        }
        self.renewed(&inv, "permit_extend.lua", reqs.len()).await
    }

    /// Releases `req`'s permit if it is live; with `queued` (a `fifo`
    /// client), the queued waiter the freed permit is for is told.
    pub(crate) async fn release_permit(&self, req: &LockRequest, queued: bool) -> Result<bool> {
        let what = if queued { Removal::All } else { Removal::Hold };
        self.release_permit_and(req, what).await
    }

    /// One `permit_release.lua` call: [`Removal::Hold`] touches no queue;
    /// the others tell the queued waiter the freed permit is for,
    /// [`Removal::Entry`] also removes `req`'s entry and
    /// [`Removal::Requeue`] puts it back at its place (Redlock).
    pub(crate) async fn release_permit_and(
        &self,
        req: &LockRequest,
        what: Removal,
    ) -> Result<bool> {
        let permits = self.permits_key(&req.name);
        let mut inv = Scripts::get().permit_release.key(&permits);
        if !matches!(what, Removal::Hold) {
            inv.key(SemaphoreKeys::queue_of(&permits))
                .key(SemaphoreKeys::queue_ends_of(&permits))
                .key(SemaphoreKeys::limit_of(&permits));
        }
        inv.arg(owner_arg(req))
            .arg(SemaphoreKeys::channel_of(&permits));
        self.removal_args(&mut inv, req, what);
        let n: i64 = self.run(&inv).await?;
        Ok(n == 1)
    }

    /// Removes the queue entry of `req`'s wait, which ended without a
    /// permit; the waiter that moves up within the free permits' reach is
    /// told.
    pub(crate) async fn leave_permit_queue(&self, req: &LockRequest) -> Result<()> {
        let keys = self.semaphore_keys(&req.name);
        let mut inv = Scripts::get().permit_leave.key(&keys.permits);
        inv.key(&keys.queue)
            .key(&keys.queue_ends)
            .key(&keys.limit)
            .arg(self.queue_entry(req))
            .arg(&keys.channel);
        let _: i64 = self.run(&inv).await?;
        Ok(())
    }

    /// The limit stored with the semaphore `name` and the owners of its live
    /// permits (Redlock counts a permit only where enough nodes list it).
    pub async fn permit_holders(&self, name: &LockName) -> Result<(Option<u32>, Vec<String>)> {
        let keys = self.semaphore_keys(name);
        let mut inv = Scripts::get().permit_inspect.key(&keys.permits);
        inv.key(&keys.limit);
        let (limit, owners): (i64, Vec<String>) = self.run(&inv).await?;
        if limit < 0 {
            return Err(crate::foreign_data(format!(
                "the limit key {} holds something other than a permit count",
                keys.limit
            )));
        }
        Ok((u32::try_from(limit).ok().filter(|l| *l > 0), owners))
    }

    pub(crate) async fn inspect_semaphore(&self, name: &LockName) -> Result<LockStatus> {
        let (limit, owners) = self.permit_holders(name).await?;
        Ok(LockStatus::new(!owners.is_empty()).with_holders(owners.len(), limit))
    }

    pub(crate) async fn store_limit(&self, name: &LockName, limit: u32) -> Result<Option<u32>> {
        let limit = checked_limit(limit)?;
        let keys = self.semaphore_keys(name);
        let mut inv = Scripts::get().permit_limit.key(&keys.limit);
        if self.inner.config.fifo {
            inv.key(&keys.permits)
                .key(&keys.queue)
                .key(&keys.queue_ends);
        }
        inv.arg(limit).arg(&keys.channel);
        match self.run::<redis::Value>(&inv).await? {
            redis::Value::Nil => Ok(None),
            redis::Value::Int(-1) => Err(crate::foreign_data(format!(
                "the limit key {} holds something other than a permit count; nothing was changed",
                keys.limit
            ))),
            redis::Value::BulkString(old) => Ok(String::from_utf8_lossy(&old).parse().ok()),
            other => Err(Error::backend(
                "redis",
                format!("permit_limit.lua answered {other:?}"),
            )),
        }
    }

    /// Raises the fencing counter of the semaphore `name` to at least
    /// `token` (never lowers it). Redlock's fencing writes its token back
    /// with this.
    pub async fn raise_permit_fence(&self, name: &LockName, token: FencingToken) -> Result<()> {
        self.raise_counter(&SemaphoreKeys::fence_of(&self.permits_key(name)), token)
            .await
    }

    /// Subscribes to the semaphore `name`'s messages (a freed permit, a
    /// changed limit), each delivered to every watch of this client. The
    /// subscription is confirmed by the server when this returns.
    pub async fn watch_permit_releases(&self, name: &LockName) -> Result<ReleaseWatch> {
        let channel = SemaphoreKeys::channel_of(&self.permits_key(name));
        self.watch_channel(channel, Wake::All).await
    }

    /// Waits for a permit as a lock's wait does, but a freed permit wakes
    /// one waiter of this client, not all of them. With `fifo`, a refused
    /// attempt joins the semaphore's wait queue, and a freed permit wakes
    /// only the queued waiter it is for, in arrival order.
    pub(crate) async fn acquire_permit(
        &self,
        req: &LockRequest,
        deadline: Option<Instant>,
    ) -> Result<Grant> {
        let pace = Pace::notified(Duration::from_millis(100));
        if !self.inner.config.fifo {
            let mut wakeups = Subscribed::new(self, &req.name, Channel::Permits);
            return wait_for_grant(&req.name, deadline, pace, &mut wakeups, || {
                self.attempt_permit(req, true)
            })
            .await;
        }
        let mut wakeups = Subscribed::queued(self, req, Channel::PermitQueue);
        self.wait_in_queue(req, deadline, pace, &mut wakeups, |queue| {
            self.attempt_permit_in(req, true, queue)
        })
        .await
    }
}
