"""A cost model of every algorithm: what its schedule does, counted, priced with alpha-beta-gamma.

`schedule` counts an algorithm's critical path from its real schedule (rounds, the bytes the
busiest rank sends and sums in one), `Params` prices a message and a byte inside a node and
between nodes, and `predict` puts them together (Hockney's alpha-beta, with a per-byte reduction
cost). `bytes_sent` is what each rank sends in all, which the algorithms' own traffic counters
check (tests/algorithms/test_traffic.py). `nccl_params` prices with NCCL's own latency constants
(and `nccl_native` is NCCL's own pick of its ring and tree), `fit` with a machine's own sweeps;
``autotune model`` prints predictions nccl-tests style.
"""

from __future__ import annotations

from autotune.model._cost import DEFAULT_SEGMENT_BYTES, Link, Params, Shape, predict
from autotune.model._fit import Fit, Sample, fit
from autotune.model._nccl import NCCL_SOURCE, PROTOCOLS, nccl_native, nccl_params
from autotune.model._prior import Prior
from autotune.model._schedule import (
    GLOO_MAX_SEGMENT_BYTES,
    MODELLED,
    Schedule,
    bytes_sent,
    schedule,
)

__all__ = [
    "DEFAULT_SEGMENT_BYTES",
    "GLOO_MAX_SEGMENT_BYTES",
    "MODELLED",
    "NCCL_SOURCE",
    "PROTOCOLS",
    "Fit",
    "Link",
    "Params",
    "Prior",
    "Sample",
    "Schedule",
    "Shape",
    "bytes_sent",
    "fit",
    "nccl_native",
    "nccl_params",
    "predict",
    "schedule",
]
