-- A show's stock in bucket rows, so that concurrent orders of one show lock different
-- rows (`crate::ledgers` inventory). The stock a show had moves into its buckets; its
-- `inventory.available` becomes the reserve, empty from here on (a build from before
-- the buckets sees an empty reserve and answers sold out: it cannot oversell).

CREATE TABLE inventory_buckets (
    tenant_id  TEXT   NOT NULL,
    show_id    TEXT   NOT NULL,
    bucket     BIGINT NOT NULL CHECK (bucket >= 0),
    available  BIGINT NOT NULL CHECK (available >= 0),
    updated_at BIGINT NOT NULL,
    PRIMARY KEY (tenant_id, show_id, bucket)
);

WITH RECURSIVE n(bucket) AS (SELECT CAST(0 AS BIGINT)
    UNION ALL SELECT bucket + 1 FROM n WHERE bucket + 1 < 32)
INSERT INTO inventory_buckets (tenant_id, show_id, bucket, available, updated_at)
SELECT i.tenant_id, i.show_id, n.bucket,
       i.available / 32 + CASE WHEN n.bucket < i.available % 32 THEN 1 ELSE 0 END,
       i.updated_at
FROM inventory i CROSS JOIN n;

UPDATE inventory SET available = 0;

-- Which consumer instance claimed a delivery (with `available_at` as the claim's end):
-- instances of one consumer take disjoint deliveries instead of racing on the same.
ALTER TABLE message_deliveries ADD COLUMN claim TEXT;
