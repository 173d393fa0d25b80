#![cfg(feature = "etcd")]
//! The etcd store (feature `etcd`): rockq's records in an etcd namespace, and the
//! compare-and-set transactions every multi-process guarantee rests on. The only module that
//! uses the etcd client; the engine above deals in queues, sequences and records, as with
//! RocksDB. Layout and protocol: `docs/DISTRIBUTED.md`.
//!
//! Everything under the namespace prefix `N` (`<namespace>/`):
//!
//! | key | value |
//! | --- | --- |
//! | `N meta/format` | the format record (as in RocksDB's meta CF) |
//! | `N meta/queue-id` | the next queue id, `u32` |
//! | `N q/<name>` | queue record (same codec as RocksDB's) |
//! | `N s/<qid u32>` | a queue's purge mark: the last sequence purged, `u64` (`retention.rs`) |
//! | `N t/<qid u32>` | the tail: last sequence `u64` and the nonce of the append that wrote it |
//! | `N p/<qid u32>` | a send call's reservation of the sequences after the tail, under a lease (`reserve.rs`) |
//! | `N m/<qid u32><seq u64>` | a message envelope (same codec) |
//! | `N sp/<qid u32><seq u64>` | a prioritised message's index entry: its priority, `u8` (as RocksDB's), put with the message |
//! | `N o/<group>:<queue>` | a group's offset (same codec) |
//! | `N k/<group>:<queue>:<seq>` | an ordered group's mark (same codec) |
//! | `N own/<group>:<queue>` | the owner of an ordered group, attached to an etcd lease |
//! | `N c/claim:<group>:<queue>:<seq>` | a work group's claim record (`work.rs`) |
//! | `N c/claim:<group>:<queue>:<last>` `r` | a run of first attempts one claim wrote (`claim_ranges.rs`) |
//! | `N c/claim:<group>:<queue>:<u64::MAX>` | a work group's reset mark: its last reset's offset (`reset.rs`) |
//! | `N g/group:<group>:<queue>` | a work group's settings record (`work.rs`) |
//! | `N r/redrive:<dlq>` | a dead-letter queue's redrive cursor (`redrive.rs`) |
//! | `N r/letter:<dlq>:<seq>` | a dead letter above the cursor settled on its own, empty (`redrive.rs`) |
//! | `N d/<qid u32><key>` | an idempotency key's dedup record, under an expiring lease (`dedup.rs`) |
//! | `N j/outcome:<group>:<queue>:<seq>` | a kept job outcome (same codec as RocksDB's, `outcomes.rs`) |
//! | `N x/<qid u32><id u64>`, `N sd/<due u64><qid u32><id u64>` | a delayed message and its due-index entry (`delayed.rs`) |
//! | `N y/<nonce u64>` | a call's marker (submit, cancel, schedule, group or flow deletion) under an expiring lease (`delayed.rs`) |
//! | `N meta/scheduled-id` | the next schedule id not handed out (`delayed.rs`) |
//! | `N w/<name>` | a recurring schedule's record (same codec as RocksDB's, `schedules.rs`) |
//! | `N sk/<name>` | a keyspace: its id (`kv.rs`) |
//! | `N v/<keyspace id u32><key>` | a keyspace entry; its revision is etcd's `mod_revision` (`kv.rs`) |
//! | `N meta/keyspace-id` | the next keyspace id (`kv.rs`) |
//! | `N fl/`, `fs/`, `fd/`, `fm/`, `sf/`, `fx/`, `meta/flow-id` | flows: their records, changes not applied yet, and large submits abandoned (`flows.rs`) |

pub(crate) mod claim_ranges;
pub(crate) mod dedup;
pub(crate) mod delayed;
pub(crate) mod deletion;
#[cfg(feature = "json")]
pub(crate) mod export;
pub(crate) mod flows;
#[cfg(feature = "json")]
pub(crate) mod import;
pub(crate) mod kv;
pub(crate) mod limits;
pub(crate) mod members;
pub(crate) mod outcomes;
pub(crate) mod redrive;
pub(crate) mod reserve;
pub(crate) mod reset;
pub(crate) mod retention;
pub(crate) mod schedules;
pub(crate) mod segment;
pub(crate) mod settings;
pub(crate) mod txn;
pub(crate) mod work;

use std::time::Duration;

use std::sync::Arc;

use etcd_client::{Compare, CompareOp, DeleteOptions, GetOptions, GetResponse, PutOptions, Txn, TxnOp};

pub(crate) use members::check_endpoint;
use members::{Kv, Members};

use super::{envelope, keys, records};
use crate::error::{CorruptionError, StorageError};
use crate::model::{GroupMode, GroupOffset, OrderedMark, QueueMeta};
use crate::retention::Retention;

/// etcd's default `--max-txn-ops`: at most this many operations in one transaction.
pub(crate) const MAX_TXN_OPS: usize = 128;
/// Bytes of message values one append transaction carries at most: below etcd's default
/// `--max-request-bytes` (1.5 MiB) with room for keys and framing.
pub(crate) const MAX_TXN_BYTES: usize = 1024 * 1024;

/// The operations putting `envs` takes beyond one per message: a prioritised message's index
/// entry goes with it (`push_message`).
pub(crate) fn index_entries<'a>(envs: impl IntoIterator<Item = &'a [u8]>) -> usize {
    envs.into_iter().filter(|e| envelope::priority(e) > 0).count()
}

/// Bytes of values one read asks for at most: half the client's 4 MiB answer limit, the
/// rest left for keys and each entry's metadata.
const ANSWER_BYTES: usize = 2 << 20;

/// A connected namespace.
#[derive(Clone)]
pub(crate) struct EtcdStore {
    members: Arc<Members>,
    /// The largest message each queue's last read met: how many the next read asks for.
    sizes: Arc<Sizes>,
    /// The namespace's format packs appended messages ([`segment`]): set from its format
    /// record at connect (a namespace of format 2 is written as rockq before it wrote it).
    packs: Arc<std::sync::atomic::AtomicBool>,
    ns: Vec<u8>,
    /// `etcd://<first endpoint>/<namespace>`: what `Broker::path` reports.
    pub label: String,
}

/// What the namespace holds at connect time.
pub(crate) struct EtcdLoaded {
    pub queues: Vec<(String, QueueMeta, u64)>,
    pub groups: Vec<(String, String, GroupOffset)>,
    /// The revision these were read at: the watch starts after it.
    pub revision: i64,
    /// The `mod_revision` of each queue record, in the order of `queues`.
    pub queue_revs: Vec<i64>,
    /// The `mod_revision` of each offset record, in the order of `groups`.
    pub group_revs: Vec<i64>,
    /// Each purged queue's id and the last sequence purged (its purge mark).
    pub purged: Vec<(u32, u64)>,
    /// Every prioritised message's index entry: queue id, sequence, priority.
    pub priorities: Vec<(u32, u64, u8)>,
}

/// Why connecting failed.
pub(crate) enum ConnectFailure {
    Storage(StorageError),
    /// An endpoint is not a URL etcd can be reached at.
    Invalid(String),
    /// The namespace holds something that is not ours (or a newer format).
    Foreign(String),
    /// The namespace has no format record, and the caller asked not to create it.
    Missing,
}

/// The outcome of one append transaction.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Appended {
    /// Stored: the messages have sequences `expected_last + 1 ..`.
    Stored,
    /// Another process appended first: the tail is now `last`; nothing of this was stored.
    Moved { last: u64, nonce: u64 },
    /// A send call larger than one transaction holds the queue (`reserve.rs`): nothing of
    /// this was stored; the tail has not moved.
    Reserved,
    /// The queue has no tail: deleted (`deletion.rs`). Nothing of this was stored.
    NoTail,
}

/// One idempotency key recorded by an append (`dedup.rs`): the message at `index` of the
/// append's envelopes, its key, the record's `mod_revision` as read (0: none), and when it
/// expires.
#[derive(Debug, Clone)]
pub(crate) struct DedupWrite {
    pub index: usize,
    pub key: String,
    pub expected: i64,
    pub expires_micros: u64,
    /// The key names delayed message `id` (not the appended message at `index`).
    pub scheduled: Option<u64>,
}

/// A delayed message a submit writes: its schedule id, due time (µs) and envelope.
#[derive(Debug, Clone, Copy)]
pub(crate) struct DelayedPut<'a> {
    pub id: u64,
    pub due: u64,
    pub env: &'a [u8],
}

/// A due message a firing appends: its id, due time and the `mod_revision` of its record as
/// read (the firing compares it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Fired {
    pub id: u64,
    pub due: u64,
    pub rev: i64,
}

/// What an append carries besides its messages (`EtcdStore::append`; `delayed.rs`).
#[derive(Debug, Clone, Copy)]
pub(crate) enum Along<'a> {
    Nothing,
    /// A submit's delayed messages, written with its appended ones.
    Delayed(&'a [DelayedPut<'a>]),
    /// The delayed messages the append fires (its envelopes, in order).
    Fired(&'a [Fired]),
    /// A recurring schedule's firing: its record rewritten (its last sequence set to the
    /// append's last) and its due entry moved, compared with the record as read.
    Schedule(&'a ScheduleWrite<'a>),
}

impl Along<'_> {
    /// Operations it adds to the transaction.
    pub fn ops(&self) -> usize {
        match self {
            Along::Nothing => 0,
            Along::Delayed(d) => 2 * d.len(),
            Along::Fired(f) => 2 * f.len(),
            Along::Schedule(w) => 1 + 2 * usize::from(w.unarm.is_some()) + 2 * usize::from(w.arm.is_some()),
        }
    }
}

/// A schedule's record as rewritten by a change or a firing, with the due entry it leaves and
/// the one it arms (`(due, id)`; the id names the record's version).
#[derive(Debug, Clone)]
pub(crate) struct ScheduleWrite<'a> {
    pub name: &'a str,
    /// The record's `mod_revision` as read (0: absent).
    pub rev: i64,
    pub record: &'a crate::model::ScheduleRecord,
    /// The due entry to delete: `(due, id)`.
    pub unarm: Option<(u64, u64)>,
    /// The due entry to write: `(due, id)`.
    pub arm: Option<(u64, u64)>,
}

/// A message read back: its sequence and envelope.
pub(crate) type EtcdMessage = (u64, Vec<u8>);

impl EtcdStore {
    /// Connects to `endpoints` (each checked first) and checks the namespace's format record
    /// — creating it if missing when `create` says so, else [`ConnectFailure::Missing`] —
    /// asking member after member until one answers or `timeout` passed.
    pub async fn connect(
        endpoints: &[String],
        namespace: &str,
        attempt: Duration,
        timeout: Duration,
        create: bool,
    ) -> Result<EtcdStore, ConnectFailure> {
        let store = Self::connect_bare(endpoints, namespace, attempt, timeout).await?;
        let deadline = tokio::time::Instant::now() + timeout;
        let mut backoff = Duration::from_millis(10);
        loop {
            match store.ensure_format(create).await {
                Err(ConnectFailure::Storage(e)) if tokio::time::Instant::now() + backoff < deadline => {
                    tracing::debug!(error = %e, "rockq: etcd connect: no answer yet; trying the next member");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_millis(250));
                }
                done => return done.map(|()| store),
            }
        }
    }

    /// Connects to `endpoints` without reading or writing anything of the namespace (an
    /// import writes its format record last).
    pub async fn connect_bare(
        endpoints: &[String],
        namespace: &str,
        attempt: Duration,
        timeout: Duration,
    ) -> Result<EtcdStore, ConnectFailure> {
        for e in endpoints {
            check_endpoint(e).map_err(ConnectFailure::Invalid)?;
        }
        let members = Members::new(endpoints, attempt, timeout).await.map_err(ConnectFailure::Storage)?;
        let mut ns = namespace.as_bytes().to_vec();
        ns.push(b'/');
        let label = format!("etcd://{}/{namespace}", endpoints.first().map_or("", String::as_str));
        Ok(EtcdStore { members: Arc::new(members), sizes: Arc::default(), packs: Arc::default(), ns, label })
    }

    fn kv(&self) -> Kv<'_> {
        Kv(&self.members)
    }

    /// Whether appends pack their messages, and readers may meet packed runs.
    pub(crate) fn packs(&self) -> bool {
        self.packs.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn key(&self, kind: &[u8], rest: &[u8]) -> Vec<u8> {
        let mut k = Vec::with_capacity(self.ns.len() + kind.len() + rest.len());
        k.extend_from_slice(&self.ns);
        k.extend_from_slice(kind);
        k.extend_from_slice(rest);
        k
    }

    fn format_key(&self) -> Vec<u8> {
        self.key(b"meta/", keys::FORMAT_KEY)
    }
    fn next_id_key(&self) -> Vec<u8> {
        self.key(b"meta/", keys::NEXT_QUEUE_ID_KEY)
    }
    fn queue_key(&self, name: &str) -> Vec<u8> {
        self.key(b"q/", name.as_bytes())
    }
    /// A queue's purge mark (`retention::TrimPlan::purge`).
    fn purge_key(&self, qid: u32) -> Vec<u8> {
        self.key(b"s/", &qid.to_be_bytes())
    }
    fn tail_key(&self, qid: u32) -> Vec<u8> {
        self.key(b"t/", &qid.to_be_bytes())
    }
    fn message_key(&self, qid: u32, seq: u64) -> Vec<u8> {
        self.key(b"m/", &keys::message_key(qid, seq))
    }
    /// A prioritised message's index entry: in the namespace watch's range (`q/` to `t/`), so
    /// a process learns it in the revision that published its message.
    fn priority_key(&self, qid: u32, seq: u64) -> Vec<u8> {
        self.key(b"sp/", &keys::message_key(qid, seq))
    }
    /// Puts message `seq`'s envelope, and its index entry if it has a priority (the same
    /// transaction: the index is never behind the messages, as embedded).
    fn push_message(&self, qid: u32, seq: u64, env: &[u8], ops: &mut Vec<TxnOp>) {
        ops.push(TxnOp::put(self.message_key(qid, seq), env.to_vec(), None));
        let priority = envelope::priority(env);
        if priority > 0 {
            ops.push(TxnOp::put(self.priority_key(qid, seq), vec![priority], None));
        }
    }
    /// Puts `envs` as sequences `first ..` packed in runs ([`segment`]), with the index entries
    /// of the prioritised ones.
    fn push_packed(&self, qid: u32, first: u64, envs: &[&[u8]], ops: &mut Vec<TxnOp>) {
        for (a, b) in segment::runs(envs) {
            let (from, last) = (first + a as u64, first + b as u64 - 1);
            if last > from {
                // A large send call whose holder died may have left messages in this run's
                // sequences (`reserve.rs`): under keys of their own, they would be read beside
                // the run's. (A single message's put replaces such a leftover, as before.)
                ops.push(TxnOp::delete(
                    self.message_key(qid, from),
                    Some(DeleteOptions::new().with_range(self.message_key(qid, last))),
                ));
            }
            ops.push(TxnOp::put(self.message_key(qid, last), segment::encode(&envs[a..b]), None));
            for (i, env) in envs[a..b].iter().enumerate() {
                let priority = envelope::priority(env);
                if priority > 0 {
                    ops.push(TxnOp::put(self.priority_key(qid, from + i as u64), vec![priority], None));
                }
            }
        }
    }

    /// Deletes the index entries of messages `from..=to` of `qid` (with the messages').
    fn delete_priorities(&self, qid: u32, from: u64, to: u64) -> TxnOp {
        TxnOp::delete(
            self.priority_key(qid, from),
            Some(DeleteOptions::new().with_range(self.priority_key(qid, to.saturating_add(1)))),
        )
    }
    fn offset_key(&self, group: &str, queue: &str) -> Vec<u8> {
        self.key(b"o/", &keys::offset_key(group, queue))
    }
    fn mark_prefix(&self, group: &str, queue: &str) -> Vec<u8> {
        self.key(b"k/", &keys::ordered_prefix(group, queue))
    }
    fn mark_key(&self, group: &str, queue: &str, seq: u64) -> Vec<u8> {
        keys::claim_key(&self.mark_prefix(group, queue), seq)
    }
    fn owner_key(&self, group: &str, queue: &str) -> Vec<u8> {
        self.key(b"own/", &keys::offset_key(group, queue))
    }

    /// `N meta/importing`: an import into the namespace has not finished (`import.rs`).
    fn import_mark_key(&self) -> Vec<u8> {
        self.key(b"meta/", b"importing")
    }

    /// Creates the format record (unless an import holds the namespace), or checks the one
    /// there.
    async fn ensure_format(&self, create: bool) -> Result<(), ConnectFailure> {
        let key = self.format_key();
        let mark = self.import_mark_key();
        // Without `create` the transaction writes nothing either way (a read-only transaction
        // does not even move the revision).
        let then: Vec<TxnOp> =
            if create { vec![TxnOp::put(key.clone(), segment::encode_format(), None)] } else { Vec::new() };
        let txn = Txn::new()
            .when([
                Compare::version(key.clone(), CompareOp::Equal, 0),
                Compare::version(mark.clone(), CompareOp::Equal, 0),
            ])
            .and_then(then)
            .or_else([TxnOp::get(key.clone(), None), TxnOp::get(mark, None)]);
        let resp = self.kv().txn(txn).await.map_err(ConnectFailure::Storage)?;
        if resp.succeeded() {
            self.packs.store(create, std::sync::atomic::Ordering::Relaxed);
            return if create { Ok(()) } else { Err(ConnectFailure::Missing) };
        }
        let gets: Vec<Option<etcd_client::KeyValue>> = resp
            .op_responses()
            .into_iter()
            .map(|r| match r {
                etcd_client::TxnOpResponse::Get(g) => g.kvs().first().cloned(),
                _ => None,
            })
            .collect();
        if gets.get(1).is_some_and(Option::is_some) {
            return Err(ConnectFailure::Foreign(
                "an import into it has not finished (import again: it clears what a stopped import left)"
                    .into(),
            ));
        }
        let found = gets.into_iter().next().flatten().map(|kv| kv.value().to_vec()).unwrap_or_default();
        match records::decode_format(&found) {
            Some(v @ (records::FORMAT_VERSION | segment::PACKED_FORMAT)) => {
                self.packs.store(v == segment::PACKED_FORMAT, std::sync::atomic::Ordering::Relaxed);
                Ok(())
            }
            Some(v) => Err(ConnectFailure::Foreign(format!(
                "namespace format version {v} is not supported (this build reads versions {} and {})",
                records::FORMAT_VERSION,
                segment::PACKED_FORMAT
            ))),
            None => Err(ConnectFailure::Foreign("its format record is not rockq's".into())),
        }
    }

    /// Every entry under `prefix`, in pages at one revision (`at`; 0: now): a prefix may hold
    /// more entries than one answer carries (the client's 4 MiB limit). The pages, and the
    /// revision they were read at.
    async fn prefix_pages(&self, prefix: Vec<u8>, at: i64) -> Result<(Vec<GetResponse>, i64), StorageError> {
        const PAGE: i64 = 4096;
        // Every byte 0xff (never: the prefixes end in `/`): `\0`, etcd's "to the end".
        let end = crate::store::prefix_end(&prefix).unwrap_or_else(|| vec![0]);
        let opts = |rev: i64| {
            let o = GetOptions::new().with_range(end.clone()).with_limit(PAGE);
            Some(if rev > 0 { o.with_revision(rev) } else { o })
        };
        let kv = self.kv();
        let first = kv.get_long(prefix, opts(at)).await?;
        let rev = if at > 0 { at } else { first.header().map_or(0, |h| h.revision()) };
        let mut pages = vec![first];
        while let Some(last) = pages.last().filter(|p| p.more()).and_then(|p| p.kvs().last()) {
            let from: Vec<u8> = last.key().iter().copied().chain([0]).collect();
            pages.push(kv.get_long(from, opts(rev)).await?);
        }
        Ok((pages, rev))
    }

    /// Every queue (with its tail) and group of the namespace, at one revision.
    pub async fn load(&self) -> Result<EtcdLoaded, StorageError> {
        let (queues, revision) = self.prefix_pages(self.key(b"q/", b""), 0).await?;
        let tails = self.prefix_pages(self.key(b"t/", b""), revision).await?.0;
        let offsets = self.prefix_pages(self.key(b"o/", b""), revision).await?.0;
        let purges = self.prefix_pages(self.key(b"s/", b""), revision).await?.0;
        // One entry per message sent with a priority: a backlog of them outgrows one answer.
        let priorities = self.prefix_pages(self.key(b"sp/", b""), revision).await?.0;
        let qprefix = self.key(b"q/", b"").len();
        let mut last_of = std::collections::HashMap::new();
        for t in tails.iter().flat_map(|p| p.kvs()) {
            let (last, _) = decode_tail(t.key(), t.value())?;
            let qid = t
                .key()
                .get(t.key().len().saturating_sub(4)..)
                .map_or(0, |b| u32::from_be_bytes(b.try_into().unwrap_or([0; 4])));
            last_of.insert(qid, last);
        }
        let mut out = EtcdLoaded {
            queues: Vec::new(),
            groups: Vec::new(),
            revision,
            queue_revs: Vec::new(),
            group_revs: Vec::new(),
            purged: Vec::new(),
            priorities: Vec::new(),
        };
        let pprefix = self.key(b"sp/", b"").len();
        for p in priorities.iter().flat_map(|p| p.kvs()) {
            out.priorities.push(decode_priority(&p.key()[pprefix..], p.key(), p.value())?);
        }
        let sprefix = self.key(b"s/", b"").len();
        for p in purges.iter().flat_map(|p| p.kvs()) {
            let Ok(qid) = <[u8; 4]>::try_from(&p.key()[sprefix..]) else { continue };
            out.purged.push((u32::from_be_bytes(qid), decode_purge(p.key(), p.value())?));
        }
        for q in queues.iter().flat_map(|p| p.kvs()) {
            let name = std::str::from_utf8(&q.key()[qprefix..])
                .map_err(|_| CorruptionError::new("queue", q.key(), "name is not UTF-8"))
                .map_err(corrupt)?;
            let meta = records::decode_queue(q.key(), q.value()).map_err(corrupt)?;
            let last = last_of.get(&meta.id).copied().unwrap_or(meta.first_seq - 1);
            out.queues.push((name.to_owned(), meta, last));
            out.queue_revs.push(q.mod_revision());
        }
        let oprefix = self.key(b"o/", b"").len();
        for o in offsets.iter().flat_map(|p| p.kvs()) {
            let (group, queue) = keys::parse_offset_key(&o.key()[oprefix..]).map_err(corrupt)?;
            let offset = records::decode_offset(o.key(), o.value()).map_err(corrupt)?;
            out.groups.push((group.to_owned(), queue.to_owned(), offset));
            out.group_revs.push(o.mod_revision());
        }
        Ok(out)
    }

    /// The queue `name`: its record and tail, if it exists.
    pub async fn queue(&self, name: &str) -> Result<Option<(QueueMeta, u64)>, StorageError> {
        let got = self.kv().get(self.queue_key(name), None).await?;
        let Some(q) = got.kvs().first() else { return Ok(None) };
        let meta = records::decode_queue(q.key(), q.value()).map_err(corrupt)?;
        let last = self.tail(meta.id).await?.unwrap_or(meta.first_seq - 1);
        Ok(Some((meta, last)))
    }

    /// The queue `name`: its record and tail, created (with the next free id) if missing.
    pub async fn create_queue(&self, name: &str) -> Result<(QueueMeta, u64), StorageError> {
        let kv = self.kv();
        let qkey = self.queue_key(name);
        let idkey = self.next_id_key();
        loop {
            let got = kv.get(qkey.clone(), None).await?;
            if let Some(q) = got.kvs().first() {
                let meta = records::decode_queue(q.key(), q.value()).map_err(corrupt)?;
                let last = self.tail(meta.id).await?.unwrap_or(meta.first_seq - 1);
                return Ok((meta, last));
            }
            let (id, id_cmp) = self.next_id(&idkey, "queue id").await?;
            let meta = QueueMeta {
                id,
                first_seq: 1,
                retention: Retention::default(),
                dedup_window: crate::model::DEFAULT_DEDUP_WINDOW,
            };
            let txn =
                Txn::new().when([Compare::version(qkey.clone(), CompareOp::Equal, 0), id_cmp]).and_then([
                    TxnOp::put(qkey.clone(), records::encode_queue(&meta).to_vec(), None),
                    TxnOp::put(idkey.clone(), (id + 1).to_be_bytes().to_vec(), None),
                    TxnOp::put(self.tail_key(id), encode_tail(0, 0), None),
                ]);
            if kv.txn(txn).await?.succeeded() {
                return Ok((meta, 0));
            }
            // Another process created it, or took the id: look again.
        }
    }

    /// The id counter at `idkey` (`what`: "queue id", "keyspace id"): the next id, and the
    /// compare that takes it (the counter unchanged since it was read). Ids start at 1.
    pub(super) async fn next_id(
        &self,
        idkey: &[u8],
        what: &'static str,
    ) -> Result<(u32, Compare), StorageError> {
        let ids = self.kv().get(idkey.to_vec(), None).await?;
        let (id, cmp) = match ids.kvs().first() {
            Some(k) => {
                let id = u32::from_be_bytes(
                    k.value()
                        .try_into()
                        .map_err(|_| corrupt(CorruptionError::new(what, k.key(), "length is not 4")))?,
                );
                (id, Compare::mod_revision(idkey.to_vec(), CompareOp::Equal, k.mod_revision()))
            }
            None => (1, Compare::version(idkey.to_vec(), CompareOp::Equal, 0)),
        };
        if id == u32::MAX {
            return Err(StorageError::new(format!("no {what} left in this namespace")));
        }
        Ok((id, cmp))
    }

    /// The tail record of queue `qid`: (last, nonce).
    pub async fn tail_record(&self, qid: u32) -> Result<(u64, u64), StorageError> {
        self.get_tail(qid)
            .await?
            .ok_or_else(|| StorageError::new(format!("queue {qid} has no tail record in etcd")))
    }

    /// The tail record of queue `qid`, if it has one.
    pub async fn get_tail(&self, qid: u32) -> Result<Option<(u64, u64)>, StorageError> {
        let got = self.kv().get(self.tail_key(qid), None).await?;
        got.kvs().first().map(|t| decode_tail(t.key(), t.value())).transpose()
    }

    /// The last sequence of queue `qid` (`None` if it has no tail record).
    pub async fn tail(&self, qid: u32) -> Result<Option<u64>, StorageError> {
        Ok(self.get_tail(qid).await?.map(|(last, _)| last))
    }

    /// Appends `envelopes` to queue `qid` as sequences `expected_last + 1 ..`, if its tail is
    /// still `expected = (expected_last, expected_nonce)`: `If value(tail) == expected Then Put
    /// messages, Put tail` (with what `dedup` and `along` add). `nonce` names this append (random, kept through its retries): after an error whose
    /// outcome is unknown, [`resolve_append`](Self::resolve_append) finds out whether it was
    /// applied. Sequences never repeat or skip: the tail only grows, and only through this.
    pub async fn append(
        &self,
        qid: u32,
        (expected_last, expected_nonce): (u64, u64),
        nonce: u64,
        envelopes: &[&[u8]],
        dedup: Option<(&[DedupWrite], i64)>,
        along: Along<'_>,
    ) -> Result<Appended, StorageError> {
        let tail = self.tail_key(qid);
        let mut ops =
            Vec::with_capacity(envelopes.len() + dedup.map_or(0, |(d, _)| d.len()) + 1 + along.ops());
        if self.packs() {
            self.push_packed(qid, expected_last + 1, envelopes, &mut ops);
        } else {
            for (i, env) in envelopes.iter().enumerate() {
                self.push_message(qid, expected_last + 1 + i as u64, env, &mut ops);
            }
        }
        ops.push(TxnOp::put(tail.clone(), encode_tail(expected_last + envelopes.len() as u64, nonce), None));
        let mut cmps = vec![
            Compare::value(tail.clone(), CompareOp::Equal, encode_tail(expected_last, expected_nonce)),
            self.no_reservation(qid),
        ];
        // A key recorded meanwhile fails the compare like a moved tail: the caller reads again.
        if let Some((records, lease)) = dedup {
            self.push_dedup(qid, expected_last + 1, records, lease, &mut cmps, &mut ops);
        }
        self.push_along(qid, along, expected_last + envelopes.len() as u64, &mut cmps, &mut ops);
        let txn = Txn::new()
            .when(cmps)
            .and_then(ops)
            .or_else([TxnOp::get(tail.clone(), None), self.get_reservation(qid)]);
        // Tests lose the request (not applied) or its answer (applied): either way the caller
        // sees an error whose outcome it must find out.
        crate::faults::check("rockq-etcd-append-request")?;
        let resp = self.kv().txn(txn).await?;
        crate::faults::check("rockq-etcd-append-answer")?;
        if resp.succeeded() {
            return Ok(Appended::Stored);
        }
        match two_gets(&resp) {
            (Some(t), reservation) => {
                let (last, nonce) = decode_tail(t.key(), t.value())?;
                match (last, nonce) == (expected_last, expected_nonce) && reservation.is_some() {
                    true => Ok(Appended::Reserved),
                    false => Ok(Appended::Moved { last, nonce }),
                }
            }
            (None, _) => Ok(Appended::NoTail),
        }
    }

    /// After an append to `qid` at `expected_last` failed with an unknown outcome: whether the
    /// message at `expected_last + 1` was written by the append named `nonce` (read from the tail
    /// at the revision that created it), and the tail as it is now (last, nonce).
    pub async fn resolve_append(
        &self,
        qid: u32,
        expected_last: u64,
        nonce: u64,
    ) -> Result<(bool, u64, u64), StorageError> {
        let kv = self.kv();
        let got = kv.get(self.tail_key(qid), None).await?;
        let Some(t) = got.kvs().first() else {
            return Err(StorageError::new(format!("queue {qid} has no tail record in etcd")));
        };
        let (last, now_nonce) = decode_tail(t.key(), t.value())?;
        if last <= expected_last {
            return Ok((false, last, now_nonce));
        }
        let Some((_, mod_revision)) = self.message_at(qid, expected_last + 1).await? else {
            // Trimmed already: only an append that was stored can have been trimmed, but it
            // cannot be told whose it was. Report it stored by someone else.
            return Ok((false, last, now_nonce));
        };
        // The revision that last put it, not the one that created it: a reserved call whose
        // holder died may have left a message at this key before (`reserve.rs`).
        let then = kv.get(self.tail_key(qid), Some(GetOptions::new().with_revision(mod_revision))).await?;
        let ours = match then.kvs().first() {
            Some(t) => decode_tail(t.key(), t.value())?.1 == nonce,
            None => false,
        };
        Ok((ours, last, now_nonce))
    }

    /// Messages `from..=to` of queue `qid`, in order, stopping after `max_bytes` of values (at
    /// least one) or one answer's worth ([`ANSWER_BYTES`]): the caller goes on from where it
    /// stopped. Linearizable: everything an append stored before is seen.
    ///
    /// etcd cannot bound a range by bytes, only by count: the count comes from the largest
    /// value the last read of this queue met, and an answer that still outgrew the client's
    /// limit (larger messages further on) is asked again for a quarter as many.
    pub async fn read_range(
        &self,
        qid: u32,
        from: u64,
        to: u64,
        max_bytes: usize,
    ) -> Result<Vec<EtcdMessage>, StorageError> {
        let want = (to - from + 1).min(1024) as usize;
        let budget = max_bytes.clamp(1, ANSWER_BYTES);
        let mut limit = (budget / self.sizes.typical(qid)).clamp(1, want);
        let packs = self.packs();
        let (within, past) = loop {
            let range = GetOptions::new().with_range(self.message_key(qid, to + 1)).with_limit(limit as i64);
            let mut ops = vec![TxnOp::get(self.message_key(qid, from), Some(range))];
            if packs {
                // The run holding `to` (and the messages before it down to `from`) is keyed by
                // its last sequence, past `to`: asked in the same request.
                let (key, opts) = self.holding_get(qid, to + 1);
                ops.push(TxnOp::get(key, opts));
            }
            match self.kv().txn_bounded(Txn::new().and_then(ops)).await? {
                Some(resp) => break gets(resp),
                None if limit > 1 => limit = (limit / 4).max(1),
                None => return Err(too_large(qid, from)),
            }
        };
        let Some((within, more)) = within else { return Ok(Vec::new()) };
        self.sizes.learn(qid, within.iter().map(|kv| kv.value().len()));
        let mut out = Vec::with_capacity(within.len());
        let mut bytes = 0;
        // The run past `to` counts only if the range was read to its end (not cut by its
        // limit: the caller goes on from where this stops).
        let past = past.filter(|_| !more).map(|(kvs, _)| kvs).unwrap_or_default();
        for kv in within.iter().chain(&past) {
            for (seq, env) in self.stored_messages(kv)? {
                if seq < from || seq > to {
                    continue;
                }
                if !out.is_empty() && bytes + env.len() > max_bytes {
                    return Ok(out);
                }
                bytes += env.len();
                out.push((seq, env.to_vec()));
            }
        }
        Ok(out)
    }

    /// The messages one stored entry of `m/` holds: one envelope, or a packed run
    /// ([`segment`]).
    pub(super) fn stored_messages<'a>(
        &self,
        kv: &'a etcd_client::KeyValue,
    ) -> Result<Vec<(u64, &'a [u8])>, StorageError> {
        let plen = self.key(b"m/", b"").len();
        let (_, last) =
            keys::decode_message_key(kv.key().get(plen..).unwrap_or_default()).map_err(corrupt)?;
        segment::decode(kv.key(), last, kv.value()).map_err(corrupt)
    }

    /// The get that finds the entry holding message `seq` of `qid`: its own key, or (in a
    /// namespace that packs) the first key within a run's span at or after it.
    pub(super) fn holding_get(&self, qid: u32, seq: u64) -> (Vec<u8>, Option<GetOptions>) {
        let key = self.message_key(qid, seq);
        if !self.packs() {
            return (key, None);
        }
        let end = self.message_key(qid, seq.saturating_add(segment::MAX_SPAN));
        (key, Some(GetOptions::new().with_range(end).with_limit(1)))
    }

    /// Message `seq` of queue `qid` and the `mod_revision` of the entry that holds it (the
    /// append that wrote it), if stored.
    pub async fn message_at(&self, qid: u32, seq: u64) -> Result<Option<(Vec<u8>, i64)>, StorageError> {
        let (key, opts) = self.holding_get(qid, seq);
        let got = self.kv().get(key, opts).await?;
        for kv in got.kvs() {
            if let Some((_, env)) = self.stored_messages(kv)?.into_iter().find(|(s, _)| *s == seq) {
                return Ok(Some((env.to_vec(), kv.mod_revision())));
            }
        }
        Ok(None)
    }

    /// The messages at `seqs` (ascending) of queue `qid` that exist, in order: every one, in as
    /// many answers as their sizes need (see [`read_range`](Self::read_range)).
    ///
    /// In a namespace that packs, sequences less than a run's span apart are asked as one
    /// window ([`read_windows`]): the entries ending inside it and the one holding its last
    /// sequence. A run holding several of them — a work group's retries, scattered through one
    /// append — comes back once, where a get per sequence brought the whole run back for each.
    pub async fn read_seqs(&self, qid: u32, seqs: &[u64]) -> Result<Vec<EtcdMessage>, StorageError> {
        let mut windows = read_windows(seqs, self.packs());
        let mut out = Vec::with_capacity(seqs.len());
        while !windows.is_empty() {
            // A window's answer: about two entries (the runs at its two ends).
            let per = 2 * self.sizes.typical(qid);
            let mut n = (ANSWER_BYTES / per.max(1)).clamp(1, MAX_TXN_OPS / 2).min(windows.len());
            let resp = loop {
                let ops: Vec<TxnOp> = windows.iter().take(n).flat_map(|w| self.window_gets(qid, w)).collect();
                match self.kv().txn_bounded(Txn::new().and_then(ops)).await? {
                    Some(resp) => break Some(resp),
                    None if n > 1 => n = (n / 4).max(1),
                    // One window outgrew an answer (large messages of a key each inside it):
                    // its sequences are asked one by one, as a run's span is never too large.
                    None if windows[0].len() > 1 => break None,
                    None => return Err(too_large(qid, windows[0][0])),
                }
            };
            let Some(resp) = resp else {
                if let Some(w) = windows.pop_front() {
                    w.chunks(1).rev().for_each(|one| windows.push_front(one));
                }
                continue;
            };
            let mut answers = whole_answers(&resp);
            let mut sizes = Vec::new();
            for w in windows.drain(..n) {
                let kvs: Vec<_> = answers.by_ref().take(gets_of_window(w)).flatten().collect();
                sizes.extend(kvs.iter().map(|kv| kv.value().len()));
                // Entries come back in key order, and runs do not overlap: their messages ascend.
                let mut held = Vec::new();
                for kv in &kvs {
                    held.extend(self.stored_messages(kv)?);
                }
                let mut held = held.into_iter().peekable();
                for &want in w {
                    while held.next_if(|&(seq, _)| seq < want).is_some() {}
                    if let Some((_, env)) = held.next_if(|&(seq, _)| seq == want) {
                        out.push((want, env.to_vec()));
                    }
                }
            }
            self.sizes.learn(qid, sizes);
        }
        Ok(out)
    }

    /// The gets that read window `w` of [`read_windows`]: the entries keyed from its first
    /// sequence up to its last (exclusive), then the entry holding its last.
    fn window_gets(&self, qid: u32, w: &[u64]) -> Vec<TxnOp> {
        let (Some(&first), Some(&last)) = (w.first(), w.last()) else { return Vec::new() };
        let mut ops = Vec::with_capacity(gets_of_window(w));
        if first < last {
            let below_last = GetOptions::new().with_range(self.message_key(qid, last));
            ops.push(TxnOp::get(self.message_key(qid, first), Some(below_last)));
        }
        let (key, opts) = self.holding_get(qid, last);
        ops.push(TxnOp::get(key, opts));
        ops
    }

    /// The offset record of `group` on `queue`, if any.
    pub async fn offset(&self, group: &str, queue: &str) -> Result<Option<GroupOffset>, StorageError> {
        Ok(self.offset_at(group, queue).await?.0)
    }

    /// [`offset`](Self::offset), with the revision it was read at.
    pub async fn offset_at(
        &self,
        group: &str,
        queue: &str,
    ) -> Result<(Option<GroupOffset>, i64), StorageError> {
        let got = self.kv().get(self.offset_key(group, queue), None).await?;
        let rev = got.header().map_or(0, |h| h.revision());
        let offset = got
            .kvs()
            .first()
            .map(|o| records::decode_offset(o.key(), o.value()).map_err(corrupt))
            .transpose()?;
        Ok((offset, rev))
    }

    /// Creates the offset record of `group` on `queue` at `committed` unless one exists;
    /// returns the record that stands and the revision it was read or written at.
    pub async fn create_group(
        &self,
        group: &str,
        queue: &str,
        offset: GroupOffset,
    ) -> Result<(GroupOffset, i64), StorageError> {
        let key = self.offset_key(group, queue);
        let txn = Txn::new()
            .when([Compare::version(key.clone(), CompareOp::Equal, 0)])
            .and_then([TxnOp::put(key.clone(), records::encode_offset(&offset).to_vec(), None)])
            .or_else([TxnOp::get(key.clone(), None)]);
        let resp = self.kv().txn(txn).await?;
        let rev = resp.header().map_or(0, |h| h.revision());
        if resp.succeeded() {
            return Ok((offset, rev));
        }
        match first_get(&resp) {
            Some(o) => Ok((records::decode_offset(o.key(), o.value()).map_err(corrupt)?, rev)),
            None => Err(StorageError::new("group record vanished while it was created")),
        }
    }

    /// The marks of ordered group `group` on `queue`.
    pub async fn marks(&self, group: &str, queue: &str) -> Result<Vec<(u64, OrderedMark)>, StorageError> {
        let prefix = self.mark_prefix(group, queue);
        let got = self.kv().get(prefix.clone(), Some(GetOptions::new().with_prefix())).await?;
        let mut out = Vec::new();
        for kv in got.kvs() {
            let seq = kv
                .key()
                .get(prefix.len()..)
                .and_then(|b| <[u8; 8]>::try_from(b).ok())
                .map(u64::from_be_bytes)
                .ok_or_else(|| corrupt(CorruptionError::new("delivery", kv.key(), "bad sequence")))?;
            out.push((seq, records::decode_mark(kv.key(), kv.value()).map_err(corrupt)?));
        }
        Ok(out)
    }

    /// Writes an ordered group's progress as its owner `owner`: the offset (if given), marks
    /// put and deleted, and dead-letter copies appended — all in one transaction, and only
    /// while `own/<group>:<queue>` still names `owner` (and the dead-letter queue's tail is
    /// the one expected). Otherwise nothing is written, and the outcome says which changed.
    pub async fn commit_ordered(&self, c: OrderedCommit<'_>) -> Result<CommitOutcome, StorageError> {
        let mut ops = Vec::new();
        let owner_key = self.owner_key(c.group, c.queue);
        let mut cmps = vec![Compare::value(owner_key.clone(), CompareOp::Equal, c.owner.to_vec())];
        if let Some(o) = c.offset {
            let rec = GroupOffset { mode: GroupMode::Ordered, committed: o };
            ops.push(TxnOp::put(
                self.offset_key(c.group, c.queue),
                records::encode_offset(&rec).to_vec(),
                None,
            ));
        }
        for (seq, mark) in c.put_marks {
            ops.push(TxnOp::put(
                self.mark_key(c.group, c.queue, *seq),
                records::encode_mark(mark).to_vec(),
                None,
            ));
        }
        for seq in c.delete_marks {
            ops.push(TxnOp::delete(self.mark_key(c.group, c.queue, *seq), None));
        }
        if let Some(dl) = &c.dead_letters {
            self.push_append(dl, &mut cmps, &mut ops);
        }
        if ops.is_empty() {
            return Ok(CommitOutcome::Done);
        }
        if ops.len() > MAX_TXN_OPS {
            return Err(StorageError::new(format!(
                "an ordered commit of {} operations exceeds etcd's {MAX_TXN_OPS} per transaction",
                ops.len()
            )));
        }
        let txn = Txn::new().when(cmps).and_then(ops).or_else([TxnOp::get(owner_key, None)]);
        let resp = self.kv().txn(txn).await?;
        if resp.succeeded() {
            return Ok(CommitOutcome::Done);
        }
        Ok(match first_get(&resp) {
            Some(o) if o.value() == c.owner => CommitOutcome::TailMoved,
            _ => CommitOutcome::Lost,
        })
    }

    /// Takes ownership of ordered group `group` on `queue` for `owner`, under a new etcd lease
    /// of `ttl`: `Ok(lease)` if nobody held it, `Err(holder)` with the owner id that does.
    pub async fn acquire_owner(
        &self,
        group: &str,
        queue: &str,
        owner: &[u8],
        ttl: Duration,
    ) -> Result<Result<i64, Option<Vec<u8>>>, StorageError> {
        let secs = ttl.as_secs().max(1) as i64;
        let lease =
            self.members.run(false, |c| async move { c.lease_client().grant(secs, None).await }).await?.id();
        let key = self.owner_key(group, queue);
        let offset = self.offset_key(group, queue);
        // The group must still exist: an owner taken after a deletion (by a process that has
        // not heard of it) would commit the deleted group's offset back.
        let txn = Txn::new()
            .when([
                Compare::create_revision(key.clone(), CompareOp::Equal, 0),
                Compare::version(offset.clone(), CompareOp::Greater, 0),
            ])
            .and_then([TxnOp::put(key.clone(), owner.to_vec(), Some(PutOptions::new().with_lease(lease)))])
            .or_else([TxnOp::get(key, None), TxnOp::get(offset, None)]);
        match self.kv().txn(txn).await {
            Ok(r) if r.succeeded() => Ok(Ok(lease)),
            Ok(r) => {
                self.revoke(lease).await;
                let gets = values(&r);
                match (gets.first().cloned().flatten(), gets.get(1).is_some_and(Option::is_some)) {
                    (Some(holder), _) => Ok(Err(Some(holder))),
                    (None, false) => Ok(Err(None)),
                    // Freed between the compare and the read: another try decides.
                    (None, true) => Ok(Err(Some(Vec::new()))),
                }
            }
            Err(e) => {
                self.revoke(lease).await;
                Err(e)
            }
        }
    }

    /// Revokes `lease` (the keys attached to it go), if a member answers; else it runs out.
    pub(crate) async fn revoke(&self, lease: i64) {
        let _ = self.members.run(false, |c| async move { c.lease_client().revoke(lease).await }).await;
    }

    /// Keeps `lease` alive until `stop` resolves or the lease is gone; then revokes it (the
    /// owner key goes with it). Returns whether it ended by `stop` (`false`: the lease was
    /// lost). A renewal that fails (the member went away or stopped answering, an election)
    /// sets its member aside and is tried again soon on a new stream to the preferred member;
    /// the lease counts as lost only once etcd says it expired, or no renewal got through for
    /// a whole TTL.
    pub async fn hold_lease(
        &self,
        lease: i64,
        ttl: Duration,
        stop: impl std::future::Future<Output = ()>,
    ) -> bool {
        let members = self.members.clone();
        let held = async move {
            let every = (ttl / 3).max(Duration::from_millis(100));
            let mut last_ok = tokio::time::Instant::now();
            let mut keeper = None;
            let mut pause = every;
            loop {
                tokio::time::sleep(pause).await;
                let deadline = members.attempt().min(every);
                if keeper.is_none() {
                    let (i, client) = members.preferred();
                    match tokio::time::timeout(deadline, client.lease_client().keep_alive(lease)).await {
                        Ok(Ok(k)) => keeper = Some((i, k)),
                        // The member answered: the lease is gone (expired, revoked).
                        Ok(Err(e)) if e.to_string().contains("lease not found") => return,
                        _ => members.stream_failed(i, "lease renewal stream not opened"),
                    }
                }
                let renewed = match keeper.as_mut() {
                    Some((_, (k, stream))) => match k.keep_alive().await {
                        Ok(()) => match tokio::time::timeout(deadline, stream.message()).await {
                            Ok(Ok(Some(r))) if r.ttl() > 0 => Some(true),
                            // etcd answers a TTL of 0 for a lease that expired.
                            Ok(Ok(Some(_))) => Some(false),
                            _ => None,
                        },
                        Err(_) => None,
                    },
                    None => None,
                };
                match renewed {
                    Some(true) => {
                        last_ok = tokio::time::Instant::now();
                        pause = every;
                    }
                    Some(false) => return,
                    None => {
                        if let Some((i, _)) = keeper.take() {
                            members.stream_failed(i, "lease renewal not answered");
                        }
                        if last_ok.elapsed() >= ttl {
                            return;
                        }
                        pause = Duration::from_millis(100);
                    }
                }
            }
        };
        let by_stop = tokio::select! {
            _ = stop => true,
            _ = held => false,
        };
        if crate::faults::check("rockq-etcd-revoke-late").is_err() {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        self.revoke(lease).await;
        by_stop
    }
}

/// What a watch saw of one key: written, or deleted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum WatchedKind {
    Put,
    /// With the value it had, for a watch that asked for it (`with_prev_key`).
    Delete {
        prev: Option<Vec<u8>>,
    },
}

impl EtcdStore {
    /// A stream of what `decode` makes of each event of a watch on `key` (`opts`: its range
    /// and start revision), one batch per answer; `decode` answers `None` for an event it
    /// skips. Ends (with `Err`) when the watch breaks, its start was compacted or an event does
    /// not decode: the caller re-reads what it follows and watches again.
    pub(super) async fn watch_events<T, F>(
        &self,
        key: Vec<u8>,
        opts: etcd_client::WatchOptions,
        decode: F,
    ) -> Result<impl futures::Stream<Item = Result<Vec<T>, StorageError>> + use<T, F>, StorageError>
    where
        F: Fn(WatchedKind, &etcd_client::KeyValue) -> Result<Option<T>, StorageError> + Clone,
    {
        let watch = self.members.watch(key, opts).await?;
        let members = self.members.clone();
        Ok(futures::stream::unfold(watch, move |mut s| {
            let (members, decode) = (members.clone(), decode.clone());
            async move {
                match s.next(&members).await {
                    Ok(Some(resp)) if resp.canceled() || resp.compact_revision() > 0 => {
                        Some((Err(StorageError::new("etcd watch cancelled or compacted")), s))
                    }
                    Ok(Some(resp)) => {
                        let mut out = Vec::with_capacity(resp.events().len());
                        for ev in resp.events() {
                            let Some(kv) = ev.kv() else { continue };
                            let kind = match ev.event_type() {
                                etcd_client::EventType::Put => WatchedKind::Put,
                                etcd_client::EventType::Delete => {
                                    WatchedKind::Delete { prev: ev.prev_kv().map(|p| p.value().to_vec()) }
                                }
                            };
                            match decode(kind, kv) {
                                Ok(Some(t)) => out.push(t),
                                Ok(None) => {}
                                Err(e) => return Some((Err(e), s)),
                            }
                        }
                        Some((Ok(out), s))
                    }
                    Ok(None) => None,
                    Err(e) => Some((Err(e), s)),
                }
            }
        }))
    }
}

impl EtcdStore {
    /// Adds `a` to a transaction as an append is: the compare on its queue's tail, the messages
    /// at the sequences after it, the new tail with `a`'s nonce. Returns the tail's key.
    fn push_append(&self, a: &DeadLetterAppend, cmps: &mut Vec<Compare>, ops: &mut Vec<TxnOp>) -> Vec<u8> {
        let tail = self.tail_key(a.qid);
        cmps.push(Compare::value(
            tail.clone(),
            CompareOp::Equal,
            encode_tail(a.expected_last, a.expected_nonce),
        ));
        // Refused like a moved tail while a large send call holds the queue (`reserve.rs`).
        cmps.push(self.no_reservation(a.qid));
        for (i, env) in a.envelopes.iter().enumerate() {
            self.push_message(a.qid, a.expected_last + 1 + i as u64, env, ops);
        }
        let last = a.expected_last + a.envelopes.len() as u64;
        ops.push(TxnOp::put(tail.clone(), encode_tail(last, a.nonce), None));
        tail
    }
}

/// The largest value the last read of each queue met (at least 1 byte; 1 KiB for a queue not
/// read yet).
#[derive(Default)]
struct Sizes(std::sync::Mutex<std::collections::HashMap<u32, usize>>);

impl Sizes {
    fn typical(&self, qid: u32) -> usize {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).get(&qid).copied().unwrap_or(1024).max(1)
    }

    fn learn(&self, qid: u32, sizes: impl IntoIterator<Item = usize>) {
        if let Some(largest) = sizes.into_iter().max() {
            self.0.lock().unwrap_or_else(|p| p.into_inner()).insert(qid, largest.max(1));
        }
    }
}

/// A single message larger than the client decodes: it cannot be read at all (it could not
/// have been written by rockq: one message is at most [`MAX_TXN_BYTES`]).
fn too_large(qid: u32, seq: u64) -> StorageError {
    StorageError::new(format!(
        "etcd: message {seq} of queue {qid} is larger than the client's 4 MiB answer limit"
    ))
}

/// What became of an [`EtcdStore::commit_ordered`].
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum CommitOutcome {
    Done,
    /// Another owner holds the group: nothing written.
    Lost,
    /// Still the owner, but the dead-letter queue's tail moved: nothing written.
    TailMoved,
}

/// One ordered group's progress, written by its owner (see [`EtcdStore::commit_ordered`]).
pub(crate) struct OrderedCommit<'a> {
    pub group: &'a str,
    pub queue: &'a str,
    pub owner: &'a [u8],
    pub offset: Option<u64>,
    pub put_marks: &'a [(u64, OrderedMark)],
    pub delete_marks: &'a [u64],
    /// Dead-letter copies appended to a queue with the same tail compare as an append.
    pub dead_letters: Option<DeadLetterAppend>,
}

/// Dead-letter copies for [`OrderedCommit`].
#[derive(Debug)]
pub(crate) struct DeadLetterAppend {
    pub qid: u32,
    pub expected_last: u64,
    pub expected_nonce: u64,
    pub nonce: u64,
    pub envelopes: Vec<Vec<u8>>,
}

/// The tail record: last sequence and the nonce of the append that wrote it.
fn encode_tail(last: u64, nonce: u64) -> Vec<u8> {
    let mut v = Vec::with_capacity(16);
    v.extend_from_slice(&last.to_be_bytes());
    v.extend_from_slice(&nonce.to_be_bytes());
    v
}

/// (last, nonce) of a tail record.
pub(crate) fn decode_tail(key: &[u8], v: &[u8]) -> Result<(u64, u64), StorageError> {
    let v: &[u8; 16] =
        v.try_into().map_err(|_| corrupt(CorruptionError::new("tail", key, "length is not 16")))?;
    let mut a = [0u8; 8];
    let mut b = [0u8; 8];
    a.copy_from_slice(&v[..8]);
    b.copy_from_slice(&v[8..]);
    Ok((u64::from_be_bytes(a), u64::from_be_bytes(b)))
}

/// A priority index entry (`rest`: its key after `N sp/`): queue id, sequence, priority.
pub(crate) fn decode_priority(rest: &[u8], key: &[u8], value: &[u8]) -> Result<(u32, u64, u8), StorageError> {
    let (qid, seq) = keys::decode_message_key(rest).map_err(corrupt)?;
    match value {
        &[p] if p > 0 => Ok((qid, seq, p)),
        _ => Err(corrupt(CorruptionError::new("priority entry", key, "expected one byte above 0"))),
    }
}

/// The last sequence purged, of a purge mark (`retention.rs`).
pub(crate) fn decode_purge(key: &[u8], value: &[u8]) -> Result<u64, StorageError> {
    <[u8; 8]>::try_from(value)
        .map(u64::from_be_bytes)
        .map_err(|_| corrupt(CorruptionError::new("purge mark", key, "not 8 bytes")))
}

/// The answers of a transaction's gets, in order (`None`: the key was absent).
fn answers(resp: &etcd_client::TxnResponse) -> impl Iterator<Item = Option<etcd_client::KeyValue>> + '_ {
    resp.op_responses().into_iter().filter_map(|r| match r {
        etcd_client::TxnOpResponse::Get(g) => Some(g.kvs().first().cloned()),
        _ => None,
    })
}

/// The values the answers to a transaction's gets found, in order (`None`: no such key).
fn values(resp: &etcd_client::TxnResponse) -> Vec<Option<Vec<u8>>> {
    answers(resp).map(|kv| kv.map(|kv| kv.value().to_vec())).collect()
}

/// `seqs` cut into the windows [`EtcdStore::read_seqs`] asks for together: in a namespace that
/// packs, ascending sequences less than [`segment::MAX_SPAN`] after the window's first; else
/// one each (every message is its own key).
///
/// Why that bound: a window's answer is the runs holding its two ends and the messages
/// between them (fewer than `MAX_SPAN`), however many of its sequences are asked — where a
/// get per sequence carried a whole run for every one.
fn read_windows(seqs: &[u64], packs: bool) -> std::collections::VecDeque<&[u64]> {
    let mut out = std::collections::VecDeque::new();
    let mut rest = seqs;
    while let Some(&first) = rest.first() {
        let mut len = 1;
        while packs && rest.get(len).is_some_and(|&s| s > rest[len - 1] && s - first < segment::MAX_SPAN) {
            len += 1;
        }
        let (w, r) = rest.split_at(len);
        out.push_back(w);
        rest = r;
    }
    out
}

/// How many gets [`EtcdStore::window_gets`] asks for window `w`.
fn gets_of_window(w: &[u64]) -> usize {
    if w.len() > 1 { 2 } else { 1 }
}

/// The answers to a transaction's gets, in order, each whole (a range get's every key).
fn whole_answers(resp: &etcd_client::TxnResponse) -> impl Iterator<Item = Vec<etcd_client::KeyValue>> + '_ {
    resp.op_responses().into_iter().filter_map(|r| match r {
        etcd_client::TxnOpResponse::Get(g) => Some(g.kvs().to_vec()),
        _ => None,
    })
}

/// The answers of a transaction's first two gets, each whole with its `more` flag.
type Gets = (Option<(Vec<etcd_client::KeyValue>, bool)>, Option<(Vec<etcd_client::KeyValue>, bool)>);
fn gets(resp: etcd_client::TxnResponse) -> Gets {
    let mut all = resp.op_responses().into_iter().filter_map(|r| match r {
        etcd_client::TxnOpResponse::Get(g) => Some((g.kvs().to_vec(), g.more())),
        _ => None,
    });
    (all.next(), all.next())
}

/// The answers of a transaction's first two gets, in order.
fn two_gets(
    resp: &etcd_client::TxnResponse,
) -> (Option<etcd_client::KeyValue>, Option<etcd_client::KeyValue>) {
    let mut gets = answers(resp);
    (gets.next().flatten(), gets.next().flatten())
}

fn first_get(resp: &etcd_client::TxnResponse) -> Option<etcd_client::KeyValue> {
    resp.op_responses().into_iter().find_map(|r| match r {
        etcd_client::TxnOpResponse::Get(g) => g.kvs().first().cloned(),
        _ => None,
    })
}

fn corrupt(e: CorruptionError) -> StorageError {
    StorageError::corrupt(e)
}

/// Decodes an envelope read from etcd (keyed like RocksDB's message key for error reports).
pub(crate) fn decode_envelope(qid: u32, seq: u64, v: &[u8]) -> Result<envelope::Envelope, CorruptionError> {
    envelope::decode(&keys::message_key(qid, seq), v)
}

#[cfg(test)]
mod tests {
    use super::{gets_of_window, read_windows, segment::MAX_SPAN};

    #[test]
    fn sequences_less_than_a_run_span_apart_share_a_window_only_where_runs_are_packed() {
        let seqs = [1, 3, 5, MAX_SPAN, MAX_SPAN + 1, MAX_SPAN + 2, 3 * MAX_SPAN, 3 * MAX_SPAN];
        let packed: Vec<&[u64]> = read_windows(&seqs, true).into_iter().collect();
        // MAX_SPAN is MAX_SPAN - 1 after 1: still inside; MAX_SPAN + 1 is a whole span after
        // it, and starts the next. A repeated sequence does not ascend: a window of its own.
        let want: [&[u64]; 4] =
            [&[1, 3, 5, MAX_SPAN], &[MAX_SPAN + 1, MAX_SPAN + 2], &[3 * MAX_SPAN], &[3 * MAX_SPAN]];
        assert_eq!(packed, want);
        assert_eq!(packed.iter().map(|w| gets_of_window(w)).collect::<Vec<_>>(), [2, 2, 1, 1]);
        let unpacked: Vec<&[u64]> = read_windows(&seqs, false).into_iter().collect();
        assert_eq!(unpacked, seqs.iter().map(std::slice::from_ref).collect::<Vec<_>>());
        assert!(read_windows(&[], true).is_empty());
    }

    proptest::proptest! {
        /// The windows are `seqs` in order, cut; each ascends and spans less than a run.
        #[test]
        fn windows_cover_the_sequences_in_order(seqs in proptest::collection::vec(0u64..1000, 0..300)) {
            let windows = read_windows(&seqs, true);
            let joined: Vec<u64> = windows.iter().flat_map(|w| w.iter().copied()).collect();
            proptest::prop_assert_eq!(&joined, &seqs);
            for w in &windows {
                proptest::prop_assert!(w.windows(2).all(|p| p[0] < p[1]));
                proptest::prop_assert!(w[w.len() - 1] - w[0] < MAX_SPAN);
            }
        }
    }
}
