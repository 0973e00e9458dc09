//! Removing what a bench wrote to a shared server: the PostgreSQL schema or the MySQL
//! database it ran in (made here for MySQL), or every key under its Redis prefix. It must
//! not touch anything outside the schema, database or prefix it is given.

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

/// [`unlink_prefix`] on the Redis server `url` names, over a connection of its own.
pub async fn unlink_prefix_at(url: &str, prefix: &str) -> redis::RedisResult<u64> {
    let client = redis::Client::open(url)?;
    let mut conn = client.get_multiplexed_async_connection().await?;
    unlink_prefix(&mut conn, prefix).await
}

/// Makes the database `name` on the MySQL/MariaDB server `url` names (MySQL's schemas are
/// databases) and returns the URL of it: where a bench runs, beside the URL's own.
pub async fn create_mysql_database(url: &str, name: &str) -> Result<String, sqlx::Error> {
    use sqlx::Connection;
    let mut conn = sqlx::MySqlConnection::connect(&driver_url(url)).await?;
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!("CREATE DATABASE `{name}`")))
        .execute(&mut conn)
        .await?;
    conn.close().await?;
    with_database(url, name)
        .ok_or_else(|| sqlx::Error::Configuration("database URL without a scheme".into()))
}

/// Drops the database `name` (made by [`create_mysql_database`]) with everything in it.
pub async fn drop_mysql_database(url: &str, name: &str) -> Result<(), sqlx::Error> {
    use sqlx::Connection;
    let mut conn = sqlx::MySqlConnection::connect(&driver_url(url)).await?;
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "DROP DATABASE IF EXISTS `{name}`"
    )))
    .execute(&mut conn)
    .await?;
    conn.close().await
}

/// `mariadb://` names the same protocol; the driver knows only `mysql://`.
fn driver_url(url: &str) -> String {
    url.replacen("mariadb://", "mysql://", 1)
}

/// `url` naming the database `db` instead of its own (query parameters kept).
pub fn with_database(url: &str, db: &str) -> Option<String> {
    let (base, query) = match url.split_once('?') {
        Some((b, q)) => (b, Some(q)),
        None => (url, None),
    };
    let authority = base.find("://")? + 3;
    let path = base[authority..]
        .find('/')
        .map_or(base.len(), |i| authority + i);
    Some(match query {
        Some(q) => format!("{}/{db}?{q}", &base[..path]),
        None => format!("{}/{db}", &base[..path]),
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn database_replaced_in_urls() {
        let w = super::with_database;
        assert_eq!(
            w("mysql://root@127.0.0.1:3306/test", "b").as_deref(),
            Some("mysql://root@127.0.0.1:3306/b")
        );
        assert_eq!(
            w("mysql://u:p@h/x?ssl-mode=REQUIRED", "b").as_deref(),
            Some("mysql://u:p@h/b?ssl-mode=REQUIRED")
        );
        assert_eq!(w("mysql://h:1", "b").as_deref(), Some("mysql://h:1/b"));
        assert_eq!(w("nonsense", "b"), None);
    }
}
