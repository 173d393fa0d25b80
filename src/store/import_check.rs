//! Reading an export file for an import, into either engine: each line parsed and checked
//! (names, sequences in order and inside their queue's range, records that decode, the `end`
//! count), ids handed out, and turned into the write it makes. Nothing here writes.

use std::collections::{BTreeMap, HashMap};
use std::io::BufRead;

use super::{envelope, keys, records, scheduled};
use crate::error::NameKind;
use crate::error::{CorruptionError, Error};
use crate::export::record::{Body, FORMAT_NAME, FORMAT_VERSION, Record};
use crate::export::{PROGRESS_EVERY, ProgressFn, TransferReport};
use crate::message::Message;
use crate::model::QueueMeta;
use crate::name::validate;

pub(super) fn invalid(n: u64, reason: impl std::fmt::Display) -> Error {
    Error::Invalid { reason: format!("import, line {n}: {reason}") }
}

/// One checked line, as the write it makes (ids are the new database's).
#[derive(Debug)]
pub(crate) enum Write {
    // `last_seq`: the etcd import writes the tail; the embedded one knows it from the messages.
    #[cfg_attr(not(feature = "etcd"), allow(dead_code))]
    Queue {
        name: String,
        meta: QueueMeta,
        last_seq: u64,
    },
    Message {
        qid: u32,
        seq: u64,
        envelope: Vec<u8>,
    },
    Delayed {
        qid: u32,
        id: u64,
        due_micros: u64,
        envelope: Vec<u8>,
    },
    Group {
        group: String,
        queue: String,
        record: Vec<u8>,
    },
    Offset {
        group: String,
        queue: String,
        record: Vec<u8>,
    },
    Claim {
        group: String,
        queue: String,
        seq: u64,
        record: Vec<u8>,
    },
    Delivery {
        group: String,
        queue: String,
        seq: u64,
        record: Vec<u8>,
    },
    Outcome {
        group: String,
        queue: String,
        seq: u64,
        record: Vec<u8>,
    },
    Progress {
        group: String,
        queue: String,
        seq: u64,
        record: Vec<u8>,
    },
    Redrive {
        dlq: String,
        record: Vec<u8>,
    },
    Letter {
        dlq: String,
        seq: u64,
    },
    Schedule {
        name: String,
        record: Vec<u8>,
    },
    ScheduleDue {
        name: String,
        id: u64,
        due_micros: u64,
    },
    Dedup {
        qid: u32,
        key: String,
        record: Vec<u8>,
        expires_micros: u64,
    },
    /// (Its name and id are read by the import into etcd only, feature `etcd`.)
    #[cfg_attr(not(feature = "etcd"), allow(dead_code))]
    Keyspace {
        name: String,
        id: u32,
    },
    Entry {
        keyspace: u32,
        key: Vec<u8>,
        revision: u64,
        value: Vec<u8>,
    },
    ScheduledId(u64),
}

/// What the whole file set up, once read: each keyspace with its id and count of keys, and
/// the keyspace revision to go on from.
#[derive(Debug, Default)]
pub(crate) struct Summary {
    pub keyspaces: Vec<(String, u32, u64)>,
    pub kv_revision: u64,
}

struct QueueIn {
    id: u32,
    first_seq: u64,
    last_seq: u64,
    seen: Option<u64>,
}

struct KeyspaceIn {
    id: u32,
    keys: u64,
    last_key: Option<Vec<u8>>,
}

/// Reads and checks an export file, line after line.
pub(crate) struct Reader {
    input: Box<dyn BufRead + Send>,
    line: String,
    n: u64,
    ended: bool,
    report: TransferReport,
    total: u64,
    progress: Option<ProgressFn>,
    queues: HashMap<String, QueueIn>,
    keyspaces: BTreeMap<String, KeyspaceIn>,
    next_queue_id: u32,
    next_keyspace_id: u32,
    max_revision: u64,
    kv_revision: Option<u64>,
}

impl Reader {
    pub fn new(input: Box<dyn BufRead + Send>, progress: Option<ProgressFn>) -> Reader {
        Reader {
            input,
            line: String::new(),
            n: 0,
            ended: false,
            report: TransferReport::default(),
            total: 0,
            progress,
            queues: HashMap::new(),
            keyspaces: BTreeMap::new(),
            next_queue_id: 1,
            next_keyspace_id: 1,
            max_revision: 0,
            kv_revision: None,
        }
    }

    /// The next write with its line number, `None` once the file ended as it should.
    ///
    /// # Errors
    ///
    /// `Error::Invalid` naming the line, `Error::IncompatibleVersion`, `Error::Io`.
    pub fn next(&mut self) -> Result<Option<(u64, Write)>, Error> {
        loop {
            self.line.clear();
            let read = self
                .input
                .read_line(&mut self.line)
                .map_err(|e| Error::Io { path: None, source: e.into() })?;
            if read == 0 {
                if !self.ended {
                    return Err(invalid(self.n, "the file ends without its end line: it was cut short"));
                }
                if let Some(f) = self.progress.as_mut() {
                    f(&self.report.progress(self.total));
                }
                return Ok(None);
            }
            self.n += 1;
            let n = self.n;
            if self.ended {
                return Err(invalid(n, "a line after the end line"));
            }
            let text = self.line.strip_suffix('\n').unwrap_or(&self.line);
            let record = Record::parse(n, text)
                .map_err(|reason| Error::Invalid { reason: format!("import, {reason}") })?;
            self.report.count(&record, read as u64);
            if self.report.records.is_multiple_of(PROGRESS_EVERY)
                && let Some(f) = self.progress.as_mut()
            {
                f(&self.report.progress(self.total));
            }
            if let Some(w) = self.check(n, record)? {
                return Ok(Some((n, w)));
            }
        }
    }

    /// What the file set up; after [`next`](Self::next) returned `None`.
    pub fn summary(&self) -> Summary {
        let keyspaces = self.keyspaces.iter().map(|(name, k)| (name.clone(), k.id, k.keys)).collect();
        let kv_revision = self.kv_revision.unwrap_or(0).max(self.max_revision);
        Summary { keyspaces, kv_revision }
    }

    /// What was read, and what the file set up.
    pub fn finish(self) -> (TransferReport, Summary) {
        let summary = self.summary();
        (self.report, summary)
    }

    fn queue(&self, n: u64, q: &str) -> Result<u32, Error> {
        self.queues
            .get(q)
            .map(|q| q.id)
            .ok_or_else(|| invalid(n, format!("queue {q:?} has no queue line before it")))
    }

    /// Checks one line: the write it makes, if any.
    fn check(&mut self, n: u64, r: Record) -> Result<Option<Write>, Error> {
        let bad = |e: CorruptionError| invalid(n, e);
        if n == 1 {
            let Record::Header(h) = &r else { return Err(invalid(n, "the first line is not a header")) };
            if h.format != FORMAT_NAME {
                return Err(invalid(n, format!("format {:?} is not {FORMAT_NAME:?}", h.format)));
            }
            if h.version != FORMAT_VERSION {
                return Err(invalid(
                    n,
                    format!(
                        "export format version {} (this build reads version {FORMAT_VERSION})",
                        h.version
                    ),
                ));
            }
            if h.records_format != records::FORMAT_VERSION {
                return Err(Error::IncompatibleVersion {
                    found: h.records_format,
                    supported: records::FORMAT_VERSION,
                });
            }
            self.total = h.messages;
            return Ok(None);
        }
        Ok(Some(match r {
            Record::Header(_) => return Err(invalid(n, "a second header")),
            Record::Queue { name: q, first_seq, last_seq, record } => {
                name(n, NameKind::Queue, &q)?;
                let mut meta = records::decode_queue(&keys::queue_key(&q), &record).map_err(bad)?;
                if self.queues.contains_key(q.as_str()) {
                    return Err(invalid(n, format!("queue {q:?} twice")));
                }
                if meta.first_seq != first_seq || first_seq == 0 || last_seq < first_seq - 1 {
                    return Err(invalid(n, "first_seq and last_seq disagree with the queue record"));
                }
                if self.next_queue_id >= u32::MAX - 1 {
                    return Err(invalid(n, "more queues than a database can hold"));
                }
                meta.id = self.next_queue_id;
                self.next_queue_id += 1;
                self.queues.insert(q.clone(), QueueIn { id: meta.id, first_seq, last_seq, seen: None });
                Write::Queue { name: q, meta, last_seq }
            }
            Record::Message { queue: q, seq, body } => {
                let qid = self.queue(n, &q)?;
                let Some(qi) = self.queues.get_mut(q.as_str()) else { return Ok(None) };
                if seq < qi.first_seq || seq > qi.last_seq || qi.seen.is_some_and(|s| seq <= s) {
                    return Err(invalid(
                        n,
                        format!("message {seq} of {q:?} is out of order or outside its queue's range"),
                    ));
                }
                qi.seen = Some(seq);
                Write::Message { qid, seq, envelope: envelope_of(n, body)? }
            }
            Record::Delayed { queue: q, id, due_micros, body } => {
                let qid = self.queue(n, &q)?;
                Write::Delayed { qid, id, due_micros, envelope: envelope_of(n, body)? }
            }
            Record::Group { group, queue, record } => {
                pair(n, &group, &queue)?;
                records::decode_settings(&keys::group_key(&group, &queue), &record).map_err(bad)?;
                Write::Group { group, queue, record }
            }
            Record::Offset { group, queue, record } => {
                pair(n, &group, &queue)?;
                records::decode_offset(&keys::offset_key(&group, &queue), &record).map_err(bad)?;
                Write::Offset { group, queue, record }
            }
            Record::Claim { group, queue, seq, record } => {
                pair(n, &group, &queue)?;
                records::decode_claim(&keys::claim_key(&keys::claim_prefix(&group, &queue), seq), &record)
                    .map_err(bad)?;
                Write::Claim { group, queue, seq, record }
            }
            Record::Delivery { group, queue, seq, record } => {
                pair(n, &group, &queue)?;
                records::decode_mark(&keys::claim_key(&keys::ordered_prefix(&group, &queue), seq), &record)
                    .map_err(bad)?;
                Write::Delivery { group, queue, seq, record }
            }
            Record::Outcome { group, queue, seq, record } => {
                pair(n, &group, &queue)?;
                super::outcomes::decode_outcome(
                    &keys::claim_key(&keys::outcome_prefix(&group, &queue), seq),
                    &record,
                )
                .map_err(bad)?;
                Write::Outcome { group, queue, seq, record }
            }
            Record::Progress { group, queue, seq, record } => {
                pair(n, &group, &queue)?;
                super::outcomes::decode_progress(
                    &keys::claim_key(&keys::progress_prefix(&group, &queue), seq),
                    &record,
                )
                .map_err(bad)?;
                Write::Progress { group, queue, seq, record }
            }
            Record::Redrive { dlq, record } => {
                name(n, NameKind::Queue, &dlq)?;
                records::decode_cursor(&keys::redrive_key(&dlq), &record).map_err(bad)?;
                Write::Redrive { dlq, record }
            }
            Record::Letter { dlq, seq } => {
                name(n, NameKind::Queue, &dlq)?;
                Write::Letter { dlq, seq }
            }
            Record::Schedule { name: s, record } => {
                name(n, NameKind::Queue, &s)?;
                scheduled::decode_schedule(&keys::schedule_key(&s), &record).map_err(bad)?;
                Write::Schedule { name: s, record }
            }
            Record::ScheduleDue { name: s, id, due_micros } => {
                name(n, NameKind::Queue, &s)?;
                Write::ScheduleDue { name: s, id, due_micros }
            }
            Record::Dedup { queue: q, key, record } => {
                let qid = self.queue(n, &q)?;
                if key.is_empty() || key.len() > crate::message::MAX_KEY_LEN {
                    return Err(invalid(n, "an idempotency key must be 1 to MAX_KEY_LEN bytes"));
                }
                let d =
                    scheduled::decode_dedup(&keys::dedup_key(qid, key.as_bytes()), &record).map_err(bad)?;
                Write::Dedup { qid, key, record, expires_micros: d.expires_micros }
            }
            Record::Keyspace { name: ks } => {
                name(n, NameKind::Keyspace, &ks)?;
                if self.keyspaces.contains_key(ks.as_str()) {
                    return Err(invalid(n, format!("keyspace {ks:?} twice")));
                }
                let id = self.next_keyspace_id;
                self.next_keyspace_id += 1;
                self.keyspaces.insert(ks.clone(), KeyspaceIn { id, keys: 0, last_key: None });
                Write::Keyspace { name: ks, id }
            }
            Record::Entry { keyspace, key, revision, value } => {
                let Some(ks) = self.keyspaces.get_mut(keyspace.as_str()) else {
                    return Err(invalid(n, format!("keyspace {keyspace:?} has no keyspace line before it")));
                };
                if key.is_empty() || key.len() > crate::entry::MAX_KV_KEY_LEN {
                    return Err(invalid(n, "a keyspace key must be 1 to MAX_KV_KEY_LEN bytes"));
                }
                if ks.last_key.as_ref().is_some_and(|last| &key <= last) {
                    return Err(invalid(n, "keyspace entries out of key order"));
                }
                ks.last_key = Some(key.clone());
                ks.keys += 1;
                self.max_revision = self.max_revision.max(revision);
                Write::Entry { keyspace: ks.id, key, revision, value }
            }
            Record::Counter { name: c, value } => match c.as_str() {
                "scheduled-id" => Write::ScheduledId(value),
                "kv-revision" => {
                    self.kv_revision = Some(value);
                    return Ok(None);
                }
                other => return Err(invalid(n, format!("unknown counter {other:?}"))),
            },
            Record::End { records } => {
                if records != n - 1 {
                    return Err(invalid(
                        n,
                        format!("the end line counts {records} lines before it, the file has {}", n - 1),
                    ));
                }
                self.ended = true;
                return Ok(None);
            }
        }))
    }
}

fn name(n: u64, kind: NameKind, name: &str) -> Result<(), Error> {
    validate(kind, name).map_err(|e| invalid(n, e))
}

fn pair(n: u64, group: &str, queue: &str) -> Result<(), Error> {
    name(n, NameKind::Group, group)?;
    name(n, NameKind::Queue, queue)
}

fn envelope_of(n: u64, body: Body) -> Result<Vec<u8>, Error> {
    let at = body.enqueued_at_micros;
    let msg = Message {
        payload: body.payload.into(),
        headers: body.headers.into_iter().map(|(k, v)| (k, v.into())).collect(),
        key: body.key,
        idempotency_key: body.idempotency_key,
        priority: body.priority,
        due: None,
    };
    envelope::validate(&msg)
        .map_err(|e| invalid(n, format!("the message is not one rockq can store: {e:?}")))?;
    envelope::encode(&msg, at).map_err(|e| invalid(n, format!("{e:?}")))
}
