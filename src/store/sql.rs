//! What the SQL stores (PostgreSQL, SQLite, MySQL) share: table names and conversions.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use sqlx::{ColumnIndex, Decode, Row, Type};

use super::{Claim, StoreError};

/// A validated table name, optionally schema-qualified, kept quoted for SQL.
#[derive(Debug, Clone)]
pub(crate) struct TableName {
    quoted: String,
    /// The unqualified name, for naming the table's index.
    #[cfg_attr(not(any(feature = "postgres", feature = "sqlite")), allow(dead_code))]
    base: String,
}

impl TableName {
    /// Accepts `name` or `schema.name`, each part an identifier of letters, digits and
    /// `_` (not starting with a digit), at most 63 bytes: nothing that needs escaping.
    pub(crate) fn parse(name: &str) -> Result<Self, StoreError> {
        let parts: Vec<&str> = name.split('.').collect();
        let valid = |p: &&str| {
            !p.is_empty()
                && p.len() <= 63
                && p.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
                && !p.as_bytes()[0].is_ascii_digit()
        };
        if parts.len() > 2 || !parts.iter().all(valid) {
            return Err(StoreError::unavailable(
                format!("invalid table name {name:?}"),
                "use letters, digits and '_' (optionally 'schema.table')",
            ));
        }
        Ok(Self {
            quoted: parts
                .iter()
                .map(|p| format!("\"{p}\""))
                .collect::<Vec<_>>()
                .join("."),
            base: parts[parts.len() - 1].to_owned(),
        })
    }

    /// The name as it goes into SQL: `"table"` or `"schema"."table"`.
    pub(crate) fn quoted(&self) -> &str {
        &self.quoted
    }

    /// The name quoted for MySQL: `` `table` `` or `` `schema`.`table` ``.
    #[cfg(feature = "mysql")]
    pub(crate) fn backquoted(&self) -> String {
        self.quoted().replace('"', "`")
    }

    /// `"<table>_<suffix>"`, unqualified.
    #[cfg_attr(not(any(feature = "postgres", feature = "sqlite")), allow(dead_code))]
    pub(crate) fn index_name(&self, suffix: &str) -> String {
        format!("\"{}_{suffix}\"", self.base)
    }
}

/// The `SET` list of the claim's `ON CONFLICT (id) DO UPDATE`: every column takes the
/// claim's value when the existing row has `expired`, and keeps its own otherwise, so the
/// statement returns the live row unchanged (see the PostgreSQL store's docs).
/// `old` qualifies the existing row's columns (`r.` or empty).
#[cfg(any(feature = "postgres", feature = "sqlite"))]
pub(crate) fn claim_sets(expired: &str, old: &str) -> String {
    [
        ("taken_over", format!("{old}payload IS NULL")),
        ("fingerprint", "excluded.fingerprint".to_owned()),
        ("token", "excluded.token".to_owned()),
        ("payload", "NULL".to_owned()),
        ("expires_at", "excluded.expires_at".to_owned()),
    ]
    .iter()
    .map(|(col, new)| format!("{col} = CASE WHEN {expired} THEN {new} ELSE {old}{col} END"))
    .collect::<Vec<_>>()
    .join(",\n  ")
}

/// Like [`claim_sets`], for any columns, in the order given: each `(column, new)` takes
/// `new` when the existing row has `expired` and keeps its own value otherwise. MySQL
/// evaluates the assignments of one `UPDATE` left to right, each seeing the ones
/// before, so the columns that `expired` reads go last.
#[cfg(feature = "mysql")]
pub(crate) fn takeover_sets(expired: &str, columns: &[(&str, &str)]) -> String {
    columns
        .iter()
        .map(|(col, new)| format!("{col} = CASE WHEN {expired} THEN {new} ELSE {col} END"))
        .collect::<Vec<_>>()
        .join(",\n  ")
}

/// Reads the row returned by the claim statement: columns `won`, `taken_over`,
/// `fingerprint`, `payload` and `remaining` (the lease left, converted by `remaining`).
pub(crate) fn decode_claim<'r, R>(
    row: &'r R,
    remaining: impl FnOnce(u64) -> Duration,
) -> Result<Claim, StoreError>
where
    R: Row,
    &'r str: ColumnIndex<R>,
    bool: Decode<'r, R::Database> + Type<R::Database>,
    i64: Decode<'r, R::Database> + Type<R::Database>,
    Vec<u8>: Decode<'r, R::Database> + Type<R::Database>,
{
    let corrupt = |e: sqlx::Error| StoreError::corrupt(format!("the claim returned {e}"));
    if row.try_get::<bool, _>("won").map_err(corrupt)? {
        return Ok(Claim::Acquired {
            takeover: row.try_get("taken_over").map_err(corrupt)?,
        });
    }
    let fingerprint = Bytes::from(row.try_get::<Vec<u8>, _>("fingerprint").map_err(corrupt)?);
    Ok(
        match row
            .try_get::<Option<Vec<u8>>, _>("payload")
            .map_err(corrupt)?
        {
            Some(payload) => Claim::Completed {
                fingerprint,
                payload: payload.into(),
            },
            None => {
                let left: i64 = row.try_get("remaining").map_err(corrupt)?;
                Claim::InProgress {
                    fingerprint,
                    lease_remaining: remaining(u64::try_from(left).unwrap_or(0)),
                }
            }
        },
    )
}

/// A prepared statement's text, built once from a validated [`TableName`].
pub(crate) fn sql(s: &Arc<str>) -> sqlx::AssertSqlSafe<Arc<str>> {
    sqlx::AssertSqlSafe(Arc::clone(s))
}

/// A failed database call: the store is unavailable.
pub(crate) fn unavailable(what: &str, e: sqlx::Error) -> StoreError {
    StoreError::unavailable(format!("{what} failed ({e})"), e)
}

#[cfg(test)]
mod tests {
    use super::TableName;

    #[test]
    fn table_names_are_validated_and_quoted() {
        let t = TableName::parse("billing.idem_1").expect("valid");
        assert_eq!(t.quoted(), "\"billing\".\"idem_1\"");
        assert_eq!(t.index_name("expires_at"), "\"idem_1_expires_at\"");
        for bad in [
            "",
            "a.b.c",
            "1abc",
            "a-b",
            "a\"; DROP TABLE x; --",
            "a.",
            &"x".repeat(64),
        ] {
            assert!(TableName::parse(bad).is_err(), "{bad:?} must be rejected");
        }
    }
}
