//! Elections: a campaign is a hold of [`HoldKind::Leader`] carrying the
//! campaigner's value, so leadership is renewed, lost, fenced and cancelled
//! exactly as a lock is; on top of it sit [`Leadership::proclaim`],
//! [`Election::leader`] and [`Election::observe`].

use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::stream::{self, StreamExt};

use crate::backend::{DynBackend, HoldKind, Leader, LeaderStream};
use crate::client::{ClientInner, LockBuilder};
use crate::error::{LostReason, Result};
use crate::guard::LockGuard;
use crate::lease::lock;
use crate::name::LockName;
use crate::token::FencingToken;

/// The longest value a campaign or proclamation may carry, in bytes: small
/// enough for every backend's key or node value, large enough for a host,
/// a port and a version.
pub const MAX_VALUE_LEN: usize = 4096;

/// A value a leader may carry (1 to [`MAX_VALUE_LEN`] bytes of printable
/// text, which observers print on one line), or [`Error::InvalidInput`](crate::Error::InvalidInput)
/// saying why not.
fn checked_value(value: String) -> Result<String> {
    validate_election_value(&value)?;
    Ok(value)
}

/// Checks a value a leader may carry: 1 to [`MAX_VALUE_LEN`] bytes of
/// printable text. Another client's leader (`etcdctl elect`, a Curator
/// `LeaderLatch`) may carry any bytes; this tells whether a value read
/// prints as itself on one line.
pub fn validate_election_value(value: &str) -> Result<()> {
    crate::holder::check_one_line(
        "the election value",
        value,
        MAX_VALUE_LEN,
        "give the leader's address or name",
    )
}

/// One election, named like a lock: campaign for its leadership, read its
/// leader, or observe its leaders. Made by
/// [`LockClient::election`](crate::LockClient::election); cheap to clone.
#[derive(Clone)]
pub struct Election {
    pub(crate) client: Arc<ClientInner>,
    pub(crate) name: String,
    ttl: Duration,
    wait: Option<Duration>,
    holder_info: Option<String>,
}

impl fmt::Debug for Election {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Election")
            .field("name", &self.name)
            .field("ttl", &self.ttl)
            .field("wait", &self.wait)
            .finish()
    }
}

impl Election {
    pub(crate) fn new(client: Arc<ClientInner>, name: String) -> Self {
        Self {
            client,
            name,
            ttl: crate::DEFAULT_TTL,
            wait: None,
            holder_info: None,
        }
    }

    /// The holder info stored with a leadership this election grants, in
    /// place of the client's (see [`LockBuilder::holder_info`]).
    pub fn holder_info(mut self, info: impl Into<String>) -> Self {
        self.holder_info = Some(info.into());
        self
    }

    /// The leadership lease's TTL (default [`DEFAULT_TTL`](crate::DEFAULT_TTL)),
    /// renewed at about a third of it.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// How long [`campaign`](Self::campaign) waits to become leader
    /// (default: forever; a wait of more than
    /// [`LONGEST_WAIT`](crate::LONGEST_WAIT) is forever too); past it,
    /// [`Error::WaitTimeout`](crate::Error::WaitTimeout).
    pub fn wait(mut self, wait: Duration) -> Self {
        self.wait = (wait <= crate::LONGEST_WAIT).then_some(wait);
        self
    }

    fn builder(&self, value: String) -> Result<LockBuilder> {
        let value = checked_value(value)?;
        let mut b = LockBuilder::of(self.client.clone(), &self.name, HoldKind::Leader)
            .ttl(self.ttl)
            .with_value(value);
        if let Some(info) = &self.holder_info {
            b = b.holder_info(info);
        }
        b.wait = self.wait;
        Ok(b)
    }

    /// Waits to become leader, campaigning with `value`, and returns the
    /// leadership. On queue backends (etcd, ZooKeeper) campaigners are
    /// served in the order they joined. Dropping the future leaves nothing
    /// behind on the server.
    pub async fn campaign(&self, value: impl Into<String>) -> Result<Leadership> {
        let value = value.into();
        let guard = self.builder(value.clone())?.acquire().await?;
        Ok(Leadership::new(guard, value))
    }

    /// Becomes leader only if nobody leads or campaigns ahead now:
    /// `Ok(None)` otherwise, with nothing left behind.
    pub async fn try_campaign(&self, value: impl Into<String>) -> Result<Option<Leadership>> {
        let value = value.into();
        Ok(self
            .builder(value.clone())?
            .try_acquire()
            .await?
            .map(|guard| Leadership::new(guard, value)))
    }

    fn checked(&self) -> Result<(LockName, &DynBackend)> {
        let name = LockName::new(&self.name)?;
        crate::client::check_kind(&self.client.keeper.caps, &HoldKind::Leader)?;
        Ok((name, &self.client.keeper.backend))
    }

    /// The current leader, or `None` when nobody leads.
    pub async fn leader(&self) -> Result<Option<Leader>> {
        let (name, backend) = self.checked()?;
        backend.leader(&name).await
    }

    /// The election's leaders: the current one first (`None`: nobody
    /// leads), then one item per change of leader or of its value. It never
    /// repeats an item, always ends up on the latest leader, and never
    /// reports a leadership that had already ended when it was read.
    /// Notified where the backend is, otherwise read every
    /// [`LEADER_POLL`](crate::LEADER_POLL).
    pub async fn observe(&self) -> Result<LeaderStream> {
        let (name, backend) = self.checked()?;
        let leaders = match backend.observe_leader(&name).await? {
            Some(s) => s,
            None => polled_leaders(backend.clone(), name, crate::LEADER_POLL),
        };
        Ok(distinct(leaders))
    }
}

/// Leaders read every `poll`, and right after the current leader's lease
/// runs out.
pub(crate) fn polled_leaders(backend: DynBackend, name: LockName, poll: Duration) -> LeaderStream {
    stream::unfold(None::<Duration>, move |pause| {
        let (backend, name) = (backend.clone(), name.clone());
        async move {
            if let Some(p) = pause {
                tokio::time::sleep(p).await;
            }
            let read = backend.leader(&name).await;
            let next = match &read {
                Ok(Some(l)) => l
                    .remaining
                    .map_or(poll, |r| poll.min(r + Duration::from_millis(2))),
                _ => poll,
            };
            Some((read, Some(next)))
        }
    })
    .boxed()
}

/// Drops each item equal to the one before it.
fn distinct(leaders: LeaderStream) -> LeaderStream {
    let mut last: Option<Option<Leader>> = None;
    leaders
        .filter(move |item| {
            let new = match (item, &last) {
                (Err(_), _) => true,
                (Ok(now), Some(before)) => match (now, before) {
                    (Some(a), Some(b)) => !a.same_as(b),
                    (None, None) => false,
                    _ => true,
                },
                (Ok(_), None) => true,
            };
            if let Ok(now) = item {
                last = Some(now.clone());
            }
            std::future::ready(new)
        })
        .boxed()
}

/// Proof of leading an election: a [`LockGuard`] on the election plus the
/// value it carries. Resign with [`resign`](Self::resign); dropped, it
/// resigns in the background.
pub struct Leadership {
    guard: LockGuard,
    value: Mutex<String>,
}

impl fmt::Debug for Leadership {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Leadership")
            .field("guard", &self.guard)
            .field("value", &*lock(&self.value))
            .finish()
    }
}

impl Leadership {
    fn new(guard: LockGuard, value: String) -> Self {
        Self {
            guard,
            value: Mutex::new(value),
        }
    }

    /// The election's name.
    pub fn name(&self) -> &LockName {
        self.guard.name()
    }

    /// The fencing token of this leadership.
    pub fn token(&self) -> FencingToken {
        self.guard.token()
    }

    /// The value this leader carries now.
    pub fn value(&self) -> String {
        lock(&self.value).clone()
    }

    /// The conservative local deadline, or `None` once lost.
    pub fn deadline(&self) -> Option<tokio::time::Instant> {
        self.guard.deadline()
    }

    /// Whether this process still leads as far as it can tell.
    pub fn is_held(&self) -> bool {
        self.guard.is_held()
    }

    /// Resolves when the leadership may have been lost.
    pub async fn lost(&self) -> LostReason {
        self.guard.lost().await
    }

    /// Runs `fut` while leading; if leadership may be lost first, drops
    /// `fut` and returns [`Error::LeaseLost`](crate::Error::LeaseLost).
    pub async fn run_until_lost<F: std::future::Future>(&self, fut: F) -> Result<F::Output> {
        self.guard.run_until_lost(fut).await
    }

    /// The guard underneath, as for a lock.
    pub fn guard(&self) -> &LockGuard {
        &self.guard
    }

    /// The guard underneath, to hold the leadership as a lock is held:
    /// releasing it resigns.
    pub fn into_guard(self) -> LockGuard {
        self.guard
    }

    /// Replaces the value this leader carries, only while it still leads.
    /// Once leadership is lost, [`Error::LeaseLost`](crate::Error::LeaseLost) and nothing changes.
    pub async fn proclaim(&self, value: impl Into<String>) -> Result<()> {
        let value = checked_value(value.into())?;
        self.guard.proclaim(&value).await?;
        *lock(&self.value) = value;
        Ok(())
    }

    /// Gives up leadership; the next campaigner takes over. Returns whether
    /// this process still led until then.
    pub async fn resign(self) -> Result<bool> {
        self.guard.release().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Without fencing every token is 0: a later leadership with the same
    /// value is told apart by its identity, and reported.
    #[tokio::test]
    async fn a_later_leadership_with_the_same_value_and_token_is_reported() {
        let led_by = |owner: &str| -> Result<Option<Leader>> {
            Ok(Some(
                Leader::new("v", FencingToken(0)).with_identity(Some(owner.into())),
            ))
        };
        let read = vec![led_by("a"), led_by("a"), led_by("b"), led_by("b")];
        let seen: Vec<_> = distinct(stream::iter(read).boxed()).collect().await;
        assert_eq!(seen.len(), 2, "{seen:?}");
    }
}
