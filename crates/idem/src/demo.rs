//! `idem demo …`: demonstrations, run by `idem-bench` on a store of their own unless
//! `--database-url` names one. Shows only; it must not touch a store it was not given.

use std::process::ExitCode;

use idem_bench::demo::DemoOptions;

use crate::cli::{orders_error, print_json, CliResult};

// `idem demo …`; a plain comment, so clap takes the about from the variant.
#[derive(clap::Args)]
pub struct DemoArgs {
    #[command(subcommand)]
    command: DemoCommand,
}

#[derive(clap::Subcommand)]
enum DemoCommand {
    /// Replay the 20:14 incident with and without idem, side by side.
    Incident {
        /// Print the result as JSON (a failure as an `error` object).
        #[arg(long)]
        json: bool,
    },
}

/// `explicit_url` is set only when the operator named a store; else a temporary one.
pub async fn run(explicit_url: Option<String>, args: DemoArgs) -> CliResult {
    let DemoCommand::Incident { json } = args.command;
    let report = idem_bench::demo::demo_incident(DemoOptions {
        database_url: explicit_url,
        ..DemoOptions::default()
    })
    .await
    .map_err(orders_error)?;
    if json {
        print_json(&report);
    } else {
        println!("{}", report.render_text());
    }
    Ok(ExitCode::SUCCESS)
}
