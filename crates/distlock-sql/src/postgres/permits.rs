//! PostgreSQL semaphores: per attempt, one call of a PL/pgSQL function the
//! backend creates with its tables (`<table>_grant`), in autocommit.
//!
//! The function runs two statements. The first bumps the semaphore's token
//! counter if the stored limit is the requested one, which locks the row, so
//! acquirers of a name take turns; the second, a single CTE, does the rest.
//! They cannot be one statement: under READ COMMITTED a statement reads
//! from the snapshot it started with, so a count of live permits taken in
//! the statement that waited for the row lock would miss the permit its
//! predecessor inserted, and grant one too many. A volatile function takes
//! a fresh snapshot for each statement it runs, so the second one's starts
//! after the lock is held; it counts a permit whose renewal commits
//! meanwhile as live (see `grant_body`). One call instead of a transaction
//! of four round trips (`BEGIN`, the two statements, `COMMIT`).
//! A refused attempt commits too (its expired permits' deletion), so its
//! bumped token goes unused: tokens rise, with gaps. When the bump finds no
//! row, a transaction creates the semaphore or finds another limit in
//! force, and calls the function in it.

use distlock_core::{HoldRecord, LockName, LockRequest, LockStatus, Result};

use super::Pg;
use crate::election::queue_row;
use crate::list::{holder, permit_record, NameRange, PermitRow};
use crate::postgres::queue::{CLIENT_CHANNEL, GARBAGE_AFTER};
use crate::postgres::LIMIT_CHANGED;
use crate::semaphore::{limit_from_db, remaining_micros, PermitAttempt, PermitTables};
use crate::ttl_micros;
use distlock_core::wait::Outcome;

pub(crate) struct Statements {
    create_semaphores: String,
    create_permits: String,
    grant_fn: Routine,
    /// The grant function of a backend with a wait queue (`fifo`).
    grant_queued_fn: Routine,
    grant: String,
    /// Frees a permit or leaves the wait queue, telling the next waiter
    /// (`fifo`).
    pass_on_fn: Routine,
    grant_queued: String,
    pass_on: String,
    lock_semaphore: String,
    extend: String,
    pub(super) extend_both: String,
    release: String,
    inspect: String,
    create_semaphore: String,
    select_limit: String,
    update_limit: String,
    list: String,
}

impl Statements {
    pub(crate) fn new(table: &str, tables: &PermitTables) -> Self {
        let PermitTables {
            semaphores,
            permits,
        } = tables;
        // The instant the grant is judged by: taken once the row lock is
        // held (the function's `now()` is the call's start, which can be a
        // lock wait before the grant), so a permit's TTL counts from the
        // grant, and one value for the whole statement, so every row is on
        // one side of it.
        //
        // Data-modifying CTEs all read one snapshot and run in no set order:
        // the owner's own earlier permit (a retry after a lost reply) is
        // neither deleted nor counted but overwritten by the insert, which
        // would otherwise meet it on the key. The snapshot can be stale for
        // one kind of row: a permit whose renewal is committing as its old
        // end passes shows the old end. The delete waits for that renewal
        // and, re-reading the row, leaves it; so the live permits are those
        // the snapshot shows live plus those it shows ended that the delete
        // did not delete.
        // `granted`: the grant's CTEs after `counted`; `more`: an answer
        // more, and the OUT parameter it goes into.
        let body = |granted: &str, more: (&str, &str)| {
            format!(
                "
DECLARE
  bumped bigint;
  judged_at timestamptz;
BEGIN
  UPDATE {semaphores} AS s SET token = s.token + 1
   WHERE s.name = p_name AND s.permits = p_limit
  RETURNING s.token INTO bumped;
  IF NOT FOUND THEN
    exists_with_limit := false;
    RETURN;
  END IF;
  exists_with_limit := true;
  judged_at := clock_timestamp();
  WITH expired AS (
      DELETE FROM {permits} AS p
       WHERE p.name = p_name AND p.expires_at <= judged_at AND p.owner <> p_owner
      RETURNING 1),
   seen AS (
      SELECT count(*) FILTER (WHERE p.expires_at > judged_at) AS live,
             count(*) FILTER (WHERE p.expires_at <= judged_at) AS ended,
             min(p.expires_at) FILTER (WHERE p.expires_at > judged_at) AS earliest
        FROM {permits} AS p WHERE p.name = p_name AND p.owner <> p_owner),
   counted AS (
      SELECT live + ended - (SELECT count(*) FROM expired) AS n FROM seen),
{granted}
  SELECT (SELECT g.token FROM granted AS g),
         (SELECT (extract(epoch FROM seen.earliest - judged_at) * 1e6)::bigint FROM seen){}
    INTO granted_token, earliest_left_us{};
END
",
                more.0, more.1
            )
        };
        // The insert of a granted permit, where `ok`.
        let granted = |ok: &str| {
            format!(
                "   granted AS (
      INSERT INTO {permits} AS p (name, owner, token, expires_at, holder)
      SELECT p_name, p_owner, bumped, judged_at + make_interval(secs => p_ttl_us::float8 / 1e6),
             p_holder
        FROM counted WHERE {ok}
      ON CONFLICT (name, owner) DO UPDATE
         SET token = EXCLUDED.token, expires_at = EXCLUDED.expires_at, holder = EXCLUDED.holder
      RETURNING p.token)"
            )
        };
        let grant_body = body(&granted("counted.n < p_limit"), ("", ""));
        // With a wait queue (`fifo`): only the live permits and the live
        // entries ahead of the caller (all of them, for a caller not
        // queued) leaving one free grant, or the caller's own live permit
        // (a retry). A grant leaves the queue; a refused waiting attempt
        // ($7, the entry's life in µs; 0 for a try) joins it or renews its
        // entry. It also answers whether the queue alone refused it (a
        // permit was free): nothing to try at a permit's end then.
        let queue = format!("{table}_queue");
        let grant_queued_body = body(
            &format!(
                "   mine AS (
      SELECT q.arrival FROM {queue} AS q
       WHERE q.name = p_row AND q.owner = p_owner AND q.ends_at > judged_at),
   ahead AS (
      SELECT count(*) AS n FROM {queue} AS q
       WHERE q.name = p_row AND q.owner <> p_owner AND q.ends_at > judged_at
         AND q.arrival < coalesce((SELECT m.arrival FROM mine AS m), 9223372036854775807)),
{},
   joined AS (
      INSERT INTO {queue} (name, owner, client, ends_at)
      SELECT p_row, p_owner, p_client, judged_at + make_interval(secs => p_life_us::float8 / 1e6)
       WHERE p_life_us > 0 AND NOT EXISTS (SELECT 1 FROM granted)
      ON CONFLICT (name, owner) DO UPDATE SET ends_at = EXCLUDED.ends_at),
   gone AS (
      DELETE FROM {queue} AS q WHERE q.name = p_row AND q.owner = p_owner
         AND EXISTS (SELECT 1 FROM granted)),
   garbage AS (
      DELETE FROM {queue} AS q WHERE q.ctid IN (
         SELECT g.ctid FROM {queue} AS g
          WHERE g.name = p_row AND g.ends_at < judged_at - {GARBAGE_AFTER}
            FOR UPDATE SKIP LOCKED))",
                granted(&format!(
                    "counted.n + (SELECT a.n FROM ahead AS a) < p_limit
          OR EXISTS (SELECT 1 FROM {permits} AS o
                      WHERE o.name = p_name AND o.owner = p_owner AND o.expires_at > judged_at)"
                ))
            ),
            (
                ",
         (SELECT c.n < p_limit FROM counted AS c) AND NOT EXISTS (SELECT 1 FROM granted)",
                ", queue_refused",
            ),
        );
        let grant_fn = format!("{table}_grant");
        let grant_queued_fn = format!("{table}_grant_queued");
        // With a wait queue: a release ($4) or a waiter's leaving, which
        // then tells the entry the free permits reach last (the entries
        // before it were told by the releases that freed theirs). The
        // semaphore's row lock makes releases, leavings and grants take
        // turns, and each statement after it reads a fresh snapshot, so each
        // counts the free permits with every earlier one's change in.
        let pass_on_body = format!(
            "
DECLARE
  free bigint;
BEGIN
  PERFORM 1 FROM {semaphores} AS s WHERE s.name = p_name FOR UPDATE;
  IF p_release THEN
    DELETE FROM {permits} AS p WHERE p.name = p_name AND p.owner = p_owner
    RETURNING p.expires_at > clock_timestamp() INTO held;
    IF held IS NOT TRUE THEN
      RETURN;
    END IF;
  ELSE
    DELETE FROM {queue} AS q WHERE q.name = p_row AND q.owner = p_owner;
    IF NOT FOUND THEN
      RETURN;
    END IF;
  END IF;
  SELECT s.permits - (SELECT count(*) FROM {permits} AS p
                       WHERE p.name = p_name AND p.expires_at > clock_timestamp())
    INTO free FROM {semaphores} AS s WHERE s.name = p_name;
  IF free > 0 THEN
    PERFORM pg_notify('{CLIENT_CHANNEL}' || e.client, p_row || ' ' || e.owner)
       FROM {queue} AS e WHERE e.name = p_row AND e.ends_at > clock_timestamp()
      ORDER BY e.arrival OFFSET free - 1 LIMIT 1;
  END IF;
END
"
        );
        let pass_on_fn = format!("{table}_pass_on");
        Self {
            create_semaphores: format!(
                "CREATE TABLE IF NOT EXISTS {semaphores} (
                    name TEXT PRIMARY KEY,
                    permits BIGINT NOT NULL,
                    token BIGINT NOT NULL)"
            ),
            create_permits: format!(
                "CREATE TABLE IF NOT EXISTS {permits} (
                    name TEXT COLLATE \"C\" NOT NULL,
                    owner TEXT NOT NULL,
                    token BIGINT NOT NULL,
                    expires_at TIMESTAMPTZ NOT NULL,
                    holder TEXT,
                    PRIMARY KEY (name, owner))"
            ),
            // The holder info is the last argument: a client without it
            // calls the function of four arguments, an overload of its own.
            grant_fn: Routine::new(
                &grant_fn,
                "text, text, bigint, bigint, text",
                "p_name text, p_owner text, p_ttl_us bigint, p_limit bigint, p_holder text,
                    OUT exists_with_limit boolean, OUT granted_token bigint,
                    OUT earliest_left_us bigint",
                grant_body,
            ),
            grant_queued_fn: Routine::new(
                &grant_queued_fn,
                "text, text, bigint, bigint, text, text, bigint, text",
                "p_name text, p_owner text, p_ttl_us bigint, p_limit bigint, p_holder text,
                    p_row text, p_life_us bigint, p_client text,
                    OUT exists_with_limit boolean, OUT granted_token bigint,
                    OUT earliest_left_us bigint, OUT queue_refused boolean",
                grant_queued_body,
            ),
            pass_on_fn: Routine::new(
                &pass_on_fn,
                "text, text, text, boolean",
                "p_name text, p_owner text, p_row text, p_release boolean, OUT held boolean",
                pass_on_body,
            ),
            grant: format!("SELECT * FROM {grant_fn}($1, $2, $3, $4, $5)"),
            grant_queued: format!(
                "SELECT * FROM {grant_queued_fn}($1, $2, $3, $4, $5, $6, $7, $8)"
            ),
            pass_on: format!("SELECT {pass_on_fn}($1, $2, $3, $4)"),
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
            list: format!(
                "SELECT p.name, p.token, (extract(epoch FROM p.expires_at - now()) * 1e6)::bigint,
                        p.holder, s.permits
                   FROM {permits} p LEFT JOIN {semaphores} s ON s.name = p.name
                  WHERE p.name COLLATE \"C\" >= $1 AND p.name COLLATE \"C\" < $2
                    AND p.expires_at > now()
                  ORDER BY p.name COLLATE \"C\", p.token
                  LIMIT $3"
            ),
        }
    }

    pub(crate) fn creates(&self) -> [&str; 2] {
        [&self.create_semaphores, &self.create_permits]
    }
}

/// A PL/pgSQL function the backend creates with its tables.
struct Routine {
    /// Its body, as `pg_proc` stores it.
    body: String,
    /// Reads the body stored now.
    source: String,
    create: String,
}

impl Routine {
    /// `name(args)` of `params` (with `OUT` ones) running `body`.
    fn new(name: &str, args: &str, params: &str, body: String) -> Self {
        Self {
            source: format!(
                "SELECT prosrc FROM pg_proc WHERE oid = to_regprocedure('{name}({args})')"
            ),
            create: format!(
                "CREATE OR REPLACE FUNCTION {name}(
                    {params})
                 LANGUAGE plpgsql VOLATILE AS $distlock${body}$distlock$"
            ),
            body,
        }
    }

    /// Creates the function, or replaces it if its body is not this
    /// version's; left alone if it is, so that roles other than its owner
    /// can share the tables.
    async fn ensure(&self, tx: &mut sqlx::PgConnection) -> Result<(), sqlx::Error> {
        let source: Option<String> = sqlx::query_scalar(&self.source)
            .fetch_optional(&mut *tx)
            .await?;
        if source.as_deref() != Some(self.body.as_str()) {
            sqlx::query(&self.create).execute(&mut *tx).await?;
        }
        Ok(())
    }
}

impl Pg {
    /// Creates the grant function (with a wait queue, the queued one
    /// too). Runs with the tables' creation.
    pub(crate) async fn create_grant_function(
        &self,
        tx: &mut sqlx::PgConnection,
    ) -> Result<(), sqlx::Error> {
        let s = &self.permits;
        s.grant_fn.ensure(tx).await?;
        if self.queue.is_some() {
            s.grant_queued_fn.ensure(tx).await?;
            s.pass_on_fn.ensure(tx).await?;
        }
        Ok(())
    }

    /// One attempt at a permit; `waits`: with a wait queue, a refusal
    /// joins it (or renews the entry).
    pub(crate) async fn permit_attempt(
        &self,
        req: &LockRequest,
        limit: u32,
        waits: bool,
    ) -> Result<Outcome> {
        match self
            .grant(&self.pool, req, limit, waits)
            .await
            .map_err(|e| self.err.map(e))?
        {
            Some(found) => found.into_outcome(&self.err, req, limit),
            None => self.permit_attempt_apart(req, limit, waits).await,
        }
    }

    /// An attempt on a semaphore that does not exist yet or has another
    /// limit: its row locked (or created), the limit checked, then the
    /// grant.
    async fn permit_attempt_apart(
        &self,
        req: &LockRequest,
        limit: u32,
        waits: bool,
    ) -> Result<Outcome> {
        let s = &self.permits;
        let map = |e| self.err.map(e);
        let mut tx = self.pool.begin().await.map_err(map)?;
        let stored: i64 = sqlx::query_scalar(&s.lock_semaphore)
            .bind(req.name.as_str())
            .bind(i64::from(limit))
            .fetch_one(&mut *tx)
            .await
            .map_err(map)?;
        let found = if stored == i64::from(limit) {
            self.grant(&mut *tx, req, limit, waits).await.map_err(map)?
        } else {
            None
        };
        let found = match found {
            Some(found) => {
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

    /// One call of the grant function; `None` if the semaphore does not
    /// exist with this limit. With a wait queue, a waiter comes back to
    /// renew its entry in time, and one the queue alone refused (a permit
    /// was free) has nothing to try at a permit's end.
    async fn grant<'c, E: sqlx::PgExecutor<'c>>(
        &self,
        on: E,
        req: &LockRequest,
        limit: u32,
        waits: bool,
    ) -> Result<Option<PermitAttempt>, sqlx::Error> {
        let s = &self.permits;
        fn query<'q, O: for<'r> sqlx::FromRow<'r, sqlx::postgres::PgRow>>(
            sql: &'q str,
            req: &'q LockRequest,
            limit: u32,
        ) -> sqlx::query::QueryAs<'q, sqlx::Postgres, O, sqlx::postgres::PgArguments> {
            sqlx::query_as(sql)
                .bind(req.name.as_str())
                .bind(req.owner.to_string())
                .bind(ttl_micros(req.ttl))
                .bind(i64::from(limit))
                .bind(holder(req))
        }
        let (exists, token, left): (bool, Option<i64>, Option<i64>) = match &self.queue {
            Some(q) => {
                let life = if waits { ttl_micros(q.lease()) } else { 0 };
                let (exists, token, left, refused): (_, _, Option<i64>, Option<bool>) =
                    query(&s.grant_queued, req, limit)
                        .bind(queue_row(req))
                        .bind(life)
                        .bind(q.client())
                        .fetch_one(on)
                        .await?;
                // A waiter renews its entry in time; a permit's end is
                // worth a look only if the permits alone refused it.
                let renew = ttl_micros(q.renew_every());
                let left = match (refused, left) {
                    (Some(true), _) | (_, None) => renew,
                    (_, Some(left)) => left.min(renew),
                };
                (exists, token, Some(left))
            }
            None => query(&s.grant, req, limit).fetch_one(on).await?,
        };
        Ok(exists.then(|| match token {
            Some(t) => PermitAttempt::Granted(t),
            None => PermitAttempt::Full(remaining_micros(left)),
        }))
    }

    /// The live permits whose names fall in `range`, at most `limit`.
    pub(crate) async fn list_permits(
        &self,
        range: &NameRange,
        limit: i64,
    ) -> Result<Vec<HoldRecord>> {
        let rows: Vec<PermitRow> = sqlx::query_as(&self.permits.list)
            .bind(&range.from)
            .bind(&range.to)
            .bind(limit)
            .fetch_all(&self.pool)
            .await
            .map_err(|e| self.err.map(e))?;
        rows.into_iter()
            .map(|r| permit_record(&self.err, r))
            .collect()
    }

    pub(crate) async fn permit_extend(&self, req: &LockRequest) -> Result<bool> {
        self.extend_row(&self.permits.extend, req).await
    }

    /// With a wait queue, a freed permit tells the queued waiter it is
    /// for; without, every listening client wakes one of its waiters.
    pub(crate) async fn permit_release(&self, req: &LockRequest) -> Result<bool> {
        if self.queue.is_some() {
            return self.pass_on(req, true).await;
        }
        let held: Option<(bool, Option<String>)> = sqlx::query_as(&self.permits.release)
            .bind(req.name.as_str())
            .bind(req.owner.to_string())
            .bind(&self.permit_channel)
            .fetch_optional(&self.pool)
            .await
            .map_err(|e| self.err.map(e))?;
        Ok(held.is_some_and(|(h, _)| h))
    }

    /// Removes a semaphore waiter's queue entry, telling the entry that
    /// then comes within reach of the free permits.
    pub(crate) async fn permit_leave(&self, req: &LockRequest) -> Result<()> {
        self.pass_on(req, false).await.map(drop)
    }

    /// Releases `req`'s permit (`release`) or its queue entry, telling the
    /// next waiter; whether the permit was live.
    async fn pass_on(&self, req: &LockRequest, release: bool) -> Result<bool> {
        let held: Option<bool> = sqlx::query_scalar(&self.permits.pass_on)
            .bind(req.name.as_str())
            .bind(req.owner.to_string())
            .bind(queue_row(req))
            .bind(release)
            .fetch_one(&self.pool)
            .await
            .map_err(|e| self.err.map(e))?;
        Ok(held == Some(true))
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
