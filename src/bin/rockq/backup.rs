//! `backup` and `restore`: an online copy of the database, and a database made from one.

use std::path::Path;

use rockq::{BackupReport, Broker};
use serde_json::json;

use crate::session::{Failure, Result, Target, exclusive, finish, say};

/// `rockq backup DIR`: needs the database to itself (a running service backs itself up with
/// `Broker::backup`).
/// What to do instead on etcd: the cluster's own snapshot, or an export of the namespace.
const ETCD_BACKUP: &str = "back an etcd namespace up with `etcdctl snapshot save` (the whole cluster), or \
                           `rockq --etcd … export FILE` and `rockq --etcd … import FILE` (one namespace)";

pub async fn backup(db: &Target, json: bool, dir: &Path) -> Result<()> {
    let path = db.db("backup", ETCD_BACKUP)?;
    let broker = exclusive(db, "backup").await?;
    let res = broker.backup(dir).await.map_err(Failure::from).map(|r| print(json, "backup", path, &r));
    finish(broker, res).await
}

/// `rockq restore BACKUP`: into `--db`, which must not exist (or be an empty directory).
pub async fn restore(db: &Target, json: bool, backup: &Path) -> Result<()> {
    let db = db.db("restore", ETCD_BACKUP)?;
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
