//! Removing what a bench wrote to a shared server: every key under its Redis prefix.
//! PostgreSQL benches run in a schema of their own and drop it; this module only knows
//! the Redis side, and must not touch keys outside the prefix it is given.

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
