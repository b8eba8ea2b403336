//! gRPC behind the layer: how a gRPC call is recognized, and how its outcome is judged.
//!
//! A gRPC call is an HTTP/2 `POST` whose `Content-Type` is `application/grpc` (or
//! `application/grpc+proto`, `application/grpc;...`). Its key comes from the
//! `idempotency-key` metadata, which is that header, so the default [`HeaderKey`]
//! finds it. Its status is not the HTTP status (always `200`) but the `grpc-status`
//! trailer (or header, in a trailers-only response): the [`OutcomePolicy`] judges the
//! HTTP status that `google.rpc.Code` gives as the equivalent of that code, so that
//! `UNAVAILABLE` (503) releases the key and `OK` (200) or `ALREADY_EXISTS` (409) is
//! stored. The layer's own answers to a gRPC call are gRPC statuses too
//! ([`Rejection::into_grpc_response`]).
//!
//! [`HeaderKey`]: crate::extract::HeaderKey
//! [`OutcomePolicy`]: crate::policy::OutcomePolicy
//! [`Rejection::into_grpc_response`]: crate::Rejection::into_grpc_response

use http::{HeaderMap, StatusCode, header};

/// The `grpc-status` field.
pub(crate) const GRPC_STATUS: &str = "grpc-status";

/// `true` when `headers` say the message is gRPC.
pub(crate) fn is_grpc(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|ct| ct.get(.."application/grpc".len()).map(|p| (p, ct)))
        .is_some_and(|(prefix, ct)| {
            prefix.eq_ignore_ascii_case("application/grpc")
                && matches!(ct.as_bytes().get(prefix.len()), None | Some(b'+' | b';'))
        })
}

/// The HTTP status that stands for a gRPC response's outcome, for the outcome policy:
/// the `grpc-status` of its trailers (or of its headers, in a trailers-only response),
/// mapped as `google.rpc.Code` documents it. A response without a readable
/// `grpc-status` is broken: `500`, which releases the key by default.
pub(crate) fn outcome_status(trailers: Option<&HeaderMap>, headers: &HeaderMap) -> StatusCode {
    let code = trailers
        .and_then(|t| t.get(GRPC_STATUS))
        .or_else(|| headers.get(GRPC_STATUS))
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u16>().ok());
    let status = match code {
        Some(0) => 200,
        // CANCELLED is 499 in google.rpc.Code; the caller went away and the outcome may
        // be partial, so it is judged as a timeout (released by default).
        Some(1) => 408,
        Some(3 | 9 | 11) => 400,
        Some(4) => 504,
        Some(5) => 404,
        Some(6 | 10) => 409,
        Some(7) => 403,
        Some(8) => 429,
        Some(12) => 501,
        Some(14) => 503,
        Some(16) => 401,
        _ => 500, // UNKNOWN, INTERNAL, DATA_LOSS, missing or unreadable
    };
    StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
}

/// A `grpc-message` value: percent-encoded as the gRPC HTTP/2 protocol asks (every
/// byte outside printable ASCII, and `%`).
pub(crate) fn encode_message(message: &str) -> String {
    let mut out = String::with_capacity(message.len());
    for b in message.bytes() {
        if (0x20..=0x7e).contains(&b) && b != b'%' {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    #[test]
    fn grpc_content_types_are_recognized() {
        let is = |ct: &'static str| {
            let mut h = HeaderMap::new();
            h.insert(header::CONTENT_TYPE, HeaderValue::from_static(ct));
            is_grpc(&h)
        };
        assert!(is("application/grpc"));
        assert!(is("application/grpc+proto"));
        assert!(is("Application/GRPC;charset=utf-8"));
        assert!(!is("application/grpc-web-text"));
        assert!(!is("application/json"));
        assert!(!is_grpc(&HeaderMap::new()));
    }

    #[test]
    fn grpc_codes_are_judged_by_their_http_equivalent() {
        let status = |code: &'static str| {
            let mut t = HeaderMap::new();
            t.insert(GRPC_STATUS, HeaderValue::from_static(code));
            outcome_status(Some(&t), &HeaderMap::new()).as_u16()
        };
        assert_eq!(
            ["0", "1", "3", "6", "14", "13", "x"].map(status),
            [200, 408, 400, 409, 503, 500, 500]
        );
        let mut head = HeaderMap::new();
        head.insert(GRPC_STATUS, HeaderValue::from_static("5"));
        assert_eq!(outcome_status(None, &head), StatusCode::NOT_FOUND);
    }

    #[test]
    fn messages_are_percent_encoded() {
        assert_eq!(
            encode_message("in progress: 100% ✓"),
            "in progress: 100%25 %E2%9C%93"
        );
    }
}
