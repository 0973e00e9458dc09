//! The ledgers' schema: migrators starting at once apply each version once and the schema
//! reads current, on every store; on MySQL, where every DDL statement commits on its own,
//! a migration stopped half-way is finished by the next start.

#[macro_use]
mod common;

use common::{Backend, Env};
use futures::future::join_all;
use sqlx::{Connection, Executor, MySqlConnection};

on_every_store!(migrators_starting_at_once_apply_each_version_once);

async fn migrators_starting_at_once_apply_each_version_once(env: Env) {
    let dbs = join_all((0..4).map(|_| env.database())).await;
    for db in &dbs {
        let status = db.schema_status().await.expect("schema status");
        assert!(status.current(), "{status:?}");
        assert_eq!(status.ledgers, status.ledgers_needed);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_mysql_migration_stopped_half_way_is_finished() {
    let Some(env) = common::env(Backend::Mysql).await else {
        return;
    };
    drop(env.database().await);
    // As if a migrator stopped after some of version 1's statements, before recording it.
    let mut raw = MySqlConnection::connect(&env.url).await.unwrap();
    raw.execute("DELETE FROM orders_schema_migrations")
        .await
        .unwrap();
    raw.execute("DROP TABLE freezes").await.unwrap();
    let db = env.database().await;
    let status = db.schema_status().await.expect("schema status");
    assert!(status.current(), "{status:?}");
    assert!(db.store().has_table("freezes").await.unwrap());
    let versions: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM orders_schema_migrations")
        .fetch_one(&mut raw)
        .await
        .unwrap();
    assert_eq!(versions, status.ledgers_needed);
    raw.close().await.unwrap();
}
