//! `distlock conformance`: the conformance suite against a deployment.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use distlock::{DynBackend, LockName};
use distlock_conformance::{
    async_trait, check_deployment, first_lock, BackendFactory, Failed, Verdict,
};

use crate::output::line;
use crate::{code_for, default_backend, fail};

#[derive(clap::Args, Debug)]
pub(crate) struct ConformanceArgs {
    /// Backend URL, as for `distlock run`.
    #[arg(long, env = "DISTLOCK_BACKEND", hide_env_values = true, default_value_t = default_backend())]
    backend: String,
    /// Run only the cases whose name contains this (a name as a line
    /// prints it, `<backend>::<case>`, too).
    #[arg(long, value_name = "PATTERN")]
    only: Option<String>,
    /// Print the findings and verdicts as JSON (`{findings, cases}`, and
    /// `error` when no case could run) instead of one line each.
    #[arg(long)]
    json: bool,
    /// The TTL of the expiry cases. Default: 1s, and 3s on etcd and
    /// ZooKeeper (a session backend; a ZooKeeper whose minSessionTimeout is
    /// above 3 s needs at least that; etcd, which grants leases of at least
    /// 2 s by default, refuses less). A TTL outside the backend's range is
    /// refused: exit 2.
    #[arg(long, value_parser = crate::parse_duration)]
    short_ttl: Option<Duration>,
}

/// New clients of the deployment at one URL. It never evicts: other users
/// share the servers, so the cases that need an operator's removal of a
/// lock are ignored.
struct Deployment {
    url: String,
    backend: &'static str,
    short_ttl: Duration,
}

#[async_trait]
impl BackendFactory for Deployment {
    fn name(&self) -> &'static str {
        self.backend
    }
    async fn client(&self) -> distlock::Result<DynBackend> {
        crate::connect(&self.url).await
    }
    async fn evict(&self, name: &LockName) -> Result<(), Failed> {
        Err(format!("{name}: distlock conformance does not evict on a deployment").into())
    }
    fn can_evict(&self) -> bool {
        false
    }
    fn short_ttl(&self) -> Duration {
        self.short_ttl
    }
}

#[derive(serde::Serialize)]
struct Report<'a> {
    findings: Vec<Setting<'a>>,
    cases: Vec<Line<'a>>,
    /// Why no case ran, when none could.
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<&'a str>,
}

#[derive(serde::Serialize)]
struct Setting<'a> {
    setting: &'a str,
    /// `fine`, `warning` or `unknown`.
    verdict: &'a str,
    /// `null` for `unknown`.
    value: Option<&'a str>,
    why: Option<&'a str>,
}

#[derive(serde::Serialize)]
struct Line<'a> {
    case: &'a str,
    verdict: &'a str,
    /// `null` for `ok`.
    why: Option<&'a str>,
}

pub(crate) async fn conformance(args: ConformanceArgs) -> ExitCode {
    // With --json every way the run ends is a document: one that ends
    // before any case ran has no cases and an `error`.
    let early = |code: u8, why: String, findings: &[distlock::Finding]| {
        if args.json {
            if let Err(code) = print_json(&[], findings, Some(&why)) {
                return code;
            }
        }
        fail(code, why)
    };
    if let Some(why) = crate::one_process_only(
        &args.backend,
        "the suite connects a client of its own for each client of a case",
    ) {
        return early(crate::EXIT_USAGE, why, &[]);
    }
    let probe = match crate::connect(&args.backend).await {
        Ok(b) => b,
        Err(e) => return early(code_for(&e), e.to_string(), &[]),
    };
    let caps = probe.capabilities();
    let findings = match probe.deployment_findings().await {
        Ok(f) => f,
        Err(e) => vec![distlock::Finding::unknown("deployment", e.to_string())],
    };
    drop(probe);
    // The cases stand for a crashed holder by dropping its client; a
    // ZooKeeper client closes its sessions when dropped unless detached.
    let url = if args.backend.starts_with("zk://") && !args.backend.contains("detached=") {
        let sep = if args.backend.contains('?') { '&' } else { '?' };
        format!("{}{sep}detached=true", args.backend)
    } else {
        args.backend.clone()
    };
    let short_ttl = match short_ttl(args.short_ttl, &caps) {
        Ok(t) => t,
        Err(e) => return early(crate::EXIT_USAGE, e, &findings),
    };
    let factory = Arc::new(Deployment {
        url,
        backend: caps.backend,
        short_ttl,
    });
    // A name as the output prints it (`<backend>::<case>`) matches its case.
    let prefix = format!("{}::", caps.backend);
    let only = args
        .only
        .as_deref()
        .map(|p| p.strip_prefix(prefix.as_str()).unwrap_or(p));
    if let Some(p) = only {
        if !distlock_conformance::case_names().any(|case| case.contains(p)) {
            return early(
                crate::EXIT_USAGE,
                format!("no case matches {p:?}"),
                &findings,
            );
        }
    }
    // Text goes out a line per case as it ends, so that an interrupted run
    // has shown what it found so far; JSON is one document at the end.
    if !args.json {
        if let Err(code) = print_findings(&findings) {
            return code;
        }
    }
    if let Err(e) = first_lock(&*factory).await {
        let why = match e {
            distlock::Error::InvalidInput { .. } => format!(
                "no case can run: a first lock with the cases' TTLs failed: {e} (--short-ttl sets the expiry cases' TTL)"
            ),
            _ => format!("no case can run: a first lock with the cases' TTLs failed: {e}"),
        };
        // The findings often say why (a replica, say): JSON shows them too.
        return early(code_for(&e), why, &findings);
    }
    let mut broken = None;
    // A reader that went away (`| head -1`) ends the run at the next case.
    let verdicts = check_deployment(&*factory, only, |case, v| {
        if !args.json && broken.is_none() {
            broken = print_verdict(caps.backend, case, v).err();
        }
        if broken.is_some() {
            std::ops::ControlFlow::Break(())
        } else {
            std::ops::ControlFlow::Continue(())
        }
    })
    .await;
    if let Some(code) = broken {
        return code;
    }
    let failed = verdicts
        .iter()
        .filter(|(_, v)| matches!(v, Verdict::Failed(_)))
        .count();
    let printed = if args.json {
        print_json(&verdicts, &findings, None)
    } else {
        print_summary(&verdicts, failed, caps.backend, &args.backend)
    };
    if let Err(code) = printed {
        return code;
    }
    if failed == 0 {
        return ExitCode::SUCCESS;
    }
    // Failures from a deployment that stopped answering during the run say
    // nothing about conformance: asked twice more, a second apart and 10 s
    // each at most, a server that cannot be reached either time makes the
    // run's status 69, as at its start.
    let unreachable = || async {
        match tokio::time::timeout(Duration::from_secs(10), first_lock(&*factory)).await {
            Ok(Err(e)) if e.is_retryable() => Some(e.to_string()),
            Ok(_) => None,
            Err(_) => Some("no answer within 10s".to_string()),
        }
    };
    if unreachable().await.is_some() {
        tokio::time::sleep(Duration::from_secs(1)).await;
        if let Some(e) = unreachable().await {
            return fail(
                crate::EXIT_UNAVAILABLE,
                format!("the backend stopped answering during the run ({e}); its failed cases may say nothing about conformance"),
            );
        }
    }
    ExitCode::FAILURE
}

/// Writes the findings and cases (and why none ran) as one JSON document.
fn print_json(
    verdicts: &[(&'static str, Verdict)],
    findings: &[distlock::Finding],
    error: Option<&str>,
) -> Result<(), ExitCode> {
    let lines: Vec<Line<'_>> = verdicts
        .iter()
        .map(|(case, v)| match v {
            Verdict::Ok => Line {
                case,
                verdict: "ok",
                why: None,
            },
            Verdict::Failed(why) => Line {
                case,
                verdict: "failed",
                why: Some(why),
            },
            Verdict::Ignored(why) => Line {
                case,
                verdict: "ignored",
                why: Some(why),
            },
        })
        .collect();
    let settings = findings
        .iter()
        .map(|f| match (&f.value, &f.warning) {
            (Ok(v), None) => Setting {
                setting: &f.setting,
                verdict: "fine",
                value: Some(v),
                why: None,
            },
            (Ok(v), Some(w)) => Setting {
                setting: &f.setting,
                verdict: "warning",
                value: Some(v),
                why: Some(w),
            },
            (Err(why), _) => Setting {
                setting: &f.setting,
                verdict: "unknown",
                value: None,
                why: Some(why),
            },
        })
        .collect();
    let report = Report {
        findings: settings,
        cases: lines,
        error,
    };
    let text = serde_json::to_string_pretty(&report)
        .map_err(|e| fail(1, format!("cannot write JSON: {e}")))?;
    line(text)
}

/// Writes one line per finding.
fn print_findings(findings: &[distlock::Finding]) -> Result<(), ExitCode> {
    for f in findings {
        line(match (&f.value, &f.warning) {
            (Ok(v), None) => format!("fine    {}: {v}", f.setting),
            (Ok(v), Some(w)) => format!("WARNING {}: {v}: {w}", f.setting),
            (Err(why), _) => format!("unknown {}: {why}", f.setting),
        })?;
    }
    Ok(())
}

/// Writes one case's line.
fn print_verdict(backend: &str, case: &str, v: &Verdict) -> Result<(), ExitCode> {
    line(match v {
        Verdict::Ok => format!("ok      {backend}::{case}"),
        Verdict::Failed(why) => format!("FAILED  {backend}::{case}: {why}"),
        Verdict::Ignored(why) => format!("ignored {backend}::{case}: {why}"),
    })
}

/// Writes the closing count.
fn print_summary(
    verdicts: &[(&'static str, Verdict)],
    failed: usize,
    backend: &str,
    url: &str,
) -> Result<(), ExitCode> {
    let ignored = verdicts
        .iter()
        .filter(|(_, v)| matches!(v, Verdict::Ignored(_)))
        .count();
    line(format!(
        "{} on {backend}: {} ok, {failed} failed, {ignored} ignored",
        distlock::redact(url),
        verdicts.len() - failed - ignored
    ))
}

impl ConformanceArgs {
    /// The backend URL, for the password options to fill in.
    pub(crate) fn backend_mut(&mut self) -> &mut String {
        &mut self.backend
    }
}

/// The expiry cases' TTL: `given` if the backend accepts it, or else a
/// default short enough for the cases and long enough for a session
/// backend's lease or session to be honoured reliably.
fn short_ttl(given: Option<Duration>, caps: &distlock::Capabilities) -> Result<Duration, String> {
    let Some(ttl) = given else {
        // ZooKeeper's client drops a connection silent for 8 ticks of a
        // twentieth of the session (1.2 s at 3 s): a shorter session is
        // reported lost by a stall of a loaded machine.
        let default = if caps.session {
            Duration::from_secs(3)
        } else {
            Duration::from_secs(1)
        };
        return Ok(default.clamp(caps.min_ttl, caps.max_ttl));
    };
    crate::ttl_in_range("--short-ttl", ttl, caps)?;
    // etcd grants a lease of at least its minimum TTL: the expiry cases
    // would judge a shorter TTL against a longer lease.
    if caps.backend == "etcd" && ttl < ETCD_MIN_LEASE {
        return Err(format!(
            "--short-ttl {ttl:?} is below etcd's minimum lease TTL ({ETCD_MIN_LEASE:?} by default), which the server grants instead; use --short-ttl {ETCD_MIN_LEASE:?} or more"
        ));
    }
    Ok(ttl)
}

/// etcd's minimum lease TTL with its default election timeout (1 s): one
/// and a half election timeouts, rounded up to whole seconds.
const ETCD_MIN_LEASE: Duration = Duration::from_secs(2);

#[cfg(test)]
mod tests {
    use super::*;
    use distlock::Backend as _;

    #[test]
    fn a_short_ttl_outside_the_backends_range_is_refused() {
        let caps = distlock::MemoryBackend::new().capabilities();
        for bad in [Duration::ZERO, caps.max_ttl + Duration::from_secs(1)] {
            let e = short_ttl(Some(bad), &caps).unwrap_err();
            assert!(e.starts_with("--short-ttl ") && e.contains("memory"), "{e}");
            assert_eq!(e.lines().count(), 1, "{e}");
        }
        assert_eq!(short_ttl(Some(caps.min_ttl), &caps).unwrap(), caps.min_ttl);
        assert_eq!(
            short_ttl(None, &caps).unwrap(),
            Duration::from_secs(1).clamp(caps.min_ttl, caps.max_ttl)
        );
    }
}
