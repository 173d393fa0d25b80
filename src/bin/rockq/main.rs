//! `rockq`: inspect and operate a rockq database from the shell.
//!
//! Read-only commands (`stats`, `groups`, `peek`, `pending`, `job`, `scheduled`, `schedules`,
//! `dlq list`, `dlq peek`) open the database read-only, which takes no lock: they work while the service runs. Commands that
//! change it (`dlq redrive`, `group reset|pause|resume`, `trim`, `delete-queue`, `purge`,
//! `delete-group`), `backup` and `export` need it to themselves and fail with exit code 3 while another process holds
//! it. The destructive ones (`delete-queue`, `purge`, `delete-group`) ask for confirmation on a
//! terminal and need `--yes` otherwise (exit code 2 without it). `serve` (feature `web`) runs
//! the web console: full when the database is free, read-only while another process holds it.
//!
//! With `--etcd ENDPOINTS --namespace NS` (feature `etcd`) every command operates that etcd
//! namespace instead: the services share it, so nothing needs it to itself. Read-only
//! commands connect with `Inspector::connect_etcd` (which writes nothing); the others connect
//! as one more instance (`Broker::connect_etcd`, never creating the namespace); `export` and
//! `import` move a namespace to and from a file; `backup` and `restore` are for a database
//! directory (etcd has `etcdctl snapshot save`).

mod args;
mod backup;
mod flows;
mod format;
mod lifecycle;
mod run;
#[cfg(feature = "web")]
mod serve;
mod session;
mod transfer;

use clap::Parser;

fn main() -> std::process::ExitCode {
    let cli = args::Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run::run(cli)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", e.message);
            std::process::ExitCode::from(e.code)
        }
    }
}
