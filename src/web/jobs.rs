//! Redrives started from the console run as background tasks in bounded chunks, so a big
//! dead-letter queue neither holds a request open nor hides its progress: the page polls the
//! job (`/jobs/{id}`, `/api/jobs/{id}`), which reports moved of total after every chunk.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use tokio::sync::watch;

use crate::broker::Broker;
use crate::dead_letter::Redrive;

/// Dead letters per chunk: each chunk is one atomic redrive (and one progress step).
pub(crate) const CHUNK: u64 = 256;
/// Finished and running jobs remembered for their pages.
const KEEP: usize = 32;

/// Where a redrive stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Progress {
    pub dlq: String,
    /// Target queue (`None`: each dead letter's origin).
    pub to: Option<String>,
    /// Dead letters to move (the smaller of the limit and the depth when it started).
    pub total: u64,
    pub moved: u64,
    pub done: bool,
    pub error: Option<String>,
}

#[derive(Default)]
pub(crate) struct Jobs {
    next: AtomicU64,
    list: Mutex<VecDeque<(u64, watch::Receiver<Progress>)>>,
}

impl Jobs {
    /// Starts a redrive of `dlq` (which exists) on the runtime; returns its id.
    pub(crate) fn start(&self, broker: Broker, dlq: String, to: Option<String>, limit: Option<u64>) -> u64 {
        let id = self.next.fetch_add(1, Ordering::Relaxed) + 1;
        let progress = Progress { dlq, to, total: 0, moved: 0, done: false, error: None };
        let (tx, rx) = watch::channel(progress.clone());
        {
            let mut list = self.list.lock().unwrap_or_else(|p| p.into_inner());
            while list.len() >= KEEP {
                list.pop_front();
            }
            list.push_back((id, rx));
        }
        tokio::spawn(async move {
            let res = run(&broker, &progress, limit, &tx).await;
            tx.send_modify(|p| {
                p.done = true;
                p.error = res.err();
            });
        });
        id
    }

    /// The job's progress watch.
    pub(crate) fn get(&self, id: u64) -> Option<watch::Receiver<Progress>> {
        let list = self.list.lock().unwrap_or_else(|p| p.into_inner());
        list.iter().find(|(i, _)| *i == id).map(|(_, rx)| rx.clone())
    }
}

/// Chunk after chunk until `total` moved or the queue is empty; an error stops it with the
/// chunks before it moved (each chunk is atomic, so nothing is half-moved).
async fn run(
    broker: &Broker,
    p: &Progress,
    limit: Option<u64>,
    tx: &watch::Sender<Progress>,
) -> Result<(), String> {
    let letters = broker.dead_letters(&p.dlq).await.map_err(|e| e.to_string())?;
    let total = letters.len().await.map_err(|e| e.to_string())?.min(limit.unwrap_or(u64::MAX));
    tx.send_modify(|p| p.total = total);
    let mut moved = 0;
    while moved < total {
        let mut opts = Redrive::new().limit((total - moved).min(CHUNK));
        if let Some(t) = &p.to {
            opts = opts.to(t.clone());
        }
        let n = letters.redrive(opts).await.map_err(|e| e.to_string())?;
        if n == 0 {
            break; // someone else drained it meanwhile
        }
        moved += n;
        tx.send_modify(|p| p.moved = moved);
    }
    Ok(())
}
