"""Reading the JSON files autotune writes (plans, sweep results, dashboards), with errors that name
the file and what is wrong with it."""

from __future__ import annotations

import json
from collections.abc import Callable
from os import PathLike
from typing import Any, TypeVar

__all__ = ["read_json"]

T = TypeVar("T")


def read_json(path: str | PathLike[str], parse: Callable[[Any], T], what: str = "") -> T:
    """``parse`` applied to the JSON in ``path``. Any failure, reading, decoding or parsing, is a
    ValueError naming the file (``what`` says which kind of file, e.g. "plan file")."""
    name = f"{what} {str(path)!r}" if what else repr(str(path))
    try:
        with open(path) as f:
            data = json.load(f)
    except OSError as exc:
        raise ValueError(f"cannot read {name}: {exc.strerror}") from exc
    except json.JSONDecodeError as exc:
        raise ValueError(f"{name} is not JSON: {exc}") from exc
    except UnicodeDecodeError as exc:  # a binary file: JSON is UTF-8 text
        why = f"not UTF-8 text ({exc.reason} at byte {exc.start})"
        raise ValueError(f"{name} is not JSON: {why}") from exc
    try:
        return parse(data)
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"{name}: {exc}") from exc
