//! The page's text parts: the header and the tables (availability, invariants,
//! anomalies, faults). Shows what `check` put in the report and decides nothing;
//! every report string goes through maud's escaping, none is spliced raw.

use maud::{html, Markup};

use super::{kind_fill, secs1, secs3, F1};
use crate::report::{percent, rate, Report};

/// A scrollable table with a header row; `rows` are its `<tr>`s.
fn table(heads: &[&str], rows: Markup) -> Markup {
    html! {
        div.wrap {
            table {
                thead { tr { @for h in heads { th scope="col" { (h) } } } }
                tbody { (rows) }
            }
        }
    }
}

pub(super) fn verdict(passed: bool) -> Markup {
    html! {
        @if passed { span.pass { "PASSED" } } @else { span.fail { "FAILED" } }
    }
}

/// A swatch in the colour a kind's windows are shaded with.
pub(super) fn swatch(kind: &str) -> Markup {
    html! {
        span style=(format_args!("background:{};opacity:.35", kind_fill(kind))) {}
    }
}

pub(super) fn header(r: &Report) -> Markup {
    html! {
        header {
            h1 { "idem chaos — " (verdict(r.passed)) }
            dl {
                dt { "seed" } dd { (r.seed) }
                @if let Some(c) = &r.control {
                    dt { "control" } dd { "control: " (c) " — anomalies are expected here" }
                }
                dt { "topology" } dd { (r.services) " service(s), " (r.gateways) " gateway(s)" }
                dt { "NATS" } dd { (if r.nats { "yes" } else { "no" }) }
                dt { "duration" } dd { (secs1(r.duration_ms)) " s" }
                dt { "settle" } dd { (secs1(r.settle_ms)) " s" }
                dt { "intents" } dd { (r.intents) }
                dt { "acknowledged" } dd { (r.acknowledged) " (" (percent(Some(r.acknowledged_ratio))) ")" }
                dt { "answered" } dd { (r.answered) " (" (percent(Some(r.answered_ratio))) ")" }
                dt { "attempts" } dd { (r.attempts) }
            }
        }
    }
}

/// Completed answers per second inside each kind's windows against the calm rate.
pub(super) fn availability_table(r: &Report) -> Markup {
    let heads = [
        "kind",
        "faults",
        "window (s)",
        "answers inside",
        "inside (/s)",
        "outside (/s)",
        "availability",
    ];
    let rows = html! {
        @for (kind, a) in &r.availability_by_fault {
            tr {
                td.legend { (swatch(kind)) (kind) }
                td.n { (a.windows) }
                td.n { (F1(a.seconds)) }
                td.n { (a.answers) }
                td.n { (rate(a.inside_per_s)) }
                td.n { (rate(a.outside_per_s)) }
                td.n { (percent(a.ratio)) }
            }
        }
    };
    html! {
        h3 id="availability" { "Availability by fault kind" }
        (table(&heads, rows))
        p.note {
            "Completed answers (2xx or a definite refusal) by the time they arrived, \
             per second of the kind's merged windows, against the seconds of the active phase \
             outside every fault window."
        }
    }
}

pub(super) fn invariants(r: &Report) -> Markup {
    let rows = html! {
        @for i in &r.invariants {
            @let result = if i.passed { "pass" } else { "fail" };
            tr {
                td { (i.id) }
                td { (i.title) }
                td.n { (i.checked) }
                td.n { (i.anomalies) }
                td class=(result) { (result) }
            }
        }
    };
    html! {
        section {
            h2 { "Invariants" }
            @if r.invariants.is_empty() {
                p.note { "No invariants were checked." }
            } @else {
                (table(&["id", "title", "checked", "anomalies", "result"], rows))
            }
        }
    }
}

pub(super) fn anomalies(r: &Report) -> Markup {
    let heads = [
        "invariant",
        "intent",
        "key",
        "rows",
        "detail",
        "faults nearby",
    ];
    let rows = html! {
        @for a in &r.anomalies {
            tr {
                td { (a.invariant) }
                td { code { (a.intent.as_deref().unwrap_or("—")) } }
                td { code { (a.key.as_deref().unwrap_or("—")) } }
                td { code { (a.rows.join(", ")) } }
                td { (a.detail) }
                td {
                    @for (n, f) in a.faults.iter().enumerate() {
                        @if n > 0 { br; }
                        (f)
                    }
                }
            }
        }
    };
    html! {
        section {
            h2 { "Anomalies" }
            @if r.anomalies.is_empty() {
                p { "No anomalies." }
            } @else {
                (table(&heads, rows))
            }
        }
    }
}

/// A name → count table (faults by kind, observed evidence).
fn counts<'a>(head: &str, items: impl IntoIterator<Item = (&'a String, &'a u64)>) -> Markup {
    let rows = html! {
        @for (k, n) in items {
            tr { td { (k) } td.n { (n) } }
        }
    };
    table(&[head, "count"], rows)
}

pub(super) fn faults(r: &Report) -> Markup {
    let rows = html! {
        @for f in &r.faults {
            tr {
                td.n { (secs3(f.at_ms)) }
                td.n { (secs3(f.end_ms)) }
                td { (f.kind) }
                td { code { (f.target) } }
                td { (f.detail) }
            }
        }
    };
    html! {
        section {
            h2 { "Faults" }
            @if r.faults.is_empty() {
                p { "No faults were injected." }
            } @else {
                (table(&["at (s)", "end (s)", "kind", "target", "detail"], rows))
            }
            @if !r.faults_by_kind.is_empty() {
                h3 { "Faults by kind" }
                (counts("kind", &r.faults_by_kind))
            }
            h3 { "Observed" }
            @if r.observed.is_empty() {
                p.note { "Nothing recorded." }
            } @else {
                (counts("evidence", &r.observed))
            }
        }
    }
}
