//! The judgement of each run, and the table that reports them.

use std::collections::BTreeSet;
use std::fmt::{self, Write as _};
use std::time::Duration;

use super::outcome::Outcome;
use super::schedule::{Phase, Schedule};
use super::stage::{Fate, Trace};

/// One run of the code under one schedule: what the server saw, what the code said, and
/// what is wrong with it.
#[derive(Debug, Clone)]
pub struct Row {
    pub(super) schedule: Schedule,
    pub(super) phase: Phase,
    pub(super) attempts: u32,
    pub(super) keys: usize,
    pub(super) keyless: u32,
    pub(super) executions: u64,
    pub(super) result: Result<Outcome, String>,
    pub(super) problems: Vec<String>,
    pub(super) notes: Vec<String>,
}

impl Row {
    /// The schedule this run met.
    #[must_use]
    pub fn schedule(&self) -> &Schedule {
        &self.schedule
    }

    /// The phase the schedule comes from.
    #[must_use]
    pub fn phase(&self) -> Phase {
        self.phase
    }

    /// Attempts (requests with an unsafe method) the server received.
    #[must_use]
    pub fn attempts(&self) -> u32 {
        self.attempts
    }

    /// How many different idempotency keys those attempts carried (one is right).
    #[must_use]
    pub fn keys(&self) -> usize {
        self.keys
    }

    /// Attempts that carried no key (none is right).
    #[must_use]
    pub fn keyless(&self) -> u32 {
        self.keyless
    }

    /// How often the handler executed the operation (at most once is right).
    #[must_use]
    pub fn executions(&self) -> u64 {
        self.executions
    }

    /// What the code reported, or why it reported nothing (it panicked, or did not
    /// finish within the explorer's [limit per run](super::Explorer::run_limit)).
    pub fn outcome(&self) -> Result<&Outcome, &str> {
        self.result.as_ref().map_err(String::as_str)
    }

    /// What is wrong with this run; empty when it passed.
    #[must_use]
    pub fn problems(&self) -> &[String] {
        &self.problems
    }

    /// Whether the run passed.
    #[must_use]
    pub fn is_ok(&self) -> bool {
        self.problems.is_empty()
    }

    fn result_text(&self) -> String {
        match &self.result {
            Ok(o) => o.to_string(),
            Err(why) => why.clone(),
        }
    }

    fn verdict_text(&self) -> String {
        let mut v = if self.problems.is_empty() {
            String::from("ok")
        } else {
            format!("FAIL: {}", self.problems.join("; "))
        };
        if !self.notes.is_empty() {
            let _ = write!(v, " (note: {})", self.notes.join("; "));
        }
        v
    }
}

/// Judges one run: the trace of what reached the server, the executions, and what the
/// code said.
pub(super) fn judge(
    schedule: Schedule,
    phase: Phase,
    trace: &Trace,
    executions: u64,
    result: Result<Outcome, String>,
) -> Row {
    let attempts = &trace.attempts;
    let keys: BTreeSet<&[u8]> = attempts.iter().filter_map(|a| a.key.as_deref()).collect();
    let keyless = attempts.iter().filter(|a| a.key.is_none()).count();
    let mut problems = Vec::new();
    let mut notes = Vec::new();

    if executions > 1 {
        problems.push(format!("executed {executions} times"));
    }
    if keys.len() > 1 {
        problems.push(format!(
            "{} different keys across {} attempts (every attempt of one operation must carry its one key)",
            keys.len(),
            attempts.len()
        ));
    }
    if keyless > 0 {
        problems.push(format!("{keyless} attempt(s) without an idempotency key"));
    }
    let answers = || {
        attempts
            .iter()
            .enumerate()
            .filter_map(|(i, a)| match a.fate {
                Fate::Answered(answer) => Some((i + 1, answer)),
                Fate::Pending | Fate::Dropped => None,
            })
    };
    if let Some((n, _)) = answers().find(|(_, a)| a.key_reused && a.injected)
        && attempts.len() > n
    {
        problems.push(format!(
            "attempt {} after the 422 key-reused answer to attempt {n} (a 422 must not be retried)",
            n + 1
        ));
    }
    if let Some((n, _)) = answers().find(|(_, a)| a.key_reused && !a.injected) {
        problems.push(format!(
            "the verifier answered 422 key-reused to attempt {n}: it differed from the attempt before it (a retry must resend the same method, path and body)"
        ));
    }
    if let Some(last) = schedule.last_attempt()
        && attempts.len() < usize::try_from(last).unwrap_or(usize::MAX)
    {
        notes.push(format!(
            "the fault at attempt {last} was not reached: the code stopped after {} attempt(s)",
            attempts.len()
        ));
    }
    if answers().any(|(_, a)| a.late) {
        notes.push(String::from(
            "a late answer was received after four attempt timeouts; build the code with Context::attempt_timeout",
        ));
    }
    let success_seen = answers().any(|(_, a)| a.is_success());
    let last = attempts.last().and_then(|a| match a.fate {
        Fate::Answered(answer) => Some(answer),
        Fate::Pending | Fate::Dropped => None,
    });
    let last_said = last.and_then(|a| {
        if a.is_success() {
            Some("a success")
        } else if a.key_reused {
            Some("key reused")
        } else {
            None
        }
    });
    let executed =
        |what: &str| format!("reports {what}, but the operation executed {executions} time(s)");
    match &result {
        Ok(Outcome::Success) => {
            if executions != 1 {
                problems.push(executed("success"));
            }
            if !success_seen {
                problems.push(String::from(
                    "reports success, but no success answer reached it (an error or a lost answer taken for success?)",
                ));
            }
        }
        Ok(Outcome::KeyReused) => {
            if !answers().any(|(_, a)| a.key_reused) {
                problems.push(String::from(
                    "reports key reused, but no attempt was answered key-reused",
                ));
            }
        }
        Ok(Outcome::NeverSent) => {
            if executions > 0 {
                problems.push(executed("never sent"));
            }
        }
        Ok(Outcome::Failed(_)) => {
            if executions > 0 {
                problems.push(format!(
                    "{} (a caller told \"failed\" may try again under a new key: report outcome unknown)",
                    executed("failure")
                ));
            }
        }
        Ok(Outcome::OutcomeUnknown) => {}
        Err(why) => problems.push(why.clone()),
    }
    if let (Some(said), Ok(outcome)) = (last_said, &result) {
        let agrees = match outcome {
            Outcome::Success => said == "a success",
            Outcome::KeyReused => said == "key reused",
            _ => false,
        };
        if !agrees {
            problems.push(format!(
                "reports {outcome}, but the last answer it received said {said}"
            ));
        }
    }
    Row {
        schedule,
        phase,
        attempts: u32::try_from(attempts.len()).unwrap_or(u32::MAX),
        keys: keys.len(),
        keyless: u32::try_from(keyless).unwrap_or(u32::MAX),
        executions,
        result,
        problems,
        notes,
    }
}

/// What an exploration found: one [`Row`] per schedule, in plan order. Its `Display`
/// is the whole table; [`Report::assert_ok`] panics with the failing rows.
///
/// ```text
/// schedule        phase   attempts  keys  executions  result           verdict
/// none            base    1         1     1           success          ok
/// lose@1          single  2         1     1           success          ok
/// ```
#[derive(Debug, Clone)]
pub struct Report {
    pub(super) rows: Vec<Row>,
    pub(super) seed: u64,
    pub(super) elapsed: Duration,
}

impl Report {
    /// Every run, in plan order.
    #[must_use]
    pub fn rows(&self) -> &[Row] {
        &self.rows
    }

    /// The run of the schedule written `schedule` (`"lose@1"`), if it was explored.
    #[must_use]
    pub fn row(&self, schedule: &str) -> Option<&Row> {
        let wanted: Schedule = schedule.parse().ok()?;
        self.rows.iter().find(|r| r.schedule == wanted)
    }

    /// The runs that failed.
    pub fn failures(&self) -> impl Iterator<Item = &Row> {
        self.rows.iter().filter(|r| !r.is_ok())
    }

    /// Whether every run passed.
    #[must_use]
    pub fn is_ok(&self) -> bool {
        self.rows.iter().all(Row::is_ok)
    }

    /// How long the exploration took.
    #[must_use]
    pub fn elapsed(&self) -> Duration {
        self.elapsed
    }

    /// The seed of the random phase.
    #[must_use]
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// Panics unless every run passed, with the summary, the table of the failing runs
    /// and how to replay one alone.
    ///
    /// # Panics
    /// When a run failed.
    #[track_caller]
    pub fn assert_ok(&self) {
        if self.is_ok() {
            return;
        }
        let failing: Vec<&Row> = self.failures().collect();
        let mut text = self.summary();
        text.push('\n');
        table(&mut text, failing.iter().copied());
        if let Some(first) = failing.first() {
            let _ = write!(
                text,
                "\nreplay one alone: Explorer::replay(\"{}\") (with the same settings and code)",
                first.schedule
            );
        }
        panic!("{text}");
    }

    fn summary(&self) -> String {
        let count = |phase| self.rows.iter().filter(|r| r.phase == phase).count();
        let failed = self.failures().count();
        format!(
            "fault explorer: {} schedules ({} baseline, {} single, {} pair, {} random with seed {}, {} replayed) in {:.1} s: {} passed, {} failed",
            self.rows.len(),
            count(Phase::Baseline),
            count(Phase::Single),
            count(Phase::Pair),
            count(Phase::Random),
            self.seed,
            count(Phase::Replay),
            self.elapsed.as_secs_f64(),
            self.rows.len() - failed,
            failed
        )
    }
}

/// The table of `rows`, columns aligned.
fn table<'a>(out: &mut String, rows: impl Iterator<Item = &'a Row>) {
    let header = [
        "schedule",
        "phase",
        "attempts",
        "keys",
        "executions",
        "result",
        "verdict",
    ];
    let mut lines: Vec<[String; 7]> = vec![header.map(String::from)];
    for r in rows {
        let keys = if r.keyless > 0 {
            format!("{}+{} none", r.keys, r.keyless)
        } else {
            r.keys.to_string()
        };
        lines.push([
            r.schedule.to_string(),
            r.phase.to_string(),
            r.attempts.to_string(),
            keys,
            r.executions.to_string(),
            r.result_text(),
            r.verdict_text(),
        ]);
    }
    let mut widths = [0usize; 7];
    for line in &lines {
        for (w, cell) in widths.iter_mut().zip(line) {
            *w = (*w).max(cell.chars().count());
        }
    }
    for line in &lines {
        let mut text = String::new();
        for (i, cell) in line.iter().enumerate() {
            if i + 1 == line.len() {
                text.push_str(cell);
            } else {
                let _ = write!(text, "{cell:<width$}  ", width = widths[i]);
            }
        }
        out.push_str(text.trim_end());
        out.push('\n');
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut text = self.summary();
        text.push('\n');
        table(&mut text, self.rows.iter());
        f.write_str(&text)
    }
}
