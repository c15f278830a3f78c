//! Counting semaphores ([`HoldKind::Permits`]) on ZooKeeper.
//!
//! Layout, under a node no lock can have (lock names never contain `@`):
//!
//! - `<base>/@semaphores/<name>`: the semaphore; its data is the limit in
//!   decimal (empty: none stored yet, as when the node was made as the
//!   parent of another semaphore's node, `x` for `x/y`; such a node has no
//!   `@permits` child either until the first acquire of its own name makes
//!   one: `store_limit_if_absent`).
//! - `<base>/@semaphores/<name>/@permits/_c_<owner>-permit-<seq>`: one
//!   ephemeral sequential child per contender, in the session of its TTL;
//!   its data is its state, `held` or `waiting`, then a space and its
//!   holder info when the request carries one ([`permit_data`]). The owner
//!   in the name lets a client find its node again after a connection loss
//!   hid the create's reply.
//!
//! Grants. A contender may hold a permit once fewer than `limit` of the
//! children have a lower sequence than its own (FIFO). The acquire is one
//! flight: read the limit, create my child, list the children, read the
//! limit again. When both reads saw the same version of the limit and no
//! child was created or deleted after mine (the list's `pzxid` is my
//! child's `czxid`), the list shows the children as they were when my
//! child was created: with fewer than `limit` ahead, the permit was mine
//! from that instant, and the token is my child's `czxid`. Otherwise, or
//! after waiting, the contender claims the permit with a multi that checks
//! the limit's version and rewrites its child to `held`; the token is that
//! write's `mzxid`. Every grant is a write at the instant it was granted,
//! so tokens rise in grant order; at most `limit` hold, by the argument in
//! the etcd backend (the newest holder saw every other holder ahead of it).
//!
//! Waiting without a herd, as on etcd. A waiter whose predecessor waits
//! (its data is `waiting`) watches only that predecessor's data: the
//! predecessor leaving or claiming wakes it. The first waiter (its
//! predecessor holds) watches the children, the limit, and its
//! predecessor's data (which may still say `held` for a waiter that has not
//! yet marked itself `waiting`). ZooKeeper's watches are set by the read
//! that returns the state they watch, so nothing between a read and its
//! watch is missed.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use distlock_core::wait::WaitClock;
use distlock_core::{
    Error, FencingToken, Grant, HoldKind, InputKind, LockName, LockRequest, LockStatus, LostReason,
    Owner, Result,
};
use tokio::time::Instant;
use zookeeper_client as zk;

use crate::{czxid_token, Node, Session, ZooKeeperBackend};

/// A child that holds a permit (or, until its first read, a contender that
/// has not yet learned it waits).
const HELD: &[u8] = b"held";
/// A child that waits for a permit.
const WAITING: &[u8] = b"waiting";

/// A permit child's data: `state`, then a space and `req`'s holder info
/// if it has one. Holder info has no control characters and the states no
/// space, so [`permit_state`] and [`permit_holder_info`] read it back.
fn permit_data(state: &[u8], req: &LockRequest) -> Vec<u8> {
    let mut data = state.to_vec();
    if let Some(info) = &req.holder_info {
        data.push(b' ');
        data.extend_from_slice(info.as_bytes());
    }
    data
}

/// The state (`held` or `waiting`) in a permit child's data.
fn permit_state(data: &[u8]) -> &[u8] {
    data.split(|b| *b == b' ').next().unwrap_or_default()
}

/// The holder info in a permit child's data, if it carries one.
pub(crate) fn permit_holder_info(data: &[u8]) -> Option<String> {
    let (_, info) = std::str::from_utf8(data).ok()?.split_once(' ')?;
    Some(info.to_string()).filter(|info| !info.is_empty())
}

/// The name prefix of `owner`'s permit child.
pub(crate) fn permit_prefix(owner: &Owner) -> String {
    format!("_c_{owner}-permit-")
}

/// The sequence number a permit child ends with. A negative one (a
/// parent's 32-bit child counter that wrapped) is none: it would sort
/// before every permit granted, and be granted beside them.
pub(crate) fn permit_sequence(child: &str) -> Option<i64> {
    child
        .rsplit_once("-permit-")
        .and_then(|(_, seq)| seq.parse().ok())
        .filter(|seq: &i64| *seq >= 0)
}

/// The limit a permit request asks for; zero is refused.
fn requested_limit(req: &LockRequest) -> Result<u32> {
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

/// A limit as stored: `None` for empty data.
fn parse_limit(path: &str, data: &[u8]) -> Result<Option<u32>> {
    if data.is_empty() {
        return Ok(None);
    }
    distlock_core::input::stored_limit(data)
        .map(Some)
        .ok_or_else(|| {
            Error::misconfigured(
                "zookeeper",
                format!(
                    "the semaphore limit at {path} is {:?}, which distlock does not write (it writes 1 to 4294967295): another application writes under distlock's root, or the node was edited; delete its data while no permit is held",
                    String::from_utf8_lossy(data)
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

/// The children ahead of `mine` (by sequence, lowest first), or `None` if
/// `mine` is not among them.
fn ahead_of(children: &[String], mine: i64) -> Option<Vec<(i64, &str)>> {
    let mut seen = false;
    let mut ahead: Vec<(i64, &str)> = Vec::new();
    for c in children {
        match permit_sequence(c) {
            Some(s) if s == mine => seen = true,
            Some(s) if s < mine => ahead.push((s, c.as_str())),
            _ => {}
        }
    }
    ahead.sort_unstable_by_key(|(s, _)| *s);
    seen.then_some(ahead)
}

/// One contender: its node and session.
struct Contender<'a> {
    req: &'a LockRequest,
    client: Session,
    /// The semaphore's node (its data is the limit).
    node: String,
    permits: String,
    limit: u32,
    /// My child's name and sequence, once created.
    mine: String,
    seq: i64,
    /// When the request that may grant my permit was sent (the create's
    /// flight, then the claim): a grant's lease counts from here.
    began: std::sync::Mutex<Instant>,
}

impl Contender<'_> {
    fn mark_attempt(&self) {
        *self
            .began
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Instant::now();
    }

    fn grant(&self, token: FencingToken) -> Grant {
        Grant::new(
            token,
            *self
                .began
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        )
    }

    fn my_path(&self) -> String {
        format!("{}/{}", self.permits, self.mine)
    }

    fn lost(&self) -> Error {
        Error::LeaseLost {
            name: self.req.name.clone(),
            reason: LostReason::SessionLost(
                "my permit node vanished while waiting (its session ended?)".into(),
            ),
        }
    }
}

/// What the acquire flight found.
enum Joined {
    Granted(FencingToken),
    /// Grantable now, but not provably since my child was created: claim.
    Grantable(i32),
    Behind,
    /// My child exists, but where it stands must be read again.
    Unsure,
}

/// Where my child stands.
enum Standing {
    Gone,
    Mismatch(u32),
    LimitMissing,
    /// Grantable under the limit of this version.
    Grantable(i32),
    Behind {
        pred: String,
    },
}

impl ZooKeeperBackend {
    fn semaphore_node(&self, name: &LockName) -> String {
        format!("{}/@semaphores/{name}", self.inner.base)
    }

    pub(crate) fn permits_dir(&self, name: &LockName) -> String {
        format!("{}/@permits", self.semaphore_node(name))
    }

    async fn contender<'a>(&self, req: &'a LockRequest) -> Result<Contender<'a>> {
        let limit = requested_limit(req)?;
        let client = self.hold_session(req.ttl).await?;
        let node = self.semaphore_node(&req.name);
        Ok(Contender {
            req,
            client,
            permits: format!("{node}/@permits"),
            node,
            limit,
            mine: String::new(),
            seq: 0,
            began: std::sync::Mutex::new(Instant::now()),
        })
    }

    /// Makes whichever of the semaphore's node and its `@permits` node is
    /// missing, and stores `c.limit` if the semaphore has none; a stored
    /// limit is left as it is. The semaphore's node alone may exist, with
    /// no data, when it was made as the parent of another semaphore's node
    /// (`x` for `x/y`): that node is completed here.
    async fn store_limit_if_absent(&self, c: &Contender<'_>) -> Result<()> {
        let dirs = zk::CreateMode::Persistent.with_acls(self.inner.acls);
        // `mkdir -p`: nodes that exist already are left as they are.
        c.client
            .mkdir(&c.permits, &dirs)
            .await
            .map_err(|e| self.err(e))?;
        for _ in 0..10 {
            match c.client.get_data(&c.node).await {
                Err(zk::Error::NoNode) => {
                    c.client
                        .mkdir(&c.permits, &dirs)
                        .await
                        .map_err(|e| self.err(e))?;
                }
                Ok((data, stat)) if data.is_empty() => {
                    let limit = c.limit.to_string();
                    match c
                        .client
                        .set_data(&c.node, limit.as_bytes(), Some(stat.version))
                        .await
                    {
                        Ok(_) => return Ok(()),
                        Err(zk::Error::BadVersion) => {}
                        Err(e) => return Err(self.err(e)),
                    }
                }
                Ok(_) => return Ok(()),
                Err(e) => return Err(self.err(e)),
            }
        }
        Err(Error::unavailable(
            "zookeeper",
            format!("could not store the limit of {}: it kept changing", c.node),
            None,
        ))
    }

    fn remember_permit(&self, c: &mut Contender<'_>, node: String, seq: i64) {
        c.mine = node;
        c.seq = seq;
        self.nodes().insert(
            c.req.owner,
            Node {
                seq,
                session: c.client.clone(),
            },
        );
    }

    /// The acquire: create my child with the reads around it, in one flight.
    async fn join(&self, c: &mut Contender<'_>) -> Result<Joined> {
        let prefix = permit_prefix(&c.req.owner);
        let path = format!("{}/{prefix}", c.permits);
        let options = zk::CreateMode::EphemeralSequential.with_acls(self.inner.acls);
        for _ in 0..5 {
            // Sent in this order (the client orders requests when their
            // futures are made), handled in this order by the server.
            c.mark_attempt();
            let before = c.client.get_data(&c.node);
            let data = permit_data(HELD, c.req);
            let create = c.client.create(&path, &data, &options);
            let list = c.client.get_children(&c.permits);
            let after = c.client.get_data(&c.node);
            let (before, created, listed, after) = tokio::join!(before, create, list, after);
            let (stat, seq) = match created {
                Ok(created) => created,
                Err(zk::Error::NoNode) => {
                    self.store_limit_if_absent(c).await?;
                    continue;
                }
                Err(zk::Error::ConnectionLoss) => {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    let found = self.find_mine(&c.client, &c.permits, &prefix).await?;
                    let Some((found, seq)) =
                        found.and_then(|f| permit_sequence(&f).map(|s| (f, s)))
                    else {
                        continue;
                    };
                    tracing::info!(node = %found, "found my permit node again after a connection loss during create");
                    self.remember_permit(c, found, seq);
                    return Ok(Joined::Unsure);
                }
                Err(e) => return Err(self.err(e)),
            };
            if seq.into_i64() < 0 {
                let _ = c
                    .client
                    .delete(&format!("{}/{prefix}{seq}", c.permits), None)
                    .await;
                return Err(crate::wrapped_counter(&c.permits));
            }
            self.remember_permit(c, format!("{prefix}{seq}"), seq.into_i64());
            let (Ok((before, first)), Ok((after, second)), Ok((children, dir))) =
                (before, after, listed)
            else {
                return Ok(Joined::Unsure);
            };
            if first.version != second.version || first.mzxid != second.mzxid {
                // The limit changed during the flight.
                return Ok(Joined::Unsure);
            }
            debug_assert_eq!(before, after);
            let stored = match parse_limit(&c.node, &before)? {
                Some(stored) => stored,
                None => {
                    self.store_limit_if_absent(c).await?;
                    return Ok(Joined::Unsure);
                }
            };
            if stored != c.limit {
                // The caller deletes my child.
                return Err(mismatch(c.req, c.limit, stored));
            }
            let Some(ahead) = ahead_of(&children, c.seq) else {
                return Ok(Joined::Unsure);
            };
            if ahead.len() >= c.limit as usize {
                return Ok(Joined::Behind);
            }
            // No child created or deleted since mine: the list is the queue
            // as it stood when mine was created.
            return Ok(if dir.pzxid == stat.czxid {
                Joined::Granted(czxid_token(stat.czxid)?)
            } else {
                Joined::Grantable(first.version)
            });
        }
        Err(Error::unavailable(
            "zookeeper",
            format!("could not create a permit node under {}", c.permits),
            None,
        ))
    }

    /// Reads where my child stands (with `mark`, first rewrites it
    /// `waiting`), in one flight.
    async fn standing(&self, c: &Contender<'_>, mark: bool) -> Result<Standing> {
        let my_path = c.my_path();
        let waiting = permit_data(WAITING, c.req);
        let marked = mark.then(|| c.client.set_data(&my_path, &waiting, None));
        let limit = c.client.get_data(&c.node);
        let list = c.client.get_children(&c.permits);
        let marked = async {
            match marked {
                Some(m) => m.await.map(|_| ()),
                None => Ok(()),
            }
        };
        let (marked, limit, listed) = tokio::join!(marked, limit, list);
        match marked {
            Ok(()) => {}
            Err(zk::Error::NoNode) => return Ok(Standing::Gone),
            Err(e) => return Err(self.err(e)),
        }
        let children = match listed {
            Ok((children, _)) => children,
            Err(zk::Error::NoNode) => return Ok(Standing::Gone),
            Err(e) => return Err(self.err(e)),
        };
        let (data, stat) = match limit {
            Ok(limit) => limit,
            Err(zk::Error::NoNode) => return Ok(Standing::LimitMissing),
            Err(e) => return Err(self.err(e)),
        };
        self.judge(c, &children, &data, stat.version)
    }

    fn judge(
        &self,
        c: &Contender<'_>,
        children: &[String],
        limit: &[u8],
        version: i32,
    ) -> Result<Standing> {
        match parse_limit(&c.node, limit)? {
            None => return Ok(Standing::LimitMissing),
            Some(stored) if stored != c.limit => return Ok(Standing::Mismatch(stored)),
            Some(_) => {}
        }
        let Some(ahead) = ahead_of(children, c.seq) else {
            return Ok(Standing::Gone);
        };
        match ahead.last() {
            Some((_, pred)) if ahead.len() >= c.limit as usize => Ok(Standing::Behind {
                pred: format!("{}/{pred}", c.permits),
            }),
            _ => Ok(Standing::Grantable(version)),
        }
    }

    /// Claims the permit my child may now hold, if the limit is still the
    /// version read: a write, whose zxid is the token, and which wakes my
    /// successor.
    async fn claim(&self, c: &Contender<'_>, version: i32) -> Result<Option<FencingToken>> {
        // The write that confirms the permit, over the permit's session:
        // the holder's deadline counts from before it is sent.
        c.mark_attempt();
        let mut writer = c.client.new_multi_writer();
        writer
            .add_check_version(&c.node, version)
            .map_err(|e| self.err(e))?;
        writer
            .add_set_data(&c.my_path(), &permit_data(HELD, c.req), None)
            .map_err(|e| self.err(e))?;
        match writer.commit().await {
            Ok(results) => match results.into_iter().nth(1) {
                Some(zk::MultiWriteResult::SetData { stat }) => Ok(Some(czxid_token(stat.mzxid)?)),
                _ => Err(Error::backend(
                    "zookeeper",
                    "a claim's multi answered without its setData",
                )),
            },
            Err(zk::MultiWriteError::OperationFailed {
                source: zk::Error::BadVersion | zk::Error::NoNode,
                ..
            }) => Ok(None),
            Err(e) => Err(self.err(e.into())),
        }
    }

    /// One read and at most one wait; `Some` once the permit is mine.
    async fn wait_step(&self, c: &Contender<'_>, mark: &mut bool) -> Result<Option<FencingToken>> {
        let standing = self.standing(c, *mark).await?;
        *mark = false;
        let pred = match standing {
            Standing::Gone => return Err(c.lost()),
            Standing::Mismatch(stored) => return Err(mismatch(c.req, c.limit, stored)),
            Standing::LimitMissing => return self.store_limit_if_absent(c).await.map(|()| None),
            Standing::Grantable(version) => return self.claim(c, version).await,
            Standing::Behind { pred } => pred,
        };
        let (data, _, pred_watch) = match c.client.get_and_watch_data(&pred).await {
            Ok(read) => read,
            Err(zk::Error::NoNode) => return Ok(None),
            Err(e) => return Err(self.err(e)),
        };
        if permit_state(&data) == WAITING {
            // Leaving or claiming, my predecessor changes its node.
            pred_watch.changed().await;
            self.inner.wakeups.fetch_add(1, Ordering::Relaxed);
            return Ok(None);
        }
        // My predecessor holds (or has yet to mark itself): I am the first
        // waiter, and any child leaving may be my turn.
        let list = c.client.get_and_watch_children(&c.permits);
        let limit = c.client.get_and_watch_data(&c.node);
        let (listed, limit) = tokio::join!(list, limit);
        let (children, _, children_watch) = match listed {
            Ok(listed) => listed,
            Err(zk::Error::NoNode) => return Err(c.lost()),
            Err(e) => return Err(self.err(e)),
        };
        let (data, stat, limit_watch) = match limit {
            Ok(read) => read,
            Err(zk::Error::NoNode) => return Ok(None),
            Err(e) => return Err(self.err(e)),
        };
        match self.judge(c, &children, &data, stat.version)? {
            Standing::Grantable(version) => return self.claim(c, version).await,
            Standing::Behind { pred: now } if now == pred => {}
            _ => return Ok(None),
        }
        tokio::select! {
            _ = pred_watch.changed() => {}
            _ = children_watch.changed() => {}
            _ = limit_watch.changed() => {}
        }
        self.inner.wakeups.fetch_add(1, Ordering::Relaxed);
        Ok(None)
    }

    async fn wait_for_permit(&self, c: &Contender<'_>) -> Result<FencingToken> {
        let mut mark = true;
        loop {
            if let Some(token) = self.wait_step(c, &mut mark).await? {
                return Ok(token);
            }
        }
    }

    /// Grants or refuses a permit without waiting.
    pub(crate) async fn try_acquire_permit(&self, req: &LockRequest) -> Result<Option<Grant>> {
        let mut c = self.contender(req).await?;
        let outcome = async {
            let mut version = match self.join(&mut c).await? {
                Joined::Granted(token) => return Ok(Some(token)),
                Joined::Behind => return Ok(None),
                Joined::Grantable(version) => Some(version),
                Joined::Unsure => None,
            };
            for _ in 0..3 {
                if let Some(v) = version.take() {
                    if let Some(token) = self.claim(&c, v).await? {
                        return Ok(Some(token));
                    }
                }
                match self.standing(&c, false).await? {
                    Standing::Grantable(v) => version = Some(v),
                    Standing::Gone => return Err(c.lost()),
                    Standing::Mismatch(stored) => return Err(mismatch(req, c.limit, stored)),
                    Standing::LimitMissing => self.store_limit_if_absent(&c).await?,
                    Standing::Behind { .. } => return Ok(None),
                }
            }
            Ok(None)
        }
        .await;
        match outcome {
            Ok(Some(token)) => {
                self.start_permit_ttl(req);
                Ok(Some(c.grant(token)))
            }
            other => {
                // Not granted: leave no node behind.
                self.withdraw(req, self.release_permit(req).await);
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
                Joined::Grantable(version) => match self.claim(&c, version).await? {
                    Some(token) => Ok(token),
                    None => self.wait_for_permit(&c).await,
                },
                Joined::Behind | Joined::Unsure => self.wait_for_permit(&c).await,
            }
        };
        let outcome = clock.within(waited).await;
        match outcome {
            Ok(token) => {
                self.start_permit_ttl(req);
                Ok(c.grant(token))
            }
            Err(e) => {
                // A timed-out or failed wait deletes my node (a dropped one
                // is released by core, which ends up in `release_permit`).
                let e = self.cut_off_at_the_deadline(e, &c.client);
                self.withdraw_soon(req, self.release_permit(req)).await;
                Err(e)
            }
        }
    }

    /// Deletes `req`'s permit node, granted or only waiting; found by its
    /// owner when this client does not know it (a create whose reply was
    /// lost, a cancelled acquire).
    pub(crate) async fn release_permit(&self, req: &LockRequest) -> Result<bool> {
        self.inner.permit_ends.remove(&req.owner);
        if self.nodes().contains_key(&req.owner) {
            return self.delete_node(req).await;
        }
        let client = self.lookup_session(req).await?;
        let dir = self.permits_dir(&req.name);
        match self
            .find_mine(&client, &dir, &permit_prefix(&req.owner))
            .await?
        {
            Some(node) => match client.delete(&format!("{dir}/{node}"), None).await {
                Ok(()) => Ok(true),
                Err(zk::Error::NoNode | zk::Error::SessionExpired) => Ok(false),
                Err(e) => Err(self.err(e)),
            },
            None => Ok(false),
        }
    }

    /// For `extend_many`: moves the end of `req`'s permit to its TTL from
    /// now; `false` if it already ended here (see
    /// [`PermitEnds::extend`](distlock_core::expiry::PermitEnds::extend)).
    pub(crate) fn extend_permit_ttl(&self, req: &LockRequest) -> bool {
        self.inner.permit_ends.extend(&req.owner, req.ttl)
    }

    /// Whether a permit child's data says it holds.
    pub(crate) fn holds(data: &[u8]) -> bool {
        permit_state(data) == HELD
    }

    /// Whether the permit child at place `at` of its semaphore (by
    /// sequence), with `data` and `stat`, holds a permit under `limit` and
    /// the `mzxid` of the limit's last write. A child that says `held`
    /// holds when it was claimed after waiting (written since its create),
    /// is among the first `limit`, or was created before the limit was
    /// last written (granted under an earlier limit, which a lower one does
    /// not take back). A child just created beyond the limit also says
    /// `held` until its contender learns it waits: it does not count.
    /// Without a stored limit, every child that says `held` holds.
    pub(crate) fn granted(
        at: usize,
        data: &[u8],
        stat: &zk::Stat,
        limit: Option<(u32, i64)>,
    ) -> bool {
        Self::holds(data)
            && limit.is_none_or(|(limit, written)| {
                at < limit as usize || stat.mzxid > stat.czxid || stat.czxid < written
            })
    }

    /// Starts the TTL of a permit just granted: unless extended, it ends
    /// `req.ttl` from now, when this client deletes its node. Its session
    /// alone would keep it as long as this client lives, since the client
    /// keeps its sessions alive; the session still ends it `req.ttl` after a
    /// crash.
    fn start_permit_ttl(&self, req: &LockRequest) {
        let inner = Arc::downgrade(&self.inner);
        let req = req.clone();
        let (owner, ttl) = (req.owner, req.ttl);
        self.inner.permit_ends.start(owner, ttl, move || async move {
            let Some(inner) = inner.upgrade() else { return };
            let backend = ZooKeeperBackend { inner };
            tracing::debug!(semaphore = %req.name, "a permit reached its TTL unextended; deleting it");
            match backend.delete_node(&req).await {
                Ok(_) => {}
                // Its session lives as long as this client: deleting it
                // goes on in the background.
                Err(e) if e.is_retryable() => backend.release_later(&req),
                Err(e) => {
                    tracing::warn!(semaphore = %req.name, error = %e, "could not delete an expired permit; it stays until its session ends");
                }
            }
        });
    }

    pub(crate) async fn inspect_semaphore(&self, name: &LockName) -> Result<LockStatus> {
        let client = self.client().await?;
        let node = self.semaphore_node(name);
        let dir = self.permits_dir(name);
        let (limit, listed) = tokio::join!(client.get_data(&node), client.list_children(&dir));
        let limit = match limit {
            Ok((data, stat)) => parse_limit(&node, &data)?.map(|l| (l, stat.mzxid)),
            Err(zk::Error::NoNode) => None,
            Err(e) => return Err(self.err(e)),
        };
        let children = match listed {
            Ok(children) => children,
            Err(zk::Error::NoNode) => Vec::new(),
            Err(e) => return Err(self.err(e)),
        };
        let mut children: Vec<(i64, String)> = children
            .into_iter()
            .filter_map(|c| permit_sequence(&c).map(|s| (s, c)))
            .collect();
        children.sort_unstable();
        let mut holders = 0;
        if !children.is_empty() {
            let mut reader = client.new_multi_reader();
            for (_, c) in &children {
                reader
                    .add_get_data(&format!("{dir}/{c}"))
                    .map_err(|e| self.err(e))?;
            }
            let results = reader.commit().await.map_err(|e| self.err(e))?;
            holders = results
                .iter()
                .enumerate()
                .filter(|(at, r)| {
                    matches!(r, zk::MultiReadResult::Data { data, stat } if Self::granted(*at, data, stat, limit))
                })
                .count();
        }
        Ok(LockStatus::new(holders > 0).with_holders(holders, limit.map(|(l, _)| l)))
    }

    pub(crate) async fn store_limit(&self, name: &LockName, limit: u32) -> Result<Option<u32>> {
        if limit == 0 {
            return Err(zero_limit());
        }
        let client = self.client().await?;
        let node = self.semaphore_node(name);
        let value = limit.to_string();
        let dirs = zk::CreateMode::Persistent.with_acls(self.inner.acls);
        for _ in 0..10 {
            match client.get_data(&node).await {
                Ok((data, stat)) => {
                    let old = parse_limit(&node, &data)?;
                    match client
                        .set_data(&node, value.as_bytes(), Some(stat.version))
                        .await
                    {
                        Ok(_) => return Ok(old),
                        Err(zk::Error::BadVersion | zk::Error::NoNode) => {}
                        Err(e) => return Err(self.err(e)),
                    }
                }
                Err(zk::Error::NoNode) => {
                    client
                        .mkdir(&self.permits_dir(name), &dirs)
                        .await
                        .map_err(|e| self.err(e))?;
                }
                Err(e) => return Err(self.err(e)),
            }
        }
        Err(Error::unavailable(
            "zookeeper",
            format!("could not change the limit at {node}: it kept changing"),
            None,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn permit_data_carries_state_and_holder_info() {
        let name = LockName::new("sem").unwrap_or_else(|e| panic!("{e}"));
        let req = LockRequest::permit(name, Duration::from_secs(1), 2);
        assert_eq!(permit_data(HELD, &req), HELD);
        let req = req.with_holder_info(Some("web-1 pid 7: serve --port 80".into()));
        let data = permit_data(WAITING, &req);
        assert_eq!(permit_state(&data), WAITING);
        assert_eq!(
            permit_holder_info(&data).as_deref(),
            Some("web-1 pid 7: serve --port 80")
        );
        assert_eq!(permit_holder_info(HELD), None);
    }
}
