#!/usr/bin/env bash
# The demo (README command one, via `make demo`): a loop device over a file, throttled by a
# cgroup to stand for a drive that reads TRAINIO_DEMO_DRIVE_MIBS MiB/s (200 by default);
# on it, record a scaled-down unet3d-like training at 2 simulated GPUs (40 steps), analyze
# it, replay the recorded trace at 4 GPUs (recorded too), compare, sweep for the GPU count
# at which AU falls below 90%, and write the HTML report with the sweep's curve. Devices,
# mounts and the cgroup are cleaned up however it ends.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
T="$root/bin/trainio"
workload="${TRAINIO_DEMO_WORKLOAD:-$root/configs/demo-unet3d.yaml}"
out="${TRAINIO_DEMO_OUT:-$root/results/demo-$(date +%Y%m%d-%H%M%S)}"
size_mb="${TRAINIO_DEMO_DEVICE_MB:-1536}"
drive_mibs="${TRAINIO_DEMO_DRIVE_MIBS:-200}"
gpus=2 replay_gpus=4 steps=20
# The sweep's runs are one epoch of 60 steps: the batches prefetched before the first step
# ends (which AU leaves out, as DLIO does) are then a few percent of the epoch, so AU
# measures the drive and not the pipeline fill.
sweep_steps=60

[ "$(id -u)" = 0 ] || { echo "demo: needs root (loop device, cgroup, BPF)" >&2; exit 2; }
[[ "$drive_mibs" =~ ^[1-9][0-9]*$ ]] || { echo "demo: TRAINIO_DEMO_DRIVE_MIBS=$drive_mibs: not a positive integer (MiB/s)" >&2; exit 2; }
# The read throttle: cgroup v2 io.max where the v2 hierarchy has the io controller, else
# v1 blkio (as the tests throttle: throttled_cgroup in tests/trainio_testlib.py).
cgbase="" cgver=""
for cand in /sys/fs/cgroup /sys/fs/cgroup/unified; do
  if grep -qw io "$cand/cgroup.controllers" 2>/dev/null; then cgbase="$cand" cgver=2; break; fi
done
if [ -z "$cgbase" ] && [ -e /sys/fs/cgroup/blkio/blkio.throttle.read_bps_device ]; then
  cgbase=/sys/fs/cgroup/blkio cgver=1
fi
[ -n "$cgbase" ] || { echo "demo: no cgroup read throttle: neither a cgroup-v2 io controller nor v1 blkio" >&2; exit 2; }
[ -e "$out" ] && [ -n "$(ls -A "$out")" ] && { echo "demo: $out is not empty" >&2; exit 2; }
mkdir -p "$out"
work="$(mktemp -d /tmp/trainio-demo.XXXXXX)"
backing="/dev/shm/trainio-demo-$$.img"
loop="" mnt="$work/mnt" cg=""
cleanup() {
  set +e
  if [ -n "$cg" ] && [ -d "$cg" ]; then
    # Only the demo's own processes are in the group: stop them, then remove it.
    for _ in $(seq 50); do
      pids="$(cat "$cg/cgroup.procs" 2>/dev/null)"
      [ -z "$pids" ] && break
      kill -KILL $pids 2>/dev/null; sleep 0.1
    done
    rmdir "$cg"
  fi
  mountpoint -q "$mnt" && umount "$mnt"
  [ -n "$loop" ] && losetup -d "$loop"
  rm -f "$backing"
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

step() { printf '\n== %s\n' "$*"; }
# Runs a command inside the throttled cgroup (its children are born there).
throttled() { sh -c 'echo $$ > "$0" && exec "$@"' "$cg/cgroup.procs" "$@"; }

step "device: ${size_mb} MiB loop device over /dev/shm, ext4, O_DIRECT reads, reads capped at ${drive_mibs} MiB/s"
truncate -s "${size_mb}M" "$backing"
loop="$(losetup --find --show --direct-io=on "$backing")"
# No lazy inode-table init and no atime updates: neither may write while the runs read.
mkfs.ext4 -q -E nodiscard,lazy_itable_init=0,lazy_journal_init=0 "$loop"
mkdir -p "$mnt"
mount -o noatime "$loop" "$mnt"
majmin="$(lsblk -ndo MAJ:MIN "$loop" | tr -d ' ')"
cg="$cgbase/trainio-demo-$$"
if [ "$cgver" = 2 ]; then
  grep -qw io "$cgbase/cgroup.subtree_control" || echo +io > "$cgbase/cgroup.subtree_control"
  mkdir "$cg"
  echo "$majmin rbps=$((drive_mibs << 20))" > "$cg/io.max"
else
  mkdir "$cg"
  echo "$majmin $((drive_mibs << 20))" > "$cg/blkio.throttle.read_bps_device"
fi
echo "$loop ($majmin) mounted on $mnt; the runs read it through cgroup v$cgver $cg: a ${drive_mibs} MiB/s drive"

step "datagen: $(basename "$workload") for $replay_gpus simulated GPUs, $steps steps per epoch"
"$T" datagen --workload "$workload" --data-dir "$mnt/data" --gpus "$replay_gpus" --steps "$steps"

step "record: emulated training, $gpus simulated GPUs (one process each), $steps steps x 2 epochs, traced with trainio record"
OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
  "$T" record -q -o "$out/original" --dev "$loop" -- \
  sh -c 'echo $$ > "$0" && exec "$@"' "$cg/cgroup.procs" \
  mpirun --oversubscribe --bind-to none -np "$gpus" \
  "$T" replay -q --workload "$workload" --data-dir "$mnt/data" --gpus "$gpus" --steps "$steps" --odirect \
  --io-engine psync --json "$out/original-replay.json"

step "analyze: the recorded trace (block layer)"
"$T" analyze "$out/original" --layer block
"$T" analyze "$out/original" --layer block --json > "$out/original-analysis.json"
"$T" analyze "$out/original" --layer file --json > "$out/original-file-analysis.json"

step "replay: the recorded trace at $replay_gpus simulated GPUs, recorded too"
throttled "$T" replay -q --trace "$out/original" --data-dir "$mnt/trace-data" --generate --gpus "$replay_gpus" --odirect \
  --json "$out/replay-$replay_gpus.json" --record "$out/replay-$replay_gpus"

step "compare: original ($gpus GPUs) vs replay ($replay_gpus GPUs), block layer of the drive"
"$T" compare "$out/original" "$out/replay-$replay_gpus" --layer block --dev "$majmin"
"$T" compare "$out/original" "$out/replay-$replay_gpus" --layer block --dev "$majmin" --json > "$out/compare.json"

step "sweep: the GPU count at which AU falls below 90% on the ${drive_mibs} MiB/s drive"
throttled "$T" sweep -q --workload "$workload" --data-dir "$mnt/data" --generate --odirect --max-gpus 64 \
  --steps "$sweep_steps" --param train.epochs=1 --json "$out/sweep.json"

step "report (with the sweep's AU curve)"
"$T" report "$out/original" "$out/replay-$replay_gpus" --sweep "$out/sweep.json" -o "$out/report.html"

step "summary"
"$root/.venv/bin/python" - "$out" "$drive_mibs" "$cgver" "$replay_gpus" <<'PY'
import json, sys
from pathlib import Path
out, drive, cgver, replay_gpus = Path(sys.argv[1]), float(sys.argv[2]), sys.argv[3], sys.argv[4]
load = lambda n: json.loads((out / n).read_text())
orig, rep, an, cmp_, sweep = (load(n) for n in (
    "original-replay.json", f"replay-{replay_gpus}.json", "original-analysis.json",
    "compare.json", "sweep.json"))
st = orig["settings"]
need = st["batch_size"] * st["nominal_sample_bytes"] / st["computation_time_mean_s"] / 2**20
print(f"drive             : reads capped at {drive:.0f} MiB/s (cgroup v{cgver} throttle on the loop device)")
print(f"emulated training : {orig['gpus']} GPUs, {orig['steps']} steps each ({orig['epochs']} epochs), "
      f"AU {orig['au_percent']:.1f}%, {orig['throughput_mib_s']:.0f} MiB/s; one GPU needs {need:.0f} MiB/s "
      f"({st['batch_size']} x {st['nominal_sample_bytes'] / 2**20:g} MiB per {st['computation_time_mean_s']:g} s step)")
gm = (json.loads((out / "original-file-analysis.json").read_text()).get("job_model") or {}).get("gpus") or []
if gm:
    steps = sorted(len(g["steps"]) for g in gm)
    print(f"model of the trace: {len(gm)} GPUs, {steps[0]}{'' if steps[0] == steps[-1] else '-%d' % steps[-1]} steps each, "
          f"compute {gm[0]['compute_s'] * 1e3:.1f} ms/step, {gm[0]['bytes_per_step'] / 2**20:.1f} MiB/step: "
          f"one GPU needs {gm[0]['required_mib_s']:.0f} MiB/s")
print(f"replay of trace   : {rep['gpus']} GPUs, {rep['steps']} steps x {rep['epochs']} epochs, AU {rep['au_percent']:.1f}%, "
      f"{rep['throughput_mib_s']:.0f} MiB/s (the recorded job at {rep['gpus']} GPUs on the same drive)")
def top(hist, n=6):
    items = sorted(((int(k), v) for k, v in hist.items()), key=lambda kv: -kv[1])[:n]
    return "  ".join(f"QD{k}:{v:.0%}" for k, v in sorted(items))
print(f"recorded QD per issue (block, top 6): {top(an.get('qd_hist_issue', {}))}")
print(f"recorded time at QD   (block, top 6): {top(an.get('qd_hist_time', {}))}")
print(f"replay vs original    : throughput x{1 + cmp_['throughput_rel_error']:.2f}, "
      f"QD W1 per issue {cmp_['qd_w1_issue']:.1f}, time-weighted {cmp_['qd_w1_time']:.2f}")
sweep_runs = sweep["runs"][0]["steps"] if sweep.get("runs") else "?"
curve = sorted(sweep["curve"], key=lambda pt: pt["gpus"])
thr = sweep["threshold_percent"]
print(f"sweep ({sweep_runs} steps per run), AU by GPU count: " + "  ".join(f"{pt['gpus']}:{pt['au_percent']:.0f}%" for pt in curve))
most = sweep["supported_gpus"]
fail = [pt["gpus"] for pt in curve if not pt["pass"]]
if sweep.get("limited_by_max_gpus") or not fail:
    print(f"AU stays >= {thr:.0f}% up to {most} GPUs (the sweep stops at --max-gpus)")
else:
    print(f"AU falls below {thr:.0f}% at {min(fail)} GPUs: the {drive:.0f} MiB/s drive keeps {most} GPU(s) >= {thr:.0f}% busy "
          f"(bandwidth / need = {drive:.0f} / {need:.0f} = {drive / need:.1f} GPUs)")
print(f"report: {out / 'report.html'}")
PY
