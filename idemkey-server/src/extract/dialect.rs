//! The key where a vendor dialect puts it: a header or a field of the JSON body, within
//! the dialect's length limit.

use std::borrow::Cow;

use bytes::Bytes;
use http::request::Parts;
use serde_json::Value;

use super::{ExtractKey, header};
use crate::IdempotencyKey;
use crate::rejection::Rejection;
use idemkey_core::protocol::Dialect;
use idemkey_core::protocol::dialect::KeyPlacement;

/// The key of a request in a [`Dialect`]: from its header (read by the one rule, as
/// [`HeaderKey`](super::HeaderKey) reads it) or its top-level JSON body field, and no
/// longer than the dialect allows (`invalid-key` beyond).
#[derive(Debug, Clone)]
pub(crate) struct DialectKey {
    placement: KeyPlacement,
    max_len: usize,
}

impl DialectKey {
    pub(crate) fn new(dialect: &Dialect) -> Self {
        Self {
            placement: dialect.key_placement().clone(),
            max_len: dialect.max_key_len(),
        }
    }
}

impl ExtractKey for DialectKey {
    fn extract_key(
        &self,
        parts: &Parts,
        body: &Bytes,
    ) -> Result<Option<IdempotencyKey>, Rejection> {
        let key = match &self.placement {
            KeyPlacement::Header(name) => header::key(&parts.headers, name)?,
            KeyPlacement::JsonBodyField(field) => json_field(body, field)?,
        };
        match key {
            Some(key) if key.as_str().len() > self.max_len => {
                Err(Rejection::invalid_key(format_args!(
                    "{} holds a key of {} characters; this API takes keys of at most {}: send a shorter key (a UUID has 36)",
                    self.placement,
                    key.as_str().len(),
                    self.max_len
                )))
            }
            key => Ok(key),
        }
    }

    fn describe(&self) -> Cow<'static, str> {
        Cow::Owned(self.placement.to_string())
    }

    fn needs_body(&self) -> bool {
        matches!(self.placement, KeyPlacement::JsonBodyField(_))
    }
}

/// The key in the top-level `field` of a JSON object body: `None` when the body is not
/// a JSON object or lacks the field (or holds `null`), `invalid-key` when the field is
/// not a string key.
fn json_field(body: &[u8], field: &str) -> Result<Option<IdempotencyKey>, Rejection> {
    let Ok(Value::Object(mut doc)) = serde_json::from_slice::<Value>(body) else {
        return Ok(None);
    };
    match doc.remove(field) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(key)) => IdempotencyKey::new(key).map(Some).map_err(|e| {
            Rejection::invalid_key(format_args!(
                "the `{field}` field of the JSON body is not a valid idempotency key: {e}"
            ))
        }),
        Some(other) => Err(Rejection::invalid_key(format_args!(
            "the `{field}` field of the JSON body is {other}, not a string key; send a unique string (a random UUID)"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(
        dialect: &Dialect,
        headers: &[(&str, &str)],
        body: &str,
    ) -> Result<Option<String>, Rejection> {
        let mut req = http::Request::new(());
        for (n, v) in headers {
            req.headers_mut().insert(
                http::HeaderName::from_bytes(n.as_bytes()).expect("name"),
                v.parse().expect("value"),
            );
        }
        let (parts, ()) = req.into_parts();
        DialectKey::new(dialect)
            .extract_key(&parts, &Bytes::from(body.to_owned()))
            .map(|k| k.map(|k| k.to_string()))
    }

    #[test]
    fn square_keys_come_from_the_body_within_45_bytes() {
        let sq = Dialect::square();
        assert_eq!(
            key(&sq, &[], r#"{"idempotency_key":"k-1","amount":1}"#).expect("ok"),
            Some("k-1".into())
        );
        assert_eq!(
            key(&sq, &[("idempotency-key", "h")], r#"{"amount":1}"#).expect("ok"),
            None
        );
        assert_eq!(key(&sq, &[], "not json").expect("ok"), None);
        assert_eq!(
            key(&sq, &[], r#"{"idempotency_key":null}"#).expect("ok"),
            None
        );
        let long = format!(r#"{{"idempotency_key":"{}"}}"#, "k".repeat(46));
        let err = key(&sq, &[], &long).expect_err("too long");
        assert!(
            err.is_key_error() && err.detail().contains("at most 45"),
            "{err}"
        );
        let err = key(&sq, &[], r#"{"idempotency_key":42}"#).expect_err("a number");
        assert!(err.detail().contains("not a string key"), "{err}");
    }

    #[test]
    fn header_keys_keep_the_dialects_limit() {
        let paypal = Dialect::paypal();
        assert_eq!(
            key(&paypal, &[("paypal-request-id", "r-1")], "").expect("ok"),
            Some("r-1".into())
        );
        assert_eq!(
            key(&paypal, &[("idempotency-key", "r-1")], "").expect("ok"),
            None
        );
        let err = key(
            &Dialect::adyen(),
            &[("idempotency-key", &"k".repeat(65))],
            "",
        )
        .expect_err("65");
        assert!(err.detail().contains("at most 64"), "{err}");
    }
}
