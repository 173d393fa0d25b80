//! The command line.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

/// Inspect and operate a rockq database.
#[derive(Debug, Parser)]
#[command(name = "rockq", version, about, long_about = None)]
pub struct Cli {
    /// The database directory.
    #[arg(long, env = "ROCKQ_DB", global = true, default_value = "./data")]
    pub db: PathBuf,
    /// etcd endpoints, comma-separated (e.g. http://10.0.0.1:2379,http://10.0.0.2:2379):
    /// operate the etcd namespace --namespace, which several services share, instead of a
    /// database directory (a build with the `etcd` feature).
    #[arg(long, env = "ROCKQ_ETCD", global = true, value_delimiter = ',', value_name = "ENDPOINTS")]
    pub etcd: Vec<String>,
    /// The etcd namespace (with --etcd): what the services pass to `Broker::connect_etcd`.
    #[arg(long, env = "ROCKQ_NAMESPACE", global = true)]
    pub namespace: Option<String>,
    /// Print JSON instead of tables.
    #[arg(long, global = true)]
    pub json: bool,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Queues, groups and keyspaces: lengths, offsets, delayed messages, lag (count and age), in
    /// flight, DLQ depth, paused, keys per keyspace.
    Stats,
    /// Groups only, optionally of one queue.
    Groups {
        /// Only groups of this queue.
        #[arg(long)]
        queue: Option<String>,
    },
    /// Stored messages of a queue, without consuming them.
    Peek {
        /// The queue.
        queue: String,
        /// First sequence to show (default: the first stored).
        #[arg(long)]
        from: Option<u64>,
        /// Most messages to show.
        #[arg(long, default_value_t = 20)]
        limit: usize,
    },
    /// Delayed messages waiting to fall due, optionally of one queue: id, due time, size, key.
    Scheduled {
        /// Only delayed messages of this queue.
        queue: Option<String>,
        /// Most delayed messages to show.
        #[arg(long, default_value_t = 20)]
        limit: usize,
    },
    /// Recurring schedules: recurrence, next firing, paused, firings so far.
    Schedules,
    /// In-flight and waiting claims of a work-queue group: holder, attempt, deadline.
    Pending {
        /// The queue.
        queue: String,
        /// The group.
        group: String,
    },
    /// Where one job of a work-queue group stands: state, attempt, holder, time left, last
    /// error (as the database's records say).
    Job {
        /// The queue.
        queue: String,
        /// The group.
        group: String,
        /// The job's sequence (what its send returned).
        seq: u64,
    },
    /// Flows of dependent jobs: without ID, the flows from --from with each one's state and
    /// how many steps stand where; with ID, that flow's steps (queue, group, the steps each
    /// runs after, state, job sequence, result or failure) as the database's records say.
    Flow {
        /// The flow's id (what `Flow::submit` returned).
        id: Option<u64>,
        /// List flows from this id on (inclusive).
        #[arg(long, default_value_t = 0, conflicts_with = "id")]
        from: u64,
        /// Most flows to list, or steps to show.
        #[arg(long, default_value_t = 20)]
        limit: usize,
    },
    /// Dead-letter queues.
    #[command(subcommand)]
    Dlq(Dlq),
    /// Consumer groups.
    #[command(subcommand)]
    Group(Group),
    /// Runs a retention pass now and compacts what it deleted.
    Trim,
    /// Deletes a queue with all its messages, groups, delayed messages and idempotency keys.
    DeleteQueue {
        /// The queue.
        queue: String,
        #[command(flatten)]
        confirm: Confirm,
    },
    /// Deletes every message of a queue and moves every group past them.
    Purge {
        /// The queue.
        queue: String,
        #[command(flatten)]
        confirm: Confirm,
    },
    /// Serves the web console (feature `web`). With the database to itself it runs a full
    /// broker (actions need --token); while another process holds the database it serves a
    /// read-only view. With --etcd it connects to the namespace as one more instance: full
    /// (actions need --token) unless --read-only.
    #[cfg(feature = "web")]
    Serve {
        /// Address to listen on. Non-loopback addresses also need --allow-remote.
        #[arg(long, default_value = "127.0.0.1:8080")]
        listen: std::net::SocketAddr,
        /// Token enabling the actions (pause, resume, reset, redrive, trim); without it the
        /// console is read-only.
        #[arg(long, env = "ROCKQ_CONSOLE_TOKEN", hide_env_values = true)]
        token: Option<String>,
        /// Allow a non-loopback --listen address (put TLS in front: the console is plain HTTP).
        #[arg(long)]
        allow_remote: bool,
        /// Read-only even when the database is free (opens it as `rockq stats` does).
        #[arg(long)]
        read_only: bool,
        /// With a token, let anyone read pages, JSON and /metrics without it (a trusted
        /// network only: by default the token guards reads too).
        #[arg(long)]
        public_reads: bool,
        /// A host name the console answers to besides localhost, 127.0.0.1, ::1 and the
        /// --listen address (the name a reverse proxy forwards); repeatable. Requests for any
        /// other host are refused (DNS rebinding protection).
        #[arg(long = "allowed-host", value_name = "NAME")]
        allowed_hosts: Vec<String>,
    },
    /// Writes a consistent copy of the database into DIR, a new directory (SST files
    /// hard-linked on the same filesystem). Needs the database to itself: a running service
    /// backs itself up with `Broker::backup`. Not for --etcd: back etcd up with `etcdctl
    /// snapshot save` (or export the namespace).
    Backup {
        /// The directory to create.
        dir: PathBuf,
    },
    /// Makes the database directory (--db, which must not exist or be empty) from a backup;
    /// the backup is left as it was.
    Restore {
        /// The backup directory.
        backup: PathBuf,
    },
    /// Writes the whole database to FILE (a new file; `-`: standard output) as JSON lines,
    /// read at one instant: queues and messages, groups with offsets and claims, schedules,
    /// idempotency keys, keyspaces (the format: the `rockq::export` docs). Needs the database
    /// to itself: a running service exports itself with `Broker::export`. With --etcd it
    /// exports the namespace while the services run (read at one etcd revision).
    Export {
        /// The file to create, or `-`.
        file: PathBuf,
    },
    /// Makes the database directory (--db, which must not exist or be empty) from an export
    /// (`-`: standard input). Nothing is left under --db if a line is bad or the file was
    /// cut short. With --etcd it makes the namespace, which must be empty (the way from one
    /// machine to several instances: export the database, import it into etcd).
    Import {
        /// The export file, or `-`.
        file: PathBuf,
    },
    /// Deletes a group (offset, claims, delivery records, settings), either mode.
    DeleteGroup {
        /// The queue.
        queue: String,
        /// The group.
        group: String,
        #[command(flatten)]
        confirm: Confirm,
    },
}

/// Confirmation of a destructive command.
#[derive(Debug, Args)]
pub struct Confirm {
    /// Do not ask: required when stdin is not a terminal.
    #[arg(long)]
    pub yes: bool,
}

#[derive(Debug, Subcommand)]
pub enum Dlq {
    /// Dead letters not yet redriven.
    List {
        /// The dead-letter queue (e.g. `orders.dlq`).
        dlq: String,
        /// Most dead letters to show.
        #[arg(long, default_value_t = 20)]
        limit: usize,
    },
    /// The oldest dead letter, in full.
    Peek {
        /// The dead-letter queue.
        dlq: String,
    },
    /// Moves dead letters back to their origin queue (or `--to`), in atomic batches.
    Redrive {
        /// The dead-letter queue.
        dlq: String,
        /// Send them here instead of where each came from.
        #[arg(long)]
        to: Option<String>,
        /// Most dead letters to move.
        #[arg(long)]
        limit: Option<u64>,
        /// Most dead letters per second.
        #[arg(long)]
        rate: Option<f64>,
    },
}

#[derive(Debug, Subcommand)]
pub enum Group {
    /// Moves a group's offset (replay or skip). The group must have no live consumer.
    Reset {
        /// The queue.
        queue: String,
        /// The group.
        group: String,
        #[command(flatten)]
        to: ResetTarget,
    },
    /// Pauses a group: nothing new is handed out until it is resumed.
    Pause {
        /// The queue.
        queue: String,
        /// The group.
        group: String,
    },
    /// Resumes a paused group.
    Resume {
        /// The queue.
        queue: String,
        /// The group.
        group: String,
    },
}

/// Exactly one target.
#[derive(Debug, Args)]
#[group(required = true, multiple = false)]
pub struct ResetTarget {
    /// Start at this sequence.
    #[arg(long)]
    pub to_seq: Option<u64>,
    /// Start at the first message sent at or after this time (Unix seconds).
    #[arg(long)]
    pub to_time: Option<u64>,
    /// Start at the first message sent within this long ago (e.g. `90s`, `15m`, `2h`, `1d`).
    #[arg(long, value_parser = crate::format::parse_duration)]
    pub ago: Option<std::time::Duration>,
    /// Start at the oldest stored message.
    #[arg(long)]
    pub earliest: bool,
    /// Skip everything stored: start after the last message.
    #[arg(long)]
    pub latest: bool,
}
