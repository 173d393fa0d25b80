//! `rockq serve`: the web console in its own process. It opens the database exclusively when
//! it can (full console: actions with --token) and falls back to a read-only view, reopened as
//! the service writes, when another process holds it — the same rule as the other commands.

use std::net::SocketAddr;
use std::path::Path;

use rockq::web::Console;

use crate::session::{Failure, Result, exclusive_or_locked, finish};

pub async fn serve(
    db: &Path,
    listen: SocketAddr,
    token: Option<String>,
    allow_remote: bool,
    read_only: bool,
) -> Result<()> {
    let broker = if read_only { None } else { exclusive_or_locked(db).await? };
    if broker.is_none() {
        // The read-only console reopens the database per refresh: check once that it opens at
        // all, so a wrong --db fails here rather than on every page.
        crate::session::inspect(db).await?;
    }
    let mode = match (&broker, token.as_deref().is_some_and(|t| !t.is_empty())) {
        (None, _) if read_only => "read-only (--read-only)",
        (None, _) => "read-only (the database is held by another process)",
        (Some(_), true) => "full (actions need the token)",
        (Some(_), false) => "read-only (no --token)",
    };
    let mut console = match &broker {
        Some(b) => Console::new(b.clone()),
        None => Console::read_only(db),
    };
    if let Some(t) = token {
        console = console.token(t);
    }
    let console = console.allow_remote(allow_remote);
    let listener = match console.bind(listen).await {
        Ok(l) => l,
        Err(e) => return close(broker, Err(Failure::from(e))).await,
    };
    let addr = listener.local_addr().map_err(Failure::from)?;
    // The first line is the address, for scripts (and tests) that listen on port 0.
    println!("rockq console on http://{addr}/ — {mode}");
    let res = tokio::select! {
        r = console.serve_on(listener) => r.map_err(Failure::from),
        r = tokio::signal::ctrl_c() => r.map_err(Failure::from),
        () = terminated() => Ok(()),
    };
    close(broker, res).await
}

async fn close(broker: Option<rockq::Broker>, res: Result<()>) -> Result<()> {
    match broker {
        Some(b) => finish(b, res).await,
        None => res,
    }
}

/// SIGTERM (what service managers and `kill` send): shut the broker down cleanly too.
async fn terminated() {
    #[cfg(unix)]
    if let Ok(mut s) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        s.recv().await;
        return;
    }
    std::future::pending::<()>().await
}
