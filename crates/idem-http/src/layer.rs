//! The tower plumbing: [`IdempotencyLayer`], the [`IdempotencyService`] it wraps around
//! any `http` service (an axum router or route, a hyper service, a tower stack), and the
//! service's pin-projected [`ResponseFuture`].
//!
//! Owns construction of the state every request shares ([`crate::shared`]) and the
//! first question — does this request need a claim at all (the pipeline's key rule). It
//! must not decide anything else about a request: that is [`crate::keyed`].

use std::fmt;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Request, Response};
use idem_core::{ArchiveLookup, ArrivalSink, IdempotencyStore};
use tower::{Layer, Service};
use tracing::Instrument;

use crate::auth::Authenticate;
use crate::body::{boxed, Body, BoxError};
use crate::config::IdempotencyConfig;
use crate::metrics::IdempotencyMetrics;
use crate::pipeline::LocalWakeups;
use crate::pipeline::{Detached, OwnerIds};
use crate::problem::{inner_failed, Problem, ProblemKind, ProblemResponse};
use crate::replay::Capture;
use crate::retention::ReconstructResponse;
use crate::shared::Shared;

/// Makes every configured route of an HTTP service idempotent. See the crate docs.
#[derive(Clone)]
pub struct IdempotencyLayer {
    shared: Arc<Shared>,
}

impl IdempotencyLayer {
    /// The layer with the default configuration (POST and PATCH need a key, 409 on
    /// in-progress duplicates, fail closed).
    pub fn new(store: impl IdempotencyStore, auth: impl Authenticate) -> Self {
        Self::from_arcs(Arc::new(store), Arc::new(auth))
    }

    /// As [`new`](Self::new), for a store and authentication already shared elsewhere.
    pub fn from_arcs(store: Arc<dyn IdempotencyStore>, auth: Arc<dyn Authenticate>) -> Self {
        let config = IdempotencyConfig::default();
        Self {
            shared: Arc::new(Shared {
                store,
                auth,
                capture: capture_of(&config),
                config,
                metrics: IdempotencyMetrics::default(),
                wakeups: LocalWakeups::default(),
                owners: Arc::new(
                    OwnerIds::new(format!("http-{}#", uuid::Uuid::now_v7().simple()))
                        .expect("a uuid prefix is short visible ASCII"),
                ),
                reconstruct: None,
                archive: None,
                executions: Arc::default(),
                arrivals: None,
            }),
        }
    }

    pub fn with_config(self, config: IdempotencyConfig) -> Self {
        self.edit(|s| {
            s.capture = capture_of(&config);
            s.config = config;
        })
    }

    /// Counts into `metrics` (register it in the app's registry once).
    pub fn with_metrics(self, metrics: IdempotencyMetrics) -> Self {
        self.edit(|s| s.metrics = metrics)
    }

    /// Rebuilds replays whose stored response the retention sweeper dropped, from the
    /// result reference (see [`crate::retention`]).
    pub fn with_reconstruction(self, reconstruct: impl ReconstructResponse) -> Self {
        let reconstruct: Arc<dyn ReconstructResponse> = Arc::new(reconstruct);
        self.edit(|s| s.reconstruct = Some(reconstruct))
    }

    /// Checks fresh claims against the archive: a key whose record was archived answers
    /// `410 idempotency-key-expired` and is not executed (see [`crate::retention`]).
    pub fn with_archive(self, archive: Arc<dyn ArchiveLookup>) -> Self {
        self.edit(|s| s.archive = Some(archive))
    }

    /// Hands every arrival with a key (authenticated, key well-formed) to `sink`, with
    /// the layer's decision and the answer's status, after answering it. The sink must
    /// not block: it is called on the request path.
    pub fn with_arrivals(self, sink: Arc<dyn ArrivalSink>) -> Self {
        self.edit(|s| s.arrivals = Some(sink))
    }

    pub fn config(&self) -> &IdempotencyConfig {
        &self.shared.config
    }

    pub fn metrics(&self) -> &IdempotencyMetrics {
        &self.shared.metrics
    }

    /// Handlers running under a claim right now.
    pub fn executions_running(&self) -> usize {
        self.shared.executions.running()
    }

    /// Resolves when no handler runs under a claim (one whose caller hung up still
    /// counts: it runs in a task of its own).
    pub async fn executions_idle(&self) {
        self.shared.executions.idle().await;
    }

    /// For a shutdown whose grace ran out: cuts off every handler still running under a
    /// claim (and any claim that proceeds from now on). Each is cancelled — an open
    /// transaction of its rolls back — and its record finished FAILED_RETRYABLE at once,
    /// so a retry need not wait out the lease. Resolves when every record is written.
    pub async fn cut_off_executions(&self) {
        self.shared.executions.cancel();
        self.shared.executions.idle().await;
    }

    fn edit(self, f: impl FnOnce(&mut Shared)) -> Self {
        let mut shared = Arc::unwrap_or_clone(self.shared);
        f(&mut shared);
        Self {
            shared: Arc::new(shared),
        }
    }
}

fn capture_of(config: &IdempotencyConfig) -> Arc<Capture> {
    Arc::new(Capture {
        replay_headers: config.replay_headers.clone(),
        max_stored_body: config.max_stored_body,
        policy: config.outcome_policy.clone(),
        retention: config.retention,
    })
}

impl fmt::Debug for IdempotencyLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdempotencyLayer")
            .field("store", &self.shared.store.backend())
            .field("config", &self.shared.config)
            .finish_non_exhaustive()
    }
}

impl<S> Layer<S> for IdempotencyLayer {
    type Service = IdempotencyService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        IdempotencyService {
            inner,
            shared: self.shared.clone(),
        }
    }
}

/// The inner service wrapped by [`IdempotencyLayer`].
#[derive(Clone)]
pub struct IdempotencyService<S> {
    inner: S,
    shared: Arc<Shared>,
}

impl<S> fmt::Debug for IdempotencyService<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdempotencyService").finish_non_exhaustive()
    }
}

impl<S, ReqB, ResB> Service<Request<ReqB>> for IdempotencyService<S>
where
    S: Service<Request<ReqB>, Response = Response<ResB>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<BoxError> + Send + 'static,
    ReqB: http_body::Body<Data = Bytes> + From<Bytes> + Send + 'static,
    ReqB::Error: Into<BoxError>,
    ResB: http_body::Body<Data = Bytes> + Send + 'static,
    ResB::Error: Into<BoxError>,
{
    type Response = Response<Body>;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqB>) -> Self::Future {
        let path = crate::keyed::target(&request).path();
        let rules = self.shared.config.resolve(request.method(), path);
        if !crate::pipeline::request::needs_key(rules.key, request.headers()) {
            return ResponseFuture {
                kind: Kind::Pass {
                    future: self.inner.call(request),
                },
            };
        }
        // The ready service goes into the task; a fresh clone stays for the next call.
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        let shared = self.shared.clone();
        // One span per keyed request: who, which key, what the layer decided and how
        // long the store took (filled in as they become known).
        let span = tracing::info_span!(
            parent: tracing::Span::current(),
            "idempotency",
            tenant = tracing::field::Empty,
            key = tracing::field::Empty,
            decision = tracing::field::Empty,
            store_ms = tracing::field::Empty,
        );
        // Below its level the span is disabled, and a task instrumented with it would
        // lose the caller's span (its request id) too.
        let span = if span.is_disabled() {
            tracing::Span::current()
        } else {
            span
        };
        // Run in place by the response future, boxed so that moving it moves a pointer
        // (the state machine is over 10 KB); a client that hangs up detaches it into a
        // task of its own (see `ResponseFuture`).
        let work =
            Detached::new(crate::keyed::serve(shared, inner, request, rules).instrument(span));
        ResponseFuture {
            kind: Kind::Keyed { work },
        }
    }
}

pin_project_lite::pin_project! {
    /// Response future of [`IdempotencyService`]: the inner service's own future for
    /// requests without a claim; for a keyed request, its work, run in place. Dropping
    /// it (the client went away) does not stop a keyed request: the rest of its work
    /// is detached into a task of its own and runs to the end, so a claim is never left
    /// half-written and a record never PROCESSING for its whole lease.
    ///
    /// It never resolves to an error: failures of the inner service become problem
    /// responses.
    pub struct ResponseFuture<F> {
        #[pin]
        kind: Kind<F>,
    }
}

pin_project_lite::pin_project! {
    #[project = KindProj]
    enum Kind<F> {
        Pass { #[pin] future: F },
        // A keyed request's work, everything from authentication to the answer.
        Keyed { #[pin] work: Detached<Response<Body>> },
    }
}

impl<F, B, E> Future for ResponseFuture<F>
where
    F: Future<Output = Result<Response<B>, E>>,
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
    E: Into<BoxError>,
{
    type Output = Result<Response<Body>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().kind.project() {
            KindProj::Pass { future } => match std::task::ready!(future.poll(cx)) {
                Ok(response) => Poll::Ready(Ok(response.map(boxed))),
                Err(e) => Poll::Ready(Ok(inner_failed(e.into()))),
            },
            KindProj::Keyed { mut work } => {
                // The handler's own panics are caught where it runs; this catches the
                // layer's, so one request's failure stays that request's.
                let polled = std::panic::catch_unwind(AssertUnwindSafe(|| work.as_mut().poll(cx)));
                match polled {
                    Ok(Poll::Pending) => Poll::Pending,
                    Ok(Poll::Ready(response)) => Poll::Ready(Ok(response)),
                    Err(_) => {
                        tracing::error!("the keyed request's work panicked");
                        Poll::Ready(Ok(Problem::new(
                            ProblemKind::ExecutionFailed,
                            "the request failed",
                        )
                        .response()))
                    }
                }
            }
        }
    }
}

impl<F> fmt::Debug for ResponseFuture<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}
