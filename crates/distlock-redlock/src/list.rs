//! `list` over the nodes: each node finds and reads its holds as the Redis
//! backend does, and a hold is listed where as many nodes list it as a
//! grant of its kind needs.

use std::collections::{BTreeMap, BTreeSet};

use distlock_core::{
    sort_records, split_stored_owner, Error, HoldKind, HoldRecord, LockName, Result,
};
use distlock_redis::{ListedHold, LIST_BATCH};
use futures_util::future::join_all;
use tokio::time::timeout;

use crate::quorum::most_common;
use crate::RedlockBackend;

/// The kinds' order in a group's key; a permit's limit is left out, as
/// nodes may store different ones.
fn rank(kind: &HoldKind) -> u8 {
    match kind {
        HoldKind::Exclusive => 0,
        HoldKind::Shared => 1,
        HoldKind::Permits { .. } => 2,
        _ => 3,
    }
}

impl RedlockBackend {
    /// Every node `SCAN`s its whole keyspace for the names under `prefix`;
    /// the names any node found are then read on every node, in name
    /// order, a batch at a time, until `limit` records are in. A hold (one
    /// name, kind and stored owner) is listed where as many nodes list it
    /// as a grant of its kind needs (a majority; more for a semaphore of
    /// several permits), with the least lease left among them and the
    /// holder info its stored owner carries. With fencing, a lock's token
    /// is the highest those nodes report and a leader's the one its
    /// write-back settled (a leader none of them settled is a campaign
    /// still writing its token back, not listed); without fencing tokens
    /// are meaningless and none is reported. `QuorumNotReached` when too
    /// few nodes answer to tell.
    pub(crate) async fn list_holds(&self, prefix: &str, limit: usize) -> Result<Vec<HoldRecord>> {
        let t = self.connect_timeout();
        let found = join_all(self.inner.nodes.iter().map(|n| async move {
            // The SCAN itself is bounded by the connection's own timeout
            // per call: a large keyspace takes many calls.
            let r = timeout(t, n.redis()).await.ok()?.ok()?;
            r.hold_names(prefix).await.ok()
        }))
        .await;
        self.enough_answered(found.iter().flatten().count())?;
        let names: BTreeSet<LockName> = found.into_iter().flatten().flatten().collect();
        let names: Vec<LockName> = names.into_iter().collect();
        let mut records = Vec::new();
        for batch in names.chunks(LIST_BATCH) {
            let read = join_all(self.inner.nodes.iter().map(|n| async move {
                let r = timeout(t, n.redis()).await.ok()?.ok()?;
                r.holds_of(batch).await.ok()
            }))
            .await;
            let read: Vec<Vec<ListedHold>> = read.into_iter().flatten().collect();
            self.enough_answered(read.len())?;
            records.extend(self.agreed(read.iter().flatten()));
            if records.len() >= limit {
                break;
            }
        }
        sort_records(&mut records, limit);
        Ok(records)
    }

    /// `QuorumNotReached` unless a majority of the nodes answered.
    fn enough_answered(&self, answered: usize) -> Result<()> {
        let (quorum, total) = (self.quorum(&HoldKind::Exclusive), self.inner.nodes.len());
        if answered >= quorum {
            return Ok(());
        }
        Err(Error::QuorumNotReached {
            backend: "redlock",
            granted: answered,
            unreachable: total - answered,
            needed: quorum,
            total,
            hint:
                "too few nodes answered to tell which holds a majority lists; check the Redis nodes",
        })
    }

    /// The holds that enough nodes list alike, as records.
    fn agreed<'a>(&self, holds: impl Iterator<Item = &'a ListedHold>) -> Vec<HoldRecord> {
        let mut groups: BTreeMap<(&str, u8, &str), Vec<&ListedHold>> = BTreeMap::new();
        for h in holds {
            let key = (
                h.record.name.as_str(),
                rank(&h.record.kind),
                h.owner.as_str(),
            );
            groups.entry(key).or_default().push(h);
        }
        let fencing = self.inner.config.fencing;
        groups
            .into_values()
            .filter_map(|nodes| {
                let first = &nodes[0].record;
                let kind = match first.kind {
                    HoldKind::Permits { .. } => HoldKind::Permits {
                        limit: most_common(nodes.iter().filter_map(|h| match h.record.kind {
                            HoldKind::Permits { limit } => Some(limit),
                            _ => None,
                        }))
                        .unwrap_or(0),
                    },
                    other => other,
                };
                if nodes.len() < self.quorum(&kind) {
                    return None;
                }
                let token = match kind {
                    _ if !fencing => None,
                    HoldKind::Exclusive => nodes.iter().filter_map(|h| h.record.token).max(),
                    HoldKind::Leader => Some(
                        nodes
                            .iter()
                            .filter(|h| h.settled)
                            .filter_map(|h| h.record.token)
                            .max()?,
                    ),
                    _ => None,
                };
                let value = most_common(nodes.iter().filter_map(|h| h.record.value.as_deref()));
                let info = split_stored_owner(&nodes[0].owner).1;
                Some(
                    HoldRecord::new(first.name.clone(), kind)
                        .with_token(token)
                        .with_remaining(nodes.iter().filter_map(|h| h.record.remaining).min())
                        .with_holder_info(info.map(str::to_string))
                        .with_value(value.map(str::to_string)),
                )
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use distlock_core::FencingToken;

    const OWNER: &str = "0123abcd-0000-4000-8000-00000000cafe";

    fn held(name: &str, kind: HoldKind, owner: &str, token: u64, left_ms: u64) -> ListedHold {
        ListedHold {
            owner: owner.to_string(),
            settled: false,
            record: HoldRecord::new(name, kind)
                .with_token(Some(FencingToken(token)))
                .with_remaining(Some(std::time::Duration::from_millis(left_ms))),
        }
    }

    /// Three nodes nobody listens on, not connected: `agreed` asks no node.
    async fn three_nodes(query: &str) -> RedlockBackend {
        RedlockBackend::unconnected(
            &format!("redlock://127.0.0.1:1,127.0.0.1:2,127.0.0.1:3{query}"),
            crate::RedlockConfig::default(),
        )
        .await
        .unwrap()
    }

    #[tokio::test]
    async fn a_hold_is_listed_where_enough_nodes_list_the_same_owner() {
        let b = three_nodes("?fencing=true").await;
        let mine = format!("{OWNER} web-1 pid 7");
        let other = format!("{} web-2 pid 9", OWNER.replace('0', "1"));
        let permits = HoldKind::Permits { limit: 2 };
        let holds = [
            // A lock on two of three nodes: a majority.
            held("a", HoldKind::Exclusive, &mine, 4, 900),
            held("a", HoldKind::Exclusive, &mine, 5, 800),
            // A minority's leftover of a failed round.
            held("b", HoldKind::Exclusive, &other, 6, 900),
            // Two permits need all three nodes.
            held("p", permits, &mine, 0, 900),
            held("p", permits, &mine, 0, 900),
            held("p", permits, &other, 0, 900),
            held("p", permits, &other, 0, 900),
            held("p", permits, &other, 0, 700),
        ];
        let records = b.agreed(holds.iter());
        assert_eq!(records.len(), 2, "{records:#?}");
        let lock = &records[0];
        assert_eq!((lock.name.as_str(), lock.kind), ("a", HoldKind::Exclusive));
        assert_eq!(lock.token, Some(FencingToken(5)));
        assert_eq!(lock.remaining, Some(std::time::Duration::from_millis(800)));
        assert_eq!(lock.holder_info.as_deref(), Some("web-1 pid 7"));
        let permit = &records[1];
        assert_eq!((permit.name.as_str(), permit.kind), ("p", permits));
        assert_eq!(permit.holder_info.as_deref(), Some("web-2 pid 9"));
        assert_eq!(permit.token, None);
    }

    #[tokio::test]
    async fn a_leader_is_listed_with_its_settled_token_and_without_fencing_none() {
        let leader = |token, settled| {
            let mut h = held("e", HoldKind::Leader, OWNER, token, 900);
            h.settled = settled;
            h.record = h.record.with_value(Some("10.0.0.1".into()));
            h
        };
        let fenced = three_nodes("?fencing=true").await;
        let unsettled = [leader(3, false), leader(2, false)];
        assert_eq!(fenced.agreed(unsettled.iter()), []);
        let settled = [leader(7, true), leader(7, false)];
        let records = fenced.agreed(settled.iter());
        assert_eq!(records.len(), 1);
        assert_eq!(records[0].token, Some(FencingToken(7)));
        assert_eq!(records[0].value.as_deref(), Some("10.0.0.1"));
        assert_eq!(records[0].holder_info, None);
        let plain = three_nodes("").await;
        let records = plain.agreed(unsettled.iter());
        assert_eq!(records.len(), 1);
        assert_eq!(records[0].token, None);
    }
}
