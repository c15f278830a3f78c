//! Bad input to the client's builders: a typed error at once, saying what
//! is wrong once.

use distlock_core::{Error, InputKind, LockClient, MemoryBackend};

fn client() -> LockClient {
    LockClient::new(MemoryBackend::new())
}

fn assert_invalid(e: Error, kind: InputKind, says: &str) {
    let text = e.to_string();
    assert!(
        matches!(&e, Error::InvalidInput { kind: k, .. } if *k == kind),
        "{e:?}"
    );
    assert!(text.contains(says), "{text}");
}

/// Every way a lock name reaches the client reports its error once, as
/// the name's own check words it.
#[tokio::test]
async fn a_bad_lock_name_is_reported_once() {
    let c = client();
    let errors = [
        c.lock("bad name").acquire().await.unwrap_err(),
        c.lock("bad name").try_acquire().await.unwrap_err(),
        c.semaphore("bad name", 2).acquire().await.unwrap_err(),
        c.lock_all(["ok", "bad name"]).acquire().await.unwrap_err(),
        c.set_semaphore_limit("bad name", 2).await.unwrap_err(),
        c.election("bad name").leader().await.unwrap_err(),
        c.election("bad name").campaign("v").await.unwrap_err(),
    ];
    for e in errors {
        let text = e.to_string();
        assert_eq!(text.matches("invalid name").count(), 1, "{text}");
        assert_invalid(e, InputKind::LockName, "\"bad name\"");
    }
}

/// An empty holder would make every empty-holder request nest into one
/// hold; it is refused on every builder that takes a holder.
#[tokio::test]
async fn an_empty_holder_is_refused() {
    let c = client();
    let errors = [
        c.lock("h").holder("").acquire().await.unwrap_err(),
        c.lock("h").holder("").try_acquire().await.unwrap_err(),
        c.lock("h").shared().holder("").acquire().await.unwrap_err(),
        c.semaphore("h2", 2).holder("").acquire().await.unwrap_err(),
        c.lock_all(["h3", "h4"])
            .holder("")
            .acquire()
            .await
            .unwrap_err(),
    ];
    for e in errors {
        assert_invalid(e, InputKind::Config, "holder is empty");
    }
    // Nothing was taken: another holder gets each at once.
    let g = c.lock("h").holder("a").try_acquire().await.unwrap();
    assert!(g.is_some());
}

/// `distlock observe` prints a leader's value on one line: an empty value,
/// or one with a newline or another control character, is refused when
/// campaigning and when proclaiming.
#[tokio::test]
async fn an_empty_or_multi_line_election_value_is_refused() {
    let c = client();
    let e = c.election("svc");
    for (bad, says) in [
        ("", "election value is empty"),
        ("a\nb", "control character '\\n'"),
        ("a\rb", "control character '\\r'"),
        ("a\u{1b}[31m", "control character '\\u{1b}'"),
    ] {
        assert_invalid(e.campaign(bad).await.unwrap_err(), InputKind::Config, says);
        assert_invalid(
            e.try_campaign(bad).await.unwrap_err(),
            InputKind::Config,
            says,
        );
    }
    assert!(e.leader().await.unwrap().is_none());
    let leader = e.campaign("host:1").await.unwrap();
    for bad in ["", "two\nlines"] {
        assert_invalid(
            leader.proclaim(bad).await.unwrap_err(),
            InputKind::Config,
            "election value",
        );
    }
    assert_eq!(e.leader().await.unwrap().unwrap().value, "host:1");
}

/// Memory declaring a drift margin of 50 ms on every TTL.
#[derive(Debug, Default)]
struct Drifting(MemoryBackend);

#[distlock_core::async_trait]
impl distlock_core::Backend for Drifting {
    fn capabilities(&self) -> distlock_core::Capabilities {
        self.0
            .capabilities()
            .with_drift(0, std::time::Duration::from_millis(50))
    }
    async fn try_acquire(
        &self,
        req: &distlock_core::LockRequest,
    ) -> distlock_core::Result<Option<distlock_core::Grant>> {
        self.0.try_acquire(req).await
    }
    async fn extend(&self, req: &distlock_core::LockRequest) -> distlock_core::Result<bool> {
        self.0.extend(req).await
    }
    async fn release(&self, req: &distlock_core::LockRequest) -> distlock_core::Result<bool> {
        self.0.release(req).await
    }
}

/// A TTL within the backend's range that its drift margin eats whole
/// could never be held (every grant would arrive past its deadline): it
/// is refused before anything is sent, on every builder and on `extend`.
#[tokio::test]
async fn a_ttl_the_drift_margin_eats_whole_is_refused() {
    use std::time::Duration;
    let c = LockClient::new(Drifting::default());
    let short = Duration::from_millis(40);
    let errors = [
        c.lock("d").ttl(short).try_acquire().await.unwrap_err(),
        c.lock("d").ttl(short).acquire().await.unwrap_err(),
        c.semaphore("d2", 2).ttl(short).acquire().await.unwrap_err(),
        c.lock_all(["d3", "d4"])
            .ttl(short)
            .acquire()
            .await
            .unwrap_err(),
    ];
    for e in errors {
        assert_invalid(e, InputKind::Duration, "leaves no time to hold");
    }
    let g = c
        .lock("d")
        .ttl(Duration::from_secs(5))
        .acquire()
        .await
        .unwrap();
    assert_invalid(
        g.extend(short).await.unwrap_err(),
        InputKind::Duration,
        "leaves no time to hold",
    );
    // Nothing was taken by the refused requests: the names are free.
    assert!(g.release().await.unwrap());
    for n in ["d", "d3", "d4"] {
        let free = c.lock(n).ttl(Duration::from_secs(5)).try_acquire().await;
        assert!(free.unwrap().is_some(), "{n} was left held");
    }
}
