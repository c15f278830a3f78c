//! A TCP proxy on loopback that can stop forwarding on command, to cut one
//! link (a replica from its master, say) without root or network namespaces.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::HarnessError;

/// Forwards 127.0.0.1:`port` to 127.0.0.1:`target`.
#[derive(Debug)]
pub struct Proxy {
    /// The port to connect to instead of the target.
    pub port: u16,
    blackhole: Arc<AtomicBool>,
    drop_replies: Arc<AtomicBool>,
    reply_delay_ms: Arc<AtomicU64>,
    request_delay_ms: Arc<AtomicU64>,
    epoch: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    /// Whether connections accepted from now on start stalled.
    stall_new: Arc<AtomicBool>,
    /// Per connection in the order accepted, whether it is stalled.
    stalled: Arc<Mutex<Vec<Arc<AtomicBool>>>>,
}

impl Proxy {
    /// Starts forwarding.
    pub fn start(target: u16) -> Result<Self, HarnessError> {
        Self::start_on(0, target)
    }

    /// Starts forwarding from `listen` (0: any free port).
    pub fn start_on(listen: u16, target: u16) -> Result<Self, HarnessError> {
        let listener = TcpListener::bind(("127.0.0.1", listen))
            .map_err(|e| HarnessError::start("proxy", e.to_string()))?;
        let port = listener
            .local_addr()
            .map_err(|e| HarnessError::start("proxy", e.to_string()))?
            .port();
        let blackhole = Arc::new(AtomicBool::new(false));
        let drop_replies = Arc::new(AtomicBool::new(false));
        let reply_delay_ms = Arc::new(AtomicU64::new(0));
        let request_delay_ms = Arc::new(AtomicU64::new(0));
        let epoch = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let stall_new = Arc::new(AtomicBool::new(false));
        let stalled: Arc<Mutex<Vec<Arc<AtomicBool>>>> = Arc::default();
        let (bh, dr, ep, st, rd) = (
            blackhole.clone(),
            drop_replies.clone(),
            epoch.clone(),
            stop.clone(),
            reply_delay_ms.clone(),
        );
        let (sn, stalls, qd) = (stall_new.clone(), stalled.clone(), request_delay_ms.clone());
        std::thread::spawn(move || {
            for client in listener.incoming() {
                if st.load(Ordering::Acquire) {
                    break;
                }
                let Ok(client) = client else { continue };
                let Ok(server) = TcpStream::connect(("127.0.0.1", target)) else {
                    continue;
                };
                let born = ep.load(Ordering::Acquire);
                let stall = Arc::new(AtomicBool::new(sn.load(Ordering::Acquire)));
                if let Ok(mut all) = stalls.lock() {
                    all.push(stall.clone());
                }
                let directions = [
                    (
                        client.try_clone(),
                        server.try_clone(),
                        bh.clone(),
                        qd.clone(),
                    ),
                    (Ok(server), Ok(client), dr.clone(), rd.clone()),
                ];
                for (from, to, drop_flag, delay) in directions {
                    if let (Ok(from), Ok(to)) = (from, to) {
                        let (bh, st, ep, stall) =
                            (bh.clone(), st.clone(), ep.clone(), stall.clone());
                        std::thread::spawn(move || {
                            pump(from, to, &[&bh, &drop_flag, &stall], &delay, &st, &ep, born)
                        });
                    }
                }
            }
        });
        Ok(Self {
            port,
            blackhole,
            drop_replies,
            reply_delay_ms,
            request_delay_ms,
            epoch,
            stop,
            stall_new,
            stalled,
        })
    }

    /// How many connections the proxy has accepted.
    pub fn accepted(&self) -> usize {
        self.stalled.lock().map_or(0, |all| all.len())
    }

    /// Stalls the connection accepted `index`-th (from 0): it stays open but
    /// its bytes are dropped both ways, the others pass, as when the network
    /// stops answering one connection without closing it.
    pub fn stall(&self, index: usize) {
        if let Some(c) = self
            .stalled
            .lock()
            .ok()
            .and_then(|all| all.get(index).cloned())
        {
            c.store(true, Ordering::Release);
        }
    }

    /// While on, connections accepted are stalled from their first byte;
    /// those accepted before pass.
    pub fn set_stall_new(&self, on: bool) {
        self.stall_new.store(on, Ordering::Release);
    }

    /// While on, bytes from the server to the client are dropped: requests
    /// still reach the server, their replies are lost.
    pub fn set_drop_replies(&self, on: bool) {
        self.drop_replies.store(on, Ordering::Release);
    }

    /// Holds every reply for `delay` before passing it on (zero: none). A
    /// reply still held when [`Proxy::sever`] is called is never delivered.
    pub fn set_reply_delay(&self, delay: Duration) {
        self.reply_delay_ms
            .store(delay.as_millis() as u64, Ordering::Release);
    }

    /// Holds every request for `delay` before passing it on (zero: none),
    /// as a slow link to one server does: a request sent through it can
    /// reach the server after a later one sent to another.
    pub fn set_request_delay(&self, delay: Duration) {
        self.request_delay_ms
            .store(delay.as_millis() as u64, Ordering::Release);
    }

    /// Closes every connection made so far (clients see a connection loss and
    /// may reconnect through the proxy).
    pub fn sever(&self) {
        self.epoch.fetch_add(1, Ordering::AcqRel);
    }

    /// While on, bytes are read and dropped in both directions: connections
    /// stay open but nothing gets through, as in a partition.
    pub fn set_blackhole(&self, on: bool) {
        self.blackhole.store(on, Ordering::Release);
    }
}

fn pump(
    mut from: TcpStream,
    mut to: TcpStream,
    drop_if: &[&AtomicBool],
    delay_ms: &AtomicU64,
    stop: &AtomicBool,
    epoch: &AtomicU64,
    born: u64,
) {
    let _ = from.set_read_timeout(Some(Duration::from_millis(50)));
    let mut buf = [0u8; 16 * 1024];
    while !stop.load(Ordering::Acquire) && epoch.load(Ordering::Acquire) == born {
        match from.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                let delay = delay_ms.load(Ordering::Acquire);
                if delay > 0 {
                    std::thread::sleep(Duration::from_millis(delay));
                    if epoch.load(Ordering::Acquire) != born {
                        break;
                    }
                }
                let dropped = drop_if.iter().any(|f| f.load(Ordering::Acquire));
                if !dropped && to.write_all(&buf[..n]).is_err() {
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
