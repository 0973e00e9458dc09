//! Versioned schema migrations: the one algorithm every SQL schema of the workspace is
//! migrated by (the stores' own tables, and the tables their users keep beside them).
//!
//! # What this module owns
//! - [`Migration`]: a version, its name and its SQL text (an `.sql` file, `include_str!`d),
//!   and the compile-time checks of a list of them ([`ascending`], [`same_versions`]).
//! - [`run`]: lock, read the applied versions, apply the missing ones oldest first and
//!   record each after its SQL, unlock; a failure abandons the lock instead. A schema a
//!   newer build migrated is left as it is and named in a warning: migrations are
//!   additive, so it stays readable.
//!
//! # What it must not do
//! - Talk to a database or know a dialect: each backend ([`MigrationBackend`]) says how
//!   it locks (a transaction's advisory lock, `BEGIN IMMEDIATE`, a named server lock
//!   where DDL commits on its own), where versions are recorded and how a migration's
//!   text is run. Which versions run, in which order, and when one counts as applied are
//!   decided here only.

use std::future::Future;

/// One schema change. Released migrations are never edited: a change is a new version.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Migration {
    pub version: i64,
    /// Recorded beside the version where the versions table has a name column.
    pub name: &'static str,
    /// The SQL, as its backend runs it (one script, or statements split by the backend).
    pub sql: &'static str,
}

impl Migration {
    pub const fn new(version: i64, name: &'static str, sql: &'static str) -> Self {
        Self { version, name, sql }
    }
}

/// Whether versions rise strictly along `list`, so that applying in list order is
/// applying oldest first. For a `const` assertion beside each list.
pub const fn ascending(list: &[Migration]) -> bool {
    let mut i = 1;
    while i < list.len() {
        if list[i - 1].version >= list[i].version {
            return false;
        }
        i += 1;
    }
    true
}

/// Whether two lists (one schema in two dialects) have the same versions with the same
/// names, so either records what the other would.
pub const fn same_versions(a: &[Migration], b: &[Migration]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let mut i = 0;
    while i < a.len() {
        if a[i].version != b[i].version || !same_text(a[i].name, b[i].name) {
            return false;
        }
        i += 1;
    }
    true
}

const fn same_text(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    if a.len() != b.len() {
        return false;
    }
    let mut i = 0;
    while i < a.len() {
        if a[i] != b[i] {
            return false;
        }
        i += 1;
    }
    true
}

/// The newest version of `list` (0 when empty).
pub const fn newest(list: &[Migration]) -> i64 {
    match list.last() {
        Some(m) => m.version,
        None => 0,
    }
}

/// What a database does for [`run`]. Methods are called in this order: `lock`, then
/// `applied`, then `apply` and `record` for each missing version, then `unlock`; after
/// any failure, `abandon` instead of `unlock`.
pub trait MigrationBackend: Send {
    type Error: Send;

    /// Takes the lock that makes concurrent migrators of this schema take turns, and
    /// creates the versions table if it is missing (under the lock: a concurrent twin of
    /// `CREATE … IF NOT EXISTS` is not safe everywhere).
    fn lock(&mut self) -> impl Future<Output = Result<(), Self::Error>> + Send;

    /// The versions recorded as applied, in any order.
    fn applied(&mut self) -> impl Future<Output = Result<Vec<i64>, Self::Error>> + Send;

    /// Runs one migration's SQL.
    fn apply(
        &mut self,
        migration: &Migration,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send;

    /// Records `migration` as applied.
    fn record(
        &mut self,
        migration: &Migration,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send;

    /// Makes the work durable and gives the lock back (commit, or release a server lock).
    fn unlock(self) -> impl Future<Output = Result<(), Self::Error>> + Send;

    /// Gives the lock back after a failure without keeping anything that is not already
    /// committed (a rollback, or a connection closed instead of reused).
    fn abandon(self) -> impl Future<Output = ()> + Send;
}

/// Applies the migrations of `list` (oldest first, see [`ascending`]) that `backend`
/// has not recorded. Returns the versions applied by this call: empty when the schema
/// was current, or when a concurrent migrator applied them while this one waited.
pub async fn run<B: MigrationBackend>(
    mut backend: B,
    list: &[Migration],
) -> Result<Vec<i64>, B::Error> {
    match apply_missing(&mut backend, list).await {
        Ok(done) => {
            backend.unlock().await?;
            Ok(done)
        }
        Err(e) => {
            backend.abandon().await;
            Err(e)
        }
    }
}

async fn apply_missing<B: MigrationBackend>(
    backend: &mut B,
    list: &[Migration],
) -> Result<Vec<i64>, B::Error> {
    backend.lock().await?;
    let applied = backend.applied().await?;
    let known = newest(list);
    if let Some(&recorded) = applied.iter().max() {
        if recorded > known {
            // A newer build migrated this schema; it stays readable by design (additive
            // migrations), so warn rather than refuse.
            tracing::warn!(recorded, known, "schema is newer than this build");
        }
    }
    let mut done = Vec::new();
    for m in list.iter().filter(|m| !applied.contains(&m.version)) {
        backend.apply(m).await?;
        backend.record(m).await?;
        tracing::info!(version = m.version, name = m.name, "applied migration");
        done.push(m.version);
    }
    Ok(done)
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: &[Migration] = &[Migration::new(1, "one", ""), Migration::new(3, "three", "")];

    #[test]
    fn lists_are_checked_at_compile_time() {
        assert!(ascending(A));
        assert!(ascending(&[]));
        assert!(!ascending(&[A[1], A[0]]));
        assert!(!ascending(&[A[0], A[0]]));
        assert!(same_versions(A, &[Migration::new(1, "one", "x"), A[1]]));
        assert!(!same_versions(A, &[Migration::new(1, "onE", ""), A[1]]));
        assert!(!same_versions(A, &[A[0], Migration::new(2, "three", "")]));
        assert!(!same_versions(A, &A[..1]));
        assert_eq!(newest(A), 3);
        assert_eq!(newest(&[]), 0);
    }
}
