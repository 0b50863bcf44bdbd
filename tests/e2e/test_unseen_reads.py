"""Reads that are not read syscalls: a process that reads its data through io_uring (fio)
leaves block requests but no read syscalls of its data unless recorded with --io-uring;
one that reads through mmap (numpy's memmap) leaves page faults, which the file layer
records (schema 1.6).

Without them the job model must say so (`analyze --json`: job_model.incomplete names the
process and the likely cause) and `replay --trace` must refuse to replay the few reads it
did see (exit 2, one line), unless told --allow-incomplete. With them the trace is
complete, and a replay reads as the job did: through mmap, page by page.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from trainio_testlib import ROOT, mounted_loop_fs, require_root, run, trainio

MiB = 1 << 20
SIZE_MB = 64
PY = str(ROOT / ".venv" / "bin" / "python")

MMAP_READER = """
import sys, numpy as np
a = np.memmap(sys.argv[1], dtype=np.uint8, mode="r")
print(int(a[::4096].astype(np.uint64).sum()))
"""


def _evict(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


@pytest.fixture
def data_file():
    require_root("loop devices, BPF")
    with mounted_loop_fs(SIZE_MB * 3) as (_dev, _mm, mnt):
        f = mnt / "data.bin"
        with open(f, "wb") as out:
            out.write(os.urandom(SIZE_MB * MiB))
        yield mnt, f


READERS = {
    "io_uring": lambda f: [
        "fio",
        "--name=uring",
        "--ioengine=io_uring",
        "--rw=read",
        "--bs=1M",
        f"--filename={f}",
        f"--size={SIZE_MB}M",
        "--direct=0",
        "--output=/dev/null",
    ],
}


@pytest.mark.root
@pytest.mark.slow
@pytest.mark.parametrize("how", sorted(READERS))
def test_reads_the_file_layer_cannot_see_are_reported_and_not_replayed(data_file, tmp_path, how):
    mnt, f = data_file
    _evict(f)
    trace = tmp_path / "trace"
    rec = trainio("record", "-o", trace, "--", *READERS[how](f), timeout=300)
    assert rec.returncode == 0, rec.stderr
    a = trainio("analyze", trace, "--json", timeout=300)
    assert a.returncode == 0, a.stderr
    model = json.loads(a.stdout)["job_model"]
    why = model["incomplete"]
    assert why is not None, model
    assert "mmap or io_uring" in why, why
    # the block layer did see the data
    blocks = sum(c["block_read_bytes"] for c in model["coverage"])
    assert blocks >= SIZE_MB * MiB * 0.9, model["coverage"]
    human = trainio("analyze", trace, timeout=300)
    assert "INCOMPLETE" in human.stdout, human.stdout
    data_dir = mnt / "replay"
    r = trainio("replay", "--trace", trace, "--data-dir", data_dir, "--gpus", "1", "--generate", "-q", timeout=300)
    assert r.returncode == 2, (r.returncode, r.stderr)
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and "--allow-incomplete" in lines[0] and str(trace) in lines[0], r.stderr
    assert not data_dir.exists(), "nothing written when the replay is refused"
    if model["gpus"]:
        ok = trainio(
            "replay",
            "--trace",
            trace,
            "--data-dir",
            data_dir,
            "--gpus",
            "1",
            "--generate",
            "--allow-incomplete",
            "-q",
            timeout=300,
        )
        assert ok.returncode == 0, ok.stderr
    run(["rm", "-rf", str(data_dir)])


@pytest.mark.root
@pytest.mark.slow
def test_reads_through_mmap_are_complete_and_replayed_through_mmap(data_file, tmp_path):
    mnt, f = data_file
    st = os.stat(mnt)
    majmin = f"{os.major(st.st_dev)}:{os.minor(st.st_dev)}"
    _evict(f)
    trace = tmp_path / "trace"
    rec = trainio("record", "-o", trace, "--dev", majmin, "--", PY, "-c", MMAP_READER, str(f), timeout=300)
    assert rec.returncode == 0, rec.stderr
    a = trainio("analyze", trace, "--json", timeout=300)
    assert a.returncode == 0, a.stderr
    model = json.loads(a.stdout)["job_model"]
    assert model["incomplete"] is None, model
    assert model["data_dev"] == majmin and len(model["gpus"]) == 1, model
    # The pages its faults and fault-arounds made readable are the GPU's data reads: not
    # every page (a fault maps its whole large folio, whose other pages then fault no
    # more: traces/SCHEMA.md), but more than half of them, each once.
    assert SIZE_MB * MiB // 2 <= model["gpus"][0]["bytes"] <= SIZE_MB * MiB, model["gpus"][0]

    replayed = tmp_path / "replayed"
    r = trainio(
        "replay",
        "--trace",
        trace,
        "--data-dir",
        mnt / "replay",
        "--gpus",
        "1",
        "--generate",
        "--drop-caches",
        "-q",
        "--record",
        replayed,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr
    c = trainio("compare", trace, replayed, "--layer", "block", "--dev", majmin, "--json", timeout=300)
    assert c.returncode == 0, c.stderr
    block = json.loads(c.stdout)
    got, want = block["bytes_read"]["b"], block["bytes_read"]["a"]
    assert abs(got - want) <= 0.05 * want, block
    assert block["size_w1_log2"] <= 0.5, block


URING = {
    # sequential reads one at a time; random reads 16 deep on a registered (fixed) file; writes
    "read": ["--rw=read", "--iodepth=1"],
    "randread-fixed": ["--rw=randread", "--iodepth=16", "--registerfiles=1", "--norandommap=0"],
    "write": ["--rw=write", "--iodepth=4"],
}


@pytest.mark.root
@pytest.mark.slow
@pytest.mark.parametrize("how", sorted(URING))
def test_io_uring_requests_are_file_layer_rows_with_record_io_uring(data_file, tmp_path, how):
    """With `record --io-uring`, each io_uring request of the traced process is one
    file-layer row: every byte, at the offsets fio asked, with the process's requests in
    flight as the queue depth; the model then finds the reads complete."""
    mnt, f = data_file
    _evict(f)
    trace = tmp_path / "trace"
    target = mnt / "out.bin" if how == "write" else f
    cmd = [
        "fio",
        "--name=uring",
        "--ioengine=io_uring",
        "--bs=1M",
        f"--filename={target}",
        f"--size={SIZE_MB}M",
        "--direct=0",
        "--output=/dev/null",
        *URING[how],
    ]
    rec = trainio("record", "-q", "--io-uring", "-o", trace, "--", *cmd, timeout=300)
    assert rec.returncode == 0, rec.stderr
    import pyarrow.dataset as ds

    rows = ds.dataset(trace, format="parquet").to_table().to_pylist()
    op = "write" if how == "write" else "read"
    mine = [r for r in rows if r["layer"] == "file" and r["op"] == op and r["file"] == str(target)]
    assert sum(r["bytes"] for r in mine) == SIZE_MB * MiB, len(mine)
    assert sorted(r["offset"] for r in mine) == [k * MiB for k in range(SIZE_MB)]
    assert all(r["bytes"] == r["bytes_requested"] == MiB and r["error"] == 0 for r in mine)
    assert len({r["pid"] for r in mine}) == 1
    depth = max(r["queue_depth"] for r in mine)
    if how == "randread-fixed":
        assert 1 < depth <= 16, depth
        assert all(r["fd"] == -1 for r in mine), "a registered file's index is no fd"
    elif how == "read":
        assert depth == 1, depth
    if op == "read":
        a = trainio("analyze", trace, "--json", timeout=300)
        assert a.returncode == 0, a.stderr
        model = json.loads(a.stdout)["job_model"]
        assert model["incomplete"] is None, model
        assert sum(g["bytes"] for g in model["gpus"]) == SIZE_MB * MiB, model["gpus"]


def test_record_io_uring_needs_the_file_layer(tmp_path):
    require_root("BPF")
    r = trainio("record", "--io-uring", "--layers", "block", "-o", tmp_path / "t", "--", "true", timeout=60)
    assert r.returncode == 2 and "--io-uring" in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert not (tmp_path / "t").exists()
