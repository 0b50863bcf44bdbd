"""The job model (crate ``trainio-model``) as typed Python values.

The model crosses from Rust as the JSON of ``analyze --json``'s ``job_model``
(docs/analysis.md, *Job model*). :func:`parse_job_model` turns that object into the
dataclasses below, checking each field's presence and type on the way, so a consumer
reads ``model.gpus[0].compute_s`` rather than a ``dict[str, Any]``, and a model of the
wrong shape fails once, with a message naming the field, not later with a ``KeyError``.
Fields the dataclasses do not name are ignored unless ``strict``; the tests parse the
model's golden copies (model/tests/golden) strictly, so the two sides cannot drift.

Example
-------
>>> m = parse_job_model(json.loads(text), source="traces/unet3d-demo-1gpu")  # doctest: +SKIP
>>> [g.rank_pid for g in m.gpus]  # doctest: +SKIP
[25386]
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass
from typing import Any, TypeVar

from trainio_analysis.errors import TrainioError


class ModelError(TrainioError):
    """A job model object lacks a field or holds one of the wrong type."""


@dataclass(frozen=True)
class Member:
    """One process of a GPU: its rank (``role`` ``rank``) or a DataLoader worker."""

    pid: int
    comm: str
    role: str
    why: str
    bytes: int


@dataclass(frozen=True)
class Step:
    bytes: int
    samples: int
    first_read_ns: int
    ready_ns: int
    interval_s: float | None
    wait_s: float
    period_s: float | None
    worker_cpu_s: float | None
    # False: read ahead by the workers and never taken by the GPU (no compute)
    taken: bool


@dataclass(frozen=True)
class WriteBurst:
    start_ns: int
    end_ns: int
    duration_s: float
    bytes: int
    writes: int
    syncs: int
    files: int
    mib_s: float
    after_step: int | None
    pids: list[int]


@dataclass(frozen=True)
class WriteSummary:
    gap_ms: float
    count: int
    bytes: int
    syncs: int
    duration_s: float
    mean_duration_s: float | None
    mean_bytes: float | None
    mib_s: float | None
    interval_s: float | None
    bursts: list[WriteBurst]


@dataclass(frozen=True)
class Gpu:
    """One simulated GPU: a rank and its workers, their steps and what one GPU needs."""

    index: int
    rank_pid: int
    comm: str
    members: list[Member]
    workers: int
    readers: int
    synchronous: bool
    paced: bool
    prefetch_batches: int
    step_signal: str
    steps: list[Step]
    steps_taken: int
    untaken_bytes: int
    files: list[tuple[str, int]]
    bytes: int
    samples: int
    compute_s: float | None
    interval_p50_s: float | None
    interval_p90_s: float | None
    wait_s: float
    handoff_s: float
    compute_signal: str
    sync_s: float
    bytes_per_step: float
    samples_per_step: float
    required_mib_s: float | None
    au_recorded: float | None
    mib_s_recorded: float | None
    worker_cpu_s_per_sample: float | None
    worker_cpu_share: float | None
    unfinished_bytes: int
    write_bursts: list[WriteBurst]
    # only in the model of a trace set
    host: str | None = None


@dataclass(frozen=True)
class LeftOut:
    pid: int
    comm: str
    bytes: int
    why: str
    host: str | None = None


@dataclass(frozen=True)
class Coverage:
    pid: int
    comm: str
    block_read_bytes: int
    file_read_bytes: int
    in_gpu: bool
    block_read_bytes_training: int
    file_read_bytes_training: int
    host: str | None = None


@dataclass(frozen=True)
class ObjectSource:
    """The object store the GPUs' data comes from: its GETs are the reads."""

    endpoint: str
    bucket: str
    requests: int
    bytes: int


@dataclass(frozen=True)
class JobModel:
    data_dev: str | None
    grouping: str
    gpus: list[Gpu]
    left_out: list[LeftOut]
    compute_s: float | None
    bytes_per_step: float | None
    required_mib_s_per_gpu: float | None
    steps: int
    coverage: list[Coverage]
    incomplete: str | None
    warnings: list[str]
    writes: WriteSummary
    # the hosts of a trace set's model, in member order
    hosts: list[str] = dataclasses.field(default_factory=list)
    # the object store the data comes from (absent: files)
    object_store: ObjectSource | None = None


T = TypeVar("T")


def parse_job_model(obj: Any, *, source: str, strict: bool = False) -> JobModel:
    """The typed job model of ``obj`` (the parsed JSON of a ``job_model``).

    ``source`` names where the object came from (a trace path) in the error message;
    ``strict`` also refuses fields the dataclasses do not name.

    Raises
    ------
    ModelError
        ``"SOURCE: job_model.gpus[0].compute_s: ..."``: a field is missing or of the wrong type.
    """
    return _parse(JobModel, obj, f"{source}: job_model", strict=strict)


def _parse(tp: Any, value: Any, where: str, *, strict: bool) -> Any:
    origin = typing.get_origin(tp)
    if dataclasses.is_dataclass(tp):
        return _parse_record(tp, value, where, strict=strict)
    if origin is types.UnionType:  # X | None
        (inner,) = [a for a in typing.get_args(tp) if a is not type(None)]
        return None if value is None else _parse(inner, value, where, strict=strict)
    if origin is list:
        (item,) = typing.get_args(tp)
        _expect(isinstance(value, list), value, "a list", where)
        return [_parse(item, v, f"{where}[{i}]", strict=strict) for i, v in enumerate(value)]
    if origin is tuple:
        args = typing.get_args(tp)
        _expect(isinstance(value, list) and len(value) == len(args), value, f"a list of {len(args)}", where)
        return tuple(_parse(a, v, f"{where}[{i}]", strict=strict) for i, (a, v) in enumerate(zip(args, value)))
    if tp is float:
        _expect(isinstance(value, int | float) and not isinstance(value, bool), value, "a number", where)
        return float(value)
    if tp is int:
        _expect(isinstance(value, int) and not isinstance(value, bool), value, "an integer", where)
        return value
    if tp is bool:
        _expect(isinstance(value, bool), value, "true or false", where)
        return value
    if tp is str:
        _expect(isinstance(value, str), value, "a string", where)
        return value
    msg = f"{where}: no parser for {tp!r}"  # a field type this module does not handle: a bug
    raise TypeError(msg)


def _parse_record(cls: type[T], value: Any, where: str, *, strict: bool) -> T:
    _expect(isinstance(value, dict), value, "an object", where)
    hints = typing.get_type_hints(cls)
    fields = dataclasses.fields(cls)  # type: ignore[arg-type]
    if strict:
        unknown = sorted(set(value) - {f.name for f in fields})
        if unknown:
            msg = f"{where}: unknown field(s) {', '.join(unknown)}"
            raise ModelError(msg)
    kwargs = {}
    for f in fields:
        if f.name not in value:
            if f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING:
                continue
            msg = f"{where}: missing field `{f.name}`"
            raise ModelError(msg)
        kwargs[f.name] = _parse(hints[f.name], value[f.name], f"{where}.{f.name}", strict=strict)
    return cls(**kwargs)


def _expect(ok: bool, value: Any, what: str, where: str) -> None:
    if not ok:
        msg = f"{where}: expected {what}, got {type(value).__name__} {value!r:.40}"
        raise ModelError(msg)
