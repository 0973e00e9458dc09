//! The one request pipeline of the layer and the gateway, framework-neutral:
//!
//! ```text
//! route wants a key? ─▶ key ─▶ declared size ─▶ bounded body ─▶ fingerprint   (request)
//!   ─▶ [coalesce in-process duplicates]                                       (flights)
//!   ─▶ claim, waiting or answering "in progress" by policy                   (claim)
//!        ├ replay / mismatch / in progress ─▶ the answer                       (answer)
//!        └ proceed ─▶ run under the lease, cut off at shutdown               (run, executions)
//!                     ─▶ finish or withdraw the record ─▶ wake waiters ─▶ answer (finish, wakeups)
//! ```
//!
//! The layer and the gateway are this pipeline plus their own pieces: how the caller is
//! identified, how the body is buffered, and how the work runs ([`Execution`]: the
//! layer calls its inner service, the gateway forwards upstream), then how an
//! [`Answer`] is rendered. It must not know HTTP framing beyond headers, routes or
//! authentication.

pub mod answer;
pub mod claim;
pub mod detach;
pub mod executions;
pub mod finish;
pub mod flights;
pub mod request;
pub mod run;
pub mod wakeups;

pub use answer::{Answer, Answered, Executed};
pub use claim::{claim, lease_left, Claimed};
pub use detach::Detached;
pub use executions::{under_lease, until_cut_off, Executions, Ran, Running};
pub use finish::{ending, finish, retryable, FinishPolicy, FinishedBy, NotFinished, TooLarge};
pub use flights::{Done, Flights, Follower, Joined, Lead};
pub use request::{OwnerIds, Refusal};
pub use run::{Ending, Execution, Lease, Pipeline, Settled};
pub use wakeups::{LocalWakeups, Waiter, Wakeups};
