//! Options and the `redlock://` URL.

use std::time::Duration;

use distlock_core::{Error, InputKind, Result};

/// Options for [`RedlockBackend`](crate::RedlockBackend). URL query
/// parameters set the same options:
///
/// | parameter | meaning | default |
/// |---|---|---|
/// | `node_timeout_ms` | per-node timeout of each request; 1 to 3600000 (one hour) | 50 |
/// | `drift_ppm`, `drift_ms` | clock drift allowance: ppm of the TTL plus a fixed part; `drift_ppm` below 1000000, and together they must leave some validity for the longest TTL accepted | 10000 (1%), 2 |
/// | `fencing` | `true`: quorum fencing tokens (one more round trip) | `false` |
/// | `delayed_restart_ms` | quarantine for a node whose run id changed or that has been up for less; also the longest TTL accepted (else 24 hours), so at least the shortest, 100 | off |
/// | `retry_jitter_ms` | random delay added before a retry; at most 3600000 | 50 |
/// | `prefix` | key prefix, as for the Redis backend | empty |
/// | `fifo` | `true`: waiting exclusive requests queue on every node in one order (the client's wall-clock time when each wait began) and a release wakes only the head, as the Redis backend's `fifo` does on one server; `false`: a release wakes every waiter | `false` |
/// | `queue_lease_ms` | how long a waiter's queue entries outlive the waiter's latest round (renewed every third of this): a killed or cut-off waiter holds up the queue at most this long; 30 to 3600000 | 3000 |
///
/// An unknown parameter, a parameter given twice and a value out of range
/// are [`Error::InvalidInput`].
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct RedlockConfig {
    /// Each node gets this long per request; a slow node just does not count.
    pub node_timeout: Duration,
    /// Drift allowance in parts per million of the TTL.
    pub drift_ppm: u32,
    /// Fixed drift allowance.
    pub drift_fixed: Duration,
    /// Quorum fencing tokens.
    pub fencing: bool,
    /// Delayed-restart protection: how long a restarted node is not used for
    /// acquiring. Must be at least the longest TTL any client uses; TTLs
    /// above it are refused.
    pub delayed_restart: Option<Duration>,
    /// Upper bound of the random delay before retrying after a split vote or
    /// a release notification.
    pub retry_jitter: Duration,
    /// Key prefix on every node.
    pub prefix: String,
    /// Whether waits (exclusive and shared, semaphore permits, campaigns)
    /// queue on every node, first come, first served.
    pub fifo: bool,
    /// How long a waiter's queue entries outlive the waiter's latest round.
    pub queue_lease: Duration,
}

impl Default for RedlockConfig {
    fn default() -> Self {
        Self {
            node_timeout: Duration::from_millis(50),
            drift_ppm: 10_000,
            drift_fixed: Duration::from_millis(2),
            fencing: false,
            delayed_restart: None,
            retry_jitter: Duration::from_millis(50),
            prefix: String::new(),
            fifo: false,
            queue_lease: Duration::from_secs(3),
        }
    }
}

impl RedlockConfig {
    /// Switches quorum fencing tokens on.
    pub fn with_fencing(mut self) -> Self {
        self.fencing = true;
        self
    }

    /// Switches delayed-restart protection on.
    pub fn with_delayed_restart(mut self, quarantine: Duration) -> Self {
        self.delayed_restart = Some(quarantine);
        self
    }

    /// Sets whether waits (exclusive and shared, semaphore permits,
    /// campaigns) queue on every node, first come, first served.
    pub fn with_fifo(mut self, fifo: bool) -> Self {
        self.fifo = fifo;
        self
    }

    /// Sets how long a waiter's queue entries outlive the waiter's latest round.
    pub fn with_queue_lease(mut self, lease: Duration) -> Self {
        self.queue_lease = lease;
        self
    }

    /// Sets the per-node timeout.
    pub fn with_node_timeout(mut self, t: Duration) -> Self {
        self.node_timeout = t;
        self
    }
}

/// Parses `redlock://[user:pass@]host:port,host:port,...[?options]` into
/// one `redis://` URL per node.
pub(crate) fn parse(url: &str, config: &mut RedlockConfig) -> Result<Vec<String>> {
    distlock_core::input::check_userinfo_encoded(url, &['/', '?', '#'])?;
    let bad = |why: String| Error::invalid(InputKind::Url, format!("redlock:// URL: {why}"));
    let rest = url
        .strip_prefix("redlock://")
        .ok_or_else(|| bad("expected redlock://host:port,host:port,...".into()))?;
    let (rest, query) = rest.split_once('?').unwrap_or((rest, ""));
    let authority = rest.trim_end_matches('/');
    if authority.contains('/') {
        return Err(bad("no path is allowed after the hosts".into()));
    }
    for (k, v) in distlock_core::input::query_pairs("redlock://", query)? {
        let num = |v: &str| {
            v.parse::<u64>()
                .map_err(|_| bad(format!("{k}={v:?} is not a number")))
        };
        match k {
            "node_timeout_ms" => config.node_timeout = Duration::from_millis(num(v)?),
            "drift_ppm" => {
                config.drift_ppm =
                    u32::try_from(num(v)?).map_err(|_| bad("drift_ppm too large".into()))?
            }
            "drift_ms" => config.drift_fixed = Duration::from_millis(num(v)?),
            "fencing" | "fifo" => {
                let on = match v {
                    "true" | "1" => true,
                    "false" | "0" => false,
                    _ => return Err(bad(format!("{k}={v:?}; use true or false"))),
                };
                if k == "fencing" {
                    config.fencing = on;
                } else {
                    config.fifo = on;
                }
            }
            "queue_lease_ms" => config.queue_lease = Duration::from_millis(num(v)?),
            "delayed_restart_ms" => config.delayed_restart = Some(Duration::from_millis(num(v)?)),
            "retry_jitter_ms" => config.retry_jitter = Duration::from_millis(num(v)?),
            "prefix" => config.prefix = v.to_string(),
            _ => return Err(bad(format!("unknown parameter {k:?}"))),
        }
    }
    validate(config)?;
    let (creds, hosts) = match authority.rsplit_once('@') {
        // `user:pw@a,user:pw@b`: read as credentials, the nodes before the
        // last would vanish into them.
        Some((u, _)) if u.contains('@') && u.contains(',') => {
            return Err(bad(
                "credentials given per node; give them once, before the first node (user:pass@host1,host2,...), and percent-encode an @ in the password".into(),
            ))
        }
        Some((u, h)) => {
            distlock_core::input::check_user_has_password(u)?;
            (format!("{u}@"), h)
        }
        None => (String::new(), authority),
    };
    let mut nodes = Vec::new();
    let mut seen: Vec<((String, u16), &str)> = Vec::new();
    for h in hosts.split(',') {
        // `a,,b` or a trailing comma: most likely a node left out (an empty
        // variable), which would quietly lower the majority's size.
        if h.is_empty() && !hosts.is_empty() {
            return Err(bad(format!(
                "an empty node in {hosts:?}; list each node once, separated by single commas"
            )));
        }
        if h.is_empty() {
            continue;
        }
        let key = host_port(h).ok_or_else(|| bad(format!("node {h:?} is not host:port")))?;
        if let Some((_, first)) = seen.iter().find(|(k, _)| *k == key) {
            return Err(duplicate(h, first, "address"));
        }
        // A node named without its port is reached on 6379.
        let (host, port) = &key;
        let host = if host.contains(':') {
            format!("[{host}]")
        } else {
            h.rsplit_once(':').map_or(h, |(name, _)| name).to_string()
        };
        nodes.push(format!("redis://{creds}{host}:{port}"));
        seen.push((key, h));
    }
    if nodes.is_empty() {
        return Err(bad("no nodes".into()));
    }
    Ok(nodes)
}

/// A node's host (lower case, without IPv6 brackets) and port (6379 when
/// left out), the form in which two spellings of one node compare equal.
pub(crate) fn host_port(node: &str) -> Option<(String, u16)> {
    let (host, port) = match node.rsplit_once(':') {
        // `[::1]:6379`, `host:6379`; a bare IPv6 address needs brackets.
        Some((h, p)) if !h.contains(':') || h.ends_with(']') => (h, p.parse().ok()?),
        Some(_) => return None,
        None => (node, 6379),
    };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    if host.is_empty() {
        return None;
    }
    Some((host.to_ascii_lowercase(), port))
}

/// The error for a node listed twice: a "majority" that counts one server
/// twice rests on fewer real servers than it claims.
/// `by` says how it was recognised: its address, or the run id the server
/// answered with.
pub(crate) fn duplicate(node: &str, same_as: &str, by: &str) -> Error {
    Error::invalid(
        InputKind::Url,
        format!(
            "redlock:// URL: node {node} is the same server as {same_as} (same {by}); \
             every node must be a distinct Redis server, or a majority would count one server twice"
        ),
    )
}

/// The shortest TTL Redlock accepts.
pub(crate) const MIN_TTL: Duration = Duration::from_millis(100);

/// The longest TTL Redlock accepts without `delayed_restart`.
pub(crate) const DEFAULT_MAX_TTL: Duration = Duration::from_secs(24 * 3600);

/// The longest `delayed_restart` (and so the longest TTL) accepted: far
/// inside what a node's `PEXPIRE` and Lua's numbers carry exactly.
const MAX_DELAYED_RESTART: Duration = Duration::from_secs(365 * 24 * 3600);

pub(crate) fn validate(config: &RedlockConfig) -> Result<()> {
    use distlock_core::input::{check_millis, MAX_TIMEOUT};
    if config.node_timeout.is_zero() {
        return Err(Error::invalid(
            InputKind::Config,
            "node_timeout must be greater than zero",
        ));
    }
    check_millis(
        "node_timeout_ms",
        config.node_timeout,
        Duration::from_millis(1),
        MAX_TIMEOUT,
    )?;
    check_millis(
        "retry_jitter_ms",
        config.retry_jitter,
        Duration::ZERO,
        MAX_TIMEOUT,
    )?;
    if config.delayed_restart.is_some_and(|d| d.is_zero()) {
        return Err(Error::invalid(
            InputKind::Config,
            "delayed_restart must be greater than zero",
        ));
    }
    if let Some(d) = config.delayed_restart.filter(|d| *d > MAX_DELAYED_RESTART) {
        return Err(Error::invalid(
            InputKind::Config,
            format!(
                "delayed_restart_ms={} is above {} ms (365 days), the longest accepted",
                d.as_millis(),
                MAX_DELAYED_RESTART.as_millis()
            ),
        ));
    }
    if let Some(d) = config.delayed_restart.filter(|d| *d < MIN_TTL) {
        return Err(Error::invalid(
            InputKind::Config,
            format!(
                "delayed_restart_ms={} is below the shortest TTL, {} ms, and is also the longest TTL accepted, so no TTL would be; use {} or more",
                d.as_millis(),
                MIN_TTL.as_millis(),
                MIN_TTL.as_millis()
            ),
        ));
    }
    if config.drift_ppm >= 1_000_000 {
        return Err(Error::invalid(
            InputKind::Config,
            format!(
                "drift_ppm {} leaves no validity for any TTL; it must be below 1000000",
                config.drift_ppm
            ),
        ));
    }
    // The longest TTL keeps the most validity: if it keeps none, no TTL
    // does, and every acquire would fail.
    let longest = config.delayed_restart.unwrap_or(DEFAULT_MAX_TTL);
    let caps = crate::RedlockBackend::declared_capabilities(config);
    if caps.safe_validity(longest).is_zero() {
        return Err(Error::invalid(
            InputKind::Config,
            format!(
                "drift_ms={} with drift_ppm={} leaves no validity for the longest TTL accepted, {} ms ({}); lower drift_ms or drift_ppm{}",
                config.drift_fixed.as_millis(),
                config.drift_ppm,
                longest.as_millis(),
                if config.delayed_restart.is_some() {
                    "delayed_restart_ms"
                } else {
                    "the default"
                },
                if config.delayed_restart.is_some() {
                    ", or raise delayed_restart_ms"
                } else {
                    ""
                }
            ),
        ));
    }
    distlock_core::wait::check_queue_lease(config.queue_lease)?;
    // What each node's own configuration would refuse (a prefix with
    // braces, say), refused here, not as "nodes down" at every request.
    distlock_redis::RedisConfig::default()
        .with_prefix(config.prefix.clone())
        .with_queue_lease(config.queue_lease)
        .validate()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(url: &str) -> String {
        match parse(url, &mut RedlockConfig::default()) {
            Err(e @ Error::InvalidInput { .. }) => e.to_string(),
            other => panic!("{url}: expected InvalidInput, got {other:?}"),
        }
    }

    #[test]
    fn a_user_without_a_password_or_a_fragment_is_refused() {
        for url in [
            "redlock://ghost@a:1,b:1,c:1",
            "redlock://ghost:@a:1,b:1,c:1",
            "redlock://a:1,b:1,c:1#insecure",
        ] {
            refused(url);
        }
        for url in [
            "redlock://app:pw@a:1,b:1,c:1",
            // The prefix stays with distlock; the nodes' URLs are built
            // from the hosts alone.
            "redlock://a:1,b:1,c:1?prefix=team#1:",
        ] {
            assert!(parse(url, &mut RedlockConfig::default()).is_ok(), "{url}");
        }
    }

    #[test]
    fn a_delayed_restart_below_the_shortest_ttl_is_refused() {
        let text = refused("redlock://a:1?delayed_restart_ms=99");
        assert!(text.contains("delayed_restart_ms=99"), "{text}");
        assert!(text.contains("100 ms"), "{text}");
        assert!(parse(
            "redlock://a:1?delayed_restart_ms=100",
            &mut RedlockConfig::default()
        )
        .is_ok());
    }

    #[test]
    fn a_drift_that_leaves_no_ttl_valid_is_refused() {
        // 24 h less 1% is 85536000 ms.
        let text = refused("redlock://a:1?drift_ms=85536000");
        assert!(text.contains("drift_ms=85536000"), "{text}");
        assert!(parse(
            "redlock://a:1?drift_ms=85535999",
            &mut RedlockConfig::default()
        )
        .is_ok());
        let text = refused("redlock://a:1?delayed_restart_ms=1000&drift_ms=990");
        assert!(text.contains("delayed_restart_ms"), "{text}");
        assert!(parse(
            "redlock://a:1?delayed_restart_ms=1000&drift_ms=989",
            &mut RedlockConfig::default()
        )
        .is_ok());
        refused("redlock://a:1?drift_ms=18446744073709551615");
    }

    #[test]
    fn credentials_per_node_are_refused() {
        let text = refused("redlock://u:p@a:1,u:p@b:2,u:p@c:3");
        assert!(text.contains("give them once"), "{text}");
        let mut config = RedlockConfig::default();
        assert!(parse("redlock://u:p@a:1,b:2,c:3", &mut config).is_ok());
    }

    #[test]
    fn a_repeated_parameter_is_refused() {
        let text = refused("redlock://a:1,b:2,c:3?fencing=true&fencing=false");
        assert!(text.contains("fencing is given twice"), "{text}");
    }

    #[test]
    fn parses_nodes_and_options() {
        let mut c = RedlockConfig::default();
        let nodes = parse(
            "redlock://:pw@a:1,b:2,c:3?fencing=true&node_timeout_ms=20&delayed_restart_ms=60000",
            &mut c,
        )
        .unwrap();
        assert_eq!(
            nodes,
            ["redis://:pw@a:1", "redis://:pw@b:2", "redis://:pw@c:3"]
        );
        assert!(c.fencing);
        assert_eq!(c.node_timeout, Duration::from_millis(20));
        assert_eq!(c.delayed_restart, Some(Duration::from_secs(60)));
        assert!(!c.fifo && c.queue_lease == Duration::from_secs(3));
        let mut c = RedlockConfig::default();
        let nodes = parse("redlock://a,B:2,[::1]:3", &mut c).unwrap();
        assert_eq!(nodes, ["redis://a:6379", "redis://B:2", "redis://[::1]:3"]);
        let mut c = RedlockConfig::default();
        parse("redlock://a:1?fifo=true&queue_lease_ms=600", &mut c).unwrap();
        assert!(c.fifo && c.queue_lease == Duration::from_millis(600));
    }

    #[test]
    fn rejects_bad_urls() {
        for bad in [
            "redis://a:1",
            "redlock://",
            "redlock://a:1?fencing=maybe",
            "redlock://a:1?fifo=maybe",
            "redlock://a:1?queue_lease_ms=0",
            "redlock://a:1?queue_lease_ms=ten",
            "redlock://a:1?node_timeout_ms=0",
            "redlock://a:1?bogus=1",
            "redlock://a:1/path",
            "redlock://a:1,a:1,b:2",
            "redlock://A:1,a:1",
            "redlock://a,a:6379",
            "redlock://[::1]:1,[::1]:1",
            "redlock://a:1?prefix={x}",
            "redlock://a:1?prefix=x}",
            "redlock://a:1?drift_ppm=1000000",
            "redlock://a:1?fencing=true&fencing=false",
            "redlock://a:1?node_timeout_ms=18446744073709551615",
            "redlock://a:1?node_timeout_ms=3600001",
            "redlock://a:1?retry_jitter_ms=18446744073709551615",
            "redlock://a:1?delayed_restart_ms=18446744073709551615",
            "redlock://a:1?delayed_restart_ms=31536000001",
            "redlock://a:1,,b:2",
            "redlock://a:1,b:2,",
            "redlock://,a:1",
        ] {
            let mut c = RedlockConfig::default();
            assert!(
                matches!(parse(bad, &mut c), Err(Error::InvalidInput { .. })),
                "{bad}"
            );
        }
    }
}
