//! The etcd engine's appender: the task that writes staged sends (the inbox's rounds), beside
//! the writer (`writer.rs`), which carries out every other request.
//!
//! An etcd transaction's time is mostly its round trip, and etcd commits transactions that
//! arrive together in one log write: one task sending the append, then the claims, then the
//! acks, one after another, waits three round trips where two overlap them. Only a pool's hot
//! requests (claims, lease extensions, outcomes other than dead letters: they read no tail and
//! append nothing) run beside appends; before any other round the writer has the appender
//! write what was staged and wait for the round's end (`writer::Barrier`), so that request
//! sees every send staged before it, as embedded, and its appends (a dead letter, a firing, a
//! transaction's send) never race this process's own for a queue's tail. Each keeps its own
//! view of the tails, refreshed by a refused compare as after another process's append.

use tokio::sync::mpsc;

use super::writer::{Barrier, Writer};

/// The most times the appender lets answered producers run before it takes the next round.
const MAX_YIELDS: usize = 8;

/// The most further takes a barrier waits for.
const MAX_TAKES: usize = 64;

/// Writes staged rounds until the writer stops it (or is gone).
pub(super) async fn run(mut w: Writer, mut barriers: mpsc::Receiver<Barrier>) {
    // Whether the last round answered sends: their producers are woken and about to send again.
    let mut answered = false;
    loop {
        if std::mem::take(&mut answered) {
            // Let them stage before the next round is taken: awaiting producers otherwise
            // settle into two halves (one half staging while the other's transaction is out),
            // each transaction carrying half of what they could put in one. A transaction's
            // time is mostly etcd's fixed round trip (1.0 of 1.2 ms at 32 messages on one
            // member), so one round of all of them writes nearly twice as fast. Costs a trip
            // through the runtime's queue when no producer is waiting.
            let mut seen = w.engine.inbox.staged();
            for _ in 0..MAX_YIELDS {
                tokio::task::yield_now().await;
                let now = w.engine.inbox.staged();
                if now == seen {
                    break;
                }
                seen = now;
            }
        }
        let mut asked: Vec<Barrier> = Vec::new();
        let mut gone = false;
        if !w.engine.inbox.has_staged() && w.engine.inbox.idle_if_empty() {
            // Idle: the next send staged wakes it (`Backend::wake_appender`; a wake given
            // before this waits is kept by the `Notify`).
            tokio::select! {
                () = w.side.sends_wake.notified() => {}
                b = barriers.recv() => match b {
                    Some(b) => asked.push(b),
                    None => gone = true,
                },
            }
        }
        while let Ok(b) = barriers.try_recv() {
            asked.push(b);
        }
        let stop = gone || asked.iter().any(|b| b.stop);
        let staged = if stop { w.engine.inbox.close(None) } else { w.engine.inbox.take() };
        for s in staged {
            w.append_staged(s).await;
            answered = true;
        }
        // A barrier waits for everything staged before it, which one take may not hold (a
        // take stops at one write's caps): more takes, as many as the inbox's capacity needs
        // at most.
        let mut more = 0;
        while !asked.is_empty() && w.engine.inbox.has_staged() && more < MAX_TAKES {
            for s in w.engine.inbox.take() {
                w.append_staged(s).await;
            }
            more += 1;
        }
        let mut holds = Vec::with_capacity(asked.len());
        for b in asked {
            let _ = b.done.send(());
            holds.push(b.hold);
        }
        if stop {
            return;
        }
        // The writer's round reads tails or appends: nothing is written until it is over.
        for h in holds {
            let _ = h.await;
        }
    }
}
