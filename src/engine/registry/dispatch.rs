//! The claim index of a work-queue group: every unfinished sequence above the offset that was
//! ever claimed, indexed by what can happen to it next, so that no operation walks the
//! sequences that merely wait.
//!
//! - `ready`: claimable now (released, reverted, left behind by a crash, or moved here when
//!   its timer fired), in sequence order — a claim takes the smallest; `urgent`, the ones of
//!   them with a priority above 0, highest first — a claim takes those before.
//! - `timers`: `(instant, seq)` of every lease deadline and retry time — a claim first moves
//!   the due ones to `ready`, and the first entry is when to look again.
//! - settling sequences (an outcome on its way to the writer) are in neither.
//!
//! - parked sequences (per-key ordering or a per-key limit: `window` earlier messages with the
//!   same key are unfinished) are in neither; `keys` lists each key's unfinished sequences, and
//!   only the first `window` of them (1: the key's head) are ever anything but parked. When one
//!   of those is forgotten (finished), the next one becomes claimable.
//!
//! - prioritised messages never claimed are found in the queue's index (`priority.rs`) from
//!   the group's `cursors` (one per priority: everything of it below was claimed); one
//!   claimed ahead of the frontier is in `ahead` until the frontier steps over it.
//!
//! A claim takes the highest priority among the urgent slots, the index and the plain
//! candidates (the oldest ready slot, the frontier), the lowest sequence within one; with a
//! share `n` (`WorkGroup::priority_share`), every `n`-th claim takes the oldest instead.
//!
//! Several processes claiming one group (the etcd engine) each decide from the same frontier;
//! when one's claim lost sequences to another's, it leaves the next as many fresh sequences
//! to the other and claims those after (`stagger`), for as long as the range it left keeps
//! being taken — instead of both claiming from one frontier and overlapping round after round.
//!
//! With a million retries waiting for a far-off time, or a million messages parked behind
//! busy keys, a claim costs O(log n): it looks at the first timer and the first ready
//! sequence, never at the waiting or parked ones. Every transition goes through
//! [`Dispatch::set`], which keeps the views and the counters in step.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Instant;

#[derive(Debug, Clone)]
pub(super) struct Slot {
    /// Attempts started so far.
    pub attempt: u32,
    pub state: SlotState,
    pub last_error: String,
    /// Its previous holder's lease ran out (reported as `LeaseExpired` when claimed again).
    pub expired: bool,
    /// Its ordering key's hash, in a group ordered by key.
    pub key: Option<u64>,
    /// Whether `key` was read from the message (slots restored at open, or claimed before the
    /// group was ordered by key, do not know it yet).
    pub key_known: bool,
    /// The last progress report of any attempt (`Task::progress`); boxed, since few jobs
    /// report and every slot pays for the field.
    pub progress: Option<Box<bytes::Bytes>>,
    /// Its message's priority (`Message::priority`).
    pub priority: u8,
}

impl Slot {
    pub fn available(attempt: u32, last_error: String) -> Self {
        Slot {
            attempt,
            state: SlotState::Available,
            last_error,
            expired: false,
            key: None,
            key_known: false,
            progress: None,
            priority: 0,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum SlotState {
    /// Claimable now.
    Available,
    /// Held until `deadline` by the holder of `token`.
    Leased { token: u64, deadline: Instant },
    /// Waiting for a retry at `due`.
    Waiting { due: Instant },
    /// An outcome is being written; nobody may claim or settle it.
    Settling,
    /// Waits for an earlier message with the same ordering key to finish.
    Parked,
}

/// What [`Dispatch::pick`] chose.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Pick {
    /// A ready slot (now settling).
    Ready(u64),
    /// A message never claimed, with its priority (it has no slot yet).
    Fresh(u64, u8),
}

impl Pick {
    fn seq(self) -> u64 {
        match self {
            Pick::Ready(seq) | Pick::Fresh(seq, _) => seq,
        }
    }
}

/// The token of a lease another process holds (the etcd engine): tokens here are seeded from
/// the wall clock, so none is 0.
pub(crate) const FOREIGN_TOKEN: u64 = 0;

/// Fresh claims past a range left to another process (see the module docs).
#[derive(Debug, Clone, Copy)]
struct Stagger {
    /// How many fresh sequences are left each time.
    gap: u64,
    /// The end of the range left: the frontier passing it means another process took it.
    left_end: u64,
    /// The next fresh sequence this process claims.
    next: u64,
}

/// The slots and their indexes (see the module docs).
#[derive(Debug)]
pub(super) struct Dispatch {
    slots: BTreeMap<u64, Slot>,
    ready: BTreeSet<u64>,
    /// The ready slots with a priority above 0: highest first, then by sequence.
    urgent: BTreeSet<(std::cmp::Reverse<u8>, u64)>,
    /// Sequences from the frontier on that were claimed out of order (a priority's turn).
    ahead: BTreeSet<u64>,
    /// Per priority, the first sequence of it in the queue's index this group has not
    /// claimed.
    cursors: BTreeMap<u8, u64>,
    /// Claims since the last one that took the oldest claimable job.
    since_oldest: u32,
    timers: BTreeSet<(Instant, u64)>,
    leased: usize,
    waiting: usize,
    parked: usize,
    /// Slots that do not know their key.
    unknown: usize,
    /// Each ordering key's unfinished sequences (slots whose key is known).
    keys: rustc_hash::FxHashMap<u64, BTreeSet<u64>>,
    /// Keyed messages retention deleted while they were leased: their holder may still be
    /// running, so each keeps its key's place until its lease runs out — `(deadline, seq)`,
    /// with the key by sequence.
    ghosts: BTreeSet<(Instant, u64)>,
    ghost_keys: rustc_hash::FxHashMap<u64, u64>,
    /// Sequences from here on were never claimed (nor, in a group ordered by key, learned).
    pub frontier: u64,
    /// Where this process's fresh claims start instead of the frontier (see the module docs).
    /// Never set by the embedded engine, whose claims overlap no one's.
    stagger: Option<Stagger>,
    /// How many sequences the last claim lost to another process's: applied by the next
    /// batch of claims ([`Dispatch::begin_claims`]).
    overlap: Option<u64>,
    /// The group's rate-limit bucket (`rate_limit.rs`): under this lock, so a claim and the
    /// token it takes are one decision. A reset keeps it (the claims it admitted happened).
    pub bucket: crate::rate_limit::Bucket,
    /// The etcd engine: the newest revision of the group's limit record whose claims this
    /// view includes, and the newest known to exist (`registry/work.rs`, `learn_limit`). A
    /// reset keeps them (it keeps the record).
    pub limit_seen: i64,
    pub limit_known: i64,
    /// How many of a key's unfinished messages may be claimable or held at once: its first
    /// `window` (1: ordered by key; `n`: `WorkGroup::per_key_limit(n)`); the rest are parked.
    window: usize,
}

impl Dispatch {
    pub fn new(frontier: u64) -> Self {
        Dispatch {
            slots: BTreeMap::new(),
            ready: BTreeSet::new(),
            urgent: BTreeSet::new(),
            ahead: BTreeSet::new(),
            cursors: BTreeMap::new(),
            since_oldest: 0,
            timers: BTreeSet::new(),
            leased: 0,
            waiting: 0,
            parked: 0,
            unknown: 0,
            keys: Default::default(),
            ghosts: BTreeSet::new(),
            ghost_keys: Default::default(),
            frontier,
            stagger: None,
            overlap: None,
            bucket: Default::default(),
            limit_seen: 0,
            limit_known: 0,
            window: 1,
        }
    }

    /// Notes that a claim lost `lost` of its sequences to another process's claim.
    pub fn note_overlap(&mut self, lost: u64) {
        if lost > 0 {
            self.overlap = Some(lost);
        }
    }

    /// Starts a batch of claims: decides whether fresh claims start at the frontier or past a
    /// range left to another process. Right after a lost overlap, the range is as long as
    /// what was lost (the other process's batch, as far as this one can tell); after that,
    /// only while the range left last time was taken (the frontier passed it) — a range left
    /// and not taken means the other process stopped or slowed, and claims go back to the
    /// frontier, so nothing is left unclaimed for long.
    pub fn begin_claims(&mut self) {
        self.skip_ahead();
        let gap = match (self.overlap.take(), self.stagger.take()) {
            (Some(lost), _) => lost,
            (None, Some(st)) if self.frontier >= st.left_end => st.gap,
            _ => return,
        };
        let left_end = self.frontier.saturating_add(gap);
        self.stagger = Some(Stagger { gap, left_end, next: left_end });
    }

    fn index(&mut self, seq: u64, state: SlotState, priority: u8) {
        match state {
            SlotState::Available => {
                self.ready.insert(seq);
                if priority > 0 {
                    self.urgent.insert((std::cmp::Reverse(priority), seq));
                }
            }
            SlotState::Leased { deadline, .. } => {
                self.timers.insert((deadline, seq));
                self.leased += 1;
            }
            SlotState::Waiting { due } => {
                self.timers.insert((due, seq));
                self.waiting += 1;
            }
            SlotState::Parked => self.parked += 1,
            SlotState::Settling => {}
        }
    }

    fn unindex(&mut self, seq: u64, state: SlotState, priority: u8) {
        match state {
            SlotState::Available => {
                self.ready.remove(&seq);
                if priority > 0 {
                    self.urgent.remove(&(std::cmp::Reverse(priority), seq));
                }
            }
            SlotState::Leased { deadline, .. } => {
                self.timers.remove(&(deadline, seq));
                self.leased -= 1;
            }
            SlotState::Waiting { due } => {
                self.timers.remove(&(due, seq));
                self.waiting -= 1;
            }
            SlotState::Parked => self.parked -= 1,
            SlotState::Settling => {}
        }
    }

    /// Adds (or replaces) the slot of `seq`.
    pub fn insert(&mut self, seq: u64, slot: Slot) {
        let (state, priority) = (slot.state, slot.priority);
        self.unknown += usize::from(!slot.key_known);
        if let Some(old) = self.slots.insert(seq, slot) {
            self.unknown -= usize::from(!old.key_known);
            self.unindex(seq, old.state, old.priority);
        }
        self.index(seq, state, priority);
    }

    /// Inserts `slot` unless `seq` has one.
    pub fn insert_missing(&mut self, seq: u64, slot: Slot) {
        if !self.slots.contains_key(&seq) {
            self.insert(seq, slot);
        }
    }

    pub fn get(&self, seq: u64) -> Option<&Slot> {
        self.slots.get(&seq)
    }

    /// `seq`'s slot to change anything but its state (which the indexes follow: use `set`).
    pub fn get_mut_unindexed(&mut self, seq: u64) -> Option<&mut Slot> {
        self.slots.get_mut(&seq)
    }

    /// Moves `seq` to `state` (nothing if it has no slot); `f` may change the rest of the slot.
    pub fn set(&mut self, seq: u64, state: SlotState, f: impl FnOnce(&mut Slot)) {
        let Some(slot) = self.slots.get_mut(&seq) else { return };
        let old = std::mem::replace(&mut slot.state, state);
        let priority = slot.priority;
        f(slot);
        self.unindex(seq, old, priority);
        self.index(seq, state, priority);
    }

    /// Forgets `seq`. Returns whether that made a parked sequence claimable.
    pub fn remove(&mut self, seq: u64) -> bool {
        match self.slots.remove(&seq) {
            Some(old) => {
                self.unknown -= usize::from(!old.key_known);
                self.unindex(seq, old.state, old.priority);
                self.forget_key(seq, old.key)
            }
            None => false,
        }
    }

    /// Takes `seq` out of its key's list; if it was among the key's first `window`, the one
    /// that moves into them is claimable now. Returns whether one became claimable.
    fn forget_key(&mut self, seq: u64, key: Option<u64>) -> bool {
        let Some(k) = key else { return false };
        let window = self.window;
        let Some(list) = self.keys.get_mut(&k) else { return false };
        // No window (neither key order nor a per-key limit): nothing waits, nothing to count.
        let was_within = window == usize::MAX || list.range(..seq).take(window).count() < window;
        let removed = list.remove(&seq);
        let next = match was_within && removed && window <= list.len() {
            true => list.iter().nth(window - 1).copied(),
            false => None,
        };
        if list.is_empty() {
            self.keys.remove(&k);
        }
        match next {
            Some(next) if self.slots.get(&next).is_some_and(|s| s.state == SlotState::Parked) => {
                self.set(next, SlotState::Available, |_| {});
                true
            }
            _ => false,
        }
    }

    /// Adds never-claimed sequence `seq` (the frontier) with ordering key `key`: claimable if
    /// its key has fewer than `window` unfinished earlier messages, parked behind them
    /// otherwise.
    pub fn learn(&mut self, seq: u64, key: Option<u64>, priority: u8) {
        self.skip_ahead();
        if seq != self.frontier {
            return;
        }
        self.frontier = seq + 1;
        let mut slot = Slot { key, key_known: true, priority, ..Slot::available(0, String::new()) };
        if let Some(k) = key {
            let list = self.keys.entry(k).or_default();
            // Behind an earlier unfinished one only: one of its key claimed ahead of the
            // frontier (a prioritised claim made before the group was ordered by key) is
            // already out of order, and waiting behind it would stall this one for good (its
            // finish promotes only the key's first).
            if list.range(..seq).take(self.window).count() >= self.window {
                slot.state = SlotState::Parked;
            }
            list.insert(seq);
        }
        self.insert(seq, slot);
    }

    /// Sets the ordering key of a slot that did not know it (restored at open). Called in
    /// sequence order over all such slots, before anything learned after them, so a key's
    /// lowest slot stays as it is and the later ones park.
    pub fn assign_key(&mut self, seq: u64, key: Option<u64>) {
        let Some(slot) = self.slots.get_mut(&seq) else { return };
        if slot.key_known {
            return;
        }
        slot.key_known = true;
        self.unknown -= 1;
        slot.key = key;
        let Some(k) = key else { return };
        let window = self.window;
        let list = self.keys.entry(k).or_default();
        list.insert(seq);
        let parkable = |s: &Slot| matches!(s.state, SlotState::Available | SlotState::Waiting { .. });
        // Behind its key's first `window`, it waits (a retry it was waiting for is due when it
        // is its turn); among them (a slot claimed without keys, found after later ones were
        // read), the one it pushes out of them waits, unless it is held already.
        let wait = match list.range(..seq).take(window).count() >= window {
            true => Some(seq),
            false => list.iter().nth(window).copied(),
        };
        if let Some(w) = wait.filter(|w| self.slots.get(w).is_some_and(parkable)) {
            self.set(w, SlotState::Parked, |_| {});
        }
    }

    /// Whether `seq`'s key (known) has `window` unfinished earlier messages: it must wait
    /// behind them.
    pub fn behind_its_key(&self, seq: u64) -> bool {
        let Some(k) = self.slots.get(&seq).and_then(|s| s.key.filter(|_| s.key_known)) else { return false };
        self.window != usize::MAX
            && self.keys.get(&k).is_some_and(|l| l.range(..seq).take(self.window).count() >= self.window)
    }

    /// Lets each key's first `window` unfinished messages be claimable (a new per-key limit):
    /// the parked ones among them are promoted, the claimable or waiting ones past them park
    /// (held ones stay held: they finish before their key's later ones start).
    pub fn set_window(&mut self, window: usize) {
        let window = window.max(1);
        if window == self.window {
            return;
        }
        self.window = window;
        let mut moves = Vec::new();
        for list in self.keys.values() {
            for (i, &seq) in list.iter().enumerate() {
                match self.slots.get(&seq).map(|s| s.state) {
                    Some(SlotState::Parked) if i < window => moves.push((seq, SlotState::Available)),
                    Some(SlotState::Available | SlotState::Waiting { .. }) if i >= window => {
                        moves.push((seq, SlotState::Parked))
                    }
                    _ => {}
                }
            }
        }
        for (seq, state) in moves {
            self.set(seq, state, |_| {});
        }
    }

    /// Slots parked behind their key's earlier messages.
    pub fn parked(&self) -> usize {
        self.parked
    }

    /// Sequences whose slot does not know its key yet, in order.
    pub fn unknown_keys(&self) -> Vec<u64> {
        if self.unknown == 0 {
            return Vec::new();
        }
        self.slots.iter().filter(|(_, s)| !s.key_known).map(|(&seq, _)| seq).collect()
    }

    /// Whether any slot does not know its key.
    pub fn has_unknown_keys(&self) -> bool {
        self.unknown > 0
    }

    /// Slots read ahead and not handed out: parked, or claimable now.
    pub fn unclaimed(&self) -> usize {
        self.parked + self.ready.len()
    }

    /// Moves every lease and retry due at `now` to `ready`: each timer fires once.
    pub fn fire_due(&mut self, now: Instant) {
        // Deleted messages whose lease ran out give their key's place up.
        while let Some(&(t, seq)) = self.ghosts.first() {
            if t > now {
                break;
            }
            self.ghosts.remove(&(t, seq));
            let key = self.ghost_keys.remove(&seq);
            self.forget_key(seq, key);
        }
        while let Some(&(t, seq)) = self.timers.first() {
            if t > now {
                break;
            }
            let expired = matches!(self.slots.get(&seq).map(|s| s.state), Some(SlotState::Leased { .. }));
            self.set(seq, SlotState::Available, |s| s.expired = expired);
        }
    }

    /// Takes ready `seq` out of the ready views (the caller moves it on).
    fn take_ready(&mut self, seq: u64) {
        self.ready.remove(&seq);
        // Out of `ready` and into nothing until the caller's `set`: settling for a moment.
        if let Some(slot) = self.slots.get_mut(&seq) {
            slot.state = SlotState::Settling;
            if slot.priority > 0 {
                self.urgent.remove(&(std::cmp::Reverse(slot.priority), seq));
            }
        }
    }

    /// Moves the frontier over the sequences claimed ahead of it (and forgets those it passed
    /// otherwise: a trim, a reset, an operator's reach).
    pub fn skip_ahead(&mut self) {
        while let Some(&a) = self.ahead.first() {
            if a > self.frontier {
                break;
            }
            self.ahead.pop_first();
            if a == self.frontier {
                self.frontier += 1;
            }
        }
    }

    /// Whether `seq`, at or above the frontier, was claimed ahead of it.
    pub fn is_ahead(&self, seq: u64) -> bool {
        self.ahead.contains(&seq)
    }

    /// Picks the next claim (see the module docs): from `from` (the first live sequence) up to
    /// `to` (the last published), reading never-claimed prioritised messages from `index`, and
    /// never-claimed plain ones from the frontier if `fresh` (a group ordered by key learns
    /// them instead). `share`: every `share`-th claim takes the oldest (0: never). A ready
    /// slot picked is settling (the caller moves it on); a never-claimed message picked has no
    /// slot yet (the caller inserts it).
    pub fn pick(
        &mut self,
        from: u64,
        to: u64,
        index: Option<&super::priority::Priorities>,
        fresh: bool,
        share: u32,
    ) -> Option<Pick> {
        self.frontier = self.frontier.max(from);
        self.skip_ahead();
        // Stale entries below the first live sequence are dropped by the trim that made them
        // so; skipping them here keeps a claim right meanwhile.
        let urgent = self.urgent.iter().find(|(_, s)| *s >= from).map(|&(p, s)| (p.0, s));
        let indexed = match index {
            Some(ix) if fresh => loop {
                let cursors = &self.cursors;
                match ix.best(self.frontier, to, |p| cursors.get(&p).copied().unwrap_or(0)) {
                    // Claimed already (the etcd engine: by another process, learned before
                    // or after the message's index entry was, or by a staggered pick): its
                    // cursor moves past it, and a slot made before its priority was known
                    // takes it (a lease that runs out, a retry, is urgent then).
                    Some((p, s)) if self.ahead.contains(&s) || self.slots.contains_key(&s) => {
                        self.cursors.insert(p, s + 1);
                        if let Some(slot) = self.slots.get_mut(&s).filter(|slot| slot.priority < p) {
                            let (state, old) = (slot.state, slot.priority);
                            slot.priority = p;
                            self.unindex(s, state, old);
                            self.index(s, state, p);
                        }
                    }
                    found => break found,
                }
            },
            _ => None,
        };
        // Highest priority, then lowest sequence.
        let high = match (urgent, indexed) {
            (Some(u), Some(i)) => Some(if (u.0, std::cmp::Reverse(u.1)) >= (i.0, std::cmp::Reverse(i.1)) {
                Pick::Ready(u.1)
            } else {
                Pick::Fresh(i.1, i.0)
            }),
            (Some(u), None) => Some(Pick::Ready(u.1)),
            (None, Some(i)) => Some(Pick::Fresh(i.1, i.0)),
            (None, None) => None,
        };
        let ready = self.ready.range(from..).next().copied();
        // Past the range left to another process, if there is something there (otherwise
        // from the frontier: a short backlog is not left waiting for anyone) — and past what
        // this process claimed there already (a second overlap before the first range was
        // taken leaves a range ending among them).
        if let Some(st) = self.stagger.as_mut() {
            while self.ahead.contains(&st.next) || self.slots.contains_key(&st.next) {
                st.next += 1;
            }
        }
        let fresh_from = match self.stagger {
            // (A staggered pick of a prioritised message moves no cursor: the index offers it
            // again, and it is passed over above as claimed ahead.)
            Some(st) if st.next > self.frontier && st.next <= to => st.next,
            _ => self.frontier,
        };
        let frontier = (fresh && fresh_from <= to).then_some(fresh_from);
        let oldest = match (ready, frontier) {
            (Some(r), Some(f)) if f < r => Some(Pick::Fresh(f, 0)),
            (Some(r), _) => Some(Pick::Ready(r)),
            (None, Some(f)) => Some(Pick::Fresh(f, 0)),
            (None, None) => None,
        };
        let share_turn = share > 0 && self.since_oldest.saturating_add(1) >= share;
        let pick = match (high, oldest) {
            (Some(h), Some(o)) if !share_turn => {
                // The oldest may be the prioritised one itself.
                self.since_oldest = if h.seq() == o.seq() { 0 } else { self.since_oldest.saturating_add(1) };
                h
            }
            (_, Some(o)) => {
                self.since_oldest = 0;
                o
            }
            (Some(h), None) => h,
            (None, None) => return None,
        };
        match pick {
            Pick::Ready(seq) => self.take_ready(seq),
            Pick::Fresh(seq, p) if seq == self.frontier => {
                self.frontier += 1;
                // A prioritised message reached by the frontier first: its index entry is
                // passed over with it (the index is read from the frontier on).
                let _ = p;
            }
            // A staggered pick: plain (no priority index while staggering), so no cursor moves.
            Pick::Fresh(seq, _) if self.stagger.is_some_and(|st| st.next == seq) => {
                self.ahead.insert(seq);
                if let Some(st) = &mut self.stagger {
                    st.next = seq + 1;
                }
            }
            Pick::Fresh(seq, p) => {
                self.cursors.insert(p, seq + 1);
                self.ahead.insert(seq);
            }
        }
        Some(pick)
    }

    /// The restore of a message claimed ahead of the frontier (its claim record was found at
    /// open, or it lies before another such): a prioritised one's cursor moves past it.
    pub fn restore_ahead(&mut self, seq: u64, priority: u8) {
        if seq >= self.frontier {
            self.ahead.insert(seq);
            if priority > 0 {
                let c = self.cursors.entry(priority).or_insert(0);
                *c = (*c).max(seq + 1);
            }
        }
    }

    /// The etcd engine: another process's record of `seq` was learned, at or above the
    /// frontier: the frontier passes it when it gets there. No cursor moves (one of its
    /// priority below it may be unclaimed still): the index offering it passes over it.
    pub fn put_ahead(&mut self, seq: u64) {
        if seq >= self.frontier {
            self.ahead.insert(seq);
        }
    }

    /// Per priority, the first sequence of it not claimed (for the restore's holes).
    pub fn cursor(&self, priority: u8) -> u64 {
        self.cursors.get(&priority).copied().unwrap_or(0)
    }

    /// When the next lease runs out or the next retry is due.
    pub fn next_timer(&self) -> Option<Instant> {
        let timer = self.timers.first().map(|&(t, _)| t);
        let ghost = self.ghosts.first().map(|&(t, _)| t);
        timer.into_iter().chain(ghost).min()
    }

    /// Forgets every slot; claiming restarts at `frontier`.
    pub fn clear(&mut self, frontier: u64) {
        let (bucket, window, seen, known) = (self.bucket, self.window, self.limit_seen, self.limit_known);
        *self = Dispatch::new(frontier);
        (self.bucket, self.window, self.limit_seen, self.limit_known) = (bucket, window, seen, known);
    }

    /// Slots whose outcome (or an operator's action) is on its way to the writer: with the
    /// leased ones, what a concurrency limit counts as held.
    pub fn settling(&self) -> usize {
        self.slots.len().saturating_sub(self.ready.len() + self.leased + self.waiting + self.parked)
    }

    /// Jobs a claim could take now, as far as memory tells without reading: the ready slots,
    /// and (unless keys must be read first) the never-claimed messages up to `last`.
    pub fn claimable_count(&self, last: u64, fresh: bool) -> u64 {
        let never = match fresh {
            true => {
                // (The etcd engine learns other processes' claims past `last` too.)
                let ahead = self.ahead.range(..=last).count() as u64;
                last.saturating_add(1).saturating_sub(self.frontier).saturating_sub(ahead)
            }
            false => 0,
        };
        self.ready.len() as u64 + never
    }

    /// Forgets every slot at or below `to`, and never claims it. A leased one keeps its key's
    /// place until its lease runs out if its handler may still be running: with `written`
    /// `None` (the embedded engine), any; with `Some` (the etcd engine learning that the stored
    /// offset passed them), only this process's leases whose claim was written
    /// (`written(seq, token)`: the claim by that very token)
    /// — another process's (`FOREIGN_TOKEN`) ended with it, which is how an ack there reads in
    /// other processes' watches, and a claim decided here but refused or not yet written
    /// started no handler.
    pub fn drop_through(&mut self, to: u64, written: Option<&dyn Fn(u64, u64) -> bool>) {
        let keep = self.slots.split_off(&to.saturating_add(1));
        let gone = std::mem::replace(&mut self.slots, keep);
        for (seq, slot) in gone {
            self.unknown -= usize::from(!slot.key_known);
            self.unindex(seq, slot.state, slot.priority);
            match (slot.key, slot.state) {
                // Deleted under a live lease: its handler may still be running, and the next
                // message of its key must not start beside it. It keeps the key's place until
                // the lease runs out (its holder can no longer settle or extend it).
                (Some(k), SlotState::Leased { deadline, token })
                    if written.is_none_or(|w| token != FOREIGN_TOKEN && w(seq, token)) =>
                {
                    self.ghosts.insert((deadline, seq));
                    self.ghost_keys.insert(seq, k);
                }
                // In order: each key's next one is promoted once its earlier ones are gone.
                (key, _) => {
                    self.forget_key(seq, key);
                }
            }
        }
        self.frontier = self.frontier.max(to.saturating_add(1));
    }

    /// Slots leased (including leases run out whose timer has not fired yet).
    pub fn leased(&self) -> usize {
        self.leased
    }

    /// Slots waiting for a retry.
    pub fn waiting(&self) -> usize {
        self.waiting
    }

    /// `(seq, attempt, deadline)` of every lease held in this process.
    pub fn leases(&self) -> impl Iterator<Item = (u64, u32, Instant)> + '_ {
        // Not another process's (etcd): its record is what it wrote, extensions included, and
        // a deadline taken through this clock's `Instant` and back would be off by rounding.
        self.timers.iter().filter_map(|&(t, seq)| match self.slots.get(&seq) {
            Some(s) if matches!(s.state, SlotState::Leased { token, .. } if token != FOREIGN_TOKEN) => {
                Some((seq, s.attempt, t))
            }
            _ => None,
        })
    }

    /// Leases still running at `now`: the expired ones are found among the timers due by
    /// `now`, so retries waiting past `now` (a backlog of them) are not walked.
    pub fn live_leased(&self, now: Instant) -> usize {
        use std::ops::Bound::{Included, Unbounded};
        let expired = self
            .timers
            .range((Unbounded, Included((now, u64::MAX))))
            .filter(|&&(_, seq)| {
                matches!(self.slots.get(&seq).map(|s| s.state), Some(SlotState::Leased { .. }))
            })
            .count();
        self.leased.saturating_sub(expired)
    }

    /// Whether a lease of this process runs past `now`. Another process's leases (the etcd
    /// engine mirrors them from its claim watch, under `FOREIGN_TOKEN`) are not counted: that
    /// mirror lags etcd, which the etcd engine's reset reads instead.
    pub fn held(&self, now: Instant) -> bool {
        use std::ops::Bound::{Excluded, Unbounded};
        self.timers.range((Excluded((now, u64::MAX)), Unbounded)).any(|&(_, seq)| {
            matches!(
                self.slots.get(&seq).map(|s| s.state),
                Some(SlotState::Leased { token, .. }) if token != FOREIGN_TOKEN
            )
        })
    }

    /// The sequences a claim at `now` could take (above `from`), in order: for tests.
    #[cfg(test)]
    pub fn claimable(&self, now: Instant, from: u64) -> Vec<u64> {
        let mut out: Vec<u64> = self.ready.range(from..).copied().collect();
        out.extend(self.timers.iter().take_while(|(t, _)| *t <= now).map(|&(_, s)| s).filter(|&s| s >= from));
        out.sort_unstable();
        out
    }
}
