"""`AutotuneState`: what the hook keeps for one DDP model. It builds the engine, the tuner, the
unhooking and the exporter, hands each what it uses, and diagnoses the job's first failure; and the
default state that `autotune.hook` uses when DDP passes None.

Example::

    >>> state = autotune.AutotuneState(config=autotune.Config(algorithm="ring"))
    >>> ddp_model.register_comm_hook(state, autotune.hook)
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import warnings
import weakref
from collections.abc import Callable

import torch
import torch.distributed as dist
from torch.distributed import ProcessGroup

from autotune.algorithms import (
    AllReduceAlgorithm,
    PeerError,
    forget_p2p_group,
    get_algorithm,
)
from autotune.comm.faults import FailureBoard, release
from autotune.config import Config
from autotune.ddp.stats import Recorder, Summary, summarize
from autotune.plan import Choice, Entry, Table, load_table
from autotune.setup_checks import (
    oversubscribed_here,
    shared_settings,
    warn_restart_on_shared_store,
)
from autotune.tuning.status import Status, status
from autotune.tuning.unhooked import Unhooking
from autotune.util.redact import redact
from autotune.wiring import Lent, build

_log = logging.getLogger("autotune")

__all__ = ["AutotuneState", "default_state", "is_default_state", "reset_default_state"]


class AutotuneState:
    """Everything the hook keeps for one DDP model: config, plan, engine, measurements.

    Construct it on every rank at the same point (it sets up a dedicated process group for
    autotune's traffic, collectively over ``process_group``'s members), then register it::

        >>> state = autotune.AutotuneState(config=autotune.Config(algorithm="ring"))
        >>> ddp_model.register_comm_hook(state, autotune.hook)

    ``process_group`` must be the group DDP reduces over (None: the world); `register` takes it
    from the model for you.
    """

    __slots__ = (
        "__weakref__",
        "_algorithms",
        "_cores_warning",
        "_parts",
        "board",
        "clock",
        "config",
        "engine",
        "exporter",
        "failure",
        "guard",
        "process_group",
        "recorder",
        "tuner",
        "unhooking",
        "world_size",
    )

    def __init__(
        self, process_group: ProcessGroup | None = None, config: Config | None = None
    ) -> None:
        if not dist.is_initialized():
            raise RuntimeError(
                "autotune.AutotuneState needs torch.distributed: call "
                "torch.distributed.init_process_group() first (torchrun sets up the environment)"
            )
        group = process_group if process_group is not None else dist.group.WORLD
        assert group is not None
        if dist.get_rank(group) < 0:
            raise ValueError("this rank is not a member of the process group given to autotune")
        self.process_group = group
        self.world_size = dist.get_world_size(group)
        warn_restart_on_shared_store()
        #: Where the ranks agree on setup and on who failed first.
        self.board = FailureBoard(group, timeout_s=Config.timeout_s)
        # Every rank says it is ready, or why not, before anyone waits on a collective: a rank
        # with a bad environment fails the others at once, not after their timeout.
        table = None
        try:
            self.config = config if config is not None else Config.from_env()
            self.board.timeout_s = self.config.timeout_s
            if self.config.plan_file is not None:
                # Read and checked here, not at the first bucket: a bad file fails construction
                # with the file's name, not backward() with a cast error.
                table = load_table(self.config.plan_file)
        except BaseException as exc:
            self.board.agree("config", exc, {})
            raise
        self.board.agree("config", None, shared_settings(self.config, table))
        self.recorder = Recorder()
        self._algorithms: dict[str, AllReduceAlgorithm] = {}
        lent = Lent(
            algorithm_for=self._algorithm,
            diagnose=self._diagnose,
            diagnose_ddp=self._diagnose_ddp,
            owner=_owner(self),
            liveness=lambda: self.board.liveness,
            listeners=(self.recorder.record,),
        )
        #: The job's failure, once diagnosed: every later error of this state is this one.
        self.failure: PeerError | None = None
        try:
            parts = build(group, self.config, table, self.board.sequence, lent)
        except BaseException as exc:
            self.board.agree("ready", exc, {})
            self.board.close()
            raise
        self._parts = parts
        #: The engine that runs the hook's all-reduces (`autotune.ddp.engine`).
        self.engine = parts.engine
        #: NCCL's kernel time for the messages NCCL runs, where NCCL loaded autotune's profiler.
        self.clock = parts.clock
        #: The fault contract where DDP runs without the hook (`autotune.ddp.guard`), wherever it
        #: may.
        self.guard = parts.guard
        #: The live tuner ("auto" without a plan file), else None.
        self.tuner = parts.tuner
        #: Takes the hook out of DDP once the tuner keeps the baseline (`autotune.tuning.unhooked`).
        self.unhooking = parts.unhooking
        #: The Prometheus exporter (``Config.metrics_port``), else None.
        self.exporter = parts.exporter
        told = {}
        if self.config.metrics_port is not None:
            told["metrics"] = None if self.exporter is None else self.exporter.server.url
        try:
            self.board.agree("ready", None, {}, told)
        except BaseException:
            self.close()
            raise
        if self.config.metrics_port is not None:
            self._tell_endpoints(group)
        self.board.start_watching()
        #: On the lowest of the group's ranks on this host, where they oversubscribe its cores
        #: (`autotune.util.cores`), what to say at the first bucket if it is on the CPU; else None.
        self._cores_warning = oversubscribed_here(self.board)

    def _tell_endpoints(self, group: ProcessGroup) -> None:
        """Every rank's metrics endpoint, as the ranks told each other at setup: to each
        exporter (its ``autotune_metrics_endpoints`` series), and in one line on the group's
        first rank: each rank's URL where the ports were left to the system (port 0), the ranks
        that serve none (a port in use) where any does not."""
        urls = {r: told.get("metrics") for r, told in sorted(self.board.told.items())}
        if self.exporter is not None:
            self.exporter.endpoints = urls
        if dist.get_rank(group) != 0:
            return
        missing = [r for r, url in urls.items() if url is None]
        if missing:
            _log.warning(
                "autotune metrics: rank%s %s serve%s no endpoint (a port in use: their logs say "
                "which); the job trains on, unscraped there",
                "s" if len(missing) > 1 else "",
                ", ".join(map(str, missing)),
                "" if len(missing) > 1 else "s",
            )
        if not self.config.metrics_port:
            _log.info(
                "autotune metrics: %s",
                ", ".join(f"rank {r} {url}" for r, url in urls.items() if url is not None),
            )

    def _warn_cores(self, buffer: torch.Tensor) -> None:
        why, self._cores_warning = self._cores_warning, None
        if why is not None and buffer.device.type == "cpu":
            _log.warning("autotune: %s", why)

    def plan(self) -> dict[int, Choice]:
        """Size class (bytes, a power of two) -> the choice for it, for every class seen so far."""
        return self.engine.plan.table()

    def table(self) -> Table:
        """The plan with what tuning learned about each class (full on rank 0, which tunes);
        `Table.final` says what `status` says (a job still tuning holds a provisional table).
        ``print()`` it for the lines ``autotune show`` prints."""
        if self.tuner is not None:
            final = status(self.tuner, self.unhooking).final
            return dataclasses.replace(self.tuner.table(), final=final)
        plan = self.plan()
        return Table(
            {cls: Entry(c, state="fixed") for cls, c in plan.items()}, self.engine.fusion_bytes
        )

    def status(self) -> Status:
        """Where autotune stands (`autotune.tuning.status.Status`), as of the last iteration
        whose backward() returned: the engine settled first, so every rank reads the same after
        the same iteration. The one snapshot: `settled`, `locked` and `verdict` read it."""
        self.engine.settle(self.config.timeout_s)
        return status(self.tuner, self.unhooking)

    @property
    def settled(self) -> bool:
        """`Status.settled`: whether autotune has decided what this job runs (the tuner's plan,
        locked, and where it unhooks, DDP's bucket size). The same on every rank after the same
        iteration."""
        return self.status().settled

    @property
    def locked(self) -> bool:
        """`Status.locked`: whether the job runs a decided plan from here on. The same on every
        rank after the same iteration, so a collective that depends on it cannot deadlock: it
        reads what rank 0 broadcast (not rank 0's own plan search, which knows a step or two
        earlier), once the engine has taken in that iteration's end, where the orders arrive (a
        bucket's future may complete before that)."""
        return self.status().locked

    def verdict(self) -> str:
        """`Status.verdict`: one line for a job's summary, its training step against plain DDP's
        as the tuner measured it (on rank 0, which decides), and whether the hook unhooked."""
        return self.status().verdict

    def stats(self) -> dict[tuple[int, str], Summary]:
        """(size class, algorithm) -> count, bytes, median and p99 seconds, busbw.

        Waits (up to 10 s) until the engine has recorded every iteration submitted so far: a
        bucket's future can complete before the engine has written down its timing."""
        self.engine.settle(timeout_s=10.0)
        return summarize(self.recorder.records())

    def close(self) -> None:
        """Stop the engine's workers (after they run what is queued) and the tuner's."""
        self._parts.close()
        self.board.close()

    def _diagnose(self, error: BaseException, algorithm: str | None) -> PeerError:
        """The engine's first failure, as every rank will report it: who failed first (agreed
        through the store), then this rank's groups aborted so peers waiting on it fail now.
        Diagnosed once: a later failure of the state (DDP's without the hook) is the same."""
        if self.failure is not None:
            return self.failure
        verdict = self.board.verdict(error)
        # Forgotten, not looked up: looking up a group another state dropped would make one.
        dedicated = forget_p2p_group(self.process_group, self.board.sequence)
        groups = [] if dedicated is None else [dedicated]
        if self.tuner is not None:
            groups.append(self.tuner.group)
        release(groups)
        algorithm = algorithm or getattr(error, "algorithm", None) or "autotune"
        diagnosed = PeerError(
            redact(
                f"{algorithm} all-reduce failed: {verdict.describe()}. "
                f"On rank {dist.get_rank()}: {error}"
            ),
            rank=verdict.rank,
            algorithm=algorithm,
            peer=getattr(error, "peer", None),
        )
        diagnosed.__cause__ = error
        self.failure = diagnosed
        return diagnosed

    def _diagnose_ddp(self, error: BaseException) -> PeerError:
        """DDP's own collective failed, without the hook (`autotune.ddp.guard`)."""
        ours = PeerError(f"DDP's all-reduce without autotune's hook: {error}")
        ours.__cause__ = error
        return self._diagnose(ours, "native")

    def _algorithm(self, name: str) -> AllReduceAlgorithm:
        algo = self._algorithms.get(name)
        if algo is None:
            algo = self._algorithms[name] = get_algorithm(name, timeout_s=self.config.timeout_s)
        return algo

    @property
    def aside(self) -> Unhooking | None:
        """Deprecated, goes in the next release: `unhooking`."""
        warnings.warn(
            "AutotuneState.aside is deprecated and goes in the next release: use "
            "AutotuneState.unhooking",
            DeprecationWarning,
            stacklevel=2,
        )
        return self.unhooking

    def __repr__(self) -> str:
        return (
            f"AutotuneState(world_size={self.world_size}, config={self.config}, "
            f"iteration={self.engine.iteration})"
        )


def _owner(state: AutotuneState) -> Callable[[object, object], bool]:
    """Whether a comm hook a DDP model holds, (function, state), is ``state``'s: registered with
    it, or with None if it is the default state. (Weak: the state holds what this returns.)"""
    ref = weakref.ref(state)

    def ours(fn: object, registered: object) -> bool:
        mine = ref()
        if mine is None or not _is_hook(fn):
            return False
        return registered is mine or (registered is None and is_default_state(mine))

    return ours


def _is_hook(fn: object) -> bool:
    """Whether ``fn`` is `autotune.hook` (known by name: that module imports this one)."""
    return (
        getattr(fn, "__module__", None) == "autotune.comm_hook"
        and getattr(fn, "__qualname__", None) == "hook"
    )


_default_lock = threading.Lock()


_default: list[AutotuneState] = []


def default_state() -> AutotuneState:
    """Build (once) and return the state `hook` uses when DDP passes None, configured from
    ``AUTOTUNE_*`` variables, over the world.

    Call it on every rank after ``init_process_group`` and before the first backward, as a
    state's constructor is called: it sets up process groups collectively and opens the storage.
    """
    with _default_lock:
        if not _default:
            # The state reads the variables itself, inside its setup handshake: a bad one on
            # one rank is then named on every rank at once, not after the others' timeout.
            _default.append(AutotuneState())
        return _default[0]


def is_default_state(state: AutotuneState) -> bool:
    with _default_lock:
        return bool(_default) and _default[0] is state


def built_default_state() -> AutotuneState:
    with _default_lock:
        if _default:
            return _default[0]
    # Every rank gets here at its first bucket, so every rank raises at the same point.
    raise RuntimeError(
        "autotune.hook was registered with state=None and no default state was built: it is "
        "not built inside backward, where it would set up process groups and open the tuning "
        "storage in the middle of a step. Build it on every rank before training, after "
        "init_process_group: autotune.default_state() (configured from AUTOTUNE_* variables); "
        "or pass a state: autotune.register(ddp_model). Frameworks that pass no state have "
        "integrations that build it: docs/INTEGRATIONS.md"
    )


def reset_default_state() -> None:
    """Close and forget the default state (a new one is built at the next use)."""
    with _default_lock:
        while _default:
            _default.pop().close()
