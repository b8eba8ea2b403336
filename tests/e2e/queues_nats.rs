//! The NATS JetStream consumer example (`examples/nats_consumer.rs`) on the real
//! server: 500 charges keyed by `Nats-Msg-Id`, 50 of them published again after the
//! stream's duplicate window (so JetStream keeps both), the consumer SIGKILLed
//! mid-stream (its unacked messages come back after the ack wait) and restarted; the
//! account ends with exactly the sum of the distinct charges through the transactional
//! inbox, and within `Engine::once`'s guarantee through `once`.

use crate::support;

use std::time::Duration;

use async_nats::jetstream::{self, consumer, stream};
use support::queues::{self, Ledger};

async fn scenario(mode: &str, exact: bool) {
    let run = support::unique(&format!("idemkey_nats_{mode}"));
    let (charges, twice) = queues::charges(&run);
    let url = support::nats_url();
    let client = async_nats::connect(&url)
        .await
        .unwrap_or_else(|e| panic!("the NATS at {url} must be reachable: {e}"));
    let js = jetstream::new(client);
    let subject = format!("{run}.charges");
    // A short duplicate window: the second publishes come after it, as a producer's
    // retry hours later would, and reach the consumer.
    js.create_stream(stream::Config {
        name: run.clone(),
        subjects: vec![subject.clone()],
        duplicate_window: Duration::from_millis(100),
        ..stream::Config::default()
    })
    .await
    .expect("create the stream");
    let publish = async |i: usize| {
        let c = &charges[i];
        let mut headers = async_nats::HeaderMap::new();
        headers.insert("Nats-Msg-Id", c.id.as_str());
        js.publish_with_headers(subject.clone(), headers, c.payload().into())
            .await
            .expect("publish")
            .await
            .expect("the publish ack");
    };
    for i in 0..charges.len() {
        publish(i).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await; // past the duplicate window
    for &i in &twice {
        publish(i).await;
    }
    let mut stream = js.get_stream(&run).await.expect("the stream");
    let held = stream.info().await.expect("stream info").state.messages;
    assert_eq!(
        held,
        (charges.len() + twice.len()) as u64,
        "JetStream kept the republished ones"
    );

    let ledger = Ledger::new(&run).await;
    let mut args = ledger.args(mode);
    args.extend([
        "--broker".into(),
        url.clone(),
        "--queue".into(),
        run.clone(),
    ]);
    // Idle longer than the ack wait (2 s), so redeliveries of the last kill's
    // messages arrive before the final consumer exits.
    let kills = ledger
        .run_with_kills("nats_consumer", &args, Duration::from_millis(3500))
        .await;
    let mut consumer: consumer::PullConsumer =
        stream.get_consumer(&run).await.expect("the consumer");
    let info = consumer.info().await.expect("consumer info");
    assert_eq!(
        (info.num_pending, info.num_ack_pending),
        (0, 0),
        "every message was acked"
    );
    ledger.check(&charges, kills, exact).await;

    js.delete_stream(&run).await.expect("delete the stream");
    ledger.drop_tables().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inbox_charges_each_message_exactly_once_across_kills() {
    scenario("inbox", true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn once_repeats_only_effects_a_kill_interrupted() {
    scenario("once", false).await;
}
