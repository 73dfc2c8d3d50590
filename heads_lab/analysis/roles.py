"""The roles of a language model's heads: previous-token, duplicate-token and induction scores on
repeated random tokens, and the attention-sink score on the analysed text.

**Previous-token, duplicate-token, induction** follow TransformerLens's `head_detector`
(transformer_lens/head_detector.py): a 0/1 detection pattern P over (query i, key j), lower
triangular, and its "mul" measure, "multiplies both tensors element-wise and divides the sum of
the result by the sum of the attention pattern": `(A · P).sum() / A.sum()`, "how big fraction of
this head's attention is allocated to these specific query-key pairs", per sequence, averaged
over the sequences (as `detect_head` averages a list). The patterns:

- previous token: P[i, i − 1] = 1;
- duplicate token: P[i, j] = 1 where token j equals token i, j < i;
- induction: P[i, j] = 1 where token j − 1 equals token i (j ≤ i): the token after an earlier
  copy of the current one.

The sequences are TransformerLens's and Olsson et al.'s test: `analysis.role_sequences`
sequences of `analysis.role_length` random tokens, each repeated once, after the model's BOS
(TransformerLens's `to_tokens` prepends it; its attention is counted, as `exclude_bos=False`,
TransformerLens's default, counts it). heads-lab draws each sequence's tokens without
replacement from the tokenizer's ordinary tokens (no special token), seeded, so a token recurs
only in the second copy and the patterns have no accidental matches.

Where heads-lab departs: the **duplicate-token and induction** scores count only the rows of
the second copy (the queries that have an earlier copy to look back to). TransformerLens's
scores over all rows are capped below 0.5 on such sequences (a perfect head scores
L / (2L + 1)), since the first copy's rows have no target and still hold half the attention
mass, so no head could pass a bar of 0.5; the previous-token score is over all rows, as
TransformerLens computes it.

**Attention sink** (Gu et al. 2025, "When attention sink emerges in language models"): for
each head, α_k = (1 / (T − k)) Σ_{i ≥ k} A[i, k], the mean attention that the queries at or after
position k give to the token at k, over sequences of length T; a head is a sink head where
α_0 > ε = 0.3 (the paper's threshold on its first token). heads-lab reads the analysed texts
(each its own length T, at most analysis.max_tokens), averages α_k over those long enough to
have a position k, and reports α_0 (the BOS) and the largest α_k over k ≥ 1 with its position and
the token most often there.
"""

from __future__ import annotations

from collections import Counter

import numpy as np

ROLE_SEED = 20261207
SINK_THRESHOLD = 0.3  # Gu et al. 2025's ε


def repeated_tokens(vocab: list[int], bos: int | None, sequences: int, length: int,
                    seed: int = ROLE_SEED) -> list[list[int]]:
    """`sequences` sequences of `length` distinct random tokens of `vocab`, each repeated once,
    after `bos` (where the model has one): [BOS] x x."""
    rng = np.random.default_rng(seed)
    pool = np.asarray(sorted(set(vocab)))
    if len(pool) < length:
        raise ValueError(f"{len(pool)} ordinary tokens, fewer than a sequence's {length}")
    out = []
    for _ in range(sequences):
        x = [int(t) for t in rng.choice(pool, size=length, replace=False)]
        out.append(([bos] if bos is not None else []) + x + x)
    return out


def previous_pattern(n: int) -> np.ndarray:
    """[n, n]: P[i, i − 1] = 1."""
    return np.eye(n, k=-1)


def duplicate_pattern(tokens: list[int]) -> np.ndarray:
    """[n, n]: P[i, j] = 1 where token j equals token i, j < i."""
    t = np.asarray(tokens)
    return np.tril(t[:, None] == t[None, :], k=-1).astype(float)


def induction_pattern(tokens: list[int]) -> np.ndarray:
    """[n, n]: P[i, j] = 1 where token j − 1 equals token i, 1 ≤ j ≤ i (the duplicate pattern
    shifted one key to the right)."""
    dup = duplicate_pattern(tokens)
    out = np.zeros_like(dup)
    out[:, 1:] = dup[:, :-1]
    return np.tril(out)


def mul_score(a: np.ndarray, p: np.ndarray, rows: slice | None = None) -> np.ndarray:
    """TransformerLens's "mul" measure of attention `a` [..., query, key] against a pattern `p`
    [query, key]: (a · p).sum() / a.sum() over the queries `rows` (all by default), per leading
    index ([layers, heads])."""
    rows = rows or slice(None)
    a, p = a[..., rows, :], p[rows]
    return (a * p).sum(axis=(-1, -2)) / a.sum(axis=(-1, -2))


def role_scores(maps: list[np.ndarray], sequences: list[list[int]], length: int
                ) -> dict[str, np.ndarray]:
    """[layers, heads] previous-token, duplicate-token and induction scores (see the module
    doc), each the mean over the sequences of its per-sequence score; `maps` [layers, heads,
    n, n] of `sequences` ([BOS] x x, x of `length` tokens)."""
    out: dict[str, list[np.ndarray]] = {"previous_token": [], "duplicate_token": [],
                                        "induction": []}
    for m, tokens in zip(maps, sequences, strict=True):
        m = m.astype(np.float64)
        n = len(tokens)
        second = slice(n - length, n)  # the rows of the second copy
        out["previous_token"].append(mul_score(m, previous_pattern(n)))
        out["duplicate_token"].append(mul_score(m, duplicate_pattern(tokens), second))
        out["induction"].append(mul_score(m, induction_pattern(tokens), second))
    return {name: np.mean(scores, axis=0) for name, scores in out.items()}


def sink_scores(maps: list[np.ndarray], sources: list[list[int]]) -> dict[str, np.ndarray]:
    """Gu et al.'s α_k per head (see the module doc): `alpha0` [layers, heads] (α at the first
    position, the BOS), `max_alpha` and `max_position` [layers, heads] (the largest α_k over
    k ≥ 1 and its k), `tokens` [layers, heads] the token most often at that position; from the
    causal maps [layers, heads, T, T] of the sequences `sources`."""
    longest = max(m.shape[-1] for m in maps)
    layers, heads = maps[0].shape[:2]
    sums = np.zeros((layers, heads, longest))
    counts = np.zeros(longest)
    at: list[Counter] = [Counter() for _ in range(longest)]
    for m, src in zip(maps, sources, strict=True):
        t = m.shape[-1]
        # α_k of this sequence: the mean over queries i ≥ k of A[i, k] (a causal map is 0 above)
        below = np.tril(m.astype(np.float64)).sum(axis=-2)  # [L, H, T]: Σ_{i ≥ k} A[i, k]
        sums[..., :t] += below / (t - np.arange(t))
        counts[:t] += 1
        for k, token in enumerate(src[:t]):
            at[k][token] += 1
    alpha = sums / np.maximum(counts, 1)
    out = {"alpha0": alpha[..., 0]}
    if longest > 1:
        k = alpha[..., 1:].argmax(axis=-1) + 1
        out["max_alpha"] = np.take_along_axis(alpha, k[..., None], axis=-1)[..., 0]
        out["max_position"] = k
        out["tokens"] = np.vectorize(lambda p: at[p].most_common(1)[0][0])(k)
    else:
        out["max_alpha"] = np.full((layers, heads), np.nan)
        out["max_position"] = np.zeros((layers, heads), dtype=int)
        out["tokens"] = np.full((layers, heads), -1)
    return out
