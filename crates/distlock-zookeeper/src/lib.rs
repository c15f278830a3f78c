#![doc = include_str!("../README.md")]

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use distlock_core::wait::WaitClock;
use distlock_core::{
    async_trait, Backend, Capabilities, Consistency, Error, Fencing, FencingToken, Finding, Grant,
    HoldKind, InputKind, LockName, LockRequest, LostReason, Owner, Result, TrustedClock, Waiting,
};
use tokio::time::Instant;
use zookeeper_client as zk;

mod election;
mod list;
mod semaphore;
mod url;

/// One ZooKeeper session, shared (not cloned) by every node it holds: a
/// `zk::Client` clone copies its chroot and session password.
type Session = Arc<zk::Client>;

/// How long a wait that ended without a grant waits for its node's
/// deletion before leaving it to the background.
const WITHDRAW_AT_ONCE: Duration = Duration::from_millis(300);

/// Locks on ZooKeeper as ephemeral sequential children, named like Apache
/// Curator's `InterProcessMutex` (`_c_<uuid>-lock-<seq>`) or, with
/// `layout=rwlock`, like its `InterProcessReadWriteLock`
/// (`_c_<uuid>-__WRIT__<seq>`); shared holds are `_c_<uuid>-__READ__<seq>`.
/// Curator clients of the matching recipe and distlock exclude each other.
/// Election campaigns are `_c_<uuid>-latch-<seq>` carrying the campaign's
/// value, Curator's `LeaderLatch` layout.
///
/// A hold lives in a session whose timeout is its TTL (one session per
/// distinct TTL, as etcd keeps one lease per TTL), so a crashed holder's
/// nodes go when its TTL runs out.
///
/// Cheap to clone; clones share the sessions.
#[derive(Clone)]
pub struct ZooKeeperBackend {
    inner: Arc<Inner>,
}

/// With credentials: whoever authenticated as the creator may do
/// everything, anyone may read (so `distlock status` works for readers).
static CREATOR_ALL_ANYONE_READ: [zk::Acl; 2] = [
    zk::Acl::new_const(zk::Permission::ALL, "auth", ""),
    zk::Acl::new_const(zk::Permission::READ, "world", "anyone"),
];

struct Inner {
    hosts: String,
    /// `user:password` for digest authentication, on every session.
    digest: Option<String>,
    /// The ACL of every node distlock creates.
    acls: zk::Acls<'static>,
    base: String,
    /// How exclusive nodes are named.
    layout: Layout,
    session_timeout: Duration,
    hold_while_disconnected: bool,
    detached: bool,
    /// The client's sessions by the timeout asked for: each hold's TTL, and
    /// `session_timeout` for status, eviction and cleanup.
    sessions: tokio::sync::Mutex<HashMap<Duration, Session>>,
    /// My node for each live acquisition.
    nodes: Mutex<HashMap<Owner, Node>>,
    /// When each granted permit ends unless extended (see `semaphore`).
    permit_ends: distlock_core::expiry::PermitEnds,
    wakeups: AtomicU64,
    /// The owners whose failed release goes on in the background (see
    /// [`ZooKeeperBackend::release_later`]).
    releasing: Mutex<HashSet<Owner>>,
}

/// A live acquisition's node. Only its sequence number is kept: the rest of
/// its path follows from the request (see [`ZooKeeperBackend::node_path`]),
/// which keeps a held lock at one small map entry and no path string.
struct Node {
    seq: i64,
    /// The session the node lives in.
    session: Session,
}

impl fmt::Debug for ZooKeeperBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ZooKeeperBackend")
            .field("hosts", &self.inner.hosts)
            .field("base", &self.inner.base)
            .finish()
    }
}

fn err(hosts: &str, e: zk::Error) -> Error {
    match e {
        // A server under load throttles requests; one cut off from its
        // quorum serves only reads until it is back.
        zk::Error::ConnectionLoss
        | zk::Error::Timeout
        | zk::Error::NoHosts
        | zk::Error::SessionMoved
        | zk::Error::Throttled
        | zk::Error::NotReadOnly => Error::unavailable(
            "zookeeper",
            format!("ZooKeeper at {hosts}: {e}"),
            Some(Box::new(e)),
        ),
        // The next request opens a new session, so this is retryable; locks
        // of the ended session are reported through `session_lost`.
        zk::Error::SessionExpired | zk::Error::ClientClosed => Error::unavailable(
            "zookeeper",
            format!("ZooKeeper at {hosts}: the session ended ({e})"),
            Some(Box::new(e)),
        ),
        zk::Error::BadArguments(_) => {
            Error::invalid(InputKind::Config, format!("ZooKeeper at {hosts}: {e}"))
        }
        zk::Error::NoAuth | zk::Error::AuthFailed | zk::Error::InvalidAcl => Error::misconfigured(
            "zookeeper",
            format!("ZooKeeper at {hosts} refused: {e}; every client of a lock needs the credentials (user:password@ in the URL) of the client that created its nodes, and the nodes above its name (the root and the name's parent segments) are the first creator's too: a client of another identity uses a root of its own (?root=/...)"),
            Some(Box::new(e)),
        ),
        // The client reports a connection that stopped answering, or failed
        // reading or writing, as an error of its own kind: retryable too.
        other if connection_failed(&other) => Error::unavailable(
            "zookeeper",
            format!("ZooKeeper at {hosts}: {other}"),
            Some(Box::new(other)),
        ),
        other => Error::backend("zookeeper", other),
    }
}

/// Whether `e` is the client's report of a failed connection (no answer
/// within the session's timeout, or an I/O error) rather than a refusal.
fn connection_failed(e: &zk::Error) -> bool {
    if !matches!(e, zk::Error::Custom(_)) || distlock_core::tls_refusal(e).is_some() {
        return false;
    }
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        if s.is::<std::io::Error>() {
            return true;
        }
        source = s.source();
    }
    e.to_string().starts_with("no response from connection")
}

/// The marker of an exclusive node in the `mutex` layout (Curator's
/// `InterProcessMutex`).
const MUTEX_MARKER: &str = "lock-";
/// The marker of an exclusive node in the `rwlock` layout (Curator's
/// `InterProcessReadWriteLock` write lock).
const WRITE_MARKER: &str = "__WRIT__";
/// The marker of a shared node, in both layouts (Curator's
/// `InterProcessReadWriteLock` read lock).
const READ_MARKER: &str = "__READ__";
/// The marker of a campaign's node (Curator's `LeaderLatch`, whose
/// `LOCK_NAME` it is).
const LATCH_MARKER: &str = "latch-";

/// How exclusive nodes are named, chosen with the URL's `layout`: shared
/// nodes are `__READ__` nodes in both.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Layout {
    /// `_c_<uuid>-lock-<seq>`: Curator's `InterProcessMutex`.
    Mutex,
    /// `_c_<uuid>-__WRIT__<seq>`: Curator's `InterProcessReadWriteLock`.
    RwLock,
}

/// What a lock child is, by its marker: a shared (read) node, or an
/// exclusive one of either layout.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Role {
    Read,
    Write,
}

/// The sequence number of `child` if it is named as Curator's protected
/// nodes are, and distlock's: `_c_<36-character id>-<marker><sequence>`,
/// the sequence written as ZooKeeper writes a sequential node's (see
/// [`SeqSuffix`]): ten digits, or nineteen. A lock's node also has the
/// nodes of longer names as children (`db-lock-0000000001` for the lock
/// `jobs/db-lock-0000000001`), which must not count as queue nodes.
fn suffix_sequence(child: &str, marker: &str) -> Option<i64> {
    let rest = child.strip_prefix("_c_")?;
    let seq = rest.get(36..)?.strip_prefix('-')?.strip_prefix(marker)?;
    if !matches!(seq.len(), 10 | 19) || !seq.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    seq.parse().ok()
}

/// A lock child's sequence number and role. Every marker counts, whatever
/// this client's layout: distlock clients of both layouts queue in one line.
fn parse_child(child: &str) -> Option<(i64, Role)> {
    [
        (READ_MARKER, Role::Read),
        (WRITE_MARKER, Role::Write),
        (MUTEX_MARKER, Role::Write),
    ]
    .into_iter()
    .find_map(|(marker, role)| suffix_sequence(child, marker).map(|seq| (seq, role)))
}

/// Refuses a name with a segment spelled as a queue node
/// (`_c_<36 characters>-lock-<sequence>` and the other markers): its
/// persistent node would sit among the queue of the name above it and hold
/// that lock for ever.
fn checked_name(name: &LockName) -> Result<()> {
    match name
        .as_str()
        .split('/')
        .find(|seg| parse_child(seg).is_some() || latch_sequence(seg).is_some())
    {
        Some(seg) => Err(Error::invalid(
            InputKind::LockName,
            format!(
                "`{name}`: its segment `{seg}` is spelled as a ZooKeeper queue node (`_c_<36 characters>-<marker><sequence>`), which the lock above it would count in its queue; rename it"
            ),
        )),
        None => Ok(()),
    }
}

/// The sequence number a lock child ends with: the queue's order.
fn sequence(child: &str) -> Option<i64> {
    parse_child(child).map(|(seq, _)| seq)
}

/// The sequence number a campaign's node ends with, after its last
/// `latch-` (where Curator's `LeaderLatch` sorts it): `None` for any other
/// child, lock nodes and the nodes of longer names included.
fn latch_sequence(child: &str) -> Option<i64> {
    suffix_sequence(child, LATCH_MARKER)
}

/// The sequence number of a child in the queue of `kind`: a campaign's
/// queue holds only `latch-` nodes, a lock's only lock nodes, so a lock and
/// an election of one name share the node but not the queue.
fn sequence_of(child: &str, kind: HoldKind) -> Option<i64> {
    match kind {
        HoldKind::Leader => latch_sequence(child),
        _ => sequence(child),
    }
}

fn is_write(child: &str) -> bool {
    matches!(parse_child(child), Some((_, Role::Write)))
}

/// What keeps the node at `i` of `queue` from holding, for a request of
/// `kind`: the index of the node to watch, and whether it is the last node
/// in the way (so its deletion grants the lock without another read).
/// `None`: the node holds. An exclusive node waits for every node ahead
/// and watches its predecessor; a shared node waits for the exclusive nodes
/// ahead and watches the nearest of them.
fn blocker(queue: &[String], i: usize, kind: HoldKind) -> Option<(usize, bool)> {
    if kind == HoldKind::Shared {
        let mut writes = (0..i).filter(|&j| is_write(&queue[j]));
        let first = writes.next()?;
        let last = writes.next_back();
        return Some((last.unwrap_or(first), last.is_none()));
    }
    i.checked_sub(1).map(|pred| (pred, pred == 0))
}

/// A node just created for a request, and the queue read with it.
struct Enqueued {
    client: Session,
    parent: String,
    node: String,
    token: FencingToken,
    /// The children in queue order, as listed right after the create; `None`
    /// if that list failed.
    queue: Option<Vec<String>>,
    /// When the read that may confirm ownership was sent, or earlier: before
    /// the first create attempt, then again after each wake-up. A grant's
    /// lease counts from here.
    began: Instant,
}

/// The longest connection timeout a session is given (its session
/// timeout, if shorter).
const MAX_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// How long a connected session may go without sending the server
/// anything: zookeeper-client pings after three ticks without a send, and
/// checks every tick, so at most four ticks pass; a tick is an eighth of
/// the connection timeout (the TTL, at most 5 s) or, when that timeout is
/// above three fifths of the session's, a twentieth of the session
/// timeout (the TTL).
fn quiet_bound(ttl: Duration) -> Duration {
    let connect = ttl.min(MAX_CONNECT_TIMEOUT);
    let tick = if connect > ttl * 3 / 5 {
        ttl / 20
    } else {
        connect / 8
    };
    tick * 4
}

/// A node's fencing token: its creation zxid.
fn czxid_token(czxid: i64) -> Result<FencingToken> {
    u64::try_from(czxid)
        .map(FencingToken)
        .map_err(|_| Error::backend("zookeeper", format!("negative czxid {czxid}")))
}

/// The children in the queue of `kind` (lock nodes for the lock kinds,
/// `latch-` nodes for a campaign; other names are ignored) sorted by their
/// sequence.
fn in_queue_order(children: Vec<String>, kind: HoldKind) -> Vec<String> {
    let mut queue: Vec<String> = children
        .into_iter()
        .filter(|c| sequence_of(c, kind).is_some())
        .collect();
    queue.sort_by_key(|c| sequence_of(c, kind));
    queue
}

/// The holder info in a node's data: printable text of at most
/// [`MAX_HOLDER_INFO_LEN`](distlock_core::MAX_HOLDER_INFO_LEN) bytes, as
/// distlock writes it (Curator's `InterProcessMutex` writes the client's
/// address, which reads as its holder info); `None` for anything else.
fn holder_info_of(data: &[u8]) -> Option<String> {
    let text = std::str::from_utf8(data).ok()?;
    distlock_core::validate_holder_info(text)
        .is_ok()
        .then(|| text.to_string())
}

/// The owner in a child's name `_c_<owner>-...`, as distlock (and
/// Curator's protected mode) names children.
fn owner_in(child: &str) -> Option<&str> {
    let rest = child.strip_prefix("_c_")?;
    rest.get(36..)?.starts_with('-').then(|| &rest[..36])
}

/// The name prefix of `owner`'s lock child with `marker`, as Curator
/// names it: `_c_<uuid>-<marker>`.
fn node_prefix(owner: &Owner, marker: &str) -> String {
    format!("_c_{owner}-{marker}")
}

/// A node's sequence came out negative: ZooKeeper numbers children with
/// the parent's count of child changes, which wraps at 2^31 on servers
/// that keep it in 32 bits.
pub(crate) fn wrapped_counter(parent: &str) -> Error {
    Error::misconfigured(
        "zookeeper",
        format!(
            "ZooKeeper numbered a new child of {parent} negative: its count of child changes passed 2^31, and neither distlock nor Curator orders such children; delete {parent} while nobody holds or waits on it to reset the count"
        ),
        None,
    )
}

/// A sequence number as ZooKeeper writes it in a node name, which is how
/// `zk::CreateSequence` prints it: ten digits, nineteen past `i32::MAX`
/// (ZOOKEEPER-4706).
struct SeqSuffix(i64);

impl fmt::Display for SeqSuffix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0 <= i64::from(i32::MAX) {
            write!(f, "{:010}", self.0)
        } else {
            write!(f, "{:019}", self.0)
        }
    }
}

impl ZooKeeperBackend {
    /// Connects to `zk://[user:password@]host:port[,host:port...][/chroot]`.
    /// With credentials every session authenticates with ZooKeeper's
    /// `digest` scheme and every node distlock creates carries the ACL
    /// `acl=creator` (the default then: the creator's identity may do
    /// everything, anyone may read); `acl=open` (the default without
    /// credentials, Curator's) lets anyone do everything. Parameters:
    /// `session_timeout_ms` (2 to 3600000, default 10000), `root` (the lock root under the
    /// chroot, default `/distlock`), `hold_while_disconnected` (default
    /// `false`: a disconnection counts as lost, Curator's Tech Note 14),
    /// `detached` (default `false`: dropping the client closes the session),
    /// and `layout` (default `mutex`: exclusive nodes are named as Curator's
    /// `InterProcessMutex` names them, `_c_<uuid>-lock-<seq>`; `rwlock`: as
    /// the write lock of Curator's `InterProcessReadWriteLock` does,
    /// `_c_<uuid>-__WRIT__<seq>`). Shared nodes are `_c_<uuid>-__READ__<seq>`
    /// in both. A server listed twice, an unknown parameter, a parameter
    /// given twice and a value out of range are [`Error::InvalidInput`].
    pub async fn connect(url: &str) -> Result<Self> {
        let url::ZkUrl {
            hosts,
            digest,
            base,
            layout,
            session_timeout,
            hold_while_disconnected,
            detached,
            acl,
        } = url::parse(url)?;
        let acls = match acl {
            url::Acl::Creator => zk::Acls::new(&CREATOR_ALL_ANYONE_READ),
            url::Acl::Open => zk::Acls::anyone_all(),
        };
        let backend = Self {
            inner: Arc::new(Inner {
                hosts,
                digest,
                acls,
                base,
                layout,
                session_timeout,
                hold_while_disconnected,
                detached,
                sessions: Default::default(),
                nodes: Mutex::new(HashMap::new()),
                permit_ends: Default::default(),
                wakeups: AtomicU64::new(0),
                releasing: Mutex::default(),
            }),
        };
        // Fail at once when no server answers, rather than retrying for a
        // connection timeout; later sessions retry like any reconnect.
        if let Err(e) = backend.session(session_timeout, true).await {
            return Err(backend.foreign_protocol(e).await);
        }
        Ok(backend)
    }

    /// After the first connect failed with `e` for want of an answer:
    /// `Misconfigured` if the first server the URL names speaks another
    /// protocol (another backend's port), which a retry cannot mend.
    async fn foreign_protocol(&self, e: Error) -> Error {
        let first = self.inner.hosts.split(',').next().unwrap_or_default();
        let timeout = self.inner.session_timeout.min(MAX_CONNECT_TIMEOUT);
        if !matches!(e, Error::Unavailable { .. }) {
            return e;
        }
        match distlock_core::probe::foreign_protocol(
            first,
            distlock_core::probe::Protocol::ZooKeeper,
            timeout,
        )
        .await
        {
            Some(why) => Error::misconfigured(
                "zookeeper",
                format!("ZooKeeper at {}: {why}", self.inner.hosts),
                Some(Box::new(e)),
            ),
            None => e,
        }
    }

    fn err(&self, e: zk::Error) -> Error {
        err(&self.inner.hosts, e)
    }

    /// A wait that ran out while its session was disconnected (cut off from
    /// every server, or between two of them) ends with that failure (exit
    /// 69 in the CLI), as a wait on the other backends does: its watch can
    /// neither fire nor fail while the session outlives the outage. One
    /// whose session is connected ran out behind a holder.
    fn cut_off_at_the_deadline(&self, e: Error, client: &zk::Client) -> Error {
        match e {
            Error::WaitTimeout { .. } if client.state() == zk::SessionState::Disconnected => {
                Error::unavailable(
                    "zookeeper",
                    format!(
                        "ZooKeeper at {}: no server answered by the wait's deadline",
                        self.inner.hosts
                    ),
                    Some(Box::new(e)),
                )
            }
            e => e,
        }
    }

    fn nodes(&self) -> MutexGuard<'_, HashMap<Owner, Node>> {
        self.inner
            .nodes
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Resolves when `client`'s session can no longer vouch for its nodes.
    async fn session_state_ends(&self, client: &zk::Client) -> LostReason {
        let mut states = client.state_watcher();
        let mut state = states.state();
        loop {
            match state {
                zk::SessionState::Disconnected if !self.inner.hold_while_disconnected => {
                    return LostReason::SessionLost(
                        "disconnected from ZooKeeper (the session may expire unseen)".into(),
                    )
                }
                zk::SessionState::Expired => {
                    return LostReason::SessionLost("ZooKeeper session expired".into())
                }
                zk::SessionState::Closed => {
                    return LostReason::SessionLost("ZooKeeper session closed".into())
                }
                zk::SessionState::AuthFailed => {
                    return LostReason::SessionLost("ZooKeeper authentication failed".into())
                }
                _ => state = states.changed().await,
            }
        }
    }

    /// The session for status, eviction and cleanup.
    async fn client(&self) -> Result<Session> {
        self.session(self.inner.session_timeout, false).await
    }

    /// The session asked for with `timeout`; a new one after the last one
    /// ended.
    async fn session(&self, timeout: Duration, fail_eagerly: bool) -> Result<Session> {
        let mut sessions = self.inner.sessions.lock().await;
        if let Some(c) = sessions.get(&timeout) {
            if !matches!(
                c.state(),
                zk::SessionState::Expired | zk::SessionState::Closed | zk::SessionState::AuthFailed
            ) {
                return Ok(c.clone());
            }
        }
        let mut connector = zk::Client::connector()
            .with_session_timeout(timeout)
            .with_connection_timeout(timeout.min(MAX_CONNECT_TIMEOUT));
        if self.inner.detached {
            connector = connector.with_detached();
        }
        if let Some(digest) = &self.inner.digest {
            connector = connector.with_auth("digest", digest.as_bytes());
        }
        if fail_eagerly {
            connector = connector.with_fail_eagerly();
        }
        let c = Arc::new(connector.connect(&self.inner.hosts).await.map_err(|e| {
            if matches!(e, zk::Error::NoHosts) {
                Error::unavailable(
                    "zookeeper",
                    format!("no ZooKeeper server answered at {}", self.inner.hosts),
                    Some(Box::new(e)),
                )
            } else {
                self.err(e)
            }
        })?);
        sessions.insert(timeout, c.clone());
        Ok(c)
    }

    /// The session for a hold of `ttl`: its timeout, as the server
    /// negotiated it, must be the TTL. The server clamps the timeout asked
    /// for to its `minSessionTimeout`..`maxSessionTimeout`; a longer session
    /// would keep a crashed holder's lock past its TTL, a shorter one could
    /// end before the holder's local deadline.
    async fn hold_session(&self, ttl: Duration) -> Result<Session> {
        let c = self.session(ttl, false).await?;
        let negotiated = c.session_timeout();
        if negotiated == ttl {
            return Ok(c);
        }
        // Refused: the session serves nobody, so it ends here rather than
        // staying open for the backend's life.
        {
            let mut sessions = self.inner.sessions.lock().await;
            if sessions.get(&ttl).is_some_and(|s| Arc::ptr_eq(s, &c)) {
                sessions.remove(&ttl);
            }
        }
        drop(c);
        let (bound, what, change) = if negotiated > ttl {
            (
                "below the minimum",
                "at least",
                "lower its minSessionTimeout",
            )
        } else {
            (
                "above the maximum",
                "at most",
                "raise its maxSessionTimeout",
            )
        };
        Err(Error::invalid(
            InputKind::Duration,
            format!(
                "TTL {ttl:?} is {bound} session timeout of the ZooKeeper server at {} ({negotiated:?}); \
                 a hold's TTL is its session's timeout there: use a TTL of {what} {negotiated:?}, or {change}",
                self.inner.hosts
            ),
        ))
    }

    /// How many times a waiter of this client was woken by its predecessor's
    /// deletion (the herd test counts these).
    pub fn wakeups(&self) -> u64 {
        self.inner.wakeups.load(Ordering::Relaxed)
    }

    fn parent(&self, name: &LockName) -> String {
        format!("{}/{name}", self.inner.base)
    }

    /// The node carrying the holder info of campaign `owner` of election
    /// `name`: `<base>/@leaders/<name>/<owner>`, ephemeral in the
    /// campaign's session. A campaign node's data is its value (Curator's
    /// participant id), and any other child of the election's node would
    /// join Curator's `LeaderLatch` queue, so the holder info lives apart,
    /// under a node no lock name can have (names never contain `@`).
    fn leader_info_path(&self, name: &str, owner: &str) -> String {
        format!("{}/@leaders/{name}/{owner}", self.inner.base)
    }

    /// Stores `req`'s holder info for its campaign, given the answer to the
    /// create sent in the campaign's flight: on the first campaign of a
    /// name, its parent is made and the create sent again. The holder info
    /// only describes the leadership, so a failure is logged, not returned.
    async fn store_leader_info(
        &self,
        client: &zk::Client,
        req: &LockRequest,
        sent: std::result::Result<(zk::Stat, zk::CreateSequence), zk::Error>,
    ) {
        let path = self.leader_info_path(req.name.as_str(), &req.owner.to_string());
        let info = req.holder_info.as_deref().unwrap_or_default();
        let created = match sent {
            Err(zk::Error::NoNode) => {
                let dir = zk::CreateMode::Persistent.with_acls(self.inner.acls);
                let parent = self.leader_info_path(req.name.as_str(), "");
                match client.mkdir(parent.trim_end_matches('/'), &dir).await {
                    Ok(()) => {
                        let node = zk::CreateMode::Ephemeral.with_acls(self.inner.acls);
                        client.create(&path, info.as_bytes(), &node).await
                    }
                    Err(e) => Err(e),
                }
            }
            other => other,
        };
        match created {
            // Exists: sent again after a connection loss.
            Ok(_) | Err(zk::Error::NodeExists) => {}
            Err(e) => {
                tracing::warn!(node = %path, error = %e, "could not store a campaign's holder info")
            }
        }
    }

    /// The full path of `req`'s node with sequence number `seq`.
    fn node_path(&self, req: &LockRequest, seq: i64) -> String {
        if let HoldKind::Permits { .. } = req.kind {
            return format!(
                "{}/{}{}",
                self.permits_dir(&req.name),
                semaphore::permit_prefix(&req.owner),
                SeqSuffix(seq)
            );
        }
        format!(
            "{}/{}/{}{}",
            self.inner.base,
            req.name,
            node_prefix(&req.owner, self.marker(req.kind)),
            SeqSuffix(seq)
        )
    }

    /// The marker in the name of a lock node of `kind`.
    fn marker(&self, kind: HoldKind) -> &'static str {
        match (kind, self.inner.layout) {
            (HoldKind::Leader, _) => LATCH_MARKER,
            (HoldKind::Shared, _) => READ_MARKER,
            (_, Layout::Mutex) => MUTEX_MARKER,
            (_, Layout::RwLock) => WRITE_MARKER,
        }
    }

    /// `req`'s node, if it has a live one: its path and session.
    fn node_of(&self, req: &LockRequest) -> Option<(String, Session)> {
        let (seq, session) = self
            .nodes()
            .get(&req.owner)
            .map(|n| (n.seq, n.session.clone()))?;
        Some((self.node_path(req, seq), session))
    }

    /// Deletes every child of lock `name`, as an operator would: its lock
    /// nodes of every kind and the campaigns of the election of the same
    /// name, which live beside them. The holder's (or leader's) next
    /// renewal is rejected. Returns whether any existed.
    pub async fn evict(&self, name: &LockName) -> Result<bool> {
        let client = self.client().await?;
        let parent = self.parent(name);
        let children = match client.list_children(&parent).await {
            Ok(c) => c,
            Err(zk::Error::NoNode) => return Ok(false),
            Err(e) => return Err(self.err(e)),
        };
        for c in &children {
            match client.delete(&format!("{parent}/{c}"), None).await {
                Ok(()) | Err(zk::Error::NoNode) => {}
                Err(e) => return Err(self.err(e)),
            }
        }
        Ok(!children.is_empty())
    }

    /// My child node: created, or found again after a connection loss hid
    /// the create's reply (ZOOKEEPER-1262). The owner value in the name makes
    /// it findable, so there is never an orphan or a second entry.
    ///
    /// The queue is listed in the same flight: the list request is sent
    /// right behind the create, and one session's requests are handled in
    /// the order sent, so the list already shows my node (one round trip for
    /// both). `Enqueued::queue` is `None` if that list failed; callers then
    /// read the queue themselves.
    async fn enqueue(&self, req: &LockRequest) -> Result<Enqueued> {
        let client = self.hold_session(req.ttl).await?;
        let parent = self.parent(&req.name);
        let prefix = node_prefix(&req.owner, self.marker(req.kind));
        let options = zk::CreateMode::EphemeralSequential.with_acls(self.inner.acls);
        let path = format!("{parent}/{prefix}");
        // A campaign's node carries its value (Curator's participant id),
        // and its holder info a node of its own (see `leader_info_path`);
        // a lock node carries its holder info.
        let campaign = req.kind == HoldKind::Leader;
        let data = match req.kind {
            HoldKind::Leader => req.value.as_deref().unwrap_or_default().as_bytes(),
            _ => req.holder_info.as_deref().unwrap_or_default().as_bytes(),
        };
        let info_path = self.leader_info_path(req.name.as_str(), &req.owner.to_string());
        let info = req.holder_info.as_deref().unwrap_or_default().as_bytes();
        let info_options = zk::CreateMode::Ephemeral.with_acls(self.inner.acls);
        // A grant's lease counts from before the first attempt: a retry
        // after creating the parent or a connection loss only shortens it,
        // so the local deadline stays within the TTL counted from the
        // request.
        let began = Instant::now();
        for _ in 0..5 {
            // The requests are queued when their futures are made (the
            // client orders requests at creation, not at polling): one
            // flight. A campaign's holder info goes first, so whoever sees
            // its node finds the holder info there. The list is the read
            // that may confirm ownership.
            let info_sent = campaign.then(|| client.create(&info_path, info, &info_options));
            let create = client.create(&path, data, &options);
            let list = client.list_children(&parent);
            let info_sent = async {
                match info_sent {
                    Some(sent) => Some(sent.await),
                    None => None,
                }
            };
            let (created, info_sent, listed) = tokio::join!(create, info_sent, list);
            if let Some(sent) = info_sent {
                self.store_leader_info(&client, req, sent).await;
            }
            match created {
                Ok((stat, seq)) => {
                    // A plain create2 reply carries a valid Stat on 3.8.0 too
                    // (only Stats inside multi() are broken before 3.8.2).
                    let node = format!("{prefix}{seq}");
                    let seq = seq.into_i64();
                    if seq < 0 {
                        let _ = client.delete(&format!("{parent}/{node}"), None).await;
                        return Err(wrapped_counter(&parent));
                    }
                    let queue = listed
                        .ok()
                        .map(|c| in_queue_order(c, req.kind))
                        .filter(|q| q.contains(&node));
                    let token = czxid_token(stat.czxid)?;
                    let q = Enqueued {
                        client,
                        parent,
                        node,
                        token,
                        queue,
                        began,
                    };
                    return Ok(self.remember(req, seq, q));
                }
                Err(zk::Error::NoNode) => {
                    let dir = zk::CreateMode::Persistent.with_acls(self.inner.acls);
                    client.mkdir(&parent, &dir).await.map_err(|e| self.err(e))?;
                }
                Err(zk::Error::ConnectionLoss) => {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    let found = self.find_mine(&client, &parent, &prefix).await?;
                    // Found by its prefix, so the rest of its name is its sequence.
                    if let Some((found, seq)) =
                        found.and_then(|f| sequence_of(&f, req.kind).map(|s| (f, s)))
                    {
                        let stat = client
                            .check_stat(&format!("{parent}/{found}"))
                            .await
                            .map_err(|e| self.err(e))?;
                        if let Some(stat) = stat {
                            tracing::info!(node = %found, "found my lock node again after a connection loss during create");
                            let q = Enqueued {
                                client,
                                parent,
                                node: found,
                                token: czxid_token(stat.czxid)?,
                                queue: None,
                                began,
                            };
                            return Ok(self.remember(req, seq, q));
                        }
                    }
                }
                Err(e) => return Err(self.err(e)),
            }
        }
        Err(Error::unavailable(
            "zookeeper",
            format!("could not create a lock node under {parent}"),
            None,
        ))
    }

    /// Records a created node as `req`'s.
    fn remember(&self, req: &LockRequest, seq: i64, q: Enqueued) -> Enqueued {
        debug_assert_eq!(self.node_path(req, seq), format!("{}/{}", q.parent, q.node));
        let session = q.client.clone();
        self.nodes().insert(req.owner, Node { seq, session });
        q
    }

    async fn find_mine(
        &self,
        client: &zk::Client,
        parent: &str,
        prefix: &str,
    ) -> Result<Option<String>> {
        loop {
            // The session may have moved to a server that has not applied
            // the create yet: `sync` first, as `leader` does (one session's
            // requests are answered in order).
            let (synced, listed) = tokio::join!(client.sync(parent), client.list_children(parent));
            match synced.and(listed) {
                Ok(children) => return Ok(children.into_iter().find(|c| c.starts_with(prefix))),
                Err(zk::Error::ConnectionLoss) => {
                    tokio::time::sleep(Duration::from_millis(100)).await
                }
                // An expired session's ephemeral nodes are gone with it.
                Err(zk::Error::NoNode | zk::Error::SessionExpired) => return Ok(None),
                Err(e) => return Err(self.err(e)),
            }
        }
    }

    /// The children in the queue of `kind`, in queue order.
    async fn queue(
        &self,
        client: &zk::Client,
        parent: &str,
        kind: HoldKind,
    ) -> Result<Vec<String>> {
        Ok(in_queue_order(
            client
                .list_children(parent)
                .await
                .map_err(|e| self.err(e))?,
            kind,
        ))
    }

    /// The session to look for `req`'s node on: the hold's own when it is
    /// open (none is opened for the look), so that a create still in flight there is answered before the
    /// look (a read on another session may come back before it commits),
    /// else the backend's.
    async fn lookup_session(&self, req: &LockRequest) -> Result<Session> {
        let hold_session = self.inner.sessions.lock().await.get(&req.ttl).cloned();
        match hold_session {
            Some(s) => Ok(s),
            None => self.client().await,
        }
    }

    /// Deletes `req`'s node: a permit's, or a lock's, shared hold's or
    /// campaign's, found by its owner if this client does not know it.
    async fn delete_hold(&self, req: &LockRequest) -> Result<bool> {
        if let HoldKind::Permits { .. } = req.kind {
            return self.release_permit(req).await;
        }
        if self.nodes().contains_key(&req.owner) {
            return self.delete_node(req).await;
        }
        // Released before the create's reply arrived (a cancelled acquire):
        // find the node by its owner value.
        let client = self.lookup_session(req).await?;
        let parent = self.parent(&req.name);
        let prefix = node_prefix(&req.owner, self.marker(req.kind));
        match self.find_mine(&client, &parent, &prefix).await? {
            Some(node) => match tokio::join!(
                client.delete(&format!("{parent}/{node}"), None),
                self.delete_leader_info(&client, req)
            )
            .0
            {
                Ok(()) => Ok(true),
                Err(zk::Error::NoNode | zk::Error::SessionExpired) => Ok(false),
                Err(e) => Err(self.err(e)),
            },
            None => {
                // A campaign's holder info is created ahead of its node,
                // which may have failed or gone with an expired session.
                self.delete_leader_info(&client, req).await;
                Ok(false)
            }
        }
    }

    /// After a release failed for a reason that clears by itself (the
    /// network stalled past the request timeout): the node is ephemeral,
    /// but its session outlives the stall if the connection comes back
    /// within the session timeout, and the session lives as long as this
    /// client, so a node left behind would keep its name (or a permit)
    /// held for the life of the process. Keeps deleting it in the
    /// background, backing off to 5 s, until a delete answers, the session
    /// has ended (the node with it) or the client is dropped; one such task
    /// per owner.
    fn release_later(&self, req: &LockRequest) {
        if !self.releasing().insert(req.owner) {
            return;
        }
        let (inner, req) = (Arc::downgrade(&self.inner), req.clone());
        let (this, owner) = (inner.clone(), req.owner);
        distlock_core::completion::release_in_background(
            req.name.clone(),
            move || {
                let backend = ZooKeeperBackend {
                    inner: inner.upgrade()?,
                };
                let req = req.clone();
                Some(async move { backend.delete_hold(&req).await })
            },
            move || {
                if let Some(inner) = this.upgrade() {
                    ZooKeeperBackend { inner }.releasing().remove(&owner);
                }
            },
        );
    }

    /// The clean-up of a request that ends without a grant: a delete of
    /// its node that failed (the node is looked up by its owner then) goes
    /// on in the background. Core releases nothing after an answer that
    /// grants nothing (a refused try, a timed-out wait), so otherwise the
    /// node would stay, ahead of every later request, as long as the
    /// session lives.
    pub(crate) fn withdraw(&self, req: &LockRequest, deleted: Result<bool>) {
        if let Err(e) = deleted {
            tracing::debug!(lock = %req.name, error = %e, "could not delete the node of a request that got nothing; retrying in the background");
            self.release_later(req);
        }
    }

    /// [`withdraw`](Self::withdraw) after a wait, given a moment: a delete
    /// that does not answer at once (the server cut off or restarting) goes
    /// on in the background, so that the wait ends at its deadline.
    pub(crate) async fn withdraw_soon(
        &self,
        req: &LockRequest,
        delete: impl std::future::Future<Output = Result<bool>>,
    ) {
        match tokio::time::timeout(WITHDRAW_AT_ONCE, delete).await {
            Ok(deleted) => self.withdraw(req, deleted),
            Err(_) => self.release_later(req),
        }
    }

    fn releasing(&self) -> MutexGuard<'_, HashSet<Owner>> {
        self.inner
            .releasing
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    async fn delete_node(&self, req: &LockRequest) -> Result<bool> {
        let entry = self.nodes().remove(&req.owner);
        let Some(Node { seq, session }) = entry else {
            return Ok(false);
        };
        let path = self.node_path(req, seq);
        let (deleted, _) = tokio::join!(
            session.delete(&path, None),
            self.delete_leader_info(&session, req)
        );
        match deleted {
            Ok(()) => Ok(true),
            // An expired session's ephemeral nodes are gone: not ours any
            // more, which is the answer a late release must get.
            Err(zk::Error::NoNode | zk::Error::SessionExpired) => Ok(false),
            // The hold's connection broke (a holder paused past its
            // session): ask on the backend's own session whether the node
            // is still there.
            Err(e) => match self.client().await?.delete(&path, None).await {
                Ok(()) => Ok(true),
                Err(zk::Error::NoNode) => Ok(false),
                Err(_) => Err(self.err(e)),
            },
        }
    }

    /// Deletes a campaign's holder info node (sent in the flight of the
    /// campaign node's delete); nothing for the other kinds. Whatever is
    /// left goes with the session.
    async fn delete_leader_info(&self, client: &zk::Client, req: &LockRequest) {
        if req.kind != HoldKind::Leader {
            return;
        }
        let path = self.leader_info_path(req.name.as_str(), &req.owner.to_string());
        match client.delete(&path, None).await {
            Ok(()) | Err(zk::Error::NoNode | zk::Error::SessionExpired) => {}
            Err(e) => {
                tracing::debug!(node = %path, error = %e, "could not delete a campaign's holder info")
            }
        }
    }

    /// Waits until my node holds: an exclusive node once it is first, a
    /// shared node once no exclusive node is ahead of it. Only one node is
    /// watched (see [`blocker`]).
    async fn wait_turn(&self, req: &LockRequest, q: &mut Enqueued) -> Result<()> {
        let name = &req.name;
        let (client, parent, node) = (&q.client, &q.parent, &q.node);
        loop {
            // This read is the one that confirms ownership: the one sent
            // with the create first, then a new one after each wake-up.
            let queue = match q.queue.take() {
                Some(queue) => queue,
                None => {
                    q.began = Instant::now();
                    self.queue(client, parent, req.kind).await?
                }
            };
            let Some(i) = queue.iter().position(|c| c == node) else {
                return Err(Error::LeaseLost {
                    name: name.clone(),
                    reason: LostReason::SessionLost("my lock node vanished while waiting".into()),
                });
            };
            let Some((watched, last_in_the_way)) = blocker(&queue, i, req.kind) else {
                return Ok(());
            };
            let watched = format!("{parent}/{}", queue[watched]);
            // The server restarts the session's clock when it hears this
            // request.
            let armed = Instant::now();
            let (stat, watcher) = client
                .check_and_watch_stat(&watched)
                .await
                .map_err(|e| self.err(e))?;
            if stat.is_none() {
                continue;
            }
            let event = watcher.changed().await;
            if event.event_type == zk::EventType::NodeDeleted {
                self.inner.wakeups.fetch_add(1, Ordering::Relaxed);
                // The watched node was the last one in my way (for an
                // exclusive node the head, for a shared one the only
                // exclusive node ahead): none is left (a later create gets
                // a higher sequence, and the read above saw every older
                // one), so the lock is mine without another read, if the
                // session still lives. The server's session clock runs from
                // the last packet it heard from this client, and it heard
                // the watch's request after `armed`: the lease counts from
                // there. After a longer wait (during which this process
                // may have been paused, its pings unsent, and the session
                // ended while the event waited unread) the queue is read
                // once more: a read over the session confirms it.
                if last_in_the_way && armed.elapsed() <= quiet_bound(req.ttl) {
                    q.began = armed;
                    return Ok(());
                }
            }
        }
    }
}

impl ZooKeeperBackend {
    /// What this backend declares, without connecting (for `distlock backends`).
    pub fn declared_capabilities() -> Capabilities {
        Capabilities::new(
            "zookeeper",
            Fencing::Strong,
            Consistency::Cp,
            Waiting::Notification,
            TrustedClock::ConsensusLeader,
        )
        .with_ttl_range(Duration::from_secs(1), Duration::from_secs(24 * 3600))
        .with_session()
        // The server ends a session at its first tick (`tickTime`) after
        // the timeout; a session of the TTL is granted only if the TTL is
        // at least `minSessionTimeout`, by default two ticks: a tick is at
        // most half the TTL.
        .with_expiry_lag(500_000)
        .with_semaphore()
        .with_shared()
        .with_elections()
    }
}

#[async_trait]
impl Backend for ZooKeeperBackend {
    fn capabilities(&self) -> Capabilities {
        // A multi-read of 500 nodes is about 60 KB each way, well under
        // ZooKeeper's 1 MB jute.maxbuffer.
        Self::declared_capabilities().with_extend_batch(500)
    }

    async fn try_acquire(&self, req: &LockRequest) -> Result<Option<Grant>> {
        checked_name(&req.name)?;
        if let HoldKind::Permits { .. } = req.kind {
            return self.try_acquire_permit(req).await;
        }
        let q = self.enqueue(req).await?;
        let queue = match q.queue {
            Some(queue) => queue,
            None => self.queue(&q.client, &q.parent, req.kind).await?,
        };
        let holds = queue
            .iter()
            .position(|c| c == &q.node)
            .is_some_and(|i| blocker(&queue, i, req.kind).is_none());
        if holds {
            return Ok(Some(Grant::new(q.token, q.began)));
        }
        self.delete_node(req).await?;
        Ok(None)
    }

    async fn acquire(&self, req: &LockRequest, deadline: Option<Instant>) -> Result<Grant> {
        checked_name(&req.name)?;
        if let HoldKind::Permits { .. } = req.kind {
            return self.acquire_permit(req, deadline).await;
        }
        let clock = WaitClock::start(&req.name, deadline);
        let mut q = self.enqueue(req).await?;
        let token = q.token;
        let waited = self.wait_turn(req, &mut q);
        let outcome = clock.within(waited).await;
        match outcome {
            Ok(()) => Ok(Grant::new(token, q.began)),
            Err(e) => {
                // A timed-out or failed wait deletes my node.
                let e = self.cut_off_at_the_deadline(e, &q.client);
                self.withdraw_soon(req, self.delete_node(req)).await;
                Err(e)
            }
        }
    }

    /// The node lives as long as the session; extending checks that it is
    /// still there and still ours.
    /// Whether the server's session bounds admit the TTLs distlock uses
    /// most: its default and the conformance suite's expiry TTL. A hold's
    /// session must time out at exactly its TTL. And the ensemble's size,
    /// from `/zookeeper/config` (empty on a standalone server): one server
    /// has no fault tolerance, and an even number no more than one fewer.
    async fn deployment_findings(&self) -> Result<Vec<Finding>> {
        let mut out = Vec::new();
        let config = match self.client().await {
            Ok(c) => c
                .get_data("/zookeeper/config")
                .await
                .map_err(|e| e.to_string()),
            Err(e) => Err(e.to_string()),
        };
        out.push(match config {
            Ok((data, _)) => {
                let servers = String::from_utf8_lossy(&data)
                    .lines()
                    .filter(|l| l.starts_with("server.") && !l.contains(":observer"))
                    .count();
                let shown = if servers == 0 {
                    "standalone".to_string()
                } else {
                    servers.to_string()
                };
                Finding::voters("servers", servers, shown)
            }
            Err(why) => Finding::unknown("servers", format!("/zookeeper/config: {why}")),
        });
        for ttl in [distlock_core::DEFAULT_TTL, Duration::from_secs(3)] {
            let setting = format!("session timeout for a {ttl:?} TTL");
            out.push(match self.hold_session(ttl).await {
                Ok(_) => Finding::fine(setting, format!("{ttl:?}, as asked")),
                Err(Error::InvalidInput { message, .. }) => {
                    Finding::warning(setting, "not granted as asked", message)
                }
                Err(e) => Finding::unknown(setting, e.to_string()),
            });
        }
        Ok(out)
    }

    async fn extend(&self, req: &LockRequest) -> Result<bool> {
        Ok(self.extend_many(std::slice::from_ref(req)).await?[0])
    }

    /// The session keeps every node alive; renewing is checking that each
    /// node is still there and still this session's, one multi-read per
    /// session for the whole batch. A permit's node must also still say it
    /// holds.
    async fn extend_many(&self, reqs: &[LockRequest]) -> Result<Vec<bool>> {
        let entries: Vec<Option<(String, Session)>> = reqs
            .iter()
            .map(|r| match r.kind {
                HoldKind::Permits { .. } if !self.extend_permit_ttl(r) => None,
                _ => self.node_of(r),
            })
            .collect();
        let mut answers = vec![false; reqs.len()];
        let mut sessions: Vec<(Session, Vec<usize>)> = Vec::new();
        for (i, entry) in entries.iter().enumerate() {
            let Some((_, client)) = entry else { continue };
            match sessions
                .iter_mut()
                .find(|(c, _)| c.session_id() == client.session_id())
            {
                Some((_, group)) => group.push(i),
                None => sessions.push((client.clone(), vec![i])),
            }
        }
        for (client, group) in sessions {
            let mut reader = client.new_multi_reader();
            for &i in &group {
                let Some((path, _)) = &entries[i] else {
                    continue;
                };
                reader.add_get_data(path).map_err(|e| self.err(e))?;
            }
            let results = match reader.commit().await {
                Ok(results) => results,
                Err(zk::Error::SessionExpired | zk::Error::ClientClosed) => continue,
                Err(e) => return Err(self.err(e)),
            };
            for (&i, result) in group.iter().zip(results) {
                answers[i] = match result {
                    zk::MultiReadResult::Data { stat, data } => {
                        stat.ephemeral_owner == client.session_id().0
                            && (!matches!(reqs[i].kind, HoldKind::Permits { .. })
                                || Self::holds(&data))
                    }
                    zk::MultiReadResult::Error {
                        err: zk::Error::NoNode | zk::Error::SessionExpired,
                    } => false,
                    zk::MultiReadResult::Error { err } => return Err(self.err(err)),
                    _ => false,
                };
            }
        }
        Ok(answers)
    }

    async fn release(&self, req: &LockRequest) -> Result<bool> {
        let released = self.delete_hold(req).await;
        if matches!(&released, Err(e) if e.is_retryable()) {
            self.release_later(req);
        }
        released
    }

    async fn inspect(&self, name: &LockName) -> Result<distlock_core::LockStatus> {
        let client = self.client().await?;
        let parent = self.parent(name);
        // No parent node: nobody has ever queued for the name. Any other
        // failure says nothing about the lock, so it is no answer either.
        let queue = match client.list_children(&parent).await {
            Ok(children) => in_queue_order(children, HoldKind::Exclusive),
            Err(zk::Error::NoNode) => Vec::new(),
            Err(e) => return Err(self.err(e)),
        };
        // The holders: an exclusive head alone, or the shared nodes ahead
        // of the first exclusive one. Any exclusive node behind the head
        // waits (and holds new shared requests back).
        let first_write = queue.iter().position(|c| is_write(c));
        let (holding, shared) = match first_write {
            Some(0) => (1, 0),
            Some(w) => (w, w),
            None => (queue.len(), queue.len()),
        };
        let writer_waiting = queue.iter().skip(1).any(|c| is_write(c));
        // The newest holder's node carries the newest grant's token.
        let Some(newest) = holding.checked_sub(1).map(|i| &queue[i]) else {
            return Ok(distlock_core::LockStatus::new(false).with_shared(0, false));
        };
        let read = match client.get_data(&format!("{parent}/{newest}")).await {
            Ok(read) => Some(read),
            Err(zk::Error::NoNode) => None,
            Err(e) => return Err(self.err(e)),
        };
        // An exclusive holder's node carries its holder info.
        let holder_info = read
            .as_ref()
            .filter(|_| shared == 0)
            .and_then(|(data, _)| holder_info_of(data));
        let stat = read.map(|(_, stat)| stat);
        Ok(distlock_core::LockStatus::new(stat.is_some())
            .with_holder_info(holder_info)
            .with_token(
                stat.and_then(|s| u64::try_from(s.czxid).ok())
                    .map(FencingToken),
            )
            .with_queue_len(Some(queue.len() - holding))
            .with_shared(shared, writer_waiting))
    }

    /// Walks the znodes under the lock root (and `@semaphores`) below the
    /// prefix's last complete segment: one multi-read listing the children
    /// of every node of a level (at most 500 nodes per multi-read), then
    /// one reading the data of every holding node, so O(znodes under the
    /// prefix), however small `limit` is. A hold's token is its node's
    /// `czxid` (a permit's: the zxid of the write that granted it); no
    /// remaining time, since holds last as long as their session.
    async fn list(&self, prefix: &str, limit: usize) -> Result<Vec<distlock_core::HoldRecord>> {
        self.list_holds(prefix, limit).await
    }

    async fn inspect_permits(&self, name: &LockName) -> Result<distlock_core::LockStatus> {
        self.inspect_semaphore(name).await
    }

    async fn set_limit(&self, name: &LockName, limit: u32) -> Result<Option<u32>> {
        checked_name(name)?;
        self.store_limit(name, limit).await
    }

    /// Sets my campaign node's data, if the node is still there.
    async fn proclaim(&self, req: &LockRequest, value: &str) -> Result<bool> {
        self.proclaim_value(req, value).await
    }

    /// The value on the lowest `latch-` node, as Curator's
    /// `LeaderLatch.getLeader` reads it.
    async fn leader(&self, name: &LockName) -> Result<Option<distlock_core::Leader>> {
        self.current_leader(name).await
    }

    /// Notified: each read sets a watch on what it read (the leader's
    /// node, or the children when nobody leads).
    async fn observe_leader(&self, name: &LockName) -> Result<Option<distlock_core::LeaderStream>> {
        Ok(Some(self.leaders(name)))
    }

    /// Session expiry ends every lock of the session. By default a mere
    /// disconnection does too (Curator's SUSPENDED, Tech Note 14): the
    /// server may expire the session before this client can tell.
    async fn session_lost(&self, req: &LockRequest) -> LostReason {
        // Only the session is kept for the wait: this future lives as long
        // as the hold.
        let session = self.nodes().get(&req.owner).map(|n| n.session.clone());
        let Some(client) = session else {
            return std::future::pending().await;
        };
        self.session_state_ends(&client).await
    }

    /// The session id: core then watches each session once, not once per
    /// lock.
    fn session_key(&self, req: &LockRequest) -> Option<u64> {
        self.nodes()
            .get(&req.owner)
            .map(|n| n.session.session_id().0 as u64)
    }

    async fn session_ended(&self, key: u64) -> LostReason {
        // Core keeps this watcher while the session has no lock, so the
        // session is looked up among the backend's current sessions first (a
        // watcher started for a lock released at once finds no node), then
        // among the nodes of older sessions.
        let current = self
            .inner
            .sessions
            .lock()
            .await
            .values()
            .find(|c| c.session_id().0 as u64 == key)
            .cloned();
        let client = current.or_else(|| {
            self.nodes()
                .values()
                .find(|n| n.session.session_id().0 as u64 == key)
                .map(|n| n.session.clone())
        });
        match client {
            Some(c) => self.session_state_ends(&c).await,
            None => LostReason::SessionLost(format!(
                "ZooKeeper session {key:x} is no longer this client's"
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lease_granted_on_an_event_counts_from_before_the_last_ping() {
        let ms = Duration::from_millis;
        // 2 s: the connection timeout (2 s) is above 3/5 of the session's,
        // ticks of 100 ms.
        assert_eq!(quiet_bound(ms(2_000)), ms(400));
        // 10 s and 1 h: ticks of 625 ms (5 s / 8).
        assert_eq!(quiet_bound(ms(10_000)), ms(2_500));
        assert_eq!(quiet_bound(Duration::from_secs(3_600)), ms(2_500));
        // At most 3/10 of the TTL (9 s: ticks of 625 ms, 2.5 s), so the
        // lease keeps most of its validity.
        for s in [2, 5, 8, 9, 30, 600] {
            let ttl = Duration::from_secs(s);
            assert!(quiet_bound(ttl) <= ttl * 3 / 10, "{ttl:?}");
        }
    }

    #[test]
    fn children_sort_by_their_sequence() {
        assert_eq!(
            sequence("_c_0a1b00000000000000000000000000000000-lock-0000000042"),
            Some(42)
        );
        // A longer name's node that ends like one is no queue node.
        assert_eq!(sequence("lock-0000000001"), None);
        assert_eq!(sequence("x-lock-0000000001"), None);
        assert_eq!(sequence("_c_short-lock-0000000001"), None);
        assert_eq!(sequence("lease-x"), None);
    }

    #[test]
    fn children_of_every_marker_queue_by_sequence() {
        assert_eq!(
            parse_child("_c_0a1b00000000000000000000000000000000-__READ__0000000007"),
            Some((7, Role::Read))
        );
        assert_eq!(
            parse_child("_c_0a1b00000000000000000000000000000000-__WRIT__0000000008"),
            Some((8, Role::Write))
        );
        assert_eq!(
            parse_child("_c_0a1b00000000000000000000000000000000-lock-0000000009"),
            Some((9, Role::Write))
        );
        assert_eq!(
            parse_child("_c_0a1b00000000000000000000000000000000-__READ__"),
            None
        );
        assert_eq!(
            parse_child("_c_0a1b00000000000000000000000000000000-lock-+9"),
            None
        );
        let queue = in_queue_order(
            vec![
                "_c_c00000000000000000000000000000000000-lock-0000000003".into(),
                "_c_b00000000000000000000000000000000000-__READ__0000000002".into(),
                "_c_a00000000000000000000000000000000000-__WRIT__0000000001".into(),
                "_c_d00000000000000000000000000000000000-latch-0000000000".into(),
                "leader".into(),
            ],
            HoldKind::Exclusive,
        );
        assert_eq!(
            queue,
            [
                "_c_a00000000000000000000000000000000000-__WRIT__0000000001",
                "_c_b00000000000000000000000000000000000-__READ__0000000002",
                "_c_c00000000000000000000000000000000000-lock-0000000003"
            ]
        );
    }

    #[test]
    fn the_nodes_of_longer_names_are_not_in_the_queue() {
        for segment in ["db-lock-1", "a-__READ__0", "b-__WRIT__42", "x-latch-7"] {
            assert_eq!(parse_child(segment), None, "{segment}");
            assert_eq!(latch_sequence(segment), None, "{segment}");
        }
        assert_eq!(
            sequence("_c_0a1b00000000000000000000000000000000-lock-0000000002147483648"),
            Some(1 << 31)
        );
        assert_eq!(
            in_queue_order(
                vec![
                    "db-lock-0".into(),
                    "_c_a00000000000000000000000000000000000-lock-0000000003".into()
                ],
                HoldKind::Exclusive
            ),
            ["_c_a00000000000000000000000000000000000-lock-0000000003"]
        );
    }

    #[test]
    fn campaigns_queue_by_the_sequence_after_latch_and_ignore_lock_nodes() {
        assert_eq!(
            latch_sequence("_c_0a1b00000000000000000000000000000000-latch-0000000042"),
            Some(42)
        );
        assert_eq!(latch_sequence("latch-0000000007"), None);
        assert_eq!(
            latch_sequence("_c_0a1b00000000000000000000000000000000-lock-0000000042"),
            None
        );
        assert_eq!(
            latch_sequence("_c_0a1b00000000000000000000000000000000-latch-"),
            None
        );
        assert_eq!(
            sequence("_c_0a1b00000000000000000000000000000000-latch-0000000042"),
            None
        );
        let children: Vec<String> = vec![
            "_c_a00000000000000000000000000000000000-lock-0000000001".into(),
            "_c_b00000000000000000000000000000000000-latch-0000000004".into(),
            "_c_c00000000000000000000000000000000000-__READ__0000000002".into(),
            "_c_d00000000000000000000000000000000000-latch-0000000003".into(),
        ];
        assert_eq!(
            in_queue_order(children.clone(), HoldKind::Leader),
            [
                "_c_d00000000000000000000000000000000000-latch-0000000003",
                "_c_b00000000000000000000000000000000000-latch-0000000004"
            ]
        );
        assert_eq!(
            in_queue_order(children, HoldKind::Exclusive),
            [
                "_c_a00000000000000000000000000000000000-lock-0000000001",
                "_c_c00000000000000000000000000000000000-__READ__0000000002"
            ]
        );
    }

    #[test]
    fn a_reader_waits_for_the_nearest_writer_ahead_and_a_writer_for_its_predecessor() {
        let q: Vec<String> = [
            "__READ__0000000001",
            "__WRIT__0000000002",
            "__READ__0000000003",
            "__WRIT__0000000004",
            "__READ__0000000005",
        ]
        .map(|c| format!("_c_x00000000000000000000000000000000000-{c}"))
        .to_vec();
        assert_eq!(blocker(&q, 0, HoldKind::Shared), None);
        assert_eq!(blocker(&q, 0, HoldKind::Exclusive), None);
        assert_eq!(blocker(&q, 2, HoldKind::Shared), Some((1, true)));
        assert_eq!(blocker(&q, 4, HoldKind::Shared), Some((3, false)));
        assert_eq!(blocker(&q, 1, HoldKind::Exclusive), Some((0, true)));
        assert_eq!(blocker(&q, 3, HoldKind::Exclusive), Some((2, false)));
        let readers: Vec<String> = vec![
            "_c_a00000000000000000000000000000000000-__READ__0000000001".into(),
            "_c_b00000000000000000000000000000000000-__READ__0000000002".into(),
        ];
        assert_eq!(blocker(&readers, 1, HoldKind::Shared), None);
    }

    #[test]
    fn sequences_print_as_zookeeper_names_them() {
        assert_eq!(SeqSuffix(42).to_string(), "0000000042");
        assert_eq!(SeqSuffix(i64::from(i32::MAX)).to_string(), "2147483647");
        assert_eq!(SeqSuffix(1 << 31).to_string(), "0000000002147483648");
        for child in [
            "_c_x00000000000000000000000000000000000-lock-0000000042",
            "_c_x00000000000000000000000000000000000-lock-0000000002147483648",
        ] {
            let seq = sequence(child).unwrap();
            assert_eq!(
                format!(
                    "_c_x00000000000000000000000000000000000-lock-{}",
                    SeqSuffix(seq)
                ),
                child
            );
        }
    }
}
