"""The seed-aware test (heads_lab/report/significance.py): Welch's t over seeds, checked against
scipy's own Welch test; the test set's variance, checked against its formula written out and
against a planted sentence effect; BLEU on a draw, checked against sacrebleu on the drawn
sentences themselves."""

from __future__ import annotations

import numpy as np
import pytest
from sacrebleu.metrics import BLEU
from scipy import stats

from heads_lab.report import significance as sig


def test_over_the_seeds_alone_it_is_welchs_t_test():
    rng = np.random.default_rng(0)
    for m, n in ((3, 3), (2, 5), (4, 3)):
        a, b = rng.normal(50, 0.5, m), rng.normal(49.5, 0.8, n)
        got = sig.seed_test(list(a), list(b))
        want = stats.ttest_ind(a, b, equal_var=False)
        assert got.p == pytest.approx(want.pvalue, rel=1e-10)
        assert got.diff == pytest.approx(a.mean() - b.mean())
        assert got.test == sig.SEEDS_ONLY and got.sentence_var is None


def test_identical_seeds_give_p_one():
    scores = [49.1, 49.9, 50.3]
    draws = [np.linspace(s - 1, s + 1, 200) for s in scores]
    assert sig.seed_test(scores, scores).p == 1.0
    got = sig.seed_test(scores, scores, draws, draws)
    assert got.p == 1.0 and got.test == sig.SEEDS_AND_SENTENCES


def test_a_shift_inside_the_seed_spread_is_not_significant_and_many_spreads_is():
    b = np.array([49.0, 49.5, 50.0])  # sd 0.5
    other = np.array([0.2, -0.3, 0.1])  # the other system's seeds scatter alike
    near = sig.seed_test(list(b + other + 0.5 * 0.5), list(b))
    assert near.p > 0.3
    far = sig.seed_test(list(b + other + 20 * 0.5), list(b))
    assert far.p < 0.001 and sig.p_text(far.p) == "< 0.001"


def test_one_seed_a_side_is_refused():
    with pytest.raises(ValueError, match="two or more runs a side"):
        sig.seed_test([50.0], [49.0, 49.5])


def _additive(runs: np.ndarray, draws: np.ndarray) -> list[np.ndarray]:
    """Each run's mean sentence score on each draw, through `resampled` with (score, 1) rows."""
    return [sig.resampled(np.stack([r, np.ones_like(r)], 1), draws,
                          lambda summed: summed[:, 0] / summed[:, 1]) for r in runs]


def test_the_test_sets_variance_is_its_formula_written_out():
    rng = np.random.default_rng(2)
    n_sent = 60
    a = rng.normal(0, 10, (3, n_sent))
    b = rng.normal(0, 10, (4, n_sent))
    draws = sig.sentence_draws(n_sent, 300, rng_seed=3)
    got = sig.sentence_variance(_additive(a, draws), _additive(b, draws))
    # written out: each draw's mean of the drawn sentences, run by run, in float64 loops
    per_draw = {}
    for name, runs in (("a", a), ("b", b)):
        per_draw[name] = np.array([[sum(c * x for c, x in zip(row, run)) / n_sent
                                    for row in draws] for run in runs])
    diff = per_draw["a"].mean(0) - per_draw["b"].mean(0)
    total = sum((d - diff.mean()) ** 2 for d in diff) / (len(diff) - 1)

    def noise(x):
        dev = x - x.mean(0)
        return np.mean([np.sum((d - d.mean()) ** 2) / (len(d) - 1) for d in dev]) / (len(x) - 1)

    assert got == pytest.approx(max(total - noise(per_draw["a"]) - noise(per_draw["b"]), 0.0),
                                rel=1e-9)


def test_a_planted_sentence_effect_is_found_and_run_noise_is_not_counted_twice():
    """Positive control: each system's runs share a sentence effect of sd 8 (what another test
    set would change) besides their own noise of sd 15. V_sents estimates the planted
    2 · 8² / N; the noise, already in the seeds' spread, stays out of it."""
    rng = np.random.default_rng(4)
    n_sent, seeds = 2000, 3
    planted, without = [], []
    for _ in range(40):
        q = rng.normal(0, 20, n_sent)
        draws = sig.sentence_draws(n_sent, 200, rng_seed=int(rng.integers(1 << 30)))
        for effect, out in ((8.0, planted), (0.0, without)):
            a = q + rng.normal(0, effect, n_sent) + rng.normal(0, 15, (seeds, n_sent))
            b = q + rng.normal(0, effect, n_sent) + rng.normal(0, 15, (seeds, n_sent))
            out.append(sig.sentence_variance(_additive(a, draws), _additive(b, draws)))
    assert np.mean(planted) == pytest.approx(2 * 8.0 ** 2 / n_sent, rel=0.2)
    noise_alone = 2 * 15.0 ** 2 / seeds / n_sent  # what the uncorrected variance would add
    assert np.mean(without) < 0.15 * noise_alone


def test_bleu_on_a_draw_is_sacrebleus_corpus_bleu_on_the_drawn_sentences():
    refs = [f"the {w} dog runs over the {c} grass today" for w in ("small", "big", "old", "tall")
            for c in ("green", "dry", "long")]
    hyps = [r.replace("grass", "field") if i % 3 else r.replace("dog", "cat")
            for i, r in enumerate(refs)]
    draws = sig.sentence_draws(len(refs), 5, rng_seed=7)
    got = sig.resampled(sig.bleu_statistics(hyps, [refs]), draws, sig.bleu_rows)
    for row, value in zip(draws, got):
        picked = [i for i, c in enumerate(row) for _ in range(int(c))]
        want = BLEU().corpus_score([hyps[i] for i in picked], [[refs[i] for i in picked]])
        assert value == pytest.approx(want.score, abs=1e-9)


def test_p_text_writes_the_floor():
    assert sig.p_text(0.0312) == "0.0312"
    assert sig.p_text(0.0009) == "< 0.001"
    assert sig.p_text(0.001) == "≤ 0.001"  # the floor of 1,000 bootstrap draws
