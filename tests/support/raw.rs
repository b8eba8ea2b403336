//! HTTP/1.1 over a raw TCP socket, for what a well-behaved client never does: stall in
//! the middle of its headers, send less body than it announced, wait for
//! `100 Continue`. Every read is bounded, so a server that never answers fails the test
//! instead of hanging it.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// How long a read may wait before the test gives up on the server: a bound against a
/// hang, not a timing expectation.
const HANG: Duration = Duration::from_secs(30);

/// A raw connection to `addr`.
pub(crate) struct Raw {
    stream: TcpStream,
    buf: Vec<u8>,
}

impl Raw {
    pub(crate) async fn connect(addr: SocketAddr) -> Self {
        let stream = TcpStream::connect(addr)
            .await
            .unwrap_or_else(|e| panic!("connect to {addr}: {e}"));
        Self {
            stream,
            buf: Vec::new(),
        }
    }

    /// Sends `bytes` as they are.
    pub(crate) async fn send(&mut self, bytes: &[u8]) {
        self.stream
            .write_all(bytes)
            .await
            .expect("send to the server");
    }

    /// Reads until the server has sent a whole response head (through the blank line),
    /// and returns it; bytes after it stay buffered.
    pub(crate) async fn head(&mut self) -> String {
        loop {
            if let Some(end) = self.buf.windows(4).position(|w| w == b"\r\n\r\n") {
                let head: Vec<u8> = self.buf.drain(..end + 4).collect();
                return String::from_utf8(head).expect("a response head is text");
            }
            assert!(
                self.fill().await > 0,
                "the connection closed before a whole response head; got {:?}",
                String::from_utf8_lossy(&self.buf)
            );
        }
    }

    /// Reads a whole response: its head and the `Content-Length` bytes of its body.
    pub(crate) async fn response(&mut self) -> (String, Vec<u8>) {
        let head = self.head().await;
        let len = head
            .lines()
            .find_map(|l| {
                let (name, value) = l.split_once(':')?;
                name.eq_ignore_ascii_case("content-length")
                    .then(|| value.trim().parse::<usize>().ok())
                    .flatten()
            })
            .unwrap_or(0);
        while self.buf.len() < len {
            assert!(self.fill().await > 0, "the connection closed mid-body");
        }
        let body = self.buf.drain(..len).collect();
        (head, body)
    }

    /// Reads until the server closes the connection; returns what it sent meanwhile.
    pub(crate) async fn until_closed(&mut self) -> Vec<u8> {
        while self.fill().await > 0 {}
        std::mem::take(&mut self.buf)
    }

    /// One read into the buffer; 0 at the end of the stream (or a reset).
    async fn fill(&mut self) -> usize {
        let mut chunk = [0u8; 4096];
        match tokio::time::timeout(HANG, self.stream.read(&mut chunk)).await {
            Ok(Ok(n)) => {
                self.buf.extend_from_slice(&chunk[..n]);
                n
            }
            Ok(Err(e)) if e.kind() == std::io::ErrorKind::ConnectionReset => 0,
            Ok(Err(e)) => panic!("reading from the server failed: {e}"),
            Err(_) => panic!(
                "the server sent nothing for {HANG:?} and kept the connection open; got so far {:?}",
                String::from_utf8_lossy(&self.buf)
            ),
        }
    }
}

/// The status code of a response head (`HTTP/1.1 400 Bad Request` -> 400).
pub(crate) fn status(head: &str) -> u16 {
    head.split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("not a status line: {head:?}"))
}
