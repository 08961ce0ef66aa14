#!/usr/bin/env bash
# Partition benchmark: real agents behind a veth link that is cut (ip link down) or slowed
# (tc tbf), at kubelet's cadence, on both transports. Rows of RELIABILITY.md come from this
# script. Needs root (ip netns, tc).
#
#   scripts/faults.sh                          # 20 s and 90 s cuts, 60 s at 8 kbit/s (~15 min)
#   scripts/faults.sh --transport mqtt --long-cut 120
set -euo pipefail
cd "$(dirname "$0")/.."

command -v mosquitto >/dev/null || [ -x /usr/sbin/mosquitto ] || {
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq mosquitto
}
command -v ip >/dev/null && command -v tc >/dev/null || {
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq iproute2
}
cargo build --release --locked -p edgebeat-agent -p edgebeat-tests \
  --bin edgebeat-agent --bin edgebeat-faults
"${CARGO_TARGET_DIR:-target}/release/edgebeat-faults" "$@"
