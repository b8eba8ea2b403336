//! The command line `growth` and `growth_floor` share (included by path): the store, the
//! table's size, the rounds and the sweep's pacing, plus the few arguments only one of
//! them reads.

/// The store measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    #[allow(
        dead_code,
        reason = "growth_floor, which includes this file too, has no PostgreSQL"
    )]
    Postgres,
    MySql,
    Sqlite,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Self::Postgres => "postgres",
            Self::MySql => "mysql",
            Self::Sqlite => "sqlite",
        }
    }
}

/// The arguments, with their defaults.
pub(crate) struct Args {
    pub(crate) kind: Kind,
    /// Live records in the full table (`--records`).
    pub(crate) records: u64,
    /// Expired records per sweep pass (`--expired`).
    pub(crate) expired: u64,
    /// Seconds per round (`--seconds`).
    pub(crate) seconds: u64,
    /// Rounds per side (`--rounds`).
    pub(crate) rounds: u32,
    /// Concurrent requests (`--connections`).
    pub(crate) connections: usize,
    /// The database server (`--url`).
    pub(crate) url: Option<String>,
    /// The sweep's pause between batches, as a multiple of the batch's duration
    /// (`--pause-ratio`, the store's default unless given).
    pub(crate) pause_ratio: f64,
    /// The arguments of the program's own (`extra` in [`parse`]) that were given.
    extra: Vec<(&'static str, String)>,
}

impl Args {
    /// The value of one of the program's own arguments, if given.
    pub(crate) fn extra(&self, flag: &str) -> Option<&str> {
        self.extra
            .iter()
            .find(|(f, _)| *f == flag)
            .map(|(_, v)| v.as_str())
    }

    /// The sweep options of the passes measured: the pacing asked for, no lock (a
    /// `charge_server`'s own sweeper may share the work).
    pub(crate) fn sweep_options(&self) -> idemkey::store::SweepOptions {
        idemkey::store::SweepOptions::new()
            .exclusive(false)
            .pause_ratio(self.pause_ratio)
    }
}

/// Parses the command line: `None` for `--help`. `kinds` are the stores the program
/// measures; `extra` the arguments (each with a value) only it reads.
pub(crate) fn parse(
    usage: &str,
    kinds: &[Kind],
    extra: &[&'static str],
) -> Result<Option<Args>, String> {
    let mut args = Args {
        kind: Kind::Sqlite,
        records: 1_000_000,
        expired: 200_000,
        seconds: 4,
        rounds: 5,
        connections: 16,
        url: None,
        pause_ratio: idemkey::store::DEFAULT_SWEEP_PAUSE_RATIO,
        extra: Vec::new(),
    };
    let mut kind = None;
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut value = || it.next().ok_or(format!("{arg} needs a value; {usage}"));
        let positive = |v: String| {
            v.parse::<u64>()
                .ok()
                .filter(|&n| n > 0)
                .ok_or(format!("{arg} {v}: use a positive whole number"))
        };
        match arg.as_str() {
            "--store" => {
                let v = value()?;
                kind = Some(
                    kinds
                        .iter()
                        .copied()
                        .find(|k| k.name() == v)
                        .ok_or_else(|| {
                            let names: Vec<_> = kinds.iter().map(|k| k.name()).collect();
                            format!("--store {v}: use one of {}", names.join(", "))
                        })?,
                );
            }
            "--records" => args.records = positive(value()?)?,
            "--expired" => args.expired = positive(value()?)?,
            "--seconds" => args.seconds = positive(value()?)?,
            "--rounds" => args.rounds = u32::try_from(positive(value()?)?).unwrap_or(u32::MAX),
            "--connections" => args.connections = usize::try_from(positive(value()?)?).unwrap_or(1),
            "--url" => args.url = Some(value()?),
            "--pause-ratio" => {
                let v = value()?;
                args.pause_ratio = v
                    .parse::<f64>()
                    .ok()
                    .filter(|r| (0.0..=1_000.0).contains(r))
                    .ok_or(format!("--pause-ratio {v}: use a number from 0 to 1000"))?;
            }
            "-h" | "--help" => return Ok(None),
            other => match extra.iter().find(|f| **f == other) {
                Some(flag) => args.extra.push((flag, value()?)),
                None => return Err(format!("unknown argument {other}; {usage}")),
            },
        }
    }
    args.kind = kind.ok_or(format!("--store is required; {usage}"))?;
    Ok(Some(args))
}
