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
