//! Runs the HTTP benchmark and prints its report as JSON (what `idem bench http` shows).
//!
//! `cargo run --release -p idem-bench --example bench_http [PHASE_MS] [CONCURRENCY]`

use std::time::Duration;

use idem_bench::http::{bench, BenchOptions};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let mut options = BenchOptions::default();
    if let Some(ms) = args.next() {
        options.phase = Duration::from_millis(ms.parse()?);
    }
    if let Some(c) = args.next() {
        options.concurrency = c.parse()?;
    }
    let report = bench(options).await?;
    println!("{}", serde_json::to_string_pretty(&report)?);
    Ok(())
}
