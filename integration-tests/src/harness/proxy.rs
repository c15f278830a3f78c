//! A TCP proxy on loopback that can stop forwarding on command, to cut one
//! link (a replica from its master, say) without root or network namespaces.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::HarnessError;

/// Forwards 127.0.0.1:`port` to 127.0.0.1:`target`.
#[derive(Debug)]
pub struct Proxy {
    /// The port to connect to instead of the target.
    pub port: u16,
    blackhole: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
}

impl Proxy {
    /// Starts forwarding.
    pub fn start(target: u16) -> Result<Self, HarnessError> {
        let listener = TcpListener::bind("127.0.0.1:0")
            .map_err(|e| HarnessError::start("proxy", e.to_string()))?;
        let port = listener
            .local_addr()
            .map_err(|e| HarnessError::start("proxy", e.to_string()))?
            .port();
        let blackhole = Arc::new(AtomicBool::new(false));
        let stop = Arc::new(AtomicBool::new(false));
        let (bh, st) = (blackhole.clone(), stop.clone());
        std::thread::spawn(move || {
            for client in listener.incoming() {
                if st.load(Ordering::Acquire) {
                    break;
                }
                let Ok(client) = client else { continue };
                let Ok(server) = TcpStream::connect(("127.0.0.1", target)) else {
                    continue;
                };
                for (from, to) in [
                    (client.try_clone(), server.try_clone()),
                    (Ok(server), Ok(client)),
                ] {
                    if let (Ok(from), Ok(to)) = (from, to) {
                        let (bh, st) = (bh.clone(), st.clone());
                        std::thread::spawn(move || pump(from, to, &bh, &st));
                    }
                }
            }
        });
        Ok(Self {
            port,
            blackhole,
            stop,
        })
    }

    /// While on, bytes are read and dropped in both directions: connections
    /// stay open but nothing gets through, as in a partition.
    pub fn set_blackhole(&self, on: bool) {
        self.blackhole.store(on, Ordering::Release);
    }
}

fn pump(mut from: TcpStream, mut to: TcpStream, blackhole: &AtomicBool, stop: &AtomicBool) {
    let _ = from.set_read_timeout(Some(Duration::from_millis(200)));
    let mut buf = [0u8; 16 * 1024];
    while !stop.load(Ordering::Acquire) {
        match from.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                if !blackhole.load(Ordering::Acquire) && to.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(_) => break,
        }
    }
    let _ = to.shutdown(Shutdown::Both);
    let _ = from.shutdown(Shutdown::Both);
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        // Wake the accept loop so it sees the flag.
        let _ = TcpStream::connect(("127.0.0.1", self.port));
    }
}
