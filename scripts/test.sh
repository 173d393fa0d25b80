#!/usr/bin/env bash
# Runs rockq's whole test suite on a fresh machine: installs the build's system dependencies,
# then unit, integration, example, bench-harness and doc tests against real RocksDB databases.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/bootstrap.sh
cargo test --all-targets "$@"
cargo test --doc "$@"
