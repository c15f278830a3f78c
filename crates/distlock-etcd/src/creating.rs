//! Creates in flight, per lock name: a release of a name waits for the
//! creates of that name's key that are still on the wire, and for no other
//! name's.
//!
//! A create whose caller went away still lands on the server (it runs to
//! completion), and it would land after a release that ran ahead of it and
//! stay on the live lease. So every request that may create a lock's key
//! holds its name's shard shared while in flight, and a release takes the
//! shard exclusively before it looks for keys. Names map to a fixed set of
//! shards: two names in one shard only wait for each other, which costs
//! time, never correctness.

use std::hash::{BuildHasher, BuildHasherDefault, DefaultHasher};
use std::sync::Arc;

use tokio::sync::{OwnedRwLockReadGuard, RwLock};

/// Enough that 64 concurrent names rarely share one.
const SHARDS: usize = 256;

pub(crate) struct Creating {
    shards: Vec<Arc<RwLock<()>>>,
}

impl Default for Creating {
    fn default() -> Self {
        Self {
            shards: (0..SHARDS).map(|_| Arc::default()).collect(),
        }
    }
}

impl Creating {
    fn shard_of(name: &str) -> usize {
        // A fixed hasher: the shard only has to be the same for a name
        // within this process.
        let h = BuildHasherDefault::<DefaultHasher>::default().hash_one(name);
        (h % SHARDS as u64) as usize
    }

    /// Held while a request that may create the keys of `names` is in
    /// flight. Shards are taken in ascending order, so two multi-name
    /// creates never wait for each other in a cycle (a release takes one).
    pub(crate) async fn in_flight<'a>(
        &self,
        names: impl IntoIterator<Item = &'a str>,
    ) -> Vec<OwnedRwLockReadGuard<()>> {
        let mut shards: Vec<usize> = names.into_iter().map(Self::shard_of).collect();
        shards.sort_unstable();
        shards.dedup();
        let mut guards = Vec::with_capacity(shards.len());
        for s in shards {
            guards.push(self.shards[s].clone().read_owned().await);
        }
        guards
    }

    /// Waits until no create of `name`'s key sent before now is in flight.
    pub(crate) async fn settled(&self, name: &str) {
        drop(self.shards[Self::shard_of(name)].write().await);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn a_release_waits_for_its_names_create_only() {
        let c = Arc::new(Creating::default());
        let a = "jobs/a";
        // A name in another shard than `a`.
        let b = (0..)
            .map(|i| format!("jobs/b{i}"))
            .find(|n| Creating::shard_of(n) != Creating::shard_of(a))
            .expect("some name lands in another shard");
        let held = c.in_flight([a]).await;
        tokio::time::timeout(Duration::from_secs(1), c.settled(&b))
            .await
            .expect("another name's release waited for this create");
        let waiting = tokio::spawn({
            let c = c.clone();
            async move { c.settled(a).await }
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(
            !waiting.is_finished(),
            "the name's release ran ahead of its create"
        );
        drop(held);
        tokio::time::timeout(Duration::from_secs(1), waiting)
            .await
            .expect("the release did not go on once the create was done")
            .expect("the release task failed");
    }

    #[tokio::test]
    async fn a_create_of_several_names_holds_each() {
        let c = Arc::new(Creating::default());
        let names = ["x/1", "x/2", "x/3", "x/1"];
        let held = c.in_flight(names).await;
        for n in ["x/1", "x/2", "x/3"] {
            let blocked = tokio::time::timeout(Duration::from_millis(50), c.settled(n)).await;
            assert!(blocked.is_err(), "{n}'s release ran ahead of the create");
        }
        drop(held);
        for n in ["x/1", "x/2", "x/3"] {
            tokio::time::timeout(Duration::from_secs(1), c.settled(n))
                .await
                .expect("a release waited after the create was done");
        }
    }
}
