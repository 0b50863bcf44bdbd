"""Every training workload file MLPerf Storage and DLIO publish runs unchanged, scaled
down on the command line only (dataset size, record length, steps, epochs, computation
time), on tmpfs: exit 0, and each feature the replay does not model named in one line on
standard error. An object-storage file whose endpoint does not answer is refused before any
work; --param storage.storage_type=local_fs runs it on local files.
The copies in tests/replay/data/dlio-configs/ (from ../shared/dlio-configs/, checked
against it where present) and configs/*.yaml; checkpoint-only files (llama) are planned."""

from __future__ import annotations

import hashlib
import re
import shutil
import tempfile
from pathlib import Path

import pytest
from replay_helpers import ROOT, load_json, run_trainio
from test_replay_checkpoint import TABLE, hidden_size

COPIES = Path(__file__).resolve().parent / "data" / "dlio-configs"
SHARED = ROOT.parent / "shared" / "dlio-configs"
SCALE = [
    "--steps", 2, "--epochs", 1, "--computation-time", 0.001, "-q",
    "++workload.dataset.num_files_train=4",
    "++workload.dataset.record_length_bytes=4096",
    "++workload.dataset.record_length_bytes_stdev=0",
]  # fmt: skip
# Features of the published training files that the replay does not model, each to be
# named in one line: the key, and the files (as parsed) that use it.
UNMODELED = {
    "reader.computation_threads": lambda d: "computation_threads" in d.get("reader", {}),
}


def sections(text: str) -> dict[str, dict[str, str]]:
    """The published files' two levels (section, then key: scalar), read without a YAML
    library: a top-level `name:` opens a section, an indented `key: value` fills it."""
    out: dict[str, dict[str, str]] = {}
    current = None
    for line in text.splitlines():
        body = line.split("#", 1)[0].rstrip()
        if not body.strip():
            continue
        m = re.match(r"^(\s*)([A-Za-z_][\w]*):\s*(.*)$", body)
        if not m:
            continue
        indent, key, value = m.groups()
        if not indent:
            current = out.setdefault(key, {})
            if value:
                current["_"] = value
        elif current is not None and len(indent) <= 4:
            current.setdefault(key, value.strip())
    return out


def true(v) -> bool:
    return str(v).strip().lower() == "true"


NOTE = re.compile(r"^trainio: not modeled: (\S+): ([a-z0-9_.]+): ")


def workload_files():
    files = sorted(COPIES.glob("*/*.yaml")) + sorted((ROOT / "configs").glob("*.yaml"))
    # The published sets, all of them: 34 files in four sets (SOURCES.txt of the shared copy).
    assert len(list(COPIES.glob("*/*.yaml"))) == 34
    for f in COPIES.glob("*/*.yaml"):
        original = SHARED / f.parent.name / f.name
        if original.exists():
            assert original.read_bytes() == f.read_bytes(), f"{f} differs from {original}"
    # Byte-identical files (configs/ holds mlcommons/storage main's) run once.
    seen, unique = set(), []
    for f in files:
        digest = hashlib.sha256(f.read_bytes()).hexdigest()
        if digest not in seen:
            seen.add(digest)
            unique.append(f)
    return unique


def notes(stderr: str, path: Path) -> list[str]:
    keys = []
    for line in stderr.splitlines():
        m = NOTE.match(line)
        if m:
            assert m.group(1) == str(path), line
            keys.append(m.group(2))
    return keys


@pytest.fixture
def shm():
    d = Path(tempfile.mkdtemp(prefix="trainio-every-yaml-", dir="/dev/shm"))
    yield d
    shutil.rmtree(d, ignore_errors=True)


def test_every_published_training_file_runs_scaled_down(shm):
    ran = {"replay": 0, "datagen": 0, "plan": 0, "s3": 0}
    for f in workload_files():
        before = f.read_bytes()
        d = sections(before.decode())
        data = shm / f"{f.parent.name}-{f.stem}"
        workflow = d.get("workflow", {})
        train = workflow.get("train", "true")
        if true(workflow.get("checkpoint")) and (not true(train) or "dataset" not in d):
            p = run_trainio(
                "replay", "--workload", f, "--gpus", TABLE[hidden_size(f)][0], "--data-dir", data, "--plan-only"
            )
            assert "plan only: nothing written" in p.stdout, f
            assert notes(p.stderr, f) == [], (f, p.stderr)
            ran["plan"] += 1
            continue
        storage = d.get("storage", {}).get("storage_type")
        extra = []
        if storage not in (None, "local_fs"):
            p = run_trainio("replay", "--workload", f, "--data-dir", data, "--generate", *SCALE, check=False)
            errors = [ln for ln in p.stderr.splitlines() if not NOTE.match(ln)]
            assert p.returncode == 2 and len(errors) == 1, (f, p.stderr)
            # Its endpoint (a local port nothing listens on) is checked before any work.
            assert "S3 endpoint" in p.stderr and "cannot connect" in p.stderr, (f, p.stderr)
            assert not data.exists()
            extra = ["--param", "storage.storage_type=local_fs"]
            ran["s3"] += 1
        if not true(train):
            # MLPerf's *_datagen.yaml: the dataset only.
            p = run_trainio("datagen", "--workload", f, "--data-dir", data, *extra, *SCALE[:2], *SCALE[6:])
            assert "trainio datagen:" in p.stderr, (f, p.stderr)
            r = run_trainio("replay", "--workload", f, "--data-dir", data, *extra, *SCALE, check=False)
            assert r.returncode == 2 and "workflow.train is false" in r.stderr and "trainio datagen" in r.stderr
            assert [ln for ln in r.stderr.splitlines() if not NOTE.match(ln)] == [r.stderr.splitlines()[-1]], r.stderr
            ran["datagen"] += 1
        else:
            out = shm / "r.json"
            p = run_trainio("replay", "--workload", f, "--data-dir", data, "--generate", "--json", out, *extra, *SCALE)
            j = load_json(out)
            assert j["steps"] == 2 and j["bytes_read"] > 0, f
            assert [r["name"] for r in j["rules"]] == ["dataset_size", "au_threshold", "cache", "runs"]
            assert "MLPerf run rules:" in p.stdout
            ran["replay"] += 1
        named = notes(p.stderr, f)
        expected = sorted(k for k, uses in UNMODELED.items() if uses(d))
        assert sorted(named) == expected, (f, p.stderr)
        assert f.read_bytes() == before
        shutil.rmtree(data, ignore_errors=True)
    # 29 distinct files: 17 training ones (unet3d_h100_s3 among them, refused first, then
    # run on local files), 3 datagen ones, 8 checkpoint-only ones.
    assert ran == {"replay": 17, "datagen": 3, "plan": 8, "s3": 1}, ran
    assert ran["replay"] + ran["datagen"] + ran["plan"] == len(workload_files())
