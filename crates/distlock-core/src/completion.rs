//! Requests that must finish even if their caller stops waiting: an
//! attempt that may grant a hold, whose grant would otherwise stay on the
//! server with nobody to release it until its TTL ends.
//!
//! [`to_completion`] runs the request in the caller's own task. Only if the
//! caller drops it before it finishes does the rest move to a task of its
//! own, whose answer goes to an `orphaned` callback (which releases a grant
//! nobody holds). Spawning a task for every request instead would cost each
//! one a hop to another worker thread and back: tens of microseconds on an
//! idle machine, a tenth of a SQLite acquire.
//!
//! [`Spawner`] keeps the runtime a value was made on, for the work its drop
//! leaves behind (a release, leaving a queue): a value dropped where no
//! runtime runs, by a synchronous caller after `block_on` returned, still
//! gets that work done.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;
type Orphaned<T> = Box<dyn FnOnce(T) -> BoxFuture<()> + Send + 'static>;

/// The runtime a value was made on, kept for the work its drop leaves
/// behind.
#[derive(Clone, Debug, Default)]
pub struct Spawner(Option<tokio::runtime::Handle>);

impl Spawner {
    /// The runtime the caller runs on, if any.
    pub fn here() -> Self {
        Self(tokio::runtime::Handle::try_current().ok())
    }

    /// Runs `work` in a task on the kept runtime, or else on the current
    /// one; `false` when there is neither and `work` is dropped. A runtime
    /// shut down since runs nothing.
    pub fn spawn<F>(&self, work: F) -> bool
    where
        F: Future<Output = ()> + Send + 'static,
    {
        match self
            .0
            .clone()
            .or_else(|| tokio::runtime::Handle::try_current().ok())
        {
            Some(rt) => {
                rt.spawn(work);
                true
            }
            None => false,
        }
    }
}

/// The life of a value, as the tasks it leaves behind see it: work that
/// only serves the value (a subscription kept a while for its next waiter)
/// stops when the value is dropped, so that a program that drops its client
/// is not held up by it.
#[derive(Debug)]
pub struct Lifetime(tokio::sync::watch::Sender<()>);

impl Default for Lifetime {
    fn default() -> Self {
        Self(tokio::sync::watch::channel(()).0)
    }
}

impl Lifetime {
    /// Resolves once this `Lifetime` is dropped.
    pub fn ended(&self) -> impl Future<Output = ()> + Send + 'static {
        let mut changes = self.0.subscribe();
        async move { while changes.changed().await.is_ok() {} }
    }
}

/// Waits `time`, or until `ended` resolves if that comes first (see
/// [`Lifetime::ended`]); `true` when the whole time passed.
pub async fn linger(time: std::time::Duration, ended: impl Future<Output = ()>) -> bool {
    tokio::select! {
        () = tokio::time::sleep(time) => true,
        () = ended => false,
    }
}

/// Sends a release again until the server answers it, in a task of its
/// own: for a release that failed for a reason that clears by itself (a
/// stall past the request timeout), whose key or node would otherwise stay
/// for as long as its session lives. `attempt` makes one try, or `None`
/// when there is nothing left to release (the client is gone, the session
/// that held the key has ended); it is called after 250 ms, then at
/// intervals doubling to 5 s. The task ends at the first answer, held or
/// not, or at an error that is not retryable; `done` runs at its end.
pub fn release_in_background<A, F, D>(name: crate::LockName, mut attempt: A, done: D)
where
    A: FnMut() -> Option<F> + Send + 'static,
    F: Future<Output = crate::Result<bool>> + Send,
    D: FnOnce() + Send + 'static,
{
    tokio::spawn(async move {
        let mut pause = std::time::Duration::from_millis(250);
        loop {
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(std::time::Duration::from_secs(5));
            let Some(release) = attempt() else { break };
            match release.await {
                Ok(_) => {
                    tracing::info!(lock = %name, "a release that had failed went through");
                    break;
                }
                Err(e) if e.is_retryable() => {
                    tracing::debug!(lock = %name, error = %e, "release failed again; retrying");
                }
                Err(e) => {
                    tracing::warn!(lock = %name, error = %e, "release failed; the hold stays until its session ends");
                    break;
                }
            }
        }
        done();
    });
}

/// `work`, polled by whoever awaits the returned future; if that future is
/// dropped before `work` finishes (a timeout, a cancelled task), the rest
/// of `work` runs in a task spawned on the runtime the future was made on
/// (see [`Spawner`]) and its answer is passed to `orphaned`. With no runtime
/// to run the rest, the work is dropped with it.
pub fn to_completion<T, W, O, OF>(work: W, orphaned: O) -> ToCompletion<T>
where
    T: Send + 'static,
    W: Future<Output = T> + Send + 'static,
    O: FnOnce(T) -> OF + Send + 'static,
    OF: Future<Output = ()> + Send + 'static,
{
    ToCompletion {
        work: Some(Box::pin(work)),
        orphaned: Some(Box::new(move |t| Box::pin(orphaned(t)))),
        spawner: Spawner::here(),
    }
}

/// The future [`to_completion`] returns.
#[must_use = "dropped unawaited, the work still runs, in a task of its own"]
pub struct ToCompletion<T: Send + 'static> {
    work: Option<BoxFuture<T>>,
    orphaned: Option<Orphaned<T>>,
    spawner: Spawner,
}

impl<T: Send + 'static> fmt::Debug for ToCompletion<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ToCompletion")
            .field("finished", &self.work.is_none())
            .finish()
    }
}

impl<T: Send + 'static> Future for ToCompletion<T> {
    type Output = T;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<T> {
        // Polled again after it finished: like a fused future, never again.
        let Some(work) = self.work.as_mut() else {
            return Poll::Pending;
        };
        let answer = std::task::ready!(work.as_mut().poll(cx));
        self.work = None;
        self.orphaned = None;
        Poll::Ready(answer)
    }
}

impl<T: Send + 'static> Drop for ToCompletion<T> {
    fn drop(&mut self) {
        let (Some(work), Some(orphaned)) = (self.work.take(), self.orphaned.take()) else {
            return;
        };
        self.spawner
            .spawn(async move { orphaned(work.await).await });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::Duration;
    use tokio::sync::{oneshot, Notify};

    #[test]
    fn a_request_dropped_outside_a_runtime_finishes_on_the_one_it_began_on() {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let (go, wait) = oneshot::channel::<u32>();
        let (tx, rx) = std::sync::mpsc::channel::<u32>();
        let entered = rt.enter();
        let mut request = Box::pin(to_completion(
            async move { wait.await.unwrap_or(0) },
            move |t| async move {
                let _ = tx.send(t);
            },
        ));
        drop(entered);
        rt.block_on(async {
            assert!(
                tokio::time::timeout(Duration::from_millis(10), &mut request)
                    .await
                    .is_err()
            );
        });
        // Outside the runtime now.
        drop(request);
        go.send(7).unwrap();
        assert_eq!(rx.recv_timeout(Duration::from_secs(5)), Ok(7));
    }

    #[tokio::test(start_paused = true)]
    async fn a_linger_ends_when_its_lifetime_does() {
        let life = Lifetime::default();
        assert!(linger(Duration::from_secs(2), life.ended()).await);
        let ended = life.ended();
        let waiting = tokio::spawn(linger(Duration::from_secs(3600), ended));
        tokio::task::yield_now().await;
        drop(life);
        let whole = tokio::time::timeout(Duration::from_secs(1), waiting)
            .await
            .expect("the linger ends with its lifetime")
            .unwrap();
        assert!(!whole);
    }

    #[tokio::test]
    async fn an_awaited_request_answers_and_orphans_nothing() {
        let (tx, mut rx) = oneshot::channel::<u32>();
        let answer = to_completion(async { 7 }, move |t| async move {
            let _ = tx.send(t);
        })
        .await;
        assert_eq!(answer, 7);
        tokio::task::yield_now().await;
        assert!(
            rx.try_recv().is_err(),
            "an answered request must not reach `orphaned`"
        );
    }

    #[tokio::test]
    async fn a_dropped_request_finishes_and_its_answer_is_orphaned() {
        let gate = Arc::new(Notify::new());
        let (tx, rx) = oneshot::channel::<u32>();
        let g = gate.clone();
        let pending = to_completion(
            async move {
                g.notified().await;
                42
            },
            move |t| async move {
                let _ = tx.send(t);
            },
        );
        // Started, then abandoned while the request is in flight.
        let timed_out = tokio::time::timeout(Duration::from_millis(20), pending).await;
        assert!(timed_out.is_err());
        gate.notify_one();
        let orphan = tokio::time::timeout(Duration::from_secs(5), rx).await;
        assert_eq!(orphan.ok().and_then(Result::ok), Some(42));
    }
}
