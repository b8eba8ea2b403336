//! The payload the engine keeps in a store for a completed key, versioned.
//!
//! Stores keep payloads as opaque bytes; this module is the only place that knows their
//! layout. Version 1:
//!
//! ```text
//! "IKR" 0x01  kind:u8  ...
//!   kind 0, a response:  status:u16  count:u16  (name_len:u16 name value_len:u32 value)*  body...
//!   kind 1, too large:   status:u16  size_at_least:u64
//!   kind 2, a value:     JSON bytes (function-level API)
//! ```
//!
//! Integers are big-endian. A reader meets a newer version as "unreadable" rather than
//! guessing, and the verifier answers `500 record-unreadable` without executing again.

use bytes::{Buf, BufMut, Bytes, BytesMut};
use http::{HeaderMap, HeaderName, HeaderValue, StatusCode};

const MAGIC: &[u8; 3] = b"IKR";
const VERSION: u8 = 1;

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
    },
    TooLarge {
        status: StatusCode,
        size_at_least: u64,
    },
    Value(Bytes),
}

impl Record {
    pub(crate) fn encode(&self) -> Bytes {
        let mut out = BytesMut::new();
        out.put_slice(MAGIC);
        out.put_u8(VERSION);
        match self {
            Self::Response {
                status,
                headers,
                body,
            } => {
                let size: usize = headers
                    .iter()
                    .map(|(n, v)| 6 + n.as_str().len() + v.len())
                    .sum();
                out.reserve(8 + size + body.len());
                out.put_u8(KIND_RESPONSE);
                out.put_u16(status.as_u16());
                // Header counts and lengths fit: hyper limits headers far below these.
                let count = headers.len().min(usize::from(u16::MAX));
                out.put_u16(count as u16);
                for (n, v) in headers.iter().take(count) {
                    out.put_u16(n.as_str().len() as u16);
                    out.put_slice(n.as_str().as_bytes());
                    out.put_u32(v.len() as u32);
                    out.put_slice(v.as_bytes());
                }
                out.put_slice(body);
            }
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
        if version != VERSION {
            return Err(format!(
                "record version {version}, this build reads version {VERSION}; upgrade idemkey"
            ));
        }
        let kind = b[4];
        b.advance(5);
        let short = || "record truncated".to_owned();
        let status = |code: u16| {
            StatusCode::from_u16(code).map_err(|_| format!("invalid status {code} in record"))
        };
        match kind {
            KIND_RESPONSE => {
                if b.remaining() < 4 {
                    return Err(short());
                }
                let status = status(b.get_u16())?;
                let count = b.get_u16();
                let mut headers = HeaderMap::with_capacity(usize::from(count));
                for _ in 0..count {
                    if b.remaining() < 2 {
                        return Err(short());
                    }
                    let nlen = usize::from(b.get_u16());
                    if b.remaining() < nlen + 4 {
                        return Err(short());
                    }
                    let name = HeaderName::from_bytes(&b.split_to(nlen))
                        .map_err(|_| "invalid header name in record".to_owned())?;
                    let vlen = b.get_u32() as usize;
                    if b.remaining() < vlen {
                        return Err(short());
                    }
                    let value = HeaderValue::from_maybe_shared(b.split_to(vlen))
                        .map_err(|_| "invalid header value in record".to_owned())?;
                    headers.append(name, value);
                }
                Ok(Self::Response {
                    status,
                    headers,
                    body: b,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips() {
        let mut headers = HeaderMap::new();
        headers.insert("content-type", HeaderValue::from_static("application/json"));
        headers.append("x-multi", HeaderValue::from_static("a"));
        headers.append("x-multi", HeaderValue::from_static("b"));
        for r in [
            Record::Response {
                status: StatusCode::CREATED,
                headers,
                body: Bytes::from_static(b"{\"id\":1}"),
            },
            Record::Response {
                status: StatusCode::OK,
                headers: HeaderMap::new(),
                body: Bytes::new(),
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

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        for bad in [
            &b""[..],
            b"IKR",
            b"IKR\x02\x00",
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
