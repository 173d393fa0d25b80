//! Exactly-once processing under `kill -9`: a pipeline `orders → (balance in a keyspace, an
//! invoice sent) → invoices → (a ledger entry per invoice)`, every step a transaction, run in
//! a child process that is SIGKILLed at random moments, hundreds of times, in Fsync mode. At
//! the end every order is counted in the balances exactly once, and every invoice exists and
//! is recorded exactly once: no duplicate, no loss.

mod common;

use std::time::Duration;

use common::*;
use futures::StreamExt;
use rockq::{Durability, Expect, Message, Options, Retention, RetryPolicy};

const ACCOUNTS: u64 = 10;

fn amount(order: u64) -> u64 {
    order % 13 + 1
}

fn num(e: Option<rockq::Entry>) -> u64 {
    e.map_or(0, |e| String::from_utf8_lossy(&e.value).parse().expect("a number"))
}

async fn open_fsync(path: &str) -> rockq::Broker {
    Options::new()
        .durability(Durability::Fsync)
        .retention_interval(Duration::ZERO)
        .metrics_interval(Duration::ZERO)
        .open(path)
        .await
        .expect("open")
}

/// Child: produces orders (each with its counter, in one transaction), bills them with a worker
/// pool (balance + invoice + ack in one transaction) and records invoices from an ordered group
/// (ledger entry + ack in one transaction), until killed — or, with `ROCKQ_EO_DRAIN`, without
/// producing, until everything is processed, then prints `DONE`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "helper: run by a test in a child process"]
async fn helper_pipeline() {
    let Ok(path) = std::env::var("ROCKQ_EO_PATH") else { return };
    let drain = std::env::var("ROCKQ_EO_DRAIN").is_ok();
    let broker = open_fsync(&path).await;
    let orders = broker.queue("orders").await.unwrap();
    let invoices = broker.queue("invoices").await.unwrap();
    // Invoices are kept, so the parent can count them.
    invoices.set_retention(Retention::Forever).await.unwrap();
    let meta = broker.kv("meta").await.unwrap();
    let balances = broker.kv("balances").await.unwrap();
    let ledger = broker.kv("ledger").await.unwrap();
    println!("READY");

    let producer = (!drain).then(|| {
        let (broker, orders, meta) = (broker.clone(), orders.clone(), meta.clone());
        tokio::spawn(async move {
            loop {
                let mut tx = broker.transaction();
                let n = num(tx.get_for_update(&meta, "next-order").await.unwrap());
                tx.put(&meta, "next-order", (n + 1).to_string()).unwrap();
                let account = n % ACCOUNTS;
                tx.send(&orders, Message::new(format!("{n}:{}", amount(n))).key(format!("acct-{account}")))
                    .unwrap();
                if tx.commit().await.is_err() {
                    return;
                }
            }
        })
    });

    let billing = orders.work_group("billing").unwrap().lease(Duration::from_secs(5)).retry_policy(
        RetryPolicy::default()
            .max_attempts(1_000_000)
            .backoff(Duration::from_millis(1), Duration::from_millis(4)),
    );
    let (inv, bal) = (invoices.clone(), balances.clone());
    let pool = billing.clone().workers(4).spawn(move |task: rockq::Task| {
        let (inv, bal) = (inv.clone(), bal.clone());
        async move {
            let text = String::from_utf8_lossy(task.payload()).into_owned();
            let (order, amt) = text.split_once(':').unwrap();
            let account = task.key().unwrap().to_owned();
            let tx = task.tx();
            let balance = num(tx.get_for_update(&bal, &account).await?);
            tx.put(&bal, &account, (balance + amt.parse::<u64>().unwrap()).to_string())?;
            tx.send(&inv, order.to_owned())?;
            Ok::<_, rockq::HandlerError>(())
        }
    });

    let (broker2, ledger2, invoices2) = (broker.clone(), ledger.clone(), invoices.clone());
    let recorder = tokio::spawn(async move {
        let mut sub = invoices2.group("ledger").unwrap().subscribe().await.unwrap();
        while let Some(d) = sub.next().await {
            let Ok(d) = d else { return };
            let order = String::from_utf8_lossy(d.payload()).into_owned();
            let mut tx = broker2.transaction();
            let seen = tx.get_for_update(&ledger2, &order).await.unwrap();
            tx.put_if(
                &ledger2,
                &order,
                (num(seen.clone()) + 1).to_string(),
                Expect::from_read(seen.as_ref()),
            )
            .unwrap();
            tx.ack(d);
            if tx.commit().await.is_err() {
                return;
            }
        }
    });

    if drain {
        let invoices_group = invoices.group("ledger").unwrap();
        loop {
            let produced = num(meta.get("next-order").await.unwrap());
            let billed = billing.committed() == Some(orders.last_seq());
            let recorded = invoices_group.committed() == Some(invoices.last_seq());
            if billed && recorded && invoices.last_seq() >= produced {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        println!("DONE");
        pool.shutdown().await.unwrap();
        recorder.abort();
        broker.shutdown().await.unwrap();
    } else {
        // Runs until SIGKILLed.
        if let Some(p) = producer {
            let _ = p.await;
        }
        std::future::pending::<()>().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkilled_pipeline_processes_every_order_exactly_once() {
    let cycles: u64 = std::env::var("ROCKQ_EO_CYCLES").ok().and_then(|c| c.parse().ok()).unwrap_or(200);
    let dir = tempdir();
    let path = dir.path().to_str().unwrap().to_owned();
    let mut rng = Rng::from_clock();
    // Kills 0–60 ms after the child is running (one in eight anywhere, opening included).
    let killed_before_ready =
        kill_cycles("helper_pipeline", &[("ROCKQ_EO_PATH", &path)], cycles, 60, &mut rng);

    // A last run drains everything (producing nothing new).
    run_to_done(
        "helper_pipeline",
        &[("ROCKQ_EO_PATH", &path), ("ROCKQ_EO_DRAIN", "1")],
        Duration::from_secs(120),
    );

    let broker = open_fsync(&path).await;
    let orders = num(broker.get_kv("meta").unwrap().get("next-order").await.unwrap());
    assert!(orders > 0, "the children produced something");
    assert_eq!(broker.get_queue("orders").unwrap().last_seq(), orders, "one message per produced order");

    // Balances: each order counted once.
    let balances = broker.get_kv("balances").unwrap();
    let mut expected = vec![0u64; ACCOUNTS as usize];
    for n in 0..orders {
        expected[(n % ACCOUNTS) as usize] += amount(n);
    }
    for (a, want) in expected.iter().enumerate() {
        let got = num(balances.get(format!("acct-{a}")).await.unwrap());
        assert_eq!(got, *want, "account {a}: balance counts every order once");
    }
    // Invoices: one message per order, and one ledger entry of count 1 each.
    let invoices = broker.peek("invoices", None, usize::MAX).await.unwrap();
    let mut per_order = vec![0u32; orders as usize];
    for m in &invoices {
        let n: usize = String::from_utf8_lossy(&m.payload).parse().unwrap();
        per_order[n] += 1;
    }
    let duplicates: u32 = per_order.iter().map(|&c| c.saturating_sub(1)).sum();
    let missing = per_order.iter().filter(|&&c| c == 0).count();
    let ledger = broker.get_kv("ledger").unwrap();
    let mut ledger_dups = 0;
    for n in 0..orders {
        let c = num(ledger.get(n.to_string()).await.unwrap());
        assert!(c >= 1, "invoice {n} recorded");
        ledger_dups += c - 1;
    }
    println!(
        "exactly-once: cycles {cycles} (killed before ready {killed_before_ready}), orders {orders}, \
         invoices {}, duplicates {duplicates}, missing {missing}, ledger duplicates {ledger_dups}",
        invoices.len()
    );
    assert_eq!((duplicates, missing, ledger_dups), (0, 0, 0));
    broker.shutdown().await.unwrap();
}
