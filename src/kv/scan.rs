//! [`Scan`]: a keyspace range as a `Stream`, read a page at a time on the blocking pool.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use futures::Stream;
use tokio::task::JoinHandle;

use crate::engine::boundary::{RawEntry, Shared};
use crate::entry::Entry;
use crate::error::Error;

/// The entries of a key range, in key order: see [`Keyspace::scan`](crate::Keyspace::scan).
///
/// Each page is read by one bounded iterator on Tokio's blocking pool, opened and closed within
/// that read: no iterator (and no RocksDB snapshot) lives across an `.await`. Dropping the
/// stream lets a page being read finish and discards it.
#[must_use = "streams do nothing unless polled"]
pub struct Scan {
    shared: Arc<Shared>,
    keyspace: u32,
    /// The next key to read from; `None` once the range is exhausted.
    from: Option<Vec<u8>>,
    to: Option<Vec<u8>>,
    page: usize,
    ready: VecDeque<Entry>,
    reading: Option<JoinHandle<Result<Vec<RawEntry>, Error>>>,
}

impl std::fmt::Debug for Scan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scan").field("keyspace", &self.keyspace).field("buffered", &self.ready.len()).finish()
    }
}

impl Scan {
    pub(crate) fn new(
        shared: Arc<Shared>,
        keyspace: u32,
        from: Vec<u8>,
        to: Option<Vec<u8>>,
        page: usize,
    ) -> Self {
        Scan { shared, keyspace, from: Some(from), to, page, ready: VecDeque::new(), reading: None }
    }
}

impl Stream for Scan {
    type Item = Result<Entry, Error>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        loop {
            if let Some(e) = this.ready.pop_front() {
                return Poll::Ready(Some(Ok(e)));
            }
            if let Some(reading) = this.reading.as_mut() {
                let res = match Pin::new(reading).poll(cx) {
                    Poll::Pending => return Poll::Pending,
                    Poll::Ready(res) => res,
                };
                this.reading = None;
                let page = match res.map_err(|_| Error::Shutdown).and_then(|r| r) {
                    Ok(page) => page,
                    Err(e) => {
                        this.from = None;
                        return Poll::Ready(Some(Err(e)));
                    }
                };
                // A short page is the last; otherwise go on just above its last key.
                this.from = match page.last() {
                    Some((k, _, _)) if page.len() >= this.page => Some([&k[..], &[0]].concat()),
                    _ => None,
                };
                this.ready.extend(page.into_iter().map(|(key, revision, value)| Entry {
                    key: Bytes::from(key),
                    value: Bytes::from(value),
                    revision,
                }));
                continue;
            }
            let Some(from) = this.from.take() else {
                return Poll::Ready(None);
            };
            let (shared, id, to, page) = (this.shared.clone(), this.keyspace, this.to.clone(), this.page);
            this.reading = Some(
                this.shared.runtime.spawn_blocking(move || shared.kv_scan(id, &from, to.as_deref(), page)),
            );
        }
    }
}
