#!/usr/bin/env bash
# Local demo on this host's real facts: gateway + agent reporting this host as a Node to
#   (default)                    the stand-in apiserver, in-process (up in seconds)
#   --apiserver control-plane    the suite's real kube-apiserver, etcd and
#                                kube-controller-manager (built once by
#                                scripts/control-plane.sh, cached; needs Go the first time)
#   --kubeconfig PATH            a cluster of your own (kind, k3s), as its admin
# Against a real apiserver it applies deploy/'s RBAC, runs the real edgebeat-gateway as its
# ServiceAccount and removes what it created when it ends.
# Extra arguments go to edgebeat-demo (e.g. --duration 65, --port 6443, --transport mqtt;
# --help lists them).
set -euo pipefail
cd "$(dirname "$0")/.."
command -v cc >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq gcc; }
if [[ " $* " == *" mqtt "* || " $* " == *"--transport=mqtt"* ]] && ! { command -v mosquitto >/dev/null || [ -x /usr/sbin/mosquitto ]; }; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq mosquitto
fi
if [[ " $* " == *" control-plane "* || " $* " == *"--apiserver=control-plane"* ]]; then
  # As scripts/test.sh: built from the Go modules into the cache the first time, then found.
  [ -x /usr/local/go/bin/go ] && export PATH="$PATH:/usr/local/go/bin"
  command -v go >/dev/null || { echo "Go 1.26 is required to build the control plane" >&2; exit 1; }
  scripts/control-plane.sh bin >/dev/null 2>&1 || scripts/control-plane.sh build
  command -v openssl >/dev/null && command -v python3 >/dev/null || {
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openssl python3
  }
fi
if [[ " $* " == *" control-plane "* || " $* " == *"--apiserver=control-plane"* || " $* " == *" --kubeconfig"* ]]; then
  # Against a real apiserver the gateway is the real binary, beside edgebeat-demo.
  cargo build --locked --quiet -p edgebeat-gateway
fi
exec cargo run --locked --quiet -p edgebeat-tests --bin edgebeat-demo -- "$@"
