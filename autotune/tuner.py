"""The live tuner: Optuna studies per message-size class (algorithm x segment) and for the job's
fusion size, owned by rank 0; every rank follows the plan rank 0 sends at iteration ends.

After an iteration, one MAX all-reduce starts on a group of the tuner's own, carrying each rank's
latencies (the slowest rank sets DDP's pace) together with rank 0's plan codes (the other ranks
send zeros). It travels during the next iteration's compute and is finished at that iteration's
end, at the same point of the bucket sequence on every rank, where every rank applies the codes
it received: all ranks always run the same algorithm for the same message. Optuna's ask, tell and
storage writes run on a worker thread on rank 0, off the training's critical path.
"""

from __future__ import annotations

import logging
import queue
import statistics
import threading
import time
from collections import deque
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

import torch
import torch.distributed as dist

from autotune.algorithms import bookkeeping_device
from autotune.events import Event, Failure, IterationDone, IterationEnd
from autotune.plan import Choice, Entry, Table, size_class
from autotune.space import choice_of, params_of, search_space, suggest_choice
from autotune.stats import MessageRecord
from autotune.store import Store, fingerprint_key, job_fingerprint, storage_url, tell

if TYPE_CHECKING:
    import optuna

    from autotune.config import Config
    from autotune.engine import Engine

__all__ = ["FUSION_OPTIONS", "Progress", "Tuner"]

_log = logging.getLogger("autotune")

#: Starts the failure of a trial that measured nothing (its job ended, or it was not needed):
#: another job sharing the study does not take its option as tried.
NOT_MEASURED = "not measured: "
#: Fusion sizes searched when ``Config.fusion_bytes`` is None (0: DDP's buckets as they are).
FUSION_OPTIONS = (0, 1 << 20, 4 << 20, 16 << 20)
#: Once everything is locked, exchange (and watch for drift) every this many iterations.
WATCH_EVERY = 10
#: Re-open a locked class after this many slow watches in a row.
DRIFT_PATIENCE = 3
#: A trial measured this many times slower than the best so far fails at once.
SLOW_FACTOR = 10.0
#: A size class not measured for this many exchanges is idle: it no longer keeps tuning on
#: (the first iteration's buckets, before DDP rebuilds them, for one).
IDLE_EXCHANGES = 10

_CLASSES = 48  # size classes 2^0 .. 2^47 bytes
_LAT, _EXPOSED = 0, _CLASSES
_CODE = _CLASSES + 1
_STATE = _CODE + _CLASSES
_FUSION = _STATE + _CLASSES
_CADENCE = _FUSION + 1
_WIDTH = _CADENCE + 1
_EXPLORING, _LOCKED = 1, 2

T = TypeVar("T", bound=Hashable)
#: What a window of measurements ran under: explicit choices, fusion size, exchange cadence.
_Plan = tuple[dict[int, Choice], int, int]


@dataclass
class Progress:
    """Where tuning stands for a size class (or the fusion size): what rank 0 knows."""

    state: str  # "loading", "exploring" or "locked"
    trials: int  # this round's (a drift re-opens a class in a new round)
    best_s: float | None
    choice: Choice | int | None
    trials_total: int = 0  # every round's, in this job


@dataclass
class _Trial(Generic[T]):
    handle: optuna.Trial
    option: T
    warmup_left: int
    values: list[float] = field(default_factory=list)


class _Host(Protocol):
    """What a search needs from the tuner that owns it (rank 0's)."""

    @property
    def key(self) -> str: ...

    @property
    def frozen(self) -> bool: ...

    @property
    def worker(self) -> _Worker | None: ...

    @property
    def config(self) -> Config: ...

    def post(self, job: Callable[[], None]) -> None: ...

    def store(self) -> Store: ...

    def table_changed(self) -> None: ...


class _Search(Generic[T]):
    """Rank 0's side of one study: ask an option, measure it for warmup + samples windows, tell
    the median; lock to the best after the budget or when the space is exhausted; while locked,
    re-open if the locked option's latency drifts beyond ``drift_ratio`` of its best."""

    def __init__(self, tuner: _Host, what: str, space: list[T], default: T) -> None:
        assert tuner.worker is not None, "only rank 0 searches"
        self.tuner = tuner
        self.worker = tuner.worker
        self.what = what
        self.space = space
        self.desired: T = default
        self.default = default
        self.state = "exploring"
        self.round = 0
        self.trial: _Trial[T] | None = None
        self.asking = False
        self.finished = 0  # trials told, this round
        self.trials_total = 0  # trials told by this job, every round (for a counter)
        self.tried: set[T] = set()
        self.best: tuple[T, float] | None = None
        self.strikes = 0
        self.baseline_s: float | None = None  # what drift is judged against, once locked
        self._baseline_values: list[float] = []
        self.study: optuna.Study | None = None
        self.last_seen = 0  # the tuner's exchange count when last measured
        self.counted: set[int] = set()  # numbers of the study's finished trials taken in

    def lock(self, option: T, best_s: float | None, *, measured_here: bool = True) -> None:
        """Run ``option`` from now on. Its drift is judged against ``best_s`` if this job measured
        it; a plan from elsewhere (an earlier job, `autotune sweep --tune`) ran under other
        conditions, so its baseline is the median of this job's first steady windows."""
        self.state = "locked"
        self.desired = option
        self.best = None if best_s is None else (option, best_s)
        self.baseline_s = best_s if measured_here else None
        self._baseline_values = []
        self.trial = None
        self.strikes = 0

    def start(self) -> None:
        """Ask for the first (or next) trial."""
        if self.asking or self.trial is not None or self.state == "locked" or self.tuner.frozen:
            return
        self.asking = True
        self.worker.submit(self._ask)

    def measure(self, in_effect: T, value: float) -> None:
        """A window's MAX-over-ranks latency, run with ``in_effect``."""
        s = self.tuner.config
        if self.state == "locked":
            if in_effect != self.desired:
                return
            if self.baseline_s is None:
                self._baseline_values.append(value)
                if len(self._baseline_values) >= s.tune_samples:
                    self.baseline_s = statistics.median(self._baseline_values)
                return
            self.strikes = self.strikes + 1 if value > s.drift_ratio * self.baseline_s else 0
            if self.strikes >= DRIFT_PATIENCE:  # drifted: tune this one again, from scratch
                self.state, self.round, self.finished = "exploring", self.round + 1, 0
                self.tried.clear()
                self.best = None
                self.study = None
                self.start()
            return
        trial = self.trial
        if trial is None or in_effect != trial.option:
            return
        if trial.warmup_left > 0:
            trial.warmup_left -= 1
            return
        if self.best is not None and value > SLOW_FACTOR * self.best[1]:
            self._finish(trial, None, f"slower than {SLOW_FACTOR:g}x the best so far")
            return
        trial.values.append(value)
        if len(trial.values) >= s.tune_samples:
            self._finish(trial, statistics.median(trial.values), None)

    def progress(self) -> Progress:
        best = self.best[1] if self.best else None
        choice = self.desired if isinstance(self.desired, (Choice, int)) else None
        return Progress(self.state, self.finished, best, choice, self.trials_total)

    def _finish(self, trial: _Trial[T], value: float | None, failure: str | None) -> None:
        self.trial = None
        self.finished += 1
        self.trials_total += 1
        self.tried.add(trial.option)
        self.counted.add(trial.handle.number)
        if value is not None and (self.best is None or value < self.best[1]):
            self.best = (trial.option, value)
        self._tell(trial.handle, value, failure)
        if self._spent():
            self._lock_best()
        else:
            self.start()

    def _tell(self, handle: optuna.Trial, value: float | None, failure: str | None) -> None:
        """Record a trial's result from the worker; its job stops beating for it."""
        study, store = self.study, self.tuner.store()
        assert study is not None

        def told() -> None:
            tell(study, handle, value, failure)
            store.told(handle)

        self.worker.submit(told)

    def _ask(self) -> None:
        """On the worker: open the study if needed, choose the next option, ask a trial for it.

        The study may be shared with other jobs tuning the same fingerprint right now: what they
        measured counts here too, and what they are measuring is tried last.
        """
        from autotune.sampler import GivenSampler

        store = self.tuner.store()
        if self.study is None:
            sampler = GivenSampler()
            self.study = store.study(self.tuner.key, f"{self.what}/r{self.round}", sampler)
        store.fail_stale_trials(self.study)  # only dead jobs' trials (heartbeats)
        done, running = self._study_trials(self.study)
        option = self._next(done, running)
        given = self.study.sampler
        assert isinstance(given, GivenSampler)
        given.params = self.params_of(option)
        trial = self.study.ask()
        assert self.suggest(trial) == option
        store.started(trial)
        self.tuner.post(lambda: self._begin(trial, option, done))

    def _study_trials(
        self, study: optuna.Study
    ) -> tuple[list[tuple[int, T, float | None]], set[T]]:
        """The study's finished trials, (number, option, value: None if failed), and the options
        of its running trials (other jobs': this one asks one at a time)."""
        from optuna.trial import TrialState

        done: list[tuple[int, T, float | None]] = []
        running: set[T] = set()
        states = (TrialState.COMPLETE, TrialState.FAIL, TrialState.RUNNING)
        for t in study.get_trials(deepcopy=False, states=states):
            option = self.option_of(t.params)
            failure = str(t.user_attrs.get("failure", NOT_MEASURED))  # none: a dead job's
            if option is None or (t.state == TrialState.FAIL and failure.startswith(NOT_MEASURED)):
                continue
            if t.state == TrialState.RUNNING:
                running.add(option)
            else:
                done.append((t.number, option, t.value if t.state == TrialState.COMPLETE else None))
        return done, running

    def _next(self, done: list[tuple[int, T, float | None]], running: set[T]) -> T:
        """The first option nobody measured, the job's current choice first; what another job is
        measuring now comes after those (both may measure it: nothing waits on another job)."""
        measured = set(self.tried) | {option for _, option, _ in done}
        order = [self.default, *(o for o in self.space if o != self.default)]
        fresh = [o for o in order if o not in measured]
        return next((o for o in fresh if o not in running), fresh[0] if fresh else order[0])

    def params_of(self, option: T) -> dict[str, Any]:
        """The trial parameters that stand for ``option`` (the inverse of `option_of`)."""
        return {"option": self.space.index(option)}

    def option_of(self, params: dict[str, Any]) -> T | None:
        """The option a trial's parameters stand for (None: not in this job's space)."""
        index = params.get("option")
        return self.space[index] if isinstance(index, int) and index < len(self.space) else None

    def suggest(self, trial: optuna.Trial) -> T:
        index = trial.suggest_categorical("option", list(range(len(self.space))))
        trial.set_user_attr("option", repr(self.space[index]))
        return self.space[index]

    def _begin(
        self, trial: optuna.Trial, option: T, done: list[tuple[int, T, float | None]]
    ) -> None:
        self.asking = False
        for number, measured, value in done:  # by earlier jobs, or by jobs running beside us
            if number in self.counted:
                continue
            self.counted.add(number)
            self.finished += 1
            self.tried.add(measured)
            if value is not None and (self.best is None or value < self.best[1]):
                self.best = (measured, value)
        if self.state == "locked" or self._spent():
            # Locked meanwhile, or nothing left to try: the trial just asked for is not needed.
            self._tell(trial, None, NOT_MEASURED + "the search was over when it was asked")
            if self.state != "locked":
                self._lock_best()
            return
        self.trial = _Trial(trial, option, self.tuner.config.tune_warmup)
        self.desired = option

    def _spent(self) -> bool:
        return self.finished >= self.tuner.config.tune_trials or len(self.tried) >= len(self.space)

    def _lock_best(self) -> None:
        best = self.best
        self.lock(best[0] if best else self.default, best[1] if best else None)
        self.tuner.table_changed()


class _ClassSearch(_Search[Choice]):
    """Algorithm x segment for one size class, as readable study parameters."""

    def option_of(self, params: dict[str, Any]) -> Choice | None:
        return choice_of(params, self.space)

    def params_of(self, option: Choice) -> dict[str, Any]:
        return params_of(option)

    def suggest(self, trial: optuna.Trial) -> Choice:
        return suggest_choice(trial, self.space)


class _Worker:
    """Runs Optuna's calls on rank 0, one at a time, off the training's critical path; between
    them, every ``tick_s``, ``tick`` (the heartbeat of the job's running trials)."""

    def __init__(self, tick: Callable[[], None] = lambda: None, tick_s: float = 5.0) -> None:
        self._tick, self._tick_s = tick, tick_s
        self._jobs: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._loop, name="autotune-optuna", daemon=True)
        self._thread.start()

    def submit(self, job: Callable[[], None]) -> None:
        self._jobs.put(job)

    def close(self, timeout_s: float) -> None:
        self._jobs.put(None)
        self._thread.join(timeout_s)

    def _loop(self) -> None:
        while True:
            try:
                job = self._jobs.get(timeout=self._tick_s)
            except queue.Empty:
                job = self._tick
            if job is None:
                return
            if self.error is not None:
                continue
            try:
                job()
                if job is not self._tick:  # busy: beat between jobs too (the store rate-limits)
                    self._tick()
            except BaseException as exc:  # reported on the finish thread, at the next exchange
                self.error = exc


class Tuner:
    """Tunes ``engine``'s plan live over ``group`` (the job's); `AutotuneState` makes one when
    ``config.algorithm`` is "auto" and no plan file is given."""

    def __init__(self, engine: Engine, group: dist.ProcessGroup, config: Config) -> None:
        self.engine = engine
        self.process_group = group
        self.config = config
        self.rank = dist.get_rank(group)
        self.candidates = config.candidates
        self.tune_fusion = config.fusion_bytes is None
        self.cadence = _EXPLORING
        self.key = ""
        self.loaded = False
        self.classes: dict[int, _ClassSearch] = {}
        self._spaces: dict[int, list[Choice]] = {}
        self.exchanges = 0
        self.fusion: _Search[int] | None = None
        self.in_effect: dict[int, Choice] = {}  # explicit choices all ranks run now
        #: Per size class, whether rank 0 is exploring or has locked it, as every rank hears it.
        self.states: dict[int, str] = {}
        self._window: dict[int, list[float]] = {}
        self._exposed: list[float] = []
        self._inbox: deque[Callable[[], None]] = deque()
        self._store: Store | None = None
        self._exchange_device: torch.device | None = None
        # The exchange in flight: started at one iteration end, finished at the next, with the
        # plan its measurements ran under.
        self._exchange: tuple[dist.Work, torch.Tensor, _Plan] | None = None
        self._window_plan: _Plan = ({}, engine.fusion_bytes, self.cadence)
        self.frozen = False  # rank 0 stops tuning if its storage fails mid-job
        # The exchange's own group: it runs alongside the next iteration's messages, and
        # collectives on a shared group would have to be issued in the same order everywhere.
        # Made before the storage is opened, which can fail on rank 0 alone.
        self.group = _exchange_group(group, config.timeout_s)
        self.worker = _Worker(self._beat) if self.rank == 0 else None
        if self.worker is not None:
            self._open_store()
        self._received: tuple[list[float], _Plan] | None = None
        #: Seconds each iteration's off-path work took (learning, deciding, starting the exchange).
        self.off_path_s: deque[float] = deque(maxlen=100_000)
        engine.subscribe(self._on_event)

    # -- every rank -------------------------------------------------------------------------

    def _on_event(self, event: Event) -> None:
        if isinstance(event, MessageRecord):
            self._window.setdefault(event.size_class, []).append(event.seconds)
        elif isinstance(event, IterationEnd):
            self._on_iteration_end(event.iteration, event.exposed_s)
        elif isinstance(event, IterationDone):
            self._after_iteration(event.iteration)
        elif isinstance(event, Failure):
            self._on_failure(event.error)

    def _on_iteration_end(self, iteration: int, exposed_s: float) -> None:
        """Before this iteration's futures complete: take in the exchange started one iteration
        ago, so the plan it carries is in effect for every rank's next iteration."""
        self._exposed.append(exposed_s)
        if self._exchange is not None:
            work, result, measured_under = self._exchange
            self._exchange = None
            work.wait(timedelta(seconds=self.config.timeout_s))
            self._received = (result.tolist(), measured_under)
            self._apply(self._received[0])  # takes effect from the next iteration

    def _after_iteration(self, iteration: int) -> None:
        """After the futures (off the step's critical path): learn, decide, start the next
        exchange, which travels during the next iteration's compute."""
        begin = time.perf_counter()
        if self._received is not None:
            everyone, measured_under = self._received
            self._received = None
            if self.rank == 0:
                self._learn(everyone, *measured_under)
        now = (self.in_effect.copy(), self.engine.fusion_bytes, self.cadence)
        if self.cadence == _LOCKED and iteration % WATCH_EVERY:
            if now != self._window_plan:  # a window holds one plan's messages, or none
                self._new_window(now)
        else:
            # Plain lists, one tensor: this thread competes with training for the GIL.
            mine = [-1.0] * _EXPOSED + [0.0] * (_WIDTH - _EXPOSED)
            for cls, seconds in self._window.items():
                mine[_index(cls)] = statistics.median(seconds)
            mine[_EXPOSED] = statistics.median(self._exposed) if self._exposed else -1.0
            if self.rank == 0:
                self._decide(mine)
            tensor = torch.tensor(mine, dtype=torch.float64)
            self._exchange = (*self._start_all_reduce_max(tensor), self._window_plan)
            self._new_window(now)
        self.off_path_s.append(time.perf_counter() - begin)

    def _new_window(self, plan: _Plan) -> None:
        self._window.clear()
        self._exposed.clear()
        self._window_plan = plan

    def _start_all_reduce_max(self, mine: torch.Tensor) -> tuple[dist.Work, torch.Tensor]:
        group = self.group
        if self._exchange_device is None:
            assert self.engine.device is not None
            self._exchange_device = bookkeeping_device(group, self.engine.device)
        t = mine.to(self._exchange_device)
        work = dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group, async_op=True)
        assert work is not None
        return work, t

    def _apply(self, everyone: list[float]) -> None:
        engine = self.engine
        for i, raw in enumerate(everyone[_STATE : _STATE + _CLASSES]):
            if raw:
                self.states[1 << i] = "locked" if int(raw) == _LOCKED else "exploring"
        for i, raw in enumerate(everyone[_CODE : _CODE + _CLASSES]):
            code = int(raw)
            if code:
                cls = 1 << i
                choice = self._space(cls)[code - 1]
                if self.in_effect.get(cls) != choice:
                    engine.plan.set(cls, choice)
                    self.in_effect[cls] = choice
        fusion = int(everyone[_FUSION])
        if fusion:
            engine.fusion_bytes = FUSION_OPTIONS[fusion - 1]
        self.cadence = int(everyone[_CADENCE]) or _EXPLORING

    def _on_failure(self, error: BaseException) -> None:
        if self.worker is None:
            return
        # The job is going down: record the trials in flight as failed, not as fast.
        self._abandon(NOT_MEASURED + repr(error))
        self.worker.close(timeout_s=10.0)

    @property
    def settled(self) -> bool:
        """Whether every rank knows that everything is locked (exchanges are down to watching)."""
        return self.cadence == _LOCKED

    def close(self) -> None:
        if self.worker is not None:
            self._abandon(NOT_MEASURED + "the job ended before the trial finished")
            self.worker.close(timeout_s=30.0)

    def _abandon(self, why: str) -> None:
        """After what the worker has queued: fail the trials still running, asked or measuring."""
        assert self.worker is not None
        for search in self._searches():
            search.trial = None
        self.worker.submit(lambda: self._store.abandon(why) if self._store is not None else None)

    def _beat(self) -> None:
        if self._store is not None:
            self._store.beat()

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
            self._store = Store(storage_url(self.config.storage))
        return self._store

    def _space(self, cls: int) -> list[Choice]:
        space = self._spaces.get(cls)
        if space is None:
            space = self._spaces[cls] = search_space(cls, self.candidates)
        return space

    def _decide(self, mine: list[float]) -> None:
        """Rank 0, before the exchange: take in the worker's answers; write the plan codes."""
        assert self.worker is not None
        if self.worker.error is not None and not self.frozen:
            # Training goes on with the plan as it stands; the error is not swallowed.
            _log.error(
                "autotune tuner stops tuning, keeping the current plan: its Optuna storage "
                "failed: %r",
                self.worker.error,
            )
            self.frozen = True
            for search in self._searches():
                search.lock(search.desired, search.best[1] if search.best else None)
        if not self.key:
            self._start()
        while self._inbox:
            self._inbox.popleft()()
        for cls, search in self.classes.items():
            mine[_CODE + _index(cls)] = self._space(cls).index(search.desired) + 1
            mine[_STATE + _index(cls)] = _LOCKED if search.state == "locked" else _EXPLORING
        if self.fusion is not None:
            mine[_FUSION] = FUSION_OPTIONS.index(self.fusion.desired) + 1
        active = [s for s in self.classes.values() if self.exchanges - s.last_seen < IDLE_EXCHANGES]
        settled = (
            self.loaded
            and self.exchanges > 0  # the job's classes are known only from its messages
            and (self.fusion is None or self.fusion.state == "locked")
            and bool(active)
            and all(s.state == "locked" for s in active)
        )
        mine[_CADENCE] = _LOCKED if settled else _EXPLORING

    def _start(self) -> None:
        """At the first exchange: fingerprint the job, load what a previous job locked in."""
        device, dtype = self.engine.device, self.engine.dtype
        assert device is not None and dtype is not None
        self.fingerprint = job_fingerprint(self.process_group, device, dtype)
        self.key = fingerprint_key(self.fingerprint)
        assert self.worker is not None
        self.worker.submit(lambda: self._load(self.store().load_table(self.key)))

    def _load(self, table: Table | None) -> None:
        self.post(lambda: self._loaded(table))

    def _loaded(self, table: Table | None) -> None:
        self.loaded = True
        if table is not None:
            for cls, entry in table.classes.items():
                if entry.state == "locked" and entry.choice in self._space(cls):
                    search = self._class_search(cls)
                    search.lock(entry.choice, entry.best_s, measured_here=False)
                    search.finished = entry.trials  # as the job that tuned it left it
        if self.tune_fusion:
            self.fusion = _Search(self, "fusion", list(FUSION_OPTIONS), 0)
            if table is not None and table.fusion_bytes in FUSION_OPTIONS:
                self.fusion.lock(table.fusion_bytes, None, measured_here=False)
            else:
                self.fusion.start()

    def _learn(
        self, everyone: list[float], in_effect: dict[int, Choice], fusion_bytes: int, cadence: int
    ) -> None:
        """Rank 0, after the exchange: feed the window's latencies to the studies.

        A locked choice is judged for drift only on steady windows (everything locked): while
        something else explores, every latency is disturbed.
        """
        if not self.loaded:
            return
        self.exchanges += 1
        if self.fusion is not None:
            if self.fusion.state != "locked":
                exposed = everyone[_EXPOSED]
                if exposed >= 0:
                    self.fusion.measure(fusion_bytes, exposed)
                return  # message classes are settled only once the fusion size is
            if fusion_bytes != self.fusion.desired:
                return  # the window ran under a fusion trial: its classes are not this job's
        default = self.engine.plan
        for i, latency in enumerate(everyone[_LAT : _LAT + _CLASSES]):
            if latency < 0:
                continue
            cls = 1 << i
            search = self.classes.get(cls) or self._class_search(cls)
            search.last_seen = self.exchanges
            search.start()
            if search.state == "locked" and cadence != _LOCKED:
                continue
            search.measure(in_effect.get(cls) or default.choice(cls), latency)

    def _class_search(self, cls: int) -> _ClassSearch:
        default = self.engine.plan.choice(cls)
        space = self._space(cls)
        search = _ClassSearch(
            self, f"class={cls}", space, default if default in space else space[0]
        )
        self.classes[cls] = search
        return search

    def _searches(self) -> list[_Search[Any]]:
        return [*self.classes.values(), *([self.fusion] if self.fusion else [])]

    def table_changed(self) -> None:
        """Rank 0: something locked; store the table for the next job."""
        table = self.table()
        assert self.worker is not None
        self.worker.submit(lambda: self.store().save_table(self.key, table))

    def table(self) -> Table:
        """The plan as rank 0 knows it, with each class's progress."""
        classes = {}
        for cls, search in sorted(self.classes.items()):
            p = search.progress()
            classes[cls] = Entry(search.desired, p.best_s, p.trials, p.state)
        fusion = None
        if self.fusion is not None and self.fusion.state == "locked":
            fusion = self.fusion.desired
        elif not self.tune_fusion:
            fusion = self.config.fusion_bytes
        return Table(classes, fusion, getattr(self, "fingerprint", None))

    def progress(self) -> dict[int | str, Progress]:
        """Per size class (and "fusion"): state, trials, best latency, current choice."""
        out: dict[int | str, Progress] = {cls: s.progress() for cls, s in self.classes.items()}
        if self.fusion is not None:
            out["fusion"] = self.fusion.progress()
        return out


def _exchange_group(group: dist.ProcessGroup, timeout_s: float) -> dist.ProcessGroup:
    made = dist.new_group(
        ranks=dist.get_process_group_ranks(group),
        backend=dist.get_backend_config(group),
        timeout=timedelta(seconds=timeout_s),
        use_local_synchronization=True,
        group_desc=f"autotune_tuner:{group.group_name}",
    )
    assert isinstance(made, dist.ProcessGroup)
    return made


def _index(cls: int) -> int:
    assert cls == size_class(cls)
    return cls.bit_length() - 1
