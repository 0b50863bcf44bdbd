#!/usr/bin/env bash
# Installs what trainio needs on a fresh Debian 12 machine of this kind (root):
# Debian packages, then the Python venv. Idempotent: a second run only checks.
set -euo pipefail
cd "$(dirname "$0")/.."

# Debian packages, one list, grouped by who needs them.
packages=(
  # BPF build: clang compiles bpf/, bpftool generates vmlinux.h, libbpf-sys links these
  clang llvm libelf-dev zlib1g-dev pkg-config make bpftool
  # tests and benchmarks: real workloads, iostat, bpftrace for comparison, strace to count
  # the files a command opens (tests/analysis/test_model_decoded_once.py)
  fio sysstat bpftrace util-linux coreutils strace
  # trainio import --blktrace: blkparse turns blktrace's binary files into text
  blktrace
  # replay: OpenMPI through the mpi crate (rsmpi needs libclang)
  openmpi-bin libopenmpi-dev libclang-dev
  # multi-host tests (tests/hosts): each namespace host runs its own sshd (own config, keys
  # and port in the test's tmp dir); mpirun starts ranks over ssh as on a real cluster
  openssh-server openssh-client
  # report test: headless Chromium renders the HTML report
  chromium
  # the venv, if python3 is Debian's own
  python3-venv
  # tests/deploy: systemd-analyze verify checks deploy/systemd's unit
  systemd
  # object-layer HTTPS tests and bench: stunnel terminates TLS in front of the S3 server;
  # openssl makes the throwaway CA and certificate
  stunnel4 openssl
  # NFS tests: a QEMU guest running Debian's cloud kernel (scripts/nfs-guest; mke2fs -d builds
  # its disk images)
  qemu-system-x86 debootstrap cpio busybox-static e2fsprogs
)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "install-deps: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update
  apt-get install -y --no-install-recommends "${missing[@]}"
fi

# rustup's cargo, even when the shell profile that puts it on PATH was not read (CI).
[ -d "$HOME/.cargo/bin" ] && export PATH="$HOME/.cargo/bin:$PATH"
command -v cargo >/dev/null || { echo "install-deps: cargo not found (rustup is expected on this machine kind)" >&2; exit 2; }

# Python venv for analysis/ and tests/.
if [ ! -x .venv/bin/python ] || ! cmp -s analysis/requirements.txt .venv/.requirements; then
  python3 -m venv .venv
  .venv/bin/pip install --quiet -r analysis/requirements.txt
  cp analysis/requirements.txt .venv/.requirements
fi
# The real PyTorch job of the tests and benchmarks (tests/realjob), in the same venv. torch's
# default wheel brings CUDA libraries: ~5 GB in .venv, about a minute to install; it runs on
# CPU. A changed list reinstalls; pip then keeps what already satisfies it.
if ! cmp -s tests/realjob/requirements.txt .venv/.requirements-realjob; then
  echo "install-deps: installing tests/realjob/requirements.txt (torch) into .venv"
  .venv/bin/pip install --quiet -r tests/realjob/requirements.txt
  cp tests/realjob/requirements.txt .venv/.requirements-realjob
fi
# ruff, for make lint (ruff.toml).
if ! cmp -s requirements-lint.txt .venv/.requirements-lint; then
  .venv/bin/pip install --quiet -r requirements-lint.txt
  cp requirements-lint.txt .venv/.requirements-lint
fi
# dftracer, the tracer whose traces `trainio import --dftracer` reads: tests/interop records
# a real run with it (its POSIX tracer is an LD_PRELOAD library inside the wheel).
if ! cmp -s tests/interop/requirements.txt .venv/.requirements-interop; then
  echo "install-deps: installing tests/interop/requirements.txt (dftracer) into .venv"
  .venv/bin/pip install --quiet -r tests/interop/requirements.txt
  cp tests/interop/requirements.txt .venv/.requirements-interop
fi
# duckdb, a third reader of datagen's Parquet files (tests/formats).
if ! cmp -s tests/formats/requirements.txt .venv/.requirements-formats; then
  echo "install-deps: installing tests/formats/requirements.txt (duckdb) into .venv"
  .venv/bin/pip install --quiet -r tests/formats/requirements.txt
  cp tests/formats/requirements.txt .venv/.requirements-formats
fi
# DLIO itself for tests/replay (tests/replay/requirements-dlio.txt says why --no-deps).
if ! cmp -s tests/replay/requirements-dlio.txt .venv/.requirements-dlio; then
  echo "install-deps: installing tests/replay/requirements-dlio.txt (DLIO) into .venv"
  .venv/bin/pip install --quiet --no-deps -r tests/replay/requirements-dlio.txt
  rm -rf .venv/dlio-site
  .venv/bin/pip install --quiet --no-deps --target .venv/dlio-site pydftracer==1.0.2
  cp tests/replay/requirements-dlio.txt .venv/.requirements-dlio
fi
# The S3 server of the object-storage tests and bench (tests/s3server): s3s-fs's directory
# backend (real HTTP, SigV4, multipart uploads, ranged GETs) behind our own accept loop,
# which sets TCP_NODELAY as production servers do (docs/design/object-storage.md). Its own
# Cargo.lock, out of the main workspace, into target/s3server: about 3 CPU-minutes the
# first time, then cargo only checks that it is up to date.
cargo build --release --locked --quiet --manifest-path tests/s3server/Cargo.toml --target-dir target/s3server
# kubernetes-validate: the Kubernetes API schemas and a validator, with which tests/deploy
# checks deploy/kubernetes's DaemonSet offline.
if ! cmp -s tests/deploy/requirements.txt .venv/.requirements-deploy; then
  echo "install-deps: installing tests/deploy/requirements.txt (kubernetes-validate) into .venv"
  .venv/bin/pip install --quiet -r tests/deploy/requirements.txt
  cp tests/deploy/requirements.txt .venv/.requirements-deploy
fi
