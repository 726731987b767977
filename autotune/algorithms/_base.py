"""The all-reduce contract every algorithm implements, and the input checks they all share."""

from __future__ import annotations

import abc
import zlib
from collections.abc import Callable, Mapping
from datetime import timedelta
from typing import TYPE_CHECKING, ClassVar

import torch
import torch.distributed as dist
from torch.distributed import ProcessGroup

from autotune.algorithms._threads import one_thread
from autotune.comm.groups import Comm, Traffic, connect, ensure_ready

if TYPE_CHECKING:
    from autotune.algorithms._choice import Choice

__all__ = ["SUPPORTED_DTYPES", "AllReduceAlgorithm", "Pending", "at_storage_start"]

SUPPORTED_DTYPES: tuple[torch.dtype, ...] = (
    torch.float32,
    torch.float64,
    torch.float16,
    torch.bfloat16,
)


class Pending:
    """An all-reduce that `AllReduceAlgorithm.start` began: `wait` returns once it is done.

    Waiting twice is harmless; a failure (a dead or stalled peer) raises from `wait`.
    ``traffic`` is what this rank sent for it (complete once done); None where the backend runs
    the collective itself (`native`) and nothing is observable. ``future`` is the backend's own
    future for the collective, where it has one (`native`): its callbacks run as soon as the data
    is in, on the backend's thread; `wait` is still what reports a failure.
    """

    __slots__ = ("_wait", "future", "traffic")

    def __init__(
        self,
        wait: Callable[[], None] | None = None,
        traffic: Traffic | None = None,
        future: torch.futures.Future[list[torch.Tensor]] | None = None,
    ) -> None:
        self._wait = wait
        self.traffic = traffic
        self.future = future

    @property
    def done(self) -> bool:
        """Whether the all-reduce had already finished when `start` returned (or was waited on)."""
        return self._wait is None

    def wait(self) -> None:
        wait, self._wait = self._wait, None
        if wait is not None:
            wait()


class AllReduceAlgorithm(abc.ABC):
    """An in-place SUM all-reduce over a process group, built on point-to-point operations.

    `all_reduce` (or `start`) is the public entry: it checks the input, finds the dedicated
    point-to-point group, stages CUDA tensors through pinned host memory where the backend cannot
    send them (gloo), and calls `_run`. Subclasses implement `_run` (and may override `_start`
    to return before the data has moved); it is called on every rank of the group, in the
    same order, with a flat, contiguous, non-empty buffer and a world of at least two ranks, and
    must leave every rank with bitwise-identical values (reduce each element on one rank, then
    copy it).

    Example::

        >>> algo = autotune.algorithms.get_algorithm("ring")
        >>> algo.all_reduce(grad, segment_bytes=1 << 20)  # grad now holds the sum over ranks
    """

    #: Registry name, used in errors and metrics.
    name: ClassVar[str]
    #: Whether ``segment_bytes`` changes what the algorithm does (the tuner searches it only then).
    segmented: ClassVar[bool] = True
    #: Pipeline segment used when the caller gives none.
    default_segment_bytes: ClassVar[int] = 4 << 20
    #: The algorithm whose schedule this one runs where the nodes give it nothing to use (one
    #: node, or one rank per node); the tuner then leaves this one out. None: not topology-aware.
    flat_twin: ClassVar[str | None] = None
    #: Whether `start` only launches work the backend runs by itself (so it is cheap to call
    #: from any thread, and returns before the data has moved). Such an algorithm gets CUDA
    #: tensors as they are on gloo too (gloo's collectives take them; its send/recv do not),
    #: where one driven from Python runs on a pinned host copy.
    asynchronous: ClassVar[bool] = False
    #: Whether "auto" considers this algorithm without being told (`Config.algorithms` None),
    #: beside the built-ins, wherever `offered` says it can run.
    joins_auto: ClassVar[bool] = False
    #: Where it can run at all, as backend/device: what ``autotune algorithms`` checks against
    #: this machine (`offered` decides for a given group, collectively).
    runs_on: ClassVar[tuple[str, ...]] = ("gloo/cpu", "gloo/cuda", "nccl/cuda")
    #: What else it needs to run its own schedule, in a few words, for the error that refuses
    #: it where `offered` says no ("" : nothing beyond `runs_on`).
    needs: ClassVar[str] = ""
    #: Whether it applies a ``scale`` (`start`) itself, in a copy of the input it makes anyway
    #: (``Comm.scale``); otherwise `start` scales the input in place first.
    folds_scale: ClassVar[bool] = False
    #: Whether it may leave the sum in memory of its own for a caller that takes it there
    #: (`start`'s ``leave_within``: `shm`, whose sums are in its shared window anyway).
    leaves_result: ClassVar[bool] = False
    #: Who runs it without the hook, once autotune unhooks, from the plan handed to it (`carry`):
    #: autotune-nccl's cells, through NCCL's tuner plugin's table. None: only the hook runs it.
    carrier: ClassVar[str | None] = None

    @classmethod
    def carry(cls, classes: Mapping[int, Choice], ranks: int) -> str:
        """Hand ``classes`` (size class -> a choice of an algorithm of this `carrier`) to the
        backend, so that its own all-reduce runs them from now on, for jobs of ``ranks`` ranks;
        say what it now runs, in a few words. Called on every rank, between iterations, as
        autotune unhooks (`autotune.algorithms.carry`)."""
        raise NotImplementedError(f"{cls.name} has no carrier: only the hook runs it")

    @classmethod
    def offered(cls, group: ProcessGroup, device: torch.device) -> bool:
        """Whether this algorithm runs its own schedule on ``group`` for ``device`` tensors.

        Every rank calls it, for the same algorithms in the same order, so it may run a
        collective to find out (`autotune.algorithms.agreed` keeps what every rank offers).
        Where an algorithm would silently run something else (a backend that ignores what it
        asks for), it says no, so the tuner never times one schedule under two names."""
        return True

    def __init__(self, *, timeout_s: float | None = None) -> None:
        """``timeout_s``: how long to wait for a peer before raising; None: the group's timeout."""
        if timeout_s is not None and not timeout_s > 0:
            raise ValueError(f"timeout_s must be a positive number of seconds, got {timeout_s!r}")
        self.timeout_s = timeout_s

    def all_reduce(
        self,
        tensor: torch.Tensor,
        group: ProcessGroup | None = None,
        *,
        segment_bytes: int | None = None,
        scale: float | None = None,
    ) -> None:
        """Sum ``tensor`` over ``group`` in place; on return (CPU) every rank holds the same sum.

        On CUDA the result is ordered on the current stream. ``segment_bytes`` is the pipeline
        segment (rounded down to whole elements, at least one); None uses the algorithm's default.
        ``scale``: sum ``tensor * scale`` instead, bitwise as ``tensor.mul_(scale)`` first would
        (the hook's 1/N, which an algorithm that copies its input anyway folds into that copy).
        """
        self.start(tensor, group, segment_bytes=segment_bytes, scale=scale).wait()

    def start(
        self,
        tensor: torch.Tensor,
        group: ProcessGroup | None = None,
        *,
        segment_bytes: int | None = None,
        scale: float | None = None,
        leave_within: int | None = None,
    ) -> Pending:
        """Begin `all_reduce`; the sum is in ``tensor`` once the returned `Pending` is waited on.

        Algorithms driven from Python finish before returning; one the backend runs itself
        (`native`) returns while its collective is in flight, so a caller can start the next.

        ``leave_within`` (`leaves_result` algorithms): the caller takes the sum where the
        algorithm leaves it, ``Pending.traffic.result`` where that is not ``tensor`` (``tensor``
        then holds what it held, scaled or not), provided it stays there while this many more
        bytes of messages go through the algorithm on the group. It saves a pass over the
        message where the caller copies the sum on anyway (DDP copies a hook's result into the
        gradients).
        """
        check_tensor(tensor)
        segment_bytes = self.default_segment_bytes if segment_bytes is None else segment_bytes
        check_segment_bytes(segment_bytes)
        comm = self.connect(group, tensor.device)
        size, backend = comm.size, comm.backend
        if dist.get_debug_level() == dist.DebugLevel.DETAIL:
            _check_same_call(tensor, segment_bytes, self.name, comm)
        flat = tensor.view(-1)
        fold = scale is not None and self.folds_scale and size > 1 and not flat.is_cuda
        if scale is not None and not fold:
            with torch.no_grad():
                flat.mul_(scale)
        if fold or leave_within is not None:
            leave = leave_within if self.leaves_result and not flat.is_cuda else None
            comm = comm.again(scale if fold else None, leave)
        # What this rank sends is ours to count, unless the backend runs the whole collective.
        traffic = None if self.asynchronous else comm.traffic
        if size == 1 or tensor.numel() == 0:
            return Pending(traffic=traffic)
        segment_elems = max(1, segment_bytes // tensor.element_size())
        with torch.no_grad():
            if flat.is_cuda and backend == "gloo" and not self.asynchronous:
                # gloo has no CUDA send/recv: run on a pinned host copy. The blocking copy orders
                # it after work already queued on the current stream; the copy back is queued on
                # that stream, and the caching host allocator keeps the pinned block alive until
                # that copy has run. (gloo's own all-reduce takes CUDA tensors, staging them
                # itself without blocking, as plain DDP's does: `native` launches it, and the
                # hook's baseline lane stays a launch on the autograd thread, as DDP's is.)
                host = torch.empty(flat.shape, dtype=flat.dtype, pin_memory=True)
                host.copy_(flat)
                self._start(host, comm, segment_elems).wait()
                flat.copy_(host, non_blocking=True)
                return Pending(traffic=traffic)
            pending = self._start(flat, comm, segment_elems)
            pending.traffic = traffic
            return pending

    def connect(
        self, group: ProcessGroup | None, device: torch.device, *, dedicated: bool = True
    ) -> Comm:
        """Where this algorithm talks for ``group`` on ``device``, ready for its first message.

        Once per message in `start`; a caller that sends many messages the same way may keep it
        and `launch` on it. ``dedicated`` False talks on ``group`` itself instead of the group
        of autotune's own (`p2p_group`): only for collectives issued where ``group``'s others
        are, in the same order on every rank, as DDP issues its all-reduces from backward.
        """
        timeout = None if self.timeout_s is None else timedelta(seconds=self.timeout_s)
        comm = connect(group, device, self.name, timeout, dedicated=dedicated)
        if comm.size > 1:
            ensure_ready(comm, device)
        return comm

    def launch(self, buf: torch.Tensor, comm: Comm) -> Pending:
        """`start` for an `asynchronous` algorithm on a kept ``comm`` (of `connect`), without its
        per-message checks: ``buf`` is flat, contiguous, of a supported dtype, on the device
        ``comm`` was made for (CPU, or CUDA where the backend sends CUDA tensors), and non-empty.
        """
        assert self.asynchronous, f"{self.name} is driven from Python: use start()"
        if comm.size == 1:
            return Pending()
        return self._start(buf, comm, max(1, self.default_segment_bytes // buf.element_size()))

    def stage(
        self, group: ProcessGroup | None, nbytes: int, dtype: torch.dtype, leave_within: int
    ) -> torch.Tensor | None:
        """Memory of the algorithm's own that a caller may write the next message into (scaled
        already), then `start` on it with ``leave_within`` and no ``scale``: the algorithm's
        copy of its input is skipped. None (the default): write it anywhere. Called where every
        rank calls it, for the same messages: it may be collective."""
        return None

    def gather(
        self, group: ProcessGroup, parts: list[torch.Tensor], flat: torch.Tensor, scale: float
    ) -> None:
        """Write the concatenation of ``parts``, each times ``scale``, into ``flat`` (of
        `stage`), the caller's gather before it `start`s on ``flat``. An algorithm that can read
        the parts where they are may keep them instead and fill ``flat`` in that `start` only
        where it must (`shm`)."""
        gathered(parts, flat, scale)

    def _start(self, buf: torch.Tensor, comm: Comm, segment_elems: int) -> Pending:
        """Begin reducing ``buf``; by default run `_run` to the end, return a finished Pending.

        On CPU its sums run on this thread alone (`one_thread`), as gloo's own do."""
        if buf.is_cuda:
            self._run(buf, comm, segment_elems)
        else:
            with one_thread():
                self._run(buf, comm, segment_elems)
        return Pending()

    @abc.abstractmethod
    def _run(self, buf: torch.Tensor, comm: Comm, segment_elems: int) -> None:
        """Reduce ``buf`` in place over ``comm``; called on every rank with ``comm.size >= 2``."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r}, timeout_s={self.timeout_s!r})"


def check_tensor(tensor: object) -> None:
    """Raise a TypeError/ValueError naming the problem if ``tensor`` cannot be all-reduced."""
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"all_reduce expects a torch.Tensor, got {type(tensor).__name__}")
    if tensor.layout != torch.strided:
        raise TypeError(
            f"all_reduce supports dense tensors only, got layout {tensor.layout}; "
            "call .to_dense() first"
        )
    if tensor.dtype not in SUPPORTED_DTYPES:
        names = ", ".join(str(d) for d in SUPPORTED_DTYPES)
        raise TypeError(f"all_reduce does not support dtype {tensor.dtype}; supported: {names}")
    if not tensor.is_contiguous():
        raise ValueError(
            "all_reduce needs a contiguous tensor (it reduces the storage in place); "
            "pass t.contiguous() and copy the result back"
        )
    if tensor.device.type not in ("cpu", "cuda"):
        raise ValueError(f"all_reduce supports CPU and CUDA tensors, got device {tensor.device}")


def check_segment_bytes(segment_bytes: object) -> None:
    if isinstance(segment_bytes, bool) or not isinstance(segment_bytes, int):
        raise TypeError(f"segment_bytes must be an int, got {type(segment_bytes).__name__}")
    if segment_bytes <= 0:
        raise ValueError(f"segment_bytes must be > 0, got {segment_bytes}")


def _check_same_call(tensor: torch.Tensor, segment_bytes: int, name: str, comm: Comm) -> None:
    """Under TORCH_DISTRIBUTED_DEBUG=DETAIL, check every rank passed the same call.

    A size or segment mismatch cannot be seen from one side: gloo accepts a shorter message into a
    longer receive without error, so the sum would be silently wrong.
    """
    mine = torch.tensor(
        [
            tensor.numel(),
            SUPPORTED_DTYPES.index(tensor.dtype),
            segment_bytes,
            zlib.crc32(name.encode()),
        ],
        dtype=torch.int64,
        device=tensor.device if comm.backend == "nccl" else "cpu",
    )
    everyone = [torch.empty_like(mine) for _ in range(comm.size)]
    comm.run(
        lambda: dist.all_gather(everyone, mine, group=comm.group, async_op=True),
        "the TORCH_DISTRIBUTED_DEBUG=DETAIL call check",
    )
    for peer, theirs in enumerate(everyone):
        if not torch.equal(theirs, mine):
            numel, dtype_index, seg, _ = theirs.tolist()
            raise ValueError(
                f"{name} all-reduce called with different arguments on different ranks: "
                f"this rank has numel={tensor.numel()}, dtype={tensor.dtype}, "
                f"segment_bytes={segment_bytes}, algorithm={name}; rank {comm.global_rank(peer)} "
                f"has numel={numel}, dtype={SUPPORTED_DTYPES[dtype_index]}, segment_bytes={seg} "
                "(and the algorithm names must match)"
            )


def gathered(parts: list[torch.Tensor], flat: torch.Tensor, scale: float | None) -> None:
    """Write the concatenation of ``parts`` (flat), each times ``scale`` (None: as they are),
    into ``flat``: one pass over each."""
    offset = 0
    for part in parts:
        n = part.numel()
        if scale is None:
            flat[offset : offset + n].copy_(part)
        else:
            torch.mul(part, scale, out=flat[offset : offset + n])
        offset += n


def at_storage_start(t: torch.Tensor) -> torch.Tensor:
    """``t`` (flat, contiguous) as a tensor whose storage starts at its first element, sharing
    its memory. DDP reads a hook's result with ``as_strided`` at each gradient's offset in the
    bucket, which counts from the storage's start, not the tensor's: a slice of a larger
    tensor would be read from the wrong place."""
    if t.storage_offset() == 0:
        return t
    start = t.storage_offset() * t.element_size()
    storage = t.untyped_storage()[start : start + t.numel() * t.element_size()]
    return torch.empty(0, dtype=t.dtype, device=t.device).set_(storage)
