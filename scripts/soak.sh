#!/usr/bin/env bash
# Soak: 10,000 simulated nodes for an hour at kubelet's cadence, through the real gateway
# binary (and Mosquitto for MQTT). Prints edgebeat-fleet's progress lines and summary, with
# the gateway's and broker's RSS slopes and open files (RELIABILITY.md, "Soak").
#
#   scripts/soak.sh                   # MQTT, 10,000 nodes, 3,600 s
#   TRANSPORTS="grpc mqtt" scripts/soak.sh 10000 3600
#   scripts/soak.sh 2000 600          # shorter
#
# Extra arguments after the first two go to edgebeat-fleet (e.g. --reboots-per-minute 10).
# The slopes and open-file counts come from the progress lines (one a minute) after the
# warm-up (ramp + one lease duration), so a run needs a few minutes to print them.
set -euo pipefail
cd "$(dirname "$0")/.."

nodes=${1:-10000}
duration=${2:-3600}
shift $(( $# > 2 ? 2 : $# ))
TRANSPORTS=${TRANSPORTS:-mqtt} exec scripts/fleet.sh "$nodes" "$duration" "$@"
