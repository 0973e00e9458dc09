//! What the pipeline decided for one keyed request: the one word the layer's metrics
//! (`decision` label), its request span and the arrival timeline use, and the gateway's
//! span too.
//!
//! Owns the words and what each is as an arrival's ([`ArrivalDecision`], the stored
//! coarse form). It must not count or record anything.

use idem_core::ArrivalDecision;

macro_rules! decisions {
    ($($(#[$vm:meta])* $variant:ident => $text:literal,)*) => {
        /// What the pipeline did with a request.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum Decision {
            $($(#[$vm])* $variant,)*
        }

        impl Decision {
            pub const ALL: &'static [Decision] = &[$(Decision::$variant,)*];

            /// The label and span value.
            pub fn as_str(self) -> &'static str {
                match self {
                    $(Decision::$variant => $text,)*
                }
            }
        }
    };
}

decisions! {
    /// Claimed and executed.
    Executed => "executed",
    /// Returned a stored result.
    Replayed => "replayed",
    /// Answered 409 (at once, or after waiting `max_wait`).
    InProgress => "in_progress",
    /// Same key, different request: 422.
    Mismatch => "mismatch",
    MissingKey => "missing_key",
    InvalidKey => "invalid_key",
    Unauthenticated => "unauthenticated",
    TooLarge => "too_large",
    /// The request body could not be read (client went away mid-upload).
    UnreadableBody => "unreadable_body",
    /// The JSON body names a member twice: 400, nothing recorded.
    DuplicateMember => "duplicate_member",
    /// Store unreachable: 503, nothing executed.
    Unavailable => "unavailable",
    /// Store unreachable on a fail-open route: executed without protection.
    Bypassed => "bypassed",
    /// The store answered with an error that is not an outage: 500.
    StoreError => "store_error",
    /// The key was archived: 410, nothing executed.
    KeyExpired => "key_expired",
}

impl Decision {
    /// What an arrival's story says for this decision. A fail-open bypass ran the
    /// work (unprotected), so it executed; decisions without a key never get there.
    pub fn arrival(self) -> ArrivalDecision {
        match self {
            Decision::Executed | Decision::Bypassed => ArrivalDecision::Executed,
            Decision::Replayed => ArrivalDecision::Replayed,
            Decision::InProgress => ArrivalDecision::InProgress,
            Decision::Mismatch => ArrivalDecision::Mismatch,
            _ => ArrivalDecision::Refused,
        }
    }

    /// Names the decision on the current request span (its `decision` field).
    pub fn on_span(self) {
        tracing::Span::current().record("decision", self.as_str());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decisions_as_arrivals() {
        assert_eq!(Decision::KeyExpired.arrival(), ArrivalDecision::Refused);
        assert_eq!(Decision::Bypassed.arrival(), ArrivalDecision::Executed);
        assert_eq!(Decision::Replayed.arrival(), ArrivalDecision::Replayed);
        assert_eq!(Decision::ALL.len(), 14);
    }
}
