//! Search: by idempotency key (a prefix, within a tenant; keys that only arrived are
//! found too), by result reference, and by the host's kinds.

use axum::extract::State;
use axum::response::Response;
use idem_core::{RecordSummary, TenantId};
use maud::{html, Markup};
use serde::Deserialize;

use super::shown;
use crate::access::{Operator, Params};
use crate::error::ConsoleError;
use crate::ext::SearchKind;
use crate::view::{key_href, row, table, time};
use crate::Console;

/// Rows a search shows.
const RESULTS: usize = 100;

#[derive(Deserialize, Default)]
pub(crate) struct SearchQuery {
    #[serde(default)]
    q: String,
    #[serde(default)]
    by: String,
    #[serde(default)]
    tenant: String,
}

pub(crate) async fn page(
    State(console): State<Console>,
    op: Operator,
    Params(query): Params<SearchQuery>,
) -> Response {
    shown(&op, "Search", "Search", body(&console, &query).await)
}

fn kinds(console: &Console) -> Vec<SearchKind> {
    let mut kinds = vec![SearchKind {
        value: "key",
        label: "idempotency key",
        needs_tenant: true,
    }];
    if let Some(ext) = console.extension() {
        kinds.extend(ext.search_kinds());
    }
    kinds.push(SearchKind {
        value: "ref",
        label: "result reference",
        needs_tenant: true,
    });
    kinds
}

fn form(kinds: &[SearchKind], needle: &str, by: &str, tenant: &str) -> Markup {
    let optional: Vec<&str> = kinds
        .iter()
        .filter(|k| !k.needs_tenant)
        .map(|k| k.label)
        .collect();
    let tenant_label = if optional.is_empty() {
        "Tenant".to_owned()
    } else {
        format!("Tenant (not needed for an {})", optional.join(" or "))
    };
    html! {
        form class="inline" method="get" action="/console/search" role="search" {
            div class="field" {
                label for="q" { "Find" }
                input id="q" name="q" value=(needle) maxlength="255";
            }
            div class="field" {
                label for="by" { "By" }
                select id="by" name="by" {
                    @for k in kinds {
                        option value=(k.value) selected[k.value == by] { (k.label) }
                    }
                }
            }
            div class="field" {
                label for="tenant" { (tenant_label) }
                input id="tenant" name="tenant" value=(tenant) maxlength="128";
            }
            button type="submit" { "Search" }
        }
    }
}

/// Rows of (tenant, key link, state, time).
pub fn record_rows(records: &[RecordSummary]) -> Vec<Markup> {
    records
        .iter()
        .map(|r| {
            key_row(
                &r.tenant,
                &r.key,
                &r.state.as_str().to_lowercase(),
                r.updated_at,
            )
        })
        .collect()
}

/// One row of a key found: tenant, key (linked), state, time.
pub fn key_row(tenant: &str, key: &str, state: &str, at: i64) -> Markup {
    html! {
        tr {
            td { (tenant) }
            td { a href=(key_href(tenant, key)) { (key) } }
            td { (state) }
            td { (time(at)) }
        }
    }
}

async fn body(console: &Console, query: &SearchQuery) -> Result<Markup, ConsoleError> {
    let needle = query.q.trim();
    let by = if query.by.is_empty() {
        "key"
    } else {
        query.by.as_str()
    };
    let tenant = query.tenant.trim();
    let kinds = kinds(console);
    let form = form(&kinds, needle, by, tenant);
    if needle.is_empty() {
        return Ok(html! { h1 { "Search" } (form) });
    }
    let Some(kind) = kinds.iter().find(|k| k.value == by) else {
        let names: Vec<&str> = kinds.iter().map(|k| k.label).collect();
        return Ok(html! {
            h1 { "Search" } (form)
            h2 { "Results" }
            p role="alert" { "Search by " (names.join(", ")) "." }
        });
    };
    let tenant_id = match tenant {
        "" => None,
        t => match TenantId::new(t) {
            Ok(t) => Some(t),
            Err(e) => {
                return Ok(
                    html! { h1 { "Search" } (form) p role="alert" { "Tenant: " (e.to_string()) } },
                )
            }
        },
    };
    // Records are indexed per tenant: without one, a search would read every record.
    let tenant_id = match tenant_id {
        Some(t) => Some(t),
        None if kind.needs_tenant => {
            let needing: Vec<&str> = kinds
                .iter()
                .filter(|k| k.needs_tenant)
                .map(|k| k.label)
                .collect();
            return Ok(html! {
                h1 { "Search" } (form)
                p role="alert" {
                    "Give the tenant: a search by " (needing.join(", ")) " reads one tenant's index."
                }
            });
        }
        None => None,
    };
    let results = match (by, &tenant_id) {
        ("key", Some(t)) => by_key(console, t, needle).await?,
        ("ref", Some(t)) => by_ref(console, t, needle).await?,
        _ => match console.extension() {
            Some(ext) => ext.search(console, by, needle, tenant_id.as_ref()).await?,
            None => html! {},
        },
    };
    Ok(html! { h1 { "Search" } (form) h2 { "Results" } (results) })
}

async fn by_key(
    console: &Console,
    tenant: &TenantId,
    prefix: &str,
) -> Result<Markup, ConsoleError> {
    let found = console
        .inspect()
        .by_key_prefix(tenant, prefix, RESULTS)
        .await?;
    let mut rows = record_rows(&found);
    if rows.is_empty() {
        // Keys that only arrived (refused before a record) or whose record is gone.
        if let Some(t) = console.timeline() {
            rows = t
                .arrived_keys(tenant.as_str(), prefix, RESULTS)
                .await?
                .iter()
                .map(|k| key_row(&k.tenant, &k.key, "no record", k.last_at))
                .collect();
        }
    }
    Ok(table(
        Some("results"),
        "",
        &["tenant", "key", "state", "updated"],
        &rows,
    ))
}

/// Records and archive entries whose result reference is `reference`.
pub async fn by_ref(
    console: &Console,
    tenant: &TenantId,
    reference: &str,
) -> Result<Markup, ConsoleError> {
    let found = console
        .inspect()
        .by_result_ref(tenant, reference, RESULTS)
        .await?;
    let archived = console
        .archive()
        .archived_by_ref(Some(tenant), reference)
        .await?;
    Ok(html! {
        (table(Some("ref-keys"), "", &["tenant", "key", "state", "updated"], &record_rows(&found)))
        (archived_table(&archived))
    })
}

/// Archive entries found by reference (their keys are digests: the key is gone).
pub fn archived_table(archived: &[idem_core::ArchivedRecord]) -> Markup {
    if archived.is_empty() {
        return html! {};
    }
    let rows: Vec<Markup> = archived
        .iter()
        .map(|a| {
            row(&[
                a.tenant.to_string(),
                hex::encode(a.key_digest),
                a.state.to_string().to_lowercase(),
                time(a.archived_at),
            ])
        })
        .collect();
    html! {
        h3 { "Archived keys with this reference" }
        (table(None, "", &["tenant", "key digest", "state", "archived"], &rows))
    }
}
