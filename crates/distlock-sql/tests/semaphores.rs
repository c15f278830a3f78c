//! The SQLite semaphore and read-write lock tables' layout. What the
//! semaphore tables do on every SQL database is in the integration tests
//! (`integration-tests/tests/sql_support/semaphores.rs`), against real
//! PostgreSQL and MySQL/MariaDB servers too.

#![cfg(feature = "sqlite")]

use distlock_core::Owner;
use distlock_sql::{SqlBackend, SqlConfig};

type TestResult = Result<(), Box<dyn std::error::Error + Send + Sync>>;

fn check(ok: bool, what: impl Into<String>) -> TestResult {
    if ok {
        Ok(())
    } else {
        Err(what.into().into())
    }
}

fn fresh() -> String {
    Owner::random().to_string()[..8].to_string()
}

/// The semaphore and read-write lock tables sit beside the lock table, named
/// after it.
#[tokio::test]
async fn sqlite_semaphore_tables_are_named_after_the_lock_table() -> TestResult {
    let table = format!("sem_{}", fresh());
    let dir = std::env::temp_dir().join(format!("distlock-sql-{}", fresh()));
    std::fs::create_dir_all(&dir)?;
    let url = format!("sqlite://{}?table={table}", dir.join("locks.db").display());
    let b = SqlBackend::connect_with(&url, SqlConfig::default()).await?;
    drop(b);
    let path = url
        .trim_start_matches("sqlite://")
        .split('?')
        .next()
        .ok_or("no path")?;
    let pool = distlock_sql::sqlx::SqlitePool::connect(&format!("sqlite://{path}")).await?;
    let mut tables: Vec<String> =
        distlock_sql::sqlx::query_scalar("SELECT name FROM sqlite_master WHERE type = 'table'")
            .fetch_all(&pool)
            .await?;
    tables.sort();
    let mut want = vec![
        table.to_string(),
        format!("{table}_permits"),
        format!("{table}_sems"),
        format!("{table}_shared"),
        format!("{table}_writers"),
    ];
    want.sort();
    check(tables == want, format!("tables {tables:?}"))
}
