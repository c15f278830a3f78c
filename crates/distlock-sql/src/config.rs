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
/// | `pool_size` | connections in the pool the backend builds, at most 1000 (PostgreSQL: at least 2, 3 with `fifo`, as waiters listen on one) | 10 (SQLite: 4) |
/// | `observe_recheck_ms` | PostgreSQL: an election's observer reads the leader at least this often, besides each notification and each lease end; 1 to 3600000 | 1000 |
/// | `fifo` | PostgreSQL: `true` queues waiting exclusive requests, readers, campaigns and semaphore waiters in the table `<table>_queue` and grants them in arrival order, a release, resignation or eviction notifying only the queue's head (a freed permit, only the waiter it is for) (an uncontended acquire then costs more: +0.28 on the uncontended ratio, docs/benchmarks.md). MySQL/MariaDB: `true` queues them inside the server, each waiter on a connection of its own blocked in `GET_LOCK`, and a release wakes only the queue's head, with `KILL QUERY` (the crate docs say what that needs). `false`: PostgreSQL's release notifies every waiter and MySQL's waiters poll; the first to ask wins | `false` |
/// | `queue_lease_ms` | PostgreSQL: how long a waiter's queue entry outlives its last attempt (a waiter renews it every third of this). MySQL/MariaDB: how long the server keeps a waiter's silent queue connection (its `wait_timeout`, whole seconds, at least 1). Either way a killed or cut-off waiter holds up the queue at most about this long; at most 3600000 | 3000 |
///
/// `fifo` and `queue_lease_ms` on SQLite, `observe_recheck_ms` on MySQL or
/// SQLite, a parameter given twice and a value out of range are
/// [`Error::InvalidInput`].
///
/// Every other parameter is passed to sqlx unchanged: for example `sslmode`
/// and `sslrootcert` on PostgreSQL, `ssl-mode` and `ssl-ca` on MySQL (TLS
/// needs the `tls` feature; see the crate docs), `mode` on SQLite.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct SqlConfig {
    /// The lock table; created on first use.
    pub table: String,
    /// Pool size when the backend builds the pool from a URL: 1 to 1000.
    pub pool_size: Option<u32>,
    /// How long to wait for a pooled connection before reporting the
    /// database unavailable: 1 ms to 1 hour.
    pub connect_timeout: Duration,
    /// SQLite: how long a statement waits for another process's write
    /// lock: at most 1 hour.
    pub busy_timeout: Duration,
    /// MySQL and SQLite waiters: backoff between attempts.
    pub poll: Backoff,
    /// PostgreSQL waiters: the longest sleep between attempts when no
    /// notification arrives (a lost NOTIFY, a reconnecting listener): 1 ms
    /// to 1 hour.
    pub notify_fallback: Duration,
    /// PostgreSQL: the longest an election's observer goes without reading
    /// the leader when no notification arrives and no lease ends (a
    /// notification lost while the LISTEN connection reconnects). 1 ms to
    /// 1 hour.
    pub observe_recheck: Duration,
    /// PostgreSQL and MySQL/MariaDB: whether waiting exclusive requests
    /// and campaigns queue, first come, first served.
    pub fifo: bool,
    /// PostgreSQL: how long a waiter's queue entry outlives its last
    /// attempt; at least 30 ms. MySQL/MariaDB: how long the server keeps a
    /// silent waiter's queue connection (whole seconds, at least one). At
    /// most 1 hour.
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
        use distlock_core::input::{check_millis, MAX_TIMEOUT};
        distlock_core::wait::check_queue_lease(self.queue_lease)?;
        if self.observe_recheck.is_zero() {
            return Err(Error::invalid(
                InputKind::Config,
                "observe_recheck must be greater than zero",
            ));
        }
        match self.pool_size {
            Some(0) => {
                return Err(Error::invalid(
                    InputKind::Config,
                    "pool_size=0: a pool needs at least one connection",
                ))
            }
            Some(n) if n > MAX_POOL_SIZE => return Err(pool_size_too_large(n, InputKind::Config)),
            _ => {}
        }
        let ms = Duration::from_millis(1);
        check_millis("connect_timeout", self.connect_timeout, ms, MAX_TIMEOUT)?;
        check_millis(
            "busy_timeout",
            self.busy_timeout,
            Duration::ZERO,
            MAX_TIMEOUT,
        )?;
        check_millis("notify_fallback", self.notify_fallback, ms, MAX_WAIT)?;
        check_millis("observe_recheck_ms", self.observe_recheck, ms, MAX_WAIT)?;
        // At least 30 ms, checked above.
        check_millis(
            "queue_lease_ms",
            self.queue_lease,
            Duration::from_millis(30),
            MAX_WAIT,
        )?;
        Ok(())
    }

    /// Takes distlock's own parameters out of `url`, returning the URL that
    /// sqlx should see.
    pub(crate) fn take_url_options(&mut self, url: &str) -> Result<String> {
        let Some((base, query)) = url.split_once('?') else {
            return Ok(url.to_string());
        };
        distlock_core::input::query_pairs(&shown_scheme(base), query)?;
        let scheme = base.split_once(':').map_or("", |(s, _)| s);
        let mut rest = Vec::new();
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            check_applies(k, scheme)?;
            match k {
                "table" => self.table = v.to_string(),
                "pool_size" => {
                    let n = v.parse().ok().filter(|n| *n > 0).ok_or_else(|| {
                        Error::invalid(
                            InputKind::Url,
                            format!("pool_size={v:?} is not a positive integer"),
                        )
                    })?;
                    if n > MAX_POOL_SIZE {
                        return Err(pool_size_too_large(n, InputKind::Url));
                    }
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
                _ => {
                    check_sqlx_key(k, scheme)?;
                    rest.push(pair);
                }
            }
        }
        check_one_spelling(base, scheme, &rest)?;
        Ok(if rest.is_empty() {
            base.to_string()
        } else {
            format!("{base}?{}", rest.join("&"))
        })
    }
}

/// The largest `pool_size`: sqlx sets a pool's queues up for its size at
/// once, and a database serves a few hundred connections at most.
pub(crate) const MAX_POOL_SIZE: u32 = 1000;

/// The longest `observe_recheck_ms`, `queue_lease_ms` and notification
/// fallback: one hour. These bound how long a lost notification or a dead
/// waiter can hold others up.
pub(crate) const MAX_WAIT: Duration = Duration::from_secs(3600);

fn pool_size_too_large(n: u32, kind: InputKind) -> Error {
    Error::invalid(
        kind,
        format!("pool_size={n} is above the limit of {MAX_POOL_SIZE} connections"),
    )
}

/// `scheme://` of a URL, for errors (never the rest, which may hold a
/// password).
fn shown_scheme(base: &str) -> String {
    format!("{}://", base.split_once(':').map_or("", |(s, _)| s))
}

/// Refuses distlock's parameters on a database they do not apply to, which
/// would otherwise ignore them.
fn check_applies(key: &str, scheme: &str) -> Result<()> {
    let applies_to: &[&str] = match key {
        "fifo" | "queue_lease_ms" => &["postgres", "postgresql", "mysql", "mariadb"],
        "observe_recheck_ms" => &["postgres", "postgresql"],
        _ => return Ok(()),
    };
    if applies_to.contains(&scheme) {
        return Ok(());
    }
    let databases = if applies_to.len() == 2 {
        "PostgreSQL"
    } else {
        "PostgreSQL and MySQL/MariaDB"
    };
    Err(Error::invalid(
        InputKind::Url,
        format!("{key} applies to {databases} only, not to {scheme}://; remove it from the URL"),
    ))
}

/// The query parameters sqlx 0.8.6 reads from a URL of each scheme (its
/// `options/parse.rs`). PostgreSQL's also include `options[NAME]`.
/// sqlx ignores any other on MySQL and only logs it on PostgreSQL, so a
/// misspelt `ssl-mode` would connect without the TLS it asks for.
fn sqlx_keys(scheme: &str) -> &'static [&'static str] {
    match scheme {
        "postgres" | "postgresql" => &[
            "sslmode",
            "ssl-mode",
            "sslrootcert",
            "ssl-root-cert",
            "ssl-ca",
            "sslcert",
            "ssl-cert",
            "sslkey",
            "ssl-key",
            "statement-cache-capacity",
            "host",
            "hostaddr",
            "port",
            "dbname",
            "user",
            "password",
            "application_name",
            "options",
        ],
        "mysql" | "mariadb" => &[
            "sslmode",
            "ssl-mode",
            "sslca",
            "ssl-ca",
            "charset",
            "collation",
            "sslcert",
            "ssl-cert",
            "sslkey",
            "ssl-key",
            "statement-cache-capacity",
            "socket",
            "timezone",
            "time-zone",
        ],
        "sqlite" => &["mode", "cache", "immutable", "vfs"],
        _ => &[],
    }
}

/// Refuses a parameter that is neither distlock's nor one sqlx reads for
/// `scheme` (compared as sqlx reads it, percent-decoded).
fn check_sqlx_key(key: &str, scheme: &str) -> Result<()> {
    let decoded = percent_decode(key);
    let keys = sqlx_keys(scheme);
    let pg_option = matches!(scheme, "postgres" | "postgresql")
        && decoded
            .strip_prefix("options[")
            .and_then(|k| k.strip_suffix(']'))
            .is_some_and(|k| !k.is_empty());
    if pg_option || keys.contains(&decoded.as_str()) {
        return Ok(());
    }
    let own = match scheme {
        "postgres" | "postgresql" => "table, pool_size, observe_recheck_ms, fifo, queue_lease_ms",
        "mysql" | "mariadb" => "table, pool_size, fifo, queue_lease_ms",
        _ => "table, pool_size",
    };
    let extra = if matches!(scheme, "postgres" | "postgresql") {
        ", options[NAME]"
    } else {
        ""
    };
    Err(Error::invalid(
        InputKind::Url,
        format!(
            "{scheme}:// URL: unknown parameter {decoded:?}; the parameters are {own}, {}{extra}",
            keys.join(", ")
        ),
    ))
}

/// The sqlx option a parameter of `scheme` sets (`key` percent-decoded):
/// sqlx reads several under two or three spellings.
fn sqlx_option<'a>(key: &'a str, scheme: &str) -> &'a str {
    match (scheme, key) {
        ("postgres" | "postgresql", "ssl-mode") => "sslmode",
        ("postgres" | "postgresql", "ssl-root-cert" | "ssl-ca") => "sslrootcert",
        ("postgres" | "postgresql", "hostaddr") => "host",
        ("mysql" | "mariadb", "ssl-mode") => "sslmode",
        ("mysql" | "mariadb", "ssl-ca") => "sslca",
        ("mysql" | "mariadb", "time-zone") => "timezone",
        (_, "ssl-cert") => "sslcert",
        (_, "ssl-key") => "sslkey",
        _ => key,
    }
}

/// Refuses two things in a URL that set one sqlx option: two spellings of
/// a parameter (`sslmode` and `ssl-mode`), or on PostgreSQL a parameter and
/// the URL's own part for it (`password=` beside a password before the
/// `@`, `port=` beside `:port`, `user=`, `host=`, `dbname=`). sqlx takes
/// whichever it reads last, so `sslmode=verify-full&ssl-mode=disable`
/// would connect without TLS. Values are never shown: one may be a
/// password.
fn check_one_spelling(base: &str, scheme: &str, params: &[&str]) -> Result<()> {
    let mut seen: Vec<(String, String)> = Vec::new();
    if matches!(scheme, "postgres" | "postgresql") {
        let authority = base
            .split_once("://")
            .map_or("", |(_, r)| r.split('/').next().unwrap_or(""));
        let (userinfo, host_port) = match authority.rsplit_once('@') {
            Some((u, h)) => (Some(u), h),
            None => (None, authority),
        };
        let (host, port) = match host_port.strip_prefix('[') {
            Some(v6) => v6.split_once(']').map_or((host_port, ""), |(h, p)| (h, p)),
            None => host_port
                .split_once(':')
                .map_or((host_port, ""), |(h, p)| (h, p)),
        };
        let path = base
            .split_once("://")
            .and_then(|(_, r)| r.split_once('/'))
            .map_or("", |(_, p)| p);
        let parts = [
            (
                "user",
                userinfo.is_some_and(|u| !u.split(':').next().unwrap_or("").is_empty()),
                "the user before the @",
            ),
            (
                "password",
                userinfo.is_some_and(|u| u.split_once(':').is_some_and(|(_, p)| !p.is_empty())),
                "the password before the @",
            ),
            ("host", !host.is_empty(), "the URL's host"),
            (
                "port",
                !port.trim_start_matches(':').is_empty(),
                "the URL's :port",
            ),
            ("dbname", !path.is_empty(), "the URL's /database"),
        ];
        for (option, given, what) in parts {
            if given {
                seen.push((option.to_string(), what.to_string()));
            }
        }
    }
    for pair in params {
        let key = pair.split_once('=').map_or(*pair, |(k, _)| k);
        let decoded = percent_decode(key);
        let option = sqlx_option(&decoded, scheme).to_string();
        if let Some((_, first)) = seen.iter().find(|(o, _)| *o == option) {
            return Err(Error::invalid(
                InputKind::Url,
                format!(
                    "{scheme}:// URL: {first} and parameter {decoded} both set {option}; give it once"
                ),
            ));
        }
        seen.push((option, format!("parameter {decoded}")));
    }
    Ok(())
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
    check_ca_verified(query)
}

/// Refuses a CA file with a mode that checks no certificate (sqlx then
/// ignores the file, where libpq would verify with it): the URL asks for a
/// verification it would not get.
fn check_ca_verified(query: &str) -> Result<()> {
    let pairs = || query.split('&').filter_map(|p| p.split_once('='));
    let Some((ca, _)) =
        pairs().find(|(k, _)| matches!(*k, "sslrootcert" | "ssl-root-cert" | "ssl-ca" | "sslca"))
    else {
        return Ok(());
    };
    let mode = pairs()
        .find(|(k, _)| matches!(*k, "sslmode" | "ssl-mode"))
        .map(|(_, v)| v.to_ascii_lowercase());
    match mode.as_deref() {
        Some("verify-ca" | "verify-full" | "verify_ca" | "verify_identity") => Ok(()),
        _ => Err(Error::invalid(
            InputKind::Url,
            format!(
                "{ca} names a CA, but the TLS mode checks no certificate with it: use sslmode=verify-ca or verify-full (PostgreSQL), ssl-mode=VERIFY_CA or VERIFY_IDENTITY (MySQL)"
            ),
        )),
    }
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

    fn is_invalid(r: Result<impl std::fmt::Debug>) -> String {
        match r {
            Err(e @ Error::InvalidInput { .. }) => e.to_string(),
            other => panic!("expected InvalidInput, got {other:?}"),
        }
    }

    #[test]
    fn a_pool_size_above_the_cap_is_refused() {
        for scheme in ["sqlite://x.db", "postgres://h/db", "mysql://h/db"] {
            let text = is_invalid(
                SqlConfig::default().take_url_options(&format!("{scheme}?pool_size=4294967295")),
            );
            assert!(text.contains("pool_size=4294967295"), "{text}");
            assert!(text.contains("1000"), "{text}");
            let mut c = SqlConfig::default();
            c.take_url_options(&format!("{scheme}?pool_size=1000"))
                .unwrap();
            assert_eq!(c.pool_size, Some(1000));
        }
        is_invalid(SqlConfig::default().with_pool_size(1001).validate());
        is_invalid(SqlConfig::default().with_pool_size(0).validate());
    }

    /// A waiter renews its queue entry every third of `queue_lease_ms`:
    /// 30 ms is the least that leaves it 10.
    #[test]
    fn a_queue_lease_below_30_ms_is_refused() {
        for (ms, ok) in [(29, false), (30, true)] {
            let mut c = SqlConfig::default();
            c.take_url_options(&format!("postgres://h/db?fifo=true&queue_lease_ms={ms}"))
                .unwrap();
            assert_eq!(c.validate().is_ok(), ok, "queue_lease_ms={ms}");
        }
    }

    #[test]
    fn durations_outside_their_range_are_refused() {
        for query in [
            "queue_lease_ms=18446744073709551615",
            "queue_lease_ms=3600001",
            "observe_recheck_ms=18446744073709551615",
        ] {
            let mut c = SqlConfig::default();
            c.take_url_options(&format!("postgres://h/db?{query}"))
                .unwrap();
            let text = is_invalid(c.validate());
            assert!(text.contains(query.split('=').next().unwrap()), "{text}");
            assert!(text.contains("3600000"), "{text}");
        }
        let c = SqlConfig {
            connect_timeout: Duration::ZERO,
            ..SqlConfig::default()
        };
        assert!(is_invalid(c.validate()).contains("connect_timeout=0"));
        for c in [
            SqlConfig {
                connect_timeout: Duration::from_millis(u64::MAX),
                ..SqlConfig::default()
            },
            SqlConfig {
                busy_timeout: Duration::from_secs(3601),
                ..SqlConfig::default()
            },
            SqlConfig {
                notify_fallback: Duration::ZERO,
                ..SqlConfig::default()
            },
        ] {
            is_invalid(c.validate());
        }
        let mut c = SqlConfig {
            busy_timeout: Duration::ZERO,
            ..SqlConfig::default()
        };
        c.take_url_options("postgres://h/db?queue_lease_ms=3600000&observe_recheck_ms=3600000")
            .unwrap();
        assert!(c.validate().is_ok());
    }

    #[test]
    fn a_parameter_of_another_database_is_refused() {
        for (url, param) in [
            ("sqlite://x.db?fifo=true", "fifo"),
            ("sqlite://x.db?fifo=false", "fifo"),
            ("sqlite://x.db?queue_lease_ms=3000", "queue_lease_ms"),
            (
                "sqlite://x.db?observe_recheck_ms=1000",
                "observe_recheck_ms",
            ),
            ("mysql://h/db?observe_recheck_ms=1000", "observe_recheck_ms"),
            (
                "mariadb://h/db?observe_recheck_ms=1000",
                "observe_recheck_ms",
            ),
        ] {
            let text = is_invalid(SqlConfig::default().take_url_options(url));
            assert!(text.contains(param), "{text}");
            assert!(text.contains("PostgreSQL"), "{text}");
        }
        for ok in [
            "postgres://h/db?fifo=true&queue_lease_ms=600&observe_recheck_ms=10",
            "postgresql://h/db?observe_recheck_ms=10",
            "mysql://h/db?fifo=true&queue_lease_ms=2000",
            "mariadb://h/db?fifo=true",
        ] {
            assert!(SqlConfig::default().take_url_options(ok).is_ok(), "{ok}");
        }
    }

    /// Two spellings of one sqlx option, or a parameter beside the URL's
    /// own part for it: sqlx would take the last, so neither is guessed.
    #[test]
    fn one_option_set_twice_is_refused_whatever_the_spelling() {
        for (url, says) in [
            (
                "postgres://u:hunter2@h/db?sslmode=verify-full&ssl-mode=disable",
                "parameter sslmode and parameter ssl-mode both set sslmode",
            ),
            (
                "postgres://h/db?ssl-mode=disable&sslmode=verify-full",
                "both set sslmode",
            ),
            (
                "postgres://h/db?sslrootcert=/a&ssl-root-cert=/b",
                "both set sslrootcert",
            ),
            (
                "postgres://h/db?ssl-ca=/a&sslrootcert=/b",
                "both set sslrootcert",
            ),
            (
                "postgres://h/db?sslmode=require&ssl%2Dmode=disable",
                "both set sslmode",
            ),
            ("postgres://h/db?sslkey=/a&ssl-key=/b", "both set sslkey"),
            (
                "mysql://h/db?ssl-mode=VERIFY_IDENTITY&sslmode=DISABLED",
                "both set sslmode",
            ),
            ("mariadb://h/db?sslca=/a&ssl-ca=/b", "both set sslca"),
            (
                "mysql://h/db?timezone=UTC&time-zone=%2B01:00",
                "both set timezone",
            ),
            (
                "postgres://u:hunter2@h/db?password=other",
                "the password before the @ and parameter password both set password",
            ),
            (
                "postgres://h:5432/db?port=5433",
                "the URL's :port and parameter port both set port",
            ),
            ("postgres://u@h/db?user=v", "both set user"),
            (
                "postgres://h/db?hostaddr=127.0.0.1",
                "the URL's host and parameter hostaddr both set host",
            ),
            ("postgres://h/db?dbname=other", "both set dbname"),
            ("postgres://[::1]:5432/db?port=1", "both set port"),
        ] {
            let text = is_invalid(SqlConfig::default().take_url_options(url));
            assert!(text.contains(says), "{url}: {text}");
            assert!(
                !text.contains("hunter2") && !text.contains("other"),
                "{text}"
            );
        }
        for ok in [
            "postgres:///db?host=/var/run/postgresql&port=5433",
            "postgres://u@h/db?password=p",
            "postgres://u:@h/db?password=p",
            "postgres://h/?dbname=d",
            "postgres://[::1]/db?sslmode=require&sslrootcert=/a&sslcert=/c&sslkey=/k",
            "mysql://u:p@h:3306/db?ssl-mode=REQUIRED&ssl-ca=/a&charset=utf8mb4",
        ] {
            assert!(SqlConfig::default().take_url_options(ok).is_ok(), "{ok}");
        }
    }

    #[test]
    fn a_repeated_parameter_is_refused() {
        for url in [
            "postgres://h/db?fifo=true&fifo=false",
            "sqlite://x.db?table=a&table=b",
            "mysql://h/db?pool_size=2&ssl-mode=DISABLED&pool_size=3",
            "postgres://u:hunter2@h/db?sslmode=disable&sslmode=require",
        ] {
            let text = is_invalid(SqlConfig::default().take_url_options(url));
            assert!(text.contains("given twice"), "{text}");
            assert!(!text.contains("hunter2"), "{text}");
        }
    }

    /// Each scheme takes distlock's parameters and those sqlx reads for
    /// it; a misspelt one (which sqlx would ignore) is refused by name.
    #[test]
    fn a_parameter_neither_distlock_nor_sqlx_reads_is_refused() {
        for ok in [
            "mysql://h/db?ssl-mode=REQUIRED&ssl-ca=/a&charset=utf8mb4&collation=x&time-zone=%2B00:00&socket=/s&statement-cache-capacity=9&sslcert=/c&ssl-key=/k",
            "mysql://h/db?sslmode=DISABLED&sslca=/a&timezone=UTC",
            "mariadb://h/db?fifo=true&queue_lease_ms=5000&ssl%2Dmode=DISABLED",
            "postgres:///?sslmode=disable&ssl-root-cert=/a&host=h&port=1&dbname=d&user=u&password=p&application_name=a&options=-c%20x%3D1&options[search_path]=s",
            "postgres:///?hostaddr=127.0.0.1",
            "postgresql://h/db?observe_recheck_ms=9&ssl-ca=/a&sslkey=/k",
            "sqlite://x.db?mode=rwc&cache=shared&immutable=false&vfs=unix&table=t",
        ] {
            assert!(SqlConfig::default().take_url_options(ok).is_ok(), "{ok}");
        }
        for (url, key) in [
            ("mysql://u:hunter2@h/db?ssl_mode=REQUIRED", "\"ssl_mode\""),
            ("mariadb://h/db?sslrootcert=/ca.pem", "\"sslrootcert\""),
            ("mysql://h/db?application_name=x", "\"application_name\""),
            ("postgres://h/db?ssl_mode=require", "\"ssl_mode\""),
            ("postgres://h/db?charset=utf8", "\"charset\""),
            ("postgres://h/db?options[]=x", "\"options[]\""),
            ("postgresql://h/db?sslmode=require&tls", "\"tls\""),
            ("sqlite://x.db?mdoe=ro", "\"mdoe\""),
        ] {
            let text = is_invalid(SqlConfig::default().take_url_options(url));
            assert!(text.starts_with("invalid backend URL: "), "{text}");
            assert!(text.contains(&format!("unknown parameter {key}")), "{text}");
            assert!(text.contains("table, pool_size"), "{text}");
            assert!(!text.contains("hunter2"), "{text}");
        }
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
        // A CA with a mode that checks no certificate: refused, not ignored.
        let dir = env!("CARGO_MANIFEST_DIR");
        for unverified in [
            format!("mysql://h/db?ssl-mode=REQUIRED&ssl-ca={dir}/Cargo.toml"),
            format!("postgres://h/db?sslmode=require&sslrootcert={dir}/Cargo.toml"),
            format!("postgres://h/db?sslrootcert={dir}/Cargo.toml"),
        ] {
            let e = check_tls_files(&unverified).unwrap_err().to_string();
            assert!(e.contains("checks no certificate"), "{unverified}: {e}");
        }
        let verified = format!("postgres://h/db?sslrootcert={dir}/Cargo.toml&sslmode=verify-full");
        assert!(check_tls_files(&verified).is_ok());
        assert!(check_tls_files(
            "postgres://h/db?sslmode=verify-ca&sslrootcert=-----BEGIN%20CERTIFICATE-----"
        )
        .is_ok());
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
