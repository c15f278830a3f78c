//! PostgreSQL read-write locks: a shared grant is one statement on the lock
//! row (its row lock orders it with every other grant of the name) that
//! also inserts the shared hold's row; a shared release is one statement
//! too, unless the lock row changes while it runs (then it settles the row
//! again under its row lock). With `fifo`, a refused waiting reader joins
//! the lock's wait queue as a shared entry, and a shared grant is refused
//! while an exclusive waiter is queued before it (see `queue.rs`).

use std::time::Duration;

use distlock_core::wait::Outcome;
use distlock_core::{HoldRecord, LockRequest, Result};

use super::Pg;
use crate::list::{holder, shared_record, NameRange, SharedRow, EVICTED_OWNER};
use crate::rwlock::{RwTables, SHARED_OWNER};
use crate::{token_from_db, ttl_micros};

pub(crate) struct Statements {
    create_shared: String,
    create_writers: String,
    attempt: String,
    try_take: String,
    extend: String,
    forget_hold: String,
    release_unless_raced: String,
    lock_row: String,
    release: String,
    mark: String,
    unmark: String,
    status: String,
    evict: String,
    list: String,
}

impl Statements {
    /// `queued` (`fifo`): every waiter queues, readers too; a shared grant
    /// is refused while an exclusive waiter is queued before it (not while
    /// a writer's mark lasts: the queue's order decides), and the release
    /// that frees the lock row tells the queue's head.
    pub(crate) fn new(table: &str, tables: &RwTables, queued: bool) -> Self {
        let RwTables { shared, writers } = tables;
        // What the release that frees the lock row notifies: the head of
        // the lock's wait queue if there is one, else, if a waiter marked
        // the row, the lock's channel.
        let awaited = "CASE WHEN awaited THEN pg_notify($3, $1)::text END";
        let tell = if queued {
            format!("coalesce({}, {awaited})", super::queue::tell_head(table))
        } else {
            awaited.to_string()
        };
        let s = SHARED_OWNER;
        let ttl = "make_interval(secs => $3::float8 / 1e6)";
        let no_writer = if queued {
            super::queue::no_writer_ahead(table)
        } else {
            format!(
                "NOT EXISTS (SELECT 1 FROM {writers} w
                              WHERE w.name = $1 AND w.expires_at > now())"
            )
        };
        // The upsert takes the lock row unless someone holds it
        // exclusively or a writer waits first (its mark lasts, or with a
        // queue its entry is ahead), bumps the token and raises
        // the row's end to the new hold's; the hold's own row goes in with
        // it. A concurrent grant of the name waits for the row lock and is
        // then judged on the row as that grant left it. A waiting attempt
        // that is refused marks the row as awaited, so that the release
        // that frees it notifies; the update runs on the row as the last
        // grant or release committed it (the upsert locked it), and only on
        // a row not marked yet. A shared grant leaves the mark: a writer
        // refused by the readers still waits. The hold's row carries the
        // token granted and the request's holder info (`$4`). With a
        // queue, a refused waiting attempt joins it as a shared entry, or
        // renews its entry (`$5`: the entry's life in µs; `$6`: the
        // client's id), and a grant removes the entry.
        let grant = |waiting: bool| {
            let mut waits = String::new();
            if waiting {
                waits.push_str(&format!(
                    ",
                 marked AS (
                    UPDATE {table} SET awaited = true
                     WHERE name = $1 AND NOT awaited AND NOT EXISTS (SELECT 1 FROM granted))"
                ));
            }
            if waiting && queued {
                let q = format!("{table}_queue");
                waits.push_str(&format!(
                    ",
                 joined AS (
                    INSERT INTO {q} (name, owner, client, ends_at, shared)
                    SELECT $1, $2, $6, now() + make_interval(secs => $5::float8 / 1e6), true
                     WHERE NOT EXISTS (SELECT 1 FROM granted)
                    ON CONFLICT (name, owner) DO UPDATE SET ends_at = EXCLUDED.ends_at),
                 gone AS (
                    DELETE FROM {q} WHERE name = $1 AND owner = $2
                       AND EXISTS (SELECT 1 FROM granted))"
                ));
            }
            format!(
                "WITH granted AS (
                    INSERT INTO {table} AS l (name, owner, token, expires_at)
                    VALUES ($1, '{s}', 1, now() + {ttl})
                    ON CONFLICT (name) DO UPDATE
                       SET owner = '{s}', token = l.token + 1,
                           expires_at = CASE WHEN l.owner = '{s}' AND l.expires_at > now()
                                             THEN greatest(l.expires_at, EXCLUDED.expires_at)
                                             ELSE EXCLUDED.expires_at END
                     WHERE (l.owner IS NULL OR l.expires_at <= now() OR l.owner = '{s}')
                       AND {no_writer}
                    RETURNING token),
                 hold AS (
                    INSERT INTO {shared} (name, owner, expires_at, token, holder)
                    SELECT $1, $2, now() + {ttl}, granted.token, $4 FROM granted
                    ON CONFLICT (name, owner) DO UPDATE
                       SET expires_at = EXCLUDED.expires_at, token = EXCLUDED.token,
                           holder = EXCLUDED.holder){waits}"
            )
        };
        Self {
            create_shared: format!(
                "CREATE TABLE IF NOT EXISTS {shared} (
                    name TEXT COLLATE \"C\" NOT NULL,
                    owner TEXT NOT NULL,
                    expires_at TIMESTAMPTZ NOT NULL,
                    token BIGINT,
                    holder TEXT,
                    PRIMARY KEY (name, owner))"
            ),
            create_writers: format!(
                "CREATE TABLE IF NOT EXISTS {writers} (
                    name TEXT NOT NULL,
                    owner TEXT NOT NULL,
                    expires_at TIMESTAMPTZ NOT NULL,
                    PRIMARY KEY (name, owner))"
            ),
            // The grant; answers the token, or how long an exclusive holder still has.
            attempt: format!(
                "{}
                 SELECT (SELECT token FROM granted),
                        (SELECT (extract(epoch FROM expires_at - now()) * 1e6)::bigint
                           FROM {table} WHERE name = $1 AND owner IS NOT NULL
                            AND owner <> '{s}' AND expires_at > now())",
                grant(true)
            ),
            // `attempt` without the holder's remaining lease, which only a
            // waiting request needs.
            try_take: format!(
                "{} SELECT (SELECT token FROM granted), NULL::bigint",
                grant(false)
            ),
            // The hold's row, then the lock row's end raised to it (never
            // lowered: other holds may end later). Answers one row if both
            // moved: a lock row that was freed or evicted meanwhile is not
            // the hold's any more.
            extend: format!(
                "WITH e AS (
                    UPDATE {shared} SET expires_at = now() + {ttl}
                     WHERE name = $1 AND owner = $2 AND expires_at > now()
                    RETURNING expires_at)
                 UPDATE {table} l SET expires_at = greatest(l.expires_at, e.expires_at)
                   FROM e WHERE l.name = $1 AND l.owner = '{s}'"
            ),
            forget_hold: format!("DELETE FROM {shared} WHERE name = $1 AND owner = $2"),
            // The release in one statement, if no one changes the lock row
            // meanwhile: the hold's row and expired ones go, and the lock
            // row's end is set from the holds this statement's snapshot
            // shows, or the row freed. A grant, renewal or release that
            // commits after the snapshot was taken wrote a new version of
            // the lock row, so the update, re-checked against that version,
            // finds another `xmin` and changes nothing; the answer then says
            // `raced` and the lock row is settled under its row lock.
            release_unless_raced: format!(
                "WITH gone AS (
                    DELETE FROM {shared}
                     WHERE name = $1 AND (owner = $2 OR expires_at <= now())
                    RETURNING owner = $2 AND expires_at > now() AS held),
                 seen AS (
                    SELECT xmin AS version FROM {table} WHERE name = $1 AND owner = '{s}'),
                 rest AS (
                    SELECT max(expires_at) AS until FROM {shared}
                     WHERE name = $1 AND owner <> $2 AND expires_at > now()),
                 freed AS (
                    UPDATE {table} l
                       SET owner = CASE WHEN rest.until IS NULL THEN NULL ELSE l.owner END,
                           expires_at = coalesce(rest.until, l.expires_at)
                      FROM rest, seen
                     WHERE l.name = $1 AND l.owner = '{s}' AND l.xmin = seen.version
                    RETURNING rest.until IS NULL AS free, l.awaited)
                 SELECT coalesce((SELECT bool_or(held) FROM gone), false),
                        (SELECT {tell} FROM freed WHERE free),
                        EXISTS (SELECT 1 FROM seen) AND NOT EXISTS (SELECT 1 FROM freed)"
            ),
            lock_row: format!("SELECT 1 FROM {table} WHERE name = $1 FOR UPDATE"),
            // Run after `lock_row`, in its transaction, so that this
            // statement's snapshot holds every shared grant committed
            // before ours took the row lock (later ones wait for it): the
            // lock row's end is set to the latest live hold's, or, if none
            // is left, the row freed (and `tell` notified). The hold's own
            // row is gone already, and expired ones are left for a later
            // release: deleting them would wait, under the lock row's lock,
            // for a renewal committing as its hold ends, which waits for the
            // lock row next. A renewal in flight raises the end again after
            // this commits, or finds the row freed.
            release: format!(
                "WITH rest AS (
                    SELECT max(expires_at) AS until FROM {shared}
                     WHERE name = $1 AND owner <> $2 AND expires_at > now()),
                 freed AS (
                    UPDATE {table} l
                       SET owner = CASE WHEN rest.until IS NULL THEN NULL ELSE l.owner END,
                           expires_at = coalesce(rest.until, l.expires_at)
                      FROM rest WHERE l.name = $1 AND l.owner = '{s}'
                    RETURNING rest.until IS NULL AS free, l.awaited)
                 SELECT (SELECT {tell} FROM freed WHERE free)"
            ),
            // Only while readers hold the lock: a writer refused by another
            // writer leaves no mark.
            mark: format!(
                "INSERT INTO {writers} (name, owner, expires_at)
                 SELECT $1, $2, now() + {ttl} FROM {table}
                  WHERE name = $1 AND owner = '{s}' AND expires_at > now()
                 ON CONFLICT (name, owner) DO UPDATE SET expires_at = EXCLUDED.expires_at"
            ),
            unmark: format!(
                "WITH gone AS (
                    DELETE FROM {writers} WHERE name = $1 AND (owner = $2 OR expires_at <= now()))
                 SELECT pg_notify($3, $1)::text"
            ),
            status: format!(
                "SELECT (SELECT count(*) FROM {shared} WHERE name = $1 AND expires_at > now()),
                        (SELECT count(*) FROM {writers} WHERE name = $1 AND expires_at > now())"
            ),
            evict: format!(
                "WITH gone AS (DELETE FROM {shared} WHERE name = $1 AND expires_at > now()
                                RETURNING 1),
                 taken AS (UPDATE {table} SET owner = '{EVICTED_OWNER}'
                            WHERE name = $1 AND owner IS NOT NULL AND expires_at > now()
                           RETURNING 1)
                 SELECT (SELECT count(*) FROM gone) + (SELECT count(*) FROM taken)"
            ),
            list: format!(
                "SELECT name, token, (extract(epoch FROM expires_at - now()) * 1e6)::bigint, holder
                   FROM {shared}
                  WHERE name COLLATE \"C\" >= $1 AND name COLLATE \"C\" < $2
                    AND expires_at > now()
                  ORDER BY name COLLATE \"C\", token NULLS FIRST
                  LIMIT $3"
            ),
        }
    }

    pub(crate) fn evict(&self) -> &str {
        &self.evict
    }

    pub(crate) fn creates(&self) -> [&str; 2] {
        [&self.create_shared, &self.create_writers]
    }
}

impl Pg {
    /// One attempt; `waiting` if it is one of a wait's, which also reads
    /// how long an exclusive holder has left.
    pub(crate) async fn shared_attempt(&self, req: &LockRequest, waiting: bool) -> Result<Outcome> {
        let sql = if waiting {
            &self.shared.attempt
        } else {
            &self.shared.try_take
        };
        let query = sqlx::query_as(sql)
            .bind(req.name.as_str())
            .bind(req.owner.to_string())
            .bind(ttl_micros(req.ttl))
            .bind(holder(req));
        // With a queue, a wait's attempt joins it: the entry's life and
        // this client's id.
        let query = match &self.queue {
            Some(q) if waiting => query.bind(ttl_micros(q.lease())).bind(q.client()),
            _ => query,
        };
        let (token, left): (Option<i64>, Option<i64>) = query
            .fetch_one(&self.pool)
            .await
            .map_err(|e| self.err.map(e))?;
        Ok(match token {
            Some(t) => Outcome::Granted(token_from_db(&self.err, t)?),
            // Refused by a waiter queued first (no holder's end to wait
            // for): back when the entry needs renewing, unless told first.
            None => Outcome::Held(left.map(|us| Duration::from_micros(us.max(0) as u64))),
        })
    }

    /// The renewal in one statement. A hold whose lock row is no longer
    /// shared (freed by a release that judged the hold ended, or taken
    /// since) answers not held, and its row, which the statement may have
    /// extended, is deleted: it would count as live to later releases and
    /// keep the lock shared for a TTL more.
    pub(crate) async fn shared_extend(&self, req: &LockRequest) -> Result<bool> {
        if self.extend_row(&self.shared.extend, req).await? {
            return Ok(true);
        }
        sqlx::query(&self.shared.forget_hold)
            .bind(req.name.as_str())
            .bind(req.owner.to_string())
            .execute(&self.pool)
            .await
            .map_err(|e| self.err.map(e))?;
        Ok(false)
    }

    /// One round trip; four more (`BEGIN`, the row lock, the release,
    /// `COMMIT`) if another request changed the lock row meanwhile.
    pub(crate) async fn shared_release(&self, req: &LockRequest) -> Result<bool> {
        let map = |e| self.err.map(e);
        let (held, _, raced): (bool, Option<String>, bool) =
            sqlx::query_as(&self.shared.release_unless_raced)
                .bind(req.name.as_str())
                .bind(req.owner.to_string())
                .bind(&self.channel)
                .fetch_one(&self.pool)
                .await
                .map_err(map)?;
        if !raced {
            return Ok(held);
        }
        // The hold's row is gone already; this settles the lock row from
        // every hold committed before the row lock was taken.
        let mut tx = self.pool.begin().await.map_err(map)?;
        sqlx::query(&self.shared.lock_row)
            .bind(req.name.as_str())
            .fetch_optional(&mut *tx)
            .await
            .map_err(map)?;
        sqlx::query(&self.shared.release)
            .bind(req.name.as_str())
            .bind(req.owner.to_string())
            .bind(&self.channel)
            .fetch_one(&mut *tx)
            .await
            .map_err(map)?;
        tx.commit().await.map_err(map)?;
        Ok(held)
    }

    pub(crate) async fn mark(&self, req: &LockRequest) -> Result<bool> {
        let r = sqlx::query(&self.shared.mark)
            .bind(req.name.as_str())
            .bind(req.owner.to_string())
            .bind(ttl_micros(req.ttl))
            .execute(&self.pool)
            .await
            .map_err(|e| self.err.map(e))?;
        Ok(r.rows_affected() == 1)
    }

    /// Removes the mark and lets the readers it held back try again.
    pub(crate) async fn unmark(&self, req: &LockRequest) -> Result<()> {
        sqlx::query(&self.shared.unmark)
            .bind(req.name.as_str())
            .bind(req.owner.to_string())
            .bind(&self.channel)
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
        let rows: Vec<SharedRow> = sqlx::query_as(&self.shared.list)
            .bind(&range.from)
            .bind(&range.to)
            .bind(limit)
            .fetch_all(&self.pool)
            .await
            .map_err(|e| self.err.map(e))?;
        rows.into_iter()
            .map(|r| shared_record(&self.err, r))
            .collect()
    }

    /// Live shared holds and writer marks of `name`.
    pub(crate) async fn rw_status(&self, name: &str) -> Result<(i64, i64)> {
        sqlx::query_as(&self.shared.status)
            .bind(name)
            .fetch_one(&self.pool)
            .await
            .map_err(|e| self.err.map(e))
    }
}
