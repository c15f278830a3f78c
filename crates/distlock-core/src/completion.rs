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

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;
type Orphaned<T> = Box<dyn FnOnce(T) -> BoxFuture<()> + Send + 'static>;

/// `work`, polled by whoever awaits the returned future; if that future is
/// dropped before `work` finishes (a timeout, a cancelled task), the rest
/// of `work` runs in a task spawned on the current Tokio runtime and its
/// answer is passed to `orphaned`. Outside a runtime (nothing can run the
/// rest) the work is dropped with it.
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
    }
}

/// The future [`to_completion`] returns.
#[must_use = "dropped unawaited, the work still runs, in a task of its own"]
pub struct ToCompletion<T: Send + 'static> {
    work: Option<BoxFuture<T>>,
    orphaned: Option<Orphaned<T>>,
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
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move { orphaned(work.await).await });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::Duration;
    use tokio::sync::{oneshot, Notify};

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
