"""Runs the real PyTorch job (job.py) on throttled storage, under `trainio record` if asked.

For the tests (tests/realjob/test_job.py) and the benchmarks: importable from anywhere
(it puts tests/ on sys.path for trainio_testlib). Needs root (loop devices, cgroups,
drop_caches, BPF).

- make_dataset(dir, n_files, sample_bytes, fmt): the sample files job.py reads;
- dataset_fs({name: (n_files, sample_bytes, fmt)}): ext4 on a loop device over /dev/shm
  with such data sets on it, all undone afterwards;
- throttled_cgroup(majmin, rbps): a cgroup whose reads from one device are capped
  (cgroup v1 blkio or v2 io.max, whichever the machine has), removed afterwards
  (trainio_testlib's, shared with the replay tests);
- run_job(data_dir, ...): drops the page cache, runs `torchrun job.py` (inside the throttle,
  under `trainio record`), returns the job's JSON.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from trainio_testlib import ROOT, TRAINIO, Throttle, mounted_loop_fs, throttled_cgroup  # noqa: E402, F401

JOB = HERE / "job.py"
TORCHRUN = ROOT / ".venv" / "bin" / "torchrun"
SUFFIX = {"npz": ".npz", "raw": ".raw"}
LOADERS = ("arrow", "wds", "jpeg")  # job.py's library-read formats


# ---------------------------------------------------------------------------- data sets


def make_dataset(directory: Path | str, n_files: int, sample_bytes: int, fmt: str) -> list[Path]:
    """Writes n_files samples of sample_bytes random bytes each into `directory` (created):
    `npz` one uncompressed np.savez array "x" per file (so numpy's zip reader reads it),
    `raw` the plain bytes (a multiple of 4096 for O_DIRECT). Names sort in creation order
    (sample-000000.npz, ...). Returns the paths."""
    import numpy as np

    if fmt in LOADERS:
        return make_library_dataset(directory, n_files, sample_bytes, fmt)
    if fmt not in SUFFIX:
        raise ValueError(f"format {fmt!r}: npz, raw, {', '.join(LOADERS)}")
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(1234)
    paths = []
    for i in range(n_files):
        x = rng.integers(0, 256, sample_bytes, dtype=np.uint8)
        path = directory / f"sample-{i:06d}{SUFFIX[fmt]}"
        if fmt == "npz":
            with open(path, "wb") as f:
                np.savez(f, x=x)
        else:
            path.write_bytes(x.tobytes())
        paths.append(path)
    return paths


SAMPLES_PER_SHARD = 16  # wds: samples per tar shard
JPEG_CLASSES = 2  # jpeg: class folders, samples spread over them in turn


def make_library_dataset(directory: Path | str, n_samples: int, sample_bytes: int, fmt: str) -> list[Path]:
    """n_samples samples for a library's reader (job.py's module doc), in `directory`:

    - `arrow`: `datasets.Dataset.from_dict({"x": ...}).save_to_disk` in 4 shards, each
      row sample_bytes random bytes;
    - `wds`: tar shards of SAMPLES_PER_SHARD members `NNNNNN.x` of sample_bytes random bytes;
    - `jpeg`: JPEG files of noise (PIL, quality 90) whose side is chosen so that a file is
      about sample_bytes (±15 %), in JPEG_CLASSES class folders.

    Returns the files written."""
    import numpy as np

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(1234)
    if fmt == "arrow":
        import datasets

        rows = [rng.integers(0, 256, sample_bytes, dtype=np.uint8).tobytes() for _ in range(n_samples)]
        ds = datasets.Dataset.from_dict({"x": rows}, features=datasets.Features({"x": datasets.Value("binary")}))
        ds.save_to_disk(str(directory), num_shards=4)
        return sorted(directory.glob("*.arrow"))
    if fmt == "wds":
        import io
        import tarfile

        paths = []
        for shard in range(-(-n_samples // SAMPLES_PER_SHARD)):
            path = directory / f"shard-{shard:06d}.tar"
            with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
                for i in range(shard * SAMPLES_PER_SHARD, min(n_samples, (shard + 1) * SAMPLES_PER_SHARD)):
                    x = rng.integers(0, 256, sample_bytes, dtype=np.uint8).tobytes()
                    info = tarfile.TarInfo(f"{i:06d}.x")
                    info.size = len(x)
                    tar.addfile(info, io.BytesIO(x))
            paths.append(path)
        return paths
    if fmt == "jpeg":
        from PIL import Image

        # A noise image's size per pixel is measured, not assumed: the side is fitted on
        # one image, then every image is made at that side.
        side = 64
        for _ in range(6):
            buf = _jpeg_bytes(Image, rng, side)
            side = max(16, int(side * (sample_bytes / len(buf)) ** 0.5))
        paths = []
        for i in range(n_samples):
            folder = directory / f"class{i % JPEG_CLASSES}"
            folder.mkdir(exist_ok=True)
            path = folder / f"{i:06d}.jpg"
            path.write_bytes(_jpeg_bytes(Image, rng, side))
            paths.append(path)
        return paths
    raise ValueError(f"format {fmt!r}: {', '.join(LOADERS)}")


def _jpeg_bytes(image_module, rng, side: int) -> bytes:
    import io

    px = rng.integers(0, 256, (side, side, 3), dtype="uint8")
    out = io.BytesIO()
    image_module.fromarray(px, "RGB").save(out, format="JPEG", quality=90)
    return out.getvalue()


@contextlib.contextmanager
def dataset_fs(sets: dict[str, tuple[int, int, str]], *, slack_mb: int = 64) -> Iterator[tuple[str, str, Path]]:
    """ext4 on a loop device over /dev/shm (trainio_testlib.mounted_loop_fs, quiet) holding
    the data sets `sets`: {name: (n_files, sample_bytes, fmt)}, each made by make_dataset
    in <mount>/<name>/. Yields (device, "MAJ:MIN", mount point); unmounted, detached and
    removed even on failure."""
    size_mb = sum(n * (b + 8192) for n, b, _f in sets.values()) // 2**20 + slack_mb
    with mounted_loop_fs(size_mb, quiet=True) as (dev, mm, mnt):
        for name, (n, b, fmt) in sets.items():
            make_dataset(mnt / name, n, b, fmt)
        subprocess.run(["sync"], check=True)
        yield dev, mm, mnt


def device_of(path: Path | str) -> str:
    """`MAJ:MIN` of the block device that holds `path`'s file system."""
    st = os.stat(path)
    return f"{os.major(st.st_dev)}:{os.minor(st.st_dev)}"


def drop_caches(data_dir: Path | str | None = None) -> None:
    """sync, then evict from the page cache: the files under `data_dir`
    (posix_fadvise DONTNEED), or, without one, everything (echo 3 > drop_caches). The job's
    next reads of its samples come from the device either way; evicting only the samples
    keeps torch's libraries (~1 GB read at every import otherwise) and other programs'
    files cached."""
    subprocess.run(["sync"], check=True)
    if data_dir is None:
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return
    for dirpath, _dirs, files in os.walk(data_dir):
        for name in files:
            fd = os.open(os.path.join(dirpath, name), os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


# ---------------------------------------------------------------------------- the job


@dataclasses.dataclass
class JobRun:
    job: dict  # job.py's JSON
    recorder_summary: str | None  # `trainio record`'s closing summary, when recorded
    stdout: str
    stderr: str
    elapsed_s: float  # launch to exit, torch imports included


class JobFailed(RuntimeError):
    pass


def recorder_summary(stderr: str) -> str:
    """`trainio record`'s summary (trace, events and MiB per layer and device, lost events):
    it goes to stderr, after the job's own output, from the line `trainio record: trace`."""
    at = stderr.rfind("trainio record: trace ")
    return stderr[at:] if at >= 0 else ""


def job_command(
    data_dir: Path | str,
    out: Path | str,
    *,
    ranks: int,
    workers: int,
    batch: int,
    compute_ms: float,
    fmt: str,
    odirect: bool = False,
    steps: int | None = None,
    epochs: int = 1,
    extra: tuple[str, ...] = (),
) -> list[str]:
    """torchrun --standalone --nproc-per-node=RANKS job.py ... (the venv's torchrun)."""
    cmd = [
        str(TORCHRUN),
        "--standalone",
        f"--nproc-per-node={ranks}",
        str(JOB),
        "--data",
        str(data_dir),
        "--format",
        fmt,
        "--batch-size",
        str(batch),
        "--num-workers",
        str(workers),
        "--compute-ms",
        str(compute_ms),
        "--epochs",
        str(epochs),
        "--out",
        str(out),
    ]
    if steps is not None:
        cmd += ["--steps", str(steps)]
    if odirect:
        cmd.append("--odirect")
    return cmd + list(extra)


def run_job(
    data_dir: Path | str,
    *,
    ranks: int,
    workers: int,
    batch: int,
    compute_ms: float,
    fmt: str,
    odirect: bool = False,
    throttle_bps: int | None = None,
    record_dir: Path | str | None = None,
    record_args: tuple[str, ...] = (),
    steps: int | None = None,
    epochs: int = 1,
    drop_all_caches: bool = False,
    realtime: bool = False,
    timeout: float = 180,
    extra: tuple[str, ...] = (),
    throttle_wbps: int | None = None,
) -> JobRun:
    """Evicts the samples from the page cache (everything with `drop_all_caches`), then
    runs job.py over the samples in `data_dir` with torchrun at `ranks` ranks of `workers`
    DataLoader workers each (OMP_NUM_THREADS=1), with job.py's `extra` arguments.

    torchrun, its ranks and their workers run in a throttled_cgroup() of the device under
    `data_dir`, reads capped at `throttle_bps` and writes at `throttle_wbps` when given
    (uncapped otherwise: the group then
    only keeps track of them, since torchrun starts each rank in a session of its own).
    With `record_dir`, under `bin/trainio record -o record_dir [record_args] -- ...`, the
    recorder outside the group. `realtime`: the job at SCHED_FIFO 1 (`chrt`), so that
    other work on the host delays none of its wake-ups (the recorder stays SCHED_OTHER).

    Returns a JobRun; raises JobFailed (with stderr's tail) when the job or the recorder
    fails or `timeout` passes. The cgroup and every process started here are gone
    afterwards, whatever happened."""
    with tempfile.TemporaryDirectory(prefix="trainio-realjob-") as tmp:
        out = Path(tmp) / "job.json"
        cmd = job_command(
            data_dir,
            out,
            ranks=ranks,
            workers=workers,
            batch=batch,
            compute_ms=compute_ms,
            fmt=fmt,
            odirect=odirect,
            steps=steps,
            epochs=epochs,
            extra=extra,
        )
        if realtime:
            cmd = ["chrt", "--fifo", "1", *cmd]
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
        with contextlib.ExitStack() as stack:
            th = stack.enter_context(throttled_cgroup(device_of(data_dir), throttle_bps, wbps=throttle_wbps))
            cmd = th.wrap(cmd)
            if record_dir is not None:
                cmd = [str(TRAINIO), "record", "-o", str(record_dir), *map(str, record_args), "--", *cmd]
            drop_caches(None if drop_all_caches else data_dir)
            t0 = time.monotonic()
            proc = subprocess.Popen(
                cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, start_new_session=True
            )
            try:
                stdout, stderr = proc.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                # The recorder first (SIGINT: it stops its command and keeps its segments),
                # then anything left of the process group.
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGINT)
                try:
                    stdout, stderr = proc.communicate(timeout=15)
                except subprocess.TimeoutExpired:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(proc.pid, signal.SIGKILL)
                    stdout, stderr = proc.communicate()
                raise JobFailed(f"job timed out after {timeout} s: {' '.join(cmd)}\n{stderr[-4000:]}") from None
            finally:
                if proc.poll() is None:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
            elapsed = time.monotonic() - t0
        if proc.returncode != 0:
            raise JobFailed(f"job exited {proc.returncode}: {' '.join(cmd)}\n{stderr[-4000:]}")
        if not out.exists():
            raise JobFailed(f"job wrote no {out}:\n{stderr[-4000:]}")
        job = json.loads(out.read_text())
    return JobRun(
        job=job,
        recorder_summary=recorder_summary(stderr) if record_dir is not None else None,
        stdout=stdout,
        stderr=stderr,
        elapsed_s=elapsed,
    )


def summary(run: JobRun) -> str:
    """One line: ranks, workers, AU, MiB/s, samples/s, wall."""
    j = run.job
    return (
        f"ranks {j['world_size']} workers {j['num_workers']} {j['format']}"
        f"{' odirect' if j['odirect'] else ''}: AU {j['au']:.3f}  {j['mib_per_s']:.1f} MiB/s"
        f"  {j['samples_per_s']:.1f} samples/s  steps {j['steps']}  job wall {j['wall_s']:.2f} s"
        f"  elapsed {run.elapsed_s:.2f} s"
    )


if __name__ == "__main__":
    # Quick look: python tests/realjob/harness.py [--throttle-mib N] [--workers W] ...
    import argparse

    ap = argparse.ArgumentParser(description="run job.py on a fresh loop device")
    ap.add_argument("--files", type=int, default=256)
    ap.add_argument("--sample-kib", type=int, default=1024)
    ap.add_argument("--format", default="npz", choices=sorted((*SUFFIX, *LOADERS)))
    ap.add_argument("--odirect", action="store_true")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--workers", type=int, nargs="+", default=[2])
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--compute-ms", type=float, default=50)
    ap.add_argument("--throttle-mib", type=float, nargs="+", default=[0])
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--record", type=Path, default=None, help="record into DIR/<n>")
    a = ap.parse_args()
    with dataset_fs({a.format: (a.files, a.sample_kib << 10, a.format)}) as (_dev, _mm, mnt):
        n = 0
        for w in a.workers:
            for t in a.throttle_mib:
                rec = a.record / str(n) if a.record else None
                r = run_job(
                    mnt / a.format,
                    ranks=a.ranks,
                    workers=w,
                    batch=a.batch,
                    compute_ms=a.compute_ms,
                    fmt=a.format,
                    odirect=a.odirect,
                    throttle_bps=int(t * 2**20) or None,
                    steps=a.steps,
                    record_dir=rec,
                )
                print(f"throttle {t:g} MiB/s | {summary(r)}", flush=True)
                n += 1
