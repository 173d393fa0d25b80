//! [`TaskTx`]: the transaction a worker-pool handler writes into; the pool commits it with the
//! job's ack.

use std::sync::{Arc, Mutex, MutexGuard};

use super::Transaction;
use crate::engine::boundary::Shared;

/// The transaction of one worker-pool job: see [`Task::tx`](crate::Task::tx). What the handler
/// adds here (keyspace writes and conditions, sends) is applied **together with the job's
/// ack**, in one atomic write, when the handler returns `Ok`; if it returns an error, or the
/// commit fails, none of it is applied.
///
/// - A failed condition ([`Error::Conflict`](crate::Error::Conflict): someone wrote first) is
///   not the job's failure: the handler runs again at once, holding the job at the same
///   attempt, and reads afresh ([`PoolReport::conflicts`](crate::PoolReport::conflicts)
///   counts these runs). After 16 in a row (a condition that can never hold) it counts as a
///   failed attempt: retried with the group's backoff, dead-lettered once attempts are used up.
/// - Reads for update ([`get_for_update`](TaskTx::get_for_update)) hold their key in this
///   process until the commit is answered, so the pool's next handler reading the same key
///   waits for this commit instead of conflicting with it.
/// - A lost lease applies nothing: the message is someone else's now.
///
/// Cheap to clone; every clone writes into the same transaction. The pool takes what was
/// written when the handler returns: writes through a clone kept past that point belong to no
/// commit and are dropped.
#[derive(Clone)]
pub struct TaskTx {
    pub(crate) shared: Arc<Shared>,
    pub(crate) tx: Arc<Mutex<Transaction>>,
}

impl std::fmt::Debug for TaskTx {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TaskTx").field("operations", &self.lock().len()).finish()
    }
}

impl TaskTx {
    pub(crate) fn new(shared: Arc<Shared>) -> Self {
        TaskTx { tx: Arc::new(Mutex::new(Transaction::new(shared.clone()))), shared }
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, Transaction> {
        self.tx.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Takes what the handler wrote, leaving an empty transaction.
    pub(crate) fn take(&self) -> Transaction {
        std::mem::replace(&mut *self.lock(), Transaction::new(self.shared.clone()))
    }

    /// How many operations the handler added.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn demo(task: rockq::Task) {
    /// assert_eq!(task.tx().len(), 0);
    /// # }
    /// ```
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether the handler added nothing (the pool then acks as usual).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn demo(task: rockq::Task) {
    /// assert!(task.tx().is_empty());
    /// # }
    /// ```
    pub fn is_empty(&self) -> bool {
        self.lock().is_empty()
    }
}
