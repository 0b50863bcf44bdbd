"""Where a run's results go: a --json path that cannot take them is refused before the run;
a fault after the run (a full disk, a failed recorder) loses neither the results nor a
file that was there; nothing half-written is left (issue #20 items 3 and 4)."""

from __future__ import annotations

import json
import subprocess
import threading
import time
from pathlib import Path

import pytest
from replay_helpers import load_json, run_trainio, sh, write_workload

pytestmark = [pytest.mark.root]


def _mount_tmpfs(where: Path, opts: str) -> None:
    where.mkdir()
    sh("mount", "-t", "tmpfs", "-o", opts, "none", where)


@pytest.mark.parametrize("case", ["missing-dir", "read-only", "directory", "symlink"])
def test_an_unwritable_json_path_is_refused_before_the_run(tmpfs_dir: Path, case: str) -> None:
    wl = write_workload(tmpfs_dir / "wl.yaml", files=8, record=64 << 10, batch=2, compute=0.01)
    ro = tmpfs_dir / "ro"
    target = {
        "missing-dir": tmpfs_dir / "nowhere" / "r.json",
        "read-only": ro / "r.json",
        "directory": tmpfs_dir,
        "symlink": tmpfs_dir / "link.json",
    }[case]
    if case == "read-only":
        _mount_tmpfs(ro, "ro,size=1M")
    if case == "symlink":
        (tmpfs_dir / "real.json").write_text("{}")
        target.symlink_to(tmpfs_dir / "real.json")
    try:
        for cmd in (["replay", "--generate", "--gpus", 1], ["sweep", "--max-gpus", "2", "--start-gpus", 1]):
            p = run_trainio(*cmd, "--workload", wl, "--data-dir", tmpfs_dir / "d", "--json", target, check=False)
            assert p.returncode == 2, (cmd, p.stdout, p.stderr)
            lines = p.stderr.strip().splitlines()
            assert len(lines) == 1 and "--json" in lines[0] and str(target) in lines[0], p.stderr
            assert not (tmpfs_dir / "d").exists(), "the run started"
        if case == "symlink":
            assert target.is_symlink() and (tmpfs_dir / "real.json").read_text() == "{}"
    finally:
        if case == "read-only":
            sh("umount", ro)


def test_a_full_disk_after_the_run_prints_the_results_and_leaves_no_partial_file(tmpfs_dir: Path) -> None:
    wl = write_workload(tmpfs_dir / "wl.yaml", files=8, record=64 << 10, batch=2, compute=0.01)
    run_trainio("datagen", "--workload", wl, "--data-dir", tmpfs_dir / "d")
    small = tmpfs_dir / "small"
    _mount_tmpfs(small, "size=64k")
    try:
        old = small / "r.json"
        old.write_text('{"previous": true}')
        # Fill what is left, so that the results cannot be written when the run ends.
        subprocess.run(["dd", "if=/dev/zero", f"of={small / 'fill'}", "bs=4k"], capture_output=True)
        p = run_trainio(
            "replay", "--workload", wl, "--data-dir", tmpfs_dir / "d", "--gpus", 1, "--json", old, check=False
        )
        assert p.returncode != 0
        assert "could not be saved" in p.stderr and str(old) in p.stderr, p.stderr
        start = p.stdout.index("{")
        printed = json.loads(p.stdout[start:])
        assert printed["gpus"] == 1 and printed["bytes_read"] == 8 * (64 << 10) * 1
        assert old.read_text() == '{"previous": true}', "the old results were overwritten"
        assert sorted(f.name for f in small.iterdir()) == ["fill", "r.json"], "a temporary file was left"
    finally:
        sh("umount", small)


def test_a_failed_recorder_does_not_take_the_replays_results(tmpfs_dir: Path) -> None:
    wl = write_workload(tmpfs_dir / "wl.yaml", files=32, record=64 << 10, batch=2, compute=0.1)
    run_trainio("datagen", "--workload", wl, "--data-dir", tmpfs_dir / "d")
    out = tmpfs_dir / "r.json"
    killed = []

    def kill_recorder() -> None:
        # The recorder dies while the replay runs (as an OOM kill would).
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not killed and not list((tmpfs_dir / "rec").glob("*.partial")):
            time.sleep(0.05)
        time.sleep(0.3)  # the replay is running: it starts once the recorder follows it
        if not killed:
            subprocess.run(["pkill", "-KILL", "-f", f"trainio-record --output {tmpfs_dir}"])

    t = threading.Thread(target=kill_recorder)
    t.start()
    try:
        p = run_trainio(
            "replay",
            "--workload",
            wl,
            "--data-dir",
            tmpfs_dir / "d",
            "--gpus",
            1,
            "--record",
            tmpfs_dir / "rec",
            "--json",
            out,
            check=False,
        )
    finally:
        killed.append(True)
        t.join()
    assert p.returncode != 0
    assert "the recorder failed" in p.stderr and "results above stand" in p.stderr, p.stderr
    r = load_json(out)
    assert r["gpus"] == 1 and r["bytes_read"] == 32 * (64 << 10)
    assert "AU" in p.stdout
