"""Where autotune's traffic runs: a dedicated process group per DDP group, this rank's place in it,
the backend it uses per device, and the error every wait on it turns a failure into.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TypeVar

import torch
import torch.distributed as dist
from torch.distributed import ProcessGroup

W = TypeVar("W")

__all__ = [
    "Comm",
    "PeerError",
    "Traffic",
    "backend_for",
    "backend_name",
    "bookkeeping_device",
    "connect",
    "connection_failed",
    "current_device",
    "ensure_ready",
    "forget_p2p_group",
    "group_timeout",
    "host_backend",
    "on_forget",
    "p2p_group",
    "sibling_group",
]


class PeerError(RuntimeError):
    """A peer failed, stalled past the timeout, or the group broke, during an all-reduce.

    ``rank``: the (global) rank that failed first, as far as this rank could learn it (None:
    unknown); ``algorithm``: what was running; ``peer``: the rank the failed operation waited on,
    which is not always the culprit (gloo fails every pending operation once one peer dies).
    """

    def __init__(
        self,
        message: str,
        *,
        rank: int | None = None,
        algorithm: str | None = None,
        peer: int | None = None,
    ) -> None:
        super().__init__(message)
        self.rank = rank
        self.algorithm = algorithm
        self.peer = peer

    def __reduce__(self) -> tuple[object, ...]:
        # Keep the fields through pickling (a rank's error travels to its launcher).
        return (_rebuild_peer_error, (str(self), self.rank, self.algorithm, self.peer))


def _rebuild_peer_error(
    message: str, rank: int | None, algorithm: str | None, peer: int | None
) -> PeerError:
    return PeerError(message, rank=rank, algorithm=algorithm, peer=peer)


@dataclass(slots=True)
class Traffic:
    """What this rank sent in one all-reduce, how long it waited for its peers, and where the
    sum was left if not in the input.

    Zero and None for algorithms the backend runs itself (`native`): nothing is observable.
    """

    bytes_sent: int = 0
    messages_sent: int = 0
    #: Seconds the first receive kept this rank waiting: long when a peer came late.
    first_wait_s: float | None = None
    #: Seconds this rank was blocked on its peers in all (every receive, every barrier): the
    #: rest of the message's time is its own copies and sums (`step_gain.py --breakdown`).
    wait_s: float = 0.0
    #: Where the sum was left, where it is not in the input (`Comm.leave_within`).
    result: torch.Tensor | None = None


@dataclass(frozen=True, slots=True)
class Comm:
    """Where and how an algorithm talks: the dedicated group, this rank's place in it, limits."""

    group: ProcessGroup
    rank: int
    size: int
    backend: str
    algorithm: str
    timeout: timedelta | None
    traffic: Traffic = field(default_factory=Traffic)
    collective: str = "all-reduce"  # what the algorithm does, for errors
    #: Multiply each rank's input by this as it is first copied (`folds_scale` algorithms).
    scale: float | None = None
    #: The caller may take the sum where the algorithm leaves it, if it stays there while this
    #: many more bytes of messages go through the algorithm on the group (`leaves_result`
    #: algorithms; None: the sum goes into the input, as always).
    leave_within: int | None = None

    def global_rank(self, peer: int) -> int:
        return dist.get_global_rank(self.group, peer)

    def again(self, scale: float | None = None, leave_within: int | None = None) -> Comm:
        """The same connection for another message: no traffic yet, with ``scale`` and
        ``leave_within``. (Built field by field: `dataclasses.replace` costs several times
        as much, and an algorithm's `start` makes one per message.)"""
        return Comm(
            self.group,
            self.rank,
            self.size,
            self.backend,
            self.algorithm,
            self.timeout,
            Traffic(),
            self.collective,
            scale,
            leave_within,
        )

    def wait(self, work: dist.Work, what: str, peer: int | None = None) -> None:
        """Wait for ``work``; a failure or timeout becomes a `PeerError` saying what was pending
        (``peer``: the group rank it waited on, if one)."""
        try:
            if self.timeout is None:
                work.wait()
            else:
                work.wait(self.timeout)
        except RuntimeError as exc:
            limit = "the process group's timeout" if self.timeout is None else f"{self.timeout}"
            raise PeerError(
                f"{self.algorithm} {self.collective}: {what} failed or did not finish within "
                f"{limit}: {exc}",
                algorithm=self.algorithm,
                peer=None if peer is None else self.global_rank(peer),
            ) from exc

    def posted(self, launch: Callable[[], W], what: str, peer: int | None = None) -> W:
        """``launch()``'s result; a launch the connection fails becomes a `PeerError`, as a
        failed `wait` does. gloo fails a send or receive at once where its connection to the
        peer has already closed, and NCCL a launch on a communicator a peer's failure broke:
        the peer failed, not this rank (``peer``: the group rank launched to, if one). Any
        other error (a bad argument) is this rank's own and is raised as it is."""
        try:
            return launch()
        except PeerError:
            raise
        except RuntimeError as exc:
            if not connection_failed(exc):
                raise
            raise PeerError(
                f"{self.algorithm} {self.collective}: launching {what} failed: {exc}",
                algorithm=self.algorithm,
                peer=None if peer is None else self.global_rank(peer),
            ) from exc

    def run(
        self, launch: Callable[[], dist.Work | None], what: str, peer: int | None = None
    ) -> None:
        """Launch an asynchronous collective (`posted`) and wait for it (`wait`)."""
        work = self.posted(launch, what, peer)
        assert work is not None
        self.wait(work, what, peer)

    def smallest(self, value: int, what: str) -> int:
        """The smallest of every rank's ``value`` (collective over the group); ``what``: what
        the ranks agree on, for the error if a peer fails."""
        t = torch.tensor([value], dtype=torch.int64)
        op = dist.ReduceOp.MIN
        self.run(lambda: dist.all_reduce(t, op=op, group=self.group, async_op=True), what)
        return int(t.item())


def connection_failed(error: BaseException) -> bool:
    """Whether ``error`` is the backend's word that a connection or communicator failed:
    torch's `dist.DistError` (NCCL's errors, the store's), or gloo's transport, which raises a
    plain RuntimeError naming its source (``gloo/transport/tcp/pair.cc``)."""
    return isinstance(error, dist.DistError) or "gloo/transport/" in str(error)


#: Backends registered to stand in for another, by name: autotune treats each as the one it plays
#: (`autotune.testing.played_nccl` plays NCCL on CPU tensors for the suite).
STAND_INS: dict[str, str] = {"played_nccl": "nccl"}


def backend_name(group: ProcessGroup) -> str:
    """``group``'s backend as ``dist.get_backend`` names it, a stand-in as the one it plays."""
    name = str(dist.get_backend(group))
    return STAND_INS.get(name, name)


def backend_for(group: ProcessGroup, device: torch.device) -> str:
    """Name the backend ``group`` uses for tensors on ``device`` ("gloo", "nccl", ...)."""
    # get_backend_config reads like "cpu:gloo,cuda:nccl"; a single-backend group lists both devices.
    config = dist.get_backend_config(group)
    for entry in config.split(","):
        device_type, _, backend = entry.partition(":")
        if backend and device_type == device.type:
            return STAND_INS.get(backend, backend)
    if ":" not in config:
        return STAND_INS.get(config, config)
    raise ValueError(
        f"process group backend {config!r} has no backend for {device.type} tensors; "
        f"initialise the group with a backend for {device.type} (e.g. 'cpu:gloo,cuda:nccl')"
    )


def current_device() -> torch.device:
    """The device this process works on: the current CUDA device once CUDA is in use (as a job
    on NCCL has it before DDP), else the CPU."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def bookkeeping_device(group: ProcessGroup, device: torch.device) -> torch.device:
    """Where small control tensors (timings, codes, barriers) travel over ``group``: the CPU
    where the group has a CPU backend (gloo), else ``device``, the data's own."""
    try:
        backend_for(group, torch.device("cpu"))
    except ValueError:
        return device
    return torch.device("cpu")


_p2p_lock = threading.Lock()
#: (base group's name, channel) -> its dedicated group.
_p2p_groups: dict[tuple[str, int], ProcessGroup] = {}
_p2p_world: list[ProcessGroup | None] = [None]
#: Names of the dedicated groups `forget_p2p_group` dropped (aborted after a failure).
_p2p_dropped: set[str] = set()


def group_timeout(group: ProcessGroup) -> timedelta | None:
    """The timeout ``group`` was made with, if its backend says (torch has no public accessor)."""
    for device in group._device_types:
        options = getattr(group._get_backend(device), "options", None)
        timeout = getattr(options, "_timeout", None)
        if isinstance(timeout, timedelta):
            return timeout
    return None


def p2p_group(
    group: ProcessGroup | None = None, timeout: timedelta | None = None, channel: int = 0
) -> ProcessGroup:
    """Return the dedicated point-to-point group for ``group`` (None: the world), made on first use.

    Traffic of ours never shares a communicator with DDP's or the user's collectives, so tags and
    collective order cannot collide. Creation is collective over the members of ``group`` (not the
    whole world), so every member must reach its first all-reduce on ``group`` in the same order;
    it waits ``timeout`` for them (None: ``group``'s own timeout), then raises `PeerError`.

    ``channel``: which of ``group``'s dedicated groups. Callers that may run at once over the same
    group take one each (every `AutotuneState` its own: two hooked models in one backward
    otherwise interleave their messages on one group, where gloo takes one's for the other's);
    0 is the one an algorithm called directly uses. A dedicated group passed as ``group`` is
    returned as it is.
    """
    world = dist.group.WORLD
    base = world if group is None else group
    assert base is not None, "the default process group is not initialised"
    with _p2p_lock:
        if _p2p_world[0] is not world:  # a new world (init after destroy): old groups are gone
            _p2p_groups.clear()
            _p2p_dropped.clear()
            _p2p_world[0] = world
        if base.group_name in {g.group_name for g in _p2p_groups.values()}:  # already one of ours
            return base
        if base.group_name in _p2p_dropped:
            # A message started after the failure, on the group it aborted: building a group
            # for it now would wait on peers that are gone (10 s, at times, before the error).
            raise PeerError(
                f"autotune's group {base.group_desc} was aborted after a failure: nothing more "
                "runs on it"
            )
        dedicated = _p2p_groups.get((base.group_name, channel))
        if dedicated is None:
            ranks = dist.get_process_group_ranks(base)
            limit = timeout or group_timeout(base)
            try:
                made = sibling_group(base, f"p2p{channel or ''}", limit)
            except RuntimeError as exc:  # DistStoreError, gloo connect errors
                raise PeerError(
                    f"setting up the point-to-point group over ranks {ranks} failed within "
                    f"{limit}: a rank did not reach its first all-reduce on this group ({exc})"
                ) from exc
            dedicated = _p2p_groups[(base.group_name, channel)] = made
        return dedicated


def sibling_group(
    group: ProcessGroup, purpose: str, timeout: timedelta | None, *, host: bool = False
) -> ProcessGroup:
    """A new group of ``group``'s ranks and backend for autotune's ``purpose`` (its description:
    ``autotune_<purpose>:<group name>``), whose collectives give up after ``timeout`` (None:
    torch's default for the backend). Made collectively over ``group``'s members only.

    ``host``: on gloo for CPU tensors whatever ``group`` runs, for what autotune exchanges
    from a thread of its own (see `host_backend`)."""
    made = dist.new_group(
        ranks=dist.get_process_group_ranks(group),
        backend=host_backend(group) if host else dist.get_backend_config(group),
        timeout=timeout,
        use_local_synchronization=True,
        group_desc=f"autotune_{purpose}:{group.group_name}",
    )
    assert isinstance(made, ProcessGroup)
    return made


def host_backend(group: ProcessGroup) -> str:
    """The backend for what autotune exchanges over ``group``'s ranks from a thread of its own
    (the tuner's window, on the completing thread): ``group``'s own where it runs CPU tensors
    on gloo, else gloo.

    NCCL's kernels wait for their peers, so every rank must launch on its communicators in one
    order; a launch from autotune's completing thread races the job's own launches from the
    autograd thread, and would win on one rank and lose on another (NVIDIA/nccl#195). Host
    traffic on gloo orders nothing on the GPU: NCCL carries the gradients alone."""
    try:
        if backend_for(group, torch.device("cpu")) == "gloo":
            return dist.get_backend_config(group)
    except ValueError:
        pass
    return "gloo"


def forget_p2p_group(group: ProcessGroup | None = None, channel: int = 0) -> ProcessGroup | None:
    """Drop the dedicated group made for ``group`` (None: the world) on ``channel`` and return it,
    if any: after a failure aborted it, the next `p2p_group` call for ``group`` makes a fresh one,
    and one for the dropped group itself raises `PeerError` (nothing new is built on the failure
    path)."""
    base = dist.group.WORLD if group is None else group
    assert base is not None
    with _p2p_lock:
        dropped = _p2p_groups.pop((base.group_name, channel), None)
        if dropped is not None:
            _p2p_dropped.add(dropped.group_name)
            _connected.clear()
    if dropped is not None:
        for forget in _on_forget:
            forget(dropped)
    return dropped


#: What else holds state per dedicated group (shared-memory windows): told when one is dropped.
_on_forget: list[Callable[[ProcessGroup], None]] = []


def on_forget(callback: Callable[[ProcessGroup], None]) -> None:
    """Call ``callback(group)`` whenever `forget_p2p_group` drops a dedicated group."""
    _on_forget.append(callback)


def connect(
    group: ProcessGroup | None,
    device: torch.device,
    algorithm: str,
    timeout: timedelta | None,
    collective: str = "all-reduce",
    *,
    dedicated: bool = True,
) -> Comm:
    """Where ``algorithm`` talks for ``group``: its dedicated group (or, ``dedicated`` False,
    ``group`` itself), this rank, the backend. Looked up once per (group, device, algorithm,
    timeout, collective), then kept (`_connected`) until the world or a dedicated group goes:
    every message an algorithm starts asks."""
    world = dist.group.WORLD
    base = world if group is None else group
    key = (base, device, algorithm, timeout, collective, dedicated)
    if _connected_world[0] is not world:
        _connected.clear()
        _connected_world[0] = world
    kept = _connected.get(key)
    if kept is None:
        kept = _connected[key] = _connect(group, device, algorithm, timeout, collective, dedicated)
    return kept.again()


#: What `connect` found, by what it was asked; cleared for a new world and whenever
#: `forget_p2p_group` drops a dedicated group (a message after that must not reach it).
_connected: dict[tuple[object, ...], Comm] = {}
_connected_world: list[ProcessGroup | None] = [None]


def _connect(
    group: ProcessGroup | None,
    device: torch.device,
    algorithm: str,
    timeout: timedelta | None,
    collective: str,
    dedicated: bool,
) -> Comm:
    if group is not None and dist.get_rank(group) < 0:
        raise ValueError(f"this rank is not a member of the process group passed to {collective}")
    if not dedicated:
        base = dist.group.WORLD if group is None else group
        assert base is not None, "the default process group is not initialised"
        return Comm(
            base,
            dist.get_rank(base),
            dist.get_world_size(base),
            backend_for(base, device),
            algorithm,
            timeout,
            collective=collective,
        )
    try:
        dedicated_group = p2p_group(group, timeout)
    except PeerError as exc:
        raise PeerError(f"{algorithm} {collective}: {exc}", algorithm=algorithm) from exc.__cause__
    return Comm(
        dedicated_group,
        dist.get_rank(dedicated_group),
        dist.get_world_size(dedicated_group),
        backend_for(dedicated_group, device),
        algorithm,
        timeout,
        collective=collective,
    )


_ready: set[tuple[str, str]] = set()


def ensure_ready(comm: Comm, device: torch.device) -> None:
    """Bring up a NCCL communicator with a collective before the first batched P2P call.

    torch requires every rank of a NCCL group to take part in its first batched P2P call, and a
    tree's first round leaves some ranks idle. All ranks call this at their first all-reduce on
    the group, so the one-element all-reduce lines up everywhere.
    """
    if comm.backend != "nccl":
        return
    key = (comm.group.group_name, str(device))
    if key in _ready:
        return
    zero = torch.zeros(1, device=device)
    comm.run(
        lambda: dist.all_reduce(zero, group=comm.group, async_op=True),
        "the NCCL communicator's first collective",
    )
    _ready.add(key)
