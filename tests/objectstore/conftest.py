"""Fixtures for the object-storage tests: a real S3 server (s3s-fs, installed by
scripts/install-deps.sh) over a temp directory, on 127.0.0.1 and a free port, ready
before the test starts and stopped (its directory removed) even when the test fails."""

from __future__ import annotations

import dataclasses
import os
import shutil
import socket
import ssl
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from s3_helpers import S3Server, make_ca_and_cert

SERVER = Path.home() / ".cargo" / "bin" / "s3s-fs"
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


@pytest.fixture
def s3_server() -> Iterator[S3Server]:
    binary = shutil.which("s3s-fs") or (str(SERVER) if SERVER.exists() else None)
    if binary is None:
        pytest.fail("s3s-fs is missing: run scripts/install-deps.sh")
    root = Path(tempfile.mkdtemp(prefix="trainio-s3-", dir="/dev/shm"))
    access, secret = "trainio-test", "trainio-test-secret-key"
    proc = None
    try:
        # A port taken between the probe and the bind makes the server exit: try another.
        for _ in range(5):
            port = _free_port()
            log = open(root.parent / f"{root.name}.log", "w")
            proc = subprocess.Popen(
                [
                    binary,
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(port),
                    "--access-key",
                    access,
                    "--secret-key",
                    secret,
                    str(root),
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
            log.close()
            deadline = time.monotonic() + READY_S
            while proc.poll() is None and time.monotonic() < deadline and not _answers_http(port):
                time.sleep(0.05)
            if proc.poll() is None and _answers_http(port):
                break
            proc.kill()
            proc.wait()
            proc = None
        if proc is None:
            text = (root.parent / f"{root.name}.log").read_text()
            pytest.fail(f"s3s-fs did not start on 127.0.0.1: {text[-500:]}")
        yield S3Server(endpoint=f"http://127.0.0.1:{port}", root=root, access_key=access, secret_key=secret)
    finally:
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        shutil.rmtree(root, ignore_errors=True)
        with_log = root.parent / f"{root.name}.log"
        if with_log.exists():
            os.unlink(with_log)


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
        for _ in range(5):
            port = _free_port()
            conf = d / "stunnel.conf"
            conf.write_text(
                "foreground = yes\npid =\ndebug = 4\n"
                f"[s3]\naccept = 127.0.0.1:{port}\nconnect = 127.0.0.1:{backend}\ncert = {cert}\nkey = {key}\n"
            )
            log = open(d / "stunnel.log", "w")
            proc = subprocess.Popen([binary, str(conf)], stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
            log.close()
            deadline = time.monotonic() + READY_S
            while proc.poll() is None and time.monotonic() < deadline and not _answers_https(port, ca):
                time.sleep(0.05)
            if proc.poll() is None and _answers_https(port, ca):
                break
            proc.kill()
            proc.wait()
            proc = None
        if proc is None:
            pytest.fail(f"stunnel did not start on 127.0.0.1: {(d / 'stunnel.log').read_text()[-500:]}")
        yield dataclasses.replace(s3_server, endpoint=f"https://127.0.0.1:{port}", ca=ca)
    finally:
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        shutil.rmtree(d, ignore_errors=True)
