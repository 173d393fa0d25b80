//! `backup` and `restore`: an online copy of the database, and a database made from one.

use std::path::Path;

use rockq::{BackupReport, Broker};
use serde_json::json;

use crate::session::{Failure, Result, exclusive, finish, say};

/// `rockq backup DIR`: needs the database to itself (a running service backs itself up with
/// `Broker::backup`).
pub async fn backup(db: &Path, json: bool, dir: &Path) -> Result<()> {
    let broker = exclusive(db, "backup").await?;
    let res = broker.backup(dir).await.map_err(Failure::from).map(|r| print(json, "backup", db, &r));
    finish(broker, res).await
}

/// `rockq restore BACKUP`: into `--db`, which must not exist (or be an empty directory).
pub async fn restore(db: &Path, json: bool, backup: &Path) -> Result<()> {
    let report = Broker::restore(backup, db).await?;
    print(json, "restore", backup, &report);
    Ok(())
}

fn print(json: bool, what: &str, from: &Path, r: &BackupReport) {
    let queues: Vec<_> = r
        .queues
        .iter()
        .map(|(name, first, last)| json!({ "queue": name, "first_seq": first, "last_seq": last }))
        .collect();
    let value = json!({
        what: r.path.display().to_string(),
        "from": from.display().to_string(),
        "files": r.files,
        "bytes": r.bytes,
        "linked": r.linked,
        "queues": queues,
    });
    say(json, value, || {
        let mut text = format!(
            "{what} of {} written to {}: {} files, {} bytes ({} hard-linked), {} queues",
            from.display(),
            r.path.display(),
            r.files,
            r.bytes,
            r.linked,
            r.queues.len()
        );
        for (name, first, last) in &r.queues {
            text.push_str(&format!("\n  {name}: {first}..={last}"));
        }
        text
    });
}
