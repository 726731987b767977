"""Training jobs the hook tests run on spawned ranks (importable by the ranks)."""

from __future__ import annotations

import copy
import hashlib
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import autotune
from autotune.algorithms import Comm, RingAllReduce, register
from autotune.config import Config
from autotune.ddp.stats import MessageRecord
from autotune.testing import played_nccl
from autotune.util.processes import ProcessId, state


class Net(torch.nn.Module):
    """A small MLP with a branch that some steps leave unused (for find_unused_parameters)."""

    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(16, 64)
        self.b = torch.nn.Linear(64, 64)
        self.c = torch.nn.Linear(64, 4)
        self.branch = torch.nn.Linear(64, 4)

    def forward(self, x: torch.Tensor, use_branch: bool = True) -> torch.Tensor:
        h = torch.relu(self.b(torch.relu(self.a(x))))
        out: torch.Tensor = self.c(h)
        if use_branch:
            out = out + self.branch(h)
        return out


@dataclass(frozen=True)
class Variant:
    """A DDP setting to train under, with and without the hook."""

    name: str
    ddp: dict[str, Any] = field(default_factory=dict)
    fusion_bytes: int = 0
    dtype: torch.dtype = torch.float32
    no_sync_every: int = 0  # >0: accumulate this many steps under no_sync() before each sync
    skip_branch: bool = False  # leave the branch unused on odd steps


VARIANTS = {
    v.name: v
    for v in [
        Variant("base"),
        Variant("gradient_as_bucket_view", ddp={"gradient_as_bucket_view": True}),
        Variant("static_graph", ddp={"static_graph": True}),
        Variant("find_unused_parameters", ddp={"find_unused_parameters": True}, skip_branch=True),
        Variant("small_buckets", ddp={"bucket_cap_mb": 0.002}),
        Variant("no_sync", no_sync_every=2),
        Variant("bf16", dtype=torch.bfloat16),
        Variant("fuse_small_buckets", ddp={"bucket_cap_mb": 0.002}, fusion_bytes=64 << 10),
        Variant("split_large_buckets", fusion_bytes=4096),  # the 23 KB bucket in 6 pieces
    ]
}


def digest(params: list[torch.Tensor]) -> str:
    h = hashlib.sha256()
    for p in params:
        h.update(p.detach().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


@dataclass
class Trained:
    """One (algorithm, variant) on one rank: its parameters, DDP's, and what the hook measured."""

    algorithm: str
    variant: str
    hooked: list[torch.Tensor]
    plain: list[torch.Tensor]
    messages: int
    message_bytes: int
    algorithms_used: set[str]
    plan_classes: list[int]
    #: Why register refused the algorithm (it cannot run its own schedule here), if it did:
    #: nothing was trained then.
    refused: str | None = None
    #: The largest relative difference of an averaged gradient from DDP's, over the steps that
    #: synchronise, each from the same parameters (`train_pair`).
    grad_rel: float = 0.0
    #: How many of this rank's buffers `shm` moved into shared memory, to be summed where they
    #: are (DDP's buckets, from the second iteration: `autotune.algorithms._exposed`).
    moved: int = 0


def train_pair(
    rank: int, algorithm: str, variant: Variant, steps: int = 30, device: str = "cpu"
) -> Trained:
    """Train the same model with autotune's hook and with DDP's own all-reduce, side by side.

    After each step that synchronises, DDP's model takes the hooked one's parameters and
    momentum, so every step compares the two all-reduces from the same start: trajectories
    compared over 30 steps say little of the sum, as a 1e-8 difference can flip a ReLU's gate
    (on an AVX-512 machine, `ring` under no_sync jumped from 2e-8 to 1e-4 at step 18)."""
    if device == "cuda":
        torch.cuda.set_device(rank % torch.cuda.device_count())
        device = f"cuda:{torch.cuda.current_device()}"
    torch.manual_seed(0)
    base = Net().to(variant.dtype).to(device)
    models = [DDP(copy.deepcopy(base), **variant.ddp) for _ in range(2)]
    try:
        state = autotune.register(
            models[0],
            autotune.Config(algorithm=algorithm, fusion_bytes=variant.fusion_bytes, timeout_s=60),
        )
    except ValueError as exc:
        if "cannot run its own schedule on this job" not in str(exc):
            raise
        return Trained(algorithm, variant.name, [], [], 0, 0, set(), [], str(exc))
    optimizers = [torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9) for m in models]
    moved = _moved()
    g = torch.Generator().manual_seed(100 + rank)
    grad_rel = 0.0
    hooked, plain = (list(m.parameters()) for m in models)
    for step in range(steps):
        x = torch.randn(8, 16, generator=g).to(variant.dtype).to(device)
        y = torch.randint(0, 4, (8,), generator=g).to(device)
        use_branch = not (variant.skip_branch and step % 2)
        accumulate = variant.no_sync_every and step % (variant.no_sync_every + 1) != 0
        for model in models:
            if accumulate:
                with model.no_sync():
                    torch.nn.functional.cross_entropy(model(x, use_branch).float(), y).backward()
                continue
            torch.nn.functional.cross_entropy(model(x, use_branch).float(), y).backward()
        if accumulate:
            continue
        for h, p in zip(hooked, plain, strict=True):
            if p.grad is not None and h.grad is not None:
                rel = (h.grad.double() - p.grad.double()).norm() / p.grad.double().norm()
                grad_rel = max(grad_rel, float(rel))
        for opt in optimizers:
            opt.step()
            opt.zero_grad()
        if step == steps - 1:
            break  # the last step's update is left to compare
        with torch.no_grad():
            for h, p in zip(hooked, plain, strict=True):
                p.copy_(h)
                momentum = optimizers[1].state[p].get("momentum_buffer")
                if momentum is not None:
                    momentum.copy_(optimizers[0].state[h]["momentum_buffer"])
    state.engine.settle(30)  # the engine records a message after its future completes
    records = state.recorder.records()
    state.close()
    return Trained(
        algorithm,
        variant.name,
        [p.detach().cpu().clone() for p in models[0].parameters()],
        [p.detach().cpu().clone() for p in models[1].parameters()],
        len(records),
        sum(r.nbytes for r in records),
        {r.algorithm for r in records},
        sorted(state.plan()),
        grad_rel=grad_rel,
        moved=_moved() - moved,
    )


def _moved() -> int:
    """How many of this rank's buffers `shm`'s windows have moved into shared memory so far."""
    from autotune.algorithms import _shared_memory as shm

    return sum(w.exposed.moved() for w in shm._windows.values() if w.exposed is not None)


def train_all(
    rank: int, world_size: int, algorithms: list[str], variants: list[str], device: str = "cpu"
) -> list[Trained]:
    out = [train_pair(rank, a, VARIANTS[v], device=device) for v in variants for a in algorithms]
    played_nccl.final_check()  # on the played NCCL: every launch in one order on every rank
    return out


def bf16_gradient_error(
    rank: int, world_size: int, algorithms: list[str], steps: int = 10
) -> dict[str, tuple[float, str]]:
    """Per algorithm: the worst gradient error of a bf16 model, as a multiple of the error bound.

    Each step starts the hooked model and a plain local copy from the same bf16 parameters; every
    rank's local gradient, scaled by 1/N in bf16 as DDP does, is gathered, and the hooked model's
    averaged gradient must lie within the N-term bf16 summation bound of their exact sum.
    """
    from autotune.testing.conformance import error_bound

    out = {}
    for algorithm in algorithms:
        torch.manual_seed(0)
        base = Net().to(torch.bfloat16)
        hooked = DDP(copy.deepcopy(base))
        state = autotune.register(hooked, autotune.Config(algorithm=algorithm, timeout_s=60))
        local = copy.deepcopy(base)
        opt = torch.optim.SGD(hooked.parameters(), lr=0.1, momentum=0.9)
        g = torch.Generator().manual_seed(100 + rank)
        worst = 0.0
        for _ in range(steps):
            local.load_state_dict(hooked.module.state_dict())
            x = torch.randn(8, 16, generator=g).to(torch.bfloat16)
            y = torch.randint(0, 4, (8,), generator=g)
            torch.nn.functional.cross_entropy(hooked(x).float(), y).backward()
            torch.nn.functional.cross_entropy(local(x).float(), y).backward()
            for ph, pl in zip(hooked.parameters(), local.parameters(), strict=True):
                assert ph.grad is not None and pl.grad is not None
                scaled = pl.grad * (1.0 / world_size)  # what each rank contributes
                everyone = [torch.empty_like(scaled) for _ in range(world_size)]
                dist.all_gather(everyone, scaled)
                inputs = torch.stack([e.double() for e in everyone])
                bound = error_bound(inputs.abs().sum(0), torch.bfloat16, world_size)
                err = (ph.grad.double() - inputs.sum(0)).abs()
                worst = max(worst, float((err / bound.clamp_min(1e-300)).max()))
            opt.step()
            opt.zero_grad()
            local.zero_grad()
        state.close()
        out[algorithm] = (worst, digest(list(hooked.parameters())))
    return out


def train_steps(model: torch.nn.Module, steps: int) -> None:
    """SGD on random batches: the numbers do not matter here, the traffic does."""
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(steps):
        x, y = torch.randn(8, 16), torch.randint(0, 4, (8,))
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        opt.zero_grad()


def env_default_state(rank: int, world_size: int) -> tuple[set[str], int | None, str]:
    """register_comm_hook(None, autotune.hook): the state comes from AUTOTUNE_* variables."""
    from autotune.comm_hook import reset_default_state

    torch.manual_seed(0)
    model = DDP(Net(), bucket_cap_mb=0.002)
    model.register_comm_hook(None, autotune.hook)
    state = autotune.default_state()  # built before training, on every rank
    train_steps(model, 5)
    assert autotune.default_state() is state
    state.engine.settle(30)
    used = {r.algorithm for r in state.recorder.records()}
    fusion = state.config.fusion_bytes
    reset_default_state()
    return used, fusion, os.environ["AUTOTUNE_ALGORITHM"]


def register_twice(rank: int, world_size: int, first: str = "autotune") -> str:
    """Register autotune on a model that has a comm hook already: autotune's own (``first``
    "autotune") or PyTorch's ``allreduce_hook``: the error."""
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    model = DDP(Net())
    config = autotune.Config(algorithm="ring")
    state = None
    if first == "autotune":
        state = autotune.register(model, config)
    else:
        model.register_comm_hook(None, allreduce_hook)
    try:
        autotune.register(model, config)
    except RuntimeError as exc:
        return str(exc)
    finally:
        if state is not None:
            state.close()
    return "no error"


def register_refused(rank: int, world_size: int, algorithm: str, plan_file: str | None) -> str:
    """Register ``algorithm`` (or ``plan_file``) where it cannot run: the error, every rank."""
    model = DDP(Net())
    config = autotune.Config(algorithm=algorithm, plan_file=plan_file, timeout_s=60)
    try:
        state = autotune.register(model, config)
    except ValueError as exc:
        return str(exc)
    state.close()
    return "no error"


def hook_without_state(rank: int, world_size: int) -> str:
    """register_comm_hook(None, autotune.hook) and no default_state(): backward says what to do."""
    model = DDP(Net())
    model.register_comm_hook(None, autotune.hook)
    try:
        train_steps(model, 1)
    except RuntimeError as exc:
        return str(exc)
    return "no error"


def python_reducer(rank: int, world_size: int) -> str:
    """DDP on its Python reducer (compiled autograd's mode) is refused before anything is built."""
    import torch._dynamo

    with torch._dynamo.config.patch(optimize_ddp="python_reducer"):
        model = DDP(Net())
    try:
        autotune.register(model)
    except RuntimeError as exc:
        return str(exc)
    return "no error"


class RaisesOnCulprit(RingAllReduce):
    """A ring that raises on one rank at its fifth message: a rank's own failure, not a peer's."""

    name = "raises_on_culprit"
    culprit = -1
    calls = 0

    def _run(self, buf: torch.Tensor, comm: Comm, segment_elems: int) -> None:
        RaisesOnCulprit.calls += 1
        if dist.get_rank() == self.culprit and RaisesOnCulprit.calls == 5:
            raise ValueError("deliberate failure inside the algorithm")
        super()._run(buf, comm, segment_elems)


@dataclass
class Fault:
    """What a surviving rank saw: the error backward() raised, its fields, and how long it took."""

    step: int
    kind: str
    rank: int | None
    algorithm: str | None
    message: str
    seconds: float


def until_gone(pid: int) -> None:
    """Return once process ``pid`` of this host has exited (a zombie counts) and gloo's loop
    has read its closed connections: a send or receive to it now fails as it is posted."""
    while state(ProcessId.of(pid)) != "exited":
        time.sleep(0.01)
    time.sleep(1.0)


def faulty_training(
    rank: int, world_size: int, algorithm: str, fault: str, culprit: int, timeout_s: float
) -> Fault:
    """Train; at step 5 ``culprit`` exits ("exit"), hangs ("stall") or its algorithm raises
    ("raise": ``algorithm`` is replaced by `RaisesOnCulprit`). "exit_seen": the culprit exits,
    and the others step on once its process is gone and gloo has seen its connections close."""
    if fault == "raise":
        RaisesOnCulprit.culprit = culprit
        register(RaisesOnCulprit.name, RaisesOnCulprit)
        algorithm = RaisesOnCulprit.name
    torch.manual_seed(0)
    model = DDP(Net())
    autotune.register(model, autotune.Config(algorithm=algorithm, timeout_s=timeout_s))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(100):
        if rank == culprit and step == 5 and fault in ("exit", "exit_seen"):
            dist.distributed_c10d._get_default_store().set("culprit", str(os.getpid()))
            os._exit(17)
        if step == 5 and fault == "exit_seen":
            until_gone(int(dist.distributed_c10d._get_default_store().get("culprit")))
        if rank == culprit and step == 5 and fault == "stall":
            time.sleep(3 * timeout_s)  # long past the others' timeout; then gone
            os._exit(18)
        start = time.monotonic()
        try:
            torch.nn.functional.cross_entropy(
                model(torch.randn(8, 16)), torch.randint(0, 4, (8,))
            ).backward()
        except RuntimeError as exc:
            return Fault(
                step,
                type(exc).__name__,
                getattr(exc, "rank", None),
                getattr(exc, "algorithm", None),
                str(exc),
                time.monotonic() - start,
            )
        opt.step()
        opt.zero_grad()
    return Fault(-1, "none", None, None, "finished without noticing", 0.0)


def setup_with_env(
    rank: int, world_size: int, env: dict[str, str], how: str = "register"
) -> tuple[str, str, float]:
    """Rank 1 sets ``env`` before building a state ``how`` a job may build one ("register",
    "default_state", "attach": a framework's integration, where the framework registered the hook
    with no state): the error each rank raises, and when."""
    if rank == 1:
        os.environ.update(env)
    ddp = DDP(Net())
    start = time.monotonic()
    try:
        # Each way reads AUTOTUNE_* itself.
        if how == "register":
            autotune.register(ddp).close()
        elif how == "default_state":
            autotune.default_state()
            autotune.reset_default_state()
        else:
            from autotune.frameworks import attach, detach

            ddp.register_comm_hook(None, autotune.hook)
            detach(attach(ddp))
    except (RuntimeError, ValueError) as exc:
        return type(exc).__name__, str(exc), time.monotonic() - start
    return "none", "", time.monotonic() - start


class GatedRing(RingAllReduce):
    """A ring whose first message of a step waits for `gate`: opened late in backward by a
    gradient hook, so it can only open if backward ran on while the message was pending."""

    name = "gated_ring"
    gate: ClassVar[threading.Event] = threading.Event()
    waiting: ClassVar[threading.Event] = threading.Event()  # a message is at the gate
    #: Per gated message: whether the gate opened (False: it timed out).
    opened: ClassVar[list[bool]] = []

    def _run(self, buf: torch.Tensor, comm: Comm, segment_elems: int) -> None:
        if not self.gate.is_set():
            self.waiting.set()
            self.opened.append(self.gate.wait(30))
        super()._run(buf, comm, segment_elems)


def overlap_events(rank: int, world_size: int) -> tuple[list[bool], bool, int]:
    """One backward with a gated first message and a late gradient hook that waits for it.

    Returns whether each gated message saw its gate open (it cannot, if the hook ran messages on
    the autograd thread), whether the late hook saw a message complete while backward was still
    running (it cannot, if messages only ran after backward), and the step's message count.
    """
    register("gated_ring", GatedRing)
    torch.manual_seed(0)
    first = torch.nn.Linear(64, 64)
    model = torch.nn.Sequential(first, *[torch.nn.Linear(64, 64) for _ in range(5)])
    ddp = DDP(model, bucket_cap_mb=0.01)  # about one layer per bucket
    state = autotune.register(ddp, autotune.Config(algorithm="gated_ring", timeout_s=60))
    x = torch.randn(32, 64)
    GatedRing.gate.set()
    ddp(x).square().mean().backward()  # DDP rebuilds its buckets after the first step
    GatedRing.gate.clear()
    done = threading.Event()
    state.engine.subscribe(lambda event: done.set() if isinstance(event, MessageRecord) else None)
    seen: list[bool] = []

    def late(grad: torch.Tensor) -> torch.Tensor:
        # A message must be waiting at the gate while backward is here; then let it through
        # and wait for it to complete, still inside backward.
        seen.append(GatedRing.waiting.wait(30))
        GatedRing.gate.set()
        seen.append(done.wait(30))
        return grad

    handle = first.weight.register_hook(late)  # the first layer's gradient comes last
    ddp(x).square().mean().backward()
    handle.remove()
    state.engine.settle(30)
    messages = sum(r.iteration == 1 for r in state.recorder.records())
    state.close()
    return GatedRing.opened, seen == [True, True], messages


def records(rank: int, world_size: int, algorithms: list[str]) -> dict[str, Any]:
    """What the hook recorded for a few steps of each algorithm."""
    out: dict[str, Any] = {}
    for algorithm in algorithms:
        torch.manual_seed(0)
        model = DDP(Net(), bucket_cap_mb=0.002)
        state = autotune.register(model, autotune.Config(algorithm=algorithm, timeout_s=60))
        train_steps(model, 6)
        state.engine.settle(30)
        out[algorithm] = (
            state.recorder.records(),
            state.stats(),
            state.plan(),
            state.recorder.hook_times(),
        )
        state.close()
    return out


def compiled_training(
    rank: int,
    world_size: int,
    algorithm: str | None,
    backend: str,
    compiled_autograd: bool,
    settings: dict[str, Any] | None = None,
    steps: int = 30,
) -> dict[str, Any]:
    """``steps`` of ``torch.compile(ddp_model)`` (DDP's graph-splitting optimizer at its
    buckets), with autotune's hook (``algorithm``, and other Config ``settings``) or without
    (None); ``compiled_autograd`` on or not."""
    import torch._dynamo

    torch._dynamo.reset()
    torch.manual_seed(0)
    net = torch.nn.Sequential(
        torch.nn.Linear(16, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512), torch.nn.ReLU(),
        torch.nn.Linear(512, 512), torch.nn.ReLU(), torch.nn.Linear(512, 4),
    )  # fmt: skip
    # 2.1 MB of gradients in 1 MiB buckets: the graph splits between them. (DDP's graph
    # optimizer wants its first, 1 MiB, bucket no larger than the others.)
    model = DDP(net, bucket_cap_mb=1)
    state = (
        None
        if algorithm is None
        else autotune.register(model, Config(algorithm=algorithm, **(settings or {})))
    )
    compiled = torch.compile(model, backend=backend)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(rank)
    with torch._dynamo.config.patch(compiled_autograd=compiled_autograd):
        for _ in range(steps):
            x, y = torch.randn(8, 16, generator=g), torch.randint(0, 4, (8,), generator=g)
            torch.nn.functional.cross_entropy(compiled(x), y).backward()
            opt.step()
            opt.zero_grad()
    out: dict[str, Any] = {"parameters": [p.detach().clone() for p in model.parameters()]}
    if state is not None:
        state.engine.settle(timeout_s=10.0)
        out["messages"] = len(state.recorder.records())
        out["iterations"] = state.engine.iteration
        out["aside_at"] = None if state.unhooking is None else state.unhooking.at
        out["hook_calls"] = len(state.recorder.hook_calls())
        state.close()
    return out


def frameworks_attach(rank: int, world_size: int) -> dict[str, Any]:
    """autotune.frameworks on a DDP model inside torch.compile's wrapper, with autotune.hook
    registered with no state (as Lightning does on CUDA): attach builds the default state."""
    from autotune.comm_hook import is_default_state
    from autotune.frameworks import attach, detach, find_ddp, log_values

    model = DDP(Net())
    model.register_comm_hook(None, autotune.hook)
    wrapped = torch.compile(model)  # only wrapped: nothing compiles until it is called
    out: dict[str, Any] = {"found": find_ddp(wrapped) is model}
    state = attach(wrapped)
    out["default"] = is_default_state(state)
    try:
        attach(model, Config(algorithm="ring"))
    except ValueError as exc:
        out["with_config"] = str(exc)
    train_steps(model, 3)
    state.engine.settle(timeout_s=10.0)
    out["messages"] = len(state.recorder.records())
    out["values"] = log_values(state)
    detach(state)
    out["default_after"] = is_default_state(state)
    try:
        find_ddp(torch.nn.Sequential(torch.nn.Linear(2, 2)))
    except TypeError as exc:
        out["not_ddp"] = str(exc)
    return out


def oversubscription_warnings(rank: int, world_size: int) -> list[str]:
    """Two steps of a small model with the hook fixed on native; the warnings about this host's
    cores (autotune.util.cores) that this rank logged."""
    import logging

    seen: list[str] = []

    class Catch(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if "intra-op threads" in record.getMessage():
                seen.append(record.getMessage())

    catch = Catch()
    logging.getLogger("autotune").addHandler(catch)
    try:
        model = DDP(Net())
        state = autotune.register(model, Config(algorithm="native"))
        for _ in range(2):
            model(torch.randn(8, 16)).sum().backward()
        state.close()
    finally:
        logging.getLogger("autotune").removeHandler(catch)
    return seen


def refused_leaves_nothing(rank: int, world_size: int, config: dict[str, Any]) -> list[str]:
    """Build a state ``config`` makes fail partway through its parts (`autotune.wiring.build`):
    the threads it left running, by name (none, where the parts built were closed)."""
    before = set(threading.enumerate())
    model = DDP(Net())
    try:
        state = autotune.register(model, autotune.Config(timeout_s=60, **config))
    except (ValueError, RuntimeError):
        pass
    else:
        state.close()
        return ["no error"]
    return sorted(t.name for t in threading.enumerate() if t not in before and t.is_alive())
