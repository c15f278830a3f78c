//! SQLite semaphores: a grant is one statement, which SQLite runs under the
//! file's write lock, so acquirers of every process on the file take turns.
//! A trigger on the permit table keeps the semaphore's token counter at the
//! newest permit's token and clears the name's expired permits.

use distlock_core::{HoldRecord, LockName, LockRequest, LockStatus, Result};

use super::{ttl_millis, Lite, NOW_MS};
use crate::list::{holder, permit_record, NameRange, PermitRow};
use crate::semaphore::{limit_from_db, remaining_micros, PermitAttempt, PermitTables};
use distlock_core::wait::Outcome;

pub(crate) struct Statements {
    create_semaphores: String,
    create_permits: String,
    create_trigger: String,
    lock_semaphore: String,
    create_semaphore: String,
    select_limit: String,
    grant: String,
    count_live: String,
    extend: String,
    release: String,
    inspect: String,
    update_limit: String,
    list: String,
}

/// The limit column `column` as read: SQLite's columns keep whatever type
/// was written, and text or a real number there (another application's
/// data) reads as 0 (NULL stays NULL), which [`limit_from_db`](crate::semaphore::limit_from_db)
/// refuses as a limit distlock does not write.
fn stored_limit(column: &str) -> String {
    format!("CASE WHEN typeof({column}) IN ('integer', 'null') THEN {column} ELSE 0 END")
}

impl Statements {
    pub(crate) fn new(tables: &PermitTables) -> Self {
        let PermitTables {
            semaphores,
            permits,
        } = tables;
        Self {
            create_semaphores: format!(
                "CREATE TABLE IF NOT EXISTS {semaphores} (
                    name TEXT PRIMARY KEY NOT NULL,
                    permits INTEGER NOT NULL,
                    token INTEGER NOT NULL)"
            ),
            create_permits: format!(
                "CREATE TABLE IF NOT EXISTS {permits} (
                    name TEXT NOT NULL,
                    owner TEXT NOT NULL,
                    token INTEGER NOT NULL,
                    expires_at INTEGER NOT NULL,
                    holder TEXT,
                    PRIMARY KEY (name, owner))"
            ),
            // Inside the inserting statement, so a grant and the counter's
            // bump commit together; the counter only rises.
            create_trigger: format!(
                "CREATE TRIGGER IF NOT EXISTS {permits}_granted AFTER INSERT ON {permits}
                 BEGIN
                    UPDATE {semaphores} SET token = NEW.token
                     WHERE name = NEW.name AND token < NEW.token;
                    DELETE FROM {permits} WHERE name = NEW.name AND expires_at <= {NOW_MS};
                 END"
            ),
            // A write, so the first statement of the transaction takes the
            // file's write lock (see `permit_attempt`); the no-op update
            // makes an existing row come back too.
            lock_semaphore: format!(
                "INSERT INTO {semaphores} (name, permits, token) VALUES (?1, ?2, 0)
                 ON CONFLICT (name) DO UPDATE SET permits = permits
                 RETURNING {}",
                stored_limit("permits")
            ),
            create_semaphore: format!(
                "INSERT INTO {semaphores} (name, permits, token) VALUES (?1, ?2, 0)
                 ON CONFLICT (name) DO NOTHING"
            ),
            select_limit: format!(
                "SELECT {} FROM {semaphores} WHERE name = ?1",
                stored_limit("permits")
            ),
            // Granted only if the stored limit is the requested one and a
            // permit is free. The owner's own earlier permit (a retry after
            // a lost reply) is not counted but replaced: asking again with
            // the same owner takes one permit, not two. The permit's row
            // carries the request's holder info (`?5`).
            grant: format!(
                "INSERT OR REPLACE INTO {permits} (name, owner, token, expires_at, holder)
                 SELECT ?1, ?2, s.token + 1, {NOW_MS} + ?4, ?5 FROM {semaphores} s
                  WHERE s.name = ?1 AND s.permits = ?3
                    AND (SELECT count(*) FROM {permits}
                          WHERE name = ?1 AND owner <> ?2 AND expires_at > {NOW_MS}) < s.permits
                 RETURNING token"
            ),
            count_live: format!(
                "SELECT count(*), (min(expires_at) - {NOW_MS}) * 1000 FROM {permits}
                  WHERE name = ?1 AND expires_at > {NOW_MS}"
            ),
            extend: format!(
                "UPDATE {permits} SET expires_at = {NOW_MS} + ?3
                  WHERE name = ?1 AND owner = ?2 AND expires_at > {NOW_MS}"
            ),
            // Only a live permit, so the rows changed answer "was it still
            // held"; an expired one is free already and the next acquire
            // deletes it.
            release: format!(
                "DELETE FROM {permits} WHERE name = ?1 AND owner = ?2 AND expires_at > {NOW_MS}"
            ),
            inspect: format!(
                "SELECT {},
                        (SELECT count(*) FROM {permits} p
                          WHERE p.name = s.name AND p.expires_at > {NOW_MS})
                   FROM {semaphores} s WHERE s.name = ?1",
                stored_limit("s.permits")
            ),
            update_limit: format!("UPDATE {semaphores} SET permits = ?2 WHERE name = ?1"),
            list: format!(
                "SELECT p.name, p.token, (p.expires_at - {NOW_MS}) * 1000, p.holder, {}
                   FROM {permits} p LEFT JOIN {semaphores} s ON s.name = p.name
                  WHERE p.name >= ?1 AND p.name < ?2 AND p.expires_at > {NOW_MS}
                  ORDER BY p.name, p.token
                  LIMIT ?3",
                stored_limit("s.permits")
            ),
        }
    }

    pub(crate) fn creates(&self) -> [&str; 3] {
        [
            &self.create_semaphores,
            &self.create_permits,
            &self.create_trigger,
        ]
    }
}

impl Lite {
    /// One statement when the semaphore exists with the requested limit and
    /// a permit is free, as in nearly every uncontended acquire. Otherwise a
    /// transaction says why not: it creates the semaphore, or finds another
    /// limit in force, or finds every permit held (and when the first ends).
    pub(crate) async fn permit_attempt(&self, req: &LockRequest, limit: u32) -> Result<Outcome> {
        let (name, owner) = (req.name.as_str(), req.owner.to_string());
        let granted: Option<i64> = self
            .busy(|| {
                self.grant(name, &owner, limit, req)
                    .fetch_optional(&self.pool)
            })
            .await?;
        let found = match granted {
            Some(token) => PermitAttempt::Granted(token),
            None => self.permit_attempt_apart(req, &owner, limit).await?,
        };
        found.into_outcome(&self.err, req, limit)
    }

    fn grant<'q>(
        &'q self,
        name: &'q str,
        owner: &'q str,
        limit: u32,
        req: &'q LockRequest,
    ) -> sqlx::query::QueryScalar<'q, sqlx::Sqlite, i64, sqlx::sqlite::SqliteArguments<'q>> {
        sqlx::query_scalar(&self.permits.grant)
            .bind(name)
            .bind(owner)
            .bind(i64::from(limit))
            .bind(ttl_millis(req))
            .bind(holder(req))
    }

    /// The first statement, a write, takes the file's write lock, so the
    /// acquirers of every process on the file take turns (a transaction
    /// that read first would fail at its first write, SQLITE_BUSY_SNAPSHOT,
    /// whenever another acquirer committed in between; `BEGIN IMMEDIATE`
    /// would do the same, but sqlx 0.8 leaves a custom `BEGIN` open on the
    /// pooled connection if the future is dropped right after it). Then the
    /// limit check, the grant, and if that found no free permit, the live
    /// ones counted for when the earliest ends.
    async fn permit_attempt_apart(
        &self,
        req: &LockRequest,
        owner: &str,
        limit: u32,
    ) -> Result<PermitAttempt> {
        let s = &self.permits;
        let name = req.name.as_str();
        self.busy(|| async {
            let mut tx = self.pool.begin().await?;
            let stored: i64 = sqlx::query_scalar(&s.lock_semaphore)
                .bind(name)
                .bind(i64::from(limit))
                .fetch_one(&mut *tx)
                .await?;
            if stored != i64::from(limit) {
                tx.rollback().await?;
                return Ok(PermitAttempt::LimitIs(stored));
            }
            if let Some(token) = self
                .grant(name, owner, limit, req)
                .fetch_optional(&mut *tx)
                .await?
            {
                tx.commit().await?;
                return Ok(PermitAttempt::Granted(token));
            }
            let (_live, left): (i64, Option<i64>) = sqlx::query_as(&s.count_live)
                .bind(name)
                .fetch_one(&mut *tx)
                .await?;
            tx.commit().await?;
            Ok(PermitAttempt::Full(remaining_micros(left)))
        })
        .await
    }

    pub(crate) fn permit_extend_statement(&self) -> &str {
        &self.permits.extend
    }

    pub(crate) async fn permit_release(&self, req: &LockRequest) -> Result<bool> {
        let owner = req.owner.to_string();
        let r = self
            .busy(|| {
                sqlx::query(&self.permits.release)
                    .bind(req.name.as_str())
                    .bind(&owner)
                    .execute(&self.pool)
            })
            .await?;
        let held = r.rows_affected() == 1;
        if held {
            if let Some(s) = self.permit_releases.find(req.name.as_str()) {
                s.wake_one();
            }
        }
        Ok(held)
    }

    pub(crate) async fn inspect_permits(&self, name: &LockName) -> Result<LockStatus> {
        let row: Option<(i64, i64)> = self
            .busy(|| {
                sqlx::query_as(&self.permits.inspect)
                    .bind(name.as_str())
                    .fetch_optional(&self.pool)
            })
            .await?;
        Ok(match row {
            Some((limit, live)) => {
                let live = usize::try_from(live).unwrap_or(0);
                LockStatus::new(live > 0).with_holders(live, Some(limit_from_db(&self.err, limit)?))
            }
            None => LockStatus::new(false).with_holders(0, None),
        })
    }

    pub(crate) async fn set_limit(&self, name: &LockName, limit: u32) -> Result<Option<u32>> {
        let s = &self.permits;
        let old: Option<i64> = self
            .busy(|| async {
                let mut tx = self.pool.begin().await?;
                // A write first, for the write lock (see `permit_attempt`).
                let created = sqlx::query(&s.create_semaphore)
                    .bind(name.as_str())
                    .bind(i64::from(limit))
                    .execute(&mut *tx)
                    .await?
                    .rows_affected()
                    == 1;
                let old = if created {
                    None
                } else {
                    let old: i64 = sqlx::query_scalar(&s.select_limit)
                        .bind(name.as_str())
                        .fetch_one(&mut *tx)
                        .await?;
                    // A limit distlock does not write is refused below,
                    // and left as it is.
                    if limit_from_db(&self.err, old).is_err() {
                        tx.rollback().await?;
                        return Ok(Some(old));
                    }
                    sqlx::query(&s.update_limit)
                        .bind(name.as_str())
                        .bind(i64::from(limit))
                        .execute(&mut *tx)
                        .await?;
                    Some(old)
                };
                tx.commit().await?;
                Ok(old)
            })
            .await?;
        // A higher limit may let several waiters in.
        if let Some(s) = self.permit_releases.find(name.as_str()) {
            s.wake_all();
        }
        old.map(|l| limit_from_db(&self.err, l)).transpose()
    }

    /// The live permits whose names fall in `range`, at most `limit`.
    pub(crate) async fn list_permits(
        &self,
        range: &NameRange,
        limit: i64,
    ) -> Result<Vec<HoldRecord>> {
        let rows: Vec<PermitRow> = self
            .busy(|| {
                sqlx::query_as(&self.permits.list)
                    .bind(&range.from)
                    .bind(&range.to)
                    .bind(limit)
                    .fetch_all(&self.pool)
            })
            .await?;
        rows.into_iter()
            .map(|r| permit_record(&self.err, r))
            .collect()
    }
}
