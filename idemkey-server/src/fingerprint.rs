//! Request fingerprints: what makes a retry "the same request".
//!
//! A key names one logical operation; the fingerprint says what that operation was. The
//! verifier stores the fingerprint of the request that claimed a key, and a later
//! request with the same key but a different fingerprint is refused (`422 key-reused`)
//! instead of being answered with a response that belongs to another request.
//!
//! A [`Fingerprint`] is a versioned SHA-256 over length-prefixed fields:
//!
//! 1. the method,
//! 2. the path and query,
//! 3. the `Content-Type` header (absent and empty differ),
//! 4. opt-in: the values of selected extra headers ([`Fingerprinter::header`]),
//! 5. the body, in one of three forms, each tagged so the forms never collide:
//!    - the raw bytes (the default),
//!    - opt-in: RFC 8785 canonical JSON ([`Fingerprinter::canonical_json`]) so key order
//!      and whitespace do not matter, for bodies whose `Content-Type` is JSON and that
//!      parse as JSON (anything else falls back to the raw bytes),
//!    - opt-in: a subset of JSON fields named by JSON pointers
//!      ([`Fingerprinter::json_fields`]), each canonicalised; fields that are absent
//!      are fingerprinted as absent.
//!
//! The options are part of the hashed input too, so two differently configured
//! fingerprinters never produce equal fingerprints by accident. Changing the options of a
//! deployed verifier therefore makes retries of requests claimed before the change look
//! different (they get `422`); do it between retention periods.
//!
//! ```
//! use idemkey::fingerprint::Fingerprinter;
//! use http::{Method, HeaderMap, HeaderValue, Uri, header::CONTENT_TYPE};
//!
//! let mut headers = HeaderMap::new();
//! headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
//! let uri: Uri = "/v1/charges".parse()?;
//!
//! let raw = Fingerprinter::new();
//! let a = raw.fingerprint(&Method::POST, &uri, &headers, br#"{"amount":100,"currency":"eur"}"#);
//! let b = raw.fingerprint(&Method::POST, &uri, &headers, br#"{"currency": "eur", "amount": 100}"#);
//! assert_ne!(a, b, "raw bytes differ");
//!
//! let canonical = Fingerprinter::new().canonical_json();
//! let a = canonical.fingerprint(&Method::POST, &uri, &headers, br#"{"amount":100,"currency":"eur"}"#);
//! let b = canonical.fingerprint(&Method::POST, &uri, &headers, br#"{"currency": "eur", "amount": 100}"#);
//! assert_eq!(a, b, "same JSON, different order and whitespace");
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::fmt;

use http::{HeaderMap, HeaderName, Method, Uri, header::CONTENT_TYPE};
use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::json_pointer::{self, Pointer};

/// The version of the fingerprint scheme, the first byte of every [`Fingerprint`].
///
/// It changes whenever the hashed input changes, so that fingerprints of different
/// versions never compare equal.
pub const FINGERPRINT_VERSION: u8 = 1;

const DOMAIN: &[u8] = b"idemkey/fingerprint/v1\0";

/// A versioned request fingerprint: one version byte and a SHA-256 digest.
///
/// Stores keep it as opaque bytes ([`Fingerprint::as_bytes`]).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Fingerprint([u8; 33]);

impl Fingerprint {
    /// The fingerprint of a serialisable value, canonicalised (RFC 8785) so that field
    /// order does not matter; for the function-level API and for jobs.
    ///
    /// # Errors
    /// When the value cannot be serialised to JSON (a map with non-string keys, a float
    /// that is NaN or infinite).
    ///
    /// ```
    /// use idemkey::fingerprint::Fingerprint;
    /// let a = Fingerprint::of_json(&serde_json::json!({"a": 1, "b": 2}))?;
    /// let b = Fingerprint::of_json(&serde_json::json!({"b": 2, "a": 1}))?;
    /// assert_eq!(a, b);
    /// # Ok::<(), serde_json::Error>(())
    /// ```
    pub fn of_json<T: Serialize>(value: &T) -> Result<Self, serde_json::Error> {
        let canonical = serde_json_canonicalizer::to_vec(value)?;
        let mut h = Hasher::new(b"value-json");
        h.field(b'J', &canonical);
        Ok(h.finish())
    }

    /// The fingerprint of raw bytes (a message payload, a job's arguments).
    #[must_use]
    pub fn of_bytes(bytes: &[u8]) -> Self {
        let mut h = Hasher::new(b"value-bytes");
        h.field(b'B', bytes);
        h.finish()
    }

    /// The stored form: version byte, then the 32 digest bytes.
    #[must_use]
    pub const fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    /// The scheme version this fingerprint was made with.
    #[must_use]
    pub const fn version(&self) -> u8 {
        self.0[0]
    }

    /// Reads back the stored form; `None` when `bytes` is not 33 bytes long.
    #[must_use]
    pub fn from_bytes(bytes: &[u8]) -> Option<Self> {
        <[u8; 33]>::try_from(bytes).ok().map(Self)
    }

    /// Lower-case hex of the stored form.
    #[must_use]
    pub fn to_hex(&self) -> String {
        hex::encode(self.0)
    }
}

impl fmt::Debug for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Fingerprint({})", self.to_hex())
    }
}

/// Length-prefixed SHA-256 input.
struct Hasher(Sha256);

impl Hasher {
    fn new(kind: &[u8]) -> Self {
        let mut h = Self(Sha256::new());
        h.0.update(DOMAIN);
        h.field(b'K', kind);
        h
    }

    /// `tag`, then `bytes` framed as [`idemkey_core::framing::field`] frames them: the tag
    /// and the length go in one update (each update costs its own buffer bookkeeping).
    fn field(&mut self, tag: u8, bytes: &[u8]) {
        let mut head = [0u8; 9];
        head[0] = tag;
        head[1..].copy_from_slice(&(bytes.len() as u64).to_be_bytes());
        self.0.update(head);
        self.0.update(bytes);
    }

    fn finish(self) -> Fingerprint {
        let mut out = [0u8; 33];
        out[0] = FINGERPRINT_VERSION;
        out[1..].copy_from_slice(&self.0.finalize());
        Fingerprint(out)
    }
}

/// Computes request fingerprints; cheap to clone, configured once per verifier.
///
/// The default fingerprints method, path and query, `Content-Type` and the raw body.
#[derive(Debug, Clone, Default)]
pub struct Fingerprinter {
    headers: Vec<HeaderName>,
    canonical_json: bool,
    json_fields: Option<Vec<Pointer>>,
    without_body: bool,
}

impl Fingerprinter {
    /// Method, path and query, `Content-Type` and raw body bytes.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Also fingerprints every value of header `name` (in order), e.g. `Stripe-Account`
    /// or `Accept` when they change what the request does.
    ///
    /// ```
    /// use idemkey::fingerprint::Fingerprinter;
    /// let fp = Fingerprinter::new().header(http::HeaderName::from_static("stripe-account"));
    /// # let _ = fp;
    /// ```
    #[must_use]
    pub fn header(mut self, name: HeaderName) -> Self {
        if !self.headers.contains(&name) {
            self.headers.push(name);
        }
        self
    }

    /// Canonicalises JSON bodies (RFC 8785) so that key order, whitespace and number
    /// spelling (`1.0` and `1`) do not change the fingerprint. Applies to bodies whose
    /// `Content-Type` is `application/json` or `*+json` and that parse as JSON; other
    /// bodies are fingerprinted raw.
    #[must_use]
    pub fn canonical_json(mut self) -> Self {
        self.canonical_json = true;
        self
    }

    /// Fingerprints only the JSON fields named by these JSON pointers (RFC 6901, like
    /// `/amount` or `/customer/id`), each canonicalised; for APIs whose bodies carry
    /// volatile fields (timestamps, trace ids) that a retry may change. A body that is
    /// not JSON is fingerprinted raw.
    ///
    /// ```
    /// use idemkey::fingerprint::Fingerprinter;
    /// use http::{Method, HeaderMap, Uri};
    /// let fp = Fingerprinter::new().json_fields(["/amount", "/currency"]);
    /// let uri = Uri::from_static("/v1/charges");
    /// let h = HeaderMap::new();
    /// let a = fp.fingerprint(&Method::POST, &uri, &h, br#"{"amount":1,"currency":"eur","sent_at":1}"#);
    /// let b = fp.fingerprint(&Method::POST, &uri, &h, br#"{"amount":1,"currency":"eur","sent_at":2}"#);
    /// assert_eq!(a, b);
    /// ```
    #[must_use]
    pub fn json_fields<I, S>(mut self, pointers: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.json_fields = Some(
            pointers
                .into_iter()
                .map(|p| Pointer::new(&p.into()))
                .collect(),
        );
        self
    }

    /// Leaves the body out of the fingerprint entirely (without reading or parsing it):
    /// for requests whose key already names their content, such as webhook deliveries
    /// keyed by the sender's event id, where a redelivery of one event may carry a
    /// different body. Method, path and query, `Content-Type` and selected headers
    /// still count.
    ///
    /// ```
    /// use idemkey::fingerprint::Fingerprinter;
    /// use http::{Method, HeaderMap, Uri};
    /// let fp = Fingerprinter::new().without_body();
    /// let uri = Uri::from_static("/webhooks/stripe");
    /// let h = HeaderMap::new();
    /// assert_eq!(
    ///     fp.fingerprint(&Method::POST, &uri, &h, br#"{"id":"evt_1","pending_webhooks":2}"#),
    ///     fp.fingerprint(&Method::POST, &uri, &h, br#"{"id":"evt_1","pending_webhooks":1}"#),
    /// );
    /// ```
    #[must_use]
    pub fn without_body(mut self) -> Self {
        self.without_body = true;
        self
    }

    /// The fingerprint of a request given by its parts.
    #[must_use]
    pub fn fingerprint(
        &self,
        method: &Method,
        uri: &Uri,
        headers: &HeaderMap,
        body: &[u8],
    ) -> Fingerprint {
        let mut h = Hasher::new(b"http-request");
        h.field(
            b'O',
            &[
                u8::from(self.canonical_json),
                u8::from(self.json_fields.is_some()),
            ],
        );
        h.field(b'M', method.as_str().as_bytes());
        h.field(
            b'P',
            uri.path_and_query()
                .map_or("/", |pq| pq.as_str())
                .as_bytes(),
        );
        match headers.get(CONTENT_TYPE) {
            Some(v) => h.field(b'T', v.as_bytes()),
            None => h.field(b't', b""),
        }
        for name in &self.headers {
            h.field(b'H', name.as_str().as_bytes());
            let values = headers.get_all(name);
            h.field(b'N', &(values.iter().count() as u64).to_be_bytes());
            for v in values {
                h.field(b'V', v.as_bytes());
            }
        }
        self.body(&mut h, headers, body);
        h.finish()
    }

    /// [`Fingerprinter::fingerprint`] of request parts.
    #[must_use]
    pub fn fingerprint_parts(&self, parts: &http::request::Parts, body: &[u8]) -> Fingerprint {
        self.fingerprint(&parts.method, &parts.uri, &parts.headers, body)
    }

    fn body(&self, h: &mut Hasher, headers: &HeaderMap, body: &[u8]) {
        if self.without_body {
            // A tag of its own: never equal to any fingerprint of a body.
            h.field(b'X', b"");
            return;
        }
        match &self.json_fields {
            // Parsed as a `Value` whatever the `Content-Type`; a body that is not one is
            // fingerprinted raw.
            Some(pointers) => match json_pointer::parse_value_document(body) {
                Some(doc) => {
                    h.field(b'F', &(pointers.len() as u64).to_be_bytes());
                    for p in pointers {
                        h.field(b'p', p.as_str().as_bytes());
                        match p.find(doc).and_then(canonical) {
                            Some(c) => h.field(b'v', &c),
                            None => h.field(b'a', b""),
                        }
                    }
                }
                None => h.field(b'R', body),
            },
            None if self.canonical_json && is_json(headers) => {
                match serde_json::from_slice::<serde_json::Value>(body)
                    .ok()
                    .and_then(|v| serde_json_canonicalizer::to_vec(&v).ok())
                {
                    Some(c) => h.field(b'C', &c),
                    None => h.field(b'R', body),
                }
            }
            None => h.field(b'R', body),
        }
    }
}

/// RFC 8785 canonical form of one JSON value, read as a `Value` (as it always was).
fn canonical(value: &serde_json::value::RawValue) -> Option<Vec<u8>> {
    let value: serde_json::Value = serde_json::from_str(value.get()).ok()?;
    serde_json_canonicalizer::to_vec(&value).ok()
}

fn is_json(headers: &HeaderMap) -> bool {
    let Some(ct) = headers.get(CONTENT_TYPE).and_then(|v| v.to_str().ok()) else {
        return false;
    };
    let essence = ct
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    essence == "application/json"
        || (essence.starts_with("application/") && essence.ends_with("+json"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn json_headers() -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        h
    }

    #[test]
    fn without_body_ignores_the_body_but_nothing_else() {
        let fp = Fingerprinter::new().without_body();
        let uri = Uri::from_static("/hook");
        let h = json_headers();
        let a = fp.fingerprint(&Method::POST, &uri, &h, b"{\"a\":1}");
        assert_eq!(a, fp.fingerprint(&Method::POST, &uri, &h, b"not even json"));
        assert_ne!(a, fp.fingerprint(&Method::PUT, &uri, &h, b""));
        assert_ne!(
            a,
            fp.fingerprint(&Method::POST, &Uri::from_static("/other"), &h, b"")
        );
        assert_ne!(
            a,
            fp.fingerprint(&Method::POST, &uri, &HeaderMap::new(), b"")
        );
        // Never equal to a fingerprint that includes an (empty) body.
        assert_ne!(
            a,
            Fingerprinter::new().fingerprint(&Method::POST, &uri, &h, b"")
        );
    }

    #[test]
    fn every_field_counts() {
        let fp = Fingerprinter::new();
        let uri = Uri::from_static("/a?x=1");
        let h = json_headers();
        let base = fp.fingerprint(&Method::POST, &uri, &h, b"{}");
        assert_eq!(base, fp.fingerprint(&Method::POST, &uri, &h, b"{}"));
        assert_eq!(base.version(), FINGERPRINT_VERSION);
        assert_ne!(base, fp.fingerprint(&Method::PUT, &uri, &h, b"{}"));
        assert_ne!(
            base,
            fp.fingerprint(&Method::POST, &Uri::from_static("/a?x=2"), &h, b"{}")
        );
        assert_ne!(
            base,
            fp.fingerprint(&Method::POST, &uri, &HeaderMap::new(), b"{}")
        );
        assert_ne!(base, fp.fingerprint(&Method::POST, &uri, &h, b"{ }"));
        let mut empty_ct = HeaderMap::new();
        empty_ct.insert(CONTENT_TYPE, HeaderValue::from_static(""));
        assert_ne!(
            fp.fingerprint(&Method::POST, &uri, &empty_ct, b""),
            fp.fingerprint(&Method::POST, &uri, &HeaderMap::new(), b"")
        );
    }

    #[test]
    fn length_prefixes_prevent_shifting() {
        let fp = Fingerprinter::new();
        let mut h1 = HeaderMap::new();
        h1.insert(CONTENT_TYPE, HeaderValue::from_static("ab"));
        let mut h2 = HeaderMap::new();
        h2.insert(CONTENT_TYPE, HeaderValue::from_static("a"));
        let uri = Uri::from_static("/");
        assert_ne!(
            fp.fingerprint(&Method::POST, &uri, &h1, b"c"),
            fp.fingerprint(&Method::POST, &uri, &h2, b"bc")
        );
    }

    #[test]
    fn extra_headers_opt_in() {
        let name = HeaderName::from_static("stripe-account");
        let uri = Uri::from_static("/");
        let mut a = HeaderMap::new();
        a.insert(&name, HeaderValue::from_static("acct_1"));
        let mut b = HeaderMap::new();
        b.insert(&name, HeaderValue::from_static("acct_2"));
        let plain = Fingerprinter::new();
        assert_eq!(
            plain.fingerprint(&Method::POST, &uri, &a, b""),
            plain.fingerprint(&Method::POST, &uri, &b, b"")
        );
        let with = Fingerprinter::new().header(name);
        assert_ne!(
            with.fingerprint(&Method::POST, &uri, &a, b""),
            with.fingerprint(&Method::POST, &uri, &b, b"")
        );
    }

    #[test]
    fn canonical_json_only_for_json() {
        let fp = Fingerprinter::new().canonical_json();
        let uri = Uri::from_static("/");
        let h = json_headers();
        assert_eq!(
            fp.fingerprint(&Method::POST, &uri, &h, br#"{"a":1.0,"b":[1,2]}"#),
            fp.fingerprint(&Method::POST, &uri, &h, br#"{ "b": [1, 2], "a": 1 }"#)
        );
        let text = HeaderMap::new();
        assert_ne!(
            fp.fingerprint(&Method::POST, &uri, &text, br#"{"a":1}"#),
            fp.fingerprint(&Method::POST, &uri, &text, br#"{ "a": 1 }"#)
        );
        // Not JSON despite the header: raw, and never equal to a canonical form.
        assert_ne!(
            fp.fingerprint(&Method::POST, &uri, &h, b"{"),
            Fingerprinter::new().fingerprint(&Method::POST, &uri, &h, b"{")
        );
    }

    #[test]
    fn json_field_subset() {
        let fp = Fingerprinter::new().json_fields(["/amount", "/missing"]);
        let uri = Uri::from_static("/");
        let h = json_headers();
        let a = fp.fingerprint(&Method::POST, &uri, &h, br#"{"amount":1,"t":1}"#);
        assert_eq!(
            a,
            fp.fingerprint(&Method::POST, &uri, &h, br#"{"t":2,"amount":1}"#)
        );
        assert_ne!(
            a,
            fp.fingerprint(&Method::POST, &uri, &h, br#"{"amount":2,"t":1}"#)
        );
        assert_ne!(
            a,
            fp.fingerprint(&Method::POST, &uri, &h, br#"{"amount":1,"missing":null}"#)
        );
    }

    #[test]
    fn stored_form_round_trips() {
        let f = Fingerprint::of_bytes(b"job-1");
        assert_eq!(Fingerprint::from_bytes(f.as_bytes()), Some(f));
        assert_eq!(Fingerprint::from_bytes(b"short"), None);
        assert_ne!(
            Fingerprint::of_bytes(b"1"),
            Fingerprint::of_json(&1).unwrap_or_else(|e| panic!("{e}"))
        );
    }

    /// Fingerprints are stored: a change of any value below turns every retry of a
    /// request claimed before an upgrade into `422 key-reused`. Bump
    /// `FINGERPRINT_VERSION` instead of editing these.
    #[test]
    fn pinned_values_never_change() {
        let uri = Uri::from_static("/v1/charges?x=1");
        let json = json_headers();
        let deep = format!("{}1{}", "[".repeat(200), "]".repeat(200));
        let rich = r#"{"amount":100,"currency":"eur","a/b":{"~x":[1,2.50,{"k":"\u00e9"}]},"items":[{"id":"i1"},{"id":"i2"}],"dup":1,"dup":{"z":1,"a":[true,null]}}"#;
        let fields = Fingerprinter::new().json_fields([
            "/amount",
            "/missing",
            "/a~1b/~0x",
            "/items/1",
            "/items/01",
            "/dup",
            "",
            "nope",
        ]);
        let cases: Vec<(&str, Fingerprint)> = vec![
            (
                "raw",
                Fingerprinter::new().fingerprint(&Method::POST, &uri, &json, br#"{"amount":100}"#),
            ),
            (
                "raw, no content type",
                Fingerprinter::new().fingerprint(&Method::POST, &uri, &HeaderMap::new(), b""),
            ),
            (
                "canonical",
                Fingerprinter::new().canonical_json().fingerprint(
                    &Method::POST,
                    &uri,
                    &json,
                    rich.as_bytes(),
                ),
            ),
            (
                "headers",
                Fingerprinter::new()
                    .header(HeaderName::from_static("stripe-account"))
                    .fingerprint(&Method::PUT, &uri, &json, b"x"),
            ),
            (
                "without body",
                Fingerprinter::new().without_body().fingerprint(
                    &Method::POST,
                    &uri,
                    &json,
                    b"ignored",
                ),
            ),
            (
                "fields",
                fields.fingerprint(&Method::POST, &uri, &json, rich.as_bytes()),
            ),
            (
                "fields, no content type",
                fields.fingerprint(&Method::POST, &uri, &HeaderMap::new(), rich.as_bytes()),
            ),
            (
                "fields and canonical",
                fields.clone().canonical_json().fingerprint(
                    &Method::POST,
                    &uri,
                    &json,
                    rich.as_bytes(),
                ),
            ),
            (
                "fields, not JSON",
                fields.fingerprint(&Method::POST, &uri, &json, b"amount=100"),
            ),
            (
                "fields, nested past the depth limit",
                fields.fingerprint(&Method::POST, &uri, &json, deep.as_bytes()),
            ),
            (
                "fields, number out of range",
                fields.fingerprint(&Method::POST, &uri, &json, br#"{"amount":1e400}"#),
            ),
            (
                "fields, lone surrogate",
                fields.fingerprint(&Method::POST, &uri, &json, br#"{"amount":1,"s":"\ud800"}"#),
            ),
            (
                "fields, empty list",
                Fingerprinter::new()
                    .json_fields(Vec::<String>::new())
                    .fingerprint(&Method::POST, &uri, &json, rich.as_bytes()),
            ),
            ("of_bytes", Fingerprint::of_bytes(b"job-1")),
            (
                "of_json",
                Fingerprint::of_json(&serde_json::json!({"b": [1, 2], "a": "x"}))
                    .unwrap_or_else(|e| panic!("{e}")),
            ),
        ];
        let pinned = [
            "01436f88bc9319d9169ec6dde9c6c0b7ff3f6fbe6f41b393d11a1c2efaed1b619b",
            "01b7d1886d48e6727ae02a62452d5cfbc318c86cbe41923cee317d54a8955d31ee",
            "013911f1c970437d43dec26deaddbe434e7b17b17766c62db353d14b7b1b6c94f3",
            "01e74d4eaca12692de9f838809a10b5292a305396dff5c1123b76f546406439a47",
            "013a127420f21e8f252c7ac2092928f98146a5820fe0c7a779da850873abeb497e",
            "015f1c7e688e094abe1f54e8511253e0a1a31b7cedd494838aaa3e9745ec0b6e65",
            "011e02061ed8774429d9f250446f205d976ec96dd0cc367e16224d9b057e7788fc",
            "01366fae3ee58ebcffbbb10d2a8cc7eae4612510a7692da9ef191d608cd01a9442",
            "01531abf954c2a0c7161fa494a37780bdd87deaf7af9f83a45606f7b3018309eb5",
            "014e9c1071d652cc56f846a4988f98b77ebc16e35ab637676275d6126f37f63067",
            "01dba3d021c2f8e87750532cdf2b9af81620e5e86f6218f490146047ed41f70f61",
            "01df7c643c9d4f4d2125a3949f2e5c7fa201c11e1c3d2b11f203bd261fbae6c7d7",
            "0119c8feb6d0cb422a0b1621321293d7e5e138212ff502656ba9cddedabd3deec8",
            "01e86c02941d30fc127618b37add7444c8de51a13be31b17774f2f8b7e315b8e99",
            "016dd0a9fa909b798f8550e0bc1f8bfe189540c4c78393fca06122683d95907bb9",
        ];
        assert_eq!(cases.len(), pinned.len());
        for ((name, fp), want) in cases.iter().zip(pinned) {
            assert_eq!(fp.to_hex(), want, "{name}");
        }
    }
}
