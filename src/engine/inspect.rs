//! The admin reads, over the store alone: what is on disk is the truth for every figure here
//! (claims are written before a job is handed out, offsets before a commit is reported), so
//! a live broker and a read-only [`Inspector`](crate::Inspector) compute them the same way.
//!
//! The reads themselves are blocking: the `live_*` functions run them on the blocking pool,
//! a read-only [`ReadOnly`] is run there by its caller. What the etcd engine shares with these
//! (pending claims as shown, live leases) is in `figures.rs`.

use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use std::sync::Arc;

use super::Engine;
use super::figures::{LiveLeases, live_leases, micros_to_time, pending_claim};
use crate::error::{CorruptionError, Error, NameKind, StorageError};
use crate::model::{Claim, GroupMode, GroupSettings, QueueMeta};
use crate::schedule::{DelayedInfo, ScheduleInfo};
use crate::stats::{
    GroupStats, JobOutcome, JobState, JobStatus, KeyspaceStats, PendingClaim, PendingState, QueueStats,
    Stats, StoredMessage,
};
use crate::store::{self, LoadedQueue, RawMessage, ReadOutcome, Snapshot, Store};

/// A registry record read for inspection: anything but a storage error is a record that does
/// not decode.
fn from_open(e: Error) -> Error {
    match e {
        Error::Corrupt(_) | Error::Storage(_) => e,
        other => Error::Corrupt(CorruptionError::new("registry", b"", other.to_string())),
    }
}

/// Age of the message `seq` at `now_micros`, `None` if it is not stored.
fn age_of(
    db: &Snapshot<'_>,
    queue_id: u32,
    seq: u64,
    now_micros: u64,
) -> Result<Option<Duration>, StorageError> {
    Ok(db.enqueued_at(queue_id, seq)?.map(|ts| Duration::from_micros(now_micros.saturating_sub(ts))))
}

/// Dead letters not yet redriven out of the queue `dlq`.
fn dlq_depth(db: &Snapshot<'_>, q: &LoadedQueue) -> Result<u64, Error> {
    let cursor = db.cursor(&q.name).map_err(Error::from)?.unwrap_or(0).max(q.meta.first_seq - 1);
    // Less the letters settled on their own above the cursor.
    let settled = db.letter_marks(&q.name).map_err(Error::from)?.range(cursor + 1..).count() as u64;
    Ok(q.last_seq.saturating_sub(cursor).saturating_sub(settled))
}

/// Every queue and group, from the records alone, for a read-only view: it can only trust the
/// records' deadlines. `now_micros` is the wall time. (A live broker's stats come from its
/// memory: `gauges::stats`.)
fn stats(store: &Store, now_micros: u64) -> Result<Stats, Error> {
    let guard = store.lock();
    let Some(db) = guard.inspect(&store.path) else { return Err(Error::Shutdown) };
    let loaded = db.load().map_err(from_open)?;

    let scheduled = &loaded.scheduled;
    let mut queues = Vec::with_capacity(loaded.queues.len());
    for q in &loaded.queues {
        let (first, last) = (q.meta.first_seq, q.last_seq);
        let oldest_age = if last >= first { age_of(&db, q.meta.id, first, now_micros)? } else { None };
        let (count, next) = scheduled.get(&q.meta.id).copied().unwrap_or((0, u64::MAX));
        queues.push(QueueStats {
            name: q.name.clone(),
            first_seq: first,
            last_seq: last,
            len: (last + 1).saturating_sub(first),
            bytes_on_disk: db.queue_bytes(q.meta.id),
            bytes: db.queue_size(q.meta.id, first, (last + 1).saturating_sub(first)),
            retention: q.meta.retention,
            oldest_age,
            scheduled: count,
            next_due: (count > 0).then(|| crate::schedule::time_of(next)),
            dedup_window: q.meta.dedup_window,
        });
    }
    queues.sort_by(|a, b| a.name.cmp(&b.name));

    let by_name: HashMap<&str, &LoadedQueue> = loaded.queues.iter().map(|q| (q.name.as_str(), q)).collect();
    let mut claims: HashMap<(&str, &str), Vec<&store::LoadedClaim>> = HashMap::new();
    for c in &loaded.claims {
        claims.entry((c.group.as_str(), c.queue.as_str())).or_default().push(c);
    }
    let settings: HashMap<(&str, &str), &GroupSettings> =
        loaded.settings.iter().map(|s| ((s.group.as_str(), s.queue.as_str()), &s.settings)).collect();

    let mut groups = Vec::with_capacity(loaded.groups.len());
    for g in &loaded.groups {
        let Some(q) = by_name.get(g.queue.as_str()) else { continue };
        let (first, last) = (q.meta.first_seq, q.last_seq);
        let committed = g.offset.committed;
        let setting = settings.get(&(g.group.as_str(), g.queue.as_str()));
        // Sequences finished above the offset, and claim counts (work-queue groups only).
        let mut done = BTreeSet::new();
        let (mut in_flight, mut waiting_retry) = (0u64, 0u64);
        for c in claims.get(&(g.group.as_str(), g.queue.as_str())).into_iter().flatten() {
            if c.seq <= committed || c.seq < first {
                continue; // left behind by a trim; ignored at open too
            }
            match c.claim {
                Claim::Done => {
                    done.insert(c.seq);
                }
                Claim::Leased { deadline_micros, .. } if deadline_micros > now_micros => in_flight += 1,
                Claim::Leased { .. } => {}
                Claim::Waiting { .. } => waiting_retry += 1,
            }
        }
        let start = (committed + 1).max(first);
        let lag = (last + 1).saturating_sub(start).saturating_sub(done.len() as u64);
        let oldest = (start..=last).find(|s| !done.contains(s));
        let oldest_unacked_age = match oldest {
            Some(seq) => age_of(&db, q.meta.id, seq, now_micros)?,
            None => None,
        };
        let mode = g.offset.mode;
        // Only a work group stores terms; an ordered group's record never has them.
        let terms = setting.and_then(|s| s.work.as_ref()).filter(|_| mode == GroupMode::WorkQueue);
        let (dead_letter_queue, dlq_depth) = if mode == GroupMode::WorkQueue {
            let name = match setting.map(|s| s.dead_letter_queue.as_str()) {
                Some(n) if !n.is_empty() => n.to_owned(),
                _ => crate::model::default_dead_letter_queue(&g.queue),
            };
            let depth = match by_name.get(name.as_str()) {
                Some(d) => dlq_depth(&db, d)?,
                None => 0,
            };
            (Some(name), depth)
        } else {
            (None, 0)
        };
        groups.push(GroupStats {
            group: g.group.clone(),
            queue: g.queue.clone(),
            mode,
            committed,
            lag,
            oldest_unacked_age,
            in_flight,
            waiting_retry,
            dead_letter_queue,
            dlq_depth,
            paused: setting.is_some_and(|s| s.paused),
            lease: terms.map(|t| t.lease),
            retry_policy: terms.map(|t| t.policy.clone()),
            ordered_by_key: terms.is_some_and(|t| t.ordered_by_key),
            keep_outcomes: terms.map(|t| t.keep_outcomes).filter(|k| !k.is_zero()),
            rate_limit: terms.and_then(|t| t.rate_limit),
            concurrency_limit: terms.and_then(|t| t.concurrency_limit),
            per_key_limit: terms.and_then(|t| t.per_key_limit),
            limited: 0,
        });
    }
    groups.sort_by(|a, b| (&a.queue, &a.group).cmp(&(&b.queue, &b.group)));
    let mut keyspaces: Vec<KeyspaceStats> =
        loaded.keyspaces.iter().map(|k| KeyspaceStats { name: k.name.clone(), keys: k.keys }).collect();
    keyspaces.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(Stats { queues, groups, bytes_on_disk: db.db_bytes(), keyspaces })
}

/// The claimed, unfinished messages of a work-queue group (empty for an ordered group).
fn pending(
    store: &Store,
    group: &str,
    queue: &str,
    now_micros: u64,
    live: Option<&LiveLeases>,
) -> Result<Vec<PendingClaim>, Error> {
    crate::name::validate(NameKind::Group, group)?;
    crate::name::validate(NameKind::Queue, queue)?;
    let guard = store.lock();
    let Some(db) = guard.inspect(&store.path) else { return Err(Error::Shutdown) };
    let Some(offset) = db.offset(group, queue).map_err(Error::from)? else {
        return Err(Error::NoSuchGroup { group: group.to_owned(), queue: queue.to_owned() });
    };
    if offset.mode != GroupMode::WorkQueue {
        return Ok(Vec::new());
    }
    let authoritative = live.is_some();
    let live = live.and_then(|l| l.get(&(group.to_owned(), queue.to_owned())));
    let claims = db.claims_above(group, queue, offset.committed).map_err(Error::from)?;
    let mut out: Vec<PendingClaim> =
        claims.into_iter().filter_map(|(seq, claim)| pending_claim(seq, claim, now_micros, live)).collect();
    // A lease no one holds any more (see `stats`): claimable at once, shown as expired.
    for p in out.iter_mut().filter(|p| authoritative && p.state == PendingState::Leased) {
        if !holds(live, p.seq, p.attempt) {
            p.state = PendingState::Expired;
        }
    }
    Ok(out)
}

/// Where job `seq` of work group `group` on `queue` stands, from the records alone (an
/// [`Inspector`](crate::Inspector)'s view: no process's memory, so a lease is as its record
/// says — an extension made since is not seen — and a claim or outcome the writer has not
/// written yet is not either).
fn job_on_disk(store: &Store, group: &str, queue: &str, seq: u64, now: u64) -> Result<JobStatus, Error> {
    crate::name::validate(NameKind::Group, group)?;
    crate::name::validate(NameKind::Queue, queue)?;
    let guard = store.lock();
    let Some(db) = guard.inspect(&store.path) else { return Err(Error::Shutdown) };
    let no_group = || Error::NoSuchGroup { group: group.to_owned(), queue: queue.to_owned() };
    let offset = db.offset(group, queue).map_err(Error::from)?.ok_or_else(no_group)?;
    if offset.mode != GroupMode::WorkQueue {
        return Err(no_group());
    }
    let (meta, last) = db.queue(queue).map_err(from_open)?.ok_or_else(no_group)?;
    if seq == 0 || seq > last {
        return Err(Error::NoSuchJob { queue: queue.to_owned(), group: group.to_owned(), seq });
    }
    let mut status = JobStatus {
        seq,
        state: JobState::Queued,
        attempt: 0,
        last_error: None,
        holder: None,
        outcome: None,
        progress: None,
        priority: db.priority(meta.id, seq).map_err(Error::from)?,
    };
    // Read whatever the state: a report is deleted with its job's finish (or the trim or reset
    // past it), so one on a final job would show a record that outlived its job.
    status.progress = db.progress(group, queue, seq).map_err(Error::from)?;
    // A kept outcome outlives the message (and decides between finished and removed).
    if let Some(outcome) = db.outcome(group, queue, seq).map_err(Error::from)? {
        status.state = JobState::Finished;
        status.outcome = Some(outcome);
        return Ok(status);
    }
    if seq < meta.first_seq {
        status.state = JobState::Removed;
        return Ok(status);
    }
    if seq <= offset.committed {
        status.state = JobState::Finished;
        return Ok(status);
    }
    let until = |at: u64| Duration::from_micros(at.saturating_sub(now));
    match db.claim(group, queue, seq).map_err(Error::from)? {
        None => {}
        Some(Claim::Done) => status.state = JobState::Finished,
        Some(Claim::Leased { attempt, deadline_micros, holder, .. }) => {
            status.attempt = attempt;
            status.holder = (!holder.is_empty()).then(|| holder.to_string());
            status.state = if deadline_micros > now {
                JobState::Leased { lease_remaining: until(deadline_micros) }
            } else {
                JobState::Expired
            };
        }
        Some(Claim::Waiting { attempt, not_before_micros, last_error, .. }) => {
            status.attempt = attempt;
            status.last_error = (!last_error.is_empty()).then_some(last_error);
            if not_before_micros > now {
                status.state = JobState::RetryWaiting { due_in: until(not_before_micros) };
            }
        }
    }
    Ok(status)
}

/// The queue's metadata and last sequence.
fn queue_bounds(store: &Store, queue: &str) -> Result<(QueueMeta, u64), Error> {
    crate::name::validate(NameKind::Queue, queue)?;
    let guard = store.lock();
    let Some(db) = guard.inspect(&store.path) else { return Err(Error::Shutdown) };
    db.queue(queue).map_err(from_open)?.ok_or_else(|| Error::NoSuchQueue { queue: queue.to_owned() })
}

fn read(store: &Store, queue: &str, id: u32, from: u64, to: u64) -> Result<Vec<RawMessage>, Error> {
    if from > to {
        return Ok(Vec::new());
    }
    match store::read_range(store, queue, id, from, to, 64 << 20) {
        Ok(ReadOutcome::Messages(m)) => Ok(m),
        Ok(ReadOutcome::Closed) => Err(Error::Shutdown),
        Err(Error::Corrupt(c)) => Err(Error::Corrupt(c)),
        Err(Error::Storage(s)) => Err(Error::Storage(s)),
        // Trimmed under us: show what is left.
        Err(Error::Gap { .. }) => Ok(Vec::new()),
        Err(e) => Err(Error::Corrupt(CorruptionError::new("message", b"", e.to_string()))),
    }
}

/// Up to `limit` messages of `queue` from `from` (default: the first live one).
fn peek(store: &Store, queue: &str, from: Option<u64>, limit: usize) -> Result<Vec<StoredMessage>, Error> {
    let (rec, last) = queue_bounds(store, queue)?;
    if limit == 0 {
        return Ok(Vec::new());
    }
    let from = from.unwrap_or(0).max(rec.first_seq);
    let to = last.min(from.saturating_add(limit as u64 - 1));
    Ok(read(store, queue, rec.id, from, to)?
        .into_iter()
        .map(|m| StoredMessage {
            seq: m.seq,
            enqueued_at: micros_to_time(m.enqueued_at_micros),
            key: m.key,
            idempotency_key: m.idempotency_key,
            priority: m.priority,
            headers: m.headers,
            payload: m.payload,
        })
        .collect())
}

/// Up to `limit` delayed messages of `queue` (all queues: `None`), in schedule-id order.
fn scheduled(store: &Store, queue: Option<&str>, limit: usize) -> Result<Vec<DelayedInfo>, Error> {
    if let Some(name) = queue {
        crate::name::validate(crate::error::NameKind::Queue, name)?;
    }
    let guard = store.lock();
    let Some(db) = guard.inspect(&store.path) else { return Err(Error::Shutdown) };
    let loaded = db.load().map_err(from_open)?;
    let names: HashMap<u32, &str> = loaded.queues.iter().map(|q| (q.meta.id, q.name.as_str())).collect();
    let id = match queue {
        Some(name) => Some(
            loaded
                .queues
                .iter()
                .find(|q| q.name == name)
                .map(|q| q.meta.id)
                .ok_or_else(|| Error::NoSuchQueue { queue: name.to_owned() })?,
        ),
        None => None,
    };
    let mut out = Vec::new();
    for (queue_id, id, due, env) in db.list_scheduled(id, limit).map_err(Error::from)? {
        let env = store::envelope::decode(&id.to_be_bytes(), &env)?;
        out.push(DelayedInfo {
            id,
            queue: names.get(&queue_id).map_or_else(|| format!("#{queue_id}"), |n| (*n).to_owned()),
            due: micros_to_time(due),
            sent_at: micros_to_time(env.enqueued_at_micros),
            payload_len: env.payload.len(),
            key: env.key,
        });
    }
    Ok(out)
}

/// Every recurring schedule.
fn schedules(store: &Store) -> Result<Vec<ScheduleInfo>, Error> {
    let guard = store.lock();
    let Some(db) = guard.inspect(&store.path) else { return Err(Error::Shutdown) };
    Ok(db.list_schedules().map_err(Error::from)?.into_iter().map(|(name, r)| r.info(name)).collect())
}

/// Up to `limit` dead letters of `dlq` not yet redriven, as stored.
fn dead_letters(store: &Store, dlq: &str, limit: usize) -> Result<Vec<RawMessage>, Error> {
    let (rec, last) = queue_bounds(store, dlq)?;
    // Marks before the cursor (see `DeadLetters::cursor_and_marks`).
    let marks = store::read_letter_marks(store, dlq)?;
    let cursor = match store::read_cursor(store, dlq) {
        Ok(c) => c.unwrap_or(0),
        Err(Error::Corrupt(c)) => {
            return Err(Error::Corrupt(c));
        }
        Err(Error::Storage(s)) => return Err(Error::Storage(s)),
        Err(_) => return Err(Error::Shutdown),
    };
    if limit == 0 {
        return Ok(Vec::new());
    }
    // Letters settled on their own are skipped: read that many more.
    let from = (cursor + 1).max(rec.first_seq);
    let extra = marks.range(from..).count() as u64;
    let to = last.min(from.saturating_add(limit as u64 - 1).saturating_add(extra));
    let mut out = read(store, dlq, rec.id, from, to)?;
    out.retain(|m| !marks.contains(&m.seq));
    out.truncate(limit);
    Ok(out)
}

/// Runs `f` over `store` on the blocking pool, with the broker clock's wall time.
async fn on_store<T: Send + 'static>(
    engine: &Arc<Engine>,
    store: &Arc<Store>,
    runtime: &tokio::runtime::Handle,
    f: impl FnOnce(&Store, u64) -> Result<T, Error> + Send + 'static,
) -> Result<T, Error> {
    let store = store.clone();
    let now = engine.clock().wall_micros();
    runtime.spawn_blocking(move || f(&store, now)).await.map_err(|_| Error::Shutdown)?
}

/// A live broker's delayed messages (see [`scheduled`]).
pub(super) async fn live_scheduled(
    engine: &Arc<Engine>,
    store: &Arc<Store>,
    runtime: &tokio::runtime::Handle,
    queue: Option<String>,
    limit: usize,
) -> Result<Vec<DelayedInfo>, Error> {
    on_store(engine, store, runtime, move |s, _| scheduled(s, queue.as_deref(), limit)).await
}

/// A live broker's recurring schedules.
pub(super) async fn live_schedules(
    engine: &Arc<Engine>,
    store: &Arc<Store>,
    runtime: &tokio::runtime::Handle,
) -> Result<Vec<ScheduleInfo>, Error> {
    on_store(engine, store, runtime, move |s, _| schedules(s)).await
}

/// A live broker's stats: the disk's figures with this process's leases and in-flight
/// deliveries laid over them.
pub(super) async fn live_stats(
    engine: &Arc<Engine>,
    store: &Arc<Store>,
    runtime: &tokio::runtime::Handle,
) -> Result<Stats, Error> {
    let e = engine.clone();
    let stats = on_store(engine, store, runtime, move |s, now| super::gauges::stats(&e, s, now)).await?;
    crate::telemetry::publish(&stats);
    Ok(stats)
}

/// A live broker's pending claims of one work group, with this process's lease deadlines.
pub(super) async fn live_pending(
    engine: &Arc<Engine>,
    store: &Arc<Store>,
    runtime: &tokio::runtime::Handle,
    group: &str,
    queue: &str,
) -> Result<Vec<PendingClaim>, Error> {
    let live = live_leases(engine, Some((group, queue)));
    let (g, q) = (group.to_owned(), queue.to_owned());
    on_store(engine, store, runtime, move |s, now| pending(s, &g, &q, now, Some(&live))).await
}

/// The claim record of `seq` in work group `group` on `queue`, on a live broker.
pub(super) async fn live_claim(
    engine: &Arc<Engine>,
    store: &Arc<Store>,
    runtime: &tokio::runtime::Handle,
    group: &str,
    queue: &str,
    seq: u64,
) -> Result<Option<Claim>, Error> {
    let (g, q) = (group.to_owned(), queue.to_owned());
    on_store(engine, store, runtime, move |store, _| {
        let guard = store.lock();
        let Some(db) = guard.inspect(&store.path) else { return Err(Error::Shutdown) };
        db.claim(&g, &q, seq).map_err(Error::from)
    })
    .await
}

/// The kept outcome of job `seq` in work group `group` on `queue`, if there is one.
pub(super) async fn live_outcome(
    engine: &Arc<Engine>,
    store: &Arc<Store>,
    runtime: &tokio::runtime::Handle,
    group: &str,
    queue: &str,
    seq: u64,
) -> Result<Option<JobOutcome>, Error> {
    let (g, q) = (group.to_owned(), queue.to_owned());
    on_store(engine, store, runtime, move |store, _| {
        let guard = store.lock();
        let Some(db) = guard.inspect(&store.path) else { return Err(Error::Shutdown) };
        db.outcome(&g, &q, seq).map_err(Error::from)
    })
    .await
}

/// Flow `id` as stored, on a live broker.
pub(super) async fn live_flow(
    engine: &Arc<Engine>,
    store: &Arc<Store>,
    runtime: &tokio::runtime::Handle,
    id: u64,
) -> Result<Option<crate::flow_state::FlowStatus>, Error> {
    on_store(engine, store, runtime, move |s, _| crate::store::flow_status(s, id).map_err(Error::from)).await
}

/// Up to `limit` flow ids from `from`, on a live broker.
pub(super) async fn live_flow_ids(
    engine: &Arc<Engine>,
    store: &Arc<Store>,
    runtime: &tokio::runtime::Handle,
    from: u64,
    limit: usize,
) -> Result<Vec<u64>, Error> {
    on_store(engine, store, runtime, move |s, _| crate::store::flow_ids(s, from, limit).map_err(Error::from))
        .await
}

/// Up to `limit` stored messages of `queue` from `from`, on a live broker.
pub(super) async fn live_peek(
    engine: &Arc<Engine>,
    store: &Arc<Store>,
    runtime: &tokio::runtime::Handle,
    queue: &str,
    from: Option<u64>,
    limit: usize,
) -> Result<Vec<StoredMessage>, Error> {
    let q = queue.to_owned();
    on_store(engine, store, runtime, move |s, _| peek(s, &q, from, limit)).await
}

/// A database opened read-only (no lock taken, never written), for an
/// [`Inspector`](crate::Inspector): the same reads as a live broker's, without its leases.
pub(crate) struct ReadOnly(Store);

impl ReadOnly {
    /// Opens the database at `path` read-only. Blocking.
    pub fn open(path: &std::path::Path) -> Result<Self, Error> {
        store::open_read_only(path).map(|(store, _)| ReadOnly(store))
    }

    pub fn path(&self) -> &std::path::Path {
        &self.0.path
    }

    /// Every queue and group at `now_micros`. Blocking.
    pub fn stats(&self, now_micros: u64) -> Result<Stats, Error> {
        stats(&self.0, now_micros)
    }

    /// The pending claims of one work group. Blocking.
    pub fn pending(&self, group: &str, queue: &str, now_micros: u64) -> Result<Vec<PendingClaim>, Error> {
        pending(&self.0, group, queue, now_micros, None)
    }

    /// Where job `seq` of work group `group` on `queue` stands, as its records say. Blocking.
    pub fn job(&self, group: &str, queue: &str, seq: u64, now_micros: u64) -> Result<JobStatus, Error> {
        job_on_disk(&self.0, group, queue, seq, now_micros)
    }

    /// Up to `limit` stored messages of `queue` from `from`. Blocking.
    pub fn peek(&self, queue: &str, from: Option<u64>, limit: usize) -> Result<Vec<StoredMessage>, Error> {
        peek(&self.0, queue, from, limit)
    }

    /// Delayed messages (see [`scheduled`]).
    pub fn scheduled(&self, queue: Option<&str>, limit: usize) -> Result<Vec<DelayedInfo>, Error> {
        scheduled(&self.0, queue, limit)
    }

    /// Recurring schedules.
    pub fn schedules(&self) -> Result<Vec<ScheduleInfo>, Error> {
        schedules(&self.0)
    }

    /// Flow `id` as stored (`None`: no such flow). Blocking.
    pub fn flow(&self, id: u64) -> Result<Option<crate::flow_state::FlowStatus>, Error> {
        crate::store::flow_status(&self.0, id).map_err(Error::from)
    }

    /// Up to `limit` flow ids from `from`, in id order. Blocking.
    pub fn flow_ids(&self, from: u64, limit: usize) -> Result<Vec<u64>, Error> {
        crate::store::flow_ids(&self.0, from, limit).map_err(Error::from)
    }

    /// Up to `limit` dead letters of `dlq` not yet redriven, as stored. Blocking.
    pub fn dead_letters(&self, dlq: &str, limit: usize) -> Result<Vec<RawMessage>, Error> {
        dead_letters(&self.0, dlq, limit)
    }
}

/// Whether this process holds the lease of `attempt` on `seq`.
fn holds(live: Option<&std::collections::HashMap<u64, (u32, u64)>>, seq: u64, attempt: u32) -> bool {
    live.and_then(|l| l.get(&seq)).is_some_and(|&(a, _)| a == attempt)
}
