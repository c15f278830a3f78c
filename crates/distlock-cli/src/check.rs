//! `distlock check`: the fault suite's workload against the user's own
//! backend.

use std::process::ExitCode;
use std::time::Duration;

use distlock::LockName;

use crate::output::line;
use crate::{code_for, default_backend, fail, parse_duration, EXIT_NOT_ACQUIRED, EXIT_USAGE};

#[derive(clap::Args, Debug)]
pub(crate) struct CheckArgs {
    /// Backend URL.
    #[arg(long, env = "DISTLOCK_BACKEND", hide_env_values = true, default_value_t = default_backend())]
    backend: String,
    /// The lock the clients contend for (use a name nothing else uses).
    #[arg(long, default_value = "distlock-check")]
    lock: String,
    /// Client processes, from 1 to 64 (2 or more with --pause-holder).
    #[arg(long, default_value_t = 4)]
    clients: usize,
    /// How long the workload runs.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    duration: Duration,
    /// The lock's TTL, within the backend's TTL range.
    #[arg(long, default_value = "2s", value_parser = parse_duration)]
    ttl: Duration,
    /// Contend for one of N permits of a semaphore instead of the lock; the
    /// fenced register then keeps the N highest tokens. Needs more clients
    /// than permits.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    limit: Option<u32>,
    /// A third of the way in, stop one holder with SIGSTOP between its read
    /// and its write for twice the TTL and half a second, then resume it (a
    /// GC pause).
    #[arg(long)]
    pause_holder: bool,
}

/// Each client is a process with its own connections: past a few dozen the
/// run measures the machine's process table and the server's connection
/// limit, not the lock.
const MAX_CLIENTS: usize = 64;

pub(crate) async fn check(args: CheckArgs) -> ExitCode {
    if let Err(e) = LockName::new(&args.lock) {
        return fail(EXIT_USAGE, e);
    }
    let least = if args.pause_holder { 2 } else { 1 };
    if !(least..=MAX_CLIENTS).contains(&args.clients) {
        return fail(
            EXIT_USAGE,
            format!(
                "--clients {} is out of range: use {least} to {MAX_CLIENTS}",
                args.clients
            ),
        );
    }
    if args.ttl.is_zero() {
        return fail(EXIT_USAGE, "--ttl must be positive");
    }
    if let Some(n) = args.limit {
        if args.clients <= n as usize {
            return fail(
                EXIT_USAGE,
                format!(
                    "--clients {} cannot contend for {n} permits: use more clients than --limit",
                    args.clients
                ),
            );
        }
    }
    if args.duration.is_zero() {
        return fail(
            EXIT_USAGE,
            "--duration must be positive: an empty run proves nothing",
        );
    }
    if let Some(why) = crate::one_process_only(
        &args.backend,
        "check runs its clients as processes of their own",
    ) {
        return fail(EXIT_USAGE, why);
    }
    // Fail here, with the usual exit codes, rather than in every worker.
    let probe = match crate::connect(&args.backend).await {
        Ok(b) => b,
        Err(e) => return fail(code_for(&e), e),
    };
    let caps = probe.capabilities();
    if let Err(e) = crate::ttl_in_range("--ttl", args.ttl, &caps) {
        return fail(EXIT_USAGE, e);
    }
    if let Err(code) = take_and_release(probe, &args, "a first try").await {
        return code;
    }
    let mut w = match distlock_check::Workload::new(&args.backend, args.clients) {
        Ok(w) => w,
        Err(e) => return fail(1, e),
    };
    w.lock = args.lock.clone();
    w.ttl = args.ttl;
    w.limit = args.limit;
    let pause = args
        .ttl
        .saturating_mul(2)
        .saturating_add(Duration::from_millis(500));
    if args.pause_holder {
        w.warmup = args.duration / 3;
        w.cooldown = args
            .duration
            .saturating_sub(w.warmup.saturating_add(pause))
            .max(args.ttl);
    } else {
        w.warmup = args.duration;
        w.cooldown = Duration::ZERO;
    }
    crate::output::note(format_args!(
        "distlock check: {} clients on {} for {}{}",
        args.clients,
        distlock::redact(&args.backend),
        humantime::format_duration(args.duration),
        if args.pause_holder {
            ", pausing one holder"
        } else {
            ""
        }
    ));
    let pause_holder = args.pause_holder;
    let run = distlock_check::run(&w, |faults| async move {
        if pause_holder {
            faults.pause_holder(0, pause).await
        } else {
            Ok(())
        }
    });
    // A signal ends the run: dropped, it kills its workers (a paused one
    // too), which would otherwise go on taking the lock, or stay stopped.
    let report = match until_signal(run).await {
        Ok(report) => report,
        Err(code) => return code,
    };
    match report {
        Err(e) => fail(1, e),
        Ok(r) => {
            if let Err(code) = line(&r) {
                return code;
            }
            if pause_holder && r.unfenced.violations() == 0 {
                if let Err(code) = line("note: the paused holder's stale write did no harm this time (no other client wrote in between)") {
                    return code;
                }
            }
            if r.is_unsafe() {
                return ExitCode::FAILURE;
            }
            // A backend that stopped answering during the run (its acquire
            // errors count the attempts it failed) leaves a verdict on the
            // part before only.
            let last = match crate::connect(&args.backend).await {
                Ok(b) => take_and_release(b, &args, "a last try").await,
                Err(e) => Err(fail(
                    code_for(&e),
                    format!("{e}; the verdict covers the run until the backend stopped answering"),
                )),
            };
            match last {
                Ok(()) => ExitCode::SUCCESS,
                Err(code) => code,
            }
        }
    }
}

/// Runs `run` unless SIGINT, SIGTERM or SIGHUP comes first: then `run` is
/// dropped, and the exit code is 128 + the signal's number.
async fn until_signal<T>(run: impl std::future::Future<Output = T>) -> Result<T, ExitCode> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut streams = Vec::new();
    for kind in [
        SignalKind::interrupt(),
        SignalKind::terminate(),
        SignalKind::hangup(),
    ] {
        match signal(kind) {
            Ok(s) => streams.push((kind.as_raw_value(), s)),
            Err(e) => return Err(fail(1, format!("cannot install signal handlers: {e}"))),
        }
    }
    let caught = futures_util::future::select_all(streams.iter_mut().map(|(n, s)| {
        let n = *n;
        Box::pin(async move {
            s.recv().await;
            n
        })
    }));
    tokio::select! {
        done = run => Ok(done),
        (n, _, _) = caught => Err(fail(
            u8::try_from(128 + n).unwrap_or(255),
            format!("signal {n} ended the run; its workers are killed, and no verdict is given"),
        )),
    }
}

/// Takes and releases the hold the clients contend for, before the run
/// (`what`: "a first try") and after it ("a last try"): a deployment that
/// refuses it (a limit other than the one stored, a read-only replica, a
/// user without the rights) or a name someone else holds would leave every
/// client without a grant, and the run without a verdict; one that stopped
/// answering during the run leaves a verdict on part of it.
async fn take_and_release(
    backend: distlock::DynBackend,
    args: &CheckArgs,
    what: &str,
) -> Result<(), ExitCode> {
    let client = distlock::LockClient::from_dyn(backend);
    let builder = match args.limit {
        Some(n) => client.semaphore(&args.lock, n),
        None => client.lock(&args.lock),
    };
    // Waiting out a hold a run just before left behind.
    let wait = args.ttl.saturating_mul(2);
    match builder.ttl(args.ttl).wait(wait).acquire().await {
        Ok(g) => {
            // A release that fails leaves a hold the clients wait out.
            let _ = g.release().await;
            Ok(())
        }
        Err(distlock::Error::WaitTimeout { .. }) => Err(fail(
            EXIT_NOT_ACQUIRED,
            format!(
                "{} is held by someone else (waited {}): check needs a name nothing else uses (--lock)",
                args.lock,
                humantime::format_duration(wait)
            ),
        )),
        Err(
            ref e @ distlock::Error::LimitMismatch {
                ref name,
                stored,
                requested,
            },
        ) => Err(fail(
            code_for(e),
            crate::run::limit_mismatch(name, stored, requested),
        )),
        Err(e) => Err(fail(
            code_for(&e),
            format!("{}: {what} failed: {e}", args.lock),
        )),
    }
}

impl CheckArgs {
    /// The backend URL, for the password options to fill in.
    pub(crate) fn backend_mut(&mut self) -> &mut String {
        &mut self.backend
    }
}
