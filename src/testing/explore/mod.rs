//! The fault explorer ([`Explorer`]).

mod outcome;
mod report;
mod schedule;
mod stage;

use std::any::Any;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::{FutureExt, StreamExt};

pub use outcome::{Outcome, ToOutcome};
pub use report::{Report, Row};
pub use schedule::{AttemptFault, Phase, Schedule, ScheduleError};

use stage::{AppFactory, Stage};

use super::Executions;

/// The fault explorer: runs your own code (an SDK's `create_charge`, say) once per fault
/// schedule, systematically, against a verified server on 127.0.0.1, and judges each
/// run.
///
/// # What it explores
///
/// Each run of your code is one logical operation, and every request it sends with an
/// unsafe method (POST, PUT, PATCH, DELETE) is one of its attempts, numbered from 1 in
/// the order they arrive, whatever key they carry. A [`Schedule`] says which attempt
/// meets which [`AttemptFault`]:
///
/// | token | the attempt |
/// |---|---|
/// | `lose` | executes; its answer is lost (the connection closes without it) |
/// | `reset` | the connection closes as the request arrives; nothing executes |
/// | `late` | executes; its answer is held until your code gives up on the attempt |
/// | `500` | `500`, nothing executes |
/// | `409`, `423` | "in progress" (the verifier's `409 in-progress`, or `423`), `Retry-After: 0` |
/// | `429` | `429 Too Many Requests`, `Retry-After: 0` |
/// | `503` | the verifier's `503 store-unavailable`, `Retry-After: 0` |
/// | `422` | the verifier's `422 key-reused`: the key was used before for another request |
///
/// The plan ([`Explorer::plan`]), each schedule once: the run without faults; every
/// fault at every attempt from 1 to [`Explorer::attempts`] (4 by default), and `422@1`;
/// every pair of faults at two of the first three attempts; then [`Explorer::random`]
/// schedules (32 by default) drawn from [`Explorer::seed`], each of a random length up
/// to [`Explorer::attempts`] with a random fault at every attempt. An attempt the code
/// must pass to reach a scheduled fault meets `reset` (nothing executes, and any
/// retrying code retries it): the single fault at attempt 4 is `reset@1-3,lose@4`.
/// About 230 runs.
///
/// # What it checks
///
/// For each run, from what the server saw and what your code reported (an [`Outcome`],
/// through [`ToOutcome`]):
///
/// - the operation executed at most once, and exactly once when the code reports
///   success;
/// - every attempt carried a key, and all the same one;
/// - no attempt followed a `422 key-reused`, and the verifier never answered one (a
///   retry that changed the request);
/// - the reported outcome says what happened: success only when a success answer
///   reached the code; key reused only when the server said so; "never sent" or
///   "failed" only when nothing executed (a caller told "failed" may retry under a new
///   key); and whatever the last answer the code received said (a success, or key
///   reused), the code says too. "Outcome unknown" is otherwise always acceptable.
///
/// [`Explorer::run`] returns a [`Report`]: a table with one row per schedule (schedule,
/// attempts, keys, executions, result, verdict), printed by `Display`;
/// [`Report::assert_ok`] panics with the failing rows and the line that replays one
/// alone ([`Explorer::replay`]).
///
/// # The server
///
/// Each run gets its own server on its own port of 127.0.0.1: the fault stage, then
/// idemkey's verifier (the standard dialect, in-memory store), then the app: a built-in
/// one that creates an object from each request's JSON body (`200` with the body and an
/// `id` added, `GET .../{id}` reads it back) and counts executions, or your own
/// ([`Explorer::app`]). Requests with safe methods (GET, HEAD) pass the stage untouched
/// and are not attempts.
///
/// # Time
///
/// Runs are real HTTP over loopback, so the explorer keeps every wait short by
/// construction rather than by a paused clock (under `tokio::time::pause` the runtime
/// advances its clock whenever it is idle, including while it waits on a socket, so
/// attempt timeouts would fire at once):
///
/// - every answer that asks for a wait asks for none (`Retry-After: 0`);
/// - a `late` answer is held until the code closes the connection: build the code
///   under test with a short attempt timeout, [`Context::attempt_timeout`] (1 s by
///   default); a code that waits longer gets the answer after four of them;
/// - runs go concurrently ([`Explorer::concurrency`], 32 by default), each on its own
///   server.
///
/// Over idemkey's default client (backoff from 100 ms) the whole plan takes a few
/// seconds. Do not run it under a paused clock. A run that does not finish within
/// [`Explorer::run_limit`] (60 s) fails, so a code that hangs fails rather than hangs.
///
/// # Examples
///
/// ```
/// use idemkey::client::IdempotentClientBuilder;
/// use idemkey::testing::Explorer;
/// # #[tokio::main] async fn main() {
/// let report = Explorer::new()
///     .random(8)
///     .run(|ctx| async move {
///         let client = IdempotentClientBuilder::new(reqwest::Client::new())
///             .attempt_timeout(ctx.attempt_timeout())
///             .build();
///         client
///             .post(ctx.url("/v1/charges"))
///             .header("content-type", "application/json")
///             .body(r#"{"amount":100}"#)
///             .send()
///             .await
///             .and_then(|r| r.error_for_status().map_err(Into::into))
///     })
///     .await;
/// report.assert_ok();
/// assert_eq!(report.row("lose@1").map(|r| r.executions()), Some(1));
/// # }
/// ```
///
/// The default plan:
///
/// ```
/// use idemkey::testing::Explorer;
/// let explorer = Explorer::new();
/// assert_eq!(explorer.plan().len(), 1 + (4 * 8 + 1) + 3 * (64 - 8) + 32);
/// ```
#[derive(Clone)]
pub struct Explorer {
    attempts: u32,
    random: u32,
    seed: u64,
    concurrency: usize,
    attempt_timeout: Duration,
    run_limit: Duration,
    app: Option<AppFactory>,
    only: Option<Vec<Schedule>>,
}

impl std::fmt::Debug for Explorer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Explorer")
            .field("attempts", &self.attempts)
            .field("random", &self.random)
            .field("seed", &self.seed)
            .field("concurrency", &self.concurrency)
            .field("attempt_timeout", &self.attempt_timeout)
            .field("run_limit", &self.run_limit)
            .field("app", &self.app.as_ref().map_or("built-in", |_| "custom"))
            .field("only", &self.only)
            .finish()
    }
}

impl Default for Explorer {
    fn default() -> Self {
        Self {
            attempts: 4,
            random: 32,
            seed: Self::DEFAULT_SEED,
            concurrency: 32,
            attempt_timeout: Duration::from_secs(1),
            run_limit: Duration::from_secs(60),
            app: None,
            only: None,
        }
    }
}

/// The attempts the pair phase spreads its two faults over: the first three.
const PAIR_ATTEMPTS: u32 = 3;

impl Explorer {
    /// The seed of the random phase unless [`Explorer::seed`] sets another.
    pub const DEFAULT_SEED: u64 = 28;

    /// The full plan, the built-in app, the defaults above each setting.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// An explorer that runs `schedule` alone (as the report prints it,
    /// `"lose@1,reset@2"`), to replay a failing run; chain the settings the failing
    /// exploration had ([`Explorer::app`], [`Explorer::attempt_timeout`]).
    ///
    /// ```
    /// use idemkey::testing::Explorer;
    /// let replay = Explorer::replay("lose@1,503@2")?;
    /// assert_eq!(replay.plan().len(), 1);
    /// assert!(Explorer::replay("lose@one").is_err());
    /// # Ok::<(), idemkey::testing::ScheduleError>(())
    /// ```
    ///
    /// # Errors
    /// `schedule` does not parse; the error says which part and why.
    pub fn replay(schedule: &str) -> Result<Self, ScheduleError> {
        Ok(Self {
            only: Some(vec![schedule.parse()?]),
            ..Self::default()
        })
    }

    /// The single phase puts each fault at each attempt from 1 to `attempts` (4 by
    /// default: idemkey's client makes up to 4), and a random schedule has that many
    /// attempts. At least 1.
    #[must_use]
    pub fn attempts(mut self, attempts: u32) -> Self {
        self.attempts = attempts.max(1);
        self
    }

    /// How many random schedules follow the systematic ones (32 by default; 0 for none).
    #[must_use]
    pub fn random(mut self, schedules: u32) -> Self {
        self.random = schedules;
        self
    }

    /// The seed the random schedules are drawn from ([`Explorer::DEFAULT_SEED`] by
    /// default): the same seed, the same schedules, on every machine.
    #[must_use]
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self
    }

    /// How many runs go at once (32 by default; at least 1).
    #[must_use]
    pub fn concurrency(mut self, runs: usize) -> Self {
        self.concurrency = runs.max(1);
        self
    }

    /// The attempt timeout the code under test should use, handed to it as
    /// [`Context::attempt_timeout`] (1 s by default). A `late` answer is held until the
    /// code gives up, for at most four of these.
    #[must_use]
    pub fn attempt_timeout(mut self, timeout: Duration) -> Self {
        self.attempt_timeout = timeout;
        self
    }

    /// A run that has not finished after `limit` (60 s by default) fails as hung.
    #[must_use]
    pub fn run_limit(mut self, limit: Duration) -> Self {
        self.run_limit = limit;
        self
    }

    /// Serves your app behind the verifier instead of the built-in one: `app` is called
    /// once per run with that run's [`Executions`], which its handlers record each
    /// execution in (the explorer judges by it).
    ///
    /// ```
    /// use axum::routing::post;
    /// use idemkey::testing::{Executions, Explorer};
    /// let explorer = Explorer::new().app(|executions: Executions| {
    ///     axum::Router::new().route("/v1/charges", post(move || async move {
    ///         format!(r#"{{"id":"ch_{}"}}"#, executions.record())
    ///     }))
    /// });
    /// # let _ = explorer;
    /// ```
    #[must_use]
    pub fn app(mut self, app: impl Fn(Executions) -> axum::Router + Send + Sync + 'static) -> Self {
        self.app = Some(Arc::new(app));
        self
    }

    /// The schedules this explorer runs, in order, with their phase.
    #[must_use]
    pub fn plan(&self) -> Vec<(Phase, Schedule)> {
        match &self.only {
            Some(only) => only.iter().map(|s| (Phase::Replay, s.clone())).collect(),
            None => schedule::plan(self.attempts, PAIR_ATTEMPTS, self.random, self.seed),
        }
    }

    /// Runs `code` once per schedule of the [plan](Explorer::plan), each run against
    /// its own server, [`Explorer::concurrency`] at a time, and judges every run.
    ///
    /// `code` gets the run's [`Context`] (its server's URL, the attempt timeout to
    /// use) and returns what it returns: a `Result` of your SDK, or anything else
    /// that implements [`ToOutcome`]. It should perform one logical operation (one
    /// `create_charge`); explore each operation in its own exploration. A panic in it
    /// fails the run, with its message.
    pub async fn run<F, Fut, O>(&self, code: F) -> Report
    where
        F: Fn(Context) -> Fut,
        Fut: Future<Output = O>,
        O: ToOutcome,
    {
        let started = Instant::now();
        let code = &code;
        let mut rows: Vec<(usize, Row)> =
            futures_util::stream::iter(self.plan().into_iter().enumerate())
                .map(|(i, (phase, schedule))| async move {
                    (i, self.run_one(phase, schedule, code).await)
                })
                .buffer_unordered(self.concurrency)
                .collect()
                .await;
        rows.sort_by_key(|(i, _)| *i);
        Report {
            rows: rows.into_iter().map(|(_, r)| r).collect(),
            seed: self.seed,
            elapsed: started.elapsed(),
        }
    }

    async fn run_one<F, Fut, O>(&self, phase: Phase, schedule: Schedule, code: &F) -> Row
    where
        F: Fn(Context) -> Fut,
        Fut: Future<Output = O>,
        O: ToOutcome,
    {
        let late_hold = self.attempt_timeout.saturating_mul(4);
        let stage = match Stage::start(schedule.clone(), self.app.as_ref(), late_hold).await {
            Ok(stage) => stage,
            Err(e) => {
                return report::judge(
                    schedule,
                    phase,
                    &stage::Trace::default(),
                    0,
                    Err(format!(
                        "the explorer could not bind a port on 127.0.0.1: {e}"
                    )),
                );
            }
        };
        let ctx = Context {
            base: stage.base_url(),
            attempt_timeout: self.attempt_timeout,
            schedule: schedule.clone(),
        };
        let run = AssertUnwindSafe(code(ctx)).catch_unwind();
        let result = match tokio::time::timeout(self.run_limit, run).await {
            Ok(Ok(value)) => Ok(value.to_outcome()),
            Ok(Err(panic)) => Err(format!("panicked: {}", panic_message(panic.as_ref()))),
            Err(_) => Err(format!(
                "did not finish within {:?} (Explorer::run_limit): does it wait without a timeout?",
                self.run_limit
            )),
        };
        let (trace, executions) = stage.finish();
        report::judge(schedule, phase, &trace, executions, result)
    }
}

fn panic_message(panic: &(dyn Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| String::from("(a panic without a message)"))
}

/// What the code under test gets for one run.
#[derive(Debug, Clone)]
pub struct Context {
    base: String,
    attempt_timeout: Duration,
    schedule: Schedule,
}

impl Context {
    /// This run's server, `http://127.0.0.1:PORT` (no trailing slash): the base URL to
    /// give the SDK under test.
    #[must_use]
    pub fn base_url(&self) -> &str {
        &self.base
    }

    /// [`Context::base_url`] followed by `path`.
    #[must_use]
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// The attempt timeout to build the code under test with (idemkey's
    /// `IdempotentClientBuilder::attempt_timeout`, or your SDK's per-request timeout):
    /// a `late` answer arrives only after the code gives up on the attempt.
    #[must_use]
    pub fn attempt_timeout(&self) -> Duration {
        self.attempt_timeout
    }

    /// The schedule this run meets.
    #[must_use]
    pub fn schedule(&self) -> &Schedule {
        &self.schedule
    }
}
