//! A round's figures (rate, p50, p99) from tasks that send requests back to back, and
//! the medians over rounds: shared by `growth` and `growth_floor` (included by path).

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

/// One round's figures.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Figures {
    pub(crate) rate: f64,
    pub(crate) p50_us: f64,
    pub(crate) p99_us: f64,
}

impl std::fmt::Display for Figures {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{:>7.0} req/s  p50 {:>6.2} ms  p99 {:>6.2} ms",
            self.rate,
            self.p50_us / 1000.0,
            self.p99_us / 1000.0
        )
    }
}

/// Waits for `until`, then raises `stop` and gathers the latencies (microseconds) the
/// `tasks` recorded: the rate and the latencies of the requests answered meanwhile.
pub(crate) async fn finish(
    tasks: Vec<tokio::task::JoinHandle<Result<Vec<u32>, String>>>,
    stop: &AtomicBool,
    until: impl std::future::Future<Output = ()>,
) -> Result<Figures, String> {
    let started = Instant::now();
    until.await;
    stop.store(true, Ordering::Relaxed);
    let mut all = Vec::new();
    for task in tasks {
        all.extend(task.await.map_err(|e| e.to_string())??);
    }
    let elapsed = started.elapsed().as_secs_f64();
    all.sort_unstable();
    let at = |q: f64| {
        all.get(((all.len() as f64 * q) as usize).min(all.len().saturating_sub(1)))
            .map_or(0.0, |&us| f64::from(us))
    };
    Ok(Figures {
        rate: all.len() as f64 / elapsed,
        p50_us: at(0.50),
        p99_us: at(0.99),
    })
}

pub(crate) fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => 0.0,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// The medians of the rounds' figures.
pub(crate) fn medians(rounds: &[Figures]) -> Figures {
    Figures {
        rate: median(rounds.iter().map(|f| f.rate).collect()),
        p50_us: median(rounds.iter().map(|f| f.p50_us).collect()),
        p99_us: median(rounds.iter().map(|f| f.p99_us).collect()),
    }
}
