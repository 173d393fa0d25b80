#!/usr/bin/env bash
# Runs rockq's whole test suite on a fresh machine: installs the build's system dependencies,
# then unit, integration, example, bench-harness and doc tests against real RocksDB databases,
# and the fault-injection tests (built with the `failpoints` feature).
set -euo pipefail
cd "$(dirname "$0")/.."
ROCKQ_NEED_ETCD=1 ROCKQ_NEED_BROWSER=1 source scripts/bootstrap.sh
# Every optional feature but the failpoints: the CLI, the postcard codec, tower handlers, the
# web console, the etcd engine (its tests start their own etcd: one member, three members,
# two rockq processes). The console's browser tests (tests/web_browser.rs) skip themselves in
# this run; scripts/browser-tests.sh runs them below with chromedriver started.
features="$ROCKQ_FEATURES"
cargo test --all-targets --features "$features" "$@"
cargo test --doc --features "$features" "$@"
cargo test --features failpoints,etcd --test crash_failpoints --test etcd_faults "$@"
# The ordered-group semantics suites again, unchanged, against a real single-member etcd.
ROCKQ_FEATURES="$features" ./scripts/etcd-semantics.sh "$@"
# The web console in headless Chromium (installed above), screenshots under $CARGO_TARGET_DIR.
./scripts/browser-tests.sh
