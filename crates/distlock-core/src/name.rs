//! Validated lock names.

use std::fmt;
use std::sync::Arc;

use crate::error::{Error, InputKind};

/// Longest lock name accepted, in bytes.
///
/// Chosen so that `<prefix>/<name>/<suffix>` still fits comfortably in every
/// backend's key limit (a SQL `VARCHAR(255)` primary key, a ZooKeeper path, an
/// etcd key with a lease-id suffix).
pub const MAX_NAME_LEN: usize = 200;

/// The name of a lock, validated once so that every backend can use it as a key.
///
/// A valid name:
/// - is 1 to [`MAX_NAME_LEN`] bytes long;
/// - uses only ASCII letters, digits and `-` `_` `.` `:` `/`;
/// - does not start or end with `/`, has no empty segment (`//`), and no
///   segment is `.` or `..`.
///
/// These rules make a name a safe Redis key (no `{}` to confuse hash tags), a
/// valid ZooKeeper path below the lock root, an etcd key prefix, and a SQL
/// value that needs no escaping in logs. Anything else is an
/// [`Error::InvalidInput`] with [`InputKind::LockName`], never a panic.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LockName(Arc<str>);

impl LockName {
    /// Validates `name`.
    pub fn new(name: impl AsRef<str>) -> Result<Self, Error> {
        let name = name.as_ref();
        validate(name).map_err(|reason| Error::InvalidInput {
            kind: InputKind::LockName,
            message: format!("{} {reason}", shown(name)),
        })?;
        Ok(Self(Arc::from(name)))
    }

    /// The name as a string slice.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// `name` quoted for an error message: a name too long to be valid is cut
/// after its first 64 characters (a 5,000-character name is not echoed
/// whole).
fn shown(name: &str) -> String {
    const SHOWN: usize = 64;
    match name.char_indices().nth(SHOWN) {
        Some((cut, _)) if name.len() > MAX_NAME_LEN => format!("{:?}...", &name[..cut]),
        _ => format!("{name:?}"),
    }
}

/// Whether `name` follows the rules, in one pass over its bytes: the
/// common case, checked at every acquire. [`explain`] says what is wrong.
fn valid(name: &str) -> bool {
    let b = name.as_bytes();
    if b.is_empty() || b.len() > MAX_NAME_LEN {
        return false;
    }
    // Bytes of the current segment, and whether they are all dots.
    let (mut len, mut dots) = (0usize, true);
    for &c in b {
        if c == b'/' {
            if len == 0 || (dots && len <= 2) {
                return false;
            }
            (len, dots) = (0, true);
        } else if c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.' | b':') {
            len += 1;
            dots &= c == b'.';
        } else {
            return false;
        }
    }
    !(len == 0 || (dots && len <= 2))
}

fn validate(name: &str) -> Result<(), String> {
    if valid(name) {
        return Ok(());
    }
    explain(name)
}

/// Why `name` breaks the rules.
fn explain(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("is empty; a name needs at least one character".into());
    }
    if name.len() > MAX_NAME_LEN {
        return Err(format!(
            "is {} bytes long; the limit is {MAX_NAME_LEN}",
            name.len()
        ));
    }
    if let Some(c) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | ':' | '/')))
    {
        return Err(format!(
            "contains {c:?}; use only ASCII letters, digits and - _ . : /"
        ));
    }
    if name.starts_with('/') || name.ends_with('/') {
        return Err("starts or ends with '/'".into());
    }
    if name
        .split('/')
        .any(|s| s.is_empty() || s == "." || s == "..")
    {
        return Err("has an empty, '.' or '..' path segment".into());
    }
    Ok(())
}

impl fmt::Display for LockName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for LockName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl AsRef<str> for LockName {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl std::str::FromStr for LockName {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self, Error> {
        Self::new(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_documented_character_set() {
        for ok in [
            "a",
            "jobs/nightly",
            "tenant-1:orders.v2",
            "A_b",
            &"x".repeat(200),
        ] {
            assert_eq!(
                LockName::new(ok).map(|n| n.to_string()).ok().as_deref(),
                Some(ok)
            );
        }
    }

    #[test]
    fn rejects_bad_names_with_typed_error() {
        let long = "x".repeat(201);
        for bad in [
            "", "/a", "a/", "a//b", "a/./b", "..", "a b", "{a}", "é", "a\nb", &long,
        ] {
            match LockName::new(bad) {
                Err(Error::InvalidInput {
                    kind: InputKind::LockName,
                    ..
                }) => {}
                other => panic!("{bad:?} gave {other:?}"),
            }
        }
    }

    #[test]
    fn a_name_too_long_is_not_echoed_whole() {
        let e = LockName::new("é".repeat(5_000)).unwrap_err().to_string();
        assert!(e.contains("10000 bytes long; the limit is 200"), "{e}");
        assert!(e.contains(&format!("\"{}\"...", "é".repeat(64))), "{e}");
        assert!(e.len() < 400, "{} bytes: {e}", e.len());
        let e = LockName::new("a b").unwrap_err().to_string();
        assert!(e.contains("\"a b\" contains ' '"), "{e}");
    }

    #[test]
    fn the_one_pass_check_agrees_with_the_explained_rules() {
        // Every name of up to four characters over an alphabet with each
        // rule's edge: letters, dots, a slash, a colon and a space.
        let alphabet = ['a', '.', '/', ':', ' ', '-'];
        let mut names = vec![String::new()];
        for _ in 0..4 {
            let longer: Vec<String> = names
                .iter()
                .filter(|n| n.len() == names.last().map_or(0, String::len))
                .flat_map(|n| alphabet.iter().map(move |c| format!("{n}{c}")))
                .collect();
            names.extend(longer);
        }
        names.push("x".repeat(MAX_NAME_LEN));
        names.push("x".repeat(MAX_NAME_LEN + 1));
        names.push("...".into());
        names.push("a/.../b".into());
        for n in &names {
            assert_eq!(valid(n), explain(n).is_ok(), "{n:?}");
        }
        assert!(names.len() > 1_500, "{} names", names.len());
    }
}
