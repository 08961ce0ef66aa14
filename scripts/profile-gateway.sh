#!/usr/bin/env bash
# Where the gateway's instructions go per written renewal: the release gateway (with symbols,
# in its own target dir) under valgrind's callgrind, behind edgebeat-fleet over MQTT
# (or the transport given).
# Instrumentation is on from the progress line at t=30s to the one at t=90s only, so the
# start-up and the ramp are not counted; the renewals written between those two lines
# divide the total. Figures in BENCHMARKS.md ("Where a renewal's instructions go").
#
#   scripts/profile-gateway.sh            # 300 nodes (about 30 renewals/s; callgrind runs ~50x slower)
#   scripts/profile-gateway.sh 500
#   scripts/profile-gateway.sh 300 grpc --mtls   # the fleet's --transport arguments after the count
#
# Output: target-prof/callgrind.out.<pid>.1 and a summary (callgrind_annotate --inclusive).
set -euo pipefail
cd "$(dirname "$0")/.."
nodes=${1:-300}
transport=("${@:2}")
[ ${#transport[@]} -gt 0 ] || transport=(mqtt)
command -v valgrind >/dev/null || {
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq valgrind
}
command -v mosquitto >/dev/null || [ -x /usr/sbin/mosquitto ] || {
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq mosquitto
}
# The gateway with symbols (the release profile strips them); the fleet as usual.
CARGO_TARGET_DIR=target-prof CARGO_PROFILE_RELEASE_STRIP=false \
  CARGO_PROFILE_RELEASE_DEBUG=line-tables-only \
  cargo build --release --locked -p edgebeat-gateway --bin edgebeat-gateway
cargo build --release --locked -p edgebeat-tests --bin edgebeat-fleet
out=$(realpath target-prof)
rm -f "$out"/callgrind.out.*
wrapper="$out/callgrind-gateway.sh"
cat > "$wrapper" <<WRAP
#!/bin/sh
exec valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file=$out/callgrind.out.%p $out/release/edgebeat-gateway "\$@"
WRAP
chmod +x "$wrapper"
log="$out/fleet.out"
ulimit -n "$(ulimit -Hn)" || true
"${CARGO_TARGET_DIR:-target}/release/edgebeat-fleet" --nodes "$nodes" --transport "${transport[@]}" \
  --duration 110 --ramp 10 --report-every 10 --gateway-bin "$wrapper" > "$log" 2>&1 &
fleet=$!
line() { until grep -q "^t=  *$1s" "$log" 2>/dev/null; do sleep 0.5; kill -0 "$fleet"; done; grep "^t=  *$1s" "$log" | head -1; }
start=$(line '3[0-9]'); callgrind_control -i on >/dev/null
end=$(line '9[0-9]'); callgrind_control -d >/dev/null
wait "$fleet"
renewals() { sed -n 's/.*renewals_ok=\([0-9]*\).*/\1/p' <<<"$1"; }
written=$(( $(renewals "$end") - $(renewals "$start") ))
profile=$(ls "$out"/callgrind.out.*.1)
total=$(callgrind_annotate "$profile" | sed -n 's/^ *\([0-9,]*\) .*PROGRAM TOTALS.*/\1/p' | tr -d ,)
echo "window: ${start%% msgs*} .. ${end%% msgs*}; renewals written: $written"
echo "instructions: $total; per renewal: $(( total / written ))"
callgrind_annotate --inclusive=yes "$profile" | sed -n '20,60p' | cut -c1-200
