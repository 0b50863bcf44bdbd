"""The test of faithfulness (#21 item 3) for DLIO's indexed_binary and mmap_indexed_binary:
DLIO's reader (tests/formats/indexed_reader.py, PyTorch-style worker processes) and
trainio's emulation read the same generated files on a loop device whose reads a cgroup
caps at 300 MiB/s, each recorded with `trainio record`.

- indexed_binary: at the file layer the emulation issues the real reader's read syscalls
  on every file (the index files' reads when each worker makes its reader, then one read
  per sample), and `trainio compare` at the block layer puts request sizes within 0.5
  octave and per-issue queue depths within 1 (W1).
- mmap_indexed_binary: neither side makes a read syscall of the dataset (mmap), and at the
  block layer both read the index pages only: no data page, although every sample is
  "read"; compare's W1 scores hold as above.

Also: the formats' one-line refusals (exit 2, nothing written): O_DIRECT for these two
formats, and a format DLIO does not have (parquet)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import polars as pl
from formats_testlib import (
    compare,
    drop_cache,
    record_emulation,
    record_real,
    trainio,
    write_workload,
)

from trainio_testlib import TRAINIO, run, throttled_cgroup

CAP = 300 << 20
FILES, SPF, RECORD, BATCH, THREADS = 16, 4, 256 << 10, 2, 2


def _trace(trace: Path, majmin: str) -> pl.DataFrame:
    """The file-layer reads of the dataset (files under train/) of a trace."""
    df = pl.read_parquet(sorted(trace.glob("*.parquet")))
    df = df.filter((pl.col("layer") == "file") & (pl.col("dev") == majmin)).with_columns(
        pl.col("op").cast(pl.Utf8), pl.col("file").cast(pl.Utf8)
    )
    return df.filter(pl.col("op").str.contains("read") & pl.col("file").str.contains("/train/"))


def _by_reader(trace: Path, majmin: str) -> list[list[tuple[str, int]]]:
    """The samples (data file, offset) each reader read: per thread (a worker process of
    the real reader, a reader slot's thread of the replay), sorted; the readers sorted."""
    out: dict[int, list] = {}
    for f, off, tid in _trace(trace, majmin).select("file", "offset", "tid").iter_rows():
        if not f.endswith(".idx"):
            out.setdefault(tid, []).append((Path(f).name, off))
    return sorted(sorted(v) for v in out.values())


def _file_reads(trace: Path, majmin: str) -> dict[str, Counter]:
    """Per dataset file (by name), its read syscalls: (offset, bytes asked) → count. A
    multiset: the readers' processes read a file's samples in an order the scheduler
    decides."""
    df = pl.read_parquet(sorted(trace.glob("*.parquet")))
    df = df.filter((pl.col("layer") == "file") & (pl.col("dev") == majmin)).with_columns(
        pl.col("op").cast(pl.Utf8), pl.col("file").cast(pl.Utf8)
    )
    df = df.filter(pl.col("op").str.contains("read") & pl.col("file").str.contains("/train/"))
    out: dict[str, Counter] = {}
    for f, off, n in df.select("file", "offset", "bytes_requested").iter_rows():
        out.setdefault(Path(f).name, Counter())[(off, n)] += 1
    return out


def _record(fs, tmp_path: Path, fmt: str, loader: str = "pytorch", batch: int = BATCH):
    _, majmin, mnt = fs
    data = mnt / f"data-{fmt}"
    wl = write_workload(
        tmp_path / "w.yaml", fmt=fmt, loader=loader, files=FILES, spf=SPF, record=RECORD, batch=batch, threads=THREADS
    )
    if not data.exists():
        trainio("datagen", "--workload", wl, "--data-dir", data, "--gpus", 1, "-q")
    real, emu = tmp_path / "real", tmp_path / "emu"
    with throttled_cgroup(majmin, CAP) as th:
        drop_cache(data)
        record_real(real, fmt, data, spf=SPF, batch=batch, threads=THREADS, wrap=th.wrap, loader=loader)
        drop_cache(data)
        result = record_emulation(emu, wl, data, wrap=th.wrap)
    return majmin, data, real, emu, result


def test_indexed_binary_reads_as_dlios_reader(fs, tmp_path: Path) -> None:
    majmin, data, real, emu, result = _record(fs, tmp_path, "indexed_binary")
    block = compare(real, emu, majmin, "block")
    assert block["bytes_read"]["a"] > 0 and block["bytes_read"]["b"] > 0
    assert block["size_w1_log2"] <= 0.5, block
    assert block["qd_w1_issue"] <= 1.0, block

    want, got = _file_reads(real, majmin), _file_reads(emu, majmin)
    assert len(want) == 3 * FILES, sorted(want)
    assert got == want
    bs = next((data / "train").iterdir()).stat().st_blksize
    # each index file read whole (a buffer fill: 4 entries < st_blksize) by each worker
    idx = [reads for name, reads in want.items() if name.endswith(".idx")]
    assert len(idx) == 2 * FILES and all(r == Counter({(0, bs): THREADS}) for r in idx), idx[:2]
    # one read per sample, of the sample, where the index says it is
    sample = 256 << 10
    for name, reads in want.items():
        if name.endswith(".indexed_binary"):
            assert reads == Counter({(k * sample, sample): 1 for k in range(SPF)}), (name, reads)
    assert result["settings"]["reader"] == {
        "format": "indexed_binary",
        "data_loader": "pytorch",
        "model": "dlio-indexed-binary",
        "buffer_bytes": bs,
    }


def test_mmap_indexed_binary_faults_only_the_index_pages(fs, tmp_path: Path) -> None:
    majmin, data, real, emu, result = _record(fs, tmp_path, "mmap_indexed_binary")
    # mmap: no read syscall of the dataset on either side
    assert _file_reads(real, majmin) == {} and _file_reads(emu, majmin) == {}
    block = compare(real, emu, majmin, "block")
    dataset = FILES * SPF * RECORD
    for side in ("a", "b"):
        # the index pages (one per index file: 4 entries) and never the 16 MiB of samples
        assert 0 < block["bytes_read"][side] <= 2 * FILES * 4096, block
        assert block["bytes_read"][side] < dataset // 8, block
    assert block["size_w1_log2"] <= 0.5, block
    assert block["qd_w1_issue"] <= 1.0, block
    assert result["settings"]["reader"]["model"] == "dlio-mmap-indexed-binary"
    assert result["samples"] == FILES * SPF


def test_refusals_are_one_line_and_write_nothing(tmp_path: Path) -> None:
    for fmt, args, says in [
        ("indexed_binary", ["--odirect"], "refuses O_DIRECT"),
        ("mmap_indexed_binary", ["--odirect"], "refuses O_DIRECT"),
        ("parquet", ["--odirect"], "refuses O_DIRECT"),
        ("orc", [], "'orc' is not a format DLIO reads"),
    ]:
        wl = write_workload(tmp_path / f"{fmt}.yaml", fmt=fmt, files=2, record=4096, batch=1)
        data = tmp_path / f"data-{fmt}"
        cmd = [TRAINIO, "replay", "--workload", wl, "--data-dir", data, "--generate", "-q", "--gpus", 1, *args]
        p = run([str(c) for c in cmd])
        assert p.returncode == 2, (fmt, p.returncode, p.stderr)
        lines = p.stderr.strip().splitlines()
        assert len(lines) == 1 and says in lines[0] and str(wl.name) in lines[0], (fmt, p.stderr)
        assert not data.exists(), f"{fmt}: {data} written"


def test_dali_splits_each_batch_among_its_workers(fs, tmp_path: Path) -> None:
    """data_loader: dali (DLIO's DaliDataLoader): each batch's samples are split among the
    read_threads workers (batch 4, 2 workers: samples 0-1 and 2-3 of every batch), the
    index files read once by the GPU's process: the replay's readers read the same
    samples as DALI's workers, and compare's scores hold."""
    majmin, data, real, emu, result = _record(fs, tmp_path, "indexed_binary", "dali", batch=4)
    block = compare(real, emu, majmin, "block")
    assert block["bytes_read"]["a"] > 0 and block["bytes_read"]["b"] > 0
    assert block["size_w1_log2"] <= 0.5, block
    assert block["qd_w1_issue"] <= 1.0, block
    want, got = _file_reads(real, majmin), _file_reads(emu, majmin)
    assert got == want
    idx = [reads for name, reads in want.items() if name.endswith(".idx")]
    assert len(idx) == 2 * FILES and all(sum(r.values()) == 1 for r in idx), "index read once"
    readers = _by_reader(real, majmin)
    assert len(readers) == THREADS
    # worker 0 reads samples 0 and 1 of each batch of 4 (each file holds one batch)
    data_files = [n for n in want if not n.endswith(".idx")]
    assert readers[0] == sorted((n, k * RECORD) for n in data_files for k in (0, 1))
    assert _by_reader(emu, majmin) == readers
    assert result["settings"]["reader"]["data_loader"] == "dali"
