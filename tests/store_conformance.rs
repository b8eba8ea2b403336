//! The store conformance suite (`idemkey::testing::conformance`) against every store:
//! memory here, and each real store against its real server.

mod support;

use idemkey::store::MemoryStore;
use idemkey::testing::conformance;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn memory_store_conforms() {
    conformance::run(|| async { MemoryStore::new() }).await;
}
