#!/usr/bin/env bash
# Runs the etcd engine's tests against a real etcd (feature `etcd`; docs/DISTRIBUTED.md):
# installs Debian's etcd-server and protobuf-compiler (the etcd client's build needs protoc)
# when missing. The tests start and stop their own etcd processes by pid.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/bootstrap.sh
need=()
command -v etcd >/dev/null 2>&1 || need+=(etcd-server)
command -v protoc >/dev/null 2>&1 || need+=(protobuf-compiler)
if [ "${#need[@]}" -gt 0 ]; then
  echo "etcd-tests: installing ${need[*]}" >&2
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi
cargo test --features etcd --test etcd_primitives "$@" -- --nocapture
