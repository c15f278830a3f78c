//! The conformance suite on a single etcd member, plus etcd's own edges:
//! the herd test, interop with `etcdctl lock` and `etcdctl elect`, a
//! 3-member cluster losing its leader, and a server paused past the lease.

use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use distlock_core::{Error, HoldKind, LockClient, LockName};
use distlock_etcd::EtcdBackend;
use integration_tests::factory::{ServerFactory, Servers};
use integration_tests::harness::{etcd as server, ServerKind, TestServer};
use integration_tests::queue::{self, QueueLen};
use integration_tests::trial;
use libtest_mimic::Failed;
use tokio::time::Instant;

type Etcd = ServerFactory<EtcdBackend>;

fn main() {
    // etcd's smallest lease is about 1.5 s with default timing.
    let etcd = Arc::new(Etcd::of_kind("etcd", ServerKind::Etcd).short_ttl(Duration::from_secs(2)));
    // The suite again as a user whose role may touch only the suite's
    // names, over TLS, on a member with authentication enabled.
    let auth = Arc::new(
        Etcd::new("etcd::auth", || {
            let (member, ca) = server::spawn_tls().map_err(|e| e.to_string())?;
            let endpoint = format!("127.0.0.1:{}", member.port);
            enable_auth(&endpoint, &ca)?;
            Ok(Servers::processes(
                format!("etcds://app:app-pw@{endpoint}?ca_file={}", ca.display()),
                vec![member],
            ))
        })
        .short_ttl(Duration::from_secs(2)),
    );
    integration_tests::run_suite(etcd.clone(), move |rt| {
        let mut extra = integration_tests::trials(auth.clone(), rt);
        extra.push(trial(
            rt,
            "etcd::auth::a_wrong_password_or_a_role_without_the_prefix_is_a_typed_error",
            refused_credentials(auth.clone()),
        ));
        extra.push(trial(
            rt,
            "etcd::auth::a_server_certificate_from_another_ca_is_a_typed_error",
            refused_certificate(auth),
        ));
        extra.push(trial(
            rt,
            "etcd::auth::a_client_idle_past_its_tokens_ttl_logs_in_again",
            expired_token(),
        ));
        extra.push(trial(
            rt,
            "etcd::auth::a_client_whose_token_predates_a_change_of_users_logs_in_again",
            old_auth_revision(),
        ));
        extra.extend(vec![
            trial(
                rt,
                "etcd::each_release_wakes_exactly_one_of_20_waiters",
                herd(etcd.clone()),
            ),
            trial(
                rt,
                "etcd::a_wait_on_a_server_that_stops_answering_ends_by_its_deadline",
                stalled_wait(etcd.clone()),
            ),
            trial(
                rt,
                "etcd::a_user_for_a_cluster_without_authentication_is_misconfigured",
                user_without_auth(etcd.clone()),
            ),
            trial(
                rt,
                "etcd::keys_of_longer_names_hold_back_no_kind_and_no_eviction",
                nested_names(etcd.clone()),
            ),
            trial(
                rt,
                "etcd::etcdctl_lock_excludes_distlock",
                etcdctl_holds(etcd.clone()),
            ),
            trial(
                rt,
                "etcd::distlock_excludes_etcdctl_lock",
                distlock_holds(etcd.clone()),
            ),
            trial(
                rt,
                "etcd::etcdctl_lock_of_a_name_waits_for_a_distlock_holder_of_a_longer_one",
                distlock_holds_longer_name(etcd.clone()),
            ),
            trial(
                rt,
                "etcd::a_lock_held_ahead_of_the_campaigns_is_no_leader",
                lock_ahead_of_campaigns(etcd.clone()),
            ),
            trial(
                rt,
                "etcd::a_campaign_whose_value_looks_like_a_lock_leads",
                lock_shaped_campaign_values(etcd.clone()),
            ),
            trial(
                rt,
                "etcd::a_lock_beside_holder_info_left_by_a_deleted_campaign_is_no_leader",
                info_left_by_a_deleted_campaign(etcd.clone()),
            ),
            trial(
                rt,
                "etcd::etcdctl_lock_excludes_a_distlock_reader",
                etcdctl_holds_against_reader(etcd.clone()),
            ),
            trial(
                rt,
                "etcd::a_distlock_reader_excludes_etcdctl_lock_and_its_wait_holds_back_readers",
                reader_holds_against_etcdctl(etcd.clone()),
            ),
            trial(
                rt,
                "etcd::etcdctl_elect_observes_a_distlock_leader_and_waits_for_it",
                etcdctl_follows_distlock_leader(etcd.clone()),
            ),
            trial(
                rt,
                "etcd::distlock_observes_an_etcdctl_elect_leader_and_takes_over_after_it",
                distlock_follows_etcdctl_leader(etcd.clone()),
            ),
            trial(
                rt,
                "etcd::a_lock_or_campaign_retried_right_after_a_cancelled_one_waits_again",
                retried_after_cancel(etcd.clone()),
            ),
            trial(
                rt,
                "etcd::two_clients_over_one_backend_exclude_each_other",
                two_clients_one_backend(etcd.clone()),
            ),
            trial(
                rt,
                "etcd::semaphore_permits_go_in_arrival_order_waking_few",
                semaphore_order(etcd.clone()),
            ),
            trial(
                rt,
                "etcd::a_lock_and_a_campaign_of_one_name_on_one_lease_is_invalid_input",
                lock_and_campaign_one_name(etcd.clone()),
            ),
            trial(
                rt,
                "etcd::an_election_reads_only_its_own_keys_not_a_longer_names",
                election_ignores_longer_names(etcd.clone()),
            ),
            trial(
                rt,
                "etcd::leader_killed_during_hold_and_wait_keeps_exclusion",
                leader_killed(),
            ),
            trial(
                rt,
                "etcd::paused_server_makes_holder_lost_before_anyone_acquires",
                paused_server(),
            ),
            trial(
                rt,
                "etcd::a_wait_outlasts_its_own_lease_ending",
                waiter_lease_ends(),
            ),
            trial(
                rt,
                "etcd::a_member_restarted_without_its_data_ends_the_hold_and_grants_the_waiter",
                restarted_empty(),
            ),
            trial(
                rt,
                "etcd::a_wait_that_runs_out_while_the_member_is_down_ends_unavailable_at_its_deadline",
                wait_runs_out_while_down(),
            ),
            trial(
                rt,
                "etcd::permit_acquires_cancelled_on_a_slow_member_leave_no_key",
                cancelled_on_a_slow_member(),
            ),
            trial(
                rt,
                "etcd::woken_waiter_whose_key_vanished_does_not_claim_the_lock",
                vanished_waiter(etcd.clone()),
            ),
            trial(
                rt,
                "etcd::a_multi_lock_of_free_names_is_one_request",
                multi_lock_is_one_request(),
            ),
            trial(
                rt,
                "etcd::a_multi_lock_of_more_names_than_one_transaction_takes_is_granted",
                multi_lock_of_many_names(),
            ),
            trial(
                rt,
                "etcd::uncontended_exclusive_and_shared_holds_take_two_requests_each",
                uncontended_holds_take_two_requests(),
            ),
            trial(
                rt,
                "etcd::grants_after_waiting_get_tokens_above_the_holds_they_waited_for",
                waited_grants_tokens_rise(etcd.clone()),
            ),
            trial(
                rt,
                "etcd::a_hold_and_a_wait_outlive_their_stalled_connections",
                stalled_connections(etcd.clone()),
            ),
            trial(
                rt,
                "etcd::a_release_that_fails_goes_on_in_the_background_until_the_key_is_gone",
                failed_release(etcd.clone()),
            ),
        ]);
        extra
    })
}

fn name() -> String {
    format!("{}/lock", integration_tests::namespace())
}

/// What `etcdctl ARGS` prints.
async fn etcdctl_out(url: &str, args: &[&str]) -> Result<String, Failed> {
    let ep = integration_tests::harness::host_port(url).ok_or("no endpoint")?;
    let mut c = etcd_client_cmd(&format!("{}:{}", ep.0, ep.1))?;
    c.args(args);
    Ok(
        tokio::task::spawn_blocking(move || integration_tests::harness::process::run_client(c))
            .await
            .map_err(|e| e.to_string())??,
    )
}

async fn keys_under(url: &str, prefix: &str) -> Result<usize, Failed> {
    let ep = integration_tests::harness::host_port(url).ok_or("no endpoint")?;
    let mut c = etcd_client_cmd(&format!("{}:{}", ep.0, ep.1))?;
    c.args(["get", "--prefix", "--keys-only", &format!("{prefix}/")]);
    let out =
        tokio::task::spawn_blocking(move || integration_tests::harness::process::run_client(c))
            .await
            .map_err(|e| e.to_string())??;
    Ok(out.lines().filter(|l| !l.trim().is_empty()).count())
}

fn etcd_client_cmd(endpoint: &str) -> Result<Command, Failed> {
    server::etcdctl(endpoint).map_err(|e| Failed::from(e.to_string()))
}

/// 20 waiters of a semaphore of one permit get it in arrival order, waking
/// few (see [`queue::semaphore_grants_in_arrival_order`]).
async fn semaphore_order(f: Arc<Etcd>) -> Result<(), Failed> {
    let url = f.url()?;
    let sem = format!("{}/sem-order", integration_tests::namespace());
    let (u, prefix) = (url.clone(), format!("/distlock/semaphores/{sem}/@permits"));
    let queued: QueueLen<'_> = Box::new(move || {
        let (u, p) = (u.clone(), prefix.clone());
        Box::pin(async move { keys_under(&u, &p).await })
    });
    let woken =
        queue::semaphore_grants_in_arrival_order::<EtcdBackend>(&url, 20, &sem, queued).await?;
    eprintln!("etcd: 20 releases of a semaphore, {woken} wake-ups");
    Ok(())
}

/// 20 waiters queue behind a holder; every release must wake exactly one.
async fn herd(f: Arc<Etcd>) -> Result<(), Failed> {
    let url = f.url()?;
    let lock = name();
    let (u, l) = (url.clone(), lock.clone());
    let queued: QueueLen<'_> = Box::new(move || {
        let (u, l) = (u.clone(), l.clone());
        Box::pin(async move { keys_under(&u, &l).await })
    });
    queue::herd::<EtcdBackend>(&url, 20, &lock, queued).await
}

fn spawn_etcdctl_lock(url: &str, lock: &str, command: &[&str]) -> Result<Child, Failed> {
    let ep = integration_tests::harness::host_port(url).ok_or("no endpoint")?;
    let mut c = etcd_client_cmd(&format!("{}:{}", ep.0, ep.1))?;
    c.args(["lock", lock, "--"])
        .args(command)
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    c.spawn().map_err(|e| Failed::from(e.to_string()))
}

async fn wait_exit(mut child: Child, within: Duration) -> Result<String, Failed> {
    tokio::task::spawn_blocking(move || {
        let start = std::time::Instant::now();
        loop {
            if let Some(status) = child.try_wait().map_err(|e| e.to_string())? {
                let mut out = String::new();
                if let Some(mut o) = child.stdout.take() {
                    std::io::Read::read_to_string(&mut o, &mut out).map_err(|e| e.to_string())?;
                }
                return if status.success() {
                    Ok(out)
                } else {
                    Err(format!("etcdctl exited with {status}").into())
                };
            }
            if start.elapsed() > within {
                let _ = child.kill();
                return Err(format!("etcdctl still running after {within:?}").into());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    })
    .await
    .map_err(|e| e.to_string())?
}

async fn etcdctl_holds(f: Arc<Etcd>) -> Result<(), Failed> {
    etcdctl_holds_against(f, false).await
}

/// `etcdctl lock` (Go's Mutex) holds: a distlock reader is refused, and
/// waits until etcdctl's command ends.
async fn etcdctl_holds_against_reader(f: Arc<Etcd>) -> Result<(), Failed> {
    etcdctl_holds_against(f, true).await
}

async fn etcdctl_holds_against(f: Arc<Etcd>, shared: bool) -> Result<(), Failed> {
    let url = f.url()?;
    let lock = name();
    // Long enough for the checks below on a loaded machine.
    let child = spawn_etcdctl_lock(&url, &lock, &["sleep", "6"])?;
    let start = Instant::now();
    while keys_under(&url, &lock).await? < 1 {
        if start.elapsed() > Duration::from_secs(10) {
            return Err("etcdctl lock never created its key".into());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let client = LockClient::new(EtcdBackend::connect(&url).await?);
    let hold = || {
        let b = client.lock(&lock).ttl(Duration::from_secs(10));
        if shared {
            b.shared()
        } else {
            b
        }
    };
    if hold().try_acquire().await?.is_some() {
        return Err("distlock got a lock etcdctl holds".into());
    }
    // Go's Mutex key is listed as the lock's holder, without holder info.
    let listed = client.list(&lock, 10).await?;
    match listed.as_slice() {
        [r] if r.kind == HoldKind::Exclusive && r.holder_info.is_none() && r.token.is_some() => {}
        other => return Err(format!("list shows {other:?} for etcdctl's lock").into()),
    }
    let g = hold().wait(Duration::from_secs(20)).acquire().await?;
    wait_exit(child, Duration::from_secs(5)).await?;
    g.release().await?;
    Ok(())
}

async fn distlock_holds(f: Arc<Etcd>) -> Result<(), Failed> {
    let lock = name();
    etcdctl_waits_for(f, &lock, &lock).await
}

/// distlock holds `<lock>/nightly`: `etcdctl lock <lock>` waits for it,
/// as Go's `Mutex` counts every key under `<lock>/` as queued ahead
/// (distlock keeps the two names apart; etcdctl does not).
async fn distlock_holds_longer_name(f: Arc<Etcd>) -> Result<(), Failed> {
    let lock = name();
    etcdctl_waits_for(f, &format!("{lock}/nightly"), &lock).await
}

/// distlock holds `held`: `etcdctl lock <asked>` does not run its command
/// until distlock releases, then does.
async fn etcdctl_waits_for(f: Arc<Etcd>, held: &str, asked: &str) -> Result<(), Failed> {
    let url = f.url()?;
    let client = LockClient::new(EtcdBackend::connect(&url).await?);
    let g = client
        .lock(held)
        .ttl(Duration::from_secs(10))
        .acquire()
        .await?;
    let mut child = spawn_etcdctl_lock(&url, asked, &["echo", "etcdctl-got-it"])?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    if child.try_wait().map_err(|e| e.to_string())?.is_some() {
        return Err(
            format!("etcdctl lock {asked} ran its command while distlock held {held}").into(),
        );
    }
    g.release().await?;
    let out = wait_exit(child, Duration::from_secs(10)).await?;
    if !out.contains("etcdctl-got-it") {
        return Err(format!("etcdctl did not run its command after the release: {out:?}").into());
    }
    Ok(())
}

/// A lock and an election of one name share their keys (Go's layout):
/// a lock's key held ahead of the campaigns, distlock's (exclusive or
/// shared) or `etcdctl lock`'s, keeps them waiting, and `leader()` and `observe()` report
/// nobody leading, not the lock's holder; once it is released the waiting
/// campaign leads.
async fn lock_ahead_of_campaigns(f: Arc<Etcd>) -> Result<(), Failed> {
    let url = f.url()?;
    let lock = name();
    let holder = LockClient::new(EtcdBackend::connect(&url).await?);
    let campaigner = LockClient::new(EtcdBackend::connect(&url).await?);
    let e = campaigner.election(&lock);
    let nobody_leads = |what: &str| {
        let (e, what, c, lock) = (e.clone(), what.to_string(), &campaigner, &lock);
        async move {
            // A campaign waiting behind the hold is listed as no leader.
            let listed = c.list(lock, 10).await?;
            if let Some(r) = listed.iter().find(|r| r.kind == HoldKind::Leader) {
                return Err(Failed::from(format!(
                    "list() shows {r:?} as leader while {what} holds"
                )));
            }
            if let Some(l) = e.leader().await? {
                return Err(Failed::from(format!(
                    "leader() reports {l:?} while {what} holds"
                )));
            }
            let mut seen = e.observe().await?;
            let first = futures_util::StreamExt::next(&mut seen)
                .await
                .ok_or("observe ended")??;
            if first.is_some() {
                return Err(format!("observe() began with {first:?} while {what} holds").into());
            }
            Ok::<(), Failed>(())
        }
    };
    let g = holder
        .lock(&lock)
        .ttl(Duration::from_secs(10))
        .acquire()
        .await?;
    let waiting = {
        let e = e.clone();
        tokio::spawn(async move { e.wait(Duration::from_secs(30)).campaign("next").await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    nobody_leads("a distlock lock").await?;
    g.release().await?;
    let leading = waiting.await.map_err(|e| e.to_string())??;
    match e.leader().await? {
        Some(l) if l.value == "next" => {}
        other => return Err(format!("after the lock's release leader() reports {other:?}").into()),
    }
    leading.resign().await?;
    // A shared hold's key (`<name>/@r/<owner>`) keeps a campaign waiting
    // as an exclusive one does.
    let g = holder
        .lock(&lock)
        .shared()
        .ttl(Duration::from_secs(10))
        .acquire()
        .await?;
    let waiting = {
        let e = e.clone();
        tokio::spawn(async move { e.wait(Duration::from_secs(30)).campaign("after").await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    nobody_leads("a distlock shared hold").await?;
    if waiting.is_finished() {
        return Err("a campaign behind a shared hold of its name was granted".into());
    }
    g.release().await?;
    let leading = waiting.await.map_err(|e| e.to_string())??;
    match e.leader().await? {
        Some(l) if l.value == "after" => {}
        other => {
            return Err(
                format!("after the shared hold's release leader() reports {other:?}").into(),
            )
        }
    }
    leading.resign().await?;
    // Go's `Mutex` writes an empty value.
    let mut child = spawn_etcdctl_lock(&url, &lock, &["sleep", "3"])?;
    let start = Instant::now();
    while keys_under(&url, &lock).await? < 1 {
        if start.elapsed() > Duration::from_secs(10) {
            return Err("etcdctl lock never created its key".into());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let checked = nobody_leads("etcdctl lock").await;
    let _ = child.kill();
    let _ = child.wait();
    checked
}

/// A campaign's value may be anything, also shaped like the owner a lock's
/// key carries: `leader()` and `observe()` (which sees the
/// campaign arrive in its watch) report it as the leader all the same.
async fn lock_shaped_campaign_values(f: Arc<Etcd>) -> Result<(), Failed> {
    let url = f.url()?;
    let client = LockClient::new(EtcdBackend::connect(&url).await?);
    for value in [
        "0b6f5c3e-9d2a-4c1b-8e7f-1a2b3c4d5e6f",
        "0b6f5c3e-9d2a-4c1b-8e7f-1a2b3c4d5e6f web-1",
    ] {
        let e = client.election(name());
        let mut seen = e.observe().await?;
        let first = futures_util::StreamExt::next(&mut seen)
            .await
            .ok_or("observe ended")??;
        if first.is_some() {
            return Err(format!("observe() began with {first:?} before any campaign").into());
        }
        let leading = e.campaign(value).await?;
        match e.leader().await? {
            Some(l) if l.value == value => {}
            other => {
                return Err(format!("leading with {value:?}, leader() reports {other:?}").into())
            }
        }
        let next = tokio::time::timeout(
            Duration::from_secs(10),
            futures_util::StreamExt::next(&mut seen),
        )
        .await
        .map_err(|_| format!("observe() saw no leader with {value:?} in 10 s"))?
        .ok_or("observe ended")??;
        match next {
            Some(l) if l.value == value => {}
            other => {
                return Err(format!("leading with {value:?}, observe() reports {other:?}").into())
            }
        }
        leading.resign().await?;
    }
    Ok(())
}

/// A campaign key deleted by hand (`etcdctl del`) leaves its holder info
/// key on the lease; a lock of the same name by the same client then
/// writes the same `<name>/<lease>` key. That key is a lock's: `leader()`
/// and `observe()` report nobody, and `list` a lock.
async fn info_left_by_a_deleted_campaign(f: Arc<Etcd>) -> Result<(), Failed> {
    let url = f.url()?;
    let lock = name();
    let client = LockClient::new(EtcdBackend::connect(&url).await?);
    let ttl = Duration::from_secs(10);
    let e = client.election(&lock);
    let leading = e.clone().ttl(ttl).campaign("v").await?;
    let under = format!("{lock}/");
    let keys = etcdctl_out(&url, &["get", "--prefix", "--keys-only", &under]).await?;
    let key = keys
        .lines()
        .map(str::trim)
        .find(|k| !k.is_empty())
        .ok_or("no campaign key")?
        .to_string();
    etcdctl_out(&url, &["del", &key]).await?;
    let _ = leading.resign().await;
    let info_key = format!("/distlock/leaders/{key}");
    if etcdctl_out(&url, &["get", "--keys-only", &info_key])
        .await?
        .trim()
        != info_key
    {
        return Err(format!("no holder info key {info_key} left: the case proves nothing").into());
    }
    let g = client.lock(&lock).ttl(ttl).acquire().await?;
    let keys = etcdctl_out(&url, &["get", "--prefix", "--keys-only", &under]).await?;
    if !keys.lines().any(|k| k.trim() == key) {
        return Err(
            format!("the lock's key is not {key} ({keys:?}): the case proves nothing").into(),
        );
    }
    if let Some(l) = e.leader().await? {
        return Err(format!("leader() reports {l:?} while a lock holds").into());
    }
    let mut seen = e.observe().await?;
    let first = futures_util::StreamExt::next(&mut seen)
        .await
        .ok_or("observe ended")??;
    if first.is_some() {
        return Err(format!("observe() began with {first:?} while a lock holds").into());
    }
    let listed = client.list(&lock, 10).await?;
    if listed.len() != 1 || listed[0].kind != distlock_core::HoldKind::Exclusive {
        return Err(format!("list({lock}) shows {listed:?}, not one lock").into());
    }
    g.release().await?;
    Ok(())
}

/// A distlock reader holds: `etcdctl lock` waits for it, and its queued
/// key is a waiting writer, so a second distlock reader is refused until
/// etcdctl has had its turn.
async fn reader_holds_against_etcdctl(f: Arc<Etcd>) -> Result<(), Failed> {
    let url = f.url()?;
    let lock = name();
    let reader = LockClient::new(EtcdBackend::connect(&url).await?);
    let later = LockClient::new(EtcdBackend::connect(&url).await?);
    let g = reader
        .lock(&lock)
        .shared()
        .ttl(Duration::from_secs(10))
        .acquire()
        .await?;
    let mut child = spawn_etcdctl_lock(&url, &lock, &["sh", "-c", "echo etcdctl-got-it; sleep 1"])?;
    queued(&url, &lock, "etcdctl lock").await?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    if child.try_wait().map_err(|e| e.to_string())?.is_some() {
        return Err("etcdctl lock ran its command while a distlock reader held the lock".into());
    }
    if later
        .lock(&lock)
        .shared()
        .ttl(Duration::from_secs(10))
        .try_acquire()
        .await?
        .is_some()
    {
        return Err("a new reader was let in ahead of etcdctl lock's waiting key".into());
    }
    g.release().await?;
    let out = wait_exit(child, Duration::from_secs(10)).await?;
    if !out.contains("etcdctl-got-it") {
        return Err(format!("etcdctl did not run its command after the release: {out:?}").into());
    }
    later
        .lock(&lock)
        .shared()
        .ttl(Duration::from_secs(10))
        .try_acquire()
        .await?
        .ok_or("a reader was refused after etcdctl lock released")?
        .release()
        .await?;
    Ok(())
}

/// A holder holds and a waiter waits on a 3-member cluster; the leader is
/// killed (see `integration_tests::queue::leader_loss_keeps_exclusion`).
async fn leader_killed() -> Result<(), Failed> {
    queue::leader_killed::<EtcdBackend>(
        || server::cluster(3),
        |hosts| format!("etcd://{hosts}"),
        &name(),
        Duration::from_secs(5),
        server::leader,
    )
    .await
}

/// Lock `<ns>/t` and lock `<ns>/t/q` share the key prefix `<ns>/t/` in Go's
/// layout, yet are independent as on every backend: holds and campaigns of
/// longer names keep no request of `t` out (a try, a shared hold, a try of
/// several names, a campaign), and the status, the listing and an eviction
/// of `t` see only `t`'s keys.
async fn nested_names(f: Arc<Etcd>) -> Result<(), Failed> {
    let ns = integration_tests::namespace();
    let (t, below) = (format!("{ns}/t"), format!("{ns}/t/q"));
    let (a, b) = (
        LockClient::new(f.backend().await?),
        LockClient::new(f.backend().await?),
    );
    let ttl = Duration::from_secs(10);
    let held_below = a
        .lock(&below)
        .ttl(ttl)
        .try_acquire()
        .await?
        .ok_or("a free lock was refused")?;
    // A lock and an election of one name share their keys (Go's layout):
    // the election is another name below `t`.
    let d = LockClient::new(f.backend().await?);
    let leading_below = d
        .election(format!("{t}/e"))
        .ttl(ttl)
        .try_campaign("below")
        .await?
        .ok_or("a free election was refused")?;
    if b.backend().inspect(&LockName::new(&t)?).await?.held {
        return Err(format!("{t} is reported held while only {below} is").into());
    }
    b.lock(&t)
        .ttl(ttl)
        .try_acquire()
        .await?
        .ok_or_else(|| format!("{t} was refused while only {below} was held"))?
        .release()
        .await?;
    b.lock(&t)
        .shared()
        .ttl(ttl)
        .try_acquire()
        .await?
        .ok_or_else(|| format!("a shared hold of {t} was refused while only {below} was held"))?
        .release()
        .await?;
    b.lock_all([t.clone(), format!("{ns}/other")])
        .ttl(ttl)
        .try_acquire()
        .await?
        .ok_or_else(|| format!("{t} and another name were refused while only {below} was held"))?
        .release()
        .await?;
    b.election(&t)
        .ttl(ttl)
        .try_campaign("t")
        .await?
        .ok_or_else(|| format!("a campaign for {t} was refused while {below} had a leader"))?
        .resign()
        .await?;
    // `list` and an eviction of `t` see only `t`'s keys (the wait behind a
    // longer name's key is the conformance case's).
    let holder = b
        .lock(&t)
        .ttl(ttl)
        .try_acquire()
        .await?
        .ok_or("a free lock was refused")?;
    let listed = b.list(&t, 100).await?;
    let of_t: Vec<_> = listed.iter().filter(|r| r.name.as_str() == t).collect();
    if of_t.len() != 1 || of_t[0].kind != HoldKind::Exclusive {
        return Err(format!("list of {t} shows {listed:#?}").into());
    }
    if !f.backend().await?.evict(&LockName::new(&t)?).await? {
        return Err(format!("the eviction of {t} found no key").into());
    }
    tokio::time::timeout(Duration::from_secs(10), holder.lost())
        .await
        .map_err(|_| format!("the evicted holder of {t} was not lost"))?;
    if !held_below.is_held() {
        return Err(format!("the hold of {below} was lost at the eviction of {t}").into());
    }
    if !held_below.release().await? {
        return Err(format!("{below} was gone at its release").into());
    }
    if !leading_below.resign().await? {
        return Err(format!("the leadership below {t} was gone at its resignation").into());
    }
    Ok(())
}

/// A URL that names a user for a member with authentication off is a
/// refused configuration (exit 78), not an error to retry.
async fn user_without_auth(f: Arc<Etcd>) -> Result<(), Failed> {
    let url = f.url()?;
    let endpoint = url.split_once("://").ok_or("no scheme in the URL")?.1;
    let with_user = format!("etcd://app:app-pw@{endpoint}");
    let tried = match EtcdBackend::connect(&with_user).await {
        Ok(b) => LockClient::new(b)
            .lock("conformance-x/job")
            .try_acquire()
            .await
            .map(|_| ()),
        Err(e) => Err(e),
    };
    match tried {
        Err(Error::Misconfigured { message, .. }) if !message.contains("app-pw") => Ok(()),
        other => Err(format!("a user for a cluster without authentication gave {other:?}").into()),
    }
}

/// See [`integration_tests::stall::a_wait_ends_by_its_deadline`].
async fn stalled_wait(f: Arc<Etcd>) -> Result<(), Failed> {
    integration_tests::stall::a_wait_ends_by_its_deadline(f.url()?, |url| async move {
        EtcdBackend::connect(&url).await
    })
    .await
}

/// On a 3-member cluster whose third member is reached over a slow link,
/// permit acquires cancelled while their first transaction is on its way
/// leave no key behind: the cleanup's delete, which may go to a fast member,
/// waits for that transaction instead of landing before it.
async fn cancelled_on_a_slow_member() -> Result<(), Failed> {
    use integration_tests::harness::proxy::Proxy;
    let members = tokio::task::spawn_blocking(|| server::cluster(3))
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| e.to_string())?;
    let slow = Proxy::start(members[2].port).map_err(|e| e.to_string())?;
    slow.set_request_delay(Duration::from_millis(300));
    let url = format!(
        "etcd://127.0.0.1:{},127.0.0.1:{},127.0.0.1:{}",
        members[0].port, members[1].port, slow.port
    );
    let direct = format!("etcd://127.0.0.1:{}", members[0].port);
    let client = LockClient::new(EtcdBackend::connect(&url).await?);
    let checker = LockClient::new(EtcdBackend::connect(&direct).await?);
    let ns = integration_tests::namespace();
    let names: Vec<String> = (0..40).map(|i| format!("{ns}/slow-{i}")).collect();
    let mut cancelled = 0;
    for sem in &names {
        let acquire = client
            .semaphore(sem, 2)
            .ttl(Duration::from_secs(20))
            .acquire();
        match tokio::time::timeout(Duration::from_millis(40), acquire).await {
            Ok(granted) => {
                granted?.release().await?;
            }
            Err(_) => cancelled += 1,
        }
    }
    if cancelled == 0 {
        return Err("no acquire went through the slow member; the case shows nothing".into());
    }
    // The delayed requests land within a couple of seconds, and core
    // deletes what a cancelled acquire created: each semaphore must have
    // both permits free again well before a leaked key's 20 s TTL.
    let settled = tokio::time::Instant::now() + Duration::from_secs(10);
    let mut leaked = Vec::new();
    for sem in &names {
        loop {
            let mut taken = Vec::new();
            while taken.len() < 2 {
                match checker
                    .semaphore(sem, 2)
                    .ttl(Duration::from_secs(20))
                    .try_acquire()
                    .await?
                {
                    Some(g) => taken.push(g),
                    None => break,
                }
            }
            let free = taken.len() == 2;
            for g in taken {
                g.release().await?;
            }
            if free {
                break;
            }
            if tokio::time::Instant::now() > settled {
                leaked.push(sem.clone());
                break;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    if !leaked.is_empty() {
        return Err(format!(
            "{} of {cancelled} cancelled acquires left a permit key taking a place: {leaked:?}",
            leaked.len()
        )
        .into());
    }
    drop(members);
    Ok(())
}

/// An etcd member of its own, for a test that pauses it or counts its
/// requests.
async fn private_member() -> Result<TestServer, Failed> {
    tokio::task::spawn_blocking(|| TestServer::start_private(ServerKind::Etcd))
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| Failed::from(e.to_string()))
}

/// A private member, a lock of the test's held on it for `ttl` by one
/// client, and another client of the member.
struct Held {
    server: TestServer,
    url: String,
    lock: String,
    holder: LockClient,
    guard: distlock_core::LockGuard,
    other: LockClient,
}

async fn held_on_a_private_member(ttl: Duration) -> Result<Held, Failed> {
    let server = private_member().await?;
    let url = server.url().to_string();
    let lock = name();
    let holder = LockClient::new(EtcdBackend::connect(&url).await?);
    let other = LockClient::new(EtcdBackend::connect(&url).await?);
    let guard = holder.lock(&lock).ttl(ttl).acquire().await?;
    Ok(Held {
        server,
        url,
        lock,
        holder,
        guard,
        other,
    })
}

/// The server is paused longer than the lease: the holder must see lost()
/// before any other client can acquire.
async fn paused_server() -> Result<(), Failed> {
    let ttl = Duration::from_secs(2);
    let Held {
        server,
        lock,
        guard: g,
        holder: _holder,
        other,
        ..
    } = held_on_a_private_member(ttl).await?;
    let process = server.process().ok_or("no process")?;
    process.signal("STOP").map_err(|e| e.to_string())?;
    let lost = tokio::time::timeout(ttl * 3, g.lost()).await;
    let lost_at = Instant::now();
    process.signal("CONT").map_err(|e| e.to_string())?;
    let reason =
        lost.map_err(|_| Failed::from("holder did not see lost() while the server was paused"))?;
    let g2 = other
        .lock(&lock)
        .ttl(ttl)
        .wait(Duration::from_secs(30))
        .acquire()
        .await?;
    let acquired_at = Instant::now();
    if acquired_at <= lost_at {
        return Err(
            format!("another client acquired before the holder saw lost() ({reason})").into(),
        );
    }
    if g2.token() <= g.token() {
        return Err("token did not increase".into());
    }
    g2.release().await?;
    Ok(())
}

/// A waiter whose member goes down while it waits ends at its deadline
/// with the failure (unreachable: exit 69 in the CLI), as on the other
/// backends, not with a timeout a second late; one whose member came back
/// meanwhile ends with a timeout.
async fn wait_runs_out_while_down() -> Result<(), Failed> {
    let ttl = Duration::from_secs(20);
    let Held {
        mut server,
        url,
        lock,
        guard: _g,
        holder: _holder,
        other,
        ..
    } = held_on_a_private_member(ttl).await?;
    // A member that comes back (with its data) while the wait goes on: the
    // wait, running out behind the live holder, is a plain timeout.
    let waiting = queued_waiter(other.clone(), &url, &lock, ttl, Duration::from_secs(8)).await?;
    let process = server.process_mut().ok_or("no process")?;
    tokio::task::block_in_place(|| process.restart()).map_err(|e| e.to_string())?;
    let r = waiting.await.map_err(|e| e.to_string())?;
    if !matches!(r, Err(Error::WaitTimeout { .. })) {
        return Err(format!("a wait that outlasted a blip ended with {r:?}").into());
    }
    let wait = Duration::from_secs(5);
    let start = Instant::now();
    let waiting = queued_waiter(other, &url, &lock, ttl, wait).await?;
    let process = server.process_mut().ok_or("no process")?;
    tokio::task::block_in_place(|| process.stop());
    let r = waiting.await.map_err(|e| e.to_string())?;
    let took = start.elapsed();
    if !matches!(r, Err(Error::Unavailable { .. })) {
        return Err(format!("the wait ended with {r:?}, not the member's failure").into());
    }
    if took > wait + Duration::from_secs(2) {
        return Err(format!("a {wait:?} wait ended after {took:?}").into());
    }
    Ok(())
}

/// A member restarted without its data (its leases gone with it): the
/// holder's hold is lost at once, not at its deadline; a waiter of another
/// client goes on with a lease of its own and takes the lock within its
/// wait; and a try (a lock's, a permit's, a multi-lock's) of a client
/// whose lease etcd no longer knows, before its next keep-alive, is granted
/// under a new lease.
async fn restarted_empty() -> Result<(), Failed> {
    let ttl = Duration::from_secs(20);
    let Held {
        mut server,
        url,
        lock,
        holder,
        guard: g,
        other,
    } = held_on_a_private_member(ttl).await?;
    let waiting = queued_waiter(other, &url, &lock, ttl, Duration::from_secs(30)).await?;
    // A client whose session's lease is not kept alive again before it
    // asks next (a session's keep-alive comes every third of its TTL).
    let quiet = Duration::from_secs(60);
    let third = LockClient::new(EtcdBackend::connect(&url).await?);
    let free = format!("{lock}-free");
    let t = third.lock(&free).ttl(quiet).try_acquire().await?;
    t.ok_or("a free lock was refused")?.release().await?;
    // The same for a semaphore's permit, in a client of its own (a request
    // that meets a dead lease marks every session of its client).
    let fourth = LockClient::new(EtcdBackend::connect(&url).await?);
    let permits = format!("{lock}-permits");
    let try_permit = || fourth.semaphore(&permits, 2).ttl(quiet).try_acquire();
    try_permit()
        .await?
        .ok_or("a free permit was refused")?
        .release()
        .await?;
    // And a multi-lock's.
    let fifth = LockClient::new(EtcdBackend::connect(&url).await?);
    let names = [format!("{lock}-a"), format!("{lock}-b")];
    let try_all = || fifth.lock_all(&names).ttl(quiet).try_acquire();
    try_all()
        .await?
        .ok_or("free locks were refused")?
        .release()
        .await?;
    let process = server.process_mut().ok_or("no process")?;
    tokio::task::block_in_place(|| {
        process.stop();
        std::fs::remove_dir_all(process.dir.join("data"))?;
        process.restart().map_err(|e| Failed::from(e.to_string()))
    })?;
    let restarted = Instant::now();
    let t = third
        .lock(&free)
        .ttl(quiet)
        .try_acquire()
        .await
        .map_err(|e| format!("a try right after the restart failed: {e}"))?;
    t.ok_or("a free lock was refused right after the restart")?
        .release()
        .await?;
    try_permit()
        .await
        .map_err(|e| format!("a permit's try right after the restart failed: {e}"))?
        .ok_or("a free permit was refused right after the restart")?
        .release()
        .await?;
    try_all()
        .await
        .map_err(|e| format!("a multi-lock's try right after the restart failed: {e}"))?
        .ok_or("free locks were refused right after the restart")?
        .release()
        .await?;
    let reason = tokio::time::timeout(Duration::from_secs(10), g.lost())
        .await
        .map_err(|_| "the holder did not see lost() after the restart")?;
    if restarted.elapsed() > Duration::from_secs(8) {
        return Err(format!(
            "lost() came {:?} after the restart ({reason})",
            restarted.elapsed()
        )
        .into());
    }
    let g2 = tokio::time::timeout(Duration::from_secs(35), waiting)
        .await
        .map_err(|_| "the waiter did not finish")?
        .map_err(|e| e.to_string())?
        .map_err(|e| format!("the waiter gave up after the restart: {e}"))?;
    g2.release().await?;
    let again = holder.lock(&lock).ttl(ttl).try_acquire().await?;
    again
        .ok_or("a try of the holder's client was refused on a free lock")?
        .release()
        .await?;
    Ok(())
}

/// A waiter whose own lease ends while it waits (the server paused past
/// its TTL) goes on waiting with a lease and a key of its own, and takes
/// the lock once the holder, whose lease ended too, is gone; the holder
/// sees `lost()` first.
async fn waiter_lease_ends() -> Result<(), Failed> {
    let ttl = Duration::from_secs(2);
    let Held {
        server,
        url,
        lock,
        guard: g,
        holder: _holder,
        other,
        ..
    } = held_on_a_private_member(ttl).await?;
    let waiting = queued_waiter(other, &url, &lock, ttl, Duration::from_secs(40)).await?;
    let process = server.process().ok_or("no process")?;
    process.signal("STOP").map_err(|e| e.to_string())?;
    tokio::time::sleep(ttl * 3).await;
    process.signal("CONT").map_err(|e| e.to_string())?;
    let waited = tokio::time::timeout(Duration::from_secs(45), waiting)
        .await
        .map_err(|_| "the wait had not ended 45 s later")?
        .map_err(|e| e.to_string())?;
    let g2 = waited.map_err(|e| format!("the wait ended with its lease: {e}"))?;
    if g.is_held() {
        return Err("both held: the holder did not see its lease end".into());
    }
    if g2.token() <= g.token() {
        return Err("token did not increase".into());
    }
    g2.release().await?;
    Ok(())
}

/// etcd#11456 / Jepsen etcd 3.4.3: a waiter whose own key disappeared while
/// it waited (its lease revoked, an operator's delete) must not claim the
/// lock when its predecessor goes: the read after waking checks both in
/// one txn. The wait goes on with a key of its own, which it holds the
/// lock by.
async fn vanished_waiter(f: Arc<Etcd>) -> Result<(), Failed> {
    let url = f.url()?;
    let lock = name();
    let a = LockClient::new(EtcdBackend::connect(&url).await?);
    let b = LockClient::new(EtcdBackend::connect(&url).await?);
    let held = a.lock(&lock).ttl(Duration::from_secs(10)).acquire().await?;
    let ttl = Duration::from_secs(10);
    let waiter = queued_waiter(b, &url, &lock, ttl, Duration::from_secs(20)).await?;
    // Delete the waiter's key (the newer of the two) behind its back.
    let ep = integration_tests::harness::host_port(&url).ok_or("no endpoint")?;
    let endpoint = format!("{}:{}", ep.0, ep.1);
    let mut get = etcd_client_cmd(&endpoint)?;
    get.args([
        "get",
        "--prefix",
        "--keys-only",
        "--sort-by=CREATE",
        "--order=ASCEND",
    ])
    .arg(format!("{lock}/"));
    let keys =
        tokio::task::spawn_blocking(move || integration_tests::harness::process::run_client(get))
            .await
            .map_err(|e| e.to_string())??;
    let waiter_key = keys
        .lines()
        .filter(|l| !l.trim().is_empty())
        .nth(1)
        .ok_or("no second key")?
        .to_string();
    let deleted = create_revision(&endpoint, &waiter_key)
        .await?
        .ok_or("the waiter's key vanished before it was deleted")?;
    let mut del = etcd_client_cmd(&endpoint)?;
    del.args(["del", &waiter_key]);
    tokio::task::spawn_blocking(move || integration_tests::harness::process::run_client(del))
        .await
        .map_err(|e| e.to_string())??;
    held.release().await?;
    match tokio::time::timeout(Duration::from_secs(15), waiter).await {
        Ok(Ok(Ok(g))) => {
            let n = keys_under(&url, &lock).await?;
            if n != 1 {
                return Err(format!("the waiter holds the lock with {n} keys under it").into());
            }
            // A key of the same name (the same lease), written anew: the
            // grant's token is its revision, above the deleted key's.
            let now = create_revision(&endpoint, &waiter_key)
                .await?
                .ok_or("the waiter holds the lock without a key")?;
            let token = g.token().0 as i64;
            if now <= deleted || token < now {
                return Err(format!(
                    "the waiter holds the lock by token {token}, its key created at {now}, the deleted one at {deleted}"
                )
                .into());
            }
            g.release().await?;
        }
        other => {
            return Err(format!("expected the wait to go on to a grant, got {other:?}").into())
        }
    }
    // And the lock is free for the next client.
    let c = LockClient::new(EtcdBackend::connect(&url).await?);
    c.lock(&lock)
        .try_acquire()
        .await?
        .ok_or("the lock was left held")?
        .release()
        .await?;
    Ok(())
}

/// Waits until a second key is queued under `lock` (a waiter behind its
/// holder), for at most 10 s.
async fn queued(url: &str, lock: &str, who: &str) -> Result<(), Failed> {
    let start = Instant::now();
    while keys_under(url, lock).await? < 2 {
        if start.elapsed() > Duration::from_secs(10) {
            return Err(format!("{who} did not queue within 10 s").into());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(())
}

/// `client` waiting for `lock` (held by another) in a task, once its key is
/// queued.
async fn queued_waiter(
    client: LockClient,
    url: &str,
    lock: &str,
    ttl: Duration,
    wait: Duration,
) -> Result<tokio::task::JoinHandle<distlock_core::Result<distlock_core::LockGuard>>, Failed> {
    let l2 = lock.to_string();
    let waiting = tokio::spawn(async move { client.lock(&l2).ttl(ttl).wait(wait).acquire().await });
    queued(url, lock, "the waiter").await?;
    Ok(waiting)
}

/// `key`'s create revision, `None` if it does not exist.
async fn create_revision(endpoint: &str, key: &str) -> Result<Option<i64>, Failed> {
    let mut get = etcd_client_cmd(endpoint)?;
    get.args(["get", key, "-w", "fields"]);
    let out =
        tokio::task::spawn_blocking(move || integration_tests::harness::process::run_client(get))
            .await
            .map_err(|e| e.to_string())??;
    Ok(out.lines().find_map(|l| {
        l.trim()
            .strip_prefix("\"CreateRevision\" : ")
            .and_then(|v| v.trim().parse().ok())
    }))
}

/// The KV requests (`Txn`, `Range`, `Put`, `DeleteRange`) a member has
/// served, from its Prometheus metrics.
fn kv_requests(port: u16) -> Result<u64, Failed> {
    use std::io::{Read, Write};
    let mut conn = std::net::TcpStream::connect(("127.0.0.1", port)).map_err(|e| e.to_string())?;
    conn.write_all(b"GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
        .map_err(|e| e.to_string())?;
    let mut text = String::new();
    conn.read_to_string(&mut text).map_err(|e| e.to_string())?;
    let kv = ["\"Txn\"", "\"Range\"", "\"Put\"", "\"DeleteRange\""];
    Ok(text
        .lines()
        .filter(|l| l.starts_with("grpc_server_handled_total{") && kv.iter().any(|m| l.contains(m)))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64)
}

/// Taking four free locks at once is one request (one transaction puts
/// every key and reads every queue head), where one at a time would be
/// four. On a member of its own, so that only these requests are counted.
async fn multi_lock_is_one_request() -> Result<(), Failed> {
    let server = private_member().await?;
    let url = server.url().to_string();
    let port = integration_tests::harness::host_port(&url)
        .ok_or("no port")?
        .1;
    let client = LockClient::new(EtcdBackend::connect(&url).await?);
    let names = ["multi/a", "multi/b", "multi/c", "multi/d"];
    // Grants the session's lease first.
    client
        .lock("multi/warm-up")
        .acquire()
        .await?
        .release()
        .await?;
    let before = kv_requests(port)?;
    let m = client
        .lock_all(names)
        .try_acquire()
        .await?
        .ok_or("four free locks were refused")?;
    let took = kv_requests(port)? - before;
    m.release().await?;
    drop(server);
    if took != 1 {
        return Err(format!("taking four free locks took {took} KV requests").into());
    }
    Ok(())
}

/// etcd takes at most 128 operations in a transaction and taking locks
/// at once puts two in it per name: 64 names are one request, and more are
/// taken one at a time, granted all the same (not refused by etcd as "too
/// many operations in txn request").
async fn multi_lock_of_many_names() -> Result<(), Failed> {
    let server = private_member().await?;
    let client = LockClient::new(EtcdBackend::connect(server.url()).await?);
    for n in [64, 65, 200] {
        let names: Vec<String> = (0..n).map(|i| format!("many{n}/{i}")).collect();
        let m = client
            .lock_all(&names)
            .try_acquire()
            .await?
            .ok_or_else(|| format!("{n} free locks were refused"))?;
        m.release().await?;
        let m = client
            .lock_all(&names)
            .wait(Duration::from_secs(10))
            .acquire()
            .await?;
        m.release().await?;
    }
    drop(server);
    Ok(())
}

/// An uncontended acquire and release is two KV requests (the enqueue
/// transaction and the delete), exclusive or shared. On a member of its
/// own, so that only these requests are counted.
async fn uncontended_holds_take_two_requests() -> Result<(), Failed> {
    let server = private_member().await?;
    let url = server.url().to_string();
    let port = integration_tests::harness::host_port(&url)
        .ok_or("no port")?
        .1;
    let client = LockClient::new(EtcdBackend::connect(&url).await?);
    // Grants the session's lease first.
    client.lock("rt/warm-up").acquire().await?.release().await?;
    for shared in [false, true] {
        let before = kv_requests(port)?;
        let b = client.lock("rt/job");
        let g = if shared { b.shared() } else { b }.acquire().await?;
        g.release().await?;
        let took = kv_requests(port)? - before;
        if took != 2 {
            let kind = if shared { "shared" } else { "exclusive" };
            return Err(format!(
                "an uncontended {kind} acquire and release took {took} KV requests"
            )
            .into());
        }
    }
    drop(server);
    Ok(())
}

/// A writer holds while readers queue and a second writer queues behind
/// them: every reader's token is above the first writer's, and the second
/// writer's above every reader's (grants after a wait are claimed by a
/// write, whose revision is the token).
async fn waited_grants_tokens_rise(f: Arc<Etcd>) -> Result<(), Failed> {
    let url = f.url()?;
    let lock = name();
    let ttl = Duration::from_secs(10);
    let wait = Duration::from_secs(20);
    let first = LockClient::new(EtcdBackend::connect(&url).await?);
    let w1 = first.lock(&lock).ttl(ttl).acquire().await?;
    let mut readers = Vec::new();
    for i in 0..4 {
        let c = LockClient::new(EtcdBackend::connect(&url).await?);
        let l = lock.clone();
        readers.push(tokio::spawn(async move {
            let g = c.lock(&l).shared().ttl(ttl).wait(wait).acquire().await?;
            tokio::time::sleep(Duration::from_millis(200)).await;
            let token = g.token();
            g.release().await?;
            Ok::<_, Error>(token)
        }));
        let start = Instant::now();
        while keys_under(&url, &lock).await? < i + 2 {
            if start.elapsed() > Duration::from_secs(10) {
                return Err("a reader never queued".into());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    let second = LockClient::new(EtcdBackend::connect(&url).await?);
    let l = lock.clone();
    let w2 = tokio::spawn(async move { second.lock(&l).ttl(ttl).wait(wait).acquire().await });
    let start = Instant::now();
    while keys_under(&url, &lock).await? < 6 {
        if start.elapsed() > Duration::from_secs(10) {
            return Err("the second writer never queued".into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let t1 = w1.token();
    w1.release().await?;
    let mut shared = Vec::new();
    for r in readers {
        shared.push(r.await.map_err(|e| e.to_string())??);
    }
    let w2 = w2.await.map_err(|e| e.to_string())??;
    let t2 = w2.token();
    w2.release().await?;
    if shared.iter().any(|t| *t <= t1 || *t >= t2) {
        return Err(
            format!("tokens: first writer {t1}, readers {shared:?}, second writer {t2}").into(),
        );
    }
    Ok(())
}

/// A member whose certificate another CA signed is refused at connect
/// time with `Error::Misconfigured` naming the certificate, at once and
/// without the password; so is a `ca_file` that cannot be read; a listener
/// that never answers the handshake is `Unavailable` within the timeout.
async fn refused_certificate(f: Arc<Etcd>) -> Result<(), Failed> {
    let url = f.url()?;
    let (base, ca) = url.split_once("?ca_file=").ok_or("no ca_file in the URL")?;
    let dir = std::path::Path::new(ca)
        .parent()
        .ok_or("the CA has no directory")?;
    let other = integration_tests::harness::tls::make_unrelated_ca(dir)?;
    let started = Instant::now();
    match EtcdBackend::connect(&format!("{base}?ca_file={}", other.display())).await {
        Err(Error::Misconfigured { message, .. })
            if message.contains("certificate") && !message.contains("app-pw") => {}
        other => return Err(format!("a certificate from another CA gave {other:?}").into()),
    }
    if started.elapsed() > Duration::from_secs(5) {
        return Err(format!("the refusal took {:?}", started.elapsed()).into());
    }
    match EtcdBackend::connect(&format!("{base}?ca_file={}/missing.pem", dir.display())).await {
        Err(Error::InvalidInput { message, .. }) if message.contains("missing.pem") => {}
        other => return Err(format!("an unreadable ca_file gave {other:?}").into()),
    }
    // A listener that accepts the connection and never answers the TLS
    // handshake: `Unavailable` within the URL's timeout (twice it: the
    // connection, then the first request), not a hang.
    let silent = std::net::TcpListener::bind("127.0.0.1:0")?;
    let port = silent.local_addr()?.port();
    std::thread::spawn(move || {
        let _held: Vec<_> = silent.incoming().collect();
    });
    let url = format!("etcds://app:app-pw@127.0.0.1:{port}?ca_file={ca}&timeout_ms=500");
    let connecting = EtcdBackend::connect(&url);
    match tokio::time::timeout(Duration::from_secs(30), connecting).await {
        Ok(Err(Error::Unavailable { .. })) => {}
        Ok(other) => return Err(format!("a silent TLS listener gave {other:?}").into()),
        Err(_) => return Err("connecting to a silent TLS listener hung for 30 s".into()),
    }
    // A plain URL to the TLS member, and a TLS URL to a plain member:
    // `Misconfigured` naming the scheme to use.
    let plain_member = integration_tests::harness::etcd::spawn()?;
    let plain_tls = format!("etcds://127.0.0.1:{}?ca_file={ca}", plain_member.port);
    for (url, says) in [
        (base.replacen("etcds", "etcd", 1), "use etcds://"),
        (plain_tls, "use etcd://"),
    ] {
        let connecting = EtcdBackend::connect(&url);
        match tokio::time::timeout(Duration::from_secs(30), connecting).await {
            Ok(Err(Error::Misconfigured { message, .. })) if message.contains(says) => {}
            Ok(other) => return Err(format!("{url} gave {other:?}").into()),
            Err(_) => return Err(format!("{url} hung for 30 s").into()),
        }
    }
    Ok(())
}

/// Turns on authentication on the TLS member at `endpoint` (whose CA is
/// `ca`): a root user, a user `app` (password `app-pw`) whose role may read
/// and write only the conformance suite's lock names, semaphores and
/// leaders' holder info, and a
/// user `nobody` (password `nobody-pw`) with no role.
fn enable_auth(endpoint: &str, ca: &std::path::Path) -> Result<(), String> {
    let steps: [&[&str]; 10] = [
        &["user", "add", "root", "--new-user-password=root-pw"],
        &["user", "grant-role", "root", "root"],
        &["user", "add", "app", "--new-user-password=app-pw"],
        &["role", "add", "app"],
        &[
            "role",
            "grant-permission",
            "app",
            "--prefix=true",
            "readwrite",
            "conformance-",
        ],
        &[
            "role",
            "grant-permission",
            "app",
            "--prefix=true",
            "readwrite",
            "/distlock/semaphores/conformance-",
        ],
        &[
            "role",
            "grant-permission",
            "app",
            "--prefix=true",
            "readwrite",
            "/distlock/leaders/conformance-",
        ],
        &["user", "grant-role", "app", "app"],
        &["user", "add", "nobody", "--new-user-password=nobody-pw"],
        &["auth", "enable"],
    ];
    for step in steps {
        let out = server::etcdctl(&format!("https://{endpoint}"))
            .map_err(|e| e.to_string())?
            .arg(format!("--cacert={}", ca.display()))
            .args(step)
            .output()
            .map_err(|e| e.to_string())?;
        let said = String::from_utf8_lossy(&out.stderr);
        // etcd makes the root role itself on some versions.
        if !out.status.success() && !said.contains("already exists") {
            return Err(format!("etcdctl {step:?}: {said}"));
        }
    }
    Ok(())
}

/// A wrong password, no user at all, and a user whose role does not cover
/// the lock's name, are `Error::Misconfigured` naming the credentials, not a
/// retryable "unavailable"; the password appears in none.
async fn refused_credentials(f: Arc<Etcd>) -> Result<(), Failed> {
    let url = f.url()?;
    let endpoint = url.rsplit_once('@').ok_or("no credentials in the URL")?.1;
    let wrong = EtcdBackend::connect(&format!("etcds://app:not-it@{endpoint}")).await;
    let wrong = match wrong {
        Ok(b) => LockClient::new(b)
            .lock("conformance-x/job")
            .try_acquire()
            .await
            .map(|_| ()),
        Err(e) => Err(e),
    };
    match wrong {
        Err(Error::Misconfigured { message, .. }) if !message.contains("not-it") => {}
        other => return Err(format!("a wrong password gave {other:?}").into()),
    }
    let anonymous = match EtcdBackend::connect(&format!("etcds://{endpoint}")).await {
        Ok(b) => LockClient::new(b)
            .lock("conformance-x/job")
            .try_acquire()
            .await
            .map(|_| ()),
        Err(e) => Err(e),
    };
    match anonymous {
        Err(Error::Misconfigured { .. }) => {}
        other => return Err(format!("a client without a user gave {other:?}").into()),
    }
    let nobody = LockClient::new(
        EtcdBackend::connect(&format!("etcds://nobody:nobody-pw@{endpoint}")).await?,
    );
    match nobody.lock("conformance-x/job").try_acquire().await {
        Err(Error::Misconfigured { .. }) => {}
        other => return Err(format!("a user without the prefix got {other:?}").into()),
    }
    let app = LockClient::new(EtcdBackend::connect(&url).await?);
    // The login worked: the message points at the role, not the password.
    match app.lock("elsewhere/job").try_acquire().await {
        Err(Error::Misconfigured { message, .. })
            if message.contains("role needs readwrite") && !message.contains("password") => {}
        other => return Err(format!("a name outside the role's prefix gave {other:?}").into()),
    }
    Ok(())
}

/// A TLS member started by `spawn`, with authentication turned on as
/// [`enable_auth`] does: the member, the URL of its user `app`, and its CA.
async fn auth_member<F>(
    spawn: F,
) -> Result<
    (
        integration_tests::harness::ServerProcess,
        String,
        std::path::PathBuf,
    ),
    Failed,
>
where
    F: FnOnce() -> Result<
            (
                integration_tests::harness::ServerProcess,
                std::path::PathBuf,
            ),
            integration_tests::harness::HarnessError,
        > + Send
        + 'static,
{
    let (member, ca) = tokio::task::spawn_blocking(spawn)
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| e.to_string())?;
    let endpoint = format!("127.0.0.1:{}", member.port);
    let (ep, ca_file) = (endpoint.clone(), ca.clone());
    tokio::task::spawn_blocking(move || enable_auth(&ep, &ca_file))
        .await
        .map_err(|e| e.to_string())??;
    let url = format!("etcds://app:app-pw@{endpoint}?ca_file={}", ca.display());
    Ok((member, url, ca))
}

/// A client idle for longer than its auth token lives (etcd's
/// `--auth-token-ttl`, 300 s by default, 2 s on this member) logs in again
/// on its next request, which succeeds.
async fn expired_token() -> Result<(), Failed> {
    let (member, url, _) = auth_member(|| server::spawn_tls_with(&["--auth-token-ttl=2"])).await?;
    let client = LockClient::new(EtcdBackend::connect(&url).await?);
    let lock = name();
    client
        .lock(&lock)
        .try_acquire()
        .await?
        .ok_or("the lock was taken on a fresh member")?
        .release()
        .await?;
    tokio::time::sleep(Duration::from_secs(4)).await;
    match client.lock(&lock).try_acquire().await {
        Ok(Some(g)) => {
            g.release().await?;
        }
        other => {
            return Err(format!("a try_acquire after the token expired gave {other:?}").into())
        }
    }
    drop(member);
    Ok(())
}

/// A change of users or roles (here a user added) makes every JWT token
/// issued before it stale (a JWT token carries the auth store's revision):
/// etcd refuses it with "revision of auth store is old".
/// A client logs in again and goes on: a hold taken before the change is
/// still held and released, and new acquisitions succeed.
async fn old_auth_revision() -> Result<(), Failed> {
    let (member, url, ca) = auth_member(server::spawn_tls_jwt).await?;
    let endpoint = format!("127.0.0.1:{}", member.port);
    let client = LockClient::new(EtcdBackend::connect(&url).await?);
    let waiter = LockClient::new(EtcdBackend::connect(&url).await?);
    let held_name = name();
    let held = client
        .lock(&held_name)
        .ttl(Duration::from_secs(5))
        .try_acquire()
        .await?
        .ok_or("the lock was taken on a fresh member")?;
    let (ep, ca_file) = (endpoint.clone(), ca.clone());
    let out = tokio::task::spawn_blocking(move || {
        server::etcdctl(&format!("https://{ep}"))
            .map_err(|e| e.to_string())?
            .arg(format!("--cacert={}", ca_file.display()))
            .args([
                "--user=root:root-pw",
                "user",
                "add",
                "other",
                "--new-user-password=x",
            ])
            .output()
            .map_err(|e| e.to_string())
    })
    .await
    .map_err(|e| e.to_string())??;
    if !out.status.success() {
        return Err(format!("etcdctl user add: {}", String::from_utf8_lossy(&out.stderr)).into());
    }
    for attempt in ["first", "second"] {
        match client.lock(name()).try_acquire().await {
            Ok(Some(g)) => {
                g.release().await?;
            }
            other => {
                return Err(format!(
                    "the {attempt} try_acquire after a user was added gave {other:?}"
                )
                .into())
            }
        }
    }
    // A client whose first request since the change is a wait queues,
    // watches and is granted at the release. Renewals went on through the
    // change (the hold's lease is 5 s).
    let waiting = tokio::spawn(async move {
        waiter
            .lock(held_name)
            .wait(Duration::from_secs(30))
            .acquire()
            .await
    });
    tokio::time::sleep(Duration::from_secs(6)).await;
    if !held.is_held() {
        return Err("the hold taken before the change was lost".into());
    }
    if !held.release().await? {
        return Err("the hold taken before the change was not held at its release".into());
    }
    let granted = tokio::time::timeout(Duration::from_secs(30), waiting)
        .await
        .map_err(|_| "the waiter was not granted after the release")?
        .map_err(|e| e.to_string())?;
    granted
        .map_err(|e| format!("the waiter's wait after the change gave {e}"))?
        .release()
        .await?;
    drop(member);
    Ok(())
}

/// A child process that is killed and reaped when dropped, so a test that
/// fails half-way leaves no `etcdctl` running.
struct Reaped(Option<Child>);

impl Reaped {
    fn id(&self) -> u32 {
        self.0.as_ref().map_or(0, Child::id)
    }

    /// The child, no longer killed on drop.
    fn take(mut self) -> Result<Child, Failed> {
        self.0
            .take()
            .ok_or_else(|| "the child was taken already".into())
    }
}

impl Drop for Reaped {
    fn drop(&mut self) {
        if let Some(c) = self.0.as_mut() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// `etcdctl elect` (Go's `concurrency.Election`) with `args`, its standard
/// output's lines arriving on the receiver as it prints them.
fn spawn_etcdctl_elect(
    url: &str,
    args: &[&str],
) -> Result<(Reaped, tokio::sync::mpsc::UnboundedReceiver<String>), Failed> {
    let ep = integration_tests::harness::host_port(url).ok_or("no endpoint")?;
    let mut c = etcd_client_cmd(&format!("{}:{}", ep.0, ep.1))?;
    c.arg("elect")
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    let mut child = c.spawn().map_err(|e| Failed::from(e.to_string()))?;
    let out = child.stdout.take().ok_or("etcdctl has no stdout")?;
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    std::thread::spawn(move || {
        for line in std::io::BufRead::lines(std::io::BufReader::new(out)) {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    Ok((Reaped(Some(child)), rx))
}

/// Waits until etcdctl prints the line `want`; the lines before it.
async fn printed(
    lines: &mut tokio::sync::mpsc::UnboundedReceiver<String>,
    want: &str,
    within: Duration,
) -> Result<Vec<String>, Failed> {
    let deadline = Instant::now() + within;
    let mut seen = Vec::new();
    loop {
        match tokio::time::timeout_at(deadline, lines.recv()).await {
            Ok(Some(line)) if line.trim() == want => return Ok(seen),
            Ok(Some(line)) => seen.push(line),
            Ok(None) => {
                return Err(format!("etcdctl ended before printing {want:?}: {seen:?}").into())
            }
            Err(_) => {
                return Err(format!(
                    "etcdctl did not print {want:?} within {within:?}; it printed {seen:?}"
                )
                .into())
            }
        }
    }
}

/// Stops etcdctl the way a user does (SIGINT), so it resigns and closes
/// its session.
fn interrupt(child: &Reaped) -> Result<(), Failed> {
    let sent = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .map_err(|e| e.to_string())?;
    if !sent.success() {
        return Err(format!("kill -INT {} failed: {sent}", child.id()).into());
    }
    Ok(())
}

/// A distlock leader: `etcdctl elect -l` prints its value and then its
/// proclaimed one, and an `etcdctl elect` campaign waits until distlock
/// resigns and then leads.
async fn etcdctl_follows_distlock_leader(f: Arc<Etcd>) -> Result<(), Failed> {
    let url = f.url()?;
    let election = name();
    let client = LockClient::new(EtcdBackend::connect(&url).await?);
    let leader = client
        .election(&election)
        .ttl(Duration::from_secs(10))
        .campaign("distlock-first")
        .await?;
    let (observer, mut seen) = spawn_etcdctl_elect(&url, &["-l", &election])?;
    printed(&mut seen, "distlock-first", Duration::from_secs(10)).await?;
    leader.proclaim("distlock-second").await?;
    printed(&mut seen, "distlock-second", Duration::from_secs(10)).await?;
    let (campaigner, mut won) = spawn_etcdctl_elect(&url, &[&election, "go-proposal"])?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    if won.try_recv().is_ok() {
        return Err("etcdctl elect printed a leader while distlock led".into());
    }
    leader.resign().await?;
    printed(&mut won, "go-proposal", Duration::from_secs(10)).await?;
    printed(&mut seen, "go-proposal", Duration::from_secs(10)).await?;
    interrupt(&campaigner)?;
    drop(observer);
    wait_exit(campaigner.take()?, Duration::from_secs(10)).await?;
    Ok(())
}

/// An `etcdctl elect` leader: distlock's `leader` and `observe` report its
/// proposal, a distlock campaign waits, and takes over once etcdctl is
/// interrupted (its session ends); then observe reports distlock's value.
async fn distlock_follows_etcdctl_leader(f: Arc<Etcd>) -> Result<(), Failed> {
    let url = f.url()?;
    let election = name();
    let (campaigner, mut won) = spawn_etcdctl_elect(&url, &[&election, "go-proposal"])?;
    printed(&mut won, "go-proposal", Duration::from_secs(10)).await?;
    let client = LockClient::new(EtcdBackend::connect(&url).await?);
    let e = client.election(&election).ttl(Duration::from_secs(10));
    let now = e.leader().await?.ok_or("distlock sees no leader")?;
    if now.value != "go-proposal" || now.holder_info.is_some() {
        return Err(format!("distlock sees leader {now:?}, not go-proposal").into());
    }
    // Go's Election key is listed as a leadership with its proposal.
    let listed = client.list(&election, 10).await?;
    match listed.as_slice() {
        [r] if r.kind == HoldKind::Leader
            && r.value.as_deref() == Some("go-proposal")
            && r.holder_info.is_none() => {}
        other => return Err(format!("list shows {other:?} for etcdctl's leader").into()),
    }
    let mut observed = e.observe().await?;
    let first = futures_util::StreamExt::next(&mut observed)
        .await
        .ok_or("observe ended")??;
    if first.map(|l| l.value).as_deref() != Some("go-proposal") {
        return Err("observe did not begin with etcdctl's proposal".into());
    }
    if e.try_campaign("distlock").await?.is_some() {
        return Err("distlock was elected while etcdctl led".into());
    }
    let waiting = tokio::spawn({
        let e = e.clone().wait(Duration::from_secs(20));
        async move { e.campaign("distlock").await }
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    interrupt(&campaigner)?;
    let l = waiting.await.map_err(|e| e.to_string())??;
    loop {
        let next = tokio::time::timeout(
            Duration::from_secs(10),
            futures_util::StreamExt::next(&mut observed),
        )
        .await
        .map_err(|_| "observe did not report distlock taking over")?
        .ok_or("observe ended")??;
        match next.map(|l| l.value) {
            Some(v) if v == "distlock" => break,
            None => continue,
            other => return Err(format!("observe reported {other:?} after etcdctl").into()),
        }
    }
    l.resign().await?;
    wait_exit(campaigner.take()?, Duration::from_secs(10)).await?;
    Ok(())
}

/// A lock and an election of one name share their keys (Go's layout): one
/// client, on one lease, holding the lock and campaigning under the same
/// name gets `InvalidInput` at once (so does the lock after the
/// campaign), and keeps what it holds; another client's campaign simply
/// queues behind the lock.
async fn lock_and_campaign_one_name(f: Arc<Etcd>) -> Result<(), Failed> {
    let url = f.url()?;
    let client = LockClient::new(EtcdBackend::connect(&url).await?);
    let other = LockClient::new(EtcdBackend::connect(&url).await?);
    let name = name();
    let ttl = Duration::from_secs(10);
    let held = client.lock(&name).ttl(ttl).acquire().await?;
    match client
        .election(&name)
        .ttl(ttl)
        .wait(Duration::from_secs(5))
        .campaign("same lease")
        .await
    {
        Err(Error::InvalidInput { .. }) => {}
        Err(e) => return Err(format!("the campaign beside the lock answered {e:?}").into()),
        Ok(_) => return Err("a campaign was elected beside its own client's lock".into()),
    }
    match other
        .election(&name)
        .ttl(ttl)
        .wait(Duration::from_millis(500))
        .campaign("other lease")
        .await
    {
        Err(Error::WaitTimeout { .. }) => {}
        other => {
            return Err(
                format!("another client's campaign beside the lock answered {other:?}").into(),
            )
        }
    }
    if !held.release().await? {
        return Err("the lock was lost to the refused campaign".into());
    }
    let leads = client.election(&name).ttl(ttl).campaign("leader").await?;
    match client
        .lock(&name)
        .ttl(ttl)
        .wait(Duration::from_secs(5))
        .acquire()
        .await
    {
        Err(Error::InvalidInput { .. }) => {}
        Err(e) => return Err(format!("the lock beside the campaign answered {e:?}").into()),
        Ok(_) => return Err("a lock was granted beside its own client's leadership".into()),
    }
    if !leads.resign().await? {
        return Err("the leadership was lost to the refused lock".into());
    }
    Ok(())
}

/// A client whose wait for a held lock (or a held election) is cancelled
/// and who asks again at once finds its cancelled request's key still
/// there, not yet released: the new request takes it for a leftover and
/// waits, never calling it another hold's key.
/// Two clients over one backend share its leases, and Go's layout names a
/// lock's key (and a campaign's) after its lease: the second client's
/// request must wait for the first's hold, not take its key for its own or
/// for a leftover.
async fn two_clients_one_backend(f: Arc<Etcd>) -> Result<(), Failed> {
    let backend: distlock_core::DynBackend = Arc::new(EtcdBackend::connect(&f.url()?).await?);
    let (a, b) = (
        LockClient::from_dyn(backend.clone()),
        LockClient::from_dyn(backend),
    );
    let (lock, election) = (
        name(),
        format!("{}/election", integration_tests::namespace()),
    );
    let ttl = Duration::from_secs(10);
    let held = a.lock(&lock).ttl(ttl).acquire().await?;
    let leads = a.election(&election).ttl(ttl).campaign("a").await?;
    if b.lock(&lock).ttl(ttl).try_acquire().await?.is_some() {
        return Err("the second client was granted a held lock".into());
    }
    if b.lock_all([&lock]).ttl(ttl).try_acquire().await?.is_some() {
        return Err("the second client's multi-lock took a held lock".into());
    }
    if b.election(&election)
        .ttl(ttl)
        .try_campaign("b")
        .await?
        .is_some()
    {
        return Err("the second client was elected beside the leader".into());
    }
    let waited = b
        .lock(&lock)
        .ttl(ttl)
        .wait(Duration::from_millis(500))
        .acquire()
        .await;
    if !matches!(waited, Err(Error::WaitTimeout { .. })) {
        return Err(format!("the second client's wait for a held lock answered {waited:?}").into());
    }
    if !held.is_held() || !leads.is_held() {
        return Err("the first client's hold or leadership was taken".into());
    }
    let waiter = {
        let (b, lock) = (b.clone(), lock.clone());
        tokio::spawn(async move {
            b.lock(&lock)
                .ttl(ttl)
                .wait(Duration::from_secs(10))
                .acquire()
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    if waiter.is_finished() {
        return Err("the second client's waiter was granted a held lock".into());
    }
    held.release().await?;
    let g = waiter.await.map_err(|e| e.to_string())??;
    g.release().await?;
    leads.resign().await?;
    let leads = b.election(&election).ttl(ttl).try_campaign("b").await?;
    leads
        .ok_or("the second client was not elected after the leader resigned")?
        .resign()
        .await?;
    // A hold an operator removed is lost at its next renewal, and does not
    // keep the other client out while its guard lives on.
    let short = Duration::from_secs(3);
    let held = a.lock(&lock).ttl(short).acquire().await?;
    EtcdBackend::connect(&f.url()?)
        .await?
        .evict(&distlock_core::LockName::new(&lock)?)
        .await?;
    tokio::time::timeout(Duration::from_secs(10), held.lost())
        .await
        .map_err(|_| "an evicted hold was not reported lost")?;
    let g = b
        .lock(&lock)
        .ttl(short)
        .try_acquire()
        .await?
        .ok_or("a lost hold's guard kept the other client out")?;
    g.release().await?;
    drop(held);
    Ok(())
}

async fn retried_after_cancel(f: Arc<Etcd>) -> Result<(), Failed> {
    let url = f.url()?;
    let holder = LockClient::new(EtcdBackend::connect(&url).await?);
    let asker = LockClient::new(EtcdBackend::connect(&url).await?);
    let lock = name();
    let election = format!("{}/election", integration_tests::namespace());
    let held = holder
        .lock(&lock)
        .ttl(Duration::from_secs(10))
        .acquire()
        .await?;
    let leads = holder
        .election(&election)
        .ttl(Duration::from_secs(10))
        .campaign("holder")
        .await?;
    for round in 0..5 {
        let cancelled = tokio::time::timeout(
            Duration::from_millis(100),
            asker.lock(&lock).ttl(Duration::from_secs(10)).acquire(),
        )
        .await;
        if cancelled.is_ok() {
            return Err("a held lock was granted".into());
        }
        match asker
            .lock(&lock)
            .ttl(Duration::from_secs(10))
            .wait(Duration::from_millis(300))
            .acquire()
            .await
        {
            Err(Error::WaitTimeout { .. }) => {}
            other => {
                return Err(format!("round {round}: the lock's retry answered {other:?}").into())
            }
        }
        let cancelled = tokio::time::timeout(
            Duration::from_millis(100),
            asker
                .election(&election)
                .ttl(Duration::from_secs(10))
                .campaign("asker"),
        )
        .await;
        if cancelled.is_ok() {
            return Err("a campaign was elected beside the leader".into());
        }
        match asker
            .election(&election)
            .ttl(Duration::from_secs(10))
            .wait(Duration::from_millis(300))
            .campaign("asker")
            .await
        {
            Err(Error::WaitTimeout { .. }) => {}
            other => {
                return Err(
                    format!("round {round}: the campaign's retry answered {other:?}").into(),
                )
            }
        }
    }
    held.release().await?;
    leads.resign().await?;
    Ok(())
}

/// Keys of a longer name under an election's prefix (the lock `<name>/db`
/// keeps `<name>/db/<lease>`) are not the election's: `leader` and
/// `observe` report nobody while only such a key exists.
async fn election_ignores_longer_names(f: Arc<Etcd>) -> Result<(), Failed> {
    let url = f.url()?;
    let client = LockClient::new(EtcdBackend::connect(&url).await?);
    let election = format!("{}/svc", integration_tests::namespace());
    let sub = client
        .lock(format!("{election}/db"))
        .ttl(Duration::from_secs(10))
        .acquire()
        .await?;
    let e = client.election(&election);
    if let Some(l) = e.leader().await? {
        return Err(format!("leader reports {l:?}, a lock of a longer name").into());
    }
    let mut seen = e.observe().await?;
    let first = futures_util::StreamExt::next(&mut seen)
        .await
        .ok_or("observe ended")??;
    if first.is_some() {
        return Err(format!("observe began with {first:?}, a lock of a longer name").into());
    }
    sub.release().await?;
    Ok(())
}

/// A release that fails (the network drops every byte past its retries)
/// leaves the key on a lease the session keeps alive; once the network
/// passes again, the backend deletes it in the background, and another
/// client gets the lock (and then a semaphore's one permit) long before
/// its 30 s TTL, where without that the key would stay as long as the
/// process.
async fn failed_release(f: Arc<Etcd>) -> Result<(), Failed> {
    use integration_tests::harness::proxy::Proxy;
    let url = f.url()?;
    let port = integration_tests::harness::host_port(&url)
        .ok_or("no endpoint")?
        .1;
    let proxy = Proxy::start(port).map_err(|e| e.to_string())?;
    let proxied = format!("etcd://127.0.0.1:{}?timeout_ms=1000", proxy.port);
    let holder = LockClient::new(EtcdBackend::connect(&proxied).await?);
    let other = LockClient::new(f.backend().await?);
    let lock = name();
    let held = holder
        .lock(&lock)
        .ttl(Duration::from_secs(30))
        .acquire()
        .await?;
    proxy.set_blackhole(true);
    match held.release().await {
        Err(e) if e.is_retryable() => {}
        other => return Err(format!("a release through a dead network answered {other:?}").into()),
    }
    proxy.set_blackhole(false);
    let start = Instant::now();
    other
        .lock(&lock)
        .wait(Duration::from_secs(15))
        .acquire()
        .await
        .map_err(|e| format!("the lock whose release failed was not freed: {e}"))?
        .release()
        .await?;
    // The holder's session is still alive: its lease, not its end, freed
    // nothing.
    if start.elapsed() > Duration::from_secs(15) {
        return Err("the key went only with its lease".into());
    }
    let pool = format!("{lock}-pool");
    let permit = holder
        .semaphore(&pool, 1)
        .ttl(Duration::from_secs(30))
        .acquire()
        .await?;
    proxy.set_blackhole(true);
    match permit.release().await {
        Err(e) if e.is_retryable() => {}
        other => {
            return Err(
                format!("a permit's release through a dead network answered {other:?}").into(),
            )
        }
    }
    proxy.set_blackhole(false);
    let start = Instant::now();
    other
        .semaphore(&pool, 1)
        .wait(Duration::from_secs(15))
        .acquire()
        .await
        .map_err(|e| format!("the permit whose release failed was not freed: {e}"))?
        .release()
        .await?;
    if start.elapsed() > Duration::from_secs(15) {
        return Err("the permit's key went only with its lease".into());
    }
    drop(holder);
    Ok(())
}

/// The holder's and the waiter's connections to etcd stall: the network
/// drops their bytes both ways without closing them. Each client's HTTP/2
/// PING goes unanswered, so it closes its connection and opens another, on
/// which the session renews the hold (TTL 10 s) for two TTLs; the hold is
/// released as still held, and the waiter, whose watch was on a stalled
/// connection, gets the lock.
async fn stalled_connections(f: Arc<Etcd>) -> Result<(), Failed> {
    use integration_tests::harness::proxy::Proxy;
    let url = f.url()?;
    let port = integration_tests::harness::host_port(&url)
        .ok_or("no endpoint")?
        .1;
    let proxy = Proxy::start(port).map_err(|e| e.to_string())?;
    let proxied = format!("etcd://127.0.0.1:{}", proxy.port);
    let holder = LockClient::new(EtcdBackend::connect(&proxied).await?);
    let waiter = LockClient::new(EtcdBackend::connect(&proxied).await?);
    let lock = name();
    let ttl = Duration::from_secs(10);
    let held = holder.lock(&lock).ttl(ttl).acquire().await?;
    let waiting = queued_waiter(waiter, &url, &lock, ttl, Duration::from_secs(60)).await?;
    // The waiter's watch follows its queued key at once.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let stalled = proxy.accepted();
    for index in 0..stalled {
        proxy.stall(index);
    }
    if let Ok(reason) = tokio::time::timeout(ttl * 2, held.lost()).await {
        return Err(format!("the hold was lost while its connection stalled: {reason}").into());
    }
    if proxy.accepted() == stalled {
        return Err("no client opened a new connection; the case shows nothing".into());
    }
    let token = held.token();
    if !held.release().await? {
        return Err("the release found the hold gone".into());
    }
    let got = tokio::time::timeout(Duration::from_secs(30), waiting)
        .await
        .map_err(|_| Failed::from("the waiter did not get the lock within 30 s of the release"))?
        .map_err(|e| e.to_string())??;
    if got.token() <= token {
        return Err("the waiter's token did not rise above the holder's".into());
    }
    if !got.release().await? {
        return Err("the waiter's release found its hold gone".into());
    }
    // A TTL shorter than the time the client takes to give a stalled
    // connection up: no renewal reaches a new connection in time, and the
    // hold reports `lost()`.
    let short = LockClient::new(EtcdBackend::connect(&proxied).await?);
    let brief = short
        .lock(format!("{lock}-brief"))
        .ttl(Duration::from_secs(3))
        .acquire()
        .await?;
    for index in 0..proxy.accepted() {
        proxy.stall(index);
    }
    if tokio::time::timeout(Duration::from_secs(20), brief.lost())
        .await
        .is_err()
    {
        return Err("a 3 s hold did not report lost() across its stalled connection".into());
    }
    Ok(())
}
