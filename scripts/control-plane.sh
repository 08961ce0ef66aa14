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
#                                          in the background with their state, certificates,
#                                          kubeconfigs and logs in DIR
#                                          (scripts/control-plane/start.sh says how); prints the
#                                          path of DIR/env, to source
#   scripts/control-plane.sh prepare DIR   as start, but start nothing: the caller starts
#                                          DIR/run-<component>.sh itself (the tests do, as
#                                          children that die with them)
#   scripts/control-plane.sh env DIR       print DIR/env (KUBECONFIG of an admin, the URL...)
#   scripts/control-plane.sh stop DIR [C]  stop what start started (by PID), or component C
#   scripts/control-plane.sh restart DIR C stop component C and start it again as it was
#   scripts/control-plane.sh wait DIR C    wait until kube-apiserver or -controller-manager is
#                                          ready
#
# Cold build on this project's machines (2 cores): see BENCHMARKS.md, "The real control plane".
# Go's own caches (GOCACHE, GOMODCACHE) are shared with every other Go build on the machine.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
module="$here/tools/control-plane"
cache_root="${EDGEBEAT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/edgebeat}"

export CGO_ENABLED=0 GOFLAGS=-mod=readonly
# A machine may carry a GOTOOLCHAIN that differs from the go line; ours is 1.26.
export GOTOOLCHAIN=local

# Bumped whenever how the components are built changes (flags, ldflags), so a cache built
# the old way is not used.
recipe=2

release() { awk '$1 == "require" && $2 == "k8s.io/kubernetes" { print $3 }' "$module/go.mod"; }

bin_dir() {
  local k8s etcd
  k8s=$(release)
  etcd=$(cd "$module" && go list -m -f '{{.Version}}' go.etcd.io/etcd/server/v3)
  echo "$cache_root/control-plane/kubernetes-$k8s-etcd-$etcd-$(go env GOARCH)-r$recipe"
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
      echo "	k8s.io/kubernetes/cmd/kubelet"
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
    (cd "$module" && GOFLAGS=-mod=mod go mod tidy)
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
    # Both packages, as Kubernetes' own hack/lib/version.sh sets them: component-base for
    # /version, client-go's for the User-Agent (kubectl/v1.N.P) the audit log records.
    ldk="-s -w"
    for vpkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
      ldk="$ldk -X $vpkg.gitVersion=$k8s -X $vpkg.gitMajor=1 -X $vpkg.gitMinor=$minor -X $vpkg.gitTreeState=clean"
    done
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
  start)
    dir="${2:?usage: control-plane.sh start DIR}"
    bin=$("$0" bin) || { echo "not built: run $0 build first" >&2; exit 1; }
    mkdir -p "$dir"
    dir=$(cd "$dir" && pwd)
    exec "$here/scripts/control-plane/start.sh" "$bin" "$dir"
    ;;
  prepare)
    dir="${2:?usage: control-plane.sh prepare DIR}"
    bin=$("$0" bin) || { echo "not built: run $0 build first" >&2; exit 1; }
    mkdir -p "$dir"
    dir=$(cd "$dir" && pwd)
    EDGEBEAT_PREPARE_ONLY=1 exec "$here/scripts/control-plane/start.sh" "$bin" "$dir"
    ;;
  env)
    cat "${2:?usage: control-plane.sh env DIR}/env"
    ;;
  wait)
    # wait DIR COMPONENT: until kube-apiserver answers /readyz, or kube-controller-manager
    # acts (its root CA publisher has put kube-root-ca.crt into kube-node-lease); 120 s.
    dir="${2:?}"
    component="${3:?}"
    bin=$("$0" bin)
    pid=$(cat "$dir/$component.pid")
    case "$component" in
      kube-apiserver) check=(get --raw /readyz) ;;
      kube-controller-manager) check=(-n kube-node-lease get configmap kube-root-ca.crt) ;;
      *) echo "wait: kube-apiserver or kube-controller-manager" >&2; exit 2 ;;
    esac
    deadline=$((SECONDS + 120))
    until "$bin/kubectl" --kubeconfig "$dir/admin.kubeconfig" --request-timeout 5s "${check[@]}" >/dev/null 2>&1; do
      if [ $SECONDS -ge $deadline ] || ! kill -0 "$pid" 2>/dev/null; then
        echo "$component is not ready; see $dir/$component.log:" >&2
        tail -n 30 "$dir/$component.log" >&2
        exit 1
      fi
      sleep 0.2
    done
    ;;
  restart)
    # restart DIR COMPONENT: stop it and start it again with the same command line.
    dir="${2:?}"
    component="${3:?}"
    "$0" stop "$dir" "$component"
    "$dir/run-$component.sh" >> "$dir/$component.log" 2>&1 < /dev/null &
    echo $! > "$dir/$component.pid"
    case "$component" in
      kube-apiserver|kube-controller-manager) "$0" wait "$dir" "$component" ;;
    esac
    ;;
  stop)
    # stop DIR [COMPONENT]: SIGTERM, up to 10 s, then SIGKILL; every component by default.
    dir="${2:?usage: control-plane.sh stop DIR [COMPONENT]}"
    for component in ${3:-kube-controller-manager kube-apiserver etcd}; do
      pidfile="$dir/$component.pid"
      [ -f "$pidfile" ] || continue
      pid=$(cat "$pidfile")
      if kill "$pid" 2>/dev/null; then
        for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        kill -9 "$pid" 2>/dev/null || true
      fi
      rm -f "$pidfile"
    done
    ;;
  *)
    sed -n '2,27p' "$0" >&2
    exit 2
    ;;
esac
