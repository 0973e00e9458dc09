//! `idem keys show` and `idem keys audit`: one record, online or archived, for incident
//! work. Reads only; it must not change a record.

use std::process::ExitCode;

use idem_core::{IdempotencyKey, IdempotencyStore, Record, Scope, TenantId};
use serde::Serialize;

use crate::cli::{print_json, rfc3339, CliError, CliResult};
use crate::open;

// `idem keys …`; a plain comment, so clap takes the about from the variant.
#[derive(clap::Args)]
pub struct KeysArgs {
    #[command(subcommand)]
    command: KeysCommand,
}

#[derive(clap::Subcommand)]
enum KeysCommand {
    /// Audit lookup by order number (result reference) in the archive.
    Audit {
        /// The order number (result reference).
        #[arg(long)]
        order: String,
        /// The tenant, as the service authenticated it.
        #[arg(long)]
        tenant: Option<String>,
        /// Print the result as JSON (a failure as an `error` object).
        #[arg(long)]
        json: bool,
    },
    /// Show one record: state, version, owner, times, fingerprint, result reference.
    Show {
        /// The idempotency key.
        key: String,
        /// The tenant, as the service authenticated it.
        #[arg(long)]
        tenant: String,
        /// Print the result as JSON (a failure as an `error` object).
        #[arg(long)]
        json: bool,
    },
}

pub async fn run(url: &str, args: KeysArgs) -> CliResult {
    let invalid = |e: idem_core::KeyError| CliError::invalid(e.to_string());
    match args.command {
        KeysCommand::Show { key, tenant, json } => {
            let tenant = TenantId::new(tenant).map_err(invalid)?;
            let key = IdempotencyKey::new(key).map_err(invalid)?;
            show_key(url, &tenant, &key, json).await
        }
        KeysCommand::Audit {
            order,
            tenant,
            json,
        } => {
            let tenant = tenant.map(TenantId::new).transpose().map_err(invalid)?;
            audit(url, tenant.as_ref(), &order, json).await
        }
    }
}

async fn show_key(url: &str, tenant: &TenantId, key: &IdempotencyKey, json: bool) -> CliResult {
    let store = open::open_store(url).await?;
    match show(store.as_ref(), tenant, key).await? {
        Some(v) if json => print_json(&v),
        Some(v) => print_human(&v),
        None => {
            // Past the online tiers the key may be in the archive.
            let archived = match open::open_archive(url).await? {
                Some(archive) => archive.archived(tenant, key).await?,
                None => None,
            };
            match archived {
                Some(a) if json => print_json(&archived_view(&a)),
                Some(a) => print_archived(&a),
                None => {
                    eprintln!("no record for key {key} in tenant {tenant}");
                    return Ok(ExitCode::FAILURE);
                }
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

async fn audit(url: &str, tenant: Option<&TenantId>, order: &str, json: bool) -> CliResult {
    let Some(archive) = open::open_archive(url).await? else {
        return Err(CliError::invalid(
            "this store keeps no archive (Redis records only expire)",
        ));
    };
    let found = archive.archived_by_ref(tenant, order).await?;
    if json {
        print_json(&found.iter().map(archived_view).collect::<Vec<_>>());
    } else {
        for a in &found {
            print_archived(a);
            println!();
        }
    }
    if found.is_empty() {
        eprintln!("no archived record refers to {order}");
        return Ok(ExitCode::FAILURE);
    }
    Ok(ExitCode::SUCCESS)
}

#[derive(Serialize)]
pub struct KeyView {
    pub tenant: String,
    pub key: String,
    pub state: String,
    pub version: i64,
    pub owner: Option<String>,
    pub principal: String,
    pub attempts: i32,
    pub fingerprint: String,
    pub created_at: String,
    pub updated_at: String,
    pub completed_at: Option<String>,
    pub lease_expires_at: Option<String>,
    pub result_status: Option<u16>,
    pub result_ref: Option<String>,
    pub result_bytes: Option<usize>,
}

pub fn view(r: &Record) -> KeyView {
    KeyView {
        tenant: r.tenant.to_string(),
        key: r.key.to_string(),
        state: r.state.to_string(),
        version: r.version,
        owner: r.owner.as_ref().map(ToString::to_string),
        principal: r.principal.to_string(),
        attempts: r.attempts,
        fingerprint: r.fingerprint.to_hex(),
        created_at: rfc3339(r.created_at),
        updated_at: rfc3339(r.updated_at),
        completed_at: r.completed_at.map(rfc3339),
        lease_expires_at: r.lease_expires_at.map(rfc3339),
        result_status: r.result.as_ref().map(|x| x.status),
        result_ref: r.result.as_ref().and_then(|x| x.result_ref.clone()),
        result_bytes: r.result.as_ref().map(|x| x.body.len()),
    }
}

/// Looks the record up; `Ok(None)` when there is none.
pub async fn show(
    store: &dyn IdempotencyStore,
    tenant: &TenantId,
    key: &IdempotencyKey,
) -> Result<Option<KeyView>, idem_core::StoreError> {
    let scope = Scope::new(tenant.clone(), key.clone());
    Ok(store.get(&scope).await?.as_ref().map(view))
}

pub fn print_human(v: &KeyView) {
    let opt = |o: &Option<String>| o.clone().unwrap_or_else(|| "-".into());
    println!("tenant        {}", v.tenant);
    println!("key           {}", v.key);
    println!("state         {}", v.state);
    println!("version       {}", v.version);
    println!("owner         {}", opt(&v.owner));
    println!("principal     {}", v.principal);
    println!("attempts      {}", v.attempts);
    println!("fingerprint   {}", v.fingerprint);
    println!("created at    {}", v.created_at);
    println!("updated at    {}", v.updated_at);
    println!("completed at  {}", opt(&v.completed_at));
    println!("lease until   {}", opt(&v.lease_expires_at));
    println!(
        "result        {}",
        match v.result_status {
            Some(s) => format!("status {s}, {} bytes", v.result_bytes.unwrap_or(0)),
            None => "-".into(),
        }
    );
    println!("result ref    {}", opt(&v.result_ref));
}

#[derive(Serialize)]
pub struct ArchivedView {
    pub tenant: String,
    pub tier: &'static str,
    pub key_digest: String,
    pub fingerprint: String,
    pub result_digest: Option<String>,
    pub result_ref: Option<String>,
    pub state: String,
    pub status: Option<u16>,
    pub first_processed_at: String,
    pub completed_at: Option<String>,
    pub archived_at: String,
}

pub fn archived_view(a: &idem_core::ArchivedRecord) -> ArchivedView {
    ArchivedView {
        tenant: a.tenant.to_string(),
        tier: "archive",
        key_digest: hex_string(&a.key_digest),
        fingerprint: a.fingerprint.to_hex(),
        result_digest: a.result_digest.as_ref().map(|d| hex_string(d)),
        result_ref: a.result_ref.clone(),
        state: a.state.to_string(),
        status: a.status,
        first_processed_at: rfc3339(a.first_processed_at),
        completed_at: a.completed_at.map(rfc3339),
        archived_at: rfc3339(a.archived_at),
    }
}

fn hex_string(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

pub fn print_archived(a: &idem_core::ArchivedRecord) {
    let v = archived_view(a);
    let opt = |o: &Option<String>| o.clone().unwrap_or_else(|| "-".into());
    println!("tenant        {}", v.tenant);
    println!("tier          archive (out of the online index; no replay)");
    println!("key digest    {}", v.key_digest);
    println!("state         {}", v.state);
    println!("fingerprint   {}", v.fingerprint);
    println!("result digest {}", opt(&v.result_digest));
    println!("result ref    {}", opt(&v.result_ref));
    println!("first seen    {}", v.first_processed_at);
    println!("completed at  {}", opt(&v.completed_at));
    println!("archived at   {}", v.archived_at);
}
