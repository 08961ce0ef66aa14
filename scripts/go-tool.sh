# Sourced by scripts/helm.sh and scripts/metrics-server.sh: one upstream Go program, built
# unchanged from its module (a go.mod under tools/ whose `tool` line names it) into a cache
# outside the repository keyed by version and build recipe, so that only the first build
# costs anything. The caller sets:
#   name         the binary's name (and its cache directory's)
#   module       the directory of the tools/ go.mod
#   main_module  the upstream module whose version keys the cache
#   package      its main package
#   recipe       bumped whenever how it is built changes
# and defines `ldflags VERSION`, which prints the -ldflags its own Makefile would pass.
# Go's own caches (GOCACHE, GOMODCACHE) are shared with every other Go build on the machine.
cache_root="${EDGEBEAT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/edgebeat}"
export CGO_ENABLED=0 GOFLAGS=-mod=readonly GOTOOLCHAIN=local

go_tool_version() { (cd "$module" && go list -m -f '{{.Version}}' "$main_module"); }
go_tool_binary() { echo "$cache_root/$name/$name-$(go_tool_version)-$(go env GOARCH)-r$recipe/$name"; }

# Prints the binary's path; exits 1 when it is not built.
go_tool_bin() {
  local b
  b=$(go_tool_binary)
  [ -x "$b" ] || exit 1
  echo "$b"
}

# Builds the binary if missing; prints its path.
go_tool_build() {
  local b v
  b=$(go_tool_binary)
  if [ ! -x "$b" ]; then
    v=$(go_tool_version)
    mkdir -p "$(dirname "$b")"
    echo "building $name $v" >&2
    (cd "$module" && go build -trimpath -ldflags "$(ldflags "$v")" -o "$b.part" "$package")
    mv "$b.part" "$b"
  fi
  echo "$b"
}
