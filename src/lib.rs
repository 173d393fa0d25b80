//! # rockq
//!
//! Embedded, Tokio-native durable queues and consumer groups on RocksDB: the queue you reach for
//! instead of standing up Redis Streams, SQS or Kafka for work inside one service.
//!
//! - **Producers** append to named [`Queue`]s. Every send goes through one writer thread that
//!   group-commits: many sends, one `WriteBatch`, one WAL sync. Sequences are dense and
//!   monotonic per queue.
//! - **Consumer groups** ([`Group`]) receive a [`Subscription`], a
//!   `futures::Stream<Item = Result<Delivery, Error>>` in sequence order that wakes on new
//!   writes without polling.
//! - **At-least-once**: a group's offset is committed only over a contiguous run of
//!   acknowledged deliveries, so a crash or a dropped delivery causes redelivery, never loss.
//!   A delivery can be redelivered later with [`Delivery::nack_after`], and a poison message
//!   moved to a dead-letter queue after [`Group::max_deliveries`].
//! - **Work-queue groups** ([`WorkGroup`]) give competing consumers [`Job`]s under leases, with
//!   fencing, retries with backoff ([`RetryPolicy`]), dead-letter queues ([`DeadLetters`]) and
//!   worker pools ([`Workers`]); attempt counts are written before a job is handed out, so they
//!   survive crashes. Lifecycle [`Event`]s are broadcast by [`Broker::events`].
//! - **Durability** is chosen at open; see [`Durability`] for exactly what survives a process
//!   crash and a power loss.
//!
//! ```no_run
//! # async fn demo() -> Result<(), rockq::Error> {
//! use futures::StreamExt;
//!
//! let broker = rockq::Broker::open("./data").await?;
//! let orders = broker.queue("orders").await?;
//! orders.send("order #1").await?;
//!
//! let mut billing = orders.group("billing")?.subscribe().await?;
//! while let Some(delivery) = billing.next().await {
//!     let delivery = delivery?;
//!     println!("{} {:?}", delivery.seq(), delivery.payload());
//!     delivery.ack()?;
//!     # break;
//! }
//! broker.shutdown().await?;
//! # Ok(()) }
//! ```
//!
//! See `docs/ARCHITECTURE.md` for the layers, the key layout and what each task owns.

#![forbid(unsafe_code)]
#![deny(missing_docs, missing_debug_implementations)]
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used, clippy::panic))]

// Layers, top down; each imports only from the layers below it (`tests/layers.rs` checks it):
// the handles (`broker`, `producer`, `consumer`, `work`, `inspector`), the engine (`engine`,
// reached only through `engine::boundary`), the store (`store`, the only user of RocksDB), and
// plain value types (the rest).
mod broker;
mod consumer;
mod inspector;
mod producer;
mod work;

mod engine;

mod store;

mod clock;
mod error;
mod events;
mod faults;
mod message;
mod model;
mod name;
mod options;
mod retention;
mod stats;
pub mod telemetry;

pub use broker::Broker;
pub use bytes::Bytes;
pub use clock::{Clock, ManualClock};
pub use consumer::{Delivery, Group, Subscription};
pub use error::{
    AckError, CommitError, CorruptionError, Error, InspectError, NameError, NameKind, OpenError, PauseError,
    QueueError, ReceiveError, RedriveError, ResetError, SendError, ShutdownError, StorageError,
    SubscribeError,
};
pub use events::Event;
pub use inspector::Inspector;
pub use message::Message;
pub use model::StartFrom;
pub use name::MAX_NAME_LEN;
pub use options::{Durability, Options};
pub use producer::{Queue, SendReceipt};
pub use retention::{ResetTo, Retention, TrimReport};
pub use stats::{
    GroupMode, GroupStats, PendingClaim, PendingState, QueueStats, Stats, StorageStats, StoredMessage,
    WriterStats,
};
pub use tokio_util::sync::CancellationToken;
pub use work::{
    DeadLetter, DeadLetters, Handler, HandlerError, Job, PoolHandle, PoolReport, Redrive, RetryPolicy, Task,
    WorkGroup, WorkSubscription, Workers,
};

/// Entry points for the cargo-fuzz targets in `fuzz/` (compiled only under `cargo fuzz`).
///
/// Each takes arbitrary bytes as a stored key or value. A decode error is fine; a panic, or a
/// value that decodes but does not survive re-encoding, is a bug. The round trips check the
/// other direction too: whatever decodes is a message or record the encoders can produce, so
/// `encode` then `decode` gives back everything the decoders accept.
#[cfg(fuzzing)]
#[doc(hidden)]
pub mod fuzzing {
    use crate::store::{envelope, keys, records};

    /// A stored message envelope, through both decoders of the read path.
    pub fn envelope(b: &[u8]) {
        let copied = envelope::decode(b"k", b);
        // The read path slices a batch's values out of one buffer: it must agree with the copy.
        let shared = envelope::decode_shared(b"k", &bytes::Bytes::copy_from_slice(b));
        let timestamp = envelope::enqueued_micros(b);
        let env = match (copied, shared) {
            (Ok(a), Ok(c)) => {
                assert_eq!(a, c, "shared and copying decoders disagree");
                a
            }
            (Err(_), Err(_)) => return,
            (a, c) => panic!("copying decoder gave {a:?}, shared one {c:?}"),
        };
        assert_eq!(timestamp, Some(env.enqueued_at_micros), "enqueued_micros disagrees with decode");
        let msg = crate::Message { payload: env.payload.clone(), headers: env.headers.clone() };
        let enc = envelope::encode(&msg, env.enqueued_at_micros).expect("a decoded envelope re-encodes");
        assert_eq!(enc.len(), envelope::encoded_len(&msg));
        assert_eq!(envelope::decode(b"k", &enc).expect("a re-encoded envelope decodes"), env);
    }

    /// The records rockq reads at open and while claiming: each decoder on the same bytes.
    pub fn records(b: &[u8]) {
        if let Ok(c) = records::ClaimRecord::decode(b"k", b) {
            // Encoding cuts the error text to its cap (an over-long one only comes from disk).
            let capped = records::truncate_utf8(&c.last_error, records::MAX_ERROR_BYTES).to_owned();
            let again = records::ClaimRecord::decode(b"k", &c.encode()).expect("a claim re-encodes");
            assert_eq!(again, records::ClaimRecord { last_error: capped, ..c });
        }
        if let Ok(q) = records::QueueRecord::decode(b"k", b) {
            assert_eq!(
                records::QueueRecord::decode(b"k", &q.encode()).expect("a queue record re-encodes"),
                q
            );
        }
        if let Ok(o) = records::decode_offset(b"k", b) {
            let enc = if o.shared {
                records::encode_shared_offset(o.committed)
            } else {
                records::encode_offset(o.committed)
            };
            assert_eq!(enc.as_slice(), b, "an offset record has one encoding");
        }
        if let Ok(c) = records::decode_cursor(b"k", b) {
            assert_eq!(records::encode_cursor(c).as_slice(), b, "a redrive cursor has one encoding");
        }
        if let Ok(g) = records::GroupSettings::decode(b"k", b) {
            assert_eq!(g.encode(), b, "group settings have one encoding");
        }
        if let Some(v) = records::decode_format(b) {
            // The marker is the magic then the version byte, whatever the version.
            let mut marker = records::encode_format();
            if let Some(last) = marker.last_mut() {
                *last = v;
            }
            assert_eq!(marker, b, "a format marker has one encoding");
        }
        if let Ok(d) = records::DeliveryRecord::decode(b"k", b) {
            assert_eq!(d.encode().as_slice(), b, "a delivery record has one encoding");
        }
    }

    /// A message as a send stages it: validated, encoded into a shared arena behind other sends,
    /// then stamped with its commit time. Decoding must give back exactly what was sent.
    pub fn message_round_trip(payload: &[u8], headers: &[(String, Vec<u8>)], enqueued_at_micros: u64) {
        let mut msg = crate::Message::new(payload.to_vec());
        for (k, v) in headers {
            msg = msg.header(k.as_str(), v.clone());
        }
        if envelope::validate(&msg).is_err() {
            return;
        }
        let mut arena = vec![0xAB; 3];
        envelope::encode_into(&msg, 0, &mut arena);
        assert_eq!(arena.len(), 3 + envelope::encoded_len(&msg));
        envelope::stamp(&mut arena[3..], enqueued_at_micros);
        let env = envelope::decode(b"k", &arena[3..]).expect("an encoded message decodes");
        assert_eq!(env.enqueued_at_micros, enqueued_at_micros);
        assert_eq!(env.headers, msg.headers);
        assert_eq!(env.payload, msg.payload);
        assert_eq!(envelope::enqueued_micros(&arena[3..]), Some(enqueued_at_micros));
    }

    /// A claim record with arbitrary fields. Texts longer than their caps come back cut on a
    /// character boundary.
    pub fn claim_round_trip(
        state: u8,
        attempt: u32,
        token: u64,
        deadline: u64,
        not_before: u64,
        error: &str,
        holder: &str,
    ) {
        let state = match state % 3 {
            0 => records::ClaimState::Leased,
            1 => records::ClaimState::Waiting,
            _ => records::ClaimState::Done,
        };
        let c = records::ClaimRecord {
            state,
            attempt,
            token,
            deadline_micros: deadline,
            not_before_micros: not_before,
            last_error: error.to_owned(),
            holder: holder.into(),
        };
        let back = records::ClaimRecord::decode(b"k", &c.encode()).expect("an encoded claim decodes");
        let expected = records::ClaimRecord {
            last_error: records::truncate_utf8(error, records::MAX_ERROR_BYTES).to_owned(),
            holder: records::truncate_utf8(holder, records::MAX_HOLDER_BYTES).into(),
            ..c
        };
        assert_eq!(back, expected);
    }

    /// Queue records, group settings and offsets with arbitrary fields. Queue ids 0 and
    /// `u32::MAX` and first sequence 0 are never written, and must not decode.
    pub fn records_round_trip(id: u32, first_seq: u64, policy: u8, value: u64, paused: bool, dlq: &str) {
        let retention = match policy % 4 {
            0 => crate::Retention::UntilAcked,
            1 => crate::Retention::MaxAge(std::time::Duration::from_micros(value)),
            2 => crate::Retention::MaxLen(value),
            _ => crate::Retention::Forever,
        };
        let q = records::QueueRecord { id, first_seq, retention };
        let back = records::QueueRecord::decode(b"k", &q.encode());
        if id == 0 || id == u32::MAX || first_seq == 0 {
            assert!(back.is_err(), "an out-of-range queue record decoded: {back:?}");
        } else {
            assert_eq!(back.expect("an encoded queue record decodes"), q);
        }
        let g = records::GroupSettings { paused, dead_letter_queue: dlq.to_owned() };
        let back = records::GroupSettings::decode(b"k", &g.encode()).expect("encoded group settings decode");
        let dlq = records::truncate_utf8(dlq, 255);
        assert_eq!(back, records::GroupSettings { paused, dead_letter_queue: dlq.to_owned() });
        let ordered = records::OffsetRecord { committed: value, shared: false };
        assert_eq!(records::decode_offset(b"k", &records::encode_offset(value)).ok(), Some(ordered));
        let shared = records::OffsetRecord { committed: value, shared: true };
        assert_eq!(records::decode_offset(b"k", &records::encode_shared_offset(value)).ok(), Some(shared));
        assert_eq!(records::decode_cursor(b"k", &records::encode_cursor(value)).ok(), Some(value));
    }

    /// Keys built from arbitrary names. Names rockq accepts (non-empty, no `:`) parse back;
    /// others must not parse at all (as some other pair).
    pub fn keys_round_trip(group: &str, queue: &str, queue_id: u32, seq: u64) {
        assert_eq!(keys::decode_message_key(&keys::message_key(queue_id, seq)).ok(), Some((queue_id, seq)));
        assert_eq!(keys::queue_name_from_key(&keys::queue_key(queue)).ok(), Some(queue));
        let valid = |n: &str| !n.is_empty() && !n.contains(':');
        let claim = keys::claim_key(&keys::claim_prefix(group, queue), seq);
        let (offset, settings) = (keys::offset_key(group, queue), keys::group_key(group, queue));
        if valid(group) && valid(queue) {
            assert_eq!(keys::parse_offset_key(&offset).ok(), Some((group, queue)));
            assert_eq!(keys::parse_group_key(&settings).ok(), Some((group, queue)));
            assert_eq!(keys::parse_claim_key(&claim).ok(), Some((group, queue, seq)));
        } else {
            assert!(keys::parse_offset_key(&offset).is_err());
            assert!(keys::parse_group_key(&settings).is_err());
            assert!(keys::parse_claim_key(&claim).is_err());
        }
    }

    /// Keys of every column family: whatever parses must be the key its builder makes.
    pub fn keys(b: &[u8]) {
        if let Ok((q, s)) = keys::decode_message_key(b) {
            assert_eq!(keys::message_key(q, s).as_slice(), b);
        }
        if let Ok((g, q)) = keys::parse_offset_key(b) {
            assert_eq!(keys::offset_key(g, q), b);
        }
        if let Ok((g, q)) = keys::parse_group_key(b) {
            assert_eq!(keys::group_key(g, q), b);
        }
        if let Ok((g, q, s)) = keys::parse_claim_key(b) {
            assert_eq!(keys::claim_key(&keys::claim_prefix(g, q), s), b);
        }
        if let Ok(name) = keys::queue_name_from_key(b) {
            assert_eq!(keys::queue_key(name), b);
        }
        if let Ok((g, q, s)) = keys::parse_ordered_key(b) {
            assert_eq!(keys::claim_key(&keys::ordered_prefix(g, q), s), b);
        }
    }
}

/// The README's code blocks compile as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
