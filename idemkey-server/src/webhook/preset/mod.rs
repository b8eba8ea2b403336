//! Presets: the id source, scope and retention floor of each sender.

use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::HeaderMap;
use http::request::Parts;

use super::signature::VerifySignature;
use crate::engine::Engine;
use crate::extract::{ExtractKey, ExtractScope, Input, KeySource, ScopeSource};
use crate::fingerprint::Fingerprinter;
use crate::layer::{IdempotencyLayer, KeyRequirement};
use crate::policy::OutcomePolicy;
use crate::rejection::Rejection;
use crate::store::RecordId;
use idemkey_core::key::IdempotencyKey;

mod vendors;

/// How long a webhook delivery's record is kept by default: 7 days.
///
/// Longer than the automatic retry window of every sender with a preset here, so that a
/// late retry is still recognised. Presets whose sender may redeliver later carry a
/// higher [floor](Preset::min_retention).
pub const DEFAULT_WEBHOOK_RETENTION: Duration = Duration::from_secs(7 * 24 * 3600);

/// How one sender's webhook deliveries are identified: where the id comes from, how
/// deliveries are scoped, and how long their records must be kept.
///
/// Every preset names its source in the provider's public documentation. The retention
/// is [`DEFAULT_WEBHOOK_RETENTION`] unless configured with [`Preset::retention`], and
/// never below the preset's [floor](Preset::min_retention): the time during which the
/// sender may deliver the same event again. A record dropped before that would let a
/// late retry execute twice.
///
/// Records are scoped by the preset's name (two senders never share records) and, where
/// the sender has one, by the tenant the delivery belongs to (a Stripe connected
/// account, a GitHub hook, a Shopify shop).
///
/// A preset identifies a delivery **by its id only**: retries of the same event may
/// differ in their body (a Stripe event's `pending_webhooks` count changes between
/// attempts) and always differ in their signature headers, so a verifier configured from
/// a preset must not compare request bodies.
///
/// ```
/// use idemkey::server::webhook::Preset;
/// use http::HeaderMap;
/// use std::time::Duration;
///
/// let stripe = Preset::stripe();
/// let body = br#"{"id":"evt_1NG8Du2eZvKYlo2CUI79vXWy","object":"event","account":"acct_1","type":"charge.succeeded"}"#;
/// let id = stripe.identify(&HeaderMap::new(), body)?.expect("Stripe events carry an id");
/// assert_eq!(id.key().as_str(), "evt_1NG8Du2eZvKYlo2CUI79vXWy");
/// assert_eq!(id.scope(), "webhook:stripe/acct_1");
///
/// // Stripe retries for up to three days: a shorter retention is raised to that floor.
/// let short = Preset::stripe().retention(Duration::from_secs(3600));
/// assert_eq!(short.effective_retention(), Duration::from_secs(3 * 24 * 3600));
/// # Ok::<(), idemkey::server::Rejection>(())
/// ```
#[derive(Clone, Debug)]
pub struct Preset {
    name: Arc<str>,
    key: KeySource,
    scope: Option<ScopeSource>,
    key_required: bool,
    retention: Retention,
    verifier: Option<Verifier>,
}

/// A retention and the floor it is never set below: the one rule of presets and batch
/// dedupers.
#[derive(Clone, Copy, Debug)]
pub(super) struct Retention {
    pub(super) requested: Duration,
    pub(super) floor: Duration,
}

impl Retention {
    /// [`DEFAULT_WEBHOOK_RETENTION`], no floor.
    pub(super) const DEFAULT: Self = Self {
        requested: DEFAULT_WEBHOOK_RETENTION,
        floor: Duration::ZERO,
    };

    /// The retention in force: the requested one, raised to the floor.
    pub(super) fn effective(self) -> Duration {
        self.requested.max(self.floor)
    }
}

/// A preset's signature check, shared by its clones.
#[derive(Clone)]
struct Verifier(Arc<dyn VerifySignature>);

impl fmt::Debug for Verifier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Verifiers hold secrets: say only that there is one.
        f.write_str("<signature verifier>")
    }
}

/// The identity of one delivery: its scope and its key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeliveryId {
    scope: String,
    key: IdempotencyKey,
}

impl DeliveryId {
    /// The scope: `webhook:<preset name>`, followed by `/<tenant>` when the preset has a
    /// scope source and the delivery names a tenant.
    #[must_use]
    pub fn scope(&self) -> &str {
        &self.scope
    }

    /// The delivery's id as an idempotency key.
    #[must_use]
    pub fn key(&self) -> &IdempotencyKey {
        &self.key
    }

    /// The store address of this delivery's record.
    #[must_use]
    pub fn record_id(&self) -> RecordId {
        RecordId::new(&self.scope, self.key.as_str())
    }
}

/// The preset's key source: the delivery's id, or `Ok(None)` (the layer then applies the
/// preset's requirement).
///
/// With a [verifier](Preset::verifier), the signature is checked first: a delivery whose
/// signature does not hold is rejected (`401 signature-rejected`) here, before the layer
/// asks the store anything.
impl ExtractKey for Preset {
    fn extract_key(
        &self,
        parts: &Parts,
        body: &Bytes,
    ) -> Result<Option<IdempotencyKey>, Rejection> {
        self.check_signature(&parts.headers, body)?;
        self.key.extract(&parts.headers, body)
    }

    fn describe(&self) -> Cow<'static, str> {
        ExtractKey::describe(&self.key)
    }

    fn missing(&self) -> Rejection {
        Rejection::missing_delivery_id(&self.name, &ExtractKey::describe(&self.key))
    }

    /// A signed preset reads the body (its signature covers it) before judging anything,
    /// even when its id is a header.
    fn needs_body(&self) -> bool {
        self.verifier.is_some() || ExtractKey::needs_body(&self.key)
    }
}

/// The preset's scope: `webhook:<name>`, or `webhook:<name>/<tenant>`.
impl ExtractScope for Preset {
    fn extract_scope(&self, parts: &Parts, body: &Bytes) -> Result<String, Rejection> {
        self.scope_of(&parts.headers, body)
    }

    fn needs_body(&self) -> bool {
        self.scope.as_ref().is_some_and(ExtractScope::needs_body)
    }
}

impl Preset {
    /// A preset of your own: deliveries identified by `key`, in the scope
    /// `webhook:<name>`, id required, retention [`DEFAULT_WEBHOOK_RETENTION`], no floor.
    ///
    /// `name` should not contain `/` (it separates the name from the tenant in scopes).
    #[must_use]
    pub fn new(name: impl Into<Arc<str>>, key: KeySource) -> Self {
        Self {
            name: name.into(),
            key,
            scope: None,
            key_required: true,
            retention: Retention::DEFAULT,
            verifier: None,
        }
    }

    /// Checks every delivery's signature with `verifier` **before** anything else: the
    /// preset's layer and [`Preset::identify`] answer a delivery whose signature does not
    /// hold with `401 signature-rejected` ([`Problem::SignatureRejected`]) before its id
    /// is read or any record is claimed. A forged delivery that reuses a genuine id thus
    /// neither runs the handler nor receives the genuine delivery's replay, and a stale
    /// one (outside the verifier's tolerance) is refused though its id is new.
    ///
    /// Any [`VerifySignature`] fits: [`StandardWebhooksVerifier`], [`HmacVerifier`],
    /// [`DiditVerifier`], or one of your own.
    ///
    /// The layer steps aside on safe methods (`GET`, `HEAD`, `OPTIONS`, `TRACE`), and so
    /// does the check: route webhooks with `post(..)`, as senders deliver them.
    ///
    /// ```
    /// use axum::{Router, routing::post};
    /// use idemkey::server::Engine;
    /// use idemkey::server::webhook::{HmacVerifier, Preset};
    /// use idemkey::store::MemoryStore;
    ///
    /// let persona = Preset::persona().verifier(HmacVerifier::persona("wbhsec_test"));
    /// let app: Router = Router::new()
    ///     .route("/webhooks/persona", post(|| async { "processed" }))
    ///     .route_layer(persona.layer(Engine::new(MemoryStore::new())));
    /// # let _ = app;
    /// ```
    ///
    /// [`Problem::SignatureRejected`]: idemkey_core::protocol::Problem::SignatureRejected
    /// [`StandardWebhooksVerifier`]: super::StandardWebhooksVerifier
    /// [`HmacVerifier`]: super::HmacVerifier
    /// [`DiditVerifier`]: super::DiditVerifier
    #[must_use]
    pub fn verifier(mut self, verifier: impl VerifySignature) -> Self {
        self.verifier = Some(Verifier(Arc::new(verifier)));
        self
    }

    /// `true` when deliveries are checked by a [verifier](Preset::verifier) first.
    #[must_use]
    pub fn is_signed(&self) -> bool {
        self.verifier.is_some()
    }

    fn check_signature(&self, headers: &HeaderMap, body: &[u8]) -> Result<(), Rejection> {
        match &self.verifier {
            Some(Verifier(v)) => v.verify(headers, body).map_err(Rejection::from),
            None => Ok(()),
        }
    }

    /// Scopes deliveries by the tenant `scope` finds (absent: the preset's base scope).
    #[must_use]
    pub fn scope(mut self, scope: ScopeSource) -> Self {
        self.scope = Some(scope);
        self
    }

    /// Sets the retention; values below the floor ([`Preset::retention_floor`]) are
    /// raised to it. Read back with [`Preset::effective_retention`].
    #[must_use]
    pub fn retention(mut self, retention: Duration) -> Self {
        self.retention.requested = retention;
        self
    }

    /// Sets the floor: the shortest retention allowed. Read back with
    /// [`Preset::min_retention`].
    #[must_use]
    pub fn retention_floor(mut self, floor: Duration) -> Self {
        self.retention.floor = floor;
        self
    }

    /// Whether a delivery without an id is rejected (400, problem `missing-key`; the
    /// default) or passed to the handler without deduplication (for handshakes that
    /// carry no id, such as Slack's `url_verification`).
    #[must_use]
    pub fn key_required(mut self, required: bool) -> Self {
        self.key_required = required;
        self
    }

    /// The preset's name, the base of its scopes.
    #[must_use]
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Where the id comes from.
    #[must_use]
    pub fn key_source(&self) -> &KeySource {
        &self.key
    }

    /// Where the tenant comes from, if the sender has tenants.
    #[must_use]
    pub fn scope_source(&self) -> Option<&ScopeSource> {
        self.scope.as_ref()
    }

    /// `true` when a delivery without an id is rejected.
    #[must_use]
    pub fn is_key_required(&self) -> bool {
        self.key_required
    }

    /// The retention in force: the one set with [`Preset::retention`] (default
    /// [`DEFAULT_WEBHOOK_RETENTION`]), raised to the floor.
    #[must_use]
    pub fn effective_retention(&self) -> Duration {
        self.retention.effective()
    }

    /// The floor ([`Preset::retention_floor`]): the shortest retention allowed, how long
    /// the sender may deliver the same event again.
    #[must_use]
    pub fn min_retention(&self) -> Duration {
        self.retention.floor
    }

    /// Whether the layer rejects a delivery without an id or passes it on.
    fn requirement(&self) -> KeyRequirement {
        if self.key_required {
            KeyRequirement::Required
        } else {
            KeyRequirement::Optional
        }
    }

    /// The scope of deliveries that name no tenant: `webhook:<name>`.
    #[must_use]
    pub fn base_scope(&self) -> String {
        format!("webhook:{}", self.name)
    }

    /// Identifies a delivery from its headers and buffered body.
    ///
    /// Returns `Ok(None)` when the delivery has no id and the preset does not require
    /// one: process it without deduplication.
    ///
    /// With a [verifier](Preset::verifier), the signature is checked first.
    ///
    /// # Errors
    /// [`Rejection`]: the signature does not hold (401, `signature-rejected`); the id
    /// is required and missing (400, `missing-key`), or an id is there but unusable
    /// (`invalid-key`), or a tenant is (`invalid-scope`).
    pub fn identify(
        &self,
        headers: &HeaderMap,
        body: &[u8],
    ) -> Result<Option<DeliveryId>, Rejection> {
        self.check_signature(headers, body)?;
        let input = Input::new(headers, body);
        let found = self.key.extract_in(&input)?;
        let Some(key) = self.requirement().apply(found, self)? else {
            return Ok(None);
        };
        let scope = self.scope_in(&input)?;
        Ok(Some(DeliveryId { scope, key }))
    }

    /// The scope of a delivery (see [`DeliveryId::scope`]).
    ///
    /// # Errors
    /// [`Rejection`] (`invalid-scope`) when the tenant is there but unusable.
    pub fn scope_of(&self, headers: &HeaderMap, body: &[u8]) -> Result<String, Rejection> {
        self.scope_in(&Input::new(headers, body))
    }

    fn scope_in(&self, input: &Input<'_>) -> Result<String, Rejection> {
        let tenant = match &self.scope {
            Some(s) => s.extract_in(input)?,
            None => None,
        };
        Ok(match tenant {
            Some(t) => format!("webhook:{}/{t}", self.name),
            None => self.base_scope(),
        })
    }

    /// An [`IdempotencyLayer`] over `engine` for this sender's route: the key and scope
    /// from this preset, a key required (or optional, see
    /// [`Preset::key_required`]), the retention of [`Preset::effective_retention`], and a
    /// fingerprint that leaves the body out ([`Fingerprinter::without_body`]; retries of one event may differ in their
    /// body; the id decides), and [`OutcomePolicy::success_only`]: only a 2xx
    /// acknowledges a delivery and is replayed; any other answer releases the id, so
    /// the sender's redelivery is processed.
    ///
    /// A preset with a [verifier](Preset::verifier) checks each delivery's signature in
    /// this layer, before the claim: nothing else is needed in front of it.
    ///
    /// **Apply it with axum's `Router::route_layer`, not `Router::layer`.** `route_layer`
    /// wraps the routes only; `Router::layer` also wraps the router's fallback, so every
    /// request to an unknown path (a typo, a sender not routed yet) would be answered
    /// `400 missing-key` (or `401 signature-rejected`) by this layer instead of `404`,
    /// and merging such a router into another one carries that fallback along. The same
    /// goes for one route: `post(handler).route_layer(..)` on the method router, or
    /// `Router::route_layer` after `.route(..)`.
    ///
    /// ```
    /// use axum::{Router, routing::post};
    /// use idemkey::server::Engine;
    /// use idemkey::server::webhook::{HmacVerifier, Preset};
    /// use idemkey::store::MemoryStore;
    ///
    /// let engine = Engine::new(MemoryStore::new());
    /// let stripe = Preset::stripe().verifier(HmacVerifier::stripe("whsec_test_secret"));
    /// let app: Router = Router::new()
    ///     .route("/webhooks/stripe", post(|| async { "ok" }))
    ///     // Routes only: `POST /elsewhere` stays a 404.
    ///     .route_layer(stripe.layer(engine));
    /// # let _ = app;
    /// ```
    #[must_use]
    pub fn layer(&self, engine: Engine) -> IdempotencyLayer {
        IdempotencyLayer::new(engine)
            .key(self.clone())
            .scope(self.clone())
            .require(self.requirement())
            .fingerprinter(Fingerprinter::new().without_body())
            .policy(OutcomePolicy::success_only())
            .retention(self.effective_retention())
    }
}
