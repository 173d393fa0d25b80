//! Work-queue jobs in a [`Transaction`]: `ack_job`, what the transaction needs of a [`Job`],
//! and a [`Task`]'s transaction ([`Task::tx`]).

use std::sync::Arc;

use super::{Job, Task};
use crate::engine::boundary::TxJob;
use crate::error::Error;
use crate::txn::task::TaskTx;
use crate::txn::{HeldJob, Transaction};

impl Transaction {
    /// Acknowledges a work-queue job when the transaction commits; its lease is checked then.
    /// If the transaction fails (or is dropped), the job is released as if dropped (its
    /// attempt counts). An ack is an operation: [`commit`](Transaction::commit) refuses a
    /// transaction of more than [`MAX_TX_OPS`](crate::MAX_TX_OPS).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(broker: rockq::Broker, job: rockq::Job, results: rockq::Keyspace) -> Result<(), rockq::Error> {
    /// let mut tx = broker.transaction();
    /// tx.put(&results, job.seq().to_be_bytes(), "done")?;
    /// tx.ack_job(job);
    /// tx.commit().await?;
    /// # Ok(()) }
    /// ```
    pub fn ack_job(&mut self, job: Job) -> &mut Self {
        self.foreign |= !Arc::ptr_eq(job.shared(), &self.shared);
        self.jobs.push(Box::new(job));
        self
    }
}

impl HeldJob for Job {
    fn begin_tx(&self) -> Result<TxJob, Error> {
        Job::begin_tx(self)
    }

    fn end_tx(&self) {
        Job::end_tx(self)
    }

    fn committed(self: Box<Self>) {
        Job::tx_committed(*self)
    }

    fn uncount(&self) {
        self.inner().uncounted.store(true, std::sync::atomic::Ordering::Release);
    }
}

impl Task {
    /// This job's transaction: keyspace writes, conditions and sends added here are applied
    /// **atomically with the job's ack** when the handler returns `Ok` (see [`TaskTx`]). Only a
    /// worker pool commits it; with a [`Job`] of your own, use a
    /// [`Transaction`] and [`ack_job`](Transaction::ack_job).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(broker: rockq::Broker) -> Result<(), rockq::Error> {
    /// let orders = broker.queue("orders").await?;
    /// let invoices = broker.queue("invoices").await?;
    /// let balances = broker.kv("balances").await?;
    /// orders
    ///     .work_group("billing")?
    ///     .workers(4)
    ///     .run(move |task: rockq::Task| {
    ///         let (invoices, balances) = (invoices.clone(), balances.clone());
    ///         async move {
    ///             let tx = task.tx();
    ///             let account = task.key().unwrap_or("unknown").to_owned();
    ///             let balance = tx.get_for_update(&balances, &account).await?;
    ///             let n: i64 = balance.map_or(0, |e| String::from_utf8_lossy(&e.value).parse().unwrap_or(0));
    ///             tx.put(&balances, &account, (n + 1).to_string())?;
    ///             tx.send(&invoices, task.payload().clone())?;
    ///             Ok::<_, rockq::HandlerError>(())
    ///         }
    ///     })
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub fn tx(&self) -> TaskTx {
        let inner = self.inner();
        inner.tx.get_or_init(|| TaskTx::new(inner.shared.clone())).clone()
    }
}
