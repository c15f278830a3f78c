//! A lease session: one etcd lease shared by the locks of one client (per
//! TTL), kept alive in the background, and reported lost when it ends.

use std::sync::Mutex;
use std::time::Duration;

use distlock_core::LostReason;
use etcd_client::Client;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::Instant;

/// A request to keep the lease alive now; answered with whether it lives.
type Refresh = oneshot::Sender<Result<bool, String>>;

pub(crate) struct Session {
    pub(crate) lease: i64,
    lost: watch::Receiver<Option<LostReason>>,
    refresh: mpsc::Sender<Refresh>,
    task: tokio::task::JoinHandle<()>,
    /// Local, conservative end of the lease: the instant before the last
    /// successful keep-alive was sent, plus the granted TTL.
    expires: Mutex<Instant>,
    /// The TTL etcd granted.
    granted: Duration,
}

impl Drop for Session {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Session {
    /// Grants a lease of `ttl_secs` (etcd may grant more) and starts keeping it alive.
    pub(crate) async fn start(
        client: &Client,
        ttl_secs: i64,
    ) -> Result<std::sync::Arc<Self>, etcd_client::Error> {
        let sent = Instant::now();
        let grant = client.clone().lease_grant(ttl_secs, None).await?;
        let (lease, granted) = (grant.id(), Duration::from_secs(grant.ttl().max(1) as u64));
        let (lost_tx, lost) = watch::channel(None);
        let (refresh, requests) = mpsc::channel(64);
        let session = std::sync::Arc::new_cyclic(|weak: &std::sync::Weak<Session>| {
            let task = tokio::spawn(keep_alive(
                client.clone(),
                lease,
                granted,
                lost_tx,
                requests,
                weak.clone(),
            ));
            Session {
                lease,
                lost,
                refresh,
                task,
                expires: Mutex::new(sent + granted),
                granted,
            }
        });
        Ok(session)
    }

    /// When the lease's current term began, conservatively: the instant
    /// before the last successful keep-alive (or the grant) was sent.
    pub(crate) fn lease_began(&self) -> Instant {
        *self.expires.lock().unwrap_or_else(|e| e.into_inner()) - self.granted
    }

    pub(crate) fn is_lost(&self) -> bool {
        self.lost.borrow().is_some()
    }

    /// Resolves when the session ends.
    pub(crate) async fn lost(&self) -> LostReason {
        let mut rx = self.lost.clone();
        loop {
            if let Some(r) = rx.borrow_and_update().clone() {
                return r;
            }
            if rx.changed().await.is_err() {
                return LostReason::SessionLost("the etcd client was dropped".into());
            }
        }
    }

    /// Ends the session if etcd no longer knows its lease: keeps it alive
    /// now, and once more after a failure (a keep-alive stream broken by a
    /// member's restart fails first, and the next one opened gets etcd's
    /// answer).
    pub(crate) async fn check_lease(&self) {
        if self.refresh().await.is_err() {
            let _ = self.refresh().await;
        }
    }

    /// Keeps the lease alive now; `Ok(false)` if etcd says it is gone.
    pub(crate) async fn refresh(&self) -> Result<bool, String> {
        let (tx, rx) = oneshot::channel();
        self.refresh
            .send(tx)
            .await
            .map_err(|_| "the session's keep-alive task has ended".to_string())?;
        rx.await
            .map_err(|_| "the session's keep-alive task has ended".to_string())?
    }
}

async fn keep_alive(
    mut client: Client,
    lease: i64,
    ttl: Duration,
    lost: watch::Sender<Option<LostReason>>,
    mut requests: mpsc::Receiver<Refresh>,
    session: std::sync::Weak<Session>,
) {
    let mut stream = None;
    let mut next = Instant::now() + ttl / 3;
    loop {
        let mut waiting = Vec::new();
        tokio::select! {
            () = tokio::time::sleep_until(next) => {}
            r = requests.recv() => match r {
                Some(r) => waiting.push(r),
                None => return,
            },
        }
        while let Ok(r) = requests.try_recv() {
            waiting.push(r);
        }
        let sent = Instant::now();
        let outcome = async {
            if stream.is_none() {
                stream = Some(client.lease_keep_alive(lease).await?);
            }
            let Some((keeper, responses)) = stream.as_mut() else {
                unreachable!()
            };
            keeper.keep_alive().await?;
            Ok::<_, etcd_client::Error>(responses.message().await?.map(|r| r.ttl()))
        };
        let outcome = tokio::time::timeout(ttl / 3, outcome).await;
        let result = match outcome {
            Ok(Ok(Some(remaining))) if remaining > 0 => {
                if let Some(s) = session.upgrade() {
                    *s.expires.lock().unwrap_or_else(|e| e.into_inner()) = sent + ttl;
                }
                next = sent + ttl / 3;
                Ok(true)
            }
            // A stream that ended without an answer (a member or proxy
            // closing it) says nothing about the lease: open a new one.
            Ok(Ok(None)) => {
                stream = None;
                Err("the keep-alive stream ended".to_string())
            }
            Ok(Ok(Some(_))) => {
                let _ = lost.send(Some(LostReason::SessionLost(format!(
                    "etcd lease {lease:x} expired or was revoked"
                ))));
                for w in waiting {
                    let _ = w.send(Ok(false));
                }
                return;
            }
            // The lease is gone (a member restarted without its data).
            Ok(Err(e)) if crate::lease_not_found(&e) => {
                let _ = lost.send(Some(LostReason::SessionLost(format!(
                    "etcd no longer knows lease {lease:x}: {e}"
                ))));
                for w in waiting {
                    let _ = w.send(Ok(false));
                }
                return;
            }
            Ok(Err(e)) => {
                stream = None;
                Err(e.to_string())
            }
            Err(_) => {
                stream = None;
                Err("keep-alive did not answer in time".to_string())
            }
        };
        if let Err(e) = &result {
            tracing::warn!(lease = format_args!("{lease:x}"), error = %e, "etcd keep-alive failed; retrying");
            let expired = session.upgrade().is_none_or(|s| {
                Instant::now() >= *s.expires.lock().unwrap_or_else(|e| e.into_inner())
            });
            if expired {
                let _ = lost.send(Some(LostReason::SessionLost(format!(
                    "keep-alive of etcd lease {lease:x} failed until it expired: {e}"
                ))));
                for w in waiting {
                    let _ = w.send(Ok(false));
                }
                return;
            }
            next = Instant::now() + Duration::from_millis(200);
        }
        for w in waiting {
            let _ = w.send(result.clone());
        }
    }
}
