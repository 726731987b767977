"""NCCL's side of the tuner plugin's C ABI, as NCCL calls it: the exported structs (v5, v6/v7),
its cost table, and one communicator's calls. Shared by the ABI tests and the ranks of the
tuner tests, which play NCCL with it."""

from __future__ import annotations

import ctypes

from autotune_nccl import ALGORITHMS, PROTOCOLS, library_path

ALLREDUCE, ALLGATHER = 4, 2
NUM_ALGO, NUM_PROTO = len(ALGORITHMS), len(PROTOCOLS)
RING, TREE, NVLS = ALGORITHMS.index("ring"), ALGORITHMS.index("tree"), ALGORITHMS.index("nvls")
LL, LL128, SIMPLE = range(3)

_INIT = ctypes.CFUNCTYPE(
    ctypes.c_int, ctypes.POINTER(ctypes.c_void_p), ctypes.c_uint64, ctypes.c_size_t,
    ctypes.c_size_t, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
)  # fmt: skip
_COLL_INFO = ctypes.CFUNCTYPE(
    ctypes.c_int, ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p,
    ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.POINTER(ctypes.c_int),
)  # fmt: skip
_FINALIZE = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p)
_CHUNK = ctypes.CFUNCTYPE(
    ctypes.c_int, ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
    ctypes.c_int, ctypes.POINTER(ctypes.c_size_t),
)  # fmt: skip


class V5(ctypes.Structure):
    _fields_ = [
        ("name", ctypes.c_char_p),
        ("init", _INIT),
        ("getCollInfo", _COLL_INFO),
        ("finalize", _FINALIZE),
    ]


class V6(ctypes.Structure):
    _fields_ = [*V5._fields_, ("getChunkSize", _CHUNK)]


class Row(ctypes.Array[ctypes.c_float]):
    _type_ = ctypes.c_float
    _length_ = NUM_PROTO


class Table(ctypes.Array[Row]):
    """NCCL's float[NUM_ALGO][NUM_PROTO] cost table."""

    _type_ = Row
    _length_ = NUM_ALGO


def nccl_table(unusable: tuple[tuple[int, int], ...] = ((NVLS, LL), (NVLS, LL128))) -> Table:
    """A cost table as NCCL fills it: a cost per algorithm x protocol, -1 where not usable."""
    t = Table()
    for a in range(NUM_ALGO):
        for p in range(NUM_PROTO):
            t[a][p] = -1.0 if (a, p) in unusable else 10.0 + a * NUM_PROTO + p
    return t


class NcclComm:
    """One communicator's view of the plugin: what NCCL does with it."""

    def __init__(self, api: V5 | V6, comm_id: int, ranks: int = 8, nodes: int = 1) -> None:
        self.api = api
        self.ctx = ctypes.c_void_p()
        assert api.init(ctypes.byref(self.ctx), comm_id, ranks, nodes, None, None, None) == 0

    def coll_info(
        self, nbytes: int, table: Table | None = None, func: int = ALLREDUCE
    ) -> tuple[Table, int]:
        table = table if table is not None else nccl_table()
        channels = ctypes.c_int(-1)
        rc = self.api.getCollInfo(
            self.ctx, func, nbytes, 1, ctypes.addressof(table), NUM_ALGO, NUM_PROTO, 0,
            ctypes.byref(channels),
        )  # fmt: skip
        assert rc == 0
        return table, channels.value

    def chunk(self, algo: int, proto: int, computed: int = 131072) -> int:
        assert isinstance(self.api, V6)
        size = ctypes.c_size_t(computed)
        assert self.api.getChunkSize(self.ctx, ALLREDUCE, 1 << 20, algo, proto, 4, size) == 0
        return size.value

    def close(self) -> None:
        assert self.api.finalize(self.ctx) == 0


def cheapest(table: Table) -> tuple[str, str]:
    """What NCCL runs: the usable cell of least cost (NCCL's own tie order: first found)."""
    cells = [(table[a][p], a, p) for a in range(NUM_ALGO) for p in range(NUM_PROTO)]
    _, a, p = min(c for c in cells if c[0] >= 0)
    return ALGORITHMS[a], PROTOCOLS[p]


def v6() -> V6:
    """The v6 struct the library exports, as NCCL 2.30 finds it."""
    return V6.in_dll(ctypes.CDLL(library_path()), "ncclTunerPlugin_v6")
