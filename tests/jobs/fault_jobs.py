"""Rank-side jobs of the reliability tests (tests/util/test_secrets.py,
tests/ddp/test_faults_unhooked.py)."""

from __future__ import annotations

import copy
import json
import logging
import os
import resource
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from ddp_jobs import Net
from sparse_net import SparseNet
from torch.nn.parallel import DistributedDataParallel as DDP

import autotune
from autotune.plan import Buckets, Choice, Entry, Gain, Table, size_class
from autotune.storage import Store, device_model, fingerprint, fingerprint_key


def register_with_storage(rank: int, world_size: int, url: str) -> tuple[str, str, list[str]]:
    """Register with storage ``url`` (rank 0 opens it): the error this rank got, and every
    value the ranks left in the rendezvous store while agreeing on setup."""
    message = kind = ""
    try:
        autotune.register(DDP(Net()), autotune.Config(storage=url, timeout_s=60)).close()
    except (RuntimeError, ValueError) as exc:
        kind, message = type(exc).__name__, str(exc)
    # The first state's board (`autotune.comm.faults.FailureBoard`), as it names its keys.
    assert dist.group.WORLD is not None
    board = f"autotune/{dist.group.WORLD.group_name}/0/"
    store = dist.PrefixStore(board, dist.distributed_c10d._get_default_store())
    values = []
    for phase in ("config", "ready"):
        for r in range(world_size):
            key = f"{phase}/{r}"
            if store.check([key]):
                values.append(store.get(key).decode())
    dist.barrier()  # nobody leaves (and takes the store down) before everyone has read
    time.sleep(0.1)
    return kind, message, values


@dataclass
class Seen:
    """What a rank saw of a fault: the error it got (from backward() or forward), and when."""

    step: int
    fault_at: int | None  # the step at which the fault was due
    kind: str
    rank: int | None  # the culprit the error names
    message: str
    seconds: float  # from the start of the step that failed to the error
    aside_at: int | None  # the iteration after which autotune had unhooked
    ddp_group: str  # the name of the group DDP's reducer ran on when it failed
    in_forward: bool = False  # the error came from forward(), not backward()
    #: Where the first error was not a `PeerError`: the error of one more step (kind, rank).
    then: tuple[str, int | None] | None = None


class BufferNet(Net):
    """`Net` with batch norm: DDP broadcasts its running statistics at every forward
    (``broadcast_buffers``), a collective of DDP's own before backward's."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = torch.nn.BatchNorm1d(16)

    def forward(self, x: torch.Tensor, use_branch: bool = True) -> torch.Tensor:
        return super().forward(self.norm(x), use_branch)


def plan_that_steps_aside(path: Path) -> str:
    """A plan file that keeps DDP's own all-reduce (on DDP's own buckets): autotune unhooks
    after the first iteration, as a job whose tuner kept the baseline does."""
    path.write_text(json.dumps(Table({}, 0, buckets=Buckets(1 << 20, None)).to_json()))
    return str(path)


def train_until_it_fails(
    rank: int,
    world_size: int,
    faults: dict[int, str],
    config: dict[str, Any],
    when: str = "8",
    wake: bool = False,
    buffers: bool = False,
    device: str = "cpu",
) -> Seen:
    """Train; at the step ``when`` says, each rank in ``faults`` does what it says: "exit" (as if
    killed), "stop" (SIGSTOP itself: hung, alive) or "sleep" (hung in Python, its heartbeat
    going on, for 3 timeouts; then it exits).
    Every other rank reports the error it gets. ``when``: a step ("8"), 3 steps after autotune
    unhooked ("unhooked"), or the second step of the check's first block of plain DDP
    ("catch"); every rank reaches these at the same step. ``wake``: the lowest surviving rank,
    once it has its error, wakes the stopped ranks (SIGCONT), which then report theirs.
    ``buffers``: train `BufferNet`, whose forward runs a collective of DDP's. ``device``:
    "cuda" puts the model and batches on this rank's GPU (ranks share GPUs round robin)."""
    torch.manual_seed(0)
    where = torch.device("cpu")
    if device == "cuda":
        where = torch.device("cuda", rank % torch.cuda.device_count())
        torch.cuda.set_device(where)
    model = DDP((BufferNet() if buffers else Net()).to(where))
    state = autotune.register(model, autotune.Config(**config))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    fault_at = int(when) if when.isdigit() else None
    for step in range(1500):
        start = time.monotonic()
        unhooking = state.unhooking
        if fault_at is None and unhooking is not None:
            if when == "unhooked" and unhooking.at is not None:
                fault_at = step + 3
            plain = (
                unhooking.catch is not None and not unhooking.catch.over and not model._comm_hooks
            )
            if when == "catch" and plain:
                fault_at = step + 1
        if step == fault_at and rank in faults:
            fault = faults[rank]
            if fault == "exit":
                os._exit(17)
            if fault == "stop":
                os.kill(os.getpid(), signal.SIGSTOP)
            if fault == "sleep":
                time.sleep(3 * config["timeout_s"])  # past the others' timeout and diagnosis
                os._exit(18)
        x, y = torch.randn(8, 16, device=where), torch.randint(0, 4, (8,), device=where)
        in_forward = True
        try:
            out = model(x)
            in_forward = False
            torch.nn.functional.cross_entropy(out, y).backward()
        except RuntimeError as exc:
            seen = Seen(
                step,
                fault_at,
                type(exc).__name__,
                getattr(exc, "rank", None),
                str(exc),
                time.monotonic() - start,
                None if state.unhooking is None else state.unhooking.at,
                model.process_group.group_desc,
                in_forward,
            )
            if not isinstance(exc, autotune.algorithms.PeerError):
                try:
                    torch.nn.functional.cross_entropy(model(x), y).backward()
                except RuntimeError as again:
                    seen.then = (type(again).__name__, getattr(again, "rank", None))
            if wake and rank == min(r for r in range(world_size) if r not in faults):
                time.sleep(2.0)  # every survivor has its error: then the culprits wake
                for r, fault in faults.items():
                    if fault == "stop":
                        os.kill(state.board.peers[r].pid, signal.SIGCONT)
            return seen
        opt.step()
        opt.zero_grad()
    raise AssertionError("trained to the end without noticing the fault")


#: The workload `storage_with_a_ring_plan` stores its plan under (a job's `Config.workload`).
RING_WORKLOAD = "faults-net"


def storage_with_a_ring_plan(path: Path, world_size: int, wire: str | None = None) -> str:
    """A storage holding, for `Net`'s all-reduces at ``world_size`` CPU ranks on this host, a
    plan with `ring` for its bucket's size class, as workload `RING_WORKLOAD`: a job of it goes
    straight to the check against plain DDP (`autotune.tuning.plain_check`), whose blocks
    alternate the hook and plain DDP. ``wire``: `ring` on that compressed wire."""
    url = f"sqlite:///{path}"
    net_bytes = sum(p.numel() * p.element_size() for p in Net().parameters())
    classes = {size_class(net_bytes): Entry(Choice("ring", None, wire), state="locked")}
    table = Table(classes, 0, None, Gain(0.9, 0.85, 0.95, 12))
    Store(url, run_id="ring-job").save_table(gloo_cpu_key(world_size), RING_WORKLOAD, table)
    return url


def gloo_cpu_key(world_size: int) -> str:
    """The fingerprint key of float32 all-reduces on gloo among ``world_size`` CPU ranks on
    this host, as the tuner names them (`autotune.storage.store.job_fingerprint`)."""
    fp = fingerprint(
        backend="gloo", world_size=world_size, nodes=1, device=device_model("cpu"), dtype="float32"
    )
    return fingerprint_key(fp)


@dataclass
class StorageRun:
    """What a rank saw of a job whose storage failed at a step."""

    locked: list[bool]  # `AutotuneState.locked` after each step
    aside_at: int | None
    logged: list[str]  # autotune's and Optuna's log lines at WARNING and above, on this rank
    verdict: str
    frozen: bool  # the tuner stopped tuning (rank 0 knows why)


def storage_fails(
    rank: int, world_size: int, url: str, how: str, break_at: int, steps: int, pid: int = 0
) -> StorageRun:
    """Tune (native against ring) on ``url``, up to ``steps`` steps, until autotune is locked and
    unhooked for 5 steps; at ``break_at`` rank 0 breaks the storage: "corrupt"
    (its SQLite file overwritten past the header), "io" (the file may not grow: a disk full, as
    a file-size limit makes one, for the rest of the job), "gone" (SIGINT to the database
    server, process ``pid``);
    "read-only" needs nothing (``url`` opens the file read-only: it fails at the first write)."""
    logged: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            logged.append(f"{record.name}: {record.getMessage()}")

    for name in ("autotune", "optuna"):
        logging.getLogger(name).addHandler(Keep(logging.WARNING))
    torch.manual_seed(0)
    model = DDP(Net())
    config = autotune.Config(algorithms=("native", "ring"), storage=url, timeout_s=60)
    state = autotune.register(model, config)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    locked: list[bool] = []
    for step in range(steps):
        if (
            locked[-5:] == [True] * 5
            and state.unhooking is not None
            and state.unhooking.at is not None
        ):
            break  # locked and aside for 5 steps: every rank reads the same (`state.locked`)
        if step == break_at and rank == 0:
            _break(url, how, pid)
        x, y = torch.randn(8, 16), torch.randint(0, 4, (8,))
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        opt.zero_grad()
        locked.append(state.locked)
    assert state.tuner is not None
    run = StorageRun(
        locked,
        None if state.unhooking is None else state.unhooking.at,
        logged,
        state.verdict(),
        state.tuner.frozen,
    )
    state.close()
    return run


def _break(url: str, how: str, pid: int) -> None:
    path = url.removeprefix("sqlite:///").split("?")[0].removeprefix("file:")
    if how == "corrupt":
        with open(path, "r+b") as f:
            f.seek(100)  # past SQLite's header: its pages, garbage
            f.write(os.urandom(os.path.getsize(path) - 100))
    elif how == "io":
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails (EFBIG)
        size = os.path.getsize(path)
        resource.setrlimit(resource.RLIMIT_FSIZE, (size, resource.RLIM_INFINITY))
    elif how == "gone":
        os.kill(pid, signal.SIGINT)  # PostgreSQL's fast shutdown: connections closed


def sparse_beside_plain(
    rank: int, world_size: int, config: dict[str, Any], steps: int
) -> tuple[float, list[str], int | None]:
    """Train `SparseNet` with autotune and plain DDP on the same batches, up to ``steps`` steps
    (20 past the iteration autotune unhooked at, where it did: DDP's first rebuilt reducers):
    the largest relative distance between their parameters, the layout of each parameter's
    gradient after the last step, and where autotune unhooked (None: it did not).

    Stopping there is for PyTorch's sake: DDP's own sparse all-reduce on gloo corrupts the heap
    now and then without autotune (docs/FAULTS.md, "Sparse gradients"), so every step of it past
    what the test needs is a chance of a crash that is not autotune's."""
    torch.manual_seed(0)
    base = SparseNet()
    ours, plain = DDP(copy.deepcopy(base)), DDP(copy.deepcopy(base))
    state = autotune.register(ours, autotune.Config(**config))
    opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (ours, plain)]
    g = torch.Generator().manual_seed(rank)
    for step in range(steps):
        aside = None if state.unhooking is None else state.unhooking.at
        if aside is not None and step > aside + 20:  # `at`: the same iteration on every rank
            break
        ids, other = (
            torch.randint(0, 1000, (8, 5), generator=g),
            torch.randint(0, 50, (8, 3), generator=g),
        )
        y = torch.randint(0, 4, (8,), generator=g)
        for model, opt in zip((ours, plain), opts, strict=True):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(ids, other), y).backward()
            opt.step()
    layouts = [str(p.grad.layout) for p in ours.parameters() if p.grad is not None]
    rel = max(
        float((a.double() - b.double()).norm() / b.double().norm())
        for a, b in zip(ours.parameters(), plain.parameters(), strict=True)
    )
    unhooking = None if state.unhooking is None else state.unhooking.at
    state.close()
    return rel, layouts, unhooking
