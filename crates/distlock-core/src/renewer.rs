//! Batched renewal. The keeper decides *when* a lease renews; when the
//! backend can extend many holds in one request
//! ([`Capabilities::extend_batch`](crate::Capabilities::extend_batch) > 1),
//! the renewal goes through one task per client that collects everything
//! queued at once and sends it in one [`Backend::extend_many`] call, each
//! call in a task of its own. The keeper also rounds
//! renewal times down to a shared grid, so leases taken at different moments
//! come due together. Holding M locks then costs about M / batch requests
//! per renewal period instead of M. Each answer goes back to the keeper
//! through the callback it gave the renewer, so the renewer knows only
//! leases and the backend.
//!
//! A renewal waits for its answer only until its lease's deadline (a
//! batch's, the earliest among its leases): past it the answer is worth
//! nothing, and a request the server never answers (its reply lost on a
//! connection the network stopped serving) holds up no other renewal, as
//! it goes in a task of its own. Cut off, it counts as failed, and the
//! leases still held renew again.

use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::Instant;
use tracing::Instrument;

use crate::backend::{DynBackend, LockRequest};
use crate::lease::{lock, HoldState, Lease};

/// Where a renewal's answer goes: the lease, when the renewal was asked for,
/// its TTL, and the backend's answer.
pub(crate) type Answered =
    Arc<dyn Fn(Arc<Lease>, Instant, Duration, Result<bool, String>) + Send + Sync>;

/// One renewal: the lease, when the keeper asked (the new deadline counts
/// from here, so waiting in the queue only shortens it) and the TTL.
struct Pending {
    lease: Arc<Lease>,
    sent: Instant,
    ttl: Duration,
}

pub(crate) struct Renewer {
    backend: DynBackend,
    max_batch: usize,
    answered: Answered,
    /// Started on first use, inside the caller's runtime; started again if
    /// that runtime has gone away.
    queue: Mutex<Option<mpsc::UnboundedSender<Pending>>>,
}

impl Renewer {
    pub(crate) fn new(backend: DynBackend, max_batch: usize, answered: Answered) -> Self {
        Self {
            backend,
            max_batch: max_batch.max(1),
            answered,
            queue: Mutex::new(None),
        }
    }

    pub(crate) fn batching(&self) -> bool {
        self.max_batch > 1
    }

    /// Renews `lease` to `ttl`, alone or in a batch; the answer goes to
    /// the callback.
    pub(crate) fn submit(&self, lease: Arc<Lease>, sent: Instant, ttl: Duration) {
        if !self.batching() {
            let (backend, answered) = (self.backend.clone(), self.answered.clone());
            tokio::spawn(async move {
                let req = lease.req.with_ttl(ttl);
                let span =
                    tracing::debug_span!("distlock.renew", lock = %req.name, token = %lease.token);
                let extend = backend.extend(&req).instrument(span);
                let answer = until_deadline([&lease], extend)
                    .await
                    .and_then(|a| a.map_err(|e| e.to_string()));
                answered(lease, sent, ttl, answer);
            });
            return;
        }
        let mut queue = lock(&self.queue);
        let tx = match queue.as_ref() {
            Some(tx) if !tx.is_closed() => tx,
            _ => {
                let (tx, rx) = mpsc::unbounded_channel();
                tokio::spawn(run(
                    self.backend.clone(),
                    self.max_batch,
                    self.answered.clone(),
                    rx,
                ));
                queue.insert(tx)
            }
        };
        if let Err(mpsc::error::SendError(p)) = tx.send(Pending { lease, sent, ttl }) {
            drop(queue);
            (self.answered)(
                p.lease,
                p.sent,
                p.ttl,
                Err("the renewal task has ended".into()),
            );
        }
    }
}

async fn run(
    backend: DynBackend,
    max_batch: usize,
    answered: Answered,
    mut queue: mpsc::UnboundedReceiver<Pending>,
) {
    let mut batch = Vec::with_capacity(max_batch);
    while queue.recv_many(&mut batch, max_batch).await > 0 {
        // Holds that came due at the same grid point are runnable now; let
        // them queue before sending, rather than sending the first alone.
        tokio::task::yield_now().await;
        while batch.len() < max_batch {
            match queue.try_recv() {
                Ok(p) => batch.push(p),
                Err(_) => break,
            }
        }
        // A lease released or lost meanwhile needs no renewal.
        batch.retain(|p| matches!(&*p.lease.state.get(), HoldState::Held { .. }));
        if batch.is_empty() {
            continue;
        }
        let reqs: Vec<LockRequest> = batch.iter().map(|p| p.lease.req.with_ttl(p.ttl)).collect();
        // Each batch in a task of its own: one the server does not answer
        // waits until its earliest deadline (a long hold's, maybe tens of
        // seconds away), and the renewals queued meanwhile, a shorter
        // hold's among them, go out as usual.
        let pending = std::mem::replace(&mut batch, Vec::with_capacity(max_batch));
        tokio::spawn(renew_batch(
            backend.clone(),
            answered.clone(),
            pending,
            reqs,
        ));
    }
}

/// Sends one batch of renewals and gives each hold its answer.
async fn renew_batch(
    backend: DynBackend,
    answered: Answered,
    batch: Vec<Pending>,
    reqs: Vec<LockRequest>,
) {
    let span = tracing::debug_span!("distlock.renew_batch", size = reqs.len());
    let extend = backend.extend_many(&reqs).instrument(span);
    let outcome = until_deadline(batch.iter().map(|p| &p.lease), extend).await;
    // One request the backend could not decide (Redlock: a lock whose
    // nodes are down, beside others' on nodes that answer) fails the whole
    // batch, and one hold's deadline cuts it for all (a short hold beside
    // long ones on a slow server): each is asked alone then, bounded by its
    // own deadline.
    if matches!(outcome, Ok(Err(_)) | Err(_)) && reqs.len() > 1 {
        let answers = futures_util::future::join_all(batch.iter().zip(&reqs).map(|(p, req)| {
            let span = tracing::debug_span!("distlock.renew", lock = %req.name);
            let extend = backend.extend(req).instrument(span);
            async move {
                match until_deadline([&p.lease], extend).await {
                    Ok(answer) => answer.map_err(|e| e.to_string()),
                    Err(e) => Err(e),
                }
            }
        }))
        .await;
        for (p, answer) in batch.into_iter().zip(answers) {
            answered(p.lease, p.sent, p.ttl, answer);
        }
        return;
    }
    let answers: Vec<Result<bool, String>> = match outcome {
        Ok(Ok(answers)) if answers.len() == reqs.len() => answers.into_iter().map(Ok).collect(),
        Ok(Ok(answers)) => {
            let e = format!(
                "the backend answered {} renewals for {} requests",
                answers.len(),
                reqs.len()
            );
            vec![Err(e); reqs.len()]
        }
        Ok(Err(e)) => vec![Err(e.to_string())],
        Err(e) => vec![Err(e); reqs.len()],
    };
    for (p, answer) in batch.into_iter().zip(answers) {
        answered(p.lease, p.sent, p.ttl, answer);
    }
}

/// `renewal`'s answer, or an error once the earliest deadline among
/// `leases` has passed without one. Not sent at all when every lease has
/// ended (released or lost) before it goes, nothing bounding its wait, or
/// when that deadline has passed already (a thread blocked past it): an
/// answer could only come too late.
async fn until_deadline<'a, T>(
    leases: impl IntoIterator<Item = &'a Arc<Lease>>,
    renewal: impl std::future::Future<Output = T>,
) -> Result<T, String> {
    match leases.into_iter().filter_map(|l| l.deadline()).min() {
        Some(deadline) if deadline <= Instant::now() => {
            Err("the lease's deadline passed before its renewal was sent".into())
        }
        Some(deadline) => tokio::time::timeout_at(deadline, renewal)
            .await
            .map_err(|_| "the renewal request had not answered by the lease's deadline".into()),
        None => Err("the lease ended before its renewal was sent".into()),
    }
}

/// Rounds a renewal time down to a grid of a quarter period, shared by the
/// whole process, so that holds with the same TTL come due together. Never
/// later than `at`, so the hold renews a little early, never late.
pub(crate) fn align(at: Instant, period: Duration) -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    let epoch = *EPOCH.get_or_init(Instant::now);
    let quantum = (period / 4).as_nanos();
    let Some(since) = at.checked_duration_since(epoch) else {
        return at;
    };
    if quantum == 0 {
        return at;
    }
    let since = since.as_nanos();
    let rounded = since - since % quantum;
    epoch + Duration::from_nanos(u64::try_from(rounded).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease(deadline: Instant) -> Arc<Lease> {
        let permit = Arc::new(tokio::sync::Semaphore::new(1))
            .try_acquire_owned()
            .unwrap();
        let name = crate::LockName::new("renewer/unit").unwrap();
        Arc::new(Lease::new(
            LockRequest::new(name, Duration::from_secs(3)),
            crate::FencingToken(1),
            deadline,
            crate::lease::Renewal::new(deadline, true),
            None,
            permit,
        ))
    }

    /// A renewal whose lease's deadline has passed is never started (a
    /// timeout polls its future once even past the deadline); one with
    /// time left is.
    #[tokio::test(start_paused = true)]
    async fn a_renewal_past_its_leases_deadline_is_not_sent() {
        let sent = std::sync::atomic::AtomicUsize::new(0);
        let renewal = || async {
            sent.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        };
        let now = Instant::now();
        let past = lease(now);
        let r = until_deadline([&past], renewal()).await;
        assert!(r.is_err());
        assert_eq!(sent.load(std::sync::atomic::Ordering::SeqCst), 0);
        let live = lease(now + Duration::from_secs(1));
        assert!(until_deadline([&live], renewal()).await.is_ok());
        assert_eq!(sent.load(std::sync::atomic::Ordering::SeqCst), 1);
        // In a batch, the earliest deadline decides.
        let r = until_deadline([&live, &past], renewal()).await;
        assert!(r.is_err());
        assert_eq!(sent.load(std::sync::atomic::Ordering::SeqCst), 1);
    }

    #[test]
    fn align_rounds_down_to_a_quarter_period_and_groups_nearby_times() {
        let period = Duration::from_secs(4);
        let t = Instant::now() + Duration::from_secs(100);
        let a = align(t, period);
        assert!(a <= t);
        assert!(t - a < Duration::from_secs(1));
        // Two times within one quantum share a grid point; one a quantum
        // later does not.
        let b = align(a + Duration::from_millis(999), period);
        assert_eq!(a, b);
        assert_eq!(
            align(a + Duration::from_secs(1), period),
            a + Duration::from_secs(1)
        );
    }
}
