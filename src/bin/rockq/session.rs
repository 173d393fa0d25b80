//! The CLI's session with what it operates — a database directory, or an etcd namespace
//! (`--etcd`): opening it read-only or exclusively, closing it, and reporting (a failure with
//! its exit code, JSON or text answers). Shared by every command.

use std::path::{Path, PathBuf};

use rockq::{Broker, Error, Inspector};

use crate::args::Cli;

/// A failure to report: its message and the process exit code.
pub struct Failure {
    pub message: String,
    pub code: u8,
}

/// Exit code when the database is held by another process.
const LOCKED: u8 = 3;

/// Exit code for a command line that cannot be carried out as given.
const USAGE: u8 = 2;

impl<E: std::fmt::Display> From<E> for Failure {
    fn from(e: E) -> Self {
        Failure { message: e.to_string(), code: 1 }
    }
}

pub(crate) type Result<T> = std::result::Result<T, Failure>;

/// What a command operates.
pub(crate) enum Target {
    /// A database directory (`--db`).
    Db(PathBuf),
    /// An etcd namespace (`--etcd`, `--namespace`), shared with the services that use it.
    Etcd { endpoints: Vec<String>, namespace: String },
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Target::Db(path) => write!(f, "{}", path.display()),
            Target::Etcd { endpoints, namespace } => {
                write!(f, "etcd namespace {namespace} at {}", endpoints.join(","))
            }
        }
    }
}

impl Target {
    /// The target the command line names: `--etcd` (with `--namespace`) or `--db`.
    pub(crate) fn of(cli: &Cli) -> Result<Target> {
        // Given on the command line (not from the environment, where ROCKQ_NAMESPACE may be set
        // for the etcd commands of the same shell).
        let given = |flag: &str| std::env::args().any(|a| a == flag || a.starts_with(&format!("{flag}=")));
        if !cli.etcd.is_empty() && given("--db") {
            return Err(usage("--db names a database directory and --etcd an etcd namespace: give one"));
        }
        match (cli.etcd.is_empty(), &cli.namespace) {
            (true, None) => Ok(Target::Db(cli.db.clone())),
            (true, Some(_)) if !given("--namespace") => Ok(Target::Db(cli.db.clone())),
            (true, Some(_)) => {
                Err(usage("--namespace names an etcd namespace: give the endpoints with --etcd"))
            }
            (false, None) => Err(usage("--etcd needs --namespace (the namespace the services connect to)")),
            (false, Some(ns)) if cfg!(feature = "etcd") => {
                Ok(Target::Etcd { endpoints: cli.etcd.clone(), namespace: ns.clone() })
            }
            (false, Some(_)) => Err(usage(
                "this rockq was built without the etcd feature: cargo install rockq --features cli,etcd",
            )),
        }
    }

    /// The database directory, or a failure saying that `what` is for one.
    pub(crate) fn db(&self, what: &str, instead: &str) -> Result<&Path> {
        match self {
            Target::Db(path) => Ok(path),
            Target::Etcd { .. } => {
                Err(usage(&format!("`rockq {what}` works on a database directory: {instead}")))
            }
        }
    }
}

fn usage(message: &str) -> Failure {
    Failure { message: message.to_owned(), code: USAGE }
}

/// Read-only access: no lock taken, so it works beside a running service. On etcd, a
/// connection that writes nothing (`Inspector::connect_etcd`).
pub(crate) async fn inspect(target: &Target) -> Result<Inspector> {
    match target {
        Target::Db(db) => Inspector::open(db).await.map_err(|e| open_failure(target, e, "this command")),
        Target::Etcd { endpoints, namespace } => {
            inspect_etcd(endpoints, namespace).await.map_err(|e| open_failure(target, e, "this command"))
        }
    }
}

#[cfg(feature = "etcd")]
async fn inspect_etcd(endpoints: &[String], namespace: &str) -> std::result::Result<Inspector, Error> {
    Inspector::connect_etcd(endpoints, namespace, rockq::EtcdOptions::new()).await
}

#[cfg(not(feature = "etcd"))]
async fn inspect_etcd(_: &[String], _: &str) -> std::result::Result<Inspector, Error> {
    Err(Error::InvalidOption("this rockq was built without the etcd feature".into()))
}

/// Exclusive access, for commands that write. On etcd there is no exclusivity to take: the
/// command connects as one more instance, beside the services (never creating the namespace).
pub(crate) async fn exclusive(target: &Target, what: &str) -> Result<Broker> {
    match target {
        Target::Db(db) => Broker::options()
            .create_if_missing(false)
            .open(db)
            .await
            .map_err(|e| open_failure(target, e, what)),
        Target::Etcd { endpoints, namespace } => {
            connect_etcd(endpoints, namespace).await.map_err(|e| open_failure(target, e, what))
        }
    }
}

#[cfg(feature = "etcd")]
async fn connect_etcd(endpoints: &[String], namespace: &str) -> std::result::Result<Broker, Error> {
    // No background retention pass in a command's short life: `rockq trim` asks for one.
    let options =
        rockq::Options::new().create_if_missing(false).retention_interval(std::time::Duration::ZERO);
    Broker::connect_etcd(endpoints, namespace, rockq::EtcdOptions::new().options(options)).await
}

#[cfg(not(feature = "etcd"))]
async fn connect_etcd(_: &[String], _: &str) -> std::result::Result<Broker, Error> {
    Err(Error::InvalidOption("this rockq was built without the etcd feature".into()))
}

/// Exclusive access if the database is free, `None` if another process holds it (the caller
/// falls back to read-only access). On etcd: always a connection.
#[cfg(feature = "web")]
pub(crate) async fn exclusive_or_locked(target: &Target) -> Result<Option<Broker>> {
    let Target::Db(db) = target else { return exclusive(target, "serve").await.map(Some) };
    match Broker::options().create_if_missing(false).open(db).await {
        Ok(b) => Ok(Some(b)),
        Err(Error::Locked { .. }) => Ok(None),
        Err(e) => Err(open_failure(target, e, "serve")),
    }
}

fn open_failure(target: &Target, e: Error, what: &str) -> Failure {
    match (e, target) {
        (Error::Locked { .. }, _) => Failure {
            message: format!(
                "database {target} is locked by another process. `rockq {what}` changes the database and needs it to \
                 itself: stop the service first, or call the library from it. Read-only commands (stats, groups, \
                 peek, scheduled, schedules, pending, job, dlq list, dlq peek) work while it runs."
            ),
            code: LOCKED,
        },
        (Error::NoDatabase { .. }, Target::Db(_)) => {
            Failure::from(format!("no database at {target} (give the directory with --db or ROCKQ_DB)"))
        }
        (Error::NoDatabase { .. }, Target::Etcd { .. }) => Failure::from(format!(
            "no {target}: nothing was created (a service's Broker::connect_etcd creates it, or `rockq import` \
             into it)"
        )),
        (other, _) => Failure::from(other),
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
