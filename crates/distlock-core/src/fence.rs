//! Fencing on the resource side.

use std::sync::Mutex;

use crate::lease::lock;
use crate::token::FencingToken;

/// A token older than the ones the resource has already seen.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("stale fencing token {presented}: the resource has already seen {highest}; a newer holder owns the lock, so this writer must stop")]
pub struct StaleToken {
    /// The token that was rejected.
    pub presented: FencingToken,
    /// The highest token seen so far.
    pub highest: FencingToken,
}

/// The check a protected resource makes: admit an operation only if its
/// token is among the `limit` highest seen so far (for a lock, `limit` is
/// 1: at least the highest), and remember it.
///
/// The same holder may write several times with its token; an older holder
/// (one that was paused past its lease, say) is turned away once newer
/// tokens have been seen. Keep one gate per protected resource, next to the
/// resource (in the same process as the store that applies the writes).
///
/// For a semaphore of N permits, [`FenceGate::with_limit`] keeps the N
/// highest tokens admitted. Every grant of a semaphore's name gets a token
/// above every earlier grant's, and at most N permits are held at once, so
/// once N newer tokens have been seen the holder of an older one may have
/// been replaced: the gate turns it away. What that proves: the resource
/// only ever accepts writes from the N newest grants it has seen, so no more
/// than N writers at once. What it does not: an older holder whose permit is
/// still valid (because a newer one already released) is turned away too;
/// the gate errs on the side of rejecting.
///
/// For a SQL table the check for a lock is one statement; see the guide in
/// `docs/guarantees.md`:
///
/// ```sql
/// UPDATE accounts SET balance = $balance, fence = $token
///  WHERE id = $id AND fence <= $token;  -- 0 rows: stale writer, stop
/// ```
#[derive(Debug)]
pub struct FenceGate {
    limit: usize,
    /// The highest tokens admitted, at most `limit`, in ascending order.
    highest: Mutex<Vec<u64>>,
}

impl Default for FenceGate {
    fn default() -> Self {
        Self::new()
    }
}

impl FenceGate {
    /// A gate for a lock (one holder at a time) that has seen no token.
    pub fn new() -> Self {
        Self::with_limit(1)
    }

    /// A gate for a semaphore of `limit` permits (a `limit` of 0 counts as
    /// 1) that has seen no token.
    pub fn with_limit(limit: u32) -> Self {
        let limit = (limit as usize).max(1);
        Self {
            limit,
            // Grows with the tokens seen, up to `limit`.
            highest: Mutex::new(Vec::with_capacity(limit.min(64))),
        }
    }

    /// Admits `token` if it is one of the `limit` highest seen, or newer.
    pub fn admit(&self, token: FencingToken) -> Result<(), StaleToken> {
        let mut seen = lock(&self.highest);
        let t = token.0;
        match seen.binary_search(&t) {
            Ok(_) => Ok(()),
            Err(at) if seen.len() < self.limit => {
                seen.insert(at, t);
                Ok(())
            }
            // Below every one of the `limit` highest: a newer grant may
            // have taken this holder's place.
            Err(0) => Err(StaleToken {
                presented: token,
                highest: FencingToken(seen.last().copied().unwrap_or(0)),
            }),
            Err(at) => {
                seen.remove(0);
                seen.insert(at - 1, t);
                Ok(())
            }
        }
    }

    /// The highest token admitted so far.
    pub fn highest(&self) -> FencingToken {
        FencingToken(lock(&self.highest).last().copied().unwrap_or(0))
    }
}

/// The check a resource makes for a read-write lock: writes come from
/// exclusive holders, reads from shared holders, and every grant of the
/// name, shared or exclusive, has a token above every earlier grant's.
///
/// - A write is admitted if its token is at least every token admitted so
///   far, reads included: a writer paused past its lease, after which
///   readers or another writer were granted the lock, is turned away.
/// - A read is admitted if its token is at least every write's: a reader
///   granted before the last writer (so paused past its lease, since the
///   writer could only be granted once it was gone) is turned away. The
///   last writer may read too: a shared request nested in its exclusive
///   hold carries its token.
///
/// What it does not prove: that a refused holder's lease had really ended
/// (a write is refused after a newer reader read even if that reader
/// released early, and the lock was then granted back); it errs on the side
/// of refusing.
#[derive(Debug, Default)]
pub struct ReadWriteGate {
    /// The highest write token and the highest token of any kind admitted.
    seen: Mutex<(u64, u64)>,
}

impl ReadWriteGate {
    /// A gate that has seen no token.
    pub fn new() -> Self {
        Self::default()
    }

    /// Admits a write by the exclusive holder with `token`.
    pub fn admit_write(&self, token: FencingToken) -> Result<(), StaleToken> {
        let mut seen = lock(&self.seen);
        let (_, any) = *seen;
        if token.0 < any {
            return Err(StaleToken {
                presented: token,
                highest: FencingToken(any),
            });
        }
        *seen = (token.0, token.0);
        Ok(())
    }

    /// Admits a read by a shared holder with `token`.
    pub fn admit_read(&self, token: FencingToken) -> Result<(), StaleToken> {
        let mut seen = lock(&self.seen);
        let (write, any) = *seen;
        if token.0 < write {
            return Err(StaleToken {
                presented: token,
                highest: FencingToken(write),
            });
        }
        *seen = (write, any.max(token.0));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_read_write_gate_refuses_writers_older_than_any_grant_and_readers_older_than_a_write() {
        let g = ReadWriteGate::new();
        // Two readers, then a writer granted after them.
        assert!(g.admit_read(FencingToken(3)).is_ok());
        assert!(g.admit_read(FencingToken(4)).is_ok());
        assert!(g.admit_write(FencingToken(5)).is_ok());
        assert!(g.admit_write(FencingToken(5)).is_ok());
        // The writer reads through a shared request nested in its hold.
        assert!(g.admit_read(FencingToken(5)).is_ok());
        // Reader 4, paused past the writer's grant, reads late: refused.
        let e = g.admit_read(FencingToken(4)).unwrap_err();
        assert_eq!(e.highest, FencingToken(5));
        // Readers after the writer, then the paused writer 5 writes again.
        assert!(g.admit_read(FencingToken(6)).is_ok());
        let e = g.admit_write(FencingToken(5)).unwrap_err();
        assert_eq!(e.highest, FencingToken(6));
        // A newer writer takes over; the reader before it is refused.
        assert!(g.admit_write(FencingToken(7)).is_ok());
        assert!(g.admit_read(FencingToken(6)).is_err());
        assert!(g.admit_read(FencingToken(8)).is_ok());
    }

    #[test]
    fn admits_same_or_newer_rejects_older() {
        let g = FenceGate::new();
        assert!(g.admit(FencingToken(5)).is_ok());
        assert!(g.admit(FencingToken(5)).is_ok());
        assert!(g.admit(FencingToken(7)).is_ok());
        let e = g.admit(FencingToken(6)).unwrap_err();
        assert_eq!((e.presented, e.highest), (FencingToken(6), FencingToken(7)));
        assert_eq!(g.highest(), FencingToken(7));
    }

    #[test]
    fn a_gate_of_n_keeps_the_n_highest_and_rejects_below_all_of_them() {
        let g = FenceGate::with_limit(3);
        for t in [4, 2, 9] {
            assert!(g.admit(FencingToken(t)).is_ok(), "{t}");
        }
        // The gate holds three now, and 1 is below all of them.
        assert!(g.admit(FencingToken(1)).is_err());
        // Inside the three highest: admitted, and again.
        assert!(g.admit(FencingToken(4)).is_ok());
        assert!(g.admit(FencingToken(3)).is_ok());
        // 3 took 2's place: {3, 4, 9}.
        assert!(g.admit(FencingToken(2)).is_err());
        assert!(g.admit(FencingToken(10)).is_ok());
        // {4, 9, 10}: 3 is now below all of them.
        let e = g.admit(FencingToken(3)).unwrap_err();
        assert_eq!(e.highest, FencingToken(10));
        assert!(g.admit(FencingToken(9)).is_ok());
        assert_eq!(g.highest(), FencingToken(10));
    }
}
