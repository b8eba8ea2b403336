//! `dynamodb://` connection strings, and the SDK configuration the store builds from
//! them (or that a caller starts from).

use std::time::Duration;

use aws_sdk_dynamodb::Client;

use super::DynamoStore;
use crate::store::StoreError;

impl DynamoStore {
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
}
