//! gRPC behind the layer: a real tonic client against a unary service (tonic's server
//! half, messages by prost derive: no protoc) served over HTTP/2 on 127.0.0.1, with
//! the key in `idempotency-key` metadata.

use crate::support;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use http::uri::PathAndQuery;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::service::TowerToHyperService;
use idemkey::server::{Engine, IdempotencyLayer, body::RequestBody};
use idemkey::store::{MemoryStore, Store};
use idemkey::testing::Executions;
use support::gate::Gate;
use support::verifier::FlakyStore;
use tonic::{Code, Status};
use tonic_prost::ProstCodec;
use tower::Layer;

#[derive(Clone, PartialEq, prost::Message)]
struct ChargeRequest {
    #[prost(uint64, tag = "1")]
    amount: u64,
    #[prost(string, tag = "2")]
    currency: String,
}

#[derive(Clone, PartialEq, prost::Message)]
struct ChargeReply {
    #[prost(string, tag = "1")]
    id: String,
    #[prost(uint64, tag = "2")]
    amount: u64,
}

const CHARGE: &str = "/payments.v1.Payments/Charge";

/// What the service does: count executions, wait at a gate when given one, answer
/// `UNAVAILABLE` for the first `unavailable` calls, `ALREADY_EXISTS` for an amount of 0.
#[derive(Clone, Default)]
struct Payments {
    runs: Executions,
    gate: Option<Gate>,
    unavailable: Arc<AtomicU32>,
}

impl tonic::server::UnaryService<ChargeRequest> for Payments {
    type Response = ChargeReply;
    type Future = std::pin::Pin<
        Box<dyn Future<Output = Result<tonic::Response<ChargeReply>, Status>> + Send>,
    >;

    fn call(&mut self, request: tonic::Request<ChargeRequest>) -> Self::Future {
        let this = self.clone();
        Box::pin(async move {
            if let Some(gate) = &this.gate {
                gate.pass().await;
            }
            let n = this.runs.record();
            let fail = this
                .unavailable
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1));
            if fail.is_ok() {
                return Err(Status::unavailable("the ledger is down"));
            }
            let req = request.into_inner();
            if req.amount == 0 {
                return Err(Status::already_exists("an empty charge exists already"));
            }
            Ok(tonic::Response::new(ChargeReply {
                id: format!("ch_{n}"),
                amount: req.amount,
            }))
        })
    }
}

/// Serves `payments` behind a verifier over `store`, HTTP/2 on 127.0.0.1.
async fn serve(store: impl Store, payments: Payments) -> SocketAddr {
    let inner = tower::service_fn(
        move |req: http::Request<RequestBody<hyper::body::Incoming>>| {
            let payments = payments.clone();
            async move {
                let mut grpc =
                    tonic::server::Grpc::new(ProstCodec::<ChargeReply, ChargeRequest>::default());
                Ok::<_, Infallible>(grpc.unary(payments, req).await)
            }
        },
    );
    let svc = IdempotencyLayer::new(Engine::new(store)).layer(inner);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind 127.0.0.1");
    let addr = listener.local_addr().expect("address");
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            let svc = TowerToHyperService::new(svc.clone());
            tokio::spawn(async move {
                let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    addr
}

async fn client(addr: SocketAddr) -> tonic::client::Grpc<tonic::transport::Channel> {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .expect("endpoint")
        .connect()
        .await
        .expect("connect to the gRPC server on 127.0.0.1");
    tonic::client::Grpc::new(channel)
}

async fn charge(
    grpc: &mut tonic::client::Grpc<tonic::transport::Channel>,
    key: Option<&str>,
    amount: u64,
) -> Result<tonic::Response<ChargeReply>, Status> {
    let mut req = tonic::Request::new(ChargeRequest {
        amount,
        currency: "eur".into(),
    });
    if let Some(key) = key {
        req.metadata_mut()
            .insert("idempotency-key", key.parse().expect("metadata value"));
    }
    grpc.ready().await.expect("the channel is ready");
    grpc.unary(
        req,
        PathAndQuery::from_static(CHARGE),
        ProstCodec::<ChargeRequest, ChargeReply>::default(),
    )
    .await
}

fn replayed<T>(resp: &tonic::Response<T>) -> bool {
    resp.metadata()
        .get("idempotent-replayed")
        .is_some_and(|v| v == "true")
}

#[tokio::test]
async fn a_retried_call_gets_the_replayed_message_and_its_status() {
    let payments = Payments::default();
    let addr = serve(MemoryStore::new(), payments.clone()).await;
    let mut grpc = client(addr).await;

    let first = charge(&mut grpc, Some("order-1"), 1000).await.expect("OK");
    assert!(!replayed(&first));
    // A reply without its `grpc-status` trailer would be an error to tonic: the replay
    // carries the trailer.
    let retry = charge(&mut grpc, Some("order-1"), 1000)
        .await
        .expect("the replay ends with grpc-status OK");
    assert!(replayed(&retry), "the replay is marked");
    assert_eq!(retry.get_ref(), first.get_ref());
    assert_eq!(retry.get_ref().id, "ch_1");

    // An error status that a retry must not change (ALREADY_EXISTS, like a 409) is
    // stored and replayed as it was.
    for _ in 0..2 {
        let err = charge(&mut grpc, Some("order-empty"), 0)
            .await
            .expect_err("the handler's status");
        assert_eq!(err.code(), Code::AlreadyExists);
        assert_eq!(err.message(), "an empty charge exists already");
    }
    assert_eq!(payments.runs.count(), 2, "each key ran once");
}

#[tokio::test]
async fn a_transient_status_releases_the_key() {
    let payments = Payments {
        unavailable: Arc::new(AtomicU32::new(1)),
        ..Payments::default()
    };
    let addr = serve(MemoryStore::new(), payments.clone()).await;
    let mut grpc = client(addr).await;
    let err = charge(&mut grpc, Some("order-2"), 5)
        .await
        .expect_err("down");
    assert_eq!(err.code(), Code::Unavailable);
    let ok = charge(&mut grpc, Some("order-2"), 5)
        .await
        .expect("the retry runs again");
    assert!(!replayed(&ok));
    assert_eq!(payments.runs.count(), 2);
}

#[tokio::test]
async fn the_layers_own_answers_are_grpc_statuses() {
    let gate = Gate::default();
    let payments = Payments {
        gate: Some(gate.clone()),
        ..Payments::default()
    };
    let addr = serve(MemoryStore::new(), payments.clone()).await;
    let mut grpc = client(addr).await;

    let err = charge(&mut grpc, None, 1).await.expect_err("no key");
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    assert!(err.message().contains("idempotency key"), "{err:?}");
    let too_long = "k".repeat(300);
    let err = charge(&mut grpc, Some(&too_long), 1)
        .await
        .expect_err("invalid key");
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");

    let first = tokio::spawn({
        let mut grpc = grpc.clone();
        async move { charge(&mut grpc, Some("order-3"), 7).await }
    });
    gate.wait_entered(1).await;
    let err = charge(&mut grpc, Some("order-3"), 7)
        .await
        .expect_err("in progress");
    assert_eq!(err.code(), Code::Aborted, "{err:?}");
    assert_eq!(
        err.metadata()
            .get("grpc-retry-pushback-ms")
            .map(|v| v.to_str().ok()),
        Some(Some("1000")),
        "when to retry, as gRPC's server pushback"
    );
    let err = charge(&mut grpc, Some("order-3"), 8)
        .await
        .expect_err("another request with the key");
    assert_eq!(err.code(), Code::AlreadyExists, "{err:?}");
    gate.open(1);
    first
        .await
        .expect("task")
        .expect("the first call completes");
    assert_eq!(payments.runs.count(), 1);
}

#[tokio::test]
async fn a_store_outage_is_unavailable() {
    let store = FlakyStore::default();
    store.failing.store(true, Ordering::SeqCst);
    let payments = Payments::default();
    let addr = serve(store, payments.clone()).await;
    let mut grpc = client(addr).await;
    let err = charge(&mut grpc, Some("order-4"), 1)
        .await
        .expect_err("store down");
    assert_eq!(err.code(), Code::Unavailable, "{err:?}");
    assert!(err.metadata().get("grpc-retry-pushback-ms").is_some());
    assert_eq!(payments.runs.count(), 0, "nothing ran");
}
