//! [`Message`]: what a producer sends — a payload plus optional headers, and the job-queue
//! options a send may carry: a delivery time, an idempotency key and an ordering key.

use std::time::{Duration, SystemTime};

use bytes::Bytes;

/// A message to send: an opaque payload and optional headers.
///
/// Most callers pass a payload directly (`Vec<u8>`, `&[u8]`, `&str`, `String`, [`Bytes`]); build a
/// `Message` to attach headers.
///
/// # Examples
///
/// ```
/// use rockq::Message;
///
/// let m = Message::new("charge #42").header("content-type", "text/plain");
/// assert_eq!(m.payload().as_ref(), b"charge #42");
/// assert_eq!(m.headers()[0].0, "content-type");
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Message {
    pub(crate) payload: Bytes,
    pub(crate) headers: Vec<(String, Bytes)>,
    /// Ordering key (stored in the envelope).
    pub(crate) key: Option<String>,
    /// Idempotency key (stored in the envelope and in the queue's dedup index).
    pub(crate) idempotency_key: Option<String>,
    /// When the message becomes visible, if not at once.
    pub(crate) due: Option<Due>,
}

/// When a delayed message becomes visible.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Due {
    /// This long after the send (on the broker's clock).
    After(Duration),
    /// At this wall-clock time (on the broker's clock).
    At(SystemTime),
}

/// The longest ordering or idempotency key, in bytes.
pub const MAX_KEY_LEN: usize = 1024;

impl Message {
    /// A message with this payload and no headers.
    ///
    /// # Examples
    ///
    /// ```
    /// let m = rockq::Message::new("hello");
    /// assert_eq!(m.payload(), "hello");
    /// assert!(m.headers().is_empty());
    /// ```
    pub fn new(payload: impl Into<Bytes>) -> Self {
        Message { payload: payload.into(), ..Message::default() }
    }

    /// Adds a header. Keys need not be unique; order is preserved. A key may be at most
    /// 65 535 bytes and a message at most 65 535 headers.
    ///
    /// # Examples
    ///
    /// ```
    /// let m = rockq::Message::new("{}").header("content-type", "application/json").header("trace-id", "abc");
    /// assert_eq!(m.headers()[0].0, "content-type");
    /// assert_eq!(m.headers().len(), 2);
    /// ```
    pub fn header(mut self, key: impl Into<String>, value: impl Into<Bytes>) -> Self {
        self.headers.push((key.into(), value.into()));
        self
    }

    /// The payload.
    ///
    /// # Examples
    ///
    /// ```
    /// let m = rockq::Message::new(vec![1u8, 2, 3]);
    /// assert_eq!(&m.payload()[..], &[1, 2, 3]);
    /// ```
    pub fn payload(&self) -> &Bytes {
        &self.payload
    }

    /// The headers, in insertion order.
    ///
    /// # Examples
    ///
    /// ```
    /// let m = rockq::Message::new("x").header("a", "1").header("a", "2");
    /// let values: Vec<_> = m.headers().iter().map(|(_, v)| v.clone()).collect();
    /// assert_eq!(values, ["1", "2"]); // duplicates kept, in order
    /// ```
    pub fn headers(&self) -> &[(String, Bytes)] {
        &self.headers
    }

    /// Delays the message: it becomes visible to every group `delay` after the send, on the
    /// broker's [`Clock`](crate::Clock). There is no upper bound (delays are clamped to 100
    /// years). Until then it waits in the broker's schedule, where it can be cancelled or
    /// rescheduled ([`Queue::cancel`](crate::Queue::cancel),
    /// [`Queue::reschedule`](crate::Queue::reschedule)); when it falls due it is appended to
    /// the queue and gets its sequence then, so sequences stay dense and in order of
    /// visibility. Send delayed messages with [`Queue::submit`](crate::Queue::submit), which
    /// returns their schedule id.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// let reminder = rockq::Message::new("renew").deliver_after(Duration::from_secs(3600));
    /// # drop(reminder);
    /// ```
    pub fn deliver_after(mut self, delay: Duration) -> Self {
        self.due = Some(Due::After(crate::clock::clamp_delay(delay)));
        self
    }

    /// Delays the message until wall-clock time `at` (on the broker's clock); see
    /// [`deliver_after`](Message::deliver_after). A time in the past delivers at once.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::{Duration, SystemTime};
    /// let tomorrow = SystemTime::now() + Duration::from_secs(24 * 3600);
    /// let m = rockq::Message::new("renew").deliver_at(tomorrow);
    /// assert!(m.is_delayed());
    /// ```
    pub fn deliver_at(mut self, at: SystemTime) -> Self {
        self.due = Some(Due::At(at));
        self
    }

    /// Sets an idempotency key: within the queue's dedup window
    /// ([`Queue::set_dedup_window`](crate::Queue::set_dedup_window), 5 minutes unless set), a
    /// second message with the same key is not written, and
    /// [`Queue::submit`](crate::Queue::submit) reports it as
    /// [`Sent::Duplicate`](crate::Sent::Duplicate) with the original's sequence. Non-empty, at
    /// most [`MAX_KEY_LEN`] bytes. The window runs from the original's *send*, also for a
    /// delayed original: give a key that must outlive a long delay a window longer than it.
    ///
    /// # Examples
    ///
    /// ```
    /// let m = rockq::Message::new("charge").idempotency_key("order-42/charge");
    /// assert_eq!(m.get_idempotency_key(), Some("order-42/charge"));
    /// ```
    pub fn idempotency_key(mut self, key: impl Into<String>) -> Self {
        self.idempotency_key = Some(key.into());
        self
    }

    /// Sets an ordering key, stored with the message. A work-queue group with
    /// [`ordered_by_key`](crate::WorkGroup::ordered_by_key) hands out messages with the same key
    /// one at a time, in sequence order; every group sees the key as
    /// [`Delivery::key`](crate::Delivery::key) / [`Job::key`](crate::Job::key), and a redrive
    /// keeps it. Non-empty, at most [`MAX_KEY_LEN`] bytes.
    ///
    /// # Examples
    ///
    /// ```
    /// let m = rockq::Message::new("debit 10").key("account-7");
    /// assert_eq!(m.get_key(), Some("account-7"));
    /// ```
    pub fn key(mut self, key: impl Into<String>) -> Self {
        self.key = Some(key.into());
        self
    }

    /// The ordering key, if set.
    ///
    /// # Examples
    ///
    /// ```
    /// assert_eq!(rockq::Message::new("x").key("account-7").get_key(), Some("account-7"));
    /// assert_eq!(rockq::Message::new("x").get_key(), None);
    /// ```
    pub fn get_key(&self) -> Option<&str> {
        self.key.as_deref()
    }

    /// The idempotency key, if set.
    ///
    /// # Examples
    ///
    /// ```
    /// let m = rockq::Message::new("charge").idempotency_key("order-42/charge");
    /// assert_eq!(m.get_idempotency_key(), Some("order-42/charge"));
    /// ```
    pub fn get_idempotency_key(&self) -> Option<&str> {
        self.idempotency_key.as_deref()
    }

    /// Whether the message is delayed.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// assert!(!rockq::Message::new("now").is_delayed());
    /// assert!(rockq::Message::new("later").deliver_after(Duration::from_secs(60)).is_delayed());
    /// ```
    pub fn is_delayed(&self) -> bool {
        self.due.is_some()
    }
}

impl From<Bytes> for Message {
    fn from(payload: Bytes) -> Self {
        Message::new(payload)
    }
}

impl From<Vec<u8>> for Message {
    fn from(payload: Vec<u8>) -> Self {
        Message::new(payload)
    }
}

impl From<&[u8]> for Message {
    fn from(payload: &[u8]) -> Self {
        Message::new(Bytes::copy_from_slice(payload))
    }
}

impl<const N: usize> From<&[u8; N]> for Message {
    fn from(payload: &[u8; N]) -> Self {
        Message::new(Bytes::copy_from_slice(payload))
    }
}

impl From<String> for Message {
    fn from(payload: String) -> Self {
        Message::new(payload)
    }
}

impl From<&str> for Message {
    fn from(payload: &str) -> Self {
        Message::new(Bytes::copy_from_slice(payload.as_bytes()))
    }
}
