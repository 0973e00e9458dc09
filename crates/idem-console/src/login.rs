//! The login and the logout: the admin token checked in constant time before anything
//! else, failed logins throttled per client address and in all (and audited with the
//! address, never with what was typed), the session cookie set and ended. Owns those
//! rules; the session's cookie and digests are `session`'s, its use on every page is
//! `access`'.

use std::collections::{HashMap, VecDeque};
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::header::SET_COOKIE;
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::Response;
use maud::{html, Markup};

use crate::access::{audit, disabled, failed, html_response, redirect, Form, Operator};
use crate::session::{digest_hex, random_token, token_digest, COOKIE_NAME, SESSION_TTL};
use crate::tables::{self, NewSession};
use crate::view;
use crate::Console;

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

/// Failed logins of the last minute, per address and in all.
#[derive(Default)]
pub(crate) struct Failures {
    by_address: HashMap<IpAddr, VecDeque<Instant>>,
    all: VecDeque<Instant>,
}

fn forget_before(q: &mut VecDeque<Instant>, minute_ago: Instant) {
    while q.front().is_some_and(|t| *t < minute_ago) {
        q.pop_front();
    }
}

impl Console {
    /// Counts a failed login from `from`, or answers `false` (counting nothing) when
    /// `from`, or everyone together, used up the minute's failed logins. One lock for
    /// both: concurrent failures cannot slip past the limit between look and count.
    fn count_failure(&self, from: Option<IpAddr>) -> bool {
        let mut f = self
            .inner
            .failures
            .lock()
            .unwrap_or_else(|p| p.into_inner());
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

fn login_form(console: &Console, message: Option<&str>) -> Markup {
    html! {
        h1 { "Log in" }
        @if let Some(m) = message { p role="alert" { (m) } }
        form class="stack" method="post" action="/console/login" {
            div class="field" {
                label for="operator" { "Your name" }
                input id="operator" name="operator" required maxlength=(MAX_OPERATOR)
                    autocomplete="username";
            }
            div class="field" {
                label for="token" { "Admin token" }
                input id="token" name="token" type="password" required
                    autocomplete="current-password";
            }
            button type="submit" { "Log in" }
        }
        p class="muted" {
            "The admin token is the one " code { (console.inner.options.command) }
            " was started with. Your name is recorded with every action you take."
        }
    }
}

pub(crate) async fn login_page(State(console): State<Console>) -> Response {
    if !console.enabled() {
        return disabled(&console);
    }
    html_response(
        StatusCode::OK,
        view::page("Log in", None, "", login_form(&console, None)),
    )
}

pub(crate) async fn login(
    State(console): State<Console>,
    peer: Option<axum::Extension<axum::extract::ConnectInfo<SocketAddr>>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let peer = peer.map(|axum::Extension(axum::extract::ConnectInfo(a))| a.ip());
    let from = peer.map(|ip| console.inner.options.client_address.client(ip, &headers));
    let Some(expected) = console.inner.admin_token.clone() else {
        return disabled(&console);
    };
    let form = Form::parse(&body);
    let again = |status: StatusCode, message: &str| {
        html_response(
            status,
            view::page("Log in", None, "", login_form(&console, Some(message))),
        )
    };
    // The token first, whatever the throttle says: failures from anyone else (a flood
    // through the same proxy) cannot lock out the holder of the token. The comparison
    // is constant-time, so this tells nothing about the token; the throttle limits the
    // noise of failures, and the token's length is what stops guessing.
    let token = form.get("token").unwrap_or("");
    if !idem_http::auth::same_secret(token.as_bytes(), expected.as_bytes()) {
        if !console.count_failure(from) {
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
            &console,
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
    let written = tables::open_session(
        console.db(),
        NewSession {
            session_hash: &digest_hex(&cookie),
            operator,
            csrf: &csrf,
            ttl_ms: i64::try_from(SESSION_TTL.as_millis()).unwrap_or(i64::MAX),
            token_digest: &token_digest(&expected),
        },
    )
    .await;
    if let Err(e) = written {
        return failed(&e);
    }
    audit(&console, operator, "login", "console", None, "ok").await;
    let mut response = redirect("/console/");
    let secure = if console.inner.options.secure_cookie {
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

pub(crate) async fn logout(State(console): State<Console>, op: Operator, body: Bytes) -> Response {
    let form = Form::parse(&body);
    if let Some(refused) = op.csrf_refusal(&form) {
        return refused;
    }
    if let Err(e) = tables::end_session(console.db(), &op.session_hash).await {
        return failed(&e);
    }
    audit(&console, &op.name, "logout", "console", None, "ok").await;
    let mut response = redirect("/console/login");
    // `Secure` as when it was set: a browser keeps a secure cookie from being
    // overwritten by one without.
    let gone = if console.inner.options.secure_cookie {
        "idem_console=; Path=/console; HttpOnly; SameSite=Strict; Max-Age=0; Secure"
    } else {
        "idem_console=; Path=/console; HttpOnly; SameSite=Strict; Max-Age=0"
    };
    response
        .headers_mut()
        .insert(SET_COOKIE, HeaderValue::from_static(gone));
    response
}
