"""deploy/: the systemd unit and the Kubernetes DaemonSet that run the recorder on a node.
Each passes its real validator (systemd-analyze verify; kubernetes-validate with the
Kubernetes API schemas, offline), a broken copy fails it, and the recorder command each
runs records a real trace here with retention and subtree cgroup targeting."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from trainio_testlib import ROOT, require_root, run

# isort: split
from trainio_analysis.trace import read_metadata

UNIT = ROOT / "deploy" / "systemd" / "trainio-record.service"
DAEMONSET = ROOT / "deploy" / "kubernetes" / "trainio-record.yaml"
VALIDATE = ROOT / ".venv" / "bin" / "kubernetes-validate"


def verify(unit: Path) -> subprocess.CompletedProcess[str]:
    return run(["systemd-analyze", "verify", str(unit)], timeout=60)


def test_the_unit_passes_systemd_analyze_verify(tmp_path: Path) -> None:
    assert shutil.which("systemd-analyze"), "systemd-analyze is missing: make deps installs systemd"
    res = verify(UNIT)
    assert res.returncode == 0 and not res.stderr.strip(), res.stderr
    # The verifier is real: a typo in a value, or a command that does not exist, is caught.
    text = UNIT.read_text()
    for broken in (text.replace("Type=exec", "Type=exce"), text.replace("ExecStart=/bin/sh", "ExecStart=/nonexistent")):
        assert broken != text
        copy = tmp_path / "trainio-record.service"
        copy.write_text(broken)
        res = verify(copy)
        assert res.returncode != 0 or res.stderr.strip(), broken


def validate(manifest: Path) -> subprocess.CompletedProcess[str]:
    assert VALIDATE.exists(), "kubernetes-validate is missing: make deps installs tests/deploy/requirements.txt"
    return run([str(VALIDATE), "--strict", str(manifest)], timeout=120)


def test_the_daemonset_validates_against_the_kubernetes_schema(tmp_path: Path) -> None:
    res = validate(DAEMONSET)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "passed for resource daemonset/trainio-record" in res.stdout + res.stderr
    doc = yaml.safe_load(DAEMONSET.read_text())
    spec = doc["spec"]["template"]["spec"]
    assert doc["kind"] == "DaemonSet" and spec["hostPID"] is True
    # A wrong type and an unknown field are refused.
    for mutate in (
        lambda d: d["spec"]["template"]["spec"].update(hostPID="yes"),
        lambda d: d["spec"]["template"]["spec"]["containers"][0].update(privilegd=True),
    ):
        bad = yaml.safe_load(DAEMONSET.read_text())
        mutate(bad)
        path = tmp_path / "bad.yaml"
        path.write_text(yaml.safe_dump(bad))
        res = validate(path)
        assert res.returncode != 0, res.stdout


def _unit_command() -> str:
    """The unit's ExecStart, its line continuations joined and systemd's %% unescaped."""
    text = UNIT.read_text().replace("\\\n", " ")
    line = next(ln for ln in text.splitlines() if ln.startswith("ExecStart="))
    argv = shlex.split(line.removeprefix("ExecStart="))
    assert argv[:2] == ["/bin/sh", "-c"]
    return argv[2].replace("%%", "%")


def _unit_environment() -> dict[str, str]:
    return dict(re.findall(r"^Environment=(\w+)=(.*)$", UNIT.read_text(), re.M))


@pytest.fixture
def job_cgroup() -> Path:
    require_root("BPF, cgroups")
    unified = Path("/sys/fs/cgroup/unified")  # a hybrid hierarchy's cgroup v2
    base = unified if (unified / "cgroup.procs").exists() else Path("/sys/fs/cgroup")
    cg = base / f"trainio-deploy-{os.getpid()}"
    cg.mkdir()
    try:
        yield cg
    finally:
        cg.rmdir()


def _recorded(out: Path, res: subprocess.CompletedProcess[str], cgroup: Path) -> None:
    assert res.returncode == 0, res.stderr
    traces = [d for d in out.iterdir() if d.is_dir()]
    assert len(traces) == 1 and re.fullmatch(r"\d{8}T\d{6}Z", traces[0].name), traces
    meta = read_metadata(traces[0])
    assert meta["target"] == {"cgroup": str(cgroup)}
    assert meta["retention"]["max_bytes"] == 20480 << 20
    assert meta["retention"]["max_age_s"] == 604800
    assert set(meta["layers"]) >= {"block", "file"}


@pytest.mark.root
@pytest.mark.slow
def test_the_units_recorder_command_records(tmp_path: Path, job_cgroup: Path) -> None:
    env = {**os.environ, **_unit_environment(), "TRAINIO_CGROUP": str(job_cgroup)}
    env["TRAINIO_METRICS_ADDR"] = "127.0.0.1:0"  # any free port
    command = _unit_command().replace("/opt/trainio", str(ROOT)).replace("/var/lib/trainio", str(tmp_path))
    res = run(["/bin/sh", "-c", command + " --duration 2"], env=env, timeout=120)
    _recorded(tmp_path, res, job_cgroup)


@pytest.mark.root
@pytest.mark.slow
def test_the_daemonsets_recorder_command_records(tmp_path: Path, job_cgroup: Path) -> None:
    container = yaml.safe_load(DAEMONSET.read_text())["spec"]["template"]["spec"]["containers"][0]
    assert container["command"] == ["/bin/sh", "-c"]
    script = (
        container["args"][0]
        .replace("/opt/trainio", str(ROOT))
        .replace("/var/lib/trainio", str(tmp_path))
        .replace("/host/sys/fs/cgroup/kubepods.slice", str(job_cgroup))
        .replace("0.0.0.0:9464", "127.0.0.1:0")
    )
    res = run(["/bin/sh", "-c", script + " --duration 2"], timeout=120)
    _recorded(tmp_path, res, job_cgroup)
