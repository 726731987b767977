"""A process named so that it outlives its pid: host, pid and start time, and whether it still
runs, is stopped, or has exited. Ranks tell each other theirs (`autotune.comm.faults`); a tuning
trial carries its job's (`autotune.storage.store`).
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass

__all__ = ["ProcessId", "state"]


@dataclass(frozen=True)
class ProcessId:
    """A process: its host, pid and creation time (a reused pid is another process)."""

    host: str
    pid: int
    started: float

    @classmethod
    def mine(cls) -> ProcessId:
        return cls(socket.gethostname(), os.getpid(), _started(os.getpid()))

    @classmethod
    def of(cls, pid: int) -> ProcessId:
        """A process on this host (``started`` 0.0: it no longer runs)."""
        return cls(socket.gethostname(), pid, _started(pid))

    @property
    def here(self) -> bool:
        """Whether it is (or was) on this host: only then can `state` see it."""
        return self.host == socket.gethostname()

    def describe(self) -> str:
        return f"pid {self.pid} on {self.host}"


def state(process: ProcessId) -> str:
    """ "exited", "stopped" or "running", for a process on this host (`ProcessId.here`)."""
    import psutil

    try:
        p = psutil.Process(process.pid)
        if p.create_time() != process.started:
            return "exited"  # the pid is another process's now
        status = p.status()
    except psutil.NoSuchProcess:
        return "exited"
    if status in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD):
        return "exited"
    if status in (psutil.STATUS_STOPPED, psutil.STATUS_TRACING_STOP):
        return "stopped"
    return "running"


def _started(pid: int) -> float:
    import psutil

    try:
        return float(psutil.Process(pid).create_time())
    except psutil.NoSuchProcess:
        return 0.0
