//! The audit: every console action, newest first.

use axum::extract::State;
use axum::response::Response;
use maud::{html, Markup};

use super::shown;
use crate::access::Operator;
use crate::error::ConsoleError;
use crate::tables::recent_audit;
use crate::view::{row, table, time};
use crate::Console;

/// Rows shown.
const SHOWN: i64 = 200;

pub(crate) async fn page(State(console): State<Console>, op: Operator) -> Response {
    shown(&op, "Audit", "Audit", body(&console).await)
}

async fn body(console: &Console) -> Result<Markup, ConsoleError> {
    let rows: Vec<Markup> = recent_audit(console.db(), SHOWN)
        .await?
        .into_iter()
        .map(|r| {
            row(&[
                time(r.at),
                r.operator,
                r.action,
                r.target,
                r.reason.unwrap_or_default(),
                r.outcome,
            ])
        })
        .collect();
    Ok(html! {
        h1 { "Audit" }
        p class="muted" {
            "Every console action, newest first (the last 200). Freezes made with the CLI are \
             in the freeze history."
        }
        (table(Some("audit"), "", &["at", "operator", "action", "target", "reason", "outcome"], &rows))
    })
}
