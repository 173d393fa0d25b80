#!/usr/bin/env bash
# Runs rockq's cargo-fuzz targets (fuzz/fuzz_targets) on a stable toolchain. Manual only: CI
# does not call it.
#
#   scripts/fuzz.sh [TARGET|all] [SECONDS] [-- LIBFUZZER_ARGS...]
#   scripts/fuzz.sh cmin [TARGET|all]     # minimizes fuzz/corpus/<target>/ in place
#
# TARGET is envelope, records, keys or roundtrip (default all, one after the other); SECONDS
# is each target's run time (default 600). FUZZ_SANITIZER picks cargo fuzz's sanitizer
# (default address; `none` builds faster and runs more executions per second).
# New corpus entries go to fuzz/corpus/<target>/, crashes to fuzz/artifacts/<target>/.
set -euo pipefail
cd "$(dirname "$0")/.."

usage() {
  echo "usage: $0 [cmin] [envelope|records|keys|roundtrip|all] [SECONDS] [-- LIBFUZZER_ARGS...]" >&2
  exit 2
}
mode=run
if [ "${1:-}" = cmin ]; then
  mode=cmin
  shift
fi
targets=(envelope records keys roundtrip)
which=${1:-all}
seconds=${2:-600}
shift $(($# < 2 ? $# : 2))
[ "${1:-}" = "--" ] && shift
case "$which" in
  all) ;;
  envelope | records | keys | roundtrip) targets=("$which") ;;
  *) usage ;;
esac
[[ "$seconds" =~ ^[0-9]+$ ]] || usage
sanitizer=${FUZZ_SANITIZER:-address}

# libclang (bindgen) and a C++ toolchain; sets CARGO_TARGET_DIR to the per-machine cache.
source scripts/bootstrap.sh

if ! command -v cargo-fuzz >/dev/null 2>&1; then
  cargo install cargo-fuzz --locked
fi

# cargo fuzz passes nightly-only flags (-Zsanitizer, sancov passes). RUSTC_BOOTSTRAP lets a
# stable toolchain accept them, so no nightly needs to be installed.
export RUSTC_BOOTSTRAP=1

# RocksDB's C++ takes ~20 minutes to compile on two cores. If a build of the same
# librocksdb-sys version already left librocksdb.a in the cache (a test run does), link that
# instead. The version must match: the Rust bindings are generated from that crate's headers.
if [ -z "${ROCKSDB_LIB_DIR:-}" ]; then
  version=$(awk '/^name = "librocksdb-sys"$/ { getline; gsub(/"/, "", $3); print $3; exit }' fuzz/Cargo.lock)
  cache=${ROCKQ_CACHE_DIR:-$HOME/.cache/rockq}
  for lib in "$CARGO_TARGET_DIR"/*/build/librocksdb-sys-*/out/librocksdb.a \
    "$CARGO_TARGET_DIR"/*/*/build/librocksdb-sys-*/out/librocksdb.a \
    "$cache"/target/*/build/librocksdb-sys-*/out/librocksdb.a; do
    [ -f "$lib" ] || continue
    out=$(dirname "$lib")
    # The build script's output names the crate it ran from, hence its version.
    manifest=$(grep -m1 '^cargo:cargo_manifest_dir=' "$(dirname "$out")/output" 2>/dev/null || true)
    if [ -n "$version" ] && [[ "$manifest" == */librocksdb-sys-"$version" ]]; then
      export ROCKSDB_LIB_DIR=$out ROCKSDB_STATIC=1
      echo "fuzz: linking the prebuilt $lib" >&2
      break
    fi
  done
  [ -n "${ROCKSDB_LIB_DIR:-}" ] || echo "fuzz: no prebuilt librocksdb.a $version; compiling RocksDB" >&2
fi

cd fuzz
for t in "${targets[@]}"; do
  mkdir -p "corpus/$t"
  if [ "$mode" = cmin ]; then
    cargo fuzz cmin -s "$sanitizer" "$t" "corpus/$t"
    continue
  fi
  echo "fuzz: $t for ${seconds}s (sanitizer: $sanitizer)" >&2
  cargo fuzz run -s "$sanitizer" "$t" "corpus/$t" -- -max_total_time="$seconds" -print_final_stats=1 "$@"
done
