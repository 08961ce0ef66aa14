#!/usr/bin/env bash
# cargo-deny over the whole workspace (deny.toml): licenses, bans (no OpenSSL, no wildcard
# versions) and sources (crates.io only). cargo-deny is pinned and installed once into the
# cache by scripts/cargo-tool.sh (about 4 minutes to build). Advisories need the RustSec
# database from github.com, out of reach of this project's CI: `scripts/deny.sh advisories`
# where it is in reach.
set -euo pipefail
cd "$(dirname "$0")/.."
deny="$(scripts/cargo-tool.sh cargo-deny 0.18.9)/cargo-deny"
checks=("$@")
[ ${#checks[@]} -gt 0 ] || checks=(bans licenses sources)
exec "$deny" --locked check "${checks[@]}"
