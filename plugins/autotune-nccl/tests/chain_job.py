"""One process of the chained-profiler tests (test_profiler_chain.py): NCCL's calls played at
one profiler version against autotune's library, with AUTOTUNE_NCCL_PROFILER_CHAIN (set by the
test) naming the played second profiler; prints what both kept, as JSON.

    python chain_job.py VERSION COMMS [SECOND_LIBRARY]
"""

from __future__ import annotations

import ctypes
import json
import sys

from autotune_nccl import Profiler
from autotune_nccl.played.profiler import SYMMETRIC_PHASES, ProfiledComm


class Entry(ctypes.Structure):
    _fields_ = [
        ("call", ctypes.c_int),
        ("state", ctypes.c_int),
        ("type", ctypes.c_uint64),
        ("ctx", ctypes.c_void_p),
        ("handle", ctypes.c_void_p),
        ("parent", ctypes.c_void_p),
        ("timer", ctypes.c_uint64),
    ]


def main(version: str, comms: int, second: str | None) -> None:
    profiler = Profiler()
    masks, ctxs = [], []
    for i in range(comms):
        comm = ProfiledComm(version, comm_id=0xC4A1 + i)
        masks.append(comm.mask)
        phases = SYMMETRIC_PHASES if version == "v7" else None
        kw = {"variant": "AllReduce_Sum_f32_RING_LL", "symmetric": True} if phases else {}
        comm.collective("AllReduce", 1 << 18, phases=phases, **kw)  # type: ignore[arg-type]
        comm.finalize()
        ctxs.append(comm.ctx.value)
    records = [
        {
            "comm_id": r.comm_id,
            "kernel_ns": r.kernel_ns,
            "channels_seen": r.channels_seen,
            "phase_ns": list(r.phase_ns),
            "phases_seen": r.phases_seen,
            "symmetric": r.symmetric,
        }
        for r in profiler.drain()
    ]
    s = profiler.stats()
    log = []
    if second:
        out = (Entry * 4096)()
        lib = ctypes.CDLL(second)
        n = lib.second_log(out, 4096)
        names = [field[0] for field in Entry._fields_]
        log = [{f: getattr(out[i], f) for f in names} for i in range(n)]
    stats = {k: getattr(s, k) for k in ("chained", "chain_failures", "chain_version", "orphans",
                                       "ignored", "records")}  # fmt: skip
    print(json.dumps({"masks": masks, "records": records, "stats": stats, "log": log}))


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), sys.argv[3] if len(sys.argv) > 3 else None)
