//! A leader-only periodic job: every replica runs this loop, but only the
//! one holding the lock does the work, and it stops the moment the lock may
//! be lost. Replicas take over when the leader dies (its lease expires).
//!
//! Run: `cargo run -p distlock --example leader_job [BACKEND_URL]`
//! (default: a SQLite file in the temp dir; start it in two terminals).

use std::time::Duration;

use distlock::{LockClient, LostReason};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let url = std::env::args().nth(1).unwrap_or_else(|| {
        format!(
            "sqlite://{}",
            std::env::temp_dir().join("distlock-leader.db").display()
        )
    });
    let client = LockClient::from_dyn(distlock::connect(&url).await?);
    let rounds = std::env::var("LEADER_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3u32);
    let mut led = 0;
    while led < rounds {
        // Wait to become leader; the lease renews itself while we lead.
        let guard = client
            .lock("jobs/leader")
            .ttl(Duration::from_secs(5))
            .acquire()
            .await?;
        println!("leader with fencing token {}", guard.token());
        let work = async {
            for tick in 1.. {
                // Real work would pass guard.token() to whatever it writes.
                println!("tick {tick} as leader");
                tokio::time::sleep(Duration::from_millis(200)).await;
                if tick == 3 {
                    break;
                }
            }
        };
        match guard.run_until_lost(work).await {
            Ok(()) => println!("stepping down after a round of work"),
            Err(distlock::Error::LeaseLost { reason, .. }) => {
                println!("lost leadership ({reason}); work cancelled");
                if matches!(reason, LostReason::SessionLost(_)) {
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }
            Err(e) => return Err(e.into()),
        }
        guard.release().await?;
        led += 1;
    }
    Ok(())
}
