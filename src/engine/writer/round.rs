//! One writer round as the request handlers see it: the store batch they add domain operations
//! to, what to do once the batch is durable (or has failed), and the writer's memory of what it
//! wrote that the registry does not hold yet.
//!
//! Handlers (`queue.rs`, `ordered.rs`, `work.rs`, `retention.rs`, `settings.rs`) take a
//! `&mut Round` and nothing else: no RocksDB type, no argument lists to thread through.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use crate::engine::Engine;
use crate::engine::inbox::Staged;
use crate::engine::keyed::Keyed;
use crate::engine::registry::{OrderedGroupState, QueueState, WorkGroupState};
use crate::engine::request::Reply;
use crate::error::{Error, StorageError};
use crate::model::GroupSettings;
use crate::store::Batch;

/// The round being built.
pub(crate) struct Round<'a> {
    /// The round's writes: applied atomically, or not at all.
    pub batch: Batch<'a>,
    pub engine: &'a Arc<Engine>,
    /// What earlier rounds wrote (see [`Written`]).
    pub written: &'a mut Written,
    /// What completing the round does.
    pub done: Completions,
    /// Schedule and dedup entries changed in this round, which reads of the store do not see
    /// yet (see [`RoundJobs`]).
    pub jobs: RoundJobs,
}

impl RoundJobs {
    /// The original recorded this round for idempotency key `key` of queue `queue_id`.
    pub fn dedup(&self, queue_id: u32, key: &str) -> Option<crate::sent::Original> {
        self.dedup.get(&queue_id).and_then(|m| m.get(key)).map(|&(original, _)| original)
    }
}

/// A sequence a work group finished, with the reset epoch it was finished in.
pub(crate) type Finish = (u64, u64);

/// A due entry's time and value, as this round wrote it.
pub(crate) type DueAndValue = (u64, Vec<u8>);

/// The round's own changes to the schedule and the dedup index. The writer reads those
/// through the store, which shows the last written batch, not this one: without this overlay a
/// cancel and a firing of the same message in one round would both succeed, and two sends
/// with one idempotency key in one round would both be written.
#[derive(Default)]
pub(crate) struct RoundJobs {
    /// Delayed messages (and recurring firings, under queue id `RECURRING`) whose due entry
    /// this round wrote (`Some`: due time and envelope) or deleted (`None`).
    pub scheduled: rustc_hash::FxHashMap<(u32, u64), Option<DueAndValue>>,
    /// Idempotency keys recorded this round, by queue id then key (found by `&str`, without
    /// an allocation per lookup), with the expiry each was recorded with (a queue deleted in
    /// the same round deletes their expiry entries too).
    pub dedup: rustc_hash::FxHashMap<u32, rustc_hash::FxHashMap<String, (crate::sent::Original, u64)>>,
    /// Recurring schedules written (`Some`) or deleted (`None`) this round.
    pub schedules: std::collections::HashMap<String, Option<crate::model::ScheduleRecord>>,
    /// Keyspace entries written this round, by keyspace id then key (found by `&[u8]`, without
    /// a copy per lookup): the revision written (`Some`) or deleted (`None`). Conditions of a
    /// later transaction in the round read these first.
    pub kv: rustc_hash::FxHashMap<u32, rustc_hash::FxHashMap<Vec<u8>, Option<u64>>>,
    /// Flow steps written this round (`writer/flow.rs` reads them before the store).
    pub flow_steps: rustc_hash::FxHashMap<(u64, u32), crate::flow_state::StepRecord>,
    /// Flows deleted this round.
    pub flows_deleted: rustc_hash::FxHashSet<u64>,
}

impl Written {
    /// Whether some sent message is a flow step (finishing a job then looks it up).
    pub fn has_flow_jobs(&self) -> bool {
        !self.flow_jobs.is_empty()
    }
}

impl Round<'_> {
    /// Runs `f` once the round is durable (`Ok`) or has failed.
    pub fn on_done(&mut self, f: impl FnOnce(Result<(), &StorageError>) + Send + 'static) {
        self.done.callbacks.push(Box::new(f));
    }

    /// The enqueue time of this round's messages: the broker's clock, never below the last
    /// stamp, so times never decrease along a queue (not even when the wall clock steps back).
    pub fn stamp(&mut self) -> u64 {
        let w = &mut *self.written;
        w.last_stamp = w.last_stamp.max(self.engine.clock().wall_micros());
        w.last_stamp
    }
}

/// What the writer has written that the registry may not hold yet (the round that wrote it may
/// still be syncing), and the counters only it advances. A second request for a queue or group
/// created in an earlier round waits for the same sync instead of creating it again.
#[derive(Default)]
pub(crate) struct Written {
    /// Next sequence per queue id. Only the writer allocates.
    pub next_seq: rustc_hash::FxHashMap<u32, u64>,
    pub next_queue_id: u32,
    /// The enqueue time given to the last round's messages.
    pub last_stamp: u64,
    /// The next schedule id (persisted whenever one is handed out).
    pub next_scheduled_id: u64,
    /// No due entry is earlier than this (µs): firing reads the due index from here.
    pub due_floor: u64,
    /// Every queue by id, loaded at open or created since (a due entry names its queue by id).
    pub queue_ids: rustc_hash::FxHashMap<u32, Arc<QueueState>>,
    pub queues: HashMap<String, Arc<QueueState>>,
    pub ordered: HashMap<Vec<u8>, Arc<OrderedGroupState>>,
    pub work: HashMap<Vec<u8>, Arc<WorkGroupState>>,
    /// Every group, loaded at open or created since, by queue id: a trim touches the groups of
    /// its queue without walking every group.
    pub groups_of: HashMap<u32, QueueGroups>,
    /// Redrive cursors written (read from disk on first use), by dead-letter queue id.
    pub cursors: HashMap<u32, u64>,
    /// Dead letters settled on their own above the cursor (read from disk on first use), by
    /// dead-letter queue id.
    pub letter_marks: HashMap<u32, std::collections::BTreeSet<u64>>,
    /// Group settings written (read from disk on first use), by (group, queue).
    pub settings: HashMap<(String, Arc<str>), GroupSettings>,
    /// Keyspaces created by the writer (the registry holds them once their round is durable).
    pub keyspaces: HashMap<String, Arc<crate::engine::registry::KeyspaceState>>,
    /// The next keyspace id to hand out.
    pub next_keyspace_id: u32,
    /// The last keyspace revision handed out (persisted with every transaction that writes).
    pub kv_revision: u64,
    /// The next flow id (persisted whenever one is handed out).
    pub next_flow_id: u64,
    /// Which sent message is which flow step: `(queue id, seq) → (flow, step, group)`.
    pub flow_jobs: rustc_hash::FxHashMap<(u32, u64), (u64, u32, Arc<str>)>,
}

/// The groups of one queue.
#[derive(Default)]
pub(crate) struct QueueGroups {
    pub ordered: Vec<Arc<OrderedGroupState>>,
    pub work: Vec<Arc<WorkGroupState>>,
}

impl Written {
    /// Every ordered group: the registry's and those created but not yet registered (a group
    /// may come twice; every caller's work is idempotent).
    pub fn ordered_groups(&self, engine: &Engine) -> Vec<Arc<OrderedGroupState>> {
        engine.registry.ordered.iter().map(|g| g.clone()).chain(self.ordered.values().cloned()).collect()
    }

    /// Indexes every queue and group of the registry (at the writer's start).
    pub fn index_registry(&mut self, engine: &Engine) {
        for q in engine.registry.queues.iter() {
            self.queue_ids.insert(q.id, q.clone());
        }
        for g in engine.registry.ordered.iter() {
            self.groups_of.entry(g.queue.id).or_default().ordered.push(g.clone());
        }
        for g in engine.registry.work.iter() {
            self.groups_of.entry(g.queue.id).or_default().work.push(g.clone());
        }
    }

    /// The ordered groups of queue `queue_id`, registered or not yet.
    pub fn ordered_groups_of(&self, queue_id: u32) -> &[Arc<OrderedGroupState>] {
        self.groups_of.get(&queue_id).map_or(&[], |g| &g.ordered)
    }

    /// The work-queue groups of queue `queue_id`, registered or not yet.
    pub fn work_groups_of(&self, queue_id: u32) -> &[Arc<WorkGroupState>] {
        self.groups_of.get(&queue_id).map_or(&[], |g| &g.work)
    }
}

/// Something created this round, with every caller waiting for it.
pub(crate) type Created<T, E> = (Arc<T>, Vec<Reply<Arc<T>, E>>);

/// Work to run once a round's write is durable (`Ok`) or has failed.
pub(crate) type Callback = Box<dyn FnOnce(Result<(), &StorageError>) + Send>;

/// What completing one round does, after its write succeeded (or failed): run on the
/// completer, off the writer thread (`commit.rs`).
#[derive(Default)]
pub(crate) struct Completions {
    /// Queues, ordered groups and work-queue groups created this round, with their waiters.
    pub queues: Keyed<Arc<str>, Created<QueueState, Error>>,
    pub ordered: Keyed<Vec<u8>, Created<OrderedGroupState, Error>>,
    pub work: Keyed<Vec<u8>, Created<WorkGroupState, Error>>,
    /// Staged sends written this round, with the first sequence of each send call. Their
    /// buffers are freed by the completer, off the writer thread.
    pub staged: Vec<(Staged, Box<[u64]>)>,
    /// Queues appended to this round: their last sequence and how many messages were appended.
    pub touched: Keyed<u32, (Arc<QueueState>, u64, u64)>,
    /// Ordered offsets written this round.
    pub commits: Vec<(Arc<OrderedGroupState>, u64)>,
    /// Work-queue groups whose offset moved this round (their records are written last).
    pub work_offsets: Keyed<GroupPtr, Arc<WorkGroupState>>,
    /// Their new offsets, published before any reply of the round.
    pub work_durable: Vec<(Arc<WorkGroupState>, u64)>,
    /// Sequences finished this round, per work-queue group (forgotten in memory once durable).
    pub work_finished: Keyed<GroupPtr, (Arc<WorkGroupState>, Vec<Finish>)>,
    pub callbacks: Vec<Callback>,
    pub flushes: Vec<Reply<(), Error>>,
    pub shutdown: Option<Reply<(), StorageError>>,
    /// Messages appended this round.
    pub messages: u64,
    /// When the round's write started (for the commit-latency histogram).
    pub started: Option<Instant>,
}

impl Completions {
    /// Records that `queue` got messages up to `last`, `n` more this round.
    pub fn touched(&mut self, queue: &Arc<QueueState>, last: u64, n: u64) {
        let t = self.touched.get_or_insert_with(queue.id, || (queue.clone(), last, 0));
        t.1 = last;
        t.2 += n;
    }

    /// Remembers that `g`'s offset moved this round (its record is written once, last).
    pub fn work_offset_moved(&mut self, g: &Arc<WorkGroupState>) {
        self.work_offsets.get_or_insert_with(GroupPtr::of(g), || g.clone());
    }

    /// Remembers that `g` finished `seq` this round (forgotten in memory once durable).
    pub fn work_finished(&mut self, g: &Arc<WorkGroupState>, seq: u64) {
        // With the reset epoch it was finished in: a reset applied before the round completes
        // makes it moot (see `WorkGroupState::finished`).
        let epoch = g.epoch();
        self.work_finished
            .get_or_insert_with(GroupPtr::of(g), || (g.clone(), Vec::new()))
            .1
            .push((seq, epoch));
    }
}

/// A work-queue group's identity within one round: the address of its state (one state per
/// group for the life of the broker).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct GroupPtr(usize);

impl GroupPtr {
    pub fn of(g: &Arc<WorkGroupState>) -> Self {
        GroupPtr(Arc::as_ptr(g) as usize)
    }
}
