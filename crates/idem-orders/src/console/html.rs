//! HTML for the console: escaping, the page frame, and inline SVG charts.
//!
//! Every value that did not come from this file goes through [`t`] (text) or [`a`]
//! (attribute): stored bodies, keys and names are text, never markup. Pages carry no
//! script; the frame links the one embedded stylesheet.

use std::fmt::{self, Display, Write as _};

/// The console's stylesheet, served from the binary.
pub(crate) const CSS: &str = include_str!("console.css");

/// `s` escaped for an element's text or a quoted attribute.
pub(crate) struct Escaped<'a>(&'a str);

impl Display for Escaped<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut rest = self.0;
        while let Some(i) = rest.find(['&', '<', '>', '"', '\'']) {
            f.write_str(&rest[..i])?;
            f.write_str(match rest.as_bytes()[i] {
                b'&' => "&amp;",
                b'<' => "&lt;",
                b'>' => "&gt;",
                b'"' => "&quot;",
                _ => "&#39;",
            })?;
            rest = &rest[i + 1..];
        }
        f.write_str(rest)
    }
}

/// Text to put into HTML.
pub(crate) fn t(s: &str) -> Escaped<'_> {
    Escaped(s)
}

/// `s` as one path segment of a URL (everything but unreserved characters
/// percent-encoded), for links to keys, tenants and lease names.
pub(crate) fn seg(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

/// `s` as a query value.
pub(crate) fn q(s: &str) -> String {
    form_urlencoded::byte_serialize(s.as_bytes()).collect()
}

/// A key page's link.
pub(crate) fn key_href(tenant: &str, key: &str) -> String {
    format!("/console/keys/{}/{}", seg(tenant), seg(key))
}

/// Who is looking, for the frame (the name and the form token for logging out).
pub(crate) struct Viewer<'a> {
    pub operator: &'a str,
    pub csrf: &'a str,
}

const NAV: [(&str, &str); 6] = [
    ("Overview", "/console/"),
    ("Search", "/console/search"),
    ("Reconcile", "/console/reconcile"),
    ("Freezes", "/console/freezes"),
    ("Leases", "/console/leases"),
    ("Audit", "/console/audit"),
];

/// A whole page: `title` (already plain text) and `body` (markup built here).
pub(crate) fn page(title: &str, viewer: Option<&Viewer<'_>>, current: &str, body: &str) -> String {
    let mut h = String::with_capacity(body.len() + 2048);
    let _ = write!(
        h,
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <title>{} · idem console</title>\
         <link rel=\"stylesheet\" href=\"/console/assets/console.css\"></head><body>\
         <header class=\"top\"><a class=\"brand\" href=\"/console/\">idem console</a>",
        t(title)
    );
    if let Some(v) = viewer {
        h.push_str("<nav aria-label=\"Console\"><ul>");
        for (label, href) in NAV {
            let here = if label == current {
                " aria-current=\"page\""
            } else {
                ""
            };
            let _ = write!(h, "<li><a href=\"{href}\"{here}>{label}</a></li>");
        }
        let _ = write!(
            h,
            "</ul></nav><form class=\"logout\" method=\"post\" action=\"/console/logout\">\
             <input type=\"hidden\" name=\"csrf\" value=\"{}\">\
             <span class=\"who\">{}</span> <button type=\"submit\">Log out</button></form>",
            t(v.csrf),
            t(v.operator)
        );
    }
    h.push_str("</header><main>");
    h.push_str(body);
    h.push_str("</main></body></html>");
    h
}

/// A table with a caption-less header row; `rows` are already markup.
pub(crate) fn table(id: Option<&str>, class: &str, head: &[&str], rows: &[String]) -> String {
    let mut h = String::new();
    let id = id.map(|i| format!(" id=\"{i}\"")).unwrap_or_default();
    let _ = write!(
        h,
        "<div class=\"scroll\"><table{id} class=\"{class}\"><thead><tr>"
    );
    for c in head {
        let _ = write!(h, "<th scope=\"col\">{}</th>", t(c));
    }
    h.push_str("</tr></thead><tbody>");
    if rows.is_empty() {
        let _ = write!(
            h,
            "<tr><td colspan=\"{}\" class=\"empty\">none</td></tr>",
            head.len()
        );
    }
    for r in rows {
        h.push_str(r);
    }
    h.push_str("</tbody></table></div>");
    h
}

/// One row of text cells.
pub(crate) fn row<S: AsRef<str>>(cells: &[S]) -> String {
    let mut h = String::from("<tr>");
    for c in cells {
        let _ = write!(h, "<td>{}</td>", t(c.as_ref()));
    }
    h.push_str("</tr>");
    h
}

/// A time for people: RFC 3339 in UTC, to the millisecond.
pub(crate) fn time(ms: i64) -> String {
    crate::views::rfc3339(ms)
}

/// One series of a chart.
pub(crate) struct Series<'a> {
    pub label: &'a str,
    pub class: &'a str,
    pub points: Vec<(f64, f64)>,
}

/// A line chart of `series` over x (seconds, relative), y from 0; `title` is its
/// accessible name. Inline SVG, no script.
pub(crate) fn line_chart(
    title: &str,
    x_label: &str,
    y_label: &str,
    series: &[Series<'_>],
) -> String {
    let (w, hgt, pad) = (640.0, 200.0, 36.0);
    let xs = series.iter().flat_map(|s| s.points.iter().map(|p| p.0));
    let ys = series.iter().flat_map(|s| s.points.iter().map(|p| p.1));
    let (x0, x1) = xs.fold((f64::MAX, f64::MIN), |(a, b), x| (a.min(x), b.max(x)));
    let y1 = ys.fold(0.0_f64, f64::max).max(1.0);
    let x_span = if x1 > x0 { x1 - x0 } else { 1.0 };
    let sx = |x: f64| pad + (x - x0) / x_span * (w - 2.0 * pad);
    let sy = |y: f64| hgt - pad - y / y1 * (hgt - 2.0 * pad);
    let mut h = String::new();
    let _ = write!(
        h,
        "<figure class=\"chart\"><svg viewBox=\"0 0 {w} {hgt}\" role=\"img\" aria-label=\"{}\">\
         <line class=\"axis\" x1=\"{pad}\" y1=\"{b}\" x2=\"{r}\" y2=\"{b}\"/>\
         <line class=\"axis\" x1=\"{pad}\" y1=\"{pad}\" x2=\"{pad}\" y2=\"{b}\"/>\
         <text x=\"{pad}\" y=\"{ty}\" class=\"tick\">{}</text>\
         <text x=\"4\" y=\"{tyy}\" class=\"tick\">{y1:.1}</text>",
        t(title),
        t(y_label),
        b = hgt - pad,
        r = w - pad,
        ty = pad - 8.0,
        tyy = pad + 4.0,
    );
    for s in series {
        let pts: Vec<String> = s
            .points
            .iter()
            .map(|(x, y)| format!("{:.1},{:.1}", sx(*x), sy(*y)))
            .collect();
        let _ = write!(
            h,
            "<polyline class=\"series {}\" points=\"{}\"/>",
            t(s.class),
            pts.join(" ")
        );
    }
    let _ = write!(h, "</svg><figcaption>{} — ", t(x_label));
    for (i, s) in series.iter().enumerate() {
        if i > 0 {
            h.push_str(", ");
        }
        let _ = write!(
            h,
            "<span class=\"key {}\">{}</span>",
            t(s.class),
            t(s.label)
        );
    }
    h.push_str("</figcaption></figure>");
    h
}

/// One bar of [`bar_chart`].
pub(crate) struct Bar {
    pub label: String,
    /// Fraction of the reference (1.0 = the reference line's 100 %).
    pub value: f64,
    pub alert: bool,
}

/// Bars of fractions with a reference line at `line` (e.g. 0.7 of the lease).
pub(crate) fn bar_chart(title: &str, line: f64, line_label: &str, bars: &[Bar]) -> String {
    let (w, hgt, pad) = (640.0, 200.0, 36.0);
    let top = bars.iter().map(|b| b.value).fold(1.0_f64, f64::max);
    let sy = |y: f64| hgt - pad - y / top * (hgt - 2.0 * pad);
    let n = bars.len().max(1) as f64;
    let bw = ((w - 2.0 * pad) / n).min(40.0);
    let mut h = String::new();
    let _ = write!(
        h,
        "<figure class=\"chart\"><svg viewBox=\"0 0 {w} {hgt}\" role=\"img\" aria-label=\"{}\">\
         <line class=\"axis\" x1=\"{pad}\" y1=\"{b}\" x2=\"{r}\" y2=\"{b}\"/>",
        t(title),
        b = hgt - pad,
        r = w - pad,
    );
    for (i, bar) in bars.iter().enumerate() {
        let x = pad + i as f64 * bw;
        let y = sy(bar.value);
        let class = if bar.alert { "bar alert" } else { "bar" };
        let _ = write!(
            h,
            "<rect class=\"{class}\" x=\"{:.1}\" y=\"{y:.1}\" width=\"{:.1}\" height=\"{:.1}\">\
             <title>{}: {:.0} %</title></rect>",
            x + 1.0,
            (bw - 2.0).max(1.0),
            (hgt - pad - y).max(0.5),
            t(&bar.label),
            bar.value * 100.0
        );
    }
    let ly = sy(line);
    let _ = write!(
        h,
        "<line class=\"limit\" x1=\"{pad}\" y1=\"{ly:.1}\" x2=\"{r}\" y2=\"{ly:.1}\"/>\
         <text class=\"tick\" x=\"{tx}\" y=\"{tly:.1}\">{}</text></svg>\
         <figcaption>{}</figcaption></figure>",
        t(line_label),
        t(title),
        r = w - pad,
        tx = w - pad - 120.0,
        tly = ly - 4.0,
    );
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_markup() {
        assert_eq!(
            t("<script>alert('x') & \"y\"</script>").to_string(),
            "&lt;script&gt;alert(&#39;x&#39;) &amp; &quot;y&quot;&lt;/script&gt;"
        );
        assert_eq!(t("plain").to_string(), "plain");
    }

    #[test]
    fn segments_are_encoded() {
        assert_eq!(seg("a/b c<d>"), "a%2Fb%20c%3Cd%3E");
        assert_eq!(key_href("t1", "k-1.x_~"), "/console/keys/t1/k-1.x_~");
    }
}
