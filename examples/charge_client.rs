//! Sends N charges through the default client stack and prints one JSON line each.
//!
//! ```sh
//! cargo build --examples     # both binaries first, so the server starts at once
//! cargo run --example charge_server -- --addr 127.0.0.1:3000 &
//! # wait for its "charge_server listening on http://127.0.0.1:3000" line, then:
//! cargo run --example charge_client -- --url http://127.0.0.1:3000/v1/charges --count 3
//! cargo run --example charge_client -- --url URL --count 3 --operation nightly-batch
//! ```
//!
//! Without `--operation` every request gets a fresh random UUID v4 key. With
//! `--operation NAME` the key of request i is derived (UUID v5) from NAME and i, so
//! rerunning the same command sends the same keys, and a verifier replays instead of
//! charging again.
//!
//! Each line: `{"key": "...", "status": 200, "attempts": 1, "replayed": false,
//! "error": null, "message": null}`; `status` is null when no response came, `error` is
//! null or a stable snake_case kind (`key_reused`, `in_progress`, `already_executed`,
//! `outcome_unknown`, `never_sent` when nothing could be sent (nothing listening, say),
//! `retry_budget_exhausted`, `invalid_key`, `body_not_replayable`, `unexpected_status`
//! for any other non-2xx answer, `transport` for an error outside idemkey, such as a URL
//! without `http://`), and `message` says what happened in words. Exits 0 when every
//! request succeeded.

use std::io::Write;
use std::process::ExitCode;

use idemkey::client::{Error, IdempotentClientBuilder, RequestBuilderExt, ResponseExt};
use serde_json::json;

#[path = "common/telemetry.rs"]
mod telemetry;

/// One output line; fields in the documented order.
#[derive(serde::Serialize)]
struct Line {
    key: Option<String>,
    status: Option<u16>,
    attempts: u32,
    replayed: bool,
    error: Option<&'static str>,
    message: Option<String>,
}

/// JSON on one line with a space after each `:` and `,`, the documented line format.
struct Spaced;

impl serde_json::ser::Formatter for Spaced {
    fn begin_object_key<W: ?Sized + Write>(
        &mut self,
        w: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        w.write_all(if first { b"" } else { b", " })
    }

    fn begin_object_value<W: ?Sized + Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        w.write_all(b": ")
    }
}

fn to_line(line: &Line) -> Result<String, Box<dyn std::error::Error>> {
    let mut buf = Vec::new();
    serde::Serialize::serialize(
        line,
        &mut serde_json::Serializer::with_formatter(&mut buf, Spaced),
    )?;
    Ok(String::from_utf8(buf)?)
}

struct Args {
    url: String,
    count: u32,
    operation: Option<String>,
}

const USAGE: &str = "usage: charge_client --url URL [--count N] [--operation NAME]";

/// The arguments, or `None` for `--help`.
fn parse_args() -> Result<Option<Args>, String> {
    let mut url = None;
    let mut count = 1;
    let mut operation = None;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = || args.next().ok_or(format!("{arg} needs a value; {USAGE}"));
        match arg.as_str() {
            "--url" => url = Some(value()?),
            "--count" => {
                let v = value()?;
                count = v
                    .parse()
                    .map_err(|_| format!("--count {v}: not a number; {USAGE}"))?;
            }
            "--operation" => operation = Some(value()?),
            "-h" | "--help" => return Ok(None),
            other => return Err(format!("unknown argument {other}; {USAGE}")),
        }
    }
    let url = url.ok_or(format!("--url is required; {USAGE}"))?;
    Ok(Some(Args {
        url,
        count,
        operation,
    }))
}

/// An error and its causes on one line (reqwest's "builder error" alone does not say
/// that the URL lacks its scheme; its source does).
fn chain(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(e) = source {
        text.push_str(": ");
        text.push_str(&e.to_string());
        source = e.source();
    }
    text
}

#[allow(
    clippy::print_stdout,
    reason = "--help prints its usage on standard output"
)]
#[tokio::main]
async fn main() -> ExitCode {
    telemetry::init_tracing();
    let args = match parse_args() {
        Ok(Some(args)) => args,
        Ok(None) => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(message) => {
            eprintln!("{message}");
            return ExitCode::from(2);
        }
    };
    let client = IdempotentClientBuilder::new(reqwest::Client::new()).build();
    let mut all_ok = true;
    let mut out = std::io::stdout().lock();
    for i in 0..args.count {
        let body = json!({"amount": 1000, "currency": "eur", "reference": format!("charge-{i}")});
        let mut request = client.post(&args.url).json(&body);
        if let Some(operation) = &args.operation {
            request = request.derive_idempotency_key(operation, &i);
        }
        let line = match request.send().await {
            Ok(response) => {
                let info = response.idempotency();
                let ok = response.status().is_success();
                Line {
                    key: info.map(|i| i.key().to_string()),
                    status: Some(response.status().as_u16()),
                    attempts: info.map_or(1, |i| i.attempts()),
                    replayed: info.is_some_and(|i| i.replayed()),
                    error: (!ok).then_some("unexpected_status"),
                    message: (!ok).then(|| format!("the server answered {}", response.status())),
                }
            }
            Err(err) => match Error::from_middleware(&err) {
                Some(e) => Line {
                    key: e.key().map(ToString::to_string),
                    status: e.status().map(|s| s.as_u16()),
                    attempts: e.attempts(),
                    replayed: e
                        .response()
                        .and_then(|r| r.idempotency())
                        .is_some_and(|i| i.replayed()),
                    error: Some(e.kind_str()),
                    message: Some(e.to_string()),
                },
                None => Line {
                    key: None,
                    status: None,
                    attempts: 1,
                    replayed: false,
                    error: Some("transport"),
                    message: Some(chain(&err)),
                },
            },
        };
        all_ok &= line.error.is_none();
        let Ok(line) = to_line(&line) else {
            return ExitCode::FAILURE;
        };
        if writeln!(out, "{line}").is_err() {
            return ExitCode::FAILURE;
        }
    }
    if all_ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
