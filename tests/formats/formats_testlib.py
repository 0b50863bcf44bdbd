"""Helpers for the format tests (a module of its own, named uniquely: every suite has a
conftest): workload files with a dataset format, and a plain TFRecord framing check."""

from __future__ import annotations

import json
import os
import struct
import sys
from pathlib import Path

from trainio_testlib import TRAINIO, run

REAL_READER = Path(__file__).resolve().parent / "real_reader.py"
# DLIO's indexed_binary and mmap_indexed_binary readers
INDEXED_READER = Path(__file__).resolve().parent / "indexed_reader.py"


def write_workload(
    path: Path,
    *,
    fmt: str,
    loader: str = "pytorch",
    files: int = 8,
    spf: int = 1,
    record: int = 1 << 20,
    batch: int = 2,
    threads: int = 2,
    compute: float = 0.0,
    extra: str = "",
) -> Path:
    """A small DLIO workload file (v2.0 key names) of this format and loader."""
    path.write_text(
        f"""model:
  name: {fmt}-{loader}
dataset:
  format: {fmt}
  num_files_train: {files}
  num_samples_per_file: {spf}
  record_length_bytes: {record}
reader:
  data_loader: {loader}
  batch_size: {batch}
  read_threads: {threads}
{extra}train:
  epochs: 1
  computation_time: {compute}
"""
    )
    return path


def parquet_workload(path: Path, *, files: int, select: bool) -> Path:
    """`files` files of 64 rows in row groups of 8; a row is a label, two 4 KiB lists read
    and, between them, an 8 KiB list read only without selection (DLIO's `read` flag).
    A batch is a file, so one worker reads a file's footer and all its row groups. (With
    fewer, larger row groups the replay's two small writes of its lock file weigh enough
    among 16 files' block requests to move the size W1 by 0.15 octave.)"""
    wl = write_workload(path, fmt="parquet", files=files, spf=64, record=1, batch=64, threads=2)
    columns = f"""  parquet:
    row_group_size: 8
    columns:
      - {{name: label, dtype: float32, size: 1, read: true}}
      - {{name: a, dtype: float32, size: 1024, read: true}}
      - {{name: b, dtype: float32, size: 2048, read: {str(not select).lower()}}}
      - {{name: c, dtype: float32, size: 1024, read: true}}
"""
    wl.write_text(wl.read_text().replace("  record_length_bytes: 1\n", columns, 1))
    return wl


# Real reader arguments of parquet_workload: the columns asked for when selecting.
PARQUET_SELECTED = ("--columns", "label,a,c")


def trainio(*args, timeout: float = 300):
    """bin/trainio ARGS; fails the test with its output when it exits non-zero."""
    p = run([str(TRAINIO), *map(str, args)], timeout=timeout)
    assert p.returncode == 0, f"trainio {' '.join(map(str, args))}: exit {p.returncode}\n{p.stdout}\n{p.stderr}"
    return p


def _crc32c_table() -> list[int]:
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (0x82F63B78 ^ (c >> 1)) if c & 1 else c >> 1
        table.append(c)
    return table


_TABLE = _crc32c_table()


def crc32c(data: bytes) -> int:
    crc = 0xFFFFFFFF
    for b in data:
        crc = _TABLE[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def masked_crc32c(data: bytes) -> int:
    c = crc32c(data)
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def tfrecords(path: Path) -> list[bytes]:
    """The records of a TFRecord file, every length and data CRC checked (TensorFlow's
    framing: u64 length, masked CRC-32C of it, data, masked CRC-32C of the data)."""
    out = []
    raw = Path(path).read_bytes()
    pos = 0
    while pos < len(raw):
        (length,) = struct.unpack_from("<Q", raw, pos)
        (len_crc,) = struct.unpack_from("<I", raw, pos + 8)
        assert len_crc == masked_crc32c(raw[pos : pos + 8]), f"{path}: bad length CRC at {pos}"
        data = raw[pos + 12 : pos + 12 + length]
        assert len(data) == length, f"{path}: record at {pos} cut short"
        (data_crc,) = struct.unpack_from("<I", raw, pos + 12 + length)
        assert data_crc == masked_crc32c(data), f"{path}: bad data CRC at {pos}"
        out.append(data)
        pos += 16 + length
    return out


def drop_cache(data: Path) -> None:
    """Evicts the dataset's pages (and only those) so the next reader reads the device."""
    for p in (data / "train").rglob("*"):
        fd = os.open(p, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def record_real(
    out: Path,
    fmt: str,
    data: Path,
    *,
    spf: int,
    batch: int,
    threads: int,
    wrap=list,
    loader: str = "pytorch",
    extra: tuple = (),
) -> None:
    """`trainio record` of the real reader (real_reader.py; indexed_reader.py for DLIO's
    indexed_binary formats, under the PyTorch or DALI loader) reading the dataset, with
    `extra` arguments; `wrap` turns the reader's command into the one to trace (e.g.
    Throttle.wrap)."""
    script = INDEXED_READER if fmt.endswith("indexed_binary") else REAL_READER
    reader = [sys.executable, script, fmt, data, "--spf", spf, "--batch", batch, "--threads", threads]
    if script == INDEXED_READER:
        reader += ["--loader", loader]
    reader += list(extra)
    trainio("record", "-o", out, "--layers", "block,file", "--", *wrap(reader))


def record_emulation(out: Path, wl: Path, data: Path, *params, wrap=list) -> dict:
    """`trainio record` of the replay of workload `wl` on the dataset (psync: its reads
    are syscalls the file layer sees); returns the replay's results."""
    res = out.with_name(out.name + ".json")
    replay = [TRAINIO, "replay", "-q", "--workload", wl, "--data-dir", data, "--gpus", 1, "--json", res]
    trainio("record", "-o", out, "--layers", "block,file", "--", *wrap([*replay, "--io-engine", "psync", *params]))
    return json.loads(res.read_text())


def compare(a: Path, b: Path, majmin: str, layer: str) -> dict:
    """`trainio compare --json` of two traces on one device and layer."""
    return json.loads(trainio("compare", "--json", "--layer", layer, "--dev", majmin, a, b).stdout)


def analyze(trace: Path, majmin: str, layer: str = "block") -> dict:
    return json.loads(trainio("analyze", "--json", "--layer", layer, "--dev", majmin, trace).stdout)


def reader_cpu_per_sample(trace: Path, majmin: str) -> float:
    """The real reader's own time per sample outside its read syscalls, from its
    recording: per reader process, the span from its first data read to its last read's
    end less the union of its reads, summed and divided by the samples (files read, one image each):
    PIL's decoding as it ran beside the device, the recorder and the other readers."""
    import polars as pl

    df = pl.read_parquet(sorted(trace.glob("*.parquet")))
    df = df.filter((pl.col("layer") == "file") & (pl.col("dev") == majmin)).with_columns(
        pl.col("op").cast(pl.Utf8), pl.col("file").cast(pl.Utf8)
    )
    df = df.filter(pl.col("file").str.contains("/train/"))
    cpu_ns, samples = 0, 0
    for (_pid,), rows in df.group_by(["pid"]):
        reads = rows.filter(pl.col("op") == "read").sort("issue_ns")
        samples += reads["file"].n_unique()
        spans = list(zip(reads["issue_ns"], reads["complete_ns"], strict=True))
        if not spans:
            continue
        busy, end = 0, spans[0][0]
        for a, b in spans:
            a = max(a, end)
            if b > a:
                busy += b - a
            end = max(end, b)
        cpu_ns += (end - spans[0][0]) - busy
    return cpu_ns / 1e9 / max(samples, 1)
