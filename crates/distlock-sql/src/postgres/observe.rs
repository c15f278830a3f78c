//! An election's observer on PostgreSQL: woken through the LISTEN
//! connection the backend's waiters share, by the notifications the
//! election's grants, proclamations, resignations and evictions send.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use distlock_core::wait::{Signal, Wakeup};
use distlock_core::{Leader, LeaderStream, Result, LEADER_POLL};
use futures_util::stream::{self, StreamExt};
use tokio::time::Instant;

use super::Listening;

/// A moment after a lease ends, so that the read no longer finds it.
const AFTER_EXPIRY: Duration = Duration::from_millis(2);

/// The leaders `read` reports, from the current one on. `listening` must
/// already listen and `signal` be the election row's observers' signal, so
/// that every change committed after the first read is notified. Each read
/// is made with the next wake-up armed first; then it waits for a
/// notification, the end of the leader's lease (an expiry notifies
/// nothing), or `recheck` (a notification lost while the LISTEN connection
/// reconnects), whichever comes first. After a failed read it tries again
/// within [`LEADER_POLL`]. Dropping the stream drops its hold on the LISTEN
/// connection; the last hold closes it.
pub(crate) fn leaders<R, Fut>(
    listening: Arc<Listening>,
    signal: Signal,
    recheck: Duration,
    read: R,
) -> LeaderStream
where
    R: Fn() -> Fut + Send + 'static,
    Fut: Future<Output = Result<Option<Leader>>> + Send + 'static,
{
    let observer = Observer {
        read,
        signal,
        _listening: listening,
        recheck,
        woken: None,
        until: None,
    };
    stream::unfold(observer, |mut o| async move {
        let item = o.next().await;
        Some((item, o))
    })
    .boxed()
}

struct Observer<R> {
    read: R,
    signal: Signal,
    /// Held for its Drop: the LISTEN connection lives while someone holds it.
    _listening: Arc<Listening>,
    recheck: Duration,
    /// The next notification, armed before the last read.
    woken: Option<Wakeup>,
    /// When to read again without one; `None` before the first read.
    until: Option<Instant>,
}

impl<R, Fut> Observer<R>
where
    R: Fn() -> Fut,
    Fut: Future<Output = Result<Option<Leader>>>,
{
    async fn next(&mut self) -> Result<Option<Leader>> {
        if let Some(until) = self.until.take() {
            let sleep = tokio::time::sleep_until(until);
            match self.woken.take() {
                Some(woken) => tokio::select! {
                    () = woken => {}
                    () = sleep => {}
                },
                None => sleep.await,
            }
        }
        self.woken = Some(self.signal.wakeup());
        let read = (self.read)().await;
        let every = match &read {
            Ok(_) => self.recheck,
            Err(_) => self.recheck.min(LEADER_POLL),
        };
        let pause = match &read {
            Ok(Some(l)) => l
                .remaining
                .map_or(every, |r| every.min(r.saturating_add(AFTER_EXPIRY))),
            _ => every,
        };
        self.until = Some(Instant::now() + pause);
        read
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use distlock_core::FencingToken;

    use super::*;
    use crate::AbortOnDrop;

    fn listening() -> Arc<Listening> {
        Arc::new(Listening(AbortOnDrop(tokio::spawn(
            std::future::pending::<()>(),
        ))))
    }

    /// Reads `leaders` in turn (the last one for ever), counting reads.
    fn reader(
        leaders: Vec<Option<Leader>>,
        reads: Arc<AtomicUsize>,
    ) -> impl Fn() -> std::future::Ready<Result<Option<Leader>>> + Send + 'static {
        move || {
            let n = reads.fetch_add(1, Ordering::SeqCst);
            std::future::ready(Ok(leaders[n.min(leaders.len() - 1)].clone()))
        }
    }

    /// Far longer than any wait below: only a wake-up or a lease end can
    /// end one in time.
    const QUIET: Duration = Duration::from_secs(60);
    const BOUND: Duration = Duration::from_secs(5);

    #[tokio::test]
    async fn a_notification_wakes_it_and_nothing_else_does_before_the_recheck() {
        let signal = Signal::default();
        let reads = Arc::new(AtomicUsize::new(0));
        let a = Leader::new("a", FencingToken(1));
        let read = reader(vec![None, Some(a)], reads.clone());
        let mut s = leaders(listening(), signal.clone(), QUIET, read);
        assert!(s.next().await.unwrap().unwrap().is_none());
        // Armed before the read: a notification sent before the next poll
        // is not missed.
        signal.wake_all();
        let got = tokio::time::timeout(BOUND, s.next()).await.unwrap();
        assert_eq!(got.unwrap().unwrap().unwrap().value, "a");
        // Nothing notifies and no lease is known: no read before the recheck.
        assert!(tokio::time::timeout(Duration::from_millis(300), s.next())
            .await
            .is_err());
        assert_eq!(reads.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn the_end_of_the_lease_is_read_without_a_notification() {
        let a = Leader::new("a", FencingToken(1)).with_remaining(Some(Duration::from_millis(100)));
        let read = reader(vec![Some(a), None], Arc::default());
        let mut s = leaders(listening(), Signal::default(), QUIET, read);
        assert!(s.next().await.unwrap().unwrap().is_some());
        let start = Instant::now();
        let next = tokio::time::timeout(BOUND, s.next()).await.unwrap();
        assert!(next.unwrap().unwrap().is_none());
        assert!(start.elapsed() >= Duration::from_millis(100));
    }

    #[tokio::test]
    async fn a_short_recheck_reads_a_silent_election_again() {
        let reads = Arc::new(AtomicUsize::new(0));
        let read = reader(vec![None], reads.clone());
        let recheck = Duration::from_millis(50);
        let mut s = leaders(listening(), Signal::default(), recheck, read);
        for _ in 0..3 {
            let read = tokio::time::timeout(BOUND, s.next()).await.unwrap();
            assert!(read.unwrap().unwrap().is_none());
        }
        assert_eq!(reads.load(Ordering::SeqCst), 3);
    }

    #[tokio::test]
    async fn dropping_the_stream_drops_its_hold_on_the_listener() {
        let l = listening();
        let s = leaders(
            l.clone(),
            Signal::default(),
            Duration::from_secs(1),
            reader(vec![None], Arc::default()),
        );
        assert_eq!(Arc::strong_count(&l), 2);
        drop(s);
        assert_eq!(Arc::strong_count(&l), 1);
    }
}
