"""One run per data directory: datagen, replay and sweep hold a flock on
--data-dir/.trainio-lock; a second run is refused in one line naming the holder's pid
(exit 2), the kernel releases the lock when the holder dies (SIGKILL included), and the
ranks of one MPI job share the directory (only rank 0 takes the lock)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
from replay_helpers import MPI_ENV, REPLAY_BIN, TRAINIO, run_trainio, write_workload


def flock_holders(path: Path) -> set[int]:
    """Pids holding a flock on `path`, from /proc/locks."""
    st = os.stat(path)
    want = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    pids = set()
    for line in Path("/proc/locks").read_text().splitlines():
        f = line.split()
        if len(f) >= 6 and f[1] == "FLOCK" and f[5] == want:
            pids.add(int(f[4]))
    return pids


def start_replay(wl: Path, data: Path, *extra: object) -> subprocess.Popen[str]:
    if not REPLAY_BIN.exists():
        pytest.fail(f"{REPLAY_BIN} is missing: run 'make' first")
    cmd = [str(TRAINIO), "replay", "--workload", str(wl), "--data-dir", str(data), "-q", *map(str, extra)]
    return subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, **MPI_ENV}
    )


def wait_for_lock(data: Path, pid: int, proc: subprocess.Popen[str], timeout: float = 60) -> None:
    lock = data / ".trainio-lock"
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if lock.exists() and pid in flock_holders(lock):
            return
        if proc.poll() is not None:
            pytest.fail(f"the first run ended before it held the lock: {proc.communicate()}")
        time.sleep(0.05)
    pytest.fail("the first run never held the lock")


@pytest.fixture
def slow_workload(tmp_path: Path) -> Path:
    """A replay of ~6 s: 12 steps of 0.5 s on a small dataset."""
    return write_workload(tmp_path / "w.yaml", files=12, record=4096, batch=1, compute=0.5, threads=1)


def test_a_second_run_is_refused_naming_the_holder(tmp_path: Path, slow_workload: Path) -> None:
    data = tmp_path / "d"
    first = start_replay(slow_workload, data, "--generate")
    try:
        wait_for_lock(data, first.pid, first)
        for cmd in (
            ("datagen", "--workload", slow_workload, "--data-dir", data, "-q"),
            ("replay", "--workload", slow_workload, "--data-dir", data, "-q"),
            ("sweep", "--workload", slow_workload, "--data-dir", data, "-q", "--max-gpus", 2),
        ):
            p = run_trainio(*cmd, check=False, timeout=60)
            assert p.returncode == 2, (cmd[0], p.returncode, p.stderr)
            lines = p.stderr.strip().splitlines()
            assert len(lines) == 1, p.stderr
            assert f"pid {first.pid}" in lines[0] and "--data-dir" in lines[0] and str(data) in lines[0], lines[0]
        assert first.poll() is None, "the refused runs disturbed the first"
        _, err = first.communicate(timeout=120)
        assert first.returncode == 0, err
    finally:
        if first.poll() is None:
            first.kill()
            first.communicate()
    # released on exit, and its file removed: the next run goes ahead
    assert not (data / ".trainio-lock").exists()
    run_trainio("datagen", "--workload", slow_workload, "--data-dir", data, "-q")


def test_the_lock_of_a_sigkilled_run_is_released(tmp_path: Path, slow_workload: Path) -> None:
    data = tmp_path / "d"
    first = start_replay(slow_workload, data, "--generate")
    wait_for_lock(data, first.pid, first)
    first.send_signal(signal.SIGKILL)
    first.communicate(timeout=30)
    assert first.returncode == -signal.SIGKILL
    assert (data / ".trainio-lock").exists()  # the file stays (no one removed it); the lock does not
    assert flock_holders(data / ".trainio-lock") == set()
    p = run_trainio("datagen", "--workload", slow_workload, "--data-dir", data, "-q", check=False)
    assert p.returncode == 0, p.stderr


def test_plan_only_takes_no_lock(tmp_path: Path, slow_workload: Path) -> None:
    """--plan-only never touches --data-dir, so it runs beside a replay of the same one."""
    data = tmp_path / "d"
    first = start_replay(slow_workload, data, "--generate")
    try:
        wait_for_lock(data, first.pid, first)
        ckpt = Path(__file__).resolve().parents[2] / "configs" / "llama3_8b.yaml"
        p = run_trainio("replay", "--workload", ckpt, "--gpus", 8, "--data-dir", data, "--plan-only", check=False)
        assert p.returncode == 0, p.stderr
    finally:
        first.kill()
        first.communicate()


def test_mpi_ranks_of_one_job_share_the_directory(tmp_path: Path) -> None:
    """Two ranks of one replay under mpirun: the job runs (rank 0 holds the lock, rank 1
    does not take it), and a second job on the same directory is refused."""
    mpirun = shutil.which("mpirun")
    if mpirun is None:
        pytest.fail("mpirun is missing (OpenMPI is a dependency: scripts/install-deps.sh)")
    wl = write_workload(tmp_path / "w.yaml", files=8, record=4096, batch=1, compute=0.0, threads=1)
    data = tmp_path / "d"
    prefix = (mpirun, "--allow-run-as-root", "--oversubscribe", "--bind-to", "none", "-np", "2")
    p = run_trainio(
        "replay", "--workload", wl, "--data-dir", data, "--gpus", 2, "--generate", "-q", "--json", tmp_path / "r.json",
        prefix=prefix, timeout=300,
    )  # fmt: skip
    assert p.returncode == 0, p.stderr
    assert '"ranks": 2' in (tmp_path / "r.json").read_text()
    assert not (data / ".trainio-lock").exists(), "the lock file outlived the run"
