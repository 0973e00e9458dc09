//! The page's tests: escaping, chart geometry, sections present or absent.

use super::charts::{ML, PW};
use super::*;
use crate::report::{Anomaly, Bucket, FaultEvent, InvariantResult};

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
    // maud leaves `'` as is: text, and attribute values it always double-quotes.
    assert!(html.contains("terminate 'backend'"));
    assert!(html.contains("o-1, o-2"));
    // Nothing to fetch: no URLs, no src or href attributes.
    assert!(!html.contains("://") && !html.contains("src=") && !html.contains("href="));
}

#[test]
fn a_hostile_value_is_escaped_wherever_it_lands() {
    const EVIL: &str = "<script>alert(1)</script> & \"q\" 'a'";
    const SAFE: &str = "&lt;script&gt;alert(1)&lt;/script&gt; &amp; &quot;q&quot; 'a'";
    let mut r = sample();
    r.control = Some(EVIL.into());
    r.faults[0].target = EVIL.into();
    r.invariants[0].title = EVIL.into();
    r.anomalies[0].detail = EVIL.into();
    r.anomalies[0].key = None;
    r.observed.insert(EVIL.into(), 1);
    let html = render(&r);
    assert!(!html.contains("<script"), "raw script tag in output");
    // Header, faults table, the fault's <title>, invariants, anomalies, observed.
    assert_eq!(html.matches(SAFE).count(), 6, "{html}");
    assert_eq!(html.matches(EVIL).count(), 0);
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
