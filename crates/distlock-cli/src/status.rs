//! `distlock status` and `distlock backends`.

use std::process::ExitCode;

use distlock::{Consistency, Fencing, HoldKind, LockName, LockStatus, Waiting};

use crate::output::line;
use crate::{code_for, default_backend, fail, EXIT_USAGE};

#[derive(clap::Args, Debug)]
pub(crate) struct StatusArgs {
    /// The lock name.
    name: String,
    /// Backend URL.
    #[arg(long, env = "DISTLOCK_BACKEND", hide_env_values = true, default_value_t = default_backend())]
    backend: String,
    /// Print JSON.
    #[arg(long)]
    json: bool,
    /// NAME is a semaphore: show how many of its permits are held and its
    /// stored limit.
    #[arg(long)]
    semaphore: bool,
}

pub(crate) async fn status(args: StatusArgs) -> ExitCode {
    let name = match LockName::new(&args.name) {
        Ok(n) => n,
        Err(e) => return fail(EXIT_USAGE, e),
    };
    let backend = match crate::connect(&args.backend).await {
        Ok(b) => b,
        Err(e) => return fail(code_for(&e), e),
    };
    let s = match if args.semaphore {
        backend.inspect_permits(&name).await
    } else {
        backend.inspect(&name).await
    } {
        Ok(s) => s,
        Err(e) => return fail(code_for(&e), e),
    };
    match print_status(&name, &s, &args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(code) => code,
    }
}

/// Writes the status `s` of `name` in the form `args` asks for.
fn print_status(name: &LockName, s: &LockStatus, args: &StatusArgs) -> Result<(), ExitCode> {
    // Held shared, no one token is the holder's: each shared hold has its
    // own, and the backend's is the newest grant's, whose hold may have
    // ended while older ones last.
    let shared_held = s.shared.is_some_and(|n| n > 0);
    let token = s.token.filter(|_| !shared_held);
    if args.json {
        let json = StatusJson {
            name: name.as_str(),
            held: s.held,
            token: token.map(|t| t.get()),
            remaining_ms: s.remaining.map(|r| r.as_millis()),
            queue_len: s.queue_len,
            holders: s.holders,
            limit: args.semaphore.then_some(s.limit),
            shared: s.shared,
            writer_waiting: s.writer_waiting,
            holder_info: s.holder_info.as_deref(),
        }
        .to_line()
        .map_err(|e| fail(1, format!("cannot write the status as JSON: {e}")))?;
        return line(json);
    }
    if args.semaphore {
        line(format!("semaphore: {name}"))?;
        let held = s.holders.unwrap_or(0);
        let plural = if held == 1 { "" } else { "s" };
        line(format!("held:      {held} permit{plural}"))?;
        line(format!(
            "limit:     {}",
            s.limit
                .map_or_else(|| "(none stored yet)".to_string(), |l| l.to_string())
        ))?;
        return line(format!(
            "holders:   `distlock list {name}` shows each permit's token and holder"
        ));
    }
    line(format!("lock:      {name}"))?;
    line(format!("held:      {}", if s.held { "yes" } else { "no" }))?;
    let unknown = || "(the backend cannot tell)".to_string();
    if s.held {
        line(format!(
            "token:     {}",
            if shared_held {
                format!("one per shared hold: distlock list {name} shows each where the backend keeps it")
            } else {
                token.map_or_else(unknown, |t| t.to_string())
            }
        ))?;
        line(format!(
            "remaining: {}",
            s.remaining
                .map_or_else(unknown, |r| humantime::format_duration(r).to_string())
        ))?;
        if let Some(info) = &s.holder_info {
            line(format!("holder:    {info}"))?;
        }
    }
    if let Some(shared) = s.shared {
        line(format!("shared:    {shared} holders"))?;
    }
    if let Some(waiting) = s.writer_waiting {
        line(format!(
            "writer:    {}",
            if waiting {
                "waiting (new shared holds wait behind it)"
            } else {
                "none waiting"
            }
        ))?;
    }
    line(format!(
        "queue:     {}",
        s.queue_len.map_or_else(unknown, |q| q.to_string())
    ))
}

/// The `--json` line. Serialized rather than formatted so that every string
/// is escaped: scripts parse this line, and a quote or backslash in a field
/// must not break it. Field order is the output's key order.
#[derive(serde::Serialize, Debug)]
struct StatusJson<'a> {
    name: &'a str,
    held: bool,
    token: Option<u64>,
    remaining_ms: Option<u128>,
    queue_len: Option<usize>,
    /// Only for `--semaphore`.
    #[serde(skip_serializing_if = "Option::is_none")]
    holders: Option<usize>,
    /// Only for `--semaphore`: the stored limit, `null` while none is.
    #[serde(skip_serializing_if = "Option::is_none")]
    limit: Option<Option<u32>>,
    /// Shared holders, where the backend serves read-write locks.
    #[serde(skip_serializing_if = "Option::is_none")]
    shared: Option<usize>,
    /// Whether an exclusive request waits, where the backend serves
    /// read-write locks.
    #[serde(skip_serializing_if = "Option::is_none")]
    writer_waiting: Option<bool>,
    /// Who holds it exclusively, where the backend stores it.
    #[serde(skip_serializing_if = "Option::is_none")]
    holder_info: Option<&'a str>,
}

impl StatusJson<'_> {
    fn to_line(&self) -> serde_json::Result<String> {
        serde_json::to_string(self)
    }
}

#[derive(clap::Args, Debug)]
pub(crate) struct ListArgs {
    /// Only holds whose name starts with this (default: all).
    #[arg(default_value = "")]
    prefix: String,
    /// Backend URL.
    #[arg(long, env = "DISTLOCK_BACKEND", hide_env_values = true, default_value_t = default_backend())]
    backend: String,
    /// One JSON object per line.
    #[arg(long)]
    json: bool,
    /// At most this many holds (the first in name order). What a listing
    /// costs the server depends on the backend: see its README.
    #[arg(long, default_value_t = 1000, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    limit: usize,
}

pub(crate) async fn list(args: ListArgs) -> ExitCode {
    if let Err(e) = distlock::validate_prefix(&args.prefix) {
        return fail(EXIT_USAGE, e);
    }
    let backend = match crate::connect(&args.backend).await {
        Ok(b) => b,
        Err(e) => return fail(code_for(&e), e),
    };
    let client = distlock::LockClient::from_dyn(backend);
    let records = match client.list(&args.prefix, args.limit).await {
        Ok(r) => r,
        Err(e) => return fail(code_for(&e), e),
    };
    match print_list(&records, args.json) {
        Ok(()) => ExitCode::SUCCESS,
        Err(code) => code,
    }
}

/// Writes one line per hold (after a header, unless `json`).
fn print_list(records: &[distlock::HoldRecord], json: bool) -> Result<(), ExitCode> {
    if !json && !records.is_empty() {
        line(format!(
            "{:<32} {:<10} {:>20} {:>12}  HOLDER",
            "NAME", "KIND", "TOKEN", "REMAINING"
        ))?;
    }
    for r in records {
        let text = if json {
            serde_json::to_string(&RecordJson::of(r))
                .map_err(|e| fail(1, format!("cannot write a hold as JSON: {e}")))?
        } else {
            let dash = || "-".to_string();
            let mut holder = r.holder_info.clone().unwrap_or_else(dash);
            if let Some(value) = &r.value {
                holder = format!("{holder} (value {value:?})");
            }
            format!(
                "{:<32} {:<10} {:>20} {:>12}  {holder}",
                r.name,
                kind_word(&r.kind),
                r.token.map_or_else(dash, |t| t.to_string()),
                r.remaining.map_or_else(dash, |d| {
                    humantime::format_duration(std::time::Duration::from_millis(
                        d.as_millis() as u64
                    ))
                    .to_string()
                }),
            )
        };
        line(text)?;
    }
    Ok(())
}

fn kind_word(kind: &HoldKind) -> &'static str {
    match kind {
        HoldKind::Exclusive => "lock",
        HoldKind::Shared => "shared",
        HoldKind::Permits { .. } => "permit",
        HoldKind::Leader => "leader",
        _ => "other",
    }
}

/// One `list --json` line.
#[derive(serde::Serialize, Debug)]
struct RecordJson<'a> {
    name: &'a str,
    kind: &'static str,
    /// A permit's semaphore's stored limit.
    #[serde(skip_serializing_if = "Option::is_none")]
    limit: Option<u32>,
    token: Option<u64>,
    remaining_ms: Option<u128>,
    holder_info: Option<&'a str>,
    /// A leadership's value.
    #[serde(skip_serializing_if = "Option::is_none")]
    value: Option<&'a str>,
}

impl<'a> RecordJson<'a> {
    fn of(r: &'a distlock::HoldRecord) -> Self {
        Self {
            name: &r.name,
            kind: kind_word(&r.kind),
            limit: match r.kind {
                HoldKind::Permits { limit } if limit > 0 => Some(limit),
                _ => None,
            },
            token: r.token.map(|t| t.get()),
            remaining_ms: r.remaining.map(|d| d.as_millis()),
            holder_info: r.holder_info.as_deref(),
            value: r.value.as_deref(),
        }
    }
}

impl ListArgs {
    /// The backend URL, for the password options to fill in.
    pub(crate) fn backend_mut(&mut self) -> &mut String {
        &mut self.backend
    }
}

pub(crate) fn backends() -> ExitCode {
    match print_backends() {
        Ok(()) => ExitCode::SUCCESS,
        Err(code) => code,
    }
}

fn print_backends() -> Result<(), ExitCode> {
    line("URL                        FENCING      CAP  WAITING       EXPIRY CLOCK")?;
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
        line(format!(
            "{url:<26} {fencing:<12} {cap:<4} {waiting:<13} {:?}",
            c.clock
        ))?;
    }
    Ok(())
}

#[derive(clap::Args, Debug)]
pub(crate) struct SetLimitArgs {
    /// The semaphore's name.
    name: String,
    /// The new limit, 1 or more.
    #[arg(value_parser = clap::value_parser!(u32).range(1..))]
    limit: u32,
    /// Backend URL.
    #[arg(long, env = "DISTLOCK_BACKEND", hide_env_values = true, default_value_t = default_backend())]
    backend: String,
}

pub(crate) async fn set_limit(args: SetLimitArgs) -> ExitCode {
    let backend = match crate::connect(&args.backend).await {
        Ok(b) => b,
        Err(e) => return fail(code_for(&e), e),
    };
    let client = distlock::LockClient::from_dyn(backend);
    let old = match client.set_semaphore_limit(&args.name, args.limit).await {
        Ok(old) => old,
        Err(e) => return fail(code_for(&e), e),
    };
    let old = old.map_or_else(|| "none stored".to_string(), |l| l.to_string());
    match line(format!(
        "semaphore {}: limit {} (was {old})",
        args.name, args.limit
    )) {
        Ok(()) => ExitCode::SUCCESS,
        Err(code) => code,
    }
}

impl SetLimitArgs {
    /// The backend URL, for the password options to fill in.
    pub(crate) fn backend_mut(&mut self) -> &mut String {
        &mut self.backend
    }
}

impl StatusArgs {
    /// The backend URL, for the password options to fill in.
    pub(crate) fn backend_mut(&mut self) -> &mut String {
        &mut self.backend
    }
}

#[cfg(test)]
mod tests {
    use super::StatusJson;

    #[test]
    fn status_json_escapes_quotes_and_backslashes_and_keeps_its_keys() {
        let tricky = r#"a"b\c"#;
        let line = StatusJson {
            name: tricky,
            held: true,
            token: Some(7),
            remaining_ms: Some(1500),
            queue_len: None,
            holders: None,
            limit: None,
            shared: None,
            writer_waiting: None,
            holder_info: None,
        }
        .to_line()
        .unwrap();
        let parsed: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!(parsed["name"], tricky);
        assert_eq!(
            line,
            r#"{"name":"a\"b\\c","held":true,"token":7,"remaining_ms":1500,"queue_len":null}"#
        );
    }
}
