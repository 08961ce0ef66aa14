#!/usr/bin/env bash
# kubelet beside edgebeat over gRPC and MQTT, from one audit log, at kubelet's default
# nodeStatusReportFrequency of 5 minutes (the suite runs the same test at 1 minute):
# tests/tests/behaviour.rs, whose table BENCHMARKS.md holds. About 14 minutes; needs root
# and what scripts/test.sh builds (the control plane, kubelet and containerd, Mosquitto).
#   scripts/bench-behaviour.sh
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/control-plane.sh build
scripts/kubelet.sh build
cargo build --locked -p edgebeat-gateway -p edgebeat-agent
EDGEBEAT_REPORT_FREQUENCY_SECONDS=300 \
  cargo test --locked -p edgebeat-tests --test behaviour -- --ignored --nocapture
