//! Local expiry of permits for backends whose server ends a permit only
//! with the session that carries it (an etcd lease, a ZooKeeper session).
//!
//! The session outlives any one permit, since the client keeps it alive: a
//! permit not extended within its own TTL has to be ended by the client.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

use crate::token::Owner;

/// When each granted permit ends unless extended, each watched by a task
/// that ends it once that moment has passed unextended.
#[derive(Debug, Default)]
pub struct PermitEnds {
    ends: Arc<Mutex<HashMap<Owner, End>>>,
}

/// One permit's end, and the task that watches it (stopped when the permit
/// is removed, so a released permit leaves no task asleep until its TTL).
#[derive(Debug)]
struct End {
    at: Instant,
    task: Option<tokio::task::AbortHandle>,
}

impl Drop for PermitEnds {
    fn drop(&mut self) {
        for end in self.lock().values() {
            if let Some(t) = &end.task {
                t.abort();
            }
        }
    }
}

impl PermitEnds {
    /// No permits.
    pub fn new() -> Self {
        Self::default()
    }

    /// Starts the TTL of `owner`'s permit just granted: unless extended, it
    /// ends `ttl` from now, when `expire` runs (once). Nothing runs if the
    /// permit is [removed](Self::remove) first or these ends are dropped.
    ///
    /// Counted from after the grant, so never before the holder's own
    /// deadline, which counts from before the request.
    pub fn start<F, Fut>(&self, owner: Owner, ttl: Duration, expire: F)
    where
        F: FnOnce() -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let end = Instant::now() + ttl;
        self.lock().insert(
            owner,
            End {
                at: end,
                task: None,
            },
        );
        let weak = Arc::downgrade(&self.ends);
        let task = tokio::spawn(async move {
            let mut at = end;
            loop {
                tokio::time::sleep_until(at).await;
                let Some(ends) = weak.upgrade() else { return };
                {
                    let mut ends = ends.lock().unwrap_or_else(PoisonError::into_inner);
                    match ends.get(&owner) {
                        None => return,
                        Some(end) if end.at > Instant::now() => {
                            at = end.at;
                            continue;
                        }
                        Some(_) => {
                            ends.remove(&owner);
                        }
                    }
                }
                // Boxed: this task lives as long as the permit, and its
                // future would otherwise be as large as the backend's whole
                // delete request, for every permit held.
                Box::pin(expire()).await;
                return;
            }
        });
        match self.lock().get_mut(&owner) {
            Some(e) if e.task.is_none() => e.task = Some(task.abort_handle()),
            _ => {}
        }
    }

    /// Moves the end of `owner`'s permit to `ttl` from now; `false` if it
    /// already ended here.
    ///
    /// Call it before asking the server whether the permit is held: the
    /// expiry task can then never end a permit that a concurrent extend has
    /// just vouched for, since once the task has taken the end out, this
    /// answers "not held" without asking.
    pub fn extend(&self, owner: &Owner, ttl: Duration) -> bool {
        let mut ends = self.lock();
        let Some(end) = ends.get_mut(owner) else {
            return false;
        };
        end.at = end.at.max(Instant::now() + ttl);
        true
    }

    /// Forgets `owner`'s permit, released by other means: its task stops
    /// without running `expire`.
    pub fn remove(&self, owner: &Owner) {
        if let Some(task) = self.lock().remove(owner).and_then(|e| e.task) {
            task.abort();
        }
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<Owner, End>> {
        self.ends.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};

    use super::*;

    fn counting(ends: &PermitEnds, owner: Owner, ttl: Duration) -> Arc<AtomicU32> {
        let ran = Arc::new(AtomicU32::new(0));
        let r = ran.clone();
        ends.start(owner, ttl, move || async move {
            r.fetch_add(1, Ordering::SeqCst);
        });
        ran
    }

    #[tokio::test(start_paused = true)]
    async fn unextended_permit_expires_once_after_its_ttl() {
        let ends = PermitEnds::new();
        let owner = Owner::random();
        let ran = counting(&ends, owner, Duration::from_secs(2));
        tokio::time::sleep(Duration::from_millis(1900)).await;
        assert_eq!(ran.load(Ordering::SeqCst), 0);
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(ran.load(Ordering::SeqCst), 1);
        assert!(!ends.extend(&owner, Duration::from_secs(2)));
    }

    #[tokio::test(start_paused = true)]
    async fn extended_permit_outlives_its_first_ttl() {
        let ends = PermitEnds::new();
        let owner = Owner::random();
        let ran = counting(&ends, owner, Duration::from_secs(2));
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(ends.extend(&owner, Duration::from_secs(2)));
        tokio::time::sleep(Duration::from_millis(1500)).await;
        assert_eq!(ran.load(Ordering::SeqCst), 0);
        tokio::time::sleep(Duration::from_millis(600)).await;
        assert_eq!(ran.load(Ordering::SeqCst), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_removed_permit_leaves_no_task_behind() {
        let ends = PermitEnds::new();
        let metrics = tokio::runtime::Handle::current().metrics();
        let before = metrics.num_alive_tasks();
        let owners: Vec<Owner> = (0..100).map(|_| Owner::random()).collect();
        for o in &owners {
            counting(&ends, *o, Duration::from_secs(3600));
        }
        assert_eq!(metrics.num_alive_tasks(), before + 100);
        for o in &owners {
            ends.remove(o);
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert_eq!(metrics.num_alive_tasks(), before);
    }

    #[tokio::test(start_paused = true)]
    async fn removed_permit_never_expires() {
        let ends = PermitEnds::new();
        let owner = Owner::random();
        let ran = counting(&ends, owner, Duration::from_secs(1));
        ends.remove(&owner);
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert_eq!(ran.load(Ordering::SeqCst), 0);
    }
}
