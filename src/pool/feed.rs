//! A worker pool's job feed: the jobs the pool's dispatcher took from its subscription, shared
//! by the pool's worker tasks, and the jobs those workers are running.
//!
//! Why not a channel with one send per job: with short handlers the workers drain faster
//! than jobs arrive, so each send woke a parked worker — a task wake-up, often across
//! threads, per job. Here the dispatcher pushes every job the subscription has ready in one
//! lock and wakes at most one worker per job pushed; a worker that finds the feed non-empty
//! takes the next job without parking. Jobs go to whichever worker is free first, so a slow
//! job never holds up others behind it.
//!
//! Taking a job and registering it as running is one step under one lock, so that a pool
//! stopped from outside (its future dropped) finds every job it holds in exactly one of the
//! two places and can give each back without counting the attempt.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::Instant;

use tokio::sync::Notify;

use crate::clock::Clock;
use crate::work::{Job, Task};

#[derive(Default)]
struct Jobs {
    /// Taken from the subscription, not started yet, oldest first.
    waiting: VecDeque<Job>,
    /// What each worker runs (indexed by worker).
    running: Vec<Option<Task>>,
    /// No more jobs come: workers finish and stop when `waiting` is empty.
    closed: bool,
    /// Since when every worker has been busy (`None`: some worker is idle), and which such
    /// episode this is.
    full_since: Option<(u64, Instant)>,
    episodes: u64,
}

pub(super) struct Feed {
    jobs: Mutex<Jobs>,
    /// Workers wait here for jobs (or the close).
    ready: Notify,
    /// The dispatcher waits here for a change of `full_since`.
    saturation: Notify,
    /// The dispatcher waits here while `waiting` is full (see [`Feed::has_room`]).
    room: Notify,
    busy: AtomicUsize,
    /// Jobs the workers finished (for the adaptive prefetch).
    completed: AtomicU64,
    workers: usize,
    /// Waiting jobs the feed takes before the dispatcher waits for room (at least `workers`).
    depth: usize,
}

impl Feed {
    /// A feed for `workers` workers holding up to `depth` waiting jobs (at least `workers`).
    pub fn new(workers: usize, depth: usize) -> Self {
        Feed {
            jobs: Mutex::new(Jobs { running: vec![None; workers], ..Jobs::default() }),
            ready: Notify::new(),
            saturation: Notify::new(),
            room: Notify::new(),
            busy: AtomicUsize::new(0),
            completed: AtomicU64::new(0),
            workers,
            depth: depth.max(workers),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Jobs> {
        self.jobs.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Adds jobs for the workers and wakes as many idle ones as there are new jobs.
    pub fn push(&self, jobs: Vec<Job>) {
        let n = jobs.len();
        self.lock().waiting.extend(jobs);
        let idle = self.workers.saturating_sub(self.busy.load(Ordering::Acquire));
        for _ in 0..n.min(idle.max(1)) {
            self.ready.notify_one();
        }
    }

    /// The next job for worker `w`, registered as running; `None` once the feed is closed and
    /// empty. Starts a saturation episode (at `clock`'s now) if every worker is now busy.
    ///
    /// Cancel safe: a job is taken only in the step that returns it.
    pub async fn take(&self, w: usize, clock: &Clock) -> Option<Job> {
        loop {
            let notified = self.ready.notified();
            tokio::pin!(notified);
            // Registered before looking, so a push between the look and the wait wakes us.
            notified.as_mut().enable();
            {
                let mut jobs = self.lock();
                if let Some(job) = jobs.waiting.pop_front() {
                    if let Some(slot) = jobs.running.get_mut(w) {
                        *slot = Some(job.task());
                    }
                    let room = jobs.waiting.len() == self.depth / 2;
                    let full = self.busy.fetch_add(1, Ordering::AcqRel) + 1 == self.workers;
                    if full {
                        jobs.episodes += 1;
                        jobs.full_since = Some((jobs.episodes, clock.now()));
                    }
                    drop(jobs);
                    if room {
                        self.room.notify_one();
                    }
                    // Only a start wakes the dispatcher (to arm its timer): an end is seen when
                    // the timer fires, so fast handlers flipping `busy` cost no wake-ups.
                    if full {
                        self.saturation.notify_one();
                    }
                    return Some(job);
                }
                if jobs.closed {
                    return None;
                }
            }
            notified.await;
        }
    }

    /// Worker `w` finished its job.
    pub fn done(&self, w: usize) {
        self.completed.fetch_add(1, Ordering::Relaxed);
        self.free(w);
    }

    /// Worker `w` gave its job back unrun: not a completion (the adaptive prefetch must not
    /// read jobs skipped in a blink as handlers that got fast).
    pub fn skipped(&self, w: usize) {
        self.free(w);
    }

    fn free(&self, w: usize) {
        let mut jobs = self.lock();
        if let Some(slot) = jobs.running.get_mut(w) {
            *slot = None;
        }
        if self.busy.fetch_sub(1, Ordering::AcqRel) == self.workers {
            jobs.full_since = None;
        }
    }

    /// Puts `job` back at the front, for whichever worker is free first (a job whose
    /// transaction conflicted, to run again at once). `Err(job)` once the feed is closed.
    pub fn requeue(&self, job: Job) -> Result<(), Job> {
        {
            let mut jobs = self.lock();
            if jobs.closed {
                return Err(job);
            }
            jobs.waiting.push_front(job);
        }
        self.ready.notify_one();
        Ok(())
    }

    /// Whether the dispatcher may add jobs: fewer than `depth` are waiting. The rest stay in
    /// the subscription's buffer, where a job whose lease runs out is dropped unseen.
    pub fn has_room(&self) -> bool {
        self.lock().waiting.len() < self.depth
    }

    /// How many jobs the dispatcher hands over at once at most.
    pub fn depth(&self) -> usize {
        self.depth
    }

    /// Resolves once the waiting jobs fell to half the depth (or fewer) — or spuriously:
    /// the caller looks at [`Feed::has_room`] again.
    pub async fn room(&self) {
        self.room.notified().await;
    }

    /// Jobs the workers finished so far.
    pub fn completed(&self) -> u64 {
        self.completed.load(Ordering::Relaxed)
    }

    /// Since when every worker has been busy, if they all are, with the episode's number.
    pub fn full_since(&self) -> Option<(u64, Instant)> {
        self.lock().full_since
    }

    /// Resolves when a saturation episode may have started.
    pub async fn saturation_changed(&self) {
        self.saturation.notified().await;
    }

    /// No more jobs come: returns the jobs not started (the caller gives them back), and lets
    /// idle workers stop.
    pub fn close(&self) -> Vec<Job> {
        let waiting = {
            let mut jobs = self.lock();
            jobs.closed = true;
            jobs.waiting.drain(..).collect()
        };
        self.ready.notify_waiters();
        waiting
    }

    /// Every job the pool holds: running, or waiting for a worker.
    pub fn held(&self) -> Vec<Task> {
        let jobs = self.lock();
        jobs.running.iter().flatten().cloned().chain(jobs.waiting.iter().map(Job::task)).collect()
    }
}
