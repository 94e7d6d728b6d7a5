//! A raw HTTP/1.1 client over `std::net`: it sends a case's bytes as they
//! are (malformed ones included), reads the answer to its end or drops the
//! connection part way, and says how the exchange ended.

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use super::cases::Action;

/// How one exchange ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// An HTTP answer with this status; `complete` when the connection then
    /// closed (or the announced body was all there) rather than timing out.
    Answered { status: u16, complete: bool },
    /// The server closed the connection without an answer (EOF or reset).
    Closed,
    /// The client dropped the connection on purpose (the case's action).
    Dropped,
    /// Nothing, or only part of an answer, within the timeout.
    Timeout { bytes: usize },
    /// No connection could be made.
    ConnectFailed(String),
}

impl Outcome {
    /// Whether the exchange ended as it should: an answer, a clean close, or
    /// our own drop.
    pub fn is_ok(&self) -> bool {
        matches!(
            self,
            Outcome::Answered { complete: true, .. } | Outcome::Closed | Outcome::Dropped
        )
    }
}

/// The answer's status and body, if it was one.
#[derive(Debug, Clone)]
pub struct Exchange {
    pub outcome: Outcome,
    pub body: Vec<u8>,
}

fn status_of(head: &[u8]) -> Option<u16> {
    let line = head.split(|&b| b == b'\n').next()?;
    let s = std::str::from_utf8(line).ok()?;
    let mut it = s.split_whitespace();
    if !it.next()?.starts_with("HTTP/") {
        return None;
    }
    it.next()?.parse().ok()
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// Send `request` to `addr` as `action` says, within `timeout` in all.
pub fn exchange(addr: SocketAddr, request: &[u8], action: Action, timeout: Duration) -> Exchange {
    let t0 = Instant::now();
    let mut s = match TcpStream::connect_timeout(&addr, Duration::from_secs(5)) {
        Ok(s) => s,
        Err(e) => {
            return Exchange {
                outcome: Outcome::ConnectFailed(e.to_string()),
                body: Vec::new(),
            }
        }
    };
    let _ = s.set_nodelay(true);
    let _ = s.set_write_timeout(Some(timeout));
    let send = match action {
        Action::DropWhileSending(n) => &request[..n.min(request.len())],
        _ => request,
    };
    // The server may answer and close before it has read everything (a
    // malformed head); a failed write is then not the end of the exchange.
    let _ = s.write_all(send);
    match action {
        Action::DropWhileSending(_) => {
            return Exchange {
                outcome: Outcome::Dropped,
                body: Vec::new(),
            }
        }
        Action::HalfClose => {
            let _ = s.shutdown(Shutdown::Write);
        }
        _ => {}
    }
    let limit = match action {
        Action::DropAfter(n) => Some(n),
        _ => None,
    };
    let mut buf = Vec::new();
    let mut chunk = [0u8; 16384];
    loop {
        if let Some(n) = limit {
            if buf.len() >= n {
                return Exchange {
                    outcome: Outcome::Dropped,
                    body: buf,
                };
            }
        }
        let left = timeout.saturating_sub(t0.elapsed());
        if left.is_zero() {
            return Exchange {
                outcome: Outcome::Timeout { bytes: buf.len() },
                body: buf,
            };
        }
        let _ = s.set_read_timeout(Some(left.max(Duration::from_millis(1))));
        match s.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => continue,
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(_) => break, // reset: the server closed
        }
    }
    match status_of(&buf) {
        Some(status) => {
            let body = find(&buf, b"\r\n\r\n")
                .map(|i| buf[i + 4..].to_vec())
                .unwrap_or_default();
            Exchange {
                outcome: Outcome::Answered { status, complete: true },
                body,
            }
        }
        None => Exchange {
            outcome: Outcome::Closed,
            body: buf,
        },
    }
}

/// Decode a chunked body (as the server streams it); a malformed one is
/// returned as it is.
pub fn dechunk(body: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    let mut rest = body;
    loop {
        let Some(i) = find(rest, b"\r\n") else {
            return if out.is_empty() { body.to_vec() } else { out };
        };
        let Ok(n) = usize::from_str_radix(std::str::from_utf8(&rest[..i]).unwrap_or("x").trim(), 16) else {
            return body.to_vec();
        };
        if n == 0 || rest.len() < i + 2 + n {
            return out;
        }
        out.extend_from_slice(&rest[i + 2..i + 2 + n]);
        rest = &rest[(i + 4 + n).min(rest.len())..];
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_lines() {
        assert_eq!(status_of(b"HTTP/1.1 200 OK\r\n"), Some(200));
        assert_eq!(status_of(b"HTTP/1.0 400 Bad\r\n\r\n"), Some(400));
        assert_eq!(status_of(b"garbage"), None);
        assert_eq!(status_of(b""), None);
    }

    #[test]
    fn chunked_bodies() {
        assert_eq!(dechunk(b"3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n"), b"abcde");
        assert_eq!(dechunk(b"{\"a\":1}"), b"{\"a\":1}");
    }
}
