"""What a job finds stored for its fingerprint and workload (`read_stored`): the plan an earlier
run of the same workload locked, the classes a sweep screened (the seed) and the prior a sweep
fitted; and the part of a stored plan this job can run (`stored_arm`).

The tuner reads them at its first exchange, on rank 0's worker thread. It confirms its own
workload's plan against the baseline before it locks it; a seed's classes stand in for their
screening, and their choices meet the baseline in the job's own search (docs/TUNER.md,
"Persistence").
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from autotune.model import Prior
from autotune.plan import Arm, Choice, Table
from autotune.storage import Store

__all__ = ["Stored", "read_stored", "stored_arm"]


@dataclass(frozen=True)
class Stored:
    """What the storage holds for a job: ``table``, its workload's plan; ``seed``, the classes a
    sweep screened (and plans older than workloads); ``prior``, the cost model's fit."""

    table: Table | None
    seed: Table | None
    prior: Prior | None


def read_stored(store: Store, key: str, workload: str) -> Stored:
    """What is stored for fingerprint ``key`` and ``workload`` (an unreadable prior is no prior:
    tuning goes on without one). First fails the trials that jobs now gone left running in any
    of the fingerprint's studies: a job that only runs the stored plan may never open those
    studies itself."""
    store.fail_stale(key)
    table = store.load_table(key, workload)
    seed = store.load_seed(key) if table is None else None
    raw = store.load_prior(key)
    prior = None
    if raw is not None:
        with contextlib.suppress(ValueError):
            prior = Prior.from_json(raw)
    return Stored(table, seed, prior)


def stored_arm(
    table: Table,
    baseline: Arm,
    runnable: Callable[[int, Choice], bool],
    fusion_options: Sequence[int] | None,
) -> Arm | None:
    """The plan ``table`` holds, as far as this job can run it: its locked classes whose choice
    ``runnable`` accepts, and its fusion size where this job tunes one among ``fusion_options``
    (None: it does not). None where that is the baseline with a measured gain: nothing to
    confirm."""
    choices = {
        cls: e.choice
        for cls, e in table.classes.items()
        if e.state == "locked" and runnable(cls, e.choice)
    }
    fusion = baseline.fusion_bytes
    if fusion_options is not None and table.fusion_bytes in fusion_options:
        fusion = table.fusion_bytes or 0
    if choices or fusion != baseline.fusion_bytes or table.gain is None:
        return Arm.of(choices, fusion)
    return None
