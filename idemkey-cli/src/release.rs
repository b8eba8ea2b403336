//! `idemkey release STORE_URL --scope S --key K`: free a stuck key, forget a record.

use idemkey::store::RecordId;

/// Remove the record of one key, whatever its state: a stuck claim is freed at once
/// (its owner, if it still runs, is fenced and cannot complete it afterwards) and a
/// completed record is forgotten, so the next request with the key runs again.
///
/// Asks for confirmation unless `--yes`.
#[derive(Debug, clap::Args)]
pub(crate) struct ReleaseArgs {
    /// The store: redis://, postgres://, sqlite://PATH, mysql:// or dynamodb://TABLE.
    store: String,
    /// The scope the key was used in (default: unscoped).
    #[arg(long, default_value = "", conflicts_with = "id")]
    scope: String,
    /// The idempotency key.
    #[arg(long, required_unless_present = "id")]
    key: Option<String>,
    /// The record's id instead of scope and key (64 hex digits, as `idemkey stuck`
    /// lists them).
    #[arg(long)]
    id: Option<String>,
    /// Release without asking.
    #[arg(long, short = 'y')]
    yes: bool,
}

pub(crate) async fn run(args: ReleaseArgs) -> Result<(), String> {
    let (id, what) = match (&args.id, &args.key) {
        (Some(hex_id), _) => (parse_id(hex_id)?, format!("record {hex_id}")),
        (None, Some(key)) => (
            RecordId::new(&args.scope, key),
            format!("key {key:?} in scope {:?}", args.scope),
        ),
        (None, None) => return Err("give --key (and --scope) or --id".into()),
    };
    let engine = super::open_store(&args.store).await?;
    if !args.yes
        && !super::confirm(&format!(
            "release {what}? A request with it will run again."
        ))?
    {
        return Err("not released: not confirmed (pass --yes to skip the question)".into());
    }
    let removed = engine
        .store()
        .force_release(&id)
        .await
        .map_err(|e| format!("the store could not release {what}: {e}"))?;
    if removed {
        println!("released {what}");
    } else {
        println!("no record of {what}: nothing to release");
    }
    Ok(())
}

fn parse_id(text: &str) -> Result<RecordId, String> {
    let mut bytes = [0u8; 32];
    hex::decode_to_slice(text.trim(), &mut bytes)
        .map_err(|e| format!("--id {text:?} is not a record id ({e}): give 64 hex digits"))?;
    Ok(RecordId::from_bytes(bytes))
}
