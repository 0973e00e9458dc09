//! Where records live in Redis: the escaped, hash-tagged record key (the crate docs,
//! *Layout*), and removing what a prefix holds.
//!
//! Owns key names only; it must not read or write a record.

use std::time::Duration;

use idem_core::Scope;

/// Removes every key under `prefix:` in SCAN batches (what a bench or a chaos campaign
/// wrote under a prefix of its own) and returns how many there were. Keys outside the
/// prefix are never touched.
pub async fn unlink_prefix<C>(conn: &mut C, prefix: &str) -> Result<u64, redis::RedisError>
where
    C: redis::aio::ConnectionLike + Send,
{
    let pattern = format!("{prefix}:*");
    let mut cursor: u64 = 0;
    let mut removed = 0;
    loop {
        let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(&pattern)
            .arg("COUNT")
            .arg(1000)
            .query_async(conn)
            .await?;
        if !keys.is_empty() {
            let n: u64 = redis::cmd("UNLINK").arg(&keys).query_async(conn).await?;
            removed += n;
        }
        if next == 0 {
            return Ok(removed);
        }
        cursor = next;
    }
}

pub(crate) fn millis_u64(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Percent-escapes `%`, `{`, `}` and `:` (see the module docs, *Layout*).
pub fn encode_component(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    push_encoded(&mut out, s);
    out
}

/// Appends `s` escaped as [`encode_component`] does; runs of plain bytes are copied
/// at once.
fn push_encoded(out: &mut String, s: &str) {
    // Most names need no escape: one pass without branches (the compiler vectorizes
    // it) finds out.
    let unescaped = s.bytes().fold(true, |ok, b| {
        ok & (b != b'%') & (b != b':') & (b != b'{') & (b != b'}')
    });
    if unescaped {
        out.push_str(s);
        return;
    }
    let mut plain = 0;
    for (i, b) in s.bytes().enumerate() {
        let escaped = match b {
            b'%' => "%25",
            b'{' => "%7B",
            b'}' => "%7D",
            b':' => "%3A",
            _ => continue,
        };
        out.push_str(&s[plain..i]);
        out.push_str(escaped);
        plain = i + 1;
    }
    out.push_str(&s[plain..]);
}

/// `<prefix>:r:{<enc(tenant)>:<enc(key)>}`, in one allocation.
pub fn record_key(prefix: &str, scope: &Scope) -> String {
    let (tenant, key) = (scope.tenant.as_str(), scope.key.as_str());
    let mut out = String::with_capacity(prefix.len() + tenant.len() + key.len() + 8);
    out.push_str(prefix);
    out.push_str(":r:{");
    push_encoded(&mut out, tenant);
    out.push(':');
    push_encoded(&mut out, key);
    out.push('}');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    use idem_core::{IdempotencyKey, TenantId};

    fn scope(t: &str, k: &str) -> Scope {
        Scope::new(TenantId::new(t).unwrap(), IdempotencyKey::new(k).unwrap())
    }

    #[test]
    fn keys_are_injective_and_tagged() {
        let pairs = [
            ("a:b", "c"),
            ("a", "b:c"),
            ("{x}", "y"),
            ("x", "}{"),
            ("%7B", "k"),
            ("{", "k"),
            ("%", "25"),
            ("%25", "k"),
            ("a", "b"),
            ("a%3Ab", "c"),
        ];
        let mut seen = std::collections::HashSet::new();
        for (t, k) in pairs {
            let key = record_key("idem", &scope(t, k));
            assert!(seen.insert(key.clone()), "{key} collides");
            let open = key.find('{').unwrap();
            let close = open + key[open..].find('}').unwrap();
            let tag = &key[open + 1..close];
            assert_eq!(
                tag,
                format!("{}:{}", encode_component(t), encode_component(k))
            );
            assert_eq!(close, key.len() - 1, "{key}: tag must end the key");
            assert_eq!(tag.matches(':').count(), 1);
        }
        assert_eq!(
            record_key("idem", &scope("t{1}", "k:2")),
            "idem:r:{t%7B1%7D:k%3A2}"
        );
    }
}
