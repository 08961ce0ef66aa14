#!/usr/bin/env bash
# The whole test suite, from a fresh clone: formatting, clippy (warnings are errors), every
# unit, fixture and end-to-end test. Installs what it needs that is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
command -v cc >/dev/null || need_apt+=(gcc)
# A real MQTT broker for the MQTT tests (Debian's Mosquitto 2.x; no service is started).
command -v mosquitto >/dev/null || [ -x /usr/sbin/mosquitto ] || need_apt+=(mosquitto)
# ip (network namespaces, veth) for the link-bytes test, tests/tests/link.rs, and the cut
# site of tests/tests/sites.rs.
command -v ip >/dev/null && command -v ss >/dev/null || need_apt+=(iproute2)
# The real control plane's PKI (scripts/control-plane/start.sh) and its free ports.
command -v openssl >/dev/null || need_apt+=(openssl)
command -v python3 >/dev/null || need_apt+=(python3)
# promtool and a real Prometheus for the alert rules and the dashboard,
# tests/tests/monitoring.rs (Debian's 2.42; without its recommended exporters).
command -v promtool >/dev/null && command -v prometheus >/dev/null || need_prometheus=1
if [ ${#need_apt[@]} -gt 0 ] || [ -n "${need_prometheus:-}" ]; then
  apt-get update -qq
fi
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "installing ${need_apt[*]}"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}"
fi
if [ -n "${need_prometheus:-}" ]; then
  echo "installing prometheus (promtool)"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus
fi
command -v cargo >/dev/null || { echo "cargo (Rust stable via rustup) is required" >&2; exit 1; }
rustup component list --installed 2>/dev/null | grep -q '^clippy' || rustup component add clippy rustfmt

# The real Kubernetes control plane (kube-apiserver, kube-controller-manager, kubectl of one
# release, and etcd), built from their Go modules into a cache keyed by version: minutes the
# first time (BENCHMARKS.md, "The real control plane"), nothing after.
[ -x /usr/local/go/bin/go ] && export PATH="$PATH:/usr/local/go/bin"
command -v go >/dev/null || { echo "Go 1.26 is required to build the control plane" >&2; exit 1; }
scripts/control-plane.sh build
# Helm, built the same way from its module (scripts/helm.sh): about a minute the first time.
scripts/helm.sh build
# metrics-server, built the same way (scripts/metrics-server.sh), for `kubectl top node` of
# edge nodes (tests/tests/resource_metrics.rs).
scripts/metrics-server.sh build

cargo fmt --all -- --check
cargo clippy --workspace --all-targets --locked -- -D warnings
# The plaintext agents scripts/cross-agent.sh documents (one transport, no TLS): no other
# step builds these feature sets, and one of them once stopped building unnoticed.
for transport in mqtt grpc; do
  cargo clippy -p edgebeat-agent --locked --no-default-features --features "$transport" -- -D warnings
done

# The static ARM agents, run under qemu-user by tests/tests/cross_qemu.rs.
EDGEBEAT_CROSS_AGENT_AARCH64=$(scripts/cross-agent.sh aarch64-unknown-linux-musl | tail -n 1)
EDGEBEAT_CROSS_AGENT_ARMV7=$(scripts/cross-agent.sh armv7-unknown-linux-gnueabihf | tail -n 1)
export EDGEBEAT_CROSS_AGENT_AARCH64 EDGEBEAT_CROSS_AGENT_ARMV7
ls -l "$EDGEBEAT_CROSS_AGENT_AARCH64" "$EDGEBEAT_CROSS_AGENT_ARMV7"

cargo test --workspace --locked

# Tests that need what a plain `cargo test` cannot assume carry #[ignore = "needs …"]:
# run here where this machine has it, and said out loud where it has not. `--workspace`
# keeps the features of the run above, so nothing is built again.
not_run=()
# The ARM agents were built above.
cargo test --workspace --locked --test cross_qemu -- --ignored
if [ "$(id -u)" = 0 ] && ip netns list >/dev/null 2>&1; then
  cargo test --workspace --locked --test link --test faults --test sites -- --ignored
else
  not_run+=("tests/tests/link.rs, faults.rs and the veth test of sites.rs: need root with ip netns")
fi
# kubectl (no Debian package): a real client against the stand-in and the manifests.
if command -v kubectl >/dev/null; then
  cargo test --workspace --locked --test deploy --test standin_kubectl --test monitoring \
    --test gateway_start -- --ignored
else
  not_run+=("kubectl tests in tests/tests/deploy.rs, standin_kubectl.rs, monitoring.rs: need kubectl on PATH")
fi
# The real control plane built above: edgebeat as deployed against kube-apiserver, etcd and
# kube-controller-manager (tests/tests/control_plane.rs); and the stand-in apiserver held to
# the real one, call for call (tests/tests/standin_differential.rs).
cargo test --workspace --locked --test control_plane --test standin_differential -- --ignored
# kubelet's resource metrics of edge nodes through the real apiserver's node proxy, which
# refuses loopback: the gateway listens on a veth address of the test's own (root).
if [ "$(id -u)" = 0 ] && command -v ip >/dev/null; then
  cargo test --workspace --locked --test resource_metrics -- --ignored --test-threads=1
else
  not_run+=("tests/tests/resource_metrics.rs: needs root for a veth address")
fi
# The Helm chart, rendered and installed by the Helm built above into its own control plane
# (tests/tests/helm.rs).
cargo test --workspace --locked --test helm -- --ignored
if command -v systemd-analyze >/dev/null; then
  cargo test --workspace --locked --test systemd -- --ignored
else
  not_run+=("agent/tests/systemd.rs systemd_analyze_verifies_the_unit: needs systemd-analyze")
fi
if [ ${#not_run[@]} -gt 0 ]; then
  echo
  echo "NOT RUN on this machine (the rest passed):"
  printf '  %s\n' "${not_run[@]}"
fi
