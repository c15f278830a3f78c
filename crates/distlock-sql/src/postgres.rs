//! PostgreSQL: one upsert per attempt, LISTEN/NOTIFY for waiters.

use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use distlock_core::wait::{Outcome, Signals};
use distlock_core::{FencingToken, Finding, HoldKind, HoldRecord, LockRequest, Result};
use sqlx::postgres::{PgListener, PgPool};

use crate::election::{checked_for_postgres, leader_from_db, row, value, ELECTION_SUFFIX};
use crate::list::{
    exclusive_owner, holder, lock_record, sql_limit, suffix_len, LockRow, NameRange,
};
use crate::rwlock::{RwTables, SHARED_OWNER};
use crate::semaphore::{Object, PermitTables};
use crate::{token_from_db, ttl_micros, AbortOnDrop, DbError};

pub(crate) mod observe;
mod permits;
pub(crate) mod queue;
mod shared;

pub(crate) struct Pg {
    pub(crate) pool: PgPool,
    pub(crate) channel: String,
    create: String,
    /// Every table and index the creation statements make: when all of them
    /// exist, none of those statements runs, so a role allowed only to read
    /// and write the tables can use tables an administrator made.
    relations: Vec<String>,
    /// Columns a table created without them gets: (table, column, type).
    added_columns: Vec<(String, &'static str, &'static str)>,
    take: String,
    /// `take` for an election's row: the grant also notifies its observers.
    take_leader: String,
    take_all: String,
    give_back: String,
    attempt: String,
    /// `attempt` for an election's row: a grant also notifies its observers.
    attempt_leader: String,
    extend: String,
    extend_many: String,
    release: String,
    /// An election's release: notifies whether or not a campaign waits,
    /// for its observers.
    release_leader: String,
    inspect: String,
    proclaim: String,
    leader: String,
    evict_leader: String,
    list: String,
    /// This client's lock waiters, per name: a release wakes them all.
    pub(crate) releases: Arc<Signals>,
    /// This client's election observers, per election row: every grant,
    /// proclamation, resignation and eviction wakes them all.
    pub(crate) leader_changes: Arc<Signals>,
    permits: permits::Statements,
    /// Read-write locks' statements; their releases are announced on the
    /// locks' channel.
    shared: shared::Statements,
    /// Where permit releases and limit changes are announced: apart from
    /// the locks', so that lock waiters and semaphore waiters of one name
    /// do not wake each other.
    permit_channel: String,
    /// This client's permit waiters, per name: a freed permit wakes one, a
    /// changed limit all of them.
    pub(crate) permit_releases: Arc<Signals>,
    /// First come, first served waiting for every kind (`fifo`).
    pub(crate) queue: Option<Box<queue::Queue>>,
    /// The LISTEN connections, while a task of this backend waits or an
    /// election of it is observed (see [`Listener`]).
    listeners: [Mutex<Weak<Listening>>; 2],
    /// Held while one is being started, so that waiters share it.
    starting: tokio::sync::Mutex<()>,
    /// Ends the LISTEN connections' lingers when the backend is dropped.
    pub(crate) lifetime: distlock_core::completion::Lifetime,
    err: DbError,
}

impl Pg {
    /// `fifo`: waiters queue, their entries lasting this long past each
    /// attempt.
    pub(crate) fn new(pool: PgPool, table: &str, err: DbError, fifo: Option<Duration>) -> Self {
        // The row is never deleted: its token column is the fencing counter,
        // and it must survive releases, expiries and restarts.
        // `awaited`: set by a waiting attempt the row refused, cleared by an
        // exclusive grant (`take`, `attempt`); a release notifies waiters
        // only while it is set, since every NOTIFY takes a lock all
        // notifying commits of the database take turns on.
        // `COLLATE "C"`: the key's index is in byte order whatever the
        // database's collation, so `list`'s prefix range is an index range
        // scan (equality, which every other statement uses, is the same in
        // every collation).
        let create = format!(
            "CREATE TABLE IF NOT EXISTS {table} (
                name TEXT COLLATE \"C\" PRIMARY KEY,
                owner TEXT,
                token BIGINT NOT NULL,
                expires_at TIMESTAMPTZ NOT NULL,
                awaited BOOLEAN NOT NULL DEFAULT false,
                value TEXT,
                holder TEXT)"
        );
        let permit_tables = PermitTables::for_lock_table(table);
        let rw_tables = RwTables::for_lock_table(table);
        let mut added_columns = vec![
            (
                table.to_owned(),
                "awaited",
                "BOOLEAN NOT NULL DEFAULT false",
            ),
            (table.to_owned(), "value", "TEXT"),
            (table.to_owned(), "holder", "TEXT"),
            (permit_tables.permits.clone(), "holder", "TEXT"),
            (rw_tables.shared.clone(), "token", "BIGINT"),
            (rw_tables.shared.clone(), "holder", "TEXT"),
        ];
        let mut relations = vec![
            table.to_owned(),
            permit_tables.semaphores.clone(),
            permit_tables.permits.clone(),
            rw_tables.shared.clone(),
            rw_tables.writers.clone(),
        ];
        if fifo.is_some() {
            relations.push(format!("{table}_queue"));
            relations.push(format!("{table}_queue_arrival"));
            // A queue table without the column gets it.
            added_columns.push((
                format!("{table}_queue"),
                "shared",
                "BOOLEAN NOT NULL DEFAULT false",
            ));
        }
        // One statement: take the row if it is new, free or expired (judged
        // by the database's clock only), bump the token, and in the same
        // round trip report how long the current holder has left.
        // try_acquire needs only the upsert; waiting also wants the holder's
        // remaining lease, so it uses `attempt`. Both write the row's value
        // with the grant: an election's leader's (`$4`), NULL for a lock;
        // and the request's holder info (`$5`). A release leaves the
        // holder info: every reader of it reads held rows only.
        // An election's grant also notifies (`$6`: the locks' channel)
        // with the row's name after [`LEADER_CHANGED`], evaluated only for
        // the row it grants; a lock's grant notifies nothing.
        let take = take_statement(table, "token");
        let take_leader = take_statement(
            table,
            &format!("token, pg_notify($6, '{LEADER_CHANGED}' || $1)::text"),
        );
        // `take` for many rows in one statement, in the order given (the
        // canonical one, so two such statements lock rows in one order), and
        // only if none of them is held as the statement starts. A holder
        // that takes one of them meanwhile makes it answer fewer rows; those
        // go back by `give_back`.
        let take_all = format!(
            "INSERT INTO {table} AS l (name, owner, token, expires_at, holder)
             SELECT r.name, r.owner, 1, now() + make_interval(secs => r.ttl / 1e6), r.holder
               FROM unnest($1::text[], $2::text[], $3::float8[], $4::text[]) WITH ORDINALITY
                    AS r(name, owner, ttl, holder, ord)
              WHERE NOT EXISTS (SELECT 1 FROM {table} h WHERE h.name = ANY($1)
                                   AND h.owner IS NOT NULL AND h.expires_at > now())
              ORDER BY r.ord
             ON CONFLICT (name) DO UPDATE
                SET owner = EXCLUDED.owner, token = l.token + 1, expires_at = EXCLUDED.expires_at,
                    awaited = false, value = NULL, holder = EXCLUDED.holder
              WHERE l.owner IS NULL OR l.expires_at <= now()
             RETURNING name, token"
        );
        let give_back = format!(
            "UPDATE {table} AS l SET owner = NULL
               FROM unnest($1::text[], $2::text[]) AS r(name, owner)
              WHERE l.name = r.name AND l.owner = r.owner
             RETURNING pg_notify($3, l.name)::text"
        );
        // `take`, but a refusal marks the row as awaited, in the same
        // upsert: it judges the row as the last grant or release committed
        // it, under its row lock, so a release that comes after sees the
        // mark. Only a row not marked yet is written. The row's `awaited`
        // after the upsert tells a grant (cleared) from a refusal (set).
        let free = "l.owner IS NULL OR l.expires_at <= now()";
        let attempt_with = |notify: &str| {
            let upsert = attempt_upsert(
                table,
                free,
                &format!("NOT ({free})"),
                &format!("CASE WHEN NOT l.awaited THEN token END AS token{notify}"),
            );
            format!(
                "WITH granted AS ({upsert})
             SELECT {}",
                attempt_answer(table)
            )
        };
        let attempt = attempt_with("");
        // A data-modifying WITH runs to completion whatever the query reads
        // of it, and `pg_notify` is volatile: the notification is sent for
        // a grant (the row's `awaited` cleared) and only then.
        let attempt_leader = attempt_with(&format!(
            ",
                          CASE WHEN NOT l.awaited
                               THEN pg_notify($6, '{LEADER_CHANGED}' || $1)::text END"
        ));
        let extend = format!(
            "UPDATE {table} SET expires_at = now() + make_interval(secs => $3::float8 / 1e6)
              WHERE name = $1 AND owner = $2 AND expires_at > now()"
        );
        // The same update for a batch of (name, owner, TTL) rows, answering
        // with the rows it extended.
        let extend_many = format!(
            "UPDATE {table} AS l SET expires_at = now() + make_interval(secs => r.ttl / 1e6)
               FROM unnest($1::text[], $2::text[], $3::float8[]) AS r(name, owner, ttl)
              WHERE l.name = r.name AND l.owner = r.owner AND l.expires_at > now()
             RETURNING l.name, l.owner"
        );
        let release = release_statement(table);
        let release_leader = format!(
            "WITH r AS (UPDATE {table} SET owner = NULL WHERE name = $1 AND owner = $2
                        RETURNING expires_at > now() AS held)
             SELECT held, pg_notify($3, $1)::text FROM r"
        );
        // The holder info is an exclusive holder's only: not that of
        // shared holds keeping the row, nor an evicted holder's.
        let inspect = format!(
            "SELECT token, (extract(epoch FROM expires_at - now()) * 1e6)::bigint,
                    CASE WHEN {} THEN holder END
               FROM {table} WHERE name = $1 AND owner IS NOT NULL AND expires_at > now()",
            exclusive_owner("owner")
        );
        // An election's: a new value only while the owner's lease is live,
        // notifying its observers in the same statement; its leader, only
        // while one's is; eviction frees the row at once and wakes its
        // waiters and observers.
        let proclaim = format!(
            "UPDATE {table} SET value = $3 WHERE name = $1 AND owner = $2 AND expires_at > now()
             RETURNING pg_notify($4, '{LEADER_CHANGED}' || $1)::text"
        );
        let leader = format!(
            "SELECT value, token, (extract(epoch FROM expires_at - now()) * 1e6)::bigint, holder
               FROM {table} WHERE name = $1 AND owner IS NOT NULL AND expires_at > now()"
        );
        // Exclusive holds and leaders (see `crate::list`): the election rows
        // ordered by the election's name, after its namesake lock. Names are
        // compared byte for byte (`COLLATE "C"`), whatever the database's
        // collation.
        let n = suffix_len();
        let is_election = format!("right(name, {n}) = '{ELECTION_SUFFIX}'");
        let list = format!(
            "SELECT name, token, (extract(epoch FROM expires_at - now()) * 1e6)::bigint,
                    holder, value
               FROM {table}
              WHERE name COLLATE \"C\" >= $1 AND name COLLATE \"C\" < $2
                AND owner IS NOT NULL AND {} AND expires_at > now()
              ORDER BY (CASE WHEN {is_election} THEN left(name, -{n}) ELSE name END) COLLATE \"C\",
                       {is_election}
              LIMIT $3",
            exclusive_owner("owner")
        );
        let evict_leader = format!(
            "UPDATE {table} SET owner = NULL
              WHERE name = $1 AND owner IS NOT NULL AND expires_at > now()
             RETURNING pg_notify($2, name)::text"
        );
        Self {
            pool,
            channel: locks_channel(table),
            permits: permits::Statements::new(table, &permit_tables),
            shared: shared::Statements::new(table, &rw_tables, fifo.is_some()),
            // Named after the table whose rows it announces.
            permit_channel: permit_tables.permits.clone(),
            permit_releases: Arc::default(),
            create,
            relations,
            added_columns,
            take,
            take_leader,
            take_all,
            give_back,
            attempt,
            attempt_leader,
            extend,
            extend_many,
            release,
            release_leader,
            inspect,
            proclaim,
            leader,
            evict_leader,
            list,
            releases: Arc::default(),
            leader_changes: Arc::default(),
            queue: fifo.map(|lease| Box::new(queue::Queue::new(table, lease))),
            listeners: Default::default(),
            starting: tokio::sync::Mutex::new(()),
            lifetime: Default::default(),
            err,
        }
    }

    pub(crate) async fn create_table(&self) -> Result<()> {
        // CREATE TABLE IF NOT EXISTS races with itself in PostgreSQL (two
        // sessions can both pass the existence check and one then fails on
        // the catalog's unique index); a transaction-scoped advisory lock
        // serialises the creators.
        let mut tx = self.pool.begin().await.map_err(|e| self.err.map(e))?;
        sqlx::query("SELECT pg_advisory_xact_lock(hashtext($1))")
            .bind(&self.channel)
            .execute(&mut *tx)
            .await
            .map_err(|e| self.err.map(e))?;
        let all_there: Option<bool> = sqlx::query_scalar(
            "SELECT bool_and(to_regclass(n) IS NOT NULL) FROM unnest($1::text[]) AS n",
        )
        .bind(&self.relations)
        .fetch_one(&mut *tx)
        .await
        .map_err(|e| self.err.map(e))?;
        // `CREATE TABLE IF NOT EXISTS` needs the right to create in the
        // schema even when the table exists.
        if all_there != Some(true) {
            for create in [self.create.as_str()]
                .into_iter()
                .chain(self.permits.creates())
                .chain(self.shared.creates())
                .chain(self.queue.iter().flat_map(|q| q.creates()))
            {
                sqlx::query(create)
                    .execute(&mut *tx)
                    .await
                    .map_err(|e| self.err.map(e))?;
            }
        }
        for (table, column, decl) in &self.added_columns {
            add_column(&mut tx, table, column, decl)
                .await
                .map_err(|e| self.err.map(e))?;
        }
        self.create_grant_function(&mut tx)
            .await
            .map_err(|e| self.err.map(e))?;
        tx.commit().await.map_err(|e| self.err.map(e))
    }

    /// One attempt of a waiting exclusive request: the outcome, and whether
    /// shared holds keep the lock.
    /// An election's grant also notifies its observers.
    /// `first`: the first attempt of a wait (with a queue, the cheap
    /// statement that grants only while nobody waits).
    pub(crate) async fn attempt(&self, req: &LockRequest, first: bool) -> Result<(Outcome, bool)> {
        checked_for_postgres(value(req))?;
        if let Some(q) = self.queue.as_ref() {
            let (token, left, readers, behind) = q
                .attempt(&self.pool, &self.err, req, true, first, &self.channel)
                .await?;
            let outcome = match token {
                Some(t) => Outcome::Granted(token_from_db(&self.err, t)?),
                // Free, but awaited: the queue decides, at once.
                None if first && left.is_none_or(|us| us <= 0) => Outcome::RetryIn(Duration::ZERO),
                // Back before the entry lapses; a waiter behind others has
                // nothing to try when the holder's lease ends.
                None => Outcome::Held(Some(match left {
                    Some(us) if !behind => {
                        Duration::from_micros(us.max(0) as u64).min(q.renew_every())
                    }
                    _ => q.renew_every(),
                })),
            };
            return Ok((outcome, readers == Some(true)));
        }
        let leader = req.kind == HoldKind::Leader;
        let sql = if leader {
            &self.attempt_leader
        } else {
            &self.attempt
        };
        let query = sqlx::query_as(sql)
            .bind(row(req))
            .bind(req.owner.to_string())
            .bind(ttl_micros(req.ttl))
            .bind(value(req))
            .bind(holder(req));
        let query = if leader {
            query.bind(&self.channel)
        } else {
            query
        };
        let (token, left, readers): (Option<i64>, Option<i64>, Option<bool>) = query
            .fetch_one(&self.pool)
            .await
            .map_err(|e| self.err.map(e))?;
        let outcome = match token {
            Some(t) => Outcome::Granted(token_from_db(&self.err, t)?),
            None => Outcome::Held(left.map(|us| Duration::from_micros(us.max(0) as u64))),
        };
        Ok((outcome, readers == Some(true)))
    }

    /// `synchronous_commit` and `fsync`: a grant is durable only with both.
    pub(crate) async fn deployment_findings(&self) -> Vec<Finding> {
        let mut out = Vec::new();
        for (setting, weakens) in [
            ("synchronous_commit", "a crash can roll back committed grants and the token counters with them (a second holder, repeated tokens); set synchronous_commit = on"),
            ("fsync", "a crash can lose committed grants and token counters, or corrupt the database; set fsync = on"),
        ] {
            let value: std::result::Result<String, sqlx::Error> =
                sqlx::query_scalar(&format!("SHOW {setting}")).fetch_one(&self.pool).await;
            out.push(match value {
                Ok(v) if v == "off" => Finding::warning(setting, v, weakens),
                Ok(v) => Finding::fine(setting, v),
                Err(e) => Finding::unknown(setting, format!("SHOW {setting} refused: {e}")),
            });
        }
        out
    }

    /// Every lock of `reqs` in one statement, or none.
    pub(crate) async fn try_acquire_all(
        &self,
        reqs: &[LockRequest],
    ) -> Result<Option<Vec<FencingToken>>> {
        let rows = row_names(reqs);
        let (names, owners, ttls) = columns(&rows, reqs);
        let holders: Vec<Option<&str>> = reqs.iter().map(holder).collect();
        let rows: Vec<(String, i64)> = sqlx::query_as(&self.take_all)
            .bind(&names)
            .bind(&owners)
            .bind(&ttls)
            .bind(&holders)
            .fetch_all(&self.pool)
            .await
            .map_err(|e| self.err.map(e))?;
        if rows.len() == reqs.len() {
            let mut tokens = Vec::with_capacity(reqs.len());
            for name in &names {
                let t = rows.iter().find(|(n, _)| n == name).map(|(_, t)| *t);
                tokens.push(token_from_db(&self.err, t.unwrap_or(0))?);
            }
            return Ok(Some(tokens));
        }
        if !rows.is_empty() {
            sqlx::query(&self.give_back)
                .bind(&names)
                .bind(&owners)
                .bind(&self.channel)
                .fetch_all(&self.pool)
                .await
                .map_err(|e| self.err.map(e))?;
        }
        Ok(None)
    }

    /// An election's grant also notifies its observers.
    pub(crate) async fn try_acquire(&self, req: &LockRequest) -> Result<Option<FencingToken>> {
        checked_for_postgres(value(req))?;
        if let Some(q) = self.queue.as_ref() {
            let (mut token, left, ..) = q
                .attempt(&self.pool, &self.err, req, false, true, &self.channel)
                .await?;
            if token.is_none() && left.is_none_or(|us| us <= 0) {
                // Free, but awaited: granted only if nobody live is queued.
                token = q
                    .attempt(&self.pool, &self.err, req, false, false, &self.channel)
                    .await?
                    .0;
            }
            return token.map(|t| token_from_db(&self.err, t)).transpose();
        }
        if req.kind == HoldKind::Leader {
            let granted: Option<(i64, Option<String>)> = sqlx::query_as(&self.take_leader)
                .bind(row(req))
                .bind(req.owner.to_string())
                .bind(ttl_micros(req.ttl))
                .bind(value(req))
                .bind(holder(req))
                .bind(&self.channel)
                .fetch_optional(&self.pool)
                .await
                .map_err(|e| self.err.map(e))?;
            return granted
                .map(|(t, _)| token_from_db(&self.err, t))
                .transpose();
        }
        let token: Option<i64> = sqlx::query_scalar(&self.take)
            .bind(row(req))
            .bind(req.owner.to_string())
            .bind(ttl_micros(req.ttl))
            .bind(value(req))
            .bind(holder(req))
            .fetch_optional(&self.pool)
            .await
            .map_err(|e| self.err.map(e))?;
        token.map(|t| token_from_db(&self.err, t)).transpose()
    }

    /// Moves the end of `req`'s row, a lock's or a permit's by `sql`, to
    /// its TTL from now; whether it was still held.
    async fn extend_row(&self, sql: &str, req: &LockRequest) -> Result<bool> {
        let r = sqlx::query(sql)
            .bind(row(req))
            .bind(req.owner.to_string())
            .bind(ttl_micros(req.ttl))
            .execute(&self.pool)
            .await
            .map_err(|e| self.err.map(e))?;
        Ok(r.rows_affected() == 1)
    }

    pub(crate) async fn extend(&self, req: &LockRequest) -> Result<bool> {
        match Object::of(req, &self.err)? {
            Object::Lock | Object::Leader => self.extend_row(&self.extend, req).await,
            Object::Shared => self.shared_extend(req).await,
            Object::Semaphore { .. } => self.permit_extend(req).await,
        }
    }

    pub(crate) async fn extend_many(&self, reqs: &[LockRequest]) -> Result<Vec<bool>> {
        let mut is_permit = Vec::with_capacity(reqs.len());
        for r in reqs {
            is_permit.push(matches!(
                Object::of(r, &self.err)?,
                Object::Semaphore { .. }
            ));
        }
        if is_permit.contains(&true) {
            return self.extend_locks_and_permits(reqs, &is_permit).await;
        }
        let rows = row_names(reqs);
        let (names, owners, ttls) = columns(&rows, reqs);
        let extended: Vec<(String, String)> = sqlx::query_as(&self.extend_many)
            .bind(&names)
            .bind(&owners)
            .bind(&ttls)
            .fetch_all(&self.pool)
            .await
            .map_err(|e| self.err.map(e))?;
        let extended: std::collections::HashSet<(String, String)> = extended.into_iter().collect();
        Ok(names
            .iter()
            .zip(owners)
            .map(|(name, owner)| extended.contains(&((*name).to_owned(), owner)))
            .collect())
    }

    /// A batch with permits in it, in one statement. Each request is
    /// answered from the rows its own table reports extended.
    async fn extend_locks_and_permits(
        &self,
        reqs: &[LockRequest],
        is_permit: &[bool],
    ) -> Result<Vec<bool>> {
        let owners: Vec<String> = reqs.iter().map(|r| r.owner.to_string()).collect();
        let rows = row_names(reqs);
        // Columns of (name, owner, TTL): [0] for locks, [1] for permits.
        let mut columns: [(Vec<&str>, Vec<&str>, Vec<f64>); 2] = Default::default();
        for (((r, row), owner), p) in reqs.iter().zip(&rows).zip(&owners).zip(is_permit) {
            let (names, owners, ttls) = &mut columns[usize::from(*p)];
            names.push(row);
            owners.push(owner);
            ttls.push(ttl_micros(r.ttl) as f64);
        }
        let [(lock_names, lock_owners, lock_ttls), (permit_names, permit_owners, permit_ttls)] =
            columns;
        let extended: Vec<(bool, String, String)> = sqlx::query_as(&self.permits.extend_both)
            .bind(&lock_names)
            .bind(&lock_owners)
            .bind(&lock_ttls)
            .bind(&permit_names)
            .bind(&permit_owners)
            .bind(&permit_ttls)
            .fetch_all(&self.pool)
            .await
            .map_err(|e| self.err.map(e))?;
        let extended: std::collections::HashSet<(bool, String, String)> =
            extended.into_iter().collect();
        Ok(rows
            .iter()
            .zip(owners)
            .zip(is_permit)
            .map(|((row, owner), p)| extended.contains(&(*p, row.to_string(), owner)))
            .collect())
    }

    /// An election's release notifies its observers, and its waiting
    /// campaigners; a lock's, its waiters only if one marked the row.
    pub(crate) async fn release(&self, req: &LockRequest) -> Result<bool> {
        if let Some(q) = self.queue.as_ref() {
            return q.release(&self.pool, &self.err, req, &self.channel).await;
        }
        let sql = if req.kind == HoldKind::Leader {
            &self.release_leader
        } else {
            &self.release
        };
        let held: Option<(bool, Option<String>)> = sqlx::query_as(sql)
            .bind(row(req))
            .bind(req.owner.to_string())
            .bind(&self.channel)
            .fetch_optional(&self.pool)
            .await
            .map_err(|e| self.err.map(e))?;
        Ok(held.is_some_and(|(h, _)| h))
    }

    /// Removes `req`'s queue entry, if it queued (a wait that ended
    /// without a grant).
    pub(crate) async fn leave(&self, req: &LockRequest) -> Result<()> {
        match &self.queue {
            Some(_) if matches!(req.kind, HoldKind::Permits { .. }) => self.permit_leave(req).await,
            Some(q) => q.leave(&self.pool, &self.err, req).await,
            None => Ok(()),
        }
    }

    pub(crate) async fn inspect(&self, name: &str) -> Result<Option<(i64, i64, Option<String>)>> {
        sqlx::query_as(&self.inspect)
            .bind(name)
            .fetch_optional(&self.pool)
            .await
            .map_err(|e| self.err.map(e))
    }

    /// The live holds of every kind whose names fall in `range`: at most
    /// `limit` of each table, one SELECT each.
    pub(crate) async fn list(&self, range: &NameRange, limit: usize) -> Result<Vec<HoldRecord>> {
        let limit = sql_limit(limit);
        let locks = async {
            let rows: Vec<LockRow> = sqlx::query_as(&self.list)
                .bind(&range.from)
                .bind(&range.to)
                .bind(limit)
                .fetch_all(&self.pool)
                .await
                .map_err(|e| self.err.map(e))?;
            rows.into_iter()
                .map(|r| lock_record(&self.err, r))
                .collect::<Result<Vec<_>>>()
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

    /// Replaces the value of `req`'s election row while its lease is
    /// live, notifying its observers.
    pub(crate) async fn proclaim(&self, req: &LockRequest, value: &str) -> Result<bool> {
        checked_for_postgres(Some(value))?;
        let changed: Option<Option<String>> = sqlx::query_scalar(&self.proclaim)
            .bind(row(req))
            .bind(req.owner.to_string())
            .bind(value)
            .bind(&self.channel)
            .fetch_optional(&self.pool)
            .await
            .map_err(|e| self.err.map(e))?;
        Ok(changed.is_some())
    }

    /// The live leader of the election row `row`.
    pub(crate) async fn leader(&self, row: &str) -> Result<Option<distlock_core::Leader>> {
        let found: Option<(Option<String>, i64, i64, Option<String>)> =
            sqlx::query_as(&self.leader)
                .bind(row)
                .fetch_optional(&self.pool)
                .await
                .map_err(|e| self.err.map(e))?;
        found.map(|r| leader_from_db(&self.err, r)).transpose()
    }

    /// Frees the election row `row` at once, notifying its waiters and
    /// observers; whether someone led.
    pub(crate) async fn evict_leader(&self, row: &str) -> Result<bool> {
        if let Some(q) = &self.queue {
            return q
                .evict_leader(&self.pool, &self.err, row, &self.channel)
                .await;
        }
        let freed: Vec<Option<String>> = sqlx::query_scalar(&self.evict_leader)
            .bind(row)
            .bind(&self.channel)
            .fetch_all(&self.pool)
            .await
            .map_err(|e| self.err.map(e))?;
        Ok(!freed.is_empty())
    }

    /// Overwrites the lock row's owner and deletes the shared holds.
    pub(crate) async fn evict(&self, name: &str) -> Result<bool> {
        let removed: i64 = sqlx::query_scalar(self.shared.evict())
            .bind(name)
            .fetch_one(&self.pool)
            .await
            .map_err(|e| self.err.map(e))?;
        Ok(removed > 0)
    }

    /// The LISTEN connection that `who` needs, started by the first of
    /// them and shared by the others. Each notification carries the
    /// released lock's or semaphore's name (a changed limit:
    /// [`LIMIT_CHANGED`] before it), an election's row name (released or
    /// evicted: its waiters and observers wake), [`LEADER_CHANGED`] and an
    /// election's row name (granted or proclaimed: only its observers
    /// wake), or, on this client's own channel (`fifo`), a queued waiter's
    /// row and owner. Without `fifo` waiters and observers share one
    /// connection on the locks' channel and the permits'. With `fifo`
    /// waiters listen on this client's own channel alone: nothing on the
    /// others wakes a queued waiter, and each notification delivered costs
    /// the client a wake-up (on a busy machine enough of them, an
    /// election's observers' two per turn, reorder the waiters' next
    /// requests); observers then have a connection of their own on the
    /// locks' channel. A connection lives while someone holds the returned
    /// handle: when the last waiter stops waiting and the last observer is
    /// dropped it is closed (`UNLISTEN *`, and the connection goes back to
    /// the pool), so a release's NOTIFY signals only the database sessions
    /// of clients that wait or observe (each one it signals costs the
    /// releaser's commit time; docs/benchmarks.md).
    pub(crate) async fn listen(&self, who: Listener) -> Result<Arc<Listening>> {
        if let Some(l) = self.listening(who) {
            return Ok(l);
        }
        let _starting = self.starting.lock().await;
        if let Some(l) = self.listening(who) {
            return Ok(l);
        }
        let mut l = PgListener::connect_with(&self.pool)
            .await
            .map_err(|e| self.err.map(e))?;
        let channels = match (&self.queue, who) {
            (Some(q), Listener::Waiters) => vec![q.channel.as_str()],
            (Some(_), Listener::Observers) => vec![self.channel.as_str()],
            (None, _) => vec![self.channel.as_str(), self.permit_channel.as_str()],
        };
        l.listen_all(channels).await.map_err(|e| self.err.map(e))?;
        let queue_channel = self.queue.as_ref().map(|q| q.channel.clone());
        let (locks, permits) = (self.releases.clone(), self.permit_releases.clone());
        let leaders = self.leader_changes.clone();
        let permit_channel = self.permit_channel.clone();
        let task = tokio::spawn(async move {
            loop {
                let got = match l.try_recv().await {
                    Ok(Some(n)) => Ok(n),
                    // The connection was lost; PgListener reconnects (and
                    // listens again) on the next call. What was notified
                    // meanwhile, every waiter and observer checks again.
                    Ok(None) => {
                        tracing::debug!("LISTEN connection lost; reconnecting");
                        locks.wake_everyone();
                        permits.wake_everyone();
                        leaders.wake_everyone();
                        continue;
                    }
                    Err(e) => Err(e),
                };
                match got {
                    // Addressed to one queued waiter: its row and owner.
                    Ok(n) if Some(n.channel()) == queue_channel.as_deref() => {
                        if let Some(s) = locks.find(n.payload()) {
                            s.wake_all();
                        }
                    }
                    Ok(n) if n.channel() == permit_channel => {
                        match n.payload().strip_prefix(LIMIT_CHANGED) {
                            Some(name) => permits.find(name).map(|s| s.wake_all()),
                            None => permits.find(n.payload()).map(|s| s.wake_one()),
                        };
                    }
                    Ok(n) => match n.payload().strip_prefix(LEADER_CHANGED) {
                        Some(row) => {
                            if let Some(s) = leaders.find(row) {
                                s.wake_all();
                            }
                        }
                        None => {
                            if let Some(s) = locks.find(n.payload()) {
                                s.wake_all();
                            }
                            if n.payload().ends_with(ELECTION_SUFFIX) {
                                if let Some(s) = leaders.find(n.payload()) {
                                    s.wake_all();
                                }
                            }
                        }
                    },
                    Err(e) => {
                        // PgListener reconnects on the next recv; what it
                        // missed meanwhile, every waiter and observer checks
                        // again.
                        tracing::debug!(error = %e, "LISTEN connection failed; reconnecting");
                        locks.wake_everyone();
                        permits.wake_everyone();
                        leaders.wake_everyone();
                        tokio::time::sleep(Duration::from_millis(200)).await;
                    }
                }
            }
        });
        let l = Arc::new(Listening(AbortOnDrop(task)));
        *self.slot(who).lock().unwrap_or_else(|e| e.into_inner()) = Arc::downgrade(&l);
        Ok(l)
    }

    /// The LISTEN connection `who` needs, if one runs (or lingers) now.
    pub(crate) fn listening(&self, who: Listener) -> Option<Arc<Listening>> {
        self.slot(who)
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .upgrade()
    }

    /// Where `who`'s connection is kept: one for both without `fifo`.
    fn slot(&self, who: Listener) -> &Mutex<Weak<Listening>> {
        match (&self.queue, who) {
            (Some(_), Listener::Observers) => &self.listeners[1],
            _ => &self.listeners[0],
        }
    }
}

/// Who a LISTEN connection is for (see [`Pg::listen`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Listener {
    /// Tasks waiting for a lock, a permit, a shared hold or leadership.
    Waiters,
    /// Election observers.
    Observers,
}

/// A running LISTEN connection; dropping the last handle stops it (the
/// listener's own drop then sends `UNLISTEN *` and returns the connection).
pub(crate) struct Listening(#[allow(dead_code)] AbortOnDrop);

/// Marks a NOTIFY payload on the permits' channel as a changed limit of the
/// semaphore named after it (a character no name contains).
pub(crate) const LIMIT_CHANGED: &str = "*";

/// Marks a NOTIFY payload on the locks' channel as a grant or a
/// proclamation of the election row named after it (a character no name
/// contains): its observers wake, its waiting campaigners do not (a grant
/// or a new value gives them nothing to try).
pub(crate) const LEADER_CHANGED: &str = "=";

/// A lock's grant without waiting (`try_acquire`): `$1` name, `$2` owner,
/// `$3` TTL in µs, `$4` an election's value (NULL for a lock), `$5` holder
/// info; answers `returning` for a grant, no row for a refusal.
pub(crate) fn take_statement(table: &str, returning: &str) -> String {
    format!(
        "INSERT INTO {table} AS l (name, owner, token, expires_at, value, holder)
             VALUES ($1, $2, 1, now() + make_interval(secs => $3::float8 / 1e6), $4, $5)
             ON CONFLICT (name) DO UPDATE
                SET owner = EXCLUDED.owner, token = l.token + 1, expires_at = EXCLUDED.expires_at,
                    awaited = false, value = EXCLUDED.value, holder = EXCLUDED.holder
              WHERE l.owner IS NULL OR l.expires_at <= now()
             RETURNING {returning}"
    )
}

/// A lock's release: `$1` name, `$2` owner, `$3` the locks' channel
/// ([`locks_channel`]); answers whether the lock was held (and the
/// notification, sent only while a waiter marked the row), no row if `$2`
/// did not own it.
pub(crate) fn release_statement(table: &str) -> String {
    format!(
        "WITH r AS (UPDATE {table} SET owner = NULL WHERE name = $1 AND owner = $2
                        RETURNING expires_at > now() AS held, awaited)
             SELECT held, CASE WHEN awaited THEN pg_notify($3, $1)::text END FROM r"
    )
}

/// Where the releases of `table`'s locks are announced.
pub(crate) fn locks_channel(table: &str) -> String {
    format!("distlock_{table}")
}

/// The lock table's upsert of one attempt (the `granted` part of the
/// attempt statements; `$1` name, `$2` owner, `$3` TTL in µs, `$4` value,
/// `$5` holder info): where `ok`, the request takes the row (owner, value,
/// holder info, the next token, its expiry); elsewhere the row keeps them.
/// `awaited` is set as `awaited` says, and the row is written only where
/// `ok` or while it is not marked yet. `returning`: what it answers.
pub(crate) fn attempt_upsert(table: &str, ok: &str, awaited: &str, returning: &str) -> String {
    format!(
        "INSERT INTO {table} AS l (name, owner, token, expires_at, value, holder)
         VALUES ($1, $2, 1, now() + make_interval(secs => $3::float8 / 1e6), $4, $5)
         ON CONFLICT (name) DO UPDATE
            SET owner = CASE WHEN {ok} THEN EXCLUDED.owner ELSE l.owner END,
                value = CASE WHEN {ok} THEN EXCLUDED.value ELSE l.value END,
                holder = CASE WHEN {ok} THEN EXCLUDED.holder ELSE l.holder END,
                token = CASE WHEN {ok} THEN l.token + 1 ELSE l.token END,
                expires_at = CASE WHEN {ok} THEN EXCLUDED.expires_at ELSE l.expires_at END,
                awaited = {awaited}
          WHERE {ok} OR NOT l.awaited
         RETURNING {returning}"
    )
}

/// What an attempt statement answers after its `granted` upsert: the token
/// (NULL when refused), how long the holder's lease still runs (µs), and
/// whether shared holds keep the row.
pub(crate) fn attempt_answer(table: &str) -> String {
    format!(
        "(SELECT token FROM granted),
         (SELECT (extract(epoch FROM expires_at - now()) * 1e6)::bigint
            FROM {table} WHERE name = $1 AND owner IS NOT NULL),
         (SELECT owner = '{SHARED_OWNER}'
            FROM {table} WHERE name = $1 AND owner IS NOT NULL)"
    )
}

/// Adds `column` to `table` if the table was created without it. Table and
/// column names are validated identifiers.
/// The ALTER runs only when the column is missing: it takes the table's
/// exclusive lock even when there is nothing to add, and one such lock per
/// table, taken at every start while other clients' statements hold the
/// tables in another order, would deadlock with them.
async fn add_column(
    tx: &mut sqlx::PgConnection,
    table: &str,
    column: &str,
    decl: &str,
) -> std::result::Result<(), sqlx::Error> {
    let has: bool = sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM pg_attribute
                         WHERE attrelid = to_regclass($1) AND attname = $2 AND NOT attisdropped)",
    )
    .bind(table)
    .bind(column)
    .fetch_one(&mut *tx)
    .await?;
    if !has {
        sqlx::query(&format!(
            "ALTER TABLE {table} ADD COLUMN IF NOT EXISTS {column} {decl}"
        ))
        .execute(&mut *tx)
        .await?;
    }
    Ok(())
}

/// The rows the requests act on ([`row`]).
fn row_names(reqs: &[LockRequest]) -> Vec<std::borrow::Cow<'_, str>> {
    reqs.iter().map(row).collect()
}

/// The requests' rows, owners and TTLs in microseconds, as the arrays the
/// batch statements `unnest`.
fn columns<'a>(
    rows: &'a [std::borrow::Cow<'_, str>],
    reqs: &[LockRequest],
) -> (Vec<&'a str>, Vec<String>, Vec<f64>) {
    (
        rows.iter().map(|r| r.as_ref()).collect(),
        reqs.iter().map(|r| r.owner.to_string()).collect(),
        reqs.iter().map(|r| ttl_micros(r.ttl) as f64).collect(),
    )
}
