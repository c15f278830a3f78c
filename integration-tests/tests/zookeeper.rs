//! The conformance suite on a standalone ZooKeeper, plus its own edges: the
//! herd test, a 3-server ensemble losing its leader, a client cut off past
//! its session timeout, a connection loss during create, and interop with
//! Apache Curator's `InterProcessMutex`, `InterProcessReadWriteLock` and
//! `LeaderLatch` running in separate JVMs.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use distlock_core::{Backend, Error, HoldKind, LockClient, LockGuard, LockName, LockRequest};
use distlock_zookeeper::ZooKeeperBackend;
use integration_tests::factory::{ServerFactory, Servers};
use integration_tests::harness::proxy::Proxy;
use integration_tests::harness::{zookeeper as server, ServerKind, TestServer};
use integration_tests::queue::{self, QueueLen};
use integration_tests::trial;
use libtest_mimic::Failed;
use tokio::time::Instant;

type Zk = ServerFactory<ZooKeeperBackend>;

/// The compiled `CuratorMutex` and `CuratorLatch`, built by the first
/// Curator test that needs them.
type CuratorBuild = Arc<OnceLock<Result<CuratorClasses, String>>>;

fn main() {
    // Detached sessions: a dropped client behaves like a crashed process,
    // whose session (and nodes) live until the server expires it. The
    // control session keeps its default timeout (10 s), so a hold that
    // lived in it instead of a session of its TTL fails the expiry cases.
    let zk = Arc::new(
        Zk::new("zookeeper", || {
            TestServer::start(ServerKind::ZooKeeper)
                .map(|s| Servers::server_at(format!("zk://{}:{}", s.host(), s.port()), s))
                .map_err(|e| e.to_string())
        })
        .url_suffix("/conformance?detached=true")
        .short_ttl(Duration::from_secs(3)),
    );
    let curator = CuratorBuild::default();
    integration_tests::run_suite(zk.clone(), move |rt| {
        vec![
            trial(
                rt,
                "zookeeper::a_stock_tick_ends_a_vanished_holders_session_within_its_declared_lag",
                stock_tick(),
            ),
            trial(
                rt,
                "zookeeper::each_release_wakes_exactly_one_of_20_waiters",
                herd(zk.clone()),
            ),
            trial(
                rt,
                "zookeeper::a_wait_on_a_server_that_stops_answering_ends_by_its_deadline",
                stalled_wait(zk.clone()),
            ),
            trial(
                rt,
                "zookeeper::a_wait_cut_off_until_its_deadline_ends_unavailable_at_its_deadline",
                wait_runs_out_while_cut_off(zk.clone()),
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
                "zookeeper::hold_while_disconnected_keeps_a_hold_through_a_reconnect_and_without_it_the_hold_is_lost",
                hold_while_disconnected(zk.clone()),
            ),
            trial(
                rt,
                "zookeeper::semaphore_permits_go_in_arrival_order_waking_few",
                semaphore_order(zk.clone()),
            ),
            trial(
                rt,
                "zookeeper::a_semaphore_whose_name_is_the_parent_of_another_works",
                parent_and_child_semaphores(zk.clone()),
            ),
            trial(
                rt,
                "zookeeper::a_lock_or_election_whose_name_is_the_parent_of_another_works",
                parent_and_child_locks(zk.clone()),
            ),
            trial(
                rt,
                "zookeeper::connection_loss_during_create_leaves_no_orphan",
                create_loss(zk.clone()),
            ),
            trial(
                rt,
                "zookeeper::a_ttl_outside_the_servers_session_timeouts_is_a_typed_error",
                ttl_outside_session_bounds(),
            ),
            trial(
                rt,
                "zookeeper::with_credentials_other_clients_can_read_but_not_break_a_lock",
                acls_protect_the_holder(zk.clone()),
            ),
            trial(
                rt,
                "zookeeper::curator_holder_excludes_distlock",
                curator_holder_excludes_distlock(zk.clone(), curator.clone()),
            ),
            trial(
                rt,
                "zookeeper::distlock_holder_excludes_curator",
                distlock_holder_excludes_curator(zk.clone(), curator.clone()),
            ),
            trial(
                rt,
                "zookeeper::with_the_same_credentials_curator_and_distlock_exclude_each_other",
                same_credentials_as_curator(zk.clone(), curator.clone()),
            ),
            trial(
                rt,
                "zookeeper::clients_of_both_layouts_exclude_each_other",
                clients_of_both_layouts_exclude_each_other(zk.clone()),
            ),
            trial(
                rt,
                "zookeeper::curator_mutex_excludes_distlock_readers",
                curator_mutex_excludes_distlock_readers(zk.clone(), curator.clone()),
            ),
            trial(
                rt,
                "zookeeper::rwlock_layout_curator_write_lock_excludes_distlock_readers_and_writers",
                curator_write_lock_excludes_distlock_readers_and_writers(
                    zk.clone(),
                    curator.clone(),
                ),
            ),
            trial(
                rt,
                "zookeeper::rwlock_layout_distlock_writer_excludes_curator_readers_and_writers",
                distlock_writer_excludes_curator_readers_and_writers(zk.clone(), curator.clone()),
            ),
            trial(
                rt,
                "zookeeper::rwlock_layout_curator_and_distlock_readers_overlap",
                curator_and_distlock_readers_overlap(zk.clone(), curator.clone()),
            ),
            trial(
                rt,
                "zookeeper::distlock_and_curator_queue_in_one_line",
                distlock_and_curator_queue_in_one_line(zk.clone(), curator.clone()),
            ),
            trial(
                rt,
                "zookeeper::curator_leader_latch_leads_and_distlock_campaigns_wait",
                curator_latch_leads_and_distlock_waits(zk.clone(), curator.clone()),
            ),
            trial(
                rt,
                "zookeeper::distlock_leader_keeps_a_curator_leader_latch_waiting",
                distlock_leader_keeps_curator_latch_waiting(zk.clone(), curator.clone()),
            ),
        ]
    })
}

fn name() -> String {
    format!("{}/lock", integration_tests::namespace())
}

/// 20 waiters of a semaphore of one permit get it in arrival order, waking
/// few (see [`queue::semaphore_grants_in_arrival_order`]).
async fn semaphore_order(f: Arc<Zk>) -> Result<(), Failed> {
    let url = format!("zk://{}", f.host_port()?);
    let sem = format!("{}/sem-order", integration_tests::namespace());
    let (zk, permits) = (f.clone(), format!("@semaphores/{sem}/@permits"));
    let queued: QueueLen<'_> = Box::new(move || {
        let (zk, p) = (zk.clone(), permits.clone());
        Box::pin(async move { count_children(&zk, &p).await })
    });
    let woken =
        queue::semaphore_grants_in_arrival_order::<ZooKeeperBackend>(&url, 20, &sem, queued)
            .await?;
    eprintln!("zookeeper: 20 releases of a semaphore, {woken} wake-ups");
    Ok(())
}

/// One permit of semaphore `name` of `limit`, taken and given back; while
/// it is held, the semaphore's status shows one holder of `limit`.
async fn use_semaphore(client: &LockClient, name: &str, limit: u32) -> Result<(), Failed> {
    let g = client
        .semaphore(name, limit)
        .try_acquire()
        .await
        .map_err(|e| format!("semaphore {name}: {e}"))?
        .ok_or_else(|| format!("semaphore {name}: no permit free, though nobody held one"))?;
    let lock_name = LockName::new(name).map_err(|e| e.to_string())?;
    let status = client.backend().inspect_permits(&lock_name).await?;
    if status.holders != Some(1) || status.limit != Some(limit) {
        return Err(format!(
            "semaphore {name} held once with limit {limit}: status says {:?} holders of {:?}",
            status.holders, status.limit
        )
        .into());
    }
    if !g.release().await? {
        return Err(format!("semaphore {name}: the release found no permit").into());
    }
    Ok(())
}

/// Semaphore `x/y` makes the node of semaphore `x` as its parent, with no
/// limit and no `@permits` node: `x` still works afterwards (and while
/// `x/y` is held), with its own limit, as it does in the other order and
/// beside a lock named `x`. A limit set on such a node is the one used.
async fn parent_and_child_semaphores(f: Arc<Zk>) -> Result<(), Failed> {
    let client = distlock_client(&f).await?;
    let ns = integration_tests::namespace();
    // The child first; the parent after it, then while the child is held.
    let (parent, child) = (format!("{ns}/x"), format!("{ns}/x/y"));
    use_semaphore(&client, &child, 1).await?;
    let status = client
        .backend()
        .inspect_permits(&LockName::new(&parent).map_err(|e| e.to_string())?)
        .await?;
    if status.held || status.limit.is_some() {
        return Err(format!(
            "semaphore {parent}, never used, only the parent of {child}: status says held {} with limit {:?}",
            status.held, status.limit
        )
        .into());
    }
    use_semaphore(&client, &parent, 2).await?;
    let child_held = client.semaphore(&child, 1).acquire().await?;
    use_semaphore(&client, &parent, 2).await?;
    child_held.release().await?;
    // The parent first, then the child, beside a lock named like the parent.
    let (parent, child) = (format!("{ns}/r"), format!("{ns}/r/y"));
    use_semaphore(&client, &parent, 3).await?;
    let lock = client.lock(&parent).acquire().await?;
    use_semaphore(&client, &child, 1).await?;
    use_semaphore(&client, &parent, 3).await?;
    lock.release().await?;
    // A limit set on a node made only as a parent, then used.
    let (parent, child) = (format!("{ns}/s"), format!("{ns}/s/y"));
    use_semaphore(&client, &child, 1).await?;
    let old = client.set_semaphore_limit(&parent, 4).await?;
    if old.is_some() {
        return Err(format!("semaphore {parent}: set_limit found an old limit {old:?}").into());
    }
    use_semaphore(&client, &parent, 4).await?;
    Ok(())
}

/// Lock, shared hold and election of `name`, each taken and given back at
/// once.
async fn use_every_kind(client: &LockClient, name: &str) -> Result<(), Failed> {
    let what = |kind: &str, e: String| Failed::from(format!("{kind} {name}: {e}"));
    let free = |kind: &str| Failed::from(format!("{kind} {name}: refused, though nobody held it"));
    let lock = client.lock(name).try_acquire().await;
    lock.map_err(|e| what("lock", e.to_string()))?
        .ok_or_else(|| free("lock"))?
        .release()
        .await?;
    let shared = client.lock(name).shared().try_acquire().await;
    shared
        .map_err(|e| what("shared hold", e.to_string()))?
        .ok_or_else(|| free("shared hold"))?
        .release()
        .await?;
    let campaign = client.election(name).try_campaign("v").await;
    campaign
        .map_err(|e| what("election", e.to_string()))?
        .ok_or_else(|| free("election"))?
        .resign()
        .await?;
    Ok(())
}

/// The node of lock `x` is also the parent of lock `x/y`'s, and an
/// election's node is its lock's: locks, shared holds and elections of
/// both names work in either order, and while `x/y` is held or led,
/// `x` shows no holder and no leader and `list` names `x/y`. The same
/// for child names that end like a queue node (`db-lock-0`,
/// `a-__READ__0`, `x-latch-0`) without being one.
async fn parent_and_child_locks(f: Arc<Zk>) -> Result<(), Failed> {
    let client = distlock_client(&f).await?;
    let ns = integration_tests::namespace();
    for (parent, child) in [
        ("t", "t/q"),
        ("u", "u/db-lock-0"),
        ("v", "v/a-__READ__0"),
        ("w", "w/x-latch-0"),
        // Ending in a marker and a sequence as ZooKeeper writes it.
        ("y", "y/db-lock-0000000001"),
        ("z", "z/x-latch-0000000001"),
    ] {
        let (parent, child) = (format!("{ns}/{parent}"), format!("{ns}/{child}"));
        for name in [&child, &parent, &child] {
            use_every_kind(&client, name).await?;
        }
        let parent_name = LockName::new(&parent).map_err(|e| e.to_string())?;
        let held = client.lock(&child).acquire().await?;
        let led = client.election(&child).campaign("child").await?;
        let status = client.backend().inspect(&parent_name).await?;
        if status.held {
            return Err(format!("{parent} shows a holder while only {child} is held").into());
        }
        if let Some(leader) = client.election(&parent).leader().await? {
            return Err(
                format!("{parent} shows a leader while only {child} is led: {leader:?}").into(),
            );
        }
        let listed: Vec<(String, HoldKind)> = client
            .list(&format!("{parent}/"), 10)
            .await?
            .into_iter()
            .map(|r| (r.name, r.kind))
            .collect();
        if listed
            != [
                (child.clone(), HoldKind::Exclusive),
                (child.clone(), HoldKind::Leader),
            ]
        {
            return Err(format!("holding and leading {child}, list says {listed:?}").into());
        }
        use_every_kind(&client, &parent).await?;
        led.resign().await?;
        held.release().await?;
    }
    // A segment spelled as a queue node (Curator's protected form) would
    // sit in the queue of the name above it: refused, for every kind and
    // anywhere in the name, and the name above stays free.
    let uuid = "11111111-2222-3333-4444-555555555555";
    let parent = format!("{ns}/r");
    for seg in [
        format!("_c_{uuid}-lock-0000000000"),
        format!("_c_{uuid}-__READ__0000000001"),
        format!("_c_{uuid}-__WRIT__0000000002"),
        format!("_c_{uuid}-latch-0000000003"),
    ] {
        for child in [format!("{parent}/{seg}"), format!("{parent}/{seg}/deeper")] {
            for taken in [
                client.lock(&child).try_acquire().await.map(|g| g.is_some()),
                client
                    .lock(&child)
                    .shared()
                    .try_acquire()
                    .await
                    .map(|g| g.is_some()),
                client
                    .semaphore(&child, 2)
                    .try_acquire()
                    .await
                    .map(|g| g.is_some()),
                client
                    .election(&child)
                    .try_campaign("c")
                    .await
                    .map(|g| g.is_some()),
                client
                    .backend()
                    .set_limit(&LockName::new(&child)?, 2)
                    .await
                    .map(|_| true),
            ] {
                match taken {
                    Err(Error::InvalidInput { .. }) => {}
                    other => return Err(format!("{child}: {other:?}, not a refused name").into()),
                }
            }
        }
    }
    if client.lock(&parent).try_acquire().await?.is_none() {
        return Err(format!("{parent} is held after its reserved children were refused").into());
    }
    Ok(())
}

/// 20 waiters queue behind a holder; every release must wake exactly one.
async fn herd(f: Arc<Zk>) -> Result<(), Failed> {
    let url = format!("zk://{}", f.host_port()?);
    let lock = name();
    let (zk, l) = (f.clone(), lock.clone());
    let queued: QueueLen<'_> = Box::new(move || {
        let (zk, l) = (zk.clone(), l.clone());
        Box::pin(async move { count_children(&zk, &l).await })
    });
    queue::herd::<ZooKeeperBackend>(&url, 20, &lock, queued).await
}

/// Children under the lock node, counted with ZooKeeper's own CLI.
async fn count_children(f: &Zk, lock: &str) -> Result<usize, Failed> {
    let cmd = server::cli(&f.host_port()?, &["ls", &format!("/distlock/{lock}")])
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
    queue::leader_killed::<ZooKeeperBackend>(
        || server::ensemble(3),
        |hosts| format!("zk://{hosts}?session_timeout_ms=10000"),
        &name(),
        Duration::from_secs(10),
        |members| {
            members
                .iter()
                .find(|m| server::is_leader(m.port))
                .map(|m| m.port)
        },
    )
    .await
}

/// See [`integration_tests::stall::a_wait_ends_by_its_deadline`].
async fn stalled_wait(f: Arc<Zk>) -> Result<(), Failed> {
    integration_tests::stall::a_wait_ends_by_its_deadline(f.url()?, |url| async move {
        ZooKeeperBackend::connect(&url).await
    })
    .await
}

/// A waiter (a lock's, then a permit's) cut off from ZooKeeper until its
/// deadline ends at its deadline with the failure (unreachable: exit 69 in
/// the CLI), as on the other backends; one whose connection came back
/// meanwhile ends with a timeout. Its session outlives the outage.
async fn wait_runs_out_while_cut_off(f: Arc<Zk>) -> Result<(), Failed> {
    let port = integration_tests::harness::host_port(&format!("zk://{}", f.host_port()?))
        .ok_or("no port")?
        .1;
    let holder = distlock_client(&f).await?;
    let lock = name();
    let ttl = Duration::from_secs(20);
    let wait = Duration::from_secs(4);
    let _g = holder.lock(&lock).ttl(ttl).acquire().await?;
    let semaphore = format!("{lock}-permits");
    let _p = holder.semaphore(&semaphore, 1).ttl(ttl).acquire().await?;
    for permit in [false, true] {
        let what = if permit { "a permit's" } else { "a lock's" };
        let proxy = Proxy::start(port).map_err(|e| e.to_string())?;
        let waiter = LockClient::new(
            ZooKeeperBackend::connect(&format!("zk://127.0.0.1:{}", proxy.port)).await?,
        );
        let start = |waiter: LockClient| {
            let (lock, semaphore) = (lock.clone(), semaphore.clone());
            tokio::spawn(async move {
                let r = if permit {
                    let b = waiter.semaphore(&semaphore, 1).ttl(ttl).wait(wait);
                    b.acquire().await
                } else {
                    waiter.lock(&lock).ttl(ttl).wait(wait).acquire().await
                };
                (r, Instant::now())
            })
        };
        // A connection that comes back at once: the wait runs out behind
        // the live holder.
        let waiting = start(waiter.clone());
        tokio::time::sleep(HELD).await;
        proxy.sever();
        let (r, _) = waiting.await.map_err(|e| e.to_string())?;
        if !matches!(r, Err(Error::WaitTimeout { .. })) {
            return Err(format!("{what} wait that outlasted a blip ended with {r:?}").into());
        }
        let started = Instant::now();
        let waiting = start(waiter);
        tokio::time::sleep(HELD).await;
        proxy.sever();
        drop(proxy);
        let (r, ended) = waiting.await.map_err(|e| e.to_string())?;
        if !matches!(r, Err(Error::Unavailable { .. })) {
            return Err(format!("{what} cut-off wait ended with {r:?}, not unreachable").into());
        }
        let took = ended - started;
        if took > wait + Duration::from_secs(2) {
            return Err(format!("{what} {wait:?} wait ended after {took:?}").into());
        }
    }
    Ok(())
}

/// The holder's connection goes through a proxy that is cut: it sees lost()
/// at once (a disconnection counts as lost), and another client gets the
/// lock only once the server has expired the holder's session.
async fn cut_off(f: Arc<Zk>) -> Result<(), Failed> {
    let port = integration_tests::harness::host_port(&format!("zk://{}", f.host_port()?))
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
    let other =
        LockClient::new(ZooKeeperBackend::connect(&format!("zk://{}", f.host_port()?)).await?);
    let lock = name();
    // An earlier lock, released, leaves its session's watcher idle; the
    // next lock in the session must still hear of the session's end.
    holder.lock(name()).acquire().await?.release().await?;
    // The hold's session times out after its TTL.
    let g = holder.lock(&lock).ttl(timeout).acquire().await?;
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

/// With `hold_while_disconnected=true` a hold outlives a connection the
/// client re-establishes within its session: `lost()` does not fire, nobody
/// else is granted the lock, and the release finds it still the holder's.
/// Without the option the same disconnection reports the hold lost (the
/// session may expire unseen), and the lock is free once the server
/// expires the session or the node goes.
async fn hold_while_disconnected(f: Arc<Zk>) -> Result<(), Failed> {
    let port = integration_tests::harness::host_port(&format!("zk://{}", f.host_port()?))
        .ok_or("no port")?
        .1;
    let proxy = Proxy::start(port).map_err(|e| e.to_string())?;
    let through = |hold: bool| {
        format!(
            "zk://127.0.0.1:{}/conformance?hold_while_disconnected={hold}",
            proxy.port
        )
    };
    let other = LockClient::new(
        ZooKeeperBackend::connect(&format!("zk://{}/conformance", f.host_port()?)).await?,
    );
    let ttl = Duration::from_secs(6);
    // Cuts the connections and waits for the client to connect again.
    let sever = || async {
        let before = proxy.accepted();
        proxy.sever();
        let start = Instant::now();
        while proxy.accepted() <= before {
            if start.elapsed() > Duration::from_secs(20) {
                return Err(Failed::from("the client never connected again"));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok(())
    };

    let keeping = LockClient::new(ZooKeeperBackend::connect(&through(true)).await?);
    let lock = name();
    let g = keeping.lock(&lock).ttl(ttl).acquire().await?;
    sever().await?;
    if let Ok(reason) = tokio::time::timeout(Duration::from_secs(2), g.lost()).await {
        return Err(
            format!("lost() fired through a reconnect within the session: {reason}").into(),
        );
    }
    if !g.is_held() {
        return Err("the hold no longer counts as held after the reconnect".into());
    }
    if other.lock(&lock).try_acquire().await?.is_some() {
        return Err("another client was granted the lock the reconnected holder keeps".into());
    }
    if !g.release().await? {
        return Err("the release after the reconnect found the lock no longer held".into());
    }

    let plain = LockClient::new(ZooKeeperBackend::connect(&through(false)).await?);
    let lock = name();
    let g = plain.lock(&lock).ttl(ttl).acquire().await?;
    sever().await?;
    let reason = tokio::time::timeout(Duration::from_secs(10), g.lost())
        .await
        .map_err(|_| {
            Failed::from(
                "without hold_while_disconnected a disconnection did not report the hold lost",
            )
        })?;
    if g.is_held() {
        return Err(format!("reported lost ({reason}) but still held").into());
    }
    drop(g);
    let g2 = other
        .lock(&lock)
        .wait(ttl * 3)
        .acquire()
        .await
        .map_err(|e| format!("the lock given up after the disconnection was never free: {e}"))?;
    g2.release().await?;
    drop(proxy);
    Ok(())
}

/// On a server with ZooKeeper's stock `tickTime` of 2 s, a session ends
/// at the first tick after its timeout: a vanished holder of a 4 s TTL
/// (the shortest such a server grants) is replaced up to 2 s late, within
/// the lag the backend declares (half the TTL), never before the holder's
/// deadline: the bounds the suite's expiry cases apply.
async fn stock_tick() -> Result<(), Failed> {
    let server = tokio::task::spawn_blocking(|| server::spawn_with("tickTime=2000\n"))
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| e.to_string())?;
    let url = format!("zk://127.0.0.1:{}/conformance", server.port);
    let name = LockName::new("stock/vanish")?;
    let ttl = Duration::from_secs(4);
    // Detached: dropped, the client leaves its session to expire, as a
    // crashed process would.
    let raw = ZooKeeperBackend::connect(&format!("{url}?detached=true")).await?;
    let caps = raw.capabilities();
    let lag = caps.expiry_lag(ttl);
    if lag != Duration::from_secs(2) {
        return Err(format!("declared lag {lag:?} for a 4 s TTL, not half of it").into());
    }
    let req = LockRequest::new(name.clone(), ttl);
    let grant = raw
        .try_acquire(&req)
        .await?
        .ok_or("a free lock was refused")?;
    drop(raw);
    let other = LockClient::new(ZooKeeperBackend::connect(&url).await?);
    let g = other
        .lock(name.as_str())
        .ttl(Duration::from_secs(30))
        .wait(Duration::from_secs(30))
        .acquire()
        .await?;
    let took = grant.began.elapsed();
    g.release().await?;
    // Beyond the lag, the server's closing of the session (a JVM that
    // syncs its log), the watch and the next grant on a loaded machine.
    let slack = Duration::from_secs(2);
    if took < caps.safe_validity(ttl) || took > ttl + lag + slack {
        return Err(format!(
            "replaced after {took:?}, outside {ttl:?}..{:?}",
            ttl + lag + slack
        )
        .into());
    }
    drop(server);
    Ok(())
}

/// A hold's TTL is its session's timeout, which the server keeps between
/// its minSessionTimeout and maxSessionTimeout: a TTL outside them is
/// refused with both numbers, not served by a session of another length,
/// and the session opened to learn it is closed again.
async fn ttl_outside_session_bounds() -> Result<(), Failed> {
    let server = tokio::task::spawn_blocking(|| {
        server::spawn_with("minSessionTimeout=4000\nmaxSessionTimeout=8000\n")
    })
    .await
    .map_err(|e| e.to_string())?
    .map_err(|e| e.to_string())?;
    let client = LockClient::new(
        ZooKeeperBackend::connect(&format!("zk://127.0.0.1:{}", server.port)).await?,
    );
    let port = server.port;
    let connections = move || {
        server::alive_connections(port).ok_or_else(|| Failed::from("mntr gave no connection count"))
    };
    let before = connections()?;
    for (ttl, bound, knob) in [
        (Duration::from_secs(2), "4s", "minSessionTimeout"),
        (Duration::from_secs(20), "8s", "maxSessionTimeout"),
    ] {
        match client.lock(name()).ttl(ttl).try_acquire().await {
            Err(e @ Error::InvalidInput { .. }) => {
                let text = e.to_string();
                if !text.contains(bound) || !text.contains(knob) {
                    return Err(format!(
                        "TTL {ttl:?}: the error names neither {bound} nor {knob}: {text}"
                    )
                    .into());
                }
            }
            Err(e) => return Err(format!("TTL {ttl:?}: expected InvalidInput, got {e:?}").into()),
            Ok(_) => {
                return Err(format!(
                    "TTL {ttl:?} was granted on a server whose sessions last 4-8 s"
                )
                .into())
            }
        }
    }
    // Twenty refused TTLs more, each of its own length.
    for ms in 1000..1020 {
        if client
            .lock(name())
            .ttl(Duration::from_millis(ms))
            .try_acquire()
            .await
            .is_ok()
        {
            return Err(format!("TTL {ms} ms was granted below minSessionTimeout").into());
        }
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while connections()? > before {
        if Instant::now() > deadline {
            return Err(format!(
                "{} connections open after 22 refused TTLs, {before} before",
                connections()?
            )
            .into());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let g = client
        .lock(name())
        .ttl(Duration::from_secs(5))
        .try_acquire()
        .await?
        .ok_or("a TTL inside the bounds was not granted")?;
    g.release().await?;
    drop(server);
    Ok(())
}

/// The create reaches the server but its reply is lost, then the connection
/// breaks. The client must find its node again by its owner value, not
/// create a second one, and leave nothing behind after release.
async fn create_loss(f: Arc<Zk>) -> Result<(), Failed> {
    let port = integration_tests::harness::host_port(&format!("zk://{}", f.host_port()?))
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

/// Debian's jars that a Curator `InterProcessMutex` program needs, each
/// `/usr/share/java/<name>.jar`.
const CURATOR_JARS: &[&str] = &[
    "curator-client",
    "curator-framework",
    "curator-recipes",
    "zookeeper",
    "zookeeper-jute",
    "guava",
    "slf4j-api",
    "slf4j-nop",
    "netty-handler",
    "netty-transport",
    "netty-common",
    "netty-buffer",
    "netty-codec",
    "netty-resolver",
    "netty-transport-native-epoll",
    "netty-transport-native-unix-common",
];

const CURATOR_INSTALL: &str = "run scripts/install-servers.sh as root, or apt-get install default-jdk-headless libcurator-recipes-java libcurator-framework-java libcurator-client-java";

/// The Java programs the Curator interop tests run.
const CURATOR_SOURCES: &[&str] = &[
    concat!(env!("CARGO_MANIFEST_DIR"), "/java/CuratorMutex.java"),
    concat!(env!("CARGO_MANIFEST_DIR"), "/java/CuratorLatch.java"),
];

/// How long a contender must stay waiting while the lock is held elsewhere.
/// Passing proves nothing about longer holds, but a broken exclusion shows
/// within milliseconds of the contender being queued.
const HELD: Duration = Duration::from_millis(1500);

/// A bound for anything that should happen: a JVM starting on a loaded
/// machine, a release reaching the next in line.
const PATIENCE: Duration = Duration::from_secs(60);

fn curator_classpath() -> String {
    CURATOR_JARS
        .iter()
        .map(|j| format!("/usr/share/java/{j}.jar"))
        .collect::<Vec<_>>()
        .join(":")
}

/// The compiled Curator programs, removed once the last test holding them is done.
struct CuratorClasses(PathBuf);

impl Drop for CuratorClasses {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Compiles [`CURATOR_SOURCES`] once per test run. A missing JDK or jar is
/// an error, not a skip: the claim that Curator and distlock share one queue
/// must not pass untested.
async fn curator_classes(build: &CuratorBuild) -> Result<PathBuf, Failed> {
    let build = build.clone();
    tokio::task::spawn_blocking(move || match build.get_or_init(compile_curator) {
        Ok(c) => Ok(c.0.clone()),
        Err(e) => Err(Failed::from(e.as_str())),
    })
    .await
    .map_err(|e| e.to_string())?
}

fn compile_curator() -> Result<CuratorClasses, String> {
    let missing: Vec<String> = CURATOR_JARS
        .iter()
        .map(|j| format!("/usr/share/java/{j}.jar"))
        .filter(|p| !Path::new(p).is_file())
        .collect();
    if !missing.is_empty() {
        return Err(format!(
            "the Curator interop tests need {}; {CURATOR_INSTALL}",
            missing.join(", ")
        ));
    }
    let javac = integration_tests::harness::process::find_binary("javac", &[], CURATOR_INSTALL)
        .map_err(|e| format!("the Curator interop tests compile Java: {e}"))?;
    let out = CuratorClasses(
        integration_tests::harness::process::temp_dir("curator-classes")
            .map_err(|e| e.to_string())?,
    );
    let mut cmd = Command::new(javac);
    cmd.arg("-cp")
        .arg(curator_classpath())
        .arg("-d")
        .arg(&out.0)
        .args(CURATOR_SOURCES);
    integration_tests::harness::process::run_client(cmd)
        .map_err(|e| format!("compiling {}: {e}", CURATOR_SOURCES.join(" ")))?;
    Ok(out)
}

/// The ZooKeeper path of a distlock lock at the default root, where a
/// Curator mutex on the same lock must live.
fn zk_path(lock: &str) -> String {
    format!("/distlock/{lock}")
}

/// A Curator JVM (`CuratorMutex` contending for one path, or the
/// `CuratorLatch` inside a [`Latch`]). It is killed when dropped, so a
/// failing test leaves neither a process nor a held node behind.
struct Curator {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: tokio::sync::mpsc::UnboundedReceiver<String>,
    stderr: PathBuf,
}

/// Which Curator recipe a [`Curator`] process takes.
#[derive(Clone, Copy)]
enum Recipe {
    /// `InterProcessMutex`.
    Mutex,
    /// The read lock of an `InterProcessReadWriteLock`.
    Read,
    /// The write lock of an `InterProcessReadWriteLock`.
    Write,
}

impl Recipe {
    fn arg(self) -> &'static str {
        match self {
            Recipe::Mutex => "mutex",
            Recipe::Read => "read",
            Recipe::Write => "write",
        }
    }
}

impl Curator {
    fn spawn(classes: &Path, hosts: &str, path: &str) -> Result<Self, Failed> {
        Self::spawn_as(classes, hosts, path, None)
    }

    /// [`Curator::spawn`], authenticated with `user:password` (digest) when
    /// given, creating its nodes with the creator-all, world-read ACL.
    fn spawn_as(
        classes: &Path,
        hosts: &str,
        path: &str,
        credentials: Option<&str>,
    ) -> Result<Self, Failed> {
        Self::spawn_recipe(classes, hosts, path, Recipe::Mutex, credentials)
    }

    /// A process taking `recipe` on `path`.
    fn spawn_recipe(
        classes: &Path,
        hosts: &str,
        path: &str,
        recipe: Recipe,
        credentials: Option<&str>,
    ) -> Result<Self, Failed> {
        let mut args = vec![recipe.arg(), hosts, path];
        args.extend(credentials);
        Self::spawn_class(classes, "CuratorMutex", &args)
    }

    /// A JVM running `class` (one of [`CURATOR_SOURCES`]) with `args`.
    fn spawn_class(classes: &Path, class: &str, args: &[&str]) -> Result<Self, Failed> {
        let java = integration_tests::harness::process::find_binary("java", &[], CURATOR_INSTALL)
            .map_err(|e| e.to_string())?;
        let stderr = classes.join(format!(
            "stderr-{}.log",
            &distlock_core::Owner::random().to_string()[..8]
        ));
        let log = std::fs::File::create(&stderr).map_err(|e| e.to_string())?;
        let mut child = Command::new(java)
            .args([
                "-Xmx64m",
                "-XX:+UseSerialGC",
                "-XX:TieredStopAtLevel=1",
                "-cp",
            ])
            .arg(format!("{}:{}", curator_classpath(), classes.display()))
            .arg(class)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(log)
            .spawn()
            .map_err(|e| format!("starting the Curator JVM: {e}"))?;
        let stdin = child.stdin.take();
        let stdout = child.stdout.take().ok_or("no stdout pipe")?;
        let (tx, lines) = tokio::sync::mpsc::unbounded_channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Ok(Self {
            child,
            stdin,
            lines,
            stderr,
        })
    }

    fn stderr_tail(&self) -> String {
        let s = std::fs::read_to_string(&self.stderr).unwrap_or_default();
        let start = s.len().saturating_sub(2000);
        s.get(start..).unwrap_or(&s).to_string()
    }

    /// The next line it prints within `within`: `Ok(None)` if none came.
    async fn next_line(&mut self, within: Duration) -> Result<Option<String>, Failed> {
        match tokio::time::timeout(within, self.lines.recv()).await {
            Err(_) => Ok(None),
            Ok(Some(line)) => Ok(Some(line)),
            Ok(None) => Err(format!(
                "the Curator process exited ({:?}); stderr: {}",
                self.child.try_wait(),
                self.stderr_tail()
            )
            .into()),
        }
    }

    async fn acquired(&mut self) -> Result<(), Failed> {
        match self.next_line(PATIENCE).await? {
            Some(l) if l.starts_with("ACQUIRED ") => Ok(()),
            Some(l) => Err(format!("Curator printed {l:?}, expected ACQUIRED").into()),
            None => Err(format!(
                "Curator did not acquire within {PATIENCE:?}; stderr: {}",
                self.stderr_tail()
            )
            .into()),
        }
    }

    async fn still_waiting(&mut self, while_: &str) -> Result<(), Failed> {
        match self.next_line(HELD).await? {
            None => Ok(()),
            Some(l) => Err(format!("Curator printed {l:?} while {while_}").into()),
        }
    }

    async fn release(&mut self) -> Result<(), Failed> {
        let mut stdin = self.stdin.take().ok_or("Curator already released")?;
        stdin
            .write_all(b"release\n")
            .and_then(|()| stdin.flush())
            .map_err(|e| format!("telling Curator to release: {e}"))?;
        match self.next_line(PATIENCE).await? {
            Some(l) if l == "RELEASED" => Ok(()),
            other => {
                Err(format!("Curator answered {other:?} to release, expected RELEASED").into())
            }
        }
    }
}

impl Drop for Curator {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Waits until the lock's node has `n` children: a contender that started
/// must also have queued before the test relies on its place in line.
async fn wait_for_children(f: &Zk, lock: &str, n: usize) -> Result<(), Failed> {
    let start = Instant::now();
    loop {
        let have = count_children(f, lock).await?;
        if have == n {
            return Ok(());
        }
        if start.elapsed() > PATIENCE {
            return Err(
                format!("{have} children under {lock} after {PATIENCE:?}, expected {n}").into(),
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A distlock acquire waiting in the background, cancelled (and so
/// dequeued) when dropped, so a failing test leaves no waiter behind.
struct Pending(tokio::task::JoinHandle<distlock_core::Result<LockGuard>>);

impl Drop for Pending {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Starts a distlock acquire in the background.
fn distlock_waiter(client: &LockClient, lock: &str) -> Pending {
    let builder = client
        .lock(lock)
        .ttl(Duration::from_secs(30))
        .wait(PATIENCE * 2);
    Pending(tokio::spawn(builder.acquire()))
}

/// Starts a distlock shared acquire in the background.
fn distlock_reader(client: &LockClient, lock: &str) -> Pending {
    let builder = client
        .lock(lock)
        .shared()
        .ttl(Duration::from_secs(30))
        .wait(PATIENCE * 2);
    Pending(tokio::spawn(builder.acquire()))
}

/// Fails unless `w` is still waiting after [`HELD`].
async fn distlock_still_waiting(w: &mut Pending, while_: &str) -> Result<(), Failed> {
    match tokio::time::timeout(HELD, &mut w.0).await {
        Err(_) => Ok(()),
        Ok(r) => Err(format!(
            "a distlock acquire finished while {while_}: {:?}",
            r.map(|r| r.map(|g| g.token()))
        )
        .into()),
    }
}

async fn distlock_acquired(mut w: Pending) -> Result<LockGuard, Failed> {
    Ok(tokio::time::timeout(PATIENCE, &mut w.0)
        .await
        .map_err(|_| Failed::from(format!("distlock did not acquire within {PATIENCE:?}")))?
        .map_err(|e| e.to_string())??)
}

async fn distlock_client(f: &Zk) -> Result<LockClient, Failed> {
    Ok(LockClient::new(
        ZooKeeperBackend::connect(&format!("zk://{}", f.host_port()?)).await?,
    ))
}

/// A distlock client whose exclusive nodes are Curator write-lock nodes.
async fn distlock_rw_client(f: &Zk) -> Result<LockClient, Failed> {
    Ok(LockClient::new(
        ZooKeeperBackend::connect(&format!("zk://{}?layout=rwlock", f.host_port()?)).await?,
    ))
}

/// `client`'s shared hold of `lock` at once, or `None`.
async fn try_shared(client: &LockClient, lock: &str) -> Result<Option<LockGuard>, Failed> {
    Ok(client
        .lock(lock)
        .shared()
        .ttl(Duration::from_secs(30))
        .try_acquire()
        .await?)
}

/// `client`'s exclusive hold of `lock` at once, or `None`.
async fn try_exclusive(client: &LockClient, lock: &str) -> Result<Option<LockGuard>, Failed> {
    Ok(client
        .lock(lock)
        .ttl(Duration::from_secs(30))
        .try_acquire()
        .await?)
}

/// Fails with `what` if `got` is a hold.
fn refused(got: Option<LockGuard>, what: &str) -> Result<(), Failed> {
    match got {
        None => Ok(()),
        Some(g) => Err(format!("{what}: distlock got token {}", g.token()).into()),
    }
}

/// A client of the `mutex` layout and one of the `rwlock` layout on one
/// lock: each one's exclusive hold refuses the other's shared and exclusive
/// requests, and a shared hold of either refuses the other's exclusive one
/// but not its shared one.
async fn clients_of_both_layouts_exclude_each_other(f: Arc<Zk>) -> Result<(), Failed> {
    let lock = name();
    let (m, rw) = (distlock_client(&f).await?, distlock_rw_client(&f).await?);
    for (holder, other) in [(&m, &rw), (&rw, &m)] {
        let g = try_exclusive(holder, &lock)
            .await?
            .ok_or("the free lock was refused")?;
        refused(
            try_exclusive(other, &lock).await?,
            "an exclusive try_acquire of the other layout beside an exclusive hold",
        )?;
        refused(
            try_shared(other, &lock).await?,
            "a shared try_acquire of the other layout beside an exclusive hold",
        )?;
        g.release().await?;
        let r = try_shared(holder, &lock)
            .await?
            .ok_or("the free lock was refused to a reader")?;
        refused(
            try_exclusive(other, &lock).await?,
            "an exclusive try_acquire of the other layout beside a shared hold",
        )?;
        try_shared(other, &lock)
            .await?
            .ok_or("a reader of the other layout was refused beside a reader")?
            .release()
            .await?;
        r.release().await?;
    }
    Ok(())
}

/// With the default `mutex` layout: while a Curator `InterProcessMutex`
/// holds, distlock's shared `try_acquire` is refused and its shared acquire
/// waits (distlock reads a `-lock-` node as exclusive); the release lets
/// the reader in.
async fn curator_mutex_excludes_distlock_readers(
    f: Arc<Zk>,
    build: CuratorBuild,
) -> Result<(), Failed> {
    let classes = curator_classes(&build).await?;
    let lock = name();
    let client = distlock_client(&f).await?;
    let mut curator = Curator::spawn(&classes, &f.host_port()?, &zk_path(&lock))?;
    curator.acquired().await?;
    refused(
        try_shared(&client, &lock).await?,
        "a shared try_acquire beside Curator's mutex",
    )?;
    let mut reader = distlock_reader(&client, &lock);
    wait_for_children(&f, &lock, 2).await?;
    distlock_still_waiting(&mut reader, "Curator held the mutex").await?;
    curator.release().await?;
    distlock_acquired(reader).await?.release().await?;
    Ok(())
}

/// With the `rwlock` layout: while a Curator write lock holds, distlock's
/// shared and exclusive `try_acquire` are refused and both kinds wait; its
/// release lets the distlock reader in, and the distlock writer queued
/// behind it only after the reader.
async fn curator_write_lock_excludes_distlock_readers_and_writers(
    f: Arc<Zk>,
    build: CuratorBuild,
) -> Result<(), Failed> {
    let classes = curator_classes(&build).await?;
    let lock = name();
    let (r, w) = (distlock_rw_client(&f).await?, distlock_rw_client(&f).await?);
    let mut curator = Curator::spawn_recipe(
        &classes,
        &f.host_port()?,
        &zk_path(&lock),
        Recipe::Write,
        None,
    )?;
    curator.acquired().await?;
    refused(
        try_shared(&r, &lock).await?,
        "a shared try_acquire beside Curator's write lock",
    )?;
    refused(
        try_exclusive(&w, &lock).await?,
        "an exclusive try_acquire beside Curator's write lock",
    )?;
    let mut reader = distlock_reader(&r, &lock);
    wait_for_children(&f, &lock, 2).await?;
    let mut writer = distlock_waiter(&w, &lock);
    wait_for_children(&f, &lock, 3).await?;
    distlock_still_waiting(&mut reader, "Curator held the write lock").await?;
    distlock_still_waiting(&mut writer, "Curator held the write lock").await?;
    curator.release().await?;
    let g = distlock_acquired(reader).await?;
    distlock_still_waiting(&mut writer, "a distlock reader held the lock").await?;
    g.release().await?;
    distlock_acquired(writer).await?.release().await?;
    Ok(())
}

/// With the `rwlock` layout: while distlock holds the lock exclusively, a
/// Curator read lock and a Curator write lock queued behind it wait; its
/// release lets the Curator reader in, and the Curator writer only after
/// that reader.
async fn distlock_writer_excludes_curator_readers_and_writers(
    f: Arc<Zk>,
    build: CuratorBuild,
) -> Result<(), Failed> {
    let classes = curator_classes(&build).await?;
    let hosts = f.host_port()?;
    let lock = name();
    let client = distlock_rw_client(&f).await?;
    let g = client
        .lock(&lock)
        .ttl(Duration::from_secs(30))
        .acquire()
        .await?;
    let mut reader = Curator::spawn_recipe(&classes, &hosts, &zk_path(&lock), Recipe::Read, None)?;
    wait_for_children(&f, &lock, 2).await?;
    let mut writer = Curator::spawn_recipe(&classes, &hosts, &zk_path(&lock), Recipe::Write, None)?;
    wait_for_children(&f, &lock, 3).await?;
    reader.still_waiting("distlock held the lock").await?;
    writer.still_waiting("distlock held the lock").await?;
    g.release().await?;
    reader.acquired().await?;
    writer
        .still_waiting("a Curator reader held the read lock")
        .await?;
    reader.release().await?;
    writer.acquired().await?;
    refused(
        try_shared(&client, &lock).await?,
        "a shared try_acquire beside Curator's write lock",
    )?;
    writer.release().await?;
    Ok(())
}

/// With the `rwlock` layout: a distlock reader and a Curator read lock hold
/// at the same time whichever came first; together they keep a Curator
/// writer waiting and refuse distlock's exclusive request; the waiting
/// Curator writer holds new distlock readers back, and gets the lock once
/// both readers released.
async fn curator_and_distlock_readers_overlap(
    f: Arc<Zk>,
    build: CuratorBuild,
) -> Result<(), Failed> {
    let classes = curator_classes(&build).await?;
    let hosts = f.host_port()?;
    let lock = name();
    let (a, b) = (distlock_rw_client(&f).await?, distlock_rw_client(&f).await?);
    let first = try_shared(&a, &lock)
        .await?
        .ok_or("the first distlock reader was refused")?;
    let mut reader = Curator::spawn_recipe(&classes, &hosts, &zk_path(&lock), Recipe::Read, None)?;
    reader.acquired().await?;
    let second = try_shared(&b, &lock)
        .await?
        .ok_or("a distlock reader was refused beside a Curator read lock")?;
    second.release().await?;
    refused(
        try_exclusive(&b, &lock).await?,
        "an exclusive try_acquire beside Curator's and distlock's readers",
    )?;
    let mut writer = Curator::spawn_recipe(&classes, &hosts, &zk_path(&lock), Recipe::Write, None)?;
    wait_for_children(&f, &lock, 3).await?;
    writer
        .still_waiting("a distlock reader and a Curator reader held the lock")
        .await?;
    refused(
        try_shared(&b, &lock).await?,
        "a shared try_acquire ahead of a waiting Curator writer",
    )?;
    reader.release().await?;
    writer
        .still_waiting("a distlock reader held the lock")
        .await?;
    first.release().await?;
    writer.acquired().await?;
    writer.release().await?;
    Ok(())
}

/// While a Curator process holds the mutex, distlock's try_acquire fails and
/// its acquire waits; Curator's release lets the waiter in.
async fn curator_holder_excludes_distlock(f: Arc<Zk>, build: CuratorBuild) -> Result<(), Failed> {
    let classes = curator_classes(&build).await?;
    let lock = name();
    let client = distlock_client(&f).await?;
    let mut curator = Curator::spawn(&classes, &f.host_port()?, &zk_path(&lock))?;
    curator.acquired().await?;
    if let Some(g) = client.lock(&lock).try_acquire().await? {
        return Err(format!(
            "distlock's try_acquire got token {} while Curator held the mutex",
            g.token()
        )
        .into());
    }
    let mut waiter = distlock_waiter(&client, &lock);
    wait_for_children(&f, &lock, 2).await?;
    distlock_still_waiting(&mut waiter, "Curator held the mutex").await?;
    // Curator's node is listed as the holder, with the IP address Curator
    // writes into it as its holder info; distlock's queued one is not.
    let listed = client.list(&lock, 10).await?;
    let ip = |h: &Option<String>| {
        h.as_deref()
            .is_some_and(|h| h.parse::<std::net::IpAddr>().is_ok())
    };
    match listed.as_slice() {
        [r] if r.kind == HoldKind::Exclusive && r.token.is_some() && ip(&r.holder_info) => {}
        other => return Err(format!("list shows {other:?} while Curator holds").into()),
    }
    curator.release().await?;
    let g = distlock_acquired(waiter).await?;
    g.release().await?;
    Ok(())
}

/// While distlock holds the lock, a Curator process queued on the same path
/// waits; distlock's release lets it in.
async fn distlock_holder_excludes_curator(f: Arc<Zk>, build: CuratorBuild) -> Result<(), Failed> {
    let classes = curator_classes(&build).await?;
    let lock = name();
    let client = distlock_client(&f).await?;
    let g = client
        .lock(&lock)
        .ttl(Duration::from_secs(30))
        .acquire()
        .await?;
    let mut curator = Curator::spawn(&classes, &f.host_port()?, &zk_path(&lock))?;
    wait_for_children(&f, &lock, 2).await?;
    curator.still_waiting("distlock held the lock").await?;
    g.release().await?;
    curator.acquired().await?;
    curator.release().await?;
    Ok(())
}

/// Holder A, then waiter B of the other kind, then waiter C of A's kind:
/// A's release goes to B, not C, and C gets the lock only after B, with
/// distlock and Curator in either role.
async fn distlock_and_curator_queue_in_one_line(
    f: Arc<Zk>,
    build: CuratorBuild,
) -> Result<(), Failed> {
    let classes = curator_classes(&build).await?;
    let hosts = f.host_port()?;

    // distlock A, Curator B, distlock C.
    let lock = name();
    let (a, c) = (distlock_client(&f).await?, distlock_client(&f).await?);
    let held = a.lock(&lock).ttl(Duration::from_secs(30)).acquire().await?;
    let mut b = Curator::spawn(&classes, &hosts, &zk_path(&lock))?;
    wait_for_children(&f, &lock, 2).await?;
    let mut waiter_c = distlock_waiter(&c, &lock);
    wait_for_children(&f, &lock, 3).await?;
    b.still_waiting("distlock A held the lock").await?;
    held.release().await?;
    tokio::select! {
        r = b.acquired() => r?,
        r = &mut waiter_c.0 => {
            return Err(format!(
                "distlock C, queued after Curator B, got the lock first: {:?}",
                r.map(|r| r.map(|g| g.token()))
            )
            .into());
        }
    }
    distlock_still_waiting(&mut waiter_c, "Curator B held the mutex").await?;
    b.release().await?;
    distlock_acquired(waiter_c).await?.release().await?;

    // Curator A, distlock B, Curator C.
    let lock = name();
    let mut a = Curator::spawn(&classes, &hosts, &zk_path(&lock))?;
    a.acquired().await?;
    let b = distlock_client(&f).await?;
    let mut waiter_b = distlock_waiter(&b, &lock);
    wait_for_children(&f, &lock, 2).await?;
    let mut c = Curator::spawn(&classes, &hosts, &zk_path(&lock))?;
    wait_for_children(&f, &lock, 3).await?;
    distlock_still_waiting(&mut waiter_b, "Curator A held the mutex").await?;
    a.release().await?;
    let g = tokio::select! {
        r = c.acquired() => {
            r?;
            return Err("Curator C, queued after distlock B, got the mutex first".into());
        }
        r = &mut waiter_b.0 => r.map_err(|e| e.to_string())??,
    };
    c.still_waiting("distlock B held the lock").await?;
    g.release().await?;
    c.acquired().await?;
    c.release().await?;
    Ok(())
}

/// Curator and distlock authenticated as the same digest user, both
/// creating nodes only their creator may change, under a root nobody else
/// made: each one's holder excludes the other's waiter, and the waiter gets
/// the lock on release (so each can create and watch nodes beside the
/// other's).
async fn same_credentials_as_curator(f: Arc<Zk>, build: CuratorBuild) -> Result<(), Failed> {
    const CREDENTIALS: &str = "alice:s3cret";
    let classes = curator_classes(&build).await?;
    let hosts = f.host_port()?;
    let root = format!("acl-curator-{}", &integration_tests::namespace()[12..]);
    let lock = "jobs/shared-acl";
    let path = format!("/{root}/{lock}");
    let client = LockClient::new(
        ZooKeeperBackend::connect(&format!("zk://{CREDENTIALS}@{hosts}?root={root}")).await?,
    );
    // Curator first: it creates the path's parents with its ACL.
    let mut curator = Curator::spawn_as(&classes, &hosts, &path, Some(CREDENTIALS))?;
    curator.acquired().await?;
    if let Some(g) = client.lock(lock).try_acquire().await? {
        return Err(format!(
            "distlock got token {} while Curator held the mutex",
            g.token()
        )
        .into());
    }
    let mut waiter = distlock_waiter(&client, lock);
    distlock_still_waiting(&mut waiter, "Curator held the mutex").await?;
    curator.release().await?;
    let g = distlock_acquired(waiter).await?;
    let mut curator = Curator::spawn_as(&classes, &hosts, &path, Some(CREDENTIALS))?;
    curator.still_waiting("distlock held the lock").await?;
    g.release().await?;
    curator.acquired().await?;
    curator.release().await?;
    Ok(())
}

/// With `user:password@` in the URL every node distlock creates carries the
/// ACL "the creator may do everything, anyone may read": ZooKeeper's own CLI,
/// unauthenticated, can list the lock's queue but not delete the holder's
/// node; a distlock reader without credentials still sees the lock held;
/// a client with other credentials gets a typed error instead of the lock.
async fn acls_protect_the_holder(f: Arc<Zk>) -> Result<(), Failed> {
    let host_port = f.host_port()?;
    let root = format!("acl-{}", &integration_tests::namespace()[12..]);
    let url = |creds: &str| format!("zk://{creds}{host_port}?root={root}");
    let holder = LockClient::new(ZooKeeperBackend::connect(&url("alice:s3cret@")).await?);
    let g = holder.lock("jobs/acl").acquire().await?;
    let zk_cli = |args: Vec<String>| {
        let cmd = server::cli(
            &host_port,
            &args.iter().map(String::as_str).collect::<Vec<_>>(),
        );
        async move {
            let cmd = cmd.map_err(|e| e.to_string())?;
            tokio::task::spawn_blocking(move || {
                integration_tests::harness::process::run_client(cmd)
            })
            .await
            .map_err(|e| Failed::from(e.to_string()))
        }
    };
    let parent = format!("/{root}/jobs/acl");
    let listed = zk_cli(vec!["ls".into(), parent.clone()])
        .await?
        .map_err(Failed::from)?;
    let node = listed
        .lines()
        .rev()
        .find(|l| l.starts_with('['))
        .and_then(|l| {
            l.trim_matches(['[', ']'])
                .split(',')
                .next()
                .map(|n| n.trim().to_string())
        })
        .filter(|n| !n.is_empty())
        .ok_or_else(|| {
            Failed::from(format!(
                "the queue is not readable without credentials: {listed}"
            ))
        })?;
    let deleted = zk_cli(vec!["delete".into(), format!("{parent}/{node}")]).await?;
    let refused = match &deleted {
        Ok(out) | Err(out) => out.contains("Insufficient permission") || out.contains("NoAuth"),
    };
    if !refused {
        return Err(format!(
            "an unauthenticated delete of the holder's node was not refused: {deleted:?}"
        )
        .into());
    }
    if !g.is_held() {
        return Err("the holder lost its lock to an unauthenticated client".into());
    }
    let reader = ZooKeeperBackend::connect(&url("")).await?;
    if !reader.inspect(&LockName::new("jobs/acl")?).await?.held {
        return Err("a reader without credentials does not see the lock held".into());
    }
    let other = LockClient::new(ZooKeeperBackend::connect(&url("mallory:guess@")).await?);
    match other.lock("jobs/acl").try_acquire().await {
        Err(Error::Misconfigured { .. }) => {}
        got => return Err(format!("a client with other credentials got {got:?}").into()),
    }
    // A new name under the same root is refused too (the root is alice's),
    // and the message says what to do.
    match other.lock("jobs/other").try_acquire().await {
        Err(Error::Misconfigured { message, .. }) if message.contains("?root=") => {}
        got => {
            return Err(
                format!("another identity's new name under alice's root got {got:?}").into(),
            )
        }
    }
    for bad in ["?acl=creator", "?acl=nobody"] {
        let u = format!("zk://{host_port}{bad}");
        if !matches!(
            ZooKeeperBackend::connect(&u).await,
            Err(Error::InvalidInput { .. })
        ) {
            return Err(format!("{u} was not refused as invalid").into());
        }
    }
    if !g.release().await? {
        return Err("the holder's release reported the lock not held".into());
    }
    Ok(())
}

/// A `CuratorLatch` JVM: one Curator `LeaderLatch` participant on a path.
struct Latch(Curator);

impl Latch {
    /// Starts a participant with `id` on `path` and waits until its latch
    /// node exists.
    async fn join(classes: &Path, hosts: &str, path: &str, id: &str) -> Result<Self, Failed> {
        let mut latch = Self(Curator::spawn_class(
            classes,
            "CuratorLatch",
            &[hosts, path, id],
        )?);
        match latch.0.next_line(PATIENCE).await? {
            Some(l) if l.starts_with("JOINED _c_") && l.contains("-latch-") => Ok(latch),
            Some(l) => Err(format!("CuratorLatch printed {l:?}, expected JOINED").into()),
            None => Err(format!(
                "CuratorLatch created no node within {PATIENCE:?}; stderr: {}",
                latch.0.stderr_tail()
            )
            .into()),
        }
    }

    /// Waits until it reports leadership.
    async fn leads(&mut self) -> Result<(), Failed> {
        match self.0.next_line(PATIENCE).await? {
            Some(l) if l.starts_with("LEADER ") => Ok(()),
            Some(l) => Err(format!("CuratorLatch printed {l:?}, expected LEADER").into()),
            None => Err(format!(
                "the Curator latch did not lead within {PATIENCE:?}; stderr: {}",
                self.0.stderr_tail()
            )
            .into()),
        }
    }

    /// Fails if it reports leadership (or anything) within [`HELD`].
    async fn does_not_lead(&mut self, while_: &str) -> Result<(), Failed> {
        match self.0.next_line(HELD).await? {
            None => Ok(()),
            Some(l) => Err(format!("CuratorLatch printed {l:?} while {while_}").into()),
        }
    }

    /// Sends `command` and returns its answer, the next line.
    async fn ask(&mut self, command: &str) -> Result<String, Failed> {
        let stdin = self.0.stdin.as_mut().ok_or("CuratorLatch already closed")?;
        stdin
            .write_all(format!("{command}\n").as_bytes())
            .and_then(|()| stdin.flush())
            .map_err(|e| format!("sending {command:?} to CuratorLatch: {e}"))?;
        self.0
            .next_line(PATIENCE)
            .await?
            .ok_or_else(|| format!("CuratorLatch did not answer {command:?}").into())
    }

    /// Fails unless `hasLeadership()` is `leads`.
    async fn has_leadership(&mut self, leads: bool) -> Result<(), Failed> {
        let answer = self.ask("has").await?;
        if answer == format!("HAS {leads}") {
            Ok(())
        } else {
            Err(format!("CuratorLatch answered {answer:?} to has, expected HAS {leads}").into())
        }
    }

    /// Fails unless Curator's `getLeader().getId()` is `id`.
    async fn sees_leader(&mut self, id: &str) -> Result<(), Failed> {
        let answer = self.ask("leader").await?;
        if answer == format!("LEADER_ID {id}") {
            Ok(())
        } else {
            Err(format!("Curator's getLeader() answered {answer:?}, expected {id:?}").into())
        }
    }

    /// Closes the latch (deleting its node) and lets the JVM exit.
    async fn close(mut self) -> Result<(), Failed> {
        let answer = self.ask("close").await?;
        // A leader's latch closes silently; a NOT_LEADER line is harmless.
        let answer = match answer.as_str() {
            "NOT_LEADER" => self.0.next_line(PATIENCE).await?.unwrap_or_default(),
            _ => answer,
        };
        if answer == "CLOSED" {
            Ok(())
        } else {
            Err(format!("CuratorLatch answered {answer:?} to close, expected CLOSED").into())
        }
    }
}

/// The name of an election, at the path a Curator `LeaderLatch` joining
/// it uses (see [`zk_path`]).
fn election_name() -> String {
    format!("{}/election", integration_tests::namespace())
}

/// The current leader's value as distlock reads it.
async fn leader_value(client: &LockClient, election: &str) -> Result<Option<String>, Failed> {
    Ok(client.election(election).leader().await?.map(|l| l.value))
}

/// A Curator `LeaderLatch` with participant id `curator-leader` leads:
/// distlock reads it as the leader, refuses `try_campaign`, and a waiting
/// distlock campaign becomes leader only once the latch is closed.
async fn curator_latch_leads_and_distlock_waits(
    f: Arc<Zk>,
    build: CuratorBuild,
) -> Result<(), Failed> {
    let classes = curator_classes(&build).await?;
    let election = election_name();
    let client = distlock_client(&f).await?;
    let mut latch = Latch::join(
        &classes,
        &f.host_port()?,
        &zk_path(&election),
        "curator-leader",
    )
    .await?;
    latch.leads().await?;
    let seen = leader_value(&client, &election).await?;
    if seen.as_deref() != Some("curator-leader") {
        return Err(format!("distlock reads the leader as {seen:?}, not curator-leader").into());
    }
    let e = client.election(&election).ttl(Duration::from_secs(30));
    if let Some(l) = e.try_campaign("distlock-eager").await? {
        return Err(format!(
            "distlock's try_campaign led (token {}) beside Curator's leader",
            l.token()
        )
        .into());
    }
    wait_for_children(&f, &election, 1).await?;
    let waiting = e.clone().wait(PATIENCE * 2);
    let mut waiting = Campaign(tokio::spawn(async move {
        waiting.campaign("distlock-heir").await
    }));
    wait_for_children(&f, &election, 2).await?;
    // Curator's latch is listed as the leadership, with its participant id
    // and no holder info; distlock's queued campaign is not.
    let listed = client.list(&election, 10).await?;
    match listed.as_slice() {
        [r] if r.kind == HoldKind::Leader
            && r.value.as_deref() == Some("curator-leader")
            && r.holder_info.is_none() => {}
        other => return Err(format!("list shows {other:?} while Curator leads").into()),
    }
    if let Ok(r) = tokio::time::timeout(HELD, &mut waiting.0).await {
        return Err(format!(
            "a distlock campaign finished while Curator led: {:?}",
            r.map(|r| r.map(|l| l.token()))
        )
        .into());
    }
    latch.has_leadership(true).await?;
    latch.sees_leader("curator-leader").await?;
    latch.close().await?;
    let l = tokio::time::timeout(PATIENCE, &mut waiting.0)
        .await
        .map_err(|_| format!("distlock did not lead within {PATIENCE:?} of Curator closing"))?
        .map_err(|e| e.to_string())??;
    let seen = leader_value(&client, &election).await?;
    if seen.as_deref() != Some("distlock-heir") {
        return Err(format!("after Curator closed, the leader reads as {seen:?}").into());
    }
    l.resign().await?;
    Ok(())
}

/// A distlock leader leads first: a Curator `LeaderLatch` started after it
/// does not lead and reads distlock's value as the leader's id; once
/// distlock resigns, the latch leads and distlock reads its id. (No
/// proclamation while the latch waits: Curator's latch drops its watch of
/// its predecessor on a data change; see the crate README.)
async fn distlock_leader_keeps_curator_latch_waiting(
    f: Arc<Zk>,
    build: CuratorBuild,
) -> Result<(), Failed> {
    let classes = curator_classes(&build).await?;
    let election = election_name();
    let client = distlock_client(&f).await?;
    let e = client.election(&election).ttl(Duration::from_secs(30));
    let l = e.campaign("distlock-leader").await?;
    let mut latch = Latch::join(
        &classes,
        &f.host_port()?,
        &zk_path(&election),
        "curator-follower",
    )
    .await?;
    latch.does_not_lead("distlock led").await?;
    latch.has_leadership(false).await?;
    latch.sees_leader("distlock-leader").await?;
    l.resign().await?;
    latch.leads().await?;
    latch.sees_leader("curator-follower").await?;
    let seen = leader_value(&client, &election).await?;
    if seen.as_deref() != Some("curator-follower") {
        return Err(format!("distlock reads the leader as {seen:?}, not curator-follower").into());
    }
    if let Some(l) = e.try_campaign("distlock-again").await? {
        return Err(format!(
            "distlock's try_campaign led (token {}) beside Curator's leader",
            l.token()
        )
        .into());
    }
    latch.close().await?;
    Ok(())
}

/// A distlock campaign waiting in the background, cancelled (and so
/// withdrawn) when dropped, so a failing test leaves no campaign behind.
struct Campaign(tokio::task::JoinHandle<distlock_core::Result<distlock_core::Leadership>>);

impl Drop for Campaign {
    fn drop(&mut self) {
        self.0.abort();
    }
}
