#![allow(dead_code)] // each test file uses part of the harness
//! A real etcd for tests (feature `etcd`): one member or three, started from the installed
//! `etcd` binary (Debian's `etcd-server`; `scripts/etcd-tests.sh` installs it) on loopback ports
//! chosen now, data in a temp dir, every process stopped by its pid when the cluster is
//! dropped (also when a test panics).

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// `n` distinct loopback ports free right now: all are bound at once (so one cluster never
/// gets the same port twice), then released for etcd to take.
fn free_ports(n: usize) -> Vec<u16> {
    let held: Vec<TcpListener> =
        (0..n).map(|_| TcpListener::bind("127.0.0.1:0").expect("bind a free port")).collect();
    held.iter().map(|l| l.local_addr().expect("addr").port()).collect()
}

/// One member: its process (killed and reaped on drop), its client URL and its name.
pub struct Member {
    pub name: String,
    pub client_url: String,
    child: Option<Child>,
    /// How it was started, to start it again on the same data and ports.
    args: Vec<String>,
    log: std::path::PathBuf,
}

impl Member {
    /// The process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// SIGKILL, then reap.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts a killed member again on its data directory and ports: it rejoins the cluster
    /// as the member it was (etcd reads its identity from the data directory).
    pub fn restart(&mut self) {
        if self.child.is_none() {
            self.child = Some(spawn(&self.args, &self.log));
        }
    }

    /// SIGSTOP (`true`) or SIGCONT (`false`): a member that stops answering without dying.
    pub fn pause(&self, stop: bool) {
        if let Some(pid) = self.pid() {
            let sig = if stop { libc::SIGSTOP } else { libc::SIGCONT };
            // SAFETY: signals our own child by its pid.
            unsafe { libc::kill(pid as libc::pid_t, sig) };
        }
    }
}

impl Drop for Member {
    fn drop(&mut self) {
        // A stopped member cannot die of SIGKILL until it is continued on some kernels' view
        // of reaping: continue it first.
        self.pause(false);
        self.kill();
    }
}

fn spawn(args: &[String], log: &std::path::Path) -> Child {
    // Appended to: a restarted member's log follows its first life's.
    let out = std::fs::OpenOptions::new().create(true).append(true).open(log).expect("etcd log file");
    Command::new("etcd")
        .args(args)
        .stdin(Stdio::null())
        .stdout(out.try_clone().expect("log"))
        .stderr(out)
        .spawn()
        .expect("start etcd (install it with scripts/etcd-tests.sh)")
}

/// A running cluster of `n` members.
pub struct Cluster {
    pub members: Vec<Member>,
    _dir: tempfile::TempDir,
}

impl Cluster {
    /// Starts `n` members (1 or 3) with short heartbeats and elections (50 ms / 500 ms) so
    /// that failover tests are quick, and waits until the cluster has a leader.
    ///
    /// A cluster that elects no leader within 20 s is stopped, its members' logs are printed,
    /// and a fresh one is started on new ports (up to three times): on a loaded 2-core CI
    /// machine another process may take a port between our release and etcd's bind, and a
    /// member that lost its port never joins. The tests are about rockq, not about that race.
    pub async fn start(n: usize) -> Cluster {
        for attempt in 1..=3 {
            let cluster = Self::launch(n);
            if cluster.wait_for_leader_or_none(Duration::from_secs(20)).await.is_some() {
                if cluster.answers_as_itself().await {
                    return cluster;
                }
                // Another test's etcd holds one of the client ports (taken between our
                // release and this etcd's bind): its answers are not this cluster's.
                eprintln!("etcd test cluster (attempt {attempt}): a client port is another cluster's");
                continue;
            }
            eprintln!("etcd test cluster (attempt {attempt}) elected no leader in 20 s; member logs:");
            for m in &cluster.members {
                let log = cluster._dir.path().join(format!("{}.log", m.name));
                let text = std::fs::read_to_string(&log).unwrap_or_default();
                let tail: Vec<&str> = text.lines().rev().take(15).collect();
                eprintln!("--- {} ({}) ---", m.name, m.client_url);
                for line in tail.iter().rev() {
                    eprintln!("{line}");
                }
            }
        }
        panic!("no etcd leader in three fresh clusters of {n}");
    }

    fn launch(n: usize) -> Cluster {
        let dir = tempfile::Builder::new().prefix("rockq-etcd").tempdir().expect("temp dir");
        let all = free_ports(2 * n);
        let token =
            dir.path().file_name().map_or_else(|| "rockq-test".into(), |f| f.to_string_lossy().into_owned());
        let ports: Vec<(u16, u16)> = (0..n).map(|i| (all[2 * i], all[2 * i + 1])).collect();
        let initial: Vec<String> =
            ports.iter().enumerate().map(|(i, (_, p))| format!("m{i}=http://127.0.0.1:{p}")).collect();
        let members = ports
            .iter()
            .enumerate()
            .map(|(i, (c, p))| {
                let name = format!("m{i}");
                let client_url = format!("http://127.0.0.1:{c}");
                let args: Vec<String> = vec![
                    format!("--name={name}"),
                    format!("--data-dir={}", dir.path().join(&name).display()),
                    format!("--listen-client-urls={client_url}"),
                    format!("--advertise-client-urls={client_url}"),
                    format!("--listen-peer-urls=http://127.0.0.1:{p}"),
                    format!("--initial-advertise-peer-urls=http://127.0.0.1:{p}"),
                    format!("--initial-cluster={}", initial.join(",")),
                    "--initial-cluster-state=new".into(),
                    // One token per cluster: members of two tests' clusters never join
                    // each other through a peer port both were given.
                    format!("--initial-cluster-token={token}"),
                    "--heartbeat-interval=50".into(),
                    "--election-timeout=500".into(),
                ];
                let log = dir.path().join(format!("{name}.log"));
                let child = Some(spawn(&args, &log));
                Member { name, client_url, child, args, log }
            })
            .collect();
        Cluster { members, _dir: dir }
    }

    /// Every member's client URL.
    pub fn endpoints(&self) -> Vec<String> {
        self.members.iter().map(|m| m.client_url.clone()).collect()
    }

    /// A client of the running members (a request sent to a killed member's endpoint would
    /// fail rather than move to the next).
    pub async fn client(&self) -> etcd_client::Client {
        let running: Vec<String> =
            self.members.iter().filter(|m| m.pid().is_some()).map(|m| m.client_url.clone()).collect();
        Self::client_of(&running).await
    }

    /// A client of `endpoints`, with short timeouts (a request to a dead member fails fast).
    pub async fn client_of(endpoints: &[String]) -> etcd_client::Client {
        let opts = etcd_client::ConnectOptions::new()
            .with_connect_timeout(Duration::from_secs(2))
            .with_timeout(Duration::from_secs(3));
        etcd_client::Client::connect(endpoints, Some(opts)).await.expect("connect to etcd")
    }

    /// The index of the current leader, once one is elected (polling each running member's
    /// status: etcd has no push for it).
    pub async fn wait_for_leader(&self, within: Duration) -> usize {
        match self.wait_for_leader_or_none(within).await {
            Some(i) => i,
            None => panic!("no etcd leader within {within:?}"),
        }
    }

    async fn wait_for_leader_or_none(&self, within: Duration) -> Option<usize> {
        let deadline = Instant::now() + within;
        loop {
            if let Some(i) = self.leader().await {
                return Some(i);
            }
            if Instant::now() >= deadline {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Whether each member's client URL is answered by this cluster: the member list there
    /// holds the member's own peer URL. A test that reached another test's etcd through a
    /// port both were given would share its data (two keyed drains counted each other's
    /// messages).
    async fn answers_as_itself(&self) -> bool {
        for m in &self.members {
            let peer = m.args.iter().find_map(|a| a.strip_prefix("--initial-advertise-peer-urls="));
            let opts = etcd_client::ConnectOptions::new()
                .with_connect_timeout(Duration::from_secs(2))
                .with_timeout(Duration::from_secs(3));
            let Ok(mut c) = etcd_client::Client::connect([m.client_url.clone()], Some(opts)).await else {
                return false;
            };
            let Ok(list) = c.member_list().await else { return false };
            if !list.members().iter().any(|x| peer.is_some_and(|p| x.peer_urls().iter().any(|u| u == p))) {
                return false;
            }
        }
        true
    }

    /// The index of the member that leads now, as the running members see it.
    pub async fn leader(&self) -> Option<usize> {
        for m in self.members.iter().filter(|m| m.pid().is_some()) {
            let opts = etcd_client::ConnectOptions::new()
                .with_connect_timeout(Duration::from_millis(300))
                .with_timeout(Duration::from_millis(500));
            let Ok(mut c) = etcd_client::Client::connect([m.client_url.clone()], Some(opts)).await else {
                continue;
            };
            let Ok(status) = c.status().await else { continue };
            if status.leader() == 0 {
                continue;
            }
            let Ok(list) = c.member_list().await else { continue };
            let leader = list.members().iter().find(|x| x.id() == status.leader())?;
            // A member that was just killed is still "the leader" to the others until their
            // election timeout: only a running one counts.
            return self.members.iter().position(|m| m.name == leader.name() && m.pid().is_some());
        }
        None
    }
}

/// `m` padded (a header) so that a call of `n` such messages is larger than one etcd
/// transaction's 1 MiB of values and its sequences are reserved (`store/etcd/reserve.rs`): in
/// a namespace that packs messages into runs, one transaction holds thousands of small ones,
/// so a count of messages no longer forces the reserved path.
pub fn reserved_sized(m: rockq::Message, n: usize) -> rockq::Message {
    m.header("pad", vec![b'.'; (5 << 20) / 4 / n.max(1)])
}

/// How many keys etcd holds under `prefix`: a reserved call stores a key per message, a
/// packed append a key per run.
pub async fn keys_under(client: &mut etcd_client::Client, prefix: &str) -> usize {
    let opts = etcd_client::GetOptions::new().with_prefix().with_count_only();
    client.get(prefix, Some(opts)).await.expect("count keys").count() as usize
}
