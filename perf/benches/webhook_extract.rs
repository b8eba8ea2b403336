//! Reading a webhook's id: the borrowed JSON-pointer walk of `KeySource::json_pointer`
//! against the baseline of parsing the body into a `serde_json::Value` and calling
//! `Value::pointer`, on a small and a large Stripe-shaped event; and a whole delivery
//! through `Preset::stripe().layer` (first delivery, duplicate) against the bare route.

use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};

use axum::Router;
use axum::body::Body;
use axum::routing::post;
use criterion::{Criterion, criterion_group, criterion_main};
use http::{HeaderMap, Request};
use idemkey::server::Engine;
use idemkey::server::extract::KeySource;
use idemkey::server::webhook::Preset;
use idemkey::store::MemoryStore;
use tower::ServiceExt;

/// A Stripe `invoice.paid` event with `lines` invoice lines (the id comes first, as
/// Stripe sends it; the embedded object is most of the bytes).
fn stripe_event(lines: usize) -> Vec<u8> {
    let line = |i: usize| {
        serde_json::json!({
            "id": format!("il_1NG8Du2eZvKYlo2C{i:08}"),
            "object": "line_item",
            "amount": 1500,
            "currency": "usd",
            "description": "1 × Pro plan (at $15.00 / month)",
            "period": {"start": 1_686_089_970, "end": 1_688_681_970},
            "price": {"id": "price_1NG8Cs2eZvKYlo2C", "object": "price", "unit_amount": 1500, "recurring": {"interval": "month"}},
            "metadata": {}
        })
    };
    let event = serde_json::json!({
        "id": "evt_1NG8Du2eZvKYlo2CUI79vXWy",
        "object": "event",
        "account": "acct_1032D82eZvKYlo2C",
        "api_version": "2024-06-20",
        "created": 1_686_089_970,
        "data": {"object": {
            "id": "in_1NG8Du2eZvKYlo2C",
            "object": "invoice",
            "lines": {"object": "list", "data": (0..lines).map(line).collect::<Vec<_>>()},
            "total": 1500 * lines,
        }},
        "livemode": false,
        "pending_webhooks": 1,
        "type": "invoice.paid"
    });
    serde_json::to_vec(&event).expect("serialisable")
}

fn bench(c: &mut Criterion) {
    let headers = HeaderMap::new();
    let source = KeySource::json_pointer("/id");
    let stripe = Preset::stripe();
    for (name, body) in [("small", stripe_event(1)), ("large", stripe_event(300))] {
        let mut g = c.benchmark_group(format!(
            "webhook id, {name} Stripe event ({} bytes)",
            body.len()
        ));
        g.bench_function("baseline: Value::pointer", |b| {
            b.iter(|| {
                let v: serde_json::Value = serde_json::from_slice(black_box(&body)).expect("JSON");
                black_box(
                    v.pointer("/id")
                        .and_then(|id| id.as_str())
                        .map(str::to_owned),
                )
            });
        });
        g.bench_function("KeySource::json_pointer", |b| {
            b.iter(|| black_box(source.extract(&headers, black_box(&body)).expect("an id")));
        });
        g.bench_function("Preset::stripe identify (id + account)", |b| {
            b.iter(|| black_box(stripe.identify(&headers, black_box(&body)).expect("an id")));
        });
        g.finish();
    }
}

/// One delivery of `body` through `app` (no network: the router is called directly).
async fn deliver(app: &Router, body: Vec<u8>) {
    let req = Request::post("/webhooks/stripe")
        .header("content-type", "application/json")
        .body(Body::from(body))
        .expect("valid request");
    let resp = app.clone().oneshot(req).await.expect("infallible router");
    assert!(resp.status().is_success());
}

fn bench_delivery(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let route = || Router::new().route("/webhooks/stripe", post(|| async { "ok" }));
    let bare = route();
    let guarded = route().route_layer(Preset::stripe().layer(Engine::new(MemoryStore::new())));
    let small = String::from_utf8(stripe_event(1)).expect("UTF-8");
    let fresh = AtomicU64::new(0);
    let mut g = c.benchmark_group("Stripe delivery through the router (619 bytes)");
    g.bench_function("baseline: bare route", |b| {
        b.to_async(&rt)
            .iter(|| deliver(&bare, small.clone().into_bytes()));
    });
    g.bench_function("Preset::stripe layer, first delivery", |b| {
        b.to_async(&rt).iter(|| {
            let n = fresh.fetch_add(1, Ordering::Relaxed);
            let body = small.replacen("evt_1NG8Du2eZvKYlo2CUI79vXWy", &format!("evt_bench_{n}"), 1);
            deliver(&guarded, body.into_bytes())
        });
    });
    rt.block_on(deliver(&guarded, small.clone().into_bytes()));
    g.bench_function("Preset::stripe layer, duplicate (replay)", |b| {
        b.to_async(&rt)
            .iter(|| deliver(&guarded, small.clone().into_bytes()));
    });
    g.finish();
}

criterion_group!(benches, bench, bench_delivery);
criterion_main!(benches);
