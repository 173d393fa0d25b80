#!/usr/bin/env bash
# Runs a benchmark the way docs/performance.md's figures were taken:
#
#   ./scripts/bench.sh user_style            # or throughput, scale, jobs, tombstones, etcd
#   ROCKQ_BENCH_ONLY=pool ./scripts/bench.sh user_style
#
# RocksDB checksums every WAL record and block with CRC32C. librocksdb-sys compiles the
# hardware version (SSE4.2 with PCLMULQDQ) only when the Rust target features include them;
# the default, portable build uses the table-driven software CRC, 6–9 % of the write path's
# CPU in profiles. The benches are built with those features (any x86-64 CPU of the last
# decade has them) in a target directory of their own, so the portable build the tests and
# the demo use is left alone. The first run compiles RocksDB once more (15–25 minutes on two
# cores). ROCKQ_PORTABLE_CRC=1 benches the portable build instead.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/bootstrap.sh
bench="${1:?usage: scripts/bench.sh BENCH [args passed to the bench]}"
shift
features="cli,postcard,tower,web,etcd,otel"
if [ -z "${ROCKQ_PORTABLE_CRC:-}" ] && [ "$(uname -m)" = "x86_64" ]; then
  if ! grep -qw sse4_2 /proc/cpuinfo || ! grep -qw pclmulqdq /proc/cpuinfo; then
    echo "bench: this CPU lacks SSE4.2 or PCLMULQDQ; set ROCKQ_PORTABLE_CRC=1" >&2
    exit 1
  fi
  export RUSTFLAGS="${RUSTFLAGS:-} -C target-feature=+sse4.2,+pclmulqdq"
  export CARGO_TARGET_DIR="${CARGO_TARGET_DIR}-crc32c"
  echo "bench: hardware CRC32C build in $CARGO_TARGET_DIR" >&2
else
  echo "bench: portable build (software CRC32C) in $CARGO_TARGET_DIR" >&2
fi
cargo bench --bench "$bench" --features "$features" -- "$@"
