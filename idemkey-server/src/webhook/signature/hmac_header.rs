//! An HMAC in one header: of the raw body (GitHub, Onfido, Sumsub), or of
//! `{t}.{body}` in Stripe's `t=...,v1=...` form (Stripe, Persona).

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use hmac::{Hmac, KeyInit, Mac};
use http::{HeaderMap, HeaderName};
use sha2::{Sha256, Sha512};

use super::{
    DEFAULT_TOLERANCE, SignatureError, VerifySignature, check_fresh, header_text, hmac_sha256,
    matches,
};

/// Verifies a signature header that carries a hex HMAC: of the raw body, or of
/// `{t}.{body}` for the timestamped `t=<unix>,v1=<hex>` form.
///
/// One constructor per sender, each citing the sender's documentation, and
/// [`HmacVerifier::new`] for any other sender that puts a hex HMAC-SHA256 of the raw
/// body in a header. Secrets are used as their UTF-8 bytes, as the senders' own
/// libraries use them. Signatures are compared in constant time; a header sent more
/// than once is checked value by value.
///
/// ```
/// use idemkey::server::webhook::{HmacVerifier, VerifySignature};
/// use http::HeaderMap;
///
/// // Onfido's own test vector (onfido-node, test/classic-webhook-event-verifier.test.ts).
/// let onfido = HmacVerifier::onfido("_ABC123abc123ABC123abc123ABC123_");
/// let body = br#"{"payload":{"resource_type":"check","action":"check.completed","object":{"id":"check-123","status":"complete","completed_at_iso8601":"2020-01-01T00:00:00Z","href":"https://api.onfido.com/v3/checks/check-123"}}}"#;
/// let mut headers = HeaderMap::new();
/// headers.insert("x-sha2-signature", "a0082d7481f9f0a2907583dbe1f344d6d4c0d9989df2fd804f98479f60cd760e".parse()?);
/// onfido.verify(&headers, body)?;
/// headers.insert("x-sha2-signature", "b0082d7481f9f0a2907583dbe1f344d6d4c0d9989df2fd804f98479f60cd760e".parse()?);
/// assert!(onfido.verify(&headers, body).unwrap_err().is_mismatch());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone)]
pub struct HmacVerifier {
    key: Arc<[u8]>,
    header: HeaderName,
    scheme: Scheme,
    tolerance: Duration,
}

#[derive(Clone, Debug)]
enum Scheme {
    /// A hex HMAC of the raw body, after an optional prefix (GitHub's `sha256=`).
    Body {
        prefix: Option<Arc<str>>,
        algorithm: Algorithm,
    },
    /// Sets of `t=<unix>` and `v1=<hex>`: HMAC-SHA256 of `{t}.{body}`.
    Timestamped,
}

#[derive(Clone, Debug)]
enum Algorithm {
    Sha256,
    /// Named per delivery by this header (Sumsub's `x-payload-digest-alg`), SHA-256 when
    /// it is absent.
    NamedBy(HeaderName),
}

impl fmt::Debug for HmacVerifier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HmacVerifier")
            .field("key", &"<redacted>")
            .field("header", &self.header)
            .field("scheme", &self.scheme)
            .field("tolerance", &self.tolerance)
            .finish()
    }
}

impl HmacVerifier {
    fn with(header: &'static str, secret: &str, scheme: Scheme) -> Self {
        Self {
            key: Arc::from(secret.as_bytes()),
            header: HeaderName::from_static(header),
            scheme,
            tolerance: DEFAULT_TOLERANCE,
        }
    }

    /// A hex HMAC-SHA256 of the raw body in `header`, keyed with `secret`'s bytes.
    #[must_use]
    pub fn new(header: HeaderName, secret: impl AsRef<[u8]>) -> Self {
        Self {
            key: Arc::from(secret.as_ref()),
            header,
            scheme: Scheme::Body {
                prefix: None,
                algorithm: Algorithm::Sha256,
            },
            tolerance: DEFAULT_TOLERANCE,
        }
    }

    /// The header value starts with `prefix` before the hex (`"sha256="`); a value
    /// without it is malformed. For body signatures only.
    #[must_use]
    pub fn prefix(mut self, prefix: impl Into<Arc<str>>) -> Self {
        if let Scheme::Body { prefix: p, .. } = &mut self.scheme {
            *p = Some(prefix.into());
        }
        self
    }

    /// How far a signed `t=` may be from now, either way (default
    /// [`DEFAULT_TOLERANCE`](super::DEFAULT_TOLERANCE), 5 minutes). For the timestamped
    /// form only; body signatures carry no time.
    #[must_use]
    pub fn tolerance(mut self, tolerance: Duration) -> Self {
        self.tolerance = tolerance;
        self
    }

    /// GitHub: `X-Hub-Signature-256: sha256=<hex HMAC-SHA256 of the body>`.
    ///
    /// Source: GitHub docs, "Validating webhook deliveries" (the hash signature starts
    /// with `sha256=` and is an HMAC hex digest of the payload, keyed with the webhook
    /// secret).
    #[must_use]
    pub fn github(secret: &str) -> Self {
        Self::with(
            "x-hub-signature-256",
            secret,
            Scheme::Body {
                prefix: Some(Arc::from("sha256=")),
                algorithm: Algorithm::Sha256,
            },
        )
    }

    /// Onfido: `X-SHA2-Signature: <hex HMAC-SHA256 of the raw body>`, keyed with the
    /// webhook's token. No timestamp: Onfido's scheme has none, so freshness cannot be
    /// checked (the preset's deduplication still stops replays of a processed event).
    ///
    /// Source: Onfido docs, "Manual webhook signature verification"
    /// (documentation.onfido.com/api/manual-webhook-signature-verification: "Each webhook
    /// event will have an `X-SHA2-Signature` header ... in hexadecimal format", "computing
    /// the HMAC of the event request body using the SHA256 algorithm, using the webhook's
    /// secret token as the key", "Make sure you use the raw event request body"), and
    /// onfido-node `webhook-event-verifier.ts`. Tested against onfido-node's vectors.
    #[must_use]
    pub fn onfido(token: &str) -> Self {
        Self::with(
            "x-sha2-signature",
            token,
            Scheme::Body {
                prefix: None,
                algorithm: Algorithm::Sha256,
            },
        )
    }

    /// Sumsub: `x-payload-digest: <hex HMAC of the raw body>`, with the algorithm in
    /// `x-payload-digest-alg`: `HMAC_SHA256_HEX` (the default, also when the header is
    /// absent), `HMAC_SHA512_HEX` or the legacy `HMAC_SHA1_HEX`. The key is the
    /// webhook's own secret, not the App Token secret. No timestamp in the scheme.
    ///
    /// Source: Sumsub docs, "Webhooks" / "Webhook manager" (docs.sumsub.com/docs/webhooks:
    /// "Specify a secret key to be used to calculate the digest with the HMAC
    /// algorithm"; SHA256 is the default, SHA512 selectable), and Sumsub's
    /// SumSubstance/agent-skills `sumsub-integrate-websdk/SKILL.md` (`x-payload-digest`
    /// hex-encoded, `x-payload-digest-alg` one of the three names, computed over the raw
    /// bytes).
    #[must_use]
    pub fn sumsub(secret: &str) -> Self {
        Self::with(
            "x-payload-digest",
            secret,
            Scheme::Body {
                prefix: None,
                algorithm: Algorithm::NamedBy(HeaderName::from_static("x-payload-digest-alg")),
            },
        )
    }

    /// Stripe: `Stripe-Signature: t=<unix>,v1=<hex>[,v1=...]`, HMAC-SHA256 of
    /// `{t}.{body}` with the endpoint's signing secret (the whole `whsec_...` string).
    ///
    /// Source: Stripe docs, Webhooks, "Verify webhook signatures manually" (the signed
    /// payload is the timestamp, `.` and the raw body; compare against every `v1`;
    /// Stripe's libraries allow 5 minutes of skew by default).
    #[must_use]
    pub fn stripe(secret: &str) -> Self {
        Self::with("stripe-signature", secret, Scheme::Timestamped)
    }

    /// Persona: `Persona-Signature: t=<unix>,v1=<hex>`, HMAC-SHA256 of `{t}.{body}`
    /// with the webhook secret (`wbhsec_...`); while a secret rotates, two
    /// space-separated `t=...,v1=...` sets, any of which may match.
    ///
    /// Source: Persona docs, "Webhooks" / "Webhook best practices" (docs.withpersona.com:
    /// "The first key-value pair will be in the form `t=<unix_timestamp>` ... The second
    /// ... `v1=<signature>`, where the signature is computed from your webhook secret and
    /// a dot-separated string composed of the unix timestamp joined with the request
    /// body"; "the Persona-Signature header will contain two space-separated sets of the
    /// key-value pairs" during rotation). Persona's docs give no tolerance: the 5-minute
    /// default is this crate's choice.
    #[must_use]
    pub fn persona(secret: &str) -> Self {
        Self::with("persona-signature", secret, Scheme::Timestamped)
    }

    fn verify_body(
        &self,
        headers: &HeaderMap,
        body: &[u8],
        prefix: Option<&str>,
        algorithm: &Algorithm,
    ) -> Result<(), SignatureError> {
        let algorithm = match algorithm {
            Algorithm::Sha256 => "HMAC_SHA256_HEX",
            Algorithm::NamedBy(name) => header_text(headers, name)?.unwrap_or("HMAC_SHA256_HEX"),
        };
        let mac = |candidate: &[u8]| -> Result<bool, SignatureError> {
            Ok(match algorithm {
                "HMAC_SHA256_HEX" => matches(&keyed::<Hmac<Sha256>>(&self.key, body), candidate),
                "HMAC_SHA512_HEX" => matches(&keyed::<Hmac<Sha512>>(&self.key, body), candidate),
                "HMAC_SHA1_HEX" => matches(&keyed::<Hmac<sha1::Sha1>>(&self.key, body), candidate),
                other => {
                    return Err(SignatureError::malformed(format_args!(
                        "the signature algorithm `{other}` (expected HMAC_SHA256_HEX, HMAC_SHA512_HEX or HMAC_SHA1_HEX)"
                    )));
                }
            })
        };
        let what = || format!("header `{}`", self.header);
        let mut values = headers.get_all(&self.header).iter().peekable();
        if values.peek().is_none() {
            return Err(SignatureError::missing(what()));
        }
        for value in values {
            let text = value
                .to_str()
                .map_err(|_| SignatureError::malformed(what()))?
                .trim();
            let hex_text = match prefix {
                Some(p) => text.strip_prefix(p).ok_or_else(|| {
                    SignatureError::malformed(format_args!("{} (no `{p}` prefix)", what()))
                })?,
                None => text,
            };
            let candidate = hex::decode(hex_text)
                .map_err(|_| SignatureError::malformed(format_args!("{} (not hex)", what())))?;
            if mac(&candidate)? {
                return Ok(());
            }
        }
        Err(SignatureError::mismatch())
    }

    fn verify_timestamped(
        &self,
        headers: &HeaderMap,
        body: &[u8],
        now: SystemTime,
    ) -> Result<(), SignatureError> {
        let what = || format!("header `{}`", self.header);
        let mut values = headers.get_all(&self.header).iter().peekable();
        if values.peek().is_none() {
            return Err(SignatureError::missing(what()));
        }
        let mut stale = None;
        let mut fresh_seen = false;
        for value in values {
            let text = value
                .to_str()
                .map_err(|_| SignatureError::malformed(what()))?;
            for set in signed_sets(text)
                .map_err(|why| SignatureError::malformed(format_args!("{} ({why})", what())))?
            {
                if let Err(e) = check_fresh(set.t, now, self.tolerance) {
                    stale = Some(e);
                    continue;
                }
                fresh_seen = true;
                let mut mac = hmac_sha256(&self.key);
                mac.update(set.t_text.as_bytes());
                mac.update(b".");
                mac.update(body);
                if set
                    .v1
                    .iter()
                    .filter_map(|s| hex::decode(s).ok())
                    .any(|c| matches(&mac, &c))
                {
                    return Ok(());
                }
            }
        }
        match stale {
            Some(e) if !fresh_seen => Err(e),
            _ => Err(SignatureError::mismatch()),
        }
    }
}

fn keyed<M: Mac + KeyInit>(key: &[u8], body: &[u8]) -> M {
    let mut m = <M as KeyInit>::new_from_slice(key)
        .unwrap_or_else(|_| unreachable!("HMAC takes keys of any length"));
    m.update(body);
    m
}

/// One `t=...,v1=...` set of a timestamped header.
struct SignedSet<'a> {
    t: i64,
    t_text: &'a str,
    v1: Vec<&'a str>,
}

/// The sets of a timestamped header: every `t=` opens a set, the `v1=` after it belong
/// to it (Stripe: `t=1,v1=a,v1=b`; Persona while rotating: `t=1,v1=a t=1,v1=b`); other
/// schemes (`v0=`) are skipped.
fn signed_sets(value: &str) -> Result<Vec<SignedSet<'_>>, &'static str> {
    let mut sets: Vec<SignedSet<'_>> = Vec::new();
    for item in value
        .split(|c: char| c == ',' || c.is_ascii_whitespace())
        .filter(|s| !s.is_empty())
    {
        match item.split_once('=') {
            Some(("t", t)) => sets.push(SignedSet {
                t: t.parse().map_err(|_| "`t=` is not a Unix time")?,
                t_text: t,
                v1: Vec::new(),
            }),
            Some(("v1", sig)) => sets.last_mut().ok_or("`v1=` before any `t=`")?.v1.push(sig),
            _ => {}
        }
    }
    if sets.is_empty() {
        return Err("no `t=` timestamp");
    }
    Ok(sets)
}

/// The one way to check a signature: what
/// [`Preset::verifier`](crate::webhook::Preset::verifier) runs.
impl VerifySignature for HmacVerifier {
    fn verify_at(
        &self,
        headers: &HeaderMap,
        body: &[u8],
        now: SystemTime,
    ) -> Result<(), SignatureError> {
        match &self.scheme {
            Scheme::Body { prefix, algorithm } => {
                self.verify_body(headers, body, prefix.as_deref(), algorithm)
            }
            Scheme::Timestamped => self.verify_timestamped(headers, body, now),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::UNIX_EPOCH;

    use super::*;

    fn h(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut m = HeaderMap::new();
        for (k, v) in pairs {
            m.append(*k, v.parse().expect("valid value"));
        }
        m
    }

    fn hex_mac<M: Mac + KeyInit>(key: &str, parts: &[&[u8]]) -> String {
        let mut m = <M as KeyInit>::new_from_slice(key.as_bytes()).expect("any length");
        for p in parts {
            m.update(p);
        }
        hex::encode(m.finalize().into_bytes())
    }

    #[test]
    fn onfido_vendor_vectors() {
        // onfido-node test/studio-webhook-event-verifier.test.ts.
        let v = HmacVerifier::onfido("YKOC6mkBxi6yK2zlUIrLMvsJMFEZObP5");
        let body = br#"{"payload":{"resource_type":"workflow_task","action":"workflow_task.started","object":{"id":"profile_1eb92","task_spec_id":"profile_1eb92","task_def_id":"profile_data","workflow_run_id":"bc77c6e5-753a-4580-96a6-aaed3e5a8d19","status":"started","started_at_iso8601":"2024-07-10T12:49:09Z","href":"https://api.eu.onfido.com/v3.6/workflow_runs/bc77c6e5-753a-4580-96a6-aaed3e5a8d19/tasks/profile_1eb92"},"resource":{"created_at":"2024-07-10T12:49:09Z","id":"profile_1eb92","workflow_run_id":"bc77c6e5-753a-4580-96a6-aaed3e5a8d19","updated_at":"2024-07-10T12:49:09Z","input":{},"task_def_version":null,"task_def_id":"profile_data","output":null}}}"#;
        let sig = "c95a5b785484f6fa1bc25f381b5595d66bf85cb442eefb06aa007802ee6a4dfa";
        v.verify(&h(&[("x-sha2-signature", sig)]), body)
            .expect("vendor vector");
        // Upper-case hex is the same signature.
        v.verify(&h(&[("x-sha2-signature", &sig.to_uppercase())]), body)
            .expect("case-insensitive hex");
        let e = v.verify(&HeaderMap::new(), body).expect_err("unsigned");
        assert!(
            e.is_malformed() && e.to_string().contains("x-sha2-signature"),
            "{e}"
        );
        let e = v
            .verify(&h(&[("x-sha2-signature", "zz")]), body)
            .expect_err("not hex");
        assert!(e.is_malformed(), "{e}");
    }

    #[test]
    fn sumsub_algorithms_named_by_header() {
        let v = HmacVerifier::sumsub("sumsub_webhook_secret");
        let body = br#"{"applicantId":"5cb56e8e0a975a35f333cb83","type":"applicantReviewed"}"#;
        let sha256 = hex_mac::<Hmac<Sha256>>("sumsub_webhook_secret", &[body]);
        let sha512 = hex_mac::<Hmac<Sha512>>("sumsub_webhook_secret", &[body]);
        let sha1 = hex_mac::<Hmac<sha1::Sha1>>("sumsub_webhook_secret", &[body]);
        v.verify(&h(&[("x-payload-digest", &sha256)]), body)
            .expect("SHA-256 when no algorithm is named");
        for (alg, sig) in [
            ("HMAC_SHA256_HEX", &sha256),
            ("HMAC_SHA512_HEX", &sha512),
            ("HMAC_SHA1_HEX", &sha1),
        ] {
            let hs = h(&[("x-payload-digest", sig), ("x-payload-digest-alg", alg)]);
            v.verify(&hs, body).expect(alg);
        }
        // The algorithm header cannot downgrade: a SHA-256 digest named SHA-1 fails.
        let wrong = h(&[
            ("x-payload-digest", &sha256),
            ("x-payload-digest-alg", "HMAC_SHA1_HEX"),
        ]);
        assert!(v.verify(&wrong, body).expect_err("mismatch").is_mismatch());
        let unknown = h(&[
            ("x-payload-digest", &sha256),
            ("x-payload-digest-alg", "MD5"),
        ]);
        assert!(
            v.verify(&unknown, body)
                .expect_err("unknown")
                .is_malformed()
        );
    }

    #[test]
    fn github_prefix() {
        let v = HmacVerifier::github("It's a Secret to Everybody");
        // GitHub docs, "Validating webhook deliveries", test values.
        let body = b"Hello, World!";
        let sig = "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17";
        v.verify(&h(&[("x-hub-signature-256", sig)]), body)
            .expect("GitHub's example");
        let bare = &sig["sha256=".len()..];
        let e = v
            .verify(&h(&[("x-hub-signature-256", bare)]), body)
            .expect_err("no prefix");
        assert!(e.is_malformed(), "{e}");
    }

    #[test]
    fn timestamped_sets_stripe_and_persona_rotation() {
        let at = |s: u64| UNIX_EPOCH + Duration::from_secs(s);
        let body = br#"{"data":{"type":"event","id":"evt_1"}}"#;
        let good = hex_mac::<Hmac<Sha256>>("wbhsec_test", &[b"1750000000", b".", body]);
        let other = hex_mac::<Hmac<Sha256>>("wbhsec_old", &[b"1750000000", b".", body]);
        let v = HmacVerifier::persona("wbhsec_test");
        let one = format!("t=1750000000,v1={good}");
        v.verify_at(&h(&[("persona-signature", &one)]), body, at(1_750_000_010))
            .expect("one set");
        let rotating = format!("t=1750000000,v1={other} t=1750000000,v1={good}");
        v.verify_at(
            &h(&[("persona-signature", &rotating)]),
            body,
            at(1_750_000_010),
        )
        .expect("the second set matches");
        let e = v
            .verify_at(&h(&[("persona-signature", &one)]), body, at(1_750_003_600))
            .expect_err("an hour later");
        assert!(e.is_stale(), "{e}");
        let e = v
            .verify_at(&h(&[("persona-signature", &one)]), b"{}", at(1_750_000_010))
            .expect_err("another body");
        assert!(e.is_mismatch(), "{e}");
        for bad in ["v1=abc", "t=soon,v1=abc", "v1=abc,t=1"] {
            let e = v
                .verify_at(&h(&[("persona-signature", bad)]), body, at(1_750_000_010))
                .expect_err(bad);
            assert!(e.is_malformed(), "{bad}: {e}");
        }
        let stripe = HmacVerifier::stripe("wbhsec_test");
        let several = format!("t=1750000000,v0=ignored,v1={other},v1={good}");
        stripe
            .verify_at(
                &h(&[("stripe-signature", &several)]),
                body,
                at(1_750_000_000),
            )
            .expect("any v1 of the set");
        assert!(
            !format!("{stripe:?}").contains("wbhsec"),
            "Debug hides the key"
        );
    }
}
