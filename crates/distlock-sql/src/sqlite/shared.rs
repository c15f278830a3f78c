//! SQLite read-write locks: each operation is one transaction whose first
//! statement is a write, so it runs under the file's write lock and the
//! holders of every process on the file take turns.

use distlock_core::wait::Outcome;
use distlock_core::{HoldRecord, LockRequest, Result};

use super::{ttl_millis, Lite, NOW_MS};
use crate::list::{holder, shared_record, NameRange, SharedRow, EVICTED_OWNER};
use crate::rwlock::{RwTables, SHARED_OWNER};
use crate::token_from_db;

pub(crate) struct Statements {
    create_shared: String,
    create_writers: String,
    take: String,
    insert_hold: String,
    extend_hold: String,
    raise: String,
    release_hold: String,
    forget_hold: String,
    drop_expired: String,
    settle: String,
    readers_hold: String,
    mark: String,
    unmark: String,
    status: String,
    evict_holds: String,
    evict_row: String,
    list: String,
}

impl Statements {
    pub(crate) fn new(table: &str, tables: &RwTables) -> Self {
        let RwTables { shared, writers } = tables;
        let s = SHARED_OWNER;
        Self {
            create_shared: format!(
                "CREATE TABLE IF NOT EXISTS {shared} (
                    name TEXT NOT NULL,
                    owner TEXT NOT NULL,
                    expires_at INTEGER NOT NULL,
                    token INTEGER,
                    holder TEXT,
                    PRIMARY KEY (name, owner))"
            ),
            create_writers: format!(
                "CREATE TABLE IF NOT EXISTS {writers} (
                    name TEXT NOT NULL,
                    owner TEXT NOT NULL,
                    expires_at INTEGER NOT NULL,
                    PRIMARY KEY (name, owner))"
            ),
            // Takes the lock row unless someone holds it exclusively or a
            // writer's mark lasts; bumps the token and raises the row's end
            // to the new hold's.
            take: format!(
                "INSERT INTO {table} (name, owner, token, expires_at) VALUES (?1, '{s}', 1, {NOW_MS} + ?2)
                 ON CONFLICT(name) DO UPDATE
                    SET owner = '{s}', token = {table}.token + 1,
                        expires_at = CASE WHEN {table}.owner = '{s}' AND {table}.expires_at > {NOW_MS}
                                          THEN max({table}.expires_at, excluded.expires_at)
                                          ELSE excluded.expires_at END
                  WHERE ({table}.owner IS NULL OR {table}.expires_at <= {NOW_MS} OR {table}.owner = '{s}')
                    AND NOT EXISTS (SELECT 1 FROM {writers} w
                                     WHERE w.name = ?1 AND w.expires_at > {NOW_MS})
                 RETURNING token"
            ),
            // The hold's row, with the token its grant answers (`?4`) and
            // the request's holder info (`?5`).
            insert_hold: format!(
                "INSERT INTO {shared} (name, owner, expires_at, token, holder)
                 VALUES (?1, ?2, {NOW_MS} + ?3, ?4, ?5)
                 ON CONFLICT(name, owner) DO UPDATE
                    SET expires_at = excluded.expires_at, token = excluded.token,
                        holder = excluded.holder"
            ),
            extend_hold: format!(
                "UPDATE {shared} SET expires_at = {NOW_MS} + ?3
                  WHERE name = ?1 AND owner = ?2 AND expires_at > {NOW_MS}"
            ),
            raise: format!(
                "UPDATE {table} SET expires_at = max(expires_at, {NOW_MS} + ?2)
                  WHERE name = ?1 AND owner = '{s}'"
            ),
            release_hold: format!(
                "DELETE FROM {shared} WHERE name = ?1 AND owner = ?2 AND expires_at > {NOW_MS}"
            ),
            forget_hold: format!("DELETE FROM {shared} WHERE name = ?1 AND owner = ?2"),
            // The expired holds go, and the lock row's end becomes the
            // latest live hold's, or the row is freed if none is left.
            drop_expired: format!(
                "DELETE FROM {shared} WHERE name = ?1 AND expires_at <= {NOW_MS}"
            ),
            settle: format!(
                "UPDATE {table}
                    SET owner = CASE WHEN EXISTS (SELECT 1 FROM {shared} WHERE name = ?1)
                                     THEN owner ELSE NULL END,
                        expires_at = coalesce((SELECT max(expires_at) FROM {shared} WHERE name = ?1),
                                              expires_at)
                  WHERE name = ?1 AND owner = '{s}'"
            ),
            readers_hold: format!(
                "SELECT 1 FROM {table} WHERE name = ?1 AND owner = '{s}' AND expires_at > {NOW_MS}"
            ),
            mark: format!(
                "INSERT INTO {writers} (name, owner, expires_at)
                 SELECT ?1, ?2, {NOW_MS} + ?3 FROM {table}
                  WHERE name = ?1 AND owner = '{s}' AND expires_at > {NOW_MS}
                 ON CONFLICT(name, owner) DO UPDATE SET expires_at = excluded.expires_at"
            ),
            unmark: format!(
                "DELETE FROM {writers} WHERE name = ?1 AND (owner = ?2 OR expires_at <= {NOW_MS})"
            ),
            status: format!(
                "SELECT (SELECT count(*) FROM {shared} WHERE name = ?1 AND expires_at > {NOW_MS}),
                        (SELECT count(*) FROM {writers} WHERE name = ?1 AND expires_at > {NOW_MS})"
            ),
            evict_holds: format!("DELETE FROM {shared} WHERE name = ?1 AND expires_at > {NOW_MS}"),
            evict_row: format!(
                "UPDATE {table} SET owner = '{EVICTED_OWNER}'
                  WHERE name = ?1 AND owner IS NOT NULL AND expires_at > {NOW_MS}"
            ),
            list: format!(
                "SELECT name, token, (expires_at - {NOW_MS}) * 1000, holder FROM {shared}
                  WHERE name >= ?1 AND name < ?2 AND expires_at > {NOW_MS}
                  ORDER BY name, token
                  LIMIT ?3"
            ),
        }
    }

    pub(crate) fn creates(&self) -> [&str; 2] {
        [&self.create_shared, &self.create_writers]
    }
}

impl Lite {
    pub(crate) async fn shared_attempt(&self, req: &LockRequest) -> Result<Outcome> {
        let s = &self.shared;
        let (name, owner) = (req.name.as_str(), req.owner.to_string());
        let token: Option<i64> = self
            .busy(|| async {
                let mut tx = self.pool.begin().await?;
                let token: Option<i64> = sqlx::query_scalar(&s.take)
                    .bind(name)
                    .bind(ttl_millis(req))
                    .fetch_optional(&mut *tx)
                    .await?;
                if token.is_some() {
                    sqlx::query(&s.insert_hold)
                        .bind(name)
                        .bind(&owner)
                        .bind(ttl_millis(req))
                        .bind(token)
                        .bind(holder(req))
                        .execute(&mut *tx)
                        .await?;
                }
                tx.commit().await?;
                Ok(token)
            })
            .await?;
        Ok(match token {
            Some(t) => Outcome::Granted(token_from_db(&self.err, t)?),
            None => Outcome::Held(None),
        })
    }

    /// The hold's row, then the lock row's end raised to it (never lowered:
    /// other holds may end later); held if both moved. A hold whose lock row
    /// is no longer shared (freed by a release that judged the hold ended,
    /// or taken since) is deleted: extended, it would count as live to
    /// later releases and keep the lock shared for a TTL more.
    pub(crate) async fn shared_extend(&self, req: &LockRequest) -> Result<bool> {
        let s = &self.shared;
        let (name, owner) = (req.name.as_str(), req.owner.to_string());
        self.busy(|| async {
            let mut tx = self.pool.begin().await?;
            let moved = sqlx::query(&s.extend_hold)
                .bind(name)
                .bind(&owner)
                .bind(ttl_millis(req))
                .execute(&mut *tx)
                .await?
                .rows_affected()
                == 1;
            let raised = moved
                && sqlx::query(&s.raise)
                    .bind(name)
                    .bind(ttl_millis(req))
                    .execute(&mut *tx)
                    .await?
                    .rows_affected()
                    == 1;
            if moved && !raised {
                sqlx::query(&s.forget_hold)
                    .bind(name)
                    .bind(&owner)
                    .execute(&mut *tx)
                    .await?;
            }
            tx.commit().await?;
            Ok(raised)
        })
        .await
    }

    pub(crate) async fn shared_release(&self, req: &LockRequest) -> Result<bool> {
        let s = &self.shared;
        let (name, owner) = (req.name.as_str(), req.owner.to_string());
        let held = self
            .busy(|| async {
                let mut tx = self.pool.begin().await?;
                let held = sqlx::query(&s.release_hold)
                    .bind(name)
                    .bind(&owner)
                    .execute(&mut *tx)
                    .await?
                    .rows_affected()
                    == 1;
                for settle in [&s.drop_expired, &s.settle] {
                    sqlx::query(settle).bind(name).execute(&mut *tx).await?;
                }
                tx.commit().await?;
                Ok(held)
            })
            .await?;
        self.wake(name);
        Ok(held)
    }

    /// A read first, so that a writer refused by another writer does not
    /// take the file's write lock on every poll.
    pub(crate) async fn mark(&self, req: &LockRequest) -> Result<bool> {
        let readers: Option<i64> = self
            .busy(|| {
                sqlx::query_scalar(&self.shared.readers_hold)
                    .bind(req.name.as_str())
                    .fetch_optional(&self.pool)
            })
            .await?;
        if readers.is_none() {
            return Ok(false);
        }
        let owner = req.owner.to_string();
        let r = self
            .busy(|| {
                sqlx::query(&self.shared.mark)
                    .bind(req.name.as_str())
                    .bind(&owner)
                    .bind(ttl_millis(req))
                    .execute(&self.pool)
            })
            .await?;
        Ok(r.rows_affected() == 1)
    }

    /// Removes the mark and lets the readers it held back try again.
    pub(crate) async fn unmark(&self, req: &LockRequest) -> Result<()> {
        let owner = req.owner.to_string();
        self.busy(|| {
            sqlx::query(&self.shared.unmark)
                .bind(req.name.as_str())
                .bind(&owner)
                .execute(&self.pool)
        })
        .await?;
        self.wake(req.name.as_str());
        Ok(())
    }

    /// Live shared holds and writer marks of `name`.
    pub(crate) async fn rw_status(&self, name: &str) -> Result<(i64, i64)> {
        self.busy(|| {
            sqlx::query_as(&self.shared.status)
                .bind(name)
                .fetch_one(&self.pool)
        })
        .await
    }

    /// Overwrites the lock row's owner and deletes the shared holds.
    pub(crate) async fn evict(&self, name: &str) -> Result<bool> {
        let s = &self.shared;
        self.busy(|| async {
            let mut tx = self.pool.begin().await?;
            let holds = sqlx::query(&s.evict_holds)
                .bind(name)
                .execute(&mut *tx)
                .await?
                .rows_affected();
            let row = sqlx::query(&s.evict_row)
                .bind(name)
                .execute(&mut *tx)
                .await?
                .rows_affected();
            tx.commit().await?;
            Ok(holds + row > 0)
        })
        .await
    }

    /// The live shared holds whose names fall in `range`, at most `limit`.
    pub(crate) async fn list_shared(
        &self,
        range: &NameRange,
        limit: i64,
    ) -> Result<Vec<HoldRecord>> {
        let rows: Vec<SharedRow> = self
            .busy(|| {
                sqlx::query_as(&self.shared.list)
                    .bind(&range.from)
                    .bind(&range.to)
                    .bind(limit)
                    .fetch_all(&self.pool)
            })
            .await?;
        rows.into_iter()
            .map(|r| shared_record(&self.err, r))
            .collect()
    }

    /// Wakes this process's waiters for `name`.
    fn wake(&self, name: &str) {
        if let Some(s) = self.releases.find(name) {
            s.wake_all();
        }
    }
}
