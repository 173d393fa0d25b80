//! Round building, one piece at a time, against a real database in a temp dir: what a round
//! puts in its batch and in its completions for each kind of request, without the writer
//! thread (the end-to-end behaviour is covered by the integration tests).

use std::sync::Arc;
use std::sync::atomic::Ordering;

use tokio::sync::oneshot;

use super::round::{Completions, Round, Written};
use super::{apply, commit, ordered, queue, work};
use crate::engine::Engine;
use crate::engine::registry::{OrderedGroupState, QueueState, WorkGroupState};
use crate::engine::request::{OrderedRequest, Outcome, QueueRequest, Request, WorkRequest};
use crate::error::{Closed, Error, Failure, StorageError};
use crate::message::Message;
use crate::model::{Claim, GroupMode, StartFrom};
use crate::options::Options;
use crate::store::{ReadOutcome, WriteMode};

struct Fixture {
    dir: tempfile::TempDir,
    engine: Arc<Engine>,
    store: Arc<crate::store::Store>,
    written: Written,
}

impl Fixture {
    fn new() -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let (engine, store) = without_writer(&dir.path().join("db"), Options::default());
        Fixture { dir, engine, store, written: Written { next_queue_id: 1, ..Written::default() } }
    }

    /// Builds one round with `f` and writes its batch; returns `f`'s result and the round's
    /// completions, not yet run.
    fn round<T>(&mut self, f: impl FnOnce(&mut Round<'_>) -> T) -> (T, Completions) {
        let (engine, store) = (self.engine.clone(), self.store.clone());
        let guard = store.lock();
        let batch = guard.batch(4096).expect("open store");
        let mut r = Round {
            batch,
            engine: &engine,
            written: &mut self.written,
            done: Completions::default(),
            jobs: super::round::RoundJobs::default(),
        };
        let out = f(&mut r);
        let Round { batch, done, .. } = r;
        batch.write(&WriteMode::new(false)).expect("write the round");
        (out, done)
    }

    /// Builds, writes and completes one round, as the completer would.
    fn land<T>(&mut self, f: impl FnOnce(&mut Round<'_>) -> T) -> T {
        let (out, done) = self.round(f);
        commit::complete(&self.engine, done);
        out
    }

    fn queue(&mut self, name: &str) -> Arc<QueueState> {
        self.land(|r| queue::ensure(r, name).expect("create queue"))
    }

    fn loaded(&self) -> crate::store::Loaded {
        let guard = self.store.lock();
        guard.inspect(&self.store.path).expect("open").load().expect("load")
    }

    fn payloads(&self, q: &QueueState, from: u64, to: u64) -> Vec<(u64, Vec<u8>, u64)> {
        let read = crate::store::read_range(&self.store, &q.name, q.id, from, to, 1 << 20);
        let Ok(ReadOutcome::Messages(m)) = read else { panic!("read {from}..={to} of {}", q.name) };
        m.into_iter().map(|m| (m.seq, m.payload.to_vec(), m.enqueued_at_micros)).collect()
    }
}

#[tokio::test]
async fn staged_sends_get_dense_sequences_in_staging_order_across_queues() {
    let mut fx = Fixture::new();
    let (a, b) = (fx.queue("a"), fx.queue("b"));
    let inbox = &fx.engine.inbox;
    let msg = |p: &str| Message::new(p.as_bytes().to_vec());
    inbox.push(&a, &[msg("a1"), msg("a2")]).await.unwrap();
    inbox.push(&b, &[msg("b1")]).await.unwrap();
    inbox.push(&a, &[msg("a3")]).await.unwrap();
    let staged = inbox.take();
    assert_eq!(staged.len(), 1, "one staged round");

    let (_, done) = fx.round(|r| {
        let now = r.stamp();
        staged.into_iter().for_each(|s| queue::put_staged(r, s, now));
    });
    // The first sequence of each send call, in staging order.
    assert_eq!(&*done.staged[0].1, &[1, 1, 3]);
    let touched: Vec<_> =
        done.touched.values().iter().map(|(q, last, n)| (q.name.to_string(), *last, *n)).collect();
    assert_eq!(touched, [("a".to_owned(), 3, 3), ("b".to_owned(), 1, 1)]);
    assert_eq!(done.messages, 4);
    assert_eq!((fx.written.next_seq[&a.id], fx.written.next_seq[&b.id]), (4, 2));
    let got: Vec<_> = fx.payloads(&a, 1, 3).into_iter().map(|(s, p, _)| (s, p)).collect();
    assert_eq!(got, [(1, b"a1".to_vec()), (2, b"a2".to_vec()), (3, b"a3".to_vec())]);
}

#[tokio::test]
async fn a_round_never_stamps_below_the_last_stamp() {
    let mut fx = Fixture::new();
    let q = fx.queue("q");
    // The last round was stamped an hour ahead of the clock (the wall clock stepped back since).
    let ahead = fx.engine.clock().wall_micros() + 3_600_000_000;
    fx.written.last_stamp = ahead;
    fx.engine.inbox.push(&q, &[Message::new("m")]).await.unwrap();
    let staged = fx.engine.inbox.take();
    fx.land(|r| {
        let now = r.stamp();
        assert_eq!(now, ahead);
        staged.into_iter().for_each(|s| queue::put_staged(r, s, now));
    });
    assert_eq!(fx.payloads(&q, 1, 1)[0].2, ahead, "stored with the stamp, not the clock");
}

#[tokio::test]
async fn a_queue_asked_for_twice_is_created_once_and_answered_after_its_round() {
    let mut fx = Fixture::new();
    let create = |name: &str| {
        let (reply, rx) = oneshot::channel();
        (Request::Queue(QueueRequest::Create { name: name.to_owned(), reply }), rx)
    };
    let ((r1, r2), done) = fx.round(|r| {
        let (req1, r1) = create("q");
        let (req2, r2) = create("q");
        apply(r, req1);
        apply(r, req2);
        (r1, r2)
    });
    assert_eq!(done.queues.len(), 1, "one queue record");
    assert_eq!(done.queues.values()[0].1.len(), 2, "both callers wait for it");
    // Asked again before that round completed: joins it in the next round instead of
    // creating it again.
    let (r3, done2) = fx.round(|r| {
        let (req, rx) = create("q");
        apply(r, req);
        rx
    });
    assert_eq!(done2.queues.len(), 1);
    assert!(done2.messages == 0 && fx.loaded().queues.len() == 1, "no second record");
    commit::complete(&fx.engine, done);
    commit::complete(&fx.engine, done2);
    let (q1, q2, q3) = (r1.await.unwrap().unwrap(), r2.await.unwrap().unwrap(), r3.await.unwrap().unwrap());
    assert!(Arc::ptr_eq(&q1, &q2) && Arc::ptr_eq(&q1, &q3));
    assert_eq!(fx.engine.registry.queue("q").map(|q| q.id), Some(q1.id));
}

#[tokio::test]
async fn latest_starts_after_the_sends_staged_in_the_same_round() {
    let mut fx = Fixture::new();
    let q = fx.queue("q");
    fx.engine.inbox.push(&q, &[Message::new("1"), Message::new("2")]).await.unwrap();
    let staged = fx.engine.inbox.take();
    let rx = fx.land(|r| {
        let now = r.stamp();
        staged.into_iter().for_each(|s| queue::put_staged(r, s, now));
        let (reply, rx) = oneshot::channel();
        let start = StartFrom::Latest;
        apply(
            r,
            Request::Ordered(OrderedRequest::Create { queue: q.clone(), group: "g".into(), start, reply }),
        );
        rx
    });
    let g = rx.await.unwrap().unwrap();
    assert_eq!(g.durable.load(Ordering::SeqCst), 2);
    let loaded = fx.loaded();
    assert_eq!(loaded.groups.len(), 1);
    assert_eq!((loaded.groups[0].offset.mode, loaded.groups[0].offset.committed), (GroupMode::Ordered, 2));
}

#[tokio::test]
async fn a_name_is_one_mode_even_before_its_creation_lands() {
    let mut fx = Fixture::new();
    let q = fx.queue("q");
    let ((ordered, work), _) = fx.round(|r| {
        let (reply, ordered) = oneshot::channel();
        let start = StartFrom::Earliest;
        apply(
            r,
            Request::Ordered(OrderedRequest::Create { queue: q.clone(), group: "g".into(), start, reply }),
        );
        let (reply, work) = oneshot::channel();
        apply(r, Request::Work(WorkRequest::Create { queue: q.clone(), group: "g".into(), start, reply }));
        (ordered, work)
    });
    let refused = work.await.unwrap();
    assert!(matches!(refused, Err(Error::WrongMode { existing: "ordered", .. })), "{refused:?}");
    drop(ordered);
}

async fn ordered_group(fx: &mut Fixture) -> Arc<OrderedGroupState> {
    let q = fx.queue("q");
    let rx = fx.land(|r| {
        let (reply, rx) = oneshot::channel();
        let start = StartFrom::Earliest;
        apply(
            r,
            Request::Ordered(OrderedRequest::Create { queue: q.clone(), group: "g".into(), start, reply }),
        );
        rx
    });
    rx.await.unwrap().unwrap()
}

async fn work_group(fx: &mut Fixture) -> Arc<WorkGroupState> {
    let q = fx.queue("q");
    let rx = fx.land(|r| {
        let (reply, rx) = oneshot::channel();
        let start = StartFrom::Earliest;
        apply(r, Request::Work(WorkRequest::Create { queue: q.clone(), group: "w".into(), start, reply }));
        rx
    });
    rx.await.unwrap().unwrap()
}

/// A claim of `claims` in reset epoch 0, unlimited, and where its answer comes.
fn claim(
    group: &Arc<WorkGroupState>,
    claims: Vec<(u64, Claim)>,
) -> (Request, oneshot::Receiver<Result<Vec<u64>, Error>>) {
    let (reply, rx) = oneshot::channel();
    let req =
        WorkRequest::Claim { group: group.clone(), epoch: 0, claims, bucket: None, limit_rev: None, reply };
    (Request::Work(req), rx)
}

fn ack(group: &Arc<WorkGroupState>, seq: u64) -> (Request, oneshot::Receiver<Result<(), Error>>) {
    let (reply, rx) = oneshot::channel();
    let outcome = Outcome::Ack { result: None, flow: None };
    (
        Request::Work(WorkRequest::Outcome {
            group: group.clone(),
            seq,
            attempt: 1,
            epoch: 0,
            outcome,
            taken_from: None,
            reply,
        }),
        rx,
    )
}

#[tokio::test]
async fn finishing_above_a_gap_keeps_done_claims_and_closing_it_writes_one_offset() {
    let mut fx = Fixture::new();
    let g = work_group(&mut fx).await;
    let leased =
        |seq: u64| (seq, Claim::Leased { attempt: 1, token: 7, deadline_micros: 1, holder: "w".into() });
    let claims = vec![leased(1), leased(2), leased(3), leased(4)];
    let (req_claim, claimed) = claim(&g, claims);
    fx.land(|r| apply(r, req_claim));
    claimed.await.unwrap().unwrap();

    // 2 and 3 finish while 1 is still out: the offset cannot move.
    let (_, done) = fx.round(|r| {
        apply(r, ack(&g, 2).0);
        apply(r, ack(&g, 3).0);
        work::commit_offsets(r);
    });
    assert!(done.work_offsets.is_empty() && done.work_durable.is_empty(), "no offset record");
    commit::complete(&fx.engine, done);
    let claims: Vec<_> = fx.loaded().claims.into_iter().map(|c| (c.seq, c.claim)).collect();
    assert_eq!(claims, [leased(1), (2, Claim::Done), (3, Claim::Done), leased(4)]);

    // 1 finishes, then 4: the offset moves twice in the round, over all four; their claims go
    // and one offset record is written.
    let (_, done) = fx.round(|r| {
        apply(r, ack(&g, 1).0);
        apply(r, ack(&g, 4).0);
        work::commit_offsets(r);
    });
    let durable: Vec<_> = done.work_durable.iter().map(|(_, o)| *o).collect();
    assert_eq!(durable, [4], "one record per group per round");
    commit::complete(&fx.engine, done);
    let loaded = fx.loaded();
    assert!(loaded.claims.is_empty(), "claims the offset passed are deleted: {:?}", loaded.claims);
    let offset = loaded.groups.iter().find(|l| l.group == "w").map(|l| l.offset.committed);
    assert_eq!(offset, Some(4));
    assert_eq!(g.durable.load(Ordering::SeqCst), 4);
}

/// Issue 15: a gap closing over a long finished run deletes its claims with one range
/// tombstone. The range must cover exactly the sequences the offset passed: the claim just
/// above (still held) and the `done` claim above that must survive it.
#[tokio::test]
async fn a_long_gap_closes_with_one_range_delete_of_exactly_what_the_offset_passed() {
    let mut fx = Fixture::new();
    let g = work_group(&mut fx).await;
    let leased =
        |seq: u64| (seq, Claim::Leased { attempt: 1, token: 7, deadline_micros: 1, holder: "w".into() });
    let claims = (1..=60).map(leased).collect();
    let (req_claim, claimed) = claim(&g, claims);
    fx.land(|r| apply(r, req_claim));
    claimed.await.unwrap().unwrap();

    // Everything but 1 and 50 finishes: 2..=49 and 51..=60 wait above the gap as `done`.
    let (_, done) = fx.round(|r| {
        for seq in (2..=49).chain(51..=60) {
            apply(r, ack(&g, seq).0);
        }
        work::commit_offsets(r);
    });
    commit::complete(&fx.engine, done);
    assert_eq!(fx.loaded().claims.len(), 60);

    // 1 finishes: the offset moves over 1..=49 (more than the point-delete limit).
    let (_, done) = fx.round(|r| {
        apply(r, ack(&g, 1).0);
        work::commit_offsets(r);
    });
    commit::complete(&fx.engine, done);
    let loaded = fx.loaded();
    let left: Vec<_> = loaded.claims.into_iter().map(|c| (c.seq, c.claim)).collect();
    let expected: Vec<_> = std::iter::once(leased(50)).chain((51..=60).map(|s| (s, Claim::Done))).collect();
    assert_eq!(left, expected, "only what the offset passed is deleted");
    let offset = loaded.groups.iter().find(|l| l.group == "w").map(|l| l.offset.committed);
    assert_eq!(offset, Some(49));
}

#[tokio::test]
async fn a_claim_or_outcome_from_before_a_reset_is_refused_with_lease_lost() {
    let mut fx = Fixture::new();
    let g = work_group(&mut fx).await;
    g.reset(0); // epoch 1
    let claims = vec![(1, Claim::Leased { attempt: 1, token: 1, deadline_micros: 1, holder: "w".into() })];
    let (req_claim, claimed) = claim(&g, claims);
    let (req, acked) = ack(&g, 1);
    let (_, done) = fx.round(|r| {
        apply(r, req_claim);
        apply(r, req);
    });
    assert!(matches!(claimed.await.unwrap(), Err(Error::LeaseLost { seq: 1, attempt: 1, .. })));
    assert!(matches!(acked.await.unwrap(), Err(Error::LeaseLost { seq: 1, attempt: 1, .. })));
    assert!(done.callbacks.is_empty());
    assert!(fx.loaded().claims.is_empty(), "nothing written");
}

#[tokio::test]
async fn dirty_ordered_groups_get_one_offset_record_each_per_round() {
    let mut fx = Fixture::new();
    let g = ordered_group(&mut fx).await;
    // Two acks move the offset; the group is handed to the writer once.
    assert!(g.advance(4));
    assert!(!g.advance(5));
    fx.engine.mark_dirty(g.clone());
    let (_, done) = fx.round(ordered::commit_dirty);
    let commits: Vec<_> = done.commits.iter().map(|(_, o)| *o).collect();
    assert_eq!(commits, [5]);
    assert!(!g.dirty.load(Ordering::SeqCst), "picked up");
    commit::complete(&fx.engine, done);
    assert_eq!(g.durable.load(Ordering::SeqCst), 5);
    // Nothing new: no record, no commit.
    fx.engine.mark_dirty(g.clone());
    let (_, done) = fx.round(ordered::commit_dirty);
    assert!(done.commits.is_empty());
}

#[tokio::test]
async fn refusals_answer_every_request_with_the_refusal_and_release_a_held_slot() {
    let mut fx = Fixture::new();
    let g = ordered_group(&mut fx).await;
    let q = g.queue.clone();
    let failed = Closed::Failed(Failure::Storage(StorageError::new("IO error: disk gone")));

    let (reply, create) = oneshot::channel();
    Request::Queue(QueueRequest::Create { name: "x".into(), reply }).refuse(&Closed::Shutdown);
    assert!(matches!(create.await.unwrap(), Err(Error::Shutdown)));

    let (reply, sub) = oneshot::channel();
    let start = StartFrom::Earliest;
    Request::Ordered(OrderedRequest::Create { queue: q.clone(), group: "h".into(), start, reply })
        .refuse(&failed);
    match sub.await.unwrap() {
        Err(Error::Failed(why)) => {
            assert!(
                why.storage_error().is_some_and(|e| e.message().contains("disk gone")),
                "keeps the cause: {why:?}"
            )
        }
        other => panic!("{other:?}"),
    }

    // A reset holds the group's active slot: whoever answers it releases the slot.
    g.active.store(true, Ordering::SeqCst);
    let (reply, reset) = oneshot::channel();
    Request::Ordered(OrderedRequest::Reset { group: g.clone(), offset: 0, reply }).refuse(&failed);
    assert!(matches!(reset.await.unwrap(), Err(Error::Failed(_))));
    assert!(!g.active.load(Ordering::SeqCst), "slot released");

    let (reply, flush) = oneshot::channel();
    Request::Flush { reply }.refuse(&Closed::Shutdown);
    assert!(matches!(flush.await.unwrap(), Err(Error::Shutdown)));

    let (reply, stop) = oneshot::channel();
    Request::Shutdown { reply }.refuse(&failed);
    assert!(stop.await.unwrap().is_ok(), "a stop asked of a stopping writer is done");
    drop(fx.dir);
}

/// A live subscription standing in for a real one: it only counts what the writer asks of it.
#[derive(Default)]
struct CountingSub {
    acked: std::sync::Mutex<Vec<u64>>,
    handed_back: std::sync::Mutex<Vec<u64>>,
}

impl crate::engine::registry::LiveSubscription for CountingSub {
    fn in_flight(&self) -> u64 {
        0
    }
    fn dead_letter_queue(&self) -> Arc<str> {
        "q.dlq".into()
    }
    fn ack(&self, seq: u64) {
        self.acked.lock().unwrap().push(seq);
    }
    fn redeliver(&self, msg: crate::store::RawMessage, _deliveries: u32) {
        self.handed_back.lock().unwrap().push(msg.seq);
    }
    fn hand_back(self: Arc<Self>, msg: crate::store::RawMessage, _deliveries: u32, _conflicted: bool) {
        self.handed_back.lock().unwrap().push(msg.seq);
    }
}

fn raw(seq: u64) -> crate::store::RawMessage {
    crate::store::RawMessage {
        seq,
        enqueued_at_micros: 0,
        priority: 0,
        key: None,
        idempotency_key: None,
        headers: Vec::new(),
        payload: bytes::Bytes::from_static(b"m"),
    }
}

/// Regression (review of transactions): a delivery that came back (its "came back" mark still
/// queued) and was then acked by a transaction in the same round got the "came back" mark
/// written after the transaction's `Acked` one: after a restart it was delivered again.
#[tokio::test]
async fn a_transaction_ack_is_not_overwritten_by_a_queued_comeback_of_the_same_message() {
    use crate::engine::registry::PendingRecord;
    use crate::engine::request::{TxDelivery, TxRequest};
    let mut fx = Fixture::new();
    let g = ordered_group(&mut fx).await;
    // Sequence 5 came back once (its mark queued), was handed out again, and is now acked by a
    // transaction while 3 is still out (the offset stays below both).
    {
        let mut rec = g.records();
        rec.failed.insert(5, (1, 0));
        rec.pending.push(PendingRecord::Failed { seq: 5, deliveries: 1, not_before_micros: 0 });
    }
    fx.engine.mark_dirty(g.clone());
    let sub = Arc::new(CountingSub::default());
    let (reply, rx) = oneshot::channel();
    let tx = TxRequest {
        writes: Vec::new(),
        sends: Vec::new(),
        jobs: Vec::new(),
        deliveries: vec![TxDelivery { group: g.clone(), sub: sub.clone(), msg: raw(5), deliveries: 2 }],
        reply,
    };
    fx.land(|r| {
        apply(r, Request::Tx(tx));
        ordered::commit_dirty(r);
    });
    rx.await.unwrap().unwrap();
    assert_eq!(*sub.acked.lock().unwrap(), [5]);
    let marks: Vec<_> = fx.loaded().marks.into_iter().map(|m| (m.seq, m.mark)).collect();
    assert_eq!(marks, [(5, crate::model::OrderedMark::Acked)], "the transaction's ack is what is stored");
}

/// An engine over the database at `path` with no writer thread and no background tasks: the
/// writer's round building, driven by hand.
fn without_writer(path: &std::path::Path, options: Options) -> (Arc<Engine>, Arc<crate::store::Store>) {
    let (store, loaded) = crate::store::open(path, &options).expect("open a test store");
    let timer = Arc::new(crate::engine::timer::Timer::new(loaded.first_due, loaded.next_scheduled_id));
    let (registry, _) =
        crate::engine::registry::Registry::restore(loaded, &options).expect("restore the registry");
    (Arc::new(Engine::new(registry, options, timer, 16)), Arc::new(store))
}
