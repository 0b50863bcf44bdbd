#!/usr/bin/env bash
# What `trainio record --io-uring` costs an io_uring reader: fio 4 KiB random O_DIRECT reads,
# io_uring, iodepth 32, on a loop device over /dev/shm, 5 s per run, in ABBA rounds of
# three arms: untraced, `record` (block and file layers: fio's requests are block rows
# only), and `record --io-uring` (each request also a file-layer row). Prints each run's
# IOPS, then each arm's mean and its ratio to the untraced and default arms. Needs root.
# ROUNDS (default 3) sets the number of rounds.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
T="$root/bin/trainio"
rounds="${ROUNDS:-3}"
[ "$(id -u)" = 0 ] || { echo "bench-io-uring: needs root (loop device, BPF)" >&2; exit 2; }
work="$(mktemp -d /tmp/trainio-bench-uring.XXXXXX)"
img="/dev/shm/trainio-bench-uring-$$.img"
dev=""
cleanup() { [ -n "$dev" ] && losetup -d "$dev"; rm -f "$img"; rm -rf "$work"; }
trap cleanup EXIT
truncate -s 512M "$img"
dev="$(losetup --find --show --direct-io=on "$img")"
fio_cmd=(fio --name=b --filename="$dev" --direct=1 --ioengine=io_uring --iodepth=32 --rw=randread --bs=4k
  --time_based --runtime=5 --output-format=json)
iops() { python3 -c 'import json,sys; t=sys.stdin.read(); print(json.loads(t[t.index("{"):])["jobs"][0]["read"]["iops"])'; }
run() {
  rm -rf "$work/t"
  case "$1" in
    untraced) "${fio_cmd[@]}" | iops ;;
    record) "$T" record -q -o "$work/t" --dev "$dev" -- "${fio_cmd[@]}" | iops ;;
    io-uring) "$T" record -q --io-uring -o "$work/t" --dev "$dev" -- "${fio_cmd[@]}" | iops ;;
  esac
}
out="$work/runs"
for _ in $(seq "$rounds"); do
  for arm in untraced record io-uring io-uring record untraced; do
    v="$(run "$arm")"
    echo "$arm $v" | tee -a "$out"
  done
done
python3 - "$out" <<'PY'
import sys, statistics as st
runs = {}
for line in open(sys.argv[1]):
    arm, v = line.split()
    runs.setdefault(arm, []).append(float(v))
m = {a: st.mean(v) for a, v in runs.items()}
for a, v in runs.items():
    print(f"{a:9} mean {m[a]:10.0f} IOPS  (min {min(v):.0f}, max {max(v):.0f}, {len(v)} runs)")
print(f"record            {m['record'] / m['untraced']:.1%} of untraced")
print(f"record --io-uring {m['io-uring'] / m['untraced']:.1%} of untraced, {m['io-uring'] / m['record']:.1%} of record;"
      f" {1e6 / m['io-uring'] - 1e6 / m['record']:.2f} µs more per request")
PY
