//! What the crate emits, captured: a `tracing` layer that records every span with its
//! fields (as created and as recorded later) and its parent, and the counters and
//! histograms of `metrics-util`'s debugging recorder. Both are installed for the
//! current thread only (a `#[tokio::test]`'s current-thread runtime runs the servers and
//! clients of the test on it), so tests running side by side do not see each other.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing_subscriber::Layer;
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;

/// One captured span: its name, its level, its fields as text, and its parent's name.
#[derive(Debug, Clone, Default)]
pub(crate) struct CapturedSpan {
    pub(crate) name: String,
    /// `TRACE`, `DEBUG`, `INFO`, `WARN` or `ERROR`.
    pub(crate) level: String,
    pub(crate) parent: Option<String>,
    pub(crate) fields: BTreeMap<String, String>,
}

impl CapturedSpan {
    /// The field `name`, as text (panics naming the span when absent).
    pub(crate) fn field(&self, name: &str) -> &str {
        self.fields
            .get(name)
            .unwrap_or_else(|| panic!("span {} has no field {name}: {self:?}", self.name))
    }
}

/// The spans captured so far, in creation order.
#[derive(Clone, Default)]
pub(crate) struct Spans(Arc<Mutex<Vec<CapturedSpan>>>);

impl Spans {
    /// `(idemkey.decision, http.response.status_code)` of each `idemkey.request` span,
    /// in order.
    pub(crate) fn decisions(&self) -> Vec<(String, String)> {
        self.named("idemkey.request")
            .iter()
            .map(|s| {
                (
                    s.field("idemkey.decision").to_owned(),
                    s.field("http.response.status_code").to_owned(),
                )
            })
            .collect()
    }

    /// Every captured span named `name`.
    pub(crate) fn named(&self, name: &str) -> Vec<CapturedSpan> {
        self.lock()
            .iter()
            .filter(|s| s.name == name)
            .cloned()
            .collect()
    }

    /// Every captured span.
    pub(crate) fn all(&self) -> Vec<CapturedSpan> {
        self.lock().clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<CapturedSpan>> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// The index of a span in [`Spans`], kept in the span's extensions.
struct Index(usize);

struct Fields<'a>(&'a mut BTreeMap<String, String>);

impl Visit for Fields<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.insert(field.name().to_owned(), format!("{value:?}"));
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }
}

impl<S: tracing::Subscriber + for<'a> LookupSpan<'a>> Layer<S> for Spans {
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let mut span = CapturedSpan {
            name: attrs.metadata().name().to_owned(),
            level: attrs.metadata().level().to_string(),
            ..CapturedSpan::default()
        };
        attrs.record(&mut Fields(&mut span.fields));
        let Some(this) = ctx.span(id) else { return };
        span.parent = this.parent().map(|p| p.name().to_owned());
        let mut spans = self.lock();
        this.extensions_mut().insert(Index(spans.len()));
        spans.push(span);
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, ctx: Context<'_, S>) {
        let Some(this) = ctx.span(id) else { return };
        let Some(Index(i)) = this.extensions().get::<Index>().map(|i| Index(i.0)) else {
            return;
        };
        if let Some(span) = self.lock().get_mut(i) {
            values.record(&mut Fields(&mut span.fields));
        }
    }
}

/// Captures every span (all levels) on this thread until the guard drops.
pub(crate) fn capture_spans() -> (Spans, tracing::subscriber::DefaultGuard) {
    capture_spans_up_to(tracing::level_filters::LevelFilter::TRACE)
}

/// Captures the spans `filter` admits on this thread until the guard drops: a
/// subscriber whose level filter is `filter`, as `RUST_LOG=info` makes one for
/// `LevelFilter::INFO` (its level is the subscriber's hint, which the crate consults
/// before building a span).
pub(crate) fn capture_spans_up_to(
    filter: tracing::level_filters::LevelFilter,
) -> (Spans, tracing::subscriber::DefaultGuard) {
    let spans = Spans::default();
    let subscriber = tracing_subscriber::registry()
        .with(filter)
        .with(spans.clone());
    let guard = tracing::subscriber::set_default(subscriber);
    (spans, guard)
}

/// The debugging recorder, installed for this thread until the guard drops.
pub(crate) struct Metrics {
    snapshotter: metrics_util::debugging::Snapshotter,
    _guard: metrics::LocalRecorderGuard<'static>,
}

impl Metrics {
    /// Installs a fresh recorder for this thread.
    pub(crate) fn capture() -> Self {
        let recorder: &'static _ =
            Box::leak(Box::new(metrics_util::debugging::DebuggingRecorder::new()));
        Self {
            snapshotter: recorder.snapshotter(),
            _guard: metrics::set_default_local_recorder(recorder),
        }
    }

    /// What was emitted since the last snapshot (taking one resets the counters and
    /// drains the histograms).
    pub(crate) fn snapshot(&self) -> Snapshot {
        Snapshot(self.snapshotter.snapshot().into_vec())
    }
}

/// The metrics of one [`Metrics::snapshot`].
pub(crate) struct Snapshot(
    Vec<(
        metrics_util::CompositeKey,
        Option<metrics::Unit>,
        Option<metrics::SharedString>,
        metrics_util::debugging::DebugValue,
    )>,
);

impl Snapshot {
    fn find(
        &self,
        name: &str,
        labels: &[(&str, &str)],
    ) -> Vec<&metrics_util::debugging::DebugValue> {
        self.0
            .iter()
            .filter(|(key, _, _, _)| {
                let key = key.key();
                key.name() == name
                    && labels
                        .iter()
                        .all(|(k, v)| key.labels().any(|l| l.key() == *k && l.value() == *v))
            })
            .map(|(_, _, _, value)| value)
            .collect()
    }
    /// The sum of the counters `name` whose labels include `labels` (0 when none).
    pub(crate) fn counter(&self, name: &str, labels: &[(&str, &str)]) -> u64 {
        self.find(name, labels)
            .into_iter()
            .map(|v| match v {
                metrics_util::debugging::DebugValue::Counter(n) => *n,
                other => panic!("{name} is not a counter: {other:?}"),
            })
            .sum()
    }

    /// The value of the gauge `name` with labels including `labels` (`None` when not
    /// emitted).
    pub(crate) fn gauge(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        self.find(name, labels).into_iter().next().map(|v| match v {
            metrics_util::debugging::DebugValue::Gauge(g) => g.into_inner(),
            other => panic!("{name} is not a gauge: {other:?}"),
        })
    }

    /// The samples of the histograms `name` whose labels include `labels`.
    pub(crate) fn histogram(&self, name: &str, labels: &[(&str, &str)]) -> Vec<f64> {
        self.find(name, labels)
            .into_iter()
            .flat_map(|v| match v {
                metrics_util::debugging::DebugValue::Histogram(samples) => {
                    samples.iter().map(|s| s.into_inner()).collect::<Vec<_>>()
                }
                other => panic!("{name} is not a histogram: {other:?}"),
            })
            .collect()
    }
}
