"""The job model's typed Python view (trainio_analysis.model) against the JSON the Rust
model writes: the golden copies of the sample traces' models (model/tests/golden) parse
strictly, field for field, and a model of the wrong shape fails naming the field."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from trainio_analysis.model import JobModel, ModelError, parse_job_model
from trainio_testlib import ROOT

GOLDEN = sorted((ROOT / "model/tests/golden").glob("*.json"))


def _golden(path: Path) -> dict:
    return json.loads(path.read_text())


def test_there_are_golden_models() -> None:
    assert len(GOLDEN) >= 2


@pytest.mark.parametrize("path", GOLDEN, ids=lambda p: p.stem)
def test_golden_model_parses_strictly_with_its_values(path: Path) -> None:
    raw = _golden(path)
    m = parse_job_model(raw, source=path.name, strict=True)
    assert isinstance(m, JobModel)
    assert m.grouping == raw["grouping"] and m.steps == raw["steps"] > 0
    assert m.compute_s == raw["compute_s"] and m.required_mib_s_per_gpu == raw["required_mib_s_per_gpu"]
    assert len(m.gpus) == len(raw["gpus"]) >= 1
    for g, rg in zip(m.gpus, raw["gpus"], strict=True):
        assert (g.index, g.rank_pid, g.bytes) == (rg["index"], rg["rank_pid"], rg["bytes"])
        assert g.compute_s == rg["compute_s"] and g.required_mib_s == rg["required_mib_s"]
        assert [s.ready_ns for s in g.steps] == [s["ready_ns"] for s in rg["steps"]]
        assert [(mb.pid, mb.role) for mb in g.members] == [(mb["pid"], mb["role"]) for mb in rg["members"]]
        assert g.files == [tuple(f) for f in rg["files"]]
        assert g.host is None
    assert m.writes.gap_ms == raw["writes"]["gap_ms"] and m.hosts == []


def test_a_missing_field_is_named_with_its_path() -> None:
    raw = _golden(GOLDEN[0])
    del raw["gpus"][0]["compute_signal"]
    with pytest.raises(ModelError, match=r"^t1: job_model\.gpus\[0\]: missing field `compute_signal`$"):
        parse_job_model(raw, source="t1")


def test_a_field_of_the_wrong_type_is_named() -> None:
    raw = _golden(GOLDEN[0])
    bad = copy.deepcopy(raw)
    bad["gpus"][0]["steps"][1]["ready_ns"] = "soon"
    with pytest.raises(ModelError, match=r"job_model\.gpus\[0\]\.steps\[1\]\.ready_ns: expected an integer, got str"):
        parse_job_model(bad, source="t1")
    bad = copy.deepcopy(raw)
    bad["gpus"][0]["synchronous"] = 1  # an integer is not a boolean
    with pytest.raises(ModelError, match=r"gpus\[0\]\.synchronous: expected true or false"):
        parse_job_model(bad, source="t1")
    with pytest.raises(ModelError, match=r"^t1: job_model: expected an object, got list"):
        parse_job_model([], source="t1")


def test_optional_fields_take_none_and_numbers_take_integers() -> None:
    raw = _golden(GOLDEN[0])
    raw["compute_s"] = None
    raw["gpus"][0]["bytes_per_step"] = 7  # JSON may write a whole f64 without its point
    m = parse_job_model(raw, source="t1")
    assert m.compute_s is None
    assert m.gpus[0].bytes_per_step == 7.0 and isinstance(m.gpus[0].bytes_per_step, float)


def test_a_trace_sets_fields_are_read() -> None:
    raw = _golden(GOLDEN[0])
    raw["hosts"] = ["h1"]
    raw["gpus"][0]["host"] = "h1"
    m = parse_job_model(raw, source="t1", strict=True)
    assert m.hosts == ["h1"] and m.gpus[0].host == "h1"


def test_unknown_fields_are_refused_only_when_strict() -> None:
    raw = _golden(GOLDEN[0])
    raw["gpus"][0]["new_figure"] = 1.0
    assert parse_job_model(raw, source="t1").gpus[0].index == 0
    with pytest.raises(ModelError, match=r"job_model\.gpus\[0\]: unknown field\(s\) new_figure"):
        parse_job_model(raw, source="t1", strict=True)
