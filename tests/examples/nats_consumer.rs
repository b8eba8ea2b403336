//! A NATS JetStream consumer that charges an account for each message, with explicit
//! acks: `bare`, through `Engine::once`, or through the transactional inbox
//! (`PostgresStore::once_in`); see `common/charges.rs` beside this file.
//!
//! The key is the message's `Nats-Msg-Id` header (the payload's `id` when it has
//! none): the id JetStream itself deduplicates publishes by within the stream's
//! duplicate window. A message is acked after its charge is committed (or replayed) and
//! negatively acked with a delay when it is in progress elsewhere or the database is
//! down; a message not acked within the consumer's ack wait (a killed consumer) is
//! redelivered, and the key makes the redelivery a replay.
//!
//! ```text
//! cargo run -p idemkey-integration --example nats_consumer -- --queue charges --mode inbox
//! cargo run --release -p idemkey-integration --example nats_consumer -- --bench 2000   # msg/s per mode
//! ```

#[path = "common/charges.rs"]
mod charges;
#[path = "../../examples/common/telemetry.rs"]
mod telemetry;

use std::time::{Duration, Instant};

use async_nats::jetstream::{self, AckKind, consumer, stream};
use charges::{Charges, Mode, Verdict};

type Error = Box<dyn std::error::Error + Send + Sync>;

/// The subject a stream's charges are published on.
fn subject(stream: &str) -> String {
    format!("{stream}.charges")
}

async fn context(url: &str) -> Result<jetstream::Context, Error> {
    let client = async_nats::connect(url)
        .await
        .map_err(|e| format!("NATS at {url}: {e}"))?;
    Ok(jetstream::new(client))
}

/// The stream (`<name>.charges`) and its durable pull consumer `<name>`, created if
/// missing: explicit acks, redelivery 2 s after a message was delivered unacked.
async fn consumer(js: &jetstream::Context, name: &str) -> Result<consumer::PullConsumer, Error> {
    let stream = js
        .get_or_create_stream(stream::Config {
            name: name.to_owned(),
            subjects: vec![subject(name)],
            ..stream::Config::default()
        })
        .await?;
    let consumer = stream
        .get_or_create_consumer(
            name,
            consumer::pull::Config {
                durable_name: Some(name.to_owned()),
                ack_policy: consumer::AckPolicy::Explicit,
                ack_wait: Duration::from_secs(2),
                max_ack_pending: 16,
                ..consumer::pull::Config::default()
            },
        )
        .await?;
    Ok(consumer)
}

/// Consumes until idle for `idle_exit` (forever when `None`), or until `stop` messages
/// were acked.
async fn consume(
    consumer: &consumer::PullConsumer,
    charges: &Charges,
    idle_exit: Option<Duration>,
    stop: Option<usize>,
) -> Result<(), Error> {
    let mut messages = consumer.messages().await?;
    let mut acked = 0;
    loop {
        let Some(next) = charges::next_unless_idle(&mut messages, idle_exit).await else {
            return Ok(());
        };
        let Some(msg) = next else {
            return Err("the JetStream consumer ended".into());
        };
        let msg = msg?;
        let key = msg
            .headers
            .as_ref()
            .and_then(|h| h.get("Nats-Msg-Id"))
            .map(|v| v.as_str().to_owned());
        match charges.apply(key.as_deref(), &msg.payload).await {
            Verdict::Ack => {
                // Waits for the server's confirmation, so a counted ack is an ack.
                msg.double_ack().await?;
                acked += 1;
                if stop == Some(acked) {
                    return Ok(());
                }
            }
            Verdict::Retry(after) => msg.ack_with(AckKind::Nak(Some(after))).await?,
        }
    }
}

/// Publishes `charges` on the stream's subject, each with its id as `Nats-Msg-Id`,
/// waiting for every publish ack.
async fn publish(
    js: &jetstream::Context,
    stream: &str,
    charges: &[charges::Charge],
) -> Result<(), Error> {
    let mut acks = Vec::with_capacity(charges.len());
    for c in charges {
        let mut headers = async_nats::HeaderMap::new();
        headers.insert("Nats-Msg-Id", c.id.as_str());
        let body = serde_json::to_vec(c)?;
        acks.push(
            js.publish_with_headers(subject(stream), headers, body.into())
                .await?,
        );
    }
    for a in acks {
        a.await?;
    }
    Ok(())
}

/// Each mode on a fresh stream and fresh tables: publish `n`, consume `n`, time it.
async fn bench(url: &str, o: &charges::Options, n: usize) -> Result<(), Error> {
    let js = context(url).await?;
    let mut rates = Vec::new();
    for (round, mode) in (0..charges::BENCH_ROUNDS).flat_map(|r| Mode::ALL.map(|m| (r, m))) {
        let run = format!(
            "idemkey_bench_{}_{round}_{}",
            mode.name(),
            std::process::id()
        );
        let charges = Charges::connect(mode, &o.postgres, &run, &format!("{run}_acct")).await?;
        let consumer = consumer(&js, &run).await?;
        publish(&js, &run, &charges::bench_charges(n)).await?;
        let t = Instant::now();
        consume(&consumer, &charges, None, Some(n)).await?;
        rates.push(charges::Rate::new(mode, n, t.elapsed()));
        js.delete_stream(&run).await?;
        charges.drop_tables().await?;
    }
    charges::report("NATS JetStream", n, &rates);
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), Error> {
    telemetry::init_tracing();
    let m = charges::command("nats_consumer", "nats://127.0.0.1:4222").get_matches();
    let o = charges::options(&m)?;
    let url = m.get_one::<String>("broker").cloned().unwrap_or_default();
    if let Some(n) = o.bench {
        return bench(&url, &o, n).await;
    }
    let name = m.get_one::<String>("queue").cloned().unwrap_or_default();
    let charges = Charges::connect(o.mode, &o.postgres, &o.table, &o.accounts).await?;
    let js = context(&url).await?;
    let consumer = consumer(&js, &name).await?;
    consume(&consumer, &charges, o.idle_exit, None).await
}
