//! [`WorkSubscription`]: a work-queue group's jobs as a `futures::Stream`.

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::task::{Context, Poll};

use futures::future::BoxFuture;
use futures::{FutureExt, Stream};
use tokio::sync::{Semaphore, oneshot};

use super::job::{Job, JobInner};
use super::limits::HandleLimits;
use crate::engine::boundary::{
    self, Claimed, Outcome, QueueState, ReadOutcome, Request, SettlingGuard, Shared, WorkGroupState,
    WorkRequest,
};
use crate::error::{CorruptionError, Error};
use crate::events::Event;
use crate::model::Claim;

/// The jobs of a work-queue group, as a `Stream<Item = Result<Job, Error>>`.
///
/// Each item is a [`Job`] leased to this subscription. Claims are written (with their attempt
/// numbers) before the jobs are handed out; payloads are read with one multi-get per claim
/// batch on Tokio's blocking pool. With nothing claimable the stream waits — for new messages
/// (the writer's wake-up), for a released message, or for the next lease expiry or retry time
/// (a timer on the broker's [`Clock`](crate::Clock)) — never polling.
///
/// At most [`max_in_flight`](crate::WorkGroup::max_in_flight) jobs are held at once; when that
/// bound stays hit for longer than
/// [`saturation_after`](crate::WorkGroup::saturation_after), the stream reports it once per
/// wait. The stream ends when the broker shuts down; it yields an `Err` and ends if a claimed
/// message cannot be read.
///
/// # Cancel safety
///
/// `next()` (`StreamExt::next`) is cancel safe: a claim in progress and the jobs claimed ahead
/// stay with the subscription, and a job counts as handed out only when `next()` returns it.
/// Dropping a `next()` future (a `select!` branch losing) loses no job; the next call hands
/// it out. Meanwhile the buffered jobs' leases run: one whose lease ran out before it was
/// handed out is released without counting its attempt.
pub struct WorkSubscription {
    ctx: Arc<Ctx>,
    buffer: VecDeque<Job>,
    /// The claim in progress. In a `Mutex` only so that the stream is `Sync`; `poll_next` has
    /// `&mut self` and never locks.
    fetch: std::sync::Mutex<Option<Fetch>>,
    /// A claim came back empty: the broker is shutting down; end after the buffer.
    ending: bool,
    /// A claim failed: yielded after the buffer, then the stream ends.
    error: Option<Error>,
    done: bool,
}

/// Claiming the next batch; an empty batch means the stream is over.
type Fetch = BoxFuture<'static, Result<Vec<Job>, Error>>;

struct Ctx {
    shared: Arc<Shared>,
    group: Arc<WorkGroupState>,
    config: Arc<HandleLimits>,
    permits: Arc<Semaphore>,
    /// The largest claim: `config.claim_batch`, unless a worker pool adapts it.
    claim_batch: std::sync::atomic::AtomicUsize,
    /// The in-flight bound in force: `config.max_in_flight`, less what a worker pool holds
    /// back (see `work/adapt.rs`).
    limit: std::sync::atomic::AtomicUsize,
    /// How long a claim takes from its request to its answer and read, in microseconds (a
    /// moving average; 0 before the first): a worker pool holds at least this much work
    /// ahead (`pool/adapt.rs`), or its handlers wait for every claim — on etcd a claim
    /// waits for the writer's round of transactions, milliseconds, not microseconds.
    claim_micros: std::sync::atomic::AtomicU64,
}

impl std::fmt::Debug for WorkSubscription {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkSubscription")
            .field("queue", &self.ctx.group.queue.name)
            .field("group", &self.ctx.group.name)
            .field("buffered", &self.buffer.len())
            .finish()
    }
}

impl WorkSubscription {
    pub(crate) fn new(shared: Arc<Shared>, group: Arc<WorkGroupState>, config: Arc<HandleLimits>) -> Self {
        group.subscriptions.fetch_add(1, Ordering::AcqRel);
        let permits = Arc::new(Semaphore::new(config.max_in_flight));
        WorkSubscription {
            ctx: Arc::new(Ctx {
                claim_batch: std::sync::atomic::AtomicUsize::new(config.claim_batch),
                limit: std::sync::atomic::AtomicUsize::new(config.max_in_flight),
                claim_micros: std::sync::atomic::AtomicU64::new(0),
                shared,
                group,
                config,
                permits,
            }),
            buffer: VecDeque::new(),
            fetch: std::sync::Mutex::new(None),
            ending: false,
            error: None,
            done: false,
        }
    }

    pub(crate) fn state(&self) -> &Arc<WorkGroupState> {
        &self.ctx.group
    }

    /// The in-flight permits, for a worker pool that holds some back (see `work/adapt.rs`).
    pub(crate) fn permits(&self) -> &Arc<Semaphore> {
        &self.ctx.permits
    }

    /// Sets the in-flight bound in force and the largest claim (a worker pool adapting its
    /// prefetch; it holds back the permits above `limit`).
    pub(crate) fn set_limit(&self, limit: usize, claim_batch: usize) {
        self.ctx.limit.store(limit, Ordering::Relaxed);
        self.ctx.claim_batch.store(claim_batch.max(1), Ordering::Relaxed);
    }

    /// How long this subscription's claims take, request to answer (a moving average over
    /// the last few; zero before the first).
    pub(crate) fn claim_latency(&self) -> std::time::Duration {
        std::time::Duration::from_micros(self.ctx.claim_micros.load(Ordering::Relaxed))
    }

    /// Jobs this subscription holds (handed out or buffered, not settled).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(queue: rockq::Queue) -> Result<(), rockq::Error> {
    /// use futures::StreamExt;
    /// let mut jobs = queue.work_group("mailer")?.max_in_flight(8).subscribe().await?;
    /// if let Some(job) = jobs.next().await {
    ///     let job = job?;
    ///     assert!(jobs.in_flight() >= 1); // this job is held until settled
    ///     job.ack()?;
    /// }
    /// # Ok(()) }
    /// ```
    pub fn in_flight(&self) -> usize {
        self.ctx.limit.load(Ordering::Relaxed).saturating_sub(self.ctx.permits.available_permits())
    }
}

impl Drop for WorkSubscription {
    fn drop(&mut self) {
        self.ctx.group.subscriptions.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Stream for WorkSubscription {
    type Item = Result<Job, Error>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        loop {
            if this.done {
                return Poll::Ready(None);
            }
            if this.ctx.group.is_deleted() {
                // Jobs claimed and not handed out are dropped (they could not settle anyway).
                this.buffer.clear();
                this.done = true;
                return Poll::Ready(Some(Err(deleted(&this.ctx.group))));
            }
            // Buffered jobs whose leases ran out go first, released uncounted: a claim driven
            // below would otherwise take them as expired leases, their attempts counted,
            // though no handler ever saw them. (Claimed in order with one lease term, the
            // oldest deadline is at the front.)
            if this.buffer.front().is_some_and(Job::is_stale) {
                this.buffer.retain(|j| !j.is_stale());
            }
            let slot = this.fetch.get_mut().unwrap_or_else(|p| p.into_inner());
            // Drive the claim in progress, if any.
            if let Some(fut) = slot.as_mut()
                && let Poll::Ready(res) = fut.poll_unpin(cx)
            {
                *slot = None;
                match res {
                    Ok(jobs) if jobs.is_empty() => this.ending = true,
                    Ok(jobs) => this.buffer.extend(jobs),
                    Err(e) => this.error = Some(e),
                }
            }
            if let Some(job) = this.buffer.pop_front() {
                // Claim the next batch while the consumer works through this one, if the
                // in-flight bound leaves room.
                if slot.is_none()
                    && !this.ending
                    && this.error.is_none()
                    && this.buffer.len() <= this.ctx.claim_batch() / 2
                    // Enough room for a worthwhile batch: claiming one message per write
                    // would make every message cost a round trip.
                    && this.ctx.permits.available_permits() >= this.ctx.claim_batch().div_ceil(2)
                {
                    *slot = Some(fetch(this.ctx.clone()).boxed());
                }
                if job.is_stale() {
                    // Dropped unseen, it is released without counting (unless already
                    // claimed again).
                    continue;
                }
                // Handed out: from now on dropping it counts as an attempt.
                job.inner().uncounted.store(false, Ordering::Release);
                return Poll::Ready(Some(Ok(job)));
            }
            if let Some(e) = this.error.take() {
                this.done = true;
                return Poll::Ready(Some(Err(e)));
            }
            if this.ending {
                this.done = true;
                continue;
            }
            if slot.is_none() {
                *slot = Some(fetch(this.ctx.clone()).boxed());
                continue;
            }
            return Poll::Pending;
        }
    }
}

/// The error a deleted group's subscription ends with.
fn deleted(g: &WorkGroupState) -> Error {
    Error::GroupDeleted { queue: g.queue.name.to_string(), group: g.name.to_string() }
}

impl Ctx {
    fn claim_batch(&self) -> usize {
        self.claim_batch.load(Ordering::Relaxed)
    }

    /// Folds one claim's time into the moving average (a quarter weight: a few claims move
    /// it, one slow one does not double the pool's prefetch).
    fn note_claim_latency(&self, took: std::time::Duration) {
        let sample = u64::try_from(took.as_micros()).unwrap_or(u64::MAX).max(1);
        let old = self.claim_micros.load(Ordering::Relaxed);
        let new = if old == 0 { sample } else { old.saturating_mul(3).saturating_add(sample) / 4 };
        self.claim_micros.store(new, Ordering::Relaxed);
    }
}

/// Reverts the exhausted messages whose dead-letter request was not sent yet.
struct ExhaustedGuard<'a> {
    group: &'a WorkGroupState,
    rest: Vec<u64>,
}

impl Drop for ExhaustedGuard<'_> {
    fn drop(&mut self) {
        for &seq in &self.rest {
            self.group.revert(seq);
        }
    }
}

/// Releases claims (without counting the attempt) unless disarmed: a fetch dropped or failed
/// between claiming and handing out leaves nothing held.
struct ClaimGuard {
    group: Arc<WorkGroupState>,
    claims: Vec<(u64, u64)>,
}

impl Drop for ClaimGuard {
    fn drop(&mut self) {
        for &(seq, token) in &self.claims {
            self.group.release(seq, token, false);
        }
    }
}

/// Queues the outcome `outcome` of the `Settling` message `seq` with the writer. If this
/// future is dropped or the broker is closing before the request is queued, the message is put
/// back to claimable; once queued, the writer reverts it itself if it refuses the outcome.
async fn send_settle(
    shared: &Shared,
    group: &Arc<WorkGroupState>,
    (seq, attempt, epoch): (u64, u32, u64),
    outcome: Outcome,
) -> Option<oneshot::Receiver<Result<(), Error>>> {
    let mut guard = SettlingGuard { group, seq, armed: true };
    let (reply, rx) = oneshot::channel();
    let req = Request::Work(WorkRequest::Outcome {
        group: group.clone(),
        seq,
        attempt,
        epoch,
        outcome,
        taken_from: None,
        reply,
    });
    shared.tx.send(req).await.ok()?;
    guard.armed = false;
    Some(rx)
}

/// Moves the claimed message `c`, whose stored record does not decode, to the group's
/// dead-letter queue, fenced like a handler's outcome.
async fn dead_letter_corrupt(ctx: &Arc<Ctx>, c: &Claimed, err: &CorruptionError) -> Result<(), Error> {
    let (shared, group) = (&ctx.shared, &ctx.group);
    if group.begin_settle(c.seq, c.token, shared.clock().now()).is_err() {
        // The lease is gone already: whoever holds the message now meets the same record.
        return Ok(());
    }
    tracing::warn!(queue = %group.queue.name, group = %group.name, seq = c.seq, error = %err,
        "rockq: stored message is corrupted; dead-lettering it");
    let outcome = Outcome::DeadLetter {
        reason: format!("corrupted message: {err}"),
        dlq: ctx.config.settings(group).dead_letter_queue.clone(),
    };
    let Some(rx) = send_settle(shared, group, (c.seq, c.attempt, c.epoch), outcome).await else {
        return Ok(());
    };
    match rx.await {
        Ok(Ok(())) | Ok(Err(Error::Shutdown | Error::LeaseLost { .. })) | Err(_) => Ok(()),
        Ok(Err(e)) => Err(e),
    }
}

/// Upper bound on the bytes one claim reads, whatever `claim_batch × max_message_bytes` is (as
/// for ordered reads): the claims beyond it are released and claimed again.
const CLAIM_READ_BYTES: usize = 4 << 20;

/// Why a message whose attempts are used up is dead-lettered: its last recorded error, or that
/// its last lease ran out with no outcome at all (the holder crashed or hung, or its outcome
/// never reached the store).
fn exhausted_reason(attempts: u32, last_error: &str) -> String {
    if last_error.is_empty() {
        format!(
            "{attempts} attempts used up; the last one's lease ran out with no outcome recorded (its holder crashed, hung, or could not reach the store)"
        )
    } else {
        format!("{attempts} attempts used up; last error: {last_error}")
    }
}

/// Claims the next batch of jobs. An empty result means the broker is shutting down.
/// A store that cannot be reached (a transient error: on etcd, no member answered within the
/// request timeout) does not end the subscription: the claims of the failed try are given back
/// uncounted (an attempt the store never recorded is not the job's failure), the outage is
/// reported (`Event::StoreUnavailable`), and it tries again after a backoff.
async fn fetch(ctx: Arc<Ctx>) -> Result<Vec<Job>, Error> {
    let mut backoff = std::time::Duration::from_millis(100);
    loop {
        match fetch_once(&ctx).await {
            Ok(Some(jobs)) => return Ok(jobs),
            Ok(None) => {}
            Err(Error::Storage(e)) if e.is_transient() => {
                let g = &ctx.group;
                if !ctx.shared.ride_out(&g.queue.name, &g.name, &e, &mut backoff).await {
                    return Ok(Vec::new());
                }
            }
            Err(e) => return Err(e),
        }
    }
}

/// One claim. `None`: retention deleted claimed messages under it (their claims were
/// released); claim again.
async fn fetch_once(ctx: &Arc<Ctx>) -> Result<Option<Vec<Job>>, Error> {
    let shared = &ctx.shared;
    let clock = shared.clock().clone();
    let group = &ctx.group;
    let cfg = &ctx.config;
    let internal = |e: tokio::sync::AcquireError| Error::Internal(e.to_string());

    // Room first: a saturated subscription claims nothing (so holds no lease it cannot use).
    let first = match ctx.permits.clone().try_acquire_owned() {
        Ok(p) => p,
        Err(_) => {
            let acquire = ctx.permits.clone().acquire_owned();
            tokio::pin!(acquire);
            tokio::select! {
                p = &mut acquire => p.map_err(internal)?,
                _ = clock.sleep_until(clock.now() + cfg.saturation_after) => {
                    group.report_saturation(shared.events(), ctx.limit.load(Ordering::Relaxed));
                    tokio::select! {
                        p = &mut acquire => p.map_err(internal)?,
                        _ = shared.closing.cancelled() => return Ok(Some(Vec::new())),
                    }
                }
                _ = shared.closing.cancelled() => return Ok(Some(Vec::new())),
            }
        }
    };
    let mut permits = vec![first];
    let batch = ctx.claim_batch();
    while permits.len() < batch {
        match ctx.permits.clone().try_acquire_owned() {
            Ok(p) => permits.push(p),
            Err(_) => break,
        }
    }

    let (mut last_rx, _watching) = group.queue.watch();
    let (mut claimed, bucket, limit_rev): (Vec<Claimed>, Option<std::time::Instant>, Option<i64>) = loop {
        if shared.is_closed() || shared.closing.is_cancelled() {
            return Ok(Some(Vec::new()));
        }
        if group.is_deleted() {
            return Err(deleted(group));
        }
        // Registered before looking, so a release between the look and the wait is not missed.
        let notified = group.changed.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        last_rx.borrow_and_update();
        let last = group.queue.last_seq();
        if group.paused.load(Ordering::Acquire) {
            // Paused: claim nothing until resumed (the writer notifies `changed`).
            tokio::select! {
                _ = notified => {}
                changed = last_rx.changed() => if changed.is_err() { return Ok(Some(Vec::new())) },
                _ = shared.closing.cancelled() => return Ok(Some(Vec::new())),
            }
            continue;
        }
        // Ordered by key: read the keys of what may be claimed next (see `keyed.rs`).
        let learned = match group.keyed() {
            true => match super::keyed::learn(shared, group, last).await? {
                super::keyed::Learned::Closed => return Ok(Some(Vec::new())),
                super::keyed::Learned::Progress => true,
                super::keyed::Learned::Nothing => false,
            },
            false => false,
        };
        // Read per claim: an update of the group's settings applies to the next claim.
        let settings = cfg.settings(group);
        let take = group.take(
            clock.now(),
            permits.len(),
            last,
            settings.lease,
            settings.policy.attempts(),
            cfg.priority_share,
        );
        // Attempts used up (a crash loop, or expired leases): dead-letter without delivering.
        // Every one is already `Settling`: each is reverted unless its request gets queued
        // (this future may be dropped while the channel is full).
        let mut exhausted = take.exhausted.into_iter();
        let mut pending = ExhaustedGuard { group, rest: Vec::new() };
        while let Some(e) = exhausted.next() {
            pending.rest = exhausted.as_slice().iter().map(|e| e.seq).collect();
            let reason = exhausted_reason(e.attempt, &e.last_error);
            let outcome = Outcome::DeadLetter { reason, dlq: settings.dead_letter_queue.clone() };
            // The writer answers; a refusal it reverts itself.
            if send_settle(shared, group, (e.seq, e.attempt, e.epoch), outcome).await.is_none() {
                return Ok(Some(Vec::new()));
            }
        }
        pending.rest.clear();
        if !take.claimed.is_empty() {
            break (take.claimed, take.rate_tat, take.limit_rev);
        }
        if learned {
            // More keys may be readable, or the ones just read made something claimable.
            continue;
        }
        let wake = take.next_wake;
        tokio::select! {
            _ = notified => {}
            changed = last_rx.changed() => if changed.is_err() { return Ok(Some(Vec::new())) },
            _ = async { match wake { Some(t) => clock.sleep_until(t).await, None => futures::future::pending().await } } => {}
            _ = shared.closing.cancelled() => return Ok(Some(Vec::new())),
        }
    };
    let mut guard =
        ClaimGuard { group: group.clone(), claims: claimed.iter().map(|c| (c.seq, c.token)).collect() };

    // Persist the attempts, and read the payloads meanwhile. The wall clock is read once per
    // deadline: one take leases its batch until one instant, and each reading of the clock
    // lands a microsecond or so apart (on etcd a run of the batch's first attempts is one
    // record, with one deadline, only if their deadlines are equal).
    let mut wall: Option<(std::time::Instant, u64)> = None;
    let mut records = Vec::with_capacity(claimed.len());
    for c in &claimed {
        let deadline_micros = match wall {
            Some((at, micros)) if at == c.deadline => micros,
            _ => {
                let micros = clock.wall_micros_at(c.deadline);
                wall = Some((c.deadline, micros));
                micros
            }
        };
        let claim = Claim::Leased {
            attempt: c.attempt,
            token: c.token,
            deadline_micros,
            holder: cfg.consumer.clone(),
        };
        records.push((c.seq, claim));
    }
    // One `take` under one lock: every claim of the batch has the same epoch.
    let epoch = claimed.first().map_or(0, |c| c.epoch);
    let (reply, rx) = oneshot::channel();
    // Rounded up: the conversion truncates twice (the wall reading and the distance to it),
    // and a bucket read back must never admit a claim earlier than this one would.
    let bucket = bucket.map(|t| clock.wall_micros_at(t).saturating_add(2));
    let req = Request::Work(WorkRequest::Claim {
        group: group.clone(),
        epoch,
        claims: records,
        bucket,
        limit_rev,
        reply,
    });
    // Real time: a measure of throughput for the pool's prefetch, not a deadline.
    let asked = std::time::Instant::now();
    if shared.tx.send(req).await.is_err() {
        return Ok(Some(Vec::new()));
    }
    let mut seqs: Vec<u64> = claimed.iter().map(|c| c.seq).collect();
    // Claimed out of sequence order (a priority, a retry before newer messages): handed out
    // in the order claimed, read in sequence order.
    let claim_order: Option<std::collections::HashMap<u64, usize>> =
        (!seqs.is_sorted()).then(|| seqs.iter().enumerate().map(|(i, &s)| (s, i)).collect());
    seqs.sort_unstable();
    let (reader, queue) = (shared.clone(), group.queue.clone());
    let read = shared.runtime.spawn_blocking(move || read_claimed(&reader, &queue, &seqs));
    let (written, read) = tokio::join!(rx, read);
    ctx.note_claim_latency(asked.elapsed());
    let left_out = match written {
        Ok(Ok(left_out)) => left_out,
        Ok(Err(Error::Shutdown)) | Err(_) => return Ok(Some(Vec::new())),
        // A reset overtook the claim: the guard gives the claims back; claim again.
        Ok(Err(Error::LeaseLost { .. })) => return Ok(None),
        Ok(Err(Error::GroupDeleted { .. })) => return Err(deleted(group)),
        Ok(Err(e)) => return Err(e),
    };
    // Taken by another process first (the etcd engine): not this batch's. Their reads and
    // permits are dropped below; the guard's release of them is a no-op (not our token).
    let left_out: std::collections::HashSet<u64> = left_out.into_iter().collect();
    if !left_out.is_empty() {
        claimed.retain(|c| !left_out.contains(&c.seq));
        if claimed.is_empty() {
            return Ok(None);
        }
    }
    let msgs = match read {
        Ok(Ok(ReadOutcome::Messages(msgs))) => msgs,
        Ok(Ok(ReadOutcome::Closed)) => return Ok(Some(Vec::new())),
        Ok(Err(Error::Gap { expected, .. })) if expected < group.queue.first_seq.load(Ordering::Acquire) => {
            return Ok(None);
        }
        Ok(Err(Error::Corrupt(err))) => {
            let seq = boundary::message_seq(err.key());
            // A record the read met first although another process took it (read with the
            // batch, before the claim's answer left it out): that process deals with it;
            // this batch's own claims go back uncounted with the guard, and are claimed again.
            if seq.is_some_and(|s| left_out.contains(&s)) {
                return Ok(None);
            }
            let Some(c) = claimed.iter().find(|c| Some(c.seq) == seq) else {
                return Err(Error::Corrupt(err));
            };
            // No attempt can ever deliver a record that does not decode, and releasing the
            // claim would only fail the next read the same way (the group would stall on it):
            // dead-letter it now — the writer keeps its raw bytes — and claim again. The other
            // claims of this batch are released uncounted by the guard.
            dead_letter_corrupt(ctx, c, &err).await?;
            guard.claims.retain(|&(s, _)| s != c.seq);
            return Ok(None);
        }
        Ok(Err(e)) => return Err(e),
        Err(join) => return Err(Error::Internal(format!("read task failed: {join}"))),
    };

    let mut by_seq: std::collections::HashMap<u64, Claimed> =
        claimed.into_iter().map(|c| (c.seq, c)).collect();
    let mut jobs = Vec::with_capacity(msgs.len());
    for (msg, permit) in msgs.into_iter().zip(permits) {
        let Some(c) = by_seq.remove(&msg.seq) else { continue };
        let (queue, gname) = (group.queue.name.clone(), group.name.clone());
        if c.expired {
            tracing::info!(%queue, group = %gname, seq = c.seq, attempt = c.attempt - 1, "rockq: lease expired");
            crate::telemetry::group_counter(crate::telemetry::LEASE_EXPIRED, &queue, &gname, 1);
            shared.emit(|| Event::LeaseExpired {
                queue: queue.clone(),
                group: gname.clone(),
                seq: c.seq,
                attempt: c.attempt - 1,
            });
        }
        tracing::trace!(%queue, group = %gname, seq = c.seq, attempt = c.attempt, "rockq: delivered");
        shared.emit(|| Event::Delivered { queue, group: gname, seq: c.seq, attempt: c.attempt });
        let inner = JobInner::new(shared.clone(), group.clone(), cfg.clone(), msg, &c);
        jobs.push(Job::new(inner, permit));
    }
    // Claims that became jobs are the jobs' to release. The rest — after a record that does
    // not decode, or past the read's byte cap — were never read: the guard releases them
    // uncounted, so they can be claimed again at once (the next read meets the bad record
    // first and dead-letters only it).
    guard.claims.retain(|(seq, _)| by_seq.contains_key(seq));
    if let Some(order) = claim_order {
        jobs.sort_by_key(|j| order.get(&j.seq()).copied().unwrap_or(usize::MAX));
    }
    crate::telemetry::delivered(&group.queue.name, &group.name, "work-queue", jobs.len() as u64);
    Ok(Some(jobs))
}

/// Reads the claimed messages `seqs` (ascending). New messages come in runs: one bounded
/// iterator reads each run once; the sequences outside the runs (retries, prioritised messages
/// claimed ahead of the backlog) are read by key, together. Blocking.
fn read_claimed(reader: &Shared, queue: &QueueState, seqs: &[u64]) -> Result<ReadOutcome, Error> {
    /// Shorter runs are read by key with the stragglers.
    const RUN: usize = 8;
    let (Some(&lo), Some(&hi)) = (seqs.first(), seqs.last()) else {
        return Ok(ReadOutcome::Messages(Vec::new()));
    };
    if hi - lo + 1 == seqs.len() as u64 {
        return reader.read_range(queue, lo, hi, CLAIM_READ_BYTES);
    }
    let mut runs: Vec<(u64, u64)> = Vec::new();
    let mut singles: Vec<u64> = Vec::new();
    let mut start = 0;
    for i in 1..=seqs.len() {
        if i == seqs.len() || seqs[i] != seqs[i - 1] + 1 {
            if i - start >= RUN {
                runs.push((seqs[start], seqs[i - 1]));
            } else {
                singles.extend_from_slice(&seqs[start..i]);
            }
            start = i;
        }
    }
    let mut out = Vec::with_capacity(seqs.len());
    for (lo, hi) in runs {
        match reader.read_range(queue, lo, hi, CLAIM_READ_BYTES)? {
            ReadOutcome::Messages(m) => out.extend(m),
            ReadOutcome::Closed => return Ok(ReadOutcome::Closed),
        }
    }
    if !singles.is_empty() {
        match reader.read_seqs(queue, &singles)? {
            ReadOutcome::Messages(m) => out.extend(m),
            ReadOutcome::Closed => return Ok(ReadOutcome::Closed),
        }
    }
    out.sort_unstable_by_key(|m| m.seq);
    Ok(ReadOutcome::Messages(out))
}

#[cfg(test)]
mod tests {
    use super::exhausted_reason;

    #[test]
    fn a_dead_letter_reason_says_whether_an_error_or_a_lapsed_lease_used_the_attempts_up() {
        assert_eq!(exhausted_reason(3, "timeout"), "3 attempts used up; last error: timeout");
        let lapsed = exhausted_reason(2, "");
        assert!(
            lapsed.starts_with("2 attempts used up; the last one's lease ran out with no outcome"),
            "{lapsed}"
        );
        assert!(!lapsed.contains("last error"), "{lapsed}");
    }
}
