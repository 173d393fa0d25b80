//! [`Keyspace`]: application state stored in the broker's database, beside its queues, so that a
//! [`Transaction`](crate::Transaction) can change it atomically with acks and sends.

mod scan;
mod txn;

use std::ops::{Bound, RangeBounds};
use std::sync::Arc;

use bytes::Bytes;

pub use self::scan::Scan;
use crate::engine::boundary::{KeyspaceState, Shared};
use crate::entry::{Entry, Expect, check_key};
use crate::error::Error;

/// A named keyspace of versioned entries (`key → value, revision`), stored in the broker's
/// database: see [`Broker::kv`](crate::Broker::kv).
///
/// Reads ([`get`](Keyspace::get), [`scan`](Keyspace::scan), [`prefix`](Keyspace::prefix)) run
/// on Tokio's blocking pool and see every write whose commit has resolved; under
/// [`Durability::Fsync`](crate::Durability::Fsync) they may also see a write whose commit is
/// still waiting for its WAL sync (it is applied, not yet durable: a power loss could undo it,
/// together with everything written after it). Writes ([`put`](Keyspace::put),
/// [`delete`](Keyspace::delete), [`compare_and_set`](Keyspace::compare_and_set)) are
/// one-operation transactions; to change several keys, or keys together with acks and sends,
/// use a [`Transaction`](crate::Transaction).
///
/// Cheap to clone.
#[derive(Clone)]
pub struct Keyspace {
    pub(crate) shared: Arc<Shared>,
    pub(crate) state: Arc<KeyspaceState>,
}

impl std::fmt::Debug for Keyspace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Keyspace").field("name", &self.state.name).field("id", &self.state.id).finish()
    }
}

/// How many entries a scan reads per trip to the blocking pool.
const SCAN_PAGE: usize = 256;

impl Keyspace {
    pub(crate) fn new(shared: Arc<Shared>, state: Arc<KeyspaceState>) -> Self {
        Keyspace { shared, state }
    }

    /// The keyspace's name.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(broker: rockq::Broker) -> Result<(), rockq::Error> {
    /// let accounts = broker.kv("accounts").await?;
    /// assert_eq!(accounts.name(), "accounts");
    /// # Ok(()) }
    /// ```
    pub fn name(&self) -> &str {
        &self.state.name
    }

    /// How many keys it holds (counted by the writer; a figure may include a commit still
    /// being synced).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(accounts: rockq::Keyspace) {
    /// println!("{} accounts", accounts.len());
    /// # }
    /// ```
    pub fn len(&self) -> u64 {
        self.state.keys()
    }

    /// Whether it holds no key.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(accounts: rockq::Keyspace) {
    /// if accounts.is_empty() { println!("no accounts yet"); }
    /// # }
    /// ```
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The entry under `key`, if any.
    ///
    /// # Errors
    ///
    /// [`Error::Invalid`] (empty, or longer than [`MAX_KV_KEY_LEN`](crate::MAX_KV_KEY_LEN));
    /// [`Error::Shutdown`]; [`Error::Storage`], [`Error::Corrupt`].
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(accounts: rockq::Keyspace) -> Result<(), rockq::Error> {
    /// if let Some(e) = accounts.get("alice").await? {
    ///     println!("alice: {:?} (revision {})", e.value, e.revision);
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn get(&self, key: impl AsRef<[u8]>) -> Result<Option<Entry>, Error> {
        let key = key.as_ref();
        check_key(key).map_err(|reason| Error::Invalid { reason: reason.into() })?;
        let (shared, id, k) = (self.shared.clone(), self.state.id, key.to_vec());
        let found = self
            .shared
            .runtime
            .spawn_blocking(move || shared.kv_get(id, &k))
            .await
            .map_err(|_| Error::Shutdown)??;
        Ok(found.map(|(revision, value)| Entry {
            key: Bytes::copy_from_slice(key),
            value: Bytes::from(value),
            revision,
        }))
    }

    /// The entries with keys in `range`, in key order, as a stream read a page at a time on
    /// the blocking pool (no iterator is held between pages, so a long scan neither pins
    /// memory nor blocks writers). Each page sees the keyspace as of when it is read.
    ///
    /// # Errors
    ///
    /// The stream yields [`Error::Shutdown`], [`Error::Storage`] or [`Error::Corrupt`]
    /// and ends.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(accounts: rockq::Keyspace) -> Result<(), rockq::Error> {
    /// use futures::StreamExt;
    /// let mut all = accounts.scan::<&[u8], _>(..);
    /// while let Some(entry) = all.next().await {
    ///     let entry = entry?;
    ///     println!("{:?} = {:?}", entry.key, entry.value);
    /// }
    /// let some: Vec<_> = accounts.scan(&b"a"[..]..&b"m"[..]).collect().await;
    /// # Ok(()) }
    /// ```
    pub fn scan<K: AsRef<[u8]>, R: RangeBounds<K>>(&self, range: R) -> Scan {
        let from = match range.start_bound() {
            Bound::Included(k) => k.as_ref().to_vec(),
            // The smallest key above `k`.
            Bound::Excluded(k) => [k.as_ref(), &[0]].concat(),
            Bound::Unbounded => Vec::new(),
        };
        let to = match range.end_bound() {
            Bound::Included(k) => Some([k.as_ref(), &[0]].concat()),
            Bound::Excluded(k) => Some(k.as_ref().to_vec()),
            Bound::Unbounded => None,
        };
        Scan::new(self.shared.clone(), self.state.id, from, to, SCAN_PAGE)
    }

    /// The entries whose keys start with `prefix`, in key order (see [`scan`](Keyspace::scan)).
    ///
    /// # Errors
    ///
    /// As [`scan`](Keyspace::scan).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(accounts: rockq::Keyspace) -> Result<(), rockq::Error> {
    /// use futures::TryStreamExt;
    /// let eu: Vec<rockq::Entry> = accounts.prefix("eu/").try_collect().await?;
    /// # Ok(()) }
    /// ```
    pub fn prefix(&self, prefix: impl AsRef<[u8]>) -> Scan {
        let from = prefix.as_ref().to_vec();
        let to = crate::engine::boundary::prefix_end(&from);
        Scan::new(self.shared.clone(), self.state.id, from, to, SCAN_PAGE)
    }

    /// Stores `value` under `key` (one-operation transaction); returns the write's revision,
    /// once durable.
    ///
    /// # Errors
    ///
    /// [`Error::Invalid`] (bad key, value larger than
    /// [`Options::max_message_bytes`](crate::Options::max_message_bytes)); [`Error::Shutdown`],
    /// [`Error::Storage`], [`Error::Failed`].
    ///
    /// # Cancel safety
    ///
    /// If the future is dropped after the write was handed to the writer, it may still be
    /// applied.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(accounts: rockq::Keyspace) -> Result<(), rockq::Error> {
    /// let revision = accounts.put("alice", "100").await?;
    /// # Ok(()) }
    /// ```
    pub async fn put(&self, key: impl AsRef<[u8]>, value: impl Into<Bytes>) -> Result<u64, Error> {
        self.write(key.as_ref(), Some(value.into()), None).await
    }

    /// Deletes `key` (one-operation transaction), once durable; deleting a missing key is not
    /// an error.
    ///
    /// # Errors
    ///
    /// As [`put`](Keyspace::put).
    ///
    /// # Cancel safety
    ///
    /// As [`put`](Keyspace::put).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(accounts: rockq::Keyspace) -> Result<(), rockq::Error> {
    /// accounts.delete("alice").await?;
    /// # Ok(()) }
    /// ```
    pub async fn delete(&self, key: impl AsRef<[u8]>) -> Result<(), Error> {
        self.write(key.as_ref(), None, None).await.map(drop)
    }

    /// Stores `value` under `key` (or deletes it, for `None`) only if `expect` holds when the
    /// writer applies it; returns the write's revision. The building block of optimistic
    /// concurrency: read an [`Entry`], compute, then write with
    /// `Expect::Revision(entry.revision)` (or [`Expect::Absent`] to create).
    ///
    /// # Errors
    ///
    /// [`Error::Conflict`] if `expect` did not hold (nothing written); otherwise as
    /// [`put`](Keyspace::put).
    ///
    /// # Cancel safety
    ///
    /// As [`put`](Keyspace::put).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(counters: rockq::Keyspace) -> Result<(), rockq::Error> {
    /// use rockq::Expect;
    /// loop {
    ///     let current = counters.get("hits").await?;
    ///     let n: u64 = current.as_ref().map_or(0, |e| String::from_utf8_lossy(&e.value).parse().unwrap_or(0));
    ///     let expect = Expect::from_read(current.as_ref());
    ///     match counters.compare_and_set("hits", expect, Some((n + 1).to_string())).await {
    ///         Ok(_) => break,
    ///         Err(e) if e.is_conflict() => continue, // someone else won: read again
    ///         Err(e) => return Err(e.into()),
    ///     }
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn compare_and_set(
        &self,
        key: impl AsRef<[u8]>,
        expect: Expect,
        value: Option<impl Into<Bytes>>,
    ) -> Result<u64, Error> {
        self.write(key.as_ref(), value.map(Into::into), Some(expect)).await
    }

    async fn write(&self, key: &[u8], value: Option<Bytes>, expect: Option<Expect>) -> Result<u64, Error> {
        let mut tx = crate::txn::Transaction::new(self.shared.clone());
        tx.write(self, key, value, expect)?;
        let done = tx.commit().await?;
        Ok(done.revision().unwrap_or(0))
    }
}
