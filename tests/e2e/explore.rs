//! The fault explorer catches what it should: it fails a wrapper that makes a new key
//! per attempt, one that retries a 422, one that takes a lost response for success, and
//! passes idemkey's default client and the SDK of `examples/vendor_sdk.rs`. Real HTTP
//! over loopback, every schedule of the default plan.

use std::panic::AssertUnwindSafe;

use http::StatusCode;
use idemkey::client::IdempotentClientBuilder;
use idemkey::testing::{Context, Executions, Explorer, Outcome, Report, ToOutcome};

#[path = "../../examples/common/acme.rs"]
#[allow(
    dead_code,
    unreachable_pub,
    reason = "the example's SDK; the tests call create_charge"
)]
mod acme;

/// The SDK's errors, in the explorer's terms.
impl ToOutcome for acme::PaymentsError {
    fn to_outcome(&self) -> Outcome {
        match self {
            Self::Conflict(_) => Outcome::KeyReused,
            Self::Unknown(_) => Outcome::OutcomeUnknown,
            Self::Other(e) => e.to_outcome(),
        }
    }
}

fn show(report: &Report) {
    eprintln!("{report}");
}

/// The schedules that failed, as strings.
fn failing(report: &Report) -> Vec<String> {
    report
        .failures()
        .map(|r| r.schedule().to_string())
        .collect()
}

fn problems_of(report: &Report, schedule: &str) -> String {
    report
        .row(schedule)
        .unwrap_or_else(|| panic!("{schedule} was explored"))
        .problems()
        .join("; ")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_default_client_passes_every_schedule() {
    let report = Explorer::new()
        .run(|ctx| async move {
            let client = IdempotentClientBuilder::new(reqwest::Client::new())
                .attempt_timeout(ctx.attempt_timeout())
                .build();
            client
                .post(ctx.url("/v1/charges"))
                .header("content-type", "application/json")
                .body(r#"{"amount":100}"#)
                .send()
                .await
                .and_then(|r| r.error_for_status().map_err(Into::into))
        })
        .await;
    show(&report);
    report.assert_ok();
    assert_eq!(report.rows().len(), Explorer::new().plan().len());
    let row = |s: &str| report.row(s).unwrap_or_else(|| panic!("{s} was explored"));
    // A lost answer: retried with the same key, replayed, executed once.
    let lost = row("lose@1");
    assert_eq!((lost.attempts(), lost.keys(), lost.executions()), (2, 1, 1));
    assert_eq!(lost.outcome(), Ok(&Outcome::Success));
    // A late one: abandoned at the attempt timeout, then replayed.
    let late = row("late@1");
    assert_eq!((late.attempts(), late.executions()), (2, 1));
    // A reused key: one attempt, reported as such, nothing executed.
    let reused = row("422@1");
    assert_eq!((reused.attempts(), reused.executions()), (1, 0));
    assert_eq!(reused.outcome(), Ok(&Outcome::KeyReused));
    // Two answers "store unavailable, retry at once": the third attempt executes.
    let unavailable = row("503@1,503@2");
    assert_eq!((unavailable.attempts(), unavailable.executions()), (3, 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_vendor_sdk_example_passes_every_schedule() {
    let report = Explorer::new()
        .run(|ctx| async move {
            let acme = acme::AcmePay::with_timeout(ctx.base_url(), ctx.attempt_timeout());
            let order = acme::NewCharge {
                amount: 4200,
                currency: "eur",
                reference: "order-42",
            };
            let charge = acme.create_charge(&order).await?;
            assert_eq!(charge.value.amount, 4200, "the SDK reads the charge back");
            Ok::<_, acme::PaymentsError>(charge.value.id)
        })
        .await;
    show(&report);
    report.assert_ok();
    let lost = report.row("lose@1,lose@2").expect("explored");
    assert_eq!((lost.attempts(), lost.executions()), (3, 1));
}

/// Sends `body` to `ctx`'s charges with `key`: the status, or `None` when no answer
/// came (the connection closed, the attempt timed out).
async fn post(client: &reqwest::Client, ctx: &Context, key: &str) -> Option<StatusCode> {
    client
        .post(ctx.url("/v1/charges"))
        .header("idempotency-key", key)
        .header("content-type", "application/json")
        .body(r#"{"amount":100}"#)
        .timeout(ctx.attempt_timeout())
        .send()
        .await
        .ok()
        .map(|r| r.status())
}

/// What a hand-written retry loop reports once it stops at `last`.
fn reported(last: Option<StatusCode>) -> Outcome {
    match last {
        Some(s) if s.is_success() => Outcome::Success,
        Some(StatusCode::UNPROCESSABLE_ENTITY) => Outcome::KeyReused,
        Some(s) if s.is_client_error() && !matches!(s.as_u16(), 409 | 423 | 429) => {
            Outcome::Failed(format!("HTTP {}", s.as_u16()))
        }
        _ => Outcome::OutcomeUnknown,
    }
}

/// Whether a hand-written loop retries after `last`: no answer, 5xx, in progress or
/// rate limited.
fn transient(last: Option<StatusCode>) -> bool {
    last.is_none_or(|s| s.is_server_error() || matches!(s.as_u16(), 409 | 423 | 429))
}

/// A hand-written loop of up to 4 attempts with one key: after each, `next(last)` says
/// whether to retry (`Ok(true)`), to stop and report what `last` says (`Ok(false)`), or
/// to report an outcome of its own (`Err`).
async fn one_key_loop(
    ctx: Context,
    next: impl Fn(Option<StatusCode>) -> Result<bool, Outcome>,
) -> Outcome {
    let client = reqwest::Client::new();
    let key = uuid::Uuid::new_v4().to_string();
    let mut last = None;
    for _ in 0..4 {
        last = post(&client, &ctx, &key).await;
        match next(last) {
            Ok(true) => {}
            Ok(false) => break,
            Err(outcome) => return outcome,
        }
    }
    reported(last)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrapper_with_a_new_key_per_attempt_fails() {
    let report = Explorer::new()
        .run(|ctx| async move {
            let client = reqwest::Client::new();
            let mut last = None;
            for _ in 0..4 {
                // The bug: a fresh key for each attempt.
                let key = uuid::Uuid::new_v4().to_string();
                last = post(&client, &ctx, &key).await;
                if !transient(last) {
                    break;
                }
            }
            reported(last)
        })
        .await;
    show(&report);
    assert!(!report.is_ok());
    assert!(
        report.row("none").is_some_and(|r| r.is_ok()),
        "its happy path passes"
    );
    for schedule in ["lose@1", "late@1", "503@1", "reset@1"] {
        let problems = problems_of(&report, schedule);
        assert!(
            problems.contains("2 different keys"),
            "{schedule}: {problems}"
        );
    }
    for schedule in ["lose@1", "late@1", "lose@1,lose@2"] {
        let problems = problems_of(&report, schedule);
        assert!(
            problems.contains("executed 2 times") || problems.contains("executed 3 times"),
            "{schedule}: {problems}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrapper_that_retries_a_422_fails() {
    let report = Explorer::new()
        // The bug: a 422 is retried like a 503.
        .run(|ctx| {
            one_key_loop(ctx, |last| {
                Ok(transient(last) || last == Some(StatusCode::UNPROCESSABLE_ENTITY))
            })
        })
        .await;
    show(&report);
    // Right in every other schedule: the explorer pins the one it breaks.
    assert_eq!(failing(&report), ["422@1"]);
    let problems = problems_of(&report, "422@1");
    assert!(
        problems.contains("attempt 2 after the 422 key-reused answer to attempt 1"),
        "{problems}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrapper_that_takes_a_lost_response_for_success_fails() {
    let report = Explorer::new()
        // The bug: no answer at all is taken for "done".
        .run(|ctx| {
            one_key_loop(ctx, |last| match last {
                None => Err(Outcome::Success),
                answered => Ok(transient(answered)),
            })
        })
        .await;
    show(&report);
    let lost = problems_of(&report, "lose@1");
    assert!(lost.contains("no success answer reached it"), "{lost}");
    let reset = problems_of(&report, "reset@1");
    assert!(
        reset.contains("reports success, but the operation executed 0 time(s)"),
        "{reset}"
    );
    let late = problems_of(&report, "late@1");
    assert!(late.contains("no success answer reached it"), "{late}");
    assert!(
        report.row("500@1").is_some_and(|r| r.is_ok()),
        "answers it handles right"
    );
}

/// A failing run is printed with the line that replays it, and the replay alone fails
/// the same way; the explorer serves the test's own app too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_schedule_replays_alone_against_the_tests_own_app() {
    let app = |executions: Executions| {
        axum::Router::new().route(
            "/v1/charges",
            axum::routing::post(move || async move {
                format!(r#"{{"id":"ch_{}"}}"#, executions.record())
            }),
        )
    };
    // Retries with a new key, and only after a lost answer.
    let code = |ctx: Context| async move {
        let client = reqwest::Client::new();
        let first = post(&client, &ctx, "k-1").await;
        let last = match first {
            None => post(&client, &ctx, "k-2").await,
            answered => answered,
        };
        reported(last)
    };
    let full = Explorer::new().random(0).app(app).run(code).await;
    let panic = std::panic::catch_unwind(AssertUnwindSafe(|| full.assert_ok()))
        .expect_err("assert_ok panics on a failing exploration");
    let text = panic.downcast_ref::<String>().cloned().unwrap_or_default();
    assert!(
        text.contains("replay one alone: Explorer::replay(\"lose@1\")"),
        "{text}"
    );
    assert!(text.contains("executed 2 times"), "{text}");

    let replay = Explorer::replay("lose@1")
        .expect("it parses")
        .app(app)
        .run(code)
        .await;
    assert_eq!(replay.rows().len(), 1);
    let row = &replay.rows()[0];
    assert_eq!((row.attempts(), row.keys(), row.executions()), (2, 2, 2));
    assert_eq!(
        row.problems(),
        full.row("lose@1").expect("explored").problems()
    );
}
