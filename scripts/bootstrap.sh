#!/usr/bin/env bash
# Installs what building rockq needs on a fresh Debian machine: libclang (bindgen, used by
# librocksdb-sys) and a C++ toolchain, and exports CARGO_TARGET_DIR. Idempotent.
# Sourced by scripts/test.sh and scripts/demo.sh (which set -euo pipefail themselves); it sets
# no shell options, so sourcing it from an interactive shell changes nothing else.

need=()
have_libclang() {
  # libclang itself (libclang.so / libclang-N.so), not libclang-cpp or the clang runtimes.
  ldconfig -p 2>/dev/null | grep -Eq 'libclang(-[0-9.]+)?\.so' \
    || compgen -G '/usr/lib/llvm-*/lib/libclang.so*' >/dev/null
}
have_libclang || need+=(libclang-dev)
command -v clang >/dev/null 2>&1 || need+=(clang)
command -v g++ >/dev/null 2>&1 || need+=(g++)
command -v make >/dev/null 2>&1 || need+=(make)
# The etcd engine (feature `etcd`): its client's build compiles protobufs with protoc (every
# build with ROCKQ_FEATURES, the demo's too), and its tests start Debian's etcd (asked for by
# scripts/test.sh and scripts/etcd-tests.sh).
command -v protoc >/dev/null 2>&1 || need+=(protobuf-compiler)
if [ -n "${ROCKQ_NEED_ETCD:-}" ]; then
  command -v etcd >/dev/null 2>&1 || need+=(etcd-server)
fi
# The web console's browser tests drive Debian's Chromium through chromedriver. Asked for by
# scripts/test.sh and scripts/browser-tests.sh.
if [ -n "${ROCKQ_NEED_BROWSER:-}" ]; then
  command -v chromium >/dev/null 2>&1 || need+=(chromium)
  command -v chromedriver >/dev/null 2>&1 || need+=(chromium-driver)
fi

if [ "${#need[@]}" -gt 0 ]; then
  echo "bootstrap: installing ${need[*]}" >&2
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi

# The feature set of every build the scripts make: the demo's, the tests', the lints' and the
# docs'. One set, because librocksdb-sys's build (RocksDB's C++, 15-25 minutes on two cores)
# is keyed by the features of every build dependency in the build: a smaller set (plain
# `cargo build`) unifies fewer features into the host crates it shares with them, and compiles
# RocksDB a second time. scripts/check-one-rocksdb.sh checks that they share one build.
ROCKQ_FEATURES="${ROCKQ_FEATURES:-cli,postcard,tower,web,etcd,otel}"

# RocksDB takes 15-25 minutes to compile on two cores. Keep one target dir per machine,
# outside the clone, so CI runs on a clean checkout reuse the compiled C++ objects.
if [ -z "${CARGO_TARGET_DIR:-}" ]; then
  export CARGO_TARGET_DIR="${ROCKQ_CACHE_DIR:-$HOME/.cache/rockq}/target"
fi
mkdir -p "$CARGO_TARGET_DIR"
# Old builds of rockq pile up in that shared dir; prune them when the disk runs low.
source "$(dirname "${BASH_SOURCE[0]}")/prune-cache.sh"
rockq_prune_cache "$CARGO_TARGET_DIR"
echo "bootstrap: CARGO_TARGET_DIR=$CARGO_TARGET_DIR" >&2
