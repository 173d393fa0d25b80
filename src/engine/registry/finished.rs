//! The sequences a work-queue group finished above its offset, as a bitmap that starts at the
//! offset: marking one is O(1) amortised however many wait above a gap, and closing the gap
//! walks the bitmap a word (64 sequences) at a time.
//!
//! The bitmap spans at most [`WINDOW`] sequences; one finished farther ahead (a prioritised job
//! claimed past a large backlog) is kept in a sorted set until the window reaches it, so a job
//! finished a billion messages ahead costs a set entry, not 125 MB of bits.

use std::collections::{BTreeSet, VecDeque};

/// Sequences the bitmap spans from its front word (a multiple of 64): 128 KiB of bits. Small
/// in unit tests, so that they cross it.
const WINDOW: u64 = if cfg!(test) { 128 } else { 1 << 20 };

/// Finished sequences above a base. Sequence `base` is bit `skip` of the front word; the bits
/// below `skip` are passed (ignored), so moving the base never shifts the words.
#[derive(Debug, Default, Clone)]
pub(crate) struct Finished {
    /// The first sequence the window covers (the offset + 1).
    base: u64,
    /// Bits of the front word below the base.
    skip: u32,
    words: VecDeque<u64>,
    /// Marked sequences past the bitmap's window (see the module docs).
    far: BTreeSet<u64>,
    len: usize,
}

impl Finished {
    /// An empty set whose window starts at `base`.
    pub fn new(base: u64) -> Self {
        Finished { base, skip: 0, words: VecDeque::new(), far: BTreeSet::new(), len: 0 }
    }

    /// How many sequences are marked.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Bit index of `seq` from the front word's first bit, if it is at or above the base.
    fn index(&self, seq: u64) -> Option<u64> {
        Some(seq.checked_sub(self.base)? + u64::from(self.skip))
    }

    /// Whether `seq` is marked.
    pub fn contains(&self, seq: u64) -> bool {
        let Some(i) = self.index(seq) else { return false };
        if i >= WINDOW {
            return self.far.contains(&seq);
        }
        let (w, b) = ((i / 64) as usize, i % 64);
        self.words.get(w).is_some_and(|word| word & (1 << b) != 0)
    }

    /// Marks `seq` (at or above the base); false if it was marked or lies below the base.
    pub fn insert(&mut self, seq: u64) -> bool {
        let Some(i) = self.index(seq) else { return false };
        if i >= WINDOW {
            let new = self.far.insert(seq);
            self.len += usize::from(new);
            return new;
        }
        self.set_bit(i)
    }

    /// Sets bit `i` (within the window); false if it was set.
    fn set_bit(&mut self, i: u64) -> bool {
        let (w, b) = ((i / 64) as usize, i % 64);
        if self.words.len() <= w {
            self.words.resize(w + 1, 0);
        }
        let Some(word) = self.words.get_mut(w) else { return false };
        if *word & (1 << b) != 0 {
            return false;
        }
        *word |= 1 << b;
        self.len += 1;
        true
    }

    /// Unmarks the contiguous run of marked sequences at the base and moves the base past it;
    /// returns the new base (unchanged if the base itself is not marked). A word at a time.
    pub fn advance(&mut self) -> u64 {
        loop {
            self.advance_bits();
            // The window moved: what was past it and now falls inside goes into the bitmap.
            let end = self.base - u64::from(self.skip) + WINDOW;
            let mut moved = false;
            while let Some(&seq) = self.far.first().filter(|&&s| s < end) {
                self.far.pop_first();
                self.len -= 1;
                let i = seq - self.base + u64::from(self.skip);
                self.set_bit(i);
                moved = true;
            }
            if !moved {
                return self.base;
            }
        }
    }

    /// [`advance`](Finished::advance) within the bitmap.
    fn advance_bits(&mut self) {
        while let Some(&word) = self.words.front() {
            let passed = (1u64 << self.skip) - 1;
            let word = word | passed;
            if word == u64::MAX {
                let n = 64 - self.skip;
                self.words.pop_front();
                self.base += u64::from(n);
                self.len -= n as usize;
                self.skip = 0;
                continue;
            }
            let run = word.trailing_ones();
            let n = run - self.skip;
            self.base += u64::from(n);
            self.len -= n as usize;
            self.skip = run;
            break;
        }
        if self.words.is_empty() {
            self.skip = 0;
        }
    }

    /// Forgets every sequence below `base` and starts the window there (retention skipped the
    /// group, or a reset moved it).
    pub fn rebase(&mut self, base: u64) {
        if base == self.base {
            return;
        }
        let marked: Vec<u64> =
            if base > self.base { self.iter().filter(|&s| s >= base).collect() } else { Vec::new() };
        *self = Finished::new(base);
        for s in marked {
            self.insert(s);
        }
    }

    /// The marked sequences, ascending (the bitmap's all lie below the far ones: the window
    /// is moved only by `advance`, which moves the far ones it reaches into the bitmap).
    pub fn iter(&self) -> impl Iterator<Item = u64> + '_ {
        let (skip, first) = (u64::from(self.skip), self.base);
        let bits = self.words.iter().enumerate().flat_map(move |(w, &word)| {
            let start = if w == 0 { skip } else { 0 };
            (start..64).filter(move |b| word & (1 << b) != 0).map(move |b| first + 64 * w as u64 + b - skip)
        });
        bits.chain(self.far.iter().copied())
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use proptest::prelude::*;

    use super::*;

    proptest! {
        /// Against a `BTreeSet` and an offset moved one by one (what the writer did before).
        #[test]
        fn behaves_like_a_set_with_an_offset(ops in proptest::collection::vec((0u64..700, any::<bool>()), 0..400)) {
            let mut f = Finished::new(1);
            let (mut set, mut offset) = (BTreeSet::new(), 0u64);
            for (seq, rebase) in ops {
                if rebase {
                    let to = offset + seq / 8;
                    f.rebase(to + 1);
                    set = set.split_off(&(to + 1));
                    offset = offset.max(to);
                } else {
                    let fresh = seq > offset && set.insert(seq);
                    prop_assert_eq!(f.insert(seq), fresh);
                }
                while set.first() == Some(&(offset + 1)) {
                    set.pop_first();
                    offset += 1;
                }
                prop_assert_eq!(f.advance(), offset + 1);
                prop_assert_eq!(f.len(), set.len());
                prop_assert_eq!(f.iter().collect::<Vec<_>>(), set.iter().copied().collect::<Vec<_>>());
                for s in 0..720 {
                    prop_assert_eq!(f.contains(s), set.contains(&s));
                }
            }
        }
    }
}
