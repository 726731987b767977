"""What runs and what is stored: size classes and the choice for each (`runtime`), the tuned
table a job stores and shows (`table`, its parts in `records`), its rows as every table renders
them (`render`) and its NCCL tuner CSV (`nccl_csv`).

Example::

    >>> plan = Plan(Choice("native"))
    >>> plan.set(size_class(3 << 20), Choice("ring", 1 << 20))
    >>> plan.choice(3 << 20)
    Choice(algorithm='ring', segment_bytes=1048576, wire=None)
"""

from autotune.plan.records import STATES, Buckets, Entry, Gain, NearMiss
from autotune.plan.render import PLAN_COLUMNS, aligned, plan_rows, segment_text
from autotune.plan.runtime import (
    BASELINE_CHOICE,
    MIN_FUSION_BYTES,
    MIN_SEGMENT_BYTES,
    Arm,
    Choice,
    Plan,
    Rule,
    check_fusion_bytes,
    check_segment_bytes,
    size_class,
)
from autotune.plan.table import Table, load_table

__all__ = [
    "BASELINE_CHOICE",
    "MIN_FUSION_BYTES",
    "MIN_SEGMENT_BYTES",
    "PLAN_COLUMNS",
    "STATES",
    "Arm",
    "Buckets",
    "Choice",
    "Entry",
    "Gain",
    "NearMiss",
    "Plan",
    "Rule",
    "Table",
    "aligned",
    "check_fusion_bytes",
    "check_segment_bytes",
    "load_table",
    "plan_rows",
    "segment_text",
    "size_class",
]
