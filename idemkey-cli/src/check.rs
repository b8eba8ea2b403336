//! `idemkey check URL`: black-box conformance of one endpoint to the IETF
//! `Idempotency-Key` draft and Stripe's practice.

use std::time::Duration;

use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use reqwest::{Method, StatusCode};
use serde::Serialize;

use idemkey::protocol::headers::{IDEMPOTENCY_REPLAYED, IDEMPOTENT_REPLAYED};

/// Check that one endpoint honours idempotency keys.
///
/// Sends the endpoint a few requests per case (each case with keys of its own) and
/// judges the answers: `replay` (same key and body replay the same status and body),
/// `key-reuse` (same key, other body: 422, or 400 as Stripe answers), `concurrent` (a
/// duplicate of a running request: 409 or 423), `missing-key`, `invalid-key` (256
/// characters; a control character), `tenants` (two `--auth` with one key do not see
/// each other's response), `5xx` (a failed request is not stored).
///
/// Each case is `pass`, `fail`, `differs` (honoured, in another way than the draft says,
/// or not observable) or `skip` (needs an option). The exit status is the number of
/// failed cases (0 when none failed; 125 when the check could not run).
///
/// Every request is real: an endpoint that creates resources creates some. Before
/// sending to an address that is not loopback, the check asks (unless `--yes`).
#[derive(Debug, clap::Args)]
pub(crate) struct CheckArgs {
    /// The endpoint, such as http://127.0.0.1:3000/v1/charges.
    url: String,
    /// The request method.
    #[arg(long, short = 'X', default_value = "POST")]
    method: Method,
    /// The request body: JSON, or @FILE to read it from a file. Sent with
    /// `Content-Type: application/json` unless -H sets another.
    #[arg(long, short = 'd', default_value = "{}")]
    data: String,
    /// Another body for `key-reuse` (default: --data with its first number plus one, or
    /// with a field added).
    #[arg(long, value_name = "DATA")]
    other_data: Option<String>,
    /// A body the endpoint answers slowly, for `concurrent` (default: --data), such as
    /// '{"amount":100,"delay_ms":500}' where the API has a way to be slow.
    #[arg(long, value_name = "DATA")]
    slow_data: Option<String>,
    /// A body the endpoint answers with a 5xx, for `5xx` (skipped without it).
    #[arg(long, value_name = "DATA")]
    fail_data: Option<String>,
    /// A request header, `name:value` (repeatable).
    #[arg(short = 'H', long = "header", value_name = "NAME:VALUE")]
    headers: Vec<String>,
    /// The header the key is sent in.
    #[arg(long, default_value = "Idempotency-Key")]
    key_header: HeaderName,
    /// The `Authorization` header's value; given twice, the second tenant's for
    /// `tenants` (skipped otherwise).
    #[arg(long, value_name = "VALUE")]
    auth: Vec<String>,
    /// The endpoint runs requests without a key on purpose: skip `missing-key`.
    #[arg(long)]
    key_optional: bool,
    /// Print the verdicts as JSON instead of a table.
    #[arg(long)]
    json: bool,
    /// Show the evidence of every case (by default only of those that did not pass).
    #[arg(long, short = 'v')]
    verbose: bool,
    /// Send to a non-loopback address without asking first.
    #[arg(long, short = 'y')]
    yes: bool,
    /// How long one request may take.
    #[arg(long, default_value = "30s", value_parser = super::durations::parse)]
    timeout: Duration,
}

/// The verdict of one case.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
enum Verdict {
    Pass,
    Fail,
    Differs,
    Skip,
}

impl Verdict {
    fn as_str(self) -> &'static str {
        match self {
            Self::Pass => "pass",
            Self::Fail => "fail",
            Self::Differs => "differs",
            Self::Skip => "skip",
        }
    }
}

/// One request and its answer.
#[derive(Debug, Clone, Serialize)]
struct Exchange {
    request: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    status: Option<u16>,
    /// The answer's headers that matter here (replay markers, `Retry-After`,
    /// `Content-Type`).
    headers: Vec<(String, String)>,
    body: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
}

impl Exchange {
    fn status(&self) -> Option<StatusCode> {
        self.status.and_then(|s| StatusCode::from_u16(s).ok())
    }

    fn success(&self) -> bool {
        self.status().is_some_and(|s| s.is_success())
    }

    fn client_error(&self) -> bool {
        self.status().is_some_and(|s| s.is_client_error())
    }

    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// The replay marker the answer carries, as `Name: value`.
    fn replay_marker(&self) -> Option<String> {
        [IDEMPOTENT_REPLAYED, IDEMPOTENCY_REPLAYED]
            .iter()
            .find_map(|name| {
                self.header(name.as_str())
                    .filter(|v| v.eq_ignore_ascii_case("true"))
                    .map(|v| format!("{}: {v}", display_name(name.as_str())))
            })
    }

    /// `200` or `connection error`.
    fn outcome(&self) -> String {
        match (self.status, &self.error) {
            (Some(s), _) => s.to_string(),
            (None, Some(e)) => format!("no answer ({e})"),
            (None, None) => "no answer".into(),
        }
    }
}

/// `idempotent-replayed` as `Idempotent-Replayed`.
fn display_name(name: &str) -> String {
    name.split('-')
        .map(|part| {
            let mut chars = part.chars();
            chars.next().map_or_else(String::new, |c| {
                c.to_ascii_uppercase().to_string() + chars.as_str()
            })
        })
        .collect::<Vec<_>>()
        .join("-")
}

/// The verdict of one case with its evidence.
#[derive(Debug, Serialize)]
struct Case {
    case: &'static str,
    verdict: Verdict,
    summary: String,
    evidence: Vec<Exchange>,
}

fn case(
    name: &'static str,
    verdict: Verdict,
    summary: impl Into<String>,
    evidence: Vec<Exchange>,
) -> Case {
    Case {
        case: name,
        verdict,
        summary: summary.into(),
        evidence,
    }
}

/// The checker: one client, the request template, a key prefix for this run.
struct Checker {
    client: reqwest::Client,
    url: reqwest::Url,
    method: Method,
    headers: HeaderMap,
    key_header: HeaderName,
    auth: Vec<HeaderValue>,
    run: String,
}

/// The largest body shown in evidence.
const BODY_SHOWN: usize = 400;

impl Checker {
    /// A key of this run for `case` (`tag` tells a case's keys apart).
    fn key(&self, case: &str) -> String {
        format!("idemkey-check-{}-{case}", self.run)
    }

    /// Sends the request with `key` (`None`: without a key header) and `body`, as
    /// tenant `tenant` (its `--auth`, when given).
    async fn send(&self, key: Option<&str>, body: &str, tenant: usize) -> Exchange {
        let mut request = self
            .client
            .request(self.method.clone(), self.url.clone())
            .headers(self.headers.clone())
            .body(body.to_owned());
        let mut label = format!("{} {}", self.method, self.url.path());
        if let Some(auth) = self.auth.get(tenant) {
            request = request.header(reqwest::header::AUTHORIZATION, auth.clone());
            if self.auth.len() > 1 {
                label.push_str(&format!(" tenant={}", ["A", "B"][tenant.min(1)]));
            }
        }
        match key {
            Some(key) => match HeaderValue::from_str(key) {
                Ok(value) => {
                    request = request.header(self.key_header.clone(), value);
                    let shown = if key.len() > 64 {
                        format!("{:?}... ({} characters)", &key[..48], key.len())
                    } else {
                        format!("{key:?}")
                    };
                    label.push_str(&format!(
                        " {}={shown}",
                        display_name(self.key_header.as_str())
                    ));
                }
                Err(_) => label.push_str(" (key not sendable)"),
            },
            None => label.push_str(&format!(" (no {})", display_name(self.key_header.as_str()))),
        }
        label.push_str(&format!(" body={}", shorten(body)));
        match request.send().await {
            Ok(response) => {
                let status = response.status().as_u16();
                let headers = response
                    .headers()
                    .iter()
                    .filter(|(name, _)| {
                        let n = name.as_str();
                        n.contains("replayed") || n.contains("retry-after") || n == "content-type"
                    })
                    .map(|(n, v)| {
                        (
                            display_name(n.as_str()),
                            String::from_utf8_lossy(v.as_bytes()).into_owned(),
                        )
                    })
                    .collect();
                let (body, error) = match response.bytes().await {
                    Ok(b) => (String::from_utf8_lossy(&b).into_owned(), None),
                    Err(e) => (String::new(), Some(format!("the body broke off: {e}"))),
                };
                Exchange {
                    request: label,
                    status: Some(status),
                    headers,
                    body,
                    error,
                }
            }
            Err(e) => Exchange {
                request: label,
                status: None,
                headers: Vec::new(),
                body: String::new(),
                error: Some(error_chain(&e)),
            },
        }
    }
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
}

fn shorten(text: &str) -> String {
    if text.len() <= BODY_SHOWN {
        return text.to_owned();
    }
    let mut end = BODY_SHOWN;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}... ({} bytes)", &text[..end], text.len())
}

/// `--data` and friends: the text itself, or a file's content after `@`.
fn read_data(text: &str) -> Result<String, String> {
    match text.strip_prefix('@') {
        Some(path) => std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read the body file {path:?}: {e}")),
        None => Ok(text.to_owned()),
    }
}

/// Another body than `data`: its first number plus one, or a field added to an object.
fn vary(data: &str) -> Result<String, String> {
    fn bump(v: &mut serde_json::Value) -> bool {
        match v {
            serde_json::Value::Number(n) => {
                let next = n
                    .as_i64()
                    .and_then(|i| i.checked_add(1))
                    .map(serde_json::Value::from)
                    .or_else(|| n.as_f64().map(|f| serde_json::Value::from(f + 1.0)));
                match next {
                    Some(next) => {
                        *v = next;
                        true
                    }
                    None => false,
                }
            }
            serde_json::Value::Object(map) => map.values_mut().any(bump),
            serde_json::Value::Array(items) => items.iter_mut().any(bump),
            _ => false,
        }
    }
    let mut value: serde_json::Value = serde_json::from_str(data).map_err(|e| {
        format!(
            "--data is not JSON ({e}), so no other body can be derived from it: give --other-data"
        )
    })?;
    if !bump(&mut value) {
        match &mut value {
            serde_json::Value::Object(map) => {
                map.insert("idemkey_check".into(), "another request".into());
            }
            _ => {
                return Err(
                    "--data has no number to change and is not an object: give --other-data".into(),
                );
            }
        }
    }
    Ok(value.to_string())
}

fn parse_header(text: &str) -> Result<(HeaderName, HeaderValue), String> {
    let (name, value) = text
        .split_once(':')
        .ok_or_else(|| format!("-H {text:?}: write it as name:value"))?;
    let name = HeaderName::from_bytes(name.trim().as_bytes())
        .map_err(|e| format!("-H {text:?}: bad header name ({e})"))?;
    let value = HeaderValue::from_str(value.trim())
        .map_err(|e| format!("-H {text:?}: bad header value ({e})"))?;
    Ok((name, value))
}

/// Whether `url` names this machine (a loopback address or `localhost`).
fn is_loopback(url: &reqwest::Url) -> bool {
    let host = url.host_str().unwrap_or_default();
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    match bare.parse::<std::net::IpAddr>() {
        Ok(ip) => ip.is_loopback(),
        Err(_) => host == "localhost" || host.ends_with(".localhost"),
    }
}

pub(crate) async fn run(args: CheckArgs) -> Result<u8, String> {
    let url = reqwest::Url::parse(&args.url).map_err(|e| {
        format!(
            "{:?} is not a URL ({e}): give one like http://127.0.0.1:3000/v1/charges",
            args.url
        )
    })?;
    if url.scheme() != "http" {
        return Err(format!(
            "{url}: this build speaks plain http:// only; check an https API through a local \
             TLS-terminating proxy"
        ));
    }
    let data = read_data(&args.data)?;
    let other = match &args.other_data {
        Some(d) => read_data(d)?,
        None => vary(&data)?,
    };
    if other == data {
        return Err("--other-data is the same as --data: key-reuse needs another body".into());
    }
    let slow = args.slow_data.as_deref().map(read_data).transpose()?;
    let fail = args.fail_data.as_deref().map(read_data).transpose()?;
    if args.auth.len() > 2 {
        return Err("--auth is given once (one tenant) or twice (two tenants), not more".into());
    }
    let mut headers = HeaderMap::new();
    headers.insert(
        reqwest::header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    for h in &args.headers {
        let (name, value) = parse_header(h)?;
        headers.insert(name, value);
    }
    let auth = args
        .auth
        .iter()
        .map(|a| HeaderValue::from_str(a).map_err(|e| format!("--auth: bad header value ({e})")))
        .collect::<Result<Vec<_>, _>>()?;
    if !is_loopback(&url) {
        eprintln!(
            "idemkey check: {} is not on this machine. The check sends real requests \
             (about 15): an endpoint that creates resources (charges, orders, emails) will \
             create real ones. Point it at a test environment.",
            url.host_str().unwrap_or_default()
        );
        if !args.yes && !super::confirm("Send them?")? {
            return Err("nothing sent: not confirmed (pass --yes to skip the question)".into());
        }
    }
    let checker = Checker {
        client: reqwest::Client::builder()
            .timeout(args.timeout)
            .build()
            .map_err(|e| format!("cannot build the HTTP client: {e}"))?,
        url,
        method: args.method,
        headers,
        key_header: args.key_header,
        auth,
        run: uuid::Uuid::new_v4().simple().to_string()[..12].to_owned(),
    };

    let mut cases = Vec::new();
    let (replay, first) = replay_case(&checker, &data).await;
    let marker = replay.evidence.get(1).and_then(Exchange::replay_marker);
    cases.push(replay);
    cases.push(key_reuse_case(&checker, first.as_ref(), &other).await);
    cases.push(concurrent_case(&checker, slow.as_deref().unwrap_or(&data)).await);
    cases.push(missing_key_case(&checker, &data, args.key_optional).await);
    cases.push(invalid_key_case(&checker, &data).await);
    cases.push(tenants_case(&checker, &data).await);
    cases.push(server_error_case(&checker, fail.as_deref(), &data, marker.is_some()).await);

    let failed = cases.iter().filter(|c| c.verdict == Verdict::Fail).count();
    if args.json {
        let report = serde_json::json!({
            "url": checker.url.as_str(),
            "failed": failed,
            "cases": cases,
        });
        println!("{report:#}");
    } else {
        print!("{}", table(&cases, args.verbose));
        println!(
            "{failed} of {} cases failed ({} passed, {} differ, {} skipped)",
            cases.len(),
            count(&cases, Verdict::Pass),
            count(&cases, Verdict::Differs),
            count(&cases, Verdict::Skip),
        );
    }
    Ok(u8::try_from(failed).unwrap_or(u8::MAX))
}

fn count(cases: &[Case], verdict: Verdict) -> usize {
    cases.iter().filter(|c| c.verdict == verdict).count()
}

fn table(cases: &[Case], verbose: bool) -> String {
    let mut out = format!("{:<12} {:<8} EVIDENCE\n", "CASE", "RESULT");
    for c in cases {
        out.push_str(&format!(
            "{:<12} {:<8} {}\n",
            c.case,
            c.verdict.as_str(),
            c.summary
        ));
        let shown = if verbose || c.verdict != Verdict::Pass {
            &c.evidence[..]
        } else {
            &[]
        };
        for e in shown {
            out.push_str(&format!("{:21}> {}\n", "", e.request));
            let headers: Vec<_> = e.headers.iter().map(|(n, v)| format!("{n}: {v}")).collect();
            out.push_str(&format!(
                "{:21}< {} {}{}\n",
                "",
                e.outcome(),
                headers.join("; "),
                if e.body.is_empty() {
                    String::new()
                } else {
                    format!(" body={}", shorten(&e.body))
                }
            ));
        }
    }
    out
}

/// Same key, same body, twice: the second answer is the first's, replayed. Returns the
/// first answer when it succeeded (its key is reused by `key-reuse`).
async fn replay_case(c: &Checker, data: &str) -> (Case, Option<(String, Exchange)>) {
    let key = c.key("replay");
    let first = c.send(Some(&key), data, 0).await;
    if !first.success() {
        let summary = format!(
            "the first request got {}: nothing to replay (fix --data, -H or --auth so it succeeds)",
            first.outcome()
        );
        return (case("replay", Verdict::Fail, summary, vec![first]), None);
    }
    let second = c.send(Some(&key), data, 0).await;
    let verdict = if second.status == first.status && second.body == first.body {
        let marker = second
            .replay_marker()
            .map_or_else(|| "no replay marker".to_owned(), |m| format!("marked {m}"));
        (
            Verdict::Pass,
            format!(
                "the retry got the same {} and body, {marker}",
                first.outcome()
            ),
        )
    } else if second.status == first.status {
        (
            Verdict::Fail,
            "the retry got another body: the request ran again".to_owned(),
        )
    } else {
        (
            Verdict::Fail,
            format!(
                "the retry got {} instead of {}",
                second.outcome(),
                first.outcome()
            ),
        )
    };
    let evidence = vec![first.clone(), second];
    (
        case("replay", verdict.0, verdict.1, evidence),
        Some((key, first)),
    )
}

/// The used key with another body: rejected with 422 (the draft) or 400 (Stripe).
async fn key_reuse_case(c: &Checker, used: Option<&(String, Exchange)>, other: &str) -> Case {
    let Some((key, first)) = used else {
        return case(
            "key-reuse",
            Verdict::Skip,
            "needs a key used by a request that succeeded (see replay)",
            Vec::new(),
        );
    };
    let answer = c.send(Some(key), other, 0).await;
    let (verdict, summary) = match answer.status.unwrap_or(0) {
        422 => (
            Verdict::Pass,
            "rejected with 422, as the draft says".to_owned(),
        ),
        400 => (
            Verdict::Pass,
            "rejected with 400, as Stripe does".to_owned(),
        ),
        s if answer.client_error() => (
            Verdict::Differs,
            format!("rejected with {s}, neither 422 (the draft) nor 400 (Stripe)"),
        ),
        _ if answer.success() && answer.body == first.body => (
            Verdict::Fail,
            "the first request's response was replayed to a different request".to_owned(),
        ),
        _ if answer.success() => (
            Verdict::Fail,
            "a different request ran under a used key".to_owned(),
        ),
        _ => (
            Verdict::Fail,
            format!("answered {} instead of rejecting the key", answer.outcome()),
        ),
    };
    case("key-reuse", verdict, summary, vec![answer])
}

/// Duplicates sent at once: one runs, the others get 409 or 423.
async fn concurrent_case(c: &Checker, body: &str) -> Case {
    let key = c.key("concurrent");
    let (a, b, d) = tokio::join!(
        c.send(Some(&key), body, 0),
        c.send(Some(&key), body, 0),
        c.send(Some(&key), body, 0)
    );
    let answers = vec![a, b, d];
    let conflict = answers.iter().find(|e| matches!(e.status, Some(409 | 423)));
    let ran: Vec<_> = answers.iter().filter(|e| e.success()).collect();
    let (verdict, summary) = if let Some(conflict) = conflict {
        let retry = conflict.header("retry-after").map_or_else(
            || "without Retry-After".to_owned(),
            |v| format!("with Retry-After: {v}"),
        );
        (
            Verdict::Pass,
            format!("a duplicate got {} {retry}", conflict.outcome()),
        )
    } else if ran.len() > 1 && ran.iter().any(|e| e.body != ran[0].body) {
        (
            Verdict::Fail,
            format!("{} duplicates ran, with different answers", ran.len()),
        )
    } else if ran.len() == answers.len() {
        (
            Verdict::Differs,
            "every duplicate got the same answer: they did not meet a running request, or waited \
             for it (give --slow-data a body the endpoint answers slowly)"
                .to_owned(),
        )
    } else {
        (Verdict::Differs, "no duplicate got 409 or 423".to_owned())
    };
    case("concurrent", verdict, summary, answers)
}

/// No key: rejected when keys are required.
async fn missing_key_case(c: &Checker, data: &str, optional: bool) -> Case {
    if optional {
        return case(
            "missing-key",
            Verdict::Skip,
            "--key-optional: the endpoint runs requests without a key",
            Vec::new(),
        );
    }
    let answer = c.send(None, data, 0).await;
    let (verdict, summary) = if answer.client_error() {
        (Verdict::Pass, format!("rejected with {}", answer.outcome()))
    } else if answer.success() {
        (
            Verdict::Fail,
            "ran without a key (pass --key-optional if that is intended)".to_owned(),
        )
    } else {
        (Verdict::Differs, format!("answered {}", answer.outcome()))
    };
    case("missing-key", verdict, summary, vec![answer])
}

/// Keys no conforming server accepts: 256 characters; a control character (a tab inside).
async fn invalid_key_case(c: &Checker, data: &str) -> Case {
    let long = format!("{}-{}", c.key("long"), "k".repeat(256))
        .chars()
        .take(256)
        .collect::<String>();
    let control = format!("{}\tctl", c.key("control"));
    let answers = vec![
        c.send(Some(&long), data, 0).await,
        c.send(Some(&control), data, 0).await,
    ];
    let accepted: Vec<_> = answers.iter().filter(|e| e.success()).collect();
    let (verdict, summary) = if answers.iter().all(Exchange::client_error) {
        (
            Verdict::Pass,
            format!(
                "rejected a 256-character key ({}) and a key with a tab ({})",
                answers[0].outcome(),
                answers[1].outcome()
            ),
        )
    } else if !accepted.is_empty() {
        let which: Vec<_> = [
            ("the 256-character key", &answers[0]),
            ("the key with a tab", &answers[1]),
        ]
        .into_iter()
        .filter(|(_, e)| e.success())
        .map(|(w, _)| w)
        .collect();
        (Verdict::Fail, format!("accepted {}", which.join(" and ")))
    } else {
        (
            Verdict::Differs,
            format!(
                "answered {} and {}",
                answers[0].outcome(),
                answers[1].outcome()
            ),
        )
    };
    case("invalid-key", verdict, summary, answers)
}

/// One key, two tenants: each runs its own request.
async fn tenants_case(c: &Checker, data: &str) -> Case {
    if c.auth.len() < 2 {
        return case(
            "tenants",
            Verdict::Skip,
            "give --auth twice, one credential per tenant",
            Vec::new(),
        );
    }
    let key = c.key("tenants");
    let a = c.send(Some(&key), data, 0).await;
    if !a.success() {
        let summary = format!("tenant A's request got {}: nothing to compare", a.outcome());
        return case("tenants", Verdict::Fail, summary, vec![a]);
    }
    let b = c.send(Some(&key), data, 1).await;
    let (verdict, summary) = if b.success() && (b.body == a.body || b.replay_marker().is_some()) {
        (
            Verdict::Fail,
            "tenant B got tenant A's response replayed".to_owned(),
        )
    } else if b.success() {
        (
            Verdict::Pass,
            "tenant B's request ran on its own".to_owned(),
        )
    } else if b.client_error() {
        (
            Verdict::Differs,
            format!(
                "tenant B was refused with {}: keys are shared between tenants",
                b.outcome()
            ),
        )
    } else {
        (Verdict::Fail, format!("tenant B got {}", b.outcome()))
    };
    case("tenants", verdict, summary, vec![a, b])
}

/// A 5xx is not stored: the same request runs again, and the key is free for another.
async fn server_error_case(
    c: &Checker,
    fail: Option<&str>,
    data: &str,
    marks_replays: bool,
) -> Case {
    let Some(fail) = fail else {
        return case(
            "5xx",
            Verdict::Skip,
            "give --fail-data a body the endpoint answers with a 5xx",
            Vec::new(),
        );
    };
    let key = c.key("5xx");
    let first = c.send(Some(&key), fail, 0).await;
    if !first.status().is_some_and(|s| s.is_server_error()) {
        let summary = format!("--fail-data got {}, not a 5xx", first.outcome());
        return case("5xx", Verdict::Differs, summary, vec![first]);
    }
    let again = c.send(Some(&key), fail, 0).await;
    let then = c.send(Some(&key), data, 0).await;
    let (verdict, summary) = if let Some(marker) = again.replay_marker() {
        (
            Verdict::Fail,
            format!("the 5xx was stored: its retry was replayed ({marker})"),
        )
    } else if !then.success() {
        (
            Verdict::Fail,
            format!(
                "the key stayed bound to the failed request: --data with it got {}",
                then.outcome()
            ),
        )
    } else if !marks_replays && again.body == first.body && again.status == first.status {
        (
            Verdict::Pass,
            "the key was free after the 5xx (the endpoint marks no replays, so the retry's \
             identical 5xx cannot be told from a replay)"
                .to_owned(),
        )
    } else {
        (
            Verdict::Pass,
            "the retry ran again, and the key was free after the 5xx".to_owned(),
        )
    };
    case("5xx", verdict, summary, vec![first, again, then])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn another_body_changes_the_first_number_or_adds_a_field() {
        assert_eq!(
            vary(r#"{"amount":100,"currency":"eur"}"#).expect("varied"),
            r#"{"amount":101,"currency":"eur"}"#
        );
        assert_eq!(
            vary(r#"{"items":[{"qty":1.5}]}"#).expect("varied"),
            r#"{"items":[{"qty":2.5}]}"#
        );
        assert_eq!(
            vary(r#"{"name":"x"}"#).expect("varied"),
            r#"{"idemkey_check":"another request","name":"x"}"#
        );
        assert!(
            vary("amount=100")
                .expect_err("not JSON")
                .contains("--other-data")
        );
        assert!(vary(r#""text""#).is_err());
    }

    #[test]
    fn loopback_addresses_are_this_machine() {
        let url = |u: &str| reqwest::Url::parse(u).expect("a URL");
        assert!(is_loopback(&url("http://127.0.0.1:3000/")));
        assert!(is_loopback(&url("http://127.8.0.1/")));
        assert!(is_loopback(&url("http://[::1]:80/")));
        assert!(is_loopback(&url("http://localhost/")));
        assert!(!is_loopback(&url("http://api.example.com/")));
        assert!(!is_loopback(&url("http://10.0.0.1/")));
    }

    #[test]
    fn header_names_are_shown_capitalised() {
        assert_eq!(display_name("idempotent-replayed"), "Idempotent-Replayed");
        assert_eq!(display_name("retry-after"), "Retry-After");
    }
}
