//! The routes file of `idemkey proxy --config FILE` (TOML).
//!
//! ```toml
//! # Settings for requests no route matches, and the defaults of every route.
//! [default]
//! key = "required"              # required | optional | off
//! scope_header = "Authorization"
//!
//! [[route]]
//! path = "/v1/charges/**"       # glob: * within a segment, ** across segments
//! methods = ["POST"]            # default: every method
//! key = "required"
//! key_header = "Idempotency-Key"
//! retention = "24h"
//! body_limit = 1048576          # bytes of request body buffered (413 beyond)
//! stored_response_limit = 1048576
//! key_reused_status = 400       # Stripe's; 422 by default
//! dialect = "stripe"            # answer as this vendor does (`idemkey proxy --help`)
//! fingerprint = { headers = ["Stripe-Account"], canonical_json = true }
//! # New keys per second per scope (the scope header's value), bursts, and claims in
//! # progress per scope; over it: 429 quota-exceeded. `shared = true` keeps the buckets
//! # in the store (Redis), so that several proxies enforce one limit.
//! quota = { per_second = 60, burst = 300, max_in_progress = 50, shared = false }
//! ```
//!
//! The first route whose path and methods match a request decides; a route's unset
//! settings come from `[default]`, then from the verifier's defaults. Without `key`, a
//! route requires keys on methods other than GET, HEAD, OPTIONS and TRACE and steps
//! aside on those.

use std::time::Duration;

use globset::{GlobBuilder, GlobMatcher};
use http::{HeaderName, Method, StatusCode};
use serde::Deserialize;

use idemkey::fingerprint::Fingerprinter;
use idemkey::protocol::dialect::{Dialect, KeyPlacement};
use idemkey::server::policy::{KeyRequirement, Quota};

/// The whole file.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    #[serde(default)]
    default: Settings,
    #[serde(default)]
    route: Vec<RouteEntry>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RouteEntry {
    path: String,
    #[serde(default)]
    methods: Vec<String>,
    #[serde(flatten)]
    settings: Settings,
}

/// What a route (or `[default]`) may set; `None` inherits.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct Settings {
    key: Option<Requirement>,
    key_header: Option<String>,
    scope_header: Option<String>,
    retention: Option<String>,
    body_limit: Option<usize>,
    stored_response_limit: Option<usize>,
    key_reused_status: Option<u16>,
    dialect: Option<String>,
    fingerprint: Option<FingerprintSettings>,
    quota: Option<QuotaSettings>,
}

/// A route's quota of new keys per scope (`Quota`).
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct QuotaSettings {
    /// New keys a second, on average.
    per_second: Option<f64>,
    /// Bursts of up to this many new keys (default: one second's worth).
    burst: Option<u32>,
    /// Claims in progress at once.
    max_in_progress: Option<usize>,
    /// Buckets kept in the store (Redis), shared by every proxy on it.
    #[serde(default)]
    shared: bool,
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(rename_all = "lowercase")]
enum Requirement {
    Required,
    Optional,
    Off,
}

#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct FingerprintSettings {
    /// Headers whose values also count.
    #[serde(default)]
    headers: Vec<String>,
    /// RFC 8785 canonical JSON bodies.
    #[serde(default)]
    canonical_json: bool,
    /// Only these JSON fields of the body count (JSON pointers).
    #[serde(default)]
    json_fields: Vec<String>,
    /// `false`: the body does not count at all.
    #[serde(default = "yes")]
    body: bool,
}

fn yes() -> bool {
    true
}

/// One route, resolved: what the proxy builds a verifier from.
#[derive(Debug, Clone)]
pub(crate) struct Route {
    /// `None`: the default route (every path).
    pub(crate) path: Option<GlobMatcher>,
    pub(crate) pattern: String,
    /// Empty: every method.
    pub(crate) methods: Vec<Method>,
    /// `None`: required on unsafe methods, off on safe ones.
    pub(crate) key: Option<KeyRequirement>,
    pub(crate) key_header: HeaderName,
    /// The file named the key header.
    pub(crate) key_header_named: bool,
    pub(crate) scope_header: Option<HeaderName>,
    pub(crate) retention: Option<Duration>,
    pub(crate) body_limit: Option<usize>,
    pub(crate) stored_response_limit: Option<usize>,
    pub(crate) key_reused_status: Option<StatusCode>,
    /// The vendor dialect the route answers in (`None`: the standard one).
    pub(crate) dialect: Option<Dialect>,
    pub(crate) fingerprinter: Fingerprinter,
    pub(crate) quota: Option<Quota>,
}

impl Route {
    /// Answer in `dialect` (the `--dialect` flag, for routes the file gives none): the
    /// key header becomes the dialect's, unless the file named one.
    pub(crate) fn use_dialect(&mut self, dialect: Dialect) {
        if let (KeyPlacement::Header(name), false) =
            (dialect.key_placement(), self.key_header_named)
        {
            self.key_header = name.clone();
        }
        self.dialect = Some(dialect);
    }

    /// Whether this route decides for `method` on `path`.
    pub(crate) fn matches(&self, method: &Method, path: &str) -> bool {
        (self.methods.is_empty() || self.methods.contains(method))
            && self.path.as_ref().is_none_or(|p| p.is_match(path))
    }
}

/// The routes, in order, then the default route (which matches everything): the
/// built-in one without a file.
pub(crate) fn load(text: Option<(&str, &str)>) -> Result<Vec<Route>, String> {
    let file: File = match text {
        Some((name, text)) => toml::from_str(text).map_err(|e| format!("{name}: {e}"))?,
        None => File::default(),
    };
    let mut routes = Vec::new();
    for (i, entry) in file.route.iter().enumerate() {
        let context = format!("route {} ({:?})", i + 1, entry.path);
        let glob = GlobBuilder::new(&entry.path)
            .literal_separator(true)
            .build()
            .map_err(|e| format!("{context}: bad path pattern: {e}"))?;
        let methods = entry
            .methods
            .iter()
            .map(|m| {
                Method::from_bytes(m.to_ascii_uppercase().as_bytes())
                    .map_err(|e| format!("{context}: bad method {m:?}: {e}"))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let settings = merge(&entry.settings, &file.default);
        routes.push(resolve(
            &context,
            Some(glob.compile_matcher()),
            entry.path.clone(),
            methods,
            &settings,
        )?);
    }
    routes.push(resolve(
        "[default]",
        None,
        "(default)".into(),
        Vec::new(),
        &file.default,
    )?);
    Ok(routes)
}

fn merge(route: &Settings, default: &Settings) -> Settings {
    Settings {
        key: route.key.or(default.key),
        key_header: route
            .key_header
            .clone()
            .or_else(|| default.key_header.clone()),
        scope_header: route
            .scope_header
            .clone()
            .or_else(|| default.scope_header.clone()),
        retention: route
            .retention
            .clone()
            .or_else(|| default.retention.clone()),
        body_limit: route.body_limit.or(default.body_limit),
        stored_response_limit: route
            .stored_response_limit
            .or(default.stored_response_limit),
        key_reused_status: route.key_reused_status.or(default.key_reused_status),
        dialect: route.dialect.clone().or_else(|| default.dialect.clone()),
        fingerprint: route
            .fingerprint
            .clone()
            .or_else(|| default.fingerprint.clone()),
        quota: route.quota.clone().or_else(|| default.quota.clone()),
    }
}

/// The quota a route's settings describe.
fn quota(context: &str, q: &QuotaSettings) -> Result<Quota, String> {
    let bad = |e: idemkey::server::policy::QuotaError| format!("{context}: quota: {e}");
    let mut quota = match (q.per_second, q.max_in_progress) {
        (Some(rate), _) => Quota::per_second(rate).map_err(bad)?,
        (None, Some(max)) => Quota::in_progress_only(max).map_err(bad)?,
        (None, None) => {
            return Err(format!(
                "{context}: quota needs per_second (new keys a second) or max_in_progress"
            ));
        }
    };
    if let Some(burst) = q.burst {
        if q.per_second.is_none() {
            return Err(format!("{context}: quota: burst needs per_second"));
        }
        quota = quota.burst(burst).map_err(bad)?;
    }
    if let (Some(_), Some(max)) = (q.per_second, q.max_in_progress) {
        quota = quota.max_in_progress(max).map_err(bad)?;
    }
    if q.shared {
        quota = quota.shared();
    }
    Ok(quota)
}

fn header(context: &str, what: &str, name: &str) -> Result<HeaderName, String> {
    HeaderName::from_bytes(name.as_bytes())
        .map_err(|e| format!("{context}: bad {what} {name:?}: {e}"))
}

fn resolve(
    context: &str,
    path: Option<GlobMatcher>,
    pattern: String,
    methods: Vec<Method>,
    s: &Settings,
) -> Result<Route, String> {
    let mut fingerprinter = Fingerprinter::new();
    if let Some(f) = &s.fingerprint {
        for h in &f.headers {
            fingerprinter = fingerprinter.header(header(context, "fingerprint header", h)?);
        }
        if f.canonical_json {
            fingerprinter = fingerprinter.canonical_json();
        }
        if !f.json_fields.is_empty() {
            if let Some(bad) = f
                .json_fields
                .iter()
                .find(|p| !p.is_empty() && !p.starts_with('/'))
            {
                return Err(format!(
                    "{context}: json_fields takes JSON pointers such as \"/amount\", not {bad:?}"
                ));
            }
            fingerprinter = fingerprinter.json_fields(f.json_fields.iter().map(String::as_str));
        }
        if !f.body {
            fingerprinter = fingerprinter.without_body();
        }
    }
    let key_reused_status = s
        .key_reused_status
        .map(|code| {
            StatusCode::from_u16(code)
                .ok()
                .filter(StatusCode::is_client_error)
                .ok_or_else(|| format!("{context}: key_reused_status {code} is not a 4xx status"))
        })
        .transpose()?;
    let quota = s.quota.as_ref().map(|q| quota(context, q)).transpose()?;
    let dialect = s
        .dialect
        .as_deref()
        .map(|d| {
            d.parse::<Dialect>()
                .map_err(|e| format!("{context}: dialect: {e}"))
        })
        .transpose()?;
    let key_header = match dialect.as_ref().map(Dialect::key_placement) {
        // The dialect's header, unless the file names another.
        Some(KeyPlacement::Header(name)) if s.key_header.is_none() => name.clone(),
        _ => header(
            context,
            "key_header",
            s.key_header.as_deref().unwrap_or("idempotency-key"),
        )?,
    };
    Ok(Route {
        dialect,
        quota,
        path,
        pattern,
        methods,
        key: s.key.map(|k| match k {
            Requirement::Required => KeyRequirement::Required,
            Requirement::Optional => KeyRequirement::Optional,
            Requirement::Off => KeyRequirement::Off,
        }),
        key_header,
        key_header_named: s.key_header.is_some(),
        scope_header: s
            .scope_header
            .as_deref()
            .map(|h| header(context, "scope_header", h))
            .transpose()?,
        retention: s
            .retention
            .as_deref()
            .map(|r| crate::durations::parse(r).map_err(|e| format!("{context}: retention: {e}")))
            .transpose()?,
        body_limit: s.body_limit,
        stored_response_limit: s.stored_response_limit,
        key_reused_status,
        fingerprinter,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_inherit_the_default_and_match_in_order() {
        let text = r#"
            [default]
            scope_header = "Authorization"
            key = "optional"

            [[route]]
            path = "/v1/charges/**"
            methods = ["post"]
            key = "required"
            retention = "7days"

            [[route]]
            path = "/v1/*"
        "#;
        let routes = load(Some(("routes.toml", text))).expect("valid");
        assert_eq!(routes.len(), 3);
        let charges = &routes[0];
        assert!(charges.matches(&Method::POST, "/v1/charges/ch_1/capture"));
        assert!(!charges.matches(&Method::GET, "/v1/charges/ch_1"));
        assert_eq!(charges.key, Some(KeyRequirement::Required));
        assert_eq!(charges.retention, Some(Duration::from_secs(7 * 86_400)));
        assert_eq!(
            charges.scope_header.as_ref().map(HeaderName::as_str),
            Some("authorization")
        );
        assert!(routes[1].matches(&Method::GET, "/v1/refunds"));
        assert!(
            !routes[1].matches(&Method::GET, "/v1/refunds/re_1"),
            "* stays in a segment"
        );
        assert_eq!(
            routes[1].key,
            Some(KeyRequirement::Optional),
            "from [default]"
        );
        assert!(routes[2].matches(&Method::DELETE, "/anything"));
    }

    #[test]
    fn mistakes_are_named() {
        let err = load(Some((
            "r.toml",
            "[[route]]\npath = \"/a\"\nkey = \"maybe\"\n",
        )))
        .expect_err("invalid");
        assert!(err.contains("r.toml") && err.contains("maybe"), "{err}");
        let err = load(Some((
            "r.toml",
            "[[route]]\npath = \"/a\"\nretention = \"soon\"\n",
        )))
        .expect_err("invalid");
        assert!(err.contains("retention"), "{err}");
        let err = load(Some((
            "r.toml",
            "[[route]]\npath = \"/a\"\nkey_reused_status = 200\n",
        )))
        .expect_err("invalid");
        assert!(err.contains("4xx"), "{err}");
        let err = load(Some(("r.toml", "[default]\nbody_limt = 1\n"))).expect_err("invalid");
        assert!(err.contains("body_limt"), "{err}");
        for (bad, says) in [
            ("quota = { per_second = 0 }", "quota"),
            ("quota = { per_second = -5 }", "quota"),
            ("quota = { burst = 10 }", "per_second"),
            ("quota = { per_second = 5, burst = 0 }", "quota"),
            ("quota = { per_second = 5, per_hour = 1 }", "per_hour"),
        ] {
            let err = load(Some((
                "r.toml",
                &format!("[[route]]\npath = \"/a\"\n{bad}\n"),
            )))
            .expect_err(bad);
            assert!(err.contains(says), "{bad}: {err}");
        }
    }

    #[test]
    fn a_dialect_per_route_or_by_default() {
        let routes = load(Some((
            "r.toml",
            "[default]\ndialect = \"paypal\"\n[[route]]\npath = \"/a\"\ndialect = \"square\"\n",
        )))
        .expect("valid");
        assert_eq!(routes[0].dialect.as_ref().map(Dialect::id), Some("square"));
        assert_eq!(routes[1].dialect.as_ref().map(Dialect::id), Some("paypal"));
        assert_eq!(routes[1].key_header, "paypal-request-id");
        let err = load(Some(("r.toml", "[default]\ndialect = \"strip\"\n"))).expect_err("unknown");
        assert!(err.contains("stripe") && err.contains("[default]"), "{err}");
    }

    #[test]
    fn a_quota_per_route_or_by_default() {
        let routes = load(Some((
            "r.toml",
            "[default]\nquota = { max_in_progress = 3 }\n\
             [[route]]\npath = \"/a\"\nquota = { per_second = 60, burst = 300, shared = true }\n\
             [[route]]\npath = \"/b\"\n",
        )))
        .expect("valid");
        let a = routes[0].quota.expect("its own");
        assert_eq!(
            (a.rate_per_second(), a.burst_size(), a.is_shared()),
            (Some(60.0), Some(300), true)
        );
        let b = routes[1].quota.expect("the default's");
        assert_eq!(
            (b.rate_per_second(), b.in_progress_limit()),
            (None, Some(3))
        );
    }
}
