"""The GPU check of the two plugins (benchmarks/nccl_plugins.py) judges what the profiler recorded:
its judgment, on records played through the C ABI here, since only a GPU runs the script itself."""

from __future__ import annotations

import sys
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from autotune_nccl import Profiler, Tuner
from autotune_nccl.played.profiler import ProfiledComm

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "benchmarks"))
from nccl_plugins import _prometheus, drain_until_quiet, group_summary


def test_a_group_is_as_steered_only_if_every_record_ran_the_steered_cell() -> None:
    profiler = Profiler()
    profiler.reclaim()
    profiler.drain()
    comm = ProfiledComm("v6", comm_id=0x6A, nranks=2)
    for proto in ("SIMPLE", "SIMPLE", "LL"):
        comm.collective("AllReduce", 1024, timers=[(1, 2_001)], algo="RING", proto=proto)
    comm.collective("AllGather", 1024, timers=[(1, 9_001)], algo="RING", proto="LL")
    records = drain_until_quiet(profiler, quiet_s=0.05)
    assert len(records) == 4
    got = group_summary(records, 4096, ("ring", "Simple"))
    assert (got["records"], got["ran"], got["as_steered"]) == (3, ["ring/LL", "ring/Simple"], False)
    assert got["kernel_us_median"] == 2.0 and got["clock"] == ["gpu"]
    simple = [r for r in records if r.protocol == "SIMPLE"]
    assert group_summary(simple, 4096, ("ring", "Simple"))["as_steered"]
    assert group_summary(records, 4096, None)["as_steered"]  # NCCL's own: whatever it chose
    # The tuner alone (--no-profiler): no record can tell, so no verdict either way.
    assert group_summary([], 4096, ("ring", "Simple"), profiled=False)["as_steered"] is None
    text = _prometheus(records, Tuner().predictions()[0], profiler)
    names = {f.name for f in text_string_to_metric_families(text)}
    assert "autotune_nccl_collective_seconds" in names
    comm.finalize()
