//! The request set: everything the handles ask the writer to do, grouped by concept. Each
//! concept's requests are applied by that concept's file in `writer/` (`queue.rs`, `ordered.rs`,
//! `work.rs`, `retention.rs`, `settings.rs`, `lifecycle.rs`), which also refuses them when the writer will not
//! carry them out; so adding a write request touches this file and that one.
//!
//! Every request carries a [`Reply`]. A request a writer refuses (after shutdown began, once it
//! failed closed, or an engine that does not carry it out) is answered by
//! [`Request::refuse`] with the error made from [`Closed`], the one refusal every operation
//! shares: one match over the whole set, for both engines' writers.

use std::sync::Arc;

use tokio::sync::oneshot;

use super::registry::{
    KeyspaceState, LiveSubscription, OrderedGroupState, QueueState, TakenFrom, WorkGroupState,
};
use crate::error::{Closed, Error, StorageError};
use crate::message::Message;
use crate::model::StartFrom;
use crate::model::{Claim, ScheduleRecord};
use crate::model::{RequestedWork, WorkSettings};
use crate::retention::Retention;
use crate::sent::{ScheduledMessage, Sent};

/// Where the writer sends the outcome of one request.
pub(crate) type Reply<T, E = Error> = oneshot::Sender<Result<T, E>>;

/// Answers `reply` with the refusal `why`.
pub(crate) fn refuse<T>(reply: Reply<T>, why: &Closed) {
    let _ = reply.send(Err(why.clone().into()));
}

impl Request {
    /// Answers a request that will not be carried out with `why`, releasing what it holds (a
    /// reset's active slot, a transaction's jobs and deliveries).
    pub(crate) fn refuse(self, why: &Closed) {
        match self {
            Request::Queue(QueueRequest::Create { reply, .. }) => refuse(reply, why),
            Request::Queue(QueueRequest::SetDedupWindow { reply, .. }) => refuse(reply, why),
            Request::Ordered(OrderedRequest::Create { reply, .. }) => refuse(reply, why),
            Request::Ordered(OrderedRequest::Reset { group, reply, .. }) => {
                // The reset held the group's active slot; it is released by whoever answers.
                group.active.store(false, std::sync::atomic::Ordering::Release);
                refuse(reply, why);
            }
            Request::Work(WorkRequest::Create { reply, .. }) => refuse(reply, why),
            Request::Work(WorkRequest::Claim { reply, .. }) => refuse(reply, why),
            Request::Work(WorkRequest::Outcome { reply, .. }) => refuse(reply, why),
            Request::Work(WorkRequest::Redrive { reply, .. }) => refuse(reply, why),
            Request::Work(WorkRequest::SettleLetter { reply, .. }) => refuse(reply, why),
            Request::Work(WorkRequest::Reset { reply, .. }) => refuse(reply, why),
            Request::Work(WorkRequest::Extend(_)) => {}
            Request::Retention(RetentionRequest::SetPolicy { reply, .. }) => refuse(reply, why),
            Request::Retention(RetentionRequest::Trim { reply, .. }) => refuse(reply, why),
            Request::Retention(RetentionRequest::ExpireDedup { reply, .. }) => refuse(reply, why),
            Request::Retention(RetentionRequest::ExpireOutcomes { reply, .. }) => refuse(reply, why),
            Request::Settings(s) => refuse(s.reply, why),
            Request::WorkSettings(s) => refuse(s.reply, why),
            Request::Schedule(ScheduleRequest::Submit { reply, .. }) => refuse(reply, why),
            Request::Schedule(ScheduleRequest::Cancel { reply, .. }) => refuse(reply, why),
            Request::Schedule(ScheduleRequest::Reschedule { reply, .. }) => refuse(reply, why),
            Request::Schedule(ScheduleRequest::Fire) => {}
            Request::Schedule(ScheduleRequest::Upsert { reply, .. }) => refuse(reply, why),
            Request::Schedule(ScheduleRequest::Pause { reply, .. }) => refuse(reply, why),
            Request::Schedule(ScheduleRequest::Delete { reply, .. }) => refuse(reply, why),
            Request::Lifecycle(
                LifecycleRequest::DeleteQueue { reply, .. } | LifecycleRequest::DeleteGroup { reply, .. },
            ) => refuse(reply, why),
            Request::Lifecycle(LifecycleRequest::PurgeQueue { reply, .. }) => refuse(reply, why),
            Request::Kv(KvRequest::Create { reply, .. }) => refuse(reply, why),
            Request::Tx(tx) => tx.refuse(why),
            Request::Flow(FlowRequest::Submit { reply, .. }) => refuse(reply, why),
            Request::Flow(FlowRequest::Delete { reply, .. }) => refuse(reply, why),
            Request::Flow(FlowRequest::Move) => {}
            Request::Commit => {}
            Request::Flush { reply } => refuse(reply, why),
            // Whoever asked to stop is told it is stopped.
            Request::Shutdown { reply } => drop(reply.send(Ok(()))),
        }
    }
}

/// One request to the writer.
pub(crate) enum Request {
    Queue(QueueRequest),
    Ordered(OrderedRequest),
    Work(WorkRequest),
    Retention(RetentionRequest),
    Settings(SettingsRequest),
    WorkSettings(WorkSettingsRequest),
    Schedule(ScheduleRequest),
    Lifecycle(LifecycleRequest),
    /// Keyspaces (`writer/txn.rs`).
    Kv(KvRequest),
    /// A transaction (`writer/txn.rs`).
    Tx(TxRequest),
    /// Flows of dependent jobs (`writer/flow.rs`).
    Flow(FlowRequest),
    /// Wake-up only: a group became dirty while the writer was idle.
    Commit,
    /// Reply once every acknowledgement recorded before this request is durable.
    Flush {
        reply: Reply<(), Error>,
    },
    /// Finish everything queued before this, sync the WAL, and stop.
    Shutdown {
        reply: Reply<(), StorageError>,
    },
}

/// Queues (`writer/queue.rs`).
pub(crate) enum QueueRequest {
    /// Create queue `name` (or return the existing one).
    Create { name: String, reply: Reply<Arc<QueueState>, Error> },
    /// Persist how long the queue remembers idempotency keys.
    SetDedupWindow { queue: Arc<QueueState>, window: std::time::Duration, reply: Reply<(), Error> },
}

/// Deleting and purging queues and groups (`writer/lifecycle.rs`). Each is one batch; names
/// were validated by the caller.
pub(crate) enum LifecycleRequest {
    /// Delete queue `name` with everything of it; `false` if there is none.
    DeleteQueue { name: String, reply: Reply<bool, Error> },
    /// Delete every message of queue `name` and move every group past them; the reply gives
    /// how many were deleted. 0 if there is no such queue.
    PurgeQueue { name: String, reply: Reply<u64, Error> },
    /// Delete group `group` on queue `queue`, either mode; `false` if there is none.
    DeleteGroup { queue: String, group: String, reply: Reply<bool, Error> },
}

/// Delayed messages, idempotent sends and recurring schedules (`writer/schedule.rs`).
pub(crate) enum ScheduleRequest {
    /// The messages of one submit call for `queue`: each is appended now, scheduled, or found a
    /// duplicate of an earlier one, all in one batch.
    Submit { queue: Arc<QueueState>, msgs: Vec<Submission>, reply: Reply<Vec<Sent>, Error> },
    /// Take delayed message `id` of `queue` out of the schedule; `false` if it is not there.
    Cancel { queue: Arc<QueueState>, id: u64, reply: Reply<bool, Error> },
    /// Move delayed message `id` of `queue` to `due` (µs); `None` if it is not scheduled.
    Reschedule { queue: Arc<QueueState>, id: u64, due: u64, reply: Reply<Option<ScheduledMessage>, Error> },
    /// The timer found something due: append what is due (a bounded amount per round).
    Fire,
    /// Create or replace recurring schedule `name` (its id, anchor and next firing are set by
    /// the writer).
    Upsert { name: String, record: ScheduleRecord, reply: Reply<Option<u64>, Error> },
    /// Pause or resume recurring schedule `name`.
    Pause { name: String, paused: bool, reply: Reply<(), Error> },
    /// Delete recurring schedule `name`; `false` if there is none.
    Delete { name: String, reply: Reply<bool, Error> },
}

/// One message of a submit call, checked and encoded by the caller.
pub(crate) struct Submission {
    /// Its envelope (the writer stamps it).
    pub envelope: Vec<u8>,
    /// When it is due (µs since the epoch), if delayed.
    pub due: Option<u64>,
    pub idempotency_key: Option<String>,
}

/// Ordered groups (`writer/ordered.rs`).
pub(crate) enum OrderedRequest {
    /// Create an ordered group (or return the existing one).
    Create {
        queue: Arc<QueueState>,
        group: String,
        start: StartFrom,
        reply: Reply<Arc<OrderedGroupState>, Error>,
    },
    /// Set the group's offset (replay). The caller holds the group's active slot and hands it to
    /// the writer, which releases it once the reset is answered.
    Reset { group: Arc<OrderedGroupState>, offset: u64, reply: Reply<(), Error> },
}

/// Work-queue groups (`writer/work.rs`).
pub(crate) enum WorkRequest {
    /// Create a work-queue group (or return the existing one).
    Create {
        queue: Arc<QueueState>,
        group: String,
        start: StartFrom,
        reply: Reply<Arc<WorkGroupState>, Error>,
    },
    /// Persist claims (attempt counts) before their handlers run. Refused with `LeaseLost` if
    /// the group was reset since `epoch`.
    /// `bucket`: the group's rate bucket after these claims (wall micros), written with them.
    Claim {
        group: Arc<WorkGroupState>,
        epoch: u64,
        claims: Vec<(u64, Claim)>,
        bucket: Option<u64>,
        /// The claims were decided under the group's rate or concurrency limit, on the view of
        /// this revision of its limit record (`Take::limit_rev`; the etcd engine compares it).
        #[cfg_attr(not(feature = "etcd"), allow(dead_code))]
        limit_rev: Option<i64>,
        /// `Ok`: the claims are stored but for the sequences answered, which another process
        /// took or finished since they were decided (the etcd engine; embedded answers none):
        /// the claimer drops those from its batch.
        reply: Reply<Vec<u64>, Error>,
    },
    /// Record the outcome of one attempt, claimed in reset epoch `epoch`. If the writer refuses
    /// it, it puts the message back to claimable itself — for an operator's action
    /// (`taken_from`), to the state it was taken from: a retry keeps its due time.
    Outcome {
        group: Arc<WorkGroupState>,
        seq: u64,
        attempt: u32,
        epoch: u64,
        outcome: Outcome,
        #[cfg_attr(not(feature = "etcd"), allow(dead_code))] // read by the etcd engine
        taken_from: Option<TakenFrom>,
        reply: Reply<(), Error>,
    },
    /// Move dead letters `(expected, last]` of `dlq` to their targets and advance its cursor.
    Redrive { dlq: Arc<QueueState>, expected: u64, last: u64, items: Vec<RedriveItem>, reply: RedriveReply },
    /// Settle dead letter `seq` of `dlq` on its own: redrive it (`item`, its copy) or delete it
    /// (`None`). Answers where the copy went.
    SettleLetter {
        dlq: Arc<QueueState>,
        seq: u64,
        item: Option<RedriveItem>,
        reply: Reply<Option<(Arc<str>, u64)>, Error>,
    },
    /// Set the group's offset (replay): its claims are deleted.
    Reset { group: Arc<WorkGroupState>, offset: u64, reply: Reply<(), Error> },
    /// The etcd engine: persist a lease extension (`claim`, leased to a later deadline), so
    /// that other processes see it. The embedded engine keeps extensions in memory and never
    /// gets this.
    #[allow(dead_code)] // sent only by the etcd engine
    Extend(Extension),
}

/// A holder's lease as the holder sees it, shared by its [`Job`](crate::Job) and (etcd) the
/// writer that persists its extensions.
#[derive(Debug, Clone, Copy)]
pub(crate) struct HeldLease {
    /// Until when the holder believes it holds the job.
    pub deadline: std::time::Instant,
    /// The deadline of the latest extension asked for.
    pub requested: std::time::Instant,
    /// The deadline other processes read (etcd: the stored claim's), as far as this process
    /// knows.
    #[cfg_attr(not(feature = "etcd"), allow(dead_code))]
    pub persisted: std::time::Instant,
    /// Extensions asked for so far: an extension's write applies its deadline only if no
    /// later one was asked for meanwhile.
    pub extensions: u64,
}

impl HeldLease {
    pub fn new(deadline: std::time::Instant) -> Self {
        HeldLease { deadline, requested: deadline, persisted: deadline, extensions: 0 }
    }
}

/// A lease extension for the etcd writer to persist ([`WorkRequest::Extend`]).
#[allow(dead_code)] // read only by the etcd engine
pub(crate) struct Extension {
    pub group: Arc<WorkGroupState>,
    pub seq: u64,
    /// The holder's attempt, fencing token and name: the claim record to store, leased until
    /// the latest deadline `lease` asks for when the writer gets to it (extensions sent from a
    /// task when the channel was full may arrive out of order).
    pub attempt: u32,
    pub token: u64,
    pub holder: Arc<str>,
    /// The extension's number (`HeldLease::extensions` once it was asked for).
    pub number: u64,
    pub lease: Arc<std::sync::Mutex<HeldLease>>,
}

/// Retention (`writer/retention.rs`).
pub(crate) enum RetentionRequest {
    /// Persist a queue's retention policy.
    SetPolicy { queue: Arc<QueueState>, retention: Retention, reply: Reply<(), Error> },
    /// Delete each queue's messages up to its cut (one range tombstone each) and move its first
    /// sequence, all in one round; the reply gives how many each trim deleted, in order. Each
    /// cut was computed under its policy: the writer re-checks it when it applies the trim.
    Trim { cuts: Vec<TrimCut>, reply: Reply<Vec<u64>, Error> },
    /// Forget expired idempotency keys `(expires, queue id, key)`, read from the expiry index
    /// in its order; each is deleted only if its record still has that expiry. The reply gives
    /// how many were deleted.
    ExpireDedup { expired: Vec<(u64, u32, Vec<u8>)>, reply: Reply<u64, Error> },
    /// Delete job outcomes of `group` listed `(seq, finished at µs)`, each only if its record
    /// still has that finish time. The reply gives how many were deleted.
    ExpireOutcomes { group: Arc<WorkGroupState>, expired: Vec<(u64, u64)>, reply: Reply<u64, Error> },
}

/// One queue's cut in a [`RetentionRequest::Trim`]: delete up to `to`, as computed under
/// `policy`.
pub(crate) struct TrimCut {
    pub queue: Arc<QueueState>,
    pub to: u64,
    pub policy: Retention,
}

/// Change a group's settings record (`writer/settings.rs`), either mode.
pub(crate) struct SettingsRequest {
    pub queue: Arc<QueueState>,
    pub group: String,
    pub change: SettingsChange,
    pub reply: Reply<(), Error>,
}

/// One change to a group's settings; the writer applies it to the latest record, so
/// concurrent changes of different fields do not undo each other.
#[derive(Debug, Clone)]
pub(crate) enum SettingsChange {
    Paused(bool),
}

/// Resolve what a work-group handle set explicitly against the group's latest settings record
/// and store the result (`writer/settings.rs`). The reply is the settings the group runs with,
/// installed in `group` once durable.
pub(crate) struct WorkSettingsRequest {
    pub group: Arc<WorkGroupState>,
    pub requested: RequestedWork,
    pub mode: SettingsMode,
    pub reply: Reply<Arc<WorkSettings>, Error>,
}

/// How a [`WorkSettingsRequest`] treats settings already stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SettingsMode {
    /// A subscribe: keep the stored settings; an explicit value that differs is refused with
    /// `SettingsMismatch`. Stores the requested ones (defaults for unset) only if none are.
    Adopt,
    /// `WorkGroup::update`: replace the stored values with the explicit ones.
    Update,
}

/// What became of one attempt of a work-queue message.
pub(crate) enum Outcome {
    /// Finished: the offset may pass it. `result` is the handler's, kept by a group that keeps
    /// outcomes; `flow`, the step the job is (the etcd engine records its change with it).
    Ack {
        result: Option<bytes::Bytes>,
        #[cfg_attr(not(feature = "etcd"), allow(dead_code))] // read by the etcd engine
        flow: Option<crate::flow_state::FlowStep>,
    },
    /// An operator finished it without running it (`Broker::delete_job`).
    Deleted,
    /// Failed; try again after `delay` (the claim holds the retry time and the error).
    Retry { claim: Claim, delay: std::time::Duration },
    /// Move it to the dead-letter queue `dlq`.
    DeadLetter { reason: String, dlq: Arc<str> },
}

/// Answer to a redrive: the queue and new sequence of each moved message.
pub(crate) type RedriveReply = Reply<Vec<(Arc<str>, u64)>, Error>;

/// One dead letter on its way back: its original payload and headers, appended to `target`
/// stamped `enqueued_at_micros` (the redrive's time).
pub(crate) struct RedriveItem {
    pub dlq_seq: u64,
    pub target: Arc<str>,
    pub message: Message,
    pub enqueued_at_micros: u64,
}

/// Flows of dependent jobs (`writer/flow.rs`).
pub(crate) enum FlowRequest {
    /// Store a flow and send its steps that run after nothing; answers its id and each sent
    /// step's sequence.
    Submit { steps: Vec<FlowStepSpec>, reply: Reply<crate::flow_state::Submitted, Error> },
    /// Delete flow `id`'s records (its sent jobs stay in their queues); `false` if there is
    /// none.
    Delete { id: u64, reply: Reply<bool, Error> },
    /// Apply the flow changes other writes left (the etcd engine: `etcd/flows.rs`; the
    /// embedded writer moves a flow in the write that finishes its step, and has none).
    #[cfg_attr(not(feature = "etcd"), allow(dead_code))] // sent only by the etcd engine
    Move,
}

/// One step of a flow on its way to the writer, checked by the caller (names, sizes, the
/// dependencies come before it).
pub(crate) struct FlowStepSpec {
    pub queue: Arc<QueueState>,
    pub group: String,
    pub when: crate::flow_state::RunWhen,
    pub after: Vec<u32>,
    pub message: Message,
}

impl FlowStepSpec {
    /// The step's first record: nothing after it has finished yet, in `state`.
    pub fn record(
        &self,
        dependents: Vec<u32>,
        state: crate::flow_state::StoredStep,
    ) -> crate::flow_state::StepRecord {
        crate::flow_state::StepRecord {
            queue: self.queue.name.to_string(),
            group: self.group.clone(),
            when: self.when,
            deps: self.after.len() as u32,
            dependents,
            succeeded: 0,
            failed: 0,
            state,
        }
    }
}

/// Keyspaces (`writer/txn.rs`).
pub(crate) enum KvRequest {
    /// Create keyspace `name` (or return the existing one).
    Create { name: String, reply: Reply<Arc<KeyspaceState>, Error> },
}

/// One transaction, checked on the caller's task (sizes, keys) and applied by the writer as
/// part of one batch: every condition is checked first, and either everything is applied or
/// nothing is.
pub(crate) struct TxRequest {
    pub writes: Vec<KvWrite>,
    pub sends: Vec<TxSend>,
    pub jobs: Vec<TxJob>,
    pub deliveries: Vec<TxDelivery>,
    pub reply: Reply<TxApplied, Error>,
}

/// A write to a keyspace (`value: None` deletes), or only a condition (`condition_only`).
pub(crate) struct KvWrite {
    pub keyspace: Arc<KeyspaceState>,
    pub key: Vec<u8>,
    pub value: Option<Vec<u8>>,
    pub expect: Option<crate::entry::Expect>,
    /// Checks `expect` and writes nothing.
    pub condition_only: bool,
}

/// A message a transaction sends.
pub(crate) struct TxSend {
    pub queue: Arc<QueueState>,
    pub msg: Submission,
}

/// A work-queue job a transaction acks: the caller began settling it (fenced by its lease
/// then); a refused transaction gives the lease back to `token` until `deadline`.
pub(crate) struct TxJob {
    pub group: Arc<WorkGroupState>,
    pub seq: u64,
    pub attempt: u32,
    pub token: u64,
    pub epoch: u64,
    /// The holder's lease, read when it is handed back: a lease extension that failed
    /// meanwhile (etcd) has put its deadline back.
    pub lease: Arc<std::sync::Mutex<HeldLease>>,
    /// The handler's result (`Task::set_result`), kept by a group that keeps outcomes.
    pub result: Option<bytes::Bytes>,
    /// The flow step the job is, from its message's header (`QueuedAck::flow`).
    #[cfg_attr(not(feature = "etcd"), allow(dead_code))] // read by the etcd engine
    pub flow: Option<crate::flow_state::FlowStep>,
}

/// An ordered delivery a transaction acks. The request owns it: a refused transaction hands
/// it back to its subscription.
pub(crate) struct TxDelivery {
    pub group: Arc<OrderedGroupState>,
    pub sub: Arc<dyn LiveSubscription>,
    pub msg: crate::store::RawMessage,
    pub deliveries: u32,
}

/// What an applied transaction reports: the revision its writes got (`None`: it wrote no key)
/// and the outcome of each send, in order.
#[derive(Debug)]
pub(crate) struct TxApplied {
    pub revision: Option<u64>,
    pub sent: Vec<Sent>,
}

impl TxRequest {
    /// Answers a transaction that will not be applied with `why`, handing back what it held.
    pub(crate) fn refuse(self, why: &Closed) {
        let TxRequest { jobs, deliveries, reply, .. } = self;
        give_back(jobs, deliveries, false);
        let _ = reply.send(Err(why.clone().into()));
    }
}

/// A refused transaction's jobs are leased to their holders again; its ordered deliveries go
/// back to their subscriptions (after a short pause, uncounted, if it `conflicted`).
pub(crate) fn give_back(jobs: Vec<TxJob>, deliveries: Vec<TxDelivery>, conflicted: bool) {
    for j in jobs {
        let deadline = j.lease.lock().unwrap_or_else(|p| p.into_inner()).deadline;
        j.group.unsettle(j.seq, j.token, deadline, j.epoch);
    }
    for d in deliveries {
        d.sub.hand_back(d.msg, d.deliveries, conflicted);
    }
}
