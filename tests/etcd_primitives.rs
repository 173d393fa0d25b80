//! The etcd engine's primitives (docs/DISTRIBUTED.md), checked against a real etcd before the
//! engine is built on them (feature `etcd`; run by `scripts/etcd-tests.sh`, which installs
//! `etcd-server` and `protobuf-compiler`):
//!
//! - **Append by CAS on the queue's tail key**: producers racing on one queue get dense,
//!   unique sequences, a message per sequence, nothing lost or doubled — on one member, and
//!   on three members whose leader is SIGKILLed mid-load (a send whose answer was lost is
//!   settled by reading what is there, never sent twice).
//! - **Claims fenced by `mod_revision`**: of two holders only the one whose claim revision is
//!   current can settle; the other's compare fails and changes nothing.

mod common;
#[path = "common/etcd.rs"]
mod etcd;

use std::collections::BTreeMap;
use std::time::Duration;

use etcd_client::{Client, Compare, CompareOp, GetOptions, Txn, TxnOp};

fn tail_key(q: &str) -> Vec<u8> {
    format!("t/tail/{q}").into_bytes()
}

fn msg_key(q: &str, seq: u64) -> Vec<u8> {
    let mut k = format!("t/m/{q}/").into_bytes();
    k.extend_from_slice(&seq.to_be_bytes());
    k
}

/// The tail's value and `mod_revision` (0, 0 before the first append).
async fn tail(c: &mut Client, q: &str) -> Result<(u64, i64), etcd_client::Error> {
    let r = c.get(tail_key(q), None).await?;
    Ok(match r.kvs().first() {
        Some(kv) => (u64::from_be_bytes(kv.value().try_into().expect("8 bytes")), kv.mod_revision()),
        None => (0, 0),
    })
}

/// Whether message `payload` is stored under some sequence (reading the whole queue).
async fn find(c: &mut Client, q: &str, payload: &[u8]) -> Result<Option<u64>, etcd_client::Error> {
    let prefix = format!("t/m/{q}/").into_bytes();
    let r = c.get(prefix.clone(), Some(GetOptions::new().with_prefix())).await?;
    Ok(r.kvs()
        .iter()
        .find(|kv| kv.value() == payload)
        .map(|kv| u64::from_be_bytes(kv.key()[prefix.len()..].try_into().expect("8-byte seq"))))
}

/// Appends `payload` to queue `q`: `If mod_revision(tail) == seen Then Put tail, Put message`,
/// re-reading the tail when another producer got there first. An error with an unknown
/// outcome (the leader died mid-request) is settled by looking for the payload before trying
/// again, so a message is never stored twice. Returns its sequence.
async fn append(c: &mut Client, q: &str, payload: &[u8]) -> u64 {
    let mut unsure = false;
    loop {
        let attempt = async {
            if unsure && let Some(seq) = find(c, q, payload).await? {
                return Ok(Some(seq));
            }
            let (last, rev) = tail(c, q).await?;
            let seq = last + 1;
            let cmp = if rev == 0 {
                Compare::version(tail_key(q), CompareOp::Equal, 0)
            } else {
                Compare::mod_revision(tail_key(q), CompareOp::Equal, rev)
            };
            let txn = Txn::new().when([cmp]).and_then([
                TxnOp::put(tail_key(q), seq.to_be_bytes().to_vec(), None),
                TxnOp::put(msg_key(q, seq), payload.to_vec(), None),
            ]);
            let r = c.txn(txn).await?;
            Ok::<_, etcd_client::Error>(r.succeeded().then_some(seq))
        };
        match attempt.await {
            Ok(Some(seq)) => return seq,
            Ok(None) => unsure = false, // lost the race: nothing of ours was written
            Err(_) => {
                unsure = true;
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    }
}

/// Every stored message of `q` by sequence.
async fn stored(c: &mut Client, q: &str) -> BTreeMap<u64, Vec<u8>> {
    let prefix = format!("t/m/{q}/").into_bytes();
    let r = c.get(prefix.clone(), Some(GetOptions::new().with_prefix())).await.expect("range");
    r.kvs()
        .iter()
        .map(|kv| {
            (u64::from_be_bytes(kv.key()[prefix.len()..].try_into().expect("seq")), kv.value().to_vec())
        })
        .collect()
}

/// `producers` tasks append `each` messages to one queue; returns what each send resolved.
async fn race(cluster: &etcd::Cluster, q: &'static str, producers: u64, each: u64) -> Vec<(u64, Vec<u8>)> {
    let mut tasks = Vec::new();
    for p in 0..producers {
        let mut c = cluster.client().await;
        tasks.push(tokio::spawn(async move {
            let mut acked = Vec::new();
            for i in 0..each {
                let payload = format!("p{p}-{i}").into_bytes();
                let seq = append(&mut c, q, &payload).await;
                acked.push((seq, payload));
            }
            acked
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.expect("producer"));
    }
    all
}

/// Every acknowledged send is stored under the sequence it was given; sequences are dense
/// from 1 and unique; nothing else is stored.
fn check(acked: &[(u64, Vec<u8>)], stored: &BTreeMap<u64, Vec<u8>>, tail: u64) {
    assert_eq!(stored.len() as u64, tail, "one message per sequence up to the tail");
    assert_eq!(stored.keys().copied().collect::<Vec<_>>(), (1..=tail).collect::<Vec<_>>(), "no holes");
    for (seq, payload) in acked {
        assert_eq!(stored.get(seq), Some(payload), "acknowledged send {seq} is there");
    }
    let mut seqs: Vec<u64> = acked.iter().map(|(s, _)| *s).collect();
    seqs.sort_unstable();
    seqs.dedup();
    assert_eq!(seqs.len(), acked.len(), "no sequence given twice");
    assert_eq!(acked.len(), stored.len(), "nothing stored that no producer was told about");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_producers_get_dense_unique_sequences_on_one_member() {
    let cluster = etcd::Cluster::start(1).await;
    let acked = race(&cluster, "q", 4, 100).await;
    let mut c = cluster.client().await;
    let (last, _) = tail(&mut c, "q").await.unwrap();
    check(&acked, &stored(&mut c, "q").await, last);
    println!("etcd append by CAS, 1 member: {} sends, tail {last}", acked.len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn appends_survive_a_sigkilled_leader_on_three_members() {
    let mut cluster = etcd::Cluster::start(3).await;
    let load = {
        let endpoints = cluster.endpoints();
        tokio::spawn(async move {
            let c = etcd::Cluster::client_of(&endpoints).await;
            race_with(c, "q", 3, 150).await
        })
    };
    // Let the load run, then kill whoever leads.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let leader = cluster.wait_for_leader(Duration::from_secs(10)).await;
    cluster.members[leader].kill();
    let new_leader = cluster.wait_for_leader(Duration::from_secs(30)).await;
    assert_ne!(new_leader, leader);
    let acked = tokio::time::timeout(Duration::from_secs(120), load).await.expect("load finishes").unwrap();
    let mut c = cluster.client().await;
    let (last, _) = tail(&mut c, "q").await.unwrap();
    check(&acked, &stored(&mut c, "q").await, last);
    println!(
        "etcd append by CAS, 3 members, leader m{leader} SIGKILLed: {} sends, tail {last}, new leader m{new_leader}",
        acked.len()
    );
}

/// `race` over a given client (cloned per producer).
async fn race_with(c: Client, q: &'static str, producers: u64, each: u64) -> Vec<(u64, Vec<u8>)> {
    let mut tasks = Vec::new();
    for p in 0..producers {
        let mut c = c.clone();
        tasks.push(tokio::spawn(async move {
            let mut acked = Vec::new();
            for i in 0..each {
                let payload = format!("p{p}-{i}").into_bytes();
                acked.push((append(&mut c, q, &payload).await, payload));
            }
            acked
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.expect("producer"));
    }
    all
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_is_settled_only_by_the_holder_whose_revision_is_current() {
    let cluster = etcd::Cluster::start(1).await;
    let mut c = cluster.client().await;
    let claim = b"t/c/w/q/1".to_vec();
    // Holder A claims (the key did not exist): its token is the claim's mod_revision.
    let a = c
        .txn(Txn::new().when([Compare::version(claim.clone(), CompareOp::Equal, 0)]).and_then([TxnOp::put(
            claim.clone(),
            b"leased:A".to_vec(),
            None,
        )]))
        .await
        .unwrap();
    assert!(a.succeeded());
    let token_a = a.header().expect("header").revision();
    // A's lease expires; B claims again, fenced on the revision it saw.
    let b = c
        .txn(
            Txn::new()
                .when([Compare::mod_revision(claim.clone(), CompareOp::Equal, token_a)])
                .and_then([TxnOp::put(claim.clone(), b"leased:B".to_vec(), None)]),
        )
        .await
        .unwrap();
    assert!(b.succeeded());
    let token_b = b.header().expect("header").revision();
    // A tries to ack with its old token: refused, nothing changes.
    let late = c
        .txn(
            Txn::new()
                .when([Compare::mod_revision(claim.clone(), CompareOp::Equal, token_a)])
                .and_then([TxnOp::put(claim.clone(), b"done:A".to_vec(), None)]),
        )
        .await
        .unwrap();
    assert!(!late.succeeded(), "the old holder is fenced out");
    assert_eq!(c.get(claim.clone(), None).await.unwrap().kvs()[0].value(), b"leased:B");
    // B acks with its token.
    let ack = c
        .txn(
            Txn::new()
                .when([Compare::mod_revision(claim.clone(), CompareOp::Equal, token_b)])
                .and_then([TxnOp::put(claim.clone(), b"done:B".to_vec(), None)]),
        )
        .await
        .unwrap();
    assert!(ack.succeeded());
}
