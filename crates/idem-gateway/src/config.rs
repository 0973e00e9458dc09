//! What the gateway does: where it listens, where it forwards, which routes need a key,
//! who the callers are, how long results stay in the short window, and its time limits.
//!
//! The configuration file is JSON (see [`GatewayConfig::from_file`]); every field has a
//! default, so `{"upstream": "http://127.0.0.1:9000"}` is a complete file. Durations are
//! whole milliseconds in fields ending in `_ms`. This module does no I/O besides reading
//! the file and must not know about connections or stores.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use http::Method;
use idem_core::wire::{KeyRule, PathPattern};
use idem_core::{Fingerprinter, OutcomePolicy, Principal, TenantId};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::GatewayError;

/// The whole gateway configuration.
#[derive(Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct GatewayConfig {
    /// Address to listen on. Port 0 picks a free port (see [`crate::bind`]).
    pub listen: SocketAddr,
    /// The upstream base URL: `http://host:port` or `https://host[:port]`, with an
    /// optional path prefix. This or `upstreams` is required to start; a file may leave
    /// both out when the command line supplies them (`--upstream`, repeatable).
    pub upstream: String,
    /// Several upstream base URLs (instead of `upstream`), each like `upstream`: copies
    /// of one service on one database. Each request goes to one of them (see
    /// [`crate::upstreams`]), and one that stops answering is left out for a while
    /// (`upstream_health`).
    pub upstreams: Vec<String>,
    /// When an upstream is left out: consecutive failures, and for how long.
    pub upstream_health: UpstreamHealthConfig,
    /// For an `https://` upstream: a private CA (PEM) its certificate may chain to,
    /// besides the Mozilla roots. Applies to every upstream.
    pub upstream_ca_file: Option<PathBuf>,
    /// Serve HTTPS: the certificate chain and its private key (PEM files), both or
    /// neither.
    pub tls_cert_file: Option<PathBuf>,
    pub tls_key_file: Option<PathBuf>,
    /// Share the short window through Redis (`redis://host:port[/db]`, `rediss://…` for
    /// TLS, `redis+cluster://host:port,host:port` for a Redis Cluster); `None` keeps it in
    /// this process's memory.
    pub redis_url: Option<String>,
    /// For `rediss://`: the CA (PEM) the Redis server's certificate must chain to,
    /// instead of the system's trust store.
    pub redis_ca_file: Option<PathBuf>,
    /// Key prefix in Redis (records and wake-up channels). No braces.
    pub redis_prefix: String,
    /// Bound on every Redis command and on each (re)connect attempt.
    pub redis_timeout_ms: u64,
    /// How long a completed response stays in the short window. Default 2 minutes.
    pub window_ms: u64,
    /// Memory budget of the in-process window (no Redis): past it, new keys get 503
    /// until records expire. Default 256 MiB.
    pub memory_window_bytes: usize,
    /// The most one partition (an API key's tenant; without API keys, one caller) may
    /// hold of the in-process window: past it, that caller's new keys get 429 while
    /// everyone else's are still taken. Default a sixteenth of `memory_window_bytes`.
    pub window_partition_bytes: Option<usize>,
    /// Keys one partition may have executing at once on this instance; more get 429.
    /// Default 64.
    pub max_in_progress_per_caller: usize,
    /// Bytes of keyed request bodies buffered at once across all requests (each is held
    /// until its execution ends); a body that does not fit gets 503 + `Retry-After`
    /// before it is read. At least `max_body_bytes`. Default 64 MiB.
    pub max_buffered_body_bytes: usize,
    /// In-flight marker lease: how long an execution holds a key before another
    /// instance may take it over. Renewed every third of it while the upstream works.
    pub lease_ms: u64,
    /// How long a duplicate waits for the first request's result before it gets 409.
    pub max_wait_ms: u64,
    /// Bound on one upstream exchange: response head for pass-through routes; head and
    /// body for keyed routes. Past it on a keyed route the result is uncertain and the
    /// gateway asks the upstream for the key's state. Default 5 s: half of a client's
    /// usual 10 s attempt (idem-client's default), so a keyed request stuck on a paused
    /// upstream still has time, within that one attempt, for the state query and a
    /// same-key re-send to another upstream; a slower upstream that is still working is
    /// waited for through the state query (up to `max_wait_ms`).
    pub upstream_timeout_ms: u64,
    /// Bound on connecting to the upstream.
    pub upstream_connect_timeout_ms: u64,
    /// An upstream connection idle this long since its last response was read through is
    /// not used again: keep it under the upstream's own idle timeout. Default 4 s (Node: 5).
    pub upstream_idle_timeout_ms: u64,
    /// A client must send its request head within this time, or the connection is closed.
    pub header_read_timeout_ms: u64,
    /// A client must keep its body flowing: the longest pause between body chunks
    /// (keyed routes also bound the whole body by it).
    pub body_read_timeout_ms: u64,
    /// Largest request body on a keyed route (it is buffered to fingerprint it); larger →
    /// 413. Pass-through bodies are streamed and not limited by the gateway.
    pub max_body_bytes: usize,
    /// Largest upstream response on a keyed route (it is buffered to share it with
    /// duplicates); larger → 502.
    pub max_response_bytes: usize,
    /// Responses up to this size are kept in the window for replay; a larger one reaches
    /// its callers but later duplicates go to the upstream (with the same key).
    pub max_stored_bytes: usize,
    /// Which requests need `Idempotency-Key`. Of the rules matching a request, one
    /// naming its method wins over one for every method, then the most specific path
    /// (`/v1/orders/search` over `/v1/orders/{id}` over `/v1/*`), then the first listed:
    /// the layer's precedence ([`idem_http::routes`]). Requests no rule matches pass
    /// through untouched.
    pub routes: Vec<RouteConfig>,
    /// Callers: API keys and the tenants they stand for.
    pub auth: AuthConfig,
    /// Header carrying the authenticated tenant to the upstream. Always removed from
    /// client requests: the upstream may trust it because only the gateway sets it.
    pub tenant_header: String,
    /// Header carrying the authenticated principal to the upstream (removed from client
    /// requests too).
    pub principal_header: String,
    /// Optional shared secret sent upstream in `x-idem-gateway-token`, so the upstream
    /// can tell the gateway's requests (and so its tenant header) from anyone else's.
    pub upstream_token: Option<String>,
    /// The upstream's idempotency-key state endpoint, asked after an uncertain result.
    pub state_query: StateQueryConfig,
    /// Which request headers and JSON fields count towards the fingerprint.
    pub fingerprint: Fingerprinter,
    /// Which upstream statuses end the intent in the window (replayed) and which leave
    /// the key open for a retry (still shared with concurrent duplicates).
    pub outcome_policy: OutcomePolicy,
    /// Gateway's own endpoints (`<prefix>/metrics`, `<prefix>/health`); never forwarded.
    pub admin_prefix: String,
    /// Name of this instance in logs and record owners; `None` picks `gw-<uuid>`.
    pub instance_id: Option<String>,
    /// Response headers that belong to one caller (`Set-Cookie`, say): the caller whose
    /// request executed gets them; they are never stored in the window and never
    /// replayed to a duplicate. Compared case-insensitively; `set-cookie` is always
    /// included.
    pub per_caller_response_headers: Vec<String>,
    /// Peers (addresses or CIDR blocks, `10.0.0.0/8`) whose `X-Forwarded-*`,
    /// `Forwarded` and `X-Real-IP` the gateway keeps (and whose `X-Forwarded-For` it
    /// extends). From anyone else those fields are dropped: the upstream sees the peer
    /// address only.
    pub trusted_proxies: Vec<String>,
    /// After a shutdown signal: how long requests in flight may take to finish. Past
    /// it, keyed executions still running are ended as retryable in the window (the
    /// key is free at once instead of after its lease).
    pub shutdown_grace_ms: u64,
}

impl Default for GatewayConfig {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 8080)),
            upstream: String::new(),
            upstreams: Vec::new(),
            upstream_health: UpstreamHealthConfig::default(),
            upstream_ca_file: None,
            tls_cert_file: None,
            tls_key_file: None,
            redis_url: None,
            redis_ca_file: None,
            redis_prefix: "idem-gw".into(),
            redis_timeout_ms: 1_000,
            window_ms: 120_000,
            memory_window_bytes: crate::memory::DEFAULT_MAX_BYTES,
            window_partition_bytes: None,
            max_in_progress_per_caller: 64,
            max_buffered_body_bytes: 64 * 1024 * 1024,
            lease_ms: 10_000,
            max_wait_ms: 30_000,
            upstream_timeout_ms: 5_000,
            upstream_connect_timeout_ms: 2_000,
            upstream_idle_timeout_ms: 4_000,
            header_read_timeout_ms: 10_000,
            body_read_timeout_ms: 10_000,
            max_body_bytes: 1024 * 1024,
            max_response_bytes: 8 * 1024 * 1024,
            max_stored_bytes: 1024 * 1024,
            routes: vec![RouteConfig {
                methods: vec!["POST".into(), "PATCH".into()],
                path: "/*".into(),
                key: KeyRule::Required,
            }],
            auth: AuthConfig::default(),
            tenant_header: "x-idem-tenant".into(),
            principal_header: "x-idem-principal".into(),
            upstream_token: None,
            state_query: StateQueryConfig::default(),
            fingerprint: Fingerprinter::default(),
            outcome_policy: OutcomePolicy::default(),
            admin_prefix: "/_idem".into(),
            instance_id: None,
            per_caller_response_headers: vec!["set-cookie".into()],
            trusted_proxies: Vec::new(),
            shutdown_grace_ms: 10_000,
        }
    }
}

/// One route rule: methods plus a path pattern.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RouteConfig {
    /// Methods the rule applies to (`["POST"]`); empty or `["*"]` means every method.
    #[serde(default)]
    pub methods: Vec<String>,
    /// Path pattern: literal segments, `{name}` for one segment, a final `*` for any
    /// rest (`/v1/orders`, `/v1/orders/{id}/confirm`, `/v1/*`).
    pub path: String,
    /// `required` (400 without a key), `optional` (coalesced when a key is sent) or
    /// `none` (streamed through untouched).
    #[serde(default)]
    pub key: KeyRule,
}

/// The principal of callers without any credential (where anonymous access is allowed);
/// no API key may stand for it.
pub const ANONYMOUS: &str = "anonymous";

/// Callers and their tenants.
#[derive(Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AuthConfig {
    /// Header carrying the API key. `authorization` expects `Bearer <key>`; any other
    /// header carries the key as its whole value.
    pub header: String,
    /// API key → tenant (a string) or `{"tenant": …, "principal": …}`. A key listed
    /// twice is refused (it would stand for two tenants).
    #[serde(deserialize_with = "unique_keys")]
    pub api_keys: BTreeMap<String, ApiKeyEntry>,
    /// Also require a known API key on pass-through routes (default: only keyed routes
    /// need one; an unknown key is refused everywhere).
    pub require_on_passthrough: bool,
    /// Remove the API key header before forwarding (default true: it is the gateway's
    /// credential, not the upstream's).
    pub strip_api_key: bool,
    /// Tenant for callers without any credential. Keyed routes refuse such callers
    /// (401) unless this is set: anonymous access is a choice, never a default.
    pub anonymous_tenant: Option<TenantId>,
    /// Without `api_keys`, the caller is whoever these request headers say (the
    /// upstream's own credential): the principal is a keyed hash of their values, so
    /// two callers never share a stored result. `cookie:NAME` takes one cookie instead
    /// of the whole `Cookie` header (use it when other cookies are shared or rotate).
    /// Empty or blank values count as absent. Unset: `authorization`, `cookie`,
    /// `header` and every `upstream_credential_headers` entry. When set, start-up warns
    /// about each `upstream_credential_headers` entry the list leaves out.
    pub credential_headers: Option<Vec<String>>,
    /// Headers the upstream authenticates callers by (`x-session`, say), besides
    /// `Authorization` and `Cookie`: part of the caller's identity unless
    /// `credential_headers` says otherwise.
    pub upstream_credential_headers: Vec<String>,
    /// The per-deployment secret of that hash (at least 16 bytes). Gateways sharing a
    /// window must share it; a single in-memory gateway makes a random one at start.
    /// Also read from `principal_secret_file` or `IDEM_GATEWAY_PRINCIPAL_SECRET`.
    pub principal_secret: Option<String>,
    /// A file holding `principal_secret` (trailing newline ignored).
    pub principal_secret_file: Option<std::path::PathBuf>,
}

/// Secrets (API keys, the principal secret, the upstream token, a Redis password) as
/// `***`: a configuration printed in a log line must not carry them.
fn redacted(v: &mut serde_json::Value) {
    let hide = |x: &mut serde_json::Value| {
        if !x.is_null() {
            *x = "***".into();
        }
    };
    if let Some(auth) = v.get_mut("auth") {
        if let Some(keys) = auth.get_mut("api_keys").and_then(|k| k.as_object_mut()) {
            let tenants: Vec<serde_json::Value> = keys.values().cloned().collect();
            *auth.get_mut("api_keys").expect("present") = tenants.into();
        }
        if let Some(s) = auth.get_mut("principal_secret") {
            hide(s);
        }
    }
    if let Some(s) = v.get_mut("principal_secret") {
        hide(s);
    }
    if let Some(keys) = v.get_mut("api_keys").and_then(|k| k.as_object_mut()) {
        let tenants: Vec<serde_json::Value> = keys.values().cloned().collect();
        *v.get_mut("api_keys").expect("present") = tenants.into();
    }
    if let Some(s) = v.get_mut("upstream_token") {
        hide(s);
    }
    let hide_userinfo = |url: &mut serde_json::Value| {
        if let Some(u) = url.as_str() {
            if let Some((scheme, rest)) = u.split_once("://") {
                if let Some((_, host)) = rest.rsplit_once('@') {
                    *url = format!("{scheme}://***@{host}").into();
                }
            }
        }
    };
    for field in ["redis_url", "upstream"] {
        if let Some(url) = v.get_mut(field) {
            hide_userinfo(url);
        }
    }
    if let Some(urls) = v.get_mut("upstreams").and_then(|u| u.as_array_mut()) {
        urls.iter_mut().for_each(hide_userinfo);
    }
}

impl std::fmt::Debug for GatewayConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut v = serde_json::to_value(self).map_err(|_| std::fmt::Error)?;
        redacted(&mut v);
        write!(f, "GatewayConfig {v}")
    }
}

impl std::fmt::Debug for AuthConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut v = serde_json::to_value(self).map_err(|_| std::fmt::Error)?;
        redacted(&mut v);
        write!(f, "AuthConfig {v}")
    }
}

/// Refuses a JSON object that names one API key twice (serde would keep the last).
fn unique_keys<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<BTreeMap<String, ApiKeyEntry>, D::Error> {
    struct Unique;
    impl<'de> serde::de::Visitor<'de> for Unique {
        type Value = BTreeMap<String, ApiKeyEntry>;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("an object of API key to tenant")
        }
        fn visit_map<A: serde::de::MapAccess<'de>>(
            self,
            mut map: A,
        ) -> Result<Self::Value, A::Error> {
            let mut out = BTreeMap::new();
            while let Some((k, v)) = map.next_entry::<String, ApiKeyEntry>()? {
                if out.insert(k, v).is_some() {
                    return Err(serde::de::Error::custom(
                        "an API key is listed twice in auth.api_keys",
                    ));
                }
            }
            Ok(out)
        }
    }
    d.deserialize_map(Unique)
}

impl Default for AuthConfig {
    fn default() -> Self {
        Self {
            header: "x-api-key".into(),
            api_keys: BTreeMap::new(),
            require_on_passthrough: false,
            strip_api_key: true,
            anonymous_tenant: None,
            credential_headers: None,
            upstream_credential_headers: Vec::new(),
            principal_secret: None,
            principal_secret_file: None,
        }
    }
}

/// What an API key stands for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum ApiKeyEntry {
    /// Just the tenant; the principal is the tenant too.
    Tenant(TenantId),
    Identity {
        tenant: TenantId,
        principal: Option<Principal>,
    },
}

impl ApiKeyEntry {
    pub fn tenant(&self) -> &TenantId {
        match self {
            ApiKeyEntry::Tenant(t) | ApiKeyEntry::Identity { tenant: t, .. } => t,
        }
    }

    pub fn principal(&self) -> Principal {
        match self {
            ApiKeyEntry::Identity {
                principal: Some(p), ..
            } => p.clone(),
            other => {
                Principal::new(other.tenant().as_str()).expect("a tenant id is a valid principal")
            }
        }
    }
}

/// Passive health of the upstreams, as reverse proxies do it (nginx `max_fails` and
/// `fail_timeout`, Envoy's outlier detection): an upstream that fails
/// `consecutive_failures` times in a row gets no new requests for `eject_ms`. A
/// failure is no answer: a connect failure, a timeout, a connection that broke before
/// the answer was in. Any answer, a 5xx included, is a success and resets the count.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct UpstreamHealthConfig {
    /// Failures in a row that leave an upstream out. Default 3.
    pub consecutive_failures: u32,
    /// How long it stays out. Default 5 s.
    pub eject_ms: u64,
}

impl Default for UpstreamHealthConfig {
    fn default() -> Self {
        Self {
            consecutive_failures: 3,
            eject_ms: 5_000,
        }
    }
}

/// The upstream's key state endpoint (the business layer's answer to "did my request
/// with this key take effect?").
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StateQueryConfig {
    pub method: String,
    /// Path template; `{key}` is replaced by the percent-encoded key.
    pub path: String,
    pub timeout_ms: u64,
    /// How many times an uncertain request may be re-sent (same key, same body) when the
    /// upstream reports the key absent. Bounded; 0 never re-sends.
    pub max_retries: u32,
}

impl Default for StateQueryConfig {
    fn default() -> Self {
        Self {
            method: "GET".into(),
            path: "/v1/idempotency-keys/{key}".into(),
            timeout_ms: 5_000,
            max_retries: 2,
        }
    }
}

/// Whether a file's mode lets users other than its owner read (or write) it.
pub fn readable_by_others(path: &Path) -> bool {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::metadata(path).is_ok_and(|m| m.permissions().mode() & 0o077 != 0)
    }
    #[cfg(not(unix))]
    {
        let _ = path;
        false
    }
}

fn ms(v: u64) -> Duration {
    Duration::from_millis(v)
}

impl GatewayConfig {
    /// A default configuration for `listen` and `upstream`.
    pub fn new(listen: SocketAddr, upstream: impl Into<String>) -> Self {
        Self {
            listen,
            upstream: upstream.into(),
            ..Self::default()
        }
    }

    /// Reads a JSON configuration file; missing fields take their defaults, unknown
    /// fields are an error. The result is validated.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self, GatewayError> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path)
            .map_err(|e| GatewayError::Config(format!("reading {}: {e}", path.display())))?;
        let toml = path
            .extension()
            .is_some_and(|e| e.eq_ignore_ascii_case("toml"));
        let parsed = if toml {
            Self::from_toml(&text)
        } else {
            Self::from_json(&text)
        };
        let config =
            parsed.map_err(|e| GatewayError::Config(format!("{}: {e}", path.display())))?;
        if config.holds_secrets() && readable_by_others(path) {
            tracing::warn!(file = %path.display(), "the configuration holds secrets (API keys, the principal secret, the upstream token or a Redis password) and is readable by other users; chmod 600 it");
        }
        Ok(config)
    }

    /// Whether the configuration itself carries a secret.
    fn holds_secrets(&self) -> bool {
        !self.auth.api_keys.is_empty()
            || self.auth.principal_secret.is_some()
            || self.upstream_token.is_some()
            || self
                .redis_url
                .as_deref()
                .and_then(|u| u.split_once("://"))
                .is_some_and(|(_, rest)| rest.split('/').next().unwrap_or("").contains('@'))
    }

    /// Each top-level setting from its environment variable when set: `IDEM_` and the
    /// field in upper case (`IDEM_WINDOW_MS=60000`, `IDEM_REDIS_URL=…`; a list or table
    /// as JSON, `IDEM_ROUTES='[…]'`). Applied over the file, under the command line's
    /// flags.
    pub fn with_env(
        self,
        vars: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Self, GatewayError> {
        let vars: BTreeMap<String, String> = vars
            .into_iter()
            .filter(|(k, _)| k.starts_with("IDEM_"))
            .collect();
        let mut value = serde_json::to_value(&self)
            .map_err(|e| GatewayError::Config(format!("settings: {e}")))?;
        let Some(fields) = value.as_object_mut() else {
            return Ok(self);
        };
        let mut changed = false;
        for (name, current) in fields.iter_mut() {
            let var = format!("IDEM_{}", name.to_ascii_uppercase());
            let Some(text) = vars.get(&var) else {
                continue;
            };
            let bad = |e: &dyn std::fmt::Display| GatewayError::Config(format!("{var}: {e}"));
            *current = match current {
                Value::Number(_) | Value::Bool(_) | Value::Array(_) | Value::Object(_) => {
                    serde_json::from_str(text).map_err(|e| bad(&e))?
                }
                _ => Value::String(text.clone()),
            };
            changed = true;
        }
        if !changed {
            return Ok(self);
        }
        let config: GatewayConfig = serde_json::from_value(value)
            .map_err(|e| GatewayError::Config(format!("settings from the environment: {e}")))?;
        config.check(config.upstream_urls().is_empty())?;
        Ok(config)
    }

    /// Parses and validates a TOML configuration (the same fields as the JSON form).
    pub fn from_toml(text: &str) -> Result<Self, GatewayError> {
        let config: GatewayConfig =
            toml::from_str(text).map_err(|e| GatewayError::Config(e.to_string()))?;
        config.check(config.upstream_urls().is_empty())?;
        Ok(config)
    }

    /// Parses and validates a JSON configuration (an absent `upstream` is allowed here:
    /// the command line may supply it; starting checks it).
    pub fn from_json(text: &str) -> Result<Self, GatewayError> {
        let config: GatewayConfig =
            serde_json::from_str(text).map_err(|e| GatewayError::Config(e.to_string()))?;
        config.check(config.upstream_urls().is_empty())?;
        Ok(config)
    }

    /// Checks what serde cannot: URLs, patterns, methods, header names, bounds.
    pub fn validate(&self) -> Result<(), GatewayError> {
        self.check(false)
    }

    fn check(&self, upstream_may_be_missing: bool) -> Result<(), GatewayError> {
        let bad = |msg: String| Err(GatewayError::Config(msg));
        if !self.upstream.is_empty() && !self.upstreams.is_empty() {
            return bad("give upstream (one URL) or upstreams (a list), not both".into());
        }
        if self.upstream_urls().is_empty() && !upstream_may_be_missing {
            return bad(
                "upstream or upstreams is required (--upstream URL, repeatable, or \"upstream\" / \"upstreams\" in the file)"
                    .into(),
            );
        }
        let mut seen = std::collections::BTreeSet::new();
        for url in self.upstream_urls() {
            crate::upstream::UpstreamBase::parse(url)?;
            if !seen.insert(crate::upstream::without_userinfo(url)) {
                return bad(format!("upstreams lists {url:?} twice"));
            }
        }
        if self.upstream_health.consecutive_failures == 0 {
            return bad("upstream_health.consecutive_failures must be positive".into());
        }
        if let Err(e) =
            idem_net::tls::CertFiles::pair(self.tls_cert_file.clone(), self.tls_key_file.clone())
        {
            return bad(e);
        }
        if self.max_buffered_body_bytes < self.max_body_bytes {
            return bad(format!(
                "max_buffered_body_bytes ({}) must hold at least one body (max_body_bytes {})",
                self.max_buffered_body_bytes, self.max_body_bytes
            ));
        }
        if self.max_in_progress_per_caller == 0 || self.window_partition_bytes == Some(0) {
            return bad(
                "max_in_progress_per_caller and window_partition_bytes must be positive".into(),
            );
        }
        if self.memory_window_bytes < self.max_stored_bytes {
            return bad(format!(
                "memory_window_bytes ({}) must hold at least one stored response \
                 (max_stored_bytes {})",
                self.memory_window_bytes, self.max_stored_bytes
            ));
        }
        if self.redis_prefix.is_empty() || self.redis_prefix.contains(['{', '}']) {
            return bad(format!(
                "redis_prefix must be non-empty and free of braces, got {:?}",
                self.redis_prefix
            ));
        }
        for (name, v) in [
            ("window_ms", self.window_ms),
            ("lease_ms", self.lease_ms),
            ("upstream_timeout_ms", self.upstream_timeout_ms),
            (
                "upstream_connect_timeout_ms",
                self.upstream_connect_timeout_ms,
            ),
            ("upstream_idle_timeout_ms", self.upstream_idle_timeout_ms),
            ("header_read_timeout_ms", self.header_read_timeout_ms),
            ("body_read_timeout_ms", self.body_read_timeout_ms),
            ("redis_timeout_ms", self.redis_timeout_ms),
            ("state_query.timeout_ms", self.state_query.timeout_ms),
            ("upstream_health.eject_ms", self.upstream_health.eject_ms),
            ("shutdown_grace_ms", self.shutdown_grace_ms),
        ] {
            if v == 0 {
                return bad(format!("{name} must be positive"));
            }
        }
        if self.lease_ms > idem_core::store::MAX_LEASE.as_millis() as u64 {
            return bad("lease_ms is longer than a store accepts".into());
        }
        for rule in &self.routes {
            PathPattern::parse(&rule.path).map_err(GatewayError::Config)?;
            for m in &rule.methods {
                if m != "*" && Method::from_bytes(m.as_bytes()).is_err() {
                    return bad(format!("route {}: bad method {m:?}", rule.path));
                }
            }
        }
        for (what, name) in [
            ("tenant_header", &self.tenant_header),
            ("principal_header", &self.principal_header),
            ("auth.header", &self.auth.header),
        ]
        .into_iter()
        .chain(
            self.auth
                .credential_headers
                .iter()
                .flatten()
                .filter(|h| !h.to_ascii_lowercase().starts_with("cookie:"))
                .map(|h| ("auth.credential_headers", h)),
        )
        .chain(
            self.auth
                .upstream_credential_headers
                .iter()
                .map(|h| ("auth.upstream_credential_headers", h)),
        )
        .chain(
            self.per_caller_response_headers
                .iter()
                .map(|h| ("per_caller_response_headers", h)),
        ) {
            if http::HeaderName::from_bytes(name.as_bytes()).is_err() {
                return bad(format!("{what} {name:?} is not a header name"));
            }
        }
        // The identity headers are set once each, beside fields the gateway owns.
        let (tenant, principal) = (
            self.tenant_header.to_ascii_lowercase(),
            self.principal_header.to_ascii_lowercase(),
        );
        if tenant == principal {
            return bad(format!(
                "tenant_header and principal_header are both {tenant:?}"
            ));
        }
        let reserved = [
            http::header::HOST,
            http::header::CONTENT_LENGTH,
            http::header::TRANSFER_ENCODING,
            crate::ctx::X_REQUEST_ID,
            idem_core::wire::TRACEPARENT,
            crate::ctx::GATEWAY_TOKEN,
            idem_http::headers::IDEMPOTENCY_KEY,
        ];
        for name in [&tenant, &principal] {
            // Both parse: checked as header names above.
            let header = http::HeaderName::from_bytes(name.as_bytes()).ok();
            if header.is_some_and(|h| reserved.contains(&h) || crate::hop::is_hop_by_hop(&h))
                || name.starts_with("x-forwarded-")
            {
                return bad(format!(
                    "{name:?} is a header the gateway sets or frames itself; pick another tenant_header or principal_header"
                ));
            }
        }
        for p in &self.trusted_proxies {
            if p.parse::<crate::forwarded::IpNet>().is_err() {
                return bad(format!(
                    "trusted_proxies: {p:?} is not an address or CIDR block"
                ));
            }
        }
        if let Some(anon) = &self.auth.anonymous_tenant {
            if self.auth.api_keys.values().any(|e| e.tenant() == anon) {
                return bad(format!(
                    "auth.anonymous_tenant {anon} is also an API key's tenant: anonymous callers would share its keys"
                ));
            }
        }
        if self
            .auth
            .api_keys
            .values()
            .any(|e| e.principal().as_str() == ANONYMOUS)
        {
            return bad(format!(
                "an API key's principal may not be {:?}: it names callers without a credential",
                ANONYMOUS
            ));
        }
        if self.auth.principal_secret.is_some() && self.auth.principal_secret_file.is_some() {
            return bad(
                "give auth.principal_secret or auth.principal_secret_file, not both".into(),
            );
        }
        if let Some(s) = &self.auth.principal_secret {
            if s.len() < 16 {
                return bad("auth.principal_secret must be at least 16 bytes".into());
            }
        }
        if let Some(token) = &self.upstream_token {
            if http::HeaderValue::from_str(token).is_err() {
                return bad("upstream_token is not a valid header value".into());
            }
        }
        if !self.state_query.path.starts_with('/') || !self.state_query.path.contains("{key}") {
            return bad("state_query.path must start with / and contain {key}".into());
        }
        if Method::from_bytes(self.state_query.method.as_bytes()).is_err() {
            return bad("state_query.method is not a method".into());
        }
        if !self.admin_prefix.starts_with('/') || self.admin_prefix.len() < 2 {
            return bad("admin_prefix must start with / and name a path".into());
        }
        Ok(())
    }

    /// The upstream URLs: `upstreams`, or `upstream` alone (none when neither is set).
    pub fn upstream_urls(&self) -> Vec<&str> {
        if self.upstreams.is_empty() && !self.upstream.is_empty() {
            vec![self.upstream.as_str()]
        } else {
            self.upstreams.iter().map(String::as_str).collect()
        }
    }

    /// Sets the upstreams from the command line: one URL as `upstream`, several as
    /// `upstreams`; whatever the file said is replaced.
    pub fn set_upstreams(&mut self, mut urls: Vec<String>) {
        if urls.len() == 1 {
            self.upstream = urls.remove(0);
            self.upstreams.clear();
        } else {
            self.upstream.clear();
            self.upstreams = urls;
        }
    }

    pub fn upstream_eject(&self) -> Duration {
        ms(self.upstream_health.eject_ms)
    }

    /// The most one partition may hold of the in-process window.
    pub fn partition_window_bytes(&self) -> usize {
        self.window_partition_bytes
            .unwrap_or(self.memory_window_bytes / 16)
            .max(1)
    }

    pub fn window(&self) -> Duration {
        ms(self.window_ms)
    }
    pub fn lease(&self) -> Duration {
        ms(self.lease_ms)
    }
    pub fn max_wait(&self) -> Duration {
        ms(self.max_wait_ms)
    }
    pub fn upstream_timeout(&self) -> Duration {
        ms(self.upstream_timeout_ms)
    }
    pub fn upstream_connect_timeout(&self) -> Duration {
        ms(self.upstream_connect_timeout_ms)
    }

    pub fn upstream_idle_timeout(&self) -> Duration {
        ms(self.upstream_idle_timeout_ms)
    }
    pub fn header_read_timeout(&self) -> Duration {
        ms(self.header_read_timeout_ms)
    }
    pub fn body_read_timeout(&self) -> Duration {
        ms(self.body_read_timeout_ms)
    }
    pub fn redis_timeout(&self) -> Duration {
        ms(self.redis_timeout_ms)
    }
    pub fn state_query_timeout(&self) -> Duration {
        ms(self.state_query.timeout_ms)
    }
    pub fn shutdown_grace(&self) -> Duration {
        ms(self.shutdown_grace_ms)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn minimal_file_takes_defaults() {
        let c = GatewayConfig::from_json(r#"{"upstream": "http://127.0.0.1:9000"}"#).unwrap();
        assert_eq!(c.window(), Duration::from_secs(120));
        assert_eq!(c.state_query.path, "/v1/idempotency-keys/{key}");
        assert_eq!(c.routes[0].key, KeyRule::Required);
    }

    #[test]
    fn full_file() {
        let c = GatewayConfig::from_json(
            r#"{
              "listen": "127.0.0.1:0",
              "upstream": "http://127.0.0.1:9000/api",
              "redis_url": "redis://127.0.0.1:6379",
              "window_ms": 60000,
              "routes": [
                {"methods": ["POST"], "path": "/v1/orders", "key": "required"},
                {"path": "/v1/search", "key": "none"},
                {"methods": ["PUT"], "path": "/v1/carts/{id}", "key": "optional"}
              ],
              "auth": {"api_keys": {"k1": "tenant-1", "k2": {"tenant": "t2", "principal": "bob"}}},
              "state_query": {"path": "/internal/keys/{key}", "max_retries": 1}
            }"#,
        )
        .unwrap();
        assert_eq!(c.routes.len(), 3);
        assert_eq!(c.auth.api_keys["k1"].tenant().as_str(), "tenant-1");
        assert_eq!(c.auth.api_keys["k1"].principal().as_str(), "tenant-1");
        assert_eq!(c.auth.api_keys["k2"].principal().as_str(), "bob");
        assert_eq!(c.state_query.max_retries, 1);
    }

    #[test]
    fn debug_output_carries_no_secret() {
        let c = GatewayConfig::from_json(
            r#"{"upstreams": ["http://127.0.0.1:9000", "http://u:pw-secret-5@127.0.0.1:9001"],
                "upstream_token": "tok-secret-1",
                "redis_url": "redis://user:pw-secret-2@127.0.0.1:6379",
                "auth": {"api_keys": {"key-secret-3": "tenant-1"},
                         "principal_secret": "secret-of-sixteen-4"}}"#,
        )
        .unwrap();
        let text = format!("{c:?} {:?}", c.auth);
        for secret in [
            "tok-secret-1",
            "pw-secret-2",
            "key-secret-3",
            "secret-of-sixteen-4",
            "pw-secret-5",
        ] {
            assert!(!text.contains(secret), "{secret} in {text}");
        }
        assert!(
            text.contains("tenant-1") && text.contains("127.0.0.1:6379"),
            "{text}"
        );
    }

    #[test]
    fn upstream_may_come_later() {
        let mut c = GatewayConfig::from_json(r#"{"window_ms": 1000}"#).unwrap();
        assert!(c.validate().is_err(), "starting needs an upstream");
        c.upstream = "http://127.0.0.1:1".into();
        c.validate().unwrap();
    }

    #[test]
    fn one_upstream_or_a_list_never_both() {
        let one = GatewayConfig::from_json(r#"{"upstream": "http://127.0.0.1:9000"}"#).unwrap();
        assert_eq!(one.upstream_urls(), ["http://127.0.0.1:9000"]);
        let many = GatewayConfig::from_json(
            r#"{"upstreams": ["http://127.0.0.1:9000", "https://svc-2/api"],
                "upstream_health": {"eject_ms": 1000}}"#,
        )
        .unwrap();
        assert_eq!(
            many.upstream_urls(),
            ["http://127.0.0.1:9000", "https://svc-2/api"]
        );
        assert_eq!(many.upstream_health.consecutive_failures, 3);
        assert_eq!(many.upstream_eject(), Duration::from_secs(1));
        let both =
            GatewayConfig::from_json(r#"{"upstream": "http://a:1", "upstreams": ["http://b:1"]}"#)
                .unwrap_err()
                .to_string();
        assert!(
            both.contains("upstream") && both.contains("upstreams") && both.contains("not both"),
            "{both}"
        );
        let neither = GatewayConfig::default().validate().unwrap_err().to_string();
        assert!(neither.contains("upstream or upstreams"), "{neither}");
        for bad in [
            r#"{"upstreams": ["http://a:1", "ftp://b"]}"#,
            r#"{"upstreams": ["http://a:1", "http://u:pw@a:1"]}"#,
            r#"{"upstreams": ["http://a:1"], "upstream_health": {"consecutive_failures": 0}}"#,
            r#"{"upstreams": ["http://a:1"], "upstream_health": {"eject_ms": 0}}"#,
        ] {
            assert!(GatewayConfig::from_json(bad).is_err(), "{bad}");
        }
        // The command line replaces the file's, one URL or several.
        let mut c = many.clone();
        c.set_upstreams(vec!["http://c:1".into()]);
        assert_eq!((c.upstream.as_str(), c.upstreams.len()), ("http://c:1", 0));
        c.set_upstreams(vec!["http://c:1".into(), "http://d:1".into()]);
        assert!(c.upstream.is_empty());
        c.validate().unwrap();
    }

    #[test]
    fn rejects_bad_files() {
        for bad in [
            r#"{"upstream": "ftp://x"}"#,
            r#"{"upstream": "http://x", "unknown": 1}"#,
            r#"{"upstream": "http://x", "window_ms": 0}"#,
            r#"{"upstream": "http://x", "upstream_idle_timeout_ms": 0}"#,
            r#"{"upstream": "http://x", "routes": [{"path": "no-slash"}]}"#,
            r#"{"upstream": "http://x", "routes": [{"path": "/a", "methods": ["P O"]}]}"#,
            r#"{"upstream": "http://x", "auth": {"api_keys": {"k": ""}}}"#,
            r#"{"upstream": "http://x", "state_query": {"path": "/no-key"}}"#,
            r#"{"upstream": "http://x", "redis_prefix": "a{b}"}"#,
            r#"{"upstream": "http://x", "auth": {"api_keys": {"k": "t1", "k": "t2"}}}"#,
            r#"{"upstream": "http://x", "auth": {"principal_secret": "short"}}"#,
            r#"{"upstream": "http://x", "trusted_proxies": ["10.0.0.0/33"]}"#,
            r#"{"upstream": "http://x", "auth": {"credential_headers": ["a b"]}}"#,
            r#"{"upstream": "http://x", "auth": {"api_keys": {"k": "t1"}, "anonymous_tenant": "t1"}}"#,
            r#"{"upstream": "http://x", "auth": {"api_keys": {"k": {"tenant": "t1", "principal": "anonymous"}}}}"#,
            r#"{"upstream": "http://x", "tenant_header": "x-who", "principal_header": "X-Who"}"#,
            r#"{"upstream": "http://x", "tenant_header": "x-request-id"}"#,
            r#"{"upstream": "http://x", "principal_header": "transfer-encoding"}"#,
            r#"{"upstream": "http://x", "principal_header": "x-forwarded-user"}"#,
        ] {
            assert!(GatewayConfig::from_json(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_environment_sets_what_the_file_leaves_open() {
        let file = GatewayConfig::from_toml(
            "upstream = \"http://127.0.0.1:9000\"\nwindow_ms = 5000\nmax_wait_ms = 7000\n",
        )
        .unwrap();
        let vars = [
            ("IDEM_WINDOW_MS", "60000"),
            ("IDEM_REDIS_URL", "redis://127.0.0.1:6379"),
            ("IDEM_TRUSTED_PROXIES", r#"["10.0.0.0/8"]"#),
            ("IDEM_REQUIRE_SERVICES", "1"),
            ("OTHER_WINDOW_MS", "1"),
        ]
        .map(|(k, v)| (k.to_string(), v.to_string()));
        let c = file.with_env(vars).unwrap();
        assert_eq!(c.window_ms, 60_000);
        assert_eq!(c.max_wait_ms, 7_000, "the file's, no variable set");
        assert_eq!(c.redis_url.as_deref(), Some("redis://127.0.0.1:6379"));
        assert_eq!(c.trusted_proxies, ["10.0.0.0/8"]);
        let bad = GatewayConfig::default()
            .with_env([("IDEM_WINDOW_MS".to_string(), "soon".to_string())])
            .unwrap_err()
            .to_string();
        assert!(bad.contains("IDEM_WINDOW_MS"), "{bad}");
        let invalid = GatewayConfig::default()
            .with_env([("IDEM_WINDOW_MS".to_string(), "0".to_string())])
            .unwrap_err();
        assert!(invalid.to_string().contains("window_ms"), "{invalid}");
    }
}
