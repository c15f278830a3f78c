//! First come, first served waiting for locks (exclusive and shared),
//! leadership and permits (`fifo=true`; off by default). MySQL has no NOTIFY, so waiters
//! wait inside the server:
//!
//! - A waiting request whose grant statement is refused asks at once, on a
//!   connection of its own (opened ahead of need while waits come often),
//!   for its row's queue: a user-level lock (`GET_LOCK`) named after the
//!   row (the lock's, the election's, or the semaphore's
//!   `<name>@permits`), which the server grants to one connection at a
//!   time, in the order they asked. The connection that holds it is the
//!   queue's head; the others block inside the server and send nothing.
//!   A wait on a row this client had to queue for within the last second
//!   asks before its first attempt, beside it. Asking before anything else
//!   the attempt does keeps the queue's order close to the order of
//!   arrival.
//! - Only the head may take the free lock row, or join the readers holding
//!   it (or anyone, while nobody heads the queue; a reader also only while
//!   no refused writer's mark says one is on its way to the queue): the
//!   grant statement compares `IS_USED_LOCK` with the head's connection
//!   id. A granted head gives its place up, so readers queued one after
//!   another take their holds one after another.
//! - The head sleeps inside the server (`SLEEP`) while the row is held (a
//!   reader's head: held exclusively) and its lease lasts. A release's
//!   UPDATE frees the row and reads the head's connection id (as its
//!   LAST_INSERT_ID); if someone heads the queue, a `KILL QUERY` then
//!   interrupts that sleep: one wake-up per handoff, addressed to the head
//!   alone, and an uncontended release is one plain UPDATE. A leader's
//!   eviction does both in one call of a procedure (see [`waking`]).
//! - A waiter that ends its wait gives its place up at once: it closes its
//!   queue connection, and has the server kill it first if a statement runs
//!   there (a timed-out or cancelled wait). A connection serves one wait
//!   only, so a `KILL QUERY` meant for a head that has just left cannot
//!   reach another wait. One that dies or is cut off loses its place when
//!   the server drops the connection: a dead peer's at the end of its
//!   current statement, a silent one's after `queue_lease` idle (the
//!   connection's `wait_timeout`).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use distlock_core::wait::{Wakeup, Wakeups};
use distlock_core::{HoldKind, LockRequest, Owner};
use sqlx::mysql::{MySqlConnectOptions, MySqlConnection, MySqlPool};
use sqlx::{ConnectOptions, Executor, Row};
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::procedure::Procedure;
use crate::rwlock::SHARED_OWNER;
use crate::semaphore::PermitTables;

/// How long giving a place up may take before the connection is dropped.
const LEAVE_TIMEOUT: Duration = Duration::from_secs(2);

/// How long one `GET_LOCK` waits; a waiter still queued after a day asks
/// again, at the back of the queue.
const JOIN_TIMEOUT_S: u32 = 24 * 3600;

/// How often, and how many times, a killed queue connection is looked for
/// until the server has ended it.
const KILL_CHECK_EVERY: Duration = Duration::from_millis(5);
const KILL_CHECKS: u32 = 200;

/// How long after this client last had to queue for a row a new wait on
/// it asks for its place before its first attempt.
const CONTENDED_FOR: Duration = Duration::from_secs(1);

/// How many rows [`Queue::contended`] keeps before it forgets the ones not
/// contended within [`CONTENDED_FOR`].
const CONTENDED_ROWS: usize = 256;

/// See [`Queue::recheck`].
const SAFETY_NET: Duration = Duration::from_secs(30);

/// How long a waiter whose queue connection failed before it took its
/// place waits before it asks again.
const REJOIN_AFTER: Duration = Duration::from_millis(200);

/// MariaDB's and MySQL's error for a statement interrupted by `KILL QUERY`.
const INTERRUPTED: u16 = 1317;

/// The SQL expression naming `name`'s queue (the statement's next `?`):
/// within `GET_LOCK`'s 64 characters whatever the name's length, and the
/// same in every client of the table. User locks belong to the whole
/// server: the database's name keeps a table of one database from sharing
/// its queues with the table of the same name in another.
pub(crate) fn queue_lock(table: &str) -> String {
    format!("CONCAT('distlock-q-', MD5(CONCAT(IFNULL(DATABASE(), ''), '/{table}/', ?)))")
}

/// A procedure `name(params)` that runs `change` (an UPDATE or DELETE of
/// at most one row, on conditions of its own) and, if it changed the row,
/// ends the in-server sleep of the head of the queue of the row `p_row`
/// with `KILL QUERY`: a release and its wake-up in one round trip. Its one
/// result is the rows changed. Under autocommit each statement commits as
/// it ends, so the head, woken, finds the row freed. A `KILL` that fails
/// (the head has just left, or this role may not end another user's
/// statements: the head then wakes at its sleep's cap) changes nothing.
pub(crate) fn waking(table: &str, name: &str, params: &str, change: &str) -> Procedure {
    let q = queue_lock(table).replace('?', "p_row");
    Procedure::new(
        name,
        params,
        format!(
            "BEGIN
  DECLARE changed INT DEFAULT 0;
  DECLARE head BIGINT UNSIGNED DEFAULT 0;
  {change};
  SET changed = ROW_COUNT();
  IF changed > 0 THEN
    SET head = IFNULL(IS_USED_LOCK({q}), 0);
    IF head <> 0 THEN
      BEGIN
        DECLARE CONTINUE HANDLER FOR SQLEXCEPTION BEGIN END;
        KILL QUERY head;
      END;
    END IF;
  END IF;
  SELECT changed;
END"
        ),
    )
}

/// A [`waking`] procedure and the statement that calls it.
pub(crate) struct Call {
    pub(crate) procedure: Procedure,
    call: String,
}

impl Call {
    /// The procedure `<table>_<suffix>` of the parameters `params` (text
    /// each, `p_row` among them), running `change`. The suffix has at most
    /// ten characters: a table name may have 54, and MySQL refuses
    /// identifiers over 64.
    pub(crate) fn new(table: &str, suffix: &str, params: &[String], change: &str) -> Self {
        let name = format!("{table}_{suffix}");
        let marks = vec!["?"; params.len()].join(", ");
        Self {
            call: format!("CALL {name}({marks})"),
            procedure: waking(table, &name, &params.join(", "), change),
        }
    }

    /// Calls it with `args`: the rows it changed.
    pub(crate) async fn run(&self, pool: &MySqlPool, args: &[&str]) -> Result<u64, sqlx::Error> {
        let mut call = sqlx::query_scalar::<_, i64>(&self.call);
        for arg in args {
            call = call.bind(*arg);
        }
        let changed = call.fetch_one(pool).await?;
        Ok(changed.unsigned_abs())
    }
}

/// The queues of one backend's lock table: the statements, and this
/// client's waiters that head a queue.
pub(crate) struct Queue {
    options: MySqlConnectOptions,
    /// The pool of the backend, for `KILL`s.
    pool: MySqlPool,
    /// An eviction of a leader, waking the head of the election's queue
    /// in the same round trip (see [`waking`]).
    pub(crate) evict_leader: Call,
    /// The server drops a waiter's connection silent for this long.
    lease: Duration,
    join: String,
    doze: String,
    doze_shared: String,
    doze_permits: String,
    /// This client's waiters' places, by owner.
    turns: Mutex<HashMap<Owner, Arc<TurnShared>>>,
    /// The rows whose waiters this client last had to queue, and when: a
    /// wait that begins on one of them within [`CONTENDED_FOR`] asks for
    /// its place at once (see [`Queue::turn`]).
    contended: Mutex<HashMap<String, Instant>>,
    /// A queue connection opened ahead of need, its id and when it was
    /// opened: a refused waiter asks for its place without connecting
    /// first.
    spare: Mutex<Option<(MySqlConnection, u64, Instant)>>,
    /// A spare is being opened.
    refilling: AtomicBool,
    /// When a waiter last asked for a queue connection.
    last_wait: Mutex<Option<Instant>>,
    /// The last connection could not be opened: no spare is opened until
    /// one can (a server out of connections is not asked twice per wait).
    failing: AtomicBool,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Queue {
    pub(crate) fn new(table: &str, pool: &MySqlPool, lease: Duration) -> Self {
        let q = queue_lock(table);
        let PermitTables {
            semaphores,
            permits,
        } = PermitTables::for_lock_table(table);
        let join = format!("SELECT GET_LOCK({q}, {JOIN_TIMEOUT_S})");
        // Sleeps only while the row is held (`held`), its lease lasts and
        // this connection heads the queue, until the lease ends or the cap
        // (`?`, seconds), whichever is first; the second column says
        // whether the lease has ended by then (read after the sleep: UTC
        // at that moment is the statement's start in UTC plus how long it
        // has run, whatever the connection's time zone).
        let doze = |held: &str| {
            format!(
                "SELECT SLEEP(LEAST(?, TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), expires_at) / 1e6 + 0.002)),
                    expires_at <= UTC_TIMESTAMP(6) + INTERVAL TIMESTAMPDIFF(MICROSECOND, NOW(6), SYSDATE(6)) MICROSECOND
               FROM {table}
              WHERE name = ? AND {held} AND expires_at > UTC_TIMESTAMP(6)
                AND IS_USED_LOCK({q}) = CONNECTION_ID()"
            )
        };
        // A reader at the head sleeps only while the row is held
        // exclusively: shared holds let it in at once.
        let doze_shared = doze(&format!("owner <> '{SHARED_OWNER}'"));
        let doze = doze("owner IS NOT NULL");
        // A semaphore's head sleeps only while every permit is held and the
        // limit is the one it asks with (a changed limit wakes it to find
        // out), until the earliest permit ends or the cap (`?`, seconds);
        // the second column says whether one of the permits it saw has
        // ended by then. Binds: the cap, the semaphore's name, the limit
        // asked with, its queue's row.
        let live = format!(
            "(SELECT COUNT(*) FROM {permits} p WHERE p.name = s.name AND p.expires_at > UTC_TIMESTAMP(6))"
        );
        let doze_permits = format!(
            "SELECT SLEEP(LEAST(?, IFNULL(TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6),
                        (SELECT MIN(p.expires_at) FROM {permits} p
                          WHERE p.name = s.name AND p.expires_at > UTC_TIMESTAMP(6))) / 1e6 + 0.002, 0))),
                    (SELECT COUNT(*) FROM {permits} p
                      WHERE p.name = s.name AND p.expires_at > UTC_TIMESTAMP(6)
                        AND p.expires_at <= UTC_TIMESTAMP(6) + INTERVAL TIMESTAMPDIFF(MICROSECOND, NOW(6), SYSDATE(6)) MICROSECOND) > 0
               FROM {semaphores} s
              WHERE s.name = ? AND s.permits = ? AND {live} >= s.permits
                AND IS_USED_LOCK({q}) = CONNECTION_ID()"
        );
        let row = "IN p_row VARCHAR(255) CHARACTER SET ascii COLLATE ascii_bin".to_string();
        let evict_leader = Call::new(
            table,
            "evict_q",
            std::slice::from_ref(&row),
            &format!(
                "UPDATE {table} SET owner = NULL
                  WHERE name = p_row AND owner IS NOT NULL AND expires_at > UTC_TIMESTAMP(6)"
            ),
        );
        Self {
            // Their statements block by design (`GET_LOCK`, `SLEEP`): not
            // logged as slow.
            options: (*pool.connect_options())
                .clone()
                .disable_statement_logging(),
            pool: pool.clone(),
            evict_leader,
            lease,
            join,
            doze,
            doze_shared,
            doze_permits,
            turns: Mutex::default(),
            contended: Mutex::default(),
            spare: Mutex::default(),
            refilling: AtomicBool::new(false),
            last_wait: Mutex::default(),
            failing: AtomicBool::new(false),
        }
    }

    /// The connection id with which `req` heads its queue; 0 if it does not.
    pub(crate) fn head_of(&self, req: &LockRequest) -> u64 {
        lock(&self.turns)
            .get(&req.owner)
            .map_or(0, |t| t.head.load(Ordering::Acquire))
    }

    /// A waiting `req`'s grant statement was refused: it asks for its place
    /// now, if it has not (nothing happens for a request that does not
    /// wait, such as a try).
    pub(crate) fn take_place(self: &Arc<Self>, req: &LockRequest) {
        let shared = lock(&self.turns).get(&req.owner).cloned();
        if let Some(shared) = shared {
            self.start(&shared);
            let mut contended = lock(&self.contended);
            if contended.len() >= CONTENDED_ROWS {
                contended.retain(|_, at| at.elapsed() < CONTENDED_FOR);
            }
            contended.insert(shared.row.clone(), Instant::now());
        }
    }

    /// Starts the task that keeps `shared`'s place, unless it runs.
    fn start(self: &Arc<Self>, shared: &Arc<TurnShared>) {
        let mut task = lock(&shared.task);
        if shared.left.load(Ordering::Acquire)
            || (task.is_some() && !shared.dead.load(Ordering::Acquire))
        {
            return;
        }
        if let Some(old) = task.take() {
            old.abort();
        }
        shared.dead.store(false, Ordering::Release);
        shared.head.store(0, Ordering::Release);
        let (queue, shared2) = (self.clone(), shared.clone());
        *task = Some(tokio::spawn(async move {
            if let Err(e) = keep_place(&queue, &shared2).await {
                tracing::debug!(error = %e, "a queue connection failed; the waiter joins again");
                if shared2.head.load(Ordering::Acquire) == 0 {
                    // No place was taken (the server refuses connections,
                    // say): the waiter asks again after a pause, not in a
                    // tight loop.
                    tokio::select! {
                        () = tokio::time::sleep(REJOIN_AFTER) => {}
                        () = shared2.leave.notified() => {}
                    }
                }
            }
            shared2.head.store(0, Ordering::Release);
            shared2.dead.store(true, Ordering::Release);
            shared2.woken.notify_waiters();
        }));
    }

    /// How long a queued waiter sleeps at most without a wake-up before it
    /// tries anyway: a safety net, since only the head may take the lock
    /// and its sleep ends at each release and at the holder's lease end.
    pub(crate) fn recheck(&self) -> Duration {
        SAFETY_NET.max(self.lease)
    }

    /// `req`'s place in its queue, asked for once its grant statement is
    /// refused (see [`Queue::take_place`]).
    pub(crate) fn turn(self: &Arc<Self>, req: &LockRequest) -> Turn {
        let shared = Arc::new(TurnShared {
            row: crate::election::queue_row(req).into_owned(),
            semaphore: match req.kind {
                HoldKind::Permits { limit } => Some((req.name.as_str().to_string(), limit)),
                _ => None,
            },
            shared: req.kind == HoldKind::Shared,
            head: AtomicU64::new(0),
            dead: AtomicBool::new(false),
            doze: Notify::new(),
            woken: Notify::new(),
            leave: Notify::new(),
            task: Mutex::new(None),
            left: AtomicBool::new(false),
        });
        lock(&self.turns).insert(req.owner, shared.clone());
        // A row this client had to queue for a moment ago: the place is
        // asked for now, beside the first attempt, not after its refusal,
        // so that the queue's order is closer still to the order of
        // arrival. A wait granted at once gives it up with the rest.
        let recent = lock(&self.contended)
            .get(&shared.row)
            .is_some_and(|at| at.elapsed() < CONTENDED_FOR);
        if recent {
            self.start(&shared);
        }
        Turn {
            queue: self.clone(),
            owner: req.owner,
            shared,
        }
    }

    /// A queue connection and its id: the spare if it is fresh (the server
    /// has not dropped it for its silence), else a new one; after a spare
    /// was taken, a new one is opened in the background for the next
    /// waiter.
    async fn connection(self: &Arc<Self>) -> Result<(MySqlConnection, u64), sqlx::Error> {
        let fresh = self.lease / 2;
        let spare = lock(&self.spare).take();
        let previous = lock(&self.last_wait).replace(Instant::now());
        match spare {
            Some((conn, id, opened)) if opened.elapsed() < fresh => {
                self.refill();
                Ok((conn, id))
            }
            // None, or a stale one (dropped): a spare is opened only while
            // waits come often enough to use it before it goes stale.
            _ => {
                if previous.is_some_and(|t| t.elapsed() < fresh)
                    && !self.failing.load(Ordering::Acquire)
                {
                    self.refill();
                }
                self.open().await
            }
        }
    }

    /// Opens a spare queue connection unless one is open or opening.
    fn refill(self: &Arc<Self>) {
        if self.refilling.swap(true, Ordering::AcqRel) {
            return;
        }
        let queue = self.clone();
        tokio::spawn(async move {
            let opened = queue.open().await;
            let mut spare = lock(&queue.spare);
            match opened {
                Ok((conn, id)) if spare.is_none() => *spare = Some((conn, id, Instant::now())),
                Ok(_) => {}
                Err(e) => tracing::debug!(error = %e, "opening a spare queue connection failed"),
            }
            queue.refilling.store(false, Ordering::Release);
        });
    }

    /// A new queue connection, which the server drops after `lease` of
    /// silence, and its id; connecting may take a lease at most.
    async fn open(&self) -> Result<(MySqlConnection, u64), sqlx::Error> {
        let opened = tokio::time::timeout(self.lease, self.open_now())
            .await
            .map_err(|_| sqlx::Error::PoolTimedOut)
            .and_then(|r| r);
        self.failing.store(opened.is_err(), Ordering::Release);
        opened
    }

    async fn open_now(&self) -> Result<(MySqlConnection, u64), sqlx::Error> {
        let mut conn: MySqlConnection = self.options.connect().await?;
        let idle = self.lease.as_secs().max(1);
        let set = format!("SET SESSION wait_timeout = {idle}");
        conn.execute(sqlx::raw_sql(&set)).await?;
        let id: u64 = conn.fetch_one("SELECT CONNECTION_ID()").await?.try_get(0)?;
        Ok((conn, id))
    }

    /// Has the server end the connection `id`, whose statement was
    /// abandoned (it would otherwise run to its end first).
    /// Waits (briefly) until the server has ended it: `KILL` only marks
    /// the connection, whose thread then releases its queue lock, so a
    /// wait that returns has left the queue.
    async fn kill(&self, id: u64) {
        if let Err(e) = self
            .pool
            .execute(sqlx::raw_sql(&format!("KILL CONNECTION {id}")))
            .await
        {
            tracing::debug!(error = %e, "ending a queue connection failed; the server drops it when its statement ends");
            return;
        }
        for _ in 0..KILL_CHECKS {
            let left: Result<i64, sqlx::Error> = sqlx::query_scalar(
                "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE ID = ?",
            )
            .bind(id)
            .fetch_one(&self.pool)
            .await;
            if !matches!(left, Ok(n) if n > 0) {
                return;
            }
            tokio::time::sleep(KILL_CHECK_EVERY).await;
        }
    }
}

/// What a waiter and its queue connection's task share.
struct TurnShared {
    /// The row whose queue the waiter joins: the lock's, the election's,
    /// or the semaphore's.
    row: String,
    /// The semaphore's name and the limit the waiter asks with, for a
    /// semaphore's waiter.
    semaphore: Option<(String, u32)>,
    /// A reader's waiter.
    shared: bool,
    /// The queue connection's id once it heads the queue, else 0.
    head: AtomicU64,
    /// The task ended (its connection failed).
    dead: AtomicBool,
    /// The waiter asks for a sleep until the next release.
    doze: Notify,
    /// The sleep ended: a release, the lease's end, the row free.
    woken: Notify,
    /// The waiter's wait ended: give the place up.
    leave: Notify,
    /// The task that keeps the place, once the waiter asked for it.
    task: Mutex<Option<JoinHandle<()>>>,
    /// The wait ended: no task starts any more (set under `task`'s lock).
    left: AtomicBool,
}

impl TurnShared {
    /// Ends the wait's claim to a place: no task starts after this; the
    /// one that runs, if any, is returned.
    fn end(&self) -> Option<JoinHandle<()>> {
        let mut task = lock(&self.task);
        self.left.store(true, Ordering::Release);
        task.take()
    }
}

/// One waiting request's place in its row's queue, and the task that keeps
/// it. Dropping it gives the place up in the background.
pub(crate) struct Turn {
    queue: Arc<Queue>,
    owner: Owner,
    shared: Arc<TurnShared>,
}

impl Turn {
    /// Gives the place up, and waits until it is given up: the next waiter
    /// heads the queue when this returns.
    pub(crate) async fn leave(&mut self) {
        lock(&self.queue.turns).remove(&self.owner);
        let Some(mut task) = self.shared.end() else {
            return;
        };
        self.shared.leave.notify_one();
        if tokio::time::timeout(LEAVE_TIMEOUT, &mut task)
            .await
            .is_err()
        {
            // The connection goes with the task.
            task.abort();
        }
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        lock(&self.queue.turns).remove(&self.owner);
        // The task gives the place up by itself.
        if self.shared.end().is_some() {
            self.shared.leave.notify_one();
        }
    }
}

impl Wakeups for Turn {
    /// A wake-up at the end of the head's next sleep. The sleep is asked
    /// for when the wake-up is first awaited, after the attempt was
    /// refused, so a granted attempt leaves no sleep running; it checks the
    /// row itself, so a release before it starts is not missed. The place
    /// is asked for by the refused attempt itself ([`Queue::take_place`]);
    /// a waiter without one (its queue connection failed) asks again here.
    fn arm(&mut self) -> Option<Wakeup> {
        let (queue, shared) = (self.queue.clone(), self.shared.clone());
        Some(Box::pin(async move {
            let woken = shared.woken.notified();
            tokio::pin!(woken);
            woken.as_mut().enable();
            queue.start(&shared);
            shared.doze.notify_one();
            woken.await;
        }))
    }

    /// Ready before the first attempt: a refusal asks for the place at once
    /// and the wake-up comes from it, so no second attempt is needed to
    /// catch a release.
    async fn ready(&mut self) -> distlock_core::Result<bool> {
        Ok(true)
    }
}

/// What a statement on the queue connection came to.
enum Ran<T> {
    Done(Result<T, sqlx::Error>),
    /// The waiter left while it ran: the statement was abandoned.
    Left,
}

/// Runs `statement` unless the waiter leaves first.
async fn unless_left<T>(
    shared: &TurnShared,
    statement: impl std::future::Future<Output = Result<T, sqlx::Error>>,
) -> Ran<T> {
    tokio::select! {
        r = statement => Ran::Done(r),
        () = shared.leave.notified() => Ran::Left,
    }
}

/// The queue connection's life: wait for the head of the queue, then sleep
/// until each release for as long as the waiter asks, then give the place
/// up.
async fn keep_place(queue: &Arc<Queue>, shared: &TurnShared) -> Result<(), sqlx::Error> {
    let name = shared.row.as_str();
    let (mut conn, id) = match unless_left(shared, queue.connection()).await {
        Ran::Done(c) => c?,
        // Left before a connection was open: no place to give up.
        Ran::Left => return Ok(()),
    };
    loop {
        let joined = unless_left(shared, async {
            let got: Option<i64> = conn
                .fetch_one(sqlx::query(&queue.join).bind(name))
                .await?
                .try_get(0)?;
            Ok(got)
        })
        .await;
        match joined {
            Ran::Left => {
                queue.kill(id).await;
                return Ok(());
            }
            Ran::Done(Ok(Some(1))) => break,
            // Timed out after a day, or interrupted: a release's `KILL
            // QUERY` can land just as this connection becomes the head
            // (the release read it as the head a moment early). Asking
            // again is answered at once if the lock came with it.
            Ran::Done(Ok(_)) => continue,
            Ran::Done(Err(e)) if interrupted(&e) => continue,
            Ran::Done(Err(e)) => return Err(e),
        }
    }
    shared.head.store(id, Ordering::Release);
    // Sleeps are capped well below the queue lease, so that a waiter that
    // stopped asking (paused) leaves its connection idle long enough for
    // the server to drop it.
    let cap = (queue.lease / 3).as_secs_f64().max(0.01);
    loop {
        tokio::select! {
            biased;
            () = shared.leave.notified() => break,
            () = shared.doze.notified() => {}
        }
        loop {
            let doze = match &shared.semaphore {
                Some((semaphore, limit)) => sqlx::query(&queue.doze_permits)
                    .bind(cap)
                    .bind(semaphore.as_str())
                    .bind(limit)
                    .bind(name),
                None if shared.shared => sqlx::query(&queue.doze_shared)
                    .bind(cap)
                    .bind(name)
                    .bind(name),
                None => sqlx::query(&queue.doze).bind(cap).bind(name).bind(name),
            };
            let slept = unless_left(shared, conn.fetch_optional(doze)).await;
            match slept {
                Ran::Left => {
                    queue.kill(id).await;
                    return Ok(());
                }
                // Slept the cap through while the row stays held: again,
                // without waking the waiter.
                Ran::Done(Ok(Some(row))) if slept_the_cap_through(row.try_get(1)?) => continue,
                // The row free, or the lease over: try.
                Ran::Done(Ok(_)) => break,
                Ran::Done(Err(e)) if interrupted(&e) => break,
                Ran::Done(Err(e)) => return Err(e),
            }
        }
        shared.woken.notify_waiters();
    }
    // Idle: closing the connection gives the place up (the server sees it
    // close at once).
    shared.head.store(0, Ordering::Release);
    drop(conn);
    Ok(())
}

/// Whether a head's sleep ran to its cap while the row (or every permit)
/// stays held: the sleep's second column is 0. A NULL there is a sleep that
/// a release's `KILL QUERY` interrupted as the statement went on reading
/// (MariaDB then ends the subquery that counts a semaphore's ended permits
/// with NULL): the waiter tries, as after any interruption, and keeps its
/// place.
fn slept_the_cap_through(ended: Option<i64>) -> bool {
    ended == Some(0)
}

fn interrupted(e: &sqlx::Error) -> bool {
    e.as_database_error()
        .and_then(|d| d.try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>())
        .is_some_and(|d| d.number() == INTERRUPTED)
}

/// Interrupts the sleep of the head whose connection id a release read.
pub(crate) async fn wake_head(pool: &MySqlPool, head: u64) {
    if let Err(e) = pool
        .execute(sqlx::raw_sql(&format!("KILL QUERY {head}")))
        .await
    {
        // Without the right to end another user's statements the head still
        // wakes at its sleep's cap.
        tracing::debug!(error = %e, "waking the head of a queue failed");
    }
}

#[cfg(test)]
mod tests {
    use super::slept_the_cap_through;

    #[test]
    fn only_a_sleep_that_saw_the_row_still_held_sleeps_again() {
        assert!(slept_the_cap_through(Some(0)), "held through the cap");
        assert!(
            !slept_the_cap_through(Some(1)),
            "a lease or permit ended: try"
        );
        assert!(
            !slept_the_cap_through(None),
            "interrupted while reading: try, and keep the place"
        );
    }
}
