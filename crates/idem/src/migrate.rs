//! `idem migrate`: apply the store's schema migrations, which opening a store does.

use std::process::ExitCode;

use crate::cli::CliResult;
use crate::open;

pub async fn run(url: &str) -> CliResult {
    open::open_store(url).await?;
    println!("migrations applied to {}", open::redact(url));
    Ok(ExitCode::SUCCESS)
}
