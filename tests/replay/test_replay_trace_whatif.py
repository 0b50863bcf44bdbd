"""Trace mode: the replay's space is the job's, replays in place, and the what-ifs
(--gpus-per-process, --compute-scale)."""

from __future__ import annotations

import os

import pytest
from replay_helpers import load_json, run_trainio
from test_replay_trace import file_read, synthetic_rows, write_trace

KIB = 1 << 10
FILE = 64 * KIB
FILES = 64
GPUS = 4


def job_rows(prefix="/job/data"):
    """A 2-epoch job at 4 GPUs (pids 100..103) over 64 files of 64 KiB: each epoch a GPU
    reads a shard of 16 files, 4 per step (one 64 KiB read each, 0.5 ms apart), then
    computes 20 ms; in epoch 2 the shards move one GPU on, as a sampler reshuffles them.
    Every file is read twice, by two GPUs: 256 reads of 64 distinct files."""
    rows = []
    for gpu in range(GPUS):
        t = 1000.0
        for epoch in range(2):
            shard = [f for f in range(FILES) if f % GPUS == (gpu + epoch) % GPUS]
            for step in range(len(shard) // 4):
                for k, f in enumerate(shard[step * 4 : step * 4 + 4]):
                    rows.append(file_read(100 + gpu, f"{prefix}/f{f:03}.bin", 0, FILE, t + 0.5 * k, 0.4, 1))
                t += 2.0 + 20.0
    return rows


def laid_out_bytes(root):
    return sum(p.stat().st_size for p in (root / "trace").rglob("f*.dat"))


def test_layout_is_the_jobs_data_once_per_recorded_gpu_count(tmpfs_dir):
    trace = tmpfs_dir / "trace"
    write_trace(trace, job_rows())
    distinct = FILES * FILE
    data = tmpfs_dir / "data"
    out = tmpfs_dir / "r.json"
    run_trainio("replay", "--trace", trace, "--data-dir", data, "--generate", "--gpus", GPUS, "--json", out, "-q")
    r = load_json(out)
    assert len(r["settings"]["templates"]) == GPUS
    # The job read 64 distinct files (each twice): the layout is their size, not 4 GPUs
    # × 32 files each.
    assert laid_out_bytes(data) == pytest.approx(distinct, rel=0.05)
    assert r["settings"]["dataset_bytes"] == pytest.approx(distinct, rel=0.05)
    assert r["settings"]["dataset_files"] == FILES
    assert r["bytes_read"] == 2 * distinct, "every recorded read is replayed"
    # Twice the GPUs: a second copy for GPUs 4..7, twice the bytes laid out and read.
    data8 = tmpfs_dir / "data8"
    out8 = tmpfs_dir / "r8.json"
    run_trainio("replay", "--trace", trace, "--data-dir", data8, "--generate", "--gpus", 8, "--json", out8, "-q")
    r8 = load_json(out8)
    assert laid_out_bytes(data8) == pytest.approx(2 * distinct, rel=0.05)
    assert sorted(p.name for p in (data8 / "trace").iterdir() if p.name.startswith("c")) == ["c00000", "c00001"]
    assert r8["bytes_read"] == 2 * r["bytes_read"]


def test_in_place_reads_the_jobs_own_files(tmpfs_dir):
    trace = tmpfs_dir / "trace"
    write_trace(trace, job_rows("/job/data"))
    copy = tmpfs_dir / "copy"
    copy.mkdir()
    for f in range(FILES):
        p = copy / f"f{f:03}.bin"
        p.write_bytes(os.urandom(FILE))
        # atime before mtime: the first read moves it (relatime)
        os.utime(p, (0, p.stat().st_mtime))
    data = tmpfs_dir / "data"
    out = tmpfs_dir / "r.json"
    run_trainio(
        "replay", "--trace", trace, "--data-dir", data, "--map-path", f"/job/data={copy}", "--gpus", GPUS, "--json", out
    )
    r = load_json(out)
    assert r["bytes_read"] == 2 * FILES * FILE
    assert r["settings"]["map_path"] == [f"/job/data={copy}"]
    unread = [p.name for p in copy.iterdir() if p.stat().st_atime == 0]
    assert unread == [], f"files the in-place replay did not read: {unread}"
    # Nothing generated: no copy of the data under --data-dir.
    assert not (data / "trace").exists() or not list((data / "trace").rglob("f*.dat"))
    assert sorted(p.name for p in copy.iterdir()) == [f"f{f:03}.bin" for f in range(FILES)]


def one_line_exit_2(p, *needles):
    assert p.returncode == 2, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and all(n in lines[0] for n in needles), p.stderr


def test_in_place_refuses_missing_short_and_unmapped_files(tmpfs_dir):
    trace = tmpfs_dir / "trace"
    write_trace(trace, job_rows("/job/data"))
    copy = tmpfs_dir / "copy"
    copy.mkdir()
    for f in range(FILES):
        (copy / f"f{f:03}.bin").write_bytes(b"\0" * FILE)
    base = ("replay", "--trace", trace, "--data-dir", tmpfs_dir / "data", "--gpus", GPUS)
    short = copy / "f007.bin"
    short.write_bytes(b"\0" * (FILE - 1))
    one_line_exit_2(
        run_trainio(*base, "--map-path", f"/job/data={copy}", check=False), str(short), "/job/data/f007.bin"
    )
    short.unlink()
    one_line_exit_2(run_trainio(*base, "--map-path", f"/job/data={copy}", check=False), str(short))
    one_line_exit_2(run_trainio(*base, "--map-path", f"/elsewhere={copy}", check=False), "--map-path", "/job/data/f")
    one_line_exit_2(run_trainio(*base, "--map-path", "job=/x", check=False), "--map-path job=/x")
    one_line_exit_2(
        run_trainio(*base, "--map-path", f"/job/data={copy}", "--generate", check=False), "--map-path", "--generate"
    )
    assert not (tmpfs_dir / "data").exists(), "a refused replay writes nothing"


def test_compute_scale_halves_the_compute_and_doubles_the_need(tmpfs_dir):
    trace = tmpfs_dir / "trace"
    write_trace(trace, synthetic_rows())
    runs = {}
    for scale in (None, 0.5):
        out = tmpfs_dir / f"r{scale}.json"
        extra = () if scale is None else ("--compute-scale", scale)
        p = run_trainio(
            "replay", "--trace", trace, "--data-dir", tmpfs_dir / "d", "--generate", "--gpus", 2, "--json", out, *extra
        )
        runs[scale] = (load_json(out), p.stdout)
    (full, _), (half, human) = runs[None], runs[0.5]
    assert half["settings"]["compute_scale"] == 0.5 and full["settings"]["compute_scale"] == 1.0
    for a, b in zip(full["settings"]["templates"], half["settings"]["templates"]):
        assert b["compute_s"] == pytest.approx(a["compute_s"] / 2, rel=1e-9)
        assert b["required_mib_s"] == pytest.approx(2 * a["required_mib_s"], rel=1e-9)
    assert half["settings"]["computation_time_mean_s"] == pytest.approx(
        full["settings"]["computation_time_mean_s"] / 2, rel=1e-9
    )
    need = half["settings"]["required_mib_s_per_gpu"]
    assert need == pytest.approx(2 * full["settings"]["required_mib_s_per_gpu"], rel=1e-9)
    assert f"need        {need:.1f} MiB/s" in human and "compute × 0.5" in human
    # The replay slept the scaled compute: a sleep ends late, never early, and a loaded
    # host adds milliseconds, so the bound is the exact scaled total below and above.
    for g_full, g_half in zip(full["per_gpu"], half["per_gpu"]):
        assert g_half["compute_s"] >= g_full["compute_s"] / 2 - 0.01
        assert g_half["compute_s"] < g_full["compute_s"] * 0.5 + 0.03
    assert half["bytes_read"] == full["bytes_read"]


def test_gpus_per_process_doubles_the_gpus_and_splits_their_batches(tmpfs_dir):
    trace = tmpfs_dir / "trace"
    write_trace(trace, synthetic_rows())
    out1, out2 = tmpfs_dir / "r1.json", tmpfs_dir / "r2.json"
    run_trainio("replay", "--trace", trace, "--data-dir", tmpfs_dir / "d", "--generate", "--gpus", 2, "--json", out1)
    run_trainio(
        "replay",
        "--trace",
        trace,
        "--data-dir",
        tmpfs_dir / "d",
        "--generate",
        "--gpus",
        4,
        "--gpus-per-process",
        2,
        "--json",
        out2,
    )
    one, two = load_json(out1), load_json(out2)
    t1, t2 = one["settings"]["templates"], two["settings"]["templates"]
    assert len(t2) == 2 * len(t1) == 4 and two["gpus"] == 4
    assert [t["pid"] for t in t2] == [100, 100, 200, 200]
    # Each process's bytes are split between its two accelerators, every step kept.
    for k, t in enumerate(t1):
        a, b = t2[2 * k], t2[2 * k + 1]
        assert a["bytes"] + b["bytes"] == t["bytes"]
        assert a["bytes"] == b["bytes"] == t["bytes"] // 2
        assert a["steps"] == b["steps"] == t["steps"]
        assert a["required_mib_s"] == pytest.approx(t["required_mib_s"] / 2, rel=1e-9)
    # The same job's data, read by twice the GPUs: the same bytes in all.
    assert two["bytes_read"] == one["bytes_read"]
    assert two["settings"]["gpus_per_process"] == 2
    per_gpu = sorted(g["bytes_read"] for g in two["per_gpu"])
    assert per_gpu == sorted(t["bytes"] for t in t2)


def test_the_analyzers_job_model_takes_the_same_what_ifs(tmpfs_dir):
    from trainio_analysis.analyze.result import job_model

    trace = tmpfs_dir / "trace"
    write_trace(trace, synthetic_rows())
    base = job_model(trace)
    if base is None:
        pytest.fail("the analyzer's native extension is not built: run 'make build'")
    what_if = job_model(trace, gpus_per_process=2, compute_scale=0.5)
    assert len(what_if["gpus"]) == 2 * len(base["gpus"])
    for k, g in enumerate(base["gpus"]):
        a, b = what_if["gpus"][2 * k], what_if["gpus"][2 * k + 1]
        assert a["bytes"] + b["bytes"] == g["bytes"]
        assert a["compute_s"] == pytest.approx(g["compute_s"] / 2, rel=1e-9)
        # Half the bytes per step in half the compute: the same need per accelerator.
        assert a["required_mib_s"] == pytest.approx(g["required_mib_s"], rel=1e-9)
    assert any("--gpus-per-process" in w for w in what_if["warnings"])
