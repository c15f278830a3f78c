//! The conformance suite on MariaDB (the MySQL backend), plus its own edges.

mod sql_support;

use distlock_core::LockClient;
use distlock_sql::SqlConfig;
use integration_tests::harness::ServerKind;
use integration_tests::trial;
use sql_support::{Source, SqlFactory};

fn main() {
    sql_support::run_suite("mysql", Source::Server(ServerKind::MariaDb), |f, rt| {
        vec![trial(
            rt,
            "mysql::lock_names_are_case_sensitive",
            case_sensitive(f.clone()),
        )]
    })
}

/// `Jobs` and `jobs` are two locks, as on every other backend.
async fn case_sensitive(f: std::sync::Arc<SqlFactory>) -> Result<(), libtest_mimic::Failed> {
    let c = LockClient::new(f.connect(SqlConfig::default()).await?);
    let upper = c
        .lock("Case/Lock")
        .try_acquire()
        .await?
        .ok_or("Case/Lock not granted")?;
    if c.lock("case/lock").try_acquire().await?.is_none() {
        return Err("case/lock was taken as the same lock as Case/Lock".into());
    }
    upper.release().await?;
    Ok(())
}
