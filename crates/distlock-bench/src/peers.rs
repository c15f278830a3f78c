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

use crate::BoxError;

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
            head(md);
            let nodes: Vec<String> = url
                .trim_start_matches("redlock://")
                .split(',')
                .map(|n| format!("redis://{n}/"))
                .collect();
            let peer = rslock::LockManager::new(nodes);
            let mut theirs = hdrhistogram::Histogram::<u64>::new_with_bounds(1, 60_000_000, 3)?;
            let mut mine = theirs.clone();
            let mut backend_only = theirs.clone();
            let backend_alone = crate::backend_step(lib, "peer");
            // Alternate one operation of each, after a tenth as many warm-up
            // rounds.
            for i in 0..(n + n / 10) {
                let start = Instant::now();
                let l = peer
                    .lock("bench/peer/rslock", Duration::from_secs(30))
                    .await
                    .map_err(|e| format!("rslock: {e:?}"))?;
                peer.unlock(&l).await;
                let t = start.elapsed();
                let start = Instant::now();
                crate::cycle(lib, "bench/peer/distlock").await?;
                let m = start.elapsed();
                let start = Instant::now();
                backend_alone(i, 0).await?;
                let b = start.elapsed();
                if i >= n / 10 {
                    theirs.record(t.as_micros().max(1) as u64)?;
                    mine.record(m.as_micros().max(1) as u64)?;
                    backend_only.record(b.as_micros().max(1) as u64)?;
                }
            }
            let p = |h: &hdrhistogram::Histogram<u64>| {
                (h.value_at_quantile(0.5), h.value_at_quantile(0.99))
            };
            row(
                md,
                "rslock 0.10 `LockManager`",
                "in this process, alternating, `lock` + `unlock`",
                p(&theirs),
            );
            row(
                md,
                "distlock",
                "in this process, alternating, `try_acquire` + `release`",
                p(&mine),
            );
            row(
                md,
                "distlock's backend alone",
                "the same, `Backend::try_acquire` + `release` without the client (no guard, no renewal)",
                p(&backend_only),
            );
            let _ = writeln!(
                md,
                "\ndistlock / rslock at p50: **{:.2}** (the backend alone: {:.2})",
                p(&mine).0 as f64 / p(&theirs).0 as f64,
                p(&backend_only).0 as f64 / p(&theirs).0 as f64
            );
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
