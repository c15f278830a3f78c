//! SQLite semaphores: each attempt is one transaction under the file's write
//! lock, so acquirers of every process on the file take turns.

use distlock_core::{LockName, LockRequest, LockStatus, Result};

use super::{ttl_millis, Lite, NOW_MS};
use crate::semaphore::{limit_from_db, remaining_micros, PermitAttempt, PermitTables};
use distlock_core::wait::Outcome;

pub(crate) struct Statements {
    create_semaphores: String,
    create_permits: String,
    lock_semaphore: String,
    create_semaphore: String,
    select_limit: String,
    delete_expired: String,
    count_live: String,
    bump_token: String,
    insert_permit: String,
    extend: String,
    release: String,
    inspect: String,
    update_limit: String,
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
                    PRIMARY KEY (name, owner))"
            ),
            // A write, so the first statement of the transaction takes the
            // file's write lock (see `permit_attempt`); the no-op update
            // makes an existing row come back too.
            lock_semaphore: format!(
                "INSERT INTO {semaphores} (name, permits, token) VALUES (?1, ?2, 0)
                 ON CONFLICT (name) DO UPDATE SET permits = permits
                 RETURNING permits, token"
            ),
            create_semaphore: format!(
                "INSERT INTO {semaphores} (name, permits, token) VALUES (?1, ?2, 0)
                 ON CONFLICT (name) DO NOTHING"
            ),
            select_limit: format!("SELECT permits FROM {semaphores} WHERE name = ?1"),
            // The owner's own earlier permit goes too: asking again with
            // the same owner (a retry after a lost reply) takes one permit,
            // not two.
            delete_expired: format!(
                "DELETE FROM {permits} WHERE name = ?1 AND (expires_at <= {NOW_MS} OR owner = ?2)"
            ),
            count_live: format!(
                "SELECT count(*), (min(expires_at) - {NOW_MS}) * 1000 FROM {permits}
                  WHERE name = ?1 AND expires_at > {NOW_MS}"
            ),
            bump_token: format!("UPDATE {semaphores} SET token = ?2 WHERE name = ?1"),
            insert_permit: format!(
                "INSERT INTO {permits} (name, owner, token, expires_at)
                 VALUES (?1, ?2, ?3, {NOW_MS} + ?4)"
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
                "SELECT s.permits,
                        (SELECT count(*) FROM {permits} p
                          WHERE p.name = s.name AND p.expires_at > {NOW_MS})
                   FROM {semaphores} s WHERE s.name = ?1"
            ),
            update_limit: format!("UPDATE {semaphores} SET permits = ?2 WHERE name = ?1"),
        }
    }

    pub(crate) fn creates(&self) -> [&str; 2] {
        [&self.create_semaphores, &self.create_permits]
    }
}

impl Lite {
    /// The first statement, a write, takes the file's write lock, so the
    /// acquirers of every process on the file take turns (a transaction
    /// that read first would fail at its first write, SQLITE_BUSY_SNAPSHOT,
    /// whenever another acquirer committed in between; `BEGIN IMMEDIATE`
    /// would do the same, but sqlx 0.8 leaves a custom `BEGIN` open on the
    /// pooled connection if the future is dropped right after it). Then:
    /// the limit check; expired permits out; the live ones counted; and,
    /// if one is free, the counter bumped and the permit inserted with the
    /// new token.
    pub(crate) async fn permit_attempt(&self, req: &LockRequest, limit: u32) -> Result<Outcome> {
        let s = &self.permits;
        let name = req.name.as_str();
        let owner = req.owner.to_string();
        let found = self
            .busy(|| async {
                let mut tx = self.pool.begin().await?;
                let (stored, token): (i64, i64) = sqlx::query_as(&s.lock_semaphore)
                    .bind(name)
                    .bind(i64::from(limit))
                    .fetch_one(&mut *tx)
                    .await?;
                if stored != i64::from(limit) {
                    tx.rollback().await?;
                    return Ok(PermitAttempt::LimitIs(stored));
                }
                sqlx::query(&s.delete_expired)
                    .bind(name)
                    .bind(&owner)
                    .execute(&mut *tx)
                    .await?;
                let (live, left): (i64, Option<i64>) = sqlx::query_as(&s.count_live)
                    .bind(name)
                    .fetch_one(&mut *tx)
                    .await?;
                if live >= stored {
                    // Keeps the expired permits' deletion.
                    tx.commit().await?;
                    return Ok(PermitAttempt::Full(remaining_micros(left)));
                }
                let token = token + 1;
                sqlx::query(&s.bump_token)
                    .bind(name)
                    .bind(token)
                    .execute(&mut *tx)
                    .await?;
                sqlx::query(&s.insert_permit)
                    .bind(name)
                    .bind(&owner)
                    .bind(token)
                    .bind(ttl_millis(req))
                    .execute(&mut *tx)
                    .await?;
                tx.commit().await?;
                Ok(PermitAttempt::Granted(token))
            })
            .await?;
        found.into_outcome(&self.err, req, limit)
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
}
