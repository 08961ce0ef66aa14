#!/usr/bin/env bash
# Builds the static edge agent for ARM without Docker: installs what is missing (rustup
# targets; Debian's cross compilers and qemu-user-static), then
#   cargo auditable build --profile agent -p edgebeat-agent --target <triple> [extra cargo args]
# and prints the path of the binary on the last line.
#
#   scripts/cross-agent.sh aarch64-unknown-linux-musl
#   scripts/cross-agent.sh armv7-unknown-linux-gnueabihf --no-default-features --features mqtt
#
# With Docker or Podman, `cross build --release -p edgebeat-agent --target <triple>` (see
# cross.toml) does the same, armv7-unknown-linux-musleabihf included.
set -euo pipefail
cd "$(dirname "$0")/.."
target=${1:?usage: scripts/cross-agent.sh <target-triple> [cargo args]}
shift

need_apt=()
case "$target" in
  aarch64-unknown-linux-musl) command -v aarch64-linux-gnu-gcc >/dev/null || need_apt+=(gcc-aarch64-linux-gnu libc6-dev-arm64-cross) ;;
  armv7-unknown-linux-gnueabihf) command -v arm-linux-gnueabihf-gcc >/dev/null || need_apt+=(gcc-arm-linux-gnueabihf libc6-dev-armhf-cross) ;;
  *) echo "unsupported target $target (use aarch64-unknown-linux-musl or armv7-unknown-linux-gnueabihf)" >&2; exit 2 ;;
esac
command -v qemu-aarch64-static >/dev/null || need_apt+=(qemu-user-static)
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "installing ${need_apt[*]}" >&2
  apt-get update -qq >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}" >&2
fi
rustup target list --installed | grep -qx "$target" || rustup target add "$target" >&2

# The `agent` profile: `release` optimized for size (the workspace Cargo.toml says why),
# through cargo auditable (pinned, cached): the binary carries its crates (section .dep-v0,
# about 2.5 KB) for trivy, grype and syft.
PATH="$(scripts/cargo-tool.sh cargo-auditable 0.7.7):$PATH"
cargo auditable build --locked --profile agent -p edgebeat-agent --target "$target" "$@" >&2
echo "${CARGO_TARGET_DIR:-$PWD/target}/$target/agent/edgebeat-agent"
