//! [`Keyed`]: values in insertion order, each also found by its key in O(1). Per-round
//! bookkeeping (queues appended to, groups whose offsets moved, queues and groups created)
//! used to search a `Vec` for each entry: quadratic in a round that touches thousands of
//! queues or groups.

use rustc_hash::FxHashMap as HashMap;
use std::borrow::Borrow;
use std::hash::Hash;

/// Values in insertion order with a hash index by key.
#[derive(Debug)]
pub(crate) struct Keyed<K, V> {
    values: Vec<V>,
    /// The key of each value, at the same index.
    keys: Vec<K>,
    at: HashMap<K, usize>,
}

impl<K, V> Default for Keyed<K, V> {
    fn default() -> Self {
        Keyed { values: Vec::new(), keys: Vec::new(), at: HashMap::default() }
    }
}

impl<K: Hash + Eq + Clone, V> Keyed<K, V> {
    /// The value of `key`, if any.
    pub fn get<Q: Hash + Eq + ?Sized>(&self, key: &Q) -> Option<&V>
    where
        K: Borrow<Q>,
    {
        self.at.get(key).and_then(|&i| self.values.get(i))
    }

    /// The value of `key`, if any, to change.
    pub fn get_mut<Q: Hash + Eq + ?Sized>(&mut self, key: &Q) -> Option<&mut V>
    where
        K: Borrow<Q>,
    {
        self.at.get(key).and_then(|&i| self.values.get_mut(i))
    }

    /// The value of `key`, inserted by `make` (last in order) if it has none.
    pub fn get_or_insert_with(&mut self, key: K, make: impl FnOnce() -> V) -> &mut V {
        let i = match self.at.get(&key) {
            Some(&i) => i,
            None => {
                self.values.push(make());
                self.keys.push(key.clone());
                self.at.insert(key, self.values.len() - 1);
                self.values.len() - 1
            }
        };
        &mut self.values[i]
    }

    /// Removes the value of `key` (the last value takes its place in the order).
    pub fn remove(&mut self, key: &K) -> Option<V> {
        let i = self.at.remove(key)?;
        let v = self.values.swap_remove(i);
        self.keys.swap_remove(i);
        if let Some(moved) = self.keys.get(i) {
            self.at.insert(moved.clone(), i);
        }
        Some(v)
    }

    /// The values, in insertion order.
    pub fn values(&self) -> &[V] {
        &self.values
    }

    /// How many values.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.values.len()
    }

    /// Whether there are none.
    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }

    /// Takes every value, in insertion order, leaving it empty.
    pub fn take(&mut self) -> Vec<V> {
        self.at.clear();
        self.keys.clear();
        std::mem::take(&mut self.values)
    }
}

impl<K, V> IntoIterator for Keyed<K, V> {
    type Item = V;
    type IntoIter = std::vec::IntoIter<V>;

    fn into_iter(self) -> Self::IntoIter {
        self.values.into_iter()
    }
}

#[cfg(test)]
mod tests {
    use super::Keyed;

    #[test]
    fn finds_by_key_keeps_order_and_survives_removal() {
        let mut k: Keyed<u32, (u32, u32)> = Keyed::default();
        for i in 0..5 {
            k.get_or_insert_with(i, || (i, 0)).1 += 1;
        }
        k.get_or_insert_with(2, || (99, 0)).1 += 1;
        assert_eq!(k.get(&2), Some(&(2, 2)), "found, not inserted again");
        assert_eq!(k.len(), 5);
        assert_eq!(k.remove(&1), Some((1, 1)));
        assert_eq!(k.get(&4), Some(&(4, 1)), "the moved value is still found");
        assert_eq!(k.remove(&4), Some((4, 1)));
        assert!(k.get(&4).is_none() && k.get(&1).is_none());
        k.get_mut(&3).unwrap().1 = 7;
        assert_eq!(k.values().iter().map(|v| v.0).collect::<Vec<_>>(), [0, 3, 2]);
        assert_eq!(k.take().len(), 3);
        assert!(k.is_empty() && k.get(&0).is_none());
    }
}
