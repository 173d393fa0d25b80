//! Inspection on etcd: `Broker::pending` and `Broker::peek` read the namespace as every
//! process left it (claim records, messages), with this process's own leases laid over the
//! records as embedded.

use std::sync::Arc;

use super::side::{EtcdSide, retrying};
use crate::engine::Engine;
use crate::engine::figures::{LiveLeases, micros_to_time, pending_claim};
use crate::error::{Error, NameKind};
use crate::model::{Claim, GroupMode};
use crate::stats::{PendingClaim, StoredMessage};
use crate::store::etcd::decode_envelope;

/// The claimed, unfinished messages of work group `group` on `queue` (empty for an ordered
/// group), from its claim records in etcd.
pub(crate) async fn pending(
    engine: &Arc<Engine>,
    side: &EtcdSide,
    group: &str,
    queue: &str,
    live: &LiveLeases,
) -> Result<Vec<PendingClaim>, Error> {
    crate::name::validate(NameKind::Group, group)?;
    crate::name::validate(NameKind::Queue, queue)?;
    let t = side.settings.request_timeout;
    let Some(offset) = retrying(t, || side.store.offset(group, queue)).await? else {
        return Err(Error::NoSuchGroup { group: group.to_owned(), queue: queue.to_owned() });
    };
    if offset.mode != GroupMode::WorkQueue {
        return Ok(Vec::new());
    }
    let Some(loaded) = retrying(t, || side.store.load_claims(group, queue)).await? else {
        return Err(Error::NoSuchGroup { group: group.to_owned(), queue: queue.to_owned() });
    };
    let records = loaded.records;
    let now = engine.clock().wall_micros();
    let live = live.get(&(group.to_owned(), queue.to_owned()));
    Ok(records.into_iter().filter_map(|r| pending_claim(r.seq, r.claim, now, live)).collect())
}

/// The claim record of `seq` in work group `group` on `queue`, if there is one.
pub(crate) async fn claim(
    side: &EtcdSide,
    group: &str,
    queue: &str,
    seq: u64,
) -> Result<Option<Claim>, Error> {
    let t = side.settings.request_timeout;
    Ok(retrying(t, || side.store.claim(group, queue, seq)).await?)
}

/// The stored progress report of job `seq` (a record that does not decode is
/// `Error::Corrupt`).
pub(crate) async fn progress(
    side: &EtcdSide,
    group: &str,
    queue: &str,
    seq: u64,
) -> Result<Option<bytes::Bytes>, Error> {
    let t = side.settings.request_timeout;
    match retrying(t, || side.store.progress(group, queue, seq)).await? {
        Some(decoded) => Ok(Some(decoded?)),
        None => Ok(None),
    }
}

/// Whether `group` on `queue` is a work group in etcd (its offset record says so).
pub(crate) async fn is_work_group(side: &EtcdSide, group: &str, queue: &str) -> Result<bool, Error> {
    let t = side.settings.request_timeout;
    let offset = retrying(t, || side.store.offset(group, queue)).await?;
    Ok(offset.is_some_and(|o| o.mode == GroupMode::WorkQueue))
}

/// The kept outcome of job `seq` in work group `group` on `queue`, if there is one (a record
/// that does not decode is `Error::Corrupt`).
pub(crate) async fn outcome(
    side: &EtcdSide,
    group: &str,
    queue: &str,
    seq: u64,
) -> Result<Option<crate::stats::JobOutcome>, Error> {
    let t = side.settings.request_timeout;
    match retrying(t, || side.store.outcome(group, queue, seq)).await? {
        Some(decoded) => Ok(Some(decoded?)),
        None => Ok(None),
    }
}

/// Flow `id` as it stands (`None`: no such flow), read as of one revision.
pub(crate) async fn flow_status(
    side: &EtcdSide,
    id: u64,
) -> Result<Option<crate::flow_state::FlowStatus>, Error> {
    let t = side.settings.request_timeout;
    Ok(retrying(t, || side.store.flow_status(id)).await?)
}

/// Up to `limit` flow ids from `from`, in id order.
pub(crate) async fn flow_ids(side: &EtcdSide, from: u64, limit: usize) -> Result<Vec<u64>, Error> {
    let t = side.settings.request_timeout;
    Ok(retrying(t, || side.store.flow_ids(from, limit)).await?)
}

/// Up to `limit` stored messages of `queue` from `from` (default: the first live one).
pub(crate) async fn peek(
    side: &EtcdSide,
    queue: &str,
    from: Option<u64>,
    limit: usize,
) -> Result<Vec<StoredMessage>, Error> {
    crate::name::validate(NameKind::Queue, queue)?;
    let t = side.settings.request_timeout;
    let Some((meta, last)) = retrying(t, || side.store.queue(queue)).await? else {
        return Err(Error::NoSuchQueue { queue: queue.to_owned() });
    };
    let from = from.unwrap_or(0).max(meta.first_seq);
    if limit == 0 || from > last {
        return Ok(Vec::new());
    }
    let to = last.min(from.saturating_add(limit as u64 - 1));
    let mut out = Vec::with_capacity((to - from + 1) as usize);
    let mut next = from;
    // A read stops at a size bound: go on from where it stopped.
    while next <= to {
        let got = retrying(t, || side.store.read_range(meta.id, next, to, 64 << 20)).await?;
        let Some(&(last_read, _)) = got.last() else { break };
        for (seq, v) in got {
            let env = decode_envelope(meta.id, seq, &v)?;
            out.push(StoredMessage {
                seq,
                enqueued_at: micros_to_time(env.enqueued_at_micros),
                key: env.key,
                idempotency_key: env.idempotency_key,
                priority: env.priority,
                headers: env.headers,
                payload: env.payload,
            });
        }
        next = last_read + 1;
    }
    Ok(out)
}

/// Up to `limit` delayed messages of `queue` (every queue: `None`), in queue then schedule-id
/// order, as every process left them.
pub(crate) async fn delayed(
    side: &EtcdSide,
    queue: Option<String>,
    limit: usize,
) -> Result<Vec<crate::schedule::DelayedInfo>, Error> {
    let t = side.settings.request_timeout;
    let loaded = retrying(t, || side.store.load()).await?;
    let names: std::collections::HashMap<u32, &str> =
        loaded.queues.iter().map(|(n, m, _)| (m.id, n.as_str())).collect();
    let qid = match &queue {
        Some(name) => {
            crate::name::validate(NameKind::Queue, name)?;
            let found = loaded.queues.iter().find(|(n, _, _)| n == name).map(|(_, m, _)| m.id);
            Some(found.ok_or_else(|| Error::NoSuchQueue { queue: name.clone() })?)
        }
        None => None,
    };
    let records = retrying(t, || side.store.list_delayed(qid, limit)).await?;
    let mut out = Vec::with_capacity(records.len());
    // (Recurring schedules' pending firings share the index: not delayed messages.)
    for r in records.into_iter().filter(|r| r.qid != crate::store::keys::RECURRING) {
        let env = crate::store::envelope::decode(&r.id.to_be_bytes(), &r.env)?;
        out.push(crate::schedule::DelayedInfo {
            id: r.id,
            queue: names.get(&r.qid).map_or_else(|| format!("#{}", r.qid), |n| (*n).to_owned()),
            due: micros_to_time(r.due),
            sent_at: micros_to_time(env.enqueued_at_micros),
            payload_len: env.payload.len(),
            key: env.key,
        });
    }
    Ok(out)
}

/// Every recurring schedule, as every process left it.
pub(crate) async fn schedules(side: &EtcdSide) -> Result<Vec<crate::schedule::ScheduleInfo>, Error> {
    let t = side.settings.request_timeout;
    let all = retrying(t, || side.store.schedules()).await?;
    Ok(all.into_iter().map(|(name, r)| r.info(name)).collect())
}
