#!/usr/bin/env bash
# Builds the gateway image for linux/amd64 and linux/arm64 (one OCI image index) from
# deploy/gateway/Dockerfile without a Docker engine, and exports it as an OCI archive:
#   target/image/edgebeat-gateway_<version>.oci.tar   (tag edgebeat/gateway:<version>)
# The last line printed is `<archive> <index digest>`.
#
# Why buildah: Debian's package builds a Dockerfile rootful with no daemon (storage driver
# vfs, chroot isolation: nothing to mount or configure on the host), and makes multi-arch
# images from one Dockerfile (--platform with --manifest). The Dockerfile runs nothing
# (FROM scratch, COPY), so no emulation is needed for arm64. --timestamp 0 gives every
# layer and config one date: the same binaries give the same digest.
#
# Its storage is a directory of its own under target/image, removed at the end: nothing is
# left in /var/lib/containers.
#
# Load it: `kind load image-archive target/image/edgebeat-gateway_0.1.0.oci.tar`, or
# `ctr -n k8s.io images import --all-platforms target/image/edgebeat-gateway_0.1.0.oci.tar`.
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
command -v buildah >/dev/null || need_apt+=(buildah)
command -v skopeo >/dev/null || need_apt+=(skopeo)
command -v musl-gcc >/dev/null || need_apt+=(musl-tools)
command -v aarch64-linux-gnu-gcc >/dev/null || need_apt+=(gcc-aarch64-linux-gnu libc6-dev-arm64-cross)
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "installing ${need_apt[*]}" >&2
  apt-get update -qq >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}" >&2
fi
version=$(cargo metadata --format-version 1 --no-deps --locked \
  | python3 -c 'import json,sys; print(next(p["version"] for p in json.load(sys.stdin)["packages"] if p["name"] == "edgebeat-gateway"))')
target_dir=${CARGO_TARGET_DIR:-$PWD/target}
context="$target_dir/image/context"
rm -rf "$context" && mkdir -p "$context/amd64" "$context/arm64"
# Through cargo auditable (pinned, cached): each binary carries its crates (.dep-v0).
PATH="$(scripts/cargo-tool.sh cargo-auditable 0.7.7):$PATH"
for pair in amd64:x86_64-unknown-linux-musl arm64:aarch64-unknown-linux-musl; do
  arch=${pair%%:*} triple=${pair#*:}
  rustup target list --installed | grep -qx "$triple" || rustup target add "$triple" >&2
  cargo auditable build --locked --release -p edgebeat-gateway --target "$triple" >&2
  cp "$target_dir/$triple/release/edgebeat-gateway" "$context/$arch/edgebeat-gateway"
done

store="$target_dir/image/storage"
rm -rf "$store"
# buildah and skopeo keep a blob-info cache in /var/lib/containers whatever their storage:
# removed again when it was not there before.
[ -e /var/lib/containers ] && containers_before=1
trap 'buildah --root "$store/root" --runroot "$store/run" --storage-driver vfs rm --all >/dev/null 2>&1 || true; rm -rf "$store"; [ -n "${containers_before:-}" ] || rm -rf /var/lib/containers' EXIT
bah=(buildah --root "$store/root" --runroot "$store/run" --storage-driver vfs)
image="localhost/edgebeat/gateway:$version"
# One platform after the other, so the index lists them in one order (built together, the
# platforms are added to the index in the order they finish, and the digest changes).
for arch in amd64 arm64; do
  "${bah[@]}" build --quiet --isolation chroot --timestamp 0 --platform "linux/$arch" \
    --manifest "$image" -f deploy/gateway/Dockerfile "$context" >&2
done
archive="$target_dir/image/edgebeat-gateway_$version.oci.tar"
rm -f "$archive"
"${bah[@]}" manifest push --quiet --all "$image" "oci-archive:$archive:edgebeat/gateway:$version" >&2
digest=$(skopeo inspect --raw "oci-archive:$archive" | sha256sum | cut -d' ' -f1)
echo "$archive sha256:$digest"
