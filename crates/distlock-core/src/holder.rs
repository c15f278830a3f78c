//! Holder info: the short description of who holds a hold, stored on the
//! server by the request that grants it, and what `list` reports.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use crate::backend::{HoldKind, LockRequest};
use crate::error::{Error, InputKind, Result};
use crate::name::MAX_NAME_LEN;
use crate::token::FencingToken;

/// Longest holder info accepted, in bytes.
pub const MAX_HOLDER_INFO_LEN: usize = 256;

/// Checks a holder info: 1 to [`MAX_HOLDER_INFO_LEN`] bytes of printable
/// text (no control characters, so it prints on one line and needs no
/// escaping in any backend's layout).
pub fn validate_holder_info(info: &str) -> Result<()> {
    check_one_line(
        "holder info",
        info,
        MAX_HOLDER_INFO_LEN,
        "leave it unset for the default (host name and process id)",
    )
}

/// Checks a text that is stored on the server and printed on one line
/// (`what` names it in the messages): 1 to `max` bytes, no control
/// characters. `if_empty` says what to do instead of giving it empty.
pub(crate) fn check_one_line(what: &str, text: &str, max: usize, if_empty: &str) -> Result<()> {
    if text.is_empty() {
        return Err(Error::invalid(
            InputKind::Config,
            format!("{what} is empty; {if_empty}"),
        ));
    }
    if text.len() > max {
        return Err(Error::invalid(
            InputKind::Config,
            format!("{what} is {} bytes long; the limit is {max}", text.len()),
        ));
    }
    if let Some(c) = text.chars().find(|c| c.is_control()) {
        return Err(Error::invalid(
            InputKind::Config,
            format!("{what} contains the control character {c:?}; use printable text"),
        ));
    }
    if let Some(c) = text.chars().find(|c| invisible(*c)) {
        return Err(Error::invalid(
            InputKind::Config,
            format!(
                "{what} contains {c:?}, a line break or an invisible character to a reader; use printable text"
            ),
        ));
    }
    if text.trim().is_empty() {
        return Err(Error::invalid(
            InputKind::Config,
            format!("{what} is only spaces, which print as nothing; {if_empty}"),
        ));
    }
    Ok(())
}

/// Unicode's line and paragraph separators (which line-splitting readers
/// break on), and the format characters that print as nothing or reorder
/// what follows (zero-width spaces and joiners, direction marks and
/// overrides, the byte order mark).
fn invisible(c: char) -> bool {
    matches!(
        c,
        '\u{2028}'
            | '\u{2029}'
            | '\u{200B}'..='\u{200F}'
            | '\u{202A}'..='\u{202E}'
            | '\u{2060}'..='\u{2064}'
            | '\u{2066}'..='\u{2069}'
            | '\u{FEFF}'
    )
}

/// The holder info a client gives its holds unless told otherwise:
/// `<host name> pid <process id>`.
pub fn default_holder_info() -> Arc<str> {
    static DEFAULT: OnceLock<Arc<str>> = OnceLock::new();
    DEFAULT
        .get_or_init(|| {
            let info = format!("{} pid {}", host_name(), std::process::id());
            Arc::from(fit_holder_info(&info))
        })
        .clone()
}

/// `info` made valid: control characters become spaces and the text is cut
/// (at a character boundary, marked with `...`) to [`MAX_HOLDER_INFO_LEN`].
/// For descriptions a program builds itself, such as a command line; a
/// user's own holder info is checked with [`validate_holder_info`] instead.
pub fn fit_holder_info(info: &str) -> String {
    let clean: String = info
        .chars()
        .map(|c| {
            if c.is_control() || invisible(c) {
                ' '
            } else {
                c
            }
        })
        .collect();
    let clean = if clean.trim().is_empty() {
        "-".to_string()
    } else {
        clean
    };
    if clean.len() <= MAX_HOLDER_INFO_LEN {
        return clean;
    }
    let mut end = MAX_HOLDER_INFO_LEN - 3;
    while !clean.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &clean[..end])
}

fn host_name() -> String {
    let from_kernel = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|s| s.trim().to_string());
    from_kernel
        .filter(|s| !s.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok().filter(|s| !s.is_empty()))
        .or_else(|| std::env::var("COMPUTERNAME").ok().filter(|s| !s.is_empty()))
        .unwrap_or_else(|| "unknown-host".to_string())
}

/// The owner value with the holder info appended, for backends that keep
/// both in one stored string (a Redis value, an etcd key's value):
/// `<owner>` or `<owner> <holder info>`. Owner-checked operations compare
/// the whole string, so they need no change; [`split_stored_owner`] reads
/// it back.
pub fn stored_owner(req: &LockRequest) -> String {
    // Built with every request that names an owner (on Redlock once per
    // node and request), so in one allocation of the exact size.
    let info = req.holder_info.as_deref();
    let mut stored = String::with_capacity(OWNER_LEN + info.map_or(0, |i| 1 + i.len()));
    req.owner.push_to(&mut stored);
    if let Some(info) = info {
        stored.push(' ');
        stored.push_str(info);
    }
    stored
}

/// The length of an owner's text (see [`Owner`](crate::Owner)).
const OWNER_LEN: usize = 36;

/// The owner and holder info of a string [`stored_owner`] made. A value
/// another client stored (no space after a 36-byte owner) is all owner.
pub fn split_stored_owner(stored: &str) -> (&str, Option<&str>) {
    match stored.get(OWNER_LEN..) {
        Some(rest) if rest.starts_with(' ') && rest.len() > 1 => {
            (&stored[..OWNER_LEN], Some(&rest[1..]))
        }
        _ => (stored, None),
    }
}

/// Checks a `list` prefix: empty (everything), or the start of a lock name:
/// at most [`MAX_NAME_LEN`] bytes of the characters a name may use, not
/// starting with `/` and without an empty segment. It may end in `/`.
pub fn validate_prefix(prefix: &str) -> Result<()> {
    let bad = |why: String| {
        Err(Error::invalid(
            InputKind::LockName,
            format!("prefix {prefix:?} {why}"),
        ))
    };
    if prefix.len() > MAX_NAME_LEN {
        return bad(format!(
            "is {} bytes long; the limit is {MAX_NAME_LEN}",
            prefix.len()
        ));
    }
    if let Some(c) = prefix
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | ':' | '/')))
    {
        return bad(format!(
            "contains {c:?}; use only ASCII letters, digits and - _ . : /"
        ));
    }
    if prefix.starts_with('/') || prefix.contains("//") {
        return bad("starts with '/' or has an empty segment".into());
    }
    Ok(())
}

/// One hold as [`Backend::list`](crate::Backend::list) reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct HoldRecord {
    /// The lock, semaphore or election name.
    pub name: String,
    /// The kind of hold. A permit's limit is the one stored with its
    /// semaphore (0 where the backend stores none).
    pub kind: HoldKind,
    /// The hold's fencing token, where the backend keeps one per hold.
    pub token: Option<FencingToken>,
    /// How long the hold's lease still runs, where the backend can tell.
    pub remaining: Option<Duration>,
    /// The holder info stored with the hold (`None`: none stored, e.g. a
    /// hold taken by another client).
    pub holder_info: Option<String>,
    /// The value a leadership carries (its proposal); `None` otherwise.
    pub value: Option<String>,
}

impl HoldRecord {
    /// A record of a hold of `kind` on `name`; everything else unknown.
    pub fn new(name: impl Into<String>, kind: HoldKind) -> Self {
        Self {
            name: name.into(),
            kind,
            token: None,
            remaining: None,
            holder_info: None,
            value: None,
        }
    }

    /// Sets the token.
    pub fn with_token(mut self, token: Option<FencingToken>) -> Self {
        self.token = token;
        self
    }

    /// Sets the remaining lease.
    pub fn with_remaining(mut self, remaining: Option<Duration>) -> Self {
        self.remaining = remaining;
        self
    }

    /// Sets the holder info.
    pub fn with_holder_info(mut self, info: Option<String>) -> Self {
        self.holder_info = info;
        self
    }

    /// Sets the value.
    pub fn with_value(mut self, value: Option<String>) -> Self {
        self.value = value;
        self
    }
}

/// Sorts records by name, then kind (lock, shared, permit, leader), then
/// token, and keeps the first `limit`: the order every backend's `list`
/// answers in.
pub fn sort_records(records: &mut Vec<HoldRecord>, limit: usize) {
    fn rank(kind: &HoldKind) -> u8 {
        match kind {
            HoldKind::Exclusive => 0,
            HoldKind::Shared => 1,
            HoldKind::Permits { .. } => 2,
            HoldKind::Leader => 3,
        }
    }
    records.sort_by(|a, b| {
        (a.name.as_str(), rank(&a.kind), a.token).cmp(&(b.name.as_str(), rank(&b.kind), b.token))
    });
    records.truncate(limit);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::name::LockName;

    #[test]
    fn one_line_text_refuses_separators_invisible_characters_and_blanks() {
        let check = |t: &str| check_one_line("the value", t, 100, "give one");
        for bad in [
            "a\u{2028}b",
            "a\u{2029}b",
            "\u{FEFF}",
            "x\u{202E}y",
            "a\u{200B}",
            " ",
            "   ",
        ] {
            assert!(
                matches!(check(bad), Err(Error::InvalidInput { .. })),
                "{bad:?} was accepted"
            );
        }
        for good in ["host-1:8080", "caf\u{e9} \u{65e5}\u{672c}", " padded "] {
            assert!(check(good).is_ok(), "{good:?} was refused");
        }
        // What a command line gives the default holder info is made fit.
        for raw in ["a\u{2028}b\n", "\u{FEFF}", " ", ""] {
            assert!(
                validate_holder_info(&fit_holder_info(raw)).is_ok(),
                "{raw:?}"
            );
        }
    }

    #[test]
    fn holder_info_is_bounded_and_printable() {
        assert!(validate_holder_info("web-3 pid 12").is_ok());
        assert!(validate_holder_info(&"x".repeat(MAX_HOLDER_INFO_LEN)).is_ok());
        for bad in ["", "a\nb", "tab\there"] {
            assert!(matches!(
                validate_holder_info(bad),
                Err(Error::InvalidInput { .. })
            ));
        }
        let long = "y".repeat(MAX_HOLDER_INFO_LEN + 1);
        assert!(validate_holder_info(&long).is_err());
        let fitted = fit_holder_info(&format!("é{long}\n"));
        assert!(validate_holder_info(&fitted).is_ok(), "{fitted}");
        assert!(fitted.ends_with("..."));
    }

    #[test]
    fn the_default_names_host_and_pid() {
        let info = default_holder_info();
        assert!(validate_holder_info(&info).is_ok());
        assert!(info.ends_with(&format!(" pid {}", std::process::id())));
    }

    #[test]
    fn stored_owner_round_trips() {
        let mut req = LockRequest::new(LockName::new("a").unwrap(), Duration::from_secs(1));
        let owner = req.owner.to_string();
        assert_eq!(
            split_stored_owner(&stored_owner(&req)),
            (owner.as_str(), None)
        );
        req.holder_info = Some(Arc::from("host pid 7: sh -c x"));
        let stored = stored_owner(&req);
        assert_eq!(
            split_stored_owner(&stored),
            (owner.as_str(), Some("host pid 7: sh -c x"))
        );
        // A foreign token is all owner.
        assert_eq!(split_stored_owner("abc def"), ("abc def", None));
    }

    #[test]
    fn prefixes_are_name_starts() {
        for good in ["", "jobs", "jobs/", "jobs/a-"] {
            assert!(validate_prefix(good).is_ok(), "{good}");
        }
        for bad in ["/jobs", "a//b", "a b", "{x}"] {
            assert!(validate_prefix(bad).is_err(), "{bad}");
        }
    }
}
