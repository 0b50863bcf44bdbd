#!/usr/bin/env bash
# The demo (README command one, via `make demo`): on a loop device over a file, record a
# scaled-down unet3d-like training at 4 simulated GPUs, analyze it, write the HTML report,
# replay the recorded trace at 16 GPUs (recorded too), compare, and sweep for the most GPUs
# the device keeps >= 90% busy. Devices and mounts are cleaned up however it ends.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
T="$root/bin/trainio"
workload="${TRAINIO_DEMO_WORKLOAD:-$root/configs/demo-unet3d.yaml}"
out="${TRAINIO_DEMO_OUT:-$root/results/demo-$(date +%Y%m%d-%H%M%S)}"
size_mb="${TRAINIO_DEMO_DEVICE_MB:-1536}"

[ "$(id -u)" = 0 ] || { echo "demo: needs root (loop device, BPF)" >&2; exit 2; }
[ -e "$out" ] && [ -n "$(ls -A "$out")" ] && { echo "demo: $out is not empty" >&2; exit 2; }
mkdir -p "$out"
work="$(mktemp -d /tmp/trainio-demo.XXXXXX)"
backing="/dev/shm/trainio-demo-$$.img"
loop="" mnt="$work/mnt"
cleanup() {
  set +e
  mountpoint -q "$mnt" && umount "$mnt"
  [ -n "$loop" ] && losetup -d "$loop"
  rm -f "$backing"
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

step() { printf '\n== %s\n' "$*"; }

step "device: ${size_mb} MiB loop device over /dev/shm, ext4, O_DIRECT reads"
truncate -s "${size_mb}M" "$backing"
loop="$(losetup --find --show --direct-io=on "$backing")"
# No lazy inode-table init and no atime updates: neither may write while the runs read.
mkfs.ext4 -q -E nodiscard,lazy_itable_init=0,lazy_journal_init=0 "$loop"
mkdir -p "$mnt"
mount -o noatime "$loop" "$mnt"
echo "$loop mounted on $mnt"

step "datagen: $(basename "$workload") for 16 simulated GPUs"
"$T" datagen --workload "$workload" --data-dir "$mnt/data" --gpus 16

step "record: emulated training, 4 simulated GPUs (one process each), traced with trainio record"
OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
  "$T" record -q -o "$out/original" --dev "$loop" -- \
  mpirun --oversubscribe --bind-to none -np 4 \
  "$T" replay -q --workload "$workload" --data-dir "$mnt/data" --gpus 4 --odirect \
  --io-engine psync --json "$out/original-replay.json"

step "analyze: the recorded trace (block layer)"
"$T" analyze "$out/original" --layer block
"$T" analyze "$out/original" --layer block --json > "$out/original-analysis.json"
"$T" analyze "$out/original" --layer file --json > "$out/original-file-analysis.json"

step "replay: the recorded trace at 16 simulated GPUs, recorded too"
"$T" replay -q --trace "$out/original" --data-dir "$mnt/trace-data" --generate --gpus 16 --odirect \
  --json "$out/replay-16.json" --record "$out/replay-16"

step "compare: original (4 GPUs) vs replay (16 GPUs), block layer"
"$T" compare "$out/original" "$out/replay-16" --layer block
"$T" compare "$out/original" "$out/replay-16" --layer block --json > "$out/compare.json"

step "report"
"$T" report "$out/original" "$out/replay-16" -o "$out/report.html"

step "sweep: most simulated GPUs kept >= 90% busy"
"$T" sweep -q --workload "$workload" --data-dir "$mnt/sweep-data" --generate --odirect --max-gpus 64 --steps 4 \
  --json "$out/sweep.json"

step "summary"
"$root/.venv/bin/python" - "$out" <<'PY'
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
load = lambda n: json.loads((out / n).read_text())
orig, rep, an, cmp_, sweep = (load(n) for n in ("original-replay.json", "replay-16.json",
                                                 "original-analysis.json", "compare.json", "sweep.json"))
print(f"emulated training : {orig['gpus']} GPUs, AU {orig['au_percent']:.1f}%, {orig['throughput_mib_s']:.0f} MiB/s")
print(f"replay of trace   : {rep['gpus']} GPUs, {rep['steps']} steps x {rep['epochs']} epochs, AU {rep['au_percent']:.1f}%, "
      f"{rep['throughput_mib_s']:.0f} MiB/s (the recorded reads spread over 16 GPUs)")
def top(hist, n=6):
    items = sorted(((int(k), v) for k, v in hist.items()), key=lambda kv: -kv[1])[:n]
    return "  ".join(f"QD{k}:{v:.0%}" for k, v in sorted(items))
print(f"recorded QD per issue (block, top 6): {top(an.get('qd_hist_issue', {}))}")
print(f"recorded time at QD   (block, top 6): {top(an.get('qd_hist_time', {}))}")
print(f"replay vs original    : throughput x{1 + cmp_['throughput_rel_error']:.1f}, "
      f"QD W1 per issue {cmp_['qd_w1_issue']:.1f}, time-weighted {cmp_['qd_w1_time']:.2f} "
      "(4 recorded GPUs replayed as 16: the replay is meant to differ)")
most = sweep.get('max_gpus', sweep.get('supported_gpus'))
print(f"sweep of the {sweep['workload']} config (4 steps per epoch at every GPU count): most GPUs kept "
      f">= {sweep['threshold_percent']:.0f}% busy: "
      + (f"{most} or more (the sweep stops at --max-gpus {most})" if sweep.get('limited_by_max_gpus') else f"{most}"))
print(f"report: {out / 'report.html'}")
PY
