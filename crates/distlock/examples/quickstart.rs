//! A fenced counter on the embedded default (SQLite): four workers, each with its own
//! connection to one SQLite file (as four processes would have), increment a
//! counter under one lock, and a fenced store checks every write's token.
//!
//! Run: `cargo run -p distlock --example quickstart [PATH.db]`

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use distlock::sql::SqlBackend;
use distlock::{FenceGate, LockClient};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let path = std::env::args()
        .nth(1)
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| std::env::temp_dir().join("distlock-quickstart.db"));
    let url = format!("sqlite://{}", path.display());
    println!("lock table in {}", path.display());

    let gate = Arc::new(FenceGate::new());
    let counter = Arc::new(AtomicU64::new(0));
    let mut workers = Vec::new();
    for id in 0..4 {
        let client = LockClient::new(SqlBackend::connect(&url).await?);
        let (gate, counter) = (gate.clone(), counter.clone());
        workers.push(tokio::spawn(async move {
            for _ in 0..5 {
                let guard = client
                    .lock("demo/counter")
                    .ttl(Duration::from_secs(5))
                    .acquire()
                    .await?;
                gate.admit(guard.token())?;
                let v = counter.load(Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(2)).await;
                counter.store(v + 1, Ordering::SeqCst);
                println!(
                    "worker {id} wrote {} with fencing token {}",
                    v + 1,
                    guard.token()
                );
                guard.release().await?;
            }
            Ok::<_, BoxError>(())
        }));
    }
    for w in workers {
        w.await??;
    }
    let total = counter.load(Ordering::SeqCst);
    println!(
        "final counter {total} (expected 20); highest token {} (tokens keep rising across runs)",
        gate.highest()
    );
    if total != 20 {
        return Err("lost updates: mutual exclusion failed".into());
    }
    Ok(())
}
