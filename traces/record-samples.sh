#!/usr/bin/env bash
# Re-records the sample traces in this directory (root): the demo unet3d-like workload,
# emulated at 1 and at 8 simulated GPUs, on a loop device over /dev/shm, O_DIRECT, with
# block and file layers. Each is a few hundred KiB.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
T="$here/../bin/trainio"
work="$(mktemp -d /tmp/trainio-samples.XXXXXX)"
img="/dev/shm/trainio-samples-$$.img"
loop=""
cleanup() { set +e; mountpoint -q "$work/mnt" && umount "$work/mnt"; [ -n "$loop" ] && losetup -d "$loop"; rm -f "$img"; rm -rf "$work"; }
trap cleanup EXIT
truncate -s 1G "$img"
loop="$(losetup --find --show --direct-io=on "$img")"
mkfs.ext4 -q -E nodiscard "$loop"
mkdir "$work/mnt" && mount "$loop" "$work/mnt"
"$T" datagen --workload "$here/../configs/demo-unet3d.yaml" --data-dir "$work/mnt/data" --gpus 8 --steps 20
for gpus in 1 8; do
  out="$here/unet3d-demo-${gpus}gpu"
  rm -rf "$out"
  "$T" record -q -o "$out" --dev "$loop" -- "$T" replay -q --workload "$here/../configs/demo-unet3d.yaml" \
    --data-dir "$work/mnt/data" --gpus "$gpus" --steps 20 --odirect --io-engine psync --json /dev/null
done
