"""Start N local ranks on 127.0.0.1 and run one function on each: for tests, benchmarks, examples.

The parent owns the rendezvous store on a free port it picks itself (no port race), and collects
each rank's return value or traceback; a rank that hangs is killed at the deadline, after it
prints where each of its threads was (Python's faulthandler, on SIGUSR1, to its stderr). A rank
keeps what its function returned or raised before it tears its process group down: on NCCL,
after a failure, teardown waits for the watchdog that ends the process. No rank runs its
function before every rank's group is up (`_all_joined`). A launcher that is
interrupted ends its ranks; one killed outright takes them with it (`_end_with`).
"""

from __future__ import annotations

import contextlib
import faulthandler
import os
import pickle
import select
import signal
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from multiprocessing.context import BaseContext
from pathlib import Path
from typing import Any

__all__ = ["RankFailure", "RankResult", "launch", "run_local"]


@dataclass(frozen=True)
class RankResult:
    """What one rank left behind: its return value, or the error that ended it."""

    rank: int
    value: Any = None
    error: str | None = None  # the traceback, or why the rank did not finish
    exitcode: int | None = None
    failed_at: float = float("inf")  # time.time() of the failure, to find the first one

    @property
    def ok(self) -> bool:
        return self.error is None


class RankFailure(RuntimeError):
    """One or more local ranks raised, died or ran past the deadline."""

    def __init__(self, results: list[RankResult]) -> None:
        self.results = results
        # The rank that failed first is the cause; the others mostly report losing it.
        bad = sorted((r for r in results if not r.ok), key=lambda r: (r.failed_at, r.rank))
        first = bad[0]
        others = ", ".join(str(r.rank) for r in bad[1:])
        super().__init__(
            f"rank {first.rank} failed (exit code {first.exitcode})"
            + (f"; ranks {others} failed too" if others else "")
            + f":\n{first.error}"
        )


def _context() -> BaseContext:
    import multiprocessing as mp

    # forkserver: children fork from a server that has imported torch once, so starting 8 ranks on
    # 2 cores takes well under a second, and none inherits the parent's threads or CUDA state.
    # torch._dynamo too: DDP's constructor imports it (and sympy) on first use, 1.5 s a rank.
    if "forkserver" in mp.get_all_start_methods():
        ctx = mp.get_context("forkserver")
        ctx.set_forkserver_preload(
            ["torch", "torch.distributed", "torch._dynamo", "autotune.algorithms"]
        )
        return ctx
    return mp.get_context("spawn")


def _end_with(launcher: int) -> None:
    """End this rank as soon as the process that launched it (pid ``launcher``) has gone.

    A launcher that is interrupted ends its ranks itself; one killed outright (SIGTERM,
    SIGKILL: a scheduler, ``kill``) runs nothing, and its ranks are not its children but the
    forkserver's, which outlives it, so no parent-death signal reaches them. A daemon thread
    waits on the launcher's pidfd instead (Linux 5.3 and later; elsewhere, nothing)."""
    if not hasattr(os, "pidfd_open"):
        return
    try:
        fd = os.pidfd_open(launcher)
    except ProcessLookupError:
        os._exit(1)  # gone already
    except OSError:
        return  # no pidfds here

    def wait() -> None:
        select.select([fd], [], [])  # readable once the launcher has exited
        os._exit(1)

    threading.Thread(target=wait, name="autotune-launcher-watch", daemon=True).start()


def _child(
    fn: Callable[..., Any],
    rank: int,
    world_size: int,
    port: int,
    serves_store: bool,
    backend: str,
    pg_timeout_s: float,
    threads: int,
    env: Mapping[str, str],
    setup: Callable[[], None] | None,
    args: tuple[Any, ...],
    out: str,
    launcher: int,
) -> None:
    _end_with(launcher)
    os.environ.update(env)
    os.environ.update(
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(world_size),
        LOCAL_WORLD_SIZE=str(world_size),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # never leave the loopback interface
    # A rank still running at the deadline is asked where it is before it is killed (`_end`);
    # only once it says it can answer: until then SIGUSR1's default action would end it, and
    # it would be reported as dead rather than hung.
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    Path(_listening(out)).touch()
    result: tuple[str, Any, float] | None = None
    try:
        import torch
        import torch.distributed as dist

        torch.set_num_threads(threads)
        # The forkserver imported torch before this rank's environment was set.
        dist.set_debug_level_from_env()
        if setup is not None:  # before the group: it may register the backend
            setup()
        store = dist.TCPStore(
            "127.0.0.1", port, world_size, is_master=serves_store, wait_for_workers=False
        )
        dist.init_process_group(
            backend,
            store=store,
            rank=rank,
            world_size=world_size,
            timeout=timedelta(seconds=pg_timeout_s),
        )
        _all_joined(store, rank, world_size, pg_timeout_s)
        try:
            result = ("ok", fn(rank, world_size, *args), 0.0)
        except BaseException:
            # Stamp the failure before teardown: closing our connections is what makes the
            # other ranks fail, and the report must name this rank as the first.
            result = ("error", traceback.format_exc(), time.time())
        # Kept before teardown too: after a failed operation, NCCL's watchdog ends the process
        # while destroy_process_group waits for it (`autotune.testing.played_nccl`).
        _keep(result, out)
        if dist.is_initialized():  # frameworks destroy it themselves (accelerator.end_training)
            dist.destroy_process_group()
    except BaseException:
        if result is None or result[0] == "ok":  # keep the first error, not teardown's
            result = ("error", traceback.format_exc(), time.time())
    assert result is not None
    _keep(result, out)
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip interpreter teardown: a rank whose peer died can otherwise block in gloo's destructors.
    os._exit(0 if result[0] == "ok" else 1)


def _all_joined(store: Any, rank: int, world_size: int, timeout_s: float) -> None:
    """Return once every rank's process group is up (through the rendezvous ``store``).

    gloo fails a rank still connecting its group when a peer it has connected to closes its
    sockets: without this, a rank whose function returned at once tore its group down under a
    slower peer's `init_process_group` ("Connection closed by peer"; 2 launches in 150 on a
    loaded 2-core machine). Past it, a rank that returns tears down at once, as a job's
    process ends: fault tests see a peer go."""
    store.set(f"autotune-launch/joined/{rank}", "1")
    keys = [f"autotune-launch/joined/{r}" for r in range(world_size)]
    store.wait(keys, timedelta(seconds=timeout_s))


def _listening(out: str) -> str:
    """The file a rank writing its result to ``out`` creates once it prints stacks on SIGUSR1."""
    return f"{out}.stacks"


def _keep(result: tuple[str, Any, float], out: str) -> None:
    """Write ``result`` where the launcher reads it, whole or not at all."""
    tmp = f"{out}.tmp"
    with open(tmp, "wb") as f:
        pickle.dump(result, f)
    os.replace(tmp, out)


def launch(
    fn: Callable[..., Any],
    world_size: int,
    *args: Any,
    backend: str = "gloo",
    timeout_s: float = 300.0,
    pg_timeout_s: float = 60.0,
    grace_s: float = 30.0,
    env: Mapping[str, str] | None = None,
    threads: int | None = None,
    store_on_rank0: bool = False,
    setup: Callable[[], None] | None = None,
) -> list[RankResult]:
    """Run ``fn(rank, world_size, *args)`` on ``world_size`` local ranks; return each rank's result.

    Each rank joins a process group on ``backend`` over 127.0.0.1 first. ``fn`` must be importable
    (a module-level function). Once one rank fails, the others get ``grace_s`` to finish or fail on
    their own (that is how fault tests watch survivors raise), then are killed; every rank is killed
    at ``timeout_s``. ``threads``: torch intra-op threads per rank (default: cores / ranks).
    ``store_on_rank0``: rank 0 serves the rendezvous store, as under ``mp.spawn`` with
    ``env://`` (a hung rank 0 then hangs the store), on a port the parent found free.
    ``setup``: run in each rank, its environment set, before its process group (importable, as
    ``fn``): `autotune.testing.played_nccl.install` registers the backend it names.
    """
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    import torch.distributed as dist

    ctx = _context()
    store = None
    if not store_on_rank0:
        store = dist.TCPStore(
            "127.0.0.1", 0, world_size + 1, is_master=True, wait_for_workers=False
        )
    port = _free_port() if store is None else store.port
    threads = threads or max(1, (os.cpu_count() or 1) // world_size)
    with tempfile.TemporaryDirectory(prefix="autotune-launch-") as tmp:
        outs = [str(Path(tmp) / f"rank{r}.pkl") for r in range(world_size)]
        procs = [
            ctx.Process(  # type: ignore[attr-defined]
                target=_child,
                args=(
                    fn,
                    r,
                    world_size,
                    port,
                    store_on_rank0 and r == 0,
                    backend,
                    pg_timeout_s,
                    threads,
                    env or {},
                    setup,
                    args,
                    outs[r],
                    os.getpid(),
                ),
                name=f"autotune-rank{r}",
            )
            for r in range(world_size)
        ]
        deadline = time.monotonic() + timeout_s
        first_failure: float | None = None
        deaths: dict[int, float] = {}  # rank -> time.time() its process was seen dead, unclean
        try:
            for p in procs:
                p.start()
            while any(p.is_alive() for p in procs):
                now = time.monotonic()
                for r, p in enumerate(procs):
                    if r not in deaths and not p.is_alive() and p.exitcode != 0:
                        deaths[r] = time.time()
                        first_failure = first_failure or now
                if now > deadline or (first_failure is not None and now > first_failure + grace_s):
                    break
                time.sleep(0.02)
        except BaseException:
            # Interrupted here (Ctrl-C, a test's timeout): no rank outlives its launcher.
            _end(procs)
            raise
        killed = _end(procs, stacks=outs if first_failure is None else None)
        results = []
        for r, p in enumerate(procs):
            if r in killed and not os.path.exists(outs[r]):
                why = "timeout" if first_failure is None else "grace period after a peer failed"
                results.append(
                    RankResult(r, error=f"killed: still running at the {why}", exitcode=p.exitcode)
                )
                continue
            try:
                with open(outs[r], "rb") as f:
                    status, payload, failed_at = pickle.load(f)
            except FileNotFoundError:
                results.append(
                    RankResult(
                        r,
                        error="died without a result",
                        exitcode=p.exitcode,
                        failed_at=deaths.get(r, float("inf")),
                    )
                )
                continue
            if status == "ok":
                results.append(RankResult(r, value=payload, exitcode=p.exitcode))
            else:
                results.append(
                    RankResult(r, error=payload, exitcode=p.exitcode, failed_at=failed_at)
                )
    del store
    return results


def _free_port() -> int:
    """A loopback port nothing listens on now (rank 0 binds it a moment later)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


#: How long a hung rank is given to print its threads' stacks before it is killed.
STACKS_S = 2.0


def _end(procs: list[Any], stacks: list[str] | None = None) -> set[int]:
    """Kill the ranks still running and reap them all; the ranks that were killed.

    ``stacks``: each rank's result file; first ask each rank that can answer (`_listening`) to
    print where its threads are (SIGUSR1), for a deadline's report.
    """
    asked = []
    if stacks is not None:
        asked = [
            p
            for p, out in zip(procs, stacks, strict=True)
            if p.pid is not None and p.is_alive() and os.path.exists(_listening(out))
        ]
    for p in asked:
        with contextlib.suppress(ProcessLookupError):
            os.kill(p.pid, signal.SIGUSR1)
    if asked:
        time.sleep(STACKS_S)
    killed = set()
    for r, p in enumerate(procs):
        if p.pid is None:
            continue  # never started
        if p.is_alive():
            p.kill()
            killed.add(r)
        p.join()
    return killed


def run_local(fn: Callable[..., Any], world_size: int, *args: Any, **options: Any) -> list[Any]:
    """Like `launch`, but return the ranks' values and raise `RankFailure` if any rank failed."""
    results = launch(fn, world_size, *args, **options)
    if not all(r.ok for r in results):
        raise RankFailure(results)
    return [r.value for r in results]
