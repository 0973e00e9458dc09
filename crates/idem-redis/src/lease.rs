//! Leases with fencing tokens on Redis: fast leases shared by many gateway instances.
//!
//! # What this gives, and what it does not (read before relying on it)
//!
//! A Redis lease is an **efficiency lock** (docs/DESIGN.md: where each store fits): it keeps concurrent instances
//! from doing the same work twice in the common case. It becomes a **correctness** lock
//! only where the protected resource checks the fencing token in an authoritative store
//! — `idem_postgres::PgStore::fenced_write` / `fence_in_tx` or
//! `idem_sqlite::SqliteStore::fenced_write`, which refuse a token lower than one they
//! accepted. Report such a refusal with [`RedisStore::record_fence_rejection`] so the
//! lease's evidence shows it.
//!
//! Redis guarantees, on one primary that keeps running:
//! - at most one live lease per name: every operation is one Lua script on the keys of
//!   one name, and Redis runs a script alone;
//! - expiry judged by the Redis server's clock (`TIME`, plus the
//!   [`ClockShift`](idem_core::ClockShift), zero in production), never the caller's;
//! - renew and release are compare-and-sets on owner and token; an expired lease can be
//!   neither renewed nor released;
//! - tokens strictly increase per name (see *Tokens*).
//!
//! Redis does **not** guarantee:
//! - that a granted lease survives. Replication is asynchronous: a lease acknowledged by
//!   the primary can be missing on the replica promoted after a failover, and a restart
//!   without persistence loses every lease. A second holder is then granted while the
//!   first still believes it holds the lease (the seed's fourth way to die). `WAIT`
//!   narrows this window; it does not close it. Only the authoritative fence stops the
//!   first holder's late write;
//! - that tokens never go back when the clock does (see *Tokens*);
//! - that the evidence is complete: events live in Redis too (capped, collected after the
//!   grace period) and are lost with the keys. The SQL fence keeps its own record of a
//!   refused write.
//!
//! # Tokens
//!
//! `token = max(token of the state + 1, store time in microseconds)`. The state key of a
//! name outlives its lease (a release or an expiry marks it ended and keeps its token),
//! so while it exists tokens strictly increase whatever the clock does. When it is lost
//! (an unreplicated failover, a restart without persistence, garbage collection of an
//! idle name) the time floor still gives a higher token than any granted before,
//! **provided the clock of the server granting now (plus the shift) is ahead of the clock
//! that granted the lost tokens**: a promoted replica whose clock is behind the old
//! primary's by more than the failover took, or a clock stepped back while the state is
//! gone, can hand out a token again. Grants on one name are at least a script apart, so
//! the tokens run ahead of the microsecond clock only by the grants made within the same
//! microsecond. Tokens are therefore large numbers (about 1.7 × 10^15 today), still exact
//! in Lua's doubles (below 2^53) and in `i64`. Do not fence one resource with tokens from
//! two lease stores: their tokens are not comparable.
//!
//! # Layout
//!
//! For a lease name `n`, with `enc` the percent-escaping of the record keys (see the
//! crate docs, *Layout*), all keys of one name share the hash tag `{enc(n)}`, so a script
//! touches one Redis Cluster slot:
//!
//! ```text
//! <prefix>:ls:{enc(n)}   string: "<token> <acquired_at> <expires_at> <renewals> <L|E> <owner>"
//! <prefix>:le:{enc(n)}   list: events as JSON objects, oldest first, the last 1000 kept
//! ```
//!
//! `L`: granted (live until `expires_at` by the store clock); `E`: ended (released,
//! recorded as expired, or force-released). One string per name keeps a lease change to
//! one `GET` and one `SET` besides the event: every command a Lua script calls costs
//! several times its plain cost on Redis 7, so the layout is as small as the rules allow.
//!
//! Expiry is judged in the scripts against the store clock, so an expired lease is still
//! there to be recorded as `expired` when the store next touches the name. `PEXPIRE` is
//! only garbage collection: the state goes `retention` (of [`RedisOptions`]) after its
//! lease's deadline or end; the events live `retention` after the last one and never
//! less than the state.
//!
//! Names last written by an older idem (a hash `<prefix>:l:{enc(n)}` and a counter
//! `<prefix>:lt:{enc(n)}`) are read from those keys while there is no state, and moved
//! into the state by the next change, so a lease held across an upgrade is honoured and
//! tokens keep rising. Upgrade every process sharing a prefix together: an older process
//! does not see leases granted by a newer one.
//!
//! [`RedisOptions`]: crate::RedisOptions

use std::sync::LazyLock;
use std::time::Duration;

use async_trait::async_trait;
use idem_core::lease::{check_reason, check_ttl};
use idem_core::{
    Acquire, Fenced, FencingToken, Lease, LeaseError, LeaseEvent, LeaseName, LeaseStatus,
    LeaseStore, Millis, OwnerId, Release, Renew,
};
use redis::{Script, Value};

use crate::keys::{encode_component, millis_u64};
use crate::RedisStore;

/// How many events the list of one lease name keeps (the most recent).
pub const LEASE_EVENTS_KEPT: usize = 1000;

macro_rules! lease_script {
    ($file:literal) => {
        Script::new(concat!(
            include_str!("lua/lease_common.lua"),
            include_str!($file)
        ))
    };
}

struct Scripts {
    acquire: Script,
    renew: Script,
    release: Script,
    force: Script,
    show: Script,
    fenced: Script,
}

static SCRIPTS: LazyLock<Scripts> = LazyLock::new(|| Scripts {
    acquire: lease_script!("lua/lease_acquire.lua"),
    renew: lease_script!("lua/lease_renew.lua"),
    release: lease_script!("lua/lease_release.lua"),
    force: lease_script!("lua/lease_force.lua"),
    show: lease_script!("lua/lease_show.lua"),
    fenced: lease_script!("lua/lease_fenced.lua"),
});

/// The Redis keys of one lease name (see the module docs, *Layout*).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseKeys {
    /// The lease state: the current or last lease, whose token is the name's counter.
    pub state: String,
    /// The event list.
    pub events: String,
    /// The lease hash an older idem wrote; read when there is no state.
    pub legacy_lease: String,
    /// The token counter an older idem wrote; read when there is no state.
    pub legacy_counter: String,
}

/// The keys of lease `name` under `prefix`; they share the hash tag `{enc(name)}`.
pub fn lease_keys(prefix: &str, name: &LeaseName) -> LeaseKeys {
    let tag = encode_component(name.as_str());
    LeaseKeys {
        state: format!("{prefix}:ls:{{{tag}}}"),
        events: format!("{prefix}:le:{{{tag}}}"),
        legacy_lease: format!("{prefix}:l:{{{tag}}}"),
        legacy_counter: format!("{prefix}:lt:{{{tag}}}"),
    }
}

fn corrupt(what: impl std::fmt::Display) -> LeaseError {
    LeaseError::Backend(format!("redis: malformed lease reply or event: {what}"))
}

fn text(v: &Value) -> Result<&str, LeaseError> {
    match v {
        Value::BulkString(b) => std::str::from_utf8(b).map_err(|_| corrupt("not UTF-8")),
        Value::SimpleString(s) => Ok(s),
        other => Err(corrupt(format!("expected a string, got {other:?}"))),
    }
}

fn num(v: &Value) -> Result<i64, LeaseError> {
    match v {
        Value::Int(i) => Ok(*i),
        other => text(other)?
            .parse()
            .map_err(|e| corrupt(format!("{other:?}: {e}"))),
    }
}

/// A script's reply: `{code, now}` or `{code, now, owner, token, acquired_at,
/// expires_at, renewals}`.
struct Reply {
    code: i64,
    now: Millis,
    lease: Option<Lease>,
}

fn parse_reply(name: &LeaseName, reply: Value) -> Result<Reply, LeaseError> {
    let items = match reply {
        Value::Array(items) => items,
        other => return Err(corrupt(format!("reply {other:?}"))),
    };
    let lease = match items.as_slice() {
        [_, _] => None,
        [_, _, owner, token, acquired_at, expires_at, renewals] => Some(Lease {
            name: name.clone(),
            owner: OwnerId::new(text(owner)?).map_err(corrupt)?,
            token: FencingToken::new(num(token)?),
            acquired_at: num(acquired_at)?,
            expires_at: num(expires_at)?,
            renewals: u32::try_from(num(renewals)?).map_err(corrupt)?,
        }),
        other => return Err(corrupt(format!("reply with {} items", other.len()))),
    };
    Ok(Reply {
        code: num(&items[0])?,
        now: num(&items[1])?,
        lease,
    })
}

fn parse_event(name: &LeaseName, raw: &[u8]) -> Result<LeaseEvent, LeaseError> {
    let value: serde_json::Value = serde_json::from_slice(raw).map_err(corrupt)?;
    let obj = value
        .as_object()
        .ok_or_else(|| corrupt("event is not an object"))?;
    let int = |k: &str| {
        obj.get(k)
            .map(|v| v.as_i64().ok_or_else(|| corrupt(format!("event {k} {v}"))))
            .transpose()
    };
    let string = |k: &str| {
        obj.get(k)
            .map(|v| v.as_str().ok_or_else(|| corrupt(format!("event {k} {v}"))))
            .transpose()
    };
    Ok(LeaseEvent {
        name: name.clone(),
        kind: string("kind")?
            .ok_or_else(|| corrupt("event without kind"))?
            .parse()
            .map_err(corrupt)?,
        at: int("at")?.ok_or_else(|| corrupt("event without time"))?,
        owner: string("owner")?
            .map(OwnerId::new)
            .transpose()
            .map_err(corrupt)?,
        token: int("token")?.map(FencingToken::new),
        acquired_at: int("acquired_at")?,
        expires_at: int("expires_at")?,
        detail: string("detail")?.map(str::to_owned),
    })
}

impl RedisStore {
    /// The Redis keys of lease `name`.
    pub fn lease_keys(&self, name: &LeaseName) -> LeaseKeys {
        lease_keys(self.prefix(), name)
    }

    /// `EVALSHA` of a lease script on `name`'s keys with the common arguments (shift,
    /// grace, events kept); the caller appends the script's own.
    fn lease_cmd(&self, script: &Script, name: &LeaseName) -> redis::Cmd {
        let keys = self.lease_keys(name);
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(script.get_hash())
            .arg(4)
            .arg(keys.state)
            .arg(keys.events)
            .arg(keys.legacy_lease)
            .arg(keys.legacy_counter)
            .arg(self.shift())
            .arg(self.retention_ms())
            .arg(LEASE_EVENTS_KEPT);
        cmd
    }

    async fn run_lease(
        &self,
        script: &Script,
        name: &LeaseName,
        cmd: &redis::Cmd,
    ) -> Result<Reply, LeaseError> {
        parse_reply(name, self.eval(script, cmd).await?)
    }

    /// Records that an authoritative fence (a SQL `fenced_write`) refused a write
    /// carrying a token this store granted: a `fenced_write_rejected` event under the
    /// lease's name, at the store's time (returned), with the resource and the token it
    /// had accepted. The fence's own store keeps its record as well.
    pub async fn record_fence_rejection(&self, fenced: &Fenced) -> Result<Millis, LeaseError> {
        let script = &SCRIPTS.fenced;
        let mut cmd = self.lease_cmd(script, &fenced.name);
        cmd.arg(fenced.owner.as_str())
            .arg(fenced.token.get())
            .arg(fenced.detail());
        let at = num(&self.eval(script, &cmd).await?)?;
        tracing::warn!(
            lease = %fenced.name, owner = %fenced.owner, token = %fenced.token,
            resource = %fenced.resource, last_accepted = %fenced.last_accepted,
            "fenced write rejected"
        );
        Ok(at)
    }
}

/// Fast leases for the gateway layer: an **efficiency lock** unless the protected
/// resource checks the token in an authoritative SQL fence (`fenced_write` of
/// `idem-postgres` or `idem-sqlite`; report refusals with
/// [`RedisStore::record_fence_rejection`]).
///
/// Redis keeps one live lease per name (one Lua script per operation), judges expiry by
/// its own clock (`TIME` + shift), and issues tokens `max(last token + 1, store clock in
/// µs)`, the last token kept in the name's state after the lease ends. Tokens keep rising
/// when the state is lost (unreplicated failover, restart without persistence) as long
/// as the granting server's clock is not behind the clock that granted before; a clock
/// stepped back while the state is gone can repeat a token. The lease itself can be lost the same
/// ways: then a second holder is granted, and only the fence stops the first one's late
/// write. Keys and limits in full: `crates/idem-redis/src/lease.rs`.
#[async_trait]
impl LeaseStore for RedisStore {
    async fn try_acquire(
        &self,
        name: &LeaseName,
        owner: &OwnerId,
        ttl: Duration,
    ) -> Result<Acquire, LeaseError> {
        check_ttl(ttl)?;
        let script = &SCRIPTS.acquire;
        let mut cmd = self.lease_cmd(script, name);
        cmd.arg(owner.as_str()).arg(millis_u64(ttl));
        let r = self.run_lease(script, name, &cmd).await?;
        match (r.code, r.lease) {
            (1, Some(lease)) => {
                tracing::debug!(lease = %name, %owner, token = %lease.token, "lease granted");
                Ok(Acquire::Granted(lease))
            }
            (0, Some(holder)) => Ok(Acquire::Held { holder, now: r.now }),
            (code, _) => Err(corrupt(format!("acquire answered {code}"))),
        }
    }

    async fn renew(
        &self,
        name: &LeaseName,
        owner: &OwnerId,
        token: FencingToken,
        ttl: Duration,
    ) -> Result<Renew, LeaseError> {
        check_ttl(ttl)?;
        let script = &SCRIPTS.renew;
        let mut cmd = self.lease_cmd(script, name);
        cmd.arg(owner.as_str())
            .arg(token.get())
            .arg(millis_u64(ttl));
        let r = self.run_lease(script, name, &cmd).await?;
        match (r.code, r.lease) {
            (1, Some(lease)) => Ok(Renew::Renewed(lease)),
            (0, current) => Ok(Renew::NotHolder { current }),
            (code, _) => Err(corrupt(format!("renew answered {code}"))),
        }
    }

    async fn release(
        &self,
        name: &LeaseName,
        owner: &OwnerId,
        token: FencingToken,
    ) -> Result<Release, LeaseError> {
        let script = &SCRIPTS.release;
        let mut cmd = self.lease_cmd(script, name);
        cmd.arg(owner.as_str()).arg(token.get());
        let r = self.run_lease(script, name, &cmd).await?;
        match (r.code, r.lease) {
            (1, Some(lease)) => Ok(Release::Released {
                lease,
                released_at: r.now,
            }),
            (0, current) => {
                tracing::warn!(
                    lease = %name, %owner, %token,
                    current = %idem_core::lease::holder_detail(current.as_ref()),
                    "owner-mismatch release: the caller no longer held the lease"
                );
                Ok(Release::NotHolder { current })
            }
            (code, _) => Err(corrupt(format!("release answered {code}"))),
        }
    }

    async fn force_release(
        &self,
        name: &LeaseName,
        reason: &str,
    ) -> Result<Option<Lease>, LeaseError> {
        check_reason(reason)?;
        let script = &SCRIPTS.force;
        let mut cmd = self.lease_cmd(script, name);
        cmd.arg(reason);
        let r = self.run_lease(script, name, &cmd).await?;
        let removed = match (r.code, r.lease) {
            (1, Some(lease)) => Some(lease),
            (0, None) => None,
            (code, _) => return Err(corrupt(format!("force-release answered {code}"))),
        };
        tracing::warn!(lease = %name, reason, removed = ?removed, "lease force-released");
        Ok(removed)
    }

    async fn show(&self, name: &LeaseName) -> Result<LeaseStatus, LeaseError> {
        let script = &SCRIPTS.show;
        let cmd = self.lease_cmd(script, name);
        let r = self.run_lease(script, name, &cmd).await?;
        let last_token = (r.code > 0).then_some(FencingToken::new(r.code));
        Ok(LeaseStatus::of(name, r.lease, last_token, r.now))
    }

    async fn events(&self, name: &LeaseName, limit: usize) -> Result<Vec<LeaseEvent>, LeaseError> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let key = self.lease_keys(name).events;
        let start = -i64::try_from(limit).unwrap_or(i64::MAX);
        let mut conn = self.conn().await;
        let raw: Vec<Vec<u8>> = self.check(
            redis::cmd("LRANGE")
                .arg(&key)
                .arg(start)
                .arg(-1)
                .query_async(&mut conn)
                .await,
        )?;
        raw.iter().map(|e| parse_event(name, e)).collect()
    }

    /// Redis keeps no order of names, so every call walks the keyspace (`SCAN`; on a
    /// Redis Cluster, each primary) for the keys `show` reads — the states, and the
    /// hashes and counters of names an older idem wrote — decodes the names, and keeps
    /// the first `limit` after `after`: O(number of keys) per page, for operator
    /// consoles, not hot paths. A name is listed while its keys live: a state is
    /// collected `retention` after its lease ended (see *Layout*).
    async fn names(
        &self,
        after: Option<&LeaseName>,
        limit: usize,
    ) -> Result<Vec<LeaseName>, LeaseError> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        // `:ls:{`, `:l:{` and `:lt:{` (checked again per key), not the event lists.
        let pattern = format!("{}:l[:st]*", glob_escape(self.prefix()));
        let keys = self.scan_keys(&pattern).await.map_err(LeaseError::from)?;
        // SCAN may return a key twice, and a name can have several of these keys.
        let mut page = std::collections::BTreeSet::new();
        for name in keys.iter().filter_map(|k| name_of_key(self.prefix(), k)) {
            if after.is_some_and(|a| name <= *a) {
                continue;
            }
            page.insert(name);
            if page.len() > limit {
                page.pop_last();
            }
        }
        Ok(page.into_iter().collect())
    }

    /// Walks the event lists under this store's prefix (`SCAN`, so one call reads the
    /// whole keyspace in steps, from the start each time) and drops the old head of each
    /// in one script. The lists are capped and expire anyway; this bounds them by age as
    /// well. (The sweeper serves the SQL stores; this is for callers of the trait.)
    async fn trim_events(&self, before: Millis, limit: usize) -> Result<u64, LeaseError> {
        // `:le:{`: event lists only, not the keys of a store whose prefix extends ours.
        let pattern = format!("{}:le:{{*", glob_escape(self.prefix()));
        let mut left = limit;
        for key in self.scan_keys(&pattern).await.map_err(LeaseError::from)? {
            if left == 0 {
                break;
            }
            // A list holds at most LEASE_EVENTS_KEPT events.
            let mut cmd = redis::cmd("EVALSHA");
            cmd.arg(TRIM.get_hash())
                .arg(1)
                .arg(&key)
                .arg(before)
                .arg(left.min(LEASE_EVENTS_KEPT));
            let n = num(&self.eval(&TRIM, &cmd).await?)?;
            left = left.saturating_sub(usize::try_from(n).unwrap_or(0));
        }
        Ok((limit - left) as u64)
    }
}

/// The name whose lease `show` reads from `key`: its state (`<prefix>:ls:{enc(n)}`) or
/// the older layout's hash (`:l:`) or counter (`:lt:`). `None` for any other key (an
/// event list, a key of a store whose prefix extends ours, a tag that is not the
/// encoding of a lease name).
fn name_of_key(prefix: &str, key: &str) -> Option<LeaseName> {
    let rest = key.strip_prefix(prefix)?.strip_prefix(':')?;
    let (kind, tag) = rest.split_once(':')?;
    if !matches!(kind, "ls" | "l" | "lt") {
        return None;
    }
    let enc = tag.strip_prefix('{')?.strip_suffix('}')?;
    let name = LeaseName::new(decode_component(enc)?).ok()?;
    // Only the one spelling `lease_keys` writes: the encoding is injective, so no two
    // keys list the same name under one kind.
    (encode_component(name.as_str()) == enc).then_some(name)
}

/// The inverse of [`encode_component`] (`%25`, `%7B`, `%7D`, `%3A`); `None` for any other
/// escape.
fn decode_component(s: &str) -> Option<String> {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(i) = rest.find('%') {
        out.push_str(&rest[..i]);
        out.push(match rest.get(i + 1..i + 3)? {
            "25" => '%',
            "7B" => '{',
            "7D" => '}',
            "3A" => ':',
            _ => return None,
        });
        rest = &rest[i + 3..];
    }
    out.push_str(rest);
    Some(out)
}

/// Drops an event list's head older than a time (`trim_events`).
static TRIM: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("lua/lease_trim.lua")));

/// `s` as a literal in a `SCAN MATCH` pattern.
fn glob_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use idem_core::LeaseEventKind;

    fn name(s: &str) -> LeaseName {
        LeaseName::new(s).unwrap()
    }

    #[test]
    fn keys_share_one_tag() {
        for n in ["inventory:event-42", "a{b}c", "%7B", "x}"] {
            let keys = lease_keys("idem", &name(n));
            let tag = |k: &str| {
                let open = k.find('{').unwrap();
                let close = open + k[open..].find('}').unwrap();
                assert_eq!(close, k.len() - 1, "{k}: the tag ends the key");
                k[open + 1..close].to_string()
            };
            for key in [
                &keys.state,
                &keys.events,
                &keys.legacy_lease,
                &keys.legacy_counter,
            ] {
                assert_eq!(tag(key), encode_component(n));
            }
        }
        assert_eq!(
            lease_keys("p", &name("a:b")),
            LeaseKeys {
                state: "p:ls:{a%3Ab}".into(),
                events: "p:le:{a%3Ab}".into(),
                legacy_lease: "p:l:{a%3Ab}".into(),
                legacy_counter: "p:lt:{a%3Ab}".into(),
            }
        );
    }

    #[test]
    fn names_decode_from_their_keys() {
        for n in [
            "inventory:event-42",
            "a{b}c",
            "%7B",
            "x}",
            "%",
            "100%3A",
            "l:{x}",
        ] {
            let keys = lease_keys("p", &name(n));
            for key in [&keys.state, &keys.legacy_lease, &keys.legacy_counter] {
                assert_eq!(name_of_key("p", key), Some(name(n)), "{key}");
            }
            assert_eq!(name_of_key("p", &keys.events), None);
            assert_eq!(name_of_key("q", &keys.state), None);
            assert_eq!(name_of_key("p:ls", &keys.state), None);
        }
        // Keys of a store whose prefix extends ours, and tags no name encodes to.
        for key in [
            "p:ls:ls:{a}",
            "p:l:ls:{a}",
            "p:ls:{a}b",
            "p:ls:{}",
            "p:ls:{a%41}",
            "p:ls:{a%7b}",
            "p:ls:{a%3}",
            "p:ls:{a:b}",
            "p:ls:{a b}",
            "p:lx:{a}",
            "p:r:{t:k}",
        ] {
            assert_eq!(name_of_key("p", key), None, "{key}");
        }
    }

    #[test]
    fn replies_and_events_parse() {
        let n = name("n");
        let bulk = |s: &str| Value::BulkString(s.as_bytes().to_vec());
        let r = parse_reply(
            &n,
            Value::Array(vec![
                Value::Int(1),
                Value::Int(1000),
                bulk("A"),
                bulk("1750000000000001"),
                bulk("1000"),
                bulk("4000"),
                bulk("2"),
            ]),
        )
        .unwrap();
        let lease = r.lease.unwrap();
        assert_eq!(lease.token, FencingToken::new(1_750_000_000_000_001));
        assert_eq!(
            (lease.acquired_at, lease.expires_at, lease.renewals),
            (1000, 4000, 2)
        );
        assert!(
            parse_reply(&n, Value::Array(vec![Value::Int(0), Value::Int(5)]))
                .unwrap()
                .lease
                .is_none()
        );
        assert!(parse_reply(&n, Value::Array(vec![Value::Int(0)])).is_err());

        let e = parse_event(
            &n,
            br#"{"kind":"force_released","at":7,"owner":"A","token":1750000000000001,"acquired_at":1,"expires_at":2,"detail":"INC\/7 \"x\""}"#,
        )
        .unwrap();
        assert_eq!(e.kind, LeaseEventKind::ForceReleased);
        assert_eq!(e.token, Some(FencingToken::new(1_750_000_000_000_001)));
        assert_eq!(e.detail.as_deref(), Some("INC/7 \"x\""));
        let e = parse_event(&n, br#"{"kind":"force_released","at":7}"#).unwrap();
        assert_eq!((e.owner, e.token, e.detail), (None, None, None));
        assert!(parse_event(&n, br#"{"kind":"nope","at":7}"#).is_err());
    }
}
