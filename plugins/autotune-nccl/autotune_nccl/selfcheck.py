"""Play NCCL against the installed library, as each NCCL release calls it, without a GPU:

    python -m autotune_nccl.selfcheck

Each tuner symbol (``ncclTunerPlugin_v2`` to ``_v7``, as NCCL 2.21 to 2.31 find them) gets its
init and one all-reduce armed for ring/LL128 (v2: ring/Simple, its cells); each profiler symbol
(``ncclProfiler_v3`` to ``_v6``, NCCL 2.26 to 2.30) one all-reduce of 1 MiB on two channels whose
GPU timers say 51 us. One line per symbol; exit status 1 if any did not do what NCCL expects.
A check of the library's C ABI only: whether a real NCCL loads it is in NCCL's own log
(``NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,TUNING,PROFILE``).
"""

from __future__ import annotations

import ctypes
import os
import sys
from collections.abc import Callable

#: NCCL release that looks each symbol up first (its newest).
TUNER_RELEASES = {"v2": "2.21", "v3": "2.22", "v4": "2.24", "v5": "2.28", "v6": "2.30",
                  "v7": "2.31"}  # fmt: skip
PROFILER_RELEASES = {"v3": "2.26", "v4": "2.27", "v5": "2.28", "v6": "2.29"}


def check_tuner(version: str) -> str:
    from autotune_nccl import Tuner
    from autotune_nccl._library import library_path
    from autotune_nccl.played.tuner import (
        LL128,
        RING,
        SIMPLE,
        V5,
        V6,
        LegacyComm,
        NcclComm,
        changed,
        legacy,
    )  # fmt: skip

    tuner = Tuner()
    if version == "v2":
        comm = LegacyComm(legacy("v2"))
        tuner.arm("ring", "Simple")
        algo, proto, _ = comm.cell(1 << 20)
        comm.close()
        if (algo, proto) != (RING, SIMPLE):
            raise AssertionError(f"wrote algorithm {algo}, protocol {proto}")
        return "init, getCollInfo wrote ring/Simple"
    if version in ("v3", "v4"):
        legacy_comm = LegacyComm(legacy(version))
        tuner.arm("ring", "LL128")
        table, _ = legacy_comm.coll_info(1 << 20)
        legacy_comm.close()
    else:
        kind = V5 if version == "v5" else V6
        api = kind.in_dll(ctypes.CDLL(library_path()), f"ncclTunerPlugin_{version}")
        nccl = NcclComm(api, comm_id=0x5E1F)
        tuner.arm("ring", "LL128")
        table, _ = nccl.coll_info(1 << 20)
        nccl.close()
    if changed(table) != {(RING, LL128): 0.0}:
        raise AssertionError(f"cost table changed at {changed(table)}")
    return "init, getCollInfo set ring/LL128's cost to 0"


def check_profiler(version: str) -> str:
    from autotune_nccl import Profiler
    from autotune_nccl.played.profiler import ProfiledComm

    profiler = Profiler()
    profiler.drain()
    comm = ProfiledComm(version, comm_id=0x5E1F, nranks=2)
    played = comm.collective("AllReduce", 1 << 18, timers=[(1_000, 41_000), (3_000, 52_000)])
    comm.finalize()
    got = [r for r in profiler.drain() if r.comm_id == 0x5E1F and r.seq == played.seq]
    if len(got) != 1:
        raise AssertionError(f"{len(got)} records of the played all-reduce")
    r = got[0]
    if (r.func, r.nbytes, r.channels_seen) != ("AllReduce", 1 << 20, 2):
        raise AssertionError(f"recorded {r}")
    if version != "v3" and (r.clock, r.kernel_ns) != ("gpu", 51_000):
        raise AssertionError(f"kernel time {r.kernel_ns} ns on the {r.clock} clock")
    return f"recorded AllReduce 1 MiB, kernel {r.kernel_ns / 1e3:.1f} us ({r.clock} clock)"


def main() -> int:
    os.environ.setdefault("AUTOTUNE_NCCL_SHM", "0")  # a check leaves no file for the daemon
    failed = 0
    rows: list[tuple[str, str, Callable[[str], str]]] = [
        *((f"ncclTunerPlugin_{v}", v, check_tuner) for v in TUNER_RELEASES),
        *((f"ncclProfiler_{v}", v, check_profiler) for v in PROFILER_RELEASES),
    ]
    for symbol, version, check in rows:
        release = (TUNER_RELEASES if check is check_tuner else PROFILER_RELEASES)[version]
        try:
            result, mark = check(version), "ok  "
        except Exception as exc:  # each symbol is reported, whatever the others do
            result, mark, failed = f"{type(exc).__name__}: {exc}", "FAIL", failed + 1
        print(f"{mark} {symbol:<20} as NCCL {release:<5} {result}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
