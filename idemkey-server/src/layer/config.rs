//! The layer's runtime configuration: what every request through one
//! [`IdempotencyLayer`](super::IdempotencyLayer) shares, read by the pipeline
//! (`service.rs`) and the tee (`tee.rs`), built by the layer's setters (`layer.rs`).

use std::sync::Arc;
use std::time::Duration;

use http::request::Parts;
use http::{HeaderName, StatusCode};
use tracing::Level;

use crate::IdempotencyKey;
use crate::body::ResponseBody;
use crate::engine::Engine;
use crate::extract::{ExtractKey, ExtractScope};
use crate::fingerprint::Fingerprinter;
use crate::policy::{InProgressPolicy, OutcomePolicy};
use crate::rejection::Rejection;
use idemkey_core::protocol::status::is_safe;
use idemkey_core::protocol::{Dialect, ReplayHeader};

/// Whether a request must carry a key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyRequirement {
    /// No key: `400 missing-key`.
    Required,
    /// No key: the handler runs unguarded, like a request without the layer.
    Optional,
    /// The layer steps aside: the body is not buffered, no key is looked for.
    Off,
}

impl KeyRequirement {
    /// The key a request goes on with: `Ok(None)` runs it unguarded; a required key that
    /// `extractor` did not find is `400 missing-key`, naming where it looks.
    pub(crate) fn apply(
        self,
        found: Option<IdempotencyKey>,
        extractor: &dyn ExtractKey,
    ) -> Result<Option<IdempotencyKey>, Rejection> {
        match found {
            None if self == Self::Required => Err(extractor.missing()),
            found => Ok(found),
        }
    }
}

impl Config {
    /// The response to `rejection`: a gRPC status for a gRPC call, else in the layer's
    /// dialect (the standard one: the problem document).
    pub(super) fn answer(&self, rejection: Rejection, grpc: bool) -> http::Response<ResponseBody> {
        if grpc {
            return rejection.into_grpc_response();
        }
        let key_reused = rejection.is_key_reused();
        let mut resp = rejection.into_dialect_response(&self.dialect);
        if let (true, Some(status)) = (key_reused, self.key_reused_status) {
            *resp.status_mut() = status;
        }
        resp
    }
}

pub(super) type RequirementFn = dyn Fn(&Parts) -> KeyRequirement + Send + Sync;

/// What every request through one layer shares.
#[derive(Clone)]
pub(super) struct Config {
    pub(super) engine: Engine,
    pub(super) key: Arc<dyn ExtractKey>,
    pub(super) scope: Arc<dyn ExtractScope>,
    pub(super) requirement: Arc<RequirementFn>,
    pub(super) fingerprinter: Fingerprinter,
    pub(super) policy: OutcomePolicy,
    pub(super) in_progress: InProgressPolicy,
    pub(super) body_limit: usize,
    pub(super) body_read_timeout: Option<Duration>,
    pub(super) stored_response_limit: usize,
    pub(super) deny: Vec<HeaderName>,
    /// Overrides the dialect's status of `key-reused`.
    pub(super) key_reused_status: Option<StatusCode>,
    /// `None`: replays are not marked (the dialect's vendor marks none).
    pub(super) replay_header: Option<ReplayHeader>,
    pub(super) dialect: Dialect,
    /// The level of the `idemkey.request` span.
    pub(super) span_level: Level,
}

/// The default [`RequirementFn`]: keys required on unsafe methods; the layer steps
/// aside on `GET`, `HEAD`, `OPTIONS` and `TRACE`.
pub(super) fn default_requirement(parts: &Parts) -> KeyRequirement {
    if is_safe(&parts.method) {
        KeyRequirement::Off
    } else {
        KeyRequirement::Required
    }
}
