#!/usr/bin/env bash
# Runs the quickstart demo on a fresh machine (installs the build's system dependencies first).
# The first build compiles RocksDB from source: 15-25 minutes on two cores, cached afterwards.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/bootstrap.sh
# With the test command's features, so the two commands share one build of RocksDB.
cargo run --example quickstart --features "$ROCKQ_FEATURES"
