//! Smoke tests of the harness: each server kind starts, answers one real

//! command from its own client, and is torn down.

use integration_tests::harness::process::run_client;
use integration_tests::harness::{
    etcd, mariadb, postgres, redis, zookeeper, ServerKind, TestServer,
};
use libtest_mimic::{Arguments, Failed, Trial};

fn start(kind: ServerKind) -> Result<TestServer, Failed> {
    TestServer::start(kind).map_err(|e| Failed::from(e.to_string()))
}

fn expect(what: &str, got: Result<String, String>, want: &str) -> Result<(), Failed> {
    let got = got.map_err(Failed::from)?;
    if got.contains(want) {
        Ok(())
    } else {
        Err(format!("{what}: expected {want:?} in {got:?}").into())
    }
}

fn redis_answers_set_and_get() -> Result<(), Failed> {
    let s = start(ServerKind::Redis)?;
    let set =
        redis::command(s.port(), &["SET", "distlock:smoke", "42"]).ok_or("no reply to SET")?;
    expect("SET", Ok(set), "+OK")?;
    let get = redis::command(s.port(), &["GET", "distlock:smoke"]).ok_or("no reply to GET")?;
    expect("GET", Ok(get), "$2\r\n42")
}

fn etcd_answers_put_and_get() -> Result<(), Failed> {
    let s = start(ServerKind::Etcd)?;
    let ep = format!("{}:{}", s.host(), s.port());
    let mut put = etcd::etcdctl(&ep).map_err(|e| e.to_string())?;
    put.args(["put", "distlock/smoke", "42"]);
    expect("etcdctl put", run_client(put), "OK")?;
    let mut get = etcd::etcdctl(&ep).map_err(|e| e.to_string())?;
    get.args(["get", "distlock/smoke", "--print-value-only"]);
    expect("etcdctl get", run_client(get), "42")
}

fn zookeeper_answers_create_and_get() -> Result<(), Failed> {
    let s = start(ServerKind::ZooKeeper)?;
    let server = format!("{}:{}", s.host(), s.port());
    let create =
        zookeeper::cli(&server, &["create", "/distlock-smoke", "42"]).map_err(|e| e.to_string())?;
    // zkCli reports "Created" on stderr; the get below proves the node exists.
    run_client(create).map_err(Failed::from)?;
    let get = zookeeper::cli(&server, &["get", "/distlock-smoke"]).map_err(|e| e.to_string())?;
    expect("zkCli get", run_client(get), "42")
}

fn postgres_answers_select() -> Result<(), Failed> {
    let s = start(ServerKind::Postgres)?;
    let mut q = postgres::psql(s.url()).map_err(|e| e.to_string())?;
    q.args(["-c", "SELECT 40 + 2"]);
    expect("psql", run_client(q), "42")
}

fn mariadb_answers_select() -> Result<(), Failed> {
    let s = start(ServerKind::MariaDb)?;
    let mut q = mariadb::client(s.port()).map_err(|e| e.to_string())?;
    q.args([mariadb::DATABASE, "-e", "SELECT 40 + 2"]);
    expect("mariadb", run_client(q), "42")
}

/// Teardown really stops the server: its port stops answering.
fn redis_is_stopped_on_drop() -> Result<(), Failed> {
    let s = start(ServerKind::Redis)?;
    let port = s.port();
    if s.process().is_none() {
        return Ok(());
    }
    if !redis::ping(port) {
        return Err("server not answering before drop".into());
    }
    drop(s);
    if redis::ping(port) {
        return Err(
            format!("redis on port {port} still answers after its TestServer was dropped").into(),
        );
    }
    Ok(())
}

fn missing_binary_error_says_how_to_install() -> Result<(), Failed> {
    let e = integration_tests::harness::process::find_binary(
        "surely-not-a-server",
        &[],
        redis::INSTALL,
    )
    .err()
    .ok_or("found a binary that does not exist")?
    .to_string();
    if e.contains("apt-get install") && e.contains("surely-not-a-server") {
        Ok(())
    } else {
        Err(format!("unhelpful message: {e}").into())
    }
}

#[cfg(feature = "containers")]
fn containers_provider_fails_fast_without_docker() -> Result<(), Failed> {
    use integration_tests::harness::containers;
    let start = std::time::Instant::now();
    let r = containers::start(ServerKind::Redis, Some("unix:///nonexistent/docker.sock"));
    let took = start.elapsed();
    let e = r
        .err()
        .ok_or("started a container without Docker")?
        .to_string();
    if !e.contains("no Docker daemon reachable") {
        return Err(format!("unclear message: {e}").into());
    }
    if took > std::time::Duration::from_secs(10) {
        return Err(format!("took {took:?} to report that Docker is missing").into());
    }
    Ok(())
}

fn main() {
    integration_tests::init_tracing();
    let args = Arguments::from_args();
    #[allow(unused_mut)]
    let mut trials = vec![
        Trial::test(
            "harness::redis_answers_set_and_get",
            redis_answers_set_and_get,
        ),
        Trial::test(
            "harness::etcd_answers_put_and_get",
            etcd_answers_put_and_get,
        ),
        Trial::test(
            "harness::zookeeper_answers_create_and_get",
            zookeeper_answers_create_and_get,
        ),
        Trial::test("harness::postgres_answers_select", postgres_answers_select),
        Trial::test("harness::mariadb_answers_select", mariadb_answers_select),
        Trial::test(
            "harness::redis_is_stopped_on_drop",
            redis_is_stopped_on_drop,
        ),
        Trial::test(
            "harness::missing_binary_error_says_how_to_install",
            missing_binary_error_says_how_to_install,
        ),
    ];
    #[cfg(feature = "containers")]
    trials.push(Trial::test(
        "harness::containers_provider_fails_fast_without_docker",
        containers_provider_fails_fast_without_docker,
    ));
    libtest_mimic::run(&args, trials).exit();
}
