"""Helpers shared by every suite (imported by tests/conftest.py and the tests): the entry
point, loop devices, BPF program checks. Named uniquely: every suite has a conftest."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import pty
import re
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TRAINIO = ROOT / "bin" / "trainio"
sys.path.insert(0, str(ROOT / "analysis"))

# Every BPF program of ours is named tio_* (bpf/*.bpf.c).
BPF_PREFIX = "tio_"


# Every process a test session starts inherits this marker, so the leftover check can tell
# our programs from those of another trainio run on the same machine.
SESSION_MARK = "TRAINIO_TEST_SESSION"
os.environ.setdefault(SESSION_MARK, f"{os.getpid()}-{uuid.uuid4().hex[:8]}")


def _prog_owners() -> dict[int, set[int]]:
    """prog_id -> pids holding an fd on it (a program fd, or a link fd naming the program)."""
    owners: dict[int, set[int]] = {}
    for fdinfo in Path("/proc").glob("[0-9]*/fdinfo/*"):
        try:
            text = fdinfo.read_text()
        except OSError:
            continue
        m = re.search(r"^prog_id:\s*(\d+)", text, re.M)
        if m:
            owners.setdefault(int(m.group(1)), set()).add(int(fdinfo.parts[2]))
    return owners


def _ours(pid: int) -> bool:
    try:
        env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return False
    return f"{SESSION_MARK}={os.environ[SESSION_MARK]}".encode() in env


def trainio_programs(*, all_sessions: bool = False) -> list[str]:
    """Names of loaded BPF programs that belong to trainio and to this test session: held by
    a process of this session, or by nobody (a pinned or leaked attachment). Programs held
    by another session's processes are left out unless all_sessions."""
    out = subprocess.run(["bpftool", "-j", "prog", "show"], capture_output=True, text=True, check=True)
    progs = [p for p in json.loads(out.stdout or "[]") if p.get("name", "").startswith(BPF_PREFIX)]
    if all_sessions or not progs:
        return [p["name"] for p in progs]
    owners = _prog_owners()
    return [p["name"] for p in progs if not owners.get(p["id"]) or any(_ours(pid) for pid in owners[p["id"]])]


def wait_no_trainio_programs(timeout: float = 5.0) -> list[str]:
    """Programs are freed after their last fd closes (RCU-deferred): wait a little."""
    deadline = time.monotonic() + timeout
    left = trainio_programs()
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        left = trainio_programs()
    return left


def run(cmd: list[str], *, timeout: float = 300, check: bool = False, **kw) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=check, **kw)


def trainio(*args: str, timeout: float = 300, **kw) -> subprocess.CompletedProcess[str]:
    """Runs the real entry point, bin/trainio."""
    return run([str(TRAINIO), *map(str, args)], timeout=timeout, **kw)


@contextlib.contextmanager
def loop_device(size_mb: int = 256, *, direct_io: bool = True, fill: bool = False) -> Iterator[str]:
    """A loop device over a file in /dev/shm; detached and removed even on failure."""
    backing = Path("/dev/shm") / f"trainio-test-{uuid.uuid4().hex[:8]}.img"
    dev = None
    try:
        with open(backing, "wb") as f:
            if fill:
                chunk = os.urandom(1 << 20)
                for _ in range(size_mb):
                    f.write(chunk)
            else:
                f.truncate(size_mb << 20)
        cmd = ["losetup", "--find", "--show"]
        if direct_io:
            cmd.append("--direct-io=on")
        dev = run([*cmd, str(backing)], check=True).stdout.strip()
        yield dev
    finally:
        if dev:
            run(["losetup", "-d", dev])
        backing.unlink(missing_ok=True)


@contextlib.contextmanager
def mounted_loop_fs(size_mb: int, *, quiet: bool = False) -> Iterator[tuple[str, str, Path]]:
    """ext4 on a loop_device() mounted under a temp dir. Yields (device, "MAJ:MIN", mount
    point); unmounted, detached and removed even on failure. `quiet`: a file system that
    writes nothing by itself while it is read (inode tables and journal initialized by
    mkfs rather than by ext4lazyinit later, no atime updates), for measurements that
    compare block traces."""
    mnt = Path(tempfile.mkdtemp(prefix="trainio-mnt-"))
    try:
        with loop_device(size_mb) as dev:
            mkfs = ["mkfs.ext4", "-q", "-F"]
            if quiet:
                mkfs += ["-E", "nodiscard,lazy_itable_init=0,lazy_journal_init=0"]
            run([*mkfs, dev], check=True)
            run(["mount", *(["-o", "noatime"] if quiet else []), dev, str(mnt)], check=True)
            try:
                yield dev, majmin(dev), mnt
            finally:
                run(["umount", str(mnt)])
    finally:
        shutil.rmtree(mnt, ignore_errors=True)


def block_stat(dev: str) -> list[int]:
    """The fields of /sys/block/NAME/stat of `dev` (a /dev path or a name)."""
    return [int(x) for x in Path(f"/sys/block/{Path(dev).name}/stat").read_text().split()]


def majmin(dev: str) -> str:
    """`MAJ:MIN` of a block device node, as traces spell `dev`."""
    st = os.stat(dev)
    return f"{os.major(st.st_rdev)}:{os.minor(st.st_rdev)}"


# OpenMPI refuses root without these.
MPI_ROOT_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}

FIDELITY_WORKLOAD = """model:
  name: fidelity
dataset:
  num_files_train: 1
  num_samples_per_file: 1
  record_length_bytes: {record}
reader:
  batch_size: {batch}
  read_threads: {threads}
  prefetch_size: 2
train:
  epochs: 1
  computation_time: {compute}
metric:
  au: 0.9
"""


def fidelity_run(
    gpus: int,
    work: Path,
    *,
    steps: int = 24,
    record: int = 1 << 20,
    batch: int = 4,
    threads: int = 4,
    compute: float = 0.05,
    realtime: bool = True,
    reference: bool = False,
    io_engine: str = "psync",
) -> dict:
    """Issue #6's experiment. On a quiet ext4 on a loop device over /dev/shm: record an
    emulated training at `gpus` GPUs (one MPI rank, i.e. one process, per GPU, psync
    reads, O_DIRECT), replay the recorded trace at the same GPU count on the same device
    with --record, and score the replay against the original with `trainio compare`
    (block layer, that device). `work` (created, must not exist) keeps the traces and
    JSON files. Returns {"original", "replay": replay --json results, "compare": compare
    --json of the block layer, "compare_file": the file layer (sizes of the syscalls)}.

    `realtime`: both runs with --realtime (SCHED_FIFO event loops and readers), so that
    other work on the host delays neither the original's nor the replay's wake-ups and
    the comparison measures the replay, not the host's load at two moments.

    `reference`: after the replay, record the original once more ("original-b"), score it
    against the first recording ("compare_reference", block layer: how far two runs of the
    same job land from each other on this host now, the spread a replay's scores are read
    against) and score the replay against it too ("compare_b").

    `io_engine`: how the original reads (`psync`, or `io_uring`: then it is recorded with
    `--io-uring`, so its reads are file-layer rows, and replayed from them)."""
    work.mkdir(parents=True)
    wl = work / "workload.yaml"
    wl.write_text(FIDELITY_WORKLOAD.format(record=record, batch=batch, threads=threads, compute=compute))
    data_mib = gpus * steps * batch * record >> 20
    env = {**os.environ, **MPI_ROOT_ENV}
    rt = ["--realtime"] if realtime else []

    def ok(cmd: list[str], timeout: float = 300) -> str:
        p = run([str(c) for c in cmd], timeout=timeout, env=env)
        if p.returncode != 0:
            raise AssertionError(f"{' '.join(map(str, cmd))} exited {p.returncode}:\n{p.stderr[-3000:]}")
        return p.stdout

    with mounted_loop_fs(2 * data_mib + 256, quiet=True) as (dev, mm, mnt):
        ok([TRAINIO, "datagen", "--workload", wl, "--data-dir", mnt / "data", "--gpus", gpus, "--steps", steps])

        def record_original(name: str) -> None:
            ok(
                [
                    TRAINIO,
                    "record",
                    "-q",
                    *(["--io-uring"] if io_engine == "io_uring" else []),
                    "--output",
                    work / name,
                    "--dev",
                    dev,
                    "--",
                    "mpirun",
                    "--oversubscribe",
                    "--bind-to",
                    "none",
                    "-np",
                    gpus,
                    TRAINIO,
                    "replay",
                    "-q",
                    "--workload",
                    wl,
                    "--data-dir",
                    mnt / "data",
                    "--gpus",
                    gpus,
                    "--steps",
                    steps,
                    "--odirect",
                    "--io-engine",
                    io_engine,
                    *rt,
                    "--json",
                    work / f"{name}.json",
                ]
            )

        record_original("original")
        # One process replays every GPU: the bursts of all GPUs are paced on one clock, as
        # the original's ranks read together after each step's barrier.
        ok(
            [
                TRAINIO,
                "replay",
                "-q",
                "--trace",
                work / "original",
                "--data-dir",
                mnt / "trace-data",
                "--generate",
                "--gpus",
                gpus,
                "--odirect",
                "--io-engine",
                "psync",
                *rt,
                "--json",
                work / "replay.json",
                "--record",
                work / "replay",
            ]
        )
        if reference:
            record_original("original-b")
        out = {
            "original": json.loads((work / "original.json").read_text()),
            "replay": json.loads((work / "replay.json").read_text()),
        }
        from trainio_analysis.trace import read_metadata

        out["meta"] = {
            t: {k: read_metadata(work / t).get(k) for k in ("start_ns", "end_ns", "lost_events")}
            for t in ("original", "replay")
        }
        for key, layer, sel in (("compare", "block", ["--dev", mm]), ("compare_file", "file", ["--dev", mm])):
            cmd = [TRAINIO, "compare", work / "original", work / "replay", "--layer", layer, *sel, "--json"]
            out[key] = json.loads(ok(cmd))
        if reference:
            out["original_b"] = json.loads((work / "original-b.json").read_text())
            for key, a, b in (("compare_reference", "original", "original-b"), ("compare_b", "original-b", "replay")):
                cmd = [TRAINIO, "compare", work / a, work / b, "--layer", "block", "--dev", mm, "--json"]
                out[key] = json.loads(ok(cmd))
        return out


# A device's bandwidth for a test: the throttle of cgroup v2 or v1.
CGROUP = Path("/sys/fs/cgroup")


@dataclasses.dataclass
class Throttle:
    """A cgroup capping reads from one device. `procs` is its cgroup.procs: a process
    written there (with all its threads) joins, and its children are born inside."""

    path: Path
    version: int  # 1: blkio, 2: io
    majmin: str
    rbps: int  # 0: no cap
    wbps: int = 0  # 0: no cap

    @property
    def procs(self) -> Path:
        return self.path / "cgroup.procs"

    def join(self, pid: int | None = None) -> None:
        """Moves `pid` (default: the calling process) into the cgroup."""
        self.procs.write_text(f"{pid or os.getpid()}\n")

    def preexec_fn(self) -> None:
        """For subprocess.Popen(preexec_fn=...): the child joins before it execs."""
        self.join()

    def wrap(self, cmd: list[str]) -> list[str]:
        """`cmd` run by a shell that first joins the cgroup, then execs it: for a launcher
        (such as `trainio record`) that must itself stay outside."""
        return ["sh", "-c", f'echo $$ > {self.procs} && exec "$@"', "sh", *map(str, cmd)]

    def pids(self) -> list[int]:
        try:
            return [int(p) for p in self.procs.read_text().split()]
        except OSError:
            return []


def _v2_root() -> Path | None:
    """The cgroup-v2 mount whose root offers the io controller, if any."""
    for cand in (CGROUP, CGROUP / "unified"):
        try:
            if "io" in (cand / "cgroup.controllers").read_text().split():
                return cand
        except OSError:
            continue
    return None


def _v1_root() -> Path | None:
    base = CGROUP / "blkio"
    return base if (base / "blkio.throttle.read_bps_device").exists() else None


@contextlib.contextmanager
def throttled_cgroup(
    majmin: str, rbps: int | None, *, wbps: int | None = None, version: int | None = None
) -> Iterator[Throttle]:
    """A new cgroup whose reads from device `majmin` are capped at `rbps` bytes/s and its
    writes at `wbps` (None: no cap; neither: a group that only keeps track of the
    processes put in it):
    cgroup v2 (io.max `MAJ:MIN rbps=N wbps=M`, +io enabled in the parent's
    cgroup.subtree_control) where the machine's v2 hierarchy has the io controller, else
    v1 blkio (blkio.throttle.read_bps_device, write_bps_device; v1 caps the writes its
    processes submit, such as an fsync's, not the kernel's background writeback). `version`
    forces one. On the way out, whatever is
    still inside is killed (only processes the caller put there), then the group removed,
    even on failure."""
    v2, v1 = _v2_root(), _v1_root()
    if version is None:
        version = 2 if v2 else 1 if v1 else 0
    base = v2 if version == 2 else v1 if version == 1 else None
    if base is None:
        raise RuntimeError("no cgroup with a read throttle: neither a v2 io controller nor v1 blkio")
    if version == 2:
        ctl = base / "cgroup.subtree_control"
        if "io" not in ctl.read_text().split():
            ctl.write_text("+io\n")
    path = base / f"trainio-throttle-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    path.mkdir()
    th = Throttle(path=path, version=version, majmin=majmin, rbps=int(rbps or 0), wbps=int(wbps or 0))
    try:
        if version == 2 and (rbps or wbps):
            caps = " ".join(f"{k}={int(v)}" for k, v in (("rbps", rbps), ("wbps", wbps)) if v)
            (path / "io.max").write_text(f"{majmin} {caps}\n")
        elif version == 1:
            if rbps:
                (path / "blkio.throttle.read_bps_device").write_text(f"{majmin} {int(rbps)}\n")
            if wbps:
                (path / "blkio.throttle.write_bps_device").write_text(f"{majmin} {int(wbps)}\n")
        yield th
    finally:
        _remove_cgroup(th, base)


def _remove_cgroup(th: Throttle, base: Path) -> None:
    deadline = time.monotonic() + 10
    while True:
        pids = th.pids()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        try:
            th.path.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            if time.monotonic() > deadline:
                # Still busy (a process in uninterruptible sleep): out to the parent, then go.
                for pid in th.pids():
                    with contextlib.suppress(OSError):
                        (base / "cgroup.procs").write_text(f"{pid}\n")
                with contextlib.suppress(OSError):
                    th.path.rmdir()
                return
            time.sleep(0.05)


# Progress lines every 0.2 s: a test reads them to know how far a replay is.
PROGRESS_ENV = {"TRAINIO_PROGRESS_S": "0.2"}


def start_recording(*args: str, timeout: float = 120) -> subprocess.Popen[str]:
    """`trainio record ARGS` with its stderr piped, returned once it says it records (its
    probes attached); the rest of its stderr is left for the caller. Fails naming its exit
    and what it printed, or after `timeout` s, killing it."""
    p = subprocess.Popen([str(TRAINIO), "record", *args], stderr=subprocess.PIPE, text=True)
    assert p.stderr is not None
    err = p.stderr
    seen: list[str] = []
    ready = threading.Event()

    def watch() -> None:
        for line in err:
            seen.append(line)
            if line.startswith("trainio record: recording "):
                ready.set()
                return

    t = threading.Thread(target=watch, daemon=True)
    t.start()
    t.join(timeout)
    if ready.is_set():
        return p
    p.kill()
    p.wait(timeout=30)
    raise AssertionError(f"recorder exited {p.returncode} before recording: {''.join(seen)[-2000:]}")


def wait_for_steps(job: subprocess.Popen, at_least: int = 1, timeout: float = 60) -> list[str]:
    """Reads job's stderr (a text pipe) until rank 0's progress line ("replay: step K/N
    ...", run with PROGRESS_ENV, and under mpirun `-x TRAINIO_PROGRESS_S`) says K >= at_least: the job is
    then into its steps. Returns the lines read; fails if the job ends or none comes in time."""
    assert job.stderr is not None
    lines: list[str] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([job.stderr], [], [], 0.2)
        if not ready:
            assert job.poll() is None, (job.returncode, lines)
            continue
        line = job.stderr.readline()
        assert line, f"the job ended before its steps: {lines}"
        lines.append(line)
        if (m := re.match(r"replay: step (\d+)/", line)) and int(m.group(1)) >= at_least:
            return lines
    raise AssertionError(f"no progress line in {timeout} s: {lines}")


def under_a_terminal(cmd: list, env: dict) -> tuple[int, list[tuple[float, bytes]], float]:
    """Runs cmd with its stderr on a pseudo-terminal; returns its exit code, what the
    terminal received (with when), and when the process ended."""
    master, slave = pty.openpty()
    p = subprocess.Popen(list(map(str, cmd)), stdout=subprocess.DEVNULL, stderr=slave, env=env)
    os.close(slave)
    got: list[tuple[float, bytes]] = []
    ended = None
    try:
        while True:
            ready, _, _ = select.select([master], [], [], 0.05)
            if ready:
                try:
                    chunk = os.read(master, 65536)
                except OSError:  # EIO: the terminal's last writer is gone
                    chunk = b""
                if not chunk:
                    break
                got.append((time.monotonic(), chunk))
            if ended is None and p.poll() is not None:
                ended = time.monotonic()
        p.wait(timeout=120)
    finally:
        os.close(master)
        if p.poll() is None:
            p.kill()
            p.wait()
    return p.returncode, got, ended if ended is not None else time.monotonic()


def require_root(why: str) -> None:
    """The one root policy of the tests: a test or fixture that needs root fails without
    it, saying what for; it never skips (a skipped test would read as passing). Tests
    marked ``root`` get this check from tests/conftest.py before they start."""
    if os.geteuid() != 0:
        import pytest  # here: the benches import this module without pytest's machinery

        pytest.fail(f"needs root ({why}): run the tests as root", pytrace=False)
