//! The conformance suite on a standalone ZooKeeper, plus its own edges: the
//! herd test, a 3-server ensemble losing its leader, a client cut off past
//! its session timeout, and a connection loss during create.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use distlock_core::{async_trait, Backend, DynBackend, Error, LockClient, LockName, LockRequest};
use distlock_zookeeper::ZooKeeperBackend;
use integration_tests::harness::proxy::Proxy;
use integration_tests::harness::{zookeeper as server, ServerKind, TestServer};
use integration_tests::queue::{self, QueueLen, Waiter};
use integration_tests::{trial, BackendFactory};
use libtest_mimic::Failed;
use tokio::time::Instant;

struct Zk {
    server: OnceLock<Result<TestServer, String>>,
}

impl Zk {
    fn hosts(&self) -> Result<String, Failed> {
        let s = self
            .server
            .get_or_init(|| TestServer::start(ServerKind::ZooKeeper).map_err(|e| e.to_string()));
        s.as_ref()
            .map(|s| format!("{}:{}", s.host(), s.port()))
            .map_err(|e| Failed::from(e.as_str()))
    }

    /// Detached sessions: a dropped client behaves like a crashed process,
    /// whose session (and nodes) live until the server expires it.
    fn url(&self) -> Result<String, Failed> {
        Ok(format!(
            "zk://{}/conformance?session_timeout_ms=2000&detached=true",
            self.hosts()?
        ))
    }
}

#[async_trait]
impl BackendFactory for Zk {
    fn name(&self) -> &'static str {
        "zookeeper"
    }
    async fn client(&self) -> distlock_core::Result<DynBackend> {
        let url = self
            .url()
            .map_err(|e| Error::unavailable("test", format!("{e:?}"), None))?;
        Ok(Arc::new(ZooKeeperBackend::connect(&url).await?))
    }
    async fn evict(&self, name: &LockName) -> Result<(), Failed> {
        if ZooKeeperBackend::connect(&self.url()?)
            .await?
            .evict(name)
            .await?
        {
            Ok(())
        } else {
            Err(format!("nothing to evict for {name}").into())
        }
    }
    fn short_ttl(&self) -> Duration {
        Duration::from_secs(2)
    }
}

fn main() {
    let zk = Arc::new(Zk {
        server: OnceLock::new(),
    });
    integration_tests::run_suite(zk.clone(), move |rt| {
        vec![
            trial(
                rt,
                "zookeeper::each_release_wakes_exactly_one_of_20_waiters",
                herd(zk.clone()),
            ),
            trial(
                rt,
                "zookeeper::leader_killed_during_hold_and_wait_keeps_exclusion",
                leader_killed(),
            ),
            trial(
                rt,
                "zookeeper::client_cut_off_past_session_timeout_sees_lost_before_anyone_acquires",
                cut_off(zk.clone()),
            ),
            trial(
                rt,
                "zookeeper::connection_loss_during_create_leaves_no_orphan",
                create_loss(zk.clone()),
            ),
        ]
    })
}

fn name() -> String {
    format!("{}/lock", integration_tests::namespace())
}

/// 20 waiters queue behind a holder; every release must wake exactly one.
async fn herd(f: Arc<Zk>) -> Result<(), Failed> {
    let url = format!("zk://{}", f.hosts()?);
    let lock = name();
    let mut waiters = Vec::new();
    for _ in 0..20 {
        let b = ZooKeeperBackend::connect(&url).await?;
        let counter = b.clone();
        waiters.push(Waiter {
            backend: Arc::new(b),
            wakeups: Box::new(move || counter.wakeups()),
        });
    }
    let holder = Arc::new(ZooKeeperBackend::connect(&url).await?);
    let (zk, l) = (f.clone(), lock.clone());
    let queued: QueueLen<'_> = Box::new(move || {
        let (zk, l) = (zk.clone(), l.clone());
        Box::pin(async move { count_children(&zk, &l).await })
    });
    queue::each_release_wakes_one_waiter(holder, waiters, &lock, queued).await
}

/// Children under the lock node, counted with ZooKeeper's own CLI.
async fn count_children(f: &Zk, lock: &str) -> Result<usize, Failed> {
    let cmd = server::cli(&f.hosts()?, &["ls", &format!("/distlock/{lock}")])
        .map_err(|e| e.to_string())?;
    let out =
        tokio::task::spawn_blocking(move || integration_tests::harness::process::run_client(cmd))
            .await
            .map_err(|e| e.to_string())?;
    let out = match out {
        Ok(out) => out,
        Err(e) if e.contains("NoNode") || e.contains("does not exist") => return Ok(0),
        Err(e) => return Err(e.into()),
    };
    let list = out
        .lines()
        .rev()
        .find(|l| l.starts_with('['))
        .unwrap_or("[]");
    Ok(list
        .trim_matches(['[', ']'])
        .split(',')
        .filter(|s| !s.trim().is_empty())
        .count())
}

/// A holder holds and a waiter waits on a 3-server ensemble; the leader is
/// killed (see `integration_tests::queue::leader_loss_keeps_exclusion`).
async fn leader_killed() -> Result<(), Failed> {
    let members = tokio::task::spawn_blocking(|| server::ensemble(3))
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| e.to_string())?;
    let hosts: Vec<String> = members
        .iter()
        .map(|m| format!("127.0.0.1:{}", m.port))
        .collect();
    let url = format!("zk://{}?session_timeout_ms=10000", hosts.join(","));
    let holder = Arc::new(ZooKeeperBackend::connect(&url).await?);
    let waiter = Arc::new(ZooKeeperBackend::connect(&url).await?);
    let result = queue::leader_loss_keeps_exclusion(
        holder,
        waiter,
        &name(),
        Duration::from_secs(10),
        || {
            let leader = members
                .iter()
                .find(|m| server::is_leader(m.port))
                .ok_or("no leader found")?;
            leader
                .signal("KILL")
                .map_err(|e| Failed::from(e.to_string()))
        },
    )
    .await;
    drop(members);
    result
}

/// The holder's connection goes through a proxy that is cut: it sees lost()
/// at once (a disconnection counts as lost), and another client gets the
/// lock only once the server has expired the holder's session.
async fn cut_off(f: Arc<Zk>) -> Result<(), Failed> {
    let port = integration_tests::harness::host_port(&format!("zk://{}", f.hosts()?))
        .ok_or("no port")?
        .1;
    let proxy = Proxy::start(port).map_err(|e| e.to_string())?;
    let timeout = Duration::from_secs(3);
    let holder = LockClient::new(
        ZooKeeperBackend::connect(&format!(
            "zk://127.0.0.1:{}?session_timeout_ms={}",
            proxy.port,
            timeout.as_millis()
        ))
        .await?,
    );
    let other = LockClient::new(ZooKeeperBackend::connect(&format!("zk://{}", f.hosts()?)).await?);
    let lock = name();
    // An earlier lock, released, leaves its session's watcher idle; the
    // next lock in the session must still hear of the session's end.
    holder.lock(name()).acquire().await?.release().await?;
    let g = holder
        .lock(&lock)
        .ttl(Duration::from_secs(30))
        .acquire()
        .await?;
    let cut_at = Instant::now();
    proxy.set_blackhole(true);
    let l2 = lock.clone();
    let w = tokio::spawn(async move {
        let g = other
            .lock(&l2)
            .ttl(Duration::from_secs(30))
            .wait(Duration::from_secs(60))
            .acquire()
            .await?;
        Ok::<_, Error>((Instant::now(), g))
    });
    let reason = tokio::time::timeout(timeout * 3, g.lost())
        .await
        .map_err(|_| Failed::from("the cut-off holder never saw lost()"))?;
    let lost_at = Instant::now();
    let (got_at, g2) = tokio::time::timeout(Duration::from_secs(60), w)
        .await
        .map_err(|_| Failed::from("the other client never got the lock"))?
        .map_err(|e| e.to_string())??;
    if got_at <= lost_at {
        return Err(
            format!("the other client acquired before the holder saw lost() ({reason})").into(),
        );
    }
    // The server expires a session at the earliest a timeout after the last
    // packet it heard; the client pings every third of the timeout.
    if got_at - cut_at < timeout * 2 / 3 {
        return Err(format!(
            "acquired {:?} after the cut, before the session could have expired",
            got_at - cut_at
        )
        .into());
    }
    g2.release().await?;
    drop(proxy);
    Ok(())
}

/// The create reaches the server but its reply is lost, then the connection
/// breaks. The client must find its node again by its owner value, not
/// create a second one, and leave nothing behind after release.
async fn create_loss(f: Arc<Zk>) -> Result<(), Failed> {
    let port = integration_tests::harness::host_port(&format!("zk://{}", f.hosts()?))
        .ok_or("no port")?
        .1;
    let proxy = Proxy::start(port).map_err(|e| e.to_string())?;
    let backend = ZooKeeperBackend::connect(&format!(
        "zk://127.0.0.1:{}?session_timeout_ms=6000",
        proxy.port
    ))
    .await?;
    let lock = name();
    let req = LockRequest::new(LockName::new(&lock)?, Duration::from_secs(30));
    // Create the lock's parent node first, so the faulty create is the only
    // request whose reply gets lost.
    let warm = LockRequest::new(LockName::new(&lock)?, Duration::from_secs(30));
    backend
        .try_acquire(&warm)
        .await?
        .ok_or("warm-up acquire failed")?;
    backend.release(&warm).await?;
    proxy.set_drop_replies(true);
    let b2 = backend.clone();
    let r2 = req.clone();
    let attempt = tokio::spawn(async move { b2.try_acquire(&r2).await });
    let start = Instant::now();
    while count_children(&f, &lock).await? < 1 {
        if start.elapsed() > Duration::from_secs(10) {
            return Err("the create never reached the server".into());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    if attempt.is_finished() {
        return Err(
            "the create returned although its reply was dropped: the fault did not fire".into(),
        );
    }
    proxy.set_drop_replies(false);
    proxy.sever();
    let token = tokio::time::timeout(Duration::from_secs(30), attempt)
        .await
        .map_err(|_| Failed::from("the acquire never recovered"))?
        .map_err(|e| e.to_string())??;
    if token.is_none() {
        return Err("the recovered acquire did not hold the free lock".into());
    }
    let n = count_children(&f, &lock).await?;
    if n != 1 {
        return Err(
            format!("{n} nodes after a connection loss during create; expected exactly 1").into(),
        );
    }
    if !backend.release(&req).await? {
        return Err("release of the recovered node failed".into());
    }
    let n = count_children(&f, &lock).await?;
    if n != 0 {
        return Err(format!("{n} orphan nodes left after release").into());
    }
    drop(proxy);
    Ok(())
}
