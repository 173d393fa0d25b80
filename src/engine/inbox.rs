//! The writer's intake for sends: producers stage encoded messages here, the writer takes whole
//! staged rounds at once.
//!
//! Why not one channel message per send: on two cores the produce path is CPU-bound, and a
//! per-message channel push, pop, reply channel and buffer allocation cost more than RocksDB's
//! own work for a small message. Here a send is a short critical section — encode the envelope
//! into the open round's arena, note its queue and length — and the writer swaps the whole round
//! out in one lock. Every send staged in a round shares one `Completion`.
//!
//! Ordering: sends are staged in lock order, and the writer allocates sequences in staging
//! order, so sends made one after another by one task get increasing sequences.
//!
//! Backpressure: a semaphore with `channel_capacity` permits, one per staged message, returned
//! when the writer takes the round (so producers fill the next round while it writes).
//!
//! Wake-ups: the writer marks itself idle (under the lock, having found nothing staged) before
//! it blocks on its request channel; the next push clears the mark and the pushing producer
//! nudges the writer through the channel. A busy writer is never nudged.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::Semaphore;

use super::completion::{Completion, Resolver};
use super::registry::QueueState;
use crate::error::{Closed, Error, Failure};
use crate::message::Message;
use crate::store::envelope;

/// One staged round: the messages of some send calls, encoded back to back.
pub(crate) struct Staged {
    /// Envelopes, back to back; the writer stamps their enqueue time.
    pub arena: Vec<u8>,
    /// Per message: its queue (an index into `queues`) and where its envelope ends in `arena`.
    pub msgs: Vec<(u32, usize)>,
    /// Per send call: the index of its first message in `msgs` (a call's messages are
    /// contiguous and all for one queue).
    pub sends: Vec<u32>,
    /// The distinct queues of this round.
    pub queues: Vec<Arc<QueueState>>,
    /// Index into `queues` by queue id: a round for thousands of queues finds each in O(1).
    queue_at: rustc_hash::FxHashMap<u32, u32>,
    /// Permits the round's messages hold (returned when the writer takes it).
    permits: usize,
    pub resolver: Resolver,
    /// When the round's first send was staged: its sends' request timeout counts from here
    /// (etcd), not from when a busy writer got to them.
    pub since: Option<std::time::Instant>,
}

impl Staged {
    /// An empty round sized like `prev` was used — capped, so that one huge message does not
    /// make every later round allocate as much.
    fn after(prev: &Staged) -> Self {
        let mut next = Staged::new(prev.arena.len().min(1 << 20), prev.msgs.len().min(4096));
        // A round for thousands of queues would otherwise rehash its index a dozen times.
        next.queue_at.reserve(prev.queues.len().min(4096));
        next
    }

    fn new(arena_hint: usize, msgs_hint: usize) -> Self {
        let (resolver, _) = Resolver::new();
        Staged {
            arena: Vec::with_capacity(arena_hint),
            msgs: Vec::with_capacity(msgs_hint),
            sends: Vec::with_capacity(msgs_hint),
            queues: Vec::new(),
            queue_at: rustc_hash::FxHashMap::default(),
            permits: 0,
            resolver,
            since: None,
        }
    }
}

impl Staged {
    /// Fails every send of the round with `why` (the broker no longer writes).
    pub fn fail(self, why: &Failure) {
        self.resolver.resolve(Err(Closed::Failed(why.clone()).into()));
    }
}

struct State {
    closed: Option<Closed>,
    /// Full rounds, oldest first.
    sealed: VecDeque<Staged>,
    /// The round being filled.
    open: Staged,
    /// Messages staged in `sealed` and `open`.
    staged: usize,
    /// The writer found nothing staged and is blocking (or about to) on its channel: the next
    /// push must nudge it.
    writer_idle: bool,
}

/// Where a send was staged.
pub(crate) struct Staging {
    pub done: Arc<Completion>,
    /// The send's position in its round.
    pub index: usize,
    /// The writer is idle: the caller must nudge it.
    pub nudge: bool,
}

pub(crate) struct Inbox {
    state: Mutex<State>,
    /// Mirrors `State::staged > 0`, so the writer can look for work without the lock.
    pending: std::sync::atomic::AtomicBool,
    space: Semaphore,
    capacity: usize,
    max_msgs: usize,
    max_bytes: usize,
}

impl Inbox {
    pub fn new(capacity: usize, max_msgs: usize, max_bytes: usize) -> Self {
        Inbox {
            state: Mutex::new(State {
                closed: None,
                sealed: VecDeque::new(),
                open: Staged::new(0, 0),
                staged: 0,
                writer_idle: false,
            }),
            space: Semaphore::new(capacity),
            pending: std::sync::atomic::AtomicBool::new(false),
            capacity,
            max_msgs,
            max_bytes,
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Stages the messages of one send call for `queue`: they get contiguous sequences and are
    /// written in one WriteBatch. The messages must have passed [`envelope::validate`] and the
    /// size limit. Waits while `channel_capacity` messages are already staged.
    ///
    /// Cancel safe: nothing is staged until the last step, which does not await.
    pub async fn push(&self, queue: &Arc<QueueState>, msgs: &[Message]) -> Result<Staging, Error> {
        // A call larger than the whole capacity would wait forever: it takes every permit.
        let permits = msgs.len().clamp(1, self.capacity);
        let n = u32::try_from(permits).unwrap_or(u32::MAX);
        match self.space.acquire_many(n).await {
            Ok(p) => p.forget(),
            Err(_) => return Err(self.lock().closed.clone().map_or(Error::Shutdown, Error::from)),
        }
        let mut st = self.lock();
        if let Some(c) = &st.closed {
            let e = Error::from(c.clone());
            drop(st);
            self.space.add_permits(permits);
            return Err(e);
        }
        let bytes: usize = msgs.iter().map(envelope::encoded_len).sum();
        let open = &st.open;
        if !open.msgs.is_empty()
            && (open.msgs.len() + msgs.len() > self.max_msgs || open.arena.len() + bytes > self.max_bytes)
        {
            let next = Staged::after(open);
            let full = std::mem::replace(&mut st.open, next);
            st.sealed.push_back(full);
        }
        st.staged += msgs.len();
        self.pending.store(true, std::sync::atomic::Ordering::Release);
        let open = &mut st.open;
        let q = match open.queue_at.get(&queue.id) {
            Some(&i) => i,
            None => {
                let i = u32::try_from(open.queues.len()).unwrap_or(u32::MAX);
                open.queues.push(queue.clone());
                open.queue_at.insert(queue.id, i);
                i
            }
        };
        let index = open.sends.len();
        if index == 0 {
            open.since = Some(std::time::Instant::now());
        }
        open.sends.push(u32::try_from(open.msgs.len()).unwrap_or(u32::MAX));
        open.arena.reserve(bytes);
        for m in msgs {
            // Stamped by the writer at its group commit.
            envelope::encode_into(m, 0, &mut open.arena);
            open.msgs.push((q, open.arena.len()));
        }
        open.permits += permits;
        let done = open.resolver.completion();
        let nudge = std::mem::take(&mut st.writer_idle);
        Ok(Staging { done, index, nudge })
    }

    /// Takes staged rounds, oldest first: at least one, then more while they fit in one
    /// WriteBatch's caps. Their permits are returned at once, so producers stage the next
    /// round while this one is written.
    pub fn take(&self) -> Vec<Staged> {
        let mut st = self.lock();
        let mut out: Vec<Staged> = Vec::new();
        let (mut msgs, mut bytes) = (0, 0);
        loop {
            let next = match st.sealed.front() {
                Some(s) => s,
                None if !st.open.msgs.is_empty() => &st.open,
                None => break,
            };
            if !out.is_empty()
                && (msgs + next.msgs.len() > self.max_msgs || bytes + next.arena.len() > self.max_bytes)
            {
                break;
            }
            let s = match st.sealed.pop_front() {
                Some(s) => s,
                None => {
                    let fresh = Staged::after(&st.open);
                    std::mem::replace(&mut st.open, fresh)
                }
            };
            msgs += s.msgs.len();
            bytes += s.arena.len();
            out.push(s);
        }
        st.staged -= msgs;
        self.pending.store(st.staged > 0, std::sync::atomic::Ordering::Release);
        drop(st);
        self.space.add_permits(out.iter().map(|s| s.permits).sum());
        out
    }

    /// How many messages are staged.
    #[cfg_attr(not(feature = "etcd"), allow(dead_code))] // read by the etcd engine
    pub fn staged(&self) -> usize {
        self.lock().staged
    }

    /// Whether anything is staged (a lock-free hint for the writer's brief wait).
    pub fn has_staged(&self) -> bool {
        self.pending.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Marks the writer idle if nothing is staged; returns whether it did (the writer may then
    /// block on its channel: the next push nudges it).
    pub fn idle_if_empty(&self) -> bool {
        let mut st = self.lock();
        st.writer_idle = st.staged == 0;
        st.writer_idle
    }

    /// Refuses every further send with `why` and fails whatever is still staged with it (after a
    /// failed write, or when the writer thread ends without a clean stop).
    pub fn fail(&self, why: &Failure) {
        for s in self.close(Some(why.clone())) {
            s.fail(why);
        }
    }

    /// Refuses further sends — with `failed`'s reason, or as shut down — and takes whatever is
    /// still staged, all of it.
    pub fn close(&self, failed: Option<Failure>) -> Vec<Staged> {
        let mut st = self.lock();
        if st.closed.is_none() {
            st.closed = Some(failed.map_or(Closed::Shutdown, Closed::Failed));
        }
        let mut out: Vec<Staged> = st.sealed.drain(..).collect();
        if !st.open.msgs.is_empty() {
            out.push(std::mem::replace(&mut st.open, Staged::new(0, 0)));
        }
        st.staged = 0;
        self.pending.store(false, std::sync::atomic::Ordering::Release);
        drop(st);
        // Wakes producers waiting for space: they see the inbox closed.
        self.space.close();
        out
    }
}
