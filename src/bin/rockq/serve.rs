//! `rockq serve`: the web console in its own process. It opens the database exclusively when
//! it can (full console: actions with --token) and falls back to a read-only view, reopened as
//! the service writes, when another process holds it — the same rule as the other commands.

use std::net::SocketAddr;

use rockq::web::Console;

use crate::session::{Failure, Result, Target, exclusive_or_locked, finish};

/// Who may reach the console and read it.
pub struct Access {
    pub token: Option<String>,
    pub allow_remote: bool,
    pub public_reads: bool,
    pub allowed_hosts: Vec<String>,
}

pub async fn serve(db: &Target, listen: SocketAddr, access: Access, read_only: bool) -> Result<()> {
    let Access { token, allow_remote, public_reads, allowed_hosts } = access;
    let broker = if read_only { None } else { exclusive_or_locked(db).await? };
    if broker.is_none() && matches!(db, Target::Db(_)) {
        // The read-only console reopens the database per refresh: check once that it opens at
        // all, so a wrong --db fails here rather than on every page.
        crate::session::inspect(db).await?;
    }
    let has_token = token.as_deref().is_some_and(|t| !t.is_empty());
    let mode = match (&broker, has_token) {
        (None, _) if read_only => "read-only (--read-only)",
        (None, _) => "read-only (the database is held by another process)",
        (Some(_), true) => "full (actions need the token)",
        (Some(_), false) => "read-only (no --token)",
    };
    let reads = match (has_token, public_reads) {
        (true, false) => "private (reading needs the token too)",
        (true, true) => "reads public (--public-reads)",
        (false, _) => "NO TOKEN: anyone who can reach this address reads every page, payload and metric",
    };
    let mut console = match &broker {
        Some(b) => Console::new(b.clone()),
        None => match db {
            Target::Db(path) => Console::read_only(path),
            // An etcd namespace read-only: a connection that writes nothing.
            Target::Etcd { .. } => Console::inspector(crate::session::inspect(db).await?),
        },
    };
    if let Some(t) = token {
        console = console.token(t);
    }
    let mut console = console.allow_remote(allow_remote).public_reads(public_reads);
    for host in &allowed_hosts {
        console = console.allowed_host(host);
    }
    let listener = match console.bind(listen).await {
        Ok(l) => l,
        Err(e) => return close(broker, Err(Failure::from(e))).await,
    };
    let addr = match listener.local_addr() {
        Ok(a) => a,
        Err(e) => return close(broker, Err(Failure::from(e))).await,
    };
    // Installed before the address is printed: whoever reads it may signal at once, and a
    // handler installed on the select's first poll would leave that signal its default
    // disposition (killed, not shut down; seen in CI).
    let stop = match Stop::install() {
        Ok(s) => s,
        Err(e) => return close(broker, Err(Failure::from(e))).await,
    };
    // The first line is the address, for scripts (and tests) that listen on port 0.
    println!("rockq console on http://{addr}/ — {mode}; {reads}");
    if !has_token {
        eprintln!(
            "warning: the console has no token (--token or ROCKQ_CONSOLE_TOKEN): it is read-only and readable by anyone who can reach {addr}"
        );
    }
    let res = tokio::select! {
        r = console.serve_on(listener) => r.map_err(Failure::from),
        () = stop.wait() => Ok(()),
    };
    close(broker, res).await
}

async fn close(broker: Option<rockq::Broker>, res: Result<()>) -> Result<()> {
    match broker {
        Some(b) => finish(b, res).await,
        None => res,
    }
}

/// Ctrl-C and SIGTERM (what service managers and `kill` send): both shut the broker down
/// cleanly. The handlers are in place from [`Stop::install`] on, not from the first poll.
struct Stop {
    #[cfg(unix)]
    interrupt: tokio::signal::unix::Signal,
    #[cfg(unix)]
    terminate: tokio::signal::unix::Signal,
}

impl Stop {
    fn install() -> std::io::Result<Self> {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{SignalKind, signal};
            Ok(Self {
                interrupt: signal(SignalKind::interrupt())?,
                terminate: signal(SignalKind::terminate())?,
            })
        }
        #[cfg(not(unix))]
        Ok(Self {})
    }

    async fn wait(self) {
        #[cfg(unix)]
        {
            let Self { mut interrupt, mut terminate } = self;
            tokio::select! {
                _ = interrupt.recv() => {}
                _ = terminate.recv() => {}
            }
        }
        #[cfg(not(unix))]
        let _ = tokio::signal::ctrl_c().await;
    }
}
