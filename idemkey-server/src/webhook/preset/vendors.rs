//! The catalogue of presets, one constructor per sender, each citing the sender's
//! documentation for where its event id travels and how long it retries; as the
//! client's vendor profiles sit beside `profile/mod.rs` in `profile/vendors.rs`.

use std::time::Duration;

use http::HeaderName;

use super::Preset;
use crate::extract::{KeySource, ScopeSource};
use crate::webhook::signature::{SVIX_ID, WEBHOOK_ID};

const HOUR: Duration = Duration::from_secs(3600);
const DAY: Duration = Duration::from_secs(24 * 3600);

fn header(name: &'static str) -> HeaderName {
    HeaderName::from_static(name)
}

impl Preset {
    /// [Standard Webhooks](https://www.standardwebhooks.com/): the `webhook-id` header.
    ///
    /// Source: Standard Webhooks specification, "Webhook headers": `webhook-id` is the
    /// message's unique identifier, the same when the message is re-sent. No floor: the
    /// specification leaves the retry schedule to the sender.
    #[must_use]
    pub fn standard_webhooks() -> Self {
        Self::new("standard-webhooks", KeySource::header(WEBHOOK_ID))
    }

    /// Svix: the `svix-id` header (Standard Webhooks with Svix's header names).
    ///
    /// Source: Svix docs, "Verifying Webhooks Manually" (`svix-id`: the unique message
    /// identifier, the same on retries) and "Retry Schedule" (attempts over about 27
    /// hours: immediately, 5 s, 5 min, 30 min, 2 h, 5 h, 10 h, 10 h). Floor: 2 days.
    #[must_use]
    pub fn svix() -> Self {
        Self::new("svix", KeySource::header(SVIX_ID)).retention_floor(2 * DAY)
    }

    /// Stripe: the event's `id` (`evt_...`) in the body, scoped by the connected
    /// account (`account`) when the event belongs to one.
    ///
    /// Source: Stripe docs, Webhooks, "Handle duplicate events" (log the event ids you
    /// have processed) and "Retry behavior" (live mode retries for up to three days with
    /// exponential back-off). Floor: 3 days. Connect: events of connected accounts carry
    /// the account id in `account`.
    #[must_use]
    pub fn stripe() -> Self {
        Self::new("stripe", KeySource::json_pointer("/id"))
            .scope(ScopeSource::json_pointer("/account"))
            .retention_floor(3 * DAY)
    }

    /// GitHub: the `X-GitHub-Delivery` GUID, scoped by `X-GitHub-Hook-ID`, since one
    /// delivery GUID reaches every hook subscribed to the event.
    ///
    /// Source: GitHub docs, "Webhook events and payloads", "Delivery headers"
    /// (`X-GitHub-Hook-ID`: the webhook's id; `X-GitHub-Delivery`: a GUID for the
    /// delivery) and "Redelivering webhooks" (a redelivery keeps the GUID; deliveries of
    /// the past 3 days can be redelivered). Floor: 3 days.
    ///
    /// **What it cannot stop:** GitHub signs the body alone and sends no timestamp, so a
    /// captured delivery re-sent with a fresh `X-GitHub-Delivery` passes the signature
    /// check and is processed as a new delivery (see
    /// [what deduplication cannot stop](crate::webhook#what-deduplication-cannot-stop-a-captured-delivery-re-sent-with-a-fresh-id)).
    #[must_use]
    pub fn github() -> Self {
        Self::new("github", KeySource::header(header("x-github-delivery")))
            .scope(ScopeSource::header(header("x-github-hook-id")))
            .retention_floor(3 * DAY)
    }

    /// Shopify: the `X-Shopify-Webhook-Id` header, scoped by the shop
    /// (`X-Shopify-Shop-Domain`). Each subscription's delivery of an event is processed
    /// once; see [`Preset::shopify_events`] to process an event once across
    /// subscriptions.
    ///
    /// Source: Shopify docs, "About webhooks" / "Best practices for webhooks" (ignore
    /// duplicate webhooks by `X-Shopify-Webhook-Id`, which stays the same on retries) and
    /// the developer changelog "Updates to webhook retry mechanism" (2024-09-10: failed
    /// deliveries are retried 8 times over 4 hours, with the original payload). Floor:
    /// 1 day.
    #[must_use]
    pub fn shopify() -> Self {
        Self::new("shopify", KeySource::header(header("x-shopify-webhook-id")))
            .scope(ScopeSource::header(header("x-shopify-shop-domain")))
            .retention_floor(DAY)
    }

    /// Shopify, one record per event: the `X-Shopify-Event-Id` header, which is the same
    /// for every subscription an event reaches (so several subscriptions collapse into
    /// one processing), scoped by the shop.
    ///
    /// Source: Shopify docs, "About webhooks", "Headers" (`X-Shopify-Event-Id`
    /// identifies the event that triggered the webhook). Floor: 1 day, as
    /// [`Preset::shopify`].
    #[must_use]
    pub fn shopify_events() -> Self {
        Self::new(
            "shopify-events",
            KeySource::header(header("x-shopify-event-id")),
        )
        .scope(ScopeSource::header(header("x-shopify-shop-domain")))
        .retention_floor(DAY)
    }

    /// Slack Events API: the body's `event_id`, never the `X-Slack-Retry-Num` /
    /// `X-Slack-Retry-Reason` headers (they count attempts, they do not identify the
    /// event).
    ///
    /// The id is **not required**: the `url_verification` handshake carries none and
    /// passes through without deduplication.
    ///
    /// Source: Slack docs, Events API, "Callback field overview" (`event_id`: unique
    /// across all workspaces) and "Retries" (3 retries: nearly immediately, after one
    /// minute, after five minutes). Floor: 1 hour.
    #[must_use]
    pub fn slack() -> Self {
        Self::new("slack", KeySource::json_pointer("/event_id"))
            .key_required(false)
            .retention_floor(HOUR)
    }

    /// GitLab: the `Idempotency-Key` header GitLab sends with every webhook, the same
    /// across retries of one event, scoped by the sending instance (`X-Gitlab-Instance`).
    ///
    /// Source: GitLab docs, Webhooks, "Delivery headers" (`Idempotency-Key`: unique per
    /// webhook event, consistent across retries; `X-Gitlab-Instance`: the hostname of the
    /// GitLab instance). No floor beyond the default.
    #[must_use]
    pub fn gitlab() -> Self {
        Self::new(
            "gitlab",
            KeySource::header(idemkey_core::protocol::headers::IDEMPOTENCY_KEY),
        )
        .scope(ScopeSource::header(header("x-gitlab-instance")))
    }

    /// Paddle Billing: the body's `event_id` (`evt_...`).
    ///
    /// Source: Paddle docs, "Handle webhook delivery" (live accounts: up to 60 retries
    /// over 3 days) and the notification payload (`event_id`: unique Paddle id for the
    /// event). Floor: 3 days.
    #[must_use]
    pub fn paddle() -> Self {
        Self::new("paddle", KeySource::json_pointer("/event_id")).retention_floor(3 * DAY)
    }

    /// Square: the body's `event_id`.
    ///
    /// Source: Square docs, Webhooks, "Manage webhook operations" (use `event_id` to skip
    /// repeated notifications) and "Troubleshoot webhooks" (unsuccessful deliveries are
    /// retried for up to 24 hours). Floor: 1 day.
    #[must_use]
    pub fn square() -> Self {
        Self::new("square", KeySource::json_pointer("/event_id")).retention_floor(DAY)
    }

    /// PayPal: the webhook event's `id` (`WH-...`) in the body.
    ///
    /// Source: PayPal docs, "Webhooks", "Event names" / "Webhooks overview" (the event
    /// `id` is the same on redelivery; unacknowledged events are retried up to 25 times
    /// over 3 days). Floor: 3 days.
    #[must_use]
    pub fn paypal() -> Self {
        Self::new("paypal", KeySource::json_pointer("/id")).retention_floor(3 * DAY)
    }

    /// Mailgun: the body's `event-data.id`.
    ///
    /// Source: Mailgun docs, "Webhooks" (the payload's `event-data` is the event as the
    /// Events API returns it, with its `id`) and "Automatic Retries" (a delivery answered
    /// with anything but 200 or 406 is retried during 8 hours). Floor: 8 hours.
    #[must_use]
    pub fn mailgun() -> Self {
        Self::new("mailgun", KeySource::json_pointer("/event-data/id")).retention_floor(8 * HOUR)
    }

    /// Jira (Atlassian Cloud): the `X-Atlassian-Webhook-Identifier` header.
    ///
    /// Source: Atlassian developer docs, Jira Cloud "Webhooks", "Retry policy" (the
    /// identifier is unique per webhook delivery and the same across its retries). No
    /// floor beyond the default.
    #[must_use]
    pub fn jira() -> Self {
        Self::new(
            "jira",
            KeySource::header(header("x-atlassian-webhook-identifier")),
        )
    }

    /// Didit (identity verification): the body's `event_id`; for payloads without one,
    /// the fact itself: `session_id`, `webhook_type`, `status` and the digest of the
    /// `decision` (or the first three when there is no decision). Scoped by the
    /// application (`application_id`) when the payload names it.
    ///
    /// Check signatures with [`DiditVerifier`](crate::webhook::DiditVerifier):
    /// `Preset::didit().verifier(DiditVerifier::new(secret))`.
    ///
    /// Why `event_id`. Didit's current docs make it the fact's id: a resent delivery
    /// "keeps its event_id" while Didit "refreshes the timestamp field, the X-Timestamp
    /// header and the signatures" (Management API, "Resend webhook",
    /// docs.didit.me/management-api/sessions/resend-webhook), and for transaction
    /// webhooks "Every delivery carries a unique `X-Didit-Delivery` header but the same
    /// `event_id` — de-dupe on your side" (docs.didit.me/transaction-monitoring/webhooks).
    /// So never the delivery header, and never a hash of the raw body: both change on
    /// every attempt. Didit's server-side payloads carry `event_id` and
    /// `application_id` next to `session_id`, `status`, `webhook_type` and `timestamp`
    /// (the fixtures of Didit's WordPress plugin, didit-protocol/plugin-wordpress). Whether
    /// *automatic* retries of session webhooks keep `event_id` is stated on no page read
    /// (they resend a recorded payload, which carries it). The headers `Webhook-Id` and
    /// `X-Didit-Request-Id` appear in none of Didit's docs. The older reference
    /// (docs.didit.me/reference/webhooks) documented no id and logs "each retry ... as a
    /// new, separate event" in the dashboard: for such payloads the composite
    /// identifies the fact, and a later status or a corrected decision
    /// (`data.updated`) is a new one.
    ///
    /// Scope: each destination has its own secret (Management API, "Create webhook
    /// destination": "Each destination has its own `secret_shared_key`"), so one route
    /// (one verifier) per application; payloads without `application_id` share the
    /// preset's base scope. Floor: 2 days. Didit retries a delivery answered with a 5xx
    /// or 404 (docs.didit.me/reference/webhooks); transaction webhooks' "Total delivery
    /// window ~24 hours" is the longest automatic window documented. A manual resend can
    /// come at any time later; the default retention of 7 days covers a week of them.
    #[must_use]
    pub fn didit() -> Self {
        let fact = |decision: Option<KeySource>| {
            let parts = ["/session_id", "/webhook_type", "/status"].map(KeySource::json_pointer);
            KeySource::composite(parts.into_iter().chain(decision))
        };
        Self::new(
            "didit",
            KeySource::json_pointer("/event_id")
                .or(fact(Some(KeySource::json_digest("/decision"))))
                .or(fact(None)),
        )
        .scope(ScopeSource::json_pointer("/application_id"))
        .retention_floor(2 * DAY)
    }

    /// Persona (identity verification): the event's id, `data.id` (`evt_...`).
    ///
    /// Check signatures with [`HmacVerifier::persona`](crate::webhook::HmacVerifier::persona)
    /// (`Persona-Signature: t=...,v1=...`).
    ///
    /// Source: Persona docs, "Webhooks" (events are JSON:API documents whose `data` is
    /// `{"type": "event", "id": "evt_..."}`) and "Webhook best practices" ("Your webhook
    /// endpoints may occasionally receive the same event more than once"; order by
    /// `data.attributes.created-at`). No tenant field is documented in the event: scope
    /// per webhook (one route and secret each). Floor: 1 day. Persona retries "up to 5
    /// times with an exponential backoff (0, 3, 18, 83, 258 seconds)" (best practices,
    /// older version) or "up to a maximum of 8 times" (2021-05-14 version); the current
    /// schedule and any manual redelivery horizon were not readable.
    #[must_use]
    pub fn persona() -> Self {
        Self::new("persona", KeySource::json_pointer("/data/id")).retention_floor(DAY)
    }

    /// Onfido (identity verification): Onfido sends no event id, so the fact is keyed
    /// by `payload.resource_type`, `payload.object.id`, `payload.action` and
    /// `payload.object.status` (the first three when there is no status): a new action
    /// or status of the same check is a new fact.
    ///
    /// Check signatures with [`HmacVerifier::onfido`](crate::webhook::HmacVerifier::onfido)
    /// (`X-SHA2-Signature`).
    ///
    /// Source: Onfido docs, "Webhooks" / "Manual webhook signature verification", and
    /// onfido-node (`WebhookEvent`: `payload` with `resource_type`, `action` and
    /// `object` `{id, status, href, ...}`; its test events). An event id, a tenant
    /// field and a retry schedule are stated on no page read: scope per webhook (its
    /// token), no floor beyond the default 7 days.
    #[must_use]
    pub fn onfido() -> Self {
        let fact = |status: Option<KeySource>| {
            let parts = [
                "/payload/resource_type",
                "/payload/object/id",
                "/payload/action",
            ]
            .map(KeySource::json_pointer);
            KeySource::composite(parts.into_iter().chain(status))
        };
        Self::new(
            "onfido",
            fact(Some(KeySource::json_pointer("/payload/object/status"))).or(fact(None)),
        )
    }

    /// Sumsub (identity verification): the event's `correlationId` together with its
    /// `type`; for payloads without one, `applicantId`, `type` and `createdAtMs`.
    ///
    /// Check signatures with [`HmacVerifier::sumsub`](crate::webhook::HmacVerifier::sumsub)
    /// (`x-payload-digest`, algorithm in `x-payload-digest-alg`).
    ///
    /// Source: Sumsub docs, "User verification webhooks" (`correlationId`: "A unique
    /// identifier of the event"; `applicantId`, `type`, `createdAtMs`, `sandboxMode`),
    /// "Receive verification results" ("We may send several final webhooks": a later
    /// `applicantReviewed` with another answer is a new fact, and has its own id), and
    /// Sumsub's agent-skills `lifecycle.md` ("Webhooks can arrive twice. Key your DB
    /// upserts by `(applicantId, type, createdAt)`"), the fallback. `type` is kept with
    /// `correlationId` because whether one correlation id can span two event types is
    /// stated nowhere. Scope per webhook (its own secret). Floor: 2 days. Failed
    /// deliveries are resent "after 5 minutes, 1 hour, 5 hours, and 18 hours" (action
    /// webhooks sooner), about 24 hours in all ("Webhook manager").
    #[must_use]
    pub fn sumsub() -> Self {
        Self::new(
            "sumsub",
            KeySource::composite([
                KeySource::json_pointer("/correlationId"),
                KeySource::json_pointer("/type"),
            ])
            .or(KeySource::composite([
                KeySource::json_pointer("/applicantId"),
                KeySource::json_pointer("/type"),
                KeySource::json_pointer("/createdAtMs"),
            ])),
        )
        .retention_floor(2 * DAY)
    }

    /// The generic IETF `Idempotency-Key` header (bare or sf-string form).
    ///
    /// Source: IETF draft `draft-ietf-httpapi-idempotency-key-header`. No floor beyond
    /// the default.
    #[must_use]
    pub fn idempotency_key() -> Self {
        Self::new(
            "idempotency-key",
            KeySource::header(idemkey_core::protocol::headers::IDEMPOTENCY_KEY),
        )
    }

    /// Every preset of this module, for tables and tests.
    #[must_use]
    pub fn all() -> Vec<Preset> {
        vec![
            Self::standard_webhooks(),
            Self::svix(),
            Self::stripe(),
            Self::github(),
            Self::shopify(),
            Self::shopify_events(),
            Self::slack(),
            Self::gitlab(),
            Self::paddle(),
            Self::square(),
            Self::paypal(),
            Self::mailgun(),
            Self::jira(),
            Self::didit(),
            Self::persona(),
            Self::onfido(),
            Self::sumsub(),
            Self::idempotency_key(),
        ]
    }
}
