"""``trainio analyze``: one layer of a trace characterized in one streaming pass.

The pass (:mod:`~trainio_analysis.analyze.run`) joins three parts, a module each: the
plan of what is read (:mod:`~trainio_analysis.analyze.plan`), the decoding of one row
group on a worker thread (:mod:`~trainio_analysis.analyze.decode`, with the queue-depth
sweep of :mod:`~trainio_analysis.analyze.qd_sweep` and the latency sketch of
:mod:`~trainio_analysis.analyze.sketch`) and the assembly of the result
(:mod:`~trainio_analysis.analyze.result`); :mod:`~trainio_analysis.analyze.summary`
prints it and :mod:`~trainio_analysis.analyze.objects` adds an object layer's requests.
"""

from __future__ import annotations

from trainio_analysis.analyze.run import DEFAULT_BURST_GAP_MS, analyze, analyze_with_file_layer, load_trace

__all__ = ["DEFAULT_BURST_GAP_MS", "analyze", "analyze_with_file_layer", "load_trace"]
