//! Hands every keyed arrival to the application's [`ArrivalSink`], with the decision the
//! layer made for it.
//!
//! The decision is noted where it is counted ([`crate::metrics`]; what each decision is
//! as an arrival's is [`crate::decision`]'s), into a slot carried by the request's
//! task; the arrival is handed over once the answer is ready. Without a sink nothing is carried. This module must not
//! wait on the sink: recording is the sink's, off the request path.

use std::future::Future;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use http::Response;
use idem_core::{Arrival, ArrivalDecision, ArrivalSink, Principal, Scope};

use crate::body::Body;

tokio::task_local! {
    static DECIDED: Option<Arc<Slot>>;
}

/// The last decision noted for one request (0: none yet).
#[derive(Default)]
struct Slot(AtomicU8);

fn code(decision: ArrivalDecision) -> u8 {
    match decision {
        ArrivalDecision::Executed => 1,
        ArrivalDecision::Replayed => 2,
        ArrivalDecision::InProgress => 3,
        ArrivalDecision::Mismatch => 4,
        ArrivalDecision::Refused => 5,
    }
}

fn decoded(code: u8) -> Option<ArrivalDecision> {
    ArrivalDecision::ALL
        .into_iter()
        .find(|d| self::code(*d) == code)
}

/// Notes `decision` for the current request, when its arrival is observed.
pub(crate) fn note(decision: ArrivalDecision) {
    let _ = DECIDED.try_with(|slot| {
        if let Some(slot) = slot {
            slot.0.store(code(decision), Ordering::Relaxed);
        }
    });
}

/// Runs `answer` for one arrival of `scope` and hands the arrival to `sink`.
pub(crate) async fn observe<F>(
    sink: &Arc<dyn ArrivalSink>,
    scope: Scope,
    principal: Principal,
    answer: F,
) -> Response<Body>
where
    F: Future<Output = Response<Body>>,
{
    let at = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
    let started = Instant::now();
    let slot = Arc::new(Slot::default());
    let response = DECIDED.scope(Some(slot.clone()), answer).await;
    // A path that counted nothing answered with the layer's own problem.
    let decision = decoded(slot.0.load(Ordering::Relaxed)).unwrap_or(ArrivalDecision::Refused);
    sink.record(Arrival {
        scope,
        principal,
        decision,
        status: response.status().as_u16(),
        at,
        elapsed_ms: u32::try_from(started.elapsed().as_millis()).unwrap_or(u32::MAX),
    });
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_round_trip() {
        for d in ArrivalDecision::ALL {
            assert_eq!(decoded(code(d)), Some(d));
        }
        assert_eq!(decoded(0), None);
    }
}
