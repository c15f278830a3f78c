//! Cases on a server that stops answering without closing its connections:
//! the network drops every byte both ways (a half-open connection), so
//! nothing but the client's own bounds ends a request.

use std::future::Future;
use std::time::Duration;

use distlock_core::{Backend, Error, LockClient, LockName, ANSWER_GRACE};
use libtest_mimic::Failed;
use tokio::time::Instant;

use crate::harness::{host_port, proxy::Proxy};

/// A client reaches the server of `url` through a proxy that then stalls
/// every connection, those open and those to come. A wait of one second ends
/// within the wait and [`ANSWER_GRACE`] (and scheduling slack), with
/// `Unavailable` or `WaitTimeout`, however long the backend's own retries
/// or the operating system's TCP timeouts would take; a try and a status
/// call then end with an error that is retryable.
pub async fn a_wait_ends_by_its_deadline<B, F, Fut>(url: String, connect: F) -> Result<(), Failed>
where
    B: Backend,
    F: FnOnce(String) -> Fut,
    Fut: Future<Output = distlock_core::Result<B>>,
{
    let (_, port) = host_port(&url).ok_or("no port in the server's URL")?;
    let proxy = Proxy::start(port).map_err(|e| e.to_string())?;
    let through = url.replacen(&format!(":{port}"), &format!(":{}", proxy.port), 1);
    let client = LockClient::new(connect(through).await?);
    let ns = crate::namespace();
    let ttl = Duration::from_secs(10);
    // Connections, pools and sessions are open before the network stops.
    client
        .lock(format!("{ns}/warm"))
        .ttl(ttl)
        .acquire()
        .await?
        .release()
        .await?;
    proxy.set_stall_new(true);
    for i in 0..proxy.accepted() {
        proxy.stall(i);
    }
    let wait = Duration::from_secs(1);
    let start = Instant::now();
    let waited = tokio::time::timeout(
        Duration::from_secs(120),
        client
            .lock(format!("{ns}/stalled"))
            .ttl(ttl)
            .wait(wait)
            .acquire(),
    )
    .await;
    let took = start.elapsed();
    match waited {
        Err(_) => return Err("the wait had not ended 120 s later".into()),
        Ok(Ok(_)) => return Err("granted through a connection that passes nothing".into()),
        Ok(Err(Error::Unavailable { .. } | Error::WaitTimeout { .. })) => {}
        Ok(Err(e)) => return Err(format!("expected Unavailable or WaitTimeout, got {e}").into()),
    }
    let bound = wait + ANSWER_GRACE + Duration::from_secs(1);
    if took > bound {
        return Err(format!("the wait of {wait:?} ended after {took:?} (bound {bound:?})").into());
    }
    // A try has no deadline: it ends when the backend gives up, with an
    // error that says trying again later may work. (Another name: the
    // abandoned wait's request may still be on its way.)
    let tried = tokio::time::timeout(
        Duration::from_secs(120),
        client.lock(format!("{ns}/tried")).ttl(ttl).try_acquire(),
    )
    .await;
    match tried {
        Err(_) => return Err("the try had not ended 120 s later".into()),
        Ok(Ok(g)) => {
            return Err(format!(
                "a try through a connection that passes nothing answered ({})",
                if g.is_some() { "granted" } else { "refused" }
            )
            .into())
        }
        Ok(Err(e)) if e.is_retryable() => {}
        Ok(Err(e)) => {
            return Err(
                format!("a try on a server that stopped answering failed for good: {e}").into(),
            )
        }
    }
    // Nor does a status call report the lock free: it fails, retryably.
    let name = LockName::new(format!("{ns}/stalled"))?;
    let status =
        tokio::time::timeout(Duration::from_secs(120), client.backend().inspect(&name)).await;
    match status {
        Err(_) => Err("the status call had not ended 120 s later".into()),
        Ok(Ok(s)) => Err(format!(
            "a status call through a connection that passes nothing answered {s:?}"
        )
        .into()),
        Ok(Err(e)) if e.is_retryable() => Ok(()),
        Ok(Err(e)) => Err(format!(
            "a status call on a server that stopped answering failed for good: {e}"
        )
        .into()),
    }
}
