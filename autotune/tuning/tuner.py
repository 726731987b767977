"""The live tuner's orchestration: windows, the cross-rank exchange, and rank 0's decisions.

After an iteration, one MAX all-reduce starts on a group of the tuner's own, carrying each rank's
window (message latencies per size class, the step; `autotune.tuning.wire` says which of each is
kept) together with rank 0's orders (the plan every
rank runs next; `autotune.tuning.wire`). It travels during the next iteration's compute and is
finished at that iteration's end, at the same point of the bucket sequence on every rank, where
every rank applies the orders it received: all ranks always run the same plan for the same
message. Rank 0 decides with a `PlanSearch` (whole plans, judged on the step against the baseline)
and the class searches (Optuna studies, which shortlist per-class challengers on latency). Optuna's
ask, tell and storage writes run on a worker thread on rank 0, off the training's critical path.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from datetime import timedelta
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

import autotune.tuning.wire as wire
from autotune.algorithms import (
    agreed,
    bookkeeping_device,
    carried,
    carry,
    current_device,
    sibling_group,
)
from autotune.comm import topology
from autotune.ddp.events import Event, Failure, IterationDone, IterationEnd
from autotune.ddp.stats import MessageRecord
from autotune.model import Prior
from autotune.plan import Arm, Buckets, Choice, Entry, Gain, Table
from autotune.storage import (
    Store,
    describe_layout,
    fingerprint_key,
    job_fingerprint,
    storage_failure,
    storage_url,
    workload_name,
)
from autotune.tuning.paired_test import Outcome
from autotune.tuning.plan_search import PlanSearch, shortlist
from autotune.tuning.search import NOT_MEASURED, ClassSearch, Progress
from autotune.tuning.space import search_space, space_tag
from autotune.tuning.steps import StepLog
from autotune.tuning.stored import Stored, read_stored, stored_arm
from autotune.tuning.worker import Worker
from autotune.util.redact import redact_url
from autotune.util.units import format_bytes

if TYPE_CHECKING:
    from autotune.config import Config
    from autotune.ddp.engine import Engine

__all__ = ["FUSION_OPTIONS", "Tuner"]

_log = logging.getLogger("autotune")

#: Fusion sizes tried when ``Config.fusion_bytes`` is None (0: DDP's buckets as they are).
FUSION_OPTIONS = (0, 1 << 20, 4 << 20, 16 << 20)
#: Once everything is locked, exchange every this many iterations.
WATCH_EVERY = 10
#: A size class not measured for this many exchanges is idle: it no longer keeps screening
#: on (the first iteration's buckets, before DDP rebuilds them, for one).
IDLE_EXCHANGES = 10


class Tuner:
    """Tunes ``engine``'s plan live over ``group`` (the job's); `AutotuneState` makes one when
    ``config.algorithm`` is "auto" and no plan file is given."""

    def __init__(self, engine: Engine, group: dist.ProcessGroup, config: Config) -> None:
        self.engine = engine
        self.process_group = group
        self.config = config
        self.rank = dist.get_rank(group)
        self.tune_fusion = config.fusion_bytes is None
        baseline = self.baseline = Arm((), config.fusion_bytes or 0)
        #: Whether the job unhooks once it keeps the baseline (`autotune.tuning.unhooked`): only
        #: where the baseline is what the job had without autotune, DDP's own buckets. Where it
        #: does, a plan that needs the hook meets plain DDP before it is locked
        #: (`autotune.tuning.plain_check`).
        self.unhooks = self.would_unhook(config)
        #: What every rank runs now, as rank 0 ordered it (the baseline until it does).
        self.arm = baseline
        self.cadence = wire.EXPLORING
        #: Where tuning stands, as every rank hears it: per size class, the phase, the gain.
        self.states: dict[int, str] = {}
        self.phase = "loading"
        self.gain: Gain | None = None
        #: Iterations before the plan is locked, as rank 0 estimated them for the stages known
        #: then (None: not known yet; `autotune.tuning.status.Status.iterations_left`).
        self.to_go: int | None = None
        #: The iteration from which every rank runs, locked, a plan DDP runs itself (None: it
        #: does not): the baseline, or where the fusion size is tuned, the backend's all-reduce
        #: for every class at any fusion size, which `autotune.tuning.buckets` turns into DDP's own
        #: bucket size. Set at the same iteration end on every rank, where the orders arrive.
        self.unhook_from: int | None = None
        #: DDP's bucket size as this job keeps it, or as a previous job stored it until this
        #: job's search decides (rank 0 reads it from the storage; every rank sets it then).
        self.buckets: Buckets | None = None
        #: The iteration from which the check against plain DDP runs
        #: (`autotune.tuning.plain_check`; None: none is due), set at the same iteration end on
        #: every rank, from orders in the ``catch`` phase. Stale such orders (sent before the check
        #: against plain DDP ended) do not start another: one is due again only after orders in
        #: another phase.
        self.check_from: int | None = None
        self._catch_armed = True
        self.key = ""
        #: The workload this job's plan is stored under (rank 0, from the first exchange on):
        #: `Config.workload`, or one its gradient layout names.
        self.workload = ""
        #: The model in words (`autotune.storage.describe_model`), stored with the plan for
        #: `autotune show`: set by `autotune.register`; else, at the first exchange, what the
        #: gradient layout says.
        self.described: str | None = None
        #: The classes a sweep screened on this fingerprint (rank 0, once loaded, where the
        #: workload had no plan stored): they stand in for those classes' screening.
        self._seed: Table | None = None
        #: The cost model's prior for this fingerprint (rank 0, once loaded), if a sweep stored it.
        self.prior: Prior | None = None
        self.loaded = False
        self.exchanges = 0
        self.classes: dict[int, ClassSearch] = {}
        self._spaces: dict[int, list[Choice]] = {}
        self.plan_search: PlanSearch | None = None
        self._latencies: dict[int, list[float]] = {}
        #: This window's steps, each with the plan its iteration ran.
        self._steps = StepLog()
        self._inbox: deque[Callable[[], None]] = deque()
        self._store: Store | None = None
        self._saved = -1  # the plan search history's length when the table was last stored
        #: Whether this job stores what it learns before it has decided (a provisional table,
        #: `_store_provisional`): where no decided plan was stored for its workload.
        self._resumable = False
        self._provisional_at: tuple[int, str] | None = None  # (history length, phase) stored
        self._exchange_device: torch.device | None = None
        # The exchange in flight: started at one iteration end, finished at the next, with the
        # plan its measurements ran under.
        self._exchange: tuple[dist.Work, torch.Tensor, Arm, Arm] | None = None
        self._window_arm = baseline
        self._received: tuple[wire.Window, Arm, Arm] | None = None
        #: Tuning stopped for good: rank 0's storage failed mid-job (set on rank 0 at once, on
        #: every rank where the orders that say so arrive).
        self.frozen = False
        #: Why the storage failed, on rank 0 (`autotune.storage.failures.storage_failure`), once it
        #: has.
        self.storage_error: str | None = None
        # The exchange's own group: it runs alongside the next iteration's messages, and
        # collectives on a shared group would have to be issued in the same order everywhere.
        # On the host (gloo) whatever the job runs: launched from the completing thread, on
        # NCCL it would race the job's own launches (`autotune.comm.groups.host_backend`).
        # Made before the storage is opened, which can fail on rank 0 alone.
        self.group = sibling_group(group, "tuner", timedelta(seconds=config.timeout_s), host=True)
        # Which ranks share a node, for the fingerprint: learnt here, where every rank is.
        self.topology = topology.detect(self.group, timedelta(seconds=config.timeout_s))
        #: What "auto" chooses among: the configured candidates this group can run.
        self.candidates = agreed(
            config.candidates, group, current_device(), timedelta(seconds=config.timeout_s)
        )
        if not self.candidates:
            raise ValueError(
                f"Config.algorithms: none of {', '.join(config.candidates)} can run on this "
                "group (the log says why); add 'native' or another built-in"
            )
        self.worker = Worker(self._beat) if self.rank == 0 else None
        if self.worker is not None:
            self.plan_search = PlanSearch(
                baseline,
                fusion_options=FUSION_OPTIONS if self.tune_fusion else (),
                max_pairs=config.max_pairs,
                warmup=config.tune_warmup,
                recheck_every=config.recheck_every,
                catch=self.unhooks,
                needs_hook=self.needs_hook,
            )
            self._open_store()
        #: Seconds each iteration's off-path work took (learning, deciding, starting the exchange).
        self.off_path_s: deque[float] = deque(maxlen=100_000)
        engine.subscribe(self._on_event)

    @staticmethod
    def would_unhook(config: Config) -> bool:
        """Whether a tuner with ``config`` unhooks once it keeps the baseline: only where
        the baseline is what the job had without autotune, DDP's own buckets."""
        return config.unhook and not config.fusion_bytes

    # -- every rank -------------------------------------------------------------------------

    def _on_event(self, event: Event) -> None:
        if isinstance(event, MessageRecord):
            self._latencies.setdefault(event.size_class, []).append(event.seconds)
        elif isinstance(event, IterationEnd):
            self._on_iteration_end(event.iteration, event.step_s, event.step_of)
        elif isinstance(event, IterationDone):
            self._after_iteration(event.iteration)
        elif isinstance(event, Failure):
            self._on_failure(event.error)

    def _on_iteration_end(self, iteration: int, step_s: float | None, step_of: int | None) -> None:
        """Before this iteration's futures complete: take in the exchange started one iteration
        ago, so the plan it carries is in effect for every rank's next iteration. The step is
        ``step_of``'s (on CUDA, the GPU's of an iteration a few back: `autotune.ddp.step_clock`),
        kept with the plan that iteration ran."""
        self._steps.ended(iteration, self.arm, step_s, step_of)
        if self._exchange is not None:
            work, result, latencies_under, step_under = self._exchange
            self._exchange = None
            work.wait(timedelta(seconds=self.config.timeout_s))
            window, orders = wire.read(result.tolist())
            self._received = (window, latencies_under, step_under)
            if orders is not None:
                self._apply(orders, iteration + 1)

    def _after_iteration(self, iteration: int) -> None:
        """After the futures (off the step's critical path): learn, decide, start the next
        exchange, which travels during the next iteration's compute."""
        begin = time.perf_counter()
        if self._received is not None:
            window, latencies_under, step_under = self._received
            self._received = None
            if self.rank == 0:
                self._learn(window, latencies_under, step_under)
        if self.cadence == wire.LOCKED and iteration % WATCH_EVERY:
            if self.arm != self._window_arm:  # a window holds one plan's iterations, or none
                self._new_window()
        else:
            latencies = {c: min(s) for c, s in self._latencies.items()}  # see wire.Window
            step_under, step = self._steps.window(self._window_arm)
            orders = self._decide(iteration) if self.rank == 0 else None
            row = wire.write(wire.Window(latencies, step), orders)
            self._exchange = (*self._start_all_reduce_max(row), self._window_arm, step_under)
            self.engine.switch_at(iteration + 1)  # where the orders it carries take effect
            self._new_window()
        self.off_path_s.append(time.perf_counter() - begin)

    def _new_window(self) -> None:
        self._latencies.clear()
        self._steps.clear()
        self._window_arm = self.arm

    def _start_all_reduce_max(self, row: list[float]) -> tuple[dist.Work, torch.Tensor]:
        group = self.group
        if self._exchange_device is None:
            assert self.engine.device is not None
            self._exchange_device = bookkeeping_device(group, self.engine.device)
        # Plain lists, one tensor: this thread competes with training for the GIL.
        t = torch.tensor(row, dtype=torch.float64).to(self._exchange_device)
        work = dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group, async_op=True)
        assert work is not None
        return work, t

    def _apply(self, orders: wire.Orders, effective: int) -> None:
        """Rank 0's orders, in effect from iteration ``effective`` on."""
        choices = {cls: self._space(cls)[code - 1] for cls, code in orders.codes.items()}
        arm = Arm.of(choices, orders.fusion_bytes)
        if arm != self.arm:
            self.engine.plan.replace(choices)
            self.engine.fusion_bytes = orders.fusion_bytes
            self.arm = arm
        self.states.update(orders.states)
        self.cadence, self.phase, self.gain = orders.cadence, orders.phase, orders.gain
        self.to_go = orders.to_go
        self.frozen = self.frozen or orders.frozen
        if orders.phase != "catch":
            self._catch_armed = True
        elif self._catch_armed and self.check_from is None:
            self.check_from, self._catch_armed = effective, False
        ddp_runs_it = not self.needs_hook(arm) and (
            self.tune_fusion or arm.fusion_bytes == self.baseline.fusion_bytes
        )
        if self.cadence != wire.LOCKED or not ddp_runs_it:
            self.unhook_from = None
        elif self.unhook_from is None:
            self.unhook_from = effective

    @staticmethod
    def needs_hook(arm: Arm) -> bool:
        """Whether ``arm`` runs only through the hook: a class on a Python-driven schedule. The
        baseline's choices and autotune-nccl's cells run on DDP itself once autotune unhooks
        (`autotune.algorithms.carried`), a fusion size as DDP's bucket size."""
        return any(not carried(c.algorithm) for _, c in arm.choices)

    def carry_plan(self) -> list[str]:
        """Every rank, as autotune unhooks: hand the locked plan's classes to the backend (NCCL's
        tuner plugin's table; nothing for the baseline's); what it now runs."""
        classes = self.arm.as_dict()
        if not classes:
            return []
        return carry(classes, dist.get_world_size(self.process_group))

    def caught(self, kept: bool, outcome: Outcome | None) -> None:
        """Every rank, once the check against plain DDP is over
        (`autotune.tuning.unhooked.Unhooking`, settled): ``kept``, the plan runs on through the
        hook; else the job has unhooked, and rank 0 stores the baseline for the next job."""
        self.check_from = None
        if not kept:
            self.unhook_from = self.engine.iteration
        if self.plan_search is not None:
            self.plan_search.caught(kept, outcome)
            if not kept and self.key:
                self._store_table()

    def _on_failure(self, error: BaseException) -> None:
        if self.worker is None:
            return
        # The job is going down: record the trials in flight as failed, not as fast.
        self._abandon(NOT_MEASURED + repr(error))
        self.worker.close(timeout_s=10.0)

    @property
    def settled(self) -> bool:
        """Whether every rank knows that the plan is locked (exchanges are down to watching)."""
        return self.cadence == wire.LOCKED

    @property
    def locked(self) -> bool:
        """Whether the plan runs locked, as rank 0's orders said it to every rank at the same
        iteration: a re-check of it included (it keeps the plan unless the plan lost its gain),
        the check against plain DDP not (it decides whether the plan stays)."""
        return self.phase == "locked" and self.check_from is None

    def close(self) -> None:
        if self.worker is not None:
            self._abandon(NOT_MEASURED + "the job ended before the trial finished")
            self.worker.close(timeout_s=30.0)

    def _abandon(self, why: str) -> None:
        """After what the worker has queued: fail the trials still running, asked or measuring."""
        assert self.worker is not None
        for search in self.classes.values():
            search.trial = None
        self.worker.submit(lambda: self._store.abandon(why) if self._store is not None else None)

    def _beat(self) -> None:
        if self._store is not None:
            self._store.beat()

    def _space(self, cls: int) -> list[Choice]:
        space = self._spaces.get(cls)
        if space is None:
            space = self._spaces[cls] = search_space(cls, self.candidates, self.topology)
        return space

    # -- rank 0 -----------------------------------------------------------------------------

    def _open_store(self) -> None:
        """Open the storage now, on the worker that will use it, so a bad URL fails here."""
        assert self.worker is not None
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
            if self.rank == 0:
                _log.info("autotune: tuning storage %s", redact_url(url))
            self._store = Store(url)
        return self._store

    def _decide(self, iteration: int) -> wire.Orders:
        """Rank 0, before the exchange: take in the worker's answers; choose the next plan."""
        plan_search, worker = self.plan_search, self.worker
        assert plan_search is not None and worker is not None
        if worker.error is not None and not self.frozen:
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
            self.frozen = True
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
                self._store_table()
            elif not plan_search.settled and self._resumable:
                self._store_provisional()
        arm = plan_search.next_arm(self._screening_arm()) if self.loaded else self.arm
        codes = {cls: self._space(cls).index(c) + 1 for cls, c in arm.choices}
        state = "locked" if plan_search.steady else "exploring"
        settled = self.loaded and self.exchanges > 0 and plan_search.steady
        return wire.Orders(
            codes,
            {cls: state for cls in self.classes},
            arm.fusion_bytes,
            wire.LOCKED if settled else wire.EXPLORING,
            plan_search.phase,
            plan_search.gain,
            self.frozen,
            plan_search.iterations_left(self._screening_left()) if self.loaded else None,
        )

    def _screening_left(self) -> int | None:
        """Windows before every active class is screened (they screen side by side); None
        before any class was seen."""
        active = [s for s in self.classes.values() if self.exchanges - s.last_seen < IDLE_EXCHANGES]
        return max((s.windows_left() for s in active), default=None)

    def _screening_arm(self) -> Arm | None:
        """While classes screen: the incumbent, with each class on its search's current trial."""
        plan_search = self.plan_search
        assert plan_search is not None
        if plan_search.phase != "screening":
            return None
        arm = plan_search.incumbent
        for cls, search in self.classes.items():
            if search.state != "locked":
                arm = arm.with_class(cls, search.desired)
        return arm

    def _start(self) -> None:
        """At the first exchange: fingerprint the job, load what a previous job stored."""
        device, dtype = self.engine.device, self.engine.dtype
        assert device is not None and dtype is not None
        self.fingerprint = job_fingerprint(self.process_group, device, dtype, self.topology)
        self.key = fingerprint_key(self.fingerprint)
        layout = self.engine.layout
        self.workload = self.config.workload or workload_name(layout)
        if self.described is None:
            self.described = describe_layout(layout, dtype.itemsize)
        total = sum(n for n, _ in layout)
        _log.info(
            "autotune: this job's plan is stored as %s/%s (%s; the gradients as DDP first "
            "bucketed them: %d buckets, %s%s)",
            self.key,
            self.workload,
            ", ".join(f"{k}={v}" for k, v in self.fingerprint.items()),
            len(layout),
            format_bytes(total),
            "" if self.config.workload is None else "; named by Config.workload",
        )
        assert self.worker is not None
        self.worker.submit(self._load)

    def _load(self) -> None:
        """On the worker: what is stored for this job (`autotune.tuning.stored.read_stored`)."""
        stored = read_stored(self.store(), self.key, self.workload)
        self.post(lambda: self._loaded(stored))

    def _loaded(self, found: Stored) -> None:
        """The workload's stored plan, as far as this job can run it, is confirmed before it is
        locked; without one, a sweep's classes seed the search (`_class_search`)."""
        assert self.plan_search is not None
        self.loaded = True
        self.prior = found.prior
        self._seed = found.seed
        table = found.table
        stored = None
        if table is not None:
            stored = stored_arm(
                table,
                self.plan_search.baseline,
                lambda cls, choice: choice in self._space(cls),
                FUSION_OPTIONS if self.tune_fusion else None,
            )
            for cls, e in table.classes.items():
                if e.state == "locked":
                    search = self._class_search(cls)
                    search.lock(e.choice, e.best_s)
                    search.finished = e.trials  # as the job that tuned it left it
        self.buckets = None if table is None else table.buckets
        lead = None if table is None else table.lead
        self._resumable = table is None or not table.final
        if table is not None and not table.final:
            # A job that ended before it decided: its winner so far goes to the stage left (the
            # check against plain DDP, or the confirmation: `PlanSearch.start`); where none had
            # won, the search goes on past its fusion sizes.
            won = None if stored == self.plan_search.baseline else stored
            _log.info(
                "autotune: resuming the provisional plan a job stored before it decided: %s",
                "none had won yet, the search goes on" if won is None else won.describe(),
            )
            if won is None:
                self.plan_search.start(None, fusion_decided=table.fusion_bytes is not None)
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
        self.plan_search.start(stored, lead)

    def _runnable(self, arm: Arm) -> bool:
        """Whether this job can run ``arm``: its choices in their classes' search spaces, its
        fusion size one this job may tune to (or the baseline's)."""
        fusion_ok = arm.fusion_bytes == self.baseline.fusion_bytes or (
            self.tune_fusion and arm.fusion_bytes in FUSION_OPTIONS
        )
        return fusion_ok and all(c in self._space(cls) for cls, c in arm.choices)

    def _learn(self, window: wire.Window, arm: Arm, step_arm: Arm) -> None:
        """Rank 0, after the exchange: the step to the plan search (measured under
        ``step_arm``), latencies (measured under ``arm``) to the searches."""
        plan_search = self.plan_search
        if not self.loaded or plan_search is None:
            return
        self.exchanges += 1
        if window.step_s is not None:
            told = len(plan_search.history)
            plan_search.measure(step_arm, window.step_s)
            for kind, challenger, outcome in plan_search.history[told:]:
                g = outcome.gain
                _log.info(
                    "autotune %s paired test: %s %s, %.3fx the reference's step (%d pairs, 95%% "
                    "interval %.3f-%.3f): %s",
                    kind,
                    challenger.describe(),
                    _outcome_word(kind, outcome.challenger_won, g.ratio),
                    g.ratio,
                    g.pairs,
                    g.low,
                    g.high,
                    outcome.why,
                )
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
        assert plan_search is not None
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
        assert self.plan_search is not None
        default = self.plan_search.incumbent.choice(cls)
        universe = self._space(cls)
        default = default if default in universe else universe[0]
        space = universe
        if self.prior is not None:
            # Rank 0's order only: the wire's codes index the whole space, the same everywhere.
            # Choices the user listed (Config.algorithms) are all tried: ordered, never cut.
            asked = self.config.algorithms is not None
            ranks = dist.get_world_size(self.process_group)
            per_node = max(self.topology.ranks_per_node)
            space = self.prior.order(
                cls, ranks, universe, default, prune=not asked, ranks_per_node=per_node
            )
        # "/min": the least latency over ranks (wire.Window); studies stored before it held the
        # MAX, a different figure, and are not mixed in. Then the candidates' tag: a study per
        # set of candidates (`space_tag`).
        what = f"class={cls}/min/{space_tag(universe)}"
        search = ClassSearch(self, what, space, default, universe)
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
        """A sweep's screening of ``cls`` (its best choice and latency), where it seeds this job's
        first round and this job can run the choice; None otherwise."""
        entry = None if self._seed is None else self._seed.classes.get(cls)
        if (
            entry is None
            or entry.state != "locked"
            or entry.best_s is None
            or self.plan_search is None
            or self.plan_search.round != 0
            or entry.choice not in self._space(cls)
        ):
            return None
        return entry.choice, entry.best_s

    def screened(self) -> None:
        """A class search locked its best (the `Host` call): shortlist now if it was the last."""
        self._shortlist()

    def _store_provisional(self) -> None:
        """Rank 0, while undecided: once a paired test has ended or the phase has moved on, store
        what the job has learned as a provisional table (`Table.final` False), so a job that
        ends before it decides leaves the next one a place to resume (`_loaded`): the plan that
        has won so far (its classes locked), its gain so far, and the fusion size once that
        phase is over. Screening needs nothing: its trials are in the studies already."""
        plan_search = self.plan_search
        assert plan_search is not None
        at = (len(plan_search.history), plan_search.phase)
        if at == self._provisional_at or plan_search.phase in ("loading", "fusion"):
            return
        self._provisional_at = at
        table = self.table()
        incumbent = plan_search.incumbent
        won = incumbent.as_dict()
        classes = {
            cls: dataclasses.replace(e, state="locked" if cls in won else "exploring")
            for cls, e in table.classes.items()
        }
        provisional = dataclasses.replace(
            table, classes=classes, fusion_bytes=incumbent.fusion_bytes, final=False
        )
        assert self.worker is not None
        self.worker.submit(lambda: self.store().save_table(self.key, self.workload, provisional))

    def _store_table(self) -> None:
        """Rank 0: the plan locked (or fell back); store the table for the next job."""
        table = self.table()
        assert self.worker is not None
        self.worker.submit(lambda: self.store().save_table(self.key, self.workload, table))

    def table(self) -> Table:
        """The plan as rank 0 knows it, with each class's screening and the measured gain; on
        another rank, what every rank hears."""
        plan_search = self.plan_search
        if plan_search is None:
            classes = {
                cls: Entry(c, state=self.states.get(cls, "exploring"))
                for cls, c in self.engine.plan.table().items()
            }
            return Table(classes, self.arm.fusion_bytes, None, self.gain, model=self.described)
        plan = plan_search.incumbent
        state = "locked" if plan_search.phase == "locked" else "exploring"
        classes = {}
        for cls, search in sorted(self.classes.items()):
            choice = plan.choice(cls)
            classes[cls] = Entry(choice, search.values.get(choice), search.finished, state)
        fusion = None
        if plan_search.phase == "locked" or not self.tune_fusion:
            fusion = plan.fusion_bytes
        fingerprint = getattr(self, "fingerprint", None)
        table = Table(
            classes, fusion, fingerprint, plan_search.gain, plan_search.lead, model=self.described
        )
        # A stored bucket size holds while the baseline does: not once a plan (a stored lead's
        # retry, say) has won the job back for the hook.
        keeps = table.runs_without_hook
        return dataclasses.replace(table, buckets=self.buckets) if keeps else table

    def buckets_kept(self, buckets: Buckets) -> None:
        """Every rank, once `autotune.tuning.buckets` has decided (the hook no longer runs): the
        step gain is now the bucket size's over plain DDP's (None: the job's own buckets, 1.00x).
        Rank 0 stores the table with it for the next job."""
        self.buckets = buckets
        self.gain = buckets.gain
        if self.worker is not None and self.key:
            self._store_table()

    def progress(self) -> dict[int | str, Progress]:
        """Per size class (and "fusion"): state, trials, best latency, current choice."""
        out: dict[int | str, Progress] = {cls: s.progress() for cls, s in self.classes.items()}
        plan_search = self.plan_search
        if plan_search is not None and self.tune_fusion:
            fusion_state = (
                "locked" if plan_search.phase not in ("loading", "fusion") else "exploring"
            )
            duels = plan_search.duels("fusion")
            out["fusion"] = Progress(
                fusion_state, duels, None, plan_search.incumbent.fusion_bytes, duels
            )
        return out


def _outcome_word(kind: str, won: bool, ratio: float) -> str:
    """How a paired test ended for the challenger, as the log says it: a re-check the locked plan
    does not prove but stays ahead in on the median is "held" (it stays locked; see
    `PlanSearch`)."""
    if kind == "recheck" and not won:
        return "held" if ratio < 1.0 else "lost"
    return "won" if won else "lost"
