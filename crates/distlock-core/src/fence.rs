//! Fencing on the resource side.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::token::FencingToken;

/// A token older than one the resource has already seen.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("stale fencing token {presented}: the resource has already seen {highest}; a newer holder owns the lock, so this writer must stop")]
pub struct StaleToken {
    /// The token that was rejected.
    pub presented: FencingToken,
    /// The highest token seen so far.
    pub highest: FencingToken,
}

/// The check a protected resource makes: admit an operation only if its
/// token is at least the highest seen so far, and remember it.
///
/// The same holder may write several times with its token; an older holder
/// (one that was paused past its lease, say) is turned away once a newer
/// token has been seen. Keep one gate per protected resource, next to the
/// resource (in the same process as the store that applies the writes).
///
/// For a SQL table the same check is one statement; see the guide in
/// `docs/guarantees.md`:
///
/// ```sql
/// UPDATE accounts SET balance = $balance, fence = $token
///  WHERE id = $id AND fence <= $token;  -- 0 rows: stale writer, stop
/// ```
#[derive(Debug, Default)]
pub struct FenceGate {
    highest: AtomicU64,
}

impl FenceGate {
    /// A gate that has seen no token.
    pub fn new() -> Self {
        Self::default()
    }

    /// Admits `token` if it is not older than the highest seen.
    pub fn admit(&self, token: FencingToken) -> Result<(), StaleToken> {
        let prev = self.highest.fetch_max(token.0, Ordering::AcqRel);
        if token.0 < prev {
            Err(StaleToken {
                presented: token,
                highest: FencingToken(prev),
            })
        } else {
            Ok(())
        }
    }

    /// The highest token admitted so far.
    pub fn highest(&self) -> FencingToken {
        FencingToken(self.highest.load(Ordering::Acquire))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
