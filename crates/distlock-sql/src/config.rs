//! Configuration and URL options.

use std::time::Duration;

use distlock_core::wait::Backoff;
use distlock_core::{Error, InputKind, Result};

/// Options for [`SqlBackend`](crate::SqlBackend).
///
/// URL query parameters set the same options:
///
/// | parameter | meaning | default |
/// |---|---|---|
/// | `table` | lock table name (`[A-Za-z_][A-Za-z0-9_]*`, at most 54 characters; PostgreSQL folds it to lower case, as it does every unquoted name, and so do the notification channels named after it); semaphores live in `<table>_sems` and `<table>_permits`, shared holds in `<table>_shared` and `<table>_writers` | `distlock_locks` |
/// | `pool_size` | connections in the pool the backend builds (PostgreSQL: at least 2, 3 with `fifo`, as waiters listen on one) | 10 (SQLite: 4) |
/// | `observe_recheck_ms` | PostgreSQL: an election's observer reads the leader at least this often, besides each notification and each lease end | 1000 |
/// | `fifo` | PostgreSQL: `true` queues waiting exclusive requests, readers, campaigns and semaphore waiters in the table `<table>_queue` and grants them in arrival order, a release, resignation or eviction notifying only the queue's head (a freed permit, only the waiter it is for) (an uncontended acquire then costs more: +0.28 on the uncontended ratio, docs/benchmarks.md). MySQL/MariaDB: `true` queues them inside the server, each waiter on a connection of its own blocked in `GET_LOCK`, and a release wakes only the queue's head, with `KILL QUERY` (the crate docs say what that needs). `false`: PostgreSQL's release notifies every waiter and MySQL's waiters poll; the first to ask wins | `false` |
/// | `queue_lease_ms` | PostgreSQL: how long a waiter's queue entry outlives its last attempt (a waiter renews it every third of this). MySQL/MariaDB: how long the server keeps a waiter's silent queue connection (its `wait_timeout`, whole seconds, at least 1). Either way a killed or cut-off waiter holds up the queue at most about this long | 3000 |
///
/// Every other parameter is passed to sqlx unchanged: for example `sslmode`
/// and `sslrootcert` on PostgreSQL, `ssl-mode` and `ssl-ca` on MySQL (TLS
/// needs the `tls` feature; see the crate docs), `mode` on SQLite.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct SqlConfig {
    /// The lock table; created on first use.
    pub table: String,
    /// Pool size when the backend builds the pool from a URL.
    pub pool_size: Option<u32>,
    /// How long to wait for a pooled connection before reporting the
    /// database unavailable.
    pub connect_timeout: Duration,
    /// SQLite: how long a statement waits for another process's write lock.
    pub busy_timeout: Duration,
    /// MySQL and SQLite waiters: backoff between attempts.
    pub poll: Backoff,
    /// PostgreSQL waiters: the longest sleep between attempts when no
    /// notification arrives (a lost NOTIFY, a reconnecting listener).
    pub notify_fallback: Duration,
    /// PostgreSQL: the longest an election's observer goes without reading
    /// the leader when no notification arrives and no lease ends (a
    /// notification lost while the LISTEN connection reconnects). Greater
    /// than zero.
    pub observe_recheck: Duration,
    /// PostgreSQL and MySQL/MariaDB: whether waiting exclusive requests
    /// and campaigns queue, first come, first served.
    pub fifo: bool,
    /// PostgreSQL: how long a waiter's queue entry outlives its last
    /// attempt; at least 30 ms. MySQL/MariaDB: how long the server keeps a
    /// silent waiter's queue connection (whole seconds, at least one).
    pub queue_lease: Duration,
}

impl Default for SqlConfig {
    fn default() -> Self {
        Self {
            table: "distlock_locks".into(),
            pool_size: None,
            connect_timeout: Duration::from_secs(5),
            busy_timeout: Duration::from_secs(5),
            poll: Backoff::new(Duration::from_millis(5), Duration::from_millis(250)),
            notify_fallback: Duration::from_secs(1),
            observe_recheck: Duration::from_secs(1),
            fifo: false,
            queue_lease: Duration::from_secs(3),
        }
    }
}

impl SqlConfig {
    /// Sets the lock table name.
    pub fn with_table(mut self, table: impl Into<String>) -> Self {
        self.table = table.into();
        self
    }

    /// Sets the pool size used when building a pool from a URL.
    pub fn with_pool_size(mut self, n: u32) -> Self {
        self.pool_size = Some(n);
        self
    }

    /// Sets the waiters' polling backoff (MySQL, SQLite).
    pub fn with_poll(mut self, poll: Backoff) -> Self {
        self.poll = poll;
        self
    }

    /// Sets how often an election's observer reads the leader when no
    /// notification arrives and no lease ends (PostgreSQL).
    pub fn with_observe_recheck(mut self, every: Duration) -> Self {
        self.observe_recheck = every;
        self
    }

    /// Sets whether waiting exclusive requests and campaigns queue, first
    /// come, first served (PostgreSQL, MySQL/MariaDB).
    pub fn with_fifo(mut self, fifo: bool) -> Self {
        self.fifo = fifo;
        self
    }

    /// Sets how long a waiter's queue entry outlives its last attempt
    /// (PostgreSQL), or how long the server keeps a silent waiter's queue
    /// connection (MySQL/MariaDB).
    pub fn with_queue_lease(mut self, lease: Duration) -> Self {
        self.queue_lease = lease;
        self
    }

    /// Refuses settings no backend can work with.
    pub(crate) fn validate(&self) -> Result<()> {
        distlock_core::wait::check_queue_lease(self.queue_lease)?;
        if self.observe_recheck.is_zero() {
            return Err(Error::invalid(
                InputKind::Config,
                "observe_recheck must be greater than zero",
            ));
        }
        Ok(())
    }

    /// Takes distlock's own parameters out of `url`, returning the URL that
    /// sqlx should see.
    pub(crate) fn take_url_options(&mut self, url: &str) -> Result<String> {
        let Some((base, query)) = url.split_once('?') else {
            return Ok(url.to_string());
        };
        let mut rest = Vec::new();
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            match k {
                "table" => self.table = v.to_string(),
                "pool_size" => {
                    let n = v.parse().ok().filter(|n| *n > 0).ok_or_else(|| {
                        Error::invalid(
                            InputKind::Url,
                            format!("pool_size={v:?} is not a positive integer"),
                        )
                    })?;
                    self.pool_size = Some(n);
                }
                "observe_recheck_ms" => {
                    let ms = v.parse().ok().filter(|n| *n > 0).ok_or_else(|| {
                        Error::invalid(
                            InputKind::Url,
                            format!("observe_recheck_ms={v:?} is not a positive integer"),
                        )
                    })?;
                    self.observe_recheck = Duration::from_millis(ms);
                }
                "fifo" => {
                    self.fifo = match v {
                        "true" | "1" => true,
                        "false" | "0" => false,
                        _ => {
                            return Err(Error::invalid(
                                InputKind::Url,
                                format!("fifo={v:?} is not true or false"),
                            ))
                        }
                    }
                }
                "queue_lease_ms" => {
                    let ms = v.parse().map_err(|_| {
                        Error::invalid(
                            InputKind::Url,
                            format!("queue_lease_ms={v:?} is not a number"),
                        )
                    })?;
                    self.queue_lease = Duration::from_millis(ms);
                }
                _ => rest.push(pair),
            }
        }
        Ok(if rest.is_empty() {
            base.to_string()
        } else {
            format!("{base}?{}", rest.join("&"))
        })
    }
}

/// Checks that the certificate and key files a PostgreSQL or MySQL URL names
/// (`sslrootcert`, `ssl-ca`, `sslcert`, `sslkey` and their spellings) can be
/// read, so that a wrong path is reported as such before connecting rather
/// than as a failed connection. A value holding a PEM certificate itself is
/// not a path.
pub(crate) fn check_tls_files(url: &str) -> Result<()> {
    let Some((_, query)) = url.split_once('?') else {
        return Ok(());
    };
    for pair in query.split('&') {
        let Some((k, v)) = pair.split_once('=') else {
            continue;
        };
        let is_file = matches!(
            k,
            "sslrootcert"
                | "ssl-root-cert"
                | "ssl-ca"
                | "sslca"
                | "sslcert"
                | "ssl-cert"
                | "sslkey"
                | "ssl-key"
        );
        let path = percent_decode(v);
        if !is_file || path.trim_start().starts_with("-----BEGIN") {
            continue;
        }
        if let Err(e) = std::fs::File::open(&path) {
            return Err(Error::invalid(
                InputKind::Url,
                format!("{k}={path:?} cannot be read: {e}"),
            ));
        }
    }
    Ok(())
}

/// Decodes `%XX` escapes and `+` as a URL query does.
fn percent_decode(v: &str) -> String {
    let bytes = v.as_bytes();
    let hex = |i: usize| bytes.get(i).and_then(|b| (*b as char).to_digit(16));
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match (bytes[i], hex(i + 1), hex(i + 2)) {
            (b'%', Some(h), Some(l)) => {
                // Two hex digits make at most 255.
                out.push(u8::try_from(h * 16 + l).unwrap_or(b'?'));
                i += 3;
                continue;
            }
            (b'+', _, _) => out.push(b' '),
            (b, _, _) => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Longest lock table name: room for the `distlock_` prefix of PostgreSQL's
/// notification channel and for the semaphore and read-write lock tables'
/// suffixes within the databases' identifier limit.
const MAX_TABLE_LEN: usize = 54;

/// PostgreSQL's identifier limit (NAMEDATALEN - 1; it silently truncates
/// longer names, so two tables could become one); MySQL's is 64.
const MAX_IDENTIFIER_LEN: usize = 63;

/// Checks a table name, which is interpolated into SQL and so must be a
/// plain identifier (no quoting, no schema, nothing to inject), and the
/// names derived from it (the semaphore and read-write lock tables)
/// likewise.
pub(crate) fn validate_table(table: &str) -> Result<()> {
    let derived = crate::semaphore::PermitTables::for_lock_table(table);
    let rw = crate::rwlock::RwTables::for_lock_table(table);
    let ok = table.len() <= MAX_TABLE_LEN
        && is_identifier(table)
        && derived
            .names()
            .iter()
            .chain(rw.names().iter())
            .all(|t| t.len() <= MAX_IDENTIFIER_LEN && is_identifier(t));
    if ok {
        Ok(())
    } else {
        Err(Error::invalid(
            InputKind::Config,
            format!("table name {table:?} must match [A-Za-z_][A-Za-z0-9_]* and be at most {MAX_TABLE_LEN} characters"),
        ))
    }
}

fn is_identifier(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn url_options_are_taken_out() {
        let mut c = SqlConfig::default();
        let url = c
            .take_url_options("postgres://h/db?table=jobs_locks&sslmode=disable&pool_size=3")
            .unwrap();
        assert_eq!(url, "postgres://h/db?sslmode=disable");
        assert_eq!(c.table, "jobs_locks");
        assert_eq!(c.pool_size, Some(3));
        assert!(c.take_url_options("sqlite://x?pool_size=zero").is_err());
    }

    #[test]
    fn the_observers_recheck_is_a_positive_number_of_milliseconds() {
        let mut c = SqlConfig::default();
        assert_eq!(c.observe_recheck, Duration::from_secs(1));
        let url = c
            .take_url_options("postgres://h/db?observe_recheck_ms=60000&sslmode=disable")
            .unwrap();
        assert_eq!(url, "postgres://h/db?sslmode=disable");
        assert_eq!(c.observe_recheck, Duration::from_secs(60));
        assert!(c.validate().is_ok());
        for bad in ["0", "-1", "soon", ""] {
            let e = SqlConfig::default()
                .take_url_options(&format!("postgres://h/db?observe_recheck_ms={bad}"))
                .unwrap_err();
            assert!(
                matches!(
                    e,
                    Error::InvalidInput {
                        kind: InputKind::Url,
                        ..
                    }
                ),
                "{bad}: {e:?}"
            );
        }
        let e = SqlConfig::default()
            .with_observe_recheck(Duration::ZERO)
            .validate()
            .unwrap_err();
        assert!(
            matches!(
                e,
                Error::InvalidInput {
                    kind: InputKind::Config,
                    ..
                }
            ),
            "{e:?}"
        );
    }

    #[test]
    fn unreadable_tls_files_are_reported_before_connecting() {
        let missing =
            "postgres://u:hunter2@h/db?sslmode=verify-full&sslrootcert=/no/such%20dir/ca.pem";
        let e = check_tls_files(missing).unwrap_err();
        let text = e.to_string();
        assert!(
            matches!(
                e,
                Error::InvalidInput {
                    kind: InputKind::Url,
                    ..
                }
            ),
            "{e:?}"
        );
        assert!(
            text.contains("sslrootcert=\"/no/such dir/ca.pem\""),
            "{text}"
        );
        assert!(!text.contains("hunter2"), "{text}");
        assert!(check_tls_files("mysql://h/db?ssl-ca=/no/ca.pem").is_err());
        let readable = format!(
            "mysql://h/db?ssl-mode=VERIFY_CA&ssl-ca={}/Cargo.toml",
            env!("CARGO_MANIFEST_DIR")
        );
        assert!(check_tls_files(&readable).is_ok());
        assert!(
            check_tls_files("postgres://h/db?sslrootcert=-----BEGIN%20CERTIFICATE-----").is_ok()
        );
        assert!(check_tls_files("postgres://h/db?sslmode=require").is_ok());
    }

    #[test]
    fn tls_options_pass_through_to_sqlx() {
        let mut c = SqlConfig::default();
        let url = "postgres://h/db?sslmode=verify-full&table=t&sslrootcert=/ca.pem";
        assert_eq!(
            c.take_url_options(url).unwrap(),
            "postgres://h/db?sslmode=verify-full&sslrootcert=/ca.pem"
        );
        let url = "mysql://h/db?ssl-mode=VERIFY_IDENTITY&ssl-ca=/ca.pem&pool_size=2";
        assert_eq!(
            c.take_url_options(url).unwrap(),
            "mysql://h/db?ssl-mode=VERIFY_IDENTITY&ssl-ca=/ca.pem"
        );
    }

    #[test]
    fn table_names_are_identifiers() {
        for ok in ["locks", "_l", "distlock_locks_2"] {
            assert!(validate_table(ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            "1locks",
            "locks; DROP TABLE x",
            "a.b",
            "\"q\"",
            &"x".repeat(55),
        ] {
            assert!(validate_table(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn semaphore_tables_of_the_longest_table_name_fit_every_database() {
        let longest = "t".repeat(MAX_TABLE_LEN);
        assert!(validate_table(&longest).is_ok());
        let derived = crate::semaphore::PermitTables::for_lock_table(&longest);
        for name in derived.names() {
            assert!(name.len() <= MAX_IDENTIFIER_LEN, "{name}");
            assert!(is_identifier(name), "{name}");
        }
    }
}
