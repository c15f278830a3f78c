//! MySQL and MariaDB: a conditional UPDATE (or a first INSERT) per attempt.

use std::sync::Arc;
use std::time::Duration;

use distlock_core::{FencingToken, Finding, HoldRecord, LockRequest, Result};
use sqlx::mysql::MySqlPool;

use crate::election::{leader_from_db, row, value, ELECTION_SUFFIX};
use crate::list::{
    exclusive_owner, holder, lock_record, sql_limit, suffix_len, NameRange, EVICTED_OWNER,
};
use crate::rwlock::RwTables;
use crate::semaphore::{Object, PermitTables};
use crate::{token_from_db, ttl_micros, DbError};

mod permits;
mod procedure;
pub(crate) mod queue;
mod renew;
mod shared;

/// The type of the text columns a hold carries (an election's value, the
/// holder info): compared byte for byte, any Unicode.
pub(crate) const TEXT: &str = "TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL";

pub(crate) struct My {
    pub(crate) pool: MySqlPool,
    /// The lock table and the permits table, by name.
    table: String,
    permit_table: String,
    create: String,
    /// Counts how many of the tables the creation statements make exist:
    /// when all of them do, none of those statements runs, so a user allowed
    /// only to read and write the tables can use tables an administrator
    /// made.
    count_tables: String,
    /// How many tables the creation statements make.
    tables: i64,
    /// Columns a table created without them gets: (table, column, type).
    added_columns: Vec<(String, &'static str, &'static str)>,
    take: String,
    insert: String,
    extend: String,
    release_live: String,
    /// First come, first served waiting (`fifo`), with the grant and the
    /// release that respect and wake the queue's head.
    pub(crate) queue: Option<Arc<queue::Queue>>,
    take_queued: String,
    release_queued: String,
    release_any: String,
    evict: String,
    inspect: String,
    proclaim: String,
    leader: String,
    evict_leader: String,
    list: String,
    permits: permits::Statements,
    shared: shared::Statements,
    err: DbError,
}

impl My {
    pub(crate) fn new(pool: MySqlPool, table: &str, err: DbError, fifo: Option<Duration>) -> Self {
        // ascii_bin: lock names compare byte for byte, so `Jobs` and `jobs`
        // are two locks, as on every other backend.
        let create = format!(
            "CREATE TABLE IF NOT EXISTS {table} (
                name VARCHAR(255) CHARACTER SET ascii COLLATE ascii_bin NOT NULL PRIMARY KEY,
                owner CHAR(36) CHARACTER SET ascii COLLATE ascii_bin NULL,
                token BIGINT UNSIGNED NOT NULL,
                expires_at DATETIME(6) NOT NULL,
                value {TEXT},
                holder {TEXT}) ENGINE=InnoDB"
        );
        let permit_tables = PermitTables::for_lock_table(table);
        let rw_tables = RwTables::for_lock_table(table);
        let names = [
            table,
            &permit_tables.semaphores,
            &permit_tables.permits,
            &rw_tables.shared,
            &rw_tables.writers,
        ];
        // Validated identifiers, so quoting them is enough.
        let count_tables = format!(
            "SELECT COUNT(*) FROM information_schema.tables
              WHERE table_schema = DATABASE() AND table_name IN ('{}')",
            names.join("', '")
        );
        // MySQL has no `ADD COLUMN IF NOT EXISTS` (MariaDB has):
        // `add_column` reads the table's columns first.
        let added_columns = vec![
            (table.to_owned(), "value", TEXT),
            (table.to_owned(), "holder", TEXT),
            (permit_tables.permits.clone(), "holder", TEXT),
            (rw_tables.shared.clone(), "token", "BIGINT UNSIGNED NULL"),
            (rw_tables.shared.clone(), "holder", TEXT),
        ];
        // One atomic statement takes a free or expired row. MySQL has no
        // UPDATE ... RETURNING; LAST_INSERT_ID(expr) puts the new token in
        // the statement's own OK packet, so no second round trip reads it.
        // The grant writes the row's value with it: an election's leader's,
        // NULL for a lock; and the request's holder info. A release leaves
        // the holder info: every reader of it reads held rows only.
        let take = format!(
            "UPDATE {table} SET owner = ?, token = LAST_INSERT_ID(token + 1),
                    expires_at = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND, value = ?, holder = ?
              WHERE name = ? AND (owner IS NULL OR expires_at <= UTC_TIMESTAMP(6))"
        );
        // With `fifo` (see `queue`): the same grant, only to the head of
        // the lock's queue (the last `?`: the connection id with which the
        // request heads it, 0 if it does not) or while nobody heads it.
        let q = queue::queue_lock(table);
        let take_queued = format!(
            "UPDATE {table} SET owner = ?, token = LAST_INSERT_ID(token + 1),
                    expires_at = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND, value = ?, holder = ?
              WHERE name = ? AND (owner IS NULL OR expires_at <= UTC_TIMESTAMP(6))
                AND IFNULL(IS_USED_LOCK({q}), 0) IN (0, ?)"
        );
        // The release reads the queue's head in the same UPDATE: its
        // connection id comes back as the statement's LAST_INSERT_ID (0:
        // nobody waits), the expiry unchanged; only then does a `KILL QUERY`
        // follow, so an uncontended release is one plain UPDATE.
        let release_queued = format!(
            "UPDATE {table} SET owner = NULL,
                    expires_at = expires_at
                        + INTERVAL 0 * LAST_INSERT_ID(IFNULL(IS_USED_LOCK({q}), 0)) MICROSECOND
              WHERE name = ? AND owner = ? AND expires_at > UTC_TIMESTAMP(6)"
        );
        // Only for a name never locked before: the row does not exist yet.
        // IGNORE, not ON DUPLICATE KEY UPDATE: sqlx connects with
        // CLIENT_FOUND_ROWS, under which a no-op duplicate update still
        // reports one affected row and would look like a grant. Every value
        // here is validated (a value is at most MAX_VALUE_LEN bytes, holder
        // info MAX_HOLDER_INFO_LEN, far below TEXT's limit), so IGNORE
        // hides no truncation.
        let insert = format!(
            "INSERT IGNORE INTO {table} (name, owner, token, expires_at, value, holder)
             VALUES (?, ?, 1, UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND, ?, ?)"
        );
        let extend = format!(
            "UPDATE {table} SET expires_at = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND
              WHERE name = ? AND owner = ? AND expires_at > UTC_TIMESTAMP(6)"
        );
        let release_live = format!(
            "UPDATE {table} SET owner = NULL WHERE name = ? AND owner = ? AND expires_at > UTC_TIMESTAMP(6)"
        );
        let release_any = format!("UPDATE {table} SET owner = NULL WHERE name = ? AND owner = ?");
        let evict = format!(
            "UPDATE {table} SET owner = '{EVICTED_OWNER}'
              WHERE name = ? AND owner IS NOT NULL AND expires_at > UTC_TIMESTAMP(6)"
        );
        // The holder info is an exclusive holder's only: not that of
        // shared holds keeping the row, nor an evicted holder's.
        let inspect = format!(
            "SELECT CAST(token AS SIGNED), TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), expires_at),
                    CASE WHEN {} THEN holder END
               FROM {table} WHERE name = ? AND owner IS NOT NULL AND expires_at > UTC_TIMESTAMP(6)",
            exclusive_owner("owner")
        );
        // An election's: a new value only while the owner's lease is live
        // (sqlx's CLIENT_FOUND_ROWS counts a row matched with its value
        // unchanged); its leader, only while one's is; eviction frees the
        // row at once.
        let proclaim = format!(
            "UPDATE {table} SET value = ? WHERE name = ? AND owner = ? AND expires_at > UTC_TIMESTAMP(6)"
        );
        let leader = format!(
            "SELECT value, CAST(token AS SIGNED), TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), expires_at),
                    holder
               FROM {table} WHERE name = ? AND owner IS NOT NULL AND expires_at > UTC_TIMESTAMP(6)"
        );
        // Exclusive holds and leaders (see `crate::list`): the election rows
        // ordered by the election's name, after its namesake lock.
        let n = suffix_len();
        let is_election = format!("RIGHT(name, {n}) = '{ELECTION_SUFFIX}'");
        let list = format!(
            "SELECT name, CAST(token AS SIGNED), TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), expires_at),
                    holder, value
               FROM {table}
              WHERE name >= ? AND name < ? AND owner IS NOT NULL AND {}
                AND expires_at > UTC_TIMESTAMP(6)
              ORDER BY CASE WHEN {is_election} THEN LEFT(name, CHAR_LENGTH(name) - {n})
                            ELSE name END, {is_election}
              LIMIT ?",
            exclusive_owner("owner")
        );
        let evict_leader = format!(
            "UPDATE {table} SET owner = NULL
              WHERE name = ? AND owner IS NOT NULL AND expires_at > UTC_TIMESTAMP(6)"
        );
        let queue = fifo.map(|lease| Arc::new(queue::Queue::new(table, &pool, lease)));
        Self {
            pool,
            queue,
            take_queued,
            release_queued,
            create,
            count_tables,
            tables: names.len() as i64,
            added_columns,
            take,
            insert,
            extend,
            release_live,
            release_any,
            evict,
            inspect,
            proclaim,
            leader,
            evict_leader,
            list,
            table: table.to_string(),
            permits: permits::Statements::new(table, &permit_tables),
            shared: shared::Statements::new(table, &rw_tables),
            permit_table: permit_tables.permits,
            err,
        }
    }

    pub(crate) async fn create_table(&self) -> Result<()> {
        let there: i64 = sqlx::query_scalar(&self.count_tables)
            .fetch_one(&self.pool)
            .await
            .map_err(|e| self.err.map(e))?;
        // `CREATE TABLE IF NOT EXISTS` needs the CREATE privilege even when
        // the table exists.
        if there < self.tables {
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
        }
        for (table, column, decl) in &self.added_columns {
            self.add_column(table, column, decl).await?;
        }
        self.create_procedures().await.map_err(|e| self.err.map(e))
    }

    /// Adds `column` to `table` if the table was created without it.
    /// Another client may add it meanwhile: its ALTER then fails, and the
    /// column is there. Table and column names are validated identifiers.
    async fn add_column(&self, table: &str, column: &str, decl: &str) -> Result<()> {
        let has_sql = format!(
            "SELECT COUNT(*) FROM information_schema.columns
              WHERE table_schema = DATABASE() AND table_name = '{table}' AND column_name = '{column}'"
        );
        let add_sql = format!("ALTER TABLE {table} ADD COLUMN {column} {decl}");
        let has = || async {
            sqlx::query_scalar::<_, i64>(&has_sql)
                .fetch_one(&self.pool)
                .await
                .map_err(|e| self.err.map(e))
        };
        if has().await? > 0 {
            return Ok(());
        }
        match sqlx::query(&add_sql).execute(&self.pool).await {
            Err(_) if has().await? > 0 => Ok(()),
            other => other.map(|_| ()).map_err(|e| self.err.map(e)),
        }
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
            let (row, owner) = (row(req), req.owner.to_string());
            let taken = self.take_query(req, &owner, &row).execute(&mut *tx).await?;
            if taken.rows_affected() == 1 {
                tokens.push(i64::try_from(taken.last_insert_id()).unwrap_or(-1));
                continue;
            }
            let inserted = sqlx::query(&self.insert)
                .bind(row.as_ref())
                .bind(&owner)
                .bind(ttl_micros(req.ttl))
                .bind(value(req))
                .bind(holder(req))
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

    /// The grant statement for `req`, bound: with `fifo` an exclusive
    /// request's or a campaign's respects the queue.
    fn take_query<'q>(
        &'q self,
        req: &'q LockRequest,
        owner: &'q str,
        row: &'q str,
    ) -> sqlx::query::Query<'q, sqlx::MySql, sqlx::mysql::MySqlArguments> {
        let queued = self.queue.as_ref();
        let q = sqlx::query(if queued.is_some() {
            &self.take_queued
        } else {
            &self.take
        })
        .bind(owner)
        .bind(ttl_micros(req.ttl))
        .bind(value(req))
        .bind(holder(req))
        .bind(row);
        match queued {
            Some(queue) => q.bind(row).bind(queue.head_of(req)),
            None => q,
        }
    }

    pub(crate) async fn try_acquire(&self, req: &LockRequest) -> Result<Option<FencingToken>> {
        let (row, owner) = (row(req), req.owner.to_string());
        let r = self
            .take_query(req, &owner, &row)
            .execute(&self.pool)
            .await
            .map_err(|e| self.err.map(e))?;
        if r.rows_affected() == 1 {
            let t = i64::try_from(r.last_insert_id()).unwrap_or(-1);
            return token_from_db(&self.err, t).map(Some);
        }
        // A refused wait asks for its place before the first-use insert's
        // round trip: the sooner it asks, the closer the queue's order is
        // to the order of arrival. A name that turns out new is granted by
        // the insert, and the place goes with the wait.
        if let Some(queue) = self.queue.as_ref() {
            queue.take_place(req);
        }
        let r = sqlx::query(&self.insert)
            .bind(row.as_ref())
            .bind(&owner)
            .bind(ttl_micros(req.ttl))
            .bind(value(req))
            .bind(holder(req))
            .execute(&self.pool)
            .await
            .map_err(|e| self.err.map(e))?;
        if r.rows_affected() == 1 {
            return Ok(Some(FencingToken(1)));
        }
        Ok(None)
    }

    pub(crate) async fn extend(&self, req: &LockRequest) -> Result<bool> {
        match Object::of(req, &self.err)? {
            Object::Semaphore { .. } => return self.permit_extend(req).await,
            Object::Shared => return self.shared_extend(req).await,
            Object::Lock | Object::Leader => {}
        }
        self.extend_row(&self.extend, req).await
    }

    /// Moves the end of `req`'s row, a lock's or a permit's by `sql`, to
    /// its TTL from now; whether it was still held.
    async fn extend_row(&self, sql: &str, req: &LockRequest) -> Result<bool> {
        let r = sqlx::query(sql)
            .bind(ttl_micros(req.ttl))
            .bind(row(req))
            .bind(req.owner.to_string())
            .execute(&self.pool)
            .await
            .map_err(|e| self.err.map(e))?;
        Ok(r.rows_affected() == 1)
    }

    pub(crate) async fn release(&self, req: &LockRequest) -> Result<bool> {
        let (row, owner) = (row(req), req.owner.to_string());
        let queued = self.queue.is_some();
        let release = match queued {
            true => sqlx::query(&self.release_queued).bind(row.as_ref()),
            false => sqlx::query(&self.release_live),
        };
        let r = release
            .bind(row.as_ref())
            .bind(&owner)
            .execute(&self.pool)
            .await
            .map_err(|e| self.err.map(e))?;
        if r.rows_affected() == 1 {
            if queued && r.last_insert_id() != 0 {
                queue::wake_head(&self.pool, r.last_insert_id()).await;
            }
            return Ok(true);
        }
        // Expired but not yet taken: free it anyway, and report it was not held.
        sqlx::query(&self.release_any)
            .bind(row.as_ref())
            .bind(&owner)
            .execute(&self.pool)
            .await
            .map_err(|e| self.err.map(e))?;
        Ok(false)
    }

    pub(crate) async fn inspect(&self, name: &str) -> Result<Option<(i64, i64, Option<String>)>> {
        let found: Option<(i64, i64, Option<Vec<u8>>)> = sqlx::query_as(&self.inspect)
            .bind(name)
            .fetch_optional(&self.pool)
            .await
            .map_err(|e| self.err.map(e))?;
        found
            .map(|(token, micros, holder)| Ok((token, micros, self.text(holder)?)))
            .transpose()
    }

    /// A text column of a `_bin` collation, which comes back as bytes.
    pub(crate) fn text(&self, bytes: Option<Vec<u8>>) -> Result<Option<String>> {
        bytes.map(String::from_utf8).transpose().map_err(|e| {
            distlock_core::Error::backend(
                self.err.backend,
                format!("a table returned text that is not UTF-8 ({e})"),
            )
        })
    }

    /// A name column (ASCII, `ascii_bin`), which comes back as bytes.
    pub(crate) fn name(&self, bytes: Vec<u8>) -> Result<String> {
        Ok(self.text(Some(bytes))?.unwrap_or_default())
    }

    /// The live holds of every kind whose names fall in `range`: at most
    /// `limit` of each table, one SELECT each.
    pub(crate) async fn list(&self, range: &NameRange, limit: usize) -> Result<Vec<HoldRecord>> {
        let limit = sql_limit(limit);
        type Row = (Vec<u8>, i64, i64, Option<Vec<u8>>, Option<Vec<u8>>);
        let locks = async {
            let rows: Vec<Row> = sqlx::query_as(&self.list)
                .bind(&range.from)
                .bind(&range.to)
                .bind(limit)
                .fetch_all(&self.pool)
                .await
                .map_err(|e| self.err.map(e))?;
            let mut records = Vec::with_capacity(rows.len());
            for (name, token, micros, holder, value) in rows {
                let row = (
                    self.name(name)?,
                    token,
                    micros,
                    self.text(holder)?,
                    self.text(value)?,
                );
                records.push(lock_record(&self.err, row)?);
            }
            Ok(records)
        };
        // The three tables are read at once, on connections of the pool.
        let (mut records, shared, permits) = tokio::try_join!(
            locks,
            self.list_shared(range, limit),
            self.list_permits(range, limit)
        )?;
        records.extend(shared);
        records.extend(permits);
        Ok(records)
    }

    /// Replaces the value of `req`'s election row while its lease is live.
    pub(crate) async fn proclaim(&self, req: &LockRequest, value: &str) -> Result<bool> {
        let r = sqlx::query(&self.proclaim)
            .bind(value)
            .bind(row(req))
            .bind(req.owner.to_string())
            .execute(&self.pool)
            .await
            .map_err(|e| self.err.map(e))?;
        Ok(r.rows_affected() == 1)
    }

    /// The live leader of the election row `row`.
    pub(crate) async fn leader(&self, row: &str) -> Result<Option<distlock_core::Leader>> {
        // Text of `_bin` collations comes back as bytes.
        type Row = (Option<Vec<u8>>, i64, i64, Option<Vec<u8>>);
        let found: Option<Row> = sqlx::query_as(&self.leader)
            .bind(row)
            .fetch_optional(&self.pool)
            .await
            .map_err(|e| self.err.map(e))?;
        let Some((value, token, micros, holder)) = found else {
            return Ok(None);
        };
        let row = (self.text(value)?, token, micros, self.text(holder)?);
        leader_from_db(&self.err, row).map(Some)
    }

    /// Frees the election row `row` at once (with `fifo` waking its
    /// queue's head); whether someone led.
    pub(crate) async fn evict_leader(&self, row: &str) -> Result<bool> {
        let evicted = match &self.queue {
            Some(queue) => queue.evict_leader.run(&self.pool, &[row]).await,
            None => sqlx::query(&self.evict_leader)
                .bind(row)
                .execute(&self.pool)
                .await
                .map(|r| r.rows_affected()),
        }
        .map_err(|e| self.err.map(e))?;
        Ok(evicted == 1)
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
