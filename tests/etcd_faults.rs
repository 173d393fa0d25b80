//! The etcd engine's in-doubt appends (features `etcd` and `failpoints`): an append whose
//! request or answer is lost must end with each message stored exactly once, at the sequence
//! its send returns — found through the nonce in the tail record, never sent twice and never
//! given up while it may have landed. One test per scenario, run one at a time (failpoints are
//! process-wide).

mod common;
#[path = "common/etcd.rs"]
mod etcd;

use futures::StreamExt;
use rockq::{Broker, EtcdOptions};

/// Sends "first" with `point` failing once, then "second"; both must be stored once, in order.
/// Failpoints are process-wide: one scenario at a time.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

async fn lose_once(point: &str) {
    let _one_at_a_time = SERIAL.lock().await;
    let cluster = etcd::Cluster::start(1).await;
    let broker =
        Broker::connect_etcd(cluster.endpoints(), "doubt", EtcdOptions::new()).await.expect("connect");
    let q = broker.queue("q").await.expect("queue");
    fail::cfg(point, "1*return").expect("failpoint");
    let first = q.send("first").await;
    fail::remove(point);
    assert_eq!(first.expect("the lost append is settled, not failed"), 1);
    assert_eq!(q.send("second").await.expect("send"), 2);

    let stats = broker.stats().await.expect("stats");
    assert_eq!(stats.queues[0].len, 2, "each message stored once");
    let mut sub = q.group("g").expect("group").subscribe().await.expect("subscribe");
    for (seq, payload) in [(1, "first"), (2, "second")] {
        let d = tokio::time::timeout(common::HANG_GUARD, sub.next())
            .await
            .expect("delivery")
            .expect("open")
            .expect("ok");
        assert_eq!((d.seq(), d.payload().as_ref()), (seq, payload.as_bytes()));
        d.ack().expect("ack");
    }
    drop(sub);
    broker.shutdown().await.expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_append_whose_answer_was_lost_is_found_by_its_nonce_and_not_sent_again() {
    lose_once("rockq-etcd-append-answer").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_append_lost_before_it_was_applied_is_sent_again_at_the_same_sequence() {
    lose_once("rockq-etcd-append-request").await;
}
