#!/usr/bin/env bash
# A Debian bookworm root (debootstrap's minbase with systemd as its init: the packages'
# systemd scripts, and a boot under `systemd-nspawn --boot`) as a tar archive in the cache,
# made once (about 35 s with the mirror near), and prints its path. The package tests
# (tests/tests/package.rs) install into a fresh copy of it.
set -euo pipefail
cd "$(dirname "$0")/.."
cache=${EDGEBEAT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/edgebeat}
mirror=${EDGEBEAT_DEBIAN_MIRROR:-http://deb.debian.org/debian}
tar="$cache/debootstrap/bookworm-systemd-r1.tar"
if [ ! -f "$tar" ]; then
  command -v debootstrap >/dev/null || {
    apt-get update -qq >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >&2
  }
  mkdir -p "$cache/debootstrap"
  root=$(mktemp -d "$cache/debootstrap/root.XXXXXX")
  trap 'rm -rf "$root"' EXIT
  debootstrap --variant=minbase --include=init-system-helpers,systemd,systemd-sysv,dbus bookworm "$root" "$mirror" \
    >"$cache/debootstrap/debootstrap.log" 2>&1 || { cat "$cache/debootstrap/debootstrap.log" >&2; exit 1; }
  tar -C "$root" -cf "$tar.partial" . && mv "$tar.partial" "$tar"
fi
echo "$tar"
