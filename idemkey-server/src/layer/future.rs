//! [`ResponseFuture`], and the future that lets a handler finish when its caller goes
//! away.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use http::Response;
use tracing::Instrument;

use crate::body::ResponseBody;

type BoxFuture<E> = Pin<Box<dyn Future<Output = Result<Response<ResponseBody>, E>> + Send>>;

/// The response future of [`Idempotency`](super::Idempotency).
pub struct ResponseFuture<E> {
    inner: BoxFuture<E>,
}

impl<E> ResponseFuture<E> {
    pub(super) fn new(
        inner: impl Future<Output = Result<Response<ResponseBody>, E>> + Send + 'static,
    ) -> Self {
        Self {
            inner: Box::pin(inner),
        }
    }
}

impl<E> fmt::Debug for ResponseFuture<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ResponseFuture")
    }
}

impl<E> Future for ResponseFuture<E> {
    type Output = Result<Response<ResponseBody>, E>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.inner.as_mut().poll(cx)
    }
}

/// Polls a future in place, and hands it to a spawned task if dropped before it ends.
///
/// Spawning every execution would cost a task and a cross-thread wake-up per request;
/// this costs one only for the requests whose caller went away. The spawned rest runs
/// in the span current when it is dropped: the request's, which tracing's `Instrumented`
/// enters while it drops the pipeline. (Instrumenting every execution up front cost a
/// move of the whole future and a span enter and exit per poll, for the few that are
/// ever detached.)
pub(super) struct DetachOnDrop<F: Future + Send + 'static>(Option<Pin<Box<F>>>);

impl<F: Future + Send + 'static> DetachOnDrop<F> {
    pub(super) fn new(fut: F) -> Self {
        Self(Some(Box::pin(fut)))
    }
}

impl<F> Future for DetachOnDrop<F>
where
    F: Future + Send + 'static,
{
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        // Held outside `self` while polled: if the handler panics, the unwinding drops
        // it here (its execution releases the key) instead of leaving a poisoned future
        // for `drop` to spawn, which would panic again ("`async fn` resumed after
        // panicking") on a runtime thread.
        let Some(mut fut) = self.0.take() else {
            return Poll::Pending; // never polled again after Ready
        };
        let out = fut.as_mut().poll(cx);
        if out.is_pending() {
            self.0 = Some(fut);
        }
        out
    }
}

impl<F> Drop for DetachOnDrop<F>
where
    F: Future + Send + 'static,
{
    fn drop(&mut self) {
        if let Some(fut) = self.0.take() {
            match tokio::runtime::Handle::try_current() {
                Ok(rt) => {
                    let rest = fut.instrument(tracing::Span::current());
                    rt.spawn(async move {
                        let _ = rest.await;
                    });
                }
                // No runtime: the execution's drop releases the key instead.
                Err(_) => drop(fut),
            }
        }
    }
}
