//! The console's markup helpers, in maud: the page frame (navigation, logout), tables,
//! links, times. Every value is escaped by maud; nothing here writes raw markup from
//! data. Pages carry no script; the frame links the one embedded stylesheet.

mod chart;

pub use chart::{bar_chart, line_chart, Bar, Series};

use maud::{html, Markup, DOCTYPE};

/// The console's stylesheet, served from the binary.
pub const CSS: &str = include_str!("../console.css");

/// `s` as one path segment of a URL (everything but unreserved characters
/// percent-encoded), for links to keys, tenants and lease names.
pub fn seg(s: &str) -> String {
    use std::fmt::Write as _;
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
pub fn q(s: &str) -> String {
    form_urlencoded::byte_serialize(s.as_bytes()).collect()
}

/// A key page's link.
pub fn key_href(tenant: &str, key: &str) -> String {
    format!("/console/keys/{}/{}", seg(tenant), seg(key))
}

/// A time for people: RFC 3339 in UTC, to the millisecond.
pub fn time(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms)
        .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true))
        .unwrap_or_else(|| ms.to_string())
}

/// One entry of the navigation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NavEntry {
    pub label: &'static str,
    pub href: &'static str,
}

/// Who is looking, for the frame: the name, the form token for logging out, and the
/// navigation (the console's entries and the host's).
pub struct Viewer<'a> {
    pub operator: &'a str,
    pub csrf: &'a str,
    pub nav: &'a [NavEntry],
}

/// A whole page: `title` (plain text), the viewer's frame if logged in, the navigation
/// entry `current` marked, and `body`.
pub fn page(title: &str, viewer: Option<&Viewer<'_>>, current: &str, body: Markup) -> String {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { (title) " · idem console" }
                link rel="stylesheet" href="/console/assets/console.css";
            }
            body {
                header class="top" {
                    a class="brand" href="/console/" { "idem console" }
                    @if let Some(v) = viewer {
                        nav aria-label="Console" {
                            ul {
                                @for e in v.nav {
                                    li {
                                        @if e.label == current {
                                            a href=(e.href) aria-current="page" { (e.label) }
                                        } @else {
                                            a href=(e.href) { (e.label) }
                                        }
                                    }
                                }
                            }
                        }
                        form class="logout" method="post" action="/console/logout" {
                            input type="hidden" name="csrf" value=(v.csrf);
                            span class="who" { (v.operator) }
                            " "
                            button type="submit" { "Log out" }
                        }
                    }
                }
                main { (body) }
            }
        }
    }
    .into_string()
}

/// A table with a header row; `rows` are `tr` elements. An empty table says "none".
pub fn table(id: Option<&str>, class: &str, head: &[&str], rows: &[Markup]) -> Markup {
    html! {
        div class="scroll" {
            table id=[id] class=(class) {
                thead { tr { @for c in head { th scope="col" { (c) } } } }
                tbody {
                    @if rows.is_empty() {
                        tr { td colspan=(head.len()) class="empty" { "none" } }
                    }
                    @for r in rows { (r) }
                }
            }
        }
    }
}

/// One row of text cells.
pub fn row<S: AsRef<str>>(cells: &[S]) -> Markup {
    html! { tr { @for c in cells { td { (c.as_ref()) } } } }
}

/// `class="alert"` for a row that needs a look, no class otherwise.
pub fn alert_class(alert: bool) -> Option<&'static str> {
    alert.then_some("alert")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_is_escaped_and_segments_encoded() {
        let m = html! { p { ("<script>alert('x') & \"y\"</script>") } };
        assert_eq!(
            m.into_string(),
            "<p>&lt;script&gt;alert('x') &amp; &quot;y&quot;&lt;/script&gt;</p>"
        );
        assert_eq!(seg("a/b c<d>"), "a%2Fb%20c%3Cd%3E");
        assert_eq!(key_href("t1", "k-1.x_~"), "/console/keys/t1/k-1.x_~");
    }

    #[test]
    fn the_frame_marks_the_current_page() {
        let nav = [
            NavEntry {
                label: "Overview",
                href: "/console/",
            },
            NavEntry {
                label: "Audit",
                href: "/console/audit",
            },
        ];
        let v = Viewer {
            operator: "<ana>",
            csrf: "c\"1",
            nav: &nav,
        };
        let p = page("A & B", Some(&v), "Audit", html! { h1 { "x" } });
        assert!(p.contains("<title>A &amp; B · idem console</title>"), "{p}");
        assert!(p.contains("<a href=\"/console/audit\" aria-current=\"page\">Audit</a>"));
        assert!(p.contains("<span class=\"who\">&lt;ana&gt;</span>"));
        assert!(p.contains("value=\"c&quot;1\""));
        assert!(!p.contains("<script"));
    }
}
