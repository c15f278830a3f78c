//! MySQL/MariaDB semaphores: per attempt, one call of a stored procedure
//! the backend creates with its tables (`<table>_permit`), one round trip.
//! The procedure runs one READ COMMITTED transaction that first locks the
//! semaphore row, so acquirers of a name take turns: the counter's bump
//! (which locks the row and checks the limit), the deletion of ended
//! permits, the permit's insert if one is free, the commit. When the insert
//! finds every permit held, it answers when the earliest live one ends; the
//! token it bumped stays unused (tokens rise, with gaps). When the bump
//! changes nothing, the transaction is rolled back and the client creates
//! the semaphore with its limit unless it exists: another limit in force is
//! a `LimitMismatch`, else the procedure is called again. Every grant is
//! the procedure's, so every grant judges the permits' ends alike.
//!
//! READ COMMITTED because each statement then reads what was committed
//! before it, in particular the permits of the acquirer that held the row
//! lock before us, and because it takes no gap locks: under REPEATABLE
//! READ, deleting one name's expired permits locks the gap into the next
//! name's, and two names' acquirers inserting their permits deadlock.

use std::future::Future;
use std::time::Duration;

use distlock_core::{Error, HoldRecord, LockName, LockRequest, LockStatus, Result};

use super::procedure::{mysql_error_number, Procedure};
use super::queue::queue_lock;
use super::{My, TEXT};
use crate::election::queue_row;
use crate::list::{holder, permit_record, NameRange};
use crate::semaphore::{limit_from_db, remaining_micros, PermitAttempt, PermitTables};
use crate::ttl_micros;
use distlock_core::wait::Outcome;

/// One round trip: the isolation level applies to the next transaction only.
pub(crate) const BEGIN: &str = "SET TRANSACTION ISOLATION LEVEL READ COMMITTED; START TRANSACTION";

/// How often a transaction is run again after it met another one creating
/// the same semaphore row, or a deadlock (which InnoDB resolves by rolling
/// one back: nothing was changed).
const RETRIES: usize = 5;

pub(crate) struct Statements {
    create_semaphores: String,
    create_permits: String,
    grant_proc: Procedure,
    /// The grant procedure of a backend with a wait queue (`fifo`).
    grant_queued_proc: Procedure,
    grant: String,
    grant_queued: String,
    select_semaphore: String,
    insert_semaphore: String,
    stored_limit: String,
    extend: String,
    release: String,
    release_queued: String,
    inspect: String,
    update_limit: String,
    list: String,
}

impl Statements {
    pub(crate) fn new(table: &str, tables: &PermitTables) -> Self {
        let PermitTables {
            semaphores,
            permits,
        } = tables;
        // ascii_bin: names compare byte for byte, as in the lock table.
        let ascii = "CHARACTER SET ascii COLLATE ascii_bin";
        let name = format!("VARCHAR(255) {ascii} NOT NULL");
        // The bump answers the new token through `LAST_INSERT_ID(expr)`.
        // The instant the grant is judged by is taken once the row lock is
        // held, so that the deletion of ended permits and the count of live
        // ones agree on which is which. The deletion also takes the owner's
        // own earlier permit (a retry after a lost reply: asking again takes
        // one permit, not two). It is a locking statement: where a permit's
        // renewal is committing as its old end passes, it waits for it and,
        // re-reading the row, leaves it. Each statement of a READ COMMITTED
        // transaction reads what was committed before it began, so the count
        // sees the permits of every earlier grant, each with its latest end.
        // An error (a deadlock, which InnoDB resolves by rolling one back)
        // rolls the transaction back and reaches the client.
        // `queued`: more of the permit insert's condition.
        let grant_body = |queued: &str| {
            format!(
                "BEGIN
  DECLARE judged_at DATETIME(6);
  DECLARE bumped BIGINT UNSIGNED;
  DECLARE EXIT HANDLER FOR SQLEXCEPTION BEGIN ROLLBACK; RESIGNAL; END;
  SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
  START TRANSACTION;
  UPDATE {semaphores} SET token = LAST_INSERT_ID(token + 1)
   WHERE name = p_name AND permits = p_limit;
  IF ROW_COUNT() <> 1 THEN
    ROLLBACK;
    SELECT 0, NULL, NULL;
  ELSE
    SET bumped = LAST_INSERT_ID();
    SET judged_at = UTC_TIMESTAMP(6);
    DELETE FROM {permits}
     WHERE name = p_name AND (expires_at <= judged_at OR owner = p_owner);
    INSERT INTO {permits} (name, owner, token, expires_at, holder)
      SELECT p_name, p_owner, bumped, judged_at + INTERVAL p_ttl_us MICROSECOND, p_holder
        FROM DUAL
       WHERE (SELECT COUNT(*) FROM {permits}
               WHERE name = p_name AND expires_at > judged_at) < p_limit{queued};
    IF ROW_COUNT() = 1 THEN
      COMMIT;
      SELECT 1, bumped, NULL;
    ELSE
      COMMIT;
      SELECT 1, NULL, TIMESTAMPDIFF(MICROSECOND, judged_at, MIN(expires_at))
        FROM {permits} WHERE name = p_name AND expires_at > judged_at;
    END IF;
  END IF;
END"
            )
        };
        // Not `<table>_grant`, the procedure of clients that store no
        // holder info: MySQL has no overloading, so both kinds of client
        // keep a procedure of their own while they share the tables.
        let grant_proc = format!("{table}_permit");
        let params = format!(
            "IN p_name VARCHAR(255) {ascii},
                    IN p_owner CHAR(36) {ascii}, IN p_ttl_us BIGINT, IN p_limit INT UNSIGNED,
                    IN p_holder TEXT CHARACTER SET utf8mb4"
        );
        // With a wait queue (see `queue`): a permit only for the head of
        // the semaphore's queue (`p_head`, the connection id with which the
        // caller heads it, 0 if it does not) or while nobody heads it.
        // MySQL refuses identifiers over 64 characters, and a table name
        // may have 54: a routine's suffix has at most ten.
        let grant_queued_proc = format!("{table}_permit_q");
        let q = queue_lock(table);
        let head_ok = format!(
            "
         AND IFNULL(IS_USED_LOCK({}), 0) IN (0, p_head)",
            q.replace('?', "p_row")
        );
        Self {
            grant_proc: Procedure::new(&grant_proc, &params, grant_body("")),
            grant_queued_proc: Procedure::new(
                &grant_queued_proc,
                &format!(
                    "{params},
                    IN p_row VARCHAR(300) {ascii}, IN p_head BIGINT UNSIGNED"
                ),
                grant_body(&head_ok),
            ),
            grant: format!("CALL {grant_proc}(?, ?, ?, ?, ?)"),
            grant_queued: format!("CALL {grant_queued_proc}(?, ?, ?, ?, ?, ?, ?)"),
            create_semaphores: format!(
                "CREATE TABLE IF NOT EXISTS {semaphores} (
                    name {name} PRIMARY KEY,
                    permits INT UNSIGNED NOT NULL,
                    token BIGINT UNSIGNED NOT NULL) ENGINE=InnoDB"
            ),
            create_permits: format!(
                "CREATE TABLE IF NOT EXISTS {permits} (
                    name {name},
                    owner CHAR(36) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
                    token BIGINT UNSIGNED NOT NULL,
                    expires_at DATETIME(6) NOT NULL,
                    holder {TEXT},
                    PRIMARY KEY (name, owner)) ENGINE=InnoDB"
            ),
            select_semaphore: format!(
                "SELECT permits, token FROM {semaphores} WHERE name = ? FOR UPDATE"
            ),
            insert_semaphore: format!(
                "INSERT INTO {semaphores} (name, permits, token) VALUES (?, ?, 0)"
            ),
            stored_limit: format!("SELECT permits FROM {semaphores} WHERE name = ?"),
            extend: format!(
                "UPDATE {permits} SET expires_at = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND
                  WHERE name = ? AND owner = ? AND expires_at > UTC_TIMESTAMP(6)"
            ),
            // Only a live permit, so the rows changed answer "was it still
            // held"; an expired one is free already and the next acquire
            // deletes it.
            release: format!(
                "DELETE FROM {permits} WHERE name = ? AND owner = ? AND expires_at > UTC_TIMESTAMP(6)"
            ),
            // With a wait queue a released permit is left ended (the next
            // grant deletes it), so that the release reads the queue's head
            // in the same UPDATE: its connection id comes back as the
            // statement's LAST_INSERT_ID (0: nobody waits).
            release_queued: format!(
                "UPDATE {permits} SET expires_at = TIMESTAMP'2000-01-01 00:00:00'
                        + INTERVAL 0 * LAST_INSERT_ID(IFNULL(IS_USED_LOCK({q}), 0)) MICROSECOND
                  WHERE name = ? AND owner = ? AND expires_at > UTC_TIMESTAMP(6)"
            ),
            inspect: format!(
                "SELECT s.permits,
                        (SELECT COUNT(*) FROM {permits} p
                          WHERE p.name = s.name AND p.expires_at > UTC_TIMESTAMP(6))
                   FROM {semaphores} s WHERE s.name = ?"
            ),
            update_limit: format!("UPDATE {semaphores} SET permits = ? WHERE name = ?"),
            list: format!(
                "SELECT p.name, CAST(p.token AS SIGNED),
                        TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), p.expires_at), p.holder,
                        CAST(s.permits AS SIGNED)
                   FROM {permits} p LEFT JOIN {semaphores} s ON s.name = p.name
                  WHERE p.name >= ? AND p.name < ? AND p.expires_at > UTC_TIMESTAMP(6)
                  ORDER BY p.name, p.token
                  LIMIT ?"
            ),
        }
    }

    pub(crate) fn creates(&self) -> [&str; 2] {
        [&self.create_semaphores, &self.create_permits]
    }
}

/// Whether a failed transaction changed nothing and may simply run again:
/// a duplicate key on the semaphore row (another client created it first)
/// or a deadlock victim.
fn may_retry(e: &sqlx::Error) -> bool {
    matches!(mysql_error_number(e), Some(1062 | 1213))
}

impl My {
    /// Runs `f` (one whole transaction) again while it may be retried.
    pub(crate) async fn retrying<T, F, Fut>(&self, f: F) -> Result<T>
    where
        F: Fn() -> Fut,
        Fut: Future<Output = Result<T, sqlx::Error>>,
    {
        let mut tries = 0;
        loop {
            match f().await {
                Err(e) if may_retry(&e) && tries < RETRIES => {
                    tries += 1;
                    tokio::time::sleep(
                        Duration::from_millis(1)
                            + distlock_core::wait::jitter(Duration::from_millis(10)),
                    )
                    .await;
                }
                other => return other.map_err(|e| self.err.map(e)),
            }
        }
    }
}

impl My {
    /// Creates the grant procedure and, with a wait queue, the queued grant
    /// and the releases that wake the queue's head. Runs with the tables'
    /// creation.
    pub(crate) async fn create_procedures(&self) -> Result<(), sqlx::Error> {
        self.permits.grant_proc.ensure(&self.pool).await?;
        if let Some(queue) = &self.queue {
            for p in [
                &self.permits.grant_queued_proc,
                &queue.evict_leader.procedure,
            ] {
                p.ensure(&self.pool).await?;
            }
        }
        Ok(())
    }

    /// One attempt at a permit. With a wait queue only the queue's head is
    /// granted one (or anyone while nobody heads it), and a waiting
    /// request that is refused asks for its place. Every grant is a call of
    /// the grant procedure; a name's first acquire creates the semaphore
    /// before it.
    pub(crate) async fn permit_attempt(&self, req: &LockRequest, limit: u32) -> Result<Outcome> {
        let owner = req.owner.to_string();
        let mut created = 0;
        let found = loop {
            if let Some(found) = self
                .retrying(|| self.permit_grant(req, &owner, limit))
                .await?
            {
                break found;
            }
            // No semaphore with this limit: none yet, or another limit.
            if let Some(stored) = self.retrying(|| self.permit_create(req, limit)).await? {
                break stored;
            }
            // Created, or there with this limit: the grant runs again,
            // unless the limit keeps changing between the two.
            created += 1;
            if created > RETRIES {
                return Err(Error::unavailable(
                    self.err.backend,
                    format!(
                        "the limit of semaphore `{}` changed under each of {created} attempts",
                        req.name
                    ),
                    None,
                ));
            }
        };
        if let (PermitAttempt::Full(_), Some(queue)) = (&found, &self.queue) {
            queue.take_place(req);
        }
        found.into_outcome(&self.err, req, limit)
    }

    /// The connection id with which `req` heads its queue (0 if it does
    /// not), with a wait queue.
    fn permit_head(&self, req: &LockRequest) -> Option<u64> {
        self.queue.as_ref().map(|q| q.head_of(req))
    }

    /// The attempt when the semaphore exists with the requested limit, as
    /// in every acquire but a name's first: one call of the grant
    /// procedure; `None`, with nothing changed, otherwise.
    async fn permit_grant(
        &self,
        req: &LockRequest,
        owner: &str,
        limit: u32,
    ) -> Result<Option<PermitAttempt>, sqlx::Error> {
        let head = self.permit_head(req);
        let s = &self.permits;
        let call = sqlx::query_as(if head.is_some() {
            &s.grant_queued
        } else {
            &s.grant
        })
        .bind(req.name.as_str())
        .bind(owner)
        .bind(ttl_micros(req.ttl))
        .bind(limit)
        .bind(holder(req));
        let call = match head {
            Some(head) => call.bind(queue_row(req)).bind(head),
            None => call,
        };
        let (exists, token, left): (i64, Option<u64>, Option<i64>) =
            call.fetch_one(&self.pool).await?;
        Ok((exists == 1).then(|| match token {
            Some(t) => PermitAttempt::Granted(i64::try_from(t).unwrap_or(-1)),
            None => PermitAttempt::Full(remaining_micros(left)),
        }))
    }

    /// Creates the semaphore `req` names with `limit` unless it exists:
    /// the stored limit if it is another (nothing changed), else `None`.
    async fn permit_create(
        &self,
        req: &LockRequest,
        limit: u32,
    ) -> Result<Option<PermitAttempt>, sqlx::Error> {
        let s = &self.permits;
        let name = req.name.as_str();
        let created = sqlx::query(&s.insert_semaphore)
            .bind(name)
            .bind(limit)
            .execute(&self.pool)
            .await;
        match created {
            // Another client created it first.
            Err(e) if mysql_error_number(&e) == Some(1062) => {}
            other => {
                other?;
            }
        }
        let stored: u32 = sqlx::query_scalar(&s.stored_limit)
            .bind(name)
            .fetch_one(&self.pool)
            .await?;
        Ok((stored != limit).then(|| PermitAttempt::LimitIs(i64::from(stored))))
    }

    /// The live permits whose names fall in `range`, at most `limit`.
    pub(crate) async fn list_permits(
        &self,
        range: &NameRange,
        limit: i64,
    ) -> Result<Vec<HoldRecord>> {
        type Row = (Vec<u8>, i64, i64, Option<Vec<u8>>, Option<i64>);
        let rows: Vec<Row> = sqlx::query_as(&self.permits.list)
            .bind(&range.from)
            .bind(&range.to)
            .bind(limit)
            .fetch_all(&self.pool)
            .await
            .map_err(|e| self.err.map(e))?;
        let mut records = Vec::with_capacity(rows.len());
        for (name, token, micros, holder, limit) in rows {
            let row = (self.name(name)?, token, micros, self.text(holder)?, limit);
            records.push(permit_record(&self.err, row)?);
        }
        Ok(records)
    }

    pub(crate) async fn permit_extend(&self, req: &LockRequest) -> Result<bool> {
        self.extend_row(&self.permits.extend, req).await
    }

    /// With a wait queue, the release wakes the queue's head.
    pub(crate) async fn permit_release(&self, req: &LockRequest) -> Result<bool> {
        let (name, owner) = (req.name.as_str(), req.owner.to_string());
        let release = match &self.queue {
            Some(_) => sqlx::query(&self.permits.release_queued).bind(queue_row(req)),
            None => sqlx::query(&self.permits.release),
        };
        let r = release
            .bind(name)
            .bind(&owner)
            .execute(&self.pool)
            .await
            .map_err(|e| self.err.map(e))?;
        if r.rows_affected() == 1 && self.queue.is_some() && r.last_insert_id() != 0 {
            super::queue::wake_head(&self.pool, r.last_insert_id()).await;
        }
        Ok(r.rows_affected() == 1)
    }

    pub(crate) async fn inspect_permits(&self, name: &LockName) -> Result<LockStatus> {
        let row: Option<(u32, i64)> = sqlx::query_as(&self.permits.inspect)
            .bind(name.as_str())
            .fetch_optional(&self.pool)
            .await
            .map_err(|e| self.err.map(e))?;
        Ok(match row {
            Some((limit, live)) => {
                let live = usize::try_from(live).unwrap_or(0);
                LockStatus::new(live > 0)
                    .with_holders(live, Some(limit_from_db(&self.err, i64::from(limit))?))
            }
            None => LockStatus::new(false).with_holders(0, None),
        })
    }

    pub(crate) async fn set_limit(&self, name: &LockName, limit: u32) -> Result<Option<u32>> {
        let old = self
            .retrying(|| self.set_limit_transaction(name.as_str(), limit))
            .await?;
        old.map(|l| limit_from_db(&self.err, i64::from(l)))
            .transpose()
    }

    async fn set_limit_transaction(
        &self,
        name: &str,
        limit: u32,
    ) -> Result<Option<u32>, sqlx::Error> {
        let s = &self.permits;
        let mut tx = self.pool.begin_with(BEGIN).await?;
        let old: Option<(u32, u64)> = sqlx::query_as(&s.select_semaphore)
            .bind(name)
            .fetch_optional(&mut *tx)
            .await?;
        // A limit distlock does not write (0) is refused by the caller,
        // and left as it is.
        if let Some((0, _)) = old {
            tx.rollback().await?;
            return Ok(Some(0));
        }
        match old {
            Some(_) => sqlx::query(&s.update_limit).bind(limit).bind(name),
            None => sqlx::query(&s.insert_semaphore).bind(name).bind(limit),
        }
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(old.map(|(limit, _)| limit))
    }
}
