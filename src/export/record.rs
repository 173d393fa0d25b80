//! The lines of an export file: one JSON object per line, told apart by `"t"`.
//!
//! Names, sequences, messages and keyspace entries are plain JSON (bytes as standard base64,
//! padded), so other tools can read and write them. The state records (a queue's settings, a
//! group's offset and settings, claims, delivery marks, redrive cursors, schedules,
//! idempotency records) are carried as `"record"`: rockq's storage encoding of them, base64,
//! of the database format named in the header (`records_format`). Ids of queues and keyspaces
//! are never exported: they are local to a database, and an import hands out its own.

use serde::{Deserialize, Serialize};

/// `"format"` of an export file's header.
pub(crate) const FORMAT_NAME: &str = "rockq-export";
/// The version of the line format this build writes and reads.
pub(crate) const FORMAT_VERSION: u32 = 1;

/// The queue id every exported queue record holds: ids are local to a database (an import
/// hands out its own), so two exports of one state are the same whatever ids their databases
/// used. 1 because a record's id must be a valid one to decode.
pub(crate) const EXPORTED_QUEUE_ID: u32 = 1;

/// One line.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "t", rename_all = "snake_case", deny_unknown_fields)]
pub(crate) enum Record {
    /// Always the first line.
    Header(Header),
    /// A queue, before its messages, delayed messages and idempotency records.
    Queue {
        name: String,
        /// The first sequence the queue still holds (everything below was trimmed or purged).
        first_seq: u64,
        /// The last sequence written (`first_seq - 1`: empty).
        last_seq: u64,
        #[serde(with = "b64")]
        record: Vec<u8>,
    },
    /// A message of a queue, in sequence order.
    Message { queue: String, seq: u64, body: Body },
    /// A delayed message, not yet in its queue.
    Delayed {
        queue: String,
        /// Its id (what `cancel` and `reschedule` name).
        id: u64,
        due_micros: u64,
        body: Body,
    },
    /// A group's settings record (paused, dead-letter queue, lease and retry terms).
    Group {
        group: String,
        queue: String,
        #[serde(with = "b64")]
        record: Vec<u8>,
    },
    /// A group's offset record (its mode and last committed sequence).
    Offset {
        group: String,
        queue: String,
        #[serde(with = "b64")]
        record: Vec<u8>,
    },
    /// A work group's claim on one message above its offset (lease, retry waiting, done).
    Claim {
        group: String,
        queue: String,
        seq: u64,
        #[serde(with = "b64")]
        record: Vec<u8>,
    },
    /// An ordered group's delivery mark on one message above its offset.
    Delivery {
        group: String,
        queue: String,
        seq: u64,
        #[serde(with = "b64")]
        record: Vec<u8>,
    },
    /// A work group's kept outcome of one job (`WorkGroup::keep_outcomes`).
    Outcome {
        group: String,
        queue: String,
        seq: u64,
        #[serde(with = "b64")]
        record: Vec<u8>,
    },
    /// A work group's last progress report on one unfinished job (`Task::progress`).
    Progress {
        group: String,
        queue: String,
        seq: u64,
        #[serde(with = "b64")]
        record: Vec<u8>,
    },
    /// A dead-letter queue's redrive cursor.
    Redrive {
        dlq: String,
        #[serde(with = "b64")]
        record: Vec<u8>,
    },
    /// A dead letter above its queue's redrive cursor that was settled on its own.
    Letter { dlq: String, seq: u64 },
    /// A recurring schedule.
    Schedule {
        name: String,
        #[serde(with = "b64")]
        record: Vec<u8>,
    },
    /// A recurring schedule's entry in the due index.
    ScheduleDue { name: String, id: u64, due_micros: u64 },
    /// An idempotency key's record.
    Dedup {
        queue: String,
        key: String,
        #[serde(with = "b64")]
        record: Vec<u8>,
    },
    /// A keyspace, before its entries.
    Keyspace { name: String },
    /// A keyspace entry, in key order.
    Entry {
        keyspace: String,
        #[serde(with = "b64")]
        key: Vec<u8>,
        /// The revision of the write that stored it.
        revision: u64,
        #[serde(with = "b64")]
        value: Vec<u8>,
    },
    /// A database-wide counter (`scheduled-id`: the next schedule id; `kv-revision`: the last
    /// keyspace revision handed out).
    Counter { name: String, value: u64 },
    /// Always the last line: how many lines came before it, header included. A file without
    /// it was cut short.
    End { records: u64 },
}

/// The first line.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Header {
    /// Always [`FORMAT_NAME`].
    pub format: String,
    /// The line format's version ([`FORMAT_VERSION`]).
    pub version: u32,
    /// The database format of the `record` fields.
    pub records_format: u8,
    /// The engine it came from: `embedded` or `etcd`.
    pub source: String,
    /// The rockq version that wrote it.
    pub rockq: String,
    /// When the export's snapshot was taken.
    pub exported_at_micros: u64,
    /// Messages in the file (queued and delayed), for progress bars.
    pub messages: u64,
}

/// A message's content: what `Message` holds, and when it was sent.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Body {
    /// When it was sent (microseconds since the Unix epoch).
    pub enqueued_at_micros: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotency_key: Option<String>,
    /// Its priority (`Message::priority`); absent for 0.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub priority: u8,
    /// `[name, base64 value]` pairs, in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty", with = "b64_headers")]
    pub headers: Vec<(String, Vec<u8>)>,
    #[serde(with = "b64")]
    pub payload: Vec<u8>,
}

fn is_zero(p: &u8) -> bool {
    *p == 0
}

impl Record {
    /// The line for this record, without its newline.
    pub fn to_line(&self) -> String {
        // Every field is a string, a number or a list of them: serialising cannot fail.
        serde_json::to_string(self).unwrap_or_default()
    }

    /// Parses one line (`n` counts from 1, to name it in the error).
    pub fn parse(n: u64, line: &str) -> Result<Record, String> {
        serde_json::from_str(line).map_err(|e| format!("line {n}: {e}"))
    }
}

mod b64 {
    use base64::Engine as _;
    use base64::engine::general_purpose::STANDARD;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(bytes: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&STANDARD.encode(bytes))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        STANDARD.decode(s.as_bytes()).map_err(serde::de::Error::custom)
    }
}

mod b64_headers {
    use base64::Engine as _;
    use base64::engine::general_purpose::STANDARD;
    use serde::ser::SerializeSeq;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(headers: &[(String, Vec<u8>)], s: S) -> Result<S::Ok, S::Error> {
        let mut seq = s.serialize_seq(Some(headers.len()))?;
        for (name, value) in headers {
            seq.serialize_element(&(name, STANDARD.encode(value)))?;
        }
        seq.end()
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<(String, Vec<u8>)>, D::Error> {
        let pairs = <Vec<(String, String)>>::deserialize(d)?;
        pairs
            .into_iter()
            .map(|(n, v)| STANDARD.decode(v.as_bytes()).map(|v| (n, v)).map_err(serde::de::Error::custom))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_of_line_reads_back_as_written() {
        let body = Body {
            enqueued_at_micros: 7,
            key: Some("k".into()),
            idempotency_key: None,
            priority: 7,
            headers: vec![("h".into(), vec![0, 255])],
            payload: b"\x00payload\xff".to_vec(),
        };
        let records = [
            Record::Header(Header {
                format: FORMAT_NAME.into(),
                version: FORMAT_VERSION,
                records_format: 2,
                source: "embedded".into(),
                rockq: "0.2.0".into(),
                exported_at_micros: 1,
                messages: 2,
            }),
            Record::Queue { name: "q".into(), first_seq: 3, last_seq: 9, record: vec![1, 2] },
            Record::Message { queue: "q".into(), seq: 3, body: body.clone() },
            Record::Delayed { queue: "q".into(), id: 1, due_micros: 5, body: Body::default() },
            Record::Entry { keyspace: "ks".into(), key: vec![0], revision: 4, value: vec![] },
            Record::Letter { dlq: "q.dlq".into(), seq: u64::MAX },
            Record::End { records: 6 },
        ];
        for r in records {
            let line = r.to_line();
            assert!(!line.contains('\n'), "{line}");
            assert_eq!(Record::parse(1, &line).unwrap(), r, "{line}");
        }
    }

    #[test]
    fn a_message_line_is_plain_json_other_tools_can_read() {
        let body = Body { enqueued_at_micros: 1, payload: b"hi".to_vec(), ..Body::default() };
        let line = Record::Message { queue: "q".into(), seq: 1, body }.to_line();
        assert_eq!(
            line,
            r#"{"t":"message","queue":"q","seq":1,"body":{"enqueued_at_micros":1,"payload":"aGk="}}"#
        );
    }

    #[test]
    fn unknown_kinds_fields_and_bad_base64_are_refused_with_their_line() {
        for bad in [
            r#"{"t":"nonsense"}"#,
            r#"{"t":"header","format":"rockq-export","version":1,"records_format":2,"source":"embedded","rockq":"0","exported_at_micros":1,"messages":0,"extra":1}"#,
            r#"{"t":"letter","dlq":"d","seq":1,"extra":2}"#,
            r#"{"t":"entry","keyspace":"k","key":"***","revision":1,"value":""}"#,
            r#"{"t":"message","queue":"q","seq":1,"body":{"enqueued_at_micros":1,"payload":"aGk=","surprise":1}}"#,
            "not json",
        ] {
            let e = Record::parse(42, bad).unwrap_err();
            assert!(e.starts_with("line 42: "), "{e}");
        }
    }
}
