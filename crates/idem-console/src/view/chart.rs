//! Inline SVG charts (no script): a line chart of series over time and a bar chart of
//! fractions against a reference line. Labels are escaped by maud like any text.

use maud::{html, Markup};

/// One series of a [`line_chart`].
pub struct Series<'a> {
    pub label: &'a str,
    pub class: &'a str,
    pub points: Vec<(f64, f64)>,
}

/// A line chart of `series` over x (seconds, relative), y from 0; `title` is its
/// accessible name.
pub fn line_chart(title: &str, x_label: &str, y_label: &str, series: &[Series<'_>]) -> Markup {
    let (w, hgt, pad) = (640.0_f64, 200.0_f64, 36.0_f64);
    let xs = series.iter().flat_map(|s| s.points.iter().map(|p| p.0));
    let ys = series.iter().flat_map(|s| s.points.iter().map(|p| p.1));
    let (x0, x1) = xs.fold((f64::MAX, f64::MIN), |(a, b), x| (a.min(x), b.max(x)));
    let y1 = ys.fold(0.0_f64, f64::max).max(1.0);
    let x_span = if x1 > x0 { x1 - x0 } else { 1.0 };
    let sx = |x: f64| pad + (x - x0) / x_span * (w - 2.0 * pad);
    let sy = |y: f64| hgt - pad - y / y1 * (hgt - 2.0 * pad);
    let points = |s: &Series<'_>| {
        s.points
            .iter()
            .map(|(x, y)| format!("{:.1},{:.1}", sx(*x), sy(*y)))
            .collect::<Vec<_>>()
            .join(" ")
    };
    html! {
        figure class="chart" {
            svg viewBox=(format!("0 0 {w} {hgt}")) role="img" aria-label=(title) {
                line class="axis" x1=(pad) y1=(hgt - pad) x2=(w - pad) y2=(hgt - pad) {}
                line class="axis" x1=(pad) y1=(pad) x2=(pad) y2=(hgt - pad) {}
                text x=(pad) y=(pad - 8.0) class="tick" { (y_label) }
                text x="4" y=(pad + 4.0) class="tick" { (format!("{y1:.1}")) }
                @for s in series {
                    polyline class=(format!("series {}", s.class)) points=(points(s)) {}
                }
            }
            figcaption {
                (x_label) " — "
                @for (i, s) in series.iter().enumerate() {
                    @if i > 0 { ", " }
                    span class=(format!("key {}", s.class)) { (s.label) }
                }
            }
        }
    }
}

/// One bar of [`bar_chart`].
pub struct Bar {
    pub label: String,
    /// Fraction of the reference (1.0 = the reference line's 100 %).
    pub value: f64,
    pub alert: bool,
}

/// Bars of fractions with a reference line at `line` (e.g. 0.7 of the lease).
pub fn bar_chart(title: &str, line: f64, line_label: &str, bars: &[Bar]) -> Markup {
    let (w, hgt, pad) = (640.0_f64, 200.0_f64, 36.0_f64);
    let top = bars.iter().map(|b| b.value).fold(1.0_f64, f64::max);
    let sy = |y: f64| hgt - pad - y / top * (hgt - 2.0 * pad);
    let n = bars.len().max(1) as f64;
    let bw = ((w - 2.0 * pad) / n).min(40.0);
    let ly = sy(line);
    let f1 = |v: f64| format!("{v:.1}");
    html! {
        figure class="chart" {
            svg viewBox=(format!("0 0 {w} {hgt}")) role="img" aria-label=(title) {
                line class="axis" x1=(pad) y1=(hgt - pad) x2=(w - pad) y2=(hgt - pad) {}
                @for (i, bar) in bars.iter().enumerate() {
                    @let x = pad + i as f64 * bw;
                    @let y = sy(bar.value);
                    rect class=(if bar.alert { "bar alert" } else { "bar" })
                        x=(f1(x + 1.0)) y=(f1(y)) width=(f1((bw - 2.0).max(1.0)))
                        height=(f1((hgt - pad - y).max(0.5))) {
                        title { (bar.label) ": " (format!("{:.0}", bar.value * 100.0)) " %" }
                    }
                }
                line class="limit" x1=(pad) y1=(f1(ly)) x2=(w - pad) y2=(f1(ly)) {}
                text class="tick" x=(w - pad - 120.0) y=(f1(ly - 4.0)) { (line_label) }
            }
            figcaption { (title) }
        }
    }
}
