//! Proof that the suite can fail: cases run against deliberately broken
//! backends must report failure.

use std::sync::Arc;
use std::time::Duration;

use distlock_core::{
    async_trait, AllAtOnce, Backend, Capabilities, DynBackend, FencingToken, Grant, HoldKind,
    HoldRecord, Leader, LeaderStream, LockName, LockRequest, LockStatus, MemoryBackend,
    Result as LockResult,
};
use libtest_mimic::{Failed, Trial};

use crate::{cases, namespace, BackendFactory, CaseFn};

#[derive(Clone, Copy, Debug)]
enum Flaw {
    /// Grants every request, held or not.
    GrantsEveryone,
    /// Frees the lock whoever asks.
    ReleasesAnyOwner,
    /// Hands out the same token every time.
    RepeatsTokens,
    /// Answers a batched renewal with "extended" for every lock in it.
    BatchExtendsAll,
    /// Answers every renewal "extended" and extends nothing.
    ExtendsNothing,
    /// Keeps every lock two seconds past its TTL, as a session longer than
    /// the TTL asked for would.
    OutlivesTtl,
    /// Ends every hold at half its TTL: before the holder's own deadline.
    ExpiresEarly,
    /// Grants one permit more than a semaphore's limit.
    GrantsOneMorePermit,
    /// Grants a multi-lock's names at once even when some are held.
    GrantsHeldNamesTogether,
    /// Serves an exclusive request as a shared one: a writer beside readers.
    WritersShare,
    /// Waits by polling one-shot attempts, which never mark a waiting
    /// writer: readers keep coming in ahead of it (`inspect` still says
    /// that a writer waits).
    ReaderPreferring,
    /// Writes a proclaimed value whoever leads, even after leadership ended.
    ProclaimsWithoutLeading,
    /// Keeps reporting the last leader after its leadership ended.
    ReportsEndedLeaders,
    /// Stores no holder info with a hold.
    ForgetsHolderInfo,
    /// Keeps listing every hold it has listed once, released or not.
    ListsEndedHolds,
    /// Serves a name in lower case: names differing in case are one hold.
    FoldsCase,
    /// Serves a name of more than two segments as its first two: a longer
    /// name is the shorter one's hold.
    CutsLongerNames,
}

/// The request as the flawed backend passes it on.
fn as_served(req: &LockRequest, flaw: Flaw) -> LockRequest {
    match (flaw, req.kind) {
        (Flaw::GrantsOneMorePermit, HoldKind::Permits { limit }) => {
            let mut served = req.clone();
            served.kind = HoldKind::Permits { limit: limit + 1 };
            served
        }
        (Flaw::WritersShare, HoldKind::Exclusive) => {
            let mut served = req.clone();
            served.kind = HoldKind::Shared;
            served
        }
        (Flaw::ForgetsHolderInfo, _) => req.clone().with_holder_info(None),
        (Flaw::FoldsCase | Flaw::CutsLongerNames, _) => {
            let mut served = req.clone();
            served.name = served_name(&req.name, flaw);
            served
        }
        _ => req.clone(),
    }
}

/// The name as the flawed backend keeps it.
fn served_name(name: &LockName, flaw: Flaw) -> LockName {
    let served = match flaw {
        Flaw::FoldsCase => name.as_str().to_lowercase(),
        Flaw::CutsLongerNames => name
            .as_str()
            .splitn(3, '/')
            .take(2)
            .collect::<Vec<_>>()
            .join("/"),
        _ => return name.clone(),
    };
    LockName::new(served).unwrap_or_else(|_| name.clone())
}

#[derive(Debug)]
struct Broken {
    inner: MemoryBackend,
    flaw: Flaw,
    /// The last leader `leader` saw, or a value proclaimed without leading.
    last_leader: std::sync::Mutex<Option<Leader>>,
    /// Every hold `list` has reported.
    listed: std::sync::Mutex<Vec<HoldRecord>>,
    /// Every permit granted through any client of the factory, for
    /// [`Flaw::ReleasesAnyOwner`].
    permits: Arc<std::sync::Mutex<Vec<LockRequest>>>,
    /// Exclusive waits under way through any client of the factory, for
    /// [`Flaw::ReaderPreferring`]'s `inspect`.
    writers: Arc<std::sync::atomic::AtomicUsize>,
}

/// Counts an exclusive wait while it lasts.
struct Waiting(Arc<std::sync::atomic::AtomicUsize>);

impl Waiting {
    fn new(n: &Arc<std::sync::atomic::AtomicUsize>) -> Self {
        n.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Self(n.clone())
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        self.0.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    }
}

impl Broken {
    fn permits(&self) -> std::sync::MutexGuard<'_, Vec<LockRequest>> {
        self.permits
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

#[async_trait]
impl Backend for Broken {
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }
    async fn try_acquire(&self, req: &LockRequest) -> LockResult<Option<Grant>> {
        match self.flaw {
            Flaw::GrantsEveryone => {
                let began = tokio::time::Instant::now();
                let _ = self.inner.try_acquire(req).await?;
                Ok(Some(Grant::new(FencingToken(1), began)))
            }
            Flaw::RepeatsTokens => Ok(self
                .inner
                .try_acquire(req)
                .await?
                .map(|g| Grant::new(FencingToken(1), g.began))),
            Flaw::OutlivesTtl => {
                let outliving = req.with_ttl(req.ttl + Duration::from_secs(2));
                self.inner.try_acquire(&outliving).await
            }
            Flaw::ExpiresEarly => {
                let early = req.with_ttl(req.ttl / 2);
                self.inner.try_acquire(&early).await
            }
            Flaw::ReleasesAnyOwner if matches!(req.kind, HoldKind::Permits { .. }) => {
                let grant = self.inner.try_acquire(req).await?;
                if grant.is_some() {
                    self.permits().push(req.clone());
                }
                Ok(grant)
            }
            _ => self.inner.try_acquire(&as_served(req, self.flaw)).await,
        }
    }
    async fn try_acquire_all(&self, reqs: &[LockRequest]) -> LockResult<AllAtOnce> {
        match self.flaw {
            Flaw::GrantsHeldNamesTogether => {
                let began = tokio::time::Instant::now();
                let mut grants = Vec::new();
                for req in reqs {
                    let _ = self.inner.try_acquire(req).await?;
                    grants.push(Grant::new(FencingToken(1), began));
                }
                Ok(AllAtOnce::Granted(grants))
            }
            _ => self.inner.try_acquire_all(reqs).await,
        }
    }
    async fn extend(&self, req: &LockRequest) -> LockResult<bool> {
        if matches!(self.flaw, Flaw::ExtendsNothing) {
            return Ok(true);
        }
        self.inner.extend(&as_served(req, self.flaw)).await
    }
    async fn extend_many(&self, reqs: &[LockRequest]) -> LockResult<Vec<bool>> {
        if matches!(self.flaw, Flaw::ExtendsNothing) {
            return Ok(vec![true; reqs.len()]);
        }
        let answers = self.inner.extend_many(reqs).await?;
        Ok(match self.flaw {
            Flaw::BatchExtendsAll => vec![true; answers.len()],
            _ => answers,
        })
    }
    async fn release(&self, req: &LockRequest) -> LockResult<bool> {
        match self.flaw {
            // A permit's release frees the first live permit of the name,
            // whoever holds it.
            Flaw::ReleasesAnyOwner if matches!(req.kind, HoldKind::Permits { .. }) => {
                let granted: Vec<LockRequest> = self
                    .permits()
                    .iter()
                    .filter(|p| p.name == req.name)
                    .cloned()
                    .collect();
                for p in granted {
                    if self.inner.release(&p).await? {
                        return Ok(true);
                    }
                }
                Ok(false)
            }
            Flaw::ReleasesAnyOwner => Ok(self.inner.evict(&req.name)),
            _ => self.inner.release(&as_served(req, self.flaw)).await,
        }
    }
    async fn acquire(
        &self,
        req: &LockRequest,
        deadline: Option<tokio::time::Instant>,
    ) -> LockResult<Grant> {
        match self.flaw {
            Flaw::ReaderPreferring => {
                let _waiting =
                    (req.kind == HoldKind::Exclusive).then(|| Waiting::new(&self.writers));
                let backoff = distlock_core::wait::Backoff::default();
                distlock_core::wait::acquire_by_polling(self, req, deadline, backoff).await
            }
            Flaw::WritersShare => {
                self.inner
                    .acquire(&as_served(req, self.flaw), deadline)
                    .await
            }
            // The other flaws are in one-shot attempts: wait through them.
            _ => {
                let backoff = distlock_core::wait::Backoff::default();
                distlock_core::wait::acquire_by_polling(self, req, deadline, backoff).await
            }
        }
    }
    async fn inspect(&self, name: &LockName) -> LockResult<LockStatus> {
        let mut status = self.inner.inspect(&served_name(name, self.flaw)).await?;
        if matches!(self.flaw, Flaw::ReaderPreferring)
            && self.writers.load(std::sync::atomic::Ordering::SeqCst) > 0
        {
            status.writer_waiting = Some(true);
        }
        Ok(status)
    }
    async fn inspect_permits(&self, name: &LockName) -> LockResult<LockStatus> {
        self.inner
            .inspect_permits(&served_name(name, self.flaw))
            .await
    }
    async fn set_limit(&self, name: &LockName, limit: u32) -> LockResult<Option<u32>> {
        self.inner.set_limit(name, limit).await
    }
    async fn proclaim(&self, req: &LockRequest, value: &str) -> LockResult<bool> {
        match self.flaw {
            Flaw::ProclaimsWithoutLeading => {
                let _ = self.inner.proclaim(req, value).await?;
                *self
                    .last_leader
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner) =
                    Some(Leader::new(value, FencingToken(0)));
                Ok(true)
            }
            _ => self.inner.proclaim(req, value).await,
        }
    }
    async fn leader(&self, name: &LockName) -> LockResult<Option<Leader>> {
        let now = self.inner.leader(name).await?;
        let mut last = self
            .last_leader
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        Ok(match self.flaw {
            Flaw::ReportsEndedLeaders if now.is_none() => last.clone(),
            Flaw::ProclaimsWithoutLeading if last.is_some() => last.take(),
            _ => {
                if now.is_some() {
                    *last = now.clone();
                }
                now
            }
        })
    }
    async fn observe_leader(&self, name: &LockName) -> LockResult<Option<LeaderStream>> {
        self.inner.observe_leader(name).await
    }
    async fn list(&self, prefix: &str, limit: usize) -> LockResult<Vec<HoldRecord>> {
        let now = self.inner.list(prefix, limit).await?;
        if !matches!(self.flaw, Flaw::ListsEndedHolds) {
            return Ok(now);
        }
        let mut seen = self
            .listed
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for r in now {
            if !seen
                .iter()
                .any(|s| s.name == r.name && s.kind == r.kind && s.token == r.token)
            {
                seen.push(r);
            }
        }
        let mut all: Vec<HoldRecord> = seen
            .iter()
            .filter(|r| r.name.starts_with(prefix))
            .cloned()
            .collect();
        distlock_core::sort_records(&mut all, limit);
        Ok(all)
    }
}

struct BrokenFactory {
    store: MemoryBackend,
    flaw: Flaw,
    permits: Arc<std::sync::Mutex<Vec<LockRequest>>>,
    writers: Arc<std::sync::atomic::AtomicUsize>,
}

#[async_trait]
impl BackendFactory for BrokenFactory {
    fn name(&self) -> &'static str {
        "broken"
    }
    async fn client(&self) -> distlock_core::Result<DynBackend> {
        Ok(Arc::new(Broken {
            inner: self.store.clone(),
            flaw: self.flaw,
            last_leader: std::sync::Mutex::new(None),
            listed: std::sync::Mutex::new(Vec::new()),
            permits: self.permits.clone(),
            writers: self.writers.clone(),
        }))
    }
    async fn evict(&self, name: &LockName) -> Result<(), Failed> {
        self.store.evict(name);
        Ok(())
    }
    fn short_ttl(&self) -> Duration {
        Duration::from_millis(200)
    }
}

fn case(name: &str) -> Option<CaseFn> {
    cases::ALL
        .iter()
        .chain(crate::semaphore::ALL)
        .chain(crate::multi::ALL)
        .chain(crate::rwlock::ALL)
        .chain(crate::election::ALL)
        .chain(crate::holder::ALL)
        .chain(crate::names::ALL)
        .find(|(n, _)| *n == name)
        .map(|(_, f)| *f)
}

/// `memory::suite_catches_*` trials: each runs one case on a broken backend
/// and passes only if the case fails, with a message that names the flaw's
/// effect.
pub fn trials(rt: &tokio::runtime::Runtime) -> Vec<Trial> {
    [
        (
            "overlapping_holds",
            Flaw::GrantsEveryone,
            "mutual_exclusion_under_contention",
            "overlapping holds",
        ),
        (
            "granting_a_held_lock",
            Flaw::GrantsEveryone,
            "try_acquire_on_held_lock_returns_none",
            "another client got a held lock",
        ),
        (
            "foreign_release",
            Flaw::ReleasesAnyOwner,
            "stale_or_foreign_release_does_not_free_holder",
            "stale release claimed to free",
        ),
        (
            "repeated_tokens",
            Flaw::RepeatsTokens,
            "tokens_increase_across_holders",
            "tokens not strictly increasing",
        ),
        (
            "a_lock_outliving_its_ttl",
            Flaw::OutlivesTtl,
            "vanished_holder_is_replaced_within_ttl_plus_one_second",
            "more than a second past",
        ),
        (
            "a_lock_ending_before_its_holders_deadline",
            Flaw::ExpiresEarly,
            "vanished_holder_is_replaced_within_ttl_plus_one_second",
            "before its holder's deadline",
        ),
        (
            "a_permit_ending_before_its_holders_deadline",
            Flaw::ExpiresEarly,
            "crashed_permit_holder_returns_its_permit_after_its_ttl",
            "before its holder's deadline",
        ),
        (
            "a_shared_hold_ending_before_its_holders_deadline",
            Flaw::ExpiresEarly,
            "crashed_reader_stops_blocking_a_writer_after_its_ttl",
            "before its holder's deadline",
        ),
        (
            "a_shared_hold_outliving_its_ttl",
            Flaw::OutlivesTtl,
            "crashed_reader_stops_blocking_a_writer_after_its_ttl",
            "more than a second past",
        ),
        (
            "a_leadership_ending_before_its_holders_deadline",
            Flaw::ExpiresEarly,
            "a_vanished_leader_is_replaced_after_its_ttl",
            "before its holder's deadline",
        ),
        (
            "repeated_permit_tokens",
            Flaw::RepeatsTokens,
            "permit_tokens_strictly_rise",
            "got token",
        ),
        (
            "a_permit_outliving_its_ttl",
            Flaw::OutlivesTtl,
            "crashed_permit_holder_returns_its_permit_after_its_ttl",
            "more than a second past",
        ),
        (
            "a_foreign_permit_release",
            Flaw::ReleasesAnyOwner,
            "release_of_an_expired_or_foreign_permit_frees_nothing",
            "reported it held",
        ),
        (
            "a_leadership_outliving_its_ttl",
            Flaw::OutlivesTtl,
            "a_vanished_leader_is_replaced_after_its_ttl",
            "more than a second past",
        ),
        (
            "a_semaphore_granting_one_permit_too_many",
            Flaw::GrantsOneMorePermit,
            "semaphore_never_has_more_than_its_limit_and_fills_it",
            "holders of a 3-permit semaphore at once",
        ),
        (
            "a_multi_lock_granted_over_a_held_name",
            Flaw::GrantsHeldNamesTogether,
            "multi_lock_is_all_or_nothing",
            "granted with one of its names held elsewhere",
        ),
        (
            "a_writer_beside_readers",
            Flaw::WritersShare,
            "shared_holds_overlap_and_exclude_the_exclusive_hold",
            "exclusive hold was granted beside",
        ),
        (
            "a_writer_beside_readers_under_contention",
            Flaw::WritersShare,
            "readers_overlap_and_writers_exclude_everyone_under_contention",
            "a writer was inside with someone else",
        ),
        (
            "readers_let_in_ahead_of_a_waiting_writer",
            Flaw::ReaderPreferring,
            "a_waiting_writer_holds_back_new_readers",
            "a new reader was let in ahead of a waiting writer",
        ),
        (
            "a_writer_starved_by_readers",
            Flaw::ReaderPreferring,
            "a_writer_is_not_starved_by_a_stream_of_readers",
            "the writer was starved",
        ),
        (
            "two_leaders_at_once",
            Flaw::GrantsEveryone,
            "one_leader_at_a_time_among_many_campaigners",
            "leaderships overlapped",
        ),
        (
            "a_proclamation_without_leadership",
            Flaw::ProclaimsWithoutLeading,
            "an_evicted_leader_sees_lost_and_cannot_proclaim",
            "accepted a proclamation from an evicted leader",
        ),
        (
            "an_ended_leader_still_reported",
            Flaw::ReportsEndedLeaders,
            "resign_hands_over_and_proclaim_changes_the_value",
            "a leader is reported after the last one resigned",
        ),
        (
            "a_hold_without_its_holder_info",
            Flaw::ForgetsHolderInfo,
            "holder_info_round_trips",
            "reports holder info None",
        ),
        (
            "released_holds_still_listed",
            Flaw::ListsEndedHolds,
            "list_shows_what_is_held_and_nothing_released",
            "after releases, list shows",
        ),
        (
            "names_differing_only_in_case_held_as_one",
            Flaw::FoldsCase,
            "names_differing_in_case_or_punctuation_are_different",
            "refused while only other spellings are held",
        ),
        (
            "a_longer_name_held_as_the_shorter_one",
            Flaw::CutsLongerNames,
            "longer_names_below_a_name_for_every_kind",
            "refused while",
        ),
        (
            "an_extend_that_extends_nothing",
            Flaw::ExtendsNothing,
            "extend_keeps_lock_past_original_ttl",
            "lock expired at its original TTL despite extend",
        ),
        (
            "renewals_that_extend_nothing",
            Flaw::ExtendsNothing,
            "auto_renewal_keeps_lock_for_several_ttls",
            "another client got a renewed lock",
        ),
        (
            "repeated_tokens_across_shared_and_exclusive_holds",
            Flaw::RepeatsTokens,
            "tokens_rise_across_shared_and_exclusive_holds",
            "token",
        ),
        (
            "batched_renewal_of_others_locks",
            Flaw::BatchExtendsAll,
            "batched_renewal_answers_for_each_hold",
            "answered [true, true, true, true]",
        ),
    ]
    .into_iter()
    .map(|(what, flaw, case_name, why)| {
        let handle = rt.handle().clone();
        Trial::test(format!("memory::suite_catches_{what}"), move || {
            let f = case(case_name).ok_or_else(|| format!("no case named {case_name}"))?;
            let factory = BrokenFactory {
                store: MemoryBackend::new(),
                flaw,
                permits: Arc::default(),
                writers: Arc::default(),
            };
            // A flaw that makes a case hang is not caught either.
            match handle.block_on(crate::bounded(f(&factory, namespace()))) {
                // For the flaw's reason, not a failure of the wrapper's own.
                Err(e) if e.message().is_some_and(|m| m.contains(why)) => {
                    eprintln!(
                        "{case_name} on a backend with flaw {flaw:?} failed as it must: {}",
                        e.message().unwrap_or("")
                    );
                    Ok(())
                }
                Err(e) => Err(format!(
                    "{case_name} on a backend with flaw {flaw:?} failed, but not with {why:?}: {}",
                    e.message().unwrap_or("")
                )
                .into()),
                Ok(_) => Err(format!("{case_name} passed on a backend with flaw {flaw:?}").into()),
            }
        })
    })
    .collect()
}
