//! PostgreSQL semaphores: per attempt, one transaction of two statements.
//!
//! The first bumps the semaphore's token counter if the stored limit is the
//! requested one, which locks the row, so acquirers of a name take turns;
//! the second, a single CTE, does the rest. They cannot be one statement:
//! under READ COMMITTED a statement reads from the snapshot it started
//! with, so a count of live permits taken in the statement that waited for
//! the row lock would miss the permit its predecessor inserted, and grant
//! one too many. The second statement's snapshot starts after the lock is
//! held, and it counts a permit whose renewal commits meanwhile as live
//! (see `grant`).
//! A refused attempt commits too (its expired permits' deletion), so its
//! bumped token goes unused: tokens rise, with gaps. When the bump finds no
//! row, a second transaction creates the semaphore or finds another limit
//! in force.

use distlock_core::{LockName, LockRequest, LockStatus, Result};

use super::Pg;
use crate::postgres::LIMIT_CHANGED;
use crate::semaphore::{limit_from_db, remaining_micros, PermitAttempt, PermitTables};
use crate::ttl_micros;
use distlock_core::wait::Outcome;

pub(crate) struct Statements {
    create_semaphores: String,
    create_permits: String,
    bump: String,
    grant: String,
    lock_semaphore: String,
    extend: String,
    pub(super) extend_both: String,
    release: String,
    inspect: String,
    create_semaphore: String,
    select_limit: String,
    update_limit: String,
}

impl Statements {
    pub(crate) fn new(table: &str, tables: &PermitTables) -> Self {
        let PermitTables {
            semaphores,
            permits,
        } = tables;
        // `now()` is the transaction's start, which can be a lock wait
        // before the grant; a permit's TTL counts from the statement that
        // grants it.
        let now = "statement_timestamp()";
        Self {
            create_semaphores: format!(
                "CREATE TABLE IF NOT EXISTS {semaphores} (
                    name TEXT PRIMARY KEY,
                    permits BIGINT NOT NULL,
                    token BIGINT NOT NULL)"
            ),
            create_permits: format!(
                "CREATE TABLE IF NOT EXISTS {permits} (
                    name TEXT NOT NULL,
                    owner TEXT NOT NULL,
                    token BIGINT NOT NULL,
                    expires_at TIMESTAMPTZ NOT NULL,
                    PRIMARY KEY (name, owner))"
            ),
            bump: format!(
                "UPDATE {semaphores} SET token = token + 1 WHERE name = $1 AND permits = $2
                 RETURNING token"
            ),
            // Data-modifying CTEs all read one snapshot and run in no set
            // order: the owner's own earlier permit (a retry after a lost
            // reply) is neither deleted nor counted but overwritten by the
            // insert, which would otherwise meet it on the key. The snapshot
            // can be stale for one kind of row: a permit whose renewal is
            // committing as its old end passes shows the old end. The
            // delete waits for that renewal and, re-reading the row, leaves
            // it; so the live permits are those the snapshot shows live plus
            // those it shows ended that the delete did not delete.
            // `statement_timestamp()` is one instant for the whole
            // statement, so every row is on one side of it.
            grant: format!(
                "WITH expired AS (
                    DELETE FROM {permits}
                     WHERE name = $1 AND expires_at <= {now} AND owner <> $2
                    RETURNING 1),
                 seen AS (
                    SELECT count(*) FILTER (WHERE expires_at > {now}) AS live,
                           count(*) FILTER (WHERE expires_at <= {now}) AS ended,
                           min(expires_at) FILTER (WHERE expires_at > {now}) AS earliest
                      FROM {permits} WHERE name = $1 AND owner <> $2),
                 counted AS (
                    SELECT live + ended - (SELECT count(*) FROM expired) AS n FROM seen),
                 granted AS (
                    INSERT INTO {permits} (name, owner, token, expires_at)
                    SELECT $1, $2, $4, {now} + make_interval(secs => $3::float8 / 1e6)
                      FROM counted WHERE counted.n < $5
                    ON CONFLICT (name, owner) DO UPDATE
                       SET token = EXCLUDED.token, expires_at = EXCLUDED.expires_at
                    RETURNING token)
                 SELECT (SELECT token FROM granted),
                        (SELECT (extract(epoch FROM earliest - {now}) * 1e6)::bigint FROM seen)"
            ),
            // The no-op update takes the row lock on an existing row; a new
            // row is locked by being inserted.
            lock_semaphore: format!(
                "INSERT INTO {semaphores} AS s (name, permits, token) VALUES ($1, $2, 0)
                 ON CONFLICT (name) DO UPDATE SET permits = s.permits
                 RETURNING permits"
            ),
            extend: format!(
                "UPDATE {permits} SET expires_at = now() + make_interval(secs => $3::float8 / 1e6)
                  WHERE name = $1 AND owner = $2 AND expires_at > now()"
            ),
            // A batch with permits in it: the locks' renewal and the
            // permits' in one statement, each over its own unnest() arrays,
            // answering with what each extended.
            extend_both: format!(
                "WITH locks AS (
                    UPDATE {table} AS l SET expires_at = now() + make_interval(secs => r.ttl / 1e6)
                      FROM unnest($1::text[], $2::text[], $3::float8[]) AS r(name, owner, ttl)
                     WHERE l.name = r.name AND l.owner = r.owner AND l.expires_at > now()
                    RETURNING l.name, l.owner),
                 permits AS (
                    UPDATE {permits} AS p SET expires_at = now() + make_interval(secs => r.ttl / 1e6)
                      FROM unnest($4::text[], $5::text[], $6::float8[]) AS r(name, owner, ttl)
                     WHERE p.name = r.name AND p.owner = r.owner AND p.expires_at > now()
                    RETURNING p.name, p.owner)
                 SELECT false, name, owner FROM locks
                 UNION ALL SELECT true, name, owner FROM permits"
            ),
            // Deletes an expired permit too (it is free already), answering
            // whether it was still live.
            release: format!(
                "WITH r AS (DELETE FROM {permits} WHERE name = $1 AND owner = $2
                            RETURNING expires_at > now() AS held)
                 SELECT held, pg_notify($3, $1)::text FROM r"
            ),
            inspect: format!(
                "SELECT s.permits,
                        (SELECT count(*) FROM {permits} p
                          WHERE p.name = s.name AND p.expires_at > now())
                   FROM {semaphores} s WHERE s.name = $1"
            ),
            // Waits for a concurrent creator of the row and then does
            // nothing, so that the row is then found by `select_limit`.
            create_semaphore: format!(
                "INSERT INTO {semaphores} (name, permits, token) VALUES ($1, $2, 0)
                 ON CONFLICT (name) DO NOTHING RETURNING permits"
            ),
            select_limit: format!("SELECT permits FROM {semaphores} WHERE name = $1 FOR UPDATE"),
            update_limit: format!(
                "WITH u AS (UPDATE {semaphores} SET permits = $2 WHERE name = $1)
                 SELECT pg_notify($3, '{LIMIT_CHANGED}' || $1)::text"
            ),
        }
    }

    pub(crate) fn creates(&self) -> [&str; 2] {
        [&self.create_semaphores, &self.create_permits]
    }
}

impl Pg {
    pub(crate) async fn permit_attempt(&self, req: &LockRequest, limit: u32) -> Result<Outcome> {
        let map = |e| self.err.map(e);
        let mut tx = self.pool.begin().await.map_err(map)?;
        let found = match self.bump(&mut tx, req, limit).await.map_err(map)? {
            Some(token) => self.grant(&mut tx, req, token, limit).await.map_err(map)?,
            None => {
                tx.rollback().await.map_err(map)?;
                return self.permit_attempt_apart(req, limit).await;
            }
        };
        tx.commit().await.map_err(map)?;
        found.into_outcome(&self.err, req, limit)
    }

    /// An attempt on a semaphore that does not exist yet or has another
    /// limit: its row locked (or created), the limit checked, then the bump
    /// and the grant.
    async fn permit_attempt_apart(&self, req: &LockRequest, limit: u32) -> Result<Outcome> {
        let s = &self.permits;
        let map = |e| self.err.map(e);
        let mut tx = self.pool.begin().await.map_err(map)?;
        let stored: i64 = sqlx::query_scalar(&s.lock_semaphore)
            .bind(req.name.as_str())
            .bind(i64::from(limit))
            .fetch_one(&mut *tx)
            .await
            .map_err(map)?;
        let bumped = if stored == i64::from(limit) {
            self.bump(&mut tx, req, limit).await.map_err(map)?
        } else {
            None
        };
        let found = match bumped {
            Some(token) => {
                let found = self.grant(&mut tx, req, token, limit).await.map_err(map)?;
                tx.commit().await.map_err(map)?;
                found
            }
            None => {
                tx.rollback().await.map_err(map)?;
                PermitAttempt::LimitIs(stored)
            }
        };
        found.into_outcome(&self.err, req, limit)
    }

    /// The counter's next value, if the semaphore exists with this limit.
    async fn bump(
        &self,
        tx: &mut sqlx::PgConnection,
        req: &LockRequest,
        limit: u32,
    ) -> Result<Option<i64>, sqlx::Error> {
        sqlx::query_scalar(&self.permits.bump)
            .bind(req.name.as_str())
            .bind(i64::from(limit))
            .fetch_optional(tx)
            .await
    }

    async fn grant(
        &self,
        tx: &mut sqlx::PgConnection,
        req: &LockRequest,
        token: i64,
        limit: u32,
    ) -> Result<PermitAttempt, sqlx::Error> {
        let (token, left): (Option<i64>, Option<i64>) = sqlx::query_as(&self.permits.grant)
            .bind(req.name.as_str())
            .bind(req.owner.to_string())
            .bind(ttl_micros(req.ttl))
            .bind(token)
            .bind(i64::from(limit))
            .fetch_one(tx)
            .await?;
        Ok(match token {
            Some(t) => PermitAttempt::Granted(t),
            None => PermitAttempt::Full(remaining_micros(left)),
        })
    }

    pub(crate) async fn permit_extend(&self, req: &LockRequest) -> Result<bool> {
        self.extend_row(&self.permits.extend, req).await
    }

    pub(crate) async fn permit_release(&self, req: &LockRequest) -> Result<bool> {
        let held: Option<(bool, Option<String>)> = sqlx::query_as(&self.permits.release)
            .bind(req.name.as_str())
            .bind(req.owner.to_string())
            .bind(&self.permit_channel)
            .fetch_optional(&self.pool)
            .await
            .map_err(|e| self.err.map(e))?;
        Ok(held.is_some_and(|(h, _)| h))
    }

    pub(crate) async fn inspect_permits(&self, name: &LockName) -> Result<LockStatus> {
        let row: Option<(i64, i64)> = sqlx::query_as(&self.permits.inspect)
            .bind(name.as_str())
            .fetch_optional(&self.pool)
            .await
            .map_err(|e| self.err.map(e))?;
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
        let map = |e| self.err.map(e);
        let mut tx = self.pool.begin().await.map_err(map)?;
        let created: Option<i64> = sqlx::query_scalar(&s.create_semaphore)
            .bind(name.as_str())
            .bind(i64::from(limit))
            .fetch_optional(&mut *tx)
            .await
            .map_err(map)?;
        let old = if created.is_some() {
            None
        } else {
            let old: i64 = sqlx::query_scalar(&s.select_limit)
                .bind(name.as_str())
                .fetch_one(&mut *tx)
                .await
                .map_err(map)?;
            // A higher limit may let a waiter in: the notification goes out
            // with the commit.
            sqlx::query(&s.update_limit)
                .bind(name.as_str())
                .bind(i64::from(limit))
                .bind(&self.permit_channel)
                .execute(&mut *tx)
                .await
                .map_err(map)?;
            Some(limit_from_db(&self.err, old)?)
        };
        tx.commit().await.map_err(map)?;
        Ok(old)
    }
}
