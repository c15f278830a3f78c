//! First come, first served waiting for exclusive locks and leadership
//! (`fifo=true`; off by default; permits queue in the same table, see
//! `permits.rs`): a refused waiting attempt joins its row's
//! wait queue (the lock's, or the election's), a table beside the lock table
//! ordered by arrival; only the queue's head may take the free row; a
//! release, a resignation or an eviction notifies the head alone, on its
//! client's own channel, which no other session listens to. A campaign's
//! grant, resignation and eviction also notify the election's observers, as
//! without a queue.

use std::time::Duration;

use distlock_core::{HoldKind, LockRequest, Result};
use sqlx::postgres::PgPool;

use crate::election::{queue_row, row};
use crate::list::holder;
use crate::postgres::{attempt_answer, attempt_upsert, LEADER_CHANGED};
use crate::rwlock::SHARED_OWNER;
use crate::{ttl_micros, DbError};

/// The start of every client's own channel; the client's id follows.
pub(crate) const CLIENT_CHANNEL: &str = "distlock_q_";

/// A dead waiter's entry is deleted by a later waiter's attempt this long
/// after it lapsed (a lapsed entry is ignored at once).
pub(crate) const GARBAGE_AFTER: &str = "interval '1 minute'";

/// The largest `arrival`: a bound no entry reaches.
const NO_ARRIVAL: &str = "9223372036854775807";

/// An expression that notifies the live head of the queue of the row `$1`,
/// on its client's own channel, and if the head waits for a shared hold,
/// every shared waiter queued before the first exclusive one with it (they
/// hold together; at most 256); NULL if nobody is queued. `but_own`: the
/// entry of the owner `$2` does not count (a statement that deletes it
/// still sees it).
fn tell_turn(table: &str, but_own: bool) -> String {
    let q = format!("{table}_queue");
    let live = |e: &str| {
        let own = if but_own {
            format!(" AND {e}.owner <> $2")
        } else {
            String::new()
        };
        format!("{e}.name = $1 AND {e}.ends_at > now(){own}")
    };
    format!(
        "(SELECT string_agg(pg_notify('{CLIENT_CHANNEL}' || t.client, $1 || ' ' || t.owner)::text, '')
            FROM (SELECT e.client, e.owner FROM {q} e
                   WHERE {} AND e.arrival <= (
                         SELECT CASE WHEN h.shared
                                     THEN coalesce((SELECT min(w.arrival) - 1 FROM {q} w
                                                     WHERE {} AND NOT w.shared), {NO_ARRIVAL})
                                     ELSE h.arrival END
                           FROM {q} h WHERE {} ORDER BY h.arrival LIMIT 1)
                   ORDER BY e.arrival LIMIT 256) t)",
        live("e"),
        live("w"),
        live("h"),
    )
}

/// [`tell_turn`] of every live entry: the turn a freed row passes on.
pub(crate) fn tell_head(table: &str) -> String {
    tell_turn(table, false)
}

/// A condition that a shared request `$2` on the row `$1` has no live
/// exclusive waiter queued before it (before any, if it is not queued).
pub(crate) fn no_writer_ahead(table: &str) -> String {
    let q = format!("{table}_queue");
    format!(
        "NOT EXISTS (SELECT 1 FROM {q} w
                      WHERE w.name = $1 AND w.ends_at > now() AND NOT w.shared
                        AND w.arrival < coalesce((SELECT m.arrival FROM {q} m
                                                   WHERE m.name = $1 AND m.owner = $2),
                                                 {NO_ARRIVAL}))"
    )
}

pub(crate) struct Queue {
    /// This client's own channel.
    pub(crate) channel: String,
    client: String,
    /// How long an entry outlives its waiter's last attempt.
    lease: Duration,
    creates: [String; 2],
    /// The statements of a lock and, where they differ, of a campaign
    /// (which also notifies the election's observers).
    first: Both,
    attempt: Both,
    release: Both,
    leave: String,
    evict_leader: String,
}

/// One statement for a lock, and its counterpart for a campaign.
struct Both {
    lock: String,
    leader: String,
}

impl Both {
    fn of(&self, leader: bool) -> &str {
        if leader {
            &self.leader
        } else {
            &self.lock
        }
    }
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
                    shared BOOLEAN NOT NULL DEFAULT false,
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
        // A campaign's grant also notifies the election's observers ($8:
        // the locks' channel), evaluated only for the row it grants: a
        // data-modifying WITH runs to completion whatever the query reads
        // of it.
        let observed = |granted: &str| {
            format!(
                ",
                 CASE WHEN {granted} THEN pg_notify($8, '{LEADER_CHANGED}' || $1)::text END"
            )
        };
        let is_granted = format!("l.owner = $2 AND l.expires_at = {ends}");
        let attempt = |notify: &str| {
            let upsert = attempt_upsert(
                table,
                &ok,
                &format!(
                    "NOT ({ok}) OR EXISTS (
                    SELECT 1 FROM {q} WHERE name = $1 AND owner <> $2 AND ends_at > now())"
                ),
                &format!("CASE WHEN {is_granted} THEN token END AS token{notify}"),
            );
            format!(
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
            )
        };
        let attempt = Both {
            lock: attempt(""),
            leader: attempt(&observed(&is_granted)),
        };
        // The first attempt of a wait, and a try: the lock table's upsert
        // as without a queue, granting only a row nobody marked as awaited
        // and whose queue holds no live entry (one probe of the queue's
        // index), so that an uncontended acquire costs little more than
        // without a queue; a refusal joins the queue when it waits. A row
        // free but awaited is refused here and decided by `attempt`, which
        // reads the queue. The mark alone would not do: a grant judges it
        // by its statement's snapshot, which misses an entry joining as it
        // runs, and clears it.
        // The probe runs once, in its own CTE, however often the upsert
        // names it.
        let ok_first = "(l.owner IS NULL OR l.expires_at <= now()) AND NOT l.awaited
             AND NOT (SELECT busy FROM queued)";
        let first = |notify: &str| {
            let upsert = attempt_upsert(
                table,
                ok_first,
                &format!("NOT ({ok_first})"),
                &format!("CASE WHEN NOT l.awaited THEN token END AS token{notify}"),
            );
            format!(
                "WITH queued AS (
                SELECT EXISTS (SELECT 1 FROM {q} WHERE name = $1 AND ends_at > now()) AS busy),
             granted AS ({upsert}),
             joined AS ({joined})
             SELECT {answer}, false"
            )
        };
        let first = Both {
            lock: first(""),
            leader: first(&observed("NOT l.awaited")),
        };
        // A release looks the head up whatever the mark says (the mark may
        // have been cleared by a grant that missed an entry joining as it
        // ran), and notifies only if there is one: an uncontended release
        // adds one probe of the queue's index. A resignation also tells the
        // election's observers, on the locks' channel, where no queued
        // waiter's client listens.
        let tell_head = tell_head(table);
        let release = |tell: &str| {
            format!(
                "WITH r AS (UPDATE {table} SET owner = NULL WHERE name = $1 AND owner = $2
                        RETURNING expires_at > now() AS held, awaited)
             SELECT held, {tell} FROM r"
            )
        };
        let release = Both {
            lock: release(&format!(
                "coalesce({tell_head}, CASE WHEN awaited THEN pg_notify($3, $1)::text END)"
            )),
            leader: release(&format!(
                "pg_notify($3, $1)::text || coalesce({tell_head}, '')"
            )),
        };
        // An eviction frees the election's row at once, waking its head and
        // its observers.
        let evict_leader = format!(
            "UPDATE {table} SET owner = NULL
              WHERE name = $1 AND owner IS NOT NULL AND expires_at > now()
             RETURNING pg_notify($2, name)::text, {tell_head}"
        );
        // A wait that ends without a grant leaves; unless the row is held
        // exclusively, the next in line is told (readers behind the one
        // that left may join the readers holding).
        let leave = format!(
            "WITH gone AS (DELETE FROM {q} WHERE name = $1 AND owner = $2 RETURNING 1)
             SELECT {} WHERE EXISTS (SELECT 1 FROM gone)
                AND NOT EXISTS (SELECT 1 FROM {table}
                                 WHERE name = $1 AND owner IS NOT NULL AND owner <> '{SHARED_OWNER}'
                                   AND expires_at > now())",
            tell_turn(table, true)
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
            evict_leader,
        }
    }

    pub(crate) fn creates(&self) -> impl Iterator<Item = &str> {
        self.creates.iter().map(String::as_str)
    }

    /// What a waiter's wake-ups are registered under: its queue's row and
    /// owner, as a release's notification on this client's channel names
    /// them.
    pub(crate) fn waiter_key(req: &LockRequest) -> String {
        format!("{} {}", queue_row(req), req.owner)
    }

    /// This client's id, which names its channel.
    pub(crate) fn client(&self) -> &str {
        &self.client
    }

    /// How long an entry outlives its waiter's last attempt.
    pub(crate) fn lease(&self) -> Duration {
        self.lease
    }

    /// One attempt: the token, the holder's lease left, whether readers
    /// hold the row, and whether another waiter is ahead in the queue.
    /// `waits`: a refusal joins the queue (or renews the entry). `first`:
    /// the cheap statement that grants only while nobody waits (see
    /// `Queue::new`); a refusal of a free row then needs `attempt`.
    /// `channel`: the locks' channel, where a campaign's grant tells the
    /// election's observers.
    pub(crate) async fn attempt(
        &self,
        pool: &PgPool,
        err: &DbError,
        req: &LockRequest,
        waits: bool,
        first: bool,
        channel: &str,
    ) -> Result<(Option<i64>, Option<i64>, Option<bool>, bool)> {
        let life = if waits { ttl_micros(self.lease) } else { 0 };
        let leader = req.kind == HoldKind::Leader;
        let sql = (if first { &self.first } else { &self.attempt }).of(leader);
        let query = sqlx::query_as(sql)
            .bind(row(req))
            .bind(req.owner.to_string())
            .bind(ttl_micros(req.ttl))
            .bind(crate::election::value(req))
            .bind(holder(req))
            .bind(life)
            .bind(&self.client);
        let query = if leader { query.bind(channel) } else { query };
        query.fetch_one(pool).await.map_err(|e| err.map(e))
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
        let leader = req.kind == HoldKind::Leader;
        let held: Option<(bool, Option<String>)> = sqlx::query_as(self.release.of(leader))
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

    /// Frees the election row `row` at once, waking its queue's head and
    /// its observers; whether someone led.
    pub(crate) async fn evict_leader(
        &self,
        pool: &PgPool,
        err: &DbError,
        row: &str,
        channel: &str,
    ) -> Result<bool> {
        let freed: Vec<(Option<String>, Option<String>)> = sqlx::query_as(&self.evict_leader)
            .bind(row)
            .bind(channel)
            .fetch_all(pool)
            .await
            .map_err(|e| err.map(e))?;
        Ok(!freed.is_empty())
    }
}
