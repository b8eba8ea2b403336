//! `idemkey inspect STORE_URL --scope S --key K`: what a store holds for one key.

use std::time::SystemTime;

use idemkey::store::{RecordInfo, RecordState};

/// Look up the record of one key: its state, fingerprint, times and stored size.
///
/// Records are addressed as requests address them, by scope and key hashed together,
/// so give the scope the verifier used (the value of its scope header, such as the
/// whole `Authorization` header; nothing for an unscoped verifier).
#[derive(Debug, clap::Args)]
pub(crate) struct InspectArgs {
    /// The store: redis://, postgres://, sqlite://PATH, mysql:// or dynamodb://TABLE
    /// (each needs its idemkey feature).
    store: String,
    /// The scope the key was used in (default: unscoped).
    #[arg(long, default_value = "")]
    scope: String,
    /// The idempotency key.
    #[arg(long)]
    key: String,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
}

pub(crate) async fn run(args: InspectArgs) -> Result<(), String> {
    let engine = super::open_store(&args.store).await?;
    let info = engine
        .inspect(&args.scope, &args.key)
        .await
        .map_err(|e| format!("the store could not look the key up: {e}"))?;
    match (info, args.json) {
        (None, true) => println!("null"),
        (None, false) => println!(
            "no record of key {:?} in scope {:?}: never used, expired or released",
            args.key, args.scope
        ),
        (Some(info), true) => println!("{}", to_json(&info)),
        (Some(info), false) => print!("{}", to_text(&info)),
    }
    Ok(())
}

/// `"in-progress"`, `"stuck"` (a claim whose lease ran out) or `"completed"`.
pub(crate) fn state(info: &RecordInfo, now: SystemTime) -> &'static str {
    match info.state {
        RecordState::InProgress if info.expires <= now => "stuck",
        RecordState::InProgress => "in-progress",
        _ => "completed",
    }
}

fn seconds(t: SystemTime) -> f64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// One record as a JSON object.
pub(crate) fn to_json(info: &RecordInfo) -> serde_json::Value {
    let now = SystemTime::now();
    serde_json::json!({
        "id": info.id.to_hex(),
        "state": state(info, now),
        "fingerprint": hex::encode(&info.fingerprint),
        "created_unix": seconds(info.created),
        "expires_unix": seconds(info.expires),
        "age_ms": now.duration_since(info.created).map_or(0, |d| d.as_millis() as u64),
        "payload_bytes": info.payload_len,
    })
}

fn to_text(info: &RecordInfo) -> String {
    let now = SystemTime::now();
    let age = now.duration_since(info.created).unwrap_or_default();
    let until = match info.expires.duration_since(now) {
        Ok(left) => format!("in {}", super::durations::show(left)),
        Err(e) => format!("{} ago", super::durations::show(e.duration())),
    };
    let ends = match info.state {
        RecordState::InProgress => "lease ends",
        _ => "kept until",
    };
    let mut out = format!(
        "record      {}\nstate       {}\nfingerprint {}\nclaimed     {} ago\n{ends:<11} {until}\n",
        info.id.to_hex(),
        state(info, now),
        hex::encode(&info.fingerprint),
        super::durations::show(age),
    );
    if let Some(len) = info.payload_len {
        out.push_str(&format!("stored      {len} bytes\n"));
    }
    out
}
