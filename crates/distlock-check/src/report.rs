//! The checker: turns a run's [`Log`] into a [`Report`].

use std::collections::HashMap;
use std::fmt;
use std::time::Duration;

use crate::register::{Hold, Log};

/// How much later than the next grant a faulted holder's loss may be
/// logged and still count as seen first. The loss is due at the holder's
/// local deadline, about 1 % of the TTL before the server's expiry; the
/// time logged is when the holder's process woke to it, which on a loaded
/// machine can be tens of milliseconds later than the next holder's.
const WOKEN_LATE_NS: u64 = 100_000_000;

/// What one cell of the register went through.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CellStats {
    /// Writes the cell accepted.
    pub accepted_writes: u64,
    /// Reads and writes the cell rejected (always 0 for the unfenced cell).
    pub rejected: u64,
    /// Accepted operations that were stale: by a grant older than another
    /// grant whose operation the cell had already accepted (for a semaphore
    /// of N: once N grants that began after this holder's own deadline had
    /// been accepted). A stale write is exactly a write by a holder that has
    /// been superseded.
    pub stale_accepted: u64,
    /// The cell's final value.
    pub final_value: u64,
    /// Accepted increments that did not survive (`accepted_writes -
    /// final_value`): another holder's read-modify-write overwrote them.
    /// Not counted for a semaphore, whose N holders' read-modify-writes
    /// overlap by design.
    pub lost_updates: u64,
    /// The most read-modify-writes the cell accepted at once (from a grant's
    /// accepted read to its accepted write).
    pub most_writers: u64,
    /// How far `most_writers` went past the limit (1 for a lock).
    pub writers_over_limit: u64,
}

impl CellStats {
    /// Stale operations, lost updates and writers past the limit.
    pub fn violations(&self) -> u64 {
        self.stale_accepted + self.lost_updates + self.writers_over_limit
    }
}

/// The checker's verdict on one run.
#[derive(Clone, Debug, Default)]
pub struct Report {
    /// The fencing the workers' backend declared (`Strong`, `BestEffort`, `None`).
    pub fencing: String,
    /// Worker processes.
    pub clients: usize,
    /// How many may hold at once: 1 for the lock, N for a semaphore.
    pub limit: u32,
    /// The most holds (as the holders saw them) at once.
    pub most_holders: usize,
    /// The most holds at once besides the faulted hold.
    pub most_healthy_holders: usize,
    /// The most holds at once, the faulted hold counted until its deadline
    /// (while the server still held its lease): never more than the limit
    /// on a backend that keeps its promise through a paused holder.
    pub most_holders_in_lease: usize,
    /// Acquisitions.
    pub holds: usize,
    /// Pairs of holds by different workers whose intervals (acquire returned →
    /// `lost()` or release called) overlap.
    pub overlaps: usize,
    /// Overlapping pairs that do not involve the faulted hold (the faulted
    /// worker's hold that ran when the fault began): two healthy holders at
    /// once (for example a late release that freed someone else's lock, or
    /// the faulted worker's next hold granted beside another).
    pub overlaps_without_faulted: usize,
    /// Overlapping pairs of the faulted hold and another, the other granted
    /// before the faulted hold's deadline (while the server still held its
    /// lease): a pause alone never causes one; a server that lost the lease
    /// (a restart, a failover, a clock jump) or ends leases early does.
    pub overlaps_in_faulted_lease: usize,
    /// The fenced cell.
    pub fenced: CellStats,
    /// The unfenced cell.
    pub unfenced: CellStats,
    /// Successive grants (in acquire order) whose token did not rise. For a
    /// semaphore, whose grants overlap and return to their clients in any
    /// order: grants whose token is not above that of every hold granted
    /// (answered to its holder) before the grant was asked for, and grants
    /// whose token another grant had.
    pub token_order_violations: usize,
    /// From the fault's start to the next grant to another worker.
    pub recovery: Option<Duration>,
    /// Whether the faulted holder's guard reported the loss before any other
    /// worker was granted the lock, give or take 100 ms of a worker process
    /// woken late (`None` if no hold was faulted).
    pub lost_before_regrant: Option<bool>,
    /// Whether the next grant to another worker came while the faulted
    /// holder's lease was certainly still running: before it released and
    /// before its guard's local deadline (which is conservative, so earlier
    /// than the servers' expiry). A double grant by the servers, as opposed
    /// to an expiry.
    pub double_grant: Option<bool>,
    /// How the faulted hold ended.
    pub faulted_hold_end: Option<String>,
    /// Acquire errors workers reported (unreachable backend and the like).
    pub errors: usize,
}

impl Report {
    /// Whether the run broke a guarantee that must hold with fencing on:
    /// stale writes or lost updates in the fenced cell, or (for strong
    /// fencing) tokens out of grant order.
    pub fn fencing_failed(&self) -> bool {
        self.fenced.violations() > 0
            || (self.fencing == "Strong" && self.token_order_violations > 0)
    }

    /// Whether the lock itself broke its promise where a paused holder
    /// (the fault `distlock check` injects) does not excuse it: two holders
    /// at once of which neither is the paused hold, or one granted beside
    /// it before its deadline (a lock), or more holders at once than the
    /// limit, the paused one counted until its deadline (a semaphore).
    pub fn lock_failed(&self) -> bool {
        if self.limit > 1 {
            self.most_healthy_holders.max(self.most_holders_in_lease) > self.limit as usize
        } else {
            self.overlaps_without_faulted + self.overlaps_in_faulted_lease > 0
        }
    }

    /// Whether the verdict is unsafe: fencing failed, the lock failed where
    /// the pause does not excuse it ([`Report::lock_failed`]), or a backend
    /// without fencing tokens let the lock's violations through.
    pub fn is_unsafe(&self) -> bool {
        self.fencing_failed()
            || self.lock_failed()
            || (self.fencing == "None" && self.unfenced.violations() > 0)
    }
}

fn cell(log: &Log, fenced: bool) -> CellStats {
    let limit = log.limit.max(1) as usize;
    let start_of = |g: u64| log.holds.get(&g).map_or(0, |h| h.start);
    let deadline_of = |g: u64| log.holds.get(&g).map_or(u64::MAX, |h| h.deadline);
    let mut stats = CellStats::default();
    // A lock: the start of the newest grant the cell accepted, and of the
    // newest writer's (exclusive) grant. A writer is superseded by any newer
    // grant; a shared holder only by a newer writer.
    let mut newest = 0u64;
    let mut newest_writer = 0u64;
    // A semaphore: the starts of every grant the cell accepted, ascending.
    // Its grants overlap and return to their clients in any order, so
    // "newer" cannot be read off the starts of two live holds; a grant is
    // superseded once `limit` grants that began after its holder's own
    // deadline have been accepted.
    let mut accepted_starts: Vec<u64> = Vec::new();
    let mut seen = std::collections::HashSet::new();
    // Each grant's accepted read, and its read-modify-write once its write
    // was accepted too.
    let mut read_at: HashMap<u64, u64> = HashMap::new();
    let mut rmws: Vec<(u64, u64)> = Vec::new();
    for op in &log.ops {
        let accepted = if fenced { op.fenced_ok } else { Some(true) };
        match accepted {
            None => continue,
            Some(false) => stats.rejected += 1,
            Some(true) => {
                let start = start_of(op.grant);
                if limit == 1 {
                    let newer = if op.shared { newest_writer } else { newest };
                    if newer > start {
                        stats.stale_accepted += 1;
                    }
                    newest = newest.max(start);
                    if !op.shared {
                        newest_writer = newest_writer.max(start);
                    }
                } else {
                    let deadline = deadline_of(op.grant);
                    let after =
                        accepted_starts.len() - accepted_starts.partition_point(|s| *s <= deadline);
                    if after >= limit {
                        stats.stale_accepted += 1;
                    }
                    if seen.insert(op.grant) {
                        let at = accepted_starts.partition_point(|s| *s < start);
                        accepted_starts.insert(at, start);
                    }
                }
                if op.write {
                    stats.accepted_writes += 1;
                    if let Some(r) = read_at.remove(&op.grant) {
                        rmws.push((r, op.t));
                    }
                } else if !op.shared {
                    read_at.insert(op.grant, op.t);
                }
            }
        }
    }
    stats.final_value = if fenced {
        log.fenced_value
    } else {
        log.unfenced_value
    };
    if limit == 1 {
        stats.lost_updates = stats.accepted_writes.saturating_sub(stats.final_value);
    }
    stats.most_writers = most_at_once(&rmws) as u64;
    stats.writers_over_limit = stats.most_writers.saturating_sub(limit as u64);
    stats
}

/// Holds whose token is not above the token of every hold its holder saw
/// granted before their acquire was called (a grant's reply can reach its
/// client after a later grant's: only a request sent after a grant was
/// answered must get a higher token, and it must, whether that hold has
/// ended or still runs beside it).
fn tokens_below_an_earlier_grant(holds: &[&Hold]) -> usize {
    let mut granted: Vec<(u64, u64)> = holds.iter().map(|h| (h.start, h.token)).collect();
    granted.sort_unstable();
    let mut by_ask: Vec<&Hold> = holds.to_vec();
    by_ask.sort_by_key(|h| h.asked);
    let (mut next, mut highest, mut violations) = (0, None, 0);
    for h in by_ask {
        while next < granted.len() && granted[next].0 < h.asked {
            highest = highest.max(Some(granted[next].1));
            next += 1;
        }
        if highest.is_some_and(|t| h.token <= t) {
            violations += 1;
        }
    }
    violations
}

/// The most of `intervals` (start, end) that overlap at one instant.
fn most_at_once(intervals: &[(u64, u64)]) -> usize {
    let mut edges: Vec<(u64, i32)> = intervals
        .iter()
        .flat_map(|&(s, e)| [(s, 1), (e, -1)])
        .collect();
    // An end before a start at the same instant: touching is not overlapping.
    edges.sort_unstable();
    let (mut now, mut most) = (0i32, 0i32);
    for (_, d) in edges {
        now += d;
        most = most.max(now);
    }
    most.max(0) as usize
}

/// Checks a run's log. `faulted` is the worker a fault was aimed at, and
/// `fault_at` when it started.
pub fn check(log: &Log) -> Report {
    let mut holds: Vec<&Hold> = log.holds.values().collect();
    holds.sort_by_key(|h| h.start);
    let end = |h: &Hold| h.end.unwrap_or(log.end.max(h.start));
    let fault = log
        .events
        .iter()
        .find(|(_, _, label)| label == "fault")
        .map(|(t, w, _)| (*t, *w));
    // The faulted worker's hold that was running when the fault began.
    let faulted_hold = fault.and_then(|(t, w)| {
        holds
            .iter()
            .rev()
            .find(|h| Some(h.worker) == w && h.start <= t && h.end.is_none_or(|e| e >= t))
            .copied()
    });
    let faulted_grant = faulted_hold.map(|h| h.grant);
    // The fault excuses the faulted hold only from its deadline on (the
    // holder's own, conservative, idea of when its lease ends, as it last
    // reported it before the pause, renewals included): before it the server still held the lease for it, so a grant
    // beside it is the backend's fault, not the pause's.
    let healthy_end = |h: &Hold| {
        if Some(h.grant) == faulted_grant {
            end(h).min(h.deadline)
        } else {
            end(h)
        }
    };

    let (mut overlaps, mut without, mut in_lease) = (0, 0, 0);
    for (i, a) in holds.iter().enumerate() {
        for b in &holds[i + 1..] {
            if b.start >= end(a) {
                break;
            }
            // Shared holds overlap each other by design.
            if a.worker != b.worker && !(a.shared && b.shared) {
                overlaps += 1;
                if Some(a.grant) != faulted_grant && Some(b.grant) != faulted_grant {
                    without += 1;
                } else if b.start < healthy_end(a).min(healthy_end(b)) {
                    in_lease += 1;
                }
            }
        }
    }
    let intervals: Vec<(u64, u64)> = holds.iter().map(|h| (h.start, end(h))).collect();
    let most_holders = most_at_once(&intervals);
    let healthy: Vec<(u64, u64)> = holds
        .iter()
        .filter(|h| Some(h.grant) != faulted_grant)
        .map(|h| (h.start, end(h)))
        .collect();
    let most_healthy_holders = most_at_once(&healthy);
    let leased: Vec<(u64, u64)> = holds
        .iter()
        .map(|h| (h.start, healthy_end(h)))
        .filter(|(start, end)| start < end)
        .collect();
    let most_holders_in_lease = most_at_once(&leased);
    // Concurrent grants (permits, shared holds) return to their clients in
    // any order: each must be above every grant answered before it was
    // asked for.
    // Nor may two grants share a token, however they overlap.
    let token_order_violations = if log.limit > 1 || holds.iter().any(|h| h.shared) {
        let mut tokens = std::collections::HashSet::new();
        let repeated = holds.iter().filter(|h| !tokens.insert(h.token)).count();
        tokens_below_an_earlier_grant(&holds) + repeated
    } else {
        holds
            .windows(2)
            .filter(|w| w[1].token <= w[0].token)
            .count()
    };

    let mut recovery = None;
    let mut lost_before_regrant = None;
    let mut faulted_hold_end = None;
    let mut double_grant = None;
    // Another grant while the faulted holder still holds is a semaphore's
    // normal work, not a double grant: those two verdicts are the lock's.
    let single = log.limit <= 1;
    if let Some((t, w)) = fault {
        // Beside a faulted shared hold, only a writer's grant replaces it.
        let reader = faulted_hold.is_some_and(|h| h.shared);
        let next = holds
            .iter()
            .find(|h| h.start >= t && Some(h.worker) != w && !(reader && h.shared))
            .map(|h| h.start);
        recovery = next.map(|n| Duration::from_nanos(n - t));
        if let Some(h) = faulted_hold {
            faulted_hold_end = Some(h.how.clone());
            if let Some(n) = next.filter(|_| single) {
                let lease_end = h.deadline;
                // Released, or asked to be: a release whose answer did
                // not settle it (a Redlock release that reached too few
                // nodes) still ended the hold there, and freed the nodes
                // it reached.
                let released = h.how.starts_with("release");
                let before_release = !released || h.end.is_none_or(|e| n < e);
                double_grant = Some(n < lease_end && before_release);
            }
            lost_before_regrant = single.then_some(match (h.end, next) {
                (Some(e), Some(n)) => {
                    h.how.starts_with("lost") && e <= n.saturating_add(WOKEN_LATE_NS)
                }
                (Some(_), None) => h.how.starts_with("lost"),
                (None, _) => false,
            });
        }
    }

    Report {
        fencing: log
            .workers
            .values()
            .next()
            .map(|(_, f)| f.clone())
            .unwrap_or_default(),
        clients: log.workers.len(),
        limit: log.limit.max(1),
        most_holders,
        most_healthy_holders,
        most_holders_in_lease,
        overlaps_in_faulted_lease: in_lease,
        holds: holds.len(),
        overlaps,
        overlaps_without_faulted: without,
        fenced: cell(log, true),
        unfenced: cell(log, false),
        token_order_violations,
        recovery,
        lost_before_regrant,
        double_grant,
        faulted_hold_end,
        errors: log.errors.len(),
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ms = |d: Option<Duration>| d.map_or("-".into(), |d| format!("{} ms", d.as_millis()));
        writeln!(
            f,
            "clients: {}   holds: {}   acquire errors: {}   declared fencing: {}",
            self.clients, self.holds, self.errors, self.fencing
        )?;
        if self.limit > 1 {
            writeln!(
                f,
                "semaphore of {} permits: at most {} holds at once (as the holders saw them), {} besides the faulted holder, {} counting it until its deadline",
                self.limit, self.most_holders, self.most_healthy_holders, self.most_holders_in_lease
            )?;
        } else {
            writeln!(
                f,
                "overlapping holds (as the holders saw them): {} ({} not involving the faulted holder, {} beside it before its deadline)",
                self.overlaps, self.overlaps_without_faulted, self.overlaps_in_faulted_lease
            )?;
        }
        if self.limit > 1 {
            writeln!(
                f,
                "token order: {} (grants whose token was not above every grant answered before it was asked for, plus tokens given twice)",
                self.token_order_violations
            )?;
        } else {
            writeln!(
                f,
                "token order: {} successive grants whose token did not rise",
                self.token_order_violations
            )?;
        }
        for (name, c) in [
            ("fenced register  ", &self.fenced),
            ("unfenced register", &self.unfenced),
        ] {
            writeln!(
                f,
                "{name}: {} writes accepted, {} rejected, {} stale accepted, {} lost updates, {} writers at once (final value {})",
                c.accepted_writes, c.rejected, c.stale_accepted, c.lost_updates, c.most_writers, c.final_value
            )?;
        }
        if let Some(end) = &self.faulted_hold_end {
            writeln!(f, "faulted hold ended: {end}")?;
            writeln!(
                f,
                "holder saw the loss before the next grant: {}",
                self.lost_before_regrant
                    .map_or("-", |b| if b { "yes" } else { "no" })
            )?;
        }
        writeln!(
            f,
            "recovery (fault → next grant to another client): {}",
            ms(self.recovery)
        )?;
        write!(
            f,
            "verdict: {}",
            if self.fencing_failed() {
                "UNSAFE: the fenced register accepted stale or lost writes, or more writers than the limit"
            } else if self.lock_failed() && self.faulted_hold_end.is_some() {
                "UNSAFE: more holders at once than the limit while every lease still ran (the pause excuses the paused holder only past its deadline)"
            } else if self.lock_failed() {
                "UNSAFE: more holders at once than the limit while every lease still ran"
            } else if self.fencing == "None" && self.unfenced.violations() > 0 {
                "UNSAFE without fencing: the lock alone let stale or lost writes through, and the backend declares no fencing tokens to catch them (the fenced register, refusing repeated tokens, is not judged)"
            } else if self.fencing == "None" {
                "no violations by the lock; the backend declares no fencing tokens, so the fenced register is not judged"
            } else if self.unfenced.violations() > 0 {
                "fencing caught what the lock alone let through"
            } else {
                "no violations"
            }
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::register::Op;

    fn hold(worker: usize, grant: u64, token: u64, start: u64, end: u64) -> Hold {
        Hold {
            worker,
            grant,
            token,
            shared: false,
            asked: start,
            start,
            deadline: start + 30,
            end: Some(end),
            how: "released".into(),
        }
    }

    /// A faulted holder that logs its loss up to 100 ms after the next
    /// grant (its process woken late) saw it first; later, it did not.
    #[test]
    fn a_loss_logged_late_by_a_woken_process_still_counts_as_first() {
        let ms = 1_000_000u64;
        for (logged, first) in [(50 * ms, true), (140 * ms, true), (200 * ms, false)] {
            let mut log = Log::default();
            let mut a = hold(0, 1, 1, 0, logged);
            a.how = "lost: deadline".into();
            log.holds.insert(1, a);
            log.holds.insert(2, hold(1, 2, 2, 60 * ms, 70 * ms));
            log.events.push((10, Some(0), "fault".into()));
            assert_eq!(check(&log).lost_before_regrant, Some(first), "{logged}");
        }
    }

    fn op(t: u64, grant: u64, token: u64, write: bool, fenced_ok: Option<bool>) -> Op {
        Op {
            t,
            grant,
            token,
            write,
            shared: false,
            fenced_ok,
        }
    }

    #[test]
    fn a_clean_run_has_no_violations() {
        let mut log = Log::default();
        for (i, g) in [(0u64, 1u64), (1, 2), (2, 3)] {
            log.holds
                .insert(g, hold(i as usize % 2, g, g, i * 10, i * 10 + 5));
            log.ops.push(op(i * 10 + 1, g, g, false, Some(true)));
            log.ops.push(op(i * 10 + 2, g, g, true, Some(true)));
        }
        log.fenced_value = 3;
        log.unfenced_value = 3;
        let r = check(&log);
        assert_eq!((r.overlaps, r.token_order_violations), (0, 0));
        assert_eq!(r.fenced.violations() + r.unfenced.violations(), 0);
        assert_eq!(r.unfenced.accepted_writes, 3);
    }

    #[test]
    fn a_paused_holder_shows_overlap_a_stale_write_and_a_lost_update() {
        let mut log = Log::default();
        // Worker 0 holds from 0, reads, is paused; worker 1 is granted at 50
        // and increments; worker 0 resumes at 100 and writes its stale value.
        let mut a = hold(0, 1, 1, 0, 200_000_000);
        a.how = "lost: deadline".into();
        log.holds.insert(1, a);
        log.holds.insert(2, hold(1, 2, 2, 50, 60));
        log.events.push((10, Some(0), "fault".into()));
        log.ops.push(op(1, 1, 1, false, Some(true)));
        log.ops.push(op(51, 2, 2, false, Some(true)));
        log.ops.push(op(52, 2, 2, true, Some(true)));
        log.ops.push(op(100, 1, 1, true, Some(false)));
        log.fenced_value = 1;
        log.unfenced_value = 1;
        let r = check(&log);
        assert_eq!(r.overlaps, 1);
        assert_eq!(r.overlaps_without_faulted, 0);
        assert_eq!(
            (
                r.fenced.stale_accepted,
                r.fenced.lost_updates,
                r.fenced.rejected
            ),
            (0, 0, 1)
        );
        assert_eq!((r.unfenced.stale_accepted, r.unfenced.lost_updates), (1, 1));
        assert_eq!(r.recovery, Some(Duration::from_nanos(40)));
        assert_eq!(r.lost_before_regrant, Some(false));
        assert_eq!(
            r.double_grant,
            Some(false),
            "granted after the holder's deadline"
        );
        assert!(!r.fencing_failed());
    }

    /// Only the faulted hold may overlap others: the faulted worker's next
    /// hold, granted beside another worker's, is two healthy holders at
    /// once.
    #[test]
    fn the_faulted_workers_next_hold_beside_another_counts_as_healthy_overlap() {
        let mut log = Log::default();
        let mut a = hold(0, 1, 1, 0, 101);
        a.how = "lost: deadline".into();
        log.holds.insert(1, a);
        log.holds.insert(2, hold(1, 2, 2, 50, 130));
        log.holds.insert(3, hold(0, 3, 3, 110, 120));
        log.events.push((10, Some(0), "fault".into()));
        let r = check(&log);
        assert_eq!(r.overlaps, 2);
        assert_eq!(r.overlaps_without_faulted, 1);
        assert!(r.lock_failed() && r.is_unsafe());
        assert!(r.to_string().contains("UNSAFE"), "{r}");
    }

    /// A hold whose release failed (too few nodes answered) ended when
    /// its holder asked: a grant after that is no double grant, one before
    /// it is.
    #[test]
    fn a_hold_whose_release_failed_ends_when_its_holder_asked() {
        let mut log = Log::default();
        let mut a = hold(0, 1, 1, 0, 20);
        a.how = "release failed: quorum not reached".into();
        log.holds.insert(1, a.clone());
        log.holds.insert(2, hold(1, 2, 2, 25, 28));
        log.events.push((10, Some(0), "fault".into()));
        assert_eq!(check(&log).double_grant, Some(false));
        log.holds.insert(2, hold(1, 2, 2, 15, 28));
        assert_eq!(check(&log).double_grant, Some(true));
    }

    /// A grant beside the paused holder before its deadline is the
    /// backend's fault, not the pause's: a lease ended early.
    #[test]
    fn a_grant_beside_the_faulted_hold_before_its_deadline_is_not_excused() {
        let mut log = Log::default();
        let mut a = hold(0, 1, 1, 0, 101);
        a.how = "lost: deadline".into();
        log.holds.insert(1, a);
        log.holds.insert(2, hold(1, 2, 2, 15, 25));
        log.events.push((10, Some(0), "fault".into()));
        let r = check(&log);
        assert_eq!((r.overlaps, r.overlaps_without_faulted), (1, 0));
        assert_eq!(r.overlaps_in_faulted_lease, 1);
        assert!(r.lock_failed() && r.is_unsafe(), "{r}");
        // The same for a third permit of two, beside the paused holder.
        let mut log = Log {
            limit: 2,
            ..Log::default()
        };
        let mut paused = hold(0, 1, 1, 0, 200);
        paused.how = "lost: deadline".into();
        log.holds.insert(1, paused);
        log.holds.insert(2, hold(1, 2, 2, 12, 150));
        log.holds.insert(3, hold(2, 3, 3, 14, 150));
        log.events.push((10, Some(0), "fault".into()));
        let r = check(&log);
        assert_eq!((r.most_healthy_holders, r.most_holders_in_lease), (2, 3));
        assert!(r.lock_failed() && r.is_unsafe(), "{r}");
    }

    /// A permit asked for after another was granted gets a higher token,
    /// whether that one has ended or still runs.
    #[test]
    fn a_permit_below_one_granted_before_it_was_asked_is_out_of_order() {
        let mut log = Log {
            limit: 2,
            ..Log::default()
        };
        log.holds.insert(1, hold(0, 1, 10, 0, 100));
        let mut later = hold(1, 2, 9, 20, 60);
        later.asked = 15;
        log.holds.insert(2, later);
        assert_eq!(check(&log).token_order_violations, 1);
        // Asked for before the first was answered: either order is fine.
        let mut log = Log {
            limit: 2,
            ..Log::default()
        };
        let mut first = hold(0, 1, 10, 5, 100);
        first.asked = 0;
        log.holds.insert(1, first);
        let mut second = hold(1, 2, 9, 20, 60);
        second.asked = 3;
        log.holds.insert(2, second);
        assert_eq!(check(&log).token_order_violations, 0);
    }

    /// A semaphore's healthy holders never outnumber its permits; the
    /// paused holder beside them is excused past its deadline.
    #[test]
    fn a_semaphore_with_more_healthy_holders_than_permits_failed() {
        let mut log = Log {
            limit: 2,
            ..Log::default()
        };
        let mut paused = hold(0, 1, 1, 0, 200);
        paused.how = "lost: deadline".into();
        log.holds.insert(1, paused);
        log.holds.insert(2, hold(1, 2, 2, 50, 150));
        log.holds.insert(3, hold(2, 3, 3, 60, 150));
        log.events.push((10, Some(0), "fault".into()));
        let r = check(&log);
        assert_eq!((r.most_holders, r.most_healthy_holders), (3, 2));
        assert!(!r.lock_failed());
        log.holds.insert(4, hold(3, 4, 4, 70, 150));
        let r = check(&log);
        assert_eq!(r.most_healthy_holders, 3);
        assert!(r.lock_failed() && r.is_unsafe());
    }

    #[test]
    fn a_semaphore_run_counts_writers_at_once_against_its_limit() {
        let mut log = Log {
            limit: 2,
            ..Log::default()
        };
        // Grants 1 and 2 hold together; 1 is paused between its read and
        // its write while 3 and 4 are granted; its late write is the third
        // writer at once in the unfenced cell, and rejected by the fenced one.
        for (g, start) in [(1u64, 0u64), (2, 1), (3, 40), (4, 41)] {
            log.holds
                .insert(g, hold(g as usize, g, g, start, start + 20));
        }
        log.ops.push(op(2, 1, 1, false, Some(true)));
        log.ops.push(op(3, 2, 2, false, Some(true)));
        log.ops.push(op(10, 2, 2, true, Some(true)));
        log.ops.push(op(42, 3, 3, false, Some(true)));
        log.ops.push(op(43, 4, 4, false, Some(true)));
        log.ops.push(op(50, 1, 1, true, Some(false)));
        log.ops.push(op(51, 3, 3, true, Some(true)));
        log.ops.push(op(52, 4, 4, true, Some(true)));
        let r = check(&log);
        assert_eq!((r.limit, r.most_holders), (2, 2));
        assert_eq!(r.fenced.most_writers, 2);
        assert_eq!(
            (r.fenced.stale_accepted, r.fenced.writers_over_limit),
            (0, 0)
        );
        assert_eq!(r.fenced.lost_updates, 0, "not counted for a semaphore");
        assert_eq!(r.unfenced.most_writers, 3);
        assert_eq!(r.unfenced.writers_over_limit, 1);
        assert_eq!(r.unfenced.stale_accepted, 1, "grant 1 wrote after 3 and 4");
        assert!(!r.fencing_failed());
        assert!(r.unfenced.violations() > 0);
        assert_eq!(r.token_order_violations, 0);
    }

    #[test]
    fn a_semaphore_grant_that_returns_first_with_the_higher_token_is_in_order() {
        let mut log = Log {
            limit: 2,
            ..Log::default()
        };
        log.workers.insert(0, (1, "Strong".into()));
        // 6 returns to its client before 5 does, both asked for before
        // either was answered, so either order is fine. 4 was asked for
        // after 6 and 7 were granted: that is out of order.
        let mut first = hold(0, 1, 6, 2, 10);
        first.asked = 0;
        log.holds.insert(1, first);
        let mut second = hold(1, 2, 5, 3, 12);
        second.asked = 1;
        log.holds.insert(2, second);
        log.holds.insert(3, hold(0, 3, 7, 11, 20));
        log.holds.insert(4, hold(1, 4, 4, 13, 20));
        let r = check(&log);
        assert_eq!(r.token_order_violations, 1);
        assert!(r.fencing_failed());
    }

    #[test]
    fn a_paused_reader_overlapping_a_writer_shows_a_stale_read_only_unfenced() {
        let mut log = Log::default();
        log.workers.insert(0, (1, "Strong".into()));
        // Readers 1 and 2 overlap (fine); reader 1 is paused, writer 3 is
        // granted after its lease and writes; reader 1's late read is
        // stale: accepted by the unfenced cell, refused by the fenced one.
        let mut a = hold(0, 1, 1, 0, 101);
        a.shared = true;
        a.how = "lost: deadline".into();
        let mut b = hold(1, 2, 2, 5, 20);
        b.shared = true;
        log.holds.insert(1, a);
        log.holds.insert(2, b);
        log.holds.insert(3, hold(2, 3, 3, 50, 60));
        log.events.push((10, Some(0), "fault".into()));
        let read = |t, g, tok, ok| Op {
            shared: true,
            ..op(t, g, tok, false, Some(ok))
        };
        log.ops.push(read(1, 1, 1, true));
        log.ops.push(read(6, 2, 2, true));
        log.ops.push(read(15, 2, 2, true));
        log.ops.push(op(51, 3, 3, false, Some(true)));
        log.ops.push(op(52, 3, 3, true, Some(true)));
        log.ops.push(read(100, 1, 1, false));
        log.fenced_value = 1;
        log.unfenced_value = 1;
        let mut unfenced = log.clone();
        if let Some(last) = unfenced.ops.last_mut() {
            last.fenced_ok = Some(true);
        }
        let r = check(&log);
        assert_eq!(r.overlaps, 1, "only the writer beside the paused reader");
        assert_eq!((r.fenced.stale_accepted, r.fenced.rejected), (0, 1));
        assert_eq!(r.unfenced.stale_accepted, 1);
        assert_eq!(r.recovery, Some(Duration::from_nanos(40)), "to the writer");
        assert_eq!(r.token_order_violations, 0);
        assert!(!r.fencing_failed());
        // Had the fenced cell accepted the late read, it would be stale.
        assert_eq!(check(&unfenced).fenced.stale_accepted, 1);
    }

    #[test]
    fn a_backend_without_fencing_gets_no_credit_for_it() {
        // The paused holder of the test above, on a backend whose tokens
        // are all 0.
        let mut log = Log::default();
        log.holds.insert(1, hold(0, 1, 0, 0, 101));
        log.holds.insert(2, hold(1, 2, 0, 50, 60));
        log.events.push((10, Some(0), "fault".into()));
        log.workers.insert(0, (1, "None".into()));
        log.ops.push(op(1, 1, 0, false, Some(true)));
        log.ops.push(op(51, 2, 0, false, Some(false)));
        log.ops.push(op(52, 2, 0, true, Some(false)));
        log.ops.push(op(100, 1, 0, true, Some(true)));
        log.fenced_value = 1;
        log.unfenced_value = 1;
        let r = check(&log);
        assert_eq!(r.unfenced.stale_accepted, 1, "{r:?}");
        let text = r.to_string();
        assert!(!text.contains("fencing caught"), "{text}");
        assert!(text.contains("UNSAFE without fencing"), "{text}");
        assert!(r.is_unsafe() && !r.lock_failed());
    }

    /// Two permits granted with one token, overlapping, so that no ended
    /// hold's token is above either: still a violation.
    #[test]
    fn overlapping_permits_with_one_token_are_counted() {
        let mut log = Log {
            limit: 2,
            ..Log::default()
        };
        log.holds.insert(1, hold(0, 1, 5, 0, 50));
        log.holds.insert(2, hold(1, 2, 7, 10, 60));
        // Asked for before the other 7 was answered.
        let mut again = hold(2, 3, 7, 20, 70);
        again.asked = 5;
        log.holds.insert(3, again);
        log.workers.insert(0, (1, "Strong".into()));
        let r = check(&log);
        assert_eq!(r.token_order_violations, 1);
        assert!(r.fencing_failed());
    }

    #[test]
    fn tokens_that_do_not_rise_are_counted() {
        let mut log = Log::default();
        log.holds.insert(1, hold(0, 1, 7, 0, 5));
        log.holds.insert(2, hold(1, 2, 7, 10, 15));
        log.holds.insert(3, hold(0, 3, 3, 20, 25));
        log.workers.insert(0, (1, "Strong".into()));
        let r = check(&log);
        assert_eq!(r.token_order_violations, 2);
        assert!(r.fencing_failed());
    }
}
