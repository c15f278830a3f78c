//! Options and the URL forms.

use std::time::Duration;

use distlock_core::{Error, InputKind, Result};

/// Options for [`RedisBackend`](crate::RedisBackend). URL query parameters
/// set the same options:
///
/// | parameter | meaning | default |
/// |---|---|---|
/// | `prefix` | prepended to every lock key | empty |
/// | `wait_replicas` | after a grant, `WAIT` for this many replicas; release and fail if fewer acknowledge | 0 (off) |
/// | `wait_timeout_ms` | the `WAIT` timeout; 1 to 3600000 | 100 |
/// | `timeout_ms` | connect and response timeout; 1 to 3600000 (one hour) | 2000 |
/// | `observe_recheck_ms` | an election's observer reads the leader at least this often, besides each message on the election's channel and each lease end; 1 to 3600000 | 1000 |
/// | `fifo` | `true`: waiting exclusive and shared requests (and permit requests and campaigns, in a semaphore's or an election's own queue) queue on the server and are granted in arrival order, a release waking only the queue's head (the readers queued together at the head; for a semaphore, only the waiter its freed permit is for) (each uncontended acquire and release then also checks the queue: +0.03-0.04 on the uncontended ratio, docs/benchmarks.md); `false`: a release wakes every waiter and the first to ask wins | `false` |
/// | `queue_lease_ms` | how long a waiter's queue entry outlives its last attempt (a waiter renews it every third of this): a killed or cut-off waiter holds up the queue at most this long, or until its wait's deadline if that comes first; 30 to 3600000 | 3000 |
/// | `ca_file` | `rediss://`, `rediss+sentinel://`, `rediss+cluster://`: PEM file of the CA to trust instead of the system roots | system roots |
///
/// `protocol` (`resp2` or `resp3`) on `redis://` and `rediss://` is passed
/// to the redis client. Any other parameter, `protocol` on the Sentinel and
/// Cluster forms, `ca_file` on a form without TLS, a parameter given twice
/// and a value out of range are [`Error::InvalidInput`].
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct RedisConfig {
    /// Prefix for lock keys (no `{` or `}`).
    pub prefix: String,
    /// Replicas that must acknowledge a grant (`WAIT`); 0 switches it off.
    pub wait_replicas: u32,
    /// How long `WAIT` may take: 1 ms to 1 hour.
    pub wait_timeout: Duration,
    /// Connect and per-command response timeout: 1 ms to 1 hour.
    pub timeout: Duration,
    /// How often an election's observer reads the leader when its channel
    /// is silent and no lease ends: the bound on the lag after a message
    /// lost without the pub/sub connection failing.
    pub observe_recheck: Duration,
    /// Whether waiting exclusive, shared and permit requests and campaigns
    /// queue on the server, first come, first served (see `acquire.lua`,
    /// `shared_acquire.lua` and `wait_queue.lua`).
    pub fifo: bool,
    /// How long a waiter's queue entry outlives its last attempt.
    pub queue_lease: Duration,
    /// TLS URLs (`rediss://`, `rediss+sentinel://`, `rediss+cluster://`):
    /// trust this CA (PEM file) instead of the system roots.
    pub ca_file: Option<std::path::PathBuf>,
    /// The id that starts this client's queue entries and names its queue
    /// channel; a random one when `None`. Redlock gives all its nodes one
    /// id, so that a waiter's entries are the same string on every node.
    pub client_id: Option<String>,
}

impl Default for RedisConfig {
    fn default() -> Self {
        Self {
            prefix: String::new(),
            wait_replicas: 0,
            wait_timeout: Duration::from_millis(100),
            timeout: Duration::from_secs(2),
            observe_recheck: Duration::from_secs(1),
            fifo: false,
            queue_lease: Duration::from_secs(3),
            ca_file: None,
            client_id: None,
        }
    }
}

impl RedisConfig {
    /// Sets the key prefix.
    pub fn with_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// Requires `n` replicas to acknowledge each grant within `timeout`.
    pub fn with_wait_replicas(mut self, n: u32, timeout: Duration) -> Self {
        self.wait_replicas = n;
        self.wait_timeout = timeout;
        self
    }

    /// Sets how often an election's observer reads the leader when its
    /// channel is silent and no lease ends.
    pub fn with_observe_recheck(mut self, every: Duration) -> Self {
        self.observe_recheck = every;
        self
    }

    /// Sets whether waiting exclusive requests queue on the server, first
    /// come, first served.
    pub fn with_fifo(mut self, fifo: bool) -> Self {
        self.fifo = fifo;
        self
    }

    /// Sets how long a waiter's queue entry outlives its last attempt.
    pub fn with_queue_lease(mut self, lease: Duration) -> Self {
        self.queue_lease = lease;
        self
    }

    /// Sets the id that starts this client's queue entries (see
    /// [`client_id`](Self::client_id)).
    pub fn with_client_id(mut self, id: impl Into<String>) -> Self {
        self.client_id = Some(id.into());
        self
    }

    /// The errors [`connect`](crate::RedisBackend::connect) would give for
    /// this configuration, without connecting.
    pub fn validate(&self) -> Result<()> {
        if self.prefix.contains(['{', '}']) {
            return Err(Error::invalid(
                InputKind::Config,
                format!(
                    "key prefix {:?} must not contain braces (they are Redis Cluster hash tags)",
                    self.prefix
                ),
            ));
        }
        if self.timeout.is_zero() {
            return Err(Error::invalid(
                InputKind::Config,
                "timeout must be greater than zero",
            ));
        }
        if self.observe_recheck.is_zero() {
            return Err(Error::invalid(
                InputKind::Config,
                "observe_recheck must be greater than zero",
            ));
        }
        distlock_core::wait::check_queue_lease(self.queue_lease)?;
        {
            use distlock_core::input::{check_millis, MAX_TIMEOUT};
            let ms = Duration::from_millis(1);
            check_millis("timeout_ms", self.timeout, ms, MAX_TIMEOUT)?;
            // `WAIT` with a timeout of 0 blocks for ever.
            check_millis("wait_timeout_ms", self.wait_timeout, ms, MAX_TIMEOUT)?;
            check_millis("observe_recheck_ms", self.observe_recheck, ms, MAX_TIMEOUT)?;
            // A `WAIT` the response timeout cuts short would leave the
            // grant's fate unknown and the connection replaced.
            if self.wait_replicas > 0 && self.wait_timeout >= self.timeout {
                return Err(Error::invalid(
                    InputKind::Config,
                    format!(
                        "wait_timeout_ms={} must be below timeout_ms={}: every request waits behind a grant's WAIT on the client's one connection",
                        self.wait_timeout.as_millis(),
                        self.timeout.as_millis()
                    ),
                ));
            }
            // At least 30 ms, checked above.
            check_millis(
                "queue_lease_ms",
                self.queue_lease,
                Duration::from_millis(30),
                MAX_TIMEOUT,
            )?;
        }
        if let Some(id) = &self.client_id {
            if id.is_empty() || id.contains(char::is_whitespace) {
                return Err(Error::invalid(
                    InputKind::Config,
                    format!("client_id {id:?} must be a non-empty word without spaces"),
                ));
            }
        }
        Ok(())
    }
}

/// Where the data lives. Its `Debug` shows no password.
#[derive(Clone, PartialEq, Eq)]
pub(crate) enum Topology {
    /// One server: a URL for the redis client.
    Single(String),
    /// Sentinels that know the master of `service`, as redis URLs.
    Sentinel {
        sentinels: Vec<String>,
        service: String,
        db: i64,
        username: Option<String>,
        password: Option<String>,
        /// TLS to the Sentinels and to the master.
        tls: bool,
    },
    /// Cluster seed nodes, as redis URLs (`rediss://` for TLS).
    Cluster(Vec<String>),
}

impl std::fmt::Debug for Topology {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Single(url) => f.debug_tuple("Single").field(&redacted(url)).finish(),
            Self::Sentinel {
                sentinels,
                service,
                db,
                username,
                password,
                tls,
            } => f
                .debug_struct("Sentinel")
                .field(
                    "sentinels",
                    &sentinels.iter().map(|u| redacted(u)).collect::<Vec<_>>(),
                )
                .field("service", service)
                .field("db", db)
                .field("username", username)
                .field("password", &password.as_ref().map(|_| "***"))
                .field("tls", tls)
                .finish(),
            Self::Cluster(seeds) => f
                .debug_tuple("Cluster")
                .field(&seeds.iter().map(|u| redacted(u)).collect::<Vec<_>>())
                .finish(),
        }
    }
}

impl Topology {
    /// After a connect failed for want of an answer (`timed_out`: none
    /// came in time): why the first server the URL names cannot be reached
    /// with the URL's scheme, when it speaks plain Redis to a TLS URL (it
    /// waits for the rest of the handshake's bytes as a command) or TLS to
    /// a plain one (it closes the connection at the first command). Asking
    /// takes a second at most.
    pub(crate) async fn wrong_scheme(
        &self,
        timed_out: bool,
        timeout: Duration,
    ) -> Option<&'static str> {
        let (addr, tls) = self.first_host()?;
        let timeout = timeout.min(Duration::from_secs(1));
        if tls {
            let answer = distlock_core::probe::answer(addr, b"PING\r\n", 1, timeout).await?;
            matches!(answer.first(), Some(b'+' | b'-')).then_some(
                "the server answers plain Redis, not TLS: use redis://, redis+sentinel:// or redis+cluster://",
            )
        } else if timed_out {
            None
        } else {
            distlock_core::probe::speaks_tls(addr, timeout).await.then_some(
                "the server speaks TLS only: use rediss://, rediss+sentinel:// or rediss+cluster:// (with ca_file= for a private CA)",
            )
        }
    }
}

impl Topology {
    /// The `host:port` of the first server the URL names, and whether the
    /// URL asks for TLS.
    fn first_host(&self) -> Option<(&str, bool)> {
        let (url, tls) = match self {
            Self::Single(url) => (url.as_str(), url.starts_with("rediss:")),
            Self::Cluster(seeds) => (seeds.first()?.as_str(), seeds[0].starts_with("rediss:")),
            Self::Sentinel { sentinels, tls, .. } => (sentinels.first()?.as_str(), *tls),
        };
        Some((host_port(url)?, tls))
    }

    /// After a connect failed: that the first server the URL names speaks
    /// another protocol than Redis (a URL with another backend's port).
    /// Asking takes a second at most.
    pub(crate) async fn foreign_protocol(&self, timeout: Duration) -> Option<String> {
        let (addr, _) = self.first_host()?;
        distlock_core::probe::foreign_protocol(addr, distlock_core::probe::Protocol::Redis, timeout)
            .await
    }
}

/// The `host:port` of a redis URL.
fn host_port(url: &str) -> Option<&str> {
    let rest = url.split_once("://")?.1;
    let authority = &rest[..rest.find(['/', '?', '#']).unwrap_or(rest.len())];
    Some(
        authority
            .rsplit_once('@')
            .map_or(authority, |(_, hosts)| hosts),
    )
}

/// `url` with its userinfo, if any, replaced by `***`.
fn redacted(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return "***".into();
    };
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    match rest[..authority_end].rfind('@') {
        Some(at) => format!("{scheme}://***{}", &rest[at..]),
        None => url.to_owned(),
    }
}

/// A parsed URL: topology plus an endpoint string without credentials.
#[derive(Debug)]
pub(crate) struct Parsed {
    pub(crate) topology: Topology,
    pub(crate) endpoint: String,
}

fn bad(url: &str, why: impl std::fmt::Display) -> Error {
    // Never echo a password: show the scheme and hosts only.
    let shown = url.split_once("://").map_or("?", |(s, _)| s);
    Error::invalid(InputKind::Url, format!("{shown}:// URL: {why}"))
}

/// Parses `redis://`, `redis+sentinel://` and `redis+cluster://` URLs, and
/// their TLS forms `rediss://`, `rediss+sentinel://` and `rediss+cluster://`,
/// taking distlock's own query parameters into `config`.
pub(crate) fn parse(url: &str, config: &mut RedisConfig) -> Result<Parsed> {
    distlock_core::input::check_userinfo_encoded(url, &['/', '?', '#'])?;
    // What the redis client reads: the URL before its query, and the
    // parameters passed on to it (checked below). A `#` in distlock's own
    // parameters (a prefix) stays with distlock.
    distlock_core::input::check_no_fragment(url.split('?').next().unwrap_or(url))?;
    let (scheme, rest) = url
        .split_once("://")
        .ok_or_else(|| bad(url, "expected scheme://host:port"))?;
    let (rest, query) = rest.split_once('?').unwrap_or((rest, ""));
    let mut passthrough = Vec::new();
    for (k, v) in distlock_core::input::query_pairs(&format!("{scheme}://"), query)? {
        let number = |v: &str| {
            v.parse::<u64>()
                .map_err(|_| bad(url, format!("{k}={v:?} is not a number")))
        };
        match k {
            "prefix" => config.prefix = v.to_string(),
            "wait_replicas" => {
                config.wait_replicas =
                    u32::try_from(number(v)?).map_err(|_| bad(url, "wait_replicas too large"))?
            }
            "wait_timeout_ms" => config.wait_timeout = Duration::from_millis(number(v)?),
            "timeout_ms" => config.timeout = Duration::from_millis(number(v)?),
            "observe_recheck_ms" => config.observe_recheck = Duration::from_millis(number(v)?),
            "queue_lease_ms" => config.queue_lease = Duration::from_millis(number(v)?),
            "fifo" => {
                config.fifo = match v {
                    "true" | "1" => true,
                    "false" | "0" => false,
                    _ => return Err(bad(url, format!("fifo={v:?} is not true or false"))),
                }
            }
            "ca_file" if scheme.starts_with("rediss") => config.ca_file = Some(v.into()),
            "ca_file" => {
                return Err(bad(
                    url,
                    "ca_file applies to the TLS forms only (rediss://, rediss+sentinel://, rediss+cluster://)",
                ))
            }
            // The one parameter the redis client reads from a host:port URL.
            "protocol" if matches!(scheme, "redis" | "rediss") => {
                distlock_core::input::check_no_fragment(v)?;
                passthrough.push(format!("{k}={v}"))
            }
            "protocol" => {
                return Err(bad(
                    url,
                    format!("protocol={v:?} applies to redis:// and rediss:// only; {scheme}:// does not pass it on"),
                ))
            }
            _ => {
                return Err(bad(
                    url,
                    format!("unknown parameter {k:?}; see the parameters of distlock-redis's RedisConfig"),
                ))
            }
        }
    }
    config.validate()?;
    let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
    let (userinfo, hosts) = match authority.rsplit_once('@') {
        Some((u, h)) => (Some(u), h),
        None => (None, authority),
    };
    if hosts.is_empty() {
        return Err(bad(url, "no host"));
    }
    if let Some(u) = userinfo {
        distlock_core::input::check_user_has_password(u)?;
    }
    // Each entry host:port, none empty, none twice: a Sentinel or seed
    // node listed twice would be asked twice and counted twice.
    let hosts = distlock_core::input::host_ports("server", hosts, |why| bad(url, why))?;
    let endpoint = hosts.join(",");
    let creds = userinfo.map(|u| format!("{u}@")).unwrap_or_default();
    // The TLS forms name the same topologies with `rediss` in front.
    let (tls, topology_scheme) = match scheme.strip_prefix("rediss") {
        Some(rest) => (true, format!("redis{rest}")),
        None => (false, scheme.to_string()),
    };
    let node_scheme = if tls { "rediss" } else { "redis" };
    if tls
        && !cfg!(feature = "tls")
        && matches!(
            topology_scheme.as_str(),
            "redis" | "redis+sentinel" | "redis+cluster"
        )
    {
        return Err(Error::Unsupported {
            backend: "redis",
            operation: "TLS (rediss://, rediss+sentinel://, rediss+cluster://) without the `tls` cargo feature of distlock-redis",
        });
    }
    let topology = match topology_scheme.as_str() {
        "redis" => {
            if hosts.len() != 1 {
                return Err(bad(
                    url,
                    "takes one host; use redis+sentinel:// or redis+cluster:// for several",
                ));
            }
            let q = if passthrough.is_empty() {
                String::new()
            } else {
                format!("?{}", passthrough.join("&"))
            };
            let p = if path.is_empty() {
                String::new()
            } else {
                format!("/{path}")
            };
            Topology::Single(format!("{scheme}://{creds}{}{p}{q}", hosts[0]))
        }
        "redis+sentinel" => {
            let form = "redis+sentinel://host:port/SERVICE[/DB]";
            let mut parts = path.split('/');
            let service = parts.next().filter(|s| !s.is_empty()).ok_or_else(|| {
                bad(url, format!("missing the service name: {form}"))
            })?;
            let db = match parts.next() {
                Some(d) => d.parse::<u32>().map_err(|_| {
                    bad(
                        url,
                        format!("database {d:?} is not a number from 0 up: {form}"),
                    )
                })?,
                None => 0,
            };
            if let Some(extra) = parts.next() {
                return Err(bad(
                    url,
                    format!("{extra:?} follows the database in the path: {form}"),
                ));
            }
            // Checked above: userinfo has a password.
            let (username, password) = match userinfo.and_then(|u| u.split_once(':')) {
                Some((user, pass)) => (
                    (!user.is_empty()).then(|| user.to_string()),
                    Some(pass.to_string()),
                ),
                None => (None, None),
            };
            Topology::Sentinel {
                sentinels: hosts
                    .iter()
                    .map(|h| format!("{node_scheme}://{h}"))
                    .collect(),
                service: service.to_string(),
                db: i64::from(db),
                username,
                password,
                tls,
            }
        }
        "redis+cluster" => {
            if config.wait_replicas > 0 {
                return Err(bad(url, "wait_replicas is not supported on Redis Cluster"));
            }
            if !path.is_empty() {
                return Err(bad(
                    url,
                    "a cluster has no database or path: redis+cluster://host:port[,host:port...]",
                ));
            }
            Topology::Cluster(
                hosts
                    .iter()
                    .map(|h| format!("{node_scheme}://{creds}{h}"))
                    .collect(),
            )
        }
        _ => {
            return Err(bad(
                url,
                format!(
                    "unknown scheme {scheme:?}; use redis://, redis+sentinel:// or redis+cluster:// (or rediss://, rediss+sentinel://, rediss+cluster:// for TLS)"
                ),
            ))
        }
    };
    Ok(Parsed { topology, endpoint })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(url: &str) -> Result<(Topology, RedisConfig)> {
        let mut c = RedisConfig::default();
        parse(url, &mut c).map(|p| (p.topology, c))
    }

    #[test]
    fn a_client_id_is_one_word() {
        for id in ["", "two words", "tab\there"] {
            let mut c = RedisConfig::default().with_client_id(id);
            assert!(
                matches!(
                    parse("redis://a:1", &mut c),
                    Err(Error::InvalidInput {
                        kind: InputKind::Config,
                        ..
                    })
                ),
                "{id:?}"
            );
        }
        let mut c = RedisConfig::default().with_client_id("redlock-7");
        assert!(parse("redis://a:1", &mut c).is_ok());
    }

    #[test]
    fn a_servers_address_is_its_urls_host_and_port() {
        for (url, addr) in [
            ("redis://a:1", "a:1"),
            ("rediss://u:p@a:1/2?protocol=resp3", "a:1"),
            ("redis://[::1]:6379#x", "[::1]:6379"),
        ] {
            assert_eq!(host_port(url), Some(addr), "{url}");
        }
    }

    #[test]
    fn parses_the_url_forms() {
        let (t, c) =
            p("redis://:pw@127.0.0.1:6379/2?prefix=app:&wait_replicas=1&observe_recheck_ms=60000&protocol=resp3").unwrap();
        assert_eq!(
            t,
            Topology::Single("redis://:pw@127.0.0.1:6379/2?protocol=resp3".into())
        );
        assert_eq!(
            format!("{t:?}"),
            r#"Single("redis://***@127.0.0.1:6379/2?protocol=resp3")"#
        );
        assert_eq!((c.prefix.as_str(), c.wait_replicas), ("app:", 1));
        assert_eq!(c.observe_recheck, Duration::from_secs(60));
        assert!(!c.fifo && c.queue_lease == Duration::from_secs(3));
        assert!(p("redis://a:1?fifo=true&queue_lease_ms=30").is_ok());
        let too_long = p("redis://a:1?fifo=true&queue_lease_ms=3600001").unwrap_err();
        assert!(
            too_long.to_string().contains("from 30 to 3600000"),
            "{too_long}"
        );
        let (_, c) = p("redis://a:1?fifo=true&queue_lease_ms=600").unwrap();
        assert!(c.fifo && c.queue_lease == Duration::from_millis(600));
        let (t, _) = p("redis+sentinel://a:26379,b:26380/mymaster/3").unwrap();
        assert_eq!(
            t,
            Topology::Sentinel {
                sentinels: vec!["redis://a:26379".into(), "redis://b:26380".into()],
                service: "mymaster".into(),
                db: 3,
                username: None,
                password: None,
                tls: false,
            }
        );
        let (t, _) = p("redis+cluster://a:7000,b:7001").unwrap();
        assert_eq!(
            t,
            Topology::Cluster(vec!["redis://a:7000".into(), "redis://b:7001".into()])
        );
    }

    #[test]
    fn rejects_malformed_urls_with_typed_errors() {
        for bad in [
            "localhost:6379",
            "redis://",
            "redis://host",
            "redis://host:notaport",
            "redis://a:1,b:2",
            "redis+sentinel://a:1",
            "redis+sentinel://a:1/m/notadb",
            "redis://a:1?wait_replicas=x",
            // A server listed twice, in any spelling of its port or name.
            "redis+sentinel://127.0.0.1:1,127.0.0.1:1/m",
            "redis+sentinel://a:1,A:01/m",
            "redis+cluster://a:1,b:2,a:1",
            // Empty entries, extra path segments, a negative database.
            "redis+sentinel://a:1,,/m",
            "redis+sentinel://a:1,b:2,/m",
            "redis+cluster://,a:1",
            "redis://a:1,",
            "redis+sentinel://a:1/m/-5",
            "redis+sentinel://a:1/m/-5/extra",
            "redis+sentinel://a:1/m/3/extra",
            "redis+sentinel://a:1/m/",
            "redis+sentinel://a:1//3",
            "redis+cluster://a:1/0",
            "redis://a:1?prefix={x}",
            "redis://a:1?fifo=maybe",
            "redis://a:1?queue_lease_ms=0",
            "redis://a:1?queue_lease_ms=29",
            "redis://a:1?timeout_ms=0",
            "redis://a:1?observe_recheck_ms=0",
            "memcached://a:1",
        ] {
            assert!(
                matches!(
                    p(bad),
                    Err(Error::InvalidInput {
                        kind: InputKind::Url | InputKind::Config,
                        ..
                    })
                ),
                "{bad}"
            );
        }
        if cfg!(feature = "tls") {
            assert!(
                matches!(p("rediss://a:1?ca_file=/x.pem"), Ok((Topology::Single(u), c)) if u == "rediss://a:1" && c.ca_file.is_some())
            );
        } else {
            assert!(matches!(p("rediss://a:1"), Err(Error::Unsupported { .. })));
        }
    }

    #[test]
    fn parses_the_tls_forms_of_sentinel_and_cluster() {
        if !cfg!(feature = "tls") {
            for url in [
                "rediss+sentinel://a:1/m?ca_file=/x.pem",
                "rediss+cluster://a:1,b:2?ca_file=/x.pem",
            ] {
                assert!(
                    matches!(
                        p(url),
                        Err(Error::Unsupported {
                            backend: "redis",
                            ..
                        })
                    ),
                    "{url}"
                );
            }
            return;
        }
        let (t, c) = p("rediss+sentinel://u:pw@a:26379,b:26380/mymaster/3?ca_file=/x.pem").unwrap();
        assert_eq!(
            t,
            Topology::Sentinel {
                sentinels: vec!["rediss://a:26379".into(), "rediss://b:26380".into()],
                service: "mymaster".into(),
                db: 3,
                username: Some("u".into()),
                password: Some("pw".into()),
                tls: true,
            }
        );
        assert_eq!(c.ca_file.as_deref(), Some(std::path::Path::new("/x.pem")));
        assert!(!format!("{t:?}").contains("pw"), "{t:?}");
        let (t, c) = p("rediss+cluster://:pw@a:7000,b:7001?ca_file=/x.pem").unwrap();
        assert!(!format!("{t:?}").contains("pw"), "{t:?}");
        assert!(format!("{t:?}").contains("rediss://***@b:7001"), "{t:?}");
        assert_eq!(
            t,
            Topology::Cluster(vec![
                "rediss://:pw@a:7000".into(),
                "rediss://:pw@b:7001".into()
            ])
        );
        assert!(c.ca_file.is_some());
        // Without ca_file: the system roots.
        let (t, c) = p("rediss+cluster://a:7000").unwrap();
        assert_eq!(t, Topology::Cluster(vec!["rediss://a:7000".into()]));
        assert!(c.ca_file.is_none());
    }

    #[test]
    fn rejects_malformed_tls_urls_with_typed_errors() {
        for bad in [
            "rediss+sentinel://a:1",
            "rediss+sentinel://a:1/m/notadb",
            "rediss+sentinel://a/m",
            "rediss+cluster://",
            "rediss+cluster://a:1?wait_replicas=1",
            "rediss+redlock://a:1",
            "redisss://a:1",
        ] {
            let r = p(bad);
            // Without the feature a well-formed host list is refused as
            // unsupported before the rest is read.
            let unsupported = !cfg!(feature = "tls") && matches!(r, Err(Error::Unsupported { .. }));
            assert!(
                unsupported
                    || matches!(
                        r,
                        Err(Error::InvalidInput {
                            kind: InputKind::Url | InputKind::Config,
                            ..
                        })
                    ),
                "{bad}: {r:?}"
            );
        }
    }

    fn invalid(url: &str) -> String {
        match p(url) {
            Err(e @ Error::InvalidInput { .. }) => e.to_string(),
            other => panic!("{url}: expected InvalidInput, got {other:?}"),
        }
    }

    #[test]
    fn durations_outside_their_range_are_refused() {
        for (query, name) in [
            ("timeout_ms=18446744073709551615", "timeout_ms"),
            ("timeout_ms=3600001", "timeout_ms"),
            ("wait_timeout_ms=0", "wait_timeout_ms"),
            ("wait_timeout_ms=18446744073709551615", "wait_timeout_ms"),
            (
                "wait_replicas=1&wait_timeout_ms=2000&timeout_ms=2000",
                "below timeout_ms",
            ),
            (
                "observe_recheck_ms=18446744073709551615",
                "observe_recheck_ms",
            ),
            ("queue_lease_ms=18446744073709551615", "queue_lease_ms"),
        ] {
            let text = invalid(&format!("redis://a:1?{query}"));
            assert!(text.contains(name), "{text}");
        }
        let (_, c) = p("redis://a:1?timeout_ms=3600000").unwrap();
        assert_eq!(c.timeout, Duration::from_secs(3600));
    }

    #[test]
    fn a_repeated_parameter_is_refused() {
        for url in [
            "redis://a:1?timeout_ms=100&timeout_ms=9000",
            "redis://a:1?fifo=true&fifo=false",
            "redis://a:1?protocol=resp3&protocol=resp2",
            "redis+cluster://a:1?prefix=x&prefix=y",
        ] {
            assert!(invalid(url).contains("given twice"), "{url}");
        }
    }

    #[test]
    fn unknown_parameters_and_ca_file_without_tls_are_refused() {
        for url in [
            "redis://a:1?bogus=1",
            "redis+sentinel://a:1/m?bogus=1",
            "redis+cluster://a:1?bogus=1",
            "redis+sentinel://a:1/m?protocol=resp3",
            "redis+cluster://a:1?protocol=resp3",
        ] {
            let text = invalid(url);
            assert!(
                text.contains("bogus") || text.contains("protocol"),
                "{text}"
            );
        }
        for url in [
            "redis://a:1?ca_file=/x.pem",
            "redis+sentinel://a:1/m?ca_file=/x.pem",
            "redis+cluster://a:1?ca_file=/x.pem",
        ] {
            assert!(invalid(url).contains("ca_file"), "{url}");
        }
        let (t, _) = p("redis://a:1?protocol=resp3").unwrap();
        assert_eq!(t, Topology::Single("redis://a:1?protocol=resp3".into()));
    }

    #[test]
    fn a_user_without_a_password_or_a_fragment_is_refused() {
        for url in [
            "redis://ghost@a:1",
            "redis://ghost:@a:1",
            "redis://:@a:1",
            "redis+sentinel://ghost@a:1/m",
            "rediss+cluster://ghost@a:1",
            "rediss://a:1/0#insecure",
            "rediss://:pw@a:1?protocol=resp2#insecure",
        ] {
            let e = p(url).unwrap_err();
            assert!(matches!(e, Error::InvalidInput { .. }), "{url}: {e:?}");
        }
        for url in [
            "redis://:pw@a:1",
            "redis://app:pw@a:1",
            "redis://app:%23pw@a:1",
            "redis://a:1?prefix=team#1:",
        ] {
            assert!(p(url).is_ok(), "{url}");
        }
    }

    #[test]
    fn errors_never_show_passwords() {
        for url in [
            "redis://user:hunter2@a:notaport",
            "rediss+sentinel://user:hunter2@a:1/m/notadb",
            "rediss+cluster://user:hunter2@a:notaport",
            "rediss+cluster://user:hunter2@a:1?wait_replicas=1",
        ] {
            let e = p(url).unwrap_err().to_string();
            assert!(!e.contains("hunter2"), "{e}");
        }
    }
}
