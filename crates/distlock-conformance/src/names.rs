//! Cases on names, for every kind the backend declares: names at the length
//! limit, names differing only in case or punctuation, longer names below a
//! name (also spelled like a backend's queue nodes), and `list` prefixes.
//! Each case collects every anomaly it sees and fails with all of them.

use std::time::Duration;

use distlock_core::{
    Capabilities, Error, HoldKind, HoldRecord, LockClient, LockGuard, MAX_NAME_LEN,
};
use libtest_mimic::{Completion, Failed};

use crate::cases::{client, LONG_TTL};
use crate::{BackendFactory, CaseResult};

cases![
    names_at_the_length_limit_for_every_kind,
    names_differing_in_case_or_punctuation_are_different,
    longer_names_below_a_name_for_every_kind,
    list_prefix_forms_list_the_same_holds,
    longer_names_shaped_like_queue_nodes_hold_back_nothing,
];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Lock,
    Shared,
    Sem(u32),
    Elect,
}

impl Kind {
    fn hold_kind(self) -> HoldKind {
        match self {
            Kind::Lock => HoldKind::Exclusive,
            Kind::Shared => HoldKind::Shared,
            Kind::Sem(limit) => HoldKind::Permits { limit },
            Kind::Elect => HoldKind::Leader,
        }
    }
}

enum Held {
    Guard(LockGuard),
    Lead(distlock_core::Leadership),
}

impl Held {
    async fn release(self) -> Result<bool, Error> {
        match self {
            Held::Guard(g) => g.release().await,
            Held::Lead(l) => l.resign().await,
        }
    }
}

fn kinds(caps: &Capabilities, limit: u32) -> Vec<Kind> {
    let mut k = vec![Kind::Lock];
    if caps.shared {
        k.push(Kind::Shared);
    }
    if caps.semaphore {
        k.push(Kind::Sem(limit));
    }
    if caps.elections {
        k.push(Kind::Elect);
    }
    k
}

async fn try_take(c: &LockClient, kind: Kind, name: &str) -> Result<Option<Held>, Error> {
    Ok(match kind {
        Kind::Lock => c
            .lock(name)
            .ttl(LONG_TTL)
            .try_acquire()
            .await?
            .map(Held::Guard),
        Kind::Shared => c
            .lock(name)
            .shared()
            .ttl(LONG_TTL)
            .try_acquire()
            .await?
            .map(Held::Guard),
        Kind::Sem(n) => c
            .semaphore(name, n)
            .ttl(LONG_TTL)
            .try_acquire()
            .await?
            .map(Held::Guard),
        Kind::Elect => c
            .election(name)
            .ttl(LONG_TTL)
            .try_campaign(format!("v-{name}"))
            .await?
            .map(Held::Lead),
    })
}

/// Waits at most `wait` for the hold.
async fn wait_take(c: &LockClient, kind: Kind, name: &str, wait: Duration) -> Result<Held, Error> {
    Ok(match kind {
        Kind::Lock => Held::Guard(c.lock(name).ttl(LONG_TTL).wait(wait).acquire().await?),
        Kind::Shared => Held::Guard(
            c.lock(name)
                .shared()
                .ttl(LONG_TTL)
                .wait(wait)
                .acquire()
                .await?,
        ),
        Kind::Sem(n) => Held::Guard(
            c.semaphore(name, n)
                .ttl(LONG_TTL)
                .wait(wait)
                .acquire()
                .await?,
        ),
        Kind::Elect => Held::Lead(
            c.election(name)
                .ttl(LONG_TTL)
                .wait(wait)
                .campaign(format!("v-{name}"))
                .await?,
        ),
    })
}

/// What a status read of `kind` on `name` says: is it held, and how many.
async fn status(c: &LockClient, kind: Kind, name: &str) -> Result<String, Error> {
    let n = distlock_core::LockName::new(name)?;
    Ok(match kind {
        Kind::Lock | Kind::Shared => match c.backend().inspect(&n).await {
            Ok(s) => format!("held={} shared={:?}", s.held, s.shared),
            Err(Error::Unsupported { .. }) => "unsupported".into(),
            Err(e) => return Err(e),
        },
        Kind::Sem(_) => match c.backend().inspect_permits(&n).await {
            Ok(s) => format!("held={} holders={:?}", s.held, s.holders),
            Err(Error::Unsupported { .. }) => "unsupported".into(),
            Err(e) => return Err(e),
        },
        Kind::Elect => match c.election(name).leader().await? {
            Some(l) => format!("leader={}", l.value),
            None => "leader=none".into(),
        },
    })
}

fn is_free_status(s: &str) -> bool {
    s == "unsupported" || s == "leader=none" || s.starts_with("held=false")
}

async fn listing(c: &LockClient, prefix: &str) -> Result<Option<Vec<HoldRecord>>, Error> {
    match c.list(prefix, 1000).await {
        Err(Error::Unsupported { .. }) => Ok(None),
        other => Ok(Some(other?)),
    }
}

fn short(records: &[HoldRecord]) -> Vec<String> {
    records
        .iter()
        .map(|r| format!("{}:{:?}", r.name, r.kind))
        .collect()
}

/// `r`'s value; an error goes to `bad` (with `what` it was asked of) and
/// gives `None`.
fn checked<T>(
    bad: &mut Vec<String>,
    what: impl FnOnce() -> String,
    r: Result<T, Error>,
) -> Option<T> {
    r.map_err(|e| bad.push(format!("{}: {e}", what()))).ok()
}

/// A release that must answer held; anything else goes to `bad`.
async fn released(bad: &mut Vec<String>, what: impl FnOnce() -> String, h: Held) {
    match h.release().await {
        Ok(true) => {}
        other => bad.push(format!("release of {}: {other:?}", what())),
    }
}

fn finish(backend: &str, bad: Vec<String>) -> CaseResult {
    if bad.is_empty() {
        Ok(Completion::Completed)
    } else {
        Err(Failed::from(format!(
            "{backend}: {} anomalies:\n  {}",
            bad.len(),
            bad.join("\n  ")
        )))
    }
}

/// Checks a single hold of `kind` on `n` end to end: granted, excludes a
/// second client (where the kind is exclusive), shown by status and list,
/// released.
async fn full_cycle(
    a: &LockClient,
    b: &LockClient,
    obs: &LockClient,
    kind: Kind,
    n: &str,
    bad: &mut Vec<String>,
) -> Result<(), Failed> {
    let h = match try_take(a, kind, n).await {
        Ok(Some(h)) => h,
        other => {
            bad.push(format!(
                "{kind:?} of {n} ({} bytes) not granted: {:?}",
                n.len(),
                other.err()
            ));
            return Ok(());
        }
    };
    if kind != Kind::Shared {
        match try_take(b, kind, n).await {
            Ok(None) => {}
            Ok(Some(h2)) => {
                bad.push(format!("{kind:?} of {n} ({} bytes) granted twice", n.len()));
                let _ = h2.release().await;
            }
            Err(e) => bad.push(format!("second {kind:?} of {n}: {e}")),
        }
    } else {
        match try_take(b, Kind::Lock, n).await {
            Ok(None) => {}
            Ok(Some(h2)) => {
                bad.push(format!("lock of {n} granted beside a shared hold"));
                let _ = h2.release().await;
            }
            Err(e) => bad.push(format!("lock beside shared of {n}: {e}")),
        }
    }
    match status(obs, kind, n).await {
        Ok(s) if !is_free_status(&s) || s == "unsupported" => {}
        Ok(s) => bad.push(format!(
            "held {kind:?} of {n} ({} bytes): status says {s}",
            n.len()
        )),
        Err(e) => bad.push(format!("status of held {kind:?} {n}: {e}")),
    }
    match listing(obs, n).await {
        Ok(Some(list)) => {
            let mine: Vec<_> = list
                .iter()
                .filter(|r| r.name == n && crate_same_kind(&r.kind, &kind.hold_kind()))
                .collect();
            if mine.len() != 1 {
                bad.push(format!(
                    "list({n}) ({} bytes) with one {kind:?} held shows {:?}",
                    n.len(),
                    short(&list)
                ));
            }
        }
        Ok(None) => {}
        Err(e) => bad.push(format!("list({n}) ({} bytes): {e}", n.len())),
    }
    match h.release().await {
        Ok(true) => {}
        other => bad.push(format!("release of {kind:?} {n}: {other:?}")),
    }
    match status(obs, kind, n).await {
        Ok(s) if is_free_status(&s) => {}
        Ok(s) => bad.push(format!("released {kind:?} of {n}: status says {s}")),
        Err(e) => bad.push(format!("status of released {kind:?} {n}: {e}")),
    }
    // A second client takes it now.
    match try_take(b, kind, n).await {
        Ok(Some(h)) => {
            let _ = h.release().await;
        }
        other => bad.push(format!(
            "{kind:?} of {n} refused after its release: {:?}",
            other.err()
        )),
    }
    Ok(())
}

fn crate_same_kind(listed: &HoldKind, held: &HoldKind) -> bool {
    match (listed, held) {
        (HoldKind::Permits { limit: l }, HoldKind::Permits { limit: h }) => *l == *h || *l == 0,
        (l, h) => l == h,
    }
}

/// names of exactly 200 bytes, one long segment and many short
/// segments, for every kind.
pub async fn names_at_the_length_limit_for_every_kind(
    f: &dyn BackendFactory,
    ns: String,
) -> CaseResult {
    let caps = f.client().await?.capabilities();
    let mut bad = Vec::new();
    let (a, b, obs) = (client(f).await?, client(f).await?, client(f).await?);
    let mut long = format!("{ns}/L");
    while long.len() < MAX_NAME_LEN {
        long.push('x');
    }
    let mut segs = format!("{ns}/M");
    while segs.len() + 2 <= MAX_NAME_LEN {
        segs.push_str("/a");
    }
    while segs.len() < MAX_NAME_LEN {
        segs.push('b');
    }
    let mut dots = format!("{ns}/D");
    while dots.len() + 3 <= MAX_NAME_LEN {
        dots.push_str("/.-");
    }
    while dots.len() < MAX_NAME_LEN {
        dots.push('c');
    }
    for n in [&long, &segs, &dots] {
        if n.len() != MAX_NAME_LEN || distlock_core::LockName::new(n).is_err() {
            return Err(format!(
                "the case made a bad name: {n} is {} bytes or invalid",
                n.len()
            )
            .into());
        }
    }
    for kind in kinds(&caps, 1) {
        for n in [&long, &segs, &dots] {
            full_cycle(&a, &b, &obs, kind, n, &mut bad).await?;
        }
    }
    // All kinds at once on the long names; the namespace listing shows each.
    let mut held = Vec::new();
    let mut expect = Vec::new();
    for (i, kind) in kinds(&caps, 1).into_iter().enumerate() {
        let base = if i % 2 == 0 { &long } else { &segs };
        // Each kind on a different 200-byte name so none interfere.
        let mut n = base[..MAX_NAME_LEN - 1].to_string();
        n.push(char::from(b'p' + i as u8));
        match try_take(&a, kind, &n).await {
            Ok(Some(h)) => {
                held.push(h);
                expect.push((n, kind));
            }
            other => bad.push(format!("{kind:?} {n}: {:?}", other.err())),
        }
    }
    if let Some(list) = listing(&obs, &format!("{ns}/")).await? {
        for (n, k) in &expect {
            if !list
                .iter()
                .any(|r| &r.name == n && crate_same_kind(&r.kind, &k.hold_kind()))
            {
                bad.push(format!("list({ns}/) misses {k:?} {n}: {:?}", short(&list)));
            }
        }
        if list.len() != expect.len() {
            bad.push(format!(
                "list({ns}/) shows {:?}, expected {expect:?}",
                short(&list)
            ));
        }
    }
    for h in held {
        let _ = h.release().await;
    }
    finish(caps.backend, bad)
}

/// names that differ only in case or in `.`/`-`/`_`/`:` are
/// different holds of every kind.
pub async fn names_differing_in_case_or_punctuation_are_different(
    f: &dyn BackendFactory,
    ns: String,
) -> CaseResult {
    let caps = f.client().await?.capabilities();
    let mut bad = Vec::new();
    let (a, b, obs) = (client(f).await?, client(f).await?, client(f).await?);
    let variants = [
        "job.x", "job-x", "job_x", "job:x", "Job.x", "JOB.X", "jobx", "job.x.", "job..x", "job/x",
        "job.X",
    ];
    for (ki, kind) in kinds(&caps, 1).into_iter().enumerate() {
        let mut held = Vec::new();
        for (vi, v) in variants.iter().enumerate() {
            let n = format!("{ns}/k{ki}/{v}");
            // Client a (or b, alternately) takes every variant; each must be
            // free whatever the others hold.
            let c = if vi % 2 == 0 { &a } else { &b };
            let kind = match kind {
                // A different limit per variant: the same stored semaphore
                // would answer LimitMismatch.
                Kind::Sem(_) => Kind::Sem(1 + vi as u32),
                k => k,
            };
            match try_take(c, kind, &n).await {
                Ok(Some(h)) => held.push((n, kind, h)),
                Ok(None) => bad.push(format!(
                    "{kind:?} {n} refused while only other spellings are held"
                )),
                Err(e) => bad.push(format!("{kind:?} {n}: error {e}")),
            }
        }
        // Each status reflects its own name.
        for (n, kind, _) in &held {
            if *kind == Kind::Elect {
                match obs.election(n).leader().await {
                    Ok(Some(l)) if l.value == format!("v-{n}") => {}
                    other => bad.push(format!("leader of {n} is {other:?}, not its own value")),
                }
            }
            if let Kind::Sem(limit) = kind {
                let s = obs
                    .backend()
                    .inspect_permits(&distlock_core::LockName::new(n)?)
                    .await;
                if let Some(s) = checked(&mut bad, || format!("inspect_permits({n})"), s) {
                    if s.holders != Some(1) || s.limit != Some(*limit) {
                        bad.push(format!("inspect_permits({n}) = {s:?}; 1 of {limit} held"));
                    }
                }
            }
        }
        if let Some(list) = listing(&obs, &format!("{ns}/k{ki}/")).await? {
            let mut names: Vec<_> = list.iter().map(|r| r.name.clone()).collect();
            names.sort();
            let mut want: Vec<_> = held.iter().map(|(n, _, _)| n.clone()).collect();
            want.sort();
            if names != want {
                bad.push(format!("list({ns}/k{ki}/) shows {names:?}, held {want:?}"));
            }
            // A prefix in one case lists only that case.
            let p = format!("{ns}/k{ki}/job");
            let lower = listing(&obs, &p).await?.unwrap_or_default();
            let wrong: Vec<_> = lower.iter().filter(|r| !r.name.starts_with(&p)).collect();
            if !wrong.is_empty() {
                bad.push(format!(
                    "list({p}) shows names not starting with it: {:?}",
                    short(&lower)
                ));
            }
        }
        // Release one spelling: the others stay held.
        let mut it = held.into_iter();
        if let Some((n0, k0, h0)) = it.next() {
            released(&mut bad, || format!("{k0:?} {n0}"), h0).await;
            for (n, k, h) in it {
                let ok = match &h {
                    Held::Guard(g) => g.is_held(),
                    Held::Lead(l) => l.is_held(),
                };
                if !ok {
                    bad.push(format!("{k:?} {n} lost when {k0:?} {n0} was released"));
                }
                match h.release().await {
                    Ok(true) => {}
                    other => bad.push(format!("release of {k:?} {n}: {other:?}")),
                }
            }
        }
    }
    finish(caps.backend, bad)
}

/// `x`, `x/y`, `x/y/z` are independent for every kind (locks are
/// covered by `a_name_and_the_longer_names_below_it_are_independent`).
pub async fn longer_names_below_a_name_for_every_kind(
    f: &dyn BackendFactory,
    ns: String,
) -> CaseResult {
    let caps = f.client().await?.capabilities();
    let mut bad = Vec::new();
    let (a, b, c, obs) = (
        client(f).await?,
        client(f).await?,
        client(f).await?,
        client(f).await?,
    );
    for (ki, kind) in kinds(&caps, 1).into_iter().enumerate() {
        for order in ["below-first", "top-first"] {
            let x = format!("{ns}/{ki}{order}/x");
            let (y, z) = (format!("{x}/y"), format!("{x}/y/z"));
            let names: Vec<&String> = if order == "below-first" {
                vec![&y, &z, &x]
            } else {
                vec![&x, &y, &z]
            };
            let mut held = Vec::new();
            for n in &names {
                match try_take(&a, kind, n).await {
                    Ok(Some(h)) => held.push(((*n).clone(), h)),
                    Ok(None) => bad.push(format!(
                        "{kind:?} {n} refused while {:?} held ({order})",
                        held.iter().map(|(n, _)| n.clone()).collect::<Vec<_>>()
                    )),
                    Err(e) => bad.push(format!("{kind:?} {n}: {e}")),
                }
            }
            // Exclusive kinds: b is refused each name.
            if kind != Kind::Shared {
                for (n, _) in &held {
                    let second = try_take(&b, kind, n).await;
                    let what = || format!("{kind:?} {n} by a second client ({order})");
                    if let Some(Some(h)) = checked(&mut bad, what, second) {
                        bad.push(format!("{kind:?} {n} granted twice ({order})"));
                        let _ = h.release().await;
                    }
                }
            }
            // Statuses of each name report exactly one hold.
            for (n, _) in &held {
                match status(&obs, kind, n).await {
                    Ok(s) => {
                        let ok = match kind {
                            Kind::Elect => s == format!("leader=v-{n}"),
                            Kind::Sem(_) => s == "held=true holders=Some(1)" || s == "unsupported",
                            Kind::Shared => {
                                s.starts_with("held=true")
                                    && !s.contains("Some(2)")
                                    && !s.contains("Some(3)")
                            }
                            Kind::Lock => s.starts_with("held=true"),
                        };
                        if !ok {
                            bad.push(format!("status of {kind:?} {n} ({order}) says {s}"));
                        }
                    }
                    Err(e) => bad.push(format!("status of {kind:?} {n}: {e}")),
                }
            }
            if let Some(list) = listing(&obs, &x).await? {
                let mut got: Vec<_> = list.iter().map(|r| r.name.clone()).collect();
                got.sort();
                let mut want: Vec<_> = held.iter().map(|(n, _)| n.clone()).collect();
                want.sort();
                if got != want {
                    bad.push(format!(
                        "list({x}) ({kind:?}, {order}) shows {:?}, held {want:?}",
                        short(&list)
                    ));
                }
            }
            // Hand-over of x while the longer names stay held: c waits on x,
            // a releases x.
            let xi = held.iter().position(|(n, _)| *n == x);
            if let Some(xi) = xi {
                let (_, hx) = held.remove(xi);
                let waiter = {
                    let c = c.clone();
                    let x = x.clone();
                    tokio::spawn(
                        async move { wait_take(&c, kind, &x, Duration::from_secs(10)).await },
                    )
                };
                tokio::time::sleep(Duration::from_millis(300)).await;
                released(&mut bad, || format!("{kind:?} {x}"), hx).await;
                match waiter.await {
                    Ok(Ok(h)) => {
                        let _ = h.release().await;
                    }
                    other => bad.push(format!(
                        "waiter on {kind:?} {x} after its release ({order}): {:?}",
                        other.map(|r| r.err())
                    )),
                }
                for (n, h) in &held {
                    let ok = match h {
                        Held::Guard(g) => g.is_held(),
                        Held::Lead(l) => l.is_held(),
                    };
                    if !ok {
                        bad.push(format!("{kind:?} {n} lost when {x} changed hands"));
                    }
                }
            }
            for (n, h) in held {
                match h.release().await {
                    Ok(true) => {}
                    other => bad.push(format!("release of {kind:?} {n}: {other:?}")),
                }
            }
            if let Some(list) = listing(&obs, &x).await? {
                if !list.is_empty() {
                    bad.push(format!("list({x}) after all released: {:?}", short(&list)));
                }
            }
        }
    }
    finish(caps.backend, bad)
}

/// `list` with a prefix that cuts a segment, ends in `/`, equals
/// a name, or names nothing lists exactly the holds whose names start with
/// it.
pub async fn list_prefix_forms_list_the_same_holds(
    f: &dyn BackendFactory,
    ns: String,
) -> CaseResult {
    let caps = f.client().await?.capabilities();
    let mut bad = Vec::new();
    let (a, b, obs) = (client(f).await?, client(f).await?, client(f).await?);
    if listing(&obs, &format!("{ns}/")).await?.is_none() {
        return Ok(Completion::ignored_with("cannot list"));
    }
    let mut plan: Vec<(String, Kind)> = vec![
        ("jobs/a".into(), Kind::Lock),
        ("jobs/ab".into(), Kind::Lock),
        ("jobs/a/b".into(), Kind::Lock),
        ("jobsx".into(), Kind::Lock),
        ("jobs".into(), Kind::Lock),
        ("job".into(), Kind::Lock),
        ("jobs.a".into(), Kind::Lock),
        ("jobs-a".into(), Kind::Lock),
        ("jobs:a".into(), Kind::Lock),
        ("jobs0".into(), Kind::Lock),
        ("jobs/z".into(), Kind::Lock),
    ];
    if caps.shared {
        plan.push(("jobs/r".into(), Kind::Shared));
        plan.push(("jobs/a/r".into(), Kind::Shared));
        plan.push(("jobsr".into(), Kind::Shared));
    }
    if caps.semaphore {
        plan.push(("jobs/s".into(), Kind::Sem(3)));
        plan.push(("jobs/a/s".into(), Kind::Sem(3)));
        plan.push(("jobss".into(), Kind::Sem(3)));
    }
    if caps.elections {
        plan.push(("jobs/e".into(), Kind::Elect));
        plan.push(("jobs/a/e".into(), Kind::Elect));
        plan.push(("jobse".into(), Kind::Elect));
        plan.push(("jo".into(), Kind::Elect));
    }
    let mut held = Vec::new();
    for (i, (n, k)) in plan.iter().enumerate() {
        let full = format!("{ns}/{n}");
        let c = if i % 2 == 0 { &a } else { &b };
        match try_take(c, *k, &full).await {
            Ok(Some(h)) => held.push((full, *k, h)),
            other => bad.push(format!("{k:?} {full} not granted: {:?}", other.err())),
        }
    }
    let prefixes = [
        "",
        "j",
        "jo",
        "job",
        "jobs",
        "jobs/",
        "jobs/a",
        "jobs/a/",
        "jobs/ab",
        "jobs.",
        "jobs/a/b",
        "jobs/e",
        "jobs/s",
        "jobs/r",
        "jobsx",
        "nothing",
        "jobs/q",
        "jobs/a/bc",
    ];
    for p in prefixes {
        let full = format!("{ns}/{p}");
        let mut want: Vec<String> = held
            .iter()
            .filter(|(n, _, _)| n.starts_with(&full))
            .map(|(n, k, _)| format!("{n}:{:?}", k.hold_kind()))
            .collect();
        want.sort();
        match listing(&obs, &full).await {
            Ok(Some(list)) => {
                let mut got: Vec<String> = list
                    .iter()
                    .map(|r| {
                        let k = match r.kind {
                            HoldKind::Permits { .. } => HoldKind::Permits { limit: 3 },
                            k => k,
                        };
                        format!("{}:{:?}", r.name, k)
                    })
                    .collect();
                let sorted = list.windows(2).all(|w| w[0].name <= w[1].name);
                got.sort();
                if got != want {
                    let missing: Vec<_> = want.iter().filter(|w| !got.contains(w)).collect();
                    let extra: Vec<_> = got.iter().filter(|g| !want.contains(g)).collect();
                    bad.push(format!(
                        "list({full:?}): missing {missing:?}, extra {extra:?}"
                    ));
                }
                if !sorted {
                    bad.push(format!(
                        "list({full:?}) not in name order: {:?}",
                        short(&list)
                    ));
                }
            }
            Ok(None) => {}
            Err(e) => bad.push(format!("list({full:?}): {e}")),
        }
    }
    // The namespace without its slash.
    let list = listing(&obs, &ns).await;
    if let Some(Some(list)) = checked(&mut bad, || format!("list({ns})"), list) {
        if list.len() != held.len() {
            bad.push(format!(
                "list({ns}) shows {} holds, {} held",
                list.len(),
                held.len()
            ));
        }
    }
    for (n, k, h) in held {
        match h.release().await {
            Ok(true) => {}
            other => bad.push(format!("release of {k:?} {n}: {other:?}")),
        }
    }
    finish(caps.backend, bad)
}

/// A longer name whose last segment is spelled like a queue node of a
/// backend's layout (ZooKeeper's `lock-<seq>`, `__READ__<seq>`,
/// `__WRIT__<seq>`, `latch-<seq>`; only Curator's protected
/// `_c_<uuid>-lock-<seq>` form is refused there) is still only a longer
/// name: held, it keeps nobody from the shorter one.
pub async fn longer_names_shaped_like_queue_nodes_hold_back_nothing(
    f: &dyn BackendFactory,
    ns: String,
) -> CaseResult {
    let caps = f.client().await?.capabilities();
    let mut bad = Vec::new();
    let (a, b) = (client(f).await?, client(f).await?);
    let segments = [
        "lock-0000000000",
        "__READ__0000000000",
        "__WRIT__0000000000",
        "latch-0000000000",
    ];
    for (si, seg) in segments.iter().enumerate() {
        for (ki, below_kind) in kinds(&caps, 1).into_iter().enumerate() {
            let x = format!("{ns}/q{si}{ki}");
            let below = format!("{x}/{seg}");
            let hb = match try_take(&a, below_kind, &below).await {
                Ok(Some(h)) => Some(h),
                other => {
                    bad.push(format!(
                        "{below_kind:?} {below} not granted: {:?}",
                        other.err()
                    ));
                    None
                }
            };
            for kind in kinds(&caps, 1) {
                match try_take(&b, kind, &x).await {
                    Ok(Some(h)) => {
                        let _ = h.release().await;
                    }
                    Ok(None) => bad.push(format!(
                        "{kind:?} {x} refused while {below_kind:?} {below} is held"
                    )),
                    Err(e) => bad.push(format!("{kind:?} {x} beside {below}: {e}")),
                }
                let s = status(&b, kind, &x).await;
                if let Some(s) = checked(&mut bad, || format!("{kind:?} status of {x}"), s) {
                    if !is_free_status(&s) {
                        bad.push(format!(
                            "{kind:?} status of {x} says {s} while only {below_kind:?} {below} is held"
                        ));
                    }
                }
            }
            if let Some(h) = hb {
                released(&mut bad, || format!("{below_kind:?} {below}"), h).await;
            }
            // Released: still nothing in the way.
            for kind in kinds(&caps, 1) {
                match try_take(&b, kind, &x).await {
                    Ok(Some(h)) => {
                        let _ = h.release().await;
                    }
                    Ok(None) => bad.push(format!(
                        "{kind:?} {x} refused after {below_kind:?} {below} was released"
                    )),
                    Err(e) => bad.push(format!("{kind:?} {x} after {below}: {e}")),
                }
            }
        }
    }
    let list = listing(&b, &format!("{ns}/")).await;
    if let Some(Some(list)) = checked(&mut bad, || format!("list({ns}/)"), list) {
        if !list.is_empty() {
            bad.push(format!(
                "after everything was released list shows {:?}",
                short(&list)
            ));
        }
    }
    finish(caps.backend, bad)
}
