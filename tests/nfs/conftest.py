"""pytest fixtures for tests that need NFS: they boot the QEMU guest of scripts/nfs-guest.

    @pytest.mark.nfs
    @pytest.mark.slow
    def test_x(nfs_guest):
        r = nfs_guest("dd if=/dev/zero of=$NFS41/f bs=1M count=1 oflag=direct",
                      files={"trainio": "bin/trainio"})
        assert r.returncode == 0, r.stderr
        r.mount("/mnt/nfs41")["dev"]          # "0:NN", the s_dev NFS tracepoints report
        (r.outdir / "whatever-the-script-wrote-to-$OUT").read_bytes()

`nfs_guest(script_text, files=None, **kw) -> guest.GuestResult` (see guest.run_guest for the
keyword arguments: timeout, script_timeout, out_size_mib, ...). Every call is one boot
(~20 s on 2 idle cores, TCG): put several checks into one script where you can, e.g. with a
module-scoped fixture. The image is built on first use (~1 min, root) and then reused.

Skipped only when qemu-system-x86_64 is not installed; any other failure (image build, boot,
NFS setup) is an error, not a skip. A test that uses the fixture must be marked nfs and slow.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import guest

#: Why boots were retried this session: a passing test may hide a wedged first boot, so the
#: run's summary lists them.
RETRIED: list[str] = []


def pytest_terminal_summary(terminalreporter):
    if RETRIED:
        terminalreporter.section("NFS guest boots that were retried")
        for f in RETRIED:
            terminalreporter.write_line(f[:3000])


def pytest_collection_modifyitems(config, items):
    for item in items:
        if "nfs_guest" in getattr(item, "fixturenames", ()):
            missing = [m for m in ("nfs", "slow") if item.get_closest_marker(m) is None]
            if missing:
                raise pytest.UsageError(f"{item.nodeid} uses nfs_guest but lacks @pytest.mark.{', '.join(missing)}")


@pytest.fixture(scope="session")
def nfs_guest_image() -> Path:
    """The guest image's cache directory, built if needed."""
    if shutil.which(guest.QEMU) is None:
        pytest.fail(
            f"{guest.QEMU} is not installed (scripts/install-deps.sh installs "
            "qemu-system-x86): cannot boot the NFS guest"
        )
    return guest.build_image()


@pytest.fixture(scope="session")
def nfs_guest(nfs_guest_image, tmp_path_factory):
    """A callable: run(script_text, files={name: host_path}, **kw) -> guest.GuestResult."""

    def run(script_text: str, files: dict | None = None, **kw) -> guest.GuestResult:
        kw.setdefault("outdir", tmp_path_factory.mktemp("nfs-guest-out"))
        r = guest.run_guest(script_text, files, cache=nfs_guest_image, **kw)
        RETRIED.extend(r.failures)
        return r

    return run
