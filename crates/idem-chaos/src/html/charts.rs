//! The two inline SVG charts (fault timeline, arrivals per second) and their shared
//! x axis. Owns the geometry only: it reads the report, never judges it, and draws
//! nothing that needs a script or an external resource.

use std::collections::BTreeSet;

use maud::{html, Markup};

use super::{kind_fill, secs1, F1};
use crate::report::{Bucket, FaultEvent, Report};

/// Lane order of the timeline; kinds not listed here follow, alphabetically.
const KIND_ORDER: [&str; 7] = ["kill", "stop", "gateway", "db-conn", "redis", "bus", "net"];

// SVG geometry, in viewBox units (the SVG scales to the container width).
const W: f64 = 1000.0;
/// Left margin: room for the lane labels, shared by both charts so their x axes align.
pub(super) const ML: f64 = 84.0;
const MR: f64 = 14.0;
pub(super) const PW: f64 = W - ML - MR;
const LANE_H: f64 = 22.0;
const TOP: f64 = 18.0;
const AXIS_H: f64 = 30.0;
const ARR_H: f64 = 150.0;
/// Narrower faults would vanish at 1280 px.
const MIN_FAULT_W: f64 = 2.0;

pub(super) const OK_FILL: &str = "#3b6fb6";
pub(super) const REPLAY_FILL: &str = "#8e5bb5";
pub(super) const RETRY_FILL: &str = "#d9822b";

/// Kinds that get a lane: the known ones present, in `KIND_ORDER`, then unknown ones,
/// so every fault has somewhere to be drawn. Counts with no event still get a lane.
pub(super) fn lanes(r: &Report) -> Vec<String> {
    let present: BTreeSet<&str> = r
        .faults
        .iter()
        .map(|f| f.kind.as_str())
        .chain(
            r.faults_by_kind
                .iter()
                .filter(|(_, n)| **n > 0)
                .map(|(k, _)| k.as_str()),
        )
        .collect();
    let mut out: Vec<String> = KIND_ORDER
        .iter()
        .filter(|k| present.contains(*k))
        .map(|k| (*k).to_owned())
        .collect();
    out.extend(
        present
            .iter()
            .filter(|k| !KIND_ORDER.contains(k))
            .map(|k| (*k).to_owned()),
    );
    out
}

fn fault_end(f: &FaultEvent) -> u64 {
    f.end_ms.max(f.at_ms)
}

/// The shared x extent in ms: the whole campaign, or further if a fault or an arrival
/// bucket runs past it, so nothing is drawn outside the plot. Never zero.
fn span_ms(r: &Report) -> u64 {
    let faults = r.faults.iter().map(fault_end).max().unwrap_or(0);
    let arrivals = r
        .arrivals
        .iter()
        .map(|b| b.second.saturating_add(1).saturating_mul(1000))
        .max()
        .unwrap_or(0);
    r.duration_ms
        .saturating_add(r.settle_ms)
        .max(faults)
        .max(arrivals)
        .max(1)
}

/// The x axis both charts share.
pub(super) struct Scale {
    span_ms: u64,
}

impl Scale {
    pub(super) fn of(r: &Report) -> Self {
        Scale {
            span_ms: span_ms(r),
        }
    }

    fn x(&self, ms: u64) -> f64 {
        ML + (ms as f64 / self.span_ms as f64).min(1.0) * PW
    }

    /// Left edge and width of a fault's window.
    fn window(&self, f: &FaultEvent) -> (f64, f64) {
        let x = self.x(f.at_ms);
        (x, (self.x(fault_end(f)) - x).max(MIN_FAULT_W))
    }
}

/// A round tick step giving at most ten ticks.
fn tick_step_ms(span: u64) -> u64 {
    const STEPS: [u64; 16] = [
        100, 200, 500, 1_000, 2_000, 5_000, 10_000, 15_000, 30_000, 60_000, 120_000, 300_000,
        600_000, 900_000, 1_800_000, 3_600_000,
    ];
    STEPS
        .iter()
        .copied()
        .find(|s| span / s <= 10)
        .unwrap_or_else(|| span.div_ceil(10).max(1))
}

/// Tick marks and labels along `y`, plus the axis line.
fn x_axis(sc: &Scale, y: f64) -> Markup {
    let span = sc.span_ms;
    let step = tick_step_ms(span);
    let ticks =
        std::iter::successors(Some(0u64), |t| t.checked_add(step)).take_while(|t| *t <= span);
    let label = |t: u64| {
        if step < 1000 {
            secs1(t)
        } else {
            (t / 1000).to_string()
        }
    };
    // SVG elements get an explicit end tag: HTML has no void `line` or `rect`, and
    // maud writes no `/>`.
    html! {
        line x1=(F1(ML)) y1=(F1(y)) x2=(F1(ML + PW)) y2=(F1(y)) stroke="#888" {}
        @for t in ticks {
            @let x = sc.x(t);
            line x1=(F1(x)) y1=(F1(y)) x2=(F1(x)) y2=(F1(y + 4.0)) stroke="#888" {}
            text x=(F1(x)) y=(F1(y + 16.0)) text-anchor="middle" { (label(t)) }
        }
        text x=(F1(ML + PW)) y=(F1(y + 28.0)) text-anchor="end" { "time (s)" }
    }
}

/// Fault timeline. The only `<rect>`s in it are the faults (one each), so the chart
/// can be checked by counting them.
pub(super) fn timeline(r: &Report, sc: &Scale) -> Markup {
    let lanes = lanes(r);
    let plot_h = LANE_H * lanes.len().max(1) as f64;
    let h = TOP + plot_h + AXIS_H;
    let sx = sc.x(r.duration_ms);
    html! {
        svg id="timeline" viewBox=(format_args!("0 0 {W:.0} {h:.0}")) role="img" aria-label="fault timeline" {
            @for (i, kind) in lanes.iter().enumerate() {
                @let top = TOP + LANE_H * i as f64;
                text x=(F1(ML - 6.0)) y=(F1(top + LANE_H / 2.0 + 4.0)) text-anchor="end" { (kind) }
                line x1=(F1(ML)) y1=(F1(top + LANE_H)) x2=(F1(ML + PW)) y2=(F1(top + LANE_H)) stroke="#eee" {}
            }
            @for f in &r.faults {
                // Every fault's kind has a lane (see `lanes`).
                @let lane = lanes.iter().position(|k| *k == f.kind).unwrap_or(0);
                @let (x, w) = sc.window(f);
                rect x=(F1(x)) y=(F1(TOP + LANE_H * lane as f64 + 3.0)) width=(F1(w)) height=(F1(LANE_H - 6.0))
                    fill=(kind_fill(&f.kind)) fill-opacity="0.8" {
                    title {
                        (f.kind) " " (f.target) " " (f.detail)
                        " (" (secs1(f.at_ms)) "–" (secs1(fault_end(f))) " s)"
                    }
                }
            }
            line class="settle" x1=(F1(sx)) y1=(F1(TOP - 4.0)) x2=(F1(sx)) y2=(F1(TOP + plot_h))
                stroke="#555" stroke-dasharray="4 3" {}
            text x=(F1(sx + 3.0)) y=(F1(TOP - 6.0)) { "settle" }
            (x_axis(sc, TOP + plot_h))
        }
    }
}

/// One stacked bar segment: x, y, width, height, fill.
type Segment = (f64, f64, f64, f64, &'static str);

/// Stacks each second's first answers, replays, then retried attempts on top.
fn segments(r: &Report, sc: &Scale, ymax: u64) -> Vec<Segment> {
    let per = |n: u64| n as f64 / ymax as f64 * ARR_H;
    let bw = sc.x(1000) - sc.x(0);
    let gap = if bw > 4.0 { 1.0 } else { 0.0 };
    let width = (bw - gap).max(0.5);
    let mut out = Vec::new();
    for b in &r.arrivals {
        let x = sc.x(b.second.saturating_mul(1000));
        let replayed = b.replayed.min(b.ok);
        let parts = [
            (b.ok - replayed, OK_FILL),
            (replayed, REPLAY_FILL),
            (b.retried, RETRY_FILL),
        ];
        let mut y = TOP + ARR_H;
        for (n, fill) in parts.into_iter().filter(|(n, _)| *n > 0) {
            let h = per(n);
            y -= h;
            out.push((x, y, width, h, fill));
        }
    }
    out
}

/// Stacked bars per second over the fault windows.
pub(super) fn arrivals(r: &Report, sc: &Scale) -> Markup {
    let total = |b: &Bucket| b.ok.saturating_add(b.retried);
    let ymax = r.arrivals.iter().map(total).max().unwrap_or(0).max(1);
    let h = TOP + ARR_H + AXIS_H;
    let base = TOP + ARR_H;
    html! {
        svg id="arrivals" viewBox=(format_args!("0 0 {W:.0} {h:.0}")) role="img" aria-label="arrivals per second" {
            // Fault windows behind the bars, so dips can be read against them.
            @for f in &r.faults {
                @let (x, w) = sc.window(f);
                rect x=(F1(x)) y=(F1(TOP)) width=(F1(w)) height=(F1(ARR_H))
                    fill=(kind_fill(&f.kind)) fill-opacity="0.08" {}
            }
            @for (x, y, w, h, fill) in segments(r, sc, ymax) {
                rect x=(F1(x)) y=(F1(y)) width=(F1(w)) height=(F1(h)) fill=(fill) {}
            }
            line x1=(F1(ML)) y1=(F1(TOP)) x2=(F1(ML + PW)) y2=(F1(TOP)) stroke="#ddd" stroke-dasharray="2 3" {}
            line x1=(F1(ML)) y1=(F1(TOP)) x2=(F1(ML)) y2=(F1(base)) stroke="#888" {}
            text x=(F1(ML - 6.0)) y=(F1(TOP + 4.0)) text-anchor="end" { (ymax) "/s" }
            text x=(F1(ML - 6.0)) y=(F1(base)) text-anchor="end" { "0" }
            (x_axis(sc, base))
        }
    }
}
