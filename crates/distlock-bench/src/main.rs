//! `distlock-bench`: distlock against the raw round trips each backend needs.

use std::future::Future;
use std::time::Duration;

use clap::Parser;
use distlock::LockClient;
use hdrhistogram::Histogram;
use integration_tests::harness::{ServerKind, TestServer};
use tokio::time::Instant;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

#[derive(Parser, Debug)]
#[command(about = "Uncontended acquire+release against the raw minimal sequence, per backend")]
struct Args {
    /// Measured iterations per variant (after a tenth as many warm-up rounds).
    #[arg(long, default_value_t = 1000)]
    iterations: u32,
    /// Backends to run (sqlite, postgres, redis, etcd, zookeeper).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "sqlite,postgres,redis,etcd,zookeeper"
    )]
    backends: Vec<String>,
}

/// Latencies of one variant, in microseconds.
struct Series {
    name: &'static str,
    hist: Histogram<u64>,
}

impl Series {
    fn new(name: &'static str) -> Result<Self, BoxError> {
        Ok(Self {
            name,
            hist: Histogram::new_with_bounds(1, 60_000_000, 3)?,
        })
    }

    async fn time<F: Future<Output = Result<(), BoxError>>>(
        &mut self,
        f: F,
    ) -> Result<(), BoxError> {
        let start = Instant::now();
        f.await?;
        let us = u64::try_from(start.elapsed().as_micros())
            .unwrap_or(u64::MAX)
            .max(1);
        self.hist.record(us)?;
        Ok(())
    }

    fn p(&self, q: f64) -> u64 {
        self.hist.value_at_quantile(q)
    }
}

fn report(backend: &str, rtt: &Series, raw: &Series, lib: &Series) {
    for s in [rtt, raw, lib] {
        println!(
            "{backend:<10} {:<28} p50 {:>7} us  p99 {:>7} us  p99.9 {:>7} us  (n={})",
            s.name,
            s.p(0.5),
            s.p(0.99),
            s.p(0.999),
            s.hist.len()
        );
    }
    println!(
        "{backend:<10} ratio distlock/raw p50 = {:.2}, raw/round-trip p50 = {:.2}\n",
        lib.p(0.5) as f64 / raw.p(0.5) as f64,
        raw.p(0.5) as f64 / rtt.p(0.5) as f64
    );
}

/// One measured operation, given the iteration number.
type Step =
    Box<dyn FnMut(u32) -> std::pin::Pin<Box<dyn Future<Output = Result<(), BoxError>> + Send>>>;

/// Runs the three variants interleaved (calibration, raw, distlock) so that
/// machine noise hits all of them alike, after a tenth as many warm-up rounds.
async fn measure(
    backend: &str,
    n: u32,
    mut rtt: Step,
    mut raw: Step,
    lib: &LockClient,
) -> Result<(), BoxError> {
    let mut series = [
        Series::new("round trip (calibration)")?,
        Series::new("raw minimal sequence")?,
        Series::new("distlock acquire+release")?,
    ];
    let name = format!("bench/{backend}/uncontended");
    let warmup = n / 10;
    for i in 0..(warmup + n) {
        let mut scratch = Series::new("warm-up")?;
        let (s0, s1, s2) = if i < warmup {
            (None, None, None)
        } else {
            (Some(0), Some(1), Some(2))
        };
        run_into(s0, &mut series, &mut scratch, rtt(i)).await?;
        run_into(s1, &mut series, &mut scratch, raw(i)).await?;
        let lib_step = async {
            let g = lib
                .lock(&name)
                .ttl(Duration::from_secs(30))
                .try_acquire()
                .await?
                .ok_or("lock busy")?;
            g.release().await?;
            Ok(())
        };
        run_into(s2, &mut series, &mut scratch, lib_step).await?;
    }
    let [rtt_s, raw_s, lib_s] = &series;
    report(backend, rtt_s, raw_s, lib_s);
    Ok(())
}

async fn run_into<F: Future<Output = Result<(), BoxError>>>(
    k: Option<usize>,
    series: &mut [Series; 3],
    scratch: &mut Series,
    f: F,
) -> Result<(), BoxError> {
    match k {
        Some(k) => series[k].time(f).await,
        None => scratch.time(f).await,
    }
}

async fn bench_redis(n: u32) -> Result<(), BoxError> {
    let server = tokio::task::spawn_blocking(|| TestServer::start(ServerKind::Redis)).await??;
    let client = redis::Client::open(server.url())?;
    let conn = client.get_multiplexed_async_connection().await?;
    let c1 = conn.clone();
    let rtt: Step = Box::new(move |_| {
        let mut c = c1.clone();
        Box::pin(async move {
            let _: String = redis::cmd("PING").query_async(&mut c).await?;
            Ok(())
        })
    });
    let cad = redis::Script::new("if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0");
    let raw: Step = Box::new(move |i| {
        let (mut c, cad) = (conn.clone(), cad.clone());
        Box::pin(async move {
            let owner = format!("raw-{i}");
            let ok: Option<String> = redis::cmd("SET")
                .arg("bench/raw")
                .arg(&owner)
                .arg("NX")
                .arg("PX")
                .arg(30_000)
                .query_async(&mut c)
                .await?;
            ok.ok_or("raw lock busy")?;
            let _: i64 = cad
                .key("bench/raw")
                .arg(&owner)
                .invoke_async(&mut c)
                .await?;
            Ok(())
        })
    });
    let lib = LockClient::from_dyn(distlock::connect(server.url()).await?);
    measure("redis", n, rtt, raw, &lib).await
}

async fn bench_sql(backend: &'static str, n: u32) -> Result<(), BoxError> {
    let (url, _server) = if backend == "sqlite" {
        let dir = integration_tests::harness::process::temp_dir("bench-sqlite")?;
        (format!("sqlite://{}", dir.join("bench.db").display()), None)
    } else {
        let s = tokio::task::spawn_blocking(|| TestServer::start(ServerKind::Postgres)).await??;
        (s.url().to_string(), Some(s))
    };
    let lib = LockClient::from_dyn(distlock::connect(&url).await?);
    // The raw sequence runs on the same kind of pool distlock builds.
    let (rtt, raw): (Step, Step) = if backend == "sqlite" {
        // Configured as distlock configures its own pool, for a fair baseline.
        let options = <sqlx::sqlite::SqliteConnectOptions as std::str::FromStr>::from_str(&url)?
            .create_if_missing(true)
            .journal_mode(sqlx::sqlite::SqliteJournalMode::Wal)
            .synchronous(sqlx::sqlite::SqliteSynchronous::Normal)
            .busy_timeout(Duration::from_secs(5));
        let pool = sqlx::sqlite::SqlitePoolOptions::new()
            .max_connections(4)
            .connect_with(options)
            .await?;
        sqlx::query("CREATE TABLE IF NOT EXISTS raw_locks (name TEXT PRIMARY KEY, owner TEXT, token INTEGER NOT NULL, expires_at INTEGER NOT NULL)").execute(&pool).await?;
        let p1 = pool.clone();
        (
            Box::new(move |_| {
                let p = p1.clone();
                Box::pin(async move {
                    sqlx::query("SELECT 1").execute(&p).await?;
                    Ok(())
                })
            }),
            Box::new(move |i| {
                let p = pool.clone();
                Box::pin(async move {
                    let owner = format!("raw-{i}");
                    let t: Option<i64> = sqlx::query_scalar("INSERT INTO raw_locks VALUES ('raw', ?1, 1, 0) ON CONFLICT(name) DO UPDATE SET owner = excluded.owner, token = raw_locks.token + 1 WHERE raw_locks.owner IS NULL RETURNING token").bind(&owner).fetch_optional(&p).await?;
                    t.ok_or("raw lock busy")?;
                    sqlx::query(
                        "UPDATE raw_locks SET owner = NULL WHERE name = 'raw' AND owner = ?1",
                    )
                    .bind(&owner)
                    .execute(&p)
                    .await?;
                    Ok(())
                })
            }),
        )
    } else {
        let pool = sqlx::postgres::PgPoolOptions::new()
            .max_connections(10)
            .connect(&url)
            .await?;
        sqlx::query("CREATE TABLE IF NOT EXISTS raw_locks (name TEXT PRIMARY KEY, owner TEXT, token BIGINT NOT NULL, expires_at TIMESTAMPTZ NOT NULL)").execute(&pool).await?;
        let p1 = pool.clone();
        (
            Box::new(move |_| {
                let p = p1.clone();
                Box::pin(async move {
                    sqlx::query("SELECT 1").execute(&p).await?;
                    Ok(())
                })
            }),
            Box::new(move |i| {
                let p = pool.clone();
                Box::pin(async move {
                    let owner = format!("raw-{i}");
                    let t: Option<i64> = sqlx::query_scalar("INSERT INTO raw_locks AS l VALUES ('raw', $1, 1, now()) ON CONFLICT (name) DO UPDATE SET owner = EXCLUDED.owner, token = l.token + 1 WHERE l.owner IS NULL RETURNING token").bind(&owner).fetch_optional(&p).await?;
                    t.ok_or("raw lock busy")?;
                    sqlx::query(
                        "UPDATE raw_locks SET owner = NULL WHERE name = 'raw' AND owner = $1",
                    )
                    .bind(&owner)
                    .execute(&p)
                    .await?;
                    Ok(())
                })
            }),
        )
    };
    measure(backend, n, rtt, raw, &lib).await
}

async fn bench_etcd(n: u32) -> Result<(), BoxError> {
    use etcd_client::{Compare, CompareOp, PutOptions, Txn, TxnOp};
    let server = tokio::task::spawn_blocking(|| TestServer::start(ServerKind::Etcd)).await??;
    let endpoint = format!("http://{}:{}", server.host(), server.port());
    let client = etcd_client::Client::connect([endpoint], None).await?;
    let lease = client.clone().lease_grant(30, None).await?.id();
    let c1 = client.clone();
    let rtt: Step = Box::new(move |_| {
        let mut c = c1.clone();
        Box::pin(async move {
            c.get("bench/none", None).await?;
            Ok(())
        })
    });
    let raw: Step = Box::new(move |_| {
        let mut c = client.clone();
        Box::pin(async move {
            let key = format!("bench/raw/{lease:x}");
            let txn = Txn::new()
                .when([Compare::create_revision(key.as_str(), CompareOp::Equal, 0)])
                .and_then([TxnOp::put(
                    key.as_str(),
                    "raw",
                    Some(PutOptions::new().with_lease(lease)),
                )]);
            if !c.txn(txn).await?.succeeded() {
                return Err("raw lock busy".into());
            }
            c.delete(key, None).await?;
            Ok(())
        })
    });
    let lib = LockClient::from_dyn(distlock::connect(server.url()).await?);
    measure("etcd", n, rtt, raw, &lib).await
}

async fn bench_zookeeper(n: u32) -> Result<(), BoxError> {
    use zookeeper_client as zk;
    let server = tokio::task::spawn_blocking(|| TestServer::start(ServerKind::ZooKeeper)).await??;
    let hosts = format!("{}:{}", server.host(), server.port());
    let client = zk::Client::connect(&hosts).await?;
    let dir = zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all());
    client.mkdir("/bench/raw", &dir).await?;
    let c1 = client.clone();
    let rtt: Step = Box::new(move |_| {
        let c = c1.clone();
        Box::pin(async move {
            c.check_stat("/").await?;
            Ok(())
        })
    });
    let raw: Step = Box::new(move |_| {
        let c = client.clone();
        Box::pin(async move {
            let opts = zk::CreateMode::EphemeralSequential.with_acls(zk::Acls::anyone_all());
            let (_, seq) = c.create("/bench/raw/lock-", b"", &opts).await?;
            c.delete(&format!("/bench/raw/lock-{seq}"), None).await?;
            Ok(())
        })
    });
    let lib = LockClient::from_dyn(distlock::connect(&format!("zk://{hosts}")).await?);
    measure("zookeeper", n, rtt, raw, &lib).await
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let args = Args::parse();
    println!(
        "uncontended acquire+release, {} iterations per variant, interleaved\n",
        args.iterations
    );
    for b in &args.backends {
        match b.as_str() {
            "redis" => bench_redis(args.iterations).await?,
            "sqlite" | "postgres" => {
                bench_sql(
                    if b == "sqlite" { "sqlite" } else { "postgres" },
                    args.iterations,
                )
                .await?
            }
            "etcd" => bench_etcd(args.iterations).await?,
            "zookeeper" => bench_zookeeper(args.iterations).await?,
            other => return Err(format!("unknown backend {other:?}").into()),
        }
    }
    Ok(())
}
