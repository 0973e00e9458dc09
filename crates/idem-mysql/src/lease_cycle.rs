//! The holder's uncontended cycle in one statement each way: a grant over the lease this
//! store last ended for a name, and the release of a lease this store granted, both in
//! place on the lease row.
//!
//! # What this module owns
//! - [`Held`]: what this store remembers of its own leases (the live one it granted or
//!   renewed, or the token of the one it ended), per name, bounded. MySQL returns no rows
//!   from an `UPDATE` (only one value, in the OK packet: `LAST_INSERT_ID(expr)`), so a
//!   one-statement change must already know everything else it answers.
//! - The two statements. Each is a compare-and-set on the whole row as remembered: a
//!   stale memory (another process changed the row, the row went) matches nothing, and
//!   the caller takes the procedures, which decide from the row. The triggers on
//!   `idem_leases` write the evidence inside the statement (migration 8).
//!
//! # What it must not do
//! - Decide from memory: the memory chooses which statement to try; the row decides.
//! - Read the time before a lock it may wait for: the grant only takes a row whose end is
//!   not later than its own time, and the release reads the clock after its row lock
//!   (`SYSDATE`, not the statement's start).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use idem_core::retention::millis;
use idem_core::{ClockShift, FencingToken, Lease, LeaseError, LeaseName, Millis, OwnerId};
use sqlx::{MySqlPool, Row};

use crate::sql::CLOCK;

/// How many names [`Held`] remembers; past that it starts again empty (a memory miss
/// costs the procedures' path, never a wrong answer).
const CAPACITY: usize = 4096;

/// The store clock read when the expression runs, after the row locks of its statement:
/// `SYSDATE`, where `NOW` is the statement's start. `?` is the test shift.
pub(crate) const CLOCK_AFTER_LOCKS: &str =
    "(CAST(UNIX_TIMESTAMP(SYSDATE(3)) * 1000 AS SIGNED) + ?)";

#[derive(Debug, Clone)]
enum Known {
    Live(Lease),
    Ended(FencingToken),
}

/// What this store last did to each name's lease.
#[derive(Debug, Default)]
pub(crate) struct Held(Mutex<HashMap<LeaseName, Known>>);

impl Held {
    fn put(&self, name: &LeaseName, known: Known) {
        let mut map = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if map.len() >= CAPACITY && !map.contains_key(name) {
            map.clear();
        }
        map.insert(name.clone(), known);
    }

    /// This store granted or renewed `lease`.
    pub(crate) fn live(&self, lease: &Lease) {
        self.put(&lease.name, Known::Live(lease.clone()));
    }

    /// This store ended the lease of `name` that had `token`; the row keeps the token.
    pub(crate) fn ended(&self, name: &LeaseName, token: FencingToken) {
        self.put(name, Known::Ended(token));
    }

    /// The row of `name` may be gone or changed by another path.
    pub(crate) fn forget(&self, name: &LeaseName) {
        let mut map = self.0.lock().unwrap_or_else(|e| e.into_inner());
        map.remove(name);
    }

    fn get(&self, name: &LeaseName) -> Option<Known> {
        let map = self.0.lock().unwrap_or_else(|e| e.into_inner());
        map.get(name).cloned()
    }

    /// The lease `owner` holds with `token`, as this store granted or renewed it.
    pub(crate) fn holding(
        &self,
        name: &LeaseName,
        owner: &OwnerId,
        token: FencingToken,
    ) -> Option<Lease> {
        match self.get(name) {
            Some(Known::Live(lease)) if lease.owner == *owner && lease.token == token => {
                Some(lease)
            }
            _ => None,
        }
    }

    /// The token of the lease this store last ended for `name`.
    pub(crate) fn last_ended(&self, name: &LeaseName) -> Option<FencingToken> {
        match self.get(name) {
            Some(Known::Ended(token)) => Some(token),
            _ => None,
        }
    }
}

fn lerr(what: &'static str) -> impl Fn(sqlx::Error) -> LeaseError {
    move |e| crate::error::map_err(what, e).into()
}

/// `s` (visible ASCII, checked by its type) as a literal in the lease tables' character
/// set: hex, so no character of it needs escaping whatever the `sql_mode`.
fn ascii(s: &str) -> String {
    let hex: String = s.bytes().map(|b| format!("{b:02X}")).collect();
    format!("_ascii X'{hex}' COLLATE ascii_bin")
}

/// Runs `update` and reads the value its `LAST_INSERT_ID(expr)` set, in one round trip:
/// the triggers' inserts leave 0 in the OK packet, but the session keeps the value, and
/// `ROW_COUNT()` says whether the update changed the row. `None` when it did not.
async fn update_and_read_back(
    pool: &MySqlPool,
    update: String,
    what: &'static str,
) -> Result<Option<Millis>, LeaseError> {
    let sql = format!("{update}; SELECT ROW_COUNT(), CAST(LAST_INSERT_ID() AS SIGNED)");
    let rows = sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
        .fetch_all(pool)
        .await
        .map_err(lerr(what))?;
    let row = rows
        .first()
        .ok_or_else(|| LeaseError::Backend(format!("{what}: no value read back")))?;
    let changed: i64 = row.try_get(0).map_err(lerr(what))?;
    let value: i64 = row.try_get(1).map_err(lerr(what))?;
    Ok((changed == 1).then_some(value))
}

/// Grants `name` in place over the lease with token `last` that ended at or before this
/// statement's time: token `last + 1`, times from the statement's clock. `None`: the row
/// is not that ended lease any more.
pub(crate) async fn grant(
    pool: &MySqlPool,
    clock: &ClockShift,
    name: &LeaseName,
    owner: &OwnerId,
    ttl: Duration,
    last: FencingToken,
) -> Result<Option<Lease>, LeaseError> {
    let ttl = millis(ttl);
    let token = FencingToken::new(last.get() + 1);
    let now = CLOCK.replace('?', &clock.millis().to_string());
    let update = format!(
        "UPDATE idem_leases SET owner = {owner}, token = {token}, \
           acquired_at = LAST_INSERT_ID({now}), expires_at = {now} + {ttl}, renewals = 0 \
         WHERE name = {name} AND owner = '' AND token = {last} AND expires_at <= {now}",
        owner = ascii(owner.as_str()),
        token = token.get(),
        name = ascii(name.as_str()),
        last = last.get(),
    );
    // One `NOW(3)` per statement: the deadline is the grant time plus the TTL.
    Ok(update_and_read_back(pool, update, "lease grant")
        .await?
        .map(|at| Lease::granted(name, owner, token, at, at + ttl)))
}

/// Ends `lease` in place if the row is still exactly it and live; the release time comes
/// back. `None`: the row is not that live lease any more.
pub(crate) async fn release(
    pool: &MySqlPool,
    clock: &ClockShift,
    lease: &Lease,
) -> Result<Option<Millis>, LeaseError> {
    let now = CLOCK_AFTER_LOCKS.replace('?', &clock.millis().to_string());
    let update = format!(
        "UPDATE idem_leases SET owner = '', expires_at = LAST_INSERT_ID({now}) \
         WHERE name = {name} AND owner = {owner} AND token = {token} \
           AND acquired_at = {acquired} AND expires_at = {expires} AND renewals = {renewals} \
           AND expires_at > {now}",
        name = ascii(lease.name.as_str()),
        owner = ascii(lease.owner.as_str()),
        token = lease.token.get(),
        acquired = lease.acquired_at,
        expires = lease.expires_at,
        renewals = lease.renewals,
    );
    update_and_read_back(pool, update, "lease release").await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease(token: i64) -> Lease {
        Lease::granted(
            &LeaseName::new("n").unwrap(),
            &OwnerId::new("a").unwrap(),
            FencingToken::new(token),
            10,
            20,
        )
    }

    #[test]
    fn memory_answers_only_what_it_saw() {
        let held = Held::default();
        let a = lease(3);
        let (name, owner) = (a.name.clone(), a.owner.clone());
        held.live(&a);
        assert_eq!(held.holding(&name, &owner, a.token), Some(a.clone()));
        assert_eq!(held.holding(&name, &owner, FencingToken::new(2)), None);
        assert_eq!(
            held.holding(&name, &OwnerId::new("b").unwrap(), a.token),
            None
        );
        assert_eq!(held.last_ended(&name), None);
        held.ended(&name, a.token);
        assert_eq!(held.holding(&name, &owner, a.token), None);
        assert_eq!(held.last_ended(&name), Some(a.token));
        held.forget(&name);
        assert_eq!(held.last_ended(&name), None);
    }

    #[test]
    fn names_become_hex_literals() {
        assert_eq!(ascii("a'\\b"), "_ascii X'61275C62' COLLATE ascii_bin");
    }

    #[test]
    fn memory_stays_bounded() {
        let held = Held::default();
        for i in 0..CAPACITY + 10 {
            held.ended(
                &LeaseName::new(format!("n{i}")).unwrap(),
                FencingToken::new(1),
            );
        }
        let len = held.0.lock().unwrap().len();
        assert!(len <= CAPACITY, "{len}");
    }
}
