//! Responses as records: what is kept of a handler's response, and the response a
//! record replays (the binary layout is [`record`](super::record)'s).

use bytes::Bytes;
use http::response::Parts;
use http::{HeaderMap, HeaderName, HeaderValue, Response, StatusCode, header};

use super::body::ResponseBody;
use super::record::{self, Record};
use super::rejection::Rejection;
use idemkey_core::protocol::ReplayHeader;
use idemkey_core::protocol::dialect::{self, Dialect, Refusal};

/// Hop-by-hop headers (RFC 9110 7.6.1) and the length/encoding framing that the server
/// recomputes; never stored.
const HOP_BY_HOP: [HeaderName; 8] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
];

/// The record of a response, encoded: its status, the headers `headers` yields (the
/// storable ones: [`Storable::iter`], or a map of them), its body (in the pieces it
/// came in) and its trailers (minus those in `deny`).
pub(crate) fn encode_record<'h, I>(
    status: StatusCode,
    headers: impl Fn() -> I,
    body: &[Bytes],
    trailers: Option<&HeaderMap>,
    deny: &[HeaderName],
) -> Bytes
where
    I: Iterator<Item = (&'h HeaderName, &'h HeaderValue)>,
{
    let trailers = trailers.map_or_else(HeaderMap::new, |t| {
        let mut t = t.clone();
        for name in deny {
            t.remove(name);
        }
        t
    });
    record::encode_response(status, headers, body, &trailers)
}

/// The record of a response too large to keep: its status, and that it was at least
/// `size_at_least` bytes long.
pub(crate) fn record_too_large(status: StatusCode, size_at_least: u64) -> Record {
    Record::TooLarge {
        status,
        size_at_least,
    }
}

/// The headers of `parts` that a record keeps: all but hop-by-hop ones,
/// `Content-Length` and those in `deny`, copied out (for a response that streams on
/// after its head went to the caller).
pub(crate) fn storable(parts: &Parts, deny: &[HeaderName]) -> HeaderMap {
    storable_headers(&parts.headers, deny)
}

fn storable_headers(headers: &HeaderMap, deny: &[HeaderName]) -> HeaderMap {
    let kept = Storable::new(headers, deny);
    let mut out = HeaderMap::with_capacity(headers.len());
    for (name, value) in kept.iter() {
        out.append(name.clone(), value.clone());
    }
    out
}

/// The headers of a response that a record keeps, read in place: what [`storable`]
/// copies out, for a response whose record is written while its head is still at hand
/// (nothing copied).
pub(crate) struct Storable<'h> {
    headers: &'h HeaderMap,
    deny: &'h [HeaderName],
    /// Names listed by `Connection` (hop-by-hop too); empty, unallocated, without one.
    named_by_connection: Vec<String>,
}

impl<'h> Storable<'h> {
    pub(crate) fn new(headers: &'h HeaderMap, deny: &'h [HeaderName]) -> Self {
        let named_by_connection = headers
            .get_all(header::CONNECTION)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .map(|s| s.trim().to_ascii_lowercase())
            .collect();
        Self {
            headers,
            deny,
            named_by_connection,
        }
    }

    /// The kept headers, in the response's order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (&'h HeaderName, &'h HeaderValue)> {
        let (deny, named) = (self.deny, &self.named_by_connection);
        self.headers.iter().filter(move |(name, _)| {
            !(HOP_BY_HOP.contains(name)
                || *name == header::CONTENT_LENGTH
                || deny.contains(name)
                || named.iter().any(|n| n == name.as_str()))
        })
    }
}

/// The answer to a retry of a completed request: the stored response marked with
/// `marker` (`Idempotent-Replayed: true` by default), or the problem that stands for it
/// (a response that was too large to keep under `limit`, a record that cannot be read).
pub(crate) fn replay(
    payload: Bytes,
    limit: usize,
    marker: Option<ReplayHeader>,
) -> Result<Response<ResponseBody>, Rejection> {
    match Record::decode(payload) {
        Ok(Record::Response {
            status,
            headers,
            body,
            trailers,
        }) => {
            let trailers = (!trailers.is_empty()).then_some(trailers);
            let mut resp = Response::new(ResponseBody::full_with_trailers(body, trailers));
            *resp.status_mut() = status;
            *resp.headers_mut() = headers;
            if let Some(marker) = marker {
                resp.headers_mut()
                    .insert(marker.name(), ReplayHeader::value());
            }
            Ok(resp)
        }
        Ok(Record::TooLarge { size_at_least, .. }) => {
            Err(Rejection::response_not_stored(size_at_least, limit))
        }
        Ok(Record::Value(_)) => Err(Rejection::record_unreadable(
            "the record holds a function result, not a response",
        )),
        Err(why) => Err(Rejection::record_unreadable(why)),
    }
}

/// The answer of a dialect that refuses repeats of a completed request (GoCardless's
/// `409 idempotent_creation_conflict`) instead of replaying it: it names the resource
/// the stored response created, the `id` at the top of its JSON body or one level down
/// (`{"payments": {"id": "PM123"}}`).
pub(crate) fn refuse_replay(
    payload: Bytes,
    dialect: &Dialect,
) -> Result<Response<ResponseBody>, Rejection> {
    let body = match Record::decode(payload) {
        Ok(Record::Response { body, .. }) => Some(body),
        Ok(_) => None,
        Err(why) => return Err(Rejection::record_unreadable(why)),
    };
    let id = body
        .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
        .and_then(|doc| resource_id(&doc).map(str::to_owned));
    let mut reply = dialect.reply(
        Refusal::AlreadyExecuted,
        "A resource has already been created with this idempotency key",
        None,
    );
    if let Some(id) = id {
        dialect::name_conflicting_resource(&mut reply, &id);
    }
    Ok(super::rejection::reply_response(reply))
}

/// The `id` string of a resource document: `/id`, or the `id` of its first member that
/// has one.
fn resource_id(doc: &serde_json::Value) -> Option<&str> {
    doc.get("id")
        .and_then(serde_json::Value::as_str)
        .or_else(|| {
            doc.as_object()?
                .values()
                .find_map(|v| v.get("id").and_then(serde_json::Value::as_str))
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    #[test]
    fn hop_by_hop_framing_and_denied_headers_are_not_stored() {
        let mut h = HeaderMap::new();
        for (n, v) in [
            ("connection", "close, x-private"),
            ("keep-alive", "timeout=5"),
            ("transfer-encoding", "chunked"),
            ("content-length", "12"),
            ("x-private", "named by Connection"),
            ("set-cookie", "s=1"),
            ("x-request-id", "r-1"),
            ("content-type", "application/json"),
        ] {
            h.append(HeaderName::from_static(n), HeaderValue::from_static(v));
        }
        let kept = storable_headers(&h, &[header::SET_COOKIE]);
        let names: Vec<_> = kept.keys().map(HeaderName::as_str).collect();
        assert_eq!(names, ["x-request-id", "content-type"]);
    }
}
