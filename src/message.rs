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
    /// Claim priority in work groups (0, the default, is the lowest).
    pub(crate) priority: u8,
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
    /// [`deliver_after`](Message::deliver_after). A time in the past delivers at once; a time
    /// more than 100 years after the send is clamped to the send + 100 years.
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

    /// Sets the message's priority: a work group claims its waiting jobs highest priority
    /// first, and in sequence order within one priority. 0 (the default) is the lowest; 255
    /// the highest. Ordered groups deliver in sequence order whatever the priority, and a work
    /// group [ordered by key](crate::WorkGroup::ordered_by_key) keeps its keys' order over it.
    ///
    /// Meant for the few that must jump the line (a password-reset mail among a newsletter's
    /// hundred thousand): each prioritised message costs an index entry on disk and about 50
    /// bytes of memory while it is retained. Fairness for the lower ones is
    /// [`WorkGroup::priority_share`](crate::WorkGroup::priority_share). On the etcd engine
    /// priorities hold across processes; a send call there holds at most 125 prioritised and
    /// keyed messages together (`Unsupported` beyond).
    ///
    /// # Examples
    ///
    /// ```
    /// let urgent = rockq::Message::new("reset password for ana").priority(9);
    /// assert_eq!(urgent.get_priority(), 9);
    /// assert_eq!(rockq::Message::new("newsletter").get_priority(), 0);
    /// ```
    pub fn priority(mut self, priority: u8) -> Self {
        self.priority = priority;
        self
    }

    /// The priority ([`Message::priority`]); 0 if none was set.
    ///
    /// # Examples
    ///
    /// ```
    /// assert_eq!(rockq::Message::new("x").priority(3).get_priority(), 3);
    /// ```
    pub fn get_priority(&self) -> u8 {
        self.priority
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

/// The accessors every delivered message has — an ordered group's `Delivery`, a work group's
/// `Job` and a handler's `Task` — written once. The type provides `fn raw(&self) ->
/// Option<&RawMessage>` (its message, `None` once given up) and `fn names(&self) -> (&str,
/// &str)` (its queue and group); `$var` and `$ty` name it in the examples.
macro_rules! message_accessors {
    ($var:literal, $ty:literal) => {
        /// The message's sequence in its queue.
        ///
        /// # Examples
        ///
        /// ```no_run
        #[doc = concat!("# fn demo(", $var, ": &rockq::", $ty, ") {")]
        #[doc = concat!("println!(\"{}#{} in {}\", ", $var, ".queue(), ", $var, ".seq(), ", $var, ".group());")]
        /// # }
        /// ```
        pub fn seq(&self) -> u64 {
            self.raw().map_or(0, |m| m.seq)
        }

        /// The payload.
        ///
        /// # Examples
        ///
        /// ```no_run
        #[doc = concat!("# fn demo(", $var, ": &rockq::", $ty, ") {")]
        #[doc = concat!("let text = String::from_utf8_lossy(", $var, ".payload());")]
        /// # }
        /// ```
        pub fn payload(&self) -> &bytes::Bytes {
            static EMPTY: bytes::Bytes = bytes::Bytes::from_static(b"");
            self.raw().map_or(&EMPTY, |m| &m.payload)
        }

        /// The headers, in the order they were added.
        ///
        /// # Examples
        ///
        /// ```no_run
        #[doc = concat!("# fn demo(", $var, ": &rockq::", $ty, ") {")]
        #[doc = concat!("for (name, value) in ", $var, ".headers() {")]
        ///     println!("{name}: {value:?}");
        /// }
        /// # }
        /// ```
        pub fn headers(&self) -> &[(String, bytes::Bytes)] {
            self.raw().map_or(&[][..], |m| m.headers.as_slice())
        }

        /// The ordering key the producer set ([`Message::key`](crate::Message::key)).
        ///
        /// # Examples
        ///
        /// ```no_run
        #[doc = concat!("# fn demo(", $var, ": &rockq::", $ty, ") {")]
        #[doc = concat!("if let Some(account) = ", $var, ".key() {")]
        ///     println!("next step for {account}");
        /// }
        /// # }
        /// ```
        pub fn key(&self) -> Option<&str> {
            self.raw().and_then(|m| m.key.as_deref())
        }

        /// The idempotency key the producer set
        /// ([`Message::idempotency_key`](crate::Message::idempotency_key)).
        ///
        /// # Examples
        ///
        /// ```no_run
        #[doc = concat!("# fn demo(", $var, ": &rockq::", $ty, ") {")]
        #[doc = concat!("let op = ", $var, ".idempotency_key().unwrap_or(\"-\");")]
        /// # }
        /// ```
        pub fn idempotency_key(&self) -> Option<&str> {
            self.raw().and_then(|m| m.idempotency_key.as_deref())
        }

        /// The priority the producer set ([`Message::priority`](crate::Message::priority));
        /// 0 if none.
        ///
        /// # Examples
        ///
        /// ```no_run
        #[doc = concat!("# fn demo(", $var, ": &rockq::", $ty, ") {")]
        #[doc = concat!("if ", $var, ".priority() > 0 { println!(\"urgent\"); }")]
        /// # }
        /// ```
        pub fn priority(&self) -> u8 {
            self.raw().map_or(0, |m| m.priority)
        }

        /// Which step of which flow this message is ([`Flow`](crate::Flow)), from its
        /// [`FLOW_HEADER`](crate::FLOW_HEADER); `None` for a message sent outside a flow.
        ///
        /// # Examples
        ///
        /// ```no_run
        #[doc = concat!("# fn demo(", $var, ": &rockq::", $ty, ") {")]
        #[doc = concat!("if let Some(at) = ", $var, ".flow_step() {")]
        ///     println!("step {} of flow {}", at.step, at.flow);
        /// }
        /// # }
        /// ```
        pub fn flow_step(&self) -> Option<crate::flow_state::FlowStep> {
            self.header(crate::flow_state::FLOW_HEADER).and_then(|v| crate::flow_state::FlowStep::parse(v))
        }

        /// The first header named `key`.
        ///
        /// # Examples
        ///
        /// ```no_run
        #[doc = concat!("# fn demo(", $var, ": &rockq::", $ty, ") {")]
        #[doc = concat!("let trace = ", $var, ".header(\"trace-id\").map(|v| String::from_utf8_lossy(v).into_owned());")]
        /// # }
        /// ```
        pub fn header(&self, key: &str) -> Option<&bytes::Bytes> {
            self.headers().iter().find(|(k, _)| k == key).map(|(_, v)| v)
        }

        /// The producer's OpenTelemetry span context, from the message's
        /// [`traceparent`](crate::otel::TRACEPARENT) and `tracestate` headers (feature `otel`);
        /// `None` if it carries none, or an invalid one.
        ///
        /// # Examples
        ///
        /// ```no_run
        #[doc = concat!("# fn demo(", $var, ": &rockq::", $ty, ") {")]
        #[doc = concat!("if let Some(producer) = ", $var, ".trace_context() {")]
        ///     println!("sent in trace {}", producer.trace_id());
        /// }
        /// # }
        /// ```
        #[cfg(feature = "otel")]
        pub fn trace_context(&self) -> Option<opentelemetry::trace::SpanContext> {
            crate::otel::producer(self.headers())
        }

        /// Makes `span` a child of the producer's span, or links it to it, as `relation` says
        /// (feature `otel`; see [`rockq::otel`](crate::otel)). Call it right after creating
        /// the span: a span's parent is fixed once it is entered. Returns whether the message
        /// carried a valid trace context and `span` is recorded by a subscriber; for
        /// [`Child`](crate::otel::TraceRelation::Child), also that an OpenTelemetry layer took
        /// the parent (`false` if none records `span`, or it had already started).
        ///
        /// # Examples
        ///
        /// ```no_run
        #[doc = concat!("# async fn demo(", $var, ": rockq::", $ty, ") {")]
        /// use tracing::Instrument;
        #[doc = concat!("let span = tracing::info_span!(\"bill\", seq = ", $var, ".seq());")]
        #[doc = concat!($var, ".follow_trace(&span, rockq::otel::TraceRelation::Child);")]
        /// async { /* handle it; its events and spans join the producer's trace */ }
        ///     .instrument(span)
        ///     .await;
        /// # }
        /// ```
        #[cfg(feature = "otel")]
        pub fn follow_trace(&self, span: &tracing::Span, relation: crate::otel::TraceRelation) -> bool {
            crate::otel::follow(span, self.headers(), relation)
        }

        /// Decodes the payload as a `T` with the codec its
        /// [`CODEC_HEADER`](crate::CODEC_HEADER) header names (JSON without one): the
        /// counterpart of a [`TypedQueue`](crate::TypedQueue) send. A pool's
        /// [`run_typed`](crate::Workers::run_typed) does this for its handler.
        ///
        /// # Errors
        ///
        /// [`DecodeError`](crate::DecodeError) if the payload is not a valid `T`, or the codec
        /// is unknown or its feature is off. Nothing is settled: the message is still yours to
        /// ack, retry or dead-letter.
        ///
        /// # Examples
        ///
        /// ```no_run
        #[doc = concat!("# fn demo(", $var, ": &rockq::", $ty, ") -> Result<(), rockq::DecodeError> {")]
        #[doc = concat!("let ids: Vec<u64> = ", $var, ".decode()?;")]
        /// # Ok(()) }
        /// ```
        pub fn decode<T: serde::de::DeserializeOwned>(&self) -> Result<T, crate::codec::DecodeError> {
            let codec = self.header(crate::codec::CODEC_HEADER).map(|b| &b[..]);
            crate::codec::decode_stamped(self.queue(), self.seq(), codec, self.payload())
        }

        /// Decodes the payload as a `T` with `codec`, whatever its header says.
        ///
        /// # Errors
        ///
        /// [`DecodeError`](crate::DecodeError) if the payload is not a valid `T` in that
        /// format.
        ///
        /// # Examples
        ///
        /// ```no_run
        #[doc = concat!("# fn demo(", $var, ": &rockq::", $ty, ") -> Result<(), rockq::DecodeError> {")]
        #[doc = concat!("let ids: Vec<u64> = ", $var, ".decode_with(&rockq::Json)?;")]
        /// # Ok(()) }
        /// ```
        pub fn decode_with<T: serde::de::DeserializeOwned, C: crate::codec::Codec>(
            &self,
            codec: &C,
        ) -> Result<T, crate::codec::DecodeError> {
            crate::codec::decode_with(self.queue(), self.seq(), codec, self.payload())
        }

        /// When the message was sent: the broker's clock at the group commit that wrote it.
        /// Along one queue these times never decrease (except for messages moved by a
        /// redrive, which keep their original time).
        ///
        /// # Examples
        ///
        /// ```no_run
        #[doc = concat!("# fn demo(", $var, ": &rockq::", $ty, ") {")]
        #[doc = concat!("let waited = ", $var, ".enqueued_at().elapsed().unwrap_or_default();")]
        /// println!("picked up after {waited:?}");
        /// # }
        /// ```
        pub fn enqueued_at(&self) -> std::time::SystemTime {
            let micros = self.raw().map_or(0, |m| m.enqueued_at_micros);
            std::time::UNIX_EPOCH + std::time::Duration::from_micros(micros)
        }

        /// The queue this message is from.
        ///
        /// # Examples
        ///
        /// ```no_run
        #[doc = concat!("# fn demo(", $var, ": &rockq::", $ty, ") {")]
        #[doc = concat!("println!(\"{}/{}#{}\", ", $var, ".queue(), ", $var, ".group(), ", $var, ".seq());")]
        /// # }
        /// ```
        pub fn queue(&self) -> &str {
            self.names().0
        }

        /// The group it was handed to.
        ///
        /// # Examples
        ///
        /// ```no_run
        #[doc = concat!("# fn demo(", $var, ": &rockq::", $ty, ") {")]
        #[doc = concat!("println!(\"{}/{}#{}\", ", $var, ".queue(), ", $var, ".group(), ", $var, ".seq());")]
        /// # }
        /// ```
        pub fn group(&self) -> &str {
            self.names().1
        }
    };
}
pub(crate) use message_accessors;
