#!/usr/bin/env bash
# cargo-deny over the whole workspace (deny.toml): licenses, bans (no OpenSSL, no wildcard
# versions) and sources (crates.io only). cargo-deny is pinned and installed once into the
# cache (about 4 minutes to build). Advisories need the RustSec database from github.com,
# out of reach of this project's CI: `scripts/deny.sh advisories` where it is in reach.
set -euo pipefail
cd "$(dirname "$0")/.."
version=0.18.9
cache=${EDGEBEAT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/edgebeat}
deny="$cache/cargo-deny-$version/bin/cargo-deny"
if [ ! -x "$deny" ]; then
  echo "installing cargo-deny $version into $cache" >&2
  cargo install --locked --quiet --version "$version" --root "$cache/cargo-deny-$version" cargo-deny >&2
fi
checks=("$@")
[ ${#checks[@]} -gt 0 ] || checks=(bans licenses sources)
exec "$deny" --locked check "${checks[@]}"
