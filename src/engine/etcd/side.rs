//! What one process holds of the etcd engine: the store, its settings, the groups it owns, what
//! it knows of each work group's claim records, and the revisions its retention passes saw;
//! the idempotent reads handles make (run on the blocking pool like the RocksDB reads); and
//! retrying an idempotent request across a failed member or an election.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::known::WorkSide;
use super::owners::Owners;
use crate::engine::Engine;
use crate::engine::registry::QueueState;
use crate::error::Error;
use crate::store::etcd::EtcdStore;
use crate::store::{RawMessage, ReadOutcome};

/// How much of etcd's history a compaction keeps: longer than any request's timeout, so an
/// append whose answer was lost can still be resolved from the history, and a watch that fell
/// behind for less than this resumes without a re-read.
pub(crate) const COMPACT_WINDOW: Duration = Duration::from_secs(5 * 60);
/// The longest wait between two tries of a failed etcd request. Short: a member without a
/// leader refuses at once (the clients require one), so a try costs one small request, and
/// an election ends at a moment nobody is told of. A job's claim, read and ack each retry on
/// their own, so every path's wait past the election adds to how long a pool stays stopped
/// after it (`tests/etcd_availability.rs`).
pub(crate) const RETRY_CAP: Duration = Duration::from_millis(100);
/// How a broker talks to etcd (see [`EtcdOptions`](crate::EtcdOptions)).
#[derive(Debug, Clone)]
pub(crate) struct EtcdSettings {
    /// Each etcd request: after this, a write with an unknown outcome is given up.
    pub request_timeout: Duration,
    /// One attempt on one member: after this, the member is set aside and another asked.
    pub attempt_timeout: Duration,
    /// The lease holding an ordered group's active subscriber.
    pub owner_ttl: Duration,
    /// An inspection (`Inspector::connect_etcd`): the namespace must exist, and the engine
    /// writes nothing of its own accord — no timer firing delayed messages or schedules, no
    /// retention pass. It still answers what it is asked, as a broker would.
    pub passive: bool,
}

/// The etcd side of an engine: the store and the ownership this process holds.
pub(crate) struct EtcdSide {
    pub store: EtcdStore,
    pub settings: EtcdSettings,
    /// This process's owner id (written into owner keys).
    pub owner_id: Vec<u8>,
    pub owners: Arc<Owners>,
    /// The work groups this process has loaded, by group id.
    pub work: dashmap::DashMap<Vec<u8>, Arc<WorkSide>>,
    /// The revisions retention passes started at: how far a compaction may go.
    pub revisions: Revisions,
    /// The latest settings record of every group, by group id, with its `mod_revision`
    /// (`settings.rs`).
    pub group_settings: dashmap::DashMap<Vec<u8>, (crate::model::GroupSettings, i64)>,
    /// The earliest due time the namespace watch brought since the writer's last firing
    /// began (`u64::MAX`: none): the timer's next time counts it, so a delayed message another
    /// process wrote while this one was firing is not overlooked (`delayed.rs`).
    pub due_offers: std::sync::atomic::AtomicU64,
    /// The revision at which this process read each group it registered (by group id): a
    /// deletion at or before it is of an earlier group of the name, already gone when this
    /// one was read (`deletion.rs`).
    pub group_seen: dashmap::DashMap<Vec<u8>, i64>,
    /// The latest deletion of each group the deletion watch brought (by group id): a group
    /// registered from a read before it is forgotten once registered (`forget.rs`).
    pub group_deleted: dashmap::DashMap<Vec<u8>, i64>,
    /// Wakes the appender (`appender.rs`): a send was staged while it was idle.
    pub sends_wake: tokio::sync::Notify,
    /// Wakes the flow mover (`flows.rs`): a change record was written, by any process.
    pub flows_changed: tokio::sync::Notify,
    /// A `Move` is in the writer's channel, not yet taken: the mover sends no other (the one
    /// queued reads every change there is when the writer takes it). Cleared as the writer
    /// starts it (`Writer::move_flows`).
    pub move_queued: std::sync::atomic::AtomicBool,
}

impl EtcdSide {
    /// The revision this process read group `group` on `queue` at (`group_seen`); a group not
    /// registered here is not fenced by it.
    pub fn seen(&self, group: &str, queue: &str) -> i64 {
        self.group_seen.get(&crate::store::group_id(group, queue)).map_or(i64::MAX - 1, |s| *s)
    }

    /// Messages `from..=to` of `queue`, at most `max_bytes` of values (at least one). Blocking:
    /// runs the request on `runtime` from a blocking-pool thread.
    pub fn read_range(
        &self,
        runtime: &tokio::runtime::Handle,
        queue: &QueueState,
        from: u64,
        to: u64,
        max_bytes: usize,
    ) -> Result<ReadOutcome, Error> {
        let t = self.settings.request_timeout;
        let got = runtime.block_on(retrying(t, || self.store.read_range(queue.id, from, to, max_bytes)))?;
        let mut out = Vec::with_capacity(got.len());
        for (expected, (seq, v)) in (from..).zip(got) {
            if seq != expected {
                return self.gap_or(runtime, out, queue, expected, Some(seq));
            }
            match crate::store::etcd::decode_envelope(queue.id, seq, &v) {
                Ok(env) => out.push(RawMessage::new(seq, env)),
                // The good prefix first; the next read starts at the bad record and reports it.
                Err(_) if !out.is_empty() => return Ok(ReadOutcome::Messages(out)),
                Err(e) => return Err(e.into()),
            }
        }
        if out.is_empty() {
            return self.gap_or(runtime, out, queue, from, None);
        }
        Ok(ReadOutcome::Messages(out))
    }

    /// The messages at `seqs` (ascending) of `queue`. Blocking, as [`read_range`](Self::read_range).
    pub fn read_seqs(
        &self,
        runtime: &tokio::runtime::Handle,
        queue: &QueueState,
        seqs: &[u64],
    ) -> Result<ReadOutcome, Error> {
        let t = self.settings.request_timeout;
        let got = runtime.block_on(retrying(t, || self.store.read_seqs(queue.id, seqs)))?;
        let mut out = Vec::with_capacity(got.len());
        for (&want, (seq, v)) in seqs.iter().zip(got) {
            if seq != want {
                return self.gap_or(runtime, out, queue, want, Some(seq));
            }
            match crate::store::etcd::decode_envelope(queue.id, seq, &v) {
                Ok(env) => out.push(RawMessage::new(seq, env)),
                Err(_) if !out.is_empty() => return Ok(ReadOutcome::Messages(out)),
                Err(e) => return Err(e.into()),
            }
        }
        if out.len() < seqs.len() {
            let missing = seqs[out.len()];
            return self.gap_or(runtime, out, queue, missing, None);
        }
        Ok(ReadOutcome::Messages(out))
    }
}

impl EtcdSide {
    /// The redrive cursor of `dlq` (`None`: never redriven). Blocking, as
    /// [`read_range`](Self::read_range).
    pub fn read_cursor(
        &self,
        runtime: &tokio::runtime::Handle,
        dlq: &str,
    ) -> Result<Option<u64>, crate::error::Error> {
        let t = self.settings.request_timeout;
        let (cursor, rev) = runtime.block_on(retrying(t, || self.store.cursor(dlq)))?;
        Ok((rev != 0).then_some(cursor))
    }

    /// The dead letters of `dlq` settled on their own (marked). Blocking, as
    /// [`read_range`](Self::read_range).
    pub fn read_letter_marks(
        &self,
        runtime: &tokio::runtime::Handle,
        dlq: &str,
    ) -> Result<std::collections::BTreeSet<u64>, crate::error::Error> {
        let t = self.settings.request_timeout;
        Ok(runtime.block_on(retrying(t, || self.store.letter_marks(dlq)))?)
    }
}

impl EtcdSide {
    /// The good prefix if there is one (the next read reports the gap), else the gap. A gap
    /// is most often a trim, maybe another process's that the watch has not brought yet: the
    /// first sequence is read from the queue record first (a trim writes both in one
    /// transaction), so the reader sees the gap as trimmed and skips it.
    fn gap_or(
        &self,
        runtime: &tokio::runtime::Handle,
        out: Vec<RawMessage>,
        queue: &QueueState,
        expected: u64,
        found: Option<u64>,
    ) -> Result<ReadOutcome, Error> {
        if !out.is_empty() {
            return Ok(ReadOutcome::Messages(out));
        }
        let t = self.settings.request_timeout;
        if let Ok(Some((meta, _))) = runtime.block_on(retrying(t, || self.store.queue_record(&queue.name)))
            && meta.id == queue.id
        {
            queue.first_seq.fetch_max(meta.first_seq, std::sync::atomic::Ordering::AcqRel);
        }
        Err(Error::Gap { queue: queue.name.to_string(), expected, found })
    }
}

/// Runs an idempotent etcd operation, trying again after a failure (a member went away, an
/// election under way) until `timeout` has passed; then the last error.
pub(crate) async fn retrying<T, Fut>(
    timeout: Duration,
    mut op: impl FnMut() -> Fut,
) -> Result<T, crate::error::StorageError>
where
    Fut: std::future::Future<Output = Result<T, crate::error::StorageError>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    let mut backoff = Duration::from_millis(20);
    loop {
        // Each try is cut short at the deadline: the whole stays within `timeout`.
        match until(deadline.into_std(), op()).await {
            Ok(v) => return Ok(v),
            // A record that did not decode reads the same next time.
            Err(e) if e.is_corrupt() || tokio::time::Instant::now() + backoff >= deadline => return Err(e),
            Err(e) => {
                tracing::debug!(error = %e, "rockq: etcd request failed; trying again");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(RETRY_CAP);
            }
        }
    }
}

/// Registers queue `name` unless it is (the writer creating it, or the watch seeing another
/// process's): whoever comes second gets the state already there, so every handle of one
/// queue shares one state.
pub(crate) fn register_queue(
    engine: &Engine,
    name: &str,
    meta: &crate::model::QueueMeta,
    last: u64,
) -> Arc<QueueState> {
    let entry = engine.registry.queues.entry(Arc::from(name)).or_insert_with(|| {
        let q = QueueState::new(meta.id, name, meta.first_seq, last, meta.retention);
        q.set_dedup_window(meta.dedup_window);
        q
    });
    let q = entry.value().clone();
    drop(entry);
    q.publish_max(last);
    q
}

/// The revisions this process's passes started at, by the broker clock: where a compaction
/// may go.
#[derive(Default)]
pub(crate) struct Revisions(std::sync::Mutex<VecDeque<(Instant, i64)>>);

impl Revisions {
    /// Notes `rev` seen at `now`; returns the newest revision seen at least
    /// [`COMPACT_WINDOW`] before `now` (forgetting the older ones), if any.
    pub(super) fn note(&self, now: Instant, rev: i64) -> Option<i64> {
        let mut seen = self.0.lock().unwrap_or_else(|p| p.into_inner());
        seen.push_back((now, rev));
        let mut target = None;
        while let Some(&(at, r)) = seen.front() {
            if now.saturating_duration_since(at) < COMPACT_WINDOW {
                break;
            }
            target = Some(r);
            seen.pop_front();
        }
        target
    }
}

/// `fut`, cut short at `deadline` (an unknown outcome, as when no member answers).
pub(super) async fn until<T>(
    deadline: Instant,
    fut: impl std::future::Future<Output = Result<T, crate::error::StorageError>>,
) -> Result<T, crate::error::StorageError> {
    match tokio::time::timeout_at(deadline.into(), fut).await {
        Ok(r) => r,
        Err(_) => Err(crate::error::StorageError::unreachable("etcd: no answer before the request timeout")),
    }
}
