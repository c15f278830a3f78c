//! MySQL and MariaDB: a conditional UPDATE (or a first INSERT) per attempt.

use distlock_core::{FencingToken, Finding, LockRequest, Result};
use sqlx::mysql::MySqlPool;

use crate::rwlock::RwTables;
use crate::semaphore::{Object, PermitTables};
use crate::{token_from_db, ttl_micros, DbError};

mod permits;
mod renew;
mod shared;

pub(crate) struct My {
    pub(crate) pool: MySqlPool,
    /// The lock table and the permits table, by name.
    table: String,
    permit_table: String,
    create: String,
    take: String,
    insert: String,
    extend: String,
    release_live: String,
    release_any: String,
    evict: String,
    inspect: String,
    permits: permits::Statements,
    shared: shared::Statements,
    err: DbError,
}

impl My {
    pub(crate) fn new(pool: MySqlPool, table: &str, err: DbError) -> Self {
        // ascii_bin: lock names compare byte for byte, so `Jobs` and `jobs`
        // are two locks, as on every other backend.
        let create = format!(
            "CREATE TABLE IF NOT EXISTS {table} (
                name VARCHAR(255) CHARACTER SET ascii COLLATE ascii_bin NOT NULL PRIMARY KEY,
                owner CHAR(36) CHARACTER SET ascii COLLATE ascii_bin NULL,
                token BIGINT UNSIGNED NOT NULL,
                expires_at DATETIME(6) NOT NULL) ENGINE=InnoDB"
        );
        // One atomic statement takes a free or expired row. MySQL has no
        // UPDATE ... RETURNING; LAST_INSERT_ID(expr) puts the new token in
        // the statement's own OK packet, so no second round trip reads it.
        let take = format!(
            "UPDATE {table} SET owner = ?, token = LAST_INSERT_ID(token + 1),
                    expires_at = NOW(6) + INTERVAL ? MICROSECOND
              WHERE name = ? AND (owner IS NULL OR expires_at <= NOW(6))"
        );
        // Only for a name never locked before: the row does not exist yet.
        // IGNORE, not ON DUPLICATE KEY UPDATE: sqlx connects with
        // CLIENT_FOUND_ROWS, under which a no-op duplicate update still
        // reports one affected row and would look like a grant. Every value
        // here is validated, so IGNORE hides no truncation.
        let insert = format!(
            "INSERT IGNORE INTO {table} (name, owner, token, expires_at)
             VALUES (?, ?, 1, NOW(6) + INTERVAL ? MICROSECOND)"
        );
        let extend = format!(
            "UPDATE {table} SET expires_at = NOW(6) + INTERVAL ? MICROSECOND
              WHERE name = ? AND owner = ? AND expires_at > NOW(6)"
        );
        let release_live = format!(
            "UPDATE {table} SET owner = NULL WHERE name = ? AND owner = ? AND expires_at > NOW(6)"
        );
        let release_any = format!("UPDATE {table} SET owner = NULL WHERE name = ? AND owner = ?");
        let evict =
            format!("UPDATE {table} SET owner = 'evicted' WHERE name = ? AND owner IS NOT NULL");
        let inspect = format!(
            "SELECT CAST(token AS SIGNED), TIMESTAMPDIFF(MICROSECOND, NOW(6), expires_at) FROM {table}
              WHERE name = ? AND owner IS NOT NULL AND expires_at > NOW(6)"
        );
        Self {
            pool,
            create,
            take,
            insert,
            extend,
            release_live,
            release_any,
            evict,
            inspect,
            table: table.to_string(),
            permit_table: PermitTables::for_lock_table(table).permits,
            permits: permits::Statements::new(table, &PermitTables::for_lock_table(table)),
            shared: shared::Statements::new(table, &RwTables::for_lock_table(table)),
            err,
        }
    }

    pub(crate) async fn create_table(&self) -> Result<()> {
        for create in [self.create.as_str()]
            .into_iter()
            .chain(self.permits.creates())
            .chain(self.shared.creates())
        {
            sqlx::query(create)
                .execute(&self.pool)
                .await
                .map_err(|e| self.err.map(e))?;
        }
        self.create_grant_procedure()
            .await
            .map_err(|e| self.err.map(e))
    }

    /// `innodb_flush_log_at_trx_commit` (a grant is durable only at 1) and,
    /// with binary logging on, `binlog_format` (the semaphore transactions
    /// need ROW or MIXED).
    pub(crate) async fn deployment_findings(&self) -> Vec<Finding> {
        let mut out = Vec::new();
        let flush: std::result::Result<i64, sqlx::Error> =
            sqlx::query_scalar("SELECT CAST(@@innodb_flush_log_at_trx_commit AS SIGNED)")
                .fetch_one(&self.pool)
                .await;
        let setting = "innodb_flush_log_at_trx_commit";
        out.push(match flush {
            Ok(1) => Finding::fine(setting, "1"),
            Ok(v) => Finding::warning(
                setting,
                v.to_string(),
                "a crash can lose the last second of committed grants and token counters (a second holder, repeated tokens); set innodb_flush_log_at_trx_commit = 1",
            ),
            Err(e) => Finding::unknown(setting, format!("reading it failed: {e}")),
        });
        let binlog: std::result::Result<(i64, String), sqlx::Error> =
            sqlx::query_as("SELECT CAST(@@log_bin AS SIGNED), CAST(@@binlog_format AS CHAR)")
                .fetch_one(&self.pool)
                .await;
        out.push(match binlog {
            Ok((0, _)) => Finding::fine("binlog_format", "binary logging off"),
            Ok((_, f)) if f == "STATEMENT" => Finding::warning(
                "binlog_format",
                f,
                "the semaphore transactions are refused under statement-based logging; set binlog_format = ROW (or MIXED)",
            ),
            Ok((_, f)) => Finding::fine("binlog_format", f),
            Err(e) => Finding::unknown("binlog_format", format!("reading it failed: {e}")),
        });
        out
    }

    /// Every lock of `reqs` in one transaction, taken in the order given
    /// (the canonical one, so two such transactions lock rows in one
    /// order), or none: rolled back at the first that is held.
    pub(crate) async fn try_acquire_all(
        &self,
        reqs: &[LockRequest],
    ) -> Result<Option<Vec<FencingToken>>> {
        let tokens = self.retrying(|| self.take_all(reqs)).await?;
        tokens
            .map(|ts| {
                ts.into_iter()
                    .map(|t| token_from_db(&self.err, t))
                    .collect()
            })
            .transpose()
    }

    async fn take_all(&self, reqs: &[LockRequest]) -> Result<Option<Vec<i64>>, sqlx::Error> {
        let mut tx = self.pool.begin().await?;
        let mut tokens = Vec::with_capacity(reqs.len());
        for req in reqs {
            let owner = req.owner.to_string();
            let taken = sqlx::query(&self.take)
                .bind(&owner)
                .bind(ttl_micros(req.ttl))
                .bind(req.name.as_str())
                .execute(&mut *tx)
                .await?;
            if taken.rows_affected() == 1 {
                tokens.push(i64::try_from(taken.last_insert_id()).unwrap_or(-1));
                continue;
            }
            let inserted = sqlx::query(&self.insert)
                .bind(req.name.as_str())
                .bind(&owner)
                .bind(ttl_micros(req.ttl))
                .execute(&mut *tx)
                .await?;
            if inserted.rows_affected() != 1 {
                tx.rollback().await?;
                return Ok(None);
            }
            tokens.push(1);
        }
        tx.commit().await?;
        Ok(Some(tokens))
    }

    pub(crate) async fn try_acquire(&self, req: &LockRequest) -> Result<Option<FencingToken>> {
        let owner = req.owner.to_string();
        let r = sqlx::query(&self.take)
            .bind(&owner)
            .bind(ttl_micros(req.ttl))
            .bind(req.name.as_str())
            .execute(&self.pool)
            .await
            .map_err(|e| self.err.map(e))?;
        if r.rows_affected() == 1 {
            let t = i64::try_from(r.last_insert_id()).unwrap_or(-1);
            return token_from_db(&self.err, t).map(Some);
        }
        let r = sqlx::query(&self.insert)
            .bind(req.name.as_str())
            .bind(&owner)
            .bind(ttl_micros(req.ttl))
            .execute(&self.pool)
            .await
            .map_err(|e| self.err.map(e))?;
        Ok((r.rows_affected() == 1).then_some(FencingToken(1)))
    }

    pub(crate) async fn extend(&self, req: &LockRequest) -> Result<bool> {
        match Object::of(req, &self.err)? {
            Object::Semaphore { .. } => return self.permit_extend(req).await,
            Object::Shared => return self.shared_extend(req).await,
            Object::Lock => {}
        }
        self.extend_row(&self.extend, req).await
    }

    /// Moves the end of `req`'s row, a lock's or a permit's by `sql`, to
    /// its TTL from now; whether it was still held.
    async fn extend_row(&self, sql: &str, req: &LockRequest) -> Result<bool> {
        let r = sqlx::query(sql)
            .bind(ttl_micros(req.ttl))
            .bind(req.name.as_str())
            .bind(req.owner.to_string())
            .execute(&self.pool)
            .await
            .map_err(|e| self.err.map(e))?;
        Ok(r.rows_affected() == 1)
    }

    pub(crate) async fn release(&self, req: &LockRequest) -> Result<bool> {
        let owner = req.owner.to_string();
        let r = sqlx::query(&self.release_live)
            .bind(req.name.as_str())
            .bind(&owner)
            .execute(&self.pool)
            .await
            .map_err(|e| self.err.map(e))?;
        if r.rows_affected() == 1 {
            return Ok(true);
        }
        // Expired but not yet taken: free it anyway, and report it was not held.
        sqlx::query(&self.release_any)
            .bind(req.name.as_str())
            .bind(&owner)
            .execute(&self.pool)
            .await
            .map_err(|e| self.err.map(e))?;
        Ok(false)
    }

    pub(crate) async fn inspect(&self, name: &str) -> Result<Option<(i64, i64)>> {
        sqlx::query_as(&self.inspect)
            .bind(name)
            .fetch_optional(&self.pool)
            .await
            .map_err(|e| self.err.map(e))
    }

    /// Overwrites the lock row's owner and deletes the shared holds.
    pub(crate) async fn evict(&self, name: &str) -> Result<bool> {
        let holds = self.evict_holds(name).await?;
        let r = sqlx::query(&self.evict)
            .bind(name)
            .execute(&self.pool)
            .await
            .map_err(|e| self.err.map(e))?;
        Ok(r.rows_affected() == 1 || holds > 0)
    }
}
