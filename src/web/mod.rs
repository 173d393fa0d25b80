//! A web console for operators (feature `web`): every queue and group at a glance, charts of
//! throughput and lag, messages, pending claims and dead letters, and the actions that fix a
//! stuck pipeline (pause, resume, reset, redrive, trim) — served by axum on the application's
//! own runtime, because only the process that opened the database may write to it.
//!
//! - [`router`] returns an [`axum::Router`] to mount where the application wants it (e.g.
//!   `Router::new().nest("/rockq", rockq::web::router(broker))`); [`serve`] runs a standalone
//!   one; `rockq serve --db PATH` does the same from the CLI.
//! - Safe by default: with a [token](Console::token) every route needs it, reads too (a
//!   bearer header for the API and `/metrics`, a login for browsers), unless reads are
//!   [public](Console::public_reads); without one the console is read-only and loopback-only.
//!   Mutating routes are POST-only and need the token plus a per-session CSRF token; requests
//!   for a host the console does not answer to are refused ([`Console::allowed_host`]: DNS
//!   rebinding); [`serve`] refuses non-loopback addresses unless
//!   [allowed](Console::allow_remote) and a token is set. Every value on a page is HTML-escaped, and the pages
//!   run no JavaScript (auto-refresh is a `<meta>` tag), so the content security policy
//!   forbids scripts outright.
//! - `/metrics` is Prometheus text; `/api/...` is JSON with the fields of [`Stats`](crate::Stats)
//!   and its sibling types, under the same names.
//!
//! Routes (relative to where the router is mounted):
//!
//! | Method | Path | What |
//! |---|---|---|
//! | GET | `/` | overview: queues, groups, charts (auto-refresh) |
//! | GET | `/queues/{queue}` | messages (`?from=&limit=&view=text\|json\|hex`), pending claims, actions |
//! | GET | `/groups/{queue}/{group}` | a group: settings, claims, one job (`?job=N`), actions |
//! | GET | `/dlq/{queue}` | dead letters, redrive form |
//! | GET | `/jobs/{id}` | a redrive's progress |
//! | GET | `/flows`, `/flows/{id}` | flows of dependent jobs (`?from=&limit=`), one flow's graph and steps |
//! | GET, POST | `/login`, POST `/logout` | browser session |
//! | POST | `/groups/{queue}/{group}/pause`, `/resume`, `/reset` | group actions (reset asks to confirm) |
//! | POST | `/dlq/{queue}/redrive`, `/trim` | redrive, retention pass |
//! | GET | `/metrics` | Prometheus text |
//! | GET | `/favicon.ico` | the console's icon (open, like `/login`) |
//! | GET | `/api/stats`, `/api/history`, `/api/queues/{queue}/messages`, `/api/queues/{queue}/groups/{group}/pending`, `/api/queues/{queue}/groups/{group}/jobs/{seq}`, `/api/dlq/{queue}`, `/api/jobs/{id}`, `/api/flows`, `/api/flows/{id}` | JSON |
//! | POST | `/api/groups/{queue}/{group}/pause`, `/resume`, `/reset`, `/api/dlq/{queue}/redrive`, `/api/trim` | JSON actions (bearer token) |

mod actions;
mod api;
mod auth;
mod chart;
mod charts;
mod confirm;
mod ctx;
mod error;
mod failure;
mod flows;
mod fmt;
mod group;
mod guard;
mod history;
mod html;
mod input;
mod job_actions;
mod jobs;
mod letter_actions;
mod maintenance;
mod messages;
mod metrics;
mod pages;
mod routes;
mod sampler;
mod schedules;
mod source;
mod state;
mod tables;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

pub use error::WebError;
pub use sampler::Sampler;
use state::{Config, State};

use crate::broker::Broker;

/// A configured console: what it reads, who may change things, how it samples.
///
/// # Examples
///
/// ```no_run
/// # async fn demo(broker: rockq::Broker) -> Result<(), Box<dyn std::error::Error>> {
/// use std::time::Duration;
/// let console = rockq::web::Console::new(broker)
///     .token(std::env::var("ROCKQ_CONSOLE_TOKEN")?) // without it: read-only
///     .sample_every(Duration::from_secs(2));
/// let app = axum::Router::new().nest("/rockq", console.router());
/// let listener = tokio::net::TcpListener::bind("127.0.0.1:8080").await?;
/// axum::serve(listener, app).await?;
/// # Ok(()) }
/// ```
pub struct Console {
    source: source::Source,
    token: Option<String>,
    config: Config,
}

impl std::fmt::Debug for Console {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Console")
            .field("read_only", &(self.token.is_none() || self.source.broker().is_none()))
            .field("config", &self.config)
            .finish()
    }
}

impl Console {
    /// A console over a live broker: read-only until a [`token`](Console::token) is set.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn demo(broker: rockq::Broker) {
    /// let app = rockq::web::Console::new(broker).router(); // read-only: no token
    /// # drop(app);
    /// # }
    /// ```
    pub fn new(broker: Broker) -> Console {
        Console::with(source::Source::Broker(broker))
    }

    /// A read-only console over the database at `path`, which another process may hold (as
    /// [`Inspector`](crate::Inspector) does, it takes no lock and never writes). Its view is
    /// reopened at most once a second, so pages show the other process's recent writes.
    /// Mutating routes answer 403 whatever the token.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), rockq::web::WebError> {
    /// let console = rockq::web::Console::read_only("./data");
    /// console.serve(([127, 0, 0, 1], 8080).into()).await?;
    /// # Ok(()) }
    /// ```
    pub fn read_only(path: impl Into<PathBuf>) -> Console {
        Console::with(source::Source::ReadOnly { path: path.into(), view: tokio::sync::Mutex::new(None) })
    }

    /// A read-only console over `inspector` — with
    /// [`Inspector::connect_etcd`](crate::Inspector::connect_etcd), over an etcd namespace that
    /// brokers elsewhere write (its view is live). Mutating routes answer 403 whatever the
    /// token.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// let inspector = rockq::Inspector::open("./data").await?;
    /// rockq::web::Console::inspector(inspector).serve(([127, 0, 0, 1], 8080).into()).await?;
    /// # Ok(()) }
    /// ```
    pub fn inspector(inspector: crate::inspector::Inspector) -> Console {
        Console::with(source::Source::Inspector(inspector))
    }

    fn with(source: source::Source) -> Console {
        Console {
            source,
            token: None,
            config: Config {
                history: 120,
                sample_every: Some(Duration::from_secs(5)),
                refresh: 5,
                allow_remote: false,
                public_reads: false,
                allowed_hosts: ["localhost", "127.0.0.1", "::1"].map(String::from).to_vec(),
            },
        }
    }

    /// Enables the mutating actions for whoever presents `token`: API clients as
    /// `Authorization: Bearer <token>`, browsers through the login form. An empty token
    /// leaves the console read-only.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn demo(broker: rockq::Broker) {
    /// let console = rockq::web::Console::new(broker).token("a long random secret");
    /// # drop(console);
    /// # }
    /// ```
    pub fn token(mut self, token: impl Into<String>) -> Console {
        self.token = Some(token.into());
        self
    }

    /// How often the sampler records stats for the charts (default 5 s; at least 100 ms).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn demo(broker: rockq::Broker) {
    /// use std::time::Duration;
    /// let console = rockq::web::Console::new(broker).sample_every(Duration::from_secs(1));
    /// # drop(console);
    /// # }
    /// ```
    pub fn sample_every(mut self, every: Duration) -> Console {
        self.config.sample_every = Some(every.max(Duration::from_millis(100)));
        self
    }

    /// Spawns no sampler task: the charts get a point only from [`Sampler::sample_now`]
    /// (for tests, or an application that samples on its own schedule).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(broker: rockq::Broker) -> Result<(), rockq::web::WebError> {
    /// let (app, sampler) = rockq::web::Console::new(broker).manual_sampling().build();
    /// sampler.sample_now().await?;
    /// # drop(app);
    /// # Ok(()) }
    /// ```
    pub fn manual_sampling(mut self) -> Console {
        self.config.sample_every = None;
        self
    }

    /// How many samples the charts keep per queue and group (default 120: ten minutes at
    /// the default tick; at least 2).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn demo(broker: rockq::Broker) {
    /// let console = rockq::web::Console::new(broker).history(360);
    /// # drop(console);
    /// # }
    /// ```
    pub fn history(mut self, samples: usize) -> Console {
        self.config.history = samples.max(2);
        self
    }

    /// Seconds between automatic reloads of the overview page (default 5; 0 turns it off).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn demo(broker: rockq::Broker) {
    /// let console = rockq::web::Console::new(broker).refresh_every(10);
    /// # drop(console);
    /// # }
    /// ```
    pub fn refresh_every(mut self, seconds: u32) -> Console {
        self.config.refresh = seconds;
        self
    }

    /// Lets [`serve`](Console::serve) listen on addresses other than loopback. Only do this
    /// behind TLS (a reverse proxy) and with a [token](Console::token): the console speaks
    /// plain HTTP.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn demo(broker: rockq::Broker) {
    /// let console = rockq::web::Console::new(broker).token("secret").allow_remote(true);
    /// # drop(console);
    /// # }
    /// ```
    pub fn allow_remote(mut self, allow: bool) -> Console {
        self.config.allow_remote = allow;
        self
    }

    /// Lets anyone who reaches the console read it — pages, JSON and `/metrics` — even with a
    /// [token](Console::token) set (which then gates only the actions). For a trusted network
    /// only: by default a token guards reads too, since message payloads are usually the most
    /// sensitive data in a system.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn demo(broker: rockq::Broker) {
    /// let console = rockq::web::Console::new(broker).token("secret").public_reads(true);
    /// # drop(console);
    /// # }
    /// ```
    pub fn public_reads(mut self, public: bool) -> Console {
        self.config.public_reads = public;
        self
    }

    /// Adds a host name the console answers to (a `Host` header's name, the port ignored),
    /// beside `localhost`, `127.0.0.1`, `::1` and the address [`bind`](Console::bind) bound.
    /// Requests naming any other host are refused with 421, which is what stops a DNS
    /// rebinding attack (a foreign page whose name was pointed at this machine). Add the name
    /// your reverse proxy forwards.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn demo(broker: rockq::Broker) {
    /// let console = rockq::web::Console::new(broker).token("secret").allowed_host("queues.example.com");
    /// # drop(console);
    /// # }
    /// ```
    pub fn allowed_host(mut self, host: impl AsRef<str>) -> Console {
        let name = guard::host_name(host.as_ref());
        if !name.is_empty() && !self.config.allowed_hosts.contains(&name) {
            self.config.allowed_hosts.push(name);
        }
        self
    }

    /// The router and a handle on its sampler. Spawns the sampler task (unless
    /// [`manual_sampling`](Console::manual_sampling)) on the current Tokio runtime — built
    /// outside one, the console works without it and logs a warning; the task ends when every
    /// clone of the router is dropped or the broker shuts down.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(broker: rockq::Broker) {
    /// let (app, sampler) = rockq::web::Console::new(broker).build();
    /// # drop((app, sampler));
    /// # }
    /// ```
    pub fn build(self) -> (axum::Router, Sampler) {
        let every = self.config.sample_every;
        let state = Arc::new(State {
            auth: auth::Auth::new(self.token, self.source.broker().is_some()),
            source: self.source,
            history: Mutex::new(history::History::default()),
            config: self.config,
            jobs: jobs::Jobs::default(),
        });
        if let Some(every) = every {
            sampler::spawn(&state, every);
        }
        let sampler = Sampler { state: Arc::downgrade(&state) };
        (routes::router(state), sampler)
    }

    /// The router alone; see [`build`](Console::build).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(broker: rockq::Broker) {
    /// let app = axum::Router::new().nest("/rockq", rockq::web::Console::new(broker).router());
    /// # drop(app);
    /// # }
    /// ```
    pub fn router(self) -> axum::Router {
        self.build().0
    }

    /// Serves the console on `addr` until the broker shuts down (a read-only console: until
    /// the future is dropped).
    ///
    /// # Errors
    ///
    /// [`WebError::NotLoopback`] for a non-loopback address without both
    /// [`allow_remote`](Console::allow_remote) and a [token](Console::token); [`WebError::Bind`] if the address cannot be
    /// bound; [`WebError::Io`] if serving fails.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(broker: rockq::Broker) -> Result<(), rockq::web::WebError> {
    /// let addr = ([127, 0, 0, 1], 8080).into();
    /// rockq::web::Console::new(broker).token("secret").serve(addr).await?;
    /// # Ok(()) }
    /// ```
    pub async fn serve(mut self, addr: SocketAddr) -> Result<(), WebError> {
        let listener = self.bind(addr).await?;
        self.serve_on(listener).await
    }

    /// Binds `addr` after checking it is allowed; see [`serve`](Console::serve).
    ///
    /// # Errors
    ///
    /// [`WebError::NotLoopback`], [`WebError::Bind`].
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(broker: rockq::Broker) -> Result<(), rockq::web::WebError> {
    /// let mut console = rockq::web::Console::new(broker);
    /// let listener = console.bind(([127, 0, 0, 1], 0).into()).await?;
    /// println!("console on http://{:?}", listener.local_addr());
    /// console.serve_on(listener).await?;
    /// # Ok(()) }
    /// ```
    pub async fn bind(&mut self, addr: SocketAddr) -> Result<tokio::net::TcpListener, WebError> {
        // Without a token anyone who reaches the console reads everything: loopback only.
        let has_token = self.token.as_deref().is_some_and(|t| !t.is_empty());
        let allowed = addr.ip().is_loopback() || (self.config.allow_remote && has_token);
        if !allowed {
            return Err(WebError::NotLoopback { addr });
        }
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|source| WebError::Bind { addr, source: std::sync::Arc::new(source) })?;
        // Requests naming the address itself are this console's too.
        let ip = guard::host_name(&addr.ip().to_string());
        if !addr.ip().is_unspecified() && !self.config.allowed_hosts.contains(&ip) {
            self.config.allowed_hosts.push(ip);
        }
        Ok(listener)
    }

    /// Serves the console on a listener bound by [`bind`](Console::bind) (or by the
    /// application), until the broker shuts down.
    ///
    /// # Errors
    ///
    /// [`WebError::Io`] if serving fails.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(broker: rockq::Broker) -> Result<(), Box<dyn std::error::Error>> {
    /// let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    /// rockq::web::Console::new(broker).serve_on(listener).await?;
    /// # Ok(()) }
    /// ```
    pub async fn serve_on(self, listener: tokio::net::TcpListener) -> Result<(), WebError> {
        let broker = self.source.broker().cloned();
        if self.token.as_deref().is_none_or(str::is_empty) {
            let addr = listener.local_addr().map(|a| a.to_string()).unwrap_or_default();
            tracing::warn!(
                %addr,
                "rockq console WITHOUT A TOKEN: read-only, and every page, payload and metric is readable by \
                 anyone who can reach {addr} (loopback only); set a token to make it private"
            );
        }
        let app = self.router();
        let stopped = async move {
            match broker {
                // Polled: the broker has no shutdown notification, and a second's delay in
                // closing the listener after a shutdown costs nothing.
                Some(b) => {
                    while !b.is_shut_down() {
                        tokio::time::sleep(Duration::from_millis(500)).await;
                    }
                }
                None => std::future::pending().await,
            }
        };
        axum::serve(listener, app)
            .with_graceful_shutdown(stopped)
            .await
            .map_err(|e| WebError::Io(std::sync::Arc::new(e)))
    }
}

/// The console over `broker`, read-only (no token); see [`Console`] to configure one.
///
/// # Examples
///
/// ```no_run
/// # async fn demo(broker: rockq::Broker) -> Result<(), Box<dyn std::error::Error>> {
/// let app = axum::Router::new().nest("/rockq", rockq::web::router(broker));
/// let listener = tokio::net::TcpListener::bind("127.0.0.1:8080").await?;
/// axum::serve(listener, app).await?;
/// # Ok(()) }
/// ```
pub fn router(broker: Broker) -> axum::Router {
    Console::new(broker).router()
}

/// Serves a read-only console over `broker` on `addr` (loopback only) until the broker shuts
/// down; see [`Console`] for a token, remote addresses and sampling.
///
/// # Errors
///
/// As for [`Console::serve`].
///
/// # Examples
///
/// ```no_run
/// # async fn demo(broker: rockq::Broker) -> Result<(), rockq::web::WebError> {
/// rockq::web::serve(broker, ([127, 0, 0, 1], 8080).into()).await?;
/// # Ok(()) }
/// ```
pub async fn serve(broker: Broker, addr: SocketAddr) -> Result<(), WebError> {
    Console::new(broker).serve(addr).await
}
