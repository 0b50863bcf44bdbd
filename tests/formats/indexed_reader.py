"""DLIO's indexed_binary and mmap_indexed_binary readers on a generated dataset, driven as
DLIO's PyTorch loader drives them, for recording with `trainio record` next to the
emulation (tests/formats/test_formats_indexed.py, make bench-formats).

    indexed_reader.py FORMAT DATA_DIR --spf S --batch B --threads W [--steps N]
                      [--loader pytorch|dali] [--prefetch P]

pytorch: W worker processes (DataLoader's num_workers, persistent workers); each makes
its reader first, which loads the index of every file of the dataset (one GPU: its shard
is every file), then reads batch b for b ≡ worker (mod W), sample after sample, in file
order.

dali (DLIO's DaliDataLoader: a DALI pipeline with a parallel external_source of W Python
worker processes and prefetch_queue_depth P): the reader is made once, in the GPU's
process, before the workers are forked (they inherit it); the main process schedules P
batches, and one more each time a batch is complete; each batch's samples are split
into W contiguous chunks, worker w reading the w-th (DALI's WorkerPool._distribute, the
first B mod W chunks one sample longer). DALI itself (nvidia-dali) is not on PyPI's
index; this is its scheduling of a per-sample source, written out.

The readers:

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
from real_reader import run_together


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


def chunks(n: int, workers: int) -> list[range]:
    """DALI's split of a batch of n samples among its workers: contiguous, the first
    n mod workers one longer."""
    size, extra = divmod(n, workers)
    out, at = [], 0
    for w in range(workers):
        k = size + (w < extra)
        out.append(range(at, at + k))
        at += k
    return out


def dali(reader, samples: list, batch: int, workers: int, steps: int, prefetch: int) -> None:
    tasks = [os.pipe() for _ in range(workers)]
    done_r, done_w = os.pipe()
    parts = chunks(batch, workers)

    def worker(w: int) -> None:
        r = tasks[w][0]
        while True:
            b = int.from_bytes(os.read(r, 4), "little")
            if b == 0xFFFFFFFF:
                return
            for j in parts[w]:
                reader.sample(*samples[b * batch + j])
            os.write(done_w, b.to_bytes(4, "little"))

    pids = []
    for w in range(workers):
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                worker(w)
                code = 0
            finally:
                os._exit(code)
        pids.append(pid)
    busy = [w for w in range(workers) if len(parts[w]) > 0]

    def schedule(b: int) -> None:
        for w in busy:
            os.write(tasks[w][1], b.to_bytes(4, "little"))

    for b in range(min(prefetch, steps)):
        schedule(b)
    left = {}
    nxt = min(prefetch, steps)
    finished = 0
    while finished < steps:
        b = int.from_bytes(os.read(done_r, 4), "little")
        left[b] = left.get(b, 0) + 1
        if left[b] == len(busy):
            finished += 1
            if nxt < steps:
                schedule(nxt)
                nxt += 1
    for w in range(workers):
        os.write(tasks[w][1], (0xFFFFFFFF).to_bytes(4, "little"))
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
    ap.add_argument("--loader", choices=["pytorch", "dali"], default="pytorch")
    ap.add_argument("--prefetch", type=int, default=2)
    a = ap.parse_args()
    files = files_of(a.data, a.format)
    if not files:
        sys.exit(f"{a.data}: no *.{a.format} files under train/")
    samples = [(f, k) for f in files for k in range(a.spf)]
    steps = min(a.steps, len(samples) // a.batch)
    kind = IndexedBinary if a.format == "indexed_binary" else MmapIndexedBinary
    if a.loader == "dali":
        dali(kind(files, a.spf), samples, a.batch, a.threads, steps, a.prefetch)
        return

    def worker(w: int) -> None:
        reader = kind(files, a.spf)
        for b in range(w, steps, a.threads):
            for f, k in samples[b * a.batch : (b + 1) * a.batch]:
                reader.sample(f, k)

    run_together([lambda w=w: worker(w) for w in range(a.threads)])


if __name__ == "__main__":
    main()
