//! The shared store on Amazon DynamoDB (feature `dynamodb`). See [`DynamoStore`].

use std::collections::HashMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::error::{DisplayErrorContext, ProvideErrorMetadata, SdkError};
use aws_sdk_dynamodb::operation::put_item::PutItemError;
use aws_sdk_dynamodb::operation::update_item::UpdateItemError;
use aws_sdk_dynamodb::primitives::Blob;
use aws_sdk_dynamodb::types::{
    AttributeDefinition, AttributeValue, BillingMode, KeySchemaElement, KeyType, ReturnValue,
    ReturnValuesOnConditionCheckFailure, ScalarAttributeType, TableStatus, TimeToLiveSpecification,
    TimeToLiveStatus,
};
use bytes::{Bytes, BytesMut};
use futures_util::{StreamExt, TryStreamExt, stream};

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

    /// A store for a `dynamodb://[KEY_ID:SECRET@]TABLE?region=REGION[&endpoint=URL]`
    /// connection string, with a client made by [`DynamoStore::sdk_config`]:
    ///
    /// - credentials from the URL (percent-encoded, for DynamoDB Local and tests), or
    ///   else from `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY` and `AWS_SESSION_TOKEN`
    ///   (as AWS Lambda sets them). For instance roles, profiles or SSO, build a client
    ///   with `aws-config` and use [`DynamoStore::builder`];
    /// - the region from `region=`, or else `AWS_REGION` or `AWS_DEFAULT_REGION`;
    /// - `endpoint=` for a DynamoDB-compatible server (DynamoDB Local, moto); leave it
    ///   out for AWS.
    ///
    /// No request is made (the table is not created: see [`DynamoStore::create_table`];
    /// `idemkey::store::open` calls both).
    ///
    /// ```
    /// let store = idemkey::store::DynamoStore::from_url(
    ///     "dynamodb://local:local@idemkey_records?region=eu-west-1&endpoint=http://127.0.0.1:8000",
    /// )?;
    /// assert_eq!(store.table(), "idemkey_records");
    ///
    /// let err = idemkey::store::DynamoStore::from_url("dynamodb://t?regoin=x").unwrap_err();
    /// assert!(err.to_string().contains("unknown parameter"), "{err}");
    /// # Ok::<_, idemkey::store::StoreError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`StoreError::is_unavailable`] for a URL that is not of that form, an unknown
    /// parameter, no region, or no credentials.
    pub fn from_url(url: &str) -> Result<Self, StoreError> {
        use aws_sdk_dynamodb::config::Credentials;
        // Not `{url:?}`: it may hold a secret.
        let bad = |why: String| {
            StoreError::unavailable(
                format!("invalid DynamoDB URL: {why}"),
                "use dynamodb://[KEY_ID:SECRET@]TABLE?region=REGION[&endpoint=URL]",
            )
        };
        let rest = url
            .strip_prefix("dynamodb://")
            .ok_or_else(|| bad("it must start with dynamodb://".into()))?;
        let (path, query) = rest.split_once('?').unwrap_or((rest, ""));
        let (userinfo, table) = match path.rsplit_once('@') {
            Some((userinfo, table)) => (Some(userinfo), table),
            None => (None, path),
        };
        let (mut region, mut endpoint) = (None, None);
        for (name, value) in form_urlencoded::parse(query.as_bytes()) {
            match &*name {
                "region" => region = Some(value.into_owned()),
                "endpoint" => endpoint = Some(value.into_owned()),
                other => return Err(bad(format!("unknown parameter {other:?}"))),
            }
        }
        let env = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
        let region = region
            .or_else(|| env("AWS_REGION"))
            .or_else(|| env("AWS_DEFAULT_REGION"))
            .ok_or_else(|| bad("no region= and no AWS_REGION in the environment".into()))?;
        let decode = |s: &str| {
            percent_encoding::percent_decode_str(s)
                .decode_utf8()
                .map(|s| s.into_owned())
                .map_err(|_| bad("the credentials are not UTF-8 once percent-decoded".into()))
        };
        let credentials = match userinfo {
            Some(userinfo) => {
                let (key, secret) = userinfo
                    .split_once(':')
                    .ok_or_else(|| bad("credentials must be KEY_ID:SECRET".into()))?;
                Credentials::new(decode(key)?, decode(secret)?, None, None, "url")
            }
            None => match (env("AWS_ACCESS_KEY_ID"), env("AWS_SECRET_ACCESS_KEY")) {
                (Some(key), Some(secret)) => {
                    Credentials::new(key, secret, env("AWS_SESSION_TOKEN"), None, "env")
                }
                _ => {
                    return Err(StoreError::unavailable(
                        "DynamoDB: no credentials in the URL, and no AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY in the environment",
                        "set them, or build an SDK client with aws-config (roles, profiles, SSO) and use DynamoStore::builder",
                    ));
                }
            },
        };
        let mut config = Self::sdk_config(region).credentials_provider(credentials);
        if let Some(endpoint) = endpoint {
            config = config.endpoint_url(endpoint);
        }
        Self::builder(Client::from_conf(config.build()))
            .table(table)
            .build()
    }

    /// An SDK configuration for `region` with what [`DynamoStore::from_url`] uses: an
    /// HTTPS client (rustls, which also speaks plain HTTP to a local endpoint), the SDK's
    /// standard retries (3 attempts), 3 s to connect and 10 s per attempt. Add
    /// credentials (and an endpoint for a DynamoDB-compatible server), then build the
    /// client. This is the way to a client without `aws-config`.
    ///
    /// ```
    /// use idemkey::store::DynamoStore;
    /// use idemkey::store::aws_sdk_dynamodb::{Client, config::Credentials};
    ///
    /// let config = DynamoStore::sdk_config("eu-west-1")
    ///     .credentials_provider(Credentials::new("AKID", "secret", None, None, "vault"))
    ///     .build();
    /// let store = DynamoStore::builder(Client::from_conf(config)).build()?;
    /// # Ok::<_, idemkey::store::StoreError>(())
    /// ```
    #[must_use]
    pub fn sdk_config(region: impl Into<String>) -> aws_sdk_dynamodb::config::Builder {
        use aws_sdk_dynamodb::config::{
            BehaviorVersion, Region, retry::RetryConfig, timeout::TimeoutConfig,
        };
        let http = aws_smithy_http_client::Builder::new()
            .tls_provider(aws_smithy_http_client::tls::Provider::Rustls(
                aws_smithy_http_client::tls::rustls_provider::CryptoMode::Ring,
            ))
            .build_https();
        aws_sdk_dynamodb::Config::builder()
            .behavior_version(BehaviorVersion::latest())
            .region(Region::new(region.into()))
            .http_client(http)
            .retry_config(RetryConfig::standard())
            .timeout_config(
                TimeoutConfig::builder()
                    .connect_timeout(Duration::from_secs(3))
                    .operation_attempt_timeout(Duration::from_secs(10))
                    .build(),
            )
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

    /// Creates the table (on-demand capacity) if it does not exist, waits until it is
    /// active, and turns TTL on for the `ttl` attribute. Safe to call from every
    /// instance at start-up, and again later.
    ///
    /// # Errors
    ///
    /// [`StoreError::is_unavailable`] when DynamoDB cannot be reached or refuses (for
    /// example for lack of permissions), when an existing table of that name has
    /// another key than `id` (binary), or when its TTL is on for another attribute.
    pub async fn create_table(&self) -> Result<(), StoreError> {
        let definition = AttributeDefinition::builder()
            .attribute_name(attr::ID)
            .attribute_type(ScalarAttributeType::B)
            .build()
            .map_err(|e| StoreError::unavailable("DynamoDB: the table's key definition", e))?;
        let key = KeySchemaElement::builder()
            .attribute_name(attr::ID)
            .key_type(KeyType::Hash)
            .build()
            .map_err(|e| StoreError::unavailable("DynamoDB: the table's key schema", e))?;
        let created = self
            .client
            .create_table()
            .table_name(&self.table)
            .attribute_definitions(definition)
            .key_schema(key)
            .billing_mode(BillingMode::PayPerRequest)
            .send()
            .await;
        match created {
            Err(e) if e.code() != Some("ResourceInUseException") => {
                return Err(self.failed("creating the table", e));
            }
            _ => {}
        }
        // Wait (bounded, about two minutes) until the table is active.
        let mut pause = Duration::from_millis(20);
        for attempt in 0.. {
            let table = self
                .client
                .describe_table()
                .table_name(&self.table)
                .send()
                .await
                .map_err(|e| self.failed("describing the table", e))?
                .table
                .ok_or_else(|| StoreError::corrupt("DynamoDB's DescribeTable named no table"))?;
            let key: Vec<_> = table
                .key_schema()
                .iter()
                .map(|k| (k.attribute_name(), k.key_type().clone()))
                .collect();
            let binary_id = table.attribute_definitions().iter().any(|a| {
                a.attribute_name() == attr::ID && *a.attribute_type() == ScalarAttributeType::B
            });
            if key != [(attr::ID, KeyType::Hash)] || !binary_id {
                return Err(StoreError::unavailable(
                    format!(
                        "DynamoDB: table {:?} has the key {key:?}; this store needs a table keyed by `id` (binary) alone",
                        self.table
                    ),
                    "name another table, or create it as the DynamoStore docs show",
                ));
            }
            if table.table_status() == Some(&TableStatus::Active) {
                break;
            }
            if attempt == 80 {
                return Err(StoreError::unavailable(
                    format!("DynamoDB: table {:?} did not become active", self.table),
                    "look at the table's status in DynamoDB",
                ));
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_secs(2));
        }
        self.enable_ttl().await
    }

    /// Turns TTL on for `ttl`, unless it is on already.
    async fn enable_ttl(&self) -> Result<(), StoreError> {
        let described = self
            .client
            .describe_time_to_live()
            .table_name(&self.table)
            .send()
            .await
            .map_err(|e| self.failed("reading the table's TTL setting", e))?;
        let current = described.time_to_live_description();
        let on = matches!(
            current.and_then(|d| d.time_to_live_status()),
            Some(TimeToLiveStatus::Enabled | TimeToLiveStatus::Enabling)
        );
        match current.and_then(|d| d.attribute_name()) {
            Some(name) if on && name == attr::TTL => return Ok(()),
            Some(name) if on => {
                return Err(StoreError::unavailable(
                    format!(
                        "DynamoDB: table {:?} expires items by {name:?}, this store by {:?}",
                        self.table,
                        attr::TTL
                    ),
                    "give the store a table of its own",
                ));
            }
            _ => {}
        }
        let spec = TimeToLiveSpecification::builder()
            .enabled(true)
            .attribute_name(attr::TTL)
            .build()
            .map_err(|e| StoreError::unavailable("DynamoDB: the TTL setting", e))?;
        self.client
            .update_time_to_live()
            .table_name(&self.table)
            .time_to_live_specification(spec)
            .send()
            .await
            .map_err(|e| self.failed("turning TTL on", e))?;
        Ok(())
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

    /// The payload of a completed record: inline, or read from its chunks (`None` when
    /// a chunk is gone).
    async fn payload(&self, item: &Item<'_>) -> Result<Option<Bytes>, StoreError> {
        if item.0.contains_key(attr::PAYLOAD) {
            return item.bytes(attr::PAYLOAD).map(Some);
        }
        let (id, write) = (item.bytes(attr::ID)?, item.bytes(attr::WRITE)?);
        let (count, len) = (item.num(attr::CHUNKS)?, item.num(attr::PAYLOAD_LEN)?);
        let chunks: Vec<Option<Bytes>> = stream::iter(0..count)
            .map(|i| {
                let key = chunk_key(&id, &write, i);
                async move {
                    match self.get(&key).await? {
                        Some(chunk) => Item(&chunk).bytes(attr::CHUNK).map(Some),
                        None => Ok(None),
                    }
                }
            })
            .buffered(CHUNK_CONCURRENCY)
            .try_collect()
            .await?;
        let mut payload = BytesMut::with_capacity(usize::try_from(len).unwrap_or(0));
        for chunk in chunks {
            match chunk {
                Some(chunk) => payload.extend_from_slice(&chunk),
                None => return Ok(None),
            }
        }
        if payload.len() as u64 != len {
            return Err(StoreError::corrupt(format!(
                "DynamoDB: a payload of {len} bytes came back from its chunks as {} bytes",
                payload.len()
            )));
        }
        Ok(Some(payload.freeze()))
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

    async fn write_chunks(
        &self,
        id: &RecordId,
        write: &[u8; 16],
        payload: &Bytes,
        until: u64,
    ) -> Result<(), StoreError> {
        // Owned slices: a stream of borrowed chunks is not `Send` in an async trait.
        let chunks = (0..payload.len().div_ceil(CHUNK)).map(|i| {
            (
                i,
                payload.slice(i * CHUNK..payload.len().min((i + 1) * CHUNK)),
            )
        });
        stream::iter(chunks)
            .map(|(i, chunk)| async move {
                self.client
                    .put_item()
                    .table_name(&self.table)
                    .item(attr::ID, blob(&chunk_key(id.as_bytes(), write, i as u64)))
                    .item(attr::CHUNK, blob(&chunk))
                    .item(attr::TTL, num(until.div_ceil(1000)))
                    .send()
                    .await
                    .map(drop)
                    .map_err(|e| self.failed("writing a payload chunk", e))
            })
            .buffer_unordered(CHUNK_CONCURRENCY)
            .try_collect::<()>()
            .await
    }

    /// Deletes the chunk items of a completion, best effort (they expire by TTL anyway).
    async fn delete_chunks(&self, id: &[u8], write: &[u8], count: u64) {
        stream::iter(0..count)
            .map(|i| async move {
                let deleted = self
                    .client
                    .delete_item()
                    .table_name(&self.table)
                    .key(attr::ID, blob(&chunk_key(id, write, i)))
                    .send()
                    .await;
                if let Err(e) = deleted {
                    tracing::debug!(error = %DisplayErrorContext(&e), "a payload chunk is left to expire by TTL");
                }
            })
            .buffer_unordered(CHUNK_CONCURRENCY)
            .collect::<()>()
            .await;
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

/// A record's item, read.
struct Item<'a>(&'a HashMap<String, AttributeValue>);

impl Item<'_> {
    fn get(&self, name: &str) -> Result<&AttributeValue, StoreError> {
        self.0
            .get(name)
            .ok_or_else(|| StoreError::corrupt(format!("DynamoDB: an item lacks `{name}`")))
    }

    fn bytes(&self, name: &str) -> Result<Bytes, StoreError> {
        match self.get(name)? {
            AttributeValue::B(b) => Ok(Bytes::copy_from_slice(b.as_ref())),
            _ => Err(StoreError::corrupt(format!(
                "DynamoDB: `{name}` is not binary"
            ))),
        }
    }

    fn num(&self, name: &str) -> Result<u64, StoreError> {
        match self.get(name)? {
            AttributeValue::N(n) => n.parse().map_err(|_| {
                StoreError::corrupt(format!("DynamoDB: `{name}` is {n:?}, not a whole number"))
            }),
            _ => Err(StoreError::corrupt(format!(
                "DynamoDB: `{name}` is not a number"
            ))),
        }
    }

    fn state(&self) -> Result<RecordState, StoreError> {
        match self.get(attr::STATE)? {
            AttributeValue::S(s) if s == IN_PROGRESS => Ok(RecordState::InProgress),
            AttributeValue::S(s) if s == COMPLETED => Ok(RecordState::Completed),
            other => Err(StoreError::corrupt(format!(
                "DynamoDB: unknown record state {other:?}"
            ))),
        }
    }

    fn token(&self) -> Result<FencingToken, StoreError> {
        let bytes = self.bytes(attr::TOKEN)?;
        let raw: [u8; 16] = bytes.as_ref().try_into().map_err(|_| {
            StoreError::corrupt(format!("DynamoDB: a token of {} bytes", bytes.len()))
        })?;
        Ok(FencingToken::from_bytes(raw))
    }

    fn info(&self, id: RecordId) -> Result<RecordInfo, StoreError> {
        let state = self.state()?;
        let payload_len = match state {
            RecordState::InProgress => None,
            RecordState::Completed => Some(self.num(attr::PAYLOAD_LEN)?),
        };
        Ok(RecordInfo {
            id,
            state,
            fingerprint: self.bytes(attr::FINGERPRINT)?,
            created: UNIX_EPOCH + Duration::from_millis(self.num(attr::CREATED)?),
            expires: UNIX_EPOCH + Duration::from_millis(self.num(attr::EXPIRES)?),
            payload_len,
        })
    }
}

/// The key of chunk `i` of the completion `write` of record `id` (52 bytes, so it never
/// meets a record's 32-byte key).
fn chunk_key(id: &[u8], write: &[u8], i: u64) -> Vec<u8> {
    let mut key = Vec::with_capacity(id.len() + write.len() + 4);
    key.extend_from_slice(id);
    key.extend_from_slice(write);
    key.extend_from_slice(&u32::try_from(i).unwrap_or(u32::MAX).to_be_bytes());
    key
}

/// `#name` -> `name` for each attribute an expression uses.
fn names(attrs: &[&str]) -> Option<HashMap<String, String>> {
    Some(
        attrs
            .iter()
            .map(|a| (format!("#{a}"), (*a).to_owned()))
            .collect(),
    )
}

fn blob(b: &[u8]) -> AttributeValue {
    AttributeValue::B(Blob::new(b))
}

fn num(n: u64) -> AttributeValue {
    AttributeValue::N(n.to_string())
}

fn string(s: &str) -> AttributeValue {
    AttributeValue::S(s.to_owned())
}

/// This process's wall clock, in milliseconds since the Unix epoch.
fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// A duration in milliseconds, capped at 100 years.
fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX).min(MAX_MS)
}
