"""A sweep's measurements as the cost model's samples, and the fit to them stored as the live
tuner's prior (``autotune sweep --tune``; docs/MODEL.md). Here, above the model, so that the
model knows nothing of sweeps."""

from __future__ import annotations

from collections.abc import Sequence

from autotune.model import DEFAULT_SEGMENT_BYTES, MODELLED, Fit, Prior, Sample, fit
from autotune.sweep._result import SweepResult

__all__ = ["samples_from_sweep", "store_prior"]


def samples_from_sweep(result: SweepResult) -> list[Sample]:
    """The modelled algorithms' rows of a sweep's result, on the nodes it ran across (its
    ``node_of``, ranks in node order); `native` only where it ran on gloo."""
    from autotune.comm.topology import Topology

    per_node = None
    if result.node_of and max(result.node_of) > 0:
        per_node = max(Topology(tuple(result.node_of)).ranks_per_node)
    modelled = [a for a in MODELLED if a != "native" or result.backend == "gloo"]
    return [
        Sample(
            r.algorithm,
            r.bytes,
            result.world_size,
            r.time_us * 1e-6,
            r.segment_bytes or DEFAULT_SEGMENT_BYTES,
            per_node,
        )
        for r in result.rows
        if r.algorithm in modelled and r.time_us > 0
    ]


def store_prior(storage: str, results: Sequence[SweepResult], key: str | None = None) -> Fit:
    """Fit the model to ``results`` and store it as the tuner's prior under ``key`` (None: the
    first sweep's own fingerprint), as ``autotune sweep --tune`` does. Returns the fit."""
    from autotune.storage import Store, fingerprint_key

    fitted = fit([s for r in results for s in samples_from_sweep(r)])
    key = key or fingerprint_key(results[0].fingerprint())
    Store(storage).save_prior(key, Prior.from_fit(fitted).to_json())
    return fitted
