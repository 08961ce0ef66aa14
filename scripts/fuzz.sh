#!/usr/bin/env bash
# Builds and runs every fuzz target in fuzz/ (cargo fuzz + libFuzzer) for a bounded time,
# prints execs and crashes per target, and exits non-zero when any target crashed (or
# timed out, or ran out of memory). See fuzz/README.md.
#
#   scripts/fuzz.sh [SECONDS-PER-TARGET] [TARGET...]     # default: 30 s, every target
#
# Environment:
#   FUZZ_SANITIZER  none (default), address or leak. The machine has only the stable toolchain:
#                   `none` builds on stable as is (coverage instrumentation only, Rust's own
#                   checks: panics, overflow, bounds); `address`/`leak` need `-Zsanitizer`, so
#                   the script sets RUSTC_BOOTSTRAP=1 for them (and builds into a target dir
#                   of their own).
#   FUZZ_ARGS       extra libFuzzer flags, e.g. "-jobs=2 -workers=2" or "-max_len=8192".
#
# Corpora live in fuzz/corpus/<target>/ (git-ignored, kept between runs); each run first
# adds the seeds: fuzz/seeds/agent_message/*.hex (protobuf, committed), deploy/agent/*.yaml,
# and the /proc, /sys and /etc files of tests/fixtures/. Crashing inputs land in
# fuzz/artifacts/<target>/, logs in fuzz/artifacts/logs/<target>.log.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

secs=${1:-30}
[[ $secs =~ ^[0-9]+$ && $secs -gt 0 ]] || { echo "usage: $0 [seconds-per-target] [target...]" >&2; exit 2; }
shift $(( $# > 0 ? 1 : 0 ))
all_targets=(agent_message_decode config_parse gateway_validate hw_parsers mqtt_envelope)
targets=("$@")
[[ ${#targets[@]} -gt 0 ]] || targets=("${all_targets[@]}")

sanitizer=${FUZZ_SANITIZER:-none}
build_env=()
target_dir=()
case $sanitizer in
  none) ;;
  address|leak)
    # -Zsanitizer is nightly-only; stable's compiler accepts it with RUSTC_BOOTSTRAP=1. A
    # target dir of its own keeps the two builds from rebuilding each other.
    build_env=(RUSTC_BOOTSTRAP=1)
    target_dir=(--target-dir "$root/fuzz/target/sanitizer-$sanitizer") ;;
  # memory and thread need --build-std (nightly, rust-src): not on this machine.
  *) echo "FUZZ_SANITIZER must be none, address or leak" >&2; exit 2 ;;
esac

# --- tools ------------------------------------------------------------------------------
command -v cargo >/dev/null || { echo "cargo (Rust via rustup) is required" >&2; exit 1; }
need_apt=()
command -v c++ >/dev/null || need_apt+=(g++)      # libfuzzer-sys compiles libFuzzer (C++)
command -v xxd >/dev/null || need_apt+=(xxd)      # hex seeds -> binary
if [[ ${#need_apt[@]} -gt 0 ]]; then
  echo "installing ${need_apt[*]}"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}"
fi
if ! cargo fuzz --version >/dev/null 2>&1; then
  echo "installing cargo-fuzz"
  cargo install cargo-fuzz --version '^0.13' --locked
fi
echo "$(cargo fuzz --version), $(rustc --version), sanitizer: $sanitizer"

# --- seed corpora -----------------------------------------------------------------------
seed() { # seed TARGET FILE NAME: copies FILE into the target's corpus as seed-NAME
  mkdir -p "fuzz/corpus/$1"
  cp "$2" "fuzz/corpus/$1/seed-$3"
}
for t in agent_message_decode gateway_validate mqtt_envelope; do
  mkdir -p "fuzz/corpus/$t"
  for hex in fuzz/seeds/agent_message/*.hex; do
    xxd -r -p "$hex" > "fuzz/corpus/$t/seed-$(basename "$hex" .hex)"
  done
done
for y in deploy/agent/*.yaml; do
  seed config_parse "$y" "$(basename "$y")"
done
while IFS= read -r f; do
  # tests/fixtures/<host>/proc/net/route -> <host>_proc_net_route
  rel=${f#tests/fixtures/}
  seed hw_parsers "$f" "${rel//\//_}"
done < <(find tests/fixtures -type f -size -64k \( -path '*/proc/meminfo' -o -path '*/proc/loadavg' \
  -o -path '*/proc/cpuinfo' -o -path '*/proc/net/*' -o -path '*/proc/pressure/*' \
  -o -path '*/etc/os-release' -o -path '*/usr/lib/os-release' -o -name memory.stat \
  -o -path '*/sys/devices/system/cpu/*' \) | sort)
# The default-route pick reads `route NUL fib_trie` (see fuzz_targets/hw_parsers.rs).
for host in tests/fixtures/*/; do
  r=${host}proc/net/route; f=${host}proc/net/fib_trie
  if [[ -f $r && -f $f ]]; then
    mkdir -p fuzz/corpus/hw_parsers
    { cat "$r"; printf '\0'; cat "$f"; } > "fuzz/corpus/hw_parsers/seed-$(basename "$host")_route_fib"
  fi
done

# --- build ------------------------------------------------------------------------------
echo "building fuzz targets (from scratch: about 5 minutes on 2 cores)"
if [[ ${#targets[@]} -eq ${#all_targets[@]} ]]; then
  env "${build_env[@]}" cargo fuzz build -s "$sanitizer" "${target_dir[@]}"
else
  for t in "${targets[@]}"; do
    env "${build_env[@]}" cargo fuzz build -s "$sanitizer" "${target_dir[@]}" "$t"
  done
fi

# --- run --------------------------------------------------------------------------------
mkdir -p fuzz/artifacts/logs
status=0
summary=()
for t in "${targets[@]}"; do
  mkdir -p "fuzz/artifacts/$t"
  before=$(ls "fuzz/artifacts/$t")
  dict=()
  [[ -f fuzz/dict/$t.dict ]] && dict=("-dict=$root/fuzz/dict/$t.dict")
  [[ $t == config_parse ]] && dict=("-dict=$root/fuzz/dict/config.dict")
  log=fuzz/artifacts/logs/$t.log
  echo "== $t: ${secs}s (corpus $(ls "fuzz/corpus/$t" | wc -l) files, log $log)"
  set +e
  # stdin from /dev/null: a config may name /dev/stdin as a file to read.
  # shellcheck disable=SC2086
  env "${build_env[@]}" cargo fuzz run -s "$sanitizer" "${target_dir[@]}" "$t" "fuzz/corpus/$t" -- \
    -max_total_time="$secs" -print_final_stats=1 -timeout=10 -rss_limit_mb=2048 \
    "${dict[@]}" ${FUZZ_ARGS:-} </dev/null >"$log" 2>&1
  rc=$?
  set -e
  execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' | tail -n 1)
  [[ -n $execs ]] || execs=$(grep -oE '^#[0-9]+' "$log" | tail -n 1 | tr -d '#')
  new=$(comm -13 <(echo "$before") <(ls "fuzz/artifacts/$t") | grep -E '^(crash|timeout|oom|leak|slow-unit)-' || true)
  crashes=$(grep -cE '^(crash|timeout|oom|leak)-' <<<"$new" || true)
  line="$t: execs ${execs:-?}, crashes ${crashes}"
  if [[ $rc -ne 0 || $crashes -gt 0 ]]; then
    status=1
    line+=" (libFuzzer exit $rc)"
    for a in $new; do line+=$'\n'"    input: fuzz/artifacts/$t/$a"; done
    why=$(grep -m1 -E -A1 "panicked at|ERROR: libFuzzer|SUMMARY:" "$log" || true)
    [[ -z $why ]] || line+=$'\n'"$(sed 's/^/    /' <<<"$why")"
    echo "--- tail of $log"; tail -n 30 "$log"
  fi
  echo "$line"
  summary+=("$line")
done

echo
echo "== fuzz summary (${secs}s per target, sanitizer $sanitizer)"
printf '%s\n' "${summary[@]}"
if [[ $status -ne 0 ]]; then
  echo "FAILED: reproduce with: cargo fuzz run -s $sanitizer TARGET fuzz/artifacts/TARGET/<file>" >&2
fi
exit $status
