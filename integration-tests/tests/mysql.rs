//! The conformance suite on MariaDB (the MySQL backend), plus its own edges.

mod sql_support;

use distlock_core::LockClient;
use distlock_sql::SqlConfig;
use integration_tests::harness::ServerKind;
use sql_support::{table_created_concurrently, trial, Source, SqlFactory};

fn main() {
    let f = SqlFactory::new("mysql", Source::Server(ServerKind::MariaDb));
    integration_tests::run_suite(f.clone(), move |rt| {
        vec![
            table_created_concurrently(f.clone(), rt),
            trial("mysql::lock_names_are_case_sensitive".into(), rt, {
                let f = f.clone();
                move || async move {
                    let c = LockClient::new(f.connect(SqlConfig::default()).await?);
                    let upper = c
                        .lock("Case/Lock")
                        .try_acquire()
                        .await?
                        .ok_or("Case/Lock not granted")?;
                    let lower = c.lock("case/lock").try_acquire().await?;
                    if lower.is_none() {
                        return Err("case/lock was taken as the same lock as Case/Lock".into());
                    }
                    upper.release().await?;
                    Ok(())
                }
            }),
        ]
    })
}
