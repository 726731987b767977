"""Where tuned plans persist: Optuna storage (SQLite by default, any RDB URL), keyed by a
fingerprint of the job and the cluster, with the tables and priors saved beside the studies.

Example::

    >>> store = Store(storage_url())
    >>> store.tables()  # (fingerprint key, workload) -> the plan its runs locked
"""

from autotune.storage.failures import storage_failure
from autotune.storage.fingerprint import (
    EARLIER,
    SWEEP,
    check_workload,
    describe_layout,
    describe_model,
    device_model,
    elastic_attempt,
    elastic_run,
    fingerprint,
    fingerprint_key,
    job_fingerprint,
    workload_name,
)
from autotune.storage.store import Store, merge_tables, storage_url, tell

__all__ = [
    "EARLIER",
    "SWEEP",
    "Store",
    "check_workload",
    "describe_layout",
    "describe_model",
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
    "workload_name",
]
