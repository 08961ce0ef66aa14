#!/usr/bin/env bash
# Local demo on this host's real facts: stand-in apiserver + gateway + agent over gRPC.
# Extra arguments go to edgebeat-demo (e.g. --duration 65, --port 6443, --transport mqtt).
set -euo pipefail
cd "$(dirname "$0")/.."
command -v cc >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq gcc; }
if [[ " $* " == *" mqtt "* || " $* " == *"--transport=mqtt"* ]] && ! { command -v mosquitto >/dev/null || [ -x /usr/sbin/mosquitto ]; }; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq mosquitto
fi
exec cargo run --locked --quiet -p edgebeat-tests --bin edgebeat-demo -- "$@"
