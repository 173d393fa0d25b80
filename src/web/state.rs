//! The console's shared state behind the router, and its fixed settings: what every route and
//! the sampler task read.

use std::time::Duration;

use super::{auth, history, jobs, source};

/// The console's shared state, behind the router.
pub(crate) struct State {
    pub(crate) source: source::Source,
    pub(crate) auth: auth::Auth,
    pub(crate) history: history::SharedHistory,
    pub(crate) config: Config,
    pub(crate) jobs: jobs::Jobs,
}

/// Settings that do not change once the router is built.
#[derive(Debug, Clone)]
pub(crate) struct Config {
    /// Samples kept per queue and group.
    pub(crate) history: usize,
    /// Tick of the sampler task (`None`: no task; [`Sampler::sample_now`](super::Sampler::sample_now) only).
    pub(crate) sample_every: Option<Duration>,
    /// Seconds between reloads of the overview (0: none).
    pub(crate) refresh: u32,
    /// Whether [`Console::serve`](super::Console::serve) may bind a non-loopback address.
    pub(crate) allow_remote: bool,
    /// Whether reading needs no token even when one is configured.
    pub(crate) public_reads: bool,
    /// Host names (lowercase, no port) the console answers to (`guard.rs`).
    pub(crate) allowed_hosts: Vec<String>,
}
