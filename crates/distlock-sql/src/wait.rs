//! The waiting loop shared by the three databases.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use distlock_core::poll::{Backoff, WaitClock};
use distlock_core::{FencingToken, Grant, LockName, Result};
use tokio::sync::broadcast;
use tokio::time::Instant;

/// One attempt's outcome: the token, or how long the current holder's lease
/// (a semaphore's: the earliest-ending permit's) still runs, when the
/// database told us.
pub(crate) struct Attempt {
    pub(crate) token: Option<FencingToken>,
    pub(crate) holder_expires_in: Option<Duration>,
}

/// Where the waiting loop sleeps between attempts.
pub(crate) enum Pace {
    /// Notified on release: sleep until the holder's lease ends, at most `cap`.
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    Notified { cap: Duration },
    /// Backoff (MySQL; SQLite, which is also woken in-process).
    #[cfg_attr(not(any(feature = "mysql", feature = "sqlite")), allow(dead_code))]
    Backoff(Backoff),
}

/// Retries `attempt` until it grants, `deadline` passes, or forever.
///
/// Subscribes to `releases` *before* each attempt, so a release that lands
/// between a failed attempt and the sleep still wakes it. Cancellation-safe:
/// nothing is held or queued between attempts.
pub(crate) async fn wait_loop<F, Fut>(
    name: &LockName,
    deadline: Option<Instant>,
    releases: Option<&broadcast::Sender<Arc<str>>>,
    pace: &Pace,
    mut attempt: F,
) -> Result<Grant>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Attempt>>,
{
    let clock = WaitClock::start(name, deadline);
    let mut n = 0u32;
    loop {
        let mut rx = releases.map(broadcast::Sender::subscribe);
        let began = Instant::now();
        let a = attempt().await?;
        if let Some(t) = a.token {
            return Ok(Grant::new(t, began));
        }
        let cap = match pace {
            Pace::Notified { cap } => *cap,
            Pace::Backoff(b) => b.delay(n),
        };
        // Right after the holder's (or the earliest permit's) lease ends,
        // if that comes first: expiry sends no notification.
        let delay = a
            .holder_expires_in
            .map_or(cap, |left| (left + Duration::from_millis(1)).min(cap));
        let sleep = tokio::time::sleep_until(clock.retry_at(Instant::now() + delay)?);
        match rx.as_mut() {
            Some(rx) => {
                tokio::select! {
                    () = sleep => {}
                    () = released(rx, name) => {}
                }
            }
            None => sleep.await,
        }
        n = n.saturating_add(1);
    }
}

async fn released(rx: &mut broadcast::Receiver<Arc<str>>, name: &LockName) {
    loop {
        match rx.recv().await {
            Ok(n) if *n == *name.as_str() => return,
            Ok(_) => {}
            // Missed some: one of them may have been ours.
            Err(broadcast::error::RecvError::Lagged(_)) => return,
            Err(broadcast::error::RecvError::Closed) => std::future::pending().await,
        }
    }
}
