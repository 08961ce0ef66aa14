#!/usr/bin/env bash
# Builds the agent's Debian packages with cargo-deb (pinned, installed once into the cache)
# from binaries built with cargo auditable:
# arm64 (the static aarch64-musl agent), armhf (static armv7 glibc) and amd64 (the host's
# x86_64 glibc build, its libc dependency from dpkg-shlibdeps), into target/debian/, and
# prints their paths, one per line, on the last three lines of its output.
#
#   scripts/package.sh            # all three
#   scripts/package.sh amd64      # one
#
# Reproducible: every file's time is SOURCE_DATE_EPOCH (the last commit's, unless set), and
# cargo-deb orders and compresses the same way each run (xz through the same cargo-deb
# binary), so the same binaries give the same bytes.
set -euo pipefail
cd "$(dirname "$0")/.."

cargo_deb="$(scripts/cargo-tool.sh cargo-deb 3.8.0)/cargo-deb"
# Every binary built with cargo auditable: its crates, embedded (section .dep-v0), for
# trivy, grype and syft to read.
PATH="$(scripts/cargo-tool.sh cargo-auditable 0.7.7):$PATH"
need_apt=()
command -v dpkg-shlibdeps >/dev/null || need_apt+=(dpkg-dev)
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "installing ${need_apt[*]}" >&2
  apt-get update -qq >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}" >&2
fi
export SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct)}

arches=("$@")
[ ${#arches[@]} -gt 0 ] || arches=(arm64 armhf amd64)
built=()
for arch in "${arches[@]}"; do
  case "$arch" in
    arm64) target=aarch64-unknown-linux-musl ;;
    armhf) target=armv7-unknown-linux-gnueabihf ;;
    amd64) target= ;;
    *) echo "unknown architecture $arch (arm64, armhf or amd64)" >&2; exit 2 ;;
  esac
  if [ -n "$target" ]; then
    # The same build as scripts/cross-agent.sh (installs the cross compilers it needs).
    scripts/cross-agent.sh "$target" >/dev/null
    args=(--target "$target")
  else
    cargo auditable build --locked --profile agent -p edgebeat-agent >&2
    args=()
  fi
  # --no-strip: the `agent` profile strips already (it inherits release's strip = true).
  deb=$("$cargo_deb" deb --locked --no-build --no-strip -p edgebeat-agent "${args[@]}" \
    --output target/debian/ | tail -n 1)
  built+=("$(realpath "$deb")")
done
printf '%s\n' "${built[@]}"
