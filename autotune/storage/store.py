"""Where tuning results live: an Optuna storage, keyed by a fingerprint of the job's setting.

Only rank 0 of a job opens a store. Studies are named ``autotune/<key>/<what>``; the plan a job
locked in is kept as a user attribute of ``autotune/<key>/plan``, so the next job with the same
fingerprint starts from it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import platform
import random
import time
import uuid
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autotune.plan import Entry, Table
from autotune.util.processes import ProcessId, state
from autotune.util.redact import redact, redact_url

if TYPE_CHECKING:
    import optuna
    import torch
    from torch.distributed import ProcessGroup

    from autotune.comm.topology import Topology

__all__ = [
    "Store",
    "device_model",
    "elastic_attempt",
    "fingerprint",
    "fingerprint_key",
    "job_fingerprint",
    "merge_tables",
    "storage_failure",
    "storage_url",
    "tell",
]


def storage_url(url: str | None = None) -> str:
    """The tuning storage to use: ``url`` if given, else ``AUTOTUNE_STORAGE``, else an SQLite file
    under the user cache directory (``$XDG_CACHE_HOME`` or ``~/.cache``)."""
    if url:
        return url
    from_env = os.environ.get("AUTOTUNE_STORAGE", "").strip()
    if from_env and from_env.lower() != "none":
        return from_env
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    path = cache / "autotune" / "tuning.db"
    path.parent.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{path}"


def device_model(device_type: str, index: int | None = None) -> str:
    """The model of the device gradients live on: the GPU's name, or the CPU's."""
    if device_type == "cuda":
        import torch

        return torch.cuda.get_device_name(index)
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if "model name" in line)
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


def fingerprint(
    *,
    backend: str,
    world_size: int,
    nodes: int,
    device: str,
    dtype: str,
    ranks_per_node: str | None = None,
) -> dict[str, str | int]:
    """What a tuned plan depends on; a job with the same fingerprint can reuse it.

    ``ranks_per_node``: "4" where every node runs 4 ranks, "2+2+1" where they differ; None: an
    even split of ``world_size`` over ``nodes``.
    """
    if ranks_per_node is None:
        if world_size % nodes:
            raise ValueError(f"{world_size} ranks do not split evenly over {nodes} nodes")
        ranks_per_node = str(world_size // nodes)
    return {
        "backend": backend,
        "world_size": world_size,
        "nodes": nodes,
        "ranks_per_node": ranks_per_node,
        "device": device,
        "dtype": dtype,
    }


def job_fingerprint(
    group: ProcessGroup, device: torch.device, dtype: torch.dtype, topology: Topology
) -> dict[str, str | int]:
    """The fingerprint of all-reduces of ``dtype`` tensors on ``device`` over ``group``, whose
    ranks sit on nodes as ``topology`` (of `autotune.comm.topology.detect`) says."""
    import torch.distributed as dist

    from autotune.algorithms import backend_for

    return fingerprint(
        backend=backend_for(group, device),
        world_size=dist.get_world_size(group),
        nodes=topology.nodes,
        ranks_per_node=topology.layout,
        device=device_model(device.type, device.index),
        dtype=str(dtype).removeprefix("torch."),
    )


def fingerprint_key(fp: dict[str, str | int]) -> str:
    """A short, stable name for a fingerprint."""
    return hashlib.sha1(json.dumps(fp, sort_keys=True).encode(), usedforsecurity=False).hexdigest()[
        :12
    ]


# The tuner asks and tells trials itself (no Study.optimize) and records their heartbeats itself:
# Optuna's warnings for exactly that are expected here, on every ask.
warnings.filterwarnings("ignore", "Heartbeat of storage is supposed to be used with Study.optimize")
warnings.filterwarnings("ignore", ".*fail_stale_trials is experimental")


def elastic_attempt() -> tuple[str, int] | None:
    """(run id, restart count) of this torchrun worker group, or None outside torchrun."""
    run_id = os.environ.get("TORCHELASTIC_RUN_ID")
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT")
    if not run_id or restart is None or not restart.isdigit():
        return None
    return run_id, int(restart)


def elastic_run() -> str | None:
    """This torchrun job, told apart from every other: its run id and its agent, the torchrun
    process that starts (and restarts) this worker, which outlives its attempts. The run id
    alone does not tell jobs apart: plain ``torchrun --master-port`` gives every job ``none``.
    None outside torchrun."""
    attempt = elastic_attempt()
    if attempt is None:
        return None
    agent = ProcessId.of(os.getppid())
    return f"{attempt[0]}@{agent.host}:{agent.pid}:{agent.started:.3f}"


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
    jobs that stopped beating), and each job stores its locked plan under a key of its own, which
    `load_table` merges by a fixed rule (see `merge_tables`).
    """

    def __init__(self, url: str, job_id: str | None = None) -> None:
        self.url = url
        #: This job's name in the storage (its stored plan's key).
        self.job_id = job_id or uuid.uuid4().hex[:12]
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

    def load_table(self, key: str) -> Table | None:
        """The plan stored for fingerprint ``key`` (every job's, merged), if a job locked one."""
        import optuna

        try:
            study = optuna.load_study(study_name=f"autotune/{key}/plan", storage=self.storage)
        except KeyError:
            return None
        saved = []
        for name, raw in study.user_attrs.items():
            if name == "table":  # written by autotune before plans were kept per job
                saved.append((0.0, name, raw))
            elif name.startswith("table/") and isinstance(raw, dict):
                saved.append((float(raw.get("saved_at", 0.0)), name, raw.get("table")))
        tables = []
        for saved_at, name, raw in sorted(saved, key=lambda t: (t[0], t[1])):
            try:
                tables.append((saved_at, Table.from_json(raw)))
            except ValueError as exc:
                raise ValueError(
                    f"tuning storage {redact_url(self.url)!r}, plan {key} ({name}): {exc}; "
                    "remove it with 'autotune show --storage URL' and optuna's delete_study, "
                    "or fix the entry"
                ) from exc
        return merge_tables(tables) if tables else None

    def save_table(self, key: str, table: Table) -> None:
        """Store this job's plan for ``key``, beside other jobs' (no job overwrites another's)."""
        record = {"saved_at": time.time(), "job": self.job_id, "table": table.to_json()}
        self.study(key, "plan").set_user_attr(f"table/{self.job_id}", record)

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

    def tables(self) -> dict[str, Table]:
        """Every stored plan, by fingerprint key."""
        import optuna

        out = {}
        for name in optuna.study.get_all_study_names(storage=self.storage):
            parts = name.split("/")
            if len(parts) == 3 and parts[0] == "autotune" and parts[2] == "plan":
                table = self.load_table(parts[1])
                if table is not None:
                    out[parts[1]] = table
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
    """The plan for a fingerprint when several jobs stored one (``saved``: (time, table)).

    Per size class the newest locked entry wins (an entry that is not locked only where no entry
    is); the fusion size is the newest locked one, the lead (`Lead`) and DDP's bucket size
    (`Buckets`) the newest table's. A job judges its plan as a whole, on the step against the
    baseline, so the latest verdict stands: a plan that a later job dropped for the baseline
    does not come back. (The rule before this
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
    newest = newest_first[0][1] if newest_first else None
    lead = None if newest is None else newest.lead
    merged = Table(classes, fusion, fingerprint, lead=lead)
    # The newest job's bucket size, where every class the merge keeps runs native (a class
    # only an older job saw may keep its Python-driven plan, and with it the hook).
    if newest is None or not merged.runs_native:
        return merged
    return dataclasses.replace(merged, buckets=newest.buckets)


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
            if attempt < OPEN_ATTEMPTS - 1 and _racing(exc):
                time.sleep(random.uniform(0.05, 0.2) * (attempt + 1))
                continue
            raise _cannot_open(url, exc) from None
        except Exception as exc:  # SQLAlchemy's errors name the URL's problem; keep them
            raise _cannot_open(url, exc) from None
    raise AssertionError("unreachable")


#: What a storage error means, from the words of the database's own error (SQLite, PostgreSQL,
#: MySQL), innermost first: Optuna reports every failed commit alike ("exception is raised
#: during the commit ... exceeding max length"), which names none of these.
_CAUSES = (
    ("read-only", ("readonly database", "read-only", "read only", "permission denied")),
    ("disk full", ("disk is full", "no space left", "disk full", "could not extend file")),
    ("corrupt", ("malformed", "not a database", "corrupt", "no such table")),
    ("I/O error (a full disk or file-size limit, a removed file, a failing device)", ("disk i/o",)),
    (
        "gone",
        (
            "unable to open database",
            "could not connect",
            "connection refused",
            "server closed the connection",
            "connection reset",
            "lost connection",
            "terminating connection",
        ),
    ),
)


def storage_failure(error: BaseException) -> str:
    """One line for a storage that failed mid-job: what is wrong (read-only, disk full, corrupt,
    gone) and the database's own words, its password masked. Optuna and SQLAlchemy wrap the
    database's error; the innermost one says what happened."""
    chain = []
    seen: set[int] = set()
    e: BaseException | None = error
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        chain.append(e)
        orig = getattr(e, "orig", None)  # SQLAlchemy's DBAPIError keeps the driver's error here
        e = orig if isinstance(orig, BaseException) else (e.__cause__ or e.__context__)
    for e in reversed(chain):
        text = " ".join(str(e).split()).lower()
        for cause, words in _CAUSES:
            if any(w in text for w in words):
                return redact(f"{cause}: {type(e).__name__}: {_first_line(e)}")
    innermost = chain[-1]
    return redact(f"{type(innermost).__name__}: {_first_line(innermost)}")


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else repr(error)


def _one_line(error: BaseException) -> str:
    """An error's lines joined, without SQLAlchemy's link to its error catalogue."""
    lines = [ln.strip() for ln in str(error).splitlines() if ln.strip()]
    return "; ".join(ln for ln in lines if not ln.startswith("(Background on this error"))


def _cannot_open(url: str, exc: BaseException) -> ValueError:
    """Why ``url`` did not open, in one line, its password masked. The cause is left off the
    chain (``from None``): SQLAlchemy's errors repeat the URL, and a traceback prints them."""
    return ValueError(redact(f"cannot open tuning storage {url!r}: {_one_line(exc)}"))


def _racing(exc: Exception) -> bool:
    import sqlalchemy.exc

    text = str(exc).lower()
    return isinstance(exc, sqlalchemy.exc.IntegrityError) or any(
        words in text
        for words in ("already exists", "duplicate", "database is locked", "unique constraint")
    )


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
