#!/usr/bin/env bash
# The agent's memory beside Debian's prometheus-node-exporter, on this host, in the same
# window: the agent as flashed (static musl as on the boards, here for x86_64, the `agent`
# profile, both transports, TLS; scripts/cross-agent.sh builds the ARM ones), heartbeating
# over gRPC with mutual TLS through a gateway to the real control plane
# (scripts/control-plane.sh), and node_exporter with its defaults; each scraped every 15 s
# as Prometheus would. VmRSS of each is sampled every second; prints the maximum and the
# mean of each and the agent's share of node_exporter's.
#
#   scripts/agent-rss.sh [SECONDS]      (default 120)
#
# Installs prometheus-node-exporter (Debian) if missing. Everything runs on loopback and is
# stopped at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-120}

if ! command -v prometheus-node-exporter >/dev/null; then
  apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus-node-exporter >&2
fi
[ -x /usr/local/go/bin/go ] && export PATH="$PATH:/usr/local/go/bin"
scripts/control-plane.sh build >/dev/null
cargo build --locked --quiet --release -p edgebeat-gateway
rustup target list --installed | grep -qx x86_64-unknown-linux-musl || rustup target add x86_64-unknown-linux-musl >&2
# Rust ships musl's crt objects and libc; the host's gcc compiles ring's C for it.
CC_x86_64_unknown_linux_musl=${CC_x86_64_unknown_linux_musl:-gcc} \
  cargo build --locked --quiet --profile agent -p edgebeat-agent --target x86_64-unknown-linux-musl
target=${CARGO_TARGET_DIR:-$PWD/target}

work=$(mktemp -d)
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  scripts/control-plane.sh stop "$work/cp" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

scripts/control-plane.sh start "$work/cp" >/dev/null
kubeconfig="$work/cp/admin.kubeconfig"

# The site PKI: a CA, the gateway's serving certificate for 127.0.0.1, a node certificate.
pki="$work/pki"
mkdir -p "$pki"
ec() { openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "$2" -keyout "$pki/$1.key" -out "$pki/$1.csr" 2>/dev/null; }
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "/CN=site CA" \
  -keyout "$pki/ca.key" -out "$pki/ca.crt" -days 2 2>/dev/null
ec gateway /CN=edgebeat-gateway
printf 'subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n' > "$pki/gateway.ext"
openssl x509 -req -in "$pki/gateway.csr" -CA "$pki/ca.crt" -CAkey "$pki/ca.key" -days 2 \
  -extfile "$pki/gateway.ext" -out "$pki/gateway.crt" 2>/dev/null
ec node "/O=system:nodes/CN=system:node:rss-board"
printf 'extendedKeyUsage=clientAuth\n' > "$pki/node.ext"
openssl x509 -req -in "$pki/node.csr" -CA "$pki/ca.crt" -CAkey "$pki/ca.key" -days 2 \
  -extfile "$pki/node.ext" -out "$pki/node.crt" 2>/dev/null

grpc=$(free_port); gateway_metrics=$(free_port); agent_metrics=$(free_port); exporter=$(free_port)
"$target/release/edgebeat-gateway" --kubeconfig "$kubeconfig" \
  --grpc-listen "127.0.0.1:$grpc" --grpc-tls-cert "$pki/gateway.crt" --grpc-tls-key "$pki/gateway.key" \
  --grpc-client-ca "$pki/ca.crt" --metrics-listen "127.0.0.1:$gateway_metrics" \
  > "$work/gateway.log" 2>&1 &
pids+=($!)
for _ in $(seq 300); do
  curl -sf "http://127.0.0.1:$gateway_metrics/readyz" >/dev/null 2>&1 && break
  sleep 0.1
done

cat > "$work/agent.yaml" <<EOF
apiVersion: edgebeat.io/v1alpha1
kind: AgentConfiguration
nodeName: rss-board
transport:
  kind: grpc
  endpoint: https://127.0.0.1:$grpc
  caFile: $pki/ca.crt
  certFile: $pki/node.crt
  keyFile: $pki/node.key
EOF
"$target/x86_64-unknown-linux-musl/agent/edgebeat-agent" --config "$work/agent.yaml" \
  --healthz-bind-address "127.0.0.1:$agent_metrics" > "$work/agent.log" 2>&1 &
agent=$!
pids+=("$agent")
prometheus-node-exporter --web.listen-address="127.0.0.1:$exporter" > "$work/exporter.log" 2>&1 &
node_exporter=$!
pids+=("$node_exporter")

rss() { awk '/^VmRSS:/ { print $2 }' "/proc/$1/status"; }
samples="$work/samples"
: > "$samples"
for s in $(seq "$seconds"); do
  if [ $((s % 15)) -eq 1 ]; then
    curl -sf "http://127.0.0.1:$agent_metrics/metrics" >/dev/null || true
    curl -sf "http://127.0.0.1:$exporter/metrics" >/dev/null || true
  fi
  echo "$(rss "$agent") $(rss "$node_exporter")" >> "$samples"
  sleep 1
done
renewals=$(curl -sf "http://127.0.0.1:$agent_metrics/metrics" | awk '/^edgebeat_agent_lease_renewals_total\{result="ok"\}/ { print $2 }')
[ "${renewals:-0}" != 0 ] || { echo "the agent renewed no Lease; its log:" >&2; tail -20 "$work/agent.log" >&2; exit 1; }

awk -v seconds="$seconds" -v renewals="$renewals" '
  { a += $1; n += $2; if ($1 > amax) amax = $1; if ($2 > nmax) nmax = $2; count++ }
  END {
    printf "%d s, %d samples, the agent renewed its Lease %d times\n", seconds, count, renewals
    printf "%-26s %12s %12s\n", "VmRSS", "max", "mean"
    printf "%-26s %9.1f MB %9.1f MB\n", "edgebeat-agent", amax / 1000, a / count / 1000
    printf "%-26s %9.1f MB %9.1f MB\n", "prometheus-node-exporter", nmax / 1000, n / count / 1000
    printf "%-26s %12.2f %12.2f\n", "agent / node_exporter", amax / nmax, a / n
  }' "$samples"
