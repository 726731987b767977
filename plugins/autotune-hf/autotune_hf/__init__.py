"""autotune for Hugging Face: Accelerate (`register`) and the Transformers Trainer
(`autotune_hf.trainer.register`). docs/INTEGRATIONS.md.

Accelerate's ``DistributedDataParallelKwargs(comm_hook=...)`` takes only its own hooks (fp16,
bf16, PowerSGD), so autotune is registered on the model ``accelerator.prepare`` returned.
"""

from __future__ import annotations

import warnings

import torch
from accelerate import Accelerator

from autotune import AutotuneState, Config
from autotune.frameworks import attach, log_values

__all__ = ["log", "register"]


def register(
    accelerator: Accelerator, model: torch.nn.Module, config: Config | None = None
) -> AutotuneState | None:
    """Register autotune on ``model``, as ``accelerator.prepare`` returned it, on every rank.

    Returns the state (close it when training ends: ``state.close()``), or None, with a warning,
    where a single process runs (nothing to all-reduce). ``accelerator.accumulate(model)`` keeps
    working: on the steps it skips synchronising, DDP hands autotune no bucket.
    """
    if accelerator.num_processes < 2:
        warnings.warn("autotune: a single process has no gradient all-reduce to tune", stacklevel=2)
        return None
    return attach(model, config)


def log(accelerator: Accelerator, state: AutotuneState, step: int | None = None) -> None:
    """Send autotune's values (`autotune.frameworks.log_values`) to Accelerate's trackers."""
    accelerator.log(log_values(state), step=step)
