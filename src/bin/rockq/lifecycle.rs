//! The destructive commands: `delete-queue`, `purge`, `delete-group`. Each is confirmed first
//! (`--yes`, or a "y" typed at a terminal) — before the database is opened, so the lock is
//! not held while a person reads the question — then runs on an exclusive open.

use std::io::{BufRead, IsTerminal, Write};

use rockq::Broker;
use serde_json::json;

use crate::args::Confirm;
use crate::session::{Failure, Result, Target, exclusive, finish, say};

/// Exit code of a destructive command refused for want of a confirmation.
const NOT_CONFIRMED: u8 = 2;

pub async fn delete_queue(db: &Target, json: bool, queue: &str, confirm: &Confirm) -> Result<()> {
    confirmed(confirm, format!("Delete queue {queue:?} with all its messages and groups?")).await?;
    let broker = exclusive(db, "delete-queue").await?;
    let res = match existing(&broker, queue) {
        Ok(()) => broker.delete_queue(queue).await.map_err(Failure::from).map(|_| {
            say(json, json!({ "queue": queue, "deleted": true }), || format!("deleted queue {queue}"));
        }),
        Err(e) => Err(e),
    };
    finish(broker, res).await
}

pub async fn purge(db: &Target, json: bool, queue: &str, confirm: &Confirm) -> Result<()> {
    confirmed(confirm, format!("Delete every message of queue {queue:?}?")).await?;
    let broker = exclusive(db, "purge").await?;
    let res = match existing(&broker, queue) {
        Ok(()) => broker.purge_queue(queue).await.map_err(Failure::from).map(|n| {
            say(json, json!({ "queue": queue, "purged": n }), || format!("purged {n} messages from {queue}"));
        }),
        Err(e) => Err(e),
    };
    finish(broker, res).await
}

pub async fn delete_group(
    db: &Target,
    json: bool,
    queue: &str,
    group: &str,
    confirm: &Confirm,
) -> Result<()> {
    confirmed(confirm, format!("Delete group {group:?} on queue {queue:?}?")).await?;
    let broker = exclusive(db, "delete-group").await?;
    let res = match broker.delete_group(queue, group).await {
        Ok(true) => {
            say(json, json!({ "queue": queue, "group": group, "deleted": true }), || {
                format!("deleted group {group} on {queue}")
            });
            Ok(())
        }
        Ok(false) => Err(Failure::from(format!("group {group:?} does not exist on queue {queue:?}"))),
        Err(e) => Err(Failure::from(e)),
    };
    finish(broker, res).await
}

/// A missing queue is an error for the CLI (a typo must not look like success).
fn existing(broker: &Broker, queue: &str) -> Result<()> {
    match broker.get_queue(queue) {
        Some(_) => Ok(()),
        None => Err(Failure::from(format!("queue {queue:?} does not exist"))),
    }
}

/// `--yes`, or an interactive "y"; refused (exit code 2) otherwise.
async fn confirmed(confirm: &Confirm, question: String) -> Result<()> {
    if confirm.yes {
        return Ok(());
    }
    if !std::io::stdin().is_terminal() {
        return Err(Failure {
            message: "this command deletes data: pass --yes to confirm (stdin is not a terminal)".into(),
            code: NOT_CONFIRMED,
        });
    }
    // Reading a terminal blocks: off the runtime's workers.
    let answer = tokio::task::spawn_blocking(move || {
        eprint!("{question} [y/N] ");
        let _ = std::io::stderr().flush();
        let mut line = String::new();
        std::io::stdin().lock().read_line(&mut line).map(|_| line)
    })
    .await
    .map_err(Failure::from)?
    .map_err(Failure::from)?;
    match answer.trim() {
        "y" | "Y" | "yes" => Ok(()),
        _ => Err(Failure { message: "not confirmed; nothing changed".into(), code: NOT_CONFIRMED }),
    }
}
