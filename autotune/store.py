"""Where tuning results live: an Optuna storage, keyed by a fingerprint of the job's setting.

Only rank 0 of a job opens a store. Studies are named ``autotune/<key>/<what>``; the plan a job
locked in is kept as a user attribute of ``autotune/<key>/plan``, so the next job with the same
fingerprint starts from it.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
from pathlib import Path
from typing import TYPE_CHECKING

from autotune.plan import Table

if TYPE_CHECKING:
    import optuna
    import torch
    from torch.distributed import ProcessGroup

__all__ = [
    "Store",
    "default_storage_url",
    "device_model",
    "fingerprint",
    "fingerprint_key",
    "job_fingerprint",
    "tell",
]


def default_storage_url() -> str:
    """An SQLite file under the user cache directory (``$XDG_CACHE_HOME`` or ``~/.cache``)."""
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
    *, backend: str, world_size: int, nodes: int, device: str, dtype: str
) -> dict[str, str | int]:
    """What a tuned plan depends on; a job with the same fingerprint can reuse it."""
    return {
        "backend": backend,
        "world_size": world_size,
        "nodes": nodes,
        "device": device,
        "dtype": dtype,
    }


def job_fingerprint(
    group: ProcessGroup, device: torch.device, dtype: torch.dtype
) -> dict[str, str | int]:
    """The fingerprint of all-reduces of ``dtype`` tensors on ``device`` over ``group``.

    Nodes come from the launcher: torchrun's ``GROUP_WORLD_SIZE``, else world size over
    ``LOCAL_WORLD_SIZE`` (one node when neither is set).
    """
    import torch.distributed as dist

    from autotune.algorithms import backend_for

    world_size = dist.get_world_size(group)
    nodes = int(os.environ.get("GROUP_WORLD_SIZE", "0")) or max(
        1, world_size // int(os.environ.get("LOCAL_WORLD_SIZE", world_size))
    )
    return fingerprint(
        backend=backend_for(group, device),
        world_size=world_size,
        nodes=nodes,
        device=device_model(device.type, device.index),
        dtype=str(dtype).removeprefix("torch."),
    )


def fingerprint_key(fp: dict[str, str | int]) -> str:
    """A short, stable name for a fingerprint."""
    return hashlib.sha1(json.dumps(fp, sort_keys=True).encode(), usedforsecurity=False).hexdigest()[
        :12
    ]


class Store:
    """Tuning results in an Optuna RDB storage (SQLite, PostgreSQL, MySQL: any Optuna URL)."""

    def __init__(self, url: str) -> None:
        import optuna

        self.url = url
        try:
            self.storage = optuna.storages.RDBStorage(url)
        except Exception as exc:  # SQLAlchemy's errors name the URL's problem; keep them
            raise ValueError(f"cannot open tuning storage {url!r}: {exc}") from exc

    def study(
        self, key: str, what: str, sampler: optuna.samplers.BaseSampler | None = None
    ) -> optuna.Study:
        """The study ``autotune/<key>/<what>``, created on first use (minimizing latency)."""
        import optuna

        return optuna.create_study(
            storage=self.storage,
            study_name=f"autotune/{key}/{what}",
            sampler=sampler,
            direction="minimize",
            load_if_exists=True,
        )

    def fail_stale_trials(self, study: optuna.Study) -> int:
        """Mark trials a crashed job left running as failed; return how many.

        Through a plain view of the study: the search's own sampler must not see these trials
        finish (BruteForceSampler would stop the study over a trial that never got parameters).
        """
        import optuna
        from optuna.trial import TrialState

        plain = optuna.load_study(
            study_name=study.study_name,
            storage=self.storage,
            sampler=optuna.samplers.RandomSampler(),
        )
        stale = plain.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
        for t in stale:
            plain.tell(t.number, state=TrialState.FAIL, skip_if_finished=True)
        return len(stale)

    def load_table(self, key: str) -> Table | None:
        """The plan stored for fingerprint ``key``, if a job locked one in."""
        import optuna

        try:
            study = optuna.load_study(study_name=f"autotune/{key}/plan", storage=self.storage)
        except KeyError:
            return None
        raw = study.user_attrs.get("table")
        return None if raw is None else Table.from_json(raw)

    def save_table(self, key: str, table: Table) -> None:
        self.study(key, "plan").set_user_attr("table", table.to_json())

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


def tell(
    study: optuna.Study, trial: optuna.Trial, value: float | None, failure: str | None
) -> None:
    """Record a trial's result; a failure (an error, or far too slow) is a failure, not a value."""
    from optuna.trial import TrialState

    try:
        if failure is not None:
            trial.set_user_attr("failure", failure)
            study.tell(trial, state=TrialState.FAIL, skip_if_finished=True)
        else:
            study.tell(trial, value, skip_if_finished=True)
    except RuntimeError:
        # BruteForceSampler calls study.stop() once the space is exhausted, which only works
        # inside study.optimize; the result is stored before that. The search tracks exhaustion
        # itself, so only a result that did not get stored is an error.
        stored = study.get_trials(deepcopy=False)[trial.number]
        if stored.state == TrialState.RUNNING:
            raise
