//! What the SQL journals (SQLite, PostgreSQL) share: the schema, the statements, and
//! reading an operation back from a row, and the journals' own [`TableName`] (the
//! outbox shares nothing with the verifier's stores, so its features never build them).

use std::sync::Arc;

use http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode};
use sqlx::{ColumnIndex, Decode, Row, Type};

use super::journal::{JournalError, Operation, Outcome, from_millis, to_millis};
use crate::IdempotencyKey;

/// The journals' table unless configured otherwise.
pub(crate) const DEFAULT_TABLE: &str = "idemkey_outbox";

const COLUMNS: &str = "id, key, method, url, headers, body, created, attempts, status, replayed,
  final_attempts, response_headers, response_body, truncated, completed";

/// The statements of a journal over one table. The writer's are multi-row, made for
/// each batch by [`Statements::insert_many`] and its siblings: one statement per kind of
/// write per batch, so a batch costs a few round trips to the database whatever its size.
pub(crate) struct Statements {
    table: String,
    pub(crate) schema: String,
    pub(crate) insert: Arc<str>,
    pub(crate) get: Arc<str>,
    pub(crate) pending: Arc<str>,
}

impl Statements {
    /// The statements over `table`, whose byte columns have type `bytes` (`BLOB`,
    /// `BYTEA`). An operation is pending while its `status` is NULL.
    pub(crate) fn new(table: &TableName, bytes: &str) -> Self {
        let t = table.quoted();
        let pending_index = table.index_name("pending");
        Self {
            table: t.to_owned(),
            schema: format!(
                "CREATE TABLE IF NOT EXISTS {t} (
    id               TEXT    PRIMARY KEY,
    key              TEXT    NOT NULL,
    method           TEXT    NOT NULL,
    url              TEXT    NOT NULL,
    headers          {bytes} NOT NULL,
    body             {bytes} NOT NULL,
    created          BIGINT  NOT NULL,
    attempts         BIGINT  NOT NULL,
    status           INTEGER,
    replayed         BOOLEAN,
    final_attempts   BIGINT,
    response_headers {bytes},
    response_body    {bytes},
    truncated        BOOLEAN,
    completed        BIGINT
);
CREATE INDEX IF NOT EXISTS {pending_index} ON {t} (created) WHERE status IS NULL;"
            ),
            insert: format!(
                "INSERT INTO {t} ({COLUMNS})
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15)
ON CONFLICT (id) DO NOTHING"
            )
            .into(),
            get: format!("SELECT {COLUMNS} FROM {t} WHERE id = $1").into(),
            pending: format!(
                "SELECT {COLUMNS} FROM {t} WHERE status IS NULL ORDER BY created, id LIMIT $1"
            )
            .into(),
        }
    }

    /// Inserts `n` operations (each bound as `bind_operation!` binds one), skipping the
    /// ids that exist; returns `{tag}id` for each inserted (`tag`: leading columns that
    /// tell this statement's rows apart). Parameters as [`params`] writes them.
    pub(crate) fn insert_many(&self, first: Option<usize>, n: usize, tag: &str) -> String {
        format!(
            "INSERT INTO {} ({COLUMNS})\nVALUES {}\nON CONFLICT (id) DO NOTHING RETURNING {tag}id",
            self.table,
            params(first, n, 15)
        )
    }

    /// Adds one to the attempts of `n` pending operations (their ids bound); returns
    /// `{tag}id, attempts` of each one changed.
    pub(crate) fn begin_attempt_many(&self, first: Option<usize>, n: usize, tag: &str) -> String {
        format!(
            "UPDATE {} SET attempts = attempts + 1 WHERE status IS NULL AND id IN {}\n\
             RETURNING {tag}id, attempts",
            self.table,
            params(first, 1, n)
        )
    }

    /// Records the outcomes of `n` pending operations (each bound as `bind_outcome!`
    /// binds one); returns `{tag}id` of each recorded. `VALUES` names its columns
    /// `column1`.. in SQLite and PostgreSQL alike.
    pub(crate) fn complete_many(&self, first: Option<usize>, n: usize, tag: &str) -> String {
        format!(
            "UPDATE {} SET status = v.column2, replayed = v.column3, final_attempts = v.column4,
  response_headers = v.column5, response_body = v.column6, truncated = v.column7,
  completed = v.column8
FROM (VALUES {}) AS v
WHERE id = v.column1 AND status IS NULL RETURNING {tag}id",
            self.table,
            params(first, n, 8)
        )
    }

    /// Reads `n` operations (their ids bound), as [`Statements::get`] reads one, each
    /// row led by `tag`.
    pub(crate) fn get_many(&self, first: Option<usize>, n: usize, tag: &str) -> String {
        format!(
            "SELECT {tag}{COLUMNS} FROM {} WHERE id IN {}",
            self.table,
            params(first, 1, n)
        )
    }
}

/// `n` rows of `width` parameters: numbered from `$first` on (`($1, $2), ($3, $4)` for
/// 1, 2 and 2), or anonymous (`?`) without `first`. SQLite looks each numbered parameter
/// up in a list as it parses and binds (quadratic in a statement's parameters), so its
/// multi-row statements take anonymous ones.
fn params(first: Option<usize>, n: usize, width: usize) -> String {
    let mut out = String::with_capacity(n * width * 6);
    for row in 0..n {
        if row > 0 {
            out.push_str(", ");
        }
        out.push('(');
        for col in 0..width {
            if col > 0 {
                out.push_str(", ");
            }
            match first {
                Some(first) => {
                    out.push('$');
                    out.push_str(&(first + row * width + col).to_string());
                }
                None => out.push('?'),
            }
        }
        out.push(')');
    }
    out
}

/// An operation's columns as owned values, in the order of the insert's parameters.
pub(crate) struct OperationRow {
    pub(crate) id: String,
    pub(crate) key: String,
    pub(crate) method: String,
    pub(crate) url: String,
    pub(crate) headers: Vec<u8>,
    pub(crate) body: Vec<u8>,
    pub(crate) created: i64,
    pub(crate) attempts: i64,
    pub(crate) outcome: Option<OutcomeRow>,
}

/// An outcome's columns, in the order of the complete's parameters `$2..`.
pub(crate) struct OutcomeRow {
    pub(crate) status: i32,
    pub(crate) replayed: bool,
    pub(crate) attempts: i64,
    pub(crate) headers: Vec<u8>,
    pub(crate) body: Vec<u8>,
    pub(crate) truncated: bool,
    pub(crate) completed: i64,
}

impl OperationRow {
    pub(crate) fn new(op: &Operation) -> Self {
        Self {
            id: op.id.clone(),
            key: op.key.as_str().to_owned(),
            method: op.method.as_str().to_owned(),
            url: op.url.clone(),
            headers: encode_headers(&op.headers),
            body: op.body.to_vec(),
            created: to_millis(op.created),
            attempts: i64::from(op.attempts),
            outcome: op.outcome.as_ref().map(OutcomeRow::new),
        }
    }
}

impl OutcomeRow {
    pub(crate) fn new(o: &Outcome) -> Self {
        Self {
            status: i32::from(o.status.as_u16()),
            replayed: o.replayed,
            attempts: i64::from(o.attempts),
            headers: encode_headers(&o.headers),
            body: o.body.to_vec(),
            truncated: o.body_truncated,
            completed: to_millis(o.completed),
        }
    }
}

/// Binds an [`OperationRow`] to the insert (`$1..$15`).
macro_rules! bind_operation {
    ($query:expr, $row:expr) => {{
        let row: $crate::outbox::sql::OperationRow = $row;
        let o = row.outcome;
        $query
            .bind(row.id)
            .bind(row.key)
            .bind(row.method)
            .bind(row.url)
            .bind(row.headers)
            .bind(row.body)
            .bind(row.created)
            .bind(row.attempts)
            .bind(o.as_ref().map(|o| o.status))
            .bind(o.as_ref().map(|o| o.replayed))
            .bind(o.as_ref().map(|o| o.attempts))
            .bind(o.as_ref().map(|o| o.headers.clone()))
            .bind(o.as_ref().map(|o| o.body.clone()))
            .bind(o.as_ref().map(|o| o.truncated))
            .bind(o.as_ref().map(|o| o.completed))
    }};
}

/// Binds an id and an [`OutcomeRow`] to the complete (`$1..$8`).
macro_rules! bind_outcome {
    ($query:expr, $id:expr, $row:expr) => {{
        let o: $crate::outbox::sql::OutcomeRow = $row;
        $query
            .bind($id)
            .bind(o.status)
            .bind(o.replayed)
            .bind(o.attempts)
            .bind(o.headers)
            .bind(o.body)
            .bind(o.truncated)
            .bind(o.completed)
    }};
}

pub(crate) use {bind_operation, bind_outcome};

/// Records `$op` on the connection `$conn` unless its id exists (then reads the stored
/// one): what a journal's `enqueue_in` runs inside the application's transaction
/// (`Result<Enqueued, JournalError>`). A macro so that each journal runs it on its own
/// concrete connection type.
macro_rules! enqueue_on {
    ($conn:expr, $statements:expr, $op:expr) => {
        async {
            use $crate::outbox::Enqueued;
            use $crate::outbox::sql::sql;
            use $crate::outbox::sql::{
                OperationRow, bind_operation, decode_operation, unavailable,
            };
            let (conn, statements, op) = ($conn, $statements, $op);
            let inserted =
                bind_operation!(sqlx::query(sql(&statements.insert)), OperationRow::new(op))
                    .execute(&mut *conn)
                    .await
                    .map_err(|e| unavailable("enqueue", e))?
                    .rows_affected();
            if inserted == 1 {
                Ok::<Enqueued, $crate::outbox::JournalError>(Enqueued::Inserted)
            } else {
                let row = sqlx::query(sql(&statements.get))
                    .bind(op.id.as_str())
                    .fetch_one(&mut *conn)
                    .await
                    .map_err(|e| unavailable("enqueue (reading the existing operation)", e))?;
                Ok(Enqueued::Existing(Box::new(decode_operation(&row)?)))
            }
        }
    };
}

pub(crate) use enqueue_on;

/// Reads an operation back from a row of [`Statements::get`] or
/// [`Statements::pending`].
pub(crate) fn decode_operation<'r, R>(row: &'r R) -> Result<Operation, JournalError>
where
    R: Row,
    &'r str: ColumnIndex<R>,
    bool: Decode<'r, R::Database> + Type<R::Database>,
    i32: Decode<'r, R::Database> + Type<R::Database>,
    i64: Decode<'r, R::Database> + Type<R::Database>,
    String: Decode<'r, R::Database> + Type<R::Database>,
    Vec<u8>: Decode<'r, R::Database> + Type<R::Database>,
{
    let corrupt = |e: sqlx::Error| JournalError::corrupt(format!("an outbox row: {e}"));
    let id: String = row.try_get("id").map_err(corrupt)?;
    let bad = |what: &str| JournalError::corrupt(format!("operation {id:?} has an invalid {what}"));
    let key = IdempotencyKey::new(row.try_get::<String, _>("key").map_err(corrupt)?)
        .map_err(|_| bad("key"))?;
    let method = Method::from_bytes(
        row.try_get::<String, _>("method")
            .map_err(corrupt)?
            .as_bytes(),
    )
    .map_err(|_| bad("method"))?;
    let count = |n: i64| u32::try_from(n).unwrap_or(u32::MAX);
    let outcome = match row.try_get::<Option<i32>, _>("status").map_err(corrupt)? {
        None => None,
        Some(status) => Some(Outcome {
            status: u16::try_from(status)
                .ok()
                .and_then(|s| StatusCode::from_u16(s).ok())
                .ok_or_else(|| bad("status"))?,
            replayed: row
                .try_get::<Option<bool>, _>("replayed")
                .map_err(corrupt)?
                .unwrap_or(false),
            attempts: count(
                row.try_get::<Option<i64>, _>("final_attempts")
                    .map_err(corrupt)?
                    .unwrap_or(0),
            ),
            headers: decode_headers(
                &row.try_get::<Option<Vec<u8>>, _>("response_headers")
                    .map_err(corrupt)?
                    .unwrap_or_default(),
            )?,
            body: row
                .try_get::<Option<Vec<u8>>, _>("response_body")
                .map_err(corrupt)?
                .unwrap_or_default()
                .into(),
            body_truncated: row
                .try_get::<Option<bool>, _>("truncated")
                .map_err(corrupt)?
                .unwrap_or(false),
            completed: from_millis(
                row.try_get::<Option<i64>, _>("completed")
                    .map_err(corrupt)?
                    .unwrap_or(0),
            ),
        }),
    };
    Ok(Operation {
        key,
        method,
        url: row.try_get("url").map_err(corrupt)?,
        headers: decode_headers(&row.try_get::<Vec<u8>, _>("headers").map_err(corrupt)?)?,
        body: row.try_get::<Vec<u8>, _>("body").map_err(corrupt)?.into(),
        created: from_millis(row.try_get("created").map_err(corrupt)?),
        attempts: count(row.try_get("attempts").map_err(corrupt)?),
        outcome,
        id,
    })
}

/// A failed database call: the journal is unavailable.
pub(crate) fn unavailable(what: &str, e: sqlx::Error) -> JournalError {
    JournalError::unavailable(
        format!("outbox journal: {what} failed ({e}); try again later"),
        e,
    )
}

/// A journal's table name, validated as the stores' are.
pub(crate) fn table_name(name: &str) -> Result<TableName, JournalError> {
    TableName::parse(name)
        .map_err(|e| JournalError::unavailable(format!("outbox journal table {name:?}: {e}"), e))
}

/// A journal's table, optionally schema-qualified, kept quoted for SQL.
///
/// Each part is an identifier of letters, digits and `_`, not starting with a digit, at
/// most 63 bytes (PostgreSQL's limit): nothing that needs escaping, the same rule the
/// verifier's SQL stores apply to theirs.
#[derive(Debug, Clone)]
pub(crate) struct TableName {
    /// `"table"` or `"schema"."table"`.
    quoted: String,
    /// The unqualified name, for naming the table's index.
    base: String,
}

/// A table name that [`TableName::parse`] refused.
#[derive(Debug, thiserror::Error)]
#[error("invalid table name {0:?}: use letters, digits and '_' (optionally 'schema.table')")]
pub(crate) struct InvalidTableName(String);

impl TableName {
    /// Accepts `name` or `schema.name`.
    pub(crate) fn parse(name: &str) -> Result<Self, InvalidTableName> {
        let identifier = |p: &str| {
            p.len() <= 63
                && p.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
                && p.bytes().next().is_some_and(|b| !b.is_ascii_digit())
        };
        let (schema, base) = match name.split_once('.') {
            Some((schema, base)) => (Some(schema), base),
            None => (None, name),
        };
        if !identifier(base) || !schema.is_none_or(identifier) {
            return Err(InvalidTableName(name.to_owned()));
        }
        Ok(Self {
            quoted: match schema {
                Some(schema) => format!("\"{schema}\".\"{base}\""),
                None => format!("\"{base}\""),
            },
            base: base.to_owned(),
        })
    }

    /// The name as it goes into SQL: `"table"` or `"schema"."table"`.
    pub(crate) fn quoted(&self) -> &str {
        &self.quoted
    }

    /// `"<table>_<suffix>"`, unqualified (an index lives in its table's schema).
    pub(crate) fn index_name(&self, suffix: &str) -> String {
        format!("\"{}_{suffix}\"", self.base)
    }
}

/// A statement kept as shared text, marked safe for sqlx: every statement of a journal
/// is built once from a validated [`TableName`], never from a caller's values.
pub(crate) fn sql(s: &Arc<str>) -> sqlx::AssertSqlSafe<Arc<str>> {
    sqlx::AssertSqlSafe(Arc::clone(s))
}

/// Headers as bytes for a journal column: for each header, its name and its value,
/// each length-prefixed (the crate's framing), so any byte value round-trips.
pub(crate) fn encode_headers(headers: &HeaderMap) -> Vec<u8> {
    let mut out = Vec::new();
    for (name, value) in headers {
        idemkey_core::framing::field(&mut out, name.as_str().as_bytes());
        idemkey_core::framing::field(&mut out, value.as_bytes());
    }
    out
}

/// The inverse of [`encode_headers`].
pub(crate) fn decode_headers(mut bytes: &[u8]) -> Result<HeaderMap, JournalError> {
    fn take<'a>(bytes: &mut &'a [u8]) -> Option<&'a [u8]> {
        let (len, rest) = bytes.split_first_chunk::<8>()?;
        let len = usize::try_from(u64::from_be_bytes(*len)).ok()?;
        if rest.len() < len {
            return None;
        }
        let (field, rest) = rest.split_at(len);
        *bytes = rest;
        Some(field)
    }
    let bad = || JournalError::corrupt("a stored header list cannot be decoded");
    let mut headers = HeaderMap::new();
    while !bytes.is_empty() {
        let name = take(&mut bytes).ok_or_else(bad)?;
        let value = take(&mut bytes).ok_or_else(bad)?;
        let name = HeaderName::from_bytes(name).map_err(|_| bad())?;
        let value = HeaderValue::from_bytes(value).map_err(|_| bad())?;
        headers.append(name, value);
    }
    Ok(headers)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_names_are_identifiers_optionally_qualified() {
        let t = TableName::parse("ops").expect("plain");
        assert_eq!(
            (t.quoted(), t.index_name("pending").as_str()),
            ("\"ops\"", "\"ops_pending\"")
        );
        let t = TableName::parse("app.ops_2").expect("qualified");
        assert_eq!(t.quoted(), "\"app\".\"ops_2\"");
        assert_eq!(t.index_name("pending"), "\"ops_2_pending\"");
        for bad in [
            "",
            "a.b.c",
            ".ops",
            "ops.",
            "1ops",
            "o-ps",
            "o\"ps",
            &"x".repeat(64),
        ] {
            assert!(TableName::parse(bad).is_err(), "{bad:?} was accepted");
        }
    }

    #[test]
    fn headers_round_trip_with_repeats_and_bytes() {
        let mut h = HeaderMap::new();
        h.append("x-a", HeaderValue::from_static("1"));
        h.append("x-a", HeaderValue::from_static("2"));
        h.append(
            "x-b",
            HeaderValue::from_bytes(b"\xfa\xfb").expect("opaque bytes"),
        );
        assert_eq!(decode_headers(&encode_headers(&h)).expect("decodes"), h);
        assert!(decode_headers(b"\0\0\0\0\0\0\0\x09ab").is_err());
    }
}
