//! The fault suite: the classic lock failures reproduced on real servers,
//! each with three worker processes looping acquire → read-modify-write of
//! a fenced register → release (see `distlock-check`). Every run shows the
//! fenced and the unfenced outcome of the same fault; `verify` holds it to
//! what theory predicts. `DISTLOCK_FAULT_MATRIX_DOC=docs/fault-matrix.md`
//! writes the matrix into the doc.

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use distlock_check::{CheckError, Faults, Workload};
use integration_tests::blocking;
use integration_tests::faults::{
    print_matrix, verify, verify_late_release, verify_permits, Expect,
};
use integration_tests::harness::{
    process::temp_dir, proxy::Proxy, redis as redis_server, ServerKind, ServerProcess, TestServer,
};
use integration_tests::{init_tracing, runtime, trial};
use libtest_mimic::{Arguments, Failed, Trial};

const CLIENTS: usize = 3;
/// ZooKeeper's session timeout here; the lock's TTL matches it.
const ZK_SESSION_MS: u64 = 2000;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum B {
    Sqlite,
    Postgres,
    Mysql,
    Redis,
    Redlock,
    Etcd,
    ZooKeeper,
}

impl B {
    const EVERY: [B; 7] = [
        B::Sqlite,
        B::Postgres,
        B::Mysql,
        B::Redis,
        B::Redlock,
        B::Etcd,
        B::ZooKeeper,
    ];

    /// The name without a qualifier such as "(fenced)", for trial names.
    fn short_name(self) -> &'static str {
        self.name().split(' ').next().unwrap_or("")
    }

    fn name(self) -> &'static str {
        match self {
            B::Sqlite => "sqlite",
            B::Postgres => "postgres",
            B::Mysql => "mysql",
            B::Redis => "redis",
            B::Redlock => "redlock (fenced)",
            B::Etcd => "etcd",
            B::ZooKeeper => "zookeeper",
        }
    }
    fn kind(self) -> Option<ServerKind> {
        match self {
            B::Postgres => Some(ServerKind::Postgres),
            B::Mysql => Some(ServerKind::MariaDb),
            B::Redis => Some(ServerKind::Redis),
            B::Etcd => Some(ServerKind::Etcd),
            B::ZooKeeper => Some(ServerKind::ZooKeeper),
            B::Sqlite | B::Redlock => None,
        }
    }
}

/// The servers behind one run, stopped on drop.
#[allow(dead_code)] // held for their Drop
struct Env {
    url: String,
    server: Option<TestServer>,
    nodes: Vec<ServerProcess>,
    dir: Option<std::path::PathBuf>,
}

impl Drop for Env {
    fn drop(&mut self) {
        if let Some(d) = &self.dir {
            let _ = std::fs::remove_dir_all(d);
        }
    }
}

impl Env {
    /// The URL with the server's port replaced by `port` (a proxy).
    fn url_via(&self, port: u16) -> String {
        let server = self.server.as_ref().map_or(0, |s| s.port());
        self.url.replace(&format!(":{server}"), &format!(":{port}"))
    }
    fn port(&self) -> u16 {
        self.server.as_ref().map_or(0, |s| s.port())
    }
}

fn failed(e: impl std::fmt::Display) -> Failed {
    Failed::from(e.to_string())
}

/// Starts private servers for `b` (fault tests stop, kill and restart them).
async fn start(b: B, options: &'static str) -> Result<Env, Failed> {
    blocking(move || {
        let mut env = Env {
            url: String::new(),
            server: None,
            nodes: Vec::new(),
            dir: None,
        };
        match b {
            B::Sqlite => {
                let dir = temp_dir("faults-sqlite").map_err(failed)?;
                env.url = format!("sqlite://{}", dir.join("locks.db").display());
                env.dir = Some(dir);
            }
            B::Redlock => {
                env.nodes = (0..5)
                    .map(|_| redis_server::spawn(&[]).map_err(failed))
                    .collect::<Result<_, _>>()?;
                env.url = redis_server::redlock_url(
                    env.nodes.iter().map(|n| n.port),
                    &format!("&fencing=true{options}"),
                );
            }
            _ => {
                let kind = b.kind().ok_or("no server kind")?;
                let s = TestServer::start_private(kind).map_err(failed)?;
                env.url = match b {
                    B::ZooKeeper => format!("{}?session_timeout_ms={ZK_SESSION_MS}", s.url()),
                    _ => s.url().to_string(),
                };
                env.server = Some(s);
            }
        }
        Ok(env)
    })
    .await
}

fn workload(urls: Vec<String>, ttl: Duration) -> Result<Workload, Failed> {
    let mut w = Workload::new(&urls[0], urls.len()).map_err(failed)?;
    w.urls = urls;
    w.ttl = ttl;
    w.lock = "faults/register".into();
    Ok(w)
}

fn ttl_for(b: B) -> Duration {
    match b {
        B::ZooKeeper => Duration::from_millis(ZK_SESSION_MS),
        _ => Duration::from_secs(2),
    }
}

/// F1: a holder stopped with SIGSTOP between its read and its write, for
/// twice the TTL and a second (a GC pause). Its lease runs out, another client is
/// granted the lock, and the resumed holder writes anyway.
async fn f1_pause(b: B) -> Result<(), Failed> {
    let env = start(b, "").await?;
    let ttl = ttl_for(b);
    let w = workload(vec![env.url.clone(); CLIENTS], ttl)?;
    let pause = ttl * 2 + Duration::from_secs(1);
    let report = distlock_check::run(&w, |f| async move { f.pause_holder(0, pause).await })
        .await
        .map_err(failed)?;
    drop(env);
    let late = verify_late_release(b.name(), &report);
    verify(
        b.name(),
        "F1 holder paused past its TTL",
        ttl,
        report,
        Expect {
            violations_without_fencing: true,
            overlap: Some(true),
            lost_before_regrant: Some(false),
            double_grant: Some(false),
        },
    )?;
    late
}

/// F1 on a semaphore of 2 permits with 4 clients: a permit holder is paused
/// past its TTL, its permit goes to another client, and its late write must
/// be refused by the register that keeps the 2 highest tokens.
async fn f1_pause_permits(b: B) -> Result<(), Failed> {
    let env = start(b, "").await?;
    let ttl = ttl_for(b);
    let mut w = workload(vec![env.url.clone(); 4], ttl)?;
    w.limit = Some(2);
    w.lock = "faults/pool".into();
    let pause = ttl * 2 + Duration::from_secs(1);
    let report = distlock_check::run(&w, |f| async move { f.pause_holder(0, pause).await })
        .await
        .map_err(failed)?;
    drop(env);
    verify_permits(
        b.name(),
        "F1 permit holder paused past its TTL",
        ttl,
        report,
    )
}

/// F1 on an election: the leader is paused past its TTL between its read
/// and its write, another campaigner leads and writes, and the resumed
/// leader's write must be refused by the fenced register.
async fn f1_pause_leader(b: B) -> Result<(), Failed> {
    let env = start(b, "").await?;
    let ttl = ttl_for(b);
    let mut w = workload(vec![env.url.clone(); CLIENTS], ttl)?;
    as_election(&mut w);
    let pause = ttl * 2 + Duration::from_secs(1);
    let report = distlock_check::run(&w, |f| async move { f.pause_holder(0, pause).await })
        .await
        .map_err(failed)?;
    drop(env);
    verify(
        b.name(),
        "F1 leader paused past its TTL",
        ttl,
        report,
        Expect {
            violations_without_fencing: true,
            overlap: Some(true),
            lost_before_regrant: Some(false),
            double_grant: Some(false),
        },
    )
}

/// F1 on a read-write lock, 2 readers and 2 writers: worker 0 is paused
/// past its TTL between its first and its second operation. As a reader
/// (`reader`), a writer is granted once its shared hold expires and
/// writes; the reader's late read must be refused by the register (below
/// the writer's token). As a writer, readers are granted after its lease
/// and read; its late write must be refused (below the readers' tokens).
async fn f1_pause_rw(b: B, reader: bool) -> Result<(), Failed> {
    let env = start(b, "").await?;
    let ttl = ttl_for(b);
    let mut w = workload(vec![env.url.clone(); 4], ttl)?;
    w.lock = "faults/rw".into();
    w.shared = if reader { vec![0, 1] } else { vec![1, 2] };
    // Longer than the lock's F1: the replacement must first wait out the
    // paused hold's TTL and then be granted past the other kind's holders.
    let pause = ttl * 3 + Duration::from_secs(1);
    let report = distlock_check::run(&w, |f| async move { f.pause_holder(0, pause).await })
        .await
        .map_err(failed)?;
    drop(env);
    let fault = if reader {
        "F1 shared holder paused past its TTL"
    } else {
        "F1 exclusive holder (beside readers) paused past its TTL"
    };
    verify(
        b.name(),
        fault,
        ttl,
        report,
        Expect {
            violations_without_fencing: true,
            overlap: Some(true),
            lost_before_regrant: Some(false),
            double_grant: Some(false),
        },
    )
}

/// Whether `b` declares elections, by what its backend declares without
/// connecting.
fn serves_elections(b: B) -> bool {
    distlock::declared_backends()
        .into_iter()
        .any(|(s, caps)| s == scheme_of(b) && caps.elections)
}

fn scheme_of(b: B) -> &'static str {
    match b {
        B::Sqlite => "sqlite://",
        B::Postgres => "postgres://",
        B::Mysql => "mysql://",
        B::Redis => "redis://",
        B::Redlock => "redlock://?fencing=true",
        B::Etcd => "etcd://",
        B::ZooKeeper => "zk://",
    }
}

/// Whether `b` declares shared holds (read-write locks), by what its
/// backend declares without connecting.
fn serves_shared(b: B) -> bool {
    distlock::declared_backends()
        .into_iter()
        .any(|(s, caps)| s == scheme_of(b) && caps.shared)
}

/// Waits for the stalled holder's write to land, then a little more.
async fn until_stall_ends(started: tokio::time::Instant, stall: Duration) {
    tokio::time::sleep_until(started + stall + Duration::from_millis(500)).await;
}

/// The shape of every run whose holder is stalled between its read and its
/// write: worker 0 stalls for `stall`; `inject` injects the fault and
/// returns the mark of its start; another client must then be granted the
/// lock within `grant_within` (unless the servers keep the lock, `None`),
/// and the stalled write is let land.
async fn during_stall(
    f: &Faults,
    stall: Duration,
    grant_within: Option<Duration>,
    inject: impl Future<Output = Result<u64, CheckError>>,
) -> Result<(), CheckError> {
    f.stall_holder(0, stall).await?;
    let begun = tokio::time::Instant::now();
    let t = inject.await?;
    if let Some(within) = grant_within {
        f.next_grant(t, 0, within).await?;
    }
    until_stall_ends(begun, stall).await;
    Ok(())
}

/// Runs `w` with worker 0 stalled for `stall`, as [`during_stall`]; the
/// fault is the mark of its start followed by `fault`.
async fn run_stalled<Fut>(
    w: &Workload,
    stall: Duration,
    grant_within: Option<Duration>,
    fault: impl FnOnce() -> Fut,
) -> Result<distlock_check::Report, Failed>
where
    Fut: Future<Output = Result<(), CheckError>>,
{
    distlock_check::run(w, |f: Faults| async move {
        let inject = async {
            let t = f.fault_started(0);
            fault().await?;
            Ok(t)
        };
        during_stall(&f, stall, grant_within, inject).await
    })
    .await
    .map_err(failed)
}

/// The unfenced register breaks, but the faulted holder's guard reports the
/// loss before anyone else is granted the lock, and nothing is granted twice.
const LOST_BEFORE_REGRANT: Expect = Expect {
    violations_without_fencing: true,
    overlap: Some(false),
    lost_before_regrant: Some(true),
    double_grant: Some(false),
};

/// The servers grant the lock again while the faulted holder's lease still
/// runs.
const DOUBLE_GRANT: Expect = Expect {
    violations_without_fencing: true,
    overlap: None,
    lost_before_regrant: None,
    double_grant: Some(true),
};

/// The fault harms nobody: no violation even without fencing, no overlap.
const HARMLESS: Expect = Expect {
    violations_without_fencing: false,
    overlap: Some(false),
    lost_before_regrant: None,
    double_grant: None,
};

/// The workload campaigns for the election `faults/leader` instead of
/// taking a lock.
fn as_election(w: &mut Workload) {
    w.elect = true;
    w.lock = "faults/leader".into();
}

/// F5 (F7 on ZooKeeper): the holder (the leader, with `elect`) is cut off
/// from the server by a proxy that blackholes its connection while it is
/// between its read and its write. Its guard must report the loss before
/// anyone else gets the lock; its stalled write lands after the new
/// holder's.
async fn f5_cut_off(b: B, fault: &str, elect: bool) -> Result<(), Failed> {
    let env = start(b, "").await?;
    let ttl = ttl_for(b);
    let proxy = Proxy::start(env.port()).map_err(failed)?;
    let mut urls = vec![env.url.clone(); CLIENTS];
    urls[0] = env.url_via(proxy.port);
    let mut w = workload(urls, ttl)?;
    if elect {
        as_election(&mut w);
    }
    let stall = ttl * 3;
    let report = distlock_check::run(&w, |f: Faults| async move {
        let cut = async {
            proxy.set_blackhole(true);
            Ok(f.fault_started(0))
        };
        during_stall(&f, stall, Some(stall * 2), cut).await?;
        proxy.set_blackhole(false);
        proxy.sever();
        Ok(())
    })
    .await
    .map_err(failed)?;
    drop(env);
    verify(b.name(), fault, ttl, report, LOST_BEFORE_REGRANT)
}

/// F6: the etcd server is paused (SIGSTOP) past the lease while the holder
/// (the leader, with `elect`) is between its read and its write;
/// keep-alives stop.
async fn f6_etcd_pause(fault: &str, elect: bool) -> Result<(), Failed> {
    let env = start(B::Etcd, "").await?;
    let ttl = ttl_for(B::Etcd);
    let pid = env
        .server
        .as_ref()
        .and_then(|s| s.process())
        .map(|p| p.pid())
        .ok_or("no etcd process")?;
    let mut w = workload(vec![env.url.clone(); CLIENTS], ttl)?;
    if elect {
        as_election(&mut w);
    }
    let stall = ttl * 4;
    let report = distlock_check::run(&w, |f: Faults| async move {
        let pause = async {
            signal(pid, "STOP")?;
            let t = f.fault_started(0);
            tokio::time::sleep(ttl * 2 + Duration::from_secs(1)).await;
            signal(pid, "CONT")?;
            Ok(t)
        };
        during_stall(&f, stall, Some(stall * 2), pause).await
    })
    .await
    .map_err(failed)?;
    drop(env);
    verify(B::Etcd.name(), fault, ttl, report, LOST_BEFORE_REGRANT)
}

fn signal(pid: u32, sig: &str) -> Result<(), CheckError> {
    integration_tests::harness::process::signal(pid, sig)
        .map_err(|e| CheckError::Fault(format!("kill -{sig} {pid}: {e}")))
}

/// Restarts a server the harness started (SIGKILL first when `kill`), off
/// the async runtime: the harness blocks while it waits for the old port to
/// free and the new process to answer. Returns the pids before and after.
async fn restart<T: Send + 'static>(
    server: &Arc<Mutex<T>>,
    process: fn(&mut T) -> Option<&mut ServerProcess>,
    kill: bool,
) -> Result<(u32, u32), CheckError> {
    let server = server.clone();
    tokio::task::spawn_blocking(move || {
        let mut guard = server.lock().unwrap_or_else(|p| p.into_inner());
        let p = process(&mut guard).ok_or("no server process to restart")?;
        let before = p.pid();
        if kill {
            let _ = p.signal("KILL");
        }
        p.restart().map_err(|e| e.to_string())?;
        Ok((before, p.pid()))
    })
    .await
    .map_err(|e| CheckError::Fault(e.to_string()))?
    .map_err(CheckError::Fault)
}

/// F10 on Redis: the server is killed and restarted empty (no persistence)
/// while a client holds the lock (stalled between its read and its write,
/// for less than the TTL). The lock and the token counter are gone.
async fn f10_redis_restart() -> Result<(), Failed> {
    let fault = "F10 server killed, restarted empty";
    f10_restart(B::Redis, true, fault, DOUBLE_GRANT).await
}

/// F10 on PostgreSQL: the server is restarted while a client holds the
/// lock (stalled for less than the TTL). Committed rows survive: no second
/// grant, no violation, tokens keep rising.
async fn f10_postgres_restart() -> Result<(), Failed> {
    let expect = Expect {
        double_grant: Some(false),
        ..HARMLESS
    };
    f10_restart(B::Postgres, false, "F10 server restarted", expect).await
}

/// An F10 run on `b`: the server is restarted (SIGKILL first when `kill`)
/// while worker 0 stalls for less than the TTL. Where `expect` has the lock
/// granted again, another client must get it within twice the stall; else
/// nobody else is granted it while the holder stalls.
async fn f10_restart(b: B, kill: bool, fault: &str, expect: Expect) -> Result<(), Failed> {
    let mut env = start(b, "").await?;
    let ttl = Duration::from_secs(6);
    let w = workload(vec![env.url.clone(); CLIENTS], ttl)?;
    let stall = Duration::from_secs(4);
    let server = Arc::new(Mutex::new(env.server.take()));
    let pids = Mutex::new((0, 0));
    let restart_server = || async {
        let restarted = restart(&server, |s| s.as_mut()?.process_mut(), kill).await?;
        *pids.lock().unwrap_or_else(|p| p.into_inner()) = restarted;
        Ok(())
    };
    let grant_within = (expect.double_grant == Some(true)).then_some(stall * 2);
    let report = run_stalled(&w, stall, grant_within, restart_server).await?;
    drop(server);
    let (before, after) = *pids.lock().unwrap_or_else(|p| p.into_inner());
    if before == after {
        return Err("the server was not restarted: the fault did not fire".into());
    }
    drop(env);
    verify(b.name(), fault, ttl, report, expect)
}

/// F2: Redis master + replica (linked through a proxy) + 3 Sentinels. The
/// link is cut, a client takes the lock (on the master only) and stalls;
/// the master is killed; the Sentinels promote the lagging replica, which
/// never saw the lock or its token.
async fn f2_failover() -> Result<(), Failed> {
    let (master, proxy, replica, sentinels) = blocking(|| {
        let master = redis_server::spawn(&["--repl-diskless-sync-delay", "0"]).map_err(failed)?;
        let proxy = Proxy::start(master.port).map_err(failed)?;
        let replica = redis_server::spawn(&["--replicaof", "127.0.0.1", &proxy.port.to_string()])
            .map_err(failed)?;
        wait_until("the replica to sync", Duration::from_secs(20), || {
            redis_server::command(replica.port, &["INFO", "replication"])
                .is_some_and(|r| r.contains("master_link_status:up"))
        })?;
        let sentinels = (0..3)
            .map(|_| {
                redis_server::sentinel_with_failover_timeout(master.port, "m", 120_000)
                    .map_err(failed)
            })
            .collect::<Result<Vec<_>, _>>()?;
        wait_until(
            "the sentinels to see a quorum and the replica",
            Duration::from_secs(30),
            || {
                redis_server::command(sentinels[0].port, &["SENTINEL", "CKQUORUM", "m"])
                    .is_some_and(|r| r.contains("3 usable"))
                    && redis_server::command(sentinels[0].port, &["SENTINEL", "REPLICAS", "m"])
                        .is_some_and(|r| r.contains(&replica.port.to_string()))
            },
        )?;
        Ok((master, proxy, replica, sentinels))
    })
    .await?;
    let hosts: Vec<String> = sentinels
        .iter()
        .map(|s| format!("127.0.0.1:{}", s.port))
        .collect();
    let url = format!("redis+sentinel://{}/m", hosts.join(","));
    let ttl = Duration::from_secs(10);
    let w = workload(vec![url; CLIENTS], ttl)?;
    let stall = Duration::from_secs(8);
    let master_pid = master.pid();
    let report = distlock_check::run(&w, |f: Faults| async move {
        proxy.set_blackhole(true);
        // Grants and releases now reach the master only. The replica keeps
        // the lock as it was at the cut (a holder whose release never
        // arrived), which expires a TTL after the cut; the stalled holder's
        // grant comes 4 s later, so after a failover its lease still has
        // about 4 s to run when the replica's copy frees the lock.
        tokio::time::sleep(Duration::from_secs(4)).await;
        let kill = async {
            let t = f.fault_started(0);
            signal(master_pid, "KILL")?;
            Ok(t)
        };
        during_stall(&f, stall, Some(stall * 2), kill).await?;
        drop(proxy);
        Ok(())
    })
    .await
    .map_err(failed)?;
    drop((master, replica, sentinels));
    let fault = "F2 failover to a lagging replica";
    verify("redis (sentinel)", fault, ttl, report, DOUBLE_GRANT)
}

fn wait_until(what: &str, limit: Duration, mut f: impl FnMut() -> bool) -> Result<(), Failed> {
    let start = std::time::Instant::now();
    while !f() {
        if start.elapsed() > limit {
            return Err(format!("timed out waiting for {what}").into());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(())
}

/// F3: Redlock over 5 nodes. The faulted client reaches nodes 3 and 4
/// through proxies that drop everything, so its grant lands on nodes 0-2
/// only; it stalls; node 2 restarts empty: nodes 2-4 are a free majority
/// for everyone else (Kleppmann's ABC / CDE case). With delayed-restart
/// protection node 2 sits out for a TTL instead.
async fn f3_redlock_restart(protected: bool) -> Result<(), Failed> {
    // Without protection the double grant needs the contender to reach the
    // restarted node within the holder's 7 s stall; on a loaded machine
    // that can take longer, and the fault then cannot show. One more
    // attempt, and a failure only if both show nothing; a scheme that
    // really prevented the double grant fails both.
    let first = f3_attempt(protected).await;
    if protected || first.is_ok() {
        return first;
    }
    eprintln!("F3 unprotected, first attempt: {first:?}; trying once more");
    f3_attempt(protected).await
}

async fn f3_attempt(protected: bool) -> Result<(), Failed> {
    let ttl = Duration::from_secs(10);
    let options = if protected {
        "&delayed_restart_ms=10000"
    } else {
        ""
    };
    let mut env = start(B::Redlock, options).await?;
    if protected {
        // A node up for less than delayed_restart_ms counts as restarted:
        // the workload starts once the fresh nodes are older.
        tokio::time::sleep(Duration::from_millis(10_500)).await;
    }
    let proxies = [
        Proxy::start(env.nodes[3].port).map_err(failed)?,
        Proxy::start(env.nodes[4].port).map_err(failed)?,
    ];
    let mut via: Vec<u16> = env.nodes.iter().map(|n| n.port).collect();
    via[3] = proxies[0].port;
    via[4] = proxies[1].port;
    let mut urls = vec![env.url.clone(); CLIENTS];
    urls[0] = redis_server::redlock_url(via, &format!("&fencing=true{options}"));
    let mut w = workload(urls, ttl)?;
    // Clients keep arriving: a waiter gives up after 300 ms and tries
    // afresh, as client B of that case does, instead of sleeping until the
    // holder's TTL.
    w.wait = Duration::from_millis(300);
    let stall = Duration::from_secs(7);
    // Nodes 3 and 4 seen directly, not through the faulted client's proxies.
    let mut far_nodes = Vec::new();
    for n in &env.nodes[3..5] {
        far_nodes.push(distlock::connect(&format!("redis://127.0.0.1:{}", n.port)).await?);
    }
    let lock = distlock::LockName::new(&w.lock)?;
    let node2 = Arc::new(Mutex::new(env.nodes.remove(2)));
    let restarted_node = &node2;
    let report = distlock_check::run(&w, |f: Faults| async move {
        for p in &proxies {
            p.set_blackhole(true);
        }
        // A hold of the faulted client that was granted on all five nodes
        // keeps nodes 3 and 4 until its TTL: its release cannot reach them
        // now. The contender needs them, so the fault starts once they are
        // free, or at the latest once such a hold has lapsed there (the
        // other clients' holds come and go, and on a loaded machine a poll
        // may never find both nodes free at once).
        let far_free = async {
            loop {
                let mut held = false;
                for n in &far_nodes {
                    held |= n.inspect(&lock).await.map_or(true, |s| s.held);
                }
                if !held {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        };
        let lapsed = tokio::time::sleep(ttl + Duration::from_secs(1));
        tokio::select! {
            () = far_free => {}
            () = lapsed => {}
        }
        // One contender during the fault: two would split the free nodes
        // between them round after round (each retrying on the same beat).
        f.gate(2).await?;
        let kill = async {
            let t = f.fault_started(0);
            restart(restarted_node, |p| Some(p), true).await?;
            Ok(t)
        };
        during_stall(&f, stall, Some(ttl * 3), kill).await?;
        f.open_gate(2);
        for p in &proxies {
            p.set_blackhole(false);
            p.sever();
        }
        Ok(())
    })
    .await
    .map_err(failed)?;
    drop((env, node2));
    let (name, fault) = if protected {
        (
            "redlock (fenced, delayed restart)",
            "F3 node restarts empty, protected",
        )
    } else {
        ("redlock (fenced)", "F3 node restarts empty")
    };
    verify(
        name,
        fault,
        ttl,
        report,
        Expect {
            violations_without_fencing: !protected,
            overlap: if protected { Some(false) } else { None },
            lost_before_regrant: None,
            double_grant: Some(!protected),
        },
    )
}

/// F4: the Redis server's wall clock jumps an hour forward (libfaketime)
/// while a client holds the lock, stalled between its read and its write
/// for less than the TTL. Redis judges key expiry by its wall clock: the
/// lock expires at once and is granted again.
async fn f4_clock_jump() -> Result<(), Failed> {
    let (server, offset) =
        blocking(|| redis_server::spawn_with_fake_clock().map_err(failed)).await?;
    let ttl = Duration::from_secs(6);
    let mut w = workload(
        vec![format!("redis://127.0.0.1:{}", server.port); CLIENTS],
        ttl,
    )?;
    // Clients keep arriving: an expiry sends no release message, so a
    // queued waiter would sleep until the holder's PTTL.
    w.wait = Duration::from_millis(300);
    let stall = Duration::from_secs(4);
    let jump = || async { std::fs::write(&offset, "+3600\n").map_err(CheckError::Io) };
    let report = run_stalled(&w, stall, Some(stall * 2), jump).await?;
    drop(server);
    let fault = "F4 server clock jumps forward";
    verify(B::Redis.name(), fault, ttl, report, DOUBLE_GRANT)
}

/// F9: the server's answer to an acquire is lost. Every client is held
/// just before its next acquire (so the lock is free); the faulted
/// client's proxy starts holding replies back for 700 ms and it goes on
/// alone: as soon as the server has granted it the lock (seen with
/// `inspect`), the proxy severs its connections, discarding the held grant
/// reply, and the others go on. The
/// orphaned grant must not be held twice and must be reclaimed: core
/// releases it by owner when the acquire fails; ZooKeeper and etcd find
/// their node or key again.
async fn f9_lost_reply(b: B) -> Result<(), Failed> {
    let env = start(b, "").await?;
    let ttl = Duration::from_secs(match b {
        B::Etcd | B::ZooKeeper => 2,
        _ => 6,
    });
    let proxy = Proxy::start(env.port()).map_err(failed)?;
    let mut urls = vec![env.url.clone(); CLIENTS];
    urls[0] = env.url_via(proxy.port);
    let w = workload(urls, ttl)?;
    let observer = distlock::connect(&env.url).await?;
    let lock = distlock::LockName::new(&w.lock)?;
    let report = distlock_check::run(&w, |f: Faults| async move {
        for i in 0..CLIENTS {
            f.gate(i).await?;
        }
        proxy.set_reply_delay(Duration::from_millis(700));
        f.open_gate(0);
        let granted = async {
            loop {
                if observer.inspect(&lock).await.is_ok_and(|s| s.held) {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        };
        tokio::time::timeout(Duration::from_secs(10), granted)
            .await
            .map_err(|_| CheckError::Fault("the faulted acquire was never granted".into()))?;
        proxy.sever();
        proxy.set_reply_delay(Duration::ZERO);
        let t = f.fault_started(0);
        for i in 1..CLIENTS {
            f.open_gate(i);
        }
        f.next_grant(t, 0, ttl * 3).await?;
        Ok(())
    })
    .await
    .map_err(failed)?;
    drop(env);
    if report.recovery.is_some_and(|r| r >= ttl / 2) {
        return Err(format!(
            "the orphaned grant was left until it expired ({:?}), not reclaimed",
            report.recovery
        )
        .into());
    }
    verify(b.name(), "F9 acquire reply lost", ttl, report, HARMLESS)
}

fn main() -> std::process::ExitCode {
    // The workload's clients are this binary, re-executed.
    if let Some(code) = distlock_check::worker_main_if_requested() {
        return code;
    }
    init_tracing();
    let args = Arguments::from_args();
    let rt = runtime();
    let mut trials: Vec<Trial> = Vec::new();
    for b in B::EVERY {
        let name = format!("faults::F1_pause::{}", b.short_name());
        trials.push(trial(&rt, name, f1_pause(b)));
    }
    for b in B::EVERY {
        let name = format!("faults::F1_pause_permit::{}", b.short_name());
        trials.push(trial(&rt, name, f1_pause_permits(b)));
    }
    for b in B::EVERY.into_iter().filter(|b| serves_elections(*b)) {
        let name = format!("faults::F1_pause_leader::{}", b.short_name());
        trials.push(trial(&rt, name, f1_pause_leader(b)));
    }
    for b in B::EVERY.into_iter().filter(|b| serves_shared(*b)) {
        let name = format!("faults::F1_pause_shared::{}", b.short_name());
        trials.push(trial(&rt, name, f1_pause_rw(b, true)));
        let name = format!("faults::F1_pause_writer_beside_readers::{}", b.short_name());
        trials.push(trial(&rt, name, f1_pause_rw(b, false)));
    }
    for b in [B::Postgres, B::Mysql, B::Redis, B::Etcd] {
        trials.push(trial(
            &rt,
            format!("faults::F5_cut_off::{}", b.name()),
            f5_cut_off(b, "F5 holder cut off from the server", false),
        ));
    }
    trials.push(trial(
        &rt,
        "faults::F7_session_expiry::zookeeper",
        f5_cut_off(B::ZooKeeper, "F7 holder's session expires (cut off)", false),
    ));
    trials.push(trial(
        &rt,
        "faults::F7_session_expiry_leader::zookeeper",
        f5_cut_off(B::ZooKeeper, "F7 leader's session expires (cut off)", true),
    ));
    trials.push(trial(&rt, "faults::F2_failover::redis", f2_failover()));
    trials.push(trial(
        &rt,
        "faults::F3_node_restart::redlock",
        f3_redlock_restart(false),
    ));
    trials.push(trial(
        &rt,
        "faults::F3_node_restart::redlock_protected",
        f3_redlock_restart(true),
    ));
    trials.push(trial(&rt, "faults::F4_clock_jump::redis", f4_clock_jump()));
    trials.push(trial(
        &rt,
        "faults::F6_server_pause::etcd",
        f6_etcd_pause(
            "F6 etcd server paused past the lease (keep-alives lost)",
            false,
        ),
    ));
    trials.push(trial(
        &rt,
        "faults::F6_server_pause_leader::etcd",
        f6_etcd_pause("F6 etcd server paused past the leader's lease", true),
    ));
    for b in [B::Postgres, B::Mysql, B::Redis, B::Etcd, B::ZooKeeper] {
        trials.push(trial(
            &rt,
            format!("faults::F9_lost_reply::{}", b.name()),
            f9_lost_reply(b),
        ));
    }
    trials.push(trial(
        &rt,
        "faults::F10_restart::redis",
        f10_redis_restart(),
    ));
    trials.push(trial(
        &rt,
        "faults::F10_restart::postgres",
        f10_postgres_restart(),
    ));
    let conclusion = libtest_mimic::run(&args, trials);
    print_matrix();
    drop(rt);
    if conclusion.has_failed() {
        std::process::ExitCode::from(101)
    } else {
        std::process::ExitCode::SUCCESS
    }
}
