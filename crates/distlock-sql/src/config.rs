//! Configuration and URL options.

use std::time::Duration;

use distlock_core::poll::Backoff;
use distlock_core::{Error, InputKind, Result};

/// Options for [`SqlBackend`](crate::SqlBackend).
///
/// URL query parameters set the same options:
///
/// | parameter | meaning | default |
/// |---|---|---|
/// | `table` | lock table name (`[A-Za-z_][A-Za-z0-9_]*`, at most 54 characters) | `distlock_locks` |
/// | `pool_size` | connections in the pool the backend builds | 10 (SQLite: 4) |
///
/// Every other parameter is passed to sqlx unchanged (for example
/// `sslmode` on PostgreSQL or `mode` on SQLite).
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

/// Checks a table name, which is interpolated into SQL and so must be a
/// plain identifier (no quoting, no schema, nothing to inject).
pub(crate) fn validate_table(table: &str) -> Result<()> {
    let mut chars = table.chars();
    let ok = table.len() <= 54
        && chars
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_');
    if ok {
        Ok(())
    } else {
        Err(Error::invalid(
            InputKind::Config,
            format!("table name {table:?} must match [A-Za-z_][A-Za-z0-9_]* and be at most 54 characters"),
        ))
    }
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
}
