//! The inventory ledger: each show's stock per tenant and the one hold each order
//! takes from it.
//!
//! Owns the `inventory`, `inventory_buckets` and `inventory_holds` statements. A show's
//! stock is split across [`STOCK_BUCKETS`] bucket rows (plus `inventory.available`, a
//! reserve that only stock from before the buckets can be in), so concurrent orders of
//! one show lock different rows and commit in parallel: on PostgreSQL and MySQL a taker
//! skips the buckets others hold (`FOR UPDATE SKIP LOCKED`), so a paused holder blocks
//! one bucket, never the show. An order takes from one bucket in one statement; only when no single
//! free bucket covers it does it gather from several (and the reserve), and when the
//! stock it needs is all held by others it answers busy instead of waiting. Conservation:
//! `capacity = reserve + Σ buckets + Σ held holds`. A release records the fencing token
//! and owner that wrote it. It must not take leases or decide who may release (the caller
//! writes through the fence), and never deletes a hold.

use serde::{Deserialize, Serialize};

use idem_sql::Backend;

use super::new_id;
use crate::db::{sql, Conn, Row};
use crate::error::Error;

/// Stock rows per show: more than the transactions one service runs at once (its pool),
/// so that concurrent takers of one show rarely find every bucket held.
pub const STOCK_BUCKETS: i64 = 32;

/// A show's stock, per tenant.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Show {
    pub show_id: String,
    pub title: String,
    pub capacity: i64,
    pub available: i64,
    pub per_order_limit: i64,
    pub price_cents: i64,
}

/// A show to create at startup (or through the admin API) if it does not exist yet.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShowSeed {
    pub show_id: String,
    pub title: String,
    pub capacity: i64,
    pub per_order_limit: i64,
    pub price_cents: i64,
}

impl ShowSeed {
    /// Show ids name leases and fences (`inventory:{tenant}:{show}`): 1 to 64 of
    /// `A-Z a-z 0-9 . _ -`. Capacity and price are not negative; the limit is positive.
    pub fn check(&self) -> Result<(), Error> {
        let id_ok = !self.show_id.is_empty()
            && self.show_id.len() <= 64
            && self
                .show_id
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
        if !id_ok {
            return Err(Error::InvalidInput(format!(
                "show id {:?}: 1 to 64 of A-Z a-z 0-9 . _ -",
                self.show_id
            )));
        }
        if self.capacity < 0 || self.per_order_limit < 1 || self.price_cents < 0 {
            return Err(Error::InvalidInput(
                "capacity >= 0, per_order_limit >= 1, price_cents >= 0".into(),
            ));
        }
        if self.title.is_empty() || self.title.len() > 200 {
            return Err(Error::InvalidInput("title: 1 to 200 bytes".into()));
        }
        Ok(())
    }

    /// The flash-sale catalogue every tenant gets by default (S-204 is the incident's).
    pub fn default_catalogue() -> Vec<ShowSeed> {
        vec![
            ShowSeed {
                show_id: "S-204".into(),
                title: "Flash sale: S-204".into(),
                capacity: 10_000,
                per_order_limit: 6,
                price_cents: 68_000,
            },
            ShowSeed {
                show_id: "S-101".into(),
                title: "Matinee: S-101".into(),
                capacity: 500,
                per_order_limit: 4,
                price_cents: 28_000,
            },
        ]
    }
}

fn show_from(row: &Row) -> Result<Show, Error> {
    Ok(Show {
        show_id: row.text("show_id")?,
        title: row.text("title")?,
        capacity: row.int("capacity")?,
        available: row.int("available")?,
        per_order_limit: row.int("per_order_limit")?,
        price_cents: row.int("price_cents")?,
    })
}

/// Creates the show if absent, its stock spread over [`STOCK_BUCKETS`] buckets; an
/// existing show is left as it is. Returns the show. Run it in a transaction: the show
/// and its buckets appear together.
pub(crate) async fn seed_show(
    c: &mut Conn<'_>,
    tenant: &str,
    seed: &ShowSeed,
    now: i64,
) -> Result<Show, Error> {
    let insert = c.pick(
        "INSERT INTO inventory (tenant_id, show_id, title, capacity, available, \
           per_order_limit, price_cents, created_at, updated_at) \
         VALUES ($1, $2, $3, $4, 0, $5, $6, $7, $7) \
         ON CONFLICT (tenant_id, show_id) DO NOTHING",
        "INSERT INTO inventory (tenant_id, show_id, title, capacity, available, \
           per_order_limit, price_cents, created_at, updated_at) \
         VALUES ($1, $2, $3, $4, 0, $5, $6, $7, $7)",
    );
    let created = c
        .insert_new(
            sql(insert)
                .bind(tenant)
                .bind(&seed.show_id)
                .bind(&seed.title)
                .bind(seed.capacity)
                .bind(seed.per_order_limit)
                .bind(seed.price_cents)
                .bind(now),
        )
        .await?;
    if created == 1 {
        // MySQL: the CTE follows INSERT, and `/` would divide exactly (`DIV` truncates).
        let buckets = c.pick(
            "WITH RECURSIVE n(bucket) AS (SELECT CAST(0 AS BIGINT) \
               UNION ALL SELECT bucket + 1 FROM n WHERE bucket + 1 < $4) \
             INSERT INTO inventory_buckets (tenant_id, show_id, bucket, available, updated_at) \
             SELECT $1, $2, bucket, \
               $3 / $4 + CASE WHEN bucket < $3 % $4 THEN 1 ELSE 0 END, $5 FROM n",
            "INSERT INTO inventory_buckets (tenant_id, show_id, bucket, available, updated_at) \
             WITH RECURSIVE n(bucket) AS (SELECT CAST(0 AS SIGNED) \
               UNION ALL SELECT bucket + 1 FROM n WHERE bucket + 1 < $4) \
             SELECT $1, $2, bucket, \
               $3 DIV $4 + CASE WHEN bucket < $3 % $4 THEN 1 ELSE 0 END, $5 FROM n",
        );
        c.execute(
            sql(buckets)
                .bind(tenant)
                .bind(&seed.show_id)
                .bind(seed.capacity)
                .bind(STOCK_BUCKETS)
                .bind(now),
        )
        .await?;
    }
    show(c, tenant, &seed.show_id)
        .await?
        .ok_or_else(|| Error::Backend("seeded show vanished".into()))
}

/// A show's stock as readers see it: the reserve and every bucket.
const SHOW_COLUMNS: &str = "SELECT i.show_id, i.title, i.capacity, \
       i.available + CAST(COALESCE((SELECT SUM(b.available) FROM inventory_buckets b \
         WHERE b.tenant_id = i.tenant_id AND b.show_id = i.show_id), 0) AS BIGINT) \
         AS available, \
       i.per_order_limit, i.price_cents \
     FROM inventory i WHERE i.tenant_id = $1 AND i.show_id = $2";
/// MySQL: its `SUM` is a DECIMAL, cast to `SIGNED` (its 64-bit integer).
const SHOW_COLUMNS_MYSQL: &str = "SELECT i.show_id, i.title, i.capacity, \
       i.available + CAST(COALESCE((SELECT SUM(b.available) FROM inventory_buckets b \
         WHERE b.tenant_id = i.tenant_id AND b.show_id = i.show_id), 0) AS SIGNED) \
         AS available, \
       i.per_order_limit, i.price_cents \
     FROM inventory i WHERE i.tenant_id = $1 AND i.show_id = $2";

pub(crate) async fn show(
    c: &mut Conn<'_>,
    tenant: &str,
    show_id: &str,
) -> Result<Option<Show>, Error> {
    let q = c.pick(SHOW_COLUMNS, SHOW_COLUMNS_MYSQL);
    c.optional(sql(q).bind(tenant).bind(show_id))
        .await?
        .as_ref()
        .map(show_from)
        .transpose()
}

/// What taking stock came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Take {
    Taken,
    /// Less than the quantity is left (committed stock; `available` of it).
    SoldOut {
        available: i64,
    },
    /// Enough is left, but other transactions hold the rows it is in: retry.
    Busy,
}

/// Takes `quantity` from the show's stock. `start` spreads takers over the buckets
/// (any number; a per-request random one). Run it as late as possible in the
/// transaction: the bucket stays locked until the commit.
pub(crate) async fn take_stock(
    c: &mut Conn<'_>,
    tenant: &str,
    show_id: &str,
    quantity: i64,
    now: i64,
    start: u64,
) -> Result<Take, Error> {
    let backend = c.backend();
    let start = i64::try_from(start % STOCK_BUCKETS.unsigned_abs()).unwrap_or(0);
    if backend == Backend::Mysql {
        if let Some(bucket) = free_bucket_mysql(c, tenant, show_id, quantity, start).await? {
            take_from(c, tenant, show_id, bucket, quantity, now).await?;
            return Ok(Take::Taken);
        }
        return gather(c, backend, tenant, show_id, quantity, now).await;
    }
    let pg = backend == Backend::Postgres;
    // One free bucket that covers the order, searched from `start` round to it.
    let one = if pg {
        "UPDATE inventory_buckets SET available = available - $3, updated_at = $4 \
         WHERE tenant_id = $1 AND show_id = $2 AND bucket = ( \
           SELECT bucket FROM inventory_buckets \
           WHERE tenant_id = $1 AND show_id = $2 AND available >= $3 \
           ORDER BY bucket >= $5 DESC, bucket LIMIT 1 FOR UPDATE SKIP LOCKED)"
    } else {
        "UPDATE inventory_buckets SET available = available - $3, updated_at = $4 \
         WHERE tenant_id = $1 AND show_id = $2 AND bucket = ( \
           SELECT bucket FROM inventory_buckets \
           WHERE tenant_id = $1 AND show_id = $2 AND available >= $3 \
           ORDER BY bucket >= $5 DESC, bucket LIMIT 1)"
    };
    let taken = c
        .execute(
            sql(one)
                .bind(tenant)
                .bind(show_id)
                .bind(quantity)
                .bind(now)
                .bind(start),
        )
        .await?;
    if taken == 1 {
        return Ok(Take::Taken);
    }
    gather(c, backend, tenant, show_id, quantity, now).await
}

/// MySQL: locks one free bucket that covers `quantity`, searched from `start` round to
/// it. MySQL has no `UPDATE … WHERE key = (SELECT … FROM the same table)`, and InnoDB
/// locks every row a locking read reads, before `LIMIT`: each search walks the primary
/// key in order (no sort), so it locks only the bucket it returns.
async fn free_bucket_mysql(
    c: &mut Conn<'_>,
    tenant: &str,
    show_id: &str,
    quantity: i64,
    start: i64,
) -> Result<Option<i64>, Error> {
    for q in [
        "SELECT bucket FROM inventory_buckets \
         WHERE tenant_id = $1 AND show_id = $2 AND bucket >= $4 AND available >= $3 \
         ORDER BY bucket LIMIT 1 FOR UPDATE SKIP LOCKED",
        "SELECT bucket FROM inventory_buckets \
         WHERE tenant_id = $1 AND show_id = $2 AND bucket < $4 AND available >= $3 \
         ORDER BY bucket LIMIT 1 FOR UPDATE SKIP LOCKED",
    ] {
        let row = c
            .optional(sql(q).bind(tenant).bind(show_id).bind(quantity).bind(start))
            .await?;
        if let Some(row) = row {
            return Ok(Some(row.int("bucket")?));
        }
    }
    Ok(None)
}

/// The slow path: no free bucket covers the order alone. Locks what is free of the
/// reserve and the buckets (never waiting on a row another transaction holds) and takes
/// the quantity from several; when the free rows hold too little, the committed stock
/// tells sold out from busy.
async fn gather(
    c: &mut Conn<'_>,
    backend: Backend,
    tenant: &str,
    show_id: &str,
    quantity: i64,
    now: i64,
) -> Result<Take, Error> {
    // PostgreSQL and MySQL skip the rows others hold; SQLite has one writer at a time.
    let (reserve_q, buckets_q) = if backend != Backend::Sqlite {
        (
            "SELECT available FROM inventory \
             WHERE tenant_id = $1 AND show_id = $2 AND available > 0 FOR UPDATE SKIP LOCKED",
            "SELECT bucket, available FROM inventory_buckets \
             WHERE tenant_id = $1 AND show_id = $2 AND available > 0 \
             ORDER BY bucket FOR UPDATE SKIP LOCKED",
        )
    } else {
        (
            "SELECT available FROM inventory \
             WHERE tenant_id = $1 AND show_id = $2 AND available > 0",
            "SELECT bucket, available FROM inventory_buckets \
             WHERE tenant_id = $1 AND show_id = $2 AND available > 0 ORDER BY bucket",
        )
    };
    let reserve = match c
        .optional(sql(reserve_q).bind(tenant).bind(show_id))
        .await?
    {
        Some(row) => row.int("available")?,
        None => 0,
    };
    let mut buckets = Vec::new();
    for row in c.all(sql(buckets_q).bind(tenant).bind(show_id)).await? {
        buckets.push((row.int("bucket")?, row.int("available")?));
    }
    let free = reserve + buckets.iter().map(|(_, a)| a).sum::<i64>();
    if free < quantity {
        // Committed stock, locked rows included (a plain read waits on nothing).
        let available = show(c, tenant, show_id).await?.map_or(0, |s| s.available);
        return Ok(if available < quantity {
            Take::SoldOut { available }
        } else {
            Take::Busy
        });
    }
    let mut left = quantity;
    let from_reserve = reserve.min(left);
    if from_reserve > 0 {
        c.execute(
            sql(
                "UPDATE inventory SET available = available - $3, updated_at = $4 \
                 WHERE tenant_id = $1 AND show_id = $2",
            )
            .bind(tenant)
            .bind(show_id)
            .bind(from_reserve)
            .bind(now),
        )
        .await?;
        left -= from_reserve;
    }
    for (bucket, available) in buckets {
        if left == 0 {
            break;
        }
        let take = available.min(left);
        take_from(c, tenant, show_id, bucket, take, now).await?;
        left -= take;
    }
    Ok(Take::Taken)
}

/// Takes `quantity` from one bucket this transaction has locked (a negative one puts
/// it back).
async fn take_from(
    c: &mut Conn<'_>,
    tenant: &str,
    show_id: &str,
    bucket: i64,
    quantity: i64,
    now: i64,
) -> Result<(), Error> {
    c.execute(
        sql(
            "UPDATE inventory_buckets SET available = available - $4, updated_at = $5 \
             WHERE tenant_id = $1 AND show_id = $2 AND bucket = $3",
        )
        .bind(tenant)
        .bind(show_id)
        .bind(bucket)
        .bind(quantity)
        .bind(now),
    )
    .await?;
    Ok(())
}

/// One inventory hold (voucher) per order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hold {
    pub hold_id: String,
    pub order_id: String,
    pub show_id: String,
    pub quantity: i64,
    /// `held` or `released`.
    pub status: String,
    pub created_at: i64,
    pub released_at: Option<i64>,
    /// The fencing token the release was written with.
    pub release_token: Option<i64>,
    pub release_owner: Option<String>,
}

fn hold_from(row: &Row) -> Result<Hold, Error> {
    Ok(Hold {
        hold_id: row.text("hold_id")?,
        order_id: row.text("order_id")?,
        show_id: row.text("show_id")?,
        quantity: row.int("quantity")?,
        status: row.text("status")?,
        created_at: row.int("created_at")?,
        released_at: row.opt_int("released_at")?,
        release_token: row.opt_int("release_token")?,
        release_owner: row.opt_text("release_owner")?,
    })
}

pub(crate) async fn insert_hold(
    c: &mut Conn<'_>,
    tenant: &str,
    order_id: &str,
    show_id: &str,
    quantity: i64,
    now: i64,
) -> Result<Hold, Error> {
    let hold_id = new_id("hold");
    c.execute(
        sql(
            "INSERT INTO inventory_holds (hold_id, tenant_id, order_id, show_id, quantity, \
               status, created_at) VALUES ($1, $2, $3, $4, $5, 'held', $6)",
        )
        .bind(&hold_id)
        .bind(tenant)
        .bind(order_id)
        .bind(show_id)
        .bind(quantity)
        .bind(now),
    )
    .await?;
    Ok(Hold {
        hold_id,
        order_id: order_id.to_owned(),
        show_id: show_id.to_owned(),
        quantity,
        status: "held".into(),
        created_at: now,
        released_at: None,
        release_token: None,
        release_owner: None,
    })
}

pub(crate) async fn hold_of(
    c: &mut Conn<'_>,
    tenant: &str,
    order_id: &str,
) -> Result<Option<Hold>, Error> {
    const Q: &str = "SELECT hold_id, order_id, show_id, quantity, status, created_at, \
         released_at, release_token, release_owner \
         FROM inventory_holds WHERE tenant_id = $1 AND order_id = $2";
    c.optional(sql(Q).bind(tenant).bind(order_id))
        .await?
        .as_ref()
        .map(hold_from)
        .transpose()
}

/// Releases the order's hold (held → released) and returns its quantity to the show's
/// stock, recording the fencing token and owner that did it. False when the hold was
/// already released (nothing changes).
pub(crate) async fn release_hold(
    c: &mut Conn<'_>,
    tenant: &str,
    order_id: &str,
    token: i64,
    owner: &str,
    now: i64,
) -> Result<bool, Error> {
    let release = c.pick(
        "UPDATE inventory_holds SET status = 'released', released_at = $3, \
           release_token = $4, release_owner = $5 \
         WHERE tenant_id = $1 AND order_id = $2 AND status = 'held' \
         RETURNING show_id, quantity",
        // MySQL has no UPDATE … RETURNING: the row is read back below.
        "UPDATE inventory_holds SET status = 'released', released_at = $3, \
           release_token = $4, release_owner = $5 \
         WHERE tenant_id = $1 AND order_id = $2 AND status = 'held'",
    );
    let q = sql(release)
        .bind(tenant)
        .bind(order_id)
        .bind(now)
        .bind(token)
        .bind(owner);
    let released = if c.backend() == Backend::Mysql {
        if c.execute(q).await? == 0 {
            return Ok(false);
        }
        // The row this transaction just updated (and holds locked).
        c.optional(
            sql("SELECT show_id, quantity FROM inventory_holds \
                 WHERE tenant_id = $1 AND order_id = $2")
            .bind(tenant)
            .bind(order_id),
        )
        .await?
    } else {
        c.optional(q).await?
    };
    let Some(row) = released else {
        return Ok(false);
    };
    let show_id = row.text("show_id")?;
    let quantity = row.int("quantity")?;
    // Back into a bucket nobody holds (any will do); the reserve when all are held.
    let returned = if c.backend() == Backend::Mysql {
        // In key order, not by `available`: InnoDB would lock every bucket it sorted.
        let free = c
            .optional(
                sql(
                    "SELECT bucket FROM inventory_buckets WHERE tenant_id = $1 AND show_id = $2 \
                     ORDER BY bucket LIMIT 1 FOR UPDATE SKIP LOCKED",
                )
                .bind(tenant)
                .bind(&show_id),
            )
            .await?;
        match free {
            Some(bucket) => {
                take_from(c, tenant, &show_id, bucket.int("bucket")?, -quantity, now).await?;
                1
            }
            None => 0,
        }
    } else {
        let into_bucket = if c.backend() == Backend::Postgres {
            "UPDATE inventory_buckets SET available = available + $3, updated_at = $4 \
             WHERE tenant_id = $1 AND show_id = $2 AND bucket = ( \
               SELECT bucket FROM inventory_buckets WHERE tenant_id = $1 AND show_id = $2 \
               ORDER BY available LIMIT 1 FOR UPDATE SKIP LOCKED)"
        } else {
            "UPDATE inventory_buckets SET available = available + $3, updated_at = $4 \
             WHERE tenant_id = $1 AND show_id = $2 AND bucket = ( \
               SELECT bucket FROM inventory_buckets WHERE tenant_id = $1 AND show_id = $2 \
               ORDER BY available LIMIT 1)"
        };
        c.execute(
            sql(into_bucket)
                .bind(tenant)
                .bind(&show_id)
                .bind(quantity)
                .bind(now),
        )
        .await?
    };
    if returned == 0 {
        c.execute(
            sql(
                "UPDATE inventory SET available = available + $3, updated_at = $4 \
                 WHERE tenant_id = $1 AND show_id = $2",
            )
            .bind(tenant)
            .bind(&show_id)
            .bind(quantity)
            .bind(now),
        )
        .await?;
    }
    Ok(true)
}
