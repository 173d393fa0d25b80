//! Read intents on a keyspace's keys, in this process: a transaction's `get_for_update` holds
//! its key until the transaction is answered (applied, refused or dropped), so that another
//! transaction of this process reading the same key for update waits for that write and then
//! reads it — instead of reading the revision before it and failing its condition at commit.
//!
//! Why: a worker pool takes its next job while the previous job's transaction is on its way to
//! the disk, and eight workers updating one counter all read the same revision. Without this,
//! a handler conflicted with its own pool's previous commit (issue 35: 473 re-runs per 1,000
//! jobs with one worker).
//!
//! A lock here is an optimisation, never the guarantee: the condition at commit is. The wait is
//! bounded, so two transactions taking two keys in opposite orders wait out the bound and go
//! on optimistically (one of them may then conflict), and other processes (the etcd engine)
//! never see these locks.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

type Table = Arc<Mutex<HashMap<Bytes, Arc<Semaphore>>>>;

/// The keys of one keyspace held by a transaction of this process. Entries exist only while
/// someone holds or waits for them.
#[derive(Debug, Default)]
pub(crate) struct KeyLocks {
    table: Table,
}

/// A held key: released when dropped.
#[derive(Debug)]
pub(crate) struct KeyLock {
    table: Table,
    key: Bytes,
    sem: Option<Arc<Semaphore>>,
    permit: Option<OwnedSemaphorePermit>,
}

fn lock(table: &Table) -> MutexGuard<'_, HashMap<Bytes, Arc<Semaphore>>> {
    table.lock().unwrap_or_else(|p| p.into_inner())
}

/// Drops a holder's reference to `key`'s entry and removes the entry if it was the last. Every
/// clone of an entry's `Arc` is made under the table's mutex, and each holder's other
/// references (its permit, its wait) are gone before it comes here, so the last holder to
/// come here sees the count at 1.
fn forget(table: &Table, key: &Bytes, sem: &mut Option<Arc<Semaphore>>) {
    let mut held = lock(table);
    drop(sem.take());
    if held.get(key).is_some_and(|s| Arc::strong_count(s) == 1) {
        held.remove(key);
    }
}

impl KeyLocks {
    /// Holds `key` once no other transaction of this process does, waiting at most `wait`;
    /// `None` if the wait ran out (go on without it).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: dropped while waiting, nothing is held.
    pub async fn lock(&self, key: &[u8], wait: Duration) -> Option<KeyLock> {
        let key = Bytes::copy_from_slice(key);
        let (sem, mine) = {
            let mut table = lock(&self.table);
            let sem = table.entry(key.clone()).or_insert_with(|| Arc::new(Semaphore::new(1)));
            (sem.clone(), sem.clone())
        };
        // Built before waiting, so that a cancelled wait still forgets its reference.
        let mut held = KeyLock { table: self.table.clone(), key, sem: Some(mine), permit: None };
        match tokio::time::timeout(wait, sem.acquire_owned()).await {
            Ok(Ok(permit)) => {
                held.permit = Some(permit);
                Some(held)
            }
            _ => None,
        }
    }

    /// How many keys are held or waited for (for tests).
    #[cfg(test)]
    pub fn len(&self) -> usize {
        lock(&self.table).len()
    }
}

impl KeyLock {
    /// The key held.
    pub fn key(&self) -> &Bytes {
        &self.key
    }
}

impl Drop for KeyLock {
    fn drop(&mut self) {
        drop(self.permit.take());
        forget(&self.table, &self.key, &mut self.sem);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_second_holder_waits_for_the_first_and_entries_go_when_unused() {
        let locks = KeyLocks::default();
        let a = locks.lock(b"k", Duration::from_secs(60)).await.expect("free");
        let other = locks.lock(b"other", Duration::from_secs(60)).await.expect("another key is free");
        let waiting = locks.lock(b"k", Duration::from_secs(60));
        tokio::pin!(waiting);
        assert!(futures::poll!(waiting.as_mut()).is_pending(), "held: the second waits");
        drop(a);
        let b = waiting.await.expect("released: the second holds it");
        drop((b, other));
        assert_eq!(locks.len(), 0, "no entry outlives its holders");
    }

    #[tokio::test(start_paused = true)]
    async fn a_wait_is_bounded_and_a_cancelled_wait_leaves_nothing() {
        let locks = KeyLocks::default();
        let a = locks.lock(b"k", Duration::from_secs(1)).await.expect("free");
        assert!(locks.lock(b"k", Duration::from_secs(1)).await.is_none(), "waited out");
        {
            let cancelled = locks.lock(b"k", Duration::from_secs(60));
            tokio::pin!(cancelled);
            assert!(futures::poll!(cancelled.as_mut()).is_pending());
        }
        drop(a);
        assert_eq!(locks.len(), 0);
    }
}
