//! Export of an etcd namespace: every record of rockq's under it, read at one revision, as the
//! lines of `crate::export::record` (the same lines as an embedded database's: the records
//! are the same codecs). What only etcd has is left out: tails become each queue's
//! `last_seq`, and ownership keys, purge marks and work groups' reset marks are coordination
//! between live processes, not state.

use std::collections::HashMap;

use etcd_client::GetOptions;

use super::reset::RESET_MARK_SEQ;
use super::{EtcdStore, corrupt, decode_tail};
use crate::error::{CorruptionError, Error, StorageError};
use crate::export::record::{EXPORTED_QUEUE_ID, FORMAT_NAME, FORMAT_VERSION, Header, Record};
use crate::store::{keys, records, scheduled};

/// Entries one read asks for at most (fewer when their values outgrow the answer limit).
const PAGE: i64 = 512;

/// Where the lines go: a batch at a time (a page of reads), to the thread writing them.
pub(crate) type Sink = tokio::sync::mpsc::Sender<Vec<Record>>;

/// The sink, counting the lines sent.
struct Out<'a> {
    tx: &'a Sink,
    lines: u64,
}

impl Out<'_> {
    async fn send(&mut self, batch: Vec<Record>) -> Result<(), Error> {
        self.lines += batch.len() as u64;
        // The writer stopped on an error of its own, which the caller reports.
        self.tx.send(batch).await.map_err(|_| Error::Internal("the export's writer stopped".into()))
    }
}

impl EtcdStore {
    /// Every `(key without the namespace prefix and kind, value)` of `kind` at revision
    /// `rev` with keys in `[from, to)` (both after the kind; `to` empty: to the kind's end),
    /// a page at a time, made into lines by `each` and sent to `out`.
    async fn pages(
        &self,
        kind: &[u8],
        range: (&[u8], &[u8]),
        rev: i64,
        out: &mut Out<'_>,
        mut each: impl FnMut(Vec<(Vec<u8>, Vec<u8>)>) -> Result<Vec<Record>, Error>,
    ) -> Result<(), Error> {
        self.pages_at(kind, range, rev, out, |page| each(page.into_iter().map(|(k, v, _)| (k, v)).collect()))
            .await
    }

    /// [`pages`](Self::pages) with each record's `mod_revision`.
    async fn pages_at(
        &self,
        kind: &[u8],
        (from, to): (&[u8], &[u8]),
        rev: i64,
        out: &mut Out<'_>,
        mut each: impl FnMut(Vec<(Vec<u8>, Vec<u8>, i64)>) -> Result<Vec<Record>, Error>,
    ) -> Result<(), Error> {
        let base = self.key(kind, b"");
        let end = if to.is_empty() {
            crate::store::prefix_end(&base).unwrap_or_default()
        } else {
            self.key(kind, to)
        };
        let mut start = self.key(kind, from);
        let mut limit = PAGE;
        loop {
            let opts = GetOptions::new().with_range(end.clone()).with_limit(limit).with_revision(rev);
            let Some(got) = self.kv().get_bounded(start.clone(), Some(opts)).await? else {
                if limit == 1 {
                    return Err(StorageError::new(
                        "etcd: one record is larger than the client's answer limit",
                    )
                    .into());
                }
                limit = (limit / 4).max(1);
                continue;
            };
            let page: Vec<_> = got
                .kvs()
                .iter()
                .map(|kv| (kv.key()[base.len()..].to_vec(), kv.value().to_vec(), kv.mod_revision()))
                .collect();
            let Some(last) = got.kvs().last() else { return Ok(()) };
            start = [last.key(), &[0][..]].concat();
            let more = got.more();
            let batch = each(page)?;
            if !batch.is_empty() {
                out.send(batch).await?;
            }
            if !more {
                return Ok(());
            }
        }
    }

    /// Reads the namespace at one revision and hands its lines to `sink`, header first and
    /// `end` last.
    pub(crate) async fn export(&self, now_micros: u64, sink: &Sink) -> Result<(), Error> {
        let first = self.kv().get_long(self.key(b"q/", b""), Some(GetOptions::new().with_prefix())).await?;
        let rev = first.header().map_or(0, |h| h.revision());
        let out = &mut Out { tx: sink, lines: 0 };
        const ALL: (&[u8], &[u8]) = (b"", b"");

        let mut queues = Vec::new();
        for kv in first.kvs() {
            let name = std::str::from_utf8(&kv.key()[self.key(b"q/", b"").len()..])
                .map_err(|_| corrupt(CorruptionError::new("queue", kv.key(), "name is not UTF-8")))?
                .to_owned();
            let meta = records::decode_queue(kv.key(), kv.value()).map_err(corrupt)?;
            queues.push((name, meta));
        }
        // The tails, read without sending anything.
        let mut lasts = HashMap::new();
        let tails = &mut Out { tx: sink, lines: 0 };
        self.pages(b"t/", ALL, rev, tails, |page| {
            for (k, v) in page {
                let qid = <[u8; 4]>::try_from(k.as_slice())
                    .map(u32::from_be_bytes)
                    .map_err(|_| corrupt(CorruptionError::new("tail", &k, "key is not a queue id")))?;
                lasts.insert(qid, decode_tail(&k, &v)?.0);
            }
            Ok(Vec::new())
        })
        .await?;
        let last_of =
            |meta: &crate::model::QueueMeta| lasts.get(&meta.id).copied().unwrap_or(meta.first_seq - 1);
        let messages = queues.iter().map(|(_, m)| (last_of(m) + 1).saturating_sub(m.first_seq)).sum();
        out.send(vec![Record::Header(Header {
            format: FORMAT_NAME.into(),
            version: FORMAT_VERSION,
            records_format: records::FORMAT_VERSION,
            source: "etcd".into(),
            rockq: env!("CARGO_PKG_VERSION").into(),
            exported_at_micros: now_micros,
            messages,
        })])
        .await?;

        let names: HashMap<u32, &str> = queues.iter().map(|(n, m)| (m.id, n.as_str())).collect();
        for (name, meta) in &queues {
            let last = last_of(meta);
            let record =
                records::encode_queue(&crate::model::QueueMeta { id: EXPORTED_QUEUE_ID, ..*meta }).to_vec();
            out.send(vec![Record::Queue {
                name: name.clone(),
                first_seq: meta.first_seq,
                last_seq: last,
                record,
            }])
            .await?;
            if last < meta.first_seq {
                continue;
            }
            let from = keys::message_key(meta.id, meta.first_seq);
            let to = keys::message_upper_bound(meta.id, last);
            self.pages(b"m/", (&from, &to), rev, out, |page| {
                let mut batch = Vec::with_capacity(page.len());
                for (k, v) in page {
                    // A packed run keyed by its last sequence ([`super::segment`]); a trim
                    // may have cut through the first run, whose messages below the queue's
                    // first sequence are gone for every reader.
                    let (_, last) = keys::decode_message_key(&k).map_err(corrupt)?;
                    for (seq, env) in super::segment::decode(&k, last, &v)? {
                        if seq >= meta.first_seq {
                            let body = crate::store::export::body(&keys::message_key(meta.id, seq), env)?;
                            batch.push(Record::Message { queue: name.clone(), seq, body });
                        }
                    }
                }
                Ok(batch)
            })
            .await?;
        }
        self.pages(b"g/", ALL, rev, out, |page| {
            let mut batch = Vec::new();
            for (k, v) in page {
                let (group, queue) = keys::parse_group_key(&k)?;
                records::decode_settings(&k, &v)?;
                batch.push(Record::Group { group: group.into(), queue: queue.into(), record: v });
            }
            Ok(batch)
        })
        .await?;
        self.pages(b"r/", ALL, rev, out, |page| {
            let mut batch = Vec::new();
            for (k, v) in page {
                // A dead letter settled on its own: `letter:<dlq>:<seq u64>`.
                if k.starts_with(b"letter:") {
                    let (dlq, seq) = keys::parse_letter_key(&k)?;
                    batch.push(Record::Letter { dlq: dlq.into(), seq });
                    continue;
                }
                let dlq = k.strip_prefix(b"redrive:").and_then(|d| std::str::from_utf8(d).ok()).ok_or_else(
                    || CorruptionError::new("redrive cursor key", &k, "expected redrive:<dlq>"),
                )?;
                records::decode_cursor(&k, &v)?;
                batch.push(Record::Redrive { dlq: dlq.into(), record: v });
            }
            Ok(batch)
        })
        .await?;
        // Each group's offset: a range record's jobs it passed are finished, not exported.
        let mut offsets = std::collections::HashMap::new();
        self.pages(b"o/", ALL, rev, out, |page| {
            let mut batch = Vec::new();
            for (k, v) in page {
                let (group, queue) = keys::parse_offset_key(&k)?;
                let offset = records::decode_offset(&k, &v)?;
                offsets.insert((group.to_owned(), queue.to_owned()), offset.committed);
                batch.push(Record::Offset { group: group.into(), queue: queue.into(), record: v });
            }
            Ok(batch)
        })
        .await?;
        // A range record's jobs go out as records of their own (`claim_ranges.rs`), unless
        // one has its own record: that, read just before (it sorts first), stands. The last
        // such records, by group and queue, for the runs that follow them.
        let mut own: Option<(String, String, std::collections::BTreeSet<u64>)> = None;
        self.pages(b"c/", ALL, rev, out, |page| {
            let mut batch = Vec::new();
            for (k, v) in page {
                // The bucket of a rate limit (`limits.rs`) is not carried: an import starts
                // with a full one.
                if super::limits::is_limit_key(&k) || super::claim_ranges::is_moved_key(&k) {
                    continue;
                }
                if let Some((group, queue, last)) = super::claim_ranges::parse_run_key(&k) {
                    let mine = own.as_ref().filter(|(g, q, _)| g == group && q == queue).map(|(_, _, s)| s);
                    let passed = offsets.get(&(group.to_owned(), queue.to_owned())).copied().unwrap_or(0);
                    for (seq, claim) in super::claim_ranges::decode(&k, last, &v)? {
                        if seq <= passed || mine.is_some_and(|s| s.contains(&seq)) {
                            continue;
                        }
                        let record = records::encode_claim(&claim);
                        batch.push(Record::Claim { group: group.into(), queue: queue.into(), seq, record });
                    }
                    continue;
                }
                let (group, queue, seq) = keys::parse_claim_key(&k)?;
                match &mut own {
                    Some((g, q, seqs)) if g == group && q == queue => {
                        // Only the last run's length matters.
                        seqs.retain(|&s| s + super::claim_ranges::MAX_RUN > seq);
                        seqs.insert(seq);
                    }
                    _ => own = Some((group.to_owned(), queue.to_owned(), [seq].into())),
                }
                if seq == RESET_MARK_SEQ {
                    continue;
                }
                records::decode_claim(&k, &v)?;
                batch.push(Record::Claim { group: group.into(), queue: queue.into(), seq, record: v });
            }
            Ok(batch)
        })
        .await?;
        self.pages(b"j/", ALL, rev, out, |page| {
            let mut batch = Vec::new();
            for (k, v) in page {
                if k.starts_with(b"progress:") {
                    let (group, queue, seq) = keys::parse_progress_key(&k)?;
                    crate::store::outcomes::decode_progress(&k, &v)?;
                    batch.push(Record::Progress { group: group.into(), queue: queue.into(), seq, record: v });
                    continue;
                }
                let (group, queue, seq) = keys::parse_outcome_key(&k)?;
                crate::store::outcomes::decode_outcome(&k, &v)?;
                batch.push(Record::Outcome { group: group.into(), queue: queue.into(), seq, record: v });
            }
            Ok(batch)
        })
        .await?;
        self.pages(b"k/", ALL, rev, out, |page| {
            let mut batch = Vec::new();
            for (k, v) in page {
                let (group, queue, seq) = keys::parse_ordered_key(&k)?;
                records::decode_mark(&k, &v)?;
                batch.push(Record::Delivery { group: group.into(), queue: queue.into(), seq, record: v });
            }
            Ok(batch)
        })
        .await?;
        self.pages(b"w/", ALL, rev, out, |page| {
            let mut batch = Vec::new();
            for (k, v) in page {
                let name = String::from_utf8(k.clone())
                    .map_err(|_| CorruptionError::new("schedule key", &k, "name is not UTF-8"))?;
                scheduled::decode_schedule(&k, &v)?;
                batch.push(Record::Schedule { name, record: v });
            }
            Ok(batch)
        })
        .await?;
        self.pages(b"x/", ALL, rev, out, |page| {
            let mut batch = Vec::new();
            for (k, v) in page {
                let bad = || CorruptionError::new("delayed message key", &k, "expected <queue><id>");
                let (q, id) = k.split_first_chunk::<4>().ok_or_else(bad)?;
                let id: [u8; 8] = id.try_into().map_err(|_| bad())?;
                let (due_micros, env) = super::delayed::decode_record(&k, &v)?;
                let id = u64::from_be_bytes(id);
                if u32::from_be_bytes(*q) == crate::store::keys::RECURRING {
                    // A recurring schedule's pending firing: its value is the schedule's name.
                    let name = String::from_utf8(env).map_err(|_| bad())?;
                    batch.push(Record::ScheduleDue { name, id, due_micros });
                } else if let Some(queue) = names.get(&u32::from_be_bytes(*q)) {
                    let body = crate::store::export::body(&k, &env)?;
                    batch.push(Record::Delayed { queue: (*queue).into(), id, due_micros, body });
                }
            }
            Ok(batch)
        })
        .await?;
        self.pages(b"d/", ALL, rev, out, |page| {
            let mut batch = Vec::new();
            for (k, v) in page {
                let bad = || CorruptionError::new("idempotency record key", &k, "expected <queue><key>");
                let qid =
                    k.get(..4).and_then(|b| b.try_into().ok()).map(u32::from_be_bytes).ok_or_else(bad)?;
                let key = std::str::from_utf8(&k[4..]).map_err(|_| bad())?.to_owned();
                scheduled::decode_dedup(&k, &v)?;
                if let Some(queue) = names.get(&qid) {
                    batch.push(Record::Dedup { queue: (*queue).into(), key, record: v });
                }
            }
            Ok(batch)
        })
        .await?;
        // Keyspaces, each before its entries (in key order); an entry's revision is its etcd
        // `mod_revision`, and the counter is the export's revision (above every entry's): an
        // import into the embedded engine goes on above them.
        let mut keyspaces = Vec::new();
        self.pages(b"sk/", ALL, rev, out, |page| {
            for (k, v) in page {
                let name = String::from_utf8(k.clone())
                    .map_err(|_| CorruptionError::new("keyspace key", &k, "name is not UTF-8"))?;
                keyspaces.push((name, super::kv::decode_keyspace(&k, &v)?));
            }
            Ok(Vec::new())
        })
        .await?;
        for (name, id) in &keyspaces {
            out.send(vec![Record::Keyspace { name: name.clone() }]).await?;
            let (from, to) =
                (id.to_be_bytes(), crate::store::prefix_end(&id.to_be_bytes()).unwrap_or_default());
            self.pages_at(b"v/", (&from, &to), rev, out, |page| {
                let mut batch = Vec::with_capacity(page.len());
                for (k, v, at) in page {
                    let (revision, value) = super::kv::decode_entry(&k, &v, at)?;
                    batch.push(Record::Entry {
                        keyspace: name.clone(),
                        key: k[4..].to_vec(),
                        revision,
                        value,
                    });
                }
                Ok(batch)
            })
            .await?;
        }
        out.send(vec![Record::Counter { name: "kv-revision".into(), value: rev as u64 }]).await?;
        let records = out.lines;
        out.send(vec![Record::End { records }]).await
    }
}
