//! What the three databases share for elections: an election is an
//! exclusive hold on a row of the lock table of its own, whose name no lock
//! can have, and whose `value` column carries the leader's value.

use std::borrow::Cow;
use std::time::Duration;

#[cfg(feature = "postgres")]
use distlock_core::{Error, InputKind};
use distlock_core::{HoldKind, Leader, LockName, LockRequest};

use crate::{token_from_db, DbError};

/// Appended to an election's name to name its row in the lock table. `@`
/// is not a character a [`LockName`] may hold, so no lock's row has such a
/// name, and the election `jobs` and the lock `jobs` never contend.
pub(crate) const ELECTION_SUFFIX: &str = "@election";

/// The name of the election `name`'s row.
pub(crate) fn election_row(name: &LockName) -> String {
    format!("{name}{ELECTION_SUFFIX}")
}

/// Appended to a semaphore's name to name its wait queue's row. `@` is not
/// a character a lock name may hold, so no lock's or election's queue has
/// such a name.
#[cfg(any(feature = "postgres", feature = "mysql"))]
const PERMITS_SUFFIX: &str = "@permits";

/// The row whose wait queue `req` joins (`fifo`): the lock's, the
/// election's, or the semaphore's.
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) fn queue_row(req: &LockRequest) -> Cow<'_, str> {
    match req.kind {
        HoldKind::Permits { .. } => Cow::Owned(format!("{}{PERMITS_SUFFIX}", req.name)),
        _ => row(req),
    }
}

/// The lock-table row `req` acts on: its name for a lock, the election's
/// row for a leader.
pub(crate) fn row(req: &LockRequest) -> Cow<'_, str> {
    match req.kind {
        HoldKind::Leader => Cow::Owned(election_row(&req.name)),
        _ => Cow::Borrowed(req.name.as_str()),
    }
}

/// The value a grant writes into the row: the campaigner's for a leader
/// (an empty one if the request carries none), NULL for a lock.
pub(crate) fn value(req: &LockRequest) -> Option<&str> {
    match req.kind {
        HoldKind::Leader => Some(req.value.as_deref().unwrap_or("")),
        _ => None,
    }
}

/// A value PostgreSQL's `TEXT` can hold: any but one with a NUL character.
#[cfg(feature = "postgres")]
pub(crate) fn checked_for_postgres(value: Option<&str>) -> distlock_core::Result<()> {
    if value.is_some_and(|v| v.contains('\0')) {
        return Err(Error::invalid(
            InputKind::Config,
            "an election value on PostgreSQL cannot contain a NUL character",
        ));
    }
    Ok(())
}

/// A leader read from its row: (value, token, remaining lease in
/// microseconds by the database's clock, holder info).
pub(crate) fn leader_from_db(
    err: &DbError,
    (value, token, micros, holder): (Option<String>, i64, i64, Option<String>),
) -> distlock_core::Result<Leader> {
    Ok(
        Leader::new(value.unwrap_or_default(), token_from_db(err, token)?)
            .with_remaining(Some(Duration::from_micros(
                u64::try_from(micros).unwrap_or(0),
            )))
            .with_holder_info(holder),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_lock_name_reaches_an_election_row() {
        let e = LockName::new("jobs/nightly").unwrap();
        assert_eq!(election_row(&e), "jobs/nightly@election");
        // Every lock name is refused with the suffix: it names no lock.
        assert!(LockName::new(election_row(&e)).is_err());
        assert!(LockName::new("x@election").is_err());
        // The longest name still fits the tables' 255-character keys.
        let long = LockName::new("x".repeat(distlock_core::MAX_NAME_LEN)).unwrap();
        assert!(election_row(&long).len() <= 255);
    }

    #[test]
    fn only_leaders_map_to_another_row_and_carry_a_value() {
        let n = LockName::new("a").unwrap();
        let lock = LockRequest::new(n.clone(), Duration::from_secs(1));
        assert_eq!(row(&lock), "a");
        assert_eq!(value(&lock), None);
        let leader = LockRequest::leader(n, Duration::from_secs(1), "v");
        assert_eq!(row(&leader), "a@election");
        assert_eq!(value(&leader), Some("v"));
    }
}
