//! Peer libraries on the same servers, in the same run: redis-py's `Lock`
//! (Redis), kazoo's `Lock` (ZooKeeper), both timed per operation inside
//! their own Python process; rslock (Redlock), in this process, alternating
//! with distlock; and `etcdctl lock` (etcd), timed per process against this
//! binary doing one acquire+release per process.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::Duration;

use distlock::LockClient;
use tokio::process::Command;
use tokio::time::Instant;

use crate::{BoxError, Series};

fn script(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("peers")
        .join(name)
}

/// distlock's uncontended acquire+release in this process: (p50, p99) µs.
async fn ours(lib: &LockClient, name: &str, n: u32) -> Result<(u64, u64), BoxError> {
    let mut h = hdrhistogram::Histogram::<u64>::new_with_bounds(1, 60_000_000, 3)?;
    for i in 0..(n + n / 10) {
        let start = Instant::now();
        crate::cycle(lib, name).await?;
        if i >= n / 10 {
            h.record(start.elapsed().as_micros().max(1) as u64)?;
        }
    }
    Ok((h.value_at_quantile(0.5), h.value_at_quantile(0.99)))
}

async fn python(args: &[String]) -> Result<(u64, u64), BoxError> {
    let out = Command::new("python3")
        .args(args)
        .output()
        .await
        .map_err(|e| {
            format!(
                "python3: {e}; the peers need python3 with `python3 -m pip install redis kazoo`"
            )
        })?;
    if !out.status.success() {
        return Err(format!(
            "{} failed: {}\n(install the peers with `python3 -m pip install redis kazoo`)",
            args[0],
            String::from_utf8_lossy(&out.stderr)
        )
        .into());
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let v: Vec<u64> = text
        .split_whitespace()
        .filter_map(|x| x.parse().ok())
        .collect();
    match v[..] {
        [p50, p99] => Ok((p50, p99)),
        _ => Err(format!("unexpected output from {}: {text:?}", args[0]).into()),
    }
}

fn row(md: &mut String, what: &str, how: &str, p: (u64, u64)) {
    let _ = writeln!(md, "| {what} | {how} | {} | {} |", p.0, p.1);
}

/// Runs the peer for `backend` (if it has one) and distlock right after it.
pub(crate) async fn run(
    backend: &str,
    url: &str,
    n: u32,
    lib: &LockClient,
    md: &mut String,
) -> Result<(), BoxError> {
    let head = |md: &mut String| {
        let _ = writeln!(
            md,
            "\n#### {backend}: against a peer library (uncontended acquire+release)\n\n| client | how it was run | p50 µs | p99 µs |\n|---|---|---|---|"
        );
    };
    match backend {
        "redis" | "zookeeper" => {
            head(md);
            let (peer_name, script_name, target) = if backend == "redis" {
                ("redis-py", "redis_py_lock.py", url.to_string())
            } else {
                (
                    "kazoo",
                    "kazoo_lock.py",
                    url.trim_start_matches("zk://").to_string(),
                )
            };
            let peer = python(&[
                script(script_name).display().to_string(),
                target,
                n.to_string(),
            ])
            .await?;
            let me = ours(lib, "bench/peer/distlock", n).await?;
            row(
                md,
                &format!("{peer_name} `Lock`"),
                "Python 3, in-process timer, `acquire(blocking=False)` + `release()`",
                peer,
            );
            row(
                md,
                "distlock",
                "in-process timer, `try_acquire` + `release`",
                me,
            );
            let _ = writeln!(
                md,
                "\ndistlock / {peer_name} at p50: **{:.2}**",
                me.0 as f64 / peer.0 as f64
            );
        }
        "redlock" => {
            let _ = writeln!(
                md,
                "\n#### {backend}: against a peer library (uncontended acquire+release)"
            );
            let peer = rslock::LockManager::new(rslock_nodes(url));
            let backend_alone = crate::backend_step(lib, "peer");
            let rslock_cycle = || async {
                let l = peer
                    .lock("bench/peer/rslock", Duration::from_secs(30))
                    .await
                    .map_err(|e| format!("rslock: {e:?}"))?;
                peer.unlock(&l).await;
                Ok::<(), BoxError>(())
            };
            let mut all = [
                Series::new("rslock")?,
                Series::new("distlock")?,
                Series::new("backend alone")?,
            ];
            // Alternate one operation of each; the first tenth as many
            // rounds are a warm-up, measured and then thrown away.
            for i in 0..(n + n / 10) {
                if i == n / 10 {
                    all = [
                        Series::new("rslock")?,
                        Series::new("distlock")?,
                        Series::new("backend alone")?,
                    ];
                }
                let [theirs, mine, backend_only] = &mut all;
                theirs.time(rslock_cycle()).await?;
                mine.time(crate::cycle(lib, "bench/peer/distlock")).await?;
                backend_only.time(backend_alone(i, 0)).await?;
            }
            let [theirs, mine, backend_only] = &all;
            let _ = writeln!(
                md,
                "\n| client | how it was run | p50 µs | p99 µs | client CPU µs/op | thread blocks/op |\n|---|---|---|---|---|---|"
            );
            for (s, what, how) in [
                (theirs, "rslock 0.10 `LockManager`", "in this process, alternating, `lock` + `unlock`"),
                (mine, "distlock", "in this process, alternating, `try_acquire` + `release`"),
                (
                    backend_only,
                    "distlock's backend alone",
                    "the same, `Backend::try_acquire` + `release` without the client (no guard, no renewal)",
                ),
            ] {
                let _ = writeln!(
                    md,
                    "| {what} | {how} | {} | {} | {:.1} | {:.2} |",
                    s.p(0.5),
                    s.p(0.99),
                    s.cpu_per_op(),
                    s.blocked_per_op()
                );
            }
            let _ = writeln!(
                md,
                "\ndistlock / rslock at p50: **{:.2}** (the backend alone: {:.2})",
                mine.p(0.5) as f64 / theirs.p(0.5) as f64,
                backend_only.p(0.5) as f64 / theirs.p(0.5) as f64
            );
            redlock_handoffs(url, lib, &peer, n, md).await?;
        }
        "etcd" => {
            head(md);
            let endpoint = url.replacen("etcd://", "http://", 1);
            let runs = (n / 10).max(5);
            let me_exe = std::env::current_exe()?;
            let mut peer = hdrhistogram::Histogram::<u64>::new_with_bounds(1, 60_000_000, 3)?;
            let mut mine = peer.clone();
            // Alternate the two, one process per acquire+release each.
            for _ in 0..runs {
                let start = Instant::now();
                let st = Command::new("etcdctl")
                    .env("ETCDCTL_API", "3")
                    .args([
                        "--endpoints",
                        &endpoint,
                        "lock",
                        "bench/peer/etcdctl",
                        "--",
                        "true",
                    ])
                    .output()
                    .await
                    .map_err(|e| format!("etcdctl: {e}"))?;
                if !st.status.success() {
                    return Err(format!(
                        "etcdctl lock failed: {}",
                        String::from_utf8_lossy(&st.stderr)
                    )
                    .into());
                }
                peer.record(start.elapsed().as_micros().max(1) as u64)?;
                let start = Instant::now();
                let st = Command::new(&me_exe)
                    .env(crate::ONCE_ENV, url)
                    .output()
                    .await?;
                if !st.status.success() {
                    return Err(format!(
                        "distlock-bench once failed: {}",
                        String::from_utf8_lossy(&st.stderr)
                    )
                    .into());
                }
                mine.record(start.elapsed().as_micros().max(1) as u64)?;
            }
            let p = |h: &hdrhistogram::Histogram<u64>| {
                (h.value_at_quantile(0.5), h.value_at_quantile(0.99))
            };
            row(
                md,
                "`etcdctl lock NAME -- true`",
                "one process per acquire+release, wall time",
                p(&peer),
            );
            row(
                md,
                "distlock (this binary, one acquire+release per process)",
                "one process per acquire+release, wall time",
                p(&mine),
            );
            let _ = writeln!(
                md,
                "\ndistlock / etcdctl at p50: **{:.2}** ({runs} processes each, alternating)",
                p(&mine).0 as f64 / p(&peer).0 as f64
            );
        }
        _ => {}
    }
    Ok(())
}

/// rslock's node URLs for a `redlock://host:port,...` URL.
fn rslock_nodes(url: &str) -> Vec<String> {
    url.trim_start_matches("redlock://")
        .split(',')
        .map(|n| format!("redis://{n}/"))
        .collect()
}

/// Handoff latency, distlock against rslock, with one harness: a holder
/// (one client) holds for `HOLD_FOR` while a waiter (a second client with
/// its own connections) blocks in its acquire, then releases; the latency
/// runs from the start of the release call to the waiter holding the lock.
/// rslock's `acquire` retries on its own schedule (up to three tries, each
/// after a random 0-200 ms delay, then again); distlock's waiter is woken
/// by the release message.
async fn redlock_handoffs(
    url: &str,
    lib: &LockClient,
    peer: &rslock::LockManager,
    n: u32,
    md: &mut String,
) -> Result<(), BoxError> {
    let rounds = (n / 100).clamp(3, 30);
    let waiter_lib = LockClient::from_dyn(distlock::connect(url).await?);
    let waiter_peer = rslock::LockManager::new(rslock_nodes(url));
    let ttl = Duration::from_secs(30);
    let (mut theirs, mut mine) = (Series::new("rslock")?, Series::new("distlock")?);
    for _ in 0..rounds {
        let held = peer
            .lock("bench/peer/rslock-handoff", ttl)
            .await
            .map_err(|e| format!("rslock: {e:?}"))?;
        let waiter = async {
            let l = waiter_peer
                .acquire_no_guard("bench/peer/rslock-handoff", ttl)
                .await
                .map_err(|e| format!("rslock: {e:?}"))?;
            Ok::<_, BoxError>((Instant::now(), l))
        };
        let releaser = async {
            tokio::time::sleep(crate::contention::HOLD_FOR).await;
            let at = Instant::now();
            peer.unlock(&held).await;
            Ok::<_, BoxError>(at)
        };
        let (got, released) = tokio::join!(waiter, releaser);
        let (got, l) = got?;
        theirs.record(got.saturating_duration_since(released?))?;
        waiter_peer.unlock(&l).await;

        let held = lib
            .lock("bench/peer/distlock-handoff")
            .ttl(ttl)
            .try_acquire()
            .await?
            .ok_or("distlock handoff lock busy")?;
        let waiter = async {
            let g = waiter_lib
                .lock("bench/peer/distlock-handoff")
                .ttl(ttl)
                .acquire()
                .await?;
            Ok::<_, BoxError>((Instant::now(), g))
        };
        let releaser = async {
            tokio::time::sleep(crate::contention::HOLD_FOR).await;
            let at = Instant::now();
            held.release().await?;
            Ok::<_, BoxError>(at)
        };
        let (got, released) = tokio::join!(waiter, releaser);
        let (got, g) = got?;
        mine.record(got.saturating_duration_since(released?))?;
        g.release().await?;
    }
    let _ = writeln!(
        md,
        "\n#### redlock: handoff against a peer library (one waiter, {rounds} handoffs each, alternating)\n\n| client | p50 µs | p99 µs |\n|---|---|---|\n| rslock 0.10 (`acquire_no_guard`: retries after random 0-200 ms delays) | {} | {} |\n| distlock (`acquire`: woken by the release message) | {} | {} |\n\ndistlock / rslock at p50: **{:.3}**",
        theirs.p(0.5),
        theirs.p(0.99),
        mine.p(0.5),
        mine.p(0.99),
        mine.p(0.5) as f64 / theirs.p(0.5) as f64
    );
    Ok(())
}
