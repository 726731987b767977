"""autotune: swappable, live-tuned all-reduce for PyTorch DDP, with Prometheus metrics.

ddp_model.register_comm_hook(autotune.AutotuneState(), autotune.hook)
"""

from __future__ import annotations

from autotune import algorithms
from autotune.config import Config
from autotune.ddp.stats import MessageRecord, Summary
from autotune.hook import AutotuneState, default_state, hook, register
from autotune.plan import Choice, size_class

__all__ = [
    "AutotuneState",
    "Choice",
    "Config",
    "MessageRecord",
    "Summary",
    "__version__",
    "algorithms",
    "default_state",
    "hook",
    "register",
    "size_class",
]
__version__ = "0.1.0"
