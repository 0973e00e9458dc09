//! The campaign's database: which kind of server it lives on (PostgreSQL or
//! MySQL/MariaDB) and the few statements that differ between them.
//!
//! Owns creating, dropping and killing the sessions of the campaign's database, the
//! snapshot the checker reads in, the server clock in milliseconds, and a connection
//! that runs the checker's SQL on either server: queries are written once with `$n`
//! placeholders (turned into `?` on MySQL) and their rows come back as plain integers
//! and text. It must not know the service's tables beyond what callers pass in.

use reqwest::Url;
use sqlx::{Connection, MySqlConnection, PgConnection, Row};

use crate::ChaosError;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Postgres,
    MySql,
}

impl Backend {
    pub fn of(url: &Url) -> Result<Backend, ChaosError> {
        match url.scheme() {
            "postgres" | "postgresql" => Ok(Backend::Postgres),
            "mysql" => Ok(Backend::MySql),
            other => Err(ChaosError::Setup(format!(
                "--database-url must be a postgres:// or mysql:// URL, not {other}:// \
                 (the campaign creates a database of its own on that server)"
            ))),
        }
    }

    fn of_str(url: &str) -> Result<Backend, sqlx::Error> {
        let u = Url::parse(url).map_err(|e| sqlx::Error::Configuration(e.into()))?;
        Backend::of(&u).map_err(|e| sqlx::Error::Configuration(e.to_string().into()))
    }

    /// What links and faults name the server.
    pub fn name(self) -> &'static str {
        match self {
            Backend::Postgres => "postgres",
            Backend::MySql => "mysql",
        }
    }

    pub fn default_port(self) -> u16 {
        match self {
            Backend::Postgres => 5432,
            Backend::MySql => 3306,
        }
    }

    /// Milliseconds since the epoch by the server's clock, as a 64-bit integer.
    pub fn now_ms(self) -> &'static str {
        match self {
            Backend::Postgres => "(extract(epoch FROM clock_timestamp()) * 1000)::bigint",
            Backend::MySql => "CAST(UNIX_TIMESTAMP(NOW(3)) * 1000 AS SIGNED)",
        }
    }

    /// The records' column named `key` (a reserved word on MySQL).
    pub fn key_column(self) -> &'static str {
        match self {
            Backend::Postgres => "key",
            Backend::MySql => "`key`",
        }
    }

    /// Creates database `name` on the server of `admin_url`.
    pub async fn create_database(self, admin_url: &str, name: &str) -> Result<(), ChaosError> {
        let mut c = Db::connect(admin_url)
            .await
            .map_err(|e| ChaosError::Setup(format!("{}: {e}", self.name())))?;
        c.run(&format!("CREATE DATABASE {name}"))
            .await
            .map_err(|e| ChaosError::Setup(format!("create database {name}: {e}")))?;
        c.close().await;
        Ok(())
    }

    /// Drops database `name`, ending whatever sessions are still on it.
    pub async fn drop_database(
        self,
        admin_url: &str,
        db_url: &str,
        name: &str,
    ) -> Result<(), sqlx::Error> {
        if self == Backend::MySql {
            // DROP DATABASE waits for the metadata locks of sessions still open on it.
            let _ = kill_sessions(db_url, name).await;
        }
        let mut c = Db::connect(admin_url).await?;
        let drop = match self {
            Backend::Postgres => format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"),
            Backend::MySql => format!("DROP DATABASE IF EXISTS {name}"),
        };
        c.run(&drop).await?;
        c.close().await;
        Ok(())
    }
}

/// Ends every session on database `name` but this one: `pg_terminate_backend` on
/// PostgreSQL, `KILL CONNECTION` on MySQL. Returns how many were ended.
pub async fn kill_sessions(db_url: &str, name: &str) -> Result<u64, ChaosError> {
    let mut c = Db::connect(db_url)
        .await
        .map_err(|e| ChaosError::Setup(format!("kill sessions: {e}")))?;
    let killed = match c.backend() {
        Backend::Postgres => c
            .count(
                "SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
                 WHERE datname = $1 AND pid <> pg_backend_pid()) t",
                &[name],
            )
            .await
            .map(|n| n as u64),
        Backend::MySql => {
            let ids = c
                .rows(
                    "SELECT CAST(ID AS SIGNED) FROM information_schema.PROCESSLIST \
                     WHERE DB = $1 AND ID <> CONNECTION_ID()",
                    &[name],
                )
                .await;
            match ids {
                Ok(ids) => {
                    let mut n = 0;
                    for id in ids {
                        let id: i64 = id.get(0)?;
                        // A session may end on its own between the listing and the kill.
                        if c.run(&format!("KILL CONNECTION {id}")).await.is_ok() {
                            n += 1;
                        }
                    }
                    Ok(n)
                }
                Err(e) => Err(e),
            }
        }
    };
    c.close().await;
    killed.map_err(|e| ChaosError::Setup(format!("kill sessions: {e}")))
}

/// One connection to either server.
pub enum Db {
    Pg(PgConnection),
    My(MySqlConnection),
}

/// One value of a row: integers and text are all the checker reads.
#[derive(Debug, Clone, PartialEq)]
pub enum Cell {
    Null,
    Int(i64),
    Text(String),
}

/// One row, server-independent.
#[derive(Debug, Clone)]
pub struct Cells(Vec<Cell>);

pub trait FromCell: Sized {
    fn from_cell(c: &Cell) -> Option<Self>;
}

impl FromCell for i64 {
    fn from_cell(c: &Cell) -> Option<i64> {
        match c {
            Cell::Int(v) => Some(*v),
            _ => None,
        }
    }
}

impl FromCell for String {
    fn from_cell(c: &Cell) -> Option<String> {
        match c {
            Cell::Text(v) => Some(v.clone()),
            _ => None,
        }
    }
}

impl<T: FromCell> FromCell for Option<T> {
    fn from_cell(c: &Cell) -> Option<Option<T>> {
        match c {
            Cell::Null => Some(None),
            other => T::from_cell(other).map(Some),
        }
    }
}

impl Cells {
    pub fn get<T: FromCell>(&self, i: usize) -> Result<T, ChaosError> {
        let cell = self.0.get(i).unwrap_or(&Cell::Null);
        T::from_cell(cell).ok_or_else(|| {
            ChaosError::Check(format!(
                "column {i}: {cell:?} is not a {}",
                std::any::type_name::<T>()
            ))
        })
    }
}

/// Reads a row column by column as an integer, else as text (bytes read as UTF-8).
macro_rules! cells_of {
    ($row:expr) => {{
        let r = $row;
        let mut out = Vec::with_capacity(r.len());
        for i in 0..r.len() {
            let cell = if let Ok(v) = r.try_get::<Option<i64>, _>(i) {
                v.map_or(Cell::Null, Cell::Int)
            } else if let Ok(v) = r.try_get::<Option<i32>, _>(i) {
                v.map_or(Cell::Null, |v| Cell::Int(v.into()))
            } else if let Ok(v) = r.try_get::<Option<String>, _>(i) {
                v.map_or(Cell::Null, Cell::Text)
            } else {
                r.try_get::<Option<Vec<u8>>, _>(i)?.map_or(Cell::Null, |b| {
                    Cell::Text(String::from_utf8_lossy(&b).into_owned())
                })
            };
            out.push(cell);
        }
        Cells(out)
    }};
}

/// `$1`, `$2`, … as MySQL's `?` (the checker binds each placeholder once, in order).
fn positional(sql: &str) -> String {
    let mut out = String::with_capacity(sql.len());
    let mut chars = sql.chars().peekable();
    while let Some(ch) = chars.next() {
        if ch == '$' && chars.peek().is_some_and(char::is_ascii_digit) {
            while chars.peek().is_some_and(char::is_ascii_digit) {
                chars.next();
            }
            out.push('?');
        } else {
            out.push(ch);
        }
    }
    out
}

impl Db {
    pub async fn connect(url: &str) -> Result<Db, sqlx::Error> {
        Ok(match Backend::of_str(url)? {
            Backend::Postgres => Db::Pg(PgConnection::connect(url).await?),
            Backend::MySql => Db::My(MySqlConnection::connect(url).await?),
        })
    }

    pub fn backend(&self) -> Backend {
        match self {
            Db::Pg(_) => Backend::Postgres,
            Db::My(_) => Backend::MySql,
        }
    }

    /// The rows of `sql` (the checker's own text), with `binds` as `$1`, `$2`, ….
    pub async fn rows(&mut self, sql: &str, binds: &[&str]) -> Result<Vec<Cells>, sqlx::Error> {
        match self {
            Db::Pg(c) => {
                let mut q = sqlx::query(sqlx::AssertSqlSafe(sql.to_string()));
                for b in binds {
                    q = q.bind(b.to_string());
                }
                let mut out = Vec::new();
                for r in q.fetch_all(&mut *c).await? {
                    out.push(cells_of!(&r));
                }
                Ok(out)
            }
            Db::My(c) => {
                let mut q = sqlx::query(sqlx::AssertSqlSafe(positional(sql)));
                for b in binds {
                    q = q.bind(b.to_string());
                }
                let mut out = Vec::new();
                for r in q.fetch_all(&mut *c).await? {
                    out.push(cells_of!(&r));
                }
                Ok(out)
            }
        }
    }

    /// The first column of the first row as an integer (a count); 0 for no row or NULL.
    pub async fn count(&mut self, sql: &str, binds: &[&str]) -> Result<i64, sqlx::Error> {
        let rows = self.rows(sql, binds).await?;
        match rows.first().and_then(|r| r.0.first()) {
            Some(Cell::Int(n)) => Ok(*n),
            None | Some(Cell::Null) => Ok(0),
            Some(other) => Err(sqlx::Error::Decode(
                format!("{other:?} is not a count").into(),
            )),
        }
    }

    /// The first column of the first row as text, if there is one.
    pub async fn text(&mut self, sql: &str, binds: &[&str]) -> Result<Option<String>, sqlx::Error> {
        let rows = self.rows(sql, binds).await?;
        Ok(match rows.first().map(|r| r.0.first()) {
            Some(Some(Cell::Text(s))) => Some(s.clone()),
            _ => None,
        })
    }

    /// Runs a statement as plain text (no parameters, not prepared).
    pub async fn run(&mut self, sql: &str) -> Result<(), sqlx::Error> {
        let sql = sqlx::raw_sql(sqlx::AssertSqlSafe(sql.to_string()));
        match self {
            Db::Pg(c) => sql.execute(&mut *c).await.map(|_| ()),
            Db::My(c) => sql.execute(&mut *c).await.map(|_| ()),
        }
    }

    /// Starts a read-only transaction that sees one snapshot of every table.
    pub async fn begin_snapshot(&mut self) -> Result<(), sqlx::Error> {
        match self.backend() {
            Backend::Postgres => {
                self.run("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
                    .await
            }
            Backend::MySql => {
                self.run("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
                    .await?;
                self.run("START TRANSACTION WITH CONSISTENT SNAPSHOT, READ ONLY")
                    .await
            }
        }
    }

    pub async fn commit(&mut self) -> Result<(), sqlx::Error> {
        self.run("COMMIT").await
    }

    pub async fn close(self) {
        let _ = match self {
            Db::Pg(c) => c.close().await,
            Db::My(c) => c.close().await,
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbered_placeholders_become_question_marks() {
        assert_eq!(
            positional("SELECT a FROM t WHERE x = $1 AND y = $12 AND z = '$'"),
            "SELECT a FROM t WHERE x = ? AND y = ? AND z = '$'"
        );
    }

    #[test]
    fn only_postgres_and_mysql_urls_are_taken() {
        let of = |u: &str| Backend::of(&Url::parse(u).unwrap()).ok();
        assert_eq!(of("postgres://h/db"), Some(Backend::Postgres));
        assert_eq!(of("postgresql://h/db"), Some(Backend::Postgres));
        assert_eq!(of("mysql://root@h:3306/db"), Some(Backend::MySql));
        assert_eq!(of("sqlite://x.db"), None);
    }

    #[test]
    fn cells_read_as_what_they_hold() {
        let r = Cells(vec![Cell::Int(3), Cell::Null, Cell::Text("a".into())]);
        assert_eq!(r.get::<i64>(0).unwrap(), 3);
        assert_eq!(r.get::<Option<String>>(1).unwrap(), None);
        assert_eq!(r.get::<String>(2).unwrap(), "a");
        assert!(r.get::<i64>(2).is_err());
        assert!(r.get::<i64>(1).is_err());
    }
}
