#!/usr/bin/env bash
# A CycloneDX 1.5 SBOM (JSON) for each released binary, by cargo-cyclonedx (pinned, cached
# by scripts/cargo-tool.sh): the crates, versions, licenses and purls cargo resolves for
# that binary's target with its default features, build-time crates left out:
#   target/sbom/edgebeat-agent_<version>_<target>.cdx.json    aarch64-musl, armv7, x86_64
#   target/sbom/edgebeat-gateway_<version>_<target>.cdx.json  x86_64-musl, aarch64-musl
# Prints `<binary> <sbom>` per line: the binaries scripts/package.sh and
# scripts/gateway-image.sh build (run those first). Each binary also carries its crates
# itself (cargo auditable); tests/tests/sbom.rs holds the two to each other.
set -euo pipefail
cd "$(dirname "$0")/.."
cyclonedx="$(scripts/cargo-tool.sh cargo-cyclonedx 0.5.9)/cargo-cyclonedx"
export SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct)}
target_dir=${CARGO_TARGET_DIR:-$PWD/target}
out="$target_dir/sbom"
mkdir -p "$out"
version() {
  cargo metadata --format-version 1 --no-deps --locked \
    | python3 -c "import json,sys; print(next(p['version'] for p in json.load(sys.stdin)['packages'] if p['name'] == '$1'))"
}
host=$(rustc -vV | sed -n 's/^host: //p')
# package binary target path-of-the-binary
for release in \
  "agent edgebeat-agent aarch64-unknown-linux-musl $target_dir/aarch64-unknown-linux-musl/agent/edgebeat-agent" \
  "agent edgebeat-agent armv7-unknown-linux-gnueabihf $target_dir/armv7-unknown-linux-gnueabihf/agent/edgebeat-agent" \
  "agent edgebeat-agent $host $target_dir/agent/edgebeat-agent" \
  "gateway edgebeat-gateway x86_64-unknown-linux-musl $target_dir/x86_64-unknown-linux-musl/release/edgebeat-gateway" \
  "gateway edgebeat-gateway aarch64-unknown-linux-musl $target_dir/aarch64-unknown-linux-musl/release/edgebeat-gateway"; do
  read -r dir bin target binary <<<"$release"
  [ -x "$binary" ] || { echo "$binary is missing: build it first (scripts/package.sh, scripts/gateway-image.sh)" >&2; exit 1; }
  # cargo-cyclonedx writes next to each crate's Cargo.toml, for every binary of the
  # workspace: the one wanted is kept, the others removed.
  "$cyclonedx" cyclonedx --manifest-path "$dir/Cargo.toml" --describe binaries --target "$target" \
    --target-in-filename --no-build-deps --spec-version 1.5 --format json --quiet >&2
  sbom="$out/${bin}_$(version "$bin")_$target.cdx.json"
  mv "$dir/${bin}_bin_$target.cdx.json" "$sbom"
  find agent gateway tests hw proto transports -maxdepth 1 -name "*_bin_$target.cdx.json" -delete
  echo "$binary $sbom"
done
