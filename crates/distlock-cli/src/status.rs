//! `distlock status` and `distlock backends`.

use std::process::ExitCode;

use distlock::{Consistency, Fencing, LockName, Waiting};

use crate::{code_for, default_backend, fail, EXIT_USAGE};

#[derive(clap::Args, Debug)]
pub(crate) struct StatusArgs {
    /// The lock name.
    name: String,
    /// Backend URL.
    #[arg(long, env = "DISTLOCK_BACKEND", default_value_t = default_backend())]
    backend: String,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

pub(crate) async fn status(args: StatusArgs) -> ExitCode {
    let name = match LockName::new(&args.name) {
        Ok(n) => n,
        Err(e) => return fail(EXIT_USAGE, e),
    };
    let backend = match distlock::connect(&args.backend).await {
        Ok(b) => b,
        Err(e) => return fail(code_for(&e), e),
    };
    let s = match backend.inspect(&name).await {
        Ok(s) => s,
        Err(e) => return fail(code_for(&e), e),
    };
    let opt = |v: Option<String>| v.unwrap_or_else(|| "null".into());
    if args.json {
        println!(
            "{{\"name\":\"{}\",\"held\":{},\"token\":{},\"remaining_ms\":{},\"queue_len\":{}}}",
            name,
            s.held,
            opt(s.token.map(|t| t.to_string())),
            opt(s.remaining.map(|r| r.as_millis().to_string())),
            opt(s.queue_len.map(|q| q.to_string())),
        );
    } else {
        println!("lock:      {name}");
        println!("held:      {}", if s.held { "yes" } else { "no" });
        let unknown = || "(the backend cannot tell)".to_string();
        if s.held {
            println!(
                "token:     {}",
                s.token.map_or_else(unknown, |t| t.to_string())
            );
            println!(
                "remaining: {}",
                s.remaining
                    .map_or_else(unknown, |r| humantime::format_duration(r).to_string())
            );
        }
        println!(
            "queue:     {}",
            s.queue_len.map_or_else(unknown, |q| q.to_string())
        );
    }
    ExitCode::SUCCESS
}

pub(crate) fn backends() -> ExitCode {
    println!("URL                        FENCING      CAP  WAITING       EXPIRY CLOCK");
    for (url, c) in distlock::declared_backends() {
        let fencing = match c.fencing {
            Fencing::Strong => "strong",
            Fencing::BestEffort => "best-effort",
            _ => "none",
        };
        let cap = match c.consistency {
            Consistency::Cp => "CP",
            _ => "AP",
        };
        let waiting = match c.waiting {
            Waiting::Notification => "notification",
            _ => "polling",
        };
        println!(
            "{url:<26} {fencing:<12} {cap:<4} {waiting:<13} {:?}",
            c.clock
        );
    }
    ExitCode::SUCCESS
}
