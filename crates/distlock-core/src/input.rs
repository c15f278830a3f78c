//! Checks shared by the backends' URL and option parsers.

use std::time::Duration;

use crate::error::{Error, InputKind, Result};

/// The longest network timeout a backend accepts (connect, request,
/// per-node and session timeouts): one hour. A longer one would make a call
/// to an unreachable server look like a hang.
pub const MAX_TIMEOUT: Duration = Duration::from_secs(3600);

/// The key and value of each `key=value` pair of a URL's query string (a
/// pair without `=` has an empty value), in order. A key given twice is
/// refused: which of two values was meant cannot be known. `what` names
/// the URL in the error (`"redis://"`).
pub fn query_pairs<'a>(what: &str, query: &'a str) -> Result<Vec<(&'a str, &'a str)>> {
    let mut pairs: Vec<(&str, &str)> = Vec::new();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        // Most likely the rest of a password holding a raw `&`: not shown.
        if !pair.contains('=')
            && pairs
                .last()
                .is_some_and(|(k, _)| k.to_ascii_lowercase().contains("pass"))
        {
            return Err(Error::invalid(
                InputKind::Url,
                format!(
                    "{what} URL: a parameter without `=` follows the password; a `&` in a password is %26"
                ),
            ));
        }
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        if let Some((_, first)) = pairs.iter().find(|(key, _)| *key == k) {
            // A secret's values are not shown.
            let shown = |v: &str| {
                if k.to_ascii_lowercase().contains("pass") {
                    "\"***\"".to_string()
                } else {
                    format!("{v:?}")
                }
            };
            return Err(Error::invalid(
                InputKind::Url,
                format!(
                    "{what} URL: parameter {k} is given twice ({k}={} and {k}={}); give it once",
                    shown(first),
                    shown(v)
                ),
            ));
        }
        pairs.push((k, v));
    }
    Ok(pairs)
}

/// Refuses a URL whose user or password holds one of `delimiters` (of
/// `/`, `?` and `#`, those the backend's parser splits the URL at before
/// it looks for the `@`): the parser would take part of the password for a
/// host, a path or a parameter, and name it in an error. Nothing of the URL
/// is in the message. Such a URL has, after its last `@` that comes after
/// its first delimiter, a host list with ports (whatever `@` came before
/// the delimiter: a password may hold one, unencoded, too); an `@` in a
/// path or a parameter's value (`/app@prod`, `?prefix=a@b`) is no user's.
pub fn check_userinfo_encoded(url: &str, delimiters: &[char]) -> Result<()> {
    let Some((_, rest)) = url.split_once("://") else {
        return Ok(());
    };
    let Some(first) = rest.find(delimiters) else {
        return Ok(());
    };
    let Some(at) = rest.rfind('@').filter(|at| *at > first) else {
        return Ok(());
    };
    let after = &rest[at + 1..];
    let hosts = after.split(['/', '?', '#']).next().unwrap_or("");
    let is_host_list = !hosts.is_empty()
        && hosts.split(',').all(|h| {
            h.rsplit_once(':').is_some_and(|(host, port)| {
                !host.is_empty() && !port.is_empty() && port.bytes().all(|b| b.is_ascii_digit())
            })
        });
    if !is_host_list {
        return Ok(());
    }
    Err(Error::invalid(
        crate::InputKind::Url,
        "the URL has an `@` after a `/`, `?` or `#`: a user or password holding one of those must be percent-encoded (`/` as %2F, `?` as %3F, `#` as %23, `@` as %40) where the backend decodes it (PostgreSQL, MySQL, Redis, Redlock); etcd and ZooKeeper take it as written, and cannot be given such a one in the URL",
    ))
}

/// Refuses a `#fragment` in the part of a URL that a client library reads
/// (the whole URL for sqlx; for the redis client what precedes the query
/// and the values it is passed), run after [`check_userinfo_encoded`], so
/// a `#` left is no password's: no backend URL takes one, and the library
/// may read one as an option of its own (the redis client reads
/// `#insecure` as "skip the certificate checks") or drop what follows.
pub fn check_no_fragment(read: &str) -> Result<()> {
    if read.contains('#') {
        return Err(Error::invalid(
            crate::InputKind::Url,
            "the URL has a `#` fragment, which no backend URL takes (a `#` in a password is %23)",
        ));
    }
    Ok(())
}

/// Refuses the userinfo of a URL (what comes before the `@`) that names a
/// user without a password, or a password that is empty: a client that
/// authenticates only when it has a password would connect as the
/// server's default user, without a word.
pub fn check_user_has_password(userinfo: &str) -> Result<()> {
    match userinfo.split_once(':') {
        Some((_, password)) if !password.is_empty() => Ok(()),
        _ => Err(Error::invalid(
            crate::InputKind::Url,
            "the URL names a user without a password, or an empty password: the client would connect as the server's default user; give user:password (or :password for the default user), or no credentials at all",
        )),
    }
}

/// A semaphore limit as distlock stores it: decimal digits without a
/// leading zero, 1 to `u32::MAX`; `None` for anything else (a backend's
/// grant compares the stored text with the limit asked for, so `03` would
/// read as 3 and yet refuse a request for 3).
pub fn stored_limit(text: &[u8]) -> Option<u32> {
    let digits = std::str::from_utf8(text).ok()?;
    if digits.starts_with('0') || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// Whether `pem` holds a PEM certificate: a CA file that holds none (a
/// wrong path, a key file) would trust nothing, and every server would be
/// refused for a certificate "signed by an unknown CA".
pub fn holds_pem_certificate(pem: &[u8]) -> bool {
    const BEGIN: &[u8] = b"-----BEGIN CERTIFICATE-----";
    pem.windows(BEGIN.len()).any(|w| w == BEGIN)
}

/// The `host:port` entries of a comma-separated server list, each checked
/// (a host and a port number) and none listed twice. Entries are compared
/// as the server sees them: the port as a number (`1` and `01` are one
/// port), an IP address as an address (`[::1]` and `[0:0::1]` are one), a
/// host name without case. Two names for one address are not caught here
/// (that needs a DNS lookup). `what` names an entry in the messages
/// (`"server"`, `"endpoint"`); each message is passed to `bad` for the
/// backend's error.
pub fn host_ports<'a>(
    what: &str,
    list: &'a str,
    bad: impl Fn(String) -> Error,
) -> Result<Vec<&'a str>> {
    let mut seen: Vec<((String, u16), &str)> = Vec::new();
    for h in list.split(',') {
        let Some(same) = server_key(h) else {
            return Err(bad(format!("{h:?} is not host:port")));
        };
        if let Some((_, first)) = seen.iter().find(|(k, _)| *k == same) {
            return Err(bad(format!(
                "{what} {h} is listed twice (as {first} and {h}); list each {what} once"
            )));
        }
        seen.push((same, h));
    }
    Ok(seen.into_iter().map(|(_, h)| h).collect())
}

/// `host:port` as the server it names: the host (an IP address in its
/// canonical form, a name in lower case) and the port; `None` if it is
/// not `host:port`.
fn server_key(entry: &str) -> Option<(String, u16)> {
    let (host, port) = entry.rsplit_once(':')?;
    let port = port.parse::<u16>().ok()?;
    if host.is_empty() {
        return None;
    }
    let bare = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    let host = match bare.parse::<std::net::IpAddr>() {
        Ok(ip) => ip.to_string(),
        Err(_) => host.to_ascii_lowercase(),
    };
    Some((host, port))
}

/// Checks a duration option against its range: `name` is the URL
/// parameter that sets it (in milliseconds), `min` and `max` the range.
pub fn check_millis(name: &str, value: Duration, min: Duration, max: Duration) -> Result<()> {
    if value < min || value > max {
        return Err(Error::invalid(
            InputKind::Config,
            format!(
                "{name}={} is out of range; it must be from {} to {} (ms)",
                value.as_millis(),
                min.as_millis(),
                max.as_millis()
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stored_limit_is_plain_digits_from_one() {
        assert_eq!(stored_limit(b"3"), Some(3));
        assert_eq!(stored_limit(b"4294967295"), Some(u32::MAX));
        for bad in ["", "0", "03", "+3", " 3", "3.0", "abc", "4294967296", "-1"] {
            assert_eq!(stored_limit(bad.as_bytes()), None, "{bad:?}");
        }
    }

    #[test]
    fn a_file_without_a_pem_certificate_is_told_apart() {
        assert!(holds_pem_certificate(
            b"junk\n-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"
        ));
        assert!(!holds_pem_certificate(b"root:x:0:0:root:/root:/bin/bash\n"));
        assert!(!holds_pem_certificate(
            b"-----BEGIN PRIVATE KEY-----\nMIIB\n-----END PRIVATE KEY-----\n"
        ));
    }

    #[test]
    fn the_rest_of_a_password_after_a_raw_ampersand_is_not_shown() {
        let e = query_pairs("postgres://", "sslmode=disable&password=SE&KRIT")
            .unwrap_err()
            .to_string();
        assert!(!e.contains("KRIT") && e.contains("%26"), "{e}");
        assert!(query_pairs("postgres://", "password=SE%26KRIT&sslmode=disable").is_ok());
        assert!(query_pairs("redis://", "fifo&prefix=a").is_ok());
    }

    #[test]
    fn a_password_with_an_unencoded_delimiter_is_refused_without_showing_it() {
        let all = ['/', '?', '#'];
        for url in [
            "redis://u:S3cr3t/XYZZY@127.0.0.1:6379",
            "redis://u:S3cr3t?XYZZY@127.0.0.1:6379",
            "redis://u:S3cr3t?XYZ=ZY@127.0.0.1:6379",
            "postgres://u:S3cr3t#XYZZY@db:5432/app",
            "zk://u:S3cr3t/XYZZY==@h:2181,h2:2181/root",
            "redis://:S3@cr3t?XYZZY@127.0.0.1:6379",
            "postgres://app:S3@cr3t/XYZZY@127.0.0.1:5432/postgres",
            "redlock://:S3@cr3t#XYZZY@a:1,b:2,c:3",
        ] {
            let e = check_userinfo_encoded(url, &all).unwrap_err().to_string();
            assert!(!e.contains("S3cr3t") && !e.contains("XYZZY"), "{e}");
            assert!(e.contains("percent-encoded"), "{e}");
        }
        for url in [
            "redis://u:S3cr3t%2FXYZZY@127.0.0.1:6379/0",
            "redis://127.0.0.1:6379/0?prefix=a@b",
            "redis://u:p@127.0.0.1:6379?prefix=a@b",
            "postgres://u@db/app?sslrootcert=/certs/a@b.pem",
            "postgres://u@h/my@db",
            "zk://h:2181/app@prod",
            "etcd://h1:2379,h2:2379",
        ] {
            assert!(check_userinfo_encoded(url, &all).is_ok(), "{url}");
        }
        // A backend that splits only at `?` takes a `/` in the password.
        assert!(check_userinfo_encoded("etcd://u:a/b@h:2379", &['?']).is_ok());
        assert!(check_userinfo_encoded("etcd://u:a?b@h:2379", &['?']).is_err());
    }

    #[test]
    fn a_repeated_query_key_is_refused() {
        assert_eq!(
            query_pairs("x://", "a=1&&b&c=").unwrap(),
            [("a", "1"), ("b", ""), ("c", "")]
        );
        let e = query_pairs("x://", "fifo=true&b=1&fifo=false").unwrap_err();
        assert!(
            matches!(
                e,
                Error::InvalidInput {
                    kind: InputKind::Url,
                    ..
                }
            ),
            "{e:?}"
        );
        let text = e.to_string();
        assert!(text.contains("fifo is given twice"), "{text}");
        assert!(
            text.contains("\"true\"") && text.contains("\"false\""),
            "{text}"
        );
        let e = query_pairs("postgres://", "password=hunter2&password=hunter3").unwrap_err();
        let text = e.to_string();
        assert!(text.contains("password is given twice"), "{text}");
        assert!(!text.contains("hunter"), "a password shown: {text}");
    }

    #[test]
    fn a_host_list_needs_ports_and_no_host_twice() {
        let bad = |m: String| Error::invalid(InputKind::Url, m);
        assert_eq!(
            host_ports("server", "a:1,b:2", bad).unwrap(),
            ["a:1", "b:2"]
        );
        // Other ports, other addresses: different servers.
        assert_eq!(
            host_ports("server", "a:1,a:10,[::1]:1,[::2]:1,127.0.0.1:1", bad).unwrap(),
            ["a:1", "a:10", "[::1]:1", "[::2]:1", "127.0.0.1:1"]
        );
        for (list, says) in [
            ("a:1,A:1", "server A:1 is listed twice (as a:1 and A:1)"),
            (
                "127.0.0.1:1,127.0.0.1:01",
                "server 127.0.0.1:01 is listed twice (as 127.0.0.1:1 and 127.0.0.1:01)",
            ),
            ("h:2379,b:1,H:002379", "server H:002379 is listed twice"),
            ("[::1]:1,[0:0::1]:1", "server [0:0::1]:1 is listed twice"),
            ("a:1,b", "\"b\" is not host:port"),
            ("a:1,", "\"\" is not host:port"),
            (":1", "\":1\" is not host:port"),
        ] {
            let e = host_ports("server", list, bad).unwrap_err().to_string();
            assert!(e.contains(says), "{list}: {e}");
        }
    }

    #[test]
    fn durations_out_of_range_are_refused_with_the_range() {
        let (min, max) = (Duration::from_millis(1), MAX_TIMEOUT);
        assert!(check_millis("timeout_ms", Duration::from_secs(2), min, max).is_ok());
        assert!(check_millis("timeout_ms", MAX_TIMEOUT, min, max).is_ok());
        for bad in [Duration::ZERO, Duration::from_millis(u64::MAX)] {
            let e = check_millis("timeout_ms", bad, min, max).unwrap_err();
            let text = e.to_string();
            assert!(text.contains("timeout_ms="), "{text}");
            assert!(text.contains("from 1 to 3600000"), "{text}");
        }
    }
}
