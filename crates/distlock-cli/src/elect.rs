//! `distlock elect` and `distlock observe`: a command run while leading an
//! election, and the election's leaders as they change.

use std::process::ExitCode;
use std::time::Duration;

use distlock::{LockClient, LockName};
use futures_util::StreamExt;

use crate::output;
use crate::run::{run_command, Held};
use crate::signals::Signals;
use crate::{code_for, default_backend, fail, parse_duration, EXIT_NOT_ACQUIRED, EXIT_USAGE};

#[derive(clap::Args, Debug)]
pub(crate) struct ElectArgs {
    /// Backend URL (as for `run`).
    #[arg(long, env = "DISTLOCK_BACKEND", hide_env_values = true, default_value_t = default_backend())]
    backend: String,
    /// The value to campaign with: what `observe` and `etcdctl elect -l`
    /// print while this command leads (one line of printable text, at most
    /// 4096 bytes).
    #[arg(long)]
    value: String,
    /// Leadership lease TTL, renewed at a third of it.
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    ttl: Duration,
    /// How long to wait to become leader, connecting to the backend
    /// included (a backend down as it starts is asked again; one that has
    /// not answered by then: exit 69); 0 tries once. Default: forever once
    /// connected (as is a wait of more than a century); without --wait a
    /// backend that refuses the connection as the command starts exits 69
    /// at once (a wrong URL does not hang).
    #[arg(long, value_parser = parse_duration)]
    wait: Option<Duration>,
    /// Grace between SIGTERM and SIGKILL when leadership is lost.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    kill_after: Duration,
    /// The election's name.
    name: String,
    /// Who leads, as `distlock observe --json` and `distlock list` show (at
    /// most 256 bytes, one line). Default: host name, process id and the
    /// command line.
    #[arg(long, value_name = "TEXT")]
    holder_info: Option<String>,
    /// The command and its arguments (after `--`).
    #[arg(last = true, required = true, num_args = 1..)]
    command: Vec<String>,
}

#[derive(clap::Args, Debug)]
pub(crate) struct ObserveArgs {
    /// Backend URL (as for `run`).
    #[arg(long, env = "DISTLOCK_BACKEND", hide_env_values = true, default_value_t = default_backend())]
    backend: String,
    /// One JSON object per line (value, token, remaining_ms, holder_info), `null` while
    /// nobody leads. Without it each line is the leader's value, an empty
    /// line while nobody leads.
    #[arg(long)]
    json: bool,
    /// Print the current leader and exit (75 if nobody leads, after a
    /// `null` line with --json).
    #[arg(long)]
    once: bool,
    /// The election's name.
    name: String,
}

async fn client(backend: &str) -> Result<LockClient, ExitCode> {
    crate::connect(backend)
        .await
        .map(LockClient::from_dyn)
        .map_err(|e| fail(code_for(&e), e))
}

fn checked_name(name: &str) -> Result<LockName, ExitCode> {
    LockName::new(name).map_err(|e| fail(EXIT_USAGE, e))
}

pub(crate) async fn elect(args: ElectArgs) -> ExitCode {
    let name = match checked_name(&args.name) {
        Ok(n) => n,
        Err(code) => return code,
    };
    if args.ttl.is_zero() {
        return fail(EXIT_USAGE, "--ttl must be greater than zero");
    }
    let mut signals = match Signals::install() {
        Ok(s) => s,
        Err(code) => return code,
    };
    let wait = async {
        let (backend, left) = crate::connect_within(&args.backend, args.wait).await?;
        let client =
            crate::client_for_command(backend, args.holder_info.as_deref(), &args.command)?;
        let election = client.election(&name).ttl(args.ttl);
        let leading = match left {
            Some(w) if w.is_zero() => match election.try_campaign(args.value.as_str()).await {
                Ok(Some(l)) => Ok(l),
                Ok(None) => {
                    return Err(fail(
                        EXIT_NOT_ACQUIRED,
                        format!("election `{name}` has another leader or campaigner ahead"),
                    ))
                }
                Err(e) => Err(e),
            },
            Some(w) => election.wait(w).campaign(args.value.as_str()).await,
            None => election.campaign(args.value.as_str()).await,
        };
        match leading {
            Ok(l) => Ok((client, l)),
            Err(e) => Err(fail(code_for(&e), e)),
        }
    };
    let what = format!("leadership of election `{name}`");
    let (_client, leadership) = match signals.unless_interrupted(&what, wait).await {
        Ok(leading) => leading,
        Err(code) => return code,
    };
    run_command(
        Held::Leader(leadership),
        &args.backend,
        &args.command,
        args.kill_after,
        &[("DISTLOCK_VALUE", args.value.as_str())],
        signals,
    )
    .await
}

/// One line for `leader`: its value, or with `json` an object; while
/// nobody leads an empty line, or `null`. A value distlock would refuse to
/// campaign with (another client's: empty, as a Curator `LeaderLatch`
/// without an id has it, with a line break or a control or invisible
/// character, or longer than 4096 bytes) is printed as a JSON string, in
/// quotes, so that it stays one line and is never taken for nobody.
fn line(leader: Option<&distlock::Leader>, json: bool) -> String {
    match (leader, json) {
        (Some(l), true) => serde_json::json!({
            "value": l.value,
            "token": l.token.get(),
            "remaining_ms": l.remaining.map(|r| r.as_millis() as u64),
            "holder_info": l.holder_info,
        })
        .to_string(),
        (None, true) => "null".into(),
        (Some(l), false) if plain(&l.value) => l.value.clone(),
        (Some(l), false) => serde_json::Value::from(l.value.as_str()).to_string(),
        (None, false) => String::new(),
    }
}

/// Whether `value` prints as itself on one line: a value distlock would
/// campaign with, not starting with a quote (as the quoted form does).
fn plain(value: &str) -> bool {
    distlock::validate_election_value(value).is_ok() && !value.starts_with('"')
}

pub(crate) async fn observe(args: ObserveArgs) -> ExitCode {
    let name = match checked_name(&args.name) {
        Ok(n) => n,
        Err(code) => return code,
    };
    let client = match client(&args.backend).await {
        Ok(c) => c,
        Err(code) => return code,
    };
    let election = client.election(&name);
    if args.once {
        return match election.leader().await {
            Ok(Some(l)) => match output::line(line(Some(&l), args.json)) {
                Ok(()) => ExitCode::SUCCESS,
                Err(code) => code,
            },
            Ok(None) => {
                if args.json {
                    if let Err(code) = output::line(line(None, true)) {
                        return code;
                    }
                }
                fail(
                    EXIT_NOT_ACQUIRED,
                    format!("election `{name}` has no leader"),
                )
            }
            Err(e) => fail(code_for(&e), e),
        };
    }
    let mut leaders = match election.observe().await {
        Ok(s) => s,
        Err(e) => return fail(code_for(&e), e),
    };
    let mut sigint = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())
    {
        Ok(s) => s,
        Err(_) => return fail(1, "cannot install signal handlers"),
    };
    let gone = output::reader_gone();
    tokio::pin!(gone);
    loop {
        tokio::select! {
            () = &mut gone => return ExitCode::from(output::EXIT_PIPE_CLOSED),
            next = leaders.next() => match next {
                Some(Ok(leader)) => {
                    // A closed pipe ends the observation.
                    if let Err(code) = output::line(line(leader.as_ref(), args.json)) {
                        return code;
                    }
                }
                // A refused configuration or password: retrying cannot help.
                Some(Err(e)) if !e.is_retryable() => return fail(code_for(&e), e),
                Some(Err(e)) => tracing::warn!(error = %e, "observing the election failed; retrying"),
                None => return ExitCode::SUCCESS,
            },
            _ = sigint.recv() => return ExitCode::SUCCESS,
        }
    }
}

impl ElectArgs {
    /// The backend URL, for the password options to fill in.
    pub(crate) fn backend_mut(&mut self) -> &mut String {
        &mut self.backend
    }
}

impl ObserveArgs {
    /// The backend URL, for the password options to fill in.
    pub(crate) fn backend_mut(&mut self) -> &mut String {
        &mut self.backend
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn leader(value: &str) -> distlock::Leader {
        distlock::Leader::new(value, distlock::FencingToken(7))
    }

    #[test]
    fn a_foreign_value_that_would_not_print_as_one_line_is_quoted() {
        assert_eq!(line(Some(&leader("10.0.0.1:80")), false), "10.0.0.1:80");
        assert_eq!(line(Some(&leader("")), false), r#""""#);
        assert_eq!(line(Some(&leader("two\nlines")), false), r#""two\nlines""#);
        assert_eq!(line(Some(&leader("\"q\"")), false), r#""\"q\"""#);
        assert_eq!(line(Some(&leader("a\u{200B}b")), false), "\"a\u{200B}b\"");
        assert_eq!(line(None, false), "");
    }
}
