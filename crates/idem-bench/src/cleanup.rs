//! Removing what a bench wrote to a shared server: the PostgreSQL schema it ran in, or
//! every key under its Redis prefix. It must not touch anything outside the schema or
//! prefix it is given.

/// Drops the schema a bench ran in, with everything in it.
pub async fn drop_schema(pool: &sqlx::PgPool, schema: &str) -> Result<(), sqlx::Error> {
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "DROP SCHEMA IF EXISTS \"{schema}\" CASCADE"
    )))
    .execute(pool)
    .await?;
    Ok(())
}

/// Removes every key under `prefix:` (the Redis store's own helper).
pub use idem_redis::unlink_prefix;
