//! Vendor profiles: how one API takes its key and says "reused", "in progress" or
//! "already done".

mod vendors;

use std::borrow::Cow;
use std::time::Duration;

use http::{HeaderName, StatusCode};
use serde_json::Value;

use idemkey_core::key::MAX_KEY_LEN;
use idemkey_core::protocol::dialect::{Dialect, Recognition, Refusal};
use idemkey_core::protocol::headers::{self, IDEMPOTENCY_KEY};
use idemkey_core::protocol::{Problem, status};

/// How one API speaks idempotency, in one value: where the key goes (a header, or a field
/// of the JSON body), how long a key may be, which answers mean "key reused", "in
/// progress" or "already executed", which retry hints it sends, and how long it keeps
/// keys.
///
/// Give it to [`IdempotentClientBuilder::profile`](super::IdempotentClientBuilder::profile) (or
/// [`RetryMiddleware::profile`](super::RetryMiddleware::profile)). The default,
/// [`VendorProfile::standard`], speaks the IETF draft and this crate's verifier. The
/// vendor constructors ([`stripe`](Self::stripe), [`adyen`](Self::adyen),
/// [`paypal`](Self::paypal), [`square`](Self::square), [`checkout`](Self::checkout),
/// [`gocardless`](Self::gocardless), [`stainless`](Self::stainless)) cite the vendor's
/// public documentation for every fact, and say where it is silent. Build your own from
/// [`VendorProfile::new`] or adjust one with the `with_*` methods.
///
/// ```
/// use std::time::Duration;
/// use idemkey::client::{AnswerMatch, IdempotentClientBuilder, VendorProfile};
///
/// // A verifier that answers a reused key with 422 {"detail": "...already used..."}.
/// let profile = VendorProfile::standard()
///     .with_key_reused(AnswerMatch::status(422).json_contains("/detail", "already used"));
/// let client = IdempotentClientBuilder::new(reqwest::Client::new()).profile(profile).build();
///
/// // The outbox's expiry reads the retention window.
/// assert_eq!(VendorProfile::stripe().retention(), Duration::from_secs(24 * 3600));
/// assert!(!VendorProfile::square().is_retention_documented());
/// # let _ = client;
/// ```
#[derive(Debug, Clone)]
pub struct VendorProfile {
    name: Cow<'static, str>,
    key: KeyPlacement,
    max_key_len: usize,
    rules: Vec<(Class, AnswerMatch)>,
    /// The lowest status any rule names: answers below it need no look at the rules.
    lowest_rule_status: u16,
    should_retry: Vec<HeaderName>,
    retention: Duration,
    retention_documented: bool,
}

#[doc(inline)]
pub use idemkey_core::protocol::dialect::KeyPlacement;

/// What an answer means, as a profile reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Class {
    /// The key was used before for a different request: never retried, `key_reused`.
    KeyReused,
    /// A request with the key executed before (GoCardless's 409): never retried,
    /// `already_executed`.
    AlreadyExecuted,
    /// An earlier request with the key is still running: retried, `in_progress` at the
    /// end.
    InProgress,
    /// The verifier's store is full (`store-full`): nothing ran; retried, `store_full` at
    /// the end.
    StoreFull,
    /// The scope's quota of new keys is spent (`quota-exceeded`): nothing ran; retried,
    /// `quota_exceeded` at the end.
    QuotaExceeded,
    /// None of the profile's rules: the retry strategy decides.
    Other,
}

/// A rule over an answer: its status, and conditions on its JSON body. Used by
/// [`VendorProfile::with_key_reused`], [`VendorProfile::with_in_progress`] and
/// [`VendorProfile::with_already_executed`].
///
/// The body is read (it is an error answer, small) only for statuses some rule with
/// body conditions names, and only for keyed requests. JSON pointers are RFC 6901; a
/// `*` segment matches any element of an array (or any member of an object), so
/// `/errors/*/code` finds a code in any of Square's errors.
///
/// ```
/// use idemkey::client::AnswerMatch;
/// use idemkey::protocol::Problem;
/// let stripe = AnswerMatch::status(400).json("/error/type", "idempotency_error");
/// let ours = AnswerMatch::statuses([400, 409, 422]).problem(Problem::KeyReused);
/// # let _ = (stripe, ours);
/// ```
#[derive(Debug, Clone)]
pub struct AnswerMatch {
    statuses: Vec<StatusCode>,
    body: Vec<BodyCondition>,
}

#[derive(Debug, Clone)]
enum BodyCondition {
    /// An RFC 9457 `type` naming this problem ([`Problem::from_type`]).
    Problem(Problem),
    /// A string at the pointer equal to the value.
    Equals(Cow<'static, str>, Cow<'static, str>),
    /// A string at the pointer containing the needle.
    Contains(Cow<'static, str>, Cow<'static, str>),
}

impl AnswerMatch {
    /// Answers with this status (any body). A status that is not a valid HTTP status
    /// (below 100 or above 999) matches nothing.
    #[must_use]
    pub fn status(status: u16) -> Self {
        Self::statuses([status])
    }

    /// Answers with any of these statuses.
    #[must_use]
    pub fn statuses(statuses: impl IntoIterator<Item = u16>) -> Self {
        Self {
            statuses: statuses
                .into_iter()
                .filter_map(|s| StatusCode::from_u16(s).ok())
                .collect(),
            body: Vec::new(),
        }
    }

    /// ... whose body is a problem document (a JSON object with a `type`) naming this
    /// problem, by this crate's URN, any URI ending in the case name, or another
    /// verifier's alias ([`Problem::from_type`]).
    #[must_use]
    pub fn problem(mut self, problem: Problem) -> Self {
        self.body.push(BodyCondition::Problem(problem));
        self
    }

    /// ... whose JSON body has the string `value` at `pointer`.
    #[must_use]
    pub fn json(
        mut self,
        pointer: impl Into<Cow<'static, str>>,
        value: impl Into<Cow<'static, str>>,
    ) -> Self {
        self.body
            .push(BodyCondition::Equals(pointer.into(), value.into()));
        self
    }

    /// ... whose JSON body has, at `pointer`, a string containing `needle`.
    #[must_use]
    pub fn json_contains(
        mut self,
        pointer: impl Into<Cow<'static, str>>,
        needle: impl Into<Cow<'static, str>>,
    ) -> Self {
        self.body
            .push(BodyCondition::Contains(pointer.into(), needle.into()));
        self
    }

    /// The rule a dialect's [`Recognition`] describes.
    fn recognising(recognition: &Recognition) -> Self {
        let mut rule = Self::statuses(recognition.statuses());
        if let Some(problem) = recognition.problem() {
            rule = rule.problem(problem);
        }
        for &(pointer, value) in recognition.fields() {
            rule = rule.json(pointer, value);
        }
        rule
    }

    fn needs_body(&self) -> bool {
        !self.body.is_empty()
    }

    fn matches(&self, status: StatusCode, body: Option<&Value>) -> bool {
        if !self.statuses.contains(&status) {
            return false;
        }
        if self.body.is_empty() {
            return true;
        }
        let Some(body) = body else {
            return false;
        };
        self.body.iter().all(|condition| match condition {
            BodyCondition::Problem(p) => {
                body.get("type")
                    .and_then(Value::as_str)
                    .and_then(Problem::from_type)
                    == Some(*p)
            }
            BodyCondition::Equals(pointer, value) => {
                strings_at(body, pointer).any(|s| s == value.as_ref())
            }
            BodyCondition::Contains(pointer, needle) => {
                strings_at(body, pointer).any(|s| s.contains(needle.as_ref()))
            }
        })
    }
}

/// The strings at `pointer` in `doc`, where a `*` segment stands for every element of an
/// array or member of an object.
fn strings_at<'a>(doc: &'a Value, pointer: &str) -> Box<dyn Iterator<Item = &'a str> + 'a> {
    match pointer.split_once("/*") {
        Some((head, tail)) if tail.is_empty() || tail.starts_with('/') => {
            let tail = tail.to_owned();
            let children: Box<dyn Iterator<Item = &'a Value>> = match doc.pointer(head) {
                Some(Value::Array(items)) => Box::new(items.iter()),
                Some(Value::Object(members)) => Box::new(members.values()),
                _ => Box::new(std::iter::empty()),
            };
            Box::new(children.flat_map(move |child| strings_at(child, &tail).collect::<Vec<_>>()))
        }
        _ => Box::new(doc.pointer(pointer).and_then(Value::as_str).into_iter()),
    }
}

/// The retention assumed where a vendor publishes none: this crate's verifier's default.
const ASSUMED_RETENTION: Duration = Duration::from_secs(24 * 3600);

impl Default for VendorProfile {
    /// [`VendorProfile::standard`].
    fn default() -> Self {
        Self::standard()
    }
}

impl VendorProfile {
    /// A profile named `name` with the baseline every API gets: the key in
    /// `Idempotency-Key`, up to 255 characters; 409 and 423 mean "in progress" (the IETF
    /// draft answers a retry "while the original request is still being processed" with
    /// 409; idemkit 1.0 with 423); both `true|false` retry hints honoured
    /// (`x-should-retry` and `Stripe-Should-Retry`); and a retention of 24 h that no
    /// document backs ([`is_retention_documented`](Self::is_retention_documented) is
    /// `false`). No rule for a reused key: add one with
    /// [`with_key_reused`](Self::with_key_reused).
    #[must_use]
    pub fn new(name: impl Into<Cow<'static, str>>) -> Self {
        Self {
            name: name.into(),
            key: KeyPlacement::Header(IDEMPOTENCY_KEY),
            max_key_len: MAX_KEY_LEN,
            rules: Vec::new(),
            lowest_rule_status: u16::MAX,
            should_retry: vec![headers::X_SHOULD_RETRY, headers::STRIPE_SHOULD_RETRY],
            retention: ASSUMED_RETENTION,
            retention_documented: false,
        }
        .with_in_progress(in_progress_statuses())
        .with_refusals()
    }

    /// The verifier's refusals that say nothing ran and a later retry with the same key
    /// may pass: `503 store-full` and `429 quota-exceeded` (problem documents, read
    /// from the body of those statuses only). Any profile keeps them: an API behind
    /// idemkey's verifier answers them whatever its dialect.
    fn with_refusals(mut self) -> Self {
        self.rules.push((
            Class::StoreFull,
            AnswerMatch::statuses([503]).problem(Problem::StoreFull),
        ));
        self.rules.push((
            Class::QuotaExceeded,
            AnswerMatch::statuses([429]).problem(Problem::QuotaExceeded),
        ));
        self.order_rules()
    }

    /// The client side of `dialect`: its key placement and length limit, the retry
    /// hints its SDKs read, its documented retention, and a rule for each answer a
    /// client must tell apart (reused key, already executed, in progress), derived
    /// from the answers the verifier gives in that dialect
    /// ([`Dialect::recognition`]), so that the two halves cannot drift apart. The
    /// vendor constructors ([`VendorProfile::stripe`], ...) are this over the
    /// [`Dialect`] of the same name.
    ///
    /// ```
    /// use idemkey::client::VendorProfile;
    /// use idemkey::protocol::Dialect;
    /// let profile = VendorProfile::from_dialect(&Dialect::paypal());
    /// assert_eq!(profile.name(), "PayPal");
    /// assert_eq!(profile.max_key_len(), 108);
    /// ```
    #[must_use]
    pub fn from_dialect(dialect: &Dialect) -> Self {
        let mut profile = Self::new(dialect.name())
            .with_max_key_len(dialect.max_key_len())
            .with_should_retry_headers(dialect.should_retry_headers().iter().cloned());
        profile.key = dialect.key_placement().clone();
        if let Some(retention) = dialect.retention() {
            profile = profile.with_retention(retention);
        }
        for (refusal, class) in [
            (Refusal::KeyReused, Class::KeyReused),
            (Refusal::AlreadyExecuted, Class::AlreadyExecuted),
            (Refusal::InProgress, Class::InProgress),
        ] {
            if let Some(recognition) = dialect.recognition(refusal) {
                profile
                    .rules
                    .push((class, AnswerMatch::recognising(&recognition)));
            }
        }
        profile.order_rules()
    }

    /// The key goes in this header (a [`KeyHeader`](idemkey_core::protocol::KeyHeader) or any
    /// [`HeaderName`]).
    #[must_use]
    pub fn with_key_header(mut self, name: impl Into<HeaderName>) -> Self {
        self.key = KeyPlacement::Header(name.into());
        self
    }

    /// The key goes in this top-level field of the JSON request body.
    #[must_use]
    pub fn with_key_in_json_body(mut self, field: impl Into<Cow<'static, str>>) -> Self {
        self.key = KeyPlacement::JsonBodyField(field.into());
        self
    }

    /// The longest key the API accepts, in bytes (keys are ASCII: bytes are characters).
    /// Capped at this crate's own limit of 255. A longer key the caller sets fails with
    /// [`Error::is_invalid_key`](super::Error::is_invalid_key) before anything is sent.
    #[must_use]
    pub fn with_max_key_len(mut self, len: usize) -> Self {
        self.max_key_len = len.min(MAX_KEY_LEN);
        self
    }

    /// Answers matching `rule` mean "the key was used for a different request": never
    /// retried, [`Error::is_key_reused`](super::Error::is_key_reused). Checked first.
    #[must_use]
    pub fn with_key_reused(mut self, rule: AnswerMatch) -> Self {
        self.rules.push((Class::KeyReused, rule));
        self.order_rules()
    }

    /// Answers matching `rule` mean "a request with this key was executed before": never
    /// retried, [`Error::is_already_executed`](super::Error::is_already_executed). The
    /// response (kept in the error) names what the first request did.
    #[must_use]
    pub fn with_already_executed(mut self, rule: AnswerMatch) -> Self {
        self.rules.push((Class::AlreadyExecuted, rule));
        self.order_rules()
    }

    /// Answers matching `rule` mean "an earlier request with this key is still running":
    /// retried with the same key (honouring `Retry-After`), even when the status would
    /// not be (Adyen's 422), and [`Error::is_in_progress`](super::Error::is_in_progress) when
    /// they outlast the retries. A `false` retry hint still stops them.
    #[must_use]
    pub fn with_in_progress(mut self, rule: AnswerMatch) -> Self {
        self.rules.push((Class::InProgress, rule));
        self.order_rules()
    }

    /// The `true|false` hint headers honoured (see
    /// [`retry_after`](idemkey_core::protocol::retry_after) for what they do). Empty: none.
    #[must_use]
    pub fn with_should_retry_headers(
        mut self,
        names: impl IntoIterator<Item = HeaderName>,
    ) -> Self {
        self.should_retry = names.into_iter().collect();
        self
    }

    /// How long the API keeps a key (a call older than this must not be re-sent with it
    /// automatically), as documented.
    #[must_use]
    pub fn with_retention(mut self, retention: Duration) -> Self {
        self.retention = retention;
        self.retention_documented = true;
        self
    }

    /// The profile's name (`"stripe"`).
    #[must_use]
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Where the key travels.
    #[must_use]
    pub fn key_placement(&self) -> &KeyPlacement {
        &self.key
    }

    /// The longest key the API accepts, in bytes.
    #[must_use]
    pub fn max_key_len(&self) -> usize {
        self.max_key_len
    }

    /// The `true|false` retry hint headers honoured.
    #[must_use]
    pub fn should_retry_headers(&self) -> &[HeaderName] {
        &self.should_retry
    }

    /// How long the API keeps a key: the documented window, or 24 h where the vendor
    /// publishes none (then [`is_retention_documented`](Self::is_retention_documented)
    /// is `false`).
    #[must_use]
    pub fn retention(&self) -> Duration {
        self.retention
    }

    /// Whether [`retention`](Self::retention) comes from the vendor's documentation.
    #[must_use]
    pub fn is_retention_documented(&self) -> bool {
        self.retention_documented
    }

    /// Key reused, then already executed, then in progress: the first match wins.
    fn order_rules(mut self) -> Self {
        let rank = |c: &Class| match c {
            Class::KeyReused => 0,
            Class::AlreadyExecuted => 1,
            Class::InProgress => 2,
            Class::StoreFull => 3,
            Class::QuotaExceeded => 4,
            Class::Other => 5,
        };
        self.rules.sort_by_key(|(c, _)| rank(c));
        self.lowest_rule_status = self
            .rules
            .iter()
            .flat_map(|(_, rule)| rule.statuses.iter().map(StatusCode::as_u16))
            .min()
            .unwrap_or(u16::MAX);
        self
    }

    /// Whether an answer with `status` must have its body read to be classified.
    pub(crate) fn needs_body(&self, status: StatusCode) -> bool {
        status.as_u16() >= self.lowest_rule_status
            && self
                .rules
                .iter()
                .any(|(_, rule)| rule.needs_body() && rule.statuses.contains(&status))
    }

    /// What an answer means, from its status and (if read) its JSON body.
    pub(crate) fn classify(&self, status: StatusCode, body: Option<&Value>) -> Class {
        if status.as_u16() < self.lowest_rule_status {
            return Class::Other;
        }
        self.rules
            .iter()
            .find(|(_, rule)| rule.matches(status, body))
            .map_or(Class::Other, |(class, _)| *class)
    }
}

/// The in-progress answers every profile starts from: 409 and 423
/// ([`status::IN_PROGRESS`]).
fn in_progress_statuses() -> AnswerMatch {
    AnswerMatch {
        statuses: status::IN_PROGRESS.to_vec(),
        body: Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wildcard_pointers_find_strings_in_arrays_and_objects() {
        let doc = serde_json::json!({"errors": [{"code": "A"}, {"code": "IDEMPOTENCY_KEY_REUSED"}],
            "map": {"x": {"k": "v"}}});
        let found: Vec<_> = strings_at(&doc, "/errors/*/code").collect();
        assert_eq!(found, ["A", "IDEMPOTENCY_KEY_REUSED"]);
        assert_eq!(strings_at(&doc, "/map/*/k").collect::<Vec<_>>(), ["v"]);
        assert_eq!(
            strings_at(&doc, "/errors/0/code").collect::<Vec<_>>(),
            ["A"]
        );
        assert_eq!(strings_at(&doc, "/nothing/*/code").count(), 0);
        assert_eq!(strings_at(&doc, "/errors").count(), 0, "not a string");
    }

    #[test]
    fn key_reused_is_checked_before_in_progress() {
        let p = VendorProfile::standard();
        let mismatch = serde_json::json!({"type": "urn:idemkit:payload-mismatch"});
        let running = serde_json::json!({"type": "urn:idemkit:in-progress"});
        assert!(p.needs_body(StatusCode::CONFLICT));
        assert_eq!(
            p.classify(StatusCode::CONFLICT, Some(&mismatch)),
            Class::KeyReused
        );
        assert_eq!(
            p.classify(StatusCode::CONFLICT, Some(&running)),
            Class::InProgress
        );
        assert_eq!(p.classify(StatusCode::LOCKED, None), Class::InProgress);
        assert_eq!(
            p.classify(StatusCode::UNPROCESSABLE_ENTITY, None),
            Class::Other
        );
        assert_eq!(p.classify(StatusCode::OK, None), Class::Other);
        assert!(!p.needs_body(StatusCode::OK));
    }

    /// The two halves cannot drift apart: each profile reads every answer the
    /// verifier gives in its dialect as what it is, reading the body exactly when the
    /// client would.
    #[test]
    fn every_profile_reads_every_answer_of_its_dialect() {
        use idemkey_core::protocol::status::{is_never_retried, is_transient};
        for dialect in Dialect::all() {
            let profile = VendorProfile::from_dialect(&dialect);
            for refusal in Refusal::ALL {
                if dialect.status(refusal).is_none() {
                    continue;
                }
                let reply =
                    dialect.reply(refusal, "detail", Some(std::time::Duration::from_secs(1)));
                let body = profile.needs_body(reply.status).then_some(&reply.body);
                let class = profile.classify(reply.status, body);
                let expected = match refusal {
                    // Orb's 409 for a reused key is its in-progress answer.
                    Refusal::KeyReused if dialect.recognition(refusal).is_none() => {
                        Class::InProgress
                    }
                    Refusal::KeyReused => Class::KeyReused,
                    Refusal::InProgress => Class::InProgress,
                    Refusal::AlreadyExecuted => Class::AlreadyExecuted,
                    Refusal::MissingKey | Refusal::InvalidKey => {
                        assert!(
                            is_never_retried(reply.status) || reply.status == 400,
                            "{} {refusal}",
                            dialect.id()
                        );
                        Class::Other
                    }
                    Refusal::StoreUnavailable => {
                        assert!(is_transient(reply.status), "{} {refusal}", dialect.id());
                        Class::Other
                    }
                };
                assert_eq!(
                    class,
                    expected,
                    "{}: {refusal} {} {}",
                    dialect.id(),
                    reply.status,
                    reply.body
                );
            }
        }
    }

    #[test]
    fn invalid_statuses_match_nothing() {
        let rule = AnswerMatch::statuses([0, 1000, 409]);
        assert_eq!(rule.statuses, [StatusCode::CONFLICT]);
    }
}
