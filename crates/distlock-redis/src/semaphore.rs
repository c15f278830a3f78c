//! Semaphores ([`HoldKind::Permits`]): the permit scripts and the wait for
//! a free permit.

use std::sync::Arc;
use std::time::Duration;

use distlock_core::poll::WaitClock;
use distlock_core::{
    Error, FencingToken, Grant, HoldKind, InputKind, LockName, LockRequest, LockStatus, Result,
};
use redis::Value;
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::scripts::{Scripts, SemaphoreKeys};
use crate::subscriber::PermitWatch;
use crate::{ttl_ms, Attempt, RedisBackend, ReleaseWatch};

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

/// A wake-up this waiter took from the others and has not yet acted on.
/// Dropped before its attempt has answered (the acquire was cancelled or
/// failed), it passes the wake-up on: the freed permit is then not left
/// unclaimed while the other waiters sleep until the earliest expiry.
struct Baton(Option<Arc<Notify>>);

impl Baton {
    /// The attempt answered: the wake-up was used.
    fn used(&mut self) {
        self.0 = None;
    }
}

impl Drop for Baton {
    fn drop(&mut self) {
        if let Some(wake) = self.0.take() {
            wake.notify_one();
        }
    }
}

impl RedisBackend {
    /// The keys used for the semaphore `name`.
    pub fn semaphore_keys(&self, name: &LockName) -> SemaphoreKeys {
        SemaphoreKeys::new(&self.inner.config.prefix, name)
    }

    /// One permit acquire script: the token, or how long until the earliest
    /// permit expires; `LimitMismatch` if another limit is stored.
    pub(crate) async fn attempt_permit(&self, req: &LockRequest) -> Result<Attempt> {
        let limit = limit_of(req)?;
        let keys = self.semaphore_keys(&req.name);
        let mut inv = Scripts::get().permit_acquire.key(&keys.permits);
        inv.key(&keys.limit)
            .key(&keys.fence)
            .arg(req.owner.to_string())
            .arg(ttl_ms(req.ttl))
            .arg(limit);
        let answer: Value = self.run(&inv).await?;
        match answer {
            Value::Int(token) if token >= 1 => {
                if self.inner.config.wait_replicas > 0 {
                    Box::pin(self.await_replicas(req)).await?;
                }
                Ok(Attempt::Granted(FencingToken(token.unsigned_abs())))
            }
            Value::Int(left) if left < 0 => Ok(Attempt::Held(Some(Duration::from_millis(
                left.unsigned_abs(),
            )))),
            Value::Array(stored) => match stored.first() {
                Some(Value::Int(n)) if *n >= 0 => Err(Error::LimitMismatch {
                    name: req.name.clone(),
                    requested: limit,
                    stored: u32::try_from(*n).unwrap_or(u32::MAX),
                }),
                _ => Err(Error::backend(
                    "redis",
                    format!(
                        "the limit key {} holds something other than a permit count; delete it or set_limit again",
                        keys.limit
                    ),
                )),
            },
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
            inv.key(self.semaphore_keys(&req.name).permits)
                .arg(req.owner.to_string())
                .arg(ttl_ms(req.ttl));
        }
        let answers: Vec<i64> = self.run(&inv).await?;
        if answers.len() != reqs.len() {
            return Err(Error::backend(
                "redis",
                format!(
                    "permit_extend.lua answered {} times for {} permits",
                    answers.len(),
                    reqs.len()
                ),
            ));
        }
        Ok(answers.into_iter().map(|n| n == 1).collect())
    }

    pub(crate) async fn release_permit(&self, req: &LockRequest) -> Result<bool> {
        let keys = self.semaphore_keys(&req.name);
        let mut inv = Scripts::get().permit_release.key(&keys.permits);
        inv.arg(req.owner.to_string()).arg(&keys.channel);
        let n: i64 = self.run(&inv).await?;
        Ok(n == 1)
    }

    /// The limit stored with the semaphore `name` and the owners of its live
    /// permits (Redlock counts a permit only where enough nodes list it).
    pub async fn permit_holders(&self, name: &LockName) -> Result<(Option<u32>, Vec<String>)> {
        let keys = self.semaphore_keys(name);
        let mut inv = Scripts::get().permit_inspect.key(&keys.permits);
        inv.key(&keys.limit);
        let (limit, owners): (i64, Vec<String>) = self.run(&inv).await?;
        let limit = u32::try_from(limit).ok().filter(|l| *l > 0);
        Ok((limit, owners))
    }

    pub(crate) async fn inspect_semaphore(&self, name: &LockName) -> Result<LockStatus> {
        let (limit, owners) = self.permit_holders(name).await?;
        Ok(LockStatus::new(!owners.is_empty()).with_holders(owners.len(), limit))
    }

    pub(crate) async fn store_limit(&self, name: &LockName, limit: u32) -> Result<Option<u32>> {
        let limit = checked_limit(limit)?;
        let keys = self.semaphore_keys(name);
        let mut inv = Scripts::get().permit_limit.key(&keys.limit);
        inv.arg(limit).arg(&keys.channel);
        let old: Option<String> = self.run(&inv).await?;
        Ok(old.and_then(|o| o.parse().ok()))
    }

    /// Raises the fencing counter of the semaphore `name` to at least
    /// `token` (never lowers it). Redlock's fencing writes its token back
    /// with this.
    pub async fn raise_permit_fence(&self, name: &LockName, token: FencingToken) -> Result<()> {
        self.raise_counter(&self.semaphore_keys(name).fence, token)
            .await
    }

    /// Subscribes to the semaphore `name`'s messages (a freed permit, a
    /// changed limit), each delivered to every watch of this client. The
    /// subscription is confirmed by the server when this returns.
    pub async fn watch_permit_releases(&self, name: &LockName) -> Result<ReleaseWatch> {
        let channel = self.semaphore_keys(name).channel;
        self.watch_channel(channel).await
    }

    async fn watch_permits(&self, name: &LockName) -> Result<PermitWatch> {
        let channel = self.semaphore_keys(name).channel;
        self.inner
            .subscriber
            .watch_permits(&self.inner.conn, &channel)
            .await
            .map_err(|e| self.err(e))
    }

    /// Waits for a permit. Like a lock's wait (try once without a
    /// subscription; then every attempt runs with one, re-checking when the
    /// earliest permit expires), but a freed permit wakes one waiter of this
    /// client, not all of them.
    pub(crate) async fn acquire_permit(
        &self,
        req: &LockRequest,
        deadline: Option<Instant>,
    ) -> Result<Grant> {
        let clock = WaitClock::start(&req.name, deadline);
        let began = Instant::now();
        if let Attempt::Granted(t) = self.attempt_permit(req).await? {
            return Ok(Grant::new(t, began));
        }
        let mut watch: Option<PermitWatch> = None;
        let mut baton = Baton(None);
        loop {
            if watch.as_ref().is_some_and(|w| !w.alive()) {
                watch = None;
            }
            if watch.is_none() {
                watch = match self.watch_permits(&req.name).await {
                    Ok(w) => Some(w),
                    Err(e) => {
                        tracing::debug!(error = %e, "no pub/sub; waiting on permit expiries only");
                        None
                    }
                };
            }
            let wake = watch.as_ref().map(|w| w.wake.clone());
            let notified = wake.as_deref().map(Notify::notified);
            tokio::pin!(notified);
            // Registered before the attempt: a permit freed after the
            // attempt looked is then delivered to this waiter (or, if it
            // returns, passed on to another when `notified` is dropped).
            if let Some(n) = notified.as_mut().as_pin_mut() {
                n.enable();
            }
            let began = Instant::now();
            let answer = self.attempt_permit(req).await?;
            baton.used();
            let left = match answer {
                Attempt::Granted(t) => return Ok(Grant::new(t, began)),
                Attempt::Held(left) => left,
            };
            let sleep = tokio::time::sleep_until(
                clock.retry_after_expiry(left, Duration::from_millis(100))?,
            );
            match notified.as_mut().as_pin_mut() {
                Some(n) => tokio::select! {
                    () = sleep => {}
                    () = n => baton = Baton(wake.clone()),
                },
                None => sleep.await,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_dropped_baton_hands_its_wakeup_to_the_next_waiter() {
        let wake = Arc::new(Notify::new());
        let (first, second) = (wake.notified(), wake.notified());
        tokio::pin!(first, second);
        first.as_mut().enable();
        second.as_mut().enable();
        wake.notify_one();
        first.await;
        // The woken waiter is cancelled before its attempt answers.
        drop(Baton(Some(wake.clone())));
        tokio::time::timeout(Duration::from_secs(1), second)
            .await
            .expect("the wake-up died with the cancelled waiter");
    }

    #[tokio::test]
    async fn a_used_baton_wakes_nobody() {
        let wake = Arc::new(Notify::new());
        let mut baton = Baton(Some(wake.clone()));
        baton.used();
        drop(baton);
        let next = wake.notified();
        assert!(
            tokio::time::timeout(Duration::from_millis(50), next)
                .await
                .is_err(),
            "a used wake-up was passed on"
        );
    }
}
