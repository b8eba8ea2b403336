//! The RabbitMQ consumer example (`examples/rabbitmq_consumer.rs`) on the real broker:
//! 500 charges, 50 of them published twice, the consumer SIGKILLed mid-stream with
//! messages unacked (RabbitMQ redelivers them) and restarted; the account ends with
//! exactly the sum of the distinct charges through the transactional inbox, and within
//! `Engine::once`'s guarantee (a repeat only for an effect a kill interrupted before its
//! record) through `once`.

use crate::support;

use std::time::Duration;

use lapin::options::{
    BasicPublishOptions, ConfirmSelectOptions, QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::FieldTable;
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties};
use support::queues::{self, Ledger};

async fn channel() -> (Connection, Channel) {
    let url = support::rabbitmq_url();
    let conn = Connection::connect(&url, ConnectionProperties::default())
        .await
        .unwrap_or_else(|e| panic!("the RabbitMQ at {url} must be reachable: {e}"));
    let ch = conn.create_channel().await.expect("a channel");
    (conn, ch)
}

fn durable() -> QueueDeclareOptions {
    QueueDeclareOptions {
        durable: true,
        ..QueueDeclareOptions::default()
    }
}

async fn scenario(mode: &str, exact: bool) {
    let run = support::unique(&format!("idemkey_rmq_{mode}"));
    let (charges, twice) = queues::charges(&run);
    let (_conn, ch) = channel().await;
    ch.queue_declare(run.as_str().into(), durable(), FieldTable::default())
        .await
        .expect("declare the queue");
    ch.confirm_select(ConfirmSelectOptions::default())
        .await
        .expect("publisher confirms");
    let order = (0..charges.len()).chain(twice.iter().copied());
    for i in order {
        let c = &charges[i];
        let props = BasicProperties::default().with_message_id(c.id.as_str().into());
        let confirm = ch
            .basic_publish(
                "".into(),
                run.as_str().into(),
                BasicPublishOptions::default(),
                &c.payload(),
                props,
            )
            .await
            .expect("publish");
        assert!(
            confirm.await.expect("confirm").is_ack(),
            "the broker took it"
        );
    }

    let ledger = Ledger::new(&run).await;
    let mut args = ledger.args(mode);
    args.extend([
        "--broker".into(),
        support::rabbitmq_url(),
        "--queue".into(),
        run.clone(),
    ]);
    let kills = ledger
        .run_with_kills("rabbitmq_consumer", &args, Duration::from_millis(1500))
        .await;
    let left = ch
        .queue_declare(
            run.as_str().into(),
            QueueDeclareOptions {
                passive: true,
                ..durable()
            },
            FieldTable::default(),
        )
        .await
        .expect("the queue");
    assert_eq!(left.message_count(), 0, "every message was acked");
    ledger.check(&charges, kills, exact).await;

    ch.queue_delete(run.as_str().into(), QueueDeleteOptions::default())
        .await
        .expect("delete the queue");
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
