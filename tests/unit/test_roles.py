"""A language model's head roles (heads_lab/analysis/roles.py) and the measures of a causal site
(heads_lab/analysis/metrics.py), each against a straight re-implementation of its formula, in
loops, on hand-made and random attention patterns, and on planted heads whose answer is known."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from heads_lab.analysis.metrics import confidence, positional, rare_share, syntactic
from heads_lab.analysis.roles import (
    duplicate_pattern,
    induction_pattern,
    previous_pattern,
    repeated_tokens,
    role_scores,
    sink_scores,
)


def _causal(rng, n: int, layers: int = 2, heads: int = 3) -> np.ndarray:
    """Random causal attention [layers, heads, n, n]: rows sum to 1, zero above the diagonal."""
    logits = rng.normal(size=(layers, heads, n, n)) * 2
    logits[..., np.triu_indices(n, 1)[0], np.triu_indices(n, 1)[1]] = -np.inf
    a = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return a / a.sum(axis=-1, keepdims=True)


def _by_loops(a: np.ndarray, tokens: list[int], length: int) -> dict[str, np.ndarray]:
    """TransformerLens's patterns and its "mul" score, written out: Σ A[i, j] over the pattern's
    (i, j) / Σ A over the rows counted (induction: the second copy's rows only)."""
    n = len(tokens)
    layers, heads = a.shape[:2]
    out = {k: np.zeros((layers, heads)) for k in ("previous_token", "duplicate_token",
                                                  "induction")}
    for layer in range(layers):
        for head in range(heads):
            m = a[layer, head]
            prev = sum(m[i, i - 1] for i in range(1, n))
            rows = range(n - length, n)
            dup = sum(m[i, j] for i in rows for j in range(i) if tokens[j] == tokens[i])
            ind = sum(m[i, j] for i in rows for j in range(1, i + 1)
                      if tokens[j - 1] == tokens[i])
            out["previous_token"][layer, head] = prev / m.sum()
            out["duplicate_token"][layer, head] = dup / sum(m[i].sum() for i in rows)
            out["induction"][layer, head] = ind / sum(m[i].sum() for i in rows)
    return out


def test_the_patterns_are_transformer_lens_s():
    tokens = [0, 5, 7, 5, 9, 7]
    assert previous_pattern(3).tolist() == [[0, 0, 0], [1, 0, 0], [0, 1, 0]]
    dup = duplicate_pattern(tokens)
    assert {tuple(x) for x in np.argwhere(dup)} == {(3, 1), (5, 2)}  # j < i, same token
    ind = induction_pattern(tokens)
    assert {tuple(x) for x in np.argwhere(ind)} == {(3, 2), (5, 3)}  # the token after the copy
    assert np.allclose(np.triu(ind, 1), 0)


def test_role_scores_are_the_formulas_written_out_on_random_attention():
    rng = np.random.default_rng(0)
    sequences = repeated_tokens(list(range(3, 200)), bos=1, sequences=3, length=12, seed=5)
    maps = [_causal(rng, len(s)) for s in sequences]
    got = role_scores(maps, sequences, 12)
    loops = [_by_loops(m, s, 12) for m, s in zip(maps, sequences)]
    for name in got:
        np.testing.assert_allclose(got[name], np.mean([x[name] for x in loops], axis=0),
                                   rtol=1e-12)


def test_planted_heads_score_one_on_their_own_role_and_little_on_the_others():
    """[BOS] x x, x of 10 distinct tokens: a previous-token head (A[i, i−1] = 1), a
    duplicate-token head (the second copy's rows on the earlier copy of their token) and an
    induction head (the second copy's rows on the token after that copy), each exact: each
    scores 1 on its own role (previous-token: all but the BOS row), so passes the 0.5 bar."""
    length = 10
    (tokens,) = repeated_tokens(list(range(3, 100)), bos=0, sequences=1, length=length, seed=1)
    n = len(tokens)
    prev, dup, ind = (np.zeros((n, n)) for _ in range(3))
    prev[0, 0] = 1.0
    for i in range(1, n):
        prev[i, i - 1] = 1.0
    for m, shift in ((dup, 0), (ind, 1)):
        for i in range(n):
            m[i, i - length + shift if i > length else 0] = 1.0  # first copy + BOS: on the BOS
    maps = [np.stack([prev, dup, ind])[None]]  # [1 layer, 3 heads, n, n]
    got = role_scores(maps, [tokens], length)
    assert got["previous_token"][0, 0] == pytest.approx((n - 1) / n)  # the BOS row: no previous
    assert got["duplicate_token"][0, 1] == pytest.approx(1.0)  # the second copy's rows only
    assert got["induction"][0, 2] == pytest.approx(1.0)  # the second copy's rows only
    assert got["induction"][0, 0] < 0.2 and got["previous_token"][0, 2] < 0.2
    assert got["induction"][0, 1] == 0.0


def test_repeated_tokens_are_distinct_ordinary_tokens_read_twice_after_the_bos():
    seqs = repeated_tokens([5, 6, 7, 8, 9, 10, 11], bos=1, sequences=4, length=5)
    for s in seqs:
        assert s[0] == 1 and s[1:6] == s[6:] and len(set(s[1:6])) == 5
        assert set(s[1:]) <= {5, 6, 7, 8, 9, 10, 11}
    assert seqs == repeated_tokens([5, 6, 7, 8, 9, 10, 11], bos=1, sequences=4, length=5)
    with pytest.raises(ValueError, match="fewer than"):
        repeated_tokens([5, 6], bos=1, sequences=1, length=5)


def test_the_sink_score_is_gu_et_al_s_alpha_written_out():
    """α_k = (1 / (T − k)) Σ_{i ≥ k} A[i, k] per head, averaged over the sequences that reach
    position k; a head that puts everything on the BOS has α₀ = 1; the largest α past the first
    token names its position and the token most often there."""
    rng = np.random.default_rng(3)
    sources = [[1, 4, 5, 6, 7], [1, 4, 9, 8], [1, 2, 5, 6, 3, 3]]
    maps = [_causal(rng, len(s)) for s in sources]
    maps[0][0, 0] = 0.0
    maps[0][0, 0, :, 0] = 1.0  # layer 0 head 0 of the first sequence: all on the BOS
    got = sink_scores(maps, sources)
    longest = max(len(s) for s in sources)
    for layer in range(2):
        for head in range(3):
            alpha = []
            for k in range(longest):
                per = [sum(m[layer, head, i, k] for i in range(k, m.shape[-1]))
                       / (m.shape[-1] - k) for m in maps if m.shape[-1] > k]
                alpha.append(np.mean(per))
            assert got["alpha0"][layer, head] == pytest.approx(alpha[0])
            k = int(np.argmax(alpha[1:])) + 1
            assert got["max_position"][layer, head] == k
            assert got["max_alpha"][layer, head] == pytest.approx(alpha[k])
            assert got["tokens"][layer, head] == Counter(
                s[k] for s in sources if len(s) > k).most_common(1)[0][0]


def test_a_causal_site_leaves_its_bos_out_as_an_encoder_leaves_its_eos_out():
    """Confidence and positions of a language model's maps (BOS first) equal the encoder's on
    the same map mirrored into its layout (EOS last): the special token is left out alike."""
    rng = np.random.default_rng(7)
    lm = _causal(rng, 6)
    enc = np.zeros_like(lm)
    enc[..., :5, :5] = lm[..., 1:, 1:]  # the text part, then an EOS row and column
    enc[..., :, 5] = lm[..., :, 0]
    for a, b in ((confidence([lm], False, bos=True), confidence([enc], True, eos_key=True)),):
        np.testing.assert_allclose(a, b)
    p_lm, p_enc = positional([lm], False, bos=True), positional([enc], True, eos_key=True)
    for key in ("share", "self", "prev", "offset"):
        np.testing.assert_allclose(p_lm[key], p_enc[key])


def test_a_causal_heads_syntax_counts_only_arcs_to_earlier_words():
    """Three words, arcs 1 → 0 (head word 1, dependent 0) and 1 → 2: a head pointing each word
    at the previous one is right on dep→head of 2 → 1 and on head→dep of 1 → 0; a causal head
    cannot reach the others (a later word), which are left out of the count and the baseline."""
    units = [[1], [2], [3]]  # BOS at piece 0
    arcs = [(1, 0, "det"), (1, 2, "obj")]
    prev = np.zeros((1, 1, 4, 4))
    for i in range(4):
        prev[0, 0, i, max(i - 1, 0)] = 1.0
    offsets = {"det dep→head": Counter({1: 1}), "det head→dep": Counter({-1: 1}),
               "obj dep→head": Counter({-1: 1}), "obj head→dep": Counter({1: 1})}
    full = syntactic([prev], [units], [arcs], offsets)
    causal = syntactic([prev], [units], [arcs], offsets, causal=True)
    assert set(full) == {"det dep→head", "det head→dep", "obj dep→head", "obj head→dep"}
    assert set(causal) == {"det head→dep", "obj dep→head"}
    assert all(v["arcs"] == 1 and v["accuracy"][0, 0] == 1.0 and v["baseline"] == 1.0
               for v in causal.values())
    assert full["det dep→head"]["accuracy"][0, 0] == 0.0  # word 0's previous word: none


def test_a_causal_heads_rare_share_counts_only_queries_that_can_see_the_rarest_token():
    src = [1, 10, 11, 99, 12]  # BOS, then the text; 99 the rarest
    freq = {10: 50, 11: 40, 99: 1, 12: 30}
    m = np.zeros((1, 1, 5, 5))
    for i in range(5):
        m[0, 0, i, min(i, 3)] = 1.0  # from the rarest token on, every query looks at it
    share, used = rare_share([m], [src], freq, skip_last_query=False, top_k=None, bos=True,
                             causal=True)
    assert used == 1 and share[0, 0] == 1.0  # the two queries at or after it, both on it
    whole, _ = rare_share([m], [src], freq, skip_last_query=False, top_k=None, bos=True)
    assert whole[0, 0] == pytest.approx(2 / 4)  # counting the queries that cannot see it
