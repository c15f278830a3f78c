//! What is special to semaphores on Redlock, against five private
//! redis-servers: the quorum a semaphore of several permits needs, and how
//! nodes that disagree are counted. (The semaphore semantics themselves are
//! the conformance suite's, run by `integration-tests/tests/redlock.rs`.)

// Test helpers: a failed spawn or command should abort the test loudly.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use distlock_core::{Backend, Error, LockName, LockRequest};
use distlock_redis::RedisBackend;
use distlock_redlock::RedlockBackend;

#[path = "../../distlock-redis/tests/support/redis_server.rs"]
mod redis_server;
use redis_server::Server;

impl Server {
    async fn node(&self) -> RedisBackend {
        RedisBackend::connect(&format!("redis://127.0.0.1:{}", self.port))
            .await
            .unwrap()
    }

    /// Whether this node alone grants `req`.
    async fn grants(&self, req: &LockRequest) -> bool {
        self.node().await.try_acquire(req).await.unwrap().is_some()
    }
}

fn five() -> Vec<Server> {
    (0..5).map(|_| Server::start()).collect()
}

async fn redlock(servers: &[Server]) -> RedlockBackend {
    let hosts: Vec<String> = servers
        .iter()
        .map(|s| format!("127.0.0.1:{}", s.port))
        .collect();
    RedlockBackend::connect(&format!(
        "redlock://{}?node_timeout_ms=250",
        hosts.join(",")
    ))
    .await
    .unwrap()
}

fn name(s: &str) -> LockName {
    LockName::new(s).unwrap()
}

const TTL: Duration = Duration::from_secs(10);

#[tokio::test]
async fn a_semaphore_of_several_permits_tolerates_fewer_nodes_down_than_a_lock() {
    let mut servers = five();
    let b = redlock(&servers).await;
    drop(servers.pop());
    // 2 permits need 4 of 5 nodes, 4 permits all 5, a lock 3.
    let two = LockRequest::permit(name("pools/two"), TTL, 2);
    assert!(
        b.try_acquire(&two).await.unwrap().is_some(),
        "2 permits with 4 of 5 nodes up"
    );
    let four = LockRequest::permit(name("pools/four"), TTL, 4);
    match b.try_acquire(&four).await {
        Err(Error::QuorumNotReached {
            needed: 5,
            total: 5,
            unreachable: 1,
            ..
        }) => {}
        other => panic!("4 permits with a node down gave {other:?}"),
    }
    drop(servers.pop());
    let two = LockRequest::permit(name("pools/two-again"), TTL, 2);
    assert!(matches!(
        b.try_acquire(&two).await,
        Err(Error::QuorumNotReached { needed: 4, .. })
    ));
    let lock = LockRequest::new(name("pools/lock"), TTL);
    assert!(
        b.try_acquire(&lock).await.unwrap().is_some(),
        "a lock with 3 of 5 nodes up"
    );
}

#[tokio::test]
async fn a_permit_counts_only_where_a_grant_quorum_lists_it() {
    let servers = five();
    let b = redlock(&servers).await;
    let sem = name("pools/partial");
    // A permit on a bare majority, as a majority-quorum semaphore would
    // grant it: for 2 permits on 5 nodes that is not a holder.
    let partial = LockRequest::permit(sem.clone(), TTL, 2);
    for s in &servers[..3] {
        assert!(s.grants(&partial).await);
    }
    let status = b.inspect_permits(&sem).await.unwrap();
    assert_eq!((status.holders, status.limit), (Some(0), Some(2)));
    assert!(servers[3].grants(&partial).await);
    assert_eq!(b.inspect_permits(&sem).await.unwrap().holders, Some(1));
    assert!(b.release(&partial).await.unwrap());
}

#[tokio::test]
async fn a_limit_only_a_minority_stores_is_outvoted_and_one_too_many_nodes_refuse() {
    let servers = five();
    let b = redlock(&servers).await;
    let sem = name("pools/drifted");
    servers[0].node().await.set_limit(&sem, 3).await.unwrap();
    let req = LockRequest::permit(sem.clone(), TTL, 2);
    assert!(
        b.try_acquire(&req).await.unwrap().is_some(),
        "4 nodes storing 2 of 5 grant a permit of 2"
    );
    assert!(b.release(&req).await.unwrap());
    servers[1].node().await.set_limit(&sem, 3).await.unwrap();
    match b.try_acquire(&req).await {
        Err(Error::LimitMismatch {
            requested: 2,
            stored: 3,
            ..
        }) => {}
        other => panic!("2 of 5 nodes storing another limit gave {other:?}"),
    }
    // set_limit reaches every node, so the limit agrees again.
    assert_eq!(b.set_limit(&sem, 2).await.unwrap(), Some(2));
    assert!(b.try_acquire(&req).await.unwrap().is_some());
}
