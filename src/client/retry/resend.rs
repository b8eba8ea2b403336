//! What a retry sends: a copy of the request, made from parts kept once per logical
//! request.

use bytes::Bytes;
use http_body::Body as _;
use reqwest::{Body, Request};
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

/// A request kept for the loop, of which every attempt sends a copy, its body shared as
/// [`Bytes`] (never copied).
///
/// `reqwest::Request::try_clone` does the same job, but it writes a timeout into the
/// copy's extensions whether there is one or not (an allocation and a hash table made
/// and thrown away on every request); this copies what a request built by reqwest has:
/// method, URL, headers, version, timeout and body. (Extensions that a request
/// converted from an `http::Request` brought along are not copied: reqwest gives no
/// access to them.)
pub(super) struct Resend {
    original: Request,
    body: Option<Bytes>,
}

impl Resend {
    /// Keeps `req`. `None` when its body is not a buffer in memory (a stream: the caller
    /// sends those once, and never asks) or could not be taken out whole.
    pub(super) fn new(mut req: Request) -> Option<Self> {
        let body = match req.body_mut().take() {
            None => None,
            Some(body) => {
                let bytes = into_bytes(body)?;
                *req.body_mut() = Some(Body::from(bytes.clone()));
                Some(bytes)
            }
        };
        Some(Self {
            original: req,
            body,
        })
    }

    /// The request kept.
    pub(super) fn original(&self) -> &Request {
        &self.original
    }

    /// A copy of the request.
    pub(super) fn copy(&self) -> Request {
        let original = &self.original;
        let mut req = Request::new(original.method().clone(), original.url().clone());
        *req.headers_mut() = original.headers().clone();
        *req.version_mut() = original.version();
        if let Some(timeout) = original.timeout() {
            *req.timeout_mut() = Some(*timeout);
        }
        *req.body_mut() = self.body.clone().map(Body::from);
        req
    }
}

/// The bytes of an in-memory body, without copying them: such a body hands its one
/// buffer out, whole, on its first poll. `None` for a streaming body (or anything else).
fn into_bytes(mut body: Body) -> Option<Bytes> {
    let expected = body.as_bytes()?.len();
    if expected == 0 {
        return Some(Bytes::new());
    }
    let mut cx = Context::from_waker(Waker::noop());
    match Pin::new(&mut body).poll_frame(&mut cx) {
        Poll::Ready(Some(Ok(frame))) => frame.into_data().ok().filter(|b| b.len() == expected),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use http::Method;

    #[test]
    fn copies_carry_every_part_and_share_the_body() {
        let client = reqwest::Client::new();
        let req = client
            .post("http://127.0.0.1:9/charges?x=1")
            .header("idempotency-key", "k-1")
            .timeout(std::time::Duration::from_secs(3))
            .body(vec![7u8; 4096])
            .build()
            .expect("a request");
        let resend = Resend::new(req).expect("an in-memory body");
        let (a, b) = (resend.copy(), resend.copy());
        for r in [resend.original(), &a, &b] {
            assert_eq!(r.method(), Method::POST);
            assert_eq!(r.url().as_str(), "http://127.0.0.1:9/charges?x=1");
            assert_eq!(r.headers()["idempotency-key"], "k-1");
            assert_eq!(r.timeout(), Some(&std::time::Duration::from_secs(3)));
            assert_eq!(r.body().and_then(Body::as_bytes), Some(&[7u8; 4096][..]));
        }
        let ptr = |r: &Request| r.body().and_then(Body::as_bytes).map(<[u8]>::as_ptr);
        assert_eq!(ptr(&a), ptr(&b), "one buffer, shared");
    }

    #[test]
    fn requests_without_body_or_timeout_stay_so() {
        let req = reqwest::Client::new()
            .get("http://127.0.0.1:9/")
            .build()
            .expect("a request");
        let copy = Resend::new(req).expect("no body").copy();
        assert!(copy.body().is_none());
        assert_eq!(copy.timeout(), None);
    }
}
