//! Export and import at the engine: the store's records to JSON lines on a blocking thread
//! (the embedded store reads them there under one snapshot; the etcd store reads them at one
//! revision on the runtime and hands them over a page at a time), and an export file into a
//! new database.

use std::io::{BufWriter, Write};
use std::path::PathBuf;

use crate::error::Error;
use crate::export::record::Record;
use crate::export::{PROGRESS_EVERY, ProgressFn, TransferReport};
use crate::store::{Reader, Store};

fn io_error(e: std::io::Error) -> Error {
    Error::Io { path: None, source: e.into() }
}

/// Writes lines through a buffer, counting them and calling the progress callback.
struct Lines {
    w: BufWriter<Box<dyn Write + Send>>,
    report: TransferReport,
    total: u64,
    line: String,
    progress: Option<ProgressFn>,
}

impl Lines {
    fn new(out: Box<dyn Write + Send>, progress: Option<ProgressFn>) -> Lines {
        let w = BufWriter::with_capacity(1 << 20, out);
        Lines { w, report: TransferReport::default(), total: 0, line: String::new(), progress }
    }

    fn write(&mut self, r: &Record) -> Result<(), Error> {
        if let Record::Header(h) = r {
            self.total = h.messages;
        }
        self.line.clear();
        self.line.push_str(&r.to_line());
        self.line.push('\n');
        self.w.write_all(self.line.as_bytes()).map_err(io_error)?;
        self.report.count(r, self.line.len() as u64);
        if self.report.records.is_multiple_of(PROGRESS_EVERY)
            && let Some(f) = self.progress.as_mut()
        {
            f(&self.report.progress(self.total));
        }
        Ok(())
    }

    fn finish(mut self) -> Result<TransferReport, Error> {
        self.w.flush().map_err(io_error)?;
        if let Some(f) = self.progress.as_mut() {
            f(&self.report.progress(self.total));
        }
        Ok(self.report)
    }
}

/// Writes the export of `store` to `out`. Blocking.
pub(crate) fn export(
    store: &Store,
    now_micros: u64,
    out: Box<dyn Write + Send>,
    progress: Option<ProgressFn>,
) -> Result<TransferReport, Error> {
    let mut lines = Lines::new(out, progress);
    store.export(now_micros, &mut |r| lines.write(&r))?;
    lines.finish()
}

/// Writes the export of an etcd namespace to `out`: read on the runtime, written on a
/// blocking thread, a page at a time through a short queue (a slow `out` slows the reads).
#[cfg(feature = "etcd")]
pub(crate) async fn export_etcd(
    store: &crate::store::etcd::EtcdStore,
    runtime: &tokio::runtime::Handle,
    now_micros: u64,
    out: Box<dyn Write + Send>,
    progress: Option<ProgressFn>,
) -> Result<TransferReport, Error> {
    let (tx, mut rx) = tokio::sync::mpsc::channel::<Vec<Record>>(4);
    let writer = runtime.spawn_blocking(move || {
        let mut lines = Lines::new(out, progress);
        while let Some(batch) = rx.blocking_recv() {
            for r in &batch {
                lines.write(r)?;
            }
        }
        lines.finish()
    });
    let read = store.export(now_micros, &tx).await;
    drop(tx);
    let written = writer.await.map_err(|e| Error::Internal(format!("export writer failed: {e}")))?;
    match (read, written) {
        // The writer stopped: its own error is the one to report.
        (_, Err(e)) => Err(e),
        (Err(e), Ok(_)) => Err(e),
        (Ok(()), Ok(report)) => Ok(report),
    }
}

/// Reads an export from `input` into a new database at `into`, on the blocking pool.
pub(crate) async fn import(
    input: Box<dyn std::io::Read + Send>,
    into: PathBuf,
    progress: Option<ProgressFn>,
) -> Result<TransferReport, Error> {
    tokio::task::spawn_blocking(move || {
        let input = std::io::BufReader::with_capacity(1 << 20, input);
        crate::store::import(Reader::new(Box::new(input), progress), &into)
    })
    .await
    .map_err(|e| Error::Internal(format!("import task failed: {e}")))?
}

/// Reads an export from `input` into the empty etcd namespace `namespace`: the file read and
/// checked on a blocking thread, its writes sent to etcd from here in transactions. A failed
/// import deletes what it wrote.
#[cfg(feature = "etcd")]
pub(crate) async fn import_etcd(
    input: Box<dyn std::io::Read + Send>,
    endpoints: &[String],
    namespace: &str,
    settings: &super::etcd::EtcdSettings,
    progress: Option<ProgressFn>,
) -> Result<TransferReport, Error> {
    use crate::store::etcd::{ConnectFailure, EtcdStore};
    crate::name::validate(crate::error::NameKind::Queue, namespace)
        .map_err(|e| Error::InvalidOption(format!("etcd namespace: {e}")))?;
    if endpoints.is_empty() {
        return Err(Error::InvalidOption("no etcd endpoint given".into()));
    }
    let store =
        EtcdStore::connect_bare(endpoints, namespace, settings.attempt_timeout, settings.request_timeout)
            .await
            .map_err(|e| match e {
                ConnectFailure::Storage(s) => Error::from(s),
                ConnectFailure::Invalid(why) | ConnectFailure::Foreign(why) => Error::InvalidOption(why),
                // `connect_bare` reads nothing of the namespace.
                ConnectFailure::Missing => Error::Internal("connect_bare found no namespace".into()),
            })?;
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    let mut imp = store.begin_import(u64::try_from(now.as_micros()).unwrap_or(u64::MAX)).await?;
    let (tx, mut rx) = tokio::sync::mpsc::channel(1024);
    let reader = tokio::task::spawn_blocking(move || {
        let mut lines = Reader::new(Box::new(std::io::BufReader::with_capacity(1 << 20, input)), progress);
        while let Some(w) = lines.next()? {
            if tx.blocking_send(w).is_err() {
                // The writer stopped: its error is the one reported.
                return Err(Error::Internal("the import's writer stopped".into()));
            }
        }
        Ok(lines.finish().0)
    });
    let mut written = Ok(());
    while let Some((_, w)) = rx.recv().await {
        // Refused as a submit or a schedule's upsert on etcd refuses it (the embedded engine
        // takes it): written, it would fail at every firing.
        if crate::store::etcd::import::never_fires(&w) {
            use super::capability::{Capability, Flavour, refusal};
            written = Err(refusal(Flavour::Etcd, Capability::HugeMessage));
            break;
        }
        if let Err(e) = store.import_write(&mut imp, w).await {
            written = Err(e);
            break;
        }
    }
    drop(rx);
    let read = reader.await.map_err(|e| Error::Internal(format!("import reader failed: {e}")))?;
    let result = match (written, read) {
        (Err(e), _) | (Ok(()), Err(e)) => Err(e),
        (Ok(()), Ok(mut report)) => store.finish_import(imp).await.map(|()| {
            report.path = Some(PathBuf::from(&store.label));
            report
        }),
    };
    if result.is_err() {
        // The namespace was empty before: what the import wrote goes.
        if let Err(e) = store.clear_namespace().await {
            tracing::warn!(error = %e, "rockq: a failed import into etcd could not delete what it wrote");
        }
    }
    result
}
