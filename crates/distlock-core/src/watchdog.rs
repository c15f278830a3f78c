//! The renewal watchdog: one task per hold that renews at about TTL/3 and
//! reports the hold lost when it can no longer vouch for it. The renewal
//! itself goes through the client's [`Renewer`](crate::renewer), which
//! batches it with others when the backend can.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tracing::Instrument;

use crate::error::LostReason;
use crate::guard::{Hold, HoldState};

pub(crate) async fn run(hold: Arc<Hold>) {
    let backend = hold.client.backend.clone();
    let caps = &hold.client.caps;
    let req = hold.req.clone();
    let period = req.ttl / 3;
    let mut rx = hold.state.subscribe();
    let session = backend.session_lost(&req);
    tokio::pin!(session);

    let mut renewing = hold.renew && caps.extend;
    let renewer = &hold.client.renewer;
    let schedule = |at: Instant| {
        if renewer.batching() {
            crate::renewer::align(at, period)
        } else {
            at
        }
    };
    let mut next_renew = schedule(hold.granted_at + period);
    let mut last_error: Option<String> = None;
    let mut capped_by_max_hold = false;

    loop {
        let deadline = match &*rx.borrow_and_update() {
            HoldState::Held { deadline } => *deadline,
            _ => return,
        };
        let wake = if renewing {
            next_renew.min(deadline)
        } else {
            deadline
        };
        tokio::select! {
            biased;
            changed = rx.changed() => {
                if changed.is_err() {
                    return;
                }
                continue;
            }
            reason = &mut session => {
                hold.mark_lost(reason);
                release_after_loss(&hold).await;
                return;
            }
            () = tokio::time::sleep_until(wake) => {}
        }

        let now = Instant::now();
        if now >= deadline {
            let reason = match last_error.take() {
                Some(e) => LostReason::RenewalFailed(e),
                None if capped_by_max_hold => LostReason::MaxHoldReached,
                None => LostReason::DeadlinePassed,
            };
            hold.mark_lost(reason);
            release_after_loss(&hold).await;
            return;
        }

        let mut ttl = req.ttl;
        if let Some(until) = hold.max_hold_until {
            let left = until.saturating_duration_since(now);
            if left < ttl {
                capped_by_max_hold = true;
                ttl = left;
                if ttl < caps.min_ttl {
                    renewing = false;
                    continue;
                }
            }
        }

        let sent = Instant::now();
        let span = tracing::debug_span!("distlock.renew", lock = %req.name, token = %hold.token);
        let renewal = req.with_ttl(ttl);
        let extend = renewer.extend(renewal).instrument(span);
        match tokio::time::timeout_at(deadline, extend).await {
            Ok(Ok(true)) => {
                hold.transition(HoldState::Held {
                    deadline: sent + caps.safe_validity(ttl),
                });
                next_renew = schedule(sent + period);
                last_error = None;
                tracing::trace!(lock = %req.name, ?ttl, "renewed");
            }
            Ok(Ok(false)) => {
                // Not ours any more: do not release, it may be someone else's.
                hold.mark_lost(LostReason::RenewalRejected);
                return;
            }
            Ok(Err(e)) => {
                tracing::warn!(lock = %req.name, error = %e, "renewal failed; retrying until the deadline");
                last_error = Some(e);
                let retry = (period / 4).max(Duration::from_millis(5));
                next_renew = Instant::now() + crate::poll::jitter(retry);
            }
            Err(_) => {
                last_error = Some("the renewal request had not answered by the deadline".into());
            }
        }
    }
}

/// After a loss the backend may still hold the lease for us (a partition, a
/// slow server). Releasing by owner can only free our own entry, so it is
/// always safe and shortens everyone else's wait.
async fn release_after_loss(hold: &Hold) {
    if let Err(e) = hold.client.backend.release(&hold.req).await {
        tracing::debug!(lock = %hold.req.name, error = %e, "release after loss failed");
    }
}
