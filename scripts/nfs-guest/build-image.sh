#!/usr/bin/env bash
# Builds, once, the QEMU guest the NFS tests boot: Debian 12's cloud kernel, a small busybox
# initramfs that loads the virtio modules and switches to an ext4 root image made from a
# debootstrap minbase root (NFS server + client, rpcbind, kmod, fio, util-linux, the libraries
# the recorder links, bpftool), and an empty ext4 image the guest exports over NFS. Everything
# goes into a cache directory outside the repository; a complete cache with the current recipe
# version is reused as is. Design and measurements: docs/design/nfs-guest.md.
#
#   scripts/nfs-guest/build-image.sh            build if needed, print the cache path last
#   TRAINIO_GUEST_CACHE=/somewhere ...           other cache directory
#   TRAINIO_GUEST_MIRROR=http://... ...          override the Debian mirror (default: the one
#                                                this machine's apt configuration uses)
#
# Root only (debootstrap, chroot). No loop devices and no mounts of our own: mke2fs -d fills the
# images from directories. The only mounts are those debootstrap makes inside the root it builds;
# the exit trap unmounts anything left under the work directory.
set -euo pipefail

# Bump when anything below changes what ends up in the cache: the next run rebuilds.
# 1: first recipe. 2: libelf1, zlib1g (the recorder links them dynamically) and bpftool.
RECIPE_VERSION=2

CACHE=${TRAINIO_GUEST_CACHE:-/var/cache/trainio/nfs-guest}
SUITE=bookworm
KERNEL_META=linux-image-cloud-amd64
GUEST_PACKAGES=nfs-kernel-server,nfs-common,rpcbind,kmod,fio,util-linux,e2fsprogs,procps,libelf1,zlib1g,bpftool
# Modules the initramfs loads to reach the root disk (dependencies are added from modules.dep;
# built-in ones are skipped).
INITRAMFS_MODULES=(virtio_pci virtio_blk crc32c_generic crc32c-intel ext4)
EXPORT_IMAGE_SIZE=4G

log() { echo "build-image: $*" >&2; }
die() { log "error: $*"; exit 1; }

stamp_ok() {
  [ -f "$CACHE/stamp" ] && grep -qx "recipe=$RECIPE_VERSION" "$CACHE/stamp" &&
    [ -f "$CACHE/vmlinuz" ] && [ -f "$CACHE/initrd.img" ] && [ -f "$CACHE/root.img" ] &&
    [ -f "$CACHE/export.img" ]
}

[ "$(id -u)" = 0 ] || die "must run as root (debootstrap, chroot)"
for tool in debootstrap mke2fs cpio gzip apt-get dpkg-deb findmnt flock; do
  command -v "$tool" >/dev/null || die "$tool not found: run scripts/install-deps.sh"
done
# The initramfs has no libc: its busybox must be the static one (package busybox-static, which
# replaces the dynamically linked package busybox and its /bin/busybox).
BUSYBOX=/bin/busybox
dpkg-query -W -f='${Status}' busybox-static 2>/dev/null | grep 'install ok installed' >/dev/null &&
  [ -x "$BUSYBOX" ] || die "static busybox not found: install busybox-static"

mkdir -p "$(dirname "$CACHE")"
# One builder at a time (concurrent test sessions); the others wait and then reuse the cache.
exec 9>"$CACHE.lock"
flock 9

if stamp_ok; then
  log "cache complete (recipe $RECIPE_VERSION): $CACHE"
  echo "$CACHE"
  exit 0
fi

start=$(date +%s.%N)
WORK="$CACHE.build.$$"
cleanup() {
  local rc=$?
  # Unmount whatever debootstrap left mounted inside the root (deepest first), then delete.
  if [ -d "$WORK" ]; then
    findmnt -rn -o TARGET | awk -v w="$WORK/" 'index($0, w) == 1' | sort -r |
      while read -r m; do umount -l "$m" || true; done
    rm -rf "$WORK"
  fi
  ((rc == 0)) || log "failed (rc=$rc); cache left unchanged"
}
trap cleanup EXIT
rm -rf "$WORK"
mkdir -p "$WORK" "$CACHE/debs"

# --- The mirror: the first URI apt on this machine uses for "$SUITE" main. ---------------------
mirror_from_apt() {
  local f
  # deb822 .sources files: stanzas separated by blank lines.
  for f in /etc/apt/sources.list.d/*.sources; do
    [ -f "$f" ] || continue
    awk -v suite="$SUITE" '
      function flush() {
        if (types ~ /(^| )deb( |$)/ && (" " suites " ") ~ (" " suite " ") && uris != "" &&
            enabled != "no") { split(uris, u, " "); print u[1]; found = 1; exit }
        types = suites = uris = ""; enabled = ""
      }
      /^[ \t]*#/ { next }
      /^[ \t]*$/ { flush(); next }
      { key = tolower($1); sub(/:$/, "", key); $1 = ""; sub(/^ +/, "")
        if (key == "types") types = $0; else if (key == "suites") suites = $0
        else if (key == "uris") uris = $0; else if (key == "enabled") enabled = tolower($0) }
      END { if (!found) flush() }' "$f"
  done
  # One-line format: deb [options] URI SUITE COMPONENTS...
  for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
    [ -f "$f" ] || continue
    awk -v suite="$SUITE" '
      $1 == "deb" { i = 2; if ($2 ~ /^\[/) { while (i <= NF && $i !~ /\]$/) i++; i++ }
                    if ($(i + 1) == suite) { print $i; exit } }' "$f"
  done
}
MIRROR=${TRAINIO_GUEST_MIRROR:-$(mirror_from_apt | head -n1 || true)}
[ -n "$MIRROR" ] || die "no '$SUITE' source in /etc/apt/sources.list*; set TRAINIO_GUEST_MIRROR"
log "mirror (from apt configuration): $MIRROR"

# --- The kernel: Debian's cloud kernel package, from apt's cache or apt-get download. ----------
apt-cache show "$KERNEL_META" >/dev/null 2>&1 || apt-get update -qq
KPKG=$(apt-cache depends "$KERNEL_META" | awk '/Depends: linux-image-[0-9]/ { print $2; exit }')
[ -n "$KPKG" ] || die "cannot resolve $KERNEL_META to a kernel package"
KVER=${KPKG#linux-image-}
deb=$(ls -1 /var/cache/apt/archives/"${KPKG}"_*.deb "$CACHE/debs/${KPKG}"_*.deb 2>/dev/null | tail -n1 || true)
if [ -z "$deb" ]; then
  log "downloading $KPKG"
  (cd "$CACHE/debs" && apt-get download -q -o APT::Sandbox::User=root "$KPKG" >&2)
  deb=$(ls -1 "$CACHE/debs/${KPKG}"_*.deb | tail -n1)
fi
log "kernel: $KVER ($deb)"
dpkg-deb -x "$deb" "$WORK/kernel"
[ -f "$WORK/kernel/boot/vmlinuz-$KVER" ] || die "no vmlinuz-$KVER in $deb"

# --- The root: debootstrap minbase + the packages the tests need. -------------------------------
ROOT="$WORK/root"
log "debootstrap $SUITE minbase + $GUEST_PACKAGES"
mkdir -p "$CACHE/debs/debootstrap"
if ! debootstrap --variant=minbase --include="$GUEST_PACKAGES" \
  --cache-dir="$CACHE/debs/debootstrap" "$SUITE" "$ROOT" "$MIRROR" >"$WORK/debootstrap.log" 2>&1; then
  tail -n 30 "$WORK/debootstrap.log" >&2
  [ -f "$ROOT/debootstrap/debootstrap.log" ] && tail -n 30 "$ROOT/debootstrap/debootstrap.log" >&2
  die "debootstrap failed"
fi

# The kernel's modules (all of them: the recorder tests may want more than NFS), indexed by
# the guest's own depmod.
mkdir -p "$ROOT/usr/lib/modules"
cp -a "$WORK/kernel/lib/modules/$KVER" "$ROOT/usr/lib/modules/"
chroot "$ROOT" depmod "$KVER"

# Small things the guest init uses: busybox for ip/poweroff, the mount points, hostname.
install -m 0755 "$BUSYBOX" "$ROOT/usr/local/bin/busybox"
mkdir -p "$ROOT/export" "$ROOT/mnt/nfs41" "$ROOT/mnt/nfs3" "$ROOT/payload" "$ROOT/out" \
  "$ROOT/var/lib/nfs/v4recovery" "$ROOT/run/rpcbind"
echo trainio-guest >"$ROOT/etc/hostname"
printf '127.0.0.1\tlocalhost trainio-guest\n::1\tlocalhost ip6-localhost\n' >"$ROOT/etc/hosts"
: >"$ROOT/etc/fstab"
: >"$ROOT/etc/exports"
echo "$KVER" >"$ROOT/etc/trainio-guest-kernel"
# Trim what nothing reads.
rm -rf "$ROOT"/usr/share/{doc,man,info,locale}/* "$ROOT"/var/cache/apt/* "$ROOT"/var/lib/apt/lists/* \
  "$ROOT"/var/log/* "$ROOT/debootstrap"

# --- The initramfs: static busybox, the modules to reach the root disk, and /init. -------------
IRD="$WORK/initramfs"
mkdir -p "$IRD"/{bin,dev,proc,sys,newroot,lib/modules/"$KVER"}
cp "$BUSYBOX" "$IRD/bin/busybox"
ln -s busybox "$IRD/bin/sh"
MODDIR="$ROOT/usr/lib/modules/$KVER"
declare -A DEPS=() LOADED=()
while IFS= read -r line; do
  mod=${line%%:*}
  DEPS[$(basename "$mod" .ko)]="$mod:${line#*:}"
done <"$MODDIR/modules.dep"
order=()
add_module() { # name (with - or _), loads dependencies first
  local name=${1//-/_} key entry path deps d
  for key in "$name" "${1}"; do entry=${DEPS[$key]:-}; [ -n "$entry" ] && break; done
  if [ -z "$entry" ]; then
    grep -qE "/(${1}|${name})\.ko$" "$MODDIR/modules.builtin" && return 0
    log "initramfs: module $1 neither loadable nor built in (skipped)"
    return 0
  fi
  path=${entry%%:*}
  [ -n "${LOADED[$path]:-}" ] && return 0
  LOADED[$path]=1
  deps=${entry#*:}
  for d in $deps; do add_module "$(basename "$d" .ko)"; done
  order+=("$path")
}
for m in "${INITRAMFS_MODULES[@]}"; do add_module "$m"; done
: >"$IRD/modules.order"
for path in "${order[@]}"; do
  mkdir -p "$IRD/lib/modules/$KVER/$(dirname "$path")"
  cp "$MODDIR/$path" "$IRD/lib/modules/$KVER/$path"
  echo "$path" >>"$IRD/modules.order"
done
log "initramfs modules: $(tr '\n' ' ' <"$IRD/modules.order")"
echo "$KVER" >"$IRD/kver"

cat >"$IRD/init" <<'EOF'
#!/bin/sh
# trainio NFS guest, stage 1: load the modules for the disks, mount the root image, unpack the
# payload (a tar on the disk with serial trainio-payload) into it, and hand over to the payload's
# .trainio/init.sh (the harness's guest-side init, shipped with every run) as PID 1.
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
kver=$(cat /kver)
echo "trainio-stage1: up $(cut -d' ' -f1 /proc/uptime)s" >/dev/console
while read -r m; do insmod "/lib/modules/$kver/$m" || echo "trainio-stage1: insmod $m failed"; done </modules.order
find_disk() { # serial -> /dev/vdX
  for d in /sys/block/vd*; do
    [ "$(cat "$d/serial" 2>/dev/null)" = "$1" ] && { echo "/dev/${d##*/}"; return 0; }
  done
  return 1
}
fail() {
  echo "trainio-stage1: FAILED: $*" >/dev/console
  echo o >/proc/sysrq-trigger
  sleep 10
}
i=0
until root=$(find_disk trainio-root) && payload=$(find_disk trainio-payload); do
  i=$((i + 1)); [ $i -gt 100 ] && { fail "disks not found: $(ls /sys/block)"; exit 1; }
  sleep 0.1
done
mount -t ext4 -o rw "$root" /newroot || { fail "mount root $root"; exit 1; }
tar -x -f "$payload" -C /newroot/payload || { fail "unpack payload from $payload"; exit 1; }
init=/payload/.trainio/init.sh
[ -x "/newroot$init" ] || { fail "payload has no $init"; exit 1; }
umount /proc /sys
mount --move /dev /newroot/dev
exec switch_root /newroot "$init"
EOF
chmod 0755 "$IRD/init"

# --- The images. ---------------------------------------------------------------------------------
mkdir -p "$WORK/out"
cp "$WORK/kernel/boot/vmlinuz-$KVER" "$WORK/out/vmlinuz"
cp "$WORK/kernel/boot/config-$KVER" "$WORK/out/config"
(cd "$IRD" && find . -print0 | LC_ALL=C sort -z | cpio --null -o -H newc --quiet) | gzip -1 >"$WORK/out/initrd.img"
used_mib=$(du -sm "$ROOT" | cut -f1)
size_mib=$((used_mib + used_mib / 4 + 256))
log "root image: $used_mib MiB of files in a ${size_mib} MiB ext4"
mke2fs -q -F -t ext4 -L trainio-root -d "$ROOT" "$WORK/out/root.img" "${size_mib}M"
# Empty file system the guest exports over NFS (attached copy-on-write, so it stays empty).
mke2fs -q -F -t ext4 -L trainio-export "$WORK/out/export.img" "$EXPORT_IMAGE_SIZE"

cat >"$WORK/out/stamp" <<EOF
recipe=$RECIPE_VERSION
kernel=$KVER
kernel_deb=$(basename "$deb")
suite=$SUITE
packages=$GUEST_PACKAGES
built=$(date -u +%Y-%m-%dT%H:%M:%SZ)
EOF

# Swap the finished images in (the debs stay: they make the next rebuild faster). The stamp goes
# first and comes back last, so a crash in between leaves a cache that is rebuilt.
rm -f "$CACHE/stamp"
for f in vmlinuz config initrd.img root.img export.img; do mv -f "$WORK/out/$f" "$CACHE/$f"; done
mv -f "$WORK/out/stamp" "$CACHE/stamp"
end=$(date +%s.%N)
build_s=$(awk -v a="$start" -v b="$end" 'BEGIN { printf "%.1f", b - a }')
echo "build_seconds=$build_s" >>"$CACHE/stamp"
log "built in ${build_s} s: $CACHE (kernel $KVER)"
echo "$CACHE"
