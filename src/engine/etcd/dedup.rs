//! Idempotency keys on etcd, the writer's side: before each try of an append, the records of
//! the keys it carries are read; a key still within its window makes its message a duplicate
//! (nothing written, the original reported), a key seen earlier in the same append a
//! duplicate of that message, and every other key is recorded in the append's transaction,
//! compared with the revision it was read at (`store/etcd/dedup.rs`). A race with another
//! process fails the compare, and the next try reads the winner's record.

use std::time::{Duration, Instant};

use super::plan::DedupPlan;
use super::side::retrying;
use super::writer::Writer;
use crate::engine::capability::{self, Capability, Flavour};
use crate::engine::registry::QueueState;
use crate::engine::request::Submission;
use crate::error::{Error, StorageError};
use crate::sent::Sent;
use crate::store::envelope;
use crate::store::etcd::{DedupWrite, MAX_TXN_BYTES};

/// How long one dedup lease is handed out for: its records outlive the window by at most this.
fn bucket(window: Duration) -> Duration {
    (window / 10).clamp(Duration::from_secs(1), Duration::from_secs(60))
}

impl Writer {
    /// Reads the records of the keys in `keys` (`(index, key)` of the call's envelopes) and
    /// plans one try of an append of `n` messages at `now` (wall micros).
    pub(super) async fn plan_dedup(
        &mut self,
        queue: &QueueState,
        n: usize,
        keys: &[(usize, String)],
        now: u64,
        left: Duration,
    ) -> Result<DedupPlan, StorageError> {
        if keys.is_empty() {
            return Ok(DedupPlan::plain(n));
        }
        let store = self.side.store.clone();
        let names: Vec<&str> = keys.iter().map(|(_, k)| k.as_str()).collect();
        let found = retrying(left, || store.dedup_records(queue.id, &names)).await?;
        let window = queue.dedup_window().as_micros().min(u128::from(u64::MAX)) as u64;
        let mut plan = DedupPlan::default();
        let mut keyed = keys.iter().zip(found).peekable();
        let mut in_this: std::collections::HashMap<&str, usize> = std::collections::HashMap::new();
        for i in 0..n {
            let Some(((_, key), found)) = keyed.next_if(|((at, _), _)| *at == i) else {
                plan.written.push(i);
                continue;
            };
            let live = found.as_ref().filter(|(d, _)| d.expires_micros > now);
            if let Some((d, _)) = live {
                plan.duplicates.push((i, Ok(d.original)));
            } else if let Some(&pos) = in_this.get(key.as_str()) {
                plan.duplicates.push((i, Err(pos)));
            } else {
                in_this.insert(key, plan.written.len());
                plan.records.push(DedupWrite {
                    index: plan.written.len(),
                    key: key.clone(),
                    expected: found.map_or(0, |(_, rev)| rev),
                    expires_micros: now.saturating_add(window),
                    scheduled: None,
                });
                plan.written.push(i);
            }
        }
        Ok(plan)
    }

    /// The lease this round's records of `queue` go under: one per window, handed out for a
    /// bucket of time and lasting the window after it.
    pub(super) async fn dedup_lease(
        &mut self,
        queue: &QueueState,
        left: Duration,
    ) -> Result<i64, StorageError> {
        let window = queue.dedup_window();
        if let Some(&(lease, until)) = self.dedup_leases.get(&window)
            && Instant::now() < until
        {
            return Ok(lease);
        }
        let b = bucket(window);
        let store = self.side.store.clone();
        let ttl = window + b + Duration::from_secs(5);
        let lease = retrying(left, || store.grant_expiring(ttl)).await?;
        self.dedup_leases.insert(window, (lease, Instant::now() + b));
        Ok(lease)
    }

    /// A lease that etcd no longer knows (it ran out early, or was revoked): forgotten, so the
    /// next try gets a new one.
    pub(super) fn forget_dedup_lease(&mut self, e: &StorageError) -> bool {
        let gone = e.to_string().contains("lease not found");
        if gone {
            self.dedup_leases.clear();
        }
        gone
    }
}

impl Writer {
    /// `Queue::submit_batch` of messages that are not delayed: one append transaction, the
    /// whole call or nothing, a key seen twice in it a duplicate the second time.
    pub(super) async fn submit_now(
        &mut self,
        queue: &QueueState,
        mut msgs: Vec<Submission>,
    ) -> Result<Vec<Sent>, Error> {
        if let Some(f) = self.engine.failure() {
            return Err(crate::error::Closed::Failed(f).into());
        }
        // Each message must fit a transaction, and every key is recorded (and every priority
        // indexed) by the one transaction that makes the call visible (`reserve.rs`).
        // (A keyed, prioritised message has both.)
        let keyed = msgs.iter().filter(|m| m.idempotency_key.is_some()).count()
            + msgs.iter().filter(|m| envelope::priority(&m.envelope) > 0).count();
        if keyed > super::reserve::MAX_KEYS_PER_CALL || msgs.iter().any(|m| m.envelope.len() > MAX_TXN_BYTES)
        {
            return Err(capability::refusal(Flavour::Etcd, Capability::HugeMessage));
        }
        let now = self.stamp();
        for m in &mut msgs {
            envelope::stamp(&mut m.envelope, now);
        }
        let envs: Vec<&[u8]> = msgs.iter().map(|m| m.envelope.as_slice()).collect();
        let keys: Vec<(usize, String)> =
            msgs.iter().enumerate().filter_map(|(i, m)| m.idempotency_key.clone().map(|k| (i, k))).collect();
        let t = self.side.settings.request_timeout;
        let appended = self.append(queue, &envs, &keys, now, Instant::now() + t).await;
        self.note(&appended);
        let (first, duplicates) = appended.map_err(Error::from)?;
        let mut dups = duplicates.into_iter().peekable();
        let mut seq = first;
        let mut out = Vec::with_capacity(msgs.len());
        for i in 0..msgs.len() {
            match dups.next_if(|(at, _)| *at == i) {
                Some((_, original)) => out.push(Sent::Duplicate(original)),
                None => {
                    out.push(Sent::Appended(seq));
                    seq += 1;
                }
            }
        }
        submitted(queue, first..seq, &out);
        Ok(out)
    }
}

/// A submit call's outcomes made known: the sequences `appended` published (subscriptions here
/// wake) and counted, the duplicates counted.
pub(super) fn submitted(queue: &QueueState, appended: std::ops::Range<u64>, out: &[Sent]) {
    if !appended.is_empty() {
        queue.publish_max(appended.end - 1);
        crate::telemetry::produced(&queue.produced, appended.end - appended.start);
    }
    let hits = out.iter().filter(|s| matches!(s, Sent::Duplicate(_))).count() as u64;
    if hits > 0 {
        crate::telemetry::queue_counter(crate::telemetry::DEDUP_HITS, &queue.name, hits);
    }
}
