//! Several workers (each its own client, as separate processes would be)
//! increment a counter under one lock, and a fenced store checks every write.
//!
//! Run: `cargo run -p distlock --example quickstart`

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use distlock::{FenceGate, LockClient, MemoryBackend};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let backend = MemoryBackend::new();
    let gate = Arc::new(FenceGate::new());
    let counter = Arc::new(AtomicU64::new(0));

    let mut workers = Vec::new();
    for id in 0..4 {
        let client = LockClient::new(backend.clone());
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
            Ok::<_, Box<dyn std::error::Error + Send + Sync>>(())
        }));
    }
    for w in workers {
        w.await??;
    }
    let total = counter.load(Ordering::SeqCst);
    println!(
        "final counter {total} (expected 20), highest token {}",
        gate.highest()
    );
    if total != 20 {
        return Err("lost updates: mutual exclusion failed".into());
    }
    Ok(())
}
