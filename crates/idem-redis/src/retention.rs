//! Retention on Redis: expiry only.
//!
//! Redis is the gateway's short window, not an evidence store, so it has none of the
//! tiers of `idem_core::retention`:
//!
//! - every record carries a TTL (`RedisOptions::retention`, counted from completion;
//!   PROCESSING records `retention + lease` from their last write). When it ends the
//!   record is gone and the key is absent again — there is no replay tier with a
//!   reconstructed response, no dispute tier and no archive;
//! - so the sizing rule applies to the TTL itself: it must cover the longest way a
//!   duplicate can reach the gateway (client retries, gateway retries). Message
//!   redelivery and dead-letter replay must be deduplicated by the authoritative store
//!   (SQLite or PostgreSQL), whose sweeper keeps the tiers;
//! - there is no stale-PROCESSING scan: an abandoned PROCESSING record is taken over by
//!   the next claim after its lease, or disappears with its TTL;
//! - `idem sweep` refuses a Redis URL with this explanation; `RedisStore` implements
//!   neither `RetentionStore` nor `ArchiveLookup`;
//! - eviction (`maxmemory-policy` other than `noeviction`) can drop a record before its
//!   TTL: run the idempotency keyspace with `noeviction`, or accept that an evicted key
//!   looks absent.
