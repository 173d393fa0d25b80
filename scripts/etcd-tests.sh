#!/usr/bin/env bash
# Runs the etcd engine's tests against a real etcd (feature `etcd`; docs/DISTRIBUTED.md):
# installs Debian's etcd-server and protobuf-compiler (the etcd client's build needs protoc)
# when missing. The tests start and stop their own etcd processes by pid.
set -euo pipefail
cd "$(dirname "$0")/.."
ROCKQ_NEED_ETCD=1 source scripts/bootstrap.sh
cargo test --features etcd --test etcd_primitives --test etcd_engine --test etcd_cluster --test etcd_work --test etcd_limits --test etcd_flows --test etcd_retention --test etcd_export --test etcd_packed --test etcd_availability "$@" -- --nocapture
./scripts/etcd-semantics.sh "$@"
