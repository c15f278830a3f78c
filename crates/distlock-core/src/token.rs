//! Fencing tokens and the per-acquisition owner value.

use std::fmt;

/// A fencing token: a number handed out with every lock grant.
///
/// The protected resource remembers the highest token it has seen and rejects
/// operations carrying a lower one (see [`FenceGate`](crate::FenceGate)). On a
/// backend whose [`Capabilities::fencing`](crate::Capabilities) is
/// [`Fencing::Strong`](crate::Fencing::Strong) tokens strictly increase across
/// successive holders of the same lock name, so a holder that was paused past
/// its lease cannot overwrite the work of its successor.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FencingToken(pub u64);

impl FencingToken {
    /// The token as a number.
    pub fn get(self) -> u64 {
        self.0
    }
}

impl fmt::Display for FencingToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

impl From<FencingToken> for u64 {
    fn from(t: FencingToken) -> u64 {
        t.0
    }
}

/// The value a backend stores to say who holds a lock: 128 bits, fresh for
/// every acquisition (not per client, not per thread).
///
/// Because it is unique per acquisition, a release or extend that carries a
/// stale owner (a holder whose lease expired and was granted to someone else)
/// can never match the new holder's row, key or node. Written as 32 lowercase
/// hex digits in the 8-4-4-4-12 layout, so it can stand where Apache Curator
/// expects a UUID.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Owner([u8; 16]);

/// Where [`Owner::unique`] draws from: 128 random bits drawn once per
/// process, and drawn again in a child after a `fork()` (its process id
/// differs), so that the two sides of a fork never share them.
struct OwnerSeed {
    pid: u32,
    bits: [u64; 2],
}

static OWNER_SEED: std::sync::Mutex<Option<OwnerSeed>> = std::sync::Mutex::new(None);

/// Counts the owners this process made with [`Owner::unique`].
static OWNERS_MADE: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// A bijection of `u64` that spreads every input bit over the output
/// (SplitMix64's finaliser): distinct counts give distinct values, and
/// successive ones share no visible digits.
fn spread(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The random bits of process `pid`: drawn at its first call, and drawn
/// anew when `pid` is not the process that drew them (the child of a fork).
fn seed_of(pid: u32) -> [u64; 2] {
    let mut seed = OWNER_SEED
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    match &*seed {
        Some(s) if s.pid == pid => s.bits,
        _ => {
            let fresh = Owner::random().0;
            let (hi, lo) = fresh.split_at(8);
            let bits = [
                u64::from_le_bytes(hi.try_into().unwrap_or_default()),
                u64::from_le_bytes(lo.try_into().unwrap_or_default()),
            ];
            *seed = Some(OwnerSeed { pid, bits });
            bits
        }
    }
}

impl Owner {
    /// A fresh owner for one acquisition: the process's 128 random bits
    /// with a count mixed into the second half, so no two calls in one
    /// process return the same value, and two processes could share one
    /// only if their random first halves were equal (a chance of 2^-64).
    ///
    /// One atomic increment, one `getpid` and a short-held mutex per call:
    /// the operating system's random source is read once per process (and
    /// once more in a child after a `fork()`), since reading it per
    /// acquisition is a large share of core's own work per hold.
    pub fn unique() -> Self {
        let count = OWNERS_MADE.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let bits = seed_of(std::process::id());
        let mut b = [0u8; 16];
        b[..8].copy_from_slice(&bits[0].to_be_bytes());
        b[8..].copy_from_slice(&(bits[1] ^ spread(count)).to_be_bytes());
        Self(b)
    }

    /// An owner of 128 bits read from the operating system's random source.
    ///
    /// # Panics
    /// Only if the OS random source is unavailable, which leaves no safe way
    /// to make lock owners unique.
    #[allow(clippy::expect_used)]
    pub fn random() -> Self {
        let mut b = [0u8; 16];
        getrandom::fill(&mut b).expect("the operating system's random source failed");
        Self(b)
    }

    /// The raw 16 bytes.
    pub fn as_bytes(&self) -> &[u8; 16] {
        &self.0
    }
}

impl Owner {
    /// The 36 bytes of the owner's text. Sent with every request, so
    /// encoded in one pass into a stack buffer rather than 16 formatted
    /// writes.
    fn text(&self) -> [u8; 36] {
        const HEX: &[u8; 16] = b"0123456789abcdef";
        let mut out = [0u8; 36];
        let mut at = 0;
        for (i, b) in self.0.iter().enumerate() {
            if matches!(i, 4 | 6 | 8 | 10) {
                out[at] = b'-';
                at += 1;
            }
            out[at] = HEX[usize::from(b >> 4)];
            out[at + 1] = HEX[usize::from(b & 0xf)];
            at += 2;
        }
        out
    }

    /// Appends the owner's text to `out`, without the formatting machinery.
    pub(crate) fn push_to(&self, out: &mut String) {
        // Only ASCII hex digits and dashes are in the text, so it is
        // always UTF-8.
        if let Ok(text) = std::str::from_utf8(&self.text()) {
            out.push_str(text);
        }
    }
}

impl fmt::Display for Owner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Only ASCII hex digits and dashes are in the text.
        f.write_str(std::str::from_utf8(&self.text()).map_err(|_| fmt::Error)?)
    }
}

impl fmt::Debug for Owner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Owner({self})")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owners_are_unique_and_uuid_shaped() {
        let a = Owner::random();
        let b = Owner::random();
        assert_ne!(a, b);
        let s = a.to_string();
        assert_eq!(s.len(), 36);
        assert_eq!(
            s.split('-').map(str::len).collect::<Vec<_>>(),
            [8, 4, 4, 4, 12]
        );
    }

    #[test]
    fn owners_stay_unique_across_refills() {
        let mut seen = std::collections::HashSet::new();
        for _ in 0..1000 {
            assert!(seen.insert(Owner::random()), "an owner value repeated");
        }
    }

    #[test]
    fn unique_owners_never_repeat_across_threads() {
        let made: Vec<Vec<Owner>> = std::thread::scope(|s| {
            let threads: Vec<_> = (0..4)
                .map(|_| s.spawn(|| (0..10_000).map(|_| Owner::unique()).collect::<Vec<_>>()))
                .collect();
            threads
                .into_iter()
                .map(|t| t.join().unwrap_or_default())
                .collect()
        });
        let mut seen = std::collections::HashSet::new();
        for o in made.into_iter().flatten() {
            assert!(seen.insert(o), "{o} was made twice");
        }
        assert_eq!(seen.len(), 40_000);
    }

    #[test]
    fn another_process_id_draws_new_seed_bits() {
        let me = std::process::id();
        let first = seed_of(me);
        assert_eq!(seed_of(me), first, "one process keeps its bits");
        // As the child of a fork sees it: the bits were drawn by another
        // process.
        let child = seed_of(me.wrapping_add(1));
        assert_ne!(child, first);
        assert_ne!(seed_of(me), first, "back in this process, drawn anew");
    }

    #[test]
    fn spread_counts_stay_distinct_and_share_no_digits() {
        let mut seen = std::collections::HashSet::new();
        for n in (0..100_000u64).chain([u64::MAX - 1, u64::MAX]) {
            assert!(
                seen.insert(spread(n)),
                "spread({n}) repeated an earlier value"
            );
        }
        // Successive counts differ in about half their bits.
        let flips = (spread(7) ^ spread(8)).count_ones();
        assert!((16..=48).contains(&flips), "{flips} bits differ");
    }

    #[test]
    fn owner_hex_is_exact() {
        let o = Owner(*b"\x00\x01\x7f\x80\xab\xcd\xef\xff\x10\x20\x30\x40\x50\x60\x70\x8f");
        assert_eq!(o.to_string(), "00017f80-abcd-efff-1020-30405060708f");
    }

    #[test]
    fn tokens_order_numerically() {
        assert!(FencingToken(9) < FencingToken(10));
        assert_eq!(FencingToken(42).to_string(), "42");
    }
}
