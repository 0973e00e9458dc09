//! idem store on Redis: the gateway's short window, shared by many instances.
//!
//! # When to choose Redis, and when not
//!
//! Redis is the store for the **gateway layer** (docs/DESIGN.md: two layers, where each store fits): many gateway instances
//! share one short window in which concurrent duplicates are coalesced and a finished
//! result is replayed quickly. It is **not** the authoritative record of a business
//! action. Choose PostgreSQL (`idem-postgres`) when the idempotency record must commit
//! in the same transaction as the business write (orders, payments, outbox) and must
//! survive crashes and failovers; choose SQLite (`idem-sqlite`) for one machine.
//!
//! # Durability limits (read before relying on this store)
//!
//! - Redis acknowledges a write once it is in memory. Without AOF (`appendfsync always`)
//!   or RDB snapshots — and the Redis used by this project's tests and default deployment
//!   runs with neither — **every record is lost when Redis restarts**. After a restart a
//!   retried intent is treated as absent and executes again unless a lower layer (the
//!   business database's UNIQUE constraint) stops it (a process that read the record
//!   before may still replay it for the copy's time to live; see *Replays from
//!   memory*).
//! - Replication is asynchronous. A record acknowledged by the primary can be missing on
//!   the replica promoted after a failover, so a duplicate can be admitted. `WAIT` narrows
//!   this window but does not close it.
//! - Records expire (see *Expiry*): once a record is gone the key is absent again.
//!
//! So this store deduplicates bursts (double clicks, gateway retries, concurrent
//! duplicates) efficiently; exactly-once effects still need the authoritative store.
//!
//! # Layout
//!
//! One string value per record, at
//!
//! ```text
//! <prefix>:r:{<enc(tenant)>:<enc(key)>}
//! ```
//!
//! where `enc` percent-escapes `%`, `{`, `}` and `:` (`%25`, `%7B`, `%7D`, `%3A`). Tenants
//! and keys are visible ASCII and may contain any of these; after encoding neither part
//! contains a brace or a colon, so
//! - the Redis Cluster hash tag (the text between the first `{` and the next `}`) is
//!   always exactly `enc(tenant):enc(key)`: every script touches a single key in a
//!   single slot;
//! - the encoding is injective and the `:` between the parts is unambiguous, so two
//!   different `(tenant, key)` pairs never share a Redis key.
//!
//! The prefix must not contain `{` or `}` (checked by [`RedisStore::connect`]).
//!
//! # Record encoding
//!
//! A record is one binary-safe string, so a claim is `TIME` + `GET` + `SET` and a replay
//! a single `GET` inside the script (no per-field hash commands, no JSON in Lua).
//! Integers are big-endian, times are store milliseconds:
//!
//! ```text
//! header (46 bytes)  u8 format = 1 | u8 state ('P' 'S' 'R' 'T') | i64 version |
//!                    i64 lease deadline (meaningful in 'P') | i32 attempts |
//!                    i64 created | i64 updated | i64 completed (meaningful in 'S' 'T')
//! owner block        u16 length | owner (empty: none)
//! identity block     u16 length | u16 len + principal | 32-byte fingerprint |
//!                    u16 len + tenant | u16 len + key
//! result (optional)  u16 status | u8 has_ref [u32 len + ref] | u32 header count |
//!                    (u32 len + name, u32 len + value)* | u32 len + body
//! ```
//!
//! The scripts read the header with `struct.unpack`, compare the owner and identity
//! blocks byte for byte with blocks the caller encoded (both are length-prefixed, so a
//! prefix match is an exact match) and never look inside the result, which Rust alone
//! encodes and decodes ([`encode_record`], [`decode_record`]). A value whose format
//! byte is not 1 is refused as corrupt; a record key holding a hash (the layout of
//! earlier builds) answers `WRONGTYPE`, which surfaces as a backend error, so such a key
//! fails closed until it expires rather than being treated as absent.
//!
//! # Atomicity, time and the decision table
//!
//! claim, finish and extend are Lua scripts (`EVALSHA`, loaded on `NOSCRIPT`; see below
//! for the paths that need none). Redis runs a script alone, so each is a single atomic
//! read-decide-write on one key:
//! - claim implements [`idem_core::decide`] exactly: absent → PROCESSING (version 1,
//!   attempt 1); PROCESSING with a live lease → in progress; SUCCEEDED/FAILED_TERMINAL →
//!   replay; a different fingerprint or principal → mismatch in every state, nothing
//!   written; FAILED_RETRYABLE or PROCESSING with an expired lease → takeover, which bumps
//!   version and attempts and sets the new owner and lease;
//! - finish and extend compare state PROCESSING, version and owner; a lost compare
//!   changes nothing and returns [`StoreError::Superseded`]. A record that has expired
//!   is a lost compare too.
//!
//! Replies are small: a replay returns the stored value as one bulk string (decoded in
//! Rust), the other claim outcomes a short array of integers, and finish returns the
//! new record without the result the caller just sent.
//!
//! Time is read inside the scripts with `TIME` — the Redis server's clock, never the
//! caller's — plus the [`ClockShift`] passed as an argument (zero in production; tests
//! move it to control timelines).
//!
//! # Without scripts, where the server allows
//!
//! Read at connect ([`ServerInfo`]):
//! - with `SET … NX GET` (Redis ≥ 7.0, every Valkey) a claim first tries one `SET` of a
//!   fresh PROCESSING record; when the key exists the same command hands back its value,
//!   and a replay, a mismatch or a lease surely still live is answered from it. Only a
//!   takeover (FAILED_RETRYABLE, or a lease that may have ended) runs the claim script;
//! - with `SET … IFEQ` (Valkey ≥ 8.1, Redis ≥ 8.4) a completion is one `SET` of the
//!   finished record, conditional on the exact value the claim wrote (kept in
//!   [`ClaimToken::written`]). If the value changed — a heartbeat rewrote it, or the claim
//!   was superseded — the finish script decides as before.
//!
//! These writes carry times without running on the server, so they take an upper bound
//! of the server's clock from a `TIME` reading at most a second old (see `clock`): a
//! lease written this way is never shorter than asked, and every decision that ends a
//! lease still reads `TIME` inside a script. [`StoreLimits`] and lease bounds are checked in Rust
//! before any script runs, so bad input writes nothing.
//!
//! # Replays from memory
//!
//! A final record (SUCCEEDED, FAILED_TERMINAL) changes only by expiring, so the store
//! keeps the final records its claims read ([`FinishedLimits`], `idem_store_kit::finished`): a claim on one is
//! answered — replay, or mismatch for another fingerprint or principal, by the same
//! decision table — without a command. An entry is used while the upper bound of the
//! server's clock (see `clock`; a reading older than a second is taken again first) is
//! a second before the record's expiry by this store's `retention`, and before the
//! entry's time to live (10 s by default), and only while the last command reached the
//! server (during an outage a claim fails as it would without the copy, and
//! [`RedisStore::is_reachable`] says so). That time to live bounds how long a record
//! removed outside idem (a flush, eviction, a manual `DEL`, a restart) can still be
//! replayed by this process, and how long one written by an instance with a shorter
//! retention on the same prefix can outlive it here. Nothing that can still change
//! (PROCESSING, FAILED_RETRYABLE) is kept.
//!
//! # Expiry
//!
//! Every write is a `SET … PX`: a finished record (any final state) expires `retention`
//! after it finished; a PROCESSING record expires `retention + lease` after its last
//! claim or heartbeat, so it never disappears while its owner may still be executing.
//!
//! # Uniqueness guard
//!
//! [`IdempotencyStore::unique_guard`] answers `true`: there is no schema to inspect; the
//! guard is that every claim is one atomic script on one key, so of any number of
//! concurrent claims of an absent key exactly one creates the record.
//!
//! # Errors and connections
//!
//! The store holds one redis-rs [`ConnectionManager`] (a multiplexed connection that is
//! replaced after an I/O error; a plain multiplexed connection would stay broken).
//! Connection setup is bounded by `connect_timeout`, every command by
//! `response_timeout`. A reconnect is a single attempt (also bounded by
//! `connect_timeout`); during an outage each call fails fast with `Unavailable` and the
//! next call tries to reconnect again, so recovery never silently stops. Refused or dropped connections, I/O errors and timeouts, and the
//! server saying it cannot serve now (`LOADING`, `BUSY`, `READONLY`, `MASTERDOWN`,
//! `TRYAGAIN`, `CLUSTERDOWN`, `OOM`) map to [`StoreError::Unavailable`]; anything else to
//! [`StoreError::Backend`]. Nothing is retried inside the store: a claim whose reply was
//! lost may have been applied, and only the caller can decide to ask again (a retried
//! claim then sees its own PROCESSING record as in progress, and the key becomes free
//! when the lease expires — it never executes twice). The connection carries a client
//! name (`CLIENT SETNAME`), re-applied after a connection error, so operators can find
//! it in `CLIENT LIST`.
//!
//! Requires Redis 5 or newer (scripts write after reading `TIME`).
//!
//! # Redis Cluster
//!
//! `redis+cluster://host:port,host:port` (or `rediss+cluster://`) connects to a cluster
//! through its seeds ([`conn`]). Every key carries a hash tag of its scope or lease, so a
//! script's keys share a slot; `SCAN` walks each primary. A cluster connection has no
//! client name, and the fault tests that kill named connections run on one server only.

mod clock;
mod codec;
mod conn;
mod keys;
mod lease;
mod options;
mod reply;
pub mod retention;
mod store;

pub use codec::{decode_record, encode_record};
pub use conn::{open_client, pubsub_client, scan as scan_keys};
pub use keys::{encode_component, record_key, unlink_prefix};
pub use lease::*;
pub use options::{
    FinishedLimits, RedisOptions, ServerInfo, DEFAULT_CONNECT_TIMEOUT, DEFAULT_PREFIX,
    DEFAULT_RESPONSE_TIMEOUT, DEFAULT_RETENTION,
};
pub use reply::map_err;
pub use store::RedisStore;
