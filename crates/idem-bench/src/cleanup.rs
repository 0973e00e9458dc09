//! Removing what a bench wrote to a shared server: the PostgreSQL schema it ran in, or
//! every key under its Redis prefix. It must not touch anything outside the schema or
//! prefix it is given.

/// Drops the schema a bench ran in, with everything in it.
pub async fn drop_schema(pool: &sqlx::PgPool, schema: &str) -> Result<(), sqlx::Error> {
    sqlx::query(&format!("DROP SCHEMA IF EXISTS \"{schema}\" CASCADE"))
        .execute(pool)
        .await?;
    Ok(())
}

/// Removes every key under `prefix:`, in SCAN batches.
pub async fn unlink_prefix<C>(conn: &mut C, prefix: &str) -> Result<(), redis::RedisError>
where
    C: redis::aio::ConnectionLike + Send,
{
    let pattern = format!("{prefix}:*");
    let mut cursor: u64 = 0;
    loop {
        let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(&pattern)
            .arg("COUNT")
            .arg(1000)
            .query_async(conn)
            .await?;
        if !keys.is_empty() {
            let _: () = redis::cmd("UNLINK").arg(&keys).query_async(conn).await?;
        }
        if next == 0 {
            return Ok(());
        }
        cursor = next;
    }
}
