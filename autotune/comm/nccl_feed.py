"""What NCCL's own profiler recorded, handed to whoever reads it: the metrics and the engine.

NCCL loads autotune's profiler plugin where ``NCCL_PROFILER_PLUGIN`` names the autotune-nccl
library (docs/NCCL_PROFILER.md); the library keeps one ring of completed collectives per process,
with one reader. `NcclFeed` is that reader: a daemon thread drains the ring every
``interval_s`` (and `poll` drains it at once, for a reader that is waiting for a record) and
hands each batch to every subscriber, on the draining thread. `feed()` is the process's one
feed, or None where NCCL was not told to load the library.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from autotune_nccl import Prediction, ProfilerStats, Record

__all__ = ["NcclFeed", "NcclSource", "PluginLibrary", "feed", "nccl_source"]

log = logging.getLogger("autotune.comm")


class NcclSource(Protocol):
    """The plugin library, or a stand-in in tests."""

    def drain(self) -> list[Record]: ...

    def stats(self) -> ProfilerStats: ...

    def predictions(self) -> list[Prediction]: ...

    def mark_served(self, port: int) -> None:
        """A rank exporter on ``port`` serves this process's collectives (not the daemon)."""


class PluginLibrary:
    """The autotune-nccl library as a source: its profiler's ring, its tuner's predictions."""

    def __init__(self) -> None:
        from autotune_nccl import Profiler, Tuner

        self.profiler, self.tuner = Profiler(), Tuner()

    def drain(self) -> list[Record]:
        return self.profiler.drain()

    def stats(self) -> ProfilerStats:
        return self.profiler.stats()

    def predictions(self) -> list[Prediction]:
        return self.tuner.predictions()[0]

    def mark_served(self, port: int) -> None:
        self.profiler.mark_served(port)


def nccl_source() -> NcclSource | None:
    """The plugin library, where NCCL_PROFILER_PLUGIN names it in this process (else None)."""
    named = os.environ.get("NCCL_PROFILER_PLUGIN")
    if not named:
        return None
    try:
        from autotune_nccl import library_path
    except ImportError:
        return None
    if os.path.realpath(named) != library_path():
        return None  # another profiler (NCCL's Inspector, say): not ours to read
    return PluginLibrary()


Subscriber = Callable[[Sequence["Record"]], Any]


class NcclFeed:
    """The one reader of the profiler's ring: drains it, hands each batch to every subscriber."""

    def __init__(self, source: NcclSource, interval_s: float = 0.5) -> None:
        self.source = source
        self._subscribers: list[Subscriber] = []
        self._lock = threading.Lock()  # one drain at a time, so batches arrive in order
        self._stop = threading.Event()
        self._interval_s = interval_s
        self._thread: threading.Thread | None = None

    def subscribe(self, subscriber: Subscriber) -> None:
        """Call ``subscriber(records)`` with every batch drained from now on (quickly: it runs
        on the draining thread, which may be a waiting engine's)."""
        with self._lock:
            self._subscribers.append(subscriber)
        self._start()

    def unsubscribe(self, subscriber: Subscriber) -> None:
        with self._lock:
            if subscriber in self._subscribers:
                self._subscribers.remove(subscriber)

    def poll(self) -> int:
        """Drain now; returns how many records went out."""
        with self._lock:
            records = self.source.drain()
            if records:
                for subscriber in self._subscribers:
                    subscriber(records)
            return len(records)

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
        self.poll()

    def _start(self) -> None:
        if self._thread is None and not self._stop.is_set():
            self._thread = threading.Thread(
                target=self._run, name="autotune-nccl-feed", daemon=True
            )
            self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            try:
                self.poll()
            except Exception:  # an observer never stops training; say it once
                log.warning("autotune: draining NCCL's profiler failed; stopped", exc_info=True)
                return


_FEED: NcclFeed | None = None
_FEED_LOCK = threading.Lock()


def feed() -> NcclFeed | None:
    """The process's feed, where NCCL was told to load autotune's profiler (else None)."""
    global _FEED
    with _FEED_LOCK:
        if _FEED is None:
            source = nccl_source()
            if source is not None:
                _FEED = NcclFeed(source)
        return _FEED
