#!/usr/bin/env bash
# What N nodes cost the real kube-apiserver and etcd, written directly as kubelets write
# them and through one edgebeat-gateway replica (tests/src/bin/edgebeat-cluster-load.rs).
# Figures in BENCHMARKS.md ("The real control plane") come from this script.
#
#   scripts/cluster-load.sh             # 500 nodes each side, 300 s measured (about 16 min)
#   scripts/cluster-load.sh 2000        # 2,000 nodes (about 22 min)
set -euo pipefail
cd "$(dirname "$0")/.."
nodes=${1:-500}
window=${2:-300}
[ -x /usr/local/go/bin/go ] && export PATH="$PATH:/usr/local/go/bin"
scripts/control-plane.sh build >/dev/null
cargo build --release --locked -p edgebeat-gateway -p edgebeat-tests \
  --bin edgebeat-gateway --bin edgebeat-cluster-load
ulimit -n "$(ulimit -Hn)" || true
target/release/edgebeat-cluster-load --nodes "$nodes" --window-seconds "$window"
