"""The local launcher: values back, the first failure's traceback, no hang past the deadline."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from types import FrameType
from typing import Any

import pytest
import torch.distributed as dist

from autotune.comm.launch import RankFailure, _context, _end, _listening, launch, run_local


def _identity(rank: int, world_size: int, tag: str) -> tuple[int, int, str, str, str]:
    return (rank, world_size, tag, os.environ["LOCAL_RANK"], os.environ["GLOO_SOCKET_IFNAME"])


@pytest.mark.distributed
def test_values_come_back_in_rank_order() -> None:
    got = run_local(_identity, 3, "x")
    assert got == [(r, 3, "x", str(r), "lo") for r in range(3)]


def _rank1_joins_late() -> None:
    """As a slow rank: rank 1's `init_process_group` returns a second after its group is up."""
    if os.environ["RANK"] != "1":
        return
    init = dist.init_process_group

    def late(*args: Any, **kwargs: Any) -> None:
        init(*args, **kwargs)
        time.sleep(1.0)
        os.environ["JOINED_AT"] = repr(time.time())

    dist.init_process_group = late


def _started_at(rank: int, world_size: int) -> tuple[float, float]:
    return time.time(), float(os.environ.get("JOINED_AT", "0"))


@pytest.mark.distributed
def test_no_rank_runs_its_function_before_every_rank_has_joined() -> None:
    # gloo fails a rank still connecting its group when a peer it has connected to closes its
    # sockets: a rank that returned at once tore its group down under a slower one's
    # init_process_group (2 launches in 150 on a loaded machine).
    (started, _), (_, joined) = run_local(_started_at, 2, setup=_rank1_joins_late)
    assert joined > 0 and started >= joined


def _one_fails(rank: int, world_size: int) -> None:
    if rank == 1:
        raise KeyError("the cause")
    dist.barrier()  # the others are left waiting for rank 1


@pytest.mark.distributed
def test_the_first_failure_is_reported_and_the_rest_do_not_hang() -> None:
    start = time.monotonic()
    with pytest.raises(RankFailure, match="rank 1 failed") as info:
        run_local(_one_fails, 3, grace_s=2, pg_timeout_s=60)
    assert "KeyError: 'the cause'" in str(info.value)
    assert time.monotonic() - start < 30  # grace_s, not the 60 s collective timeout
    assert [r.ok for r in info.value.results] == [False, False, False]


def _hang(rank: int, world_size: int) -> None:
    time.sleep(600)


@pytest.mark.distributed
def test_deadline_kills_hung_ranks() -> None:
    start = time.monotonic()
    results = launch(_hang, 2, timeout_s=3)
    assert time.monotonic() - start < 20
    assert all("killed" in (r.error or "") for r in results)


def test_a_rank_not_yet_listening_for_sigusr1_is_killed_not_signalled(tmp_path: Path) -> None:
    # A rank the forkserver started late has not reached `faulthandler.register` at the deadline:
    # SIGUSR1's default action would end it, and it would read as dead, not hung.
    ctx = _context()
    procs = [ctx.Process(target=time.sleep, args=(600,)) for _ in range(2)]  # type: ignore[attr-defined]
    for p in procs:
        p.start()
    outs = [str(tmp_path / f"rank{r}.pkl") for r in range(2)]
    Path(_listening(outs[1])).touch()  # rank 1 says it listens; it does not, so SIGUSR1 ends it
    assert _end(procs, stacks=outs) == {0}
    assert [p.exitcode for p in procs] == [-signal.SIGKILL, -signal.SIGUSR1]


def _returns_then_teardown_hangs(rank: int, world_size: int) -> int:
    # As NCCL's does after a failed operation: destroy_process_group waits for the watchdog,
    # which ends the process (autotune.testing.played_nccl).
    dist.destroy_process_group = lambda *a, **k: time.sleep(600)
    return rank * 10


@pytest.mark.distributed
def test_a_rank_whose_teardown_hangs_keeps_the_value_it_returned() -> None:
    results = launch(_returns_then_teardown_hangs, 2, timeout_s=5)
    assert [(r.value, r.error) for r in results] == [(0, None), (10, None)]
    assert [r.exitcode for r in results] == [-signal.SIGKILL] * 2  # killed at the deadline


def _hang_writing_stderr_to(rank: int, world_size: int, folder: str) -> None:
    err = os.open(Path(folder, f"stderr.{rank}"), os.O_WRONLY | os.O_CREAT)
    os.dup2(err, 2)  # where the rank's faulthandler writes (fd 2)
    time.sleep(600)


@pytest.mark.distributed
def test_a_hung_rank_says_where_it_was_before_it_is_killed(tmp_path: Path) -> None:
    # Ranks must be in their function by the 3 s deadline: start the forkserver, which imports
    # torch once, first (run alone, the test would otherwise spend the 3 s there).
    run_local(_identity, 1, "warm")
    results = launch(_hang_writing_stderr_to, 2, str(tmp_path), timeout_s=3)
    assert all("killed: still running at the timeout" in (r.error or "") for r in results)
    for rank in range(2):
        stacks = Path(tmp_path, f"stderr.{rank}").read_text()
        assert "line" in stacks and "in _hang_writing_stderr_to" in stacks, stacks


def _hang_and_say(rank: int, world_size: int, folder: str) -> None:
    Path(folder, str(rank)).write_text(str(os.getpid()))
    time.sleep(600)


class _Interrupted(Exception):
    pass


@pytest.mark.distributed
def test_an_interrupted_launcher_leaves_no_rank_behind(tmp_path: Path) -> None:
    # As Ctrl-C or a test's timeout interrupts it: a signal handler raises in the waiting
    # launcher, sent once every rank has said it runs (each rank's pid in a file).
    def interrupt(signum: int, frame: FrameType | None) -> None:
        raise _Interrupted

    def send_once_running() -> None:
        deadline = time.monotonic() + 120
        while len(list(tmp_path.iterdir())) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGUSR1)

    old = signal.signal(signal.SIGUSR1, interrupt)
    sender = threading.Thread(target=send_once_running, daemon=True)
    try:
        sender.start()
        with pytest.raises(_Interrupted):
            launch(_hang_and_say, 2, str(tmp_path), timeout_s=300)
    finally:
        sender.join()
        signal.signal(signal.SIGUSR1, old)
    assert len(list(tmp_path.iterdir())) == 2
    for f in tmp_path.iterdir():
        with pytest.raises(ProcessLookupError):  # killed and reaped
            os.kill(int(f.read_text()), 0)


@pytest.mark.distributed
def test_a_killed_launcher_takes_its_ranks_with_it(tmp_path: Path) -> None:
    # As a job scheduler or `kill` ends a benchmark: SIGKILL, so nothing in the launcher runs.
    pids = tmp_path / "pids"
    pids.mkdir()
    script = (
        f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r})\n"
        "from test_launch import _hang_and_say\n"
        "from autotune.comm.launch import launch\n"
        f"launch(_hang_and_say, 2, {str(pids)!r}, timeout_s=300)\n"
    )
    # Killed outright, it cannot remove its own temporary files (its ranks' result files,
    # multiprocessing's socket): they go into a directory of the test's, removed after (a short
    # path: multiprocessing's socket address is at most 107 bytes, and tmp_path's can be longer).
    tmp = tempfile.TemporaryDirectory(prefix="autotune-killed-")
    launcher = subprocess.Popen(
        [sys.executable, "-c", script], env={**os.environ, "TMPDIR": tmp.name}
    )
    ranks: list[int] = []
    try:
        deadline = time.monotonic() + 120
        while len(list(pids.iterdir())) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        ranks = [int(f.read_text()) for f in pids.iterdir() if f.read_text()]
        assert len(ranks) == 2
        # The ranks' parent: the forkserver, which outlives the launcher until they are gone.
        ranks += {_parent(pid) for pid in ranks} - {launcher.pid}
        launcher.kill()
        launcher.wait(30)
        deadline = time.monotonic() + 30
        while any(_alive(pid) for pid in ranks) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not any(_alive(pid) for pid in ranks)
    finally:
        launcher.kill()
        launcher.wait(30)
        for pid in ranks:  # where the test failed: leave nothing behind
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        tmp.cleanup()


def _parent(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().split(") ", 1)[1].split()[1])


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie counts as gone: it ran to its end)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False


def test_bad_world_size() -> None:
    with pytest.raises(ValueError, match="world_size"):
        launch(_hang, 0)
