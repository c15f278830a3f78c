//! The `zk://` URL.

use std::time::Duration;

use distlock_core::{Error, InputKind, Result};

use crate::Layout;

/// The shortest `session_timeout_ms` accepted: ZooKeeper's smallest
/// session timeout with a tick of 1 ms (`minSessionTimeout` is two ticks).
pub(crate) const MIN_SESSION_TIMEOUT: Duration = Duration::from_millis(2);

/// Which ACL the nodes distlock creates carry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Acl {
    /// The creator may do everything, anyone may read.
    Creator,
    /// Anyone may do everything.
    Open,
}

/// What a `zk://` URL says. Its `Debug` shows no password.
pub(crate) struct ZkUrl {
    pub(crate) hosts: String,
    /// `user:password` for the `digest` scheme.
    pub(crate) digest: Option<String>,
    /// The chroot and the root: the parent of every lock node.
    pub(crate) base: String,
    pub(crate) layout: Layout,
    pub(crate) session_timeout: Duration,
    pub(crate) hold_while_disconnected: bool,
    pub(crate) detached: bool,
    pub(crate) acl: Acl,
}

impl std::fmt::Debug for ZkUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ZkUrl")
            .field("hosts", &self.hosts)
            .field(
                "digest",
                &self.digest.as_deref().map(|d| match d.split_once(':') {
                    Some((user, _)) => format!("{user}:***"),
                    None => "***".to_owned(),
                }),
            )
            .field("base", &self.base)
            .field("layout", &self.layout)
            .field("session_timeout", &self.session_timeout)
            .field("hold_while_disconnected", &self.hold_while_disconnected)
            .field("detached", &self.detached)
            .field("acl", &self.acl)
            .finish()
    }
}

/// Parses `zk://[user:password@]host:port[,host:port...][/chroot][?options]`
/// (see [`ZooKeeperBackend::connect`](crate::ZooKeeperBackend::connect)).
pub(crate) fn parse(url: &str) -> Result<ZkUrl> {
    distlock_core::input::check_userinfo_encoded(url, &['/', '?'])?;
    let bad = |why: String| Error::invalid(InputKind::Url, format!("zk:// URL: {why}"));
    let rest = url
        .strip_prefix("zk://")
        .ok_or_else(|| bad("expected zk://host:port[,host:port...][/chroot]".into()))?;
    let (rest, query) = rest.split_once('?').unwrap_or((rest, ""));
    let (authority, chroot) = match rest.find('/') {
        Some(i) => (&rest[..i], rest[i..].trim_end_matches('/')),
        None => (rest, ""),
    };
    let (digest, hosts) = match authority.rsplit_once('@') {
        Some((creds, hosts)) => {
            let (user, password) = creds
                .split_once(':')
                .filter(|(u, p)| !u.is_empty() && !p.is_empty())
                .ok_or_else(|| bad("credentials must be user:password@".into()))?;
            (Some(format!("{user}:{password}")), hosts)
        }
        None => (None, authority),
    };
    distlock_core::input::host_ports("server", hosts, bad)?;
    let mut session_timeout = Duration::from_secs(10);
    let mut root = "/distlock".to_string();
    let mut layout = Layout::Mutex;
    let (mut hold_while_disconnected, mut detached) = (false, false);
    let mut acl = if digest.is_some() {
        Acl::Creator
    } else {
        Acl::Open
    };
    let flag = |k: &str, v: &str| match v {
        "true" | "1" => Ok(true),
        "false" | "0" => Ok(false),
        _ => Err(bad(format!("{k}={v:?}; use true or false"))),
    };
    for (k, v) in distlock_core::input::query_pairs("zk://", query)? {
        match k {
            "session_timeout_ms" => {
                session_timeout = Duration::from_millis(
                    v.parse()
                        .map_err(|_| bad(format!("{k}={v:?} is not a number")))?,
                )
            }
            "root" => root = v.to_string(),
            "layout" => {
                layout = match v {
                    "mutex" => Layout::Mutex,
                    "rwlock" => Layout::RwLock,
                    _ => return Err(bad(format!("layout={v:?}; use mutex or rwlock"))),
                }
            }
            "hold_while_disconnected" => hold_while_disconnected = flag(k, v)?,
            "detached" => detached = flag(k, v)?,
            "acl" => {
                acl = match v {
                    "open" => Acl::Open,
                    "creator" if digest.is_some() => Acl::Creator,
                    "creator" => {
                        return Err(bad(
                            "acl=creator needs credentials: zk://user:password@host:port".into(),
                        ))
                    }
                    _ => return Err(bad(format!("acl={v:?}; use creator or open"))),
                }
            }
            _ => return Err(bad(format!("unknown parameter {k:?}"))),
        }
    }
    // The client would replace 0 with its own default, silently.
    distlock_core::input::check_millis(
        "session_timeout_ms",
        session_timeout,
        MIN_SESSION_TIMEOUT,
        distlock_core::input::MAX_TIMEOUT,
    )?;
    let base = format!("{chroot}/{}", root.trim_matches('/'));
    if base
        .split('/')
        .skip(1)
        .any(|s| s.is_empty() || s == "." || s == "..")
    {
        return Err(bad(format!(
            "chroot and root must be plain paths, got chroot {chroot:?} and root {root:?}"
        )));
    }
    Ok(ZkUrl {
        hosts: hosts.to_string(),
        digest,
        base,
        layout,
        session_timeout,
        hold_while_disconnected,
        detached,
        acl,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(url: &str) -> String {
        match parse(url) {
            Err(e @ Error::InvalidInput { .. }) => e.to_string(),
            other => panic!("{url}: expected InvalidInput, got {other:?}"),
        }
    }

    #[test]
    fn parses_the_url() {
        let u =
            parse("zk://u:p@a:1,b:2/app?session_timeout_ms=4000&layout=rwlock&root=locks").unwrap();
        assert_eq!(u.hosts, "a:1,b:2");
        assert_eq!(u.digest.as_deref(), Some("u:p"));
        assert_eq!(u.base, "/app/locks");
        assert_eq!(u.layout, Layout::RwLock);
        assert_eq!(u.session_timeout, Duration::from_secs(4));
        assert_eq!(u.acl, Acl::Creator);
        let shown = format!("{u:?}");
        assert!(
            shown.contains("u:***") && !shown.contains("u:p\""),
            "{shown}"
        );
        let u = parse("zk://a:1").unwrap();
        assert_eq!((u.base.as_str(), u.acl), ("/distlock", Acl::Open));
    }

    #[test]
    fn a_session_timeout_of_zero_or_above_an_hour_is_refused() {
        for t in ["0", "1", "3600001", "18446744073709551615"] {
            let text = refused(&format!("zk://a:1?session_timeout_ms={t}"));
            assert!(text.contains(&format!("session_timeout_ms={t}")), "{text}");
            assert!(text.contains("from 2 to 3600000"), "{text}");
        }
        assert!(parse("zk://a:1?session_timeout_ms=3600000").is_ok());
    }

    #[test]
    fn a_server_listed_twice_is_refused() {
        for url in ["zk://h:1,h:1", "zk://a:2,H:1,h:1/app"] {
            let text = refused(url);
            assert!(text.contains("h:1") && text.contains("twice"), "{text}");
        }
        assert!(parse("zk://h:1,h:2").is_ok());
    }

    #[test]
    fn an_empty_or_dotted_root_is_refused_naming_what_was_given() {
        let text = refused("zk://a:1?root=");
        assert!(text.contains(r#"root """#), "{text}");
        let text = refused("zk://a:1/app?root=x/../y");
        assert!(
            text.contains(r#"chroot "/app""#) && text.contains(r#"root "x/../y""#),
            "{text}"
        );
    }

    #[test]
    fn a_repeated_parameter_is_refused() {
        let text = refused("zk://a:1?layout=mutex&layout=rwlock");
        assert!(text.contains("layout is given twice"), "{text}");
        refused("zk://a:1?bogus=1");
    }
}
