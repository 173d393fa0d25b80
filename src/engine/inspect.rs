//! The admin reads, over the store alone: what is on disk is the truth for every figure here
//! (claims are written before a job is handed out, offsets before a commit is reported), so
//! a live broker and a read-only [`Inspector`](crate::Inspector) compute them the same way.
//!
//! Everything here is blocking: callers run it on the blocking pool.

use std::collections::{BTreeSet, HashMap};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use std::sync::Arc;

use super::Engine;
use super::shared::Shared;
use crate::error::{
    CorruptionError, InspectError, NameKind, OpenError, ReceiveError, RedriveError, StorageError,
};
use crate::model::{Claim, GroupMode, GroupSettings, QueueMeta};
use crate::schedule::{ScheduleInfo, ScheduledInfo};
use crate::stats::{GroupStats, KeyspaceStats, PendingClaim, PendingState, QueueStats, Stats, StoredMessage};
use crate::store::{self, LoadedQueue, RawMessage, ReadError, ReadOutcome, Snapshot, Store};

fn from_open(e: OpenError) -> InspectError {
    match e {
        OpenError::Corrupt(c) => InspectError::Corrupt(c),
        OpenError::Storage(s) => InspectError::Storage(s),
        other => InspectError::Corrupt(CorruptionError::new("registry", b"", other.to_string())),
    }
}

pub(super) fn micros_to_time(m: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_micros(m)
}

fn from_read(e: ReadError) -> InspectError {
    match e {
        ReadError::Corrupt(c) => InspectError::Corrupt(c),
        ReadError::Storage(s) => InspectError::Storage(s),
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

/// A live broker's in-memory leases, by group and queue: sequence → (attempt, deadline in
/// wall-clock µs). Empty for a read-only [`Inspector`](crate::Inspector).
pub(crate) type LiveLeases = HashMap<(String, String), HashMap<u64, (u32, u64)>>;

/// The lease deadline of claim `c` on `seq`: the live one if this process holds that very
/// attempt (it may have been extended since the record was written), else the record's.
fn deadline_of(live: Option<&HashMap<u64, (u32, u64)>>, seq: u64, attempt: u32, deadline_micros: u64) -> u64 {
    match live.and_then(|l| l.get(&seq)) {
        Some(&(live_attempt, deadline)) if live_attempt == attempt => deadline,
        _ => deadline_micros,
    }
}

/// Dead letters not yet redriven out of the queue `dlq`.
fn dlq_depth(db: &Snapshot<'_>, q: &LoadedQueue) -> Result<u64, InspectError> {
    let cursor = db.cursor(&q.name).map_err(from_read)?.unwrap_or(0);
    Ok(q.last_seq.saturating_sub(cursor.max(q.meta.first_seq - 1)))
}

/// Every queue and group. `now_micros` is the broker clock's wall time.
fn stats(store: &Store, now_micros: u64, live: &LiveLeases) -> Result<Stats, InspectError> {
    let guard = store.lock();
    let Some(db) = guard.inspect(&store.path) else { return Err(InspectError::Shutdown) };
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
        let live = live.get(&(g.group.clone(), g.queue.clone()));
        for c in claims.get(&(g.group.as_str(), g.queue.as_str())).into_iter().flatten() {
            if c.seq <= committed || c.seq < first {
                continue; // left behind by a trim; ignored at open too
            }
            match c.claim {
                Claim::Done => {
                    done.insert(c.seq);
                }
                Claim::Leased { attempt, deadline_micros, .. }
                    if deadline_of(live, c.seq, attempt, deadline_micros) > now_micros =>
                {
                    in_flight += 1
                }
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
    live: &LiveLeases,
) -> Result<Vec<PendingClaim>, InspectError> {
    crate::name::validate(NameKind::Group, group)?;
    crate::name::validate(NameKind::Queue, queue)?;
    let guard = store.lock();
    let Some(db) = guard.inspect(&store.path) else { return Err(InspectError::Shutdown) };
    let Some(offset) = db.offset(group, queue).map_err(from_read)? else {
        return Err(InspectError::NoSuchGroup { group: group.to_owned(), queue: queue.to_owned() });
    };
    if offset.mode != GroupMode::WorkQueue {
        return Ok(Vec::new());
    }
    let live = live.get(&(group.to_owned(), queue.to_owned()));
    let claims = db.claims_above(group, queue, offset.committed).map_err(from_read)?;
    Ok(claims.into_iter().filter_map(|(seq, claim)| pending_claim(seq, claim, now_micros, live)).collect())
}

/// A claim record as [`Broker::pending`](crate::Broker::pending) shows it (`None`: finished).
/// `live`: this process's leases of the group, whose extensions the record may not show yet.
pub(super) fn pending_claim(
    seq: u64,
    claim: Claim,
    now_micros: u64,
    live: Option<&HashMap<u64, (u32, u64)>>,
) -> Option<PendingClaim> {
    Some(match claim {
        Claim::Done => return None,
        Claim::Leased { attempt, deadline_micros, holder, .. } => {
            let deadline = deadline_of(live, seq, attempt, deadline_micros);
            let state = if deadline > now_micros { PendingState::Leased } else { PendingState::Expired };
            PendingClaim {
                seq,
                state,
                attempt,
                holder: (!holder.is_empty()).then(|| holder.to_string()),
                lease_deadline: Some(micros_to_time(deadline)),
                retry_at: None,
                last_error: None,
            }
        }
        Claim::Waiting { attempt, not_before_micros, last_error, .. } => PendingClaim {
            seq,
            state: PendingState::Waiting,
            attempt,
            holder: None,
            lease_deadline: None,
            retry_at: Some(micros_to_time(not_before_micros)),
            last_error: (!last_error.is_empty()).then_some(last_error),
        },
    })
}

/// The queue's metadata and last sequence.
fn queue_bounds(store: &Store, queue: &str) -> Result<(QueueMeta, u64), InspectError> {
    crate::name::validate(NameKind::Queue, queue)?;
    let guard = store.lock();
    let Some(db) = guard.inspect(&store.path) else { return Err(InspectError::Shutdown) };
    db.queue(queue).map_err(from_open)?.ok_or_else(|| InspectError::NoSuchQueue(queue.to_owned()))
}

fn read(store: &Store, queue: &str, id: u32, from: u64, to: u64) -> Result<Vec<RawMessage>, InspectError> {
    if from > to {
        return Ok(Vec::new());
    }
    match store::read_range(store, queue, id, from, to, 64 << 20) {
        Ok(ReadOutcome::Messages(m)) => Ok(m),
        Ok(ReadOutcome::Closed) => Err(InspectError::Shutdown),
        Err(ReceiveError::Corrupt(c)) => Err(InspectError::Corrupt(c)),
        Err(ReceiveError::Storage(s)) => Err(InspectError::Storage(s)),
        // Trimmed under us: show what is left.
        Err(ReceiveError::Gap { .. }) => Ok(Vec::new()),
        Err(e) => Err(InspectError::Corrupt(CorruptionError::new("message", b"", e.to_string()))),
    }
}

/// Up to `limit` messages of `queue` from `from` (default: the first live one).
fn peek(
    store: &Store,
    queue: &str,
    from: Option<u64>,
    limit: usize,
) -> Result<Vec<StoredMessage>, InspectError> {
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
            headers: m.headers,
            payload: m.payload,
        })
        .collect())
}

/// Up to `limit` delayed messages of `queue` (all queues: `None`), in schedule-id order.
fn scheduled(store: &Store, queue: Option<&str>, limit: usize) -> Result<Vec<ScheduledInfo>, InspectError> {
    if let Some(name) = queue {
        crate::name::validate(crate::error::NameKind::Queue, name)?;
    }
    let guard = store.lock();
    let Some(db) = guard.inspect(&store.path) else { return Err(InspectError::Shutdown) };
    let loaded = db.load().map_err(from_open)?;
    let names: HashMap<u32, &str> = loaded.queues.iter().map(|q| (q.meta.id, q.name.as_str())).collect();
    let id = match queue {
        Some(name) => Some(
            loaded
                .queues
                .iter()
                .find(|q| q.name == name)
                .map(|q| q.meta.id)
                .ok_or_else(|| InspectError::NoSuchQueue(name.to_owned()))?,
        ),
        None => None,
    };
    let mut out = Vec::new();
    for (queue_id, id, due, env) in db.list_scheduled(id, limit).map_err(from_read)? {
        let env = store::envelope::decode(&id.to_be_bytes(), &env)?;
        out.push(ScheduledInfo {
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
fn schedules(store: &Store) -> Result<Vec<ScheduleInfo>, InspectError> {
    let guard = store.lock();
    let Some(db) = guard.inspect(&store.path) else { return Err(InspectError::Shutdown) };
    Ok(db
        .list_schedules()
        .map_err(from_read)?
        .into_iter()
        .map(|(name, r)| ScheduleInfo {
            name,
            recurrence: r.recurrence.describe(),
            missed: r.recurrence.missed,
            next: (r.next_micros != 0).then(|| micros_to_time(r.next_micros)),
            paused: r.paused,
            fired: r.fired,
            missed_firings: r.missed_firings,
            last: (r.last_seq != 0).then(|| (micros_to_time(r.last_micros), r.last_seq)),
            queue: r.queue,
        })
        .collect())
}

/// A live broker's delayed messages (see [`scheduled`]).
pub(crate) async fn live_scheduled(
    shared: &Arc<Shared>,
    queue: Option<String>,
    limit: usize,
) -> Result<Vec<ScheduledInfo>, InspectError> {
    on_store(shared, move |s, _| scheduled(s, queue.as_deref(), limit)).await
}

/// A live broker's recurring schedules.
pub(crate) async fn live_schedules(shared: &Arc<Shared>) -> Result<Vec<ScheduleInfo>, InspectError> {
    on_store(shared, move |s, _| schedules(s)).await
}

/// Up to `limit` dead letters of `dlq` not yet redriven, as stored.
fn dead_letters(store: &Store, dlq: &str, limit: usize) -> Result<Vec<RawMessage>, InspectError> {
    let (rec, last) = queue_bounds(store, dlq)?;
    let cursor = match store::read_cursor(store, dlq) {
        Ok(c) => c.unwrap_or(0),
        Err(RedriveError::Receive(ReceiveError::Corrupt(c))) => {
            return Err(InspectError::Corrupt(c));
        }
        Err(RedriveError::Storage(s)) => return Err(InspectError::Storage(s)),
        Err(_) => return Err(InspectError::Shutdown),
    };
    if limit == 0 {
        return Ok(Vec::new());
    }
    let from = (cursor + 1).max(rec.first_seq);
    let to = last.min(from.saturating_add(limit as u64 - 1));
    read(store, dlq, rec.id, from, to)
}

/// This process's live leases of every work group (or of `only`), in wall-clock µs.
///
/// Why an overlay rather than a write: [`Job::extend`](crate::Job::extend) and the pool's
/// heartbeat move only the in-memory deadline, which is what fencing checks. Persisting each
/// extension would put a write per heartbeat on the writer and either make `extend` wait (it is
/// synchronous) or make the record lag when the writer's queue is full; and a persisted
/// deadline is never used again anyway (after a restart every lease is void, see
/// `WorkGroupState::restore`). So the live broker reports the deadlines fencing enforces; a
/// read-only [`Inspector`](crate::Inspector) sees the claim-time deadlines on disk.
pub(super) fn live_leases(engine: &Engine, only: Option<(&str, &str)>) -> LiveLeases {
    let clock = engine.clock();
    let mut out = LiveLeases::new();
    for entry in engine.registry.work.iter() {
        let g = entry.value();
        if only.is_some_and(|(group, queue)| *g.name != *group || *g.queue.name != *queue) {
            continue;
        }
        let leases = g.live_leases();
        if leases.is_empty() {
            continue;
        }
        let map =
            leases.into_iter().map(|(seq, attempt, t)| (seq, (attempt, clock.wall_micros_at(t)))).collect();
        out.insert((g.name.to_string(), g.queue.name.to_string()), map);
    }
    out
}

/// Runs `f` over a live broker's store on the blocking pool, with the broker clock's wall time.
async fn on_store<T: Send + 'static>(
    shared: &Arc<Shared>,
    f: impl FnOnce(&Store, u64) -> Result<T, InspectError> + Send + 'static,
) -> Result<T, InspectError> {
    if shared.is_closed() {
        return Err(InspectError::Shutdown);
    }
    if let Some(u) = shared.unsupported("this inspection (delayed messages, schedules, the store directly)") {
        return Err(InspectError::Unsupported(u));
    }
    let s = shared.clone();
    let now = shared.engine.clock().wall_micros();
    shared
        .runtime
        .spawn_blocking(move || f(&s.engine.store, now))
        .await
        .map_err(|_| InspectError::Shutdown)?
}

/// A live broker's stats: the disk's figures with this process's leases and in-flight
/// deliveries laid over them. Refreshes the metrics gauges.
pub(crate) async fn live_stats(shared: &Arc<Shared>) -> Result<Stats, InspectError> {
    #[cfg(feature = "etcd")]
    if let Some(side) = &shared.engine.etcd {
        return super::etcd::stats::stats(shared, side).await;
    }
    let live = live_leases(&shared.engine, None);
    let mut stats = on_store(shared, move |s, now| self::stats(s, now, &live)).await?;
    let registry = &shared.engine.registry;
    for g in stats.groups.iter_mut().filter(|g| g.mode == GroupMode::Ordered) {
        if let Some(state) = registry.ordered(&g.group, &g.queue) {
            g.in_flight = state.in_flight();
        }
    }
    crate::telemetry::publish(&stats);
    Ok(stats)
}

/// A live broker's pending claims of one work group, with this process's lease deadlines.
pub(crate) async fn live_pending(
    shared: &Arc<Shared>,
    group: &str,
    queue: &str,
) -> Result<Vec<PendingClaim>, InspectError> {
    let live = live_leases(&shared.engine, Some((group, queue)));
    #[cfg(feature = "etcd")]
    if let Some(side) = &shared.engine.etcd {
        return super::etcd::inspect::pending(shared, side, group, queue, &live).await;
    }
    let (g, q) = (group.to_owned(), queue.to_owned());
    on_store(shared, move |s, now| pending(s, &g, &q, now, &live)).await
}

/// Up to `limit` stored messages of `queue` from `from`, on a live broker.
pub(crate) async fn live_peek(
    shared: &Arc<Shared>,
    queue: &str,
    from: Option<u64>,
    limit: usize,
) -> Result<Vec<StoredMessage>, InspectError> {
    #[cfg(feature = "etcd")]
    if let Some(side) = &shared.engine.etcd {
        return super::etcd::inspect::peek(shared, side, queue, from, limit).await;
    }
    let q = queue.to_owned();
    on_store(shared, move |s, _| peek(s, &q, from, limit)).await
}

/// Refreshes the metrics gauges every `interval` on the broker's clock until shutdown, from
/// memory and a few cached point reads (`gauges.rs`), on the blocking pool.
pub(crate) fn spawn_gauges(shared: &Arc<Shared>, interval: std::time::Duration) {
    let cache = Arc::new(std::sync::Mutex::new(super::gauges::GaugeCache::default()));
    super::shared::spawn_periodic(shared, interval, move |shared| {
        let cache = cache.clone();
        async move {
            if !crate::telemetry::recorder_installed() {
                // Fault 7: with nothing to record into, skip the refresh. Checked every tick: a
                // recorder may be installed later.
                return true;
            }
            if shared.is_closed() {
                return false;
            }
            let s = shared.clone();
            let now = shared.engine.clock().wall_micros();
            let refreshed = shared
                .runtime
                .spawn_blocking(move || {
                    let mut cache = cache.lock().unwrap_or_else(|p| p.into_inner());
                    super::gauges::snapshot(&s.engine, &mut cache, now)
                })
                .await
                .map_err(|_| InspectError::Shutdown)
                .and_then(|r| r);
            match refreshed {
                Ok(stats) => {
                    crate::telemetry::publish(&stats);
                    true
                }
                Err(InspectError::Shutdown) => false,
                Err(e) => {
                    tracing::warn!(error = %e, "rockq: computing metrics gauges failed");
                    true
                }
            }
        }
    });
}

/// A database opened read-only (no lock taken, never written), for an
/// [`Inspector`](crate::Inspector): the same reads as a live broker's, without its leases.
pub(crate) struct ReadOnly(Store);

impl ReadOnly {
    /// Opens the database at `path` read-only. Blocking.
    pub fn open(path: &std::path::Path) -> Result<Self, OpenError> {
        store::open_read_only(path).map(|(store, _)| ReadOnly(store))
    }

    pub fn path(&self) -> &std::path::Path {
        &self.0.path
    }

    /// Every queue and group at `now_micros`. Blocking.
    pub fn stats(&self, now_micros: u64) -> Result<Stats, InspectError> {
        stats(&self.0, now_micros, &LiveLeases::new())
    }

    /// The pending claims of one work group. Blocking.
    pub fn pending(
        &self,
        group: &str,
        queue: &str,
        now_micros: u64,
    ) -> Result<Vec<PendingClaim>, InspectError> {
        pending(&self.0, group, queue, now_micros, &LiveLeases::new())
    }

    /// Up to `limit` stored messages of `queue` from `from`. Blocking.
    pub fn peek(
        &self,
        queue: &str,
        from: Option<u64>,
        limit: usize,
    ) -> Result<Vec<StoredMessage>, InspectError> {
        peek(&self.0, queue, from, limit)
    }

    /// Delayed messages (see [`scheduled`]).
    pub fn scheduled(&self, queue: Option<&str>, limit: usize) -> Result<Vec<ScheduledInfo>, InspectError> {
        scheduled(&self.0, queue, limit)
    }

    /// Recurring schedules.
    pub fn schedules(&self) -> Result<Vec<ScheduleInfo>, InspectError> {
        schedules(&self.0)
    }

    /// Up to `limit` dead letters of `dlq` not yet redriven, as stored. Blocking.
    pub fn dead_letters(&self, dlq: &str, limit: usize) -> Result<Vec<RawMessage>, InspectError> {
        dead_letters(&self.0, dlq, limit)
    }
}
