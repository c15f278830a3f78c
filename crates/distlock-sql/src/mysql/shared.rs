//! MySQL/MariaDB read-write locks: per operation, one READ COMMITTED
//! transaction (see `permits.rs` for why that level) that takes the lock
//! row's row lock first, so that every grant, renewal and release of a
//! name's holds takes turns on it and each reads what the one before it
//! committed. With `fifo`, readers queue with the writers (see
//! `queue.rs`): a shared grant goes only to the queue's head, or to anyone
//! while nobody heads it and no writer waits (a refused writer marks the
//! name before its place in the queue is granted).

use distlock_core::wait::Outcome;
use distlock_core::{HoldRecord, LockRequest, Result};

use super::permits::BEGIN;
use super::{My, TEXT};
use crate::list::{holder, shared_record, NameRange};
use crate::rwlock::{RwTables, SHARED_OWNER};
use crate::{token_from_db, ttl_micros};

pub(crate) struct Statements {
    create_shared: String,
    create_writers: String,
    take: String,
    insert: String,
    insert_hold: String,
    lock_row: String,
    extend_hold: String,
    raise: String,
    lock_row_held: String,
    drop_holds: String,
    forget_hold: String,
    settle: String,
    mark: String,
    unmark: String,
    status: String,
    evict_holds: String,
    list: String,
    /// `settle` with a wait queue: a release that frees the row also reads
    /// the connection id of the queue's head, as its LAST_INSERT_ID.
    settle_queued: String,
    /// `take` with a wait queue (`fifo`, where readers queue too): granted
    /// to the queue's head (the first and last `?`: the connection id with
    /// which the request heads it, 0 if it does not), whatever writers
    /// queue behind it, or to anyone while nobody heads the queue and no
    /// writer waits (one may be refused but not queued yet).
    take_queued: String,
}

impl Statements {
    pub(crate) fn new(table: &str, tables: &RwTables) -> Self {
        let RwTables { shared, writers } = tables;
        let s = SHARED_OWNER;
        let name = "VARCHAR(255) CHARACTER SET ascii COLLATE ascii_bin NOT NULL";
        let owner = "CHAR(36) CHARACTER SET ascii COLLATE ascii_bin NOT NULL";
        let until = "UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND";
        let live =
            format!("EXISTS (SELECT 1 FROM {shared} h WHERE h.name = ? AND h.expires_at > UTC_TIMESTAMP(6))");
        // The lock row unless someone holds it exclusively or a writer
        // waits first (`first`: none does): the token bumped (and put in
        // the OK packet), the row's end raised to the new hold's. MySQL
        // assigns left to right, so `expires_at` goes first, while `owner`
        // is still the old one.
        let no_marks = format!(
            "NOT EXISTS (SELECT 1 FROM {writers} w WHERE w.name = ? AND w.expires_at > UTC_TIMESTAMP(6))"
        );
        let take = |first: &str| {
            format!(
                "UPDATE {table}
                    SET expires_at = CASE WHEN owner = '{s}' AND expires_at > UTC_TIMESTAMP(6)
                                          THEN GREATEST(expires_at, {until})
                                          ELSE {until} END,
                        owner = '{s}', token = LAST_INSERT_ID(token + 1)
                  WHERE name = ? AND (owner IS NULL OR expires_at <= UTC_TIMESTAMP(6) OR owner = '{s}')
                    AND {first}"
            )
        };
        // `head`: more of the new end (with a wait queue).
        let settle = |head: &str| {
            format!(
                "UPDATE {table}
                    SET expires_at = COALESCE((SELECT MAX(h.expires_at) FROM {shared} h
                                                WHERE h.name = ? AND h.expires_at > UTC_TIMESTAMP(6)),
                                              expires_at){head},
                        owner = CASE WHEN {live} THEN owner ELSE NULL END
                  WHERE name = ? AND owner = '{s}'"
            )
        };
        Self {
            create_shared: format!(
                "CREATE TABLE IF NOT EXISTS {shared} (
                    name {name},
                    owner {owner},
                    expires_at DATETIME(6) NOT NULL,
                    token BIGINT UNSIGNED NULL,
                    holder {TEXT},
                    PRIMARY KEY (name, owner)) ENGINE=InnoDB"
            ),
            create_writers: format!(
                "CREATE TABLE IF NOT EXISTS {writers} (
                    name {name},
                    owner {owner},
                    expires_at DATETIME(6) NOT NULL,
                    PRIMARY KEY (name, owner)) ENGINE=InnoDB"
            ),
            take: take(&no_marks),
            take_queued: take(&format!(
                "(? <> 0 OR {no_marks}) AND IFNULL(IS_USED_LOCK({}), 0) IN (0, ?)",
                super::queue::queue_lock(table)
            )),
            // A name never locked before.
            insert: format!(
                "INSERT IGNORE INTO {table} (name, owner, token, expires_at)
                 VALUES (?, '{s}', 1, {until})"
            ),
            // The hold's row, with the token its grant answered and the
            // request's holder info.
            insert_hold: format!(
                "INSERT INTO {shared} (name, owner, expires_at, token, holder)
                 VALUES (?, ?, {until}, ?, ?)
                 ON DUPLICATE KEY UPDATE expires_at = VALUES(expires_at), token = VALUES(token),
                                         holder = VALUES(holder)"
            ),
            lock_row: format!("SELECT 1 FROM {table} WHERE name = ? FOR UPDATE"),
            extend_hold: format!(
                "UPDATE {shared} SET expires_at = {until}
                  WHERE name = ? AND owner = ? AND expires_at > UTC_TIMESTAMP(6)"
            ),
            raise: format!(
                "UPDATE {table} SET expires_at = GREATEST(expires_at, {until})
                  WHERE name = ? AND owner = '{s}'"
            ),
            // `lock_row`, answering whether the owner's hold is live (read
            // under a lock too, so as committed now).
            lock_row_held: format!(
                "SELECT EXISTS (SELECT 1 FROM {shared} h
                                 WHERE h.name = ? AND h.owner = ? AND h.expires_at > UTC_TIMESTAMP(6))
                   FROM {table} WHERE name = ? FOR UPDATE"
            ),
            drop_holds: format!(
                "DELETE FROM {shared} WHERE name = ? AND (owner = ? OR expires_at <= UTC_TIMESTAMP(6))"
            ),
            forget_hold: format!("DELETE FROM {shared} WHERE name = ? AND owner = ?"),
            // The lock row's end becomes the latest live hold's, or the
            // row is freed if none is left.
            settle: settle(""),
            // The UPDATE reads the head in its own reply: its connection id
            // (0 if the row stays held or nobody heads the queue) comes
            // back as the statement's LAST_INSERT_ID, the end unchanged by
            // it.
            settle_queued: settle(&format!(
                "
                                     + INTERVAL 0 * LAST_INSERT_ID(
                                         CASE WHEN {live} THEN 0
                                              ELSE IFNULL(IS_USED_LOCK({q}), 0) END) MICROSECOND",
                q = super::queue::queue_lock(table)
            )),
            mark: format!(
                "INSERT INTO {writers} (name, owner, expires_at)
                 SELECT ?, ?, {until} FROM {table}
                  WHERE name = ? AND owner = '{s}' AND expires_at > UTC_TIMESTAMP(6)
                 ON DUPLICATE KEY UPDATE expires_at = VALUES(expires_at)"
            ),
            unmark: format!(
                "DELETE FROM {writers} WHERE name = ? AND (owner = ? OR expires_at <= UTC_TIMESTAMP(6))"
            ),
            status: format!(
                "SELECT (SELECT COUNT(*) FROM {shared} WHERE name = ? AND expires_at > UTC_TIMESTAMP(6)),
                        (SELECT COUNT(*) FROM {writers} WHERE name = ? AND expires_at > UTC_TIMESTAMP(6))"
            ),
            evict_holds: format!(
                "DELETE FROM {shared} WHERE name = ? AND expires_at > UTC_TIMESTAMP(6)"
            ),
            list: format!(
                "SELECT name, CAST(token AS SIGNED),
                        TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), expires_at), holder
                   FROM {shared}
                  WHERE name >= ? AND name < ? AND expires_at > UTC_TIMESTAMP(6)
                  ORDER BY name, token
                  LIMIT ?"
            ),
        }
    }

    pub(crate) fn creates(&self) -> [&str; 2] {
        [&self.create_shared, &self.create_writers]
    }
}

impl My {
    /// With a wait queue, a refused waiting request asks for its place at
    /// once (see `queue.rs`).
    pub(crate) async fn shared_attempt(&self, req: &LockRequest) -> Result<Outcome> {
        let owner = req.owner.to_string();
        let token = self.retrying(|| self.shared_grant(req, &owner)).await?;
        Ok(match token {
            Some(t) => Outcome::Granted(token_from_db(&self.err, t)?),
            None => {
                if let Some(queue) = &self.queue {
                    queue.take_place(req);
                }
                Outcome::Held(None)
            }
        })
    }

    /// `take` (or `insert` for a new name) and the hold's row, in one
    /// transaction: 4 round trips for a grant, 3 for a refusal.
    async fn shared_grant(
        &self,
        req: &LockRequest,
        owner: &str,
    ) -> Result<Option<i64>, sqlx::Error> {
        let s = &self.shared;
        let name = req.name.as_str();
        let ttl = ttl_micros(req.ttl);
        let mut tx = self.pool.begin_with(BEGIN).await?;
        let take = match &self.queue {
            Some(queue) => {
                let head = queue.head_of(req);
                sqlx::query(&s.take_queued)
                    .bind(ttl)
                    .bind(ttl)
                    .bind(name)
                    .bind(head)
                    .bind(name)
                    .bind(name)
                    .bind(head)
            }
            None => sqlx::query(&s.take)
                .bind(ttl)
                .bind(ttl)
                .bind(name)
                .bind(name),
        };
        let taken = take.execute(&mut *tx).await?;
        let token = if taken.rows_affected() == 1 {
            Some(i64::try_from(taken.last_insert_id()).unwrap_or(-1))
        } else {
            let inserted = sqlx::query(&s.insert)
                .bind(name)
                .bind(ttl)
                .execute(&mut *tx)
                .await?;
            (inserted.rows_affected() == 1).then_some(1)
        };
        if token.is_some() {
            sqlx::query(&s.insert_hold)
                .bind(name)
                .bind(owner)
                .bind(ttl)
                .bind(token)
                .bind(holder(req))
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        Ok(token)
    }

    pub(crate) async fn shared_extend(&self, req: &LockRequest) -> Result<bool> {
        let owner = req.owner.to_string();
        self.retrying(|| self.shared_extend_transaction(req, &owner))
            .await
    }

    /// The row lock, the hold's row, then the lock row's end raised to it
    /// (never lowered: other holds may end later); held if both moved. A
    /// hold whose lock row is no longer shared is deleted (see SQLite's
    /// `shared_extend`).
    async fn shared_extend_transaction(
        &self,
        req: &LockRequest,
        owner: &str,
    ) -> Result<bool, sqlx::Error> {
        let s = &self.shared;
        let name = req.name.as_str();
        let ttl = ttl_micros(req.ttl);
        let mut tx = self.pool.begin_with(BEGIN).await?;
        sqlx::query(&s.lock_row)
            .bind(name)
            .fetch_optional(&mut *tx)
            .await?;
        let moved = sqlx::query(&s.extend_hold)
            .bind(ttl)
            .bind(name)
            .bind(owner)
            .execute(&mut *tx)
            .await?
            .rows_affected()
            == 1;
        let raised = moved
            && sqlx::query(&s.raise)
                .bind(ttl)
                .bind(name)
                .execute(&mut *tx)
                .await?
                .rows_affected()
                == 1;
        if moved && !raised {
            sqlx::query(&s.forget_hold)
                .bind(name)
                .bind(owner)
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        Ok(raised)
    }

    pub(crate) async fn shared_release(&self, req: &LockRequest) -> Result<bool> {
        let owner = req.owner.to_string();
        self.retrying(|| self.shared_release_transaction(req, &owner))
            .await
    }

    /// The row lock (and whether the hold is live); the hold's row and
    /// expired ones deleted; the lock row's end set from the holds left, or
    /// the row freed: 5 round trips. With a wait queue, the release that
    /// frees the row also reads the queue's head, and wakes it after the
    /// commit: 1 more.
    async fn shared_release_transaction(
        &self,
        req: &LockRequest,
        owner: &str,
    ) -> Result<bool, sqlx::Error> {
        let s = &self.shared;
        let name = req.name.as_str();
        let mut tx = self.pool.begin_with(BEGIN).await?;
        let held: Option<bool> = sqlx::query_scalar(&s.lock_row_held)
            .bind(name)
            .bind(owner)
            .bind(name)
            .fetch_optional(&mut *tx)
            .await?;
        sqlx::query(&s.drop_holds)
            .bind(name)
            .bind(owner)
            .execute(&mut *tx)
            .await?;
        let settled = match self.queue {
            Some(_) => sqlx::query(&s.settle_queued).bind(name).bind(name),
            None => sqlx::query(&s.settle),
        }
        .bind(name)
        .bind(name)
        .bind(name)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        if self.queue.is_some() && settled.rows_affected() == 1 && settled.last_insert_id() != 0 {
            super::queue::wake_head(&self.pool, settled.last_insert_id()).await;
        }
        Ok(held.unwrap_or(false))
    }

    pub(crate) async fn mark(&self, req: &LockRequest) -> Result<bool> {
        let r = sqlx::query(&self.shared.mark)
            .bind(req.name.as_str())
            .bind(req.owner.to_string())
            .bind(ttl_micros(req.ttl))
            .bind(req.name.as_str())
            .execute(&self.pool)
            .await
            .map_err(|e| self.err.map(e))?;
        Ok(r.rows_affected() > 0)
    }

    pub(crate) async fn unmark(&self, req: &LockRequest) -> Result<()> {
        sqlx::query(&self.shared.unmark)
            .bind(req.name.as_str())
            .bind(req.owner.to_string())
            .execute(&self.pool)
            .await
            .map_err(|e| self.err.map(e))?;
        Ok(())
    }

    /// The live shared holds whose names fall in `range`, at most `limit`.
    pub(crate) async fn list_shared(
        &self,
        range: &NameRange,
        limit: i64,
    ) -> Result<Vec<HoldRecord>> {
        type Row = (Vec<u8>, Option<i64>, i64, Option<Vec<u8>>);
        let rows: Vec<Row> = sqlx::query_as(&self.shared.list)
            .bind(&range.from)
            .bind(&range.to)
            .bind(limit)
            .fetch_all(&self.pool)
            .await
            .map_err(|e| self.err.map(e))?;
        let mut records = Vec::with_capacity(rows.len());
        for (name, token, micros, holder) in rows {
            let row = (self.name(name)?, token, micros, self.text(holder)?);
            records.push(shared_record(&self.err, row)?);
        }
        Ok(records)
    }

    /// Live shared holds and writer marks of `name`.
    pub(crate) async fn rw_status(&self, name: &str) -> Result<(i64, i64)> {
        sqlx::query_as(&self.shared.status)
            .bind(name)
            .bind(name)
            .fetch_one(&self.pool)
            .await
            .map_err(|e| self.err.map(e))
    }

    /// Deletes the shared holds of `name`; how many there were.
    pub(crate) async fn evict_holds(&self, name: &str) -> Result<u64> {
        let r = sqlx::query(&self.shared.evict_holds)
            .bind(name)
            .execute(&self.pool)
            .await
            .map_err(|e| self.err.map(e))?;
        Ok(r.rows_affected())
    }
}
