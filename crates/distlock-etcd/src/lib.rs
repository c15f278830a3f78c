#![doc = include_str!("../README.md")]

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use distlock_core::wait::WaitClock;
use distlock_core::{
    async_trait, AllAtOnce, Backend, Capabilities, Consistency, Error, Fencing, FencingToken,
    Finding, Grant, HoldKind, InputKind, LockRequest, LostReason, Result, TrustedClock, Waiting,
};
use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, EventType, GetOptions, KvClient, PutOptions,
    SortOrder, SortTarget, Txn, TxnOp, TxnOpResponse, WatchOptions,
};
use tokio::sync::Mutex;
use tokio::time::Instant;

mod claims;
mod creating;
mod election;
mod list;
mod semaphore;
mod session;

use claims::{Claiming, Claims};
use session::Session;

/// etcd's default `--max-txn-ops`: the most operations one txn may carry.
const MAX_TXN_OPS: usize = 128;

/// Locks on etcd, laid out like Go's `clientv3/concurrency.Mutex`, so
/// `etcdctl lock`, Go services and distlock exclude each other.
///
/// Cheap to clone; clones share the connection and the lease sessions.
#[derive(Clone)]
pub struct EtcdBackend {
    inner: Arc<Inner>,
}

struct Inner {
    client: Client,
    /// The KV service's client, for the lock's own requests.
    kv: KvClient,
    endpoints: String,
    /// One lease per TTL (in whole seconds): usually exactly one per client.
    /// Read on every acquire under a plain mutex; `starting` serializes
    /// only the rare start of a new lease.
    sessions: std::sync::Mutex<HashMap<i64, Arc<Session>>>,
    starting: Mutex<()>,
    /// The session each live acquisition (by owner) was queued in, so extend,
    /// release and loss reports use that lease whatever TTL they are given.
    queued: std::sync::Mutex<HashMap<distlock_core::Owner, Arc<Session>>>,
    /// When each granted permit ends unless extended (see `semaphore`).
    permit_ends: distlock_core::expiry::PermitEnds,
    wakeups: AtomicU64,
    /// Creates in flight, per name: a release never runs ahead of a create
    /// of its name's key whose caller went away (see [`creating`]).
    creating: Arc<creating::Creating>,
    /// Each campaign's key's create revision (0 while its create is in
    /// flight) and value, by owner: a campaign's key carries its value, not
    /// its owner, so this is how it is known as ours (as Go's `Election`
    /// knows its `leaderRev`).
    campaigns: std::sync::Mutex<HashMap<distlock_core::Owner, (i64, Arc<str>)>>,
    /// The lock and campaign keys live requests of this backend put or are
    /// putting (see [`claims`]).
    claims: Claims,
    /// A log-in is on its way after a request was refused for a stale token
    /// (see [`EtcdBackend::err`]).
    logging_in: std::sync::atomic::AtomicBool,
    /// Owners whose failed release goes on in the background (see
    /// [`EtcdBackend::release_later`]).
    releasing: std::sync::Mutex<std::collections::HashSet<distlock_core::Owner>>,
    /// etcd answered that a lease it was sent is unknown (a member
    /// restarted without its data): the next session asked for checks
    /// that its lease still lives (see [`EtcdBackend::session`]).
    lease_gone: std::sync::atomic::AtomicBool,
}

impl fmt::Debug for EtcdBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdBackend")
            .field("endpoints", &self.inner.endpoints)
            .finish()
    }
}

/// Where my key sits in the queue.
struct Queued {
    session: Arc<Session>,
    key: String,
    prefix: String,
    /// My key's create revision: its place in the queue.
    my_rev: i64,
    /// The revision of my key's last write: the token of a grant now.
    token_rev: i64,
    /// Whether a key that keeps me out sits ahead of mine: any key of the
    /// name for an exclusive request, a key that is not shared for a shared
    /// one.
    blocked: bool,
    /// Whether my key is a shared hold's.
    shared: bool,
}

/// What a renewal expects of a hold's key besides its lease.
enum Expect {
    /// This value (a lock's owner, a permit's marker).
    Value(Vec<u8>),
    /// This create revision (a campaign, whose value `proclaim` changes).
    Created(i64),
}

/// What one read of the keys ahead of mine found.
enum Ahead {
    /// None of the name's keys keeps me out; my key was rewritten at this
    /// revision (a campaign's: its create revision), the grant's token.
    Clear(i64),
    /// This key, the nearest ahead, keeps me out; read at this revision.
    Behind(Vec<u8>, i64),
    /// My key is gone or no longer mine.
    Vanished,
}

/// What one look at the keys ahead of mine found.
enum Step {
    /// Nothing keeps me out; my key was rewritten at this revision.
    Granted(i64),
    /// My key is gone or no longer mine.
    Vanished,
    /// The key I watched went (or the watch ended): look again.
    Again,
}

/// Whether etcd refused a request's token as issued before the last change
/// of users, roles or permissions ("revision of auth store is old": a JWT
/// token carries the auth store's revision). Logging in again gives a token
/// of the current revision; etcd-client does so by itself only for tokens
/// that expired.
fn stale_token(e: &etcd_client::Error) -> bool {
    matches!(e, etcd_client::Error::GRpcStatus(s)
        if s.code() == tonic_code::INVALID_ARGUMENT
            && s.message().contains("revision of auth store is old"))
}

fn err(endpoints: &str, e: etcd_client::Error) -> Error {
    use etcd_client::Error as E;
    // A refused certificate comes back as "unavailable", but every retry
    // fails the same way.
    if let Some(why) = distlock_core::tls_refusal(&e) {
        // An alert is the server refusing this side: distlock-etcd presents
        // no client certificate.
        let what = if why.to_ascii_lowercase().contains("received fatal alert") {
            "the server refused this client in the TLS handshake; distlock-etcd presents no client certificate, so a member started with --client-cert-auth refuses it (start it without, and authenticate with user:password@ in the URL); otherwise check the member's TLS protocols and ciphers"
        } else {
            "TLS refused the server's certificate; check ca_file and the host name in the URL"
        };
        return Error::misconfigured(
            "etcd",
            format!("etcd at {endpoints}: {what} ({why})"),
            Some(Box::new(e)),
        );
    }
    match e {
        E::TransportError(_) | E::IoError(_) => Error::unavailable(
            "etcd",
            format!("etcd at {endpoints} unreachable ({e})"),
            Some(Box::new(e)),
        ),
        E::GRpcStatus(ref s)
            if matches!(
                s.code(),
                tonic_code::UNAVAILABLE
                    | tonic_code::DEADLINE_EXCEEDED
                    | tonic_code::CANCELLED
                    | tonic_code::ABORTED
                    | tonic_code::UNKNOWN
            ) =>
        {
            Error::unavailable(
                "etcd",
                format!("etcd at {endpoints}: {}", s.message()),
                Some(Box::new(e)),
            )
        }
        // An auth token that expired (etcd's simple tokens end
        // `--auth-token-ttl`, 300 s by default, after their last use) or
        // that a restarted member no longer knows: the client logs in again
        // when its request is refused so, and a retry goes out with the new
        // token. etcd sheds load with "too many requests" while its
        // applied index lags far behind the committed one: a retry is
        // served once it catches up. Not every ResourceExhausted: tonic
        // gives that code to a message too large, and etcd to a database
        // out of space, which retrying does not fix.
        _ if stale_token(&e) => Error::unavailable(
            "etcd",
            format!("etcd at {endpoints}: the auth token predates a change of users or roles; logging in again"),
            Some(Box::new(e)),
        ),
        E::GRpcStatus(ref s)
            if (s.code() == tonic_code::UNAUTHENTICATED
                && s.message().contains("invalid auth token"))
                || (s.code() == tonic_code::RESOURCE_EXHAUSTED
                    && s.message().contains("too many requests")) =>
        {
            Error::unavailable(
                "etcd",
                format!("etcd at {endpoints}: {}", s.message()),
                Some(Box::new(e)),
            )
        }
        // A role without the key: the login worked.
        E::GRpcStatus(ref s) if s.code() == tonic_code::PERMISSION_DENIED => {
            Error::misconfigured(
                "etcd",
                format!(
                    "etcd at {endpoints}: {}; the user's role needs readwrite on the key prefixes of the lock names, /distlock/semaphores/<name prefix> and /distlock/leaders/<name prefix> (distlock-etcd's README)",
                    s.message()
                ),
                Some(Box::new(e)),
            )
        }
        // A wrong password ("authentication failed"), and a request without
        // a user on a cluster with authentication enabled ("user name is
        // empty").
        E::GRpcStatus(ref s)
            if s.code() == tonic_code::UNAUTHENTICATED
                || s.message().contains("authentication failed")
                || (s.code() == tonic_code::INVALID_ARGUMENT
                    && s.message().contains("user name is empty")) =>
        {
            Error::misconfigured(
                "etcd",
                format!(
                    "etcd at {endpoints}: {}; check the user and password in the URL",
                    s.message()
                ),
                Some(Box::new(e)),
            )
        }
        // A URL with a user for a cluster that has authentication off.
        E::GRpcStatus(ref s) if s.message().contains("authentication is not enabled") => {
            Error::misconfigured(
                "etcd",
                format!(
                    "etcd at {endpoints}: {}; drop the user and password from the URL, or enable authentication on the cluster",
                    s.message()
                ),
                Some(Box::new(e)),
            )
        }
        E::InvalidArgs(_) | E::InvalidUri(_) => {
            Error::invalid(InputKind::Url, format!("etcd at {endpoints}: {e}"))
        }
        // A session's lease that etcd no longer knows: a member restarted
        // without its data. A new session gets a new lease.
        _ if lease_not_found(&e) => Error::unavailable(
            "etcd",
            format!("etcd at {endpoints} no longer knows this client's lease (a member restarted without its data?); a new one is asked for"),
            Some(Box::new(e)),
        ),
        other => Error::backend("etcd", other),
    }
}

/// Whether `e` is etcd's answer to a request naming a lease it does not
/// know.
fn names_a_lost_lease(e: &Error) -> bool {
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        if s.downcast_ref::<etcd_client::Error>()
            .is_some_and(lease_not_found)
        {
            return true;
        }
        source = s.source();
    }
    false
}

/// The failure a wait is retrying after, until etcd answers again.
#[derive(Default)]
struct Failing(std::sync::Mutex<Option<Error>>);

impl Failing {
    fn set(&self, e: Option<Error>) {
        *self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = e;
    }

    fn take(&self) -> Option<Error> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take()
    }
}

/// How long a wait that ended without a grant waits for its key's deletion
/// before leaving it to the background.
const WITHDRAW_AT_ONCE: Duration = Duration::from_millis(300);

/// etcd's answer to a request naming a lease it does not know (a
/// keep-alive stream opened for it answers with a TTL of 0, which the
/// client reports as an error of its own).
pub(crate) fn lease_not_found(e: &etcd_client::Error) -> bool {
    match e {
        etcd_client::Error::GRpcStatus(s) => {
            s.code() == tonic_code::NOT_FOUND && s.message().contains("lease not found")
        }
        etcd_client::Error::LeaseKeepAliveError(m) => m.contains("lease not found"),
        _ => false,
    }
}

/// TLS that trusts the CA in `ca_file` (PEM), or the system's roots.
#[cfg(feature = "tls")]
fn tls_options(ca_file: Option<&str>) -> Result<etcd_client::TlsOptions> {
    let tls = etcd_client::TlsOptions::new();
    let Some(path) = ca_file else {
        return Ok(tls.with_native_roots());
    };
    let pem = std::fs::read(path).map_err(|e| {
        Error::invalid(
            InputKind::Url,
            format!("etcds:// URL: ca_file {path:?} cannot be read: {e}"),
        )
    })?;
    if !distlock_core::input::holds_pem_certificate(&pem) {
        return Err(Error::invalid(
            InputKind::Url,
            format!("etcds:// URL: ca_file {path:?} holds no PEM certificate"),
        ));
    }
    Ok(tls.ca_certificate(etcd_client::Certificate::from_pem(pem)))
}

/// The few gRPC codes we branch on.
mod tonic_code {
    pub(crate) use tonic::Code;
    pub(crate) const UNAVAILABLE: Code = Code::Unavailable;
    pub(crate) const DEADLINE_EXCEEDED: Code = Code::DeadlineExceeded;
    pub(crate) const NOT_FOUND: Code = Code::NotFound;
    // tonic reports a request that ran out of its timeout (a leader
    // election in progress) as Cancelled, "Timeout expired".
    pub(crate) const CANCELLED: Code = Code::Cancelled;
    pub(crate) const ABORTED: Code = Code::Aborted;
    // tonic reports a broken HTTP/2 connection (a killed member) as Unknown.
    pub(crate) const UNKNOWN: Code = Code::Unknown;
    pub(crate) const UNAUTHENTICATED: Code = Code::Unauthenticated;
    pub(crate) const PERMISSION_DENIED: Code = Code::PermissionDenied;
    pub(crate) const RESOURCE_EXHAUSTED: Code = Code::ResourceExhausted;
    pub(crate) const INVALID_ARGUMENT: Code = Code::InvalidArgument;
}

/// The HTTP/2 keep-alive of the client's connections: after `PING_EVERY`
/// without a frame from etcd a PING goes out, and unanswered within the
/// request timeout (within 500 ms to 1 s: the answer is one round trip, no Raft) the
/// connection is closed and the next request opens another. A connection
/// the network stopped serving without closing it is so given up within
/// 6 s of its last frame, in time to renew a lease of 7 s or more.
///
/// Not sooner: etcd closes a connection (GOAWAY "too_many_pings") on the
/// fourth ping in a row without a reply in between that comes sooner than
/// `--grpc-keepalive-min-time` (5 s by default) after the one before, as a
/// connection quiet between a long lease's keep-alives would send them,
/// breaking its watches. Nor while no stream is open (etcd allows one ping
/// in 2 h then): a request opens one, and is pinged at once on a
/// connection quiet for the interval. Lease keep-alives and watches are
/// open streams.
const PING_EVERY: Duration = Duration::from_secs(5);

fn keep_alive(timeout: Duration) -> (Duration, Duration) {
    // Not below 500 ms either, whatever `timeout_ms`: a PING answered late
    // by a busy member would close a live connection and its watches.
    (
        PING_EVERY,
        timeout.clamp(Duration::from_millis(500), Duration::from_secs(1)),
    )
}

/// Whole seconds of a TTL, rounded up: the lease never ends before the TTL.
fn ttl_secs(ttl: Duration) -> i64 {
    let s = ttl.as_secs() + u64::from(ttl.subsec_nanos() > 0);
    i64::try_from(s.max(1)).unwrap_or(i64::MAX)
}

/// The part of a lock's prefix that holds its shared keys: `@` never
/// appears in a lock name, so no other lock's keys (and no exclusive key,
/// `<name>/<lease hex>`) fall under it.
const SHARED: &str = "@r/";

/// What a request claims for `key`: a lock and a campaign of one name share
/// their key on a lease (Go's layout), and meeting there is a usage error
/// the enqueue reports, not a wait.
fn claim_key(key: &str, campaign: bool) -> String {
    if campaign {
        format!("{key} campaign")
    } else {
        key.to_string()
    }
}

/// The key of a shared hold: `<name>/@r/<owner>`. The owner is fresh per
/// acquisition, so several shared holds (and an exclusive one) on one
/// lease never share a key.
fn shared_key(name: &distlock_core::LockName, owner: &distlock_core::Owner) -> String {
    format!("{name}/{SHARED}{owner}")
}

/// Whether `key`, found under lock or election `prefix` (`<name>/`), is
/// one of that name's own keys (`<name>/<lease id>`, or a shared hold's
/// `<name>/@r/<owner>`), not a key of a longer name below it such as
/// `<name>/db/<lease id>`. Go's `Mutex` counts those too, so there lock
/// `jobs` waits for lock `jobs/nightly`; here, as on every backend, the
/// two are independent. Reads of a name's keys that come back with keys
/// of longer names skip them.
fn own_key(key: &[u8], prefix: &str) -> bool {
    key.strip_prefix(prefix.as_bytes()).is_some_and(|rest| {
        let rest = rest.strip_prefix(SHARED.as_bytes()).unwrap_or(rest);
        !rest.is_empty() && !rest.contains(&b'/')
    })
}

/// Whether `key`, under lock `prefix`, is a shared hold's.
fn is_shared(key: &[u8], prefix: &str) -> bool {
    key.strip_prefix(prefix.as_bytes())
        .is_some_and(|rest| rest.starts_with(SHARED.as_bytes()))
}

/// The two key ranges `[start, end)` that together hold every key under
/// `prefix` except the shared ones: what a reader must not have ahead of
/// it (distlock's and Go's exclusive keys, and anything else found there).
fn exclusive_ranges(prefix: &str) -> [(String, String); 2] {
    // `<prefix>@r/` .. `<prefix>@r0` is exactly the shared keys; a prefix
    // ends with `/`, so the prefix's own range ends at `<name>0`.
    let end = format!("{}0", prefix.trim_end_matches('/'));
    [
        (prefix.to_string(), format!("{prefix}{SHARED}")),
        (format!("{prefix}{}0", SHARED.trim_end_matches('/')), end),
    ]
}

/// The root of the keys that carry the holder info of leaderships. A
/// campaign's key carries its value (Go's layout, which `etcdctl elect`
/// reads), so its holder info lives in a second key on the same lease:
/// `/distlock/leaders/<name>/<lease id in hex>`. Lock names never start
/// with `/`, so no lock's or election's range `<name>/` covers these keys,
/// and semaphores live under their own root.
const LEADER_INFO_ROOT: &str = "/distlock/leaders/";

/// The key carrying the holder info of the campaign whose key is
/// `campaign_key` (`<name>/<lease id in hex>`).
fn leader_info_key(campaign_key: &str) -> String {
    format!("{LEADER_INFO_ROOT}{campaign_key}")
}

/// The holder info in a lock's or shared hold's value
/// ([`distlock_core::stored_owner`]); `None` for a value without any, such
/// as the empty one of `etcdctl lock`.
fn lock_holder_info(value: &[u8]) -> Option<String> {
    let value = std::str::from_utf8(value).ok()?;
    distlock_core::split_stored_owner(value)
        .1
        .map(str::to_string)
}

fn first_created() -> GetOptions {
    GetOptions::new()
        .with_prefix()
        .with_sort(SortTarget::Create, SortOrder::Ascend)
        .with_limit(1)
}

/// The two requests of an uncontended lock, public so that the benchmark
/// sends exactly these when it measures the protocol apart from the client.
pub mod requests {
    use super::first_created;
    use etcd_client::{Compare, CompareOp, PutOptions, Txn, TxnOp};

    /// Joins the queue of lock `prefix` (`<name>/`) with `key` (`prefix` +
    /// the lease id in hex): puts the key with the lease if it is absent
    /// and reads the queue head in the same transaction; if it exists,
    /// reads it and the head instead.
    pub fn enqueue(key: &str, prefix: &str, owner: &str, lease: i64) -> Txn {
        Txn::new()
            .when([Compare::create_revision(key, CompareOp::Equal, 0)])
            .and_then([
                TxnOp::put(key, owner, Some(PutOptions::new().with_lease(lease))),
                TxnOp::get(prefix, Some(first_created())),
            ])
            .or_else([
                TxnOp::get(key, None),
                TxnOp::get(prefix, Some(first_created())),
            ])
    }

    /// Joins lock `prefix` (`<name>/`) with the shared key `key`
    /// (`<name>/@r/<owner>`): puts it with the lease if absent and reads, in
    /// the same transaction, the oldest key of each of the two ranges that
    /// hold every key under `prefix` but the shared ones; if it exists,
    /// reads it and those two instead.
    pub fn enqueue_shared(key: &str, prefix: &str, owner: &str, lease: i64) -> Txn {
        let heads = || {
            super::exclusive_ranges(prefix)
                .map(|(start, end)| TxnOp::get(start, Some(first_created().with_range(end))))
        };
        let [a, b] = heads();
        let [a2, b2] = heads();
        Txn::new()
            .when([Compare::create_revision(key, CompareOp::Equal, 0)])
            .and_then([
                TxnOp::put(key, owner, Some(PutOptions::new().with_lease(lease))),
                a,
                b,
            ])
            .or_else([TxnOp::get(key, None), a2, b2])
    }

    /// [`enqueue`] for several locks at once: `(key, prefix, owner)` each,
    /// all put (if none exists yet) and every queue head read, in one
    /// transaction. The puts come first, then the heads, in order.
    pub fn enqueue_all(locks: &[(String, String, String)], lease: i64) -> Txn {
        let absent: Vec<Compare> = locks
            .iter()
            .map(|(key, ..)| Compare::create_revision(key.as_str(), CompareOp::Equal, 0))
            .collect();
        let puts = locks.iter().map(|(key, _, owner)| {
            TxnOp::put(
                key.as_str(),
                owner.as_str(),
                Some(PutOptions::new().with_lease(lease)),
            )
        });
        let heads = locks
            .iter()
            .map(|(_, prefix, _)| TxnOp::get(prefix.as_str(), Some(first_created())));
        Txn::new()
            .when(absent)
            .and_then(puts.chain(heads).collect::<Vec<_>>())
    }

    /// [`enqueue`] for a campaign (Go's `Election.Campaign`): `key` carries
    /// the campaign's `value`, and `info_key` (see [`super::leader_info_key`])
    /// the holder info, both put on the lease by the one transaction.
    pub fn enqueue_campaign(
        key: &str,
        prefix: &str,
        value: &str,
        (info_key, info): (&str, &str),
        lease: i64,
    ) -> Txn {
        let on_lease = || Some(PutOptions::new().with_lease(lease));
        Txn::new()
            .when([Compare::create_revision(key, CompareOp::Equal, 0)])
            .and_then([
                TxnOp::put(key, value, on_lease()),
                TxnOp::get(prefix, Some(first_created())),
                TxnOp::put(info_key, info, on_lease()),
            ])
            .or_else([
                TxnOp::get(key, None),
                TxnOp::get(prefix, Some(first_created())),
            ])
    }

    /// Deletes `keys` (keys of this client's lease that it just put).
    pub fn delete_all(keys: &[String]) -> Txn {
        Txn::new().and_then(
            keys.iter()
                .map(|key| TxnOp::delete(key.as_str(), None))
                .collect::<Vec<_>>(),
        )
    }

    /// Deletes `key` if it still carries `owner`.
    pub fn delete_mine(key: &str, owner: &str) -> Txn {
        Txn::new()
            .when([Compare::value(key, CompareOp::Equal, owner)])
            .and_then([TxnOp::delete(key, None)])
    }
}

impl EtcdBackend {
    /// Connects to `etcd://[user:password@]host:port[,host:port...]` (the
    /// client fails over between endpoints), or `etcds://` for TLS (feature
    /// `tls`). Parameters: `timeout_ms` (connect and request timeout, 1 to
    /// 3600000, default 5000); `ca_file` (`etcds://` only: PEM file of the
    /// CA to trust instead of the system roots). An endpoint listed twice,
    /// an unknown parameter, a parameter given twice and a value out of
    /// range are [`Error::InvalidInput`].
    pub async fn connect(url: &str) -> Result<Self> {
        let EtcdUrl {
            endpoints,
            user,
            timeout,
            ca_file,
            https,
            hosts,
        } = parse_url(url)?;
        let (ping_every, ping_timeout) = keep_alive(timeout);
        let mut options = ConnectOptions::new()
            .with_connect_timeout(timeout)
            .with_timeout(timeout)
            .with_keep_alive(ping_every, ping_timeout)
            .with_keep_alive_while_idle(false);
        if let Some((name, pass)) = user {
            // etcd's auth tokens end after a while (simple tokens 300 s
            // after their last use, by default): a request refused for its
            // token logs in again and is sent once more.
            options = options.with_user(name, pass).with_auto_token_refresh(true);
        }
        #[cfg(feature = "tls")]
        if https {
            options = options.with_tls(tls_options(ca_file.as_deref())?);
        }
        #[cfg(not(feature = "tls"))]
        let _ = (ca_file, https);
        let shown = hosts;
        // The connect timeout covers the TCP connection only: a member
        // that accepts it and then stalls (a paused process, a TLS
        // handshake nobody answers) is bounded here, the login and the
        // first request with it.
        let first = async {
            let mut client = Client::connect(&endpoints, Some(options))
                .await
                .map_err(|e| err(&shown, e))?;
            // The channel connects lazily, and requests retry an unavailable
            // cluster for seconds: one unretried request here reports a
            // server that is not there (or refuses the credentials) at once.
            client.status().await.map_err(|e| err(&shown, e))?;
            Ok::<_, Error>(client)
        };
        // A member that answers with the other of plain and TLS closes
        // the connection: no timeout, and then it is asked which it speaks.
        let first = tokio::time::timeout(timeout.saturating_mul(2), first)
            .await
            .map_err(|_| {
                Error::unavailable(
                    "etcd",
                    format!(
                        "etcd at {shown}: no answer within {:?} (the connection, its TLS handshake or the first request stalled)",
                        timeout.saturating_mul(2)
                    ),
                    None,
                )
            });
        let client = match first {
            Ok(Ok(client)) => client,
            // Not after a request that timed out: a stalled member, not a
            // scheme it does not speak.
            Ok(Err(e @ (Error::Unavailable { .. } | Error::Backend { .. }))) if !timed_out(&e) => {
                return Err(match wrong_scheme(&endpoints[0], https, timeout).await {
                    Some(why) => Error::misconfigured(
                        "etcd",
                        format!("etcd at {shown}: {why}"),
                        Some(Box::new(e)),
                    ),
                    None => e,
                })
            }
            Ok(Err(e)) | Err(e) => return Err(e),
        };
        Ok(Self {
            inner: Arc::new(Inner {
                kv: client.kv_client(),
                client,
                endpoints: shown,
                sessions: Default::default(),
                starting: Mutex::new(()),
                queued: Default::default(),
                permit_ends: Default::default(),
                wakeups: AtomicU64::new(0),
                logging_in: std::sync::atomic::AtomicBool::new(false),
                releasing: Default::default(),
                lease_gone: std::sync::atomic::AtomicBool::new(false),
                creating: Arc::default(),
                campaigns: Default::default(),
                claims: Claims::default(),
            }),
        })
    }

    fn err(&self, e: etcd_client::Error) -> Error {
        if lease_not_found(&e) {
            self.inner.lease_gone.store(true, Ordering::Release);
        }
        if stale_token(&e) && !self.inner.logging_in.swap(true, Ordering::AcqRel) {
            let this = self.clone();
            tokio::spawn(async move {
                if let Err(e) = this.inner.client.refresh_token().await {
                    tracing::warn!(error = %e, "etcd: logging in again failed");
                }
                this.inner.logging_in.store(false, Ordering::Release);
            });
        }
        err(&self.inner.endpoints, e)
    }

    fn client(&self) -> Client {
        self.inner.client.clone()
    }

    /// Runs an idempotent request, retrying for a few seconds while etcd is
    /// unavailable: a dead endpoint still in the client's balancer, or a
    /// leader election in progress. Each request here is safe to repeat
    /// (compare-guarded transactions and reads).
    async fn call<T, F, Fut>(&self, f: F) -> Result<T>
    where
        F: Fn(Client) -> Fut,
        Fut: std::future::Future<Output = std::result::Result<T, etcd_client::Error>>,
    {
        self.retrying(|| f(self.client())).await
    }

    /// [`call`](Self::call) for key-value requests, on the KV service's
    /// client alone: a `Client` clone copies every service's channel (about
    /// twenty), a `KvClient` clone two. Sending raw requests with a `Client`
    /// clone per request is measurably slower (docs/benchmarks.md).
    async fn kv<T, F, Fut>(&self, f: F) -> Result<T>
    where
        F: Fn(KvClient) -> Fut,
        Fut: std::future::Future<Output = std::result::Result<T, etcd_client::Error>>,
    {
        self.retrying(|| f(self.inner.kv.clone())).await
    }

    /// Sends one transaction, retried as [`Self::kv`] retries.
    async fn txn(&self, txn: Txn) -> Result<etcd_client::TxnResponse> {
        self.kv(|mut c| {
            let txn = txn.clone();
            async move { c.txn(txn).await }
        })
        .await
    }

    /// Sends `txn`, which may create the keys of the locks `names`, to
    /// completion even if the caller stops waiting for it; see
    /// [`Inner::creating`].
    async fn creating_txn<'a>(
        &self,
        names: impl IntoIterator<Item = &'a str>,
        txn: Txn,
    ) -> Result<etcd_client::TxnResponse> {
        let in_flight = self.inner.creating.in_flight(names).await;
        let this = self.clone();
        let sent = async move {
            let resp = this.txn(txn).await;
            drop(in_flight);
            resp
        };
        distlock_core::completion::to_completion(sent, |_| async {}).await
    }

    /// Waits until no create of `name`'s key sent before now is in flight.
    async fn creates_settled(&self, name: &distlock_core::LockName) {
        self.inner.creating.settled(name.as_str()).await;
    }

    async fn retrying<T, F, Fut>(&self, f: F) -> Result<T>
    where
        F: Fn() -> Fut,
        Fut: std::future::Future<Output = std::result::Result<T, etcd_client::Error>>,
    {
        let start = Instant::now();
        let mut delay = Duration::from_millis(50);
        loop {
            match f().await.map_err(|e| self.err(e)) {
                // A lost lease stays lost: the caller needs a new session.
                Err(e @ Error::Unavailable { .. })
                    if start.elapsed() < Duration::from_secs(6) && !names_a_lost_lease(&e) =>
                {
                    tracing::debug!(error = %e, "etcd request failed; retrying");
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(Duration::from_millis(500));
                }
                other => return other,
            }
        }
    }

    /// Deletes every key of lock or election `name` (holder and queue, and
    /// campaigns' holder info), as an operator would; the holder's next
    /// renewal is rejected. Returns whether any existed.
    /// Longer names' keys under `<name>/` stay (see [`own_key`]).
    pub async fn evict(&self, name: &distlock_core::LockName) -> Result<bool> {
        let prefixes = [format!("{name}/"), format!("{LEADER_INFO_ROOT}{name}/")];
        let read = |prefix: &String| {
            TxnOp::get(
                prefix.as_str(),
                Some(GetOptions::new().with_prefix().with_keys_only()),
            )
        };
        let resp = self
            .txn(Txn::new().and_then([read(&prefixes[0]), read(&prefixes[1])]))
            .await?;
        let keys: Vec<Vec<Vec<u8>>> = resp
            .op_responses()
            .into_iter()
            .zip(&prefixes)
            .map(|(op, prefix)| match op {
                TxnOpResponse::Get(g) => g
                    .kvs()
                    .iter()
                    .filter(|kv| own_key(kv.key(), prefix))
                    .map(|kv| kv.key().to_vec())
                    .collect(),
                _ => Vec::new(),
            })
            .collect();
        let existed = keys.first().is_some_and(|k| !k.is_empty());
        let all: Vec<Vec<u8>> = keys.into_iter().flatten().collect();
        for chunk in all.chunks(MAX_TXN_OPS) {
            let deletes: Vec<TxnOp> = chunk
                .iter()
                .map(|key| TxnOp::delete(key.clone(), None))
                .collect();
            self.txn(Txn::new().and_then(deletes)).await?;
        }
        Ok(existed)
    }

    /// How many times a waiter of this client was woken by its predecessor's
    /// deletion (the herd test counts these).
    pub fn wakeups(&self) -> u64 {
        self.inner.wakeups.load(Ordering::Relaxed)
    }

    /// The lease session for `ttl`, started on first use or after the last
    /// one was lost.
    async fn session(&self, ttl: Duration) -> Result<Arc<Session>> {
        if self.inner.lease_gone.swap(false, Ordering::AcqRel) {
            // Each session checks its lease now: one whose lease etcd no
            // longer knows ends, and is replaced below.
            let live: Vec<Arc<Session>> = self.sessions().values().cloned().collect();
            futures_util::future::join_all(live.iter().map(|s| s.check_lease())).await;
        }
        let secs = ttl_secs(ttl);
        let live = |secs| self.sessions().get(&secs).filter(|s| !s.is_lost()).cloned();
        if let Some(s) = live(secs) {
            return Ok(s);
        }
        // Starting one is boxed: its future is large (a lease grant and its
        // keep-alive stream), and every acquire's future would carry it.
        Box::pin(async {
            let _starting = self.inner.starting.lock().await;
            if let Some(s) = live(secs) {
                return Ok(s);
            }
            let s = self
                .call(|c| async move { Session::start(&c, secs).await })
                .await?;
            self.sessions().insert(secs, s.clone());
            Ok(s)
        })
        .await
    }

    /// The session `req` was queued in: recorded at enqueue; otherwise every
    /// live session (a release after a lost reply may find its key in any).
    fn sessions_of(&self, req: &LockRequest) -> Vec<Arc<Session>> {
        if let Some(s) = self.queued().get(&req.owner) {
            return vec![s.clone()];
        }
        self.sessions()
            .values()
            .filter(|s| !s.is_lost())
            .cloned()
            .collect()
    }

    fn sessions(&self) -> std::sync::MutexGuard<'_, HashMap<i64, Arc<Session>>> {
        self.inner
            .sessions
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn campaigns(
        &self,
    ) -> std::sync::MutexGuard<'_, HashMap<distlock_core::Owner, (i64, Arc<str>)>> {
        self.inner
            .campaigns
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The create revision of `owner`'s campaign key, once granted.
    fn campaign_rev(&self, owner: &distlock_core::Owner) -> Option<i64> {
        self.campaigns()
            .get(owner)
            .map(|(rev, _)| *rev)
            .filter(|rev| *rev > 0)
    }

    /// Whether a key of this client's lease created at `rev` with `value`
    /// belongs to a live hold of the kinds asked for: a campaign (by its
    /// revision, or by its value while its create is in flight) or a lock
    /// (by its owner value). Anything else found there is a leftover, such
    /// as a cancelled acquire's key whose release has not run yet.
    fn key_in_use(&self, rev: i64, value: &[u8], campaigns: bool, locks: bool) -> bool {
        let campaign = || {
            self.campaigns()
                .values()
                .any(|(r, v)| *r == rev || (*r == 0 && v.as_bytes() == value))
        };
        let lock = || {
            let owner = std::str::from_utf8(value).map(|v| distlock_core::split_stored_owner(v).0);
            owner.is_ok_and(|owner| self.queued().keys().any(|o| o.to_string() == owner))
        };
        (campaigns && campaign()) || (locks && lock())
    }

    /// The condition that `key` is still `req`'s: a campaign's key still
    /// has the create revision it was granted with (its value changes with
    /// `proclaim`), a lock's key still carries its owner (and holder info).
    fn still_mine(&self, key: &str, req: &LockRequest) -> Compare {
        match req.kind {
            HoldKind::Leader => {
                let rev = self.campaign_rev(&req.owner).unwrap_or(-1);
                Compare::create_revision(key, CompareOp::Equal, rev)
            }
            _ => Compare::value(key, CompareOp::Equal, distlock_core::stored_owner(req)),
        }
    }

    /// Forgets `req`'s session, campaign and claim, once its key is gone.
    fn forget(&self, req: &LockRequest) {
        self.queued().remove(&req.owner);
        self.inner.claims.unclaim(&req.owner);
        if req.kind == HoldKind::Leader {
            self.campaigns().remove(&req.owner);
        }
    }

    fn queued(&self) -> std::sync::MutexGuard<'_, HashMap<distlock_core::Owner, Arc<Session>>> {
        self.inner
            .queued
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Puts my key if absent and reads the queue head (for a shared
    /// request: the oldest key that is not shared), in one transaction.
    /// A lock's or a campaign's key is claimed first, waiting as `how`
    /// says for another request of this backend that has it; `Ok(None)`:
    /// refused to a try.
    async fn enqueue(&self, req: &LockRequest, how: Claiming<'_>) -> Result<Option<Queued>> {
        let session = self.session(req.ttl).await?;
        match self.enqueue_in(req, how, session.clone()).await {
            // The session's lease is gone (a member restarted without its
            // data): the session ends, and the request goes once more in a
            // new one.
            Err(e) if names_a_lost_lease(&e) => {
                tracing::info!(lock = %req.name, error = %e, "etcd no longer knows this client's lease; asking again under a new one");
                session.check_lease().await;
                let session = self.session(req.ttl).await?;
                self.enqueue_in(req, how, session).await
            }
            queued => queued,
        }
    }

    /// [`enqueue`](Self::enqueue) in `session`.
    async fn enqueue_in(
        &self,
        req: &LockRequest,
        how: Claiming<'_>,
        session: Arc<Session>,
    ) -> Result<Option<Queued>> {
        let prefix = format!("{}/", req.name);
        let shared = req.kind == HoldKind::Shared;
        // Go's Mutex layout for the exclusive key: <name>/<lease id in
        // lowercase hex>.
        let key = if shared {
            shared_key(&req.name, &req.owner)
        } else {
            format!("{prefix}{:x}", session.lease)
        };
        let campaign = req.kind == HoldKind::Leader;
        if !shared
            && !self
                .inner
                .claims
                .claim(&claim_key(&key, campaign), req.owner, how)
                .await?
        {
            return Ok(None);
        }
        let queued = self.enqueue_claimed(req, session, key, prefix).await;
        if queued.is_err() {
            // Whatever it left is a leftover now, which the next request
            // of the name deletes.
            self.inner.claims.unclaim(&req.owner);
        }
        queued
    }

    /// [`enqueue`](Self::enqueue) once the key is claimed.
    async fn enqueue_claimed(
        &self,
        req: &LockRequest,
        session: Arc<Session>,
        key: String,
        prefix: String,
    ) -> Result<Option<Queued>> {
        let shared = req.kind == HoldKind::Shared;
        let campaign = req.kind == HoldKind::Leader;
        self.queued().insert(req.owner, session.clone());
        // A lock's key carries its owner and holder info; compares of the
        // value use the same text.
        let owner = distlock_core::stored_owner(req);
        let info_key = leader_info_key(&key);
        let info = req.holder_info.as_deref().unwrap_or_default();
        // A campaign's key carries its value (Go's Election), a lock's its owner.
        let value = match &req.value {
            Some(v) if campaign => v.to_string(),
            _ => owner.clone(),
        };
        if campaign {
            // Known as in flight before its create is sent, so that no
            // other request of this client takes its key for a leftover.
            self.campaigns()
                .insert(req.owner, (0, value.as_str().into()));
        }
        for _ in 0..3 {
            let txn = if shared {
                requests::enqueue_shared(&key, &prefix, &owner, session.lease)
            } else if campaign {
                requests::enqueue_campaign(&key, &prefix, &value, (&info_key, info), session.lease)
            } else {
                requests::enqueue(&key, &prefix, &value, session.lease)
            };
            let resp = self.creating_txn([req.name.as_str()], txn).await?;
            let header_rev = resp.header().map_or(0, |h| h.revision());
            let ops = resp.op_responses();
            // The oldest key of each range read, and whether it is the
            // name's own (not a longer name's).
            let heads: Vec<(i64, bool)> = ops
                .iter()
                .skip(1)
                .filter_map(|op| match op {
                    TxnOpResponse::Get(g) => g
                        .kvs()
                        .first()
                        .map(|kv| (kv.create_revision(), own_key(kv.key(), &prefix))),
                    _ => None,
                })
                .collect();
            let queued = |my_rev: i64, token_rev: i64| {
                let ahead = |own: bool| heads.iter().any(|&(r, o)| o == own && r < my_rev);
                let q = Queued {
                    session: session.clone(),
                    key: key.clone(),
                    prefix: prefix.clone(),
                    my_rev,
                    token_rev,
                    blocked: ahead(true),
                    shared,
                };
                // A longer name's key is the oldest: the name's own keys
                // ahead of mine, if any, are behind it.
                (q, ahead(false))
            };
            if resp.succeeded() {
                if campaign {
                    self.campaigns()
                        .insert(req.owner, (header_rev, value.as_str().into()));
                }
                return self
                    .settle(queued(header_rev, header_rev), req)
                    .await
                    .map(Some);
            }
            let existing = match ops.first() {
                Some(TxnOpResponse::Get(g)) => g
                    .kvs()
                    .first()
                    .map(|kv| (kv.create_revision(), kv.mod_revision(), kv.value().to_vec())),
                _ => None,
            };
            match existing {
                Some((rev, _, _)) if campaign && self.campaign_rev(&req.owner) == Some(rev) => {
                    return self.settle(queued(rev, rev), req).await.map(Some);
                }
                // My key, from an attempt whose answer was lost and that
                // `retrying` sent again. Whether a key was ahead when it was
                // created is unknown, so neither of its revisions is a token
                // above every earlier grant: one look ahead rewrites it, and
                // the rewrite's revision is the token (or it waits).
                Some((rev, _, value)) if !campaign && value == owner.as_bytes() => {
                    let (q, _) = queued(rev, rev);
                    return self.settle((q, true), req).await.map(Some);
                }
                // A key of the other kind that is in use: Go's layout gives
                // a lock and an election of one name the same key on one
                // lease. A key of the same kind is a leftover (one client
                // has one live hold of a kind per name).
                Some((rev, _, value)) if self.key_in_use(rev, &value, !campaign, campaign) => {
                    self.forget(req);
                    return Err(Error::invalid(
                        InputKind::Config,
                        format!(
                            "{key} is held by another lock or campaign of this client on the same etcd lease (a lock and an election of one name share their keys); use distinct names, or another client"
                        ),
                    ));
                }
                Some((_, _, stale)) => {
                    // Our lease's key from an earlier acquisition that was
                    // never cleaned up (a live request of this backend would
                    // hold its claim). Reusing it would reuse its create
                    // revision, i.e. its fencing token: delete and requeue.
                    let del = Txn::new()
                        .when([Compare::value(key.as_str(), CompareOp::Equal, stale)])
                        .and_then([TxnOp::delete(key.as_str(), None)]);
                    self.kv(|mut c| {
                        let del = del.clone();
                        async move { c.txn(del).await }
                    })
                    .await?;
                }
                None => {}
            }
        }
        Err(Error::backend(
            "etcd",
            format!("could not enqueue {key}: it kept changing"),
        ))
    }

    /// Deletes my key if it is still mine ([`Self::still_mine`]), and a
    /// campaign's holder info with it.
    async fn delete_mine(&self, key: &str, req: &LockRequest) -> Result<bool> {
        let txn = match req.kind {
            HoldKind::Leader => Txn::new().when([self.still_mine(key, req)]).and_then([
                TxnOp::delete(key, None),
                TxnOp::delete(leader_info_key(key), None),
            ]),
            _ => requests::delete_mine(key, &distlock_core::stored_owner(req)),
        };
        Ok(self.txn(txn).await?.succeeded())
    }

    /// Go's waitDeletes: watch only the nearest key ahead of mine that
    /// keeps me out (for an exclusive request the key created just before
    /// mine, for a shared one the nearest key that is not shared), and when
    /// it goes, look again, since more than one key can sit ahead. Returns
    /// the token once nothing ahead keeps me out, `None` if my key
    /// vanished. Transient failures (a member dying, a leader election) are
    /// retried for up to 30 s in a row.
    /// The failure it is retrying after is kept in `failing` until etcd
    /// answers again (for a wait that runs out while etcd keeps failing to
    /// end with it).
    async fn wait_for_predecessors(
        &self,
        q: &Queued,
        req: &LockRequest,
        failing: &Failing,
    ) -> Result<Option<i64>> {
        let mut failing_since: Option<Instant> = None;
        loop {
            match self.wait_one_predecessor(q, req, failing).await {
                Ok(Step::Granted(rev)) => return Ok(Some(rev)),
                Ok(Step::Vanished) => return Ok(None),
                Ok(Step::Again) => failing_since = None,
                Err(e @ Error::Unavailable { .. }) => {
                    let since = *failing_since.get_or_insert_with(Instant::now);
                    if since.elapsed() > Duration::from_secs(30) {
                        return Err(e);
                    }
                    tracing::debug!(error = %e, "etcd wait interrupted; retrying");
                    failing.set(Some(e));
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// `q` as the enqueue found it, with `unsure` when a longer name's key
    /// was the oldest read: then one [look](Self::look_ahead) past such
    /// keys says whether the name's own keys keep me out.
    async fn settle(&self, (mut q, unsure): (Queued, bool), req: &LockRequest) -> Result<Queued> {
        if unsure && !q.blocked {
            // Boxed: off the common path, and the enqueue's future would
            // otherwise carry a transaction's future in every acquire.
            match Box::pin(self.look_ahead(&q, req)).await? {
                Ahead::Clear(token) => q.token_rev = token,
                Ahead::Behind(..) | Ahead::Vanished => q.blocked = true,
            }
        }
        Ok(q)
    }

    /// One transaction that, if my key still carries my owner value (the
    /// Jepsen etcd 3.4.3 analysis asks for that check after waking), reads
    /// the nearest key ahead that keeps me out and rewrites my key. With
    /// nothing ahead, that rewrite is the grant, and its revision the
    /// token: every grant after a wait is a write made after the lock was
    /// seen free, so tokens rise in grant order across shared and
    /// exclusive holds. A longer name's key found nearest is passed over:
    /// the next transaction reads below its create revision (keys created
    /// later never sit ahead of mine, so what lies between stays empty).
    async fn look_ahead(&self, q: &Queued, req: &LockRequest) -> Result<Ahead> {
        let mut below = q.my_rev - 1;
        loop {
            let ahead = |start: String, end: Option<String>| {
                let opts = GetOptions::new()
                    .with_sort(SortTarget::Create, SortOrder::Descend)
                    .with_max_create_revision(below)
                    .with_limit(1);
                let opts = match end {
                    Some(end) => opts.with_range(end),
                    None => opts.with_prefix(),
                };
                TxnOp::get(start, Some(opts))
            };
            let mut ops: Vec<TxnOp> = if q.shared {
                exclusive_ranges(&q.prefix)
                    .into_iter()
                    .map(|(start, end)| ahead(start, Some(end)))
                    .collect()
            } else {
                vec![ahead(q.prefix.clone(), None)]
            };
            let campaign = req.kind == HoldKind::Leader;
            if !campaign {
                ops.push(TxnOp::put(
                    q.key.as_str(),
                    distlock_core::stored_owner(req),
                    Some(PutOptions::new().with_lease(q.session.lease)),
                ));
            }
            let txn = Txn::new()
                .when([self.still_mine(&q.key, req)])
                .and_then(ops);
            let resp = self.txn(txn).await?;
            if !resp.succeeded() {
                return Ok(Ahead::Vanished);
            }
            // A campaign's token is its key's create revision, as Go's
            // `leaderRev`: leaders take over in create order, so it rises.
            let rev = resp.header().map_or(0, |h| h.revision());
            let token = if campaign { q.my_rev } else { rev };
            let nearest = resp
                .op_responses()
                .into_iter()
                .filter_map(|op| match op {
                    TxnOpResponse::Get(g) => g
                        .kvs()
                        .first()
                        .map(|kv| (kv.create_revision(), kv.key().to_vec())),
                    _ => None,
                })
                .max();
            match nearest {
                None => return Ok(Ahead::Clear(token)),
                Some((_, key)) if own_key(&key, &q.prefix) => return Ok(Ahead::Behind(key, rev)),
                Some((created, _)) => below = created - 1,
            }
        }
    }

    /// One step of the wait: [look ahead](Self::look_ahead), and watch the
    /// deletion of the nearest key that keeps me out.
    async fn wait_one_predecessor(
        &self,
        q: &Queued,
        req: &LockRequest,
        failing: &Failing,
    ) -> Result<Step> {
        let (pred_key, rev) = match self.look_ahead(q, req).await? {
            Ahead::Clear(token) => return Ok(Step::Granted(token)),
            Ahead::Vanished => return Ok(Step::Vanished),
            Ahead::Behind(key, rev) => (key, rev),
        };
        let mut stream = self
            .client()
            .watch(
                pred_key,
                Some(WatchOptions::new().with_start_revision(rev + 1)),
            )
            .await
            .map_err(|e| self.err(e))?;
        // etcd answers again: a failure before this one is over.
        failing.set(None);
        while let Some(msg) = stream.message().await.map_err(|e| self.err(e))? {
            if msg.canceled() {
                break;
            }
            if msg
                .events()
                .iter()
                .any(|e| e.event_type() == EventType::Delete)
            {
                self.inner.wakeups.fetch_add(1, Ordering::Relaxed);
                break;
            }
        }
        Ok(Step::Again)
    }
}

impl EtcdBackend {
    /// [`try_acquire_all`](Self::try_acquire_all) in `session`.
    async fn try_acquire_all_in(
        &self,
        reqs: &[LockRequest],
        session: Arc<Session>,
    ) -> Result<AllAtOnce> {
        let locks: Vec<(String, String, String)> = reqs
            .iter()
            .map(|r| {
                let prefix = format!("{}/", r.name);
                (
                    format!("{prefix}{:x}", session.lease),
                    prefix,
                    distlock_core::stored_owner(r),
                )
            })
            .collect();
        let forget = |backend: &Self| {
            let mut queued = backend.queued();
            for r in reqs {
                queued.remove(&r.owner);
                backend.inner.claims.unclaim(&r.owner);
            }
        };
        // A name another request of this backend has: one at a time.
        for (r, (key, ..)) in reqs.iter().zip(&locks) {
            let claim = claim_key(key, false);
            if !self
                .inner
                .claims
                .claim(&claim, r.owner, Claiming::Try)
                .await?
            {
                forget(self);
                return Ok(AllAtOnce::NotOffered);
            }
        }
        {
            let mut queued = self.queued();
            for r in reqs {
                queued.insert(r.owner, session.clone());
            }
        }
        let txn = requests::enqueue_all(&locks, session.lease);
        let resp = match self
            .creating_txn(reqs.iter().map(|r| r.name.as_str()), txn)
            .await
        {
            Ok(resp) => resp,
            Err(e) => {
                // Whatever it left is a leftover now, which the next
                // request of each name deletes.
                forget(self);
                return Err(e);
            }
        };
        if !resp.succeeded() {
            forget(self);
            return Ok(AllAtOnce::NotOffered);
        }
        let rev = resp.header().map_or(0, |h| h.revision());
        let ops = resp.op_responses();
        let heads: Vec<Option<(i64, bool)>> = ops[reqs.len()..]
            .iter()
            .zip(&locks)
            .map(|(op, (_, prefix, _))| match op {
                TxnOpResponse::Get(g) => g
                    .kvs()
                    .first()
                    .map(|kv| (kv.create_revision(), own_key(kv.key(), prefix))),
                _ => None,
            })
            .collect();
        let first = heads.iter().all(|h| h.is_some_and(|(r, _)| r == rev));
        if first && heads.len() == reqs.len() {
            let began = session.lease_began();
            let token = FencingToken(rev as u64);
            return Ok(AllAtOnce::Granted(
                reqs.iter().map(|_| Grant::new(token, began)).collect(),
            ));
        }
        let mine: Vec<String> = locks.into_iter().map(|(key, ..)| key).collect();
        let txn = requests::delete_all(&mine);
        self.txn(txn).await?;
        forget(self);
        // A longer name's key read as a queue's oldest hides whether the
        // name's own keys keep it out: the names are taken one at a time.
        if heads.iter().flatten().any(|&(r, own)| !own && r != rev) {
            return Ok(AllAtOnce::NotOffered);
        }
        Ok(AllAtOnce::Refused)
    }

    /// Deletes a lock's, shared hold's or campaign's key if it is still
    /// `req`'s.
    async fn release_key(&self, req: &LockRequest) -> Result<bool> {
        self.creates_settled(&req.name).await;
        if req.kind == HoldKind::Shared {
            // Named by its owner: no session to look it up in.
            let released = self
                .delete_mine(&shared_key(&req.name, &req.owner), req)
                .await?;
            self.forget(req);
            return Ok(released);
        }
        let mut released = false;
        let known = req.kind != HoldKind::Leader || self.campaign_rev(&req.owner).is_some();
        for s in self.sessions_of(req) {
            let key = format!("{}/{:x}", req.name, s.lease);
            let deleted = if known {
                self.delete_mine(&key, req).await
            } else {
                self.delete_stray_campaign(&key, req).await
            };
            match deleted {
                Ok(d) => released |= d,
                Err(e) => {
                    // A later request finds the key as a leftover and
                    // deletes it; a retry of this release still can.
                    self.inner.claims.unclaim(&req.owner);
                    return Err(e);
                }
            }
        }
        self.forget(req);
        Ok(released)
    }

    /// Deletes `req`'s key: a permit's, or a lock's, shared hold's or
    /// campaign's.
    async fn delete_hold(&self, req: &LockRequest) -> Result<bool> {
        match req.kind {
            HoldKind::Permits { .. } => self.release_permit(req).await,
            _ => self.release_key(req).await,
        }
    }

    /// After a release failed for a reason that clears by itself: a key
    /// lives as long as its session's lease, which the session keeps alive
    /// whether or not anything is held, so a key left behind would keep its
    /// name held for the life of the process. Keeps deleting it in the
    /// background, backing off to 5 s, until a delete answers or the
    /// session ends (its lease, and the key with it, are then gone); one
    /// such task per owner.
    fn release_later(&self, req: &LockRequest) {
        if !self.releasing().insert(req.owner) {
            return;
        }
        let (this, req) = (self.clone(), req.clone());
        let (after, owner) = (self.clone(), req.owner);
        distlock_core::completion::release_in_background(
            req.name.clone(),
            move || {
                if this.sessions_of(&req).iter().all(|s| s.is_lost()) {
                    this.forget(&req);
                    return None;
                }
                let (this, req) = (this.clone(), req.clone());
                Some(async move { this.delete_hold(&req).await })
            },
            move || {
                after.releasing().remove(&owner);
            },
        );
    }

    /// The clean-up of a request that ends without a grant: a delete of
    /// its key that failed goes on in the background. Core releases
    /// nothing after an answer that grants nothing (a refused try, a
    /// timed-out wait), so otherwise the key would stay, kept alive by the
    /// session and ahead of every later request, until the session ends.
    pub(crate) fn withdraw(&self, req: &LockRequest, deleted: Result<bool>) {
        if let Err(e) = deleted {
            tracing::debug!(lock = %req.name, error = %e, "could not delete the key of a request that got nothing; retrying in the background");
            self.release_later(req);
        }
    }

    fn releasing(
        &self,
    ) -> std::sync::MutexGuard<'_, std::collections::HashSet<distlock_core::Owner>> {
        self.inner
            .releasing
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl EtcdBackend {
    /// What this backend declares, without connecting (for `distlock backends`).
    pub fn declared_capabilities() -> Capabilities {
        Capabilities::new(
            "etcd",
            Fencing::Strong,
            Consistency::Cp,
            Waiting::Notification,
            TrustedClock::ConsensusLeader,
        )
        .with_ttl_range(Duration::from_secs(1), Duration::from_secs(24 * 3600))
        .with_session()
        .with_semaphore()
        .with_shared()
        .with_elections()
    }
}

#[async_trait]
impl Backend for EtcdBackend {
    fn capabilities(&self) -> Capabilities {
        // One txn reads up to 128 keys: etcd's default --max-txn-ops.
        Self::declared_capabilities().with_extend_batch(MAX_TXN_OPS)
    }

    async fn try_acquire(&self, req: &LockRequest) -> Result<Option<Grant>> {
        if let HoldKind::Permits { .. } = req.kind {
            return self.try_acquire_permit(req).await;
        }
        let Some(q) = self.enqueue(req, Claiming::Try).await? else {
            return Ok(None);
        };
        if !q.blocked {
            // The lock lives as long as the session's lease: count the
            // holder's deadline from that lease's last keep-alive.
            let token = FencingToken(q.token_rev as u64);
            return Ok(Some(Grant::new(token, q.session.lease_began())));
        }
        // Not first: leave no queue entry behind.
        self.delete_mine(&q.key, req).await?;
        self.forget(req);
        Ok(None)
    }

    /// One transaction puts every lock's key and reads every queue head;
    /// when one is not first, a second deletes all of them. Declined when
    /// the TTLs differ (one lease holds them all) or a key of this lease is
    /// left from before (the one-at-a-time path cleans it up), and for more
    /// names than one transaction takes.
    async fn try_acquire_all(&self, reqs: &[LockRequest]) -> Result<AllAtOnce> {
        let ttl = reqs[0].ttl;
        if 2 * reqs.len() > MAX_TXN_OPS
            || reqs
                .iter()
                .any(|r| r.kind != HoldKind::Exclusive || r.ttl != ttl)
        {
            return Ok(AllAtOnce::NotOffered);
        }
        let session = self.session(ttl).await?;
        match self.try_acquire_all_in(reqs, session.clone()).await {
            // As a lock's enqueue: once more under a new lease.
            Err(e) if names_a_lost_lease(&e) => {
                tracing::info!(error = %e, "etcd no longer knows this client's lease; asking again under a new one");
                session.check_lease().await;
                let session = self.session(ttl).await?;
                self.try_acquire_all_in(reqs, session).await
            }
            tried => tried,
        }
    }

    async fn acquire(&self, req: &LockRequest, deadline: Option<Instant>) -> Result<Grant> {
        if let HoldKind::Permits { .. } = req.kind {
            return self.acquire_permit(req, deadline).await;
        }
        let clock = WaitClock::start(&req.name, deadline);
        let Some(q) = self.enqueue(req, Claiming::Wait(&clock)).await? else {
            // A wait for the claim ends with its key or at the deadline.
            return Err(clock.timed_out());
        };
        // First at once: the enqueue txn itself created or found my key and
        // read the queue head, atomically; nothing more to check.
        let mut mine = true;
        let mut token_rev = q.token_rev;
        if q.blocked {
            let failing = Failing::default();
            let waited = async {
                tokio::select! {
                    r = self.wait_for_predecessors(&q, req, &failing) => r,
                    reason = q.session.lost() => Err(Error::LeaseLost { name: req.name.clone(), reason }),
                }
            };
            let outcome = clock.within(waited).await;
            match outcome {
                Ok(Some(rev)) => token_rev = rev,
                Ok(None) => mine = false,
                Err(e) => {
                    // A timed-out or failed wait deletes my key (a dropped
                    // one is released by core, which ends up in `release`),
                    // in the background if etcd does not answer at once: the
                    // wait ends at its deadline. One that ran out while etcd
                    // failed ends with that failure.
                    let e = match (e, failing.take()) {
                        (Error::WaitTimeout { .. }, Some(failed)) => failed,
                        (e, _) => e,
                    };
                    match tokio::time::timeout(WITHDRAW_AT_ONCE, self.delete_mine(&q.key, req))
                        .await
                    {
                        Ok(deleted) => self.withdraw(req, deleted),
                        Err(_) => self.release_later(req),
                    }
                    self.forget(req);
                    return Err(e);
                }
            }
        }
        // The Jepsen etcd 3.4.3 analysis: after waking, make sure my
        // key (and so my lease) still exists before claiming the lock. The
        // hold's deadline counts from the lease's last keep-alive, so it is
        // never later than the lease's own end.
        let began = q.session.lease_began();
        if q.session.is_lost() || !mine {
            let _ = self.delete_mine(&q.key, req).await;
            self.forget(req);
            return Err(Error::LeaseLost {
                name: req.name.clone(),
                reason: LostReason::SessionLost("my key or lease vanished while waiting".into()),
            });
        }
        Ok(Grant::new(FencingToken(token_rev as u64), began))
    }

    /// The hold lives as long as its session's lease, which the session
    /// keeps alive; extending refreshes that lease now and checks the key.
    /// The server's version and the cluster's size: one member has no fault
    /// tolerance, and an even number no more than one fewer.
    async fn deployment_findings(&self) -> Result<Vec<Finding>> {
        let mut client = self.client();
        let version = match client.status().await {
            Ok(s) => Finding::fine("version", s.version().to_string()),
            Err(e) => Finding::unknown("version", format!("Status refused: {e}")),
        };
        let members = match client.member_list().await {
            // Learners do not vote: the quorum is the voting members'.
            Ok(m) => {
                let voters = m.members().iter().filter(|m| !m.is_learner()).count();
                Finding::voters("members", voters, voters.to_string())
            }
            Err(e) => Finding::unknown("members", format!("MemberList refused: {e}")),
        };
        Ok(vec![version, members])
    }

    async fn extend(&self, req: &LockRequest) -> Result<bool> {
        Ok(self.extend_many(std::slice::from_ref(req)).await?[0])
    }

    /// One keep-alive per session (the lease is what keeps every key of the
    /// batch) and one txn reading the batch's keys, instead of both per lock.
    /// A lock's key must still carry its owner value, a permit's key (named
    /// by its owner) must still hold its permit; both on the session's lease.
    async fn extend_many(&self, reqs: &[LockRequest]) -> Result<Vec<bool>> {
        let sessions: Vec<Option<Arc<Session>>> = {
            let queued = self.queued();
            reqs.iter().map(|r| queued.get(&r.owner).cloned()).collect()
        };
        let mut alive: HashMap<i64, bool> = HashMap::new();
        for s in sessions.iter().flatten() {
            if alive.contains_key(&s.lease) {
                continue;
            }
            let lives = s.refresh().await.map_err(|e| {
                Error::unavailable(
                    "etcd",
                    format!("etcd at {}: {e}", self.inner.endpoints),
                    None,
                )
            })?;
            alive.insert(s.lease, lives);
        }
        let keys: Vec<Option<(String, Expect, i64)>> = reqs
            .iter()
            .zip(&sessions)
            .map(|(r, s)| {
                let s = s.as_ref().filter(|s| alive.get(&s.lease) == Some(&true))?;
                Some(match r.kind {
                    HoldKind::Permits { .. } => {
                        let (key, held) = self.permit_check(r)?;
                        (key, Expect::Value(held.into_bytes()), s.lease)
                    }
                    HoldKind::Shared => (
                        shared_key(&r.name, &r.owner),
                        Expect::Value(distlock_core::stored_owner(r).into_bytes()),
                        s.lease,
                    ),
                    HoldKind::Leader => (
                        format!("{}/{:x}", r.name, s.lease),
                        Expect::Created(self.campaign_rev(&r.owner)?),
                        s.lease,
                    ),
                    _ => (
                        format!("{}/{:x}", r.name, s.lease),
                        Expect::Value(distlock_core::stored_owner(r).into_bytes()),
                        s.lease,
                    ),
                })
            })
            .collect();
        let reads: Vec<TxnOp> = keys
            .iter()
            .flatten()
            .map(|(k, _, _)| TxnOp::get(k.as_str(), None))
            .collect();
        let mut values = if reads.is_empty() {
            Vec::new()
        } else {
            let resp = self
                .kv(|mut c| {
                    let txn = Txn::new().and_then(reads.clone());
                    async move { c.txn(txn).await }
                })
                .await?;
            resp.op_responses()
                .into_iter()
                .map(|op| match op {
                    TxnOpResponse::Get(g) => g
                        .kvs()
                        .first()
                        .map(|kv| (kv.value().to_vec(), kv.lease(), kv.create_revision())),
                    _ => None,
                })
                .collect::<Vec<_>>()
        }
        .into_iter();
        let kept: Vec<bool> = keys
            .into_iter()
            .map(|key| {
                key.is_some_and(|(_, expected, lease)| {
                    values.next().flatten().is_some_and(|(v, l, created)| {
                        l == lease
                            && match &expected {
                                Expect::Value(e) => v == *e,
                                Expect::Created(rev) => created == *rev,
                            }
                    })
                })
            })
            .collect();
        // A hold whose key is gone (evicted, say) is lost, and no release
        // follows: the name's next request through this backend must not
        // wait for it.
        for (r, kept) in reqs.iter().zip(&kept) {
            if !kept {
                self.inner.claims.unclaim(&r.owner);
            }
        }
        Ok(kept)
    }

    async fn release(&self, req: &LockRequest) -> Result<bool> {
        let released = self.delete_hold(req).await;
        if matches!(&released, Err(e) if e.is_retryable()) {
            self.release_later(req);
        }
        released
    }

    async fn proclaim(&self, req: &LockRequest, value: &str) -> Result<bool> {
        self.proclaim_value(req, value).await
    }

    async fn leader(
        &self,
        name: &distlock_core::LockName,
    ) -> Result<Option<distlock_core::Leader>> {
        self.current_leader(name).await
    }

    async fn observe_leader(
        &self,
        name: &distlock_core::LockName,
    ) -> Result<Option<distlock_core::LeaderStream>> {
        Ok(Some(self.leaders(name)))
    }

    /// One read of every key under `<name>/` in create order: the holders
    /// are the first key, or the shared keys before the first key that is
    /// not shared; a writer waits when such a key sits behind shared
    /// holders. A second request reads the first holder's lease.
    async fn inspect(&self, name: &distlock_core::LockName) -> Result<distlock_core::LockStatus> {
        let opts = GetOptions::new()
            .with_prefix()
            .with_sort(SortTarget::Create, SortOrder::Ascend);
        let prefix = format!("{name}/");
        let resp = self
            .kv(|mut c| {
                let (opts, prefix) = (opts.clone(), prefix.clone());
                async move { c.get(prefix, Some(opts)).await }
            })
            .await?;
        let kvs: Vec<&etcd_client::KeyValue> = resp
            .kvs()
            .iter()
            .filter(|kv| own_key(kv.key(), &prefix))
            .collect();
        let Some(first) = kvs.first() else {
            return Ok(distlock_core::LockStatus::new(false).with_shared(0, false));
        };
        let readers = kvs
            .iter()
            .take_while(|kv| is_shared(kv.key(), &prefix))
            .count();
        let holders = readers.max(1);
        // The key that stopped the count is not shared.
        let writer_waiting = readers > 0 && readers < kvs.len();
        // While anyone holds it, the newest grant is theirs.
        let token = kvs[..holders].iter().map(|kv| kv.mod_revision()).max();
        let lease = first.lease();
        let ttl = self
            .call(|mut c| async move { c.lease_time_to_live(lease, None).await })
            .await?
            .ttl();
        // An exclusive holder's value is its owner and holder info
        // (`etcdctl lock` stores an empty one, which carries none).
        let holder_info = (readers == 0)
            .then(|| lock_holder_info(first.value()))
            .flatten();
        Ok(distlock_core::LockStatus::new(true)
            .with_token(token.map(|t| FencingToken(t as u64)))
            .with_remaining((ttl >= 0).then(|| Duration::from_secs(ttl as u64)))
            .with_queue_len(Some(kvs.len() - holders))
            .with_shared(readers, writer_waiting)
            .with_holder_info(holder_info))
    }

    /// Reads, at one revision and in pages of 1000 keys, every key of the
    /// lock names starting with `prefix` (all keys not under `/` for
    /// `""`), every key under `/distlock/semaphores/<prefix>` and under
    /// `/distlock/leaders/<prefix>`: O(keys under the prefix), however
    /// small `limit` is, since whether a key holds depends on every key of
    /// its name. Then one `LeaseTimeToLive` per distinct lease among the
    /// records returned (at most `limit`, 8 at a time) for `remaining`.
    /// Keys that are not distlock's, Go's `Mutex`'s or `Election`'s are
    /// skipped.
    async fn list(&self, prefix: &str, limit: usize) -> Result<Vec<distlock_core::HoldRecord>> {
        self.list_holds(prefix, limit).await
    }

    async fn inspect_permits(
        &self,
        name: &distlock_core::LockName,
    ) -> Result<distlock_core::LockStatus> {
        self.inspect_semaphore(name).await
    }

    async fn set_limit(&self, name: &distlock_core::LockName, limit: u32) -> Result<Option<u32>> {
        self.store_limit(name, limit).await
    }

    async fn session_lost(&self, req: &LockRequest) -> LostReason {
        let session = self.queued().get(&req.owner).cloned();
        match session {
            Some(s) => s.lost().await,
            None => std::future::pending().await,
        }
    }

    /// The lease id: core then watches each lease once, not once per lock.
    fn session_key(&self, req: &LockRequest) -> Option<u64> {
        self.queued().get(&req.owner).map(|s| s.lease as u64)
    }

    async fn session_ended(&self, key: u64) -> LostReason {
        let known = self
            .queued()
            .values()
            .find(|s| s.lease as u64 == key)
            .cloned();
        let known = match known {
            Some(s) => Some(s),
            None => self
                .sessions()
                .values()
                .find(|s| s.lease as u64 == key)
                .cloned(),
        };
        match known {
            Some(s) => s.lost().await,
            None => LostReason::SessionLost(format!(
                "etcd lease {key:x} is no longer kept alive by this client"
            )),
        }
    }
}

/// Whether `e` (from a connect) came from a request that timed out.
fn timed_out(e: &Error) -> bool {
    let text = format!("{e} {e:?}").to_ascii_lowercase();
    text.contains("timeout expired") || text.contains("timed out") || text.contains("deadline")
}

/// After a connect failed for want of an answer: why `endpoint`
/// (`http://host:port` or `https://host:port`) cannot be reached with the
/// URL's scheme, when it speaks plain HTTP to an `etcds://` URL or TLS to
/// an `etcd://` one, or another server's protocol than HTTP (a URL with
/// another backend's port).
async fn wrong_scheme(endpoint: &str, https: bool, timeout: Duration) -> Option<String> {
    let addr = endpoint
        .split_once("://")
        .map_or(endpoint, |(_, addr)| addr);
    let timeout = timeout.min(Duration::from_secs(1));
    if https {
        let request = b"GET /version HTTP/1.1\r\nHost: etcd\r\nConnection: close\r\n\r\n";
        if let Some(answer) = distlock_core::probe::answer(addr, request, 4096, timeout).await {
            if String::from_utf8_lossy(&answer).contains("etcdserver") {
                return Some("the member answers without TLS: use etcd://".into());
            }
        }
    } else if distlock_core::probe::speaks_tls(addr, timeout).await {
        return Some(
            "the member speaks TLS only: use etcds:// (with ca_file= for a private CA)".into(),
        );
    }
    distlock_core::probe::foreign_protocol(addr, distlock_core::probe::Protocol::Http, timeout)
        .await
}

/// What an `etcd://` or `etcds://` URL says. Its `Debug` shows no password.
struct EtcdUrl {
    endpoints: Vec<String>,
    user: Option<(String, String)>,
    timeout: Duration,
    ca_file: Option<String>,
    https: bool,
    /// The hosts as given, for errors.
    hosts: String,
}

impl std::fmt::Debug for EtcdUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdUrl")
            .field("endpoints", &self.endpoints)
            .field("user", &self.user.as_ref().map(|(user, _)| (user, "***")))
            .field("timeout", &self.timeout)
            .field("ca_file", &self.ca_file)
            .field("https", &self.https)
            .field("hosts", &self.hosts)
            .finish()
    }
}

/// Parses an `etcd://` or `etcds://` URL (see [`EtcdBackend::connect`]).
fn parse_url(url: &str) -> Result<EtcdUrl> {
    // The password is taken as written: only a `?` in it is misread.
    distlock_core::input::check_userinfo_encoded(url, &['?'])?;
    let bad = |why: String| Error::invalid(InputKind::Url, format!("etcd:// URL: {why}"));
    let (scheme, rest) = url
        .split_once("://")
        .ok_or_else(|| bad("expected etcd://host:port[,host:port...]".into()))?;
    let https = match scheme {
        "etcd" => false,
        "etcds" if cfg!(feature = "tls") => true,
        "etcds" => {
            return Err(Error::Unsupported {
                backend: "etcd",
                operation: "TLS (etcds://) without the `tls` cargo feature",
            })
        }
        other => return Err(bad(format!("unknown scheme {other:?}"))),
    };
    let (rest, query) = rest.split_once('?').unwrap_or((rest, ""));
    let rest = rest.trim_end_matches('/');
    let (user, hosts) = match rest.rsplit_once('@') {
        Some((u, h)) => (Some(u), h),
        None => (None, rest),
    };
    let mut timeout = Duration::from_secs(5);
    let mut ca_file: Option<&str> = None;
    for (k, v) in distlock_core::input::query_pairs(&format!("{scheme}://"), query)? {
        match k {
            "ca_file" if https => ca_file = Some(v),
            "ca_file" => return Err(bad("ca_file applies to etcds:// (TLS) only".into())),
            "timeout_ms" => {
                timeout = Duration::from_millis(
                    v.parse()
                        .map_err(|_| bad(format!("timeout_ms={v:?} is not a number")))?,
                )
            }
            _ => return Err(bad(format!("unknown parameter {k:?}"))),
        }
    }
    // A timeout of zero fails every request as if etcd were unreachable.
    distlock_core::input::check_millis(
        "timeout_ms",
        timeout,
        Duration::from_millis(1),
        distlock_core::input::MAX_TIMEOUT,
    )?;
    if hosts.split(',').all(str::is_empty) {
        return Err(bad("no endpoints".into()));
    }
    let listed: String = hosts
        .split(',')
        .filter(|h| !h.is_empty())
        .collect::<Vec<_>>()
        .join(",");
    let endpoints: Vec<String> = distlock_core::input::host_ports("endpoint", &listed, bad)?
        .into_iter()
        .map(|h| format!("{}://{h}", if https { "https" } else { "http" }))
        .collect();
    let user = match user {
        Some(u) => {
            let (name, pass) = u
                .split_once(':')
                .ok_or_else(|| bad("credentials must be user:password".into()))?;
            Some((name.to_string(), pass.to_string()))
        }
        None => None,
    };
    Ok(EtcdUrl {
        endpoints,
        user,
        timeout,
        ca_file: ca_file.map(str::to_string),
        https,
        hosts: hosts.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(url: &str) -> String {
        match parse_url(url) {
            Err(e @ Error::InvalidInput { .. }) => e.to_string(),
            other => panic!("{url}: expected InvalidInput, got {other:?}"),
        }
    }

    #[cfg(feature = "tls")]
    #[test]
    fn a_ca_file_without_a_certificate_is_refused() {
        let path = std::env::temp_dir().join(format!("distlock-not-a-ca-{}", std::process::id()));
        std::fs::write(&path, "root:x:0:0:root:/root:/bin/bash\n").unwrap();
        let r = tls_options(path.to_str());
        let _ = std::fs::remove_file(&path);
        match r {
            Err(e @ Error::InvalidInput { .. }) => {
                assert!(e.to_string().contains("no PEM certificate"), "{e}")
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_timeout_of_zero_or_above_an_hour_is_refused() {
        for t in ["0", "3600001", "18446744073709551615"] {
            let text = refused(&format!("etcd://h:1?timeout_ms={t}"));
            assert!(text.contains(&format!("timeout_ms={t}")), "{text}");
            assert!(text.contains("3600000"), "{text}");
        }
        let u = parse_url("etcd://h:1?timeout_ms=3600000").unwrap();
        assert_eq!(u.timeout, Duration::from_secs(3600));
    }

    #[test]
    fn an_endpoint_listed_twice_is_refused() {
        for url in ["etcd://h:1,h:1", "etcd://u:p@a:2,H:1,h:1"] {
            let text = refused(url);
            assert!(text.contains("h:1") && text.contains("twice"), "{text}");
        }
        let u = parse_url("etcd://h:1,h:2,g:1").unwrap();
        assert_eq!(u.endpoints, ["http://h:1", "http://h:2", "http://g:1"]);
        let u = parse_url("etcd://u:hunter2@h:1").unwrap();
        let shown = format!("{u:?}");
        assert!(
            shown.contains(r#"("u", "***")"#) && !shown.contains("hunter2"),
            "{shown}"
        );
    }

    #[test]
    fn a_repeated_or_unknown_parameter_is_refused() {
        let text = refused("etcd://h:1?timeout_ms=100&timeout_ms=9000");
        assert!(text.contains("timeout_ms is given twice"), "{text}");
        refused("etcd://h:1?bogus=1");
        refused("etcd://h:1?ca_file=/x.pem");
    }

    #[test]
    fn a_request_that_ran_out_of_time_during_an_election_is_retryable() {
        for status in [
            tonic::Status::cancelled("Timeout expired"),
            tonic::Status::unavailable("no leader"),
            tonic::Status::deadline_exceeded("deadline"),
        ] {
            let e = err("a:1", etcd_client::Error::GRpcStatus(status));
            assert!(e.is_retryable(), "{e:?}");
        }
        let refused = err(
            "a:1",
            etcd_client::Error::GRpcStatus(tonic::Status::permission_denied("no role")),
        );
        assert!(
            matches!(refused, Error::Misconfigured { .. }),
            "{refused:?}"
        );
    }

    #[test]
    fn a_request_refused_for_load_or_an_expired_token_is_retryable() {
        use tonic::{Code, Status};
        let mapped = |code, message: &str| {
            err(
                "a:1",
                etcd_client::Error::GRpcStatus(Status::new(code, message)),
            )
        };
        for (code, message) in [
            (Code::ResourceExhausted, "etcdserver: too many requests"),
            (Code::Unauthenticated, "etcdserver: invalid auth token"),
        ] {
            let e = mapped(code, message);
            assert!(matches!(e, Error::Unavailable { .. }), "{e:?}");
        }
        // The same code for a message too large or a full database is not.
        for message in [
            "grpc: received message larger than max (5000000 vs. 4194304)",
            "etcdserver: mvcc: database space exceeded",
        ] {
            let e = mapped(Code::ResourceExhausted, message);
            assert!(!e.is_retryable(), "{e:?}");
        }
        for (code, message) in [
            (Code::InvalidArgument, "etcdserver: user name is empty"),
            (
                Code::InvalidArgument,
                "etcdserver: authentication failed, invalid user ID or password",
            ),
        ] {
            let e = mapped(code, message);
            assert!(matches!(e, Error::Misconfigured { .. }), "{e:?}");
        }
    }

    #[test]
    fn a_leaders_holder_info_key_is_under_no_names_range() {
        let key = leader_info_key("jobs/a/694d7c1a2b3c4d5e");
        // Every range a lock, election or shared hold reads starts with a
        // name, and names never start with `/`.
        assert!(key.starts_with('/'));
        assert!(!key.starts_with(semaphore::ROOT));
        assert!(distlock_core::LockName::new(key.trim_end_matches(|c| c != '/')).is_err());
    }

    #[test]
    fn lock_values_carry_the_holder_info_after_the_owner() {
        let name = distlock_core::LockName::new("a").unwrap_or_else(|e| panic!("{e}"));
        let req = LockRequest::new(name, Duration::from_secs(1))
            .with_holder_info(Some("web-1 pid 7".into()));
        let value = distlock_core::stored_owner(&req);
        assert_eq!(
            lock_holder_info(value.as_bytes()).as_deref(),
            Some("web-1 pid 7")
        );
        // `etcdctl lock` stores an empty value.
        assert_eq!(lock_holder_info(b""), None);
    }

    #[test]
    fn tls_refusals_say_which_side_was_refused() {
        let refused = |text: &str| {
            let io = std::io::Error::new(std::io::ErrorKind::InvalidData, text.to_string());
            match err("127.0.0.1:2379", etcd_client::Error::IoError(io)) {
                Error::Misconfigured { message, .. } => message,
                other => panic!("{other:?}"),
            }
        };
        let ours = refused("received fatal alert: BadCertificate");
        assert!(
            ours.contains("--client-cert-auth") && !ours.contains("ca_file"),
            "{ours}"
        );
        let theirs = refused("invalid peer certificate: UnknownIssuer");
        assert!(theirs.contains("ca_file"), "{theirs}");
    }

    #[test]
    fn ttls_round_up_to_whole_seconds() {
        assert_eq!(ttl_secs(Duration::from_millis(1)), 1);
        assert_eq!(ttl_secs(Duration::from_millis(1500)), 2);
        assert_eq!(ttl_secs(Duration::from_secs(30)), 30);
    }
}
