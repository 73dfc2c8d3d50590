"""The per-head measures on attention maps [layers, heads, query, key] (one array per sentence):
confidence, positional share, rare-word share, syntactic accuracy (Voita et al. 2019) and the
Jensen–Shannon distance between heads (Clark et al. 2019). Definitions: heads_lab.analysis."""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np

# Voita et al. 2019's four relations first, then the frequent UD v2 ones; subtypes (nmod:poss,
# obl:arg) count as their base relation, and the older name dobj as obj.
RELATIONS = ("nsubj", "obj", "amod", "advmod", "det", "case", "nmod", "obl", "conj", "mark", "aux")
DIRECTIONS = ("dep→head", "head→dep")
SMOOTH = 1e-9


def confidence(maps: list[np.ndarray], skip_last_query: bool) -> np.ndarray:
    """[layers, heads]: mean over queries of the maximum weight."""
    total, count = 0.0, 0
    for m in maps:
        top = m.max(axis=-1)  # [L, H, query]
        if skip_last_query:
            top = top[..., :-1]
        total = total + top.sum(axis=-1)
        count += top.shape[-1]
    return total / max(count, 1)


def positional(maps: list[np.ndarray], skip_last_query: bool) -> tuple[np.ndarray, np.ndarray]:
    """([layers, heads] share of queries at the most common offset, [layers, heads] offset).

    The offset is the head's most common argmax − query. Its share counts only the queries for
    which that offset is a key of the sentence: the first token has no previous token, so a head
    that always looks at the previous token scores 1, not (n − 1) / n, on short sentences too.
    """
    hits: dict[tuple[int, int], Counter] = {}
    spans: Counter = Counter()  # (queries, keys) → sentences, for the per-offset denominators
    for m in maps:
        layers, heads, nq, nk = m.shape
        queries = nq - 1 if skip_last_query else nq
        if queries <= 0:
            continue
        offsets = m[..., :queries, :].argmax(axis=-1) - np.arange(queries)  # [L, H, q]
        for layer in range(layers):
            for head in range(heads):
                hits.setdefault((layer, head), Counter()).update(offsets[layer, head].tolist())
        spans[queries, nk] += 1

    def valid(k: int) -> int:  # queries q with 0 ≤ q + k < keys, summed over sentences
        return sum(n * max(0, min(q, keys - k) - max(0, -k)) for (q, keys), n in spans.items())

    layers, heads = maps[0].shape[:2]
    share, offset = np.zeros((layers, heads)), np.zeros((layers, heads), dtype=int)
    for (layer, head), c in hits.items():
        best, count = c.most_common(1)[0]
        share[layer, head], offset[layer, head] = count / max(valid(best), 1), best
    return share, offset


def rare_share(maps: list[np.ndarray], sources: list[list[int]], freq: dict[int, int],
               skip_last_query: bool) -> np.ndarray:
    """[layers, heads]: share of queries whose argmax key is a least frequent source token."""
    hits, n = 0.0, 0
    for m, src in zip(maps, sources):
        words = src[:-1]  # EOS is no candidate
        if not words:
            continue
        f = np.array([freq.get(t, 0) for t in words])
        rarest = np.zeros(len(src), dtype=bool)
        rarest[:-1] = f == f.min()
        top = m.argmax(axis=-1)  # [L, H, q]
        if skip_last_query:
            top = top[..., :-1]
        hits = hits + rarest[top].sum(axis=-1)
        n += top.shape[-1]
    return hits / max(n, 1)


def syntactic(maps: list[np.ndarray], arcs: list[list[tuple[list[int], list[int], str]]],
              word_offsets: dict[str, Counter]) -> dict[str, dict[str, Any]]:
    """Per relation and direction ("nsubj dep→head"), over the arcs of that relation: accuracy
    [layers, heads] (the share of arcs whose query's argmax is a subword of the other word), the
    most-frequent-word-offset baseline and the arc count. Relations without arcs are left out."""
    hits: dict[str, np.ndarray] = {}
    counts: Counter = Counter()
    for m, sent_arcs in zip(maps, arcs):
        if not sent_arcs:
            continue
        top = m.argmax(axis=-1)  # [L, H, query]
        for head_pos, dep_pos, rel in sent_arcs:
            for direction, (query, target) in zip(DIRECTIONS, ((dep_pos[0], head_pos),
                                                               (head_pos[0], dep_pos))):
                key = f"{rel} {direction}"
                hit = np.isin(top[:, :, query], target)
                hits[key] = hits[key] + hit if key in hits else hit.astype(np.int64)
                counts[key] += 1
    out = {}
    for rel in RELATIONS:
        for direction in DIRECTIONS:
            key = f"{rel} {direction}"
            if not counts[key]:
                continue
            offsets = word_offsets.get(key, Counter())
            baseline = offsets.most_common(1)[0][1] / sum(offsets.values()) if offsets else 0.0
            out[key] = {"accuracy": hits[key] / counts[key], "baseline": baseline,
                        "arcs": counts[key]}
    return out


def js_distances(maps: list[np.ndarray]) -> np.ndarray:
    """[layers, heads, heads]: JS divergence between heads summed over queries, averaged over
    sentences (Clark et al. 2019)."""
    total = None
    for m in maps:
        p = (m.astype(np.float64) + SMOOTH)
        p /= p.sum(axis=-1, keepdims=True)  # [L, H, q, k]
        a, b = p[:, :, None], p[:, None, :]  # [L, H, 1, q, k], [L, 1, H, q, k]
        log_mid = np.log2(0.5 * (a + b))
        js = 0.5 * ((a * (np.log2(a) - log_mid)).sum(axis=-1)
                    + (b * (np.log2(b) - log_mid)).sum(axis=-1)).sum(axis=-1)  # [L, H, H]
        total = js if total is None else total + js
    return total / max(len(maps), 1)


def diversity(distances: np.ndarray) -> list[float]:
    """Mean distance over the head pairs of each layer."""
    heads = distances.shape[-1]
    if heads < 2:
        return [0.0] * distances.shape[0]
    iu = np.triu_indices(heads, 1)
    return [float(d[iu].mean()) for d in distances]


