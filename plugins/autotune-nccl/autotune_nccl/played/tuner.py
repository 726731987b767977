"""NCCL's side of the tuner plugin's C ABI, as NCCL calls it: the exported structs (v2 to v7),
its cost table, and one communicator's calls, as NCCL 2.21 to 2.31 make them."""

from __future__ import annotations

import ctypes

from autotune_nccl import ALGORITHMS, PROTOCOLS
from autotune_nccl._library import library_path
from autotune_nccl.played import ok

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


ALGOS_V5, PROTOS_V5, HW_LINKS_V5, SCALES_V5 = 7, 3, 3, 3  # tuner_v5.h's NCCL_NUM_*_V5
#: Compute-capability rows of NCCL's tuner constants: tuner_v5.h's NCCL_NUM_COMPCAPS_V5 (v5, v6)
#: and tuner_v7.h's NCCL_NUM_COMPCAPS_V7 (NCCL 2.31).
COMPCAPS = {"v5": 4, "v6": 4, "v7": 5}


def constants_struct(version: str) -> type[ctypes.Structure]:
    """ncclTunerConstants_v5_t (v5, v6) or _v7_t: latencies, then five bandwidth tables of
    COMPCAPS[version] rows, doubles throughout."""
    scaled = ctypes.c_double * SCALES_V5 * COMPCAPS[version]
    tables = ("llMaxBws", "perChMaxRingLL128Bws", "perChMaxTreeLL128Bws", "perChMaxTreeBws",
              "perChMaxNVLSTreeBws")  # fmt: skip
    return type(
        f"Constants{version}",
        (ctypes.Structure,),
        {
            "_fields_": [
                ("baseLatencies", ctypes.c_double * PROTOS_V5 * ALGOS_V5),
                ("hwLatencies", ctypes.c_double * PROTOS_V5 * ALGOS_V5 * HW_LINKS_V5),
                *((name, scaled) for name in tables),
            ]
        },
    )


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


def changed(table: Table) -> dict[tuple[int, int], float]:
    """The cells that differ from an untouched `nccl_table`."""
    ref = nccl_table()
    return {
        (a, p): table[a][p]
        for a in range(NUM_ALGO)
        for p in range(NUM_PROTO)
        if table[a][p] != ref[a][p]
    }


class NcclComm:
    """One communicator's view of the plugin: what NCCL does with it."""

    def __init__(
        self,
        api: V5 | V6,
        comm_id: int,
        ranks: int = 8,
        nodes: int = 1,
        constants: ctypes.Structure | None = None,
    ) -> None:
        self.api = api
        self.ctx = ctypes.c_void_p()
        where = None if constants is None else ctypes.addressof(constants)
        ok(api.init(ctypes.byref(self.ctx), comm_id, ranks, nodes, None, None, where))

    def coll_info(
        self, nbytes: int, table: Table | None = None, func: int = ALLREDUCE
    ) -> tuple[Table, int]:
        table = table if table is not None else nccl_table()
        channels = ctypes.c_int(-1)
        rc = self.api.getCollInfo(
            self.ctx, func, nbytes, 1, ctypes.addressof(table), NUM_ALGO, NUM_PROTO, 0,
            ctypes.byref(channels),
        )  # fmt: skip
        ok(rc)
        return table, channels.value

    def chunk(self, algo: int, proto: int, computed: int = 131072) -> int:
        if not isinstance(self.api, V6):
            raise TypeError("getChunkSize is v6 and newer")
        size = ctypes.c_size_t(computed)
        ok(self.api.getChunkSize(self.ctx, ALLREDUCE, 1 << 20, algo, proto, 4, size))
        return size.value

    def close(self) -> None:
        ok(self.api.finalize(self.ctx))


def cheapest(table: Table) -> tuple[str, str]:
    """What NCCL runs: the usable cell of least cost (NCCL's own tie order: first found)."""
    cells = [(table[a][p], a, p) for a in range(NUM_ALGO) for p in range(NUM_PROTO)]
    _, a, p = min(c for c in cells if c[0] >= 0)
    return ALGORITHMS[a], PROTOCOLS[p]


def v6() -> V6:
    """The v6 struct the library exports, as NCCL 2.30 finds it."""
    return V6.in_dll(ctypes.CDLL(library_path()), "ncclTunerPlugin_v6")


# NCCL 2.21 to 2.27: the tuner structs v2, v3 and v4, whose init has no communicator id.
_INIT_LEGACY = ctypes.CFUNCTYPE(
    ctypes.c_int, ctypes.c_size_t, ctypes.c_size_t, ctypes.c_void_p,
    ctypes.POINTER(ctypes.c_void_p),
)  # fmt: skip
_COLL_INFO_V2 = ctypes.CFUNCTYPE(
    ctypes.c_int, ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
    ctypes.c_int, ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_int),
    ctypes.POINTER(ctypes.c_int),
)  # fmt: skip
_COLL_INFO_V3 = ctypes.CFUNCTYPE(
    ctypes.c_int, ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p,
    ctypes.c_int, ctypes.c_int, ctypes.POINTER(ctypes.c_int),
)  # fmt: skip


class V2(ctypes.Structure):
    """NCCL 2.21's tuner (and 2.22-2.31's oldest): no cost table; the plugin writes the cell."""

    _fields_ = [
        ("name", ctypes.c_char_p),
        ("init", _INIT_LEGACY),
        ("getCollInfo", _COLL_INFO_V2),
        ("destroy", _FINALIZE),
    ]


class V3(ctypes.Structure):
    """NCCL 2.22-2.23: the cost table, without regBuff."""

    _fields_ = [
        ("name", ctypes.c_char_p),
        ("init", _INIT_LEGACY),
        ("getCollInfo", _COLL_INFO_V3),
        ("destroy", _FINALIZE),
    ]


class V4(ctypes.Structure):
    """NCCL 2.24-2.27: v5's getCollInfo, v3's init."""

    _fields_ = [
        ("name", ctypes.c_char_p),
        ("init", _INIT_LEGACY),
        ("getCollInfo", _COLL_INFO),
        ("destroy", _FINALIZE),
    ]


#: NCCL 2.21's algorithms in v2's outputs: tree, ring, collnet direct, collnet chain, nvls,
#: nvls tree (no pat).
V2_ALGOS = 6
UNDEF = -1


class LegacyComm:
    """One communicator as NCCL 2.21 to 2.27 drive the plugin: init without an id."""

    def __init__(self, api: V2 | V3 | V4, ranks: int = 8, nodes: int = 1) -> None:
        self.api = api
        self.ctx = ctypes.c_void_p()
        ok(api.init(ranks, nodes, None, ctypes.byref(self.ctx)))

    def coll_info(
        self, nbytes: int, table: Table | None = None, func: int = ALLREDUCE
    ) -> tuple[Table, int]:
        """v3 and v4: NCCL's cost table in, the table and the channels out."""
        if isinstance(self.api, V2):
            raise TypeError("v2 has no cost table: use cell()")
        table = table if table is not None else nccl_table()
        channels = ctypes.c_int(-1)
        if isinstance(self.api, V3):
            rc = self.api.getCollInfo(
                self.ctx, func, nbytes, 1, ctypes.addressof(table), NUM_ALGO, NUM_PROTO,
                ctypes.byref(channels),
            )  # fmt: skip
        else:
            rc = self.api.getCollInfo(
                self.ctx, func, nbytes, 1, ctypes.addressof(table), NUM_ALGO, NUM_PROTO, 0,
                ctypes.byref(channels),
            )  # fmt: skip
        ok(rc)
        return table, channels.value

    def cell(
        self, nbytes: int, collnet: bool = False, nvls: bool = False, func: int = ALLREDUCE
    ) -> tuple[int, int, int]:
        """v2: the algorithm, protocol and channels the plugin wrote (-1, -1, 0: NCCL's own),
        as NCCL 2.21 calls it (outputs preset to undefined and 0)."""
        if not isinstance(self.api, V2):
            raise TypeError("cell() is v2's call")
        algo, proto, channels = ctypes.c_int(UNDEF), ctypes.c_int(UNDEF), ctypes.c_int(0)
        rc = self.api.getCollInfo(
            self.ctx, func, nbytes, int(collnet), int(nvls), 1, ctypes.byref(algo),
            ctypes.byref(proto), ctypes.byref(channels),
        )  # fmt: skip
        ok(rc)
        return algo.value, proto.value, channels.value

    def close(self) -> None:
        ok(self.api.destroy(self.ctx))


def legacy(version: str) -> V2 | V3 | V4:
    """The legacy struct the library exports, as that NCCL finds it."""
    lib = ctypes.CDLL(library_path())
    symbol = f"ncclTunerPlugin_{version}"
    if version == "v2":
        return V2.in_dll(lib, symbol)
    return V3.in_dll(lib, symbol) if version == "v3" else V4.in_dll(lib, symbol)
