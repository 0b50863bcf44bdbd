"""configs/ holds MLPerf Storage's published workload files unchanged (issue 21 item 5):
each file's SHA-256 is the one configs/README.md lists, and where ../shared/dlio-configs/
is present, its bytes are the published file's."""

from __future__ import annotations

import hashlib
import re

from replay_helpers import ROOT

CONFIGS = ROOT / "configs"
PUBLISHED = ROOT.parent / "shared" / "dlio-configs" / "mlperf-storage-main"


def _listed() -> dict[str, str]:
    text = (CONFIGS / "README.md").read_text()
    return dict(re.findall(r"^\| `([\w.-]+\.yaml)` \| `([0-9a-f]{64})` \|$", text, re.M))


def test_every_published_workload_is_listed_with_its_hash_and_unchanged() -> None:
    listed = _listed()
    shipped = {p.name for p in CONFIGS.glob("*.yaml") if not p.name.startswith("demo-")}
    assert shipped and set(listed) == shipped, (sorted(listed), sorted(shipped))
    for name, digest in listed.items():
        data = (CONFIGS / name).read_bytes()
        assert hashlib.sha256(data).hexdigest() == digest, f"configs/{name} differs from the published file"
        if PUBLISHED.is_dir():
            assert data == (PUBLISHED / name).read_bytes(), name
