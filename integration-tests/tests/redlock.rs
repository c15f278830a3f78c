//! The conformance suite on Redlock over 5 redis-server processes (with and
//! without fencing, and with first-come-first-served waiting), plus the
//! failure cases: nodes down, a paused node, and the node-restart double
//! grant with and without delayed-restart protection; and the queue's own
//! cases on 3 nodes: grants in arrival order waking only the head, a
//! cut-off waiter, a cancelled one.

use std::sync::Arc;
use std::time::Duration;

use distlock_core::{Error, LockClient, LockName};
use distlock_redlock::RedlockBackend;
use integration_tests::blocking;
use integration_tests::factory::{ServerFactory, Servers};
use integration_tests::fifo;
use integration_tests::harness::proxy::Proxy;
use integration_tests::harness::{redis as server, ServerProcess};
use integration_tests::trial;
use libtest_mimic::Failed;
use tokio::time::Instant;

fn five_nodes() -> Result<Vec<ServerProcess>, Failed> {
    (0..5)
        .map(|_| server::spawn(&[]).map_err(|e| Failed::from(e.to_string())))
        .collect()
}

fn url(nodes: &[ServerProcess], options: &str) -> String {
    server::redlock_url(nodes.iter().map(|n| n.port), options)
}

type Redlock = ServerFactory<RedlockBackend>;

fn main() {
    let plain = Redlock::new("redlock", || {
        let nodes = five_nodes().map_err(|e| format!("{e:?}"))?;
        Ok(Servers::processes(url(&nodes, ""), nodes))
    });
    // Both run on one set of five nodes; each case's lock names live in a
    // namespace of their own.
    let fenced = Arc::new(plain.sharing("redlock::fenced", "&fencing=true"));
    let queued = Arc::new(plain.sharing("redlock::fifo_suite", "&fifo=true"));
    let mixed: Arc<dyn integration_tests::BackendFactory> =
        Arc::new(plain.sharing("redlock::fifo_mixed", "&fifo=true&queue_lease_ms=600"));
    let plain = Arc::new(plain);
    integration_tests::run_suite(plain.clone(), move |rt| {
        let handover = plain.clone();
        let mut extra = integration_tests::trials(fenced, rt);
        extra.extend(integration_tests::trials(queued, rt));
        extra.extend(integration_tests::factory::Alternating::safety_trials(
            "redlock::fifo_mixed",
            plain,
            mixed,
            rt,
        ));
        extra.extend([
            trial(
                rt,
                "redlock::observe_reports_a_handover_between_leaders_of_one_value",
                same_value_handover(handover),
            ),
            trial(
                rt,
                "redlock::a_server_listed_under_two_addresses_is_refused",
                one_server_twice(),
            ),
            trial(
                rt,
                "redlock::a_refused_round_gives_nothing_back",
                refused_round(""),
            ),
            trial(
                rt,
                "redlock::fenced::a_refused_round_gives_nothing_back",
                refused_round("&fencing=true"),
            ),
            trial(
                rt,
                "redlock::fifo::a_waiter_whose_client_listens_already_goes_round_once",
                listening_waiter(),
            ),
            trial(
                rt,
                "redlock::fifo::grants_in_arrival_order_waking_only_the_head",
                fifo_order(queued_lock("fifo/order", false), 1, false),
            ),
            trial(
                rt,
                "redlock::fifo::a_cancelled_or_timed_out_waiter_leaves_no_entry",
                fifo_cancel(queued_lock("fifo/cancel", false)),
            ),
            trial(
                rt,
                "redlock::fifo::shared::grants_in_arrival_order_waking_only_the_head",
                fifo_order(queued_lock("fifo/order", true), 1, true),
            ),
            trial(
                rt,
                "redlock::fifo::shared::a_cancelled_or_timed_out_waiter_leaves_no_entry",
                fifo_cancel(queued_lock("fifo/cancel", true)),
            ),
            trial(
                rt,
                "redlock::a_holder_on_a_bare_majority_is_waited_for_not_raced",
                bare_majority(),
            ),
            trial(
                rt,
                "redlock::renewals_return_at_a_majority_with_a_node_paused",
                renewal_with_a_node_paused(),
            ),
            trial(
                rt,
                "redlock::fifo::election::grants_in_arrival_order_waking_only_the_head",
                fifo_order(queued_election("fifo/order"), 1, false),
            ),
            trial(
                rt,
                "redlock::fifo::election::a_cancelled_or_timed_out_waiter_leaves_no_entry",
                fifo_cancel(queued_election("fifo/cancel")),
            ),
            trial(
                rt,
                "redlock::fifo::semaphore::grants_in_arrival_order_waking_only_the_head",
                fifo_order(queued_semaphore("fifo/order"), 3, false),
            ),
            trial(
                rt,
                "redlock::fifo::semaphore::a_cancelled_or_timed_out_waiter_leaves_no_entry",
                fifo_cancel(queued_semaphore("fifo/cancel")),
            ),
            trial(
                rt,
                "redlock::fifo::semaphore::a_cut_off_waiter_holds_up_the_queue_only_until_its_entries_lapse",
                fifo_cut(queued_semaphore("fifo/cut")),
            ),
            trial(
                rt,
                "redlock::fifo::election::a_cut_off_waiter_holds_up_the_queue_only_until_its_entries_lapse",
                fifo_cut(queued_election("fifo/cut")),
            ),
            trial(
                rt,
                "redlock::fifo::shared::a_writer_that_leaves_lets_the_readers_behind_it_in",
                fifo_writer_leaves(),
            ),
            trial(
                rt,
                "redlock::fifo::shared::readers_never_pass_a_queued_writer",
                fifo_readers(),
            ),
            trial(
                rt,
                "redlock::fifo::the_last_readers_release_wakes_a_queued_writer",
                fifo_last_reader(),
            ),
            trial(
                rt,
                "redlock::fifo::a_try_is_refused_while_a_waiter_heads_the_queue",
                fifo_try(),
            ),
            trial(
                rt,
                "redlock::fifo::a_cut_off_waiter_holds_up_the_queue_only_until_its_entries_lapse",
                fifo_cut(queued_lock("fifo/cut", false)),
            ),
            trial(rt, "redlock::works_with_two_of_five_nodes_down", two_down()),
            trial(
                rt,
                "redlock::a_raise_that_needs_more_nodes_per_permit_is_refused_while_permits_are_held",
                raise_while_held(),
            ),
            trial(
                rt,
                "redlock::three_of_five_down_is_a_quorum_error",
                three_down(),
            ),
            trial(
                rt,
                "redlock::a_wrong_password_is_misconfigured_not_a_quorum_error",
                wrong_password(),
            ),
            trial(
                rt,
                "redlock::paused_node_costs_at_most_its_timeout",
                paused_node(),
            ),
            trial(
                rt,
                "redlock::a_majority_does_not_wait_for_a_paused_node",
                majority_first(""),
            ),
            trial(
                rt,
                "redlock::fenced::a_majority_does_not_wait_for_a_paused_node",
                majority_first("&fencing=true"),
            ),
            trial(
                rt,
                "redlock::fenced::an_election_runs_with_one_node_down",
                election_one_down(),
            ),
            trial(
                rt,
                "redlock::a_leader_on_a_minority_of_nodes_is_not_the_leader",
                minority_leader(),
            ),
            trial(
                rt,
                "redlock::node_restart_grants_twice_without_protection",
                restart(FirstContact::Try { protected: false }),
            ),
            trial(
                rt,
                "redlock::delayed_restart_protection_prevents_double_grant",
                restart(FirstContact::Try { protected: true }),
            ),
            trial(
                rt,
                "redlock::delayed_restart_protection_learns_a_run_id_from_a_read",
                restart(FirstContact::Read),
            ),
            trial(
                rt,
                "redlock::delayed_restart_protection_covers_a_client_that_meets_the_node_after_its_restart",
                restart(FirstContact::AfterRestart),
            ),
            trial(
                rt,
                "redlock::nodes_without_persistence_are_a_finding_unless_delayed_restart_covers_them",
                persistence_findings(),
            ),
        ]);
        extra
    })
}

async fn two_down() -> Result<(), Failed> {
    let nodes = blocking(five_nodes).await?;
    let client = LockClient::new(RedlockBackend::connect(&url(&nodes, "&fencing=true")).await?);
    let (a, b) = (nodes[0].pid(), nodes[3].pid());
    for pid in [a, b] {
        integration_tests::harness::process::signal(pid, "KILL").map_err(|e| e.to_string())?;
    }
    let g = client
        .lock("two-down")
        .ttl(Duration::from_secs(5))
        .acquire()
        .await?;
    let other = LockClient::new(RedlockBackend::connect(&url(&nodes, "")).await?);
    if other.lock("two-down").try_acquire().await?.is_some() {
        return Err("granted twice with two nodes down".into());
    }
    if !g.release().await? {
        return Err("release with two nodes down reported not held".into());
    }
    // A third node stops answering while the lock is held: the release
    // reaches two of five, too few to tell whether it was held (never
    // "not held", which would say the lease had lapsed).
    let g = client
        .lock("two-down/then-three")
        .ttl(Duration::from_secs(10))
        .acquire()
        .await?;
    nodes[1].signal("STOP").map_err(|e| e.to_string())?;
    let released = g.release().await;
    nodes[1].signal("CONT").map_err(|e| e.to_string())?;
    match released {
        Err(Error::QuorumNotReached { .. }) => Ok(()),
        other => Err(format!("release reaching two of five nodes answered {other:?}").into()),
    }
}

/// Five nodes: a permit of one needs three, a permit of three needs four.
/// Raised from 1 to 3 beside a permit on three nodes, four holders could
/// run at once: refused while a permit is held, and the limit stays 1;
/// once released, it goes through. A raise that needs no more nodes (2 to
/// 3, four nodes each) goes through while a permit is held.
async fn raise_while_held() -> Result<(), Failed> {
    let nodes = blocking(five_nodes).await?;
    let client = LockClient::new(RedlockBackend::connect(&url(&nodes, "")).await?);
    let held = client
        .semaphore("raise/one", 1)
        .ttl(Duration::from_secs(30))
        .acquire()
        .await?;
    match client.set_semaphore_limit("raise/one", 3).await {
        Err(Error::InvalidInput { .. }) => {}
        other => {
            return Err(format!("a raise from 1 to 3 beside a held permit gave {other:?}").into())
        }
    }
    let s = client
        .backend()
        .inspect_permits(&LockName::new("raise/one")?)
        .await?;
    if s.limit != Some(1) || s.holders != Some(1) {
        return Err(format!("after the refused raise: {s:?}").into());
    }
    held.release().await?;
    if client.set_semaphore_limit("raise/one", 3).await? != Some(1) {
        return Err("the raise once released did not answer the old limit 1".into());
    }
    let held = client
        .semaphore("raise/two", 2)
        .ttl(Duration::from_secs(30))
        .acquire()
        .await?;
    if client.set_semaphore_limit("raise/two", 3).await? != Some(2) {
        return Err("a raise from 2 to 3, four nodes each, was refused while held".into());
    }
    held.release().await?;
    // A permit on fewer nodes than a grant needs (here two of five, as a
    // release's last answers still on their way leave it) is no hold.
    let two = LockClient::new(RedlockBackend::connect(&url(&nodes[..2], "")).await?);
    client.set_semaphore_limit("raise/three", 1).await?;
    let partial = two
        .semaphore("raise/three", 1)
        .ttl(Duration::from_secs(30))
        .acquire()
        .await?;
    if client.set_semaphore_limit("raise/three", 3).await? != Some(1) {
        return Err("a permit on two of five nodes refused a raise".into());
    }
    drop(partial);
    Ok(())
}

/// The next item `observe` reports, within 10 s.
async fn next_leader(
    seen: &mut distlock_core::LeaderStream,
) -> Result<Option<distlock_core::Leader>, Failed> {
    tokio::time::timeout(Duration::from_secs(10), futures_util::StreamExt::next(seen))
        .await
        .map_err(|_| Failed::from("observe() reported nothing more in 10 s"))?
        .ok_or_else(|| Failed::from("observe ended"))?
        .map_err(Failed::from)
}

/// Without fencing every leadership's token is 0: a handover between two
/// campaigners of one value is still a new leader, and `observe` reports
/// it (the observer polls; the handover falls between two reads).
async fn same_value_handover(f: Arc<Redlock>) -> Result<(), Failed> {
    use integration_tests::BackendFactory;
    let (a, b, o) = (
        LockClient::new(f.client().await?),
        LockClient::new(f.client().await?),
        LockClient::new(f.client().await?),
    );
    let name = format!("{}/same-value", integration_tests::namespace());
    let first = a
        .election(&name)
        .ttl(Duration::from_secs(10))
        .campaign("v")
        .await?;
    let mut seen = o.election(&name).observe().await?;
    match next_leader(&mut seen).await? {
        Some(l) if l.value == "v" => {}
        other => return Err(format!("observe() began with {other:?}").into()),
    }
    let waiting = {
        let (b, name) = (b.clone(), name.clone());
        tokio::spawn(async move {
            b.election(&name)
                .ttl(Duration::from_secs(10))
                .wait(Duration::from_secs(10))
                .campaign("v")
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    first.resign().await?;
    let second = waiting.await.map_err(|e| e.to_string())??;
    // Nobody may show in between, if a read fell into the handover.
    loop {
        match next_leader(&mut seen).await? {
            Some(l) if l.value == "v" => break,
            Some(l) => return Err(format!("observe() reported {l:?}").into()),
            None => {}
        }
    }
    second.resign().await?;
    Ok(())
}

/// With one of five nodes down, a campaign is elected, `leader` reports
/// it with the leadership's token, a proclamation reaches a majority and
/// shows, and after the resignation nobody leads. The live nodes' counters
/// differ (10, 41, 20, 30), so whichever majority answers first, the
/// grant's token (the highest it counted, plus one: 31 at least) differs
/// from what the other nodes counted: `leader` must report the token
/// written back.
async fn election_one_down() -> Result<(), Failed> {
    let nodes = blocking(five_nodes).await?;
    for (node, count) in [(0, "10"), (2, "41"), (3, "20"), (4, "30")] {
        let port = nodes[node].port;
        blocking(move || {
            server::command(port, &["SET", "{one-down/leader}:election:fence", count])
                .ok_or_else(|| Failed::from("no reply"))
        })
        .await?;
    }
    let url = url(&nodes, "&fencing=true");
    let (a, o) = (
        LockClient::new(RedlockBackend::connect(&url).await?),
        LockClient::new(RedlockBackend::connect(&url).await?),
    );
    nodes[1].signal("KILL").map_err(|e| e.to_string())?;
    let election = "one-down/leader";
    let l = a
        .election(election)
        .ttl(Duration::from_secs(30))
        .campaign("a1")
        .await?;
    if ![31, 42].contains(&l.token().get()) {
        return Err(format!(
            "the leadership's token is {}, not one above a majority's highest count",
            l.token()
        )
        .into());
    }
    let seen = o.election(election).leader().await?;
    match &seen {
        Some(s) if s.value == "a1" && s.token == l.token() => {}
        _ => {
            return Err(format!(
                "with a node down leader() reports {seen:?}, not a1 with token {}",
                l.token()
            )
            .into())
        }
    }
    l.proclaim("a2").await?;
    let seen = o.election(election).leader().await?;
    match &seen {
        Some(s) if s.value == "a2" && s.token == l.token() => {}
        _ => return Err(format!("after proclaim leader() reports {seen:?}").into()),
    }
    if o.election(election).try_campaign("o").await?.is_some() {
        return Err("elected a second leader with a node down".into());
    }
    if !l.resign().await? {
        return Err("resign with a node down reported not leading".into());
    }
    let seen = o.election(election).leader().await?;
    if seen.is_some() {
        return Err(format!("after the resignation leader() reports {seen:?}").into());
    }
    Ok(())
}

/// A leader hash written directly on two of five nodes is no leader: a
/// campaign wins the other three and is the one reported. The same hash on
/// three nodes is the leader (token 0 without fencing), and a campaign is
/// refused. With fencing, the token reported is the one the write-back
/// settled, and a leader no node has settled is not yet one.
async fn minority_leader() -> Result<(), Failed> {
    let nodes = blocking(five_nodes).await?;
    let o = LockClient::new(RedlockBackend::connect(&url(&nodes, "")).await?);
    let fenced = LockClient::new(RedlockBackend::connect(&url(&nodes, "&fencing=true")).await?);
    let write = |name: &'static str, on: Vec<u16>, fields: &'static [&'static str]| {
        blocking(move || {
            let key = format!("{{{name}}}:election");
            for port in on {
                let mut args = vec!["HSET", key.as_str()];
                args.extend(fields);
                server::command(port, &args).ok_or("no reply")?;
                server::command(port, &["PEXPIRE", &key, "60000"]).ok_or("no reply")?;
            }
            Ok(())
        })
    };
    const GHOST: &[&str] = &["owner", "ghost", "value", "ghost", "token", "7"];
    let plant = |name: &'static str, on: Vec<u16>| write(name, on, GHOST);
    let ports: Vec<u16> = nodes.iter().map(|n| n.port).collect();
    plant("minority", vec![ports[0], ports[3]]).await?;
    let seen = o.election("minority").leader().await?;
    if seen.is_some() {
        return Err(format!("a leader on two of five nodes is reported: {seen:?}").into());
    }
    let l = o
        .election("minority")
        .ttl(Duration::from_secs(30))
        .try_campaign("real")
        .await?
        .ok_or("a campaign was refused though only two of five nodes had a leader")?;
    let seen = o.election("minority").leader().await?;
    if seen.as_ref().map(|s| s.value.as_str()) != Some("real") {
        return Err(format!("leader() reports {seen:?}, not the elected campaign").into());
    }
    l.resign().await?;
    plant("majority", vec![ports[0], ports[2], ports[4]]).await?;
    let seen = o.election("majority").leader().await?;
    if seen.as_ref().map(|s| (s.value.as_str(), s.token.get())) != Some(("ghost", 0)) {
        return Err(format!(
            "a leader on three of five nodes is not reported with token 0: {seen:?}"
        )
        .into());
    }
    let seen = fenced.election("majority").leader().await?;
    if seen.is_some() {
        return Err(format!("a leader no node settled is reported with fencing: {seen:?}").into());
    }
    plant("settled", vec![ports[0], ports[1], ports[2]]).await?;
    write("settled", vec![ports[1]], &["token", "9", "settled", "1"]).await?;
    let seen = fenced.election("settled").leader().await?;
    if seen.as_ref().map(|s| (s.value.as_str(), s.token.get())) != Some(("ghost", 9)) {
        return Err(
            format!("leader() reports {seen:?}, not ghost with the settled token 9").into(),
        );
    }
    if o.election("majority").try_campaign("real").await?.is_some() {
        return Err("a campaign was elected beside a leader on three of five nodes".into());
    }
    Ok(())
}

async fn three_down() -> Result<(), Failed> {
    let nodes = blocking(five_nodes).await?;
    let client = LockClient::new(RedlockBackend::connect(&url(&nodes, "")).await?);
    // Contention first: held elsewhere is not a quorum error.
    let holder = LockClient::new(RedlockBackend::connect(&url(&nodes, "")).await?);
    let g = holder
        .lock("three-down")
        .ttl(Duration::from_secs(30))
        .acquire()
        .await?;
    if client.lock("three-down").try_acquire().await?.is_some() {
        return Err("granted a held lock".into());
    }
    drop(g);
    for n in &nodes[..3] {
        n.signal("KILL").map_err(|e| e.to_string())?;
    }
    for r in [
        client
            .lock("three-down-2")
            .try_acquire()
            .await
            .map(|g| g.is_some()),
        client
            .lock("three-down-3")
            .wait(Duration::from_secs(2))
            .acquire()
            .await
            .map(|_| true),
    ] {
        match r {
            Err(
                e @ Error::QuorumNotReached {
                    granted: 0..=2,
                    unreachable: 3,
                    needed: 3,
                    total: 5,
                    ..
                },
            ) => {
                if !e.to_string().contains("quorum not reached") {
                    return Err(format!("unclear message: {e}").into());
                }
            }
            other => {
                return Err(
                    format!("expected QuorumNotReached with 3 of 5 down, got {other:?}").into(),
                )
            }
        }
    }
    Ok(())
}

/// Three password-protected nodes, the first with another password than
/// the others. A password every node refuses is `Misconfigured` (exit 78 in
/// the CLI), not a retryable `QuorumNotReached`, and shows no password. The
/// others' password is refused by one node only: a quorum remains and locks
/// are granted; once a second node is down, the refusing node and the down
/// one leave no quorum, and the refusal is the error.
async fn wrong_password() -> Result<(), Failed> {
    const PASSWORD: &str = "redlock-node-pw";
    const WRONG: &str = "redlock-wrong-pw";
    let nodes = blocking(|| {
        ["first-node-pw", PASSWORD, PASSWORD]
            .into_iter()
            .map(|pw| {
                server::spawn(&["--requirepass", pw]).map_err(|e| Failed::from(e.to_string()))
            })
            .collect::<Result<Vec<_>, _>>()
    })
    .await?;
    let with_password =
        |pw: &str| url(&nodes, "").replacen("redlock://", &format!("redlock://:{pw}@"), 1);
    let refused = |what: &str, r: Result<(), Error>| -> Result<(), Failed> {
        match r {
            Err(e @ Error::Misconfigured { .. }) => {
                let text = format!("{e} {e:?}");
                if e.is_retryable() || !text.contains("password") {
                    return Err(format!("{what}: unclear or retryable: {text}").into());
                }
                if text.contains(WRONG) || text.contains(PASSWORD) {
                    return Err(format!("{what}: the error shows a password: {text}").into());
                }
                Ok(())
            }
            other => Err(format!("{what}: expected Misconfigured, got {other:?}").into()),
        }
    };
    // Connecting already fails; should a node not answer in time there,
    // the first acquire reports it.
    let every_node = match RedlockBackend::connect(&with_password(WRONG)).await {
        Ok(backend) => LockClient::new(backend)
            .lock("wrong-password")
            .try_acquire()
            .await
            .map(|_| ()),
        Err(e) => Err(e),
    };
    refused("a password every node refuses", every_node)?;

    let client = LockClient::new(RedlockBackend::connect(&with_password(PASSWORD)).await?);
    let g = client
        .lock("wrong-password")
        .try_acquire()
        .await?
        .ok_or("a free lock was refused with one node refusing the password")?;
    g.release().await?;
    // The second node stores another limit for this semaphore: with the
    // first refusing the password, no quorum of two can form.
    let second = distlock_redis::RedisBackend::connect(&format!(
        "redis://:{PASSWORD}@127.0.0.1:{}",
        nodes[1].port
    ))
    .await?;
    LockClient::new(second)
        .set_semaphore_limit("wrong-password-sem", 2)
        .await?;
    refused(
        "one node refusing and one storing another limit",
        client
            .semaphore("wrong-password-sem", 1)
            .try_acquire()
            .await
            .map(|_| ()),
    )?;
    nodes[1].signal("KILL").map_err(|e| e.to_string())?;
    refused(
        "one node refusing and one down",
        client
            .lock("wrong-password-2")
            .try_acquire()
            .await
            .map(|_| ()),
    )
}

async fn paused_node() -> Result<(), Failed> {
    let nodes = blocking(five_nodes).await?;
    let client = LockClient::new(RedlockBackend::connect(&url(&nodes, "")).await?);
    nodes[2].signal("STOP").map_err(|e| e.to_string())?;
    let start = Instant::now();
    let g = client
        .lock("paused")
        .ttl(Duration::from_secs(10))
        .acquire()
        .await;
    let took = start.elapsed();
    nodes[2].signal("CONT").map_err(|e| e.to_string())?;
    let g = g?;
    g.release().await?;
    // One per-node timeout, plus generous slack for a loaded machine; far
    // below the 2 s the paused node's connection would take to time out.
    let bound =
        Duration::from_millis(server::REDLOCK_NODE_TIMEOUT_MS) + Duration::from_millis(1500);
    if took > bound {
        return Err(format!("acquire took {took:?} with one node paused (bound {bound:?})").into());
    }
    Ok(())
}

/// Acquire, the fencing write-back and release each return once a majority
/// has answered: with one node paused and a node timeout of 20 s, a full
/// acquire+release must not take anything like 20 s. The paused node gets
/// the grant and the release queued in that order, so once it resumes it
/// must end up free, not holding the key until its TTL.
async fn majority_first(options: &'static str) -> Result<(), Failed> {
    let nodes = blocking(five_nodes).await?;
    let hosts: Vec<String> = nodes
        .iter()
        .map(|n| format!("127.0.0.1:{}", n.port))
        .collect();
    let url = format!(
        "redlock://{}?node_timeout_ms=20000{options}",
        hosts.join(",")
    );
    let client = LockClient::new(RedlockBackend::connect(&url).await?);
    let name = "majority-first";
    nodes[2].signal("STOP").map_err(|e| e.to_string())?;
    let start = Instant::now();
    let cycle = async {
        let g = client
            .lock(name)
            .ttl(Duration::from_secs(60))
            .acquire()
            .await?;
        g.release().await
    };
    // Far below the node timeout; only a wait for the paused node gets there.
    let done = tokio::time::timeout(Duration::from_secs(8), cycle).await;
    let took = start.elapsed();
    nodes[2].signal("CONT").map_err(|e| e.to_string())?;
    match done {
        Err(_) => {
            return Err(format!(
                "acquire+release waited {took:?} for a paused node (node timeout 20 s)"
            )
            .into())
        }
        Ok(released) => {
            if !released? {
                return Err("release with one node paused reported not held".into());
            }
        }
    }
    // The resumed node runs the queued grant, then the queued release.
    let port = nodes[2].port;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let exists = blocking(move || {
            server::command(port, &["EXISTS", name]).ok_or_else(|| Failed::from("no reply"))
        })
        .await?;
        if exists.starts_with(":0") {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(format!(
                "the paused node still holds {name} 10 s after resuming (EXISTS {exists:?})"
            )
            .into());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// How B's client first meets node 2 before it restarts, and whether B
/// has delayed-restart protection.
#[derive(Clone, Copy)]
enum FirstContact {
    /// B connects while every node answers and tries the lock first.
    Try { protected: bool },
    /// B connects while node 2 does not answer and first reaches it with
    /// a status read, protected: no acquire round of B's meets node 2
    /// before the restart, and the run id is learnt all the same.
    Read,
    /// B, protected, connects only after node 2 restarted: it never saw
    /// the old run id, and learns of the restart from the node's uptime.
    AfterRestart,
}

/// The protected clients' quarantine: B connects once every node has been
/// up longer (a node up for less counts as restarted), and the restarted
/// node's quarantine outlasts B's tries after the restart.
const QUARANTINE: Duration = Duration::from_secs(6);

/// Kleppmann's ABC / CDE case: A holds the lock on nodes 0, 1, 2; node 2
/// restarts empty; B then finds nodes 2, 3, 4 free.
async fn restart(first: FirstContact) -> Result<(), Failed> {
    let mut nodes = blocking(five_nodes).await?;
    let started = Instant::now();
    let name = "restart/victim";
    // Nodes 3 and 4 are busy with a foreign owner, so A's majority is 0, 1, 2.
    for n in &nodes[3..] {
        server::command(n.port, &["SET", name, "someone-else", "PX", "60000"]).ok_or("no reply")?;
    }
    let a = LockClient::new(RedlockBackend::connect(&url(&nodes, "")).await?);
    let busy: Vec<u16> = nodes[3..].iter().map(|n| n.port).collect();
    let before: Vec<u64> = busy.iter().map(|p| script_calls(&[*p])).collect();
    let held = a.lock(name).ttl(Duration::from_secs(30)).acquire().await?;
    // The acquire returns at three grants; its refused tries on nodes 3
    // and 4 must land before the foreign keys go.
    let sent = Instant::now();
    while busy
        .iter()
        .zip(&before)
        .any(|(p, b)| script_calls(&[*p]) == *b)
    {
        if sent.elapsed() > Duration::from_secs(10) {
            return Err("A's try never reached nodes 3 and 4".into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for n in &nodes[3..] {
        server::command(n.port, &["DEL", name]).ok_or("no reply")?;
    }
    let protected = !matches!(first, FirstContact::Try { protected: false });
    let options = if protected {
        tokio::time::sleep_until(started + QUARANTINE + Duration::from_millis(1500)).await;
        format!("&delayed_restart_ms={}", QUARANTINE.as_millis())
    } else {
        String::new()
    };
    let options = options.as_str();
    let restart_node2 = |mut nodes: Vec<ServerProcess>| async move {
        let mut node2 = nodes.remove(2);
        blocking(move || {
            node2.restart().map_err(|e| Failed::from(e.to_string()))?;
            Ok(node2)
        })
        .await
        .map(|node2| (node2, nodes))
    };
    let mut after = None;
    let b_backend = match first {
        FirstContact::Try { .. } => RedlockBackend::connect(&url(&nodes, options)).await?,
        FirstContact::AfterRestart => {
            let all = url(&nodes, options);
            let (node2, rest) = restart_node2(nodes).await?;
            nodes = rest;
            after = Some(node2);
            RedlockBackend::connect(&all).await?
        }
        FirstContact::Read => {
            nodes[2].signal("STOP").map_err(|e| e.to_string())?;
            let connected = RedlockBackend::connect(&url(&nodes, options)).await;
            nodes[2].signal("CONT").map_err(|e| e.to_string())?;
            let b = connected?;
            distlock_core::Backend::inspect(&b, &LockName::new(name)?).await?;
            b
        }
    };
    let b = LockClient::new(b_backend.clone());
    if let FirstContact::Try { .. } = first {
        if b.lock(name)
            .ttl(Duration::from_secs(5))
            .try_acquire()
            .await?
            .is_some()
        {
            return Err("B got the lock before any restart".into());
        }
    }
    let node2 = match after {
        Some(node2) => node2,
        None => {
            let (node2, rest) = restart_node2(nodes).await?;
            nodes = rest;
            node2
        }
    };
    // The first request after the restart may meet the broken connection;
    // give B a few tries, as a real contender would, well within the
    // restarted node's quarantine.
    let restarted = Instant::now();
    let mut double = None;
    for _ in 0..20 {
        if restarted.elapsed() > QUARANTINE / 2 {
            break;
        }
        if let Some(g) = b
            .lock(name)
            .ttl(Duration::from_secs(5))
            .try_acquire()
            .await?
        {
            double = Some(g);
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let result = match (protected, double) {
        (false, Some(g)) if held.is_held() => {
            g.release().await?;
            Ok(())
        }
        (false, _) => Err(
            "expected the double grant without protection; the scenario did not reproduce".into(),
        ),
        (true, None) if b_backend.quarantined_nodes() == 1 => Ok(()),
        (true, None) => Err(format!(
            "no grant, but {} nodes quarantined: the restart was not detected",
            b_backend.quarantined_nodes()
        )
        .into()),
        (true, Some(_)) => Err("double grant despite delayed-restart protection".into()),
    };
    drop((node2, nodes, held));
    result
}

/// A round every node refuses is one request per node: a refusal granted
/// nothing, so no release follows it (a release is a script call; an
/// unfenced try is a plain `SET` per node, a fenced one a script call).
/// A round that one node grants gives that node, and only that node, its
/// grant back. A node that has not answered when the round is decided is
/// sent a release too (it may have granted), so each count allows one call
/// more.
async fn refused_round(options: &'static str) -> Result<(), Failed> {
    let nodes = blocking(three_nodes).await?;
    let ports: Vec<u16> = nodes.iter().map(|n| n.port).collect();
    // A node slower than the node timeout counts as down and is sent a
    // release: here every node answers, however loaded the machine.
    let url = url(&nodes, &format!("{options}&node_timeout_ms=5000"));
    let (holder, other) = (
        LockClient::new(RedlockBackend::connect(&url).await?),
        LockClient::new(RedlockBackend::connect(&url).await?),
    );
    let name = "refused-round";
    let scripts = || script_calls(&ports);
    // Loads the scripts on every node first: a first EVALSHA answered
    // NOSCRIPT and sent again would count twice.
    let warm = other.lock("warm-up").try_acquire().await?;
    warm.ok_or("free lock refused")?.release().await?;
    let key = distlock_redis::Keys::new("", &distlock_core::LockName::new(name)?).lock;
    // A round and a release return at a majority; what they sent the last
    // node (a grant, a fencing write-back, a release) runs after them, and
    // must not land inside a count below.
    let settled = || settled_script_calls(&ports);
    // The counts below need the lock held on every node. A round returns
    // once a majority grants: a node whose connection is still opening then
    // (the holder's first round, on a loaded machine) is never asked, and
    // the hold is on two nodes of three. Such a hold is given back and
    // taken again.
    let mut g = None;
    for _ in 0..20 {
        let hold = holder
            .lock(name)
            .try_acquire()
            .await?
            .ok_or("free lock refused")?;
        settled().await;
        if held_on(&ports, &key).await? == ports.len() {
            g = Some(hold);
            break;
        }
        hold.release().await?;
    }
    let g = g.ok_or("in 20 grants, none was held on every node")?;
    let before = settled().await;
    if other.lock(name).try_acquire().await?.is_some() {
        return Err("granted twice".into());
    }
    let sent = scripts() - before;
    let fenced = u64::from(!options.is_empty());
    // A round is decided once two nodes refuse; a third node that has not
    // answered by then (a loaded machine) is sent a release, as it may
    // have granted: one call more at most. Releasing on the nodes that
    // refused would cost two or three more.
    let expected = |n: u64| n..=n + 1;
    if !expected(3 * fenced).contains(&sent) {
        return Err(format!(
            "a round every node refused cost {sent} script calls; expected {:?}",
            expected(3 * fenced)
        )
        .into());
    }
    // One node of three free: granted there, refused on two; only the
    // granting node is asked to give it back.
    let port = ports[0];
    blocking(move || {
        server::command(port, &["DEL", &key]).ok_or_else(|| Failed::from("no reply to DEL"))
    })
    .await?;
    let before = settled().await;
    if other.lock(name).try_acquire().await?.is_some() {
        return Err("granted on one node of three".into());
    }
    let sent = scripts() - before;
    if !expected(3 * fenced + 1).contains(&sent) {
        return Err(format!(
            "a round one node granted cost {sent} script calls; expected {:?} (the round, then one give-back, and one to a node that had not answered)",
            expected(3 * fenced + 1)
        )
        .into());
    }
    g.release().await?;
    Ok(())
}

/// With one node of three paused and a node timeout of 1 s, a hold of
/// 1.5 s is renewed (every half second or so) from the two nodes that
/// answer: a renewal that waited for the paused node's timeout would end
/// after the lease did.
async fn renewal_with_a_node_paused() -> Result<(), Failed> {
    let nodes = blocking(three_nodes).await?;
    let client =
        LockClient::new(RedlockBackend::connect(&url(&nodes, "&node_timeout_ms=1000")).await?);
    let warm = client.lock("warm-up").try_acquire().await?;
    warm.ok_or("free lock refused")?.release().await?;
    nodes[2].signal("STOP").map_err(|e| e.to_string())?;
    let held = async {
        let g = client
            .lock("renewed")
            .ttl(Duration::from_millis(1500))
            .acquire()
            .await?;
        let lost = tokio::time::timeout(Duration::from_secs(4), g.lost()).await;
        if let Ok(why) = lost {
            return Err(format!("the hold was lost with one node paused: {why:?}").into());
        }
        if !g.release().await? {
            return Err(Failed::from("the release found the hold gone"));
        }
        Ok::<_, Failed>(())
    }
    .await;
    nodes[2].signal("CONT").map_err(|e| e.to_string())?;
    held
}

/// A holder on two nodes of three (its key gone from the third, as after
/// a restart without persistence): a waiter wins the free node each round
/// and gives it back. Those rounds are contention to wait out, not a split
/// vote to retry at once, and the give-back wakes nobody, the waiter
/// itself included: over a 3 s wait, a round every one to four retry
/// delays (50 to 200 ms), not one every few milliseconds.
async fn bare_majority() -> Result<(), Failed> {
    let nodes = blocking(three_nodes).await?;
    let ports: Vec<u16> = nodes.iter().map(|n| n.port).collect();
    let url = url(&nodes, "&node_timeout_ms=5000");
    let (holder, other) = (
        LockClient::new(RedlockBackend::connect(&url).await?),
        LockClient::new(RedlockBackend::connect(&url).await?),
    );
    let name = "bare-majority";
    let key = distlock_redis::Keys::new("", &distlock_core::LockName::new(name)?).lock;
    // A round returns once a majority grants: the third node's grant may
    // never be sent (a loaded machine). The case needs the hold on every
    // node before it takes it off one; such a hold is given back and taken
    // again.
    let mut g = None;
    for _ in 0..20 {
        let hold = holder
            .lock(name)
            .ttl(Duration::from_secs(30))
            .try_acquire()
            .await?
            .ok_or("free lock refused")?;
        settled_script_calls(&ports).await;
        if held_on(&ports, &key).await? == ports.len() {
            g = Some(hold);
            break;
        }
        hold.release().await?;
    }
    let g = g.ok_or("in 20 grants, none was held on every node")?;
    let port = ports[0];
    let deleted = blocking(move || {
        server::command(port, &["DEL", &key]).ok_or_else(|| Failed::from("no reply to DEL"))
    })
    .await?;
    if !deleted.starts_with(":1") {
        return Err(format!("the key was not on the first node: {deleted}").into());
    }
    let before = server::calls(port, &["evalsha", "eval"]);
    match other
        .lock(name)
        .wait(Duration::from_secs(3))
        .acquire()
        .await
    {
        Err(Error::WaitTimeout { .. }) => {}
        other => return Err(format!("expected the wait to time out, got {other:?}").into()),
    }
    let rolled_back = server::calls(port, &["evalsha", "eval"]) - before;
    if rolled_back > 60 {
        return Err(format!(
            "the waiter gave the free node back {rolled_back} times in 3 s; expected a round per wake-up bound"
        )
        .into());
    }
    g.release().await?;
    Ok(())
}

/// A queued waiter subscribes after its first refused round and goes round
/// once more, so that a release between the two is not missed. A waiter
/// that finds the subscription on every node already there (another
/// waiter on the same connections listens, or did a moment ago, like the
/// releaser of a handoff queueing again) sends its refused first round and
/// sleeps: as many script calls as a refused try, not two rounds. The two
/// waiters here are two clients over one backend, so that the second is
/// not coalesced with the first inside one client.
async fn listening_waiter() -> Result<(), Failed> {
    let nodes = blocking(three_nodes).await?;
    let ports: Vec<u16> = nodes.iter().map(|n| n.port).collect();
    // No entry needs renewing while the counts are taken.
    let url = url(
        &nodes,
        "&fifo=true&queue_lease_ms=60000&node_timeout_ms=5000",
    );
    let holder = LockClient::new(RedlockBackend::connect(&url).await?);
    let shared: distlock_core::DynBackend = Arc::new(RedlockBackend::connect(&url).await?);
    let (waiters, others) = (
        LockClient::from_dyn(shared.clone()),
        LockClient::from_dyn(shared),
    );
    let name = "listening-waiter";
    let settled = || settled_script_calls(&ports);
    let warm = waiters.lock("warm-up").try_acquire().await?;
    warm.ok_or("free lock refused")?.release().await?;
    let g = holder
        .lock(name)
        .ttl(Duration::from_secs(60))
        .try_acquire()
        .await?
        .ok_or("free lock refused")?;
    let start = settled().await;
    if waiters.lock(name).try_acquire().await?.is_some() {
        return Err("granted twice".into());
    }
    let tried = settled().await;
    // A round is one script call per node; on a loaded machine a release
    // can follow it, to a node that had not answered when the others
    // refused. So a count says at least how many rounds were sent, and
    // fewer than twice a round's calls is one round.
    let round = ports.len() as u64;
    if tried - start < round {
        return Err(format!(
            "a refused try sent {} script calls; a round is {round}",
            tried - start
        )
        .into());
    }
    let wait = |c: &LockClient| {
        let c = c.clone();
        tokio::spawn(async move {
            c.lock(name)
                .wait(Duration::from_secs(30))
                .acquire()
                .await
                .map(|g| g.token())
        })
    };
    let first = wait(&waiters);
    let queued = settled_past(&ports, tried + 2 * round).await;
    if queued - tried < 2 * round {
        return Err(format!(
            "the first waiter sent {} script calls; expected two rounds of {round}",
            queued - tried
        )
        .into());
    }
    let second = wait(&others);
    let sent = settled_past(&ports, queued + round).await - queued;
    if sent < round || sent >= 2 * round {
        return Err(format!(
            "the second waiter sent {sent} script calls before sleeping; expected one round of {round}"
        )
        .into());
    }
    g.release().await?;
    // Each waiter's guard is dropped as it is granted, which hands the
    // lock to the next.
    for w in [first, second] {
        tokio::time::timeout(Duration::from_secs(20), w)
            .await
            .map_err(|_| "a waiter was not woken")?
            .map_err(|e| e.to_string())??;
    }
    Ok(())
}

/// The script calls the nodes on `ports` have answered, summed.
fn script_calls(ports: &[u16]) -> u64 {
    ports
        .iter()
        .map(|p| server::calls(*p, &["evalsha", "eval"]))
        .sum()
}

/// [`script_calls`] once nothing more arrives for 600 ms: a round or a
/// release returns at a majority, and what it sent the last node (a grant,
/// a fencing write-back, a release) lands after it, late on a loaded
/// machine.
async fn settled_script_calls(ports: &[u16]) -> u64 {
    let (mut last, mut quiet) = (script_calls(ports), 0);
    while quiet < 3 {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let now = script_calls(ports);
        quiet = if now == last { quiet + 1 } else { 0 };
        last = now;
    }
    last
}

/// [`settled_script_calls`] once the count has reached `least` (within
/// 10 s): a task just spawned may not have sent anything yet.
async fn settled_past(ports: &[u16], least: u64) -> u64 {
    let start = Instant::now();
    while script_calls(ports) < least && start.elapsed() < Duration::from_secs(10) {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    settled_script_calls(ports).await
}

/// On how many of the nodes at `ports` the key `key` exists.
async fn held_on(ports: &[u16], key: &str) -> Result<usize, Failed> {
    let (ports, key) = (ports.to_vec(), key.to_owned());
    blocking(move || {
        ports.iter().try_fold(0, |n, p| {
            let reply = server::command(*p, &["EXISTS", &key])
                .ok_or_else(|| Failed::from("no reply to EXISTS"))?;
            Ok(n + usize::from(reply.starts_with(":1")))
        })
    })
    .await
}

/// Nodes that keep no data across a restart are a warning of the
/// deployment checks, each node named; with `delayed_restart_ms` they are
/// not, and the finding says what covers them, unless fencing is on (the
/// quarantine does not bring a lost counter back).
async fn persistence_findings() -> Result<(), Failed> {
    let nodes = blocking(three_nodes).await?;
    let ports: Vec<u16> = nodes.iter().map(|n| n.port).collect();
    for (options, warned) in [
        ("", true),
        ("delayed_restart_ms=2000", false),
        ("delayed_restart_ms=2000&fencing=true", true),
    ] {
        let b = RedlockBackend::connect(&server::redlock_url(ports.clone(), options)).await?;
        let found = distlock_core::Backend::deployment_findings(&b).await?;
        let persistence: Vec<_> = found
            .iter()
            .filter(|f| f.setting.ends_with(" persistence"))
            .collect();
        if persistence.len() != 3
            || persistence.iter().any(|f| f.warning.is_some() != warned)
            || (!warned
                && !persistence.iter().all(|f| {
                    f.value
                        .as_ref()
                        .is_ok_and(|v| v.contains("delayed_restart_ms"))
                }))
        {
            return Err(format!("with {options:?}: {persistence:?}").into());
        }
    }
    drop(nodes);
    Ok(())
}

fn three_nodes() -> Result<Vec<ServerProcess>, Failed> {
    (0..3)
        .map(|_| server::spawn(&[]).map_err(|e| Failed::from(e.to_string())))
        .collect()
}

/// The lock `name` (its waiters taking it shared, or exclusively) and its
/// wait queue's key.
fn queued_lock(name: &str, shared: bool) -> (fifo::Queued, String) {
    let what = if shared {
        fifo::Queued::shared(name)
    } else {
        name.into()
    };
    (what, distlock_redis::Keys::queue_of(name))
}

/// The semaphore `name` of three permits and its wait queue's key.
fn queued_semaphore(name: &str) -> (fifo::Queued, String) {
    let n = LockName::new(name).expect("a valid name");
    (
        fifo::Queued::semaphore(name, 3),
        distlock_redis::SemaphoreKeys::new("", &n).queue,
    )
}

/// The election `name` and its wait queue's key.
fn queued_election(name: &str) -> (fifo::Queued, String) {
    let n = LockName::new(name).expect("a valid name");
    (
        fifo::Queued::election(name),
        distlock_redis::ElectionKeys::new("", &n).queue,
    )
}

fn fifo_connect() -> fifo::Connect {
    Arc::new(|url: String| {
        Box::pin(async move { Ok(LockClient::new(RedlockBackend::connect(&url).await?)) })
    })
}

/// The entries of `name`'s wait queue, when every node holds as many; while
/// the nodes disagree (a waiter joining or leaving), `u64::MAX`, which
/// matches no count a case waits for or accepts.
fn fifo_queued(ports: Vec<u16>, name: &str) -> fifo::Count {
    fifo_queue_len(ports, distlock_redis::Keys::queue_of(name))
}

/// The entries of the wait queue `key` (see [`fifo_queued`]).
fn fifo_queue_len(ports: Vec<u16>, key: String) -> fifo::Count {
    let each = fifo_queue_counts(ports, key);
    Arc::new(move || {
        let counts = each()?;
        Ok(match counts.split_first() {
            Some((first, rest)) if rest.iter().all(|n| n == first) => *first,
            _ => u64::MAX,
        })
    })
}

/// The entries of the wait queue `key` on each node.
fn fifo_queue_counts(
    ports: Vec<u16>,
    key: String,
) -> Arc<dyn Fn() -> Result<Vec<u64>, Failed> + Send + Sync> {
    Arc::new(move || {
        let mut counts = Vec::with_capacity(ports.len());
        for port in &ports {
            let reply = server::command(*port, &["ZCARD", &key]).ok_or("no reply to ZCARD")?;
            let n = reply
                .strip_prefix(':')
                .and_then(|r| r.split('\r').next())
                .and_then(|r| r.parse::<u64>().ok())
                .ok_or_else(|| format!("ZCARD answered {reply:?}"))?;
            counts.push(n);
        }
        Ok(counts)
    })
}

/// Twenty waiters' grants come in arrival order, and only the head asks:
/// every release is one script call per node, and so is every grant's
/// round. Entries here last a minute, so nobody renews one while the test
/// counts. Readers (`what` a shared lock) queued behind a writer are told
/// together and hold together, at the same cost per reader.
async fn fifo_order(
    (what, queue): (fifo::Queued, String),
    holds: u64,
    together: bool,
) -> Result<(), Failed> {
    let nodes = blocking(three_nodes).await?;
    let ports: Vec<u16> = nodes.iter().map(|n| n.port).collect();
    let url = url(&nodes, "&fifo=true&queue_lease_ms=60000");
    let counted = ports.clone();
    let requests: fifo::Count = Arc::new(move || {
        Ok(counted
            .iter()
            .map(|p| server::calls(*p, &["evalsha", "eval"]))
            .sum())
    });
    let n = 20;
    let early = if together { 12 } else { 7 };
    fifo::grants_in_arrival_order(
        fifo_connect(),
        &url,
        what,
        n,
        fifo_queue_len(ports, queue),
        requests,
        // The holder's `holds` releases, 20 rounds and 20 releases, of 3
        // calls each. A release or round returns once a quorum answered,
        // and its third node's call, still unsent when the node timeout
        // passes (a loaded machine), is dropped: at least 2 calls each. A head woken by one
        // node's message that waits out the others' (a loaded machine)
        // tries once too early: a round and its rollback, 6 calls more.
        // Readers told `together` all go round at once, and any of them
        // may be that early once. A waiter other than the head asking at a
        // handoff would cost 6 calls per waiter woken, at every handoff.
        4 * n as u64 + 2 * holds..=early * n as u64 + 3 * holds,
    )
    .await
}

async fn fifo_last_reader() -> Result<(), Failed> {
    let nodes = blocking(three_nodes).await?;
    let ports: Vec<u16> = nodes.iter().map(|n| n.port).collect();
    let url = url(&nodes, "&fifo=true&queue_lease_ms=60000");
    let name = "fifo/last-reader";
    fifo::the_last_readers_release_wakes_a_queued_writer(
        fifo_connect(),
        &url,
        name,
        fifo_queued(ports, name),
    )
    .await
}

/// With fencing, so that the grants' order shows in their tokens, and a
/// node timeout long enough that no node misses a waiter's first round on
/// a loaded machine (a waiter comes back only when its entry needs
/// renewing, 20 s here).
async fn fifo_readers() -> Result<(), Failed> {
    let nodes = blocking(three_nodes).await?;
    let ports: Vec<u16> = nodes.iter().map(|n| n.port).collect();
    let url = url(
        &nodes,
        "&fifo=true&fencing=true&queue_lease_ms=60000&node_timeout_ms=2000",
    );
    let name = "fifo/readers";
    fifo::readers_never_pass_a_queued_writer(
        fifo_connect(),
        &url,
        name,
        fifo_queue_of_most(ports, distlock_redis::Keys::queue_of(name)),
    )
    .await
}

/// The entries of the wait queue `key` as most nodes hold it. A waiter
/// granted by a majority keeps its entry on a node that refused its last
/// round until it releases (the first reader here, then the writer), so
/// the nodes can disagree for as long as it holds.
fn fifo_queue_of_most(ports: Vec<u16>, key: String) -> fifo::Count {
    let each = fifo_queue_counts(ports, key);
    Arc::new(move || {
        let counts = each()?;
        let mut sorted = counts.clone();
        sorted.sort_unstable();
        let most = sorted[sorted.len() / 2];
        if counts.iter().filter(|c| **c == most).count() * 2 > counts.len() {
            Ok(most)
        } else {
            Ok(u64::MAX)
        }
    })
}

async fn fifo_writer_leaves() -> Result<(), Failed> {
    let nodes = blocking(three_nodes).await?;
    let ports: Vec<u16> = nodes.iter().map(|n| n.port).collect();
    let url = url(&nodes, "&fifo=true&queue_lease_ms=60000");
    let name = "fifo/leaves";
    fifo::a_writer_that_leaves_lets_the_readers_behind_it_in(
        fifo_connect(),
        &url,
        name,
        fifo_queued(ports, name),
    )
    .await
}

async fn fifo_cancel((what, queue): (fifo::Queued, String)) -> Result<(), Failed> {
    let nodes = blocking(three_nodes).await?;
    let ports: Vec<u16> = nodes.iter().map(|n| n.port).collect();
    let lease = Duration::from_secs(60);
    let url = url(
        &nodes,
        &format!("&fifo=true&queue_lease_ms={}", lease.as_millis()),
    );
    fifo::a_cancelled_or_timed_out_waiter_leaves_no_entry(
        fifo_connect(),
        &url,
        what,
        lease,
        fifo_queue_len(ports, queue),
    )
    .await
}

/// A node that is another node's server reached through a second address
/// (here a TCP proxy) answers with the same run id and is refused: three
/// nodes of which two are one server would let one server's vote count
/// twice. The same nodes through one proxy each are three servers.
async fn one_server_twice() -> Result<(), Failed> {
    let nodes = blocking(three_nodes).await?;
    let ports: Vec<u16> = nodes.iter().map(|n| n.port).collect();
    let proxies = ports
        .iter()
        .map(|p| Proxy::start(*p).map_err(|e| Failed::from(e.to_string())))
        .collect::<Result<Vec<_>, Failed>>()?;
    let twice = server::redlock_url([ports[0], ports[1], proxies[0].port], "");
    match RedlockBackend::connect(&twice).await {
        Err(Error::InvalidInput { message, .. }) => {
            if !message.contains("same run id") {
                return Err(format!("not named as one server: {message}").into());
            }
        }
        Err(e) => return Err(format!("refused for another reason: {e}").into()),
        Ok(_) => return Err("one server under two addresses was accepted as two nodes".into()),
    }
    let proxied = server::redlock_url(proxies.iter().map(|p| p.port), "");
    let client = LockClient::new(RedlockBackend::connect(&proxied).await?);
    let g = client.lock("distinct").try_acquire().await?;
    g.ok_or("a free lock was refused")?.release().await?;

    // A node down at connect that later answers as another node's server
    // is not used, and not connected to again on every request.
    let later = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let url = server::redlock_url([ports[0], ports[1], later], "");
    let client = LockClient::new(RedlockBackend::connect(&url).await?);
    let again = Proxy::start_on(later, ports[0]).map_err(|e| Failed::from(e.to_string()))?;
    for i in 0..20 {
        let g = client.lock(format!("later/{i}")).try_acquire().await?;
        g.ok_or("a free lock was refused")?.release().await?;
    }
    // One connect (the backend's connections for commands and for its
    // release channel) is 3 connections here; one per lock would be 20
    // more.
    let connections = again.accepted();
    if connections > 3 {
        return Err(format!(
            "{connections} connections to the node that is another's server over 20 locks"
        )
        .into());
    }
    Ok(())
}

/// A free lock whose queue a waiter heads on every node is refused to a
/// `try_acquire`: here the waiter is cut off (its connections through
/// proxies that then drop everything), so the lock stays free while its
/// entries live, and a try succeeds only once they have lapsed.
async fn fifo_try() -> Result<(), Failed> {
    let nodes = blocking(three_nodes).await?;
    let ports: Vec<u16> = nodes.iter().map(|n| n.port).collect();
    let lease = Duration::from_secs(3);
    let options = format!("&fifo=true&queue_lease_ms={}", lease.as_millis());
    let url = url(&nodes, &options);
    let proxies = ports
        .iter()
        .map(|p| Proxy::start(*p).map_err(|e| Failed::from(e.to_string())))
        .collect::<Result<Vec<_>, Failed>>()?;
    let proxied = server::redlock_url(proxies.iter().map(|p| p.port), &options);
    let name = "fifo/try";
    let queued = fifo_queued(ports, name);
    let holder = LockClient::new(RedlockBackend::connect(&url).await?);
    let g = holder
        .lock(name)
        .ttl(Duration::from_secs(30))
        .acquire()
        .await?;
    let waiter = LockClient::new(RedlockBackend::connect(&proxied).await?);
    let waiting = tokio::spawn(async move {
        waiter
            .lock(name)
            .ttl(Duration::from_secs(30))
            .wait(Duration::from_secs(60))
            .acquire()
            .await
    });
    let start = Instant::now();
    while queued()? != 1 {
        if start.elapsed() > Duration::from_secs(20) {
            return Err("the waiter did not queue on every node".into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for p in &proxies {
        p.set_blackhole(true);
    }
    g.release().await?;
    let other = LockClient::new(RedlockBackend::connect(&url).await?);
    let cut = Instant::now();
    if other.lock(name).try_acquire().await?.is_some() {
        return Err("a try took the lock ahead of the queue's head".into());
    }
    // Once the entries lapse (a lease after the waiter's last round) the
    // try goes through.
    let got = loop {
        if let Some(g) = other.lock(name).try_acquire().await? {
            break g;
        }
        if cut.elapsed() > lease * 2 + Duration::from_secs(5) {
            return Err("the cut-off waiter's entries held the lock up past their lease".into());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let took = cut.elapsed();
    got.release().await?;
    waiting.abort();
    for p in &proxies {
        p.set_blackhole(false);
    }
    if took < lease / 3 {
        return Err(format!(
            "a try went through {took:?} after the cut, before the entries could lapse"
        )
        .into());
    }
    Ok(())
}

/// The cut-off waiter reaches each node through a proxy of its own, and
/// all three then drop everything; entries last 3 s (the default).
async fn fifo_cut((what, queue): (fifo::Queued, String)) -> Result<(), Failed> {
    let nodes = blocking(three_nodes).await?;
    let ports: Vec<u16> = nodes.iter().map(|n| n.port).collect();
    let url = url(&nodes, "&fifo=true");
    let proxies = ports
        .iter()
        .map(|p| Proxy::start(*p).map_err(|e| Failed::from(e.to_string())))
        .collect::<Result<Vec<_>, Failed>>()?;
    let proxied = server::redlock_url(proxies.iter().map(|p| p.port), "&fifo=true");
    fifo::a_cut_off_waiter_holds_up_the_queue_only_until_its_entry_lapses(
        fifo_connect(),
        &url,
        &proxied,
        &proxies,
        what,
        distlock_redlock::RedlockConfig::default().queue_lease,
        fifo_queue_len(ports, queue),
    )
    .await
}
