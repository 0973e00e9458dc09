//! The campaign report for people: one self-contained HTML5 page (inline CSS, inline
//! SVG charts) drawn from a finished [`Report`].
//!
//! Rendering only: it decides nothing about pass or fail and checks no invariant, it
//! shows what `check` put in the report. It must not fetch anything (no CDN, fonts,
//! images or links to load) and must not emit scripts: the page is attached to
//! incidents and opened offline. The markup is maud's, so every string from the
//! report (targets, keys and details come from the system under test) is escaped;
//! the constant CSS is the only raw splice.

mod charts;
mod sections;
#[cfg(test)]
mod tests;

use std::fmt;

use maud::{html, PreEscaped, DOCTYPE};

use crate::report::Report;
use charts::{Scale, OK_FILL, REPLAY_FILL, RETRY_FILL};

/// Inlined as is: a constant with no `<`, and CSS inside `<style>` is raw text that
/// escaping would corrupt.
const CSS: &str = "body{font:14px/1.45 system-ui,sans-serif;margin:0;color:#222;background:#fff}\
header,main{max-width:1100px;margin:0 auto;padding:0 1em}\
h1{font-size:1.4em;margin:1em 0 .3em}h2{font-size:1.15em;margin-top:2em}\
dl{display:grid;grid-template-columns:max-content 1fr;gap:.1em 1em;margin:.5em 0}dt{color:#555}dd{margin:0}\
.wrap{overflow-x:auto}table{border-collapse:collapse;margin:.5em 0}\
td,th{border:1px solid #ccc;padding:3px 8px;text-align:left;vertical-align:top}th{background:#f3f3f3}\
td.n{text-align:right;font-variant-numeric:tabular-nums}\
.pass{color:#176b25;font-weight:bold}.fail{color:#b00020;font-weight:bold}.note{color:#555}\
figure{margin:.5em 0}svg{display:block;width:100%;height:auto}svg text{font:11px system-ui,sans-serif;fill:#333}\
.legend span{display:inline-block;width:.9em;height:.9em;margin:0 .3em 0 1em;vertical-align:middle}";

/// A number with one decimal, the precision of every SVG coordinate.
struct F1(f64);

impl fmt::Display for F1 {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:.1}", self.0)
    }
}

/// Milliseconds as seconds with three decimals, by integer arithmetic (exact, stable).
fn secs3(ms: u64) -> String {
    format!("{}.{:03}", ms / 1000, ms % 1000)
}

/// Milliseconds as seconds with one decimal (truncated).
fn secs1(ms: u64) -> String {
    format!("{}.{}", ms / 1000, (ms % 1000) / 100)
}

fn kind_fill(kind: &str) -> &'static str {
    match kind {
        "kill" => "#b00020",
        "stop" => "#d9822b",
        "gateway" => "#8e5bb5",
        "db-conn" => "#3b6fb6",
        "redis" => "#c0392b",
        "bus" => "#2a9d8f",
        "net" => "#6d6d6d",
        _ => "#999999",
    }
}

/// The whole page. Deterministic: the same report gives the same bytes.
pub fn render(report: &Report) -> String {
    let r = report;
    let sc = Scale::of(r);
    let page = html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { "idem chaos seed " (r.seed) " — " (if r.passed { "PASSED" } else { "FAILED" }) }
                style { (PreEscaped(CSS)) }
            }
            body {
                (sections::header(r))
                main {
                    section {
                        h2 { "Fault timeline" }
                        @if r.faults.is_empty() {
                            p.note { "No faults were injected." }
                        }
                        figure {
                            (charts::timeline(r, &sc))
                            figcaption.note {
                                "One lane per fault kind; hover a fault for its target and detail. \
                                 The dashed line marks the start of the settle phase."
                            }
                        }
                    }
                    section {
                        h2 { "Arrivals over time" }
                        @if r.arrivals.is_empty() {
                            p.note { "No arrivals recorded." }
                        } @else {
                            figure {
                                (charts::arrivals(r, &sc))
                                figcaption.legend {
                                    "attempts per second:"
                                    span style=(format_args!("background:{OK_FILL}")) {} "ok"
                                    span style=(format_args!("background:{REPLAY_FILL}")) {} "replayed"
                                    span style=(format_args!("background:{RETRY_FILL}")) {} "retried"
                                    @if !r.faults.is_empty() {
                                        " · fault windows:"
                                        @for kind in charts::lanes(r) {
                                            (sections::swatch(&kind)) (kind)
                                        }
                                    }
                                }
                            }
                        }
                        @if !r.availability_by_fault.is_empty() {
                            (sections::availability_table(r))
                        }
                    }
                    (sections::invariants(r))
                    (sections::anomalies(r))
                    (sections::faults(r))
                }
            }
        }
    };
    let mut out = page.into_string();
    out.push('\n');
    out
}
