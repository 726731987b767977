"""The algorithm registry: a plain dict of classes, filled by code and by installed plugins."""

from __future__ import annotations

import re
import threading
import warnings
from collections.abc import Mapping
from importlib.metadata import entry_points
from typing import TYPE_CHECKING, Any

from autotune.algorithms._base import AllReduceAlgorithm
from autotune.util.names import unknown

if TYPE_CHECKING:
    from autotune.algorithms._choice import Choice

__all__ = [
    "ALGORITHMS",
    "ENTRY_POINT_GROUP",
    "PLUGIN_SOURCES",
    "available",
    "carried",
    "carry",
    "get_algorithm",
    "get_algorithm_class",
    "load_plugins",
    "register",
]

#: Entry-point group third-party algorithms register under, ``name = "module:Class"``.
ENTRY_POINT_GROUP = "autotune.algorithms"

#: Every known algorithm, name -> class. Plugins join on the first `get_algorithm`/`available`.
ALGORITHMS: dict[str, type[AllReduceAlgorithm]] = {}

#: Algorithms that came from entry points: name -> "distribution version".
PLUGIN_SOURCES: dict[str, str] = {}

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
_lock = threading.RLock()
_loaded = [False]
_failed: dict[str, Exception] = {}


def register(name: str, cls: type[AllReduceAlgorithm], *, replace: bool = False) -> None:
    """Make ``cls`` available as ``name``; pass ``replace=True`` to rebind an existing name."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ValueError(f"algorithm name must be letters, digits, '_', '.' or '-', got {name!r}")
    if not (isinstance(cls, type) and issubclass(cls, AllReduceAlgorithm)):
        raise TypeError(f"{cls!r} is not a subclass of autotune.algorithms.AllReduceAlgorithm")
    with _lock:
        existing = ALGORITHMS.get(name)
        if existing is not None and existing is not cls and not replace:
            raise ValueError(
                f"algorithm {name!r} is already registered as {existing.__module__}."
                f"{existing.__qualname__}; pass replace=True to rebind it"
            )
        ALGORITHMS[name] = cls
        _failed.pop(name, None)


def load_plugins() -> None:
    """Register the algorithms of installed distributions (entry points ``autotune.algorithms``).

    Runs once per process. A plugin that fails to import is reported with a warning and its error
    is raised again when someone asks for it by name; it never stops the others from loading.
    """
    with _lock:
        if _loaded[0]:
            return
        _loaded[0] = True
        for ep in entry_points(group=ENTRY_POINT_GROUP):
            source = f"{ep.dist.name} {ep.dist.version}" if ep.dist else ep.value
            if ep.name in ALGORITHMS:
                warnings.warn(
                    f"plugin {source} registers algorithm {ep.name!r}, which already exists; "
                    "keeping the existing one",
                    RuntimeWarning,
                    stacklevel=2,
                )
                continue
            try:
                register(ep.name, ep.load())
            except Exception as exc:  # a broken plugin must not take the others down
                _failed[ep.name] = exc
                warnings.warn(
                    f"could not load algorithm {ep.name!r} from {source}: {exc!r}",
                    RuntimeWarning,
                    stacklevel=2,
                )
            else:
                PLUGIN_SOURCES[ep.name] = source


def available() -> list[str]:
    """Names of every registered algorithm, plugins included, sorted."""
    load_plugins()
    return sorted(ALGORITHMS)


def get_algorithm(name: str, **options: Any) -> AllReduceAlgorithm:
    """Instantiate the algorithm registered as ``name`` with ``options`` (e.g. ``timeout_s``)."""
    return get_algorithm_class(name)(**options)


def get_algorithm_class(name: str) -> type[AllReduceAlgorithm]:
    """The class registered as ``name``; a clear error for an unknown or broken one."""
    load_plugins()
    cls = ALGORITHMS.get(name)
    if cls is None:
        if name in _failed:
            raise RuntimeError(f"algorithm {name!r} is installed but failed to load") from _failed[
                name
            ]
        known = sorted(ALGORITHMS)
        raise ValueError(f"{unknown('algorithm', [name], known)}; registered: {', '.join(known)}")
    return cls


def carried(choice: Choice | str) -> bool:
    """Whether the backend runs ``choice`` (or an algorithm by name) without the hook once
    autotune hands it the plan (`AllReduceAlgorithm.carrier`): the baseline does anyway, an
    autotune-nccl cell through NCCL's tuner plugin's table; a Python-driven schedule, or any
    choice on a compressed wire (the hook casts), needs the hook."""
    load_plugins()
    if not isinstance(choice, str) and choice.wire is not None:
        return False
    name = choice if isinstance(choice, str) else choice.algorithm
    cls = ALGORITHMS.get(name)
    return name == "native" or (cls is not None and cls.carrier is not None)


def carry(classes: Mapping[int, Choice], ranks: int) -> list[str]:
    """Hand each carrier its classes of ``classes`` (the baseline's need no one), on every rank
    as autotune unhooks; what each now runs. A class no carrier takes is a ValueError: the plan
    needs the hook."""
    load_plugins()
    by_carrier: dict[str, dict[int, Choice]] = {}
    first: dict[str, type[AllReduceAlgorithm]] = {}
    for cls_bytes, choice in sorted(classes.items()):
        if choice.algorithm == "native" and choice.wire is None:
            continue
        algo = ALGORITHMS.get(choice.algorithm)
        if not carried(choice) or algo is None or algo.carrier is None:
            raise ValueError(f"{choice} runs only through the hook: it has no carrier")
        by_carrier.setdefault(algo.carrier, {})[cls_bytes] = choice
        first.setdefault(algo.carrier, algo)
    return [first[c].carry(taken, ranks) for c, taken in by_carrier.items()]
