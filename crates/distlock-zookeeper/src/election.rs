//! Elections ([`HoldKind::Leader`]) in Apache Curator's `LeaderLatch`
//! layout.
//!
//! A campaign is an ephemeral sequential child `_c_<owner>-latch-<seq>` of
//! the election's node `<base>/<name>` (the node a lock of that name uses),
//! in the session of its TTL, carrying the campaign's value as its data
//! (Curator's participant id). The leader is the `latch-` child with the
//! lowest sequence; each other campaigner watches its predecessor, so the
//! grant and wait logic is the exclusive lock's, on the queue of `latch-`
//! children only. The token is the leader node's `czxid`.
//!
//! A campaign's holder info is in the ephemeral node
//! `<base>/@leaders/<name>/<owner>`, created in the campaign's flight
//! (see [`ZooKeeperBackend::leader_info_path`]) and read in the flight of
//! each read of the leader's node; Curator's campaigns have none.

use std::time::Duration;

use distlock_core::{
    Error, HoldKind, InputKind, Leader, LeaderStream, LockName, LockRequest, Result,
};
use futures_util::StreamExt;
use zookeeper_client as zk;

use crate::{czxid_token, holder_info_of, in_queue_order, owner_in, ZooKeeperBackend};

/// How long an observer waits before reading again after a failed read.
const RETRY: Duration = Duration::from_millis(200);

/// A campaign node's data and `czxid`, and its holder info node's data,
/// as a leader.
fn leader_of(data: &[u8], czxid: i64, info: Option<Vec<u8>>) -> Result<Leader> {
    Ok(Leader::new(
        String::from_utf8_lossy(data).into_owned(),
        czxid_token(czxid)?,
    )
    .with_holder_info(info.and_then(|i| holder_info_of(&i))))
}

/// What an observer waits for before its next read.
enum Next {
    /// Nothing: read at once.
    Read,
    /// The watch its last read set.
    Watch(zk::OneshotWatcher),
    /// A pause after a failed read.
    Retry,
}

impl ZooKeeperBackend {
    /// The path of the holder info node of the campaign `child` of the
    /// election node `parent`, if the child's name carries an owner.
    pub(crate) fn leader_info_of(&self, parent: &str, child: &str) -> Option<String> {
        let name = parent.strip_prefix(&format!("{}/", self.inner.base))?;
        Some(self.leader_info_path(name, owner_in(child)?))
    }

    /// Reads the holder info node at `path` (none: `None`); the read is
    /// queued when this is called, so it goes in the flight of the
    /// requests made beside it.
    pub(crate) fn read_leader_info<'a>(
        client: &'a zk::Client,
        path: Option<&'a str>,
    ) -> impl std::future::Future<Output = Option<Vec<u8>>> + 'a {
        let read = path.map(|p| client.get_data(p));
        async move { read?.await.ok().map(|(data, _)| data) }
    }

    /// Writes `value` on `req`'s campaign node if the node is still there.
    /// Its name carries `req`'s owner, so no other campaign can have it;
    /// and while it exists nothing can get ahead of it (later nodes get
    /// higher sequences), so a granted campaign whose node exists leads.
    pub(crate) async fn proclaim_value(&self, req: &LockRequest, value: &str) -> Result<bool> {
        if req.kind != HoldKind::Leader {
            return Err(Error::invalid(
                InputKind::Config,
                format!(
                    "only an election's leadership can proclaim a value, not a {}",
                    req.kind
                ),
            ));
        }
        let Some((path, session)) = self.node_of(req) else {
            return Ok(false);
        };
        match session.set_data(&path, value.as_bytes(), None).await {
            Ok(_) => Ok(true),
            // Gone: evicted, or its session ended, and the node with it.
            Err(zk::Error::NoNode | zk::Error::SessionExpired | zk::Error::ClientClosed) => {
                Ok(false)
            }
            Err(e) => Err(self.err(e)),
        }
    }

    /// The data and `czxid` of the lowest `latch-` child of `name`'s node
    /// that still exists when read (Curator's `LeaderLatch.getLeader`
    /// skips vanished nodes the same way). The list is sent behind a
    /// `sync`, so it sees every write the ensemble's leader committed
    /// before the call, whichever server this session talks to.
    pub(crate) async fn current_leader(&self, name: &LockName) -> Result<Option<Leader>> {
        let client = self.client().await?;
        let parent = self.parent(name);
        // Both requests are queued in order when their futures are made:
        // one round trip.
        let (synced, listed) = tokio::join!(client.sync(&parent), client.list_children(&parent));
        match synced {
            Ok(()) | Err(zk::Error::NoNode) => {}
            Err(e) => return Err(self.err(e)),
        }
        let children = match listed {
            Ok(c) => c,
            Err(zk::Error::NoNode) => return Ok(None),
            Err(e) => return Err(self.err(e)),
        };
        for child in in_queue_order(children, HoldKind::Leader) {
            let info_path = self.leader_info_of(&parent, &child);
            let (read, info) = tokio::join!(
                client.get_data(&format!("{parent}/{child}")),
                Self::read_leader_info(&client, info_path.as_deref())
            );
            match read {
                Ok((data, stat)) => return Ok(Some(leader_of(&data, stat.czxid, info)?)),
                Err(zk::Error::NoNode) => continue,
                Err(e) => return Err(self.err(e)),
            }
        }
        Ok(None)
    }

    /// The leader now, and a watch that fires when it may have changed:
    /// on the leader's node (its deletion or a proclamation: no later
    /// campaign can get ahead of it), on the children when nobody leads,
    /// on the election's node when it does not exist. Each watch is set by
    /// the read that returns what it watches, so no change is missed.
    async fn leader_and_watch(&self, parent: &str) -> Result<(Option<Leader>, zk::OneshotWatcher)> {
        let client = self.client().await?;
        loop {
            let (children, children_changed) = match client.list_and_watch_children(parent).await {
                Ok(listed) => listed,
                Err(zk::Error::NoNode) => {
                    let (stat, created) = client
                        .check_and_watch_stat(parent)
                        .await
                        .map_err(|e| self.err(e))?;
                    if stat.is_some() {
                        // Created since the list: list again.
                        continue;
                    }
                    return Ok((None, created));
                }
                Err(e) => return Err(self.err(e)),
            };
            for child in in_queue_order(children, HoldKind::Leader) {
                let info_path = self.leader_info_of(parent, &child);
                let (read, info) = tokio::join!(
                    client.get_and_watch_data(&format!("{parent}/{child}")),
                    Self::read_leader_info(&client, info_path.as_deref())
                );
                match read {
                    Ok((data, stat, changed)) => {
                        return Ok((Some(leader_of(&data, stat.czxid, info)?), changed))
                    }
                    Err(zk::Error::NoNode) => continue,
                    Err(e) => return Err(self.err(e)),
                }
            }
            return Ok((None, children_changed));
        }
    }

    /// The leaders of `name`, notified: the current one, then one read
    /// after each watch fires. A failed read is reported and retried after
    /// [`RETRY`]; a watch ended by the observer's session ending is
    /// followed by a read on a new session.
    pub(crate) fn leaders(&self, name: &LockName) -> LeaderStream {
        let backend = self.clone();
        let parent = self.parent(name);
        futures_util::stream::unfold(Next::Read, move |next| {
            let (backend, parent) = (backend.clone(), parent.clone());
            async move {
                match next {
                    Next::Read => {}
                    // A node event, or the session's end (then the read
                    // below opens a new session).
                    Next::Watch(watch) => {
                        watch.changed().await;
                    }
                    Next::Retry => tokio::time::sleep(RETRY).await,
                }
                Some(match backend.leader_and_watch(&parent).await {
                    Ok((leader, watch)) => (Ok(leader), Next::Watch(watch)),
                    Err(e) => (Err(e), Next::Retry),
                })
            }
        })
        .boxed()
    }
}
