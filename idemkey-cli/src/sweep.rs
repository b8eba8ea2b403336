//! `idemkey sweep STORE_URL`: one sweep pass, for operators who schedule it from cron
//! rather than inside their service.

use std::time::Duration;

use idemkey::store::{SweepOptions, SweepOutcome, sweep_and_report};

/// Remove expired records from a store in one pass of bounded batches, then print what
/// it did on one line (rows removed, duration, rows per second). The pass takes the
/// store's sweep lock, so it never runs beside another instance's sweeper (it is
/// skipped then, and says so). Redis and DynamoDB expire records themselves: nothing
/// to do there.
#[derive(Debug, clap::Args)]
pub(crate) struct SweepArgs {
    /// The store: postgres://, mysql://, sqlite://PATH (redis:// and dynamodb:// expire
    /// records themselves).
    #[arg(long = "store", value_name = "URL")]
    store: String,
    /// Stop starting new batches after this long (`30s`, `5m`); the rest waits for the
    /// next pass. Without it the pass runs until nothing expired is left.
    #[arg(long, value_parser = super::durations::parse)]
    max_duration: Option<Duration>,
    /// The most records one statement removes.
    #[arg(long, default_value_t = idemkey::store::DEFAULT_SWEEP_BATCH,
          value_parser = clap::value_parser!(u32).range(1..=100_000))]
    batch: u32,
    /// Pause between batches, as a multiple of the time the batch before took (1: the
    /// batches take at most half the pass's time; 0: back to back, as fast as the
    /// database goes, at the cost of the requests running meanwhile).
    #[arg(long, default_value_t = idemkey::store::DEFAULT_SWEEP_PAUSE_RATIO,
          value_parser = pause_ratio)]
    pause_ratio: f64,
    /// Print one JSON object instead of a line of text.
    #[arg(long)]
    json: bool,
}

pub(crate) async fn run(args: SweepArgs) -> Result<(), String> {
    let engine = super::open_store(&args.store).await?;
    let mut options = SweepOptions::new()
        .batch(args.batch)
        .pause_ratio(args.pause_ratio);
    if let Some(budget) = args.max_duration {
        options = options.max_duration(budget);
    }
    let report = sweep_and_report(engine.store(), &options)
        .await
        .map_err(|e| format!("the sweep failed: {e}"))?;
    if args.json {
        let json = serde_json::json!({
            "removed": report.removed(),
            "batches": report.batches(),
            "duration_seconds": report.duration().as_secs_f64(),
            "rows_per_second": report.rows_per_second(),
            "paused_seconds": report.paused().as_secs_f64(),
            "outcome": report.outcome().as_str(),
            "lag_seconds": report.lag().map(|l| l.as_secs_f64()),
        });
        println!("{json}");
        return Ok(());
    }
    let tail = match report.outcome() {
        SweepOutcome::Skipped => "skipped: another instance holds the sweep lock".to_owned(),
        SweepOutcome::BudgetSpent => format!(
            "stopped at --max-duration with expired records left{}",
            report
                .lag()
                .map(|l| format!(" (the oldest expired {} ago)", super::durations::show(l)))
                .unwrap_or_default()
        ),
        _ => "nothing expired left".to_owned(),
    };
    println!(
        "removed {} records in {} ({:.0} rows/s, {} batches, paused {}); {tail}",
        report.removed(),
        super::durations::show(report.duration()),
        report.rows_per_second(),
        report.batches(),
        super::durations::show(report.paused()),
    );
    Ok(())
}

/// A pause ratio: a number from 0 to 1,000.
fn pause_ratio(text: &str) -> Result<f64, String> {
    text.parse::<f64>()
        .ok()
        .filter(|r| (0.0..=1_000.0).contains(r))
        .ok_or_else(|| format!("{text:?}: use a number from 0 to 1000, such as 1 or 0.5"))
}
