//! Where Redis keeps holder info, against a private redis-server: inside
//! the stored owner of every kind of hold, written by the grant and
//! compared unchanged by renewals and releases; and what `list` reads
//! back. (The round trip through another client is the conformance
//! suite's, run by `integration-tests/tests/redis.rs`.)

// Test helpers: a failed spawn or command should abort the test loudly.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::Duration;

use distlock_core::{stored_owner, Backend, HoldKind, LockName, LockRequest};
use distlock_redis::RedisBackend;

#[path = "support/redis_server.rs"]
mod redis_server;
use redis_server::Server;

fn name(s: &str) -> LockName {
    LockName::new(s).unwrap()
}

fn request(n: &str, kind: HoldKind) -> LockRequest {
    let mut req = LockRequest::new(name(n), Duration::from_secs(30));
    req.kind = kind;
    req.with_holder_info(Some(Arc::from("web-3 pid 12: ./job --once")))
}

async fn query<T: redis::FromRedisValue>(
    raw: &mut redis::aio::MultiplexedConnection,
    args: &[&str],
) -> T {
    let mut cmd = redis::cmd(args[0]);
    for a in &args[1..] {
        cmd.arg(*a);
    }
    cmd.query_async(raw).await.unwrap()
}

#[tokio::test]
async fn every_hold_stores_its_holder_info_in_its_owner_and_keeps_working() {
    let server = Server::start();
    let url = format!("redis://127.0.0.1:{}", server.port);
    let b = RedisBackend::connect(&url).await.unwrap();
    let mut raw = redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();

    let lock = request("jobs/a", HoldKind::Exclusive);
    let shared = request("jobs/r", HoldKind::Shared);
    let permit = request("pools/db", HoldKind::Permits { limit: 2 });
    let mut leader = LockRequest::leader(name("services/api"), Duration::from_secs(30), "10.0.0.1");
    leader.holder_info = lock.holder_info.clone();
    for req in [&lock, &shared, &permit, &leader] {
        assert!(b.try_acquire(req).await.unwrap().is_some(), "{req:?}");
    }

    let stored = stored_owner(&lock);
    assert_eq!(stored, format!("{} web-3 pid 12: ./job --once", lock.owner));
    let value: String = query(&mut raw, &["GET", "jobs/a"]).await;
    assert_eq!(value, stored, "the lock key's value");
    let readers: Vec<String> = query(&mut raw, &["ZRANGE", "{jobs/r}:readers", "0", "-1"]).await;
    assert_eq!(readers, [stored_owner(&shared)], "the shared hold's member");
    let permits: Vec<String> =
        query(&mut raw, &["ZRANGE", "{pools/db}:semaphore", "0", "-1"]).await;
    assert_eq!(permits, [stored_owner(&permit)], "the permit's member");
    let owner: String = query(&mut raw, &["HGET", "{services/api}:election", "owner"]).await;
    assert_eq!(owner, stored_owner(&leader), "the leader hash's owner");

    let status = b.inspect(&name("jobs/a")).await.unwrap();
    assert_eq!(
        status.holder_info.as_deref(),
        Some("web-3 pid 12: ./job --once")
    );
    let l = b.leader(&name("services/api")).await.unwrap().unwrap();
    assert_eq!(l.holder_info.as_deref(), Some("web-3 pid 12: ./job --once"));

    let records = b.list("", 100).await.unwrap();
    let kinds: Vec<(&str, HoldKind)> = records.iter().map(|r| (r.name.as_str(), r.kind)).collect();
    assert_eq!(
        kinds,
        [
            ("jobs/a", HoldKind::Exclusive),
            ("jobs/r", HoldKind::Shared),
            ("pools/db", HoldKind::Permits { limit: 2 }),
            ("services/api", HoldKind::Leader),
        ]
    );
    assert!(records
        .iter()
        .all(|r| r.holder_info.as_deref() == Some("web-3 pid 12: ./job --once")));
    let first = b.list("jobs/", 1).await.unwrap();
    assert_eq!(first.len(), 1);
    assert_eq!(first[0].name, "jobs/a");

    // The same request renews and releases: it sends the same string.
    assert!(b
        .extend_many(&[lock.clone(), shared.clone(), permit.clone(), leader.clone()])
        .await
        .unwrap()
        .into_iter()
        .all(|renewed| renewed));
    assert!(b.proclaim(&leader, "10.0.0.2").await.unwrap());
    // A request without the holder info names another owner string.
    let bare = lock.clone().with_holder_info(None);
    assert!(!b.release(&bare).await.unwrap());
    for req in [&lock, &shared, &permit, &leader] {
        assert!(b.release(req).await.unwrap(), "{req:?}");
    }
    assert_eq!(b.list("", 100).await.unwrap(), []);
}
