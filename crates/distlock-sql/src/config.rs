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
/// | `table` | lock table name (`[A-Za-z_][A-Za-z0-9_]*`, at most 54 characters); semaphores live in `<table>_sems` and `<table>_permits` | `distlock_locks` |
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

/// Longest lock table name: room for the `distlock_` prefix of PostgreSQL's
/// notification channel and for the semaphore tables' suffixes within the
/// databases' identifier limit.
const MAX_TABLE_LEN: usize = 54;

/// PostgreSQL's identifier limit (NAMEDATALEN - 1; it silently truncates
/// longer names, so two tables could become one); MySQL's is 64.
const MAX_IDENTIFIER_LEN: usize = 63;

/// Checks a table name, which is interpolated into SQL and so must be a
/// plain identifier (no quoting, no schema, nothing to inject), and the
/// names derived from it (the semaphore tables) likewise.
pub(crate) fn validate_table(table: &str) -> Result<()> {
    let derived = crate::semaphore::PermitTables::for_lock_table(table);
    let ok = table.len() <= MAX_TABLE_LEN
        && is_identifier(table)
        && derived
            .names()
            .iter()
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
