"""What decides: whole plans judged on the training step against the baseline (`plan_search`,
its paired A/B tests in `paired_test`), per-class screening that shortlists challengers
(`search`, `space`, Optuna through `sampler` on the `worker` thread), the cross-rank exchange
(`wire`), the block tests on DDP's reducer (`blocks`, `buckets`, `plain_check`), the orchestration
(`tuner`) and the snapshot every reader uses (`status`)."""

from autotune.tuning.search import Progress
from autotune.tuning.tuner import FUSION_OPTIONS, Tuner

__all__ = ["FUSION_OPTIONS", "Progress", "Tuner"]
