"""Fixtures for the object-storage tests: a real S3 server (tests/s3server, s3s-fs's
directory backend with TCP_NODELAY on every connection; built by scripts/install-deps.sh)
over a temp directory on disk, on 127.0.0.1 and a free port, ready before the test starts
and stopped (its directory removed) even when the test fails."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import socket
import ssl
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from s3_helpers import VIRTUAL_DOMAIN, S3Server, make_ca_and_cert

# Where scripts/install-deps.sh builds it (its own Cargo.lock, out of the main workspace).
SERVER = Path(__file__).resolve().parents[2] / "target" / "s3server" / "release" / "trainio-s3server"
READY_S = 30.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _answers_http(port: int) -> bool:
    """True once the server answers an HTTP request (any status: an unsigned request is refused)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
            s.sendall(b"GET / HTTP/1.1\r\nhost: 127.0.0.1\r\nconnection: close\r\n\r\n")
            return s.recv(16).startswith(b"HTTP/1.1 ")
    except OSError:
        return False


def _start_on_a_free_port(
    start: Callable[[int], list[str]], ready: Callable[[int], bool], log: Path
) -> tuple[subprocess.Popen, int] | None:
    """Starts `start(port)` on a free port (its output in `log`) and waits until `ready(port)`.
    A port taken between the probe and the bind makes the server exit: another is tried,
    five in all. None if none worked."""
    for _ in range(5):
        port = _free_port()
        with open(log, "w") as out:
            proc = subprocess.Popen(start(port), stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + READY_S
        while proc.poll() is None and time.monotonic() < deadline and not ready(port):
            time.sleep(0.05)
        if proc.poll() is None and ready(port):
            return proc, port
        proc.kill()
        proc.wait()
    return None


def _stop(proc: subprocess.Popen | None) -> None:
    if proc is not None and proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@contextlib.contextmanager
def s3_server_on(
    domain: str | None = None, *, egress_mib_s: float | None = None, nagle: bool = False
) -> Iterator[S3Server]:
    """The test S3 server over a temp directory under /var/tmp (disk, not tmpfs), on
    127.0.0.1 and a free port. With `domain`, it takes virtual-hosted requests to
    BUCKET.`domain`:PORT (and no path-style ones); with `egress_mib_s`, its response bodies
    leave at that rate at most, all connections together; `nagle` leaves Nagle's algorithm
    on (for the bench's comparison)."""
    if not SERVER.exists():
        pytest.fail(f"{SERVER} is missing: run scripts/install-deps.sh")
    root = Path(tempfile.mkdtemp(prefix="trainio-s3-", dir="/var/tmp"))
    access, secret = "trainio-test", "trainio-test-secret-key"
    proc = None
    try:
        log = root.parent / f"{root.name}.log"
        args = ["--access-key", access, "--secret-key", secret, str(root)]
        if egress_mib_s is not None:
            args = ["--egress-mib-s", str(egress_mib_s), *args]
        if nagle:
            args = ["--nagle", *args]

        def start(port: int) -> list[str]:
            named = ["--domain", f"{domain}:{port}"] if domain else []
            return [str(SERVER), "--host", "127.0.0.1", "--port", str(port), *named, *args]

        started = _start_on_a_free_port(start, _answers_http, log)
        proc, port = started if started else (None, 0)
        if proc is None:
            text = (root.parent / f"{root.name}.log").read_text()
            pytest.fail(f"the S3 server did not start on 127.0.0.1: {text[-500:]}")
        yield S3Server(endpoint=f"http://127.0.0.1:{port}", root=root, access_key=access, secret_key=secret)
    finally:
        _stop(proc)
        shutil.rmtree(root, ignore_errors=True)
        with_log = root.parent / f"{root.name}.log"
        if with_log.exists():
            os.unlink(with_log)


@pytest.fixture
def s3_server() -> Iterator[S3Server]:
    with s3_server_on() as server:
        yield server


@pytest.fixture
def s3_server_with() -> Iterator[Callable[..., S3Server]]:
    """Starts test S3 servers with s3_server_on's options (`egress_mib_s=...`); every one is
    stopped and its directory removed when the test ends, failed or not."""
    with contextlib.ExitStack() as stack:
        yield lambda **options: stack.enter_context(s3_server_on(**options))


@pytest.fixture
def s3_virtual_server() -> Iterator[S3Server]:
    """The S3 server taking virtual-hosted requests: Host BUCKET.s3.trainio.test:PORT on
    127.0.0.1:PORT (the server's `endpoint` stays the address; a client resolves the
    names itself, /etc/hosts is not touched)."""
    with s3_server_on(VIRTUAL_DOMAIN) as server:
        yield server


def _answers_https(port: int, ca: Path) -> bool:
    """True once the TLS terminator completes a handshake (verified with `ca`) and the server
    behind it answers."""
    try:
        ctx = ssl.create_default_context(cafile=str(ca))
        with socket.create_connection(("127.0.0.1", port), timeout=1) as raw:
            with ctx.wrap_socket(raw, server_hostname="127.0.0.1") as s:
                s.sendall(b"GET / HTTP/1.1\r\nhost: 127.0.0.1\r\nconnection: close\r\n\r\n")
                return s.recv(16).startswith(b"HTTP/1.1 ")
    except (OSError, ssl.SSLError):
        return False


@pytest.fixture
def s3_tls_server(s3_server: S3Server) -> Iterator[S3Server]:
    """s3_server behind stunnel (Debian's stunnel4, scripts/install-deps.sh): HTTPS on
    127.0.0.1 and a free port with a certificate of a CA made for the test, which the
    returned server names (`ca`, AWS_CA_BUNDLE in env()). stunnel is stopped and the
    certificates removed even when the test fails."""
    binary = shutil.which("stunnel") or shutil.which("stunnel4")
    if binary is None:
        pytest.fail("stunnel is missing: run scripts/install-deps.sh")
    d = Path(tempfile.mkdtemp(prefix="trainio-tls-", dir="/dev/shm"))
    backend = s3_server.endpoint.rsplit(":", 1)[1]
    proc = None
    try:
        ca, cert, key = make_ca_and_cert(d)
        conf = d / "stunnel.conf"

        def start(port: int) -> list[str]:
            conf.write_text(
                "foreground = yes\npid =\ndebug = 4\n"
                f"[s3]\naccept = 127.0.0.1:{port}\nconnect = 127.0.0.1:{backend}\ncert = {cert}\nkey = {key}\n"
            )
            return [binary, str(conf)]

        started = _start_on_a_free_port(start, lambda port: _answers_https(port, ca), d / "stunnel.log")
        proc, port = started if started else (None, 0)
        if proc is None:
            pytest.fail(f"stunnel did not start on 127.0.0.1: {(d / 'stunnel.log').read_text()[-500:]}")
        yield dataclasses.replace(s3_server, endpoint=f"https://127.0.0.1:{port}", ca=ca)
    finally:
        _stop(proc)
        shutil.rmtree(d, ignore_errors=True)
