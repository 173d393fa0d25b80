//! The CLI's session with the database: opening it read-only or exclusively, closing it, and
//! reporting (a failure with its exit code, JSON or text answers). Shared by every command.

use std::path::Path;

use rockq::{Broker, Error, Inspector};

/// A failure to report: its message and the process exit code.
pub struct Failure {
    pub message: String,
    pub code: u8,
}

/// Exit code when the database is held by another process.
const LOCKED: u8 = 3;

impl<E: std::fmt::Display> From<E> for Failure {
    fn from(e: E) -> Self {
        Failure { message: e.to_string(), code: 1 }
    }
}

pub(crate) type Result<T> = std::result::Result<T, Failure>;

/// Read-only access: no lock taken, so it works beside a running service.
pub(crate) async fn inspect(db: &Path) -> Result<Inspector> {
    Inspector::open(db).await.map_err(|e| open_failure(db, e, "this command"))
}

/// Exclusive access, for commands that write.
pub(crate) async fn exclusive(db: &Path, what: &str) -> Result<Broker> {
    Broker::options().create_if_missing(false).open(db).await.map_err(|e| open_failure(db, e, what))
}

/// Exclusive access if the database is free, `None` if another process holds it (the caller
/// falls back to read-only access).
#[cfg(feature = "web")]
pub(crate) async fn exclusive_or_locked(db: &Path) -> Result<Option<Broker>> {
    match Broker::options().create_if_missing(false).open(db).await {
        Ok(b) => Ok(Some(b)),
        Err(Error::Locked { .. }) => Ok(None),
        Err(e) => Err(open_failure(db, e, "serve")),
    }
}

fn open_failure(db: &Path, e: Error, what: &str) -> Failure {
    match e {
        Error::Locked { .. } => Failure {
            message: format!(
                "database {} is locked by another process. `rockq {what}` changes the database and needs it to \
                 itself: stop the service first, or call the library from it. Read-only commands (stats, groups, \
                 peek, scheduled, schedules, pending, job, dlq list, dlq peek) work while it runs.",
                db.display()
            ),
            code: LOCKED,
        },
        Error::NoDatabase { .. } => Failure::from(format!(
            "no database at {} (give the directory with --db or ROCKQ_DB)",
            db.display()
        )),
        other => Failure::from(other),
    }
}

/// Shuts the broker down cleanly whatever the command's outcome.
pub(crate) async fn finish(broker: Broker, res: Result<()>) -> Result<()> {
    let closed = broker.shutdown().await;
    res?;
    closed.map_err(Failure::from)
}

pub(crate) fn say(json: bool, value: serde_json::Value, text: impl FnOnce() -> String) {
    if json {
        println!("{value}");
    } else {
        println!("{}", text());
    }
}
