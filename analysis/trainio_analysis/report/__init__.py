"""One self-contained HTML report of one or more traces (plotly.js inlined, works offline).

Several traces are drawn side by side in every plot (e.g. the same training job with 1
and with 8 GPUs), so a storage engineer sees how the queue-depth distribution moves.
The file is written to a temporary name in the same directory and renamed, so a reader
never sees half a report.

Its parts: ``figures`` (the plots; ``gpus``, the per-GPU one), ``summary`` (the tables)
and ``page`` (the HTML page and its file). Import the names from the package.
"""

from __future__ import annotations

from trainio_analysis.report.figures import (
    MAX_PLOT_POINTS,
    OBJECT_PLOT_IDS,
    PLOT_IDS,
    SWEEP_ID,
    decimate,
)
from trainio_analysis.report.page import (
    read_sweep,
    render,
    replay_results,
    write_report,
)

__all__ = [
    "PLOT_IDS",
    "SWEEP_ID",
    "OBJECT_PLOT_IDS",
    "MAX_PLOT_POINTS",
    "decimate",
    "render",
    "read_sweep",
    "replay_results",
    "write_report",
]
