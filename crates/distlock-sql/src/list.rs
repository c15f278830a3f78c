//! What the three databases share for holder info and `list`: the column
//! every hold's row carries, the range of names a prefix selects, and the
//! records made from the rows each table answers.
//!
//! Each table is read by one SELECT of its live rows whose names fall in
//! the prefix's range, in the order [`sort_records`](distlock_core::sort_records)
//! gives (name, then kind, then token), cut at the limit by the database.
//! A leader's row is named `<election>@election`, so the lock table orders
//! its rows by the name without that suffix: byte-wise, `a@election` sorts
//! after `a/b`, while the leader of `a` comes before the lock `a/b`.

use std::time::Duration;

use distlock_core::{HoldKind, HoldRecord, LockRequest, Result};

use crate::election::ELECTION_SUFFIX;
use crate::rwlock::SHARED_OWNER;
use crate::{token_from_db, DbError};

/// The holder info a grant writes into its row's `holder` column: the
/// request's, or NULL for a request built without one.
pub(crate) fn holder(req: &LockRequest) -> Option<&str> {
    req.holder_info.as_deref()
}

/// The `owner` values of a lock-table row that is held, but by no
/// exclusive holder: shared holds keep it (they are listed from their own
/// table), or an operator evicted its holder (the row stays taken until its
/// lease ends, held by nobody).
pub(crate) const NOT_AN_EXCLUSIVE_HOLDER: [&str; 2] = [SHARED_OWNER, EVICTED_OWNER];

/// The lock row's `owner` after an eviction.
pub(crate) const EVICTED_OWNER: &str = "evicted";

/// `owner NOT IN ('shared', 'evicted')`, for the statements that read an
/// exclusive holder's row.
pub(crate) fn exclusive_owner(column: &str) -> String {
    let [a, b] = NOT_AN_EXCLUSIVE_HOLDER;
    format!("{column} NOT IN ('{a}', '{b}')")
}

/// The names a prefix selects, as a half-open range `[from, to)` of
/// byte-wise compared names: those that start with the prefix. Names and
/// prefixes are ASCII below `0x7f` (core validates them), so the range's
/// end is the prefix with its last byte raised by one, and for the empty
/// prefix, `"\x7f"`, above every name. A range, unlike `LIKE 'p%'`, is
/// byte-wise on every database (SQLite's `LIKE` ignores ASCII case) and
/// is an index range scan wherever the key compares byte-wise.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct NameRange {
    pub(crate) from: String,
    pub(crate) to: String,
}

impl NameRange {
    pub(crate) fn of(prefix: &str) -> Self {
        let mut to = prefix.as_bytes().to_vec();
        match to.last_mut() {
            Some(last) => *last += 1,
            None => to.push(0x7f),
        }
        Self {
            from: prefix.to_owned(),
            // One ASCII byte below 0x7f raised by one stays ASCII.
            to: String::from_utf8(to).unwrap_or_default(),
        }
    }
}

/// The SQL `LIMIT` for `limit` records.
pub(crate) fn sql_limit(limit: usize) -> i64 {
    i64::try_from(limit).unwrap_or(i64::MAX)
}

/// The suffix's length, for the statements that strip it.
pub(crate) fn suffix_len() -> usize {
    ELECTION_SUFFIX.len()
}

/// A lock-table row as listed: (name, token, remaining lease in
/// microseconds, holder info, value).
pub(crate) type LockRow = (String, i64, i64, Option<String>, Option<String>);
/// A shared hold's row: (name, token, remaining microseconds, holder info).
pub(crate) type SharedRow = (String, Option<i64>, i64, Option<String>);
/// A permit's row: (name, token, remaining microseconds, holder info, the
/// semaphore's stored limit).
pub(crate) type PermitRow = (String, i64, i64, Option<String>, Option<i64>);

fn remaining(micros: i64) -> Option<Duration> {
    Some(Duration::from_micros(u64::try_from(micros).unwrap_or(0)))
}

/// A live row of the lock table: the lock's exclusive hold, or an
/// election's leadership (named without the suffix, with its value).
pub(crate) fn lock_record(
    err: &DbError,
    (name, token, micros, holder, value): LockRow,
) -> Result<HoldRecord> {
    let token = Some(token_from_db(err, token)?);
    let record = match name.strip_suffix(ELECTION_SUFFIX) {
        Some(election) => HoldRecord::new(election, HoldKind::Leader).with_value(value),
        None => HoldRecord::new(name, HoldKind::Exclusive),
    };
    Ok(record
        .with_token(token)
        .with_remaining(remaining(micros))
        .with_holder_info(holder))
}

/// A live shared hold. Its token is the one its grant answered, `NULL` in
/// a row a client without the column wrote.
pub(crate) fn shared_record(
    err: &DbError,
    (name, token, micros, holder): SharedRow,
) -> Result<HoldRecord> {
    Ok(HoldRecord::new(name, HoldKind::Shared)
        .with_token(token.map(|t| token_from_db(err, t)).transpose()?)
        .with_remaining(remaining(micros))
        .with_holder_info(holder))
}

/// A live permit, with its semaphore's stored limit (0 if the semaphore's
/// row is missing).
pub(crate) fn permit_record(
    err: &DbError,
    (name, token, micros, holder, limit): PermitRow,
) -> Result<HoldRecord> {
    let limit = limit.and_then(|l| u32::try_from(l).ok()).unwrap_or(0);
    Ok(HoldRecord::new(name, HoldKind::Permits { limit })
        .with_token(Some(token_from_db(err, token)?))
        .with_remaining(remaining(micros))
        .with_holder_info(holder))
}

#[cfg(test)]
mod tests {
    use super::*;
    use distlock_core::FencingToken;

    fn selects(prefix: &str, name: &str) -> bool {
        let r = NameRange::of(prefix);
        r.from.as_str() <= name && name < r.to.as_str()
    }

    #[test]
    fn a_prefix_range_holds_exactly_the_names_that_start_with_it() {
        let names = [
            "j",
            "jo",
            "jo@election",
            "jobs/a",
            "jobs/a@election",
            "jobs0",
            "jp",
            "Jobs",
            "z",
            "zz:z",
            "a-b.c_d",
        ];
        for prefix in ["", "jo", "jobs/", "jobs/a", "z", "zz:", "a-b.c_", "J"] {
            for name in names {
                assert_eq!(
                    selects(prefix, name),
                    name.starts_with(prefix),
                    "prefix {prefix:?}, name {name:?}"
                );
            }
        }
        assert_eq!(NameRange::of("ab/").to, "ab0");
        assert_eq!(NameRange::of("").to, "\u{7f}");
    }

    #[test]
    fn election_rows_list_as_leaders_without_the_suffix() {
        let err = DbError {
            backend: "sqlite",
            endpoint: "x".into(),
        };
        let row = |name: &str| {
            (
                name.to_string(),
                3,
                1_500_000,
                Some("h".into()),
                Some("v".into()),
            )
        };
        let leader = lock_record(&err, row("jobs@election")).unwrap();
        assert_eq!(leader.name, "jobs");
        assert_eq!(leader.kind, HoldKind::Leader);
        assert_eq!(leader.value.as_deref(), Some("v"));
        assert_eq!(leader.holder_info.as_deref(), Some("h"));
        assert_eq!(leader.remaining, Some(Duration::from_millis(1500)));
        let lock = lock_record(&err, row("jobs")).unwrap();
        assert_eq!(
            (lock.name.as_str(), lock.kind),
            ("jobs", HoldKind::Exclusive)
        );
        assert_eq!(lock.token, Some(FencingToken(3)));
        let permit = permit_record(&err, ("s".into(), 2, -5, None, None)).unwrap();
        assert_eq!(permit.kind, HoldKind::Permits { limit: 0 });
        assert_eq!(permit.remaining, Some(Duration::ZERO));
    }
}
