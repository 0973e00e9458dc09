//! Opening one new file from many connections at once: every open succeeds and the file
//! ends in WAL mode. Turning a file into WAL takes an exclusive lock that SQLite's busy
//! handler does not wait for, so racing opens must retry it themselves.

use futures::future::join_all;
use idem_sqlite::{SqliteOptions, SqliteStore};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn many_stores_opening_one_new_file_at_once_all_open_it() {
    for round in 0..100 {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("idem.db");
        let opened = join_all((0..8).map(|_| SqliteStore::open(SqliteOptions::new(&path)))).await;
        for (i, store) in opened.into_iter().enumerate() {
            let store = store.unwrap_or_else(|e| panic!("round {round}, opener {i}: {e}"));
            let mode: String = sqlx::query_scalar("PRAGMA journal_mode")
                .fetch_one(store.pool())
                .await
                .unwrap();
            assert_eq!(mode, "wal", "round {round}, opener {i}");
        }
    }
}
