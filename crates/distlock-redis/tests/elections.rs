//! What is special to elections on Redis, against a private redis-server:
//! the leader hash's layout and expiry, a retried campaign, the fencing
//! counter, how a waiting campaign is woken, and how an observer is
//! notified. (The election semantics
//! themselves are the conformance suite's, run by
//! `integration-tests/tests/redis.rs`.)

// Test helpers: a failed spawn or command should abort the test loudly.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::time::Duration;

use distlock_core::{Backend, Leader, LeaderStream, LockName, LockRequest, Owner};
use distlock_redis::{RedisBackend, RedisConfig};
use futures_util::StreamExt;
use tokio::time::{sleep, Instant};

#[path = "support/redis_server.rs"]
mod redis_server;
use redis_server::Server;

impl Server {
    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    async fn raw(&self) -> redis::aio::MultiplexedConnection {
        redis::Client::open(self.url())
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap()
    }
}

fn name(s: &str) -> LockName {
    LockName::new(s).unwrap()
}

/// A fresh server and a backend connected to it.
async fn connected() -> (Server, RedisBackend) {
    let server = Server::start();
    let b = RedisBackend::connect(&server.url()).await.unwrap();
    (server, b)
}

async fn hash(raw: &mut redis::aio::MultiplexedConnection, key: &str) -> HashMap<String, String> {
    redis::cmd("HGETALL")
        .arg(key)
        .query_async(raw)
        .await
        .unwrap()
}

async fn pttl(raw: &mut redis::aio::MultiplexedConnection, key: &str) -> i64 {
    redis::cmd("PTTL").arg(key).query_async(raw).await.unwrap()
}

async fn get(raw: &mut redis::aio::MultiplexedConnection, key: &str) -> Option<String> {
    redis::cmd("GET").arg(key).query_async(raw).await.unwrap()
}

#[tokio::test]
async fn the_leader_hash_holds_the_campaign_and_expires_with_its_ttl() {
    let (server, b) = connected().await;
    let election = name("services/api");
    let keys = b.election_keys(&election);
    let ttl = Duration::from_millis(800);
    let req = LockRequest::leader(election.clone(), ttl, "10.0.0.1:8080");
    let asked = Instant::now();
    let grant = b.try_acquire(&req).await.unwrap().expect("nobody led");
    assert_eq!(grant.token.get(), 1);

    let mut raw = server.raw().await;
    let stored = hash(&mut raw, &keys.leader).await;
    let want: HashMap<String, String> = [
        ("owner", req.owner.to_string()),
        ("value", "10.0.0.1:8080".to_string()),
        ("token", "1".to_string()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    assert_eq!(stored, want, "the leader hash");
    let left = pttl(&mut raw, &keys.leader).await;
    // Plus 2 ms for the server's and this clock's millisecond steps.
    let since = asked.elapsed().as_millis() as i64 + 2;
    assert!(
        (800 - since..=800).contains(&left),
        "the leader hash expires in {left} ms ({since} ms after the request), not with the 800 ms lease"
    );
    assert_eq!(get(&mut raw, &keys.fence).await.as_deref(), Some("1"));

    let leader = b.leader(&election).await.unwrap().expect("a leader");
    assert_eq!(leader.value, "10.0.0.1:8080");
    assert_eq!(leader.token.get(), 1);
    let remaining = leader.remaining.expect("the leader's remaining lease");
    assert!(remaining <= ttl, "{remaining:?}");

    sleep(Duration::from_millis(1000)).await;
    let exists: i64 = redis::cmd("EXISTS")
        .arg(&keys.leader)
        .query_async(&mut raw)
        .await
        .unwrap();
    assert_eq!(exists, 0, "the vanished leader outlived its TTL");
    assert_eq!(b.leader(&election).await.unwrap(), None);
    assert!(
        !b.extend(&req).await.unwrap(),
        "an expired leadership was renewed"
    );
    assert_eq!(
        get(&mut raw, &keys.fence).await.as_deref(),
        Some("1"),
        "the fencing counter went with the leadership"
    );
    let next = LockRequest::leader(election.clone(), ttl, "10.0.0.2:8080");
    assert_eq!(
        b.try_acquire(&next).await.unwrap().map(|g| g.token.get()),
        Some(2),
        "the counter restarted"
    );
}

#[tokio::test]
async fn the_same_owner_asking_again_keeps_one_leadership_and_its_token() {
    let (server, b) = connected().await;
    let election = name("services/retried");
    let keys = b.election_keys(&election);
    let req = LockRequest::leader(election.clone(), Duration::from_secs(2), "first");
    let first = b.try_acquire(&req).await.unwrap().unwrap();
    assert!(b.proclaim(&req, "proclaimed").await.unwrap());
    // A retry after a lost reply, asking for a longer lease.
    let again = b
        .try_acquire(&req.with_ttl(Duration::from_secs(60)))
        .await
        .unwrap()
        .expect("the leader's own retry was refused");
    assert_eq!(again.token, first.token, "a retry took a second token");
    let mut raw = server.raw().await;
    assert_eq!(
        get(&mut raw, &keys.fence).await.as_deref(),
        Some("1"),
        "a retry moved the fencing counter"
    );
    let stored = hash(&mut raw, &keys.leader).await;
    assert_eq!(stored.get("owner"), Some(&req.owner.to_string()));
    assert_eq!(stored.get("value").map(String::as_str), Some("proclaimed"));
    assert!(
        pttl(&mut raw, &keys.leader).await > 50_000,
        "a retry did not renew the leadership"
    );
    let other = LockRequest::leader(election.clone(), Duration::from_secs(2), "other");
    assert!(b.try_acquire(&other).await.unwrap().is_none());
    assert!(b.release(&req).await.unwrap());
    assert!(!b.release(&req).await.unwrap(), "resigned twice");
}

#[tokio::test]
async fn only_the_leader_proclaims_renews_or_resigns_and_eviction_keeps_the_counter() {
    let (server, b) = connected().await;
    let election = name("services/owned");
    let keys = b.election_keys(&election);
    let req = LockRequest::leader(election.clone(), Duration::from_secs(30), "mine");
    b.try_acquire(&req).await.unwrap().unwrap();
    let mut foreign = req.clone();
    foreign.owner = Owner::random();
    assert!(!b.proclaim(&foreign, "theirs").await.unwrap());
    assert!(!b.extend(&foreign).await.unwrap());
    assert!(!b.release(&foreign).await.unwrap());
    assert_eq!(
        b.leader(&election).await.unwrap().map(|l| l.value),
        Some("mine".to_string())
    );
    assert!(b.evict(&election).await.unwrap(), "nothing evicted");
    assert!(!b.evict(&election).await.unwrap(), "evicted a leader twice");
    assert!(!b.proclaim(&req, "mine-again").await.unwrap());
    assert!(!b.extend(&req).await.unwrap());
    assert_eq!(b.leader(&election).await.unwrap(), None);
    let mut raw = server.raw().await;
    assert_eq!(get(&mut raw, &keys.fence).await.as_deref(), Some("1"));
}

#[tokio::test]
async fn an_election_a_lock_and_a_semaphore_of_one_name_do_not_contend() {
    let (_server, b) = connected().await;
    let all = name("pools/one-name");
    let ttl = Duration::from_secs(5);
    let lock = LockRequest::new(all.clone(), ttl);
    let permit = LockRequest::permit(all.clone(), ttl, 1);
    let leader = LockRequest::leader(all.clone(), ttl, "v");
    assert!(b.try_acquire(&lock).await.unwrap().is_some());
    assert!(b.try_acquire(&permit).await.unwrap().is_some());
    assert_eq!(
        b.try_acquire(&leader).await.unwrap().map(|g| g.token.get()),
        Some(1),
        "the lock or the semaphore blocked the election, or shares its counter"
    );
    assert!(b.release(&leader).await.unwrap());
    assert!(
        b.inspect(&all).await.unwrap().held,
        "resigning freed the lock"
    );
    assert!(b.release(&lock).await.unwrap());
    assert_eq!(b.leader(&all).await.unwrap(), None);
}

#[tokio::test]
async fn a_mixed_renewal_batch_renews_leaderships_beside_locks() {
    let (server, b) = connected().await;
    let ttl = Duration::from_secs(2);
    let lock = LockRequest::new(name("batch/lock"), ttl);
    let leader = LockRequest::leader(name("batch/election"), ttl, "v");
    let resigned = LockRequest::leader(name("batch/resigned"), ttl, "v");
    for r in [&lock, &leader, &resigned] {
        b.try_acquire(r).await.unwrap().unwrap();
    }
    assert!(b.release(&resigned).await.unwrap());
    let batch: Vec<LockRequest> = [&leader, &lock, &resigned]
        .iter()
        .map(|r| r.with_ttl(Duration::from_secs(60)))
        .collect();
    assert!(b.capabilities().extend_batch > 1);
    assert!(b.capabilities().elections);
    assert_eq!(b.extend_many(&batch).await.unwrap(), [true, true, false]);
    let mut raw = server.raw().await;
    let left = pttl(&mut raw, &b.election_keys(&leader.name).leader).await;
    assert!(left > 50_000, "the leadership was not renewed: {left} ms");
}

#[tokio::test]
async fn a_waiting_campaign_is_woken_by_a_resignation_not_the_leaders_expiry() {
    let server = Server::start();
    let leader = RedisBackend::connect(&server.url()).await.unwrap();
    let campaigner = RedisBackend::connect(&server.url()).await.unwrap();
    let election = name("services/handover");
    let held = LockRequest::leader(election.clone(), Duration::from_secs(30), "a");
    leader.try_acquire(&held).await.unwrap().unwrap();
    let next = LockRequest::leader(election.clone(), Duration::from_secs(30), "b");
    let deadline = Instant::now() + Duration::from_secs(20);
    let waiting = tokio::spawn(async move {
        let got = campaigner.acquire(&next, Some(deadline)).await;
        (campaigner, next, got)
    });
    sleep(Duration::from_millis(500)).await;
    assert!(!waiting.is_finished(), "elected beside a live leader");
    let resigned = Instant::now();
    assert!(leader.release(&held).await.unwrap());
    let (campaigner, next, got) = waiting.await.unwrap();
    let grant = got.expect("the campaign was not elected after the resignation");
    let took = resigned.elapsed();
    assert!(
        took < Duration::from_secs(10),
        "elected {took:?} after the resignation: woken by the 30 s expiry, not the message"
    );
    assert_eq!(grant.token.get(), 2);
    assert_eq!(
        campaigner.leader(&election).await.unwrap().map(|l| l.value),
        Some("b".to_string())
    );
    assert!(campaigner.release(&next).await.unwrap());
}

/// The next item of `leaders` that differs from `last` (a value, or
/// nobody), within `within`.
async fn next_change(
    leaders: &mut LeaderStream,
    last: &Option<String>,
    within: Duration,
) -> Option<String> {
    let change = async {
        loop {
            let item = leaders.next().await.expect("the observer ended");
            let now = item.expect("the observer failed").map(|l: Leader| l.value);
            if &now != last {
                return now;
            }
        }
    };
    tokio::time::timeout(within, change)
        .await
        .unwrap_or_else(|_| panic!("no change from {last:?} within {within:?}"))
}

#[tokio::test]
async fn an_observer_is_notified_of_each_grant_resignation_value_and_eviction() {
    let server = Server::start();
    // A recheck and leases far longer than the bound below: only the
    // election's channel can tell the observer in time.
    let quiet = RedisConfig::default().with_observe_recheck(Duration::from_secs(60));
    let observer = RedisBackend::connect_with(&server.url(), quiet)
        .await
        .unwrap();
    let b = RedisBackend::connect(&server.url()).await.unwrap();
    let election = name("services/observed");
    let bound = Duration::from_secs(5);
    let mut leaders = observer
        .observe_leader(&election)
        .await
        .unwrap()
        .expect("Redis observes by notification");
    let first = leaders.next().await.unwrap().unwrap();
    assert!(first.is_none(), "a leader before any campaign: {first:?}");

    // A grant after the observer read nobody.
    let ttl = Duration::from_secs(30);
    let a = LockRequest::leader(election.clone(), ttl, "a1");
    let granted = b.try_acquire(&a).await.unwrap().expect("nobody led");
    let seen = next_change(&mut leaders, &None, bound).await;
    assert_eq!(seen.as_deref(), Some("a1"));
    let mut raw = server.raw().await;
    let token: Option<String> = redis::cmd("HGET")
        .arg(b.election_keys(&election).leader)
        .arg("token")
        .query_async(&mut raw)
        .await
        .unwrap();
    assert_eq!(token, Some(granted.token.get().to_string()));

    assert!(b.proclaim(&a, "a2").await.unwrap());
    let seen = next_change(&mut leaders, &seen, bound).await;
    assert_eq!(seen.as_deref(), Some("a2"));

    assert!(b.release(&a).await.unwrap());
    let seen = next_change(&mut leaders, &seen, bound).await;
    assert_eq!(seen, None, "the resignation was not seen");

    let next = LockRequest::leader(election.clone(), ttl, "b1");
    b.try_acquire(&next).await.unwrap().expect("nobody led");
    let seen = next_change(&mut leaders, &seen, bound).await;
    assert_eq!(seen.as_deref(), Some("b1"));

    assert!(b.evict(&election).await.unwrap());
    let seen = next_change(&mut leaders, &seen, bound).await;
    assert_eq!(seen, None, "the eviction was not seen");
}

#[tokio::test]
async fn an_observer_sees_the_end_of_an_expired_lease_without_a_message() {
    let (server, b) = connected().await;
    // Only the lease's end (2 s) can wake the observer within the bound.
    let quiet = RedisConfig::default().with_observe_recheck(Duration::from_secs(60));
    let observer = RedisBackend::connect_with(&server.url(), quiet)
        .await
        .unwrap();
    let election = name("services/expiring");
    let req = LockRequest::leader(election.clone(), Duration::from_secs(2), "short");
    b.try_acquire(&req).await.unwrap().expect("nobody led");
    let mut leaders = observer.observe_leader(&election).await.unwrap().unwrap();
    let first = leaders.next().await.unwrap().unwrap().map(|l| l.value);
    assert_eq!(first.as_deref(), Some("short"));
    let seen = next_change(&mut leaders, &first, Duration::from_secs(10)).await;
    assert_eq!(seen, None, "the expired leader was still reported");
}

#[tokio::test]
async fn dropping_an_observer_unsubscribes() {
    let (server, b) = connected().await;
    let election = name("services/dropped");
    let channel = b.election_keys(&election).channel;
    let mut raw = server.raw().await;
    let subscribers = |raw: &mut redis::aio::MultiplexedConnection| {
        let cmd = redis::cmd("PUBSUB").arg("NUMSUB").arg(&channel).clone();
        let mut raw = raw.clone();
        async move {
            let (_, n): (String, i64) = cmd.query_async(&mut raw).await.unwrap();
            n
        }
    };
    let mut leaders = b.observe_leader(&election).await.unwrap().unwrap();
    assert!(leaders.next().await.unwrap().unwrap().is_none());
    assert_eq!(subscribers(&mut raw).await, 1, "subscribed before the read");
    drop(leaders);
    // A subscription lingers 2 s after its last user is gone (a waiter
    // that comes back soon finds it), so the bound is that and a margin.
    let start = Instant::now();
    while subscribers(&mut raw).await != 0 {
        assert!(
            start.elapsed() < Duration::from_secs(6),
            "still subscribed 6 s after the observer was dropped"
        );
        sleep(Duration::from_millis(10)).await;
    }
}
