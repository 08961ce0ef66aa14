#!/usr/bin/env bash
# metrics-server, built unchanged from its Go module (tools/metrics-server/go.mod,
# sigs.k8s.io/metrics-server) into a cache outside the repository keyed by version, as
# scripts/control-plane.sh builds the control plane: only the first build costs anything.
# tests/tests/resource_metrics.rs registers it as the APIService v1beta1.metrics.k8s.io of
# the test control plane, so that the real kubectl's `kubectl top node` reads edge nodes.
#
#   scripts/metrics-server.sh build   build it if missing; prints the path of the binary
#   scripts/metrics-server.sh bin     print that path (exit 1 when not built)
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
name=metrics-server
module="$here/tools/metrics-server"
main_module=sigs.k8s.io/metrics-server
package=sigs.k8s.io/metrics-server/cmd/metrics-server
# Bumped whenever how metrics-server is built changes (flags, ldflags).
recipe=1
# shellcheck source=scripts/go-tool.sh
. "$here/scripts/go-tool.sh"

# As metrics-server's own Makefile: the version its /version reports.
ldflags() { echo "-s -w -X k8s.io/client-go/pkg/version.gitVersion=$1"; }

case "${1:-}" in
  bin) go_tool_bin ;;
  build) go_tool_build ;;
  *)
    sed -n '2,10p' "$0" >&2
    exit 2
    ;;
esac
