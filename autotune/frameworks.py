"""What every framework integration shares, with no framework imported: the DDP model found inside
a framework's wrappers, autotune registered on it, and what a framework's logger records.

The integrations themselves (Lightning, Hugging Face Accelerate and Trainer) live under
``plugins/``, each a few lines over these: docs/INTEGRATIONS.md.
"""

from __future__ import annotations

import math

import torch
from torch.nn.parallel import DistributedDataParallel

from autotune.comm_hook import (
    AutotuneState,
    default_state,
    hook,
    is_default_state,
    register,
    reset_default_state,
)
from autotune.config import Config
from autotune.plan import segment_text
from autotune.tuning.status import status
from autotune.util.units import format_bytes

__all__ = ["attach", "detach", "find_ddp", "log_values", "plan_text", "summary_lines"]

# How deep a framework nests its wrappers (torch.compile's around DDP around the user's module).
_MAX_DEPTH = 8


def find_ddp(model: object) -> DistributedDataParallel:
    """The `DistributedDataParallel` that is ``model`` or that ``model`` wraps (torch.compile's
    ``_orig_mod``, a framework's ``module``); TypeError, naming what it found, if there is none."""
    seen = []
    current: object = model
    for _ in range(_MAX_DEPTH):
        if isinstance(current, DistributedDataParallel):
            return current
        seen.append(type(current).__name__)
        inner = getattr(current, "_orig_mod", None)
        if not isinstance(inner, torch.nn.Module):
            inner = getattr(current, "module", None)
        if not isinstance(inner, torch.nn.Module):
            break
        current = inner
    raise TypeError(
        "autotune tunes the gradient all-reduce of DistributedDataParallel, and found none in "
        f"{' > '.join(seen)}: the job is not distributed, or another strategy (FSDP, DeepSpeed) "
        "reduces its gradients"
    )


def attach(model: object, config: Config | None = None) -> AutotuneState:
    """Register autotune on the DDP model inside ``model`` (see `find_ddp`), on every rank.

    Where a framework registered `autotune.hook` itself with no state (Lightning on CUDA with
    ``ddp_comm_hook=autotune.hook``), this builds the default state it will use instead, here
    rather than in the first backward; ``config`` must then be None (it comes from the
    ``AUTOTUNE_*`` variables).
    """
    ddp = find_ddp(model)
    hooks = getattr(ddp, "_comm_hooks", [])
    if len(hooks) == 1 and hooks[0] == (hook, None):
        if config is not None:
            raise ValueError(
                "the framework registered autotune.hook with no state, which takes its "
                "configuration from AUTOTUNE_* variables: pass no config, or remove the "
                "framework's ddp_comm_hook and let the integration register it"
            )
        return default_state()
    return register(ddp, config)


def detach(state: AutotuneState) -> None:
    """Close what `attach` built: its own state, or the default state it built."""
    if is_default_state(state):
        reset_default_state()
    else:
        state.close()


def log_values(state: AutotuneState) -> dict[str, float]:
    """Numbers for a framework's logger, under ``autotune/``: iterations and fusion size; with the
    tuner, whether the plan is locked and, once measured, the plan's step time over plain DDP's
    (below 1 is faster) with its 95% interval and the pairs of iterations behind it."""
    values = {
        "autotune/iterations": float(state.engine.iteration),
        "autotune/fusion_bytes": float(state.engine.fusion_bytes),
    }
    if state.tuner is None:
        return values
    now = status(state.tuner, state.unhooking)
    values["autotune/locked"] = float(now.plan_locked)
    values["autotune/final"] = float(now.final)  # 0: the step ratio is provisional
    gain = now.gain
    if gain is not None and math.isfinite(gain.ratio):
        values["autotune/step_ratio"] = gain.ratio
        values["autotune/step_ratio_low"] = gain.low
        if math.isfinite(gain.high):
            values["autotune/step_ratio_high"] = gain.high
        values["autotune/paired_iterations"] = float(gain.pairs)
    return values


def summary_lines(state: AutotuneState) -> list[str]:
    """What an integration prints once training ends, on its first rank: the plain verdict first
    (`autotune.tuning.status.Status.headline`), then the plan, then, with the tuner, the measured
    comparison with plain DDP in full."""
    now = state.status()
    lines = [f"autotune: {now.headline}", f"autotune plan: {plan_text(state)}"]
    if state.tuner is not None:
        lines.append(now.verdict)
    return lines


def plan_text(state: AutotuneState) -> str:
    """The plan in one line: each size class's algorithm (and segment), and the fusion size."""
    parts = []
    for cls, choice in sorted(state.plan().items()):
        segment = segment_text(choice)
        parts.append(
            f"{format_bytes(cls)}: {choice.label}"
            + ("" if segment in ("-", "default") else f" ({segment})")
        )
    fusion = state.engine.fusion_bytes
    parts.append("fusion: " + (format_bytes(fusion) if fusion else "DDP's buckets"))
    return "; ".join(parts)
