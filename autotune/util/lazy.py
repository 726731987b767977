"""A package's public names, loaded on first use (PEP 562): importing the package costs nothing
until a name is read, so a command that needs no torch (``autotune --help``) imports none."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["lazy"]


def lazy(
    package: str, homes: Mapping[str, tuple[str, str | None]], namespace: dict[str, Any]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The ``__getattr__`` and ``__dir__`` of ``package``: ``homes`` maps each public name to
    (module, attribute), attribute None for the module itself; a loaded name is kept in
    ``namespace`` (the package's globals), so it loads once."""

    def __getattr__(name: str) -> Any:
        home = homes.get(name)
        if home is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module = importlib.import_module(home[0])
        value = module if home[1] is None else getattr(module, home[1])
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted({*namespace, *homes})

    return __getattr__, __dir__
