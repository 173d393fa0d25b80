//! The message envelope: how a [`Message`] is stored as a RocksDB value.
//!
//! ```text
//! [0]      envelope version (2; version 1 is still read)
//! [1]      flags: bit 0 = headers present, bit 1 = ordering key present,
//!          bit 2 = idempotency key present, bit 3 = priority present (version 2 only);
//!          other bits must be zero
//! [2..10]  enqueue time, microseconds since the Unix epoch, u64 BE
//! if priority: [10] the priority (1..=255; 0, the default, is not written)
//! if key:  u16 BE length, key (UTF-8)
//! if idempotency key: u16 BE length, key (UTF-8)
//! if headers: u16 BE count, then per header: u16 BE key length, key (UTF-8),
//!             u32 BE value length, value
//! rest     payload
//! ```
//!
//! The payload is last so it needs no length prefix, and a plain message costs ten bytes of
//! overhead. The priority sits at a fixed place, so the writer reads it without parsing (it
//! indexes prioritised messages as it appends them). Version 1 (rockq's first format) is version 2 without the key flags; both decode.
//! A scheduled message waits in the schedule as the same envelope, its time field holding the
//! time it was sent; it is stamped again when it is appended.

// Decoders read untrusted bytes: no indexing that could panic (the fuzz targets check it too).
#![cfg_attr(not(test), deny(clippy::indexing_slicing))]

use std::ops::Range;

use bytes::Bytes;

use crate::error::CorruptionError;
use crate::message::Message;

pub(crate) const ENVELOPE_V1: u8 = 1;
pub(crate) const ENVELOPE_V2: u8 = 2;
const FLAG_HEADERS: u8 = 1;
const FLAG_KEY: u8 = 2;
const FLAG_IDEMPOTENCY: u8 = 4;
const FLAG_PRIORITY: u8 = 8;
const FIXED_LEN: usize = 10;

/// Why a message cannot be encoded.
#[derive(Debug)]
pub(crate) enum EncodeError {
    HeaderKeyTooLong,
    TooManyHeaders,
    HeaderValueTooLong,
    KeyEmpty,
    KeyTooLong,
}

/// Size of the payload and headers as stored: what `max_message_bytes` limits. Computed
/// before encoding, so oversized messages are rejected without allocating.
pub(crate) fn body_len(msg: &Message) -> usize {
    let headers: usize = if msg.headers.is_empty() {
        0
    } else {
        2 + msg.headers.iter().map(|(k, v)| 2 + k.len() + 4 + v.len()).sum::<usize>()
    };
    let keys: usize = [&msg.key, &msg.idempotency_key].into_iter().flatten().map(|k| 2 + k.len()).sum();
    headers + keys + usize::from(msg.priority > 0) + msg.payload.len()
}

/// Size the stored envelope will have.
pub(crate) fn encoded_len(msg: &Message) -> usize {
    FIXED_LEN + body_len(msg)
}

pub(crate) fn encode(msg: &Message, enqueued_at_micros: u64) -> Result<Vec<u8>, EncodeError> {
    validate(msg)?;
    let mut out = Vec::with_capacity(encoded_len(msg));
    encode_into(msg, enqueued_at_micros, &mut out);
    Ok(out)
}

/// Checks that `msg` can be encoded (header counts and lengths fit their fields), so that
/// [`encode_into`] cannot fail half-way through a shared buffer.
pub(crate) fn validate(msg: &Message) -> Result<(), EncodeError> {
    if msg.headers.len() > usize::from(u16::MAX) {
        return Err(EncodeError::TooManyHeaders);
    }
    for k in [&msg.key, &msg.idempotency_key].into_iter().flatten() {
        if k.is_empty() {
            return Err(EncodeError::KeyEmpty);
        }
        if k.len() > crate::message::MAX_KEY_LEN {
            return Err(EncodeError::KeyTooLong);
        }
    }
    for (k, v) in &msg.headers {
        if k.len() > usize::from(u16::MAX) {
            return Err(EncodeError::HeaderKeyTooLong);
        }
        if u32::try_from(v.len()).is_err() {
            return Err(EncodeError::HeaderValueTooLong);
        }
    }
    Ok(())
}

/// Appends the envelope of a [`validate`]d message to `out` (the caller reserves the space:
/// [`encoded_len`]). Lengths that do not fit their field are clamped rather than panicking,
/// but `validate` has already refused them.
pub(crate) fn encode_into(msg: &Message, enqueued_at_micros: u64, out: &mut Vec<u8>) {
    out.push(ENVELOPE_V2);
    let mut flags = if msg.headers.is_empty() { 0 } else { FLAG_HEADERS };
    if msg.key.is_some() {
        flags |= FLAG_KEY;
    }
    if msg.idempotency_key.is_some() {
        flags |= FLAG_IDEMPOTENCY;
    }
    if msg.priority > 0 {
        flags |= FLAG_PRIORITY;
    }
    out.push(flags);
    out.extend_from_slice(&enqueued_at_micros.to_be_bytes());
    if msg.priority > 0 {
        out.push(msg.priority);
    }
    for k in [&msg.key, &msg.idempotency_key].into_iter().flatten() {
        let kl = u16::try_from(k.len()).unwrap_or(u16::MAX);
        out.extend_from_slice(&kl.to_be_bytes());
        out.extend_from_slice(k.as_bytes());
    }
    if !msg.headers.is_empty() {
        let n = u16::try_from(msg.headers.len()).unwrap_or(u16::MAX);
        out.extend_from_slice(&n.to_be_bytes());
        for (k, v) in &msg.headers {
            let kl = u16::try_from(k.len()).unwrap_or(u16::MAX);
            let vl = u32::try_from(v.len()).unwrap_or(u32::MAX);
            out.extend_from_slice(&kl.to_be_bytes());
            out.extend_from_slice(k.as_bytes());
            out.extend_from_slice(&vl.to_be_bytes());
            out.extend_from_slice(v);
        }
    }
    out.extend_from_slice(&msg.payload);
}

/// Overwrites the enqueue timestamp of an encoded envelope (the writer stamps sends with the
/// time of their group commit).
pub(crate) fn stamp(envelope: &mut [u8], enqueued_at_micros: u64) {
    if let Some(ts) = envelope.get_mut(2..FIXED_LEN) {
        ts.copy_from_slice(&enqueued_at_micros.to_be_bytes());
    }
}

/// The idempotency key of an encoded envelope, read from its fixed header and key fields only
/// (the writer checks staged sends with it). `None` if it has none or does not parse.
pub(crate) fn idempotency_key(envelope: &[u8]) -> Option<&str> {
    let flags = *envelope.get(1)?;
    if envelope.first() != Some(&ENVELOPE_V2) || flags & FLAG_IDEMPOTENCY == 0 {
        return None;
    }
    let mut r = Reader { buf: envelope.get(FIXED_LEN + usize::from(flags & FLAG_PRIORITY != 0)..)? };
    if flags & FLAG_KEY != 0 {
        let n = r.u16()?;
        r.take(usize::from(n))?;
    }
    let n = r.u16()?;
    std::str::from_utf8(r.take(usize::from(n))?).ok()
}

/// The priority of an encoded envelope, read from its fixed header (0 if it has none or does
/// not parse).
pub(crate) fn priority(envelope: &[u8]) -> u8 {
    match (envelope.first(), envelope.get(1)) {
        (Some(&ENVELOPE_V2), Some(flags)) if flags & FLAG_PRIORITY != 0 => {
            envelope.get(FIXED_LEN).copied().unwrap_or(0)
        }
        _ => 0,
    }
}

/// A decoded envelope.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Envelope {
    pub enqueued_at_micros: u64,
    pub priority: u8,
    pub key: Option<String>,
    pub idempotency_key: Option<String>,
    pub headers: Vec<(String, Bytes)>,
    pub payload: Bytes,
}

impl Envelope {
    /// The message again (a redrive or a scheduled message appends it anew).
    pub fn into_message(self) -> Message {
        Message {
            payload: self.payload,
            headers: self.headers,
            key: self.key,
            idempotency_key: self.idempotency_key,
            priority: self.priority,
            due: None,
        }
    }
}

/// Decodes a stored value. `key` is only used to describe a corruption.
/// The enqueue timestamp of a stored envelope, reading only its fixed header.
pub(crate) fn enqueued_micros(value: &[u8]) -> Option<u64> {
    if !matches!(value.first(), Some(&(ENVELOPE_V1 | ENVELOPE_V2))) {
        return None;
    }
    let ts: [u8; 8] = value.get(2..10)?.try_into().ok()?;
    Some(u64::from_be_bytes(ts))
}

pub(crate) fn decode(key: &[u8], value: &[u8]) -> Result<Envelope, CorruptionError> {
    let p = parse(key, value)?;
    // `parse` checked every range; `get` keeps that a check, not a panic, if it ever did not.
    let slice = |r: std::ops::Range<usize>| {
        value
            .get(r)
            .map(Bytes::copy_from_slice)
            .ok_or_else(|| CorruptionError::new("message", key, "range out of bounds"))
    };
    let headers =
        p.headers.into_iter().map(|(k, v)| Ok((k, slice(v)?))).collect::<Result<_, CorruptionError>>()?;
    Ok(Envelope {
        enqueued_at_micros: p.enqueued_at_micros,
        priority: p.priority,
        key: p.key,
        idempotency_key: p.idempotency_key,
        headers,
        payload: slice(p.payload)?,
    })
}

/// As [`decode`], but the payload and header values are slices of `value`, sharing its
/// buffer instead of copying (the read path hands out a whole batch from one buffer).
pub(crate) fn decode_shared(key: &[u8], value: &Bytes) -> Result<Envelope, CorruptionError> {
    let p = parse(key, value)?;
    Ok(Envelope {
        enqueued_at_micros: p.enqueued_at_micros,
        priority: p.priority,
        key: p.key,
        idempotency_key: p.idempotency_key,
        headers: p.headers.into_iter().map(|(k, v)| (k, value.slice(v))).collect(),
        payload: value.slice(p.payload),
    })
}

/// Where the parts of an envelope lie within its value.
struct Parsed {
    enqueued_at_micros: u64,
    priority: u8,
    key: Option<String>,
    idempotency_key: Option<String>,
    headers: Vec<(String, Range<usize>)>,
    payload: Range<usize>,
}

fn parse(key: &[u8], value: &[u8]) -> Result<Parsed, CorruptionError> {
    let bad = |reason: &str| CorruptionError::new("message", key, reason);
    let mut r = Reader { buf: value };
    let at = |r: &Reader<'_>| value.len() - r.buf.len();
    let version = r.u8().ok_or_else(|| bad("empty value"))?;
    let known = match version {
        ENVELOPE_V1 => FLAG_HEADERS,
        ENVELOPE_V2 => FLAG_HEADERS | FLAG_KEY | FLAG_IDEMPOTENCY | FLAG_PRIORITY,
        _ => return Err(bad(&format!("unknown envelope version {version}"))),
    };
    let flags = r.u8().ok_or_else(|| bad("truncated flags"))?;
    if flags & !known != 0 {
        return Err(bad(&format!("unknown flags {flags:#04x}")));
    }
    let ts = r.u64().ok_or_else(|| bad("truncated timestamp"))?;
    let priority = match flags & FLAG_PRIORITY {
        0 => 0,
        _ => match r.u8() {
            Some(0) => return Err(bad("priority 0 written out")),
            Some(p) => p,
            None => return Err(bad("truncated priority")),
        },
    };
    let mut text = |present: bool, what: &str| -> Result<Option<String>, CorruptionError> {
        if !present {
            return Ok(None);
        }
        let n = r.u16().ok_or_else(|| bad(&format!("truncated {what} length")))?;
        let k = r.take(usize::from(n)).ok_or_else(|| bad(&format!("truncated {what}")))?;
        let k = std::str::from_utf8(k).map_err(|_| bad(&format!("{what} is not UTF-8")))?;
        Ok(Some(k.to_owned()))
    };
    let key = text(flags & FLAG_KEY != 0, "key")?;
    let idempotency_key = text(flags & FLAG_IDEMPOTENCY != 0, "idempotency key")?;
    let mut headers = Vec::new();
    if flags & FLAG_HEADERS != 0 {
        let n = r.u16().ok_or_else(|| bad("truncated header count"))?;
        headers.reserve(usize::from(n).min(64));
        for _ in 0..n {
            let kl = r.u16().ok_or_else(|| bad("truncated header key length"))?;
            let k = r.take(usize::from(kl)).ok_or_else(|| bad("truncated header key"))?;
            let k = std::str::from_utf8(k).map_err(|_| bad("header key is not UTF-8"))?;
            let vl = r.u32().ok_or_else(|| bad("truncated header value length"))?;
            let vl = usize::try_from(vl).map_err(|_| bad("header value length"))?;
            let start = at(&r);
            r.take(vl).ok_or_else(|| bad("truncated header value"))?;
            headers.push((k.to_owned(), start..start + vl));
        }
    }
    Ok(Parsed {
        enqueued_at_micros: ts,
        priority,
        key,
        idempotency_key,
        headers,
        payload: at(&r)..value.len(),
    })
}

struct Reader<'a> {
    buf: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.buf.len() < n {
            return None;
        }
        let (head, tail) = self.buf.split_at(n);
        self.buf = tail;
        Some(head)
    }
    fn u8(&mut self) -> Option<u8> {
        self.take(1).and_then(|b| b.first().copied())
    }
    fn u16(&mut self) -> Option<u16> {
        self.take(2).and_then(|b| b.try_into().ok()).map(u16::from_be_bytes)
    }
    fn u32(&mut self) -> Option<u32> {
        self.take(4).and_then(|b| b.try_into().ok()).map(u32::from_be_bytes)
    }
    fn u64(&mut self) -> Option<u64> {
        self.take(8).and_then(|b| b.try_into().ok()).map(u64::from_be_bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_with_and_without_headers() {
        let plain = Message::new("hello");
        let enc = encode(&plain, 7).unwrap();
        assert_eq!(enc.len(), encoded_len(&plain));
        let dec = decode(b"k", &enc).unwrap();
        assert_eq!((dec.enqueued_at_micros, dec.payload.as_ref(), dec.headers.len()), (7, &b"hello"[..], 0));

        let rich = Message::new(vec![0u8, 1, 2]).header("a", "1").header("", "").header("a", "2");
        let enc = encode(&rich, u64::MAX).unwrap();
        assert_eq!(enc.len(), encoded_len(&rich));
        let dec = decode(b"k", &enc).unwrap();
        assert_eq!(dec.headers, rich.headers);
        assert_eq!(dec.payload, rich.payload);
        assert_eq!(dec.enqueued_at_micros, u64::MAX);
    }

    #[test]
    fn keys_round_trip_and_version_1_still_decodes() {
        let m = Message::new("p").key("acct-7").idempotency_key("op-1").header("h", "v");
        let enc = encode(&m, 5).unwrap();
        assert_eq!(enc.len(), encoded_len(&m));
        let dec = decode(b"k", &enc).unwrap();
        assert_eq!((dec.key.as_deref(), dec.idempotency_key.as_deref()), (Some("acct-7"), Some("op-1")));
        assert_eq!(dec.clone().into_message(), m);
        assert_eq!(idempotency_key(&enc), Some("op-1"));
        assert_eq!(
            idempotency_key(&encode(&Message::new("p").idempotency_key("k2"), 1).unwrap()),
            Some("k2")
        );
        assert_eq!(idempotency_key(&encode(&Message::new("p").key("only"), 1).unwrap()), None);
        // Version 1 bytes, as rockq's first format wrote them: headers flag, time, headers, payload.
        let mut v1 = vec![ENVELOPE_V1, FLAG_HEADERS];
        v1.extend_from_slice(&9u64.to_be_bytes());
        v1.extend_from_slice(&[0, 1, 0, 1, b'a', 0, 0, 0, 1, b'b']);
        v1.extend_from_slice(b"old");
        let dec = decode(b"k", &v1).unwrap();
        assert_eq!((dec.enqueued_at_micros, dec.payload.as_ref(), dec.key), (9, &b"old"[..], None));
        assert_eq!(enqueued_micros(&v1), Some(9));
        // A version 1 record cannot carry the version 2 flags.
        v1[1] = FLAG_KEY;
        assert!(decode(b"k", &v1).is_err());
        assert!(matches!(validate(&Message::new("x").key("")), Err(EncodeError::KeyEmpty)));
        let long = "k".repeat(crate::message::MAX_KEY_LEN + 1);
        assert!(matches!(validate(&Message::new("x").idempotency_key(long)), Err(EncodeError::KeyTooLong)));
    }

    #[test]
    fn every_truncation_and_bad_version_is_an_error_not_a_panic() {
        let rich = Message::new("payload").header("key", "value").key("k").idempotency_key("i");
        let enc = encode(&rich, 1).unwrap();
        // Truncations inside the fixed part and the headers must fail; truncations inside the
        // payload are indistinguishable from a shorter payload, by design of the layout.
        let payload_start = enc.len() - rich.payload.len();
        for cut in 0..payload_start {
            assert!(decode(b"k", &enc[..cut]).is_err(), "cut at {cut} decoded");
        }
        let mut wrong = enc.clone();
        wrong[0] = 9;
        assert!(decode(b"k", &wrong).is_err());
        let mut flags = enc;
        flags[1] = 0x80;
        assert!(decode(b"k", &flags).is_err());
    }
}
