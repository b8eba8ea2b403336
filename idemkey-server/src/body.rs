//! The bodies of the layer: the request body it hands to the inner service
//! ([`RequestBody`]: the bytes it buffered to read a key or fingerprint, or the body as
//! it came when it did not need to), and the response body it hands back to the caller
//! ([`ResponseBody`]: a replay, a problem, or the inner service's body streamed while
//! the layer copies it to the record). An inner service behind
//! [`IdempotencyLayer`](crate::IdempotencyLayer) takes `http::Request<RequestBody<B>>`;
//! axum's `Router` takes any body, so most users never name them.

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::request::Parts;
use http::{HeaderMap, header};
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt;
use http_body_util::combinators::UnsyncBoxBody;

/// The error type of boxed bodies.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The response body of the idempotency layer: buffered bytes and trailers (a replay, a
/// problem, a response the handler gave at once), or the inner service's body streamed
/// through (a route where keys are off, or a response that is still being produced,
/// copied to the record as it goes).
pub struct ResponseBody {
    kind: RespKind,
}

enum RespKind {
    Full {
        data: Option<Bytes>,
        trailers: Option<HeaderMap>,
    },
    Stream {
        prefix: Option<Bytes>,
        rest: UnsyncBoxBody<Bytes, BoxError>,
    },
}

impl ResponseBody {
    /// A body of these bytes.
    #[must_use]
    pub fn full(bytes: Bytes) -> Self {
        Self::full_with_trailers(bytes, None)
    }

    /// A body of these bytes, then these trailers.
    pub(crate) fn full_with_trailers(bytes: Bytes, trailers: Option<HeaderMap>) -> Self {
        Self {
            kind: RespKind::Full {
                data: (!bytes.is_empty()).then_some(bytes),
                trailers,
            },
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
            RespKind::Full { data, trailers } => f
                .debug_struct("ResponseBody::Full")
                .field("len", &data.as_ref().map_or(0, Bytes::len))
                .field("trailers", &trailers.is_some())
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
            RespKind::Full { data, trailers } => Poll::Ready(match data.take() {
                Some(b) => Some(Ok(Frame::data(b))),
                None => trailers.take().map(|t| Ok(Frame::trailers(t))),
            }),
            RespKind::Stream { prefix, rest } => match prefix.take() {
                Some(p) => Poll::Ready(Some(Ok(Frame::data(p)))),
                None => Pin::new(rest).poll_frame(cx),
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            RespKind::Full { data, trailers } => data.is_none() && trailers.is_none(),
            RespKind::Stream { prefix, rest } => prefix.is_none() && rest.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            RespKind::Full { data, .. } => {
                SizeHint::with_exact(data.as_ref().map_or(0, |b| b.len() as u64))
            }
            RespKind::Stream { prefix, rest } => plus(
                rest.size_hint(),
                prefix.as_ref().map_or(0, |b| b.len() as u64),
            ),
        }
    }
}

/// `hint` with `bytes` more (a prefix sent before the body it hints at).
pub(crate) fn plus(hint: SizeHint, bytes: u64) -> SizeHint {
    let mut h = SizeHint::new();
    h.set_lower(hint.lower().saturating_add(bytes));
    if let Some(u) = hint.upper() {
        h.set_upper(u.saturating_add(bytes));
    }
    h
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
    let collect = collect(body, limit);
    match timeout {
        Some(t) => tokio::time::timeout(t, collect)
            .await
            .map_err(|_| ReadError::TimedOut)?,
        None => collect.await,
    }
}

/// The data of `body` joined, at most `limit` bytes of it; its trailers are dropped.
///
/// What `Limited::new(body, limit).collect()` then `to_bytes()` did, without their
/// queue of frames: a body that comes in one frame (almost every small request) is that
/// frame's bytes, with nothing allocated; only a second frame starts a buffer.
async fn collect<B>(body: B, limit: usize) -> Result<Bytes, ReadError>
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    let mut body = std::pin::pin!(body);
    let mut first = Bytes::new();
    let mut joined = BytesMut::new();
    let mut len = 0_usize;
    while let Some(frame) = std::future::poll_fn(|cx| body.as_mut().poll_frame(cx)).await {
        let Ok(data) = frame.map_err(|e| ReadError::Failed(e.into()))?.into_data() else {
            continue; // trailers
        };
        if data.is_empty() {
            continue;
        }
        len = len.saturating_add(data.len());
        if len > limit {
            return Err(ReadError::TooLarge);
        }
        if first.is_empty() && joined.is_empty() {
            first = data;
        } else {
            if joined.is_empty() {
                joined.reserve(len);
                joined.extend_from_slice(&first);
                first = Bytes::new();
            }
            joined.extend_from_slice(&data);
        }
    }
    Ok(if joined.is_empty() {
        first
    } else {
        joined.freeze()
    })
}
