//! `distlock`: run a command under a distributed lock.

use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};

mod check;
mod conformance;
mod elect;
mod output;
mod run;
mod signals;
mod status;

/// Exit code: the lock was not acquired within `--wait` (EX_TEMPFAIL).
pub(crate) const EXIT_NOT_ACQUIRED: u8 = 75;
/// Exit code: the lease was lost while the command ran.
pub(crate) const EXIT_LEASE_LOST: u8 = 76;
/// Exit code: the backend is unreachable (EX_UNAVAILABLE).
pub(crate) const EXIT_UNAVAILABLE: u8 = 69;
/// Exit code: the backend refused the configuration (wrong password, no such
/// database, unusable path, another kind of server's port); retrying
/// cannot help (EX_CONFIG).
pub(crate) const EXIT_CONFIG: u8 = 78;
/// Exit code: invalid arguments (bad name, duration or URL).
pub(crate) const EXIT_USAGE: u8 = 2;

#[derive(Parser, Debug)]
#[command(name = "distlock", version, about = "Run commands under distributed locks, with fencing tokens", long_about = None)]
struct Cli {
    /// More logging (-v: debug, -vv: trace).
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    verbose: u8,
    /// Only errors.
    #[arg(short, long, global = true, conflicts_with = "verbose")]
    quiet: bool,
    /// Read the backend's password from this file (its first line) and put
    /// it into the backend URL, instead of writing it in the URL.
    /// (`DISTLOCK_PASSWORD` does the same from the environment.) It arrives
    /// as given. A backend that takes no password (sqlite://, memory://),
    /// a URL that already carries one, and `DISTLOCK_PASSWORD` set as well,
    /// refuse one: exit 2.
    #[arg(long, global = true, value_name = "PATH")]
    password_file: Option<std::path::PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run COMMAND while holding the lock NAME (or, with --limit N, one of
    /// N permits of the semaphore NAME).
    ///
    /// The command gets DISTLOCK_NAME, DISTLOCK_TOKEN (the fencing token of
    /// the lock or the permit) and
    /// DISTLOCK_BACKEND (the URL, its password replaced by ***). Exit codes:
    /// the command's
    /// own (128+N if signal N killed it); 75 if the lock was not acquired
    /// within --wait; 76 if the lease was lost while the command ran (it gets
    /// SIGTERM, then SIGKILL after --kill-after); 69 if the backend is
    /// unreachable; 78 if the backend refused the configuration (wrong
    /// password, no such database, unusable path); 2 for invalid arguments
    /// (also a --limit other than the semaphore's stored one, and memory://);
    /// 128+N if signal N ended the wait for the lock (SIGINT 130, SIGTERM
    /// 143, also SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2, SIGALRM; while the
    /// command runs, these are forwarded to its process group).
    Run(run::RunArgs),
    /// Run COMMAND while leading the election NAME, campaigning with
    /// --value.
    ///
    /// The command gets DISTLOCK_NAME, DISTLOCK_TOKEN (the leadership's
    /// fencing token), DISTLOCK_VALUE and DISTLOCK_BACKEND. Exit codes as
    /// for `run`: 76 if leadership was lost while the command ran (it gets
    /// SIGTERM, then SIGKILL after --kill-after); 75 if not elected within
    /// --wait; 2 for a value that is empty, over 4096 bytes or not
    /// printable on one line; 128+N if signal N ended the campaign.
    Elect(elect::ElectArgs),
    /// Print the leader of the election NAME, one line per change (its
    /// value, or as a JSON string in quotes another client's value that
    /// `elect` would refuse and a value that begins with a quote; an empty
    /// line while nobody leads; with --json an object, `null` while nobody
    /// leads), until interrupted; with --once the current leader only
    /// (exit 75 if none, after a `null` line with --json).
    /// A backend unreachable at the start exits 69; one that stops
    /// answering later is retried.
    Observe(elect::ObserveArgs),
    /// Show whether the lock NAME is held (and the token, remaining TTL,
    /// holder info and queue length where the backend can tell); with
    /// --semaphore its permits. An election's leader: `observe --once NAME`.
    Status(status::StatusArgs),
    /// List every live hold (locks, shared holds, semaphore permits,
    /// leaderships) whose name starts with PREFIX: kind, token, remaining
    /// lease and holder info, one per line (with --json one object per
    /// line), at most --limit of them in name order.
    List(status::ListArgs),
    /// Change the limit stored with the semaphore NAME to LIMIT (creating
    /// it if need be) and print the one it had. Permits held stay held;
    /// with a lower limit new ones wait until fewer than LIMIT are held.
    /// `run --limit` with another limit then exits 2. On Redlock a raise
    /// that makes a permit need more nodes exits 2 while permits are held.
    SetLimit(status::SetLimitArgs),
    /// List the compiled-in backends and what each guarantees.
    Backends,
    /// Run K client processes that contend for one lock and update a shared
    /// register under it, optionally pause one holder past its TTL, and
    /// report overlapping holds, stale writes (with and without fencing
    /// tokens), lost updates and token order. Exit status 1 if the verdict
    /// is unsafe: the fenced register accepted a stale write, more holders
    /// held at once than --limit (1 for the lock) while every lease still
    /// ran (the paused holder counted until its deadline), or a backend
    /// without fencing tokens let the lock's violations through.
    Check(check::CheckArgs),
    /// Run the conformance suite against the backend's servers: every case
    /// it declares, in private random namespaces (other users' locks are
    /// never touched), one line per case (ok, FAILED with the claim that
    /// failed, ignored with the reason) and a summary. Exit status 1 if a
    /// case failed. Cases that kill or pause servers are `distlock check`'s.
    Conformance(conformance::ConformanceArgs),
}

/// The backend when neither --backend nor DISTLOCK_BACKEND is given: a
/// SQLite file in the per-user state directory.
pub(crate) fn default_backend() -> String {
    format!(
        "sqlite://{}",
        default_state_dir().join("locks.db").display()
    )
}

/// `$XDG_STATE_HOME/distlock`, else `$HOME/.local/state/distlock`; an empty
/// or relative value counts as unset (the XDG base directory rules), so
/// two processes in different working directories never pick different
/// files. With neither (cron, some services), `distlock-<uid>` in the
/// temporary directory, which only its user may own ([`private_dir`]).
fn default_state_dir() -> std::path::PathBuf {
    users_state_dir()
        .unwrap_or_else(|| std::env::temp_dir().join(format!("distlock-{}", nix::unistd::getuid())))
}

/// The state directory the environment names, if it names one.
fn users_state_dir() -> Option<std::path::PathBuf> {
    let absolute = |var: &str| {
        std::env::var_os(var)
            .map(std::path::PathBuf::from)
            .filter(|p| p.is_absolute())
    };
    absolute("XDG_STATE_HOME")
        .or_else(|| absolute("HOME").map(|h| h.join(".local/state")))
        .map(|d| d.join("distlock"))
}

/// Makes `dir` (mode 0700) if need be, and refuses one that another user
/// owns or may write: in a shared temporary directory another user could
/// have made it first, to share or block this user's locks.
fn private_dir(dir: &std::path::Path) -> std::io::Result<()> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => return Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e),
    }
    let meta = std::fs::symlink_metadata(dir)?;
    let mine = meta.is_dir() && meta.uid() == nix::unistd::getuid().as_raw();
    if !mine || meta.permissions().mode() & 0o022 != 0 {
        return Err(std::io::Error::other(format!(
            "{} is not a directory of this user's that only it may write",
            dir.display()
        )));
    }
    Ok(())
}

/// Why `url` cannot serve `what` (several clients that must share the
/// backend's state): `memory://` keeps its state in the one client that
/// opened it.
pub(crate) fn one_process_only(url: &str, what: &str) -> Option<String> {
    url.starts_with("memory:").then(|| {
        format!("{url} keeps its locks inside the one client that opens it, and {what}: use sqlite:// or a server")
    })
}

/// Why a `sqlite://` URL cannot be shared by distlock's commands: a path
/// that is not absolute names another file (or none, `:memory:`) in each
/// process, so commands started in other directories would lock other
/// files.
fn relative_sqlite(url: &str) -> Option<String> {
    let path = url.strip_prefix("sqlite://")?;
    let path = path.split('?').next().unwrap_or(path);
    (!path.starts_with('/')).then(|| {
        format!(
            "sqlite://{path} names no absolute path: commands started in other directories would lock other files; give one, as sqlite:///dir/locks.db"
        )
    })
}

/// Connects to `url`; for the default backend, the state directory is
/// made first (a fresh machine has none). A SQLite file the user named in a
/// directory that does not exist is refused by the backend, not created.
pub(crate) async fn connect(url: &str) -> distlock::Result<distlock::DynBackend> {
    // Every distlock command runs in a process of its own: a lock there
    // excludes nothing, and a limit set there is gone when it exits.
    if let Some(why) = one_process_only(url, "each distlock command is a process of its own") {
        return Err(distlock::Error::invalid(distlock::InputKind::Url, why));
    }
    if let Some(why) = relative_sqlite(url) {
        return Err(distlock::Error::invalid(distlock::InputKind::Url, why));
    }
    if url == default_backend() {
        let dir = default_state_dir();
        let made = if users_state_dir().is_some() {
            std::fs::create_dir_all(&dir)
        } else {
            private_dir(&dir)
        };
        if let Err(e) = made {
            return Err(distlock::Error::misconfigured(
                "sqlite",
                format!(
                    "the state directory {} cannot be used ({e}); set XDG_STATE_HOME or --backend",
                    dir.display()
                ),
                Some(Box::new(e)),
            ));
        }
    }
    distlock::connect(url).await
}

/// Connects to `url` for a command with `--wait`: a non-zero wait bounds
/// the connect too, and outlasts a backend that is unreachable for a while
/// (a server restarting as the command starts), asking again after a pause
/// (100 ms, doubling up to 2 s) as a wait outlasts it once connected; a
/// backend that has not answered by then is unreachable, exit 69. The part
/// of the wait left is the acquire's (zero: one try). Without a wait, or
/// with 0, the backend's own connect timeout applies and a refused
/// connection fails at once.
pub(crate) async fn connect_within(
    url: &str,
    wait: Option<Duration>,
) -> Result<(distlock::DynBackend, Option<Duration>), ExitCode> {
    let connected =
        |r: distlock::Result<distlock::DynBackend>| r.map_err(|e| fail(code_for(&e), e));
    match wait {
        Some(w) if !w.is_zero() => {
            let start = tokio::time::Instant::now();
            // A wait beyond the longest is for ever (the acquire's too).
            let deadline = start + w.min(distlock::LONGEST_WAIT);
            // The last attempt goes out this long before the deadline, so
            // that a refusal or an answer can still come in time.
            let last = deadline
                .checked_sub(Duration::from_millis(100))
                .unwrap_or(start);
            let mut pause = Duration::from_millis(100);
            loop {
                match tokio::time::timeout_at(deadline, connect(url)).await {
                    Ok(Err(e @ distlock::Error::Unavailable { .. }))
                        if tokio::time::Instant::now() < last =>
                    {
                        let until = (tokio::time::Instant::now() + pause).min(last);
                        tracing::warn!(error = %e, retry_in = ?until.saturating_duration_since(tokio::time::Instant::now()), "connecting failed; trying again while --wait lasts");
                        tokio::time::sleep_until(until).await;
                        pause = (pause * 2).min(Duration::from_secs(2));
                    }
                    Ok(r) => return Ok((connected(r)?, Some(w.saturating_sub(start.elapsed())))),
                    Err(_) => {
                        return Err(fail(
                            EXIT_UNAVAILABLE,
                            format!(
                                "the backend did not answer within --wait {}; check that it runs and is reachable",
                                humantime::format_duration(w)
                            ),
                        ))
                    }
                }
            }
        }
        _ => Ok((connected(connect(url).await)?, wait)),
    }
}

pub(crate) fn parse_duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s)
        .map_err(|e| format!("{s:?} is not a duration ({e}); use e.g. 500ms, 10s, 2m"))
}

/// Prints a one-line error and gives its exit code.
pub(crate) fn fail(code: u8, msg: impl std::fmt::Display) -> ExitCode {
    output::note(format_args!("distlock: {msg}"));
    ExitCode::from(code)
}

/// Refuses a TTL option (`flag`) outside the backend's TTL range, in one
/// line that names the range.
pub(crate) fn ttl_in_range(
    flag: &str,
    ttl: Duration,
    caps: &distlock::Capabilities,
) -> Result<(), String> {
    if ttl < caps.min_ttl || ttl > caps.max_ttl {
        return Err(format!(
            "{flag} {:?} is outside {}'s TTL range, {:?} to {:?}",
            ttl, caps.backend, caps.min_ttl, caps.max_ttl
        ));
    }
    Ok(())
}

/// The URL schemes whose backends authenticate with a password in the
/// URL's userinfo. Any other scheme would read the inserted `user:pw@` as
/// part of something else (SQLite: a relative directory named after the
/// password, so two processes in different directories open different
/// files and both hold the same lock).
const PASSWORD_SCHEMES: &[&str] = &[
    "postgres",
    "postgresql",
    "mysql",
    "mariadb",
    "redis",
    "rediss",
    "redis+sentinel",
    "redis+cluster",
    "rediss+sentinel",
    "rediss+cluster",
    "redlock",
    "etcd",
    "etcds",
    "zk",
];

/// Puts the password from `--password-file` or `DISTLOCK_PASSWORD` into the
/// command's backend URL.
fn apply_password(cli: &mut Cli) -> Result<(), String> {
    let source = (&cli.password_file, std::env::var_os("DISTLOCK_PASSWORD"));
    if source == (&None, None) {
        return Ok(());
    }
    let url = match &mut cli.command {
        Command::Run(a) => a.backend_mut(),
        Command::Elect(a) => a.backend_mut(),
        Command::Observe(a) => a.backend_mut(),
        Command::Status(a) => a.backend_mut(),
        Command::List(a) => a.backend_mut(),
        Command::SetLimit(a) => a.backend_mut(),
        Command::Check(a) => a.backend_mut(),
        Command::Conformance(a) => a.backend_mut(),
        Command::Backends => return Ok(()),
    };
    let (password, source) = match source {
        (Some(_), Some(_)) => {
            return Err(
                "--password-file is given and DISTLOCK_PASSWORD is set; give the password in one place only"
                    .into(),
            )
        }
        (Some(path), None) => (
            std::fs::read_to_string(path)
                .map_err(|e| format!("--password-file {}: {e}", path.display()))?
                .lines()
                .next()
                .unwrap_or("")
                .to_string(),
            PasswordSource::File,
        ),
        (None, Some(p)) => (
            p.into_string().map_err(|_| {
                "DISTLOCK_PASSWORD is not valid UTF-8; a password must be text".to_string()
            })?,
            PasswordSource::Env,
        ),
        (None, None) => return Ok(()),
    };
    *url = with_password(url, &password, source)?;
    Ok(())
}

/// Where the password came from, for the error that refuses it.
#[derive(Clone, Copy, Debug)]
pub(crate) enum PasswordSource {
    /// `DISTLOCK_PASSWORD`.
    Env,
    /// `--password-file`.
    File,
}

/// `url` with `password` as its userinfo's password (keeping the user). A
/// URL whose scheme distlock does not know is returned as it is, for
/// `connect` to refuse by name.
pub(crate) fn with_password(
    url: &str,
    password: &str,
    source: PasswordSource,
) -> Result<String, String> {
    let (scheme, rest) = url
        .split_once("://")
        .ok_or_else(|| format!("{:?} is not a URL", distlock::redact(url)))?;
    if !PASSWORD_SCHEMES.contains(&scheme) {
        if !distlock::SCHEMES.iter().any(|(s, _)| *s == scheme) {
            return Ok(url.to_string());
        }
        let (given, undo) = match source {
            PasswordSource::Env => ("DISTLOCK_PASSWORD is set", "unset DISTLOCK_PASSWORD"),
            PasswordSource::File => ("--password-file is given", "drop --password-file"),
        };
        return Err(format!(
            "{scheme}:// takes no password, but {given}: {undo} or choose a backend that uses one"
        ));
    }
    if password.is_empty() {
        return Err("the password given is empty".into());
    }
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    let (user, hosts) = match authority.rsplit_once('@') {
        Some((info, hosts)) => (info.split_once(':').map_or(info, |(u, _)| u), hosts),
        None => ("", authority),
    };
    let in_userinfo = authority
        .rsplit_once('@')
        .is_some_and(|(info, _)| info.contains(':'));
    let in_query = tail.split_once('?').is_some_and(|(_, q)| {
        q.split('&').any(|p| {
            p.split_once('=')
                .map_or(p, |(k, _)| k)
                .eq_ignore_ascii_case("password")
        })
    });
    if in_userinfo || in_query {
        let given = match source {
            PasswordSource::Env => "DISTLOCK_PASSWORD is set",
            PasswordSource::File => "--password-file is given",
        };
        return Err(format!(
            "the backend URL already carries a password and {given}; give the password in one place only"
        ));
    }
    // These backends read the URL's password as it stands; the others
    // percent-decode it, so it goes in encoded and arrives as given.
    let verbatim = matches!(
        scheme,
        "etcd" | "etcds" | "zk" | "redis+sentinel" | "rediss+sentinel"
    );
    let password = if !verbatim {
        percent_encode(password)
    } else if password.contains(['@', '/', '?', '#', ':']) {
        return Err(format!("the password contains one of @ / ? # :, which a {scheme}:// URL cannot carry: it reads the password as written"));
    } else {
        password.to_string()
    };
    Ok(format!("{scheme}://{user}:{password}@{hosts}{tail}"))
}

/// `text` with every byte but the URL's unreserved characters
/// (`A-Z a-z 0-9 - . _ ~`) written as `%XX`.
fn percent_encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// A client over `backend` whose holds carry `given` as their holder info,
/// or else the default (host name and process id) followed by the command
/// line, cut to the bound. An invalid `given` is a usage error.
pub(crate) fn client_for_command(
    backend: distlock::DynBackend,
    given: Option<&str>,
    command: &[String],
) -> Result<distlock::LockClient, ExitCode> {
    let client = distlock::LockClient::from_dyn(backend);
    let info = match given {
        Some(info) => info.to_string(),
        None => {
            distlock::fit_holder_info(&format!("{}: {}", client.holder_info(), command.join(" ")))
        }
    };
    client
        .with_holder_info(&info)
        .map_err(|e| fail(EXIT_USAGE, e))
}

/// The exit code for a library error.
pub(crate) fn code_for(e: &distlock::Error) -> u8 {
    match e {
        distlock::Error::InvalidInput { .. }
        | distlock::Error::LimitMismatch { .. }
        | distlock::Error::Unsupported { .. } => EXIT_USAGE,
        distlock::Error::WaitTimeout { .. } => EXIT_NOT_ACQUIRED,
        distlock::Error::LeaseLost { .. } => EXIT_LEASE_LOST,
        distlock::Error::Misconfigured { .. } => EXIT_CONFIG,
        _ => EXIT_UNAVAILABLE,
    }
}

fn main() -> ExitCode {
    // `distlock check` re-executes this binary as its client processes.
    if let Some(code) = distlock_check::worker_main_if_requested() {
        return code;
    }
    let mut cli = Cli::parse();
    if let Err(e) = apply_password(&mut cli) {
        return fail(EXIT_USAGE, e);
    }
    // The conformance suite loses locks on purpose: their warnings are
    // expected, so it logs errors only unless asked for more.
    let suite = matches!(cli.command, Command::Conformance(_));
    let level = match (cli.quiet, cli.verbose) {
        (true, _) => "error",
        (false, 0) if suite => "error",
        (false, 0) => "warn",
        (false, 1) => "debug",
        _ => "trace",
    };
    // The ZooKeeper client warns of each failed connection attempt, which
    // distlock reports itself, in one line, when it gives up; sqlx warns of
    // each statement slower than a second, and distlock's statements may
    // wait that long for a row or a file lock by design.
    let quieted = if level == "warn" {
        ",zookeeper_client=error,sqlx=error"
    } else {
        ""
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| {
        tracing_subscriber::EnvFilter::new(format!(
            "{level},h2=warn,hyper=warn,tower=warn{quieted}"
        ))
    });
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_target(false)
        // A log line that cannot be written (stderr a closed pipe) is
        // dropped: reporting it would panic on the same stderr.
        .log_internal_errors(false)
        .init();
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => return fail(1, format!("cannot start the async runtime: {e}")),
    };
    rt.block_on(async {
        let code = match cli.command {
            Command::Run(args) => run::run(args).await,
            Command::Elect(args) => elect::elect(args).await,
            Command::Observe(args) => elect::observe(args).await,
            Command::Status(args) => status::status(args).await,
            Command::List(args) => status::list(args).await,
            Command::SetLimit(args) => status::set_limit(args).await,
            Command::Backends => status::backends(),
            Command::Check(args) => check::check(args).await,
            Command::Conformance(args) => conformance::conformance(args).await,
        };
        requests_finished().await;
        code
    })
}

/// How long the end of the process waits for requests still running in
/// tasks of their own: a release that returned at a majority of Redlock's
/// nodes goes on to the others, each bounded by its node timeout.
const REQUESTS_GRACE: Duration = Duration::from_secs(1);

/// Waits until the runtime has no task left, for at most
/// [`REQUESTS_GRACE`]: the runtime drops every task when `main` returns,
/// and a release cut there would leave its key on a node until its TTL.
/// The command's client is dropped by now, and with it every task that
/// lives as long as a client.
async fn requests_finished() {
    let metrics = tokio::runtime::Handle::current().metrics();
    let start = std::time::Instant::now();
    while metrics.num_alive_tasks() > 0 && start.elapsed() < REQUESTS_GRACE {
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let left = metrics.num_alive_tasks();
    if left > 0 {
        tracing::debug!(tasks = left, "requests still running at exit are dropped");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_password_goes_in_percent_encoded_where_the_backend_decodes_it() {
        let env = PasswordSource::Env;
        assert_eq!(
            with_password("postgres://app@h:5432/db", "p%41ss word", env).unwrap(),
            "postgres://app:p%2541ss%20word@h:5432/db"
        );
        assert_eq!(
            with_password("redis://h:6379/0", "100%", env).unwrap(),
            "redis://:100%25@h:6379/0"
        );
        assert_eq!(
            with_password("redlock://a:1,b:2,c:3", "x%y", env).unwrap(),
            "redlock://:x%25y@a:1,b:2,c:3"
        );
        // etcd, ZooKeeper and Sentinel read the password as it stands.
        assert_eq!(
            with_password("etcd://app@h:2379", "p%41", env).unwrap(),
            "etcd://app:p%41@h:2379"
        );
        assert_eq!(
            with_password("redis+sentinel://h:1/m", "p%41", env).unwrap(),
            "redis+sentinel://:p%41@h:1/m"
        );
    }

    #[test]
    fn a_password_given_twice_is_refused() {
        for (url, source) in [
            ("postgres://app:inurl@h/db", PasswordSource::Env),
            ("redis://:inurl@h:6379", PasswordSource::File),
            ("postgres:///db?host=h&password=inurl", PasswordSource::Env),
            ("etcd://app:inurl@h:2379", PasswordSource::Env),
        ] {
            let e = with_password(url, "other", source).unwrap_err();
            assert!(e.contains("already carries a password"), "{e}");
            assert!(!e.contains("inurl") && !e.contains("other"), "{e}");
        }
        assert!(with_password("postgres://app@h/db", "pw", PasswordSource::Env).is_ok());
    }
}
