"""Play NCCL against the installed library, as each NCCL release calls it, without a GPU:

    python -m autotune_nccl.selfcheck

Each tuner symbol (``ncclTunerPlugin_v2`` to ``_v7``, as NCCL 2.21 to 2.31 find them) gets its
init and one all-reduce armed for ring/LL128 (v2: ring/Simple, its cells); each profiler symbol
(``ncclProfiler_v3`` to ``_v7``, NCCL 2.26 to 2.31) one all-reduce of 1 MiB on two channels whose
GPU timers say 51 us (v7: a symmetric kernel, its variant, tag and three phases). Where
``AUTOTUNE_NCCL_PROFILER_CHAIN`` names a second profiler (NCCL Inspector's, say), a last line
says whether it loaded and received the played calls (at which of its versions), else that none
is configured. One line per check; exit status 1 if any did not do what NCCL expects.
A check of the library's C ABI only: whether a real NCCL loads it is in NCCL's own log
(``NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,TUNING,PROFILE``).
"""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
from collections.abc import Callable

#: NCCL release that looks each symbol up first (its newest).
TUNER_RELEASES = {"v2": "2.21", "v3": "2.22", "v4": "2.24", "v5": "2.28", "v6": "2.30",
                  "v7": "2.31"}  # fmt: skip
PROFILER_RELEASES = {"v3": "2.26", "v4": "2.27", "v5": "2.28", "v6": "2.29", "v7": "2.31"}


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
    from autotune_nccl.played.profiler import SYMMETRIC_PHASES, ProfiledComm

    profiler = Profiler()
    profiler.drain()
    comm = ProfiledComm(version, comm_id=0x5E1F, nranks=2)
    v7 = version == "v7"
    timers = [(1_000, 41_000), (3_000, 52_000)]
    if v7:
        played = comm.collective(
            "AllReduce", 1 << 18, timers=timers, phases=SYMMETRIC_PHASES, variant="selfcheck",
            symmetric=True, tag=7,
        )  # fmt: skip
    else:
        played = comm.collective("AllReduce", 1 << 18, timers=timers)
    comm.finalize()
    got = [r for r in profiler.drain() if r.comm_id == 0x5E1F and r.seq == played.seq]
    if len(got) != 1:
        raise AssertionError(f"{len(got)} records of the played all-reduce")
    r = got[0]
    if (r.func, r.nbytes, r.channels_seen) != ("AllReduce", 1 << 20, 2):
        raise AssertionError(f"recorded {r}")
    if version != "v3" and (r.clock, r.kernel_ns) != ("gpu", 51_000):
        raise AssertionError(f"kernel time {r.kernel_ns} ns on the {r.clock} clock")
    done = f"recorded AllReduce 1 MiB, kernel {r.kernel_ns / 1e3:.1f} us ({r.clock} clock)"
    if not v7:
        return done
    seen = (r.kernel_variant, r.symmetric, r.user_tag, r.phases_seen, r.phase_ns)
    if seen != ("selfcheck", True, 7, 6, (2_000, 41_000, 11_000)):
        raise AssertionError(f"v7 fields (variant, symmetric, tag, phases, phase ns) {seen}")
    return f"{done}, symmetric, 3 phases"


#: AUTOTUNE_NCCL_PROFILER_CHAIN as the check found it (`main` takes it out of this process's
#: environment, so that the symbol checks above run unchained, each at its own version).
_chain: str | None = None
_CHAINED = """
import json
from autotune_nccl import Profiler
from autotune_nccl.played.profiler import ProfiledComm
comm = ProfiledComm("{version}", comm_id=0x5E1F, nranks=2)
comm.collective("AllReduce", 1 << 18)
comm.finalize()
s = Profiler().stats()
print(json.dumps([s.chain_version, s.chained, s.chain_failures]))
"""


def check_chain(version: str) -> str:
    """In a process of its own (one NCCL version per process, as with NCCL): whether the chained
    profiler loads and gets the calls of one all-reduce played at ``version``."""
    if not _chain:
        return "none configured (AUTOTUNE_NCCL_PROFILER_CHAIN unset)"
    env = {**os.environ, "AUTOTUNE_NCCL_PROFILER_CHAIN": _chain}
    out = subprocess.run(
        [sys.executable, "-c", _CHAINED.format(version=version)],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    if out.returncode != 0:
        raise AssertionError(f"the played process failed: {out.stderr.strip()[-300:]}")
    at, forwarded, failures = json.loads(out.stdout)
    if failures or not at or not forwarded:
        why = out.stderr.strip().splitlines()
        raise AssertionError(f"{_chain}: {why[-1] if why else 'no calls forwarded'}")
    return f"{_chain} at its v{at}: {forwarded} calls forwarded"


def main() -> int:
    global _chain
    os.environ.setdefault("AUTOTUNE_NCCL_SHM", "0")  # a check leaves no file for the daemon
    _chain = os.environ.pop("AUTOTUNE_NCCL_PROFILER_CHAIN", None)
    failed = 0
    rows: list[tuple[str, str, Callable[[str], str]]] = [
        *((f"ncclTunerPlugin_{v}", v, check_tuner) for v in TUNER_RELEASES),
        *((f"ncclProfiler_{v}", v, check_profiler) for v in PROFILER_RELEASES),
        ("chain", "v7", check_chain),
    ]
    for symbol, version, check in rows:
        release = (TUNER_RELEASES if check is check_tuner else PROFILER_RELEASES)[version]
        if check is check_chain:
            release = "2.31"
        try:
            result, mark = check(version), "ok  "
        except Exception as exc:  # each symbol is reported, whatever the others do
            result, mark, failed = f"{type(exc).__name__}: {exc}", "FAIL", failed + 1
        print(f"{mark} {symbol:<20} as NCCL {release:<5} {result}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
