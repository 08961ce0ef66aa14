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
# The agent's Debian packages (scripts/package.sh), checked by lintian and installed by
# dpkg into a root debootstrap makes (tests/tests/package.rs).
command -v dpkg-shlibdeps >/dev/null || need_apt+=(dpkg-dev)
command -v lintian >/dev/null || need_apt+=(lintian)
command -v debootstrap >/dev/null || need_apt+=(debootstrap)
# A real systemd boots that root (systemd-nspawn --boot): the agent's unit on an offline
# board, an upgrade and a purge under the service manager (tests/tests/package.rs).
command -v systemd-nspawn >/dev/null || need_apt+=(systemd-container)
# The gateway image (scripts/gateway-image.sh): buildah builds it, skopeo and umoci read it,
# runc runs it (tests/tests/image.rs); musl-gcc for ring in the static amd64 gateway.
for tool in buildah skopeo umoci runc musl-gcc; do
  command -v "$tool" >/dev/null || need_apt+=("$([ "$tool" = musl-gcc ] && echo musl-tools || echo "$tool")")
done
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
# A real kubelet of the same release and containerd v2 behind it (scripts/kubelet.sh), built
# the same way, for tests/tests/kubelet.rs (root only: they run as root): a few minutes the
# first time, nothing after.
if [ "$(id -u)" = 0 ]; then
  scripts/kubelet.sh build
fi
# Helm, built the same way from its module (scripts/helm.sh): about a minute the first time.
scripts/helm.sh build
# metrics-server, built the same way (scripts/metrics-server.sh), for `kubectl top node` of
# edge nodes (tests/tests/resource_metrics.rs).
scripts/metrics-server.sh build

# The last step, however the suite ends (an EXIT trap): it fails if a process the suite
# started is still running. Every process a test starts dies with its test binary
# (tests/src/process.rs: the parent-death signal), shared fixtures included, so anything
# left is a leak. Left means: running now, not before this point (the installs and builds
# above may start system services), and either named as what the tests start (the control
# plane, kubelet, containerd, kubectl, Mosquitto, Prometheus, metrics-server, Helm, qemu,
# edgebeat-*), or an orphan (its parent PID 1) whose executable, working directory or command
# line is inside the checkout or the build cache.
processes_before=$(mktemp)
ls /proc | grep -E '^[0-9]+$' > "$processes_before" || true
nothing_left_running() {
  local rc=$1
  trap - EXIT
  if ! python3 - "$processes_before" "$(pwd)" \
    "${EDGEBEAT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/edgebeat}" <<'PY'
import os, sys, time

before = set(open(sys.argv[1]).read().split())
roots = tuple(os.path.realpath(p) for p in sys.argv[2:4])
# /proc/PID/comm holds 15 characters: prefixes.
names = ("kube-", "kubelet", "containerd", "etcd", "kubectl", "mosquitto", "prometheus", "metrics-server", "helm",
         "qemu-", "edgebeat-")
me = {str(os.getpid()), str(os.getppid())}

def inside(path):
    return any(path == r or path.startswith(r + "/") for r in roots)

def left():
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or pid in before or pid in me:
            continue
        try:
            stat = open(f"/proc/{pid}/stat").read()
            state, ppid = stat[stat.rindex(")") + 2:].split()[:2]
            comm = open(f"/proc/{pid}/comm").read().strip()
            args = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")
            command = " ".join(a.decode(errors="replace") for a in args if a)
            paths = []
            for link in ("exe", "cwd"):
                try:
                    paths.append(os.readlink(f"/proc/{pid}/{link}").removesuffix(" (deleted)"))
                except OSError:
                    pass
        except (OSError, ValueError):
            continue  # ended meanwhile
        if state == "Z":
            continue  # ended, not yet reaped
        ours = any(inside(p) for p in paths) or any(inside(a) for a in command.split())
        if comm.startswith(names) or (ppid == "1" and ours):
            found.append(f"  pid {pid} (parent {ppid}) {comm}: {command[:300]}")
    return found

# A process killed by its parent-death signal is gone within moments.
deadline = time.monotonic() + 10
while (found := left()) and time.monotonic() < deadline:
    time.sleep(0.5)
if found:
    print("\nLEFT RUNNING by the suite (a fixture leaks processes):", *found, sep="\n")
    sys.exit(1)
PY
  then
    [ "$rc" != 0 ] || rc=1
  fi
  rm -f "$processes_before"
  exit "$rc"
}
trap 'nothing_left_running $?' EXIT

cargo fmt --all -- --check
cargo clippy --workspace --all-targets --locked -- -D warnings
# What may be inside any binary: permissive licenses, no OpenSSL, crates.io only (deny.toml).
scripts/deny.sh
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
# The agent's packages for arm64, armhf and amd64 (cargo-deb, pinned and cached; the ARM
# binaries are those above), installed by dpkg into a bookworm root: chrooted maintainer
# scripts need root.
if [ "$(id -u)" = 0 ]; then
  EDGEBEAT_DEBS=$(scripts/package.sh | tail -n 3 | tr '\n' ' ')
  # Packaged again from the same binaries: the same bytes (cargo-deb, SOURCE_DATE_EPOCH).
  sums=$(sha256sum $EDGEBEAT_DEBS)
  scripts/package.sh >/dev/null
  [ "$(sha256sum $EDGEBEAT_DEBS)" = "$sums" ] || { echo "the packages differ between two builds" >&2; exit 1; }
  EDGEBEAT_BOOKWORM_TAR=$(scripts/debootstrap.sh | tail -n 1)
  export EDGEBEAT_DEBS EDGEBEAT_BOOKWORM_TAR
  ls -l $EDGEBEAT_DEBS
  cargo test --workspace --locked --test package -- --ignored
else
  not_run+=("tests/tests/package.rs: needs root (dpkg --root runs maintainer scripts chrooted; systemd-nspawn)")
fi
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
# kube-controller-manager (tests/tests/control_plane.rs); the stand-in apiserver held to
# the real one, call for call (tests/tests/standin_differential.rs); and scripts/demo.sh's
# edgebeat-demo against it, by --apiserver control-plane and by --kubeconfig
# (tests/tests/demo.rs).
# The ALPN test counts this process's connections to the shared kube-apiserver during a
# burst, which another test's client on the same control plane can add to (a run counted 20
# for one HTTP/2 client): it runs alone, after the others.
cargo test --workspace --locked --test control_plane --test standin_differential --test demo \
  -- --ignored --skip alpn_chooses_h2_and_three_connections_carry_a_replica
cargo test --workspace --locked --test control_plane -- --ignored --exact \
  alpn_chooses_h2_and_three_connections_carry_a_replica
# A real kubelet for this host beside the agent, against a control plane of its own, their
# Nodes, Leases and Events compared field by field (tests/tests/kubelet.rs; README.md,
# "Beside a real kubelet"); it puts back the sysctls, cgroups and mounts kubelet changes.
# Then the same kubelet and the gateway under an API Priority and Fairness overload
# (tests/tests/overload.rs), and kubelet's calls beside edgebeat's over gRPC and MQTT in one
# audit log (tests/tests/behaviour.rs; both tables in BENCHMARKS.md): one kubelet at a time,
# so one binary after the other.
if [ "$(id -u)" = 0 ]; then
  cargo test --workspace --locked --test kubelet --test overload --test behaviour -- --ignored
else
  not_run+=("tests/tests/kubelet.rs, overload.rs, behaviour.rs: need root (kubelet's cgroups, kernel tunables and mounts)")
fi
# kubelet's resource metrics of edge nodes through the real apiserver's node proxy, which
# refuses loopback: the gateway listens on a veth address of the test's own (root).
if [ "$(id -u)" = 0 ] && command -v ip >/dev/null; then
  cargo test --workspace --locked --test resource_metrics -- --ignored --test-threads=1
else
  not_run+=("tests/tests/resource_metrics.rs: needs root for a veth address")
fi
# The gateway image for amd64 and arm64 (buildah), built twice to one digest, then read and
# run under runc against the control plane (tests/tests/image.rs).
if [ "$(id -u)" = 0 ]; then
  # skopeo keeps a blob-info cache in /var/lib/containers: removed after when it was not there.
  [ -e /var/lib/containers ] && containers_before=1
  first=$(scripts/gateway-image.sh | tail -n 1)
  second=$(scripts/gateway-image.sh | tail -n 1)
  echo "gateway image: $first"
  [ "${first#* }" = "${second#* }" ] || { echo "the image's digest differs between two builds: $first, then $second" >&2; exit 1; }
  EDGEBEAT_GATEWAY_IMAGE=${first%% *}
  export EDGEBEAT_GATEWAY_IMAGE
  cargo test --workspace --locked --test image -- --ignored
  [ -n "${containers_before:-}" ] || rm -rf /var/lib/containers
  # What is inside each released binary (the packages' agents, the image's gateways, all
  # built with cargo auditable): a CycloneDX SBOM each, held to the crates the binary
  # carries (tests/tests/sbom.rs).
  EDGEBEAT_SBOMS=$(scripts/sbom.sh)
  EDGEBEAT_AUDITABLE2CDX="$(scripts/cargo-tool.sh auditable2cdx 0.1.0)/auditable2cdx"
  export EDGEBEAT_SBOMS EDGEBEAT_AUDITABLE2CDX
  cargo test --workspace --locked --test sbom -- --ignored
else
  not_run+=("tests/tests/image.rs: needs root (buildah's chroot isolation, runc)")
  not_run+=("tests/tests/sbom.rs: its binaries are those of the packages and the image (root)")
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
