//! `distlock run`: the command's whole life under the lock.

use std::os::unix::process::ExitStatusExt;
use std::process::ExitCode;
use std::time::Duration;

use distlock::{Leadership, LockClient, LockGuard, LockName, LostReason, MultiGuard};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use crate::signals::Signals;
use crate::{
    code_for, default_backend, fail, parse_duration, EXIT_CONFIG, EXIT_LEASE_LOST,
    EXIT_NOT_ACQUIRED, EXIT_USAGE,
};

#[derive(clap::Args, Debug)]
pub(crate) struct RunArgs {
    /// Backend URL (sqlite://, postgres://, mysql://, redis://, redlock://,
    /// etcd://, zk://).
    #[arg(long, env = "DISTLOCK_BACKEND", hide_env_values = true, default_value_t = default_backend())]
    backend: String,
    /// Lease TTL, renewed at a third of it (humantime: 500ms, 10s, 2m).
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    ttl: Duration,
    /// How long to wait for the lock, connecting to the backend included (a
    /// backend down as it starts is asked again; one that has not answered
    /// by then: exit 69); 0 tries once. Default: forever once connected (as
    /// is a wait of more than a century); without --wait a backend that
    /// refuses the connection as the command starts, or on Redlock has too
    /// few nodes up for the first try of a semaphore of several permits
    /// (which needs more than a majority; a node quarantined after a
    /// restart counts as down), exits 69 at once (a wrong URL does not
    /// hang).
    #[arg(long, value_parser = parse_duration)]
    wait: Option<Duration>,
    /// Do not renew: the lease (and the command) ends after --ttl.
    #[arg(long)]
    no_renew: bool,
    /// Hold one of N permits of the semaphore NAME instead of the lock NAME
    /// (`consul lock -n N`): at most N commands run at once. The limit is
    /// stored with the semaphore; another limit than the stored one exits 2.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    limit: Option<u32>,
    /// Take the lock NAME shared (flock's -s): commands run with --shared
    /// overlap each other, and exclude those run without it (flock's -x).
    /// An exclusive command waiting behind shared ones holds back new shared
    /// ones.
    #[arg(long, conflicts_with = "limit")]
    shared: bool,
    /// Grace between SIGTERM and SIGKILL when the lease is lost.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    kill_after: Duration,
    /// The lock name; several names hold every one of those locks at once
    /// (taken in sorted order, all or none: while it waits for one, it
    /// holds those before it; giving up, it gives them all back).
    #[arg(required = true, num_args = 1..)]
    names: Vec<String>,
    /// Who holds it, as `distlock status` and `distlock list` show (at most
    /// 256 bytes, one line). Default: host name, process id and the
    /// command line.
    #[arg(long, value_name = "TEXT")]
    holder_info: Option<String>,
    /// The command and its arguments (after `--`).
    #[arg(last = true, required = true, num_args = 1..)]
    command: Vec<String>,
}

/// Signals the command's whole process group (it runs in its own), so a
/// shell's children stop with it, as they would under `consul lock`.
fn send(pid: Option<u32>, sig: Signal) {
    if let Some(pid) = pid.and_then(|p| i32::try_from(p).ok()) {
        let _ = kill(Pid::from_raw(-pid), sig);
    }
}

/// Whether the command's process group still has a process that runs. A
/// process that exited and that its parent has not reaped yet (a zombie: a
/// shell's child whose shell died first waits for the system's init, or a
/// container's first process, to reap it) still counts for `kill(2)`; on
/// Linux such members are not counted.
fn group_alive(pid: Option<u32>) -> bool {
    let Some(group) = pid.and_then(|p| i32::try_from(p).ok()) else {
        return false;
    };
    nix::sys::signal::killpg(Pid::from_raw(group), None).is_ok() && has_running_member(group)
}

/// Whether a process of `group` is not a zombie, from `/proc`: `false`
/// only when every member found there is one (`true` where it cannot be
/// read, or shows no member: another PID namespace, `hidepid`).
fn has_running_member(group: i32) -> bool {
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return true;
    };
    let mut zombies = 0;
    for p in procs.flatten() {
        let Some(pid) = p.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        // "pid (comm) state ppid pgrp ...": comm may hold spaces and
        // parentheses, so the fields are counted after its last ')'.
        let mut fields = stat
            .rsplit_once(')')
            .map_or("", |(_, r)| r)
            .split_whitespace();
        let state = fields.next();
        if fields.nth(1).and_then(|g| g.parse::<i32>().ok()) == Some(group) {
            if state != Some("Z") {
                return true;
            }
            zombies += 1;
        }
    }
    zombies == 0
}

/// Whether the command's process group still runs once it has had a moment
/// to end: members signalled with the command (a forwarded SIGTERM) may
/// end just after it does.
async fn group_still_running(pid: Option<u32>) -> bool {
    let settled = tokio::time::Instant::now() + Duration::from_millis(200);
    loop {
        // Read off the runtime, as in `stop_group`.
        if !tokio::task::spawn_blocking(move || group_alive(pid))
            .await
            .unwrap_or(true)
        {
            return false;
        }
        if tokio::time::Instant::now() >= settled {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Waits until the command's process group is empty or `grace` ends, then
/// kills what is left of it.
async fn stop_group(pid: Option<u32>, grace: &mut std::pin::Pin<&mut tokio::time::Sleep>) {
    let Some(group) = pid.and_then(|p| i32::try_from(p).ok()).map(Pid::from_raw) else {
        return;
    };
    // Read off the runtime: `/proc` holds a file per process of the
    // machine, and the holds' renewals run on this runtime meanwhile.
    while tokio::task::spawn_blocking(move || group_alive(pid))
        .await
        .unwrap_or(true)
    {
        tokio::select! {
            () = grace.as_mut() => {
                tracing::error!("the command's process group outlived its SIGTERM; killing it");
                let _ = nix::sys::signal::killpg(group, Signal::SIGKILL);
                return;
            }
            () = tokio::time::sleep(Duration::from_millis(10)) => {}
        }
    }
}

fn exit_of(status: std::process::ExitStatus) -> ExitCode {
    match (status.code(), status.signal()) {
        (Some(c), _) => ExitCode::from(u8::try_from(c).unwrap_or(1)),
        (None, Some(sig)) => ExitCode::from(u8::try_from(128 + sig).unwrap_or(255)),
        _ => ExitCode::FAILURE,
    }
}

/// What the command runs under: one lock or permit, several locks, or an
/// election's leadership.
pub(crate) enum Held {
    One(LockGuard),
    All(MultiGuard),
    Leader(Leadership),
}

impl Held {
    /// Whether everything held is still held as far as this process can
    /// tell.
    fn is_held(&self) -> bool {
        match self {
            Held::One(g) => g.is_held(),
            Held::All(m) => m.is_held(),
            Held::Leader(l) => l.is_held(),
        }
    }

    /// The earliest conservative local deadline, or `None` once lost.
    fn deadline(&self) -> Option<tokio::time::Instant> {
        match self {
            Held::One(g) => g.deadline(),
            Held::All(m) => m.deadline(),
            Held::Leader(l) => l.deadline(),
        }
    }

    /// Each name and its token, in canonical order.
    fn tokens(&self) -> Vec<(LockName, distlock::FencingToken)> {
        match self {
            Held::One(g) => vec![(g.name().clone(), g.token())],
            Held::All(m) => m.tokens(),
            Held::Leader(l) => vec![(l.name().clone(), l.token())],
        }
    }

    async fn lost(&self) -> (LockName, LostReason) {
        match self {
            Held::One(g) => (g.name().clone(), g.lost().await),
            Held::All(m) => m.lost().await,
            Held::Leader(l) => (l.name().clone(), l.lost().await),
        }
    }

    async fn release(self) -> distlock::Result<bool> {
        match self {
            Held::One(g) => g.release().await,
            Held::All(m) => m.release().await,
            Held::Leader(l) => l.resign().await,
        }
    }
}

pub(crate) async fn run(args: RunArgs) -> ExitCode {
    let mut names = Vec::with_capacity(args.names.len());
    for n in &args.names {
        match LockName::new(n) {
            Ok(n) => names.push(n),
            Err(e) => return fail(EXIT_USAGE, e),
        }
    }
    if args.ttl.is_zero() {
        return fail(EXIT_USAGE, "--ttl must be greater than zero");
    }
    if args.limit.is_some() && names.len() > 1 {
        return fail(EXIT_USAGE, "--limit takes one semaphore name");
    }
    if args.shared && names.len() > 1 {
        return fail(EXIT_USAGE, "--shared takes one lock name");
    }
    let mut sorted: Vec<&str> = names.iter().map(LockName::as_str).collect();
    sorted.sort_unstable();
    if let Some(w) = sorted.windows(2).find(|w| w[0] == w[1]) {
        return fail(
            EXIT_USAGE,
            format!("`{}` is named twice; name each lock once", w[0]),
        );
    }
    let mut signals = match Signals::install() {
        Ok(s) => s,
        Err(code) => return code,
    };
    let wait = async {
        let (backend, left) = crate::connect_within(&args.backend, args.wait).await?;
        let client =
            crate::client_for_command(backend, args.holder_info.as_deref(), &args.command)?;
        let held = acquire(&client, &names, &args, left).await?;
        Ok((client, held))
    };
    let what = waited_for(&names, &args);
    let (_client, held) = match signals.unless_interrupted(&what, wait).await {
        Ok(taken) => taken,
        Err(code) => return code,
    };
    run_command(
        held,
        &args.backend,
        &args.command,
        args.kill_after,
        &[],
        signals,
    )
    .await
}

/// What `run` waits for, as its messages name it.
fn waited_for(names: &[LockName], args: &RunArgs) -> String {
    match (names, args.limit) {
        ([name], Some(n)) => format!("one of {n} permits of semaphore `{name}`"),
        ([name], None) => format!("lock `{name}`"),
        _ => format!("the locks {}", quoted_names(names)),
    }
}

/// Runs `command` while `held` lasts, with its names and tokens (and
/// `env`) in the environment: stops it when the hold may be lost, forwards
/// the `signals` caught to it, and releases when it exits.
pub(crate) async fn run_command(
    held: Held,
    backend: &str,
    command: &[String],
    kill_after: Duration,
    env: &[(&str, &str)],
    mut signals: Signals,
) -> ExitCode {
    let tokens = held.tokens();
    let (name, token) = tokens[0].clone();
    let all_tokens = tokens
        .iter()
        .map(|(n, t)| format!("{n}={t}"))
        .collect::<Vec<_>>()
        .join(" ");
    tracing::info!(locks = %all_tokens, "acquired");
    let guard = held;
    // A hold that may be lost already (its session ended as it was
    // granted, its lease ran out before this line) never starts the
    // command.
    if !guard.is_held() {
        let _ = guard.release().await;
        return fail(
            EXIT_LEASE_LOST,
            format!(
                "the lease on {} was lost before the command started",
                quoted(&tokens)
            ),
        );
    }

    let mut child = match tokio::process::Command::new(&command[0])
        .args(&command[1..])
        .env("DISTLOCK_NAME", name.as_str())
        .env("DISTLOCK_TOKEN", token.to_string())
        .env("DISTLOCK_TOKENS", &all_tokens)
        .env("DISTLOCK_BACKEND", distlock::redact(backend))
        // The password stays with distlock, as it does in DISTLOCK_BACKEND.
        .env_remove("DISTLOCK_PASSWORD")
        .envs(env.iter().copied())
        .process_group(0)
        .spawn()
    {
        Ok(c) => c,
        Err(e) => {
            let _ = guard.release().await;
            let code = if e.kind() == std::io::ErrorKind::NotFound {
                127
            } else {
                126
            };
            return fail(code, format!("cannot run {:?}: {e}", command[0]));
        }
    };
    let pid = child.id();

    let mut lost = false;
    let status = loop {
        tokio::select! {
            status = child.wait() => break status,
            (which, reason) = guard.lost(), if !lost => {
                tracing::error!(lock = %which, %reason, "lease lost; stopping the command");
                lost = true;
                send(pid, Signal::SIGTERM);
                // A group stopped by Ctrl-Z acts on it once continued.
                send(pid, Signal::SIGCONT);
                let grace = tokio::time::sleep(kill_after);
                tokio::pin!(grace);
                tokio::select! {
                    status = child.wait() => {
                        // What the command started in its group (a shell's
                        // children) must not outlive it unprotected either.
                        stop_group(pid, &mut grace).await;
                        break status;
                    }
                    () = &mut grace => {
                        tracing::error!("the command ignored SIGTERM for {kill_after:?}; killing it");
                        send(pid, Signal::SIGKILL);
                    }
                }
            }
            sig = signals.recv() => match sig {
                // Ctrl-Z: the command stops before distlock does, and goes
                // on only if the lease outlived the stop; if not, `lost()`
                // ends it next.
                Signal::SIGTSTP => {
                    signals.suspend(|| send(pid, Signal::SIGSTOP)).await;
                    if guard.is_held() {
                        send(pid, Signal::SIGCONT);
                    }
                }
                sig => send(pid, sig),
            },
        }
    };
    if !lost && group_still_running(pid).await {
        // What the command left running in its group (a job a shell put in
        // the background) worked under the lock: it does not go on once
        // the lock is released.
        tracing::warn!(
            "the command exited and left processes in its group; stopping them before the release"
        );
        send(pid, Signal::SIGTERM);
        send(pid, Signal::SIGCONT);
        let grace = tokio::time::sleep(kill_after);
        tokio::pin!(grace);
        stop_group(pid, &mut grace).await;
    }
    let (ended, held_until) = (tokio::time::Instant::now(), guard.deadline());
    let released = guard.release().await;
    // A release answered only after the lease's end (the server stopped
    // answering meanwhile) finds it not held whether or not it was taken
    // while the command ran: it cannot tell which. One that fails after
    // the lease's end tells no more.
    let answered_late = held_until.is_some_and(|d| ended < d && tokio::time::Instant::now() >= d);
    if lost {
        return fail(
            EXIT_LEASE_LOST,
            format!(
                "the lease on {} was lost while the command ran",
                quoted(&tokens)
            ),
        );
    }
    match released {
        Ok(false) if answered_late => {
            return fail(
                EXIT_LEASE_LOST,
                format!(
                    "the release of {} was answered only after the lease's end, so that the command ran under the lock to its end cannot be confirmed (it ended within the lease as far as this process knew)",
                    quoted(&tokens)
                ),
            )
        }
        // Taken away after the last renewal, before anything here noticed:
        // the command did not run under the lock to its end.
        Ok(false) => {
            return fail(
                EXIT_LEASE_LOST,
                format!(
                    "the lease on {} was no longer held when the command ended (it expired or was taken while the command ran)",
                    quoted(&tokens)
                ),
            )
        }
        Ok(true) => {}
        // Refused for good (an ACL without a command the release needs):
        // the lock stays taken for the rest of its TTL, and every later
        // release will be refused the same way.
        Err(e) if code_for(&e) == EXIT_CONFIG => {
            return fail(
                EXIT_CONFIG,
                format!(
                    "the command ended, but the release of {} was refused, so it stays held until its TTL runs out: {e}",
                    quoted(&tokens)
                ),
            )
        }
        // No answer before the lease's end: as little is known as from a
        // late "not held".
        Err(e) if answered_late => {
            return fail(
                EXIT_LEASE_LOST,
                format!(
                    "the release of {} failed only after the lease's end ({e}), so that the command ran under the lock to its end cannot be confirmed (it ended within the lease as far as this process knew)",
                    quoted(&tokens)
                ),
            )
        }
        Err(e) => {
            tracing::warn!(error = %e, "release failed; the lease will expire after its TTL");
        }
    }
    match status {
        Ok(s) => exit_of(s),
        Err(e) => fail(1, format!("waiting for the command failed: {e}")),
    }
}

/// Takes the lock, the permit or every lock, as the flags say; the exit
/// code when that fails.
async fn acquire(
    client: &LockClient,
    names: &[LockName],
    args: &RunArgs,
    wait: Option<Duration>,
) -> Result<Held, ExitCode> {
    let failed = |e: distlock::Error| match &e {
        distlock::Error::LimitMismatch {
            name,
            stored,
            requested,
        } => fail(code_for(&e), limit_mismatch(name, *stored, *requested)),
        _ => fail(code_for(&e), e),
    };
    if names.len() > 1 {
        let all = || {
            let all = client.lock_all(names).ttl(args.ttl);
            if args.no_renew {
                all.no_renew()
            } else {
                all
            }
        };
        let taken = || {
            fail(
                EXIT_NOT_ACQUIRED,
                format!(
                    "one of the locks {} is held by someone else",
                    quoted_names(names)
                ),
            )
        };
        return match wait {
            Some(w) if w.is_zero() => match all().try_acquire().await {
                Ok(Some(m)) => Ok(Held::All(m)),
                Ok(None) => Err(taken()),
                Err(e) => Err(failed(e)),
            },
            Some(w) => all().wait(w).acquire().await.map(Held::All).map_err(failed),
            None => all().acquire().await.map(Held::All).map_err(failed),
        };
    }
    let name = &names[0];
    let lock = || {
        let lock = match args.limit {
            Some(n) => client.semaphore(name, n),
            None if args.shared => client.lock(name).shared(),
            None => client.lock(name),
        }
        .ttl(args.ttl);
        if args.no_renew {
            lock.no_renew()
        } else {
            lock
        }
    };
    let taken = || match args.limit {
        Some(n) => fail(
            EXIT_NOT_ACQUIRED,
            format!("all {n} permits of semaphore `{name}` are held"),
        ),
        None => fail(
            EXIT_NOT_ACQUIRED,
            format!("lock `{name}` is held by someone else"),
        ),
    };
    match wait {
        Some(w) if w.is_zero() => match lock().try_acquire().await {
            Ok(Some(g)) => Ok(Held::One(g)),
            Ok(None) => Err(taken()),
            Err(e) => Err(failed(e)),
        },
        Some(w) => lock()
            .wait(w)
            .acquire()
            .await
            .map(Held::One)
            .map_err(failed),
        // A semaphore of several permits may need more Redlock nodes than
        // the connect asked for (a majority): a first try that finds too
        // few exits 69 at once, as a connect refused would; a failure later
        // in the wait is outlasted.
        None if args.limit.is_some_and(|n| n > 1) => match lock().try_acquire().await {
            Ok(Some(g)) => Ok(Held::One(g)),
            Err(e @ distlock::Error::QuorumNotReached { .. }) => Err(failed(e)),
            Ok(None) | Err(_) => lock().acquire().await.map(Held::One).map_err(failed),
        },
        None => lock().acquire().await.map(Held::One).map_err(failed),
    }
}

/// A `--limit` other than the semaphore's stored one, said in the CLI's
/// terms.
pub(crate) fn limit_mismatch(name: &LockName, stored: u32, requested: u32) -> String {
    format!(
        "semaphore `{name}` has the stored limit {stored}, and --limit asked for {requested}; run with --limit {stored}, or change the limit with `distlock set-limit {name} N`"
    )
}

fn quoted_names(names: &[LockName]) -> String {
    names
        .iter()
        .map(|n| format!("`{n}`"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn quoted(tokens: &[(LockName, distlock::FencingToken)]) -> String {
    let names: Vec<LockName> = tokens.iter().map(|(n, _)| n.clone()).collect();
    quoted_names(&names)
}

impl RunArgs {
    /// The backend URL, for the password options to fill in.
    pub(crate) fn backend_mut(&mut self) -> &mut String {
        &mut self.backend
    }
}
