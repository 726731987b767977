"""Where tuned plans persist: Optuna storage (SQLite by default, any RDB URL), keyed by a
fingerprint of the job and the cluster, with the tables and priors saved beside the studies.

Example::

    >>> store = Store(storage_url())
    >>> store.tables()  # fingerprint key -> the plan jobs locked
"""

from autotune.storage.failures import storage_failure
from autotune.storage.fingerprint import (
    device_model,
    elastic_attempt,
    elastic_run,
    fingerprint,
    fingerprint_key,
    job_fingerprint,
)
from autotune.storage.store import Store, merge_tables, storage_url, tell

__all__ = [
    "Store",
    "device_model",
    "elastic_attempt",
    "elastic_run",
    "fingerprint",
    "fingerprint_key",
    "job_fingerprint",
    "merge_tables",
    "storage_failure",
    "storage_url",
    "tell",
]
