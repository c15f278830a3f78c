//! What is special to semaphores on Redis, against a private redis-server:
//! the key layout and its expiry, and how waiters of one client are woken.
//! (The semaphore semantics themselves are the conformance suite's, run by
//! `integration-tests/tests/redis.rs`.)

// Test helpers: a failed spawn or command should abort the test loudly.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::Duration;

use distlock_core::{Backend, Error, LockName, LockRequest};
use distlock_redis::RedisBackend;
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

    /// How many script calls (EVALSHA and EVAL) the server has run.
    async fn script_calls(&self) -> u64 {
        let info: String = redis::cmd("INFO")
            .arg("commandstats")
            .query_async(&mut self.raw().await)
            .await
            .unwrap();
        info.lines()
            .filter(|l| l.starts_with("cmdstat_evalsha:") || l.starts_with("cmdstat_eval:"))
            .filter_map(|l| {
                l.split("calls=")
                    .nth(1)?
                    .split(',')
                    .next()?
                    .parse::<u64>()
                    .ok()
            })
            .sum()
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

#[tokio::test]
async fn a_shorter_permit_does_not_shorten_the_permit_set() {
    let (server, b) = connected().await;
    let sem = name("jobs/shorter-after-longer");
    let keys = b.semaphore_keys(&sem);
    let long = LockRequest::permit(sem.clone(), Duration::from_secs(60), 2);
    let short = LockRequest::permit(sem.clone(), Duration::from_millis(300), 2);
    assert!(b.try_acquire(&long).await.unwrap().is_some());
    assert!(b.try_acquire(&short).await.unwrap().is_some());
    let mut raw = server.raw().await;
    let pttl: i64 = redis::cmd("PTTL")
        .arg(&keys.permits)
        .query_async(&mut raw)
        .await
        .unwrap();
    assert!(
        pttl > 50_000,
        "a 300 ms permit cut the set holding a 60 s permit to {pttl} ms"
    );
}

#[tokio::test]
async fn abandoned_permits_leave_with_their_longest_permit_and_the_counter_stays() {
    let (server, b) = connected().await;
    let sem = name("jobs/abandoned");
    let keys = b.semaphore_keys(&sem);
    let short = LockRequest::permit(sem.clone(), Duration::from_millis(300), 2);
    let long = LockRequest::permit(sem.clone(), Duration::from_millis(800), 2);
    assert_eq!(
        b.try_acquire(&short).await.unwrap().map(|g| g.token.get()),
        Some(1)
    );
    let asked = Instant::now();
    assert_eq!(
        b.try_acquire(&long).await.unwrap().map(|g| g.token.get()),
        Some(2)
    );
    let mut raw = server.raw().await;
    let pttl: i64 = redis::cmd("PTTL")
        .arg(&keys.permits)
        .query_async(&mut raw)
        .await
        .unwrap();
    // Less whatever time passed since the request, and 2 ms for the
    // server's and this clock's millisecond steps (the 300 ms permit's end
    // is far below that).
    let since = asked.elapsed().as_millis() as i64 + 2;
    assert!(
        (800 - since..=800).contains(&pttl) && pttl > 300,
        "the permit set expires in {pttl} ms ({since} ms after the request), not with its 800 ms permit"
    );
    sleep(Duration::from_millis(900)).await;
    let exists: i64 = redis::cmd("EXISTS")
        .arg(&keys.permits)
        .query_async(&mut raw)
        .await
        .unwrap();
    assert_eq!(exists, 0, "the abandoned permits outlived their TTLs");
    let (limit, fence): (Option<String>, Option<String>) = redis::pipe()
        .cmd("GET")
        .arg(&keys.limit)
        .cmd("GET")
        .arg(&keys.fence)
        .query_async(&mut raw)
        .await
        .unwrap();
    assert_eq!((limit.as_deref(), fence.as_deref()), (Some("2"), Some("2")));
    let next = LockRequest::permit(sem.clone(), Duration::from_secs(5), 2);
    assert_eq!(
        b.try_acquire(&next).await.unwrap().map(|g| g.token.get()),
        Some(3),
        "the counter restarted"
    );
}

#[tokio::test]
async fn a_lock_and_a_semaphore_of_one_name_do_not_contend() {
    let (_server, b) = connected().await;
    let both = name("pools/db");
    let lock = LockRequest::new(both.clone(), Duration::from_secs(5));
    let permit = LockRequest::permit(both.clone(), Duration::from_secs(5), 1);
    assert!(b.try_acquire(&lock).await.unwrap().is_some());
    assert!(
        b.try_acquire(&permit).await.unwrap().is_some(),
        "the lock blocked the semaphore"
    );
    assert!(b.inspect(&both).await.unwrap().held);
    assert_eq!(b.inspect_permits(&both).await.unwrap().holders, Some(1));
    assert!(b.release(&permit).await.unwrap());
    assert!(
        b.inspect(&both).await.unwrap().held,
        "releasing the permit freed the lock"
    );
    assert!(b.release(&lock).await.unwrap());
}

#[tokio::test]
async fn the_same_owner_asking_again_takes_no_second_permit() {
    let (_server, b) = connected().await;
    let sem = name("jobs/retried");
    let req = LockRequest::permit(sem.clone(), Duration::from_secs(5), 2);
    let first = b.try_acquire(&req).await.unwrap().unwrap();
    let again = b.try_acquire(&req).await.unwrap().unwrap();
    assert!(again.token > first.token);
    assert_eq!(b.inspect_permits(&sem).await.unwrap().holders, Some(1));
    assert!(b.release(&req).await.unwrap());
    assert!(!b.release(&req).await.unwrap());
}

#[tokio::test]
async fn a_limit_of_zero_is_invalid_input() {
    let (_server, b) = connected().await;
    let sem = name("jobs/zero");
    let req = LockRequest::permit(sem.clone(), Duration::from_secs(5), 0);
    assert!(matches!(
        b.try_acquire(&req).await,
        Err(Error::InvalidInput { .. })
    ));
    assert!(matches!(
        b.set_limit(&sem, 0).await,
        Err(Error::InvalidInput { .. })
    ));
    assert_eq!(
        b.inspect_permits(&sem).await.unwrap().limit,
        None,
        "a refused limit was stored"
    );
}

#[tokio::test]
async fn a_freed_permit_wakes_one_waiter_of_a_client_and_a_changed_limit_wakes_all() {
    const WAITERS: usize = 4;
    let server = Server::start();
    let holder = RedisBackend::connect(&server.url()).await.unwrap();
    // Backend::acquire itself, without LockClient's coalescing in front:
    // four waiters of one client on the server at once.
    let waiters = Arc::new(RedisBackend::connect(&server.url()).await.unwrap());
    let sem = name("jobs/wake-one");
    // Loads the release script first: a first EVALSHA answered NOSCRIPT
    // and sent again as EVAL would count as two calls below.
    let warm_up = LockRequest::permit(name("jobs/warm-up"), Duration::from_secs(30), 1);
    holder.try_acquire(&warm_up).await.unwrap().unwrap();
    holder.release(&warm_up).await.unwrap();
    let held = LockRequest::permit(sem.clone(), Duration::from_secs(30), 1);
    holder.try_acquire(&held).await.unwrap().unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let (tx, mut granted) = tokio::sync::mpsc::unbounded_channel();
    for _ in 0..WAITERS {
        let (w, sem, tx) = (waiters.clone(), sem.clone(), tx.clone());
        tokio::spawn(async move {
            let req = LockRequest::permit(sem, Duration::from_secs(30), 1);
            let got = w.acquire(&req, Some(deadline)).await;
            let _ = tx.send((req, got));
        });
    }
    sleep(Duration::from_millis(500)).await;
    let before = server.script_calls().await;
    assert!(holder.release(&held).await.unwrap());
    let (first, got) = granted.recv().await.unwrap();
    got.unwrap();
    sleep(Duration::from_millis(300)).await;
    let woken = server.script_calls().await - before - 1;
    assert_eq!(woken, 1, "one freed permit made {woken} waiters try again");

    // A changed limit wakes every waiter at once, not at the 30 s expiry:
    // here each learns that it asks for a limit no longer stored.
    assert!(first.owner != held.owner);
    waiters.set_limit(&sem, 3).await.unwrap();
    for _ in 1..WAITERS {
        let (_, got) = tokio::time::timeout(Duration::from_secs(2), granted.recv())
            .await
            .expect("a changed limit left waiters asleep")
            .unwrap();
        assert!(
            matches!(
                got,
                Err(Error::LimitMismatch {
                    requested: 1,
                    stored: 3,
                    ..
                })
            ),
            "{got:?}"
        );
    }
}

/// When the pub/sub connection ends (here the server kills it, as a
/// restart or a failover would), every waiting request of the client, for a
/// permit or for a lock, tries again at once rather than at the holder's
/// expiry 30 s later, and keeps waiting; a release then still reaches them.
#[tokio::test]
async fn a_lost_pubsub_connection_wakes_every_waiter() {
    const WAITERS: usize = 3;
    let server = Server::start();
    let holder = RedisBackend::connect(&server.url()).await.unwrap();
    let waiters = Arc::new(RedisBackend::connect(&server.url()).await.unwrap());
    let ttl = Duration::from_secs(30);
    let permit = LockRequest::permit(name("jobs/pubsub-permit"), ttl, 1);
    let lock = LockRequest::new(name("jobs/pubsub-lock"), ttl);
    for held in [&permit, &lock] {
        holder.try_acquire(held).await.unwrap().unwrap();
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    let (tx, mut granted) = tokio::sync::mpsc::unbounded_channel();
    for i in 0..2 * WAITERS {
        let (w, tx) = (waiters.clone(), tx.clone());
        let req = if i < WAITERS {
            LockRequest::permit(permit.name.clone(), ttl, 1)
        } else {
            LockRequest::new(lock.name.clone(), ttl)
        };
        tokio::spawn(async move {
            let got = w.acquire(&req, Some(deadline)).await;
            let _ = tx.send((req, got));
        });
    }
    // Every waiter has subscribed and tried again: the calls stop rising.
    let mut before = server.script_calls().await;
    loop {
        sleep(Duration::from_millis(300)).await;
        let now = server.script_calls().await;
        if now == before && now >= 2 * 2 * WAITERS as u64 {
            break;
        }
        assert!(Instant::now() < deadline, "the waiters did not settle");
        before = now;
    }
    let killed: i64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("pubsub")
        .query_async(&mut server.raw().await)
        .await
        .unwrap();
    assert!(killed >= 1, "no pub/sub connection to kill");
    sleep(Duration::from_secs(1)).await;
    let tried = server.script_calls().await - before;
    assert!(
        tried >= 2 * WAITERS as u64,
        "{tried} attempts after the pub/sub connection ended; every one of the {} waiters should try again",
        2 * WAITERS
    );
    assert!(
        granted.try_recv().is_err(),
        "a held permit or lock was granted"
    );
    // Subscribed anew: each release reaches a waiter at once.
    for held in [&permit, &lock] {
        assert!(holder.release(held).await.unwrap());
        let (_, got) = tokio::time::timeout(Duration::from_secs(5), granted.recv())
            .await
            .expect("a release after the reconnection reached no waiter")
            .unwrap();
        got.unwrap();
    }
}

#[tokio::test]
async fn a_mixed_renewal_batch_answers_for_each_lock_and_permit() {
    let (server, b) = connected().await;
    let other = RedisBackend::connect(&server.url()).await.unwrap();
    let ttl = Duration::from_secs(2);
    let lock = LockRequest::new(name("batch/lock"), ttl);
    let permit = LockRequest::permit(name("batch/sem"), ttl, 2);
    let released = LockRequest::permit(name("batch/sem"), ttl, 2);
    let theirs = LockRequest::permit(name("batch/sem"), ttl, 2);
    for r in [&lock, &permit, &released] {
        b.try_acquire(r).await.unwrap().unwrap();
    }
    assert!(b.release(&released).await.unwrap());
    other.try_acquire(&theirs).await.unwrap().unwrap();
    let mut foreign = theirs.clone();
    foreign.owner = distlock_core::Owner::random();
    let batch: Vec<LockRequest> = [&permit, &lock, &released, &foreign]
        .iter()
        .map(|r| r.with_ttl(Duration::from_secs(60)))
        .collect();
    assert!(b.capabilities().extend_batch > 1);
    let answers = b.extend_many(&batch).await.unwrap();
    assert_eq!(answers, [true, true, false, false]);
    let mut raw = server.raw().await;
    let pttl: i64 = redis::cmd("PTTL")
        .arg(b.semaphore_keys(&permit.name).permits)
        .query_async(&mut raw)
        .await
        .unwrap();
    assert!(
        pttl > 50_000,
        "the permit set was not extended with its permit: {pttl} ms"
    );
    assert_eq!(
        b.inspect_permits(&permit.name).await.unwrap().holders,
        Some(2)
    );
}
