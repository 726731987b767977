"""One Optuna study searched live on rank 0: options measured in windows, the fastest locked. A size
class's algorithm x segment (`autotune.tuning.class_search.ClassSearch`) is screened on the latency
of its messages; what it finds only shortlists a challenger (`autotune.tuning.plan_search`).
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

from autotune.plan import Choice
from autotune.storage import Store, tell
from autotune.tuning.worker import Worker

if TYPE_CHECKING:
    import optuna

    from autotune.config import Config

__all__ = [
    "IN_FLIGHT",
    "NOT_MEASURED",
    "RACE_AFTER",
    "RACE_FACTOR",
    "RACE_FORESEEN",
    "SLOW_FACTOR",
    "Host",
    "Progress",
    "Search",
]

#: Starts the failure of a trial that measured nothing (its job ended, or it was not needed):
#: another job sharing the study does not take its option as tried.
NOT_MEASURED = "not measured: "
#: A trial measured this many times slower than the best so far fails at once.
SLOW_FACTOR = 10.0
#: A trial whose fastest window, after `RACE_AFTER` of them, is beyond this many times the best
#: median so far ends there, with the median of what it measured: it cannot be shortlisted (the
#: runner-up bar is `autotune.tuning.shortlist.RUNNER_UP_WITHIN`, 1.1x), and most of a class's
#: choices are that far behind (a screening's windows are the step's iterations).
RACE_FACTOR = 1.3
RACE_AFTER = 2
#: A trial's windows are ordered for its race alone (`Search.order`) once its first sample is
#: beyond this many times the best: a window's latency on a busy machine swings 2x, so a trial
#: only 1.3x behind after one is often back in the race after the next.
RACE_FORESEEN = 2.0
#: Windows already ordered when the decider gives an order (`Search.order`): the iteration the
#: exchange in flight measures and the one its orders were given for
#: (`autotune.tuning.tuner`: orders take effect two iterations on).
IN_FLIGHT = 2

T = TypeVar("T", bound=Hashable)


@dataclass
class Progress:
    """Where tuning stands for a size class (or the fusion size): what rank 0 knows."""

    state: str  # "loading", "exploring" or "locked"
    trials: int  # this round's (a fall-back re-opens the search in a new round)
    best_s: float | None
    choice: Choice | int | None
    trials_total: int = 0  # every round's, in this job


@dataclass
class _Trial(Generic[T]):
    handle: optuna.Trial
    option: T
    warmup_left: int
    values: list[float] = field(default_factory=list)


class Host(Protocol):
    """What a search needs from the tuner that owns it (rank 0's)."""

    @property
    def key(self) -> str: ...

    @property
    def frozen(self) -> bool: ...

    @property
    def worker(self) -> Worker | None: ...

    @property
    def config(self) -> Config: ...

    def post(self, job: Callable[[], None]) -> None: ...

    def store(self) -> Store: ...

    def screened(self) -> None:
        """A search has locked its best: its class may now be shortlisted."""


class Search(Generic[T]):
    """Rank 0's side of one study: ask an option, measure it for warmup + samples windows, tell
    the median; lock to the best after the budget or when the space is exhausted.

    Locked means screened: the best option is what this search shortlists. Whether it runs is
    decided on the training step (`autotune.tuning.plan_search`), never on latency alone."""

    def __init__(self, tuner: Host, what: str, space: list[T], default: T) -> None:
        assert tuner.worker is not None, "only rank 0 searches"
        self.tuner = tuner
        self.worker = tuner.worker
        self.what = what
        self.space = space
        self.desired: T = default
        self.default = default
        self.state = "exploring"
        self.round = 0  # the plan search's: a study per round
        self.trial: _Trial[T] | None = None
        self.asking = False
        #: The next trial, asked while this one measures (`_ask_ahead`): (trial, option, done).
        self._ahead: tuple[optuna.Trial, T, list[tuple[int, T, float | None]]] | None = None
        self._asking_ahead = False
        #: A trial begun ahead (`order`): its option is ordered while the one before measures.
        self._then: _Trial[T] | None = None
        self._flight: deque[T] = deque(maxlen=IN_FLIGHT)  # what the windows in flight run
        self._again: set[T] = set()  # options whose trial was handed on short once (`measure`)
        self.finished = 0  # trials told, this round
        self.trials_total = 0  # trials told by this job, every round (for a counter)
        self.tried: set[T] = set()
        self.best: tuple[T, float] | None = None
        self.values: dict[T, float] = {}  # option -> the median of its windows, as measured
        #: option -> the window that failed it as too slow (`SLOW_FACTOR`): it has no value.
        self.slow: dict[T, float] = {}
        self.study: optuna.Study | None = None
        self.last_seen = 0  # the tuner's exchange count when last measured
        self.counted: set[int] = set()  # numbers of the study's finished trials taken in

    def lock(self, option: T, best_s: float | None) -> None:
        """Stop searching: ``option`` is the best measured (``best_s``, None if unmeasured)."""
        self.state = "locked"
        self.desired = option
        self.best = None if best_s is None else (option, best_s)
        self.trial = None
        handles = [] if self._ahead is None else [self._ahead[0]]
        handles += [] if self._then is None else [self._then.handle]
        for handle in handles:
            self._tell(handle, None, NOT_MEASURED + "the search was over when it began")
        self._ahead = self._then = None

    def start(self) -> None:
        """Ask for the first (or next) trial."""
        if self.asking or self.trial is not None or self.state == "locked" or self.tuner.frozen:
            return
        ahead = self._take_ahead(self.tried)
        if ahead is not None:
            self._begin(*ahead)
            return
        self.asking = True
        if not self._asking_ahead:  # else it begins as it arrives (`_arrived`)
            self.worker.submit(self._ask)

    def order(self) -> T:
        """What the class runs at the iteration the orders given now reach; the decider asks
        once an exchange, while the class screens. Where the trial under way will have every
        window it needs from those already ordered for it (`IN_FLIGHT`), the trial asked ahead
        begins here, so its first window follows the last of them."""
        trial = self.trial
        if (
            trial is not None
            and self._then is None
            and self._left(trial, RACE_FORESEEN) <= sum(o == trial.option for o in self._flight)
        ):
            ahead = self._take_ahead(self.tried | {trial.option})
            if ahead is not None:
                handle, option, done = ahead
                self._take_in(done)
                self._then = _Trial(handle, option, self.tuner.config.tune_warmup)
                self.desired = option
        self._flight.append(self.desired)
        return self.desired

    def measure(self, in_effect: T, value: float) -> None:
        """A window's latency (the least over ranks, `autotune.tuning.wire`), run with
        ``in_effect``."""
        if self.state == "locked":
            return
        trial = self.trial
        if trial is not None and self._then is not None and in_effect == self._then.option:
            self._short(trial)  # the windows ordered for it are in, and it is not done
            trial = self.trial
        if trial is None or in_effect != trial.option:
            return
        if trial.warmup_left > 0:
            trial.warmup_left -= 1
            return
        if self.best is not None and value > SLOW_FACTOR * self.best[1]:
            self.slow[trial.option] = value
            self._finish(trial, None, f"slower than {SLOW_FACTOR:g}x the best so far")
            return
        trial.values.append(value)
        if self._left(trial) == 0:
            self._finish(trial, statistics.median(trial.values), None)

    def _left(self, trial: _Trial[T], behind: float = RACE_FACTOR) -> int:
        """The windows ``trial`` still needs: its warm-up, then its samples, or `RACE_AFTER` of
        them while its fastest so far is more than ``behind`` times the best median."""
        best, samples = self.best, self.tuner.config.tune_samples
        if trial.values and best is not None and min(trial.values) > behind * best[1]:
            samples = min(RACE_AFTER, samples)
        return trial.warmup_left + max(0, samples - len(trial.values))

    def _short(self, trial: _Trial[T]) -> None:
        """``trial`` handed the class on (`order`) and got fewer windows than it needs: a window
        without this class's messages, or a trial foreseen to be outrun (`RACE_FORESEEN`) that
        its next window put back in the race. It is asked again (once, at once: it is not
        counted as tried); a second time it ends with what it has."""
        if trial.option not in self._again:
            self._again.add(trial.option)
            self._tell(trial.handle, None, NOT_MEASURED + "handed on short; tried again later")
            self._promote()
        elif trial.values:
            self._finish(trial, statistics.median(trial.values), None)
        else:
            self._finish(trial, None, NOT_MEASURED + "its windows had no such messages")

    def windows_left(self) -> int:
        """Windows (iterations, while screening) this search still takes at most: its trials
        left, each warmup and samples, less what the trial under way has measured; 0 once
        locked."""
        if self.state == "locked":
            return 0
        s = self.tuner.config
        per_trial = s.tune_warmup + s.tune_samples
        trials = self._budget() - max(self.finished, len(self.tried.intersection(self.space)))
        # Those still to try as the race stands now (`ClassSearch`: fewer segment sizes).
        trials = min(trials, len(self._to_try(self.tried, self.values)))
        n = max(0, trials) * per_trial
        if self.trial is not None:
            n -= min(per_trial, s.tune_warmup - self.trial.warmup_left + len(self.trial.values))
        return max(0, n)

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
        if value is not None:
            self.values[trial.option] = value
            if self.best is None or value < self.best[1]:
                self.best = (trial.option, value)
        self._tell(trial.handle, value, failure)
        if self._then is not None:  # begun ahead, its windows ordered: it measures now
            self._promote()
        elif self._spent():
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

    def _ask(self, ahead: bool = False) -> None:
        """On the worker: open the study if needed, choose the next option, ask a trial for it
        (``ahead``: the one after the trial under way, `_ask_ahead`).

        The study may be shared with other jobs tuning the same fingerprint right now: what they
        measured counts here too, and what they are measuring is tried last.
        """
        from autotune.tuning.sampler import ask, open_study

        store = self.tuner.store()
        if self.study is None:
            self.study = open_study(store, self.tuner.key, f"{self.what}/r{self.round}")
        store.fail_stale_trials(self.study)  # only dead jobs' trials (heartbeats)
        done, running = self._study_trials(self.study)
        option = self._next(done, running)
        trial = ask(self.study, option, self.params_of(option), self.suggest)
        store.started(trial)
        begin = self._arrived if ahead else self._begin
        self.tuner.post(lambda: begin(trial, option, done))

    def _ask_ahead(self) -> None:
        """As a trial begins: ask the next one on the worker, so that it begins as soon as this
        one ends instead of a storage round trip later (several iterations of a quick step)."""
        current = self.trial
        if current is None or self._asking_ahead or self._ahead is not None:
            return
        if self.finished + 1 >= self._budget():
            return
        if not any(o != current.option for o in self._to_try(self.tried, self.values)):
            return
        self._asking_ahead = True
        self.worker.submit(lambda: self._ask(ahead=True))

    def _take_ahead(
        self, tried: set[T]
    ) -> tuple[optuna.Trial, T, list[tuple[int, T, float | None]]] | None:
        """The trial asked ahead, if any and its option is still to try after ``tried``; one
        that is not is told as not measured."""
        ahead, self._ahead = self._ahead, None
        if ahead is None or ahead[1] in self._to_try(tried, self.values):
            return ahead
        self._tell(ahead[0], None, NOT_MEASURED + "asked ahead, then not the next to try")
        return None

    def _promote(self) -> None:
        """The trial begun ahead (`order`) measures now; the next one is asked."""
        self.trial, self._then = self._then, None
        self._ask_ahead()

    def _arrived(
        self, trial: optuna.Trial, option: T, done: list[tuple[int, T, float | None]]
    ) -> None:
        """A trial asked ahead is here: it waits for the one under way, or begins now if that
        ended meanwhile."""
        self._asking_ahead = False
        if self.state == "locked":
            self._tell(trial, None, NOT_MEASURED + "the search was over when it was asked")
            return
        self._ahead = (trial, option, done)
        if self.asking:
            self.asking = False
            self.start()

    def _study_trials(
        self, study: optuna.Study
    ) -> tuple[list[tuple[int, T, float | None]], set[T]]:
        """The study's finished trials, (number, option, value: None if failed), and the options
        of its running trials (other jobs', and the one this job measures while it asks ahead)."""
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
        """The first option still to try (`_to_try`); what another job is measuring now comes
        after those (both may measure it: nothing waits on another job)."""
        measured = set(self.tried) | {option for _, option, _ in done}
        values = {o: v for _, o, v in done if v is not None} | self.values
        fresh = self._to_try(measured, values)
        return next((o for o in fresh if o not in running), fresh[0] if fresh else self.default)

    def _order(self) -> list[T]:
        """The space in the order it is tried: the job's current choice first."""
        return [self.default, *(o for o in self.space if o != self.default)]

    def _to_try(self, measured: set[T], values: Mapping[T, float]) -> list[T]:
        """The options still to try, in order, given those ``measured`` (``values``: their
        medians); none once the budget (`Config.tune_trials`) is spent."""
        if self.finished >= self.tuner.config.tune_trials:
            return []
        return [o for o in self._order() if o not in measured]

    def _budget(self) -> int:
        """The trials this search takes at most."""
        return min(self.tuner.config.tune_trials, len(self.space))

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
        self._take_in(done)
        if self.state == "locked" or self._spent():
            # Locked meanwhile, or nothing left to try: the trial just asked for is not needed.
            self._tell(trial, None, NOT_MEASURED + "the search was over when it was asked")
            if self.state != "locked":
                self._lock_best()
            return
        self.trial = _Trial(trial, option, self.tuner.config.tune_warmup)
        self.desired = option
        self._ask_ahead()

    def _take_in(self, done: list[tuple[int, T, float | None]]) -> None:
        """Trials of the study finished by earlier jobs, or by jobs running beside this one."""
        for number, measured, value in done:
            if number in self.counted:
                continue
            self.counted.add(number)
            self.finished += 1
            self.tried.add(measured)
            if value is not None:
                self.values.setdefault(measured, value)
                if self.best is None or value < self.best[1]:
                    self.best = (measured, value)

    def _spent(self) -> bool:
        # Another job may have measured choices this one leaves out: they do not count here.
        return not self._to_try(self.tried, self.values)

    def _lock_best(self) -> None:
        best = self.best
        self.lock(best[0] if best else self.default, best[1] if best else None)
        self.tuner.screened()
