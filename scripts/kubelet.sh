#!/usr/bin/env bash
# A real kubelet and the container runtime behind it, for tests/tests/kubelet.rs, which runs
# them beside the edgebeat agent on this host and compares the two Nodes field by field:
# kubelet of the control plane's release (k8s.io/kubernetes/cmd/kubelet from
# tools/control-plane/go.mod), containerd and its runc shim (tools/containerd/go.mod), built
# unchanged from their Go modules into a cache outside the repository keyed by version and
# build recipe (scripts/go-tool.sh), as scripts/control-plane.sh builds the control plane:
# only the first build costs anything. runc itself is the system's (Debian's `runc`).
#
#   scripts/kubelet.sh build   build what is missing; prints the three binaries' paths
#                              (kubelet, containerd, containerd-shim-runc-v2), one a line
#   scripts/kubelet.sh bin     print those paths (exit 1 when one is not built)
#
# Cold build on a 2-core machine: kubelet about 4 min (1.6 GB peak), containerd and the
# shim about a minute together; nothing when cached.
# Go's own caches (GOCACHE, GOMODCACHE) are shared with every other Go build on the machine.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=scripts/go-tool.sh
. "$here/scripts/go-tool.sh"

# Each binary's go-tool.sh settings; the functions below read them.
kubelet() {
  name=kubelet
  module="$here/tools/control-plane"
  main_module=k8s.io/kubernetes
  package=k8s.io/kubernetes/cmd/kubelet
  # Bumped whenever how it is built changes (flags, ldflags).
  recipe=1
  # What kubelet reports as nodeInfo.kubeletVersion and /version, as the control plane's
  # components (scripts/control-plane.sh) and Kubernetes' hack/lib/version.sh set it.
  ldflags() {
    local minor ld="-s -w"
    minor=$(echo "$1" | cut -d. -f2)
    for vpkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
      ld="$ld -X $vpkg.gitVersion=$1 -X $vpkg.gitMajor=1 -X $vpkg.gitMinor=$minor -X $vpkg.gitTreeState=clean"
    done
    echo "$ld"
  }
}

containerd_binary() { # containerd | containerd-shim-runc-v2
  name=$1
  module="$here/tools/containerd"
  main_module=github.com/containerd/containerd/v2
  package=github.com/containerd/containerd/v2/cmd/$1
  recipe=1
  # As containerd's Makefile: no btrfs snapshotter (it needs cgo and btrfs headers).
  export GOFLAGS="-mod=readonly -tags=no_btrfs"
  # What containerd reports (nodeInfo.containerRuntimeVersion: containerd://<version>).
  ldflags() {
    echo "-s -w -X github.com/containerd/containerd/v2/version.Version=$1 -X github.com/containerd/containerd/v2/version.Package=github.com/containerd/containerd/v2"
  }
}

each() { # go_tool_bin | go_tool_build
  (kubelet && "$1")
  (containerd_binary containerd && "$1")
  (containerd_binary containerd-shim-runc-v2 && "$1")
}

case "${1:-}" in
  bin) each go_tool_bin ;;
  build) each go_tool_build ;;
  *)
    sed -n '2,16p' "$0" >&2
    exit 2
    ;;
esac
