//! A RabbitMQ consumer that charges an account for each message, with manual acks:
//! `bare`, through `Engine::once`, or through the transactional inbox
//! (`PostgresStore::once_in`); see `common/charges.rs` beside this file.
//!
//! The key is the message's `message_id` property (the payload's `id` when it has
//! none). A message is acked after its charge is committed (or replayed), and requeued
//! when it is in progress elsewhere or the database is down; a consumer killed with
//! messages unacked gets them redelivered, and the keys make the redelivery a replay.
//!
//! ```text
//! cargo run -p idemkey-integration --example rabbitmq_consumer -- --queue charges --mode inbox
//! cargo run --release -p idemkey-integration --example rabbitmq_consumer -- --bench 2000   # msg/s per mode
//! ```

#[path = "common/charges.rs"]
mod charges;
#[path = "../../examples/common/telemetry.rs"]
mod telemetry;

use std::time::{Duration, Instant};

use charges::{Charges, Mode, Verdict};
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicNackOptions, BasicPublishOptions, BasicQosOptions,
    ConfirmSelectOptions, QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::FieldTable;
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties};

type Error = Box<dyn std::error::Error + Send + Sync>;

async fn channel(url: &str) -> Result<(Connection, Channel), Error> {
    let conn = Connection::connect(url, ConnectionProperties::default())
        .await
        .map_err(|e| format!("RabbitMQ at {url}: {e}"))?;
    let ch = conn.create_channel().await?;
    Ok((conn, ch))
}

async fn declare(ch: &Channel, queue: &str) -> Result<(), Error> {
    ch.queue_declare(
        queue.into(),
        QueueDeclareOptions {
            durable: true,
            ..QueueDeclareOptions::default()
        },
        FieldTable::default(),
    )
    .await?;
    Ok(())
}

/// Consumes `queue` until idle for `idle_exit` (forever when `None`), or until `stop`
/// messages were acked.
async fn consume(
    ch: &Channel,
    queue: &str,
    charges: &Charges,
    idle_exit: Option<Duration>,
    stop: Option<usize>,
) -> Result<(), Error> {
    declare(ch, queue).await?;
    ch.basic_qos(16, BasicQosOptions::default()).await?;
    let mut deliveries = ch
        .basic_consume(
            queue.into(),
            "".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await?;
    let mut acked = 0;
    loop {
        let Some(next) = charges::next_unless_idle(&mut deliveries, idle_exit).await else {
            return Ok(());
        };
        let Some(delivery) = next else {
            return Err("the RabbitMQ consumer was cancelled".into());
        };
        let delivery = delivery?;
        let key = delivery
            .properties
            .message_id()
            .as_ref()
            .map(|id| id.as_str());
        match charges.apply(key, &delivery.data).await {
            Verdict::Ack => {
                delivery.ack(BasicAckOptions::default()).await?;
                acked += 1;
                if stop == Some(acked) {
                    return Ok(());
                }
            }
            Verdict::Retry(after) => {
                tokio::time::sleep(after).await;
                delivery
                    .nack(BasicNackOptions {
                        requeue: true,
                        ..BasicNackOptions::default()
                    })
                    .await?;
            }
        }
    }
}

/// Publishes `charges` to `queue` with publisher confirms, each with its id as
/// `message_id`.
async fn publish(ch: &Channel, queue: &str, charges: &[charges::Charge]) -> Result<(), Error> {
    ch.confirm_select(ConfirmSelectOptions::default()).await?;
    let mut confirms = Vec::with_capacity(charges.len());
    for c in charges {
        let body = serde_json::to_vec(c)?;
        let props = BasicProperties::default().with_message_id(c.id.as_str().into());
        confirms.push(
            ch.basic_publish(
                "".into(),
                queue.into(),
                BasicPublishOptions::default(),
                &body,
                props,
            )
            .await?,
        );
    }
    for c in confirms {
        c.await?;
    }
    Ok(())
}

/// Each mode on a fresh queue and fresh tables: publish `n`, consume `n`, time it.
async fn bench(url: &str, o: &charges::Options, n: usize) -> Result<(), Error> {
    let (_conn, ch) = channel(url).await?;
    let mut rates = Vec::new();
    for (round, mode) in (0..charges::BENCH_ROUNDS).flat_map(|r| Mode::ALL.map(|m| (r, m))) {
        let run = format!(
            "idemkey_bench_{}_{round}_{}",
            mode.name(),
            std::process::id()
        );
        let charges = Charges::connect(mode, &o.postgres, &run, &format!("{run}_acct")).await?;
        declare(&ch, &run).await?;
        publish(&ch, &run, &charges::bench_charges(n)).await?;
        let t = Instant::now();
        consume(&ch, &run, &charges, None, Some(n)).await?;
        rates.push(charges::Rate::new(mode, n, t.elapsed()));
        ch.queue_delete(run.as_str().into(), QueueDeleteOptions::default())
            .await?;
        charges.drop_tables().await?;
    }
    charges::report("RabbitMQ", n, &rates);
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), Error> {
    telemetry::init_tracing();
    let m = charges::command("rabbitmq_consumer", "amqp://guest:guest@127.0.0.1:5672/%2f")
        .get_matches();
    let o = charges::options(&m)?;
    let url = m.get_one::<String>("broker").cloned().unwrap_or_default();
    if let Some(n) = o.bench {
        return bench(&url, &o, n).await;
    }
    let queue = m.get_one::<String>("queue").cloned().unwrap_or_default();
    let charges = Charges::connect(o.mode, &o.postgres, &o.table, &o.accounts).await?;
    let (_conn, ch) = channel(&url).await?;
    consume(&ch, &queue, &charges, o.idle_exit, None).await
}
