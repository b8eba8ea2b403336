//! JSON pointer look-ups (RFC 6901) that do not build the document: the one
//! implementation behind the webhook sources ([`KeySource::json_pointer`]) and the
//! fingerprint's field subsets ([`Fingerprinter::json_fields`]).
//!
//! A webhook body can be tens of kilobytes (a Stripe event embeds the whole object) while
//! the id is one short string near the top. Instead of parsing the body into a
//! [`serde_json::Value`] tree, the look-up validates the body once as a
//! [`RawValue`], then walks down one level per pointer token, skipping every sibling with
//! [`IgnoredAny`] and borrowing the matching child as another `RawValue`. Nothing is
//! allocated except object keys that contain escapes.
//!
//! Semantics are those of [`serde_json::Value::pointer`], checked by a property test:
//! `""` is the whole document, other pointers start with `/`, `~1` and `~0` unescape to
//! `/` and `~`, array indices are decimal without a sign or leading zeros, and when an
//! object repeats a key the last one wins.
//!
//! Two ways to validate a document: [`parse_document`] accepts any well-formed JSON text
//! (the sources' rule); [`parse_value_document`] accepts exactly the texts that parse as a
//! `serde_json::Value` (a nesting depth of at most 128, numbers within `f64`, no lone
//! surrogate escapes), the rule fingerprints have always used, so that no stored
//! fingerprint changes.
//!
//! [`KeySource::json_pointer`]: crate::extract::KeySource::json_pointer
//! [`Fingerprinter::json_fields`]: crate::fingerprint::Fingerprinter::json_fields

use std::borrow::Cow;
use std::fmt;

use serde::de::{self, DeserializeSeed, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::value::RawValue;

/// A parsed JSON pointer.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct Pointer {
    text: String,
    /// `None` when the text is not a valid pointer (it then matches nothing, as with
    /// [`serde_json::Value::pointer`]).
    tokens: Option<Vec<String>>,
}

impl Pointer {
    pub(crate) fn new(text: &str) -> Self {
        let tokens = if text.is_empty() {
            Some(Vec::new())
        } else if text.starts_with('/') {
            Some(
                text.split('/')
                    .skip(1)
                    .map(|t| t.replace("~1", "/").replace("~0", "~"))
                    .collect(),
            )
        } else {
            None
        };
        Self {
            text: text.to_owned(),
            tokens,
        }
    }

    pub(crate) fn as_str(&self) -> &str {
        &self.text
    }

    /// The value the pointer names in `doc`, or `None` when there is none.
    ///
    /// `doc` must be valid JSON (see [`parse_document`]).
    pub(crate) fn find<'a>(&self, doc: &'a RawValue) -> Option<&'a RawValue> {
        let tokens = self.tokens.as_ref()?;
        let mut current = doc;
        for token in tokens {
            let mut de = serde_json::Deserializer::from_str(current.get());
            current = Child(token).deserialize(&mut de).ok()??;
        }
        Some(current)
    }
}

impl fmt::Debug for Pointer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.text, f)
    }
}

/// Validates `body` as one JSON document, without building it.
pub(crate) fn parse_document(body: &[u8]) -> Result<&RawValue, serde_json::Error> {
    serde_json::from_slice(body)
}

/// Validates `body` as [`parse_document`] does, but accepts only the documents that
/// `serde_json::from_slice::<Value>` accepts, still without building one.
pub(crate) fn parse_value_document(body: &[u8]) -> Option<&RawValue> {
    let mut de = serde_json::Deserializer::from_slice(body);
    AsValue.deserialize(&mut de).ok()?;
    de.end().ok()?;
    parse_document(body).ok()
}

/// Walks a document as `serde_json::Value` deserialises it (`deserialize_any`, so with
/// its depth limit and number parsing; keys through `deserialize_str`), keeping nothing.
struct AsValue;

impl<'de> DeserializeSeed<'de> for AsValue {
    type Value = ();

    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for AsValue {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        while map.next_key::<Key<'de>>()?.is_some() {
            map.next_value_seed(AsValue)?;
        }
        Ok(())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        while seq.next_element_seed(AsValue)?.is_some() {}
        Ok(())
    }

    fn visit_bool<E: de::Error>(self, _: bool) -> Result<(), E> {
        Ok(())
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> Result<(), E> {
        Ok(())
    }
    fn visit_u64<E: de::Error>(self, _: u64) -> Result<(), E> {
        Ok(())
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<(), E> {
        Ok(())
    }
    fn visit_str<E: de::Error>(self, _: &str) -> Result<(), E> {
        Ok(())
    }
    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        Ok(())
    }
}

/// What a pointer found, read as an identifier.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Scalar<'a> {
    /// A string (unescaped) or a number (its JSON text).
    Text(Cow<'a, str>),
    /// `null`: treated like an absent field.
    Null,
    /// An object, an array or a boolean: not an identifier.
    Other(&'static str),
}

/// Reads a found value as an identifier.
pub(crate) fn scalar(value: &RawValue) -> Scalar<'_> {
    let text = value.get();
    match text.as_bytes().first() {
        Some(b'"') => match serde_json::from_str::<&str>(text) {
            Ok(s) => Scalar::Text(Cow::Borrowed(s)),
            // A string with escapes cannot be borrowed; read it owned.
            Err(_) => serde_json::from_str::<String>(text)
                .map_or(Scalar::Other("string"), |s| Scalar::Text(Cow::Owned(s))),
        },
        Some(b'-' | b'0'..=b'9') => Scalar::Text(Cow::Borrowed(text)),
        Some(b'n') => Scalar::Null,
        Some(b't' | b'f') => Scalar::Other("boolean"),
        Some(b'{') => Scalar::Other("object"),
        Some(b'[') => Scalar::Other("array"),
        _ => Scalar::Other("value"),
    }
}

/// Finds the child named by one pointer token in an object or array.
struct Child<'t>(&'t str);

impl<'de> DeserializeSeed<'de> for Child<'_> {
    type Value = Option<&'de RawValue>;

    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Child<'_> {
    type Value = Option<&'de RawValue>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut found = None;
        while let Some(Key(key)) = map.next_key()? {
            if key == self.0 {
                // Last one wins, as in `serde_json::Map`.
                found = Some(map.next_value::<&RawValue>()?);
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(found)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let Some(index) = parse_index(self.0) else {
            while seq.next_element::<IgnoredAny>()?.is_some() {}
            return Ok(None);
        };
        let mut found = None;
        let mut i = 0usize;
        loop {
            if i == index {
                match seq.next_element::<&RawValue>()? {
                    Some(v) => found = Some(v),
                    None => break,
                }
            } else if seq.next_element::<IgnoredAny>()?.is_none() {
                break;
            }
            i = i.saturating_add(1);
        }
        Ok(found)
    }

    // Scalars have no children.
    fn visit_bool<E: de::Error>(self, _: bool) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_u64<E: de::Error>(self, _: u64) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_str<E: de::Error>(self, _: &str) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(None)
    }
}

/// An object key, borrowed from the input unless it holds escapes.
struct Key<'de>(Cow<'de, str>);

impl<'de> de::Deserialize<'de> for Key<'de> {
    fn deserialize<D: de::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct KeyVisitor;
        impl<'de> Visitor<'de> for KeyVisitor {
            type Value = Key<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an object key")
            }
            fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Borrowed(v)))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Owned(v.to_owned())))
            }
        }
        d.deserialize_str(KeyVisitor)
    }
}

/// An array index as [`serde_json::Value::pointer`] reads it.
fn parse_index(s: &str) -> Option<usize> {
    if s.starts_with('+') || (s.starts_with('0') && s.len() != 1) {
        return None;
    }
    s.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::Value;

    fn find(body: &str, pointer: &str) -> Option<String> {
        let doc = parse_document(body.as_bytes()).expect("test bodies are JSON");
        Pointer::new(pointer).find(doc).map(|v| v.get().to_owned())
    }

    #[test]
    fn walks_objects_and_arrays() {
        let body = r#"{"id":"evt_1","data":{"object":{"id":"ch_1"}},"items":[{"a":1},{"a":2}],"a/b":{"~x":3}}"#;
        assert_eq!(find(body, "/id").as_deref(), Some(r#""evt_1""#));
        assert_eq!(find(body, "/data/object/id").as_deref(), Some(r#""ch_1""#));
        assert_eq!(find(body, "/items/1/a").as_deref(), Some("2"));
        assert_eq!(find(body, "/a~1b/~0x").as_deref(), Some("3"));
        assert_eq!(
            find(body, "/items/01/a"),
            None,
            "leading zero is not an index"
        );
        assert_eq!(find(body, "/items/2"), None);
        assert_eq!(find(body, "/id/x"), None, "scalars have no children");
        assert_eq!(find(body, "id"), None, "a pointer starts with /");
        assert_eq!(find(body, "").as_deref(), Some(body));
    }

    #[test]
    fn escaped_keys_and_duplicates() {
        assert_eq!(find(r#"{"\u0069d":"x"}"#, "/id").as_deref(), Some(r#""x""#));
        assert_eq!(
            find(r#"{"id":"a","id":"b"}"#, "/id").as_deref(),
            Some(r#""b""#)
        );
    }

    #[test]
    fn scalars() {
        let doc =
            parse_document(br#"{"s":"a\"b","n":-12.5e3,"z":null,"t":true,"o":{}}"#).expect("valid");
        let get = |p: &str| scalar(Pointer::new(p).find(doc).expect("present"));
        assert_eq!(get("/s"), Scalar::Text(Cow::Owned("a\"b".into())));
        assert_eq!(get("/n"), Scalar::Text(Cow::Borrowed("-12.5e3")));
        assert_eq!(get("/z"), Scalar::Null);
        assert_eq!(get("/t"), Scalar::Other("boolean"));
        assert_eq!(get("/o"), Scalar::Other("object"));
    }

    fn arb_json() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(Value::from),
            "[a-c~/]{0,3}".prop_map(Value::String),
        ];
        leaf.prop_recursive(4, 32, 4, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
                prop::collection::vec(("[a-c~/]{0,2}", inner), 0..4)
                    .prop_map(|kv| Value::Object(kv.into_iter().collect())),
            ]
        })
    }

    #[test]
    fn value_documents_are_those_serde_json_values_accept() {
        let deep = |n: usize| format!("{}1{}", "[".repeat(n), "]".repeat(n));
        for text in [
            deep(127),
            deep(128),
            deep(129),
            "1e400".into(),
            "-1e400".into(),
            "1e308".into(),
            r#""\ud800""#.into(),
            r#""\ud83d\ude00""#.into(),
            r#"{"a":1,"a":2}"#.into(),
            "[1,]".into(),
            "{} ".into(),
            "{} x".into(),
        ] {
            assert_eq!(
                parse_value_document(text.as_bytes()).is_some(),
                serde_json::from_str::<Value>(&text).is_ok(),
                "{text}"
            );
        }
    }

    proptest! {
        #[test]
        fn accepts_what_value_accepts(text in r#"[\[\]{}",: 0-9eE.+\-\\ua-fnrul]{0,24}"#) {
            prop_assert_eq!(
                parse_value_document(text.as_bytes()).is_some(),
                serde_json::from_str::<Value>(&text).is_ok()
            );
        }

        #[test]
        fn agrees_with_value_pointer(doc in arb_json(), tokens in prop::collection::vec("[a-c~/0-3]{0,2}", 0..4)) {
            let pointer: String = tokens.iter().map(|t| format!("/{}", t.replace('~', "~0").replace('/', "~1"))).collect();
            let text = serde_json::to_string(&doc).expect("serialisable");
            let expected = doc.pointer(&pointer).map(|v| serde_json::to_string(v).expect("serialisable"));
            let raw = parse_document(text.as_bytes()).expect("valid");
            let got = Pointer::new(&pointer).find(raw).map(|v| {
                let v: Value = serde_json::from_str(v.get()).expect("valid");
                serde_json::to_string(&v).expect("serialisable")
            });
            prop_assert_eq!(got, expected);
        }
    }
}
