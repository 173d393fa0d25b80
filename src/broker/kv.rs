//! The broker's keyspaces and transactions: [`Broker::kv`], [`Broker::get_kv`],
//! [`Broker::kv_names`], [`Broker::transaction`].

use tokio::sync::oneshot;

use super::Broker;
use crate::engine::boundary::{KvRequest, Request};
use crate::error::{Error, NameKind};
use crate::kv::Keyspace;
use crate::txn::Transaction;

impl Broker {
    /// A handle to keyspace `name` (application state stored beside the queues, written in
    /// [`Transaction`]s with acks and sends), creating it (durably) if it does not exist.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidName`] for a name outside the rules of queue names;
    /// [`Error::Shutdown`]; [`Error::Storage`].
    ///
    /// # Cancel safety
    ///
    /// Cancel safe in effect: if dropped, the keyspace may or may not have been created;
    /// calling again returns the same keyspace either way.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), rockq::Error> {
    /// # let dir = tempfile::tempdir()?;
    /// let broker = rockq::Broker::open(dir.path()).await?;
    /// let accounts = broker.kv("accounts").await?;
    /// let revision = accounts.put("alice", "100").await?;
    /// let alice = accounts.get("alice").await?.expect("just written");
    /// assert_eq!((alice.value.as_ref(), alice.revision), (&b"100"[..], revision));
    /// # broker.shutdown().await?;
    /// # Ok(()) }
    /// ```
    pub async fn kv(&self, name: &str) -> Result<Keyspace, Error> {
        crate::name::validate(NameKind::Keyspace, name)?;
        if self.shared.is_closed() {
            return Err(Error::Shutdown);
        }
        if let Some(k) = self.shared.keyspace(name) {
            return Ok(Keyspace::new(self.shared.clone(), k));
        }
        let (reply, rx) = oneshot::channel();
        self.shared
            .tx
            .send(Request::Kv(KvRequest::Create { name: name.to_owned(), reply }))
            .await
            .map_err(|_| Error::Shutdown)?;
        let state = rx.await.map_err(|_| Error::Shutdown)??;
        Ok(Keyspace::new(self.shared.clone(), state))
    }

    /// Keyspace `name`, if it exists (without creating it).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(broker: rockq::Broker) {
    /// assert!(broker.get_kv("nothing-here").is_none());
    /// # }
    /// ```
    pub fn get_kv(&self, name: &str) -> Option<Keyspace> {
        crate::name::validate(NameKind::Keyspace, name).ok()?;
        self.shared.keyspace(name).map(|k| Keyspace::new(self.shared.clone(), k))
    }

    /// Names of all keyspaces, sorted.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(broker: rockq::Broker) -> Result<(), rockq::Error> {
    /// broker.kv("accounts").await?;
    /// assert_eq!(broker.kv_names(), vec!["accounts".to_string()]);
    /// # Ok(()) }
    /// ```
    pub fn kv_names(&self) -> Vec<String> {
        self.shared.keyspaces().iter().map(|k| k.name.to_string()).collect()
    }

    /// A new, empty [`Transaction`]: acks, sends and keyspace writes collected, then applied by
    /// [`Transaction::commit`] as one atomic write.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), rockq::Error> {
    /// # let dir = tempfile::tempdir()?;
    /// let broker = rockq::Broker::open(dir.path()).await?;
    /// let accounts = broker.kv("accounts").await?;
    /// let events = broker.queue("account-events").await?;
    /// // The transactional outbox: the change and its announcement, or neither.
    /// let mut tx = broker.transaction();
    /// tx.put(&accounts, "alice", "opened")?;
    /// tx.send(&events, "alice opened")?;
    /// let done = tx.commit().await?;
    /// assert_eq!(done.sent().len(), 1);
    /// assert_eq!(events.len(), 1);
    /// # broker.shutdown().await?;
    /// # Ok(()) }
    /// ```
    pub fn transaction(&self) -> Transaction {
        Transaction::new(self.shared.clone())
    }
}
