#!/usr/bin/env bash
# Fleet benchmark: builds the gateway and the fleet simulator (release) and runs
# edgebeat-fleet over gRPC and MQTT. Figures in BENCHMARKS.md come from this script.
#
#   scripts/fleet.sh                 # 10,000 nodes, 10 minutes after a 60 s ramp, each transport
#   scripts/fleet.sh 1000 60         # 1,000 nodes for 60 s
#   TRANSPORTS=mqtt scripts/fleet.sh # one transport
#
# Extra arguments after the first two go to edgebeat-fleet (e.g. --apiserver-latency-ms 20).
#
#   scripts/fleet.sh 10000 150 --scrape-every 15
#       # also plays metrics-server: every 15 s, every node's /nodes/<node>/metrics/resource
#       # at the gateway (one HTTP/2 connection over mutual TLS, 256 requests in flight);
#       # prints scrape_* figures, and the gateway CPU/RSS figures include the scrapes.
#
# Simulated nodes send their resource usage on every second renewal, as real agents do
# (--no-usage: none, renewals as before the gateway served resource metrics).
set -euo pipefail
cd "$(dirname "$0")/.."

nodes=${1:-10000}
duration=${2:-600}
shift $(( $# > 2 ? 2 : $# ))
command -v mosquitto >/dev/null || [ -x /usr/sbin/mosquitto ] || {
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq mosquitto
}
cargo build --release --locked -p edgebeat-gateway -p edgebeat-tests \
  --bin edgebeat-gateway --bin edgebeat-fleet
# One socket per simulated node on each side.
ulimit -n "$(ulimit -Hn)" || true
ramp=$(( nodes >= 5000 ? 60 : 10 ))
for transport in ${TRANSPORTS:-grpc mqtt}; do
  # gRPC as deploy/gateway runs it: mutual TLS, a node certificate per simulated node.
  tls=()
  [ "$transport" = grpc ] && tls=(--mtls)
  echo "== $transport: $nodes nodes, ${duration}s after a ${ramp}s ramp ${tls[*]}"
  target/release/edgebeat-fleet --nodes "$nodes" --transport "$transport" "${tls[@]}" \
    --duration "$duration" --ramp "$ramp" --report-every 60 "$@"
done
