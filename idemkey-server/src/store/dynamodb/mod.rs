//! The shared store on Amazon DynamoDB (feature `dynamodb`). See [`DynamoStore`].

mod chunks;
mod item;
mod schema;
mod url;

use std::collections::HashMap;
use std::time::Duration;

use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::error::{DisplayErrorContext, ProvideErrorMetadata, SdkError};
use aws_sdk_dynamodb::operation::put_item::PutItemError;
use aws_sdk_dynamodb::operation::update_item::UpdateItemError;
use aws_sdk_dynamodb::types::{AttributeValue, ReturnValue, ReturnValuesOnConditionCheckFailure};
use bytes::Bytes;

use self::item::{Item, blob, ms, names, now_ms, num, string};
use super::{
    Claim, ClaimRequest, FencingToken, RecordId, RecordInfo, RecordState, Store, StoreError,
};

/// The default table name.
const DEFAULT_TABLE: &str = "idemkey_records";

/// The largest payload kept in the record's own item, and the size of one chunk item.
/// Well below the 400 KB item limit even when a server counts binary values by their
/// base64 form (as some DynamoDB-compatible servers do).
const CHUNK: usize = 256 * 1024;
/// The largest fingerprint a claim accepts (with it and a full inline payload, the item
/// stays far below 400 KB).
const MAX_FINGERPRINT: usize = 16 * 1024;
/// How many chunk items are written or read at once.
const CHUNK_CONCURRENCY: usize = 8;
/// The longest lease or retention, in milliseconds: 100 years ("forever").
const MAX_MS: u64 = 100 * 365 * 24 * 3600 * 1000;
/// How often a claim starts over when the record vanished between its write and its
/// read (a concurrent release or force-release), before it gives up.
const CLAIM_ATTEMPTS: usize = 3;

/// Attribute names; every expression refers to attribute `x` as `#x`.
mod attr {
    pub(super) const ID: &str = "id";
    pub(super) const STATE: &str = "state";
    pub(super) const FINGERPRINT: &str = "fingerprint";
    pub(super) const TOKEN: &str = "token";
    pub(super) const CREATED: &str = "created";
    pub(super) const EXPIRES: &str = "expires";
    pub(super) const KEEP_UNTIL: &str = "keep_until";
    pub(super) const TTL: &str = "ttl";
    pub(super) const PAYLOAD: &str = "payload";
    pub(super) const CHUNKS: &str = "chunks";
    pub(super) const PAYLOAD_LEN: &str = "payload_len";
    pub(super) const WRITE: &str = "write";
    pub(super) const CHUNK: &str = "chunk";
    pub(super) const KEEP_MS: &str = "keep_ms";
    pub(super) const KEEP_S: &str = "keep_s";
}

const IN_PROGRESS: &str = "in_progress";
const COMPLETED: &str = "completed";

/// A store shared by every instance of an application through one DynamoDB table.
///
/// Cheap to clone (clones share the SDK client). Throttling, timeouts and unreachable
/// endpoints are [`StoreError::is_unavailable`] once the SDK's own retries are spent,
/// so the verifier answers 503 and resumes by itself. Below: the table,
/// the operations, the clock, items over 400 KB, global tables and permissions.
///
/// Build it from an SDK client you configured (credentials, region, retries), usually
/// with `aws-config`, or from a connection string with [`DynamoStore::from_url`]:
///
/// ```no_run
/// use idemkey::store::DynamoStore;
/// use idemkey::store::aws_sdk_dynamodb::Client;
///
/// # async fn demo(client: Client) -> Result<(), idemkey::store::StoreError> {
/// // With aws-config: let client = Client::new(&aws_config::load_from_env().await);
/// let store = DynamoStore::builder(client)
///     .table("payments_idempotency")
///     .build()?;
/// store.create_table().await?; // once, or in your infrastructure code
/// # Ok(()) }
/// ```
///
/// # Table
///
/// One table (default `idemkey_records`) whose partition key is `id`, a binary attribute,
/// with no sort key, and with DynamoDB's Time to Live on the number attribute `ttl`.
/// [`DynamoStore::create_table`] creates it (on-demand capacity) and turns TTL on, or
/// does it yourself:
///
/// ```sh
/// aws dynamodb create-table --table-name idemkey_records \
///     --attribute-definitions AttributeName=id,AttributeType=B \
///     --key-schema AttributeName=id,KeyType=HASH --billing-mode PAY_PER_REQUEST
/// aws dynamodb update-time-to-live --table-name idemkey_records \
///     --time-to-live-specification Enabled=true,AttributeName=ttl
/// ```
///
/// A record is one item:
///
/// | attribute | type | holds |
/// |---|---|---|
/// | `id` | B | the [`RecordId`] (32 bytes: SHA-256 of scope and key; raw keys are never stored) |
/// | `state` | S | `in_progress` or `completed` |
/// | `fingerprint` | B | the claim's fingerprint |
/// | `token` | B | the owner's [`FencingToken`] (in progress only) |
/// | `created` | N | when the claim was made, in milliseconds since the Unix epoch |
/// | `expires` | N | end of the lease (in progress) or of the retention (completed), in ms |
/// | `keep_until` | N | end of the item's life, in ms: `expires` for a completed record; for a claim the lease plus the claim's retention, so that its owner can still complete it and a takeover is told apart from a fresh claim |
/// | `ttl` | N | `keep_until` in seconds, for DynamoDB's TTL |
/// | `keep_ms`, `keep_s` | N, N | how long a claim is kept past its lease, in ms and s (so that a renewal keeps it too) |
/// | `payload` | B | the completed payload, when it fits in the item |
/// | `chunks`, `payload_len`, `write` | N, N, B | a payload kept in chunk items instead (below) |
///
/// # Operations
///
/// - **Claim**: one conditional `PutItem` (condition `attribute_not_exists(id) OR expires
///   <= :now`) with `ReturnValues = ALL_OLD` and `ReturnValuesOnConditionCheckFailure =
///   ALL_OLD`. The claim that wins learns from the old item whether it took a lease
///   over; a claim that loses gets the live item in the failure reply: one round trip
///   either way (plus the chunk reads of a chunked payload).
/// - **Complete, renew, release**: `UpdateItem`/`DeleteItem` conditional on
///   `token = :token AND state = in_progress AND keep_until > :now`: an owner replaced
///   by another claim changes nothing and gets [`StoreError::is_fenced`], and an owner
///   whose lease ended but whom nobody took over still records its outcome.
/// - **Inspect**: one strongly consistent `GetItem`; **force release**: one `DeleteItem`
///   (plus the chunks of a chunked payload); **list in progress**: a `Scan` of the
///   whole table with a filter (operators only: it reads every item).
/// - Expired items count as absent at once (a claim's condition compares with
///   `expires`, the owner's writes and `inspect` with `keep_until`); DynamoDB's TTL
///   deletes them later (typically within days), so [`Store::sweep`] has
///   nothing to do and returns `Ok(0)`.
/// - Reads (the chunks of a payload) are strongly consistent.
///
/// A fresh request costs 2 requests (claim, complete), a replay 1.
///
/// The SDK retries a request whose answer was lost; a retried claim or completion
/// recognises its own earlier success (the token it wrote, the completion id it wrote)
/// instead of reporting a conflict.
///
/// # The clock
///
/// DynamoDB conditions cannot read a server clock: the time in every condition is this
/// process's wall clock (`SystemTime`), passed as a value. Leases are therefore decided
/// by the clocks of the application's instances, and a clock that runs ahead by `d`
/// takes a lease over `d` early: with skewed clocks the store can let a second request
/// run while the first one's lease still has up to `d` left (by the first one's clock).
/// Keep the instances' clocks synchronised (NTP, as on AWS compute by default: skew is
/// then in milliseconds) and leases much longer than any skew you expect; the engine's
/// default lease (seconds) renewed every third of it leaves ample margin.
///
/// # Items over 400 KB
///
/// DynamoDB refuses items over 400 KB. A payload over 256 KiB is therefore kept in
/// chunk items of up to 256 KiB each (key: the record id, a completion id and the chunk
/// number), written before the completion that names them, with the record's `ttl`; the
/// record then holds the chunk count, the payload's length and the completion id. A
/// claim that finds such a record reads the chunks (strongly consistent, several at a
/// time). There is no size limit of the store's own, but every KB is a write unit
/// (1 MiB costs about 1,000 write units, and 128 read units per replay): keep the
/// verifier's stored-response limit (1 MiB by default) as low as your responses allow.
/// Chunks left by a completion that was fenced are deleted, and expire by TTL in any
/// case. Fingerprints are limited to 16 KiB (the engine's are 33 bytes).
///
/// # Global tables
///
/// In a global table's default mode (multi-Region eventual consistency) a conditional
/// write is checked against the Region's own replica only, and concurrent writes in two
/// Regions are settled by "last writer wins": two requests with the same key, claimed in
/// two Regions at once, would both run. Home the records to one Region: every instance
/// of the application uses the same Region's endpoint for this table (and moves to
/// another Region only as a deliberate failover). A table with multi-Region strong
/// consistency evaluates conditions across Regions and can take claims anywhere.
///
/// # Permissions
///
/// `dynamodb:PutItem`, `UpdateItem`, `DeleteItem` and `GetItem` on the table; for
/// [`DynamoStore::create_table`] also `CreateTable`, `DescribeTable`,
/// `UpdateTimeToLive` and `DescribeTimeToLive`; for listing stuck keys `Scan`.
#[derive(Clone)]
pub struct DynamoStore {
    client: Client,
    table: String,
}

/// Configures a [`DynamoStore`]; made by [`DynamoStore::builder`].
#[derive(Clone, Debug)]
pub struct DynamoStoreBuilder {
    client: Client,
    table: String,
}

impl DynamoStoreBuilder {
    /// The table (default `idemkey_records`): 3 to 255 letters, digits, `_`, `-` or `.`.
    #[must_use]
    pub fn table(mut self, table: impl Into<String>) -> Self {
        self.table = table.into();
        self
    }

    /// Builds the store. No request is made: see [`DynamoStore::create_table`].
    ///
    /// # Errors
    ///
    /// [`StoreError::is_unavailable`] when the table name is not a valid DynamoDB name.
    pub fn build(self) -> Result<DynamoStore, StoreError> {
        let valid = (3..=255).contains(&self.table.len())
            && self
                .table
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"_-.".contains(&b));
        if !valid {
            return Err(StoreError::unavailable(
                format!("invalid DynamoDB table name {:?}", self.table),
                "use 3 to 255 letters, digits, '_', '-' or '.'",
            ));
        }
        Ok(DynamoStore {
            client: self.client,
            table: self.table,
        })
    }
}

impl DynamoStore {
    /// A builder for a store that uses `client` (its region, credentials, endpoint,
    /// retries and timeouts).
    #[must_use]
    pub fn builder(client: Client) -> DynamoStoreBuilder {
        DynamoStoreBuilder {
            client,
            table: DEFAULT_TABLE.to_owned(),
        }
    }

    /// The SDK client, for health checks and administration.
    #[must_use]
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// The table's name.
    #[must_use]
    pub fn table(&self) -> &str {
        &self.table
    }

    async fn claim_item(&self, req: ClaimRequest<'_>) -> Result<Claim, StoreError> {
        let retention = req.retention;
        if req.fingerprint.len() > MAX_FINGERPRINT {
            return Err(StoreError::unavailable(
                format!(
                    "DynamoDB: a fingerprint of {} bytes is over this store's limit of {MAX_FINGERPRINT}",
                    req.fingerprint.len()
                ),
                "use idemkey's fingerprints (33 bytes)",
            ));
        }
        for _ in 0..CLAIM_ATTEMPTS {
            let now = now_ms();
            let expires = now.saturating_add(ms(req.lease));
            let keep = expires.saturating_add(ms(retention));
            let put = self
                .client
                .put_item()
                .table_name(&self.table)
                .item(attr::ID, blob(req.id.as_bytes()))
                .item(attr::STATE, string(IN_PROGRESS))
                .item(attr::FINGERPRINT, blob(req.fingerprint))
                .item(attr::TOKEN, blob(&req.token.to_bytes()))
                .item(attr::CREATED, num(now))
                .item(attr::EXPIRES, num(expires))
                .item(attr::KEEP_UNTIL, num(keep))
                .item(attr::TTL, num(keep.div_ceil(1000)))
                .item(attr::KEEP_MS, num(ms(retention)))
                .item(attr::KEEP_S, num(ms(retention).div_ceil(1000)))
                .condition_expression("attribute_not_exists(#id) OR #expires <= :now")
                .set_expression_attribute_names(names(&[attr::ID, attr::EXPIRES]))
                .expression_attribute_values(":now", num(now))
                .return_values(ReturnValue::AllOld)
                .return_values_on_condition_check_failure(
                    ReturnValuesOnConditionCheckFailure::AllOld,
                )
                .send()
                .await;
            let existing = match put {
                Ok(out) => {
                    let takeover = out
                        .attributes()
                        .is_some_and(|old| Item(old).state().ok() == Some(RecordState::InProgress));
                    return Ok(Claim::Acquired { takeover });
                }
                Err(e) => match e.as_service_error() {
                    Some(PutItemError::ConditionalCheckFailedException(c)) => c.item().cloned(),
                    _ => return Err(self.failed("claiming a record", e)),
                },
            };
            // A server that leaves the item out of the failure: read it.
            let existing = match existing {
                Some(item) => Some(item),
                None => self.get(req.id.as_bytes()).await?,
            };
            if let Some(existing) = existing
                && let Some(claim) = self.lost_claim(&Item(&existing), req.token, now).await?
            {
                return Ok(claim);
            }
            // The record vanished since the condition failed: claim again.
        }
        Err(StoreError::unavailable(
            format!(
                "DynamoDB: record {} changed under {CLAIM_ATTEMPTS} claims in a row",
                req.id
            ),
            "retry the request",
        ))
    }

    /// What a claim whose condition failed on `item` returns; `None` when a chunk of its
    /// payload is gone (the record was removed meanwhile) and the claim must start over.
    async fn lost_claim(
        &self,
        item: &Item<'_>,
        token: FencingToken,
        now: u64,
    ) -> Result<Option<Claim>, StoreError> {
        let fingerprint = item.bytes(attr::FINGERPRINT)?;
        match item.state()? {
            RecordState::InProgress if item.token()? == token => {
                // The SDK retried a claim whose first attempt had succeeded.
                Ok(Some(Claim::Acquired { takeover: false }))
            }
            RecordState::InProgress => Ok(Some(Claim::InProgress {
                fingerprint,
                lease_remaining: Duration::from_millis(
                    item.num(attr::EXPIRES)?.saturating_sub(now),
                ),
            })),
            RecordState::Completed => {
                Ok(self.payload(item).await?.map(|payload| Claim::Completed {
                    fingerprint,
                    payload,
                }))
            }
        }
    }

    /// A strongly consistent read of one item.
    async fn get(&self, key: &[u8]) -> Result<Option<HashMap<String, AttributeValue>>, StoreError> {
        let out = self
            .client
            .get_item()
            .table_name(&self.table)
            .key(attr::ID, blob(key))
            .consistent_read(true)
            .send()
            .await
            .map_err(|e| self.failed("reading a record", e))?;
        Ok(out.item)
    }

    /// The condition that `:token` holds the record at `:now`, and the attributes it
    /// names: the token is the owner's, the record in progress, and within its life
    /// (`keep_until`: also after the lease, until another claim takes it over, contract
    /// rule 3).
    fn held() -> (&'static str, [&'static str; 3]) {
        (
            "#token = :token AND #state = :in_progress AND #keep_until > :now",
            [attr::TOKEN, attr::STATE, attr::KEEP_UNTIL],
        )
    }

    /// The values of [`DynamoStore::held`]'s condition.
    fn held_values(token: FencingToken, now: u64) -> [(&'static str, AttributeValue); 3] {
        [
            (":token", blob(&token.to_bytes())),
            (":in_progress", string(IN_PROGRESS)),
            (":now", num(now)),
        ]
    }

    /// What the store holds for `id` ([`Store::inspect`]): `None` when nothing, or
    /// only a record past its life (a completed record past its retention,
    /// an abandoned claim past lease and retention). An in-progress record whose lease
    /// ended is shown, with `expires` in the past. One strongly consistent read.
    async fn inspect_item(&self, id: &RecordId) -> Result<Option<RecordInfo>, StoreError> {
        let Some(item) = self.get(id.as_bytes()).await? else {
            return Ok(None);
        };
        let item = Item(&item);
        if item.num(attr::KEEP_UNTIL)? <= now_ms() {
            return Ok(None);
        }
        item.info(*id).map(Some)
    }

    /// Removes the record whatever its state or token ([`Store::force_release`]);
    /// `true` when there was one. Its owner is fenced afterwards, and the next claim
    /// executes anew.
    async fn force_release_item(&self, id: &RecordId) -> Result<bool, StoreError> {
        let old = self
            .client
            .delete_item()
            .table_name(&self.table)
            .key(attr::ID, blob(id.as_bytes()))
            .return_values(ReturnValue::AllOld)
            .send()
            .await
            .map_err(|e| self.failed("removing a record", e))?
            .attributes;
        let Some(old) = old else {
            return Ok(false);
        };
        let old = Item(&old);
        if let (Ok(write), Ok(count)) = (old.bytes(attr::WRITE), old.num(attr::CHUNKS)) {
            self.delete_chunks(id.as_bytes(), &write, count).await;
        }
        Ok(old.num(attr::KEEP_UNTIL)? > now_ms())
    }

    /// Up to `limit` in-progress records, live or with an expired lease, oldest claim
    /// first ([`Store::list_in_progress`]). This is a strongly consistent
    /// `Scan` with a filter: it reads (and is billed for) the whole table, chunk items
    /// included, so run it for operators, not on a request's path.
    async fn scan_in_progress(&self, limit: usize) -> Result<Vec<RecordInfo>, StoreError> {
        let now = now_ms();
        let mut found = Vec::new();
        let mut start = None;
        loop {
            let page = self
                .client
                .scan()
                .table_name(&self.table)
                .consistent_read(true)
                .filter_expression("#state = :in_progress AND #keep_until > :now")
                .projection_expression("#id, #state, #fingerprint, #created, #expires, #keep_until")
                .set_expression_attribute_names(names(&[
                    attr::ID,
                    attr::STATE,
                    attr::FINGERPRINT,
                    attr::CREATED,
                    attr::EXPIRES,
                    attr::KEEP_UNTIL,
                ]))
                .expression_attribute_values(":in_progress", string(IN_PROGRESS))
                .expression_attribute_values(":now", num(now))
                .set_exclusive_start_key(start)
                .send()
                .await
                .map_err(|e| self.failed("listing records in progress", e))?;
            for item in page.items() {
                let item = Item(item);
                let id: [u8; 32] = item.bytes(attr::ID)?.as_ref().try_into().map_err(|_| {
                    StoreError::corrupt("DynamoDB: an in-progress item's id is not 32 bytes")
                })?;
                found.push(item.info(RecordId::from_bytes(id))?);
            }
            start = page.last_evaluated_key;
            if start.is_none() {
                break;
            }
        }
        found.sort_by(|a, b| a.created.cmp(&b.created).then(a.id.cmp(&b.id)));
        found.truncate(limit);
        Ok(found)
    }

    /// A failed SDK call: the store is unavailable (the SDK already retried what it
    /// retries).
    fn failed<E, R>(&self, what: &str, e: SdkError<E, R>) -> StoreError
    where
        E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
        R: std::fmt::Debug + Send + Sync + 'static,
    {
        let hint = if e.code() == Some("ResourceNotFoundException") {
            format!(
                " (is there a table {:?}? DynamoStore::create_table makes it)",
                self.table
            )
        } else {
            String::new()
        };
        let message = format!("DynamoDB: {what} failed: {}{hint}", DisplayErrorContext(&e));
        StoreError::unavailable(message, e)
    }
}

#[async_trait::async_trait]
impl Store for DynamoStore {
    fn kind(&self) -> &'static str {
        "dynamodb"
    }

    async fn claim(&self, req: ClaimRequest<'_>) -> Result<Claim, StoreError> {
        self.claim_item(req).await
    }

    async fn complete(
        &self,
        id: &RecordId,
        token: FencingToken,
        payload: Bytes,
        retention: Duration,
    ) -> Result<(), StoreError> {
        let now = now_ms();
        let until = now.saturating_add(ms(retention));
        // Names this completion, so that a retried request recognises its own success.
        let write = FencingToken::random().to_bytes();
        let chunked = payload.len() > CHUNK;
        let count = payload.len().div_ceil(CHUNK) as u64;
        if chunked {
            self.write_chunks(id, &write, &payload, until).await?;
        }
        let (condition, _) = Self::held();
        let (body, kept, dropped) = if chunked {
            (num(count), attr::CHUNKS, attr::PAYLOAD)
        } else {
            (blob(&payload), attr::PAYLOAD, attr::CHUNKS)
        };
        let mut values =
            HashMap::from(Self::held_values(token, now).map(|(k, v)| (k.to_owned(), v)));
        values.extend(
            [
                (":completed", string(COMPLETED)),
                (":until", num(until)),
                (":ttl", num(until.div_ceil(1000))),
                (":write", blob(&write)),
                (":len", num(payload.len() as u64)),
                (":body", body),
            ]
            .map(|(k, v)| (k.to_owned(), v)),
        );
        let updated = self
            .client
            .update_item()
            .table_name(&self.table)
            .key(attr::ID, blob(id.as_bytes()))
            .update_expression(format!(
                "SET #state = :completed, #expires = :until, #keep_until = :until, #ttl = :ttl, \
                 #write = :write, #payload_len = :len, #{kept} = :body REMOVE #token, #{dropped}"
            ))
            .condition_expression(condition)
            .set_expression_attribute_names(names(&[
                attr::STATE,
                attr::EXPIRES,
                attr::KEEP_UNTIL,
                attr::TTL,
                attr::WRITE,
                attr::PAYLOAD_LEN,
                attr::PAYLOAD,
                attr::CHUNKS,
                attr::TOKEN,
            ]))
            .set_expression_attribute_values(Some(values))
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
            .send()
            .await;
        let result = match updated {
            Ok(_) => Ok(()),
            Err(e) => match e.as_service_error() {
                Some(UpdateItemError::ConditionalCheckFailedException(c)) => {
                    // Did the SDK retry a completion whose first attempt had succeeded?
                    let ours = c.item().is_some_and(|item| {
                        let item = Item(item);
                        item.state().ok() == Some(RecordState::Completed)
                            && item.bytes(attr::WRITE).ok().as_deref() == Some(&write[..])
                    });
                    if ours {
                        Ok(())
                    } else {
                        Err(StoreError::fenced())
                    }
                }
                _ => Err(self.failed("completing a record", e)),
            },
        };
        if chunked && result.is_err() {
            self.delete_chunks(id.as_bytes(), &write, count).await;
        }
        result
    }

    async fn renew(
        &self,
        id: &RecordId,
        token: FencingToken,
        lease: Duration,
    ) -> Result<(), StoreError> {
        let now = now_ms();
        let expires = now.saturating_add(ms(lease));
        let (condition, _) = Self::held();
        let mut values =
            HashMap::from(Self::held_values(token, now).map(|(k, v)| (k.to_owned(), v)));
        values.extend(
            [
                (":expires", num(expires)),
                (":expires_s", num(expires.div_ceil(1000))),
            ]
            .map(|(k, v)| (k.to_owned(), v)),
        );
        // The claim's own keep past the lease carries over (ttl may come out up to a
        // second late: it only schedules DynamoDB's deletion).
        let renewed = self
            .client
            .update_item()
            .table_name(&self.table)
            .key(attr::ID, blob(id.as_bytes()))
            .update_expression(
                "SET #expires = :expires, #keep_until = :expires + #keep_ms, \
                 #ttl = :expires_s + #keep_s",
            )
            .condition_expression(condition)
            .set_expression_attribute_names(names(&[
                attr::TOKEN,
                attr::STATE,
                attr::EXPIRES,
                attr::KEEP_UNTIL,
                attr::TTL,
                attr::KEEP_MS,
                attr::KEEP_S,
            ]))
            .set_expression_attribute_values(Some(values))
            .send()
            .await;
        match renewed {
            Ok(_) => Ok(()),
            Err(e) if e.code() == Some("ConditionalCheckFailedException") => {
                Err(StoreError::fenced())
            }
            Err(e) => Err(self.failed("renewing a lease", e)),
        }
    }

    async fn release(&self, id: &RecordId, token: FencingToken) -> Result<(), StoreError> {
        let (condition, held_names) = Self::held();
        let values =
            HashMap::from(Self::held_values(token, now_ms()).map(|(k, v)| (k.to_owned(), v)));
        let released = self
            .client
            .delete_item()
            .table_name(&self.table)
            .key(attr::ID, blob(id.as_bytes()))
            .condition_expression(condition)
            .set_expression_attribute_names(names(&held_names))
            .set_expression_attribute_values(Some(values))
            .send()
            .await;
        match released {
            Ok(_) => Ok(()),
            Err(e) if e.code() == Some("ConditionalCheckFailedException") => {
                Err(StoreError::fenced())
            }
            Err(e) => Err(self.failed("releasing a record", e)),
        }
    }

    /// One strongly consistent `GetItem`.
    async fn inspect(&self, id: &RecordId) -> Result<Option<RecordInfo>, StoreError> {
        self.inspect_item(id).await
    }

    /// One `DeleteItem` (and the deletion of a chunked payload's chunks).
    async fn force_release(&self, id: &RecordId) -> Result<bool, StoreError> {
        self.force_release_item(id).await
    }

    /// A strongly consistent `Scan` with a filter: it reads (and is billed for) the
    /// whole table, chunk items included. Run it for operators, not on a request's
    /// path.
    async fn list_in_progress(&self, limit: usize) -> Result<Vec<RecordInfo>, StoreError> {
        self.scan_in_progress(limit).await
    }
}

impl std::fmt::Debug for DynamoStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DynamoStore")
            .field("table", &self.table)
            .finish_non_exhaustive()
    }
}
