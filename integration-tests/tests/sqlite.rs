//! The conformance suite on SQLite (a temp file), plus SQLite's own edges:
//! several processes on one file, and same-process waiters woken on release.

mod sql_support;

use std::process::Command;
use std::time::Duration;

use distlock_core::wait::Backoff;
use distlock_core::LockClient;
use distlock_sql::{sqlx, SqlBackend, SqlConfig};
use integration_tests::trial;
use libtest_mimic::Failed;
use sql_support::{Source, SqlFactory};

const CHILD_ENV: &str = "DISTLOCK_TEST_SQLITE_CHILD";
const ROUNDS: i64 = 25;

fn main() {
    if let Ok(spec) = std::env::var(CHILD_ENV) {
        std::process::exit(match child(&spec) {
            Ok(()) => 0,
            Err(e) => {
                eprintln!("child failed: {e}");
                1
            }
        });
    }
    sql_support::run_suite("sqlite", Source::SqliteFile, |f, rt| {
        vec![
            trial(
                rt,
                "sqlite::processes_sharing_one_file_exclude_each_other",
                two_processes(f.clone()),
            ),
            trial(
                rt,
                "sqlite::a_shared_renewal_after_its_lock_row_was_freed_leaves_nothing",
                shared_renewal_after_freed(f.clone()),
            ),
            trial(
                rt,
                "sqlite::same_process_waiter_is_woken_on_release",
                woken_in_process(f.clone()),
            ),
            trial(
                rt,
                "sqlite::a_freed_permit_wakes_one_waiter_of_a_process_and_a_changed_limit_wakes_all",
                freed_permit_wakes_one(f.clone()),
            ),
            trial(
                rt,
                "sqlite::same_process_readers_and_writers_are_woken",
                rw_woken_in_process(f.clone()),
            ),
            trial(
                rt,
                "sqlite::the_file_is_opened_with_every_commit_synced",
                every_commit_synced(f.clone()),
            ),
            trial(
                rt,
                "sqlite::a_limit_distlock_did_not_write_is_misconfigured",
                foreign_limit(f.clone()),
            ),
        ]
    })
}

/// Child process: increments a counter row ROUNDS times under the lock, with
/// a gap between read and write that any overlap would turn into a lost update.
fn child(spec: &str) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let (url, counter) = spec.split_once(' ').ok_or("bad child spec")?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async {
        let client = LockClient::new(SqlBackend::connect(url).await?);
        let pool = sqlx::SqlitePool::connect(&format!("{url}?mode=rw")).await?;
        sqlx::query("PRAGMA busy_timeout = 10000")
            .execute(&pool)
            .await?;
        for _ in 0..ROUNDS {
            let g = client
                .lock("shared/file-counter")
                .ttl(Duration::from_secs(10))
                .wait(Duration::from_secs(60))
                .acquire()
                .await?;
            let n: i64 = sqlx::query_scalar(&format!("SELECT n FROM {counter} WHERE id = 1"))
                .fetch_one(&pool)
                .await?;
            tokio::time::sleep(Duration::from_millis(2)).await;
            sqlx::query(&format!("UPDATE {counter} SET n = ? WHERE id = 1"))
                .bind(n + 1)
                .execute(&pool)
                .await?;
            g.release().await?;
        }
        Ok(())
    })
}

async fn two_processes(f: std::sync::Arc<SqlFactory>) -> Result<(), Failed> {
    let url = f.url()?;
    let counter = format!("counter_{}", &integration_tests::namespace()[12..]);
    let pool = sqlx::SqlitePool::connect(&url)
        .await
        .map_err(|e| e.to_string())?;
    sqlx::query(&format!(
        "CREATE TABLE {counter} (id INTEGER PRIMARY KEY, n INTEGER NOT NULL)"
    ))
    .execute(&pool)
    .await
    .map_err(|e| e.to_string())?;
    sqlx::query(&format!("INSERT INTO {counter} VALUES (1, 0)"))
        .execute(&pool)
        .await
        .map_err(|e| e.to_string())?;
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let spec = format!("{url} {counter}");
    let children = tokio::task::spawn_blocking(move || {
        let spawned: Vec<_> = (0..2)
            .map(|_| Command::new(&exe).env(CHILD_ENV, &spec).spawn())
            .collect();
        spawned
            .into_iter()
            .map(|c| c.and_then(|mut c| c.wait()))
            .collect::<Vec<_>>()
    })
    .await
    .map_err(|e| e.to_string())?;
    for status in children {
        let status = status.map_err(|e| e.to_string())?;
        if !status.success() {
            return Err(format!("a child process failed: {status}").into());
        }
    }
    let n: i64 = sqlx::query_scalar(&format!("SELECT n FROM {counter} WHERE id = 1"))
        .fetch_one(&pool)
        .await
        .map_err(|e| e.to_string())?;
    if n != 2 * ROUNDS {
        return Err(format!(
            "counter {n}, expected {}: two processes overlapped",
            2 * ROUNDS
        )
        .into());
    }
    Ok(())
}

/// The waiter's backoff is set to a minute, so only the in-process release
/// notification can hand it the lock within the bound below.
async fn woken_in_process(f: std::sync::Arc<SqlFactory>) -> Result<(), Failed> {
    let slow = f
        .connect(SqlConfig::default().with_poll(Backoff::new(
            Duration::from_secs(60),
            Duration::from_secs(60),
        )))
        .await?;
    let holder = LockClient::new(f.connect(SqlConfig::default()).await?);
    let waiter = LockClient::new(slow);
    sql_support::release_wakes_the_waiter(
        holder,
        waiter,
        "woken/in-process",
        Duration::from_millis(300),
        "waiter not woken by the release (it would have polled only after 60 s)",
    )
    .await
}

/// The backend's connections sync every commit (`synchronous = FULL`), so
/// an operating-system crash cannot roll back a token handed out; the
/// deployment check reports the setting it reads from them.
async fn every_commit_synced(f: std::sync::Arc<SqlFactory>) -> Result<(), Failed> {
    use distlock_core::Backend;
    let backend = f.connect(SqlConfig::default()).await?;
    let findings = backend.deployment_findings().await?;
    let sync = findings
        .iter()
        .find(|x| x.setting == "synchronous")
        .ok_or_else(|| format!("no synchronous finding in {findings:?}"))?;
    if sync.value.as_deref() != Ok("FULL") || sync.warning.is_some() {
        return Err(format!("synchronous is {sync:?}, not FULL without a warning").into());
    }
    Ok(())
}

/// A writer behind readers is woken when the last reader of this process
/// releases, and readers behind a writer's mark when the writer gives up;
/// the waiters' backoff is set to a minute.
async fn rw_woken_in_process(f: std::sync::Arc<SqlFactory>) -> Result<(), Failed> {
    let slow = f
        .connect(SqlConfig::default().with_poll(Backoff::new(
            Duration::from_secs(60),
            Duration::from_secs(60),
        )))
        .await?;
    let holder = LockClient::new(f.connect(SqlConfig::default()).await?);
    let giver = LockClient::new(f.connect(SqlConfig::default()).await?);
    sql_support::rw_waiters_are_woken(holder, giver, LockClient::new(slow), "woken/rw").await
}

/// See [`sql_support::freed_permit_wakes_one`]; the count is two triggers:
/// a granting attempt inserts a permit, and a refused one, after its
/// granting statement changed nothing, touches the semaphore row without
/// bumping its token.
async fn freed_permit_wakes_one(f: std::sync::Arc<SqlFactory>) -> Result<(), Failed> {
    let table = format!("wake_{}", &integration_tests::namespace()[12..]);
    let url = f.url_with(&format!("table={table}"))?;
    // The file exists once the first backend has opened it.
    SqlBackend::connect(&url).await?;
    let admin = sqlx::SqlitePool::connect(&format!("{}?mode=rw", f.url()?))
        .await
        .map_err(|e| e.to_string())?;
    // Only an in-process release wakes a waiter within the test.
    let config = SqlConfig::default().with_poll(Backoff::new(
        Duration::from_secs(60),
        Duration::from_secs(60),
    ));
    let counter = [
        format!("CREATE TABLE {table}_attempts (n INTEGER NOT NULL)"),
        format!("INSERT INTO {table}_attempts VALUES (0)"),
        format!(
            "CREATE TRIGGER {table}_count AFTER UPDATE ON {table}_sems FOR EACH ROW
             WHEN OLD.token = NEW.token BEGIN UPDATE {table}_attempts SET n = n + 1; END"
        ),
        format!(
            "CREATE TRIGGER {table}_count_grants AFTER INSERT ON {table}_permits FOR EACH ROW
             BEGIN UPDATE {table}_attempts SET n = n + 1; END"
        ),
    ];
    let count = format!("SELECT n FROM {table}_attempts");
    sql_support::freed_permit_wakes_one(
        &url,
        config,
        || async {
            for ddl in &counter {
                sqlx::query(ddl).execute(&admin).await?;
            }
            Ok(())
        },
        || async { sqlx::query_scalar(&count).fetch_one(&admin).await },
    )
    .await
}

/// See [`sql_support::a_shared_renewal_after_its_lock_row_was_freed_leaves_nothing`].
async fn shared_renewal_after_freed(f: std::sync::Arc<SqlFactory>) -> Result<(), Failed> {
    let file = f.clone();
    sql_support::a_shared_renewal_after_its_lock_row_was_freed_leaves_nothing(
        f,
        |table, name| async move {
            // Opened once the backend has made the file.
            let admin: sqlx::SqlitePool = file.admin_pool().await?;
            let done = sqlx::query(&format!("UPDATE {table} SET owner = NULL WHERE name = ?1"))
                .bind(name)
                .execute(&admin)
                .await?;
            Ok(done.rows_affected())
        },
    )
    .await
}

/// See [`sql_support::a_limit_distlock_did_not_write_is_misconfigured`]:
/// on SQLite, text in the integer column (its type affinity keeps it).
async fn foreign_limit(f: std::sync::Arc<SqlFactory>) -> Result<(), Failed> {
    let file = f.clone();
    sql_support::a_limit_distlock_did_not_write_is_misconfigured(f, |table, name, set| {
        let file = file.clone();
        async move {
            let admin: sqlx::SqlitePool = file.admin_pool().await?;
            let value = set.map_or_else(|| "'abc'".to_string(), |n| n.to_string());
            let done = sqlx::query(&format!(
                "UPDATE {table} SET permits = {value} WHERE name = ?1"
            ))
            .bind(name)
            .execute(&admin)
            .await?;
            Ok(done.rows_affected())
        }
    })
    .await
}
