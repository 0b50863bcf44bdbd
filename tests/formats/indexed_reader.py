"""DLIO's indexed_binary and mmap_indexed_binary readers on a generated dataset, driven as
DLIO's PyTorch loader drives them, for recording with `trainio record` next to the
emulation (tests/formats/test_formats_indexed.py, make bench-formats).

    indexed_reader.py FORMAT DATA_DIR --spf S --batch B --threads W [--steps N]

W worker processes (DataLoader's num_workers, persistent workers); each makes its reader
first, which loads the index of every file of the dataset (one GPU: its shard is every
file), then reads batch b for b ≡ worker (mod W), sample after sample, in file order:

- indexed_binary (dlio_benchmark/reader/indexed_binary_reader.py): at the reader's
  making, per file, FILE.off.idx and FILE.sz.idx opened and `readinto` an int64 array of
  S entries; per sample the file opened, seek to the sample's offset, `readinto` an
  array of its size, closed (DLIO's on-demand read: open and close per sample).
- mmap_indexed_binary (reader/indexed_binary_mmap_reader.py): at the reader's making,
  np.memmap of both index files and of the data file; per sample its offset and size
  read from the mapped indexes and the slice `buffer[offset:offset+size]` taken (DLIO
  then returns its preallocated resized_image: the slice's pages are never touched).

The data files are those whose names end with the format, as DLIO lists them.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import numpy as np


def files_of(data: Path, fmt: str) -> list[Path]:
    return sorted(p for p in (data / "train").rglob(f"*.{fmt}") if p.is_file())


class IndexedBinary:
    def __init__(self, files: list[Path], spf: int) -> None:
        self.index = {}
        for f in files:
            entries = []
            for suffix in (".off.idx", ".sz.idx"):
                with open(f"{f}{suffix}", "rb") as fh:
                    a = np.empty(spf, dtype=np.int64)
                    fh.readinto(a)
                    entries.append(a)
            self.index[f] = entries

    def sample(self, f: Path, k: int) -> None:
        offset, size = self.index[f][0][k], self.index[f][1][k]
        with open(f, "rb") as fh:
            fh.seek(offset)
            fh.readinto(np.empty(size, dtype=np.uint8))


class MmapIndexedBinary:
    def __init__(self, files: list[Path], spf: int) -> None:
        def mapped(path: str, dtype) -> np.ndarray:
            return np.frombuffer(memoryview(np.memmap(path, mode="r", order="C")), dtype=dtype)

        self.index = {f: (mapped(f"{f}.off.idx", np.uint64), mapped(f"{f}.sz.idx", np.uint64)) for f in files}
        self.buffers = {f: mapped(str(f), np.uint8) for f in files}

    def sample(self, f: Path, k: int) -> None:
        offset, size = self.index[f][0][k], self.index[f][1][k]
        self.buffers[f][offset : offset + size]


def run_together(jobs: list) -> None:
    """Each job in a process of its own, all started at once (they wait for the parent to
    have forked the last one)."""
    r, w = os.pipe()
    pids = []
    for job in jobs:
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                os.close(w)
                os.read(r, 1)
                job()
                code = 0
            finally:
                os._exit(code)
        pids.append(pid)
    os.close(w)
    for pid in pids:
        _, status = os.waitpid(pid, 0)
        if status != 0:
            sys.exit(f"reader exited {status}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("format", choices=["indexed_binary", "mmap_indexed_binary"])
    ap.add_argument("data", type=Path)
    ap.add_argument("--spf", type=int, required=True)
    ap.add_argument("--batch", type=int, required=True)
    ap.add_argument("--threads", type=int, required=True)
    ap.add_argument("--steps", type=int, default=1 << 30)
    a = ap.parse_args()
    files = files_of(a.data, a.format)
    if not files:
        sys.exit(f"{a.data}: no *.{a.format} files under train/")
    samples = [(f, k) for f in files for k in range(a.spf)]
    steps = min(a.steps, len(samples) // a.batch)
    kind = IndexedBinary if a.format == "indexed_binary" else MmapIndexedBinary

    def worker(w: int) -> None:
        reader = kind(files, a.spf)
        for b in range(w, steps, a.threads):
            for f, k in samples[b * a.batch : (b + 1) * a.batch]:
                reader.sample(f, k)

    run_together([lambda w=w: worker(w) for w in range(a.threads)])


if __name__ == "__main__":
    main()
