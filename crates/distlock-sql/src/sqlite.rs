//! SQLite: one upsert per attempt on a WAL-mode file shared by processes.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;

use distlock_core::wait::Signals;
use distlock_core::{FencingToken, Finding, HoldRecord, LockRequest, Result};
use sqlx::sqlite::SqlitePool;

use crate::election::{leader_from_db, row, value, ELECTION_SUFFIX};
use crate::list::{
    exclusive_owner, holder, lock_record, sql_limit, suffix_len, LockRow, NameRange,
};
use crate::rwlock::RwTables;
use crate::semaphore::{Object, PermitTables};
use crate::{token_from_db, DbError};

mod permits;
mod shared;

/// SQLite's current time in milliseconds since the Unix epoch, computed by
/// SQLite itself (the machine's clock, shared by every process on the file).
const NOW_MS: &str = "CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER)";

pub(crate) struct Lite {
    pub(crate) pool: SqlitePool,
    create: String,
    /// Columns a table created without them gets: (table, column, type).
    added_columns: Vec<(String, &'static str, &'static str)>,
    attempt: String,
    extend: String,
    release: String,
    inspect: String,
    proclaim: String,
    leader: String,
    evict_leader: String,
    list: String,
    /// This process's lock waiters on the file, per name.
    pub(crate) releases: Arc<Signals>,
    permits: permits::Statements,
    /// Read-write locks' statements.
    shared: shared::Statements,
    /// This process's permit waiters on the file, per name.
    pub(crate) permit_releases: Arc<Signals>,
    err: DbError,
}

/// The waiters of every backend in this process that uses the same file and
/// table, so a release in this process wakes them without polling (other
/// processes' waiters poll). An entry lasts while a backend uses it.
fn releases_for(file: &Path, objects: &str) -> Arc<Signals> {
    static REGISTRY: OnceLock<Mutex<HashMap<String, Weak<Signals>>>> = OnceLock::new();
    let key = format!(
        "{}#{objects}",
        std::fs::canonicalize(file)
            .unwrap_or_else(|_| file.to_path_buf())
            .display()
    );
    let mut map = REGISTRY
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    if let Some(signals) = map.get(&key).and_then(Weak::upgrade) {
        return signals;
    }
    map.retain(|_, s| s.strong_count() > 0);
    let signals = Arc::new(Signals::default());
    map.insert(key, Arc::downgrade(&signals));
    signals
}

impl Lite {
    pub(crate) fn new(pool: SqlitePool, table: &str, err: DbError) -> Self {
        let create = format!(
            "CREATE TABLE IF NOT EXISTS {table} (
                name TEXT PRIMARY KEY NOT NULL,
                owner TEXT,
                token INTEGER NOT NULL,
                expires_at INTEGER NOT NULL,
                value TEXT,
                holder TEXT)"
        );
        // The grant writes the row's value and holder info in the same
        // statement: an election's leader's value (`?4`), NULL for a lock;
        // the request's holder info (`?5`). A release leaves the holder
        // info: every reader of it reads held rows only.
        let attempt = format!(
            "INSERT INTO {table} (name, owner, token, expires_at, value, holder)
             VALUES (?1, ?2, 1, {NOW_MS} + ?3, ?4, ?5)
             ON CONFLICT(name) DO UPDATE
                SET owner = excluded.owner, token = {table}.token + 1, expires_at = excluded.expires_at,
                    value = excluded.value, holder = excluded.holder
              WHERE {table}.owner IS NULL OR {table}.expires_at <= {NOW_MS}
             RETURNING token"
        );
        let extend = format!(
            "UPDATE {table} SET expires_at = {NOW_MS} + ?3 WHERE name = ?1 AND owner = ?2 AND expires_at > {NOW_MS}"
        );
        // Frees the row only while our lease is live, so that the number of
        // rows changed answers "was it still held" and no row comes back:
        // through sqlx's SQLite driver, a statement with `RETURNING` costs
        // markedly more than one without.
        // A row whose lease lapsed is free already: acquiring treats it so.
        let release = format!(
            "UPDATE {table} SET owner = NULL WHERE name = ?1 AND owner = ?2 AND expires_at > {NOW_MS}"
        );
        // The holder info is an exclusive holder's only: not that of
        // shared holds keeping the row, nor an evicted holder's.
        let inspect = format!(
            "SELECT token, (expires_at - {NOW_MS}) * 1000,
                    CASE WHEN {} THEN holder END
               FROM {table} WHERE name = ?1 AND owner IS NOT NULL AND expires_at > {NOW_MS}",
            exclusive_owner("owner")
        );
        // An election's: a new value only while the owner's lease is live;
        // its leader, only while one's is; eviction frees the row at once.
        let proclaim = format!(
            "UPDATE {table} SET value = ?3 WHERE name = ?1 AND owner = ?2 AND expires_at > {NOW_MS}"
        );
        let leader = format!(
            "SELECT value, token, (expires_at - {NOW_MS}) * 1000, holder FROM {table}
              WHERE name = ?1 AND owner IS NOT NULL AND expires_at > {NOW_MS}"
        );
        // Exclusive holds and leaders (see `crate::list`): the election rows
        // ordered by the election's name, after its namesake lock.
        let n = suffix_len();
        let is_election = format!("substr(name, -{n}) = '{ELECTION_SUFFIX}'");
        let list = format!(
            "SELECT name, token, (expires_at - {NOW_MS}) * 1000, holder, value FROM {table}
              WHERE name >= ?1 AND name < ?2 AND owner IS NOT NULL AND {}
                AND expires_at > {NOW_MS}
              ORDER BY CASE WHEN {is_election} THEN substr(name, 1, length(name) - {n})
                            ELSE name END, {is_election}
              LIMIT ?3",
            exclusive_owner("owner")
        );
        let evict_leader = format!(
            "UPDATE {table} SET owner = NULL
              WHERE name = ?1 AND owner IS NOT NULL AND expires_at > {NOW_MS}"
        );
        let options = pool.connect_options();
        let file = options.get_filename();
        let releases = releases_for(file, table);
        // `#` cannot occur in a table name, so this key names no lock table.
        let permit_releases = releases_for(file, &format!("{table}#permits"));
        let permit_tables = PermitTables::for_lock_table(table);
        let rw_tables = RwTables::for_lock_table(table);
        // SQLite has no `ADD COLUMN IF NOT EXISTS`: `add_column` reads the
        // table's columns first.
        let added_columns = vec![
            (table.to_owned(), "value", "TEXT"),
            (table.to_owned(), "holder", "TEXT"),
            (permit_tables.permits.clone(), "holder", "TEXT"),
            (rw_tables.shared.clone(), "token", "INTEGER"),
            (rw_tables.shared.clone(), "holder", "TEXT"),
        ];
        let permits = permits::Statements::new(&permit_tables);
        let shared = shared::Statements::new(table, &rw_tables);
        Self {
            pool,
            create,
            added_columns,
            attempt,
            extend,
            release,
            inspect,
            proclaim,
            leader,
            evict_leader,
            list,
            releases,
            permits,
            shared,
            permit_releases,
            err,
        }
    }

    /// Runs a statement, retrying while SQLite reports the file busy or
    /// locked. The busy timeout covers most waits, but WAL mode answers some
    /// conflicts at once (a read snapshot that cannot be upgraded, a
    /// connection being set up); a busy statement changed nothing, so
    /// running it again is safe.
    async fn busy<T, F, Fut>(&self, f: F) -> Result<T>
    where
        F: Fn() -> Fut,
        Fut: std::future::Future<Output = std::result::Result<T, sqlx::Error>>,
    {
        let start = tokio::time::Instant::now();
        loop {
            match f().await {
                Err(e) if is_busy(&e) && start.elapsed() < BUSY_RETRY_FOR => {
                    tokio::time::sleep(
                        Duration::from_millis(5)
                            + distlock_core::wait::jitter(Duration::from_millis(45)),
                    )
                    .await;
                }
                other => return other.map_err(|e| self.err.map(e)),
            }
        }
    }

    pub(crate) async fn create_table(&self) -> Result<()> {
        for create in [self.create.as_str()]
            .into_iter()
            .chain(self.permits.creates())
            .chain(self.shared.creates())
        {
            self.busy(|| sqlx::query(create).execute(&self.pool))
                .await?;
        }
        for (table, column, decl) in &self.added_columns {
            self.add_column(table, column, decl).await?;
        }
        Ok(())
    }

    /// Adds `column` to `table` if the table was created without it.
    /// Another client may add it meanwhile: its ALTER then fails, and the
    /// column is there. Table and column names are validated identifiers.
    async fn add_column(&self, table: &str, column: &str, decl: &str) -> Result<()> {
        let has_sql =
            format!("SELECT count(*) FROM pragma_table_info('{table}') WHERE name = '{column}'");
        let add_sql = format!("ALTER TABLE {table} ADD COLUMN {column} {decl}");
        let has = || async {
            self.busy(|| sqlx::query_scalar::<_, i64>(&has_sql).fetch_one(&self.pool))
                .await
        };
        if has().await? > 0 {
            return Ok(());
        }
        match self
            .busy(|| sqlx::query(&add_sql).execute(&self.pool))
            .await
        {
            Err(_) if has().await? > 0 => Ok(()),
            other => other.map(|_| ()),
        }
    }

    /// `journal_mode` (processes share the file through WAL) and
    /// `synchronous` (off lets a power loss undo committed grants).
    pub(crate) async fn deployment_findings(&self) -> Vec<Finding> {
        let mode: std::result::Result<String, sqlx::Error> =
            sqlx::query_scalar("PRAGMA journal_mode")
                .fetch_one(&self.pool)
                .await;
        let sync: std::result::Result<i64, sqlx::Error> = sqlx::query_scalar("PRAGMA synchronous")
            .fetch_one(&self.pool)
            .await;
        vec![
            match mode {
                Ok(m) if m.eq_ignore_ascii_case("wal") => Finding::fine("journal_mode", m),
                Ok(m) => Finding::warning(
                    "journal_mode",
                    m,
                    "without WAL, processes on the file block each other's reads while one writes; distlock opens files in WAL mode",
                ),
                Err(e) => Finding::unknown("journal_mode", format!("PRAGMA failed: {e}")),
            },
            match sync {
                Ok(v @ (0 | 1)) => Finding::warning(
                    "synchronous",
                    if v == 0 { "OFF" } else { "NORMAL" },
                    "an operating-system crash or a power loss can undo committed grants and token counters, and a token repeats; use FULL (distlock opens files with it)",
                ),
                Ok(v) => Finding::fine("synchronous", ["OFF", "NORMAL", "FULL", "EXTRA"].get(v as usize).copied().unwrap_or("?")),
                Err(e) => Finding::unknown("synchronous", format!("PRAGMA failed: {e}")),
            },
        ]
    }

    /// Every lock of `reqs` in one transaction, or none (rolled back).
    pub(crate) async fn try_acquire_all(
        &self,
        reqs: &[LockRequest],
    ) -> Result<Option<Vec<FencingToken>>> {
        let owners: Vec<String> = reqs.iter().map(|r| r.owner.to_string()).collect();
        let tokens: Option<Vec<i64>> = self
            .busy(|| async {
                let mut tx = self.pool.begin().await?;
                let mut tokens = Vec::with_capacity(reqs.len());
                for (req, owner) in reqs.iter().zip(&owners) {
                    let token: Option<i64> = sqlx::query_scalar(&self.attempt)
                        .bind(row(req))
                        .bind(owner)
                        .bind(ttl_millis(req))
                        .bind(value(req))
                        .bind(holder(req))
                        .fetch_optional(&mut *tx)
                        .await?;
                    match token {
                        Some(t) => tokens.push(t),
                        None => {
                            tx.rollback().await?;
                            return Ok(None);
                        }
                    }
                }
                tx.commit().await?;
                Ok(Some(tokens))
            })
            .await?;
        tokens
            .map(|ts| {
                ts.into_iter()
                    .map(|t| token_from_db(&self.err, t))
                    .collect()
            })
            .transpose()
    }

    pub(crate) async fn try_acquire(&self, req: &LockRequest) -> Result<Option<FencingToken>> {
        let (row, owner) = (row(req), req.owner.to_string());
        let token: Option<i64> = self
            .busy(|| {
                sqlx::query_scalar(&self.attempt)
                    .bind(row.as_ref())
                    .bind(&owner)
                    .bind(ttl_millis(req))
                    .bind(value(req))
                    .bind(holder(req))
                    .fetch_optional(&self.pool)
            })
            .await?;
        token.map(|t| token_from_db(&self.err, t)).transpose()
    }

    pub(crate) async fn extend(&self, req: &LockRequest) -> Result<bool> {
        let (row, owner) = (row(req), req.owner.to_string());
        let statement = self.extend_statement(req)?;
        let r = self
            .busy(|| {
                sqlx::query(statement)
                    .bind(row.as_ref())
                    .bind(&owner)
                    .bind(ttl_millis(req))
                    .execute(&self.pool)
            })
            .await?;
        Ok(r.rows_affected() == 1)
    }

    /// The renewal of a lock's row or of a permit's.
    fn extend_statement(&self, req: &LockRequest) -> Result<&str> {
        Ok(match Object::of(req, &self.err)? {
            Object::Lock | Object::Leader => &self.extend,
            Object::Semaphore { .. } => self.permit_extend_statement(),
            // Two statements (`shared_extend`): the caller renews shared
            // holds apart.
            Object::Shared => {
                return Err(distlock_core::Error::backend(
                    self.err.backend,
                    "a shared hold cannot be renewed by one statement",
                ))
            }
        })
    }

    /// Every renewal of the batch (locks and permits alike) in one
    /// transaction: one commit (one WAL write) instead of one per hold.
    pub(crate) async fn extend_many(&self, reqs: &[LockRequest]) -> Result<Vec<bool>> {
        let owners: Vec<String> = reqs.iter().map(|r| r.owner.to_string()).collect();
        let statements = reqs
            .iter()
            .map(|r| self.extend_statement(r))
            .collect::<Result<Vec<_>>>()?;
        self.busy(|| async {
            let mut tx = self.pool.begin().await?;
            let mut answers = Vec::with_capacity(reqs.len());
            for ((req, owner), statement) in reqs.iter().zip(&owners).zip(&statements) {
                let r = sqlx::query(statement)
                    .bind(row(req))
                    .bind(owner)
                    .bind(ttl_millis(req))
                    .execute(&mut *tx)
                    .await?;
                answers.push(r.rows_affected() == 1);
            }
            tx.commit().await?;
            Ok(answers)
        })
        .await
    }

    pub(crate) async fn release(&self, req: &LockRequest) -> Result<bool> {
        let (row, owner) = (row(req), req.owner.to_string());
        let r = self
            .busy(|| {
                sqlx::query(&self.release)
                    .bind(row.as_ref())
                    .bind(&owner)
                    .execute(&self.pool)
            })
            .await?;
        let held = r.rows_affected() == 1;
        if held {
            if let Some(s) = self.releases.find(&row) {
                s.wake_all();
            }
        }
        Ok(held)
    }

    /// Replaces the value of `req`'s election row while its lease is live.
    pub(crate) async fn proclaim(&self, req: &LockRequest, value: &str) -> Result<bool> {
        let (row, owner) = (row(req), req.owner.to_string());
        let r = self
            .busy(|| {
                sqlx::query(&self.proclaim)
                    .bind(row.as_ref())
                    .bind(&owner)
                    .bind(value)
                    .execute(&self.pool)
            })
            .await?;
        Ok(r.rows_affected() == 1)
    }

    /// The live leader of the election row `row`.
    pub(crate) async fn leader(&self, row: &str) -> Result<Option<distlock_core::Leader>> {
        let found: Option<(Option<String>, i64, i64, Option<String>)> = self
            .busy(|| {
                sqlx::query_as(&self.leader)
                    .bind(row)
                    .fetch_optional(&self.pool)
            })
            .await?;
        found.map(|r| leader_from_db(&self.err, r)).transpose()
    }

    /// Frees the election row `row` at once; whether someone led.
    pub(crate) async fn evict_leader(&self, row: &str) -> Result<bool> {
        let r = self
            .busy(|| {
                sqlx::query(&self.evict_leader)
                    .bind(row)
                    .execute(&self.pool)
            })
            .await?;
        if let Some(s) = self.releases.find(row) {
            s.wake_all();
        }
        Ok(r.rows_affected() == 1)
    }

    pub(crate) async fn inspect(&self, name: &str) -> Result<Option<(i64, i64, Option<String>)>> {
        self.busy(|| {
            sqlx::query_as(&self.inspect)
                .bind(name)
                .fetch_optional(&self.pool)
        })
        .await
    }

    /// The live holds of every kind whose names fall in `range`: at most
    /// `limit` of each table, one SELECT each.
    pub(crate) async fn list(&self, range: &NameRange, limit: usize) -> Result<Vec<HoldRecord>> {
        let limit = sql_limit(limit);
        let locks: Vec<LockRow> = self
            .busy(|| {
                sqlx::query_as(&self.list)
                    .bind(&range.from)
                    .bind(&range.to)
                    .bind(limit)
                    .fetch_all(&self.pool)
            })
            .await?;
        let mut records = locks
            .into_iter()
            .map(|r| lock_record(&self.err, r))
            .collect::<Result<Vec<_>>>()?;
        records.extend(self.list_shared(range, limit).await?);
        records.extend(self.list_permits(range, limit).await?);
        Ok(records)
    }
}

/// How long a statement is retried while the file is busy.
const BUSY_RETRY_FOR: Duration = Duration::from_secs(10);

/// SQLITE_BUSY or SQLITE_LOCKED, including their extended codes.
pub(crate) fn is_busy(e: &sqlx::Error) -> bool {
    e.as_database_error()
        .and_then(|d| d.code())
        .is_some_and(|c| crate::sqlite_busy(&c))
}

fn ttl_millis(req: &LockRequest) -> i64 {
    i64::try_from(req.ttl.as_millis()).unwrap_or(i64::MAX / 4)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backends_on_one_file_share_its_signals_and_none_are_kept_after_them() {
        let file = Path::new("/nonexistent/distlock-signals-test.db");
        let a = releases_for(file, "locks");
        let b = releases_for(file, "locks");
        assert!(
            Arc::ptr_eq(&a, &b),
            "two backends of one file and table wake apart"
        );
        let other = releases_for(file, "others");
        assert!(!Arc::ptr_eq(&a, &other), "another table shares the signals");
        let kept = Arc::downgrade(&a);
        drop((a, b));
        assert!(
            kept.upgrade().is_none(),
            "the registry keeps a file's signals after its last backend"
        );
    }
}
