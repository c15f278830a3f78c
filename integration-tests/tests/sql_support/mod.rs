//! The factory shared by the three SQL test files.

#![allow(dead_code, unreachable_pub, missing_docs)]

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use distlock_core::{async_trait, Backend, DynBackend, LockClient, LockName, LockRequest};
use distlock_sql::{sqlx, SqlBackend, SqlConfig};
use integration_tests::harness::tls::TestCerts;
use integration_tests::harness::{ServerKind, ServerProcess, TestServer};
use integration_tests::BackendFactory;
use libtest_mimic::{Failed, Trial};
use tokio::sync::OnceCell;
use tokio::time::Instant;

mod election;
mod holders;
mod semaphores;

/// Where a SQL backend's database comes from.
pub enum Source {
    /// A server kind the harness starts (or names by environment variable).
    Server(ServerKind),
    /// A SQLite file in a temp dir.
    SqliteFile,
    /// A server of the test's own, started on first use.
    Start(Box<dyn Fn() -> Result<Started, String> + Send + Sync>),
}

/// A server [`Source::Start`] started, kept running as long as the factory.
pub struct Started {
    /// The URL clients connect to.
    pub url: String,
    /// Its port.
    pub port: u16,
    /// The certificates it presents, if it speaks TLS.
    pub certs: Option<TestCerts>,
    /// Held for its Drop, which stops the server.
    pub process: ServerProcess,
}

/// What the factory keeps, with the URL.
enum Db {
    Server(#[allow(dead_code)] Option<TestServer>),
    Started(Started),
}

pub struct SqlFactory {
    pub name: &'static str,
    source: Source,
    db: OnceLock<Result<(Db, String), String>>,
    admin: OnceCell<SqlBackend>,
}

impl SqlFactory {
    pub fn new(name: &'static str, source: Source) -> Arc<Self> {
        Arc::new(Self {
            name,
            source,
            db: OnceLock::new(),
            admin: OnceCell::new(),
        })
    }

    /// The database URL, starting the server on first use.
    pub fn url(&self) -> Result<String, Failed> {
        self.db().map(|(_, u)| u.clone())
    }

    fn db(&self) -> Result<&(Db, String), Failed> {
        let db = self.db.get_or_init(|| match &self.source {
            Source::Server(kind) => TestServer::start(*kind)
                .map(|s| (s.url().to_string(), Some(s)))
                .map(|(u, s)| (Db::Server(s), u))
                .map_err(|e| e.to_string()),
            Source::SqliteFile => integration_tests::harness::process::temp_dir("sqlite")
                .map(|d| {
                    (
                        Db::Server(None),
                        format!("sqlite://{}", d.join("locks.db").display()),
                    )
                })
                .map_err(|e| e.to_string()),
            Source::Start(start) => start()
                .map(|s| (s.url.clone(), s))
                .map(|(u, s)| (Db::Started(s), u)),
        });
        db.as_ref().map_err(|e| Failed::from(e.as_str()))
    }

    /// The server a [`Source::Start`] started, starting it on first use.
    pub fn started(&self) -> Result<&Started, Failed> {
        match self.db()? {
            (Db::Started(s), _) => Ok(s),
            _ => Err("this factory's database was not started by the test".into()),
        }
    }

    /// A URL with extra query parameters.
    pub fn url_with(&self, params: &str) -> Result<String, Failed> {
        let url = self.url()?;
        let sep = if url.contains('?') { '&' } else { '?' };
        Ok(format!("{url}{sep}{params}"))
    }

    /// A lock table of the test's own (`<prefix>_` and the run's namespace)
    /// and the URL that names it.
    pub fn own_table(&self, prefix: &str) -> Result<(String, String), Failed> {
        let table = format!("{prefix}_{}", &integration_tests::namespace()[12..]);
        let url = self.url_with(&format!("table={table}"))?;
        Ok((table, url))
    }

    /// A pool of the server's administrator, for statements run by hand.
    pub async fn admin_pool<DB: sqlx::Database>(&self) -> Result<sqlx::Pool<DB>, Failed> {
        sqlx::Pool::<DB>::connect(&self.url()?)
            .await
            .map_err(|e| e.to_string().into())
    }

    pub async fn connect(&self, config: SqlConfig) -> Result<SqlBackend, Failed> {
        Ok(SqlBackend::connect_with(&self.url()?, config).await?)
    }
}

#[async_trait]
impl BackendFactory for SqlFactory {
    fn name(&self) -> &'static str {
        self.name
    }
    async fn client(&self) -> distlock_core::Result<DynBackend> {
        let url = self
            .url()
            .map_err(|e| distlock_core::Error::unavailable("test", format!("{e:?}"), None))?;
        Ok(Arc::new(SqlBackend::connect(&url).await?))
    }
    async fn evict(&self, name: &LockName) -> Result<(), Failed> {
        let admin = self
            .admin
            .get_or_try_init(|| self.connect(SqlConfig::default()))
            .await?;
        if admin.evict(name).await? {
            Ok(())
        } else {
            Err(format!("nothing to evict for {name}").into())
        }
    }
    fn short_ttl(&self) -> Duration {
        Duration::from_millis(800)
    }
}

/// The clients of `f`'s server with `fifo` (re-checking every 200 ms,
/// since no release of a client without it tells them), for
/// [`Alternating`](integration_tests::factory::Alternating).
pub struct FifoHalf(pub Arc<SqlFactory>);

#[async_trait]
impl BackendFactory for FifoHalf {
    fn name(&self) -> &'static str {
        self.0.name
    }
    async fn client(&self) -> distlock_core::Result<DynBackend> {
        let url = self
            .0
            .url_with("fifo=true&queue_lease_ms=600")
            .map_err(|e| distlock_core::Error::unavailable("test", format!("{e:?}"), None))?;
        Ok(Arc::new(SqlBackend::connect(&url).await?))
    }
    async fn evict(&self, name: &LockName) -> Result<(), Failed> {
        self.0.evict(name).await
    }
    fn short_ttl(&self) -> Duration {
        self.0.short_ttl()
    }
    fn renewed_ttl(&self) -> Duration {
        self.0.renewed_ttl()
    }
}

/// The suite's safety cases on `f`'s server, its clients alternately with
/// and without `fifo`, named `<name>::<case>`.
pub fn fifo_mixed(
    name: &'static str,
    f: &Arc<SqlFactory>,
    rt: &tokio::runtime::Runtime,
) -> Vec<Trial> {
    integration_tests::factory::Alternating::safety_trials(
        name,
        f.clone(),
        Arc::new(FifoHalf(f.clone())),
        rt,
    )
}

/// A wrong password and a user the server does not know: `url_of(user,
/// password)` is the server's URL with them. Each is refused as
/// `Misconfigured`, not retryable (retrying cannot help), and the message
/// shows neither the wrong password nor `secret`, the right one.
pub async fn wrong_credentials_are_misconfigured(
    user: &str,
    secret: &str,
    url_of: impl Fn(&str, &str) -> String,
) -> Result<(), Failed> {
    let wrong = "not-the-password-5d1f";
    for (what, user) in [
        ("a wrong password", user),
        ("an unknown user", "nobody_5d1f"),
    ] {
        match SqlBackend::connect(&url_of(user, wrong)).await {
            Ok(_) => return Err(format!("{what}: connected").into()),
            Err(e @ distlock_core::Error::Misconfigured { .. }) => {
                let text = format!("{e:?}");
                if text.contains(wrong) || text.contains(secret) {
                    return Err(format!("{what}: the error shows a password: {text}").into());
                }
                if e.is_retryable() {
                    return Err(format!("{what}: counted as retryable: {text}").into());
                }
            }
            Err(e) => return Err(format!("{what}: expected Misconfigured, got {e:?}").into()),
        }
    }
    Ok(())
}

/// The `main` of a SQL backend's test file: the conformance suite on a
/// [`SqlFactory`] for `source`, the trials every SQL backend shares, then
/// `extra`.
pub fn run_suite(
    name: &'static str,
    source: Source,
    extra: impl FnOnce(&Arc<SqlFactory>, &tokio::runtime::Runtime) -> Vec<Trial>,
) -> ! {
    let f = SqlFactory::new(name, source);
    integration_tests::run_suite(f.clone(), move |rt| {
        let mut trials = vec![
            table_created_concurrently(f.clone(), rt),
            misconfiguration_is_not_retryable(f.clone(), rt),
            eviction_of_lapsed_holds(f.clone(), rt),
        ];
        trials.extend(rw_trials(&f, rt));
        trials.extend(election::trials(&f, rt));
        trials.extend(holders::trials(&f, rt));
        trials.extend(semaphores::trials(&f, rt));
        trials.extend(extra(&f, rt));
        trials
    })
}

/// Many clients create a fresh lock table at the same moment; all succeed
/// and the table works.
fn table_created_concurrently(f: Arc<SqlFactory>, rt: &tokio::runtime::Runtime) -> Trial {
    let handle = rt.handle().clone();
    Trial::test(
        format!("{}::table_is_created_concurrently_without_errors", f.name),
        move || {
            handle.block_on(async {
                let table = format!("locks_{}", &integration_tests::namespace()[12..]);
                let mut tasks = Vec::new();
                for _ in 0..12 {
                    let url = f.url_with(&format!("table={table}&pool_size=2"))?;
                    tasks.push(tokio::spawn(async move { SqlBackend::connect(&url).await }));
                }
                let mut backends = Vec::new();
                for t in tasks {
                    backends.push(t.await.map_err(|e| Failed::from(e.to_string()))??);
                }
                let client = LockClient::new(backends.swap_remove(0));
                let g = client
                    .lock("created/concurrently")
                    .try_acquire()
                    .await?
                    .ok_or("fresh table: lock not granted")?;
                g.release().await?;
                Ok(())
            })
        },
    )
}

/// An operator's eviction answers whether it took a live hold away: a
/// lock, a shared hold and a leadership whose leases ran out (their holders
/// gone without a release, as crashed processes' are) were held by nobody,
/// and the eviction of a live one answers that it was. With and without a
/// wait queue where the database has one.
fn eviction_of_lapsed_holds(f: Arc<SqlFactory>, rt: &tokio::runtime::Runtime) -> Trial {
    let handle = rt.handle().clone();
    Trial::test(
        format!(
            "{}::an_eviction_of_holds_whose_leases_ran_out_answers_none_was_held",
            f.name
        ),
        move || {
            handle.block_on(async {
                let queues: &[&str] = match f.source {
                    Source::SqliteFile => &[""],
                    _ => &["", "fifo=true"],
                };
                let ttl = Duration::from_millis(300);
                for params in queues {
                    let url = f.url_with(params)?;
                    let backend = SqlBackend::connect(&url).await?;
                    let ns = integration_tests::namespace();
                    for what in ["lock", "shared", "leader"] {
                        let name = LockName::new(format!("{ns}/lapsed-{what}"))?;
                        let req = match what {
                            "lock" => LockRequest::new(name.clone(), ttl),
                            "shared" => {
                                let mut req = LockRequest::new(name.clone(), ttl);
                                req.kind = distlock_core::HoldKind::Shared;
                                req
                            }
                            _ => LockRequest::leader(name.clone(), ttl, "gone"),
                        };
                        backend
                            .try_acquire(&req)
                            .await?
                            .ok_or_else(|| format!("{what} {name} was refused"))?;
                        tokio::time::sleep(ttl * 2).await;
                        if backend.evict(&name).await? {
                            return Err(format!(
                                "evicting {what} {name} ({params}) after its lease ran out answered that it was held"
                            )
                            .into());
                        }
                        let live = req.with_ttl(Duration::from_secs(30));
                        backend
                            .try_acquire(&live)
                            .await?
                            .ok_or_else(|| format!("{what} {name} was refused once free"))?;
                        if !backend.evict(&name).await? {
                            return Err(format!(
                                "evicting a live {what} {name} ({params}) answered that nothing was held"
                            )
                            .into());
                        }
                    }
                }
                Ok(())
            })
        },
    )
}

/// A URL the server refuses to serve, though it answers: a database that
/// does not exist (PostgreSQL, MySQL), or a directory where the file should
/// be (SQLite). Connecting reports a configuration error at once, one that
/// `is_retryable()` says not to retry, and it names what to change.
fn misconfiguration_is_not_retryable(f: Arc<SqlFactory>, rt: &tokio::runtime::Runtime) -> Trial {
    let handle = rt.handle().clone();
    Trial::test(
        format!(
            "{}::a_refused_configuration_is_reported_at_once_and_not_retryable",
            f.name
        ),
        move || {
            handle.block_on(async {
                let url = f.url()?;
                let (base, query) = url.split_once('?').unwrap_or((&url, ""));
                let (dir, _) = base
                    .rsplit_once('/')
                    .ok_or_else(|| Failed::from(format!("no path in {url}")))?;
                let bad = match f.source {
                    // The lock file's own directory, as the file.
                    Source::SqliteFile => dir.to_string(),
                    Source::Server(_) | Source::Start(_) => {
                        format!("{dir}/no_such_database_here?{query}")
                    }
                };
                let start = std::time::Instant::now();
                let err = match SqlBackend::connect(&bad).await {
                    Ok(_) => return Err(format!("{bad} connected").into()),
                    Err(e) => e,
                };
                let took = start.elapsed();
                if !matches!(err, distlock_core::Error::Misconfigured { .. }) {
                    return Err(
                        format!("{bad}: expected a configuration error, got {err:?}").into(),
                    );
                }
                if err.is_retryable() {
                    return Err(format!("{bad}: a configuration error counted as retryable").into());
                }
                let text = err.to_string();
                if !text.contains("database") && !text.contains("path") {
                    return Err(
                        format!("{bad}: the message does not say what to change: {text}").into(),
                    );
                }
                // A generous bound: the pool's retries took its acquire timeout (5 s).
                if took > Duration::from_secs(3) {
                    return Err(format!("{bad}: reported only after {took:?}").into());
                }
                eprintln!("{bad}: {text} ({took:?})");
                Ok(())
            })
        },
    )
}

/// `holder` holds `lock`, `waiter` queues for it for `settle`, the holder
/// releases: the waiter must hold the lock within 15 s. Its fallback poll is
/// set to a minute, so only the backend's release signal can do that.
pub async fn release_wakes_the_waiter(
    holder: LockClient,
    waiter: LockClient,
    lock: &'static str,
    settle: Duration,
    not_woken: &'static str,
) -> Result<(), Failed> {
    let g = holder
        .lock(lock)
        .ttl(Duration::from_secs(120))
        .acquire()
        .await?;
    let w = tokio::spawn(async move {
        waiter
            .lock(lock)
            .ttl(Duration::from_secs(120))
            .acquire()
            .await
    });
    tokio::time::sleep(settle).await;
    g.release().await?;
    let got = tokio::time::timeout(Duration::from_secs(15), w)
        .await
        .map_err(|_| Failed::from(not_woken))?
        .map_err(|e| e.to_string())??;
    got.release().await?;
    Ok(())
}

/// Four waiters of one client wait for a permit (the backend called
/// directly, without the client's coalescing in front). One release must
/// make one of them try again, not all four; then a changed limit must wake
/// the other three, each answered at once that another limit is stored.
/// `count_attempts` reads a
/// counter that `install_counter` makes the database keep, by triggers
/// that count each attempt once (each database's test says how).
/// `config` must keep the waiters from waking by themselves during the
/// test.
pub async fn freed_permit_wakes_one<I, IF, C, CF>(
    url: &str,
    config: SqlConfig,
    install_counter: I,
    count_attempts: C,
) -> Result<(), Failed>
where
    I: FnOnce() -> IF,
    IF: std::future::Future<Output = Result<(), sqlx::Error>>,
    C: Fn() -> CF,
    CF: std::future::Future<Output = Result<i64, sqlx::Error>>,
{
    const WAITERS: usize = 4;
    let holder = SqlBackend::connect(url).await?;
    let waiters = Arc::new(SqlBackend::connect_with(url, config).await?);
    let held = LockRequest::permit(LockName::new("jobs/wake-one")?, Duration::from_secs(60), 1);
    holder
        .try_acquire(&held)
        .await?
        .ok_or("the first permit was refused")?;
    install_counter().await.map_err(|e| e.to_string())?;
    let attempts = || async {
        count_attempts()
            .await
            .map_err(|e| Failed::from(e.to_string()))
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    let (tx, mut granted) = tokio::sync::mpsc::unbounded_channel();
    for _ in 0..WAITERS {
        let (w, name, tx) = (waiters.clone(), held.name.clone(), tx.clone());
        tokio::spawn(async move {
            let req = LockRequest::permit(name, Duration::from_secs(60), 1);
            let _ = tx.send(w.acquire(&req, Some(deadline)).await);
        });
    }
    // Every waiter has tried and found the permit taken.
    let end = Instant::now() + Duration::from_secs(10);
    while attempts().await? < WAITERS as i64 {
        if Instant::now() > end {
            return Err("the waiters did not all try".into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // A waiter that starts listening asks once more: the count starts
    // once it has not moved for a second.
    let (mut before, mut quiet) = (attempts().await?, 0);
    let end = Instant::now() + Duration::from_secs(10);
    while quiet < 5 && Instant::now() < end {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let now = attempts().await?;
        quiet = if now == before { quiet + 1 } else { 0 };
        before = now;
    }
    if !holder.release(&held).await? {
        return Err("the holder's permit was not held".into());
    }
    tokio::time::timeout(Duration::from_secs(10), granted.recv())
        .await
        .map_err(|_| Failed::from("no waiter was woken by the release"))?
        .ok_or("waiter task ended")??;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let woken = attempts().await? - before;
    if woken != 1 {
        return Err(format!("one freed permit made {woken} waiters try again").into());
    }
    // A changed limit wakes every waiter: each asks for the old limit and
    // learns at once that another is stored.
    let limit = WAITERS as u32;
    holder.set_limit(&held.name, limit).await?;
    for i in 1..WAITERS {
        let answer = tokio::time::timeout(Duration::from_secs(10), granted.recv())
            .await
            .map_err(|_| {
                Failed::from(format!(
                    "waiter {i} of the rest was not woken by the changed limit"
                ))
            })?
            .ok_or("waiter task ended")?;
        match answer {
            Err(distlock_core::Error::LimitMismatch {
                requested: 1,
                stored,
                ..
            }) if stored == limit => {}
            other => {
                return Err(format!("a waiter woken by the changed limit got {other:?}").into())
            }
        }
    }
    Ok(())
}

/// Connecting to `url` fails at once with the typed error of a rejected
/// certificate: not retryable, saying it is TLS and the certificate, and
/// without `password`. Returns the message.
pub async fn certificate_is_rejected(
    url: &str,
    password: &str,
    because: &str,
) -> Result<String, Failed> {
    let start = std::time::Instant::now();
    let err = match SqlBackend::connect(url).await {
        Ok(_) => return Err(format!("connected although {because}").into()),
        Err(e) => e,
    };
    let took = start.elapsed();
    let text = err.to_string();
    let debug = format!("{err:?}");
    if !matches!(err, distlock_core::Error::Misconfigured { .. }) {
        return Err(format!("{because}: expected Misconfigured, got {debug}").into());
    }
    if err.is_retryable() {
        return Err(format!("{because}: counted as retryable: {text}").into());
    }
    if !text.contains("TLS") || !text.contains("certificate") {
        return Err(
            format!("{because}: the message does not say TLS and certificate: {text}").into(),
        );
    }
    if text.contains(password) || debug.contains(password) {
        return Err(format!("{because}: the error shows the password: {debug}").into());
    }
    if took > Duration::from_secs(3) {
        return Err(format!("{because}: reported only after {took:?}").into());
    }
    eprintln!("{because}: {text} ({took:?})");
    Ok(text)
}

/// A CA of its own directory that signed nothing the servers present.
pub async fn unrelated_ca() -> Result<std::path::PathBuf, Failed> {
    tokio::task::spawn_blocking(|| {
        let dir = integration_tests::harness::process::temp_dir("other-ca")?;
        integration_tests::harness::tls::make_unrelated_ca(&dir)
    })
    .await
    .map_err(|e| e.to_string())?
    .map_err(|e| Failed::from(e.to_string()))
}

/// `holder` holds `lock` shared and a writer of `waiter` waits: the writer
/// must be granted within 15 s of the reader's release. Then `holder`
/// holds it shared again, a writer of `giver` waits behind it and gives up
/// after 1.5 s, while a reader of `waiter`, held back by that writer's
/// mark, waits: it must be granted within 15 s of the writer giving up.
/// `waiter`'s fallback poll must be set to a minute, so that only the
/// backend's wake-ups can do either in time.
pub async fn rw_waiters_are_woken(
    holder: LockClient,
    giver: LockClient,
    waiter: LockClient,
    lock: &str,
) -> Result<(), Failed> {
    // A run that failed leaves holds behind until their TTL.
    let lock = LockName::new(format!("{}/{lock}", integration_tests::namespace()))?;
    let ttl = Duration::from_secs(120);
    let reader = holder.lock(&lock).shared().ttl(ttl).acquire().await?;
    let writer = {
        let (waiter, lock) = (waiter.clone(), lock.clone());
        tokio::spawn(async move {
            waiter
                .lock(&lock)
                .ttl(ttl)
                .wait(Duration::from_secs(60))
                .acquire()
                .await
        })
    };
    writer_waits(&holder, &lock).await?;
    tokio::time::sleep(Duration::from_millis(300)).await;
    reader.release().await?;
    let w = tokio::time::timeout(Duration::from_secs(15), writer)
        .await
        .map_err(|_| Failed::from("the writer was not woken when the last reader released"))?
        .map_err(|e| e.to_string())??;
    w.release().await?;

    let reader = holder.lock(&lock).shared().ttl(ttl).acquire().await?;
    let gives_up = {
        let lock = lock.clone();
        tokio::spawn(async move {
            giver
                .lock(&lock)
                .ttl(ttl)
                .wait(Duration::from_millis(1500))
                .acquire()
                .await
        })
    };
    writer_waits(&holder, &lock).await?;
    let held_back = tokio::spawn(async move {
        waiter
            .lock(&lock)
            .shared()
            .ttl(ttl)
            .wait(Duration::from_secs(60))
            .acquire()
            .await
    });
    match gives_up.await.map_err(|e| e.to_string())? {
        Err(distlock_core::Error::WaitTimeout { .. }) => {}
        other => return Err(format!("the writer behind a reader ended with {other:?}").into()),
    }
    let r = tokio::time::timeout(Duration::from_secs(15), held_back)
        .await
        .map_err(|_| Failed::from("the reader was not woken when the writer gave up"))?
        .map_err(|e| e.to_string())??;
    r.release().await?;
    reader.release().await?;
    Ok(())
}

/// Waits until `inspect` says a writer waits for `lock` (at most 10 s).
async fn writer_waits(c: &LockClient, name: &LockName) -> Result<(), Failed> {
    let end = Instant::now() + Duration::from_secs(10);
    while c.backend().inspect(name).await?.writer_waiting != Some(true) {
        if Instant::now() > end {
            return Err("the waiting writer did not show in inspect".into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}

/// The read-write lock trials every SQL backend runs.
fn rw_trials(f: &Arc<SqlFactory>, rt: &tokio::runtime::Runtime) -> Vec<Trial> {
    vec![
        integration_tests::trial(
            rt,
            format!(
                "{}::a_crashed_reader_stops_blocking_beside_a_renewed_one",
                f.name
            ),
            crashed_reader_beside_a_renewed_one(f.clone()),
        ),
        integration_tests::trial(
            rt,
            format!(
                "{}::a_renewal_batch_with_shared_holds_answers_for_each",
                f.name
            ),
            mixed_batch_with_shared_holds(f.clone()),
        ),
        integration_tests::trial(
            rt,
            format!(
                "{}::renewing_and_releasing_readers_never_let_a_writer_in_beside_them",
                f.name
            ),
            renewing_readers_exclude_writers(f.clone()),
        ),
    ]
}

/// A reader that vanishes (its hold taken through the backend, never
/// renewed or released) beside one that is renewed past several TTLs:
/// once the renewed one releases, a writer gets the lock at once, since
/// the vanished reader's TTL ran out long before. The lock row's end
/// follows the live holds, not the latest any reader ever had.
async fn crashed_reader_beside_a_renewed_one(f: Arc<SqlFactory>) -> Result<(), Failed> {
    let ttl = f.renewed_ttl();
    let lock = LockName::new(format!(
        "{}/rw-crashed-beside",
        integration_tests::namespace()
    ))?;
    let raw = f.connect(SqlConfig::default()).await?;
    let mut crashed = LockRequest::new(lock.clone(), ttl);
    crashed.kind = distlock_core::HoldKind::Shared;
    raw.try_acquire(&crashed)
        .await?
        .ok_or("the vanishing reader was refused")?;
    let renewed = LockClient::new(f.connect(SqlConfig::default()).await?);
    let g = renewed.lock(&lock).shared().ttl(ttl).acquire().await?;
    tokio::time::sleep(ttl * 3).await;
    if !g.is_held() {
        return Err("the renewed reader lost its hold".into());
    }
    let writer = LockClient::new(f.connect(SqlConfig::default()).await?);
    if writer
        .lock(&lock)
        .ttl(Duration::from_secs(60))
        .try_acquire()
        .await?
        .is_some()
    {
        return Err("a writer was granted beside the renewed reader".into());
    }
    g.release().await?;
    let start = Instant::now();
    let w = writer
        .lock(&lock)
        .ttl(Duration::from_secs(60))
        .wait(Duration::from_secs(1))
        .acquire()
        .await?;
    w.release().await?;
    eprintln!(
        "writer granted {:?} after the renewed reader released",
        start.elapsed()
    );
    Ok(())
}

/// One `extend_many` call with an exclusive hold, a shared one, a permit,
/// and a shared request nobody holds: each answered as `extend` would.
async fn mixed_batch_with_shared_holds(f: Arc<SqlFactory>) -> Result<(), Failed> {
    let b = f.connect(SqlConfig::default()).await?;
    let ns = integration_tests::namespace();
    let ttl = Duration::from_secs(30);
    let lock = LockRequest::new(LockName::new(format!("{ns}/batch-lock"))?, ttl);
    let mut shared = LockRequest::new(LockName::new(format!("{ns}/batch-shared"))?, ttl);
    shared.kind = distlock_core::HoldKind::Shared;
    let permit = LockRequest::permit(LockName::new(format!("{ns}/batch-permit"))?, ttl, 2);
    let mut foreign = LockRequest::new(shared.name.clone(), ttl);
    foreign.kind = distlock_core::HoldKind::Shared;
    for r in [&lock, &shared, &permit] {
        b.try_acquire(r).await?.ok_or("a hold was refused")?;
    }
    let answers = b
        .extend_many(&[lock.clone(), shared.clone(), foreign, permit.clone()])
        .await?;
    if answers != [true, true, false, true] {
        return Err(format!("the batch answered {answers:?}").into());
    }
    for r in [&lock, &shared, &permit] {
        if !b.release(r).await? {
            return Err(format!("{} was not held after the batch", r.name).into());
        }
    }
    Ok(())
}

/// Readers with a short TTL, renewed while they hold, come and go with
/// holds of different lengths while writers wait for the name, each client
/// with its own pool: renewals, releases and grants of the name meet all
/// the time. A writer is never inside with a reader whose hold was still
/// live when it left, and readers are inside together.
async fn renewing_readers_exclude_writers(f: Arc<SqlFactory>) -> Result<(), Failed> {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    const READERS: usize = 6;
    const WRITERS: usize = 2;
    const ROUNDS: usize = 6;
    let ttl = Duration::from_millis(300);
    let lock = LockName::new(format!("{}/rw-renewing", integration_tests::namespace()))?;
    let readers_in = Arc::new(AtomicUsize::new(0));
    // The readers inside, whose holds a writer checks as it enters: a
    // reader whose renewal came too late on a loaded machine has lapsed,
    // and a writer beside it is no clash.
    let inside = Arc::new(std::sync::Mutex::new(std::collections::HashMap::<
        usize,
        Arc<distlock_core::LockGuard>,
    >::new()));
    let most = Arc::new(AtomicUsize::new(0));
    let writer_in = Arc::new(AtomicBool::new(false));
    let violations = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for i in 0..READERS + WRITERS {
        let c = LockClient::new(f.connect(SqlConfig::default().with_pool_size(3)).await?);
        let (lock, readers_in, inside, most, writer_in, violations) = (
            lock.clone(),
            readers_in.clone(),
            inside.clone(),
            most.clone(),
            writer_in.clone(),
            violations.clone(),
        );
        tasks.push(tokio::spawn(async move {
            for round in 0..ROUNDS {
                let b = c.lock(&lock).ttl(ttl).wait(Duration::from_secs(30));
                if i >= READERS {
                    let g = b.acquire().await?;
                    let clash = writer_in.swap(true, Ordering::SeqCst)
                        || inside
                            .lock()
                            .unwrap_or_else(std::sync::PoisonError::into_inner)
                            .values()
                            .any(|r| r.is_held());
                    tokio::time::sleep(Duration::from_millis(15)).await;
                    writer_in.store(false, Ordering::SeqCst);
                    if clash && g.is_held() {
                        violations.fetch_add(1, Ordering::SeqCst);
                    }
                    g.release().await?;
                } else {
                    let g = Arc::new(b.shared().acquire().await?);
                    inside
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .insert(i, g.clone());
                    let n = readers_in.fetch_add(1, Ordering::SeqCst) + 1;
                    most.fetch_max(n, Ordering::SeqCst);
                    let mut clash = false;
                    // Past a renewal or two, by a different length per reader and round.
                    let hold = 100 + 70 * ((i + round) % 5) as u64;
                    let end = Instant::now() + Duration::from_millis(hold);
                    while Instant::now() < end {
                        clash |= writer_in.load(Ordering::SeqCst);
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                    readers_in.fetch_sub(1, Ordering::SeqCst);
                    inside
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .remove(&i);
                    if clash && g.is_held() {
                        violations.fetch_add(1, Ordering::SeqCst);
                    }
                    let g = Arc::try_unwrap(g).map_err(|_| {
                        distlock_core::Error::invalid(
                            distlock_core::InputKind::Config,
                            "a reader's guard is still shared",
                        )
                    })?;
                    g.release().await?;
                }
            }
            Ok::<_, distlock_core::Error>(())
        }));
    }
    for t in tasks {
        t.await.map_err(|e| e.to_string())??;
    }
    let bad = violations.load(Ordering::SeqCst);
    if bad > 0 {
        return Err(format!("{bad} times a writer was inside beside a live reader").into());
    }
    if most.load(Ordering::SeqCst) < 2 {
        return Err("readers were never inside together".into());
    }
    Ok(())
}

/// A permit's renewal that is still committing when the permit's old end
/// passes holds the permit's row; an acquirer of the full semaphore must
/// wait for it and count the permit as live, not read the old end and
/// grant a second permit of one. The renewal is run by hand:
/// `hold_renewal(name, owner, updated, commit)` runs the backend's own
/// renewal of that permit in a transaction, sends how many rows it changed
/// on `updated`, and commits when `commit` fires. `waiting` says whether an
/// acquirer waits for a row lock.
pub async fn renewal_committing_at_expiry_keeps_its_permit<H, W, WF>(
    url: &str,
    hold_renewal: H,
    waiting: W,
) -> Result<(), Failed>
where
    H: FnOnce(
        String,
        String,
        tokio::sync::oneshot::Sender<u64>,
        tokio::sync::oneshot::Receiver<()>,
    ) -> tokio::task::JoinHandle<Result<(), sqlx::Error>>,
    W: Fn() -> WF,
    WF: std::future::Future<Output = Result<bool, sqlx::Error>>,
{
    let ttl = Duration::from_millis(1500);
    let holder = SqlBackend::connect(url).await?;
    let other = Arc::new(SqlBackend::connect(url).await?);
    let name = LockName::new("race/renewal-at-expiry")?;
    let held = LockRequest::permit(name.clone(), ttl, 1);
    holder
        .try_acquire(&held)
        .await?
        .ok_or("the first permit was refused")?;
    let (updated, renewed) = tokio::sync::oneshot::channel();
    let (commit, committing) = tokio::sync::oneshot::channel();
    let renewal = hold_renewal(
        name.as_str().to_string(),
        held.owner.to_string(),
        updated,
        committing,
    );
    let changed = tokio::time::timeout(Duration::from_secs(10), renewed)
        .await
        .map_err(|_| "the hand-run renewal did not run")?
        .map_err(|_| "the hand-run renewal failed")?;
    if changed != 1 {
        return Err(format!("the hand-run renewal changed {changed} rows").into());
    }
    // The permit's committed end passes while its renewal is open.
    tokio::time::sleep(ttl + Duration::from_millis(300)).await;
    let req = LockRequest::permit(name.clone(), Duration::from_secs(30), 1);
    let b = other.clone();
    let attempt = tokio::spawn(async move { b.try_acquire(&req).await });
    // Seen waiting, or given 3 s: either way the renewal then commits, and
    // the acquirer must be refused.
    let until = Instant::now() + Duration::from_secs(3);
    while !waiting().await.map_err(|e| e.to_string())? {
        if attempt.is_finished() {
            let got = attempt.await.map_err(|e| e.to_string())??;
            return Err(match got {
                Some(_) => "a second permit of one was granted beside a renewal being committed",
                None => "the acquirer refused without waiting for the renewal",
            }
            .into());
        }
        if Instant::now() > until {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let _ = commit.send(());
    renewal
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| e.to_string())?;
    let got = tokio::time::timeout(Duration::from_secs(10), attempt)
        .await
        .map_err(|_| "the acquirer did not finish")?
        .map_err(|e| e.to_string())??;
    if got.is_some() {
        return Err("a second permit of one was granted once the renewal committed".into());
    }
    let status = other.inspect_permits(&name).await?;
    if status.holders != Some(1) {
        return Err(format!("after the race: {status:?}, expected one holder").into());
    }
    if !holder.release(&held).await? {
        return Err("the renewed permit was not held".into());
    }
    Ok(())
}

/// A grant routine left by another version (`install_stale` puts one in
/// place that grants nothing) is replaced by the next client that starts:
/// its first permit is granted. Without the replacement every attempt
/// would be refused.
pub async fn a_stale_grant_routine_is_replaced<S, SF>(
    url: &str,
    install_stale: S,
) -> Result<(), Failed>
where
    S: FnOnce() -> SF,
    SF: std::future::Future<Output = Result<(), sqlx::Error>>,
{
    let name = LockName::new("routine/stale")?;
    let req = LockRequest::permit(name, Duration::from_secs(30), 2);
    SqlBackend::connect(url)
        .await?
        .try_acquire(&req)
        .await?
        .ok_or("the first permit was refused")?;
    install_stale().await?;
    let next = SqlBackend::connect(url).await?;
    let again = LockRequest::permit(req.name.clone(), Duration::from_secs(30), 2);
    next.try_acquire(&again)
        .await?
        .ok_or("the second permit was refused: the stale routine is still in place")?;
    Ok(())
}

/// An operator's eviction of the lock and the election `name`, through a
/// client of its own at `url`.
pub async fn evict(url: &str, name: &str) -> Result<(), Failed> {
    let backend = SqlBackend::connect(url).await?;
    if backend.evict(&LockName::new(name)?).await? {
        Ok(())
    } else {
        Err(format!("nothing to evict for {name}").into())
    }
}

/// Opens a SQL client of its own at a URL, for the `fifo` cases.
pub fn fifo_connect() -> integration_tests::fifo::Connect {
    Arc::new(|url: String| {
        Box::pin(async move { Ok(LockClient::new(SqlBackend::connect(&url).await?)) })
    })
}

/// The semaphore `name` of three permits, and the row whose queue its
/// waiters join (PostgreSQL's).
pub fn queued_semaphore_row(name: &str) -> (integration_tests::fifo::Queued, String) {
    (
        integration_tests::fifo::Queued::semaphore(name, 3),
        format!("{name}@permits"),
    )
}

/// The lock `name`, which the waiters take shared, and the row whose queue
/// they join (PostgreSQL's).
pub fn queued_shared(name: &str) -> (integration_tests::fifo::Queued, String) {
    (
        integration_tests::fifo::Queued::shared(name),
        name.to_string(),
    )
}

/// The lock `name`, or with `election` the election `name`; and the row
/// whose queue its waiters join.
pub fn queued_row(election: bool, name: &str) -> (integration_tests::fifo::Queued, String) {
    if election {
        (
            integration_tests::fifo::Queued::election(name),
            format!("{name}@election"),
        )
    } else {
        (name.into(), name.to_string())
    }
}

/// [`integration_tests::fifo::an_eviction_wakes_the_queued_head`] on the
/// election `fifo/evict` of the server at `url`; `queued` counts the
/// entries of the queue of the row it is given. Every client of a table
/// uses the same `fifo`, the operator's too.
pub async fn an_eviction_wakes_the_queued_head(
    url: &str,
    queued: impl FnOnce(&str) -> integration_tests::fifo::Count,
) -> Result<(), Failed> {
    let name = "fifo/evict";
    let (_, row) = queued_row(true, name);
    let fifo = format!("{url}?fifo=true&queue_lease_ms=60000");
    integration_tests::fifo::an_eviction_wakes_the_queued_head(
        fifo_connect(),
        &fifo,
        name,
        queued(&row),
        || evict(&fifo, name),
    )
    .await
}

/// [`integration_tests::fifo::the_last_readers_release_wakes_a_queued_writer`]
/// on the lock `fifo/readers` of the server at `url`; `queued` counts the
/// entries of the queue of the row it is given.
pub async fn the_last_readers_release_wakes_a_queued_writer(
    url: &str,
    queued: impl FnOnce(&str) -> integration_tests::fifo::Count,
) -> Result<(), Failed> {
    let name = "fifo/readers";
    integration_tests::fifo::the_last_readers_release_wakes_a_queued_writer(
        fifo_connect(),
        &format!("{url}?fifo=true&queue_lease_ms=60000"),
        name,
        queued(name),
    )
    .await
}

/// A lock table with the longest name allowed, with `fifo` on: every table,
/// index and routine the backend derives from the name fits the database's
/// identifier limit, so a lock, a semaphore's permit, a shared hold and a
/// leadership are each taken, waited for and released.
pub async fn the_longest_table_name_serves_every_kind(f: Arc<SqlFactory>) -> Result<(), Failed> {
    const LONGEST: usize = 54;
    let table = format!("longest_{}", "t".repeat(LONGEST - "longest_".len()));
    serves_every_kind(&f.url_with(&format!("table={table}&fifo=true"))?).await
}

/// Two clients at `url` take a lock, a semaphore's permit, a shared hold
/// and a leadership, each waited for (but the shared one, held by both at
/// once) and released.
pub async fn serves_every_kind(url: &str) -> Result<(), Failed> {
    let (a, b) = (
        LockClient::new(SqlBackend::connect(url).await?),
        LockClient::new(SqlBackend::connect(url).await?),
    );
    let wait = Duration::from_secs(10);
    let held = a.lock("longest/lock").acquire().await?;
    let waiting = tokio::spawn({
        let b = b.clone();
        async move { b.lock("longest/lock").wait(wait).acquire().await }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    held.release().await?;
    waiting.await??.release().await?;
    let permit = a.semaphore("longest/semaphore", 1).acquire().await?;
    let waiting = tokio::spawn({
        let b = b.clone();
        async move {
            b.semaphore("longest/semaphore", 1)
                .wait(wait)
                .acquire()
                .await
        }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    permit.release().await?;
    waiting.await??.release().await?;
    let shared = a.lock("longest/shared").shared().acquire().await?;
    let other = b
        .lock("longest/shared")
        .shared()
        .try_acquire()
        .await?
        .ok_or("a second shared hold was refused")?;
    shared.release().await?;
    other.release().await?;
    let leader = a.election("longest/election").campaign("a").await?;
    if b.election("longest/election")
        .try_campaign("b")
        .await?
        .is_some()
    {
        return Err("two leaders of one election".into());
    }
    leader.resign().await?;
    Ok(())
}

/// A role given only the rights the guarantees list, on tables its
/// administrator made: `make_role(table, role, rights)` runs the
/// administrator's statements that make the role and, if `rights`, grant
/// it those rights; `url_of(role, params)` is the server's URL for that
/// role. As that role every kind is served, with and without `fifo`; as a
/// role given no rights a lock is `Misconfigured`, not retryable.
pub async fn a_role_with_only_the_listed_rights_serves_every_kind<M, MF>(
    f: &SqlFactory,
    make_role: M,
    url_of: impl Fn(&str, &str) -> String,
) -> Result<(), Failed>
where
    M: Fn(String, String, bool) -> MF,
    MF: std::future::Future<Output = Result<(), Failed>>,
{
    let (table, admin) = f.own_table("restricted")?;
    // The administrator's client makes every table (the queue's too).
    SqlBackend::connect(&format!("{admin}&fifo=true")).await?;
    let ns = &integration_tests::namespace()[12..];
    let role = format!("app_{ns}");
    make_role(table.clone(), role.clone(), true).await?;
    for fifo in [false, true] {
        serves_every_kind(&url_of(&role, &format!("table={table}&fifo={fifo}")))
            .await
            .map_err(|e| format!("as {role} with fifo={fifo}: {e:?}"))?;
    }
    let none = format!("none_{ns}");
    make_role(table.clone(), none.clone(), false).await?;
    // Its connection may be refused already, or its first lock.
    let tried = match SqlBackend::connect(&url_of(&none, &format!("table={table}"))).await {
        Ok(backend) => LockClient::new(backend)
            .lock("restricted/none")
            .try_acquire()
            .await
            .map(|g| g.is_some()),
        Err(e) => Err(e),
    };
    match tried {
        Err(e @ distlock_core::Error::Misconfigured { .. }) if !e.is_retryable() => Ok(()),
        other => {
            Err(format!("a role without rights: expected Misconfigured, got {other:?}").into())
        }
    }
}

/// A URL that demands TLS of a server that speaks none (`param` added to
/// the plain server's URL) is `Misconfigured` at connect, not retryable.
pub async fn tls_demanded_of_a_plain_server(url: &str, param: &str) -> Result<(), Failed> {
    let sep = if url.contains('?') { '&' } else { '?' };
    let url = format!("{url}{sep}{param}");
    match SqlBackend::connect(&url).await {
        Ok(_) => Err(format!("{param} connected to a server without TLS").into()),
        Err(e @ distlock_core::Error::Misconfigured { .. }) if !e.is_retryable() => Ok(()),
        Err(e) => Err(format!("{param} to a server without TLS gave {e:?}").into()),
    }
}

/// A shared hold whose lock row is no longer shared is not renewed, and not
/// left behind: `free(table, name)` frees the lock row by hand and leaves
/// the hold's row (as a release that judged the hold ended does while the
/// hold's renewal is on its way), answering the rows it changed. The
/// renewal answers not held; a later reader then comes and goes, and a
/// writer is granted at once: an extended hold row would count as live and
/// keep the lock shared for its TTL.
pub async fn a_shared_renewal_after_its_lock_row_was_freed_leaves_nothing<F, FF>(
    f: Arc<SqlFactory>,
    free: F,
) -> Result<(), Failed>
where
    F: FnOnce(String, String) -> FF,
    FF: std::future::Future<Output = Result<u64, Failed>>,
{
    let (table, url) = f.own_table("freed")?;
    let backend = SqlBackend::connect(&url).await?;
    let name = "rw/freed";
    let ttl = Duration::from_secs(60);
    let mut reader = LockRequest::new(LockName::new(name)?, ttl);
    reader.kind = distlock_core::HoldKind::Shared;
    backend
        .try_acquire(&reader)
        .await?
        .ok_or("the reader was refused")?;
    if free(table, name.to_string()).await? != 1 {
        return Err("the lock row was not freed by hand".into());
    }
    if backend.extend(&reader).await? {
        return Err("a shared hold whose lock row is free was renewed".into());
    }
    let client = LockClient::new(backend);
    let later = client
        .lock(name)
        .shared()
        .ttl(ttl)
        .try_acquire()
        .await?
        .ok_or("a later reader was refused")?;
    later.release().await?;
    match client.lock(name).ttl(ttl).try_acquire().await? {
        Some(w) => Ok(w.release().await.map(|_| ())?),
        None => Err(
            "a writer was refused once every live reader had released: the renewal left its hold's row live"
                .into(),
        ),
    }
}

/// A limit in the semaphore table that distlock does not write (set by
/// hand: `set(semaphore table, name, None)`, answering the rows it
/// changed) is `Misconfigured` (exit 78 in the CLI: retrying cannot mend
/// it), for an acquire and for `inspect_permits`. The mend its message
/// gives, the limit set by hand in the row (`set(.., Some(limit))`), keeps
/// the tokens rising.
pub async fn a_limit_distlock_did_not_write_is_misconfigured<F, FF>(
    f: Arc<SqlFactory>,
    set: F,
) -> Result<(), Failed>
where
    F: Fn(String, String, Option<u32>) -> FF,
    FF: std::future::Future<Output = Result<u64, Failed>>,
{
    let (table, url) = f.own_table("foreign_limit")?;
    let backend = SqlBackend::connect(&url).await?;
    let client = LockClient::new(backend.clone());
    let name = "sem/foreign-limit";
    let first = client
        .semaphore(name, 2)
        .try_acquire()
        .await?
        .ok_or("the first permit was refused")?;
    let first_token = first.token();
    first.release().await?;
    let sems = format!("{table}_sems");
    if set(sems.clone(), name.to_string(), None).await? != 1 {
        return Err("the limit was not set by hand".into());
    }
    match client.semaphore(name, 2).try_acquire().await {
        Err(distlock_core::Error::Misconfigured { message, .. })
            if message.contains("does not write") => {}
        other => {
            return Err(format!(
                "an acquire under a foreign limit gave {:?}",
                other.map(|g| g.is_some())
            )
            .into())
        }
    }
    match backend.inspect_permits(&LockName::new(name)?).await {
        Err(distlock_core::Error::Misconfigured { .. }) => {}
        other => return Err(format!("inspect under a foreign limit gave {other:?}").into()),
    }
    // set_limit refuses it too, and leaves it as it is: an acquire with
    // the limit asked for is still refused, not a mismatch.
    match backend.set_limit(&LockName::new(name)?, 3).await {
        Err(distlock_core::Error::Misconfigured { .. }) => {}
        other => return Err(format!("set_limit over a foreign limit gave {other:?}").into()),
    }
    match client.semaphore(name, 3).try_acquire().await {
        Err(distlock_core::Error::Misconfigured { .. }) => {}
        other => {
            return Err(format!(
                "after set_limit, an acquire of 3 gave {:?}",
                other.map(|g| g.is_some())
            )
            .into())
        }
    }
    if set(sems, name.to_string(), Some(3)).await? != 1 {
        return Err("the limit was not mended by hand".into());
    }
    let mended = client
        .semaphore(name, 3)
        .try_acquire()
        .await?
        .ok_or("a permit was refused once the limit was mended")?;
    if mended.token() <= first_token {
        return Err(format!(
            "after the mend, the token {:?} is not above the first {:?}",
            mended.token(),
            first_token
        )
        .into());
    }
    mended.release().await?;
    Ok(())
}
