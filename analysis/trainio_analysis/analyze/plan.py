"""The analyzer's plan: which row groups and which of their columns the pass reads.

From the footers alone where they suffice (``trainio.events``, the row groups'
statistics), :class:`Plan` chooses the layer, orders the row groups into *units* with the
bounds of their times, derives the time window, the timeline's bins and the watermarks of
the streaming queue-depth sweep (:mod:`trainio_analysis.analyze.qd_sweep`), and numbers the
selection's devices or processes. For each row group it says whether the statistics
already rule it out and which columns must be read.
"""

from __future__ import annotations

import math
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from trainio_analysis import trace as tr
from trainio_analysis.errors import SelectionError, TraceError

LAYER_PREFERENCE = ("block", "nfs", "file")  # lowest layer first: what the storage sees
MAX_TIMELINE_BINS = 10_000_000
# automatic bin: the pass counts in power-of-ten bins (at most this many over the
# window), then sums them into the smallest 1/2/5 x 10^k bin that leaves at most
# AUTO_BINS bins over the active span
AUTO_FINE_BINS = 20_000

#: one row group to read: its segment, index, and the bounds of its times (its least
#: ``issue_ns`` and greatest ``complete_ns``)
Unit = tuple[tr.Segment, int, int, int]


@dataclass(frozen=True)
class Selection:
    """Which rows to analyze; ``layer`` None means the lowest layer present."""

    layer: str | None = None
    dev: str | None = None
    pid: int | None = None


def column_codes(column: pa.ChunkedArray, lookup: dict[str, int], default: int = -1) -> np.ndarray:
    """Map each row's string to lookup[value] (default when absent or null)."""
    parts = []
    for chunk in column.chunks:
        if not pa.types.is_dictionary(chunk.type):
            chunk = chunk.dictionary_encode()
        values = chunk.dictionary.to_pylist()
        lut = np.array([lookup.get(v, default) for v in values] + [default], dtype=np.int64)
        idx = chunk.indices.fill_null(len(values)).to_numpy(zero_copy_only=False)
        parts.append(lut[idx.astype(np.int64)])
    if not parts:
        return np.zeros(0, np.int64)
    return parts[0] if len(parts) == 1 else np.concatenate(parts)


def column_numpy(column: pa.ChunkedArray) -> np.ndarray:
    return column.to_numpy()


def layers_present(trace: tr.Trace) -> dict[str, int]:
    """Rows per layer of the trace: its ``trainio.events`` metadata, else counted from the
    layer column of its row groups."""
    events = trace.meta.get("events")
    if isinstance(events, dict) and events:
        if not all(isinstance(v, int) and v >= 0 for v in events.values()):
            msg = f"{trace.segments[-1].path}: metadata trainio.events is not a count per layer"
            raise TraceError(msg)
        return {str(k): v for k, v in events.items() if v > 0}
    counts: dict[str, int] = {}
    for seg in trace.segments:
        for i in range(len(seg.row_groups)):
            codes, values = tr.dictionary_codes(tr.read_row_group(seg, i, ["layer"])["layer"])
            for code, n in enumerate(np.bincount(codes, minlength=len(values)).tolist()):
                if n and values[code] is not None:
                    counts[values[code]] = counts.get(values[code], 0) + n
    return counts


class Plan:
    """What the pass reads of ``trace`` (opened, or its path) for ``sel``.

    Attributes set here: ``trace`` (opened), ``segments``, ``meta``, ``layers_present``, ``layer``,
    ``group_col`` (``pid`` for the file layer, else ``dev``), ``units`` (the non-empty row
    groups in segment order), ``t0``/``t1``/``window`` (ns), ``watermarks`` (per unit, a
    lower bound of the ``issue_ns`` of every later unit, relative to ``t0``; None after
    the last), ``bin_ns``/``bin_s``/``nbins``/``bin_auto``, ``dev`` (the ``--dev`` filter
    as MAJ:MIN), ``group_names`` and the lookups that number the groups (``dev_lookup``
    and ``null_group``, or ``pid_lookup``). The pass widens automatic bins when it ends
    (``bin_ns``, ``bin_s`` and ``nbins`` change then).
    """

    def __init__(
        self, trace: str | os.PathLike[str] | tr.Trace, sel: Selection, bin_s: float | None, workers: int = 2
    ) -> None:
        trace = tr.Trace.of(trace)
        self.trace = trace
        self.path = Path(trace.path)
        self.segments = list(trace.segments)
        self.meta = trace.meta
        self.bin_auto = bin_s is None
        if bin_s is not None:
            # 1 ns to 1e6 s: a whole number of ns whose multiples stay inside int64
            self.bin_ns = int(round(bin_s * 1e9)) if math.isfinite(bin_s) and bin_s <= 1e6 else 0
            if self.bin_ns <= 0:
                msg = f"--bin-s {bin_s}: must be from 1e-09 s (1 ns) to 1e+06 s"
                raise SelectionError(msg)
            self.bin_s = bin_s
        self.workers = max(1, workers)
        self.layers_present = layers_present(trace)
        self.layer = self._choose_layer(sel.layer)
        self.sel = sel
        self.group_col = "pid" if self.layer == "file" else "dev"
        self._plan()
        self._find_groups()

    # ------------------------------------------------------------------ layer

    def _choose_layer(self, layer: str | None) -> str:
        if layer is not None:
            if layer not in tr.STORAGE_LAYERS:
                msg = f"unknown layer {layer!r} (one of {', '.join(tr.STORAGE_LAYERS)})"
                raise SelectionError(msg)
            if layer not in self.layers_present:
                msg = f"{self.path}: no {layer} events (layers present: {self._present()})"
                raise SelectionError(msg)
            return layer
        for candidate in LAYER_PREFERENCE:
            if candidate in self.layers_present:
                return candidate
        msg = f"{self.path}: empty trace (no events in any layer)"
        raise TraceError(msg)

    def _present(self) -> str:
        return ", ".join(f"{k} {v}" for k, v in sorted(self.layers_present.items())) or "none"

    # ------------------------------------------------------------------ units and window

    def _plan(self) -> None:
        """Row-group order, watermarks and the time window, from footers when possible."""
        units = []
        for seg in self.segments:
            for i in range(len(seg.row_groups)):
                if seg.row_groups[i] == 0:
                    continue
                lo = tr.row_group_min(seg, i, "issue_ns")
                hi = tr.row_group_max(seg, i, "complete_ns")
                if lo is None or hi is None:
                    t = tr.read_row_group(seg, i, ["issue_ns", "complete_ns"])
                    lo, hi = int(column_numpy(t["issue_ns"]).min()), int(column_numpy(t["complete_ns"]).max())
                units.append((seg, i, lo, hi))
        self.units: list[Unit] = units
        mins = [u[2] for u in units]
        suffix = [0] * len(units)
        running: int | None = None
        for k in range(len(units) - 1, -1, -1):
            suffix[k] = running  # type: ignore[call-overload]
            running = mins[k] if running is None else min(running, mins[k])
        first_issue = min(mins)
        last_complete = max(u[3] for u in units)
        start = self.meta.get("start_ns")
        end = self.meta.get("end_ns")
        self.t0 = min(first_issue, start) if isinstance(start, int) and start > 0 else first_issue
        self.t1 = max(last_complete, end) if isinstance(end, int) else last_complete
        self.watermarks = [None if w is None else w - self.t0 for w in suffix]
        self.window = self.t1 - self.t0
        if self.bin_auto:
            # fine power-of-ten bins (>= 1 us), summed into the final bin after the pass
            self.bin_ns = 1000
            while self.window // self.bin_ns + 1 > AUTO_FINE_BINS:
                self.bin_ns *= 10
            self.bin_s = self.bin_ns / 1e9
        nbins = self.window // self.bin_ns + 1
        if nbins > MAX_TIMELINE_BINS:
            msg = (
                f"{self.path}: --bin-s {self.bin_s} gives {nbins} bins over "
                f"{self.window / 1e9:.0f} s (from the row groups' statistics): raise it"
            )
            raise SelectionError(msg)
        self.nbins = int(nbins)

    # ------------------------------------------------------------------ groups

    def _groups_from_stats(self) -> list[Any] | None:
        """The selection's groups when row-group statistics prove them (else None)."""
        if self.sel.pid is not None and self.group_col == "dev":
            return None
        dev = self._dev_filter_value()
        found = set()
        for seg, i, _, _ in self.units:
            layer = tr.row_group_constant(seg, i, "layer")
            if layer is None:
                return None
            if layer != self.layer:
                continue
            if dev is not None and self.group_col != "dev":
                return None
            value = tr.row_group_constant(seg, i, self.group_col)
            if value is None:
                return None
            if (dev is not None and value != dev) or (self.sel.pid is not None and value != self.sel.pid):
                continue
            found.add(value)
        return sorted(found)

    def _find_groups(self) -> None:
        """The selection's devices or processes, so group ids are stable from the start."""
        keys = self._groups_from_stats()
        if keys is None:
            keys = self._groups_from_rows()
        if not keys:
            what = [f"--layer {self.layer}"]
            if self.sel.dev is not None:
                what.append(f"--dev {self.sel.dev}")
            if self.sel.pid is not None:
                what.append(f"--pid {self.sel.pid}")
            msg = f"{self.path}: no events match {' '.join(what)}"
            raise SelectionError(msg)
        self.dev = self._dev_filter_value()
        self.group_names = ["?" if k is None else str(k) for k in keys]
        if self.group_col == "dev":
            self.dev_lookup = {k: i for i, k in enumerate(keys) if k is not None}
            self.null_group = keys.index(None) if None in keys else -1
        else:
            self.pid_lookup = np.array(keys, dtype=np.int64)

    def _groups_from_rows(self) -> list[Any]:
        """The selection's groups (sorted, None for a null device) from the rows: the
        layer and group columns of every row group, read through the trace package (which checks
        them) on the worker threads."""
        dev = self._dev_filter_value()
        cols = ["layer", self.group_col]
        if dev is not None and self.group_col != "dev":
            cols.append("dev")
        if self.sel.pid is not None and self.group_col != "pid":
            cols.append("pid")

        def groups_of(unit: Unit) -> set[Any]:
            seg, index, _, _ = unit
            t = tr.read_row_group(seg, index, cols)
            mask = column_codes(t["layer"], {self.layer: 1}, 0) == 1
            if dev is not None:
                mask &= column_codes(t["dev"], {dev: 1}, 0) == 1
            if self.sel.pid is not None:
                mask &= column_numpy(t["pid"]) == self.sel.pid
            if not mask.any():
                return set()
            if self.group_col == "pid":
                return set(np.unique(column_numpy(t["pid"])[mask]).tolist())
            codes, values = tr.dictionary_codes(t["dev"])
            return {values[i] for i in np.flatnonzero(np.bincount(codes[mask]))}

        found: set[Any] = set()
        with ThreadPoolExecutor(max_workers=self.workers) as pool:
            for part in pool.map(groups_of, self.units):
                found |= part
        return sorted(found, key=lambda k: (k is not None, k))  # a null device first

    def _dev_filter_value(self) -> str | None:
        dev = self.sel.dev
        if dev is None or ":" in dev:
            return dev
        name = dev.removeprefix("/dev/")
        for d in self.meta.get("devices") or []:
            if isinstance(d, dict) and d.get("name") == name and d.get("dev"):
                return str(d["dev"])
        msg = f"{self.path}: no device {dev!r} in trainio.devices (give MAJ:MIN)"
        raise SelectionError(msg)

    # ------------------------------------------------------------------ per row group

    def constants(self, seg: tr.Segment, index: int) -> dict[str, str]:
        """String columns holding one value in this row group (from its statistics)."""
        out = {}
        for col in ("layer", "op", "dev"):
            value = tr.row_group_constant(seg, index, col)
            if value is not None:
                out[col] = value
        return out

    def rules_out(self, const: dict[str, str]) -> bool:
        """Whether a row group with these constants has no selected row."""
        return const.get("layer", self.layer) != self.layer or (
            self.dev is not None and const.get("dev", self.dev) != self.dev
        )

    def columns(self, const: dict[str, str]) -> list[str]:
        """The columns to read of a row group with these constants: what the counting and
        the sweep need, what selects the rows unless a constant settles it, and what
        numbers the groups."""
        cols = ["issue_ns", "complete_ns", "bytes", "queue_depth"]
        cols += [k for k in ("layer", "op") if k not in const]
        if (self.group_col == "dev" or self.dev is not None) and "dev" not in const:
            cols.append("dev")
        if self.group_col == "pid" or self.sel.pid is not None:
            cols.append("pid")
        if self.layer == "file":
            cols.append("file")
        return cols
