//! The operator console: `/console/`, served by `idem serve` to the holder of the admin
//! token — the incident night on one screen (key inspector with the arrival timeline,
//! search, reconciliation, freeze switches, leases, overview, audit).
//!
//! Owns access and the console's own evidence: the login (the admin token, checked in
//! constant time before anything else, failures throttled per client address and in
//! all), sessions (an HttpOnly, SameSite=Strict cookie;
//! the database keeps only its SHA-256, the expiry and the session's CSRF token),
//! the CSRF check of every state-changing form (the session's token, plus `Origin` /
//! `Sec-Fetch-Site` refusing cross-site posts), and the audit of every action (who,
//! what, on what, why, outcome). Pages are server-rendered HTML with inline SVG and one
//! embedded stylesheet; they carry no script, and the content security policy allows
//! none. Pages (`pages.rs`) change state only through the service's own paths
//! (`freeze`, `reconcile`); this module must not write ledgers itself.

mod html;
mod pages;

use std::collections::VecDeque;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::{FromRequestParts, Request, State};
use axum::http::header::{
    CACHE_CONTROL, CONTENT_SECURITY_POLICY, CONTENT_TYPE, COOKIE, HOST, LOCATION, ORIGIN,
    SET_COOKIE,
};
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use idem_core::{ArchiveLookup, LeaseStore};
use idem_http::metrics::Decision;
use idem_http::IdempotencyMetrics;
use sha2::{Digest, Sha256};

use crate::api::AppState;
use crate::db::sql;
use crate::error::Error;
use crate::forwarded::TrustedProxies;
use crate::ledgers::{new_id, now_ms};
use idem_sql::ArrivalLog;

pub(crate) use html::Viewer;

/// The session cookie's name.
pub const COOKIE_NAME: &str = "idem_console";
/// How long a console session lasts after login.
pub const SESSION_TTL: Duration = Duration::from_secs(8 * 3600);
/// Failed logins allowed per minute from one address; more failures answer 429 until
/// the minute has passed (a correct token still logs in).
const LOGIN_FAILURES_PER_MINUTE: usize = 10;
/// Failed logins allowed per minute from all addresses together (a backstop against
/// guessing from many addresses).
const LOGIN_FAILURES_PER_MINUTE_ALL: usize = 200;
/// Addresses whose failures are remembered; past this, the quiet ones are forgotten.
const FAILING_ADDRESSES: usize = 10_000;
/// Longest operator name.
const MAX_OPERATOR: usize = 64;
/// Longest reason for an action.
pub(crate) const MAX_REASON: usize = 500;

/// What the console needs beyond the API's state.
pub(crate) struct ConsoleState {
    pub(crate) leases: Arc<dyn LeaseStore>,
    pub(crate) archive: Arc<dyn ArchiveLookup>,
    pub(crate) arrivals: Option<ArrivalLog>,
    pub(crate) rates: Rates,
    /// The cookie gets `Secure` (the server speaks HTTPS, or a proxy in front does).
    pub(crate) secure_cookie: bool,
    /// Whose `X-Forwarded-For` names the client of a login.
    proxies: TrustedProxies,
    failures: Mutex<Failures>,
}

/// Failed logins of the last minute, per address and in all.
#[derive(Default)]
struct Failures {
    by_address: std::collections::HashMap<IpAddr, VecDeque<Instant>>,
    all: VecDeque<Instant>,
}

fn forget_before(q: &mut VecDeque<Instant>, minute_ago: Instant) {
    while q.front().is_some_and(|t| *t < minute_ago) {
        q.pop_front();
    }
}

impl ConsoleState {
    pub(crate) fn new(
        leases: Arc<dyn LeaseStore>,
        archive: Arc<dyn ArchiveLookup>,
        arrivals: Option<ArrivalLog>,
        metrics: IdempotencyMetrics,
        secure_cookie: bool,
        proxies: TrustedProxies,
    ) -> Self {
        Self {
            leases,
            archive,
            arrivals,
            rates: Rates::new(metrics),
            secure_cookie,
            proxies,
            failures: Mutex::new(Failures::default()),
        }
    }

    /// Counts a failed login from `from`, or answers `false` (counting nothing) when
    /// `from`, or everyone together, used up the minute's failed logins. One lock for
    /// both: concurrent failures cannot slip past the limit between look and count.
    fn count_failure(&self, from: Option<IpAddr>) -> bool {
        let mut f = self.failures.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        let minute_ago = now - Duration::from_secs(60);
        forget_before(&mut f.all, minute_ago);
        if f.by_address.len() > FAILING_ADDRESSES {
            f.by_address.retain(|_, q| {
                forget_before(q, minute_ago);
                !q.is_empty()
            });
        }
        let mine = from
            .and_then(|ip| f.by_address.get_mut(&ip))
            .map_or(0, |q| {
                forget_before(q, minute_ago);
                q.len()
            });
        if mine >= LOGIN_FAILURES_PER_MINUTE || f.all.len() >= LOGIN_FAILURES_PER_MINUTE_ALL {
            return false;
        }
        f.all.push_back(now);
        if let Some(ip) = from {
            f.by_address.entry(ip).or_default().push_back(now);
        }
        true
    }
}

/// The layer's decision counters, sampled every few seconds for the overview's rates.
pub(crate) struct Rates {
    metrics: IdempotencyMetrics,
    samples: Mutex<VecDeque<Sample>>,
}

#[derive(Clone)]
pub(crate) struct Sample {
    pub(crate) at: Instant,
    pub(crate) counts: Vec<u64>,
}

/// Samples kept: ten minutes at one per 5 s.
const SAMPLES: usize = 121;
pub(crate) const SAMPLE_EVERY: Duration = Duration::from_secs(5);

impl Rates {
    fn new(metrics: IdempotencyMetrics) -> Self {
        Self {
            metrics,
            samples: Mutex::new(VecDeque::new()),
        }
    }

    pub(crate) fn read(&self) -> Sample {
        Sample {
            at: Instant::now(),
            counts: Decision::ALL
                .iter()
                .map(|d| self.metrics.requests(*d))
                .collect(),
        }
    }

    pub(crate) fn sample(&self) {
        let s = self.read();
        let mut q = self.samples.lock().unwrap_or_else(|p| p.into_inner());
        q.push_back(s);
        while q.len() > SAMPLES {
            q.pop_front();
        }
    }

    /// The samples so far, oldest first.
    pub(crate) fn history(&self) -> Vec<Sample> {
        self.samples
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .cloned()
            .collect()
    }
}

/// Samples the rates until dropped (aborted).
pub(crate) async fn sample_rates(console: Arc<ConsoleState>) {
    let mut tick = tokio::time::interval(SAMPLE_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        console.rates.sample();
    }
}

/// The console's routes (merged into the service's router).
pub(crate) fn routes() -> Router<AppState> {
    Router::new()
        .route("/console", get(|| async { redirect("/console/") }))
        .route("/console/", get(pages::overview))
        .route("/console/assets/console.css", get(stylesheet))
        .route("/console/login", get(login_page).post(login))
        .route("/console/logout", axum::routing::post(logout))
        .route("/console/keys/{tenant}/{*key}", get(pages::key))
        .route("/console/search", get(pages::search))
        .route(
            "/console/reconcile",
            get(pages::reconcile).post(pages::reconcile_apply),
        )
        .route("/console/freezes", get(pages::freezes).post(pages::freeze))
        .route(
            "/console/freezes/unfreeze",
            axum::routing::post(pages::unfreeze),
        )
        .route("/console/leases", get(pages::leases))
        .route("/console/leases/{*name}", get(pages::lease))
        .route("/console/audit", get(pages::audit_page))
        .route_layer(middleware::from_fn(guard))
}

/// Headers of every console answer, and the cross-site check of every post.
async fn guard(request: Request, next: Next) -> Response {
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

/// A post from another site (by `Sec-Fetch-Site`, or an `Origin` naming another host)
/// is refused before any handler runs.
fn cross_site(headers: &HeaderMap) -> Option<Response> {
    let refused = || {
        Some(html_response(
            StatusCode::FORBIDDEN,
            html::page(
                "Refused",
                None,
                "",
                "<h1>Refused</h1><p role=\"alert\">This form was posted from another site.</p>",
            ),
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

async fn stylesheet() -> Response {
    (
        [(
            CONTENT_TYPE,
            HeaderValue::from_static("text/css; charset=utf-8"),
        )],
        html::CSS,
    )
        .into_response()
}

pub(crate) fn html_response(status: StatusCode, body: String) -> Response {
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

pub(crate) fn redirect(to: &str) -> Response {
    (
        StatusCode::SEE_OTHER,
        [(
            LOCATION,
            HeaderValue::from_str(to).unwrap_or(HeaderValue::from_static("/console/")),
        )],
    )
        .into_response()
}

fn disabled() -> Response {
    html_response(
        StatusCode::FORBIDDEN,
        html::page(
            "Console disabled",
            None,
            "",
            "<h1>The console is disabled</h1><p>This server has no admin token. Start \
             <code>idem serve</code> with <code>--admin-token</code> (or \
             <code>IDEM_ADMIN_TOKEN</code>, or <code>--admin-token-file</code>) to use it.</p>",
        ),
    )
}

/// An answer for a failure inside a page: logged with its cause, shown in stable words.
pub(crate) fn failed(e: &Error) -> Response {
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
    html_response(
        status,
        html::page(
            "Error",
            None,
            "",
            &format!("<h1>Error</h1><p role=\"alert\">{text}</p><p><a href=\"/console/\">Overview</a></p>"),
        ),
    )
}

/// A bad form or query: the page says what was wrong.
pub(crate) fn bad_request(op: &Operator, what: &str) -> Response {
    html_response(
        StatusCode::BAD_REQUEST,
        html::page(
            "Not accepted",
            Some(&op.viewer()),
            "",
            &format!(
                "<h1>Not accepted</h1><p role=\"alert\">{}</p><p><a href=\"/console/\">Overview</a></p>",
                html::t(what)
            ),
        ),
    )
}

// ---------------------------------------------------------------------------------------
// Sessions

fn digest_hex(s: &str) -> String {
    hex::encode(Sha256::digest(s.as_bytes()))
}

/// What a session keeps of the admin token it was opened with: a session opened with a
/// token that has since been replaced is no session.
fn token_digest(admin: &str) -> String {
    digest_hex(&format!("idem-console-session:{admin}"))
}

fn random_token() -> String {
    format!(
        "{}{}",
        uuid::Uuid::new_v4().simple(),
        uuid::Uuid::new_v4().simple()
    )
}

fn session_cookie(headers: &HeaderMap) -> Option<String> {
    headers
        .get_all(COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|c| c.trim().split_once('='))
        .find(|(name, _)| *name == COOKIE_NAME)
        .map(|(_, value)| value.to_owned())
        .filter(|v| v.len() == 64 && v.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// A logged-in operator (the extractor of every console page).
pub(crate) struct Operator {
    pub(crate) name: String,
    pub(crate) csrf: String,
    session_hash: String,
}

impl Operator {
    pub(crate) fn viewer(&self) -> Viewer<'_> {
        Viewer {
            operator: &self.name,
            csrf: &self.csrf,
        }
    }

    /// The refusal of a posted form that does not carry this session's CSRF token.
    pub(crate) fn csrf_refusal(&self, form: &Form) -> Option<Response> {
        let presented = form.get("csrf").unwrap_or("");
        if idem_http::auth::same_secret(presented.as_bytes(), self.csrf.as_bytes()) {
            None
        } else {
            Some(html_response(
                StatusCode::FORBIDDEN,
                html::page(
                    "Refused",
                    Some(&self.viewer()),
                    "",
                    "<h1>Refused</h1><p role=\"alert\">The form's security token did not match \
                     this session (an old page, or a form from elsewhere). Reload the page and \
                     try again.</p>",
                ),
            ))
        }
    }
}

impl FromRequestParts<AppState> for Operator {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, Response> {
        let Some(admin) = state.admin_token.as_deref() else {
            return Err(disabled());
        };
        let Some(cookie) = session_cookie(&parts.headers) else {
            return Err(redirect("/console/login"));
        };
        let hash = digest_hex(&cookie);
        let found = async {
            let mut conn = state.orders.database().acquire().await?;
            conn.conn()
                .optional(
                    sql(
                        "SELECT operator, csrf FROM console_sessions WHERE session_hash = $1 \
                         AND ended_at IS NULL AND expires_at > $2 AND token_digest = $3",
                    )
                    .bind(hash.clone())
                    .bind(now_ms())
                    .bind(token_digest(admin)),
                )
                .await
        }
        .await
        .map_err(|e| failed(&e))?;
        let Some(row) = found else {
            return Err(redirect("/console/login"));
        };
        Ok(Operator {
            name: row.text("operator").map_err(|e| failed(&e))?,
            csrf: row.text("csrf").map_err(|e| failed(&e))?,
            session_hash: hash,
        })
    }
}

/// A page's query string; one that does not parse is a 400 page.
pub(crate) struct Params<T>(pub(crate) T);

impl<T: serde::de::DeserializeOwned + Send> FromRequestParts<AppState> for Params<T> {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, Response> {
        match axum::extract::Query::<T>::from_request_parts(parts, state).await {
            Ok(axum::extract::Query(q)) => Ok(Params(q)),
            Err(e) => Err(html_response(
                StatusCode::BAD_REQUEST,
                html::page(
                    "Not accepted",
                    None,
                    "",
                    &format!(
                        "<h1>Not accepted</h1><p role=\"alert\">{}</p>",
                        html::t(&e.body_text())
                    ),
                ),
            )),
        }
    }
}

/// A posted `application/x-www-form-urlencoded` body (repeated names kept).
pub(crate) struct Form(Vec<(String, String)>);

impl Form {
    pub(crate) fn parse(body: &[u8]) -> Self {
        Self(form_urlencoded::parse(body).into_owned().collect())
    }

    /// The first value of `name`, trimmed.
    pub(crate) fn get(&self, name: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.trim())
    }

    /// A non-empty value of `name`.
    pub(crate) fn value(&self, name: &str) -> Option<&str> {
        self.get(name).filter(|v| !v.is_empty())
    }

    pub(crate) fn all(&self, name: &str) -> Vec<&str> {
        self.0
            .iter()
            .filter(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
            .collect()
    }
}

/// Records a console action (who, what, on what, why, how it went), in the database
/// and the log. A failure to record is logged: the action already happened.
pub(crate) async fn audit(
    state: &AppState,
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
    let written = async {
        let mut conn = state.orders.database().acquire().await?;
        conn.conn()
            .execute(
                sql(
                    "INSERT INTO console_audit (audit_id, at, operator, action, target, reason, \
                       outcome) VALUES ($1, $2, $3, $4, $5, $6, $7)",
                )
                .bind(new_id("aud"))
                .bind(now_ms())
                .bind(operator)
                .bind(action)
                .bind(target)
                .bind(reason.map(str::to_owned))
                .bind(outcome),
            )
            .await
    }
    .await;
    if let Err(e) = written {
        tracing::error!(error = %e, action, "could not record a console action");
    }
}

/// The checked reason of an action: required, one line of at most [`MAX_REASON`].
pub(crate) fn reason(form: &Form) -> Result<String, &'static str> {
    let r = form
        .value("reason")
        .ok_or("Give a reason: it is recorded with the action.")?;
    if r.chars().count() > MAX_REASON || r.chars().any(char::is_control) {
        return Err("The reason must be one line of at most 500 characters.");
    }
    Ok(r.to_owned())
}

fn login_form(message: Option<&str>) -> String {
    let alert = message
        .map(|m| format!("<p role=\"alert\">{}</p>", html::t(m)))
        .unwrap_or_default();
    format!(
        "<h1>Log in</h1>{alert}<form class=\"stack\" method=\"post\" action=\"/console/login\">\
         <div class=\"field\"><label for=\"operator\">Your name</label><input id=\"operator\" name=\"operator\" required \
         maxlength=\"{MAX_OPERATOR}\" autocomplete=\"username\"></div>\
         <div class=\"field\"><label for=\"token\">Admin token</label><input id=\"token\" name=\"token\" type=\"password\" \
         required autocomplete=\"current-password\"></div>\
         <button type=\"submit\">Log in</button></form>\
         <p class=\"muted\">The admin token is the one <code>idem serve</code> was started with. \
         Your name is recorded with every action you take.</p>"
    )
}

async fn login_page(State(state): State<AppState>) -> Response {
    if state.admin_token.is_none() {
        return disabled();
    }
    html_response(
        StatusCode::OK,
        html::page("Log in", None, "", &login_form(None)),
    )
}

async fn login(
    State(state): State<AppState>,
    peer: Option<axum::Extension<axum::extract::ConnectInfo<SocketAddr>>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let peer = peer.map(|axum::Extension(axum::extract::ConnectInfo(a))| a.ip());
    let from = peer.map(|ip| state.console.proxies.client(ip, &headers));
    let Some(expected) = state.admin_token.clone() else {
        return disabled();
    };
    let form = Form::parse(&body);
    let again = |status: StatusCode, message: &str| {
        html_response(
            status,
            html::page("Log in", None, "", &login_form(Some(message))),
        )
    };
    // The token first, whatever the throttle says: failures from anyone else (a flood
    // through the same proxy) cannot lock out the holder of the token. The comparison
    // is constant-time, so this tells nothing about the token; the throttle limits the
    // noise of failures, and the token's length is what stops guessing.
    let token = form.get("token").unwrap_or("");
    if !idem_http::auth::same_secret(token.as_bytes(), expected.as_bytes()) {
        if !state.console.count_failure(from) {
            return again(
                StatusCode::TOO_MANY_REQUESTS,
                "Too many failed logins in the last minute; wait a minute and try again.",
            );
        }
        // Not the typed name: a token pasted into the wrong field must not be kept.
        let source = match (from, peer) {
            (Some(client), Some(peer)) if client != peer.to_canonical() => {
                format!("{client} via {peer}")
            }
            (Some(client), _) => client.to_string(),
            (None, _) => "unknown address".to_owned(),
        };
        audit(
            &state,
            "(refused login)",
            "login",
            &source,
            None,
            "refused: wrong admin token",
        )
        .await;
        return again(
            StatusCode::UNAUTHORIZED,
            "The admin token was not accepted.",
        );
    }
    let operator = form.value("operator").unwrap_or("");
    if operator.is_empty()
        || operator.chars().count() > MAX_OPERATOR
        || operator.chars().any(char::is_control)
    {
        return again(
            StatusCode::BAD_REQUEST,
            "Give your name (at most 64 characters): it is recorded with your actions.",
        );
    }
    let cookie = random_token();
    let csrf = random_token();
    let now = now_ms();
    let ttl = i64::try_from(SESSION_TTL.as_millis()).unwrap_or(i64::MAX);
    let written = async {
        let mut conn = state.orders.database().acquire().await?;
        let mut c = conn.conn();
        // Sessions that ended a day ago are no evidence anyone needs.
        c.execute(sql("DELETE FROM console_sessions WHERE expires_at < $1").bind(now - 86_400_000))
            .await?;
        c.execute(
            sql(
                "INSERT INTO console_sessions (session_hash, operator, csrf, created_at, \
                   expires_at, token_digest) VALUES ($1, $2, $3, $4, $5, $6)",
            )
            .bind(digest_hex(&cookie))
            .bind(operator)
            .bind(csrf.clone())
            .bind(now)
            .bind(now + ttl)
            .bind(token_digest(&expected)),
        )
        .await
    }
    .await;
    if let Err(e) = written {
        return failed(&e);
    }
    audit(&state, operator, "login", "console", None, "ok").await;
    let mut response = redirect("/console/");
    let secure = if state.console.secure_cookie {
        "; Secure"
    } else {
        ""
    };
    let set = format!(
        "{COOKIE_NAME}={cookie}; Path=/console; HttpOnly; SameSite=Strict; Max-Age={}{secure}",
        SESSION_TTL.as_secs()
    );
    if let Ok(v) = HeaderValue::from_str(&set) {
        response.headers_mut().insert(SET_COOKIE, v);
    }
    response
}

async fn logout(State(state): State<AppState>, op: Operator, body: Bytes) -> Response {
    let form = Form::parse(&body);
    if let Some(refused) = op.csrf_refusal(&form) {
        return refused;
    }
    let ended = async {
        let mut conn = state.orders.database().acquire().await?;
        conn.conn()
            .execute(
                sql("UPDATE console_sessions SET ended_at = $1 WHERE session_hash = $2")
                    .bind(now_ms())
                    .bind(op.session_hash.clone()),
            )
            .await
    }
    .await;
    if let Err(e) = ended {
        return failed(&e);
    }
    audit(&state, &op.name, "logout", "console", None, "ok").await;
    let mut response = redirect("/console/login");
    // `Secure` as when it was set: a browser keeps a secure cookie from being
    // overwritten by one without.
    let gone = if state.console.secure_cookie {
        "idem_console=; Path=/console; HttpOnly; SameSite=Strict; Max-Age=0; Secure"
    } else {
        "idem_console=; Path=/console; HttpOnly; SameSite=Strict; Max-Age=0"
    };
    response
        .headers_mut()
        .insert(SET_COOKIE, HeaderValue::from_static(gone));
    response
}
