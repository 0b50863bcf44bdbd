"""Checkpoints end to end: MLPerf Storage's real llama3 files planned as they are, a
scaled-down checkpoint written and read back on ext4 over a loop device (the bytes
checked from the file system), the write rate under a cgroup throttle (v2 io.max or v1 blkio), checkpoints
inside training and what AU does with them, and the errors for bad keys."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from replay_helpers import MPI_ENV, ROOT, TRAINIO, in_cgroup, load_json, run_trainio

from trainio_testlib import PROGRESS_ENV, require_root, wait_for_steps

MIB = 1 << 20
GIB = 1 << 30
# The real files, unchanged: the repository's copies (tests/replay/data/dlio-configs,
# from ../shared/dlio-configs), checked against the originals where those are present.
SHARED = ROOT.parent / "shared" / "dlio-configs"
COPIES = Path(__file__).resolve().parent / "data" / "dlio-configs"

# MLPerf Storage submission guidelines §2.2.1 Table 2, keyed by hidden size: processes
# (TP×PP×DP) and checkpoint size in DLIO's GB (2^30 bytes). For 1T the table says 18 TB,
# the sum of mlpstorage's LLM_SIZE_BY_RANK (2,571 model + 15,426 optimizer); DLIO's
# formula, which writes the bytes, gives 15,426 GiB in all (docs/design/replay.md, The checkpoint formula).
TABLE = {4096: (8, 105.0), 8192: (64, 912.0), 16384: (512, 5290.0), 25872: (1024, 15426.0)}

# llama3_405b.yaml scaled to ~290 MiB: the same parallelism kinds (TP, PP, ZeRO 1), so
# the layer-per-file layout is written, on 8 simulated GPUs (TP 2 × PP 2 × DP 2).
SCALE = [
    "model.num_layers=4",
    "model.parallelism.tensor=2",
    "model.parallelism.pipeline=2",
    "model.transformer.vocab_size=8192",
    "model.transformer.hidden_size=512",
    "model.transformer.ffn_hidden_size=1792",
    "checkpoint.num_checkpoints_write=1",
    "checkpoint.num_checkpoints_read=1",
    "checkpoint.time_between_checkpoints=0",
]


def params(items):
    return [a for p in items for a in ("--param", p)]


def llama_files():
    # The object-storage variant (v3.0 folder's llama3_8b_checkpoint_minio.yaml, 2
    # checkpoints to s3://) is planned on local files in test_replay_every_yaml.
    files = [f for f in sorted(COPIES.glob("*/llama*.yaml")) if "\nstorage:" not in f.read_text()]
    if not files:
        pytest.fail(f"no llama checkpoint files under {COPIES}: the real MLPerf/DLIO files are needed")
    for f in files:
        original = SHARED / f.parent.name / f.name
        if original.exists():
            assert original.read_bytes() == f.read_bytes(), f"{f} differs from {original}"
    return files


def hidden_size(path: Path) -> int:
    return int(re.search(r"hidden_size:\s*(\d+)", path.read_text()).group(1))


def test_real_llama_files_plan_the_published_totals(tmp_path):
    files = llama_files()
    assert len(files) >= 8  # 4 from mlcommons/storage, 4 from dlio_benchmark
    for f in files:
        before = f.read_bytes()
        gpus, table_gib = TABLE[hidden_size(f)]
        out = tmp_path / f"{f.parent.name}-{f.stem}.json"
        p = run_trainio(
            "replay", "--workload", f, "--gpus", gpus, "--data-dir", tmp_path / "never", "--plan-only", "--json", out
        )
        c = load_json(out)["checkpoint"]
        assert c["planned_gib"] == pytest.approx(table_gib, rel=0.005), (f, c["planned_gib"])
        assert c["planned_bytes"] == sum(c["bytes_per_gpu"]) == c["model_bytes"] + c["optimizer_bytes"]
        assert c["world"] == gpus and len(c["bytes_per_gpu"]) == gpus
        assert c["fsync"] is True and c["num_checkpoints_write"] == 10
        assert "plan only: nothing written" in p.stdout and f"{c['planned_gib']:.2f} GiB" in p.stdout
        assert f.read_bytes() == before
    assert not (tmp_path / "never").exists()


def test_subset_mode_writes_the_first_gpus_share(tmp_path):
    f = ROOT / "configs" / "llama3_405b.yaml"
    out = tmp_path / "s.json"
    run_trainio(
        "replay",
        "--workload",
        f,
        "--gpus",
        8,
        "--data-dir",
        tmp_path / "never",
        "--plan-only",
        "--checkpoint-mode",
        "subset",
        "--param",
        "model.parallelism.data=2",
        "--json",
        out,
    )
    full = tmp_path / "f.json"
    run_trainio(
        "replay", "--workload", f, "--gpus", 512, "--data-dir", tmp_path / "never", "--plan-only", "--json", full
    )
    s, w = load_json(out)["checkpoint"], load_json(full)["checkpoint"]
    assert s["mode"] == "subset" and s["world"] == 512 and len(s["bytes_per_gpu"]) == 8
    # DLIO's subset: ranks 0..7 of the 512-rank job, the same shards they write there.
    assert s["bytes_per_gpu"] == w["bytes_per_gpu"][:8]
    assert s["full_checkpoint_bytes"] == w["planned_bytes"]
    assert load_json(out)["settings"]["params"] == ["model.parallelism.data=2", "checkpoint.mode=subset"]


@pytest.mark.parametrize(
    ("param", "words"),
    [
        ("model.num_layers=0", "model.num_layers"),
        ("model.num_layers=-2", "model.num_layers"),
        ("model.parallelism.tensor=.nan", "model.parallelism.tensor"),
        ("checkpoint.num_checkpoints_write=-3", "num_checkpoints_write"),
        ("checkpoint.mode=sometimes", "checkpoint.mode"),
        ("checkpoint.time_between_checkpoints=-0.5", "time_between_checkpoints"),
        ("checkpoint.checkpoint_folder=/etc/x", "checkpoint_folder"),
        ("model.parallelism.zero_stage=7", "zero_stage"),
        ("model.model_datatype=fp12", "model_datatype"),
        ("model.no_such_key=1", "model.no_such_key"),
    ],
)
def test_bad_checkpoint_keys_are_one_line_errors(tmp_path, param, words):
    f = ROOT / "configs" / "llama3_8b.yaml"
    p = run_trainio("replay", "--workload", f, "--gpus", 8, "--data-dir", tmp_path / "d", "--param", param, check=False)
    assert p.returncode == 2, p
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1, p.stderr
    assert str(f) in lines[0] and words in lines[0], lines[0]
    assert not (tmp_path / "d").exists()


def test_default_mode_needs_whole_model_parallel_groups(tmp_path):
    p = run_trainio(
        "replay",
        "--workload",
        ROOT / "configs" / "llama3_70b.yaml",
        "--gpus",
        12,
        "--data-dir",
        tmp_path / "d",
        "--plan-only",
        check=False,
    )
    assert p.returncode == 2 and "not a multiple of TP×PP" in p.stderr, p.stderr


def files_by_gpu(ckpt_dir: Path, tensor: int, pipeline: int) -> dict[int, int]:
    """Bytes on disk per DLIO rank, from the file names DLIO gives the shards."""
    mp = tensor * pipeline
    per_gpu: dict[int, int] = {}
    for f in ckpt_dir.iterdir():
        if m := re.fullmatch(r"zero_pp_rank_(\d+)_mp_rank_(\d+)_(model|optim)_states\.pt", f.name):
            rank = int(m.group(1)) * mp + int(m.group(2))
        elif m := re.fullmatch(r"layer_\d+-model_(\d+)_model_states\.pt", f.name):
            rank = int(m.group(1))  # written by data-parallel rank 0
        else:
            raise AssertionError(f"unexpected checkpoint file {f}")
        per_gpu[rank] = per_gpu.get(rank, 0) + f.stat().st_size
    return per_gpu


def outside(mnt: Path, data: Path) -> list[str]:
    return [str(p) for p in mnt.rglob("*") if p != data and data not in p.parents and "lost+found" not in p.parts]


@pytest.mark.root
@pytest.mark.slow
def test_scaled_checkpoint_on_ext4_writes_the_planned_bytes(tmp_path, loop_fs):
    if not shutil.which("mpirun"):
        pytest.fail("mpirun is needed: ranks must write at once")
    _dev, _majmin, mnt = loop_fs
    data = mnt / "data"
    out = tmp_path / "r.json"
    mpirun = ("mpirun", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none", "-np", "2")
    p = run_trainio(
        "replay",
        "--workload",
        ROOT / "configs" / "llama3_405b.yaml",
        "--gpus",
        8,
        "--data-dir",
        data,
        *params(SCALE),
        "--json",
        out,
        prefix=mpirun,
        timeout=300,
    )
    r = load_json(out)
    c = r["checkpoint"]
    assert r["ranks"] == 2 and r["gpus"] == 8
    assert (c["tensor"], c["pipeline"], c["data_parallel"], c["zero_stage"]) == (2, 2, 2, 1)
    assert 200 * MIB < c["planned_bytes"] < 400 * MIB
    ckpt_dir = data / "checkpoints" / "llama_405b" / "global_epoch1_step1"
    on_disk = files_by_gpu(ckpt_dir, 2, 2)
    assert [on_disk.get(g, 0) for g in range(8)] == c["bytes_per_gpu"]
    assert sum(1 for _ in ckpt_dir.iterdir()) == c["files"]
    # ZeRO 1 with PP 2: DP rank 0 (GPUs 0-3) writes the model layer by layer: GPUs 4-7 only optimizer.
    assert sum(1 for f in ckpt_dir.iterdir() if f.name.startswith("layer_")) == 2 * (4 + 3)
    (w,), (rd,) = c["writes"], c["reads"]
    assert w["bytes"] == rd["bytes"] == c["planned_bytes"] == c["bytes_written"] == c["bytes_read"]
    assert w["files"] == c["files"]
    for x in (w, rd):
        assert x["throughput_gb_s"] == pytest.approx(x["bytes"] / x["duration_s"] / 1e9, rel=1e-9)
        assert x["throughput_gib_s"] == pytest.approx(x["bytes"] / x["duration_s"] / GIB, rel=1e-9)
    assert "write 1" in p.stdout and "read  1" in p.stdout and "GiB/s" in p.stdout
    assert outside(mnt, data) == []
    assert r["settings"]["params"] == SCALE


@pytest.mark.root
@pytest.mark.slow
def test_throttled_checkpoint_runs_at_the_throttle(tmp_path, loop_fs, throttle):
    """A cgroup caps the loop device at B = 100 MiB/s for writes and reads: the fsynced
    writes and the read-back (its pages dropped first) both run at B."""
    _dev, majmin, mnt = loop_fs
    bps = 100 * MIB
    th = throttle(majmin, bps, wbps=bps)
    out = tmp_path / "r.json"
    run_trainio(
        "replay",
        "--workload",
        ROOT / "configs" / "llama3_8b.yaml",
        "--gpus",
        4,
        "--data-dir",
        mnt / "data",
        *params([p for p in SCALE if "parallelism" not in p]),
        "--json",
        out,
        prefix=in_cgroup(th.path),
        timeout=300,
    )
    c = load_json(out)["checkpoint"]
    (w,), (rd,) = c["writes"], c["reads"]
    assert w["throughput_mib_s"] == pytest.approx(100.0, rel=0.10), w
    assert rd["throughput_mib_s"] == pytest.approx(100.0, rel=0.10), rd


TRAINING = """model:
  name: tiny
  type: transformer
  num_layers: 2
  parallelism:
    zero_stage: 3
  transformer:
    vocab_size: 8192
    hidden_size: 512
    ffn_hidden_size: 1792
workflow:
  train: True
  checkpoint: True
dataset:
  num_files_train: 64
  record_length_bytes: 65536
reader:
  batch_size: 2
  read_threads: 2
train:
  epochs: 2
  computation_time: 0.02
checkpoint:
  checkpoint_folder: ck
  fsync: True
{rule}
"""


@pytest.mark.parametrize(
    ("rule", "expected"),
    [
        ("  steps_between_checkpoints: 5", [(1, 5), (1, 10), (1, 15), (2, 5), (2, 10), (2, 15)]),
        ("  checkpoint_after_epoch: 2", [(2, 16)]),
    ],
)
def test_training_checkpoints_stop_the_gpus_and_stay_out_of_au(tmpfs_dir, rule, expected):
    """2 GPUs, 16 steps × 2 epochs of 20 ms compute from tmpfs, checkpointing ~200 MiB:
    the checkpoints take a large share of the wall time, yet AU stays where a
    compute-bound run is (DLIO leaves checkpoint time out of AU)."""
    wl = tmpfs_dir / "wl.yaml"
    wl.write_text(TRAINING.format(rule=rule))
    out = tmpfs_dir / "r.json"
    run_trainio("replay", "--workload", wl, "--gpus", 2, "--data-dir", tmpfs_dir / "d", "--generate", "--json", out)
    r = load_json(out)
    c = r["checkpoint"]
    assert [(x["epoch"], x["step"]) for x in c["writes"]] == expected
    assert all(x["bytes"] == c["planned_bytes"] for x in c["writes"])
    for e, step in expected:
        d = tmpfs_dir / "d" / "ck" / f"global_epoch{e}_step{step}"
        assert sum(f.stat().st_size for f in d.iterdir()) == c["planned_bytes"]
    stood = sum(e["checkpoint_s"] for e in r["per_epoch"])
    assert stood >= sum(x["duration_s"] for x in c["writes"])
    assert r["wall_s"] >= 32 * 0.02 + stood
    assert r["au_percent"] >= 95.0, (r["au_percent"], stood, r["wall_s"])
    plain = tmpfs_dir / "p.json"
    run_trainio(
        "replay",
        "--workload",
        wl,
        "--gpus",
        2,
        "--data-dir",
        tmpfs_dir / "d",
        "--json",
        plain,
        "--param",
        "workflow.checkpoint=false",
    )
    p = load_json(plain)
    assert "checkpoint" not in p
    assert r["au_percent"] == pytest.approx(p["au_percent"], abs=3.0)


def test_training_checkpoints_need_the_barrier(tmpfs_dir):
    wl = tmpfs_dir / "wl.yaml"
    wl.write_text(TRAINING.format(rule=""))
    p = run_trainio(
        "replay", "--workload", wl, "--data-dir", tmpfs_dir / "d", "--generate", "--no-barrier", check=False
    )
    assert p.returncode == 2 and "--no-barrier" in p.stderr and len(p.stderr.strip().splitlines()) == 1


def test_checkpoint_only_workload_has_no_dataset(tmp_path):
    p = run_trainio(
        "datagen", "--workload", ROOT / "configs" / "llama3_8b.yaml", "--data-dir", tmp_path / "d", check=False
    )
    assert p.returncode == 2 and "checkpoint-only" in p.stderr
    assert not (tmp_path / "d").exists()


def test_refuses_a_foreign_directory(tmp_path):
    d = tmp_path / "d"
    d.mkdir()
    (d / "precious").write_text("x")
    p = run_trainio(
        "replay",
        "--workload",
        ROOT / "configs" / "llama3_8b.yaml",
        "--gpus",
        8,
        "--data-dir",
        d,
        *params(SCALE[3:]),
        "--param",
        "model.num_layers=1",
        check=False,
    )
    assert p.returncode == 2 and "not empty" in p.stderr
    assert os.listdir(d) == ["precious"]


@pytest.mark.root
@pytest.mark.slow
def test_recorded_checkpoint_holds_the_planned_writes(tmp_path, loop_fs):
    """`--record` traces the checkpoint run: at the file layer every checkpoint file is
    written with exactly its planned bytes and read back in full."""
    import polars as pl

    from trainio_analysis.trace import scan_trace

    if not (ROOT / "target" / "release" / "trainio-record").exists():
        pytest.fail("the recorder is not built: run 'make'")
    _dev, _majmin, mnt = loop_fs
    data, trace, out = mnt / "data", tmp_path / "trace", tmp_path / "r.json"
    run_trainio(
        "replay",
        "--workload",
        ROOT / "configs" / "llama3_405b.yaml",
        "--gpus",
        8,
        "--data-dir",
        data,
        *params(SCALE),
        "--record",
        trace,
        "--json",
        out,
        "-q",
        timeout=300,
    )
    c = load_json(out)["checkpoint"]
    rows = (
        scan_trace(trace)
        .filter((pl.col("layer") == "file") & pl.col("file").str.starts_with(str(data) + "/"))
        .group_by("file", "op")
        .agg(pl.col("bytes").sum())
        .collect()
    )
    by = {(r["file"], r["op"]): r["bytes"] for r in rows.iter_rows(named=True)}
    ckpt_dir = data / "checkpoints" / "llama_405b" / "global_epoch1_step1"
    files = sorted(ckpt_dir.iterdir())
    assert len(files) == c["files"]
    for f in files:
        assert by.get((str(f), "write")) == f.stat().st_size, f
        assert by.get((str(f), "read")) == f.stat().st_size, f
    in_ckpt = [v for (f, op), v in by.items() if op == "write" and f.startswith(str(ckpt_dir) + "/")]
    assert sum(in_ckpt) == c["planned_bytes"]


def _mpirun(ranks: int) -> tuple[str, ...]:
    """The prefix that runs `ranks` replay ranks under mpirun (none for one rank)."""
    if ranks == 1:
        return ()
    mpirun = shutil.which("mpirun")
    if mpirun is None:
        pytest.fail("mpirun is missing (OpenMPI is a dependency: scripts/install-deps.sh)")
    return (
        mpirun,
        "--allow-run-as-root",
        "--oversubscribe",
        "--bind-to",
        "none",
        "-x",
        "TRAINIO_PROGRESS_S",
        "-np",
        str(ranks),
    )


@contextlib.contextmanager
def small_tmpfs(tmp_path: Path, size: str):
    """A tmpfs of `size` (a file system that fills), unmounted even when the test fails."""
    require_root("mounts a small tmpfs")
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "none", str(mnt)], check=True)
    try:
        yield mnt
    finally:
        subprocess.run(["umount", str(mnt)], check=False)


@pytest.mark.root
@pytest.mark.parametrize("ranks", [1, 2])
def test_a_checkpoint_that_does_not_fit_keeps_the_training_results(tmp_path, ranks):
    """The file system fills while the run is on: a 2 GiB tmpfs holds the dataset and the
    run's six checkpoints (203 MiB each), so the check before the first step passes; once
    checkpoint 1 is written the test shrinks it to 310 MiB (another tenant took the room).
    Checkpoint 2 fails, its half-written directory goes, the first stays whole, the run
    stops there with its results saved, and the command ends in one line, exit 2. Under
    mpirun the ranks learn of the failure together and stop at the same step."""
    with small_tmpfs(tmp_path, "2g") as mnt:
        wl = tmp_path / "wl.yaml"
        # 0.4 s steps: 1.2 s or more between the progress line of step 7 and checkpoint 2
        wl.write_text(TRAINING.format(rule="  steps_between_checkpoints: 5").replace("time: 0.02", "time: 0.4"))
        out = tmp_path / "r.json"
        data = mnt / "d"
        cmd = [
            *_mpirun(ranks),
            TRAINIO,
            "replay",
            "--workload",
            wl,
            "--gpus",
            2,
            "--data-dir",
            data,
            "--generate",
            "--json",
            out,
        ]
        env = {**os.environ, **MPI_ENV, **PROGRESS_ENV}
        p = subprocess.Popen([str(c) for c in cmd], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        try:
            seen = wait_for_steps(p, at_least=7)
            subprocess.run(["mount", "-o", "remount,size=310m", str(mnt)], check=True)
            stdout, stderr = p.communicate(timeout=120)
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
        assert p.returncode == 2, (p.returncode, seen, stderr)
        # the error is one line (one rank's: rank 0's, which saved the results)
        (line,) = [x for x in stderr.splitlines() if "No space left" in x]
        assert line.startswith("trainio replay: "), line
        assert "checkpoint 2 write (epoch 1, step 10)" in line and "No space left on device" in line, line
        assert str(out) in line, line
        r = load_json(out)
        assert "checkpoint 2 write" in r["stopped"], r["stopped"]
        assert "STOPPED     after 9 steps" in stdout, stdout
        # the steps before the failed checkpoint: 9 ended (step 10's end was the checkpoint)
        assert r["steps"] == 9 and len(r["per_epoch"]) == 1, (r["steps"], r["per_epoch"])
        assert r["samples"] >= 2 * 9 * 2 and r["au_percent"] > 0
        c = r["checkpoint"]
        assert [(x["epoch"], x["step"]) for x in c["writes"]] == [(1, 5)]
        first = data / "ck" / "global_epoch1_step5"
        assert sum(f.stat().st_size for f in first.iterdir()) == c["planned_bytes"]
        assert not (data / "ck" / "global_epoch1_step10").exists()


@pytest.mark.root
@pytest.mark.parametrize("ranks", [1, 2])
def test_checkpoints_that_cannot_fit_are_refused_before_the_first_step(tmp_path, ranks):
    """A 310 MiB file system holds the dataset and one of the run's six 203 MiB
    checkpoints: the replay says so before its first step, in one line naming the data
    directory, the checkpoints and the free space, exit 2, with no checkpoint and no
    results written. The dataset it generated stays."""
    with small_tmpfs(tmp_path, "310m") as mnt:
        wl = tmp_path / "wl.yaml"
        wl.write_text(TRAINING.format(rule="  steps_between_checkpoints: 5"))
        out, data = tmp_path / "r.json", mnt / "d"
        p = run_trainio(
            "replay", "--workload", wl, "--gpus", 2, "--data-dir", data, "--generate", "--json", out,
            check=False, prefix=_mpirun(ranks),
        )  # fmt: skip
        assert p.returncode == 2, (p.returncode, p.stderr)
        (line,) = [x for x in p.stderr.splitlines() if "checkpoint(s)" in x]
        assert line.startswith("trainio replay: ") and f"--data-dir {data}: 6 checkpoint(s) of 20" in line, line
        assert "free" in line and "checkpoint.steps_between_checkpoints" in line, line
        assert not out.exists() and not (data / "ck").exists()
        assert len(list((data / "train").iterdir())) == 64, "the dataset it generated stays"


@pytest.mark.root
def test_a_checkpoint_only_run_that_cannot_fit_writes_nothing(tmp_path):
    """MLPerf's checkpoint-only llama3_405b file, scaled to ~290 MiB a checkpoint, two
    writes on a 400 MiB file system: refused before anything is written, not even the
    data directory."""
    with small_tmpfs(tmp_path, "400m") as mnt:
        data = mnt / "d"
        scale = [x for x in SCALE if "num_checkpoints_write" not in x] + ["checkpoint.num_checkpoints_write=2"]
        p = run_trainio(
            "replay", "--workload", ROOT / "configs" / "llama3_405b.yaml", "--gpus", 8, "--data-dir", data,
            *params(scale), check=False,
        )  # fmt: skip
        assert p.returncode == 2, (p.returncode, p.stderr)
        assert len(p.stderr.splitlines()) == 1 and "2 checkpoint(s) of 289" in p.stderr, p.stderr
        assert not data.exists()
