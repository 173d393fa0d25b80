#!/usr/bin/env bash
# Checks that the README's two commands share one build of RocksDB (issue 34): the demo's build
# (scripts/demo.sh), the test command's builds (scripts/test.sh: all targets, then the
# failpoints build) and the lint build run librocksdb-sys's build script into one directory.
# A second directory means a second 15-25 minute compile of RocksDB's C++ on a fresh machine.
# Run after both commands (cheap then: every build is fresh). Called by .ci/run.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/bootstrap.sh >/dev/null 2>&1

# The out_dir of librocksdb-sys's build script in the build `cargo "$@"` makes.
out_dir() {
  local dir
  dir=$(cargo "$@" --message-format=json 2>/dev/null \
    | grep '"reason":"build-script-executed"' \
    | grep '#librocksdb-sys@' \
    | sed -n 's/.*"out_dir":"\([^"]*\)".*/\1/p' \
    | head -n1)
  if [ -z "$dir" ]; then
    echo "check-one-rocksdb: no librocksdb-sys build in: cargo $*" >&2
    exit 1
  fi
  echo "$dir"
}

demo=$(out_dir build --example quickstart --features "$ROCKQ_FEATURES")
tests=$(out_dir test --no-run --all-targets --features "$ROCKQ_FEATURES")
faults=$(out_dir test --no-run --features failpoints,etcd --test crash_failpoints --test etcd_faults)
echo "check-one-rocksdb: demo   $demo"
echo "check-one-rocksdb: tests  $tests"
echo "check-one-rocksdb: faults $faults"
if [ "$demo" != "$tests" ] || [ "$tests" != "$faults" ]; then
  echo "check-one-rocksdb: FAILED: the builds compile librocksdb-sys more than once" >&2
  exit 1
fi
echo "check-one-rocksdb: one build of librocksdb-sys"
