"""What decides: whole plans judged on the training step against the baseline (`plan_search`,
its paired A/B tests in `paired_test`), per-class screening that shortlists challengers
(`search`, `space`, Optuna through `sampler` on the `worker` thread), the cross-rank exchange
(`wire`), the block tests on DDP's reducer (`blocks`, `buckets`, `plain_check`), the tuner every
rank runs (`tuner`) and rank 0's decisions and storage (`decider`), and the snapshot every
reader uses (`status`)."""

from autotune.tuning.decider import FUSION_OPTIONS
from autotune.tuning.search import Progress
from autotune.tuning.tuner import Tuner

__all__ = ["FUSION_OPTIONS", "Progress", "Tuner"]
