//! The sequences a work-queue group finished above its offset, as a bitmap that starts at the
//! offset: marking one is O(1) amortised however many wait above a gap, and closing the gap
//! walks the bitmap a word (64 sequences) at a time.

use std::collections::VecDeque;

/// Finished sequences above a base. Sequence `base` is bit `skip` of the front word; the bits
/// below `skip` are passed (ignored), so moving the base never shifts the words.
#[derive(Debug, Default, Clone)]
pub(crate) struct Finished {
    /// The first sequence the window covers (the offset + 1).
    base: u64,
    /// Bits of the front word below the base.
    skip: u32,
    words: VecDeque<u64>,
    len: usize,
}

impl Finished {
    /// An empty set whose window starts at `base`.
    pub fn new(base: u64) -> Self {
        Finished { base, skip: 0, words: VecDeque::new(), len: 0 }
    }

    /// How many sequences are marked.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Word and bit of `seq`, if it is at or above the base.
    fn position(&self, seq: u64) -> Option<(usize, u64)> {
        let i = seq.checked_sub(self.base)? + u64::from(self.skip);
        Some((usize::try_from(i / 64).ok()?, i % 64))
    }

    /// Whether `seq` is marked.
    pub fn contains(&self, seq: u64) -> bool {
        let Some((w, b)) = self.position(seq) else { return false };
        self.words.get(w).is_some_and(|word| word & (1 << b) != 0)
    }

    /// Marks `seq` (at or above the base); false if it was marked or lies below the base.
    pub fn insert(&mut self, seq: u64) -> bool {
        let Some((w, b)) = self.position(seq) else { return false };
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
        self.base
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

    /// The marked sequences, ascending.
    pub fn iter(&self) -> impl Iterator<Item = u64> + '_ {
        let (skip, first) = (u64::from(self.skip), self.base);
        self.words.iter().enumerate().flat_map(move |(w, &word)| {
            let start = if w == 0 { skip } else { 0 };
            (start..64).filter(move |b| word & (1 << b) != 0).map(move |b| first + 64 * w as u64 + b - skip)
        })
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
        fn behaves_like_a_set_with_an_offset(ops in proptest::collection::vec((0u64..300, any::<bool>()), 0..400)) {
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
                for s in 0..320 {
                    prop_assert_eq!(f.contains(s), set.contains(&s));
                }
            }
        }
    }
}
