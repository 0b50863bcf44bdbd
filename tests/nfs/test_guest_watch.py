"""The NFS guest harness tells a wedged guest from a slow one by its console (guest.wedged),
and kills a wedged qemu at once instead of at the boot's timeout (guest._boot_once).

The wedged console is the real one of the CI run that failed on 2026-11-23: the guest's
ksoftirqd/0 ran for 775 s and qemu was killed only at the 900 s timeout. No qemu needed here.
"""

from __future__ import annotations

import time
from pathlib import Path

import guest  # tests/nfs/guest.py, put on sys.path by conftest.py

DATA = Path(__file__).resolve().parent / "data"
CI_WEDGED = (DATA / "console-wedged-ci-2026-11-23.txt").read_text()
CLEAN = (DATA / "console-clean-2026-11-23.txt").read_text()
#: The same wedge, caught by this harness on a local run of the record test's script.
LOCAL_WEDGED = (DATA / "console-wedged-local-2026-11-23.txt").read_text()


def lockup(cpu: int, secs: int, t: float = 100.0) -> str:
    return f"[ {t:10.6f}] watchdog: BUG: soft lockup - CPU#{cpu} stuck for {secs}s! [fio:321]\n"


RCU = "[  705.081145] rcu: INFO: rcu_preempt self-detected stall on CPU\n"


def test_the_ci_console_is_wedged_and_a_clean_boot_is_not():
    assert guest.wedged(CI_WEDGED) == "soft lockup: CPU#0 stuck for 775 s"
    assert guest.wedged(CLEAN) is None


def test_the_local_wedge_is_caught_and_its_step_named():
    """Its first report is an RCU stall 22 s after the step began; the kill came at the
    second soft lockup report (44 s, then 70 s)."""
    assert guest.wedged(LOCAL_WEDGED) == "soft lockup: CPU#0 stuck for 70 s"
    cut = LOCAL_WEDGED[: LOCAL_WEDGED.index("stuck for 70s")]
    assert guest.wedged(cut) is None  # at the 44 s report it was not yet a wedge
    report = guest.wedge_report(LOCAL_WEDGED)
    assert "last marker before it: TRAINIO-GUEST: step loop-qd16 uptime=53.98" in report
    assert "rcu: INFO: rcu_preempt self-detected stall on CPU" in report.split("first report:")[1]


def test_a_short_lockup_is_slowness_a_long_one_is_a_wedge():
    short = CLEAN + lockup(1, 23) + lockup(0, guest.WEDGE_STUCK_S - 1)
    assert guest.wedged(short) is None
    assert (
        guest.wedged(short + lockup(1, guest.WEDGE_STUCK_S)) == f"soft lockup: CPU#1 stuck for {guest.WEDGE_STUCK_S} s"
    )


def test_repeated_rcu_stalls_are_a_wedge():
    """A CPU spinning with interrupts off never reports a soft lockup; RCU stalls tell."""
    assert guest.wedged(CLEAN + RCU * (guest.WEDGE_RCU_STALLS - 1)) is None
    assert guest.wedged(CLEAN + RCU * guest.WEDGE_RCU_STALLS) == f"{guest.WEDGE_RCU_STALLS} RCU stall reports"


def test_the_report_names_the_step_and_shows_the_first_report():
    head = CLEAN.split("TRAINIO-GUEST: script-end")[0]  # up to "step rate"
    console = (
        head
        + lockup(0, 22, 80.5)
        + "[   80.500001] CPU: 0 PID: 14 Comm: ksoftirqd/0\n"
        + "TRAINIO-GUEST: step later uptime=99.0\n"
        + lockup(0, 99, 160.0)
    )
    report = guest.wedge_report(console)
    assert "last marker before it: TRAINIO-GUEST: step rate uptime=62.36" in report
    first = report.split("first report:\n", 1)[1]
    assert first.startswith("[  80.500000] watchdog: BUG: soft lockup - CPU#0 stuck for 22s!")
    assert "Comm: ksoftirqd/0" in first


def test_a_wedged_process_is_killed_at_once(tmp_path):
    """A stand-in for qemu prints a lockup report and would then sleep for 5 minutes."""
    cmd = ["bash", "-c", f"printf '%s' '{lockup(0, 75).strip()}'; echo; exec sleep 300"]
    t0 = time.monotonic()
    console, script_at, total, timed_out, wedge = guest._boot_once(cmd, tmp_path, tmp_path / "console.log", timeout=120)
    assert time.monotonic() - t0 < 30
    assert wedge == "soft lockup: CPU#0 stuck for 75 s"
    assert not timed_out and script_at is None
    assert "stuck for 75s" in console


def test_a_quiet_process_runs_to_its_timeout(tmp_path):
    cmd = ["bash", "-c", "echo 'TRAINIO-GUEST: script-start uptime=1'; echo; exec sleep 300"]
    console, script_at, total, timed_out, wedge = guest._boot_once(cmd, tmp_path, tmp_path / "console.log", timeout=2)
    assert timed_out and wedge is None
    assert script_at is not None and 2 <= total < 30
