"""The warning for ranks that oversubscribe their host's cores (autotune.util.cores)."""

from __future__ import annotations

import pytest
from ddp_jobs import oversubscription_warnings

from autotune.comm.launch import run_local
from autotune.util.cores import oversubscription, usable_cores


def test_ranks_fit_their_cores_or_are_told_the_thread_count_that_does() -> None:
    assert oversubscription(2, 1, 2) is None
    assert oversubscription(2, 8, 16) is None
    # mp.spawn on the CI machine: torch's default is a thread a core, 2 for each of 2 ranks.
    why = oversubscription(2, 2, 2)
    assert why is not None
    assert "2 ranks on this host each run 2 intra-op threads on 2 cores (4 threads)" in why
    assert "OMP_NUM_THREADS=1" in why and "torch.set_num_threads(1)" in why
    # More ranks than cores: down to one thread each, and no word where they run one already
    # (as the demo's 4 ranks on 2 cores do).
    assert "torch.set_num_threads(1)" in (oversubscription(4, 2, 2) or "")
    assert oversubscription(4, 1, 2) is None
    assert "torch.set_num_threads(8)" in (oversubscription(2, 16, 16) or "")


@pytest.mark.distributed
@pytest.mark.parametrize("oversubscribed", [True, False])
def test_the_lowest_rank_on_a_host_warns_once_at_its_first_cpu_bucket(oversubscribed: bool) -> None:
    cores = usable_cores()
    # A thread a core for each rank (torch's default under mp.spawn), or a share that fits.
    threads = max(2, cores) if oversubscribed else max(1, cores // 2)
    if not oversubscribed and cores < 2:
        pytest.skip("two ranks oversubscribe a single core whatever their threads")
    seen = run_local(oversubscription_warnings, 2, threads=threads, timeout_s=120)
    if oversubscribed:
        assert len(seen[0]) == 1, seen
        assert (
            f"2 ranks on this host each run {threads} intra-op threads on {cores} cores"
            in (seen[0][0])
        )
    else:
        assert seen[0] == [], seen
    assert seen[1] == [], "only the host's lowest rank warns"
