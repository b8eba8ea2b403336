//! How many records a store holds, and how much storage they take.
//!
//! A store holds about one record per new key over the retention, plus the expired
//! records it has not removed yet. Each completed record costs a fixed number of bytes
//! (the hashed id, the fingerprint, the token, the times, the stored status and
//! headers, the store's own row, key or item overhead and its indexes) plus about one
//! byte per byte of the stored response body. Both figures were measured per store by
//! idemkey's `bytes_per_record` program (`perf/`; `BENCHMARKS.md` has the method and
//! the run), and are kept here, in one place, for the docs and for `idemkey sizing`.
//!
//! ```
//! use std::time::Duration;
//! use idemkey::store::sizing::{StoreKind, Workload, estimate};
//!
//! let store: StoreKind = "postgres://app@db/app".parse()?;
//! let workload = Workload::new(1000.0, Duration::from_secs(24 * 3600), 400);
//! let e = estimate(store, &workload)?;
//! // 1000 new keys a second for a day, plus one sweep period (5 min) of expired ones.
//! assert_eq!(e.live_records, 86_400_000);
//! assert_eq!(e.expired_records, 300_000);
//! assert_eq!(e.records, 86_700_000);
//! assert_eq!(e.bytes, e.records * e.bytes_per_record);
//! # Ok::<(), idemkey::store::sizing::SizingError>(())
//! ```
//!
//! What the figures leave out: in-progress claims (the rate times the lease, a few
//! seconds' worth), a SQL table's dead rows until vacuumed or purged, free pages a
//! database keeps after deletions, write-ahead logs, replicas and backups, and Redis's
//! fragmentation (`mem_fragmentation_ratio`). Treat an estimate as the floor to
//! provision from, not the ceiling.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

/// The kinds of store idemkey ships, as [`open`](super::open) names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum StoreKind {
    /// [`MemoryStore`](super::MemoryStore): the process's resident memory.
    Memory,
    /// `SqliteStore`: the database file.
    Sqlite,
    /// `PostgresStore`: the table, its TOAST table and its indexes.
    Postgres,
    /// `MySqlStore` (MySQL or MariaDB, InnoDB): data and indexes.
    MySql,
    /// `RedisStore`: Redis's `used_memory`.
    Redis,
    /// `DynamoStore`: DynamoDB's item size (what it bills storage by).
    DynamoDb,
}

/// What one completed record costs in a store: `bytes_per_record` plus
/// `bytes_per_response_byte` times the stored response body's length.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Footprint {
    /// The fixed cost of a record, whatever its response (status and a `content-type`
    /// header included), in bytes.
    pub bytes_per_record: u64,
    /// What each byte of the stored response body adds, in bytes.
    pub bytes_per_response_byte: f64,
    /// The figure the cost was read from.
    pub measured_as: &'static str,
}

impl Footprint {
    /// The bytes one completed record with a body of `response_bytes` costs.
    ///
    /// ```
    /// use idemkey::store::sizing::StoreKind;
    /// let f = StoreKind::Redis.footprint();
    /// assert!(f.record_bytes(1000) > f.record_bytes(0));
    /// assert_eq!(f.record_bytes(0), f.bytes_per_record);
    /// ```
    #[must_use]
    pub fn record_bytes(&self, response_bytes: u64) -> u64 {
        // f64 to u64 saturates (and NaN is 0): no overflow for any input.
        let body = (self.bytes_per_response_byte * response_bytes as f64).ceil() as u64;
        self.bytes_per_record.saturating_add(body)
    }
}

impl StoreKind {
    /// Every kind, in the order of the docs' tables.
    pub const ALL: [Self; 6] = [
        Self::Memory,
        Self::Sqlite,
        Self::Postgres,
        Self::MySql,
        Self::Redis,
        Self::DynamoDb,
    ];

    /// The kind's name: `memory`, `sqlite`, `postgres`, `mysql`, `redis`, `dynamodb`.
    ///
    /// ```
    /// use idemkey::store::sizing::StoreKind;
    /// assert_eq!(StoreKind::MySql.name(), "mysql");
    /// ```
    #[must_use]
    pub const fn name(self) -> &'static str {
        match self {
            Self::Memory => "memory",
            Self::Sqlite => "sqlite",
            Self::Postgres => "postgres",
            Self::MySql => "mysql",
            Self::Redis => "redis",
            Self::DynamoDb => "dynamodb",
        }
    }

    /// What a completed record costs in this store, as measured (see the module docs).
    ///
    /// ```
    /// use idemkey::store::sizing::StoreKind;
    /// for kind in StoreKind::ALL {
    ///     assert!(kind.footprint().bytes_per_record > 0, "{kind}");
    /// }
    /// ```
    #[must_use]
    pub const fn footprint(self) -> Footprint {
        // Measured by `cargo run --release -p perf --bin bytes_per_record` (BENCHMARKS.md,
        // "Storage per record"); rerun it after changing a store's schema or encoding.
        match self {
            Self::Memory => Footprint {
                bytes_per_record: 290,
                bytes_per_response_byte: 1.00,
                measured_as: "resident memory of the process",
            },
            Self::Sqlite => Footprint {
                bytes_per_record: 259,
                bytes_per_response_byte: 1.08,
                measured_as: "database file (page_count * page_size)",
            },
            Self::Postgres => Footprint {
                bytes_per_record: 253,
                bytes_per_response_byte: 1.37,
                measured_as: "pg_total_relation_size after VACUUM ANALYZE",
            },
            Self::MySql => Footprint {
                bytes_per_record: 407,
                bytes_per_response_byte: 1.84,
                measured_as: "InnoDB DATA_LENGTH + INDEX_LENGTH after ANALYZE TABLE",
            },
            Self::Redis => Footprint {
                bytes_per_record: 271,
                bytes_per_response_byte: 1.23,
                measured_as: "Redis used_memory",
            },
            Self::DynamoDb => Footprint {
                bytes_per_record: 253,
                bytes_per_response_byte: 1.00,
                measured_as: "DynamoDB item size (names and values, AWS's rules)",
            },
        }
    }

    /// How long an expired record stays in this store before it is removed, by default:
    /// what [`estimate`] adds to the retention for the expired records not yet removed.
    ///
    /// - memory: 5 s (it sweeps itself every 5 s while claims arrive);
    /// - SQLite, PostgreSQL, MySQL: 5 minutes, one period of
    ///   [`spawn_sweeper`](super::spawn_sweeper) as the store guide runs it (`idemkey
    ///   sweep` from cron: your cron period);
    /// - Redis: none (Redis expires keys by their TTL itself, lazily and by sampling ten
    ///   times a second);
    /// - DynamoDB: 2 days (its TTL deletes expired items "typically within a few days";
    ///   until then they count for storage).
    ///
    /// ```
    /// use idemkey::store::sizing::StoreKind;
    /// use std::time::Duration;
    /// assert_eq!(StoreKind::Postgres.expired_allowance(), Duration::from_secs(300));
    /// ```
    #[must_use]
    pub const fn expired_allowance(self) -> Duration {
        match self {
            Self::Memory => Duration::from_secs(5),
            Self::Sqlite | Self::Postgres | Self::MySql => Duration::from_secs(300),
            Self::Redis => Duration::ZERO,
            Self::DynamoDb => Duration::from_secs(2 * 24 * 3600),
        }
    }
}

impl fmt::Display for StoreKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Parses a kind's name or a connection string's scheme, as [`open`](super::open) takes
/// them: `postgres`, `postgresql://…`, `mariadb://…`, `rediss://…`, `sqlite://PATH`,
/// `memory://?max_records=N`, `dynamodb://TABLE?…`; names in any case.
///
/// ```
/// use idemkey::store::sizing::StoreKind;
/// assert_eq!("postgres".parse::<StoreKind>()?, StoreKind::Postgres);
/// assert_eq!("mariadb://root@db/app".parse::<StoreKind>()?, StoreKind::MySql);
/// assert_eq!("sqlite://idemkey.db".parse::<StoreKind>()?, StoreKind::Sqlite);
/// assert!("oracle://db".parse::<StoreKind>().is_err());
/// # Ok::<(), idemkey::store::sizing::SizingError>(())
/// ```
impl FromStr for StoreKind {
    type Err = SizingError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let text = text.trim();
        let scheme = text.split_once(':').map_or(text, |(s, _)| s);
        Ok(match scheme.to_ascii_lowercase().as_str() {
            "memory" => Self::Memory,
            "sqlite" => Self::Sqlite,
            "postgres" | "postgresql" => Self::Postgres,
            "mysql" | "mariadb" => Self::MySql,
            "redis" | "rediss" => Self::Redis,
            "dynamodb" => Self::DynamoDb,
            _ => {
                return Err(SizingError(format!(
                    "unknown store {text:?}: use memory, sqlite, postgres, mysql, redis or \
                     dynamodb, or a connection string of one"
                )));
            }
        })
    }
}

/// The traffic a store is sized for.
#[derive(Debug, Clone, PartialEq)]
pub struct Workload {
    /// New keys per second (replays add no record).
    pub rate_per_second: f64,
    /// How long a completed record is kept ([`EngineBuilder::retention`](crate::EngineBuilder::retention)).
    pub retention: Duration,
    /// The typical stored response body, in bytes.
    pub response_bytes: u64,
    /// How long expired records stay before they are removed; `None` for the store's
    /// default ([`StoreKind::expired_allowance`]).
    pub expired_allowance: Option<Duration>,
}

impl Workload {
    /// `rate_per_second` new keys a second, kept for `retention`, with responses of
    /// `response_bytes`; expired records as the store's default.
    ///
    /// ```
    /// use idemkey::store::sizing::Workload;
    /// use std::time::Duration;
    /// let w = Workload::new(50.0, Duration::from_secs(3600), 200);
    /// assert_eq!(w.expired_allowance, None);
    /// ```
    #[must_use]
    pub const fn new(rate_per_second: f64, retention: Duration, response_bytes: u64) -> Self {
        Self {
            rate_per_second,
            retention,
            response_bytes,
            expired_allowance: None,
        }
    }
}

/// What [`estimate`] expects a store to hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Estimate {
    /// The store.
    pub store: StoreKind,
    /// Records within their retention: rate × retention.
    pub live_records: u64,
    /// Expired records not removed yet: rate × the expired allowance.
    pub expired_records: u64,
    /// Both.
    pub records: u64,
    /// The bytes one record costs ([`Footprint::record_bytes`] of the response size).
    pub bytes_per_record: u64,
    /// The storage: records × bytes per record.
    pub bytes: u64,
    /// The expired allowance used.
    pub expired_allowance: Duration,
}

/// Expected records and storage of `store` under `workload`: records ≈ rate ×
/// (retention + expired allowance), each costing the store's [`Footprint`] for the
/// response size. Results saturate at `u64::MAX`.
///
/// ```
/// use idemkey::store::sizing::{StoreKind, Workload, estimate};
/// use std::time::Duration;
///
/// let mut w = Workload::new(10.0, Duration::from_secs(3600), 1024);
/// w.expired_allowance = Some(Duration::ZERO);
/// let e = estimate(StoreKind::Sqlite, &w)?;
/// assert_eq!(e.records, 36_000);
/// assert_eq!(e.bytes_per_record, StoreKind::Sqlite.footprint().record_bytes(1024));
///
/// w.rate_per_second = -1.0;
/// assert!(estimate(StoreKind::Sqlite, &w).is_err());
/// # Ok::<(), idemkey::store::sizing::SizingError>(())
/// ```
///
/// # Errors
///
/// A rate that is negative, not a number or infinite.
pub fn estimate(store: StoreKind, workload: &Workload) -> Result<Estimate, SizingError> {
    let rate = workload.rate_per_second;
    if !rate.is_finite() || rate < 0.0 {
        return Err(SizingError(format!(
            "the rate {rate} is not a number of keys per second"
        )));
    }
    let allowance = workload
        .expired_allowance
        .unwrap_or_else(|| store.expired_allowance());
    // f64 to u64 saturates: no overflow for any rate or duration.
    let count = |d: Duration| (rate * d.as_secs_f64()).ceil() as u64;
    let live_records = count(workload.retention);
    let expired_records = count(allowance);
    let records = live_records.saturating_add(expired_records);
    let bytes_per_record = store.footprint().record_bytes(workload.response_bytes);
    Ok(Estimate {
        store,
        live_records,
        expired_records,
        records,
        bytes_per_record,
        bytes: records.saturating_mul(bytes_per_record),
        expired_allowance: allowance,
    })
}

/// A store name or a workload that cannot be sized; the message says what to fix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SizingError(String);

impl fmt::Display for SizingError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for SizingError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn huge_inputs_saturate_instead_of_overflowing() {
        let w = Workload::new(f64::MAX, Duration::MAX, u64::MAX);
        let e = estimate(StoreKind::DynamoDb, &w).expect("finite");
        assert_eq!(e.records, u64::MAX);
        assert_eq!(e.bytes, u64::MAX);
        assert!(
            estimate(
                StoreKind::Memory,
                &Workload::new(f64::NAN, Duration::ZERO, 0)
            )
            .is_err()
        );
    }

    #[test]
    fn every_kind_parses_from_its_name() {
        for kind in StoreKind::ALL {
            assert_eq!(kind.name().parse::<StoreKind>(), Ok(kind));
            assert_eq!(
                kind.to_string().to_uppercase().parse::<StoreKind>(),
                Ok(kind)
            );
        }
    }
}
