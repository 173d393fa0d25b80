//! Keyspace writes and conditions in a [`Transaction`] (and in a pool handler's [`TaskTx`]).

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use super::Keyspace;
use crate::engine::boundary::{KeyLock, KvWrite};
use crate::entry::{Entry, Expect, check_key};
use crate::error::Error;
use crate::txn::Transaction;
use crate::txn::task::TaskTx;

impl Transaction {
    /// Stores `value` under `key` in `keyspace` when the transaction commits.
    ///
    /// # Errors
    ///
    /// [`Error::Invalid`] for an empty or too long key
    /// ([`MAX_KV_KEY_LEN`](crate::MAX_KV_KEY_LEN)) or a value larger than
    /// [`Options::max_message_bytes`](crate::Options::max_message_bytes). The transaction is
    /// unchanged.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(broker: rockq::Broker, users: rockq::Keyspace) -> Result<(), rockq::Error> {
    /// let mut tx = broker.transaction();
    /// tx.put(&users, "alice", r#"{"plan":"pro"}"#)?;
    /// tx.commit().await?;
    /// # Ok(()) }
    /// ```
    pub fn put(
        &mut self,
        keyspace: &Keyspace,
        key: impl AsRef<[u8]>,
        value: impl Into<Bytes>,
    ) -> Result<&mut Self, Error> {
        self.write(keyspace, key.as_ref(), Some(value.into()), None)
    }

    /// Stores `value` under `key` only if `expect` holds (checked with the rest when the
    /// transaction is applied: if it does not, nothing of the transaction is).
    ///
    /// # Errors
    ///
    /// As [`put`](Transaction::put); the conflict itself is reported by
    /// [`commit`](Transaction::commit).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(broker: rockq::Broker, users: rockq::Keyspace) -> Result<(), rockq::Error> {
    /// use rockq::Expect;
    /// let mut tx = broker.transaction();
    /// tx.put_if(&users, "alice", "created", Expect::Absent)?; // create only
    /// tx.commit().await?;
    /// # Ok(()) }
    /// ```
    pub fn put_if(
        &mut self,
        keyspace: &Keyspace,
        key: impl AsRef<[u8]>,
        value: impl Into<Bytes>,
        expect: Expect,
    ) -> Result<&mut Self, Error> {
        self.write(keyspace, key.as_ref(), Some(value.into()), Some(expect))
    }

    /// Deletes `key` of `keyspace` when the transaction commits (a missing key is not an
    /// error).
    ///
    /// # Errors
    ///
    /// [`Error::Invalid`] for a bad key.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(broker: rockq::Broker, carts: rockq::Keyspace) -> Result<(), rockq::Error> {
    /// let mut tx = broker.transaction();
    /// tx.delete(&carts, "alice")?;
    /// tx.commit().await?;
    /// # Ok(()) }
    /// ```
    pub fn delete(&mut self, keyspace: &Keyspace, key: impl AsRef<[u8]>) -> Result<&mut Self, Error> {
        self.write(keyspace, key.as_ref(), None, None)
    }

    /// Deletes `key` only if `expect` holds.
    ///
    /// # Errors
    ///
    /// As [`delete`](Transaction::delete).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(broker: rockq::Broker, locks: rockq::Keyspace, mine: rockq::Entry) -> Result<(), rockq::Error> {
    /// use rockq::Expect;
    /// let mut tx = broker.transaction();
    /// tx.delete_if(&locks, "job-7", Expect::Revision(mine.revision))?; // only my own lock
    /// tx.commit().await?;
    /// # Ok(()) }
    /// ```
    pub fn delete_if(
        &mut self,
        keyspace: &Keyspace,
        key: impl AsRef<[u8]>,
        expect: Expect,
    ) -> Result<&mut Self, Error> {
        self.write(keyspace, key.as_ref(), None, Some(expect))
    }

    /// Adds the condition that `key` satisfies `expect` when the transaction is applied,
    /// without writing it (a read this transaction depends on).
    ///
    /// # Errors
    ///
    /// [`Error::Invalid`] for a bad key.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(broker: rockq::Broker, flags: rockq::Keyspace, out: rockq::Queue) -> Result<(), rockq::Error> {
    /// use rockq::Expect;
    /// let mut tx = broker.transaction();
    /// tx.expect(&flags, "sending-enabled", Expect::Present)?;
    /// tx.send(&out, "hello")?;
    /// tx.commit().await?; // sends only if the flag is still set
    /// # Ok(()) }
    /// ```
    pub fn expect(
        &mut self,
        keyspace: &Keyspace,
        key: impl AsRef<[u8]>,
        expect: Expect,
    ) -> Result<&mut Self, Error> {
        self.room()?;
        let key = key.as_ref();
        check_key(key).map_err(|reason| Error::Invalid { reason: reason.into() })?;
        self.take_bytes(key.len())?;
        self.foreign |= !Arc::ptr_eq(&keyspace.shared, &self.shared);
        self.writes.push(KvWrite {
            keyspace: keyspace.state.clone(),
            key: key.to_vec(),
            value: None,
            expect: Some(expect),
            condition_only: true,
        });
        Ok(self)
    }

    /// Reads `key` of `keyspace` and adds the condition that it is unchanged when the
    /// transaction is applied (its revision, or still absent): the read half of a
    /// read-modify-write. If someone else writes it first, the commit fails with
    /// [`Error::Conflict`].
    ///
    /// Within this process the key is then **held** until the transaction is answered
    /// (committed, refused or dropped): another transaction's `get_for_update` of the same key
    /// waits for it (at most 1 s, then reads anyway) and reads what it wrote, instead of the
    /// revision before and a certain conflict. So a worker pool's handlers updating one counter
    /// take turns rather than fail. The condition at commit stays the guarantee: other
    /// processes (the etcd engine) and plain writes are not held back.
    ///
    /// # Errors
    ///
    /// As [`Keyspace::get`].
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: if dropped, the transaction is unchanged.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(broker: rockq::Broker, stock: rockq::Keyspace) -> Result<(), rockq::Error> {
    /// let mut tx = broker.transaction();
    /// let left: u32 = tx
    ///     .get_for_update(&stock, "sku-1")
    ///     .await?
    ///     .map_or(0, |e| String::from_utf8_lossy(&e.value).parse().unwrap_or(0));
    /// if left > 0 {
    ///     tx.put(&stock, "sku-1", (left - 1).to_string())?;
    /// }
    /// tx.commit().await?;
    /// # Ok(()) }
    /// ```
    pub async fn get_for_update(
        &mut self,
        keyspace: &Keyspace,
        key: impl AsRef<[u8]>,
    ) -> Result<Option<Entry>, Error> {
        let key = key.as_ref();
        let lock = hold(keyspace, key, self.holds(keyspace, key)).await;
        let found = keyspace.get(key).await?;
        self.expect(keyspace, key, Expect::from_read(found.as_ref()))?;
        self.keep(keyspace, lock);
        Ok(found)
    }

    /// Whether this transaction holds `key` already (a second read must not wait for itself).
    pub(crate) fn holds(&self, keyspace: &Keyspace, key: &[u8]) -> bool {
        self.held.contains_key(&(keyspace.state.id, Bytes::copy_from_slice(key)))
    }

    /// Keeps `lock` until the transaction is answered.
    pub(crate) fn keep(&mut self, keyspace: &Keyspace, lock: Option<KeyLock>) {
        if let Some(lock) = lock {
            self.held.insert((keyspace.state.id, lock.key().clone()), lock);
        }
    }

    pub(crate) fn write(
        &mut self,
        keyspace: &Keyspace,
        key: &[u8],
        value: Option<Bytes>,
        expect: Option<Expect>,
    ) -> Result<&mut Self, Error> {
        self.room()?;
        check_key(key).map_err(|reason| Error::Invalid { reason: reason.into() })?;
        let max = self.shared.options().max_message_bytes;
        if let Some(v) = &value
            && v.len() > max
        {
            return Err(Error::Invalid {
                reason: format!("value of {} bytes; the maximum is {max}", v.len()),
            });
        }
        self.take_bytes(key.len() + value.as_ref().map_or(0, Bytes::len))?;
        self.foreign |= !Arc::ptr_eq(&keyspace.shared, &self.shared);
        self.writes.push(KvWrite {
            keyspace: keyspace.state.clone(),
            key: key.to_vec(),
            value: value.map(|v| v.to_vec()),
            expect,
            condition_only: false,
        });
        Ok(self)
    }
}

impl TaskTx {
    /// Stores `value` under `key` together with the job's ack (see [`Transaction::put`]).
    ///
    /// # Errors
    ///
    /// As [`Transaction::put`].
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn demo(task: rockq::Task, results: rockq::Keyspace) -> Result<(), rockq::Error> {
    /// task.tx().put(&results, task.seq().to_be_bytes(), "ok")?;
    /// # Ok(()) }
    /// ```
    pub fn put(
        &self,
        keyspace: &Keyspace,
        key: impl AsRef<[u8]>,
        value: impl Into<Bytes>,
    ) -> Result<(), Error> {
        self.lock().put(keyspace, key, value).map(drop)
    }

    /// Stores `value` under `key` if `expect` holds (see [`Transaction::put_if`]).
    ///
    /// # Errors
    ///
    /// As [`Transaction::put`].
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn demo(task: rockq::Task, users: rockq::Keyspace) -> Result<(), rockq::Error> {
    /// task.tx().put_if(&users, "alice", "new", rockq::Expect::Absent)?;
    /// # Ok(()) }
    /// ```
    pub fn put_if(
        &self,
        keyspace: &Keyspace,
        key: impl AsRef<[u8]>,
        value: impl Into<Bytes>,
        expect: Expect,
    ) -> Result<(), Error> {
        self.lock().put_if(keyspace, key, value, expect).map(drop)
    }

    /// Deletes `key` together with the job's ack (see [`Transaction::delete`]).
    ///
    /// # Errors
    ///
    /// As [`Transaction::delete`].
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn demo(task: rockq::Task, carts: rockq::Keyspace) -> Result<(), rockq::Error> {
    /// task.tx().delete(&carts, "alice")?;
    /// # Ok(()) }
    /// ```
    pub fn delete(&self, keyspace: &Keyspace, key: impl AsRef<[u8]>) -> Result<(), Error> {
        self.lock().delete(keyspace, key).map(drop)
    }

    /// Adds a condition on `key` (see [`Transaction::expect`]).
    ///
    /// # Errors
    ///
    /// As [`Transaction::expect`].
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn demo(task: rockq::Task, flags: rockq::Keyspace) -> Result<(), rockq::Error> {
    /// task.tx().expect(&flags, "enabled", rockq::Expect::Present)?;
    /// # Ok(()) }
    /// ```
    pub fn expect(&self, keyspace: &Keyspace, key: impl AsRef<[u8]>, expect: Expect) -> Result<(), Error> {
        self.lock().expect(keyspace, key, expect).map(drop)
    }

    /// Reads `key` and adds the condition that it is unchanged when the job's transaction
    /// is applied (see [`Transaction::get_for_update`]).
    ///
    /// # Errors
    ///
    /// As [`Keyspace::get`].
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: if dropped, the transaction is unchanged.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(task: rockq::Task, stock: rockq::Keyspace) -> Result<(), rockq::Error> {
    /// let left = task.tx().get_for_update(&stock, "sku-1").await?;
    /// # Ok(()) }
    /// ```
    pub async fn get_for_update(
        &self,
        keyspace: &Keyspace,
        key: impl AsRef<[u8]>,
    ) -> Result<Option<Entry>, Error> {
        let key = key.as_ref();
        // Not waited for under the transaction's mutex: other clones may write meanwhile.
        let held = self.lock().holds(keyspace, key);
        let lock = hold(keyspace, key, held).await;
        let found = keyspace.get(key).await?;
        let mut tx = self.lock();
        tx.expect(keyspace, key, Expect::from_read(found.as_ref()))?;
        tx.keep(keyspace, lock);
        Ok(found)
    }
}

/// How long a `get_for_update` waits for another transaction of this process holding the key
/// before it reads anyway: long enough for a commit (milliseconds), short enough that two
/// transactions taking two keys in opposite orders lose little.
const KEY_WAIT: Duration = Duration::from_secs(1);

/// Holds `key` for a transaction's read for update, unless it does already.
async fn hold(keyspace: &Keyspace, key: &[u8], already: bool) -> Option<KeyLock> {
    if already {
        return None;
    }
    keyspace.state.locks.lock(key, KEY_WAIT).await
}
