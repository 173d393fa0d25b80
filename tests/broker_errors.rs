//! Errors a user can act on: whether to retry, shutdown, and the application's own I/O errors
//! through `?`. (The ack-contract tests of the former `api_contract.rs`, issue 17, are in
//! `ordered_offsets.rs` and `work_groups.rs`.)

mod common;

use common::*;

#[tokio::test]
async fn errors_say_whether_to_retry_and_io_errors_convert() {
    fn read_config() -> Result<Vec<u8>, rockq::Error> {
        Ok(std::fs::read("/nonexistent/rockq.toml")?)
    }
    assert!(matches!(read_config(), Err(rockq::Error::Io { path: None, .. })));

    let dir = tempdir();
    let broker = open(dir.path()).await;
    let q = broker.queue("q").await.unwrap();
    let _sub = q.group("g").unwrap().subscribe().await.unwrap();
    let busy = q.group("g").unwrap().subscribe().await.unwrap_err();
    assert!(busy.is_retryable() && !busy.is_shutdown(), "{busy:?}");
    let bad = broker.queue("no spaces").await.unwrap_err();
    assert!(!bad.is_retryable() && !bad.is_shutdown());
    broker.shutdown().await.unwrap();
    let late = q.send("x").await.unwrap_err();
    assert!(late.is_shutdown() && !late.is_retryable(), "{late:?}");
}
