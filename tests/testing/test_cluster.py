"""The emulated cluster for real (network namespaces, a bridge, rate-limited links, a torchrun
agent per node): built and always removed, ranks finding their nodes across it, every algorithm
conforming across it, the example job training across it with the tuner, and a lost node.

Needs root (CI runs as root); elsewhere these skip, saying so.
"""

from __future__ import annotations

import os
import pickle
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from needs import unmet

from autotune.testing.cluster import NETNS_TAG_ENV, Cluster, namespaces, unavailable
from autotune.testing.conformance import algorithms_under_test, failures

JOBS = str(Path(__file__).parents[1] / "jobs" / "cluster_jobs.py")
EXAMPLE = str(Path(__file__).parents[2] / "examples" / "train_ddp.py")


@pytest.fixture(autouse=True)
def _needs_namespaces() -> None:
    reason = unavailable()
    if reason is not None:
        unmet(f"the emulated cluster cannot be built here: {reason}")


@pytest.fixture
def two_by_two() -> Iterator[Cluster]:
    with Cluster(2, 2, rate_mbit=1000) as cluster:
        yield cluster


def ranks_wrote(out: Path) -> list[dict[str, Any]]:
    rows = []
    for path in sorted(out.glob("rank*.pkl"), key=lambda p: int(p.stem[4:])):
        with open(path, "rb") as f:
            rows.append(pickle.load(f))
    return rows


@pytest.mark.distributed
@pytest.mark.needs_root
def test_cluster_is_limited_and_removed_even_when_the_body_fails() -> None:
    made: tuple[str, ...] = ()
    with pytest.raises(ValueError, match="the body failed"), Cluster(2, 1, rate_mbit=800) as c:
        made = c.made
        assert len(made) == 3  # two nodes and the switch
        assert set(made) <= set(namespaces())  # others' (another run's) may exist too
        # Tagged with this run's pid (the leak plugin sets it): a run beside it sees none.
        tag = os.environ[NETNS_TAG_ENV]
        assert tag == str(os.getpid()) and set(made) <= set(namespaces(tag))
        assert not set(made) & set(namespaces(f"{tag}0"))
        assert "rate 800Mbit" in c.qdisc(0)
        sleeper = c.popen(1, ["sleep", "600"])
        raise ValueError("the body failed")
    assert not set(made) & set(namespaces())
    assert sleeper.poll() is not None  # killed, not orphaned


@pytest.mark.distributed
@pytest.mark.needs_root
def test_a_sigterm_still_removes_the_cluster() -> None:
    # A CI runner's timeout or a `kill` sends SIGTERM, which skips atexit and `with` exits.
    code = (
        "import sys, time\n"
        "from autotune.testing.cluster import Cluster\n"
        "with Cluster(2, 1) as c:\n"
        "    c.popen(0, ['sleep', '600'])\n"
        "    print(' '.join(c.made), flush=True)\n"
        "    time.sleep(600)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        made = proc.stdout.readline().split()
        assert len(made) == 3 and set(made) <= set(namespaces())
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 128 + signal.SIGTERM
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert not set(made) & set(namespaces())


@pytest.mark.distributed
@pytest.mark.needs_root
def test_a_hung_node_is_ended_with_what_it_printed() -> None:
    # A child in a session of its own (as torchrun starts ranks) keeps the output pipe open
    # after its agent is killed: the wait must end the whole node, not wait for that pipe.
    script = (
        "import subprocess, time; subprocess.Popen(['sleep', '600'], start_new_session=True); "
        "print('ready', flush=True); time.sleep(600)"
    )
    with Cluster(1, 1) as c:
        agent = c.popen(0, [sys.executable, "-c", script])
        c.wait_for(agent, "ready", timeout_s=60)
        with pytest.raises(RuntimeError, match=r"printed no 'never' within 0\.5 s:\n.*ready"):
            c.wait_for(agent, "never", timeout_s=0.5)
        run = c.wait([agent], timeout_s=1, check=False)[0]
        assert (run.node, run.returncode) == (0, -signal.SIGKILL)
        assert run.output == "ready\n"  # what wait_for read comes back too
        assert c.pids(0) == []


def test_bad_shapes_are_refused() -> None:
    with pytest.raises(ValueError, match="1\\+ ranks"):
        Cluster(2, [2])
    with pytest.raises(ValueError, match="rate_mbit"):
        Cluster(2, 1, rate_mbit=0)


@pytest.mark.distributed
@pytest.mark.needs_root
@pytest.mark.parametrize(
    ("per_node", "node_of", "fp_per_node"),
    [([2, 2], (0, 0, 1, 1), "2"), ([1, 2], (0, 1, 1), "1+2")],
)
def test_ranks_find_their_nodes_across_namespaces(
    tmp_path: Path, per_node: list[int], node_of: tuple[int, ...], fp_per_node: str
) -> None:
    with Cluster(len(per_node), per_node) as cluster:
        cluster.torchrun([JOBS, "topology", str(tmp_path)], timeout_s=180)
    rows = ranks_wrote(tmp_path)
    assert [r["rank"] for r in rows] == list(range(len(node_of)))
    for row in rows:
        seen = row["value"]
        assert seen["node_of"] == node_of
        assert seen["warnings"] == []  # torchrun's GROUP_RANK agrees with the namespaces
        assert seen["fingerprint"]["nodes"] == len(per_node)
        assert seen["fingerprint"]["ranks_per_node"] == fp_per_node
    # torchrun's node order is the namespaces' order: node k's ranks come from node k's agent.
    assert [int(r["host"]) for r in rows] == list(node_of)


@pytest.mark.distributed
@pytest.mark.needs_root
@pytest.mark.parametrize("per_node", [[2, 2], [1, 2]], ids=["2x2", "1+2"])
def test_every_algorithm_conforms_across_namespaces(tmp_path: Path, per_node: list[int]) -> None:
    names = algorithms_under_test()
    with Cluster(len(per_node), per_node, rate_mbit=1000) as cluster:
        cluster.torchrun([JOBS, "conformance", str(tmp_path), ",".join(names)], timeout_s=300)
    outcomes = [o for row in ranks_wrote(tmp_path) for o in row["value"]]
    assert {o.algorithm for o in outcomes} == set(names)
    assert {o.rank for o in outcomes} == set(range(sum(per_node)))
    problems = failures(outcomes)
    assert not problems, "\n".join(problems[:20])


@pytest.mark.distributed
@pytest.mark.needs_root
def test_the_example_trains_across_nodes_with_the_tuner(
    two_by_two: Cluster, tmp_path: Path
) -> None:
    env = {"AUTOTUNE_STORAGE": f"sqlite:///{tmp_path / 'plans.db'}"}
    runs = two_by_two.torchrun([EXAMPLE, "--steps", "120"], timeout_s=400, env=env)
    out = runs[0].output
    assert "parameters bitwise identical on all 4 ranks: yes" in out, out[-3000:]
    assert re.search(r"^autotune vs plain DDP(, provisional)?: ", out, re.M), out[-3000:]


@pytest.mark.distributed
@pytest.mark.needs_root
@pytest.mark.parametrize("how", ["killed", "cut"])
def test_a_lost_node_gives_every_survivor_the_clear_error(two_by_two: Cluster, how: str) -> None:
    # Killed: its sockets close and the survivors hear at once. Cut (link down): nothing
    # reaches them, and the timeout is what must end their wait.
    timeout_s = 10
    env = {"AUTOTUNE_TIMEOUT_S": str(timeout_s)}
    agents = two_by_two.start_torchrun([EXAMPLE, "--steps", "100000", "--algorithm", "ring"], env)
    # Training, past DDP's setup (a fault during it waits out the job's own 30 min timeout).
    two_by_two.wait_for(agents[0], "training:", timeout_s=180)
    time.sleep(2)
    assert all(a.poll() is None for a in agents), "the job ended before the fault"
    if how == "killed":
        two_by_two.kill(1)
    else:
        two_by_two.cut(1)
    # Past this, wait kills the agent: no error lines, and the test fails.
    survivor = two_by_two.wait(agents[:1], timeout_s=timeout_s + 60, check=False)[0]
    assert survivor.returncode != 0
    errors = [line for line in survivor.output.splitlines() if "PeerError: ring all-reduce" in line]
    reported = {line.split("]")[0] for line in errors}
    # Node 0's ranks (0 and 1) report it, or torchrun's agent stops the other once one has
    # failed (it ends the node's remaining workers with SIGTERM): none is left waiting.
    assert reported == {"[rank0", "[rank1"} or (
        reported and "closing signal SIGTERM" in survivor.output
    ), survivor.output[-3000:]
    if how == "cut":
        assert f"within 0:00:{timeout_s}" in survivor.output
