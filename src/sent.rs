//! [`Sent`]: what became of one submitted message — appended, scheduled, or a duplicate.

use std::time::SystemTime;

/// What [`Queue::submit`](crate::Queue::submit) did with a message, once durable.
///
/// # Examples
///
/// ```no_run
/// # async fn demo(queue: rockq::Queue) -> Result<(), rockq::Error> {
/// use rockq::{Message, Sent};
/// match queue.submit(Message::new("charge").idempotency_key("order-42")).await? {
///     Sent::Appended(seq) => println!("new message {seq}"),
///     Sent::Duplicate(original) => println!("already sent: {original:?}"),
///     Sent::Scheduled(s) => println!("due at {:?}", s.due),
///     _ => {}
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Sent {
    /// Appended now with this sequence.
    Appended(u64),
    /// Delayed: waits in the schedule until it is due, then is appended and gets its sequence.
    Scheduled(ScheduledMessage),
    /// A message with the same idempotency key was sent within the queue's dedup window:
    /// nothing was written. Carries what became of the original.
    Duplicate(Original),
}

impl Sent {
    /// The sequence, if the message (or, for a duplicate, its original) was appended.
    ///
    /// # Examples
    ///
    /// ```
    /// use rockq::{Original, Sent};
    /// assert_eq!(Sent::Appended(7).seq(), Some(7));
    /// assert_eq!(Sent::Duplicate(Original::Appended(7)).seq(), Some(7));
    /// assert_eq!(Sent::Duplicate(Original::Scheduled(3)).seq(), None); // still waiting
    /// ```
    pub fn seq(&self) -> Option<u64> {
        match self {
            Sent::Appended(s) | Sent::Duplicate(Original::Appended(s)) => Some(*s),
            _ => None,
        }
    }

    /// Whether nothing was written because the message was a duplicate.
    ///
    /// # Examples
    ///
    /// ```
    /// use rockq::{Original, Sent};
    /// assert!(Sent::Duplicate(Original::Appended(7)).is_duplicate());
    /// assert!(!Sent::Appended(8).is_duplicate());
    /// ```
    pub fn is_duplicate(&self) -> bool {
        matches!(self, Sent::Duplicate(_))
    }
}

/// What became of the original of a duplicate, as recorded when it was sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Original {
    /// It was appended with this sequence.
    Appended(u64),
    /// It was scheduled with this id (it may have been delivered or cancelled since).
    Scheduled(u64),
}

/// A delayed message waiting in the schedule: its id (for
/// [`Queue::cancel`](crate::Queue::cancel) and [`Queue::reschedule`](crate::Queue::reschedule))
/// and when it is due.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScheduledMessage {
    /// Its schedule id, unique within the broker for its lifetime (never reused).
    pub id: u64,
    /// When it becomes visible, on the broker's clock.
    pub due: SystemTime,
}
