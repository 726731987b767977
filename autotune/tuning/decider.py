"""Rank 0's side of the live tuner: what a previous job stored, the searches, the orders every
rank runs, and what is stored for the next job.

`autotune.tuning.tuner.Tuner` runs on every rank: windows, the exchange, the orders applied.
On rank 0 it hands each exchange's window to a `Decider`, which judges whole plans on the step
(`PlanSearch`) and screens each size class on latency (`ClassSearch`: Optuna studies), and
asks it for the orders the next exchange carries. Optuna's ask and tell and every storage read
and write run on the decider's worker thread, off the training's critical path; what they
answer comes back through `post`, taken in at the next exchange.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

import torch.distributed as dist

import autotune.tuning.wire as wire
from autotune.ddp.messages import message_sizes
from autotune.model import Prior
from autotune.plan import Arm, Choice, Entry, Table
from autotune.storage import (
    Store,
    describe_layout,
    fingerprint_key,
    job_fingerprint,
    storage_failure,
    storage_url,
    workload_name,
)
from autotune.tuning.class_search import ClassSearch
from autotune.tuning.paired_test import Outcome
from autotune.tuning.plan_search import PlanSearch
from autotune.tuning.search import Progress
from autotune.tuning.shortlist import shortlist
from autotune.tuning.space import space_tag
from autotune.tuning.stored import Stored, provisional, read_stored, seeded, stored_arm
from autotune.tuning.worker import Worker
from autotune.util.redact import redact_url
from autotune.util.units import format_bytes

if TYPE_CHECKING:
    from autotune.comm.topology import Topology
    from autotune.config import Config
    from autotune.ddp.engine import Engine
    from autotune.plan import Buckets

__all__ = ["FUSION_OPTIONS", "IDLE_EXCHANGES", "Decider", "Tuned"]

_log = logging.getLogger("autotune")

#: Fusion sizes tried when ``Config.fusion_bytes`` is None (0: DDP's buckets as they are).
FUSION_OPTIONS = (0, 1 << 20, 4 << 20, 16 << 20)
#: A size class not measured for this many exchanges is idle: it no longer keeps screening
#: on (the first iteration's buckets, before DDP rebuilds them, for one).
IDLE_EXCHANGES = 10


class Tuned(Protocol):
    """What the decider reads of the tuner it decides for (`autotune.tuning.tuner.Tuner`); it
    writes ``frozen`` (the storage failed), ``described`` and ``buckets`` (what it loaded)."""

    config: Config
    engine: Engine
    process_group: dist.ProcessGroup
    topology: Topology
    baseline: Arm
    arm: Arm
    tune_fusion: bool
    unhooks: bool
    frozen: bool
    described: str | None
    buckets: Buckets | None

    def space(self, cls: int) -> list[Choice]: ...

    def needs_hook(self, arm: Arm) -> bool: ...


class Decider:
    """Rank 0's decisions for ``tuner`` (`autotune.tuning.search.Host` to its class searches).

    Opens the tuning storage on its worker thread at construction, so a bad URL fails the
    state's construction, not a step."""

    def __init__(self, tuner: Tuned) -> None:
        self.tuner = tuner
        self.config: Config = tuner.config
        self.worker = Worker(self._beat)
        self.plan_search = PlanSearch(
            tuner.baseline,
            fusion_options=FUSION_OPTIONS if tuner.tune_fusion else (),
            max_pairs=self.config.max_pairs,
            warmup=self.config.tune_warmup,
            recheck_every=self.config.recheck_every,
            catch=tuner.unhooks,
            needs_hook=tuner.needs_hook,
            messages=lambda fusion: message_sizes(tuner.engine.buckets, fusion),
            space=tuner.space,
        )
        #: The job's fingerprint and its key in the storage (from the first exchange on).
        self.fingerprint: dict[str, str | int] | None = None
        self.key = ""
        #: What this job's plan is stored under (from the first exchange on): `Config.workload`.
        self.workload = ""  # or one its gradient layout names
        #: The classes a sweep screened on this fingerprint (once loaded, where the workload had
        #: no plan stored): they stand in for those classes' screening.
        self._seed: Table | None = None
        self.prior: Prior | None = None  # the cost model's, if a sweep stored one (once loaded)
        self.loaded = False
        self.exchanges = 0
        self.classes: dict[int, ClassSearch] = {}
        self._inbox: deque[Callable[[], None]] = deque()
        self._store: Store | None = None
        self._saved = -1  # the plan search history's length when the table was last stored
        #: Whether this job stores what it learns before it has decided (a provisional table,
        #: `_store_provisional`): where no decided plan was stored for its workload.
        self._resumable = False
        self._provisional_at: tuple[int, str] | None = None  # (history length, phase) stored
        #: Why the storage failed (`autotune.storage.failures.storage_failure`), once it has.
        self.storage_error: str | None = None
        self._open_store()

    @property
    def frozen(self) -> bool:
        """Tuning stopped for good (the storage failed mid-job)."""
        return self.tuner.frozen

    def close(self, timeout_s: float) -> None:
        self.worker.close(timeout_s=timeout_s)

    def caught(self, kept: bool, outcome: Outcome | None) -> None:
        """The check against plain DDP is over: the plan search hears how; where the job
        unhooked, the baseline is stored for the next job."""
        self.plan_search.caught(kept, outcome)
        if not kept and self.key:
            self.store_table()

    def _open_store(self) -> None:
        """Open the storage now, on the worker that will use it, so a bad URL fails here."""
        opened = threading.Event()
        failed: list[BaseException] = []

        def open_store() -> None:
            try:
                self.store()
            except BaseException as exc:
                failed.append(exc)
            finally:
                opened.set()

        self.worker.submit(open_store)
        opened.wait(120)
        if failed:
            self.worker.close(timeout_s=1.0)
            raise failed[0]

    def post(self, job: Callable[[], None]) -> None:
        """From the worker: run ``job`` on the finish thread at the next exchange."""
        self._inbox.append(job)

    def store(self) -> Store:
        """The tuning storage (opened on the worker thread, the only one that uses it)."""
        if self._store is None:
            url = storage_url(self.config.storage)
            _log.info("autotune: tuning storage %s", redact_url(url))
            self._store = Store(url)
        return self._store

    def decide(self, iteration: int) -> wire.Orders:
        """Rank 0, before the exchange: take in the worker's answers; choose the next plan."""
        plan_search, worker = self.plan_search, self.worker
        if worker.error is not None and not self.tuner.frozen:
            # Training goes on with the plan as it stands, locked on every rank alike: these
            # orders say so (as "loaded", the exchanges go on to settle it, stored plan or
            # not). The cause is named once, in the database's words (Optuna's own message
            # is the same for every failed commit).
            self.storage_error = storage_failure(worker.error)
            _log.error(
                "autotune stops tuning and keeps the plan it runs (%s): its tuning storage "
                "failed: %s",
                plan_search.incumbent.describe(),
                self.storage_error,
            )
            self.tuner.frozen = True
            self.loaded = True
            plan_search.freeze()
            for search in self.classes.values():
                search.lock(search.desired, search.best[1] if search.best else None)
        if not self.key:
            self._start()
        while self._inbox:
            self._inbox.popleft()()
        if self.loaded:
            plan_search.tick(iteration)
            if plan_search.settled and len(plan_search.history) != self._saved:
                self._saved = len(plan_search.history)
                self.store_table()
            elif not plan_search.settled and self._resumable:
                self._store_provisional()
        arm = plan_search.next_arm(self._screening_arm()) if self.loaded else self.tuner.arm
        codes = {cls: self.tuner.space(cls).index(c) + 1 for cls, c in arm.choices}
        state = "locked" if plan_search.steady else "exploring"
        settled = self.loaded and self.exchanges > 0 and plan_search.steady
        return wire.Orders(
            codes,
            {cls: state for cls in self.classes},
            arm.fusion_bytes,
            wire.LOCKED if settled else wire.EXPLORING,
            plan_search.phase,
            plan_search.gain,
            self.tuner.frozen,
            plan_search.iterations_left(self._screening_left()) if self.loaded else None,
            plan_search.check_steps,
        )

    def _screening_left(self) -> int | None:
        """Windows before every active class is screened (they screen side by side); None
        before any class was seen."""
        active = [s for s in self.classes.values() if self.exchanges - s.last_seen < IDLE_EXCHANGES]
        return max((s.windows_left() for s in active), default=None)

    def _screening_arm(self) -> Arm | None:
        """While classes screen: the incumbent, with each class on its search's current trial."""
        plan_search = self.plan_search
        if plan_search.phase != "screening":
            return None
        arm = plan_search.incumbent
        for cls, search in self.classes.items():
            if search.state != "locked":
                arm = arm.with_class(cls, search.order())
        return arm

    def _start(self) -> None:
        """At the first exchange: fingerprint the job, load what a previous job stored."""
        tuner = self.tuner
        device, dtype = tuner.engine.device, tuner.engine.dtype
        assert device is not None and dtype is not None
        fingerprint = job_fingerprint(tuner.process_group, device, dtype, tuner.topology)
        self.fingerprint, self.key = fingerprint, fingerprint_key(fingerprint)
        layout = tuner.engine.layout
        self.workload = self.config.workload or workload_name(layout)
        if tuner.described is None:
            tuner.described = describe_layout(layout, dtype.itemsize)
        total = sum(n for n, _ in layout)
        _log.info(
            "autotune: this job's plan is stored as %s/%s (%s; the gradients as DDP first "
            "bucketed them: %d buckets, %s%s)",
            self.key,
            self.workload,
            ", ".join(f"{k}={v}" for k, v in fingerprint.items()),
            len(layout),
            format_bytes(total),
            "" if self.config.workload is None else "; named by Config.workload",
        )
        self.worker.submit(self._load)

    def _load(self) -> None:
        """On the worker: what is stored for this job (`autotune.tuning.stored.read_stored`)."""
        stored = read_stored(self.store(), self.key, self.workload)
        self.post(lambda: self._loaded(stored))

    def _loaded(self, found: Stored) -> None:
        """The workload's stored plan, as far as this job can run it, is confirmed before it is
        locked; without one, a sweep's classes seed the search (`_class_search`)."""
        self.loaded = True
        self.prior = found.prior
        self._seed = found.seed
        table = found.table
        stored = None
        if table is not None:
            stored = stored_arm(
                table,
                self.plan_search.baseline,
                lambda cls, choice: choice in self.tuner.space(cls),
                FUSION_OPTIONS if self.tuner.tune_fusion else None,
            )
            for cls, e in table.classes.items():
                # A choice this job may not run (a wire it does not allow: `Config.compression`)
                # is tuned again, never locked.
                if e.state == "locked" and e.choice in self.tuner.space(cls):
                    search = self._class_search(cls)
                    search.lock(e.choice, e.best_s)
                    search.finished = e.trials  # as the job that tuned it left it
        self.tuner.buckets = None if table is None else table.buckets
        lead = None if table is None else table.lead
        self._resumable = table is None or not table.final
        if table is not None and not table.final:
            # A job that ended before it decided: the search goes on from its winner so far
            # (`PlanSearch.resume`), with the fusion sizes it had left (`provisional`); its lead
            # is the fusion size that came close, still to meet the plan again.
            won = None if stored == self.plan_search.baseline else stored
            near = lead if lead is not None and self._runnable(lead.arm) else None
            _log.info(
                "autotune: resuming the provisional plan a job stored before it decided: %s%s",
                "none had won yet" if won is None else won.describe(),
                "" if near is None else f"; {near.describe()} came close, to meet it again",
            )
            # Sizes this job does not tune are not among the fusion stage's options: left out.
            self.plan_search.resume(won, table.gain, near, table.fusion_left, table.estimate)
            return
        if lead is not None and self._runnable(lead.arm):
            _log.info(
                "autotune: the stored plan is DDP's own all-reduce; its lead, %s (%.3fx its "
                "step over %d pairs in the job that stored it), meets it once more",
                lead.arm.describe(),
                lead.gain.ratio,
                lead.gain.pairs,
            )
        else:
            lead = None
        self.plan_search.start(stored, lead, None if table is None else table.gain)

    def _runnable(self, arm: Arm) -> bool:
        """Whether this job can run ``arm``: its choices, its fusion size (or the baseline's)."""
        fusion_ok = arm.fusion_bytes == self.tuner.baseline.fusion_bytes or (
            self.tuner.tune_fusion and arm.fusion_bytes in FUSION_OPTIONS
        )
        return fusion_ok and all(c in self.tuner.space(cls) for cls, c in arm.choices)

    def learn(self, window: wire.Window, arm: Arm, step_arm: Arm) -> None:
        """Rank 0, after the exchange: the step to the plan search (measured under
        ``step_arm``), latencies (measured under ``arm``) to the searches."""
        plan_search = self.plan_search
        if not self.loaded:
            return
        self.exchanges += 1
        if window.step_s is not None:
            plan_search.measure(step_arm, window.step_s)
        if any(s.round != plan_search.round for s in self.classes.values()):
            self.classes.clear()  # fell back: screening starts over, in the new round's studies
        if arm.fusion_bytes != plan_search.incumbent.fusion_bytes:
            return  # a fusion challenger's messages: its classes are not the incumbent's
        screening = plan_search.phase == "screening"
        for cls, latency in window.latencies.items():
            search = self.classes.get(cls) or self._class_search(cls)
            search.last_seen = self.exchanges
            if screening:
                search.start()
                search.measure(arm.choice(cls), latency)
        if screening:
            self._shortlist()

    def _shortlist(self) -> None:
        """Once every active class is screened: hand the plan search each class's challengers."""
        plan_search = self.plan_search
        if plan_search.phase != "screening":
            return
        active = [
            (cls, s)
            for cls, s in self.classes.items()
            if self.exchanges - s.last_seen < IDLE_EXCHANGES
        ]
        if not active or any(s.state != "locked" for _, s in active):
            return
        nominees = [
            (cls, choice, saved)
            for cls, search in active
            for choice, saved in shortlist(search.values, plan_search.incumbent.choice(cls))
        ]
        for cls, search in active:
            ranked = sorted(search.values.items(), key=lambda kv: kv[1])
            _log.info(
                "autotune screening, %s class: %s",
                format_bytes(cls),
                ", ".join(f"{c} {t * 1e3:.2f} ms" for c, t in ranked) or "nothing",
            )
        _log.info(
            "autotune shortlisted: %s",
            ", ".join(f"{format_bytes(cls)} {c}" for cls, c, _ in nominees) or "nothing",
        )
        plan_search.screened(nominees)

    def _class_search(self, cls: int) -> ClassSearch:
        default = self.plan_search.incumbent.choice(cls)
        universe = self.tuner.space(cls)
        default = default if default in universe else universe[0]
        space = universe
        if self.prior is not None:
            # Rank 0's order only: the wire's codes index the whole space, the same everywhere.
            # Choices the user listed (Config.algorithms) are all tried: ordered, never cut.
            asked = self.config.algorithms is not None
            ranks = dist.get_world_size(self.tuner.process_group)
            per_node = max(self.tuner.topology.ranks_per_node)
            space = self.prior.order(
                cls, ranks, universe, default, prune=not asked, ranks_per_node=per_node
            )
        # "/min": the least latency over ranks (wire.Window); studies stored before it held the
        # MAX, a different figure, and are not mixed in. Then the candidates' tag: a study per
        # set of candidates (`space_tag`).
        what = f"class={cls}/min/{space_tag(universe)}"
        search = ClassSearch(self, what, space, default, universe, self.prior is not None)
        search.round = self.plan_search.round
        self.classes[cls] = search
        seeded = self._seeded(cls)
        if seeded is not None:
            choice, seconds = seeded
            search.lock(choice, seconds)
            search.values[choice] = seconds
            _log.info(
                "autotune: the %s class takes a sweep's screening: %s at %.3f ms (put forward "
                "against the job's plan on the step, not locked on it)",
                format_bytes(cls),
                choice,
                seconds * 1e3,
            )
        return search

    def _seeded(self, cls: int) -> tuple[Choice, float] | None:
        """A sweep's screening of ``cls``, where it seeds this job's first round."""
        if self._seed is None or self.plan_search.round != 0:
            return None
        return seeded(self._seed, cls, self.tuner.space(cls))

    def screened(self) -> None:
        """A class search locked its best (the `Host` call): shortlist now if it was the last."""
        self._shortlist()

    def _store_provisional(self) -> None:
        """While undecided, once a paired test has ended or the phase has moved on: store what
        the job has learned (`autotune.tuning.stored.provisional`; `_loaded` resumes it).
        Screening needs nothing: its trials are in the studies already."""
        plan_search = self.plan_search
        at = (len(plan_search.history), plan_search.phase)
        if at == self._provisional_at or plan_search.phase == "loading":
            return
        self._provisional_at = at
        tested = plan_search.phase not in ("screening", "classes")
        table = provisional(
            self.table(),
            plan_search.incumbent,
            plan_search.fusion_near,
            tested,
            plan_search.fusion_left,
            plan_search.estimate,
        )
        self.worker.submit(lambda: self.store().save_table(self.key, self.workload, table))

    def store_table(self) -> None:
        """Rank 0: the plan locked (or fell back); store the table for the next job."""
        table = self.table()
        self.worker.submit(lambda: self.store().save_table(self.key, self.workload, table))

    def abandon(self, why: str) -> None:
        """After what the worker has queued: fail the trials still running, asked or measuring."""
        for search in self.classes.values():
            search.trial = None
        self.worker.submit(lambda: self._store.abandon(why) if self._store is not None else None)

    def _beat(self) -> None:
        if self._store is not None:
            self._store.beat()

    def table(self) -> Table:
        """The plan as rank 0 knows it, with each class's screening and the measured gain."""
        plan_search = self.plan_search
        plan = plan_search.incumbent
        state = "locked" if plan_search.phase == "locked" else "exploring"
        # A class the plan carried a choice to without screening it (`PlanSearch._refuse`) too.
        classes = {cls: Entry(choice, None, 0, state) for cls, choice in plan.choices}
        for cls, search in self.classes.items():
            choice = plan.choice(cls)
            classes[cls] = Entry(choice, search.values.get(choice), search.finished, state)
        classes = dict(sorted(classes.items()))
        fusion = None
        if plan_search.phase == "locked" or not self.tuner.tune_fusion:
            fusion = plan.fusion_bytes
        table = Table(
            classes,
            fusion,
            self.fingerprint,
            plan_search.gain,
            plan_search.lead,
            model=self.tuner.described,
        )
        # A stored bucket size holds while the baseline does: not once a plan (a stored lead's
        # retry, say) has won the job back for the hook.
        keeps = table.runs_without_hook
        return dataclasses.replace(table, buckets=self.tuner.buckets) if keeps else table

    def progress(self) -> dict[int | str, Progress]:
        """Per size class (and "fusion"): state, trials, best latency, current choice."""
        out: dict[int | str, Progress] = {cls: s.progress() for cls, s in self.classes.items()}
        plan_search = self.plan_search
        if self.tuner.tune_fusion:
            fusion_state = "locked" if plan_search.fused else "exploring"
            duels = plan_search.duels("fusion")
            out["fusion"] = Progress(
                fusion_state, duels, None, plan_search.incumbent.fusion_bytes, duels
            )
        return out
