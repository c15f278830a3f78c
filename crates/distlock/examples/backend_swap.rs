//! The same code on any backend: the URL picks it, cargo features decide
//! which are compiled in. Prints what the chosen backend guarantees, then
//! takes and releases a lock.
//!
//! Run: `cargo run -p distlock --example backend_swap -- sqlite:///tmp/x.db`
//! or, with the backend's feature, e.g.
//! `cargo run -p distlock --features redis --example backend_swap -- redis://127.0.0.1:6379`.

use distlock::LockClient;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let url = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "memory://".into());
    let backend = match distlock::connect(&url).await {
        Ok(b) => b,
        Err(e) => {
            // A scheme whose feature is missing says which feature to enable.
            eprintln!("{e}");
            std::process::exit(2);
        }
    };
    let caps = backend.capabilities();
    println!(
        "{}: fencing {:?}, {:?}, waiting by {:?}, expiry by the {:?} clock",
        caps.backend, caps.fencing, caps.consistency, caps.waiting, caps.clock
    );
    let client = LockClient::from_dyn(backend);
    let guard = client
        .lock("examples/swap")
        .try_acquire()
        .await?
        .ok_or("lock is busy")?;
    println!("acquired with token {}", guard.token());
    guard.release().await?;
    Ok(())
}
