//! The payload the engine keeps in a store for a completed key, versioned.
//!
//! Stores keep payloads as opaque bytes; this module is the only place that knows their
//! layout. Version 1:
//!
//! ```text
//! "IKR" 0x01  kind:u8  ...
//!   kind 0, a response:  status:u16  fields  body...
//!   kind 1, too large:   status:u16  size_at_least:u64
//!   kind 2, a value:     JSON bytes (function-level API)
//! fields:  count:u16  (name_len:u16 name value_len:u32 value)*
//! ```
//!
//! Version 2 adds the trailers of a response (gRPC's `grpc-status`, say):
//!
//! ```text
//! "IKR" 0x02  kind:u8  ...
//!   kind 0, a response:  status:u16  fields (headers)  fields (trailers)  body...
//!   kinds 1 and 2 as in version 1
//! ```
//!
//! A response without trailers is still written as version 1, so that instances of an
//! older release read it during a rolling upgrade; version 2 is written only for a
//! response with trailers. Both are read.
//!
//! Integers are big-endian. A reader meets a newer version as "unreadable" rather than
//! guessing, and the verifier answers `500 record-unreadable` without executing again.

use bytes::{Buf, BufMut, Bytes, BytesMut};
use http::{HeaderMap, HeaderName, HeaderValue, StatusCode};

const MAGIC: &[u8; 3] = b"IKR";
/// Records without trailers.
const VERSION: u8 = 1;
/// Responses with trailers.
const VERSION_TRAILERS: u8 = 2;

const KIND_RESPONSE: u8 = 0;
const KIND_TOO_LARGE: u8 = 1;
const KIND_VALUE: u8 = 2;

/// A decoded payload.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Record {
    Response {
        status: StatusCode,
        headers: HeaderMap,
        body: Bytes,
        /// Empty when the response had none.
        trailers: HeaderMap,
    },
    TooLarge {
        status: StatusCode,
        size_at_least: u64,
    },
    Value(Bytes),
}

impl Record {
    pub(crate) fn encode(&self) -> Bytes {
        if let Self::Response {
            status,
            headers,
            body,
            trailers,
        } = self
        {
            return encode_response(
                *status,
                || headers.iter(),
                std::slice::from_ref(body),
                trailers,
            );
        }
        let mut out = BytesMut::new();
        out.put_slice(MAGIC);
        out.put_u8(VERSION);
        match self {
            Self::Response { .. } => {} // above
            Self::TooLarge {
                status,
                size_at_least,
            } => {
                out.put_u8(KIND_TOO_LARGE);
                out.put_u16(status.as_u16());
                out.put_u64(*size_at_least);
            }
            Self::Value(v) => {
                out.reserve(1 + v.len());
                out.put_u8(KIND_VALUE);
                out.put_slice(v);
            }
        }
        out.freeze()
    }

    pub(crate) fn decode(mut b: Bytes) -> Result<Self, String> {
        if b.len() < 5 || &b[..3] != MAGIC {
            return Err("not an idemkey record".into());
        }
        let version = b[3];
        if version != VERSION && version != VERSION_TRAILERS {
            return Err(format!(
                "record version {version}, this build reads versions {VERSION} and {VERSION_TRAILERS}; upgrade idemkey"
            ));
        }
        let kind = b[4];
        b.advance(5);
        let status = |code: u16| {
            StatusCode::from_u16(code).map_err(|_| format!("invalid status {code} in record"))
        };
        match kind {
            KIND_RESPONSE => {
                if b.remaining() < 2 {
                    return Err(short());
                }
                let status = status(b.get_u16())?;
                let headers = get_fields(&mut b)?;
                let trailers = if version == VERSION_TRAILERS {
                    get_fields(&mut b)?
                } else {
                    HeaderMap::new()
                };
                Ok(Self::Response {
                    status,
                    headers,
                    body: b,
                    trailers,
                })
            }
            KIND_TOO_LARGE => {
                if b.remaining() < 10 {
                    return Err(short());
                }
                Ok(Self::TooLarge {
                    status: status(b.get_u16())?,
                    size_at_least: b.get_u64(),
                })
            }
            KIND_VALUE => Ok(Self::Value(b)),
            k => Err(format!("unknown record kind {k}")),
        }
    }
}

/// The payload of a response record whose body is `body`, in pieces (as a streamed
/// body was copied: joined here, once, into the payload), and whose headers are those
/// `headers` yields (a map's, or the storable ones of a response, filtered as they are
/// written; asked twice, to size and to write).
pub(crate) fn encode_response<'h, H, I>(
    status: StatusCode,
    headers: H,
    body: &[Bytes],
    trailers: &HeaderMap,
) -> Bytes
where
    H: Fn() -> I,
    I: Iterator<Item = (&'h HeaderName, &'h HeaderValue)>,
{
    fn size<'f>(fields: impl Iterator<Item = (&'f HeaderName, &'f HeaderValue)>) -> usize {
        fields.map(|(n, v)| 6 + n.as_str().len() + v.len()).sum()
    }
    let body_len: usize = body.iter().map(Bytes::len).sum();
    let mut out = BytesMut::with_capacity(
        MAGIC.len() + 1 + 5 + 2 + size(headers()) + size(trailers.iter()) + body_len,
    );
    out.put_slice(MAGIC);
    let with_trailers = !trailers.is_empty();
    out.put_u8(if with_trailers {
        VERSION_TRAILERS
    } else {
        VERSION
    });
    out.put_u8(KIND_RESPONSE);
    out.put_u16(status.as_u16());
    put_fields(&mut out, headers);
    if with_trailers {
        put_fields(&mut out, || trailers.iter());
    }
    for piece in body {
        out.put_slice(piece);
    }
    out.freeze()
}

fn short() -> String {
    "record truncated".to_owned()
}

/// A header (or trailer) map: its count, then each name and value, length-prefixed.
fn put_fields<'f, F, I>(out: &mut BytesMut, fields: F)
where
    F: Fn() -> I,
    I: Iterator<Item = (&'f HeaderName, &'f HeaderValue)>,
{
    // Counts and lengths fit: hyper limits headers far below these.
    let count = fields().count().min(usize::from(u16::MAX));
    out.put_u16(count as u16);
    for (n, v) in fields().take(count) {
        out.put_u16(n.as_str().len() as u16);
        out.put_slice(n.as_str().as_bytes());
        out.put_u32(v.len() as u32);
        out.put_slice(v.as_bytes());
    }
}

fn get_fields(b: &mut Bytes) -> Result<HeaderMap, String> {
    if b.remaining() < 2 {
        return Err(short());
    }
    let count = b.get_u16();
    // Two more than the record holds: a replay adds its marker header and the server
    // its `Content-Length`, and a map that must grow for them reallocates both tables.
    let mut fields = HeaderMap::with_capacity(usize::from(count) + 2);
    for _ in 0..count {
        if b.remaining() < 2 {
            return Err(short());
        }
        let nlen = usize::from(b.get_u16());
        if b.remaining() < nlen + 4 {
            return Err(short());
        }
        // Parsed from the record's bytes in place: a name is copied into its own
        // storage (or is a standard one), so no shared handle on the record is needed.
        let name = HeaderName::from_bytes(&b[..nlen])
            .map_err(|_| "invalid header name in record".to_owned())?;
        b.advance(nlen);
        let vlen = b.get_u32() as usize;
        if b.remaining() < vlen {
            return Err(short());
        }
        let value = HeaderValue::from_maybe_shared(b.split_to(vlen))
            .map_err(|_| "invalid header value in record".to_owned())?;
        fields.append(name, value);
    }
    Ok(fields)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips() {
        let mut headers = HeaderMap::new();
        headers.insert("content-type", HeaderValue::from_static("application/json"));
        headers.append("x-multi", HeaderValue::from_static("a"));
        headers.append("x-multi", HeaderValue::from_static("b"));
        let mut trailers = HeaderMap::new();
        trailers.insert("grpc-status", HeaderValue::from_static("0"));
        for r in [
            Record::Response {
                status: StatusCode::CREATED,
                headers: headers.clone(),
                body: Bytes::from_static(b"{\"id\":1}"),
                trailers: HeaderMap::new(),
            },
            Record::Response {
                status: StatusCode::OK,
                headers: HeaderMap::new(),
                body: Bytes::new(),
                trailers: HeaderMap::new(),
            },
            Record::Response {
                status: StatusCode::OK,
                headers,
                body: Bytes::from_static(b"\0\0\0\0\x02hi"),
                trailers,
            },
            Record::TooLarge {
                status: StatusCode::OK,
                size_at_least: 1 << 40,
            },
            Record::Value(Bytes::from_static(b"[1,2]")),
        ] {
            assert_eq!(Record::decode(r.encode()), Ok(r));
        }
    }

    /// A record written by an earlier release (version 1, no trailers) still decodes,
    /// and a response without trailers is still written so.
    #[test]
    fn version_1_records_still_decode_and_are_still_written() {
        let v1 = b"IKR\x01\x00\x00\xc9\x00\x01\x00\x01a\x00\x00\x00\x01bbody";
        let r = Record::decode(Bytes::from_static(v1)).expect("a version 1 record");
        let Record::Response {
            status,
            headers,
            body,
            trailers,
        } = &r
        else {
            panic!("a response: {r:?}");
        };
        assert_eq!(
            (status.as_u16(), &headers["a"], &body[..]),
            (201, &HeaderValue::from_static("b"), &b"body"[..])
        );
        assert!(trailers.is_empty());
        assert_eq!(&r.encode()[..], v1);
    }

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        for bad in [
            &b""[..],
            b"IKR",
            b"IKR\x03\x00",
            b"IKR\x02\x00\x00\xc8\x00\x00",
            b"IKR\x01\x09",
            b"IKR\x01\x00\x00",
            b"IKR\x01\x00\x00\xc8\x00\x01\x00\x05ab",
            b"IKR\x01\x00\x00\xc8\x00\x01\x00\x01a\xff\xff\xff\xff",
            b"IKR\x01\x01\x00\xc8",
            b"XXX\x01\x02",
        ] {
            assert!(
                Record::decode(Bytes::copy_from_slice(bad)).is_err(),
                "{bad:?}"
            );
        }
    }
}
