"""Where tuning results live: an Optuna storage, keyed by a fingerprint of the job's setting,
with the plans jobs locked stored beside their studies.

Only rank 0 of a job opens a store. Studies are named ``autotune/<key>/<what>``: a size class's
screening is shared by every job with the fingerprint. The plan a job locked is kept as a user
attribute ``table/<workload>/<run>`` of ``autotune/<key>/plan``, so the next job of the same
workload (`autotune.storage.fingerprint.workload_name`) starts from it, and a job of another
workload is not touched by it. A sweep stores its classes under the workload ``sweep``: they
seed every job's search (`Store.load_seed`).
"""

from __future__ import annotations

import dataclasses
import os
import random
import time
import uuid
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

from autotune.plan import Entry, Table
from autotune.storage.failures import cannot_open, racing
from autotune.storage.fingerprint import EARLIER, SWEEP, elastic_attempt, elastic_run
from autotune.util.processes import ProcessId, state
from autotune.util.redact import redact_url

if TYPE_CHECKING:
    import optuna


__all__ = [
    "HEARTBEAT_S",
    "STALE_AFTER_S",
    "Store",
    "as_url",
    "merge_tables",
    "sqlite_path",
    "storage_url",
    "tell",
]


def as_url(storage: str) -> str:
    """``storage`` as an Optuna URL: a plain path (no ``://``) is an SQLite file, made absolute
    (``~`` expanded), as `Config.storage` and ``--storage`` take it."""
    if "://" in storage:
        return storage
    head = storage.split("/", 1)[0]
    if "@" in head and ":" in head.split("@", 1)[0]:
        # user:password@host: a database URL that lost its scheme, not a file (and its
        # password must not land in a file name or a message).
        raise ValueError(
            "looks like a database URL without its scheme (user:password@host): write it as "
            "postgresql://... (or mysql://...), or give an SQLite file's path"
        )
    return f"sqlite:///{Path(storage).expanduser().resolve()}"


def sqlite_path(url: str) -> Path | None:
    """The file of an SQLite URL (None: another database, or SQLite in memory), also where the
    URL names it as an SQLite URI filename (``sqlite:///file:/path/t.db?mode=ro&uri=true``)."""
    if not url.startswith("sqlite:///"):
        return None
    path, _, query = url.removeprefix("sqlite:///").partition("?")
    options = query.lower().split("&")
    if "uri=true" in options and path.startswith("file:"):
        if "mode=memory" in options:
            return None
        path = unquote(path.removeprefix("file:"))
        if path.startswith("//"):  # file://AUTHORITY/PATH: the authority is empty or localhost
            path = "/" + path[2:].partition("/")[2]
    return Path(path) if path and path != ":memory:" else None


def storage_url(url: str | None = None, *, create: bool = True) -> str:
    """The tuning storage to use: ``url`` (a URL, or a path taken as SQLite) if given, else
    ``AUTOTUNE_STORAGE``, else an SQLite file under the user cache directory
    (``$XDG_CACHE_HOME`` or ``~/.cache``).

    For an SQLite file, ``create`` makes its directory if missing (a job's storage); without it
    (``autotune show``: read only) a file that is not there is a ValueError in one line, and
    nothing is created."""
    if not url:
        from_env = os.environ.get("AUTOTUNE_STORAGE", "").strip()
        if from_env and from_env.lower() != "none":
            url = from_env
        else:
            cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
            url = str(cache / "autotune" / "tuning.db")
    url = as_url(url)
    path = sqlite_path(url)
    if path is None:
        return url
    if not create:
        if not path.is_file():
            raise ValueError(f"no tuning storage at {url}: {path} does not exist (nothing created)")
        return url
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ValueError(
            f"cannot open tuning storage {url!r}: cannot make {path.parent}: {exc.strerror}"
        ) from None
    return url


# The tuner asks and tells trials itself (no Study.optimize) and records their heartbeats itself:
# Optuna's warnings for exactly that are expected here, on every ask.
warnings.filterwarnings("ignore", "Heartbeat of storage is supposed to be used with Study.optimize")
warnings.filterwarnings("ignore", ".*fail_stale_trials is experimental")


#: A stored plan as `Store._records` reads it: (workload, saved at, attribute name, table JSON).
_Record = tuple[str, float, str, object]

#: The attribute prefix that marks a workload's plans forgotten (`Store.forget`).
FORGOTTEN = "forgotten"

#: Seconds between heartbeats of a job's running trials; a trial whose job has not beaten for
#: `STALE_AFTER_S` is a dead job's, and only such trials are failed by another job.
HEARTBEAT_S = 20
STALE_AFTER_S = 90
#: Attempts at opening a storage whose schema another job may be creating right now.
OPEN_ATTEMPTS = 8


class Store:
    """Tuning results in an Optuna RDB storage (SQLite, PostgreSQL, MySQL: any Optuna URL).

    Several jobs may share one storage at once: opening it survives another job creating the
    schema, each job's running trials carry its heartbeat (so a job only ever fails the trials of
    jobs that stopped beating), and each run stores its locked plan under a key of its own, which
    `load_table` merges with other runs' of the same workload by a fixed rule (`merge_tables`).
    """

    def __init__(self, url: str, run_id: str | None = None) -> None:
        self.url = url
        #: This run's name in the storage (its stored plan's key within its workload).
        self.run_id = run_id or uuid.uuid4().hex[:12]
        _quiet_optuna()
        self.storage = _open(url)
        self._live: set[int] = set()  # trial ids of this job still running (heartbeats)
        #: This torchrun worker group's (run id, restart count), or None outside torchrun.
        self.attempt = elastic_attempt()
        #: This torchrun job (`elastic_run`), or None outside torchrun.
        self.run = elastic_run()
        #: The process that beats for this job's trials (rank 0's).
        self.owner = ProcessId.mine()
        self._beat_at = 0.0

    def study(
        self, key: str, what: str, sampler: optuna.samplers.BaseSampler | None = None
    ) -> optuna.Study:
        """The study ``autotune/<key>/<what>``, created on first use (minimizing latency)."""
        import optuna

        name = f"autotune/{key}/{what}"
        for attempt in range(OPEN_ATTEMPTS):
            try:
                return optuna.create_study(
                    storage=self.storage,
                    study_name=name,
                    sampler=sampler,
                    direction="minimize",
                    load_if_exists=True,
                )
            except optuna.exceptions.DuplicatedStudyError:
                # Another job created it between our look and our insert: load it.
                if attempt == OPEN_ATTEMPTS - 1:
                    raise
        raise AssertionError("unreachable")

    def started(self, trial: optuna.Trial) -> None:
        """``trial`` runs in this job: beat for it from now on (`beat`) until `told`."""
        self._live.add(trial._trial_id)
        self.storage.record_heartbeat(trial._trial_id)
        owner = dataclasses.asdict(self.owner)
        self.storage.set_trial_user_attr(trial._trial_id, "owner", owner)
        if self.attempt is not None:
            self.storage.set_trial_user_attr(trial._trial_id, "elastic_run", self.run)
            self.storage.set_trial_user_attr(trial._trial_id, "elastic_attempt", self.attempt[1])

    def told(self, trial: optuna.Trial) -> None:
        self._live.discard(trial._trial_id)

    def abandon(self, why: str) -> None:
        """Fail this job's trials still running (the job is ending): none is left running."""
        for trial_id in list(self._live):
            self._fail(trial_id, why)
            self._live.discard(trial_id)

    def _fail(self, trial_id: int, why: str) -> None:
        """Fail a running trial, saying ``why``; one finished meanwhile is left as it is."""
        import optuna
        from optuna.trial import TrialState

        try:
            self.storage.set_trial_user_attr(trial_id, "failure", why)
            self.storage.set_trial_state_values(trial_id, TrialState.FAIL)
        except optuna.exceptions.UpdateFinishedTrialError:
            pass  # told, or failed by another job, meanwhile

    def beat(self, now: float | None = None) -> None:
        """Record a heartbeat for this job's running trials, at most every `HEARTBEAT_S`."""
        now = time.monotonic() if now is None else now
        if now - self._beat_at < HEARTBEAT_S:
            return
        self._beat_at = now
        for trial_id in list(self._live):
            self.storage.record_heartbeat(trial_id)

    def fail_stale_trials(self, study: optuna.Study) -> None:
        """Fail the running trials of jobs that are gone: whose process on this host has exited,
        whose heartbeat stopped (`STALE_AFTER_S`: a job on another host), or that an earlier
        attempt of this torchrun job ran (dead once it restarted).

        A trial of a job that is alive, here or on another machine, is never touched: other
        jobs' trials are told apart by their owner process and torchrun job (`elastic_run`),
        not by torchrun's run id, which plain torchrun sets to ``none`` for every job.
        """
        import optuna
        from optuna.trial import TrialState

        optuna.storages.fail_stale_trials(study)
        for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            if t._trial_id in self._live:
                continue
            why = self._dead(t.user_attrs)
            if why is not None:
                self._fail(t._trial_id, why)

    def _dead(self, attrs: dict[str, Any]) -> str | None:
        """Why the job that ran a trial (its user attributes) is gone for certain, or None."""
        # torchrun restarts a worker group only once every worker of the attempt before has
        # stopped: an earlier attempt of this job is dead, wherever it ran.
        earlier = attrs.get("elastic_attempt")
        if (
            self.attempt is not None
            and attrs.get("elastic_run") == self.run
            and isinstance(earlier, int)
            and earlier < self.attempt[1]
        ):
            return f"attempt {earlier} of this torchrun job ended: its workers restarted"
        owner = attrs.get("owner")
        if not isinstance(owner, dict):
            return None
        try:
            process = ProcessId(str(owner["host"]), int(owner["pid"]), float(owner["started"]))
        except (KeyError, TypeError, ValueError):
            return None
        if process.here and state(process) == "exited":
            return f"the job that ran it ended: its process ({process.describe()}) is gone"
        return None

    def fail_stale(self, key: str) -> None:
        """`fail_stale_trials` in every study of fingerprint ``key``: a job that only loads the
        stored plan opens none of them, so it calls this."""
        import optuna

        prefix = f"autotune/{key}/"
        for name in optuna.study.get_all_study_names(storage=self.storage):
            if name.startswith(prefix):
                self.fail_stale_trials(optuna.load_study(study_name=name, storage=self.storage))

    def load_table(self, key: str, workload: str) -> Table | None:
        """The plan stored for fingerprint ``key`` and ``workload`` (every run's, merged), if a
        run of it locked one."""
        return self._merged(key, [r for r in self._records(key) if r[0] == workload])

    def load_seed(self, key: str) -> Table | None:
        """What seeds a job's search on fingerprint ``key``: the classes a sweep screened (and the
        plans stored before plans were kept per workload, `EARLIER`), merged; None if none."""
        return self._merged(key, [r for r in self._records(key) if r[0] in (SWEEP, EARLIER)])

    def _merged(self, key: str, saved: list[_Record]) -> Table | None:
        """``saved`` (of `_records`), merged (`merge_tables`); None if there are none."""
        tables = []
        for workload, saved_at, name, raw in sorted(saved, key=lambda t: (t[1], t[2])):
            try:
                tables.append((saved_at, Table.from_json(raw)))
            except ValueError as exc:
                raise ValueError(
                    f"tuning storage {redact_url(self.url)!r}, plan {key}/{workload} ({name}): "
                    f"{exc}; remove it with 'autotune show --storage URL' and optuna's "
                    "delete_study, or fix the entry"
                ) from exc
        return merge_tables(tables) if tables else None

    def _records(self, key: str) -> list[_Record]:
        """Every plan stored for ``key``: (workload, saved at, attribute name, table JSON)."""
        import optuna

        try:
            study = optuna.load_study(study_name=f"autotune/{key}/plan", storage=self.storage)
        except KeyError:
            return []
        out: list[_Record] = []
        attrs = study.user_attrs
        forgotten = {
            name.removeprefix(f"{FORGOTTEN}/"): float(raw.get("at", 0.0))
            for name, raw in attrs.items()
            if name.startswith(f"{FORGOTTEN}/") and isinstance(raw, dict)
        }
        for name, raw in attrs.items():
            if name == "table":  # written before plans were kept per run
                out.append((EARLIER, 0.0, name, raw))
            elif name.startswith("table/") and isinstance(raw, dict):
                # table/<workload>/<run>; table/<run> before plans were kept per workload.
                parts = name.split("/")
                workload = parts[1] if len(parts) == 3 else EARLIER
                saved_at = float(raw.get("saved_at", 0.0))
                if saved_at > forgotten.get(workload, -1.0):
                    out.append((workload, saved_at, name, raw.get("table")))
        return out

    def save_table(self, key: str, workload: str, table: Table) -> None:
        """Store this run's plan for ``key`` and ``workload``, beside other runs' (no run
        overwrites another's)."""
        record = {
            "saved_at": time.time(),
            "run": self.run_id,
            "workload": workload,
            "table": table.to_json(),
        }
        self.study(key, "plan").set_user_attr(f"table/{workload}/{self.run_id}", record)

    def forget(self, key: str, workload: str) -> int:
        """Forget the plan stored for ``key`` and ``workload``: every run's, as of now (the next
        job of it starts from scratch; a plan a later job stores counts again). How many runs'
        plans were forgotten. The screening studies of the fingerprint stay: they are
        measurements any workload on it reuses. Optuna cannot delete a study's attribute, so a
        mark records when (`_records` leaves out what was saved before it)."""
        kept = [r for r in self._records(key) if r[0] == workload]
        if kept:
            mark = {"at": time.time(), "run": self.run_id}
            self.study(key, "plan").set_user_attr(f"{FORGOTTEN}/{workload}", mark)
        return len(kept)

    def save_prior(self, key: str, prior: dict[str, Any]) -> None:
        """Store the cost model's fit for fingerprint ``key`` (a later sweep's replaces it)."""
        self.study(key, "plan").set_user_attr("model", {"saved_at": time.time(), **prior})

    def load_prior(self, key: str) -> dict[str, Any] | None:
        """The cost model's fit stored for ``key``, as saved, if a sweep stored one."""
        import optuna

        try:
            study = optuna.load_study(study_name=f"autotune/{key}/plan", storage=self.storage)
        except KeyError:
            return None
        raw = study.user_attrs.get("model")
        return raw if isinstance(raw, dict) else None

    def tables(self) -> dict[tuple[str, str], Table]:
        """Every stored plan, by (fingerprint key, workload), in the storage's order."""
        import optuna

        out = {}
        for name in optuna.study.get_all_study_names(storage=self.storage):
            parts = name.split("/")
            if len(parts) == 3 and parts[0] == "autotune" and parts[2] == "plan":
                key = parts[1]
                records = self._records(key)  # one read of the study for all its workloads
                for workload in dict.fromkeys(r[0] for r in records):
                    table = self._merged(key, [r for r in records if r[0] == workload])
                    if table is not None:
                        out[key, workload] = table
        return out

    def trial_count(self) -> int:
        """Trials of every autotune study in the storage (for tests and reports)."""
        import optuna

        total = 0
        for name in optuna.study.get_all_study_names(storage=self.storage):
            if name.startswith("autotune/"):
                study = optuna.load_study(study_name=name, storage=self.storage)
                total += len(study.get_trials(deepcopy=False))
        return total


def merge_tables(saved: Sequence[tuple[float, Table]]) -> Table:
    """The plan for a fingerprint and workload when several runs stored one (``saved``: (time,
    table)): runs of one model at once, or one after another (and, for `Store.load_seed`, a
    sweep's classes with older plans').

    Per size class the newest locked entry wins (an entry that is not locked only where no entry
    is); the fusion size is the newest locked one; everything else is the newest table's (the
    gain, the lead, DDP's bucket size, the model's description, whether it was final, the fusion
    sizes it left, its plan's estimate: a field added to `Table` is carried without a line
    here, where two were once dropped). A job
    judges its plan as a whole, on the step against the baseline, so the latest verdict stands:
    a plan that a later job dropped for the baseline does not come back. (The rule before this
    took the lowest screened latency per class, from the latency-tuned days: it brought a
    dropped class choice back, to be confirmed again, and dropped again, by every later job.)
    The same tables give the same plan whatever order the jobs wrote them in.
    """
    newest_first = sorted(saved, key=lambda t: -t[0])
    classes: dict[int, Entry] = {}
    for _, table in newest_first:
        for cls, entry in table.classes.items():
            have = classes.get(cls)
            if have is None or (entry.state == "locked" and have.state != "locked"):
                classes[cls] = entry
    fusion = next((t.fusion_bytes for _, t in newest_first if t.fusion_bytes is not None), None)
    fingerprint = next((t.fingerprint for _, t in newest_first if t.fingerprint), None)
    if not newest_first:
        return Table(classes, fusion, fingerprint)
    newest = newest_first[0][1]
    merged = dataclasses.replace(
        newest, classes=classes, fusion_bytes=fusion, fingerprint=fingerprint, buckets=None
    )
    # The newest job's bucket size, where every class the merge keeps runs without the hook (a
    # class only an older job saw may keep its Python-driven plan, and with it the hook).
    if not merged.runs_without_hook:
        return merged
    return dataclasses.replace(merged, buckets=newest.buckets)


def _quiet_optuna() -> None:
    """Keep Optuna's INFO lines ("Using an existing study ...", each trial told) out of the
    user's training log: its verbosity goes to WARNING, unless the user set one of their own."""
    import optuna

    if optuna.logging.get_verbosity() == optuna.logging.INFO:  # Optuna's default
        optuna.logging.set_verbosity(optuna.logging.WARNING)


def _open(url: str) -> optuna.storages.RDBStorage:
    """Open ``url``, waiting out another job creating its schema at the same moment."""
    import optuna
    import sqlalchemy.exc

    kwargs: dict[str, object] = {}
    if url.startswith("sqlite"):
        # Jobs that share a file take turns writing: wait for the lock instead of failing.
        kwargs["engine_kwargs"] = {"connect_args": {"timeout": 60}}
    for attempt in range(OPEN_ATTEMPTS):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                return optuna.storages.RDBStorage(
                    url,
                    heartbeat_interval=HEARTBEAT_S,
                    grace_period=STALE_AFTER_S,
                    **kwargs,  # type: ignore[arg-type]
                )
        except sqlalchemy.exc.DBAPIError as exc:
            # Two jobs creating the schema at once: one wins (IntegrityError, "table ... already
            # exists"); the other finds it complete on the next try.
            if attempt < OPEN_ATTEMPTS - 1 and racing(exc):
                time.sleep(random.uniform(0.05, 0.2) * (attempt + 1))
                continue
            raise cannot_open(url, exc) from None
        except Exception as exc:  # SQLAlchemy's errors name the URL's problem; keep them
            raise cannot_open(url, exc) from None
    raise AssertionError("unreachable")


def tell(
    study: optuna.Study, trial: optuna.Trial, value: float | None, failure: str | None
) -> None:
    """Record a trial's result; a failure (an error, or far too slow) is a failure, not a value."""
    from optuna.trial import TrialState

    if failure is not None:
        trial.set_user_attr("failure", failure)
        study.tell(trial, state=TrialState.FAIL, skip_if_finished=True)
    else:
        study.tell(trial, value, skip_if_finished=True)
