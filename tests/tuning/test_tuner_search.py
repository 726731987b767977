"""The tuner's search for one size class, driven directly: what it measures, tells and locks.

A stand-in for the tuner runs the real Optuna worker against a real SQLite storage and hands the
worker's answers back in order, as the finish thread does at each exchange.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

import optuna
import pytest
from optuna.trial import TrialState

from autotune import Config
from autotune.plan import Choice
from autotune.storage import Store
from autotune.tuning.class_search import SEGMENTS_WITHIN, WIRE_SHORTLIST, ClassSearch
from autotune.tuning.sampler import GivenSampler
from autotune.tuning.search import (
    IN_FLIGHT,
    NOT_MEASURED,
    RACE_AFTER,
    RACE_FACTOR,
    RACE_FORESEEN,
    SLOW_FACTOR,
    Search,
)
from autotune.tuning.shortlist import shortlist
from autotune.tuning.space import choice_of, search_space, suggest_choice
from autotune.tuning.worker import Worker


class StandIn:
    """What a `Search` uses of its tuner."""

    def __init__(self, url: str, **config: Any) -> None:
        self.url = url
        self.worker = Worker()
        self.key = "test"
        self.frozen = False
        self.config = Config(**config)
        self.screened_calls = 0
        self._inbox: deque[Callable[[], None]] = deque()
        self._store: Store | None = None

    def store(self) -> Store:
        if self._store is None:
            self._store = Store(self.url)
        return self._store

    def post(self, job: Callable[[], None]) -> None:
        self._inbox.append(job)

    def screened(self) -> None:
        self.screened_calls += 1

    def pump(self) -> None:
        """Let the worker finish what it was given, then run its answers (an exchange)."""
        done = threading.Event()
        self.worker.submit(done.set)
        while not done.wait(0.05):
            assert self.worker.error is None, self.worker.error  # it skips jobs after an error
        assert self.worker.error is None, self.worker.error
        while self._inbox:
            self._inbox.popleft()()


pytestmark = pytest.mark.filterwarnings("ignore::optuna.exceptions.ExperimentalWarning")


@pytest.fixture
def tuner(tmp_path: Path) -> StandIn:
    return StandIn(f"sqlite:///{tmp_path / 'tuning.db'}", tune_warmup=1, tune_samples=3)


def latency_of(option: str) -> float:
    return {"a": 1.0, "b": 2.0, "c": 3.0}[option]


def run(search: Search[str], tuner: StandIn, latency: Callable[[str], float], windows: int) -> None:
    """``windows`` exchanges, each measuring the option in effect at ``latency(option)``."""
    for _ in range(windows):
        tuner.pump()
        search.start()
        in_effect = search.desired
        search.measure(in_effect, latency(in_effect))


def trials(tuner: StandIn, what: str = "x/r0") -> list[optuna.trial.FrozenTrial]:
    study = optuna.load_study(study_name=f"autotune/test/{what}", storage=tuner.url)
    return study.get_trials()


def test_warmup_samples_median_then_lock_to_the_best(tuner: StandIn) -> None:
    search = Search(tuner, "x", ["a", "b", "c"], "c")
    tuner.pump()
    search.start()
    tuner.pump()
    assert search.trial is not None
    first = search.trial.option
    for value in (50.0, 3.0, 2.0, 2.5):  # a warm-up occurrence (dropped), then three samples
        search.measure(first, value)
    tuner.pump()
    told = trials(tuner)
    assert told[0].state == TrialState.COMPLETE and told[0].value == 2.5  # their median
    run(search, tuner, latency_of, 20)  # the others at their latency: a 1.0, b 2.0, c 3.0
    assert search.state == "locked"
    assert search.desired == ("b" if first == "a" else "a")
    assert tuner.screened_calls == 1
    tuner.pump()
    assert len(trials(tuner)) == 3  # the space is exhausted: no more than its 3 options


def test_a_measurement_under_another_option_is_not_counted(tuner: StandIn) -> None:
    search = Search(tuner, "x", ["a", "b"], "a")
    tuner.pump()
    search.start()
    tuner.pump()
    assert search.trial is not None
    other = "b" if search.trial.option == "a" else "a"
    for _ in range(10):
        search.measure(other, 1.0)  # e.g. the window before the plan change took effect
    assert search.trial is not None and search.trial.values == []


def test_far_slower_trial_fails_instead_of_counting_as_fast(tuner: StandIn) -> None:
    search = Search(tuner, "x", ["a", "slow"], "a")
    search.best = ("a", 1.0)
    search.tried.add("a")
    search.finished = 1
    tuner.pump()
    search.start()
    tuner.pump()
    assert search.trial is not None
    option = search.trial.option
    search.measure(option, 0.0)  # warm-up
    search.measure(option, SLOW_FACTOR * 1.0 + 1)
    tuner.pump()
    failed = [t for t in trials(tuner) if t.state == TrialState.FAIL]
    assert len(failed) == 1 and "slower than" in failed[0].user_attrs["failure"]
    assert search.best == ("a", 1.0)


def test_a_trial_far_behind_the_best_ends_early_and_one_near_it_measures_in_full(
    tuner: StandIn,
) -> None:
    """Racing: past `RACE_AFTER` windows, a trial whose fastest is beyond `RACE_FACTOR` times
    the best median stops with the median of what it has; a close one takes every sample."""
    search = Search(tuner, "x", ["a", "near", "far"], "a")
    tuner.pump()
    search.start()
    tuner.pump()
    latency = {"a": 1.0, "near": 0.95 * RACE_FACTOR, "far": 1.05 * RACE_FACTOR}
    seen: dict[str, int] = {}
    for _ in range(40):
        if search.state == "locked":
            break
        tuner.pump()
        search.start()
        if search.trial is None:
            continue
        option = search.trial.option
        seen[option] = seen.get(option, 0) + 1
        search.measure(option, latency[option] * (1.0 + 0.001 * seen[option]))
    assert search.state == "locked" and search.desired == "a"
    tuner.pump()
    told = {t.params["option"]: t for t in trials(tuner)}
    assert {t.state for t in told.values()} == {TrialState.COMPLETE}
    assert seen == {"a": 1 + 3, "near": 1 + 3, "far": 1 + RACE_AFTER}  # warm-up + samples
    far = told[search.space.index("far")]
    assert far.value == pytest.approx(1.05 * RACE_FACTOR * (1.0 + 0.001 * 2.5))  # median of 2
    near = told[search.space.index("near")]
    assert near.value == pytest.approx(0.95 * RACE_FACTOR * 1.003)  # median of 3


def test_racing_never_asks_more_samples_than_tune_samples(tmp_path: Path) -> None:
    tuner = StandIn(f"sqlite:///{tmp_path / 't.db'}", tune_warmup=0, tune_samples=1)
    search = Search(tuner, "x", ["a", "b"], "a")
    tuner.pump()
    search.start()
    tuner.pump()
    search.measure("a", 1.0)
    tuner.pump()
    search.start()
    assert search.trial is not None and search.trial.option == "b"
    search.measure("b", 3.0 * RACE_FACTOR)  # behind: still one sample, as configured
    assert search.state == "locked" and search.values == {"a": 1.0, "b": 3.0 * RACE_FACTOR}


def test_the_next_trial_is_asked_while_one_measures_and_begins_as_it_ends(
    tuner: StandIn,
) -> None:
    """Asking ahead: no storage round trip between trials; one asked ahead and not needed is
    told as not measured (another job sharing the study then tries it)."""
    search = Search(tuner, "x", ["a", "b", "c"], "a")
    tuner.pump()
    search.start()
    tuner.pump()  # the first trial begins, and asks the next one
    tuner.pump()  # which arrives and waits
    running = [t for t in trials(tuner) if t.state == TrialState.RUNNING]
    assert len(running) == 2
    assert search.trial is not None and search.trial.option == "a"
    for value in (9.0, 1.0, 1.0, 1.0):
        search.measure("a", value)
    assert search.trial is not None and search.trial.option == "b"  # no pump: begun at once
    tuner.pump()  # "c" is asked ahead as "b" begins
    assert [t.state for t in trials(tuner)] == [TrialState.COMPLETE, *[TrialState.RUNNING] * 2]
    search.lock("a", 1.0)  # say the storage failed (`Decider.decide`): "c" will not be measured
    tuner.pump()
    ahead = trials(tuner)[2]
    assert ahead.params["option"] == search.space.index("c")
    assert ahead.state == TrialState.FAIL
    assert ahead.user_attrs["failure"].startswith(NOT_MEASURED)


def pipelined(
    search: Search[str],
    tuner: StandIn,
    latency: dict[str, float],
    skip: frozenset[int] = frozenset(),
) -> str:
    """Windows as the tuner runs them: each exchange measures the oldest window in flight, then
    orders the one `IN_FLIGHT` on (`Search.order`); windows in ``skip`` carry no message of the
    class. The options the windows ran, until the search locks."""
    ordered = deque([search.desired] * (IN_FLIGHT + 1))
    ran = ""
    for k in range(60):
        tuner.pump()
        search.start()
        window = ordered.popleft()
        ran += window
        if k not in skip:
            search.measure(window, latency[window])
        if search.state == "locked":
            return ran
        ordered.append(search.order())
    raise AssertionError(f"not locked after {ran}")


def test_the_next_trial_is_ordered_so_that_it_runs_as_soon_as_the_one_before_has_its_windows(
    tuner: StandIn,
) -> None:
    """With the orders two windows ahead of the measurements, a trial that has every window it
    needs already ordered hands the class to the next: each trial after the first runs exactly
    its warm-up and samples (1 + 3 here), none wasted between trials."""
    search = Search(tuner, "x", ["a", "b", "c", "d"], "a")
    ran = pipelined(search, tuner, {"a": 1.0, "b": 1.1, "c": 1.2, "d": 1.05})
    assert ran.endswith("bbbbccccdddd") and ran.count("b") == 4, ran
    tuner.pump()
    values = {t.params["option"]: t.value for t in trials(tuner)}
    assert values == {0: 1.0, 1: 1.1, 2: 1.2, 3: 1.05}  # each its three samples' median


def test_a_trial_far_behind_after_its_first_sample_hands_on_without_waiting_for_its_race(
    tmp_path: Path,
) -> None:
    """A first sample beyond `RACE_FORESEEN` times the best: the trial's race is foreseen, and
    the next trial is ordered as soon as the windows in flight cover it (one window sooner than
    a race seen only at its `RACE_AFTER`-th sample, two less than a full trial)."""
    tuner = StandIn(f"sqlite:///{tmp_path / 't.db'}", tune_warmup=1, tune_samples=5)
    far, behind = 1.1 * RACE_FORESEEN, 1.1 * RACE_FACTOR  # far behind, and only behind
    search = Search(tuner, "x", ["a", "b", "c", "d"], "a")
    ran = pipelined(search, tuner, {"a": 1.0, "b": far, "c": behind, "d": 1.05})
    # Warm-up, the samples measured when the orders change, then the windows in flight.
    b, c, d = 1 + 1 + IN_FLIGHT, 1 + RACE_AFTER + IN_FLIGHT, 1 + 5
    assert ran.endswith("b" * b + "c" * c + "d" * d), ran
    assert search.values == {"a": 1.0, "b": far, "c": behind, "d": 1.05}


def test_a_trial_handed_on_short_is_measured_again_once_then_ends_with_what_it_has(
    tmp_path: Path,
) -> None:
    """A window without the class's messages (an iteration that sent none): the trial that
    handed the class on has fewer samples than foreseen. It is told as not measured and asked
    again at once; short a second time, it ends with the median of what it measured."""
    latency = {"a": 1.0, "b": 1.1, "c": 1.2, "d": 1.15}

    def job(name: str, skip: set[int]) -> tuple[str, list[optuna.trial.FrozenTrial]]:
        tuner = StandIn(f"sqlite:///{tmp_path / name}", tune_warmup=1, tune_samples=3)
        ran = pipelined(
            Search(tuner, "x", ["a", "b", "c", "d"], "a"), tuner, latency, frozenset(skip)
        )
        tuner.pump()
        return ran, trials(tuner)

    whole, _ = job("whole.db", set())
    assert whole.endswith("bbbbccccdddd")
    b_sample = whole.index("b") + 2  # its warm-up, then its second sample
    ran, told = job("once.db", {b_sample})
    assert ran == whole.replace("cccc", "ccccbbbb")  # "b" again, in full, then "d"
    states = [(t.params["option"], t.state) for t in told]
    assert states == [
        (0, TrialState.COMPLETE),
        (1, TrialState.FAIL),
        (2, TrialState.COMPLETE),
        (1, TrialState.COMPLETE),
        (3, TrialState.COMPLETE),
    ]
    assert told[1].user_attrs["failure"].startswith(NOT_MEASURED)  # another job may try it
    assert told[3].value == pytest.approx(1.1)

    again = ran.index("bbbb", b_sample + 4) + 2
    ran, told = job("twice.db", {b_sample, again})
    assert ran == whole.replace("cccc", "ccccbbbb")  # short again: nothing more for "b"
    assert [(t.params["option"], t.state) for t in told] == states


def test_a_locked_search_keeps_its_best_whatever_it_measures_after(tuner: StandIn) -> None:
    # Screened: the step decides from here (autotune.tuning.plan_search), not the latency.
    search = Search(tuner, "x", ["a", "b"], "a")
    search.lock("a", 1.0)
    for _ in range(5):
        search.measure("a", 9.0)
    assert search.state == "locked" and search.best == ("a", 1.0)


def test_budget_locks_before_the_space_is_exhausted(tmp_path: Path) -> None:
    tuner = StandIn(f"sqlite:///{tmp_path / 't.db'}", tune_warmup=0, tune_samples=1, tune_trials=2)
    search = Search(tuner, "x", ["a", "b", "c"], "c")
    run(search, tuner, latency_of, 12)
    assert search.state == "locked" and search.finished == 2
    tuner.pump()
    assert len(trials(tuner)) == 2


def test_a_dead_jobs_trial_fails_and_a_live_jobs_is_left_alone(
    tmp_path: Path, stale_after_s: float
) -> None:
    url = f"sqlite:///{tmp_path / 'tuning.db'}"
    tuner = StandIn(url, tune_warmup=1, tune_samples=3)

    def running(store: Store, index: int) -> int:
        """A trial of another job, asked and given its option as a search does."""
        sampler = GivenSampler()
        sampler.params = {"option": index}
        trial = store.study("test", "x/r0", sampler).ask()
        trial.suggest_categorical("option", [0, 1, 2])
        store.started(trial)
        return trial.number

    alive, dead = Store(url), Store(url)
    measuring = running(alive, 0)  # a live job measures "a", the default
    crashed = running(dead, 1)  # a crashed job was measuring "b": it beats no more
    time.sleep(stale_after_s)
    alive.beat(now=time.monotonic() + 60)
    search = Search(tuner, "x", ["a", "b", "c"], "a")
    tuner.pump()
    search.start()
    tuner.pump()
    states = {t.number: t.state for t in trials(tuner)}
    assert states[crashed] == TrialState.FAIL
    assert states[measuring] == TrialState.RUNNING
    # "b" was never measured, so it is tried; "a" is being measured by the live job: it waits.
    assert search.trial is not None and search.trial.option == "b"


def _screen(
    tuner: StandIn,
    space: list[Choice],
    latency: Callable[[Choice], float],
    search: ClassSearch | None = None,
) -> list[Choice]:
    """Screen ``space`` to the end (with ``search``, if given); the choices in the order they
    were measured."""
    search = search or ClassSearch(tuner, "class", space, space[0])
    measured: list[Choice] = []
    for _ in range(1000):
        tuner.pump()
        if search.state == "locked":
            break
        search.start()
        if search.trial is not None and search.trial.option not in measured:
            measured.append(search.trial.option)
        search.measure(search.desired, latency(search.desired))
    assert search.state == "locked"
    assert search.windows_left() == 0
    return measured


def _on_the_wire(plain: dict[Choice, float]) -> Callable[[Choice], float]:
    """Latencies: ``plain``'s, and a compressed choice at 0.6 of its uncompressed twin's."""

    def latency(c: Choice) -> float:
        return plain[Choice(c.algorithm, c.segment_bytes)] * (1.0 if c.wire is None else 0.6)

    return latency


def test_wires_are_screened_on_the_fastest_uncompressed_choices(tmp_path: Path) -> None:
    tuner = StandIn(f"sqlite:///{tmp_path / 't.db'}", tune_warmup=0, tune_samples=1)
    space = search_space(1 << 20, ("native", "ring", "tree", "star"), wires=("bf16", "fp16"))
    plain = [c for c in space if c.wire is None]
    assert len(plain) == 6 and len(space) == 18
    # The last is the fastest, and every one is within SEGMENTS_WITHIN of it: none is left out.
    times = {c: 1.0 + 0.1 * i for i, c in enumerate(reversed(plain))}
    measured = _screen(tuner, space, _on_the_wire(times))
    fastest = sorted(plain, key=times.__getitem__)[:WIRE_SHORTLIST]
    wired = [Choice(c.algorithm, c.segment_bytes, w) for w in ("bf16", "fp16") for c in fastest]
    # Every uncompressed choice first (each algorithm, then the segment sizes, the closest
    # algorithm's first), then each wire on the three fastest of them, in order.
    ring, tree = Choice("ring", 256 << 10), Choice("tree", 256 << 10)
    assert times[Choice("tree")] < times[Choice("ring")]
    assert measured == [c for c in plain if c not in (ring, tree)] + [tree, ring] + wired
    assert len(trials(tuner, "class/r0")) == 6 + 2 * WIRE_SHORTLIST


def test_a_choice_failed_as_too_slow_still_has_its_twin_on_the_wire(tmp_path: Path) -> None:
    # With tune_samples=1, one noisy window of ring beyond 10x native's failed ring's trial, and
    # with no value it was left off the wire's shortlist: ring+bf16 was never screened.
    tuner = StandIn(f"sqlite:///{tmp_path / 't.db'}", tune_warmup=0, tune_samples=1)
    space = search_space(1 << 16, ("native", "ring"), wires=("bf16",))
    native, ring = Choice("native"), Choice("ring")
    assert space == [native, ring, Choice("native", None, "bf16"), Choice("ring", None, "bf16")]
    measured = _screen(tuner, space, _on_the_wire({native: 1.0, ring: 1.2 * SLOW_FACTOR}))
    assert measured == space
    # Both failed as too slow (the twin against native+bf16's 0.6): screened all the same.
    failed = [t for t in trials(tuner, "class/r0") if t.state == TrialState.FAIL]
    assert [choice_of(t.params, space) for t in failed] == [ring, Choice("ring", None, "bf16")]
    assert all(t.user_attrs["failure"].startswith("slower than 10x") for t in failed)


def test_the_budget_bounds_the_uncompressed_choices_then_wires_follow(tmp_path: Path) -> None:
    tuner = StandIn(f"sqlite:///{tmp_path / 't.db'}", tune_warmup=1, tune_samples=2, tune_trials=4)
    space = search_space(4 << 20, ("native", "ring", "tree"), wires=("bf16",))
    plain = [c for c in space if c.wire is None]
    assert len(plain) > 4
    # In the space's order, native fastest, each within SEGMENTS_WITHIN of it.
    times = {c: 1.0 + 0.1 * i for i, c in enumerate(plain)}
    search = ClassSearch(tuner, "class", space, space[0])
    # Four uncompressed trials, then the three fastest of them on bf16: 7 trials of 3 windows.
    assert search.windows_left() == (4 + WIRE_SHORTLIST) * 3
    measured = _screen(tuner, space, _on_the_wire(times))
    ring = Choice("ring", 256 << 10)
    first = [Choice("native"), Choice("ring"), Choice("tree"), ring]  # ring's segment: closest
    fastest = [Choice("native"), ring, Choice("ring")]
    assert measured == first + [Choice(c.algorithm, c.segment_bytes, "bf16") for c in fastest]


def test_without_wires_each_algorithm_is_screened_then_the_segment_sizes_in_the_race(
    tmp_path: Path,
) -> None:
    tuner = StandIn(f"sqlite:///{tmp_path / 't.db'}", tune_warmup=0, tune_samples=1)
    space = search_space(1 << 20, ("native", "ring", "tree"))
    native, ring, tree = Choice("native"), Choice("ring"), Choice("tree")
    ring_seg, tree_seg = Choice("ring", 256 << 10), Choice("tree", 256 << 10)
    assert space == [native, ring_seg, ring, tree_seg, tree]
    # ring within SEGMENTS_WITHIN of native, tree beyond it: ring's segment size is screened.
    times = {native: 1.0, ring: 1.9, ring_seg: 0.8, tree: 2.1, tree_seg: 0.5}
    assert times[ring] <= SEGMENTS_WITHIN * times[native] < times[tree]
    assert _screen(tuner, space, times.__getitem__) == [native, ring, tree, ring_seg]


def _mlp_2mib() -> tuple[list[Choice], dict[Choice, float]]:
    """The example MLP's 2 MiB class, 4 ranks on gloo, as one job screened it (ms)."""
    space = search_space(2 << 20, ("native", "ring", "tree", "two_tree", "shm"))
    kib = 1 << 10
    ms = {
        Choice("shm"): 2.37,
        Choice("two_tree", 1 << 20): 3.84,
        Choice("tree", 1 << 20): 4.44,
        Choice("tree"): 4.71,
        Choice("ring"): 5.41,
        Choice("ring", 1 << 20): 5.45,
        Choice("two_tree"): 6.18,
        Choice("tree", 256 * kib): 6.36,
        Choice("ring", 256 * kib): 7.48,
        Choice("native"): 7.91,
        Choice("two_tree", 256 * kib): 8.15,
    }
    assert sorted(space, key=repr) == sorted(ms, key=repr)
    return space, {c: t / 1e3 for c, t in ms.items()}


def test_a_class_screens_its_segment_sizes_only_where_they_could_reach_the_shortlist(
    tmp_path: Path,
) -> None:
    tuner = StandIn(f"sqlite:///{tmp_path / 't.db'}", tune_warmup=2, tune_samples=5)
    space, times = _mlp_2mib()
    search = ClassSearch(tuner, "class", space, Choice("native"))
    assert search.windows_left() == len(space) * 7  # nothing measured: all of them, at most
    measured = _screen(tuner, space, times.__getitem__, search)
    assert search.desired == Choice("shm")
    leads = [Choice(a) for a in ("native", "ring", "tree", "two_tree", "shm")]
    # tree (4.71 ms) is within 2x of shm (2.37 ms): its two segment sizes are screened; ring
    # (5.41 ms) and two_tree (6.18 ms, 3.84 ms at 1 MiB segments) are not, and would not have
    # been shortlisted (beyond RUNNER_UP_WITHIN of shm).
    assert measured == [*leads, Choice("tree", 256 << 10), Choice("tree", 1 << 20)]
    assert shortlist(search.values, Choice("native")) == shortlist(times, Choice("native"))


def test_windows_left_counts_the_segment_sizes_still_in_the_race(tmp_path: Path) -> None:
    tuner = StandIn(f"sqlite:///{tmp_path / 't.db'}", tune_warmup=0, tune_samples=1)
    space, times = _mlp_2mib()
    search = ClassSearch(tuner, "class", space, Choice("native"))
    for _ in range(100):  # each algorithm once, unsegmented
        tuner.pump()
        if len(search.tried) == 5:
            break
        search.start()
        search.measure(search.desired, times[search.desired])
    assert set(search.tried) == {Choice(a) for a in ("native", "ring", "tree", "two_tree", "shm")}
    assert search.windows_left() == 2  # tree's two segment sizes, a window each


def test_search_space() -> None:
    small = search_space(64 << 10, ("native", "ring", "tree"))
    assert small == [Choice("native"), Choice("ring"), Choice("tree")]  # no segment below 64 KiB
    mid = search_space(4 << 20, ("native", "ring"))
    # Up to the default segment (4 MiB) the algorithm also runs unsegmented.
    segs = (256 << 10, 1 << 20, None)
    assert mid == [Choice("native")] + [Choice("ring", s) for s in segs]
    large = search_space(16 << 20, ("ring",))
    assert large == [Choice("ring", s) for s in (256 << 10, 1 << 20, 4 << 20)]


def test_a_choice_reads_back_from_its_trial_parameters() -> None:
    space = search_space(1 << 20, ("native", "ring", "tree"))
    study = optuna.create_study(sampler=optuna.samplers.BruteForceSampler(seed=0))
    seen = []

    def objective(trial: optuna.Trial) -> float:
        choice = suggest_choice(trial, space)
        assert choice_of(trial.params, space) == choice
        seen.append(choice)
        return 1.0

    study.optimize(objective)  # the sampler stops the study once the space is exhausted
    assert sorted(seen, key=repr) == sorted(space, key=repr)
    assert choice_of({"algorithm": "star"}, space) is None
