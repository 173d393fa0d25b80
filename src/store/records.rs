//! The on-disk records of the meta, offsets and claims column families: one codec per record,
//! between its byte layout and the domain value it stores (`model.rs`). Nothing outside
//! `store/` sees these layouts.
//!
//! Each starts with a version byte so a later release can change the layout and still read old
//! databases.

// Decoders read untrusted bytes: no indexing that could panic (the fuzz targets check it too).
#![cfg_attr(not(test), deny(clippy::indexing_slicing))]

use std::sync::Arc;

use crate::error::CorruptionError;
use crate::model::{
    Claim, GroupMode, GroupOffset, GroupSettings, MAX_ERROR_BYTES, MAX_HOLDER_BYTES, OrderedMark, QueueMeta,
    WorkSettings, truncate_utf8,
};
use crate::retention::Retention;

/// Bumped when the on-disk layout changes incompatibly.
pub(crate) const FORMAT_VERSION: u8 = 2;
const FORMAT_MAGIC: &[u8] = b"rockq";

pub(crate) fn encode_format() -> Vec<u8> {
    [FORMAT_MAGIC, &[FORMAT_VERSION]].concat()
}

/// Returns the format version, or `None` if the value is not a rockq marker at all.
pub(crate) fn decode_format(value: &[u8]) -> Option<u8> {
    match value.strip_prefix(FORMAT_MAGIC) {
        Some([v]) => Some(*v),
        _ => None,
    }
}

/// `queue:<name>` → the queue's numeric id, first live sequence and retention policy:
/// `version u8, id u32, first_seq u64, policy kind u8, policy value u64` (version 2; version 1
/// ends after `first_seq` and reads as the default policy). Version 3 adds the dedup window,
/// `u64` µs, at the end (versions 1 and 2 read with the default window).
const QUEUE_RECORD_V1: u8 = 1;
const QUEUE_RECORD_V2: u8 = 2;
const QUEUE_RECORD_V3: u8 = 3;

pub(crate) fn encode_queue(q: &QueueMeta) -> [u8; 30] {
    let mut v = [0u8; 30];
    v[0] = QUEUE_RECORD_V3;
    v[1..5].copy_from_slice(&q.id.to_be_bytes());
    v[5..13].copy_from_slice(&q.first_seq.to_be_bytes());
    let (kind, value) = match q.retention {
        Retention::UntilAcked => (0u8, 0u64),
        Retention::MaxAge(d) => (1, d.as_micros().min(u64::MAX as u128) as u64),
        Retention::MaxLen(n) => (2, n),
        Retention::Forever => (3, 0),
    };
    v[13] = kind;
    v[14..22].copy_from_slice(&value.to_be_bytes());
    v[22..].copy_from_slice(&(q.dedup_window.as_micros().min(u128::from(u64::MAX)) as u64).to_be_bytes());
    v
}

pub(crate) fn decode_queue(key: &[u8], v: &[u8]) -> Result<QueueMeta, CorruptionError> {
    let bad = |r: &str| CorruptionError::new("queue", key, r);
    let u64_at = |i: usize| be_u64(v, i).ok_or_else(|| bad("truncated"));
    let retention = match (v.first(), v.len()) {
        (Some(&QUEUE_RECORD_V1), 13) => Retention::default(),
        (Some(&QUEUE_RECORD_V2), 22) | (Some(&QUEUE_RECORD_V3), 30) => match v.get(13) {
            Some(0) => Retention::UntilAcked,
            Some(1) => Retention::MaxAge(std::time::Duration::from_micros(u64_at(14)?)),
            Some(2) => Retention::MaxLen(u64_at(14)?),
            Some(3) => Retention::Forever,
            _ => return Err(bad("unknown retention policy")),
        },
        (Some(&QUEUE_RECORD_V1 | &QUEUE_RECORD_V2 | &QUEUE_RECORD_V3), _) => {
            return Err(bad("wrong length for its version"));
        }
        _ => return Err(bad("unknown version")),
    };
    let id = be_u32(v, 1).ok_or_else(|| bad("truncated"))?;
    let first_seq = u64_at(5)?;
    if id == 0 || id == u32::MAX || first_seq == 0 {
        return Err(bad("id or first sequence out of range"));
    }
    let dedup_window = match v.first() {
        Some(&QUEUE_RECORD_V3) => std::time::Duration::from_micros(u64_at(22)?),
        _ => crate::model::DEFAULT_DEDUP_WINDOW,
    };
    Ok(QueueMeta { id, first_seq, retention, dedup_window })
}

/// `consumer:<group>:<queue>` → `version u8, committed u64`. The version is the group's mode:
/// 1 ordered, 2 work-queue; the two modes keep different state, so a name cannot silently
/// switch between them.
const OFFSET_RECORD_ORDERED: u8 = 1;
const OFFSET_RECORD_WORK: u8 = 2;

pub(crate) fn encode_offset(o: &GroupOffset) -> [u8; 9] {
    let version = match o.mode {
        GroupMode::Ordered => OFFSET_RECORD_ORDERED,
        GroupMode::WorkQueue => OFFSET_RECORD_WORK,
    };
    let mut v = [0u8; 9];
    v[0] = version;
    v[1..].copy_from_slice(&o.committed.to_be_bytes());
    v
}

pub(crate) fn decode_offset(key: &[u8], v: &[u8]) -> Result<GroupOffset, CorruptionError> {
    let bad = |r: &str| CorruptionError::new("offset", key, r);
    let v: &[u8; 9] = v.try_into().map_err(|_| bad("length is not 9"))?;
    let mode = match v[0] {
        OFFSET_RECORD_ORDERED => GroupMode::Ordered,
        OFFSET_RECORD_WORK => GroupMode::WorkQueue,
        _ => return Err(bad("unknown version")),
    };
    let mut s = [0u8; 8];
    s.copy_from_slice(&v[1..]);
    Ok(GroupOffset { mode, committed: u64::from_be_bytes(s) })
}

/// `redrive:<dlq>` → the last dead-letter sequence moved out. Same layout as an ordered offset.
pub(crate) fn encode_cursor(last: u64) -> [u8; 9] {
    encode_offset(&GroupOffset { mode: GroupMode::Ordered, committed: last })
}

pub(crate) fn decode_cursor(key: &[u8], v: &[u8]) -> Result<u64, CorruptionError> {
    match decode_offset(key, v)? {
        GroupOffset { mode: GroupMode::Ordered, committed } => Ok(committed),
        _ => Err(CorruptionError::new("redrive cursor", key, "unknown version")),
    }
}

/// The state byte of a claim record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ClaimState {
    Leased = 1,
    Waiting = 2,
    Done = 3,
}

/// `claim:<group>:<queue>:<seq>` in `rockq.claims`, as laid out on disk: one flat record for
/// every state (fields a state does not use are zero or empty). [`Claim`] is what the engine
/// sees.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ClaimRecord {
    pub state: ClaimState,
    /// Attempts started, counting the current one.
    pub attempt: u32,
    /// Fencing token of the holder of the current attempt.
    pub token: u64,
    /// Lease deadline, wall-clock microseconds since the Unix epoch (Leased only).
    pub deadline_micros: u64,
    /// Earliest redelivery, wall-clock microseconds (Waiting only).
    pub not_before_micros: u64,
    pub last_error: String,
    /// Who holds the current attempt (empty for records written before version 2, and when
    /// nobody holds it).
    pub holder: Arc<str>,
}

const CLAIM_RECORD_V1: u8 = 1;
/// Version 2 appends the holder: `<len u8><utf-8>`.
const CLAIM_RECORD_V2: u8 = 2;
const CLAIM_HEADER: usize = 1 + 1 + 4 + 8 + 8 + 8 + 4;

impl ClaimRecord {
    fn of(c: &Claim) -> Self {
        let empty = || Arc::from("");
        match c {
            Claim::Leased { attempt, token, deadline_micros, holder } => ClaimRecord {
                state: ClaimState::Leased,
                attempt: *attempt,
                token: *token,
                deadline_micros: *deadline_micros,
                not_before_micros: 0,
                last_error: String::new(),
                holder: holder.clone(),
            },
            Claim::Waiting { attempt, token, not_before_micros, last_error } => ClaimRecord {
                state: ClaimState::Waiting,
                attempt: *attempt,
                token: *token,
                deadline_micros: 0,
                not_before_micros: *not_before_micros,
                last_error: last_error.clone(),
                holder: empty(),
            },
            Claim::Done => ClaimRecord {
                state: ClaimState::Done,
                attempt: 0,
                token: 0,
                deadline_micros: 0,
                not_before_micros: 0,
                last_error: String::new(),
                holder: empty(),
            },
        }
    }

    fn claim(self) -> Claim {
        match self.state {
            ClaimState::Leased => Claim::Leased {
                attempt: self.attempt,
                token: self.token,
                deadline_micros: self.deadline_micros,
                holder: self.holder,
            },
            ClaimState::Waiting => Claim::Waiting {
                attempt: self.attempt,
                token: self.token,
                not_before_micros: self.not_before_micros,
                last_error: self.last_error,
            },
            ClaimState::Done => Claim::Done,
        }
    }

    pub fn encode(&self) -> Vec<u8> {
        let err = truncate_utf8(&self.last_error, MAX_ERROR_BYTES).as_bytes();
        let holder = truncate_utf8(&self.holder, MAX_HOLDER_BYTES).as_bytes();
        let mut v = Vec::with_capacity(CLAIM_HEADER + err.len() + 1 + holder.len());
        v.push(CLAIM_RECORD_V2);
        v.push(self.state as u8);
        v.extend_from_slice(&self.attempt.to_be_bytes());
        v.extend_from_slice(&self.token.to_be_bytes());
        v.extend_from_slice(&self.deadline_micros.to_be_bytes());
        v.extend_from_slice(&self.not_before_micros.to_be_bytes());
        v.extend_from_slice(&(err.len() as u32).to_be_bytes());
        v.extend_from_slice(err);
        v.push(holder.len() as u8);
        v.extend_from_slice(holder);
        v
    }

    pub fn decode(key: &[u8], v: &[u8]) -> Result<Self, CorruptionError> {
        let bad = |r: &str| CorruptionError::new("claim", key, r);
        if v.len() < CLAIM_HEADER {
            return Err(bad("shorter than the fixed header"));
        }
        let version = v.first().copied();
        if version != Some(CLAIM_RECORD_V1) && version != Some(CLAIM_RECORD_V2) {
            return Err(bad("unknown version"));
        }
        let state = match v.get(1) {
            Some(1) => ClaimState::Leased,
            Some(2) => ClaimState::Waiting,
            Some(3) => ClaimState::Done,
            _ => return Err(bad("unknown state")),
        };
        let u32_at = |i: usize| be_u32(v, i).ok_or_else(|| bad("truncated"));
        let u64_at = |i: usize| be_u64(v, i).ok_or_else(|| bad("truncated"));
        let err_len = u32_at(30)? as usize;
        let err_end = CLAIM_HEADER.checked_add(err_len).filter(|&e| e <= v.len());
        let Some(err_end) = err_end else { return Err(bad("error text length does not match")) };
        let holder = if version == Some(CLAIM_RECORD_V1) {
            if v.len() != err_end {
                return Err(bad("error text length does not match"));
            }
            Arc::from("")
        } else {
            let Some(&len) = v.get(err_end) else { return Err(bad("holder length missing")) };
            if v.len() != err_end + 1 + len as usize {
                return Err(bad("holder length does not match"));
            }
            let holder = v.get(err_end + 1..).unwrap_or_default();
            std::str::from_utf8(holder).map_err(|_| bad("holder is not UTF-8"))?.into()
        };
        let last_error = v.get(CLAIM_HEADER..err_end).ok_or_else(|| bad("truncated"))?;
        let last_error =
            std::str::from_utf8(last_error).map_err(|_| bad("error text is not UTF-8"))?.to_owned();
        Ok(ClaimRecord {
            state,
            attempt: u32_at(2)?,
            token: u64_at(6)?,
            deadline_micros: u64_at(14)?,
            not_before_micros: u64_at(22)?,
            last_error,
            holder,
        })
    }
}

pub(crate) fn encode_claim(c: &Claim) -> Vec<u8> {
    ClaimRecord::of(c).encode()
}

pub(crate) fn decode_claim(key: &[u8], v: &[u8]) -> Result<Claim, CorruptionError> {
    ClaimRecord::decode(key, v).map(ClaimRecord::claim)
}

/// `ordered:<group>:<queue>:<seq>` in the claims CF, as laid out on disk: `version u8, state u8
/// (1 came back, 2 dead-lettered, 3 acked by a transaction), deliveries u32, not_before µs
/// u64`. [`OrderedMark`] is what the engine sees. Written only when a delivery comes back
/// without an ack, when the message is dead-lettered, or when a transaction acks it above a
/// delivery still out; deleted once the offset passes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct MarkRecord {
    /// 1 came back, 2 dead-lettered, 3 acked by a transaction.
    pub state: u8,
    pub deliveries: u32,
    /// Not to be delivered again before this wall-clock time (µs; 0: at once). Written as 0
    /// for a mark of a message that is done, which nothing delivers again.
    pub not_before_micros: u64,
}

const MARK_RECORD_V1: u8 = 1;
pub(crate) const MARK_RECORD_LEN: usize = 14;

impl MarkRecord {
    fn of(m: &OrderedMark) -> Self {
        match *m {
            OrderedMark::CameBack { deliveries, not_before_micros } => {
                MarkRecord { state: 1, deliveries, not_before_micros }
            }
            OrderedMark::DeadLettered { deliveries } => {
                MarkRecord { state: 2, deliveries, not_before_micros: 0 }
            }
            OrderedMark::Acked => MarkRecord { state: 3, deliveries: 0, not_before_micros: 0 },
        }
    }

    fn mark(self) -> OrderedMark {
        let MarkRecord { state, deliveries, not_before_micros } = self;
        match state {
            1 => OrderedMark::CameBack { deliveries, not_before_micros },
            2 => OrderedMark::DeadLettered { deliveries },
            _ => OrderedMark::Acked,
        }
    }

    pub fn encode(&self) -> [u8; MARK_RECORD_LEN] {
        let mut v = [0u8; MARK_RECORD_LEN];
        v[0] = MARK_RECORD_V1;
        v[1] = self.state;
        v[2..6].copy_from_slice(&self.deliveries.to_be_bytes());
        v[6..].copy_from_slice(&self.not_before_micros.to_be_bytes());
        v
    }

    pub fn decode(key: &[u8], v: &[u8]) -> Result<Self, CorruptionError> {
        let bad = |r: &str| CorruptionError::new("delivery", key, r);
        let v: &[u8; MARK_RECORD_LEN] = v.try_into().map_err(|_| bad("wrong length"))?;
        if v[0] != MARK_RECORD_V1 {
            return Err(bad("unknown version"));
        }
        if !(1..=3).contains(&v[1]) {
            return Err(bad("unknown state"));
        }
        let mut nb = [0u8; 8];
        nb.copy_from_slice(&v[6..]);
        Ok(MarkRecord {
            state: v[1],
            deliveries: u32::from_be_bytes([v[2], v[3], v[4], v[5]]),
            not_before_micros: u64::from_be_bytes(nb),
        })
    }
}

pub(crate) fn encode_mark(m: &OrderedMark) -> [u8; MARK_RECORD_LEN] {
    MarkRecord::of(m).encode()
}

pub(crate) fn decode_mark(key: &[u8], v: &[u8]) -> Result<OrderedMark, CorruptionError> {
    MarkRecord::decode(key, v).map(MarkRecord::mark)
}

/// `group:<group>:<queue>` in the meta CF: `version u8, paused u8, dlq length u8, dlq utf-8`
/// (version 1), then, from version 2, `terms u8` (0: none stored, 1: a work group's terms
/// follow): `lease ns u64, max attempts u32, initial backoff ns u64, max backoff ns u64,
/// multiplier f64 bits u64, jitter f64 bits u64, ordered by key u8`. Durations are whole
/// nanoseconds, so a stored value compares equal to the one a handle sets (each is at most 100
/// years, which fits). Version 1 reads as "no terms stored". Version 3 (written only for a
/// group that keeps outcomes, so a group that does not stays readable by older builds) appends
/// `keep outcomes ns u64` to the terms. Version 4 (written only for a group with a rate or
/// concurrency limit, for the same reason) appends, after the outcome retention (0: none),
/// `rate jobs u32, rate window ns u64, rate burst u32, concurrency u32, per key u32` (0 jobs:
/// no rate limit; 0 concurrency or per key: none).
const GROUP_SETTINGS_V1: u8 = 1;
const GROUP_SETTINGS_V2: u8 = 2;
const GROUP_SETTINGS_V3: u8 = 3;
const GROUP_SETTINGS_V4: u8 = 4;
const WORK_TERMS_LEN: usize = 8 + 4 + 8 + 8 + 8 + 8 + 1;
const WORK_TERMS_V3_LEN: usize = WORK_TERMS_LEN + 8;
const WORK_TERMS_V4_LEN: usize = WORK_TERMS_V3_LEN + 4 + 8 + 4 + 4 + 4;

pub(crate) fn encode_settings(s: &GroupSettings) -> Vec<u8> {
    let dlq = truncate_utf8(&s.dead_letter_queue, 255).as_bytes();
    let keeps = s.work.as_ref().is_some_and(|t| !t.keep_outcomes.is_zero());
    let limits = s.work.as_ref().is_some_and(|t| {
        t.rate_limit.is_some() || t.concurrency_limit.is_some() || t.per_key_limit.is_some()
    });
    let mut v = Vec::with_capacity(4 + dlq.len() + WORK_TERMS_V4_LEN);
    v.push(match (limits, keeps) {
        (true, _) => GROUP_SETTINGS_V4,
        (false, true) => GROUP_SETTINGS_V3,
        (false, false) => GROUP_SETTINGS_V2,
    });
    v.push(u8::from(s.paused));
    v.push(dlq.len() as u8);
    v.extend_from_slice(dlq);
    match &s.work {
        None => v.push(0),
        Some(t) => {
            v.push(1);
            let nanos = |d: std::time::Duration| d.as_nanos().min(u128::from(u64::MAX)) as u64;
            v.extend_from_slice(&nanos(t.lease).to_be_bytes());
            v.extend_from_slice(&t.policy.attempts().to_be_bytes());
            v.extend_from_slice(&nanos(t.policy.initial_delay()).to_be_bytes());
            v.extend_from_slice(&nanos(t.policy.max_delay()).to_be_bytes());
            v.extend_from_slice(&t.policy.growth().to_bits().to_be_bytes());
            v.extend_from_slice(&t.policy.jitter_fraction().to_bits().to_be_bytes());
            v.push(u8::from(t.ordered_by_key));
            if keeps || limits {
                v.extend_from_slice(&nanos(t.keep_outcomes).to_be_bytes());
            }
            if limits {
                let rate = t.rate_limit.unwrap_or(crate::rate_limit::RateLimit {
                    jobs: 0,
                    per: std::time::Duration::ZERO,
                    burst: 0,
                });
                v.extend_from_slice(&rate.jobs.to_be_bytes());
                v.extend_from_slice(&nanos(rate.per).to_be_bytes());
                v.extend_from_slice(&rate.burst.to_be_bytes());
                v.extend_from_slice(&t.concurrency_limit.unwrap_or(0).to_be_bytes());
                v.extend_from_slice(&t.per_key_limit.unwrap_or(0).to_be_bytes());
            }
        }
    }
    v
}

pub(crate) fn decode_settings(key: &[u8], v: &[u8]) -> Result<GroupSettings, CorruptionError> {
    let bad = |r: &str| CorruptionError::new("group settings", key, r);
    let [version, paused, len, rest @ ..] = v else { return Err(bad("shorter than the header")) };
    if !(GROUP_SETTINGS_V1..=GROUP_SETTINGS_V4).contains(version) {
        return Err(bad("unknown version"));
    }
    let paused = match paused {
        0 => false,
        1 => true,
        _ => return Err(bad("paused flag is not 0 or 1")),
    };
    let (dlq, terms) = match *version {
        GROUP_SETTINGS_V1 if rest.len() == *len as usize => (rest, &[][..]),
        GROUP_SETTINGS_V2 | GROUP_SETTINGS_V3 | GROUP_SETTINGS_V4 if rest.len() > *len as usize => {
            rest.split_at(*len as usize)
        }
        _ => return Err(bad("dead-letter queue length does not match")),
    };
    let dlq = std::str::from_utf8(dlq).map_err(|_| bad("dead-letter queue is not UTF-8"))?;
    let work = match terms {
        [] | [0] => None,
        [1, t @ ..] if *version == GROUP_SETTINGS_V2 && t.len() == WORK_TERMS_LEN => {
            Some(decode_terms(t, dlq).ok_or_else(|| bad("work terms out of range"))?)
        }
        [1, t @ ..] if *version == GROUP_SETTINGS_V3 && t.len() == WORK_TERMS_V3_LEN => {
            let (t, kept) = t.split_at(WORK_TERMS_LEN);
            let keep_outcomes = decode_retention(kept).filter(|d| !d.is_zero());
            let terms = decode_terms(t, dlq).zip(keep_outcomes);
            let (terms, keep_outcomes) = terms.ok_or_else(|| bad("work terms out of range"))?;
            Some(WorkSettings { keep_outcomes, ..terms })
        }
        [1, t @ ..] if *version == GROUP_SETTINGS_V4 && t.len() == WORK_TERMS_V4_LEN => {
            let (t, rest) = t.split_at(WORK_TERMS_LEN);
            let (kept, limits) = rest.split_at(8);
            let terms = decode_terms(t, dlq).zip(decode_retention(kept));
            let (terms, keep_outcomes) = terms.ok_or_else(|| bad("work terms out of range"))?;
            let (rate_limit, concurrency_limit, per_key_limit) =
                decode_limits(limits).ok_or_else(|| bad("a limit out of range"))?;
            if rate_limit.is_none() && concurrency_limit.is_none() && per_key_limit.is_none() {
                return Err(bad("version 4 without a limit"));
            }
            if per_key_limit.is_some() && terms.ordered_by_key {
                return Err(bad("a per-key limit on a group ordered by key"));
            }
            Some(WorkSettings { keep_outcomes, rate_limit, concurrency_limit, per_key_limit, ..terms })
        }
        _ => return Err(bad("work terms flag or length is wrong")),
    };
    // A version-1 record has no terms byte; a version-2 one always has it.
    if *version != GROUP_SETTINGS_V1 && terms.is_empty() {
        return Err(bad("work terms flag missing"));
    }
    // Versions 3 and 4 are written only for a work group's terms.
    if *version >= GROUP_SETTINGS_V3 && work.is_none() {
        return Err(bad("version 3 or 4 without work terms"));
    }
    Ok(GroupSettings { paused, dead_letter_queue: dlq.to_owned(), work })
}

/// `rate:<group>:<queue>` in the claims CF: `version u8 (1), next claim's theoretical time
/// (wall-clock micros) u64` — a rate-limited group's bucket (`rate_limit.rs`).
const RATE_RECORD_V1: u8 = 1;

pub(crate) fn encode_rate(tat_micros: u64) -> [u8; 9] {
    let mut v = [0u8; 9];
    v[0] = RATE_RECORD_V1;
    v[1..].copy_from_slice(&tat_micros.to_be_bytes());
    v
}

pub(crate) fn decode_rate(key: &[u8], v: &[u8]) -> Result<u64, CorruptionError> {
    match v {
        [RATE_RECORD_V1, rest @ ..] if rest.len() == 8 => {
            be_u64(rest, 0).ok_or_else(|| CorruptionError::new("rate bucket", key, "too short"))
        }
        [RATE_RECORD_V1, ..] => Err(CorruptionError::new("rate bucket", key, "wrong length")),
        _ => Err(CorruptionError::new("rate bucket", key, "unknown version")),
    }
}

/// An outcome retention (8 bytes: nanoseconds, 0: none), if one a handle can set.
fn decode_retention(v: &[u8]) -> Option<std::time::Duration> {
    let max = crate::clock::clamp_delay(std::time::Duration::MAX);
    be_u64(v, 0).map(std::time::Duration::from_nanos).filter(|d| *d <= max)
}

/// A version-4 record's limits (24 bytes), if each is one a handle can store.
type Limits = (Option<crate::rate_limit::RateLimit>, Option<u32>, Option<u32>);
fn decode_limits(v: &[u8]) -> Option<Limits> {
    let (jobs, per, burst) = (be_u32(v, 0)?, be_u64(v, 4)?, be_u32(v, 12)?);
    let (concurrency, per_key) = (be_u32(v, 16)?, be_u32(v, 20)?);
    if per_key > crate::model::MAX_PER_KEY_LIMIT {
        return None;
    }
    let rate = match (jobs, per, burst) {
        (0, 0, 0) => None,
        _ => {
            let rate =
                crate::rate_limit::RateLimit { jobs, per: std::time::Duration::from_nanos(per), burst };
            if rate.invalid().is_some() {
                return None;
            }
            Some(rate)
        }
    };
    Some((rate, (concurrency != 0).then_some(concurrency), (per_key != 0).then_some(per_key)))
}

/// A work group's terms (`WORK_TERMS_LEN` bytes) with the record's dead-letter queue `dlq`, if
/// every field is one a handle can set.
fn decode_terms(t: &[u8], dlq: &str) -> Option<WorkSettings> {
    let nanos = |i| be_u64(t, i).map(std::time::Duration::from_nanos);
    let lease = nanos(0)?;
    let policy = crate::retry::RetryPolicy::from_parts(
        be_u32(t, 8)?,
        nanos(12)?,
        nanos(20)?,
        f64::from_bits(be_u64(t, 28)?),
        f64::from_bits(be_u64(t, 36)?),
    );
    let ordered_by_key = match t.get(44)? {
        0 => false,
        1 => true,
        _ => return None,
    };
    let max = crate::clock::clamp_delay(std::time::Duration::MAX);
    let lease_ok = (crate::model::MIN_LEASE..=max).contains(&lease);
    (lease_ok && policy.is_valid()).then(|| WorkSettings {
        lease,
        policy,
        dead_letter_queue: Arc::from(dlq),
        ordered_by_key,
        keep_outcomes: std::time::Duration::ZERO,
        rate_limit: None,
        concurrency_limit: None,
        per_key_limit: None,
    })
}

/// The big-endian `u32` at `i`, if the record is long enough (decoders never index: a short
/// record is a corruption, not a panic).
fn be_u32(v: &[u8], i: usize) -> Option<u32> {
    v.get(i..i.checked_add(4)?)?.try_into().ok().map(u32::from_be_bytes)
}

/// The big-endian `u64` at `i`, if the record is long enough.
fn be_u64(v: &[u8], i: usize) -> Option<u64> {
    v.get(i..i.checked_add(8)?)?.try_into().ok().map(u64::from_be_bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_and_reject_bad_bytes() {
        for retention in [
            Retention::UntilAcked,
            Retention::MaxAge(std::time::Duration::from_secs(90)),
            Retention::MaxLen(1000),
            Retention::Forever,
        ] {
            let q = QueueMeta {
                id: 7,
                first_seq: 42,
                retention,
                dedup_window: std::time::Duration::from_secs(9),
            };
            assert_eq!(decode_queue(b"k", &encode_queue(&q)).unwrap(), q);
            for cut in 0..30 {
                assert!(decode_queue(b"k", &encode_queue(&q)[..cut]).is_err());
            }
        }
        let q = QueueMeta {
            id: 7,
            first_seq: 42,
            retention: Retention::Forever,
            dedup_window: crate::model::DEFAULT_DEDUP_WINDOW,
        };
        let mut zero_id = encode_queue(&q);
        zero_id[1..5].fill(0);
        assert!(decode_queue(b"k", &zero_id).is_err());
        let mut bad_kind = encode_queue(&q);
        bad_kind[13] = 9;
        assert!(decode_queue(b"k", &bad_kind).is_err());
        // A version-1 record (before retention) reads with the default policy.
        let mut v1 = vec![1u8];
        v1.extend_from_slice(&7u32.to_be_bytes());
        v1.extend_from_slice(&42u64.to_be_bytes());
        let d = decode_queue(b"k", &v1).unwrap();
        assert_eq!((d.id, d.first_seq, d.retention), (7, 42, Retention::UntilAcked));

        let ordered = GroupOffset { mode: GroupMode::Ordered, committed: 99 };
        assert_eq!(decode_offset(b"k", &encode_offset(&ordered)).unwrap(), ordered);
        let work = GroupOffset { mode: GroupMode::WorkQueue, committed: 7 };
        assert_eq!(decode_offset(b"k", &encode_offset(&work)).unwrap(), work);
        assert_eq!(encode_offset(&ordered)[0], 1, "ordered offsets are version 1 on disk");
        assert_eq!(encode_offset(&work)[0], 2, "work-queue offsets are version 2 on disk");
        assert!(decode_offset(b"k", &[9; 9]).is_err());
        assert_eq!(decode_cursor(b"k", &encode_cursor(5)).unwrap(), 5);
        assert!(decode_cursor(b"k", &encode_offset(&work)).is_err());
        assert!(decode_offset(b"k", &[]).is_err());

        assert_eq!(decode_format(&encode_format()), Some(FORMAT_VERSION));
        assert_eq!(decode_format(b"rockq"), None);
        assert_eq!(decode_format(b"other1"), None);
    }

    #[test]
    fn claim_records_round_trip_and_reject_bad_bytes() {
        let c = ClaimRecord {
            state: ClaimState::Waiting,
            attempt: 3,
            token: 0xdead_beef,
            deadline_micros: 11,
            not_before_micros: 22,
            last_error: "boom é".into(),
            holder: "worker-1".into(),
        };
        let v = c.encode();
        assert_eq!(ClaimRecord::decode(b"k", &v).unwrap(), c);
        for cut in 0..v.len() {
            assert!(ClaimRecord::decode(b"k", &v[..cut]).is_err(), "cut at {cut}");
        }
        let mut bad_state = v.clone();
        bad_state[1] = 9;
        assert!(ClaimRecord::decode(b"k", &bad_state).is_err());
        let mut bad_utf8 = v.clone();
        let n = bad_utf8.len();
        bad_utf8[n - 1] = 0xff;
        assert!(ClaimRecord::decode(b"k", &bad_utf8).is_err());
        let long = ClaimRecord {
            last_error: "é".repeat(MAX_ERROR_BYTES),
            holder: "h".repeat(300).into(),
            ..c.clone()
        };
        let decoded = ClaimRecord::decode(b"k", &long.encode()).unwrap();
        assert!(decoded.last_error.len() <= MAX_ERROR_BYTES);
        assert_eq!(decoded.holder.len(), MAX_HOLDER_BYTES);
        // A version-1 record (before holders) still reads, with no holder.
        let mut v1 = c.encode();
        v1.truncate(v1.len() - 1 - c.holder.len());
        v1[0] = 1;
        assert_eq!(ClaimRecord::decode(b"k", &v1).unwrap(), ClaimRecord { holder: "".into(), ..c });
    }

    #[test]
    fn claims_map_to_their_records_and_back() {
        let claims = [
            Claim::Leased { attempt: 2, token: 9, deadline_micros: 77, holder: "w-1".into() },
            Claim::Waiting { attempt: 3, token: 9, not_before_micros: 88, last_error: "boom".into() },
            Claim::Done,
        ];
        for c in claims {
            assert_eq!(decode_claim(b"k", &encode_claim(&c)).unwrap(), c);
        }
        // The state byte and the fields each state uses sit where format 1 put them.
        let leased =
            encode_claim(&Claim::Leased { attempt: 2, token: 9, deadline_micros: 77, holder: "w".into() });
        assert_eq!(leased[..2], [CLAIM_RECORD_V2, ClaimState::Leased as u8]);
        assert_eq!(leased[2..6], 2u32.to_be_bytes());
        assert_eq!(leased[14..22], 77u64.to_be_bytes());
    }

    #[test]
    fn ordered_marks_round_trip_and_reject_bad_bytes() {
        for m in [
            OrderedMark::CameBack { deliveries: 3, not_before_micros: 0 },
            OrderedMark::CameBack { deliveries: u32::MAX, not_before_micros: u64::MAX },
            OrderedMark::DeadLettered { deliveries: 7 },
            OrderedMark::Acked,
        ] {
            let v = encode_mark(&m);
            assert_eq!(decode_mark(b"k", &v).unwrap(), m);
            for cut in 0..v.len() {
                assert!(decode_mark(b"k", &v[..cut]).is_err());
            }
            let mut bad = v;
            bad[1] = 9;
            assert!(decode_mark(b"k", &bad).is_err());
            let mut bad = v;
            bad[0] = 9;
            assert!(decode_mark(b"k", &bad).is_err());
        }
    }

    #[test]
    fn group_settings_round_trip_and_reject_bad_bytes() {
        let terms = WorkSettings {
            lease: std::time::Duration::new(45, 123),
            policy: crate::retry::RetryPolicy::default().max_attempts(3).multiplier(1.5).jitter(0.0),
            dead_letter_queue: Arc::from("orders.dlq"),
            ordered_by_key: true,
            keep_outcomes: std::time::Duration::ZERO,
            rate_limit: None,
            concurrency_limit: None,
            per_key_limit: None,
        };
        let keeping = WorkSettings { keep_outcomes: std::time::Duration::from_secs(3600), ..terms.clone() };
        let rate = crate::rate_limit::RateLimit::new(7, std::time::Duration::from_millis(1500)).burst(3);
        let limited = WorkSettings { rate_limit: Some(rate), ..terms.clone() };
        let capped = WorkSettings { concurrency_limit: Some(4), ..keeping.clone() };
        let both = WorkSettings { rate_limit: Some(rate), concurrency_limit: Some(1), ..keeping.clone() };
        let per_key = WorkSettings { ordered_by_key: false, per_key_limit: Some(3), ..terms.clone() };
        for (s, version) in [
            (GroupSettings { paused: true, dead_letter_queue: "orders.dlq".into(), work: None }, 2),
            (GroupSettings { paused: false, dead_letter_queue: "orders.dlq".into(), work: Some(terms) }, 2),
            (GroupSettings { paused: false, dead_letter_queue: "orders.dlq".into(), work: Some(keeping) }, 3),
            (GroupSettings { paused: false, dead_letter_queue: "orders.dlq".into(), work: Some(limited) }, 4),
            (GroupSettings { paused: true, dead_letter_queue: "orders.dlq".into(), work: Some(capped) }, 4),
            (GroupSettings { paused: false, dead_letter_queue: "orders.dlq".into(), work: Some(both) }, 4),
            (GroupSettings { paused: false, dead_letter_queue: "orders.dlq".into(), work: Some(per_key) }, 4),
        ] {
            let v = encode_settings(&s);
            assert_eq!(v[0], version, "a group that keeps no outcomes is written as older builds read it");
            assert_eq!(decode_settings(b"k", &v).unwrap(), s);
            for cut in 0..v.len() {
                assert!(decode_settings(b"k", &v[..cut]).is_err(), "cut at {cut}");
            }
            let mut bad_flag = v.clone();
            bad_flag[1] = 2;
            assert!(decode_settings(b"k", &bad_flag).is_err());
            let mut bad_version = v.clone();
            bad_version[0] = 9;
            assert!(decode_settings(b"k", &bad_version).is_err());
            let mut longer = v;
            longer.push(0);
            assert!(decode_settings(b"k", &longer).is_err());
        }
        assert_eq!(
            decode_settings(b"k", &encode_settings(&GroupSettings::default())).unwrap(),
            GroupSettings::default()
        );
    }

    /// The version-2 layout, byte for byte: a change here is a format change.
    #[test]
    fn group_settings_version_2_layout_is_pinned() {
        let terms = WorkSettings {
            lease: std::time::Duration::from_secs(2),
            policy: crate::retry::RetryPolicy::default()
                .max_attempts(3)
                .backoff(std::time::Duration::from_secs(1), std::time::Duration::from_secs(4))
                .multiplier(2.0)
                .jitter(0.5),
            dead_letter_queue: Arc::from("d"),
            ordered_by_key: true,
            keep_outcomes: std::time::Duration::ZERO,
            rate_limit: None,
            concurrency_limit: None,
            per_key_limit: None,
        };
        let s = GroupSettings { paused: true, dead_letter_queue: "d".into(), work: Some(terms) };
        let mut want = vec![2, 1, 1, b'd', 1];
        want.extend_from_slice(&2_000_000_000u64.to_be_bytes());
        want.extend_from_slice(&3u32.to_be_bytes());
        want.extend_from_slice(&1_000_000_000u64.to_be_bytes());
        want.extend_from_slice(&4_000_000_000u64.to_be_bytes());
        want.extend_from_slice(&2.0f64.to_bits().to_be_bytes());
        want.extend_from_slice(&0.5f64.to_bits().to_be_bytes());
        want.push(1);
        assert_eq!(encode_settings(&s), want);
        assert_eq!(decode_settings(b"k", &want).unwrap(), s);
    }

    /// Version 3 is version 2 plus the outcome retention; zero there is a corruption (a group
    /// that keeps none is written as version 2).
    #[test]
    fn group_settings_version_3_appends_the_outcome_retention() {
        let terms = WorkSettings {
            lease: std::time::Duration::from_secs(2),
            policy: crate::retry::RetryPolicy::default(),
            dead_letter_queue: Arc::from(""),
            ordered_by_key: false,
            keep_outcomes: std::time::Duration::ZERO,
            rate_limit: None,
            concurrency_limit: None,
            per_key_limit: None,
        };
        let v2 = encode_settings(&GroupSettings { work: Some(terms.clone()), ..GroupSettings::default() });
        let kept = WorkSettings { keep_outcomes: std::time::Duration::from_secs(7), ..terms };
        let s = GroupSettings { work: Some(kept), ..GroupSettings::default() };
        let v3 = encode_settings(&s);
        let mut want = v2.clone();
        want[0] = 3;
        want.extend_from_slice(&7_000_000_000u64.to_be_bytes());
        assert_eq!(v3, want);
        assert_eq!(decode_settings(b"k", &v3).unwrap(), s);
        let mut zero = v2.clone();
        zero[0] = 3;
        zero.extend_from_slice(&0u64.to_be_bytes());
        assert!(decode_settings(b"k", &zero).is_err(), "zero retention in a version-3 record");
        let mut short = v2;
        short[0] = 3;
        assert!(decode_settings(b"k", &short).is_err(), "version 3 without the retention");
    }

    #[test]
    fn group_settings_of_the_first_version_still_read_without_terms() {
        let v1 = [&[GROUP_SETTINGS_V1, 1, 6][..], b"my.dlq"].concat();
        let s = decode_settings(b"k", &v1).unwrap();
        assert_eq!(s, GroupSettings { paused: true, dead_letter_queue: "my.dlq".into(), work: None });
        assert!(decode_settings(b"k", &[&v1[..], &[0]].concat()).is_err(), "v1 has no terms byte");
    }

    #[test]
    fn work_terms_out_of_range_are_corrupt() {
        let terms = WorkSettings {
            lease: std::time::Duration::from_secs(1),
            policy: crate::retry::RetryPolicy::default(),
            dead_letter_queue: Arc::from(""),
            ordered_by_key: false,
            keep_outcomes: std::time::Duration::ZERO,
            rate_limit: None,
            concurrency_limit: None,
            per_key_limit: None,
        };
        let good = encode_settings(&GroupSettings { work: Some(terms), ..GroupSettings::default() });
        let at = good.len() - WORK_TERMS_LEN;
        let patch = |i: usize, bytes: &[u8]| {
            let mut v = good.clone();
            v[at + i..at + i + bytes.len()].copy_from_slice(bytes);
            v
        };
        for (what, v) in [
            ("zero lease", patch(0, &0u64.to_be_bytes())),
            ("zero attempts", patch(8, &0u32.to_be_bytes())),
            ("NaN multiplier", patch(28, &f64::NAN.to_bits().to_be_bytes())),
            ("jitter above 1", patch(36, &2.0f64.to_bits().to_be_bytes())),
            ("max backoff below initial", patch(20, &0u64.to_be_bytes())),
            ("keyed flag 2", patch(44, &[2])),
        ] {
            assert!(decode_settings(b"k", &v).is_err(), "{what}");
        }
    }

    #[test]
    fn a_rate_bucket_round_trips_and_rejects_bad_bytes() {
        let v = encode_rate(1_700_000_000_123_456);
        assert_eq!(decode_rate(b"k", &v).unwrap(), 1_700_000_000_123_456);
        for cut in 0..v.len() {
            assert!(decode_rate(b"k", &v[..cut]).is_err());
        }
        let mut bad = v;
        bad[0] = 2;
        assert!(decode_rate(b"k", &bad).is_err());
        assert!(decode_rate(b"k", &[v.as_slice(), &[0]].concat()).is_err());
    }

    /// Version 4 is version 3 (the outcome retention, 0 allowed) plus the limits; a version-4
    /// record without a limit, or with a limit no handle can store, is a corruption.
    #[test]
    fn group_settings_version_4_appends_the_limits() {
        let terms = WorkSettings {
            lease: std::time::Duration::from_secs(2),
            policy: crate::retry::RetryPolicy::default(),
            dead_letter_queue: Arc::from(""),
            ordered_by_key: false,
            keep_outcomes: std::time::Duration::ZERO,
            rate_limit: None,
            concurrency_limit: None,
            per_key_limit: None,
        };
        let v2 = encode_settings(&GroupSettings { work: Some(terms.clone()), ..GroupSettings::default() });
        let rate = crate::rate_limit::RateLimit::new(10, std::time::Duration::from_secs(1)).burst(2);
        let limited = WorkSettings { rate_limit: Some(rate), concurrency_limit: Some(3), ..terms.clone() };
        let s = GroupSettings { work: Some(limited), ..GroupSettings::default() };
        let v4 = encode_settings(&s);
        let mut want = v2.clone();
        want[0] = 4;
        want.extend_from_slice(&0u64.to_be_bytes());
        want.extend_from_slice(&10u32.to_be_bytes());
        want.extend_from_slice(&1_000_000_000u64.to_be_bytes());
        want.extend_from_slice(&2u32.to_be_bytes());
        want.extend_from_slice(&3u32.to_be_bytes());
        want.extend_from_slice(&0u32.to_be_bytes());
        assert_eq!(v4, want);
        assert_eq!(decode_settings(b"k", &v4).unwrap(), s);
        let n = v4.len();
        let mut none = v4.clone();
        none[n - 24..].fill(0);
        assert!(decode_settings(b"k", &none).is_err(), "version 4 without a limit");
        let mut zero_burst = v4.clone();
        zero_burst[n - 12..n - 8].fill(0);
        assert!(decode_settings(b"k", &zero_burst).is_err(), "a burst of 0");
        let mut short_window = v4.clone();
        short_window[n - 20..n - 12].copy_from_slice(&1u64.to_be_bytes());
        assert!(decode_settings(b"k", &short_window).is_err(), "a window under a millisecond");
        let mut only_concurrency = v4.clone();
        only_concurrency[n - 24..n - 8].fill(0);
        let got = decode_settings(b"k", &only_concurrency).unwrap();
        assert_eq!(got.work.unwrap().rate_limit, None);
        let mut too_wide = v4;
        too_wide[n - 4..].copy_from_slice(&(crate::model::MAX_PER_KEY_LIMIT + 1).to_be_bytes());
        assert!(decode_settings(b"k", &too_wide).is_err(), "a per-key limit over the maximum");
    }
}
