"""Ranks that play NCCL for the tuner's tests, on gloo.

Each rank's "NCCL" is one communicator of the plugin, called through its C ABI
(`autotune_nccl.played`) as NCCL calls it: for every all-reduce it fills a cost table, asks the
plugin on the thread that launches the collective, and runs the cheapest usable cell; then gloo
sums the data. A run with any cell but `FAST` costs `DELAY_S` more, so the right plan is known
in advance: NCCL's own choice (the cheapest cell of an unsteered table, tree/LL) is the slow
baseline, and only the tuner driving the plugin can reach `FAST`.
"""

from __future__ import annotations

import os
import threading
import time
import urllib.request
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import autotune
from autotune.algorithms import (
    Comm,
    NativeAllReduce,
    Pending,
    agreed,
    available,
    get_algorithm,
    register,
)
from autotune.testing.settled import all_settled
from autotune_nccl import ALGORITHMS, PROTOCOLS, library_path
from autotune_nccl.algorithms import COMBINATIONS, NcclAllReduce, controls
from autotune_nccl.played.profiler import ProfiledComm
from autotune_nccl.played.tuner import NcclComm, cheapest, nccl_table, v6

FAST = ("ring", "LL128")
DELAY_S = 0.03
#: What every rank's NCCL marks unusable (-1): NVLS and PAT, as on a machine without NVSwitch.
UNUSABLE = frozenset((a, p) for a in ("nvls", "nvls_tree", "pat") for p in PROTOCOLS)


class FakeNccl:
    """One rank's NCCL communicator, as far as its tuner plugin sees it."""

    def __init__(
        self, ranks: int, unusable: frozenset[tuple[str, str]], profiled: bool = False
    ) -> None:
        self.comm = NcclComm(v6(), comm_id=0xA7, ranks=ranks)
        self.cells = tuple((ALGORITHMS.index(a), PROTOCOLS.index(p)) for a, p in unusable)
        #: (thread name, bytes, (algorithm, protocol) NCCL ran), every all-reduce.
        self.calls: list[tuple[str, int, tuple[str, str]]] = []
        #: The same communicator as NCCL 2.30 reports it to the profiler plugin, if asked.
        self.profiled = ProfiledComm("v6", comm_id=0xA7, nranks=ranks) if profiled else None

    def all_reduce(self, nbytes: int) -> tuple[str, str]:
        table, _ = self.comm.coll_info(nbytes, nccl_table(self.cells))
        ran = cheapest(table)
        self.calls.append((threading.current_thread().name, nbytes, ran))
        start = time.monotonic_ns()
        if ran != FAST:
            time.sleep(DELAY_S)
        if self.profiled is not None:  # the kernel's one channel, timed by the host's clock
            stop = max(time.monotonic_ns(), start + 1_000)
            self.profiled.collective(
                "AllReduce", nbytes // 4, timers=[(start, stop)], algo=ran[0].upper(),
                proto=ran[1].upper(),
            )  # fmt: skip
        return ran


NCCL: list[FakeNccl] = []
_TIMEOUT = timedelta(seconds=60)


class FakeNative(NativeAllReduce):
    """`native` on the fake NCCL: its own choice, unsteered."""

    def _start(self, buf: torch.Tensor, comm: Comm, segment_elems: int) -> Pending:
        NCCL[0].all_reduce(buf.numel() * buf.element_size())
        return super()._start(buf, comm, segment_elems)


def _played(cls: type[NcclAllReduce]) -> type[NcclAllReduce]:
    """``cls`` on the fake NCCL: gloo "consults" the plugin, through `FakeNccl`."""

    class Played(cls):  # type: ignore[valid-type,misc]
        @classmethod
        def consults(cls, backend: str) -> bool:
            return True

        def _launch(self, buf: torch.Tensor, comm: Comm) -> Pending:
            NCCL[0].all_reduce(buf.numel() * buf.element_size())
            pending: Pending = super()._launch(buf, comm)
            return pending

    Played.__name__ = cls.__name__
    return Played


def play_nccl(unusable: frozenset[tuple[str, str]] = UNUSABLE, profiled: bool = False) -> None:
    """Make this rank's NCCL the fake one, for every nccl.* algorithm and `native`."""
    available()  # the installed plugins first, so that these replace theirs
    NCCL[:] = [FakeNccl(dist.get_world_size(), unusable, profiled)]
    for name, cls in COMBINATIONS.items():
        register(name, _played(cls), replace=True)
    register("native", FakeNative, replace=True)


def offered_on_gloo(rank: int, world_size: int) -> dict[str, Any]:
    """What "auto" chooses among on gloo as it is (no NCCL asks the plugin), and an nccl.*
    all-reduce there: it sums, steers nothing and leaves nothing armed."""
    group = dist.group.WORLD
    assert group is not None
    candidates = agreed(autotune.Config().candidates, group, torch.device("cpu"), _TIMEOUT)
    t = torch.full((1000,), float(rank + 1))
    get_algorithm("nccl.ring.simple").all_reduce(t)
    tuner = controls()
    return {
        "candidates": candidates,
        "sum": t.tolist(),
        "armed": tuner.armed,
        "asked": tuner.last().calls,
    }


def offered_on_fake_nccl(rank: int, world_size: int, rank1_also: list[str]) -> dict[str, Any]:
    """What "auto" chooses among when NCCL asks the plugin; rank 1's NCCL also marks
    ``rank1_also`` ("algorithm/protocol") unusable."""
    pairs = [c.split("/") for c in rank1_also] if rank == 1 else []
    play_nccl(UNUSABLE | {(a, p) for a, p in pairs})
    group = dist.group.WORLD
    assert group is not None
    cpu = torch.device("cpu")
    return {
        "auto": agreed(autotune.Config().candidates, group, cpu, _TIMEOUT),
        "given": agreed(("nccl.nvls.simple", "nccl.tree.simple", "ring"), group, cpu, _TIMEOUT),
        "probes": len(NCCL[0].calls),
    }


@dataclass
class Driven:
    candidates: tuple[str, ...]
    plan: dict[int, autotune.Choice]
    baseline_kept: bool
    settled: bool
    # Per algorithm autotune ran, what the fake NCCL ran for it.
    ran: dict[str, set[tuple[str, str]]]
    armed_after: bool
    same_as_rank0: bool


def _train_on_fake_nccl(
    rank: int, storage: str, cap: int, after: int = 0, **settings: Any
) -> tuple[DDP, autotune.AutotuneState]:
    """On the fake NCCL, train a small model with the tuner choosing among NCCL's combinations
    (``settings`` added to its Config) until every rank has settled, then ``after`` steps more
    (at most ``cap`` in all); the model and its settled state."""
    play_nccl()
    torch.manual_seed(0)
    model = DDP(
        torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 8)),
        bucket_cap_mb=0.05,
    )
    config = autotune.Config(
        fusion_bytes=0,
        tune_warmup=1,
        tune_samples=2,
        max_pairs=10,
        storage=storage,
        timeout_s=60,
        **settings,
    )
    state = autotune.register(model, config)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(rank)
    settled = 0
    for _ in range(cap):
        if all_settled(state):
            settled += 1
            if settled > after:
                break
        x, y = torch.randn(32, 256, generator=g), torch.randint(0, 8, (32,), generator=g)
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        opt.zero_grad()
    state.engine.settle(30)
    return model, state


def tune_on_fake_nccl(rank: int, world_size: int, storage: str, cap: int) -> Driven:
    """Train with the tuner choosing among NCCL's combinations, until every rank has settled."""
    model, state = _train_on_fake_nccl(
        rank,
        storage,
        cap,
        algorithms=("nccl.ring.ll128", "nccl.tree.simple", "nccl.nvls.simple"),
        # The baseline is slow only as this fake NCCL runs it through the hook: a job that
        # unhooks would take the plan to plain DDP on gloo instead (autotune.tuning.plain_check).
        unhook=False,
    )
    tuner = state.tuner
    assert tuner is not None
    # The fake NCCL's calls, in order, line up with autotune's messages, in order.
    records = state.recorder.records()
    calls = NCCL[0].calls[-len(records) :] if records else []
    ran: dict[str, set[tuple[str, str]]] = {}
    for record, (_, nbytes, cell) in zip(records, calls, strict=True):
        assert record.nbytes == nbytes
        ran.setdefault(record.algorithm, set()).add(cell)
    digest = torch.cat([p.detach().flatten() for p in model.parameters()])
    theirs = digest.clone()
    dist.broadcast(theirs, 0)
    result = Driven(
        candidates=tuner.candidates,
        plan=state.plan(),
        baseline_kept=bool(tuner.decider and tuner.decider.plan_search.baseline_kept),
        settled=tuner.settled,
        ran=ran,
        armed_after=controls().armed,
        same_as_rank0=bool(torch.equal(digest, theirs)),
    )
    state.close()
    return result


def unhook_on_fake_nccl(rank: int, world_size: int, storage: str, cap: int) -> dict[str, Any]:
    """Tune on the fake NCCL with unhooking on: the locked cells need no hook, so autotune
    unhooks and hands them to the plugin's table. Then what NCCL would run, with nothing armed,
    for every size class the job sent, and whether the hook is gone."""
    # A few steps of plain DDP after unhooking.
    model, state = _train_on_fake_nccl(
        rank, storage, cap, after=3, algorithms=("nccl.ring.ll128", "nccl.tree.simple")
    )
    plan = state.plan()
    unhooking = state.unhooking
    comm = NcclComm(v6(), comm_id=99, ranks=world_size, nodes=1)
    ran = {cls: cheapest(comm.coll_info(cls)[0]) for cls in plan}
    result = {
        "plan": {cls: c.algorithm for cls, c in plan.items()},
        "unhooked_at": None if unhooking is None else unhooking.at,
        "catch": None if unhooking is None or unhooking.catch is None else "ran",
        "hooks": len(getattr(model, "_comm_hooks", [])),
        "ran": ran,
        "rows": controls().table_rows,
        "armed": controls().armed,
        "verdict": state.verdict() if rank == 0 else "",
    }
    state.close()
    controls().load_table(None)  # the process's, not the next test's
    return result


def exported_on_fake_nccl(
    rank: int, world_size: int, storage: str, iterations: int
) -> dict[str, Any]:
    """Train with the hook and the exporter on, on a fake NCCL that loaded both plugins (as
    NCCL_PROFILER_PLUGIN and NCCL_TUNER_PLUGIN name them); scrape this rank's exporter."""
    os.environ["NCCL_PROFILER_PLUGIN"] = library_path()  # what the exporter looks for
    play_nccl(profiled=True)
    torch.manual_seed(0)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.Linear(256, 4)))
    config = autotune.Config(
        algorithms=("nccl.ring.ll128", "nccl.tree.simple"),
        fusion_bytes=0,
        tune_warmup=1,
        tune_samples=2,
        timeout_s=60,
        unhook=False,
        storage=storage,
        metrics_port=0,
    )
    state = autotune.register(model, config)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for _ in range(iterations):
        model(torch.randn(8, 64)).sum().backward()
        opt.step()
        opt.zero_grad()
    state.engine.settle(30)
    assert state.exporter is not None
    url = f"http://127.0.0.1:{state.exporter.port}/metrics"
    with urllib.request.urlopen(url, timeout=30) as response:
        text = response.read().decode()
    calls = [cell for _, _, cell in NCCL[0].calls]
    state.close()
    return {"text": text, "calls": calls}
