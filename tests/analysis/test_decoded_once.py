"""A trace is decoded once per command (#34): ``analyze`` builds its job model from the
row groups its own pass decoded, not from a second read of the trace, and ``report``
analyzes its layer and the file layer (with the model) in one pass; ``compare`` takes the
write bursts it scores from the model its analysis built, and ``export --fio --by gpu``
reads its rows and the model's in one pass. Counted at pyarrow's one decoding call
(``ParquetFile.read_row_group``) and at polars' scan of a trace (``Trace.scan``), on the
8-GPU sample rewritten into row groups of one layer each (as the recorder writes them)
and of both."""

from __future__ import annotations

import collections
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from trainio_analysis import trace as tr
from trainio_analysis.analyze import analyze, analyze_with_file_layer
from trainio_analysis.analyze.result import job_model
from trainio_analysis.compare import compare
from trainio_analysis.interop.export_fio import export_fio
from trainio_analysis.report import write_report

EIGHT = Path(__file__).resolve().parents[2] / "traces" / "unet3d-demo-8gpu"


#: what the plan reads of each row group before the pass, to number the selection's
#: devices or processes when the statistics do not prove them (analyze/plan.py)
PLAN_COLUMNS = {"layer", "dev", "pid"}


@pytest.fixture
def decodes(monkeypatch: pytest.MonkeyPatch) -> Iterator[collections.Counter[tuple[int, str]]]:
    """How many times each column of each row group (by index: the traces here have one
    segment) was decoded."""
    counts: collections.Counter[tuple[int, str]] = collections.Counter()
    real = pq.ParquetFile.read_row_group

    def counting(self: pq.ParquetFile, i: int, columns: list[str] | None = None, **kwargs: object) -> pa.Table:
        for c in columns if columns is not None else self.schema_arrow.names:
            counts[(i, c)] += 1
        return real(self, i, columns, **kwargs)

    real_scan = tr.Trace.scan

    def counting_scan(self: tr.Trace) -> object:
        counts[(-1, "scan")] += 1  # a lazy frame over every row group: decoded when collected
        return real_scan(self)

    monkeypatch.setattr(pq.ParquetFile, "read_row_group", counting)
    monkeypatch.setattr(tr.Trace, "scan", counting_scan)
    yield counts


def _rows_decoded(decodes: collections.Counter[tuple[int, str]]) -> collections.Counter[int]:
    """How many times each row group's rows were decoded (their issue_ns, which every
    reader of the rows takes), and that no column but the plan's was decoded twice."""
    twice = {k: n for k, n in decodes.items() if n > 1 and k[1] not in PLAN_COLUMNS}
    assert not twice, twice
    assert (-1, "scan") not in decodes, "the rows were scanned apart from the row groups' decode"
    return collections.Counter({i: n for (i, c), n in decodes.items() if c == "issue_ns"})


@pytest.fixture(scope="module")
def layered(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The 8-GPU sample with its rows grouped by layer (stable: each layer's rows keep
    their order) in row groups of 1000 rows: some hold one layer, one holds both."""
    seg = EIGHT / "seg-000000.parquet"
    table = pq.read_table(seg)
    order = pc.sort_indices(table["layer"].cast(pa.string()))  # stable: block, then file
    out = tmp_path_factory.mktemp("layered") / "t"
    out.mkdir()
    layered = table.take(order).replace_schema_metadata(pq.read_metadata(seg).metadata)
    pq.write_table(layered, out / seg.name, row_group_size=1000)
    return out


def _groups(trace: Path) -> int:
    return pq.ParquetFile(trace / "seg-000000.parquet").metadata.num_row_groups


@pytest.mark.parametrize("layer", [None, "block", "file"])
def test_analyze_decodes_each_row_group_once_for_statistics_and_model(layered, decodes, layer) -> None:
    out = analyze(layered, layer=layer)
    n = _groups(layered)
    assert n >= 5
    # every row group once: the model needs them all, the statistics share the decode
    assert _rows_decoded(decodes) == collections.Counter(range(n)), decodes
    assert out["job_model"]["steps"] == 40  # the demo's steps (model/tests/golden)


def test_analyze_without_the_model_decodes_only_its_layer(layered, decodes) -> None:
    out = analyze(layered, layer="file", with_model=False)
    assert "job_model" not in out
    # the block layer's row groups are ruled out by their statistics, never decoded
    rows = _rows_decoded(decodes)
    assert 0 < len(rows) < _groups(layered)
    assert set(rows.values()) == {1}


@pytest.mark.parametrize("trace", [EIGHT, "layered"], ids=["sample", "layered"])
def test_the_model_from_the_pass_is_the_model_read_alone(trace, layered) -> None:
    """The pass pushes the rows the model would have read: the same model, to the byte."""
    path = layered if trace == "layered" else trace
    assert analyze(path)["job_model"] == job_model(path)


@pytest.mark.parametrize("layer", [None, "block", "file"])
def test_report_decodes_each_row_group_once(layered, decodes, tmp_path, layer) -> None:
    """The report's layer (block by default) and the file layer with the job model, which
    it shows beside it, come from one pass."""
    out = write_report([layered], tmp_path / "r.html", layer=layer)
    assert _rows_decoded(decodes) == collections.Counter(range(_groups(layered))), decodes
    assert "Per GPU" in out.read_text()  # the file layer's model is shown


def test_report_analyses_are_the_analyses_alone(layered) -> None:
    """The block layer's analysis and the file layer's, from one pass, are what each
    is analyzed alone."""
    block, files = analyze_with_file_layer(layered, with_model=False)
    assert block == analyze(layered, with_model=False)
    assert files == analyze(layered, layer="file")


@pytest.mark.parametrize("layer", [None, "file"])
def test_compare_decodes_each_row_group_of_each_trace_once(layered, decodes, layer) -> None:
    """compare analyzes both traces and scores their write bursts from the job model: the
    model of each comes from its analysis's pass. The same trace twice, so each row group
    is decoded twice in all, once per side."""
    out = compare(layered, layered, layer=layer)
    n = _groups(layered)
    assert max(v for k, v in decodes.items() if k[1] not in PLAN_COLUMNS) == 2, decodes
    assert collections.Counter({i: v for (i, c), v in decodes.items() if c == "issue_ns"}) == {i: 2 for i in range(n)}
    assert out["writes"] is not None and out["writes"]["count"]["a"] == out["writes"]["count"]["b"]
    assert out["throughput_rel_error"] == 0.0


@pytest.mark.parametrize("layer", ["block", "file"])
def test_export_by_gpu_decodes_each_row_group_once(layered, decodes, tmp_path, layer) -> None:
    """export --fio --by gpu reads the layer's requests and the job model's rows (every
    layer) in one pass; the iologs are those of the rows read apart."""
    summary = export_fio(str(layered), tmp_path / "x", layer=layer, by="gpu")
    assert _rows_decoded(decodes) == collections.Counter(range(_groups(layered))), decodes
    assert summary["jobs"] and summary["by"] == "gpu"
    decodes.clear()
    alone = export_fio(str(EIGHT), tmp_path / "y", layer=layer, by="gpu")
    assert summary == alone
    for job in summary["jobs"]:
        assert (tmp_path / "x" / job["iolog"]).read_text() == (tmp_path / "y" / job["iolog"]).read_text()


@pytest.fixture(scope="module")
def layered_set(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A trace set of two hosts: the 1-GPU sample on h1 and the 8-GPU one on h2, 3 s
    apart, each grouped by layer into row groups of 700 rows."""
    job = tmp_path_factory.mktemp("set") / "job"
    for host, src, offset in (("h1", "unet3d-demo-1gpu", 10**12), ("h2", "unet3d-demo-8gpu", 10**12 + 3 * 10**9)):
        seg = EIGHT.parent / src / "seg-000000.parquet"
        table = pq.read_table(seg)
        meta = dict(pq.read_metadata(seg).metadata)
        meta.update({b"trainio.hostname": host.encode(), b"trainio.clock_offset_ns": str(offset).encode()})
        (job / host).mkdir(parents=True)
        order = pc.sort_indices(table["layer"].cast(pa.string()))
        pq.write_table(table.take(order).replace_schema_metadata(meta), job / host / seg.name, row_group_size=700)
    return job


@pytest.fixture
def set_decodes(monkeypatch: pytest.MonkeyPatch) -> Iterator[collections.Counter[tuple[int, int, str]]]:
    """How many times each column of each row group was decoded, by (the segment's rows
    (the members' differ), row group, column)."""
    counts: collections.Counter[tuple[int, int, str]] = collections.Counter()
    real = pq.ParquetFile.read_row_group

    def counting(self: pq.ParquetFile, i: int, columns: list[str] | None = None, **kwargs: object) -> pa.Table:
        for c in columns if columns is not None else self.schema_arrow.names:
            counts[(self.metadata.num_rows, i, c)] += 1
        return real(self, i, columns, **kwargs)

    monkeypatch.setattr(pq.ParquetFile, "read_row_group", counting)
    yield counts


def _set_row_groups(job: Path) -> set[tuple[int, int]]:
    out = set()
    for host in ("h1", "h2"):
        md = pq.ParquetFile(job / host / "seg-000000.parquet").metadata
        out |= {(md.num_rows, i) for i in range(md.num_row_groups)}
    return out


@pytest.mark.parametrize("layer", [None, "file"])
def test_a_trace_set_is_decoded_once_for_the_job_its_hosts_and_its_model(layered_set, set_decodes, layer) -> None:
    """analyze of a set: the job's figures (on one clock), each host's own and each
    member's job-model rows come from one read of each row group."""
    out = analyze(layered_set, layer=layer)
    twice = {k: n for k, n in set_decodes.items() if n > 1 and k[2] not in PLAN_COLUMNS}
    assert not twice, twice
    rows = {(n, i) for (n, i, c) in set_decodes if c == "issue_ns"}
    assert rows == _set_row_groups(layered_set)
    assert [h["events"] > 0 for h in out["per_host"]] == [True, True]
    assert [g["host"] for g in out["job_model"]["gpus"]] == ["h1", "h2"]


def test_a_trace_sets_report_is_decoded_once(layered_set, set_decodes, tmp_path) -> None:
    """report of a set: its layer and the file layer, each with each host's figures, and
    the model, from one read of each row group."""
    write_report([layered_set], tmp_path / "r.html")
    twice = {k: n for k, n in set_decodes.items() if n > 1 and k[2] not in PLAN_COLUMNS}
    assert not twice, twice


def test_a_trace_sets_figures_from_its_pass_are_each_hosts_alone(layered_set) -> None:
    """Each host's figures and the model, from the set's one pass, are what the member's
    own analysis and the model read apart give."""
    out = analyze(layered_set)
    assert out["job_model"] == job_model(layered_set)
    for h, host in zip(out["per_host"], ("h1", "h2"), strict=True):
        alone = analyze(layered_set / host, layer=out["selection"]["layer"], with_model=False)
        assert (h["events"], h["bytes_read"], h["duration_s"]) == (
            alone["events"],
            alone["bytes_read"],
            alone["duration_s"],
        )
        assert h["latency_us"] == alone["latency_us"]
