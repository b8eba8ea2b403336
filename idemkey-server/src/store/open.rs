//! Choosing a store by connection string.

use std::fmt;
use std::sync::Arc;

use super::{MemoryStore, MemoryStoreBuilder, Store, StoreError};

/// Opens the store named by `url`, ready to use (SQL schemas created if missing):
///
/// | URL | store | feature |
/// |---|---|---|
/// | `memory` (or `memory://`), `memory://?max_records=N&max_bytes=SIZE` | [`MemoryStore`], bounded (see below) | `server` |
/// | `redis://[:password@]host[:port][/db][?allow_eviction=true]`, `rediss://...` | `RedisStore` (refuses a Redis whose `maxmemory-policy` evicts keys unless `allow_eviction=true`: see `RedisStoreBuilder::allow_eviction`) | `redis` |
/// | `postgres://user[:password]@host[:port]/database` (or `postgresql://`) | `PostgresStore` | `postgres` |
/// | `sqlite://PATH` (`sqlite:///abs/path` or `sqlite://relative/path`; `sqlite://:memory:`, one in-memory database) | `SqliteStore` | `sqlite` |
/// | `mysql://user[:password]@host[:port]/database` (or `mariadb://`) | `MySqlStore` | `mysql` |
/// | `dynamodb://[KEY_ID:SECRET@]TABLE?region=REGION[&endpoint=URL]` | `DynamoStore` (table created if missing; see `DynamoStore::from_url` for credentials) | `dynamodb` |
///
/// Each store is built with its defaults; use its builder (key prefix, table name, pool
/// size, timeouts) for anything else.
///
/// The memory store is bounded: by default 1,000,000 records
/// ([`MemoryStore::DEFAULT_MAX_RECORDS`]) and 512 MiB
/// ([`MemoryStore::DEFAULT_MAX_BYTES`], counting [`MemoryStore::RECORD_OVERHEAD`] plus
/// the fingerprint and the stored response of each record). Its URL parameters set
/// either bound: `max_records` a positive integer, `max_bytes` a positive integer of
/// bytes or one followed by a unit, `B`, `KB`, `MB`, `GB` (powers of 1000) or `KiB`,
/// `MiB`, `GiB` (powers of 1024), in any case: `memory://?max_records=100000&max_bytes=256MiB`.
/// When full, it refuses new keys ([`StoreError::is_full`]; the verifier answers
/// `503 store-full`) and evicts nothing.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), idemkey::store::OpenError> {
/// let store = idemkey::store::open("memory").await?;
/// # let _ = store;
/// let bounded = idemkey::store::open("memory://?max_records=100000&max_bytes=256MiB").await?;
/// # let _ = bounded;
/// let err = idemkey::store::open("memory://?max_records=0").await.err().expect("zero");
/// assert!(err.is_configuration() && err.to_string().contains("max_records"));
/// let err = idemkey::store::open("oracle://db/app").await.err().expect("no Oracle store");
/// assert!(err.is_unsupported());
/// # Ok(()) }
/// ```
///
/// # Errors
///
/// [`OpenError::is_unsupported`] for an unknown scheme or one whose store was not
/// compiled in (the message names the Cargo feature to enable);
/// [`OpenError::is_configuration`] when the store refuses the URL's database, user,
/// password or database number, a Redis runs an evicting `maxmemory-policy` (the message
/// names it, and the override), a SQLite file's directory does not exist, or a memory
/// store's parameter is unknown, repeated or invalid (the message says what to fix);
/// [`OpenError::is_unavailable`] when the store cannot be reached
/// (the message names the host and port tried).
pub async fn open(url: &str) -> Result<Arc<dyn Store>, OpenError> {
    let scheme = url.split_once(':').map_or(url, |(s, _)| s);
    match scheme {
        "memory" => Ok(Arc::new(MemoryStore::from_url(url)?)),
        "redis" | "rediss" => open_redis(url).await,
        "postgres" | "postgresql" => open_postgres(url).await,
        "sqlite" => open_sqlite(url).await,
        "mysql" | "mariadb" => open_mysql(url).await,
        "dynamodb" => open_dynamodb(url).await,
        _ => Err(OpenError::unsupported(format!(
            "unknown store URL scheme {scheme:?}: use memory, redis://, postgres://, \
             sqlite://PATH, mysql:// or dynamodb://TABLE"
        ))),
    }
}

#[cfg(feature = "redis")]
async fn open_redis(url: &str) -> Result<Arc<dyn Store>, OpenError> {
    Ok(Arc::new(super::RedisStore::connect(url).await?))
}

#[cfg(not(feature = "redis"))]
async fn open_redis(url: &str) -> Result<Arc<dyn Store>, OpenError> {
    Err(OpenError::missing_feature(url, "redis"))
}

#[cfg(feature = "postgres")]
async fn open_postgres(url: &str) -> Result<Arc<dyn Store>, OpenError> {
    let store = super::PostgresStore::connect(url).await?;
    store.migrate().await?;
    Ok(Arc::new(store))
}

#[cfg(not(feature = "postgres"))]
async fn open_postgres(url: &str) -> Result<Arc<dyn Store>, OpenError> {
    Err(OpenError::missing_feature(url, "postgres"))
}

#[cfg(feature = "sqlite")]
async fn open_sqlite(url: &str) -> Result<Arc<dyn Store>, OpenError> {
    let path = url.strip_prefix("sqlite://").unwrap_or_default();
    if path.is_empty() {
        return Err(OpenError::unsupported(format!(
            "{url:?} names no file: use sqlite://PATH"
        )));
    }
    Ok(Arc::new(super::SqliteStore::open(path).await?))
}

#[cfg(not(feature = "sqlite"))]
async fn open_sqlite(url: &str) -> Result<Arc<dyn Store>, OpenError> {
    Err(OpenError::missing_feature(url, "sqlite"))
}

#[cfg(feature = "mysql")]
async fn open_mysql(url: &str) -> Result<Arc<dyn Store>, OpenError> {
    let store = super::MySqlStore::connect(url).await?;
    store.migrate().await?;
    Ok(Arc::new(store))
}

#[cfg(not(feature = "mysql"))]
async fn open_mysql(url: &str) -> Result<Arc<dyn Store>, OpenError> {
    Err(OpenError::missing_feature(url, "mysql"))
}

#[cfg(feature = "dynamodb")]
async fn open_dynamodb(url: &str) -> Result<Arc<dyn Store>, OpenError> {
    let store = super::DynamoStore::from_url(url)?;
    store.create_table().await?;
    Ok(Arc::new(store))
}

#[cfg(not(feature = "dynamodb"))]
async fn open_dynamodb(url: &str) -> Result<Arc<dyn Store>, OpenError> {
    Err(OpenError::missing_feature(url, "dynamodb"))
}

/// What a `memory` URL accepts, for the errors.
const MEMORY_URL: &str = "memory, memory:// or memory://?max_records=N&max_bytes=SIZE";

/// The settings of a `memory` URL ([`MemoryStore::from_url`]), not yet checked by the
/// builder (`max_records=0` is refused here, naming the parameter, and there).
pub(super) fn memory_settings(url: &str) -> Result<MemoryStoreBuilder, StoreError> {
    let bad = |what: String| StoreError::configuration(format!("{what}; use {MEMORY_URL}"));
    let Some(rest) = url.strip_prefix("memory") else {
        return Err(bad(format!("{url:?} is not a memory store URL")));
    };
    let query = match rest {
        "" | "://" => return Ok(MemoryStore::builder()),
        _ => match rest.strip_prefix("://?") {
            Some(q) => q,
            None => {
                return Err(bad(format!(
                    "{url:?}: a memory store URL takes no host, path or other form"
                )));
            }
        },
    };
    let mut builder = MemoryStore::builder();
    let (mut records, mut bytes) = (false, false);
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        match name {
            "max_records" if !records => {
                records = true;
                let n = value.parse::<u64>().ok().filter(|n| *n > 0).ok_or_else(|| {
                    StoreError::configuration(format!(
                        "memory store URL parameter max_records={value:?} is not a positive integer: give the most records to hold, as digits (max_records=100000)"
                    ))
                })?;
                builder = builder.max_records(n);
            }
            "max_bytes" if !bytes => {
                bytes = true;
                let b = parse_size(value).ok_or_else(|| {
                    StoreError::configuration(format!(
                        "memory store URL parameter max_bytes={value:?} is not a positive size: give bytes as digits, or digits and a unit, B, KB, MB, GB (powers of 1000) or KiB, MiB, GiB (powers of 1024), up to 2^64 - 1 bytes (max_bytes=256MiB)"
                    ))
                })?;
                builder = builder.max_bytes(b);
            }
            "max_records" | "max_bytes" => {
                return Err(bad(format!(
                    "memory store URL parameter {name} is given twice"
                )));
            }
            _ => {
                return Err(bad(format!(
                    "unknown memory store URL parameter {name:?}: the parameters are max_records and max_bytes"
                )));
            }
        }
    }
    Ok(builder)
}

/// A size: digits, then optionally a unit (`B`, `KB`, `MB`, `GB`, `KiB`, `MiB`, `GiB`,
/// in any case). `None` when malformed, zero or over `u64::MAX`.
fn parse_size(s: &str) -> Option<u64> {
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (digits, unit) = s.split_at(split);
    if digits.is_empty() {
        return None;
    }
    let n: u64 = digits.parse().ok()?;
    let scale: u64 = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "kb" => 1000,
        "mb" => 1000 * 1000,
        "gb" => 1000 * 1000 * 1000,
        "kib" => 1 << 10,
        "mib" => 1 << 20,
        "gib" => 1 << 30,
        _ => return None,
    };
    n.checked_mul(scale).filter(|b| *b > 0)
}

/// Why [`open`] could not open a store.
#[derive(Debug)]
pub struct OpenError {
    kind: OpenErrorKind,
}

#[derive(Debug)]
enum OpenErrorKind {
    Unsupported(String),
    Store(StoreError),
}

impl OpenError {
    fn unsupported(message: String) -> Self {
        Self {
            kind: OpenErrorKind::Unsupported(message),
        }
    }

    #[cfg_attr(
        all(
            feature = "redis",
            feature = "postgres",
            feature = "sqlite",
            feature = "mysql",
            feature = "dynamodb"
        ),
        allow(dead_code)
    )]
    fn missing_feature(url: &str, feature: &str) -> Self {
        let scheme = url.split_once(':').map_or(url, |(s, _)| s);
        Self::unsupported(format!(
            "{scheme}:// stores need idemkey's `{feature}` feature, which this build lacks: \
             run idemkey's examples with `--features {feature}` (or `--all-features`); in \
             your own crate, enable it in Cargo.toml (idemkey = {{ features = \
             [\"{feature}\"] }})"
        ))
    }

    /// `true` when the URL's scheme is unknown or its store was not compiled in.
    #[must_use]
    pub fn is_unsupported(&self) -> bool {
        matches!(self.kind, OpenErrorKind::Unsupported(_))
    }

    /// `true` when the store was recognised but could not be reached or set up: an
    /// outage, worth retrying later.
    #[must_use]
    pub fn is_unavailable(&self) -> bool {
        matches!(&self.kind, OpenErrorKind::Store(e) if e.is_unavailable())
    }

    /// `true` when the store answered but refused what the URL asks for (a database
    /// that does not exist, an unknown user, a wrong password, a Redis database number
    /// out of range, a Redis whose `maxmemory-policy` evicts records), the URL or a
    /// setting is invalid, or a SQLite file's directory does not exist: retrying will
    /// not help, the message says what to fix
    /// ([`StoreError::is_configuration`]).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// # #[cfg(feature = "sqlite")] {
    /// let err = idemkey::store::open("sqlite://no/such/dir/records.db").await.err().expect("no directory");
    /// assert!(err.is_configuration(), "{err}");
    /// # }
    /// # }
    /// ```
    #[must_use]
    pub fn is_configuration(&self) -> bool {
        matches!(&self.kind, OpenErrorKind::Store(e) if e.is_configuration())
    }
}

impl From<StoreError> for OpenError {
    fn from(e: StoreError) -> Self {
        Self {
            kind: OpenErrorKind::Store(e),
        }
    }
}

impl fmt::Display for OpenError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            OpenErrorKind::Unsupported(m) => f.write_str(m),
            OpenErrorKind::Store(e) => write!(f, "could not open the store: {e}"),
        }
    }
}

impl std::error::Error for OpenError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match &self.kind {
            OpenErrorKind::Unsupported(_) => None,
            OpenErrorKind::Store(e) => Some(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{open, parse_size};

    #[test]
    fn sizes_parse_with_and_without_units() {
        assert_eq!(parse_size("1"), Some(1));
        assert_eq!(parse_size("256MiB"), Some(256 << 20));
        assert_eq!(parse_size("256mib"), Some(256 << 20));
        assert_eq!(parse_size("2KB"), Some(2000));
        assert_eq!(parse_size("3GB"), Some(3_000_000_000));
        assert_eq!(parse_size("1GiB"), Some(1 << 30));
        assert_eq!(parse_size("7B"), Some(7));
        for bad in [
            "",
            "0",
            "0MiB",
            "-1",
            "MiB",
            "1.5GiB",
            "1 MiB",
            "1TiB",
            "99999999999999999999",
            "18446744073709551615GiB",
            "+1",
        ] {
            assert_eq!(parse_size(bad), None, "{bad:?}");
        }
    }

    #[tokio::test]
    async fn unknown_and_empty_urls_are_unsupported() {
        for url in ["oracle://x/y", "", "file:///tmp/x"] {
            let err = open(url).await.err().expect("unsupported");
            assert!(err.is_unsupported(), "{url}: {err}");
        }
        let msg = super::OpenError::missing_feature("redis://h", "redis").to_string();
        assert!(msg.contains("`redis` feature"), "{msg}");
        assert!(msg.contains("--features redis"), "{msg}");
    }
}
