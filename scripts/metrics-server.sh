#!/usr/bin/env bash
# metrics-server, built unchanged from its Go module (tools/metrics-server/go.mod,
# sigs.k8s.io/metrics-server) into a cache outside the repository keyed by version, as
# scripts/control-plane.sh builds the control plane: only the first build costs anything.
# tests/tests/resource_metrics.rs registers it as the APIService v1beta1.metrics.k8s.io of
# the test control plane, so that the real kubectl's `kubectl top node` reads edge nodes.
#
#   scripts/metrics-server.sh build   build it if missing; prints the path of the binary
#   scripts/metrics-server.sh bin     print that path (exit 1 when not built)
#
# Go's own caches (GOCACHE, GOMODCACHE) are shared with every other Go build on the machine.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
module="$here/tools/metrics-server"
cache_root="${EDGEBEAT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/edgebeat}"
export CGO_ENABLED=0 GOFLAGS=-mod=readonly GOTOOLCHAIN=local

# Bumped whenever how metrics-server is built changes (flags, ldflags).
recipe=1

version() { (cd "$module" && go list -m -f '{{.Version}}' sigs.k8s.io/metrics-server); }
binary() { echo "$cache_root/metrics-server/metrics-server-$(version)-$(go env GOARCH)-r$recipe/metrics-server"; }

case "${1:-}" in
  bin)
    b=$(binary)
    [ -x "$b" ] || exit 1
    echo "$b"
    ;;
  build)
    b=$(binary)
    if [ ! -x "$b" ]; then
      v=$(version)
      mkdir -p "$(dirname "$b")"
      echo "building metrics-server $v" >&2
      # As metrics-server's own Makefile: -trimpath, and the version its /version reports.
      ld="-s -w -X k8s.io/client-go/pkg/version.gitVersion=$v"
      (cd "$module" && go build -trimpath -ldflags "$ld" -o "$b.part" sigs.k8s.io/metrics-server/cmd/metrics-server)
      mv "$b.part" "$b"
    fi
    echo "$b"
    ;;
  *)
    echo "usage: $0 build|bin" >&2
    exit 2
    ;;
esac
