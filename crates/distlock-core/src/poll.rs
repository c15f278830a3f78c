//! Waiting: by polling, for backends that cannot be notified, and a
//! native wait bounded by its deadline.

use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;

use crate::backend::{Backend, Grant, LockRequest};
use crate::error::{Error, Result};
use crate::name::LockName;

/// Capped exponential backoff with full jitter.
#[derive(Clone, Copy, Debug)]
#[non_exhaustive]
pub struct Backoff {
    /// First delay ceiling.
    pub initial: Duration,
    /// Largest delay ceiling.
    pub max: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Self {
            initial: Duration::from_millis(5),
            max: Duration::from_millis(500),
        }
    }
}

impl Backoff {
    /// A backoff between `initial` and `max`.
    pub fn new(initial: Duration, max: Duration) -> Self {
        Self {
            initial,
            max: max.max(initial),
        }
    }

    /// The delay before attempt number `attempt` (0-based): uniform in
    /// `[ceiling/2, ceiling]`, where the ceiling doubles up to `max`. Half
    /// jitter keeps waiters from polling in lockstep without ever spinning.
    pub fn delay(&self, attempt: u32) -> Duration {
        let ceiling = self
            .initial
            .saturating_mul(1u32 << attempt.min(16))
            .min(self.max);
        let half = ceiling / 2;
        half + jitter(ceiling - half)
    }
}

/// A uniformly random duration in `[0, max]`.
pub fn jitter(max: Duration) -> Duration {
    let mut b = [0u8; 8];
    if getrandom::fill(&mut b).is_err() {
        return max / 2;
    }
    let nanos = max.as_nanos().min(u64::MAX as u128) as u64;
    if nanos == 0 {
        return Duration::ZERO;
    }
    Duration::from_nanos(u64::from_le_bytes(b) % (nanos + 1))
}

/// The clock of one waiting acquire: when it began, and until when it may
/// wait. Every backend's wait loop asks it when to try again, so the
/// deadline rule and the `WaitTimeout` it ends with are the same everywhere.
#[derive(Clone, Debug)]
pub struct WaitClock {
    name: LockName,
    start: Instant,
    deadline: Option<Instant>,
}

impl WaitClock {
    /// A wait for `name` that starts now and may last until `deadline`
    /// (for ever without one).
    pub fn start(name: &LockName, deadline: Option<Instant>) -> Self {
        Self {
            name: name.clone(),
            start: Instant::now(),
            deadline,
        }
    }

    /// When to try again after a refused attempt: `wake`, or the deadline if
    /// that comes first; [`Error::WaitTimeout`] once the deadline has passed.
    pub fn retry_at(&self, wake: Instant) -> Result<Instant> {
        match self.deadline {
            Some(d) if Instant::now() >= d => Err(self.timed_out()),
            Some(d) => Ok(wake.min(d)),
            None => Ok(wake),
        }
    }

    /// [`WaitClock::retry_at`] a few milliseconds after a holder's lease
    /// that has `left` to run ends (expiry sends no notification; a waiter
    /// there a moment early would only sleep again), or after `otherwise`
    /// when the backend cannot tell.
    pub fn retry_after_expiry(
        &self,
        left: Option<Duration>,
        otherwise: Duration,
    ) -> Result<Instant> {
        self.retry_at(Instant::now() + left.map_or(otherwise, |l| l + Duration::from_millis(2)))
    }

    /// Runs a native wait until the deadline; past it, the wait is dropped
    /// and the answer is [`Error::WaitTimeout`].
    pub async fn within<T>(&self, wait: impl Future<Output = Result<T>>) -> Result<T> {
        match self.deadline {
            Some(d) => tokio::time::timeout_at(d, wait)
                .await
                .unwrap_or_else(|_| Err(self.timed_out())),
            None => wait.await,
        }
    }

    /// The error a wait ends with at its deadline.
    pub fn timed_out(&self) -> Error {
        Error::WaitTimeout {
            name: self.name.clone(),
            waited: self.start.elapsed(),
        }
    }
}

/// Polls `try_acquire` until it grants or `deadline` passes.
///
/// Cancellation-safe: between attempts nothing is held or queued.
pub async fn acquire_by_polling<B: Backend + ?Sized>(
    backend: &B,
    req: &LockRequest,
    deadline: Option<Instant>,
    backoff: Backoff,
) -> Result<Grant> {
    let clock = WaitClock::start(&req.name, deadline);
    let mut attempt = 0u32;
    loop {
        if let Some(grant) = backend.try_acquire(req).await? {
            return Ok(grant);
        }
        let wake = clock.retry_at(Instant::now() + backoff.delay(attempt))?;
        tokio::time::sleep_until(wake).await;
        attempt = attempt.saturating_add(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_and_is_capped() {
        let b = Backoff::new(Duration::from_millis(10), Duration::from_millis(100));
        for attempt in 0..40 {
            let d = b.delay(attempt);
            let ceiling = Duration::from_millis(10 * (1u64 << attempt.min(16)))
                .min(Duration::from_millis(100));
            assert!(
                d >= ceiling / 2 && d <= ceiling,
                "attempt {attempt}: {d:?} vs {ceiling:?}"
            );
        }
    }
}
