//! The client's retry behaviour against a real scripted server on 127.0.0.1:0.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;
use idem_client::{
    AttemptFailure, ClientError, GiveUpReason, IdempotentClient, KeyForm, RetryPolicy,
};

/// What the server answers on its n-th call; the last step repeats.
#[derive(Clone, Copy)]
struct Step {
    status: u16,
    retry_after: Option<&'static str>,
    delay_ms: u64,
    replayed: bool,
    /// A 409 naming what conflicted (not "in progress").
    business: bool,
}

const fn step(status: u16) -> Step {
    Step {
        status,
        retry_after: None,
        delay_ms: 0,
        replayed: false,
        business: false,
    }
}

#[derive(Default)]
struct Script {
    steps: Vec<Step>,
    /// The `Idempotency-Key` of every call, in order.
    keys: Mutex<Vec<String>>,
}

impl Script {
    fn keys(&self) -> Vec<String> {
        self.keys.lock().unwrap().clone()
    }
}

async fn scripted(State(script): State<Arc<Script>>, headers: HeaderMap) -> Response {
    let n = {
        let mut keys = script.keys.lock().unwrap();
        keys.push(
            headers
                .get("idempotency-key")
                .map(|v| v.to_str().unwrap().to_owned())
                .unwrap_or_default(),
        );
        keys.len() - 1
    };
    let s = script.steps[n.min(script.steps.len() - 1)];
    if s.delay_ms > 0 {
        tokio::time::sleep(Duration::from_millis(s.delay_ms)).await;
    }
    let mut out = HeaderMap::new();
    if let Some(after) = s.retry_after {
        out.insert("retry-after", after.parse().unwrap());
    }
    if s.replayed {
        out.insert("idempotent-replayed", "true".parse().unwrap());
    }
    let status = StatusCode::from_u16(s.status).unwrap();
    if status.is_client_error() || status.is_server_error() {
        out.insert("content-type", "application/problem+json".parse().unwrap());
        // A 409 from an idem server means "in progress" unless it names a conflict.
        let type_uri = if s.status == 409 && !s.business {
            idem_core::ProblemKind::RequestInProgress.type_uri()
        } else {
            format!("https://example.test/{}", s.status)
        };
        let body = format!(
            r#"{{"type":"{type_uri}","title":"t","status":{}}}"#,
            s.status
        );
        return (status, out, body).into_response();
    }
    (status, out, format!("answer to call {n}")).into_response()
}

async fn server(steps: Vec<Step>) -> (String, Arc<Script>) {
    let script = Arc::new(Script {
        steps,
        ..Default::default()
    });
    let app = Router::new()
        .route("/v1/pay", post(scripted))
        .with_state(script.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/v1/pay", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (url, script)
}

fn fast() -> RetryPolicy {
    RetryPolicy::default().backoff(Duration::from_millis(5), Duration::from_millis(20))
}

fn client(policy: RetryPolicy) -> IdempotentClient {
    IdempotentClient::new(reqwest::Client::new()).with_policy(policy)
}

#[tokio::test]
async fn retries_with_the_same_key_and_honours_retry_after() {
    let (url, script) = server(vec![
        Step {
            retry_after: Some("1"),
            ..step(503)
        },
        step(409),
        Step {
            replayed: true,
            ..step(201)
        },
    ])
    .await;
    let t0 = Instant::now();
    let intent = client(fast())
        .post(&url)
        .json(&serde_json::json!({"amount": 1}))
        .unwrap();
    let response = intent.send().await.unwrap();
    assert_eq!(response.status, 201);
    assert_eq!(response.attempts, 3);
    assert!(response.replayed);
    assert_eq!(response.text(), "answer to call 2");
    assert!(
        t0.elapsed() >= Duration::from_secs(1),
        "waited for Retry-After: {:?}",
        t0.elapsed()
    );
    let keys = script.keys();
    assert_eq!(keys.len(), 3);
    assert!(keys.iter().all(|k| k == intent.key().as_str()), "{keys:?}");
    // A later manual retry of the same intent sends the same key again.
    intent.send().await.unwrap();
    assert_eq!(script.keys().last().unwrap(), intent.key().as_str());
}

#[tokio::test]
async fn client_errors_are_returned_at_once() {
    for status in [400, 401, 413, 422] {
        let (url, script) = server(vec![step(status), step(201)]).await;
        let err = client(fast())
            .post(&url)
            .send()
            .await
            .expect_err("rejected");
        assert_eq!(err.status(), Some(status));
        let expected = format!("https://example.test/{status}");
        assert_eq!(err.problem_type(), Some(expected.as_str()));
        assert!(matches!(err, ClientError::Rejected { .. }));
        assert_eq!(script.keys().len(), 1, "{status} not retried");
    }
}

#[tokio::test]
async fn other_final_statuses_are_responses() {
    for status in [404, 500] {
        let (url, script) = server(vec![step(status), step(201)]).await;
        let response = client(fast()).post(&url).send().await.unwrap();
        assert_eq!((response.status.as_u16(), response.attempts), (status, 1));
        assert!(!response.replayed);
        assert_eq!(script.keys().len(), 1);
    }
}

#[tokio::test]
async fn a_conflict_that_names_its_cause_or_a_replay_is_the_answer() {
    // Sold out, an illegal transition: retrying the same key cannot change it.
    let (url, script) = server(vec![
        Step {
            business: true,
            ..step(409)
        },
        step(201),
    ])
    .await;
    let response = client(fast()).post(&url).send().await.unwrap();
    assert_eq!((response.status.as_u16(), response.attempts), (409, 1));
    assert_eq!(script.keys().len(), 1);

    // A replayed 409 is the key's stored answer.
    let (url, script) = server(vec![
        Step {
            replayed: true,
            business: true,
            ..step(409)
        },
        step(201),
    ])
    .await;
    let response = client(fast()).post(&url).send().await.unwrap();
    assert_eq!((response.status.as_u16(), response.replayed), (409, true));
    assert_eq!(script.keys().len(), 1);

    // "In progress" is retried with the same key, even marked as a replay.
    let (url, script) = server(vec![
        Step {
            replayed: true,
            business: false,
            ..step(409)
        },
        step(201),
    ])
    .await;
    let response = client(fast()).post(&url).send().await.unwrap();
    assert_eq!((response.status.as_u16(), response.attempts), (201, 2));
    assert_eq!(script.keys().len(), 2);

    let (url, script) = server(vec![step(409), step(201)]).await;
    let response = client(fast()).post(&url).send().await.unwrap();
    assert_eq!((response.status.as_u16(), response.attempts), (201, 2));
    assert_eq!(script.keys().len(), 2);
}

#[tokio::test]
async fn gives_up_after_the_configured_attempts_and_says_why() {
    let (url, script) = server(vec![step(503)]).await;
    let err = client(fast().max_attempts(3))
        .post(&url)
        .send()
        .await
        .unwrap_err();
    match &err {
        ClientError::GaveUp {
            attempts,
            reason,
            last,
            ..
        } => {
            assert_eq!(*attempts, 3);
            assert_eq!(*reason, GiveUpReason::AttemptsExhausted { max_attempts: 3 });
            assert!(matches!(**last, AttemptFailure::Status { status: 503, .. }));
        }
        other => panic!("{other:?}"),
    }
    assert!(err.to_string().contains("all 3 attempts used"), "{err}");
    assert_eq!(script.keys().len(), 3);
}

#[tokio::test]
async fn gives_up_when_the_time_budget_is_spent() {
    let (url, script) = server(vec![step(503)]).await;
    let policy = RetryPolicy::default()
        .max_attempts(1000)
        .time_budget(Duration::from_millis(300))
        .backoff(Duration::from_millis(40), Duration::from_millis(80));
    let t0 = Instant::now();
    let err = client(policy).post(&url).send().await.unwrap_err();
    assert!(
        matches!(
            err,
            ClientError::GaveUp {
                reason: GiveUpReason::TimeBudgetExhausted { .. },
                ..
            }
        ),
        "{err:?}"
    );
    assert!(
        t0.elapsed() < Duration::from_millis(600),
        "{:?}",
        t0.elapsed()
    );
    assert!(script.keys().len() >= 3);
}

#[tokio::test]
async fn gives_up_at_once_when_retry_after_exceeds_the_budget() {
    let (url, script) = server(vec![Step {
        retry_after: Some("30"),
        ..step(503)
    }])
    .await;
    let policy = fast().time_budget(Duration::from_secs(2));
    let t0 = Instant::now();
    let err = client(policy).post(&url).send().await.unwrap_err();
    match err {
        ClientError::GaveUp {
            reason: GiveUpReason::RetryAfterBeyondBudget { retry_after, .. },
            attempts: 1,
            ..
        } => assert_eq!(retry_after, Duration::from_secs(30)),
        other => panic!("{other:?}"),
    }
    assert!(t0.elapsed() < Duration::from_millis(500));
    assert_eq!(script.keys().len(), 1);
}

#[tokio::test]
async fn timeouts_are_retried_with_the_same_key() {
    let (url, script) = server(vec![
        Step {
            delay_ms: 400,
            ..step(201)
        },
        step(201),
    ])
    .await;
    let policy = fast().attempt_timeout(Duration::from_millis(100));
    let response = client(policy).post(&url).send().await.unwrap();
    assert_eq!((response.status.as_u16(), response.attempts), (201, 2));
    let keys = script.keys();
    assert_eq!(keys.len(), 2);
    assert_eq!(keys[0], keys[1]);
}

#[tokio::test]
async fn connection_errors_are_retried() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/v1/pay", listener.local_addr().unwrap());
    drop(listener); // nothing listens there now
    let err = client(fast().max_attempts(3))
        .post(&url)
        .send()
        .await
        .unwrap_err();
    match err {
        ClientError::GaveUp {
            attempts: 3, last, ..
        } => assert!(
            matches!(&*last, AttemptFailure::Connection(text) if !text.is_empty()),
            "{last:?}"
        ),
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn business_keys_and_the_structured_form_are_sent_as_given() {
    let (url, script) = server(vec![step(200)]).await;
    let c = IdempotentClient::new(reqwest::Client::new()).with_key_form(KeyForm::StructuredString);
    let intent = c.post(&url).business_key("pay:order-7318").unwrap();
    intent.send().await.unwrap();
    assert_eq!(script.keys(), vec!["\"pay:order-7318\"".to_owned()]);
    let bad = client(fast()).post("not a url").send().await.unwrap_err();
    assert!(matches!(bad, ClientError::InvalidRequest(_)), "{bad:?}");
}
