"""Significance that counts seeds: is system A's mean score over its training runs different from
system B's, given how much a score moves from one seed to the next and from one test set to the
next? Torch-free (numpy, scipy, sacrebleu).

Clark et al. 2011 ("Better Hypothesis Testing for Statistical Machine Translation: Controlling for
Optimizer Instability") showed that one optimizer run per system hides a variance as large as the
effects people report: they ask for several optimizer runs per system, the mean and the standard
deviation over them (their MultEval tool reports each system's mean over runs and s_opt, "the
variance of the aggregate metric score over all optimizer runs", beside s_sel, test-set selection
by bootstrap), and a test that sees both. MultEval's test is approximate randomization over
(sentence, run) cells: it swaps the two systems' hypotheses sentence by sentence (and, since
2011-06, between runs of one sentence), so a run that is better or worse as a whole is cut into
2,000 independent coin flips and its seed-to-seed variance mostly leaves the null distribution.

heads-lab's test, `seed_test`: Welch's t-test on the runs' corpus scores, whose variance is the
seeds' spread plus the test set's sampling variance:

    d = mean_i a_i - mean_j b_j                      a_i, b_j: each run's corpus BLEU
    V_seeds = s_a^2 / m + s_b^2 / n                  sample variances over the m and n runs
    V_sents = Var_I[ā(I) - b̄(I)] - W_a - W_b         I: the test sentences drawn with replacement,
                                                     one draw for every run of both systems;
                                                     ā(I) the mean of A's runs' scores on it
    W_a = mean_i Var_I[a_i(I) - ā(I)] / (m - 1)      the runs' own sentence noise, which V_seeds
                                                     holds already (likewise W_b)
    t = d / sqrt(V_seeds + V_sents),  df = Welch–Satterthwaite on V_seeds (V_sents as known)
    p = 2 · P(T_df > |t|)

V_sents is how far the mean difference would move on another test set of the same size: the
bootstrap variance of the difference of the run means, less the part of it that is each run's
own sentence-level noise (for a score that is a mean over sentences, W_a is exactly that part:
a_i(I) - ā(I) averages the run's noise less the runs' mean noise, variance σ²(1 - 1/m)/N, and
the run mean carries σ²/(m·N) of it); it is floored at 0. Without the correction the same noise
is counted twice and the test rejects less often than it says.

Why not a pure resampling test: with the three seeds a study can afford, a bootstrap over runs
sees only 10 distinct resamples of a system's runs and shrinks their variance by (n - 1) / n, and
a permutation of 3 + 3 runs cannot go below p = 0.1. `scripts/significance_calibration.py`
measures each candidate's false-positive rate on simulated systems with a seed effect; at 3 seeds
the pooled paired bootstrap and MultEval's approximate randomization reject far more often than
they say, and a two-level bootstrap does where the seed effect dominates (docs/significance.md).
With one run on a side its seed variance is unknown: the caller falls back to the paired bootstrap
of that seed and says so. Where only the runs' scores are at hand (a runs.csv; the translations
gone) V_sents is unknown and left out: the test is then Welch's t over seeds alone, and says so.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats as scipy_stats

SEEDS_AND_SENTENCES = "seeds and sentences"
SEEDS_ONLY = "seeds only"
FLOOR = 0.001  # p-values below are written "< 0.001"

ScoreRows = Callable[[np.ndarray], np.ndarray]  # summed statistics [B, k] → scores [B]


@dataclass(frozen=True)
class SeedTest:
    p: float
    diff: float  # mean over A's runs minus mean over B's
    se: float
    df: float
    seed_var: float  # V_seeds
    sentence_var: float | None  # V_sents; None where the sentences could not be resampled
    test: str  # SEEDS_AND_SENTENCES or SEEDS_ONLY


def seed_test(a: Sequence[float], b: Sequence[float],
              a_draws: Sequence[np.ndarray] | None = None,
              b_draws: Sequence[np.ndarray] | None = None) -> SeedTest:
    """Welch's t-test of mean(a) against mean(b), the runs' corpus scores, with the test set's
    sampling variance added where every run's scores on the same sentence draws are given
    (`resampled`: a_draws[i] is run i's score on each draw); module docstring. Needs at least
    two runs a side."""
    m, n = len(a), len(b)
    if m < 2 or n < 2:
        raise ValueError(f"seed_test needs two or more runs a side (got {m} and {n})")
    sa, sb = np.asarray(a, float), np.asarray(b, float)
    diff = float(sa.mean() - sb.mean())
    va, vb = float(sa.var(ddof=1)) / m, float(sb.var(ddof=1)) / n
    sentence_var = None
    if a_draws is not None and b_draws is not None:
        sentence_var = sentence_variance(a_draws, b_draws)
    total = va + vb + (sentence_var or 0.0)
    test = SEEDS_ONLY if sentence_var is None else SEEDS_AND_SENTENCES
    if total <= 0.0:  # every run of each side scores the same, on every draw
        return SeedTest(1.0 if diff == 0.0 else 0.0, diff, 0.0, math.inf, 0.0, sentence_var, test)
    welch = (va * va / (m - 1) if va else 0.0) + (vb * vb / (n - 1) if vb else 0.0)
    df = total * total / welch if welch > 0 else math.inf
    se = math.sqrt(total)
    p = float(2.0 * scipy_stats.t.sf(abs(diff) / se, df)) if diff else 1.0
    return SeedTest(min(p, 1.0), diff, se, df, va + vb, sentence_var, test)


def sentence_variance(a_draws: Sequence[np.ndarray], b_draws: Sequence[np.ndarray]) -> float:
    """V_sents (module docstring): the variance over the sentence draws of the difference of the
    systems' run means, less each system's runs' own sentence noise, floored at 0."""
    a, b = np.asarray(a_draws, float), np.asarray(b_draws, float)  # [runs, draws]
    if a.shape[1] < 2:  # one draw has no variance (report --samples 1): none is added
        return 0.0
    total = float(np.var(a.mean(0) - b.mean(0), ddof=1))

    def own_noise(x: np.ndarray) -> float:
        return float(np.mean(np.var(x - x.mean(0), axis=1, ddof=1))) / (len(x) - 1)

    return max(total - own_noise(a) - own_noise(b), 0.0)


def sentence_draws(sentences: int, samples: int, rng_seed: int = 12345) -> np.ndarray:
    """How often each sentence is drawn in each of `samples` draws with replacement
    [samples, sentences] (float, for a product with statistics); one matrix for every run
    compared, so the runs are scored on the same draws."""
    rng = np.random.default_rng(rng_seed)
    return np.stack([np.bincount(rng.integers(0, sentences, sentences), minlength=sentences)
                     for _ in range(samples)]).astype(np.float64)


def resampled(stats: np.ndarray, draws: np.ndarray, score_rows: ScoreRows) -> np.ndarray:
    """A run's score on each draw [samples], from its per-sentence sufficient statistics
    [sentences, k]."""
    return score_rows(draws @ np.asarray(stats, np.float64))


def bleu_statistics(hyps: list[str], refs: list[list[str]], tokenize: str | None = None
                    ) -> np.ndarray:
    """sacrebleu's per-sentence BLEU sufficient statistics [sentences, 2 + 2 · 4] of detokenized
    hypotheses against one or more reference streams (an entry None: no such reference), with
    sacrebleu's tokenizer `tokenize` (None: its default, 13a)."""
    from sacrebleu.metrics import BLEU  # lazy: sacrebleu's import pulls its tokenizers

    metric = BLEU(tokenize=tokenize) if tokenize else BLEU()
    return np.asarray(metric._extract_corpus_statistics(hyps, refs), dtype=np.float64)


def bleu_rows(summed: np.ndarray) -> np.ndarray:
    """Corpus BLEU of each row of summed sufficient statistics (sacrebleu's own formula)."""
    from sacrebleu.metrics import BLEU  # lazy: as bleu_statistics

    metric = BLEU()
    return np.array([metric._compute_score_from_stats(list(row)).score for row in summed])


def p_text(p: float) -> str:
    """A p-value as the report writes it: four decimals, '< 0.001' below the floor and
    '≤ 0.001' at it (a bootstrap's smallest p with 1,000 draws)."""
    if p < FLOOR:
        return f"< {FLOOR}"
    return f"≤ {FLOOR}" if p == FLOOR else f"{p:.4f}"
