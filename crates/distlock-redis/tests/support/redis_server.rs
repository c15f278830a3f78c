//! A private redis-server for a crate's own tests, shared by the Redis and
//! Redlock crates' test files through `#[path]` (a dev-dependency on
//! `integration-tests` would build every backend for either crate's tests).

use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// A redis-server on a free loopback port, without persistence, killed
/// when dropped.
pub(crate) struct Server {
    child: Child,
    pub(crate) port: u16,
    dir: std::path::PathBuf,
}

impl Server {
    /// Fails the test when redis-server is missing: `scripts/test.sh`
    /// installs it.
    pub(crate) fn start() -> Self {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let dir = std::env::temp_dir().join(format!(
            "{}-semaphore-{}-{port}",
            env!("CARGO_PKG_NAME"),
            std::process::id()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let child = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no", "--dir"])
            .arg(&dir)
            .stdout(Stdio::null())
            .spawn();
        let child = child.expect("redis-server must be installed; scripts/test.sh installs it");
        let server = Self { child, port, dir };
        let start = std::time::Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "redis-server did not start"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        server
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
