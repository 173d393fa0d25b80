//! [`Event`]: the lifecycle of messages (work-queue outcomes, ordered dead letters, retention),
//! broadcast for tests and monitoring.

use std::sync::Arc;
use std::time::Duration;

/// Something that happened to a message of a work-queue group (or, for `DeadLettered` and
/// `Skipped`, of an ordered group too). Subscribe with [`Broker::events`](crate::Broker::events).
///
/// Outcome events (`Acked`, `Retried`, `DeadLettered`, `Redriven`) are sent once the outcome is
/// durable. The channel is bounded: a receiver that falls behind loses the oldest events
/// (`RecvError::Lagged`), and rockq never waits for receivers.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Event {
    /// A message was claimed and handed to a consumer.
    Delivered {
        /// The queue.
        queue: Arc<str>,
        /// The group.
        group: Arc<str>,
        /// The message's sequence.
        seq: u64,
        /// Attempt number, from 1.
        attempt: u32,
    },
    /// A consumer acknowledged a message.
    Acked {
        /// The queue.
        queue: Arc<str>,
        /// The group.
        group: Arc<str>,
        /// The message's sequence.
        seq: u64,
        /// The attempt that succeeded.
        attempt: u32,
    },
    /// An attempt failed and the message will be delivered again after `delay`.
    Retried {
        /// The queue.
        queue: Arc<str>,
        /// The group.
        group: Arc<str>,
        /// The message's sequence.
        seq: u64,
        /// The attempt that failed.
        attempt: u32,
        /// Time until the next attempt.
        delay: Duration,
        /// The error the consumer gave.
        error: String,
    },
    /// A holder's lease ran out before it settled the message; it is being delivered again.
    LeaseExpired {
        /// The queue.
        queue: Arc<str>,
        /// The group.
        group: Arc<str>,
        /// The message's sequence.
        seq: u64,
        /// The attempt whose lease expired.
        attempt: u32,
    },
    /// A message was moved to the dead-letter queue, by a work-queue group or by an ordered
    /// group's [`max_deliveries`](crate::Group::max_deliveries).
    DeadLettered {
        /// The queue.
        queue: Arc<str>,
        /// The group that gave up on it (work-queue or ordered).
        group: Arc<str>,
        /// The message's sequence.
        seq: u64,
        /// Attempts made (ordered groups: deliveries).
        attempts: u32,
        /// Why.
        reason: String,
        /// The dead-letter queue.
        dlq: Arc<str>,
        /// Its sequence there.
        dlq_seq: u64,
    },
    /// A dead letter was moved back to a queue.
    Redriven {
        /// The dead-letter queue.
        dlq: Arc<str>,
        /// Its sequence there.
        dlq_seq: u64,
        /// The queue it went to.
        queue: Arc<str>,
        /// Its new sequence there.
        seq: u64,
    },
    /// Retention deleted messages `from..=to` before this group received them; it continues at
    /// `to + 1`.
    Skipped {
        /// The queue.
        queue: Arc<str>,
        /// The group.
        group: Arc<str>,
        /// First skipped sequence.
        from: u64,
        /// Last skipped sequence.
        to: u64,
    },
    /// Retention deleted a queue's messages up to `first_seq - 1`.
    Trimmed {
        /// The queue.
        queue: Arc<str>,
        /// Messages deleted.
        deleted: u64,
        /// The new first live sequence.
        first_seq: u64,
    },
    /// A subscription waited longer than its saturation threshold for in-flight room.
    Saturated {
        /// The queue.
        queue: Arc<str>,
        /// The group.
        group: Arc<str>,
        /// The in-flight bound that was hit.
        max_in_flight: usize,
    },
    /// A subscription or worker pool of `group` could not reach the store (on etcd: no member
    /// answered within the request timeout) and waits `retry_in` before it tries again; or
    /// acks of `group` could not be written and are kept for the writer's next try. Nothing
    /// ends: jobs keep their leases' fencing, and everything resumes by itself once the store
    /// answers. One event per failed try.
    StoreUnavailable {
        /// The queue.
        queue: Arc<str>,
        /// The group.
        group: Arc<str>,
        /// What the store answered (or that it did not).
        error: String,
        /// How long it waits before trying again.
        retry_in: Duration,
    },
    /// A recurring schedule fired: one event per appended message (each on-time firing has its
    /// own; a catch-up message stands for several late ones), or one with `seq: None` when late
    /// firings were only dropped ([`Missed::Skip`](crate::Missed::Skip)).
    ScheduleFired {
        /// The schedule.
        schedule: Arc<str>,
        /// The queue it sends to.
        queue: Arc<str>,
        /// The appended message's sequence (`None`: late firings were skipped).
        seq: Option<u64>,
        /// Late firings this event accounts for beyond its message's own: folded into a
        /// catch-up message, or skipped (0 for an on-time firing).
        missed: u64,
    },
}

impl Event {
    /// The queue the event is about (for `Redriven`, the queue the message moved to).
    ///
    /// # Examples
    ///
    /// ```
    /// let e = rockq::Event::Trimmed { queue: "orders".into(), deleted: 9, first_seq: 10 };
    /// assert_eq!(e.queue(), "orders");
    /// assert_eq!(e.group(), None);
    /// ```
    pub fn queue(&self) -> &str {
        match self {
            Event::Delivered { queue, .. }
            | Event::Acked { queue, .. }
            | Event::Retried { queue, .. }
            | Event::LeaseExpired { queue, .. }
            | Event::DeadLettered { queue, .. }
            | Event::Redriven { queue, .. }
            | Event::Skipped { queue, .. }
            | Event::Trimmed { queue, .. }
            | Event::Saturated { queue, .. }
            | Event::StoreUnavailable { queue, .. }
            | Event::ScheduleFired { queue, .. } => queue,
        }
    }

    /// The group the event is about, if it is about one.
    ///
    /// # Examples
    ///
    /// ```
    /// let acked = rockq::Event::Acked { queue: "orders".into(), group: "billing".into(), seq: 7, attempt: 1 };
    /// assert_eq!(acked.group(), Some("billing"));
    /// let trimmed = rockq::Event::Trimmed { queue: "orders".into(), deleted: 9, first_seq: 10 };
    /// assert_eq!(trimmed.group(), None);
    /// ```
    pub fn group(&self) -> Option<&str> {
        match self {
            Event::Delivered { group, .. }
            | Event::Acked { group, .. }
            | Event::Retried { group, .. }
            | Event::LeaseExpired { group, .. }
            | Event::DeadLettered { group, .. }
            | Event::Skipped { group, .. }
            | Event::Saturated { group, .. }
            | Event::StoreUnavailable { group, .. } => Some(group),
            Event::Redriven { .. } | Event::Trimmed { .. } | Event::ScheduleFired { .. } => None,
        }
    }
}
