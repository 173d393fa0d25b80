//! [`Transaction`]: acks, sends and keyspace writes applied as one atomic write.
//!
//! This module is the core every concept adds its operations to, so that it imports none of
//! them (they all import it: the worker pool commits transactions, keyspace writes are
//! transactions): the type, the commit, and [`TaskTx`] (a pool handler's transaction). The
//! operations live with their concept, as inherent methods:
//!
//! - `kv/txn.rs`: `put`, `put_if`, `delete`, `delete_if`, `expect`, `get_for_update`;
//! - `producer/txn.rs`: `send`;
//! - `consumer/txn.rs`: `ack` (an ordered delivery);
//! - `work/txn.rs`: `ack_job` (a work-queue job).

pub(crate) mod task;

use std::sync::Arc;

use bytes::Bytes;

use tokio::sync::oneshot;

use crate::engine::boundary::{
    KeyLock, KvWrite, Request, Shared, TxApplied, TxDelivery, TxJob, TxRequest, TxSend,
};
use crate::entry::{MAX_TX_BYTES, MAX_TX_OPS};
use crate::error::Error;
use crate::sent::Sent;

/// A work-queue job held by a transaction (implemented by `Job`, in `work/`).
pub(crate) trait HeldJob: Send + Sync {
    /// Fences its lease now and moves it to settling.
    fn begin_tx(&self) -> Result<TxJob, Error>;
    /// Undoes `begin_tx` (the transaction never reached the writer).
    fn end_tx(&self);
    /// The transaction was applied: the job is settled.
    fn committed(self: Box<Self>);
    /// The transaction conflicted: released as it drops, its attempt is given back.
    fn uncount(&self);
}

/// An ordered delivery held by a transaction (implemented by `Delivery`, in `consumer/`).
pub(crate) trait HeldDelivery: Send + Sync {
    /// Why it cannot be acked now, if it cannot.
    fn tx_refusal(&self) -> Option<Error>;
    /// Hands it to the writer (dropping it no longer hands it back).
    fn into_tx(self: Box<Self>) -> Option<TxDelivery>;
}

/// Acks of ordered deliveries and work-queue jobs, sends to any queues and writes to keyspaces,
/// collected and then applied by [`commit`](Transaction::commit) as **one** write batch of the
/// broker's writer: all of it, or none of it.
///
/// - **Acks** are fenced: a job whose lease was lost (expired, claimed again, purged, reset)
///   or a delivery whose group moved past it fails the whole transaction
///   ([`Error::LeaseLost`]) and nothing is applied.
/// - **Sends** take any [`Message`](crate::Message): keys, headers, delays and idempotency keys work as in
///   [`Queue::submit`](crate::Queue::submit) (a duplicate is reported as
///   [`Sent::Duplicate`] and writes nothing).
/// - **Keyspace writes** may carry a condition ([`Expect`](crate::Expect)), checked against the state
///   before the transaction when the writer applies it; one that does not hold fails the
///   transaction with [`Error::Conflict`] and nothing is applied.
///   [`get_for_update`](Transaction::get_for_update) reads a key and adds the condition
///   that it is unchanged.
///
/// The commit resolves once the batch is durable in the broker's
/// [`Durability`](crate::Durability) sense. **Dropping a transaction without committing
/// applies nothing**: its jobs are released and its deliveries handed back, as if dropped.
/// A transaction that fails does the same.
///
/// # Examples
///
/// Consume, update state and produce, exactly once:
///
/// ```no_run
/// # async fn demo(broker: rockq::Broker) -> Result<(), rockq::Error> {
/// use futures::StreamExt;
/// let orders = broker.queue("orders").await?;
/// let invoices = broker.queue("invoices").await?;
/// let totals = broker.kv("totals").await?;
/// let mut jobs = orders.work_group("billing")?.subscribe().await?;
/// while let Some(job) = jobs.next().await {
///     let job = job?;
///     let customer = job.key().unwrap_or("anonymous").to_owned();
///     let mut tx = broker.transaction();
///     let total = tx.get_for_update(&totals, &customer).await?;
///     let sum: u64 = total.map_or(0, |e| String::from_utf8_lossy(&e.value).parse().unwrap_or(0)) + 1;
///     tx.put(&totals, &customer, sum.to_string())?;
///     tx.send(&invoices, format!("invoice for {customer}"))?;
///     tx.ack_job(job);
///     tx.commit().await?; // the ack, the total and the invoice: all or nothing
/// }
/// # Ok(()) }
/// ```
#[must_use = "a transaction does nothing unless committed"]
pub struct Transaction {
    pub(crate) shared: Arc<Shared>,
    pub(crate) writes: Vec<KvWrite>,
    pub(crate) sends: Vec<TxSend>,
    pub(crate) jobs: Vec<Box<dyn HeldJob>>,
    pub(crate) deliveries: Vec<Box<dyn HeldDelivery>>,
    /// Something of another broker was added: refused at commit.
    pub(crate) foreign: bool,
    /// Bytes of keys, values and messages added (see [`MAX_TX_BYTES`]).
    pub(crate) bytes: usize,
    /// Keys read for update, held in this process until the transaction is answered (see
    /// `engine/registry/key_locks.rs`), by keyspace id.
    pub(crate) held: std::collections::HashMap<(u32, Bytes), KeyLock>,
}

impl std::fmt::Debug for Transaction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Transaction")
            .field("writes", &self.writes.len())
            .field("sends", &self.sends.len())
            .field("jobs", &self.jobs.len())
            .field("deliveries", &self.deliveries.len())
            .finish()
    }
}

/// What a committed [`Transaction`] did.
#[derive(Debug, Clone)]
pub struct Committed {
    revision: Option<u64>,
    sent: Vec<Sent>,
}

impl Committed {
    /// The revision the transaction's keyspace writes were stored under (`None`: it wrote no
    /// key). Every entry it wrote now has this [`Entry::revision`](crate::Entry::revision).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(tx: rockq::Transaction) -> Result<(), rockq::Error> {
    /// let done = tx.commit().await?;
    /// println!("stored at revision {:?}", done.revision());
    /// # Ok(()) }
    /// ```
    pub fn revision(&self) -> Option<u64> {
        self.revision
    }

    /// What became of each send, in the order they were added.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(tx: rockq::Transaction) -> Result<(), rockq::Error> {
    /// for sent in tx.commit().await?.sent() {
    ///     println!("{sent:?}");
    /// }
    /// # Ok(()) }
    /// ```
    pub fn sent(&self) -> &[Sent] {
        &self.sent
    }
}

impl Transaction {
    pub(crate) fn new(shared: Arc<Shared>) -> Self {
        Transaction {
            shared,
            writes: Vec::new(),
            sends: Vec::new(),
            jobs: Vec::new(),
            deliveries: Vec::new(),
            foreign: false,
            bytes: 0,
            held: Default::default(),
        }
    }

    /// How many operations it holds (acks, sends, writes and conditions).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn demo(broker: rockq::Broker) {
    /// assert_eq!(broker.transaction().len(), 0);
    /// # }
    /// ```
    pub fn len(&self) -> usize {
        self.writes.len() + self.sends.len() + self.jobs.len() + self.deliveries.len()
    }

    /// Whether it holds nothing (committing it writes nothing).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn demo(broker: rockq::Broker) {
    /// assert!(broker.transaction().is_empty());
    /// # }
    /// ```
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Refuses one more operation past [`MAX_TX_OPS`].
    pub(crate) fn room(&self) -> Result<(), Error> {
        if self.len() >= MAX_TX_OPS {
            return Err(Error::Invalid { reason: format!("more than {MAX_TX_OPS} operations") });
        }
        Ok(())
    }

    /// Counts `bytes` more keys, values and messages, refusing to pass [`MAX_TX_BYTES`]: a
    /// transaction is one write batch, held whole in memory on the writer thread.
    pub(crate) fn take_bytes(&mut self, bytes: usize) -> Result<(), Error> {
        let total = self.bytes.saturating_add(bytes);
        if total > MAX_TX_BYTES {
            return Err(Error::Invalid {
                reason: format!("more than {MAX_TX_BYTES} bytes of keys, values and messages"),
            });
        }
        self.bytes = total;
        Ok(())
    }

    /// Applies everything as one atomic write; resolves once it is durable.
    ///
    /// # Errors
    ///
    /// [`Error::Conflict`] (a condition did not hold: its jobs are released without counting
    /// the attempt, its ordered deliveries come back after a short pause without counting the
    /// delivery), [`Error::LeaseLost`] (a job's lease
    /// or a delivery was lost), [`Error::GroupDeleted`], [`Error::QueueDeleted`],
    /// [`Error::Invalid`] (something of another broker, or more than
    /// [`MAX_TX_OPS`] operations counting the acks), [`Error::Shutdown`],
    /// [`Error::Storage`], [`Error::Failed`], [`Error::Corrupt`]. In every case nothing
    /// was applied; jobs are released and deliveries handed back — with one exception on the
    /// etcd engine: an [`Error::Storage`] after etcd stopped answering mid-commit (its
    /// message says "nothing of the transaction was applied" when that is known) may leave
    /// the transaction applied, as a send's may; read what it wrote to learn which.
    /// [`Error::Unsupported`] on etcd for what it does not carry out in a transaction.
    ///
    /// # Cancel safety
    ///
    /// If the future is dropped after the transaction reached the writer, it is applied or
    /// refused all the same; the caller cannot learn which except by reading what it wrote. Its
    /// jobs' leases then simply run out if it was refused.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(broker: rockq::Broker, accounts: rockq::Keyspace, events: rockq::Queue) -> Result<(), rockq::Error> {
    /// // The transactional outbox: the state change and its announcement, together.
    /// let mut tx = broker.transaction();
    /// tx.put(&accounts, "alice", "closed")?;
    /// tx.send(&events, r#"{"account":"alice","event":"closed"}"#)?;
    /// tx.commit().await?;
    /// # Ok(()) }
    /// ```
    pub async fn commit(mut self) -> Result<Committed, Error> {
        let jobs = std::mem::take(&mut self.jobs);
        if self.shared.is_closed() {
            return Err(Error::Shutdown);
        }
        if let Some(e) = self.deliveries.iter().find_map(|d| d.tx_refusal()) {
            return Err(e);
        }
        // Fenced once the writer's queue has room for the transaction, in order; the first lost
        // lease undoes the ones before it. Jobs dropped on an error are released, their
        // attempts counted.
        let fence = || {
            let mut fenced = Vec::with_capacity(jobs.len());
            for (i, job) in jobs.iter().enumerate() {
                match job.begin_tx() {
                    Ok(t) => fenced.push(t),
                    Err(e) => {
                        jobs[..i].iter().for_each(|j| j.end_tx());
                        return Err(e);
                    }
                }
            }
            Ok(fenced)
        };
        match self.apply(jobs.len(), fence).await {
            Ok(done) => {
                jobs.into_iter().for_each(HeldJob::committed);
                Ok(done)
            }
            // Refused or failed: the jobs are leased to this holder again (or never left it),
            // and are released as they drop here. A conflict is no failed attempt (someone
            // wrote first): they are released uncounted, as deliveries are handed back.
            Err(e) => {
                if e.is_conflict() {
                    jobs.iter().for_each(|j| j.uncount());
                }
                Err(e)
            }
        }
    }

    /// Hands the transaction to the writer, with the jobs `fence` fences (the caller's), and
    /// waits for its answer. A slot in the writer's queue is reserved first, so that nothing
    /// is fenced or handed over by a future that could still be dropped before the send:
    /// from `fence` on, the request reaches the writer, which applies it or hands everything
    /// back (jobs leased to their holder again, deliveries to their subscriptions).
    /// `held` is how many jobs `fence` fences (they are not in `self`, but count as acks).
    pub(crate) async fn apply(
        mut self,
        held: usize,
        fence: impl FnOnce() -> Result<Vec<TxJob>, Error>,
    ) -> Result<Committed, Error> {
        // Deliveries dropped with `self` go back to their subscriptions.
        if self.foreign {
            return Err(Error::Invalid { reason: "it holds something of another broker".into() });
        }
        // Writes, sends and conditions are refused one by one as they are added (`room`); acks
        // cannot be (they return `&mut Self`), so the total is checked here.
        let ops = self.len() + held;
        if ops > MAX_TX_OPS {
            let reason = format!("it holds {ops} operations, more than {MAX_TX_OPS}");
            return Err(Error::Invalid { reason });
        }
        let permit = self.shared.tx.reserve().await.map_err(|_| Error::Shutdown)?;
        let fenced = fence()?;
        let deliveries: Vec<TxDelivery> =
            std::mem::take(&mut self.deliveries).into_iter().filter_map(|d| d.into_tx()).collect();
        let (reply, rx) = oneshot::channel();
        permit.send(Request::Tx(TxRequest {
            writes: std::mem::take(&mut self.writes),
            sends: std::mem::take(&mut self.sends),
            jobs: fenced,
            deliveries,
            reply,
        }));
        match rx.await {
            Ok(Ok(TxApplied { revision, sent })) => Ok(Committed { revision, sent }),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(Error::Shutdown),
        }
    }
}
