//! Flows (`Broker::flow`): work-queue jobs sent after other jobs, against a real database. A
//! parent is sent in the write that finishes the last of its children (and not before, nor
//! twice, across a restart); its handler reads what they returned; a dead child blocks the
//! steps that need it to succeed while `finally` steps run; redriving it revives them; a flow
//! is deleted on request; bad flows are refused and write nothing. `scripts/etcd-semantics.sh`
//! runs it against etcd too (across processes: tests/etcd_flows.rs).

mod common;

use std::time::Duration;

use common::{next_job, tempdir};
use rockq::{Broker, Bytes, ErrorKind, FlowState, ManualClock, OutcomeKind, StepState, WorkGroup};

/// The database at `dir` (in the semantics suites on etcd, the namespace standing for it).
async fn open(dir: &std::path::Path, clock: &ManualClock) -> Broker {
    let options = rockq::Options::new()
        .clock(clock.clone())
        .retention_interval(Duration::ZERO)
        .metrics_interval(Duration::ZERO);
    common::open_options(dir, options).await
}

async fn group(broker: &Broker, queue: &str, name: &str) -> WorkGroup {
    broker
        .queue(queue)
        .await
        .unwrap()
        .work_group(name)
        .unwrap()
        .lease(Duration::from_secs(30))
        .retry_policy(rockq::RetryPolicy::default().max_attempts(1))
        .dead_letter_queue(format!("{queue}.dlq"))
        .read_batch(1)
        .max_in_flight(1)
}

fn state(status: &rockq::FlowStatus, step: rockq::Step) -> StepState {
    status.steps[step.index() as usize].state.clone()
}

/// Three children and a parent `then` all of them: the parent's queue stays empty until the
/// last child is acked — across a restart between the acks — and then holds it once; its
/// handler reads the children's results; the flow ends succeeded.
#[tokio::test]
async fn a_parent_is_sent_once_when_its_last_child_succeeds_even_across_a_restart() {
    let dir = tempdir();
    let clock = ManualClock::new();
    let broker = open(dir.path(), &clock).await;
    let resize = group(&broker, "images", "resize").await;
    let build = group(&broker, "albums", "build").await;
    let mut flow = broker.flow();
    let kids: Vec<_> = ["a", "b", "c"].iter().map(|n| flow.job(&resize, *n).unwrap()).collect();
    let parent = flow.then(&build, "album", &kids).unwrap();
    let submitted = flow.submit().await.unwrap();
    assert_eq!(submitted.sent.len(), 3, "only the children are sent at once");
    assert_eq!(submitted.seq_of(parent), None);
    let albums = broker.queue("albums").await.unwrap();
    let mut sub = resize.subscribe().await.unwrap();
    for i in 0..2 {
        let j = next_job(&mut sub).await;
        assert_eq!(j.flow_step().map(|s| (s.flow, s.step)), Some((submitted.id, i)));
        j.set_result(format!("thumb-{i}")).unwrap();
        j.ack_durable().await.unwrap();
    }
    let status = broker.flow_status(submitted.id).await.unwrap();
    assert_eq!(state(&status, parent), StepState::Waiting { succeeded: 2, failed: 0, of: 3 });
    assert_eq!(status.state, FlowState::Running);
    assert_eq!(albums.last_seq(), 0, "the parent waits for its last child");
    drop(sub);
    broker.shutdown().await.unwrap();

    // The job index is reloaded: the last child's ack still sends the parent.
    let broker = open(dir.path(), &clock).await;
    let resize = group(&broker, "images", "resize").await;
    let build = group(&broker, "albums", "build").await;
    let albums = broker.queue("albums").await.unwrap();
    assert_eq!(albums.last_seq(), 0);
    let mut sub = resize.subscribe().await.unwrap();
    let j = next_job(&mut sub).await;
    j.set_result("thumb-2").unwrap();
    j.ack_durable().await.unwrap();
    assert_eq!(albums.last_seq(), 1, "sent in the write that acked the last child");
    let mut parents = build.subscribe().await.unwrap();
    let p = next_job(&mut parents).await;
    assert_eq!(p.payload(), &Bytes::from_static(b"album"));
    let deps = p.flow_dependencies().await.unwrap();
    let results: Vec<_> = deps
        .iter()
        .map(|d| match &d.state {
            StepState::Succeeded { result, .. } => result.clone(),
            other => panic!("a child not succeeded: {other:?}"),
        })
        .collect();
    let want: Vec<_> = (0..3).map(|i| Some(Bytes::from(format!("thumb-{i}")))).collect();
    assert_eq!(results, want);
    p.ack_durable().await.unwrap();
    let status = broker.flow_status(submitted.id).await.unwrap();
    assert_eq!(status.state, FlowState::Succeeded);
    assert_eq!(albums.last_seq(), 1, "sent once");
    assert_eq!(broker.flows(0, 10).await.unwrap(), vec![submitted.id]);
    broker.shutdown().await.unwrap();
}

/// A batch with callbacks: a dead child blocks `on_success` while `on_complete` runs; the flow
/// is failed; redriving the child queues it again, its ack sends `on_success`, and
/// `on_complete` is not sent twice.
#[tokio::test]
async fn a_dead_child_blocks_then_steps_runs_finally_steps_and_a_redrive_revives_them() {
    let dir = tempdir();
    let clock = ManualClock::new();
    let broker = open(dir.path(), &clock).await;
    let work = group(&broker, "jobs", "w").await;
    let calls = group(&broker, "callbacks", "c").await;
    let mut flow = broker.flow();
    let a = flow.job(&work, "a").unwrap();
    let b = flow.job(&work, "b").unwrap();
    let ok = flow.then(&calls, "on_success", &[a, b]).unwrap();
    let done = flow.finally(&calls, "on_complete", &[a, b]).unwrap();
    let id = flow.submit().await.unwrap().id;
    let mut sub = work.subscribe().await.unwrap();
    next_job(&mut sub).await.ack_durable().await.unwrap();
    next_job(&mut sub).await.dead_letter_durable("bad input").await.unwrap();
    let status = broker.flow_status(id).await.unwrap();
    assert_eq!(state(&status, ok), StepState::Blocked { failed: 1, of: 2 });
    assert!(matches!(state(&status, b), StepState::Failed { how: OutcomeKind::DeadLettered { .. }, .. }));
    assert!(matches!(state(&status, done), StepState::Queued { .. }));
    let mut cbs = calls.subscribe().await.unwrap();
    let c = next_job(&mut cbs).await;
    assert_eq!(c.payload(), &Bytes::from_static(b"on_complete"));
    c.ack_durable().await.unwrap();
    assert_eq!(broker.flow_status(id).await.unwrap().state, FlowState::Failed);
    let callbacks = broker.queue("callbacks").await.unwrap();
    assert_eq!(callbacks.last_seq(), 1);

    let dlq = broker.dead_letters("jobs.dlq").await.unwrap();
    let letter = dlq.list(10).await.unwrap().pop().expect("the dead child");
    dlq.redrive_one(letter.dlq_seq, None).await.unwrap();
    let status = broker.flow_status(id).await.unwrap();
    assert!(matches!(state(&status, b), StepState::Queued { .. }), "{:?}", state(&status, b));
    assert_eq!(state(&status, ok), StepState::Waiting { succeeded: 1, failed: 0, of: 2 });
    assert_eq!(status.state, FlowState::Running);
    let j = next_job(&mut sub).await;
    assert_eq!(j.payload(), &Bytes::from_static(b"b"));
    j.ack_durable().await.unwrap();
    let c = next_job(&mut cbs).await;
    assert_eq!(c.payload(), &Bytes::from_static(b"on_success"));
    c.ack_durable().await.unwrap();
    assert_eq!(callbacks.last_seq(), 2, "on_complete was not sent again");
    assert_eq!(broker.flow_status(id).await.unwrap().state, FlowState::Succeeded);
    broker.shutdown().await.unwrap();
}

/// Groups "mine" and "other" on queue "jobs" (both existing before the flow), and a flow whose
/// step `a` is "mine"'s job, with a step `after` it in another queue.
async fn two_groups_one_step() -> (tempfile::TempDir, Broker, [WorkGroup; 2], [rockq::Step; 2], u64) {
    let dir = tempdir();
    let broker = open(dir.path(), &ManualClock::new()).await;
    let mine = group(&broker, "jobs", "mine").await;
    let other = group(&broker, "jobs", "other").await;
    drop(other.subscribe().await.unwrap());
    let next = group(&broker, "next", "n").await;
    let mut flow = broker.flow();
    let a = flow.job(&mine, "a").unwrap();
    let after = flow.then(&next, "after", &[a]).unwrap();
    let id = flow.submit().await.unwrap().id;
    (dir, broker, [mine, other], [a, after], id)
}

/// Another group's ack of the same message does not count for the step: only its own group.
#[tokio::test]
async fn only_the_steps_own_group_finishes_it() {
    let (_dir, broker, [mine, other], [_, after], id) = two_groups_one_step().await;
    let mut osub = other.subscribe().await.unwrap();
    next_job(&mut osub).await.ack_durable().await.unwrap();
    let status = broker.flow_status(id).await.unwrap();
    assert!(matches!(state(&status, after), StepState::Waiting { succeeded: 0, .. }));
    let mut msub = mine.subscribe().await.unwrap();
    next_job(&mut msub).await.ack_durable().await.unwrap();
    assert!(matches!(state(&broker.flow_status(id).await.unwrap(), after), StepState::Queued { .. }));
    broker.shutdown().await.unwrap();
}

/// A deleted flow is gone (`NoSuchFlow`), and its jobs finish like any other job; deleting
/// again reports false.
#[tokio::test]
async fn a_deleted_flow_is_gone_and_its_jobs_finish_alone() {
    let dir = tempdir();
    let clock = ManualClock::new();
    let broker = open(dir.path(), &clock).await;
    let work = group(&broker, "jobs", "w").await;
    let mut flow = broker.flow();
    let a = flow.job(&work, "a").unwrap();
    flow.then(&work, "b", &[a]).unwrap();
    let id = flow.submit().await.unwrap().id;
    assert!(broker.delete_flow(id).await.unwrap());
    assert!(!broker.delete_flow(id).await.unwrap());
    let e = broker.flow_status(id).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotFound, "{e}");
    assert!(broker.flows(0, 10).await.unwrap().is_empty());
    let mut sub = work.subscribe().await.unwrap();
    next_job(&mut sub).await.ack_durable().await.unwrap();
    assert_eq!(broker.queue("jobs").await.unwrap().last_seq(), 1, "step b was never sent");
    // Ids are not reused.
    let mut flow = broker.flow();
    flow.job(&work, "c").unwrap();
    assert!(flow.submit().await.unwrap().id > id);
    broker.shutdown().await.unwrap();
}

/// `Submitted::sent` names the first steps in step order, whichever queues they go to (the
/// etcd engine appends them queue by queue).
#[tokio::test]
async fn the_first_steps_sent_are_named_in_step_order() {
    let dir = tempdir();
    let clock = ManualClock::new();
    let broker = open(dir.path(), &clock).await;
    let (a, b) = (group(&broker, "a", "w").await, group(&broker, "b", "w").await);
    let mut flow = broker.flow();
    let steps = [
        flow.job(&a, "a1").unwrap(),
        flow.job(&b, "b1").unwrap(),
        flow.job(&a, "a2").unwrap(),
        flow.job(&b, "b2").unwrap(),
    ];
    let submitted = flow.submit().await.unwrap();
    let sent: Vec<(u32, u64)> = submitted.sent.iter().map(|(s, seq)| (s.index(), *seq)).collect();
    assert_eq!(sent, vec![(0, 1), (1, 1), (2, 2), (3, 2)], "in step order");
    for (step, seq) in steps.iter().zip([1, 1, 2, 2]) {
        assert_eq!(submitted.seq_of(*step), Some(seq));
    }
    broker.shutdown().await.unwrap();
}

/// Bad flows are refused with a typed error and write nothing.
#[tokio::test]
async fn bad_flows_are_refused_and_write_nothing() {
    let dir = tempdir();
    let clock = ManualClock::new();
    let broker = open(dir.path(), &clock).await;
    let work = group(&broker, "jobs", "w").await;
    let e = broker.flow().submit().await.unwrap_err();
    assert!(matches!(e, rockq::Error::EmptyBatch), "{e}");
    let mut elsewhere = broker.flow();
    let theirs = elsewhere.job(&work, "x").unwrap();
    let mut flow = broker.flow();
    let e = flow.then(&work, "x", &[theirs]).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidInput, "a forward dependency: {e}");
    // A step of another flow is refused even where this flow has a step of its index.
    let mut third = broker.flow();
    third.job(&work, "first").unwrap();
    let e = third.then(&work, "y", &[theirs]).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidInput, "another flow's step: {e}");
    assert_eq!(third.len(), 1);
    let e = flow.job(&work, rockq::Message::new("x").deliver_after(Duration::from_secs(5))).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidInput, "a delay: {e}");
    let e = flow.job(&work, rockq::Message::new("x").idempotency_key("k")).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidInput, "an idempotency key: {e}");
    assert!(flow.is_empty());
    // The step header the writer adds counts: a message that just fits a plain send does not
    // fit a step, so no step is ever sent over `max_message_bytes`.
    let max = 1 << 20;
    let full = rockq::Message::new(vec![b'x'; max - 20]);
    let e = flow.job(&work, full.clone()).unwrap_err();
    assert!(matches!(e, rockq::Error::MessageTooLarge { .. }), "{e}");
    broker.queue("plain").await.unwrap().send(full).await.expect("fits a plain send");
    assert!(flow.is_empty());
    let dir2 = tempdir();
    let other = open(dir2.path(), &clock).await;
    let foreign = group(&other, "jobs", "w").await;
    let mut flow = broker.flow();
    assert!(flow.job(&foreign, "x").is_err());
    assert!(flow.submit().await.is_err());
    assert_eq!(broker.queue("jobs").await.unwrap().last_seq(), 0, "nothing was sent");
    assert!(broker.flows(0, 10).await.unwrap().is_empty(), "nothing was stored");
    other.shutdown().await.unwrap();
    broker.shutdown().await.unwrap();
}

/// Only the letter the step's own group wrote revives it: another group's dead letter of the
/// same message, redriven, is an ordinary redrive and leaves the step failed.
#[tokio::test]
async fn only_the_steps_own_dead_letter_revives_it() {
    let (_dir, broker, [mine, other], [a, _], id) = two_groups_one_step().await;
    let mut osub = other.subscribe().await.unwrap();
    next_job(&mut osub).await.dead_letter_durable("theirs").await.unwrap();
    let mut msub = mine.subscribe().await.unwrap();
    next_job(&mut msub).await.dead_letter_durable("mine").await.unwrap();
    let dlq = broker.dead_letters("jobs.dlq").await.unwrap();
    let letters = dlq.list(10).await.unwrap();
    let theirs = letters.iter().find(|l| l.group.as_deref() == Some("other")).unwrap().dlq_seq;
    let own = letters.iter().find(|l| l.group.as_deref() == Some("mine")).unwrap().dlq_seq;
    dlq.redrive_one(theirs, None).await.unwrap();
    let status = broker.flow_status(id).await.unwrap();
    assert!(matches!(state(&status, a), StepState::Failed { .. }), "{:?}", state(&status, a));
    dlq.redrive_one(own, None).await.unwrap();
    let status = broker.flow_status(id).await.unwrap();
    assert!(matches!(state(&status, a), StepState::Queued { seq: 3 }), "{:?}", state(&status, a));
    broker.shutdown().await.unwrap();
}
