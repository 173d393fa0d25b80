//! Key layout. Every key rockq writes is built and parsed here.
//!
//! | column family | key | value |
//! | --- | --- | --- |
//! | `rockq.messages` | `<queue_id u32 BE><seq u64 BE>` | message envelope |
//! | `rockq.meta` | `format` | format marker |
//! | `rockq.meta` | `queue:<name>` | queue record (id, first live seq) |
//! | `rockq.meta` | `redrive:<dlq>` | redrive cursor (last dead letter moved out) |
//! | `rockq.meta` | `group:<group>:<queue>` | group settings (paused, dead-letter queue) |
//! | `rockq.offsets` | `consumer:<group>:<queue>` | offset record (last committed seq, mode) |
//! | `rockq.claims` | `claim:<group>:<queue>:<seq u64 BE>` | claim record (work-queue groups) |
//! | `rockq.claims` | `ordered:<group>:<queue>:<seq u64 BE>` | delivery record (ordered groups) |
//! | `rockq.claims` | `outcome:<group>:<queue>:<seq u64 BE>` | job outcome (work groups that keep outcomes) |
//! | `rockq.claims` | `progress:<group>:<queue>:<seq u64 BE>` | a running job's last progress report |
//! | `rockq.claims` | `rate:<group>:<queue>` | a rate-limited work group's bucket (next claim's theoretical time) |
//! | `rockq.meta` | `scheduled-id` | next schedule id |
//! | `rockq.meta` | `queue-id` | lowest queue id never handed out (written when a queue is deleted) |
//! | `rockq.scheduled` | `t<due u64 BE><queue_id u32 BE><id u64 BE>` | delayed message envelope, or a recurring schedule's name (queue id `u32::MAX`) |
//! | `rockq.scheduled` | `i<queue_id u32 BE><id u64 BE>` | due time of a delayed message (cancel, reschedule) |
//! | `rockq.scheduled` | `s:<name>` | recurring schedule record |
//! | `rockq.scheduled` | `p<queue_id u32 BE><seq u64 BE>` | priority of a message sent with one (1 byte) |
//! | `rockq.dedup` | `k<queue_id u32 BE><idempotency key>` | dedup record (original, expiry) |
//! | `rockq.dedup` | `x<expires u64 BE><queue_id u32 BE><idempotency key>` | expiry index (empty) |
//!
//! Big-endian fixed-width integers make byte order equal numeric order, so one queue's messages
//! are contiguous and sorted, and `<queue_id + 1>` is an exclusive upper bound for all of them.

// Decoders read untrusted bytes: no indexing that could panic (the fuzz targets check it too).
#![cfg_attr(not(test), deny(clippy::indexing_slicing))]

use crate::error::CorruptionError;

/// Length of a message key.
pub(crate) const MESSAGE_KEY_LEN: usize = 12;

/// Key of the format marker in the meta column family.
pub(crate) const FORMAT_KEY: &[u8] = b"format";

const QUEUE_PREFIX: &[u8] = b"queue:";
const OFFSET_PREFIX: &[u8] = b"consumer:";
const CLAIM_PREFIX: &[u8] = b"claim:";
const REDRIVE_PREFIX: &[u8] = b"redrive:";
const LETTER_PREFIX: &[u8] = b"letter:";
const GROUP_PREFIX: &[u8] = b"group:";
const ORDERED_PREFIX: &[u8] = b"ordered:";
const OUTCOME_PREFIX: &[u8] = b"outcome:";
const PROGRESS_PREFIX: &[u8] = b"progress:";
const RATE_PREFIX: &[u8] = b"rate:";

pub(crate) fn message_key(queue_id: u32, seq: u64) -> [u8; MESSAGE_KEY_LEN] {
    let mut k = [0u8; MESSAGE_KEY_LEN];
    k[..4].copy_from_slice(&queue_id.to_be_bytes());
    k[4..].copy_from_slice(&seq.to_be_bytes());
    k
}

/// Exclusive upper bound for every message key of `queue_id`: `<queue_id + 1>`.
///
/// Queue ids stop at `u32::MAX - 1` (see the registry), so this never overflows.
pub(crate) fn queue_upper_bound(queue_id: u32) -> [u8; 4] {
    debug_assert!(queue_id < u32::MAX);
    (queue_id + 1).to_be_bytes()
}

/// Exclusive upper bound for messages of `queue_id` up to and including `last`.
pub(crate) fn message_upper_bound(queue_id: u32, last: u64) -> Vec<u8> {
    match last.checked_add(1) {
        Some(next) => message_key(queue_id, next).to_vec(),
        None => queue_upper_bound(queue_id).to_vec(),
    }
}

pub(crate) fn decode_message_key(key: &[u8]) -> Result<(u32, u64), CorruptionError> {
    let arr: [u8; MESSAGE_KEY_LEN] = key
        .try_into()
        .map_err(|_| CorruptionError::new("message key", key, format!("length {}", key.len())))?;
    let (q, s) = arr.split_at(4);
    let q = u32::from_be_bytes(q.try_into().unwrap_or_default());
    let s = u64::from_be_bytes(s.try_into().unwrap_or_default());
    Ok((q, s))
}

pub(crate) fn queue_key(name: &str) -> Vec<u8> {
    [QUEUE_PREFIX, name.as_bytes()].concat()
}

/// Bounds of the range holding every queue record.
pub(crate) fn queue_key_range() -> (Vec<u8>, Vec<u8>) {
    prefix_range(QUEUE_PREFIX)
}

pub(crate) fn queue_name_from_key(key: &[u8]) -> Result<&str, CorruptionError> {
    key.strip_prefix(QUEUE_PREFIX)
        .and_then(|n| std::str::from_utf8(n).ok())
        .ok_or_else(|| CorruptionError::new("queue key", key, "bad prefix or not UTF-8"))
}

/// `consumer:<group>:<queue>`. Names cannot contain `:` (see `name.rs`), so the split is
/// unambiguous and no two (group, queue) pairs share a key.
pub(crate) fn offset_key(group: &str, queue: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(OFFSET_PREFIX.len() + group.len() + 1 + queue.len());
    k.extend_from_slice(OFFSET_PREFIX);
    k.extend_from_slice(group.as_bytes());
    k.push(b':');
    k.extend_from_slice(queue.as_bytes());
    k
}

pub(crate) fn offset_key_range() -> (Vec<u8>, Vec<u8>) {
    prefix_range(OFFSET_PREFIX)
}

/// Splits `consumer:<group>:<queue>` into `(group, queue)`.
pub(crate) fn parse_offset_key(key: &[u8]) -> Result<(&str, &str), CorruptionError> {
    parse_pair(OFFSET_PREFIX, "offset key", key)
}

/// `group:<group>:<queue>`: the settings record of a group (either mode).
pub(crate) fn group_key(group: &str, queue: &str) -> Vec<u8> {
    [GROUP_PREFIX, group.as_bytes(), b":", queue.as_bytes()].concat()
}

pub(crate) fn group_key_range() -> (Vec<u8>, Vec<u8>) {
    prefix_range(GROUP_PREFIX)
}

/// Splits `group:<group>:<queue>` into `(group, queue)`.
pub(crate) fn parse_group_key(key: &[u8]) -> Result<(&str, &str), CorruptionError> {
    parse_pair(GROUP_PREFIX, "group key", key)
}

fn parse_pair<'k>(
    prefix: &[u8],
    what: &'static str,
    key: &'k [u8],
) -> Result<(&'k str, &'k str), CorruptionError> {
    let bad = || CorruptionError::new(what, key, "expected <prefix>:<group>:<queue>");
    let rest = key.strip_prefix(prefix).ok_or_else(bad)?;
    let rest = std::str::from_utf8(rest).map_err(|_| bad())?;
    let (group, queue) = rest.split_once(':').ok_or_else(bad)?;
    if group.is_empty() || queue.is_empty() || queue.contains(':') {
        return Err(bad());
    }
    Ok((group, queue))
}

/// `claim:<group>:<queue>:`, the prefix of every claim of one work-queue group.
pub(crate) fn claim_prefix(group: &str, queue: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(CLAIM_PREFIX.len() + group.len() + queue.len() + 10);
    k.extend_from_slice(CLAIM_PREFIX);
    k.extend_from_slice(group.as_bytes());
    k.push(b':');
    k.extend_from_slice(queue.as_bytes());
    k.push(b':');
    k
}

/// `claim:<group>:<queue>:<seq u64 BE>`: a group's claims sort by sequence.
pub(crate) fn claim_key(prefix: &[u8], seq: u64) -> Vec<u8> {
    let mut k = Vec::with_capacity(prefix.len() + 8);
    k.extend_from_slice(prefix);
    k.extend_from_slice(&seq.to_be_bytes());
    k
}

pub(crate) fn claim_key_range() -> (Vec<u8>, Vec<u8>) {
    prefix_range(CLAIM_PREFIX)
}

/// Splits a claim key into `(group, queue, seq)`.
pub(crate) fn parse_claim_key(key: &[u8]) -> Result<(&str, &str, u64), CorruptionError> {
    let bad = || CorruptionError::new("claim key", key, "expected claim:<group>:<queue>:<seq>");
    let rest = key.strip_prefix(CLAIM_PREFIX).ok_or_else(bad)?;
    if rest.len() < 8 + 4 {
        return Err(bad());
    }
    let (names, seq) = rest.split_at(rest.len() - 8);
    let names = names.strip_suffix(b":").ok_or_else(bad)?;
    let names = std::str::from_utf8(names).map_err(|_| bad())?;
    let (group, queue) = names.split_once(':').ok_or_else(bad)?;
    if group.is_empty() || queue.is_empty() || queue.contains(':') {
        return Err(bad());
    }
    let seq = u64::from_be_bytes(seq.try_into().map_err(|_| bad())?);
    Ok((group, queue, seq))
}

/// `ordered:<group>:<queue>:`, the prefix of an ordered group's delivery records.
pub(crate) fn ordered_prefix(group: &str, queue: &str) -> Vec<u8> {
    [ORDERED_PREFIX, group.as_bytes(), b":", queue.as_bytes(), b":"].concat()
}

/// `outcome:<group>:<queue>:`, the prefix of a work group's job outcomes (build each key with
/// [`claim_key`]).
pub(crate) fn outcome_prefix(group: &str, queue: &str) -> Vec<u8> {
    [OUTCOME_PREFIX, group.as_bytes(), b":", queue.as_bytes(), b":"].concat()
}

/// `progress:<group>:<queue>:`, the prefix of a work group's progress reports (build each key
/// with [`claim_key`]).
pub(crate) fn progress_prefix(group: &str, queue: &str) -> Vec<u8> {
    [PROGRESS_PREFIX, group.as_bytes(), b":", queue.as_bytes(), b":"].concat()
}

/// `rate:<group>:<queue>`: a rate-limited work group's bucket, written with its claims.
pub(crate) fn rate_key(group: &str, queue: &str) -> Vec<u8> {
    [RATE_PREFIX, group.as_bytes(), b":", queue.as_bytes()].concat()
}

/// Bounds of the range holding every rate bucket.
pub(crate) fn rate_key_range() -> (Vec<u8>, Vec<u8>) {
    prefix_range(RATE_PREFIX)
}

/// Splits `rate:<group>:<queue>` into `(group, queue)`.
pub(crate) fn parse_rate_key(key: &[u8]) -> Result<(&str, &str), CorruptionError> {
    parse_pair(RATE_PREFIX, "rate bucket key", key)
}

/// Bounds of the range holding every kept job outcome.
pub(crate) fn outcome_key_range() -> (Vec<u8>, Vec<u8>) {
    prefix_range(OUTCOME_PREFIX)
}

/// Bounds of the range holding every progress report.
pub(crate) fn progress_key_range() -> (Vec<u8>, Vec<u8>) {
    prefix_range(PROGRESS_PREFIX)
}

/// Splits a job outcome's key into `(group, queue, seq)`.
pub(crate) fn parse_outcome_key(key: &[u8]) -> Result<(&str, &str, u64), CorruptionError> {
    parse_prefixed(OUTCOME_PREFIX, "outcome key", "expected outcome:<group>:<queue>:<seq>", key)
}

/// Splits a progress report's key into `(group, queue, seq)`.
pub(crate) fn parse_progress_key(key: &[u8]) -> Result<(&str, &str, u64), CorruptionError> {
    parse_prefixed(PROGRESS_PREFIX, "progress key", "expected progress:<group>:<queue>:<seq>", key)
}

/// The sequence of a key built with [`claim_key`] on `prefix`.
pub(crate) fn claim_key_seq(prefix: &[u8], key: &[u8]) -> Result<u64, CorruptionError> {
    let bad = || CorruptionError::new("record key", key, "expected <prefix><seq u64 BE>");
    let seq = key.strip_prefix(prefix).ok_or_else(bad)?;
    Ok(u64::from_be_bytes(seq.try_into().map_err(|_| bad())?))
}

/// `ordered:<group>:<queue>:<seq u64 BE>` (build with [`claim_key`] on an [`ordered_prefix`]).
pub(crate) fn ordered_key_range() -> (Vec<u8>, Vec<u8>) {
    prefix_range(ORDERED_PREFIX)
}

/// Splits an ordered delivery record's key into `(group, queue, seq)`.
pub(crate) fn parse_ordered_key(key: &[u8]) -> Result<(&str, &str, u64), CorruptionError> {
    parse_prefixed(ORDERED_PREFIX, "delivery key", "expected ordered:<group>:<queue>:<seq>", key)
}

/// `<prefix><group>:<queue>:<seq u64 BE>` into `(group, queue, seq)`; a corruption of `what`
/// (saying `expected`) otherwise.
fn parse_prefixed<'k>(
    prefix: &[u8],
    what: &'static str,
    expected: &'static str,
    key: &'k [u8],
) -> Result<(&'k str, &'k str, u64), CorruptionError> {
    let bad = || CorruptionError::new(what, key, expected);
    let rest = key.strip_prefix(prefix).ok_or_else(bad)?;
    parse_seq_key(rest).ok_or_else(bad)
}

/// `<group>:<queue>:<seq u64 BE>` into its parts.
fn parse_seq_key(rest: &[u8]) -> Option<(&str, &str, u64)> {
    if rest.len() < 8 + 4 {
        return None;
    }
    let (names, seq) = rest.split_at(rest.len() - 8);
    let names = std::str::from_utf8(names.strip_suffix(b":")?).ok()?;
    let (group, queue) = names.split_once(':')?;
    if group.is_empty() || queue.is_empty() || queue.contains(':') {
        return None;
    }
    Some((group, queue, u64::from_be_bytes(seq.try_into().ok()?)))
}

/// `redrive:<dlq>`: how far a dead-letter queue has been redriven.
pub(crate) fn redrive_key(dlq: &str) -> Vec<u8> {
    [REDRIVE_PREFIX, dlq.as_bytes()].concat()
}

/// `letter:<dlq>:<seq u64 BE>`: dead letter `seq` of `dlq`, above its redrive cursor, was
/// settled on its own (redriven or deleted). The cursor moves over it with the letters before
/// it, deleting the mark.
pub(crate) fn letter_key(dlq: &str, seq: u64) -> Vec<u8> {
    [LETTER_PREFIX, dlq.as_bytes(), b":", &seq.to_be_bytes()].concat()
}

/// The range of every letter mark of `dlq` (names hold no ':', so no other queue's marks fall
/// inside).
pub(crate) fn letter_range(dlq: &str) -> (Vec<u8>, Vec<u8>) {
    prefix_range(&[LETTER_PREFIX, dlq.as_bytes(), b":"].concat())
}

/// The sequence of a letter mark key.
pub(crate) fn letter_seq(key: &[u8]) -> Result<u64, CorruptionError> {
    let bad = || CorruptionError::new("letter mark key", key, "expected letter:<dlq>:<seq>");
    if !key.starts_with(LETTER_PREFIX) || key.len() < LETTER_PREFIX.len() + 10 {
        return Err(bad());
    }
    let seq: [u8; 8] = key.get(key.len() - 8..).and_then(|s| s.try_into().ok()).ok_or_else(bad)?;
    Ok(u64::from_be_bytes(seq))
}

/// Splits a letter mark key into `(dlq, seq)`.
pub(crate) fn parse_letter_key(key: &[u8]) -> Result<(&str, u64), CorruptionError> {
    let seq = letter_seq(key)?;
    let bad = || CorruptionError::new("letter mark key", key, "expected letter:<dlq>:<seq>");
    let names = key.get(LETTER_PREFIX.len()..key.len() - 9).ok_or_else(bad)?;
    if key.get(key.len() - 9) != Some(&b':') {
        return Err(bad());
    }
    let dlq = std::str::from_utf8(names).map_err(|_| bad())?;
    Ok((dlq, seq))
}

/// What a key of the meta column family is (keyspaces' keys are `kv.rs`'s: `Other`).
pub(crate) enum MetaKey<'k> {
    Format,
    Queue(&'k str),
    Group(&'k str, &'k str),
    Redrive(&'k str),
    Letter(&'k str, u64),
    ScheduledId,
    NextQueueId,
    Other,
}

/// Tells what `key` of the meta column family is.
pub(crate) fn classify_meta(key: &[u8]) -> Result<MetaKey<'_>, CorruptionError> {
    Ok(if key == FORMAT_KEY {
        MetaKey::Format
    } else if key == SCHEDULED_ID_KEY {
        MetaKey::ScheduledId
    } else if key == NEXT_QUEUE_ID_KEY {
        MetaKey::NextQueueId
    } else if key.starts_with(QUEUE_PREFIX) {
        MetaKey::Queue(queue_name_from_key(key)?)
    } else if key.starts_with(GROUP_PREFIX) {
        let (g, q) = parse_group_key(key)?;
        MetaKey::Group(g, q)
    } else if let Some(dlq) = key.strip_prefix(REDRIVE_PREFIX) {
        MetaKey::Redrive(
            std::str::from_utf8(dlq)
                .map_err(|_| CorruptionError::new("redrive cursor key", key, "not UTF-8"))?,
        )
    } else if key.starts_with(LETTER_PREFIX) {
        let (dlq, seq) = parse_letter_key(key)?;
        MetaKey::Letter(dlq, seq)
    } else {
        MetaKey::Other
    })
}

/// Key of the next schedule id in the meta column family.
pub(crate) const SCHEDULED_ID_KEY: &[u8] = b"scheduled-id";
/// Key of the lowest queue id never handed out, in the meta column family: written when a queue
/// is deleted, so that its id is not handed out again after a restart (ids are otherwise
/// recovered from the highest id among the queue records, which the deleted one left).
pub(crate) const NEXT_QUEUE_ID_KEY: &[u8] = b"queue-id";
/// Queue id of the due entries of recurring schedules (no queue has it: see the registry).
pub(crate) const RECURRING: u32 = u32::MAX;

/// `t<due><queue_id><id>`: the due index, in due order.
pub(crate) fn due_key(due: u64, queue_id: u32, id: u64) -> [u8; 21] {
    let mut k = [0u8; 21];
    k[0] = b't';
    k[1..9].copy_from_slice(&due.to_be_bytes());
    k[9..13].copy_from_slice(&queue_id.to_be_bytes());
    k[13..].copy_from_slice(&id.to_be_bytes());
    k
}

/// Splits a due key into `(due, queue_id, id)`.
pub(crate) fn parse_due_key(key: &[u8]) -> Result<(u64, u32, u64), CorruptionError> {
    let bad = || CorruptionError::new("due key", key, "expected t<due><queue><id>");
    let arr: &[u8; 21] = key.try_into().map_err(|_| bad())?;
    let (tag, rest) = arr.split_first().ok_or_else(bad)?;
    if *tag != b't' {
        return Err(bad());
    }
    let (due, rest) = rest.split_at(8);
    let (queue, id) = rest.split_at(4);
    Ok((
        u64::from_be_bytes(due.try_into().map_err(|_| bad())?),
        u32::from_be_bytes(queue.try_into().map_err(|_| bad())?),
        u64::from_be_bytes(id.try_into().map_err(|_| bad())?),
    ))
}

/// Every due key up to and including time `through`: `[t, t<through + 1>)`.
pub(crate) fn due_range() -> (Vec<u8>, Vec<u8>) {
    (b"t".to_vec(), b"u".to_vec())
}

/// `<tag><queue_id u32 BE><n u64 BE>`: the per-queue keys of `rockq.scheduled` (the id index
/// of delayed messages, the priority index).
fn queue_key_of(tag: u8, queue_id: u32, n: u64) -> [u8; 13] {
    let mut k = [0u8; 13];
    k[0] = tag;
    k[1..5].copy_from_slice(&queue_id.to_be_bytes());
    k[5..].copy_from_slice(&n.to_be_bytes());
    k
}

/// Every `tag` key of one queue (`None`: of every queue).
fn queue_range_of(tag: u8, queue_id: Option<u32>) -> (Vec<u8>, Vec<u8>) {
    match queue_id {
        Some(q) => ([&[tag][..], &q.to_be_bytes()].concat(), [&[tag][..], &(q + 1).to_be_bytes()].concat()),
        None => (vec![tag], vec![tag + 1]),
    }
}

/// Splits a `tag` key into `(queue_id, n)`; `what` and `expected` describe a corruption.
fn parse_queue_key_of(
    tag: u8,
    key: &[u8],
    what: &'static str,
    expected: &'static str,
) -> Result<(u32, u64), CorruptionError> {
    let bad = || CorruptionError::new(what, key, expected);
    let arr: &[u8; 13] = key.try_into().map_err(|_| bad())?;
    let (first, rest) = arr.split_first().ok_or_else(bad)?;
    if *first != tag {
        return Err(bad());
    }
    let (queue, n) = rest.split_at(4);
    Ok((
        u32::from_be_bytes(queue.try_into().map_err(|_| bad())?),
        u64::from_be_bytes(n.try_into().map_err(|_| bad())?),
    ))
}

/// `i<queue_id><id>`: a delayed message's due time, by id.
pub(crate) fn scheduled_id_key(queue_id: u32, id: u64) -> [u8; 13] {
    queue_key_of(b'i', queue_id, id)
}

/// Every id key of one queue (`None`: of every queue).
pub(crate) fn scheduled_id_range(queue_id: Option<u32>) -> (Vec<u8>, Vec<u8>) {
    queue_range_of(b'i', queue_id)
}

/// Splits an id key into `(queue_id, id)`.
pub(crate) fn parse_scheduled_id_key(key: &[u8]) -> Result<(u32, u64), CorruptionError> {
    parse_queue_key_of(b'i', key, "scheduled id key", "expected i<queue><id>")
}

/// `p<queue_id><seq>`: the priority index entry of a prioritised message.
pub(crate) fn priority_key(queue_id: u32, seq: u64) -> [u8; 13] {
    queue_key_of(b'p', queue_id, seq)
}

/// Every priority entry of one queue (`None`: of every queue).
pub(crate) fn priority_range(queue_id: Option<u32>) -> (Vec<u8>, Vec<u8>) {
    queue_range_of(b'p', queue_id)
}

/// Splits a priority key into `(queue_id, seq)`.
pub(crate) fn parse_priority_key(key: &[u8]) -> Result<(u32, u64), CorruptionError> {
    parse_queue_key_of(b'p', key, "priority key", "expected p<queue><seq>")
}

/// `s:<name>`: a recurring schedule.
pub(crate) fn schedule_key(name: &str) -> Vec<u8> {
    [&b"s:"[..], name.as_bytes()].concat()
}

pub(crate) fn schedule_key_range() -> (Vec<u8>, Vec<u8>) {
    prefix_range(b"s:")
}

pub(crate) fn schedule_name_from_key(key: &[u8]) -> Result<&str, CorruptionError> {
    key.strip_prefix(b"s:")
        .and_then(|n| std::str::from_utf8(n).ok())
        .ok_or_else(|| CorruptionError::new("schedule key", key, "bad prefix or not UTF-8"))
}

/// `k<queue_id><key>`: an idempotency key's record.
pub(crate) fn dedup_key(queue_id: u32, key: &[u8]) -> Vec<u8> {
    [&b"k"[..], &queue_id.to_be_bytes(), key].concat()
}

/// `x<expires><queue_id><key>`: the expiry index, in expiry order.
pub(crate) fn dedup_expiry_key(expires: u64, queue_id: u32, key: &[u8]) -> Vec<u8> {
    [&b"x"[..], &expires.to_be_bytes(), &queue_id.to_be_bytes(), key].concat()
}

/// Every expiry key below time `before`: `[x, x<before>)`.
pub(crate) fn dedup_expired_range(before: u64) -> (Vec<u8>, Vec<u8>) {
    (b"x".to_vec(), [&b"x"[..], &before.to_be_bytes()].concat())
}

/// Splits an expiry key into `(expires, queue_id, key)`.
pub(crate) fn parse_dedup_expiry_key(key: &[u8]) -> Result<(u64, u32, &[u8]), CorruptionError> {
    let bad = || CorruptionError::new("dedup expiry key", key, "expected x<expires><queue><key>");
    let rest = key.strip_prefix(b"x").ok_or_else(bad)?;
    if rest.len() < 12 {
        return Err(bad());
    }
    let (expires, rest) = rest.split_at(8);
    let (queue, k) = rest.split_at(4);
    Ok((
        u64::from_be_bytes(expires.try_into().map_err(|_| bad())?),
        u32::from_be_bytes(queue.try_into().map_err(|_| bad())?),
        k,
    ))
}

/// `[prefix, prefix with its last byte incremented)`: every key starting with `prefix`.
fn prefix_range(prefix: &[u8]) -> (Vec<u8>, Vec<u8>) {
    let mut end = prefix.to_vec();
    // All our prefixes end in ':' (0x3a), so incrementing cannot overflow.
    if let Some(last) = end.last_mut() {
        *last += 1;
    }
    (prefix.to_vec(), end)
}

#[cfg(test)]
mod tests {
    #[test]
    fn priority_keys_round_trip_sort_by_queue_then_sequence_and_stay_in_their_range() {
        use super::*;
        let k = priority_key(7, u64::MAX);
        assert_eq!(parse_priority_key(&k).unwrap(), (7, u64::MAX));
        assert!(parse_priority_key(&scheduled_id_key(7, 1)).is_err(), "an id key is not a priority key");
        assert!(parse_priority_key(&k[..12]).is_err());
        assert!(priority_key(7, 2) < priority_key(7, 10) && priority_key(7, u64::MAX) < priority_key(8, 0));
        let (lo, hi) = priority_range(Some(7));
        assert!(lo.as_slice() <= &k[..] && &k[..] < hi.as_slice());
        assert!(&priority_key(8, 0)[..] >= hi.as_slice());
        let (lo, hi) = priority_range(None);
        assert!(lo.as_slice() <= &k[..] && &k[..] < hi.as_slice());
        assert!(&scheduled_id_key(u32::MAX - 1, u64::MAX)[..] < lo.as_slice(), "apart from the id index");
    }

    use super::*;

    #[test]
    fn letter_marks_of_one_queue_sort_by_sequence_and_exclude_other_queues() {
        let (lo, hi) = letter_range("jobs.dlq");
        let (a, b) = (letter_key("jobs.dlq", 2), letter_key("jobs.dlq", 300));
        assert!(lo <= a && a < b && b < hi);
        // A queue whose name extends this one's is outside the range.
        let other = letter_key("jobs.dlq2", 1);
        assert!(!(lo <= other && other < hi));
        assert_eq!((letter_seq(&a).unwrap(), letter_seq(&b).unwrap()), (2, 300));
        assert!(letter_seq(b"letter:x").is_err() && letter_seq(b"queue:jobs:12345678").is_err());
    }

    #[test]
    fn message_keys_sort_by_queue_then_sequence() {
        let mut keys = [
            message_key(2, 0),
            message_key(1, u64::MAX),
            message_key(1, 256),
            message_key(1, 255),
            message_key(1, 1),
        ];
        keys.sort();
        let decoded: Vec<_> = keys.iter().map(|k| decode_message_key(k).unwrap()).collect();
        assert_eq!(decoded, vec![(1, 1), (1, 255), (1, 256), (1, u64::MAX), (2, 0)]);
        assert!(message_key(1, u64::MAX).as_slice() < queue_upper_bound(1).as_slice());
        assert!(queue_upper_bound(1).as_slice() <= message_key(2, 0).as_slice());
        assert_eq!(message_upper_bound(1, u64::MAX), queue_upper_bound(1).to_vec());
    }

    #[test]
    fn offset_keys_round_trip_and_reject_garbage() {
        let k = offset_key("billing", "orders");
        assert_eq!(k, b"consumer:billing:orders");
        assert_eq!(parse_offset_key(&k).unwrap(), ("billing", "orders"));
        for bad in
            [&b"consumer:"[..], b"consumer::q", b"consumer:g:", b"consumer:g", b"x:g:q", b"consumer:g:q:r"]
        {
            assert!(parse_offset_key(bad).is_err(), "{bad:?}");
        }
        let (lo, hi) = offset_key_range();
        assert!(lo.as_slice() <= k.as_slice() && k.as_slice() < hi.as_slice());
    }

    #[test]
    fn group_keys_round_trip_and_reject_garbage() {
        let k = group_key("billing", "orders");
        assert_eq!(k, b"group:billing:orders");
        assert_eq!(parse_group_key(&k).unwrap(), ("billing", "orders"));
        for bad in [&b"group:"[..], b"group::q", b"group:g:", b"consumer:g:q", b"group:g:q:r"] {
            assert!(parse_group_key(bad).is_err(), "{bad:?}");
        }
        let (lo, hi) = group_key_range();
        assert!(lo.as_slice() <= k.as_slice() && k.as_slice() < hi.as_slice());
    }

    #[test]
    fn claim_keys_round_trip_sort_by_sequence_and_reject_garbage() {
        let p = claim_prefix("workers", "jobs");
        let k = claim_key(&p, 258);
        assert_eq!(parse_claim_key(&k).unwrap(), ("workers", "jobs", 258));
        assert!(claim_key(&p, 255) < claim_key(&p, 256));
        let (lo, hi) = claim_key_range();
        assert!(lo.as_slice() <= k.as_slice() && k.as_slice() < hi.as_slice());
        for bad in [
            &b"claim:"[..],
            b"claim:g:q:1234567",
            b"claim:g:12345678",
            b"claim::q:12345678",
            b"x:g:q:12345678",
        ] {
            assert!(parse_claim_key(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn ordered_keys_round_trip_and_stay_apart_from_claims() {
        let p = ordered_prefix("billing", "orders");
        let k = claim_key(&p, 258);
        assert_eq!(parse_ordered_key(&k).unwrap(), ("billing", "orders", 258));
        assert!(claim_key(&p, 255) < claim_key(&p, 256));
        let (lo, hi) = ordered_key_range();
        assert!(lo.as_slice() <= k.as_slice() && k.as_slice() < hi.as_slice());
        // Never inside the work groups' claim range, which open() loads as claims.
        let (clo, chi) = claim_key_range();
        assert!(!(clo.as_slice() <= k.as_slice() && k.as_slice() < chi.as_slice()));
        assert!(parse_claim_key(&k).is_err());
        for bad in [&b"ordered:"[..], b"ordered:g:q:1234567", b"ordered::q:12345678", b"claim:g:q:12345678"] {
            assert!(parse_ordered_key(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn schedule_and_dedup_keys_round_trip_and_sort_by_time() {
        let k = due_key(5, 7, 9);
        assert_eq!(parse_due_key(&k).unwrap(), (5, 7, 9));
        assert!(due_key(5, u32::MAX, u64::MAX) < due_key(6, 0, 0));
        let (lo, hi) = due_range();
        assert!(lo.as_slice() <= k.as_slice() && k.as_slice() < hi.as_slice());
        assert!(parse_due_key(&k[..20]).is_err());
        let i = scheduled_id_key(7, 9);
        assert_eq!(parse_scheduled_id_key(&i).unwrap(), (7, 9));
        let (lo, hi) = scheduled_id_range(Some(7));
        assert!(lo.as_slice() <= i.as_slice() && i.as_slice() < hi.as_slice());
        assert!(scheduled_id_key(8, 0).as_slice() >= hi.as_slice());
        assert_eq!(schedule_name_from_key(&schedule_key("nightly")).unwrap(), "nightly");
        let x = dedup_expiry_key(100, 3, b"op-1");
        assert_eq!(parse_dedup_expiry_key(&x).unwrap(), (100, 3, &b"op-1"[..]));
        let (lo, hi) = dedup_expired_range(101);
        assert!(lo.as_slice() <= x.as_slice() && x.as_slice() < hi.as_slice());
        assert!(x.as_slice() >= dedup_expired_range(100).1.as_slice(), "not expired before its time");
    }

    #[test]
    fn short_message_key_is_an_error() {
        assert!(decode_message_key(&[0, 0, 0, 1]).is_err());
    }
}
