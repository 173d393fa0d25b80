//! Send calls larger than one etcd transaction, the writer's side: reserve the sequences after
//! the tail, write the messages beyond the first transaction's share under the reservation,
//! then commit (the first messages, the tail, the idempotency keys, the reservation deleted)
//! in one transaction. The protocol and why it is safe: `store/etcd/reserve.rs`.
//!
//! While a reservation stands, every other append to the queue, in every process, waits: a
//! call of `n` messages holds the queue for about `n / 127` transactions. A process that dies
//! while holding one holds the queue until the reservation's lease runs out
//! ([`RESERVATION_TTL`]).

use std::ops::Range;
use std::time::{Duration, Instant};

use super::side::{retrying, until};
use super::writer::Writer;
use crate::error::StorageError;
use crate::store::etcd::reserve::{Committed, Reservation, Reserved};
use crate::store::etcd::{DedupWrite, MAX_TXN_BYTES, MAX_TXN_OPS};

/// Idempotency keys and prioritised messages one send call holds at most together: their
/// records and index entries all go in the transaction that makes the call visible, beside
/// its tail, the reservation's deletion and at least one message.
pub(crate) const MAX_KEYS_PER_CALL: usize = MAX_TXN_OPS - 3;

/// How long a reservation outlives its holder: renewed while the holder writes.
pub(crate) const RESERVATION_TTL: Duration = Duration::from_secs(5);

/// What became of a reserved append (`append_reserved`'s `Ok`, an `Option` in the writer,
/// which does not import this module).
enum Large {
    /// Stored: the messages have the sequences after the tail the call was given.
    Stored,
    /// Nothing stored: another process appended first (the tail is now `(last, nonce)`), or an
    /// idempotency key was recorded meanwhile (the tail unchanged): plan again.
    Again { last: u64, nonce: u64 },
}

/// Cuts `envs` into transactions: the first (sent with the commit) has room for `first_room`
/// messages, the others for one operation short of etcd's limit; each within the byte limit.
/// Every message is at most [`MAX_TXN_BYTES`] (checked when the call was made).
fn cut(envs: &[&[u8]], first_room: usize) -> Vec<Range<usize>> {
    let mut out = Vec::new();
    let (mut start, mut bytes) = (0, 0);
    for (i, e) in envs.iter().enumerate() {
        let room = if out.is_empty() { first_room } else { MAX_TXN_OPS - 1 };
        if i > start && (i - start >= room || bytes + e.len() > MAX_TXN_BYTES) {
            out.push(start..i);
            (start, bytes) = (i, 0);
        }
        bytes += e.len();
    }
    out.push(start..envs.len());
    out
}

impl Writer {
    /// Appends `envs` to queue `qid` after the tail `(last, cur_nonce)` as one call larger
    /// than a transaction, named `nonce`, recording `dedup`'s keys with the commit: `None` once
    /// stored at the sequences after `last`, `Some(tail)` if nothing was stored and the call
    /// must be planned again on `tail` (another process appended first, or one of its keys was
    /// recorded meanwhile). Gives up at `deadline`, with the outcome unknown if the commit's
    /// answer was lost.
    pub(super) async fn append_reserved(
        &mut self,
        qid: u32,
        (last, cur_nonce): (u64, u64),
        nonce: u64,
        envs: &[&[u8]],
        dedup: Option<(&[DedupWrite], i64)>,
        deadline: Instant,
    ) -> Result<Option<(u64, u64)>, StorageError> {
        let store = self.side.store.clone();
        let keys = dedup.map_or(0, |(d, _)| d.len());
        // Every index entry goes with the commit (`commit_reserved`); the call's size was
        // checked when it was made (`MAX_KEYS_PER_CALL`).
        let index: Vec<(u64, u8)> = envs
            .iter()
            .enumerate()
            .filter_map(|(i, e)| {
                let p = crate::store::envelope::priority(e);
                (p > 0).then_some((last + 1 + i as u64, p))
            })
            .collect();
        // The commit puts the tail and deletes the reservation besides its share.
        let first_room = MAX_TXN_OPS.saturating_sub(2 + keys + index.len()).max(1);
        let chunks = cut(envs, first_room);
        let r = Reservation { last, count: envs.len() as u64, nonce };
        let mut lease = Lease { id: grant(&store, deadline).await?, renewed: Instant::now() };
        let result = async {
            if let Some(moved) = self.reserve(qid, cur_nonce, &r, &mut lease, deadline).await? {
                return Ok(moved);
            }
            for range in &chunks[1..] {
                let first = last + 1 + range.start as u64;
                let part = &envs[range.clone()];
                // A lost answer: the same puts again (the reservation still compares).
                let mut backoff = Duration::from_millis(10);
                loop {
                    if !lease.keep(&store, deadline).await {
                        return Err(lost());
                    }
                    match until(deadline, store.write_reserved(qid, &r, first, part)).await {
                        Ok(true) => break,
                        Ok(false) => return Err(lost()),
                        Err(e) if Instant::now() + backoff >= deadline => return Err(e),
                        Err(_) => pause(&mut backoff).await,
                    }
                }
            }
            let first = &envs[chunks[0].clone()];
            self.commit_reserved(qid, cur_nonce, &r, (first, &index), dedup, deadline).await
        }
        .await;
        match &result {
            Ok(Large::Stored) => {}
            // Tests leave the reservation as a process that died would.
            _ if crate::faults::check("rockq-etcd-reserved-abandon").is_err() => {}
            // Nothing visible: let the others append now rather than when the lease runs out.
            _ => store.revoke(lease.id).await,
        }
        result.map(|large| match large {
            Large::Stored => None,
            Large::Again { last, nonce } => Some((last, nonce)),
        })
    }

    /// Takes reservation `r` (waiting while another call's stands); `Some` if another process
    /// appended first.
    async fn reserve(
        &self,
        qid: u32,
        cur_nonce: u64,
        r: &Reservation,
        lease: &mut Lease,
        deadline: Instant,
    ) -> Result<Option<Large>, StorageError> {
        let store = self.side.store.clone();
        let mut backoff = Duration::from_millis(5);
        loop {
            // Waiting behind another call may outlast the lease: kept alive, or taken anew
            // (nothing is attached to it yet).
            if !lease.keep(&store, deadline).await {
                lease.id = grant(&store, deadline).await?;
                lease.renewed = Instant::now();
            }
            match until(deadline, store.reserve(qid, cur_nonce, r, lease.id)).await {
                Ok(Reserved::Held) => return Ok(None),
                Ok(Reserved::Moved { last, nonce }) => return Ok(Some(Large::Again { last, nonce })),
                Ok(Reserved::Busy) => {}
                Err(e) if e.to_string().contains("lease not found") => {
                    lease.id = grant(&store, deadline).await?;
                    lease.renewed = Instant::now();
                }
                // Unknown: the reservation is ours if it names this call.
                Err(e) => {
                    if let Ok(true) = until(deadline, store.holds(qid, r)).await {
                        return Ok(None);
                    }
                    if Instant::now() + backoff >= deadline {
                        return Err(e);
                    }
                }
            }
            if Instant::now() + backoff >= deadline {
                return Err(StorageError::new(
                    "etcd: another send call held the queue until the request timeout",
                ));
            }
            pause(&mut backoff).await;
        }
    }

    /// The last transaction of a reserved call; after a lost answer, finds out whether it
    /// landed (its first message was put with a tail bearing its nonce).
    async fn commit_reserved(
        &self,
        qid: u32,
        cur_nonce: u64,
        r: &Reservation,
        (first, index): (&[&[u8]], &[(u64, u8)]),
        dedup: Option<(&[DedupWrite], i64)>,
        deadline: Instant,
    ) -> Result<Large, StorageError> {
        let store = self.side.store.clone();
        let mut backoff = Duration::from_millis(10);
        // An attempt whose answer was lost may still land after a later one was sent.
        let mut in_doubt = false;
        loop {
            match until(deadline, store.commit_reserved(qid, cur_nonce, r, first, dedup, index)).await {
                Ok(Committed::Yes) => return Ok(Large::Stored),
                Ok(Committed::KeyRecorded) if !in_doubt => {
                    return Ok(Large::Again { last: r.last, nonce: cur_nonce });
                }
                Ok(Committed::Lost) if !in_doubt => return Err(lost()),
                // Refused after an attempt in doubt: that attempt may be what removed the
                // reservation (or recorded the keys). Ours if the call is there.
                Ok(_) => {
                    return match until(deadline, store.resolve_append(qid, r.last, r.nonce)).await {
                        Ok((true, _, _)) => Ok(Large::Stored),
                        _ => Err(unknown()),
                    };
                }
                // The dedup records' lease ran out: refused, nothing applied (the caller
                // takes a new one).
                Err(e) if e.to_string().contains("lease not found") => return Err(e),
                Err(e) => loop {
                    in_doubt = true;
                    if Instant::now() + backoff >= deadline {
                        return Err(e);
                    }
                    pause(&mut backoff).await;
                    match until(deadline, store.resolve_append(qid, r.last, r.nonce)).await {
                        Ok((true, _, _)) => return Ok(Large::Stored),
                        // Not seen applied: again (the reservation and the tail compare). Should
                        // the lost attempt land meanwhile, or the reservation be gone, the next
                        // one is refused and looks once more (the arm above).
                        Ok((false, _, _)) => break,
                        Err(_) => continue,
                    }
                },
            }
        }
    }
}

/// The reservation ran out under the call (the holder was cut off from etcd for longer than
/// its lease): nothing of the call is visible.
fn lost() -> StorageError {
    StorageError::new(
        "etcd: a send call's reservation ran out before it was written; nothing of it was stored",
    )
}

/// A commit in doubt that could not be told stored or not (the reservation gone, the call not
/// found): the send fails as one whose outcome is unknown.
fn unknown() -> StorageError {
    StorageError::unreachable(
        "etcd: a send call's commit was lost and its outcome could not be told; it may be stored",
    )
}

/// The reservation's lease, and when it was last renewed.
struct Lease {
    id: i64,
    renewed: Instant,
}

impl Lease {
    /// Renews the lease once a third of its TTL has passed; `false` once it is gone (etcd says
    /// so, or no renewal got through for a whole TTL). A renewal that fails is tried again at
    /// the next call.
    async fn keep(&mut self, store: &crate::store::etcd::EtcdStore, deadline: Instant) -> bool {
        if self.renewed.elapsed() < RESERVATION_TTL / 3 {
            return true;
        }
        match until(deadline, store.renew(self.id)).await {
            Ok(true) => {
                self.renewed = Instant::now();
                true
            }
            Ok(false) => false,
            Err(_) => self.renewed.elapsed() < RESERVATION_TTL,
        }
    }
}

async fn pause(backoff: &mut Duration) {
    tokio::time::sleep(*backoff).await;
    *backoff = (*backoff * 2).min(Duration::from_millis(100));
}

/// A reservation's lease, granted again after a failure (a member gone, an election under
/// way) until `deadline`: nothing is attached to a lease yet when it is granted, so a grant
/// whose answer was lost leaves only a lease that runs out unused.
async fn grant(store: &crate::store::etcd::EtcdStore, deadline: Instant) -> Result<i64, StorageError> {
    let left = deadline.saturating_duration_since(Instant::now());
    retrying(left, || async {
        // Tests fail a grant (etcd unreachable for one request).
        crate::faults::check("rockq-etcd-reserve-grant")?;
        store.grant_expiring(RESERVATION_TTL).await
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cuts_keep_every_message_once_in_order_within_the_limits() {
        let big = vec![0u8; 300 * 1024];
        let small = [0u8; 10];
        let envs: Vec<&[u8]> =
            (0..400).map(|i| if i % 50 == 7 { big.as_slice() } else { small.as_slice() }).collect();
        for room in [1, 26, 126] {
            let chunks = cut(&envs, room);
            assert_eq!(chunks.first().map(|r| r.start), Some(0));
            assert_eq!(chunks.last().map(|r| r.end), Some(envs.len()));
            for w in chunks.windows(2) {
                assert_eq!(w[0].end, w[1].start);
            }
            for (i, r) in chunks.iter().enumerate() {
                assert!(!r.is_empty());
                assert!(r.len() <= if i == 0 { room } else { MAX_TXN_OPS - 1 }, "{i}: {r:?}");
                assert!(envs[r.clone()].iter().map(|e| e.len()).sum::<usize>() <= MAX_TXN_BYTES);
            }
        }
    }
}
