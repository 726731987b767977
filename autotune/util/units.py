"""Byte sizes as people write them ("64K", "4MiB", "1G") and as tables print them."""

from __future__ import annotations

import argparse
import math

__all__ = ["byte_count", "count", "format_bytes", "parse_bytes"]

_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_bytes(text: str) -> int:
    """Read a byte count: plain digits, or a K/M/G (binary) suffix, optionally "B"/"iB" after it."""
    clean = text.strip().upper().removesuffix("B").removesuffix("I")
    unit = clean[-1] if clean and clean[-1] in _UNITS else ""
    number = clean[: len(clean) - len(unit)]
    try:
        value = float(number)
    except ValueError:
        raise ValueError(f"not a byte count: {text!r} (write e.g. 4096, 64K, 4M, 1G)") from None
    if not math.isfinite(value):
        raise ValueError(f"not a byte count: {text!r} (write e.g. 4096, 64K, 4M, 1G)")
    if value < 0 or value * _UNITS[unit] != int(value * _UNITS[unit]):
        raise ValueError(f"not a whole, non-negative byte count: {text!r}")
    return int(value * _UNITS[unit])


def byte_count(text: str) -> int:
    """`parse_bytes` as an argparse ``type``: a bad count is a usage error naming the problem."""
    try:
        return parse_bytes(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def format_bytes(nbytes: int) -> str:
    """The shortest exact binary form: 65536 -> "64 KiB", 1000 -> "1000 B"."""
    for unit in ("G", "M", "K"):
        if nbytes >= _UNITS[unit] and nbytes % _UNITS[unit] == 0:
            return f"{nbytes // _UNITS[unit]} {unit}iB"
    return f"{nbytes} B"


def count(n: int, noun: str, plural: str | None = None) -> str:
    """``1 pair``, ``2 pairs``, ``0 pairs``: a count with its noun in the right number
    (``plural``: where it is not the noun with an s)."""
    return f"{n} {noun if n == 1 else plural or noun + 's'}"
