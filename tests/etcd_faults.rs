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

/// A watch held at failpoint `apply` (its callback blocks until [`Hold::release`]), with
/// `applied` reached once the held batch went through.
struct Hold {
    gate: std::sync::Arc<(std::sync::Mutex<bool>, std::sync::Condvar)>,
    reached: std::sync::Arc<std::sync::atomic::AtomicBool>,
    applied: std::sync::Arc<std::sync::atomic::AtomicBool>,
    points: (&'static str, &'static str),
}

impl Hold {
    fn at(apply: &'static str, applied: &'static str) -> Hold {
        let gate = std::sync::Arc::new((std::sync::Mutex::new(true), std::sync::Condvar::new()));
        let (held, reached) = (gate.clone(), std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false)));
        let seen = reached.clone();
        fail::cfg_callback(apply, move || {
            seen.store(true, std::sync::atomic::Ordering::SeqCst);
            // Waits off the runtime's worker (`block_in_place` hands its queue to another
            // thread): blocked on it, a task the watch had just woken would sit in the worker's
            // LIFO slot, which other workers do not steal, until the gate opened — never, if
            // the test waits for that task (a hang CI found once).
            tokio::task::block_in_place(|| {
                let (lock, cv) = &*held;
                let mut closed = lock.lock().unwrap();
                while *closed {
                    closed = cv.wait(closed).unwrap();
                }
            })
        })
        .expect("failpoint");
        let applied_flag = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let done = applied_flag.clone();
        fail::cfg_callback(applied, move || done.store(true, std::sync::atomic::Ordering::SeqCst))
            .expect("failpoint");
        Hold { gate, reached, applied: applied_flag, points: (apply, applied) }
    }

    /// Waits until the watch reached the hold (a batch is held).
    async fn reached(&self) {
        wait_for(&self.reached, "the watch never brought the batch").await;
    }

    /// Lets the held batch through, and waits until it was applied.
    async fn release(self) {
        self.open();
        wait_for(&self.applied, "the watch never applied what it held").await;
    }

    fn open(&self) {
        fail::remove(self.points.0);
        let (lock, cv) = &*self.gate;
        *lock.lock().unwrap_or_else(|p| p.into_inner()) = false;
        cv.notify_all();
    }
}

/// A test that fails while the watch is held lets it go: blocked on the gate, the runtime's
/// shutdown would wait for ever and the failure would show as a hang.
impl Drop for Hold {
    fn drop(&mut self) {
        self.open();
        fail::remove(self.points.1);
    }
}

async fn wait_for(flag: &std::sync::atomic::AtomicBool, what: &str) {
    let deadline = tokio::time::Instant::now() + common::HANG_GUARD;
    while !flag.load(std::sync::atomic::Ordering::SeqCst) {
        assert!(tokio::time::Instant::now() < deadline, "{what}");
        tokio::task::yield_now().await;
    }
}

/// Configures failpoint `point` to run `work` the first time it is reached, as another process
/// would: on a thread of its own, with a runtime and a broker of its own on namespace `ns` (the
/// callback runs inside the engine, where it cannot await). Returns a flag set once it ran.
fn once_elsewhere<F, Fut>(
    point: &str,
    endpoints: Vec<String>,
    ns: &'static str,
    work: F,
) -> std::sync::Arc<std::sync::atomic::AtomicBool>
where
    F: Fn(Broker) -> Fut + Clone + Send + Sync + 'static,
    Fut: std::future::Future<Output = ()>,
{
    let ran = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flag = ran.clone();
    fail::cfg_callback(point, move || {
        if flag.swap(true, std::sync::atomic::Ordering::SeqCst) {
            return;
        }
        let (endpoints, work) = (endpoints.clone(), work.clone());
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
            rt.block_on(async move {
                let b = Broker::connect_etcd(endpoints, ns, EtcdOptions::new()).await.expect("connect");
                work(b.clone()).await;
                b.shutdown().await.expect("shutdown");
            });
        })
        .join()
        .expect("the other process");
    })
    .expect("failpoint");
    ran
}

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

/// An append of a packed run (one key for 20 messages) whose answer was lost: the key holding
/// its first message is found by the run's revision, and nothing is sent twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_packed_append_whose_answer_was_lost_is_found_and_not_sent_again() {
    let _one_at_a_time = SERIAL.lock().await;
    let cluster = etcd::Cluster::start(1).await;
    let broker =
        Broker::connect_etcd(cluster.endpoints(), "doubt-run", EtcdOptions::new()).await.expect("connect");
    let q = broker.queue("q").await.expect("queue");
    fail::cfg("rockq-etcd-append-answer", "1*return").expect("failpoint");
    let first = q.send_batch((1..=20).map(|i| rockq::Message::new(format!("m{i}")))).await;
    fail::remove("rockq-etcd-append-answer");
    assert_eq!(first.expect("the lost append is settled, not failed"), 1..=20);
    assert_eq!(q.send("m21").await.expect("send"), 21);
    let stats = broker.stats().await.expect("stats");
    assert_eq!(stats.queues[0].len, 21, "each message stored once");
    let mut sub = q.group("g").expect("group").read_batch(3).subscribe().await.expect("subscribe");
    for i in 1..=21u64 {
        let d = tokio::time::timeout(common::HANG_GUARD, sub.next())
            .await
            .expect("delivery")
            .expect("open")
            .expect("ok");
        assert_eq!((d.seq(), d.payload().as_ref()), (i, format!("m{i}").as_bytes()));
        d.ack().expect("ack");
    }
    drop(sub);
    broker.shutdown().await.expect("shutdown");
}

async fn connect_with(cluster: &etcd::Cluster, ns: &str, clock: &rockq::ManualClock) -> Broker {
    let opts = EtcdOptions::new().options(rockq::Options::new().clock(clock.clone()));
    Broker::connect_etcd(cluster.endpoints(), ns, opts).await.expect("connect")
}

async fn next_job(jobs: &mut rockq::WorkSubscription) -> rockq::Job {
    tokio::time::timeout(common::HANG_GUARD, jobs.next()).await.expect("job").expect("open").expect("ok")
}

fn committed(s: &rockq::Stats) -> u64 {
    s.groups.iter().find(|g| g.group == "w").map_or(0, |g| g.committed)
}

/// Message 1 of queue `q`, sent and failed once in work group `w` (five attempts, a fixed
/// backoff of a minute, no jitter): waiting for its retry. Returns the subscription that
/// failed it and the backoff.
async fn one_retry_waiting(a: &Broker) -> (rockq::WorkSubscription, std::time::Duration) {
    let q = a.queue("q").await.expect("queue");
    q.send("one").await.expect("send");
    let backoff = std::time::Duration::from_secs(60);
    let policy = rockq::RetryPolicy::default().max_attempts(5).backoff(backoff, backoff).jitter(0.0);
    let mut jobs =
        q.work_group("w").expect("group").retry_policy(policy).subscribe().await.expect("subscribe");
    next_job(&mut jobs).await.fail_durable("503").await.expect("fail");
    (jobs, backoff)
}

/// The fence is etcd's compare on the claim's revision, not what the watch told this process:
/// with the watch held back, `a` (whose clock lags) still holds its job when `b` claims it
/// after the stored deadline; `a`'s ack reaches etcd and is refused, changing nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_old_holders_ack_is_refused_by_etcd_while_its_watch_lags() {
    let _one_at_a_time = SERIAL.lock().await;
    let cluster = etcd::Cluster::start(1).await;
    let (clock_a, clock_b) = (rockq::ManualClock::new(), rockq::ManualClock::new());
    let a = connect_with(&cluster, "lag", &clock_a).await;
    let qa = a.queue("q").await.expect("queue");
    qa.send("one").await.expect("send");
    let lease = std::time::Duration::from_secs(30);
    let mut ja = qa.work_group("w").expect("group").lease(lease).subscribe().await.expect("subscribe");
    let held = next_job(&mut ja).await;
    fail::cfg("rockq-etcd-claim-watch", "return").expect("failpoint");
    // `b` loads the group (with `a`'s lease) after the claim; its clock runs ahead.
    let b = connect_with(&cluster, "lag", &clock_b).await;
    let qb = b.queue("q").await.expect("queue");
    let mut jb = qb.work_group("w").expect("group").subscribe().await.expect("subscribe");
    clock_b.advance(lease + std::time::Duration::from_secs(5));
    let taken = next_job(&mut jb).await;
    assert_eq!((taken.seq(), taken.attempt()), (1, 2));
    let refused = held.ack_durable().await;
    fail::remove("rockq-etcd-claim-watch");
    match refused {
        Err(rockq::Error::LeaseLost { seq: 1, .. }) => {}
        other => panic!("etcd must refuse the old holder's ack, got {other:?}"),
    }
    assert_eq!(committed(&a.stats().await.expect("stats")), 0, "nothing changed");
    taken.ack_durable().await.expect("the new holder's ack");
    b.flush().await.expect("flush");
    assert_eq!(committed(&b.stats().await.expect("stats")), 1);
    a.shutdown().await.expect("shutdown");
    b.shutdown().await.expect("shutdown");
}

/// Two brokers' claims overlap when each decides on a view the other's writes have not reached
/// (here the claim watches are held back): `b` claims 1–3, then `a`, blind to them, claims
/// 1–5. etcd refuses `a`'s write; `a` learns 1–3 from the refusal and writes 4–5 alone: its
/// batch is what the overlap left, not given up whole (a loser that gives up whole batches
/// keeps losing to a busy peer). A third broker, loading the records from etcd, sees `b`'s
/// three and `a`'s two leased and 6–10 waiting.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_overlapping_another_brokers_is_written_for_the_rest() {
    let _one_at_a_time = SERIAL.lock().await;
    let cluster = etcd::Cluster::start(1).await;
    let clock = rockq::ManualClock::new();
    let a = connect_with(&cluster, "overlap", &clock).await;
    let qa = a.queue("q").await.expect("queue");
    qa.send_batch((1..=10).map(|i| i.to_string())).await.expect("send");
    let b = connect_with(&cluster, "overlap", &clock).await;
    let qb = b.queue("q").await.expect("queue");
    // Both load the group before their watches are held (a subscription claims when polled).
    let mut ja = qa.work_group("w").expect("group").read_batch(5).subscribe().await.expect("subscribe");
    let mut jb = qb.work_group("w").expect("group").read_batch(3).subscribe().await.expect("subscribe");
    fail::cfg("rockq-etcd-claim-watch", "return").expect("failpoint");
    let first_b = next_job(&mut jb).await;
    assert_eq!((first_b.seq(), first_b.attempt()), (1, 1));
    let first_a = next_job(&mut ja).await;
    fail::remove("rockq-etcd-claim-watch");
    assert_eq!((first_a.seq(), first_a.attempt()), (4, 1), "the overlap left out, the rest claimed");
    let c = connect_with(&cluster, "overlap", &clock).await;
    let mut states = Vec::new();
    for seq in 1..=10 {
        let job = c.job("q", "w", seq).await.expect("job status");
        states.push((seq, job.state.as_str(), job.attempt));
    }
    let leased = |s| (s, "leased", 1);
    let queued = |s| (s, "queued", 0);
    let want: Vec<_> = (1..=5).map(leased).chain((6..=10).map(queued)).collect();
    assert_eq!(states, want, "a's claim wrote 4 and 5 only, and nothing else was claimed");
    let second_a = next_job(&mut ja).await;
    assert_eq!(second_a.seq(), 5, "the rest of a's batch");
    // Having lost three to b, a's next claim leaves the next three fresh ones (6–8) to b and
    // starts past them; with nothing past 10, the same batch goes on from 6 (a short backlog
    // is not left waiting for anyone).
    let mut rest = Vec::new();
    for _ in 6..=10 {
        rest.push(next_job(&mut ja).await);
    }
    let order: Vec<u64> = rest.iter().map(|j| j.seq()).collect();
    assert_eq!(order, [9, 10, 6, 7, 8], "a's claim after the overlap starts past the range left to b");
    for j in [first_a, second_a, first_b].into_iter().chain(rest) {
        j.ack_durable().await.expect("ack");
    }
    drop((ja, jb));
    for broker in [a, b, c] {
        broker.shutdown().await.expect("shutdown");
    }
}

/// A record that does not decode, in the part of a batch another process took first, is that
/// process's to deal with: the read of `a`'s batch (started with the claim) meets it first,
/// but the claim's answer left it out, so `a` claims again and gets its own jobs — its stream
/// does not end with the other process's corrupt record.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupt_record_another_broker_took_first_does_not_end_the_stream() {
    let _one_at_a_time = SERIAL.lock().await;
    let cluster = etcd::Cluster::start(1).await;
    let clock = rockq::ManualClock::new();
    let a = connect_with(&cluster, "overlap-corrupt", &clock).await;
    let qa = a.queue("q").await.expect("queue");
    qa.send_batch(["1", "2", "3"]).await.expect("send");
    let b = connect_with(&cluster, "overlap-corrupt", &clock).await;
    let qb = b.queue("q").await.expect("queue");
    let mut ja = qa.work_group("w").expect("group").read_batch(3).subscribe().await.expect("subscribe");
    let mut jb = qb.work_group("w").expect("group").read_batch(1).subscribe().await.expect("subscribe");
    fail::cfg("rockq-etcd-claim-watch", "return").expect("failpoint");
    let held_by_b = next_job(&mut jb).await;
    assert_eq!(held_by_b.seq(), 1);
    // Message 1's record is damaged after `b` read it (`<ns>/m/<queue id 1><seq>`).
    let mut client = cluster.client().await;
    let key = [b"overlap-corrupt/m/".as_slice(), &1u32.to_be_bytes(), &1u64.to_be_bytes()].concat();
    client.put(key, b"not an envelope".to_vec(), None).await.expect("damage the record");
    let first_a = tokio::time::timeout(std::time::Duration::from_secs(10), ja.next())
        .await
        .expect("a's claim is answered")
        .expect("a's stream goes on")
        .expect("no error: the corrupt record is b's");
    fail::remove("rockq-etcd-claim-watch");
    assert_eq!((first_a.seq(), first_a.attempt()), (2, 1), "a's own part of the batch");
    first_a.ack_durable().await.expect("ack");
    drop((ja, jb, held_by_b));
    a.shutdown().await.expect("shutdown");
    b.shutdown().await.expect("shutdown");
}

/// An operator's action is decided on what this process knows of the job, and etcd's compare
/// on the claim's revision refuses it if another process changed the job meanwhile: `b`,
/// whose watch lags, deletes a job it still sees waiting for a retry, which `a` has claimed
/// again since. The delete is refused, changes nothing, and `a`'s lease stands.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_action_decided_on_a_stale_view_is_refused_by_etcd() {
    let _one_at_a_time = SERIAL.lock().await;
    let cluster = etcd::Cluster::start(1).await;
    let clock = rockq::ManualClock::new();
    let a = connect_with(&cluster, "operator-stale", &clock).await;
    let (mut ja, backoff) = one_retry_waiting(&a).await;
    // `b` loads the group with the retry waiting; from now on no watch brings anything.
    let b = connect_with(&cluster, "operator-stale", &clock).await;
    fail::cfg("rockq-etcd-claim-watch", "return").expect("failpoint");
    clock.advance(backoff + std::time::Duration::from_secs(1));
    let again = next_job(&mut ja).await;
    assert_eq!((again.seq(), again.attempt()), (1, 2));
    let refused = b.delete_job("q", "w", 1).await;
    fail::remove("rockq-etcd-claim-watch");
    match refused {
        Err(rockq::Error::JobState { seq: 1, state, action: "delete", .. })
            if state.starts_with("changed meanwhile") => {}
        other => panic!("etcd must refuse a delete decided on a stale view, got {other:?}"),
    }
    // It learned the job's state from the refusal: now it says why.
    let e = b.delete_job("q", "w", 1).await.expect_err("leased");
    assert!(matches!(e, rockq::Error::JobState { state: "leased", .. }), "{e}");
    again.ack_durable().await.expect("the holder's lease stands");
    a.flush().await.expect("flush");
    assert_eq!(committed(&a.stats().await.expect("stats")), 1);
    a.shutdown().await.expect("shutdown");
    b.shutdown().await.expect("shutdown");
}

/// An operator's delete that cannot reach etcd leaves the job as it was taken: a retry still
/// waits for its due time (the writer once put it back to claimable at once, so it ran before
/// its backoff).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_delete_that_fails_leaves_a_waiting_retry_waiting() {
    let _one_at_a_time = SERIAL.lock().await;
    let cluster = etcd::Cluster::start(1).await;
    let clock = rockq::ManualClock::new();
    let opts = EtcdOptions::new()
        .request_timeout(std::time::Duration::from_secs(1))
        .options(rockq::Options::new().clock(clock.clone()));
    let a = Broker::connect_etcd(cluster.endpoints(), "operator-undo", opts).await.expect("connect");
    let (jobs, _) = one_retry_waiting(&a).await;
    let waiting = |s: &rockq::JobStatus| matches!(s.state, rockq::JobState::RetryWaiting { .. });
    assert!(waiting(&a.job("q", "w", 1).await.unwrap()));

    let failing = Failing::on("rockq-etcd-claim-request");
    let failed = a.delete_job("q", "w", 1).await;
    drop(failing);
    assert!(matches!(failed, Err(rockq::Error::Storage(_))), "{failed:?}");
    let status = a.job("q", "w", 1).await.unwrap();
    assert!(waiting(&status), "still waiting for its retry: {:?}", status.state);
    a.delete_job("q", "w", 1).await.expect("deleted once etcd answers");
    assert!(matches!(a.job("q", "w", 1).await.unwrap().state, rockq::JobState::Finished));
    drop(jobs);
    a.shutdown().await.expect("shutdown");
}

/// A claim whose answer was lost is sent again; the second try finds the records this
/// process meant to write and counts the claim as made (not as lost to another process, which
/// would leave the message leased to nobody until the lease ran out).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_whose_answer_was_lost_is_found_to_be_ours() {
    let _one_at_a_time = SERIAL.lock().await;
    let cluster = etcd::Cluster::start(1).await;
    let clock = rockq::ManualClock::new();
    let a = connect_with(&cluster, "claim-doubt", &clock).await;
    let q = a.queue("q").await.expect("queue");
    q.send("one").await.expect("send");
    let group = q.work_group("w").expect("group");
    let mut jobs = group.subscribe().await.expect("subscribe");
    fail::cfg("rockq-etcd-claim-answer", "1*return").expect("failpoint");
    let job = next_job(&mut jobs).await;
    fail::remove("rockq-etcd-claim-answer");
    assert_eq!((job.seq(), job.attempt()), (1, 1), "claimed once, by this process");
    job.ack_durable().await.expect("its ack passes the fence: the claim is this process's");
    a.flush().await.expect("flush");
    assert_eq!(committed(&a.stats().await.expect("stats")), 1);
    a.shutdown().await.expect("shutdown");
}

/// Regression (CI failure): a subscription dropped just before `shutdown` left its group to the
/// writer's release, whose lease revoke ran on a task nothing waited for; a runtime stopped
/// right after `shutdown` returned cancelled the revoke, and the group stayed owned by a
/// process that no longer ran for a whole owner TTL. `shutdown` now waits for every revoke.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_released_just_before_shutdown_is_free_when_shutdown_returns() {
    let _one_at_a_time = SERIAL.lock().await;
    let cluster = etcd::Cluster::start(1).await;
    // Long enough that only a revoke (never the TTL) can free the group within the test.
    let opts = || EtcdOptions::new().owner_ttl(std::time::Duration::from_secs(60));
    fail::cfg("rockq-etcd-revoke-late", "return").expect("failpoint");
    let endpoints = cluster.endpoints();
    // Another process: its own runtime, ended the moment `shutdown` returns.
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
        rt.block_on(async {
            let b = Broker::connect_etcd(endpoints, "release", opts()).await.expect("connect");
            let q = b.queue("q").await.expect("queue");
            drop(q.group("g").expect("group").subscribe().await.expect("subscribe"));
            // The writer releases the group in a round of its own, before the shutdown.
            b.flush().await.expect("flush");
            b.shutdown().await.expect("shutdown");
        });
    })
    .join()
    .expect("the other process");
    fail::remove("rockq-etcd-revoke-late");
    let a = Broker::connect_etcd(cluster.endpoints(), "release", opts()).await.expect("connect");
    let q = a.queue("q").await.expect("queue");
    match q.group("g").expect("group").subscribe().await {
        Ok(sub) => drop(sub),
        Err(e) => panic!("the group is still owned after its owner shut down: {e}"),
    }
    a.shutdown().await.expect("shutdown");
}

/// A group created after a retention pass computed its cuts and before its trim lands would
/// lose its messages to a cut computed without it: the trim compares that no offset record
/// was created since it read them, is refused, and is computed again with the new group.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_created_while_a_trim_is_planned_keeps_its_messages() {
    let _one_at_a_time = SERIAL.lock().await;
    let cluster = etcd::Cluster::start(1).await;
    let clock = rockq::ManualClock::new();
    let a = connect_with(&cluster, "race", &clock).await;
    let q = a.queue("q").await.expect("queue");
    for i in 1..=10 {
        q.send(format!("m{i}")).await.expect("send");
    }
    // The only group has finished everything: the default policy would delete all ten.
    let mut sub = q.group("done").expect("group").subscribe().await.expect("subscribe");
    for _ in 0..10 {
        tokio::time::timeout(common::HANG_GUARD, sub.next())
            .await
            .expect("delivery")
            .expect("open")
            .expect("ok")
            .ack()
            .expect("ack");
    }
    a.flush().await.expect("flush");
    // Another process creates a group starting at the earliest message, right between the
    // pass's read and its trim.
    let created = once_elsewhere("rockq-etcd-trim-planned", cluster.endpoints(), "race", |b| async move {
        let q = b.queue("q").await.expect("queue");
        drop(q.group("late").expect("group").subscribe().await.expect("subscribe"));
    });
    let report = a.trim().await;
    fail::remove("rockq-etcd-trim-planned");
    assert!(created.load(std::sync::atomic::Ordering::SeqCst), "the group was created mid-pass");
    assert_eq!(report.expect("trim").deleted, 0, "the late group has finished nothing");
    assert_eq!(q.first_seq(), 1);
    drop(sub);
    a.shutdown().await.expect("shutdown");
    // The late group gets every message, from the first.
    let b = connect_with(&cluster, "race", &clock).await;
    let q = b.queue("q").await.expect("queue");
    let mut late = q.group("late").expect("group").subscribe().await.expect("subscribe");
    let d = tokio::time::timeout(common::HANG_GUARD, late.next())
        .await
        .expect("delivery")
        .expect("open")
        .expect("ok");
    assert_eq!(d.seq(), 1);
    drop(late);
    b.shutdown().await.expect("shutdown");
}

/// Regression (review finding): a work group created on a head read just before another
/// process's trim landed got an offset below the new head, and waited for ever on messages
/// that were gone (its offset never moved, so `UntilAcked` never trimmed the queue again).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_work_group_created_on_a_head_trimmed_meanwhile_starts_at_the_new_head() {
    let _one_at_a_time = SERIAL.lock().await;
    let cluster = etcd::Cluster::start(1).await;
    let clock = rockq::ManualClock::new();
    let a = connect_with(&cluster, "stale-head", &clock).await;
    let q = a.queue("q").await.expect("queue");
    for i in 1..=10 {
        q.send(format!("m{i}")).await.expect("send");
    }
    q.set_retention(rockq::Retention::MaxLen(3)).await.expect("policy");
    let point = "rockq-etcd-work-group-planned";
    let trimmed = once_elsewhere(point, cluster.endpoints(), "stale-head", |b| async move {
        assert_eq!(b.trim().await.expect("trim").deleted, 7);
    });
    let group = q.work_group("w").expect("group");
    let mut jobs = group.subscribe().await.expect("subscribe");
    fail::remove("rockq-etcd-work-group-planned");
    assert!(trimmed.load(std::sync::atomic::Ordering::SeqCst), "the trim landed mid-creation");
    for expected in 8..=10 {
        let j = next_job(&mut jobs).await;
        assert_eq!(j.seq(), expected);
        j.ack_durable().await.expect("ack");
    }
    assert_eq!(group.committed(), Some(10), "the offset passed the deleted head and the jobs");
    drop(jobs);
    a.shutdown().await.expect("shutdown");
}

/// A lease extension that does not reach etcd leaves its holder with the deadline every other
/// process reads (issue 32): past that deadline the holder's ack is refused and the job is
/// claimed again, once. Before, the holder kept the longer deadline it had asked for, and two
/// processes could each believe they held the job.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_extension_that_does_not_reach_etcd_keeps_the_shorter_deadline() {
    let _one_at_a_time = SERIAL.lock().await;
    let cluster = etcd::Cluster::start(1).await;
    let clock = rockq::ManualClock::new();
    let a = connect_with(&cluster, "extend-lost", &clock).await;
    let b = connect_with(&cluster, "extend-lost", &clock).await;
    let qa = a.queue("q").await.expect("queue");
    qa.send("long").await.expect("send");
    let lease = std::time::Duration::from_secs(10);
    let mut ja = qa.work_group("w").expect("group").lease(lease).subscribe().await.expect("subscribe");
    let job = next_job(&mut ja).await;
    let qb = b.queue("q").await.expect("queue");
    let mut jb = qb.work_group("w").expect("group").subscribe().await.expect("subscribe");

    clock.advance(std::time::Duration::from_secs(8));
    fail::cfg("rockq-etcd-claim-request", "return").expect("failpoint");
    job.extend(std::time::Duration::from_secs(30)).expect("accepted: the lease is still held");
    // The writer takes requests in order: the flush answers after the extension was tried.
    a.flush().await.expect("flush");
    fail::remove("rockq-etcd-claim-request");
    assert_eq!(
        job.lease_remaining(),
        std::time::Duration::from_secs(2),
        "back to the deadline other processes read, not the 30 s asked for"
    );

    // Past the first deadline, inside the extension that was never written.
    clock.advance(std::time::Duration::from_secs(3));
    match job.ack() {
        Err(rockq::Error::LeaseLost { seq: 1, attempt: 1, .. }) => {}
        other => panic!("the holder's lease ran out at the stored deadline, got {other:?}"),
    }
    let taken = tokio::select! {
        j = next_job(&mut jb) => j,
        j = next_job(&mut ja) => j,
    };
    assert_eq!((taken.seq(), taken.attempt()), (1, 2), "claimed again, with the attempt counted");
    taken.ack_durable().await.expect("the new holder's ack");
    a.flush().await.expect("flush");
    assert_eq!(committed(&b.stats().await.expect("stats")), 1);
    a.shutdown().await.expect("shutdown");
    b.shutdown().await.expect("shutdown");
}

/// A process that has not seen a reset yet cannot undo it: `a` finished two jobs but its offset
/// move over them is held back, and its watch sees nothing; `b` resets the group to its start
/// meanwhile. `a`'s move, decided on the view from before the reset, reaches etcd and is
/// refused (it compares the group's reset mark), so the replay stands.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_offset_move_decided_before_a_reset_does_not_undo_it() {
    let _one_at_a_time = SERIAL.lock().await;
    let cluster = etcd::Cluster::start(1).await;
    let clock = rockq::ManualClock::new();
    let a = connect_with(&cluster, "reset-fence", &clock).await;
    let qa = a.queue("q").await.expect("queue");
    qa.send_batch(["1", "2", "3"]).await.expect("send");
    let mut ja = qa.work_group("w").expect("group").subscribe().await.expect("subscribe");
    let jobs = [next_job(&mut ja).await, next_job(&mut ja).await, next_job(&mut ja).await];
    drop(ja);
    let [one, two, three] = jobs;
    one.ack_durable().await.expect("ack");
    a.flush().await.expect("flush");
    assert_eq!(committed(&a.stats().await.expect("stats")), 1);
    fail::cfg("rockq-etcd-offset-move", "return").expect("failpoint");
    fail::cfg("rockq-etcd-claim-watch", "return").expect("failpoint");
    two.ack_durable().await.expect("ack");
    three.ack_durable().await.expect("ack");
    let b = connect_with(&cluster, "reset-fence", &clock).await;
    let qb = b.queue("q").await.expect("queue");
    let reset = qb.work_group("w").expect("group").reset_to(rockq::ResetTo::Sequence(1)).await;
    fail::remove("rockq-etcd-offset-move");
    assert_eq!(reset.expect("no lease is live: the reset lands"), 1);
    // `a` moves its offset over 2 and 3 now, on its view from before the reset.
    let moved = a.flush().await;
    fail::remove("rockq-etcd-claim-watch");
    moved.expect("a refused move is no error");
    assert_eq!(committed(&b.stats().await.expect("stats")), 0, "the reset stands");
    let mut jb = qb.work_group("w").expect("group").subscribe().await.expect("subscribe");
    for seq in 1..=3 {
        let j = next_job(&mut jb).await;
        assert_eq!((j.seq(), j.attempt()), (seq, 1), "replayed from the start");
        j.ack_durable().await.expect("ack");
    }
    drop(jb);
    b.flush().await.expect("flush");
    assert_eq!(committed(&b.stats().await.expect("stats")), 3);
    a.shutdown().await.expect("shutdown");
    b.shutdown().await.expect("shutdown");
}

/// A reset whose transaction landed and whose answer was lost, with another process taking the
/// group (`ordered`: subscribing to the ordered group, which makes it the owner; else claiming
/// a job of the work group) from the reset's offset before the retry: the retry is refused (the
/// reset moved the records it compares), and the next read finds the group in use elsewhere.
/// The call's marker says the reset was applied: it answers `Ok` (it answered `Error::Active`,
/// "the group is in use", for the reset it had made).
async fn reset_lost_while_another_takes_the_group(ordered: bool) {
    let _one_at_a_time = SERIAL.lock().await;
    let cluster = etcd::Cluster::start(1).await;
    let clock = rockq::ManualClock::new();
    let a = connect_with(&cluster, "reset-doubt", &clock).await;
    let q = a.queue("q").await.expect("queue");
    q.send_batch(["1", "2", "3"]).await.expect("send");
    if ordered {
        let mut sub = q.group("g").expect("group").subscribe().await.expect("subscribe");
        for d in common::take(&mut sub, 3).await {
            d.ack().expect("ack");
        }
        sub.commit().await.expect("commit");
    } else {
        let mut jobs = q.work_group("w").expect("group").subscribe().await.expect("subscribe");
        for _ in 0..3 {
            next_job(&mut jobs).await.ack_durable().await.expect("ack");
        }
    }
    a.flush().await.expect("flush");
    // Once the reset has landed: another process takes the group and holds it (its runtime
    // parked until the test lets it go), then the reset's answer is lost.
    let (taken_tx, taken) = std::sync::mpsc::channel::<u64>();
    let taken = std::sync::Mutex::new(taken);
    let (stop, stopped) = std::sync::mpsc::channel::<()>();
    let stopped = std::sync::Arc::new(std::sync::Mutex::new(Some(stopped)));
    let held_seq = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let held_seq_there = held_seq.clone();
    let endpoints = cluster.endpoints();
    let other = std::sync::Arc::new(std::sync::Mutex::new(None));
    let other_thread = other.clone();
    fail::cfg_callback("rockq-etcd-reset-landed", move || {
        let Some(stopped) = stopped.lock().unwrap().take() else { return };
        let (endpoints, taken_tx) = (endpoints.clone(), taken_tx.clone());
        *other_thread.lock().unwrap() = Some(std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
            rt.block_on(async move {
                let b = Broker::connect_etcd(endpoints, "reset-doubt", EtcdOptions::new())
                    .await
                    .expect("connect");
                let qb = b.queue("q").await.expect("queue");
                if ordered {
                    let mut sb = qb.group("g").expect("group").subscribe().await.expect("subscribe");
                    let held = common::next(&mut sb).await;
                    taken_tx.send(held.seq()).expect("report");
                    stopped.recv().expect("stop");
                    drop((held, sb));
                } else {
                    let mut jb = qb.work_group("w").expect("group").subscribe().await.expect("subscribe");
                    let held = next_job(&mut jb).await;
                    taken_tx.send(held.seq()).expect("report");
                    stopped.recv().expect("stop");
                    drop((held, jb));
                }
                b.shutdown().await.expect("shutdown");
            });
        }));
        let seq = taken.lock().unwrap().recv().expect("taken");
        held_seq_there.store(seq, std::sync::atomic::Ordering::SeqCst);
    })
    .expect("failpoint");
    fail::cfg("rockq-etcd-reset-answer", "1*return").expect("failpoint");
    let reset = match ordered {
        true => q.group("g").expect("group").reset_to(rockq::ResetTo::Sequence(1)).await,
        false => q.work_group("w").expect("group").reset_to(rockq::ResetTo::Sequence(1)).await,
    };
    fail::remove("rockq-etcd-reset-answer");
    fail::remove("rockq-etcd-reset-landed");
    // (Gone already if the failpoint was never reached: the assertions below say why.)
    let _ = stop.send(());
    if let Some(joined) = other.lock().unwrap().take() {
        joined.join().expect("the other process");
    }
    assert_eq!(reset.expect("the reset landed: reported applied, not Active"), 1);
    assert_eq!(held_seq.load(std::sync::atomic::Ordering::SeqCst), 1, "taken from the reset's offset");
    a.shutdown().await.expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_work_group_reset_whose_answer_was_lost_reports_it_applied_though_the_group_is_busy_since() {
    reset_lost_while_another_takes_the_group(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ordered_group_reset_whose_answer_was_lost_reports_it_applied_though_the_group_is_owned_since() {
    reset_lost_while_another_takes_the_group(true).await;
}

/// A claim this process wrote before its own reset, brought by its claim watch only after the
/// reset was applied here, must not come back: the reset deleted it. (Found by the embedded
/// `work_groups` suite on etcd, where it showed as attempt 2 after a reset, now and then.) The
/// watch is held at the batch carrying the claim until the reset is done.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_the_watch_brings_after_a_reset_it_predates_is_forgotten() {
    let _one_at_a_time = SERIAL.lock().await;
    let cluster = etcd::Cluster::start(1).await;
    let clock = rockq::ManualClock::new();
    let a = connect_with(&cluster, "reset-late-claim", &clock).await;
    let q = a.queue("q").await.expect("queue");
    q.send("1").await.expect("send");
    let group = q.work_group("w").expect("group").lease(std::time::Duration::from_secs(10));
    // Hold every claim-watch batch until released.
    let hold = Hold::at("rockq-etcd-claim-watch-apply", "rockq-etcd-claim-watch-applied");
    let mut jobs = group.subscribe().await.expect("subscribe");
    let job = next_job(&mut jobs).await;
    assert_eq!((job.seq(), job.attempt()), (1, 1));
    drop(jobs);
    hold.reached().await;
    clock.advance(std::time::Duration::from_secs(11));
    assert!(matches!(job.ack_durable().await, Err(rockq::Error::LeaseLost { .. })));
    assert_eq!(group.reset_to(rockq::ResetTo::Sequence(1)).await.expect("reset"), 1);
    // Now the watch applies what it held, the claim from before the reset; wait until it has.
    hold.release().await;
    let mut jobs = group.subscribe().await.expect("subscribe");
    let job = next_job(&mut jobs).await;
    assert_eq!((job.seq(), job.attempt()), (1, 1), "the reset forgot the old attempt");
    job.ack_durable().await.expect("ack");
    drop(jobs);
    a.shutdown().await.expect("shutdown");
}

/// A dead letter that another process settles on its own (`DeadLetters::delete`) while a
/// redrive of the letters around it is on its way is left out of the redrive, which moves the
/// others, at either point of the writer's work:
///
/// - `rockq-etcd-redrive-received`: after the handle read the marks, before the writer read
///   the cursor. The writer reads the marks itself; going by the handle's would move the
///   deleted letter as well.
/// - `rockq-etcd-redrive-planned`: after the writer read the cursor and the marks, before its
///   transaction. The settle rewrote the cursor, so the transaction is refused and the marks
///   read again; without the rewrite the letter would be both deleted and redriven, and
///   treating the refusal as another redrive's would fail the redrive with a conflict.
async fn a_letter_settled_elsewhere_during_a_redrive_is_not_moved(point: &'static str) {
    let _one_at_a_time = SERIAL.lock().await;
    let cluster = etcd::Cluster::start(1).await;
    let clock = rockq::ManualClock::new();
    let a = connect_with(&cluster, "letters", &clock).await;
    let dlq_queue = a.queue("jobs.dlq").await.expect("queue");
    dlq_queue.send_batch(["l1", "l2", "l3", "l4"]).await.expect("letters");
    a.queue("quarantine").await.expect("target");
    let settled = once_elsewhere(point, cluster.endpoints(), "letters", |b| async move {
        b.dead_letters("jobs.dlq").await.expect("dlq").delete(3).await.expect("delete letter 3");
    });
    let dlq = a.dead_letters("jobs.dlq").await.expect("dlq");
    let moved = dlq.redrive(rockq::Redrive::new().to("quarantine")).await;
    fail::remove(point);
    assert!(settled.load(std::sync::atomic::Ordering::SeqCst), "letter 3 was settled mid-redrive");
    assert_eq!(moved.expect("the redrive goes on over the marks it read"), 3);
    let got: Vec<_> = a
        .peek("quarantine", None, 10)
        .await
        .expect("peek")
        .into_iter()
        .map(|m| String::from_utf8(m.payload.to_vec()).expect("utf8"))
        .collect();
    assert_eq!(got, ["l1", "l2", "l4"], "the deleted letter is not redriven");
    assert!(dlq.is_empty().await.expect("len"));
    a.shutdown().await.expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_letter_settled_elsewhere_before_the_writer_reads_the_cursor_is_not_moved() {
    a_letter_settled_elsewhere_during_a_redrive_is_not_moved("rockq-etcd-redrive-received").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_letter_settled_elsewhere_before_the_redrive_s_transaction_is_not_moved() {
    a_letter_settled_elsewhere_during_a_redrive_is_not_moved("rockq-etcd-redrive-planned").await;
}

/// A queue deletion whose answer was lost, while another process made a queue of the same
/// name anew before the deletion looked again: the call reports its queue deleted and leaves
/// the new one, and what was sent to it, alone (it used to delete the new queue too, as the
/// one it had set out to delete).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deletion_whose_answer_was_lost_leaves_a_queue_made_anew_meanwhile() {
    let _one_at_a_time = SERIAL.lock().await;
    let cluster = etcd::Cluster::start(1).await;
    let clock = rockq::ManualClock::new();
    let a = connect_with(&cluster, "anew", &clock).await;
    a.queue("q").await.expect("queue").send("old").await.expect("send");
    let made =
        once_elsewhere("rockq-etcd-queue-delete-landed", cluster.endpoints(), "anew", |b| async move {
            b.queue("q").await.expect("the name made anew").send("new").await.expect("send");
        });
    fail::cfg("rockq-etcd-queue-delete-answer", "1*return").expect("failpoint");
    let deleted = a.delete_queue("q").await;
    fail::remove("rockq-etcd-queue-delete-answer");
    fail::remove("rockq-etcd-queue-delete-landed");
    assert!(made.load(std::sync::atomic::Ordering::SeqCst), "the other process made the queue");
    assert!(deleted.expect("the deletion is settled, not failed"), "its queue was deleted");
    let c = connect_with(&cluster, "anew", &clock).await;
    let got: Vec<_> = c
        .peek("q", None, 10)
        .await
        .expect("the new queue is there")
        .into_iter()
        .map(|m| String::from_utf8(m.payload.to_vec()).expect("utf8"))
        .collect();
    assert_eq!(got, ["new"], "the new queue and its message are kept");
    a.shutdown().await.expect("shutdown");
    c.shutdown().await.expect("shutdown");
}

/// A purge whose trim landed but whose answer was lost: the second try finds its own trim in
/// place, and the call reports every message it deleted (it reported 0: the retry's compare
/// failed on the first try's write, and the purge started over on an empty queue).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_purge_whose_trim_answer_was_lost_counts_what_it_deleted() {
    let _one_at_a_time = SERIAL.lock().await;
    let cluster = etcd::Cluster::start(1).await;
    let broker =
        Broker::connect_etcd(cluster.endpoints(), "purge-doubt", EtcdOptions::new()).await.expect("connect");
    let q = broker.queue("q").await.expect("queue");
    q.send_batch((0..100).map(|i| rockq::Message::new(format!("m{i}")))).await.expect("send");
    fail::cfg("rockq-etcd-trim-answer", "1*return").expect("failpoint");
    let purged = broker.purge_queue("q").await;
    fail::remove("rockq-etcd-trim-answer");
    assert_eq!(purged.expect("the lost answer is settled, not failed"), 100);
    let stats = broker.stats().await.expect("stats");
    assert_eq!((stats.queues[0].first_seq, stats.queues[0].len), (101, 0), "trimmed once, through the tail");
    assert_eq!(q.send("after").await.expect("send"), 101);
    broker.shutdown().await.expect("shutdown");
}

/// A large send call one of whose requests or answers was lost (`point`): settled, stored
/// once, at the sequences it was given, in order.
async fn large_call_losing(point: &str) {
    let _one_at_a_time = SERIAL.lock().await;
    let cluster = etcd::Cluster::start(1).await;
    let broker =
        Broker::connect_etcd(cluster.endpoints(), "large-doubt", EtcdOptions::new()).await.expect("connect");
    let q = broker.queue("q").await.expect("queue");
    q.send("before").await.expect("send");
    fail::cfg(point, "1*return").expect("failpoint");
    let first =
        q.send_batch((0..300).map(|i| etcd::reserved_sized(rockq::Message::new(format!("m{i}")), 300))).await;
    fail::remove(point);
    assert_eq!(first.expect("the lost request is settled, not failed"), 2..=301);
    assert_eq!(q.send("after").await.expect("send"), 302);
    // Reserved (a key per message), so the failpoint was on its path.
    let mut client = cluster.client().await;
    assert_eq!(etcd::keys_under(&mut client, "large-doubt/m/").await, 302, "the call was reserved");
    let stats = broker.stats().await.expect("stats");
    assert_eq!((stats.queues[0].last_seq, stats.queues[0].len), (302, 302), "stored once");
    let mut sub = q.group("g").expect("group").subscribe().await.expect("subscribe");
    for seq in 1..=302u64 {
        let d = tokio::time::timeout(common::HANG_GUARD, sub.next())
            .await
            .expect("delivery")
            .expect("open")
            .expect("ok");
        let want = match seq {
            1 => "before".to_owned(),
            302 => "after".to_owned(),
            s => format!("m{}", s - 2),
        };
        assert_eq!((d.seq(), d.payload().as_ref()), (seq, want.as_bytes()));
        d.ack().expect("ack");
    }
    drop(sub);
    broker.shutdown().await.expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_call_whose_commit_answer_was_lost_is_found_and_stored_once() {
    large_call_losing("rockq-etcd-reserved-commit-answer").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_call_whose_reservation_answer_was_lost_finds_it_held() {
    large_call_losing("rockq-etcd-reserve-answer").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_call_whose_write_under_the_reservation_was_lost_writes_it_again() {
    large_call_losing("rockq-etcd-reserved-write").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_call_whose_lease_grant_failed_is_granted_one_again() {
    large_call_losing("rockq-etcd-reserve-grant").await;
}

/// A process that dies holding a reservation (its writes done, never committed): the other
/// brokers' appends wait until its lease runs out, then take the same sequences; what the dead
/// call wrote above the tail is never read, and is overwritten by the appends that reach it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reservation_left_by_a_dead_process_holds_the_queue_until_its_lease_runs_out_and_shows_nothing() {
    let _one_at_a_time = SERIAL.lock().await;
    let cluster = etcd::Cluster::start(1).await;
    // a's call writes everything but its commit, then gives up and leaves its reservation.
    let (a, b, qb) = dead_reservation(&cluster, "large-dead").await;

    // b's append is refused while the reservation stands (5 s from a's call, at least 4 s from
    // now) and tried again until it ran out: more than one request. Then it appends after the
    // old tail: sequence 1.
    let tries = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = tries.clone();
    fail::cfg_callback("rockq-etcd-append-request", move || {
        counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    })
    .expect("failpoint");
    let seq = qb.send("b0").await.expect("send once the reservation ran out");
    fail::remove("rockq-etcd-append-request");
    assert_eq!(seq, 1);
    assert!(tries.load(std::sync::atomic::Ordering::SeqCst) > 1, "b's append waited for the reservation");
    for i in 1..150 {
        // The answer of the append of 127, the first key the dead call wrote, is lost: it is
        // found by the revision that put it there (not the one that created the key).
        if i == 126 {
            fail::cfg("rockq-etcd-append-answer", "1*return").expect("failpoint");
        }
        assert_eq!(qb.send(format!("b{i}")).await.expect("send"), i + 1);
        fail::remove("rockq-etcd-append-answer");
    }
    let stats = b.stats().await.expect("stats");
    assert_eq!((stats.queues[0].last_seq, stats.queues[0].len), (150, 150));
    let mut sub = qb.group("g").expect("group").subscribe().await.expect("subscribe");
    reads_only_bs(&qb, &mut sub, 150).await;
    drop(sub);
    a.shutdown().await.expect("shutdown");
    b.shutdown().await.expect("shutdown");
}

/// A process (`a`) that dies holding a reservation of 400 messages on `q` (its writes done,
/// never committed), and another (`b`, returned with its queue) on the namespace.
async fn dead_reservation(cluster: &etcd::Cluster, ns: &str) -> (Broker, Broker, rockq::Queue) {
    let opts = EtcdOptions::new().request_timeout(std::time::Duration::from_secs(1));
    let a = Broker::connect_etcd(cluster.endpoints(), ns, opts).await.expect("connect");
    let b = Broker::connect_etcd(cluster.endpoints(), ns, EtcdOptions::new()).await.expect("connect");
    let qa = a.queue("q").await.expect("queue");
    let qb = b.queue("q").await.expect("queue");
    fail::cfg("rockq-etcd-reserved-commit-request", "return").expect("failpoint");
    fail::cfg("rockq-etcd-reserved-abandon", "return").expect("failpoint");
    let failed = qa
        .send_batch((0..400).map(|i| etcd::reserved_sized(rockq::Message::new(format!("dead{i}")), 400)))
        .await;
    fail::remove("rockq-etcd-reserved-commit-request");
    fail::remove("rockq-etcd-reserved-abandon");
    assert!(matches!(failed, Err(rockq::Error::Storage(_))), "{failed:?}");
    (a, b, qb)
}

/// `sub` delivers `b0 ..` at sequences `1..=n`, and then — nothing the dead call left above the
/// tail being read — the next message sent, `b<n>`, at `n + 1`.
async fn reads_only_bs(qb: &rockq::Queue, sub: &mut rockq::Subscription, n: u64) {
    let mut next = async || {
        tokio::time::timeout(common::HANG_GUARD, sub.next())
            .await
            .expect("delivery")
            .expect("open")
            .expect("ok")
    };
    for i in 0..n {
        let d = next().await;
        assert_eq!((d.seq(), d.payload().as_ref()), (i + 1, format!("b{i}").as_bytes()));
        d.ack().expect("ack");
    }
    assert_eq!(qb.send(format!("b{n}")).await.expect("send"), n + 1);
    let d = next().await;
    assert_eq!((d.seq(), d.payload().as_ref()), (n + 1, format!("b{n}").as_bytes()));
}

/// A packed append over the sequences a dead large call wrote under its reservation: the run
/// is one key under its last sequence, so the dead call's keys below it would be read beside
/// it; the append deletes them, and readers see only its messages.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_packed_append_over_a_dead_reservations_writes_hides_them() {
    let _one_at_a_time = SERIAL.lock().await;
    let cluster = etcd::Cluster::start(1).await;
    let (a, b, qb) = dead_reservation(&cluster, "large-dead-run").await;
    // Once the reservation ran out: two appends of 100, packed, at sequences 1..=200. The dead
    // call wrote its messages past its first transaction's share (which goes with the commit):
    // the second run lies over them.
    let seqs = qb.send_batch((0..100).map(|i| rockq::Message::new(format!("b{i}")))).await.expect("send");
    assert_eq!(seqs, 1..=100);
    let seqs = qb.send_batch((100..200).map(|i| rockq::Message::new(format!("b{i}")))).await.expect("send");
    assert_eq!(seqs, 101..=200);
    let mut sub = qb.group("g").expect("group").read_batch(16).subscribe().await.expect("subscribe");
    reads_only_bs(&qb, &mut sub, 200).await;
    drop(sub);
    a.shutdown().await.expect("shutdown");
    b.shutdown().await.expect("shutdown");
}

/// Another process's appends wait while a large call holds the queue, and never land inside
/// it: held at the call's first write under its reservation, `b` sends three batches; they
/// are appended after the call, each message where its receipt says.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn appends_elsewhere_wait_for_a_large_call_and_never_land_inside_it() {
    use std::sync::{Arc, Condvar, Mutex};
    type Landed = Arc<(Mutex<Option<Vec<(u64, String)>>>, Condvar)>;
    let _one_at_a_time = SERIAL.lock().await;
    let cluster = etcd::Cluster::start(1).await;
    let a =
        Broker::connect_etcd(cluster.endpoints(), "large-race", EtcdOptions::new()).await.expect("connect");
    let qa = a.queue("q").await.expect("queue");
    let landed: Landed = Arc::new((Mutex::new(None), Condvar::new()));
    // b's append requests: a second one means the first was answered (refused, as it must be,
    // or stored inside the reservation, which the assertions below catch).
    let tries = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let (counted, woken) = (tries.clone(), landed.clone());
    fail::cfg_callback("rockq-etcd-append-request", move || {
        counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let _guard = woken.0.lock().expect("lock");
        woken.1.notify_all();
    })
    .expect("failpoint");
    let (endpoints, seen, fired) =
        (cluster.endpoints(), landed.clone(), Arc::new(std::sync::atomic::AtomicBool::new(false)));
    fail::cfg_callback("rockq-etcd-reserved-write", move || {
        if fired.swap(true, std::sync::atomic::Ordering::SeqCst) {
            return;
        }
        let (endpoints, out) = (endpoints.clone(), seen.clone());
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
            let got = rt.block_on(async move {
                let b =
                    Broker::connect_etcd(endpoints, "large-race", EtcdOptions::new()).await.expect("connect");
                let q = b.queue("q").await.expect("queue");
                let mut got = Vec::new();
                for k in 0..3 {
                    let payloads: Vec<String> = (0..100).map(|i| format!("b{k}-{i}")).collect();
                    let seqs = q
                        .send_batch(payloads.iter().map(|p| rockq::Message::new(p.clone())))
                        .await
                        .expect("send");
                    got.extend(seqs.zip(payloads));
                }
                b.shutdown().await.expect("shutdown");
                got
            });
            *out.0.lock().expect("lock") = Some(got);
            out.1.notify_all();
        });
        // Hold the call here until b's first append was answered (or all of b's landed).
        let guard = seen.0.lock().expect("lock");
        let tried = || tries.load(std::sync::atomic::Ordering::SeqCst) >= 2;
        drop(seen.1.wait_timeout_while(guard, common::HANG_GUARD, |g| g.is_none() && !tried()));
    })
    .expect("failpoint");
    let ours = qa
        .send_batch((0..400).map(|i| etcd::reserved_sized(rockq::Message::new(format!("a{i}")), 400)))
        .await
        .expect("send");
    fail::remove("rockq-etcd-reserved-write");
    fail::remove("rockq-etcd-append-request");
    let b_sent = tokio::task::spawn_blocking(move || {
        let guard = landed.0.lock().expect("lock");
        let (mut g, _) =
            landed.1.wait_timeout_while(guard, common::HANG_GUARD, |g| g.is_none()).expect("wait");
        g.take().expect("b's sends finished")
    })
    .await
    .expect("task");
    assert_eq!(ours, 1..=400, "the call holds the sequences it reserved");
    let mut expected: std::collections::BTreeMap<u64, String> =
        (1..=400).map(|s| (s, format!("a{}", s - 1))).collect();
    for (seq, p) in b_sent {
        assert!(expected.insert(seq, p).is_none(), "sequence {seq} given twice");
    }
    assert_eq!(expected.keys().copied().collect::<Vec<_>>(), (1..=700).collect::<Vec<_>>(), "dense");
    let mut sub = qa.group("g").expect("group").subscribe().await.expect("subscribe");
    for (seq, payload) in &expected {
        let d = tokio::time::timeout(common::HANG_GUARD, sub.next())
            .await
            .expect("delivery")
            .expect("open")
            .expect("ok");
        assert_eq!((d.seq(), d.payload().as_ref()), (*seq, payload.as_bytes()));
        d.ack().expect("ack");
    }
    drop(sub);
    a.shutdown().await.expect("shutdown");
}

/// A submit of a keyed delayed message with `point` failing once: it is scheduled once (the
/// call's marker tells a lost answer from a lost request), its key names it, and it fires once.
async fn delayed_submit_losing(point: &str) {
    let _one_at_a_time = SERIAL.lock().await;
    let cluster = etcd::Cluster::start(1).await;
    let clock = rockq::ManualClock::new();
    let broker = connect_with(&cluster, "delay-doubt", &clock).await;
    let q = broker.queue("q").await.expect("queue");
    let later =
        || rockq::Message::new("later").idempotency_key("k").deliver_after(std::time::Duration::from_secs(5));
    fail::cfg(point, "1*return").expect("failpoint");
    let sent = q.submit(later()).await;
    fail::remove(point);
    let id = match sent.expect("the lost submit is settled, not failed") {
        rockq::Sent::Scheduled(s) => s.id,
        other => panic!("expected it scheduled (not a duplicate of itself), got {other:?}"),
    };
    assert_eq!(
        q.submit(later()).await.expect("again"),
        rockq::Sent::Duplicate(rockq::Original::Scheduled(id))
    );
    let listed = q.delayed(10).await.expect("list");
    assert_eq!(listed.iter().map(|d| d.id).collect::<Vec<_>>(), [id], "scheduled once");
    let mut sub = q.group("g").expect("group").subscribe().await.expect("subscribe");
    clock.advance(std::time::Duration::from_secs(10));
    let d = tokio::time::timeout(common::HANG_GUARD, sub.next())
        .await
        .expect("delivery")
        .expect("open")
        .expect("ok");
    assert_eq!((d.seq(), d.payload().as_ref()), (1, &b"later"[..]));
    d.ack().expect("ack");
    common::assert_next_is_sentinel(&q, &mut sub).await;
    drop(sub);
    broker.shutdown().await.expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delayed_submit_whose_answer_was_lost_is_found_by_its_marker() {
    delayed_submit_losing("rockq-etcd-delay-answer").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delayed_submit_lost_before_it_was_applied_is_sent_again() {
    delayed_submit_losing("rockq-etcd-delay-request").await;
}

/// A firing whose append loses its answer (or its request) is settled through the tail's
/// nonce: the message is appended once.
async fn firing_losing(point: &str) {
    let _one_at_a_time = SERIAL.lock().await;
    let cluster = etcd::Cluster::start(1).await;
    let clock = rockq::ManualClock::new();
    let broker = connect_with(&cluster, "fire-doubt", &clock).await;
    let q = broker.queue("q").await.expect("queue");
    let msgs =
        ["a", "b", "c"].map(|p| rockq::Message::new(p).deliver_after(std::time::Duration::from_secs(5)));
    q.submit_batch(msgs).await.expect("submit");
    let mut sub = q.group("g").expect("group").subscribe().await.expect("subscribe");
    fail::cfg(point, "1*return").expect("failpoint");
    clock.advance(std::time::Duration::from_secs(10));
    for (seq, payload) in [(1, "a"), (2, "b"), (3, "c")] {
        let d = tokio::time::timeout(common::HANG_GUARD, sub.next())
            .await
            .expect("delivery")
            .expect("open")
            .expect("ok");
        assert_eq!((d.seq(), d.payload().as_ref()), (seq, payload.as_bytes()));
        d.ack().expect("ack");
    }
    fail::remove(point);
    common::assert_next_is_sentinel(&q, &mut sub).await;
    assert!(q.delayed(10).await.expect("list").is_empty());
    drop(sub);
    broker.shutdown().await.expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_firing_whose_answer_was_lost_appends_once() {
    firing_losing("rockq-etcd-append-answer").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_firing_lost_before_it_was_applied_is_sent_again() {
    firing_losing("rockq-etcd-append-request").await;
}

/// A recurring schedule's firing whose answer is lost (the process that fired it cannot tell
/// whether it landed) is settled through the tail's nonce: the occurrence is one message, and
/// the schedule goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_schedule_firing_whose_answer_was_lost_fires_once() {
    let _one_at_a_time = SERIAL.lock().await;
    let cluster = etcd::Cluster::start(1).await;
    let clock = rockq::ManualClock::new();
    let broker = connect_with(&cluster, "schedule-doubt", &clock).await;
    broker.schedule("tick", std::time::Duration::from_secs(10), "q", "t").await.expect("schedule");
    let q = broker.queue("q").await.expect("queue");
    let mut sub = q.group("g").expect("group").subscribe().await.expect("subscribe");
    fail::cfg("rockq-etcd-append-answer", "1*return").expect("failpoint");
    for seq in 1..=2 {
        clock.advance(std::time::Duration::from_secs(10));
        let d = tokio::time::timeout(common::HANG_GUARD, sub.next())
            .await
            .expect("delivery")
            .expect("open")
            .expect("ok");
        assert_eq!((d.seq(), d.payload().as_ref()), (seq, &b"t"[..]));
        d.ack().expect("ack");
    }
    fail::remove("rockq-etcd-append-answer");
    common::assert_next_is_sentinel(&q, &mut sub).await;
    assert_eq!(broker.schedules().await.expect("list")[0].fired, 2);
    drop(sub);
    broker.shutdown().await.expect("shutdown");
}

/// A cancel whose transaction landed and whose answer was lost: sent again, it is refused (the
/// record it compared is gone) and reads the message absent. Its marker tells its own cancel
/// from a firing's: it answers `true`, as embedded (it answered `false`, "not scheduled"). The
/// message is gone and never fires; a cancel of an id that is not scheduled still answers
/// `false`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_whose_answer_was_lost_reports_the_message_cancelled() {
    let _one_at_a_time = SERIAL.lock().await;
    let cluster = etcd::Cluster::start(1).await;
    let clock = rockq::ManualClock::new();
    let broker = connect_with(&cluster, "cancel-doubt", &clock).await;
    let q = broker.queue("q").await.expect("queue");
    let later = |p: &'static str| rockq::Message::new(p).deliver_after(std::time::Duration::from_secs(5));
    let id = match q.submit(later("cancelled")).await.expect("submit") {
        rockq::Sent::Scheduled(s) => s.id,
        other => panic!("expected it scheduled, got {other:?}"),
    };
    q.submit(later("kept")).await.expect("submit");
    fail::cfg("rockq-etcd-cancel-answer", "1*return").expect("failpoint");
    let cancelled = q.cancel(id).await;
    fail::remove("rockq-etcd-cancel-answer");
    assert!(cancelled.expect("the lost answer is settled, not failed"), "its own cancel is reported");
    assert!(!q.cancel(id).await.expect("cancel again"), "a cancel of what is not scheduled is false");
    assert_eq!(q.delayed(10).await.expect("list").len(), 1, "only the other message is left");
    fires_only(&q, &clock, "kept").await;
    broker.shutdown().await.expect("shutdown");
}

/// With the clock 10 s on, `q` gets `payload` at sequence 1 and nothing else.
async fn fires_only(q: &rockq::Queue, clock: &rockq::ManualClock, payload: &str) {
    let mut sub = q.group("g").expect("group").subscribe().await.expect("subscribe");
    clock.advance(std::time::Duration::from_secs(10));
    let d = common::next(&mut sub).await;
    assert_eq!((d.seq(), d.payload().as_ref()), (1, payload.as_bytes()), "only {payload} fires");
    d.ack().expect("ack");
    common::assert_next_is_sentinel(q, &mut sub).await;
}

/// A schedule's deletion whose answer was lost: found by its marker, reported `true` (it was
/// `false`, "no such schedule"); the schedule is gone and fires no more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_schedule_deletion_whose_answer_was_lost_reports_it_deleted() {
    let _one_at_a_time = SERIAL.lock().await;
    let cluster = etcd::Cluster::start(1).await;
    let clock = rockq::ManualClock::new();
    let broker = connect_with(&cluster, "unschedule-doubt", &clock).await;
    broker.schedule("tick", std::time::Duration::from_secs(10), "q", "t").await.expect("schedule");
    broker.schedule("tock", std::time::Duration::from_secs(10), "q", "u").await.expect("schedule");
    fail::cfg("rockq-etcd-schedule-answer", "1*return").expect("failpoint");
    let deleted = broker.delete_schedule("tick").await;
    fail::remove("rockq-etcd-schedule-answer");
    assert!(deleted.expect("the lost answer is settled, not failed"), "its own deletion is reported");
    assert!(!broker.delete_schedule("tick").await.expect("delete again"), "gone: false");
    let names: Vec<_> = broker.schedules().await.expect("list").into_iter().map(|s| s.name).collect();
    assert_eq!(names, ["tock"]);
    fires_only(&broker.queue("q").await.expect("queue"), &clock, "u").await;
    broker.shutdown().await.expect("shutdown");
}

/// A group deletion whose answer was lost: sent again, it finds nothing, and its first try's
/// marker answers `true` (it answered `false`, "no such group", for the group it deleted) —
/// for a group with its offset record, and for one with only its settings record (the
/// transaction's other branch). A deletion of what is not there still answers `false`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_deletion_whose_answer_was_lost_reports_it_deleted() {
    let _one_at_a_time = SERIAL.lock().await;
    let cluster = etcd::Cluster::start(1).await;
    let broker = Broker::connect_etcd(cluster.endpoints(), "ungroup-doubt", EtcdOptions::new())
        .await
        .expect("connect");
    let q = broker.queue("q").await.expect("queue");
    for g in ["w", "v"] {
        drop(q.work_group(g).expect("group").subscribe().await.expect("subscribe"));
    }
    // "v" keeps only its settings record.
    let client = cluster.client().await;
    client.clone().delete(b"ungroup-doubt/o/consumer:v:q".to_vec(), None).await.expect("raw delete");
    let settings = b"ungroup-doubt/g/group:v:q".to_vec();
    assert_eq!(client.clone().get(settings.clone(), None).await.expect("get").count(), 1);
    for g in ["w", "v"] {
        fail::cfg("rockq-etcd-group-delete-answer", "1*return").expect("failpoint");
        let deleted = broker.delete_group("q", g).await;
        fail::remove("rockq-etcd-group-delete-answer");
        assert!(
            deleted.expect("the lost answer is settled, not failed"),
            "{g}: its own deletion is reported"
        );
        assert!(!broker.delete_group("q", g).await.expect("delete again"), "{g}: gone: false");
    }
    assert_eq!(client.clone().get(settings, None).await.expect("get").count(), 0, "v's settings deleted");
    let groups = broker.stats().await.expect("stats").groups;
    assert!(groups.is_empty(), "no group left: {groups:?}");
    broker.shutdown().await.expect("shutdown");
}

/// A group deleted and made anew by the same process before its watch brought the deletion:
/// the deletion's late event is of the earlier group and leaves the new one alone (its
/// subscription goes on). Without the revision each group was read at, the event would end the
/// new subscription with `GroupDeleted`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_deletion_event_leaves_the_group_made_anew_alone() {
    let _one_at_a_time = SERIAL.lock().await;
    let cluster = etcd::Cluster::start(1).await;
    let a =
        Broker::connect_etcd(cluster.endpoints(), "late-delete", EtcdOptions::new()).await.expect("connect");
    let q = a.queue("q").await.expect("queue");
    q.send_batch(["m1", "m2", "m3"]).await.expect("send");
    let group = q.group("o").expect("group");
    let mut sub = group.subscribe().await.expect("subscribe");
    let first = sub.next().await.expect("a delivery").expect("ok");
    first.ack().expect("ack");
    sub.commit().await.expect("commit");
    drop(sub);

    // The deletion watch holds what it brings until released.
    let hold = Hold::at("rockq-etcd-group-deletions-apply", "rockq-etcd-group-deletions-applied");
    assert!(a.delete_group("q", "o").await.expect("delete"));
    hold.reached().await;
    let deadline = tokio::time::Instant::now() + common::HANG_GUARD;
    // Made anew while the deletion's event waits: from the start, its old offset gone.
    let mut again = loop {
        match group.subscribe().await {
            Ok(s) => break s,
            Err(rockq::Error::Active { .. }) if tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(std::time::Duration::from_millis(20)).await
            }
            Err(e) => panic!("subscribe anew: {e}"),
        }
    };
    let d = again.next().await.expect("a delivery").expect("ok");
    assert_eq!(d.seq(), 1);
    d.ack().expect("ack");
    hold.release().await;
    let d = tokio::time::timeout(common::HANG_GUARD, again.next()).await.expect("hang guard");
    assert_eq!(d.expect("the stream ended").expect("the new group was forgotten").seq(), 2);
    drop(again);
    a.shutdown().await.expect("shutdown");
}

/// A queue deleted by another process while this one's namespace watch lags: this process's
/// send through its old handle is refused by etcd (the tail is gone) and answered
/// `QueueDeleted` — not stored, not an opaque storage error — and nothing of it is written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_send_to_a_queue_deleted_elsewhere_before_the_watch_says_so_is_answered_deleted() {
    let _one_at_a_time = SERIAL.lock().await;
    let cluster = etcd::Cluster::start(1).await;
    let a =
        Broker::connect_etcd(cluster.endpoints(), "late-queue", EtcdOptions::new()).await.expect("connect");
    let b =
        Broker::connect_etcd(cluster.endpoints(), "late-queue", EtcdOptions::new()).await.expect("connect");
    a.queue("q").await.expect("queue").send("m1").await.expect("send");
    let qb = b.queue("q").await.expect("queue");
    assert_eq!(qb.send("m2").await.expect("send"), 2);
    // Every namespace watch is held from here (both brokers': failpoints are process-wide).
    let hold = Hold::at("rockq-etcd-namespace-apply", "rockq-etcd-namespace-applied");
    assert!(a.delete_queue("q").await.expect("delete"));
    let e = qb.send("late").await.expect_err("a send to a deleted queue");
    assert!(matches!(e, rockq::Error::QueueDeleted { .. }), "{e}");
    assert!(b.get_queue("q").is_none(), "forgotten once etcd refused the append");
    let mut client = cluster.client().await;
    let count = etcd_client::GetOptions::new().with_prefix().with_count_only();
    assert_eq!(client.get("late-queue/m/", Some(count)).await.expect("count").count(), 0, "nothing written");
    hold.reached().await;
    hold.release().await;
    // The name makes a new queue, here too.
    assert_eq!(b.queue("q").await.expect("queue").send("new").await.expect("send"), 1);
    a.shutdown().await.expect("shutdown");
    b.shutdown().await.expect("shutdown");
}

/// A transaction (a keyspace write under a condition, a job's ack, sends: plain, keyed and
/// delayed) whose answer is lost (or its request) is settled by its marker: applied once,
/// reported applied — never a conflict with its own write, never a lost lease of its own ack,
/// never sent twice, never a duplicate of its own keyed send.
async fn transaction_losing(point: &str) {
    let _one_at_a_time = SERIAL.lock().await;
    let cluster = etcd::Cluster::start(1).await;
    let clock = rockq::ManualClock::new();
    let broker = connect_with(&cluster, "kv-doubt", &clock).await;
    let kv = broker.kv("counters").await.expect("keyspace");
    let r0 = kv.put("hits", "0").await.expect("put");
    let (jobs, out) = (broker.queue("jobs").await.expect("queue"), broker.queue("out").await.expect("queue"));
    jobs.send_batch(["j1", "j2"]).await.expect("send");
    let mut js = jobs.work_group("w").expect("group").subscribe().await.expect("subscribe");
    let job = next_job(&mut js).await;
    assert_eq!(job.seq(), 1);
    fail::cfg(point, "1*return").expect("failpoint");
    let mut tx = broker.transaction();
    tx.put_if(&kv, "hits", "1", rockq::Expect::Revision(r0)).expect("put_if");
    tx.put(&kv, "new", "x").expect("put");
    tx.send(&out, "result of j1").expect("send");
    tx.send(&out, rockq::Message::new("keyed").idempotency_key("k1")).expect("send");
    tx.send(&out, rockq::Message::new("later").deliver_after(std::time::Duration::from_secs(60)))
        .expect("send");
    tx.ack_job(job);
    let done = tx.commit().await;
    fail::remove(point);
    let done = done.expect("applied once, its lost answer settled");
    let revision = done.revision().expect("a revision");
    assert!(
        matches!(
            done.sent(),
            [rockq::Sent::Appended(1), rockq::Sent::Appended(2), rockq::Sent::Scheduled(_)]
        ),
        "{:?}",
        done.sent()
    );
    assert_eq!(broker.delayed(Some("out"), 10).await.expect("delayed").len(), 1, "delayed once");
    let again = out.submit(rockq::Message::new("keyed again").idempotency_key("k1")).await.expect("submit");
    assert_eq!(again, rockq::Sent::Duplicate(rockq::Original::Appended(2)), "the key recorded once");
    let hits = kv.get("hits").await.expect("get").expect("there");
    assert_eq!((hits.value.as_ref(), hits.revision), (&b"1"[..], revision));
    assert_eq!(kv.get("new").await.expect("get").expect("there").revision, revision);
    // Counted once: the lost answer's count is read again from etcd.
    assert_eq!(kv.len(), 2);
    // Sent once; the job acked once: the next one is job 2, and nothing comes back.
    assert_eq!(out.send("next").await.expect("send"), 3);
    assert_eq!(next_job(&mut js).await.seq(), 2);
    let status = broker.job("jobs", "w", 1).await.expect("job");
    assert_eq!(status.state, rockq::JobState::Finished, "{status:?}");
    drop(js);
    broker.shutdown().await.expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transaction_whose_answer_was_lost_is_found_by_its_marker() {
    transaction_losing("rockq-etcd-txn-answer").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transaction_lost_before_it_was_applied_is_sent_again() {
    transaction_losing("rockq-etcd-txn-request").await;
}

/// A transaction's ack is fenced by etcd's compare on the claim's revision, not by what the
/// watch told this process: with `a`'s claim watch held back, `a` (whose clock lags) still
/// holds its job when `b` claims it after the stored deadline; `a`'s transaction — a keyspace
/// write, a send and the ack — reaches etcd, is refused whole (`LeaseLost`) and changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transaction_of_an_old_holder_is_refused_whole_by_etcd_while_its_watch_lags() {
    let _one_at_a_time = SERIAL.lock().await;
    let cluster = etcd::Cluster::start(1).await;
    let (clock_a, clock_b) = (rockq::ManualClock::new(), rockq::ManualClock::new());
    let a = connect_with(&cluster, "tx-lag", &clock_a).await;
    let qa = a.queue("q").await.expect("queue");
    qa.send("one").await.expect("send");
    let (kv, out) = (a.kv("state").await.expect("keyspace"), a.queue("out").await.expect("queue"));
    let lease = std::time::Duration::from_secs(30);
    let mut ja = qa.work_group("w").expect("group").lease(lease).subscribe().await.expect("subscribe");
    let held = next_job(&mut ja).await;
    fail::cfg("rockq-etcd-claim-watch", "return").expect("failpoint");
    let b = connect_with(&cluster, "tx-lag", &clock_b).await;
    let qb = b.queue("q").await.expect("queue");
    let mut jb = qb.work_group("w").expect("group").subscribe().await.expect("subscribe");
    clock_b.advance(lease + std::time::Duration::from_secs(5));
    let taken = next_job(&mut jb).await;
    assert_eq!((taken.seq(), taken.attempt()), (1, 2));
    let mut tx = a.transaction();
    tx.put(&kv, "one", "done by a").expect("put");
    tx.send(&out, "from a").expect("send");
    tx.ack_job(held);
    let refused = tx.commit().await;
    fail::remove("rockq-etcd-claim-watch");
    match refused {
        Err(rockq::Error::LeaseLost { seq: 1, .. }) => {}
        other => panic!("etcd must refuse the old holder's transaction, got {other:?}"),
    }
    assert_eq!(kv.get("one").await.expect("get"), None, "no keyspace write");
    assert_eq!(out.send("next").await.expect("send"), 1, "no message sent");
    assert_eq!(committed(&a.stats().await.expect("stats")), 0, "no ack");
    taken.ack_durable().await.expect("the new holder's ack");
    b.flush().await.expect("flush");
    assert_eq!(committed(&b.stats().await.expect("stats")), 1);
    drop((ja, jb));
    a.shutdown().await.expect("shutdown");
    b.shutdown().await.expect("shutdown");
}

/// A transaction refused after a try that went unanswered: the refusal is made final first
/// (its marker put, so that the unanswered try cannot land later), then answered as it is —
/// a conflict, nothing of it applied, its job released uncounted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transaction_refused_after_an_unanswered_try_is_refused_for_good() {
    let _one_at_a_time = SERIAL.lock().await;
    let cluster = etcd::Cluster::start(1).await;
    let clock = rockq::ManualClock::new();
    let broker = connect_with(&cluster, "tx-doubt-refused", &clock).await;
    let kv = broker.kv("state").await.expect("keyspace");
    kv.put("taken", "by someone").await.expect("put");
    let (jobs, out) = (broker.queue("jobs").await.expect("queue"), broker.queue("out").await.expect("queue"));
    jobs.send("j1").await.expect("send");
    let mut js = jobs.work_group("w").expect("group").subscribe().await.expect("subscribe");
    let job = next_job(&mut js).await;
    fail::cfg("rockq-etcd-txn-request", "1*return").expect("failpoint");
    let mut tx = broker.transaction();
    tx.put_if(&kv, "taken", "by me", rockq::Expect::Absent).expect("put_if");
    tx.send(&out, "from me").expect("send");
    tx.ack_job(job);
    let refused = tx.commit().await;
    fail::remove("rockq-etcd-txn-request");
    assert!(matches!(&refused, Err(e) if e.is_conflict()), "{refused:?}");
    assert_eq!(kv.get("taken").await.expect("get").expect("there").value.as_ref(), b"by someone");
    assert_eq!(out.send("next").await.expect("send"), 1, "nothing sent");
    // Released uncounted (a conflict is no failed attempt): claimed again, attempt 1.
    let again = next_job(&mut js).await;
    assert_eq!((again.seq(), again.attempt()), (1, 1));
    again.ack_durable().await.expect("ack");
    drop(js);
    broker.shutdown().await.expect("shutdown");
}

/// A claim decided on a view from before a reset is refused, and the refusal teaches the
/// reset: every claim of new leases compares the group's reset mark. Without it,
/// `a` — which finished 1–3 of key `k` and whose watch is held — would claim 4 as the next of
/// the key while `b`, after resetting the group, runs 1 again (checked: it does). With it,
/// `a`'s claim of 4 is refused, `a` starts again from the reset, finds 1 taken by `b`, and gets
/// 2 once `b` finished 1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_on_a_view_from_before_a_reset_is_refused_and_teaches_it() {
    let _one_at_a_time = SERIAL.lock().await;
    let cluster = etcd::Cluster::start(1).await;
    let clock = rockq::ManualClock::new();
    let a = connect_with(&cluster, "reset-claim", &clock).await;
    let qa = a.queue("q").await.expect("queue");
    for i in 1..=5 {
        qa.send(rockq::Message::new(i.to_string()).key("k")).await.expect("send");
    }
    let group = |q: &rockq::Queue| q.work_group("w").expect("group").ordered_by_key(true);
    let mut ja = group(&qa).subscribe().await.expect("subscribe");
    for seq in 1..=3 {
        let j = next_job(&mut ja).await;
        assert_eq!(j.seq(), seq);
        j.ack_durable().await.expect("ack");
    }
    a.flush().await.expect("flush");
    // Every claim watch held from here: `a` does not hear of the reset, nor of `b`'s claim.
    let hold = Hold::at("rockq-etcd-claim-watch-apply", "rockq-etcd-claim-watch-applied");
    let b = connect_with(&cluster, "reset-claim", &clock).await;
    let qb = b.queue("q").await.expect("queue");
    assert_eq!(group(&qb).reset_to(rockq::ResetTo::Sequence(1)).await.expect("reset"), 1);
    let mut jb = group(&qb).subscribe().await.expect("subscribe");
    let first = next_job(&mut jb).await;
    assert_eq!((first.seq(), first.attempt()), (1, 1), "replayed from the start");
    // `a` claims now: every answer to a claim write counted.
    let answers = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = answers.clone();
    fail::cfg_callback("rockq-etcd-claim-answer", move || {
        counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    })
    .expect("failpoint");
    let next_a = tokio::spawn(async move {
        let j = next_job(&mut ja).await;
        (j.seq(), j.attempt(), j, ja)
    });
    // Refused twice (4, on the view from before the reset; then 1, which `b` holds), or a job.
    let deadline = tokio::time::Instant::now() + common::HANG_GUARD;
    while answers.load(std::sync::atomic::Ordering::SeqCst) < 2 && !next_a.is_finished() {
        assert!(tokio::time::Instant::now() < deadline, "a's claims never came back");
        tokio::task::yield_now().await;
    }
    fail::remove("rockq-etcd-claim-answer");
    if next_a.is_finished() {
        hold.open();
        let (seq, attempt, _, _) = next_a.await.expect("a's claim");
        panic!("a claimed {seq} (attempt {attempt}) while b runs 1 of the same key");
    }
    // Taught by the refusals alone (its watch is still held): the reset (2 unfinished again)
    // and `b`'s lease of 1 (2 waits behind it).
    assert_eq!(a.job("q", "w", 2).await.expect("job").state, rockq::JobState::Parked);
    hold.release().await;
    first.ack_durable().await.expect("ack");
    let (seq, attempt, second, _ja) = next_a.await.expect("a's claim");
    assert_eq!((seq, attempt), (2, 1), "the next of the key, once b finished the first");
    second.ack_durable().await.expect("ack");
    drop(jb);
    a.shutdown().await.expect("shutdown");
    b.shutdown().await.expect("shutdown");
}

/// A work group of queue `queue` dead-lettering to `<queue>.dlq` after one attempt.
fn flow_group(broker: &Broker, queue: &rockq::Queue) -> rockq::WorkGroup {
    let _ = broker;
    queue
        .work_group("w")
        .expect("group")
        .retry_policy(rockq::RetryPolicy::default().max_attempts(1))
        .dead_letter_queue(format!("{}.dlq", queue.name()))
}

/// A flow submitted on `a`: "child" on `jobs`'s group `w` ([`flow_group`]), then "parent" on
/// `next`'s group `n`.
struct ChildAndParent {
    work: rockq::WorkGroup,
    next: rockq::WorkGroup,
    child: rockq::Step,
    parent: rockq::Step,
    submitted: rockq::Submitted,
}

async fn child_and_parent(a: &Broker) -> ChildAndParent {
    let jobs = a.queue("jobs").await.unwrap();
    let work = flow_group(a, &jobs);
    let next = a.queue("next").await.unwrap().work_group("n").unwrap();
    let mut flow = a.flow();
    let child = flow.job(&work, "child").unwrap();
    let parent = flow.then(&next, "parent", &[child]).unwrap();
    let submitted = flow.submit().await.unwrap();
    ChildAndParent { work, next, child, parent, submitted }
}

/// Flow changes a process wrote and stopped before applying (every application lost): a
/// child's ack, and a step's dead letter followed by its redrive. The next process to connect
/// applies them, in the order they were written: the parent is sent once, and the redriven
/// step is queued again as its new job (applied the other way round, the redrive would find
/// the step not failed yet and be lost).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flow_changes_left_by_a_stopped_process_are_applied_in_order_by_the_next() {
    let _one_at_a_time = SERIAL.lock().await;
    let cluster = etcd::Cluster::start(1).await;
    let a = Broker::connect_etcd(cluster.endpoints(), "left", EtcdOptions::new()).await.expect("connect");
    let ChildAndParent { work, next, child, parent, submitted } = child_and_parent(&a).await;
    let acked = submitted.id;
    let mut flow = a.flow();
    let x = flow.job(&work, "x").unwrap();
    let after_x = flow.then(&next, "after x", &[x]).unwrap();
    let redriven = flow.submit().await.unwrap().id;

    fail::cfg("rockq-etcd-flow-request", "return").expect("failpoint");
    let mut sub = work.subscribe().await.unwrap();
    for _ in 0..2 {
        let j = next_job(&mut sub).await;
        match j.payload().as_ref() {
            b"child" => j.ack_durable().await.expect("the ack stands; its flow waits"),
            _ => j.dead_letter_durable("bad").await.expect("dead-lettered"),
        }
    }
    let dlq = a.dead_letters("jobs.dlq").await.unwrap();
    let letter = dlq.list(10).await.unwrap().pop().expect("x's letter");
    let (_, new_seq) = dlq.redrive_one(letter.dlq_seq, None).await.expect("redriven");
    let next_q = a.queue("next").await.unwrap();
    assert_eq!(next_q.last_seq(), 0, "no flow moved: every application is lost");
    let status = a.flow_status(acked).await.unwrap();
    assert!(matches!(status.steps[child.index() as usize].state, rockq::StepState::Queued { .. }));
    drop(sub);
    a.shutdown().await.unwrap();
    fail::remove("rockq-etcd-flow-request");

    let b = Broker::connect_etcd(cluster.endpoints(), "left", EtcdOptions::new()).await.expect("connect");
    let next_q = b.queue("next").await.unwrap();
    let deadline = tokio::time::Instant::now() + common::HANG_GUARD;
    let revived = || async {
        let s = b.flow_status(redriven).await.unwrap();
        matches!(s.steps[x.index() as usize].state, rockq::StepState::Queued { .. })
    };
    while next_q.last_seq() < 1 || !revived().await {
        assert!(tokio::time::Instant::now() < deadline, "the changes were never applied");
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    let status = b.flow_status(acked).await.unwrap();
    assert!(matches!(status.steps[child.index() as usize].state, rockq::StepState::Succeeded { .. }));
    assert_eq!(status.steps[parent.index() as usize].state, rockq::StepState::Queued { seq: 1 });
    let status = b.flow_status(redriven).await.unwrap();
    assert_eq!(status.steps[x.index() as usize].state, rockq::StepState::Queued { seq: new_seq });
    assert_eq!(
        status.steps[after_x.index() as usize].state,
        rockq::StepState::Waiting { succeeded: 0, failed: 0, of: 1 },
        "its dead letter blocked it, and the redrive unblocked it"
    );
    assert_eq!(next_q.last_seq(), 1, "sent once");
    b.shutdown().await.unwrap();
}

/// A move larger than one transaction whose process stops half way: a root's ack sends its
/// 150 dependents over several transactions; the first lands (the move's continuation
/// rewritten in place of the ack's change), every later one is lost, and the process stops.
/// The next process goes on from the continuation: every dependent is sent, each once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_move_cut_short_is_finished_by_the_next_process_each_step_sent_once() {
    const FAN: usize = 150;
    let _one_at_a_time = SERIAL.lock().await;
    let cluster = etcd::Cluster::start(1).await;
    let a = Broker::connect_etcd(cluster.endpoints(), "cut", EtcdOptions::new()).await.expect("connect");
    let jobs = a.queue("jobs").await.unwrap();
    let work = flow_group(&a, &jobs);
    let fan_q = a.queue("fan").await.unwrap();
    let fan = fan_q.work_group("f").unwrap();
    let mut flow = a.flow();
    let root = flow.job(&work, "root").unwrap();
    for i in 0..FAN {
        flow.then(&fan, format!("{i}"), &[root]).unwrap();
    }
    let id = flow.submit().await.unwrap().id;
    let mut sub = work.subscribe().await.unwrap();
    let j = next_job(&mut sub).await;
    fail::cfg("rockq-etcd-flow-request", "1*off->return").expect("failpoint");
    j.ack_durable().await.expect("the ack stands; its flow moves in parts");
    let deadline = tokio::time::Instant::now() + common::HANG_GUARD;
    while fan_q.last_seq() == 0 {
        assert!(tokio::time::Instant::now() < deadline, "the first part never landed");
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    let part = fan_q.last_seq();
    assert!(part < FAN as u64, "one transaction sent {part} of {FAN}: the move was cut short");
    drop(sub);
    a.shutdown().await.unwrap();
    fail::remove("rockq-etcd-flow-request");

    let b = Broker::connect_etcd(cluster.endpoints(), "cut", EtcdOptions::new()).await.expect("connect");
    let deadline = tokio::time::Instant::now() + common::HANG_GUARD;
    loop {
        let status = b.flow_status(id).await.unwrap();
        if status
            .steps
            .iter()
            .all(|s| matches!(s.state, rockq::StepState::Queued { .. } | rockq::StepState::Succeeded { .. }))
        {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "the rest of the move was never applied");
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    let fan_q = b.queue("fan").await.unwrap();
    assert_eq!(fan_q.last_seq(), FAN as u64, "each dependent sent once");
    let mut sub = fan_q.work_group("f").unwrap().subscribe().await.unwrap();
    let mut seen = std::collections::BTreeSet::new();
    for _ in 0..FAN {
        let j = next_job(&mut sub).await;
        assert!(seen.insert(String::from_utf8_lossy(j.payload()).into_owned()), "sent twice");
        j.ack().unwrap();
    }
    drop(sub);
    b.shutdown().await.unwrap();
}

/// The first flow write of this process (a large submit's first part), held at failpoint
/// `rockq-etcd-flow-request` until released.
struct FirstFlowWrite {
    gate: std::sync::Arc<(std::sync::Mutex<bool>, std::sync::Condvar)>,
    reached: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl FirstFlowWrite {
    fn hold() -> FirstFlowWrite {
        let held = FirstFlowWrite { gate: std::sync::Arc::default(), reached: std::sync::Arc::default() };
        let (flag, gate) = (held.reached.clone(), held.gate.clone());
        fail::cfg_callback("rockq-etcd-flow-request", move || {
            if flag.swap(true, std::sync::atomic::Ordering::SeqCst) {
                return;
            }
            // Off the runtime's worker (its queued tasks, the etcd client's among them, go on
            // elsewhere); bounded, so that a failing run ends.
            tokio::task::block_in_place(|| {
                let (open, cv) = &*gate;
                let open = open.lock().unwrap();
                drop(cv.wait_timeout_while(open, 2 * common::HANG_GUARD, |open| !*open).unwrap());
            });
        })
        .expect("failpoint");
        held
    }

    /// Waits until the write is held.
    async fn reached(&self) {
        wait_for(&self.reached, "the submit's first part was never written").await;
    }

    /// Lets it go (and every later flow write pass).
    fn release(self) {
        let (open, cv) = &*self.gate;
        *open.lock().unwrap() = true;
        cv.notify_all();
        fail::remove("rockq-etcd-flow-request");
    }
}

/// A large flow's submit is written by a task of its own: while its parts are being written
/// (held here at their first write), the writer answers other requests; released, the submit
/// returns every first step, in step order, sent by the writer's mover, and the flow runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_flows_submit_leaves_the_writer_free_while_its_parts_are_written() {
    const FIRST: usize = 100;
    let _one_at_a_time = SERIAL.lock().await;
    let cluster = etcd::Cluster::start(1).await;
    let a = Broker::connect_etcd(cluster.endpoints(), "parts", EtcdOptions::new()).await.expect("connect");
    let jobs = a.queue("jobs").await.unwrap();
    let work = flow_group(&a, &jobs);
    let mut flow = a.flow();
    let firsts: Vec<_> = (0..FIRST).map(|i| flow.job(&work, format!("{i}")).unwrap()).collect();
    flow.then(&work, "parent", &firsts).unwrap();

    // The first flow write (the submit's first part) waits until released.
    let first = FirstFlowWrite::hold();
    let submit = tokio::spawn(async move { flow.submit().await });
    first.reached().await;

    let created = tokio::time::timeout(common::HANG_GUARD, a.queue("other")).await;
    first.release();
    created.expect("the writer answers while a large flow's parts are written").expect("queue");

    let submitted = tokio::time::timeout(common::HANG_GUARD, submit)
        .await
        .expect("the submit returns")
        .expect("task")
        .expect("submitted");
    let sent: Vec<(u32, u64)> = submitted.sent.iter().map(|(step, seq)| (step.index(), *seq)).collect();
    let expected: Vec<(u32, u64)> = (0..FIRST as u32).map(|i| (i, u64::from(i) + 1)).collect();
    assert_eq!(sent, expected, "every first step sent once, in step order");

    let mut sub = work.subscribe().await.unwrap();
    for i in 0..FIRST {
        let j = next_job(&mut sub).await;
        assert_eq!(j.payload().as_ref(), format!("{i}").as_bytes());
        j.ack_durable().await.unwrap();
    }
    let parent = next_job(&mut sub).await;
    assert_eq!(parent.payload().as_ref(), b"parent");
    parent.ack_durable().await.unwrap();
    drop(sub);
    a.shutdown().await.unwrap();
}

/// Flow writes held by the `rockq-etcd-flow-late-send` failpoint (the caller answered with an
/// error at once, the write sent later): counted as held and as sent, released together.
struct LateTries {
    gate: std::sync::Arc<(std::sync::Mutex<bool>, std::sync::Condvar)>,
    held: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    sent: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl LateTries {
    /// Holds every late try from now on (which writes go late: the `…-late` failpoints).
    fn hold() -> LateTries {
        use std::sync::atomic::Ordering;
        let late = LateTries {
            gate: std::sync::Arc::default(),
            held: std::sync::Arc::default(),
            sent: std::sync::Arc::default(),
        };
        let (g, h) = (late.gate.clone(), late.held.clone());
        fail::cfg_callback("rockq-etcd-flow-late-send", move || {
            h.fetch_add(1, Ordering::SeqCst);
            let (open, cv) = &*g;
            let open = open.lock().unwrap();
            drop(cv.wait_timeout_while(open, 2 * common::HANG_GUARD, |open| !*open).unwrap());
        })
        .expect("failpoint");
        let s = late.sent.clone();
        fail::cfg_callback("rockq-etcd-flow-late-sent", move || {
            s.fetch_add(1, Ordering::SeqCst);
        })
        .expect("failpoint");
        late
    }

    /// Waits until a try is held.
    async fn wait_held(&self) {
        let deadline = tokio::time::Instant::now() + common::HANG_GUARD;
        while self.held.load(std::sync::atomic::Ordering::SeqCst) == 0 {
            assert!(tokio::time::Instant::now() < deadline, "no try of the record was held");
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
    }

    /// Lets every held try go and waits until each was answered.
    async fn release(self) {
        use std::sync::atomic::Ordering;
        let (open, cv) = &*self.gate;
        *open.lock().unwrap() = true;
        cv.notify_all();
        let deadline = tokio::time::Instant::now() + common::HANG_GUARD;
        while self.sent.load(Ordering::SeqCst) < self.held.load(Ordering::SeqCst) {
            assert!(tokio::time::Instant::now() < deadline, "the late tries were never answered");
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        fail::remove("rockq-etcd-flow-late-send");
        fail::remove("rockq-etcd-flow-late-sent");
    }
}

/// A flow of 100 jobs, larger than one etcd transaction, not yet submitted: on a one-member
/// cluster, through a broker whose requests give up after a second (the late-write tests
/// below outlast it).
struct LargeFlow {
    cluster: etcd::Cluster,
    broker: Broker,
    work: rockq::WorkGroup,
    flow: rockq::Flow,
}

impl LargeFlow {
    async fn on_one_member(namespace: &str) -> LargeFlow {
        let cluster = etcd::Cluster::start(1).await;
        let options = EtcdOptions::new().request_timeout(std::time::Duration::from_secs(1));
        let broker = Broker::connect_etcd(cluster.endpoints(), namespace, options).await.expect("connect");
        let jobs = broker.queue("jobs").await.unwrap();
        let work = flow_group(&broker, &jobs);
        let mut flow = broker.flow();
        for i in 0..100 {
            flow.job(&work, format!("{i}")).unwrap();
        }
        LargeFlow { cluster, broker, work, flow }
    }
}

/// A large flow's writes delivered late — its first part's first try, and every try of its
/// record — after its submit gave up and deleted the parts, are refused by etcd (they compare
/// the submit's abandoned mark absent): no flow is left without its steps, which no read
/// could decode, though the late first part would bring step 0 back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_flows_record_delivered_after_its_submit_gave_up_does_not_land() {
    let _one_at_a_time = SERIAL.lock().await;
    let LargeFlow { cluster, broker: a, flow, .. } = LargeFlow::on_one_member("late").await;
    // The first part's first try and every try of the flow's record go out late: held until
    // the submit has given up.
    fail::cfg("rockq-etcd-flow-steps-late", "1*return").expect("failpoint");
    fail::cfg("rockq-etcd-flow-request-late", "return").expect("failpoint");
    let late = LateTries::hold();
    let refused = flow.submit().await;
    fail::remove("rockq-etcd-flow-request-late");
    fail::remove("rockq-etcd-flow-steps-late");
    assert!(refused.is_err(), "the submit gives up when its record tries get no answer: {refused:?}");
    late.wait_held().await;
    late.release().await;
    assert_eq!(a.flows(0, 10).await.unwrap(), Vec::<u64>::new(), "a late record landed without its parts");
    // The mark that turned the late tries away is kept by a lease that runs out long after
    // them: abandoned submits do not pile marks up in the namespace.
    let mut c = cluster.client().await;
    let marks =
        c.get("late/fx/", Some(etcd_client::GetOptions::new().with_prefix())).await.expect("read the marks");
    assert_eq!(marks.kvs().len(), 1, "one mark for the abandoned submit");
    let lease = marks.kvs()[0].lease();
    assert_ne!(lease, 0, "the mark is put under a lease");
    let ttl = c.lease_time_to_live(lease, None).await.expect("the mark's lease").ttl();
    assert!((60..=601).contains(&ttl), "the mark outlives the late writes by minutes, not for ever: {ttl} s");
    a.shutdown().await.unwrap();
}

/// A shutdown drains the worker pools before it stops the writer; a large flow's submit in
/// flight meanwhile still has its first steps sent — the flow mover runs until the writer
/// stops, not only until the shutdown begins — and answers with every one of them (with the
/// mover gone it waited out its request timeout and named none).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_flows_submit_during_a_shutdowns_drain_has_its_first_steps_sent() {
    use std::sync::atomic::{AtomicBool, Ordering};
    const FIRST: usize = 100;
    let _one_at_a_time = SERIAL.lock().await;
    let cluster = etcd::Cluster::start(1).await;
    let options = EtcdOptions::new().request_timeout(std::time::Duration::from_secs(10));
    let a = Broker::connect_etcd(cluster.endpoints(), "drain", options).await.expect("connect");
    let jobs = a.queue("jobs").await.unwrap();
    let work = flow_group(&a, &jobs);

    // A pool whose one job holds the shutdown's drain until released.
    let hold = a.queue("hold").await.unwrap();
    hold.send("x").await.unwrap();
    let started = std::sync::Arc::new(AtomicBool::new(false));
    let release = std::sync::Arc::new(tokio::sync::Notify::new());
    let (s, r) = (started.clone(), release.clone());
    let pool = hold.work_group("h").unwrap().workers(1).spawn(move |_task: rockq::Task| {
        let (s, r) = (s.clone(), r.clone());
        async move {
            s.store(true, Ordering::SeqCst);
            r.notified().await;
            Ok(())
        }
    });
    wait_for(&started, "the holding job never started").await;

    let mut flow = a.flow();
    let firsts: Vec<_> = (0..FIRST).map(|i| flow.job(&work, format!("{i}")).unwrap()).collect();
    flow.then(&work, "parent", &firsts).unwrap();
    // The submit's first part waits until released.
    let first = FirstFlowWrite::hold();
    let submit = tokio::spawn(async move { flow.submit().await });
    first.reached().await;

    let closer = a.clone();
    let shutdown = tokio::spawn(async move { closer.shutdown().await });
    // The shutdown has begun once a new pool is refused.
    let probe = a.queue("probe").await.unwrap().work_group("p").unwrap();
    let deadline = tokio::time::Instant::now() + common::HANG_GUARD;
    loop {
        let stop = tokio_util::sync::CancellationToken::new();
        stop.cancel();
        match probe.clone().workers(1).shutdown_on(stop).run(|_task: rockq::Task| async { Ok(()) }).await {
            Err(rockq::Error::Shutdown) => break,
            other => {
                assert!(other.is_ok(), "{other:?}");
                assert!(tokio::time::Instant::now() < deadline, "the shutdown never began");
                tokio::time::sleep(std::time::Duration::from_millis(5)).await;
            }
        }
    }
    first.release();

    let submitted = tokio::time::timeout(common::HANG_GUARD, submit)
        .await
        .expect("the submit returns")
        .expect("task")
        .expect("submitted");
    let sent: Vec<u32> = submitted.sent.iter().map(|(step, _)| step.index()).collect();
    assert_eq!(sent, (0..FIRST as u32).collect::<Vec<_>>(), "every first step sent during the drain");
    release.notify_one();
    tokio::time::timeout(common::HANG_GUARD, shutdown).await.expect("shutdown ends").expect("task").unwrap();
    drop(pool);
}

/// A large flow's submit that cannot tell whether its record landed — every try of the record
/// unanswered, and etcd gone by the time it reads back after its deadline — answers with a
/// transient error: the flow may run (here a try delivered late lands it, and it does), so the
/// error must not read as a refusal the caller would answer by submitting the flow again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_flow_submit_that_cannot_tell_whether_its_record_landed_says_so() {
    let _one_at_a_time = SERIAL.lock().await;
    let LargeFlow { cluster, broker: a, work, flow } = LargeFlow::on_one_member("doubt").await;
    // Every try of the flow's record goes out late: held until released below.
    fail::cfg("rockq-etcd-flow-request-late", "return").expect("failpoint");
    let late = LateTries::hold();
    let submit = tokio::spawn(async move { flow.submit().await });
    late.wait_held().await;
    // etcd stops answering: the submit's reads back fail until its deadline and after it.
    cluster.members[0].pause(true);
    let answered =
        tokio::time::timeout(common::HANG_GUARD, submit).await.expect("the submit answers").expect("task");
    fail::remove("rockq-etcd-flow-request-late");
    cluster.members[0].pause(false);
    match answered {
        Err(rockq::Error::Storage(e)) => {
            assert!(e.is_transient(), "a submit in doubt says so (transient), not a refusal: {e}")
        }
        other => panic!("the submit cannot know whether its flow is stored: {other:?}"),
    }
    // A try still in flight lands the flow (no mark turns it away: none was put).
    late.release().await;
    let deadline = tokio::time::Instant::now() + common::HANG_GUARD;
    let flows = loop {
        match a.flows(0, 10).await {
            Ok(f) => break f,
            Err(e) => {
                assert!(tokio::time::Instant::now() < deadline, "etcd never came back: {e}");
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            }
        }
    };
    assert_eq!(flows.len(), 1, "the flow in doubt was stored after all");
    // And it runs: its first steps are sent.
    let mut sub = work.subscribe().await.unwrap();
    let first = next_job(&mut sub).await;
    assert_eq!(first.payload().as_ref(), b"0");
    first.ack_durable().await.unwrap();
    drop(sub);
    a.shutdown().await.unwrap();
}

/// Failpoint `name` returning an error until dropped (a panic included: the next scenario
/// starts without it).
struct Failing(&'static str);

impl Failing {
    fn on(name: &'static str) -> Failing {
        fail::cfg(name, "return").expect("failpoint");
        Failing(name)
    }
}

impl Drop for Failing {
    fn drop(&mut self) {
        fail::remove(self.0);
    }
}

/// An operator's delete of a flow step's job reads the step from the job's message: if that
/// read fails, the delete fails and changes nothing (it once went ahead without the flow's
/// change, leaving the step queued and its flow unfinished for ever). Once etcd answers again,
/// the same delete fails the step and blocks the step after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_delete_that_cannot_read_the_step_fails_and_changes_nothing() {
    let _one_at_a_time = SERIAL.lock().await;
    let cluster = etcd::Cluster::start(1).await;
    let opts = EtcdOptions::new().request_timeout(std::time::Duration::from_secs(1));
    let a = Broker::connect_etcd(cluster.endpoints(), "operator-flow", opts).await.expect("connect");
    let ChildAndParent { work, child, parent, submitted, .. } = child_and_parent(&a).await;
    let [(_, seq)] = submitted.sent[..] else { panic!("one first step: {:?}", submitted.sent) };
    drop(work.subscribe().await.unwrap());

    let failing = Failing::on("rockq-etcd-message-read");
    let failed = a.delete_job("jobs", "w", seq).await;
    drop(failing);
    assert!(matches!(failed, Err(rockq::Error::Storage(_))), "{failed:?}");
    let status = a.flow_status(submitted.id).await.unwrap();
    assert_eq!(status.steps[child.index() as usize].state, rockq::StepState::Queued { seq });
    assert_eq!(committed(&a.stats().await.unwrap()), 0, "nothing finished");

    a.delete_job("jobs", "w", seq).await.expect("deleted once etcd answers");
    let status = a.flow_status(submitted.id).await.unwrap();
    assert!(
        matches!(
            status.steps[child.index() as usize].state,
            rockq::StepState::Failed { how: rockq::OutcomeKind::Deleted, .. }
        ),
        "{:?}",
        status.steps[child.index() as usize].state
    );
    assert_eq!(status.steps[parent.index() as usize].state, rockq::StepState::Blocked { failed: 1, of: 1 });
    a.shutdown().await.unwrap();
}

/// A flow's deletion whose answer was lost: sent again, it finds no flow, and its first try's
/// marker answers `true` (it answered `false`, "no such flow"); the other flow stays, and a
/// deletion of what is not there answers `false`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flow_deletion_whose_answer_was_lost_reports_it_deleted() {
    let _one_at_a_time = SERIAL.lock().await;
    let cluster = etcd::Cluster::start(1).await;
    let broker =
        Broker::connect_etcd(cluster.endpoints(), "unflow-doubt", EtcdOptions::new()).await.expect("connect");
    let q = broker.queue("jobs").await.unwrap();
    let work = flow_group(&broker, &q);
    let mut ids = Vec::new();
    for _ in 0..2 {
        let mut flow = broker.flow();
        let a = flow.job(&work, "a").unwrap();
        flow.then(&work, "b", &[a]).unwrap();
        ids.push(flow.submit().await.expect("submit").id);
    }
    fail::cfg("rockq-etcd-flow-delete-answer", "1*return").expect("failpoint");
    let deleted = broker.delete_flow(ids[0]).await;
    fail::remove("rockq-etcd-flow-delete-answer");
    assert!(deleted.expect("the lost answer is settled, not failed"), "its own deletion is reported");
    assert!(!broker.delete_flow(ids[0]).await.expect("delete again"), "gone: false");
    assert_eq!(broker.flows(0, 10).await.unwrap(), [ids[1]], "only the other flow is left");
    broker.shutdown().await.unwrap();
}

/// A flow's submit whose answer was lost is found stored (its record is there) and answered
/// with its first steps' sequences; it is not written twice.
#[tokio::test]
async fn a_flow_submit_whose_answer_was_lost_is_found_and_stored_once() {
    let _one_at_a_time = SERIAL.lock().await;
    let cluster = etcd::Cluster::start(1).await;
    let broker =
        Broker::connect_etcd(cluster.endpoints(), "lostflow", EtcdOptions::new()).await.expect("connect");
    let q = broker.queue("jobs").await.unwrap();
    let work = flow_group(&broker, &q);
    let mut flow = broker.flow();
    let a = flow.job(&work, "a").unwrap();
    let b = flow.job(&work, "b").unwrap();
    flow.then(&work, "c", &[a, b]).unwrap();
    fail::cfg("rockq-etcd-flow-answer", "1*return").expect("failpoint");
    let submitted = flow.submit().await;
    fail::remove("rockq-etcd-flow-answer");
    let submitted = submitted.expect("the lost answer is settled, not failed");
    assert_eq!(submitted.seq_of(a), Some(1));
    assert_eq!(submitted.seq_of(b), Some(2));
    assert_eq!(q.last_seq(), 2, "the first steps were appended once");
    assert_eq!(broker.flows(0, 10).await.unwrap(), vec![submitted.id], "one flow stored");
    broker.shutdown().await.unwrap();
}
