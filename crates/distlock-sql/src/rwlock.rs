//! What the three databases share for read-write locks: the tables' names,
//! the lock row's owner while readers hold it, and the writer marks this
//! backend has placed.

use std::collections::HashSet;
use std::sync::Mutex;

use distlock_core::LockRequest;

/// The lock row's `owner` while shared holds keep it: no owner value (a
/// UUID) is ever equal to it. The row's `expires_at` is then at least the
/// latest expiry of its live shared holds, so the exclusive statements,
/// which look at the lock row only, see a held lock and need no change.
pub(crate) const SHARED_OWNER: &str = "shared";

/// The tables of a read-write lock, named after the lock table: one row per
/// shared hold (`name`, `owner`, `expires_at`), and one per writer waiting
/// behind shared holds (`name`, `owner`, `expires_at`).
pub(crate) struct RwTables {
    pub(crate) shared: String,
    pub(crate) writers: String,
}

impl RwTables {
    pub(crate) fn for_lock_table(table: &str) -> Self {
        Self {
            shared: format!("{table}_shared"),
            writers: format!("{table}_writers"),
        }
    }

    pub(crate) fn names(&self) -> [&str; 2] {
        [&self.shared, &self.writers]
    }
}

/// The writer marks this backend has placed and not yet removed, so that
/// the release of a cancelled acquire removes its mark, and a release with
/// none costs no statement.
#[derive(Debug, Default)]
pub(crate) struct Marks(Mutex<HashSet<(String, String)>>);

impl Marks {
    fn key(req: &LockRequest) -> (String, String) {
        (req.name.as_str().to_owned(), req.owner.to_string())
    }

    fn set(&self) -> std::sync::MutexGuard<'_, HashSet<(String, String)>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn insert(&self, req: &LockRequest) {
        self.set().insert(Self::key(req));
    }

    pub(crate) fn contains(&self, req: &LockRequest) -> bool {
        self.set().contains(&Self::key(req))
    }

    pub(crate) fn remove(&self, req: &LockRequest) {
        self.set().remove(&Self::key(req));
    }
}
