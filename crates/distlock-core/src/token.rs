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

/// The value a backend stores to say who holds a lock: 128 random bits,
/// fresh for every acquisition (not per client, not per thread).
///
/// Because it is unique per acquisition, a release or extend that carries a
/// stale owner (a holder whose lease expired and was granted to someone else)
/// can never match the new holder's row, key or node. Written as 32 lowercase
/// hex digits in the 8-4-4-4-12 layout, so it can stand where Apache Curator
/// expects a UUID.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Owner([u8; 16]);

impl Owner {
    /// A fresh random owner value from the operating system's generator.
    ///
    /// One `getrandom` call per acquisition (about half a microsecond). A
    /// per-thread pool would be cheaper but would hand the same values to
    /// both sides of a `fork()`.
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
