//! Skipping tests whose server is absent — unless the environment demands the servers.

/// True when `IDEM_REQUIRE_SERVICES=1`: a missing server is then a failure.
pub fn require_services() -> bool {
    std::env::var("IDEM_REQUIRE_SERVICES").is_ok_and(|v| v == "1")
}

/// Reports a missing server: panics when services are required, otherwise prints a
/// visible skip line and returns, so the caller can return early.
pub fn skip_or_fail(service: &str, error: &dyn std::fmt::Display) {
    if require_services() {
        panic!("{service} is required (IDEM_REQUIRE_SERVICES=1) but unreachable: {error}");
    }
    eprintln!(
        "SKIPPED: {service} unreachable ({error}); set IDEM_REQUIRE_SERVICES=1 to fail instead"
    );
}
