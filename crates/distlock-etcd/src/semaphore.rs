//! Counting semaphores ([`HoldKind::Permits`]) on etcd.
//!
//! Layout, under a root that no lock's keys can fall under (a lock's keys
//! are `<name>/<lease hex>` and a name never starts with `/`; `@` never
//! appears in a name, so one semaphore's keys never fall under another's):
//!
//! - `/distlock/semaphores/<name>/@limit`: the limit, in decimal, without
//!   a lease. Written by the first acquire, in the transaction that puts its
//!   key, and by `set_limit`.
//! - `/distlock/semaphores/<name>/@permits/<owner>`: one key per contender,
//!   on its session's lease (so a permit ends with the lease), valued with
//!   its state, `held` or `waiting`, then a space and its holder info when
//!   the request carries one (see [`permit_value`]).
//!
//! Grants. A contender may hold a permit once fewer than `limit` of the
//! keys were created before its own (create revision order: FIFO). Its
//! acquire is one transaction: compare the limit, count the keys, put its
//! own key. Fewer than `limit` counted: granted, the token being the key's
//! create revision. Otherwise it waits, and when it learns that fewer than
//! `limit` older keys are left it claims the permit with a transaction that
//! rewrites its key to `held`, guarded by the key's create revision and the
//! limit; the token is that transaction's revision.
//!
//! Why at most `limit` hold: let `g` be the newest key among those holding
//! at some instant. When `g` was granted, fewer than `limit` older keys
//! existed; every other holder is older than `g` and alive now, so it
//! existed then. Why tokens rise in grant order: every grant is a write
//! (the acquire's put, or the claim's put), and its token is that write's
//! revision, which is above every earlier write's.
//!
//! Waiting without a herd. A waiter only needs to act when it may become
//! grantable (the count of older keys drops below the limit) or when its
//! limit changes. The first waiter (its predecessor holds) watches the whole
//! range: each deletion of an older key lowers its count, known exactly from
//! its last read, so it claims without reading again. Every other waiter
//! watches only its predecessor's key, for any event: the predecessor
//! leaving (a deletion) or claiming its permit (the claim's put). That is
//! enough: a waiter can only become grantable after its predecessor did (its
//! predecessor has one older key fewer), and a waiting predecessor that
//! becomes grantable claims, which wakes it; so each release wakes the first
//! waiter, and its claim wakes the next one, which becomes the first. To
//! tell a waiting predecessor from a holding one, a waiter marks its key
//! `waiting` in its first read; a predecessor still `held` at that read may
//! be a waiter that has not marked itself yet, so a range watcher also
//! re-reads when its predecessor marks itself, and from then on watches only
//! that predecessor.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use distlock_core::wait::WaitClock;
use distlock_core::{
    Error, FencingToken, Grant, HoldKind, HoldRecord, InputKind, LockName, LockRequest, LockStatus,
    LostReason, Owner, Result,
};
use etcd_client::{
    Compare, CompareOp, DeleteOptions, EventType, GetOptions, GetResponse, PutOptions, SortOrder,
    SortTarget, Txn, TxnOp, TxnOpResponse, WatchOptions,
};
use tokio::time::Instant;

use crate::session::Session;
use crate::{names_a_lost_lease, EtcdBackend};

/// The root of every semaphore's keys.
pub(crate) const ROOT: &str = "/distlock/semaphores/";
/// A key that holds a permit (or, for one round trip after its creation,
/// a contender that has not yet learned it waits).
const HELD: &str = "held";
/// A key that waits for a permit.
const WAITING: &str = "waiting";

/// A permit key's value: `state`, then a space and `req`'s holder info if
/// it has one. Holder info has no control characters and the states no
/// space, so [`permit_state`] and [`permit_holder_info`] read it back.
fn permit_value(state: &str, req: &LockRequest) -> String {
    match &req.holder_info {
        Some(info) => format!("{state} {info}"),
        None => state.to_string(),
    }
}

/// The state (`held` or `waiting`) in a permit key's value.
fn permit_state(value: &[u8]) -> &[u8] {
    value.split(|b| *b == b' ').next().unwrap_or_default()
}

/// The holder info in a permit key's value, if it carries one.
fn permit_holder_info(value: &[u8]) -> Option<String> {
    let value = std::str::from_utf8(value).ok()?;
    value
        .split_once(' ')
        .map(|(_, info)| info.to_string())
        .filter(|info| !info.is_empty())
}

/// The permits held under [`ROOT`] among `kvs` (keys of that root sorted
/// by key, read at one revision), each with its key's lease: a key in state
/// `held` among the first `limit` of its semaphore by create revision (the
/// grant rule), its token the revision of the write that granted it (its
/// last write: keys are not rewritten once held).
pub(crate) fn held_permits(kvs: &[etcd_client::KeyValue], prefix: &str) -> Vec<(HoldRecord, i64)> {
    // name -> (stored limit and its last write's revision, permit keys)
    type Sem<'a> = (Option<(u32, i64)>, Vec<&'a etcd_client::KeyValue>);
    let mut sems: BTreeMap<&str, Sem<'_>> = BTreeMap::new();
    for kv in kvs {
        let Some(rest) = kv
            .key()
            .strip_prefix(ROOT.as_bytes())
            .and_then(|k| std::str::from_utf8(k).ok())
        else {
            continue;
        };
        if let Some(name) = rest.strip_suffix("/@limit") {
            let limit = std::str::from_utf8(kv.value())
                .ok()
                .and_then(|v| v.parse().ok());
            sems.entry(name).or_default().0 = limit.map(|l| (l, kv.mod_revision()));
        } else if let Some((name, _owner)) = rest.split_once("/@permits/") {
            sems.entry(name).or_default().1.push(kv);
        }
    }
    let mut held = Vec::new();
    for (name, (limit, mut permits)) in sems {
        if !name.starts_with(prefix) || LockName::new(name).is_err() {
            continue;
        }
        permits.sort_by_key(|kv| kv.create_revision());
        let granted = granted(&permits, limit);
        held.extend(granted.into_iter().map(|kv| {
            let kind = HoldKind::Permits {
                limit: limit.map_or(0, |(l, _)| l),
            };
            let record = HoldRecord::new(name, kind)
                .with_token(Some(FencingToken(kv.mod_revision() as u64)))
                .with_holder_info(permit_holder_info(kv.value()));
            (record, kv.lease())
        }));
    }
    held
}

/// The keys among one semaphore's `permits` (sorted by create revision)
/// that hold a permit, under `limit` and the revision of its last write.
/// A key in state `held` holds when it was claimed after waiting (written
/// again since its creation), is among the first `limit`, or was created
/// before the limit was last written (granted under an earlier limit,
/// which a lower one does not take back). A key just created beyond the
/// limit also says `held` until its contender learns it waits: it does not
/// count. Without a stored limit (deleted; the next waiter restores it),
/// every key in state `held` holds.
fn granted<'a>(
    permits: &[&'a etcd_client::KeyValue],
    limit: Option<(u32, i64)>,
) -> Vec<&'a etcd_client::KeyValue> {
    permits
        .iter()
        .enumerate()
        .filter(|(at, kv)| {
            permit_state(kv.value()) == HELD.as_bytes()
                && limit.is_none_or(|(limit, written)| {
                    *at < limit as usize
                        || kv.mod_revision() > kv.create_revision()
                        || kv.create_revision() < written
                })
        })
        .map(|(_, kv)| *kv)
        .collect()
}

/// The keys of one semaphore.
struct SemKeys {
    limit: String,
    /// The prefix of the permit keys.
    permits: String,
    /// The end of the range watched by the first waiter: `[limit, end)`
    /// holds the limit and every permit key, and nothing else.
    range_end: String,
}

impl SemKeys {
    fn new(name: &LockName) -> Self {
        Self {
            limit: format!("{ROOT}{name}/@limit"),
            permits: format!("{ROOT}{name}/@permits/"),
            range_end: format!("{ROOT}{name}/@permits0"),
        }
    }
}

/// `owner`'s permit key of semaphore `name`.
fn permit_key(name: &LockName, owner: &Owner) -> String {
    format!("{ROOT}{name}/@permits/{owner}")
}

/// The limit a permit request asks for; zero is refused.
pub(crate) fn requested_limit(req: &LockRequest) -> Result<u32> {
    match req.kind {
        HoldKind::Permits { limit } if limit >= 1 => Ok(limit),
        HoldKind::Permits { .. } => Err(zero_limit()),
        _ => Err(Error::invalid(
            InputKind::Config,
            "a lock request was routed to the semaphore code",
        )),
    }
}

fn zero_limit() -> Error {
    Error::invalid(
        InputKind::Config,
        "a semaphore needs a limit of at least one permit",
    )
}

/// A limit as stored, or `None` for a missing key.
fn stored_limit(get: &GetResponse) -> Result<Option<u32>> {
    let Some(kv) = get.kvs().first() else {
        return Ok(None);
    };
    distlock_core::input::stored_limit(kv.value())
        .map(Some)
        .ok_or_else(|| {
            Error::misconfigured(
                "etcd",
                format!(
                    "the semaphore limit at {:?} is {:?}, which distlock does not write (it writes 1 to 4294967295): another application writes under distlock's keys, or the key was edited; delete it while no permit is held",
                    String::from_utf8_lossy(kv.key()),
                    String::from_utf8_lossy(kv.value())
                ),
                None,
            )
        })
}

fn mismatch(req: &LockRequest, requested: u32, stored: u32) -> Error {
    Error::LimitMismatch {
        name: req.name.clone(),
        requested,
        stored,
    }
}

fn unexpected(what: &str) -> Error {
    Error::unavailable(
        "etcd",
        format!("etcd answered a semaphore {what} with something else"),
        None,
    )
}

/// One contender for a permit: its key and the session it lives in.
struct Contender<'a> {
    req: &'a LockRequest,
    session: Arc<Session>,
    keys: SemKeys,
    mine: String,
    limit: u32,
    /// My key's create revision, once known.
    my_rev: i64,
}

/// What the acquire transaction found.
enum Joined {
    Granted(FencingToken),
    /// My key is new and fewer than the limit are ahead of it.
    Behind,
    /// My key existed already (a retried transaction whose first reply was
    /// lost): where it stands is read separately.
    Found,
}

/// Where my key stands, read in one transaction.
enum Standing {
    /// My key (and with it my lease) is gone.
    Gone,
    Mismatch(u32),
    LimitMissing,
    Grantable,
    Behind {
        /// How many keys are older than mine, when at most the limit.
        ahead: Option<usize>,
        /// The key created just before mine: its name and value.
        pred: Option<(Vec<u8>, Vec<u8>)>,
        revision: i64,
    },
}

/// Why a range watcher stopped watching.
enum Wake {
    Grantable,
    Recheck,
}

impl Contender<'_> {
    /// Puts my key in `state` (with my holder info).
    fn put_mine(&self, state: &str) -> TxnOp {
        TxnOp::put(
            self.mine.as_str(),
            permit_value(state, self.req),
            Some(PutOptions::new().with_lease(self.session.lease)),
        )
    }

    fn mine_unchanged(&self) -> Compare {
        Compare::create_revision(self.mine.as_str(), CompareOp::Equal, self.my_rev)
    }

    /// Counts the keys, reads mine and puts it, if the limit is the one
    /// asked for; stores the limit first if there is none.
    fn join_txn(&self) -> Txn {
        let limit = self.limit.to_string();
        let join = || {
            vec![
                TxnOp::get(
                    self.keys.permits.as_str(),
                    Some(GetOptions::new().with_prefix().with_count_only()),
                ),
                TxnOp::get(self.mine.as_str(), None),
                self.put_mine(HELD),
            ]
        };
        let mut first = vec![TxnOp::put(self.keys.limit.as_str(), limit.as_str(), None)];
        first.extend(join());
        Txn::new()
            .when([Compare::value(
                self.keys.limit.as_str(),
                CompareOp::Equal,
                limit.as_str(),
            )])
            .and_then(join())
            .or_else([TxnOp::txn(
                Txn::new()
                    .when([Compare::create_revision(
                        self.keys.limit.as_str(),
                        CompareOp::Equal,
                        0,
                    )])
                    .and_then(first)
                    .or_else([TxnOp::get(self.keys.limit.as_str(), None)]),
            )])
    }

    fn lost(&self) -> Error {
        Error::LeaseLost {
            name: self.req.name.clone(),
            reason: LostReason::SessionLost(
                "my permit key or its lease vanished while waiting".into(),
            ),
        }
    }
}

impl EtcdBackend {
    async fn contender<'a>(&self, req: &'a LockRequest) -> Result<Contender<'a>> {
        let limit = requested_limit(req)?;
        let session = self.session(req.ttl).await?;
        self.queued().insert(req.owner, session.clone());
        Ok(Contender {
            req,
            session,
            keys: SemKeys::new(&req.name),
            mine: permit_key(&req.name, &req.owner),
            limit,
            my_rev: 0,
        })
    }

    /// The acquire: one transaction, which creates my key, sent to
    /// completion even if the caller stops waiting (a delete of the key
    /// waits for it: [`Self::delete_permit`]). Sets `c.my_rev`.
    async fn join(&self, c: &mut Contender<'_>) -> Result<Joined> {
        let resp = match self.creating_txn([c.req.name.as_str()], c.join_txn()).await {
            // The session's lease is gone (a member restarted without its
            // data): the session ends, and the request goes once more in a
            // new one, as a lock's enqueue does.
            Err(e) if names_a_lost_lease(&e) => {
                tracing::info!(semaphore = %c.req.name, error = %e, "etcd no longer knows this client's lease; asking again under a new one");
                c.session.check_lease().await;
                c.session = self.session(c.req.ttl).await?;
                self.queued().insert(c.req.owner, c.session.clone());
                self.creating_txn([c.req.name.as_str()], c.join_txn())
                    .await?
            }
            resp => resp?,
        };
        let revision = resp.header().map_or(0, |h| h.revision());
        let ops = resp.op_responses();
        let ops = if resp.succeeded() {
            ops
        } else {
            let Some(TxnOpResponse::Txn(first_use)) = ops.into_iter().next() else {
                return Err(unexpected("acquire"));
            };
            let ops = first_use.op_responses();
            if !first_use.succeeded() {
                let Some(TxnOpResponse::Get(limit)) = ops.first() else {
                    return Err(unexpected("acquire"));
                };
                // The limit is stored and is not the one asked for (the
                // compare failed, the key exists).
                return match stored_limit(limit)? {
                    Some(stored) => Err(mismatch(c.req, c.limit, stored)),
                    None => Err(unexpected("acquire")),
                };
            }
            ops.into_iter().skip(1).collect()
        };
        let (Some(TxnOpResponse::Get(count)), Some(TxnOpResponse::Get(me))) =
            (ops.first(), ops.get(1))
        else {
            return Err(unexpected("acquire"));
        };
        if let Some(kv) = me.kvs().first() {
            c.my_rev = kv.create_revision();
            return Ok(Joined::Found);
        }
        c.my_rev = revision;
        // Every key counted is older than mine, which this transaction made.
        if count.count() < i64::from(c.limit) {
            Ok(Joined::Granted(FencingToken(revision as u64)))
        } else {
            Ok(Joined::Behind)
        }
    }

    /// Where my key stands; with `mark`, also rewrites it `waiting`.
    async fn standing(&self, c: &Contender<'_>, mark: bool) -> Result<Standing> {
        let older = || {
            GetOptions::new()
                .with_prefix()
                .with_max_create_revision((c.my_rev - 1).max(1))
        };
        let mut reads = Vec::with_capacity(4);
        if mark {
            reads.push(c.put_mine(WAITING));
        }
        reads.extend([
            // Only the first limit + 1: enough to tell "fewer than the
            // limit", and to know the count exactly when it is the limit.
            TxnOp::get(
                c.keys.permits.as_str(),
                Some(
                    older()
                        .with_keys_only()
                        .with_sort(SortTarget::Create, SortOrder::Ascend)
                        .with_limit(i64::from(c.limit) + 1),
                ),
            ),
            TxnOp::get(
                c.keys.permits.as_str(),
                Some(
                    older()
                        .with_sort(SortTarget::Create, SortOrder::Descend)
                        .with_limit(1),
                ),
            ),
            TxnOp::get(c.keys.limit.as_str(), None),
        ]);
        let txn = Txn::new().when([c.mine_unchanged()]).and_then(reads);
        let resp = self.txn(txn).await?;
        if !resp.succeeded() {
            return Ok(Standing::Gone);
        }
        let revision = resp.header().map_or(0, |h| h.revision());
        let ops = resp.op_responses();
        let (
            Some(TxnOpResponse::Get(ahead)),
            Some(TxnOpResponse::Get(pred)),
            Some(TxnOpResponse::Get(limit)),
        ) = (
            ops.get(usize::from(mark)),
            ops.get(usize::from(mark) + 1),
            ops.get(usize::from(mark) + 2),
        )
        else {
            return Err(unexpected("read"));
        };
        match stored_limit(limit)? {
            None => return Ok(Standing::LimitMissing),
            Some(stored) if stored != c.limit => return Ok(Standing::Mismatch(stored)),
            Some(_) => {}
        }
        let n = ahead.kvs().len();
        if n < c.limit as usize {
            return Ok(Standing::Grantable);
        }
        Ok(Standing::Behind {
            ahead: (n <= c.limit as usize).then_some(n),
            pred: pred
                .kvs()
                .first()
                .map(|kv| (kv.key().to_vec(), kv.value().to_vec())),
            revision,
        })
    }

    /// Claims the permit my key may now hold: a write, so that my successor
    /// (watching my key) wakes, and whose revision is the token.
    async fn claim(&self, c: &Contender<'_>) -> Result<Option<FencingToken>> {
        let limit = c.limit.to_string();
        let txn = Txn::new()
            .when([
                c.mine_unchanged(),
                Compare::value(c.keys.limit.as_str(), CompareOp::Equal, limit.as_str()),
            ])
            .and_then([c.put_mine(HELD)]);
        let resp = self.txn(txn).await?;
        Ok(resp
            .succeeded()
            .then(|| FencingToken(resp.header().map_or(0, |h| h.revision()) as u64)))
    }

    /// Puts the limit back after someone deleted its key.
    async fn restore_limit(&self, c: &Contender<'_>) -> Result<()> {
        let txn = Txn::new()
            .when([Compare::create_revision(
                c.keys.limit.as_str(),
                CompareOp::Equal,
                0,
            )])
            .and_then([TxnOp::put(c.keys.limit.as_str(), c.limit.to_string(), None)]);
        self.txn(txn).await.map(|_| ())
    }

    /// Deletes `req`'s permit key; whether it held a permit. Waits first
    /// for a join of the semaphore still in flight, so that a key it creates
    /// cannot land after the delete and stay on the live lease.
    async fn delete_permit(&self, req: &LockRequest) -> Result<bool> {
        self.creates_settled(&req.name).await;
        let key = permit_key(&req.name, &req.owner);
        let resp = self
            .kv(|mut c| {
                let key = key.clone();
                async move {
                    c.delete(key, Some(DeleteOptions::new().with_prev_key()))
                        .await
                }
            })
            .await?;
        Ok(resp
            .prev_kvs()
            .first()
            .is_some_and(|kv| permit_state(kv.value()) == HELD.as_bytes()))
    }

    /// Waits for my predecessor's key to change (claimed or gone).
    async fn watch_predecessor(&self, pred: Vec<u8>, from: i64) -> Result<()> {
        let mut stream = self
            .client()
            .watch(pred, Some(WatchOptions::new().with_start_revision(from)))
            .await
            .map_err(|e| self.err(e))?;
        while let Some(msg) = stream.message().await.map_err(|e| self.err(e))? {
            if msg.canceled() || !msg.events().is_empty() {
                break;
            }
        }
        self.inner.wakeups.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// The first waiter's watch: every change to the limit or the permit
    /// keys from `from` on, counting down the older keys that go.
    async fn watch_holders(
        &self,
        c: &Contender<'_>,
        mut ahead: Option<usize>,
        pred: Option<&[u8]>,
        from: i64,
    ) -> Result<Wake> {
        let opts = WatchOptions::new()
            .with_range(c.keys.range_end.as_str())
            .with_start_revision(from)
            .with_prev_key();
        let mut stream = self
            .client()
            .watch(c.keys.limit.as_str(), Some(opts))
            .await
            .map_err(|e| self.err(e))?;
        let limit = c.limit.to_string();
        while let Some(msg) = stream.message().await.map_err(|e| self.err(e))? {
            if msg.canceled() {
                break;
            }
            for event in msg.events() {
                let Some(kv) = event.kv() else { continue };
                let key = kv.key();
                let recheck = match event.event_type() {
                    EventType::Delete if key == c.keys.limit.as_bytes() => true,
                    // Mine: the next read reports it gone.
                    EventType::Delete if key == c.mine.as_bytes() => true,
                    EventType::Delete => match event.prev_kv() {
                        Some(prev) if prev.create_revision() >= c.my_rev => false,
                        Some(_) => match ahead.as_mut() {
                            Some(n) => {
                                *n = n.saturating_sub(1);
                                false
                            }
                            None => true,
                        },
                        // The previous value was compacted away: whether
                        // the key was older than mine is unknown.
                        None => true,
                    },
                    EventType::Put if key == c.keys.limit.as_bytes() => {
                        kv.value() != limit.as_bytes()
                    }
                    // My predecessor turned out to wait: watch only it.
                    EventType::Put => {
                        pred == Some(key) && permit_state(kv.value()) == WAITING.as_bytes()
                    }
                };
                if recheck {
                    self.inner.wakeups.fetch_add(1, Ordering::Relaxed);
                    return Ok(Wake::Recheck);
                }
            }
            if ahead.is_some_and(|n| n < c.limit as usize) {
                self.inner.wakeups.fetch_add(1, Ordering::Relaxed);
                return Ok(Wake::Grantable);
            }
        }
        Ok(Wake::Recheck)
    }

    /// One read and at most one watch; `Some` once the permit is mine.
    async fn wait_step(&self, c: &Contender<'_>, mark: &mut bool) -> Result<Option<FencingToken>> {
        let standing = self.standing(c, *mark).await?;
        *mark = false;
        match standing {
            Standing::Gone => Err(c.lost()),
            Standing::Mismatch(stored) => Err(mismatch(c.req, c.limit, stored)),
            Standing::LimitMissing => self.restore_limit(c).await.map(|()| None),
            Standing::Grantable => self.claim(c).await,
            Standing::Behind {
                ahead,
                pred,
                revision,
            } => match pred {
                Some((key, value)) if permit_state(&value) == WAITING.as_bytes() => {
                    self.watch_predecessor(key, revision + 1).await?;
                    Ok(None)
                }
                pred => match self
                    .watch_holders(
                        c,
                        ahead,
                        pred.as_ref().map(|p| p.0.as_slice()),
                        revision + 1,
                    )
                    .await?
                {
                    Wake::Grantable => self.claim(c).await,
                    Wake::Recheck => Ok(None),
                },
            },
        }
    }

    /// Waits until my key holds a permit. Transient failures (a member
    /// dying, a leader election) are retried for up to 30 s in a row.
    async fn wait_for_permit(&self, c: &Contender<'_>) -> Result<FencingToken> {
        let mut mark = true;
        let mut failing_since: Option<Instant> = None;
        loop {
            match self.wait_step(c, &mut mark).await {
                Ok(Some(token)) => return Ok(token),
                Ok(None) => failing_since = None,
                Err(e @ Error::Unavailable { .. }) => {
                    let since = *failing_since.get_or_insert_with(Instant::now);
                    if since.elapsed() > Duration::from_secs(30) {
                        return Err(e);
                    }
                    tracing::debug!(error = %e, "etcd semaphore wait interrupted; retrying");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Grants or refuses a permit without waiting.
    pub(crate) async fn try_acquire_permit(&self, req: &LockRequest) -> Result<Option<Grant>> {
        let mut c = self.contender(req).await?;
        let outcome = async {
            let token = match self.join(&mut c).await? {
                Joined::Granted(token) => Some(token),
                Joined::Behind => None,
                Joined::Found => match self.standing(&c, false).await? {
                    Standing::Grantable => self.claim(&c).await?,
                    Standing::Gone => return Err(c.lost()),
                    Standing::Mismatch(stored) => return Err(mismatch(req, c.limit, stored)),
                    Standing::LimitMissing | Standing::Behind { .. } => None,
                },
            };
            Ok(token)
        }
        .await;
        match outcome {
            Ok(Some(token)) => {
                self.start_permit_ttl(req);
                Ok(Some(Grant::new(token, c.session.lease_began())))
            }
            other => {
                // Not granted: leave no key behind.
                self.withdraw(req, self.delete_permit(req).await);
                self.queued().remove(&req.owner);
                other.map(|_| None)
            }
        }
    }

    /// Waits for a permit until `deadline`.
    pub(crate) async fn acquire_permit(
        &self,
        req: &LockRequest,
        deadline: Option<Instant>,
    ) -> Result<Grant> {
        let clock = WaitClock::start(&req.name, deadline);
        let mut c = self.contender(req).await?;
        let waited = async {
            match self.join(&mut c).await? {
                Joined::Granted(token) => Ok(token),
                Joined::Behind | Joined::Found => {
                    let c = &c;
                    tokio::select! {
                        r = self.wait_for_permit(c) => r,
                        reason = c.session.lost() => Err(Error::LeaseLost { name: req.name.clone(), reason }),
                    }
                }
            }
        };
        let outcome = clock.within(waited).await;
        match outcome {
            Ok(token) => {
                // The permit lives as long as the lease: count the holder's
                // deadline from the lease's last keep-alive.
                self.start_permit_ttl(req);
                Ok(Grant::new(token, c.session.lease_began()))
            }
            Err(e) => {
                // A timed-out or failed wait deletes my key (a dropped one
                // is released by core, which ends up in `release_permit`).
                self.withdraw(req, self.delete_permit(req).await);
                self.queued().remove(&req.owner);
                Err(e)
            }
        }
    }

    /// Deletes `req`'s permit key, granted or only waiting, found by its
    /// owner whatever this client remembers.
    pub(crate) async fn release_permit(&self, req: &LockRequest) -> Result<bool> {
        self.inner.permit_ends.remove(&req.owner);
        let held = self.delete_permit(req).await?;
        self.queued().remove(&req.owner);
        Ok(held)
    }

    /// For `extend` and `extend_many`: moves the end of `req`'s permit to
    /// its TTL from now, and returns the key and value that show the permit
    /// is still held; `None` if it already ended here (see
    /// [`PermitEnds::extend`](distlock_core::expiry::PermitEnds::extend)).
    pub(crate) fn permit_check(&self, req: &LockRequest) -> Option<(String, String)> {
        self.inner
            .permit_ends
            .extend(&req.owner, req.ttl)
            .then(|| (permit_key(&req.name, &req.owner), permit_value(HELD, req)))
    }

    /// Starts the TTL of a permit just granted: unless extended, it ends
    /// `req.ttl` from now, when this client deletes its key. The lease
    /// alone would keep it as long as this client lives, since the session
    /// keeps every lease alive; the lease still ends it `req.ttl` after a
    /// crash.
    fn start_permit_ttl(&self, req: &LockRequest) {
        let inner = Arc::downgrade(&self.inner);
        let req = req.clone();
        let (owner, ttl) = (req.owner, req.ttl);
        self.inner.permit_ends.start(owner, ttl, move || async move {
            let Some(inner) = inner.upgrade() else { return };
            let backend = EtcdBackend { inner };
            tracing::debug!(semaphore = %req.name, "a permit reached its TTL unextended; deleting it");
            match backend.delete_permit(&req).await {
                Ok(_) => {
                    backend.queued().remove(&req.owner);
                }
                // The session keeps the lease, and the key, alive: deleting
                // it goes on in the background.
                Err(e) if e.is_retryable() => backend.release_later(&req),
                Err(e) => {
                    tracing::warn!(semaphore = %req.name, error = %e, "could not delete an expired permit; it stays until its session ends");
                    backend.queued().remove(&req.owner);
                }
            }
        });
    }

    pub(crate) async fn inspect_semaphore(&self, name: &LockName) -> Result<LockStatus> {
        let keys = SemKeys::new(name);
        let txn = Txn::new().and_then([
            TxnOp::get(keys.limit.as_str(), None),
            TxnOp::get(keys.permits.as_str(), Some(GetOptions::new().with_prefix())),
        ]);
        let resp = self.txn(txn).await?;
        let ops = resp.op_responses();
        let (Some(TxnOpResponse::Get(limit)), Some(TxnOpResponse::Get(permits))) =
            (ops.first(), ops.get(1))
        else {
            return Err(unexpected("inspection"));
        };
        let stored = stored_limit(limit)?;
        let written = limit.kvs().first().map_or(0, |kv| kv.mod_revision());
        let mut permits: Vec<_> = permits.kvs().iter().collect();
        permits.sort_by_key(|kv| kv.create_revision());
        let holders = granted(&permits, stored.map(|l| (l, written))).len();
        Ok(LockStatus::new(holders > 0).with_holders(holders, stored))
    }

    pub(crate) async fn store_limit(&self, name: &LockName, limit: u32) -> Result<Option<u32>> {
        if limit == 0 {
            return Err(zero_limit());
        }
        let key = SemKeys::new(name).limit;
        // Read, judge, then write only if the key is still what was read:
        // a limit distlock does not write is refused and left as it is.
        loop {
            let read = self
                .kv(|mut c| {
                    let key = key.clone();
                    async move { c.get(key, None).await }
                })
                .await?;
            let old = stored_limit(&read)?;
            let unchanged = match read.kvs().first() {
                Some(kv) => {
                    Compare::mod_revision(key.as_str(), CompareOp::Equal, kv.mod_revision())
                }
                None => Compare::version(key.as_str(), CompareOp::Equal, 0),
            };
            let txn = Txn::new().when([unchanged]).and_then([TxnOp::put(
                key.as_str(),
                limit.to_string(),
                None,
            )]);
            if self.txn(txn).await?.succeeded() {
                return Ok(old);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn permit_values_carry_state_and_holder_info() {
        let name = LockName::new("sem").unwrap_or_else(|e| panic!("{e}"));
        let req = LockRequest::permit(name, Duration::from_secs(1), 2);
        assert_eq!(permit_value(HELD, &req), HELD);
        let req = req.with_holder_info(Some("web-1 pid 7: serve --port 80".into()));
        let value = permit_value(WAITING, &req);
        assert_eq!(permit_state(value.as_bytes()), WAITING.as_bytes());
        assert_eq!(
            permit_holder_info(value.as_bytes()).as_deref(),
            Some("web-1 pid 7: serve --port 80")
        );
        assert_eq!(permit_holder_info(HELD.as_bytes()), None);
    }
}
