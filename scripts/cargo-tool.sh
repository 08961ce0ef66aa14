#!/usr/bin/env bash
# Installs a cargo tool once, pinned, into the cache (cargo install --locked: the versions
# its own Cargo.lock names), and prints the directory of its binaries:
#
#   bin=$(scripts/cargo-tool.sh cargo-deb 3.8.0)
#
# The cache is keyed by crate and version (~/.cache/edgebeat/<crate>-<version>); a build
# that fails leaves nothing behind, so the next run tries again.
set -euo pipefail
crate=${1:?usage: scripts/cargo-tool.sh <crate> <version>}
version=${2:?usage: scripts/cargo-tool.sh <crate> <version>}
cache=${EDGEBEAT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/edgebeat}
root="$cache/$crate-$version"
if [ ! -f "$root/.installed" ]; then
  echo "installing $crate $version into $cache" >&2
  rm -rf "$root"
  cargo install --locked --quiet --version "$version" --root "$root" "$crate" >&2
  touch "$root/.installed"
fi
echo "$root/bin"
