"""Helpers for the replayer's tests (a module of its own: the name `conftest` is taken
by every suite's fixtures)."""

from __future__ import annotations

import json
import os
import subprocess
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


def sh(*cmd):
    return subprocess.run(list(map(str, cmd)), check=True, capture_output=True, text=True).stdout.strip()


def in_cgroup(cg: Path):
    """A command prefix that runs the command inside cgroup `cg` (and its children with it)."""
    return ("sh", "-c", f'echo $$ > {cg}/cgroup.procs && exec "$@"', "in-cgroup")
