//! `--faults lose=0.2,reset=0.05,delay=50ms`: the fault plan of `idemkey proxy`.

use idemkey::testing::FaultRates;

/// Parses a comma-separated list of `lose=RATE`, `reset=RATE` and `delay=...`, where
/// `delay` is a duration (every attempt neither lost nor reset waits that long), a rate
/// (that share of attempts waits 50 ms) or `RATE@DURATION`. Rates are fractions of
/// attempts in `[0, 1]`, at most 1 together.
pub(crate) fn parse(text: &str) -> Result<FaultRates, String> {
    let mut rates = FaultRates::default();
    let mut delay_everything = false;
    for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (name, value) = part
            .split_once('=')
            .ok_or_else(|| format!("--faults {part:?}: write name=value (lose, reset, delay)"))?;
        match name.trim() {
            "lose" => rates.lose = rate(name, value)?,
            "reset" => rates.reset = rate(name, value)?,
            "delay" => match value.split_once('@') {
                Some((r, d)) => {
                    rates.delay = rate(name, r)?;
                    rates.delay_by = crate::durations::parse(d)?;
                }
                None if value.trim().parse::<f64>().is_ok() => rates.delay = rate(name, value)?,
                None => {
                    rates.delay_by = crate::durations::parse(value)?;
                    delay_everything = true;
                }
            },
            other => {
                return Err(format!(
                    "--faults: unknown fault {other:?}: use lose, reset and delay"
                ));
            }
        }
    }
    if delay_everything {
        rates.delay = (1.0 - rates.lose - rates.reset).max(0.0);
    }
    if rates.lose + rates.reset + rates.delay > 1.0 + 1e-9 {
        return Err(format!(
            "--faults {text:?}: the rates add up to more than 1"
        ));
    }
    Ok(rates)
}

fn rate(name: &str, value: &str) -> Result<f64, String> {
    value
        .trim()
        .parse::<f64>()
        .ok()
        .filter(|r| (0.0..=1.0).contains(r))
        .ok_or_else(|| format!("--faults {name}={value}: a rate is a number from 0 to 1"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn rates_and_delays() {
        let r = parse("lose=0.2,reset=0.05,delay=50ms").expect("valid");
        assert_eq!((r.lose, r.reset), (0.2, 0.05));
        assert!((r.delay - 0.75).abs() < 1e-9, "{}", r.delay);
        assert_eq!(r.delay_by, Duration::from_millis(50));
        let r = parse("delay=0.1@2s").expect("valid");
        assert_eq!((r.delay, r.delay_by), (0.1, Duration::from_secs(2)));
        assert!(parse("lose=2").is_err());
        assert!(parse("lose=0.7,reset=0.7").is_err());
        assert!(parse("drop=0.1").expect_err("unknown").contains("drop"));
    }
}
