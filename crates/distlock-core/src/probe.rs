//! Asking a server's port whether it speaks TLS, after a connect failed:
//! a URL whose scheme says plain to a TLS port, or TLS to a plain one, is
//! a configuration error, which a retry cannot mend, not an outage.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// What `addr` (`host:port`) answers to `request` within `timeout`: the
/// bytes read until it has sent `want` of them, closes or goes quiet.
/// `None` when it does not connect or answers nothing.
pub async fn answer(addr: &str, request: &[u8], want: usize, timeout: Duration) -> Option<Vec<u8>> {
    let exchange = async {
        let mut stream = tokio::net::TcpStream::connect(addr).await.ok()?;
        stream.write_all(request).await.ok()?;
        let mut got = Vec::new();
        let mut buf = [0u8; 256];
        while got.len() < want {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
        Some(got)
    };
    let mut got = Vec::new();
    if let Ok(answered) = tokio::time::timeout(timeout, exchange).await {
        got = answered?;
    }
    (!got.is_empty()).then_some(got)
}

/// A TLS record that starts a handshake and is malformed: a TLS server
/// answers it with an alert record, anything else does not.
const MALFORMED_HELLO: &[u8] = &[0x16, 0x03, 0x01, 0x00, 0x04, 0x01, 0x00, 0x00, 0x00];

/// Whether `addr` answers a malformed TLS handshake with a TLS record
/// (an alert, or a handshake), within `timeout`.
pub async fn speaks_tls(addr: &str, timeout: Duration) -> bool {
    answer(addr, MALFORMED_HELLO, 2, timeout)
        .await
        .is_some_and(|a| is_tls_record(&a))
}

/// Whether `bytes` start a TLS alert or handshake record.
pub fn is_tls_record(bytes: &[u8]) -> bool {
    matches!(bytes, [0x15 | 0x16, 0x03, ..])
}

/// The protocols of the servers distlock's backends talk to, as
/// [`identify`] tells them apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    /// Redis, a Sentinel or a Cluster node (RESP).
    Redis,
    /// HTTP, as etcd's client port speaks it beside gRPC.
    Http,
    /// PostgreSQL's wire protocol.
    PostgreSql,
    /// MySQL's and MariaDB's wire protocol.
    MySql,
    /// ZooKeeper's client protocol.
    ZooKeeper,
}

impl Protocol {
    /// The protocol's name, for a message.
    pub fn name(self) -> &'static str {
        match self {
            Self::Redis => "Redis",
            Self::Http => "HTTP (as etcd does)",
            Self::PostgreSql => "PostgreSQL",
            Self::MySql => "MySQL/MariaDB",
            Self::ZooKeeper => "ZooKeeper",
        }
    }
}

/// PostgreSQL's `SSLRequest`: a server answers it with one byte, `S` or `N`.
const PG_SSL_REQUEST: &[u8] = &[0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x2f];

/// Which of distlock's servers' protocols `addr` (`host:port`) speaks, by
/// four questions asked at once on connections of their own, within
/// `timeout`: `PING` (Redis), `GET /version` (HTTP), PostgreSQL's
/// `SSLRequest` and ZooKeeper's `srvr`; a MySQL server greets before it is
/// asked. Each server answers one of them and ignores or closes the
/// others; the first answer it knows decides. `None` when nothing answers
/// in a way it knows, a TLS port among them.
pub async fn identify(addr: &str, timeout: Duration) -> Option<Protocol> {
    use futures_util::StreamExt;
    type Known = fn(&[u8]) -> Option<Protocol>;
    let questions: [(&[u8], usize, Known); 4] = [
        (b"PING\r\n", 5, |a| {
            matches!(a.first(), Some(b'+' | b'-')).then_some(Protocol::Redis)
        }),
        (b"GET /version HTTP/1.0\r\n\r\n", 5, |a| {
            a.starts_with(b"HTTP/").then_some(Protocol::Http)
        }),
        (PG_SSL_REQUEST, 1, |a| {
            matches!(a, b"S" | b"N").then_some(Protocol::PostgreSql)
        }),
        (b"srvr", 64, |a| {
            let text = String::from_utf8_lossy(a);
            (text.starts_with("Zookeeper version") || text.contains("whitelist"))
                .then_some(Protocol::ZooKeeper)
        }),
    ];
    let mut answers: futures_util::stream::FuturesUnordered<_> = questions
        .into_iter()
        .map(|(request, want, known)| async move {
            let a = answer(addr, request, want, timeout).await?;
            if is_mysql_greeting(&a) {
                Some(Protocol::MySql)
            } else {
                known(&a)
            }
        })
        .collect();
    while let Some(found) = answers.next().await {
        if found.is_some() {
            return found;
        }
    }
    None
}

/// Whether `bytes` start a MySQL handshake packet: a 3-byte length, the
/// sequence number 0 and protocol version 10.
fn is_mysql_greeting(bytes: &[u8]) -> bool {
    matches!(bytes, [_, _, 0, 0, 10, ..])
}

/// After a connect to `addr` failed: a message saying that the server
/// there speaks another protocol than `own`, and that the URL's port is
/// wrong. Asking takes `timeout`, at most a second.
pub async fn foreign_protocol(addr: &str, own: Protocol, timeout: Duration) -> Option<String> {
    let found = identify(addr, timeout.min(Duration::from_secs(1))).await?;
    (found != own).then(|| {
        format!(
            "the server there speaks {}, not {}: check the URL's scheme, host and port",
            found.name(),
            own.name()
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tells_a_tls_record_from_plain_answers() {
        assert!(is_tls_record(&[0x15, 0x03, 0x03, 0x00, 0x02, 0x02, 0x32]));
        assert!(is_tls_record(&[0x16, 0x03]));
        assert!(!is_tls_record(b"+PONG\r\n"));
        assert!(!is_tls_record(b"HTTP/1.0 400 Bad Request"));
        assert!(!is_tls_record(&[0x15]));
    }

    #[tokio::test]
    async fn a_plain_listener_is_not_tls_and_its_answer_is_read() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        tokio::spawn(async move {
            loop {
                let (mut s, _) = listener.accept().await.unwrap();
                let mut buf = [0u8; 64];
                let _ = s.read(&mut buf).await;
                let _ = s.write_all(b"+PONG\r\n").await;
            }
        });
        let second = Duration::from_secs(1);
        assert!(!speaks_tls(&addr, second).await);
        let got = answer(&addr, b"PING\r\n", 7, second).await;
        assert_eq!(got.as_deref(), Some(&b"+PONG\r\n"[..]));
    }

    #[test]
    fn tells_a_mysql_greeting() {
        assert!(is_mysql_greeting(
            b"d\x00\x00\x00\n5.5.5-10.11.19-MariaDB\x00"
        ));
        assert!(!is_mysql_greeting(b"+PONG\r\n"));
        assert!(!is_mysql_greeting(b"N"));
    }

    /// A listener that answers `reply` to the first request whose bytes
    /// start with `when`, and closes other connections.
    async fn server(when: &'static [u8], reply: &'static [u8]) -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        tokio::spawn(async move {
            loop {
                let (mut s, _) = listener.accept().await.unwrap();
                tokio::spawn(async move {
                    let mut buf = [0u8; 64];
                    let n = s.read(&mut buf).await.unwrap_or(0);
                    if buf[..n].starts_with(when) {
                        let _ = s.write_all(reply).await;
                    }
                });
            }
        });
        addr
    }

    #[tokio::test]
    async fn identifies_each_protocol_by_its_answer() {
        let second = Duration::from_secs(1);
        for (when, reply, protocol) in [
            (&b"PING"[..], &b"+PONG\r\n"[..], Protocol::Redis),
            (b"GET /version", b"HTTP/1.0 200 OK\r\n", Protocol::Http),
            (PG_SSL_REQUEST, b"N", Protocol::PostgreSql),
            (b"srvr", b"Zookeeper version: 3.8.0\n", Protocol::ZooKeeper),
        ] {
            let addr = server(when, reply).await;
            assert_eq!(identify(&addr, second).await, Some(protocol));
        }
        let addr = server(b"PING", b"+PONG\r\n").await;
        assert_eq!(foreign_protocol(&addr, Protocol::Redis, second).await, None);
        let said = foreign_protocol(&addr, Protocol::PostgreSql, second)
            .await
            .unwrap();
        assert!(said.contains("speaks Redis, not PostgreSQL"), "{said}");
        let silent = server(b"nothing", b"").await;
        assert_eq!(identify(&silent, second).await, None);
    }

    #[tokio::test]
    async fn nothing_listening_answers_nothing() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        drop(listener);
        assert!(answer(&addr, b"PING\r\n", 1, Duration::from_secs(1))
            .await
            .is_none());
        assert!(!speaks_tls(&addr, Duration::from_secs(1)).await);
    }
}
