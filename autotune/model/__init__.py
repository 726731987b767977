"""A cost model of every algorithm: what its schedule does, counted, priced with alpha-beta-gamma.

`schedule` counts an algorithm's critical path from its real schedule (rounds, the bytes the
busiest rank sends and sums in one), `Params` prices a message and a byte inside a node and
between nodes, and `predict` puts them together (Hockney's alpha-beta, with a per-byte reduction
cost). `bytes_sent` is what each rank sends in all, which the algorithms' own traffic counters
check (tests/test_traffic.py).
"""

from __future__ import annotations

from autotune.model._cost import Link, Params, Shape, predict
from autotune.model._schedule import MODELLED, Schedule, bytes_sent, schedule

__all__ = [
    "MODELLED",
    "Link",
    "Params",
    "Schedule",
    "Shape",
    "bytes_sent",
    "predict",
    "schedule",
]
