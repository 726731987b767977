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
`Tuner.predictions` is NCCL's own cost model for every (communicator, collective, size) it asked
about; `Profiler` (the same library, as ``NCCL_PROFILER_PLUGIN``) what each collective took, and
`autotune_nccl.collectives` joins the two (docs/NCCL_PROFILER.md).
"""

from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass

from autotune_nccl._library import library_path
from autotune_nccl.profiler import Profiler, ProfilerStats, Record

__all__ = [
    "ALGORITHMS",
    "FUNCTIONS",
    "PROTOCOLS",
    "Prediction",
    "Profiler",
    "ProfilerStats",
    "Record",
    "Report",
    "Tuner",
    "library_path",
]

#: NCCL's algorithms, in its cost table's order (NCCL_ALGO_*).
ALGORITHMS = ("tree", "ring", "collnet_direct", "collnet_chain", "nvls", "nvls_tree", "pat")
#: NCCL's protocols, in its cost table's order (NCCL_PROTO_*).
PROTOCOLS = ("LL", "LL128", "Simple")
#: NCCL's collectives, by ncclFunc_t (the tuner's collType), in the names its profiler gives.
FUNCTIONS = ("Broadcast", "Reduce", "AllGather", "ReduceScatter", "AllReduce")
_SOURCES = ("none", "driven", "table")


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


class _Prediction(ctypes.Structure):
    _fields_ = [
        ("comm_id", ctypes.c_uint64),
        ("n_bytes", ctypes.c_ulonglong),
        ("func", ctypes.c_int),
        ("n_ranks", ctypes.c_int),
        ("n_nodes", ctypes.c_int),
        ("nccl_algo", ctypes.c_int),
        ("nccl_proto", ctypes.c_int),
        ("steered_algo", ctypes.c_int),
        ("steered_proto", ctypes.c_int),
        ("calls", ctypes.c_ulonglong),
        ("cost", (ctypes.c_float * len(PROTOCOLS)) * len(ALGORITHMS)),
    ]


@dataclass(frozen=True)
class Prediction:
    """NCCL's cost model for one (communicator, collective, size), as its tuner call saw it."""

    comm_id: int  # NCCL's commHash (0 under NCCL 2.27 and older: their tuner gets none)
    func: str  # as FUNCTIONS names it
    nbytes: int  # NCCL's nBytes: the larger of send and receive (all-gather: the gathered)
    nranks: int
    nnodes: int
    calls: int
    #: NCCL's predicted time per usable cell, microseconds, before any steering.
    cost_us: dict[tuple[str, str], float]
    nccl_choice: tuple[str, str] | None  # the cell NCCL's model picks (None: nothing usable)
    steered: tuple[str, str] | None  # the cell the last call was steered to (None: NCCL's own)


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
        lib.at_predictions.argtypes = [
            ctypes.POINTER(_Prediction), ctypes.c_int, ctypes.POINTER(ctypes.c_ulonglong)
        ]  # fmt: skip
        lib.at_predictions.restype = ctypes.c_int
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

    def predictions(self) -> tuple[list[Prediction], int]:
        """NCCL's cost model for every (communicator, collective, size) asked about so far, and
        how many such keys did not fit the library's table (512)."""
        dropped = ctypes.c_ulonglong()
        n = self._lib.at_predictions(None, 0, ctypes.byref(dropped))
        raw = (_Prediction * max(n, 1))()
        n = min(n, self._lib.at_predictions(raw, n, ctypes.byref(dropped)))
        return [_prediction(raw[i]) for i in range(n)], int(dropped.value)

    def clear_predictions(self) -> None:
        self._lib.at_predictions_clear()


def _cell(algo: int, proto: int) -> tuple[str, str] | None:
    if 0 <= algo < len(ALGORITHMS) and 0 <= proto < len(PROTOCOLS):
        return ALGORITHMS[algo], PROTOCOLS[proto]
    return None


def _prediction(p: _Prediction) -> Prediction:
    return Prediction(
        comm_id=p.comm_id,
        func=FUNCTIONS[p.func] if 0 <= p.func < len(FUNCTIONS) else str(p.func),
        nbytes=p.n_bytes,
        nranks=p.n_ranks,
        nnodes=p.n_nodes,
        calls=p.calls,
        cost_us={
            (a, pr): float(p.cost[i][j])
            for i, a in enumerate(ALGORITHMS)
            for j, pr in enumerate(PROTOCOLS)
            if p.cost[i][j] >= 0
        },
        nccl_choice=_cell(p.nccl_algo, p.nccl_proto),
        steered=_cell(p.steered_algo, p.steered_proto),
    )


def _index(name: str, names: tuple[str, ...]) -> int:
    for i, n in enumerate(names):
        if n.lower() == name.lower():
            return i
    raise ValueError(f"{name!r} is not one of {', '.join(names)}")
