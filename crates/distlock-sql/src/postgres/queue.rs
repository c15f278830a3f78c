//! First come, first served waiting for exclusive locks (`fifo=true`; off
//! by default): a refused waiting attempt joins the lock's wait queue, a table
//! beside the lock table ordered by arrival; only the queue's head may take
//! a free lock; a release notifies the head alone, on its client's own
//! channel, which no other session listens to.

use std::time::Duration;

use distlock_core::{LockRequest, Result};
use sqlx::postgres::PgPool;

use crate::election::row;
use crate::list::holder;
use crate::postgres::{attempt_answer, attempt_upsert};
use crate::{ttl_micros, DbError};

/// The start of every client's own channel; the client's id follows.
const CLIENT_CHANNEL: &str = "distlock_q_";

/// A dead waiter's entry is deleted by a later waiter's attempt this long
/// after it lapsed (a lapsed entry is ignored at once).
const GARBAGE_AFTER: &str = "interval '1 minute'";

pub(crate) struct Queue {
    /// This client's own channel.
    pub(crate) channel: String,
    client: String,
    /// How long an entry outlives its waiter's last attempt.
    lease: Duration,
    creates: [String; 2],
    first: String,
    attempt: String,
    release: String,
    leave: String,
}

impl Queue {
    pub(crate) fn new(table: &str, lease: Duration) -> Self {
        let q = format!("{table}_queue");
        let client = distlock_core::Owner::random().to_string().replace('-', "");
        let creates = [
            format!(
                "CREATE TABLE IF NOT EXISTS {q} (
                    name TEXT COLLATE \"C\" NOT NULL,
                    owner TEXT NOT NULL,
                    client TEXT NOT NULL,
                    arrival BIGSERIAL,
                    ends_at TIMESTAMPTZ NOT NULL,
                    PRIMARY KEY (name, owner))"
            ),
            format!("CREATE INDEX IF NOT EXISTS {q}_arrival ON {q} (name, arrival)"),
        ];
        // The live head, as this statement's snapshot sees the queue.
        let head = format!(
            "SELECT owner, client FROM {q} WHERE name = $1 AND ends_at > now()
              ORDER BY arrival LIMIT 1"
        );
        let behind = "COALESCE((SELECT owner <> $2 FROM head), false)";
        let ok = format!("(l.owner IS NULL OR l.expires_at <= now()) AND NOT {behind}");
        let ends = "now() + make_interval(secs => $3::float8 / 1e6)";
        // A refused waiting attempt joins the queue or renews its entry
        // ($6: the entry's life in µs; 0 for a try, which never queues).
        let joined = format!(
            "INSERT INTO {q} (name, owner, client, ends_at)
             SELECT $1, $2, $7, now() + make_interval(secs => $6::float8 / 1e6)
              WHERE $6::float8 > 0 AND (SELECT token FROM granted) IS NULL
             ON CONFLICT (name, owner) DO UPDATE SET ends_at = EXCLUDED.ends_at"
        );
        let answer = attempt_answer(table);
        // The lock table's upsert of an attempt (`attempt_upsert`), granting
        // only to the queue's head (or to anyone while nobody is queued),
        // then joining the queue or leaving it on a grant. A grant leaves
        // the row `awaited` while others wait, so that the release notifies
        // the next. The grant is told by the row now being the owner's with
        // this statement's expiry (`now()` is the transaction's start, which
        // no earlier grant shares).
        let upsert = attempt_upsert(
            table,
            &ok,
            &format!(
                "NOT ({ok}) OR EXISTS (
                    SELECT 1 FROM {q} WHERE name = $1 AND owner <> $2 AND ends_at > now())"
            ),
            &format!("CASE WHEN l.owner = $2 AND l.expires_at = {ends} THEN token END AS token"),
        );
        let attempt = format!(
            "WITH head AS ({head}),
             granted AS ({upsert}),
             joined AS ({joined}),
             gone AS (
                DELETE FROM {q} WHERE name = $1 AND owner = $2
                   AND (SELECT token FROM granted) IS NOT NULL),
             garbage AS (
                DELETE FROM {q} WHERE ctid IN (
                    SELECT ctid FROM {q} WHERE name = $1 AND ends_at < now() - {GARBAGE_AFTER}
                       FOR UPDATE SKIP LOCKED))
             SELECT {answer}, {behind}"
        );
        // The first attempt of a wait, and a try: the lock table's upsert
        // as without a queue, granting only a row nobody marked as awaited
        // (nobody queued), so that an uncontended acquire costs what it
        // costs without a queue; a refusal joins the queue when it waits.
        // A row free but awaited is refused here and decided by `attempt`,
        // which reads the queue.
        let ok_first = "(l.owner IS NULL OR l.expires_at <= now()) AND NOT l.awaited";
        let upsert = attempt_upsert(
            table,
            ok_first,
            &format!("NOT ({ok_first})"),
            "CASE WHEN NOT l.awaited THEN token END AS token",
        );
        let first = format!(
            "WITH granted AS ({upsert}),
             joined AS ({joined})
             SELECT {answer}, false"
        );
        // The head is looked up only when the row is awaited: an
        // uncontended release costs what it costs without a queue.
        let release = format!(
            "WITH r AS (UPDATE {table} SET owner = NULL WHERE name = $1 AND owner = $2
                        RETURNING expires_at > now() AS held, awaited)
             SELECT held,
                    CASE WHEN awaited THEN coalesce(
                        (SELECT pg_notify('{CLIENT_CHANNEL}' || client, $1 || ' ' || owner)::text
                           FROM {q} WHERE name = $1 AND ends_at > now()
                          ORDER BY arrival LIMIT 1),
                        pg_notify($3, $1)::text) END
               FROM r"
        );
        // A wait that ends without a grant leaves; if the lock is free, the
        // next in line is told.
        let leave = format!(
            "WITH gone AS (DELETE FROM {q} WHERE name = $1 AND owner = $2 RETURNING 1),
                  head AS (SELECT owner, client FROM {q}
                            WHERE name = $1 AND owner <> $2 AND ends_at > now()
                            ORDER BY arrival LIMIT 1)
             SELECT pg_notify('{CLIENT_CHANNEL}' || client, $1 || ' ' || owner)::text FROM head
              WHERE EXISTS (SELECT 1 FROM gone)
                AND NOT EXISTS (SELECT 1 FROM {table}
                                 WHERE name = $1 AND owner IS NOT NULL AND expires_at > now())"
        );
        Self {
            channel: format!("{CLIENT_CHANNEL}{client}"),
            client,
            lease,
            creates,
            first,
            attempt,
            release,
            leave,
        }
    }

    pub(crate) fn creates(&self) -> impl Iterator<Item = &str> {
        self.creates.iter().map(String::as_str)
    }

    /// What a waiter's wake-ups are registered under: its row and owner,
    /// as a release's notification on this client's channel names them.
    pub(crate) fn waiter_key(req: &LockRequest) -> String {
        format!("{} {}", row(req), req.owner)
    }

    /// One attempt: the token, the holder's lease left, whether readers
    /// hold the row, and whether another waiter is ahead in the queue.
    /// `waits`: a refusal joins the queue (or renews the entry). `first`:
    /// the cheap statement that grants only while nobody waits (see
    /// `Queue::new`); a refusal of a free row then needs `attempt`.
    pub(crate) async fn attempt(
        &self,
        pool: &PgPool,
        err: &DbError,
        req: &LockRequest,
        waits: bool,
        first: bool,
    ) -> Result<(Option<i64>, Option<i64>, Option<bool>, bool)> {
        let life = if waits { ttl_micros(self.lease) } else { 0 };
        let sql = if first { &self.first } else { &self.attempt };
        sqlx::query_as(sql)
            .bind(row(req))
            .bind(req.owner.to_string())
            .bind(ttl_micros(req.ttl))
            .bind(crate::election::value(req))
            .bind(holder(req))
            .bind(life)
            .bind(&self.client)
            .fetch_one(pool)
            .await
            .map_err(|e| err.map(e))
    }

    /// How long a refused waiter sleeps at most: it renews its entry well
    /// before the entry lapses.
    pub(crate) fn renew_every(&self) -> Duration {
        self.lease / 3
    }

    /// Releases `req`'s hold (see `Pg::release`): whether it was held.
    pub(crate) async fn release(
        &self,
        pool: &PgPool,
        err: &DbError,
        req: &LockRequest,
        channel: &str,
    ) -> Result<bool> {
        let held: Option<(bool, Option<String>)> = sqlx::query_as(&self.release)
            .bind(row(req))
            .bind(req.owner.to_string())
            .bind(channel)
            .fetch_optional(pool)
            .await
            .map_err(|e| err.map(e))?;
        Ok(held.is_some_and(|(h, _)| h))
    }

    /// Removes `req`'s entry, telling the next in line if the lock is free.
    pub(crate) async fn leave(
        &self,
        pool: &PgPool,
        err: &DbError,
        req: &LockRequest,
    ) -> Result<()> {
        sqlx::query(&self.leave)
            .bind(row(req))
            .bind(req.owner.to_string())
            .fetch_all(pool)
            .await
            .map_err(|e| err.map(e))?;
        Ok(())
    }
}
