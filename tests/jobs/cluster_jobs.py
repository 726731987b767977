"""What the emulated-cluster tests run under torchrun on every node: each rank writes what it saw
to ``<out>/rank<N>.pkl`` for the test to read.

    python tests/jobs/cluster_jobs.py topology OUT
    python tests/jobs/cluster_jobs.py conformance OUT ALGORITHM[,ALGORITHM...]
"""

from __future__ import annotations

import os
import pickle
import sys
import warnings
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist


def topology() -> dict[str, Any]:
    from autotune.comm.topology import detect
    from autotune.storage import job_fingerprint

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        topo = detect()
    assert dist.group.WORLD is not None
    fp = job_fingerprint(dist.group.WORLD, torch.device("cpu"), torch.float32, topo)
    return {
        "node_of": topo.node_of,
        "fingerprint": fp,
        "warnings": [str(w.message) for w in caught],
    }


def conformance(names: str) -> Any:
    from autotune.testing.conformance import Case, run_in_group

    n = dist.get_world_size()
    sizes = [1, n + 1, 1000, 40_000, 300_000]
    case_list = [Case(s, dt) for s in sizes for dt in (torch.float32, torch.bfloat16)]
    case_list.append(Case(40_000, torch.float32, segment_bytes=4099))
    return run_in_group(names.split(","), case_list=case_list, timeout_s=60)


def main() -> None:
    what, out, *rest = sys.argv[1:]
    dist.init_process_group("gloo")
    try:
        value = topology() if what == "topology" else conformance(*rest)
        value = {"rank": dist.get_rank(), "host": os.environ.get("GROUP_RANK"), "value": value}
        with open(Path(out) / f"rank{dist.get_rank()}.pkl", "wb") as f:
            pickle.dump(value, f)
    finally:
        dist.destroy_process_group()
    # Skip interpreter teardown, as autotune's own launchers do: gloo's teardown there aborts
    # now and then ("terminate called without an active exception"), failing a good run.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
