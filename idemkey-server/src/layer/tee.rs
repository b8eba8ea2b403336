//! The tee: a handler's response body goes to its caller frame by frame while a copy,
//! up to the storage limit, goes to the record; the record is completed (or the key
//! released) when the body ends, before the caller sees its end.
//!
//! A body whose frames are all there at once (a buffered JSON answer) is read whole
//! before the caller is answered ([`Tee::prefetch`]), and recorded first, as it always
//! was. A body that makes the layer wait (server-sent events, a long report) is handed
//! to the caller as a [`Tee`], which streams what the handler produces as it comes, and
//! renews the lease meanwhile. If the caller goes away mid-stream, dropping the tee
//! moves the rest to a spawned task that reads the body to its end and records it, as a
//! handler whose caller went away before the answer is finished in the background.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use bytes::{Bytes, BytesMut};
use futures_util::FutureExt as _;
use http::response::Parts;
use http::{HeaderMap, StatusCode};
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt;
use http_body_util::combinators::UnsyncBoxBody;

use super::config::Config;
use crate::body::{self, BoxError};
use crate::execution::{CompletedNow, Completion, Execution, RenewGuard};
use crate::grpc;
use crate::policy::Disposition;
use crate::store::StoreError;
use crate::stored_response;
use idemkey_core::protocol::Problem;

pub(super) type BoxFuture = Pin<Box<dyn Future<Output = ()> + Send>>;

/// What [`Inner::prefetch`] found.
pub(super) enum Prefetch {
    /// The body ended: everything is in hand.
    Ended,
    /// The body failed before it ended.
    Failed(BoxError),
    /// The body makes the caller wait, or is larger than the storage limit: stream it.
    Stream,
}

/// The state of one response on its way: the body, the claim, the copy.
pub(super) struct Inner {
    cfg: Arc<Config>,
    body: UnsyncBoxBody<Bytes, BoxError>,
    exec: Option<Execution>,
    status: StatusCode,
    /// The headers a record keeps, copied out of the response's head: for a gRPC
    /// answer (judged by them) and for a body that streams (recorded once the head is
    /// gone). Empty otherwise: a response read whole is recorded from its own head.
    headers: HeaderMap,
    grpc: bool,
    /// Data read ahead by [`Inner::prefetch`], not sent yet. While the whole response
    /// is in hand it is the record's copy as well.
    queued: ReadAhead,
    /// The copy for the record of a body that streams (cleared once over the limit).
    kept: Vec<Bytes>,
    kept_len: usize,
    /// Every data byte seen.
    seen: u64,
    over: bool,
    trailers: Option<HeaderMap>,
    phase: Phase,
    renew: Option<RenewGuard>,
}

enum Phase {
    Streaming,
    /// The record is being completed (or the key released); then `Then` goes out.
    Finishing(BoxFuture, Then),
    Done,
}

/// What the caller gets once the outcome is settled.
enum Then {
    /// The last data frame (the body said it ended with it).
    Data(Bytes),
    Trailers(HeaderMap),
    Error(BoxError),
    End,
}

impl Then {
    /// The frame the caller gets, or the body's end.
    fn into_frame(self) -> Option<Result<Frame<Bytes>, BoxError>> {
        match self {
            Then::Data(d) => Some(Ok(Frame::data(d))),
            Then::Trailers(t) => Some(Ok(Frame::trailers(t))),
            Then::Error(e) => Some(Err(e)),
            Then::End => None,
        }
    }
}

impl Inner {
    pub(super) fn new<B>(
        cfg: Arc<Config>,
        exec: Execution,
        parts: &Parts,
        body: B,
        grpc: bool,
    ) -> Self
    where
        B: Body<Data = Bytes> + Send + 'static,
        B::Error: Into<BoxError>,
    {
        let headers = if grpc {
            stored_response::storable(parts, &cfg.deny)
        } else {
            HeaderMap::new()
        };
        Self {
            cfg,
            body: body.map_err(Into::into).boxed_unsync(),
            exec: Some(exec),
            status: parts.status,
            headers,
            grpc,
            queued: ReadAhead::default(),
            kept: Vec::new(),
            kept_len: 0,
            seen: 0,
            over: false,
            trailers: None,
            phase: Phase::Streaming,
            renew: None,
        }
    }

    fn keep(&mut self, data: &Bytes) {
        self.seen += data.len() as u64;
        if self.over {
            return;
        }
        if self.kept_len + data.len() > self.cfg.stored_response_limit {
            self.over = true;
            self.kept = Vec::new();
        } else {
            self.kept_len += data.len();
            self.kept.push(data.clone());
        }
    }

    /// Reads the frames that are there at once, up to the storage limit. What it read
    /// is kept for the record in the queue itself: copied out by [`Inner::stream`] if
    /// the body streams on, never if it ended.
    pub(super) fn prefetch(&mut self, cx: &mut Context<'_>) -> Prefetch {
        let mut queued = 0_usize;
        let found = loop {
            if queued > self.cfg.stored_response_limit {
                break Prefetch::Stream;
            }
            match Pin::new(&mut self.body).poll_frame(cx) {
                Poll::Pending => break Prefetch::Stream,
                Poll::Ready(None) => break Prefetch::Ended,
                Poll::Ready(Some(Err(e))) => break Prefetch::Failed(e),
                Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
                    Ok(data) => {
                        queued += data.len();
                        self.queued.push(data);
                    }
                    Err(frame) => {
                        if let Ok(t) = frame.into_trailers() {
                            self.trailers = Some(t);
                            break Prefetch::Ended;
                        }
                    }
                },
            }
        };
        self.seen = queued as u64;
        self.kept_len = queued;
        self.over = queued > self.cfg.stored_response_limit;
        found
    }

    /// From now on the body streams to the caller: the record's copy and headers are
    /// taken out of what was read ahead and the response's head, and the lease is
    /// renewed meanwhile.
    pub(super) fn stream(&mut self, parts: &Parts) {
        self.headers = stored_response::storable(parts, &self.cfg.deny);
        if !self.over {
            self.kept = self.queued.as_slice().to_vec();
        }
        if let Some(exec) = &self.exec {
            self.renew = exec.renew_in_background();
        }
    }

    /// What was read ahead, and the trailers: the whole response of a body that ended
    /// in [`Inner::prefetch`].
    pub(super) fn into_full(mut self) -> (Bytes, Option<HeaderMap>) {
        (self.queued.take_joined(), self.trailers.take())
    }

    /// Settles the outcome of a body that streamed to its end (see
    /// [`Inner::settlement`]), at once when the store answers in process; else the
    /// future that settles it.
    fn finish(&mut self) -> Option<BoxFuture> {
        settle_at_once(self.settlement(None))
    }

    /// The layer's configuration.
    pub(super) fn config(&self) -> &Config {
        &self.cfg
    }

    /// How to settle the outcome of a body that ended: the record (the response, or
    /// that it was too large) or, when the policy says so (a gRPC status that
    /// releases), a release; `None` once settled. `head`: the response's headers, for a
    /// response read whole ([`Prefetch::Ended`]); `None` for one that streamed, whose
    /// headers [`Inner::stream`] copied out.
    pub(super) fn settlement(&mut self, head: Option<&HeaderMap>) -> Option<Settle> {
        self.renew = None;
        let exec = self.exec.take()?;
        let judged = if self.grpc {
            grpc::outcome_status(self.trailers.as_ref(), &self.headers)
        } else {
            self.status
        };
        if self.cfg.policy.decide(judged) == Disposition::Release {
            return Some(Settle::Release(exec));
        }
        let record = if self.over {
            tracing::warn!(
                limit = self.cfg.stored_response_limit,
                size = self.seen,
                retries_get = %Problem::ResponseNotStored,
                "response too large to store"
            );
            stored_response::record_too_large(self.status, self.seen).encode()
        } else {
            // A body read whole is all in the queue; one that streamed, in `kept`.
            let body: &[Bytes] = if self.kept.is_empty() {
                self.queued.as_slice()
            } else {
                &self.kept
            };
            // A response read whole is recorded from its own head, filtered in place; one
            // that streamed, from the storable headers `stream` copied out (filtering
            // those again keeps them all).
            let deny = &self.cfg.deny[..];
            let kept = stored_response::Storable::new(head.unwrap_or(&self.headers), deny);
            let payload = stored_response::encode_record(
                self.status,
                || kept.iter(),
                body,
                self.trailers.as_ref(),
                deny,
            );
            self.kept = Vec::new();
            payload
        };
        Some(Settle::Record(exec, record))
    }

    /// Releases the key of a body that failed: nothing complete was sent.
    pub(super) fn fail(&mut self) -> BoxFuture {
        self.renew = None;
        match self.exec.take() {
            Some(exec) => Box::pin(release(exec)),
            None => Box::pin(async {}),
        }
    }

    fn poll_frame(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        loop {
            match &mut self.phase {
                Phase::Done => return Poll::Ready(None),
                Phase::Finishing(fut, _) => {
                    ready!(fut.as_mut().poll(cx));
                    let Phase::Finishing(_, then) = std::mem::replace(&mut self.phase, Phase::Done)
                    else {
                        unreachable!("matched above")
                    };
                    return Poll::Ready(then.into_frame());
                }
                Phase::Streaming => {}
            }
            if let Some(data) = self.queued.pop_front() {
                return Poll::Ready(Some(Ok(Frame::data(data))));
            }
            let then = match ready!(Pin::new(&mut self.body).poll_frame(cx)) {
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(data) => {
                        self.keep(&data);
                        if !self.body.is_end_stream() {
                            return Poll::Ready(Some(Ok(Frame::data(data))));
                        }
                        // Its last bytes: held until the outcome is recorded, so that a
                        // caller that has the whole response finds it stored.
                        Then::Data(data)
                    }
                    Err(frame) => match frame.into_trailers() {
                        Ok(t) => {
                            self.trailers = Some(t.clone());
                            Then::Trailers(t)
                        }
                        Err(_) => continue, // a frame of a kind this layer does not know
                    },
                },
                Some(Err(e)) => {
                    tracing::warn!(error = %e, "response body failed mid-stream; the key is released");
                    let fut = self.fail();
                    self.phase = Phase::Finishing(fut, Then::Error(e));
                    continue;
                }
                None => Then::End,
            };
            match self.finish() {
                Some(fut) => self.phase = Phase::Finishing(fut, then),
                None => {
                    self.phase = Phase::Done;
                    return Poll::Ready(then.into_frame());
                }
            }
        }
    }
}

/// The body the caller receives while the handler's body streams; see the
/// [module docs](self).
pub(super) struct Tee {
    inner: Option<Box<Inner>>,
}

impl Tee {
    /// The body that streams `inner` (boxed by its maker, which reads ahead through it).
    pub(super) fn new(inner: Box<Inner>) -> Self {
        Self { inner: Some(inner) }
    }
}

impl Body for Tee {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match self.get_mut().inner.as_deref_mut() {
            Some(inner) => inner.poll_frame(cx),
            None => Poll::Ready(None),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner
            .as_deref()
            .is_none_or(|i| matches!(i.phase, Phase::Done))
    }

    fn size_hint(&self) -> SizeHint {
        let Some(inner) = self.inner.as_deref() else {
            return SizeHint::with_exact(0);
        };
        let queued = inner.queued.len_bytes();
        body::plus(inner.body.size_hint(), queued)
    }
}

impl Drop for Tee {
    fn drop(&mut self) {
        let Some(inner) = self.inner.take() else {
            return;
        };
        if matches!(inner.phase, Phase::Done) {
            return;
        }
        // The caller went away mid-stream: read the rest and record it.
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => {
                rt.spawn(async move {
                    let mut rest = Self { inner: Some(inner) };
                    while let Some(frame) = rest.frame().await {
                        if frame.is_err() {
                            break;
                        }
                    }
                });
            }
            // No runtime: the execution's drop leaves the key to its lease.
            Err(_) => drop(inner),
        }
    }
}

/// The frames read ahead of the caller: one frame (a buffered answer, almost always) is
/// held without a queue, so reading a small response allocates nothing.
#[derive(Default)]
struct ReadAhead {
    /// The only frame, while there is at most one.
    one: Option<Bytes>,
    /// All the frames, once there were two.
    more: VecDeque<Bytes>,
}

impl ReadAhead {
    fn push(&mut self, data: Bytes) {
        match self.one.take() {
            None if self.more.is_empty() => self.one = Some(data),
            first => {
                self.more.extend(first);
                self.more.push_back(data);
            }
        }
    }

    fn pop_front(&mut self) -> Option<Bytes> {
        self.one.take().or_else(|| self.more.pop_front())
    }

    /// How many data bytes are held.
    fn len_bytes(&self) -> u64 {
        let all = self.one.iter().chain(&self.more);
        all.map(|b| b.len() as u64).sum()
    }

    /// The frames in order.
    fn as_slice(&mut self) -> &[Bytes] {
        match &self.one {
            Some(one) => std::slice::from_ref(one),
            None => self.more.make_contiguous(),
        }
    }

    /// The frames joined (a single frame as it is), leaving none.
    fn take_joined(&mut self) -> Bytes {
        if let Some(one) = self.one.take() {
            return one;
        }
        match self.more.len() {
            0 => Bytes::new(),
            1 => self.more.pop_front().unwrap_or_default(),
            _ => {
                let mut buf = BytesMut::new();
                for c in self.more.drain(..) {
                    buf.extend_from_slice(&c);
                }
                buf.freeze()
            }
        }
    }
}

/// What settles a claim whose response ended ([`Inner::settlement`]).
pub(super) enum Settle {
    Release(Execution),
    Record(Execution, Bytes),
}

/// Settles the outcome at once when the store answers in process (a completion on the
/// memory store), else hands back the boxed future that settles it; `None` when nothing
/// is left to wait for (settled already, or just now).
///
/// The future that answers a response read whole then keeps room for a box, not for the
/// largest of the store's futures; a body that streamed ends without one.
pub(super) fn settle_at_once(outcome: Option<Settle>) -> Option<BoxFuture> {
    match outcome {
        Some(Settle::Record(exec, payload)) => match exec.complete_or_defer_now(payload) {
            CompletedNow::Settled(result) => {
                recorded(result);
                None
            }
            CompletedNow::Later(exec, payload) => Some(Box::pin(record_outcome(exec, payload))),
        },
        Some(Settle::Release(exec)) => Some(Box::pin(release(exec))),
        None => None,
    }
}

/// Releases the key of `exec` without an outcome, and logs how that went.
pub(super) fn release(exec: Execution) -> impl Future<Output = ()> + Send {
    exec.release().map(|result| settle(result, "release"))
}

/// Records the outcome before the caller is answered when the store answers; through a
/// store outage, in the background (the spawned task owns the outcome and logs how it
/// ends), so that the caller is not held for as long as the outage lasts.
pub(super) fn record_outcome(exec: Execution, payload: Bytes) -> impl Future<Output = ()> + Send {
    exec.complete_or_defer(payload).map(recorded)
}

/// Logs how recording an outcome went, when it failed.
fn recorded(result: Result<Completion, StoreError>) {
    match result {
        Ok(Completion::Recorded | Completion::Deferred(_)) => {}
        Err(e) => settle(Err(e), "complete"),
    }
}

/// Logs how settling a key went.
fn settle(result: Result<(), StoreError>, what: &str) {
    match result {
        Ok(()) => {}
        Err(e) if e.is_fenced() => tracing::warn!(
            "could not {what} the key: another request took it over after this one's lease expired; its outcome wins"
        ),
        Err(e) if e.is_unreplicated() => tracing::warn!(
            error = %e,
            "the outcome is recorded on the primary but not on the replicas asked for: a failover now would lose it, and a retry would run again"
        ),
        Err(e) => tracing::warn!(error = %e, "could not {what} the key; its lease will expire"),
    }
}
