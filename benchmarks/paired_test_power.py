"""How often a bucket paired test keeps a challenger, by its true step ratio and the noise:
simulated.

    python benchmarks/paired_test_power.py --ratios 0.92,0.95,1.0,1.03,1.1 --sigmas 0.10,0.13

A paired test's stopping rules (`autotune.tuning.paired_test.PairedTest`) decide on noisy pairs of
blocks; whether they keep a real gain, or drop a size that has turned slower, is a matter of chance
that a few benchmark runs cannot count. This feeds the paired tests `autotune.tuning.buckets` runs
with pairs whose log ratio is normal around the log of the true ratio, with the given spread, and
counts how often each kept the challenger and how many pairs it took:

- ``first``: a first paired test (`autotune.tuning.buckets.bucket_test`, as the job runs it:
  `MAX_PAIRS`, extended to twice that while ahead on the median); the challenger must be faster
  beyond noise (the check against plain DDP is such a test);
- ``first, a near miss retried``: where the first test lost ahead on the median by
  `NEAR_MISS_BELOW` or more, a second first test (the next job's, for a check's near miss:
  docs/TUNER.md, "After a lost check"); pairs are both tests' together;
- ``re-check at N``: a stored size's re-check judged at `MAX_PAIRS` alone (``extend_to`` =
  ``max_pairs``);
- ``re-check, extended``: the re-check the job runs (``bucket_test(recheck=True)``), which goes
  on to twice `MAX_PAIRS` where the stored size is not ahead on the median at `MAX_PAIRS`;
- ``first, blocks of one``: a first paired test judged on the sign test instead of the
  signed-rank interval, as the check against plain DDP is in blocks of one timed step
  (`autotune.tuning.plain_check`; ``--rule`` picks the rules to run).

``--tails t3`` draws the log ratios from Student's t with 3 degrees of freedom, scaled to the
same spread, instead of the normal: a step's long tails.

The spread: the log ratios of the 12 block pairs measured in a re-check of the example mlp's
4 MiB buckets at 2 ranks on 2 shared cores (tests/tuning/test_plan_search.py) have a standard
deviation of 0.099; 0.13 stands for a louder machine. Nothing here is timed; the figures are counts.
"""

from __future__ import annotations

import argparse
import math
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from autotune.tuning.buckets import MAX_PAIRS, bucket_test
from autotune.tuning.paired_test import PairedTest
from autotune.tuning.plan_search import NEAR_MISS_BELOW

RETRIED = "first, a near miss retried"
ONE = "first, blocks of one"
RULES = ("first", RETRIED, f"re-check at {MAX_PAIRS}", "re-check, extended", ONE)


def duel(rule: str) -> PairedTest:
    if rule == f"re-check at {MAX_PAIRS}":  # judged at MAX_PAIRS alone
        return PairedTest(MAX_PAIRS, warmup=0, signed_rank=True, hold=True)
    if rule == ONE:
        return bucket_test(MAX_PAIRS, signed_rank=False)
    return bucket_test(MAX_PAIRS, recheck=rule not in ("first", RETRIED))


def noise(sigma: float, tails: str, rng: random.Random) -> float:
    """A pair's log ratio about the true one: normal, or Student's t with 3 degrees of freedom
    (variance 3) scaled to the same spread."""
    if tails == "normal":
        return rng.gauss(0.0, sigma)
    chi2 = sum(rng.gauss(0.0, 1.0) ** 2 for _ in range(3))
    return sigma * rng.gauss(0.0, 1.0) / math.sqrt(chi2 / 3) / math.sqrt(3)


def run(
    rule: str, ratio: float, sigma: float, rng: random.Random, tails: str = "normal"
) -> tuple[bool, int]:
    """One paired test (for `RETRIED`, one or two): whether it kept the challenger, and its
    pairs."""
    d = duel(rule)
    while d.outcome is None:
        d.measure(False, 1.0)
        d.measure(True, math.exp(math.log(ratio) + noise(sigma, tails, rng)))
    won, pairs = d.outcome.challenger_won, len(d.ratios)
    if rule != RETRIED or won or not d.outcome.gain.ratio < NEAR_MISS_BELOW:
        return won, pairs
    again, more = run("first", ratio, sigma, rng, tails)
    return again, pairs + more


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ratios", default="0.92,0.95,1.0,1.03,1.1", help="true challenger/reference")
    p.add_argument("--sigmas", default="0.10,0.13", help="spread of a pair's log ratio")
    p.add_argument("--trials", type=int, default=4000, help="paired tests per cell")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument(
        "--rule",
        action="append",
        help="a rule to run (repeat it; all by default): " + "; ".join(RULES),
    )
    p.add_argument("--tails", choices=("normal", "t3"), default="normal")
    args = p.parse_args()
    rng = random.Random(args.seed)
    ratios = [float(r) for r in args.ratios.split(",")]
    rules = args.rule or list(RULES)
    unknown = sorted(set(rules) - set(RULES))
    if unknown:
        p.error(f"--rule: {'; '.join(unknown)} is not one of: {'; '.join(RULES)}")
    print("| sigma | true ratio | " + " | ".join(f"{r}: kept (pairs)" for r in rules) + " |")
    print("|---|---|" + "---:|" * len(rules))
    for sigma in (float(s) for s in args.sigmas.split(",")):
        for ratio in ratios:
            cells = []
            for rule in rules:
                results = [run(rule, ratio, sigma, rng, args.tails) for _ in range(args.trials)]
                kept = sum(won for won, _ in results) / args.trials
                pairs = sum(n for _, n in results) / args.trials
                cells.append(f"{kept:.1%} ({pairs:.1f})")
            print(f"| {sigma} | {ratio} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
