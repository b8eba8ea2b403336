//! Per vendor, the two halves against each other: idemkey's client with the vendor's
//! profile, the verifier in the vendor's dialect (`VendorFake`), real HTTP on
//! 127.0.0.1 through the fault proxy. One table over every dialect.

use crate::support;

use std::sync::Arc;
use std::time::Duration;

use idemkey::IdempotencyKey;
use idemkey::client::{RequestBuilderExt, ResponseExt, VendorProfile};
use idemkey::protocol::Dialect;
use idemkey::testing::{Executions, Fault, FaultProxy, VendorFake};
use reqwest_middleware::ClientWithMiddleware;
use support::client::{builder, ours};
use tokio::sync::Semaphore;

/// The vendor's profile, retrying up to `retries` times, waits capped at a millisecond.
fn client(dialect: &Dialect, retries: u32) -> ClientWithMiddleware {
    builder(retries)
        .profile(VendorProfile::from_dialect(dialect))
        .retry_after_cap(Duration::from_millis(1))
        .without_retry_budget()
        .build()
}

fn body(amount: u32) -> serde_json::Value {
    serde_json::json!({"amount": amount, "currency": "EUR"})
}

/// Every logical call executes once although the first answer to each is lost; a
/// replay is recognised where the vendor marks replays; GoCardless answers the repeat
/// with its conflict, naming the object made.
#[tokio::test]
async fn every_call_executes_once_although_answers_are_lost() {
    for dialect in Dialect::all() {
        let id = dialect.id();
        let fake = VendorFake::start(dialect.clone()).await.expect("fake");
        let proxy = FaultProxy::start(
            fake.addr(),
            Fault::cycle(vec![Fault::LoseResponse, Fault::None]),
        )
        .await
        .expect("proxy");
        let client = client(&dialect, 3);
        for n in 1..=3u32 {
            let sent = client
                .post(proxy.url("/v1/payments"))
                .json(&body(n))
                .send()
                .await;
            if dialect.refuses_replays() {
                let err = ours(sent.expect_err("GoCardless refuses the repeat"));
                assert!(err.is_already_executed(), "{id}: {err}");
                assert_eq!(err.attempts(), 2, "{id}");
                let text = err
                    .into_response()
                    .expect("kept")
                    .text()
                    .await
                    .expect("body");
                assert!(
                    text.contains(&format!(r#""conflicting_resource_id":"obj_{n}""#)),
                    "{id}: {text}"
                );
            } else {
                let resp = sent.unwrap_or_else(|e| panic!("{id}: {e}"));
                let info = resp.idempotency().expect("keyed").clone();
                assert_eq!(info.attempts(), 2, "{id}");
                assert_eq!(info.replayed(), dialect.replay_header().is_some(), "{id}");
                let doc: serde_json::Value = resp.json().await.expect("JSON");
                assert_eq!(
                    doc["id"],
                    format!("obj_{n}"),
                    "{id}: the first execution's answer"
                );
            }
        }
        assert_eq!(fake.executions().count(), 3, "{id}: once per logical call");
        assert_eq!(proxy.stats().lost_responses, 3, "{id}");
    }
}

/// A key reused with another body surfaces as key-reused (Orb's 409 cannot be told
/// from its in-progress answer: it is retried until `in_progress`), and nothing runs
/// twice.
#[tokio::test]
async fn a_reused_key_with_another_body_is_key_reused() {
    for dialect in Dialect::all() {
        let id = dialect.id();
        let fake = VendorFake::start(dialect.clone()).await.expect("fake");
        let client = client(&dialect, 2);
        let key = IdempotencyKey::new(format!("reused-{id}")).expect("valid");
        let send = |amount| {
            client
                .post(fake.url("/v1/payments"))
                .idempotency_key(key.clone())
                .json(&body(amount))
                .send()
        };
        send(1).await.unwrap_or_else(|e| panic!("{id}: {e}"));
        let err = ours(send(2).await.expect_err("another body"));
        if dialect
            .recognition(idemkey::protocol::dialect::Refusal::KeyReused)
            .is_some()
        {
            assert!(err.is_key_reused(), "{id}: {err}");
            assert_eq!(err.attempts(), 1, "{id}: never retried");
        } else {
            assert!(err.is_in_progress(), "{id}: {err}");
            assert_eq!(err.attempts(), 3, "{id}: retried as in progress");
        }
        assert_eq!(fake.executions().count(), 1, "{id}");
    }
}

/// A duplicate sent while the first call runs gets the vendor's in-progress answer and
/// is retried with the same key, following the vendor's hint, until the first call's
/// outcome is there.
#[tokio::test]
async fn an_in_progress_answer_is_retried_with_the_same_key() {
    for dialect in Dialect::all() {
        let id = dialect.id();
        let gate = Arc::new(Semaphore::new(0));
        let runs = Executions::default();
        let handler = {
            let (gate, runs) = (gate.clone(), runs.clone());
            move || async move {
                runs.record();
                let _permit = gate.acquire().await.expect("open");
                (http::StatusCode::CREATED, r#"{"id":"obj_1"}"#)
            }
        };
        let app = axum::Router::new().route("/v1/payments", axum::routing::post(handler));
        let fake = VendorFake::with_app(dialect.clone(), app)
            .await
            .expect("fake");
        let proxy = FaultProxy::start(fake.addr(), |_| Fault::None)
            .await
            .expect("proxy");
        let client = client(&dialect, 10_000);
        let key = IdempotencyKey::new(format!("running-{id}")).expect("valid");
        let call = |client: ClientWithMiddleware, key: IdempotencyKey, url: String| async move {
            client
                .post(url)
                .idempotency_key(key)
                .json(&body(7))
                .send()
                .await
        };
        let first = tokio::spawn(call(client.clone(), key.clone(), proxy.url("/v1/payments")));
        while runs.count() == 0 {
            tokio::task::yield_now().await;
        }
        // Another client: one client would hold the duplicate back (single flight).
        let other = self::client(&dialect, 10_000);
        let second = tokio::spawn(call(other, key.clone(), proxy.url("/v1/payments")));
        // Its second attempt proves its first got the in-progress answer.
        while proxy.stats().attempts < 3 {
            tokio::task::yield_now().await;
        }
        gate.add_permits(1);
        first
            .await
            .expect("joined")
            .unwrap_or_else(|e| panic!("{id}: {e}"));
        match second.await.expect("joined") {
            Ok(resp) => {
                let info = resp.idempotency().expect("keyed");
                assert!(info.attempts() >= 2, "{id}");
                assert_eq!(info.key(), &key, "{id}: one key across attempts");
                assert_eq!(resp.status(), 201, "{id}: the first call's answer");
            }
            Err(e) => {
                let err = ours(e);
                assert!(
                    dialect.refuses_replays() && err.is_already_executed(),
                    "{id}: {err}"
                );
                assert!(err.attempts() >= 2, "{id}");
            }
        }
        assert_eq!(runs.count(), 1, "{id}: the duplicate never ran");
    }
}
