#!/usr/bin/env bash
# Link-bytes benchmark: the real agent in a network namespace behind a veth pair, the
# interface counters of the link, at kubelet's cadence. Figures in BENCHMARKS.md ("Bytes on
# a metered link") come from this script. Needs root (ip netns).
#
#   scripts/link-bytes.sh                      # every case, 120 s windows (~20 min)
#   scripts/link-bytes.sh --window 30          # shorter windows
#   scripts/link-bytes.sh --case grpc --case mqtt
set -euo pipefail
cd "$(dirname "$0")/.."

command -v mosquitto >/dev/null || [ -x /usr/sbin/mosquitto ] || {
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq mosquitto
}
command -v ip >/dev/null || {
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq iproute2
}
cargo build --release --locked -p edgebeat-agent -p edgebeat-tests \
  --bin edgebeat-agent --bin edgebeat-link-bytes
"${CARGO_TARGET_DIR:-target}/release/edgebeat-link-bytes" "$@"
