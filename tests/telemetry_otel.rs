//! Feature `otel`: the W3C trace context travels in message headers, and consumers' spans join
//! (or link to) the producer's trace. Spans are recorded by OpenTelemetry's in-memory exporter
//! behind `tracing-opentelemetry`, set up as an application would (an `info` filter included).
#![cfg(feature = "otel")]

use std::sync::OnceLock;

use futures::StreamExt;
use opentelemetry::trace::{SpanId, SpanKind, TraceContextExt, TraceId, TracerProvider as _};
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SpanData};
use rockq::otel::{TRACEPARENT, TRACESTATE, TraceRelation};
use rockq::{CancellationToken, Message, Task};
use tracing::Instrument;
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::layer::SubscriberExt;

/// One exporter for the test binary: the subscriber is global (pools run on runtime threads),
/// so each test tells its spans apart by their trace ids.
fn exporter() -> &'static InMemorySpanExporter {
    &telemetry().0
}

fn telemetry() -> &'static (InMemorySpanExporter, SdkTracerProvider) {
    static TELEMETRY: OnceLock<(InMemorySpanExporter, SdkTracerProvider)> = OnceLock::new();
    TELEMETRY.get_or_init(|| {
        let exporter = InMemorySpanExporter::default();
        let provider = SdkTracerProvider::builder().with_simple_exporter(exporter.clone()).build();
        let tracer = provider.tracer("rockq-tests");
        let subscriber = tracing_subscriber::registry()
            .with(tracing_opentelemetry::layer().with_tracer(tracer))
            .with(tracing_subscriber::filter::LevelFilter::INFO);
        tracing::subscriber::set_global_default(subscriber).expect("one global subscriber");
        (exporter, provider)
    })
}

fn finished() -> Vec<SpanData> {
    exporter().get_finished_spans().expect("in-memory spans")
}

fn named<'a>(spans: &'a [SpanData], name: &str, trace: TraceId) -> Vec<&'a SpanData> {
    spans.iter().filter(|s| s.name == name && s.span_context.trace_id() == trace).collect()
}

fn attr(span: &SpanData, key: &str) -> Option<String> {
    span.attributes.iter().find(|kv| kv.key.as_str() == key).map(|kv| kv.value.to_string())
}

/// Runs a pool on `queue`'s group `group` until `n` jobs were handled, then stops it.
async fn drain<F, Fut>(queue: &rockq::Queue, group: &str, n: usize, relation: TraceRelation, handler: F)
where
    F: Fn(Task) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = Result<(), rockq::HandlerError>> + Send + 'static,
{
    let stop = CancellationToken::new();
    let (done, mut seen) = tokio::sync::mpsc::unbounded_channel();
    let handler = std::sync::Arc::new(handler);
    let pool = queue.work_group(group).unwrap().workers(2).trace(relation).shutdown_on(stop.clone()).run(
        move |task: Task| {
            let (handler, done) = (handler.clone(), done.clone());
            async move {
                let r = handler(task).await;
                let _ = done.send(());
                r
            }
        },
    );
    let stopper = async {
        for _ in 0..n {
            seen.recv().await.expect("the pool runs");
        }
        stop.cancel();
    };
    let (report, ()) = tokio::join!(pool, stopper);
    assert_eq!(report.unwrap().acked, n as u64);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_send_pool_send_pool_pipeline_is_one_trace() {
    exporter();
    let dir = tempfile::tempdir().unwrap();
    let broker = rockq::Broker::open(dir.path()).await.unwrap();
    let (orders, mails) = (broker.queue("orders").await.unwrap(), broker.queue("mails").await.unwrap());

    // The request that started it all: three orders, each sent within its own span.
    let mut requests = Vec::new();
    for i in 0..3u32 {
        let span = tracing::info_span!("checkout", order = i);
        let cx = span.context().span().span_context().clone();
        orders.send(format!("order {i}")).instrument(span).await.unwrap();
        requests.push(cx);
    }

    // Stage one: each order job sends a mail (inside its handler, so inside its job span).
    let to_mails = mails.clone();
    drain(&orders, "billing", 3, TraceRelation::Child, move |task| {
        let mails = to_mails.clone();
        async move {
            tracing::info_span!("charge").in_scope(|| {});
            mails.send(task.payload().clone()).await?;
            Ok(())
        }
    })
    .await;
    // Stage two: the mailer.
    drain(&mails, "mailer", 3, TraceRelation::Child, |_task| async move {
        tracing::info_span!("smtp").in_scope(|| {});
        Ok(())
    })
    .await;
    broker.shutdown().await.unwrap();

    let spans = finished();
    for request in &requests {
        let trace = request.trace_id();
        let jobs = named(&spans, "rockq.job", trace);
        assert_eq!(jobs.len(), 2, "one job span per stage in trace {trace}: {jobs:?}");
        let order =
            jobs.iter().find(|s| attr(s, "queue").as_deref() == Some("orders")).expect("the order job");
        let mail = jobs.iter().find(|s| attr(s, "queue").as_deref() == Some("mails")).expect("the mail job");
        // checkout → order job → mail job → smtp: every link a parent, across two queues.
        assert_eq!(order.parent_span_id, request.span_id());
        assert!(order.parent_span_is_remote, "the parent came from the message's headers");
        assert_eq!(mail.parent_span_id, order.span_context.span_id());
        let charge = named(&spans, "charge", trace);
        assert_eq!(charge.len(), 1);
        assert_eq!(charge[0].parent_span_id, order.span_context.span_id());
        let smtp = named(&spans, "smtp", trace);
        assert_eq!(smtp.len(), 1);
        assert_eq!(smtp[0].parent_span_id, mail.span_context.span_id());
        for job in [order, mail] {
            assert_eq!(job.span_kind, SpanKind::Consumer);
            assert_eq!(attr(job, "messaging.system").as_deref(), Some("rockq"));
            assert!(job.links.is_empty());
        }
        assert_eq!(attr(mail, "messaging.consumer.group.name").as_deref(), Some("mailer"));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn linked_consumers_start_their_own_trace_with_a_link_to_the_producer() {
    exporter();
    let dir = tempfile::tempdir().unwrap();
    let broker = rockq::Broker::open(dir.path()).await.unwrap();
    let reports = broker.queue("reports").await.unwrap();
    let span = tracing::info_span!("nightly");
    let producer = span.context().span().span_context().clone();
    reports.send_batch(["a", "b"]).instrument(span).await.unwrap();

    drain(&reports, "render", 2, TraceRelation::Link, |_task| async move { Ok(()) }).await;
    // `None`: the headers are ignored; a job span of its own, neither child nor linked.
    reports.send("c").instrument(tracing::info_span!("late")).await.unwrap();
    drain(&reports, "archive", 3, TraceRelation::None, |_task| async move { Ok(()) }).await;
    broker.shutdown().await.unwrap();

    let spans = finished();
    let job_spans = |group: &str| -> Vec<SpanData> {
        spans
            .iter()
            .filter(|s| s.name == "rockq.job" && attr(s, "group").as_deref() == Some(group))
            .filter(|s| attr(s, "queue").as_deref() == Some("reports"))
            .cloned()
            .collect()
    };
    let linked = job_spans("render");
    assert_eq!(linked.len(), 2);
    for job in &linked {
        assert_ne!(job.span_context.trace_id(), producer.trace_id(), "a trace of its own");
        assert_eq!(job.parent_span_id, SpanId::INVALID, "a root span");
        assert_eq!(job.links.len(), 1);
        assert_eq!(job.links[0].span_context.trace_id(), producer.trace_id());
        assert_eq!(job.links[0].span_context.span_id(), producer.span_id());
    }
    let unrelated = job_spans("archive");
    assert_eq!(unrelated.len(), 3);
    for job in &unrelated {
        assert_ne!(job.span_context.trace_id(), producer.trace_id());
        assert_eq!(job.parent_span_id, SpanId::INVALID);
        assert!(job.links.is_empty());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_send_path_carries_the_context_and_ordered_consumers_can_follow_it() {
    exporter();
    let dir = tempfile::tempdir().unwrap();
    let broker = rockq::Broker::open(dir.path()).await.unwrap();
    let q = broker.queue("events").await.unwrap();
    let span = tracing::info_span!("produce");
    let producer = span.context().span().span_context().clone();
    async {
        q.send("send").await.unwrap();
        q.enqueue("enqueue").await.unwrap().await.unwrap();
        q.send_batch(["batch-1", "batch-2"]).await.unwrap();
        q.submit(Message::new("submit").idempotency_key("k1")).await.unwrap();
        q.typed::<u32>().send(&7).await.unwrap();
        let mut tx = broker.transaction();
        tx.send(&q, "transaction").unwrap();
        tx.commit().await.unwrap();
        // A message that carries its own context keeps it, untouched and not doubled (header names
        // are case-insensitive).
        q.send(
            Message::new("forwarded")
                .header("TraceParent", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"),
        )
        .await
        .unwrap();
    }
    .instrument(span)
    .await;
    // OpenTelemetry's own API, no `tracing` span: its current context is sent.
    let native = {
        use opentelemetry::trace::Tracer;
        let span = telemetry().1.tracer("native").start("native-producer");
        let cx = opentelemetry::Context::current_with_span(span);
        let native = cx.span().span_context().clone();
        let _attached = cx.attach();
        // Sent in the attached context (the future is polled here, on this thread).
        q.send("native").await.unwrap();
        native
    };
    // Outside every span: no header.
    q.send("untraced").await.unwrap();

    let mut sub = q.group("audit").unwrap().subscribe().await.unwrap();
    let want = format!("00-{}-{}-01", producer.trace_id(), producer.span_id());
    for _ in 0..7 {
        let d = sub.next().await.unwrap().unwrap();
        let parents: Vec<_> = d.headers().iter().filter(|(k, _)| k == TRACEPARENT).collect();
        assert_eq!(parents.len(), 1, "{:?}", d.payload());
        assert_eq!(&parents[0].1[..], want.as_bytes(), "{:?}", d.payload());
        assert!(d.header(TRACESTATE).is_none(), "an empty trace state is not written");
        assert_eq!(d.trace_context().unwrap().span_id(), producer.span_id());
        // An ordered consumer's own span, a child of the producer's.
        let span = tracing::info_span!("audit", seq = d.seq());
        assert!(d.follow_trace(&span, TraceRelation::Child));
        async {}.instrument(span).await;
        d.ack().unwrap();
    }
    let forwarded = sub.next().await.unwrap().unwrap();
    assert_eq!(forwarded.payload(), "forwarded");
    assert_eq!(forwarded.headers().len(), 1);
    assert_eq!(forwarded.trace_context().unwrap().trace_id().to_string(), "0af7651916cd43dd8448eb211c80319c");
    forwarded.ack().unwrap();
    let from_native = sub.next().await.unwrap().unwrap();
    assert_eq!(from_native.payload(), "native");
    assert_eq!(from_native.trace_context().unwrap().span_id(), native.span_id());
    from_native.ack().unwrap();
    let untraced = sub.next().await.unwrap().unwrap();
    assert!(untraced.headers().is_empty());
    assert!(untraced.trace_context().is_none());
    // Read inside a span of the consumer's own: still none (not the consumer's own span).
    tracing::info_span!("reader").in_scope(|| {
        assert!(untraced.trace_context().is_none());
        assert!(!untraced.follow_trace(&tracing::info_span!("inner"), TraceRelation::Link));
    });
    let span = tracing::info_span!("audit-untraced");
    assert!(!untraced.follow_trace(&span, TraceRelation::Child), "nothing to follow");
    untraced.ack().unwrap();
    drop(sub);
    broker.shutdown().await.unwrap();

    let spans = finished();
    let audits = named(&spans, "audit", producer.trace_id());
    assert_eq!(audits.len(), 7);
    assert!(audits.iter().all(|s| s.parent_span_id == producer.span_id()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_trace_headers_count_toward_the_size_limit_and_bad_ones_are_ignored() {
    exporter();
    let dir = tempfile::tempdir().unwrap();
    let broker = rockq::Options::new().max_message_bytes(100).open(dir.path()).await.unwrap();
    let q = broker.queue("small").await.unwrap();
    // 100 bytes fit outside a span, not with the ~70 bytes of trace context added inside one.
    q.send(vec![0u8; 100]).await.unwrap();
    let err = q.send(vec![0u8; 100]).instrument(tracing::info_span!("big")).await.unwrap_err();
    assert!(matches!(err, rockq::Error::MessageTooLarge { .. }), "{err:?}");
    assert_eq!(broker.stats().await.unwrap().queues[0].len, 1, "nothing written");

    // A malformed or non-UTF-8 traceparent is no context, and following it does nothing.
    for bad in [
        &b"01-zz-00-01"[..],
        &b"00-00000000000000000000000000000000-b7ad6b7169203331-01"[..],
        &[0xff, 0xfe][..],
    ] {
        q.send(Message::new("x").header(TRACEPARENT, rockq::Bytes::copy_from_slice(bad))).await.unwrap();
    }
    let mut sub = q.group("g").unwrap().subscribe().await.unwrap();
    sub.next().await.unwrap().unwrap().ack().unwrap();
    for _ in 0..3 {
        let d = sub.next().await.unwrap().unwrap();
        assert!(d.trace_context().is_none());
        let span = tracing::info_span!("bad");
        assert!(!d.follow_trace(&span, TraceRelation::Child));
        assert!(!d.follow_trace(&span, TraceRelation::Link));
        d.ack().unwrap();
    }
    drop(sub);
    broker.shutdown().await.unwrap();
}
