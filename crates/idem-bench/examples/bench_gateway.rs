//! Runs the gateway benchmark outside the CLI:
//! `cargo run --release -p idem-bench --example bench_gateway -- [--json] [--phase-ms N]
//! [--rounds N] [--concurrency N] [--storm N] [--redis-url URL] [--nginx PATH]
//! [--scenarios pass,keyed]`.

use idem_bench::gateway::{bench, BenchOptions};

#[tokio::main]
async fn main() {
    let mut opts = BenchOptions::default();
    let mut json = false;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut num = |what: &str| -> u64 {
            args.next()
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("{what} needs a number"))
        };
        match a.as_str() {
            "--json" => json = true,
            "--phase-ms" => opts.phase_ms = num("--phase-ms"),
            "--rounds" => opts.rounds = num("--rounds") as usize,
            "--concurrency" => opts.concurrency = num("--concurrency") as usize,
            "--storm" => opts.storm = num("--storm") as usize,
            "--redis-url" => opts.redis_url = args.next(),
            "--nginx" => opts.nginx = args.next().map(Into::into),
            "--scenarios" => {
                opts.scenarios = args
                    .next()
                    .expect("--scenarios needs pass,keyed")
                    .split(',')
                    .map(str::to_string)
                    .collect()
            }
            other => panic!("unknown argument {other}"),
        }
    }
    match bench(opts).await {
        Ok(report) if json => println!("{}", serde_json::to_string_pretty(&report).unwrap()),
        Ok(report) => print!("{}", report.to_text()),
        Err(e) => {
            eprintln!("bench failed: {e}");
            std::process::exit(1);
        }
    }
}
