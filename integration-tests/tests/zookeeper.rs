//! The conformance suite on a standalone ZooKeeper, plus its own edges: the
//! herd test, a 3-server ensemble losing its leader, a client cut off past
//! its session timeout, and a connection loss during create.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use distlock_core::{async_trait, Backend, DynBackend, Error, LockClient, LockName, LockRequest};
use distlock_zookeeper::ZooKeeperBackend;
use integration_tests::harness::proxy::Proxy;
use integration_tests::harness::{zookeeper as server, ServerKind, TestServer};
use integration_tests::BackendFactory;
use libtest_mimic::{Failed, Trial};
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

type Case = std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), Failed>> + Send>>;

fn main() {
    let zk = Arc::new(Zk {
        server: OnceLock::new(),
    });
    integration_tests::run_suite(zk.clone(), move |rt| {
        let t = |name: &str, f: Box<dyn FnOnce() -> Case + Send>| {
            let handle = rt.handle().clone();
            Trial::test(format!("zookeeper::{name}"), move || handle.block_on(f()))
        };
        let (z1, z2, z3) = (zk.clone(), zk.clone(), zk.clone());
        vec![
            t(
                "each_release_wakes_exactly_one_of_20_waiters",
                Box::new(move || Box::pin(herd(z1))),
            ),
            t(
                "leader_killed_during_hold_and_wait_keeps_exclusion",
                Box::new(|| Box::pin(leader_killed())),
            ),
            t(
                "client_cut_off_past_session_timeout_sees_lost_before_anyone_acquires",
                Box::new(move || Box::pin(cut_off(z2))),
            ),
            t(
                "connection_loss_during_create_leaves_no_orphan",
                Box::new(move || Box::pin(create_loss(z3))),
            ),
        ]
    })
}

fn name() -> String {
    format!("{}/lock", integration_tests::namespace())
}

async fn herd(f: Arc<Zk>) -> Result<(), Failed> {
    let url = format!("zk://{}", f.hosts()?);
    let lock = name();
    let holder = LockClient::new(ZooKeeperBackend::connect(&url).await?);
    let g = holder
        .lock(&lock)
        .ttl(Duration::from_secs(30))
        .acquire()
        .await?;
    let (mut backends, mut tasks) = (Vec::new(), Vec::new());
    for _ in 0..20 {
        let b = ZooKeeperBackend::connect(&url).await?;
        backends.push(b.clone());
        let lock = lock.clone();
        tasks.push(tokio::spawn(async move {
            let g = LockClient::new(b)
                .lock(&lock)
                .ttl(Duration::from_secs(30))
                .acquire()
                .await?;
            tokio::time::sleep(Duration::from_millis(20)).await;
            g.release().await
        }));
    }
    // All 20 queued: 21 children under the lock's node.
    let admin = ZooKeeperBackend::connect(&url).await?;
    let start = Instant::now();
    loop {
        let probe = LockRequest::new(LockName::new(&lock)?, Duration::from_secs(30));
        if admin.try_acquire(&probe).await?.is_some() {
            return Err("the lock was free while held".into());
        }
        if count_children(&f, &lock).await? >= 21 {
            break;
        }
        if start.elapsed() > Duration::from_secs(30) {
            return Err("the 20 waiters did not all queue".into());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    g.release().await?;
    for t in tasks {
        t.await.map_err(|e| e.to_string())??;
    }
    let wakeups: Vec<u64> = backends.iter().map(ZooKeeperBackend::wakeups).collect();
    let total: u64 = wakeups.iter().sum();
    if total != 20 || wakeups.iter().any(|w| *w != 1) {
        return Err(format!(
            "20 releases caused {total} wake-ups ({wakeups:?}); expected one each"
        )
        .into());
    }
    Ok(())
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
    let lock = name();
    let holder = LockClient::new(ZooKeeperBackend::connect(&url).await?);
    let waiter = LockClient::new(ZooKeeperBackend::connect(&url).await?);
    let g = holder
        .lock(&lock)
        .ttl(Duration::from_secs(10))
        .acquire()
        .await?;
    let first = g.token();
    let l2 = lock.clone();
    let w = tokio::spawn(async move {
        let g = waiter
            .lock(&l2)
            .ttl(Duration::from_secs(10))
            .wait(Duration::from_secs(90))
            .acquire()
            .await?;
        Ok::<_, Error>((Instant::now(), g))
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    let leader = members
        .iter()
        .find(|m| server::is_leader(m.port))
        .ok_or("no leader found")?;
    leader.signal("KILL").map_err(|e| e.to_string())?;
    let hold_end = tokio::select! {
        reason = g.lost() => {
            eprintln!("note: the holder saw lost() during the election: {reason}");
            Instant::now()
        }
        () = tokio::time::sleep(Duration::from_secs(4)) => Instant::now(),
    };
    let still_held = g.is_held();
    let _ = g.release().await;
    let (got_at, g2) = tokio::time::timeout(Duration::from_secs(90), w)
        .await
        .map_err(|_| Failed::from("waiter never got the lock after the leader was killed"))?
        .map_err(|e| e.to_string())??;
    if got_at < hold_end && still_held {
        return Err("the waiter got the lock while the holder still held it".into());
    }
    if g2.token() <= first {
        return Err(format!("token did not increase: {first} then {}", g2.token()).into());
    }
    g2.release().await?;
    drop(members);
    Ok(())
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
