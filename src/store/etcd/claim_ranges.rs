//! Range claim records: one etcd key for a run of consecutive first attempts that one claim
//! wrote, instead of a record per job.
//!
//! Why: etcd's CPU is what bounds a pool on etcd, and it is spent per key written. A job with
//! a record of its own cost three writes — its message, its claim record, and that record's
//! deletion when the offset passed it — where a range costs two per run of up to
//! [`MAX_RUN`] jobs (docs/performance.md, "What a job's claim record costs on etcd").
//!
//! | key | value |
//! | --- | --- |
//! | `N c/claim:<group>:<queue>:<last u64>` `r` | the run `last - n + 1 ..= last`: attempt, deadline, holder, each job's token |
//!
//! The key sorts right after the per-job key of its last sequence, so everything that deletes
//! the per-job records at or below an offset (the offset's move, a trim, a reset, a group's
//! deletion) deletes the runs that end there with the same range deletion.
//!
//! A job of a run that leaves the common path (a lease extension, a retry, a dead letter, an
//! ack above a gap, another process taking it over once its lease ran out) gets a per-job
//! record, which then stands for it: a write over jobs held in a run compares the run's
//! `mod_revision`, and for each stretch of consecutive ones no key in their span made since
//! (`work.rs::run_stretches`). A new run is fenced by one range compare: no key
//! among the per-job and run keys that could hold one of its jobs was created after the
//! revision through which the writer knows every record (`work.rs::ClaimsTxn::view`).

use std::sync::Arc;

use crate::error::CorruptionError;
use crate::model::Claim;
use crate::store::keys;

/// The byte after a run's last sequence in its key. Not the limit record's (`limits.rs`).
const RANGE_SUFFIX: u8 = b'r';
const _: () = assert!(RANGE_SUFFIX != super::limits::LIMIT_SUFFIX);

/// The byte after the reset mark's key that makes the key of the group's *offset echo*: the
/// offset as every move put it, under the claim prefix so that the claim watch sees a move that
/// deleted no key (an ack passing jobs whose range record ends further on).
pub(crate) const MOVED_SUFFIX: u8 = b'o';
const _: () = assert!(MOVED_SUFFIX != super::limits::LIMIT_SUFFIX && MOVED_SUFFIX != RANGE_SUFFIX);

/// Whether `key` is a group's offset echo (any group, with or without the namespace).
pub(crate) fn is_moved_key(key: &[u8]) -> bool {
    key.len() >= 9 && key.ends_with(&[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, MOVED_SUFFIX])
}

/// The most jobs one range record holds: a new run's compare looks this far past its last
/// sequence for a run that could hold one of its jobs.
pub(crate) const MAX_RUN: u64 = 64;

const RANGE_RECORD_V1: u8 = 1;

/// The key of the run ending at `last` in the group whose claim prefix is `prefix`.
pub(crate) fn range_key(prefix: &[u8], last: u64) -> Vec<u8> {
    let mut k = keys::claim_key(prefix, last);
    k.push(RANGE_SUFFIX);
    k
}

/// A key under a group's claim prefix, told apart by its length after the prefix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ClaimKey {
    /// A per-job record.
    Job(u64),
    /// A run ending at this sequence.
    Run(u64),
}

/// What `key` (under `prefix`) is; `None`: neither (the reset mark and the limit record are
/// told apart by the caller first).
pub(crate) fn parse(prefix: &[u8], key: &[u8]) -> Option<ClaimKey> {
    let rest = key.strip_prefix(prefix)?;
    let seq = |b: &[u8]| <[u8; 8]>::try_from(b).ok().map(u64::from_be_bytes);
    match rest.len() {
        8 => seq(rest).map(ClaimKey::Job),
        9 if rest[8] == RANGE_SUFFIX => seq(&rest[..8]).map(ClaimKey::Run),
        _ => None,
    }
}

/// Splits a run key of any group (`claim:<group>:<queue>:<last>` `r`, no namespace) into
/// `(group, queue, last)`; `None` if `key` is not one. A per-job key never parses as one: its
/// byte before the last nine is the first byte of its sequence, not the `:` a run key has
/// there (sequences stay below 2⁵⁶).
pub(crate) fn parse_run_key(key: &[u8]) -> Option<(&str, &str, u64)> {
    let body = key.strip_suffix(&[RANGE_SUFFIX])?;
    keys::parse_claim_key(body).ok()
}

/// A run's value: `version u8, attempt u32, deadline µs u64, holder length u8, holder, count
/// u16, first token u64`, then each later token's difference from the one before (zigzag
/// varints: tokens are taken one by one as the jobs are, so the differences are small).
pub(crate) fn encode(attempt: u32, deadline_micros: u64, holder: &str, tokens: &[u64]) -> Vec<u8> {
    let holder = crate::model::truncate_utf8(holder, crate::model::MAX_HOLDER_BYTES);
    let mut v = Vec::with_capacity(32 + holder.len() + tokens.len() * 2);
    v.push(RANGE_RECORD_V1);
    v.extend_from_slice(&attempt.to_be_bytes());
    v.extend_from_slice(&deadline_micros.to_be_bytes());
    v.push(holder.len() as u8);
    v.extend_from_slice(holder.as_bytes());
    v.extend_from_slice(&(tokens.len() as u16).to_be_bytes());
    let mut prev = tokens.first().copied().unwrap_or(0);
    v.extend_from_slice(&prev.to_be_bytes());
    for &t in tokens.iter().skip(1) {
        let d = t.wrapping_sub(prev) as i64;
        let mut z = ((d << 1) ^ (d >> 63)) as u64;
        loop {
            let byte = (z & 0x7f) as u8;
            z >>= 7;
            if z == 0 {
                v.push(byte);
                break;
            }
            v.push(byte | 0x80);
        }
        prev = t;
    }
    v
}

/// The claims of the run ending at `last` stored at `key` as `v`, first sequence first.
pub(crate) fn decode(key: &[u8], last: u64, v: &[u8]) -> Result<Vec<(u64, Claim)>, CorruptionError> {
    let bad = |why: &str| CorruptionError::new("range claim record", key, why);
    let mut at = 0usize;
    let mut take = |n: usize| -> Result<&[u8], CorruptionError> {
        let part = v.get(at..at + n).ok_or_else(|| bad("truncated"))?;
        at += n;
        Ok(part)
    };
    if take(1)? != [RANGE_RECORD_V1] {
        return Err(bad("unknown version"));
    }
    let attempt = u32::from_be_bytes(take(4)?.try_into().map_err(|_| bad("truncated"))?);
    let deadline_micros = u64::from_be_bytes(take(8)?.try_into().map_err(|_| bad("truncated"))?);
    let holder_len = take(1)?[0] as usize;
    let holder: Arc<str> =
        std::str::from_utf8(take(holder_len)?).map_err(|_| bad("holder is not UTF-8"))?.into();
    let count = u16::from_be_bytes(take(2)?.try_into().map_err(|_| bad("truncated"))?) as u64;
    if count == 0 || count > MAX_RUN || count > last.saturating_add(1) {
        return Err(bad("bad job count"));
    }
    let mut token = u64::from_be_bytes(take(8)?.try_into().map_err(|_| bad("truncated"))?);
    let first = last + 1 - count;
    let mut out = Vec::with_capacity(count as usize);
    for seq in first..=last {
        if seq > first {
            let mut z = 0u64;
            let mut shift = 0;
            loop {
                let byte = take(1)?[0];
                if shift > 63 {
                    return Err(bad("token difference too long"));
                }
                z |= u64::from(byte & 0x7f) << shift;
                shift += 7;
                if byte & 0x80 == 0 {
                    break;
                }
            }
            let d = ((z >> 1) as i64) ^ -((z & 1) as i64);
            token = token.wrapping_add(d as u64);
        }
        out.push((seq, Claim::Leased { attempt, token, deadline_micros, holder: holder.clone() }));
    }
    if at != v.len() {
        return Err(bad("trailing bytes"));
    }
    Ok(out)
}

/// The runs `claims` (new leases, sorted by sequence, none held before) are written as: the
/// index ranges of consecutive sequences leased alike (attempt, deadline, holder), of at most
/// [`MAX_RUN`] each.
pub(crate) fn runs(claims: &[(u64, &Claim)]) -> Vec<std::ops::Range<usize>> {
    let alike = |a: &Claim, b: &Claim| match (a, b) {
        (
            Claim::Leased { attempt: a1, deadline_micros: d1, holder: h1, .. },
            Claim::Leased { attempt: a2, deadline_micros: d2, holder: h2, .. },
        ) => a1 == a2 && d1 == d2 && h1 == h2,
        _ => false,
    };
    let mut out = Vec::new();
    let mut start = 0;
    for i in 1..=claims.len() {
        let ends = i == claims.len()
            || claims[i].0 != claims[i - 1].0 + 1
            || !alike(claims[i].1, claims[start].1)
            || (i - start) as u64 == MAX_RUN;
        if ends {
            out.push(start..i);
            start = i;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn leased(token: u64) -> Claim {
        Claim::Leased {
            attempt: 1,
            token,
            deadline_micros: 1_700_000_000_000_000,
            holder: Arc::from("worker-a"),
        }
    }

    #[test]
    fn a_run_round_trips_with_its_tokens_in_any_order() {
        let tokens = [7u64, 8, 9, 30, 12, u64::MAX, 0, 1];
        let v = encode(1, 1_700_000_000_000_000, "worker-a", &tokens);
        let got = decode(b"k", 107, &v).expect("decodes");
        let want: Vec<(u64, Claim)> =
            tokens.iter().enumerate().map(|(i, &t)| (100 + i as u64, leased(t))).collect();
        assert_eq!(got, want);
    }

    #[test]
    fn a_damaged_run_is_reported_not_misread() {
        let v = encode(1, 5, "h", &[1, 2, 3]);
        for cut in 0..v.len() {
            assert!(decode(b"k", 10, &v[..cut]).is_err(), "cut at {cut}");
        }
        let mut longer = v.clone();
        longer.push(0);
        assert!(decode(b"k", 10, &longer).is_err());
        // More jobs than sequences up to its last.
        assert!(decode(b"k", 1, &v).is_err());
    }

    #[test]
    fn run_keys_sort_between_the_job_keys_of_their_last_and_the_next_sequence() {
        let prefix = keys::claim_prefix("g", "q");
        let run = range_key(&prefix, 41);
        assert!(keys::claim_key(&prefix, 41) < run && run < keys::claim_key(&prefix, 42));
        assert_eq!(parse(&prefix, &run), Some(ClaimKey::Run(41)));
        assert_eq!(parse(&prefix, &keys::claim_key(&prefix, 41)), Some(ClaimKey::Job(41)));
        assert_eq!(parse_run_key(&run), Some(("g", "q", 41)));
        // A per-job key whose sequence ends in the suffix byte is no run key.
        assert_eq!(parse_run_key(&keys::claim_key(&prefix, u64::from(RANGE_SUFFIX))), None);
        assert!(!crate::store::etcd::limits::is_limit_key(&run));
    }

    #[test]
    fn runs_break_at_gaps_at_unlike_leases_and_at_the_longest_run() {
        let same: Vec<Claim> = (0..200).map(leased).collect();
        let mut claims: Vec<(u64, &Claim)> = (0..150).map(|i| (10 + i, &same[i as usize])).collect();
        claims.push((200, &same[150]));
        let other = Claim::Leased { attempt: 2, token: 9, deadline_micros: 1, holder: Arc::from("worker-a") };
        claims.push((201, &other));
        let lens: Vec<usize> = runs(&claims).iter().map(|r| r.len()).collect();
        assert_eq!(lens, vec![64, 64, 22, 1, 1]);
    }
}
