"""Fixtures for the object-storage tests: a real S3 server (s3s-fs, installed by
scripts/install-deps.sh) over a temp directory, on 127.0.0.1 and a free port, ready
before the test starts and stopped (its directory removed) even when the test fails."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from s3_helpers import S3Server

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
