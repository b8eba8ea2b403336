//! What the SQL stores (PostgreSQL, SQLite) share: table names and conversions.

use std::time::Duration;

use super::StoreError;

/// A validated table name, optionally schema-qualified, kept quoted for SQL.
#[derive(Debug, Clone)]
pub(crate) struct TableName {
    quoted: String,
    /// The unqualified name, for naming the table's index.
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

    /// `true` when a schema was named.
    pub(crate) fn is_qualified(&self) -> bool {
        self.quoted.contains('.')
    }

    /// The name as it goes into SQL: `"table"` or `"schema"."table"`.
    pub(crate) fn quoted(&self) -> &str {
        &self.quoted
    }

    /// `"<table>_<suffix>"`, unqualified.
    pub(crate) fn index_name(&self, suffix: &str) -> String {
        format!("\"{}_{suffix}\"", self.base)
    }
}

/// A duration in whole microseconds, saturating.
pub(crate) fn micros(d: Duration) -> i64 {
    i64::try_from(d.as_micros()).unwrap_or(i64::MAX / 2)
}

/// A failed database call: the store is unavailable.
pub(crate) fn unavailable(what: &str, e: sqlx::Error) -> StoreError {
    StoreError::unavailable(what.to_owned(), e)
}

#[cfg(test)]
mod tests {
    use super::TableName;

    #[test]
    fn table_names_are_validated_and_quoted() {
        let t = TableName::parse("billing.idem_1").expect("valid");
        assert_eq!(t.quoted(), "\"billing\".\"idem_1\"");
        assert_eq!(t.index_name("expires_at"), "\"idem_1_expires_at\"");
        assert!(t.is_qualified());
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
