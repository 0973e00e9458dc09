//! `idem bench sweep`: the retention sweeper over N expired records (`idem_bench::sweep`),
//! in a temporary SQLite file or a PostgreSQL schema of its own, dropped afterwards.

use std::process::ExitCode;

use idem_sql::{OpenOptions, SqlStore, Store};

use super::baseline::drop_bench_schema;
use crate::cli::{print_json, CliResult};
use crate::open::{backend_of, bench_url, Backend};
use crate::sweep::redis_has_nothing_to_sweep;

pub async fn run(
    url: &str,
    records: u64,
    concurrency: usize,
    batch: usize,
    duty: f64,
    json: bool,
) -> CliResult {
    if backend_of(url)? == Backend::Redis {
        return Err(redis_has_nothing_to_sweep().into());
    }
    let (url, _tmp) = bench_url(url, "sweep.db")?;
    // PostgreSQL: a schema of its own, dropped when the bench ends.
    let options = {
        let mut o = OpenOptions::default();
        o.pg_schema = Some(format!(
            "idem_bench_sweep_{}",
            uuid::Uuid::now_v7().simple()
        ));
        o.pg_max_connections = Some((concurrency + 4) as u32);
        o
    };
    let opened = Store::open(&url, &options).await?;
    let sql = opened.sql().ok_or_else(redis_has_nothing_to_sweep)?.clone();
    let report = idem_bench::sweep::bench(
        &sql,
        idem_bench::sweep::BenchOptions {
            records,
            concurrency,
            batch,
            duty,
            ..idem_bench::sweep::BenchOptions::default()
        },
    )
    .await;
    let dropped = match opened.sql().and_then(SqlStore::postgres) {
        Some(pg) => drop_bench_schema(pg.pool(), pg.schema().unwrap_or_default()).await,
        None => Ok(()),
    };
    let report = report?;
    dropped?;
    if json {
        print_json(&report);
    } else {
        idem_bench::sweep::print_human(&report);
    }
    Ok(ExitCode::SUCCESS)
}
