//! Waiting for a grant: one loop for every backend ([`wait_for_grant`]),
//! parameterised by the backend's attempt and its source of wake-ups
//! ([`Wakeups`]), and the deadline of a native wait ([`WaitClock`]).

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use crate::backend::{Backend, Grant, LockRequest};
use crate::error::{Error, Result};
use crate::lease::lock;
use crate::name::LockName;
use crate::token::FencingToken;

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

/// How long a waiter's entry in a server-side wait queue lasts from now:
/// `lease`, but never past the wait's `deadline` (and a few milliseconds
/// for the request to get there), so a wait that times out leaves no entry
/// behind even if its leaving is lost.
pub fn queue_entry_life(lease: Duration, deadline: Option<Instant>) -> Duration {
    deadline.map_or(lease, |d| {
        lease.min(d.saturating_duration_since(Instant::now()) + Duration::from_millis(5))
    })
}

/// Checks how long a waiter's entry in a server-side wait queue outlives
/// its last attempt (a backend's `queue_lease`): at least 30 ms, since
/// waiters renew their entries every third of it.
pub fn check_queue_lease(lease: Duration) -> Result<()> {
    if lease < Duration::from_millis(30) {
        return Err(Error::invalid(
            crate::InputKind::Config,
            format!(
                "queue_lease is {lease:?}; it must be at least 30 ms (waiters renew their entries every third of it)"
            ),
        ));
    }
    Ok(())
}

/// What one attempt at a name found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Granted, with this token.
    Granted(FencingToken),
    /// Held; how long until the holder's lease (a semaphore's
    /// earliest-ending permit) ends, when the server said.
    Held(Option<Duration>),
    /// Refused for a reason that clears by itself: try again after this
    /// delay without waiting for a wake-up (Redlock's split vote).
    RetryIn(Duration),
}

impl Outcome {
    /// The token, if granted.
    pub fn token(self) -> Option<FencingToken> {
        match self {
            Outcome::Granted(t) => Some(t),
            _ => None,
        }
    }
}

/// How long a waiter sleeps when no wake-up comes.
#[derive(Clone, Copy, Debug)]
pub enum Pace {
    /// Woken by the backend: re-check just after the holder's lease ends
    /// (an expiry sends no notification), after `unknown` when the server
    /// did not say when, and at least every `cap`.
    Notified {
        /// Delay when the holder's remaining lease is unknown.
        unknown: Duration,
        /// Longest sleep, whatever the lease.
        cap: Duration,
    },
    /// Polled with backoff, or just after the holder's lease ends if that
    /// comes first.
    Backoff(Backoff),
}

/// A waiter there a moment early would only sleep again.
const AFTER_EXPIRY: Duration = Duration::from_millis(2);

impl Pace {
    /// Woken by the backend, re-checking when the lease ends and after
    /// `unknown` when the server cannot tell, never sleeping longer.
    pub fn notified(unknown: Duration) -> Self {
        Pace::Notified {
            unknown,
            cap: Duration::MAX,
        }
    }

    fn delay(&self, attempt: u32, left: Option<Duration>) -> Duration {
        let (unknown, cap) = match *self {
            Pace::Notified { unknown, cap } => (unknown, cap),
            Pace::Backoff(b) => {
                let d = b.delay(attempt);
                (d, d)
            }
        };
        left.map_or(unknown, |l| l.saturating_add(AFTER_EXPIRY))
            .min(cap)
    }
}

/// A registered wake-up: resolves at the first wake-up after it was made.
pub type Wakeup = Pin<Box<dyn Future<Output = ()> + Send>>;

/// Where a waiting acquire's wake-ups come from (a release, a freed permit,
/// a changed limit). [`wait_for_grant`] drives it; a backend implements only
/// how to subscribe and what to wait on.
pub trait Wakeups: Send {
    /// Registers for the next wake-up. Called before each attempt, so one
    /// that happens while the attempt is on the wire is not missed. `None`
    /// when nothing can wake the waiter now (not subscribed yet, or the
    /// subscription's connection died): then only the timer does.
    fn arm(&mut self) -> Option<Wakeup>;

    /// Gets ready to be woken before the first attempt, if that sends
    /// nothing to the server (a subscription this client already has);
    /// answers whether it did. A waiter ready this way is refused once and
    /// sleeps, where one that is not asks once more after
    /// [`prepare`](Wakeups::prepare). The default does nothing.
    fn ready(&mut self) -> impl Future<Output = Result<bool>> + Send {
        async { Ok(false) }
    }

    /// Gets ready to be woken: subscribes, or subscribes again after the
    /// subscription's connection died. Called after the first refused
    /// attempt that ran with nothing armed, and before every attempt after
    /// that, so it is cheap when there is nothing to do.
    fn prepare(&mut self) -> impl Future<Output = Result<()>> + Send {
        async { Ok(()) }
    }

    /// The armed wake-up fired; the next attempt acts on it.
    fn woken(&mut self) {}

    /// The attempt after a wake-up has answered.
    fn answered(&mut self) {}
}

/// No wake-ups: the timer alone (polling).
#[derive(Clone, Copy, Debug, Default)]
pub struct NoWakeups;

impl Wakeups for NoWakeups {
    fn arm(&mut self) -> Option<Wakeup> {
        None
    }
}

/// Wake-ups from one name's [`Signal`] in this process. A wake-up for one
/// waiter (a freed permit) that this waiter takes and does not act on,
/// because it is dropped before its next attempt answers, passes to
/// another waiter of the signal: a freed permit is not left unclaimed while
/// the others sleep until the next expiry.
#[derive(Debug)]
pub struct Signalled {
    signal: Option<Signal>,
    baton: Option<Signal>,
}

impl Signalled {
    /// Woken by `signal`.
    pub fn new(signal: Signal) -> Self {
        Self::from(Some(signal))
    }

    /// The signal now woken by, if any.
    pub fn signal(&self) -> Option<&Signal> {
        self.signal.as_ref()
    }

    /// Replaces the signal (a new subscription's; `None` when there is none).
    pub fn set(&mut self, signal: Option<Signal>) {
        self.signal = signal;
    }
}

impl From<Option<Signal>> for Signalled {
    fn from(signal: Option<Signal>) -> Self {
        Self {
            signal,
            baton: None,
        }
    }
}

impl Wakeups for Signalled {
    fn arm(&mut self) -> Option<Wakeup> {
        self.signal.as_ref().map(Signal::wakeup)
    }

    fn woken(&mut self) {
        self.baton = self.signal.clone();
    }

    fn answered(&mut self) {
        self.baton = None;
    }
}

impl Drop for Signalled {
    fn drop(&mut self) {
        if let Some(s) = self.baton.take() {
            s.wake_one();
        }
    }
}

/// What the waiters of one name in this process park on.
#[derive(Clone, Debug, Default)]
pub struct Signal(Arc<Notify>);

impl Signal {
    /// Wakes one waiter (a freed permit); kept for the next one to arm if
    /// none is waiting.
    pub fn wake_one(&self) {
        self.0.notify_one();
    }

    /// Wakes every waiter armed now (a released lock, a changed limit, a
    /// lost connection).
    pub fn wake_all(&self) {
        self.0.notify_waiters();
    }

    /// A wake-up registered now.
    pub fn wakeup(&self) -> Wakeup {
        let mut w = Box::pin(self.0.clone().notified_owned());
        w.as_mut().enable();
        w
    }
}

/// Per name, the [`Signal`] of its waiters in this process; entries live
/// while someone holds the signal.
#[derive(Debug, Default)]
pub struct Signals(Mutex<HashMap<Box<str>, Weak<Notify>>>);

impl Signals {
    /// The signal for `key`, made if there is none.
    pub fn get(&self, key: &str) -> Signal {
        let mut map = lock(&self.0);
        if let Some(n) = map.get(key).and_then(Weak::upgrade) {
            return Signal(n);
        }
        if map.len() >= 64 && map.len().is_power_of_two() {
            map.retain(|_, w| w.strong_count() > 0);
        }
        let n = Arc::new(Notify::new());
        map.insert(key.into(), Arc::downgrade(&n));
        Signal(n)
    }

    /// The signal for `key` if someone waits on it.
    pub fn find(&self, key: &str) -> Option<Signal> {
        lock(&self.0).get(key).and_then(Weak::upgrade).map(Signal)
    }

    /// Wakes every waiter of every name (the notifications' connection was
    /// lost: anything may have changed).
    pub fn wake_everyone(&self) {
        for n in lock(&self.0).values().filter_map(Weak::upgrade) {
            n.notify_waiters();
        }
    }
}

/// The wait of every backend: attempts until one grants, the deadline
/// passes ([`Error::WaitTimeout`]), or for ever without one. Between
/// attempts it sleeps until a wake-up from `wakeups` or the time `pace`
/// gives, whichever comes first.
///
/// The first attempt runs with whatever `wakeups` can arm at once (after
/// [`Wakeups::ready`]); if that was nothing, the first refusal prepares it
/// (subscribes) and attempts again at once, so an uncontended acquire costs
/// one attempt and no subscription, and a release between the refusal and
/// the subscription is not missed. Getting ready to be woken counts against
/// the deadline like the attempts: a subscription that does not answer ends
/// the wait there too. Cancellation-safe: between attempts nothing is held
/// or queued.
pub async fn wait_for_grant<W, F, Fut>(
    name: &LockName,
    deadline: Option<Instant>,
    pace: Pace,
    wakeups: &mut W,
    mut attempt: F,
) -> Result<Grant>
where
    W: Wakeups,
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Outcome>>,
{
    let clock = WaitClock::start(name, deadline);
    let mut prepared = clock.within(wakeups.ready()).await?;
    let mut armed = wakeups.arm();
    let mut n = 0u32;
    loop {
        let began = Instant::now();
        let outcome = attempt().await?;
        wakeups.answered();
        let delay = match outcome {
            Outcome::Granted(t) => return Ok(Grant::new(t, began)),
            Outcome::Held(left) => pace.delay(n, left),
            Outcome::RetryIn(d) => d,
        };
        let wake = clock.retry_at(Instant::now() + delay)?;
        if armed.is_none() && !prepared {
            prepared = true;
            clock.within(wakeups.prepare()).await?;
            armed = wakeups.arm();
            if armed.is_some() && matches!(outcome, Outcome::Held(_)) {
                continue;
            }
        }
        let sleep = tokio::time::sleep_until(wake);
        match armed.take() {
            Some(w) => tokio::select! {
                () = sleep => {}
                () = w => wakeups.woken(),
            },
            None => sleep.await,
        }
        n = n.saturating_add(1);
        if prepared {
            clock.within(wakeups.prepare()).await?;
        }
        armed = wakeups.arm();
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
    wait_for_grant(
        &req.name,
        deadline,
        Pace::Backoff(backoff),
        &mut NoWakeups,
        || async {
            Ok(match backend.try_acquire(req).await? {
                Some(g) => Outcome::Granted(g.token),
                None => Outcome::Held(None),
            })
        },
    )
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_queue_entry_outlives_neither_its_lease_nor_the_wait() {
        let lease = Duration::from_secs(3);
        assert_eq!(queue_entry_life(lease, None), lease);
        let far = Instant::now() + Duration::from_secs(60);
        assert_eq!(queue_entry_life(lease, Some(far)), lease);
        let soon = Instant::now() + Duration::from_millis(100);
        let life = queue_entry_life(lease, Some(soon));
        assert!(life <= Duration::from_millis(105), "{life:?}");
        let past = Instant::now() - Duration::from_millis(1);
        assert_eq!(
            queue_entry_life(lease, Some(past)),
            Duration::from_millis(5)
        );
    }

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

    fn name() -> LockName {
        LockName::new("wait/test").unwrap()
    }

    #[tokio::test]
    async fn a_dropped_waiter_hands_its_wakeup_to_the_next() {
        let signal = Signal::default();
        let mut first = Signalled::new(signal.clone());
        let (woken, next) = (first.arm().unwrap(), signal.wakeup());
        signal.wake_one();
        woken.await;
        first.woken();
        // Cancelled before its attempt answers.
        drop(first);
        tokio::time::timeout(Duration::from_secs(1), next)
            .await
            .expect("the wake-up died with the cancelled waiter");
    }

    #[tokio::test]
    async fn a_used_wakeup_wakes_nobody() {
        let signal = Signal::default();
        let mut first = Signalled::new(signal.clone());
        let woken = first.arm().unwrap();
        signal.wake_one();
        woken.await;
        first.woken();
        first.answered();
        drop(first);
        assert!(
            tokio::time::timeout(Duration::from_millis(50), signal.wakeup())
                .await
                .is_err(),
            "a used wake-up was passed on"
        );
    }

    #[tokio::test]
    async fn a_wakeup_during_an_attempt_is_not_missed() {
        let signal = Signal::default();
        let mut wakeups = Signalled::new(signal.clone());
        let mut calls = 0;
        let grant = tokio::time::timeout(
            Duration::from_secs(5),
            wait_for_grant(
                &name(),
                None,
                Pace::notified(Duration::from_secs(3600)),
                &mut wakeups,
                || {
                    calls += 1;
                    let first = calls == 1;
                    let signal = signal.clone();
                    async move {
                        if first {
                            // A release lands while the refusal is on its way.
                            signal.wake_all();
                            return Ok(Outcome::Held(None));
                        }
                        Ok(Outcome::Granted(FencingToken(7)))
                    }
                },
            ),
        )
        .await
        .expect("slept through a wake-up")
        .unwrap();
        assert_eq!((grant.token, calls), (FencingToken(7), 2));
    }

    /// Subscribes on `prepare`, and counts how often.
    #[derive(Default)]
    struct Lazy {
        signal: Option<Signal>,
        prepared: u32,
    }

    impl Wakeups for Lazy {
        fn arm(&mut self) -> Option<Wakeup> {
            self.signal.as_ref().map(Signal::wakeup)
        }

        async fn prepare(&mut self) -> Result<()> {
            self.prepared += 1;
            self.signal.get_or_insert_with(Signal::default);
            Ok(())
        }
    }

    #[tokio::test]
    async fn the_first_refusal_subscribes_and_tries_again_at_once() {
        let mut wakeups = Lazy::default();
        let mut calls = 0;
        let grant = tokio::time::timeout(
            Duration::from_secs(5),
            wait_for_grant(
                &name(),
                None,
                Pace::notified(Duration::from_secs(3600)),
                &mut wakeups,
                || {
                    calls += 1;
                    let n = calls;
                    async move {
                        Ok(match n {
                            1 => Outcome::Held(None),
                            _ => Outcome::Granted(FencingToken(1)),
                        })
                    }
                },
            ),
        )
        .await
        .expect("waited before the second attempt")
        .unwrap();
        assert_eq!(
            (grant.token, calls, wakeups.prepared),
            (FencingToken(1), 2, 1)
        );
    }

    #[tokio::test]
    async fn the_deadline_ends_the_wait_with_a_timeout() {
        let deadline = Instant::now() + Duration::from_millis(50);
        let answer = wait_for_grant(
            &name(),
            Some(deadline),
            Pace::Backoff(Backoff::new(
                Duration::from_millis(5),
                Duration::from_millis(10),
            )),
            &mut NoWakeups,
            || async { Ok(Outcome::Held(None)) },
        )
        .await;
        assert!(
            matches!(answer, Err(Error::WaitTimeout { .. })),
            "{answer:?}"
        );
    }

    /// Never gets ready: a subscription whose server does not answer.
    struct Unanswered;

    impl Wakeups for Unanswered {
        fn arm(&mut self) -> Option<Wakeup> {
            None
        }

        async fn prepare(&mut self) -> Result<()> {
            std::future::pending().await
        }
    }

    #[tokio::test]
    async fn a_subscription_that_never_answers_ends_at_the_deadline() {
        let deadline = Instant::now() + Duration::from_millis(50);
        let answer = tokio::time::timeout(
            Duration::from_secs(5),
            wait_for_grant(
                &name(),
                Some(deadline),
                Pace::notified(Duration::from_secs(3600)),
                &mut Unanswered,
                || async { Ok(Outcome::Held(None)) },
            ),
        )
        .await
        .expect("the wait outlived its deadline");
        assert!(
            matches!(answer, Err(Error::WaitTimeout { .. })),
            "{answer:?}"
        );
    }
}
