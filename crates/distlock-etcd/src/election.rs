//! Elections in Go's `concurrency.Election` layout: a campaign is the key
//! `<name>/<lease id in hex>` on the campaigner's lease, carrying its value;
//! the leader is the key created first under `<name>/`, and its token that
//! key's create revision (Go's `leaderRev`). `etcdctl elect` campaigns and
//! observes the same keys. A campaign's holder info is in a second key on
//! the same lease, written by the same transaction
//! ([`leader_info_key`](crate::leader_info_key)), since Go's layout gives
//! the campaign key's value to the proposal.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use distlock_core::{Error, FencingToken, Leader, LeaderStream, LockName, LockRequest, Result};
use etcd_client::{
    Compare, CompareOp, EventType, GetOptions, PutOptions, Txn, TxnOp, TxnOpResponse, WatchOptions,
};
use futures_util::StreamExt;

use crate::{leader_info_key, EtcdBackend, LEADER_INFO_ROOT};

/// One campaign key under an election's prefix.
struct Campaign {
    value: Vec<u8>,
    key: Vec<u8>,
    lease: i64,
    /// Its holder info: `None` until read, then what its holder info key
    /// holds (`None` for a campaign of another client, such as `etcdctl
    /// elect`, which writes none).
    info: Option<Option<String>>,
    /// A lock's key, not a campaign's: Go's `Mutex` writes an empty value,
    /// distlock's lock its owner. Held first, it keeps every campaign out,
    /// and nobody leads. Judged by the value's shape until the holder info
    /// key is read: a distlock campaign always writes one in the
    /// transaction that creates its key ([`is_campaigns_info`]), so a
    /// campaign whose value is shaped like an owner is one still.
    lock: bool,
}

/// The keys in an election's queue, by create revision: campaigns, and
/// the keys of the lock of the same name (exclusive and shared holds),
/// which keep the campaigns behind them waiting.
type Campaigns = BTreeMap<i64, Campaign>;

/// Whether `key` is a campaign of the election whose prefix is `prefix`
/// (`<name>/`): a direct child, not a key of a longer name such as
/// `<name>/db/<lease>`.
fn direct_child(key: &[u8], prefix: &str) -> bool {
    key.strip_prefix(prefix.as_bytes())
        .is_some_and(|rest| !rest.is_empty() && !rest.contains(&b'/'))
}

/// The leader among `keys`: the one created first, if it is a campaign.
fn first(keys: &Campaigns) -> Option<Leader> {
    keys.iter().next().filter(|(_, c)| !c.lock).map(|(rev, c)| {
        Leader::new(
            String::from_utf8_lossy(&c.value).into_owned(),
            FencingToken(*rev as u64),
        )
        .with_holder_info(c.info.clone().flatten())
    })
}

/// The queue entry of `kv`, a key found under the election's `prefix`
/// ([`crate::own_key`]): a shared hold's key is the lock's, whatever its
/// value, and has no holder info key to read.
fn campaign(kv: &etcd_client::KeyValue, prefix: &str) -> Campaign {
    let shared = crate::is_shared(kv.key(), prefix);
    Campaign {
        value: kv.value().to_vec(),
        key: kv.key().to_vec(),
        lease: kv.lease(),
        info: shared.then_some(None),
        lock: shared || kv.value().is_empty() || crate::list::looks_like_owner(kv.value()),
    }
}

/// Whether a holder info key last written at `info_mod` belongs to the key
/// created at `created`: the campaign's transaction writes both, and only
/// it writes the info key, so one left by a campaign key deleted by hand
/// is older than a lock's key made later on the same lease.
pub(crate) fn is_campaigns_info(info_mod: i64, created: i64) -> bool {
    info_mod >= created
}

/// The holder info a holder info key's value carries (empty: none).
pub(crate) fn leader_info(value: &[u8]) -> Option<String> {
    Some(String::from_utf8_lossy(value).into_owned()).filter(|v| !v.is_empty())
}

impl EtcdBackend {
    /// Puts `value` on my campaign's key if it still has the create
    /// revision it was granted with (Go's `Proclaim`).
    pub(crate) async fn proclaim_value(&self, req: &LockRequest, value: &str) -> Result<bool> {
        let Some(rev) = self.campaign_rev(&req.owner) else {
            return Ok(false);
        };
        let Some(session) = self.queued().get(&req.owner).cloned() else {
            return Ok(false);
        };
        let key = format!("{}/{:x}", req.name, session.lease);
        let txn = Txn::new()
            .when([Compare::create_revision(
                key.as_str(),
                CompareOp::Equal,
                rev,
            )])
            .and_then([TxnOp::put(
                key.as_str(),
                value,
                Some(PutOptions::new().with_lease(session.lease)),
            )]);
        Ok(self.txn(txn).await?.succeeded())
    }

    /// The campaign key created first under `<name>/` (Go's
    /// `Election.Leader`), and how long its lease still runs.
    pub(crate) async fn current_leader(&self, name: &LockName) -> Result<Option<Leader>> {
        let (keys, _) = self.campaign_keys(&format!("{name}/")).await?;
        let Some((rev, first)) = keys.into_iter().next().filter(|(_, c)| !c.lock) else {
            return Ok(None);
        };
        let remaining = match self.lease_remaining(first.lease).await? {
            // The lease is gone, and the key with it.
            Some(None) => return Ok(None),
            Some(left) => left,
            None => None,
        };
        Ok(Some(
            Leader::new(
                String::from_utf8_lossy(&first.value).into_owned(),
                FencingToken(rev as u64),
            )
            .with_remaining(remaining)
            .with_holder_info(first.info.flatten()),
        ))
    }

    /// How long `lease` still runs: `None` for a key on no lease (0),
    /// `Some(None)` for a lease that is gone.
    async fn lease_remaining(&self, lease: i64) -> Result<Option<Option<Duration>>> {
        if lease == 0 {
            return Ok(None);
        }
        let ttl = self
            .call(|mut c| async move { c.lease_time_to_live(lease, None).await })
            .await?
            .ttl();
        // -1: the lease is gone.
        Ok(Some(u64::try_from(ttl).ok().map(Duration::from_secs)))
    }

    /// The leader among `keys` with its remaining lease, read once per
    /// leadership: `read` keeps the create revision of the leader last read
    /// and what its lease had left then.
    async fn first_with_remaining(
        &self,
        keys: &Campaigns,
        read: &mut Option<(i64, Option<Duration>)>,
    ) -> Result<Option<Leader>> {
        let Some(leader) = first(keys) else {
            return Ok(None);
        };
        let rev = leader.token.0 as i64;
        let remaining = match *read {
            Some((r, left)) if r == rev => left,
            _ => {
                let lease = keys.get(&rev).map_or(0, |c| c.lease);
                let left = self.lease_remaining(lease).await?.flatten();
                *read = Some((rev, left));
                left
            }
        };
        Ok(Some(leader.with_remaining(remaining)))
    }

    /// Every campaign key under `<name>/` with its holder info, and the
    /// revision they were read at: one transaction reading both ranges.
    async fn campaign_keys(&self, prefix: &str) -> Result<(Campaigns, i64)> {
        let info_prefix = format!("{LEADER_INFO_ROOT}{prefix}");
        let txn = Txn::new().and_then([
            TxnOp::get(prefix, Some(GetOptions::new().with_prefix())),
            TxnOp::get(info_prefix.as_str(), Some(GetOptions::new().with_prefix())),
        ]);
        let resp = self.txn(txn).await?;
        let rev = resp.header().map_or(0, |h| h.revision());
        let ops = resp.op_responses();
        let (Some(TxnOpResponse::Get(campaigns)), Some(TxnOpResponse::Get(infos))) =
            (ops.first(), ops.get(1))
        else {
            return Err(Error::unavailable(
                "etcd",
                "etcd answered an election read with something else",
                None,
            ));
        };
        let infos: HashMap<&[u8], &etcd_client::KeyValue> = infos
            .kvs()
            .iter()
            .filter(|kv| direct_child(kv.key(), &info_prefix))
            .map(|kv| (kv.key(), kv))
            .collect();
        let keys = campaigns
            .kvs()
            .iter()
            .filter(|kv| crate::own_key(kv.key(), prefix))
            .map(|kv| {
                let mut c = campaign(kv, prefix);
                let info_key = leader_info_key(&String::from_utf8_lossy(kv.key()));
                let info = infos
                    .get(info_key.as_bytes())
                    .filter(|i| is_campaigns_info(i.mod_revision(), kv.create_revision()));
                c.lock &= info.is_none();
                c.info = Some(info.and_then(|i| leader_info(i.value())));
                (kv.create_revision(), c)
            })
            .collect();
        Ok((keys, rev))
    }

    /// Reads the holder info of the first of `keys` if it is not known yet:
    /// a campaign seen first in a watch event (its holder info key is
    /// written in the same transaction, outside the watched prefix). A key
    /// that has one is a campaign, whatever its value looks like.
    async fn fill_first_info(&self, keys: &mut Campaigns) -> Result<()> {
        let Some((&created, c)) = keys.iter_mut().next().filter(|(_, c)| c.info.is_none()) else {
            return Ok(());
        };
        let info_key = leader_info_key(&String::from_utf8_lossy(&c.key));
        let resp = self
            .kv(|mut kv| {
                let info_key = info_key.clone();
                async move { kv.get(info_key, None).await }
            })
            .await?;
        let info = resp
            .kvs()
            .first()
            .filter(|i| is_campaigns_info(i.mod_revision(), created));
        c.lock &= info.is_none();
        c.info = Some(info.and_then(|kv| leader_info(kv.value())));
        Ok(())
    }

    /// The leaders of `name`: one read of every key under `<name>/`, then a
    /// watch of the prefix from the next revision, applying each event in
    /// revision order, so every leader and value in between is seen. A
    /// broken watch is reported once and the stream reads everything again.
    pub(crate) fn leaders(&self, name: &LockName) -> LeaderStream {
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<Option<Leader>>>(16);
        let backend = self.clone();
        let prefix = format!("{name}/");
        tokio::spawn(async move {
            loop {
                let failed = match backend.follow(&prefix, &tx).await {
                    // The receiver is gone: nobody observes any more.
                    Ok(()) => return,
                    Err(e) => e,
                };
                if tx.send(Err(failed)).await.is_err() {
                    return;
                }
                tokio::select! {
                    () = tokio::time::sleep(Duration::from_millis(200)) => {}
                    () = tx.closed() => return,
                }
            }
        });
        futures_util::stream::unfold(rx, |mut rx| async move {
            rx.recv().await.map(|item| (item, rx))
        })
        .boxed()
    }

    /// Sends the leader after the read and after each watched revision
    /// until the receiver goes (`Ok`) or the watch fails.
    async fn follow(
        &self,
        prefix: &str,
        tx: &tokio::sync::mpsc::Sender<Result<Option<Leader>>>,
    ) -> Result<()> {
        let (mut keys, rev) = self.campaign_keys(prefix).await?;
        let mut read = None;
        let leader = self.first_with_remaining(&keys, &mut read).await?;
        if tx.send(Ok(leader)).await.is_err() {
            return Ok(());
        }
        let mut stream = self
            .client()
            .watch(
                prefix,
                Some(
                    WatchOptions::new()
                        .with_prefix()
                        .with_start_revision(rev + 1),
                ),
            )
            .await
            .map_err(|e| self.err(e))?;
        loop {
            // An observer that went away ends the watch at once, even while
            // the election is idle.
            let msg = tokio::select! {
                msg = stream.message() => msg.map_err(|e| self.err(e))?,
                () = tx.closed() => return Ok(()),
            };
            let Some(msg) = msg else { break };
            if msg.canceled() {
                break;
            }
            let mut at: Option<i64> = None;
            for event in msg.events() {
                let Some(kv) = event.kv() else { continue };
                // One item per revision, after all its events.
                if at.is_some_and(|r| r != kv.mod_revision()) {
                    self.fill_first_info(&mut keys).await?;
                    let leader = self.first_with_remaining(&keys, &mut read).await?;
                    if tx.send(Ok(leader)).await.is_err() {
                        return Ok(());
                    }
                }
                at = Some(kv.mod_revision());
                match event.event_type() {
                    _ if !crate::own_key(kv.key(), prefix) => {}
                    EventType::Put => {
                        // A proclamation keeps what is known of the
                        // campaign: its holder info, and that it is one.
                        let mut c = campaign(kv, prefix);
                        if let Some(known) = keys.get(&kv.create_revision()) {
                            c.info = known.info.clone();
                            c.lock = known.lock;
                        }
                        keys.insert(kv.create_revision(), c);
                    }
                    EventType::Delete => keys.retain(|_, c| c.key.as_slice() != kv.key()),
                }
            }
            if at.is_some() {
                self.fill_first_info(&mut keys).await?;
                let leader = self.first_with_remaining(&keys, &mut read).await?;
                if tx.send(Ok(leader)).await.is_err() {
                    return Ok(());
                }
            }
        }
        Err(Error::unavailable(
            "etcd",
            format!(
                "etcd at {}: the watch of {prefix} ended",
                self.inner.endpoints
            ),
            None,
        ))
    }

    /// Deletes a campaign's key whose grant this client never saw (the
    /// campaign was cancelled or its reply lost): the key of `req`'s lease
    /// under `<name>/`, if it carries `req`'s value and no live hold of this
    /// client owns it.
    pub(crate) async fn delete_stray_campaign(&self, key: &str, req: &LockRequest) -> Result<bool> {
        let resp = self
            .kv(|mut c| {
                let key = key.to_string();
                async move { c.get(key, None).await }
            })
            .await?;
        let Some(kv) = resp.kvs().first() else {
            return Ok(false);
        };
        let (rev, value) = (kv.create_revision(), kv.value().to_vec());
        let ours = req.value.as_deref().is_some_and(|v| v.as_bytes() == value);
        // This campaign's own entry, left while its create was in flight,
        // does not count as a live hold.
        self.campaigns().remove(&req.owner);
        if !ours || self.key_in_use(rev, &value, true, true) {
            return Ok(false);
        }
        let txn = Txn::new()
            .when([Compare::create_revision(key, CompareOp::Equal, rev)])
            .and_then([
                TxnOp::delete(key, None),
                TxnOp::delete(leader_info_key(key), None),
            ]);
        Ok(self.txn(txn).await?.succeeded())
    }
}
