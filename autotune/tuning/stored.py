"""What a job finds stored for its fingerprint: the plan an earlier job locked and the prior a
sweep stored (`read_stored`), and the part of that plan this job can run (`stored_arm`).

The tuner reads both at its first exchange, on rank 0's worker thread, and confirms the stored
plan against the baseline before it locks it (docs/TUNER.md, "Persistence").
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence

from autotune.model import Prior
from autotune.plan import Arm, Choice, Table
from autotune.storage import Store

__all__ = ["read_stored", "stored_arm"]


def read_stored(store: Store, key: str) -> tuple[Table | None, Prior | None]:
    """The plan stored for fingerprint ``key`` and the cost model's prior, if a sweep stored one
    (an unreadable prior is no prior: tuning goes on without one). First fails the trials that
    jobs now gone left running in any of the fingerprint's studies: a job that only runs the
    stored plan may never open those studies itself."""
    store.fail_stale(key)
    table = store.load_table(key)
    raw = store.load_prior(key)
    prior = None
    if raw is not None:
        with contextlib.suppress(ValueError):
            prior = Prior.from_json(raw)
    return table, prior


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
