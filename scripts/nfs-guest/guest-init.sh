#!/bin/bash
# trainio NFS guest, stage 2: PID 1 in the guest's root. Shipped in every run's payload as
# /payload/.trainio/init.sh (so changing it needs no image rebuild) and started by the
# initramfs with switch_root.
#
# Sets up an NFS server and two client mounts of it over loopback, runs /payload/script.sh with
#   NFS41=/mnt/nfs41 (vers=4.1)  NFS3=/mnt/nfs3 (vers=3,nolock)  EXPORT=/export (the server's
#   directory, ext4 on its own virtio disk)  OUT=/out (copied back to the host)  PAYLOAD=/payload
# and writes to /out: stdout, stderr, returncode, setup.log, mountinfo, mountstats, dmesg,
# uname, timing. /out goes back as a tar on the disk with serial trainio-out; then power off.
# Console lines starting with "TRAINIO-GUEST:" are markers the host reads.
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export HOME=/root LANG=C.UTF-8
BB=/usr/local/bin/busybox
cd /

mark() { echo "TRAINIO-GUEST: $* uptime=$(cut -d' ' -f1 /proc/uptime)" >/dev/console; }
export -f mark # the script can name its steps: `mark step NAME`
find_disk() { # serial -> /dev/vdX (bash builtins only: forks are slow under TCG)
  local d s
  for d in /sys/block/vd*; do
    s=
    read -r s <"$d/serial" 2>/dev/null
    [ "$s" = "$1" ] && { echo "/dev/${d##*/}"; return 0; }
  done
  return 1
}
power_off() {
  sync
  echo o >/proc/sysrq-trigger
  sleep 5
  $BB poweroff -f
}
# PID 1 must never exit: whatever happens, end by powering off.
trap power_off EXIT

# busybox's mount: static, so much cheaper to start than util-linux's under TCG.
$BB mount -t proc proc /proc
$BB mount -t sysfs sysfs /sys
mark "stage2-start"
mkdir -p /dev/pts /dev/shm /out
$BB mount -t devpts devpts /dev/pts
$BB mount -t tmpfs tmpfs /dev/shm
$BB mount -t tmpfs tmpfs /run
$BB mount -t tmpfs tmpfs /tmp
$BB mount -t tracefs tracefs /sys/kernel/tracing
$BB mount -t debugfs debugfs /sys/kernel/debug
$BB mount -t bpf bpf /sys/fs/bpf 2>/dev/null
mkdir -p /run/rpcbind /run/rpc_pipefs /var/lib/nfs/v4recovery

# Settings the host put next to the script (SCRIPT_TIMEOUT).
SCRIPT_TIMEOUT=300
[ -f /payload/.trainio/config ] && . /payload/.trainio/config

echo "$(cut -d' ' -f1 /proc/uptime)" >/out/.uptime_stage2
setup() {
  PS4='+ ${EPOCHREALTIME} '
  set -x
  hostname trainio-guest
  $BB ip link set lo up
  # nfsd without the nfsdcltrack upcall: every exec of it (at start and per client) costs
  # seconds under TCG; a missing program makes nfsd fall back to in-kernel legacy tracking in
  # /var/lib/nfs/v4recovery. The client and server modules load in parallel.
  modprobe sunrpc || return 1
  modprobe nfsd cltrack_prog=/nonexistent & local p1=$!
  modprobe -a nfs nfsv3 nfsv4 & local p2=$!
  wait $p1 || return 1
  wait $p2 || return 1
  mount -t nfsd nfsd /proc/fs/nfsd || return 1
  mount -t rpc_pipefs sunrpc /run/rpc_pipefs || return 1
  local dev
  dev=$(find_disk trainio-export) || return 1
  mount -t ext4 -o noinit_itable "$dev" /export || return 1
  chmod 1777 /export
  rpcbind || return 1
  echo "/export 127.0.0.1(rw,no_root_squash,insecure,no_subtree_check,sync)" >/etc/exports
  exportfs -ra || return 1
  rpc.mountd || return 1
  rpc.nfsd 8 || return 1
  echo Y >/proc/fs/nfsd/v4_end_grace || return 1
  mount -t nfs -o vers=4.1 127.0.0.1:/export /mnt/nfs41 || return 1
  mount -t nfs -o vers=3,nolock 127.0.0.1:/export /mnt/nfs3 || return 1
  set +x
}
setup >/out/setup.log 2>&1
setup_rc=$?
echo "$setup_rc" >/out/setup_rc
uname -r >/out/uname

if [ "$setup_rc" = 0 ]; then
  chmod +x /payload/script.sh 2>/dev/null
  t0=$(cut -d' ' -f1 /proc/uptime)
  mark "script-start"
  (cd /payload && exec env NFS41=/mnt/nfs41 NFS3=/mnt/nfs3 EXPORT=/export OUT=/out PAYLOAD=/payload \
    timeout -k 5 "$SCRIPT_TIMEOUT" bash /payload/script.sh </dev/null >/out/stdout 2>/out/stderr)
  echo $? >/out/returncode
  t1=$(cut -d' ' -f1 /proc/uptime)
  mark "script-end rc=$(cat /out/returncode)"
else
  mark "setup-failed rc=$setup_rc"
  tail -n 20 /out/setup.log >/dev/console
  t0= t1=
fi

cat /proc/self/mountinfo >/out/mountinfo
cat /proc/self/mountstats >/out/mountstats
dmesg >/out/dmesg 2>&1
printf 'stage1_to_stage2_uptime=%s\nscript_start_uptime=%s\nscript_end_uptime=%s\n' \
  "$(cat /out/.uptime_stage2)" "$t0" "$t1" >/out/timing
rm -f /out/.uptime_stage2

if outdev=$(find_disk trainio-out); then
  if tar -c -f "$outdev" -C /out . 2>/tmp/tar.err; then
    sync
    mark "output-written"
  else
    mark "output-failed $(head -c 300 /tmp/tar.err)"
  fi
else
  mark "output-failed no disk with serial trainio-out"
fi
mark "poweroff"
