//! The MySQL/MariaDB target: its raw minimal sequences, with sqlx on the
//! same kind of pool distlock builds, in the backend's own layouts (ascii
//! names, `DATETIME(6)` ends judged by the server's `NOW(6)`, the token in
//! the OK packet through `LAST_INSERT_ID(expr)`).

use std::sync::Arc;

use distlock::sql::SqlBackend;
use distlock::LockClient;
use integration_tests::harness::{ServerKind, TestServer};
use sqlx::mysql::{MySqlPool, MySqlPoolOptions};

use crate::{uuid_like, BoxError, Step, Target, UNCONTENDED_LIMIT};

/// One round trip: the isolation level applies to the next transaction.
const BEGIN: &str = "SET TRANSACTION ISOLATION LEVEL READ COMMITTED; START TRANSACTION";
const UNTIL: &str = "NOW(6) + INTERVAL 30 SECOND";
const NAME: &str = "VARCHAR(255) CHARACTER SET ascii COLLATE ascii_bin NOT NULL";
const OWNER: &str = "CHAR(36) CHARACTER SET ascii COLLATE ascii_bin";

pub(crate) async fn target() -> Result<Target, BoxError> {
    let server = tokio::task::spawn_blocking(|| TestServer::start(ServerKind::MariaDb)).await??;
    let url = server.url().to_string();
    let pool = MySqlPoolOptions::new()
        .max_connections(10)
        .connect(&url)
        .await?;
    for create in [
        format!(
            "CREATE TABLE IF NOT EXISTS raw_locks (name {NAME} PRIMARY KEY, owner {OWNER} NULL,
              token BIGINT UNSIGNED NOT NULL, expires_at DATETIME(6) NOT NULL) ENGINE=InnoDB"
        ),
        format!(
            "CREATE TABLE IF NOT EXISTS raw_permits (name {NAME}, owner {OWNER} NOT NULL,
              expires_at DATETIME(6) NOT NULL, PRIMARY KEY (name, owner)) ENGINE=InnoDB"
        ),
        format!(
            "CREATE TABLE IF NOT EXISTS raw_semaphores (name {NAME} PRIMARY KEY) ENGINE=InnoDB"
        ),
        format!(
            "CREATE TABLE IF NOT EXISTS raw_locks_shared (name {NAME}, owner {OWNER} NOT NULL,
              expires_at DATETIME(6) NOT NULL, PRIMARY KEY (name, owner)) ENGINE=InnoDB"
        ),
        format!(
            "CREATE TABLE IF NOT EXISTS raw_locks_writers (name {NAME}, owner {OWNER} NOT NULL,
              expires_at DATETIME(6) NOT NULL, PRIMARY KEY (name, owner)) ENGINE=InnoDB"
        ),
    ] {
        sqlx::query(&create).execute(&pool).await?;
    }
    let client = on_pool(pool.clone()).await?;
    let fresh_url = url.clone();
    let fresh: crate::Connect = Arc::new(move || {
        let url = fresh_url.clone();
        Box::pin(async move {
            let pool = MySqlPoolOptions::new()
                .max_connections(10)
                .connect(&url)
                .await?;
            Ok(crate::Fresh {
                raw: raw_lock(pool.clone()),
                proto: None,
                client: Some(on_pool(pool).await?),
            })
        })
    });
    Ok(Target {
        name: "mysql",
        url,
        rtt: rtt(pool.clone()),
        raw: raw_lock(pool.clone()),
        proto: None,
        raw_permit: raw_permit(pool.clone()),
        raw_shared: Some(raw_shared(pool.clone())),
        requests: Some(requests(pool.clone())),
        client: Some(client),
        fresh,
        _server: Some(server),
        _servers: Vec::new(),
    })
}

/// distlock on `pool`, the raw sequences' pool.
async fn on_pool(pool: MySqlPool) -> Result<LockClient, BoxError> {
    Ok(LockClient::new(
        SqlBackend::mysql(
            pool,
            distlock::sql::SqlConfig::default().with_fifo(crate::fifo()),
        )
        .await?,
    ))
}

fn rtt(pool: MySqlPool) -> Step {
    Arc::new(move |_, _| {
        let p = pool.clone();
        Box::pin(async move {
            sqlx::query("SELECT 1").execute(&p).await?;
            Ok(())
        })
    })
}

/// The conditional update of a free or expired row (its first use inserts
/// it), then the owner's update that frees it.
fn raw_lock(pool: MySqlPool) -> Step {
    Arc::new(move |i, slot| {
        let p = pool.clone();
        Box::pin(async move {
            let (name, owner) = (format!("raw/{slot}"), uuid_like(i));
            let taken = sqlx::query(&format!(
                "UPDATE raw_locks SET owner = ?, token = LAST_INSERT_ID(token + 1),
                        expires_at = {UNTIL}
                  WHERE name = ? AND (owner IS NULL OR expires_at <= NOW(6))"
            ))
            .bind(&owner)
            .bind(&name)
            .execute(&p)
            .await?;
            if taken.rows_affected() != 1 {
                let inserted = sqlx::query(&format!(
                    "INSERT IGNORE INTO raw_locks VALUES (?, ?, 1, {UNTIL})"
                ))
                .bind(&name)
                .bind(&owner)
                .execute(&p)
                .await?;
                if inserted.rows_affected() != 1 {
                    return Err("raw lock busy".into());
                }
            }
            sqlx::query("UPDATE raw_locks SET owner = NULL WHERE name = ? AND owner = ?")
                .bind(&name)
                .bind(&owner)
                .execute(&p)
                .await?;
            Ok(())
        })
    })
}

/// One READ COMMITTED transaction: the name's row locked (an upsert that
/// changes nothing), then one insert if fewer than the limit are live; the
/// release deletes the owner's row. No fencing counter or stored limit.
fn raw_permit(pool: MySqlPool) -> Step {
    Arc::new(move |i, slot| {
        let p = pool.clone();
        Box::pin(async move {
            let (name, owner) = (format!("raw-permit/{slot}"), uuid_like(i));
            let mut tx = p.begin_with(BEGIN).await?;
            sqlx::query(
                "INSERT INTO raw_semaphores VALUES (?) ON DUPLICATE KEY UPDATE name = name",
            )
            .bind(&name)
            .execute(&mut *tx)
            .await?;
            let granted = sqlx::query(&format!(
                "INSERT INTO raw_permits (name, owner, expires_at)
                 SELECT ?, ?, {UNTIL} FROM DUAL
                  WHERE (SELECT COUNT(*) FROM raw_permits
                          WHERE name = ? AND expires_at > NOW(6)) < ?"
            ))
            .bind(&name)
            .bind(&owner)
            .bind(&name)
            .bind(i64::from(UNCONTENDED_LIMIT))
            .execute(&mut *tx)
            .await?;
            tx.commit().await?;
            if granted.rows_affected() != 1 {
                return Err("raw semaphore full".into());
            }
            sqlx::query("DELETE FROM raw_permits WHERE name = ? AND owner = ?")
                .bind(&name)
                .bind(&owner)
                .execute(&p)
                .await?;
            Ok(())
        })
    })
}

/// In the backend's layout: the grant takes the lock row unless it is held
/// exclusively or a writer's mark lasts (bumping the token) and inserts
/// the hold's row, in one transaction; the release locks the lock row,
/// deletes the hold and the name's expired ones, and sets the row's end to
/// the latest live hold's or frees it.
fn raw_shared(pool: MySqlPool) -> Step {
    Arc::new(move |i, slot| {
        let p = pool.clone();
        Box::pin(async move {
            let (name, owner) = (format!("raw-shared/{slot}"), uuid_like(i));
            let mut tx = p.begin_with(BEGIN).await?;
            let taken = sqlx::query(&format!(
                "UPDATE raw_locks
                    SET expires_at = CASE WHEN owner = 'shared' AND expires_at > NOW(6)
                                          THEN GREATEST(expires_at, {UNTIL}) ELSE {UNTIL} END,
                        owner = 'shared', token = LAST_INSERT_ID(token + 1)
                  WHERE name = ? AND (owner IS NULL OR expires_at <= NOW(6) OR owner = 'shared')
                    AND NOT EXISTS (SELECT 1 FROM raw_locks_writers w
                                     WHERE w.name = ? AND w.expires_at > NOW(6))"
            ))
            .bind(&name)
            .bind(&name)
            .execute(&mut *tx)
            .await?;
            let granted = taken.rows_affected() == 1
                || sqlx::query(&format!(
                    "INSERT IGNORE INTO raw_locks VALUES (?, 'shared', 1, {UNTIL})"
                ))
                .bind(&name)
                .execute(&mut *tx)
                .await?
                .rows_affected()
                    == 1;
            if granted {
                sqlx::query(&format!(
                    "INSERT INTO raw_locks_shared VALUES (?, ?, {UNTIL})"
                ))
                .bind(&name)
                .bind(&owner)
                .execute(&mut *tx)
                .await?;
            }
            tx.commit().await?;
            if !granted {
                return Err("raw shared lock busy".into());
            }
            let mut tx = p.begin_with(BEGIN).await?;
            sqlx::query("SELECT 1 FROM raw_locks WHERE name = ? FOR UPDATE")
                .bind(&name)
                .fetch_optional(&mut *tx)
                .await?;
            sqlx::query(
                "DELETE FROM raw_locks_shared WHERE name = ? AND (owner = ? OR expires_at <= NOW(6))",
            )
            .bind(&name)
            .bind(&owner)
            .execute(&mut *tx)
            .await?;
            sqlx::query(
                "UPDATE raw_locks
                    SET expires_at = COALESCE((SELECT MAX(h.expires_at) FROM raw_locks_shared h
                                                WHERE h.name = ? AND h.expires_at > NOW(6)),
                                              expires_at),
                        owner = CASE WHEN EXISTS (SELECT 1 FROM raw_locks_shared h
                                                   WHERE h.name = ? AND h.expires_at > NOW(6))
                                     THEN owner ELSE NULL END
                  WHERE name = ? AND owner = 'shared'",
            )
            .bind(&name)
            .bind(&name)
            .bind(&name)
            .execute(&mut *tx)
            .await?;
            tx.commit().await?;
            Ok(())
        })
    })
}

/// The statements clients have executed (prepared, as sqlx sends them) and
/// the `KILL`s, server-wide: the count reads itself as a plain query, which
/// neither counter includes.
fn requests(pool: MySqlPool) -> crate::Counter {
    Arc::new(move || {
        let pool = pool.clone();
        Box::pin(async move {
            let row = sqlx::raw_sql(
                "SELECT CAST(SUM(VARIABLE_VALUE) AS SIGNED) FROM information_schema.GLOBAL_STATUS
                  WHERE VARIABLE_NAME IN ('COM_STMT_EXECUTE', 'COM_KILL')",
            )
            .fetch_one(&pool)
            .await?;
            let n: i64 = sqlx::Row::try_get(&row, 0)?;
            Ok(u64::try_from(n).unwrap_or(0))
        })
    })
}
