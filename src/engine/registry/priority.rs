//! A queue's prioritised messages: the sequence of every retained message sent with a priority
//! above 0, by priority. The writer adds each as it appends it (and its index record in the
//! same batch, so the index is rebuilt at open without reading a message); retention drops
//! what it deletes.
//!
//! Work groups read it to claim ahead of their frontier: a prioritised message published after
//! a million plain ones is found in O(log n), without reading the backlog (see
//! `dispatch.rs`). Each group keeps its own place in each priority (its cursors); the index is
//! the queue's, shared by every group.

use std::collections::{BTreeMap, BTreeSet};

/// The index (see the module docs). Small in the intended use: the few messages that must jump
/// the line.
#[derive(Debug, Default)]
pub(crate) struct Priorities {
    levels: BTreeMap<u8, BTreeSet<u64>>,
}

impl Priorities {
    /// Adds message `seq` with `priority` (0 is not indexed).
    pub fn insert(&mut self, seq: u64, priority: u8) {
        if priority > 0 {
            self.levels.entry(priority).or_default().insert(seq);
        }
    }

    /// The priority of message `seq` (0 if it has none, or is not retained).
    pub fn of(&self, seq: u64) -> u8 {
        self.levels.iter().rev().find(|(_, seqs)| seqs.contains(&seq)).map_or(0, |(&p, _)| p)
    }

    /// The highest-priority message in `from..=to` not claimed yet by a group whose place in
    /// each priority is `cursor(p)` (the first sequence of that priority it has not claimed):
    /// `(priority, seq)`, the lowest sequence within the priority.
    pub fn best(&self, from: u64, to: u64, cursor: impl Fn(u8) -> u64) -> Option<(u8, u64)> {
        if from > to {
            return None;
        }
        self.levels.iter().rev().find_map(|(&p, seqs)| {
            let start = cursor(p).max(from);
            (start <= to).then(|| seqs.range(start..=to).next().map(|&s| (p, s))).flatten()
        })
    }

    /// Every `(seq, priority)` in `from..to` of priority `p`, in order.
    pub fn range_of(&self, p: u8, from: u64, to: u64) -> Vec<u64> {
        match self.levels.get(&p) {
            Some(seqs) if from < to => seqs.range(from..to).copied().collect(),
            _ => Vec::new(),
        }
    }

    /// The priorities in use.
    pub fn levels(&self) -> Vec<u8> {
        self.levels.keys().copied().collect()
    }

    /// Retention deleted everything through `through`.
    pub fn forget_through(&mut self, through: u64) {
        self.levels.retain(|_, seqs| {
            *seqs = seqs.split_off(&through.saturating_add(1));
            !seqs.is_empty()
        });
    }

    /// Messages indexed.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.levels.values().map(BTreeSet::len).sum()
    }

    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.levels.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_best_is_the_highest_priority_then_the_lowest_sequence_past_each_cursor() {
        let mut p = Priorities::default();
        for (seq, pr) in [(3, 1), (5, 9), (7, 9), (8, 1), (10, 0)] {
            p.insert(seq, pr);
        }
        assert_eq!(p.len(), 4, "priority 0 is not indexed");
        assert_eq!(p.best(1, 100, |_| 0), Some((9, 5)));
        assert_eq!(p.best(1, 100, |l| if l == 9 { 6 } else { 0 }), Some((9, 7)));
        assert_eq!(p.best(1, 100, |l| if l == 9 { 8 } else { 0 }), Some((1, 3)));
        assert_eq!(p.best(4, 100, |l| if l == 9 { 8 } else { 0 }), Some((1, 8)), "from bounds below");
        assert_eq!(p.best(1, 4, |l| if l == 9 { 8 } else { 0 }), Some((1, 3)), "to bounds above");
        assert_eq!(p.best(1, 2, |_| 0), None);
        assert_eq!(p.best(9, 2, |_| 0), None);
        assert_eq!((p.of(5), p.of(8), p.of(10)), (9, 1, 0));
        assert_eq!(p.range_of(9, 0, 7), vec![5]);
        p.forget_through(5);
        assert_eq!(p.levels(), vec![1, 9]);
        assert_eq!(p.best(1, 100, |_| 0), Some((9, 7)));
        p.forget_through(8);
        assert!(p.is_empty());
    }
}
