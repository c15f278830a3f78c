//! The conformance suite on a single redis-server (over RESP2 and RESP3),
//! on a 3-node Redis Cluster, and over TLS to a single server (`rediss://`), to a Sentinel and
//! its master (`rediss+sentinel://`) and to a 3-node Cluster
//! (`rediss+cluster://`), plus Redis's own edges: interop with the classic
//! raw-command protocol, a wrong CA on each TLS form, and a real Sentinel
//! failover.

use std::sync::Arc;
use std::time::Duration;

use distlock_core::{Error, HoldKind, LockClient, LockName, LostReason};
use distlock_redis::{RedisBackend, RedisConfig};
use integration_tests::blocking;
use integration_tests::factory::{ServerFactory, Servers};
use integration_tests::fifo;
use integration_tests::harness::proxy::Proxy;
use integration_tests::harness::{redis as server, ServerKind, ServerProcess};
use libtest_mimic::{Completion, Failed, Trial};

type Redis = ServerFactory<RedisBackend>;

/// The commands distlock sends or its scripts run, as a Redis ACL rule
/// (with the key and channel patterns of the lock names' prefix added).
const LEAST_PRIVILEGE: &[&str] = &[
    "-@all",
    "+evalsha",
    "+script|load",
    "+subscribe",
    "+unsubscribe",
    "+del",
    "+exists",
    "+get",
    "+hget",
    "+hmget",
    "+hset",
    "+incr",
    "+pexpire",
    "+pttl",
    "+publish",
    "+scan",
    "+set",
    "+time",
    "+wait",
    "+zadd",
    "+zcard",
    "+zcount",
    "+zrange",
    "+zrangebyscore",
    "+zrem",
    "+zremrangebyscore",
    "+zscore",
];

/// The server arguments of the user `app` (password `app-pw`) allowed
/// `commands` and the key and channel patterns `keys`.
fn app_user(commands: &[&'static str], keys: &[&'static str]) -> Vec<&'static str> {
    let mut rule = vec![
        "--user",
        "app",
        "on",
        ">app-pw",
        "resetkeys",
        "resetchannels",
    ];
    rule.extend_from_slice(commands);
    rule.extend_from_slice(keys);
    rule
}

fn main() {
    let single = Arc::new(Redis::of_kind("redis", ServerKind::Redis));
    let cluster = Arc::new(
        Redis::new("redis::cluster", || {
            let nodes = server::cluster(3).map_err(|e| e.to_string())?;
            let hosts: Vec<String> = nodes
                .iter()
                .map(|n| format!("127.0.0.1:{}", n.port))
                .collect();
            let url = format!("redis+cluster://{}", hosts.join(","));
            Ok(Servers::processes(url, nodes))
        })
        // Three nodes and the cluster client beside the whole suite on two
        // cores: the default short TTL (600 ms, a renewal every 200 ms)
        // leaves a renewing holder too little slack there.
        .short_ttl(Duration::from_secs(1)),
    );
    let tls = Arc::new(Redis::new("redis::tls", || {
        let (s, ca) = server::spawn_tls().map_err(|e| e.to_string())?;
        let url = format!("rediss://127.0.0.1:{}?ca_file={}", s.port, ca.display());
        Ok(Servers::processes(url, vec![s]))
    }));
    let sentinel_tls = Arc::new(Redis::new("redis::sentinel_tls", || {
        let (master, certs) = server::spawn_tls_with(&[]).map_err(|e| e.to_string())?;
        let s = server::sentinel_tls(master.port, "m", &certs).map_err(|e| e.to_string())?;
        let url = format!(
            "rediss+sentinel://127.0.0.1:{}/m?ca_file={}",
            s.port,
            certs.ca.display()
        );
        // The master's directory holds the certificates: it stops last.
        Ok(Servers::processes(url, vec![s, master]))
    }));
    let cluster_tls = Arc::new(Redis::new("redis::cluster_tls", || {
        let (nodes, ca) = server::cluster_tls(3).map_err(|e| e.to_string())?;
        let hosts: Vec<String> = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        let url = format!(
            "rediss+cluster://{}?ca_file={}",
            hosts.join(","),
            ca.display()
        );
        Ok(Servers::processes(url, nodes))
    }));
    // The suite as a user allowed only the commands, keys and channels
    // distlock needs (the rule docs/guarantees.md gives), for the suite's
    // names.
    let acl = Arc::new(Redis::new("redis::acl", || {
        let rule = app_user(
            LEAST_PRIVILEGE,
            &["~conformance-*", "~{conformance-*", "&{conformance-*"],
        );
        let s = server::spawn(&rule).map_err(|e| e.to_string())?;
        let url = format!("redis://app:app-pw@127.0.0.1:{}", s.port);
        Ok(Servers::processes(url, vec![s]))
    }));
    // The whole suite once more with waiters queueing, first come, first
    // served.
    let fifo_single = Arc::new(Redis::new("redis::fifo_suite", || {
        let s = server::spawn(&[]).map_err(|e| e.to_string())?;
        let url = format!("redis://127.0.0.1:{}?fifo=true", s.port);
        Ok(Servers::processes(url, vec![s]))
    }));
    // The whole suite once more over RESP3 (`protocol=resp3`), whose
    // pub/sub messages arrive as pushes.
    let resp3 = Arc::new(single.sharing("redis::resp3", "?protocol=resp3"));
    integration_tests::run_suite(single.clone(), move |rt| {
        let mut extra = integration_tests::trials(cluster, rt);
        extra.extend(integration_tests::trials(resp3, rt));
        extra.extend(integration_tests::trials(fifo_single, rt));
        extra.extend(integration_tests::factory::Alternating::safety_trials(
            "redis::fifo_mixed",
            single.clone(),
            Arc::new(single.sharing("redis::fifo_mixed", "?fifo=true&queue_lease_ms=600")),
            rt,
        ));
        extra.extend(integration_tests::trials(tls.clone(), rt));
        extra.extend(integration_tests::trials(sentinel_tls.clone(), rt));
        extra.extend(integration_tests::trials(cluster_tls.clone(), rt));
        let handle = rt.handle().clone();
        let (t, c, plain) = (tls.clone(), cluster_tls.clone(), single.clone());
        extra.push(Trial::test(
            "redis::tls::a_scheme_that_does_not_match_the_servers_tls_is_misconfigured",
            move || handle.block_on(wrong_scheme(t, c, plain)),
        ));
        for (name, f) in [
            ("redis::tls::a_wrong_ca_is_misconfigured_at_once", tls),
            (
                "redis::sentinel_tls::a_wrong_ca_is_misconfigured_at_once",
                sentinel_tls,
            ),
            (
                "redis::cluster_tls::a_wrong_ca_is_misconfigured_at_once",
                cluster_tls,
            ),
        ] {
            let handle = rt.handle().clone();
            extra.push(Trial::test(name, move || handle.block_on(wrong_ca(f))));
        }
        extra.extend(integration_tests::trials(acl.clone(), rt));
        let handle = rt.handle().clone();
        extra.push(Trial::test(
            "redis::acl::a_name_outside_the_users_keys_is_a_typed_error",
            move || handle.block_on(outside_the_rule(acl)),
        ));
        let handle = rt.handle().clone();
        extra.push(Trial::test(
            "redis::acl::sentinel_and_cluster_users_need_role_and_cluster_slots_beside_the_rule",
            move || handle.block_on(acl_topologies()),
        ));
        let handle = rt.handle().clone();
        extra.push(Trial::test(
            "redis::acl::a_command_a_script_may_not_run_is_a_typed_error",
            move || handle.block_on(script_command_refused()),
        ));
        let handle = rt.handle().clone();
        extra.push(Trial::test(
            "redis::acl::a_wait_refused_its_subscription_is_a_typed_error",
            move || handle.block_on(subscribe_refused()),
        ));
        let handle = rt.handle().clone();
        let s = single.clone();
        extra.push(Trial::test(
            "redis::interoperates_with_classic_set_nx_clients",
            move || handle.block_on(interop(s)),
        ));
        let handle = rt.handle().clone();
        extra.push(Trial::test(
            "redis::acquire_subscribes_only_when_the_lock_is_held",
            move || handle.block_on(subscribes_when_held()),
        ));
        let handle = rt.handle().clone();
        let s = single.clone();
        extra.push(Trial::test(
            "redis::classic_clients_are_refused_while_readers_hold",
            move || handle.block_on(interop_shared(s)),
        ));
        let handle = rt.handle().clone();
        extra.push(Trial::test(
            "redis::uncontended_shared_and_exclusive_holds_are_one_script_call_each_way",
            move || handle.block_on(one_call_each_way()),
        ));
        let handle = rt.handle().clone();
        extra.push(Trial::test(
            "redis::a_writers_first_attempt_sent_again_and_granted_leaves_no_mark",
            move || handle.block_on(resent_first_attempt()),
        ));
        let handle = rt.handle().clone();
        extra.push(Trial::test(
            "redis::a_shared_grant_sent_again_is_granted_again_behind_a_writers_mark",
            move || handle.block_on(resent_shared_grant()),
        ));
        let handle = rt.handle().clone();
        extra.push(Trial::test(
            "redis::fifo::shared::single::a_reader_never_passes_a_writer_queued_behind_300_readers",
            move || handle.block_on(fifo_readers_beyond_a_page()),
        ));
        let handle = rt.handle().clone();
        extra.push(Trial::test(
            "redis::cluster::list_with_a_master_stopped_fails_rather_than_leave_its_holds_out",
            move || handle.block_on(list_with_a_master_stopped()),
        ));
        let handle = rt.handle().clone();
        extra.push(Trial::test(
            "redis::a_url_of_the_wrong_topology_is_misconfigured",
            move || handle.block_on(wrong_topology()),
        ));
        let handle = rt.handle().clone();
        extra.push(Trial::test(
            "redis::a_multi_lock_of_free_names_is_one_request",
            move || handle.block_on(multi_lock_is_one_request()),
        ));
        let handle = rt.handle().clone();
        extra.push(Trial::test(
            "redis::an_acquire_sent_again_after_its_answer_was_lost_is_granted",
            move || handle.block_on(sent_again()),
        ));
        let handle = rt.handle().clone();
        extra.push(Trial::test(
            "redis::a_stalled_pubsub_connection_holds_no_wait_past_its_deadline_or_for_ever",
            move || handle.block_on(stalled_pubsub()),
        ));
        let handle = rt.handle().clone();
        extra.push(Trial::test(
            "redis::a_wait_dropped_while_its_subscription_is_confirmed_leaves_the_channel_unsubscribed",
            move || handle.block_on(subscribe_dropped()),
        ));
        let handle = rt.handle().clone();
        extra.push(Trial::test(
            "redis::a_stalled_connection_is_replaced_after_a_request_times_out",
            move || handle.block_on(stalled_connection()),
        ));
        let handle = rt.handle().clone();
        extra.push(Trial::test(
            "redis::too_few_replicas_for_min_replicas_to_write_is_unavailable",
            move || handle.block_on(too_few_replicas()),
        ));
        let handle = rt.handle().clone();
        extra.push(Trial::test(
            "redis::a_server_out_of_memory_is_unavailable",
            move || handle.block_on(out_of_memory()),
        ));
        let handle = rt.handle().clone();
        extra.push(Trial::test(
            "redis::a_script_running_past_the_busy_threshold_is_unavailable",
            move || handle.block_on(busy_script()),
        ));
        let handle = rt.handle().clone();
        extra.push(Trial::test(
            "redis::a_master_its_sentinel_flags_down_is_unavailable",
            move || handle.block_on(sentinel_master_down()),
        ));
        let handle = rt.handle().clone();
        extra.push(Trial::test(
            "redis::a_sentinel_that_stops_answering_costs_one_timeout",
            move || handle.block_on(sentinel_stalled()),
        ));
        let handle = rt.handle().clone();
        extra.push(Trial::test(
            "redis::a_sentinel_that_stops_answering_loses_no_lease",
            move || handle.block_on(sentinel_hung_during_renewals()),
        ));
        let handle = rt.handle().clone();
        extra.push(Trial::test(
            "redis::cluster_with_every_node_down_is_unavailable",
            move || handle.block_on(cluster_down()),
        ));
        extra.push(integration_tests::trial(
            rt,
            "redis::a_wait_on_a_server_that_stops_answering_ends_by_its_deadline",
            stalled_wait(single.clone()),
        ));
        extra.push(integration_tests::trial(
            rt,
            "redis::an_eviction_wakes_the_locks_waiters",
            eviction_wakes_waiters(),
        ));
        extra.push(integration_tests::trial(
            rt,
            "redis::a_wait_outlasts_a_server_restart",
            wait_outlasts_a_restart(),
        ));
        extra.push(integration_tests::trial(
            rt,
            "redis::another_applications_data_under_the_keys_is_misconfigured",
            foreign_data(),
        ));
        for topology in [Topology::Single, Topology::Sentinel, Topology::Cluster] {
            // The lock's queue (with readers in it: `fifo::shared::*`), a
            // semaphore's (`fifo::semaphore::*`) and an election's
            // (`fifo::election::*`).
            for kind in [Kind::Lock, Kind::Shared, Kind::Semaphore, Kind::Election] {
                let what = kind.prefix();
                let handle = rt.handle().clone();
                extra.push(Trial::test(
                    format!(
                        "redis::fifo::{what}{topology:?}::grants_in_arrival_order_one_request_each"
                    )
                    .to_lowercase(),
                    move || handle.block_on(fifo_order(topology, kind)),
                ));
                let handle = rt.handle().clone();
                extra.push(Trial::test(
                    format!(
                        "redis::fifo::{what}{topology:?}::a_cancelled_or_timed_out_waiter_leaves_no_entry"
                    )
                    .to_lowercase(),
                    move || handle.block_on(fifo_cancel(topology, kind)),
                ));
            }
            let handle = rt.handle().clone();
            extra.push(Trial::test(
                format!("redis::fifo::shared::{topology:?}::readers_never_pass_a_queued_writer")
                    .to_lowercase(),
                move || handle.block_on(fifo_readers(topology)),
            ));
        }
        let handle = rt.handle().clone();
        extra.push(Trial::test(
            "redis::fifo::shared::single::the_last_readers_release_wakes_a_queued_writer",
            move || handle.block_on(fifo_last_reader()),
        ));
        let handle = rt.handle().clone();
        extra.push(Trial::test(
            "redis::fifo::shared::single::a_writer_that_leaves_lets_the_readers_behind_it_in",
            move || handle.block_on(fifo_writer_leaves()),
        ));
        let handle = rt.handle().clone();
        extra.push(Trial::test(
            "redis::fifo::shared::single::a_writers_wait_prunes_lapsed_shared_entries",
            move || handle.block_on(fifo_prunes_shared_entries()),
        ));
        let handle = rt.handle().clone();
        extra.push(Trial::test(
            "redis::fifo::semaphore::single::permits_freed_at_once_each_reach_a_waiter",
            move || handle.block_on(fifo_freed_at_once()),
        ));
        for kind in [Kind::Lock, Kind::Shared, Kind::Semaphore, Kind::Election] {
            let what = kind.prefix();
            let handle = rt.handle().clone();
            extra.push(Trial::test(
                format!("redis::fifo::{what}single::a_wait_dropped_before_its_first_answer_leaves_no_entry"),
                move || handle.block_on(fifo_dropped_in_flight(kind)),
            ));
        }
        // Readers behind a cut-off reader are told with it, so nobody waits
        // for its entry: no case for them.
        for kind in [Kind::Lock, Kind::Semaphore, Kind::Election] {
            let what = kind.prefix();
            let handle = rt.handle().clone();
            extra.push(Trial::test(
                format!("redis::fifo::{what}single::a_cut_off_waiter_holds_up_the_queue_only_until_its_entry_lapses"),
                move || handle.block_on(fifo_cut(kind)),
            ));
        }
        let handle = rt.handle().clone();
        extra.push(Trial::test(
            "redis::cluster::a_waiter_is_woken_when_the_first_seed_is_down",
            move || handle.block_on(first_seed_down()),
        ));
        let handle = rt.handle().clone();
        extra.push(Trial::test(
            "redis::sentinel::a_holder_follows_a_graceful_failover_and_nobody_else_is_granted",
            move || handle.block_on(graceful_failover()),
        ));
        let handle = rt.handle().clone();
        extra.push(Trial::ignorable_test(
            "redis::failover_to_a_lagging_replica_grants_twice_and_holder_sees_lost",
            move || handle.block_on(failover()).map(|()| Completion::Completed),
        ));
        extra
    })
}

/// Classic clients (`SET name value NX PX`, compare-and-delete) and distlock
/// exclude each other on the same key, `list` and `inspect` show a classic
/// lock, and distlock's waiters take it soon after a classic release, which
/// announces nothing.
async fn interop(f: Arc<Redis>) -> Result<(), Failed> {
    let url = f.url()?;
    let port = integration_tests::harness::host_port(&url)
        .ok_or("no port")?
        .1;
    let name = format!("{}/interop", integration_tests::namespace());
    let client = LockClient::new(f.backend().await?);
    let raw = |args: &[&str]| server::command(port, args).ok_or_else(|| Failed::from("no reply"));

    let reply = raw(&["SET", &name, "classic-owner", "NX", "PX", "60000"])?;
    if !reply.starts_with("+OK") {
        return Err(format!("raw SET NX failed: {reply:?}").into());
    }
    if client.lock(&name).try_acquire().await?.is_some() {
        return Err("distlock took a lock a classic client holds".into());
    }
    // Listed as the lock it is, with none of distlock's holder info or
    // token: the classic value is all owner.
    let listed = client.list(&name, 10).await?;
    match listed.as_slice() {
        [r] if r.name == name
            && r.kind == HoldKind::Exclusive
            && r.holder_info.is_none()
            && r.token.is_none()
            && r.remaining.is_some() => {}
        _ => return Err(format!("list shows the classic lock as {listed:#?}").into()),
    }
    // A status call shows it held, with no holder info.
    let status = client.backend().inspect(&LockName::new(&name)?).await?;
    if !status.held || status.holder_info.is_some() || status.remaining.is_none() {
        return Err(format!("inspect shows the classic lock as {status:#?}").into());
    }
    // Waiters, a writer and a reader, behind the classic holder: it
    // announces no release, so they look again within 100 ms rather than
    // at its expiry, a minute away, past their wait.
    let channel = format!("{{{name}}}:released");
    // Gone within 1.5 s (60 looks): a subscription lingers 2 s after its
    // last waiter unless its client is dropped. A new one has 10 s.
    let subscribers = |n: usize, looks: usize| {
        let (raw, channel) = (&raw, &channel);
        async move {
            for _ in 0..looks {
                // The count, then the reply to the QUIT `command` sends.
                if raw(&["PUBSUB", "NUMSUB", channel])?.contains(&format!("\r\n:{n}\r\n+OK")) {
                    return Ok::<(), Failed>(());
                }
                tokio::time::sleep(Duration::from_millis(25)).await;
            }
            Err(format!("never {n} subscribers of {channel}").into())
        }
    };
    let cad = "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0";
    for shared in [false, true] {
        let waiter = LockClient::new(f.backend().await?);
        let lock = if shared {
            waiter.lock(&name).shared()
        } else {
            waiter.lock(&name)
        };
        let waiting = tokio::spawn(lock.wait(Duration::from_secs(20)).acquire());
        subscribers(1, 400).await?;
        let reply = raw(&["EVAL", cad, "1", &name, "classic-owner"])?;
        if !reply.starts_with(":1") {
            return Err(format!("raw compare-and-delete failed: {reply:?}").into());
        }
        let released = std::time::Instant::now();
        let g = waiting
            .await?
            .map_err(|e| format!("waiting behind a classic holder (shared: {shared}): {e}"))?;
        // A wait's last look, at its deadline, would find it free too.
        if released.elapsed() > Duration::from_secs(10) {
            return Err(format!(
                "a waiter behind a classic holder (shared: {shared}) took {:?} after its release",
                released.elapsed()
            )
            .into());
        }
        g.release().await?;
        // Its subscription ends with the client.
        drop(waiter);
        subscribers(0, 60).await?;
        let reply = raw(&["SET", &name, "classic-owner", "NX", "PX", "60000"])?;
        if !reply.starts_with("+OK") {
            return Err(format!("raw SET NX failed: {reply:?}").into());
        }
    }
    let reply = raw(&["EVAL", cad, "1", &name, "classic-owner"])?;
    if !reply.starts_with(":1") {
        return Err(format!("raw compare-and-delete failed: {reply:?}").into());
    }
    let g = client
        .lock(&name)
        .try_acquire()
        .await?
        .ok_or("distlock could not take the freed lock")?;
    let reply = raw(&["SET", &name, "classic-owner", "NX", "PX", "60000"])?;
    if !reply.starts_with("$-1") && !reply.starts_with("_") {
        return Err(format!("classic SET NX got a lock distlock holds: {reply:?}").into());
    }
    let reply = raw(&["EVAL", cad, "1", &name, "classic-owner"])?;
    if !reply.starts_with(":0") {
        return Err(format!("classic compare-and-delete freed distlock's lock: {reply:?}").into());
    }
    if !g.release().await? {
        return Err("distlock release failed".into());
    }
    Ok(())
}

/// While distlock readers hold a name, a classic client's `SET NX` on the
/// lock key is refused and its compare-and-delete removes nothing; once the
/// last reader releases, the classic client gets the key.
async fn interop_shared(f: Arc<Redis>) -> Result<(), Failed> {
    let url = f.url()?;
    let port = integration_tests::harness::host_port(&url)
        .ok_or("no port")?
        .1;
    let name = format!("{}/interop-shared", integration_tests::namespace());
    let (a, b) = (
        LockClient::new(f.backend().await?),
        LockClient::new(f.backend().await?),
    );
    let raw = |args: &[&str]| server::command(port, args).ok_or_else(|| Failed::from("no reply"));
    let ra = a
        .lock(&name)
        .shared()
        .try_acquire()
        .await?
        .ok_or("a reader was refused")?;
    let rb = b
        .lock(&name)
        .shared()
        .try_acquire()
        .await?
        .ok_or("a reader was refused")?;
    let reply = raw(&["SET", &name, "classic-owner", "NX", "PX", "60000"])?;
    if !reply.starts_with("$-1") && !reply.starts_with("_") {
        return Err(format!("classic SET NX got a lock distlock readers hold: {reply:?}").into());
    }
    let cad = "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0";
    let reply = raw(&["EVAL", cad, "1", &name, "classic-owner"])?;
    if !reply.starts_with(":0") {
        return Err(
            format!("classic compare-and-delete freed distlock's readers: {reply:?}").into(),
        );
    }
    ra.release().await?;
    let reply = raw(&["SET", &name, "classic-owner", "NX", "PX", "60000"])?;
    if !reply.starts_with("$-1") && !reply.starts_with("_") {
        return Err(
            format!("classic SET NX got a lock a distlock reader still holds: {reply:?}").into(),
        );
    }
    rb.release().await?;
    let reply = raw(&["SET", &name, "classic-owner", "NX", "PX", "60000"])?;
    if !reply.starts_with("+OK") {
        return Err(
            format!("classic SET NX was refused after the last reader left: {reply:?}").into(),
        );
    }
    if a.lock(&name).shared().try_acquire().await?.is_some() {
        return Err("a distlock reader got a lock a classic client holds".into());
    }
    raw(&["DEL", &name])?;
    Ok(())
}

/// An uncontended waiting `acquire` and its release are one script call
/// each, exclusive or shared; the exclusive ones touch no sorted set (the
/// same `SET NX PX` + `INCR` and `GET` + `DEL` + `PUBLISH` as without
/// read-write locks). On a server of its own, so that only these commands
/// are counted.
async fn one_call_each_way() -> Result<(), Failed> {
    let node = tokio::task::spawn_blocking(|| server::spawn(&[]))
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| e.to_string())?;
    let port = node.port;
    let scripts = move || server::calls(port, &["evalsha", "eval"]);
    const ZSETS: &[&str] = &[
        "zadd",
        "zrem",
        "zrange",
        "zrangebyscore",
        "zremrangebyscore",
        "zscore",
        "zcard",
        "zcount",
        "time",
    ];
    let zsets = move || server::calls(port, ZSETS);
    let url = format!("redis://127.0.0.1:{port}");
    let client = LockClient::new(RedisBackend::connect(&url).await?);
    let ttl = Duration::from_secs(30);
    // Loads the scripts (a first EVALSHA answered NOSCRIPT is sent again).
    client
        .lock("calls/x")
        .ttl(ttl)
        .acquire()
        .await?
        .release()
        .await?;
    let r = client.lock("calls/s").shared().ttl(ttl).acquire().await?;
    r.release().await?;
    let (before, zbefore) = (scripts(), zsets());
    let g = client.lock("calls/x").ttl(ttl).acquire().await?;
    g.release().await?;
    let (took, ztook) = (scripts() - before, zsets() - zbefore);
    if took != 2 || ztook != 0 {
        return Err(format!(
            "an exclusive acquire and release took {took} script calls and {ztook} sorted-set commands"
        )
        .into());
    }
    let before = scripts();
    let r = client.lock("calls/s").shared().ttl(ttl).acquire().await?;
    r.release().await?;
    let took = scripts() - before;
    if took != 2 {
        return Err(format!("a shared acquire and release took {took} script calls").into());
    }
    drop(node);
    Ok(())
}

/// The script of `hash` called with `keys` and `args` as one command, as a client
/// sends it (the script is loaded already): the reply's first line.
fn evalsha(port: u16, hash: &str, keys: &[&str], args: &[&str]) -> Result<String, Failed> {
    let n = keys.len().to_string();
    let mut command = vec!["EVALSHA", hash, &n];
    command.extend(keys);
    command.extend(args);
    let reply = server::command(port, &command).ok_or("no reply to EVALSHA")?;
    if reply.starts_with('-') {
        return Err(format!("EVALSHA answered {reply:?}").into());
    }
    Ok(reply)
}

/// A single server with every script loaded (a lock's and a shared
/// hold's acquire and release run once), and a client of it.
async fn scripts_loaded() -> Result<(ServerProcess, LockClient), Failed> {
    let node = tokio::task::spawn_blocking(|| server::spawn(&[]))
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| e.to_string())?;
    let url = format!("redis://127.0.0.1:{}", node.port);
    let client = LockClient::new(RedisBackend::connect(&url).await?);
    client.lock("loads").acquire().await?.release().await?;
    let r = client.lock("loads").shared().acquire().await?;
    r.release().await?;
    Ok((node, client))
}

/// A writer's first wait attempt, refused while a reader holds, leaves its
/// mark; its answer is lost and the same call is sent again (a reconnect
/// re-sends it) once the reader has gone, and is granted. The grant takes
/// the mark with it: once the writer releases, a reader is granted at
/// once, not refused for the rest of the writer's TTL.
async fn resent_first_attempt() -> Result<(), Failed> {
    let (node, client) = scripts_loaded().await?;
    let port = node.port;
    let scripts = distlock_redis::Scripts::get();
    let lock = "resent/first";
    let (fence, marks) = (
        distlock_redis::Keys::fence_of(lock),
        distlock_redis::Keys::writers_of(lock),
    );
    let keys = [lock, fence.as_str(), marks.as_str()];
    let attempt = ["resent-writer", "30000", "1"];
    let r = client
        .lock(lock)
        .shared()
        .ttl(Duration::from_secs(30))
        .acquire()
        .await?;
    let refused = evalsha(port, scripts.acquire.get_hash(), &keys, &attempt)?;
    if !refused.starts_with('*') {
        return Err(format!("the first attempt behind a reader answered {refused:?}").into());
    }
    r.release().await?;
    let granted = evalsha(port, scripts.acquire.get_hash(), &keys, &attempt)?;
    if !granted.starts_with(':') || granted.starts_with(":-") {
        return Err(format!("the attempt sent again answered {granted:?}").into());
    }
    let channel = distlock_redis::Keys::channel_of(lock);
    let released = evalsha(
        port,
        scripts.release.get_hash(),
        &[lock, marks.as_str()],
        &["resent-writer", &channel],
    )?;
    if !released.starts_with(":1") {
        return Err(format!("the writer's release answered {released:?}").into());
    }
    let other = client.lock(lock).shared().ttl(Duration::from_secs(30));
    match other.try_acquire().await? {
        Some(g) => g.release().await.map(|_| ()).map_err(Into::into),
        None => Err("a reader was refused after the writer released: its mark stayed".into()),
    }
}

/// A reader's grant whose answer is lost, sent again (a reconnect re-sends
/// it) after a writer has left its mark, is granted again: the reader
/// holds, and refused it would keep the writer out for its TTL while its
/// client took itself for refused.
async fn resent_shared_grant() -> Result<(), Failed> {
    let (node, client) = scripts_loaded().await?;
    let port = node.port;
    let scripts = distlock_redis::Scripts::get();
    let lock = "resent/shared";
    let (fence, readers, marks) = (
        distlock_redis::Keys::fence_of(lock),
        distlock_redis::Keys::readers_of(lock),
        distlock_redis::Keys::writers_of(lock),
    );
    let keys = [lock, fence.as_str(), readers.as_str(), marks.as_str()];
    let attempt = ["resent-reader", "30000", "1"];
    let first = evalsha(port, scripts.shared_acquire.get_hash(), &keys, &attempt)?;
    if !first.starts_with(':') || first.starts_with(":-") {
        return Err(format!("a reader of a free lock was answered {first:?}").into());
    }
    let writer = client.lock(lock).ttl(Duration::from_secs(30));
    let waiting = tokio::spawn(writer.wait(Duration::from_secs(60)).acquire());
    let start = tokio::time::Instant::now();
    while !server::command(port, &["ZCARD", &marks]).is_some_and(|r| r.starts_with(":1\r")) {
        if start.elapsed() > Duration::from_secs(10) {
            waiting.abort();
            return Err("the waiting writer left no mark".into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let again = evalsha(port, scripts.shared_acquire.get_hash(), &keys, &attempt)?;
    waiting.abort();
    if !again.starts_with(':') || again.starts_with(":-") {
        return Err(format!("the reader's grant sent again was answered {again:?}").into());
    }
    Ok(())
}

/// A reader never passes a writer queued before it, however many readers
/// wait ahead of that writer: 300 reader entries (written directly, of
/// waiters that never come) ahead of a queued writer, and a reader's try
/// once the lock is free is refused.
async fn fifo_readers_beyond_a_page() -> Result<(), Failed> {
    let (url, ports, _servers) = fifo_servers(Topology::Single).await?;
    let url = format!("{url}?fifo=true&queue_lease_ms=60000");
    let port = ports[0];
    let name = "fifo/many-readers";
    let (queue, ends, shared) = (
        distlock_redis::Keys::queue_of(name),
        distlock_redis::Keys::queue_ends_of(name),
        distlock_redis::Keys::queue_shared_of(name),
    );
    let ttl = Duration::from_secs(30);
    let holder = LockClient::new(RedisBackend::connect(&url).await?);
    let held = holder.lock(name).ttl(ttl).acquire().await?;
    // Placed at 1..=300 µs, long before any real arrival; lasting until 2100.
    let entries: Vec<(String, String)> = (1..=300)
        .map(|i| (i.to_string(), format!("absent r{i}")))
        .collect();
    for (key, score) in [
        (&queue, None),
        (&ends, Some("4102444800000")),
        (&shared, None),
    ] {
        let mut command = vec!["ZADD", key.as_str()];
        for (place, entry) in &entries {
            command.extend([score.unwrap_or(place.as_str()), entry.as_str()]);
        }
        server::command(port, &command).ok_or("no reply to ZADD")?;
    }
    let writer = LockClient::new(RedisBackend::connect(&url).await?);
    let waiting = tokio::spawn(async move {
        writer
            .lock(name)
            .ttl(ttl)
            .wait(Duration::from_secs(60))
            .acquire()
            .await
    });
    let count = fifo_queued(ports.clone(), queue.clone());
    let start = tokio::time::Instant::now();
    while count()? < 301 {
        if start.elapsed() > Duration::from_secs(10) {
            waiting.abort();
            return Err("the writer did not queue".into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    held.release().await?;
    let reader = LockClient::new(RedisBackend::connect(&url).await?);
    let passed = reader.lock(name).shared().ttl(ttl).try_acquire().await;
    waiting.abort();
    server::command(port, &["DEL", &queue, &ends, &shared]);
    if let Some(g) = passed? {
        g.release().await?;
        return Err("a reader's try passed a writer queued behind 300 readers".into());
    }
    Ok(())
}

/// An uncontended `acquire` is one script call: no SUBSCRIBE. A waiter
/// subscribes, and is woken by the release. On a server of its own, so that
/// no other test's commands are counted.
async fn subscribes_when_held() -> Result<(), Failed> {
    let node = tokio::task::spawn_blocking(|| server::spawn(&[]))
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| e.to_string())?;
    let port = node.port;
    let subscribes = move || server::calls(port, &["subscribe"]);
    let url = format!("redis://127.0.0.1:{port}");
    let holder = LockClient::new(RedisBackend::connect(&url).await?);
    let waiter = LockClient::new(RedisBackend::connect(&url).await?);
    let g = holder.lock("sub").acquire().await?;
    let before = subscribes();
    if before != 0 {
        return Err(format!("an uncontended acquire subscribed ({before} SUBSCRIBE calls)").into());
    }
    let waiting = tokio::spawn(async move {
        waiter
            .lock("sub")
            .wait(Duration::from_secs(20))
            .acquire()
            .await
    });
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while subscribes() == 0 {
        if tokio::time::Instant::now() > deadline {
            return Err("the waiter never subscribed to the release channel".into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    g.release().await?;
    // Far below the 30 s TTL the waiter would otherwise wait out.
    let got = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .map_err(|_| "the waiter was not woken by the release")?
        .map_err(|e| e.to_string())??;
    got.release().await?;
    Ok(())
}

/// Where the first-come, first-served cases run: servers of their own, so
/// that only their requests are counted.
#[derive(Clone, Copy, Debug)]
enum Topology {
    Single,
    Sentinel,
    Cluster,
}

/// Servers of `topology`: the URL, the data nodes' ports, and the processes.
async fn fifo_servers(
    topology: Topology,
) -> Result<(String, Vec<u16>, Vec<ServerProcess>), Failed> {
    tokio::task::spawn_blocking(move || -> Result<_, Failed> {
        Ok(match topology {
            Topology::Single => {
                let s = server::spawn(&[]).map_err(|e| e.to_string())?;
                (
                    format!("redis://127.0.0.1:{}", s.port),
                    vec![s.port],
                    vec![s],
                )
            }
            Topology::Sentinel => {
                let master = server::spawn(&[]).map_err(|e| e.to_string())?;
                let sentinel = server::sentinel(master.port, "m").map_err(|e| e.to_string())?;
                let url = format!("redis+sentinel://127.0.0.1:{}/m", sentinel.port);
                (url, vec![master.port], vec![sentinel, master])
            }
            Topology::Cluster => {
                let nodes = server::cluster(3).map_err(|e| e.to_string())?;
                let hosts: Vec<String> = nodes
                    .iter()
                    .map(|n| format!("127.0.0.1:{}", n.port))
                    .collect();
                let ports = nodes.iter().map(|n| n.port).collect();
                (format!("redis+cluster://{}", hosts.join(",")), ports, nodes)
            }
        })
    })
    .await
    .map_err(|e| e.to_string())?
}

fn fifo_connect() -> fifo::Connect {
    Arc::new(|url: String| {
        Box::pin(async move { Ok(LockClient::new(RedisBackend::connect(&url).await?)) })
    })
}

/// What a fifo case queues for.
#[derive(Clone, Copy, Debug)]
enum Kind {
    Lock,
    /// A semaphore of three permits.
    Semaphore,
    Election,
    /// Readers waiting behind a writer.
    Shared,
}

impl Kind {
    /// The prefix of the case's name.
    fn prefix(self) -> &'static str {
        match self {
            Kind::Lock => "",
            Kind::Semaphore => "semaphore::",
            Kind::Election => "election::",
            Kind::Shared => "shared::",
        }
    }

    /// Permits a holder takes (and so releases before the waiters' turns).
    fn permits(self) -> u64 {
        match self {
            Kind::Semaphore => 3,
            _ => 1,
        }
    }
}

/// What the fifo cases queue for, `name` of `kind`, and its queue's key.
fn fifo_target(name: &str, kind: Kind) -> (fifo::Queued, String) {
    let n = LockName::new(name).expect("a name");
    match kind {
        Kind::Lock => (name.into(), distlock_redis::Keys::queue_of(name)),
        Kind::Semaphore => (
            fifo::Queued::semaphore(name, 3),
            distlock_redis::SemaphoreKeys::new("", &n).queue,
        ),
        Kind::Election => (
            fifo::Queued::election(name),
            distlock_redis::ElectionKeys::new("", &n).queue,
        ),
        Kind::Shared => (
            fifo::Queued::shared(name),
            distlock_redis::Keys::queue_of(name),
        ),
    }
}

/// The live entries of the wait queue `key`, on whichever node has it.
fn fifo_queued(ports: Vec<u16>, key: String) -> fifo::Count {
    Arc::new(move || {
        let mut n = 0;
        for port in &ports {
            let reply = server::command(*port, &["ZCARD", &key]).ok_or("no reply to ZCARD")?;
            if reply.starts_with("-MOVED") {
                // Another Cluster node's slot.
                continue;
            }
            n += reply
                .strip_prefix(':')
                .and_then(|r| r.split('\r').next())
                .and_then(|r| r.parse::<u64>().ok())
                .ok_or_else(|| format!("ZCARD answered {reply:?}"))?;
        }
        Ok(n)
    })
}

/// Twenty waiters' grants come in arrival order, one script call per grant
/// and per release (`INFO commandstats` on every data node). Entries here
/// last a minute, so no waiter renews its entry while the test counts.
async fn fifo_order(topology: Topology, kind: Kind) -> Result<(), Failed> {
    let (url, ports, _servers) = fifo_servers(topology).await?;
    let url = format!("{url}?fifo=true&queue_lease_ms=60000");
    let (what, queue) = fifo_target("fifo/order", kind);
    // Each release and each grant one request: the holder's releases, then
    // each waiter's grant and release.
    let permits = kind.permits();
    let counted = ports.clone();
    let requests: fifo::Count = Arc::new(move || {
        Ok(counted
            .iter()
            .map(|p| server::calls(*p, &["evalsha", "eval"]))
            .sum())
    });
    fifo::grants_in_arrival_order(
        fifo_connect(),
        &url,
        what,
        20,
        fifo_queued(ports, queue),
        requests,
        40 + permits..=40 + permits,
    )
    .await
}

async fn fifo_cancel(topology: Topology, kind: Kind) -> Result<(), Failed> {
    let (url, ports, _servers) = fifo_servers(topology).await?;
    let lease = Duration::from_secs(60);
    let url = format!("{url}?fifo=true&queue_lease_ms={}", lease.as_millis());
    let (what, queue) = fifo_target("fifo/cancel", kind);
    fifo::a_cancelled_or_timed_out_waiter_leaves_no_entry(
        fifo_connect(),
        &url,
        what,
        lease,
        fifo_queued(ports, queue),
    )
    .await
}

/// A wait dropped while its first attempt is on its way (the server is
/// stopped meanwhile) leaves no entry.
async fn fifo_dropped_in_flight(kind: Kind) -> Result<(), Failed> {
    let node = tokio::task::spawn_blocking(|| server::spawn(&[]))
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| e.to_string())?;
    let url = format!(
        "redis://127.0.0.1:{}?fifo=true&queue_lease_ms=60000",
        node.port
    );
    let (what, queue) = fifo_target("fifo/in-flight", kind);
    let signal = |sig: &str| node.signal(sig).map_err(|e| Failed::from(e.to_string()));
    fifo::a_wait_dropped_before_its_first_answer_leaves_no_entry(
        fifo_connect(),
        &url,
        what,
        fifo_queued(vec![node.port], queue),
        || async { signal("STOP") },
        || async { signal("CONT") },
    )
    .await
}

/// An operator's eviction of a held lock wakes its waiter as a release
/// does, without and with a wait queue: the waiter holds the lock within
/// milliseconds, not at its next poll, which comes seconds later.
async fn eviction_wakes_waiters() -> Result<(), Failed> {
    let (url, _ports, _servers) = fifo_servers(Topology::Single).await?;
    for url in [url.clone(), format!("{url}?fifo=true&queue_lease_ms=60000")] {
        let name = "evicted/wakes";
        let holder = LockClient::new(RedisBackend::connect(&url).await?);
        let waiter = LockClient::new(RedisBackend::connect(&url).await?);
        let held = holder
            .lock(name)
            .ttl(Duration::from_secs(60))
            .acquire()
            .await?;
        let waiting = tokio::spawn(async move {
            let g = waiter
                .lock(name)
                .ttl(Duration::from_secs(60))
                .wait(Duration::from_secs(10))
                .acquire()
                .await?;
            g.release().await
        });
        tokio::time::sleep(Duration::from_millis(500)).await;
        let evicted = std::time::Instant::now();
        if !RedisBackend::connect(&url)
            .await?
            .evict(&LockName::new(name)?)
            .await?
        {
            return Err(format!("{url}: nothing to evict").into());
        }
        // Woken, it holds in milliseconds; unwoken, at its next poll,
        // seconds later.
        tokio::time::timeout(Duration::from_secs(2), waiting)
            .await
            .map_err(|_| {
                format!("{url}: the waiter did not hold the lock within 2 s of the eviction")
            })?
            .map_err(|e| e.to_string())??;
        eprintln!(
            "{url}: the waiter held the lock {:?} after the eviction",
            evicted.elapsed()
        );
        drop(held);
    }
    Ok(())
}

/// A wait goes on through a server restart (its connection broken, the
/// server refusing connections for a moment) rather than ending with the
/// first failure: the restarted server (no persistence) has forgotten the
/// holder's lock, and the waiter takes it.
async fn wait_outlasts_a_restart() -> Result<(), Failed> {
    let mut server =
        blocking(|| server::spawn(&[]).map_err(|e| Failed::from(e.to_string()))).await?;
    let url = format!("redis://127.0.0.1:{}", server.port);
    let holder = LockClient::new(RedisBackend::connect(&url).await?);
    let waiter = LockClient::new(RedisBackend::connect(&url).await?);
    let held = holder
        .lock("restart/wait")
        .ttl(Duration::from_secs(60))
        .acquire()
        .await?;
    let waiting = tokio::spawn(async move {
        let g = waiter
            .lock("restart/wait")
            .ttl(Duration::from_secs(10))
            .wait(Duration::from_secs(30))
            .acquire()
            .await?;
        g.release().await
    });
    // The waiter waits (subscribed to the lock's release channel) before
    // the restart breaks its connections.
    let channel = distlock_redis::Keys::new("", &LockName::new("restart/wait")?).channel;
    let port = server.port;
    let start = std::time::Instant::now();
    while !server::command(port, &["PUBSUB", "NUMSUB", &channel])
        .is_some_and(|r| r.contains(":1\r\n"))
    {
        if start.elapsed() > Duration::from_secs(20) {
            return Err("the waiter never subscribed".into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let server = tokio::task::spawn_blocking(move || server.restart().map(|()| server))
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| e.to_string())?;
    let waited = tokio::time::timeout(Duration::from_secs(40), waiting)
        .await
        .map_err(|_| "the wait had not ended 40 s later")?
        .map_err(|e| e.to_string())?;
    if let Err(e) = waited {
        return Err(format!("the wait ended with the restart: {e}").into());
    }
    drop(held);
    drop(server);
    Ok(())
}

/// Another application's data under the keys distlock uses for a name (a
/// hash where the lock key goes, a fencing counter that is not a number)
/// is a refused configuration (`Misconfigured`, exit 78: retrying cannot
/// help), naming the `prefix` to set; and with a prefix the name works.
async fn foreign_data() -> Result<(), Failed> {
    let server = blocking(|| server::spawn(&[]).map_err(|e| Failed::from(e.to_string()))).await?;
    let url = format!("redis://127.0.0.1:{}", server.port);
    let client = LockClient::new(RedisBackend::connect(&url).await?);
    let (hash, text) = (
        LockName::new("foreign/hash")?,
        LockName::new("foreign/text")?,
    );
    let lock = distlock_redis::Keys::new("", &hash).lock;
    let fence = distlock_redis::Keys::new("", &text).fence;
    server::command(server.port, &["HSET", &lock, "field", "value"]).ok_or("HSET failed")?;
    server::command(server.port, &["SET", &fence, "not-a-number"]).ok_or("SET failed")?;
    for name in [&hash, &text] {
        match client.lock(name.as_str()).try_acquire().await {
            Err(Error::Misconfigured { message, .. }) if message.contains("prefix") => {}
            other => {
                return Err(format!(
                    "{name}: expected Misconfigured naming the prefix, got {other:?}"
                )
                .into())
            }
        }
    }
    let own = LockClient::new(RedisBackend::connect(&format!("{url}?prefix=app:")).await?);
    for name in [&hash, &text] {
        own.lock(name.as_str())
            .try_acquire()
            .await?
            .ok_or("refused under a prefix of its own")?
            .release()
            .await?;
    }
    // A limit that is no permit count, and counters that hold a negative
    // number (raised, they give no token): -1 becomes 0, -5 stays below.
    let set = |key: &str, value: &str| {
        server::command(server.port, &["SET", key, value]).ok_or("SET failed")
    };
    set("{foreign/limit}:semaphore:limit", "abc")?;
    set("{foreign/negative}:fence", "-1")?;
    set("{foreign/permits}:semaphore:fence", "-5")?;
    set("{foreign/leader}:election:fence", "-5")?;
    set("{foreign/shared}:fence", "-5")?;
    set("{foreign/all}:fence", "-5")?;
    let fenced = LockClient::new(RedisBackend::connect(&url).await?);
    let answers = [
        (
            "foreign/limit",
            fenced
                .semaphore("foreign/limit", 2)
                .try_acquire()
                .await
                .map(|g| g.is_some()),
        ),
        (
            "foreign/negative",
            fenced
                .lock("foreign/negative")
                .try_acquire()
                .await
                .map(|g| g.is_some()),
        ),
        (
            "foreign/permits",
            fenced
                .semaphore("foreign/permits", 2)
                .try_acquire()
                .await
                .map(|g| g.is_some()),
        ),
        (
            "foreign/leader",
            fenced
                .election("foreign/leader")
                .try_campaign("v")
                .await
                .map(|g| g.is_some()),
        ),
        (
            "foreign/shared",
            fenced
                .lock("foreign/shared")
                .shared()
                .try_acquire()
                .await
                .map(|g| g.is_some()),
        ),
        (
            "foreign/all",
            fenced
                .lock_all(["foreign/free", "foreign/all"])
                .try_acquire()
                .await
                .map(|g| g.is_some()),
        ),
    ];
    for (name, answer) in answers {
        match answer {
            Err(Error::Misconfigured { message, .. }) if message.contains("prefix") => {}
            other => {
                return Err(format!(
                    "{name}: expected Misconfigured naming the prefix, got {other:?}"
                )
                .into())
            }
        }
    }
    // Nothing refused for a negative counter is left held, and the
    // counters keep their values.
    for key in [
        "foreign/negative",
        "{foreign/permits}:semaphore",
        "{foreign/leader}:election",
        "foreign/shared",
        "{foreign/shared}:readers",
        "foreign/all",
        "foreign/free",
    ] {
        let exists = server::command(server.port, &["EXISTS", key]).ok_or("EXISTS failed")?;
        if !exists.starts_with(":0") {
            return Err(format!("{key} is left after a refused acquire").into());
        }
    }
    for (key, value) in [
        ("{foreign/permits}:semaphore:fence", "-5"),
        ("{foreign/shared}:fence", "-5"),
        ("{foreign/all}:fence", "-5"),
    ] {
        let got = server::command(server.port, &["GET", key]).ok_or("GET failed")?;
        if !got.contains(&format!("{value}\r\n")) {
            return Err(format!("{key} holds {got:?} after a refused acquire").into());
        }
    }
    drop(server);
    Ok(())
}

async fn fifo_freed_at_once() -> Result<(), Failed> {
    let (url, ports, _servers) = fifo_servers(Topology::Single).await?;
    let lease = Duration::from_secs(60);
    let url = format!("{url}?fifo=true&queue_lease_ms={}", lease.as_millis());
    let (what, queue) = fifo_target("fifo/at-once", Kind::Semaphore);
    fifo::permits_freed_at_once_each_reach_a_waiter(
        fifo_connect(),
        &url,
        what,
        lease,
        fifo_queued(ports, queue),
    )
    .await
}

async fn fifo_writer_leaves() -> Result<(), Failed> {
    let (url, ports, _servers) = fifo_servers(Topology::Single).await?;
    let url = format!("{url}?fifo=true&queue_lease_ms=60000");
    let name = "fifo/leaves";
    let queue = distlock_redis::Keys::queue_of(name);
    fifo::a_writer_that_leaves_lets_the_readers_behind_it_in(
        fifo_connect(),
        &url,
        name,
        fifo_queued(ports, queue),
    )
    .await
}

/// A queued reader whose entry lapsed (its waiter died) is pruned by the
/// next waiting attempt that looks at the queue, a writer's too, from the
/// queue's shared entries as from the queue: dead readers do not pile up
/// there while waiters keep coming.
async fn fifo_prunes_shared_entries() -> Result<(), Failed> {
    let (url, ports, _servers) = fifo_servers(Topology::Single).await?;
    let url = format!("{url}?fifo=true&queue_lease_ms=60000");
    let name = "fifo/prunes";
    let (port, dead) = (ports[0], "0 dead-reader");
    let keys = [
        distlock_redis::Keys::queue_of(name),
        distlock_redis::Keys::queue_ends_of(name),
        distlock_redis::Keys::queue_shared_of(name),
    ];
    let holder = LockClient::new(RedisBackend::connect(&url).await?);
    let g = holder.lock(name).acquire().await?;
    // The dead reader's entry, ended at 1 ms past the epoch.
    for key in &keys {
        let key = key.clone();
        blocking(move || {
            server::command(port, &["ZADD", &key, "1", dead])
                .ok_or_else(|| Failed::from("no reply"))
        })
        .await?;
    }
    let writer = LockClient::new(RedisBackend::connect(&url).await?);
    let waited = writer
        .lock(name)
        .wait(Duration::from_millis(500))
        .acquire()
        .await;
    if waited.is_ok() {
        return Err("the writer got a held lock".into());
    }
    let shared = keys[2].clone();
    let left = blocking(move || {
        server::command(port, &["ZSCORE", &shared, dead]).ok_or_else(|| Failed::from("no reply"))
    })
    .await?;
    g.release().await?;
    if left.contains("dead-reader") || !left.starts_with("$-1") {
        return Err(format!("the lapsed shared entry is still kept: {left:?}").into());
    }
    Ok(())
}

async fn fifo_last_reader() -> Result<(), Failed> {
    let (url, ports, _servers) = fifo_servers(Topology::Single).await?;
    let url = format!("{url}?fifo=true&queue_lease_ms=60000");
    let name = "fifo/last-reader";
    let queue = distlock_redis::Keys::queue_of(name);
    fifo::the_last_readers_release_wakes_a_queued_writer(
        fifo_connect(),
        &url,
        name,
        fifo_queued(ports, queue),
    )
    .await
}

/// The cut-off waiter's connections (commands and pub/sub) run through a
/// proxy that then drops everything; entries last 3 s (the default).
/// A reader never passes a writer queued before it.
async fn fifo_readers(topology: Topology) -> Result<(), Failed> {
    let (url, ports, _servers) = fifo_servers(topology).await?;
    let url = format!("{url}?fifo=true");
    let name = "fifo/readers";
    let queue = distlock_redis::Keys::queue_of(name);
    fifo::readers_never_pass_a_queued_writer(fifo_connect(), &url, name, fifo_queued(ports, queue))
        .await
}

async fn fifo_cut(kind: Kind) -> Result<(), Failed> {
    let (url, ports, _servers) = fifo_servers(Topology::Single).await?;
    let url = format!("{url}?fifo=true");
    let proxy = Proxy::start(ports[0]).map_err(|e| e.to_string())?;
    let proxied = format!("redis://127.0.0.1:{}?fifo=true&timeout_ms=500", proxy.port);
    let (what, queue) = fifo_target("fifo/cut", kind);
    fifo::a_cut_off_waiter_holds_up_the_queue_only_until_its_entry_lapses(
        fifo_connect(),
        &url,
        &proxied,
        std::slice::from_ref(&proxy),
        what,
        RedisConfig::default().queue_lease,
        fifo_queued(ports, queue),
    )
    .await
}

fn info_field(port: u16, section: &str, field: &str) -> Option<String> {
    let info = server::command(port, &["INFO", section])?;
    info.lines().find_map(|l| {
        l.strip_prefix(&format!("{field}:"))
            .map(|v| v.trim().to_string())
    })
}

fn wait_for(what: &str, timeout: Duration, mut cond: impl FnMut() -> bool) -> Result<(), Failed> {
    let start = std::time::Instant::now();
    while !cond() {
        if start.elapsed() > timeout {
            return Err(format!("timed out after {timeout:?} waiting for {what}").into());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok(())
}

/// Master, a replica linked through a proxy we can cut, three Sentinels.
/// A lock granted while the link is cut never reaches the replica; after the
/// master dies and the Sentinels promote the replica, its holder sees
/// `lost()`, the lock is granted again, and its token repeats. A lock that
/// did replicate survives, and the client follows the new master.
/// `SENTINEL FAILOVER`: the replica is promoted while the old master
/// still runs and answers as master for a while. The holder's renewals
/// follow the Sentinels to the new master (which has the replicated lock):
/// another client is never granted the lock while the holder holds it.
/// A client that waited since before the failover is woken by the
/// holder's release on the new master. A client whose Sentinel stopped
/// answering before the failover (SIGSTOP) moves on to the next Sentinel,
/// which names the new master: its requests do not stay on the old one.
async fn graceful_failover() -> Result<(), Failed> {
    let (master, replica, sentinel, silent) =
        tokio::task::spawn_blocking(|| -> Result<_, Failed> {
            // The old master refuses to be turned into a replica (as one cut
            // off from the Sentinels would not hear it): it stays master, and
            // its clients stay connected.
            let master = server::spawn(&[
                "--repl-diskless-sync-delay",
                "0",
                "--rename-command",
                "SLAVEOF",
                "",
                "--rename-command",
                "REPLICAOF",
                "",
            ])
            .map_err(|e| e.to_string())?;
            let replica = server::spawn(&["--replicaof", "127.0.0.1", &master.port.to_string()])
                .map_err(|e| e.to_string())?;
            wait_for("the replica to sync", Duration::from_secs(20), || {
                info_field(replica.port, "replication", "master_link_status").as_deref()
                    == Some("up")
            })?;
            let sentinel = server::sentinel(master.port, "m").map_err(|e| e.to_string())?;
            let silent = server::sentinel(master.port, "m").map_err(|e| e.to_string())?;
            for s in [&sentinel, &silent] {
                wait_for(
                    "the sentinel to see the replica",
                    Duration::from_secs(30),
                    || {
                        server::command(s.port, &["SENTINEL", "REPLICAS", "m"])
                            .is_some_and(|r| r.contains(&replica.port.to_string()))
                    },
                )?;
            }
            Ok((master, replica, sentinel, silent))
        })
        .await
        .map_err(|e| e.to_string())??;
    let url = format!("redis+sentinel://127.0.0.1:{}/m", sentinel.port);
    let holder = LockClient::new(RedisBackend::connect(&url).await?);
    // Longer than the Sentinel's failover timeout: the promoted copy still
    // runs when the Sentinel names the new master.
    let (name, ttl) = ("graceful/failover", Duration::from_secs(10));
    let g = holder.lock(name).ttl(ttl).acquire().await?;
    // Waits from before the failover, subscribed on the old master.
    let waiter = LockClient::new(RedisBackend::connect(&url).await?);
    let waiting = tokio::spawn(async move {
        let taken = waiter
            .lock(name)
            .ttl(ttl)
            .wait(Duration::from_secs(120))
            .acquire()
            .await;
        (tokio::time::Instant::now(), taken)
    });
    // Follows the Sentinel that stops answering first, the other after it.
    let stale = LockClient::new(
        RedisBackend::connect(&format!(
            "redis+sentinel://127.0.0.1:{},127.0.0.1:{}/m",
            silent.port, sentinel.port
        ))
        .await?,
    );
    stale.lock("graceful/before").try_acquire().await?;
    silent.signal("STOP").map_err(|e| e.to_string())?;
    let (replica_port, sentinel_port, master_port) = (replica.port, sentinel.port, master.port);
    let replica_at = format!("{replica_port}");
    blocking(move || {
        wait_for(
            "the lock to reach the replica",
            Duration::from_secs(10),
            || {
                server::command(replica_port, &["EXISTS", name])
                    .is_some_and(|r| r.starts_with(":1"))
            },
        )?;
        server::command(sentinel_port, &["SENTINEL", "FAILOVER", "m"])
            .filter(|r| r.starts_with("+OK"))
            .ok_or_else(|| Failed::from("SENTINEL FAILOVER refused"))?;
        // The Sentinel names the new master once it gives up turning the
        // old one into a replica (its failover timeout, 5 s).
        wait_for(
            "the Sentinel to name the new master",
            Duration::from_secs(30),
            || {
                server::command(sentinel_port, &["SENTINEL", "GET-MASTER-ADDR-BY-NAME", "m"])
                    .is_some_and(|r| r.contains(&replica_at))
            },
        )
    })
    .await?;
    // Another client, connected now: it talks to the new master, whose
    // copy of the lock lapses a TTL after the promotion unless the
    // holder's renewals reach it too.
    let other = LockClient::new(RedisBackend::connect(&url).await?);
    let until = tokio::time::Instant::now() + ttl + Duration::from_secs(3);
    while tokio::time::Instant::now() < until {
        if let Some(taken) = other
            .lock(name)
            .ttl(ttl)
            .try_acquire()
            .await
            .unwrap_or(None)
        {
            let both = g.is_held();
            let _ = taken.release().await;
            if both {
                return Err("another client was granted the lock while its holder held it".into());
            }
            // The holder was told first: it may lose the lock, never unknowingly.
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    // The client whose Sentinel is silent talks to the new master too
    // (within its timeout and a second or two of asking the next).
    let until = tokio::time::Instant::now() + Duration::from_secs(15);
    let mut on_old = 0;
    loop {
        let probe = format!("graceful/probe{on_old}");
        let taken = stale.lock(&probe).try_acquire().await;
        let there = |port: u16, key: String| {
            blocking(move || {
                Ok(server::command(port, &["EXISTS", &key]).is_some_and(|r| r.starts_with(":1")))
            })
        };
        let (old, new) = (
            there(master_port, probe.clone()).await?,
            there(replica_port, probe.clone()).await?,
        );
        if let Ok(Some(t)) = taken {
            let _ = t.release().await;
        }
        if new && !old {
            break;
        }
        on_old += 1;
        if tokio::time::Instant::now() > until {
            silent.signal("CONT").map_err(|e| e.to_string())?;
            return Err(format!(
                "a client whose first Sentinel is silent still sent its requests to the old master 15 s after the failover ({on_old} tries)"
            )
            .into());
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    silent.signal("CONT").map_err(|e| e.to_string())?;
    // The waiter's subscription moved to the new master with its client.
    blocking(move || {
        wait_for(
            "the waiter's subscription on the new master",
            Duration::from_secs(10),
            || {
                server::command(replica_port, &["PUBSUB", "CHANNELS", "*graceful/failover*"])
                    .is_some_and(|r| r.contains("graceful/failover"))
            },
        )
    })
    .await?;
    if !g.is_held() {
        // The holder lost it on the way (its renewals did not reach the
        // new master in time): the waiter's wake-up proves nothing here.
        let _ = g.release().await;
        waiting.abort();
        drop((master, replica, sentinel, silent));
        return Ok(());
    }
    let released = tokio::time::Instant::now();
    g.release().await?;
    let (granted, taken) = tokio::time::timeout(Duration::from_secs(30), waiting)
        .await
        .map_err(|_| "the waiter from before the failover was not granted 30 s after the release")?
        .map_err(|e| e.to_string())?;
    let taken = taken?;
    if granted < released {
        return Err("the waiter was granted the lock while its holder held it".into());
    }
    let after = granted - released;
    let _ = taken.release().await;
    // Woken by the release's message on the new master; without it the
    // waiter would sleep until the lease it last saw ends (the TTL).
    if after > Duration::from_secs(3) {
        return Err(format!(
            "the waiter from before the failover was granted {after:?} after the release (not woken on the new master)"
        )
        .into());
    }
    drop((master, replica, sentinel, silent));
    Ok(())
}

/// `list` on a Cluster one of whose masters has stopped answering
/// (SIGSTOP), then died (SIGKILL, its connection gone): an error, or every
/// hold; never an answer that leaves that master's holds out.
async fn list_with_a_master_stopped() -> Result<(), Failed> {
    let nodes = blocking(|| Ok(server::cluster(3).map_err(|e| e.to_string())?)).await?;
    let hosts: Vec<String> = nodes
        .iter()
        .map(|n| format!("127.0.0.1:{}", n.port))
        .collect();
    let url = format!("redis+cluster://{}", hosts.join(","));
    let client = LockClient::new(RedisBackend::connect(&url).await?);
    // Only holds on the master that stops: the others may make the list
    // fail for another reason.
    let mut held = Vec::new();
    for i in 0..12 {
        let name = format!("stopped/n{i}");
        let g = client
            .lock(&name)
            .ttl(Duration::from_secs(60))
            .acquire()
            .await?;
        let port = nodes[1].port;
        let there = blocking(move || {
            Ok(server::command(port, &["EXISTS", &name]).is_some_and(|r| r.starts_with(":1")))
        })
        .await?;
        if there {
            held.push(g);
        } else {
            g.release().await?;
        }
    }
    if held.is_empty() {
        return Err(
            "no name of the second master's slots among 12: the case proves nothing".into(),
        );
    }
    if client.list("stopped/", 100).await?.len() != held.len() {
        return Err("list misses holds with every master up".into());
    }
    nodes[1].signal("STOP").map_err(|e| e.to_string())?;
    // Past the cluster's node timeout too: the others mark it failing.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let listed = client.list("stopped/", 100).await;
    nodes[1].signal("CONT").map_err(|e| e.to_string())?;
    match listed {
        Ok(l) if l.len() != held.len() => {
            return Err(format!(
                "list answered {} of {} holds with a master stopped",
                l.len(),
                held.len()
            )
            .into())
        }
        _ => {}
    }
    // A client with no connection to the master any more: a SCAN routed
    // by slot would go to another node, which lists its own keys.
    tokio::time::sleep(Duration::from_secs(1)).await;
    nodes[1].signal("KILL").map_err(|e| e.to_string())?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let listed = client.list("stopped/", 100).await;
    if let Ok(l) = listed {
        if l.len() != held.len() {
            return Err(format!(
                "list answered {} of {} holds with a master killed",
                l.len(),
                held.len()
            )
            .into());
        }
    }
    // Their releases would wait for the dead master: dropped, they go in
    // the background.
    drop(held);
    drop(nodes);
    Ok(())
}

/// A Cluster URL whose first seed does not answer: the client works
/// through the others, and its pub/sub connection too, so a waiter is
/// woken by the release rather than at the holder's lease end (a minute).
async fn first_seed_down() -> Result<(), Failed> {
    let nodes = blocking(|| Ok(server::cluster(3).map_err(|e| e.to_string())?)).await?;
    let dead = integration_tests::harness::process::free_port().map_err(|e| e.to_string())?;
    let hosts: Vec<String> = std::iter::once(dead)
        .chain(nodes.iter().map(|n| n.port))
        .map(|p| format!("127.0.0.1:{p}"))
        .collect();
    let url = format!("redis+cluster://{}", hosts.join(","));
    let holder = LockClient::new(RedisBackend::connect(&url).await?);
    let waiter = LockClient::new(RedisBackend::connect(&url).await?);
    // The deployment check reads every master (none has a replica here).
    let findings = holder.backend().deployment_findings().await?;
    let replication = findings.iter().find(|f| f.setting == "replication");
    if !replication.is_some_and(|f| {
        f.value
            .as_deref()
            .is_ok_and(|v| v.starts_with("3 masters, 3 without a replica ("))
            && f.warning.is_some()
    }) {
        return Err(format!("the Cluster's replication finding: {replication:?}").into());
    }
    // Every node's eviction counts, not one node's picked at random.
    let evicting = nodes[2].port;
    for args in [["maxmemory", "100mb"], ["maxmemory-policy", "allkeys-lru"]] {
        server::command(evicting, &["CONFIG", "SET", args[0], args[1]]).ok_or("no reply")?;
    }
    for _ in 0..4 {
        let findings = holder.backend().deployment_findings().await?;
        let policy = findings.iter().find(|f| f.setting == "maxmemory-policy");
        if !policy.is_some_and(|f| {
            f.value.as_deref().is_ok_and(|v| {
                v.contains(&format!(":{evicting} allkeys-lru")) && !v.contains("noeviction")
            }) && f.warning.is_some()
        }) {
            return Err(format!("the Cluster's eviction finding: {policy:?}").into());
        }
    }
    let name = "seed/down";
    let g = holder
        .lock(name)
        .ttl(Duration::from_secs(60))
        .acquire()
        .await?;
    let waiting = tokio::spawn(async move {
        let taken = waiter
            .lock(name)
            .wait(Duration::from_secs(90))
            .acquire()
            .await;
        (tokio::time::Instant::now(), taken)
    });
    // The waiter subscribes after its first refusal.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let released = tokio::time::Instant::now();
    g.release().await?;
    let (granted, taken) = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .map_err(|_| "the waiter was not granted 10 s after the release (not woken)")?
        .map_err(|e| e.to_string())?;
    let taken = taken?;
    let after = granted.saturating_duration_since(released);
    taken.release().await?;
    drop(nodes);
    if after > Duration::from_secs(3) {
        return Err(format!("the waiter was granted {after:?} after the release").into());
    }
    Ok(())
}

/// A `redis+cluster://` URL naming a server without Cluster support, a
/// `redis://` URL naming one node of a Cluster (a name of another node's
/// slot), and `redis://` and `redis+cluster://` URLs naming a Sentinel:
/// all `Misconfigured`, retrying cannot help.
async fn wrong_topology() -> Result<(), Failed> {
    let (plain, nodes, sentinel) = blocking(|| {
        let plain = server::spawn(&[]).map_err(|e| e.to_string())?;
        let nodes = server::cluster(3).map_err(|e| e.to_string())?;
        let sentinel = server::sentinel(plain.port, "m").map_err(|e| e.to_string())?;
        Ok((plain, nodes, sentinel))
    })
    .await?;
    for (url, what) in [
        (
            format!("redis+cluster://127.0.0.1:{}", plain.port),
            "a plain server",
        ),
        (format!("redis://127.0.0.1:{}", sentinel.port), "a Sentinel"),
        (
            format!("redis+cluster://127.0.0.1:{}", sentinel.port),
            "a Sentinel",
        ),
    ] {
        let answer = match RedisBackend::connect(&url).await {
            Ok(b) => LockClient::new(b)
                .lock("topology/x")
                .try_acquire()
                .await
                .map(|_| ()),
            Err(e) => Err(e),
        };
        match answer {
            Err(Error::Misconfigured { .. }) => {}
            other => return Err(format!("{url}, {what}: {other:?}").into()),
        }
    }
    let one_node = LockClient::new(
        RedisBackend::connect(&format!("redis://127.0.0.1:{}", nodes[0].port)).await?,
    );
    // Of 16 names, some hash to another node's slots.
    let mut refused = 0;
    for i in 0..16 {
        match one_node.lock(format!("topology/n{i}")).try_acquire().await {
            Ok(Some(g)) => {
                g.release().await?;
            }
            Ok(None) => return Err(format!("topology/n{i} refused as held").into()),
            Err(Error::Misconfigured { .. }) => refused += 1,
            Err(e) => return Err(format!("topology/n{i} on one cluster node: {e:?}").into()),
        }
    }
    if refused == 0 {
        return Err("no name of another node's slots among 16: the case proves nothing".into());
    }
    drop((plain, nodes, sentinel));
    Ok(())
}

async fn failover() -> Result<(), Failed> {
    let setup = tokio::task::spawn_blocking(|| -> Result<_, Failed> {
        let master =
            server::spawn(&["--repl-diskless-sync-delay", "0"]).map_err(|e| e.to_string())?;
        let proxy = Proxy::start(master.port).map_err(|e| e.to_string())?;
        let replica = server::spawn(&["--replicaof", "127.0.0.1", &proxy.port.to_string()])
            .map_err(|e| e.to_string())?;
        wait_for("the replica to sync", Duration::from_secs(20), || {
            info_field(replica.port, "replication", "master_link_status").as_deref() == Some("up")
        })?;
        let sentinels = (0..3)
            .map(|_| server::sentinel(master.port, "m"))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| e.to_string())?;
        wait_for(
            "the sentinels to agree on a quorum",
            Duration::from_secs(30),
            || {
                server::command(sentinels[0].port, &["SENTINEL", "CKQUORUM", "m"])
                    .is_some_and(|r| r.contains("3 usable"))
                    && server::command(sentinels[0].port, &["SENTINEL", "REPLICAS", "m"])
                        .is_some_and(|r| r.contains(&replica.port.to_string()))
            },
        )?;
        Ok((master, proxy, replica, sentinels))
    })
    .await
    .map_err(|e| e.to_string())??;
    let (master, proxy, replica, sentinels) = setup;
    let hosts: Vec<String> = sentinels
        .iter()
        .map(|s| format!("127.0.0.1:{}", s.port))
        .collect();
    let url = format!("redis+sentinel://{}/m", hosts.join(","));
    let client = LockClient::new(RedisBackend::connect(&url).await?);
    let acked = LockClient::new(
        RedisBackend::connect_with(
            &url,
            RedisConfig::default().with_wait_replicas(1, Duration::from_millis(500)),
        )
        .await?,
    );
    let ttl = Duration::from_secs(10);
    // The lock that replicated must outlive the failover however long the
    // Sentinels take to promote the replica (about 20 s at most): its
    // holder renews it every 10 s and retries a failed renewal until its
    // deadline.
    let replicated_ttl = Duration::from_secs(30);

    // WAIT: acknowledged while the link is up.
    let g = acked.lock("failover/acked").ttl(ttl).acquire().await?;
    g.release().await?;

    let replicated = client
        .lock("failover/replicated")
        .ttl(replicated_ttl)
        .acquire()
        .await?;
    wait_for(
        "the lock to reach the replica",
        Duration::from_secs(10),
        || {
            server::command(replica.port, &["EXISTS", "failover/replicated"])
                .is_some_and(|r| r.starts_with(":1"))
        },
    )?;

    proxy.set_blackhole(true);
    // WAIT: no replica acknowledges, so the grant is withdrawn.
    match acked.lock("failover/unacked").ttl(ttl).try_acquire().await {
        Err(Error::Unavailable { .. }) => {}
        other => {
            return Err(format!(
                "expected Unavailable without replica acknowledgement, got {other:?}"
            )
            .into())
        }
    }
    if server::command(master.port, &["EXISTS", "failover/unacked"])
        .is_some_and(|r| r.starts_with(":1"))
    {
        return Err("an unacknowledged grant was left held".into());
    }
    let lagging = client.lock("failover/lagging").ttl(ttl).acquire().await?;
    let first_token = lagging.token();
    tokio::time::sleep(Duration::from_millis(300)).await;
    if server::command(replica.port, &["EXISTS", "failover/lagging"])
        .is_some_and(|r| r.starts_with(":1"))
    {
        return Err(
            "the lock reached the replica through a cut link: the fault did not fire".into(),
        );
    }

    master.signal("KILL").map_err(|e| e.to_string())?;
    let (replica_port, s0) = (replica.port, sentinels[0].port);
    // Between the Sentinels flagging the master down and promoting the
    // replica they name no master: a request then is retryable.
    tokio::task::spawn_blocking(move || {
        wait_for(
            "the sentinels to flag the master down",
            Duration::from_secs(20),
            || {
                server::command(s0, &["SENTINEL", "MASTER", "m"])
                    .is_some_and(|r| r.contains("s_down"))
            },
        )
    })
    .await
    .map_err(|e| e.to_string())??;
    // No renewal reaches a master from here until the promotion.
    let due = lagging.deadline();
    match client.lock("failover/during").ttl(ttl).try_acquire().await {
        Ok(g) => drop(g),
        Err(e) if e.is_retryable() => {}
        Err(e) => {
            return Err(format!("an acquire during the failover is not retryable: {e:?}").into())
        }
    }
    tokio::task::spawn_blocking(move || {
        wait_for(
            "the sentinels to promote the replica",
            Duration::from_secs(40),
            || {
                server::command(s0, &["SENTINEL", "GET-MASTER-ADDR-BY-NAME", "m"])
                    .is_some_and(|r| r.contains(&replica_port.to_string()))
            },
        )
    })
    .await
    .map_err(|e| e.to_string())??;

    // A promotion after the holder's deadline (a split vote the Sentinels
    // retry) leaves its renewals failing until then.
    let promoted_late = due.is_none_or(|d| tokio::time::Instant::now() >= d);
    let reason = tokio::time::timeout(ttl * 3, lagging.lost())
        .await
        .map_err(|_| Failed::from("the holder of the vanished lock never saw lost()"))?;
    match reason {
        LostReason::RenewalRejected => {}
        LostReason::RenewalFailed(_) if promoted_late => {}
        _ => return Err(format!("unexpected loss reason: {reason}").into()),
    }
    let second = LockClient::new(RedisBackend::connect(&url).await?);
    let again = second
        .lock("failover/lagging")
        .ttl(ttl)
        .wait(Duration::from_secs(10))
        .acquire()
        .await?;
    if again.token() > first_token {
        return Err(format!(
            "token rose from {first_token} to {} although the counter was lost",
            again.token()
        )
        .into());
    }
    again.release().await?;

    // The client renews the replicated lock on the new master: the key's
    // PTTL there rises.
    tokio::task::spawn_blocking(move || {
        let pttl = || {
            server::command(replica_port, &["PTTL", "failover/replicated"])
                .and_then(|r| r.strip_prefix(':')?.split('\r').next()?.parse::<i64>().ok())
                .unwrap_or(-2)
        };
        let mut last = pttl();
        wait_for(
            "a renewal of the replicated lock on the new master",
            replicated_ttl,
            || {
                let now = pttl();
                let rose = now > last + 500;
                last = now;
                rose
            },
        )
    })
    .await
    .map_err(|e| e.to_string())??;
    if !replicated.is_held() {
        return Err(
            "the replicated lock was lost: the client did not follow the new master".into(),
        );
    }
    if second
        .lock("failover/replicated")
        .try_acquire()
        .await?
        .is_some()
    {
        return Err("the replicated lock was granted twice".into());
    }
    if !replicated.release().await? {
        return Err("release of the replicated lock on the new master failed".into());
    }
    drop((proxy, replica, sentinels, master));
    Ok(())
}

/// Taking four free locks at once is one request to the server (one script
/// call, where one at a time would be four), and a set with one held name is refused in one request with
/// nothing written. On a server of its own, so that only these commands
/// are counted.
/// A request sent again after its answer was lost (a reconnect re-sends
/// it, and Sentinel's client does after a connection error) finds its own
/// key: it holds the lock, alone or in a multi-lock, and is granted again
/// with a newer token, not refused for the whole lease. Another owner is
/// still refused.
async fn sent_again() -> Result<(), Failed> {
    use distlock_core::{AllAtOnce, Backend, LockRequest};
    let node = tokio::task::spawn_blocking(|| server::spawn(&[]))
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| e.to_string())?;
    for fifo in [false, true] {
        let url = format!("redis://127.0.0.1:{}?fifo={fifo}", node.port);
        let b = RedisBackend::connect(&url).await?;
        let ttl = Duration::from_secs(30);
        let req = LockRequest::new(LockName::new(format!("again/{fifo}"))?, ttl);
        let first = b
            .try_acquire(&req)
            .await?
            .ok_or("a free lock was refused")?;
        let again = b
            .try_acquire(&req)
            .await?
            .ok_or("the same request sent again was refused")?;
        if again.token <= first.token {
            return Err(format!("token {} after {}", again.token, first.token).into());
        }
        let other = LockRequest::new(req.name.clone(), ttl);
        if b.try_acquire(&other).await?.is_some() {
            return Err("another owner was granted a held lock".into());
        }
        if !b.release(&req).await? {
            return Err("the lock taken again was not held".into());
        }
        // The release sent again: the first one freed it.
        if b.release(&req).await? {
            return Err("a release sent again answered held".into());
        }
    }
    let b = RedisBackend::connect(&format!("redis://127.0.0.1:{}", node.port)).await?;
    let reqs: Vec<LockRequest> = ["again/a", "again/b"]
        .iter()
        .map(|n| {
            Ok(LockRequest::new(
                LockName::new(*n)?,
                Duration::from_secs(30),
            ))
        })
        .collect::<Result<_, Error>>()?;
    for round in ["first", "sent again"] {
        if !matches!(b.try_acquire_all(&reqs).await?, AllAtOnce::Granted(_)) {
            return Err(format!("the multi-lock's {round} request was not granted").into());
        }
    }
    let others: Vec<LockRequest> = reqs
        .iter()
        .map(|r| LockRequest::new(r.name.clone(), r.ttl))
        .collect();
    if !matches!(b.try_acquire_all(&others).await?, AllAtOnce::Refused) {
        return Err("another owner's multi-lock was not refused".into());
    }
    drop(node);
    Ok(())
}

fn spawned(extra: &'static [&'static str]) -> impl FnOnce() -> Result<ServerProcess, Failed> {
    move || server::spawn(extra).map_err(|e| Failed::from(e.to_string()))
}

/// `what` must have failed as `Unavailable` (retryable, exit 69).
fn unavailable<T: std::fmt::Debug>(what: &str, r: Result<T, Error>) -> Result<(), Failed> {
    match r {
        Err(e @ Error::Unavailable { .. }) if e.is_retryable() => Ok(()),
        other => Err(format!("{what}: expected Unavailable, got {other:?}").into()),
    }
}

/// A server with `min-replicas-to-write 1` and no replica refuses every
/// script that writes with NOREPLICAS until a replica connects: an acquire
/// is retryable, not a permanent backend error.
async fn too_few_replicas() -> Result<(), Failed> {
    refused_by_settings(
        &[("min-replicas-to-write", "1")],
        ("min-replicas-to-write", "0"),
        "noreplicas",
        "an acquire without enough replicas",
    )
    .await
}

/// A server at its `maxmemory` with `noeviction` refuses every script
/// that writes with OOM until keys expire or memory is raised: an acquire
/// is retryable (a wait goes on through it), not a permanent backend error.
async fn out_of_memory() -> Result<(), Failed> {
    refused_by_settings(
        &[("maxmemory-policy", "noeviction"), ("maxmemory", "1")],
        ("maxmemory", "0"),
        "oom",
        "an acquire on a server out of memory",
    )
    .await
}

/// On a server of its own with the settings `set` (`CONFIG SET` pairs),
/// an acquire of `name` is `Unavailable` (`what` names it in a failure);
/// once `unset` lifts them, the lock is free.
async fn refused_by_settings(
    set: &[(&str, &str)],
    unset: (&str, &str),
    name: &str,
    what: &str,
) -> Result<(), Failed> {
    let node = blocking(spawned(&[])).await?;
    let client =
        LockClient::new(RedisBackend::connect(&format!("redis://127.0.0.1:{}", node.port)).await?);
    for (setting, value) in set {
        server::command(node.port, &["CONFIG", "SET", setting, value])
            .filter(|r| r.starts_with("+OK"))
            .ok_or_else(|| format!("CONFIG SET {setting} failed"))?;
    }
    unavailable(what, client.lock(name).try_acquire().await)?;
    server::command(node.port, &["CONFIG", "SET", unset.0, unset.1]);
    client
        .lock(name)
        .try_acquire()
        .await?
        .ok_or("the lock was held after a refused acquire")?
        .release()
        .await?;
    Ok(())
}

/// Another client's script runs past `busy-reply-threshold`: the server
/// answers BUSY to everything else until it ends or is killed, and an
/// acquire meanwhile is retryable, not a permanent backend error.
async fn busy_script() -> Result<(), Failed> {
    use std::io::{Read, Write};
    let node = blocking(spawned(&["--busy-reply-threshold", "100"])).await?;
    let port = node.port;
    let client =
        LockClient::new(RedisBackend::connect(&format!("redis://127.0.0.1:{port}")).await?);
    let script = "local i=0 while i<3e9 do i=i+1 end return i";
    let mut conn = std::net::TcpStream::connect(("127.0.0.1", port))?;
    conn.write_all(
        format!(
            "*3\r\n$4\r\nEVAL\r\n${}\r\n{script}\r\n$1\r\n0\r\n",
            script.len()
        )
        .as_bytes(),
    )?;
    // The script's answer, once SCRIPT KILL ends it.
    let runner = std::thread::spawn(move || {
        let mut reply = [0u8; 256];
        let n = conn.read(&mut reply).unwrap_or(0);
        String::from_utf8_lossy(&reply[..n]).into_owned()
    });
    let busy = blocking(move || {
        wait_for("the server to answer BUSY", Duration::from_secs(10), || {
            server::command(port, &["PING"]).is_some_and(|r| r.starts_with("-BUSY"))
        })
    })
    .await;
    let during = client.lock("busy").try_acquire().await;
    let killed = server::command(port, &["SCRIPT", "KILL"]);
    let ended = blocking(move || {
        runner
            .join()
            .map_err(|_| Failed::from("the script's reader panicked"))
    })
    .await?;
    busy?;
    if !killed.is_some_and(|r| r.starts_with("+OK")) || !ended.contains("killed") {
        return Err(format!("the script did not end by SCRIPT KILL: {ended}").into());
    }
    unavailable("an acquire while a script runs", during)?;
    client
        .lock("busy")
        .try_acquire()
        .await?
        .ok_or("the lock was held after a refused acquire")?
        .release()
        .await?;
    Ok(())
}

/// A master its one Sentinel flags down and cannot replace (a quorum of 2
/// is never reached, and there is no replica): the Sentinel names no
/// master, as during a failover before the replica is promoted. Each
/// request and a new connection fail as retryable, not as a permanent
/// backend error. A service the Sentinel does not monitor at all is
/// `Misconfigured` at connect.
async fn sentinel_master_down() -> Result<(), Failed> {
    let master = blocking(spawned(&[])).await?;
    let master_port = master.port;
    let sentinel = blocking(move || {
        server::sentinel(master_port, "m").map_err(|e| Failed::from(e.to_string()))
    })
    .await?;
    // A service the Sentinel does not monitor is a wrong URL.
    let unknown = format!("redis+sentinel://127.0.0.1:{}/nosuch", sentinel.port);
    match RedisBackend::connect(&unknown).await {
        Err(e @ Error::Misconfigured { .. }) if e.to_string().contains("service name") => {}
        other => return Err(format!("an unknown service gave {other:?}").into()),
    }
    // A Sentinel that requires a password, with the master's in the URL:
    // named as such, not as a password missing from the URL.
    server::command(
        sentinel.port,
        &["ACL", "SETUSER", "default", "resetpass", ">s-pw"],
    )
    .ok_or("no reply")?;
    let guarded = format!("redis+sentinel://:m-pw@127.0.0.1:{}/m", sentinel.port);
    match RedisBackend::connect(&guarded).await {
        Err(e @ Error::Misconfigured { .. }) if e.to_string().contains("Sentinels without one") => {
        }
        other => return Err(format!("a Sentinel requiring a password gave {other:?}").into()),
    }
    server::command_as(
        sentinel.port,
        "s-pw",
        &["ACL", "SETUSER", "default", "nopass"],
    )
    .ok_or("no reply")?;
    let url = format!("redis+sentinel://127.0.0.1:{}/m", sentinel.port);
    let client = LockClient::new(RedisBackend::connect(&url).await?);
    client
        .lock("sentinel-down")
        .try_acquire()
        .await?
        .ok_or("a free lock was refused")?
        .release()
        .await?;
    master.signal("KILL").map_err(|e| e.to_string())?;
    let s = sentinel.port;
    blocking(move || {
        wait_for(
            "the Sentinel to flag the master down",
            Duration::from_secs(20),
            || {
                server::command(s, &["SENTINEL", "MASTER", "m"])
                    .is_some_and(|r| r.contains("s_down"))
            },
        )
    })
    .await?;
    // The first request meets the closed connection and asks the Sentinel
    // again; the next ones ask it at once.
    for attempt in ["first", "second"] {
        unavailable(
            &format!("the {attempt} acquire with the master flagged down"),
            client.lock("sentinel-down").try_acquire().await,
        )?;
    }
    unavailable(
        "a connection with the master flagged down",
        RedisBackend::connect(&url).await,
    )?;
    drop(sentinel);
    Ok(())
}

/// The first Sentinel of a URL stops answering (its connections pass
/// nothing): a connection, through the Sentinel that answers, takes at most
/// about one `timeout_ms`, as does finding out that no Sentinel monitors a
/// service, however many Sentinels stall.
async fn sentinel_stalled() -> Result<(), Failed> {
    let master = blocking(spawned(&[])).await?;
    let master_port = master.port;
    let sentinel = blocking(move || {
        server::sentinel(master_port, "m").map_err(|e| Failed::from(e.to_string()))
    })
    .await?;
    let stalled: Vec<Proxy> = (0..2)
        .map(|_| Proxy::start(sentinel.port))
        .collect::<Result<_, _>>()
        .map_err(|e| e.to_string())?;
    for p in &stalled {
        p.set_stall_new(true);
    }
    let hosts = format!(
        "127.0.0.1:{},127.0.0.1:{},127.0.0.1:{}",
        stalled[0].port, stalled[1].port, sentinel.port
    );
    // Below two timeouts, which a Sentinel asked after the other would
    // cost.
    let timeout = Duration::from_millis(2000);
    let bound = Duration::from_millis(3900);
    for (service, misconfigured) in [("m", false), ("nosuch", true)] {
        let url = format!(
            "redis+sentinel://{hosts}/{service}?timeout_ms={}",
            timeout.as_millis()
        );
        let start = std::time::Instant::now();
        let connected = tokio::time::timeout(Duration::from_secs(60), RedisBackend::connect(&url))
            .await
            .map_err(|_| format!("connecting to service {service} hung"))?;
        let took = start.elapsed();
        if took > bound {
            return Err(
                format!("connecting to service {service} took {took:?} (bound {bound:?})").into(),
            );
        }
        match (connected, misconfigured) {
            (Ok(backend), false) => {
                LockClient::new(backend)
                    .lock("sentinel-stalled")
                    .try_acquire()
                    .await?
                    .ok_or("a free lock was refused")?
                    .release()
                    .await?;
            }
            (Err(Error::Misconfigured { .. }), true) => {}
            (other, _) => {
                return Err(
                    format!("service {service} gave {:?}", other.map(|_| "a backend")).into(),
                )
            }
        }
    }
    Ok(())
}

/// The first Sentinel of the URL stops answering (its connections stay
/// open, nothing gets through) while a lock of 2 s is held: each renewal
/// asks the Sentinels for the master first, in turn, and that question is
/// given a tenth of the TTL, not the 5 s `timeout_ms`, so the lease is
/// renewed and never lost.
async fn sentinel_hung_during_renewals() -> Result<(), Failed> {
    let master = blocking(spawned(&[])).await?;
    let master_port = master.port;
    let sentinel = blocking(move || {
        server::sentinel(master_port, "m").map_err(|e| Failed::from(e.to_string()))
    })
    .await?;
    let hung = Proxy::start(sentinel.port).map_err(|e| e.to_string())?;
    let url = format!(
        "redis+sentinel://127.0.0.1:{},127.0.0.1:{}/m?timeout_ms=5000",
        hung.port, sentinel.port
    );
    let client = LockClient::new(RedisBackend::connect(&url).await?);
    let g = client
        .lock("sentinel-hung")
        .ttl(Duration::from_secs(2))
        .acquire()
        .await?;
    hung.set_blackhole(true);
    let lost = tokio::time::timeout(Duration::from_secs(8), g.lost()).await;
    hung.set_blackhole(false);
    if let Ok(why) = lost {
        return Err(format!("the lease was lost with one Sentinel hung: {why:?}").into());
    }
    if !g.release().await? {
        return Err("the release found the lock gone".into());
    }
    Ok(())
}

/// Every node of a cluster is gone: an acquire is retryable.
async fn cluster_down() -> Result<(), Failed> {
    let nodes = blocking(|| server::cluster(3).map_err(|e| Failed::from(e.to_string()))).await?;
    let hosts: Vec<String> = nodes
        .iter()
        .map(|n| format!("127.0.0.1:{}", n.port))
        .collect();
    let client = LockClient::new(
        RedisBackend::connect(&format!("redis+cluster://{}", hosts.join(","))).await?,
    );
    client
        .lock("cluster-down")
        .try_acquire()
        .await?
        .ok_or("a free lock was refused")?
        .release()
        .await?;
    for n in &nodes {
        n.signal("KILL").map_err(|e| e.to_string())?;
    }
    for attempt in ["first", "second"] {
        let r = tokio::time::timeout(
            Duration::from_secs(30),
            client.lock("cluster-down").try_acquire(),
        )
        .await
        .map_err(|_| format!("the {attempt} acquire hung"))?;
        match r {
            Err(e) if e.is_retryable() => {}
            other => {
                return Err(format!(
                    "the {attempt} acquire with every node down: expected a retryable error, got {other:?}"
                )
                .into())
            }
        }
    }
    Ok(())
}

/// The client's connection, stalled by the network without being closed:
/// the request that times out on it is a retryable error, and the requests
/// after it go out on a new connection.
async fn stalled_connection() -> Result<(), Failed> {
    let node = tokio::task::spawn_blocking(|| server::spawn(&[]))
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| e.to_string())?;
    let proxy = Proxy::start(node.port).map_err(|e| e.to_string())?;
    let before = proxy.accepted();
    let url = format!("redis://127.0.0.1:{}?timeout_ms=300", proxy.port);
    let client = LockClient::new(RedisBackend::connect(&url).await?);
    client
        .lock("stalled-conn/a")
        .try_acquire()
        .await?
        .ok_or("a free lock was refused")?
        .release()
        .await?;
    for index in before..proxy.accepted() {
        proxy.stall(index);
    }
    match client.lock("stalled-conn/b").try_acquire().await {
        Err(e) if e.is_retryable() => {}
        other => {
            return Err(format!("a request on a stalled connection answered {other:?}").into())
        }
    }
    let start = std::time::Instant::now();
    loop {
        match client.lock("stalled-conn/b").try_acquire().await {
            Ok(Some(g)) => {
                g.release().await?;
                break;
            }
            Ok(None) => return Err("a free lock was refused".into()),
            Err(e) if start.elapsed() > Duration::from_secs(10) => {
                return Err(format!("requests still fail 10 s after the stall: {e}").into())
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
    drop(node);
    Ok(())
}

/// A waiter's pub/sub connection that the network stops answering without
/// closing it (and every new one, too) neither keeps a wait past its
/// deadline nor a wait without one for ever: subscribing, unsubscribing and
/// opening a connection give up after the client's timeout, and the waiter
/// re-checks on its timer.
async fn stalled_pubsub() -> Result<(), Failed> {
    let node = tokio::task::spawn_blocking(|| server::spawn(&[]))
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| e.to_string())?;
    let proxy = Proxy::start(node.port).map_err(|e| e.to_string())?;
    let holder =
        LockClient::new(RedisBackend::connect(&format!("redis://127.0.0.1:{}", node.port)).await?);
    let proxied = format!("redis://127.0.0.1:{}?timeout_ms=300", proxy.port);
    let waiter = LockClient::new(RedisBackend::connect(&proxied).await?);
    // A refused wait opens the waiter's pub/sub connection.
    let warm = holder.lock("stalled/warm").acquire().await?;
    let before = proxy.accepted();
    match waiter
        .lock("stalled/warm")
        .wait(Duration::from_secs(2))
        .acquire()
        .await
    {
        Err(Error::WaitTimeout { .. }) => {}
        other => return Err(format!("a held lock's wait ended with {other:?}").into()),
    }
    let after = proxy.accepted();
    if after == before {
        return Err("the refused wait opened no pub/sub connection".into());
    }
    for index in before..after {
        proxy.stall(index);
    }
    proxy.set_stall_new(true);
    let held = holder
        .lock("stalled/a")
        .ttl(Duration::from_secs(3))
        .acquire()
        .await?;
    let bound = Duration::from_secs(15);
    let timed = tokio::time::timeout(
        bound,
        waiter
            .lock("stalled/a")
            .wait(Duration::from_secs(1))
            .acquire(),
    )
    .await
    .map_err(|_| format!("a wait of 1 s was still waiting after {bound:?}"))?;
    if !matches!(timed, Err(Error::WaitTimeout { .. })) {
        return Err(format!("a wait of 1 s on a held lock ended with {timed:?}").into());
    }
    let waiting =
        tokio::spawn(async move { waiter.lock("stalled/a").wait_forever().acquire().await });
    tokio::time::sleep(Duration::from_secs(1)).await;
    held.release().await?;
    let got = tokio::time::timeout(bound, waiting)
        .await
        .map_err(|_| format!("a wait without a deadline still waited {bound:?} after the release"))?
        .map_err(|e| e.to_string())??;
    got.release().await?;
    warm.release().await?;
    drop(node);
    Ok(())
}

/// A waiter dropped after its `SUBSCRIBE` reached the server, before the
/// confirmation came back (the proxy holds every reply for 3 s),
/// leaves the channel unsubscribed once it is gone, not subscribed on the
/// client's pub/sub connection with nobody counted on it.
async fn subscribe_dropped() -> Result<(), Failed> {
    let node = tokio::task::spawn_blocking(|| server::spawn(&[]))
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| e.to_string())?;
    let port = node.port;
    let proxy = Proxy::start(port).map_err(|e| e.to_string())?;
    let holder =
        LockClient::new(RedisBackend::connect(&format!("redis://127.0.0.1:{port}")).await?);
    // The waiter's client outlives its wait: closing its pub/sub
    // connection would unsubscribe everything.
    let waiter = LockClient::new(
        RedisBackend::connect(&format!(
            "redis://127.0.0.1:{}?timeout_ms=10000",
            proxy.port
        ))
        .await?,
    );
    let lock = "unconfirmed/a";
    let held = holder
        .lock(lock)
        .ttl(Duration::from_secs(60))
        .acquire()
        .await?;
    let subscribed = move || {
        server::command(port, &["PUBSUB", "CHANNELS", "*unconfirmed/a*"])
            .is_some_and(|reply| reply.contains(lock))
    };
    // Long enough that the drop below lands before the confirmation even
    // on a busy machine, short of the subscriber's timeout.
    proxy.set_reply_delay(Duration::from_secs(3));
    let w = waiter.clone();
    let waiting =
        tokio::spawn(async move { w.lock(lock).wait(Duration::from_secs(60)).acquire().await });
    let until = tokio::time::Instant::now() + Duration::from_secs(30);
    while !subscribed() {
        if tokio::time::Instant::now() > until {
            return Err("the waiter never subscribed".into());
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    waiting.abort();
    if !waiting.await.is_err_and(|e| e.is_cancelled()) {
        return Err("the wait ended before it was dropped; the case shows nothing".into());
    }
    proxy.set_reply_delay(Duration::ZERO);
    let until = tokio::time::Instant::now() + Duration::from_secs(15);
    while subscribed() {
        if tokio::time::Instant::now() > until {
            return Err(
                "the channel stays subscribed 15 s after its only waiter was dropped".into(),
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    held.release().await?;
    drop(waiter);
    drop(node);
    Ok(())
}

async fn multi_lock_is_one_request() -> Result<(), Failed> {
    let node = tokio::task::spawn_blocking(|| server::spawn(&[]))
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| e.to_string())?;
    let port = node.port;
    // Every distlock request is a script call (the commands a script runs
    // are counted apart).
    let served = move || server::calls(port, &["evalsha", "eval"]);
    let url = format!("redis://127.0.0.1:{port}");
    let client = LockClient::new(RedisBackend::connect(&url).await?);
    let names = ["multi/a", "multi/b", "multi/c", "multi/d"];
    // Loads the script (a first EVALSHA answered NOSCRIPT is sent again).
    client
        .lock_all(names)
        .try_acquire()
        .await?
        .ok_or("four free locks were refused")?
        .release()
        .await?;
    let before = served();
    let m = client
        .lock_all(names)
        .try_acquire()
        .await?
        .ok_or("four free locks were refused")?;
    let took = served() - before;
    if took != 1 {
        return Err(format!("taking four free locks took {took} script calls").into());
    }
    let other = LockClient::new(RedisBackend::connect(&url).await?);
    let held = served();
    let refused = other.lock_all(["multi/x", "multi/d"]).try_acquire().await?;
    if refused.is_some() || served() - held != 1 {
        return Err("a set with a held name was not refused in one request".into());
    }
    if other.lock("multi/x").try_acquire().await?.is_none() {
        return Err("a refused set left a name held".into());
    }
    m.release().await?;
    drop(node);
    Ok(())
}

/// A plain URL to TLS servers (single and Cluster), and a TLS URL to a
/// plain server: `Error::Misconfigured` naming the scheme to use, not a
/// retryable `Unavailable`.
async fn wrong_scheme(
    tls: Arc<Redis>,
    cluster: Arc<Redis>,
    plain: Arc<Redis>,
) -> Result<(), Failed> {
    let without_tls = |url: String| -> Result<String, Failed> {
        let (base, _) = url
            .split_once("?ca_file=")
            .ok_or("the URL names no ca_file")?;
        Ok(base.replacen("rediss", "redis", 1))
    };
    let plain_url = plain.url()?;
    let (_, hosts) = plain_url.split_once("://").ok_or("no scheme")?;
    for (url, says) in [
        (without_tls(tls.url()?)?, "use rediss://"),
        (without_tls(cluster.url()?)?, "use rediss://"),
        (format!("rediss://{hosts}"), "use redis://"),
    ] {
        let connecting = RedisBackend::connect(&url);
        match tokio::time::timeout(Duration::from_secs(20), connecting).await {
            Ok(Err(Error::Misconfigured { message, .. })) if message.contains(says) => {}
            Ok(Err(e)) => return Err(format!("{url}: {e:?}").into()),
            Ok(Ok(_)) => return Err(format!("{url}: connected").into()),
            Err(_) => return Err(format!("{url}: hung for 20 s").into()),
        }
    }
    Ok(())
}

/// A CA that signed none of the servers' certificates: connecting fails at
/// once with `Error::Misconfigured` (not a retryable `Unavailable`), saying
/// TLS and certificate and showing no password.
async fn wrong_ca(f: Arc<Redis>) -> Result<(), Failed> {
    const PASSWORD: &str = "wrong-ca-secret-pw";
    let url = f.url()?;
    let dir = std::env::temp_dir().join(format!(
        "redistls-wrong-ca-{}-{}",
        std::process::id(),
        &distlock_core::Owner::random().to_string()[..8]
    ));
    std::fs::create_dir_all(&dir)?;
    let other = integration_tests::harness::tls::make_unrelated_ca(&dir)?;
    let (base, _) = url
        .split_once("?ca_file=")
        .ok_or("the URL names no ca_file")?;
    let (scheme, hosts) = base.split_once("://").ok_or("no scheme")?;
    let url = format!(
        "{scheme}://app:{PASSWORD}@{hosts}?ca_file={}",
        other.display()
    );
    let started = std::time::Instant::now();
    let r = tokio::time::timeout(Duration::from_secs(15), RedisBackend::connect(&url)).await;
    let took = started.elapsed();
    let _ = std::fs::remove_dir_all(&dir);
    let e = match r {
        Err(_) => return Err(format!("{scheme}: a wrong CA hung for {took:?}").into()),
        Ok(Ok(_)) => return Err(format!("{scheme}: a wrong CA connected").into()),
        Ok(Err(e)) => e,
    };
    let text = format!("{e} {e:?}");
    match &e {
        Error::Misconfigured {
            backend: "redis",
            message,
            ..
        } if message.contains("TLS") && message.contains("certificate") => {}
        other => return Err(format!("{scheme}: a wrong CA gave {other:?}").into()),
    }
    if e.is_retryable() {
        return Err(format!("{scheme}: a wrong CA is retryable: {e}").into());
    }
    if text.contains(PASSWORD) {
        return Err(format!("{scheme}: the error shows the password: {text}").into());
    }
    if took > Duration::from_secs(5) {
        return Err(format!("{scheme}: a wrong CA took {took:?} to report").into());
    }
    Ok(())
}

/// The least-privilege user may not touch names outside its key patterns:
/// distlock says so with `Error::Misconfigured` (exit 78 in the CLI), and
/// leaves the other names alone.
async fn outside_the_rule(f: Arc<Redis>) -> Result<(), Failed> {
    let client = LockClient::new(f.backend().await?);
    match client.lock("elsewhere/job").try_acquire().await {
        Err(distlock_core::Error::Misconfigured { message, .. }) if message.contains("README") => {}
        other => return Err(format!("a name outside the user's keys gave {other:?}").into()),
    }
    match client
        .lock(format!("{}/job", integration_tests::namespace()))
        .try_acquire()
        .await?
    {
        Some(g) => g.release().await.map(|_| ()).map_err(Failed::from),
        None => Err("a free name inside the user's keys was refused".into()),
    }
}

/// Behind Sentinel and in Cluster the least-privilege rule needs one
/// command more each, as the README says: the client asks the master its
/// `ROLE` after the Sentinels named it, and reads the slot map with
/// `CLUSTER SLOTS`. A user without it is refused (a typed configuration
/// error); with it, a lock, a permit, a shared hold and `list` work.
async fn acl_topologies() -> Result<(), Failed> {
    let keys = ["~conformance-*", "~{conformance-*", "&{conformance-*"];
    let set_user = |port: u16, extra: Option<&str>| -> Result<(), Failed> {
        let mut rule: Vec<&str> = vec!["ACL", "SETUSER"];
        rule.extend(app_user(LEAST_PRIVILEGE, &keys).into_iter().skip(1));
        rule.extend(extra);
        server::command(port, &["ACL", "DELUSER", "app"]);
        match server::command(port, &rule) {
            Some(r) if r.starts_with("+OK") && !r.contains("-ERR") => Ok(()),
            other => Err(format!("ACL SETUSER on {port}: {other:?}").into()),
        }
    };
    let (master, sentinel, nodes) = tokio::task::spawn_blocking(|| {
        let master = server::spawn(&[])?;
        let sentinel = server::sentinel(master.port, "m")?;
        let nodes = server::cluster(3)?;
        Ok::<_, integration_tests::harness::HarnessError>((master, sentinel, nodes))
    })
    .await
    .map_err(|e| e.to_string())?
    .map_err(|e| e.to_string())?;
    let hosts: Vec<String> = nodes
        .iter()
        .map(|n| format!("127.0.0.1:{}", n.port))
        .collect();
    let topologies = [
        (
            format!("redis+sentinel://app:app-pw@127.0.0.1:{}/m", sentinel.port),
            vec![master.port],
            "+role",
        ),
        (
            format!("redis+cluster://app:app-pw@{}", hosts.join(",")),
            nodes.iter().map(|n| n.port).collect(),
            "+cluster|slots",
        ),
    ];
    let ns = integration_tests::namespace();
    for (url, ports, needed) in topologies {
        for &port in &ports {
            set_user(port, None)?;
        }
        match RedisBackend::connect(&url).await {
            Err(Error::Misconfigured { .. }) => {}
            Err(e) => return Err(format!("{url} without {needed}: {e}").into()),
            Ok(b) => match LockClient::new(b)
                .lock(format!("{ns}/acl"))
                .try_acquire()
                .await
            {
                Err(Error::Misconfigured { .. }) => {}
                other => {
                    return Err(format!("{url} without {needed}: a lock gave {other:?}").into())
                }
            },
        }
        for &port in &ports {
            set_user(port, Some(needed))?;
        }
        let client = LockClient::new(RedisBackend::connect(&url).await?);
        let lock = client
            .lock(format!("{ns}/acl"))
            .try_acquire()
            .await?
            .ok_or("the lock was not free")?;
        let permit = client
            .semaphore(format!("{ns}/acl-sem"), 2)
            .try_acquire()
            .await?
            .ok_or("no permit")?;
        let shared = client
            .lock(format!("{ns}/acl-rw"))
            .shared()
            .try_acquire()
            .await?
            .ok_or("no shared hold")?;
        let listed = client.list(&ns, 10).await?;
        if listed.len() != 3 {
            return Err(format!("{url}: list shows {listed:?}").into());
        }
        for g in [lock, permit, shared] {
            if !g.release().await? {
                return Err(format!("{url}: a release found nothing held").into());
            }
        }
    }
    // A wrong password is a configuration error on either topology (the
    // cluster client wraps it in an I/O error of its first connections).
    for url in [
        format!("redis+sentinel://app:wrong@127.0.0.1:{}/m", sentinel.port),
        format!("redis+cluster://app:wrong@{}", hosts.join(",")),
    ] {
        let r = match RedisBackend::connect(&url).await {
            Ok(b) => LockClient::new(b)
                .lock(format!("{ns}/acl"))
                .try_acquire()
                .await
                .map(|_| ()),
            Err(e) => Err(e),
        };
        match r {
            Err(Error::Misconfigured { .. }) => {}
            other => return Err(format!("{url} gave {other:?}").into()),
        }
    }
    drop((sentinel, master, nodes));
    Ok(())
}

/// A user allowed every command but `ZCOUNT`, which a reader's wait runs
/// once a `fifo` lock has a queue: the script's refusal ends the wait at
/// once with a configuration error naming the README, not a failure the
/// wait retries.
async fn script_command_refused() -> Result<(), Failed> {
    a_wait_refused("+zcount", "?fifo=true", true, "README").await
}

/// A user the ACL refuses `SUBSCRIBE`: a wait ends at once with the
/// refusal, rather than sleeping until each holder's lease ends however
/// early it released.
async fn subscribe_refused() -> Result<(), Failed> {
    a_wait_refused("+subscribe", "", false, "subscribe").await
}

/// A wait (shared with `shared`) by a user allowed every command but
/// `refused`, on a lock held by another: it ends within 10 s with
/// `Misconfigured` whose message (lower-cased) contains `says`.
async fn a_wait_refused(
    refused: &str,
    query: &str,
    shared: bool,
    says: &str,
) -> Result<(), Failed> {
    let commands: Vec<&str> = LEAST_PRIVILEGE
        .iter()
        .copied()
        .filter(|c| *c != refused)
        .collect();
    let rule = app_user(&commands, &["~*", "&*"]);
    let node = tokio::task::spawn_blocking(move || server::spawn(&rule))
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| e.to_string())?;
    let url = format!("redis://app:app-pw@127.0.0.1:{}{query}", node.port);
    let connect = || async { Ok::<_, Failed>(LockClient::new(RedisBackend::connect(&url).await?)) };
    let name = format!("acl/{}", refused.trim_start_matches('+'));
    let held = connect().await?.lock(&name).acquire().await?;
    let waiter = connect().await?;
    let mut lock = waiter.lock(&name);
    if shared {
        lock = lock.shared();
    }
    let waited = tokio::time::timeout(
        Duration::from_secs(10),
        lock.wait(Duration::from_secs(30)).acquire(),
    )
    .await;
    held.release().await?;
    match waited {
        Ok(Err(distlock_core::Error::Misconfigured { message, .. }))
            if message.to_lowercase().contains(&says.to_lowercase()) =>
        {
            Ok(())
        }
        Err(_) => {
            Err(format!("a wait refused {refused} by the ACL was still waiting 10 s later").into())
        }
        Ok(other) => Err(format!(
            "a wait refused {refused} by the ACL got {:?}",
            other.map(|g| g.token())
        )
        .into()),
    }
}

/// See [`integration_tests::stall::a_wait_ends_by_its_deadline`].
async fn stalled_wait(f: Arc<Redis>) -> Result<(), Failed> {
    integration_tests::stall::a_wait_ends_by_its_deadline(f.url()?, |url| async move {
        RedisBackend::connect(&url).await
    })
    .await
}
