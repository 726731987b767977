"""autotune: swappable, live-tuned all-reduce for PyTorch DDP, with Prometheus metrics.

ddp_model.register_comm_hook(autotune.AutotuneState(), autotune.hook)

The names below load on first use (PEP 562), so that what needs no torch (``autotune
--version``, ``--help``, ``autotune daemon``) does not import it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from autotune.util.lazy import lazy

if TYPE_CHECKING:
    from autotune import algorithms
    from autotune.comm_hook import AutotuneState, default_state, hook, register
    from autotune.config import Config
    from autotune.ddp.stats import MessageRecord, Summary
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

#: Where each public name lives (None: the name is the module itself).
_HOME: dict[str, tuple[str, str | None]] = {
    "AutotuneState": ("autotune.comm_hook", "AutotuneState"),
    "default_state": ("autotune.comm_hook", "default_state"),
    "hook": ("autotune.comm_hook", "hook"),
    "register": ("autotune.comm_hook", "register"),
    "Config": ("autotune.config", "Config"),
    "MessageRecord": ("autotune.ddp.stats", "MessageRecord"),
    "Summary": ("autotune.ddp.stats", "Summary"),
    "Choice": ("autotune.plan", "Choice"),
    "size_class": ("autotune.plan", "size_class"),
    "algorithms": ("autotune.algorithms", None),
}


__getattr__, __dir__ = lazy(__name__, _HOME, globals())
