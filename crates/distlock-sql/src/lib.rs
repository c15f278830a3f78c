#![doc = include_str!("../README.md")]
#![cfg_attr(docsrs, feature(doc_cfg))]

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use distlock_core::{
    async_trait, AllAtOnce, Backend, Capabilities, Consistency, Error, Fencing, FencingToken,
    Finding, Grant, HoldKind, HoldRecord, InputKind, Leader, LockName, LockRequest, LockStatus,
    Result, TrustedClock, Waiting,
};
use tokio::time::Instant;

mod config;
mod election;
mod list;
#[cfg(feature = "mysql")]
mod mysql;
#[cfg(feature = "postgres")]
mod postgres;
mod rwlock;
mod semaphore;
#[cfg(feature = "sqlite")]
mod sqlite;
mod wait;

pub use config::SqlConfig;
/// The sqlx version this crate builds on, for users passing their own pools.
pub use sqlx;

/// The statements a PostgreSQL lock's `try_acquire` and `release` send
/// (without `fifo`), for tools that send them without this crate's client,
/// such as the benchmark's measure of the protocol alone. Each checks the
/// table name as [`SqlConfig::with_table`] does.
#[cfg(feature = "postgres")]
pub mod requests {
    use distlock_core::Result;

    /// The grant: `$1` name, `$2` owner, `$3` TTL in µs (`BIGINT`), `$4`
    /// NULL (`TEXT`: an election's value), `$5` holder info (`TEXT`, or
    /// NULL); answers the new fencing token (`BIGINT`), or no row when the
    /// lock is held.
    pub fn postgres_try_acquire(table: &str) -> Result<String> {
        crate::config::validate_table(table)?;
        Ok(crate::postgres::take_statement(table, "token"))
    }

    /// The release: `$1` name, `$2` owner, `$3` [`postgres_channel`];
    /// answers whether the lock was held (`BOOLEAN`) and its notification
    /// (`TEXT`, NULL unless a waiter marked the row), or no row when `$2`
    /// does not own it.
    pub fn postgres_release(table: &str) -> Result<String> {
        crate::config::validate_table(table)?;
        Ok(crate::postgres::release_statement(table))
    }

    /// The channel `table`'s releases notify.
    pub fn postgres_channel(table: &str) -> Result<String> {
        crate::config::validate_table(table)?;
        Ok(crate::postgres::locks_channel(table))
    }
}

use distlock_core::wait::{wait_for_grant, Outcome, Pace};
use semaphore::{valid_limit, Object};

#[cfg(not(any(feature = "postgres", feature = "mysql", feature = "sqlite")))]
compile_error!("distlock-sql needs at least one of the features `postgres`, `mysql`, `sqlite`");

/// A lock per row on PostgreSQL, MySQL/MariaDB or SQLite.
///
/// A waiting exclusive acquire's or campaign's queue entry (PostgreSQL
/// with `fifo`): a wait that ends without a grant leaves the queue, and one
/// that is dropped leaves in a task of its own.
struct Queued<'a> {
    backend: &'a SqlBackend,
    req: &'a LockRequest,
    done: bool,
    /// Where the leaving runs if the wait is dropped unfinished.
    spawner: distlock_core::completion::Spawner,
}

impl Queued<'_> {
    async fn leave(&mut self) {
        self.backend.leave_queue(self.req).await;
        self.done = true;
    }
}

impl Drop for Queued<'_> {
    fn drop(&mut self) {
        if self.done || !self.backend.queued() {
            return;
        }
        let (backend, req) = (self.backend.clone(), self.req.clone());
        self.spawner
            .spawn(async move { backend.leave_queue(&req).await });
    }
}

/// Cheap to clone; clones share the pool. See the crate docs for the table
/// layout and the guarantees.
#[derive(Clone)]
pub struct SqlBackend {
    inner: Arc<Inner>,
}

struct Inner {
    db: Db,
    config: SqlConfig,
    err: DbError,
    /// Writer marks this backend placed and has not removed yet.
    marks: rwlock::Marks,
}

enum Db {
    #[cfg(feature = "postgres")]
    Postgres(postgres::Pg),
    #[cfg(feature = "mysql")]
    MySql(mysql::My),
    #[cfg(feature = "sqlite")]
    Sqlite(sqlite::Lite),
}

impl fmt::Debug for SqlBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The endpoint never includes credentials.
        f.debug_struct("SqlBackend")
            .field("database", &self.inner.err.backend)
            .field("endpoint", &self.inner.err.endpoint)
            .field("table", &self.inner.config.table)
            .finish()
    }
}

/// Maps sqlx errors to distlock's, naming the database and where it is.
#[derive(Clone, Debug)]
pub(crate) struct DbError {
    backend: &'static str,
    endpoint: String,
}

impl DbError {
    pub(crate) fn map(&self, e: sqlx::Error) -> Error {
        let unavailable = |what: &str, e: sqlx::Error| {
            Error::unavailable(
                self.backend,
                format!("{} at {} {what} ({e})", self.backend, self.endpoint),
                Some(Box::new(e)),
            )
        };
        if let Some(why) = tls_failure(&e) {
            return Error::misconfigured(
                self.backend,
                format!(
                    "{} at {}: TLS failed, {why}; {}",
                    self.backend,
                    self.endpoint,
                    self.tls_hint()
                ),
                Some(Box::new(e)),
            );
        }
        if let sqlx::Error::Database(d) = &e {
            if let Some(what) = self.refused_configuration(d.as_ref()) {
                return Error::misconfigured(
                    self.backend,
                    format!("{} at {}: {d}; {what}", self.backend, self.endpoint),
                    Some(Box::new(e)),
                );
            }
            if let Some(what) = self.transient(d.as_ref()) {
                return unavailable(what, e);
            }
        }
        match e {
            sqlx::Error::Io(_) | sqlx::Error::Protocol(_) | sqlx::Error::WorkerCrashed => {
                unavailable("unreachable", e)
            }
            sqlx::Error::PoolTimedOut => unavailable("gave no connection in time", e),
            sqlx::Error::PoolClosed => unavailable("pool closed", e),
            sqlx::Error::Configuration(c) => Error::invalid(
                InputKind::Url,
                format!("{} URL for {}: {c}", self.backend, self.endpoint),
            ),
            other => Error::backend(self.backend, other),
        }
    }

    /// Why trying again may succeed after the database's error `d`, or
    /// `None` when the same request would meet the same error.
    fn transient(&self, d: &dyn sqlx::error::DatabaseError) -> Option<&'static str> {
        #[cfg(feature = "mysql")]
        if let Some(my) = d.try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>() {
            if let Some(what) = mysql_transient(my.number()) {
                return Some(what);
            }
            // ER_NOT_SUPPORTED_AUTH_MODE (08004): the server asks for an
            // authentication method this client lacks, on every attempt.
            if my.number() == 1251 {
                return None;
            }
        }
        match d.code()?.as_ref() {
            // SQLite busy or locked, with their extended codes.
            c if self.backend == "sqlite" && sqlite_busy(c) => Some("is busy"),
            // A serialization failure or a deadlock (a server whose default
            // isolation is stricter than READ COMMITTED, say): nothing was
            // written, and the next attempt may go through.
            "40001" | "40P01" => {
                Some("refused the statement as conflicting; trying again may succeed")
            }
            // PostgreSQL: too many connections, the server's or a role's or
            // a database's CONNECTION LIMIT; a closed connection lifts it.
            "53300" => Some("has reached a connection limit"),
            // PostgreSQL: shutting down (admin, crash) or starting up.
            "57P01" | "57P02" | "57P03" => Some("is shutting down or starting up"),
            // PostgreSQL: a row lock waited past the role's or database's
            // `lock_timeout`, or a statement ran past `statement_timeout`
            // (or was cancelled): rolled back, and a later moment may be
            // less busy.
            "55P03" | "57014" => {
                Some("gave up on the statement after its lock or statement timeout")
            }
            // PostgreSQL: a read-only transaction (a hot standby, or
            // `default_transaction_read_only` during a switchover).
            "25006" => Some(READ_ONLY),
            // Class 08, PostgreSQL's and MySQL's: the connection failed or
            // was lost; not a protocol violation (08P01), which the next
            // connection meets again.
            c if c.starts_with("08") && c != "08P01" => Some("lost or refused the connection"),
            _ => None,
        }
    }
}

/// Why a statement a read-only server refused may go through later: a
/// switchover or failover promotes a server that takes writes.
const READ_ONLY: &str = "is read-only (a replica, or a primary during a switchover): retrying succeeds once the URL reaches a server that takes writes";

/// Whether SQLite's result `code` (as sqlx reports it, the extended code)
/// is SQLITE_BUSY or SQLITE_LOCKED, which another connection's transaction
/// ending lifts: their extended codes (SQLITE_BUSY_SNAPSHOT, 517, say) keep
/// the primary code in the low byte.
pub(crate) fn sqlite_busy(code: &str) -> bool {
    code.parse::<i32>().is_ok_and(|c| matches!(c & 0xff, 5 | 6))
}

/// Why trying again may succeed after MySQL's or MariaDB's error `number`,
/// or `None` to judge it by its SQLSTATE. The SQLSTATE alone does not tell:
/// a lock wait that timed out is HY000, as are many permanent errors, and an
/// error sent before the handshake has none.
#[cfg(feature = "mysql")]
fn mysql_transient(number: u16) -> Option<&'static str> {
    match number {
        // ER_LOCK_WAIT_TIMEOUT: another transaction held a row longer than
        // innodb_lock_wait_timeout.
        1205 => Some("waited too long for a row another transaction holds"),
        // ER_CON_COUNT_ERROR: max_connections reached. ER_TOO_MANY_USER_CONNECTIONS
        // and ER_USER_LIMIT_REACHED: the user's own limit (of connections,
        // or of statements an hour), which a closed connection or the next
        // hour lifts.
        1040 | 1203 | 1226 => Some("has reached a connection or resource limit"),
        // ER_SERVER_SHUTDOWN; MariaDB's ER_CONNECTION_KILLED (KILL, or
        // the server shutting down).
        1053 | 1927 => Some("is shutting down or ended the connection"),
        // ER_OPTION_PREVENTS_STATEMENT (`read_only`), MariaDB's
        // ER_READ_ONLY_MODE, ER_CANT_EXECUTE_IN_READ_ONLY_TRANSACTION: a
        // replica, or a primary set read-only for a switchover, which the
        // next primary lifts.
        1290 | 1836 | 1792 => Some(READ_ONLY),
        _ => None,
    }
}

impl DbError {
    /// What to change after a TLS failure, in this database's URL terms.
    fn tls_hint(&self) -> &'static str {
        if self.backend == "mysql" {
            "check ssl-mode, and that ssl-ca names the CA that signed the server's certificate; \
             with ssl-mode=VERIFY_IDENTITY the URL's host must be a name in that certificate"
        } else {
            "check sslmode, and that sslrootcert names the CA that signed the server's certificate; \
             with sslmode=verify-full the URL's host must be a name in that certificate"
        }
    }
}

/// Why a connection failed in TLS in a way that retrying cannot mend: TLS
/// could not be set up as the URL asks (the server offers none, a CA file is
/// unreadable), the server's certificate was rejected (an unknown CA, a
/// host name it does not name), or the server refused this client's
/// certificate (signed by a CA it does not trust, expired, or missing
/// where it requires one). sqlx reports the first as `Error::Tls` and the
/// others as the I/O error of the handshake, wrapping rustls's.
fn tls_failure(e: &sqlx::Error) -> Option<String> {
    match e {
        sqlx::Error::Tls(t) => Some(t.to_string()),
        #[cfg(feature = "tls")]
        sqlx::Error::Io(io) => {
            use rustls::AlertDescription as A;
            match io.get_ref()?.downcast_ref::<rustls::Error>()? {
                r @ (rustls::Error::InvalidCertificate(_)
                | rustls::Error::NoCertificatesPresented
                | rustls::Error::UnsupportedNameType
                | rustls::Error::InvalidCertRevocationList(_)
                | rustls::Error::PeerIncompatible(_)) => {
                    Some(format!("the server's certificate was rejected: {r}"))
                }
                r @ rustls::Error::AlertReceived(
                    A::UnknownCA
                    | A::BadCertificate
                    | A::CertificateRequired
                    | A::UnsupportedCertificate
                    | A::CertificateRevoked
                    | A::CertificateExpired
                    | A::CertificateUnknown
                    | A::AccessDenied,
                ) => Some(format!(
                    "the server refused this client's certificate ({r}); check sslcert and sslkey \
                     (ssl-cert and ssl-key), and that the server trusts the CA that signed it"
                )),
                _ => None,
            }
        }
        _ => None,
    }
}

/// Refuses, before connecting, a URL that demands TLS (`sslmode=require`
/// and stricter, `ssl-mode=REQUIRED` and stricter) when this build has no
/// TLS (`supported` is false): sqlx would report it only as a failed
/// connection.
#[cfg(any(feature = "postgres", feature = "mysql"))]
fn refuse_tls_without_support(
    backend: &'static str,
    demanded: bool,
    supported: bool,
) -> Result<()> {
    if !demanded || supported {
        return Ok(());
    }
    Err(Error::Unsupported {
        backend,
        operation: if backend == "mysql" {
            "TLS (ssl-mode=REQUIRED, VERIFY_CA or VERIFY_IDENTITY) in a build without the `tls` cargo feature of distlock-sql (`sql-tls` of distlock)"
        } else {
            "TLS (sslmode=require, verify-ca or verify-full) in a build without the `tls` cargo feature of distlock-sql (`sql-tls` of distlock)"
        },
    })
}

/// Makes one connection directly, once, and closes it. A pool retries a
/// refused connect until its acquire timeout, so a server that is not there
/// would take that long to report; a wrong password or a missing database
/// would be reported after it too. When it fails for want of an answer,
/// asks `addr` (`host:port`) whether it speaks another protocol than
/// `own`: a URL with another server's port, which a retry cannot mend.
#[cfg(any(feature = "postgres", feature = "mysql"))]
async fn first_connection<C: sqlx::Connection>(
    options: &<C as sqlx::Connection>::Options,
    err: &DbError,
    timeout: Duration,
    (own, addr): (distlock_core::probe::Protocol, String),
) -> Result<()> {
    let e = match tokio::time::timeout(timeout, C::connect_with(options)).await {
        Ok(Ok(conn)) => {
            // A failed goodbye changes nothing: the pool connects anew.
            let _ = conn.close().await;
            return Ok(());
        }
        Ok(Err(e)) => err.map(e),
        Err(_) => Error::unavailable(
            err.backend,
            format!(
                "{} at {} did not answer within {timeout:?}",
                err.backend, err.endpoint
            ),
            None,
        ),
    };
    if !matches!(e, Error::Unavailable { .. } | Error::Backend { .. }) {
        return Err(e);
    }
    Err(
        match distlock_core::probe::foreign_protocol(&addr, own, timeout).await {
            Some(why) => Error::misconfigured(
                err.backend,
                format!("{} at {}: {why}", err.backend, err.endpoint),
                Some(Box::new(e)),
            ),
            None => e,
        },
    )
}

impl DbError {
    /// What to change, when the server refused the configuration itself:
    /// retrying the same credentials, database or path cannot succeed.
    fn refused_configuration(&self, d: &dyn sqlx::error::DatabaseError) -> Option<&'static str> {
        let message = d.message();
        match d.code().as_deref() {
            // PostgreSQL: no pg_hba.conf line takes a client without TLS
            // (only `hostssl` lines), which it says in the message.
            Some("28000") if message.contains("no encryption") => Some(
                "the server takes this user only over TLS: use sslmode=verify-full with sslrootcert (or require)",
            ),
            // MySQL: access denied, which is also what a user created with
            // REQUIRE SSL gets over a connection without TLS.
            Some("28000") if self.backend == "mysql" => Some(
                "check the user and password in the URL; a user that requires TLS (REQUIRE SSL) is refused this way without it: use ssl-mode=VERIFY_IDENTITY with ssl-ca (or REQUIRED)",
            ),
            // PostgreSQL: wrong password; no such role.
            Some("28P01" | "28000") => Some("check the user and password in the URL"),
            // PostgreSQL: no such database.
            Some("3D000") => Some("check the database name in the URL, or create it"),
            // PostgreSQL: the user may not create or use the lock table.
            Some("42501") => Some("grant the user the privileges in the backend's README"),
            // MySQL shares 42000 with syntax errors: only its messages tell.
            Some("42000") if message.starts_with("Unknown database") => {
                Some("check the database name in the URL, or create it")
            }
            // MySQL and MariaDB show a user only the tables and procedures
            // it has a right on, so one it lacks a listed right on looks
            // absent and the client's CREATE is what the server refuses.
            Some("42000") if message.contains("denied") => Some(
                "grant the user the privileges in the backend's README; the server hides a table or procedure the user lacks a right on, so one missing a right looks absent and is created, which a CREATE denied here can mean",
            ),
            // SQLite: cannot open the file (a directory, no permission), by
            // any of its extended codes (SQLITE_CANTOPEN_ISDIR, 526, say).
            Some(c)
                if self.backend == "sqlite" && c.parse::<i32>().is_ok_and(|c| c & 0xff == 14) =>
            {
                Some("the path must name a file in a directory this process can write")
            }
            // SQLite: a file this process may not write (or `mode=ro`).
            Some(c)
                if self.backend == "sqlite" && c.parse::<i32>().is_ok_and(|c| c & 0xff == 8) =>
            {
                Some("the file must be writable by this process, and opened without mode=ro")
            }
            // SQLite: the file is something else than a database.
            Some(c)
                if self.backend == "sqlite" && c.parse::<i32>().is_ok_and(|c| c & 0xff == 26) =>
            {
                Some("the path must name a SQLite database file, or one that does not exist yet")
            }
            _ => None,
        }
    }
}

/// Aborts a background task when the backend is dropped.
#[cfg(feature = "postgres")]
pub(crate) struct AbortOnDrop(pub(crate) tokio::task::JoinHandle<()>);

#[cfg(feature = "postgres")]
impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) fn ttl_micros(ttl: Duration) -> i64 {
    i64::try_from(ttl.as_micros()).unwrap_or(i64::MAX / 4)
}

pub(crate) fn token_from_db(err: &DbError, t: i64) -> Result<FencingToken> {
    u64::try_from(t)
        .ok()
        .filter(|t| *t > 0)
        .map(FencingToken)
        .ok_or_else(|| {
            Error::backend(
                err.backend,
                format!("lock table returned an invalid token {t}"),
            )
        })
}

/// A leader's value the tables hold: at most [`distlock_core::MAX_VALUE_LEN`]
/// bytes, as core also checks, so that a request made without core is
/// refused before it is sent rather than cut short by the database.
fn checked_value(value: Option<&str>) -> Result<()> {
    match value {
        Some(v) if v.len() > distlock_core::MAX_VALUE_LEN => Err(Error::invalid(
            InputKind::Config,
            format!(
                "an election value is at most {} bytes; this one has {}",
                distlock_core::MAX_VALUE_LEN,
                v.len()
            ),
        )),
        _ => Ok(()),
    }
}

/// A request's holder info as the tables hold it: at most
/// [`distlock_core::MAX_HOLDER_INFO_LEN`] bytes of printable text, as core
/// also checks, so that a request made without core is refused before it
/// is sent rather than cut short (MySQL's `INSERT IGNORE`) or refused by
/// the database.
fn checked_holder(req: &LockRequest) -> Result<()> {
    match &req.holder_info {
        Some(info) => distlock_core::validate_holder_info(info),
        None => Ok(()),
    }
}

/// How long the server lets one of distlock's connections sit idle inside
/// a transaction before it ends the transaction and the connection
/// (PostgreSQL, MariaDB): a client cut off in a transaction's middle holds
/// its rows locked no longer. distlock's transactions send their
/// statements back to back.
#[cfg(any(feature = "postgres", feature = "mysql"))]
const IDLE_IN_TRANSACTION: std::time::Duration = std::time::Duration::from_secs(5);

fn endpoint_of(url: &str) -> String {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let rest = rest.split('?').next().unwrap_or(rest);
    if url.starts_with("sqlite") {
        return rest.to_string();
    }
    let authority = rest.split('/').next().unwrap_or(rest);
    authority
        .rsplit('@')
        .next()
        .unwrap_or(authority)
        .to_string()
}

macro_rules! dispatch {
    ($self:expr, $db:ident => $body:expr) => {
        match &$self.inner.db {
            #[cfg(feature = "postgres")]
            Db::Postgres($db) => $body,
            #[cfg(feature = "mysql")]
            Db::MySql($db) => $body,
            #[cfg(feature = "sqlite")]
            Db::Sqlite($db) => $body,
        }
    };
}

impl SqlBackend {
    /// Connects to `url` (`postgres://`, `postgresql://`, `mysql://`,
    /// `mariadb://` or `sqlite://PATH`), builds a pool and creates the lock
    /// table if needed.
    pub async fn connect(url: &str) -> Result<Self> {
        Self::connect_with(url, SqlConfig::default()).await
    }

    /// [`connect`](Self::connect) with options; URL parameters override them.
    pub async fn connect_with(url: &str, mut config: SqlConfig) -> Result<Self> {
        if !url.starts_with("sqlite") {
            distlock_core::input::check_userinfo_encoded(url, &['/', '?', '#'])?;
            distlock_core::input::check_no_fragment(url)?;
        }
        let url = config.take_url_options(url)?;
        config::validate_table(&config.table)?;
        config.validate()?;
        let scheme = url.split_once(':').map(|(s, _)| s).unwrap_or_default();
        let endpoint = endpoint_of(&url);
        if scheme != "sqlite" {
            config::check_tls_files(&url)?;
        }
        match scheme {
            "postgres" | "postgresql" => Self::connect_postgres(&url, endpoint, config).await,
            "mysql" | "mariadb" => Self::connect_mysql(&url, endpoint, config).await,
            "sqlite" => Self::connect_sqlite(&url, endpoint, config).await,
            _ => Err(Error::invalid(
                InputKind::Url,
                format!("{scheme:?} is not a SQL URL scheme; use postgres://, mysql://, mariadb:// or sqlite://"),
            )),
        }
    }

    async fn build(db: Db, config: SqlConfig, err: DbError) -> Result<Self> {
        let backend = SqlBackend {
            inner: Arc::new(Inner {
                db,
                config,
                err,
                marks: rwlock::Marks::default(),
            }),
        };
        dispatch!(backend, db => db.create_table().await)?;
        Ok(backend)
    }

    #[cfg(not(all(feature = "postgres", feature = "mysql", feature = "sqlite")))]
    fn missing_feature(feature: &str) -> Error {
        Error::invalid(
            InputKind::Url,
            format!("this build of distlock-sql has no {feature} support; enable the `{feature}` cargo feature"),
        )
    }
}

#[cfg(feature = "postgres")]
impl SqlBackend {
    async fn connect_postgres(url: &str, endpoint: String, config: SqlConfig) -> Result<Self> {
        use std::str::FromStr;
        let mut err = DbError {
            backend: "postgres",
            endpoint,
        };
        let options = sqlx::postgres::PgConnectOptions::from_str(url).map_err(|e| err.map(e))?;
        use sqlx::postgres::PgSslMode;
        refuse_tls_without_support(
            "postgres",
            matches!(
                options.get_ssl_mode(),
                PgSslMode::Require | PgSslMode::VerifyCa | PgSslMode::VerifyFull
            ),
            cfg!(feature = "tls"),
        )?;
        // The URL may leave the host to the environment (PGHOST) or default.
        err.endpoint = format!("{}:{}", options.get_host(), options.get_port());
        let probe = (
            distlock_core::probe::Protocol::PostgreSql,
            err.endpoint.clone(),
        );
        first_connection::<sqlx::PgConnection>(&options, &err, config.connect_timeout, probe)
            .await?;
        let pool = sqlx::postgres::PgPoolOptions::new()
            .max_connections(config.pool_size.unwrap_or(10))
            .acquire_timeout(config.connect_timeout)
            // The statements are written for READ COMMITTED, whatever the
            // database's default isolation. Statements, not startup
            // parameters: connection poolers such as PgBouncer refuse those.
            // A transaction left open by a client cut off in its middle (a
            // renewal of several holds, a semaphore's first grant) would
            // keep its rows locked until the server noticed the dead peer,
            // hours later: the server ends it after IDLE_IN_TRANSACTION.
            .after_connect(|conn, _| {
                Box::pin(async move {
                    sqlx::query("SET default_transaction_isolation = 'read committed'")
                        .execute(&mut *conn)
                        .await?;
                    sqlx::query(
                        "SELECT set_config('idle_in_transaction_session_timeout', $1, false)",
                    )
                    .bind(IDLE_IN_TRANSACTION.as_millis().to_string())
                    .execute(&mut *conn)
                    .await
                    .map(|_| ())
                })
            })
            .connect_with(options)
            .await
            .map_err(|e| err.map(e))?;
        Self::postgres(pool, config).await
    }

    /// Uses a PostgreSQL pool you already have.
    pub async fn postgres(pool: sqlx::PgPool, mut config: SqlConfig) -> Result<Self> {
        config::validate_table(&config.table)?;
        config.validate()?;
        // PostgreSQL folds the unquoted table names to lower case, and the
        // notification channels named after them must fold the same way, or
        // clients that spell one table differently miss each other's
        // wake-ups.
        config.table.make_ascii_lowercase();
        // Waiters listen on a connection of the pool, held while they wait
        // (with `fifo`, observers on another): the statements need one more.
        let needed = if config.fifo { 3 } else { 2 };
        let max = pool.options().get_max_connections();
        if max < needed {
            return Err(Error::invalid(
                InputKind::Config,
                format!(
                    "a PostgreSQL pool of {max} connection(s) leaves none for the statements while waiters listen; use pool_size={needed} or more{}",
                    if config.fifo { " with fifo" } else { "" }
                ),
            ));
        }
        let o = pool.connect_options();
        let err = DbError {
            backend: "postgres",
            endpoint: format!("{}:{}", o.get_host(), o.get_port()),
        };
        let fifo = config.fifo.then_some(config.queue_lease);
        let db = Db::Postgres(postgres::Pg::new(pool, &config.table, err.clone(), fifo));
        Self::build(db, config, err).await
    }
}

#[cfg(not(feature = "postgres"))]
impl SqlBackend {
    async fn connect_postgres(_: &str, _: String, _: SqlConfig) -> Result<Self> {
        Err(Self::missing_feature("postgres"))
    }
}

#[cfg(feature = "mysql")]
impl SqlBackend {
    async fn connect_mysql(url: &str, endpoint: String, config: SqlConfig) -> Result<Self> {
        let err = DbError {
            backend: "mysql",
            endpoint,
        };
        use std::str::FromStr;
        let url = url
            .strip_prefix("mariadb:")
            .map_or_else(|| url.to_string(), |rest| format!("mysql:{rest}"));
        let options = sqlx::mysql::MySqlConnectOptions::from_str(&url).map_err(|e| err.map(e))?;
        use sqlx::mysql::MySqlSslMode;
        refuse_tls_without_support(
            "mysql",
            matches!(
                options.get_ssl_mode(),
                MySqlSslMode::Required | MySqlSslMode::VerifyCa | MySqlSslMode::VerifyIdentity
            ),
            cfg!(feature = "tls"),
        )?;
        let probe = (
            distlock_core::probe::Protocol::MySql,
            format!("{}:{}", options.get_host(), options.get_port()),
        );
        first_connection::<sqlx::MySqlConnection>(&options, &err, config.connect_timeout, probe)
            .await?;
        let pool = sqlx::mysql::MySqlPoolOptions::new()
            .max_connections(config.pool_size.unwrap_or(10))
            .acquire_timeout(config.connect_timeout)
            // A transaction left open by a client cut off in its middle
            // keeps its rows locked until the server drops the connection
            // (`wait_timeout`, hours): MariaDB ends it after
            // IDLE_IN_TRANSACTION. MySQL has no such setting.
            .after_connect(|conn, _| {
                Box::pin(async move {
                    let set = sqlx::query("SET SESSION idle_transaction_timeout = ?")
                        .bind(IDLE_IN_TRANSACTION.as_secs());
                    match set.execute(&mut *conn).await {
                        Err(sqlx::Error::Database(e))
                            if e.message().contains("Unknown system variable") =>
                        {
                            Ok(())
                        }
                        other => other.map(|_| ()),
                    }
                })
            })
            .connect_with(options)
            .await
            .map_err(|e| err.map(e))?;
        Self::mysql_with(pool, config, err).await
    }

    /// Uses a MySQL/MariaDB pool you already have.
    pub async fn mysql(pool: sqlx::MySqlPool, config: SqlConfig) -> Result<Self> {
        let err = DbError {
            backend: "mysql",
            endpoint: "(user pool)".into(),
        };
        Self::mysql_with(pool, config, err).await
    }

    async fn mysql_with(pool: sqlx::MySqlPool, config: SqlConfig, err: DbError) -> Result<Self> {
        config::validate_table(&config.table)?;
        config.validate()?;
        let fifo = config.fifo.then_some(config.queue_lease);
        let db = Db::MySql(mysql::My::new(pool, &config.table, err.clone(), fifo));
        Self::build(db, config, err).await
    }
}

#[cfg(not(feature = "mysql"))]
impl SqlBackend {
    async fn connect_mysql(_: &str, _: String, _: SqlConfig) -> Result<Self> {
        Err(Self::missing_feature("mysql"))
    }
}

#[cfg(feature = "sqlite")]
impl SqlBackend {
    async fn connect_sqlite(url: &str, endpoint: String, config: SqlConfig) -> Result<Self> {
        use std::str::FromStr;
        if endpoint.is_empty() {
            return Err(Error::invalid(
                InputKind::Url,
                "sqlite:// needs a file path, e.g. sqlite:///var/lib/app/locks.db",
            ));
        }
        // Each pooled connection would open a database of its own.
        let query = url.split_once('?').map_or("", |(_, q)| q);
        if endpoint.contains(":memory:") || query.split('&').any(|p| p == "mode=memory") {
            return Err(Error::invalid(
                InputKind::Url,
                "an in-memory SQLite database lives inside one connection, and locks need one database for all: name a file (or use memory:// in one process)",
            ));
        }
        let err = DbError {
            backend: "sqlite",
            endpoint,
        };
        // WAL lets readers and one writer work at once, and the busy timeout
        // makes a writer wait for another process instead of failing. FULL
        // syncs the log at every commit: with NORMAL an operating-system
        // crash or a power loss can roll back grants and token counters
        // already handed out, and a token would repeat.
        let options = sqlx::sqlite::SqliteConnectOptions::from_str(url)
            .map_err(|e| err.map(e))?
            .create_if_missing(true)
            .journal_mode(sqlx::sqlite::SqliteJournalMode::Wal)
            .synchronous(sqlx::sqlite::SqliteSynchronous::Full)
            .busy_timeout(config.busy_timeout);
        // Opening a connection switches the file to WAL, which can meet a
        // busy file when many clients start at once: retry like statements.
        let start = Instant::now();
        let pool = loop {
            let attempt = sqlx::sqlite::SqlitePoolOptions::new()
                .max_connections(config.pool_size.unwrap_or(4))
                .acquire_timeout(config.connect_timeout)
                .connect_with(options.clone())
                .await;
            match attempt {
                Err(e) if sqlite::is_busy(&e) && start.elapsed() < Duration::from_secs(10) => {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                other => break other.map_err(|e| err.map(e))?,
            }
        };
        Self::sqlite_with(pool, config, err).await
    }

    /// Uses a SQLite pool you already have. Configure it with WAL mode and a
    /// busy timeout if several processes share the file.
    pub async fn sqlite(pool: sqlx::SqlitePool, config: SqlConfig) -> Result<Self> {
        let endpoint = pool.connect_options().get_filename().display().to_string();
        Self::sqlite_with(
            pool,
            config,
            DbError {
                backend: "sqlite",
                endpoint,
            },
        )
        .await
    }

    async fn sqlite_with(pool: sqlx::SqlitePool, config: SqlConfig, err: DbError) -> Result<Self> {
        config::validate_table(&config.table)?;
        config.validate()?;
        let db = Db::Sqlite(sqlite::Lite::new(pool, &config.table, err.clone()));
        Self::build(db, config, err).await
    }
}

#[cfg(not(feature = "sqlite"))]
impl SqlBackend {
    async fn connect_sqlite(_: &str, _: String, _: SqlConfig) -> Result<Self> {
        Err(Self::missing_feature("sqlite"))
    }
}

impl SqlBackend {
    /// Takes the lock `name` away from its holder, and the election `name`
    /// from its leader, as an operator would. The lock row's owner is
    /// overwritten, so the holder's next renewal is rejected, and the lock
    /// stays taken until its expiry; the election's row is freed at once,
    /// so the leader's next renewal or proclamation is rejected and the
    /// next campaigner leads. Returns whether either was held: a hold
    /// whose lease ran out is nobody's, and is left as it is.
    pub async fn evict(&self, name: &LockName) -> Result<bool> {
        let lock = dispatch!(self, db => db.evict(name.as_str()).await)?;
        let row = election::election_row(name);
        let leader = dispatch!(self, db => db.evict_leader(&row).await)?;
        Ok(lock || leader)
    }

    /// The lock table's name.
    pub fn table(&self) -> &str {
        &self.inner.config.table
    }
}

impl SqlBackend {
    /// What the backend declares for `database` (`postgres`, `mysql` or
    /// `sqlite`), without connecting (for `distlock backends`).
    pub fn declared_capabilities(database: &'static str) -> Capabilities {
        // Only PostgreSQL can notify waiters (LISTEN/NOTIFY); SQLite wakes
        // waiters of the same process, but across processes it polls.
        let waiting = if database == "postgres" {
            Waiting::Notification
        } else {
            Waiting::Polling
        };
        let caps = Capabilities::new(
            database,
            Fencing::Strong,
            Consistency::Cp,
            waiting,
            TrustedClock::Server,
        )
        .with_ttl_range(
            Duration::from_millis(10),
            Duration::from_secs(365 * 24 * 3600),
        )
        .with_semaphore()
        .with_shared()
        .with_elections();
        // Renewals in batches, locks and permits together: one statement
        // of UPDATEs over unnest() arrays on PostgreSQL, one transaction on
        // SQLite and on MySQL (which has no UPDATE ... RETURNING: an update
        // per table over the batch's rows, then a read of which are live).
        match database {
            "postgres" => caps.with_extend_batch(1000),
            "sqlite" => caps.with_extend_batch(256),
            "mysql" => caps.with_extend_batch(500),
            _ => caps,
        }
    }
}

#[async_trait]
impl Backend for SqlBackend {
    fn capabilities(&self) -> Capabilities {
        Self::declared_capabilities(self.inner.err.backend)
    }

    async fn try_acquire(&self, req: &LockRequest) -> Result<Option<Grant>> {
        checked_holder(req)?;
        let began = Instant::now();
        let token = match Object::of(req, &self.inner.err)? {
            Object::Lock | Object::Leader => self
                .attempt_to_completion(req, |b, req| async move {
                    checked_value(election::value(&req))?;
                    let token = dispatch!(b, db => db.try_acquire(&req).await)?;
                    Ok(token.map_or(Outcome::Held(None), Outcome::Granted))
                })
                .await?
                .token(),
            Object::Shared => self.shared_attempt(req, false).await?.token(),
            Object::Semaphore { limit } => self
                .permit_attempt(req, valid_limit(limit)?, false)
                .await?
                .token(),
        };
        Ok(token.map(|t| Grant::new(t, began)))
    }

    async fn acquire(&self, req: &LockRequest, deadline: Option<Instant>) -> Result<Grant> {
        checked_holder(req)?;
        match Object::of(req, &self.inner.err)? {
            Object::Lock => {
                self.wait_queued(req, deadline, false, |first| {
                    self.writer_attempt(req, first)
                })
                .await
            }
            Object::Shared => {
                self.wait_queued(req, deadline, false, |_| self.shared_attempt(req, true))
                    .await
            }
            Object::Leader => {
                checked_value(election::value(req))?;
                self.wait_queued(req, deadline, false, |first| {
                    self.leader_attempt(req, first)
                })
                .await
            }
            Object::Semaphore { limit } => {
                let limit = valid_limit(limit)?;
                self.wait_queued(req, deadline, true, |_| {
                    self.permit_attempt(req, limit, true)
                })
                .await
            }
        }
    }

    /// PostgreSQL: one statement; SQLite and MySQL: one transaction; each
    /// run to completion in a task of its own.
    async fn try_acquire_all(&self, reqs: &[LockRequest]) -> Result<AllAtOnce> {
        // PostgreSQL's wait queue (`fifo`) is read by the single acquire
        // alone: there a multi-lock takes its names one at a time.
        let queued = match &self.inner.db {
            #[cfg(feature = "postgres")]
            Db::Postgres(db) => db.queue.is_some(),
            #[allow(unreachable_patterns)]
            _ => false,
        };
        if queued || reqs.iter().any(|r| r.kind != HoldKind::Exclusive) {
            return Ok(AllAtOnce::NotOffered);
        }
        for r in reqs {
            checked_holder(r)?;
        }
        let began = Instant::now();
        let tokens = self.try_acquire_all_to_completion(reqs).await?;
        Ok(match tokens {
            Some(ts) => AllAtOnce::Granted(ts.into_iter().map(|t| Grant::new(t, began)).collect()),
            None => AllAtOnce::Refused,
        })
    }

    async fn extend(&self, req: &LockRequest) -> Result<bool> {
        match Object::of(req, &self.inner.err)? {
            #[cfg(feature = "mysql")]
            Object::Shared if matches!(self.inner.db, Db::MySql(_)) => {
                let req = req.clone();
                self.on_mysql_to_completion(
                    move |b| async move { b.my()?.shared_extend(&req).await },
                )
                .await
            }
            Object::Shared => dispatch!(self, db => db.shared_extend(req).await),
            _ => dispatch!(self, db => db.extend(req).await),
        }
    }

    async fn deployment_findings(&self) -> Result<Vec<Finding>> {
        Ok(dispatch!(self, db => db.deployment_findings().await))
    }

    async fn extend_many(&self, reqs: &[LockRequest]) -> Result<Vec<bool>> {
        if reqs.iter().any(|r| r.kind == HoldKind::Shared) {
            return self.extend_shared_apart(reqs).await;
        }
        match &self.inner.db {
            #[cfg(feature = "postgres")]
            Db::Postgres(db) => db.extend_many(reqs).await,
            #[cfg(feature = "sqlite")]
            Db::Sqlite(db) => db.extend_many(reqs).await,
            #[cfg(feature = "mysql")]
            Db::MySql(_) => {
                let reqs = reqs.to_vec();
                self.on_mysql_to_completion(
                    move |b| async move { b.my()?.extend_many(&reqs).await },
                )
                .await
            }
        }
    }

    async fn release(&self, req: &LockRequest) -> Result<bool> {
        match Object::of(req, &self.inner.err)? {
            Object::Lock => {
                let held = dispatch!(self, db => db.release(req).await)?;
                // A waiting writer's cleanup: its mark goes too.
                if self.inner.marks.contains(req) {
                    self.unmark(req).await;
                }
                Ok(held)
            }
            Object::Leader => dispatch!(self, db => db.release(req).await),
            #[cfg(feature = "mysql")]
            Object::Shared if matches!(self.inner.db, Db::MySql(_)) => {
                let req = req.clone();
                self.on_mysql_to_completion(
                    move |b| async move { b.my()?.shared_release(&req).await },
                )
                .await
            }
            Object::Shared => dispatch!(self, db => db.shared_release(req).await),
            Object::Semaphore { .. } => dispatch!(self, db => db.permit_release(req).await),
        }
    }

    /// One UPDATE of the election row's value, only while `req.owner`'s
    /// lease is live by the database's clock.
    async fn proclaim(&self, req: &LockRequest, value: &str) -> Result<bool> {
        if !matches!(Object::of(req, &self.inner.err)?, Object::Leader) {
            return Err(Error::invalid(
                InputKind::Config,
                format!(
                    "only a leadership can proclaim; this request is a {}",
                    req.kind
                ),
            ));
        }
        checked_value(Some(value))?;
        dispatch!(self, db => db.proclaim(req, value).await)
    }

    /// One SELECT of the election row while its lease is live by the
    /// database's clock.
    async fn leader(&self, name: &LockName) -> Result<Option<Leader>> {
        let row = election::election_row(name);
        dispatch!(self, db => db.leader(&row).await)
    }

    /// PostgreSQL: notified. It listens first, through the LISTEN
    /// connection on the locks' channel (shared with this backend's
    /// waiters unless they queue), then reads
    /// the leader; again on each notification about the election's row, at
    /// the leader's lease end, and at least every
    /// [`SqlConfig::observe_recheck`]. SQLite and MySQL offer no stream:
    /// core reads `leader` every [`distlock_core::LEADER_POLL`].
    async fn observe_leader(&self, name: &LockName) -> Result<Option<distlock_core::LeaderStream>> {
        match &self.inner.db {
            #[cfg(feature = "postgres")]
            Db::Postgres(pg) => {
                let row = election::election_row(name);
                let listening = pg.listen(postgres::Listener::Observers).await?;
                let signal = pg.leader_changes.get(&row);
                let (backend, name) = (self.clone(), name.clone());
                let read = move || {
                    let (b, name) = (backend.clone(), name.clone());
                    async move { b.leader(&name).await }
                };
                Ok(Some(postgres::observe::leaders(
                    listening,
                    signal,
                    self.inner.config.observe_recheck,
                    read,
                )))
            }
            #[allow(unreachable_patterns)]
            _ => {
                let _ = name;
                Ok(None)
            }
        }
    }

    async fn inspect(&self, name: &LockName) -> Result<LockStatus> {
        // (token, remaining lease in microseconds, exclusive holder's
        // info) of a live holder.
        let row = dispatch!(self, db => db.inspect(name.as_str()).await)?;
        let (shared, writers) = dispatch!(self, db => db.rw_status(name.as_str()).await)?;
        let status = match row {
            Some((token, micros, holder)) => LockStatus::new(true)
                .with_token(token_from_db(&self.inner.err, token).ok())
                .with_remaining(Some(Duration::from_micros(micros.max(0) as u64)))
                .with_holder_info(holder),
            None => LockStatus::new(false),
        };
        Ok(status.with_shared(usize::try_from(shared).unwrap_or(0), writers > 0))
    }

    /// One SELECT per table (locks and leaders, shared holds, permits) of
    /// its live rows whose names fall in the prefix's range, each ordered
    /// as core orders records and cut at `limit` by the database: three
    /// round trips. Each reads every row of its table in the range (an
    /// index range scan of the primary key on SQLite, MySQL and the
    /// PostgreSQL tables this crate creates; a sequential scan on a
    /// PostgreSQL table whose `name` is not `COLLATE "C"`); see the crate
    /// docs ("Holder info and listing").
    async fn list(&self, prefix: &str, limit: usize) -> Result<Vec<HoldRecord>> {
        distlock_core::validate_prefix(prefix)?;
        if limit == 0 {
            return Ok(Vec::new());
        }
        let range = list::NameRange::of(prefix);
        let mut records = dispatch!(self, db => db.list(&range, limit).await)?;
        distlock_core::sort_records(&mut records, limit);
        Ok(records)
    }

    async fn inspect_permits(&self, name: &LockName) -> Result<LockStatus> {
        dispatch!(self, db => db.inspect_permits(name).await)
    }

    async fn set_limit(&self, name: &LockName, limit: u32) -> Result<Option<u32>> {
        let limit = valid_limit(limit)?;
        match &self.inner.db {
            #[cfg(feature = "mysql")]
            Db::MySql(_) => self.mysql_set_limit_to_completion(name, limit).await,
            #[allow(unreachable_patterns)]
            _ => dispatch!(self, db => db.set_limit(name, limit).await),
        }
    }
}

impl SqlBackend {
    /// One attempt at a shared hold, run to completion; `waiting` if it
    /// is one of a wait's (which wants how long an exclusive holder has).
    async fn shared_attempt(&self, req: &LockRequest, waiting: bool) -> Result<Outcome> {
        self.attempt_to_completion(req, move |b, req| async move {
            #[cfg(not(feature = "postgres"))]
            let _ = waiting;
            match &b.inner.db {
                #[cfg(feature = "postgres")]
                Db::Postgres(pg) => pg.shared_attempt(&req, waiting).await,
                #[cfg(feature = "mysql")]
                Db::MySql(my) => my.shared_attempt(&req).await,
                #[cfg(feature = "sqlite")]
                Db::Sqlite(lite) => lite.shared_attempt(&req).await,
            }
        })
        .await
    }

    /// One attempt of a waiting exclusive request, run to completion. If
    /// shared holds refuse it, it marks the name as awaited by a writer (or
    /// renews its mark), so that no new shared hold is granted, and comes
    /// back before the mark would lapse; once granted, its mark goes. An
    /// attempt whose caller stopped waiting removes the mark it placed and
    /// leaves the queue it joined.
    /// `first`: the first attempt of the wait.
    async fn writer_attempt(&self, req: &LockRequest, first: bool) -> Result<Outcome> {
        let (req, undo) = (req.clone(), req.clone());
        self.to_completion(
            move |b| async move {
                let (outcome, readers) = b.lock_attempt_now(&req, first).await?;
                match outcome {
                    Outcome::Granted(_) => {
                        if b.inner.marks.contains(&req) {
                            b.unmark(&req).await;
                        }
                    }
                    Outcome::Held(left) if readers != Some(false) => {
                        let marked = dispatch!(b, db => db.mark(&req).await)?;
                        if marked {
                            b.inner.marks.insert(&req);
                            let renew = req.ttl / 2;
                            let back = left.map_or(renew, |l| l.min(renew));
                            return Ok(Outcome::Held(Some(back)));
                        }
                    }
                    Outcome::Held(_) | Outcome::RetryIn(_) => {}
                }
                Ok(outcome)
            },
            move |b, found| async move {
                match found {
                    Outcome::Granted(_) => b.hand_back(std::slice::from_ref(&undo)).await,
                    _ => {
                        if b.inner.marks.contains(&undo) {
                            b.unmark(&undo).await;
                        }
                        // Queued by the refusal, after its wait was gone.
                        if b.queued() {
                            b.leave_queue(&undo).await;
                        }
                    }
                }
            },
        )
        .await
    }

    /// Removes `req`'s queue entry (PostgreSQL with `fifo`), telling the
    /// next waiter if the lock is free. An entry that stays (the database
    /// is unreachable) lapses after the queue lease.
    async fn leave_queue(&self, req: &LockRequest) {
        #[cfg(feature = "postgres")]
        #[allow(irrefutable_let_patterns)]
        if let Db::Postgres(pg) = &self.inner.db {
            if pg.queue.is_some() {
                if let Err(e) = pg.leave(req).await {
                    tracing::debug!(error = %e, "the queue entry stays until it lapses");
                }
            }
        }
        #[cfg(not(feature = "postgres"))]
        let _ = req;
    }

    /// Whether waiters leave a queue entry behind them in the database
    /// (PostgreSQL with `fifo`, where every kind queues).
    fn queued(&self) -> bool {
        match &self.inner.db {
            #[cfg(feature = "postgres")]
            Db::Postgres(pg) => pg.queue.is_some(),
            #[allow(unreachable_patterns)]
            _ => false,
        }
    }

    /// Removes `req`'s writer mark and wakes the readers it held back. A
    /// mark that stays (the database is unreachable) lapses after the
    /// request's TTL.
    async fn unmark(&self, req: &LockRequest) {
        self.inner.marks.remove(req);
        if let Err(e) = dispatch!(self, db => db.unmark(req).await) {
            tracing::warn!(lock = %req.name, error = %e, "removing a waiting writer's mark failed; it lapses after its TTL");
        }
    }

    /// A renewal batch with shared holds in it: the others as one batch,
    /// then the shared ones side by side (each is a transaction of its own,
    /// or a statement on PostgreSQL, as many at once as the pool serves),
    /// so that many shared holds renew in about the time of one.
    async fn extend_shared_apart(&self, reqs: &[LockRequest]) -> Result<Vec<bool>> {
        let (shared, others): (Vec<_>, Vec<_>) = reqs
            .iter()
            .enumerate()
            .partition(|(_, r)| r.kind == HoldKind::Shared);
        let mut answers = vec![false; reqs.len()];
        if !others.is_empty() {
            let batch: Vec<LockRequest> = others.iter().map(|(_, r)| (*r).clone()).collect();
            for ((i, _), held) in others.iter().zip(self.extend_many(&batch).await?) {
                answers[*i] = held;
            }
        }
        let renewed = futures_util::future::join_all(
            shared
                .iter()
                .map(|(i, r)| async move { (*i, self.extend(r).await) }),
        )
        .await;
        for (i, held) in renewed {
            answers[i] = held?;
        }
        Ok(answers)
    }

    /// One attempt of a waiting campaign: a lock's attempt on the
    /// election's row (on PostgreSQL it marks the row awaited, so that the
    /// leader's release notifies), never a writer's mark.
    async fn leader_attempt(&self, req: &LockRequest, first: bool) -> Result<Outcome> {
        self.attempt_to_completion(req, move |b, req| async move {
            Ok(b.lock_attempt_now(&req, first).await?.0)
        })
        .await
    }

    /// Waits for an exclusive hold, leadership or a permit (`permits`),
    /// `attempt` told whether it is the wait's first. A wait that ends
    /// without a grant removes the writer's mark it placed, then leaves the
    /// queue (PostgreSQL with `fifo`); one that is dropped leaves in a task
    /// of its own.
    async fn wait_queued<F, Fut>(
        &self,
        req: &LockRequest,
        deadline: Option<Instant>,
        permits: bool,
        attempt: F,
    ) -> Result<Grant>
    where
        F: Fn(bool) -> Fut,
        Fut: Future<Output = Result<Outcome>>,
    {
        let mut queued = Queued {
            backend: self,
            req,
            done: false,
            spawner: distlock_core::completion::Spawner::here(),
        };
        let tried = std::sync::atomic::AtomicBool::new(false);
        let granted = self
            .wait(req, deadline, permits, || {
                attempt(!tried.swap(true, std::sync::atomic::Ordering::Relaxed))
            })
            .await;
        if granted.is_err() {
            if self.inner.marks.contains(req) {
                self.unmark(req).await;
            }
            queued.leave().await;
        }
        queued.done = true;
        granted
    }

    /// One attempt at a permit; `waits`: a refusal joins the wait queue
    /// (PostgreSQL with `fifo`).
    async fn permit_attempt(&self, req: &LockRequest, limit: u32, waits: bool) -> Result<Outcome> {
        #[cfg(not(feature = "postgres"))]
        let _ = waits;
        self.attempt_to_completion(req, move |b, req| async move {
            match &b.inner.db {
                #[cfg(feature = "postgres")]
                Db::Postgres(pg) => pg.permit_attempt(&req, limit, waits).await,
                #[cfg(feature = "mysql")]
                Db::MySql(my) => my.permit_attempt(&req, limit).await,
                #[cfg(feature = "sqlite")]
                Db::Sqlite(lite) => lite.permit_attempt(&req, limit).await,
            }
        })
        .await
    }

    /// One attempt at a lock; on PostgreSQL it also answers how long the
    /// holder's lease still runs, and whether shared holds keep it
    /// (elsewhere that is unknown: `None`). `first`: the first attempt of
    /// a wait (PostgreSQL's queue reads the queue only after it).
    async fn lock_attempt_now(
        &self,
        req: &LockRequest,
        first: bool,
    ) -> Result<(Outcome, Option<bool>)> {
        #[cfg(not(feature = "postgres"))]
        let _ = first;
        let held =
            |token: Option<FencingToken>| token.map_or(Outcome::Held(None), Outcome::Granted);
        match &self.inner.db {
            #[cfg(feature = "postgres")]
            Db::Postgres(pg) => pg.attempt(req, first).await.map(|(o, r)| (o, Some(r))),
            #[allow(unreachable_patterns)]
            _ => Ok((
                held(dispatch!(self, db => db.try_acquire(req).await)?),
                None,
            )),
        }
    }

    /// Runs one attempt at `req` to completion (see [`Self::to_completion`]):
    /// a grant that lands after its caller stopped waiting is released at
    /// once, and a refusal that queued the caller (PostgreSQL with `fifo`)
    /// leaves the queue then, after the statement that joined it.
    async fn attempt_to_completion<F, Fut>(&self, req: &LockRequest, attempt: F) -> Result<Outcome>
    where
        F: FnOnce(SqlBackend, LockRequest) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = Result<Outcome>> + Send + 'static,
    {
        let (req, undo) = (req.clone(), req.clone());
        self.to_completion(
            move |b| attempt(b, req),
            move |b, found| async move {
                match found {
                    Outcome::Granted(_) => b.hand_back(std::slice::from_ref(&undo)).await,
                    _ if b.queued() => b.leave_queue(&undo).await,
                    _ => {}
                }
            },
        )
        .await
    }

    /// Retries `attempt` until it grants or the deadline passes, woken by
    /// releases (of permits when `permits`) where the database can say:
    /// PostgreSQL by NOTIFY, SQLite within this process. A freed permit
    /// wakes one waiter of this client; a released lock or a changed limit,
    /// all of them. Each also re-checks when the holder's lease (the
    /// earliest-ending permit) ends.
    async fn wait<F, Fut>(
        &self,
        req: &LockRequest,
        deadline: Option<Instant>,
        permits: bool,
        attempt: F,
    ) -> Result<Grant>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<Outcome>>,
    {
        let config = &self.inner.config;
        let name = &req.name;
        // Waiters are woken per row: an election's are apart from its
        // namesake lock's.
        let key = election::row(req);
        #[cfg(not(any(feature = "postgres", feature = "sqlite")))]
        let _ = (permits, &key);
        match &self.inner.db {
            #[cfg(feature = "postgres")]
            Db::Postgres(pg) => {
                // A queued waiter is woken by the notifications addressed
                // to it alone, and comes back by itself only to renew its
                // entry.
                let (signals, key, fallback) = match pg.queue.as_ref() {
                    Some(q) => (
                        &pg.releases,
                        postgres::queue::Queue::waiter_key(req),
                        q.renew_every(),
                    ),
                    None if permits => (
                        &pg.permit_releases,
                        key.into_owned(),
                        config.notify_fallback,
                    ),
                    None => (&pg.releases, key.into_owned(), config.notify_fallback),
                };
                let mut wakeups = wait::Listened::new(pg, signals.get(&key));
                let pace = Pace::Notified {
                    unknown: fallback,
                    cap: fallback,
                };
                wait_for_grant(name, deadline, pace, &mut wakeups, attempt).await
            }
            #[cfg(feature = "mysql")]
            Db::MySql(my) => match my.queue.as_ref() {
                // Queued: woken by the head's sleep inside the server, which
                // a release interrupts; the timer is only a safety net.
                Some(queue) => {
                    let mut turn = queue.turn(req);
                    let pace = Pace::Notified {
                        unknown: queue.recheck(),
                        cap: queue.recheck(),
                    };
                    let granted = wait_for_grant(name, deadline, pace, &mut turn, attempt).await;
                    turn.leave().await;
                    granted
                }
                // Polls: nothing announces a release.
                None => {
                    let pace = Pace::Backoff(config.poll);
                    wait_for_grant(
                        name,
                        deadline,
                        pace,
                        &mut distlock_core::wait::NoWakeups,
                        attempt,
                    )
                    .await
                }
            },
            #[cfg(feature = "sqlite")]
            Db::Sqlite(lite) => {
                let signals = if permits {
                    &lite.permit_releases
                } else {
                    &lite.releases
                };
                let mut wakeups = distlock_core::wait::Signalled::new(signals.get(&key));
                let pace = Pace::Backoff(config.poll);
                wait_for_grant(name, deadline, pace, &mut wakeups, attempt).await
            }
        }
    }
}

/// Requests that finish even when the caller stops waiting: run in the
/// caller's task, and moved to a task of their own if it drops them
/// ([`distlock_core::completion`]). A grant that lands after its caller
/// stopped waiting is handed back at once by that task: the caller's
/// cleanup release, on another pooled connection, could otherwise run
/// before a statement or commit still in flight lands, and the lock would
/// stay held until its TTL.
/// And sqlx's MySQL `begin` has no guard against being dropped: a future
/// dropped while `START TRANSACTION` is on the wire leaves the server in a
/// transaction that sqlx does not know of, on a pooled connection whose next
/// statements (anyone's) would then never commit.
impl SqlBackend {
    /// Runs `work` to completion; if nobody waits for its answer any more,
    /// `undo` gets it.
    async fn to_completion<T, W, WF, U, UF>(&self, work: W, undo: U) -> Result<T>
    where
        T: Send + 'static,
        W: FnOnce(SqlBackend) -> WF + Send + 'static,
        WF: std::future::Future<Output = Result<T>> + Send + 'static,
        U: FnOnce(SqlBackend, T) -> UF + Send + 'static,
        UF: std::future::Future<Output = ()> + Send + 'static,
    {
        let backend = self.clone();
        distlock_core::completion::to_completion(work(self.clone()), move |found| async move {
            if let Ok(orphan) = found {
                undo(backend, orphan).await;
            }
        })
        .await
    }

    /// Releases locks granted after their acquire was dropped.
    async fn hand_back(&self, reqs: &[LockRequest]) {
        for req in reqs {
            if let Err(e) = self.release(req).await {
                tracing::warn!(lock = %req.name, error = %e, "releasing a lock granted after its acquire was dropped failed; it frees after its TTL");
            }
        }
    }

    /// Every lock of `reqs` at once, or none, run to completion.
    async fn try_acquire_all_to_completion(
        &self,
        reqs: &[LockRequest],
    ) -> Result<Option<Vec<FencingToken>>> {
        let reqs = reqs.to_vec();
        let undo = reqs.clone();
        self.to_completion(
            move |b| async move { dispatch!(b, db => db.try_acquire_all(&reqs).await) },
            move |b, granted| async move {
                if granted.is_some() {
                    b.hand_back(&undo).await;
                }
            },
        )
        .await
    }

    /// `work` on the MySQL database, run to completion: for a transaction
    /// that is not one of the attempts above (a renewal, a shared hold's
    /// extend or release), whose caller gives up at a deadline.
    #[cfg(feature = "mysql")]
    async fn on_mysql_to_completion<T, W, WF>(&self, work: W) -> Result<T>
    where
        T: Send + 'static,
        W: FnOnce(SqlBackend) -> WF + Send + 'static,
        WF: std::future::Future<Output = Result<T>> + Send + 'static,
    {
        self.to_completion(work, |_, _| async {}).await
    }

    /// The MySQL database (the callers above check it is one).
    #[cfg(feature = "mysql")]
    fn my(&self) -> Result<&mysql::My> {
        match &self.inner.db {
            Db::MySql(my) => Ok(my),
            #[allow(unreachable_patterns)]
            _ => Err(Error::backend(
                self.inner.err.backend,
                "not a MySQL database",
            )),
        }
    }

    #[cfg(feature = "mysql")]
    async fn mysql_set_limit_to_completion(
        &self,
        name: &LockName,
        limit: u32,
    ) -> Result<Option<u32>> {
        let name = name.clone();
        self.to_completion(
            move |b| async move {
                match &b.inner.db {
                    Db::MySql(my) => my.set_limit(&name, limit).await,
                    #[allow(unreachable_patterns)]
                    _ => Ok(None),
                }
            },
            |_, _| async {},
        )
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(feature = "postgres")]
    #[test]
    fn the_published_requests_check_the_table_name() {
        for bad in ["locks; DROP TABLE x", "a.b", ""] {
            assert!(requests::postgres_try_acquire(bad).is_err(), "{bad:?}");
            assert!(requests::postgres_release(bad).is_err(), "{bad:?}");
            assert!(requests::postgres_channel(bad).is_err(), "{bad:?}");
        }
        let take = requests::postgres_try_acquire("my_locks").expect("a valid name");
        assert!(take.starts_with("INSERT INTO my_locks "), "{take}");
        let release = requests::postgres_release("my_locks").expect("a valid name");
        assert!(
            release.contains("UPDATE my_locks SET owner = NULL"),
            "{release}"
        );
        assert_eq!(
            requests::postgres_channel("my_locks").expect("a valid name"),
            "distlock_my_locks"
        );
    }

    #[cfg(any(feature = "postgres", feature = "mysql"))]
    #[tokio::test]
    async fn a_url_with_a_fragment_is_refused_before_connecting() {
        for url in [
            "postgres://u:p@127.0.0.1:1/db#x",
            "mysql://u:p@127.0.0.1:1/db?ssl-mode=DISABLED#x",
        ] {
            match SqlBackend::connect(url).await {
                Err(Error::InvalidInput { .. }) => {}
                Err(e) => panic!("{url}: {e}"),
                Ok(_) => panic!("{url}: connected"),
            }
        }
    }

    #[test]
    fn holder_info_the_tables_cannot_hold_is_refused_before_sending() {
        let name = LockName::new("a").unwrap();
        let req = |info: Option<&str>| {
            LockRequest::new(name.clone(), Duration::from_secs(1))
                .with_holder_info(info.map(Arc::from))
        };
        assert!(checked_holder(&req(None)).is_ok());
        assert!(checked_holder(&req(Some("web-1 pid 7"))).is_ok());
        let long = "x".repeat(distlock_core::MAX_HOLDER_INFO_LEN + 1);
        for bad in [long.as_str(), "a\nb", ""] {
            let e = checked_holder(&req(Some(bad))).unwrap_err();
            assert!(matches!(e, Error::InvalidInput { .. }), "{e:?}");
        }
    }

    #[test]
    fn endpoints_never_carry_credentials() {
        assert_eq!(
            endpoint_of("postgres://u:secret@db:5432/x?sslmode=off"),
            "db:5432"
        );
        assert_eq!(
            endpoint_of("mysql://root@127.0.0.1:3306/distlock"),
            "127.0.0.1:3306"
        );
        assert_eq!(
            endpoint_of("sqlite:///var/lib/x.db?mode=rwc"),
            "/var/lib/x.db"
        );
    }

    #[cfg(any(feature = "postgres", feature = "mysql"))]
    #[test]
    fn demanding_tls_without_it_is_unsupported() {
        for backend in ["postgres", "mysql"] {
            let e = refuse_tls_without_support(backend, true, false).unwrap_err();
            assert!(matches!(e, Error::Unsupported { .. }), "{e:?}");
            assert!(!e.is_retryable());
            assert!(e.to_string().contains("`tls` cargo feature"), "{e}");
            assert!(refuse_tls_without_support(backend, true, true).is_ok());
            assert!(refuse_tls_without_support(backend, false, false).is_ok());
        }
    }

    /// Nothing listens on port 1: with TLS built in the URL is tried and
    /// fails as unreachable; without it, it is refused before connecting.
    #[cfg(feature = "postgres")]
    #[tokio::test]
    async fn a_url_demanding_tls_is_refused_without_it_before_connecting() {
        let url = "postgres://u:hunter2@127.0.0.1:1/db?sslmode=require";
        let e = SqlBackend::connect(url).await.unwrap_err();
        if cfg!(feature = "tls") {
            assert!(matches!(e, Error::Unavailable { .. }), "{e:?}");
        } else {
            assert!(matches!(e, Error::Unsupported { .. }), "{e:?}");
        }
        assert!(!e.to_string().contains("hunter2"), "{e}");
    }

    #[cfg(feature = "mysql")]
    #[test]
    fn mysql_errors_another_moment_can_mend_are_told_by_number() {
        for number in [1205, 1040, 1203, 1226, 1053, 1927, 1290, 1836, 1792] {
            assert!(mysql_transient(number).is_some(), "{number}");
        }
        for number in [1062, 1146, 1064, 1366, 1105] {
            assert!(mysql_transient(number).is_none(), "{number}");
        }
    }

    /// A database error with only a code, as a driver reports it.
    #[derive(Debug)]
    struct Coded(&'static str);

    impl fmt::Display for Coded {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            write!(f, "error {}", self.0)
        }
    }

    impl std::error::Error for Coded {}

    impl sqlx::error::DatabaseError for Coded {
        fn message(&self) -> &str {
            "error"
        }
        fn code(&self) -> Option<std::borrow::Cow<'_, str>> {
            Some(self.0.into())
        }
        fn as_error(&self) -> &(dyn std::error::Error + Send + Sync + 'static) {
            self
        }
        fn as_error_mut(&mut self) -> &mut (dyn std::error::Error + Send + Sync + 'static) {
            self
        }
        fn into_error(self: Box<Self>) -> Box<dyn std::error::Error + Send + Sync + 'static> {
            self
        }
        fn kind(&self) -> sqlx::error::ErrorKind {
            sqlx::error::ErrorKind::Other
        }
    }

    /// Whether `backend` maps the database error `code` as retryable.
    fn retryable(backend: &'static str, code: &'static str) -> bool {
        let err = DbError {
            backend,
            endpoint: "db".into(),
        };
        let e = err.map(sqlx::Error::Database(Box::new(Coded(code))));
        assert!(
            matches!(e, Error::Unavailable { .. } | Error::Backend { .. }),
            "{code}: {e:?}"
        );
        e.is_retryable()
    }

    #[test]
    fn postgres_errors_another_moment_can_mend_are_retryable() {
        for code in [
            "53300", "57P01", "57P02", "57P03", "08000", "08001", "08003", "08004", "08006",
            "40001", "40P01", "55P03", "57014", "25006",
        ] {
            assert!(retryable("postgres", code), "{code}");
        }
        for code in ["23505", "42P01", "22001", "53100", "5", "6", "08P01"] {
            assert!(!retryable("postgres", code), "{code}");
        }
    }

    #[test]
    fn a_sqlite_file_that_cannot_be_opened_is_misconfigured_by_any_extended_code() {
        // SQLITE_CANTOPEN, _NOTEMPDIR, _ISDIR, _FULLPATH, _CONVPATH.
        for code in ["14", "270", "526", "782", "1038"] {
            let err = DbError {
                backend: "sqlite",
                endpoint: "x.db".into(),
            };
            let e = err.map(sqlx::Error::Database(Box::new(Coded(code))));
            assert!(matches!(e, Error::Misconfigured { .. }), "{code}: {e:?}");
        }
    }

    #[test]
    fn sqlite_busy_and_locked_are_retryable_with_their_extended_codes() {
        // SQLITE_BUSY, _RECOVERY, _SNAPSHOT, _TIMEOUT; SQLITE_LOCKED,
        // _SHAREDCACHE, _VTAB.
        for code in ["5", "261", "517", "773", "6", "262", "518"] {
            assert!(retryable("sqlite", code), "{code}");
        }
        // SQLITE_ERROR, SQLITE_CONSTRAINT_UNIQUE, SQLITE_IOERR_WRITE,
        // SQLITE_FULL.
        for code in ["1", "2067", "778", "13"] {
            assert!(!retryable("sqlite", code), "{code}");
        }
        // SQLITE_READONLY (and _DIRECTORY), SQLITE_NOTADB: the file, not
        // the moment: retrying cannot help.
        let err = DbError {
            backend: "sqlite",
            endpoint: "db".into(),
        };
        for code in ["8", "1544", "26"] {
            let e = err.map(sqlx::Error::Database(Box::new(Coded(code))));
            assert!(matches!(e, Error::Misconfigured { .. }), "{code}: {e:?}");
        }
    }

    #[test]
    fn tls_setup_failures_are_not_retryable() {
        let err = DbError {
            backend: "postgres",
            endpoint: "db:5432".into(),
        };
        let e = err.map(sqlx::Error::Tls("server does not support TLS".into()));
        assert!(matches!(e, Error::Misconfigured { .. }), "{e:?}");
        assert!(e.to_string().contains("TLS failed"), "{e}");
        assert!(e.to_string().contains("sslrootcert"), "{e}");
    }

    #[cfg(feature = "tls")]
    #[test]
    fn rejected_certificates_are_not_retryable() {
        let err = DbError {
            backend: "mysql",
            endpoint: "db:3306".into(),
        };
        let rustls = rustls::Error::InvalidCertificate(rustls::CertificateError::UnknownIssuer);
        let io = std::io::Error::new(std::io::ErrorKind::InvalidData, rustls);
        let e = err.map(sqlx::Error::Io(io));
        assert!(matches!(e, Error::Misconfigured { .. }), "{e:?}");
        assert!(e.to_string().contains("certificate was rejected"), "{e}");
        assert!(e.to_string().contains("ssl-ca"), "{e}");
        let reset = std::io::Error::from(std::io::ErrorKind::ConnectionReset);
        assert!(err.map(sqlx::Error::Io(reset)).is_retryable());
    }

    /// The server's alert that it refused this client's certificate is a
    /// configuration to change, not a failure to retry.
    #[cfg(feature = "tls")]
    #[test]
    fn a_client_certificate_the_server_refuses_is_not_retryable() {
        let err = DbError {
            backend: "postgres",
            endpoint: "db:5432".into(),
        };
        for alert in [
            rustls::AlertDescription::UnknownCA,
            rustls::AlertDescription::CertificateRequired,
            rustls::AlertDescription::BadCertificate,
        ] {
            let io = std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                rustls::Error::AlertReceived(alert),
            );
            let e = err.map(sqlx::Error::Io(io));
            assert!(matches!(e, Error::Misconfigured { .. }), "{alert:?}: {e:?}");
            assert!(
                e.to_string().contains("refused this client's certificate"),
                "{e}"
            );
        }
        let io = std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            rustls::Error::AlertReceived(rustls::AlertDescription::CloseNotify),
        );
        assert!(err.map(sqlx::Error::Io(io)).is_retryable());
    }
}
