"""The real readers of a generated dataset, as DLIO's loaders drive them, for recording
with `trainio record` next to the emulation (tests/formats, make bench-formats).

    real_reader.py FORMAT DATA_DIR --spf N --batch B --threads W [--buffer BYTES]
                   [--columns A,B] [--cache N]

- pytorch (npz, npy, hdf5): W worker processes (DataLoader's num_workers); batch b is
  read by worker b mod W, sample after sample, each sample by DLIO's on-demand reader:
  the file opened and loaded with numpy.load (npz: ``np.load(f)["x"]``, the whole array
  through zipfile's buffered reads; npy: ``np.load(f)``), the sample's row taken, the
  file closed; hdf5 as DLIO's HDF5Reader: ``h5py.File(f, "r")["records_0"][k]``, then
  close.
- parquet: DLIO's parquet reader in each worker: the file opened once with
  ``pyarrow.parquet.ParquetFile`` (its footer read) and kept open, then for each sample
  ``read_row_group(rg, columns=COLUMNS)`` of the sample's row group unless the reader
  holds it (the last CACHE row groups it read).
- jpeg: DLIO's image reader, ``np.asarray(PIL.Image.open(f))`` per sample (the file
  opened, the image decoded, the file closed).
- tfrecord: TensorFlow's TFRecordDataset with num_parallel_reads=W (a parallel
  interleave of W files, one reader thread each), each file read by TF's RecordReader:
  an input buffer of BYTES (TF's default 256 KiB) filled with pread at the file position
  (PosixRandomAccessFile::Read: pread until the buffer is full or a pread returns 0),
  records parsed out of it and their CRCs skipped. TensorFlow itself is not installed
  (its wheel is ~600 MB); this reader issues the reads TF's C++ reader issues, one process
  per interleave slot (TF's slot threads run C++ at once; Python threads would not).
"""

from __future__ import annotations

import argparse
import os
import struct
import sys
from pathlib import Path


def files_of(data: Path) -> list[Path]:
    return sorted(p for p in (data / "train").rglob("*") if p.is_file())


def load_sample(fmt: str, path: Path, row: int):
    import numpy as np

    if fmt == "jpeg":
        from PIL import Image

        return np.asarray(Image.open(path))

    if fmt == "npz":
        with np.load(path) as npz:
            return npz["x"][row]
    if fmt == "hdf5":
        import h5py

        with h5py.File(path, "r") as f:
            return f["records_0"][row]
    return np.load(path)[row]


def run_together(jobs: list) -> None:
    """Runs each job in a process of its own, all started at once: they wait for the
    parent to have forked the last one (as a loader's workers or TF's slot threads start
    together), so the first does not read alone while the others are being forked."""
    r, w = os.pipe()
    pids = []
    for job in jobs:
        pid = os.fork()
        if pid == 0:
            code = 1  # a job that raises fails the reader
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


def pytorch(fmt: str, files: list[Path], spf: int, batch: int, workers: int, steps: int) -> None:
    samples = [(f, k) for f in files for k in range(spf)]
    steps = min(steps, len(samples) // batch)

    def worker(w: int) -> None:
        for b in range(w, steps, workers):
            for f, k in samples[b * batch : (b + 1) * batch]:
                load_sample(fmt, f, k)

    import numpy  # noqa: F401  (imported before the workers start, as in a DataLoader)

    if fmt == "hdf5":
        import h5py  # noqa: F401
    if fmt == "jpeg":
        from PIL import Image  # noqa: F401
    run_together([lambda w=w: worker(w) for w in range(workers)])


def parquet(files: list[Path], spf: int, batch: int, workers: int, columns: list[str] | None, cache: int) -> None:
    """DLIO's parquet reader under a DataLoader of `workers` processes: worker w reads
    batches w, w + W, …; each worker's reader keeps its files open and its last `cache`
    row groups."""
    import bisect
    from collections import OrderedDict

    import pyarrow.parquet as pq

    samples = [(f, k) for f in files for k in range(spf)]
    steps = len(samples) // batch

    def worker(w: int) -> None:
        opened: dict[Path, tuple] = {}
        held: OrderedDict = OrderedDict()
        for b in range(w, steps, workers):
            for f, k in samples[b * batch : (b + 1) * batch]:
                if f not in opened:
                    pf = pq.ParquetFile(f)
                    starts = [0]
                    for i in range(pf.metadata.num_row_groups):
                        starts.append(starts[-1] + pf.metadata.row_group(i).num_rows)
                    opened[f] = (pf, starts)
                pf, starts = opened[f]
                rg = bisect.bisect_right(starts, k) - 1
                if (f, rg) in held:
                    held.move_to_end((f, rg))
                    continue
                pf.read_row_group(rg, columns=columns)
                held[(f, rg)] = True
                if len(held) > cache:
                    held.popitem(last=False)

    run_together([lambda w=w: worker(w) for w in range(workers)])


class TFRecordStream:
    """tensorflow::io::RecordReader over an InputBuffer of `buffer` bytes."""

    def __init__(self, path: Path, buffer: int) -> None:
        self.fd = os.open(path, os.O_RDONLY)
        self.buffer = buffer
        self.file_pos = 0
        self.buf = b""
        self.pos = 0

    def _fill(self) -> bool:
        # PosixRandomAccessFile::Read: pread until n bytes or EOF (a pread returning 0)
        want, got = self.buffer, []
        while want > 0:
            data = os.pread(self.fd, want, self.file_pos)
            if not data:
                break
            got.append(data)
            self.file_pos += len(data)
            want -= len(data)
        self.buf, self.pos = b"".join(got), 0
        return bool(self.buf)

    def _take(self, n: int, keep: bool) -> bytes | None:
        """The next n bytes of the stream (only kept when asked: a record's data is
        skipped, as the CRC check is), filling the buffer when it runs out."""
        out = []
        while n > 0:
            if self.pos == len(self.buf) and not self._fill():
                return None
            k = min(n, len(self.buf) - self.pos)
            if keep:
                out.append(self.buf[self.pos : self.pos + k])
            self.pos += k
            n -= k
        return b"".join(out)

    def next(self) -> bool:
        header = self._take(12, True)
        if header is None:
            os.close(self.fd)
            return False
        (length,) = struct.unpack_from("<Q", header)
        return self._take(length + 4, False) is not None


def tensorflow(files: list[Path], threads: int, buffer: int) -> None:
    """Parallel interleave, cycle W, block 1: slot s streams files s, s+W, … one after
    another (the next input file goes to the slot whose file ended: with files of equal
    size, that order). TF's slots are threads of C++ code that run at once; here each slot
    is a process, so Python's GIL does not serialize them."""

    def slot(s: int) -> None:
        for path in files[s::threads]:
            stream = TFRecordStream(path, buffer)
            while stream.next():
                pass

    run_together([lambda s=s: slot(s) for s in range(threads)])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("format", choices=["npz", "npy", "tfrecord", "hdf5", "parquet", "jpeg"])
    ap.add_argument("data", type=Path)
    ap.add_argument("--spf", type=int, default=1)
    ap.add_argument("--batch", type=int, required=True)
    ap.add_argument("--threads", type=int, required=True)
    ap.add_argument("--steps", type=int, default=1 << 30)
    ap.add_argument("--buffer", type=int, default=256 << 10)
    ap.add_argument("--columns", help="parquet: the columns read, comma-separated (default all)")
    ap.add_argument("--cache", type=int, default=1, help="parquet: row groups a reader holds")
    a = ap.parse_args()
    files = files_of(a.data)
    if a.format == "tfrecord":
        tensorflow(files, a.threads, a.buffer)
    elif a.format == "parquet":
        parquet(files, a.spf, a.batch, a.threads, a.columns.split(",") if a.columns else None, a.cache)
    else:
        pytorch(a.format, files, a.spf, a.batch, a.threads, a.steps)


if __name__ == "__main__":
    main()
