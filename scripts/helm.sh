#!/usr/bin/env bash
# Helm, built unchanged from its Go module (tools/helm/go.mod, helm.sh/helm/v3) into a cache
# outside the repository keyed by version, as scripts/control-plane.sh builds the control
# plane: only the first build costs anything.
#
#   scripts/helm.sh build   build it if missing; prints the path of the helm binary
#   scripts/helm.sh bin     print that path (exit 1 when not built)
#   scripts/helm.sh crds    print the directory of the Prometheus Operator's CRDs
#                           (ServiceMonitor, PrometheusRule) of the pinned release, from its
#                           Go module, so the chart's monitoring objects can be sent to a
#                           real kube-apiserver
#
# Go's own caches (GOCACHE, GOMODCACHE) are shared with every other Go build on the machine.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
name=helm
module="$here/tools/helm"
main_module=helm.sh/helm/v3
package=helm.sh/helm/v3/cmd/helm
# Bumped whenever how helm is built changes (flags, ldflags).
recipe=2
# shellcheck source=scripts/go-tool.sh
. "$here/scripts/go-tool.sh"

# The Prometheus Operator release whose CRDs the tests install (its module holds them in
# example/prometheus-operator-crd).
prometheus_operator=v0.85.0

# As Helm's own Makefile sets them: what `helm version` reports, and the Kubernetes version
# `helm template` and `helm lint` assume without a cluster (client-go's v0.N.P is Kubernetes
# 1.N), else v1.20 and every kubeVersion constraint fails.
ldflags() {
  local k8s minor ld
  k8s=$(cd "$module" && go list -m -f '{{.Version}}' k8s.io/client-go)
  minor=$(echo "$k8s" | cut -d. -f2)
  ld="-s -w -X helm.sh/helm/v3/internal/version.version=$1 -X helm.sh/helm/v3/internal/version.gitTreeState=clean"
  for pkg in helm.sh/helm/v3/pkg/lint/rules helm.sh/helm/v3/pkg/chartutil; do
    ld="$ld -X $pkg.k8sVersionMajor=1 -X $pkg.k8sVersionMinor=$minor"
  done
  echo "$ld"
}

case "${1:-}" in
  bin) go_tool_bin ;;
  build) go_tool_build ;;
  crds)
    dir=$(GOFLAGS= go mod download -json "github.com/prometheus-operator/prometheus-operator@$prometheus_operator" \
      | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')
    [ -d "$dir/example/prometheus-operator-crd" ] || { echo "no CRDs in $dir" >&2; exit 1; }
    echo "$dir/example/prometheus-operator-crd"
    ;;
  *)
    sed -n '2,13p' "$0" >&2
    exit 2
    ;;
esac
