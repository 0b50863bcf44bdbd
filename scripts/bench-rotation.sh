#!/usr/bin/env bash
# A/B rotation for tracer variants (docs/design/recorder.md, "Where the 4 KiB cost goes"):
# 4 KiB random O_DIRECT reads, io_uring QD32, on a fresh 1 GiB loop device over /dev/shm,
# untraced and under each variant in turn, the order reversed every round, then each
# variant's IOPS summed over the rounds as a % of untraced.
#
#   scripts/bench-rotation.sh VARIANT...     (ROUNDS=8 SECONDS_PER_RUN=4 by default)
#
# A VARIANT is a trainio-record executable, with record options if any, as one word
# (e.g. copies of target/release/trainio-record from different builds, or
# "target/release/trainio-record --layers block"; it runs fio as its command), or
# `bpftrace-count` (count() on the two block tracepoints, recording nothing). Needs root.
set -euo pipefail
ROUNDS=${ROUNDS:-8}
RT=${SECONDS_PER_RUN:-4}
[ $# -ge 1 ] || { echo "usage: $0 VARIANT..." >&2; exit 2; }
work=$(mktemp -d /tmp/trainio-rotation-XXXXXX)
img=/dev/shm/trainio-rotation-$$.img
dev=""
cleanup() {
  [ -n "$dev" ] && losetup -d "$dev" 2>/dev/null || true
  rm -f "$img"; rm -rf "$work"
}
trap cleanup EXIT
head -c 1G /dev/urandom > "$img"
dev=$(losetup --find --show --direct-io=on "$img")
fio=(fio --name=b --filename="$dev" --direct=1 --ioengine=io_uring --time_based --runtime="$RT"
     --output-format=terse --group_reporting --rw=randread --bs=4k --iodepth=32 --norandommap
     --randrepeat=0)
iops() { cut -d';' -f8; }
run() {
  case "$1" in
    none) "${fio[@]}" | iops ;;
    bpftrace-count)
      bpftrace -e 'tracepoint:block:block_rq_issue { @i = count(); }
                   tracepoint:block:block_rq_complete { @c = count(); }' > "$work/bt.out" 2>&1 &
      local bt=$!
      for _ in $(seq 100); do grep -q Attaching "$work/bt.out" && break; sleep 0.1; done
      sleep 0.5
      "${fio[@]}" | iops
      kill -INT $bt; wait $bt || true ;;
    *) local rec; read -ra rec <<< "$1"
       rm -rf "$work/trace"; "${rec[@]}" -q -o "$work/trace" --dev "$dev" -- "${fio[@]}" 2>/dev/null | iops ;;
  esac
}
names=(none "$@")
declare -A sum
for r in $(seq "$ROUNDS"); do
  order=("${names[@]}")
  if (( r % 2 == 0 )); then order=(); for ((k=${#names[@]}-1; k>=0; k--)); do order+=("${names[k]}"); done; fi
  line="round $r:"
  for v in "${order[@]}"; do
    t=$(run "$v"); sum[$v]=$(( ${sum[$v]:-0} + t )); line+=" [$v]=$t"
  done
  echo "$line"
done
for v in "$@"; do
  awk -v t="${sum[$v]}" -v u="${sum[none]}" -v n="$v" 'BEGIN { printf "%s: %.1f%% of untraced\n", n, 100 * t / u }'
done
