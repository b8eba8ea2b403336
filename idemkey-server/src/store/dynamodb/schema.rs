//! Provisioning: the table (`create_table`) and its TTL attribute, for development and
//! tests; production tables are usually made by infrastructure code.

use std::time::Duration;

use aws_sdk_dynamodb::error::ProvideErrorMetadata;
use aws_sdk_dynamodb::types::{
    AttributeDefinition, BillingMode, KeySchemaElement, KeyType, ScalarAttributeType, TableStatus,
    TimeToLiveSpecification, TimeToLiveStatus,
};

use super::{DynamoStore, attr};
use crate::store::StoreError;

impl DynamoStore {
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
    pub(super) async fn enable_ttl(&self) -> Result<(), StoreError> {
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
}
