"""A cluster of N hosts on one machine, for the multi-host tests: each host is a network
namespace with its own address on a bridge, its own host name (a UTS namespace), its own
/run and /etc/hosts (a mount namespace), and Debian's sshd, so that `mpirun -H h1:2,h2:2`
starts ranks on them the way it does on a real cluster: over ssh, one `orted` per host.

    switch netns:  br0 ── v1 ── eth0 [h1 10.23.0.1]   sshd
                       ├─ v2 ── eth0 [h2 10.23.0.2]   sshd
                       └─ vH ── eth0 [head 10.23.0.254]   mpirun runs here

The bridge and every veth live in namespaces of the test bed's own, never in the machine's
network namespace, so concurrent test beds (other sessions) cannot clash on names or
addresses. The hosts share the machine's mount namespace as it was when they started (each
host's is a private copy), so a file system mounted before they start (`shared`) is the
same path with the same data on every host: shared storage. Everything is undone by
close(), whatever happened: every process in the namespaces is killed, the namespaces are
deleted (with them the veths and the bridge), the shared file system is unmounted and its
loop device detached.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from trainio_testlib import MPI_ROOT_ENV, SESSION_MARK, loop_device, mounted_loop_fs, require_root

SUBNET = "10.23.0"
SSHD = "/usr/sbin/sshd"


def need_testbed_tools() -> None:
    require_root("network namespaces, loop devices")
    missing = [
        t for t in ("ip", "unshare", "nsenter", "mpirun", "ssh", "ssh-keygen", "/usr/sbin/sshd") if not shutil.which(t)
    ]
    if missing:
        pytest.fail(f"missing {', '.join(missing)}: run scripts/install-deps.sh (openssh-server, openmpi-bin)")


def _run(*cmd, check=True, **kw) -> subprocess.CompletedProcess[str]:
    p = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, **kw)
    if check and p.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, cmd))} exited {p.returncode}: {p.stderr.strip()}")
    return p


def netns_pids(ns: str) -> list[int]:
    """Every process whose network namespace is `ns`."""
    p = _run("ip", "netns", "pids", ns, check=False)
    return [int(x) for x in p.stdout.split()] if p.returncode == 0 else []


def comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


class TestBed:
    """`TestBed(tmp, 3)`: hosts h1..h3 and a head node; use as a context manager."""

    __test__ = False  # not a pytest class

    def __init__(self, tmp: Path, hosts: int, *, shared_mb: int = 256):
        self.tmp = Path(tmp)
        self.names = [f"h{i + 1}" for i in range(hosts)]
        self.id = f"trainio-{uuid.uuid4().hex[:8]}"
        self.switch = f"{self.id}-sw"
        self.shared_mb = shared_mb
        self.sshd: dict[str, subprocess.Popen] = {}
        self.namespaces: list[str] = []
        self.ip = {h: f"{SUBNET}.{i + 1}" for i, h in enumerate(self.names)}
        self.ip["head"] = f"{SUBNET}.254"
        self._stack = contextlib.ExitStack()
        self.shared: Path | None = None
        self.shared_dev = ""

    def ns(self, host: str) -> str:
        return f"{self.id}-{host}"

    # -- set-up ---------------------------------------------------------------------------

    def __enter__(self) -> TestBed:
        try:
            dev, _, mnt = self._stack.enter_context(mounted_loop_fs(self.shared_mb))
            self.shared, self.shared_dev = mnt, dev
            # Unwound first: the hosts' processes go before the file system they hold.
            self._stack.callback(self._teardown_namespaces)
            self._keys_and_configs()
            self._network()
            for h in self.names:
                self._start_sshd(h)
            for h in self.names:
                self._wait_ssh(h)
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self._stack.close()

    def _keys_and_configs(self) -> None:
        t = self.tmp
        t.mkdir(parents=True, exist_ok=True)
        _run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "trainio-test-client", "-f", t / "client")
        (t / "authorized_keys").write_text((t / "client.pub").read_text())
        hosts = ["127.0.0.1 localhost"] + [f"{self.ip[h]} {h}" for h in [*self.names, "head"]]
        (t / "hosts").write_text("\n".join(hosts) + "\n")
        known = []
        for h in self.names:
            key = t / f"{h}.hostkey"
            _run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", h, "-f", key)
            known.append(f"{h},{self.ip[h]} " + " ".join(Path(f"{key}.pub").read_text().split()[:2]))
            # Root by key only; StrictModes off because the files live in a test's tmp dir.
            (t / f"{h}.sshd_config").write_text(
                f"ListenAddress {self.ip[h]}\n"
                f"HostKey {key}\n"
                "PidFile none\n"
                f"AuthorizedKeysFile {t / 'authorized_keys'}\n"
                "PermitRootLogin prohibit-password\n"
                "PasswordAuthentication no\n"
                "KbdInteractiveAuthentication no\n"
                "UsePAM no\n"
                "StrictModes no\n"
                "X11Forwarding no\n"
                f"AcceptEnv OMPI_* TRAINIO_* {SESSION_MARK}\n"
            )
        (t / "known_hosts").write_text("\n".join(known) + "\n")
        (t / "ssh_config").write_text(
            "Host *\n"
            "  User root\n"
            f"  IdentityFile {t / 'client'}\n"
            "  IdentitiesOnly yes\n"
            f"  UserKnownHostsFile {t / 'known_hosts'}\n"
            f"  GlobalKnownHostsFile {t / 'known_hosts'}\n"
            "  StrictHostKeyChecking yes\n"
            "  BatchMode yes\n"
            "  ConnectTimeout 5\n"
            "  LogLevel ERROR\n"
            f"  SendEnv OMPI_ALLOW_RUN_AS_ROOT OMPI_ALLOW_RUN_AS_ROOT_CONFIRM TRAINIO_* {SESSION_MARK}\n"
        )

    def _network(self) -> None:
        sw = self.switch
        _run("ip", "netns", "add", sw)
        self.namespaces.append(sw)
        _run("ip", "-n", sw, "link", "add", "br0", "type", "bridge")
        _run("ip", "-n", sw, "link", "set", "br0", "up")
        for i, h in enumerate([*self.names, "head"]):
            ns = self.ns(h)
            _run("ip", "netns", "add", ns)
            self.namespaces.append(ns)
            port = f"v{i + 1}"
            _run("ip", "-n", sw, "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", ns)
            _run("ip", "-n", sw, "link", "set", port, "master", "br0", "up")
            _run("ip", "-n", ns, "link", "set", "lo", "up")
            _run("ip", "-n", ns, "addr", "add", f"{self.ip[h]}/24", "dev", "eth0")
            _run("ip", "-n", ns, "link", "set", "eth0", "up")

    def _on_host_cmd(self, host: str, setup: str = "") -> list[str]:
        """A command prefix that runs argv as `host`: in its network namespace, a new UTS
        namespace named `host`, and a private mount namespace with the test bed's
        /etc/hosts and its own /run (sshd's privilege separation directory lives there)."""
        script = (
            f"mount --bind {self.tmp / 'hosts'} /etc/hosts && "
            "mount -t tmpfs -o mode=755 trainio-run /run && mkdir -m 755 /run/sshd && "
            f'hostname {host} && {setup}exec "$@"'
        )
        return ["ip", "netns", "exec", self.ns(host), "unshare", "--uts", "--mount", "sh", "-c", script, host]

    def _start_sshd(self, h: str) -> None:
        log = open(self.tmp / f"{h}.sshd.log", "wb")
        self.sshd[h] = subprocess.Popen(
            [*self._on_host_cmd(h), SSHD, "-D", "-e", "-f", str(self.tmp / f"{h}.sshd_config")],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
        )
        log.close()

    def _wait_ssh(self, h: str, timeout: float = 20) -> None:
        deadline = time.monotonic() + timeout
        while True:
            p = self.head(["ssh", "-F", self.tmp / "ssh_config", h, "hostname"], timeout=timeout, check=False)
            if p.returncode == 0 and p.stdout.strip() == h:
                return
            if self.sshd[h].poll() is not None or time.monotonic() > deadline:
                log = (self.tmp / f"{h}.sshd.log").read_text(errors="replace")
                raise RuntimeError(f"sshd on {h} is not answering: ssh said {p.stderr.strip()!r}; sshd log: {log}")
            time.sleep(0.2)

    # -- use ------------------------------------------------------------------------------

    def head_cmd(self, argv: list) -> list[str]:
        """argv run on the head node (where mpirun is started)."""
        return [*self._on_host_cmd("head"), *map(str, argv)]

    def head(self, argv: list, *, timeout: float = 120, check: bool = True, env: dict | None = None):
        return _run(*self.head_cmd(argv), check=check, timeout=timeout, env={**os.environ, **(env or {})})

    def mpi_env(self) -> dict[str, str]:
        """mpirun's environment: ssh with the test bed's keys and hosts as the launcher, and
        MPI traffic on the bridge's subnet (the head's loopback is not the hosts')."""
        return {
            **os.environ,
            **MPI_ROOT_ENV,
            "OMPI_MCA_plm_rsh_agent": f"ssh -F {self.tmp / 'ssh_config'}",
            "OMPI_MCA_oob_tcp_if_include": f"{SUBNET}.0/24",
            "OMPI_MCA_btl_tcp_if_include": f"{SUBNET}.0/24",
        }

    def mpirun(self, slots: dict[str, int], argv: list) -> list[str]:
        """The command line that runs argv as sum(slots) ranks, slots[h] of them on host h."""
        hosts = ",".join(f"{h}:{n}" for h, n in slots.items())
        return self.head_cmd(["mpirun", "--bind-to", "none", "-H", hosts, "-np", sum(slots.values()), *argv])

    def on_host(self, host: str, argv: list, *, check: bool = True) -> subprocess.CompletedProcess[str]:
        """argv in the namespaces of `host`'s sshd (what a process started there sees)."""
        pid = self.sshd[host].pid  # ip netns exec, unshare and sh exec: this pid is sshd's
        return _run("nsenter", "-t", pid, "-n", "-u", "-m", *argv, check=check)

    def local_disks(self, hosts: list[str], size_mb: int = 64) -> tuple[Path, dict[str, str]]:
        """Local storage: a loop device per host, each seen by its host at the same path
        (the returned node, a bind mount in that host's mount namespace only), as
        /dev/nvme0n1 is each cluster node's own drive. Returns (that path, host -> the
        machine's /dev/loopN). Detached at close(), with the test bed."""
        node = self.tmp / f"local-disk-{uuid.uuid4().hex[:6]}"
        node.touch()
        devs = {}
        for h in hosts:
            devs[h] = self._stack.enter_context(loop_device(size_mb))
            self.on_host(h, ["mount", "--bind", devs[h], node])
        return node, devs

    def processes(self, host: str) -> list[tuple[int, str]]:
        """(pid, command name) of every process running on `host` (its network namespace)."""
        return [(p, comm(p)) for p in netns_pids(self.ns(host))]

    # -- teardown -------------------------------------------------------------------------

    def _teardown_namespaces(self) -> None:
        errors = []
        for ns in reversed(self.namespaces):
            for _ in range(50):
                pids = netns_pids(ns)
                if not pids:
                    break
                for pid in pids:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                time.sleep(0.1)
            else:
                errors.append(f"{ns}: processes {netns_pids(ns)} survive SIGKILL")
        for p in self.sshd.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=5)
        for ns in reversed(self.namespaces):
            p = _run("ip", "netns", "del", ns, check=False)
            if p.returncode != 0:
                errors.append(f"ip netns del {ns}: {p.stderr.strip()}")
        self.namespaces.clear()
        if errors:
            raise RuntimeError("; ".join(errors))
