//! Every public type is `Send` and `Sync` (and `Unpin` where it is a stream), so handles move
//! freely between tasks.

use rockq::*;

fn send_sync<T: Send + Sync>() {}
fn unpin<T: Unpin>() {}
fn stream<S: futures::Stream<Item = Result<Delivery, Error>>>() {}

#[test]
fn public_types_are_send_and_sync() {
    send_sync::<Broker>();
    send_sync::<Options>();
    send_sync::<Durability>();
    send_sync::<Queue>();
    send_sync::<Group>();
    send_sync::<StartFrom>();
    send_sync::<Subscription>();
    send_sync::<Delivery>();
    send_sync::<Message>();
    send_sync::<WriterStats>();
    send_sync::<StorageStats>();
    send_sync::<Error>();
    send_sync::<OpenError>();
    send_sync::<QueueError>();
    send_sync::<SendError>();
    send_sync::<SubscribeError>();
    send_sync::<AckError>();
    send_sync::<CommitError>();
    send_sync::<ReceiveError>();
    send_sync::<ShutdownError>();
    send_sync::<NameError>();
    send_sync::<StorageError>();
    send_sync::<CorruptionError>();
    unpin::<Subscription>();
    stream::<Subscription>();
}

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
    is_send(&g.subscribe());
    is_send(&s.commit());
}
