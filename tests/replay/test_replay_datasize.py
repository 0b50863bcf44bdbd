"""MLPerf Storage's dataset-size rule (`trainio datasize`, and the check datagen and replay
print), the free-space refusal on a real file system, workload overrides in DLIO's form,
and the datagen/sweep command lines (issue 21 items 1, 2, 6)."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
from replay_helpers import ROOT, load_json, run_trainio, write_workload

from trainio_testlib import mounted_loop_fs, require_root

# The real workload files, unchanged (from ../shared/dlio-configs, mlcommons/storage main
# caa90c9 configs/dlio/workload/), checked against the originals where those are present.
COPIES = Path(__file__).resolve().parent / "data" / "dlio-configs" / "mlperf-storage-main"
SHARED = ROOT.parent / "shared" / "dlio-configs" / "mlperf-storage-main"
GIB = 1 << 30
MIB = 1 << 20


def test_the_copies_are_the_published_files() -> None:
    for name in ("unet3d_h100.yaml", "resnet50_a100.yaml", "cosmoflow_h100.yaml"):
        assert (COPIES / name).is_file()
        if SHARED.is_dir():
            assert (COPIES / name).read_bytes() == (SHARED / name).read_bytes(), name


# Worked out by hand from mlpstorage's formula (docs/replay.md, *Dataset size*):
#   files_by_ram   = 5 × hosts × RAM // (samples_per_file × record_length_bytes)
#   files_by_steps = 500 × gpus × batch // samples_per_file
#   num_files_train = max of the two; bytes = num_files_train × file bytes;
#   steps per epoch = num_files_train × samples_per_file // (batch × gpus).
CASES = [
    # unet3d: record 146600628 B, 1 sample per file, batch 7.
    # 5 × 64 GiB = 343597383680 // 146600628 = 2343; 500 × 8 × 7 = 28000 wins.
    (
        "unet3d_h100.yaml",
        8,
        1,
        "64G",
        dict(
            files_by_ram=2343,
            files_by_steps=28000,
            num_files_train=28000,
            dataset_bytes=28000 * 146600628,
            steps_per_epoch=500,
            decided_by="steps",
        ),
    ),
    # 5 × 2 × 256 GiB = 2748779069440 // 146600628 = 18750; 500 × 1 × 7 = 3500.
    (
        "unet3d_h100.yaml",
        1,
        2,
        str(256 * GIB),
        dict(
            files_by_ram=18750,
            files_by_steps=3500,
            num_files_train=18750,
            dataset_bytes=18750 * 146600628,
            steps_per_epoch=2678,
            decided_by="ram",
        ),
    ),
    # resnet50: record 114660.07 B (a float: Python's float //), 1251 samples per file,
    # batch 400; file = 143439747.57000002 B.
    # 5 × 512 GiB = 2748779069440 // 143439747.57 = 19163; 500 × 1 × 400 // 1251 = 159.
    # bytes = int(19163 × 143439747.57000002) = 2748735882683; steps 19163 × 1251 // 400.
    (
        "resnet50_a100.yaml",
        1,
        1,
        "512GiB",
        dict(
            files_by_ram=19163,
            files_by_steps=159,
            num_files_train=19163,
            dataset_bytes=2748735882683,
            steps_per_epoch=59932,
            decided_by="ram",
        ),
    ),
    # 5 × 128 GiB = 687194767360 // 143439747.57 = 4790; 500 × 64 × 400 // 1251 = 10231
    # files, which hold 12798981 samples: 12798981 // (400 × 64) = 499 steps (the rule's
    # floor division leaves it one step short of 500, as mlpstorage computes it).
    (
        "resnet50_a100.yaml",
        64,
        1,
        "128G",
        dict(
            files_by_ram=4790,
            files_by_steps=10231,
            num_files_train=10231,
            dataset_bytes=1467532057388,
            steps_per_epoch=499,
            decided_by="steps",
        ),
    ),
    # cosmoflow: record 2828486 B, 1 sample per file, batch 1.
    # 5 × 16 GiB = 85899345920 // 2828486 = 30369; 500 × 4 × 1 = 2000.
    (
        "cosmoflow_h100.yaml",
        4,
        1,
        str(16 * GIB),
        dict(
            files_by_ram=30369,
            files_by_steps=2000,
            num_files_train=30369,
            dataset_bytes=30369 * 2828486,
            steps_per_epoch=7592,
            decided_by="ram",
        ),
    ),
    # 5 × 1 GiB = 5368709120 // 2828486 = 1898; 500 × 128 × 1 = 64000.
    (
        "cosmoflow_h100.yaml",
        128,
        1,
        "1G",
        dict(
            files_by_ram=1898,
            files_by_steps=64000,
            num_files_train=64000,
            dataset_bytes=64000 * 2828486,
            steps_per_epoch=500,
            decided_by="steps",
        ),
    ),
]


@pytest.mark.parametrize("name,gpus,hosts,ram,want", CASES, ids=[f"{c[0][:-5]}-{c[1]}gpu-{c[2]}x{c[3]}" for c in CASES])
def test_datasize_equals_mlpstorage_formula_by_hand(tmp_path: Path, name, gpus, hosts, ram, want) -> None:
    out = tmp_path / "ds.json"
    p = run_trainio(
        "datasize", "--workload", COPIES / name, "--gpus", gpus, "--hosts", hosts, "--client-ram", ram, "--json", out
    )
    j = load_json(out)
    for k, v in want.items():
        assert j[k] == v, (k, j[k], v)
    assert j["gpus"] == gpus and j["hosts"] == hosts
    assert j["client_ram_bytes"] == hosts * j["client_ram_per_host_bytes"]
    assert "mlpstorage" in j["formula"]
    assert f"num_files_train: {want['num_files_train']}" in p.stdout
    assert f"bytes: {want['dataset_bytes']}" in p.stdout
    assert f"steps per epoch: {want['steps_per_epoch']}" in p.stdout


def test_datasize_auto_ram_is_memtotal_and_overrides_change_the_numbers(tmp_path: Path) -> None:
    mem = next(
        int(ln.split()[1]) * 1024 for ln in Path("/proc/meminfo").read_text().splitlines() if ln.startswith("MemTotal:")
    )
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    run_trainio("datasize", "--workload", COPIES / "cosmoflow_h100.yaml", "--gpus", 2, "--hosts", 3, "--json", a)
    ja = load_json(a)
    assert ja["client_ram_from"] == "auto" and ja["client_ram_bytes"] == 3 * mem
    assert ja["files_by_ram"] == 5 * 3 * mem // 2828486
    # Both override spellings reach the rule: batch 1 → 8 (×8 files by steps) and a
    # record of 1 MiB.
    run_trainio(
        "datasize",
        "--workload",
        COPIES / "cosmoflow_h100.yaml",
        "--gpus",
        2,
        "--client-ram",
        "1G",
        "--param",
        "reader.batch_size=8",
        f"++workload.dataset.record_length_bytes={MIB}",
        "--json",
        b,
    )
    jb = load_json(b)
    assert jb["params"] == ["reader.batch_size=8", f"dataset.record_length_bytes={MIB}"]
    assert (jb["files_by_steps"], jb["files_by_ram"]) == (500 * 2 * 8, 5 * GIB // MIB)


@pytest.mark.parametrize(
    "bad,says",
    [
        (["--client-ram", "12X"], "--client-ram 12X"),
        (["--client-ram", "0"], "--client-ram 0"),
        (["++workload.dataset.num_file_train=3"], "++workload.dataset.num_file_train"),
        (["++workload.reader.batch_size=seven"], "reader.batch_size"),
        (["+model.x=1"], "++workload.KEY=VALUE"),
    ],
)
def test_datasize_bad_input_is_one_line_exit_2(tmp_path: Path, bad, says) -> None:
    out = tmp_path / "ds.json"
    p = run_trainio(
        "datasize", "--workload", COPIES / "unet3d_h100.yaml", "--gpus", 1, *bad, "--json", out, check=False
    )
    assert p.returncode == 2, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and says in lines[0], p.stderr
    assert not out.exists()


def _statvfs_free(path: Path) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def test_datagen_and_replay_refuse_a_dataset_the_file_system_cannot_hold() -> None:
    """ext4 on a 64 MiB loop device: a dataset a few MiB larger than its free space is
    refused before anything is written; one that fits is written; growing it counts only
    the files still missing."""
    require_root("loop device, mount")
    with mounted_loop_fs(64) as (_dev, _mm, mnt):
        free = _statvfs_free(mnt)
        too_many = free // MIB + 4
        wl = write_workload(mnt / "wl.yaml", files=too_many, record=MIB, batch=1, compute=0.0)
        data = mnt / "data"
        for cmd in (["datagen", "-q"], ["replay", "-q", "--generate"]):
            p = run_trainio(*cmd, "--workload", wl, "--data-dir", data, check=False)
            assert p.returncode == 2, (cmd, p.stderr)
            err = p.stderr.strip().splitlines()
            assert len(err) == 1, p.stderr
            need = too_many * (MIB + 4096)
            assert f"--data-dir {data}" in err[0] and f"needs {need} B" in err[0], err[0]
            said_free = int(re.search(r"has (\d+) B", err[0]).group(1))
            assert abs(said_free - free) < MIB, (said_free, free)
            assert not data.exists(), "something was written"
        # Half the free space fits, and is written.
        half = free // MIB // 2
        p = run_trainio(
            "datagen", "-q", "--workload", wl, "--data-dir", data, "--param", f"dataset.num_files_train={half}"
        )
        assert len(list((data / "train").iterdir())) == half
        assert "MLPerf dataset size for 1 GPUs" in p.stdout
        # Growing to (free now) + half files: only the missing ones count, so it fits
        # when the files already there are not counted twice.
        now = _statvfs_free(mnt)
        grow = half + now // (MIB + 4096) - 2
        run_trainio("datagen", "-q", "--workload", wl, "--data-dir", data, "--param", f"dataset.num_files_train={grow}")
        assert len(list((data / "train").iterdir())) == grow


def test_replay_prints_the_rule_and_the_warning_reads_as_five_times_ram(tmpfs_dir: Path) -> None:
    wl = write_workload(tmpfs_dir / "wl.yaml", files=4, record=64 << 10, batch=2, compute=0.0)
    ds = tmpfs_dir / "ds.json"
    run_trainio("datasize", "--workload", wl, "--gpus", 2, "--json", ds)
    rule = load_json(ds)
    run_trainio("datagen", "-q", "--workload", wl, "--data-dir", tmpfs_dir / "d", "--gpus", 2)
    p = run_trainio("replay", "-q", "--workload", wl, "--data-dir", tmpfs_dir / "d", "--gpus", 2)
    line = next(ln for ln in p.stdout.splitlines() if "MLPerf dataset size" in ln)
    assert f"num_files_train ≥ {rule['num_files_train']}" in line and "this dataset: 4 files" in line, line
    assert "below the rule" in line
    warn = next(ln for ln in p.stderr.splitlines() if "warning" in ln and "RAM" in ln)
    m = re.search(r"5 × the RAM of the 1 client host\(s\) \(5 × ([\d.]+) GiB = ([\d.]+) GiB\)", warn)
    assert m, warn
    ram, five = float(m.group(1)), float(m.group(2))
    assert ram == pytest.approx(rule["client_ram_bytes"] / GIB, abs=0.06)
    assert five == pytest.approx(5 * ram, abs=0.3)


def test_overrides_in_dlio_form_run_a_published_file_unchanged(tmpfs_dir: Path) -> None:
    """MLPerf's unet3d_h100.yaml (146 MB samples, 168 files, checkpoints) scaled down from
    the command line only; the overrides are listed in the results' settings."""
    out = tmpfs_dir / "r.json"
    ov = [
        "++workload.dataset.num_files_train=8",
        "++workload.dataset.record_length_bytes=65536",
        "++workload.dataset.record_length_bytes_stdev=0",
        "++workload.train.computation_time=0.001",
        "++workload.workflow.checkpoint=false",
        "--param",
        "train.epochs=1",
    ]
    run_trainio(
        "replay",
        "-q",
        "--generate",
        "--workload",
        COPIES / "unet3d_h100.yaml",
        "--data-dir",
        tmpfs_dir / "d",
        "--gpus",
        2,
        "--batch-size",
        2,
        *ov,
        "--json",
        out,
    )
    r = load_json(out)
    s = r["settings"]
    assert s["params"] == [
        "train.epochs=1",
        "dataset.num_files_train=8",
        "dataset.record_length_bytes=65536",
        "dataset.record_length_bytes_stdev=0",
        "train.computation_time=0.001",
        "workflow.checkpoint=false",
    ]
    # unet3d is npz: each file is numpy.savez's zip of one 64 KiB sample, 256 bytes more
    # (local header 55, npy header 128, central directory and end record 73)
    assert s["dataset_files"] == 8 and s["dataset_bytes"] == 8 * (65536 + 256)
    assert s["reader"]["model"] == "numpy-npz"
    assert r["samples"] == 8 and r["epochs"] == 1


@pytest.mark.parametrize(
    "bad,says",
    [
        ("++workload.dataset.num_files_trian=8", "++workload.dataset.num_files_trian: not a workload key"),
        ("++workload.reader.batch_size=-3", "reader.batch_size"),
        ("++workload.dataset.num_files_train=[1,2]", "one value"),
        ("++model.name=x", "++workload.KEY=VALUE"),
        ("dataset.num_files_train=8", "++workload.KEY=VALUE"),
    ],
)
def test_a_bad_override_is_one_line_exit_2_and_nothing_written(tmpfs_dir: Path, bad, says) -> None:
    wl = write_workload(tmpfs_dir / "wl.yaml", files=4, record=64 << 10, batch=2, compute=0.0)
    for cmd in (["datagen"], ["replay", "--generate"]):
        p = run_trainio(*cmd, "--workload", wl, "--data-dir", tmpfs_dir / "d", bad, check=False)
        assert p.returncode == 2, (cmd, p.stderr)
        lines = p.stderr.strip().splitlines()
        assert len(lines) == 1 and says in lines[0], p.stderr
        assert not (tmpfs_dir / "d").exists()


def test_missing_files_for_more_steps_name_steps_batch_and_gpus(tmpfs_dir: Path) -> None:
    wl = write_workload(tmpfs_dir / "wl.yaml", files=4, record=64 << 10, batch=2, compute=0.0)
    run_trainio("datagen", "-q", "--workload", wl, "--data-dir", tmpfs_dir / "d")
    p = run_trainio(
        "replay", "-q", "--workload", wl, "--data-dir", tmpfs_dir / "d", "--steps", 3, "--batch-size", 7, check=False
    )
    assert p.returncode == 2
    err = p.stderr.strip().splitlines()[-1]
    for word in ("missing", "--steps 3", "--batch-size 7", "--gpus 1", "needs 21 files", "holds 4"):
        assert word in err, err


def test_datagen_help_lists_only_what_datagen_uses_and_takes_q(tmpfs_dir: Path) -> None:
    h = run_trainio("datagen", "--help").stdout
    for used in (
        "--workload",
        "--trace",
        "--data-dir",
        "--gpus",
        "--steps",
        "--batch-size",
        "--seed",
        "--param",
        "--force",
        "-q, --quiet",
        "++workload.KEY=VALUE",
    ):
        assert used in h, used
    for unused in (
        "--computation-time",
        "--read-threads",
        "--prefetch-size",
        "--transfer-size",
        "--epochs",
        "--checkpoint-mode",
        "--odirect",
        "--json",
        "--generate",
        "--threshold",
        "--io-engine",
    ):
        assert unused not in h, unused
    wl = write_workload(tmpfs_dir / "wl.yaml", files=4, record=64 << 10, batch=2, compute=0.0)
    run_trainio("datagen", "-q", "--workload", wl, "--data-dir", tmpfs_dir / "d")
    assert len(list((tmpfs_dir / "d" / "train").iterdir())) == 4


def test_sweep_starts_at_start_gpus_and_saves_next_to_the_data(tmpfs_dir: Path) -> None:
    wl = write_workload(tmpfs_dir / "wl.yaml", files=4, record=64 << 10, batch=2, compute=0.01)
    cwd = tmpfs_dir / "cwd"
    cwd.mkdir()
    env_cwd = dict(cwd=cwd)
    import subprocess

    from replay_helpers import MPI_ENV, TRAINIO

    p = subprocess.run(
        [
            str(TRAINIO),
            "sweep",
            "--workload",
            str(wl),
            "--data-dir",
            str(tmpfs_dir / "d"),
            "--generate",
            "--steps",
            "3",
            "--start-gpus",
            "2",
            "--max-gpus",
            "4",
        ],
        capture_output=True,
        text=True,
        env={**os.environ, **MPI_ENV},
        timeout=300,
        **env_cwd,
    )
    assert p.returncode == 0, p.stderr
    assert list(cwd.iterdir()) == [], "sweep wrote into the working directory"
    curve = tmpfs_dir / "d" / "trainio-sweep.json"
    s = json.loads(curve.read_text())
    assert [pt["gpus"] for pt in s["curve"]] == [2, 4]
    assert f"curve saved to {curve}" in p.stdout
    # --gpus is the job's size in replay; sweep tries many and does not take it.
    q = run_trainio("sweep", "--workload", wl, "--data-dir", tmpfs_dir / "d", "--gpus", 2, check=False)
    assert q.returncode == 2 and "--gpus" in q.stderr
