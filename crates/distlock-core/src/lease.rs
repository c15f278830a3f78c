//! The renewable lease: one acquisition's request, token and state, and the
//! renewal bookkeeping the keeper owns.
//!
//! The bottom of core's layers: it knows no timer task, slot, guard or
//! client. Above it, [`keeper`](crate::keeper) times renewals and watches
//! sessions; [`slot`](crate::slot) keeps each name's local gate and the
//! holds for reentrancy; the client and the guard sit on top.

use std::sync::{Mutex, MutexGuard, PoisonError};

use tokio::sync::{Notify, OwnedSemaphorePermit};
use tokio::time::Instant;

use crate::backend::LockRequest;
use crate::error::LostReason;
use crate::token::FencingToken;

/// Locks one of core's short critical sections. A panic inside one leaves
/// the data consistent (every update is a single assignment), so poisoning
/// is not a reason to take the whole client down.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum HoldState {
    Held { deadline: Instant },
    Lost(LostReason),
    Released,
}

/// A lease's state, and a wake-up for those waiting for it to leave Held.
///
/// A mutex and one `Notify`: the state is read and written a few times per
/// acquisition, and only a loss or a release (once per lease) needs to wake
/// anyone.
pub(crate) struct StateCell {
    now: Mutex<HoldState>,
    /// The deadline of the last Held state, kept once the lease leaves it.
    last_deadline: Mutex<Option<Instant>>,
    settled: Notify,
}

impl StateCell {
    fn new(state: HoldState) -> Self {
        let last = match state {
            HoldState::Held { deadline } => Some(deadline),
            _ => None,
        };
        Self {
            now: Mutex::new(state),
            last_deadline: Mutex::new(last),
            settled: Notify::new(),
        }
    }

    /// The current state (hold the guard briefly).
    pub(crate) fn get(&self) -> MutexGuard<'_, HoldState> {
        lock(&self.now)
    }

    /// Applies `f`; if it changed the state and the state is no longer
    /// Held, wakes the waiters. Returns what `f` returned.
    fn update_if(&self, f: impl FnOnce(&mut HoldState) -> bool) -> bool {
        let mut s = lock(&self.now);
        let changed = f(&mut s);
        if let HoldState::Held { deadline } = *s {
            *lock(&self.last_deadline) = Some(deadline);
        }
        let settled = changed && !matches!(*s, HoldState::Held { .. });
        drop(s);
        if settled {
            self.settled.notify_waiters();
        }
        changed
    }

    fn set(&self, next: HoldState) {
        self.update_if(|s| {
            *s = next;
            true
        });
    }

    /// Resolves once the state is no longer Held (it never returns to
    /// Held), with that state.
    pub(crate) async fn settled(&self) -> HoldState {
        loop {
            let notified = self.settled.notified();
            tokio::pin!(notified);
            // Registered before the check, so a change in between wakes us.
            notified.as_mut().enable();
            let now = self.get().clone();
            if !matches!(now, HoldState::Held { .. }) {
                return now;
            }
            notified.await;
        }
    }
}

/// Per-lease renewal state, owned by the keeper.
#[derive(Debug)]
pub(crate) struct Renewal {
    pub(crate) next_renew: Instant,
    pub(crate) renewing: bool,
    pub(crate) in_flight: bool,
    pub(crate) last_error: Option<String>,
    pub(crate) capped_by_max_hold: bool,
    /// The extends out now (the keeper's renewals and the user's own), and
    /// those answered since one of them was sent.
    extends: Outstanding,
    /// The keeper's renewal out now, in `extends`.
    pub(crate) renewal_out: Option<u64>,
}

/// Extends of one lease that the server may apply in an order this side
/// cannot see (a pool sends them on different connections): one applied
/// after another sets the lease's end, so a grant can only promise the
/// earliest deadline among itself and every extend that may reach the
/// server after it: one still out, or one answered after it was sent. An
/// extend whose caller gave up on it stays out for the lease's life: it
/// may still land at any time.
#[derive(Debug, Default)]
struct Outstanding {
    next: u64,
    sent: Vec<SentExtend>,
}

#[derive(Debug)]
struct SentExtend {
    id: u64,
    sent: Instant,
    deadline: Instant,
    answered: Option<Instant>,
    granted: bool,
}

impl Renewal {
    pub(crate) fn new(next_renew: Instant, renewing: bool) -> Self {
        Self {
            next_renew,
            renewing,
            in_flight: false,
            last_error: None,
            capped_by_max_hold: false,
            extends: Outstanding::default(),
            renewal_out: None,
        }
    }

    /// An extend goes out at `sent` that would set the deadline to
    /// `deadline`: its id for [`answered`](Self::answered).
    pub(crate) fn sending(&mut self, sent: Instant, deadline: Instant) -> u64 {
        let e = &mut self.extends;
        e.next += 1;
        e.sent.push(SentExtend {
            id: e.next,
            sent,
            deadline,
            answered: None,
            granted: false,
        });
        e.next
    }

    /// The extend `id` answered now, `granted` or not: the deadline a grant
    /// of it sets (see [`Outstanding`]); `None` for an id not out.
    pub(crate) fn answered(&mut self, id: u64, granted: bool) -> Option<Instant> {
        let now = Instant::now();
        let e = &mut self.extends;
        let mine = e
            .sent
            .iter_mut()
            .find(|x| x.id == id && x.answered.is_none())?;
        mine.answered = Some(now);
        mine.granted = granted;
        let sent = mine.sent;
        // One answered before a granted one was sent came before that one
        // on the server: it sets the lease's end no more. One sent later
        // but still out, or refused, proves nothing: it may never land.
        if let Some(last_landed) = e.sent.iter().filter(|x| x.granted).map(|x| x.sent).max() {
            e.sent
                .retain(|x| x.answered.is_none_or(|a| a >= last_landed));
        }
        // Another one still out, or answered after this one was sent, may
        // reach the server after this one, and no earlier than this one
        // was sent: its TTL from then at the earliest.
        let granted = e
            .sent
            .iter()
            .filter(|x| x.id == id || x.answered.is_none_or(|a| a > sent))
            .map(|x| {
                if x.id == id {
                    x.deadline
                } else {
                    x.deadline + sent.saturating_duration_since(x.sent)
                }
            })
            .min();
        if e.sent.iter().all(|x| x.answered.is_some()) {
            // The next extend is sent after all of these answered.
            e.sent.clear();
        }
        granted
    }

    /// When the keeper must look at the lease next.
    pub(crate) fn wake_at(&self, deadline: Instant) -> Instant {
        if self.renewing && !self.in_flight {
            self.next_renew.min(deadline)
        } else {
            deadline
        }
    }
}

/// Where a lease sits in the keeper's timer map.
pub(crate) type TimerKey = (Instant, u64);

/// One backend-level acquisition as core tracks it.
pub(crate) struct Lease {
    pub(crate) req: LockRequest,
    pub(crate) token: FencingToken,
    pub(crate) max_hold_until: Option<Instant>,
    pub(crate) state: StateCell,
    /// Renewal bookkeeping, owned by the keeper.
    pub(crate) renewal: Mutex<Renewal>,
    /// This lease's entry in the keeper's timer map.
    pub(crate) timer: Mutex<Option<TimerKey>>,
    /// This lease's place in its session's watcher: (session key, slot).
    pub(crate) session: Mutex<Option<(u64, u64)>>,
    /// The local gate's permit: dropped when the lease ends, which lets the
    /// next local waiter of the name in.
    permit: Mutex<Option<OwnedSemaphorePermit>>,
}

impl Lease {
    pub(crate) fn new(
        req: LockRequest,
        token: FencingToken,
        deadline: Instant,
        renewal: Renewal,
        max_hold_until: Option<Instant>,
        permit: OwnedSemaphorePermit,
    ) -> Self {
        Self {
            req,
            token,
            max_hold_until,
            state: StateCell::new(HoldState::Held { deadline }),
            renewal: Mutex::new(renewal),
            timer: Mutex::new(None),
            session: Mutex::new(None),
            permit: Mutex::new(Some(permit)),
        }
    }

    /// Moves from Held to `next`; a lease that is already lost or released
    /// stays so. Returns whether the state changed.
    pub(crate) fn transition(&self, next: HoldState) -> bool {
        self.state.update_if(|s| {
            if matches!(s, HoldState::Held { .. }) {
                *s = next;
                true
            } else {
                false
            }
        })
    }

    /// An extend that failed or was cancelled may still have reached the
    /// server, which then ends the lease at `deadline` (as it was sent) if
    /// that is earlier: the local deadline moves no later than that.
    pub(crate) fn maybe_extended(&self, deadline: Instant) {
        self.state.update_if(|s| match s {
            HoldState::Held { deadline: d } if deadline < *d => {
                *d = deadline;
                true
            }
            _ => false,
        });
    }

    /// The local deadline, or `None` once lost or released.
    pub(crate) fn deadline(&self) -> Option<Instant> {
        match &*self.state.get() {
            HoldState::Held { deadline } => Some(*deadline),
            _ => None,
        }
    }

    /// The local deadline, or once lost or released the deadline it had
    /// last: where the lease ends on the server at the earliest.
    pub(crate) fn last_deadline(&self) -> Option<Instant> {
        let _state = self.state.get();
        *lock(&self.state.last_deadline)
    }

    /// Reports the lease lost and lets the next local waiter in: a lost
    /// lease can protect nothing, so it must not keep the client's other
    /// tasks from acquiring anew.
    pub(crate) fn mark_lost(&self, reason: LostReason) {
        if self.transition(HoldState::Lost(reason.clone())) {
            tracing::warn!(lock = %self.req.name, token = %self.token, %reason, "lock lost");
        }
        self.free_permit();
    }

    /// Marks the lease released (a renewal in flight then changes nothing).
    pub(crate) fn mark_released(&self) {
        self.state.set(HoldState::Released);
    }

    /// Ends the lease locally: released, and the local permit freed.
    pub(crate) fn end(&self) {
        self.mark_released();
        self.free_permit();
    }

    /// Lets the next local waiter in (the lease is over, whatever the
    /// server still has to answer about it).
    pub(crate) fn free_permit(&self) {
        lock(&self.permit).take();
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_grant_promises_the_earliest_deadline_of_the_extends_that_may_follow_it() {
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let to = |s: u64| tokio::time::advance(at(s) - Instant::now());
        let mut r = Renewal::new(t0, true);
        // A renewal and the user's long extend, out together.
        to(10).await;
        let renewal = r.sending(at(10), at(40));
        let long = r.sending(at(10), at(610));
        to(11).await;
        assert_eq!(r.answered(renewal, true), Some(at(40)));
        // The next renewal, sent after the first answered, while the long
        // extend is still out: its own deadline, not the first one's.
        to(20).await;
        let next = r.sending(at(20), at(50));
        to(21).await;
        assert_eq!(r.answered(next, true), Some(at(50)));
        // The long one may have reached the server before the second
        // renewal did.
        assert_eq!(r.answered(long, true), Some(at(50)));
        // Answered in the other order than sent: the later-sent one may
        // have been applied first, the earlier-sent one after it.
        to(30).await;
        let a = r.sending(at(30), at(100));
        let b = r.sending(at(30), at(60));
        to(31).await;
        assert_eq!(r.answered(b, true), Some(at(60)));
        assert_eq!(r.answered(a, true), Some(at(60)));
        // Alone again: a grant promises its own deadline; an id answered
        // twice or never sent is unknown.
        to(40).await;
        let c = r.sending(at(40), at(70));
        to(41).await;
        assert_eq!(r.answered(c, true), Some(at(70)));
        assert_eq!(r.answered(c, true), None);
    }

    /// An extend given up unanswered may land after any later one: every
    /// later grant promises no more than its TTL from the later one's
    /// sending.
    #[tokio::test(start_paused = true)]
    async fn an_extend_given_up_bounds_every_later_grant_by_its_ttl() {
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let to = |s: u64| tokio::time::advance(at(s) - Instant::now());
        let mut r = Renewal::new(t0, true);
        let _cut = r.sending(at(0), at(3));
        to(1).await;
        let renewal = r.sending(at(1), at(31));
        to(2).await;
        assert_eq!(r.answered(renewal, true), Some(at(4)));
        to(10).await;
        let next = r.sending(at(10), at(40));
        to(11).await;
        assert_eq!(r.answered(next, true), Some(at(13)));
    }

    /// An extend answered before a later one was sent came before it on
    /// the server only if the later one landed: while that one is out or
    /// was refused, the earlier one may still be the last applied after an
    /// extend sent before both.
    #[tokio::test(start_paused = true)]
    async fn an_answered_extend_counts_until_one_sent_after_it_is_granted() {
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let to = |s: u64| tokio::time::advance(at(s) - Instant::now());
        let mut r = Renewal::new(t0, true);
        to(10).await;
        let long = r.sending(at(10), at(40));
        to(11).await;
        let short = r.sending(at(11), at(16));
        to(12).await;
        assert_eq!(r.answered(short, true), Some(at(16)));
        // Sent after the short one answered, and never answered.
        to(13).await;
        let _out = r.sending(at(13), at(613));
        // The long one may have landed before the short one.
        to(14).await;
        assert_eq!(r.answered(long, true), Some(at(16)));

        // The same with the later one refused rather than out.
        let mut r = Renewal::new(t0, true);
        to(20).await;
        let long = r.sending(at(20), at(50));
        to(21).await;
        let short = r.sending(at(21), at(26));
        to(22).await;
        assert_eq!(r.answered(short, true), Some(at(26)));
        to(23).await;
        let refused = r.sending(at(23), at(623));
        to(24).await;
        assert_eq!(r.answered(refused, false), Some(at(53)));
        assert_eq!(r.answered(long, true), Some(at(26)));

        // Granted, the later one landed after the short one: the short one
        // no longer sets the end.
        let mut r = Renewal::new(t0, true);
        to(30).await;
        let long = r.sending(at(30), at(60));
        to(31).await;
        let short = r.sending(at(31), at(36));
        to(32).await;
        assert_eq!(r.answered(short, true), Some(at(36)));
        to(33).await;
        let later = r.sending(at(33), at(93));
        to(34).await;
        assert_eq!(
            r.answered(later, true),
            Some(at(60) + Duration::from_secs(3))
        );
        assert_eq!(r.answered(long, true), Some(at(60)));
    }
}
