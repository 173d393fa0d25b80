//! Helpers shared by the integration tests. Every test runs against a real RocksDB in a
//! temporary directory.
#![allow(dead_code)]

use std::path::Path;
use std::time::Duration;

use futures::StreamExt;
use rockq::{Broker, Delivery, Durability, Options, Subscription};

/// Upper bound for any single await in a test: only a guard against hangs, never an assertion
/// about speed.
pub const HANG_GUARD: Duration = Duration::from_secs(60);

/// Whether this run is the semantics suites against etcd (`scripts/etcd-semantics.sh`). Only for
/// sizing: a debug build drains a few hundred jobs a second through etcd (each job is etcd write
/// transactions), so a backlog sized for RocksDB would test `HANG_GUARD`, not the code.
pub fn against_etcd() -> bool {
    cfg!(feature = "etcd") && std::env::var_os("ROCKQ_TEST_ETCD").is_some()
}

pub fn tempdir() -> tempfile::TempDir {
    tempfile::Builder::new().prefix("rockq-test").tempdir().expect("tempdir")
}

pub async fn open(path: &Path) -> Broker {
    open_with(path, Durability::Buffered).await
}

/// Test brokers run retention only when a test asks (`Broker::trim`), so that no background
/// pass races a test's expectations.
pub async fn open_with(path: &Path, durability: Durability) -> Broker {
    #[cfg(feature = "etcd")]
    if let Some(b) = on_etcd(path, Options::new()).await {
        return b;
    }
    Options::new()
        .durability(durability)
        .retention_interval(Duration::ZERO)
        .metrics_interval(Duration::ZERO)
        .open(path)
        .await
        .expect("open")
}

/// The next delivery, failing the test if the stream ends, errors or hangs.
pub async fn next(sub: &mut Subscription) -> Delivery {
    tokio::time::timeout(HANG_GUARD, sub.next())
        .await
        .expect("hung waiting for a delivery")
        .expect("stream ended")
        .expect("stream yielded an error")
}

/// Takes `n` deliveries.
pub async fn take(sub: &mut Subscription, n: usize) -> Vec<Delivery> {
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        out.push(next(sub).await);
    }
    out
}

/// Proves nothing is delivered between what was taken and `sentinel`: sends it and checks it
/// is the very next delivery.
pub async fn assert_next_is_sentinel(queue: &rockq::Queue, sub: &mut Subscription) {
    let seq = queue.send("sentinel").await.expect("send sentinel");
    let d = next(sub).await;
    assert_eq!(
        (d.seq(), d.payload().as_ref()),
        (seq, &b"sentinel"[..]),
        "unexpected delivery before sentinel"
    );
    d.ack().expect("ack sentinel");
}

pub fn payloads(ds: &[Delivery]) -> Vec<String> {
    ds.iter().map(|d| String::from_utf8(d.payload().to_vec()).expect("utf8")).collect()
}

/// Runs the current test binary again as a child, executing only the ignored helper test
/// `name`, with `env` set. Returns the spawned child with piped stdout.
pub fn spawn_helper(name: &str, env: &[(&str, &str)]) -> std::process::Child {
    let exe = std::env::current_exe().expect("current_exe");
    let mut cmd = std::process::Command::new(exe);
    cmd.args(["--exact", name, "--ignored", "--nocapture", "--test-threads=1"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::inherit())
        .stdin(std::process::Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.spawn().expect("spawn helper")
}

/// A helper process of a kill test (this test binary run on helper test `name`, with `env`),
/// with a thread that sets a flag once it printed `@ready`; killed (SIGKILL by its pid) and
/// reaped when dropped.
pub struct HelperProcess {
    child: std::process::Child,
    ready: std::sync::Arc<std::sync::Mutex<bool>>,
}

impl HelperProcess {
    pub fn start(name: &str, env: &[(&str, &str)]) -> HelperProcess {
        use std::io::BufRead;
        let mut child = spawn_helper(name, env);
        let stdout = child.stdout.take().expect("piped stdout");
        let ready = std::sync::Arc::new(std::sync::Mutex::new(false));
        let flag = ready.clone();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stdout).lines().map_while(Result::ok) {
                if line.contains("@ready") {
                    *flag.lock().unwrap() = true;
                }
            }
        });
        HelperProcess { child, ready }
    }

    /// Waits (bounded by the hang guard) until it printed `@ready`.
    pub async fn wait_ready(&self) {
        let deadline = tokio::time::Instant::now() + HANG_GUARD;
        while !*self.ready.lock().unwrap() {
            assert!(tokio::time::Instant::now() < deadline, "a helper process never started");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// SIGKILL by its pid, then reap.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for HelperProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A small deterministic generator (xorshift64*): kill timings a failing run can replay.
pub struct Rng(pub u64);

impl Rng {
    /// Seeded from the clock; the seed is printed, so a failure can be replayed.
    pub fn from_clock() -> Rng {
        let seed =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64 | 1;
        println!("seed {seed}");
        Rng(seed)
    }

    /// A number below `below`.
    pub fn next(&mut self, below: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) % below
    }
}

/// Starts helper test `name` with `env` `cycles` times and SIGKILLs each run by its pid (then
/// reaps it): one kill in eight lands anywhere, opening included (0–40 ms in); the others after
/// the helper printed `READY`, 0–`after_ready_ms` ms later. Returns how many were killed before
/// they were ready.
pub fn kill_cycles(name: &str, env: &[(&str, &str)], cycles: u64, after_ready_ms: u64, rng: &mut Rng) -> u64 {
    use std::io::BufRead;
    let mut before_ready = 0;
    for _ in 0..cycles {
        let mut child = spawn_helper(name, env);
        if rng.next(8) == 0 {
            std::thread::sleep(Duration::from_millis(rng.next(40)));
            before_ready += 1;
        } else {
            let stdout = child.stdout.take().unwrap();
            // libtest prints the test's name on the line the child's first output joins.
            let ready =
                std::io::BufReader::new(stdout).lines().map_while(Result::ok).any(|l| l.contains("READY"));
            if !ready {
                let _ = child.kill();
                panic!("the child did not start");
            }
            std::thread::sleep(Duration::from_millis(rng.next(after_ready_ms)));
        }
        child.kill().unwrap();
        child.wait().unwrap();
    }
    before_ready
}

/// Runs helper test `name` with `env` to its end and asserts it printed `DONE` and exited
/// cleanly; a run that takes longer than `limit` is SIGKILLed (by its pid), failing the test
/// instead of hanging it. Its standard output is read to the end (a closed pipe would fail the
/// helper's last writes).
pub fn run_to_done(name: &str, env: &[(&str, &str)], limit: Duration) {
    use std::io::BufRead;
    let mut child = spawn_helper(name, env);
    let stdout = child.stdout.take().unwrap();
    let pid = child.id() as libc::pid_t;
    let (stop_tx, stop_rx) = std::sync::mpsc::channel::<()>();
    let watchdog = std::thread::spawn(move || {
        if stop_rx.recv_timeout(limit).is_err() {
            // SAFETY: signals our own child by its pid.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    });
    let out: Vec<String> = std::io::BufReader::new(stdout).lines().map_while(Result::ok).collect();
    let done = out.iter().any(|l| l.contains("DONE"));
    let status = child.wait().unwrap();
    let _ = stop_tx.send(());
    watchdog.join().unwrap();
    assert!(done, "the {name} run finished");
    assert!(status.success(), "{name}: {status}");
}

/// Opens the database again after a broker was dropped without a shutdown: its writer closes
/// RocksDB on its own thread, so the lock is retried until it is released (bounded by
/// `HANG_GUARD`).
pub async fn reopen_after_drop(path: &Path) -> Broker {
    reopen_after_drop_mode(path, Durability::Buffered).await
}

/// [`reopen_after_drop`] in `mode`.
pub async fn reopen_after_drop_mode(path: &Path, mode: Durability) -> Broker {
    reopen_after_drop_with(path, || Options::new().durability(mode)).await
}

/// [`reopen_after_drop`] with `options()` (background tasks off, as everywhere in the tests).
pub async fn reopen_after_drop_with(path: &Path, options: impl Fn() -> Options) -> Broker {
    #[cfg(feature = "etcd")]
    if let Some(b) = on_etcd(path, options()).await {
        return b;
    }
    let deadline = std::time::Instant::now() + HANG_GUARD;
    loop {
        let opened =
            options().retention_interval(Duration::ZERO).metrics_interval(Duration::ZERO).open(path).await;
        match opened {
            Ok(b) => return b,
            Err(rockq::Error::Locked { .. }) if std::time::Instant::now() < deadline => {
                tokio::task::yield_now().await;
                std::thread::yield_now();
            }
            Err(e) => panic!("reopen: {e}"),
        }
    }
}

/// Opens a Buffered broker whose leases and backoff run on `clock`.
pub async fn open_clock(path: &Path, clock: &rockq::ManualClock) -> Broker {
    open_clock_mode(path, clock, Durability::Buffered).await
}

/// Opens a broker with `options` as they are (their intervals included), or in the semantics
/// suites on etcd connects with them (durability: the cluster's quorum write).
pub async fn open_options(path: &Path, options: Options) -> Broker {
    #[cfg(feature = "etcd")]
    if let Some((endpoints, namespace)) = etcd_namespace(path) {
        let opts = rockq::EtcdOptions::new()
            .options(options.durability(Durability::Fsync))
            .owner_ttl(Duration::from_secs(2));
        return Broker::connect_etcd(endpoints, &namespace, opts).await.expect("connect to etcd");
    }
    options.open(path).await.expect("open")
}

/// Opens a broker in `mode` whose leases, backoff and delays run on `clock`.
pub async fn open_clock_mode(path: &Path, clock: &rockq::ManualClock, mode: Durability) -> Broker {
    #[cfg(feature = "etcd")]
    if let Some(b) = on_etcd(path, Options::new().clock(clock.clone())).await {
        return b;
    }
    Options::new()
        .durability(mode)
        .clock(clock.clone())
        .retention_interval(Duration::ZERO)
        .metrics_interval(Duration::ZERO)
        .open(path)
        .await
        .expect("open")
}

/// The next job, failing the test if the stream ends, errors or hangs.
pub async fn next_job(sub: &mut rockq::WorkSubscription) -> rockq::Job {
    tokio::time::timeout(HANG_GUARD, sub.next())
        .await
        .expect("hung waiting for a job")
        .expect("stream ended")
        .expect("stream yielded an error")
}

/// Waits for the first event matching `pred`, failing the test on a hang or a closed channel.
pub async fn wait_event(
    events: &mut tokio::sync::broadcast::Receiver<rockq::Event>,
    mut pred: impl FnMut(&rockq::Event) -> bool,
) -> rockq::Event {
    tokio::time::timeout(HANG_GUARD, async {
        loop {
            match events.recv().await {
                Ok(e) if pred(&e) => return e,
                Ok(_) => {}
                Err(e) => panic!("event channel: {e}"),
            }
        }
    })
    .await
    .expect("hung waiting for an event")
}

/// Overwrites the stored record of message `seq` of the queue with id `queue_id` with `value`,
/// through RocksDB directly (the broker must be shut down).
pub fn corrupt_message(path: &Path, queue_id: u32, seq: u64, value: &[u8]) {
    let cfs = rocksdb::DB::list_cf(&rocksdb::Options::default(), path).unwrap();
    let db = rocksdb::DB::open_cf(&rocksdb::Options::default(), path, &cfs).unwrap();
    let messages = db.cf_handle("rockq.messages").unwrap();
    let mut key = queue_id.to_be_bytes().to_vec();
    key.extend_from_slice(&seq.to_be_bytes());
    db.put_cf(messages, key, value).unwrap();
}

/// With `ROCKQ_TEST_ETCD` set (`scripts/etcd-semantics.sh`): the etcd endpoints, and the
/// namespace that stands for "the database at `path`" (see [`on_etcd`]).
fn etcd_namespace(path: &Path) -> Option<(Vec<String>, String)> {
    use std::hash::{Hash, Hasher};
    if !cfg!(feature = "etcd") {
        return None;
    }
    let endpoints = std::env::var("ROCKQ_TEST_ETCD").ok()?;
    let mut h = std::hash::DefaultHasher::new();
    path.hash(&mut h);
    Some((endpoints.split(',').map(str::to_owned).collect(), format!("t{:016x}", h.finish())))
}

/// A read-only view of the database at `path` (`Inspector::open`), or in the semantics suites
/// on etcd of the namespace standing for it (`Inspector::connect_etcd`: live, where a database
/// opened read-only shows the moment it was opened).
pub async fn inspector(path: &Path) -> rockq::Inspector {
    #[cfg(feature = "etcd")]
    if let Some((endpoints, namespace)) = etcd_namespace(path) {
        return rockq::Inspector::connect_etcd(endpoints, &namespace, rockq::EtcdOptions::new())
            .await
            .expect("inspect the namespace");
    }
    rockq::Inspector::open(path).await.expect("open the database read-only")
}

/// The semantics suites on etcd (`scripts/etcd-semantics.sh`): with `ROCKQ_TEST_ETCD` set to an
/// etcd endpoint, a test's "database at `path`" is the namespace named after `path`, so that
/// opening the same path again (a restart) connects to the same namespace, and every test has
/// its own. Durability is the cluster's quorum write (`Buffered` is not carried out there).
#[cfg(feature = "etcd")]
async fn on_etcd(path: &Path, options: Options) -> Option<Broker> {
    let (endpoints, namespace) = etcd_namespace(path)?;
    let options = options
        .durability(Durability::Fsync)
        .retention_interval(Duration::ZERO)
        .metrics_interval(Duration::ZERO);
    let opts = rockq::EtcdOptions::new().options(options).owner_ttl(Duration::from_secs(2));
    // A broker just dropped may still hold an ordered group's lease for a moment: its release
    // commits first, then revokes. Connecting never waits for that; subscribing does.
    Some(Broker::connect_etcd(endpoints, &namespace, opts).await.expect("connect to etcd"))
}

/// Queue `jobs` with four jobs and work group `workers` (30 s lease, 10 s backoff, no jitter)
/// in the middle of its work: job 1 dead-lettered ("malformed"), job 2 failed ("downstream
/// 503") and waiting for its retry, job 3 leased by the returned subscription, job 4 waiting.
/// What backups and exports must carry over, attempts included.
#[allow(dead_code)]
pub async fn jobs_mid_work(broker: &Broker) -> (rockq::WorkSubscription, rockq::Job) {
    let jobs = broker.queue("jobs").await.unwrap();
    jobs.send_batch(["j1", "j2", "j3", "j4"]).await.unwrap();
    let workers = jobs
        .work_group("workers")
        .unwrap()
        .lease(Duration::from_secs(30))
        .retry_policy(
            rockq::RetryPolicy::default()
                .max_attempts(5)
                .backoff(Duration::from_secs(10), Duration::from_secs(10))
                .jitter(0.0),
        )
        .read_batch(3)
        .max_in_flight(3);
    let mut js = workers.subscribe().await.unwrap();
    next_job(&mut js).await.dead_letter_durable("malformed").await.unwrap();
    next_job(&mut js).await.fail_durable("downstream 503").await.unwrap();
    let held = next_job(&mut js).await;
    assert_eq!(held.seq(), 3);
    (js, held)
}

/// The broker's stats without what a reopen or a move to another database changes by nature:
/// ages (the wall clock moves), byte estimates, in-flight counts (leases are a process's own).
#[allow(dead_code)]
pub async fn lasting_stats(broker: &Broker) -> rockq::Stats {
    let mut stats = broker.stats().await.unwrap();
    stats.bytes_on_disk = 0;
    for q in &mut stats.queues {
        q.oldest_age = None;
        q.bytes_on_disk = 0;
        q.bytes = 0;
    }
    for g in &mut stats.groups {
        g.oldest_unacked_age = None;
        g.in_flight = 0;
    }
    stats
}

/// Queue `orders`: five orders, one with an ordering key and a binary header (seq 6), one with
/// idempotency key `order-9` (seq 7); ordered group `billing` committed at 2.
#[allow(dead_code)]
pub async fn orders_mid_work(broker: &Broker) {
    let orders = broker.queue("orders").await.unwrap();
    orders.send_batch((1..=5).map(|i| format!("o{i}"))).await.unwrap();
    orders
        .submit(rockq::Message::new("keyed").key("customer-7").header("h", &b"\x00\xff"[..]))
        .await
        .unwrap();
    let charged = orders.submit(rockq::Message::new("charge").idempotency_key("order-9")).await.unwrap();
    assert_eq!(charged, rockq::Sent::Appended(7));
    let mut sub = orders.group("billing").unwrap().subscribe().await.unwrap();
    for d in take(&mut sub, 2).await {
        d.ack().unwrap();
    }
    sub.commit().await.unwrap();
}

/// The job-lookup tests' work group: "workers" on "jobs", a 30 s lease ([`JOB_LEASE`]), five
/// attempts an hour apart ([`JOB_BACKOFF`], no jitter), one job at a time.
pub async fn hourly_workers(broker: &Broker) -> rockq::WorkGroup {
    broker
        .queue("jobs")
        .await
        .unwrap()
        .work_group("workers")
        .unwrap()
        .lease(JOB_LEASE)
        .retry_policy(
            rockq::RetryPolicy::default().max_attempts(5).backoff(JOB_BACKOFF, JOB_BACKOFF).jitter(0.0),
        )
        .read_batch(1)
        .max_in_flight(1)
}

pub const JOB_LEASE: Duration = Duration::from_secs(30);
pub const JOB_BACKOFF: Duration = Duration::from_secs(3600);

/// A broker on a fresh `ManualClock` with `n` messages ("job 1" …) in queue "jobs".
pub async fn jobs_setup(n: u64) -> (tempfile::TempDir, rockq::ManualClock, Broker) {
    let dir = tempdir();
    let clock = rockq::ManualClock::new();
    let broker = open_clock(dir.path(), &clock).await;
    let jobs = broker.queue("jobs").await.unwrap();
    jobs.send_batch((1..=n).map(|i| format!("job {i}"))).await.unwrap();
    (dir, clock, broker)
}

/// Why [`flow_in_progress`] dead-letters its third resize (markup: pages must escape it).
pub const FLOW_FAILURE: &str = "unreadable <img src=x>";

/// A flow of three resizes, an album after all succeeded and a report after all finished: two
/// resizes acked (with results), one dead-lettered — so the album is blocked and the report sent.
pub async fn flow_in_progress(broker: &rockq::Broker) -> u64 {
    let lease = Duration::from_secs(3600);
    let images = broker.queue("images").await.unwrap();
    let resize = images.work_group("resize").unwrap().lease(lease);
    let albums = broker.queue("albums").await.unwrap().work_group("build").unwrap().lease(lease);
    let mut flow = broker.flow();
    let children: Vec<_> =
        ["a.jpg", "b.jpg", "c.jpg"].iter().map(|n| flow.job(&resize, *n).unwrap()).collect();
    flow.then(&albums, "album", &children).unwrap();
    flow.finally(&albums, "report", &children).unwrap();
    let id = flow.submit().await.unwrap().id;
    let mut sub = resize.subscribe().await.unwrap();
    for i in 0..3 {
        let job = next_job(&mut sub).await;
        if i < 2 {
            job.set_result(format!("small-{}", String::from_utf8_lossy(job.payload()))).unwrap();
            job.ack_durable().await.unwrap();
        } else {
            job.dead_letter_durable(FLOW_FAILURE).await.unwrap();
        }
    }
    drop(sub);
    broker.flush().await.unwrap();
    id
}

/// A pool handler that hands each task it starts to `started` and returns `Ok` once `go` is
/// notified (waiting registered before the task is handed over: no notification is missed).
#[allow(dead_code)] // not every test binary runs pools
pub fn handing_over(
    started: tokio::sync::mpsc::UnboundedSender<rockq::Task>,
    go: std::sync::Arc<tokio::sync::Notify>,
) -> impl Fn(rockq::Task) -> futures::future::BoxFuture<'static, Result<(), rockq::HandlerError>>
+ Send
+ Sync
+ 'static {
    use futures::FutureExt;
    move |task: rockq::Task| {
        let (started, go) = (started.clone(), go.clone());
        async move {
            let notified = go.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            started.send(task).unwrap();
            notified.await;
            Ok(())
        }
        .boxed()
    }
}
