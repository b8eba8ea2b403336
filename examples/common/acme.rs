//! The SDK of `examples/vendor_sdk.rs`: what a vendor crate would publish (hence `pub`
//! everywhere), a small typed client for AcmePay's payments API built on idemkey's
//! client. Included by path by the example (`#[path = "common/acme.rs"] mod acme;`) and
//! by the fault explorer's tests (`tests/e2e/explore.rs`), which run its
//! `create_charge` through every fault schedule.

use std::time::Duration;

use idemkey::client::{
    DEFAULT_ATTEMPT_TIMEOUT, Error, IdempotentClientBuilder, RequestBuilderExt, ResponseExt,
};
use reqwest_middleware::ClientWithMiddleware;
use serde::{Deserialize, Serialize};

/// A charge to create.
#[derive(Debug, Clone, Serialize)]
pub struct NewCharge<'a> {
    /// Minor units.
    pub amount: u64,
    pub currency: &'a str,
    /// The caller's reference (an order id): the natural idempotency scope.
    pub reference: &'a str,
}

/// A charge as the vendor returns it.
#[derive(Debug, Clone, Deserialize)]
pub struct Charge {
    pub id: String,
    pub amount: u64,
}

/// What the SDK tells its callers.
#[derive(Debug, thiserror::Error)]
pub enum PaymentsError {
    /// The same reference was charged before with other arguments.
    #[error("reference already charged with different arguments (key {0})")]
    Conflict(String),
    /// No answer: call again with the same arguments, it is safe.
    #[error("outcome unknown; call again with the same arguments (key {0})")]
    Unknown(String),
    /// Anything else.
    #[error(transparent)]
    Other(#[from] reqwest_middleware::Error),
}

/// Whether the last call was answered from the vendor's store.
#[derive(Debug)]
pub struct Outcome<T> {
    pub value: T,
    pub replayed: bool,
    pub attempts: u32,
}

/// The typed client.
#[derive(Clone)]
pub struct AcmePay {
    http: ClientWithMiddleware,
    base: String,
}

impl AcmePay {
    /// A client of the API at `base`; each attempt may wait
    /// [`DEFAULT_ATTEMPT_TIMEOUT`] for its answer.
    pub fn new(base: impl Into<String>) -> Self {
        Self::with_timeout(base, DEFAULT_ATTEMPT_TIMEOUT)
    }

    /// A client whose attempts each wait at most `timeout` for their answer before
    /// they are retried with the same key.
    pub fn with_timeout(base: impl Into<String>, timeout: Duration) -> Self {
        let http = IdempotentClientBuilder::new(reqwest::Client::new())
            .max_retries(3)
            .attempt_timeout(timeout)
            .build();
        Self {
            http,
            base: base.into(),
        }
    }

    /// Creates a charge. The key is derived from the arguments: calling again with
    /// the same charge is a retry, never a second charge.
    pub async fn create_charge(
        &self,
        charge: &NewCharge<'_>,
    ) -> Result<Outcome<Charge>, PaymentsError> {
        self.post("/v1/charges", "acme.create_charge", charge).await
    }

    /// Refunds part of a charge; the key is derived from (charge id, amount, reason).
    pub async fn refund(
        &self,
        charge_id: &str,
        amount: u64,
        reason: &str,
    ) -> Result<Outcome<Charge>, PaymentsError> {
        let args = serde_json::json!({"charge": charge_id, "amount": amount, "reason": reason});
        self.post("/v1/refunds", "acme.refund", &args).await
    }

    async fn post<T: Serialize>(
        &self,
        path: &str,
        operation: &str,
        args: &T,
    ) -> Result<Outcome<Charge>, PaymentsError> {
        let result = self
            .http
            .post(format!("{}{path}", self.base))
            .derive_idempotency_key(operation, args)
            .json(args)
            .send()
            .await;
        let response = match result {
            Ok(response) => response,
            Err(err) => {
                return Err(match Error::from_middleware(&err) {
                    Some(e) if e.is_key_reused() => PaymentsError::Conflict(key_of(e.key())),
                    Some(e) if e.is_outcome_unknown() || e.is_in_progress() => {
                        PaymentsError::Unknown(key_of(e.key()))
                    }
                    _ => PaymentsError::Other(err),
                });
            }
        };
        let (replayed, attempts) = response
            .idempotency()
            .map_or((false, 1), |i| (i.replayed(), i.attempts()));
        let value = response
            .error_for_status()
            .map_err(reqwest_middleware::Error::from)?
            .json::<Charge>()
            .await
            .map_err(reqwest_middleware::Error::from)?;
        Ok(Outcome {
            value,
            replayed,
            attempts,
        })
    }
}

fn key_of(key: Option<&idemkey::IdempotencyKey>) -> String {
    key.map(ToString::to_string).unwrap_or_default()
}
