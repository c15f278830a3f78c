//! What the SQL semaphore tables do beyond the conformance suite: renewal
//! batches that mix locks and permits, a lowered limit, a retry by the same
//! owner, tokens after the database is reopened, acquirers of neighbouring
//! names, and acquires dropped mid-transaction. Each case has a lock table
//! of its own.

use std::sync::Arc;
use std::time::Duration;

use distlock_core::{Backend, Error, LockName, LockRequest, Owner};
use distlock_sql::{SqlBackend, SqlConfig};
use libtest_mimic::{Failed, Trial};

use super::election::check;
use super::SqlFactory;

type TestResult = Result<(), Failed>;

const LONG: Duration = Duration::from_secs(60);

/// The semaphore trials every SQL backend runs.
pub(super) fn trials(f: &Arc<SqlFactory>, rt: &tokio::runtime::Runtime) -> Vec<Trial> {
    macro_rules! cases {
        ($($case:ident),* $(,)?) => {
            vec![$({
                let f = f.clone();
                integration_tests::trial(
                    rt,
                    format!("{}::semaphore_tables::{}", f.name, stringify!($case)),
                    $case(f),
                )
            }),*]
        };
    }
    cases![
        mixed_renewal_batch_answers_each_lock_and_permit,
        lowered_limit_keeps_holders_and_grants_only_below_it,
        asking_again_with_the_same_owner_takes_one_permit,
        a_limit_of_zero_is_invalid_input,
        tokens_and_limit_outlive_the_backend,
        acquirers_of_several_names_never_exceed_the_limit,
        dropped_attempts_leave_no_transaction_open,
    ]
}

/// A URL of the factory's database with a lock table of its own.
fn url(f: &SqlFactory) -> Result<String, Failed> {
    let fresh = &Owner::random().to_string()[..8];
    f.url_with(&format!("table=sem_{fresh}"))
}

async fn connect(url: &str) -> Result<SqlBackend, Error> {
    SqlBackend::connect_with(url, SqlConfig::default()).await
}

fn name(n: &str) -> Result<LockName, Error> {
    LockName::new(n)
}

/// One renewal batch with a lock, a permit, and requests that hold
/// nothing: each is answered for its own object only.
async fn mixed_renewal_batch_answers_each_lock_and_permit(f: Arc<SqlFactory>) -> TestResult {
    let kind = f.name;
    let b = connect(&url(&f)?).await?;
    let n = name("jobs/mixed")?;
    let lock = LockRequest::new(n.clone(), LONG);
    let permit = LockRequest::permit(n.clone(), LONG, 2);
    check(b.try_acquire(&lock).await?.is_some(), "lock not granted")?;
    check(
        b.try_acquire(&permit).await?.is_some(),
        "permit not granted",
    )?;
    // The lock's owner asking about the semaphore, and the permit's owner
    // about the lock: a lock and a semaphore of one name are separate.
    let mut lock_owner_as_permit = LockRequest::permit(n.clone(), LONG, 2);
    lock_owner_as_permit.owner = lock.owner;
    let mut permit_owner_as_lock = LockRequest::new(n.clone(), LONG);
    permit_owner_as_lock.owner = permit.owner;
    let foreign_permit = LockRequest::permit(n.clone(), LONG, 2);
    let batch = [
        lock.clone(),
        permit.clone(),
        lock_owner_as_permit,
        permit_owner_as_lock,
        foreign_permit,
        permit.with_ttl(LONG * 2),
    ];
    let answers = b.extend_many(&batch).await?;
    check(
        answers == [true, true, false, false, false, true],
        format!("{kind}: answers {answers:?}"),
    )?;
    check(b.release(&lock).await?, "lock not held after the batch")?;
    check(b.release(&permit).await?, "permit not held after the batch")?;
    Ok(())
}

/// Lowering the limit keeps the permits held, and grants again only once
/// fewer than the new limit hold.
async fn lowered_limit_keeps_holders_and_grants_only_below_it(f: Arc<SqlFactory>) -> TestResult {
    let kind = f.name;
    let b = connect(&url(&f)?).await?;
    let n = name("pool/lowered")?;
    let held: Vec<LockRequest> = (0..3)
        .map(|_| LockRequest::permit(n.clone(), LONG, 3))
        .collect();
    for r in &held {
        check(b.try_acquire(r).await?.is_some(), "permit of 3 not granted")?;
    }
    check(b.set_limit(&n, 2).await? == Some(3), "old limit not 3")?;
    for r in &held {
        check(
            b.extend(r).await?,
            "a permit held before the change was lost",
        )?;
    }
    let status = b.inspect_permits(&n).await?;
    check(
        status.holders == Some(3) && status.limit == Some(2),
        format!("{kind}: {status:?}"),
    )?;
    let newcomer = LockRequest::permit(n.clone(), LONG, 2);
    check(
        b.try_acquire(&newcomer).await?.is_none(),
        "granted with 3 held of 2",
    )?;
    b.release(&held[0]).await?;
    check(
        b.try_acquire(&newcomer).await?.is_none(),
        "granted with 2 held of 2",
    )?;
    b.release(&held[1]).await?;
    check(
        b.try_acquire(&newcomer).await?.is_some(),
        "not granted with 1 held of 2",
    )?;
    Ok(())
}

/// The same owner asking again (a retry after a lost reply) ends up with
/// one permit, under a new token.
async fn asking_again_with_the_same_owner_takes_one_permit(f: Arc<SqlFactory>) -> TestResult {
    let kind = f.name;
    let b = connect(&url(&f)?).await?;
    let n = name("pool/retry")?;
    let req = LockRequest::permit(n.clone(), LONG, 2);
    let first = b.try_acquire(&req).await?.ok_or("first not granted")?.token;
    let again = b.try_acquire(&req).await?.ok_or("retry not granted")?.token;
    check(again > first, format!("retry token {again} after {first}"))?;
    let status = b.inspect_permits(&n).await?;
    check(status.holders == Some(1), format!("{kind}: {status:?}"))?;
    check(b.release(&req).await?, "not held after the retry")?;
    check(!b.release(&req).await?, "held twice")?;
    Ok(())
}

/// A limit of zero is refused with a typed error, whether asked for or set.
async fn a_limit_of_zero_is_invalid_input(f: Arc<SqlFactory>) -> TestResult {
    let b = connect(&url(&f)?).await?;
    let n = name("pool/zero")?;
    let got = b
        .try_acquire(&LockRequest::permit(n.clone(), LONG, 0))
        .await;
    check(
        matches!(got, Err(Error::InvalidInput { .. })),
        format!("{got:?}"),
    )?;
    let set = b.set_limit(&n, 0).await;
    check(
        matches!(set, Err(Error::InvalidInput { .. })),
        format!("{set:?}"),
    )?;
    Ok(())
}

/// A semaphore's counter and limit live in its row, not in the client:
/// tokens keep rising and the limit stays when the database is opened
/// again by a new backend.
async fn tokens_and_limit_outlive_the_backend(f: Arc<SqlFactory>) -> TestResult {
    let url = url(&f)?;
    let n = name("pool/reopened")?;
    let mut last = None;
    for _ in 0..2 {
        let b = connect(&url).await?;
        let req = LockRequest::permit(n.clone(), LONG, 2);
        let t = b.try_acquire(&req).await?.ok_or("not granted")?.token;
        check(
            last.is_none_or(|l| t > l),
            format!("token {t} after {last:?}"),
        )?;
        last = Some(t);
        b.release(&req).await?;
        // The backend goes, as its process would.
        drop(b);
    }
    let b = connect(&url).await?;
    let got = b.try_acquire(&LockRequest::permit(n, LONG, 3)).await;
    check(
        matches!(got, Err(Error::LimitMismatch { stored: 2, .. })),
        format!("{got:?}"),
    )?;
    Ok(())
}

/// Clients with pools of their own contend for the semaphores of three
/// names at once: each name never has more holders than its limit, and
/// nothing fails (no deadlock between acquirers of neighbouring names).
async fn acquirers_of_several_names_never_exceed_the_limit(f: Arc<SqlFactory>) -> TestResult {
    let kind = f.name;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    const LIMIT: u32 = 2;
    const CLIENTS: usize = 12;
    const ROUNDS: usize = 25;
    let url = url(&f)?;
    let names = ["many/a", "many/b", "many/c"];
    let inside: Arc<[AtomicUsize; 3]> = Arc::new(Default::default());
    let most: Arc<[AtomicUsize; 3]> = Arc::new(Default::default());
    let mut tasks = Vec::new();
    for c in 0..CLIENTS {
        let b = connect(&format!("{url}&pool_size=2")).await?;
        let (inside, most) = (inside.clone(), most.clone());
        let which = c % names.len();
        let n = name(names[which])?;
        tasks.push(tokio::spawn(async move {
            for _ in 0..ROUNDS {
                let req = LockRequest::permit(n.clone(), LONG, LIMIT);
                let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
                b.acquire(&req, Some(deadline)).await?;
                let now = inside[which].fetch_add(1, Ordering::SeqCst) + 1;
                most[which].fetch_max(now, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(2)).await;
                inside[which].fetch_sub(1, Ordering::SeqCst);
                if !b.release(&req).await? {
                    return Err(Error::backend("test", "a held permit was not released"));
                }
            }
            Ok::<_, Error>(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    let most: Vec<usize> = most.iter().map(|m| m.load(Ordering::SeqCst)).collect();
    check(
        most.iter().all(|m| *m <= LIMIT as usize),
        format!("{kind}: most holders per name {most:?} with a limit of {LIMIT}"),
    )
}

/// Acquires dropped at every point of their transaction (timeouts from
/// zero to a millisecond and a half, against a full semaphore) leave no
/// transaction open and no permit behind: once the holder releases, another
/// client gets the permit at once.
async fn dropped_attempts_leave_no_transaction_open(f: Arc<SqlFactory>) -> TestResult {
    let kind = f.name;
    let url = url(&f)?;
    let b = connect(&url).await?;
    let n = name("pool/dropped")?;
    let holder = LockRequest::permit(n.clone(), LONG, 1);
    check(
        b.try_acquire(&holder).await?.is_some(),
        "holder not granted",
    )?;
    for i in 0..300u64 {
        let req = LockRequest::permit(n.clone(), LONG, 1);
        let deadline = tokio::time::Instant::now() + LONG;
        let cut = Duration::from_micros((i * 37) % 1500);
        let _ = tokio::time::timeout(cut, b.acquire(&req, Some(deadline))).await;
    }
    check(b.release(&holder).await?, "holder lost its permit")?;
    // The dropped attempts' own connections are back in the pool. One
    // still landing may take the permit and hand it back: a few seconds.
    for client in [&b, &connect(&url).await?] {
        let req = LockRequest::permit(n.clone(), LONG, 1);
        let until = tokio::time::Instant::now() + Duration::from_secs(5);
        let got = loop {
            let got = tokio::time::timeout(Duration::from_secs(3), client.try_acquire(&req)).await;
            if matches!(got, Ok(Ok(Some(_)))) || tokio::time::Instant::now() > until {
                break got;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        check(
            matches!(got, Ok(Ok(Some(_)))),
            format!("{kind}: the free permit gave {got:?}"),
        )?;
        check(client.release(&req).await?, "permit not held")?;
    }
    Ok(())
}
