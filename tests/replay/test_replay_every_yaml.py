"""Every training workload file MLPerf Storage and DLIO publish runs unchanged, scaled
down on the command line only (dataset size, record length, steps, epochs, computation
time), on tmpfs: exit 0, and each feature the replay does not model named in one line on
standard error. An object-storage file whose endpoint does not answer is refused before any
work; --param storage.storage_type=local_fs runs it on local files.
The copies in tests/replay/data/dlio-configs/ (from ../shared/dlio-configs/, checked
against it where present; MLPerf Storage v3.0's in mlperf-storage-v3/) and
configs/*.yaml; checkpoint-only files (llama) are planned, and their sizes checked against
v3.0's checkpoint table. The Parquet files (v3.0's flux and dlrm) run once trainio lays
out Parquet; until then each is refused on its format alone, in one line."""

from __future__ import annotations

import hashlib
import re
import shutil
import tempfile
from functools import partial
from pathlib import Path

import pytest
from replay_helpers import ROOT, load_json, run_trainio
from test_replay_checkpoint import TABLE, hidden_size

COPIES = Path(__file__).resolve().parent / "data" / "dlio-configs"
SHARED = ROOT.parent / "shared" / "dlio-configs"
# What a replay without a Parquet layout says of a Parquet workload, and nothing else.
PARQUET_REFUSED = "dataset.format: 'parquet' is not a format DLIO reads"
SCALE = [
    "--steps", 2, "--epochs", 1, "--computation-time", 0.001, "-q",
    "++workload.dataset.num_files_train=4",
    "++workload.dataset.record_length_bytes=4096",
    "++workload.dataset.record_length_bytes_stdev=0",
]  # fmt: skip


def has_key(section: str, key: str, d: dict) -> bool:
    return key in d.get(section, {})


# Features of the published training files that the replay does not model, each to be
# named in one line: the key, and the files (as parsed) that use it.
UNMODELED = {
    "reader.computation_threads": lambda d: "computation_threads" in d.get("reader", {}),
    # v3.0's dlrm_b200: the main process reads (no DataLoader workers), replayed by one reader
    "reader.read_threads": lambda d: d.get("reader", {}).get("read_threads") == "0",
    # PNG's files are opaque bytes read whole (JPEG and Parquet are laid out and read as
    # PIL and pyarrow read them).
    "dataset.format": lambda d: d.get("dataset", {}).get("format") == "png",
    # The object-storage files run on local files: the library, protocol and endpoint
    # they name are not used (the v3.0 folder's older layouts keep them under reader:).
    **{
        f"{section}.{key}": partial(has_key, section, key)
        for section, key in [
            ("storage", "storage_library"),
            ("storage", "protocol"),
            ("reader", "storage_library"),
            ("reader", "storage_options"),
            ("reader", "storage_root"),
            ("reader", "protocol"),
            ("reader", "data_loader_root"),
            ("reader", "data_loader_classname"),
            ("reader", "shuffle"),
            ("profiling", "profiler"),
        ]
    },
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
    # The published sets, all of them: 34 files in four sets (SOURCES.txt of the shared
    # copy), and the 34 of MLPerf Storage v3.0's (mlperf-storage-v3/SOURCES.txt).
    assert len(list(COPIES.glob("*/*.yaml"))) == 34 + 34
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


def refused_as_parquet(p, data: Path) -> bool:
    """True when the run was refused for the Parquet format alone: exit 2, one line (after
    the notes), nothing written."""
    lines = [ln for ln in p.stderr.splitlines() if not NOTE.match(ln)]
    if p.returncode != 2 or PARQUET_REFUSED not in p.stderr:
        return False
    assert len(lines) == 1 and PARQUET_REFUSED in lines[0], p.stderr
    assert not data.exists()
    return True


def test_every_published_training_file_runs_scaled_down(shm):
    ran = {"replay": 0, "datagen": 0, "plan": 0, "s3": 0, "parquet_refused": 0}
    for f in workload_files():
        before = f.read_bytes()
        d = sections(before.decode())
        data = shm / f"{f.parent.name}-{f.stem}"
        workflow = d.get("workflow", {})
        train = workflow.get("train", "true")
        parquet = d.get("dataset", {}).get("format") == "parquet"
        # object storage: storage.storage_type, or reader.storage_type in the older layouts
        storage = d.get("storage", {}).get("storage_type") or d.get("reader", {}).get("storage_type")
        extra = []
        if storage not in (None, "local_fs"):
            # Keys in the environment (a file may name none), and an endpoint on a local
            # port nothing listens on (the files' own hosts may answer from some networks),
            # so the endpoint is what fails.
            keys = {"AWS_ACCESS_KEY_ID": "trainio-test", "AWS_SECRET_ACCESS_KEY": "trainio-test"}
            closed = ["--param", "storage.storage_options.endpoint_url=http://127.0.0.1:1"]
            p = run_trainio(
                "replay", "--workload", f, "--data-dir", data, "--generate", *SCALE, *closed, check=False, env=keys
            )
            errors = [ln for ln in p.stderr.splitlines() if not NOTE.match(ln)]
            assert p.returncode == 2 and len(errors) == 1, (f, p.stderr)
            # Its endpoint (a local port nothing listens on) is checked before any work.
            assert "S3 endpoint" in p.stderr and "cannot connect" in p.stderr, (f, p.stderr)
            assert not data.exists()
            extra = ["--param", "storage.storage_type=local_fs"]
            ran["s3"] += 1
        if true(workflow.get("checkpoint")) and (not true(train) or "dataset" not in d):
            out = shm / "plan.json"
            gpus, table_gib = TABLE[hidden_size(f)]
            p = run_trainio(
                "replay", "--workload", f, "--gpus", gpus, "--data-dir", data, "--plan-only", "--json", out, *extra
            )
            assert "plan only: nothing written" in p.stdout, f
            assert sorted(notes(p.stderr, f)) == sorted(k for k, uses in UNMODELED.items() if uses(d)), p.stderr
            c = load_json(out)["checkpoint"]
            # MLPerf Storage v3.0's Table 2: the same processes and size (1T: the formula's
            # 15,426 GiB against the table's 18,000 GB, within 15 %).
            row = c["edition_table"]
            assert row["processes"] == gpus and row["matches"] is True, (f, row)
            assert row["reason"] in p.stdout
            assert c["planned_gib"] == pytest.approx(table_gib, rel=0.005), f
            ran["plan"] += 1
        elif not true(train):
            # MLPerf's *_datagen.yaml: the dataset only.
            p = run_trainio("datagen", "--workload", f, "--data-dir", data, *extra, *SCALE[:2], *SCALE[6:], check=False)
            if parquet and refused_as_parquet(p, data):
                ran["parquet_refused"] += 1
                continue
            assert p.returncode == 0 and "trainio datagen:" in p.stderr, (f, p.stderr)
            r = run_trainio("replay", "--workload", f, "--data-dir", data, *extra, *SCALE, check=False)
            assert r.returncode == 2 and "workflow.train is false" in r.stderr and "trainio datagen" in r.stderr
            assert [ln for ln in r.stderr.splitlines() if not NOTE.match(ln)] == [r.stderr.splitlines()[-1]], r.stderr
            ran["datagen"] += 1
        else:
            out = shm / "r.json"
            args = ("replay", "--workload", f, "--data-dir", data, "--generate", "--json", out, *extra, *SCALE)
            p = run_trainio(*args, check=not parquet)
            if parquet and refused_as_parquet(p, data):
                ran["parquet_refused"] += 1
                continue
            assert p.returncode == 0, (f, p.stderr)
            j = load_json(out)
            assert j["steps"] == 2 and j["bytes_read"] > 0, f
            names = [r["name"] for r in j["rules"]]
            assert names == ["dataset_size", "au_threshold", "cache", "runs", "category"], (f, names)
            rules = {r["name"]: r for r in j["rules"]}
            # Scaled down on the command line: no submission, and the reason says why.
            assert rules["category"]["verdict"] == "whatif" and not rules["category"]["pass"], f
            model = j["settings"]["name"]
            assert f"threshold {j['threshold_percent']:.0f}% for {model}" in rules["au_threshold"]["reason"], f
            au = d.get("metric", {}).get("au")
            if au is not None:
                assert j["threshold_percent"] == pytest.approx(float(au) * 100), f
            assert "MLPerf run rules:" in p.stdout
            ran["replay"] += 1
        named = notes(p.stderr, f)
        expected = sorted(k for k, uses in UNMODELED.items() if uses(d))
        assert sorted(named) == expected, (f, p.stderr)
        assert f.read_bytes() == before
        shutil.rmtree(data, ignore_errors=True)
    # 58 distinct files: 39 training ones run (the object-storage ones refused first, then
    # run on local files; the 7 Parquet ones among them: v3.0's flux and dlrm, the deleted
    # dlrm_parquet_* and the selective-read example), 10 datagen ones (3 Parquet), 9
    # checkpoint-only ones planned; no file refused on its format. The 8 object-storage
    # files (storage_type s3 or object, in storage: or reader:) are refused on their
    # endpoint first.
    assert ran == {"replay": 39, "datagen": 10, "plan": 9, "s3": 8, "parquet_refused": 0}, ran
    assert sum(ran[k] for k in ("replay", "datagen", "plan", "parquet_refused")) == len(workload_files())
