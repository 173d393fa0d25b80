//! Property: with `UntilAcked`, a trim never deletes a message some group has not finished —
//! not an unacknowledged delivery of an ordered group, not a message a work-queue group has
//! claimed — and it deletes everything every group has finished. Random group progress, a real
//! database per case.

mod common;

use common::*;
use proptest::prelude::*;

#[derive(Debug, Clone)]
enum Op {
    Send(u8),
    /// Ordered group `g` receives up to `n` more deliveries and holds them.
    Receive {
        g: usize,
        n: u8,
    },
    /// Ordered group `g` acks held delivery `i` (modulo how many it holds).
    Ack {
        g: usize,
        i: usize,
    },
    /// The work group claims up to `n` jobs and holds them.
    Claim(u8),
    /// The work group acks (or drops) held job `i`.
    Settle {
        i: usize,
        ack: bool,
    },
    Trim,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (1u8..12).prop_map(Op::Send),
        (0usize..2, 1u8..6).prop_map(|(g, n)| Op::Receive { g, n }),
        (0usize..2, 0usize..16).prop_map(|(g, i)| Op::Ack { g, i }),
        (1u8..6).prop_map(Op::Claim),
        (0usize..16, any::<bool>()).prop_map(|(i, ack)| Op::Settle { i, ack }),
        Just(Op::Trim),
    ]
}

async fn run(ops: Vec<Op>) {
    let dir = tempdir();
    let broker = open(dir.path()).await;
    let q = broker.queue("q").await.unwrap();
    let groups = [q.group("g0").unwrap(), q.group("g1").unwrap()];
    let mut subs = [groups[0].subscribe().await.unwrap(), groups[1].subscribe().await.unwrap()];
    let work = q.work_group("w").unwrap().read_batch(1);
    let mut jobs_sub = work.subscribe().await.unwrap();
    let mut sent = 0u64;
    let mut received = [0u64; 2];
    let mut held: [Vec<rockq::Delivery>; 2] = [Vec::new(), Vec::new()];
    let mut jobs: Vec<rockq::Job> = Vec::new();
    let mut claimable = 0u64; // messages the work group can still claim (new or released)

    for op in ops {
        match op {
            Op::Send(n) => {
                q.send_batch((0..n).map(|i| vec![i])).await.unwrap();
                sent += u64::from(n);
                claimable += u64::from(n);
            }
            Op::Receive { g, n } => {
                let n = u64::from(n).min(sent - received[g]);
                for _ in 0..n {
                    held[g].push(next(&mut subs[g]).await);
                }
                received[g] += n;
            }
            Op::Ack { g, i } => {
                if !held[g].is_empty() {
                    let i = i % held[g].len();
                    held[g].swap_remove(i).ack().unwrap();
                }
            }
            Op::Claim(n) => {
                let n = u64::from(n).min(claimable);
                for _ in 0..n {
                    jobs.push(next_job(&mut jobs_sub).await);
                }
                claimable -= n;
            }
            Op::Settle { i, ack } => {
                if !jobs.is_empty() {
                    let job = jobs.swap_remove(i % jobs.len());
                    if ack {
                        job.ack_durable().await.unwrap();
                    } else {
                        drop(job); // released: claimable again
                        claimable += 1;
                    }
                }
            }
            Op::Trim => {
                for s in &subs {
                    s.commit().await.unwrap();
                }
                broker.trim().await.unwrap();
                let first = q.first_seq();
                for (g, h) in held.iter().enumerate() {
                    for d in h {
                        assert!(
                            d.seq() >= first,
                            "group {g}: unacked delivery {} deleted (first {first})",
                            d.seq()
                        );
                    }
                }
                for j in &jobs {
                    assert!(j.seq() >= first, "claimed job {} deleted (first {first})", j.seq());
                }
                let offsets = [groups[0].committed(), groups[1].committed(), work.committed()];
                let min = offsets.iter().map(|o| o.unwrap()).min().unwrap();
                assert_eq!(first, min + 1, "trim must stop exactly at the slowest group: {offsets:?}");
            }
        }
    }
    drop((held, jobs));
    broker.shutdown().await.unwrap();
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn until_acked_trims_exactly_what_every_group_finished(ops in proptest::collection::vec(op(), 1..40)) {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        rt.block_on(run(ops));
    }
}
