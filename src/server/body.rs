//! The bodies of the layer: the types it hands to the inner service and back to the
//! caller, and how it collects them (a request body up to its limit, a response body up
//! to the storage limit).

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::header;
use http::request::Parts;
use http_body::{Body, Frame, SizeHint};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, LengthLimitError, Limited};

/// The error type of boxed bodies.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The response body of the idempotency layer: buffered bytes (a replay, a problem, a
/// response that was stored) or the inner service's body passed through (a route where
/// keys are off, or a response too large to store whose first bytes were buffered).
pub struct ResponseBody {
    kind: RespKind,
}

enum RespKind {
    Full(Option<Bytes>),
    Stream {
        prefix: Option<Bytes>,
        rest: UnsyncBoxBody<Bytes, BoxError>,
    },
}

impl ResponseBody {
    /// A body of these bytes.
    #[must_use]
    pub fn full(bytes: Bytes) -> Self {
        Self {
            kind: RespKind::Full((!bytes.is_empty()).then_some(bytes)),
        }
    }

    /// `prefix`, then whatever `rest` yields.
    pub(crate) fn chain<B>(prefix: Bytes, rest: B) -> Self
    where
        B: Body<Data = Bytes> + Send + 'static,
        B::Error: Into<BoxError>,
    {
        Self {
            kind: RespKind::Stream {
                prefix: (!prefix.is_empty()).then_some(prefix),
                rest: rest.map_err(Into::into).boxed_unsync(),
            },
        }
    }

    /// Another body passed through unchanged.
    pub(crate) fn wrap<B>(body: B) -> Self
    where
        B: Body<Data = Bytes> + Send + 'static,
        B::Error: Into<BoxError>,
    {
        Self::chain(Bytes::new(), body)
    }
}

impl Default for ResponseBody {
    fn default() -> Self {
        Self::full(Bytes::new())
    }
}

impl std::fmt::Debug for ResponseBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.kind {
            RespKind::Full(b) => f
                .debug_tuple("ResponseBody::Full")
                .field(&b.as_ref().map_or(0, Bytes::len))
                .finish(),
            RespKind::Stream { .. } => f.write_str("ResponseBody::Stream"),
        }
    }
}

impl Body for ResponseBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match &mut self.get_mut().kind {
            RespKind::Full(b) => Poll::Ready(b.take().map(|b| Ok(Frame::data(b)))),
            RespKind::Stream { prefix, rest } => match prefix.take() {
                Some(p) => Poll::Ready(Some(Ok(Frame::data(p)))),
                None => Pin::new(rest).poll_frame(cx),
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            RespKind::Full(b) => b.is_none(),
            RespKind::Stream { prefix, rest } => prefix.is_none() && rest.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            RespKind::Full(b) => SizeHint::with_exact(b.as_ref().map_or(0, |b| b.len() as u64)),
            RespKind::Stream { prefix, rest } => {
                let p = prefix.as_ref().map_or(0, |b| b.len() as u64);
                let r = rest.size_hint();
                let mut h = SizeHint::new();
                h.set_lower(r.lower().saturating_add(p));
                if let Some(u) = r.upper() {
                    h.set_upper(u.saturating_add(p));
                }
                h
            }
        }
    }
}

/// The request body the layer hands to the inner service: the buffered bytes it
/// fingerprinted, or the original body on requests the verifier does not guard.
pub struct RequestBody<B> {
    kind: ReqKind<B>,
}

enum ReqKind<B> {
    Buffered(Option<Bytes>),
    Passthrough(Pin<Box<B>>),
}

impl<B> RequestBody<B> {
    /// A buffered body.
    #[must_use]
    pub fn buffered(bytes: Bytes) -> Self {
        Self {
            kind: ReqKind::Buffered((!bytes.is_empty()).then_some(bytes)),
        }
    }

    /// The original body, unread.
    #[must_use]
    pub fn passthrough(body: B) -> Self {
        Self {
            kind: ReqKind::Passthrough(Box::pin(body)),
        }
    }
}

impl<B> std::fmt::Debug for RequestBody<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.kind {
            ReqKind::Buffered(b) => f
                .debug_tuple("RequestBody::Buffered")
                .field(&b.as_ref().map_or(0, Bytes::len))
                .finish(),
            ReqKind::Passthrough(_) => f.write_str("RequestBody::Passthrough"),
        }
    }
}

impl<B> Body for RequestBody<B>
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match &mut self.get_mut().kind {
            ReqKind::Buffered(b) => Poll::Ready(b.take().map(|b| Ok(Frame::data(b)))),
            ReqKind::Passthrough(body) => body.as_mut().poll_frame(cx).map_err(Into::into),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            ReqKind::Buffered(b) => b.is_none(),
            ReqKind::Passthrough(body) => body.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            ReqKind::Buffered(b) => SizeHint::with_exact(b.as_ref().map_or(0, |b| b.len() as u64)),
            ReqKind::Passthrough(body) => body.size_hint(),
        }
    }
}

/// Why a request body was not collected.
#[derive(Debug)]
pub(crate) enum ReadError {
    /// Over the limit (declared by `Content-Length`, or found while reading).
    TooLarge,
    /// The body failed while it was read.
    Failed(BoxError),
    /// The whole body did not arrive within the timeout.
    TimedOut,
}

/// Collects a request body of at most `limit` bytes, within `timeout` when one is set; a
/// `Content-Length` over the limit is refused before anything is read.
pub(crate) async fn read_body<B>(
    parts: &Parts,
    body: B,
    limit: usize,
    timeout: Option<Duration>,
) -> Result<Bytes, ReadError>
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    let declared = parts
        .headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(ReadError::TooLarge);
    }
    let collect = Limited::new(body, limit).collect();
    let collected = match timeout {
        Some(t) => tokio::time::timeout(t, collect)
            .await
            .map_err(|_| ReadError::TimedOut)?,
        None => collect.await,
    };
    match collected {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(e) if e.is::<LengthLimitError>() => Err(ReadError::TooLarge),
        Err(e) => Err(ReadError::Failed(e)),
    }
}

/// A response body read up to the storage limit.
pub(crate) enum Collected<B> {
    /// All of it.
    Full(Bytes),
    /// Over the limit: what was read, and the rest, unread.
    TooLarge(Bytes, B),
    /// The body failed.
    Failed(BoxError),
}

/// Reads `body` up to `limit` bytes; beyond, hands back what was read and the rest.
pub(crate) async fn read_limited<B>(mut body: B, limit: usize) -> Collected<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    let mut buf = BytesMut::new();
    let mut single: Option<Bytes> = None;
    loop {
        match body.frame().await {
            None => {
                return Collected::Full(match single {
                    Some(b) if buf.is_empty() => b,
                    _ => buf.freeze(),
                });
            }
            Some(Err(e)) => return Collected::Failed(e.into()),
            Some(Ok(frame)) => {
                let Ok(data) = frame.into_data() else {
                    continue; // trailers are not stored
                };
                let held = single.as_ref().map_or(0, Bytes::len) + buf.len();
                if held + data.len() > limit {
                    if let Some(s) = single.take() {
                        buf.extend_from_slice(&s);
                    }
                    buf.extend_from_slice(&data);
                    return Collected::TooLarge(buf.freeze(), body);
                }
                // The common case, one data frame, is kept without copying.
                match single.take() {
                    None if buf.is_empty() => single = Some(data),
                    prev => {
                        if let Some(p) = prev {
                            buf.extend_from_slice(&p);
                        }
                        buf.extend_from_slice(&data);
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::StreamBody;

    fn frames(parts: &[&'static [u8]]) -> impl Body<Data = Bytes, Error = std::io::Error> + Unpin {
        let v: Vec<_> = parts
            .iter()
            .map(|p| Ok(http_body::Frame::data(Bytes::from_static(p))))
            .collect();
        StreamBody::new(futures_util::stream::iter(v))
    }

    #[tokio::test]
    async fn bodies_within_the_limit_are_buffered_whole() {
        match read_limited(frames(&[b"ab", b"cd", b"e"]), 5).await {
            Collected::Full(b) => assert_eq!(b, "abcde"),
            _ => panic!("fits"),
        }
    }

    #[tokio::test]
    async fn larger_bodies_hand_back_what_was_read_and_the_rest() {
        match read_limited(frames(&[b"ab", b"cd", b"ef", b"gh"]), 5).await {
            Collected::TooLarge(prefix, rest) => {
                assert_eq!(prefix, "abcdef");
                let tail = rest.collect().await.map(|c| c.to_bytes());
                assert_eq!(tail.ok(), Some(Bytes::from_static(b"gh")));
            }
            _ => panic!("too large"),
        }
    }
}
