//! Fault schedules: which attempt of the operation meets which fault, written as
//! `lose@1,reset@2`, and the phases that enumerate them.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::str::FromStr;

/// What the explorer does to one attempt of the operation under test.
///
/// Each has a short token, used in [`Schedule`] strings (`lose@1`) and in the report.
/// The faults that answer carry the standard dialect's answer (the verifier's
/// [`Rejection`](crate::server::Rejection) where it has one), with a retry hint of zero
/// seconds, so that a retry is due at once (see [`Explorer`](super::Explorer), on time).
///
/// ```
/// use idemkey::testing::AttemptFault;
/// assert_eq!(AttemptFault::LoseResponse.token(), "lose");
/// assert_eq!("503".parse::<AttemptFault>()?, AttemptFault::StoreUnavailable);
/// assert!(!AttemptFault::EXPLORED.contains(&AttemptFault::KeyReused));
/// # Ok::<(), idemkey::testing::ScheduleError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum AttemptFault {
    /// `lose`: the request reaches the server and executes, its whole answer is read,
    /// then the connection is closed without it: the case idempotency keys exist for.
    LoseResponse,
    /// `reset`: the connection is closed as soon as the request head arrives; nothing
    /// executes.
    Reset,
    /// `late`: the request executes, and its answer is held until the code gives up on
    /// the attempt (closes the connection), for at most four attempt timeouts; then it is
    /// sent.
    Late,
    /// `500`: `500 Internal Server Error` without executing.
    ServerError,
    /// `409`: the verifier's `409 in-progress` ("a request with this key is still
    /// running"), `Retry-After: 0`, without executing.
    InProgress,
    /// `423`: the same answer as `409` with status `423 Locked`, as some APIs say it.
    Locked,
    /// `429`: `429 Too Many Requests` from a rate limiter in front of the API,
    /// `Retry-After: 0`, without executing.
    TooManyRequests,
    /// `503`: the verifier's `503 store-unavailable`, `Retry-After: 0`, without
    /// executing.
    StoreUnavailable,
    /// `422`: the verifier's `422 key-reused`, as when the key was used before for
    /// another request. Not retryable: the code must stop and report key reused. The
    /// generated schedules put it at attempt 1 only (`422@1`), the one place a real
    /// verifier says it to a well-behaved client.
    KeyReused,
}

impl AttemptFault {
    /// Every fault, [`AttemptFault::EXPLORED`] then [`AttemptFault::KeyReused`].
    pub const ALL: [Self; 9] = [
        Self::LoseResponse,
        Self::Reset,
        Self::Late,
        Self::ServerError,
        Self::InProgress,
        Self::Locked,
        Self::TooManyRequests,
        Self::StoreUnavailable,
        Self::KeyReused,
    ];

    /// The faults the single, pair and random phases put at every attempt: all but
    /// [`AttemptFault::KeyReused`], which goes at attempt 1 alone.
    pub const EXPLORED: &'static [Self] = Self::ALL.split_at(8).0;

    /// The fault's token in schedule strings: `lose`, `reset`, `late`, `500`, `409`,
    /// `423`, `429`, `503`, `422`.
    #[must_use]
    pub const fn token(self) -> &'static str {
        match self {
            Self::LoseResponse => "lose",
            Self::Reset => "reset",
            Self::Late => "late",
            Self::ServerError => "500",
            Self::InProgress => "409",
            Self::Locked => "423",
            Self::TooManyRequests => "429",
            Self::StoreUnavailable => "503",
            Self::KeyReused => "422",
        }
    }

    /// Whether the request reaches the handler (`lose`, `late`).
    #[must_use]
    pub const fn executes(self) -> bool {
        matches!(self, Self::LoseResponse | Self::Late)
    }
}

impl fmt::Display for AttemptFault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.token())
    }
}

impl FromStr for AttemptFault {
    type Err = ScheduleError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let token = s.trim();
        Self::ALL
            .into_iter()
            .find(|f| f.token().eq_ignore_ascii_case(token))
            .ok_or_else(|| ScheduleError(format!("unknown fault `{token}`; {}", tokens_hint())))
    }
}

fn tokens_hint() -> String {
    let tokens: Vec<&str> = AttemptFault::ALL.iter().map(|f| f.token()).collect();
    format!("the faults are {}", tokens.join(", "))
}

/// Which attempt of the operation meets which fault; every other attempt goes through
/// untouched. Attempts are numbered from 1 in the order requests arrive during one run
/// of the code, whatever key they carry.
///
/// Written `fault@attempt` joined by commas (`lose@1,reset@2`), `none` for no fault; the
/// report prints each schedule so, and [`Explorer::replay`](super::Explorer::replay)
/// reads it back.
///
/// ```
/// use idemkey::testing::{AttemptFault, Schedule};
/// let s: Schedule = "reset@2, lose@1".parse()?;
/// assert_eq!(s.to_string(), "lose@1,reset@2");
/// assert_eq!(s.fault_at(2), Some(AttemptFault::Reset));
/// assert_eq!(s.fault_at(3), None);
/// assert_eq!("none".parse::<Schedule>()?, Schedule::default());
/// let err = "lose@0".parse::<Schedule>().unwrap_err();
/// assert!(err.to_string().contains("attempts count from 1"), "{err}");
/// # Ok::<(), idemkey::testing::ScheduleError>(())
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Schedule(BTreeMap<u32, AttemptFault>);

impl Schedule {
    /// This schedule with `fault` at `attempt` (from 1) as well, replacing the fault
    /// there.
    ///
    /// ```
    /// use idemkey::testing::{AttemptFault, Schedule};
    /// let s = Schedule::default().with(1, AttemptFault::LoseResponse).with(2, AttemptFault::Reset);
    /// assert_eq!(s.to_string(), "lose@1,reset@2");
    /// ```
    #[must_use]
    pub fn with(mut self, attempt: u32, fault: AttemptFault) -> Self {
        self.0.insert(attempt.max(1), fault);
        self
    }

    /// The fault of attempt `attempt` (from 1), if any.
    #[must_use]
    pub fn fault_at(&self, attempt: u32) -> Option<AttemptFault> {
        self.0.get(&attempt).copied()
    }

    /// The faults, as (attempt, fault), in attempt order.
    pub fn faults(&self) -> impl Iterator<Item = (u32, AttemptFault)> + '_ {
        self.0.iter().map(|(a, f)| (*a, *f))
    }

    /// The last attempt that meets a fault (`None`: none does).
    #[must_use]
    pub fn last_attempt(&self) -> Option<u32> {
        self.0.last_key_value().map(|(a, _)| *a)
    }

    /// Whether no attempt meets a fault.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl fmt::Display for Schedule {
    /// `fault@attempt`, joined by commas; consecutive attempts with the same fault as a
    /// range (`reset@1-3`); `none` for no fault.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() {
            return f.write_str("none");
        }
        let mut runs: Vec<(AttemptFault, u32, u32)> = Vec::new();
        for (&attempt, &fault) in &self.0 {
            match runs.last_mut() {
                Some((f, _, last)) if *f == fault && *last + 1 == attempt => *last = attempt,
                _ => runs.push((fault, attempt, attempt)),
            }
        }
        for (n, (fault, first, last)) in runs.into_iter().enumerate() {
            if n > 0 {
                f.write_str(",")?;
            }
            if first == last {
                write!(f, "{fault}@{first}")?;
            } else {
                write!(f, "{fault}@{first}-{last}")?;
            }
        }
        Ok(())
    }
}

impl FromStr for Schedule {
    type Err = ScheduleError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = s.trim();
        let mut schedule = Self::default();
        if s.is_empty() || s.eq_ignore_ascii_case("none") {
            return Ok(schedule);
        }
        for part in s.split(',') {
            let part = part.trim();
            let Some((fault, attempt)) = part.split_once('@') else {
                return Err(ScheduleError(format!(
                    "`{part}` is not `fault@attempt` (such as `lose@1`); {}",
                    tokens_hint()
                )));
            };
            let fault: AttemptFault = fault.parse()?;
            let number = |text: &str| {
                let n: u32 = text.trim().parse().map_err(|_| {
                    ScheduleError(format!(
                        "`{part}`: `{}` is not an attempt number (1, 2, ...)",
                        text.trim()
                    ))
                })?;
                if n == 0 {
                    return Err(ScheduleError(format!(
                        "`{part}`: attempts count from 1 (the first attempt is `@1`)"
                    )));
                }
                Ok(n)
            };
            let (first, last) = match attempt.split_once('-') {
                Some((a, b)) => (number(a)?, number(b)?),
                None => {
                    let n = number(attempt)?;
                    (n, n)
                }
            };
            if last < first {
                return Err(ScheduleError(format!(
                    "`{part}`: the range ends before it starts"
                )));
            }
            for attempt in first..=last {
                if schedule.0.insert(attempt, fault).is_some() {
                    return Err(ScheduleError(format!(
                        "`{s}` gives attempt {attempt} two faults; give each attempt one"
                    )));
                }
            }
        }
        Ok(schedule)
    }
}

/// A schedule string that does not parse; says which part and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("bad fault schedule: {0}")]
pub struct ScheduleError(String);

/// Which phase of the exploration a schedule belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum Phase {
    /// No fault: the code's happy path.
    Baseline,
    /// One fault at one attempt.
    Single,
    /// Two faults at two of the first attempts.
    Pair,
    /// A seed-driven random schedule.
    Random,
    /// A schedule given to [`Explorer::replay`](super::Explorer::replay).
    Replay,
}

impl Phase {
    /// A short name for the report (`single`).
    #[must_use]
    pub const fn name(self) -> &'static str {
        match self {
            Self::Baseline => "base",
            Self::Single => "single",
            Self::Pair => "pair",
            Self::Random => "random",
            Self::Replay => "replay",
        }
    }
}

impl fmt::Display for Phase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What the attempts before a scheduled fault meet, so that the code gets there: a
/// reset connection, which executes nothing and which any retrying code retries.
pub(super) const FILLER: AttemptFault = AttemptFault::Reset;

/// `faults`, and [`FILLER`] at every attempt before the last fault that has none.
fn filled(faults: &[(u32, AttemptFault)]) -> Schedule {
    let mut s = Schedule::default();
    for &(attempt, fault) in faults {
        s = s.with(attempt, fault);
    }
    let last = s.last_attempt().unwrap_or(0);
    for attempt in 1..last {
        s.0.entry(attempt).or_insert(FILLER);
    }
    s
}

/// The schedules of an exploration, in order, each once: the baseline; every explored
/// fault at every attempt up to `attempts`, and `422@1`; every pair of explored faults
/// at two of the first `pair_attempts` attempts; then `random` schedules drawn from
/// `seed`, each of a random length up to `attempts` with a random fault at every
/// attempt. The attempts before a fault that the single and pair phases leave free
/// meet [`FILLER`].
pub(super) fn plan(
    attempts: u32,
    pair_attempts: u32,
    random: u32,
    seed: u64,
) -> Vec<(Phase, Schedule)> {
    let mut out = vec![(Phase::Baseline, Schedule::default())];
    let mut seen: BTreeSet<Schedule> = BTreeSet::from([Schedule::default()]);
    let mut add = |phase: Phase, s: Schedule, out: &mut Vec<(Phase, Schedule)>| {
        let new = seen.insert(s.clone());
        if new {
            out.push((phase, s));
        }
        new
    };
    for attempt in 1..=attempts {
        for &fault in AttemptFault::EXPLORED {
            add(Phase::Single, filled(&[(attempt, fault)]), &mut out);
        }
    }
    add(
        Phase::Single,
        filled(&[(1, AttemptFault::KeyReused)]),
        &mut out,
    );
    for first in 1..=pair_attempts {
        for second in first + 1..=pair_attempts {
            for &a in AttemptFault::EXPLORED {
                for &b in AttemptFault::EXPLORED {
                    add(Phase::Pair, filled(&[(first, a), (second, b)]), &mut out);
                }
            }
        }
    }
    let mut rng = SplitMix64(seed);
    let mut drawn = 0;
    let pick = |x: u64, n: usize| usize::try_from(x % n as u64).unwrap_or(0);
    // Bounded: with few attempts there are few distinct schedules to draw.
    for _ in 0..u64::from(random).saturating_mul(50) {
        if drawn == random {
            break;
        }
        let len = 1 + pick(rng.next(), usize::try_from(attempts).unwrap_or(1));
        let mut s = Schedule::default();
        for attempt in 1..=u32::try_from(len).unwrap_or(1) {
            let fault = AttemptFault::EXPLORED[pick(rng.next(), AttemptFault::EXPLORED.len())];
            s = s.with(attempt, fault);
        }
        if add(Phase::Random, s, &mut out) {
            drawn += 1;
        }
    }
    out
}

/// splitmix64 (Steele, Lea, Flood 2014), as [`Fault::seeded`](crate::testing::Fault::seeded)
/// draws: the same seed gives the same schedules on every machine.
struct SplitMix64(u64);

impl SplitMix64 {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_plan_has_every_single_and_pair_and_distinct_random_schedules() {
        let p = plan(4, 3, 32, 7);
        let count = |phase| p.iter().filter(|(ph, _)| *ph == phase).count();
        assert_eq!(count(Phase::Baseline), 1);
        assert_eq!(count(Phase::Single), 4 * 8 + 1);
        // 64 for each pair of attempts, less the 8 that open with the filler and so
        // are a single (`reset@1,X@2` is the single at attempt 2).
        assert_eq!(count(Phase::Pair), 3 * (64 - 8));
        assert_eq!(count(Phase::Random), 32);
        let distinct: BTreeSet<_> = p.iter().map(|(_, s)| s).collect();
        assert_eq!(distinct.len(), p.len());
        assert_eq!(plan(4, 3, 32, 7), p, "the same seed, the same plan");
        assert_ne!(plan(4, 3, 32, 8), p, "another seed, other random schedules");
        let has = |text: &str| p.iter().any(|(_, s)| s.to_string() == text);
        assert!(
            has("reset@1-3,lose@4"),
            "a fault at attempt 4 follows 3 resets"
        );
        assert!(has("lose@1,reset@2,503@3"));
        // Every schedule is reachable: no attempt before its last fault goes free.
        for (_, s) in &p {
            let last = s.last_attempt().unwrap_or(0);
            assert!((1..last).all(|a| s.fault_at(a).is_some()), "{s}");
        }
    }

    #[test]
    fn every_schedule_reads_back_from_its_string() {
        for (_, s) in plan(4, 3, 16, 1) {
            assert_eq!(s.to_string().parse::<Schedule>(), Ok(s));
        }
        assert_eq!(
            "reset@1-3,lose@4"
                .parse::<Schedule>()
                .map(|s| s.fault_at(2)),
            Ok(Some(AttemptFault::Reset))
        );
        for bad in [
            "lose",
            "boom@1",
            "lose@x",
            "lose@1,reset@1",
            "lose@3-1",
            "lose@0-2",
        ] {
            assert!(bad.parse::<Schedule>().is_err(), "{bad}");
        }
    }
}
