//! Who may use the console and what every answer carries: the session a page needs
//! (the login is `login`'s, the cookie `session`'s), the CSRF check, cross-site refusal, the
//! security headers, the audit, and the shared page answers (errors, 400s, redirects).
//! Owns those rules; it must not hold a page's content.

use axum::extract::{FromRequestParts, Request};
use axum::http::header::{
    CACHE_CONTROL, CONTENT_SECURITY_POLICY, CONTENT_TYPE, HOST, LOCATION, ORIGIN,
};
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use maud::{html, Markup};

use crate::error::ConsoleError;
use crate::session::{digest_hex, session_cookie, token_digest};
use crate::tables::{self, now_ms, AuditRow};
use crate::view::{self, Viewer};
use crate::Console;

/// Longest reason for an action.
pub const MAX_REASON: usize = 500;

/// Headers of every console answer, and the cross-site check of every post.
pub(crate) async fn guard(request: Request, next: Next) -> Response {
    if request.method() == Method::POST {
        if let Some(refused) = cross_site(request.headers()) {
            return refused;
        }
    }
    let mut response = next.run(request).await;
    let h = response.headers_mut();
    h.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    h.insert(
        CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'none'; style-src 'self'; img-src 'self' data:; form-action 'self'; \
             frame-ancestors 'none'; base-uri 'none'",
        ),
    );
    h.insert("x-frame-options", HeaderValue::from_static("DENY"));
    h.insert(
        "x-content-type-options",
        HeaderValue::from_static("nosniff"),
    );
    // Not `no-referrer`: with it, a browser posts forms with `Origin: null`.
    h.insert("referrer-policy", HeaderValue::from_static("same-origin"));
    response
}

/// A bare page (no frame) with one alert, for refusals before a session is known.
pub(crate) fn notice(status: StatusCode, title: &str, heading: &str, text: Markup) -> Response {
    html_response(
        status,
        view::page(title, None, "", html! { h1 { (heading) } (text) }),
    )
}

/// A post from another site (by `Sec-Fetch-Site`, or an `Origin` naming another host)
/// is refused before any handler runs.
fn cross_site(headers: &HeaderMap) -> Option<Response> {
    let refused = || {
        Some(notice(
            StatusCode::FORBIDDEN,
            "Refused",
            "Refused",
            html! { p role="alert" { "This form was posted from another site." } },
        ))
    };
    // Browsers that send `Sec-Fetch-Site` say it best; others are judged by `Origin`.
    if let Some(site) = headers.get("sec-fetch-site") {
        return match site.to_str() {
            Ok("same-origin" | "none") => None,
            _ => refused(),
        };
    }
    if let Some(origin) = headers.get(ORIGIN) {
        let host = headers.get(HOST).and_then(|v| v.to_str().ok());
        let origin_host = origin
            .to_str()
            .ok()
            .and_then(|o| o.split_once("://"))
            .map(|(_, rest)| rest);
        if host.is_none() || origin_host != host {
            return refused();
        }
    }
    None
}

pub(crate) async fn stylesheet() -> Response {
    (
        [(
            CONTENT_TYPE,
            HeaderValue::from_static("text/css; charset=utf-8"),
        )],
        view::CSS,
    )
        .into_response()
}

pub fn html_response(status: StatusCode, body: String) -> Response {
    (
        status,
        [(
            CONTENT_TYPE,
            HeaderValue::from_static("text/html; charset=utf-8"),
        )],
        body,
    )
        .into_response()
}

pub fn redirect(to: &str) -> Response {
    (
        StatusCode::SEE_OTHER,
        [(
            LOCATION,
            HeaderValue::from_str(to).unwrap_or(HeaderValue::from_static("/console/")),
        )],
    )
        .into_response()
}

pub(crate) fn disabled(console: &Console) -> Response {
    notice(
        StatusCode::FORBIDDEN,
        "Console disabled",
        "The console is disabled",
        html! {
            p {
                "This server has no admin token. Start "
                code { (console.inner.options.command) }
                " with " code { "--admin-token" } " (or " code { "IDEM_ADMIN_TOKEN" }
                ", or " code { "--admin-token-file" } ") to use it."
            }
        },
    )
}

/// An answer for a failure inside a page: logged with its cause, shown in stable words.
pub fn failed(e: &ConsoleError) -> Response {
    tracing::error!(error = %e, "console page failed");
    let (status, text) = if e.is_unavailable() {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "The database did not answer. Try again in a moment.",
        )
    } else {
        (
            StatusCode::INTERNAL_SERVER_ERROR,
            "The page could not be built; the server's log has the cause.",
        )
    };
    notice(
        status,
        "Error",
        "Error",
        html! { p role="alert" { (text) } p { a href="/console/" { "Overview" } } },
    )
}

/// A bad form or query: the page says what was wrong.
pub fn bad_request(op: &Operator, what: &str) -> Response {
    html_response(
        StatusCode::BAD_REQUEST,
        op.page(
            "Not accepted",
            "",
            html! {
                h1 { "Not accepted" }
                p role="alert" { (what) }
                p { a href="/console/" { "Overview" } }
            },
        ),
    )
}

/// A page for `op`, 200.
pub fn ok_page(op: &Operator, title: &str, current: &str, body: Markup) -> Response {
    html_response(StatusCode::OK, op.page(title, current, body))
}

/// A logged-in operator (the extractor of every console page, the host's included).
pub struct Operator {
    pub name: String,
    pub csrf: String,
    pub(crate) session_hash: String,
    nav: Vec<crate::NavEntry>,
}

impl Operator {
    /// A whole page in the frame of this operator's session.
    pub fn page(&self, title: &str, current: &str, body: Markup) -> String {
        view::page(
            title,
            Some(&Viewer {
                operator: &self.name,
                csrf: &self.csrf,
                nav: &self.nav,
            }),
            current,
            body,
        )
    }

    /// The refusal of a posted form that does not carry this session's CSRF token.
    pub fn csrf_refusal(&self, form: &Form) -> Option<Response> {
        let presented = form.get("csrf").unwrap_or("");
        if idem_http::auth::same_secret(presented.as_bytes(), self.csrf.as_bytes()) {
            return None;
        }
        Some(html_response(
            StatusCode::FORBIDDEN,
            self.page(
                "Refused",
                "",
                html! {
                    h1 { "Refused" }
                    p role="alert" {
                        "The form's security token did not match this session (an old page, \
                         or a form from elsewhere). Reload the page and try again."
                    }
                },
            ),
        ))
    }
}

impl FromRequestParts<Console> for Operator {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, console: &Console) -> Result<Self, Response> {
        let Some(admin) = console.inner.admin_token.as_deref() else {
            return Err(disabled(console));
        };
        let Some(cookie) = session_cookie(&parts.headers) else {
            return Err(redirect("/console/login"));
        };
        let hash = digest_hex(&cookie);
        let found = tables::find_session(console.db(), &hash, &token_digest(admin))
            .await
            .map_err(|e| failed(&e))?;
        let Some(row) = found else {
            return Err(redirect("/console/login"));
        };
        Ok(Operator {
            name: row.operator,
            csrf: row.csrf,
            session_hash: hash,
            nav: console.nav(),
        })
    }
}

/// A page's query string; one that does not parse is a 400 page.
pub struct Params<T>(pub T);

impl<T: serde::de::DeserializeOwned + Send> FromRequestParts<Console> for Params<T> {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, console: &Console) -> Result<Self, Response> {
        match axum::extract::Query::<T>::from_request_parts(parts, console).await {
            Ok(axum::extract::Query(q)) => Ok(Params(q)),
            Err(e) => Err(notice(
                StatusCode::BAD_REQUEST,
                "Not accepted",
                "Not accepted",
                html! { p role="alert" { (e.body_text()) } },
            )),
        }
    }
}

/// A posted `application/x-www-form-urlencoded` body (repeated names kept).
pub struct Form(Vec<(String, String)>);

impl Form {
    pub fn parse(body: &[u8]) -> Self {
        Self(form_urlencoded::parse(body).into_owned().collect())
    }

    /// The first value of `name`, trimmed.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.trim())
    }

    /// A non-empty value of `name`.
    pub fn value(&self, name: &str) -> Option<&str> {
        self.get(name).filter(|v| !v.is_empty())
    }

    pub fn all(&self, name: &str) -> Vec<&str> {
        self.0
            .iter()
            .filter(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
            .collect()
    }
}

/// Records a console action (who, what, on what, why, how it went), in the database
/// and the log. A failure to record is logged: the action already happened.
pub async fn audit(
    console: &Console,
    operator: &str,
    action: &str,
    target: &str,
    reason: Option<&str>,
    outcome: &str,
) {
    // Free text is logged quoted: it cannot pass for a log line of its own.
    tracing::info!(
        operator = ?operator,
        action,
        target = ?target,
        reason = reason.map(tracing::field::debug),
        outcome,
        "console action"
    );
    let row = AuditRow {
        at: now_ms(),
        operator: operator.to_owned(),
        action: action.to_owned(),
        target: target.to_owned(),
        reason: reason.map(str::to_owned),
        outcome: outcome.to_owned(),
    };
    if let Err(e) = tables::write_audit(console.db(), &row).await {
        tracing::error!(error = %e, action, "could not record a console action");
    }
}

/// The checked reason of an action: required, one line of at most [`MAX_REASON`].
pub fn reason(form: &Form) -> Result<String, &'static str> {
    let r = form
        .value("reason")
        .ok_or("Give a reason: it is recorded with the action.")?;
    if r.chars().count() > MAX_REASON || r.chars().any(char::is_control) {
        return Err("The reason must be one line of at most 500 characters.");
    }
    Ok(r.to_owned())
}
