//! Tests of what the broker's handles measure and expose to the layers above them.

/// A worker pool sizes its prefetch by how long claims take (`pool/adapt.rs`): each claim
/// is measured, request to answer.
#[tokio::test]
async fn every_claim_is_timed_for_the_pools_prefetch() {
    use futures::StreamExt;
    let dir = tempfile::tempdir().expect("temp dir");
    let broker = super::Broker::open(dir.path()).await.expect("open");
    let q = broker.queue("q").await.expect("queue");
    q.send_batch(["a", "b"]).await.expect("send");
    let mut jobs = q.work_group("w").expect("group").read_batch(1).subscribe().await.expect("subscribe");
    assert_eq!(jobs.claim_latency(), std::time::Duration::ZERO, "nothing claimed yet");
    let job = jobs.next().await.expect("a job").expect("no error");
    let first = jobs.claim_latency();
    assert!(first > std::time::Duration::ZERO, "the claim was timed");
    job.ack().expect("ack");
    drop(jobs.next().await.expect("a job").expect("no error"));
    assert_ne!(jobs.claim_latency(), std::time::Duration::ZERO);
    broker.shutdown().await.expect("shutdown");
}
