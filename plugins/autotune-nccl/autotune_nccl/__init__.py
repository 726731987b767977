"""autotune's NCCL tuner plugin, and its Python side.

NCCL loads the library through ``NCCL_TUNER_PLUGIN=<library_path()>``; this module opens the
same file with ctypes, and both share its state (``dlopen`` returns the one handle a file has in
a process). Two ways to steer NCCL's own all-reduce (docs/NCCL_TUNER.md):

- driven: `Tuner.arm` sets the algorithm, protocol, channels and chunk size for the next
  all-reduce the calling thread launches (optionally on one communicator only);
- a table: rows by size range in the CSV of NCCL's example tuner (``autotune show --nccl-csv``
  writes one), read from ``AUTOTUNE_NCCL_TABLE`` at NCCL's first init, or by `Tuner.load_table`.

A choice NCCL marked unusable (-1 in its cost table) is never forced; `Tuner.last` reports what
the last all-reduce on this thread did, and which combinations NCCL offered for it.
"""

from __future__ import annotations

import ctypes
import importlib
import os
from dataclasses import dataclass
from pathlib import Path

__all__ = ["ALGORITHMS", "PROTOCOLS", "Report", "Tuner", "library_path"]

#: NCCL's algorithms, in its cost table's order (NCCL_ALGO_*).
ALGORITHMS = ("tree", "ring", "collnet_direct", "collnet_chain", "nvls", "nvls_tree", "pat")
#: NCCL's protocols, in its cost table's order (NCCL_PROTO_*).
PROTOCOLS = ("LL", "LL128", "Simple")
_SOURCES = ("none", "driven", "table")


def library_path() -> str:
    """The shared library to give NCCL as ``NCCL_TUNER_PLUGIN``."""
    path = importlib.import_module("autotune_nccl._tuner").__file__
    assert path is not None
    return str(Path(path).resolve())


class _Report(ctypes.Structure):
    _fields_ = [
        ("calls", ctypes.c_int),
        ("source", ctypes.c_int),
        ("applied", ctypes.c_int),
        ("refused", ctypes.c_int),
        ("algo", ctypes.c_int),
        ("proto", ctypes.c_int),
        ("channels", ctypes.c_int),
        ("chunk", ctypes.c_longlong),
        ("usable", ctypes.c_uint),
        ("comm_id", ctypes.c_uint64),
        ("n_bytes", ctypes.c_ulonglong),
    ]


@dataclass(frozen=True)
class Report:
    """What the last all-reduce NCCL asked about on this thread got."""

    calls: int  # all-reduces NCCL asked about on this thread so far
    source: str  # "none", "driven" or "table"
    applied: bool
    refused: bool  # the choice was marked unusable (-1): left to NCCL
    algorithm: str | None
    protocol: str | None
    channels: int
    chunk_bytes: int
    usable: frozenset[tuple[str, str]]  # (algorithm, protocol) NCCL offered for the call
    comm_id: int
    nbytes: int


class Tuner:
    """The plugin's controls, for this process (one library, however many communicators)."""

    def __init__(self, path: str | None = None) -> None:
        self.path = path or library_path()
        lib = ctypes.CDLL(self.path)
        lib.at_arm.argtypes = [
            ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_longlong, ctypes.c_int,
            ctypes.c_uint64,
        ]  # fmt: skip
        lib.at_arm.restype = ctypes.c_int
        lib.at_disarm.argtypes = []
        lib.at_armed.restype = ctypes.c_int
        lib.at_last.argtypes = [ctypes.POINTER(_Report)]
        lib.at_table_load.argtypes = [ctypes.c_char_p]
        lib.at_table_load.restype = ctypes.c_int
        lib.at_table_rows.restype = ctypes.c_int
        lib.at_error.restype = ctypes.c_char_p
        self._lib = lib

    def environ(self) -> dict[str, str]:
        """The environment that makes NCCL load this plugin (set it before NCCL initialises)."""
        return {"NCCL_TUNER_PLUGIN": self.path}

    def arm(
        self,
        algorithm: str,
        protocol: str,
        *,
        channels: int = -1,
        chunk_bytes: int = 0,
        comm_id: int | None = None,
    ) -> None:
        """Steer the next all-reduce this thread launches (on ``comm_id`` only, if given)."""
        algo, proto = _index(algorithm, ALGORITHMS), _index(protocol, PROTOCOLS)
        any_comm = comm_id is None
        self._lib.at_arm(algo, proto, channels, chunk_bytes, int(any_comm), comm_id or 0)

    def disarm(self) -> None:
        self._lib.at_disarm()

    @property
    def armed(self) -> bool:
        """Whether this thread's armed choice is still waiting for its all-reduce."""
        return bool(self._lib.at_armed())

    def last(self) -> Report:
        raw = _Report()
        self._lib.at_last(ctypes.byref(raw))
        usable = frozenset(
            (a, p)
            for i, a in enumerate(ALGORITHMS)
            for j, p in enumerate(PROTOCOLS)
            if raw.usable >> (i * len(PROTOCOLS) + j) & 1
        )
        return Report(
            calls=raw.calls,
            source=_SOURCES[raw.source],
            applied=bool(raw.applied),
            refused=bool(raw.refused),
            algorithm=ALGORITHMS[raw.algo] if 0 <= raw.algo < len(ALGORITHMS) else None,
            protocol=PROTOCOLS[raw.proto] if 0 <= raw.proto < len(PROTOCOLS) else None,
            channels=raw.channels,
            chunk_bytes=raw.chunk,
            usable=usable,
            comm_id=raw.comm_id,
            nbytes=raw.n_bytes,
        )

    def load_table(self, path: str | os.PathLike[str] | None) -> int:
        """Use the table in ``path`` (NCCL's example tuner CSV); None clears it. Its rows."""
        rows = self._lib.at_table_load(None if path is None else os.fsencode(path))
        if rows < 0:
            raise ValueError(f"not a tuner table: {self._lib.at_error().decode()}")
        return int(rows)

    @property
    def table_rows(self) -> int:
        return int(self._lib.at_table_rows())


def _index(name: str, names: tuple[str, ...]) -> int:
    for i, n in enumerate(names):
        if n.lower() == name.lower():
            return i
    raise ValueError(f"{name!r} is not one of {', '.join(names)}")
