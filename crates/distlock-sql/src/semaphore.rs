//! What the three databases share for semaphores: the tables' names, which
//! object a request acts on, and the limit checks.

use std::time::Duration;

use distlock_core::wait::Outcome;
use distlock_core::{Error, HoldKind, InputKind, LockRequest, Result};

use crate::{token_from_db, DbError};

/// The tables a semaphore lives in, named after the lock table: one row per
/// semaphore (its limit and its token counter, never deleted, so tokens
/// keep rising across releases, expiries and restarts), and one row per
/// permit held (its owner, token and expiry).
pub(crate) struct PermitTables {
    pub(crate) semaphores: String,
    pub(crate) permits: String,
}

impl PermitTables {
    pub(crate) fn for_lock_table(table: &str) -> Self {
        Self {
            semaphores: format!("{table}_sems"),
            permits: format!("{table}_permits"),
        }
    }

    pub(crate) fn names(&self) -> [&str; 2] {
        [&self.semaphores, &self.permits]
    }
}

/// Which object a request acts on: a name's lock and its semaphore are
/// separate rows in separate tables; a shared hold is on the lock; an
/// election is an exclusive hold on a row of the lock table of its own
/// ([`crate::election::row`]).
pub(crate) enum Object {
    Lock,
    Leader,
    Shared,
    Semaphore { limit: u32 },
}

impl Object {
    /// A kind this crate does not know is refused rather than served as a
    /// lock, which could hand out a hold its caller thinks is shared.
    pub(crate) fn of(req: &LockRequest, err: &DbError) -> Result<Self> {
        match req.kind {
            HoldKind::Exclusive => Ok(Object::Lock),
            HoldKind::Shared => Ok(Object::Shared),
            HoldKind::Permits { limit } => Ok(Object::Semaphore { limit }),
            HoldKind::Leader => Ok(Object::Leader),
            _ => Err(Error::Unsupported {
                backend: err.backend,
                operation: "this kind of hold",
            }),
        }
    }
}

/// A limit a semaphore may be created with or changed to.
pub(crate) fn valid_limit(limit: u32) -> Result<u32> {
    if limit == 0 {
        return Err(Error::invalid(
            InputKind::Config,
            "a semaphore needs a limit of at least one permit",
        ));
    }
    Ok(limit)
}

/// A limit read back from the semaphore table: one distlock did not write
/// (another application's, or edited by hand) is a configuration to mend,
/// not an outage to retry.
pub(crate) fn limit_from_db(err: &DbError, stored: i64) -> Result<u32> {
    u32::try_from(stored)
        .ok()
        .filter(|l| *l > 0)
        .ok_or_else(|| {
            Error::misconfigured(
                err.backend,
                format!(
                    "the semaphore table holds the limit {stored}, which distlock does not write (it writes 1 to 4294967295): another application writes to the table, or the row was edited; set the row's `permits` column to the limit wanted in the semaphore table (`<table>_sems`), leaving its `token` column as it is: the next permit's token follows it"
                ),
                None,
            )
        })
}

/// What one attempt at a permit found, as each database reports it.
pub(crate) enum PermitAttempt {
    /// Granted, with this token.
    Granted(i64),
    /// All permits are held; the earliest of them expires in this long.
    Full(Option<Duration>),
    /// The semaphore's stored limit differs from the requested one; nothing
    /// was changed.
    LimitIs(i64),
}

impl PermitAttempt {
    pub(crate) fn into_outcome(
        self,
        err: &DbError,
        req: &LockRequest,
        requested: u32,
    ) -> Result<Outcome> {
        match self {
            PermitAttempt::Granted(t) => Ok(Outcome::Granted(token_from_db(err, t)?)),
            PermitAttempt::Full(left) => Ok(Outcome::Held(left)),
            PermitAttempt::LimitIs(stored) => Err(Error::LimitMismatch {
                name: req.name.clone(),
                requested,
                stored: limit_from_db(err, stored)?,
            }),
        }
    }
}

/// A remaining lease in microseconds from the database, clamped at zero (a
/// permit can expire between the statement and the reply).
pub(crate) fn remaining_micros(left: Option<i64>) -> Option<Duration> {
    left.map(|us| Duration::from_micros(u64::try_from(us).unwrap_or(0)))
}
