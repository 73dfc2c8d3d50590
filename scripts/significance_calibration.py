"""How often does each significance test call two equal systems different? A table of
false-positive rates (and power) on simulated systems with a seed effect, for the test
`heads-lab report` uses (heads_lab/report/significance.py: Welch's t over seeds with the test
set's variance) beside the candidates it was chosen over.

    python scripts/significance_calibration.py                 # ~2 min on 2 cores
    python scripts/significance_calibration.py --trials 2000   # tighter rates

Each simulated run r of a system scores sentence i as q_i + v_i + u_r + e_ri: q_i the sentence's
difficulty (shared by every system), v_i the system's own sentence effect (fixed across its runs;
what another test set would change), u_r the run's seed effect, e_ri the run's sentence noise.
The corpus score is the mean over sentences (an additive stand-in for BLEU: the tests only see
how scores move). Under the null both systems draw v, u and e from the same distributions; the
population difference is zero, every observed difference chance. A test at level 0.05 should
reject about 5 % of such pairs. The candidates:

- pooled bootstrap: sacrebleu's paired bootstrap on the seeds' translations concatenated (what
  `heads-lab report` printed before), p = (1 + #{|d*| - mean|d*| > |d|}) / (B + 1);
- MultEval AR: approximate randomization swapping each (run k, sentence i) cell between the
  systems' k-th runs (Clark et al. 2011's tool, as published), p = (1 + #{d* > d}) / (R + 1);
- two-level bootstrap: runs resampled with replacement within each system, sentences resampled
  (one draw for all runs), the difference of means centred as the pooled bootstrap's;
- Welch, seeds only: Welch's t on the runs' scores (what a runs.csv allows);
- Welch, seeds + sentences: heads-lab's (seed_test).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from heads_lab.report.significance import seed_test  # noqa: E402

ALPHA = 0.05


def simulate(rng, sentences: int, seeds: int, shift: float, sd: dict[str, float]):
    """Two systems' runs: arrays [seeds, sentences] of sentence scores; A shifted by `shift`."""
    q = rng.normal(0.0, sd["sentence"], sentences)

    def system(delta: float) -> np.ndarray:
        v = rng.normal(0.0, sd["system_sentence"], sentences)
        u = rng.normal(0.0, sd["seed"], (seeds, 1))
        e = rng.normal(0.0, sd["noise"], (seeds, sentences))
        return q + v + u + e + delta

    return system(shift), system(0.0)


def pooled_bootstrap(a, b, draws) -> float:
    flat_a, flat_b = a.reshape(-1), b.reshape(-1)
    idx = draws["pooled"]
    d = abs(flat_a.mean() - flat_b.mean())
    sample = np.abs(flat_a[idx].mean(1) - flat_b[idx].mean(1))
    return (1 + np.sum(sample - sample.mean() > d)) / (len(sample) + 1)


def multeval_ar(a, b, draws) -> float:
    swap = draws["swap"]  # [R, seeds, sentences]
    d = abs(a.mean() - b.mean())
    x = np.where(swap, b, a).mean(axis=(1, 2))
    y = np.where(swap, a, b).mean(axis=(1, 2))
    return (1 + np.sum(np.abs(x - y) > d)) / (len(x) + 1)


def two_level_bootstrap(a, b, draws) -> float:
    counts, pick_a, pick_b = draws["counts"], draws["runs_a"], draws["runs_b"]
    per_run_a = counts @ a.T / a.shape[1]  # [B, seeds]: each run's score on each draw
    per_run_b = counts @ b.T / b.shape[1]
    rows = np.arange(len(counts))[:, None]
    sample = per_run_a[rows, pick_a].mean(1) - per_run_b[rows, pick_b].mean(1)
    d = abs(a.mean() - b.mean())
    return (1 + np.sum(np.abs(sample - sample.mean()) >= d)) / (len(sample) + 1)


def welch(a, b, draws, with_sentences: bool) -> float:
    if not with_sentences:
        return seed_test(list(a.mean(1)), list(b.mean(1))).p
    counts = draws["counts"]  # the additive metric on a draw: the weighted mean of its sentences
    return seed_test(list(a.mean(1)), list(b.mean(1)), list((counts @ a.T / a.shape[1]).T),
                     list((counts @ b.T / b.shape[1]).T)).p


METHODS = ("pooled bootstrap", "MultEval AR", "two-level bootstrap", "Welch, seeds only",
           "Welch, seeds + sentences")


def rates(trials: int, sentences: int, seeds: int, shift: float, sd: dict, samples: int,
          seed: int) -> dict[str, float]:
    rng = np.random.default_rng(seed)
    hits = dict.fromkeys(METHODS, 0)
    for _ in range(trials):
        a, b = simulate(rng, sentences, seeds, shift, sd)
        counts = np.stack([np.bincount(rng.integers(0, sentences, sentences), minlength=sentences)
                           for _ in range(samples)]).astype(float)
        draws = {"pooled": rng.integers(0, seeds * sentences, (samples, seeds * sentences)),
                 "swap": rng.random((samples, seeds, sentences)) < 0.5, "counts": counts,
                 "runs_a": rng.integers(0, seeds, (samples, seeds)),
                 "runs_b": rng.integers(0, seeds, (samples, seeds))}
        p = {"pooled bootstrap": pooled_bootstrap(a, b, draws),
             "MultEval AR": multeval_ar(a, b, draws),
             "two-level bootstrap": two_level_bootstrap(a, b, draws),
             "Welch, seeds only": welch(a, b, draws, False),
             "Welch, seeds + sentences": welch(a, b, draws, True)}
        for name in METHODS:
            hits[name] += p[name] < ALPHA
    return {name: hits[name] / trials for name in METHODS}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=400, help="simulated pairs per cell")
    parser.add_argument("--samples", type=int, default=400, help="resamples per test")
    parser.add_argument("--sentences", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=1)
    opts = parser.parse_args()
    # corpus-level sds (score points): seed effect 0.3 and run noise 15 / sqrt(2000) = 0.34 give
    # a run-to-run sd of ~0.45, as the Tatoeba studies' BLEU (0.26-1.26); the system's own
    # sentence effects (sd 10) give a paired test-set sd of the difference of ~0.3
    base = {"sentence": 20.0, "system_sentence": 10.0, "seed": 0.3, "noise": 15.0}
    cells = [("3 seeds, null", 3, 0.0, base), ("5 seeds, null", 5, 0.0, base),
             ("3 seeds, null, no seed effect", 3, 0.0, {**base, "seed": 0.0}),
             ("3 seeds, null, seed effect alone", 3, 0.0,
              {**base, "seed": 0.5, "noise": 3.0, "system_sentence": 2.0}),
             ("3 seeds, A better by 1.0", 3, 1.0, base), ("5 seeds, A better by 1.0", 5, 1.0, base)]
    started = time.monotonic()
    print(f"rejections at p < {ALPHA} over {opts.trials} simulated pairs each "
          f"({opts.sentences} sentences, {opts.samples} resamples):\n")
    print("| case | " + " | ".join(METHODS) + " |")
    print("|---|" + "---:|" * len(METHODS))
    for i, (name, seeds, shift, sd) in enumerate(cells):
        got = rates(opts.trials, opts.sentences, seeds, shift, sd, opts.samples, opts.seed + i)
        print(f"| {name} | " + " | ".join(f"{got[m]:.1%}" for m in METHODS) + " |", flush=True)
    print(f"\n({time.monotonic() - started:.0f} s; a null row should read ~5 %: more is a test "
          "that finds differences that are not there)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
