//! What a backend implements: the primitive lock operations and its
//! declared capabilities.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tokio::time::Instant;

use crate::error::{LostReason, Result};
use crate::name::LockName;
use crate::token::{FencingToken, Owner};

/// What kind of hold a request asks for. A lock and a semaphore of the
/// same name are separate objects: the semaphore `pools/db` and the lock
/// `pools/db` never contend. Exclusive and shared holds of a name are one
/// read-write lock, as with `flock -x` and `flock -s`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum HoldKind {
    /// One holder at a time: a lock (a read-write lock's writer).
    Exclusive,
    /// A read-write lock's reader: shared holds of a name overlap each
    /// other, and exclude its exclusive hold both ways. Writer-preferring:
    /// once an exclusive request waits behind shared holds, no new shared
    /// hold is granted ahead of it; holds already granted run to their end.
    /// One waiting behind another exclusive hold leaves no mark until
    /// shared holds refuse it (a backend that queues every request, as
    /// etcd's and ZooKeeper's do, holds new shared requests back from the
    /// start).
    Shared,
    /// At most `limit` holders at a time, each with its own permit: a
    /// counting semaphore. The limit is stored with the semaphore where
    /// the backend can store it.
    Permits {
        /// How many permits the semaphore has.
        limit: u32,
    },
    /// The leader of an election: one holder at a time, whose hold carries
    /// a value (its proposal) that others read with [`Backend::leader`].
    /// Campaigners are granted in the order they joined on etcd and
    /// ZooKeeper and with `fifo=true`; elsewhere in no promised order.
    Leader,
}

impl HoldKind {
    /// How many holders the kind admits at once (`u32::MAX` for shared
    /// holds: no bound but the exclusive holder's).
    pub fn holders(&self) -> u32 {
        match self {
            HoldKind::Exclusive | HoldKind::Leader => 1,
            HoldKind::Shared => u32::MAX,
            HoldKind::Permits { limit } => *limit,
        }
    }

    /// The object a hold of this kind is on: the lock for exclusive and
    /// shared holds, the semaphore for permits, the election for a leader.
    pub fn object(&self) -> HoldKind {
        match self {
            HoldKind::Shared => HoldKind::Exclusive,
            other => *other,
        }
    }
}

impl fmt::Display for HoldKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HoldKind::Exclusive => f.write_str("lock"),
            HoldKind::Shared => f.write_str("shared lock"),
            HoldKind::Permits { limit: 1 } => f.write_str("semaphore of 1 permit"),
            HoldKind::Permits { limit } => write!(f, "semaphore of {limit} permits"),
            HoldKind::Leader => f.write_str("election"),
        }
    }
}

/// One acquisition as the backend sees it: which lock, which owner value
/// (fresh per acquisition), the kind of hold, and the TTL to grant or
/// extend by.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct LockRequest {
    /// The lock.
    pub name: LockName,
    /// The owner value stored on the server for this acquisition.
    pub owner: Owner,
    /// The lease TTL to grant (or, for `extend`, to extend to from now).
    pub ttl: Duration,
    /// The kind of hold.
    pub kind: HoldKind,
    /// The value the hold carries on the server: an election's proposal
    /// ([`HoldKind::Leader`]); `None` for the other kinds.
    pub value: Option<Arc<str>>,
    /// Who holds it, in a few words (host, process, command), stored with
    /// the hold by the request that grants it and reported by
    /// [`Backend::inspect`] and [`Backend::list`]. Checked by core with
    /// [`validate_holder_info`](crate::validate_holder_info) before any
    /// request is sent; `None` stores nothing.
    pub holder_info: Option<Arc<str>>,
}

/// What a backend answers a granted request with: the fencing token, and
/// when the lease began at the earliest. The holder's local deadline counts
/// from `began`, so it is never later than the lease's end on the server.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Grant {
    /// The fencing token of this acquisition.
    pub token: FencingToken,
    /// The instant right before the request that granted the lease was
    /// sent: for a queue backend the read that confirmed ownership; for a
    /// lease a session keeps alive (etcd), when its current term began. A
    /// grant after a long wait thus gets its full TTL.
    pub began: Instant,
}

impl Grant {
    /// A grant of `token` whose lease began no earlier than `began`.
    pub fn new(token: FencingToken, began: Instant) -> Self {
        Self { token, began }
    }
}

impl LockRequest {
    /// A request with a fresh owner.
    pub fn new(name: LockName, ttl: Duration) -> Self {
        Self {
            name,
            owner: Owner::unique(),
            ttl,
            kind: HoldKind::Exclusive,
            value: None,
            holder_info: None,
        }
    }

    /// A campaign for the leadership of the election `name`, carrying
    /// `value`, with a fresh owner.
    pub fn leader(name: LockName, ttl: Duration, value: impl Into<Arc<str>>) -> Self {
        Self {
            kind: HoldKind::Leader,
            value: Some(value.into()),
            ..Self::new(name, ttl)
        }
    }

    /// A request for one of `limit` permits, with a fresh owner.
    pub fn permit(name: LockName, ttl: Duration, limit: u32) -> Self {
        Self {
            kind: HoldKind::Permits { limit },
            ..Self::new(name, ttl)
        }
    }

    /// The same request carrying `info` as its holder info.
    pub fn with_holder_info(mut self, info: Option<Arc<str>>) -> Self {
        self.holder_info = info;
        self
    }

    /// The same acquisition with another TTL.
    pub fn with_ttl(&self, ttl: Duration) -> Self {
        Self {
            ttl,
            ..self.clone()
        }
    }
}

/// One read-only look at a server setting a guarantee depends on
/// ([`Backend::deployment_findings`]).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Finding {
    /// What was read, e.g. `maxmemory-policy`.
    pub setting: String,
    /// What the server said, or `Err` with why it would not say: then
    /// nothing is known, and nothing is reported as fine.
    pub value: std::result::Result<String, String>,
    /// When the value weakens a guarantee: which one, and what to change.
    pub warning: Option<String>,
}

impl Finding {
    /// A value that weakens nothing.
    pub fn fine(setting: impl Into<String>, value: impl Into<String>) -> Self {
        Self {
            setting: setting.into(),
            value: Ok(value.into()),
            warning: None,
        }
    }

    /// A value that weakens a guarantee, and what to change.
    pub fn warning(
        setting: impl Into<String>,
        value: impl Into<String>,
        warning: impl Into<String>,
    ) -> Self {
        Self {
            setting: setting.into(),
            value: Ok(value.into()),
            warning: Some(warning.into()),
        }
    }

    /// How many servers vote in a quorum-replicated service (etcd
    /// members, ZooKeeper servers), shown as `shown`: one is a single copy,
    /// and an even number tolerates no more failures than one fewer.
    pub fn voters(setting: impl Into<String>, voters: usize, shown: impl Into<String>) -> Self {
        match voters {
            0 | 1 => Self::warning(
                setting,
                shown,
                "one voting server: its loss stops every lock, and its disk is the only copy; run 3 or 5",
            ),
            n if n % 2 == 0 => Self::warning(
                setting,
                shown,
                "an even number of voting servers tolerates no more failures than one fewer, and a split in half stops every lock; run 3 or 5",
            ),
            _ => Self::fine(setting, shown),
        }
    }

    /// A setting the server would not show.
    pub fn unknown(setting: impl Into<String>, why: impl Into<String>) -> Self {
        Self {
            setting: setting.into(),
            value: Err(why.into()),
            warning: None,
        }
    }
}

/// What a backend can tell about a lock without taking it (for `distlock
/// status`). Fields a backend cannot know are `None`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct LockStatus {
    /// Whether someone holds the lock now.
    pub held: bool,
    /// The holder's fencing token.
    pub token: Option<FencingToken>,
    /// How long the holder's lease still runs.
    pub remaining: Option<Duration>,
    /// How many contenders are queued behind the holder (queue backends).
    pub queue_len: Option<usize>,
    /// How many hold it now (a semaphore's permits in use).
    pub holders: Option<usize>,
    /// The limit stored with a semaphore.
    pub limit: Option<u32>,
    /// How many shared holds the lock has now (read-write locks).
    pub shared: Option<usize>,
    /// Whether an exclusive request waits for the lock, so that no new
    /// shared hold is granted (read-write locks).
    pub writer_waiting: Option<bool>,
    /// The holder info stored with the exclusive hold (locks).
    pub holder_info: Option<String>,
}

impl LockStatus {
    /// A status with only `held` known.
    pub fn new(held: bool) -> Self {
        Self {
            held,
            ..Self::default()
        }
    }

    /// Sets the token.
    pub fn with_token(mut self, token: Option<FencingToken>) -> Self {
        self.token = token;
        self
    }

    /// Sets the remaining lease time.
    pub fn with_remaining(mut self, remaining: Option<Duration>) -> Self {
        self.remaining = remaining;
        self
    }

    /// Sets the queue length.
    pub fn with_queue_len(mut self, queue_len: Option<usize>) -> Self {
        self.queue_len = queue_len;
        self
    }

    /// Sets how many shared holds the lock has and whether a writer waits
    /// (read-write locks).
    pub fn with_shared(mut self, shared: usize, writer_waiting: bool) -> Self {
        self.shared = Some(shared);
        self.writer_waiting = Some(writer_waiting);
        self
    }

    /// Sets the holder info.
    pub fn with_holder_info(mut self, info: Option<String>) -> Self {
        self.holder_info = info;
        self
    }

    /// Sets how many hold it and the stored limit (semaphores).
    pub fn with_holders(mut self, holders: usize, limit: Option<u32>) -> Self {
        self.holders = Some(holders);
        self.limit = limit;
        self
    }
}

/// The current leader of an election ([`Backend::leader`]).
#[derive(Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Leader {
    /// The value the leader campaigned with, or last proclaimed.
    pub value: String,
    /// The fencing token of its leadership.
    pub token: FencingToken,
    /// How long its lease still runs, where the backend can tell.
    pub remaining: Option<Duration>,
    /// The holder info stored with its leadership, where the backend's
    /// layout has room for it.
    pub holder_info: Option<String>,
    /// What tells this leadership from another with the same token and
    /// value, where the token cannot ([`Leader::with_identity`]).
    identity: Option<String>,
}

impl fmt::Debug for Leader {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Leader")
            .field("value", &self.value)
            .field("token", &self.token)
            .field("remaining", &self.remaining)
            .field("holder_info", &self.holder_info)
            .finish_non_exhaustive()
    }
}

impl Leader {
    /// A leader with `value` and `token`; `remaining` unknown.
    pub fn new(value: impl Into<String>, token: FencingToken) -> Self {
        Self {
            value: value.into(),
            token,
            remaining: None,
            holder_info: None,
            identity: None,
        }
    }

    /// Sets what tells this leadership from a later one with the same
    /// value: for a backend whose tokens do not (without fencing every
    /// token is 0), the owner it stores with the leadership. Not shown.
    pub fn with_identity(mut self, identity: Option<String>) -> Self {
        self.identity = identity;
        self
    }

    /// Sets the holder info.
    pub fn with_holder_info(mut self, info: Option<String>) -> Self {
        self.holder_info = info;
        self
    }

    /// Sets how long its lease still runs.
    pub fn with_remaining(mut self, remaining: Option<Duration>) -> Self {
        self.remaining = remaining;
        self
    }

    /// Whether `other` is the same leadership with the same value (the
    /// remaining lease aside).
    pub fn same_as(&self, other: &Leader) -> bool {
        self.token == other.token && self.value == other.value && self.identity == other.identity
    }
}

/// A stream of an election's leaders ([`Backend::observe_leader`]): the
/// current one first (`None`: nobody leads), then each change.
pub type LeaderStream = futures_util::stream::BoxStream<'static, Result<Option<Leader>>>;

/// How strong a backend's fencing tokens are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Fencing {
    /// Tokens strictly increase across successive holders of a name, across
    /// releases, expiries and server restarts.
    Strong,
    /// Tokens increase only while the backend's own assumptions hold (for
    /// example: no Redis node loses data). Treat with care.
    BestEffort,
    /// Tokens carry no ordering guarantee; do not use them for fencing.
    None,
}

/// Where a backend sits between consistency and availability.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Consistency {
    /// Linearizable grants: a consensus system, a single database, or one
    /// process. Prefers refusing service to granting a lock twice.
    Cp,
    /// Stays available through failures (asynchronous replication, failover)
    /// and can then grant the same lock twice.
    Ap,
}

/// How a waiting `acquire` learns that the lock became free.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Waiting {
    /// The server notifies waiters (pub/sub, watch, LISTEN/NOTIFY, a local
    /// notification), with a bounded re-check for expiries.
    Notification,
    /// Waiters poll with jittered, capped exponential backoff.
    Polling,
}

/// Whose clock decides when a lease has expired.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum TrustedClock {
    /// The monotonic clock of this one process (the in-memory backend).
    Local,
    /// One server's clock (a database's `now()`, a Redis node's expiry).
    Server,
    /// Each of several independent servers' clocks, assumed to drift by a
    /// bounded rate (Redlock).
    Servers,
    /// A lease or session timer kept by a consensus leader (etcd, ZooKeeper).
    ConsensusLeader,
}

/// What a backend declares about itself. Core and the conformance suite act
/// on these values, never on the backend's name.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Capabilities {
    /// Short backend name used in errors and test names (`memory`, `sqlite`, `redis`...).
    pub backend: &'static str,
    /// Strength of fencing tokens.
    pub fencing: Fencing,
    /// CP or AP.
    pub consistency: Consistency,
    /// How waiting works.
    pub waiting: Waiting,
    /// Which clock judges expiry.
    pub clock: TrustedClock,
    /// Shortest TTL the backend can honour.
    pub min_ttl: Duration,
    /// Longest TTL the backend accepts.
    pub max_ttl: Duration,
    /// Whether `extend` is supported (needed for renewal).
    pub extend: bool,
    /// Whether one client's locks share a session or lease whose end is
    /// reported through [`Backend::session_lost`].
    pub session: bool,
    /// Clock drift allowance, in parts per million of the TTL.
    pub drift_ppm: u32,
    /// Fixed clock drift and scheduling allowance.
    pub drift_fixed: Duration,
    /// How long after its TTL the server may still keep a hold whose holder
    /// vanished, in parts per million of the TTL: the server judges expiry
    /// on a coarser clock than the TTL (ZooKeeper ends a session at the
    /// first tick after its timeout). Never earlier; `0` (the default)
    /// means at the TTL.
    pub expiry_lag_ppm: u32,
    /// How many renewals one [`Backend::extend_many`] call may carry, each
    /// call being one request to the server. `1` (the default) means no
    /// batching: core calls [`Backend::extend`] per hold.
    pub extend_batch: usize,
    /// Whether the backend grants [`HoldKind::Permits`] (semaphores).
    pub semaphore: bool,
    /// Whether the backend grants [`HoldKind::Shared`] (read-write locks).
    pub shared: bool,
    /// Whether the backend runs elections ([`HoldKind::Leader`],
    /// [`Backend::proclaim`], [`Backend::leader`],
    /// [`Backend::observe_leader`]).
    pub elections: bool,
}

impl Capabilities {
    /// Capabilities with the given essentials; TTL bounds default to 10 ms
    /// and 1 day, `extend` to supported, `session` to none.
    pub fn new(
        backend: &'static str,
        fencing: Fencing,
        consistency: Consistency,
        waiting: Waiting,
        clock: TrustedClock,
    ) -> Self {
        Self {
            backend,
            fencing,
            consistency,
            waiting,
            clock,
            min_ttl: Duration::from_millis(10),
            max_ttl: Duration::from_secs(24 * 3600),
            extend: true,
            session: false,
            drift_ppm: 10_000,
            drift_fixed: Duration::from_millis(2),
            expiry_lag_ppm: 0,
            extend_batch: 1,
            semaphore: false,
            shared: false,
            elections: false,
        }
    }

    /// Whether requests of `kind` are served. Core refuses the others with
    /// [`Error::Unsupported`](crate::Error::Unsupported) before sending
    /// anything.
    pub fn supports(&self, kind: &HoldKind) -> bool {
        match kind {
            HoldKind::Exclusive => true,
            HoldKind::Shared => self.shared,
            HoldKind::Permits { .. } => self.semaphore,
            HoldKind::Leader => self.elections,
        }
    }

    /// Declares that the backend runs elections.
    pub fn with_elections(mut self) -> Self {
        self.elections = true;
        self
    }

    /// Declares that the backend grants shared holds (read-write locks).
    pub fn with_shared(mut self) -> Self {
        self.shared = true;
        self
    }

    /// Declares that the backend grants semaphore permits.
    pub fn with_semaphore(mut self) -> Self {
        self.semaphore = true;
        self
    }

    /// Sets the clock drift allowance (default 1% of the TTL plus 2 ms, as
    /// in the Redlock paper).
    pub fn with_drift(mut self, ppm: u32, fixed: Duration) -> Self {
        self.drift_ppm = ppm;
        self.drift_fixed = fixed;
        self
    }

    /// Declares how late after a hold's TTL the server may end it, in parts
    /// per million of the TTL (see [`expiry_lag_ppm`](Self::expiry_lag_ppm)).
    pub fn with_expiry_lag(mut self, ppm: u32) -> Self {
        self.expiry_lag_ppm = ppm;
        self
    }

    /// How long after `ttl` the server may still keep a vanished holder's
    /// hold.
    pub fn expiry_lag(&self, ttl: Duration) -> Duration {
        let scaled = ttl
            .as_nanos()
            .saturating_mul(u128::from(self.expiry_lag_ppm))
            / 1_000_000;
        Duration::from_nanos(u64::try_from(scaled).unwrap_or(u64::MAX))
    }

    /// The part of a TTL kept back for clock drift and scheduling.
    pub fn drift_margin(&self, ttl: Duration) -> Duration {
        let scaled = ttl.as_nanos().saturating_mul(u128::from(self.drift_ppm)) / 1_000_000;
        Duration::from_nanos(u64::try_from(scaled).unwrap_or(u64::MAX)) + self.drift_fixed
    }

    /// How long a grant of `ttl` may be trusted, counted from before the
    /// request was sent: the local deadline is `sent + safe_validity(ttl)`.
    pub fn safe_validity(&self, ttl: Duration) -> Duration {
        ttl.saturating_sub(self.drift_margin(ttl))
    }

    /// Sets the accepted TTL range.
    pub fn with_ttl_range(mut self, min: Duration, max: Duration) -> Self {
        self.min_ttl = min;
        self.max_ttl = max;
        self
    }

    /// Declares that locks share a session reported by [`Backend::session_lost`].
    pub fn with_session(mut self) -> Self {
        self.session = true;
        self
    }

    /// Declares that [`Backend::extend_many`] renews up to `max` holds in one
    /// request; core then batches the renewals that come due together.
    pub fn with_extend_batch(mut self, max: usize) -> Self {
        self.extend_batch = max.max(1);
        self
    }

    /// Declares that `extend` is not supported.
    pub fn without_extend(mut self) -> Self {
        self.extend = false;
        self
    }
}

/// The answer to [`Backend::try_acquire_all`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AllAtOnce {
    /// Every request granted, in the order asked.
    Granted(Vec<Grant>),
    /// At least one name is held elsewhere; nothing was granted (or what
    /// was is released again).
    Refused,
    /// The backend has no such request, or not for these names (e.g. Redis
    /// Cluster keys in different slots).
    NotOffered,
}

/// The primitive operations a backend implements.
///
/// Everything a user holds (guards, renewal, `lost()`, reentrancy,
/// in-process coalescing) lives in [`LockClient`](crate::LockClient) and is
/// shared by every backend; a backend only talks to its server.
///
/// Contract:
/// - `try_acquire` returns `Ok(None)` on contention; it is not an error.
/// - `acquire` waits until `deadline` (forever when `None`) and then returns
///   [`Error::WaitTimeout`](crate::Error::WaitTimeout). It must be
///   cancellation-safe: when its future is dropped it leaves no queue entry
///   behind. If the drop lands while a grant is in flight, core sends a
///   release of the request's owner at once; a backend whose release can
///   overtake its grant (a pool of connections, parallel streams) runs the
///   grant to completion ([`to_completion`](crate::completion::to_completion)),
///   or the grant stays until its TTL with nobody holding it.
/// - `extend` and `release` act only if `req.owner` still holds `req.name`,
///   and return `Ok(false)` otherwise. Neither may ever touch another
///   owner's lock.
/// - `release` must also clean up a request that is only queued or was
///   perhaps granted (a lost reply), so core can call it after any failure.
/// - Every method acts on the object of `req.kind`: a lock and a semaphore
///   of the same name are separate. A backend that serves permits declares
///   [`Capabilities::semaphore`]; for [`HoldKind::Permits`] it grants while
///   fewer than the limit hold permits, refuses a limit other than the one
///   stored with [`Error::LimitMismatch`](crate::Error::LimitMismatch), and
///   gives every grant of the name a token above every earlier grant's.
/// - A backend that serves shared holds declares [`Capabilities::shared`].
///   A [`HoldKind::Shared`] request is granted while nobody holds the
///   name's lock exclusively and no exclusive request waits for it; an
///   exclusive request while nobody holds it, shared or exclusive. An
///   exclusive request that waits (`acquire`, not `try_acquire`) and is
///   refused because of shared holds marks the name as awaited by a writer
///   until it is granted, gives up (the wait removes its mark), is released
///   or its TTL passes (every further attempt renews it). Shared and exclusive grants
///   of a name draw their tokens from one sequence; `release` of a waiting
///   writer removes its mark; `inspect` reports both kinds.
#[async_trait]
pub trait Backend: Send + Sync + fmt::Debug + 'static {
    /// What this backend guarantees.
    fn capabilities(&self) -> Capabilities;

    /// One attempt: the grant, or `None` if someone else holds it.
    async fn try_acquire(&self, req: &LockRequest) -> Result<Option<Grant>>;

    /// Waits for the lock until `deadline`. The default polls `try_acquire`
    /// with jittered exponential backoff; backends that can be notified
    /// override it.
    async fn acquire(&self, req: &LockRequest, deadline: Option<Instant>) -> Result<Grant> {
        crate::wait::acquire_by_polling(self, req, deadline, crate::wait::Backoff::default()).await
    }

    /// One attempt at every request at once, all or nothing: every grant,
    /// or [`AllAtOnce::Refused`] with nothing held. Core calls it with at
    /// least two requests on distinct names, in canonical (sorted) order.
    /// The default declines ([`AllAtOnce::NotOffered`]) and core takes the
    /// names one at a time in that order instead.
    async fn try_acquire_all(&self, reqs: &[LockRequest]) -> Result<AllAtOnce> {
        let _ = reqs;
        Ok(AllAtOnce::NotOffered)
    }

    /// Extends the lease to `req.ttl` from now if `req.owner` still holds it.
    async fn extend(&self, req: &LockRequest) -> Result<bool>;

    /// Extends several holds in one request to the server, answering for
    /// each, in order, as [`Backend::extend`] would. Core calls it only
    /// when [`Capabilities::extend_batch`] is above 1, with at most that
    /// many requests (the renewals that came due together). An error
    /// answers for none of them: core then asks [`Backend::extend`] for
    /// each, so a backend may fail the batch for one hold it cannot decide.
    /// The default extends one by one.
    async fn extend_many(&self, reqs: &[LockRequest]) -> Result<Vec<bool>> {
        let mut answers = Vec::with_capacity(reqs.len());
        for req in reqs {
            answers.push(self.extend(req).await?);
        }
        Ok(answers)
    }

    /// Releases the lock if `req.owner` holds it; `Ok(false)` if it did not.
    async fn release(&self, req: &LockRequest) -> Result<bool>;

    /// Resolves when the session or lease behind `req` ends. Backends
    /// without sessions keep the default, which never resolves.
    async fn session_lost(&self, req: &LockRequest) -> LostReason {
        let _ = req;
        std::future::pending().await
    }

    /// Which session `req`'s hold lives in (an etcd lease, a ZooKeeper
    /// session), for backends with sessions. With a key, core watches each
    /// session once, through [`Backend::session_ended`], instead of calling
    /// [`Backend::session_lost`] for every hold. `None` (the default): one
    /// `session_lost` per hold.
    fn session_key(&self, req: &LockRequest) -> Option<u64> {
        let _ = req;
        None
    }

    /// Resolves when the session `key` (from [`Backend::session_key`])
    /// ends, at once if it already has or is no longer known. The default
    /// never resolves.
    async fn session_ended(&self, key: u64) -> LostReason {
        let _ = key;
        std::future::pending().await
    }

    /// Reports who holds `name`, without taking it. The default says the
    /// backend cannot tell.
    async fn inspect(&self, name: &LockName) -> Result<LockStatus> {
        let _ = name;
        Err(crate::Error::Unsupported {
            backend: self.capabilities().backend,
            operation: "inspecting a lock",
        })
    }

    /// Reports the semaphore `name`: how many permits are held, and its
    /// stored limit.
    async fn inspect_permits(&self, name: &LockName) -> Result<LockStatus> {
        let _ = name;
        Err(crate::Error::Unsupported {
            backend: self.capabilities().backend,
            operation: "semaphores",
        })
    }

    /// Changes the limit stored with the semaphore `name` (creating it if
    /// need be), and returns the limit it had. Permits already held stay
    /// held; with a lower limit, new grants wait until fewer than the new
    /// limit hold permits. Requests with the old limit then get
    /// [`Error::LimitMismatch`](crate::Error::LimitMismatch).
    async fn set_limit(&self, name: &LockName, limit: u32) -> Result<Option<u32>> {
        let _ = (name, limit);
        Err(crate::Error::Unsupported {
            backend: self.capabilities().backend,
            operation: "semaphores",
        })
    }

    /// Every live hold whose name starts with `prefix` (all of them for
    /// `""`): locks, shared holds, permits and leaderships, with what the
    /// backend keeps of each, at most `limit` records, sorted with
    /// [`sort_records`](crate::sort_records). Core checks the prefix with
    /// [`validate_prefix`](crate::validate_prefix) first. Released and
    /// expired holds are not listed. Each backend documents what a listing
    /// costs its server.
    async fn list(&self, prefix: &str, limit: usize) -> Result<Vec<crate::HoldRecord>> {
        let _ = (prefix, limit);
        Err(crate::Error::Unsupported {
            backend: self.capabilities().backend,
            operation: "listing holds",
        })
    }

    /// Read-only probes of the server settings this backend's guarantees
    /// depend on (eviction, persistence, durable commits, session bounds,
    /// cluster size), for `distlock conformance`. The default has none.
    async fn deployment_findings(&self) -> Result<Vec<Finding>> {
        Ok(Vec::new())
    }

    /// Replaces the value of the leadership `req` (a granted
    /// [`HoldKind::Leader`] request) with `value`, only while `req.owner`
    /// still leads; `Ok(false)` if it does not.
    async fn proclaim(&self, req: &LockRequest, value: &str) -> Result<bool> {
        let _ = (req, value);
        Err(crate::Error::Unsupported {
            backend: self.capabilities().backend,
            operation: "elections",
        })
    }

    /// The current leader of the election `name`: the live leadership
    /// granted first, with its value; `None` when nobody leads.
    async fn leader(&self, name: &LockName) -> Result<Option<Leader>> {
        let _ = name;
        Err(crate::Error::Unsupported {
            backend: self.capabilities().backend,
            operation: "elections",
        })
    }

    /// The leaders of the election `name`, from the current one on, for
    /// backends that are notified of changes. `None` (the default): core
    /// reads [`Backend::leader`] every [`LEADER_POLL`] instead, and again
    /// when the current leader's lease runs out.
    async fn observe_leader(&self, name: &LockName) -> Result<Option<LeaderStream>> {
        let _ = name;
        Ok(None)
    }
}

/// How often core reads an election's leader for a backend whose
/// [`Backend::observe_leader`] offers no stream.
pub const LEADER_POLL: Duration = Duration::from_millis(200);

#[deny(clippy::missing_trait_methods)]
#[async_trait]
impl<T: Backend + ?Sized> Backend for Arc<T> {
    fn capabilities(&self) -> Capabilities {
        (**self).capabilities()
    }
    async fn try_acquire(&self, req: &LockRequest) -> Result<Option<Grant>> {
        (**self).try_acquire(req).await
    }
    async fn acquire(&self, req: &LockRequest, deadline: Option<Instant>) -> Result<Grant> {
        (**self).acquire(req, deadline).await
    }
    async fn try_acquire_all(&self, reqs: &[LockRequest]) -> Result<AllAtOnce> {
        (**self).try_acquire_all(reqs).await
    }
    async fn extend(&self, req: &LockRequest) -> Result<bool> {
        (**self).extend(req).await
    }
    async fn extend_many(&self, reqs: &[LockRequest]) -> Result<Vec<bool>> {
        (**self).extend_many(reqs).await
    }
    async fn release(&self, req: &LockRequest) -> Result<bool> {
        (**self).release(req).await
    }
    async fn session_lost(&self, req: &LockRequest) -> LostReason {
        (**self).session_lost(req).await
    }
    fn session_key(&self, req: &LockRequest) -> Option<u64> {
        (**self).session_key(req)
    }
    async fn session_ended(&self, key: u64) -> LostReason {
        (**self).session_ended(key).await
    }
    async fn inspect(&self, name: &LockName) -> Result<LockStatus> {
        (**self).inspect(name).await
    }
    async fn inspect_permits(&self, name: &LockName) -> Result<LockStatus> {
        (**self).inspect_permits(name).await
    }
    async fn set_limit(&self, name: &LockName, limit: u32) -> Result<Option<u32>> {
        (**self).set_limit(name, limit).await
    }
    async fn list(&self, prefix: &str, limit: usize) -> Result<Vec<crate::HoldRecord>> {
        (**self).list(prefix, limit).await
    }
    async fn deployment_findings(&self) -> Result<Vec<Finding>> {
        (**self).deployment_findings().await
    }
    async fn proclaim(&self, req: &LockRequest, value: &str) -> Result<bool> {
        (**self).proclaim(req, value).await
    }
    async fn leader(&self, name: &LockName) -> Result<Option<Leader>> {
        (**self).leader(name).await
    }
    async fn observe_leader(&self, name: &LockName) -> Result<Option<LeaderStream>> {
        (**self).observe_leader(name).await
    }
}

/// A backend behind dynamic dispatch.
pub type DynBackend = Arc<dyn Backend>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_or_an_even_number_of_voters_is_a_warning() {
        for (voters, warned) in [
            (0, true),
            (1, true),
            (2, true),
            (3, false),
            (4, true),
            (5, false),
        ] {
            let f = Finding::voters("members", voters, voters.to_string());
            assert_eq!(f.warning.is_some(), warned, "{voters}: {f:?}");
            assert_eq!(f.value, Ok(voters.to_string()));
        }
    }

    #[test]
    fn drift_margin_defaults_to_one_percent_plus_two_ms() {
        let c = Capabilities::new(
            "t",
            Fencing::Strong,
            Consistency::Cp,
            Waiting::Polling,
            TrustedClock::Local,
        );
        assert_eq!(
            c.drift_margin(Duration::from_secs(10)),
            Duration::from_millis(102)
        );
        assert_eq!(
            c.safe_validity(Duration::from_secs(10)),
            Duration::from_millis(9898)
        );
        let c = c.with_drift(50_000, Duration::from_millis(5));
        assert_eq!(
            c.drift_margin(Duration::from_secs(1)),
            Duration::from_millis(55)
        );
        assert_eq!(c.safe_validity(Duration::from_millis(3)), Duration::ZERO);
    }
}
