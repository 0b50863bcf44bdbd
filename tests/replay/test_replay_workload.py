"""Workload mode end to end: datagen, the accelerator model, results, errors."""

from __future__ import annotations

import os
import shutil

import pytest
from replay_helpers import ROOT, load_json, run_trainio, write_workload

MIB = 1 << 20


def test_tmpfs_small_workload_keeps_au_above_95(tmpfs_dir):
    """1 MiB samples, batch 4, 0.05 s compute on tmpfs: storage is never the bottleneck."""
    wl = write_workload(tmpfs_dir / "wl.yaml", files=48, record=MIB, batch=4, compute=0.05, epochs=2)
    out = tmpfs_dir / "r.json"
    run_trainio("replay", "--workload", wl, "--data-dir", tmpfs_dir / "data", "--generate", "--gpus", 2, "--json", out)
    r = load_json(out)
    assert r["gpus"] == 2 and r["ranks"] == 1 and r["hosts"] == 1
    assert r["au_percent"] >= 95.0, r["au_percent"]
    assert r["au_min_percent"] >= 95.0 and len(r["au_per_gpu"]) == 2
    assert r["pass"] is True and r["threshold_percent"] == pytest.approx(90.0)
    # 48 files / 2 GPUs = 24 samples each = 6 steps of 4, twice.
    assert r["steps"] == 12 and r["epochs"] == 2 and len(r["per_epoch"]) == 2
    assert r["samples"] == 2 * 12 * 4
    assert r["bytes_read"] == r["samples"] * MIB
    assert r["throughput_mib_s"] == pytest.approx(r["bytes_read"] / MIB / r["wall_s"], rel=1e-6)
    assert r["samples_per_s"] == pytest.approx(r["samples"] / r["wall_s"], rel=1e-6)
    # Compute alone is 6 steps × 0.05 s per epoch: the run cannot be faster.
    assert r["wall_s"] >= 12 * 0.05
    # Each GPU's DataLoader had exactly read_threads (4) reads in flight at its peak.
    assert [g["max_outstanding_reads"] for g in r["per_gpu"]] == [4, 4]
    assert 0 <= r["sleep_overshoot_us_p50"] <= r["sleep_overshoot_us_p99"]
    for key in ("sleep_overshoot_us_p99", "threshold_percent", "pass", "per_epoch", "cpu_us_per_gpu_step"):
        assert key in r


def test_compute_bound_au_tracks_the_sleep(tmpfs_dir):
    """With data always ready, each step lasts the compute time: wall ≈ steps × compute."""
    wl = write_workload(tmpfs_dir / "wl.yaml", files=16, record=64 << 10, batch=1, compute=0.02)
    out = tmpfs_dir / "r.json"
    run_trainio("replay", "--workload", wl, "--data-dir", tmpfs_dir / "d", "--generate", "--json", out)
    r = load_json(out)
    assert r["steps"] == 16
    assert r["wall_s"] == pytest.approx(16 * 0.02, rel=0.25)
    assert r["compute_s_mean"] == pytest.approx(16 * 0.02, rel=0.05)


def test_no_barrier_means_no_barrier_wait(tmpfs_dir):
    wl = write_workload(tmpfs_dir / "wl.yaml", files=16, record=64 << 10, batch=2, compute=0.01)
    (tmpfs_dir / "wl.yaml").write_text(
        (tmpfs_dir / "wl.yaml")
        .read_text()
        .replace("computation_time: 0.01", "computation_time:\n    type: uniform\n    min: 0.0\n    max: 0.02")
    )
    out_b, out_n = tmpfs_dir / "b.json", tmpfs_dir / "n.json"
    args = ("replay", "--workload", wl, "--data-dir", tmpfs_dir / "d", "--generate", "--gpus", 4)
    run_trainio(*args, "--json", out_b)
    run_trainio(*args, "--no-barrier", "--json", out_n)
    b, n = load_json(out_b), load_json(out_n)
    assert b["settings"]["barrier"] is True and n["settings"]["barrier"] is False
    assert b["barrier_wait_s_mean"] > 0.001  # random compute: the faster GPUs wait
    assert n["barrier_wait_s_mean"] == 0.0


def test_bad_yaml_is_one_line_naming_the_file(tmpfs_dir):
    bad = tmpfs_dir / "broken.yaml"
    bad.write_text("dataset: [unclosed\n")
    p = run_trainio("replay", "--workload", bad, "--data-dir", tmpfs_dir / "d", check=False)
    assert p.returncode == 2
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and str(bad) in lines[0], p.stderr
    wrong = write_workload(tmpfs_dir / "wrong.yaml")
    wrong.write_text(wrong.read_text().replace("batch_size: 4", "batch_size: four"))
    p = run_trainio("datagen", "--workload", wrong, "--data-dir", tmpfs_dir / "d", check=False)
    assert p.returncode == 2 and "reader.batch_size" in p.stderr and str(wrong) in p.stderr
    assert not (tmpfs_dir / "d").exists()


def test_missing_dataset_says_how_to_make_it(tmpfs_dir):
    wl = write_workload(tmpfs_dir / "wl.yaml")
    p = run_trainio("replay", "--workload", wl, "--data-dir", tmpfs_dir / "nothing", check=False)
    assert p.returncode == 2 and "datagen" in p.stderr


def test_datagen_owns_its_directory_and_refuses_foreign_ones(tmpfs_dir):
    wl = write_workload(tmpfs_dir / "wl.yaml", files=4, record=100_000, batch=2)
    foreign = tmpfs_dir / "foreign"
    foreign.mkdir()
    (foreign / "precious.txt").write_text("keep me")
    p = run_trainio("datagen", "--workload", wl, "--data-dir", foreign, check=False)
    assert p.returncode == 2 and "--force" in p.stderr
    assert sorted(os.listdir(foreign)) == ["precious.txt"]

    p = run_trainio("datagen", "--workload", wl, "--data-dir", "/dev/null", check=False)
    assert p.returncode == 2 and "device" in p.stderr

    ours = tmpfs_dir / "ours"
    run_trainio("datagen", "--workload", wl, "--data-dir", ours, "--gpus", 3)
    assert (ours / ".trainio-dataset").exists()
    files = sorted((ours / "train").iterdir())
    # 3 GPUs × one batch of 2 = 6 files, raised from num_files_train 4; sizes 4 KiB-aligned.
    assert len(files) == 6
    assert all(f.stat().st_size == 102400 for f in files)
    # A second run reuses the directory (ours) and grows it for more GPUs.
    run_trainio("datagen", "--workload", wl, "--data-dir", ours, "--gpus", 5)
    assert len(list((ours / "train").iterdir())) == 10
    run_trainio("datagen", "--workload", wl, "--data-dir", foreign, "--force")
    assert (foreign / "precious.txt").read_text() == "keep me"


def test_record_size_distribution_varies_file_sizes(tmpfs_dir):
    wl = write_workload(tmpfs_dir / "wl.yaml", files=20, record=200_000)
    wl.write_text(
        wl.read_text().replace("record_length_bytes: 200000", "record_length: 200000\n  record_length_stdev: 50000")
    )
    run_trainio("datagen", "--workload", wl, "--data-dir", tmpfs_dir / "d")
    sizes = [f.stat().st_size for f in (tmpfs_dir / "d" / "train").iterdir()]
    assert len(set(sizes)) > 5
    assert 100_000 < sum(sizes) / len(sizes) < 300_000


@pytest.mark.parametrize("config", sorted(p.name for p in (ROOT / "configs").glob("demo-*.yaml")))
def test_demo_configs_run(tmpfs_dir, config):
    out = tmpfs_dir / "r.json"
    run_trainio(
        "replay",
        "--workload",
        ROOT / "configs" / config,
        "--data-dir",
        tmpfs_dir / "d",
        "--generate",
        "--gpus",
        2,
        "--steps",
        5,
        "--epochs",
        1,
        "--json",
        out,
    )
    r = load_json(out)
    assert r["gpus"] == 2 and r["steps"] == 5 and r["bytes_read"] > 0


def test_mpirun_two_ranks_five_gpus(tmpfs_dir):
    if not shutil.which("mpirun"):
        pytest.fail("mpirun is missing (OpenMPI is a dependency: scripts/install-deps.sh)")
    wl = write_workload(tmpfs_dir / "wl.yaml", files=20, record=256 << 10, batch=2, compute=0.02)
    run_trainio("datagen", "--workload", wl, "--data-dir", tmpfs_dir / "d", "--gpus", 5)
    out = tmpfs_dir / "r.json"
    mpirun = ("mpirun", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none", "-np", "2")
    run_trainio(
        "replay",
        "--workload",
        wl,
        "--data-dir",
        tmpfs_dir / "d",
        "--gpus",
        5,
        "--json",
        out,
        prefix=mpirun,
        timeout=120,
    )
    r = load_json(out)
    assert r["gpus"] == 5 and r["ranks"] == 2 and r["hosts"] == 1
    assert sorted(g["gpu"] for g in r["per_gpu"]) == [0, 1, 2, 3, 4]
    assert [g["rank"] for g in sorted(r["per_gpu"], key=lambda g: g["gpu"])] == [0, 0, 0, 1, 1]
    # The barrier holds across ranks: every GPU did the same steps.
    assert {g["steps"] for g in r["per_gpu"]} == {2}


def test_a_failing_rank_ends_the_job_naming_it(tmpfs_dir):
    if not shutil.which("mpirun"):
        pytest.fail("mpirun is missing (OpenMPI is a dependency: scripts/install-deps.sh)")
    wl = write_workload(tmpfs_dir / "wl.yaml", files=4, record=64 << 10, batch=1, compute=0.01)
    data = tmpfs_dir / "d"
    run_trainio("datagen", "--workload", wl, "--data-dir", data, "--gpus", 4)
    # GPU 3 (rank 1 of 2) reads file 3: take it away.
    victim = sorted((data / "train").iterdir())[3]
    victim.unlink()
    mpirun = ("mpirun", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none", "-np", "2")
    p = run_trainio("replay", "--workload", wl, "--data-dir", data, "--gpus", 4, prefix=mpirun, check=False, timeout=60)
    assert p.returncode != 0
    assert "rank 1" in p.stderr and victim.name in p.stderr, p.stderr


def test_sweep_doubles_to_max_gpus_on_fast_storage(tmpfs_dir):
    wl = write_workload(tmpfs_dir / "wl.yaml", files=4, record=64 << 10, batch=2, compute=0.01)
    curve = tmpfs_dir / "curve.json"
    p = run_trainio(
        "sweep",
        "--workload",
        wl,
        "--data-dir",
        tmpfs_dir / "d",
        "--generate",
        "--steps",
        5,
        "--max-gpus",
        4,
        "--json",
        curve,
    )
    s = load_json(curve)
    assert [pt["gpus"] for pt in s["curve"]] == [1, 2, 4]
    assert s["supported_gpus"] == 4 and s["limited_by_max_gpus"] is True
    assert all(pt["pass"] and pt["au_percent"] >= 90 for pt in s["curve"])
    assert len(s["runs"]) == 3 and s["runs"][2]["gpus"] == 4
    assert "at least 4" in p.stdout


def test_without_mpirun_one_rank_with_or_without_mpi_init(tmpfs_dir):
    """Started by hand the binary is one rank; TRAINIO_MPI=1 makes it go through OpenMPI's
    singleton start instead, with the same result."""
    wl = write_workload(tmpfs_dir / "wl.yaml", files=4, record=64 << 10, batch=2, compute=0.01)
    run_trainio("datagen", "--workload", wl, "--data-dir", tmpfs_dir / "d", "--gpus", 2)
    for env in ({}, {"TRAINIO_MPI": "1"}):
        out = tmpfs_dir / "r.json"
        run_trainio(
            "replay", "--workload", wl, "--data-dir", tmpfs_dir / "d", "--gpus", 2, "--json", out, env=env, timeout=60
        )
        r = load_json(out)
        assert r["gpus"] == 2 and r["ranks"] == 1 and r["steps"] == 1
