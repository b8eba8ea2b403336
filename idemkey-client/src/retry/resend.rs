//! What a retry sends: a copy of the request, made from parts kept once per logical
//! request.

use std::pin::Pin;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderName, HeaderValue, Method, Version};
use http_body::Body as _;
use reqwest::{Body, Request, Url};

use crate::IdempotencyKey;

/// A request for the loop: the first attempt sends it as the caller built it, and each
/// later attempt sends a copy made from parts kept once per logical request, the body
/// shared as [`Bytes`] (never copied).
///
/// Nothing is copied for the first attempt: a logical request that succeeds at once
/// (the common case) pays for keeping its URL and its caller's headers, not for a
/// second request. The key header this crate put on the request is not kept but made
/// again from the key for a retry (copying its value would allocate a shared buffer
/// for it).
///
/// `reqwest::Request::try_clone` does the copy's job, but it writes a timeout into the
/// copy's extensions whether there is one or not (an allocation and a hash table made
/// and thrown away on every request); this copies what a request built by reqwest has:
/// method, URL, headers, version, timeout and body. (Extensions that a request
/// converted from an `http::Request` brought along are not copied: reqwest gives no
/// access to them.)
pub(super) struct Resend {
    first: Option<Request>,
    kept: Kept,
}

/// What a retry's request is made from.
struct Kept {
    method: Method,
    url: Url,
    version: Version,
    timeout: Option<Duration>,
    /// The request's headers, but the key header this crate placed.
    headers: Vec<(HeaderName, HeaderValue)>,
    /// Whether this crate placed the key header, made again for each copy (its name is
    /// the key resolver's, handed to [`Resend::next`] with the key).
    own_key: bool,
    body: Option<Bytes>,
}

impl Resend {
    /// Keeps `req`; `own_key` names the header that carries the key this crate put there
    /// (a key the caller set stays among the headers kept as they are; that header and
    /// the key are handed to [`next`](Self::next) again). `None` when its
    /// body is not a buffer in memory (a stream: the caller sends those once, and never
    /// asks) or could not be taken out whole.
    pub(super) fn new(mut req: Request, own_key: Option<&HeaderName>) -> Option<Self> {
        let body = match req.body_mut().take() {
            None => None,
            Some(body) => {
                let bytes = into_bytes(body)?;
                *req.body_mut() = Some(Body::from(bytes.clone()));
                Some(bytes)
            }
        };
        // Nothing to walk when the key header is the only one (or there is none).
        let mut headers = Vec::new();
        if req.headers().len() > usize::from(own_key.is_some()) {
            headers.reserve(req.headers().len());
            for (name, value) in req.headers() {
                if Some(name) != own_key {
                    headers.push((name.clone(), value.clone()));
                }
            }
        }
        let kept = Kept {
            method: req.method().clone(),
            url: req.url().clone(),
            version: req.version(),
            timeout: req.timeout().copied(),
            headers,
            own_key: own_key.is_some(),
            body,
        };
        Some(Self {
            first: Some(req),
            kept,
        })
    }

    /// The request the first attempt sends, until it is sent.
    #[allow(clippy::expect_used)]
    pub(super) fn original(&self) -> &Request {
        self.first
            .as_ref()
            .expect("read before the loop, which takes it for the first attempt")
    }

    /// The request for the next attempt: the original the first time, a copy after,
    /// carrying the key in the key header, if this crate placed it.
    pub(super) fn next(&mut self, key_header: Option<(&HeaderName, &IdempotencyKey)>) -> Request {
        self.first
            .take()
            .unwrap_or_else(|| self.kept.copy(key_header))
    }
}

impl Kept {
    /// Out of line and cold: only a retry makes a copy.
    #[cold]
    #[inline(never)]
    fn copy(&self, key_header: Option<(&HeaderName, &IdempotencyKey)>) -> Request {
        let mut req = Request::new(self.method.clone(), self.url.clone());
        let own = key_header.filter(|_| self.own_key);
        let headers = req.headers_mut();
        headers.reserve(self.headers.len() + usize::from(own.is_some()));
        for (name, value) in &self.headers {
            headers.append(name.clone(), value.clone());
        }
        if let Some((name, key)) = own {
            headers.insert(name, key.to_header_value());
        }
        *req.version_mut() = self.version;
        *req.timeout_mut() = self.timeout;
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

    #[test]
    fn copies_carry_every_part_and_share_the_body() {
        let client = reqwest::Client::new();
        let req = client
            .post("http://127.0.0.1:9/charges?x=1")
            .header("idempotency-key", "k-1")
            .header("x-tag", "a")
            .header("x-tag", "b")
            .timeout(Duration::from_secs(3))
            .body(vec![7u8; 4096])
            .build()
            .expect("a request");
        let first_body = req.body().and_then(Body::as_bytes).map(<[u8]>::as_ptr);
        // The caller's key header is kept as it is, like any other of the caller's.
        let mut resend = Resend::new(req, None).expect("an in-memory body");
        let (first, a, b) = (resend.next(None), resend.next(None), resend.next(None));
        for r in [&first, &a, &b] {
            assert_eq!(r.method(), Method::POST);
            assert_eq!(r.url().as_str(), "http://127.0.0.1:9/charges?x=1");
            assert_eq!(r.headers()["idempotency-key"], "k-1");
            let tags: Vec<_> = r.headers().get_all("x-tag").iter().collect();
            assert_eq!(tags, ["a", "b"], "every value, in order");
            assert_eq!(r.headers().len(), 3);
            assert_eq!(r.timeout(), Some(&Duration::from_secs(3)));
            assert_eq!(r.body().and_then(Body::as_bytes), Some(&[7u8; 4096][..]));
        }
        let ptr = |r: &Request| r.body().and_then(Body::as_bytes).map(<[u8]>::as_ptr);
        assert_eq!(
            ptr(&first),
            first_body,
            "the first attempt sends the original"
        );
        assert_eq!(ptr(&a), ptr(&b), "one buffer, shared");
        assert_eq!(ptr(&first), ptr(&a), "one buffer, shared");
    }

    #[test]
    fn the_key_header_this_crate_placed_is_made_again_for_each_copy() {
        let key = IdempotencyKey::new("k-2").expect("a valid key");
        let name = HeaderName::from_static("idempotency-key");
        let req = reqwest::Client::new()
            .post("http://127.0.0.1:9/charges")
            .header("authorization", "Bearer t")
            .header(name.clone(), key.to_header_value())
            .body("{}")
            .build()
            .expect("a request");
        let mut resend = Resend::new(req, Some(&name)).expect("an in-memory body");
        let own = Some((&name, &key));
        for r in [resend.next(own), resend.next(own)] {
            assert_eq!(r.headers()["idempotency-key"], "k-2");
            assert_eq!(r.headers()["authorization"], "Bearer t");
            assert_eq!(r.headers().len(), 2);
        }
    }

    #[test]
    fn requests_without_body_or_timeout_stay_so() {
        let req = reqwest::Client::new()
            .get("http://127.0.0.1:9/")
            .build()
            .expect("a request");
        let mut resend = Resend::new(req, None).expect("no body");
        for r in [resend.next(None), resend.next(None)] {
            assert!(r.body().is_none());
            assert_eq!(r.timeout(), None);
            assert!(r.headers().is_empty());
        }
    }
}
