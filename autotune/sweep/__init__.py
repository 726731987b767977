"""`autotune sweep`: nccl-tests-style all-reduce benchmark of every algorithm, and offline tuning.

autotune sweep --world-size 4 -b 8 -e 64M -f 2 --p2p --tune --json sweep.json
"""

from __future__ import annotations

from autotune.sweep._measure import P2P, Bench, Measured, Variant, exact_limit, pattern
from autotune.sweep._options import DTYPES, SweepOptions, dtype_name
from autotune.sweep._prior import samples_from_sweep, store_prior
from autotune.sweep._result import FORMAT_VERSION, Row, SweepResult, bus_factor
from autotune.sweep._run import machine, run_sweep, tune_candidates
from autotune.sweep._tune import Tuned, tune

__all__ = [
    "DTYPES",
    "FORMAT_VERSION",
    "P2P",
    "Bench",
    "Measured",
    "Row",
    "SweepOptions",
    "SweepResult",
    "Tuned",
    "Variant",
    "bus_factor",
    "dtype_name",
    "exact_limit",
    "machine",
    "pattern",
    "run_sweep",
    "samples_from_sweep",
    "store_prior",
    "tune",
    "tune_candidates",
]
