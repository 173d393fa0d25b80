//! The in-memory state of one work-queue group: which sequence is held by whom, which waits
//! for a retry, and how far the group is finished.
//!
//! Two halves with two owners:
//! - [`Dispatch`] (behind a mutex shared by subscriptions and jobs) decides who may hold a
//!   message: claims, lease expiry, fencing, releases. It changes *before* the matching record
//!   is handed to the writer, and every transition that enables a later write for the same
//!   sequence happens only after the earlier write was queued, so the writer applies the writes
//!   for one sequence in the order they were decided.
//! - [`Progress`] (locked only by the writer thread) is the durable side: the offset and the
//!   finished sequences above it. The writer moves the offset over contiguous finished
//!   sequences and deletes their claim records in the same batch.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tokio::sync::Notify;

use super::dispatch::{Dispatch, FOREIGN_TOKEN, Pick, Slot, SlotState};
use super::finished::Finished;
use super::queue::QueueState;
use crate::clock::Clock;
use crate::events::Event;
use crate::model::Claim;
use crate::model::WorkSettings;
use crate::stats::{JobState, JobStatus};
use crate::store::GroupKeys;

/// One work-queue group on one queue.
pub(crate) struct WorkGroupState {
    pub name: Arc<str>,
    pub queue: Arc<QueueState>,
    /// Its offset record and claims in the store.
    pub keys: GroupKeys,
    /// Offset whose record is durable: every sequence up to it is acked or dead-lettered.
    pub durable: AtomicU64,
    dispatch: Mutex<Dispatch>,
    /// Signalled when something may have become claimable (a release, a new retry time).
    pub changed: Notify,
    /// Signalled when a job may have become final (the durable offset moved, a finished job
    /// was forgotten, retention skipped ahead, a reset): what `Broker::wait_job` waits on. Once
    /// per group per writer round, not per job.
    pub settled: Notify,
    /// Writer-only: the offset and finished sequences above it.
    pub progress: Mutex<Progress>,
    next_token: AtomicU64,
    /// Acks (sequence, attempt) queued for the writer's next round, coalesced like ordered
    /// offsets: one channel message per round instead of one per ack.
    queued_acks: Mutex<Vec<QueuedAck>>,
    /// Progress reports queued for the writer's next round: the latest per job (coalesced).
    queued_progress: Mutex<std::collections::HashMap<u64, bytes::Bytes>>,
    /// Whether a progress record may exist (one was reported, or found at open): trims and
    /// resets then delete the records of what they move past.
    pub has_progress: std::sync::atomic::AtomicBool,
    /// Messages this group never received because retention deleted them first.
    pub skipped: AtomicU64,
    /// Times a subscription of this group waited on its in-flight bound for too long.
    pub saturations: AtomicU64,
    /// Live subscriptions of this group in this process (a reset needs none).
    pub subscriptions: std::sync::atomic::AtomicUsize,
    /// A paused group claims nothing (persisted in its settings record).
    pub paused: std::sync::atomic::AtomicBool,
    /// The group's stored settings (`None` until they are read at open or first stored).
    /// Replaced by the writer once a change is durable; claims and outcomes read them when
    /// they are decided, so a durable `WorkGroup::update` applies to every decision after it.
    settings: Mutex<Option<Arc<WorkSettings>>>,
    /// The dead-letter queue a record without stored terms names (an older build's; empty:
    /// none), for stats until the group's first subscribe stores its settings.
    recorded_dlq: Mutex<String>,
    /// Bumped by the writer when it applies a reset. Claims, outcomes and queued acks carry the
    /// epoch they were claimed in, and the writer refuses those from before the last reset:
    /// whatever was decided before a reset must not land after it.
    epoch: AtomicU64,
    /// Set by the writer as the group's deletion (or its queue's) enters a batch.
    deleted: std::sync::atomic::AtomicBool,
    /// Ordered by key: a message is not claimed while an earlier one with the same ordering
    /// key is unfinished (set by the first subscription that asks; see `set_keyed`).
    keyed: std::sync::atomic::AtomicBool,
    /// Writer-only: the rate bucket's state last written (wall-clock micros; 0: none).
    bucket_written: AtomicU64,
}

impl std::fmt::Debug for WorkGroupState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkGroupState").field("name", &self.name).field("queue", &self.queue.name).finish()
    }
}

/// Writer-side progress of a group.
#[derive(Debug)]
pub(crate) struct Progress {
    pub offset: u64,
    /// Finished sequences above `offset` (their claim records say `Done`); its base is
    /// `offset + 1`.
    pub done: Finished,
}

impl Progress {
    /// Marks `seq` finished and moves the offset over the contiguous finished run; returns
    /// whether `seq` was new (above the offset, not finished before).
    pub fn finish(&mut self, seq: u64) -> bool {
        if !self.done.insert(seq) {
            return false;
        }
        self.offset = self.done.advance() - 1;
        true
    }

    /// Sets the offset to `offset`, forgetting what is finished at or below it.
    pub fn move_to(&mut self, offset: u64) {
        self.offset = offset;
        self.done.rebase(offset + 1);
    }

    /// A reset to `offset`: everything above it runs again, so nothing there is finished
    /// (`move_to` keeps what is finished above a trim's cut; a reset must not: a job finished
    /// above the new offset and run again would find itself finished already, and its new
    /// outcome would be dropped — its `Done` record never written, its slot never forgotten).
    pub fn reset_to(&mut self, offset: u64) {
        self.offset = offset;
        self.done = Finished::new(offset + 1);
    }

    /// Retention deleted everything through `to`: the offset moves there and on over the run
    /// of finished messages right above it (finished while an earlier one waited). Returns the
    /// new offset.
    pub fn trim_to(&mut self, to: u64) -> u64 {
        self.move_to(to);
        self.offset = self.done.advance() - 1;
        self.offset
    }
}

/// A message claimed for a subscriber.
#[derive(Debug, Clone)]
pub(crate) struct Claimed {
    pub seq: u64,
    pub attempt: u32,
    pub token: u64,
    pub deadline: Instant,
    /// Set if the previous holder's lease expired (for the `LeaseExpired` event).
    pub expired: bool,
    /// The reset epoch it was claimed in.
    pub epoch: u64,
}

/// A message that used up its attempts and must be dead-lettered instead of delivered.
#[derive(Debug, Clone)]
pub(crate) struct Exhausted {
    pub seq: u64,
    pub attempt: u32,
    pub last_error: String,
    /// The reset epoch it was marked in.
    pub epoch: u64,
}

/// A work group's durable limits, as its stored settings give them.
#[derive(Debug, Clone, Copy, Default)]
struct Limits {
    rate: Option<crate::rate_limit::RateLimit>,
    concurrency: Option<u32>,
    /// A per-key limit is set: what is parked is held back by a limit, not by an order.
    per_key: bool,
}

impl Limits {
    /// A rate or concurrency limit: claims are counted against the group's limit record.
    fn on_claims(&self) -> bool {
        self.rate.is_some() || self.concurrency.is_some()
    }

    /// The etcd engine: under such a limit, `d` is known to miss another process's limited
    /// claims (written, not learned yet) — a count or a bucket without them would let this
    /// process claim past the limit.
    fn view_stale(&self, d: &Dispatch) -> bool {
        self.on_claims() && d.limit_seen < d.limit_known
    }
}

/// What one [`WorkGroupState::take`] produced.
#[derive(Debug, Default)]
pub(crate) struct Take {
    pub claimed: Vec<Claimed>,
    pub exhausted: Vec<Exhausted>,
    /// The earliest future lease deadline or retry time: when to look again.
    pub next_wake: Option<Instant>,
    /// The rate-limit bucket's state after this take, if it took tokens: written with the
    /// claims (`WorkRequest::Claim`), so a restart finds the bucket as these claims left it.
    pub rate_tat: Option<Instant>,
    /// A limit stopped the take (the group's rate or concurrency limit).
    pub limited: bool,
    /// The take applied the group's rate or concurrency limit, on a view that includes the
    /// claims of this revision of the group's limit record (the etcd engine: `Dispatch::
    /// limit_seen`; embedded: 0). `None`: no such limit applied.
    pub limit_rev: Option<i64>,
}

/// Puts a `Settling` message back to claimable if its outcome never reaches the writer (the
/// future sending it was dropped, or the channel closed). Disarm it once the request is
/// queued: from then on the writer owns the outcome, and reverts it itself if it refuses it.
pub(crate) struct SettlingGuard<'a> {
    pub group: &'a WorkGroupState,
    pub seq: u64,
    pub armed: bool,
}

impl Drop for SettlingGuard<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.group.revert(self.seq);
        }
    }
}

/// An ack queued for the writer's next round.
#[derive(Debug, Clone)]
pub(crate) struct QueuedAck {
    pub seq: u64,
    pub attempt: u32,
    /// The reset epoch of the claim it settles.
    pub epoch: u64,
    /// The handler's result, kept with the outcome by a group that keeps outcomes.
    pub result: Option<bytes::Bytes>,
    /// The flow step the job is, from its message's header (the etcd engine records the
    /// step's change with the ack; the embedded writer keeps its own index).
    #[cfg_attr(not(feature = "etcd"), allow(dead_code))] // read by the etcd engine
    pub flow: Option<crate::flow_state::FlowStep>,
}

/// How far ahead an instant is clamped when a duration would overflow `Instant` (about a
/// century: "never" for any lease or retry).
pub(crate) const FAR_FUTURE: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// Why a holder may no longer act on a message.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Lost;

impl WorkGroupState {
    pub fn new(name: &str, queue: Arc<QueueState>, committed: u64) -> Arc<Self> {
        let keys = GroupKeys::work(name, &queue.name);
        // Tokens only fence holders within one process lifetime; seeding from the wall clock
        // keeps the ones written to disk distinct across restarts too.
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_micros() as u64);
        Arc::new(WorkGroupState {
            name: Arc::from(name),
            queue,
            keys,
            durable: AtomicU64::new(committed),
            dispatch: Mutex::new(Dispatch::new(committed + 1)),
            changed: Notify::new(),
            settled: Notify::new(),
            progress: Mutex::new(Progress { offset: committed, done: Finished::new(committed + 1) }),
            next_token: AtomicU64::new(seed),
            queued_acks: Mutex::new(Vec::new()),
            queued_progress: Mutex::new(std::collections::HashMap::new()),
            has_progress: std::sync::atomic::AtomicBool::new(false),
            saturations: AtomicU64::new(0),
            subscriptions: std::sync::atomic::AtomicUsize::new(0),
            skipped: AtomicU64::new(0),
            paused: std::sync::atomic::AtomicBool::new(false),
            settings: Mutex::new(None),
            recorded_dlq: Mutex::new(String::new()),
            epoch: AtomicU64::new(0),
            deleted: std::sync::atomic::AtomicBool::new(false),
            keyed: std::sync::atomic::AtomicBool::new(false),
            bucket_written: AtomicU64::new(0),
        })
    }

    /// Orders the group by key from now on (or stops), for every subscription of it in this
    /// process. Which of a key's messages are claimable is the claim index's window
    /// (`set_settings` sets both).
    pub fn set_keyed(&self, on: bool) {
        self.keyed.store(on, Ordering::Release);
    }

    /// The group's stored settings, if known (see `settings`).
    pub fn settings(&self) -> Option<Arc<WorkSettings>> {
        self.settings.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Installs the stored settings (read at open, or durably written): claims and outcomes
    /// decided from now on use them. Claimers are woken, as key ordering may have changed.
    pub fn set_settings(&self, settings: Arc<WorkSettings>) {
        // A per-key limit of `n` is key ordering with a window of `n` (`dispatch.rs`); with
        // neither, no window: whatever a key order or limit had parked is claimable at once.
        self.set_keyed(settings.ordered_by_key || settings.per_key_limit.is_some());
        let window = match (settings.per_key_limit, settings.ordered_by_key) {
            (Some(n), _) => n as usize,
            (None, true) => 1,
            (None, false) => usize::MAX,
        };
        let rate_before = self.settings().and_then(|s| s.rate_limit);
        {
            let mut d = self.dispatch();
            d.set_window(window);
            if settings.rate_limit.is_none() {
                // Its record is deleted with the limit (`writer/settings.rs`).
                d.bucket = Default::default();
            }
            if settings.rate_limit != rate_before {
                // What was written under another limit is not a floor for this one's writes
                // (the bucket in memory is cut to the new limit: `rate_limit.rs`).
                self.bucket_written.store(0, Ordering::Relaxed);
            }
        }
        *self.settings.lock().unwrap_or_else(|p| p.into_inner()) = Some(settings);
        self.changed.notify_waiters();
    }

    /// Records the dead-letter queue a record without stored terms names.
    pub fn set_recorded_dlq(&self, name: String) {
        *self.recorded_dlq.lock().unwrap_or_else(|p| p.into_inner()) = name;
    }

    /// The dead-letter queue to report while no settings are stored: the recorded one, or the
    /// default.
    pub fn recorded_dlq(&self) -> Arc<str> {
        let recorded = self.recorded_dlq.lock().unwrap_or_else(|p| p.into_inner());
        match recorded.as_str() {
            "" => Arc::from(crate::model::default_dead_letter_queue(&self.queue.name)),
            n => Arc::from(n),
        }
    }

    /// The refusal of an outcome or extension of attempt `attempt` on `seq` that this group no
    /// longer leases to its holder.
    pub fn lease_lost(&self, seq: u64, attempt: u32) -> crate::error::Error {
        crate::error::Error::LeaseLost {
            queue: self.queue.name.to_string(),
            group: self.name.to_string(),
            seq,
            attempt,
        }
    }

    /// Whether the group, or its queue, was deleted: its subscriptions end and its outcomes
    /// are refused (a group created again under the name is a new state).
    pub fn is_deleted(&self) -> bool {
        self.deleted.load(Ordering::Acquire) || self.queue.is_deleted()
    }

    /// Completes once the group (or its queue) is deleted: a worker pool whose feed is full
    /// polls no subscription, and waits on this as well.
    pub async fn wait_deleted(&self) {
        loop {
            // Created before the look: `notify_waiters` wakes it even if not polled yet.
            let notified = self.changed.notified();
            if self.is_deleted() {
                return;
            }
            notified.await;
        }
    }

    /// The writer deleted the group: marks it and wakes its subscriptions, which see it.
    pub fn mark_deleted(&self) {
        self.deleted.store(true, Ordering::Release);
        self.changed.notify_waiters();
        self.settled.notify_waiters();
        self.queue.poke();
    }

    /// Whether the group is ordered by key.
    pub fn keyed(&self) -> bool {
        self.keyed.load(Ordering::Acquire)
    }

    /// Slots whose ordering key is not known yet (restored at open, or claimed before the
    /// group was ordered by key): a keyed claim reads their keys first.
    pub fn unknown_keys(&self) -> Vec<u64> {
        self.dispatch().unknown_keys()
    }

    /// Sets the keys read for slots that did not know theirs (in sequence order).
    pub fn assign_keys(&self, keys: impl IntoIterator<Item = (u64, Option<u64>)>) {
        let mut d = self.dispatch();
        for (seq, key) in keys {
            d.assign_key(seq, key);
        }
    }

    /// The never-claimed sequences a keyed claim should read the keys of next: from the
    /// frontier, at most `max`, up to `last_published`; `None` if there are none, or if
    /// `max_ahead` messages read ahead are not handed out yet (parked or claimable: memory stays
    /// bounded, behind a hot key or a slow consumer).
    pub fn learn_window(&self, last_published: u64, max: u64, max_ahead: usize) -> Option<(u64, u64)> {
        let mut d = self.dispatch();
        let first = self.queue.first_seq.load(Ordering::Acquire);
        d.frontier = d.frontier.max(first);
        if d.unclaimed() >= max_ahead || d.frontier > last_published || max == 0 {
            return None;
        }
        Some((d.frontier, last_published.min(d.frontier + max - 1)))
    }

    /// Adds never-claimed sequences with their keys, read from the frontier on (a part another
    /// subscription learned meanwhile is skipped). Returns how many were added.
    pub fn learn(&self, keys: impl IntoIterator<Item = (u64, Option<u64>)>) -> usize {
        let mut d = self.dispatch();
        // After the dispatch lock, as every holder of both takes them.
        let index = self.queue.priorities_if_any();
        let mut n = 0;
        for (seq, key) in keys {
            d.skip_ahead();
            if seq < d.frontier {
                continue;
            }
            if seq > d.frontier {
                break;
            }
            d.learn(seq, key, index.as_ref().map_or(0, |ix| ix.of(seq)));
            n += 1;
        }
        n
    }

    fn dispatch(&self) -> MutexGuard<'_, Dispatch> {
        self.dispatch.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn progress(&self) -> MutexGuard<'_, Progress> {
        self.progress.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Rebuilds the state from the claim records found at open (one pass, in sequence order).
    /// A lease from before the restart has no living holder, so its message is claimable at
    /// once; its attempt stays counted, which is what stops a message that crashes the process
    /// from looping forever.
    pub fn restore(&self, claims: impl IntoIterator<Item = (u64, Claim)>, clock: &Clock) {
        let mut d = self.dispatch();
        let mut p = self.progress();
        let index = self.queue.priorities_if_any();
        let priority_of = |seq: u64| index.as_ref().map_or(0, |ix| ix.of(seq));
        let committed = p.offset;
        // Prioritised messages may have been claimed ahead of the frontier: their records do
        // not move it (the plain ones' records do), they are put ahead of it below. A group
        // ordered by key claims only what it has read (learned) in order, below its frontier:
        // every record moves it, as before priorities.
        let keyed = self.keyed();
        let mut prioritised = Vec::new();
        for (seq, claim) in claims {
            if seq <= committed {
                continue;
            }
            let priority = priority_of(seq);
            if priority > 0 && !keyed {
                prioritised.push((seq, priority));
            } else {
                d.frontier = d.frontier.max(seq + 1);
            }
            let slot = match claim {
                Claim::Done => {
                    p.done.insert(seq);
                    continue;
                }
                Claim::Leased { attempt, .. } => Slot::available(attempt, String::new()),
                Claim::Waiting { attempt, not_before_micros, last_error, .. } => Slot {
                    state: SlotState::Waiting { due: clock.instant_at_wall(not_before_micros) },
                    ..Slot::available(attempt, last_error)
                },
            };
            d.insert(seq, Slot { priority, ..slot });
        }
        // Sequences below the frontier with no record were claimed in a batch that never
        // reached the disk: nobody holds them.
        d.frontier = d.frontier.max(committed + 1);
        for seq in committed + 1..d.frontier {
            if !p.done.contains(seq) {
                d.insert_missing(
                    seq,
                    Slot { priority: priority_of(seq), ..Slot::available(0, String::new()) },
                );
            }
        }
        // Prioritised ones past it were claimed ahead of it; so were those of their priority
        // before them (each priority is claimed in order), whose records never reached the
        // disk: nobody holds those.
        for &(seq, priority) in &prioritised {
            d.restore_ahead(seq, priority);
        }
        if let Some(ix) = index.as_ref().filter(|_| !keyed) {
            for priority in ix.levels() {
                for seq in ix.range_of(priority, d.frontier, d.cursor(priority)) {
                    if !p.done.contains(seq) && d.get(seq).is_none() {
                        d.insert(seq, Slot { priority, ..Slot::available(0, String::new()) });
                        d.restore_ahead(seq, priority);
                    }
                }
            }
        }
        // Finished messages right above the offset: written by versions whose trims did not
        // move the offset over them. Passed in memory; the record follows at the next move.
        p.offset = p.done.advance() - 1;
    }

    fn token(&self) -> u64 {
        self.next_token.fetch_add(1, Ordering::Relaxed)
    }

    /// Claims up to `max` messages, highest priority first and oldest first within one:
    /// released ones, expired leases, due retries, never-claimed sequences up to
    /// `last_published` (every `share`-th claim the oldest of them whatever its priority; 0:
    /// strictly by priority). Messages whose attempts are used up
    /// come back in `exhausted` (already marked settling) instead. O(log n) per message taken,
    /// however many wait (see `dispatch.rs`).
    pub fn take(
        &self,
        now: Instant,
        max: usize,
        last_published: u64,
        lease: Duration,
        max_attempts: u32,
        share: u32,
    ) -> Take {
        let mut out = Take::default();
        let mut d = self.dispatch();
        // Read under the dispatch lock, which the writer holds while it bumps it.
        let epoch = self.epoch.load(Ordering::Acquire);
        let deadline = now.checked_add(lease).unwrap_or(now + FAR_FUTURE);
        // Retention may have deleted the head: nothing below the first live sequence is claimable.
        let first = self.queue.first_seq.load(Ordering::Acquire);
        d.frontier = d.frontier.max(first);
        d.fire_due(now);
        d.begin_claims();
        // Ordered by key, a slot whose key is unknown may have to park: nothing is claimed
        // until the claimer has read them all. Never-claimed messages are learned (with their
        // keys) before they can be claimed, and only from `ready`: no fresh claims, and no
        // prioritised ones ahead of their keys.
        let keyed = self.keyed();
        let blocked = keyed && d.has_unknown_keys();
        let index = self.queue.priorities_if_any();
        // The group's durable limits (`WorkGroup::rate_limit`, `concurrency_limit`): checked
        // before each claim, a token taken only by a claim that hands a job out.
        let limits = self.limits();
        let mut room = limits.concurrency.map(|n| (n as usize).saturating_sub(d.leased() + d.settling()));
        // A stale view waits for the watch to teach what it misses (its writes would be
        // refused).
        let stale = limits.view_stale(&d);
        if limits.on_claims() {
            out.limit_rev = Some(d.limit_seen);
            out.limited |= stale;
        }
        while !blocked && !stale && out.claimed.len() < max {
            if room == Some(0) {
                out.limited = true;
                break;
            }
            if let Some(rate) = &limits.rate
                && let Some(at) = d.bucket.next_at(rate).filter(|at| *at > now)
            {
                out.limited = true;
                out.next_wake = Some(at);
                break;
            }
            let Some(pick) = d.pick(first, last_published, index.as_deref(), !keyed, share) else { break };
            let token = self.token();
            match pick {
                Pick::Ready(seq) => {
                    let Some(slot) = d.get(seq) else { continue };
                    let (attempt, expired) = (slot.attempt, slot.expired);
                    if attempt >= max_attempts {
                        // Empty: the last attempt's lease ran out with no outcome recorded.
                        let last_error = slot.last_error.clone();
                        // `pick` left it settling.
                        out.exhausted.push(Exhausted { seq, attempt, last_error, epoch });
                        continue;
                    }
                    d.set(seq, SlotState::Leased { token, deadline }, |s| {
                        s.attempt += 1;
                        s.expired = false;
                    });
                    out.claimed.push(Claimed { seq, attempt: attempt + 1, token, deadline, expired, epoch });
                }
                Pick::Fresh(seq, priority) => {
                    // The frontier's pick does not look its priority up; its retries need it.
                    let priority = match (priority, &index) {
                        (0, Some(ix)) => ix.of(seq),
                        _ => priority,
                    };
                    d.insert(
                        seq,
                        Slot {
                            attempt: 1,
                            state: SlotState::Leased { token, deadline },
                            priority,
                            ..Slot::available(0, String::new())
                        },
                    );
                    out.claimed.push(Claimed { seq, attempt: 1, token, deadline, expired: false, epoch });
                }
            }
            // Reached only by a claim (an exhausted job went on above, without a token).
            room = room.map(|r| r.saturating_sub(1));
            if let Some(rate) = &limits.rate {
                d.bucket.try_take(rate, now);
                out.rate_tat = d.bucket.tat;
            }
        }
        let timer = d.next_timer();
        out.next_wake = match (out.next_wake, timer) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        out
    }

    /// The group's stored limits (none until its settings are known).
    fn limits(&self) -> Limits {
        self.settings().map_or(Limits::default(), |s| Limits {
            rate: s.rate_limit,
            concurrency: s.concurrency_limit,
            per_key: s.per_key_limit.is_some(),
        })
    }

    /// Whether a limit holds every claim back at `now`: the concurrency limit is reached, the
    /// rate limit has no token, or (the etcd engine) the view is known to miss another
    /// process's limited claims.
    fn limit_reached(&self, d: &Dispatch, limits: &Limits, now: Instant) -> bool {
        let full = limits.concurrency.is_some_and(|n| d.leased() + d.settling() >= n as usize);
        let dry = limits.rate.as_ref().is_some_and(|r| d.bucket.next_at(r).is_some_and(|at| at > now));
        full || dry || limits.view_stale(d)
    }

    /// Jobs a claim could take now but the group's limits hold back: the claimable ones when
    /// the rate or concurrency limit is reached, and those parked behind their key's first `n`
    /// under a per-key limit. Never-claimed messages count as claimable, except in a group
    /// ordered by key or limited per key (which learns their keys first: some may park).
    pub fn limited(&self, now: Instant) -> u64 {
        let limits = self.limits();
        if !limits.on_claims() && !limits.per_key {
            return 0;
        }
        let d = self.dispatch();
        let held_back = match self.limit_reached(&d, &limits, now) {
            true => d.claimable_count(self.queue.last_seq(), !self.keyed()),
            false => 0,
        };
        held_back + if limits.per_key { d.parked() as u64 } else { 0 }
    }

    /// The writer, as it writes a claim batch: the rate bucket's state to write with it — the
    /// latest of what it was handed and what it wrote before (claims decided in one order
    /// may reach the writer in another; the bucket only moves forward). Wall-clock micros.
    pub fn bucket_to_write(&self, tat_micros: u64) -> u64 {
        self.bucket_written.fetch_max(tat_micros, Ordering::AcqRel).max(tat_micros)
    }

    /// The etcd engine: the group's limit record as written at `rev` (`tat_micros`: its rate
    /// bucket, wall micros; 0: none), learned after the claims written with it. Claims may be
    /// decided on this view again once it is as new as every revision known.
    #[allow(dead_code)] // the etcd engine's (what other processes wrote)
    pub fn learn_limit(&self, tat_micros: u64, rev: i64, clock: &crate::clock::Clock) {
        {
            let mut d = self.dispatch();
            d.limit_seen = d.limit_seen.max(rev);
            d.limit_known = d.limit_known.max(rev);
            // Whatever this process's settings say now: a rate limit another process set may
            // reach them after its claims' bucket did. (A removed limit's bucket is emptied
            // in the record itself, so one set again starts full.)
            if tat_micros > 0 {
                let now = clock.now();
                d.bucket.learn(clock.instant_at_wall(tat_micros), now);
            }
        }
        self.changed.notify_waiters();
    }

    /// The etcd engine: the group's limit record is known to be at `rev` (a refused claim
    /// found it there), whose claims may not be learned yet: no limited claim is decided
    /// until [`learn_limit`](Self::learn_limit) reaches it.
    #[allow(dead_code)] // the etcd engine's
    pub fn note_limit(&self, rev: i64) {
        let mut d = self.dispatch();
        d.limit_known = d.limit_known.max(rev);
    }

    /// Whether a limited claim decided on the view of revision `rev` (`Take::limit_rev`)
    /// still stands: no limited claim of another process was learned since.
    #[allow(dead_code)] // the etcd engine's
    pub fn limit_view_current(&self, rev: i64) -> bool {
        rev >= self.dispatch().limit_known
    }

    /// At open (`now`): the rate bucket as the last claims left it (`tat` on this process's
    /// clock).
    pub fn restore_bucket(&self, tat: Instant, micros: u64, now: Instant) {
        self.dispatch().bucket = crate::rate_limit::Bucket::restored(tat, now);
        self.bucket_written.store(micros, Ordering::Relaxed);
    }

    /// Takes message `seq` for an operator's action on it (`Broker::delete_job` and its
    /// siblings): it must be stored, unfinished, and not held by a live lease or on its way to
    /// the writer. On success it is settling, as a holder's settle makes it: nobody else can
    /// claim or settle it until the writer applies the action (or `revert` gives it back).
    /// `waiting_only`: refuse unless it waits for a retry (retry-now has nothing to do
    /// otherwise). A never-claimed message moves the frontier past it; the sequences skipped
    /// become claimable slots, as restored ones are (at most [`MAX_REACH`] of them).
    pub fn operator_take(&self, seq: u64, now: Instant, waiting_only: bool) -> Result<Operated, Refused> {
        let mut d = self.dispatch();
        let first = self.queue.first_seq.load(Ordering::Acquire);
        if seq < first || seq <= self.durable.load(Ordering::Acquire) {
            return Err(Refused::Finished);
        }
        if seq > self.queue.last_seq() {
            return Err(Refused::NotSent);
        }
        let token = self.token();
        match d.get(seq).map(|s| (s.state, s.attempt, s.last_error.clone())) {
            Some((state, attempt, last_error)) => {
                match state {
                    SlotState::Leased { deadline, .. } if now < deadline => {
                        return Err(Refused::State("leased"));
                    }
                    SlotState::Settling => return Err(Refused::State("being settled")),
                    SlotState::Waiting { .. } => {}
                    _ if waiting_only => {
                        return Err(Refused::State(if state == SlotState::Parked {
                            "parked behind its key"
                        } else {
                            "claimable now"
                        }));
                    }
                    _ => {}
                }
                d.set(seq, SlotState::Settling, |_| {});
                let epoch = self.epoch.load(Ordering::Acquire);
                Ok(Operated { attempt, last_error, token, epoch, previous: TakenFrom(state) })
            }
            // Below the frontier (or claimed ahead of it) without a slot: finished, its offset
            // move not durable yet.
            None if seq < d.frontier.max(first) || d.is_ahead(seq) => Err(Refused::Finished),
            None if waiting_only => Err(Refused::State("claimable now")),
            None => {
                if seq - d.frontier.max(first) > MAX_REACH {
                    return Err(Refused::TooFarAhead);
                }
                d.frontier = d.frontier.max(first);
                reach(&mut d, seq, &self.queue);
                let priority = self.queue.priority_of(seq);
                d.insert(
                    seq,
                    Slot { state: SlotState::Settling, priority, ..Slot::available(0, String::new()) },
                );
                Ok(Operated {
                    attempt: 0,
                    last_error: String::new(),
                    token,
                    epoch: self.epoch.load(Ordering::Acquire),
                    previous: TakenFrom(SlotState::Available),
                })
            }
        }
    }

    /// Where `seq` stands in this process's view (`Broker::job`), read under the dispatch lock
    /// and changing nothing; `None` if it was never sent. On the etcd engine the view includes
    /// what other processes' claim records said, as the watch delivered them. The holder is left
    /// for the caller (it is in the claim record, not in memory).
    pub fn status(&self, seq: u64, now: Instant) -> Option<JobStatus> {
        let d = self.dispatch();
        if seq == 0 || seq > self.queue.last_seq() {
            return None;
        }
        let of = |state: JobState, attempt: u32, last_error: &str| JobStatus {
            seq,
            state,
            attempt,
            last_error: (!last_error.is_empty()).then(|| last_error.to_owned()),
            holder: None,
            outcome: None,
            progress: None,
            priority: self.queue.priority_of(seq),
        };
        // Retention's trim moves the group's offset over what it deleted, so the offset cannot
        // tell a finished job from a deleted one: the queue's head is asked first.
        if seq < self.queue.first_seq.load(Ordering::Acquire) {
            return Some(of(JobState::Removed, 0, ""));
        }
        if seq <= self.durable.load(Ordering::Acquire) {
            return Some(of(JobState::Finished, 0, ""));
        }
        let limits = self.limits();
        let per_key = limits.per_key;
        let limited = limits.on_claims() && self.limit_reached(&d, &limits, now);
        let Some(slot) = d.get(seq) else {
            // Below the frontier without a slot: claimed and finished, its offset move not
            // durable yet. From the frontier on: never claimed.
            let finished = seq < d.frontier || d.is_ahead(seq);
            let state = match (finished, limited && !self.keyed()) {
                (true, _) => JobState::Finished,
                (false, true) => JobState::Limited,
                (false, false) => JobState::Queued,
            };
            return Some(of(state, 0, ""));
        };
        let state = match slot.state {
            SlotState::Available if slot.expired => JobState::Expired,
            SlotState::Available if limited => JobState::Limited,
            SlotState::Available => JobState::Queued,
            SlotState::Parked if per_key => JobState::Limited,
            SlotState::Parked => JobState::Parked,
            SlotState::Settling => JobState::Settling,
            SlotState::Leased { deadline, .. } if deadline > now => {
                JobState::Leased { lease_remaining: deadline - now }
            }
            SlotState::Leased { .. } => JobState::Expired,
            SlotState::Waiting { due } if due > now => JobState::RetryWaiting { due_in: due - now },
            SlotState::Waiting { .. } if limited => JobState::Limited,
            SlotState::Waiting { .. } => JobState::Queued,
        };
        let mut status = of(state, slot.attempt, &slot.last_error);
        status.progress = slot.progress.as_deref().cloned();
        Some(status)
    }

    /// Starts settling `seq` for the holder of `token`: fails if the lease expired or the
    /// message was claimed again since.
    pub fn begin_settle(&self, seq: u64, token: u64, now: Instant) -> Result<(), Lost> {
        let mut d = self.dispatch();
        match d.get(seq).map(|s| s.state) {
            Some(SlotState::Leased { token: t, deadline }) if t == token && now < deadline => {
                d.set(seq, SlotState::Settling, |_| {});
                Ok(())
            }
            _ => Err(Lost),
        }
    }

    /// A retry record was queued: the message waits until `due` — if its slot is still
    /// settling. One that is not was moved on meanwhile by something newer (a reset, or on etcd
    /// another process's claim after the lease ran out): that stands, and waiting here would
    /// later claim over the other holder's live lease (review finding).
    pub fn to_waiting(&self, seq: u64, due: Instant, error: String) {
        {
            let mut d = self.dispatch();
            if d.get(seq).is_some_and(|s| s.state == SlotState::Settling) {
                d.set(seq, SlotState::Waiting { due }, |s| s.last_error = error);
            }
        }
        self.changed.notify_waiters();
    }

    /// A settle was abandoned before its record was queued: the message is claimable again —
    /// or parked, if an earlier message with its key is unfinished (an operator may have taken
    /// a parked message: giving it back claimable would break its key's order).
    pub fn revert(&self, seq: u64) {
        {
            let mut d = self.dispatch();
            if d.get(seq).is_some_and(|s| s.state == SlotState::Settling) {
                let state = if d.behind_its_key(seq) { SlotState::Parked } else { SlotState::Available };
                d.set(seq, state, |_| {});
            }
        }
        self.changed.notify_waiters();
    }

    /// An operator's action (`operator_take`) was abandoned before the writer had it: the
    /// message goes back to the state it was taken from (a retry keeps its due time), as
    /// `revert` would if that state no longer applies.
    pub fn operator_revert(&self, seq: u64, previous: TakenFrom) {
        let TakenFrom(previous) = previous;
        {
            let mut d = self.dispatch();
            if d.get(seq).is_some_and(|s| s.state == SlotState::Settling) {
                let state = match previous {
                    SlotState::Waiting { .. } => previous,
                    _ if d.behind_its_key(seq) => SlotState::Parked,
                    _ => SlotState::Available,
                };
                d.set(seq, state, |_| {});
            }
        }
        self.changed.notify_waiters();
    }

    /// A settle that was queued as part of a transaction the writer refused: the holder of
    /// `token` holds the lease again, until `deadline` (it may have passed: the lease then
    /// expires as any other). Only within the reset epoch it was claimed in: after a reset the
    /// slot may be another holder's settle (review finding), and the reset forgot this one.
    pub fn unsettle(&self, seq: u64, token: u64, deadline: Instant, epoch: u64) {
        {
            let mut d = self.dispatch();
            // Resets bump the epoch under this lock.
            if self.epoch() == epoch && d.get(seq).is_some_and(|s| s.state == SlotState::Settling) {
                d.set(seq, SlotState::Leased { token, deadline }, |_| {});
            }
        }
        self.changed.notify_waiters();
    }

    /// The holder of `token` gives the message back. `counted: false` also gives back the
    /// attempt (the handler never ran, or was stopped by a shutdown).
    pub fn release(&self, seq: u64, token: u64, counted: bool) {
        {
            let mut d = self.dispatch();
            if matches!(d.get(seq).map(|s| s.state), Some(SlotState::Leased { token: t, .. }) if t == token) {
                d.set(seq, SlotState::Available, |s| {
                    if !counted {
                        s.attempt = s.attempt.saturating_sub(1);
                    }
                });
            }
        }
        self.changed.notify_waiters();
    }

    /// Moves the holder's lease deadline to `until`.
    pub fn extend(&self, seq: u64, token: u64, now: Instant, until: Instant) -> Result<(), Lost> {
        let mut d = self.dispatch();
        match d.get(seq).map(|s| s.state) {
            Some(SlotState::Leased { token: t, deadline }) if t == token && now < deadline => {
                d.set(seq, SlotState::Leased { token, deadline: until }, |_| {});
                Ok(())
            }
            _ => Err(Lost),
        }
    }

    /// Brings the holder's lease deadline forward to `deadline` if it is later (the etcd
    /// engine: an extension that was not written). The claimers look again: the lease may have
    /// run out already.
    #[allow(dead_code)] // the etcd engine's
    pub fn cap_lease(&self, seq: u64, token: u64, deadline: Instant) {
        {
            let mut d = self.dispatch();
            match d.get(seq).map(|s| s.state) {
                Some(SlotState::Leased { token: t, deadline: was }) if t == token && deadline < was => {
                    d.set(seq, SlotState::Leased { token, deadline }, |_| {});
                }
                _ => return,
            }
        }
        self.changed.notify_waiters();
    }

    /// Queues an ack (already fenced by `begin_settle`). Returns true if the queue was empty:
    /// the caller then hands the group to the writer.
    pub fn queue_ack(&self, ack: QueuedAck) -> bool {
        let mut q = self.queued_acks.lock().unwrap_or_else(|p| p.into_inner());
        q.push(ack);
        q.len() == 1
    }

    /// The holder of `token` reports progress `report` on `seq`: kept on the slot at once (what
    /// `Broker::job` and the next attempt read) and queued for the writer. Fenced like an
    /// extension: the lease must be this holder's and running. Returns whether the group must
    /// be marked for the writer (nothing was queued before).
    pub fn report_progress(
        &self,
        seq: u64,
        token: u64,
        now: Instant,
        report: bytes::Bytes,
    ) -> Result<bool, Lost> {
        let mut d = self.dispatch();
        let Some(slot) = d.get_mut_unindexed(seq) else { return Err(Lost) };
        match slot.state {
            SlotState::Leased { token: t, deadline } if t == token && now < deadline => {}
            _ => return Err(Lost),
        }
        slot.progress = Some(Box::new(report.clone()));
        self.has_progress.store(true, Ordering::Release);
        // Queued under the dispatch lock: a reset (which takes it) either comes first and this
        // holder's lease is gone, or after, and drops what is queued.
        let mut q = self.queued_progress.lock().unwrap_or_else(|p| p.into_inner());
        q.insert(seq, report);
        Ok(q.len() == 1)
    }

    /// Whether the group's stored settings now keep job outcomes.
    pub fn keeps_outcomes(&self) -> bool {
        self.settings().is_some_and(|s| !s.keep_outcomes.is_zero())
    }

    /// The writer takes every queued progress report.
    pub fn take_queued_progress(&self) -> std::collections::HashMap<u64, bytes::Bytes> {
        // The writer asks every round: a group that never reported skips the lock.
        if !self.has_progress.load(Ordering::Acquire) {
            return std::collections::HashMap::new();
        }
        std::mem::take(&mut *self.queued_progress.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// Whether a report on `seq` is queued here, not yet handed to the writer.
    pub fn progress_queued(&self, seq: u64) -> bool {
        self.has_progress.load(Ordering::Acquire)
            && self.queued_progress.lock().unwrap_or_else(|p| p.into_inner()).contains_key(&seq)
    }

    /// `seq`'s last progress report, of this attempt or an earlier one.
    pub fn last_progress(&self, seq: u64) -> Option<bytes::Bytes> {
        self.dispatch().get(seq).and_then(|s| s.progress.as_deref().cloned())
    }

    /// The writer finishes `seq`: drops its progress report from memory. Returns whether it
    /// had one (its record goes in the same batch).
    pub fn forget_progress(&self, seq: u64) -> bool {
        // Asked for every finished job: a group that never reported skips the dispatch lock.
        if !self.has_progress.load(Ordering::Acquire) {
            return false;
        }
        self.dispatch().get_mut_unindexed(seq).and_then(|s| s.progress.take()).is_some()
    }

    /// A progress report found at open.
    pub fn restore_progress(&self, seq: u64, report: bytes::Bytes) {
        self.has_progress.store(true, Ordering::Release);
        if let Some(slot) = self.dispatch().get_mut_unindexed(seq) {
            slot.progress = Some(Box::new(report));
        }
    }

    /// The writer takes every queued ack.
    pub fn take_queued_acks(&self) -> Vec<QueuedAck> {
        std::mem::take(&mut *self.queued_acks.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// The current reset epoch.
    pub fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::Acquire)
    }

    /// The writer made these outcomes `(seq, epoch finished in)` durable: forget them. A key
    /// whose head finished hands its next message to the claimers. One finished before a reset
    /// that has been applied since is skipped: the reset already forgot it, and the slot now
    /// under that sequence is a new claim's.
    pub fn finished(&self, seqs: &[(u64, u64)]) {
        let mut promoted = false;
        {
            let mut d = self.dispatch();
            // Read under the dispatch lock, which the writer holds while it bumps it.
            let epoch = self.epoch.load(Ordering::Acquire);
            for &(seq, finished_in) in seqs {
                if finished_in == epoch {
                    promoted |= d.remove(seq);
                }
            }
        }
        // A finished job frees a place under a concurrency limit: claimers waiting for one
        // look again (nothing else would wake them).
        if promoted || self.limits().concurrency.is_some() {
            self.changed.notify_waiters();
        }
        self.settled.notify_waiters();
    }

    /// Writer only, when it applies a reset to `offset`: every claim is forgotten, claiming
    /// restarts after it, and the epoch moves on so that nothing decided before the reset
    /// (claims, outcomes, queued acks still on their way to the writer) is applied after it.
    /// Done on the writer thread as the reset enters its batch, not when it is durable, so a
    /// claim made meanwhile already starts from the new offset.
    pub fn reset(&self, offset: u64) {
        let mut d = self.dispatch();
        d.clear(offset + 1);
        self.epoch.fetch_add(1, Ordering::AcqRel);
        drop(d);
        drop(self.take_queued_acks());
        self.changed.notify_waiters();
        // (`settled` is signalled once the reset is durable: by the writer, or on etcd by
        // `Known::reset`.)
    }

    /// Retention deleted everything up to `to`: forget it and never claim it.
    pub fn skip_to(&self, to: u64) {
        self.dispatch().drop_through(to, None);
        self.changed.notify_waiters();
        self.settled.notify_waiters();
    }

    /// Counts and reports a subscription or pool that stayed at its bound of `max` too long.
    pub fn report_saturation(&self, events: &tokio::sync::broadcast::Sender<Event>, max: usize) {
        self.saturations.fetch_add(1, Ordering::Relaxed);
        crate::telemetry::group_counter(crate::telemetry::SATURATED, &self.queue.name, &self.name, 1);
        tracing::warn!(
            queue = %self.queue.name,
            group = %self.name,
            max_in_flight = max,
            "rockq: work-queue consumer saturated: its in-flight bound stayed full"
        );
        if events.receiver_count() > 0 {
            let _ = events.send(Event::Saturated {
                queue: self.queue.name.clone(),
                group: self.name.clone(),
                max_in_flight: max,
            });
        }
    }

    /// Messages currently leased.
    pub fn leased(&self) -> usize {
        self.dispatch().leased()
    }

    /// Whether a job of the group is held in this process at `now`: under a lease not yet run
    /// out (another process's leases, which the etcd engine mirrors, are its own to count). An expired
    /// lease is no one's any more (its holder's outcome is refused), and an outcome already
    /// being written (`Settling`) carries the group's epoch, which a reset fences: neither keeps
    /// a reset out.
    pub fn held(&self, now: Instant) -> bool {
        self.dispatch().held(now)
    }

    /// Messages leased under a lease not yet run out at `now`.
    pub fn live_leased(&self, now: Instant) -> usize {
        self.dispatch().live_leased(now)
    }

    /// Messages waiting for a retry.
    pub fn waiting(&self) -> usize {
        self.dispatch().waiting()
    }

    /// The live leases of this process: sequence → (attempt, deadline). Extensions live only
    /// here (see `engine/inspect.rs`), so admin reads overlay them on the claim records.
    pub fn live_leases(&self) -> Vec<(u64, u32, Instant)> {
        let mut out: Vec<_> = self.dispatch().leases().collect();
        out.sort_unstable_by_key(|l| l.0);
        out
    }

    /// The etcd engine: another process wrote `seq`'s claim record (or it was read at load).
    /// Its lease is held under a token no holder here has (so it is nobody's here until its
    /// deadline), its retry waits, and a finished one is forgotten and counted finished.
    /// Sequences between the frontier and `seq` that nobody claimed become claimable.
    #[allow(dead_code)] // the etcd engine's (what other processes wrote)
    pub fn learn_claim(&self, seq: u64, claim: &Claim, clock: &Clock) {
        {
            let mut d = self.dispatch();
            let mut p = self.progress();
            if seq <= p.offset {
                return;
            }
            self.learned(&mut d, seq);
            // A retry, or a lease that runs out, is urgent if it has a priority.
            let priority = self.queue.priority_of(seq);
            match claim {
                Claim::Done => {
                    p.finish(seq);
                    d.remove(seq);
                    self.settled.notify_waiters();
                }
                Claim::Leased { attempt, deadline_micros, .. } => {
                    let deadline = clock.instant_at_wall(*deadline_micros);
                    d.insert_missing(seq, Slot { priority, ..Slot::available(*attempt, String::new()) });
                    d.set(seq, SlotState::Leased { token: FOREIGN_TOKEN, deadline }, |s| {
                        s.attempt = *attempt
                    });
                }
                Claim::Waiting { attempt, not_before_micros, last_error, .. } => {
                    let due = clock.instant_at_wall(*not_before_micros);
                    d.insert_missing(seq, Slot { priority, ..Slot::available(*attempt, String::new()) });
                    d.set(seq, SlotState::Waiting { due }, |s| {
                        s.attempt = *attempt;
                        s.last_error = last_error.clone();
                    });
                }
            }
        }
        self.changed.notify_waiters();
    }

    /// The etcd engine: a claim lost `lost` of its sequences to another process's; the next
    /// claims start past as many fresh ones (`Dispatch::begin_claims`).
    #[allow(dead_code)] // the etcd engine's (what other processes wrote)
    pub fn note_overlap(&self, lost: u64) {
        self.dispatch().note_overlap(lost);
    }

    /// The etcd engine: `seq` is finished (its record went with an offset move, or its outcome
    /// here was written).
    #[allow(dead_code)] // the etcd engine's (what other processes wrote)
    pub fn learn_finished(&self, seq: u64) {
        {
            let mut d = self.dispatch();
            let mut p = self.progress();
            if seq > p.offset {
                self.learned(&mut d, seq);
                p.finish(seq);
            }
            d.remove(seq);
        }
        self.changed.notify_waiters();
        self.settled.notify_waiters();
    }

    /// The etcd engine: whether `seq` is still leased to the holder of `token` (nothing learned
    /// since the claim was decided took it elsewhere).
    #[allow(dead_code)] // the etcd engine's (what other processes wrote)
    pub fn holds_lease(&self, seq: u64, token: u64) -> bool {
        matches!(self.dispatch().get(seq).map(|s| s.state), Some(SlotState::Leased { token: t, .. }) if t == token)
    }

    /// The etcd engine: whether an outcome of `seq` is on its way (nothing learned since it was
    /// decided moved the slot elsewhere).
    #[allow(dead_code)] // the etcd engine's (what other processes wrote)
    pub fn is_settling(&self, seq: u64) -> bool {
        self.dispatch().get(seq).is_some_and(|s| s.state == SlotState::Settling)
    }

    /// The etcd engine: the stored offset is at least `offset` (another process moved it):
    /// everything up to it is finished — another process's lease too: its holder's ack moved
    /// the offset in the transaction that finished the job (`store/etcd/work.rs`), so a group
    /// ordered by key starts the key's next message. (A trim or purge that passes a message
    /// another process is running reads the same: that handler may still be running then.)
    #[allow(dead_code)] // the etcd engine's (what other processes wrote)
    /// `written(seq, token)`: whether this process's lease of `seq` at or below it, by `token`,
    /// had its claim written (only those may have a handler running: `Dispatch::drop_through`).
    pub fn learn_offset(&self, offset: u64, written: &dyn Fn(u64, u64) -> bool) {
        {
            let mut d = self.dispatch();
            let mut p = self.progress();
            if offset > p.offset {
                p.trim_to(offset);
            }
            d.drop_through(offset, Some(written));
        }
        self.changed.notify_waiters();
    }

    /// The etcd engine: a claim write found `seq` with no record above the offset (nobody
    /// claimed it): claimable.
    #[allow(dead_code)] // the etcd engine's (what other processes wrote)
    pub fn learn_unclaimed(&self, seq: u64) {
        {
            let mut d = self.dispatch();
            if seq <= self.progress().offset {
                return;
            }
            self.learned(&mut d, seq);
            let priority = self.queue.priority_of(seq);
            d.insert_missing(seq, Slot { priority, ..Slot::available(0, String::new()) });
            if d.get(seq).is_some_and(|s| s.state == SlotState::Settling) {
                // Behind its key (an operator's action on a parked job that etcd refused):
                // parked again, as `operator_revert` does, not claimable beside its key's head.
                let state = if d.behind_its_key(seq) { SlotState::Parked } else { SlotState::Available };
                d.set(seq, state, |_| {});
            }
        }
        self.changed.notify_waiters();
    }

    /// The sequences a claim at `now` could take: for tests.
    #[cfg(test)]
    pub fn claimable(&self, now: Instant) -> Vec<u64> {
        let first = self.queue.first_seq.load(Ordering::Acquire);
        self.dispatch().claimable(now, first)
    }
}

/// The most never-claimed sequences an operator's action on a later one may turn into slots.
pub(crate) const MAX_REACH: u64 = 100_000;

/// A message taken for an operator's action: its attempts so far and last error, and the
/// token and reset epoch it was taken under.
#[derive(Debug)]
pub(crate) struct Operated {
    pub attempt: u32,
    pub last_error: String,
    pub token: u64,
    pub epoch: u64,
    /// The state it was taken from (`operator_revert` restores it).
    pub previous: TakenFrom,
}

/// The claim state a message was taken from for an operator's action (opaque outside the
/// registry).
#[derive(Debug, Clone, Copy)]
pub(crate) struct TakenFrom(SlotState);

/// Why an operator's action on one message was refused.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Refused {
    /// Finished (acked, dead-lettered) or deleted by retention.
    Finished,
    /// Beyond the queue's last sequence.
    NotSent,
    /// Its state does not allow the action (`leased`, `being settled`, `claimable now`, ...).
    State(&'static str),
    /// More than [`MAX_REACH`] never-claimed messages lie before it.
    TooFarAhead,
}

impl WorkGroupState {
    /// The etcd engine: another process's record of `seq` was learned (or the refusal of a
    /// claim found it unclaimed). At or above the frontier it is put ahead of it, as the
    /// restore puts a claim made ahead: the frontier passes it when it gets there, and the
    /// never-claimed messages before it are claimed from the frontier as usual — a claim far
    /// ahead (a prioritised message's) makes no slot for every message before it. No
    /// priority's cursor moves: its priority may not be known here yet (the namespace watch
    /// brings it), and one of its priority below it may be unclaimed still; the index offering
    /// it passes over it (`Dispatch::pick`). A group ordered by key learns the keys of what
    /// lies before it, in order: the frontier moves past it (`reach`).
    fn learned(&self, d: &mut Dispatch, seq: u64) {
        match self.keyed() {
            true => reach(d, seq, &self.queue),
            false => d.put_ahead(seq),
        }
    }
}

/// Moves the frontier past `seq`: the sequences skipped were never claimed, so they are
/// claimable (a slot each, as restored ones are).
fn reach(d: &mut Dispatch, seq: u64, queue: &QueueState) {
    let index = queue.priorities_if_any();
    loop {
        // Those claimed ahead of the frontier are held or finished: not claimable again.
        d.skip_ahead();
        if d.frontier >= seq {
            break;
        }
        let s = d.frontier;
        let priority = index.as_ref().map_or(0, |ix| ix.of(s));
        d.insert_missing(s, Slot { priority, ..Slot::available(0, String::new()) });
        d.frontier += 1;
    }
    d.frontier = d.frontier.max(seq + 1);
}

/// The claim state machine on its own (without a broker): which slot moves where, and what
/// each transition refuses. The end-to-end behaviour is in `tests/work_groups.rs` and the
/// model test; these pin the rules one transition at a time.
#[cfg(test)]
mod tests {
    use super::*;

    const LEASE: Duration = Duration::from_secs(10);
    const MAX: u32 = 3;

    fn group(committed: u64) -> Arc<WorkGroupState> {
        let queue = QueueState::new(1, "q", 1, 100, crate::retention::Retention::Forever);
        WorkGroupState::new("w", queue, committed)
    }

    fn seqs(t: &Take) -> Vec<(u64, u32)> {
        t.claimed.iter().map(|c| (c.seq, c.attempt)).collect()
    }

    #[test]
    fn claims_go_oldest_first_within_max_and_the_published_end() {
        let g = group(0);
        let now = Instant::now();
        assert_eq!(seqs(&g.take(now, 2, 3, LEASE, MAX, 0)), [(1, 1), (2, 1)]);
        assert_eq!(seqs(&g.take(now, 2, 3, LEASE, MAX, 0)), [(3, 1)], "nothing past the last published");
        assert!(g.take(now, 2, 3, LEASE, MAX, 0).claimed.is_empty());
        // A released message goes before never-claimed ones.
        let t = g.take(now, 1, 4, LEASE, MAX, 0);
        assert_eq!(seqs(&t), [(4, 1)]);
        let token = t.claimed[0].token;
        g.release(4, token, true);
        assert_eq!(seqs(&g.take(now, 2, 5, LEASE, MAX, 0)), [(4, 2), (5, 1)]);
    }

    /// Two processes claiming one group (etcd): after a claim lost sequences to another's,
    /// the next claims leave as many fresh ones to it, for as long as it takes them; a range
    /// left and not taken is claimed here next (nothing waits on a process that stopped).
    #[test]
    fn after_a_lost_overlap_fresh_claims_leave_a_range_to_the_other_process_while_it_takes_it() {
        let g = group(0);
        let clock = Clock::tokio();
        let now = clock.now();
        let theirs = |seq| {
            let lease =
                Claim::Leased { attempt: 1, token: 7, deadline_micros: u64::MAX / 2, holder: Arc::from("b") };
            g.learn_claim(seq, &lease, &clock);
        };
        // The other process's claim took 1..=3 first.
        g.note_overlap(3);
        assert_eq!(seqs(&g.take(now, 2, 100, LEASE, MAX, 0)), [(4, 1), (5, 1)]);
        // It took them (its records came through the watch): the next range is left to it too.
        for seq in 1..=3 {
            theirs(seq);
        }
        assert_eq!(seqs(&g.take(now, 2, 100, LEASE, MAX, 0)), [(9, 1), (10, 1)]);
        // It stopped: the range left (6..=8) is claimed here, then on past this process's own.
        assert_eq!(seqs(&g.take(now, 4, 100, LEASE, MAX, 0)), [(6, 1), (7, 1), (8, 1), (11, 1)]);
        // A range left is not waited for when nothing lies past it.
        g.note_overlap(100);
        assert_eq!(seqs(&g.take(now, 2, 100, LEASE, MAX, 0)), [(12, 1), (13, 1)]);
        // Two overlaps in a row, the first range not taken yet: the second range ends among
        // this process's own claims, which are never handed out twice.
        g.note_overlap(3);
        assert_eq!(seqs(&g.take(now, 2, 100, LEASE, MAX, 0)), [(17, 1), (18, 1)]);
        g.note_overlap(4);
        assert_eq!(seqs(&g.take(now, 2, 100, LEASE, MAX, 0)), [(19, 1), (20, 1)]);
        // Neither range was taken: everything left is claimed here, then on past its own.
        assert_eq!(seqs(&g.take(now, 4, 100, LEASE, MAX, 0)), [(14, 1), (15, 1), (16, 1), (21, 1)]);
    }

    /// The etcd engine: another process's claim of a prioritised message far ahead of the
    /// frontier, or of one this process has not seen published (its index entry may still be
    /// on its way), is put ahead of the frontier, not reached: no slot for every message
    /// before it, the backlog still claimed from the frontier, the claimed one never again.
    #[test]
    fn another_process_s_claim_far_ahead_is_put_ahead_of_the_frontier_not_reached() {
        const FAR: u64 = 1_000_000;
        let queue = QueueState::new(1, "q", 1, FAR, crate::retention::Retention::Forever);
        queue.index_priority(FAR, 5);
        let g = WorkGroupState::new("w", queue.clone(), 0);
        let clock = Clock::tokio();
        let now = clock.now();
        let theirs =
            Claim::Leased { attempt: 1, token: 7, deadline_micros: u64::MAX / 2, holder: Arc::from("b") };
        g.learn_claim(FAR, &theirs, &clock);
        assert_eq!(g.dispatch().unclaimed(), 0, "no slot for the messages before it");
        assert_eq!(seqs(&g.take(now, 2, FAR, LEASE, MAX, 0)), [(1, 1), (2, 1)]);
        // Not published here yet, its priority not known: ahead all the same, under a lease
        // that runs out in a second. Its index entry and tail arrive later: the index offers
        // it, and it is passed over as claimed (its slot taking the priority).
        let short = Claim::Leased {
            attempt: 1,
            token: 7,
            deadline_micros: clock.wall_micros() + 1_000_000,
            holder: Arc::from("b"),
        };
        g.learn_claim(FAR + 2, &short, &clock);
        queue.index_priority(FAR + 1, 3);
        queue.index_priority(FAR + 2, 9);
        queue.publish_max(FAR + 3);
        assert_eq!(seqs(&g.take(now, 2, FAR + 3, LEASE, MAX, 0)), [(FAR + 1, 1), (3, 1)]);
        // Its lease ran out: claimable again, first (its priority), its attempt counted; the
        // far prioritised one, still held, never.
        let later = now + Duration::from_secs(2);
        let t = g.take(later, 1000, FAR + 3, LEASE, MAX, 0);
        assert_eq!(seqs(&t)[..2], [(FAR + 2, 2), (4, 1)]);
        assert!(t.claimed.iter().all(|c| c.seq != FAR), "held by another");
    }

    #[test]
    fn an_expired_lease_is_claimed_again_with_the_next_attempt_and_fences_the_old_holder() {
        let g = group(0);
        let now = Instant::now();
        let old = g.take(now, 1, 1, LEASE, MAX, 0).claimed.remove(0);
        let t = g.take(now, 1, 1, LEASE, MAX, 0);
        assert!(t.claimed.is_empty());
        assert_eq!(t.next_wake, Some(old.deadline), "look again when the lease runs out");
        let later = now + LEASE;
        let new = g.take(later, 1, 1, LEASE, MAX, 0).claimed.remove(0);
        assert_eq!((new.seq, new.attempt, new.expired), (1, 2, true));
        assert!(g.begin_settle(1, old.token, later).is_err(), "the old holder lost it");
        assert!(g.extend(1, old.token, later, later + LEASE).is_err());
        g.release(1, old.token, false); // ignored: not the holder
        assert_eq!(g.live_leases(), [(1, 2, new.deadline)]);
        assert!(g.begin_settle(1, new.token, later).is_ok());
    }

    #[test]
    fn releasing_uncounted_gives_the_attempt_back() {
        let g = group(0);
        let now = Instant::now();
        let c = g.take(now, 1, 1, LEASE, MAX, 0).claimed.remove(0);
        g.release(1, c.token, false);
        assert_eq!(seqs(&g.take(now, 1, 1, LEASE, MAX, 0)), [(1, 1)]);
    }

    #[test]
    fn a_settling_message_is_neither_claimed_nor_settled_twice_and_revert_frees_it() {
        let g = group(0);
        let now = Instant::now();
        let c = g.take(now, 1, 1, LEASE, MAX, 0).claimed.remove(0);
        g.begin_settle(1, c.token, now).unwrap();
        assert!(g.begin_settle(1, c.token, now).is_err());
        let far = now + LEASE * 10;
        assert!(g.take(far, 1, 1, LEASE, MAX, 0).claimed.is_empty(), "no lease runs out while settling");
        assert!(!g.held(far), "an outcome being written does not keep a reset out");
        g.revert(1);
        assert_eq!(seqs(&g.take(far, 1, 1, LEASE, MAX, 0)), [(1, 2)]);
    }

    /// Regression (review of transactions): a transaction refused after a reset gave its
    /// holder's lease back over the slot of whoever settled the message since.
    #[test]
    fn a_refused_transaction_gives_a_lease_back_only_within_its_reset_epoch() {
        let g = group(0);
        let now = Instant::now();
        let old = g.take(now, 1, 1, LEASE, MAX, 0).claimed.remove(0);
        g.begin_settle(1, old.token, now).unwrap();
        let epoch = g.epoch();
        // Refused in its own epoch: leased to its holder again, who can settle it.
        g.unsettle(1, old.token, old.deadline, epoch);
        g.begin_settle(1, old.token, now).unwrap();
        // A reset, another claim and another settle meanwhile...
        g.reset(0);
        let new = g.take(now, 1, 1, LEASE, MAX, 0).claimed.remove(0);
        g.begin_settle(1, new.token, now).unwrap();
        // ...and then the first transaction is refused: the new settle stands.
        g.unsettle(1, old.token, old.deadline, epoch);
        assert!(g.begin_settle(1, old.token, now).is_err(), "the old holder got nothing back");
        assert!(g.take(now + LEASE * 10, 1, 1, LEASE, MAX, 0).claimed.is_empty(), "still settling");
    }

    #[test]
    fn a_retry_waits_until_due() {
        let g = group(0);
        let now = Instant::now();
        let c = g.take(now, 1, 1, LEASE, MAX, 0).claimed.remove(0);
        g.begin_settle(1, c.token, now).unwrap();
        let due = now + Duration::from_secs(5);
        g.to_waiting(1, due, "boom".into());
        assert_eq!(g.waiting(), 1);
        let t = g.take(now, 1, 1, LEASE, MAX, 0);
        assert!(t.claimed.is_empty());
        assert_eq!(t.next_wake, Some(due));
        assert_eq!(seqs(&g.take(due, 1, 1, LEASE, MAX, 0)), [(1, 2)]);
    }

    #[test]
    fn an_operator_action_abandoned_gives_the_message_back_as_it_was() {
        let g = group(0);
        let now = Instant::now();
        let c = g.take(now, 1, 1, LEASE, MAX, 0).claimed.remove(0);
        // A live lease is refused, untouched.
        assert_eq!(g.operator_take(1, now, false).unwrap_err(), Refused::State("leased"));
        g.begin_settle(1, c.token, now).unwrap();
        let due = now + Duration::from_secs(5);
        g.to_waiting(1, due, "boom".into());
        // Taken, then abandoned (a cancelled call): still waiting until `due`, not claimable.
        let taken = g.operator_take(1, now, true).unwrap();
        assert_eq!((taken.attempt, taken.last_error.as_str()), (1, "boom"));
        assert!(g.take(now, 1, 1, LEASE, MAX, 0).claimed.is_empty(), "settling: nobody claims it");
        g.operator_revert(1, taken.previous);
        let t = g.take(now, 1, 1, LEASE, MAX, 0);
        assert!(t.claimed.is_empty() && t.next_wake == Some(due), "waits for its retry again");
        // A never-claimed one further on: the ones skipped become claimable, it is settling.
        let taken = g.operator_take(4, now, false).unwrap();
        assert_eq!(taken.attempt, 0);
        assert_eq!(seqs(&g.take(now, 10, 4, LEASE, MAX, 0)), [(2, 1), (3, 1)]);
        g.operator_revert(4, taken.previous);
        assert_eq!(seqs(&g.take(now, 10, 4, LEASE, MAX, 0)), [(4, 1)]);
        // Finished or never sent: no job.
        assert_eq!(g.operator_take(0, now, false).unwrap_err(), Refused::Finished);
        assert_eq!(g.operator_take(1_000_000, now, false).unwrap_err(), Refused::NotSent);
    }

    #[test]
    fn a_parked_message_taken_by_an_operator_and_given_back_waits_behind_its_key_again() {
        let g = group(0);
        g.set_keyed(true);
        let now = Instant::now();
        let a = Some(7);
        assert_eq!(g.learn([(1, a), (2, a)]), 2);
        assert_eq!(seqs(&g.take(now, 10, 2, LEASE, MAX, 0)), [(1, 1)]);
        let taken = g.operator_take(2, now, false).unwrap();
        g.operator_revert(2, taken.previous);
        assert!(g.take(now, 10, 2, LEASE, MAX, 0).claimed.is_empty(), "2 still behind 1");
        // The writer refusing it (`revert`) parks it too.
        g.operator_take(2, now, false).unwrap();
        g.revert(2);
        assert!(g.take(now, 10, 2, LEASE, MAX, 0).claimed.is_empty(), "2 still behind 1");
        // And so does the etcd engine learning, from a refused write, that nobody claimed it.
        g.operator_take(2, now, false).unwrap();
        g.learn_unclaimed(2);
        assert!(g.take(now, 10, 2, LEASE, MAX, 0).claimed.is_empty(), "2 still behind 1");
    }

    #[test]
    fn a_message_out_of_attempts_is_handed_over_for_dead_lettering_once() {
        let g = group(0);
        let mut now = Instant::now();
        for attempt in 1..=MAX {
            let c = g.take(now, 1, 1, LEASE, MAX, 0).claimed.remove(0);
            assert_eq!(c.attempt, attempt);
            now += LEASE; // each lease runs out
        }
        let t = g.take(now, 1, 2, LEASE, MAX, 0);
        assert_eq!(seqs(&t), [(2, 1)], "the claim goes on past it");
        assert_eq!(t.exhausted.len(), 1);
        assert_eq!((t.exhausted[0].seq, t.exhausted[0].attempt), (1, MAX));
        assert_eq!(t.exhausted[0].last_error, "", "no outcome was recorded: its lease ran out");
        assert!(g.take(now + LEASE * 10, 1, 2, LEASE, MAX, 0).exhausted.is_empty(), "marked settling");
    }

    #[test]
    fn extend_moves_only_a_live_lease_of_its_holder() {
        let g = group(0);
        let now = Instant::now();
        let c = g.take(now, 1, 1, LEASE, MAX, 0).claimed.remove(0);
        assert!(g.extend(1, c.token + 1, now, now + LEASE * 3).is_err());
        g.extend(1, c.token, now, now + LEASE * 3).unwrap();
        assert!(g.take(now + LEASE * 2, 1, 1, LEASE, MAX, 0).claimed.is_empty(), "still held");
        assert!(g.held(now + LEASE * 2));
        assert!(!g.held(now + LEASE * 3), "a lease that ran out is nobody's");
    }

    #[test]
    fn another_process_s_lease_mirrored_here_does_not_count_as_held_here() {
        // The etcd engine mirrors other processes' leases from its claim watch, which lags
        // etcd: a reset must not be refused on that mirror (it reads etcd's records instead).
        let g = group(0);
        let clock = Clock::tokio();
        let far = clock.wall_micros() + 3_600_000_000;
        let theirs = Claim::Leased { attempt: 1, token: 7, deadline_micros: far, holder: Arc::from("other") };
        g.learn_claim(1, &theirs, &clock);
        let now = clock.now();
        assert_eq!(g.live_leased(now), 1, "mirrored as leased: nobody here claims it");
        assert!(!g.held(now), "but not held by this process");
        let mine = g.take(now, 1, 2, LEASE, MAX, 0).claimed;
        assert_eq!(mine.iter().map(|c| c.seq).collect::<Vec<_>>(), [2]);
        assert!(g.held(now), "its own lease is");
    }

    #[test]
    fn a_reset_forgets_every_claim_moves_the_epoch_and_drops_queued_acks() {
        let g = group(0);
        let now = Instant::now();
        let t = g.take(now, 3, 3, LEASE, MAX, 0);
        assert!(t.claimed.iter().all(|c| c.epoch == 0));
        g.queue_ack(QueuedAck { seq: 1, attempt: 1, epoch: 0, result: None, flow: None });
        g.reset(1);
        assert_eq!(g.epoch(), 1);
        assert!(g.take_queued_acks().is_empty());
        assert_eq!(g.leased(), 0);
        let t = g.take(now, 3, 3, LEASE, MAX, 0);
        assert_eq!(seqs(&t), [(2, 1), (3, 1)], "claiming restarts after the reset offset");
        assert!(t.claimed.iter().all(|c| c.epoch == 1));
    }

    #[test]
    fn nothing_below_the_queue_head_is_claimed() {
        let g = group(0);
        let now = Instant::now();
        g.take(now, 2, 2, LEASE, MAX, 0);
        g.skip_to(5);
        assert_eq!(g.leased(), 0);
        assert_eq!(seqs(&g.take(now, 1, 6, LEASE, MAX, 0)), [(6, 1)]);
        g.queue.first_seq.store(8, Ordering::Release);
        assert_eq!(seqs(&g.take(now, 1, 9, LEASE, MAX, 0)), [(8, 1)], "head moved by retention");
    }

    #[test]
    fn restore_rebuilds_slots_from_claim_records() {
        let g = group(1);
        let clock = Clock::tokio();
        let far = clock.wall_micros() + 3_600_000_000;
        let leased = Claim::Leased { attempt: 2, token: 7, deadline_micros: 0, holder: Arc::from("") };
        let waiting = Claim::Waiting { attempt: 1, token: 7, not_before_micros: far, last_error: "x".into() };
        g.restore(
            [
                (1, Claim::Done), // at the offset: ignored
                (2, leased),      // its holder died: claimable, attempt kept
                (3, Claim::Done), // finished above the offset
                (5, waiting),     // waits for its retry
            ],
            &clock,
        );
        assert_eq!(g.progress().done.iter().collect::<Vec<_>>(), [3]);
        assert_eq!(g.waiting(), 1);
        let now = clock.now();
        // 4 was claimed in a batch that never reached the disk: claimable, no attempt counted.
        assert_eq!(seqs(&g.take(now, 10, 6, LEASE, MAX, 0)), [(2, 3), (4, 1), (6, 1)]);
    }

    /// Per-key ordering: only a key's first unfinished message is ever claimable.
    #[test]
    fn a_keyed_group_claims_by_priority_among_its_keys_heads() {
        let g = group(0);
        g.set_keyed(true);
        g.queue.index_priority(2, 9);
        g.queue.index_priority(3, 1);
        let now = Instant::now();
        assert_eq!(g.learn([(1, Some(7)), (2, Some(7)), (3, None)]), 3);
        // 2 waits for 1 (its key's head) whatever its priority; 3 goes before 1.
        assert_eq!(seqs(&g.take(now, 10, 3, LEASE, MAX, 0)), [(3, 1), (1, 1)]);
    }

    #[test]
    fn a_keyed_group_parks_each_message_behind_its_keys_unfinished_head() {
        let g = group(0);
        g.set_keyed(true);
        let now = Instant::now();
        let (a, b) = (Some(1), Some(2));
        assert_eq!(g.learn([(1, a), (2, a), (3, b), (4, a), (5, None), (6, b)]), 6);
        assert!(g.take(now, 10, 6, LEASE, MAX, 0).claimed.iter().all(|c| c.seq != 2));
        // Claimed: 1 (a's head), 3 (b's head), 5 (no key). Parked: 2, 4, 6.
        assert_eq!(g.live_leases().iter().map(|l| l.0).collect::<Vec<_>>(), [1, 3, 5]);
        // A retry keeps its key busy.
        let token = |seq: u64| {
            g.dispatch()
                .get(seq)
                .map(|s| match s.state {
                    SlotState::Leased { token, .. } => token,
                    _ => 0,
                })
                .unwrap()
        };
        g.begin_settle(3, token(3), now).unwrap();
        let due = now + Duration::from_secs(1);
        g.to_waiting(3, due, "boom".into());
        assert!(g.take(now, 10, 6, LEASE, MAX, 0).claimed.is_empty(), "6 waits behind 3's retry");
        // 1 finishes: 2 is next for a, and only 2.
        g.begin_settle(1, token(1), now).unwrap();
        g.finished(&[(1, g.epoch())]);
        assert_eq!(seqs(&g.take(now, 10, 6, LEASE, MAX, 0)), [(2, 1)]);
        // 3's retry comes due: claimed again (attempt 2), 6 still parked.
        assert_eq!(seqs(&g.take(due, 10, 6, LEASE, MAX, 0)), [(3, 2)]);
        // Dead-lettering (finishing) 3 releases b: 6 goes.
        g.finished(&[(3, g.epoch())]);
        assert_eq!(seqs(&g.take(due, 10, 6, LEASE, MAX, 0)), [(6, 1)]);
        // Retention dropping 2 (a's head, leased) promotes 4 once 2's lease has run out.
        g.skip_to(2);
        assert!(g.take(due, 10, 6, LEASE, MAX, 0).claimed.is_empty());
        // (5, without a key, was leased at the same time: its lease ran out too.)
        assert_eq!(seqs(&g.take(now + LEASE, 10, 6, LEASE, MAX, 0)), [(4, 1), (5, 2)]);
    }

    /// After a restart the restored slots do not know their keys: nothing is claimed until
    /// they are read, and then a key's later slots park behind its first.
    #[test]
    fn restored_slots_are_rekeyed_before_anything_is_claimed() {
        let g = group(0);
        g.set_keyed(true);
        let clock = Clock::tokio();
        let leased = |attempt| Claim::Leased { attempt, token: 7, deadline_micros: 0, holder: Arc::from("") };
        g.restore([(1, leased(1)), (3, leased(1))], &clock); // 2 never reached the disk
        let now = clock.now();
        assert!(g.take(now, 10, 3, LEASE, MAX, 0).claimed.is_empty(), "keys unknown: nothing claimed");
        assert_eq!(g.unknown_keys(), [1, 2, 3]);
        g.assign_keys([(1, Some(9)), (2, Some(9)), (3, Some(4))]);
        assert!(g.unknown_keys().is_empty());
        assert_eq!(seqs(&g.take(now, 10, 3, LEASE, MAX, 0)), [(1, 2), (3, 2)], "2 parks behind 1");
        g.finished(&[(1, g.epoch())]);
        assert_eq!(seqs(&g.take(now, 10, 3, LEASE, MAX, 0)), [(2, 1)]);
    }

    /// Regression (review of issue 16): a slot claimed before the group was ordered by key,
    /// whose key is read after later ones were learned, goes first and the learned head waits;
    /// and a restored retry behind its key's head parks instead of firing on its own.
    #[test]
    fn late_assigned_keys_keep_the_order_whatever_the_slots_states() {
        let g = group(0);
        let now = Instant::now();
        let c = g.take(now, 1, 1, LEASE, MAX, 0).claimed.remove(0); // no keys yet: 1 claimed
        g.release(1, c.token, false);
        g.set_keyed(true);
        g.learn([(2, Some(5))]);
        g.assign_keys([(1, Some(5))]);
        assert_eq!(seqs(&g.take(now, 10, 2, LEASE, MAX, 0)), [(1, 1)], "2 waits behind 1");

        let g = group(0);
        g.set_keyed(true);
        let clock = Clock::tokio();
        let soon = clock.wall_micros() + 1_000_000;
        let waiting =
            |attempt| Claim::Waiting { attempt, token: 7, not_before_micros: soon, last_error: "x".into() };
        g.restore([(1, waiting(1)), (2, waiting(1))], &clock);
        g.assign_keys([(1, Some(5)), (2, Some(5))]);
        let later = clock.now() + Duration::from_secs(2);
        assert_eq!(seqs(&g.take(later, 10, 2, LEASE, MAX, 0)), [(1, 2)], "2's retry waits behind 1");
    }

    /// Regression (review of issue 16): a round that finished a message was still syncing when
    /// a reset was applied and the message claimed again; completing the old round removed the
    /// new claim's slot. Finishes carry their epoch now.
    #[test]
    fn a_finish_from_before_a_reset_does_not_remove_the_new_claim() {
        let g = group(0);
        let now = Instant::now();
        let c = g.take(now, 1, 1, LEASE, MAX, 0).claimed.remove(0);
        g.begin_settle(1, c.token, now).unwrap();
        let finished_in = g.epoch();
        g.reset(0);
        let again = g.take(now, 1, 1, LEASE, MAX, 0).claimed.remove(0);
        assert_eq!(again.seq, 1);
        g.finished(&[(1, finished_in)]); // the old round completes now
        assert_eq!(g.leased(), 1, "the new claim keeps its slot");
        assert!(g.begin_settle(1, again.token, now).is_ok());
    }

    /// Regression (review of issue 16): retention deleting a keyed message while it was leased
    /// released its key at once, so the next message of the key ran beside the first one's
    /// handler. It now keeps the key's place until its lease runs out.
    #[test]
    fn a_trim_through_a_leased_keyed_message_holds_its_key_until_the_lease_ends() {
        let g = group(0);
        g.set_keyed(true);
        let now = Instant::now();
        g.learn([(1, Some(7)), (2, Some(7))]);
        let held = g.take(now, 10, 2, LEASE, MAX, 0).claimed;
        assert_eq!(held.iter().map(|c| c.seq).collect::<Vec<_>>(), [1]);
        g.queue.first_seq.store(2, Ordering::Release);
        g.skip_to(1); // retention deleted 1 under its live lease
        let t = g.take(now, 10, 2, LEASE, MAX, 0);
        assert!(t.claimed.is_empty(), "2 waits while 1's handler may run");
        assert_eq!(t.next_wake, Some(held[0].deadline), "look again when that lease ends");
        assert_eq!(seqs(&g.take(held[0].deadline, 10, 2, LEASE, MAX, 0)), [(2, 1)]);
    }

    /// The learning window starts at the frontier, stops at the published end, and stops
    /// altogether while too many messages are parked.
    #[test]
    fn the_learning_window_is_bounded_by_the_published_end_and_the_parked_cap() {
        let g = group(0);
        g.set_keyed(true);
        assert_eq!(g.learn_window(10, 4, 100), Some((1, 4)));
        assert_eq!(g.learn([(1, Some(1)), (2, Some(1)), (3, Some(1))]), 3);
        assert_eq!(g.learn([(2, Some(1)), (4, Some(1))]), 1, "learned parts are skipped");
        assert_eq!(g.learn_window(10, 100, 100), Some((5, 10)));
        assert_eq!(g.learn_window(10, 100, 3), None, "three parked: no more reading ahead");
        assert_eq!(g.learn_window(4, 100, 100), None, "nothing published past the frontier");
    }

    // Regression: trims used to leave the offset below a run of finished messages right above
    // it; a database in that state is healed at open.
    #[test]
    fn restore_moves_the_offset_over_finished_messages_right_above_it() {
        let g = group(1);
        let clock = Clock::tokio();
        g.restore([(2, Claim::Done), (3, Claim::Done), (5, Claim::Done)], &clock);
        assert_eq!(g.progress().offset, 3);
        assert_eq!(g.progress().done.iter().collect::<Vec<_>>(), [5]);
        // 4 was claimed in a batch that never reached the disk: claimable.
        assert_eq!(seqs(&g.take(clock.now(), 10, 6, LEASE, MAX, 0)), [(4, 1), (6, 1)]);
    }

    // Regression (review finding): a retry whose record was queued after the etcd engine had
    // learned another process's claim of the message (its lease ran out while the retry waited
    // for room in the writer's channel) set the slot waiting over that claim; at its due time
    // this process claimed again over the other holder's live lease.
    #[test]
    fn a_retry_queued_after_another_process_claimed_the_message_leaves_that_claim_standing() {
        let g = group(0);
        let clock = crate::clock::Clock::tokio();
        let now = clock.now();
        let c = g.take(now, 1, 1, LEASE, MAX, 0).claimed.remove(0);
        g.begin_settle(1, c.token, now).unwrap();
        let theirs = crate::model::Claim::Leased {
            attempt: 2,
            token: 7,
            deadline_micros: clock.wall_micros() + 3_600_000_000,
            holder: Arc::from("other"),
        };
        g.learn_claim(1, &theirs, &clock);
        g.to_waiting(1, now + Duration::from_secs(1), "boom".into());
        let later = now + Duration::from_secs(2);
        assert!(g.take(later, 1, 1, LEASE, MAX, 0).claimed.is_empty(), "the other process's lease stands");
        assert!(!g.holds_lease(1, c.token));
    }
}

/// The claim index against the linear scan it replaced: random claims, acks, nacks, releases,
/// extensions, reverts, resets, retention skips and clock moves, after each of which the two
/// must agree on what is claimable, what a claim takes and what is held or waiting.
#[cfg(test)]
mod index_props {
    use std::collections::BTreeMap;

    use proptest::prelude::*;

    use super::*;

    const LEASE: Duration = Duration::from_secs(10);
    const MAX: u32 = 3;

    /// The reference: every slot in a map, every claim a walk from the first.
    #[derive(Default)]
    struct Model {
        slots: BTreeMap<u64, (u32, SlotState, bool)>,
        frontier: u64,
    }

    impl Model {
        fn claimable(&self, now: Instant) -> Vec<u64> {
            self.slots
                .iter()
                .filter(|(_, (_, st, _))| match *st {
                    SlotState::Available => true,
                    SlotState::Leased { deadline, .. } => deadline <= now,
                    SlotState::Waiting { due } => due <= now,
                    SlotState::Settling | SlotState::Parked => false,
                })
                .map(|(&s, _)| s)
                .collect()
        }

        /// (claimed (seq, attempt, expired), exhausted seqs) of a claim of `max`.
        fn take(&mut self, now: Instant, max: usize, last: u64) -> (Vec<(u64, u32, bool)>, Vec<u64>) {
            let (mut claimed, mut exhausted) = (Vec::new(), Vec::new());
            // Every lease run out and retry due becomes claimable first (a lease that ran out
            // is no longer counted leased, even if this claim does not take it).
            for (_, st, expired) in self.slots.values_mut() {
                match *st {
                    SlotState::Leased { deadline, .. } if deadline <= now => {
                        (*st, *expired) = (SlotState::Available, true)
                    }
                    SlotState::Waiting { due } if due <= now => *st = SlotState::Available,
                    _ => {}
                }
            }
            for (&seq, (attempt, st, was_expired)) in self.slots.iter_mut() {
                if claimed.len() >= max {
                    break;
                }
                if *st != SlotState::Available {
                    continue;
                }
                let expired = std::mem::take(was_expired);
                if *attempt >= MAX {
                    *st = SlotState::Settling;
                    exhausted.push(seq);
                    continue;
                }
                *attempt += 1;
                // The token and deadline are filled in from the real claim.
                *st = SlotState::Leased { token: 0, deadline: now + LEASE };
                claimed.push((seq, *attempt, expired));
            }
            while claimed.len() < max && self.frontier <= last {
                let seq = self.frontier;
                self.frontier += 1;
                self.slots.insert(seq, (1, SlotState::Leased { token: 0, deadline: now + LEASE }, false));
                claimed.push((seq, 1, false));
            }
            (claimed, exhausted)
        }
    }

    #[derive(Debug, Clone)]
    enum Op {
        Take { max: usize, publish: u64 },
        Ack(usize),
        Nack { pick: usize, secs: u64 },
        Release { pick: usize, counted: bool },
        Extend { pick: usize, secs: u64 },
        Revert(usize),
        Advance(u64),
        Reset,
        Skip(u64),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => (1usize..6, 0u64..4).prop_map(|(max, publish)| Op::Take { max, publish }),
            3 => any::<usize>().prop_map(Op::Ack),
            2 => (any::<usize>(), 0u64..30).prop_map(|(pick, secs)| Op::Nack { pick, secs }),
            1 => (any::<usize>(), any::<bool>()).prop_map(|(pick, counted)| Op::Release { pick, counted }),
            1 => (any::<usize>(), 1u64..30).prop_map(|(pick, secs)| Op::Extend { pick, secs }),
            1 => any::<usize>().prop_map(Op::Revert),
            2 => (0u64..15).prop_map(Op::Advance),
            1 => Just(Op::Reset),
            1 => (0u64..3).prop_map(Op::Skip),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]
        #[test]
        fn the_index_claims_exactly_what_a_full_scan_would(ops in proptest::collection::vec(op(), 1..120)) {
            let queue = QueueState::new(1, "q", 1, 0, crate::retention::Retention::Forever);
            let g = WorkGroupState::new("w", queue, 0);
            let mut m = Model { frontier: 1, ..Model::default() };
            let mut now = Instant::now();
            let mut last = 0u64;
            // Live claims: (seq, token), as holders would keep them.
            let mut held: Vec<(u64, u64)> = Vec::new();
            for op in ops {
                match op {
                    Op::Take { max, publish } => {
                        last += publish;
                        let t = g.take(now, max, last, LEASE, MAX, 0);
                        let (claimed, exhausted) = m.take(now, max, last);
                        let got: Vec<_> = t.claimed.iter().map(|c| (c.seq, c.attempt, c.expired)).collect();
                        prop_assert_eq!(got, claimed);
                        prop_assert_eq!(t.exhausted.iter().map(|e| e.seq).collect::<Vec<_>>(), exhausted);
                        for c in &t.claimed {
                            m.slots.insert(c.seq, (c.attempt, SlotState::Leased { token: c.token, deadline: c.deadline }, false));
                            held.retain(|h| h.0 != c.seq);
                            held.push((c.seq, c.token));
                        }
                        if t.claimed.is_empty() && t.exhausted.is_empty() {
                            let wake = m.slots.values().filter_map(|(_, st, _)| match *st {
                                SlotState::Leased { deadline, .. } => Some(deadline),
                                SlotState::Waiting { due } => Some(due),
                                _ => None,
                            }).min();
                            prop_assert_eq!(t.next_wake, wake);
                        }
                    }
                    Op::Ack(pick) | Op::Nack { pick, .. } if !held.is_empty() => {
                        let (seq, token) = held.remove(pick % held.len());
                        let ok = g.begin_settle(seq, token, now).is_ok();
                        let live = matches!(m.slots.get(&seq), Some((_, SlotState::Leased { token: t, deadline }, _)) if *t == token && now < *deadline);
                        prop_assert_eq!(ok, live);
                        if ok {
                            if let Op::Nack { secs, .. } = op {
                                let due = now + Duration::from_secs(secs);
                                g.to_waiting(seq, due, "e".into());
                                if let Some(s) = m.slots.get_mut(&seq) { s.1 = SlotState::Waiting { due }; }
                            } else {
                                g.finished(&[(seq, g.epoch())]);
                                m.slots.remove(&seq);
                            }
                        }
                    }
                    Op::Release { pick, counted } if !held.is_empty() => {
                        let (seq, token) = held.remove(pick % held.len());
                        g.release(seq, token, counted);
                        if let Some(s) = m.slots.get_mut(&seq)
                            && matches!(s.1, SlotState::Leased { token: t, .. } if t == token)
                        {
                            s.1 = SlotState::Available;
                            if !counted { s.0 = s.0.saturating_sub(1); }
                        }
                    }
                    Op::Extend { pick, secs } if !held.is_empty() => {
                        let (seq, token) = held[pick % held.len()];
                        let until = now + Duration::from_secs(secs);
                        let ok = g.extend(seq, token, now, until).is_ok();
                        let live = matches!(m.slots.get(&seq), Some((_, SlotState::Leased { token: t, deadline }, _)) if *t == token && now < *deadline);
                        prop_assert_eq!(ok, live);
                        if ok && let Some(s) = m.slots.get_mut(&seq) {
                            s.1 = SlotState::Leased { token, deadline: until };
                        }
                    }
                    Op::Revert(pick) if !held.is_empty() => {
                        // A settle abandoned before its record was queued.
                        let (seq, token) = held.remove(pick % held.len());
                        if g.begin_settle(seq, token, now).is_ok() {
                            g.revert(seq);
                            if let Some(s) = m.slots.get_mut(&seq) { s.1 = SlotState::Available; }
                        }
                    }
                    Op::Advance(secs) => now += Duration::from_secs(secs),
                    Op::Reset => {
                        let to = m.frontier.saturating_sub(1) / 2;
                        g.reset(to);
                        m.slots.clear();
                        m.frontier = to + 1;
                        held.clear();
                    }
                    Op::Skip(n) => {
                        let to = m.slots.keys().next().copied().unwrap_or(0) + n;
                        g.skip_to(to);
                        m.slots = m.slots.split_off(&(to + 1));
                        m.frontier = m.frontier.max(to + 1);
                    }
                    _ => {}
                }
                prop_assert_eq!(g.claimable(now), m.claimable(now));
                let leased = m.slots.values().filter(|s| matches!(s.1, SlotState::Leased { .. })).count();
                let waiting = m.slots.values().filter(|s| matches!(s.1, SlotState::Waiting { .. })).count();
                prop_assert_eq!(g.leased(), leased);
                prop_assert_eq!(g.waiting(), waiting);
                let held_now = m.slots.values().any(|s| matches!(s.1, SlotState::Leased { deadline, .. } if deadline > now));
                prop_assert_eq!(g.held(now), held_now);
                let live = m.slots.values().filter(|s| matches!(s.1, SlotState::Leased { deadline, .. } if deadline > now)).count();
                prop_assert_eq!(g.live_leased(now), live);
            }
        }
    }
}
