//! Trace context through messages (feature `otel`): W3C `traceparent`/`tracestate` headers.
//!
//! With the feature on, every send ([`Queue::send`](crate::Queue::send), `enqueue`,
//! `send_batch`, `submit`, transactions, typed sends) writes the OpenTelemetry context that is
//! current where the call's future is first polled (for `.await`ed calls: at the call) into
//! the message's [`TRACEPARENT`] and [`TRACESTATE`] headers, in the
//! [W3C Trace Context](https://www.w3.org/TR/trace-context/) format every broker
//! instrumentation uses (Kafka, NATS, RabbitMQ, SQS). The current context is the one of the
//! current `tracing` span, as `tracing-opentelemetry` maps it, or else OpenTelemetry's own
//! [`Context::current`](opentelemetry::Context::current): set up tracing and OpenTelemetry as
//! usual, nothing in rockq needs configuring. A message that already carries a `traceparent`
//! header keeps it (a forwarded message keeps its producer's trace), and without a current
//! context (no span, no OpenTelemetry layer) nothing is added. A delayed message carries the
//! context of the call that submitted it; the firings of a recurring schedule
//! ([`Broker::schedule`](crate::Broker::schedule)) carry none, as a schedule outlives the
//! request that created it.
//!
//! On the consuming side, worker pools run each handler in a `rockq.job` span that is a child
//! of the producer's span, or a new trace linked to it ([`TraceRelation`],
//! [`Workers::trace`](crate::Workers::trace)), so that a send → pool → send → pool pipeline is
//! one connected trace. Ordered subscribers attach their own span with
//! [`Delivery::follow_trace`](crate::Delivery::follow_trace).
//!
//! With the feature on, the pool's `rockq.job` span is at `INFO` (at `DEBUG` without it), so
//! that an exporter behind an `info` filter records it: a span the filter disables cannot be
//! the parent of the handler's own spans.
//!
//! **Versions.** The context is read through `opentelemetry` 0.33 and `tracing-opentelemetry`
//! 0.34, re-exported as [`rockq::otel::opentelemetry`](opentelemetry): an application must
//! use versions semver-compatible with them. With other versions the two sides do not see
//! each other's context, and nothing is propagated (nothing fails either). Moving rockq to a
//! newer OpenTelemetry release is a breaking change of the `otel` feature.
//!
//! The two headers count toward [`Options::max_message_bytes`](crate::Options::max_message_bytes)
//! (about 60 bytes, more with a `tracestate`).
//!
//! # Examples
//!
//! ```no_run
//! # async fn demo(queue: rockq::Queue) -> Result<(), rockq::Error> {
//! use tracing::Instrument;
//! // Within a span (that an OpenTelemetry layer exports), a send carries its context.
//! let checkout = tracing::info_span!("checkout", order = 42);
//! queue.send("order 42").instrument(checkout).await?;
//!
//! // A pool's handlers run in spans that are children of the producers' spans.
//! queue
//!     .work_group("mailer")?
//!     .workers(8)
//!     .trace(rockq::otel::TraceRelation::Child)
//!     .run(|task: rockq::Task| async move {
//!         tracing::info!(seq = task.seq(), "sending"); // recorded in the producer's trace
//!         Ok(())
//!     })
//!     .await?;
//! # Ok(()) }
//! ```

pub use opentelemetry;

use bytes::Bytes;
use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
use opentelemetry::trace::{SpanContext, TraceContextExt};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use tracing_opentelemetry::OpenTelemetrySpanExt;

/// The header that carries the producer's trace and span id and its sampling flag
/// (`00-<trace id>-<span id>-<flags>`).
pub const TRACEPARENT: &str = "traceparent";

/// The header that carries the producer's vendor-specific trace state, when it has one.
pub const TRACESTATE: &str = "tracestate";

/// How a consumer's span relates to the span that sent the message.
///
/// A message moved to a dead-letter queue, and redriven from there, keeps its producer's
/// headers: its next handler joins (or links to) the original trace, however old.
///
/// # Examples
///
/// ```
/// assert_eq!(rockq::otel::TraceRelation::default(), rockq::otel::TraceRelation::Child);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TraceRelation {
    /// The consumer's span is a child of the producer's: one trace from the request that sent
    /// the message to the work it caused. Best when a message is handled once, soon after it
    /// is sent.
    #[default]
    Child,
    /// The consumer's span gets a link to the producer's span, and stays in its own trace (a
    /// pool's `rockq.job` span, which has no parent, starts a new one): traces stay
    /// short when messages are consumed long after, or by many groups (the OpenTelemetry
    /// messaging conventions' choice for batch and fan-out consumers).
    Link,
    /// The consumer's span is not related to the producer's (the headers are left alone).
    None,
}

/// The current OpenTelemetry context as the headers a send writes: read once per send call
/// (a batch's messages share it), then written into each message without a `traceparent`.
#[derive(Debug, Default)]
pub(crate) struct Outgoing(Vec<(String, Bytes)>);

impl Outgoing {
    /// The context current here: the `tracing` span's (built on first use), else
    /// OpenTelemetry's own current one (an `opentelemetry` span in scope, or a `tracing` span
    /// the layer activated). Both are cheap to ask when there is none: a disabled span answers
    /// at once, and the current context is a thread-local read.
    pub(crate) fn current() -> Self {
        let mut cx = tracing::Span::current().context();
        if !cx.span().span_context().is_valid() {
            if !opentelemetry::Context::map_current(|cx| cx.span().span_context().is_valid()) {
                return Outgoing::default();
            }
            cx = opentelemetry::Context::current();
        }
        let mut headers = Vec::with_capacity(2);
        TraceContextPropagator::new().inject_context(&cx, &mut Headers(&mut headers));
        Outgoing(headers)
    }

    /// Adds the context to a message's `headers` (before it is checked), unless there is none
    /// or the message carries its own `traceparent`.
    pub(crate) fn apply(&self, headers: &mut Vec<(String, Bytes)>) {
        if self.0.is_empty() || headers.iter().any(|(k, _)| k.eq_ignore_ascii_case(TRACEPARENT)) {
            return;
        }
        headers.extend(self.0.iter().cloned());
    }
}

/// The producer's span context in `headers`, if they carry a valid `traceparent`.
pub(crate) fn producer(headers: &[(String, Bytes)]) -> Option<SpanContext> {
    // From an empty context: `extract` starts from the current one, and would hand back the
    // caller's own span for a message without a (valid) header.
    let cx = TraceContextPropagator::new()
        .extract_with_context(&opentelemetry::Context::new(), &ReadHeaders(headers));
    let span = cx.span().span_context().clone();
    span.is_valid().then_some(span)
}

/// Makes `span` a child of, or links it to, the producer's span in `headers`. `span` must not
/// have started (been entered, or its context read) for [`TraceRelation::Child`]: its parent
/// is fixed when it starts. Returns whether the headers carried a context that was applied
/// (see `follow_trace`).
pub(crate) fn follow(span: &tracing::Span, headers: &[(String, Bytes)], relation: TraceRelation) -> bool {
    // A span no subscriber records (filtered out, or none installed) costs no header parse.
    if relation == TraceRelation::None || span.is_disabled() {
        return false;
    }
    let Some(producer) = producer(headers) else { return false };
    match relation {
        TraceRelation::Child => {
            span.set_parent(opentelemetry::Context::new().with_remote_span_context(producer)).is_ok()
        }
        TraceRelation::Link => {
            span.add_link(producer);
            true
        }
        TraceRelation::None => false,
    }
}

/// A message's headers as a propagator writes them.
struct Headers<'a>(&'a mut Vec<(String, Bytes)>);

impl Injector for Headers<'_> {
    fn set(&mut self, key: &str, value: String) {
        // The propagator writes an empty `tracestate` for a context without one: 14 bytes on
        // every message for nothing (W3C: an empty list is the same as no header).
        if value.is_empty() {
            return;
        }
        self.0.push((key.to_owned(), Bytes::from(value)));
    }
}

/// A message's headers as a propagator reads them (non-UTF-8 values read as absent).
struct ReadHeaders<'a>(&'a [(String, Bytes)]);

impl Extractor for ReadHeaders<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        // W3C header names are case-insensitive.
        let (_, v) = self.0.iter().find(|(k, _)| k.eq_ignore_ascii_case(key))?;
        std::str::from_utf8(v).ok()
    }

    fn keys(&self) -> Vec<&str> {
        self.0.iter().map(|(k, _)| k.as_str()).collect()
    }
}
