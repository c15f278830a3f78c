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
        assert_eq!(text.matches("invalid lock name").count(), 1, "{text}");
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
