//! `connect(url)`: a backend from a URL, whichever backends are compiled in.

use distlock_core::{DynBackend, Error, InputKind, Result};

/// Every URL scheme distlock knows, with the cargo feature that provides it.
pub const SCHEMES: &[(&str, &str)] = &[
    ("memory", "(always)"),
    ("sqlite", "sqlite"),
    ("postgres", "postgres"),
    ("postgresql", "postgres"),
    ("mysql", "mysql"),
    ("mariadb", "mysql"),
    ("redis", "redis"),
    ("rediss", "redis-tls"),
    ("redis+sentinel", "redis"),
    ("redis+cluster", "redis"),
    ("rediss+sentinel", "redis-tls"),
    ("rediss+cluster", "redis-tls"),
    ("redlock", "redlock"),
    ("etcd", "etcd"),
    ("etcds", "etcd-tls"),
    ("zk", "zookeeper"),
];

/// Connects to the backend a URL names:
///
/// | scheme | backend | feature |
/// |---|---|---|
/// | `memory://` (nothing after it) | in-process table (one process only: demos and tests) | always |
/// | `sqlite://PATH` | SQLite file | `sqlite` (default) |
/// | `postgres://`, `postgresql://` | PostgreSQL | `postgres` (with `sql-tls` for `sslmode=require` and stricter) |
/// | `mysql://`, `mariadb://` | MySQL / MariaDB | `mysql` (with `sql-tls` for `ssl-mode=REQUIRED` and stricter) |
/// | `redis://`, `redis+sentinel://h:p[,h:p]/SERVICE`, `redis+cluster://h:p[,h:p]`, and over TLS `rediss://`, `rediss+sentinel://`, `rediss+cluster://` | Redis | `redis` (`redis-tls` for the `rediss` forms) |
/// | `redlock://h:p,h:p,h:p` | Redlock | `redlock` |
/// | `etcd://h:p[,h:p]`, `etcds://h:p[,h:p]` | etcd | `etcd` (`etcd-tls` for `etcds`) |
/// | `zk://h:p[,h:p][/chroot]` | ZooKeeper | `zookeeper` |
///
/// Backend options go in query parameters; see each backend crate. A scheme
/// whose feature is not compiled in gives an error naming the feature.
pub async fn connect(url: &str) -> Result<DynBackend> {
    let scheme = url.split_once("://").map(|(s, _)| s).ok_or_else(|| {
        Error::invalid(
            InputKind::Url,
            format!(
                "{:?} is not a URL; expected scheme://..., e.g. sqlite:///var/lib/app/locks.db",
                redact(url)
            ),
        )
    })?;
    let feature = SCHEMES
        .iter()
        .find(|(s, _)| *s == scheme)
        .map(|(_, f)| *f)
        .ok_or_else(|| {
            let known: Vec<&str> = SCHEMES.iter().map(|(s, _)| *s).collect();
            Error::invalid(
                InputKind::Url,
                format!(
                    "unknown backend scheme {scheme:?}; known: {}",
                    known.join(", ")
                ),
            )
        })?;
    let missing = || {
        Error::invalid(
            InputKind::Url,
            format!("{scheme}:// needs the `{feature}` cargo feature of distlock, which this build does not have"),
        )
    };
    match scheme {
        "memory" if url == "memory://" => {
            Ok(std::sync::Arc::new(distlock_core::MemoryBackend::new()))
        }
        "memory" => Err(Error::invalid(
            InputKind::Url,
            format!(
                "{:?}: memory:// takes no host, path or parameters; use memory://",
                redact(url)
            ),
        )),
        "sqlite" | "postgres" | "postgresql" | "mysql" | "mariadb" => {
            #[cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql"))]
            {
                let enabled = match feature {
                    "sqlite" => cfg!(feature = "sqlite"),
                    "postgres" => cfg!(feature = "postgres"),
                    _ => cfg!(feature = "mysql"),
                };
                if enabled {
                    return Ok(std::sync::Arc::new(
                        distlock_sql::SqlBackend::connect(url).await?,
                    ));
                }
            }
            Err(missing())
        }
        "redis" | "redis+sentinel" | "redis+cluster" | "rediss" | "rediss+sentinel"
        | "rediss+cluster" => {
            #[cfg(feature = "redis")]
            if feature == "redis" || cfg!(feature = "redis-tls") {
                return Ok(std::sync::Arc::new(
                    distlock_redis::RedisBackend::connect(url).await?,
                ));
            }
            Err(missing())
        }
        "redlock" => {
            #[cfg(feature = "redlock")]
            return Ok(std::sync::Arc::new(
                distlock_redlock::RedlockBackend::connect(url).await?,
            ));
            #[allow(unreachable_code)]
            Err(missing())
        }
        "etcd" | "etcds" => {
            #[cfg(feature = "etcd")]
            if scheme != "etcds" || cfg!(feature = "etcd-tls") {
                return Ok(std::sync::Arc::new(
                    distlock_etcd::EtcdBackend::connect(url).await?,
                ));
            }
            Err(missing())
        }
        "zk" => {
            #[cfg(feature = "zookeeper")]
            return Ok(std::sync::Arc::new(
                distlock_zookeeper::ZooKeeperBackend::connect(url).await?,
            ));
            #[allow(unreachable_code)]
            Err(missing())
        }
        _ => Err(missing()),
    }
}

/// The URL with any password replaced by `***`, in the userinfo and in a
/// `password=` query parameter (PostgreSQL's), for logs and for the
/// `DISTLOCK_BACKEND` variable handed to child processes.
pub fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        // Not a URL (a mistyped `scheme:/`): whatever comes before an `@`
        // may be a password, and is hidden but for a scheme.
        return match url.rsplit_once('@') {
            Some((before, hosts)) => match before.split_once(':') {
                Some((scheme, _)) => format!("{scheme}:***@{hosts}"),
                None => format!("***@{hosts}"),
            },
            None => url.to_string(),
        };
    };
    let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(authority_end);
    let tail = match tail.split_once('?') {
        Some((path, query)) => {
            let pairs: Vec<String> = query
                .split('&')
                .map(|pair| match pair.split_once('=') {
                    Some((key, _)) if key.eq_ignore_ascii_case("password") => {
                        format!("{key}=***")
                    }
                    _ => pair.to_string(),
                })
                .collect();
            format!("{path}?{}", pairs.join("&"))
        }
        None => tail.to_string(),
    };
    match authority.rsplit_once('@') {
        Some((userinfo, hosts)) => {
            let user = userinfo.split_once(':').map_or(userinfo, |(u, _)| u);
            if userinfo.contains(':') {
                format!("{scheme}://{user}:***@{hosts}{tail}")
            } else {
                format!("{scheme}://{user}@{hosts}{tail}")
            }
        }
        None => format!("{scheme}://{authority}{tail}"),
    }
}

/// The compiled-in backends and what each declares, without connecting
/// (what `distlock backends` prints). Redlock is listed with and without its
/// opt-in fencing.
pub fn declared_backends() -> Vec<(&'static str, distlock_core::Capabilities)> {
    use distlock_core::Backend as _;
    #[allow(unused_mut)]
    let mut list = vec![(
        "memory://",
        distlock_core::MemoryBackend::new().capabilities(),
    )];
    #[cfg(feature = "sqlite")]
    list.push((
        "sqlite://",
        distlock_sql::SqlBackend::declared_capabilities("sqlite"),
    ));
    #[cfg(feature = "postgres")]
    list.push((
        "postgres://",
        distlock_sql::SqlBackend::declared_capabilities("postgres"),
    ));
    #[cfg(feature = "mysql")]
    list.push((
        "mysql://",
        distlock_sql::SqlBackend::declared_capabilities("mysql"),
    ));
    #[cfg(feature = "redis")]
    list.push((
        "redis://",
        distlock_redis::RedisBackend::declared_capabilities(),
    ));
    #[cfg(feature = "redlock")]
    {
        let plain = distlock_redlock::RedlockConfig::default();
        list.push((
            "redlock://",
            distlock_redlock::RedlockBackend::declared_capabilities(&plain),
        ));
        let fenced = distlock_redlock::RedlockConfig::default().with_fencing();
        list.push((
            "redlock://?fencing=true",
            distlock_redlock::RedlockBackend::declared_capabilities(&fenced),
        ));
    }
    #[cfg(feature = "etcd")]
    list.push((
        "etcd://",
        distlock_etcd::EtcdBackend::declared_capabilities(),
    ));
    #[cfg(feature = "zookeeper")]
    list.push((
        "zk://",
        distlock_zookeeper::ZooKeeperBackend::declared_capabilities(),
    ));
    list
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redact_hides_passwords_only() {
        assert_eq!(
            redact("postgres://app:s3cret@db:5432/x"),
            "postgres://app:***@db:5432/x"
        );
        assert_eq!(redact("redis://:pw@h:6379/0"), "redis://:***@h:6379/0");
        assert_eq!(
            redact("rediss+sentinel://u:pw@a:1,b:2/m?ca_file=/ca.pem"),
            "rediss+sentinel://u:***@a:1,b:2/m?ca_file=/ca.pem"
        );
        assert_eq!(redact("mysql://root@h:3306/d"), "mysql://root@h:3306/d");
        assert_eq!(redact("sqlite:///tmp/x.db"), "sqlite:///tmp/x.db");
        assert_eq!(
            redact("postgres:///db?host=h&password=s3cret&sslmode=require"),
            "postgres:///db?host=h&password=***&sslmode=require"
        );
        assert_eq!(
            redact("redlock://u:pw@a:1,b:2,c:3?fencing=true"),
            "redlock://u:***@a:1,b:2,c:3?fencing=true"
        );
        assert_eq!(
            redact("etcds://u:pw@a:1?ca_file=/ca.pem"),
            "etcds://u:***@a:1?ca_file=/ca.pem"
        );
        // Mistyped, not a URL at all: the password is hidden all the same.
        assert_eq!(
            redact("redis:/:s3cret@127.0.0.1:6379"),
            "redis:***@127.0.0.1:6379"
        );
        assert_eq!(redact("u:s3cret@h:1"), "u:***@h:1");
        assert_eq!(redact("nonsense"), "nonsense");
    }

    #[tokio::test]
    async fn memory_takes_nothing_after_the_scheme() {
        assert!(connect("memory://").await.is_ok());
        for bad in [
            "memory://anything/path?x=1",
            "memory://host",
            "memory:///",
            "memory://?x=1",
        ] {
            let Err(e) = connect(bad).await else {
                panic!("{bad} was accepted");
            };
            assert!(
                matches!(
                    e,
                    Error::InvalidInput {
                        kind: InputKind::Url,
                        ..
                    }
                ),
                "{bad}: {e:?}"
            );
            assert!(e.to_string().contains("use memory://"), "{e}");
        }
    }

    #[tokio::test]
    async fn unknown_and_malformed_urls_are_typed_errors() {
        for bad in ["nonsense", "ftp://x", "", "://x"] {
            assert!(
                matches!(
                    connect(bad).await,
                    Err(Error::InvalidInput {
                        kind: InputKind::Url,
                        ..
                    })
                ),
                "{bad}"
            );
        }
    }
}
