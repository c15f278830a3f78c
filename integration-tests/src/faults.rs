//! The fault suite's verdicts and its matrix.
//!
//! Each fault test runs [`distlock_check`]'s workload (worker processes, the
//! fenced register, the checker) against real servers while it injects one
//! fault, then calls [`verify`] with what theory predicts. A prediction of
//! "violations without fencing" that the run does not show fails the test:
//! the fault did not fire. Every row also goes into the matrix that
//! [`print_matrix`] prints at the end (and writes into
//! `docs/fault-matrix.md` when `DISTLOCK_FAULT_MATRIX_DOC` names it).

use std::sync::Mutex;
use std::time::Duration;

use distlock_check::Report;
use libtest_mimic::Failed;

/// What theory predicts for one backend under one fault.
#[derive(Clone, Copy, Debug, Default)]
pub struct Expect {
    /// The unfenced register shows stale writes or lost updates.
    pub violations_without_fencing: bool,
    /// Holders (as they saw themselves) overlap; `None`: depends on timing,
    /// not asserted.
    pub overlap: Option<bool>,
    /// The faulted holder's guard reports the loss before anyone else is
    /// granted the lock; `None`: not asserted.
    pub lost_before_regrant: Option<bool>,
    /// Another client is granted the lock while the faulted holder's lease
    /// still runs by the servers' rules (a double grant, not an expiry);
    /// `None`: not asserted.
    pub double_grant: Option<bool>,
}

/// One line of the matrix.
#[derive(Clone, Debug)]
pub struct Row {
    /// Backend.
    pub backend: String,
    /// Fault id and short description.
    pub fault: String,
    /// The report.
    pub report: Report,
    /// The lock's TTL in the run.
    pub ttl: Duration,
    /// What was predicted.
    pub expect: Expect,
}

static ROWS: Mutex<Vec<Row>> = Mutex::new(Vec::new());
static LATE: Mutex<Vec<(String, String, usize)>> = Mutex::new(Vec::new());

/// F8, checked on a run whose faulted holder lost its lock while another
/// client was granted it: the faulted holder's release arrives after the
/// expiry and the new grant; it must be refused, and no two other holders
/// may ever overlap (a release that freed the new holder's lock would let a
/// third client in beside it).
pub fn verify_late_release(backend: &str, report: &Report) -> Result<(), Failed> {
    let how = report.faulted_hold_end.clone().unwrap_or_default();
    let answer = how
        .split("late release ")
        .nth(1)
        .unwrap_or("not sent")
        .to_string();
    LATE.lock().unwrap_or_else(|p| p.into_inner()).push((
        backend.into(),
        answer.clone(),
        report.overlaps_without_faulted,
    ));
    if answer != "refused" {
        return Err(format!(
            "F8: the late release was {answer}, expected refused (hold ended: {how})"
        )
        .into());
    }
    if report.overlaps_without_faulted > 0 {
        return Err(format!(
            "F8: {} overlapping holds between other holders",
            report.overlaps_without_faulted
        )
        .into());
    }
    Ok(())
}

/// Checks `report` against `expect` and the invariants that hold for every
/// run (no stale write accepted by the fenced register, no lost update
/// there, tokens in grant order on strong backends); records the row.
pub fn verify(
    backend: &str,
    fault: &str,
    ttl: Duration,
    report: Report,
    expect: Expect,
) -> Result<(), Failed> {
    let mut problems = Vec::new();
    if report.fenced.stale_accepted > 0 || report.fenced.lost_updates > 0 {
        problems.push(format!(
            "the fenced register accepted {} stale operations and lost {} updates",
            report.fenced.stale_accepted, report.fenced.lost_updates
        ));
    }
    problems.extend(token_order_problem(&report));
    let shown = report.unfenced.violations() > 0;
    if shown != expect.violations_without_fencing {
        problems.push(if shown {
            format!(
                "without fencing the register shows {} stale operations and {} lost updates, where none were expected",
                report.unfenced.stale_accepted, report.unfenced.lost_updates
            )
        } else {
            "without fencing no violation showed: the fault did not fire".to_string()
        });
    }
    if let Some(want) = expect.overlap {
        if (report.overlaps > 0) != want {
            problems.push(format!(
                "{} overlapping holds, expected {}",
                report.overlaps,
                if want { "some" } else { "none" }
            ));
        }
    }
    if report.overlaps_without_faulted > 0 {
        problems.push(format!(
            "{} overlapping holds between healthy holders (a late release freed someone else's lock?)",
            report.overlaps_without_faulted
        ));
    }
    if let Some(want) = expect.lost_before_regrant {
        if report.lost_before_regrant != Some(want) {
            problems.push(format!(
                "the faulted holder saw the loss before the next grant: {:?}, expected {want}",
                report.lost_before_regrant
            ));
        }
    }
    if let Some(want) = expect.double_grant {
        if report.double_grant != Some(want) {
            problems.push(format!(
                "granted again while the faulted holder's lease ran: {:?}, expected {want} (recovery {:?}, TTL {ttl:?})",
                report.double_grant, report.recovery
            ));
        }
    }
    if report.recovery.is_none() {
        problems.push("no other client was granted the lock after the fault".into());
    }
    let row = Row {
        backend: backend.into(),
        fault: fault.into(),
        report,
        ttl,
        expect,
    };
    record(row, &problems)
}

/// The token order problem, if any: a token that did not rise, on a backend
/// that declares strong fencing.
fn token_order_problem(report: &Report) -> Option<String> {
    (report.fencing == "Strong" && report.token_order_violations > 0).then(|| {
        format!(
            "{} grants with a token that did not rise, on a backend that declares strong fencing",
            report.token_order_violations
        )
    })
}

/// Adds `row` to the matrix; fails with `problems` and the row's report if
/// there are any.
fn record(row: Row, problems: &[String]) -> Result<(), Failed> {
    let failure = (!problems.is_empty())
        .then(|| format!("{}\n\nreport:\n{}", problems.join("\n"), row.report));
    ROWS.lock().unwrap_or_else(|p| p.into_inner()).push(row);
    failure.map_or(Ok(()), |f| Err(f.into()))
}

/// Checks a semaphore run (`report.limit` permits) whose faulted holder was
/// paused past its TTL: the fenced register (the N highest tokens) accepted
/// no stale operation and never more writers at once than the limit; the
/// unfenced register shows the violation (a stale write, or more writers
/// than the limit); the holders themselves never counted more holds than
/// the limit, except for the paused one; tokens rose on strong backends.
pub fn verify_permits(
    backend: &str,
    fault: &str,
    ttl: Duration,
    report: Report,
) -> Result<(), Failed> {
    let mut problems = Vec::new();
    let limit = u64::from(report.limit);
    if report.limit < 2 {
        problems.push(format!("a semaphore run with a limit of {}", report.limit));
    }
    if report.fenced.stale_accepted > 0 || report.fenced.writers_over_limit > 0 {
        problems.push(format!(
            "the fenced register accepted {} stale operations and {} writers at once (limit {limit})",
            report.fenced.stale_accepted, report.fenced.most_writers
        ));
    }
    problems.extend(token_order_problem(&report));
    if report.unfenced.violations() == 0 {
        problems.push("without fencing no violation showed: the fault did not fire".into());
    }
    // The paused holder still believes it holds while the others do; the
    // others never outnumber the permits.
    if report.most_healthy_holders as u64 > limit {
        problems.push(format!(
            "{} holds at once besides the paused one, by the holders' own account, limit {limit}",
            report.most_healthy_holders
        ));
    }
    // Nor with the paused one while its lease still ran.
    if report.most_holders_in_lease as u64 > limit {
        problems.push(format!(
            "{} holds at once counting the paused one until its deadline, limit {limit}",
            report.most_holders_in_lease
        ));
    }
    if report.recovery.is_none() {
        problems.push("no other client was granted a permit after the fault".into());
    }
    let row = Row {
        backend: format!("{backend} (semaphore of {limit})"),
        fault: fault.into(),
        report,
        ttl,
        expect: Expect {
            violations_without_fencing: true,
            ..Expect::default()
        },
    };
    record(row, &problems)
}

/// The matrix as a Markdown table, rows sorted by fault then backend.
pub fn matrix() -> String {
    let mut rows = ROWS.lock().unwrap_or_else(|p| p.into_inner()).clone();
    rows.sort_by(|a, b| {
        (fault_order(&a.fault), &a.backend).cmp(&(fault_order(&b.fault), &b.backend))
    });
    let mut out = String::from(
        "| fault | backend | fencing | holds | overlapping holds | violations without fencing (stale / lost updates) | stale accepted with fencing | rejected by fencing | double grant | holder knew first | recovery |\n|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for r in rows {
        let p = &r.report;
        let knew = match p.lost_before_regrant {
            Some(true) => "yes",
            Some(false) => "no",
            None => "-",
        };
        let double = match p.double_grant {
            Some(true) => "yes",
            Some(false) => "no",
            None => "-",
        };
        out.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} / {} | {} | {} | {} | {} | {} |\n",
            r.fault,
            r.backend,
            p.fencing,
            p.holds,
            p.overlaps,
            p.unfenced.stale_accepted,
            p.unfenced.lost_updates,
            p.fenced.stale_accepted + p.fenced.lost_updates,
            p.fenced.rejected,
            double,
            knew,
            p.recovery.map_or("-".into(), |d| format!(
                "{:.1} s (TTL {} s)",
                d.as_secs_f64(),
                r.ttl.as_secs()
            )),
        ));
    }
    out
}

fn fault_order(f: &str) -> u32 {
    f.trim_start_matches('F')
        .split(|c: char| !c.is_ascii_digit())
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or(99)
}

const BEGIN: &str = "<!-- fault-matrix:begin -->";
const END: &str = "<!-- fault-matrix:end -->";

/// Prints the matrix; with `DISTLOCK_FAULT_MATRIX_DOC=path`, also replaces
/// the table between the markers in that file.
pub fn print_matrix() {
    let mut table = matrix();
    let mut late = LATE.lock().unwrap_or_else(|p| p.into_inner()).clone();
    late.sort();
    if !late.is_empty() {
        table.push_str("\nF8, a release that arrives after expiry and a new grant (checked in the F1 runs):\n\n| backend | the late release was | overlapping holds among the other clients |\n|---|---|---|\n");
        for (b, answer, overlaps) in late {
            table.push_str(&format!("| {b} | {answer} | {overlaps} |\n"));
        }
    }
    println!("\nfault matrix\n\n{table}");
    let Ok(path) = std::env::var("DISTLOCK_FAULT_MATRIX_DOC") else {
        return;
    };
    let Ok(doc) = std::fs::read_to_string(&path) else {
        eprintln!("DISTLOCK_FAULT_MATRIX_DOC={path}: cannot read it");
        return;
    };
    match (doc.find(BEGIN), doc.find(END)) {
        (Some(b), Some(e)) if b < e => {
            let updated = format!("{}{BEGIN}\n{table}{}", &doc[..b], &doc[e..]);
            if let Err(e) = std::fs::write(&path, updated) {
                eprintln!("{path}: {e}");
            }
        }
        _ => eprintln!("{path}: no {BEGIN} ... {END} markers"),
    }
}
