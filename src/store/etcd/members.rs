//! The members of the etcd cluster a namespace is reached through, and which one to ask.
//!
//! The etcd client's own balancing sends each request to the next endpoint in turn, whatever
//! that member's state: with one member paused, every request that lands on it waits for the
//! whole request timeout, and since the writer sends its transactions one after another, one
//! hung member froze every process (issue 37). A dead listed endpoint failed connects at random.
//!
//! Here each member has its own client, and every request goes to one *preferred* member with a
//! short deadline of its own ([`EtcdOptions::attempt_timeout`](crate::EtcdOptions)). A member
//! that does not answer in time, cannot be connected to or has no leader is set aside for a
//! while (longer each time in a row) and the next member is preferred; the caller's retry loop
//! (every request of the engine has one, and writes resolve their unknown outcomes) sends the
//! request again, now to a member that answers. Linearizable reads and writes go through any
//! member to the leader, so which member is asked does not change what is read or written;
//! only a lost quorum stops progress. A member set aside is not asked again while the preferred
//! one answers; when every member failed in a row, the deadline doubles (a slow cluster is not
//! a dead one), up to four times the attempt's and never beyond the request timeout.
//!
//! Watches and lease renewals are long-lived streams on one member: a watch asks its member for
//! a progress report when it has been quiet, and ends (the engine re-reads and watches again,
//! on the preferred member) when no answer comes or its member was set aside.

use std::sync::Mutex;
use std::time::Duration;

use etcd_client::{
    Client, ConnectOptions, GetOptions, GetResponse, Txn, TxnResponse, WatchOptions, WatchResponse,
};
use tokio::time::Instant;

use crate::error::StorageError;

/// How long a member is set aside after its first failure in a row (doubling after each next
/// one, up to [`MAX_SET_ASIDE`]).
const SET_ASIDE: Duration = Duration::from_millis(500);
const MAX_SET_ASIDE: Duration = Duration::from_secs(10);
/// A watch quiet for this long asks its member for a progress report.
const WATCH_QUIET: Duration = Duration::from_millis(500);

/// The client's error as ours (its message only: no etcd type leaves `store/`).
pub(super) fn etcd(e: etcd_client::Error) -> StorageError {
    if member_fault(&e) {
        StorageError::unreachable(format!("etcd: {e}"))
    } else {
        StorageError::new(format!("etcd: {e}"))
    }
}

/// Whether an error says something about the member that answered it (unreachable, no leader,
/// gone mid-request) rather than about the request (a compacted revision, too many operations).
fn member_fault(e: &etcd_client::Error) -> bool {
    // gRPC codes that blame the request: invalid argument (3), not found (5), already exists
    // (6), permission denied (7), resource exhausted (8), failed precondition (9), out of range
    // (11), unauthenticated (16). Anything else (unavailable, deadline exceeded, unknown, ...)
    // blames the member.
    match e {
        etcd_client::Error::GRpcStatus(s) => !matches!(s.code() as i32, 3 | 5..=9 | 11 | 16),
        etcd_client::Error::TransportError(_)
        | etcd_client::Error::IoError(_)
        | etcd_client::Error::WatchError(_)
        | etcd_client::Error::LeaseKeepAliveError(_)
        | etcd_client::Error::EndpointError(_) => true,
        _ => false,
    }
}

/// Checks one endpoint URL before anything is connected: a malformed one is the caller's
/// mistake, not the store's.
pub(crate) fn check_endpoint(endpoint: &str) -> Result<(), String> {
    let bad = |why: &str| Err(format!("etcd endpoint {endpoint:?}: {why}"));
    let rest = match endpoint.split_once("://") {
        Some(("http" | "https", rest)) => rest,
        Some((scheme, _)) => return bad(&format!("scheme {scheme:?} is not http or https")),
        None => endpoint,
    };
    let authority = rest.strip_suffix('/').unwrap_or(rest);
    if authority.contains('/') || authority.contains(char::is_whitespace) {
        return bad("expected host:port");
    }
    let (host, port) = match authority.rsplit_once(':') {
        // An IPv6 address in brackets, or a host name, then the port.
        Some((h, p)) if !h.ends_with(']') || h.starts_with('[') => (h, Some(p)),
        _ => (authority, None),
    };
    if host.is_empty() {
        return bad("no host");
    }
    if let Some(p) = port
        && p.parse::<u16>().is_err()
    {
        return bad(&format!("port {p:?} is not a number from 0 to 65535"));
    }
    Ok(())
}

struct Member {
    endpoint: String,
    client: Client,
}

#[derive(Default)]
struct Health {
    preferred: usize,
    /// Per member: set aside until then.
    aside_until: Vec<Option<Instant>>,
    /// Per member: failures in a row.
    strikes: Vec<u32>,
    /// Per member: failed since the last answer (any member's). Counted by member, not by
    /// request: a dead leader fails every request in flight on it at once, and those many
    /// failures of one member must not pass for a slow cluster.
    failing: Vec<bool>,
    /// Times every member failed in a row since the last answer: each doubles the deadline
    /// (a slow cluster is not a dead one).
    rounds: u32,
    /// Per member: fault answers so far (a refusal or a broken connection, not a silence);
    /// requests waiting on a member give up when this moves (see [`Members::run`]).
    faults: Vec<u64>,
}

/// The cluster's members, each with its own client, and which one is asked.
pub(crate) struct Members {
    members: Vec<Member>,
    health: Mutex<Health>,
    attempt: Duration,
    request: Duration,
    /// Bumped whenever a member is set aside: watches on it end.
    aside: tokio::sync::watch::Sender<u64>,
}

impl Members {
    /// A client per endpoint (nothing is connected until asked).
    pub async fn new(
        endpoints: &[String],
        attempt: Duration,
        request: Duration,
    ) -> Result<Members, StorageError> {
        let mut members = Vec::with_capacity(endpoints.len());
        for endpoint in endpoints {
            let opts = ConnectOptions::new()
                .with_connect_timeout(attempt)
                .with_keep_alive(Duration::from_secs(2), attempt.max(Duration::from_secs(1)))
                .with_require_leader(true);
            let client = Client::connect([endpoint.as_str()], Some(opts)).await.map_err(etcd)?;
            members.push(Member { endpoint: endpoint.clone(), client });
        }
        let n = members.len();
        let health = Health {
            preferred: 0,
            aside_until: vec![None; n],
            strikes: vec![0; n],
            failing: vec![false; n],
            rounds: 0,
            faults: vec![0; n],
        };
        Ok(Members {
            members,
            health: Mutex::new(health),
            attempt,
            request,
            aside: tokio::sync::watch::Sender::new(0),
        })
    }

    fn health(&self) -> std::sync::MutexGuard<'_, Health> {
        self.health.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The member to ask now, and the deadline for one attempt.
    fn pick(&self) -> (usize, Duration) {
        let mut h = self.health();
        let n = self.members.len();
        let now = Instant::now();
        let up = |h: &Health, i: usize| h.aside_until[i].is_none_or(|t| t <= now);
        if !up(&h, h.preferred) {
            let next = (1..n).map(|k| (h.preferred + k) % n).find(|&i| up(&h, i));
            // Every member set aside: the one that comes back first.
            h.preferred = next.unwrap_or_else(|| (0..n).min_by_key(|&i| h.aside_until[i]).unwrap_or(0));
        }
        let rounds = h.rounds.min(2);
        let deadline = self.attempt.saturating_mul(1 << rounds).min(self.request.max(self.attempt));
        (h.preferred, deadline)
    }

    fn answered(&self, i: usize) {
        let mut h = self.health();
        h.strikes[i] = 0;
        h.aside_until[i] = None;
        h.failing.iter_mut().for_each(|f| *f = false);
        h.rounds = 0;
    }

    fn failed(&self, i: usize, why: &str) {
        {
            let mut h = self.health();
            h.strikes[i] = h.strikes[i].saturating_add(1);
            h.failing[i] = true;
            if h.failing.iter().all(|&f| f) {
                h.rounds = h.rounds.saturating_add(1);
                h.failing.iter_mut().for_each(|f| *f = false);
            }
            let pause = SET_ASIDE.saturating_mul(1 << (h.strikes[i] - 1).min(5)).min(MAX_SET_ASIDE);
            h.aside_until[i] = Some(Instant::now() + pause);
            if h.preferred == i && self.members.len() > 1 {
                h.preferred = (i + 1) % self.members.len();
            }
        }
        tracing::debug!(endpoint = %self.members[i].endpoint, %why, "rockq: etcd member set aside");
        self.aside.send_modify(|g| *g += 1);
    }

    /// Member `i` answered a request with a fault: set aside, and the requests waiting on it
    /// are given up (see [`Members::run`]).
    fn fault(&self, i: usize, why: &str) {
        self.health().faults[i] += 1;
        self.failed(i, why);
    }

    /// Member `i`'s fault answers so far.
    fn faults(&self, i: usize) -> u64 {
        self.health().faults[i]
    }

    fn is_aside(&self, i: usize) -> bool {
        self.health().aside_until[i].is_some_and(|t| t > Instant::now())
    }

    /// Runs one request on the preferred member within the attempt deadline (or `long`, for
    /// requests whose size makes them slow), noting how the member did.
    pub async fn run<T, F, Fut>(&self, long: bool, op: F) -> Result<T, StorageError>
    where
        F: FnOnce(Client) -> Fut,
        Fut: std::future::Future<Output = Result<T, etcd_client::Error>>,
    {
        let mut aside = self.aside.subscribe();
        aside.mark_unchanged();
        let (i, attempt) = self.pick();
        let faults = self.faults(i);
        // A large answer (a whole prefix) gets longer, but not the whole request timeout: a
        // member that hangs mid-read must leave time to ask another.
        let deadline =
            if long { self.request.min(self.attempt.saturating_mul(10)).max(attempt) } else { attempt };
        // The member answered another request with a fault since this one was sent: this one
        // is given up at once, as at its deadline. A follower that has not yet noticed its
        // leader died takes writes and never answers them; the first request it fails
        // ("leader changed", once the election is over) frees every other one waiting on it
        // to try the next member, where each would otherwise wait out its whole deadline —
        // acks stopped for twice the attempt timeout after a leader's death
        // (tests/etcd_availability.rs). Not on a silence (another request's deadline): a slow
        // member still answers, and giving up its requests would send them all again; and not
        // with one member, where there is no other to ask. Long reads too: a linearizable read
        // on a follower without a leader waits as a write does.
        let abandon = self.members.len() > 1;
        let set_aside = async {
            if !abandon {
                return futures::future::pending().await;
            }
            loop {
                if aside.changed().await.is_err() {
                    return futures::future::pending().await;
                }
                if self.faults(i) != faults {
                    return;
                }
            }
        };
        let answer = tokio::select! {
            // An answer that came with the fault is taken.
            biased;
            answer = tokio::time::timeout(deadline, op(self.members[i].client.clone())) => answer,
            () = set_aside => {
                return Err(StorageError::unreachable(format!(
                    "etcd: {} failed another request while this one waited for it",
                    self.members[i].endpoint
                )));
            }
        };
        match answer {
            Ok(Ok(v)) => {
                self.answered(i);
                Ok(v)
            }
            Ok(Err(e)) => {
                if member_fault(&e) {
                    self.fault(i, &e.to_string());
                }
                Err(etcd(e))
            }
            Err(_) => {
                self.failed(i, "no answer in time");
                Err(StorageError::unreachable(format!(
                    "etcd: {} did not answer within {deadline:?}",
                    self.members[i].endpoint
                )))
            }
        }
    }

    /// The client of the preferred member, for a long-lived stream (a lease renewal).
    pub fn preferred(&self) -> (usize, Client) {
        let (i, _) = self.pick();
        (i, self.members[i].client.clone())
    }

    /// Notes a stream's failure on member `i`.
    pub fn stream_failed(&self, i: usize, why: &str) {
        self.failed(i, why);
    }

    /// The attempt deadline now.
    pub fn attempt(&self) -> Duration {
        self.pick().1
    }

    /// Opens a watch on the preferred member.
    pub async fn watch(&self, key: Vec<u8>, opts: WatchOptions) -> Result<LiveWatch, StorageError> {
        let mut aside = self.aside.subscribe();
        aside.mark_unchanged();
        let (i, deadline) = self.pick();
        let mut client = self.members[i].client.watch_client();
        let opened = tokio::time::timeout(deadline, client.watch(key, Some(opts))).await;
        let (watcher, stream) = match opened {
            Ok(Ok(w)) => w,
            Ok(Err(e)) => {
                if member_fault(&e) {
                    self.failed(i, &e.to_string());
                }
                return Err(etcd(e));
            }
            Err(_) => {
                self.failed(i, "watch not opened in time");
                return Err(StorageError::unreachable("etcd: watch not opened in time"));
            }
        };
        Ok(LiveWatch { member: i, watcher, stream, aside, deadline })
    }
}

/// A watch that notices when its member stops answering.
pub(crate) struct LiveWatch {
    member: usize,
    watcher: etcd_client::Watcher,
    stream: etcd_client::WatchStream,
    aside: tokio::sync::watch::Receiver<u64>,
    deadline: Duration,
}

impl LiveWatch {
    /// The next response with events (or that ends the watch: cancelled, compacted). `Err`
    /// when the member went away, did not answer a progress request in time, or was set aside
    /// by another request; `Ok(None)` when the stream ended.
    pub async fn next(&mut self, members: &Members) -> Result<Option<WatchResponse>, StorageError> {
        let mut probed: Option<Instant> = None;
        loop {
            let quiet_until = match probed {
                Some(at) => at + self.deadline,
                None => Instant::now() + WATCH_QUIET,
            };
            tokio::select! {
                m = self.stream.message() => match m {
                    Ok(Some(r)) if r.events().is_empty() && !r.canceled() && r.compact_revision() == 0 => {
                        // Created, or a progress report: the member answers.
                        probed = None;
                    }
                    Ok(r) => return Ok(r),
                    Err(e) => {
                        if member_fault(&e) {
                            members.stream_failed(self.member, &e.to_string());
                        }
                        return Err(etcd(e));
                    }
                },
                // Silence ends the watch but does not set its member aside: a member may hold a
                // progress report back while the watch catches up. The engine watches again on
                // the preferred member; a member that really hangs fails that (or any) request
                // and is set aside then.
                _ = tokio::time::sleep_until(quiet_until) => match probed {
                    None => {
                        probed = Some(Instant::now());
                        if self.watcher.request_progress().await.is_err() {
                            return Err(StorageError::unreachable("etcd: watch progress request failed"));
                        }
                    }
                    Some(_) => {
                        return Err(StorageError::unreachable("etcd: the watched member stopped answering"));
                    }
                },
                changed = self.aside.changed() => {
                    if changed.is_err() || members.is_aside(self.member) {
                        return Err(StorageError::unreachable("etcd: the watched member was set aside"));
                    }
                }
            }
        }
    }
}

/// An answer, or `None` when it was larger than the client decodes (tonic's `OutOfRange`
/// "message length too large"): the request was fine, its answer too big to carry.
fn bounded<T>(r: Result<T, etcd_client::Error>) -> Result<Option<T>, etcd_client::Error> {
    match r {
        Ok(v) => Ok(Some(v)),
        Err(etcd_client::Error::GRpcStatus(s))
            // gRPC code 11: out of range.
            if s.code() as i32 == 11 && s.message().contains("message length too large") =>
        {
            Ok(None)
        }
        Err(e) => Err(e),
    }
}

/// Key-value requests through [`Members::run`].
pub(crate) struct Kv<'a>(pub(super) &'a Members);

impl Kv<'_> {
    pub async fn get(&self, key: Vec<u8>, opts: Option<GetOptions>) -> Result<GetResponse, StorageError> {
        self.0.run(false, |c| async move { c.kv_client().get(key, opts).await }).await
    }

    /// A read whose answer may be large (a whole prefix): the request timeout, not the
    /// attempt's.
    pub async fn get_long(
        &self,
        key: Vec<u8>,
        opts: Option<GetOptions>,
    ) -> Result<GetResponse, StorageError> {
        self.0.run(true, |c| async move { c.kv_client().get(key, opts).await }).await
    }

    /// A read whose answer may outgrow the client's answer limit (4 MiB): `None` then, for
    /// the caller to ask for fewer entries. Any other error as [`get`](Self::get).
    pub async fn get_bounded(
        &self,
        key: Vec<u8>,
        opts: Option<GetOptions>,
    ) -> Result<Option<GetResponse>, StorageError> {
        self.0.run(false, |c| async move { bounded(c.kv_client().get(key, opts).await) }).await
    }

    /// A transaction of reads whose answer may outgrow the client's answer limit, as
    /// [`get_bounded`](Self::get_bounded).
    pub async fn txn_bounded(&self, txn: Txn) -> Result<Option<TxnResponse>, StorageError> {
        self.0.run(false, |c| async move { bounded(c.kv_client().txn(txn).await) }).await
    }

    pub async fn txn(&self, txn: Txn) -> Result<TxnResponse, StorageError> {
        self.0.run(false, |c| async move { c.kv_client().txn(txn).await }).await
    }

    pub async fn compact(&self, revision: i64) -> Result<(), StorageError> {
        self.0.run(true, |c| async move { c.kv_client().compact(revision, None).await.map(|_| ()) }).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_are_checked_before_anything_is_connected() {
        for good in
            ["http://127.0.0.1:2379", "https://etcd.example:2379/", "127.0.0.1:2379", "[::1]:2379", "host"]
        {
            assert_eq!(check_endpoint(good), Ok(()), "{good}");
        }
        for bad in
            ["ftp://h:1", "http://", "http://h:port", "http://h:99999", "http://h:1/path", "http://a b:1", ""]
        {
            assert!(check_endpoint(bad).is_err(), "{bad}");
        }
    }

    async fn three() -> Members {
        let eps: Vec<String> = (1..=3).map(|i| format!("http://127.0.0.{i}:2379")).collect();
        Members::new(&eps, Duration::from_millis(100), Duration::from_secs(2)).await.expect("clients")
    }

    #[tokio::test]
    async fn a_failing_member_is_set_aside_and_the_next_is_asked_until_it_answers_again() {
        let m = three().await;
        assert_eq!(m.pick(), (0, Duration::from_millis(100)), "the first listed is asked first");
        m.failed(0, "test");
        assert_eq!(m.pick().0, 1);
        assert!(m.is_aside(0));
        // The preferred member stays preferred while it answers, even once 0 is back.
        m.answered(1);
        assert_eq!(m.pick().0, 1);
        m.failed(1, "test");
        m.failed(2, "test");
        assert_eq!(m.pick(), (0, Duration::from_millis(100)), "two failures in a row of three members");
        m.failed(0, "again");
        // Every member failed in a row: the one back first is asked (0 failed twice in a row,
        // so it is set aside longest), with a longer deadline.
        let (i, deadline) = m.pick();
        assert_eq!(i, 1, "set aside first, back first");
        assert_eq!(deadline, Duration::from_millis(200));
        m.answered(i);
        assert_eq!(m.pick(), (1, Duration::from_millis(100)), "an answer resets the deadline");
        // A dead member fails every request that was on it: many failures, one member.
        for _ in 0..20 {
            m.failed(1, "connection reset");
        }
        assert_eq!(m.pick(), (2, Duration::from_millis(100)), "one member's failures are not a slow cluster");
    }

    #[tokio::test(start_paused = true)]
    async fn a_member_failing_again_is_set_aside_longer_and_watches_on_it_hear_of_it() {
        let m = three().await;
        let aside = m.aside.subscribe();
        m.failed(0, "test");
        assert!(aside.has_changed().unwrap(), "watches are told");
        tokio::time::advance(SET_ASIDE).await;
        assert!(!m.is_aside(0), "back after the first pause");
        m.failed(0, "again");
        tokio::time::advance(SET_ASIDE).await;
        assert!(m.is_aside(0), "the second pause in a row is longer");
        tokio::time::advance(SET_ASIDE).await;
        assert!(!m.is_aside(0));
    }

    /// A request to the preferred member that is never answered (a follower whose leader died
    /// unseen); `started` is told once it is out.
    async fn unanswered(m: &Members, started: tokio::sync::oneshot::Sender<()>) -> Result<(), StorageError> {
        m.run(false, |_client| async move {
            let _ = started.send(());
            futures::future::pending::<Result<(), etcd_client::Error>>().await
        })
        .await
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_waiting_on_a_member_another_request_sets_aside_is_given_up_at_once() {
        let m = three().await;
        let (started_tx, started) = tokio::sync::oneshot::channel();
        let other = async {
            started.await.expect("the first request started");
            // Member 1 answers with a fault, and member 0 falls silent on a request of its
            // own: nothing for the request waiting on 0. Then 0 answers one with a fault.
            m.fault(1, "test");
            tokio::task::yield_now().await;
            m.failed(0, "no answer in time");
            tokio::task::yield_now().await;
            m.fault(0, "leader changed");
        };
        let at = Instant::now();
        let (res, ()) = tokio::join!(unanswered(&m, started_tx), other);
        let err = res.expect_err("given up");
        assert!(err.is_transient(), "{err}");
        assert!(err.message().contains("failed another request while this one waited"), "{err}");
        assert!(at.elapsed() < Duration::from_millis(100), "not at its deadline");
    }

    #[tokio::test(start_paused = true)]
    async fn with_one_member_a_request_waits_for_its_deadline_whatever_the_others_do() {
        let eps = vec!["http://127.0.0.1:2379".to_owned()];
        let m = Members::new(&eps, Duration::from_millis(100), Duration::from_secs(2)).await.expect("client");
        let (started_tx, started) = tokio::sync::oneshot::channel();
        let other = async {
            started.await.expect("the first request started");
            m.fault(0, "a request of its own failed");
        };
        let (res, ()) = tokio::join!(unanswered(&m, started_tx), other);
        let err = res.expect_err("no answer");
        assert!(err.message().contains("did not answer within"), "{err}");
    }
}
