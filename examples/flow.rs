//! A flow: three images are resized by one pool, and an album is built by another once all
//! three succeeded — sent by the writer in the write that acks the last resize — reading the
//! resized names its dependencies returned. A `finally` step reports either way.
//!
//! `cargo run --example flow`

use std::time::Duration;

use rockq::{Broker, StepState, Task};

#[tokio::main]
async fn main() -> Result<(), rockq::Error> {
    let dir = tempfile::tempdir()?;
    let broker = Broker::open(dir.path()).await?;
    let lease = Duration::from_secs(30);
    let resize = broker.queue("images").await?.work_group("resize")?.lease(lease);
    let albums = broker.queue("albums").await?.work_group("build")?.lease(lease);

    let mut flow = broker.flow();
    let mut images = Vec::new();
    for name in ["beach.jpg", "dunes.jpg", "sunset.jpg"] {
        images.push(flow.job(&resize, name)?);
    }
    flow.then(&albums, "album: holidays", &images)?;
    flow.finally(&albums, "report: holidays", &images)?;
    let submitted = flow.submit().await?;
    println!("flow {} submitted; sent at once: {:?}", submitted.id, submitted.sent);

    let resizers = resize.workers(2).spawn(|task: Task| async move {
        let name = String::from_utf8_lossy(task.payload()).into_owned();
        task.set_result(format!("small-{name}"))?;
        Ok(())
    });
    let (done_tx, mut done_rx) = tokio::sync::mpsc::unbounded_channel();
    let builders = albums.workers(1).spawn(move |task: Task| {
        let done = done_tx.clone();
        async move {
            let what = String::from_utf8_lossy(task.payload()).into_owned();
            let mut parts = Vec::new();
            for dep in task.flow_dependencies().await? {
                match dep.state {
                    StepState::Succeeded { result: Some(r), .. } => {
                        parts.push(String::from_utf8_lossy(&r).into_owned())
                    }
                    other => parts.push(format!("step {} {other:?}", dep.step)),
                }
            }
            println!("{what}: {}", parts.join(", "));
            let _ = done.send(());
            Ok(())
        }
    });
    for _ in 0..2 {
        done_rx.recv().await;
    }
    builders.shutdown().await?;
    resizers.shutdown().await?;
    println!("flow {}: {:?}", submitted.id, broker.flow_status(submitted.id).await?.state);
    broker.shutdown().await?;
    Ok(())
}
