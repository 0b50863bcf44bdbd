"""A deliberately naive queue-depth reference: O(n^2), written from the definitions.

Conventions (the same as trainio_analysis.analyze.qd_sweep documents): at equal timestamps a
completion counts before an issue, except that a zero-latency request still counts
itself; issues at the same instant are numbered in any order.
"""

from __future__ import annotations


def naive_qd(issue: list[int], complete: list[int], window: tuple[int, int]):
    """Per-issue counts {k: n} and time-weighted durations {k: ns} over ``window``."""
    n = len(issue)
    order = sorted(range(n), key=lambda i: issue[i])
    rank = {i: r for r, i in enumerate(order)}
    per_issue: dict[int, int] = {}
    for i in range(n):
        t = issue[i]
        k = 0
        for j in range(n):
            issued_before = issue[j] < t or (issue[j] == t and rank[j] <= rank[i])
            if not issued_before:
                continue
            if j == i:
                k += 1  # a request counts itself
            elif complete[j] > t:
                k += 1
            elif complete[j] == t and complete[j] == issue[j]:
                k += 1  # zero-latency request at the same instant: completes after issues
        per_issue[k] = per_issue.get(k, 0) + 1
    points = sorted({window[0], window[1], *issue, *complete})
    per_time: dict[int, int] = {}
    for a, b in zip(points, points[1:], strict=False):
        k = sum(1 for j in range(n) if issue[j] <= a < complete[j])
        if b > a:
            per_time[k] = per_time.get(k, 0) + (b - a)
    return per_issue, per_time
