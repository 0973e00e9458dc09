//! `idem freeze` and `idem unfreeze`: switch the order service's automatic chain off and
//! on for a scope, straight on its database. What a freeze means is `idem_orders::freeze`'s.

use std::process::ExitCode;

use idem_orders::{FreezeRequest, FreezeScope, FreezeWhat};

use crate::cli::{orders_error, print_json, CliResult};

#[derive(clap::Args)]
pub struct FreezeArgs {
    /// What to act on: user:U, show:S or all.
    #[arg(long)]
    scope: String,
    /// payment-confirm,ticketing,inventory-release (or all)
    #[arg(long, default_value = "all")]
    what: String,
    /// The tenant, as the service authenticated it.
    #[arg(long)]
    tenant: Option<String>,
    /// Why, in words; recorded with the change.
    #[arg(long)]
    reason: Option<String>,
    /// Print the result as JSON (a failure as an `error` object).
    #[arg(long)]
    json: bool,
}

#[derive(clap::Args)]
pub struct UnfreezeArgs {
    /// What to act on: user:U, show:S or all.
    #[arg(long)]
    scope: String,
    /// Which automatic steps, comma-separated (payment-confirm, ticketing, inventory-release); all when omitted.
    #[arg(long, default_value = "all")]
    what: String,
    /// The tenant, as the service authenticated it.
    #[arg(long)]
    tenant: Option<String>,
    /// Print the result as JSON (a failure as an `error` object).
    #[arg(long)]
    json: bool,
}

pub async fn freeze(url: &str, args: FreezeArgs) -> CliResult {
    let request = request(&args.scope, &args.what, args.tenant, args.reason)?;
    change(url, request, false, args.json).await
}

pub async fn unfreeze(url: &str, args: UnfreezeArgs) -> CliResult {
    let request = request(&args.scope, &args.what, args.tenant, None)?;
    change(url, request, true, args.json).await
}

fn request(
    scope: &str,
    what: &str,
    tenant: Option<String>,
    reason: Option<String>,
) -> Result<FreezeRequest, idem_core::StoreError> {
    let scope: FreezeScope = scope.parse().map_err(orders_error)?;
    let what = FreezeWhat::parse_list(what).map_err(orders_error)?;
    let mut request = FreezeRequest::new(scope, what);
    request.tenant = tenant;
    request.reason = reason;
    request.actor = std::env::var("USER").ok();
    Ok(request)
}

async fn change(url: &str, request: FreezeRequest, unfreeze: bool, json: bool) -> CliResult {
    let change = if unfreeze {
        idem_orders::freeze::unfreeze(url, &request).await
    } else {
        idem_orders::freeze::freeze(url, &request).await
    }
    .map_err(orders_error)?;
    if json {
        print_json(&change);
    } else {
        let verb = if unfreeze { "unfroze" } else { "froze" };
        println!("{verb} {} switch(es)", change.changed.len());
        println!("active freezes: {}", change.active.len());
        for f in &change.active {
            println!("  {}", serde_json::to_string(f).unwrap_or_default());
        }
    }
    Ok(ExitCode::SUCCESS)
}
