"""The played NCCL's failures (`autotune.testing.played_nccl`): the watchdog that ends a process
after a failed operation, and the communicators a timed wait aborted.

- **A failed operation ends the process.** ProcessGroupNCCL's watchdog thread polls every
  work (``kWatchdogThreadSleepMillis``, 100 ms); once one has failed or timed out (a timed
  ``wait`` that ran out counts: it sets the work's exception), it waits four times
  ``TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC`` (15 000 by default: a minute) for the flight
  recorder's dump, then throws from its own thread, which ends the process (SIGABRT), unless
  ``TORCH_NCCL_ASYNC_ERROR_HANDLING`` is 0 (no handling) or 2 (clean up only); the default, 3,
  tears down. ``destroy_process_group`` waits for the watchdog meanwhile: a rank whose job
  ended on a failure does not exit on its own. Seen on an H200 (docs/BENCHMARKS.md, "On a
  GPU"): a survivor that had its error sat in ``destroy_process_group`` until the watchdog
  ended it 60 s after the failure, and its result was lost (`autotune.comm.launch` now keeps
  a rank's result before teardown). The played works report each failure to a `Watchdog`
  that does the same; a failure gloo would never see is not played.
- **A timed-out wait aborts its communicator** (``WorkNCCL::synchronizeInternal``): the work
  keeps its exception, later launches on the communicator are refused, and a peer's operation
  on it never completes (`Aborts`).
"""

from __future__ import annotations

import os
import threading
import time
from datetime import timedelta

import torch.distributed as dist

__all__ = ["DUMP_WAIT_ENV", "ERROR_HANDLING_ENV", "Aborts", "TimedOut", "Watchdog"]

#: ProcessGroupNCCL's settings the played watchdog reads, as the real one does.
ERROR_HANDLING_ENV = "TORCH_NCCL_ASYNC_ERROR_HANDLING"
DUMP_WAIT_ENV = "TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC"
#: The watchdog's poll of its works (``kWatchdogThreadSleepMillis``).
WATCHDOG_POLL_S = 0.1


class TimedOut(dist.DistBackendError):
    """A timed wait ran out (NCCL's "Work ran for ... milliseconds before timing out.")."""


class Watchdog:
    """The process's end after a failed operation, as ProcessGroupNCCL's watchdog plays it."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.ends_at: float | None = None  # time.monotonic() of the process's end, once doomed

    def failed(self, what: str, error: BaseException) -> None:
        mode = int(os.environ.get(ERROR_HANDLING_ENV, "") or 3)
        if mode in (0, 2):  # NoHandling, CleanUpOnly: the process lives on
            return
        dump_s = int(os.environ.get(DUMP_WAIT_ENV, "") or 15_000) / 1000
        with self.lock:
            if self.ends_at is not None:
                return
            self.ends_at = time.monotonic() + WATCHDOG_POLL_S + 4 * dump_s
        threading.Thread(
            target=self._end, args=(what, error), name="played-nccl-watchdog", daemon=True
        ).start()

    def _end(self, what: str, error: BaseException) -> None:
        assert self.ends_at is not None
        time.sleep(max(0.0, self.ends_at - time.monotonic()))
        os.write(
            2,
            (
                f"[played NCCL] watchdog: {what} failed ({error!r}); to avoid data "
                "inconsistency, we are taking the entire process down.\n"
            ).encode(),
        )
        os.abort()

    def hold(self) -> None:
        """Where the process is doomed, wait for its end (``destroy_process_group``)."""
        if self.ends_at is not None:
            time.sleep(max(0.0, self.ends_at - time.monotonic()) + 60.0)


class Aborts:
    """Communicators aborted after a timed wait ran out, by any rank (in the job's store).

    On this rank an aborted communicator refuses every later launch. A peer's operation on it
    never completes on a GPU (its kernel waits for a rank that left): played as a wait that
    runs out at its timeout, or at the group's where it has none, whatever gloo carried."""

    def __init__(self) -> None:
        self.mine: set[str] = set()
        self.store: dist.Store | None = None
        self.rank = 0

    def reset(self, store: dist.Store | None, rank: int) -> None:
        """A new job in this process: ``store`` is where its ranks meet."""
        self.mine.clear()
        self.store, self.rank = store, rank

    def abort(self, comm: str) -> None:
        self.mine.add(comm)
        if self.store is not None:  # the first rank to abort it is the one a peer's error names
            self.store.compare_set(_key(comm), "", str(self.rank))

    def refuse(self, comm: str) -> None:
        if comm in self.mine:
            raise dist.DistBackendError(
                f"[played NCCL] communicator {comm} was aborted on rank {self.rank} (a timed "
                "wait ran out): nothing more runs on it"
            )

    def check(self, comm: str, began: float, wait_s: float, timeout: timedelta) -> None:
        """Where a peer aborted ``comm``: wait out ``wait_s`` from ``began``, then raise."""
        store = self.store
        key = _key(comm)
        if store is None or comm in self.mine or not store.check([key]):
            return
        time.sleep(max(0.0, began + wait_s - time.monotonic()))
        raise TimedOut(
            f"[played NCCL] an operation on {comm}, whose communicator rank "
            f"{store.get(key).decode()} aborted: Work ran for {wait_s * 1000:.0f} milliseconds "
            f"before timing out (wait timeout {timeout})."
        )


def _key(comm: str) -> str:
    return f"played_nccl/aborted/{comm}"
