//! `export` and `import`: the database as JSON lines (`rockq::export`), and a database made
//! from them.

use std::path::Path;

use rockq::{Broker, TransferProgress, TransferReport};
use serde_json::json;

use crate::format::progress;
use crate::session::{Failure, Result, Target, exclusive, finish, say};

/// `rockq export FILE` (`-`: standard output): needs the database to itself (a running
/// service exports itself with `Broker::export`).
pub async fn export(db: &Target, json: bool, file: &Path) -> Result<()> {
    let broker = exclusive(db, "export").await?;
    let to_stdout = file == Path::new("-");
    let out: Box<dyn std::io::Write + Send> = if to_stdout {
        Box::new(std::io::stdout())
    } else {
        match std::fs::File::create_new(file) {
            Ok(f) => Box::new(f),
            Err(e) => {
                let e = rockq::Error::Io { path: Some(file.to_path_buf()), source: e.into() };
                return finish(broker, Err(Failure::from(e))).await;
            }
        }
    };
    // The bar would mix with the lines on a terminal's standard output.
    let bar = progress(json || to_stdout, 0, "export");
    let b = bar.clone();
    let res = broker.export_with_progress(out, move |p: &TransferProgress| show(&b, p)).await;
    bar.finish_and_clear();
    let res = res.map_err(Failure::from).map(|r| {
        if !to_stdout {
            print(json, "export", &db.to_string(), &file.display().to_string(), &r);
        }
    });
    finish(broker, res).await
}

/// `rockq import FILE` (`-`: standard input) into `--db`, which must not exist (or be an
/// empty directory).
pub async fn import(db: &Target, json: bool, file: &Path) -> Result<()> {
    let input: Box<dyn std::io::Read + Send> = if file == Path::new("-") {
        Box::new(std::io::stdin())
    } else {
        Box::new(
            std::fs::File::open(file)
                .map_err(|e| rockq::Error::Io { path: Some(file.to_path_buf()), source: e.into() })?,
        )
    };
    let bar = progress(json, 0, "import");
    let b = bar.clone();
    let res = match db {
        Target::Db(path) => {
            Broker::import_with_progress(input, path, move |p: &TransferProgress| show(&b, p)).await
        }
        Target::Etcd { endpoints, namespace } => import_etcd(input, endpoints, namespace).await,
    };
    bar.finish_and_clear();
    print(json, "import", &file.display().to_string(), &db.to_string(), &res?);
    Ok(())
}

#[cfg(feature = "etcd")]
async fn import_etcd(
    input: Box<dyn std::io::Read + Send>,
    endpoints: &[String],
    namespace: &str,
) -> std::result::Result<TransferReport, rockq::Error> {
    Broker::import_etcd(input, endpoints, namespace, rockq::EtcdOptions::new()).await
}

#[cfg(not(feature = "etcd"))]
async fn import_etcd(
    _: Box<dyn std::io::Read + Send>,
    _: &[String],
    _: &str,
) -> std::result::Result<TransferReport, rockq::Error> {
    Err(rockq::Error::InvalidOption("this rockq was built without the etcd feature".into()))
}

fn show(bar: &indicatif::ProgressBar, p: &TransferProgress) {
    bar.set_length(p.total_messages.max(p.messages));
    bar.set_position(p.messages);
}

fn print(json: bool, what: &str, from: &str, to: &str, r: &TransferReport) {
    let value = json!({
        what: to,
        "from": from,
        "records": r.records,
        "bytes": r.bytes,
        "queues": r.queues,
        "messages": r.messages,
        "delayed": r.delayed,
        "groups": r.groups,
        "claims": r.claims,
        "schedules": r.schedules,
        "idempotency_keys": r.idempotency_keys,
        "keyspaces": r.keyspaces,
        "entries": r.entries,
    });
    say(json, value, || {
        format!(
            "{what} of {} written to {}: {} lines, {} bytes; {} queues, {} messages, {} delayed, {} groups, \
             {} claims, {} schedules, {} idempotency keys, {} keyspaces ({} entries)",
            from,
            to,
            r.records,
            r.bytes,
            r.queues,
            r.messages,
            r.delayed,
            r.groups,
            r.claims,
            r.schedules,
            r.idempotency_keys,
            r.keyspaces,
            r.entries
        )
    });
}
