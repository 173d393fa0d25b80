//! The handles' half of the engine: [`Shared`], what every public handle holds — the
//! [`Engine`] state, the [`Backend`] the records live in, the writer's request channel and the
//! shutdown state. Built in one place ([`Shared::new`]) by either engine's opening. Whatever
//! differs between the engines is asked of the backend; the writer holds only the [`Engine`].

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use std::path::Path;

use tokio::sync::{broadcast, mpsc, oneshot};

use super::Engine;
use super::backend::{Backend, OwnerHold};
use super::capability::{Capability, Flavour};
use super::inbox::Staging;
use super::registry::{OrderedGroupState, QueueState, WorkGroupState};
use super::request::{FlowRequest, FlowStepSpec, Request, SettingsChange, SettingsRequest};
use crate::clock::Clock;
use crate::error::{Error, NameKind};
use crate::events::Event;
use crate::message::Message;
use crate::model::Claim;
use crate::options::Options;
use crate::retention::{ResetTo, TrimReport};
use crate::schedule::{DelayedInfo, ScheduleInfo};
use crate::stats::{JobState, JobStatus, PendingClaim, Stats, StorageStats, StoredMessage, WriterStats};
use crate::store::{RawEntry, ReadOutcome};

/// The user-side half of the engine: what every public handle holds. Owns the writer's request
/// channel, so the writer stops when the last handle is dropped.
pub(crate) struct Shared {
    /// The engine itself: private to `engine/`, so what the handles may do is the methods
    /// below (listed in `boundary.rs`).
    pub(super) engine: Arc<Engine>,
    /// Where the records live: every operation that differs between the engines goes here.
    pub(super) backend: Backend,
    pub tx: mpsc::Sender<Request>,
    pub closed: AtomicBool,
    /// The runtime the broker was opened in: its blocking pool runs reads and the close.
    pub runtime: tokio::runtime::Handle,
    /// The writer thread, joined by shutdown.
    pub writer: Mutex<Option<std::thread::JoinHandle<()>>>,
    /// Cancelled when shutdown begins: work-queue subscriptions stop claiming and worker pools
    /// drain, while acks are still accepted.
    pub closing: tokio_util::sync::CancellationToken,
    /// Cancelled once shutdown is complete: the writer has stopped, so no event comes after.
    pub stopped: tokio_util::sync::CancellationToken,
    /// Running worker pools; shutdown waits for them to drain.
    pub pools: tokio_util::task::TaskTracker,
    /// The one shutdown, once begun: every caller of [`Broker::shutdown`](crate::Broker::shutdown) awaits it.
    pub shutdown: Mutex<Option<ShutdownFuture>>,
}

/// The shared outcome of the shutdown task.
type ShutdownFuture = futures::future::Shared<futures::future::BoxFuture<'static, Result<(), Error>>>;

impl Shared {
    /// The one constructor, for either engine: `writer` is the embedded writer's thread (the
    /// etcd writer is a task, stopped through the channel); `stopped` is cancelled once
    /// shutdown is complete (the etcd engine's tasks stop on it).
    pub(super) fn new(
        engine: Arc<Engine>,
        backend: Backend,
        tx: mpsc::Sender<Request>,
        runtime: tokio::runtime::Handle,
        writer: Option<std::thread::JoinHandle<()>>,
        stopped: tokio_util::sync::CancellationToken,
    ) -> Arc<Self> {
        Arc::new(Shared {
            engine,
            backend,
            tx,
            closed: AtomicBool::new(false),
            runtime,
            writer: Mutex::new(writer),
            closing: tokio_util::sync::CancellationToken::new(),
            stopped,
            pools: tokio_util::task::TaskTracker::new(),
            shutdown: Mutex::new(None),
        })
    }

    /// Shut down, or the engine's tasks are gone (`tasks_gone`): every call is refused.
    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire) || self.tasks_gone()
    }

    /// The engine's tasks are gone without a shutdown: the etcd engine's runtime was dropped.
    pub fn tasks_gone(&self) -> bool {
        self.engine.tasks_gone.load(Ordering::Acquire)
    }

    /// Whether writes can still land: not shut down, and not failed closed.
    pub fn is_writable(&self) -> bool {
        !self.is_closed() && self.engine.failure().is_none()
    }

    /// Why the broker failed closed, if it did.
    pub fn failed(&self) -> Option<crate::error::FailedError> {
        self.engine.failure().map(Into::into)
    }

    /// The broker's clock: leases, retries, delays and enqueue times.
    pub fn clock(&self) -> &Clock {
        self.engine.clock()
    }

    pub fn options(&self) -> &Options {
        &self.engine.options
    }

    /// The database directory (an etcd broker: its namespace's label).
    pub fn path(&self) -> &Path {
        self.backend.path()
    }

    /// `Ok` if this broker's engine carries out `cap`, else the `Unsupported` refusal.
    #[inline]
    pub fn check(&self, cap: Capability) -> Result<(), Error> {
        self.backend.check(cap)
    }

    /// The largest result a flow step may carry on this engine (its name, for the refusal).
    pub fn max_step_result(&self) -> (usize, &'static str) {
        match self.backend.flavour() {
            Flavour::Embedded => (crate::stats::MAX_RESULT_BYTES, "MAX_RESULT_BYTES"),
            Flavour::Etcd => {
                (crate::flow_state::MAX_ETCD_STEP_RESULT_BYTES, "MAX_ETCD_STEP_RESULT_BYTES, on etcd")
            }
        }
    }

    /// Queue `name`, if it exists.
    pub fn queue(&self, name: &str) -> Option<Arc<QueueState>> {
        self.engine.registry.queue(name)
    }

    /// Names of all queues, sorted.
    pub fn queue_names(&self) -> Vec<String> {
        let mut names: Vec<String> = self.engine.registry.queues.iter().map(|q| q.name.to_string()).collect();
        names.sort();
        names
    }

    /// Ordered group `group` on `queue`, if it exists.
    pub fn ordered_group(&self, group: &str, queue: &str) -> Option<Arc<OrderedGroupState>> {
        self.engine.registry.ordered(group, queue)
    }

    /// Work-queue group `group` on `queue`, if it exists.
    pub fn work_group(&self, group: &str, queue: &str) -> Option<Arc<WorkGroupState>> {
        self.engine.registry.work(group, queue)
    }

    /// Work group `group` on `queue` as registered here, or — on etcd, for a group another
    /// process created after this one connected — loaded now if the store has it (its claim
    /// records read and watched, as a subscribe would). `None`: no such group. The check and
    /// the load are two steps: a group deleted between them is created again (from the
    /// default start), as a subscribe after the deletion would.
    pub async fn find_work_group(
        &self,
        group: &str,
        queue: &str,
    ) -> Result<Option<Arc<WorkGroupState>>, Error> {
        if let Some(g) = self.work_group(group, queue) {
            return Ok(Some(g));
        }
        if !self.backend.stored_work_group(group, queue).await? {
            return Ok(None);
        }
        // The group exists, so its queue does: this finds it (registering it here).
        let (reply, rx) = oneshot::channel();
        let q = self
            .ask(Request::Queue(super::request::QueueRequest::Create { name: queue.to_owned(), reply }), rx)
            .await?;
        let (reply, rx) = oneshot::channel();
        let start = crate::model::StartFrom::default();
        let req = Request::Work(super::request::WorkRequest::Create {
            queue: q,
            group: group.to_owned(),
            start,
            reply,
        });
        self.ask(req, rx).await.map(Some)
    }

    /// Stages one send call's messages for the writer's next round (see `Inbox::push`).
    pub async fn stage(&self, queue: &Arc<QueueState>, msgs: &[Message]) -> Result<Staging, Error> {
        self.engine.inbox.push(queue, msgs).await
    }

    /// Hands an ordered group whose offset moved to the writer's next round.
    pub fn mark_dirty(&self, group: Arc<OrderedGroupState>) {
        self.engine.mark_dirty(group);
    }

    /// Hands a work-queue group with queued acks to the writer's next round.
    pub fn mark_work_dirty(&self, group: Arc<WorkGroupState>) {
        self.engine.mark_work_dirty(group);
    }

    /// The lifecycle event broadcast.
    pub fn events(&self) -> &broadcast::Sender<Event> {
        &self.engine.events
    }

    /// A subscription or pool of `group` on `queue` found the store unreachable (`error` is
    /// transient): reports it (event, metric, log) and waits between half of `*backoff` and
    /// all of it (doubling it, up to 2 s) before the caller tries again. `false`: the broker
    /// is closing, do not.
    ///
    /// The wait is jittered: every subscription of every process meets an outage at once,
    /// and without it they would all come back in the same instant, each time.
    pub async fn ride_out(
        &self,
        queue: &Arc<str>,
        group: &Arc<str>,
        error: &crate::error::StorageError,
        backoff: &mut std::time::Duration,
    ) -> bool {
        let retry_in = jittered(*backoff, fastrand::f64());
        *backoff = (*backoff * 2).min(std::time::Duration::from_secs(2));
        crate::telemetry::group_counter(crate::telemetry::STORE_UNAVAILABLE, queue, group, 1);
        tracing::warn!(%queue, %group, %error, ?retry_in, "rockq: the store is unreachable; the consumer waits and tries again");
        self.emit(|| Event::StoreUnavailable {
            queue: queue.clone(),
            group: group.clone(),
            error: error.message().to_owned(),
            retry_in,
        });
        let clock = self.clock().clone();
        tokio::select! {
            _ = clock.sleep_until(clock.after(retry_in)) => true,
            _ = self.closing.cancelled() => false,
        }
    }

    /// Broadcasts an event if anyone listens.
    pub fn emit(&self, event: impl FnOnce() -> Event) {
        self.engine.emit(event);
    }

    pub fn writer_stats(&self) -> WriterStats {
        self.engine.counters.snapshot()
    }

    pub fn storage_stats(&self) -> Option<StorageStats> {
        self.backend.storage_stats()
    }

    /// Reads messages `from..=to` of `queue` (at most `max_bytes` of values). Blocking.
    pub fn read_range(
        &self,
        queue: &QueueState,
        from: u64,
        to: u64,
        max_bytes: usize,
    ) -> Result<ReadOutcome, Error> {
        self.backend.read_range(&self.runtime, self.is_closed(), queue, from, to, max_bytes)
    }

    /// Reads the messages at `seqs` (ascending) of `queue`. Blocking.
    pub fn read_seqs(&self, queue: &QueueState, seqs: &[u64]) -> Result<ReadOutcome, Error> {
        self.backend.read_seqs(&self.runtime, self.is_closed(), queue, seqs)
    }

    /// How far dead-letter queue `dlq` has been redriven. Blocking.
    pub fn read_cursor(&self, dlq: &str) -> Result<Option<u64>, Error> {
        self.backend.read_cursor(&self.runtime, dlq)
    }

    /// The dead letters of `dlq` settled on their own above its cursor. Blocking.
    pub fn read_letter_marks(&self, dlq: &str) -> Result<std::collections::BTreeSet<u64>, Error> {
        self.backend.read_letter_marks(&self.runtime, dlq)
    }

    /// Takes the cross-process ownership of ordered group `group` for a new subscription: with
    /// the embedded engine, the in-process active slot (taken by the caller) is all there is.
    pub async fn own_ordered(&self, group: &Arc<OrderedGroupState>) -> Result<OwnerHold, Error> {
        self.backend.own_ordered(group, &self.tx).await
    }

    /// Persists extension `number` of `seq`'s lease (the latest deadline `lease` asks for)
    /// where other processes must see it (the etcd engine; the embedded one keeps extensions in
    /// memory). If that fails, the holder's `lease` and the group's go back to the deadline
    /// others read. Never blocks.
    pub fn persist_extension(
        &self,
        group: &Arc<WorkGroupState>,
        seq: u64,
        (attempt, token): (u32, u64),
        number: u64,
        lease: &Arc<std::sync::Mutex<crate::engine::request::HeldLease>>,
        holder: &Arc<str>,
    ) {
        let extension = crate::engine::request::Extension {
            group: group.clone(),
            seq,
            attempt,
            token,
            holder: holder.clone(),
            number,
            lease: lease.clone(),
        };
        self.backend.persist_extension(&self.tx, &self.runtime, extension);
    }

    /// Refuses a send call this broker's engine cannot carry out as it stands (nothing to
    /// check for the embedded engine).
    #[inline]
    pub fn check_send(&self, msgs: &[Message]) -> Result<(), Error> {
        self.backend.check_send(msgs)
    }

    /// Keyspace `name`, if it exists.
    pub fn keyspace(&self, name: &str) -> Option<Arc<super::registry::KeyspaceState>> {
        self.engine.registry.keyspace(name)
    }

    /// Every keyspace, sorted by name.
    pub fn keyspaces(&self) -> Vec<Arc<super::registry::KeyspaceState>> {
        let mut all: Vec<_> = self.engine.registry.keyspaces.iter().map(|k| k.clone()).collect();
        all.sort_by(|a, b| a.name.cmp(&b.name));
        all
    }

    /// `key` of keyspace `keyspace`: its revision and value. Blocking.
    pub fn kv_get(&self, keyspace: u32, key: &[u8]) -> Result<Option<(u64, Vec<u8>)>, Error> {
        if self.is_closed() {
            return Err(Error::Shutdown);
        }
        // Closed between the check and the read: that is a shutdown, not a storage error.
        self.backend
            .kv_get(&self.runtime, keyspace, key)
            .map_err(|e| if self.is_closed() { Error::Shutdown } else { e })
    }

    /// Up to `limit` entries of keyspace `keyspace` in `[from, to)`, in key order. Blocking.
    pub fn kv_scan(
        &self,
        keyspace: u32,
        from: &[u8],
        to: Option<&[u8]>,
        limit: usize,
    ) -> Result<Vec<RawEntry>, Error> {
        if self.is_closed() {
            return Err(Error::Shutdown);
        }
        self.backend
            .kv_scan(&self.runtime, keyspace, from, to, limit)
            .map_err(|e| if self.is_closed() { Error::Shutdown } else { e })
    }

    /// Every queue and group: what the store holds, with this process's leases and in-flight
    /// deliveries laid over it.
    pub async fn stats(&self) -> Result<Stats, Error> {
        self.open_for_reads()?;
        self.backend.stats(&self.engine, &self.runtime).await
    }

    /// Writes a consistent copy of the store into `dir` (`Broker::backup`).
    pub async fn backup(&self, dir: std::path::PathBuf) -> Result<crate::backup::BackupReport, Error> {
        self.check(Capability::Backup)?;
        self.open_for_reads()?;
        self.backend.backup(&self.runtime, dir).await
    }

    /// Writes an export of the store to `out`.
    #[cfg(feature = "json")]
    pub async fn export(
        &self,
        out: Box<dyn std::io::Write + Send>,
        progress: Option<crate::export::ProgressFn>,
    ) -> Result<crate::export::TransferReport, Error> {
        self.check(Capability::Export)?;
        self.open_for_reads()?;
        let now = self.clock().wall_micros();
        self.backend.export(&self.runtime, now, out, progress).await
    }

    /// The pending claims of one work group, with this process's lease deadlines.
    pub async fn pending(&self, group: &str, queue: &str) -> Result<Vec<PendingClaim>, Error> {
        self.open_for_reads()?;
        self.backend.pending(&self.engine, &self.runtime, group, queue).await
    }

    /// Where job `seq` of work group `group` on `queue` stands: this process's view of the
    /// group (on etcd, with what other processes' records said), and for a lease, its holder
    /// from the claim record.
    pub async fn job(&self, group: &str, queue: &str, seq: u64) -> Result<JobStatus, Error> {
        self.open_for_reads()?;
        let g = self
            .find_work_group(group, queue)
            .await?
            .ok_or_else(|| Error::NoSuchGroup { group: group.to_owned(), queue: queue.to_owned() })?;
        if g.is_deleted() {
            return Err(Error::GroupDeleted { queue: queue.to_owned(), group: group.to_owned() });
        }
        let mut status = g.status(seq, self.clock().now()).ok_or_else(|| Error::NoSuchJob {
            queue: queue.to_owned(),
            group: group.to_owned(),
            seq,
        })?;
        if status.state.is_final() {
            return self.with_outcome(&g, status).await;
        }
        if self.backend.flavour() == Flavour::Etcd && !g.progress_queued(seq) {
            // What etcd holds: this process's slot keeps the reports of its own attempts,
            // and another process's holder may have written a newer one since.
            status.progress = self.backend.progress(group, queue, seq).await?;
        }
        if matches!(status.state, JobState::Leased { .. } | JobState::Expired) {
            let record = self.backend.claim(&self.engine, &self.runtime, group, queue, seq).await?;
            // Only the record of this attempt names its holder: an older one (the claim's
            // record not written yet) names the previous attempt's.
            if let Some(Claim::Leased { attempt, holder, .. }) = record
                && attempt == status.attempt
                && !holder.is_empty()
            {
                status.holder = Some(holder.to_string());
            }
        }
        Ok(status)
    }

    /// A final `status` with the job's kept outcome, if there is one: it is written in the
    /// write that finished the job, so it is there once memory says finished (and it outlives
    /// the message: a removed job with an outcome was finished first).
    async fn with_outcome(&self, g: &WorkGroupState, mut status: JobStatus) -> Result<JobStatus, Error> {
        // A group that keeps none has none to read (what it kept before it stopped goes at
        // the next retention pass): no read on the blocking pool.
        if !g.keeps_outcomes() {
            return Ok(status);
        }
        let (group, queue) = (&g.name, &g.queue.name);
        if let Some(o) = self.backend.outcome(&self.engine, &self.runtime, group, queue, status.seq).await? {
            status.state = JobState::Finished;
            status.outcome = Some(o);
        }
        Ok(status)
    }

    /// Waits until job `seq` of work group `group` on `queue` is final (finished or removed)
    /// and returns its status, woken by the group's `settled` signal: no polling.
    pub async fn wait_job(&self, group: &str, queue: &str, seq: u64) -> Result<JobStatus, Error> {
        self.open_for_reads()?;
        let g = self
            .find_work_group(group, queue)
            .await?
            .ok_or_else(|| Error::NoSuchGroup { group: group.to_owned(), queue: queue.to_owned() })?;
        loop {
            // Registered before the look, so a change between the look and the wait wakes it.
            let settled = g.settled.notified();
            tokio::pin!(settled);
            settled.as_mut().enable();
            if g.is_deleted() {
                return Err(Error::GroupDeleted { queue: queue.to_owned(), group: group.to_owned() });
            }
            let status = g.status(seq, self.clock().now()).ok_or_else(|| Error::NoSuchJob {
                queue: queue.to_owned(),
                group: group.to_owned(),
                seq,
            })?;
            if status.state.is_final() {
                return self.with_outcome(&g, status).await;
            }
            // From the moment a shutdown starts (`closing`), not when it ends (`closed`): the
            // shutdown waits for worker pools to drain first, and a wait polled beside it (one
            // task, `join!`) must not keep it from getting there.
            if self.is_closed() || self.closing.is_cancelled() {
                return Err(Error::Shutdown);
            }
            if let Some(failed) = self.failed() {
                // Failed closed: no outcome becomes durable in this process any more.
                return Err(Error::Failed(failed));
            }
            tokio::select! {
                _ = settled => {}
                _ = self.closing.cancelled() => {}
            }
        }
    }

    /// Stores a flow and sends its first steps (`Broker::flow`).
    pub async fn submit_flow(&self, steps: Vec<FlowStepSpec>) -> Result<crate::flow_state::Submitted, Error> {
        self.check(Capability::Flows)?;
        let (reply, rx) = oneshot::channel();
        self.ask(Request::Flow(FlowRequest::Submit { steps, reply }), rx).await
    }

    /// Deletes flow `id`'s records; `false` if there is none.
    pub async fn delete_flow(&self, id: u64) -> Result<bool, Error> {
        self.check(Capability::Flows)?;
        let (reply, rx) = oneshot::channel();
        self.ask(Request::Flow(FlowRequest::Delete { id, reply }), rx).await
    }

    /// Flow `id` as stored.
    pub async fn flow_status(&self, id: u64) -> Result<crate::flow_state::FlowStatus, Error> {
        self.check(Capability::Flows)?;
        self.open_for_reads()?;
        self.backend.flow_status(&self.engine, &self.runtime, id).await?.ok_or(Error::NoSuchFlow { flow: id })
    }

    /// Up to `limit` flow ids from `from`, in id order.
    pub async fn flow_ids(&self, from: u64, limit: usize) -> Result<Vec<u64>, Error> {
        self.check(Capability::Flows)?;
        self.open_for_reads()?;
        self.backend.flow_ids(&self.engine, &self.runtime, from, limit).await
    }

    /// Up to `limit` stored messages of `queue` from `from`.
    pub async fn peek(
        &self,
        queue: &str,
        from: Option<u64>,
        limit: usize,
    ) -> Result<Vec<StoredMessage>, Error> {
        self.open_for_reads()?;
        self.backend.peek(&self.engine, &self.runtime, queue, from, limit).await
    }

    /// Up to `limit` delayed messages of `queue` (all queues: `None`).
    pub async fn scheduled(&self, queue: Option<String>, limit: usize) -> Result<Vec<DelayedInfo>, Error> {
        self.open_for_reads()?;
        self.backend.scheduled(&self.engine, &self.runtime, queue, limit).await
    }

    /// Every recurring schedule.
    pub async fn schedules(&self) -> Result<Vec<ScheduleInfo>, Error> {
        self.open_for_reads()?;
        self.backend.schedules(&self.engine, &self.runtime).await
    }

    /// One retention pass over every queue; compacts what it trimmed if `compact` (`None`:
    /// if it deleted many messages).
    pub async fn trim(&self, compact: Option<bool>) -> Result<TrimReport, Error> {
        self.open_for_reads()?;
        self.backend.retention_pass(&self.engine, &self.tx, &self.runtime, compact).await
    }

    /// The sequence a reset of a group on `queue` to `to` starts at, if it is retained.
    pub async fn reset_target(&self, queue: &Arc<QueueState>, to: ResetTo) -> Result<u64, Error> {
        self.check(Capability::ResetGroup)?;
        self.backend.reset_target(&self.runtime, queue, to).await
    }

    /// `Shutdown` once the broker is closed: reads of a closed store are refused.
    fn open_for_reads(&self) -> Result<(), Error> {
        match self.is_closed() {
            true => Err(Error::Shutdown),
            false => Ok(()),
        }
    }

    /// Stops the engine: work subscriptions stop claiming and worker pools drain, new requests
    /// are refused, the writer finishes everything queued before this and stops, subscribers
    /// are woken to see the end, and the store is closed on the blocking pool.
    pub async fn close(&self) -> Result<(), Error> {
        if self.closed.load(Ordering::Acquire) {
            return Ok(());
        }
        if self.tasks_gone() {
            // The etcd engine's runtime is gone, and its tasks with it: nothing is left to
            // drain, flush or close, and nothing to run this on. Its waiters were woken as the
            // tasks went (`Engine::lose_tasks`); pools stop claiming.
            self.closing.cancel();
            self.closed.store(true, Ordering::Release);
            self.stopped.cancel();
            return Ok(());
        }
        // Worker pools first: they stop claiming and drain (their acks still land).
        self.closing.cancel();
        self.pools.close();
        self.pools.wait().await;
        if self.closed.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        let (reply, rx) = oneshot::channel();
        let flushed = match self.tx.send(Request::Shutdown { reply }).await {
            Ok(()) => rx.await.unwrap_or(Ok(())),
            Err(_) => Ok(()),
        };
        let handle = self.writer.lock().unwrap_or_else(|p| p.into_inner()).take();
        let engine = self.engine.clone();
        let closed_by = self.backend.clone();
        let joined = self
            .runtime
            .spawn_blocking(move || {
                let joined = handle.map(|h| h.join().is_ok()).unwrap_or(true);
                // Wake every subscriber so its stream observes the shutdown and ends.
                for q in engine.registry.queues.iter() {
                    q.poke();
                }
                (joined, closed_by.close())
            })
            .await;
        let (joined, closed) = joined.unwrap_or((false, Ok(())));
        self.stopped.cancel();
        flushed?;
        closed?;
        if !joined {
            return Err(Error::WriterPanicked);
        }
        tracing::info!(path = %self.path().display(), "rockq: shut down");
        Ok(())
    }

    /// Asks the writer to delete group `group` on `queue`, either mode (names checked by the
    /// caller); `false` if there is none.
    pub async fn delete_group(&self, queue: &str, group: &str) -> Result<bool, crate::error::Error> {
        let (reply, rx) = oneshot::channel();
        let req = Request::Lifecycle(super::request::LifecycleRequest::DeleteGroup {
            queue: queue.to_owned(),
            group: group.to_owned(),
            reply,
        });
        self.ask(req, rx).await
    }

    /// Hands `req` to the writer and waits for its answer on `rx`: refused with `Shutdown` once
    /// the broker is closed, or if the writer is gone.
    pub async fn ask<T>(&self, req: Request, rx: oneshot::Receiver<Result<T, Error>>) -> Result<T, Error> {
        let gone = || Error::Shutdown;
        if self.is_closed() {
            return Err(gone());
        }
        self.tx.send(req).await.map_err(|_| gone())?;
        rx.await.map_err(|_| gone())?
    }

    /// Wakes the writer to commit dirty groups. Never blocks: if the channel is full the writer
    /// has work queued and takes the dirty list in its next round anyway.
    pub fn nudge_writer(&self) {
        let _ = self.tx.try_send(Request::Commit);
    }

    /// Wakes the task that writes staged sends (a send staged while it was idle): the writer,
    /// or the etcd engine's appender.
    pub fn nudge_sends(&self) {
        if !self.backend.wake_appender() {
            self.nudge_writer();
        }
    }

    /// Pauses or resumes `group` on `queue` (either mode), durably.
    pub async fn set_paused(&self, queue: &Arc<QueueState>, group: &str, paused: bool) -> Result<(), Error> {
        crate::name::validate(NameKind::Group, group)?;
        if self.is_closed() {
            return Err(Error::Shutdown);
        }
        // On etcd a group another process created is not registered here: the writer asks etcd.
        if self.backend.flavour() == Flavour::Embedded && !self.engine.registry.has_group(group, &queue.name)
        {
            return Err(Error::NoSuchGroup { group: group.to_owned(), queue: queue.name.to_string() });
        }
        let (reply, rx) = oneshot::channel();
        let change = SettingsChange::Paused(paused);
        let req = SettingsRequest { queue: queue.clone(), group: group.to_owned(), change, reply };
        self.tx.send(Request::Settings(req)).await.map_err(|_| Error::Shutdown)?;
        rx.await.map_err(|_| Error::Shutdown)??;
        let what = if paused { "rockq: group paused" } else { "rockq: group resumed" };
        tracing::info!(%group, queue = %queue.name, "{what}");
        Ok(())
    }

    /// Whether `group` on `queue` is paused (false if it does not exist).
    pub fn is_paused(&self, queue: &QueueState, group: &str) -> bool {
        let r = &self.engine.registry;
        r.ordered(group, &queue.name).is_some_and(|g| g.paused.load(Ordering::Acquire))
            || r.work(group, &queue.name).is_some_and(|g| g.paused.load(Ordering::Acquire))
    }

    /// Registers a running worker pool, unless shutdown has begun.
    pub fn pool_started(&self) -> Option<tokio_util::task::task_tracker::TaskTrackerToken> {
        if self.closing.is_cancelled() || self.is_closed() {
            return None;
        }
        Some(self.pools.token())
    }
}

/// The last handle is gone: the background tasks (retention, the schedule's timer) stop with it.
impl Drop for Shared {
    fn drop(&mut self) {
        self.closing.cancel();
    }
}

/// Between half of `backoff` and all of it, as `unit` (in `[0, 1)`) says ("equal jitter": never
/// less than half, so a backoff still backs off).
fn jittered(backoff: std::time::Duration, unit: f64) -> std::time::Duration {
    backoff.mul_f64(0.5 + 0.5 * unit.clamp(0.0, 1.0))
}

#[cfg(test)]
mod jitter_tests {
    use std::time::Duration;

    #[test]
    fn a_ride_out_waits_between_half_its_backoff_and_all_of_it() {
        let b = Duration::from_millis(800);
        assert_eq!(super::jittered(b, 0.0), Duration::from_millis(400));
        assert_eq!(super::jittered(b, 0.5), Duration::from_millis(600));
        assert!(super::jittered(b, 0.999_999) <= b);
        let seen: std::collections::HashSet<_> =
            (0..64).map(|_| super::jittered(b, fastrand::f64())).collect();
        assert!(seen.iter().all(|d| (Duration::from_millis(400)..=b).contains(d)), "{seen:?}");
        assert!(seen.len() > 1, "jittered, not fixed");
    }
}
