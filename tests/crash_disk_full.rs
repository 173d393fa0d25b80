//! Disk full: a child process limited with RLIMIT_FSIZE (SIGXFSZ ignored, so writes past the
//! limit fail with EFBIG like a full disk) sends until the WAL cannot grow. The failing send
//! gets a storage error, later ones a clear "fail closed" error, never a panic; after a reopen
//! without the limit every send that resolved Ok is present and writing works again.
#![cfg(target_os = "linux")]

mod common;

use std::io::BufRead;

use common::*;
use rockq::{Durability, Error, Options};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "helper: run by a test in a child process"]
async fn helper_fill_the_disk() {
    let Ok(path) = std::env::var("ROCKQ_DISKFULL_PATH") else { return };
    let broker = Options::new().durability(Durability::Fsync).open(&path).await.unwrap();
    let q = broker.queue("q").await.unwrap();
    // SAFETY: plain libc calls on this process: ignore SIGXFSZ and cap file sizes at 4 MiB.
    unsafe {
        libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
        let lim = libc::rlimit { rlim_cur: 4 << 20, rlim_max: 4 << 20 };
        assert_eq!(libc::setrlimit(libc::RLIMIT_FSIZE, &lim), 0);
    }
    let payload = vec![1u8; 64 * 1024];
    let mut first_error = None;
    for _ in 0..1000 {
        match q.send(payload.clone()).await {
            Ok(seq) => println!("OK {seq}"),
            Err(e) => {
                println!("ERR {}", if matches!(e, Error::Storage(_)) { "storage" } else { "other" });
                first_error = Some(e);
                break;
            }
        }
    }
    assert!(first_error.is_some(), "the limit was never hit");
    match q.send("more").await {
        Err(Error::Failed(_)) => println!("CLOSED"),
        other => println!("UNEXPECTED {other:?}"),
    }
    let _ = broker.shutdown().await;
    println!("EXITING");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_is_a_typed_error_and_loses_nothing_acknowledged() {
    let dir = tempdir();
    let path = dir.path().to_str().unwrap().to_owned();
    let mut child = spawn_helper("helper_fill_the_disk", &[("ROCKQ_DISKFULL_PATH", &path)]);
    let stdout = child.stdout.take().unwrap();
    let mut ok = Vec::new();
    let (mut err, mut closed, mut exited) = (None, false, false);
    for line in std::io::BufReader::new(stdout).lines() {
        let line = line.unwrap();
        if let Some(i) = line.find("OK ") {
            ok.push(line[i + 3..].trim().parse::<u64>().unwrap());
        } else if let Some(i) = line.find("ERR ") {
            err = Some(line[i + 4..].trim().to_owned());
        } else if line.contains("CLOSED") {
            closed = true;
        } else if line.contains("EXITING") {
            exited = true;
        }
    }
    let status = child.wait().unwrap();
    assert!(status.success(), "the child must not crash: {status:?}");
    assert_eq!(err.as_deref(), Some("storage"), "the failing send reports a storage error");
    assert!(closed && exited, "later sends fail closed and the child exits cleanly");
    assert!(!ok.is_empty());

    let broker = open_with(dir.path(), Durability::Fsync).await;
    let q = broker.queue("q").await.unwrap();
    let last_ok = *ok.last().unwrap();
    assert!(q.last_seq() >= last_ok, "acknowledged sends lost: last {} < {last_ok}", q.last_seq());
    let mut sub = q.group("g").unwrap().read_batch(64).subscribe().await.unwrap();
    for seq in 1..=last_ok {
        let d = next(&mut sub).await;
        assert_eq!((d.seq(), d.payload().len()), (seq, 64 * 1024));
        d.ack().unwrap();
    }
    q.send("after").await.unwrap();
    broker.shutdown().await.unwrap();
}
