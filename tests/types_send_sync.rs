//! Every public type is `Send` and `Sync` (and `Unpin` where it is a stream), so handles move
//! freely between tasks.

use rockq::*;

fn send_sync<T: Send + Sync>() {}
fn unpin<T: Unpin>() {}
fn stream<S: futures::Stream<Item = Result<Delivery, Error>>>() {}
fn event_stream<S: futures::Stream<Item = Event>>() {}
fn decoded_stream<S: futures::Stream<Item = Result<(u64, Delivery), Error>>>() {}

#[test]
fn public_types_are_send_and_sync() {
    send_sync::<Broker>();
    send_sync::<Options>();
    send_sync::<Durability>();
    send_sync::<Queue>();
    send_sync::<SendReceipt>();
    unpin::<SendReceipt>();
    send_sync::<Group>();
    send_sync::<StartFrom>();
    send_sync::<Subscription>();
    send_sync::<Delivery>();
    send_sync::<Message>();
    send_sync::<WriterStats>();
    send_sync::<StorageStats>();
    send_sync::<Error>();
    send_sync::<Error>();
    send_sync::<Error>();
    send_sync::<Error>();
    send_sync::<Error>();
    send_sync::<Error>();
    send_sync::<Error>();
    send_sync::<Error>();
    send_sync::<Error>();
    send_sync::<NameError>();
    send_sync::<StorageError>();
    send_sync::<CorruptionError>();
    send_sync::<WorkGroup>();
    send_sync::<WorkSubscription>();
    send_sync::<Job>();
    send_sync::<Task>();
    send_sync::<RetryPolicy>();
    send_sync::<Workers>();
    send_sync::<PoolReport>();
    send_sync::<PoolHandle>();
    send_sync::<HandlerError>();
    send_sync::<DeadLetters>();
    send_sync::<DeadLetter>();
    send_sync::<Redrive>();
    send_sync::<Error>();
    send_sync::<Event>();
    send_sync::<Clock>();
    send_sync::<ManualClock>();
    send_sync::<Inspector>();
    send_sync::<Keyspace>();
    send_sync::<Scan>();
    unpin::<Scan>();
    send_sync::<Entry>();
    send_sync::<Expect>();
    send_sync::<Transaction>();
    send_sync::<Committed>();
    send_sync::<TaskTx>();
    send_sync::<Error>();
    send_sync::<Error>();
    send_sync::<rockq::UnsupportedError>();
    #[cfg(feature = "etcd")]
    send_sync::<rockq::EtcdOptions>();
    send_sync::<KeyspaceStats>();
    send_sync::<Stats>();
    send_sync::<QueueStats>();
    send_sync::<GroupStats>();
    send_sync::<GroupMode>();
    send_sync::<PendingClaim>();
    send_sync::<PendingState>();
    send_sync::<StoredMessage>();
    // Typed jobs, handler state, events as a stream, errors (issue 17).
    send_sync::<TypedQueue<u64, Json>>();
    send_sync::<Decoded<u64>>();
    unpin::<Decoded<u64>>();
    send_sync::<EventStream>();
    unpin::<EventStream>();
    send_sync::<DecodeError>();
    send_sync::<FailedError>();
    send_sync::<Json>();
    send_sync::<Workers<std::sync::Arc<u64>>>();
    send_sync::<Sent>();
    send_sync::<Original>();
    send_sync::<ScheduledMessage>();
    send_sync::<Recurrence>();
    send_sync::<Missed>();
    send_sync::<ScheduleInfo>();
    send_sync::<DelayedInfo>();
    send_sync::<Error>();
    send_sync::<Error>();
    send_sync::<Error>();
    unpin::<Subscription>();
    stream::<Subscription>();
    event_stream::<EventStream>();
    decoded_stream::<Decoded<u64>>();
    unpin::<WorkSubscription>();
    work_stream::<WorkSubscription>();
}

fn work_stream<S: futures::Stream<Item = Result<Job, Error>>>() {}

fn is_send<T: Send>(_: &T) {}

/// Compile-time only: the futures of every async method can be spawned on a multi-threaded
/// runtime.
#[allow(dead_code, unused_must_use)]
fn futures_of_async_methods_are_send(b: &Broker, q: &Queue, g: &Group, s: &Subscription) {
    is_send(&Broker::open("x"));
    is_send(&Options::new().open("x"));
    is_send(&b.queue("q"));
    is_send(&b.shutdown());
    is_send(&q.send("m"));
    is_send(&q.send_batch(["m"]));
    is_send(&q.enqueue("m"));
    is_send(&g.subscribe());
    is_send(&s.commit());
}

/// Compile-time only: the same for work-queue groups, jobs, pools and dead letters.
#[allow(dead_code, unused_must_use)]
async fn work_futures_are_send(w: &WorkGroup, j: Job, d: &DeadLetters) {
    is_send(&w.subscribe());
    is_send(&w.workers(2).run(|_t: Task| async { Ok(()) }));
    is_send(&j.ack_durable());
    is_send(&w.workers(2).run_typed(|_v: u64, _t: Task| async { Ok(()) }));
    is_send(
        &w.workers(2)
            .state(std::sync::Arc::new(1u8))
            .run(|_t: Task, _s: std::sync::Arc<u8>| async { Ok(()) }),
    );
    is_send(&d.len());
    is_send(&d.list(10));
    is_send(&d.redrive(Redrive::new()));
}

/// Compile-time only: keyspace and transaction futures run on a multi-threaded runtime.
#[allow(dead_code, unused_must_use)]
async fn transaction_futures_are_send(
    b: &Broker,
    k: &Keyspace,
    t: Transaction,
    mut u: Transaction,
    task: Task,
) {
    is_send(&b.kv("k"));
    is_send(&k.get("x"));
    is_send(&k.put("x", "y"));
    is_send(&k.compare_and_set("x", Expect::Absent, Some("y")));
    is_send(&u.get_for_update(k, "x"));
    is_send(&t.commit());
    is_send(&task.tx().get_for_update(k, "x"));
}
