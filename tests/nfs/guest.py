"""Boots trainio's NFS test guest (scripts/nfs-guest) under QEMU and runs one script in it.

The guest (Debian 12 cloud kernel, built once by scripts/nfs-guest/build-image.sh) exports an
ext4 file system over NFS to itself and mounts it twice over loopback: NFS 4.1 at /mnt/nfs41
and NFS 3 at /mnt/nfs3. The script runs as root with these environment variables:

    NFS41=/mnt/nfs41  NFS3=/mnt/nfs3  EXPORT=/export  OUT=/out  PAYLOAD=/payload

and its working directory is /payload, which holds script.sh and the files handed in. What it
leaves in $OUT comes back in ``GuestResult.outdir``, next to the harness's own files:
stdout, stderr, returncode, setup.log, setup_rc, mountinfo, mountstats, dmesg, uname, timing,
console.log.

Transport: the payload is a tar on a read-only raw virtio disk (serial trainio-payload); the
guest writes /out as a tar onto a second raw disk (serial trainio-out) that the host unpacks.
Root and export images are attached copy-on-write (snapshot=on), so every boot starts clean.

A wedged guest: the host reads the console as it comes. When the guest kernel reports a CPU
stuck for WEDGE_STUCK_S or more (soft lockup) or a third RCU stall, qemu is killed at once
instead of at the timeout, and the boot counts as failed (retried like a boot that never reached
the script). Each boot's console is kept as console-N.log in the output directory. A script
that calls `mark step NAME` (guest-init.sh's marker function) names the step a wedge happened
in. The kernel command line carries trainio.attempt=N (the boot's number, from 1).

Library: ``build_image()``, ``run_guest()``. Command line: ``scripts/nfs-guest/run.sh --help``.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = REPO / "scripts" / "nfs-guest"
QEMU = "qemu-system-x86_64"
MARKER = "TRAINIO-GUEST:"
#: A soft lockup report of this many seconds or more means the guest is wedged, not just slow:
#: a host that stalls a TCG vCPU thread for a few seconds makes the guest report 20-30 s
#: lockups that end; the CI failure of 2026-11-23 went on for 775 s.
WEDGE_STUCK_S = 60
#: This many RCU stall reports (the kernel repeats them every ~60 s) mean the same.
WEDGE_RCU_STALLS = 3
_SOFT_LOCKUP = re.compile(r"soft lockup - CPU#(\d+) stuck for (\d+)s!")
_RCU_STALL = re.compile(r"rcu: INFO: \S+ (?:self-)?detected stalls? on CPU")


def default_cache() -> Path:
    return Path(os.environ.get("TRAINIO_GUEST_CACHE", "/var/cache/trainio/nfs-guest"))


class GuestError(RuntimeError):
    """The guest did not boot to the script (after the retry), or gave no output back."""


@dataclasses.dataclass
class GuestResult:
    returncode: int  # the script's exit status (124/137: killed by the in-guest timeout)
    stdout: str
    stderr: str
    outdir: Path  # the guest's /out, unpacked on the host
    console: str  # the serial console (kernel log + harness markers)
    kernel: str  # the guest's `uname -r`
    attempts: int  # boots it took (2 = the first boot failed and was retried)
    boot_to_script_s: float  # host wall-clock seconds from starting qemu to the script's start
    total_s: float  # host wall-clock seconds from starting qemu to qemu's exit
    guest_uptime_at_script_s: float  # guest uptime when the script started
    failures: list[str] = dataclasses.field(default_factory=list)  # why earlier boots failed

    @property
    def mountinfo(self) -> str:
        return (self.outdir / "mountinfo").read_text()

    @property
    def mountstats(self) -> str:
        return (self.outdir / "mountstats").read_text()

    def mount(self, mountpoint: str) -> dict[str, str]:
        """The mountinfo entry of `mountpoint`: dev ("0:NN", the s_dev the NFS tracepoints
        report), fstype, source, options (per-mount) and super_options (e.g. vers=4.1,...)."""
        for line in self.mountinfo.splitlines():
            left, _, right = line.partition(" - ")
            f = left.split()
            if f[4] == mountpoint:
                fstype, source, super_options = (right.split(" ", 2) + ["", ""])[:3]
                return {
                    "dev": f[2],
                    "fstype": fstype,
                    "source": source,
                    "options": f[5],
                    "super_options": super_options,
                }
        raise KeyError(f"{mountpoint} not in the guest's mountinfo")


def build_image(cache: Path | None = None) -> Path:
    """Builds the guest image into `cache` unless it is already complete; returns the cache
    directory. Needs root the first time (debootstrap); a complete cache needs nothing."""
    cache = Path(cache) if cache else default_cache()
    env = dict(os.environ, TRAINIO_GUEST_CACHE=str(cache))
    proc = subprocess.run([str(SCRIPTS / "build-image.sh")], env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise GuestError(f"build-image.sh failed (rc={proc.returncode}):\n{proc.stderr[-4000:]}")
    return cache


def _make_payload(
    path: Path, script_text: str, files: dict[str, str | os.PathLike] | None, script_timeout: int
) -> None:
    def root_owned(ti: tarfile.TarInfo) -> tarfile.TarInfo:
        ti.uid = ti.gid = 0
        ti.uname = ti.gname = "root"
        return ti

    with tempfile.TemporaryDirectory(prefix="trainio-payload-") as tmp:
        t = Path(tmp)
        (t / "script.sh").write_text(script_text)
        (t / "config").write_text(f"SCRIPT_TIMEOUT={int(script_timeout)}\n")
        with tarfile.open(path, "w", format=tarfile.GNU_FORMAT) as tar:
            tar.add(t / "script.sh", "script.sh", filter=root_owned)
            tar.add(SCRIPTS / "guest-init.sh", ".trainio/init.sh", filter=root_owned)
            tar.add(t / "config", ".trainio/config", filter=root_owned)
            for name, host_path in (files or {}).items():
                name = str(name).lstrip("/")
                if not name or name.startswith(".trainio") or name == "script.sh":
                    raise ValueError(f"payload name {name!r} is reserved or empty")
                if not Path(host_path).exists():
                    raise FileNotFoundError(host_path)
                tar.add(str(host_path), name, filter=root_owned)
    # A raw disk's size must be a multiple of 512; tarfile pads to 10240, but make sure.
    size = path.stat().st_size
    if size % 512:
        with open(path, "ab") as f:
            f.write(b"\0" * (512 - size % 512))


def wedged(console: str) -> str | None:
    """Why the guest whose console this is counts as wedged (see WEDGE_STUCK_S), or None."""
    worst = max(((int(m.group(2)), m.group(1)) for m in _SOFT_LOCKUP.finditer(console)), default=None)
    if worst and worst[0] >= WEDGE_STUCK_S:
        return f"soft lockup: CPU#{worst[1]} stuck for {worst[0]} s"
    stalls = len(_RCU_STALL.findall(console))
    if stalls >= WEDGE_RCU_STALLS:
        return f"{stalls} RCU stall reports"
    return None


def wedge_report(console: str, lines: int = 60) -> str:
    """What to show of a wedged boot: the last marker line before the first lockup or stall
    report (the step it happened in) and that report's first `lines` lines (its backtrace)."""
    first = min((m.start() for rx in (_SOFT_LOCKUP, _RCU_STALL) for m in rx.finditer(console)), default=None)
    if first is None:
        return console[-3000:]
    start = console.rfind("\n", 0, first) + 1
    before = [ln for ln in console[:start].splitlines() if MARKER in ln]
    last_step = before[-1].strip() if before else "(no marker before it)"
    report = "\n".join(console[start:].splitlines()[:lines])
    return f"last marker before it: {last_step}\nfirst report:\n{report}"


def _qemu_command(cache: Path, work: Path, smp: int, mem_mib: int, kernel_args: str) -> list[str]:
    def disk(name: str, file: Path, opts: str) -> list[str]:
        return [
            "-drive",
            f"file={file},if=none,id={name},format=raw{opts}",
            "-device",
            f"virtio-blk-pci,drive={name},serial=trainio-{name}",
        ]

    return [
        QEMU,
        "-accel",
        "tcg,thread=multi",
        "-cpu",
        "max",
        "-smp",
        str(smp),
        "-m",
        str(mem_mib),
        "-nographic",
        "-no-reboot",
        "-nic",
        "none",
        "-kernel",
        str(cache / "vmlinuz"),
        "-initrd",
        str(cache / "initrd.img"),
        # softlockup_all_cpu_backtrace: a lockup report shows what every CPU was doing;
        # loglevel=5 lets its stack lines (KERN_DEFAULT, level 4) reach the console.
        "-append",
        f"console=ttyS0 panic=1 loglevel=5 mitigations=off softlockup_all_cpu_backtrace=1 {kernel_args}".strip(),
        *disk("root", cache / "root.img", ",snapshot=on"),
        *disk("payload", work / "payload.tar", ",readonly=on"),
        *disk("out", work / "out.img", ""),
        *disk("export", cache / "export.img", ",snapshot=on"),
    ]


def _boot_once(cmd: list[str], work: Path, console_path: Path, timeout: float):
    """Runs qemu until it exits, `timeout` passes or the guest wedges (then kills it). Returns
    (console text, seconds to the script-start marker or None, total seconds, timed_out,
    why it wedged or None)."""
    env = dict(os.environ, TMPDIR=str(work))  # snapshot=on overlays live (and die) in work
    t0 = time.monotonic()
    script_at = None
    timed_out = False
    wedge = None
    seen = 0
    with open(console_path, "wb") as console_f:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=console_f, stderr=subprocess.STDOUT, env=env)
        try:
            while True:
                try:
                    proc.wait(timeout=0.1)
                    break
                except subprocess.TimeoutExpired:
                    pass
                size = console_path.stat().st_size
                if size != seen:
                    seen = size
                    text = console_path.read_bytes().decode("utf-8", "replace")
                    if script_at is None and f"{MARKER} script-start" in text:
                        script_at = time.monotonic() - t0
                    wedge = wedged(text)
                    if wedge:
                        break
                if time.monotonic() - t0 > timeout:
                    timed_out = True
                    break
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    total = time.monotonic() - t0
    console = console_path.read_bytes().decode("utf-8", "replace")
    if script_at is None and f"{MARKER} script-start" in console:
        script_at = total
    return console, script_at, total, timed_out, wedge


def run_guest(
    script_text: str,
    files: dict[str, str | os.PathLike] | None = None,
    *,
    outdir: str | os.PathLike | None = None,
    cache: str | os.PathLike | None = None,
    timeout: float = 600,
    script_timeout: float | None = None,
    retries: int = 1,
    smp: int = 2,
    mem_mib: int = 2048,
    out_size_mib: int = 1024,
    kernel_args: str = "",
) -> GuestResult:
    """Boots the guest, runs `script_text` (bash) in it, returns its result.

    files: {name in /payload: host path (file or directory)}. outdir: where the guest's /out
    lands (default: a new temporary directory, the caller's to delete). timeout: hard limit for
    one boot in host seconds (qemu is killed); script_timeout: the in-guest limit for the script
    (default timeout - 120 s, at least 30). retries: further boots when a boot fails before the
    script starts or wedges (see WEDGE_STUCK_S). Raises GuestError when no boot reached the end
    of the script unwedged, or no output came back.
    """
    cache = Path(cache) if cache else default_cache()
    if shutil.which(QEMU) is None:
        raise GuestError(f"{QEMU} not found: run scripts/install-deps.sh")
    for f in ("vmlinuz", "initrd.img", "root.img", "export.img", "stamp"):
        if not (cache / f).exists():
            raise GuestError(f"guest image incomplete ({cache / f} missing): run scripts/nfs-guest/build-image.sh")
    if script_timeout is None:
        script_timeout = max(30, timeout - 120)
    outdir = Path(outdir) if outdir else Path(tempfile.mkdtemp(prefix="trainio-guest-out-"))
    outdir.mkdir(parents=True, exist_ok=True)

    with tempfile.TemporaryDirectory(prefix="trainio-guest-") as tmp:
        work = Path(tmp)
        _make_payload(work / "payload.tar", script_text, files, int(script_timeout))
        failures = []
        for attempt in range(1, retries + 2):
            cmd = _qemu_command(cache, work, smp, mem_mib, f"trainio.attempt={attempt} {kernel_args}")
            out_img = work / "out.img"
            with open(out_img, "wb") as f:
                f.truncate(out_size_mib << 20)
            console_path = work / f"console-{attempt}.log"
            console, script_at, total, timed_out, wedge = _boot_once(cmd, work, console_path, timeout)
            (outdir / f"console-{attempt}.log").write_text(console)
            (outdir / "console.log").write_text(console)
            if wedge:
                where = "after the script started" if script_at is not None else "before the script started"
                failures.append(
                    f"boot {attempt}: wedged ({wedge}) {where}, killed after {total:.1f} s; {wedge_report(console)}"
                )
                continue
            if script_at is not None:
                break
            why = "timed out" if timed_out else "qemu exited"
            failures.append(
                f"boot {attempt}: {why} after {total:.1f} s before the script started; console tail:\n{console[-3000:]}"
            )
        else:
            raise GuestError("no boot ran the script to its end\n" + "\n\n".join(failures))

        try:
            with tarfile.open(out_img, "r:") as tar:
                if hasattr(tarfile, "data_filter"):
                    tar.extractall(outdir, filter="data")
                else:  # pragma: no cover - Python without extraction filters
                    tar.extractall(outdir)
        except tarfile.TarError as e:
            raise GuestError(
                f"no output from the guest ({e}); timed out: {timed_out}; console tail:\n{console[-3000:]}"
            ) from None

    def read(name: str) -> str:
        p = outdir / name
        return p.read_text(errors="replace") if p.exists() else ""

    rc_text = read("returncode").strip()
    if not rc_text:
        raise GuestError(
            f"the guest gave no return code; setup.log:\n{read('setup.log')[-3000:]}\nconsole tail:\n{console[-3000:]}"
        )
    m = re.search(r"script_start_uptime=([\d.]+)", read("timing"))
    return GuestResult(
        returncode=int(rc_text),
        stdout=read("stdout"),
        stderr=read("stderr"),
        outdir=outdir,
        console=console,
        kernel=read("uname").strip(),
        attempts=attempt,
        boot_to_script_s=script_at,
        total_s=total,
        guest_uptime_at_script_s=float(m.group(1)) if m else float("nan"),
        failures=failures,
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="scripts/nfs-guest/run.sh",
        description="Boot the NFS test guest, run SCRIPT in it (env NFS41, NFS3, EXPORT, OUT, "
        "PAYLOAD; cwd /payload), unpack its $OUT into --out. Exits with the "
        "script's status.",
    )
    ap.add_argument("script", help="bash script to run in the guest ('-' reads stdin)")
    ap.add_argument(
        "--file",
        "-f",
        action="append",
        default=[],
        metavar="NAME=HOSTPATH",
        help="put HOSTPATH (file or directory) at /payload/NAME; repeatable",
    )
    ap.add_argument("--out", "-o", required=True, help="host directory for the guest's /out")
    ap.add_argument(
        "--cache", default=None, help="image cache (default $TRAINIO_GUEST_CACHE or /var/cache/trainio/nfs-guest)"
    )
    ap.add_argument("--timeout", type=float, default=600, help="hard limit per boot, seconds")
    ap.add_argument("--script-timeout", type=float, default=None)
    ap.add_argument("--no-build", action="store_true", help="fail instead of building the image")
    a = ap.parse_args(argv)
    files = {}
    for spec in a.file:
        name, sep, path = spec.partition("=")
        if not sep:
            ap.error(f"--file wants NAME=HOSTPATH, got {spec!r}")
        files[name] = path
    script_text = sys.stdin.read() if a.script == "-" else Path(a.script).read_text()
    cache = Path(a.cache) if a.cache else default_cache()
    if not a.no_build:
        build_image(cache)
    try:
        r = run_guest(script_text, files, outdir=a.out, cache=cache, timeout=a.timeout, script_timeout=a.script_timeout)
    except GuestError as e:
        print(f"run.sh: {e}", file=sys.stderr)
        return 125
    sys.stdout.write(r.stdout)
    sys.stderr.write(r.stderr)
    for f in r.failures:
        print(f"run.sh: {f.splitlines()[0]}", file=sys.stderr)
    print(
        f"run.sh: kernel {r.kernel}, script rc {r.returncode}, boot-to-script "
        f"{r.boot_to_script_s:.1f} s (guest uptime {r.guest_uptime_at_script_s:.1f} s), total "
        f"{r.total_s:.1f} s, attempts {r.attempts}, output in {r.outdir}",
        file=sys.stderr,
    )
    return r.returncode


if __name__ == "__main__":
    sys.exit(main())
