//! Send calls larger than one etcd transaction (`MAX_TXN_OPS` operations, `MAX_TXN_BYTES` of
//! values): their sequences are reserved first, their messages written in several
//! transactions, and the call made visible by one last transaction that moves the tail.
//!
//! Why a reservation: a send call is atomic and its sequences are contiguous (as embedded), but
//! etcd caps what one transaction carries. The reservation `N p/<qid u32>` (the tail it was
//! taken on, the count, the call's nonce) is attached to an etcd lease and every append in
//! every process compares its absence (`append`, `push_append`): while it stands nobody else
//! appends to the queue, so the sequences after the tail are the call's. The messages written
//! under it lie above the tail, where no read looks (every read is bounded by the tail it
//! knows); the last transaction puts the first messages, the tail and deletes the reservation,
//! all compared with the reservation and the tail. If the process dies, the lease runs out and
//! takes the reservation with it: the tail never moved, the messages written are never seen and
//! the next appends put theirs over them (an append puts every key it covers).

use etcd_client::{Compare, CompareOp, PutOptions, Txn, TxnOp};

use super::{DedupWrite, EtcdStore, decode_tail, encode_tail};
use crate::error::StorageError;

/// Whether an append of `envs` recording `keys` idempotency keys fits one transaction (the
/// tail's put is the one more operation); if not, it is reserved. `packs`: the namespace packs
/// appended messages into runs (`segment.rs`), so a run, not a message, is an operation.
pub(crate) fn fits_one(packs: bool, envs: &[&[u8]], keys: usize) -> bool {
    let t = super::segment::Tally::of(packs, envs.iter().copied());
    t.ops + keys < super::MAX_TXN_OPS && t.bytes <= super::MAX_TXN_BYTES
}

/// A reservation of `count` sequences after `last`, named by the call's `nonce`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Reservation {
    pub last: u64,
    pub count: u64,
    pub nonce: u64,
}

impl Reservation {
    fn encode(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(24);
        v.extend_from_slice(&self.last.to_be_bytes());
        v.extend_from_slice(&self.count.to_be_bytes());
        v.extend_from_slice(&self.nonce.to_be_bytes());
        v
    }
}

/// What became of a [`EtcdStore::reserve`].
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Reserved {
    /// The reservation is ours.
    Held,
    /// Another process appended first: the tail is now `(last, nonce)`.
    Moved { last: u64, nonce: u64 },
    /// Another call's reservation stands (its holder is writing, or died and its lease has
    /// not run out yet).
    Busy,
}

/// What became of a [`EtcdStore::commit_reserved`].
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Committed {
    /// The tail moved over the call: its messages are visible.
    Yes,
    /// The reservation stands but an idempotency key was recorded meanwhile: nothing written.
    KeyRecorded,
    /// The reservation is gone (its lease ran out): nothing visible.
    Lost,
}

impl EtcdStore {
    fn reservation_key(&self, qid: u32) -> Vec<u8> {
        self.key(b"p/", &qid.to_be_bytes())
    }

    /// The compare every append adds: no send call holds a reservation on queue `qid`.
    pub(super) fn no_reservation(&self, qid: u32) -> Compare {
        Compare::version(self.reservation_key(qid), CompareOp::Equal, 0)
    }

    /// The read an append's refusal adds, after the tail's: the reservation, if one stands.
    pub(super) fn get_reservation(&self, qid: u32) -> TxnOp {
        TxnOp::get(self.reservation_key(qid), None)
    }

    /// Takes reservation `r` on queue `qid` under `lease`, if its tail is still
    /// `(r.last, expected_nonce)` and no reservation stands.
    pub async fn reserve(
        &self,
        qid: u32,
        expected_nonce: u64,
        r: &Reservation,
        lease: i64,
    ) -> Result<Reserved, StorageError> {
        let (tail, key) = (self.tail_key(qid), self.reservation_key(qid));
        let txn = Txn::new()
            .when([
                Compare::value(tail.clone(), CompareOp::Equal, encode_tail(r.last, expected_nonce)),
                self.no_reservation(qid),
            ])
            .and_then([TxnOp::put(key.clone(), r.encode(), Some(PutOptions::new().with_lease(lease)))])
            .or_else([TxnOp::get(tail.clone(), None), TxnOp::get(key, None)]);
        crate::faults::check("rockq-etcd-reserve-request")?;
        let resp = self.kv().txn(txn).await?;
        crate::faults::check("rockq-etcd-reserve-answer")?;
        if resp.succeeded() {
            return Ok(Reserved::Held);
        }
        match super::two_gets(&resp) {
            // Taken by an earlier try whose answer was lost.
            (_, Some(p)) if p.value() == r.encode() => Ok(Reserved::Held),
            (Some(t), _) => {
                let (last, nonce) = decode_tail(t.key(), t.value())?;
                match (last, nonce) == (r.last, expected_nonce) {
                    true => Ok(Reserved::Busy),
                    false => Ok(Reserved::Moved { last, nonce }),
                }
            }
            (None, _) => Err(StorageError::new(format!("queue {qid} has no tail record in etcd"))),
        }
    }

    /// Whether reservation `r` on queue `qid` still stands (after a request whose outcome is
    /// unknown).
    pub async fn holds(&self, qid: u32, r: &Reservation) -> Result<bool, StorageError> {
        let got = self.kv().get(self.reservation_key(qid), None).await?;
        Ok(got.kvs().first().is_some_and(|kv| kv.value() == r.encode()))
    }

    /// Puts `envelopes` at sequences `first ..` of queue `qid` if reservation `r` still
    /// stands; `false`: it is gone, nothing written. Sent again after an unknown outcome, it
    /// puts the same values.
    pub async fn write_reserved(
        &self,
        qid: u32,
        r: &Reservation,
        first: u64,
        envelopes: &[&[u8]],
    ) -> Result<bool, StorageError> {
        let ops: Vec<TxnOp> = envelopes
            .iter()
            .enumerate()
            .map(|(i, e)| TxnOp::put(self.message_key(qid, first + i as u64), e.to_vec(), None))
            .collect();
        let cmp = Compare::value(self.reservation_key(qid), CompareOp::Equal, r.encode());
        crate::faults::check("rockq-etcd-reserved-write")?;
        Ok(self.kv().txn(Txn::new().when([cmp]).and_then(ops)).await?.succeeded())
    }

    /// Makes the reserved call visible: puts `envelopes` (its first messages) at `r.last + 1 ..`,
    /// the tail `(r.last + r.count, r.nonce)`, the whole call's priority `index` entries
    /// (`(seq, priority)`) and `dedup`'s records, and deletes the
    /// reservation, if it still stands, the tail is still `(r.last, expected_nonce)` and no key
    /// was recorded meanwhile.
    pub async fn commit_reserved(
        &self,
        qid: u32,
        expected_nonce: u64,
        r: &Reservation,
        envelopes: &[&[u8]],
        dedup: Option<(&[DedupWrite], i64)>,
        index: &[(u64, u8)],
    ) -> Result<Committed, StorageError> {
        let (tail, key) = (self.tail_key(qid), self.reservation_key(qid));
        let mut cmps = vec![
            Compare::value(key.clone(), CompareOp::Equal, r.encode()),
            Compare::value(tail.clone(), CompareOp::Equal, encode_tail(r.last, expected_nonce)),
        ];
        let mut ops = Vec::with_capacity(envelopes.len() + 2);
        for (i, e) in envelopes.iter().enumerate() {
            ops.push(TxnOp::put(self.message_key(qid, r.last + 1 + i as u64), e.to_vec(), None));
        }
        ops.push(TxnOp::put(tail, encode_tail(r.last + r.count, r.nonce), None));
        ops.push(TxnOp::delete(key.clone(), None));
        // Every prioritised message's index entry, the earlier transactions' too: with the
        // tail that publishes them (a call abandoned half-way leaves none behind, to be taken
        // for those of the messages a later append puts there).
        for &(seq, priority) in index {
            ops.push(TxnOp::put(self.priority_key(qid, seq), vec![priority], None));
        }
        if let Some((records, lease)) = dedup {
            self.push_dedup(qid, r.last + 1, records, lease, &mut cmps, &mut ops);
        }
        let txn = Txn::new().when(cmps).and_then(ops).or_else([TxnOp::get(key, None)]);
        crate::faults::check("rockq-etcd-reserved-commit-request")?;
        let resp = self.kv().txn(txn).await?;
        crate::faults::check("rockq-etcd-reserved-commit-answer")?;
        if resp.succeeded() {
            return Ok(Committed::Yes);
        }
        // Nobody else moves the tail while the reservation stands: a refusal with the
        // reservation still ours is a key's.
        Ok(match super::first_get(&resp) {
            Some(kv) if kv.value() == r.encode() => Committed::KeyRecorded,
            _ => Committed::Lost,
        })
    }

    /// Renews `lease` once; `false` if etcd no longer knows it.
    pub async fn renew(&self, lease: i64) -> Result<bool, StorageError> {
        let ttl = self
            .members
            .run(false, |c| async move {
                let (mut keeper, mut stream) = c.lease_client().keep_alive(lease).await?;
                keeper.keep_alive().await?;
                Ok(stream.message().await?.map_or(0, |r| r.ttl()))
            })
            .await?;
        Ok(ttl > 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_call_fits_one_transaction_within_both_limits() {
        let small = [0u8; 10];
        let big = vec![0u8; 300 * 1024];
        assert!(fits_one(false, &[small.as_slice(); 100], 27), "100 puts, 27 records, the tail: 128");
        assert!(!fits_one(false, &[small.as_slice(); 100], 28));
        assert!(fits_one(false, &[big.as_slice(); 3], 0));
        assert!(!fits_one(false, &[big.as_slice(); 4], 0), "1.2 MiB");
        // Packed: 4,096 small messages are 32 runs (64 operations) and 57 KiB.
        assert!(fits_one(true, &[small.as_slice(); 4096], 63), "64 + 63 records + the tail: 128");
        assert!(!fits_one(true, &[small.as_slice(); 4096], 64));
        assert!(fits_one(true, &[big.as_slice(); 3], 0), "each alone: its envelope, not a run");
        assert!(!fits_one(true, &[big.as_slice(); 4], 0), "1.2 MiB");
        let bytes = vec![0u8; 1000];
        // 1,045,000 bytes of envelopes fit 1 MiB; with 4 bytes of length each, they do not.
        assert!(!fits_one(true, &[bytes.as_slice(); 1045], 0));
    }
}
