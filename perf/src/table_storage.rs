//! The store's table on MariaDB and SQLite: its statistics brought up to date and its
//! storage read, as `growth` and `growth_floor` do (included by path by each).

/// `ANALYZE TABLE` on MariaDB/MySQL.
pub(crate) async fn analyze_mysql(pool: &sqlx::MySqlPool) -> Result<(), String> {
    sqlx::raw_sql("ANALYZE TABLE idemkey_records")
        .execute(pool)
        .await
        .map(drop)
        .map_err(|e| format!("ANALYZE TABLE: {e}"))
}

/// `ANALYZE` on SQLite, and a checkpoint, so that the WAL is folded into the file.
pub(crate) async fn analyze_sqlite(pool: &sqlx::SqlitePool) -> Result<(), String> {
    sqlx::raw_sql("ANALYZE; PRAGMA wal_checkpoint(TRUNCATE);")
        .execute(pool)
        .await
        .map(drop)
        .map_err(|e| format!("ANALYZE: {e}"))
}

/// MariaDB's `DATA_LENGTH + INDEX_LENGTH` (InnoDB's estimate, in whole pages) and the
/// rows, after [`analyze_mysql`].
pub(crate) async fn storage_mysql(pool: &sqlx::MySqlPool) -> Result<(i64, i64), String> {
    sqlx::query_as(
        "SELECT CAST(DATA_LENGTH + INDEX_LENGTH AS SIGNED),
            (SELECT count(*) FROM idemkey_records)
         FROM information_schema.TABLES
         WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'idemkey_records'",
    )
    .fetch_one(pool)
    .await
    .map_err(|e| format!("reading the storage: {e}"))
}

/// SQLite's pages in use (`(page_count - freelist_count) * page_size`, without the
/// freelist a `VACUUM` would drop) and the rows.
pub(crate) async fn storage_sqlite(pool: &sqlx::SqlitePool) -> Result<(i64, i64), String> {
    sqlx::query_as(
        "SELECT ((SELECT page_count FROM pragma_page_count())
               - (SELECT freelist_count FROM pragma_freelist_count()))
              * (SELECT page_size FROM pragma_page_size()),
            (SELECT count(*) FROM idemkey_records)",
    )
    .fetch_one(pool)
    .await
    .map_err(|e| format!("reading the storage: {e}"))
}
