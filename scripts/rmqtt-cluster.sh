#!/usr/bin/env bash
# Clustered broker benchmark: a three-node RMQTT cluster (Raft cluster plugin, MQTT 5 shared
# subscriptions) on loopback, a simulated fleet spread over its nodes, two gateway replicas
# (on nodes 1 and 2; each lists all three as --mqtt-endpoint), and then node 1 killed with
# SIGKILL: agents and the replica on it must fail over, nothing may expire. A run on
# Mosquitto with the same fleet gives the per-message broker cost beside RMQTT's.
#
#   scripts/rmqtt-cluster.sh                # 10,000 nodes, 240 s after the ramp, each case
#   scripts/rmqtt-cluster.sh 2000 120       # 2,000 nodes for 120 s
#   CASES=kill scripts/rmqtt-cluster.sh     # one case: cost (RMQTT, no fault), kill, mosquitto
#
# Extra arguments after the first two go to edgebeat-fleet. The broker is
# tools/rmqtt-node: rmqttd's startup with only the two plugins used (rmqttd itself links
# every plugin, Kafka's and Pulsar's C clients among them). It is installed with
# `cargo install --locked` into target/tools (a first build takes several minutes; cmake,
# for the aws-lc-sys that rmqtt-net's rustls needs, and protoc are installed from Debian
# when missing). Not part of scripts/test.sh.
set -euo pipefail
# LOGS=dir keeps each node's log and configuration there (BROKER_LOG=info for more).
[ -n "${LOGS:-}" ] && LOGS=$(realpath -m "$LOGS")
cd "$(dirname "$0")/.."

nodes=${1:-10000}
duration=${2:-240}
shift $(( $# > 2 ? 2 : $# ))
cases=${CASES:-cost kill mosquitto}
kill_after=${KILL_AFTER:-60}

missing=()
command -v cmake >/dev/null || missing+=(cmake)
command -v protoc >/dev/null || missing+=(protobuf-compiler)
command -v mosquitto >/dev/null || [ -x /usr/sbin/mosquitto ] || missing+=(mosquitto)
if [ ${#missing[@]} -gt 0 ]; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}"
fi
CARGO_TARGET_DIR=target/rmqtt-node cargo install --locked --quiet \
  --path tools/rmqtt-node --root target/tools
cargo build --release --locked -p edgebeat-gateway -p edgebeat-tests \
  --bin edgebeat-gateway --bin edgebeat-fleet
ulimit -n "$(ulimit -Hn)" || true
ramp=$(( nodes >= 5000 ? 60 : 10 ))

# Sets $port to a TCP port nothing listens on now (connect refused), below the kernel's
# ephemeral range (which the fleet's ten thousand connections crowd) and not handed out
# before in this run.
taken=" "
free_port() {
  local p low
  low=$(cut -f1 /proc/sys/net/ipv4/ip_local_port_range)
  if [ "$low" -le 10100 ]; then
    echo "net.ipv4.ip_local_port_range starts at $low; this script picks ports in 10000..that" >&2
    exit 1
  fi
  for p in $(shuf -i 10000-$(( low - 1 )) -n 100); do
    case $taken in *" $p "*) continue ;; esac
    if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
      taken+="$p "; port=$p; return
    fi
  done
  echo "no free port found" >&2; exit 1
}

work=$(mktemp -d)
pids=()
cleanup() {
  [ ${#pids[@]} -gt 0 ] && kill -KILL "${pids[@]}" 2>/dev/null || true
  [ -n "${LOGS:-}" ] && mkdir -p "$LOGS" && cp -r "$work"/. "$LOGS"/
  rm -rf "$work"
}
trap cleanup EXIT

# Starts the three nodes; sets mqtt_ports and pids.
start_cluster() {
  local i grpc=() raft=() grpc_list="" raft_list=""
  mqtt_ports=()
  pids=()
  for i in 1 2 3; do
    free_port; mqtt_ports+=("$port")
    free_port; grpc+=("$port")
    free_port; raft+=("$port")
  done
  for i in 1 2 3; do
    grpc_list+="${grpc_list:+, }\"$i@127.0.0.1:${grpc[i-1]}\""
    raft_list+="${raft_list:+, }\"$i@127.0.0.1:${raft[i-1]}\""
  done
  for i in 1 2 3; do
    local dir="$work/node$i"
    rm -rf "$dir" && mkdir -p "$dir/plugins"
    cat > "$dir/rmqtt.toml" <<EOF
node.id = $i
rpc.server_addr = "127.0.0.1:${grpc[i-1]}"
rpc.server_workers = 2
plugins.dir = "$dir/plugins/"
plugins.default_startups = ["rmqtt-cluster-raft", "rmqtt-shared-subscription"]
mqtt.max_sessions = 0
listener.tcp.external.addr = "127.0.0.1:${mqtt_ports[i-1]}"
listener.tcp.external.workers = 2
listener.tcp.external.nodelay = true
listener.tcp.external.max_connections = 1024000
listener.tcp.external.max_handshaking_limit = 5000
listener.tcp.external.handshake_timeout = "30s"
listener.tcp.external.max_packet_size = "1m"
listener.tcp.external.backlog = 4096
listener.tcp.external.allow_anonymous = true
listener.tcp.external.min_keepalive = 0
listener.tcp.external.max_inflight = 256
listener.tcp.external.max_mqueue_len = 100000
listener.tcp.external.mqueue_rate_limit = "100000,1s"
listener.tcp.external.max_qos_allowed = 2
listener.tcp.external.session_expiry_interval = "0s"
listener.tcp.external.message_retry_interval = "20s"
listener.tcp.external.message_expiry_interval = "5m"
EOF
    cat > "$dir/plugins/rmqtt-cluster-raft.toml" <<EOF
worker_threads = 2
node_grpc_addrs = [$grpc_list]
raft_peer_addrs = [$raft_list]
laddr = "127.0.0.1:${raft[i-1]}"
# Node 1 leads and the others join it. Without it, nodes started together each find no
# leader and each lead a cluster of one: three brokers that share no routes.
leader_id = 1
# A client reconnecting to another node makes the cluster kick its session on the node it
# was on. When that node is dead the kick waits for this timeout (10 s by default, the same
# as an edgebeat client's CONNACK timeout, so every reconnection of a client that was on
# the dead node gave up just before the broker answered).
node_grpc_client_timeout = "2s"
EOF
    cat > "$dir/plugins/rmqtt-shared-subscription.toml" <<EOF
strategy = "round_robin_per_group"
EOF
    RUST_LOG=${BROKER_LOG:-warn} target/tools/bin/edgebeat-rmqtt-node -f "$dir/rmqtt.toml" \
      > "$dir/out.log" 2>&1 &
    pids+=($!)
  done
  # Each node's MQTT listener, within 60 s.
  local deadline=$(( SECONDS + 60 ))
  for i in 1 2 3; do
    until (exec 3<>"/dev/tcp/127.0.0.1/${mqtt_ports[i-1]}") 2>/dev/null; do
      if [ $SECONDS -ge $deadline ] || ! kill -0 "${pids[i-1]}" 2>/dev/null; then
        echo "RMQTT node $i did not start:" >&2; cat "$work/node$i/out.log" >&2; exit 1
      fi
      sleep 0.2
    done
  done
}

stop_cluster() {
  kill -KILL "${pids[@]}" 2>/dev/null || true
  wait 2>/dev/null || true
  pids=()
}

fleet() {
  target/release/edgebeat-fleet --nodes "$nodes" --transport mqtt --replicas 2 \
    --duration "$duration" --ramp "$ramp" --report-every 30 "$@"
}

for case in $cases; do
  case $case in
    cost|kill)
      start_cluster
      brokers=()
      for i in 0 1 2; do brokers+=(--mqtt-broker "127.0.0.1:${mqtt_ports[i]}" --broker-pid "${pids[i]}"); done
      fault=()
      [ "$case" = kill ] && fault=(--kill-broker-after "$kill_after")
      echo "== rmqtt-$case: 3-node RMQTT cluster, $nodes nodes, ${duration}s after a ${ramp}s ramp ${fault[*]}"
      fleet "${brokers[@]}" "${fault[@]}" "$@"
      [ -n "${LOGS:-}" ] && mkdir -p "$LOGS/$case" && cp -r "$work"/node* "$LOGS/$case"/
      stop_cluster
      ;;
    mosquitto)
      echo "== mosquitto: one Mosquitto, $nodes nodes, ${duration}s after a ${ramp}s ramp"
      fleet "$@"
      ;;
    *) echo "unknown case $case (cost, kill, mosquitto)" >&2; exit 2 ;;
  esac
done
