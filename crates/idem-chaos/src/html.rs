//! The campaign report for people: one self-contained HTML5 page (inline CSS, inline
//! SVG charts) drawn from a finished [`Report`].
//!
//! Rendering only: it decides nothing about pass or fail and checks no invariant, it
//! shows what `check` put in the report. It must not fetch anything (no CDN, fonts,
//! images or links to load) and must not emit scripts: the page is attached to
//! incidents and opened offline, and every string from the report is escaped because
//! targets, keys and details come from the system under test.

use std::collections::BTreeSet;
use std::fmt::Write as _;

use crate::report::{percent, rate, Bucket, FaultEvent, Report};

/// Lane order of the timeline; kinds not listed here follow, alphabetically.
const KIND_ORDER: [&str; 7] = ["kill", "stop", "gateway", "db-conn", "redis", "bus", "net"];

// SVG geometry, in viewBox units (the SVG scales to the container width).
const W: f64 = 1000.0;
/// Left margin: room for the lane labels, shared by both charts so their x axes align.
const ML: f64 = 84.0;
const MR: f64 = 14.0;
const PW: f64 = W - ML - MR;
const LANE_H: f64 = 22.0;
const TOP: f64 = 18.0;
const AXIS_H: f64 = 30.0;
const ARR_H: f64 = 150.0;
/// Narrower faults would vanish at 1280 px.
const MIN_FAULT_W: f64 = 2.0;

const OK_FILL: &str = "#3b6fb6";
const REPLAY_FILL: &str = "#8e5bb5";
const RETRY_FILL: &str = "#d9822b";

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

fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for ch in s.chars() {
        match ch {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
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

/// Kinds that get a lane: the known ones present, in `KIND_ORDER`, then unknown ones,
/// so every fault has somewhere to be drawn. Counts with no event still get a lane.
fn lanes(r: &Report) -> Vec<String> {
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

struct Scale {
    span: f64,
}

impl Scale {
    fn x(&self, ms: u64) -> f64 {
        ML + (ms as f64 / self.span).min(1.0) * PW
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
fn x_axis(out: &mut String, sc: &Scale, span: u64, y: f64) {
    let step = tick_step_ms(span);
    let _ = write!(
        out,
        "<line x1=\"{ML:.1}\" y1=\"{y:.1}\" x2=\"{:.1}\" y2=\"{y:.1}\" stroke=\"#888\"/>",
        ML + PW
    );
    let mut t = 0u64;
    while t <= span {
        let x = sc.x(t);
        let label = if step < 1000 {
            secs1(t)
        } else {
            (t / 1000).to_string()
        };
        let _ = write!(
            out,
            "<line x1=\"{x:.1}\" y1=\"{y:.1}\" x2=\"{x:.1}\" y2=\"{:.1}\" stroke=\"#888\"/>\
             <text x=\"{x:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{label}</text>",
            y + 4.0,
            y + 16.0
        );
        t += step;
    }
    let _ = write!(
        out,
        "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">time (s)</text>",
        ML + PW,
        y + 28.0
    );
}

fn fault_title(f: &FaultEvent) -> String {
    escape(&format!(
        "{} {} {} ({}–{} s)",
        f.kind,
        f.target,
        f.detail,
        secs1(f.at_ms),
        secs1(fault_end(f))
    ))
}

/// Fault timeline. The only `<rect>`s in it are the faults (one each), so the chart
/// can be checked by counting them.
fn timeline(out: &mut String, r: &Report, sc: &Scale, span: u64) {
    let lanes = lanes(r);
    let plot_h = LANE_H * lanes.len().max(1) as f64;
    let h = TOP + plot_h + AXIS_H;
    let _ = write!(
        out,
        "<svg id=\"timeline\" viewBox=\"0 0 {W:.0} {h:.0}\" role=\"img\" aria-label=\"fault timeline\">"
    );
    for (i, kind) in lanes.iter().enumerate() {
        let top = TOP + LANE_H * i as f64;
        let _ = write!(
            out,
            "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{}</text>\
             <line x1=\"{ML:.1}\" y1=\"{:.1}\" x2=\"{:.1}\" y2=\"{:.1}\" stroke=\"#eee\"/>",
            ML - 6.0,
            top + LANE_H / 2.0 + 4.0,
            escape(kind),
            top + LANE_H,
            ML + PW,
            top + LANE_H
        );
    }
    for f in &r.faults {
        // Every fault's kind has a lane (see `lanes`).
        let lane = lanes.iter().position(|k| *k == f.kind).unwrap_or(0);
        let x = sc.x(f.at_ms);
        let w = (sc.x(fault_end(f)) - x).max(MIN_FAULT_W);
        let y = TOP + LANE_H * lane as f64 + 3.0;
        let _ = write!(
            out,
            "<rect x=\"{x:.1}\" y=\"{y:.1}\" width=\"{w:.1}\" height=\"{:.1}\" fill=\"{}\" fill-opacity=\"0.8\"><title>{}</title></rect>",
            LANE_H - 6.0,
            kind_fill(&f.kind),
            fault_title(f)
        );
    }
    let sx = sc.x(r.duration_ms);
    let _ = write!(
        out,
        "<line class=\"settle\" x1=\"{sx:.1}\" y1=\"{:.1}\" x2=\"{sx:.1}\" y2=\"{:.1}\" stroke=\"#555\" stroke-dasharray=\"4 3\"/>\
         <text x=\"{:.1}\" y=\"{:.1}\">settle</text>",
        TOP - 4.0,
        TOP + plot_h,
        sx + 3.0,
        TOP - 6.0
    );
    x_axis(out, sc, span, TOP + plot_h);
    out.push_str("</svg>");
}

/// Stacked bars per second: first answers, replays, then retried attempts on top.
fn arrivals(out: &mut String, r: &Report, sc: &Scale, span: u64) {
    let total = |b: &Bucket| b.ok.saturating_add(b.retried);
    let ymax = r.arrivals.iter().map(total).max().unwrap_or(0).max(1);
    let h = TOP + ARR_H + AXIS_H;
    let base = TOP + ARR_H;
    let per = |n: u64| n as f64 / ymax as f64 * ARR_H;
    let _ = write!(
        out,
        "<svg id=\"arrivals\" viewBox=\"0 0 {W:.0} {h:.0}\" role=\"img\" aria-label=\"arrivals per second\">"
    );
    // Fault windows behind the bars, so dips can be read against them.
    for f in &r.faults {
        let x = sc.x(f.at_ms);
        let w = (sc.x(fault_end(f)) - x).max(MIN_FAULT_W);
        let _ = write!(
            out,
            "<rect x=\"{x:.1}\" y=\"{TOP:.1}\" width=\"{w:.1}\" height=\"{ARR_H:.1}\" fill=\"{}\" fill-opacity=\"0.08\"/>",
            kind_fill(&f.kind)
        );
    }
    let bw = sc.x(1000) - sc.x(0);
    let gap = if bw > 4.0 { 1.0 } else { 0.0 };
    for b in &r.arrivals {
        let x = sc.x(b.second.saturating_mul(1000));
        let replayed = b.replayed.min(b.ok);
        let parts = [
            (b.ok - replayed, OK_FILL),
            (replayed, REPLAY_FILL),
            (b.retried, RETRY_FILL),
        ];
        let mut y = base;
        for (n, fill) in parts {
            if n == 0 {
                continue;
            }
            let ph = per(n);
            y -= ph;
            let _ = write!(
                out,
                "<rect x=\"{x:.1}\" y=\"{y:.1}\" width=\"{:.1}\" height=\"{ph:.1}\" fill=\"{fill}\"/>",
                (bw - gap).max(0.5)
            );
        }
    }
    let _ = write!(
        out,
        "<line x1=\"{ML:.1}\" y1=\"{TOP:.1}\" x2=\"{:.1}\" y2=\"{TOP:.1}\" stroke=\"#ddd\" stroke-dasharray=\"2 3\"/>\
         <line x1=\"{ML:.1}\" y1=\"{TOP:.1}\" x2=\"{ML:.1}\" y2=\"{base:.1}\" stroke=\"#888\"/>\
         <text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{ymax}/s</text>\
         <text x=\"{:.1}\" y=\"{base:.1}\" text-anchor=\"end\">0</text>",
        ML + PW,
        ML - 6.0,
        TOP + 4.0,
        ML - 6.0
    );
    x_axis(out, sc, span, base);
    out.push_str("</svg>");
}

fn open_table(out: &mut String, heads: &[&str]) {
    out.push_str("<div class=\"wrap\"><table><thead><tr>");
    for h in heads {
        let _ = write!(out, "<th scope=\"col\">{h}</th>");
    }
    out.push_str("</tr></thead><tbody>");
}

fn close_table(out: &mut String) {
    out.push_str("</tbody></table></div>");
}

fn verdict(passed: bool) -> &'static str {
    if passed {
        "<span class=\"pass\">PASSED</span>"
    } else {
        "<span class=\"fail\">FAILED</span>"
    }
}

fn header(out: &mut String, r: &Report) {
    let _ = write!(
        out,
        "<header><h1>idem chaos — {}</h1><dl><dt>seed</dt><dd>{}</dd>",
        verdict(r.passed),
        r.seed
    );
    if let Some(c) = &r.control {
        let _ = write!(
            out,
            "<dt>control</dt><dd>control: {} — anomalies are expected here</dd>",
            escape(c)
        );
    }
    let _ = write!(
        out,
        "<dt>topology</dt><dd>{} service(s), {} gateway(s)</dd>\
         <dt>NATS</dt><dd>{}</dd>\
         <dt>duration</dt><dd>{} s</dd>\
         <dt>settle</dt><dd>{} s</dd>\
         <dt>intents</dt><dd>{}</dd>\
         <dt>acknowledged</dt><dd>{} ({})</dd>\
         <dt>answered</dt><dd>{} ({})</dd>\
         <dt>attempts</dt><dd>{}</dd></dl></header>",
        r.services,
        r.gateways,
        if r.nats { "yes" } else { "no" },
        secs1(r.duration_ms),
        secs1(r.settle_ms),
        r.intents,
        r.acknowledged,
        percent(Some(r.acknowledged_ratio)),
        r.answered,
        percent(Some(r.answered_ratio)),
        r.attempts
    );
}

/// A swatch in the colour a kind's windows are shaded with.
fn swatch(kind: &str) -> String {
    format!(
        "<span style=\"background:{};opacity:.35\"></span>",
        kind_fill(kind)
    )
}

/// Completed answers per second inside each kind's windows against the calm rate.
fn availability_table(out: &mut String, r: &Report) {
    out.push_str("<h3 id=\"availability\">Availability by fault kind</h3>");
    open_table(
        out,
        &[
            "kind",
            "faults",
            "window (s)",
            "answers inside",
            "inside (/s)",
            "outside (/s)",
            "availability",
        ],
    );
    for (kind, a) in &r.availability_by_fault {
        let _ = write!(
            out,
            "<tr><td class=\"legend\">{}{}</td><td class=\"n\">{}</td><td class=\"n\">{:.1}</td>\
             <td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td></tr>",
            swatch(kind),
            escape(kind),
            a.windows,
            a.seconds,
            a.answers,
            rate(a.inside_per_s),
            rate(a.outside_per_s),
            percent(a.ratio)
        );
    }
    close_table(out);
    out.push_str(
        "<p class=\"note\">Completed answers (2xx or a definite refusal) by the time they arrived, \
         per second of the kind's merged windows, against the seconds of the active phase \
         outside every fault window.</p>",
    );
}

fn invariants_section(out: &mut String, r: &Report) {
    out.push_str("<section><h2>Invariants</h2>");
    if r.invariants.is_empty() {
        out.push_str("<p class=\"note\">No invariants were checked.</p></section>");
        return;
    }
    open_table(out, &["id", "title", "checked", "anomalies", "result"]);
    for i in &r.invariants {
        let _ = write!(
            out,
            "<tr><td>{}</td><td>{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"{}\">{}</td></tr>",
            escape(&i.id),
            escape(&i.title),
            i.checked,
            i.anomalies,
            if i.passed { "pass" } else { "fail" },
            if i.passed { "pass" } else { "fail" }
        );
    }
    close_table(out);
    out.push_str("</section>");
}

fn anomalies_section(out: &mut String, r: &Report) {
    out.push_str("<section><h2>Anomalies</h2>");
    if r.anomalies.is_empty() {
        out.push_str("<p>No anomalies.</p></section>");
        return;
    }
    open_table(
        out,
        &[
            "invariant",
            "intent",
            "key",
            "rows",
            "detail",
            "faults nearby",
        ],
    );
    for a in &r.anomalies {
        let faults: Vec<String> = a.faults.iter().map(|f| escape(f)).collect();
        let _ = write!(
            out,
            "<tr><td>{}</td><td><code>{}</code></td><td><code>{}</code></td><td><code>{}</code></td><td>{}</td><td>{}</td></tr>",
            escape(&a.invariant),
            escape(a.intent.as_deref().unwrap_or("—")),
            escape(a.key.as_deref().unwrap_or("—")),
            escape(&a.rows.join(", ")),
            escape(&a.detail),
            faults.join("<br>")
        );
    }
    close_table(out);
    out.push_str("</section>");
}

fn faults_section(out: &mut String, r: &Report) {
    out.push_str("<section><h2>Faults</h2>");
    if r.faults.is_empty() {
        out.push_str("<p>No faults were injected.</p>");
    } else {
        open_table(out, &["at (s)", "end (s)", "kind", "target", "detail"]);
        for f in &r.faults {
            let _ = write!(
                out,
                "<tr><td class=\"n\">{}</td><td class=\"n\">{}</td><td>{}</td><td><code>{}</code></td><td>{}</td></tr>",
                secs3(f.at_ms),
                secs3(f.end_ms),
                escape(&f.kind),
                escape(&f.target),
                escape(&f.detail)
            );
        }
        close_table(out);
    }
    if !r.faults_by_kind.is_empty() {
        out.push_str("<h3>Faults by kind</h3>");
        open_table(out, &["kind", "count"]);
        for (k, n) in &r.faults_by_kind {
            let _ = write!(
                out,
                "<tr><td>{}</td><td class=\"n\">{n}</td></tr>",
                escape(k)
            );
        }
        close_table(out);
    }
    out.push_str("<h3>Observed</h3>");
    if r.observed.is_empty() {
        out.push_str("<p class=\"note\">Nothing recorded.</p>");
    } else {
        open_table(out, &["evidence", "count"]);
        for (k, n) in &r.observed {
            let _ = write!(
                out,
                "<tr><td>{}</td><td class=\"n\">{n}</td></tr>",
                escape(k)
            );
        }
        close_table(out);
    }
    out.push_str("</section>");
}

/// The whole page. Deterministic: the same report gives the same bytes.
pub fn render(report: &Report) -> String {
    let r = report;
    let span = span_ms(r);
    let sc = Scale { span: span as f64 };
    let mut out = String::with_capacity(16 * 1024);
    let _ = write!(
        out,
        "<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <title>idem chaos seed {} — {}</title><style>{CSS}</style></head><body>",
        r.seed,
        if r.passed { "PASSED" } else { "FAILED" }
    );
    header(&mut out, r);
    out.push_str("<main>");

    out.push_str("<section><h2>Fault timeline</h2>");
    if r.faults.is_empty() {
        out.push_str("<p class=\"note\">No faults were injected.</p>");
    }
    out.push_str("<figure>");
    timeline(&mut out, r, &sc, span);
    out.push_str(
        "<figcaption class=\"note\">One lane per fault kind; hover a fault for its target and detail. \
         The dashed line marks the start of the settle phase.</figcaption></figure></section>",
    );

    out.push_str("<section><h2>Arrivals over time</h2>");
    if r.arrivals.is_empty() {
        out.push_str("<p class=\"note\">No arrivals recorded.</p>");
    } else {
        out.push_str("<figure>");
        arrivals(&mut out, r, &sc, span);
        let _ = write!(
            out,
            "<figcaption class=\"legend\">attempts per second:<span style=\"background:{OK_FILL}\"></span>ok\
             <span style=\"background:{REPLAY_FILL}\"></span>replayed\
             <span style=\"background:{RETRY_FILL}\"></span>retried"
        );
        if !r.faults.is_empty() {
            out.push_str(" · fault windows:");
            for kind in lanes(r) {
                let _ = write!(out, "{}{}", swatch(&kind), escape(&kind));
            }
        }
        out.push_str("</figcaption></figure>");
    }
    if !r.availability_by_fault.is_empty() {
        availability_table(&mut out, r);
    }
    out.push_str("</section>");

    invariants_section(&mut out, r);
    anomalies_section(&mut out, r);
    faults_section(&mut out, r);
    out.push_str("</main></body></html>\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::{Anomaly, InvariantResult};

    fn fault(at_ms: u64, end_ms: u64, kind: &str, target: &str, detail: &str) -> FaultEvent {
        FaultEvent {
            at_ms,
            end_ms,
            kind: kind.into(),
            target: target.into(),
            detail: detail.into(),
        }
    }

    fn sample() -> Report {
        let mut r = Report::empty(false);
        r.seed = 42;
        r.control = Some("legacy".into());
        r.services = 3;
        r.gateways = 2;
        r.nats = true;
        r.duration_ms = 30_000;
        r.settle_ms = 10_000;
        r.intents = 200;
        r.acknowledged = 197;
        r.acknowledged_ratio = 0.985;
        r.attempts = 260;
        r.faults = vec![
            fault(2_000, 4_500, "kill", "serve-1", "SIGKILL"),
            fault(10_000, 10_000, "net", "serve-0→postgres", "drop <all>"),
            fault(12_000, 18_000, "db-conn", "serve-2", "terminate 'backend'"),
        ];
        r.faults_by_kind = [("kill", 1), ("net", 1), ("db-conn", 1)]
            .into_iter()
            .map(|(k, n)| (k.to_owned(), n))
            .collect();
        r.invariants = vec![
            InvariantResult {
                id: "I1".into(),
                title: "one order per intent".into(),
                checked: 200,
                anomalies: 1,
                passed: false,
            },
            InvariantResult {
                id: "I2".into(),
                title: "one charge per order".into(),
                checked: 199,
                anomalies: 0,
                passed: true,
            },
        ];
        r.anomalies_by_invariant.insert("I1".into(), 1);
        r.anomalies = vec![Anomaly {
            invariant: "I1".into(),
            intent: Some("intent-9".into()),
            key: Some("<script>alert(1)</script>".into()),
            rows: vec!["o-1".into(), "o-2".into()],
            detail: "two orders & a \"duplicate\"".into(),
            faults: vec!["kill serve-1 @2000".into()],
        }];
        r.arrivals = (0..30)
            .map(|s| Bucket {
                second: s,
                ok: 6 + s % 3,
                replayed: s % 2,
                retried: u64::from(s == 3),
            })
            .collect();
        r.observed.insert("redeliveries".into(), 4);
        let answers = (0..300).map(|n| n * 100).collect();
        r.availability_by_fault = crate::report::availability_by_fault(
            ["kill", "net", "db-conn", "stop"],
            &r.faults,
            answers,
            r.duration_ms,
        );
        r
    }

    /// The timeline `<svg …>…</svg>`.
    fn timeline_svg(html: &str) -> &str {
        let start = html.find("<svg id=\"timeline\"").expect("timeline svg");
        let end = start + html[start..].find("</svg>").expect("svg end");
        &html[start..end]
    }

    #[test]
    fn escapes_everything_from_the_report() {
        let html = render(&sample());
        assert!(!html.contains("<script"), "raw script tag in output");
        assert!(html.contains("&lt;script&gt;alert(1)&lt;/script&gt;"));
        assert!(html.contains("two orders &amp; a &quot;duplicate&quot;"));
        assert!(html.contains("drop &lt;all&gt;"));
        assert!(html.contains("terminate &#39;backend&#39;"));
        assert!(html.contains("o-1, o-2"));
        // Nothing to fetch: no URLs, no src or href attributes.
        assert!(!html.contains("://") && !html.contains("src=") && !html.contains("href="));
        assert_eq!(
            escape("<a href=\"x\">&'"),
            "&lt;a href=&quot;x&quot;&gt;&amp;&#39;"
        );
    }

    #[test]
    fn timeline_has_one_rect_per_fault_and_the_settle_line() {
        let r = sample();
        let html = render(&r);
        let svg = timeline_svg(&html);
        assert_eq!(svg.matches("<rect").count(), r.faults.len());
        assert!(svg.contains("class=\"settle\""));
        assert!(svg.contains(">settle</text>"));
        // Lanes in the fixed order: kill before db-conn before net.
        let kill = svg.find(">kill</text>").unwrap();
        let db = svg.find(">db-conn</text>").unwrap();
        let net = svg.find(">net</text>").unwrap();
        assert!(kill < db && db < net);
        // The zero-length fault is still visible.
        assert!(svg.contains("width=\"2.0\""));
        // Settle starts at 30 s of a 40 s axis.
        let x = ML + 0.75 * PW;
        assert!(svg.contains(&format!("x1=\"{x:.1}\"")));
    }

    #[test]
    fn header_matches_passed() {
        let failed = render(&sample());
        assert!(failed.contains("<h1>idem chaos — <span class=\"fail\">FAILED</span></h1>"));
        assert!(!failed.contains("PASSED"));
        assert!(failed.contains("control: legacy — anomalies are expected here"));
        assert!(failed.contains("98.5%"));

        let mut r = sample();
        r.passed = true;
        r.control = None;
        let passed = render(&r);
        assert!(passed.contains("<h1>idem chaos — <span class=\"pass\">PASSED</span></h1>"));
        assert!(!passed.contains("FAILED"));
        assert!(!passed.contains("control:"));
    }

    #[test]
    fn empty_report_renders() {
        let html = render(&Report::empty(true));
        assert!(html.contains("No anomalies."));
        assert!(html.contains("PASSED"));
        assert_eq!(timeline_svg(&html).matches("<rect").count(), 0);
        assert!(!html.contains("NaN"));
        assert!(html.ends_with("</html>\n"));
    }

    #[test]
    fn availability_table_has_a_row_per_kind_and_no_nan() {
        let html = render(&sample());
        let start = html
            .find("id=\"availability\"")
            .expect("availability table");
        let table = &html[start..start + html[start..].find("</table>").unwrap()];
        assert_eq!(table.matches("<tr><td").count(), 4);
        // kill 2.5 s at 10/s against a calm 10/s; net lasts no time; stop never ran.
        assert!(table.contains(">kill</td><td class=\"n\">1</td><td class=\"n\">2.5</td><td class=\"n\">25</td><td class=\"n\">10.0</td><td class=\"n\">10.0</td><td class=\"n\">100.0%</td>"), "{table}");
        assert!(table.contains(">net</td><td class=\"n\">1</td><td class=\"n\">0.0</td><td class=\"n\">0</td><td class=\"n\">n/a</td>"));
        assert!(table.contains(">stop</td><td class=\"n\">0</td>"));
        assert!(!html.contains("NaN"));
        // The legend names each kind shaded.
        let legend = &html[html.find("fault windows:").unwrap()..];
        assert!(legend.find(">kill").unwrap() < legend.find(">db-conn").unwrap());
    }

    #[test]
    fn deterministic() {
        assert_eq!(render(&sample()), render(&sample()));
        assert_eq!(secs3(12_045), "12.045");
        assert_eq!(secs1(12_045), "12.0");
    }
}
