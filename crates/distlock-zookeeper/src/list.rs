//! `list`: every live hold whose name starts with a prefix, found by
//! walking the znodes under the lock root.
//!
//! A lock's, election's or semaphore's node is `<base>/<name>`
//! (semaphores: `<base>/@semaphores/<name>`), so the walk starts at the
//! node of the prefix's last complete segment and goes down level by
//! level, listing the children of every node of a level in one multi-read
//! (of at most [`BATCH`] nodes). Then one multi-read fetches the data of
//! every holding node. A node only queued never appears: the holders are
//!
//! - of a lock: the first node in sequence order if it is exclusive, else
//!   the shared nodes ahead of the first exclusive one (Curator's rules);
//! - of an election: the `latch-` node with the lowest sequence (Curator's
//!   `LeaderLatch`), with its holder info from `<base>/@leaders/...`;
//! - of a semaphore: the children whose data says `held` and that were
//!   granted ([`ZooKeeperBackend::granted`]).
//!
//! Ephemeral nodes of an ended session are gone already; holds last as
//! long as their session, so no remaining time is reported.

use distlock_core::{HoldKind, HoldRecord, Result};
use zookeeper_client as zk;

use crate::semaphore::{permit_holder_info, permit_sequence};
use crate::ZooKeeperBackend;
use crate::{czxid_token, holder_info_of, in_queue_order, is_write, latch_sequence, parse_child};

/// Nodes per multi-read: about 60 KB each way for short names.
const BATCH: usize = 500;

/// A node of a name (a lock's, an election's or a semaphore's) and its
/// children.
struct Named {
    name: String,
    path: String,
    children: Vec<String>,
}

/// Whether `child` of a name's node is the next segment of a longer name,
/// not a hold's node or a distlock-internal node (names never contain `@`).
fn is_segment(child: &str) -> bool {
    parse_child(child).is_none() && latch_sequence(child).is_none() && !child.contains('@')
}

/// The holders among a lock node's children: the exclusive head alone,
/// or the shared nodes ahead of the first exclusive one.
fn lock_holders(children: &[String]) -> Vec<String> {
    let queue = in_queue_order(children.to_vec(), HoldKind::Exclusive);
    let holding = match queue.iter().position(|c| is_write(c)) {
        Some(0) => 1,
        Some(w) => w,
        None => queue.len(),
    };
    queue.into_iter().take(holding).collect()
}

/// One hold found, before its node's data is read.
struct Found {
    name: String,
    kind: HoldKind,
    path: String,
    /// A leader's holder info node.
    info_path: Option<String>,
    /// A permit child's place in its semaphore's queue, and the limit with
    /// the `mzxid` of its last write ([`ZooKeeperBackend::granted`]).
    permit: Option<(usize, Option<(u32, i64)>)>,
}

impl ZooKeeperBackend {
    /// The answers of one multi-read per [`BATCH`] of `paths`, each op made
    /// by `add`.
    async fn read_all(
        &self,
        client: &zk::Client,
        paths: &[String],
        add: fn(&mut zk::MultiReader<'_>, &str) -> std::result::Result<(), zk::Error>,
    ) -> Result<Vec<zk::MultiReadResult>> {
        let mut out = Vec::with_capacity(paths.len());
        for batch in paths.chunks(BATCH) {
            let mut reader = client.new_multi_reader();
            for p in batch {
                add(&mut reader, p).map_err(|e| self.err(e))?;
            }
            out.extend(reader.commit().await.map_err(|e| self.err(e))?);
        }
        Ok(out)
    }

    /// The children of each of `paths` (`None`: the node is gone).
    async fn children_of(
        &self,
        client: &zk::Client,
        paths: &[String],
    ) -> Result<Vec<Option<Vec<String>>>> {
        let answers = self
            .read_all(client, paths, |r, p| r.add_get_children(p))
            .await?;
        answers
            .into_iter()
            .map(|a| match a {
                zk::MultiReadResult::Children { children } => Ok(Some(children)),
                zk::MultiReadResult::Error {
                    err: zk::Error::NoNode,
                } => Ok(None),
                zk::MultiReadResult::Error { err } => Err(self.err(err)),
                _ => Ok(None),
            })
            .collect()
    }

    /// The data and stat of each of `paths` (`None`: the node is gone).
    async fn data_of(
        &self,
        client: &zk::Client,
        paths: &[String],
    ) -> Result<Vec<Option<(Vec<u8>, zk::Stat)>>> {
        let answers = self
            .read_all(client, paths, |r, p| r.add_get_data(p))
            .await?;
        answers
            .into_iter()
            .map(|a| match a {
                zk::MultiReadResult::Data { data, stat } => Ok(Some((data, stat))),
                zk::MultiReadResult::Error {
                    err: zk::Error::NoNode,
                } => Ok(None),
                zk::MultiReadResult::Error { err } => Err(self.err(err)),
                _ => Ok(None),
            })
            .collect()
    }

    /// Every node under `root` whose name (its path below `root`) starts
    /// with `prefix`, with its children, level by level.
    async fn walk(&self, client: &zk::Client, root: &str, prefix: &str) -> Result<Vec<Named>> {
        // Names under `dir` that start with `leaf`.
        let (dir, leaf) = prefix.rsplit_once('/').unwrap_or(("", prefix));
        let start = match dir {
            "" => root.to_string(),
            dir => format!("{root}/{dir}"),
        };
        let Some(Some(top)) = self
            .children_of(client, std::slice::from_ref(&start))
            .await?
            .pop()
        else {
            return Ok(Vec::new());
        };
        let mut level: Vec<(String, String)> = top
            .into_iter()
            .filter(|c| is_segment(c) && c.starts_with(leaf))
            .map(|c| {
                let name = match dir {
                    "" => c.clone(),
                    dir => format!("{dir}/{c}"),
                };
                (name, format!("{start}/{c}"))
            })
            .collect();
        let mut found = Vec::new();
        while !level.is_empty() {
            let paths: Vec<String> = level.iter().map(|(_, p)| p.clone()).collect();
            let answers = self.children_of(client, &paths).await?;
            let mut next = Vec::new();
            for ((name, path), children) in level.into_iter().zip(answers) {
                let Some(children) = children else { continue };
                next.extend(
                    children
                        .iter()
                        .filter(|c| is_segment(c))
                        .map(|c| (format!("{name}/{c}"), format!("{path}/{c}"))),
                );
                found.push(Named {
                    name,
                    path,
                    children,
                });
            }
            level = next;
        }
        Ok(found)
    }

    /// The lock holds and leaderships under `prefix`.
    fn lock_holds(&self, names: &[Named]) -> Vec<Found> {
        let mut found = Vec::new();
        for n in names {
            for child in lock_holders(&n.children) {
                let kind = if is_write(&child) {
                    HoldKind::Exclusive
                } else {
                    HoldKind::Shared
                };
                found.push(Found {
                    name: n.name.clone(),
                    kind,
                    path: format!("{}/{child}", n.path),
                    info_path: None,
                    permit: None,
                });
            }
            let latches = in_queue_order(n.children.clone(), HoldKind::Leader);
            if let Some(leader) = latches.first() {
                found.push(Found {
                    name: n.name.clone(),
                    kind: HoldKind::Leader,
                    path: format!("{}/{leader}", n.path),
                    info_path: self.leader_info_of(&n.path, leader),
                    permit: None,
                });
            }
        }
        found
    }

    /// The permits held under `prefix`: each semaphore's limit and permit
    /// children in one flight; the caller reads every child's data.
    async fn permit_holds(&self, client: &zk::Client, prefix: &str) -> Result<Vec<Found>> {
        let root = format!("{}/@semaphores", self.inner.base);
        let sems: Vec<Named> = self
            .walk(client, &root, prefix)
            .await?
            .into_iter()
            .filter(|n| n.children.iter().any(|c| c == "@permits"))
            .collect();
        let nodes: Vec<String> = sems.iter().map(|n| n.path.clone()).collect();
        let dirs: Vec<String> = nodes.iter().map(|p| format!("{p}/@permits")).collect();
        let (limits, permits) = tokio::join!(
            self.data_of(client, &nodes),
            self.children_of(client, &dirs)
        );
        let mut found = Vec::new();
        for ((sem, limit), (dir, permits)) in
            sems.iter().zip(limits?).zip(dirs.iter().zip(permits?))
        {
            let limit: Option<(u32, i64)> = limit.and_then(|(data, stat)| {
                Some((std::str::from_utf8(&data).ok()?.parse().ok()?, stat.mzxid))
            });
            let mut permits: Vec<(i64, String)> = permits
                .unwrap_or_default()
                .into_iter()
                .filter_map(|c| permit_sequence(&c).map(|s| (s, c)))
                .collect();
            permits.sort_unstable();
            found.extend(permits.into_iter().enumerate().map(|(at, (_, c))| Found {
                name: sem.name.clone(),
                kind: HoldKind::Permits {
                    limit: limit.map_or(0, |(l, _)| l),
                },
                path: format!("{dir}/{c}"),
                info_path: None,
                permit: Some((at, limit)),
            }));
        }
        Ok(found)
    }

    /// See [`Backend::list`](distlock_core::Backend::list) and the module
    /// documentation.
    pub(crate) async fn list_holds(&self, prefix: &str, limit: usize) -> Result<Vec<HoldRecord>> {
        let client = self.client().await?;
        let names = self.walk(&client, &self.inner.base, prefix).await?;
        let mut found = self.lock_holds(&names);
        found.extend(self.permit_holds(&client, prefix).await?);
        let mut paths: Vec<String> = found.iter().map(|f| f.path.clone()).collect();
        paths.extend(found.iter().filter_map(|f| f.info_path.clone()));
        let mut data = self.data_of(&client, &paths).await?.into_iter();
        let nodes: Vec<_> = data.by_ref().take(found.len()).collect();
        let mut records = Vec::new();
        for (f, node) in found.into_iter().zip(nodes) {
            let info = if f.info_path.is_some() {
                data.next().flatten().and_then(|(d, _)| holder_info_of(&d))
            } else {
                None
            };
            // Gone since the children were listed: released.
            let Some((data, stat)) = node else { continue };
            let record = HoldRecord::new(f.name, f.kind);
            records.push(match f.kind {
                HoldKind::Leader => record
                    .with_token(Some(czxid_token(stat.czxid)?))
                    .with_value(Some(String::from_utf8_lossy(&data).into_owned()))
                    .with_holder_info(info),
                HoldKind::Permits { .. }
                    if f.permit
                        .is_some_and(|(at, limit)| Self::granted(at, &data, &stat, limit)) =>
                {
                    record
                        // The write that granted it: its create, or the claim
                        // that rewrote it `held`.
                        .with_token(Some(czxid_token(stat.mzxid)?))
                        .with_holder_info(permit_holder_info(&data))
                }
                HoldKind::Permits { .. } => continue,
                _ => record
                    .with_token(Some(czxid_token(stat.czxid)?))
                    .with_holder_info(holder_info_of(&data)),
            });
        }
        distlock_core::sort_records(&mut records, limit);
        Ok(records)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MUTEX_MARKER;

    fn names(children: &[&str]) -> Vec<String> {
        children.iter().map(|c| c.to_string()).collect()
    }

    #[test]
    fn only_granted_lock_nodes_hold() {
        let u = "_c_0f0f0f0f-0000-0000-0000-000000000000";
        // A writer at the head holds alone.
        let q = names(&[
            &format!("{u}-__READ__0000000002"),
            &format!("{u}-{MUTEX_MARKER}0000000001"),
        ]);
        assert_eq!(lock_holders(&q), vec![q[1].clone()]);
        // Readers ahead of the first writer hold; the writer and the
        // reader behind it wait.
        let q = names(&[
            &format!("{u}-__READ__0000000003"),
            &format!("{u}-__WRIT__0000000002"),
            &format!("{u}-__READ__0000000001"),
        ]);
        assert_eq!(lock_holders(&q), vec![q[2].clone()]);
        assert!(lock_holders(&[]).is_empty());
    }

    #[test]
    fn segments_are_neither_holds_nor_internal_nodes() {
        assert!(is_segment("jobs"));
        assert!(is_segment("a-b.c:d_e"));
        assert!(is_segment("db-lock-1"));
        assert!(is_segment("x-latch-7"));
        assert!(!is_segment("@semaphores"));
        assert!(!is_segment("@permits"));
        assert!(!is_segment(
            "_c_x00000000000000000000000000000000000-lock-0000000001"
        ));
        assert!(!is_segment(
            "_c_x00000000000000000000000000000000000-latch-0000000001"
        ));
        assert!(!is_segment(
            "_c_x00000000000000000000000000000000000-__READ__0000000001"
        ));
    }
}
