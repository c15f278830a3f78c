//! Multi-lock: k free names taken at once (`lock_all`) against k single
//! acquisitions one after another and against k raw minimal sequences, for
//! k = 1, 4 and 16; and the server requests a multi-lock of 4 costs where
//! the backend counts them.

use std::fmt::Write as _;
use std::time::Duration;

use distlock::LockClient;

use crate::{BoxError, Results, Series, Target};

/// Names per multi-lock.
const SIZES: [usize; 3] = [1, 4, 16];

fn names(tag: &str, i: u32, k: usize) -> Vec<String> {
    (0..k)
        .map(|j| format!("bench/multi/{tag}/{i}/{j}"))
        .collect()
}

pub(crate) async fn run(
    t: &Target,
    lib: &LockClient,
    n: u32,
    r: &mut Results,
) -> Result<(), BoxError> {
    let ttl = Duration::from_secs(30);
    let _ = writeln!(
        r.md,
        "\n#### {}: multi-lock of k free names (n = {n} each)\n\n| k | raw × k p50 µs | k single acquires p50 µs | multi-lock p50 µs | multi / single | multi / raw |\n|---|---|---|---|---|---|",
        t.name
    );
    for k in SIZES {
        let (mut raw, mut single, mut multi) = (
            Series::new("raw")?,
            Series::new("single")?,
            Series::new("multi")?,
        );
        for i in 0..(n + n / 10) {
            let keep = i >= n / 10;
            let mut scratch = Series::new("warm-up")?;
            let s = if keep { &mut raw } else { &mut scratch };
            s.time(async {
                for j in 0..k {
                    (t.raw)(i, j).await?;
                }
                Ok(())
            })
            .await?;
            let s = if keep { &mut single } else { &mut scratch };
            s.time(async {
                let mut held = Vec::with_capacity(k);
                for name in names("single", i % 64, k) {
                    held.push(
                        lib.lock(&name)
                            .ttl(ttl)
                            .try_acquire()
                            .await?
                            .ok_or("lock busy")?,
                    );
                }
                for g in held {
                    g.release().await?;
                }
                Ok(())
            })
            .await?;
            let s = if keep { &mut multi } else { &mut scratch };
            s.time(async {
                let m = lib
                    .lock_all(names("multi", i % 64, k))
                    .ttl(ttl)
                    .try_acquire()
                    .await?
                    .ok_or("multi-lock busy")?;
                m.release().await?;
                Ok(())
            })
            .await?;
        }
        let p = |s: &Series| s.p(0.5) as f64;
        let _ = writeln!(
            r.md,
            "| {k} | {} | {} | {} | {:.2} | {:.2} |",
            raw.p(0.5),
            single.p(0.5),
            multi.p(0.5),
            p(&multi) / p(&single),
            p(&multi) / p(&raw)
        );
    }
    if let Some(count) = &t.requests {
        let before = count().await?;
        let m = lib
            .lock_all(names("count", 0, 4))
            .ttl(ttl)
            .try_acquire()
            .await?
            .ok_or("multi-lock busy")?;
        let took = count().await? - before;
        m.release().await?;
        let _ = writeln!(
            r.md,
            "\nserver requests for a multi-lock of 4 free names: {took}"
        );
    }
    Ok(())
}
