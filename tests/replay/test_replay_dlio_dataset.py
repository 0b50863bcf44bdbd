"""A dataset DLIO generated, replayed in place: MLPerf Storage v3.0's unet3d file
(unchanged, scaled down by overrides) on the npz layout DLIO's generator writes, and the
one-line refusals where the directory does not hold the layout the workload implies.

DLIO itself generates one in the last test (dlio-benchmark 2.0.0 from PyPI, installed
without the tensorflow and nvidia-dali-cuda110 it requires and never uses here:
tests/replay/requirements-dlio.txt). The faster tests use `dlio_npz_dataset`, which
writes what its NPZGenerator writes (dlio_benchmark/data_generator/npz_generator.py and
data_generator.py, 2.0.0): `train/img_<i>_of_<N>.npz`, i padded to the digits of N, each
`np.savez(x=uint8 array of shape (d1, d2, samples per file), y=labels)` with d1, d2 drawn
from normal(sqrt(record), stdev / 2 / sqrt(record)) after np.random.seed(10), and an
empty `valid/`."""

from __future__ import annotations

import hashlib
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from replay_helpers import MPI_ENV, ROOT, load_json, run_trainio

UNET3D = Path(__file__).resolve().parent / "data" / "dlio-configs" / "mlperf-storage-v3" / "unet3d_h100.yaml"
FILES, RECORD, STDEV = 14, 65536, 16384
SCALE = [
    f"++workload.dataset.num_files_train={FILES}",
    f"++workload.dataset.record_length_bytes={RECORD}",
    f"++workload.dataset.record_length_bytes_stdev={STDEV}",
    "--computation-time", "0.001", "--epochs", "1", "-q",
]  # fmt: skip


def dlio_npz_dataset(root: Path, files: int, record: int, stdev: float) -> list[Path]:
    (root / "train").mkdir(parents=True)
    (root / "valid").mkdir()
    dimension = int(math.sqrt(record))
    np.random.seed(10)
    dims = [max(int(d), 1) for d in np.random.normal(dimension, stdev / 2.0 / math.sqrt(record), 2 * files)]
    digits = len(str(files))
    paths = []
    for i in range(files):
        records = np.random.randint(255, size=(dims[2 * i], dims[2 * i + 1], 1), dtype=np.uint8)
        path = root / "train" / f"img_{str(i).rjust(digits, '0')}_of_{files}.npz"
        np.savez(path, x=records, y=[0])
        paths.append(path)
    np.random.seed()
    return paths


def snapshot(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in root.rglob("*") if p.is_file()
    }


def test_replays_dlio_npz_dataset_in_place(tmpfs_dir: Path) -> None:
    data = tmpfs_dir / "unet3d"
    paths = dlio_npz_dataset(data, FILES, RECORD, STDEV)
    sizes = [p.stat().st_size for p in paths]
    assert len(set(sizes)) > 1, "DLIO's files differ in size"
    before = snapshot(data)
    out = tmpfs_dir / "r.json"
    p = run_trainio("replay", "--workload", UNET3D, "--data-dir", data, "--json", out, *SCALE)
    j = load_json(out)
    # Batch 7 over 14 files: 2 steps that read every file whole, at its own size.
    assert j["steps"] == 2
    assert j["bytes_read"] == sum(sizes)
    assert j["settings"]["dataset_files"] == FILES and j["settings"]["dataset_bytes"] == sum(sizes)
    note = [ln for ln in p.stderr.splitlines() if "DLIO's dataset, read in place" in ln]
    assert len(note) == 1 and f"{FILES} files" in note[0] and "not modeled" in note[0], p.stderr
    # Nothing in the dataset changed; at most the run's lock was added.
    after = snapshot(data)
    assert {k: v for k, v in after.items() if k in before} == before
    assert set(after) - set(before) <= {".trainio-lock"}, set(after) - set(before)


def refusal(data: Path, *overrides: str) -> str:
    p = run_trainio("replay", "--workload", UNET3D, "--data-dir", data, *SCALE, *overrides, check=False)
    lines = [ln for ln in p.stderr.splitlines() if "not modeled" not in ln]
    assert p.returncode == 2 and len(lines) == 1, p.stderr
    return lines[0]


def test_a_layout_that_does_not_match_is_refused_in_one_line(tmpfs_dir: Path) -> None:
    data = tmpfs_dir / "unet3d"
    paths = dlio_npz_dataset(data, FILES, RECORD, STDEV)
    before = snapshot(data)
    # Another file count: DLIO's names carry it.
    line = refusal(data, "++workload.dataset.num_files_train=16")
    assert "img_00_of_16.npz: missing" in line and f"train/ holds {FILES} .npz files" in line, line
    # Another format.
    assert "img_00_of_14.npy: missing" in refusal(data, "++workload.dataset.format=npy")
    # Another record length: the files are not this workload's.
    line = refusal(
        data, "++workload.dataset.record_length_bytes=1048576", "++workload.dataset.record_length_bytes_stdev=0"
    )
    assert "average" in line and "not the dataset of this workload" in line, line
    # More files than the dataset holds.
    assert "needs 21" in refusal(data, "--steps", "3")
    # One file gone.
    paths[3].unlink()
    del before[str(paths[3].relative_to(data))]
    assert "img_03_of_14.npz: missing" in refusal(data)
    assert {k: v for k, v in snapshot(data).items() if k in before} == before
    # datagen does not write into it.
    g = run_trainio("datagen", "--workload", UNET3D, "--data-dir", data, *SCALE[:3], check=False)
    assert g.returncode == 2 and "not a trainio dataset" in g.stderr


# DLIO's own generator, run as `dlio_benchmark` runs (hydra overrides on its unet3d
# workload; 2.0.0 names the record length `record_length`). Its profiler needs the
# pydftracer it pins (.venv/dlio-site, scripts/install-deps.sh), and it imports tensorflow
# at module level for its TF profiler and framework, which a PyTorch workload's datagen
# never calls: an empty module stands in (the wheel's tensorflow requirement is not met).
DLIO_GENERATE = """
import runpy, sys, types
sys.modules["tensorflow"] = types.ModuleType("tensorflow")
sys.argv = ["dlio_benchmark"] + sys.argv[1:]
runpy.run_module("dlio_benchmark.main", run_name="__main__")
"""


def test_replays_a_dataset_dlio_itself_generated_in_place(tmpfs_dir: Path) -> None:
    """DLIO 2.0.0 (from PyPI) generates unet3d's npz files; the replay of v3.0's
    unet3d_h100.yaml with the same overrides reads every byte of them in place."""
    site = ROOT / ".venv" / "dlio-site"
    if not (site / "dftracer").is_dir():
        pytest.fail(f"{site}: DLIO's pydftracer is missing: run scripts/install-deps.sh")
    data = tmpfs_dir / "unet3d"
    gen = subprocess.run(
        [
            sys.executable,
            "-c",
            DLIO_GENERATE,
            "workload=unet3d_h100",
            "++workload.workflow.generate_data=True",
            "++workload.workflow.train=False",
            f"++workload.dataset.num_files_train={FILES}",
            f"++workload.dataset.data_folder={data}",
            f"++workload.dataset.record_length={RECORD}",
            f"++workload.dataset.record_length_stdev={STDEV}",
            f"hydra.run.dir={tmpfs_dir / 'dlio-out'}",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        cwd=tmpfs_dir,
        env={**os.environ, **MPI_ENV, "PYTHONPATH": str(site), "DFTRACER_ENABLE": "0"},
    )
    assert gen.returncode == 0, gen.stdout[-2000:] + gen.stderr[-2000:]
    paths = sorted((data / "train").glob("*.npz"))
    assert len(paths) == FILES, paths
    sizes = [p.stat().st_size for p in paths]
    assert len(set(sizes)) > 1, "DLIO draws each file's dimensions"
    before = snapshot(data)
    out = tmpfs_dir / "r.json"
    p = run_trainio("replay", "--workload", UNET3D, "--data-dir", data, "--json", out, *SCALE)
    j = load_json(out)
    assert j["steps"] == 2 and j["bytes_read"] == sum(sizes), (j["steps"], j["bytes_read"], sum(sizes))
    assert j["settings"]["dataset_files"] == FILES and j["settings"]["dataset_bytes"] == sum(sizes)
    assert any("DLIO's dataset, read in place" in ln for ln in p.stderr.splitlines()), p.stderr
    after = snapshot(data)
    assert {k: v for k, v in after.items() if k in before} == before
