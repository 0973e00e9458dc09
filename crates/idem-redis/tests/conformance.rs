//! The shared store scenarios, run against Redis (`IDEM_TEST_REDIS_URL`, default
//! `redis://127.0.0.1:6379`) and against Valkey (`IDEM_TEST_VALKEY_URL`, default
//! `redis://127.0.0.1:6390`), and against a three-node Redis Cluster. Each test gets its
//! own key prefix, deleted afterwards.

mod common;

pub use common::RedisHarness;

async fn harness() -> Option<RedisHarness> {
    RedisHarness::new().await
}

idem_conformance::store_tests!(harness());

/// The same scenarios on Valkey.
mod valkey {
    async fn harness() -> Option<super::RedisHarness> {
        super::RedisHarness::valkey().await
    }

    idem_conformance::store_tests!(harness());
}

/// The same scenarios on a three-node Redis Cluster the test process starts on side
/// ports (every key is hash-tagged, so each script's keys share a slot).
mod cluster {
    async fn harness() -> Option<super::RedisHarness> {
        super::RedisHarness::cluster().await
    }

    idem_conformance::store_tests!(harness());
}
