"""Fixtures for the replayer's end-to-end tests: they drive the real binary through
bin/trainio, on tmpfs, and (as root) on a throttled loop device."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TRAINIO = ROOT / "bin" / "trainio"
REPLAY_BIN = ROOT / "target" / "release" / "trainio-replay"

# OpenMPI refuses root without these; harmless for a non-root run.
MPI_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}


def run_trainio(*args, timeout=300, check=True, env=None, prefix=()):
    """Runs `bin/trainio ARGS` (optionally behind `prefix`, e.g. mpirun) and returns the result."""
    if not REPLAY_BIN.exists():
        pytest.fail(f"{REPLAY_BIN} is missing: run 'make' first")
    full_env = {**os.environ, **MPI_ENV, **(env or {})}
    cmd = [*prefix, str(TRAINIO), *map(str, args)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=full_env, check=False)
    if check and proc.returncode != 0:
        msg = f"{' '.join(cmd)} exited {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
        raise AssertionError(msg)
    return proc


def load_json(path: Path) -> dict:
    return json.loads(Path(path).read_text())


def write_workload(path: Path, *, files=64, record=1 << 20, batch=4, threads=4, compute=0.05, epochs=1, spf=1, au=0.9):
    """A small DLIO workload file (v2.0 key names)."""
    path.write_text(
        f"""model:
  name: test
dataset:
  num_files_train: {files}
  num_samples_per_file: {spf}
  record_length_bytes: {record}
reader:
  batch_size: {batch}
  read_threads: {threads}
train:
  epochs: {epochs}
  computation_time: {compute}
metric:
  au: {au}
"""
    )
    return path


@pytest.fixture
def tmpfs_dir():
    """A directory on tmpfs (/dev/shm), removed afterwards."""
    d = Path(tempfile.mkdtemp(prefix="trainio-replay-test-", dir="/dev/shm"))
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def _sh(*cmd):
    return subprocess.run(list(map(str, cmd)), check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture
def loop_fs():
    """An ext4 file system on a loop device over a file in /dev/shm, mounted under a temp
    dir. Yields (device, "MAJ:MIN", mount point). Everything is undone even on failure."""
    if os.geteuid() != 0:
        pytest.skip("needs root")
    work = Path(tempfile.mkdtemp(prefix="trainio-loop-", dir="/dev/shm"))
    backing = work / "disk.img"
    mnt = Path(tempfile.mkdtemp(prefix="trainio-mnt-"))
    dev = None
    mounted = False
    try:
        with open(backing, "wb") as f:
            f.truncate(768 << 20)
        dev = _sh("losetup", "--find", "--show", "--direct-io=on", backing)
        _sh("mkfs.ext4", "-q", "-F", dev)
        _sh("mount", dev, mnt)
        mounted = True
        majmin = _sh("lsblk", "-dno", "MAJ:MIN", dev).replace(" ", "")
        yield dev, majmin, mnt
    finally:
        if mounted:
            subprocess.run(["umount", str(mnt)], check=False)
        if dev:
            subprocess.run(["losetup", "-d", dev], check=False)
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(mnt, ignore_errors=True)


@pytest.fixture
def blkio_cgroup():
    """A cgroup-v1 blkio group; yields its directory, removed afterwards."""
    base = Path("/sys/fs/cgroup/blkio")
    if os.geteuid() != 0 or not (base / "cgroup.procs").exists():
        pytest.skip("needs root and cgroup-v1 blkio at /sys/fs/cgroup/blkio")
    cg = base / f"trainio-test-{os.getpid()}-{time.monotonic_ns()}"
    cg.mkdir()
    try:
        yield cg
    finally:
        # Anything still inside goes back to the root group so the directory can go.
        for _ in range(50):
            try:
                for pid in (cg / "cgroup.procs").read_text().split():
                    try:
                        (base / "cgroup.procs").write_text(pid)
                    except OSError:
                        pass
                cg.rmdir()
                break
            except OSError:
                time.sleep(0.1)


def in_cgroup(cg: Path):
    """A command prefix that runs the command inside cgroup `cg` (and its children with it)."""
    return ("sh", "-c", f'echo $$ > {cg}/cgroup.procs && exec "$@"', "in-cgroup")
