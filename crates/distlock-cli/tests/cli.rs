//! End-to-end tests of the `distlock` binary, as real processes, on SQLite
//! and on a harness-started redis-server.

// Test helpers: a failed spawn or write should abort the test loudly.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

fn bin() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_distlock"));
    c.env_remove("DISTLOCK_BACKEND")
        .env_remove("DISTLOCK_PASSWORD")
        .env("RUST_LOG", "error")
        .stdin(Stdio::null());
    c
}

fn scratch(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!(
        "distlock-cli-{tag}-{}-{}",
        std::process::id(),
        &distlock::Owner::random().to_string()[..8]
    ));
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn sqlite_in(dir: &Path) -> String {
    format!("sqlite://{}", dir.join("locks.db").display())
}

fn sqlite(tag: &str) -> String {
    sqlite_in(&scratch(tag))
}

/// A password-protected redis-server for one test, stopped when dropped
/// (per test, not in a `static`: statics are never dropped, so a shared
/// server would outlive the test process).
#[cfg(feature = "redis")]
struct Redis {
    url: String,
    _server: integration_tests::harness::ServerProcess,
}

#[cfg(feature = "redis")]
fn redis() -> Redis {
    let server = integration_tests::harness::redis::spawn(&["--requirepass", "s3cret"])
        .expect("redis-server must start; run scripts/test.sh to install it");
    Redis {
        url: format!("redis://:s3cret@127.0.0.1:{}", server.port),
        _server: server,
    }
}

/// `distlock run`, with options `extra`, of `cmd` under the lock `name`.
fn run_command(backend: &str, extra: &[&str], name: &str, cmd: &[&str]) -> Command {
    let mut c = bin();
    c.args(["run", "--backend", backend])
        .args(extra)
        .args([name, "--"])
        .args(cmd);
    c
}

fn run(backend: &str, extra: &[&str], name: &str, cmd: &[&str]) -> Output {
    run_command(backend, extra, name, cmd).output().unwrap()
}

/// Starts `distlock run` of `cmd` on `name` without waiting for it.
fn spawn_run(backend: &str, extra: &[&str], name: &str, cmd: &[&str]) -> Child {
    run_command(backend, extra, name, cmd).spawn().unwrap()
}

fn spawn_holder(backend: &str, name: &str, secs: u32) -> Child {
    spawn_run(backend, &[], name, &["sleep", &secs.to_string()])
}

/// Starts `count` runs of `sh -c script` on `name` at once and checks that
/// each one succeeds.
fn run_together(count: usize, backend: &str, extra: &[&str], name: &str, script: &str) {
    let children: Vec<Child> = (0..count)
        .map(|_| spawn_run(backend, extra, name, &["sh", "-c", script]))
        .collect();
    for mut c in children {
        assert!(c.wait().unwrap().success());
    }
}

/// The `distlock status --json` report of `name`, with `extra` options.
fn status_json(backend: &str, name: &str, extra: &[&str]) -> String {
    let out = bin()
        .args(["status", name, "--json", "--backend", backend])
        .args(extra)
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn wait_held(backend: &str, name: &str) {
    let start = Instant::now();
    loop {
        if status_json(backend, name, &[]).contains("\"held\":true") {
            return;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "lock {name} never held"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn code(o: &Output) -> i32 {
    o.status.code().unwrap_or(-1)
}

#[test]
fn child_exit_code_and_signal_pass_through() {
    let dir = scratch("exit");
    let b = sqlite_in(&dir);
    assert_eq!(code(&run(&b, &[], "exit/code", &["sh", "-c", "exit 7"])), 7);
    assert_eq!(
        code(&run(&b, &[], "exit/signal", &["sh", "-c", "kill -9 $$"])),
        128 + 9
    );
    assert_eq!(
        code(&run(&b, &[], "exit/missing", &["/no/such/command"])),
        127
    );
    // A file that is not executable (root too needs an execute bit).
    let plain = dir.join("not-executable");
    std::fs::write(&plain, "#!/bin/sh\nexit 0\n").unwrap();
    let plain = plain.to_str().unwrap();
    assert_eq!(code(&run(&b, &[], "exit/plain", &[plain])), 126);
    // Neither failure to start leaves the lock held.
    for name in ["exit/missing", "exit/plain"] {
        assert_eq!(
            code(&run(&b, &["--wait", "0"], name, &["true"])),
            0,
            "{name}"
        );
    }
}

fn env_reaches_child(backend: &str, shown: &str) {
    let out = run(
        backend,
        &[],
        "env/check",
        &[
            "sh",
            "-c",
            "echo \"$DISTLOCK_NAME|$DISTLOCK_TOKEN|$DISTLOCK_BACKEND\"",
        ],
    );
    assert_eq!(code(&out), 0, "{}", String::from_utf8_lossy(&out.stderr));
    let line = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let parts: Vec<&str> = line.split('|').collect();
    assert_eq!(parts[0], "env/check");
    assert!(
        parts[1].parse::<u64>().is_ok_and(|t| t > 0),
        "token {:?}",
        parts[1]
    );
    assert_eq!(parts[2], shown);
}

#[test]
fn environment_reaches_the_child_without_password() {
    let b = sqlite("env");
    env_reaches_child(&b, &b);
    #[cfg(feature = "redis")]
    {
        let r = redis();
        env_reaches_child(&r.url, &r.url.replace(":s3cret@", ":***@"));
    }
}

fn not_acquired_is_75(backend: &str) {
    let holder = spawn_holder(backend, "busy/lock", 60);
    wait_held(backend, "busy/lock");
    let start = Instant::now();
    assert_eq!(
        code(&run(backend, &["--wait", "0"], "busy/lock", &["true"])),
        75
    );
    assert_eq!(
        code(&run(backend, &["--wait", "300ms"], "busy/lock", &["true"])),
        75
    );
    assert!(start.elapsed() >= Duration::from_millis(300));
    // distlock forwards the signal to its command and releases.
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(i32::try_from(holder.id()).unwrap()),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    holder.wait_with_output().unwrap();
}

#[test]
fn lock_held_elsewhere_gives_75() {
    not_acquired_is_75(&sqlite("busy"));
    #[cfg(feature = "redis")]
    not_acquired_is_75(&redis().url);
}

/// A lease that ends (no renewal, short TTL) stops the command with SIGTERM
/// and exits 76; the command never reaches its end.
#[test]
fn lost_lease_stops_the_child_with_76() {
    #[allow(unused_mut)]
    let mut backends = vec![sqlite("lost")];
    #[cfg(feature = "redis")]
    let redis = redis();
    #[cfg(feature = "redis")]
    backends.push(redis.url.clone());
    for b in backends {
        let marker = scratch("marker").join("finished");
        let start = Instant::now();
        let out = run(
            &b,
            &["--ttl", "1s", "--no-renew", "--kill-after", "2s"],
            "lost/lease",
            &["sh", "-c", &format!("sleep 20; touch {}", marker.display())],
        );
        assert_eq!(code(&out), 76, "{}", String::from_utf8_lossy(&out.stderr));
        assert!(
            start.elapsed() < Duration::from_secs(15),
            "the child was not stopped"
        );
        assert!(!marker.exists());
    }
}

/// After a lost lease the command's whole process group goes: a process
/// the command started that ignores SIGTERM is killed after --kill-after
/// even when the command itself exited at once, before distlock exits.
#[test]
fn a_lost_lease_kills_what_the_command_started_too() {
    let b = sqlite("lost-group");
    let marker = scratch("group").join("ran");
    let started = Instant::now();
    let out = run(
        &b,
        &["--ttl", "1s", "--no-renew", "--kill-after", "1s"],
        "lost/group",
        &[
            "sh",
            "-c",
            &format!(
                "(trap '' TERM; sleep 4; touch {}) & sleep 20",
                marker.display()
            ),
        ],
    );
    assert_eq!(code(&out), 76, "{}", String::from_utf8_lossy(&out.stderr));
    // Well past when the ignored SIGTERM would have let it finish.
    std::thread::sleep(
        (started + Duration::from_secs(6)).saturating_duration_since(Instant::now()),
    );
    assert!(
        !marker.exists(),
        "a process of the command's group outlived the lost lease"
    );
}

/// A command that ignores SIGTERM is killed after --kill-after.
#[test]
fn child_ignoring_sigterm_is_killed_after_grace() {
    let b = sqlite("stubborn");
    let start = Instant::now();
    let out = run(
        &b,
        &["--ttl", "1s", "--no-renew", "--kill-after", "1s"],
        "stubborn",
        &["sh", "-c", "trap '' TERM; sleep 30"],
    );
    assert_eq!(code(&out), 76);
    assert!(start.elapsed() < Duration::from_secs(15));
}

/// Runs `true` under a lock on `backend`, checks that distlock exits with
/// `want` and a message naming `what`, and returns that message.
fn refused(backend: &str, want: i32, what: &str) -> String {
    let out = run(backend, &[], "x", &["true"]);
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(code(&out), want, "{backend}: {err}");
    assert!(
        err.contains(what),
        "{backend}: the message does not name {what}: {err}"
    );
    err
}

/// Nothing listens: the OS refuses the connection at once, and so does
/// distlock, naming the address it tried. The bound is generous for a
/// loaded machine; a pool's retries would take 5-10 s.
#[test]
fn unreachable_backend_gives_69_at_once() {
    for (b, shown) in [
        ("redis://127.0.0.1:1", "127.0.0.1:1"),
        ("redis+sentinel://127.0.0.1:1/mymaster", "127.0.0.1:1"),
        ("redis+cluster://127.0.0.1:1", "127.0.0.1:1"),
        (
            "redlock://127.0.0.1:1,127.0.0.1:2,127.0.0.1:3",
            "3 unreachable",
        ),
        ("postgres://u@127.0.0.1:1/db", "127.0.0.1:1"),
        ("postgres:///db?host=127.0.0.1&port=1", "127.0.0.1:1"),
        ("mysql://u@127.0.0.1:1/db", "127.0.0.1:1"),
        ("etcd://127.0.0.1:1", "127.0.0.1:1"),
        ("zk://127.0.0.1:1", "127.0.0.1:1"),
        ("zk://127.0.0.1:1,127.0.0.1:2", "127.0.0.1:2"),
    ] {
        let start = Instant::now();
        let err = refused(b, 69, shown);
        let took = start.elapsed();
        assert!(
            took < Duration::from_secs(3),
            "{b}: reported after {took:?}: {err}"
        );
    }
    // `observe`, which retries a backend that stops answering once it is
    // connected, does not retry one unreachable at its start.
    let start = Instant::now();
    let out = bin()
        .args(["observe", "--backend", "redis://127.0.0.1:1", "x"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(code(&out), 69, "observe: {err}");
    assert!(start.elapsed() < Duration::from_secs(3), "observe: {err}");
}

/// A Redlock of three nodes of which only one answers at the start: no
/// lock can be granted, so `run` without `--wait` exits 69 at once, as for
/// a single server that does not answer, rather than retrying for ever.
#[cfg(feature = "redlock")]
#[test]
fn a_redlock_with_a_majority_unreachable_gives_69_at_once() {
    let node = integration_tests::harness::redis::spawn(&[]).unwrap();
    let url = format!("redlock://127.0.0.1:{},127.0.0.1:1,127.0.0.1:2", node.port);
    let mut child = run_command(&url, &[], "minority", &["true"])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let status = exit_within(&mut child, Duration::from_secs(15));
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
    assert_eq!(status.code(), Some(69), "{err}");
    assert!(err.contains("1 of 3 nodes answered"), "{err}");
}

/// The server answers and refuses the configuration: exit 78, a message
/// saying what to change, at once.
#[cfg(feature = "redis")]
#[test]
fn refused_configuration_gives_78() {
    let r = redis();
    let port = r.url.rsplit(':').next().unwrap();
    let dir = scratch("config");
    let cases = [
        (format!("redis://:wrong@127.0.0.1:{port}"), "password"),
        (format!("{}/99", r.url), "database index"),
        (format!("sqlite://{}", dir.display()), "path"),
    ];
    let plain = integration_tests::harness::redis::spawn(&[]).unwrap();
    let not_a_sentinel = format!("redis+sentinel://127.0.0.1:{}/m", plain.port);
    let cases = cases
        .into_iter()
        .chain([(not_a_sentinel, "not a Sentinel")]);
    for (b, what) in cases {
        let err = refused(&b, 78, what);
        assert!(
            !err.to_lowercase().contains("retrying later"),
            "{b}: called retryable: {err}"
        );
    }
}

/// A release the server refuses for good (an ACL without a command the
/// release needs) leaves the lock held for its TTL: exit 78, saying so,
/// whatever the command's own exit status.
#[cfg(feature = "redis")]
#[test]
fn a_release_refused_by_the_server_exits_78() {
    use integration_tests::harness::redis::spawn;
    let server = spawn(&[
        "--user",
        "app",
        "on",
        ">app-pw",
        "resetkeys",
        "resetchannels",
        "+@all",
        "-del",
        "~*",
        "&*",
    ])
    .unwrap();
    let backend = format!("redis://app:app-pw@127.0.0.1:{}", server.port);
    let out = run(&backend, &[], "refused-release", &["true"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(code(&out), 78, "{err}");
    assert!(
        err.contains("release of") && err.contains("was refused") && err.contains("TTL"),
        "{err}"
    );
}

/// Every command works on the default backend of a machine without a state
/// directory yet (it is made), while a SQLite file the user names in a
/// directory that does not exist is refused with 78 and nothing is made.
#[test]
fn the_default_backend_works_on_a_fresh_machine_and_a_named_file_is_not_guessed() {
    let home = scratch("fresh");
    let state = home.join("state");
    let fresh = |args: &[&str]| {
        let _ = std::fs::remove_dir_all(&state);
        let out = bin()
            .env("XDG_STATE_HOME", &state)
            .args(args)
            .output()
            .unwrap();
        (
            code(&out),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    for args in [
        &["list"][..],
        &["status", "fresh/x"],
        &["run", "fresh/x", "--", "true"],
    ] {
        let (c, err) = fresh(args);
        assert_eq!(c, 0, "{args:?} on a fresh machine exited {c}: {err}");
        assert!(state.join("distlock/locks.db").exists(), "{args:?}");
    }
    let (c, err) = fresh(&["observe", "--once", "fresh/x"]);
    assert_eq!(c, 75, "observe of an election nobody leads: {err}");
    let missing = home.join("typo/dir");
    let out = run(&sqlite_in(&missing), &[], "fresh/x", &["true"]);
    assert_eq!(code(&out), 78, "{}", String::from_utf8_lossy(&out.stderr));
    assert!(
        !missing.exists(),
        "a directory the user did not ask for was made"
    );
    // A file that is no database, and one opened read-only: retrying
    // cannot help (78). An in-memory database: an invalid URL (2).
    let junk = home.join("junk.db");
    std::fs::write(&junk, vec![b'x'; 8192]).unwrap();
    let made = home.join("made.db");
    let made_url = format!("sqlite://{}", made.display());
    assert_eq!(code(&run(&made_url, &[], "fresh/x", &["true"])), 0);
    for (url, want) in [
        (format!("sqlite://{}", junk.display()), 78),
        (format!("{made_url}?mode=ro"), 78),
        (
            format!("sqlite://{}?mode=memory", home.join("m.db").display()),
            2,
        ),
    ] {
        let out = run(&url, &[], "fresh/x", &["true"]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(code(&out), want, "{url}: {err}");
    }
}

/// The README's first command, run twice on the default backend: the
/// second run's token is above the first's.
#[test]
fn the_quick_start_run_twice_on_the_default_backend_raises_the_token() {
    let state = scratch("quick-start").join("state");
    let token = || {
        let out = bin()
            .env("XDG_STATE_HOME", &state)
            .args(["run", "jobs/demo", "--", "sh", "-c", "echo $DISTLOCK_TOKEN"])
            .output()
            .unwrap();
        assert_eq!(code(&out), 0, "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout)
            .trim()
            .parse::<u64>()
            .unwrap_or_else(|e| panic!("DISTLOCK_TOKEN {:?}: {e}", out.stdout))
    };
    let (first, second) = (token(), token());
    assert!(second > first, "tokens {first} then {second}");
    assert!(state.join("distlock/locks.db").exists());
}

/// No `--help` shows the backend URL taken from the environment, whose
/// password it may carry.
#[test]
fn help_never_shows_the_environments_backend_url() {
    for cmd in [
        "run",
        "elect",
        "observe",
        "status",
        "list",
        "check",
        "conformance",
    ] {
        let out = bin()
            .env("DISTLOCK_BACKEND", "redis://:topsecret@127.0.0.1:1")
            .args([cmd, "--help"])
            .output()
            .unwrap();
        assert_eq!(code(&out), 0, "{cmd} --help: {out:?}");
        let shown = String::from_utf8_lossy(&out.stdout);
        assert!(!shown.contains("topsecret"), "{cmd} --help: {shown}");
    }
}

/// An empty or relative XDG_STATE_HOME counts as unset, as the XDG rules
/// say: the default file is under HOME, the same from every working
/// directory, not a file relative to each (two of which would each grant
/// the same lock).
#[test]
fn an_empty_or_relative_xdg_state_home_falls_back_to_home() {
    let root = scratch("xdg");
    let home = root.join("home");
    let want = format!(
        "sqlite://{}",
        home.join(".local/state/distlock/locks.db").display()
    );
    for (i, xdg) in ["", "relative/state"].into_iter().enumerate() {
        let cwd = root.join(format!("cwd{i}"));
        std::fs::create_dir_all(&cwd).unwrap();
        let out = bin()
            .current_dir(&cwd)
            .env("XDG_STATE_HOME", xdg)
            .env("HOME", &home)
            .args([
                "run",
                "xdg/x",
                "--",
                "sh",
                "-c",
                "printf %s \"$DISTLOCK_BACKEND\"",
            ])
            .output()
            .unwrap();
        assert_eq!(code(&out), 0, "XDG_STATE_HOME={xdg:?}: {out:?}");
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            want,
            "XDG_STATE_HOME={xdg:?}"
        );
    }
}

/// A lock taken away while the command runs, before a renewal could notice
/// (here the command deletes its own lock row), is found by the release
/// after it: exit 76, not the command's 0.
#[test]
fn a_lock_taken_away_before_the_release_exits_76() {
    let b = sqlite("taken-away");
    let path = b.strip_prefix("sqlite://").unwrap();
    let script = format!(
        "import sqlite3; c = sqlite3.connect({path:?}); \
         c.execute(\"DELETE FROM distlock_locks WHERE name = 'taken/away'\"); c.commit()"
    );
    let out = run(
        &b,
        &["--ttl", "30s"],
        "taken/away",
        &["python3", "-c", &script],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(code(&out), 76, "{stderr}");
    assert!(stderr.contains("no longer held"), "{stderr}");
}

/// A release that reaches the backend only after the lease's end (the
/// server stopped answering while the command ran, and answers again after
/// the lease's end) finds it not held, whether or not it was taken while
/// the command ran: exit 76, saying that the hold to the command's end
/// cannot be confirmed, not that it expired or was taken.
#[cfg(feature = "redis")]
#[test]
fn a_release_answered_after_the_lease_ended_exits_76_unconfirmed() {
    // Answered late, and (a shorter timeout, a longer stop) failed late.
    for (timeout_ms, stopped_for) in [(8000, 3500), (2500, 6000)] {
        release_late(timeout_ms, Duration::from_millis(stopped_for));
    }
}

fn release_late(timeout_ms: u32, stopped_for: Duration) {
    let server = integration_tests::harness::redis::spawn(&[]).unwrap();
    let url = format!("redis://127.0.0.1:{}?timeout_ms={timeout_ms}", server.port);
    let pid = server.pid();
    // The command stops the server as it starts and exits a second later,
    // well within the lease; the server goes on `stopped_for` after it
    // stopped, past the lease's end.
    let stop = format!("kill -STOP {pid}; sleep 1; exit 3");
    let running = run_command(
        &url,
        &["--ttl", "3s"],
        "answered/late",
        &["sh", "-c", &stop],
    )
    .stderr(Stdio::piped())
    .spawn()
    .unwrap();
    let stopped = || {
        std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
            s.rsplit_once(')')
                .is_some_and(|(_, r)| r.trim_start().starts_with('T'))
        })
    };
    let start = Instant::now();
    while !stopped() {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "the command never ran"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    std::thread::sleep(stopped_for);
    server.signal("CONT").unwrap();
    let out = running.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(code(&out), 76, "timeout {timeout_ms} ms: {err}");
    assert!(err.contains("cannot be confirmed"), "{err}");
}

/// A `--wait` longer than the clock can count waits for ever: the command
/// runs, it does not panic.
#[test]
fn a_wait_past_the_clocks_range_is_for_ever() {
    let b = sqlite("wait-forever");
    for wait in ["18446744073709551615s", "300000000000y"] {
        let out = run(&b, &["--wait", wait], "wait/forever", &["true"]);
        assert_eq!(code(&out), 0, "{}", String::from_utf8_lossy(&out.stderr));
        let out = bin()
            .args(["elect", "--backend", &b, "--value", "v", "--wait", wait])
            .args(["wait/forever", "--", "true"])
            .output()
            .unwrap();
        assert_eq!(code(&out), 0, "{}", String::from_utf8_lossy(&out.stderr));
    }
}

/// SIGTERM, SIGHUP (a closed terminal) and SIGQUIT to distlock reach the
/// command, in its process group of its own; the lock is released after.
#[test]
fn signals_are_forwarded_and_the_lock_released() {
    let dir = scratch("signal");
    let b = sqlite_in(&dir);
    for sig in ["TERM", "HUP", "QUIT"] {
        // The command says when its trap is set: a signal before that
        // would end it by the default action.
        let ready = dir.join(format!("trapped-{sig}"));
        let child = spawn_run(
            &b,
            &[],
            "sig/lock",
            &[
                "sh",
                "-c",
                &format!(
                    "trap 'exit 9' {sig}; touch '{}'; sleep 30 & wait",
                    ready.display()
                ),
            ],
        );
        assert!(
            appears(&ready, Duration::from_secs(20)),
            "SIG{sig}: the command never set its trap"
        );
        Command::new("kill")
            .args([&format!("-{sig}"), &child.id().to_string()])
            .status()
            .unwrap();
        let out = child.wait_with_output().unwrap();
        assert_eq!(out.status.code(), Some(9), "SIG{sig}: {out:?}");
        assert_eq!(
            code(&run(&b, &["--wait", "0"], "sig/lock", &["true"])),
            0,
            "SIG{sig}: the lock was not released"
        );
    }
}

/// The maximum overlap of `start`/`end` lines appended in time order.
fn most_at_once(log: &str) -> usize {
    let (mut now, mut most) = (0usize, 0usize);
    for line in log.lines() {
        if line.starts_with("start") {
            now += 1;
            most = most.max(now);
        } else {
            now = now.saturating_sub(1);
        }
    }
    most
}

/// A `--limit` other than the semaphore's stored one exits 2 and says how
/// to change it; `distlock set-limit` does, and prints the old limit.
#[test]
fn set_limit_changes_a_semaphores_stored_limit() {
    let b = sqlite("set-limit");
    assert_eq!(code(&run(&b, &["--limit", "3"], "pool/db", &["true"])), 0);
    let refused = run(&b, &["--limit", "2"], "pool/db", &["true"]);
    let err = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(code(&refused), 2, "{err}");
    assert!(
        err.contains("distlock set-limit pool/db N")
            && err.contains("--limit 3")
            && !err.contains("set_limit"),
        "{err}"
    );
    let set = |limit: &str| {
        bin()
            .args(["set-limit", "--backend", &b, "pool/db", limit])
            .output()
            .unwrap()
    };
    let changed = set("2");
    assert_eq!(code(&changed), 0, "{changed:?}");
    assert_eq!(
        String::from_utf8_lossy(&changed.stdout).trim(),
        "semaphore pool/db: limit 2 (was 3)"
    );
    assert_eq!(code(&run(&b, &["--limit", "2"], "pool/db", &["true"])), 0);
    assert!(status_json(&b, "pool/db", &["--semaphore"]).contains("\"limit\":2"));
    // A semaphore with no limit stored yet: the key is there, null.
    let none = status_json(&b, "pool/none", &["--semaphore"]);
    assert!(none.contains("\"limit\":null"), "{none}");
    for bad in ["0", "-1", "many"] {
        assert_eq!(code(&set(bad)), 2, "set-limit {bad}");
    }
}

/// Eight `distlock run --limit 3` at once: never more than three commands
/// run together, and three do at least once.
#[test]
fn limit_3_runs_at_most_three_commands_at_once() {
    let dir = scratch("limit");
    let b = sqlite_in(&dir);
    let log = dir.join("intervals.log");
    let script = format!(
        "echo start >> {0}; sleep 1.5; echo end >> {0}; echo $DISTLOCK_TOKEN >> {0}.tokens",
        log.display()
    );
    let limit = ["--limit", "3", "--wait", "60s"];
    run_together(8, &b, &limit, "shared/pool", &script);
    let text = std::fs::read_to_string(&log).unwrap();
    assert_eq!(text.lines().count(), 16, "{text}");
    let most = most_at_once(&text);
    assert!(
        most <= 3,
        "{most} commands ran at once under --limit 3:\n{text}"
    );
    assert_eq!(most, 3, "never three commands at once among eight:\n{text}");
    let tokens = std::fs::read_to_string(dir.join("intervals.log.tokens")).unwrap();
    let mut seen: Vec<u64> = tokens.lines().map(|t| t.parse().unwrap()).collect();
    seen.sort_unstable();
    seen.dedup();
    assert_eq!(seen.len(), 8, "permit tokens repeated: {tokens}");
    let status = status_json(&b, "shared/pool", &["--semaphore"]);
    assert!(
        status.contains("\"holders\":0") && status.contains("\"limit\":3"),
        "{status}"
    );
    // The stored limit is 3: another one is refused with exit 2.
    let out = run(
        &b,
        &["--limit", "4", "--wait", "0"],
        "shared/pool",
        &["true"],
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(code(&out), 2, "{err}");
    assert!(err.contains('3') && err.contains('4'), "{err}");
}

fn no_overlap(backend: &str, dir: &Path) {
    let log = dir.join("intervals.log");
    let script = format!(
        "echo start $(date +%s%N) >> {0}; sleep 0.05; echo end $(date +%s%N) >> {0}",
        log.display()
    );
    run_together(10, backend, &["--wait", "60s"], "shared/overlap", &script);
    let text = std::fs::read_to_string(&log).unwrap();
    let lines: Vec<(&str, u128)> = text
        .lines()
        .map(|l| {
            let (k, v) = l.split_once(' ').unwrap();
            (k, v.trim().parse().unwrap())
        })
        .collect();
    assert_eq!(lines.len(), 20, "{text}");
    // Appended in time order: overlapping holds would show two starts in a row.
    for pair in lines.chunks(2) {
        assert_eq!(
            (pair[0].0, pair[1].0),
            ("start", "end"),
            "overlapping holds:\n{text}"
        );
        assert!(pair[0].1 <= pair[1].1);
    }
}

#[test]
fn concurrent_runs_never_overlap() {
    let d = scratch("overlap-sqlite");
    no_overlap(&sqlite_in(&d), &d);
    #[cfg(feature = "redis")]
    no_overlap(&redis().url, &scratch("overlap-redis"));
}

#[test]
fn status_and_backends_report() {
    let b = sqlite("status");
    let mut holder = spawn_holder(&b, "status/lock", 5);
    wait_held(&b, "status/lock");
    let out = bin()
        .args(["status", "status/lock", "--backend", &b])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("held:      yes") && text.contains("token:"),
        "{text}"
    );
    holder.kill().unwrap();
    holder.wait().unwrap();
    let out = bin().arg("backends").output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    for scheme in [
        "sqlite://",
        "postgres://",
        "redis://",
        "redlock://",
        "etcd://",
        "zk://",
    ] {
        assert!(text.contains(scheme), "{scheme} missing from:\n{text}");
    }
}

/// Every malformed argument or URL: exit 2, a clear first line, no panic.
#[test]
fn bad_input_exits_2_with_a_clear_message() {
    let long = "x".repeat(201);
    let names = [
        "",
        "has space",
        "/leading",
        "a//b",
        "{tag}",
        "caf\u{e9}",
        &long,
    ];
    let options: [&[&str]; 9] = [
        &["--ttl", "nope"],
        &["--ttl", "10"],
        &["--ttl", "0s"],
        &["--wait", "soon"],
        &["--kill-after", "-1s"],
        &["--limit", "0"],
        &["--limit", "many"],
        &["--limit", "-3"],
        &["--bogus"],
    ];
    let backends = [
        "nonsense",
        "ftp://host/x",
        "redis://",
        "redis://host:notaport",
        "sqlite://",
        "etcd://",
        "zk://",
        "redlock://",
        "redlock://a:1?fencing=maybe",
        // One server listed twice, in the same or another spelling.
        "redlock://127.0.0.1:1,127.0.0.1:1,127.0.0.1:2",
        "redlock://localhost:1,127.0.0.1:1,127.0.0.1:2",
        "redis+sentinel://a:1",
        "redis+sentinel://127.0.0.1:1,127.0.0.1:1/m",
        "redis+sentinel://127.0.0.1:1/m/-5/extra",
        "sqlite:///tmp/x.db?table=bad;name",
        // A parameter sqlx would ignore: this one would connect without TLS.
        "mysql://u@127.0.0.1:1/db?ssl_mode=REQUIRED",
    ];
    let mut cases: Vec<Vec<&str>> = names.iter().map(|n| vec!["run", n, "--", "true"]).collect();
    cases.extend(
        options
            .iter()
            .map(|o| [&["run"], *o, &["x", "--", "true"]].concat()),
    );
    cases.extend(
        backends
            .iter()
            .map(|b| vec!["run", "--backend", b, "x", "--", "true"]),
    );
    cases.extend([
        vec!["run", "x"],
        // Named twice: refused before connecting (nothing listens there).
        vec![
            "run",
            "--backend",
            "redis://127.0.0.1:1",
            "d/a",
            "d/b",
            "d/a",
            "--",
            "true",
        ],
        vec!["status", "bad name"],
        vec!["list", "--limit", "0"],
        vec!["check", "--backend", "memory://"],
        vec!["conformance", "--backend", "memory://"],
        vec!["run", "--backend", "memory://", "x", "--", "true"],
        vec![
            "elect",
            "--backend",
            "memory://",
            "--value",
            "v",
            "x",
            "--",
            "true",
        ],
        vec!["status", "--backend", "memory://", "x"],
        vec!["set-limit", "--backend", "memory://", "x", "3"],
        vec!["frobnicate"],
    ]);
    assert!(cases.len() >= 20);
    for args in cases {
        let out = bin().args(&args).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(code(&out), 2, "{args:?} exited {:?}: {err}", out.status);
        assert!(!err.contains("panicked"), "{args:?} panicked: {err}");
        let first = err.lines().next().unwrap_or("");
        assert!(
            first.starts_with("distlock: ") || first.starts_with("error: "),
            "{args:?}: unclear message {err:?}"
        );
    }
}

/// The number before `label` on the report line that starts with `cell`.
fn report_number(report: &str, cell: &str, label: &str) -> u64 {
    let line = report
        .lines()
        .find(|l| l.starts_with(cell))
        .unwrap_or_else(|| panic!("no {cell:?} line in:\n{report}"));
    let before = line
        .split(label)
        .next()
        .unwrap_or_else(|| panic!("no {label:?} in {line:?}"));
    before
        .rsplit([' ', ','])
        .find(|w| !w.is_empty())
        .and_then(|w| w.parse().ok())
        .unwrap_or_else(|| panic!("no number before {label:?} in {line:?}"))
}

/// The report of `distlock check` on a fresh SQLite file, a holder paused
/// past its 1 s TTL, and `args`; the run must exit 0.
fn paused_check(tag: &str, args: &[&str]) -> String {
    let out = bin()
        .args(["check", "--backend", &sqlite(tag)])
        .args(["--ttl", "1s", "--pause-holder"])
        .args(args)
        .output()
        .unwrap();
    let report = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{report}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    report
}

#[test]
fn check_with_a_paused_holder_shows_fencing_catching_the_stale_write() {
    let report = paused_check("check", &["--clients", "3", "--duration", "6s"]);
    assert_eq!(
        report_number(&report, "fenced register", "stale accepted"),
        0,
        "{report}"
    );
    assert_eq!(
        report_number(&report, "fenced register", "lost updates"),
        0,
        "{report}"
    );
    assert!(
        report_number(&report, "unfenced register", "stale accepted") >= 1,
        "the paused holder's stale write should reach the unfenced register:\n{report}"
    );
    assert!(
        report.contains("fencing caught what the lock alone let through"),
        "{report}"
    );
}

/// On a backend without fencing tokens (Redlock without `fencing=true`), a
/// holder paused past its TTL writes after the next holder, and nothing
/// catches it: the verdict is unsafe, exit 1.
#[cfg(feature = "redlock")]
#[test]
fn check_on_a_backend_without_fencing_exits_1() {
    let nodes: Vec<_> = (0..3)
        .map(|_| integration_tests::harness::redis::spawn(&[]).unwrap())
        .collect();
    let hosts: Vec<String> = nodes
        .iter()
        .map(|n| format!("127.0.0.1:{}", n.port))
        .collect();
    let url = format!("redlock://{}", hosts.join(","));
    let out = bin()
        .args(["check", "--backend", &url, "--ttl", "1s", "--pause-holder"])
        .args(["--clients", "3", "--duration", "4s"])
        .output()
        .unwrap();
    let report = String::from_utf8_lossy(&out.stdout);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(code(&out), 1, "{report}\n{err}");
    assert!(report.contains("UNSAFE without fencing"), "{report}");
}

/// The semaphore workload: a holder of one of 2 permits paused past its TTL
/// is turned away by the fenced register (which keeps the 2 highest tokens),
/// which never has more than 2 writers at once; the unfenced one shows the
/// violation.
#[test]
fn check_with_a_paused_permit_holder_shows_the_n_gate_catching_it() {
    let args = ["--limit", "2", "--clients", "5", "--duration", "8s"];
    let report = paused_check("check-sem", &args);
    assert!(report.contains("semaphore of 2 permits"), "{report}");
    assert_eq!(
        report_number(&report, "fenced register", "stale accepted"),
        0,
        "{report}"
    );
    assert!(
        report_number(&report, "fenced register", "writers at once") <= 2,
        "{report}"
    );
    let unfenced_stale = report_number(&report, "unfenced register", "stale accepted");
    let unfenced_writers = report_number(&report, "unfenced register", "writers at once");
    assert!(
        unfenced_stale >= 1 || unfenced_writers > 2,
        "the paused holder's stale write should reach the unfenced register:\n{report}"
    );
}

#[test]
fn check_rejects_bad_input_with_usage_errors() {
    let db = sqlite("check-bad");
    for args in [
        vec!["--clients", "0"],
        vec!["--clients", "1", "--pause-holder"],
        vec!["--clients", "100000"],
        vec!["--clients", "65"],
        vec!["--duration", "0s"],
        vec!["--limit", "0"],
        vec!["--limit", "4", "--clients", "4"],
        vec!["--ttl", "0s"],
        vec!["--lock", "bad name!"],
        vec!["--duration", "soon"],
    ] {
        let out = bin()
            .args(["check", "--backend", &db])
            .args(&args)
            .output()
            .unwrap();
        assert_eq!(
            out.status.code(),
            Some(2),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let out = bin()
        .args(["check", "--backend", "nonsense://x"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown backend scheme"));
}

/// A hold the deployment refuses every client (here a limit other than
/// the one stored), or a name someone else holds, ends the run before any
/// client starts, with the usual exit code and the cause.
#[test]
fn check_without_a_hold_any_client_could_get_says_why() {
    let db = sqlite("check-refused");
    let out = bin()
        .args(["set-limit", "--backend", &db, "distlock-check", "3"])
        .output()
        .unwrap();
    assert_eq!(code(&out), 0, "{out:?}");
    let out = bin()
        .args(["check", "--backend", &db, "--limit", "2", "--clients", "3"])
        .args(["--duration", "3s"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(code(&out), 2, "{err}");
    assert!(
        err.contains("stored limit 3") && err.contains("--limit asked for 2"),
        "{err}"
    );
    let mut holder = spawn_holder(&db, "check-held", 30);
    wait_held(&db, "check-held");
    let out = bin()
        .args(["check", "--backend", &db, "--lock", "check-held"])
        .args(["--ttl", "1s", "--duration", "2s"])
        .output()
        .unwrap();
    let _ = holder.kill();
    let _ = holder.wait();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(code(&out), 75, "{err}");
    assert!(err.contains("held by someone else"), "{err}");
}

/// Redlock's release returns at a majority and finishes on the other nodes
/// in the background: `run` waits for that before it exits. Here the third
/// node has lost its cached scripts (as after a restart), so its release is
/// answered NOSCRIPT and sent again; cut by the process's exit, the lock
/// would stay there for its TTL.
#[cfg(feature = "redis")]
#[test]
fn a_redlock_release_reaches_every_node_before_run_exits() {
    use integration_tests::harness::redis as server;
    let nodes: Vec<_> = (0..3)
        .map(|_| server::spawn(&[]).expect("redis-server must start"))
        .collect();
    // A node timeout that leaves the re-sent release time on a loaded
    // machine.
    let url = server::redlock_url(nodes.iter().map(|n| n.port), "&node_timeout_ms=1000");
    let third = nodes[2].port;
    // The command ends once the grant re-sent to the third node landed
    // there (5 s at most), so that the release comes after it.
    let landed = format!(
        "for i in $(seq 500); do redis-cli -p {third} EXISTS bg/release | grep -q 1 && break; sleep 0.01; done"
    );
    for round in 0..5 {
        // The first two nodes have the scripts; the third has none.
        assert_eq!(code(&run(&url, &[], "bg/warm", &["true"])), 0);
        server::command(third, &["SCRIPT", "FLUSH"]).expect("SCRIPT FLUSH");
        let out = run(
            &url,
            &["--ttl", "60s"],
            "bg/release",
            &["sh", "-c", &landed],
        );
        assert_eq!(code(&out), 0, "{out:?}");
        let left = server::command(third, &["EXISTS", "bg/release"]).expect("EXISTS");
        assert!(
            left.starts_with(":0"),
            "round {round}: the lock stayed on the third node after run exited"
        );
    }
}

/// Redlock connects with a majority of its nodes, which a semaphore of
/// several permits needs more of: with one of three nodes down, `run
/// --limit 2` without `--wait` exits 69 at once rather than waiting for
/// ever; a lock, which a majority serves, runs.
#[cfg(feature = "redis")]
#[test]
fn a_redlock_semaphore_without_its_quorum_at_start_exits_69() {
    use integration_tests::harness::redis as server;
    let mut nodes: Vec<_> = (0..3)
        .map(|_| server::spawn(&[]).expect("redis-server must start"))
        .collect();
    let url = server::redlock_url(nodes.iter().map(|n| n.port), "");
    drop(nodes.pop());
    let mut sem = run_command(&url, &["--limit", "2"], "quorum/sem", &["true"])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let status = exit_within(&mut sem, Duration::from_secs(20));
    let mut err = String::new();
    std::io::Read::read_to_string(&mut sem.stderr.take().unwrap(), &mut err).unwrap();
    assert_eq!(status.code(), Some(69), "{err}");
    assert!(err.contains("semaphore"), "{err}");
    assert_eq!(code(&run(&url, &[], "quorum/lock", &["true"])), 0);
}

/// SIGTERM to `check` while one worker is paused ends the run with 143 and
/// kills every worker, the paused one too: none goes on taking the lock,
/// none stays stopped.
#[test]
fn check_ended_by_a_signal_leaves_no_worker_behind() {
    let db = sqlite("check-signal");
    let child = bin()
        .args([
            "check",
            "--backend",
            &db,
            "--clients",
            "3",
            "--pause-holder",
        ])
        .args(["--ttl", "1s", "--duration", "20s"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    // A process's state letter, from /proc (None once it is gone).
    let state = |p: &u32| {
        std::fs::read_to_string(format!("/proc/{p}/stat"))
            .ok()
            .and_then(|s| s.rsplit(')').next()?.trim_start().chars().next())
    };
    // The workers, once all three run and one of them is paused.
    let start = Instant::now();
    let workers = loop {
        // Each thread's children (the runtime's threads spawn them).
        let pids: Vec<u32> = std::fs::read_dir(format!("/proc/{pid}/task"))
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|t| std::fs::read_to_string(t.path().join("children")).ok())
            .flat_map(|c| {
                c.split_whitespace()
                    .filter_map(|p| p.parse().ok())
                    .collect::<Vec<u32>>()
            })
            .collect();
        if pids.len() == 3 && pids.iter().any(|p| state(p) == Some('T')) {
            break pids;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "check started {} workers, none paused within 30s",
            pids.len()
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(143), "{out:?}");
    // Gone, or a zombie nobody reaps here; never running or stopped.
    let alive = |p: &u32| state(p).is_some_and(|s| s != 'Z' && s != 'X');
    let start = Instant::now();
    while workers.iter().any(alive) {
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "workers left after check exited: {:?}",
            workers.iter().filter(|p| alive(p)).collect::<Vec<_>>()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A server that dies during the run: the report shows what ran, and the
/// exit is 69 (unreachable) saying the verdict covers the run until then,
/// not 0 with "no violations".
#[cfg(feature = "redis")]
#[test]
fn check_whose_server_dies_during_the_run_exits_69() {
    let server = integration_tests::harness::redis::spawn(&[])
        .expect("redis-server must start; run scripts/test.sh to install it");
    let url = format!("redis://127.0.0.1:{}", server.port);
    let mut child = bin()
        .args(["check", "--backend", &url, "--clients", "3"])
        .args(["--ttl", "1s", "--duration", "4s"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The banner comes after the first try, as the run starts; the server
    // dies during the run.
    let mut stderr = std::io::BufReader::new(child.stderr.take().unwrap());
    let mut err = String::new();
    std::io::BufRead::read_line(&mut stderr, &mut err).unwrap();
    assert!(err.starts_with("distlock check: 3 clients"), "{err}");
    std::thread::sleep(Duration::from_millis(1500));
    drop(server);
    std::io::Read::read_to_string(&mut stderr, &mut err).unwrap();
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(69), "{err}");
    assert!(err.contains("the verdict covers the run until"), "{err}");
}

/// A `--ttl` outside the backend's TTL range is refused at once, in one
/// line, before any client starts (no overflow, no run to the end).
#[test]
fn check_refuses_a_ttl_outside_the_backends_range() {
    let db = sqlite("check-ttl");
    for ttl in ["18446744073709551615s", "3000000000000000000s", "1ms"] {
        let started = Instant::now();
        let out = bin()
            .args(["check", "--backend", &db, "--duration", "5s", "--ttl", ttl])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "--ttl {ttl}: {err}");
        assert!(
            err.starts_with("distlock: --ttl ") && err.contains("outside sqlite's TTL range"),
            "--ttl {ttl}: {err}"
        );
        assert_eq!(err.lines().count(), 1, "--ttl {ttl}: {err}");
        assert!(started.elapsed() < Duration::from_secs(4), "--ttl {ttl}");
    }
}

/// A `DISTLOCK_PASSWORD` that is not UTF-8 is refused, not taken as unset.
#[test]
fn a_password_that_is_not_utf8_exits_2() {
    use std::os::unix::ffi::OsStrExt;
    let out = bin()
        .env(
            "DISTLOCK_PASSWORD",
            std::ffi::OsStr::from_bytes(b"s3cr\xffet"),
        )
        .args(["run", "--backend", "memory://", "pw/utf8", "--", "true"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.starts_with("distlock: DISTLOCK_PASSWORD is not valid UTF-8"),
        "{err}"
    );
    assert_eq!(err.lines().count(), 1, "{err}");
}

/// `distlock run a b` and `distlock run b a` at once: every command
/// finishes (no deadlock), no two run together, and each sees both tokens
/// in sorted name order.
#[test]
fn several_names_in_opposite_orders_never_overlap() {
    let dir = scratch("multi");
    let b = format!("sqlite://{}", dir.join("locks.db").display());
    let log = dir.join("intervals.log");
    let script = format!(
        "echo start >> {0}; sleep 0.1; echo end >> {0}; echo $DISTLOCK_TOKEN $DISTLOCK_TOKENS >> {0}.tokens",
        log.display()
    );
    let children: Vec<Child> = (0..8)
        .map(|i| {
            let names = if i % 2 == 0 {
                ["jobs/a", "jobs/b"]
            } else {
                ["jobs/b", "jobs/a"]
            };
            bin()
                .args(["run", "--backend", &b, "--wait", "60s"])
                .args(names)
                .args(["--", "sh", "-c", &script])
                .spawn()
                .unwrap()
        })
        .collect();
    for mut c in children {
        assert!(c.wait().unwrap().success());
    }
    let text = std::fs::read_to_string(&log).unwrap();
    assert_eq!(text.lines().count(), 16, "{text}");
    assert_eq!(
        most_at_once(&text),
        1,
        "two commands held both locks at once:\n{text}"
    );
    let tokens = std::fs::read_to_string(dir.join("intervals.log.tokens")).unwrap();
    for line in tokens.lines() {
        let parts: Vec<&str> = line.split(' ').collect();
        assert_eq!(
            parts.len(),
            3,
            "DISTLOCK_TOKEN and two DISTLOCK_TOKENS pairs: {line}"
        );
        assert!(
            parts[1].starts_with("jobs/a=") && parts[2].starts_with("jobs/b="),
            "DISTLOCK_TOKENS is not in sorted order: {line}"
        );
        assert_eq!(
            Some(parts[0]),
            parts[1].strip_prefix("jobs/a="),
            "DISTLOCK_TOKEN is not the first name's token: {line}"
        );
    }
    for bad in [vec!["jobs/a", "jobs/a"], vec!["jobs/a", "bad name"]] {
        let out = bin()
            .args(["run", "--backend", &b, "--wait", "0"])
            .args(&bad)
            .args(["--", "true"])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{bad:?}: {out:?}");
    }
    let out = bin()
        .args([
            "run",
            "--backend",
            &b,
            "--limit",
            "3",
            "jobs/a",
            "jobs/b",
            "--",
            "true",
        ])
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(2),
        "--limit with two names: {out:?}"
    );
}

/// `distlock conformance` against `backend`: exits 0, every case ok or
/// ignored with a reason, and the summary counts them; `--json` says the
/// same as a JSON array.
fn conformance_passes(backend: &str, only: &[&str]) {
    let out = bin()
        .args(["conformance", "--backend", backend])
        .args(only)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let cases: Vec<&str> = text.lines().filter(|l| l.contains("::")).collect();
    assert!(cases.len() >= 10, "too few cases ran:\n{text}");
    for line in &cases {
        assert!(
            line.starts_with("ok      ") || (line.starts_with("ignored ") && line.contains(": ")),
            "a case neither passed nor was ignored with a reason: {line}"
        );
    }
    let ok = cases.iter().filter(|l| l.starts_with("ok")).count();
    assert!(text.contains(&format!(": {ok} ok, 0 failed, ")), "{text}");
}

#[test]
fn conformance_passes_on_sqlite_and_refuses_bad_input() {
    let b = sqlite("conformance");
    conformance_passes(&b, &[]);
    let out = bin()
        .args(["conformance", "--backend", &b, "--only", "tokens", "--json"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let cases = json["cases"].as_array().unwrap();
    assert!(!cases.is_empty());
    let findings = json["findings"].as_array().unwrap();
    assert!(
        findings
            .iter()
            .any(|f| f["setting"] == "journal_mode" && f["verdict"] == "fine"),
        "{findings:?}"
    );
    for c in cases {
        assert!(c["case"].as_str().unwrap().contains("tokens"), "{c}");
        assert_eq!(c["verdict"], "ok", "{c}");
        assert!(c.get("why").is_some_and(|w| w.is_null()), "{c}");
    }
    // A case's name as a line prints it, backend prefix and all, reruns it.
    let printed = "sqlite::try_acquire_on_held_lock_returns_none";
    let out = bin()
        .args(["conformance", "--backend", &b, "--only", printed])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert!(
        text.lines()
            .any(|l| l.starts_with("ok") && l.trim_end().ends_with(printed)),
        "{text}"
    );
    for (args, want) in [
        (vec!["--backend", &b, "--only", "no-such-case"], 2),
        (vec!["--backend", "nonsense"], 2),
        (vec!["--backend", "redis://127.0.0.1:1"], 69),
    ] {
        let out = bin().arg("conformance").args(&args).output().unwrap();
        assert_eq!(out.status.code(), Some(want), "{args:?}: {out:?}");
        // A refusal prints no report.
        assert!(out.stdout.is_empty(), "{args:?}: {out:?}");
    }
}

#[cfg(feature = "redis")]
#[test]
fn conformance_passes_on_redis() {
    let r = redis();
    conformance_passes(&r.url, &[]);
}

/// The SQL servers, etcd and ZooKeeper the harness starts.
#[test]
fn conformance_passes_on_the_harness_servers() {
    use integration_tests::harness::{ServerKind, TestServer};
    let mut kinds = vec![
        ServerKind::Postgres,
        ServerKind::MariaDb,
        ServerKind::ZooKeeper,
    ];
    if cfg!(feature = "etcd") {
        kinds.push(ServerKind::Etcd);
    }
    for kind in kinds {
        let server = TestServer::start(kind).unwrap();
        conformance_passes(server.url(), &[]);
    }
}

/// The deployment checks `distlock conformance` prints before the cases,
/// for `backend`.
fn findings(backend: &str) -> String {
    let out = bin()
        .args([
            "conformance",
            "--backend",
            backend,
            "--only",
            "tokens_increase",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A misconfigured server is named as such, and a setting the server
/// refuses to show is unknown, never fine.
#[cfg(feature = "redis")]
#[test]
fn conformance_reports_a_redis_that_evicts_or_hides_its_config() {
    use integration_tests::harness::redis::spawn;
    let evicting = spawn(&["--maxmemory-policy", "allkeys-lru", "--maxmemory", "100mb"]).unwrap();
    let text = findings(&format!("redis://127.0.0.1:{}", evicting.port));
    assert!(
        text.lines().any(|l| l
            .starts_with("WARNING maxmemory-policy: allkeys-lru, maxmemory 104857600: ")
            && l.contains("noeviction")),
        "{text}"
    );
    assert!(
        text.lines().any(|l| l.starts_with("WARNING persistence: ")),
        "{text}"
    );
    // Without a memory limit nothing is evicted; a log the system writes
    // when it chooses is named.
    let unlimited = spawn(&[
        "--maxmemory-policy",
        "volatile-lru",
        "--appendonly",
        "yes",
        "--appendfsync",
        "no",
    ])
    .unwrap();
    let text = findings(&format!("redis://127.0.0.1:{}", unlimited.port));
    assert!(
        text.contains("fine    maxmemory-policy: volatile-lru, maxmemory 0 (no limit"),
        "{text}"
    );
    assert!(
        text.lines().any(|l| l
            .starts_with("WARNING persistence: appendonly yes, appendfsync no: ")
            && l.contains("appendfsync everysec")),
        "{text}"
    );
    let hidden = spawn(&["--rename-command", "CONFIG", ""]).unwrap();
    let text = findings(&format!("redis://127.0.0.1:{}", hidden.port));
    for setting in ["maxmemory-policy", "persistence"] {
        assert!(
            text.contains(&format!("unknown {setting}: ")),
            "{setting}:\n{text}"
        );
        assert!(
            !text.contains(&format!("fine    {setting}")),
            "{setting}:\n{text}"
        );
        assert!(
            !text.contains(&format!("WARNING {setting}")),
            "{setting}:\n{text}"
        );
    }
    let sound = spawn(&["--appendonly", "yes", "--maxmemory-policy", "noeviction"]).unwrap();
    let text = findings(&format!("redis://127.0.0.1:{}", sound.port));
    assert!(
        text.contains("fine    maxmemory-policy: noeviction"),
        "{text}"
    );
    assert!(
        text.contains("fine    persistence: appendonly yes, appendfsync everysec"),
        "{text}"
    );
}

/// A URL naming a read-only replica is named as such, and the suite ends
/// at once with the refusal instead of running every case to its bound.
#[cfg(feature = "redis")]
#[test]
fn conformance_on_a_replica_says_so_and_ends_at_once() {
    use integration_tests::harness::redis::spawn;
    let master = spawn(&[]).unwrap();
    let port = master.port.to_string();
    let replica = spawn(&["--replicaof", "127.0.0.1", &port]).unwrap();
    let started = Instant::now();
    let out = bin()
        .args(["conformance", "--backend"])
        .arg(format!("redis://127.0.0.1:{}", replica.port))
        .args(["--only", "wait_with_timeout_returns_timeout_error"])
        .output()
        .unwrap();
    let (text, err) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert_eq!(code(&out), 69, "{text}{err}");
    assert!(
        text.contains("WARNING replication: role slave: this server is a replica"),
        "{text}"
    );
    assert!(err.contains("no case can run"), "{err}");
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "the suite ran its case to its bound: {:?}",
        started.elapsed()
    );
    // With --json the findings come out as the document, with no cases.
    let out = bin()
        .args(["conformance", "--json", "--backend"])
        .arg(format!("redis://127.0.0.1:{}", replica.port))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(code(&out), 69, "{text}");
    let doc: serde_json::Value = serde_json::from_str(&text).expect("one JSON document");
    assert!(
        doc["findings"].as_array().is_some_and(|f| f
            .iter()
            .any(|f| f["setting"] == "replication" && f["verdict"] == "warning")),
        "{text}"
    );
    assert_eq!(doc["cases"], serde_json::json!([]), "{text}");
    assert!(
        doc["error"]
            .as_str()
            .is_some_and(|e| e.contains("no case can run")),
        "{text}"
    );
    // So is a server that cannot be reached: no findings, no cases.
    let out = bin()
        .args(["conformance", "--json", "--backend", "redis://127.0.0.1:1"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(code(&out), 69, "{text}");
    let doc: serde_json::Value = serde_json::from_str(&text).expect("one JSON document");
    assert_eq!(doc["findings"], serde_json::json!([]), "{text}");
    assert_eq!(doc["cases"], serde_json::json!([]), "{text}");
    assert!(
        doc["error"]
            .as_str()
            .is_some_and(|e| e.contains("127.0.0.1:1")),
        "{text}"
    );
    // And memory://, which no suite can run on across clients: exit 2.
    let out = bin()
        .args(["conformance", "--json", "--backend", "memory://"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(code(&out), 2, "{text}");
    let doc: serde_json::Value = serde_json::from_str(&text).expect("one JSON document");
    assert!(
        doc["error"]
            .as_str()
            .is_some_and(|e| e.contains("memory://")),
        "{text}"
    );
}

/// The harness's PostgreSQL runs with `synchronous_commit=off` and
/// `fsync=off` (fast, and not durable): both are named.
#[test]
fn conformance_reports_a_postgres_without_durable_commits() {
    use integration_tests::harness::{ServerKind, TestServer};
    // The harness's own server, whose settings the case knows.
    let server = TestServer::start_private(ServerKind::Postgres).unwrap();
    let text = findings(server.url());
    assert!(text.contains("WARNING synchronous_commit: off: "), "{text}");
    assert!(text.contains("WARNING fsync: off: "), "{text}");
}

/// The harness's MariaDB runs with `innodb_flush_log_at_trx_commit=0`
/// (fast, and not durable): it is named.
#[cfg(feature = "mysql")]
#[test]
fn conformance_reports_a_mysql_without_durable_commits() {
    use integration_tests::harness::{ServerKind, TestServer};
    // The harness's own server, whose settings the case knows.
    let server = TestServer::start_private(ServerKind::MariaDb).unwrap();
    let text = findings(server.url());
    assert!(
        text.contains("WARNING innodb_flush_log_at_trx_commit: 0: "),
        "{text}"
    );
}

/// The harness's etcd is one member: its loss stops every lock; two are
/// named too.
#[cfg(feature = "etcd")]
#[test]
fn conformance_reports_a_single_member_etcd() {
    use integration_tests::harness::{ServerKind, TestServer};
    // The harness's own server, whose settings the case knows.
    let server = TestServer::start_private(ServerKind::Etcd).unwrap();
    let text = findings(server.url());
    assert!(text.contains("WARNING members: 1: "), "{text}");
    // A short TTL below the lease etcd would grant instead is refused: the
    // expiry cases would judge it against the longer lease.
    let out = bin()
        .args([
            "conformance",
            "--backend",
            server.url(),
            "--short-ttl",
            "1s",
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("minimum lease TTL"), "{err}");
    // Two members tolerate no more failures than one.
    let two = integration_tests::harness::etcd::cluster(2).unwrap();
    let text = findings(&format!("etcd://127.0.0.1:{}", two[0].port));
    assert!(text.contains("WARNING members: 2: "), "{text}");
}

/// Redlock's findings are each node's, named after it: here one node
/// evicts.
#[cfg(feature = "redlock")]
#[test]
fn conformance_reports_each_redlock_node() {
    use integration_tests::harness::redis::spawn;
    let nodes = [
        spawn(&[]).unwrap(),
        spawn(&[]).unwrap(),
        spawn(&["--maxmemory-policy", "allkeys-lru", "--maxmemory", "100mb"]).unwrap(),
    ];
    let hosts: Vec<String> = nodes
        .iter()
        .map(|n| format!("127.0.0.1:{}", n.port))
        .collect();
    let text = findings(&format!("redlock://{}", hosts.join(",")));
    let evicting = format!("WARNING {} maxmemory-policy: allkeys-lru", hosts[2]);
    assert!(text.contains(&evicting), "{text}");
    for h in &hosts[..2] {
        assert!(
            text.contains(&format!("fine    {h} maxmemory-policy: noeviction")),
            "{text}"
        );
    }
}

/// A standalone ZooKeeper is one server: its loss stops every lock; an
/// ensemble of three is fine.
#[cfg(feature = "zookeeper")]
#[test]
fn conformance_reports_a_standalone_zookeeper() {
    use integration_tests::harness::{zookeeper, ServerKind};
    let one = zookeeper::spawn().expect("ZooKeeper must start; run scripts/test.sh to install it");
    let text = findings(&ServerKind::ZooKeeper.url("127.0.0.1", one.port));
    assert!(text.contains("WARNING servers: standalone: "), "{text}");
    let three = zookeeper::ensemble(3).unwrap();
    let text = findings(&ServerKind::ZooKeeper.url("127.0.0.1", three[0].port));
    assert!(text.contains("fine    servers: 3"), "{text}");
}

/// A ZooKeeper whose `maxSessionTimeout` is below a TTL cannot give a hold
/// of that TTL its session: named for that TTL, fine for one it can.
#[cfg(feature = "zookeeper")]
#[test]
fn conformance_reports_a_zookeeper_that_caps_session_timeouts() {
    use integration_tests::harness::{zookeeper, ServerKind};
    let zk = zookeeper::spawn_with("maxSessionTimeout=10000\n")
        .expect("ZooKeeper must start; run scripts/test.sh to install it");
    let url = ServerKind::ZooKeeper.url("127.0.0.1", zk.port);
    let out = bin()
        .args([
            "conformance",
            "--backend",
            &url,
            "--only",
            "tokens_increase",
        ])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("WARNING session timeout for a 30s TTL: not granted as asked: "),
        "{out:?}"
    );
    assert!(
        text.contains("fine    session timeout for a 3s TTL: 3s, as asked"),
        "{out:?}"
    );
    // The cases' TTL is one such: no case can run, a bad input (2).
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("maxSessionTimeout"),
        "{out:?}"
    );
    // A minimum above the expiry cases' TTL (a tickTime of 2000 makes it
    // 4 s): named, and no case runs, rather than most failing one by one.
    let zk = zookeeper::spawn_with("minSessionTimeout=4000\n")
        .expect("ZooKeeper must start; run scripts/test.sh to install it");
    let url = ServerKind::ZooKeeper.url("127.0.0.1", zk.port);
    let out = bin()
        .args([
            "conformance",
            "--backend",
            &url,
            "--only",
            "tokens_increase",
        ])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("WARNING session timeout for a 3s TTL: not granted as asked: "),
        "{out:?}"
    );
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--short-ttl"),
        "{out:?}"
    );
}

/// The password can come from `DISTLOCK_PASSWORD` or `--password-file`
/// instead of the URL; it reaches the server, not the command's
/// environment, whatever characters it has; a wrong one exits 78, one the
/// backend's URL cannot carry 2.
#[cfg(feature = "redis")]
#[test]
fn the_password_comes_from_the_environment_or_a_file() {
    let r = redis();
    let bare = r.url.replace(":s3cret@", "");
    assert!(!bare.contains("s3cret"), "{bare}");
    let echo = [
        "--",
        "sh",
        "-c",
        "echo \"$DISTLOCK_BACKEND\" \"${DISTLOCK_PASSWORD-unset}\"",
    ];
    let out = bin()
        .env("DISTLOCK_PASSWORD", "s3cret")
        .args(["run", "--backend", &bare, "pw/env"])
        .args(echo)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let shown = String::from_utf8_lossy(&out.stdout);
    assert!(
        !shown.contains("s3cret") && shown.contains("***") && shown.contains("unset"),
        "the password reached the command: {shown}"
    );
    let file = scratch("pw").join("password");
    std::fs::write(&file, "s3cret\n").unwrap();
    let out = bin()
        .args([
            "--password-file",
            file.to_str().unwrap(),
            "run",
            "--backend",
            &bare,
            "pw/file",
        ])
        .args(echo)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let out = bin()
        .env("DISTLOCK_PASSWORD", "wrong")
        .args(["run", "--backend", &bare, "pw/wrong", "--", "true"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(78), "{out:?}");
    assert!(
        !String::from_utf8_lossy(&out.stderr).contains("wrong"),
        "{out:?}"
    );
    // Any password reaches a backend that percent-decodes the URL's: it
    // goes in encoded.
    const ODD: &str = "p@ss:w/r?d#%x y";
    let odd = integration_tests::harness::redis::spawn(&["--requirepass", ODD])
        .expect("redis-server must start; run scripts/test.sh to install it");
    let out = bin()
        .env("DISTLOCK_PASSWORD", ODD)
        .args([
            "run",
            "--backend",
            &format!("redis://127.0.0.1:{}", odd.port),
            "pw/odd",
            "--",
            "true",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    // One that reads it as written cannot carry these.
    let out = bin()
        .env("DISTLOCK_PASSWORD", "a@b")
        .args([
            "run",
            "--backend",
            "zk://127.0.0.1:1",
            "pw/bad",
            "--",
            "true",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
}

/// Every URL form that can carry a password, against servers that are not
/// there: neither the error, nor `status` (text or JSON), nor
/// `conformance --json`, nor trace-level logs show the password.
#[test]
fn no_url_form_shows_its_password() {
    const PW: &str = "Zq9-secret";
    let forms = [
        format!("postgres://app:{PW}@127.0.0.1:1/db"),
        format!("postgresql://app:{PW}@127.0.0.1:1/db?sslmode=verify-full"),
        format!("postgres:///db?host=127.0.0.1&port=1&user=app&password={PW}"),
        format!("mysql://app:{PW}@127.0.0.1:1/db"),
        format!("mariadb://app:{PW}@127.0.0.1:1/db?ssl-mode=VERIFY_IDENTITY"),
        format!("redis://:{PW}@127.0.0.1:1"),
        format!("redis://app:{PW}@127.0.0.1:1/2"),
        format!("rediss://app:{PW}@127.0.0.1:1?ca_file=/nonexistent.pem"),
        format!("redis+sentinel://app:{PW}@127.0.0.1:1,127.0.0.1:2/mymaster"),
        format!("redis+cluster://app:{PW}@127.0.0.1:1,127.0.0.1:2"),
        format!("redlock://app:{PW}@127.0.0.1:1,127.0.0.1:2,127.0.0.1:3"),
        format!("etcd://app:{PW}@127.0.0.1:1"),
        format!("etcds://app:{PW}@127.0.0.1:1"),
        format!("zk://app:{PW}@127.0.0.1:1/chroot?acl=creator"),
    ];
    for url in &forms {
        let runs: [&[&str]; 4] = [
            &["status", "pw/x", "--backend", url],
            &["status", "pw/x", "--json", "--backend", url],
            &["conformance", "--json", "--backend", url],
            &["-vv", "run", "--backend", url, "pw/x", "--", "true"],
        ];
        for args in runs {
            let out = bin().env_remove("RUST_LOG").args(args).output().unwrap();
            let text = format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            assert_ne!(out.status.code(), Some(0), "{args:?} succeeded: {text}");
            assert!(!text.is_empty(), "{args:?} said nothing");
            assert!(!text.contains(PW), "{args:?} showed the password:\n{text}");
        }
    }
}

/// `distlock run --shared` and `distlock run` processes on one name, as
/// `flock -s` and `flock -x`: the shared commands were inside together at
/// least once, and no exclusive command was ever inside with anyone.
#[test]
fn shared_runs_overlap_and_exclusive_runs_are_alone() {
    let b = sqlite("rw");
    let dir = scratch("rw-inside");
    let d = dir.display();
    // Each command marks itself inside, looks at who else is, and leaves.
    let script = |kind: &str, secs: &str| {
        format!("touch {d}/in.{kind}.$$; sleep {secs}; ls {d} | grep '^in\\.' > {d}/seen.{kind}.$$; rm {d}/in.{kind}.$$")
    };
    let (reader, writer) = (script("r", "0.8"), script("w", "0.2"));
    let wait = ["--wait", "60s"];
    let mut children: Vec<Child> = (0..4)
        .map(|_| {
            spawn_run(
                &b,
                &[&wait[..], &["--shared"]].concat(),
                "rw/job",
                &["sh", "-c", &reader],
            )
        })
        .collect();
    std::thread::sleep(Duration::from_millis(200));
    children.extend((0..2).map(|_| spawn_run(&b, &wait, "rw/job", &["sh", "-c", &writer])));
    children.extend((0..2).map(|_| {
        spawn_run(
            &b,
            &[&wait[..], &["--shared"]].concat(),
            "rw/job",
            &["sh", "-c", &reader],
        )
    }));
    for mut c in children {
        assert!(c.wait().unwrap().success());
    }
    let mut most_readers = 0;
    let mut seen_files = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let file = path.file_name().unwrap().to_string_lossy().into_owned();
        let Some(rest) = file.strip_prefix("seen.") else {
            continue;
        };
        seen_files += 1;
        let inside = std::fs::read_to_string(&path).unwrap();
        let inside: Vec<&str> = inside.lines().collect();
        if rest.starts_with("w.") {
            assert_eq!(inside.len(), 1, "a writer was inside with {inside:?}");
        } else {
            assert!(
                inside.iter().all(|m| m.starts_with("in.r.")),
                "a reader was inside with a writer: {inside:?}"
            );
            most_readers = most_readers.max(inside.len());
        }
    }
    assert_eq!(seen_files, 8, "not every command ran");
    assert!(most_readers >= 2, "shared commands never overlapped");
}

/// `distlock status` of a lock held shared names no single token: the
/// newest shared hold may have ended while an older one lasts, and its
/// token is nobody's.
#[test]
fn status_of_a_lock_held_shared_shows_no_one_token() {
    let b = sqlite("status-shared");
    let mut older = spawn_run(&b, &["--shared"], "rw/status", &["sleep", "20"]);
    wait_held(&b, "rw/status");
    let newer = run(
        &b,
        &["--shared"],
        "rw/status",
        &["sh", "-c", "echo $DISTLOCK_TOKEN"],
    );
    assert_eq!(
        code(&newer),
        0,
        "{}",
        String::from_utf8_lossy(&newer.stderr)
    );
    let newer_token = String::from_utf8_lossy(&newer.stdout).trim().to_string();
    assert!(newer_token.parse::<u64>().is_ok(), "{newer_token}");
    let json = status_json(&b, "rw/status", &[]);
    assert!(
        json.contains("\"held\":true")
            && json.contains("\"token\":null")
            && json.contains("\"shared\":1"),
        "{json}"
    );
    let out = bin()
        .args(["status", "rw/status", "--backend", &b])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let token_line = text.lines().find(|l| l.starts_with("token:"));
    assert_eq!(
        token_line,
        Some("token:     one per shared hold: distlock list rw/status shows each where the backend keeps it"),
        "{text}"
    );
    older.kill().unwrap();
    older.wait().unwrap();
}

/// On PostgreSQL and MySQL/MariaDB a lease's end is judged by the
/// database's clock alone: a client whose wall clock is three hours off,
/// either way, takes a lease that a client with the right clock finds held,
/// ending a TTL from now (judged by the client's clock, it would read as
/// three hours long, or as over already).
#[cfg(all(feature = "postgres", feature = "mysql"))]
#[test]
fn a_client_clock_hours_off_moves_no_lease_on_postgres_or_mysql() {
    use integration_tests::harness::{mariadb, postgres, ServerKind};
    let pg = postgres::spawn().expect("postgres must start; run scripts/test.sh to install it");
    let my = mariadb::spawn().expect("mariadbd must start; run scripts/test.sh to install it");
    let urls = [
        ServerKind::Postgres.url("127.0.0.1", pg.port),
        ServerKind::MariaDb.url("127.0.0.1", my.port),
    ];
    for url in &urls {
        for offset in ["+3h", "-3h"] {
            let name = if offset.starts_with('+') {
                "clock/ahead"
            } else {
                "clock/behind"
            };
            let mut holder = Command::new("faketime")
                // The wall clock only: the monotonic one times the TTL.
                .env("FAKETIME_DONT_FAKE_MONOTONIC", "1")
                .env("RUST_LOG", "error")
                .args(["-f", offset, env!("CARGO_BIN_EXE_distlock")])
                .args(["run", "--backend", url, "--ttl", "20s", name, "--"])
                // Long enough for the reads below on a loaded machine.
                .args(["sleep", "8"])
                .stdin(Stdio::null())
                .spawn()
                .expect("faketime must run; run scripts/test.sh to install it");
            wait_held(url, name);
            let json: serde_json::Value =
                serde_json::from_str(status_json(url, name, &[]).trim()).unwrap();
            let remaining = json["remaining_ms"].as_u64().unwrap_or(0);
            assert!(
                (10_000..=20_000).contains(&remaining),
                "{url}, client clock {offset}: {json}"
            );
            assert!(holder.wait().unwrap().success(), "{url}, {offset}");
        }
    }
}

/// Redlock with `fifo=true` places each wait in the nodes' queues by the
/// client's wall clock: processes an hour ahead and an hour behind take
/// turns with the others, and no two commands ever run at once.
#[cfg(feature = "redlock")]
#[test]
fn redlock_fifo_with_client_clocks_hours_apart_admits_one_at_a_time() {
    let nodes: Vec<_> = (0..3)
        .map(|_| {
            integration_tests::harness::redis::spawn(&[])
                .expect("redis-server must start; run scripts/test.sh to install it")
        })
        .collect();
    let hosts: Vec<String> = nodes
        .iter()
        .map(|n| format!("127.0.0.1:{}", n.port))
        .collect();
    let url = format!("redlock://{}?fifo=true", hosts.join(","));
    let dir = scratch("skew");
    let d = dir.display();
    // Each command marks itself inside, counts who is, and leaves.
    let script = format!(
        "touch {d}/in.$$; sleep 0.2; ls {d} | grep -c '^in\\.' > {d}/seen.$$; rm {d}/in.$$"
    );
    let offsets = [
        None,
        Some("+1h"),
        Some("-1h"),
        None,
        Some("+1h"),
        Some("-1h"),
    ];
    let children: Vec<Child> = offsets
        .iter()
        .map(|offset| {
            let mut c = match offset {
                Some(o) => {
                    let mut c = Command::new("faketime");
                    // The wall clock only: the monotonic one times leases.
                    c.env("FAKETIME_DONT_FAKE_MONOTONIC", "1").args([
                        "-f",
                        o,
                        env!("CARGO_BIN_EXE_distlock"),
                    ]);
                    c
                }
                None => Command::new(env!("CARGO_BIN_EXE_distlock")),
            };
            c.env_remove("DISTLOCK_BACKEND")
                .env("RUST_LOG", "error")
                .stdin(Stdio::null())
                .args(["run", "--backend", &url, "--wait", "60s", "skew/job", "--"])
                .args(["sh", "-c", &script])
                .spawn()
                .expect("faketime must run; run scripts/test.sh to install it")
        })
        .collect();
    for mut c in children {
        assert!(c.wait().unwrap().success());
    }
    let mut seen = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path
            .file_name()
            .unwrap()
            .to_string_lossy()
            .starts_with("seen.")
        {
            seen += 1;
            let inside = std::fs::read_to_string(&path).unwrap();
            assert_eq!(inside.trim(), "1", "{} commands ran at once", inside.trim());
        }
    }
    assert_eq!(seen, offsets.len(), "not every command ran");
}

/// A queued wait on MySQL/MariaDB (`fifo=true`) blocks inside the server
/// by design (`GET_LOCK`, then `SLEEP` until the release): none of it is
/// reported as a slow statement.
#[cfg(feature = "mysql")]
#[test]
fn a_queued_wait_on_mysql_prints_nothing() {
    let server = integration_tests::harness::mariadb::spawn()
        .expect("mariadbd must start; run scripts/test.sh to install it");
    let url = format!(
        "{}?fifo=true",
        integration_tests::harness::ServerKind::MariaDb.url("127.0.0.1", server.port)
    );
    let mut holder = spawn_holder(&url, "queue/quiet", 3);
    wait_held(&url, "queue/quiet");
    // At the CLI's own log level, not the tests' `error`.
    let out = run_command(&url, &["--wait", "30s"], "queue/quiet", &["true"])
        .env_remove("RUST_LOG")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(code(&out), 0, "{err}");
    assert!(err.trim().is_empty(), "the wait printed:\n{err}");
    assert!(holder.wait().unwrap().success());
}

/// An etcd member for one test, stopped when dropped.
#[cfg(feature = "etcd")]
struct Etcd {
    url: String,
    _server: integration_tests::harness::ServerProcess,
}

#[cfg(feature = "etcd")]
fn etcd() -> Etcd {
    let server = integration_tests::harness::etcd::spawn()
        .expect("etcd must start; run scripts/test.sh to install it");
    Etcd {
        url: format!("etcd://127.0.0.1:{}", server.port),
        _server: server,
    }
}

/// `distlock observe --once` of `name` on `backend`: exit code and stdout.
fn observe_once(backend: &str, name: &str, extra: &[&str]) -> (i32, String) {
    let out = bin()
        .args(["observe", "--once", "--backend", backend, name])
        .args(extra)
        .output()
        .unwrap();
    (
        code(&out),
        String::from_utf8_lossy(&out.stdout).trim().to_string(),
    )
}

/// `distlock elect` runs its command while leading, with the value and the
/// token in the environment; a second `elect` waits (75 with `--wait 0`);
/// `observe --once` prints the leader's value (75 without one), `--json`
/// its token too.
#[cfg(feature = "etcd")]
#[test]
fn elect_runs_the_command_while_leading_and_observe_prints_the_leader() {
    let etcd = etcd();
    let dir = scratch("elect");
    let env_file = dir.join("env");
    assert_eq!(
        observe_once(&etcd.url, "svc/leader", &[]),
        (75, String::new()),
        "observe --once without a leader"
    );
    assert_eq!(
        observe_once(&etcd.url, "svc/leader", &["--json"]),
        (75, "null".into()),
        "observe --once --json without a leader"
    );
    let mut leader = bin()
        .args([
            "elect",
            "--backend",
            &etcd.url,
            "--value",
            "host-a:8080",
            "svc/leader",
            "--",
        ])
        .args([
            "sh",
            "-c",
            &format!(
                "echo \"$DISTLOCK_NAME $DISTLOCK_VALUE $DISTLOCK_TOKEN\" > {}; sleep 30",
                env_file.display()
            ),
        ])
        .spawn()
        .unwrap();
    let start = Instant::now();
    while !env_file.exists() || std::fs::read_to_string(&env_file).unwrap().is_empty() {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "elect never ran its command"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let env = std::fs::read_to_string(&env_file).unwrap();
    let parts: Vec<&str> = env.split_whitespace().collect();
    assert_eq!(&parts[..2], ["svc/leader", "host-a:8080"], "{env}");
    let token: u64 = parts[2].parse().unwrap();
    assert_eq!(
        observe_once(&etcd.url, "svc/leader", &[]),
        (0, "host-a:8080".into())
    );
    let (rc, json) = observe_once(&etcd.url, "svc/leader", &["--json"]);
    assert_eq!(rc, 0);
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(v["value"], "host-a:8080", "{json}");
    assert_eq!(v["token"].as_u64(), Some(token), "{json}");
    let second = bin()
        .args([
            "elect",
            "--backend",
            &etcd.url,
            "--value",
            "host-b",
            "--wait",
            "0",
            "svc/leader",
            "--",
            "true",
        ])
        .output()
        .unwrap();
    assert_eq!(
        code(&second),
        75,
        "{}",
        String::from_utf8_lossy(&second.stderr)
    );
    leader.kill().unwrap();
    leader.wait().unwrap();
}

/// A child process killed when dropped, also when a test fails first
/// (one that never exits would otherwise outlive the test).
struct Stopped(Child);

impl Drop for Stopped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `distlock observe` prints each leader's value as it changes and an
/// empty line while nobody leads, and a leadership lost on the server stops
/// `elect`'s command with 76.
#[cfg(feature = "etcd")]
#[test]
fn observe_prints_each_leader_and_a_lost_leadership_exits_76() {
    let etcd = etcd();
    let mut observer = Stopped(
        bin()
            .args(["observe", "--backend", &etcd.url, "jobs/leader"])
            .stdout(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let lines = observer.0.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufRead::lines(std::io::BufReader::new(lines)).map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    // The first leads until the observer has printed it (however late the
    // observer starts), then is stopped and resigns; the second follows.
    let first = bin()
        .args([
            "elect",
            "--backend",
            &etcd.url,
            "--value",
            "first",
            "jobs/leader",
            "--",
            "sleep",
            "30",
        ])
        .spawn()
        .unwrap();
    // An observer that starts before the first leads sees nobody lead.
    let mut seen_first = rx.recv_timeout(Duration::from_secs(20)).unwrap();
    if seen_first.is_empty() {
        seen_first = rx.recv_timeout(Duration::from_secs(20)).unwrap();
    }
    Command::new("kill")
        .args(["-TERM", &first.id().to_string()])
        .status()
        .unwrap();
    first.wait_with_output().unwrap();
    let out = bin()
        .args([
            "elect",
            "--backend",
            &etcd.url,
            "--value",
            "second",
            "jobs/leader",
            "--",
            "sleep",
            "1",
        ])
        .output()
        .unwrap();
    assert_eq!(code(&out), 0, "{}", String::from_utf8_lossy(&out.stderr));
    // The second campaigns only once the first has exited: in between
    // nobody leads.
    let seen_gap = rx.recv_timeout(Duration::from_secs(20)).unwrap();
    let seen_second = rx.recv_timeout(Duration::from_secs(20)).unwrap();
    assert_eq!([seen_first, seen_gap, seen_second], ["first", "", "second"]);
    drop(observer);
    // Leadership taken away on the server (its key deleted, as an
    // operator would): the renewal finds it gone, the command gets SIGTERM
    // and elect exits 76.
    let mut lost = bin()
        .args([
            "elect",
            "--backend",
            &etcd.url,
            "--value",
            "x",
            "--ttl",
            "3s",
            "--kill-after",
            "1s",
            "jobs/lost",
            "--",
            "sleep",
            "30",
        ])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let start = Instant::now();
    while observe_once(&etcd.url, "jobs/lost", &[]).0 != 0 {
        assert!(start.elapsed() < Duration::from_secs(20), "elect never led");
        std::thread::sleep(Duration::from_millis(50));
    }
    let endpoint = etcd.url.trim_start_matches("etcd://").to_string();
    let deleted = integration_tests::harness::etcd::etcdctl(&endpoint)
        .unwrap()
        .args(["del", "--prefix", "jobs/lost/"])
        .output()
        .unwrap();
    assert!(deleted.status.success());
    let status = loop {
        if let Some(status) = lost.try_wait().unwrap() {
            break status;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "elect kept running after losing leadership"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(status.code(), Some(76));
}

/// A value over 4096 bytes is refused before anything is sent: exit 2,
/// and the message says the bound.
#[test]
fn elect_with_an_oversized_value_exits_2() {
    let b = sqlite("bigvalue");
    let big = "v".repeat(4097);
    let out = bin()
        .args([
            "elect",
            "--backend",
            &b,
            "--value",
            &big,
            "svc/leader",
            "--",
            "true",
        ])
        .output()
        .unwrap();
    assert_eq!(code(&out), 2, "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stderr).contains("4096"));
}

/// `observe` prints one line per leader: an empty value, or one with a
/// newline, exits 2 before campaigning.
#[test]
fn elect_with_an_empty_or_multi_line_value_exits_2() {
    let b = sqlite("linevalue");
    for (value, says) in [("", "is empty"), ("a\nb", "control character")] {
        let out = bin()
            .args(["elect", "--backend", &b, "--value", value, "svc/leader"])
            .args(["--", "true"])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(code(&out), 2, "{value:?}: {err}");
        assert!(
            err.contains(says) && err.lines().count() == 1,
            "{value:?}: {err}"
        );
    }
}

/// `status` and `list` show who holds what: the holder info a run sets, or
/// the default (host, process id and command line).
fn holders_are_shown(backend: &str) {
    let mut named = spawn_run(
        backend,
        &["--holder-info", "nightly backup"],
        "jobs/a",
        &["sleep", "60"],
    );
    let mut plain = spawn_holder(backend, "jobs/b", 60);
    wait_held(backend, "jobs/a");
    wait_held(backend, "jobs/b");
    let status = bin()
        .args(["status", "jobs/a", "--backend", backend])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&status.stdout);
    assert!(text.contains("holder:    nightly backup"), "{text}");
    assert!(
        status_json(backend, "jobs/a", &[]).contains(r#""holder_info":"nightly backup""#),
        "status --json lacks the holder info"
    );

    let out = bin()
        .args(["list", "jobs/", "--json", "--backend", backend])
        .output()
        .unwrap();
    assert_eq!(code(&out), 0, "{}", String::from_utf8_lossy(&out.stderr));
    let lines: Vec<serde_json::Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 2, "{lines:?}");
    assert_eq!(lines[0]["name"], "jobs/a");
    assert_eq!(lines[0]["kind"], "lock");
    assert_eq!(lines[0]["holder_info"], "nightly backup");
    assert!(lines[0]["token"].as_u64().is_some(), "{lines:?}");
    let default = lines[1]["holder_info"].as_str().unwrap_or_default();
    assert!(
        default.contains(" pid ") && default.ends_with(": sleep 60"),
        "the default holder info is {default:?}"
    );
    let out = bin()
        .args(["list", "jobs/", "--limit", "1", "--backend", backend])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(text.lines().count(), 2, "a header and one hold:\n{text}");
    assert!(
        text.contains("jobs/a") && !text.contains("jobs/b"),
        "{text}"
    );
    for c in [&mut named, &mut plain] {
        Command::new("kill")
            .args(["-TERM", &c.id().to_string()])
            .status()
            .unwrap();
        c.wait().unwrap();
    }
    let out = bin()
        .args(["list", "jobs/", "--backend", backend])
        .output()
        .unwrap();
    assert!(
        out.stdout.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
}

#[test]
fn status_and_list_show_holder_info() {
    holders_are_shown(&sqlite("holders"));
    #[cfg(feature = "redis")]
    holders_are_shown(&redis().url);
}

#[test]
fn bad_list_and_holder_input_exits_2() {
    let b = sqlite("bad-list");
    for args in [
        vec!["list", "/jobs"],
        vec!["list", "a//b"],
        vec!["list", "jobs", "--limit", "0"],
    ] {
        let out = bin().args(&args).args(["--backend", &b]).output().unwrap();
        assert_eq!(
            code(&out),
            2,
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let long = "x".repeat(257);
    for info in ["", "two\nlines", long.as_str()] {
        let out = run(&b, &["--holder-info", info], "jobs/x", &["true"]);
        assert_eq!(
            code(&out),
            2,
            "{info:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("holder info"), "{err}");
    }
}

/// A password given for a backend that takes none is refused at once with
/// exit 2, naming the scheme: put into a SQLite URL it would turn the path
/// into a relative directory named after it (`sqlite://:pw@/tmp/...`), so
/// runs started in two directories would each hold the same lock, and the
/// password would lie on disk as a directory name.
#[test]
fn a_password_for_a_backend_without_one_exits_2() {
    const PW: &str = "Zq9-secret";
    let dir = scratch("pw-none");
    let file = dir.join("password");
    std::fs::write(&file, format!("{PW}\n")).unwrap();
    let file = file.to_str().unwrap();
    let sqlite = sqlite_in(&dir);
    for (backend, scheme) in [(sqlite.as_str(), "sqlite://"), ("memory://", "memory://")] {
        let run = [
            "run",
            "--wait",
            "0",
            "--backend",
            backend,
            "pw/none",
            "--",
            "true",
        ];
        let status = ["status", "pw/none", "--backend", backend];
        let from_file = [&["--password-file", file][..], &run].concat();
        let runs: [(&[&str], &str); 3] = [
            (&run, "DISTLOCK_PASSWORD"),
            (&status, "DISTLOCK_PASSWORD"),
            (&from_file, "--password-file"),
        ];
        for (args, source) in runs {
            let mut cmd = bin();
            if source == "DISTLOCK_PASSWORD" {
                cmd.env("DISTLOCK_PASSWORD", PW);
            }
            // Run from the scratch directory, where a relative path lands.
            let out = cmd.current_dir(&dir).args(args).output().unwrap();
            let err = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(2), "{args:?}: {out:?}");
            assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
            assert!(
                err.contains(&format!("{scheme} takes no password")) && err.contains(source),
                "{args:?}: {err}"
            );
            assert!(!err.contains(PW), "{args:?} showed the password: {err}");
        }
    }
    let entries: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        entries.iter().all(|e| !e.contains(PW)),
        "the password is on disk: {entries:?}"
    );
}

/// `--password-file` with `DISTLOCK_PASSWORD` set too, empty or not, is
/// refused with exit 2 before anything is sent: neither silently wins.
#[test]
fn a_password_file_and_the_password_variable_together_exit_2() {
    let dir = scratch("pw-both");
    let file = dir.join("password");
    std::fs::write(&file, "Zq9-secret\n").unwrap();
    for env in ["other", ""] {
        let out = bin()
            .env("DISTLOCK_PASSWORD", env)
            .args(["--password-file", file.to_str().unwrap()])
            .args(["status", "pw/x", "--backend", "redis://127.0.0.1:1"])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{env:?}: {err}");
        assert!(
            err.lines().count() == 1
                && err.contains("--password-file")
                && err.contains("DISTLOCK_PASSWORD"),
            "{env:?}: {err}"
        );
        assert!(!err.contains("Zq9-secret"), "{err}");
    }
}

/// The schemes that take a password still get it: none is refused as
/// taking none (the servers are not there, so each fails otherwise).
#[test]
fn every_backend_with_credentials_takes_the_password() {
    let forms = [
        "postgres://app@127.0.0.1:1/db",
        "postgresql://app@127.0.0.1:1/db",
        "mysql://app@127.0.0.1:1/db",
        "mariadb://app@127.0.0.1:1/db",
        "redis://127.0.0.1:1",
        "rediss://127.0.0.1:1",
        "redis+sentinel://127.0.0.1:1/mymaster",
        "redis+cluster://127.0.0.1:1",
        "rediss+sentinel://127.0.0.1:1/mymaster",
        "rediss+cluster://127.0.0.1:1",
        "redlock://127.0.0.1:1,127.0.0.1:2,127.0.0.1:3",
        "etcd://app@127.0.0.1:1",
        "etcds://app@127.0.0.1:1",
        "zk://app@127.0.0.1:1",
    ];
    for url in forms {
        let out = bin()
            .env("DISTLOCK_PASSWORD", "Zq9-secret")
            .args(["status", "pw/x", "--backend", url])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_ne!(out.status.code(), Some(0), "{url}: {err}");
        assert!(!err.contains("takes no password"), "{url}: {err}");
    }
}

/// A pipe whose reader has gone away: a write to it fails with EPIPE.
fn closed_pipe() -> Stdio {
    let mut reader = Command::new("true").stdin(Stdio::piped()).spawn().unwrap();
    let writer = reader.stdin.take().unwrap();
    reader.wait().unwrap();
    Stdio::from(writer)
}

/// A reader that went away (`distlock list | head -1`) ends each command
/// that prints quietly with 141 (128 + SIGPIPE), not with a panic.
#[test]
fn a_closed_stdout_ends_each_printing_command_with_141() {
    let b = sqlite("pipe");
    let mut holder = spawn_holder(&b, "pipe/held", 30);
    wait_held(&b, "pipe/held");
    let runs: [&[&str]; 6] = [
        &["backends"],
        &["list", "--backend", &b],
        &["list", "--json", "--backend", &b],
        &["status", "pipe/held", "--backend", &b],
        &["status", "pipe/held", "--json", "--backend", &b],
        &["conformance", "--only", "tokens_increase", "--backend", &b],
    ];
    for args in runs {
        let out = bin().args(args).stdout(closed_pipe()).output().unwrap();
        assert_eq!(out.status.code(), Some(141), "{args:?}: {out:?}");
        assert!(out.stderr.is_empty(), "{args:?}: {out:?}");
    }
    holder.kill().unwrap();
    holder.wait().unwrap();
}

/// `distlock conformance | head -1`: the reader goes away after the first
/// line, and the run ends at the next line it writes (141), not after
/// every case (about a minute on SQLite).
#[test]
fn conformance_ends_once_its_reader_went_away() {
    let b = sqlite("pipe-head");
    let mut head = Command::new("head")
        .arg("-1")
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let into_head = Stdio::from(head.stdin.take().unwrap());
    let mut run = bin()
        .args(["conformance", "--backend", &b])
        .stdout(into_head)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let status = exit_within(&mut run, Duration::from_secs(30));
    head.wait().unwrap();
    assert_eq!(status.code(), Some(141), "{status:?}");
}

/// `distlock observe NAME | head -1` while the leader stays: the
/// observation ends (141) once `head` has its line and exits, not at the
/// next change of leader, which may never come.
#[test]
fn observe_ends_once_its_reader_went_away_while_the_leader_stays() {
    let b = sqlite("observe-head");
    let mut leader = bin()
        .args([
            "elect",
            "--backend",
            &b,
            "--value",
            "v1",
            "observe/head",
            "--",
            "sleep",
            "60",
        ])
        .spawn()
        .unwrap();
    let start = Instant::now();
    while observe_once(&b, "observe/head", &[]) != (0, "v1".to_string()) {
        assert!(start.elapsed() < Duration::from_secs(20), "never led");
        std::thread::sleep(Duration::from_millis(50));
    }
    let mut head = Command::new("head")
        .arg("-1")
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let into_head = Stdio::from(head.stdin.take().unwrap());
    let mut observe = bin()
        .args(["observe", "--backend", &b, "observe/head"])
        .stdout(into_head)
        .spawn()
        .unwrap();
    head.wait().unwrap();
    let status = exit_within(&mut observe, Duration::from_secs(10));
    // SIGTERM: the leader ends its command (a SIGKILL would orphan it).
    let pid = nix::unistd::Pid::from_raw(i32::try_from(leader.id()).unwrap());
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
    leader.wait().unwrap();
    assert_eq!(status.code(), Some(141), "{status:?}");
}

/// A reader of standard error that went away (`distlock … 2>&1 | head -0`)
/// changes no exit code: the message is dropped, not a panic.
#[test]
fn a_closed_stderr_keeps_each_errors_exit_code() {
    let b = sqlite("stderr");
    type Run<'a> = (&'a [&'a str], &'a [(&'a str, &'a str)]);
    let runs: [Run<'_>; 3] = [
        (&["status", "x", "--backend", "nosuch://x"], &[]),
        (
            &["status", "x", "--backend", &b],
            &[("DISTLOCK_PASSWORD", "pw")],
        ),
        (&["run", "--limit", "0", "x", "--", "true"], &[]),
    ];
    for (args, env) in runs {
        let out = bin()
            .args(args)
            .envs(env.iter().copied())
            .stderr(closed_pipe())
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}: {out:?}");
    }
}

/// Waits up to `limit` for `child` to exit.
fn exit_within(child: &mut Child, limit: Duration) -> std::process::ExitStatus {
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        if start.elapsed() > limit {
            child.kill().unwrap();
            panic!("still running {limit:?} later");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `sig` sent to a `distlock run --wait 30s` that waits for `name`, which
/// `holder` holds, ends it within seconds with 128+sig and one line, before
/// the 2 s a subscription or LISTEN connection lingers after its last
/// waiter (dropped with the client, it keeps nothing running); then, once
/// the holder has released, a try takes the lock at once: no entry of the
/// waiter holds up the queue. With `queued`, the backend reports its
/// waiters: the waiter is seen queued first, and none is left after it.
fn signal_while_waiting(
    backend: &str,
    name: &str,
    sig: nix::sys::signal::Signal,
    holder: Child,
    queued: bool,
) {
    use nix::sys::signal::{kill, Signal};
    use nix::unistd::Pid;
    let pid = |c: &Child| Pid::from_raw(i32::try_from(c.id()).unwrap());
    let mut waiter = bin()
        .args(["run", "--wait", "30s", "--backend", backend, name])
        .args(["--", "true"])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let start = Instant::now();
    if queued {
        while !status_json(backend, name, &[]).contains("\"queue_len\":1") {
            assert!(start.elapsed() < Duration::from_secs(20), "never queued");
            std::thread::sleep(Duration::from_millis(50));
        }
    } else {
        wait_catching(waiter.id(), sig as i32);
        std::thread::sleep(Duration::from_millis(300));
    }
    kill(pid(&waiter), sig).unwrap();
    let signalled = Instant::now();
    let status = exit_within(&mut waiter, Duration::from_secs(8));
    let took = signalled.elapsed();
    let mut err = String::new();
    std::io::Read::read_to_string(&mut waiter.stderr.take().unwrap(), &mut err).unwrap();
    assert_eq!(
        status.code(),
        Some(128 + sig as i32),
        "{backend}: {status:?}: {err}"
    );
    assert!(
        took < Duration::from_millis(1500),
        "{backend}: exited {took:?} after the signal: a linger kept it"
    );
    assert_eq!(err.lines().count(), 1, "{backend}: {err}");
    assert!(err.contains(sig.as_str()), "{backend}: {err}");
    if queued {
        let left = status_json(backend, name, &[]);
        assert!(left.contains("\"queue_len\":0"), "{backend}: {left}");
    }
    // The holder's command gets the SIGTERM, and the lock is released.
    kill(pid(&holder), Signal::SIGTERM).unwrap();
    holder.wait_with_output().unwrap();
    assert_eq!(
        code(&run(backend, &["--wait", "0"], name, &["true"])),
        0,
        "{backend}: the queue stalls behind the signalled waiter"
    );
}

/// A signal while `run` waits for its lock cancels the wait: distlock
/// exits 130 for SIGINT, 143 for SIGTERM, and leaves no waiter behind on
/// the server (etcd's key, ZooKeeper's node, Redis's queue entry would
/// otherwise stay until their lease or session ends).
#[test]
fn a_signal_while_waiting_exits_128_plus_it_and_leaves_no_waiter() {
    use integration_tests::harness::{ServerKind, TestServer};
    use nix::sys::signal::Signal;
    let b = sqlite("sig-wait");
    for sig in [
        Signal::SIGTERM,
        Signal::SIGINT,
        Signal::SIGHUP,
        Signal::SIGQUIT,
        Signal::SIGUSR1,
        Signal::SIGUSR2,
        Signal::SIGALRM,
    ] {
        let holder = spawn_holder(&b, "sigwait/lock", 60);
        wait_held(&b, "sigwait/lock");
        signal_while_waiting(&b, "sigwait/lock", sig, holder, false);
    }
    // `elect`'s wait for leadership ends the same way.
    let elect = |value: &str, wait: &[&str], secs: &str| {
        bin()
            .args(["elect", "--backend", &b, "--value", value])
            .args(wait)
            .args(["sigwait/leader", "--", "sleep", secs])
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let leader = Stopped(elect("first", &[], "60"));
    let start = Instant::now();
    while observe_once(&b, "sigwait/leader", &[]).0 != 0 {
        assert!(start.elapsed() < Duration::from_secs(20), "never led");
        std::thread::sleep(Duration::from_millis(50));
    }
    for sig in [Signal::SIGHUP, Signal::SIGTERM] {
        let mut waiter = elect("second", &["--wait", "30s"], "0");
        wait_catching(waiter.id(), sig as i32);
        std::thread::sleep(Duration::from_millis(300));
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(i32::try_from(waiter.id()).unwrap()),
            sig,
        )
        .unwrap();
        let status = exit_within(&mut waiter, Duration::from_secs(8));
        assert_eq!(status.code(), Some(128 + sig as i32), "elect: {status:?}");
    }
    // Its command gets the SIGTERM and ends.
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(i32::try_from(leader.0.id()).unwrap()),
        Signal::SIGTERM,
    )
    .unwrap();
    let mut leader = leader;
    exit_within(&mut leader.0, Duration::from_secs(8));
    let zk = TestServer::start(ServerKind::ZooKeeper).unwrap();
    #[allow(unused_mut)]
    let mut backends = vec![(zk.url().to_string(), true)];
    #[cfg(feature = "etcd")]
    let etcd = etcd();
    #[cfg(feature = "etcd")]
    backends.push((etcd.url.clone(), true));
    #[cfg(feature = "redis")]
    let redis = redis();
    #[cfg(feature = "redis")]
    backends.push((format!("{}?fifo=true", redis.url), false));
    #[cfg(feature = "redis")]
    backends.push((redis.url.clone(), false));
    let pg = TestServer::start(ServerKind::Postgres).unwrap();
    backends.push((pg.url().to_string(), false));
    for (b, queued) in &backends {
        let holder = spawn_holder(b, "sigwait/lock", 60);
        wait_held(b, "sigwait/lock");
        signal_while_waiting(b, "sigwait/lock", Signal::SIGTERM, holder, *queued);
    }
}

/// A SQLite URL whose path is not absolute would name another file in
/// each working directory, so two commands started in two directories
/// would both hold the lock: it exits 2 at once, saying to give an
/// absolute path.
#[test]
fn a_relative_sqlite_path_exits_2() {
    let dir = scratch("relative-sqlite");
    for url in [
        "sqlite://locks.db",
        "sqlite://./locks.db",
        "sqlite://:memory:",
    ] {
        let out = run_command(url, &["--wait", "0"], "rel/lock", &["true"])
            .current_dir(&dir)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(code(&out), 2, "{url}: {err}");
        assert!(err.contains("absolute path"), "{url}: {err}");
        assert!(!dir.join("locks.db").exists(), "{url} made a file");
    }
}

/// A URL naming another kind of server's port (copied from another
/// backend's URL, say) exits 78 naming what the port speaks, not 69 as an
/// outage a retry could mend. MySQL's client waits for a greeting the
/// Redis server never sends: that one ends after the connect timeout, 5 s.
#[cfg(all(feature = "redis", feature = "etcd"))]
#[test]
fn a_url_with_another_servers_port_exits_78_naming_its_protocol() {
    use integration_tests::harness::{ServerKind, TestServer};
    let redis = redis();
    let redis_port = redis.url.rsplit(':').next().unwrap().to_string();
    let etcd = etcd();
    let pg = TestServer::start(ServerKind::Postgres).unwrap();
    let my = TestServer::start(ServerKind::MariaDb).unwrap();
    let zk = TestServer::start(ServerKind::ZooKeeper).unwrap();
    let at = |s: &TestServer| format!("{}:{}", s.host(), s.port());
    for (url, speaks) in [
        (
            format!("redis://{}", at(&pg)),
            "speaks PostgreSQL, not Redis",
        ),
        (
            format!("postgres://postgres@{}/postgres", at(&my)),
            "speaks MySQL/MariaDB, not PostgreSQL",
        ),
        (
            format!("mysql://root@127.0.0.1:{redis_port}/distlock"),
            "speaks Redis, not MySQL/MariaDB",
        ),
        (format!("etcd://{}", at(&zk)), "speaks ZooKeeper, not HTTP"),
        (
            format!("zk://{}", etcd.url.trim_start_matches("etcd://")),
            "speaks HTTP",
        ),
    ] {
        let out = run(&url, &[], "ports/mixed", &["true"]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(code(&out), 78, "{url}: {err}");
        assert!(err.contains(speaks), "{url}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{url}: {err}");
    }
}

/// `observe` on a server that requires a password it was not given exits
/// 78 at once, as `observe --once` does: retrying cannot help.
#[cfg(feature = "redis")]
#[test]
fn observe_refused_by_the_server_exits_78_instead_of_retrying() {
    let r = redis();
    let bare = r.url.replace(":s3cret@", "");
    let child = bin()
        .args(["observe", "--backend", &bare, "svc/refused"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut child = Stopped(child);
    let start = Instant::now();
    let status = loop {
        if let Some(status) = child.0.try_wait().unwrap() {
            break status;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "observe still running after 20 s against a server refusing it"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(status.code(), Some(78), "{status:?}");
}

/// `--wait` bounds the connect too: against a port that accepts the
/// connection and never answers, `run` and `elect` with `--wait 1s` give up
/// as unreachable (69) saying so, not after the backend's own connect
/// timeout with another message.
#[cfg(feature = "redis")]
#[test]
fn wait_bounds_the_connect_to_a_server_that_never_answers() {
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("redis://{}", silent.local_addr().unwrap());
    for args in [
        vec![
            "run",
            "--backend",
            &url,
            "--wait",
            "1s",
            "silent/run",
            "--",
            "true",
        ],
        vec![
            "elect",
            "--backend",
            &url,
            "--wait",
            "1s",
            "--value",
            "v",
            "silent/elect",
            "--",
            "true",
        ],
    ] {
        let out = bin().args(&args).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(69), "{args:?}: {err}");
        assert!(
            err.contains("the backend did not answer within --wait 1s"),
            "{args:?}: {err}"
        );
    }
    drop(silent);
}

/// Whether process `pid` is gone (or a zombie nobody reaped yet).
fn gone(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).map_or(true, |st| {
        st.rsplit(')')
            .next()
            .is_some_and(|r| r.trim_start().starts_with('Z'))
    })
}

/// Waits up to `limit` for `path` to exist.
/// Waits until process `pid` catches signal `sig` (its handler is
/// installed, as `/proc/<pid>/status` shows), up to 20 s: a signal before
/// that ends it by the default action.
fn wait_catching(pid: u32, sig: i32) {
    let start = Instant::now();
    loop {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
        let caught = status
            .lines()
            .find_map(|l| l.strip_prefix("SigCgt:"))
            .and_then(|mask| u64::from_str_radix(mask.trim(), 16).ok())
            .unwrap_or(0);
        if caught & (1 << (sig - 1)) != 0 {
            return;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "process {pid} never caught signal {sig}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn appears(path: &Path, limit: Duration) -> bool {
    let start = Instant::now();
    while !path.exists() {
        if start.elapsed() > limit {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    true
}

/// A job the command put in the background works under the lock: it is
/// stopped before the release, not left running after it.
#[test]
fn a_background_job_of_the_command_ends_before_the_release() {
    let dir = scratch("bg");
    let b = sqlite_in(&dir);
    let pidfile = dir.join("bg.pid");
    // The job keeps no pipe of distlock's open: `run` returns as soon
    // as distlock exits.
    let script = format!("sleep 30 >/dev/null 2>&1 & echo $! > {}", pidfile.display());
    let start = Instant::now();
    let out = run(&b, &[], "bg/job", &["sh", "-c", &script]);
    assert_eq!(code(&out), 0, "{out:?}");
    assert!(
        start.elapsed() < Duration::from_secs(25),
        "distlock waited for the job to end by itself"
    );
    let pid: u32 = std::fs::read_to_string(&pidfile)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(gone(pid), "the background sleep {pid} outlived the run");
}

/// Ctrl-Z (SIGTSTP to distlock) stops the command too; once the lease has
/// run out meanwhile and another process took the lock, continuing
/// distlock ends the command without letting it go on (exit 76).
#[test]
fn ctrl_z_stops_the_command_and_a_lapsed_lease_ends_it() {
    let dir = scratch("tstp");
    let b = sqlite_in(&dir);
    let (started, finished) = (dir.join("started"), dir.join("finished"));
    let script = format!(
        "touch {}; sleep 3; touch {}",
        started.display(),
        finished.display()
    );
    let child = bin()
        .args(["run", "--backend", &b, "--ttl", "1s", "tstp/n", "--"])
        .args(["sh", "-c", &script])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut child = Stopped(child);
    assert!(
        appears(&started, Duration::from_secs(20)),
        "the command never started"
    );
    let pid = child.0.id() as i32;
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGTSTP,
    )
    .unwrap();
    // Past the lease's TTL: another process gets the lock.
    let start = Instant::now();
    loop {
        let other = run(&b, &["--wait", "0"], "tstp/n", &["true"]);
        if code(&other) == 0 {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "the stopped holder's lock was never taken over: {other:?}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    std::thread::sleep(Duration::from_secs(3));
    assert!(
        !finished.exists(),
        "the command ran on while distlock was stopped"
    );
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGCONT,
    )
    .unwrap();
    let status = child.0.wait().unwrap();
    assert_eq!(status.code(), Some(76), "{status:?}");
    std::thread::sleep(Duration::from_secs(1));
    assert!(
        !finished.exists(),
        "the command went on after the lease had lapsed"
    );
}

/// A short Ctrl-Z, well inside the lease, stops the command's group and
/// distlock; continued, the command goes on and finishes under the lock
/// (exit 0), and the lock was held throughout.
#[test]
fn ctrl_z_within_the_lease_lets_the_command_go_on() {
    let dir = scratch("tstp-short");
    let b = sqlite_in(&dir);
    let (started, finished) = (dir.join("started"), dir.join("finished"));
    let script = format!(
        "touch {}; sleep 2; touch {}",
        started.display(),
        finished.display()
    );
    let child = bin()
        .args(["run", "--backend", &b, "--ttl", "30s", "tstp/short", "--"])
        .args(["sh", "-c", &script])
        .spawn()
        .unwrap();
    let mut child = Stopped(child);
    assert!(
        appears(&started, Duration::from_secs(20)),
        "the command never started"
    );
    let pid = nix::unistd::Pid::from_raw(child.0.id() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTSTP).unwrap();
    std::thread::sleep(Duration::from_secs(3));
    assert!(
        !finished.exists(),
        "the command ran on while distlock was stopped"
    );
    let other = run(&b, &["--wait", "0"], "tstp/short", &["true"]);
    assert_eq!(
        code(&other),
        75,
        "the lock was not held while its holder was stopped: {other:?}"
    );
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGCONT).unwrap();
    let status = child.0.wait().unwrap();
    assert_eq!(status.code(), Some(0), "{status:?}");
    assert!(
        finished.exists(),
        "the command did not go on once continued"
    );
}

/// SIGINT, SIGUSR1, SIGUSR2 and SIGALRM reach the command, as SIGTERM
/// does, rather than ending distlock and leaving the command running
/// unprotected: the command's own trap decides its exit status.
#[test]
fn sigint_sigusr1_sigusr2_and_sigalrm_are_forwarded_to_the_command() {
    use nix::sys::signal::Signal;
    let dir = scratch("usr1");
    let b = sqlite_in(&dir);
    for (signal, trap) in [
        (Signal::SIGINT, "INT"),
        (Signal::SIGUSR1, "USR1"),
        (Signal::SIGUSR2, "USR2"),
        (Signal::SIGALRM, "ALRM"),
    ] {
        let ready = dir.join(format!("ready-{trap}"));
        let script = format!(
            "trap 'exit 3' {trap}; touch {}; i=0; while [ $i -lt 300 ]; do sleep 0.1; i=$((i+1)); done",
            ready.display()
        );
        let child = bin()
            .args(["run", "--backend", &b, "usr1/n", "--", "sh", "-c", &script])
            .spawn()
            .unwrap();
        let mut child = Stopped(child);
        assert!(
            appears(&ready, Duration::from_secs(20)),
            "the command never started"
        );
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.0.id() as i32), signal).unwrap();
        let status = child.0.wait().unwrap();
        assert_eq!(status.code(), Some(3), "{trap}: {status:?}");
    }
}

/// With neither `XDG_STATE_HOME` nor `HOME` (cron), the default file lives
/// in `distlock-<uid>` in the temporary directory, made private; one that
/// others may write (made first by someone else) is refused (78).
#[test]
fn without_home_the_default_file_is_in_a_private_directory() {
    use std::os::unix::fs::PermissionsExt;
    let uid = std::fs::metadata("/proc/self").map(|m| {
        use std::os::unix::fs::MetadataExt;
        m.uid()
    });
    let uid = uid.unwrap();
    for (tag, prepared) in [("nohome", false), ("nohome-taken", true)] {
        let tmp = scratch(tag);
        let dir = tmp.join(format!("distlock-{uid}"));
        if prepared {
            std::fs::create_dir(&dir).unwrap();
            std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
        }
        let out = bin()
            .env_remove("HOME")
            .env_remove("XDG_STATE_HOME")
            .env_remove("DISTLOCK_BACKEND")
            .env("TMPDIR", &tmp)
            .args(["run", "nohome/n", "--", "true"])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        if prepared {
            assert_eq!(code(&out), 78, "{err}");
            assert!(err.contains("only it may write"), "{err}");
        } else {
            assert_eq!(code(&out), 0, "{err}");
            let mode = std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode, 0o700, "{}", dir.display());
            assert!(dir.join("locks.db").exists());
        }
    }
}

/// SIGINT to a `run` of two locks that holds the first and waits for the
/// second ends it at once (130, one line): the first is released and
/// nothing of the client is left to wait for.
#[test]
fn a_signal_while_waiting_for_several_locks_ends_it_at_once() {
    use nix::sys::signal::{kill, Signal};
    use nix::unistd::Pid;
    let b = sqlite("sig-multi");
    let mut holder = Stopped(spawn_holder(&b, "sigmulti/b", 60));
    wait_held(&b, "sigmulti/b");
    let mut waiter = bin()
        .args(["run", "--wait", "30s", "--backend", &b])
        .args(["sigmulti/a", "sigmulti/b", "--", "true"])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_catching(waiter.id(), Signal::SIGINT as i32);
    std::thread::sleep(Duration::from_millis(500));
    kill(Pid::from_raw(waiter.id() as i32), Signal::SIGINT).unwrap();
    let status = exit_within(&mut waiter, Duration::from_secs(8));
    let mut err = String::new();
    std::io::Read::read_to_string(&mut waiter.stderr.take().unwrap(), &mut err).unwrap();
    assert_eq!(status.code(), Some(130), "{status:?}: {err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert_eq!(
        code(&run(&b, &["--wait", "0"], "sigmulti/a", &["true"])),
        0,
        "the first lock was left held"
    );
    let _ = holder.0.kill();
}

/// A ZooKeeper server that does not answer: `status` fails in one line,
/// exit 69.
#[cfg(feature = "zookeeper")]
#[test]
fn status_on_a_paused_zookeeper_fails_in_one_line() {
    use integration_tests::harness::{ServerKind, TestServer};
    let zk = TestServer::start_private(ServerKind::ZooKeeper).unwrap();
    let process = zk.process().expect("a local ZooKeeper");
    process.signal("STOP").unwrap();
    let out = bin()
        .args(["status", "--backend", zk.url(), "paused/x"])
        .output()
        .unwrap();
    process.signal("CONT").unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(code(&out), 69, "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
}

/// `--wait` outlasts a backend that is down as the command starts (a
/// server restarting): the command runs once it is back. One that stays
/// down is 69 once the wait has run out, not at once.
#[cfg(feature = "redis")]
#[test]
fn wait_outlasts_a_backend_down_at_start() {
    let mut server = integration_tests::harness::redis::spawn(&[]).unwrap();
    let url = format!("redis://127.0.0.1:{}", server.port);
    server.stop();
    let waiting = bin()
        .args(["run", "--backend", &url, "--wait", "30s", "down/at-start"])
        .args(["--", "true"])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    server.restart().unwrap();
    let out = waiting.wait_with_output().unwrap();
    assert_eq!(code(&out), 0, "{}", String::from_utf8_lossy(&out.stderr));
    server.stop();
    let start = Instant::now();
    let out = bin()
        .args(["run", "--backend", &url, "--wait", "2s", "down/throughout"])
        .args(["--", "true"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(code(&out), 69, "{err}");
    assert!(
        start.elapsed() >= Duration::from_millis(1500),
        "gave up after {:?}: {err}",
        start.elapsed()
    );
}

/// SIGTERM to `run` stops a shell loop's whole group at once: the shell's
/// child, left a zombie when the shell dies first, is not taken for a
/// process the command left running (no warning, no wait for
/// `--kill-after`).
#[test]
fn sigterm_stops_a_shell_loop_without_waiting_for_its_zombies() {
    use nix::sys::signal::{kill, Signal};
    use nix::unistd::Pid;
    let b = sqlite("sig-loop");
    let mut child = bin()
        .args(["run", "--backend", &b, "--kill-after", "5s", "loop"])
        .args(["--", "sh", "-c", "while :; do sleep 0.1; done"])
        .env("RUST_LOG", "warn")
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_catching(child.id(), Signal::SIGTERM as i32);
    std::thread::sleep(Duration::from_millis(1000));
    let start = Instant::now();
    kill(
        Pid::from_raw(i32::try_from(child.id()).unwrap()),
        Signal::SIGTERM,
    )
    .unwrap();
    let status = exit_within(&mut child, Duration::from_secs(10));
    let took = start.elapsed();
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
    assert_eq!(status.code(), Some(143), "{status:?}: {err}");
    assert!(!err.contains("left processes"), "{err}");
    assert!(
        took < Duration::from_secs(3),
        "exited after {took:?}: {err}"
    );
}

/// A password holding an unencoded `/`, `?` or `#` (etcd: `?`, which
/// its URL splits at; it takes the rest as written) is refused as an
/// invalid URL (exit 2) on every backend, and no part of it is shown:
/// parsed as it stands, part of it would be named as a host, a path or a
/// parameter.
#[test]
fn an_unencoded_delimiter_in_a_password_is_refused_without_showing_it() {
    for url in [
        "redis://u:S3cr3t/XYZZY@127.0.0.1:1",
        "redis+sentinel://u:S3cr3t?XYZZY@127.0.0.1:1/m",
        "redlock://u:S3cr3t/XYZZY@127.0.0.1:1,127.0.0.1:2,127.0.0.1:3",
        "postgres://u:S3cr3t/XYZZY@127.0.0.1:1/db",
        "mysql://u:S3cr3t?XYZZY@127.0.0.1:1/db",
        "etcd://u:S3cr3t?XYZZY@127.0.0.1:1",
        "zk://u:S3cr3t/XYZZY@127.0.0.1:1",
        "redis://u:S3cr3t?XYZ=ZY@127.0.0.1:1",
    ] {
        let out = bin()
            .args(["run", "--backend", url, "n", "--", "true"])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(code(&out), 2, "{url}: {err}");
        assert!(err.contains("percent-encoded"), "{url}: {err}");
        assert!(
            !err.contains("S3cr3t") && !err.contains("XYZZY"),
            "{url}: {err}"
        );
    }
}

/// A closed stderr (`2>&1 | true`) costs distlock its messages, not its
/// exit code: the log lines it cannot write are dropped, not a panic (101).
#[test]
fn a_closed_stderr_keeps_the_exit_code() {
    // Warnings on: each failed connection attempt logs one.
    let mut child = bin()
        .env("RUST_LOG", "warn")
        .args([
            "run",
            "--backend",
            "redis://127.0.0.1:1",
            "--wait",
            "2s",
            "n",
            "--",
            "true",
        ])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stderr.take());
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(69), "{status:?}");
}

/// A server that goes away during the run makes the rest of the cases
/// fail; asked once more at the end, it is unreachable, and the run's
/// status is 69 (unreachable), not 1 (not conformant).
#[cfg(feature = "redis")]
#[test]
fn conformance_whose_server_goes_away_exits_unavailable() {
    let server = integration_tests::harness::redis::spawn(&[])
        .expect("redis-server must start; run scripts/test.sh to install it");
    let mut run = bin()
        .args(["conformance", "--backend"])
        .arg(format!("redis://127.0.0.1:{}", server.port))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The server goes once the first case has reported.
    let mut stdout = std::io::BufReader::new(run.stdout.take().unwrap());
    let mut line = String::new();
    while !line.contains("::") {
        line.clear();
        let read = std::io::BufRead::read_line(&mut stdout, &mut line).unwrap();
        assert!(read > 0, "conformance reported no case");
    }
    drop(server);
    std::io::Read::read_to_string(&mut stdout, &mut line).unwrap();
    let out = run.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(code(&out), 69, "{err}");
    assert!(err.contains("stopped answering during the run"), "{err}");
}

/// A wait that gives up while its request waits in the server behind a
/// row lock (another session's transaction) stays until the request lands
/// (5 s at most) and releases what it granted: the lock is free once that
/// transaction ends, not held for the waiter's TTL by nobody.
#[test]
fn a_wait_that_gave_up_releases_a_grant_that_lands_after_it() {
    use integration_tests::harness::{postgres, ServerKind, TestServer};
    let server = TestServer::start(ServerKind::Postgres).unwrap();
    let url = server.url().to_string();
    let name = format!("orphan/{}", std::process::id());
    assert_eq!(code(&run(&url, &[], &name, &["true"])), 0);
    let mut blocker = postgres::psql(&url)
        .unwrap()
        .arg("-c")
        .arg(format!(
            "BEGIN; SELECT token FROM distlock_locks WHERE name = '{name}' FOR UPDATE; SELECT pg_sleep(3); COMMIT;"
        ))
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    // The row is locked once the blocker sleeps.
    let start = Instant::now();
    loop {
        let sleeping = postgres::psql(&url)
            .unwrap()
            .args(["-tA", "-c"])
            .arg("SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'PgSleep'")
            .output()
            .unwrap();
        if String::from_utf8_lossy(&sleeping.stdout).trim() == "1" {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "the blocker never slept: {sleeping:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let waited = run(&url, &["--ttl", "60s", "--wait", "1s"], &name, &["true"]);
    assert_eq!(code(&waited), 75, "{waited:?}");
    assert!(blocker.wait().unwrap().success());
    assert_eq!(
        code(&run(&url, &["--wait", "0"], &name, &["true"])),
        0,
        "the given-up wait's grant is held by nobody"
    );
}

/// A ZooKeeper campaigner whose process is paused while it waits, past its
/// session's end, as the leader resigns and the next campaigner takes over:
/// once it resumes it does not run its command beside the new leader (the
/// old leader's end, read only after the pause, is no grant).
#[cfg(feature = "zookeeper")]
#[test]
fn a_campaigner_paused_past_its_session_does_not_lead_beside_the_next() {
    use integration_tests::harness::{zookeeper, ServerKind};
    use nix::sys::signal::{kill, Signal};
    use nix::unistd::Pid;
    let zk = zookeeper::spawn().expect("ZooKeeper must start; run scripts/test.sh to install it");
    let url = ServerKind::ZooKeeper.url("127.0.0.1", zk.port);
    let started = scratch("paused-campaigner").join("b-started");
    let elect = |value: &str, cmd: &str| {
        bin()
            .args(["elect", "--backend", &url, "--value", value, "--ttl", "3s"])
            .args(["paused/e", "--", "sh", "-c", cmd])
            .stderr(Stdio::null())
            .spawn()
            .unwrap()
    };
    let leads = |value: &str| {
        let start = Instant::now();
        while observe_once(&url, "paused/e", &[]) != (0, value.to_string()) {
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "{value} never led"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    // Waits until `n` campaigns are queued (their nodes under the
    // election's).
    let queued = |n: usize| {
        let start = Instant::now();
        loop {
            let ls = zookeeper::cli(
                &format!("127.0.0.1:{}", zk.port),
                &["ls", "/distlock/paused/e"],
            )
            .unwrap()
            .output()
            .unwrap();
            if String::from_utf8_lossy(&ls.stdout)
                .matches("latch-")
                .count()
                >= n
            {
                return;
            }
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "{n} campaigns never queued"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    };
    let mut a = elect("A", "sleep 60");
    leads("A");
    let b_runs = format!("echo started >> {}; sleep 60", started.display());
    let mut b = elect("B", &b_runs);
    queued(2);
    let mut c = elect("C", "sleep 60");
    queued(3);
    let pid = |c: &Child| Pid::from_raw(i32::try_from(c.id()).unwrap());
    kill(pid(&b), Signal::SIGSTOP).unwrap();
    let stopped = Instant::now();
    kill(pid(&a), Signal::SIGTERM).unwrap();
    a.wait().unwrap();
    leads("C");
    // B's session (3 s) has surely ended by the time it resumes.
    std::thread::sleep(Duration::from_secs(7).saturating_sub(stopped.elapsed()));
    kill(pid(&b), Signal::SIGCONT).unwrap();
    std::thread::sleep(Duration::from_secs(3));
    let b_started = started.exists();
    let mut ended = [&mut b, &mut c].map(|p| {
        let _ = kill(pid(p), Signal::SIGTERM);
        p.wait().unwrap().code()
    });
    assert!(!b_started, "B ran its command while C led");
    // Still waiting when told to stop (128 + SIGTERM), not granted and
    // then lost (76) as its command was started.
    assert_eq!(ended[0].take(), Some(143), "B's exit");
}

/// A semaphore limit that distlock does not write (another application's
/// data, or edited by hand: not a whole number from 1 to 4294967295 in
/// plain digits) is a refused configuration: `run --limit`, `status
/// --semaphore` and `set-limit` exit 78, not 69 (retrying cannot mend it),
/// and `set-limit` leaves it as it is, on Redis, Redlock, etcd and
/// ZooKeeper.
#[cfg(all(feature = "redis", feature = "etcd", feature = "zookeeper"))]
#[test]
fn a_semaphore_limit_distlock_did_not_write_exits_78() {
    use integration_tests::harness::{redis as redis_server, zookeeper, ServerKind};
    let refused = |backend: &str, name: &str| {
        let out = run(backend, &["--limit", "2"], name, &["true"]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(code(&out), 78, "{backend} {name}: {err}");
        assert!(
            err.contains("not write") || err.contains("did not write"),
            "{err}"
        );
        let out = bin()
            .args(["status", "--semaphore", "--backend", backend, name])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(code(&out), 78, "status of {backend} {name}: {err}");
        let out = bin()
            .args(["set-limit", "--backend", backend, name, "3"])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(code(&out), 78, "set-limit of {backend} {name}: {err}");
        // Left as it was: still refused, not a mismatch with 3 (exit 2).
        let out = run(backend, &["--limit", "2"], name, &["true"]);
        assert_eq!(code(&out), 78, "{backend} {name} after set-limit");
    };
    let r = redis_server::spawn(&[]).unwrap();
    let url = format!("redis://127.0.0.1:{}", r.port);
    let redis_values = [
        ("fl/text", "abc"),
        ("fl/zero", "0"),
        ("fl/frac", "2.5"),
        ("fl/big", "99999999999"),
        ("fl/exp", "1e3"),
        ("fl/hex", "0x10"),
        ("fl/space", " 5"),
    ];
    for (name, value) in redis_values {
        redis_server::command(
            r.port,
            &["SET", &format!("{{{name}}}:semaphore:limit"), value],
        )
        .unwrap();
        refused(&url, name);
    }
    // Redlock: the same foreign limit on each of three nodes.
    let more = [
        redis_server::spawn(&[]).unwrap(),
        redis_server::spawn(&[]).unwrap(),
    ];
    let ports = [r.port, more[0].port, more[1].port];
    for port in ports {
        redis_server::command(port, &["SET", "{fl/rl}:semaphore:limit", "abc"]).unwrap();
    }
    let hosts: Vec<String> = ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
    refused(&format!("redlock://{}", hosts.join(",")), "fl/rl");
    let etcd = etcd();
    let endpoint = etcd.url.trim_start_matches("etcd://").to_string();
    for (name, value) in [
        ("fl/text", "abc"),
        ("fl/zero", "0"),
        ("fl/plus", "+5"),
        ("fl/lead0", "03"),
    ] {
        let put = integration_tests::harness::etcd::etcdctl(&endpoint)
            .unwrap()
            .args(["put", &format!("/distlock/semaphores/{name}/@limit"), value])
            .output()
            .unwrap();
        assert!(put.status.success(), "{put:?}");
        refused(&etcd.url, name);
    }
    let zk = zookeeper::spawn().expect("ZooKeeper must start; run scripts/test.sh to install it");
    let url = ServerKind::ZooKeeper.url("127.0.0.1", zk.port);
    assert_eq!(code(&run(&url, &["--limit", "2"], "fl/text", &["true"])), 0);
    let set = zookeeper::cli(
        &format!("127.0.0.1:{}", zk.port),
        &["set", "/distlock/@semaphores/fl/text", "abc"],
    )
    .unwrap()
    .output()
    .unwrap();
    assert!(set.status.success(), "{set:?}");
    refused(&url, "fl/text");
}
