//! A SQL store whose connections are busy or never answer (the PostgreSQL and MySQL
//! stores' budget and timeout tests): claims and a sweep that wait for a locked table,
//! what finds no connection left, and a connect to a server that says nothing.

use std::sync::Arc;
use std::time::Duration;

use idemkey::store::{
    Claim, ClaimRequest, FencingToken, RecordId, Store, StoreError, SweepOptions, SweepReport,
};
use tokio::task::{JoinHandle, JoinSet};

/// Connects through `connect` (given the address, with an acquire timeout of 300 ms) to
/// a local socket that takes connections (the kernel's backlog) and never says a word:
/// the store answers unavailable, naming the address. Without a bound on connecting,
/// this waits for TCP's own timeouts and the harness's time limit fails the test.
pub(crate) async fn connect_to_a_silent_server<S, F>(connect: impl FnOnce(String, Duration) -> F)
where
    F: std::future::Future<Output = Result<S, StoreError>>,
{
    let silent = std::net::TcpListener::bind("127.0.0.1:0").expect("a local socket");
    let at = silent.local_addr().expect("its address").to_string();
    let Err(err) = connect(at.clone(), Duration::from_millis(300)).await else {
        panic!("nothing answers at {at}, yet the store connected");
    };
    assert!(err.is_unavailable(), "{err}");
    assert!(err.to_string().contains(&at), "{err}");
}

/// A claim of `key` (scope `t`, fingerprint `fp`) with a new token and a minute's lease
/// and retention.
pub(crate) async fn claim_new(store: &dyn Store, key: &str) -> Result<Claim, StoreError> {
    let id = RecordId::new("t", key);
    store
        .claim(ClaimRequest {
            id: &id,
            fingerprint: b"fp",
            token: FencingToken::random(),
            lease: Duration::from_secs(60),
            retention: Duration::from_secs(60),
        })
        .await
}

/// `claims` claims of new keys and one sweep pass, started on `store` (whose table
/// another session holds locked).
pub(crate) struct Crowd {
    store: Arc<dyn Store>,
    claims: JoinSet<Result<Claim, StoreError>>,
    sweep: JoinHandle<Result<SweepReport, StoreError>>,
}

impl Crowd {
    pub(crate) fn start(store: Arc<dyn Store>, claims: usize) -> Self {
        let mut set = JoinSet::new();
        for i in 0..claims {
            let store = Arc::clone(&store);
            set.spawn(async move { claim_new(&*store, &format!("k{i}")).await });
        }
        let sweep = tokio::spawn({
            let store = Arc::clone(&store);
            async move { store.sweep_pass(&SweepOptions::default()).await }
        });
        Self {
            store,
            claims: set,
            sweep,
        }
    }

    /// Once the request connections (`requests` of them, with as many claims as they
    /// carry) and the sweep's two wait for the lock: `refused` claims come back unavailable after the acquire timeout, and
    /// so does a second sweep (which, had it a connection, would find the sweep lock
    /// taken and return at once).
    pub(crate) async fn expect_refused(&mut self, requests: usize, refused: usize) {
        for _ in 0..refused {
            let err = self
                .claims
                .join_next()
                .await
                .expect("a claim")
                .expect("not cancelled")
                .expect_err("no connection came free");
            assert!(err.is_unavailable(), "{err}");
            let says = format!("none of the {requests} request connections");
            assert!(err.to_string().contains(&says), "{err}");
        }
        let second = self
            .store
            .sweep_pass(&SweepOptions::default())
            .await
            .expect_err("the other connections are the first sweep's");
        assert!(second.is_unavailable(), "{second}");
    }

    /// Once the table is free: the claims that had a connection win their keys, and
    /// the sweep ends.
    pub(crate) async fn expect_served(self) {
        for claim in self.claims.join_all().await {
            assert_eq!(
                claim.expect("claim"),
                Claim::Acquired { takeover: false },
                "the claims that had a connection run once the table is free"
            );
        }
        self.sweep.await.expect("sweep task").expect("sweep");
    }
}
