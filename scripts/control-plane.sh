#!/usr/bin/env bash
# The real Kubernetes control plane for tests and for trying edgebeat by hand: kube-apiserver,
# kube-controller-manager and kubectl of one Kubernetes release, and the etcd server that
# release pins, built unchanged from their Go modules (tools/control-plane/go.mod) into a cache
# outside the repository keyed by version, so only the first build costs anything.
#
#   scripts/control-plane.sh pin [v1.N.P]  regenerate tools/control-plane/go.mod from that
#                                          release's own go.mod (its replace block of staging
#                                          modules), then go mod tidy
#   scripts/control-plane.sh build         build what is missing; prints the bin directory
#   scripts/control-plane.sh bin           print the bin directory (exit 1 when not built)
#   scripts/control-plane.sh start DIR     start etcd, kube-apiserver and kube-controller-manager
#                                          with their state, certificates, kubeconfigs and logs
#                                          in DIR; prints DIR/env to source
#   scripts/control-plane.sh stop DIR      stop what start started (by PID)
#
# Cold build on this project's machines (2 cores): see BENCHMARKS.md, "The real control plane".
# Go's own caches (GOCACHE, GOMODCACHE) are shared with every other Go build on the machine.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
module="$here/tools/control-plane"
cache_root="${EDGEBEAT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/edgebeat}"

export CGO_ENABLED=0 GOFLAGS=-mod=mod
# A machine may carry a GOTOOLCHAIN that differs from the go line; ours is 1.26.
export GOTOOLCHAIN=local

release() { awk '$1 == "require" && $2 == "k8s.io/kubernetes" { print $3 }' "$module/go.mod"; }

bin_dir() {
  local k8s etcd
  k8s=$(release)
  etcd=$(cd "$module" && go list -m -f '{{.Version}}' go.etcd.io/etcd/server/v3)
  echo "$cache_root/control-plane/kubernetes-$k8s-etcd-$etcd-$(go env GOARCH)"
}

case "${1:-}" in
  pin)
    k8s="${2:-$(release)}"
    gomod=$(go mod download -json "k8s.io/kubernetes@$k8s" | sed -n 's/^\t"GoMod": "\(.*\)",$/\1/p')
    [ -f "$gomod" ] || { echo "no go.mod for k8s.io/kubernetes@$k8s" >&2; exit 1; }
    minor=$(echo "$k8s" | cut -d. -f2-)   # v1.36.3 -> 36.3: staging modules are v0.36.3
    {
      echo "// The real Kubernetes control plane the tests run, built unchanged from upstream"
      echo "// modules by scripts/control-plane.sh: no Go code of ours. Written by"
      echo "// \`scripts/control-plane.sh pin $k8s\` from that release's own go.mod."
      echo "module edgebeat.dev/tools/control-plane"
      echo
      awk '$1 == "go" { print; exit }' "$gomod"
      echo
      echo "tool ("
      echo "	go.etcd.io/etcd/server/v3"
      echo "	k8s.io/kubernetes/cmd/kube-apiserver"
      echo "	k8s.io/kubernetes/cmd/kube-controller-manager"
      echo "	k8s.io/kubernetes/cmd/kubectl"
      echo ")"
      echo
      echo "require k8s.io/kubernetes $k8s"
      echo
      echo "// The etcd server the release itself pins (its go.mod requires go.etcd.io/etcd/server/v3)."
      echo "require go.etcd.io/etcd/server/v3 $(awk '$1 == "go.etcd.io/etcd/server/v3" { print $2 }' "$gomod")"
      echo
      echo "// The release's staging modules, at the version published with it."
      echo "replace ("
      awk -v v="v0.$minor" '$2 == "=>" && $3 ~ /^\.\/staging\// { print "\t" $1 " => " $1 " " v }' "$gomod"
      echo ")"
    } > "$module/go.mod"
    (cd "$module" && go mod tidy)
    echo "pinned $k8s in $module/go.mod"
    ;;
  bin)
    d=$(bin_dir)
    for b in etcd kube-apiserver kube-controller-manager kubectl; do [ -x "$d/$b" ] || exit 1; done
    echo "$d"
    ;;
  build)
    d=$(bin_dir)
    k8s=$(release)
    minor=$(echo "$k8s" | cut -d. -f2)
    mkdir -p "$d"
    # What /version reports, so version skew checks (kubectl, kubeletVersion) see the release.
    vpkg=k8s.io/component-base/version
    ldk="-s -w -X $vpkg.gitVersion=$k8s -X $vpkg.gitMajor=1 -X $vpkg.gitMinor=$minor -X $vpkg.gitTreeState=clean"
    build_one() { # name package ldflags
      if [ -x "$d/$1" ]; then return; fi
      echo "building $1 ($2)" >&2
      (cd "$module" && go build -trimpath -ldflags "$3" -o "$d/$1.part" "$2")
      mv "$d/$1.part" "$d/$1"
    }
    etcd=$(cd "$module" && go list -m -f '{{.Version}}' go.etcd.io/etcd/server/v3)
    build_one etcd go.etcd.io/etcd/server/v3 "-s -w -X go.etcd.io/etcd/api/v3/version.GitSHA=$etcd"
    build_one kube-apiserver k8s.io/kubernetes/cmd/kube-apiserver "$ldk"
    build_one kube-controller-manager k8s.io/kubernetes/cmd/kube-controller-manager "$ldk"
    build_one kubectl k8s.io/kubernetes/cmd/kubectl "$ldk"
    echo "$d"
    ;;
  *)
    sed -n '2,18p' "$0" >&2
    exit 2
    ;;
esac
