"""The per-head measures on attention maps [layers, heads, query, key] (one array per sentence):
confidence, positional and self shares, rare-word share, word-level syntactic accuracy (Voita et
al. 2019, Clark et al. 2019) and the Jensen–Shannon distance between every two heads of a site
(Clark et al. 2019). Definitions, and where heads-lab departs from the papers: heads_lab.analysis.

`eos_key` says that the last key of every map is EOS (the maps over source keys: enc-self and
dec-enc). Voita et al. leave EOS out as "not a real token": the argmax measures (confidence,
positional, rare, syntactic) take their maximum over the other keys, and the remaining weights
are *not* renormalised (a head that puts 0.9 on EOS has confidence ≤ 0.1 on the real tokens; an
argmax does not change under renormalisation)."""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np

# Voita et al. 2019's four relations first, then the frequent UD v2 ones; subtypes (nmod:poss,
# obl:arg) count as their base relation, and the older name dobj as obj.
RELATIONS = ("nsubj", "obj", "amod", "advmod", "det", "case", "nmod", "obl", "conj", "mark", "aux")
DIRECTIONS = ("dep→head", "head→dep")
CLARK_SMOOTH = 0.001  # Clark et al.'s code: p ← 0.999 p + 0.001 / keys


def _real(m: np.ndarray, skip_last_query: bool, eos_key: bool, bos: bool = False) -> np.ndarray:
    """The map without the EOS query (skip_last_query) and the EOS key (eos_key), or without a
    language model's BOS query and key (`bos`: its first position; the rest keep their order,
    so offsets between them are unchanged)."""
    if bos:
        return m[..., 1:, 1:]
    return m[..., :m.shape[-2] - int(skip_last_query), :m.shape[-1] - int(eos_key)]


def confidence(maps: list[np.ndarray], skip_last_query: bool, eos_key: bool = False,
               bos: bool = False) -> np.ndarray:
    """[layers, heads]: Voita's confidence, "the average of its maximum attention weight
    excluding EOS", over every query (the EOS query left out with skip_last_query; a language
    model's BOS, its attention sink, left out as EOS is, with `bos`)."""
    total, count = 0.0, 0
    for m in maps:
        real = _real(m, skip_last_query, eos_key, bos)
        if real.shape[-1] == 0:
            continue
        top = real.max(axis=-1)  # [L, H, query]
        total = total + top.sum(axis=-1)
        count += top.shape[-1]
    return total / max(count, 1)


def positional(maps: list[np.ndarray], skip_last_query: bool, eos_key: bool = False,
               bos: bool = False) -> dict[str, np.ndarray]:
    """Where each head's argmax falls relative to its query, [layers, heads] arrays:
    `share` at `offset`, the head's most common offset k ≠ 0 (Voita: "a specific relative
    position (in practice either −1 or +1)"); `self` the share at offset 0 (a head that looks at
    its own token is not positional: it is reported apart and never labels a head positional);
    `prev` and `next` the shares at −1 and +1. Each share counts only the queries for which the
    offset is a key of the sentence (EOS excluded with eos_key): the first token has no previous
    token, so a head that always looks at the previous token scores 1, not (n − 1) / n. With
    `bos` a language model's BOS query and key are left out (its first text token has no
    previous token then)."""
    hits: dict[tuple[int, int], Counter] = {}
    spans: Counter = Counter()  # (queries, keys) → sentences, for the per-offset denominators
    for m in maps:
        real = _real(m, skip_last_query, eos_key, bos)
        layers, heads, queries, keys = real.shape
        if queries <= 0 or keys <= 0:
            continue
        offsets = real.argmax(axis=-1) - np.arange(queries)  # [L, H, q]
        for layer in range(layers):
            for head in range(heads):
                hits.setdefault((layer, head), Counter()).update(offsets[layer, head].tolist())
        spans[queries, keys] += 1

    def valid(k: int) -> int:  # queries q with 0 ≤ q + k < keys, summed over sentences
        return sum(n * max(0, min(q, keys - k) - max(0, -k)) for (q, keys), n in spans.items())

    layers, heads = maps[0].shape[:2]
    out = {name: np.zeros((layers, heads)) for name in ("share", "self", "prev", "next")}
    out["offset"] = np.zeros((layers, heads), dtype=int)
    for (layer, head), c in hits.items():
        for name, k in (("self", 0), ("prev", -1), ("next", 1)):
            out[name][layer, head] = c[k] / max(valid(k), 1)
        moved = [(count / max(valid(k), 1), count, -abs(k), k) for k, count in c.items() if k]
        if moved:  # the most common offset ≠ 0 (ties: the nearer, then the earlier)
            share, _, _, k = max(moved, key=lambda t: (t[1], t[2], -t[3]))
            out["share"][layer, head], out["offset"][layer, head] = share, k
    return out


def text_tokens(src: list[int], bos: bool = False) -> list[int]:
    """A sequence's tokens without its special token: the source's last (EOS), or a language
    model's first (BOS)."""
    return src[1:] if bos else src[:-1]


def rare_sentences(sources: list[list[int]], freq: dict[int, int], top_k: int | None,
                   bos: bool = False) -> list[bool]:
    """Which sentences count for rare-word heads: Voita et al. 2019 (§5.3) count "sentences where
    the least frequent token in a sentence is not in the top-500 most frequent tokens"; here the
    `top_k` most frequent (None: every sentence). `freq` counts tokens (subword ids) on the
    training source side; EOS (each source's last id; a language model's BOS, its first) is no
    candidate."""
    common = ({t for t, _ in Counter(freq).most_common(top_k)} if top_k else set())
    keep = []
    for src in sources:
        words = text_tokens(src, bos)
        if not words:
            keep.append(False)
            continue
        rarest = min(words, key=lambda t: freq.get(t, 0))
        keep.append(rarest not in common)
    return keep


def rare_share(maps: list[np.ndarray], sources: list[list[int]], freq: dict[int, int],
               skip_last_query: bool, top_k: int | None = None, bos: bool = False,
               causal: bool = False) -> tuple[np.ndarray, int]:
    """([layers, heads] share of queries whose argmax key — EOS excluded — is a least frequent
    source token of the sentence, the number of sentences counted: rare_sentences).

    Voita et al. 2019 (§5): a rare-words head is one where "the head points to the least frequent
    tokens in a sentence", measured as how often it "points to the rarest token" in the
    sentences counted. heads-lab counts each query's maximum (any of the tied least frequent
    tokens counts), and labels a head rare-word above analysis.rare_threshold (0.5); the paper
    reports the share for its one such head and sets no bar.

    A causal head (`causal`: a language model's; its BOS left out with `bos`) cannot see a rarest
    token that comes after its query: only the queries at or after the sentence's first rarest
    token count (heads-lab's restriction, so that no head is scored on what it cannot reach)."""
    hits, n, used = 0.0, 0, 0
    for m, src, keep in zip(maps, sources, rare_sentences(sources, freq, top_k, bos)):
        if not keep:
            continue
        f = np.array([freq.get(t, 0) for t in text_tokens(src, bos)])
        rarest = f == f.min()
        top = _real(m, skip_last_query, eos_key=not bos, bos=bos).argmax(axis=-1)  # [L, H, q]
        if causal:
            top = top[..., int(np.argmax(rarest)):]  # the queries that can reach a rarest token
        hits = hits + rarest[top].sum(axis=-1)
        n += top.shape[-1]
        used += 1
    if not used:
        layers, heads = maps[0].shape[:2] if maps else (0, 0)
        return np.zeros((layers, heads)), 0
    return hits / max(n, 1), used


def word_map(m: np.ndarray, units: list[list[int]]) -> np.ndarray:
    """[layers, heads, words, words] from a subword map [layers, heads, query, key] and each
    word's subword positions, as Clark et al. 2019 (attention-analysis, get_word_word_attention,
    mode "mean"): attention *to* a split word is the sum over its pieces, attention *from* it the
    mean over its pieces. Keys that belong to no word (EOS) drop out, the rows are not
    renormalised; the diagonal is set to 0 (Clark's attn_head_predictor ignores "attention to
    self"), so a word's argmax is another word."""
    n_words = len(units)
    to_word = np.zeros((m.shape[-1], n_words))  # key piece → word (sum)
    from_word = np.zeros((n_words, m.shape[-2]))  # word → query pieces (mean)
    for w, pieces in enumerate(units):
        pieces = [p for p in pieces if p < min(m.shape[-2], m.shape[-1])]
        if pieces:
            to_word[pieces, w] = 1.0
            from_word[w, pieces] = 1.0 / len(pieces)
    out = from_word @ m.astype(np.float64) @ to_word  # [L, H, words, words]
    idx = np.arange(n_words)
    out[..., idx, idx] = 0.0
    return out


def syntactic(maps: list[np.ndarray], units: list[list[list[int]]],
              arcs: list[list[tuple[int, int, str]]],
              word_offsets: dict[str, Counter], causal: bool = False) -> dict[str, dict[str, Any]]:
    """Per relation and direction ("nsubj dep→head"), at the word level: accuracy [layers, heads]
    (the share of arcs whose querying word's argmax word (word_map) is the other word of the
    arc: Voita et al.'s accuracy, "the fraction of times the word the head assigns the most
    weight to is the related word"), the baseline (the share of those arcs at the relation's
    most frequent word offset: always pointing there) and the arc count. `arcs` are (head word,
    dependent word, relation) over the sentence's words, `units` their subword positions.
    Relations without arcs are left out.

    A causal head (`causal`: a language model's self-attention) sees only earlier words, so only
    the arcs whose other word comes before the querying word count, in the accuracy, the arc
    count and the baseline alike (its offsets < 0): dep→head counts the dependents after their
    heads, head→dep the heads after their dependents (heads-lab's restriction for causal
    attention; Voita et al. and Clark et al. analyse encoders, which see every word)."""
    hits: dict[str, np.ndarray] = {}
    counts: Counter = Counter()
    for m, sent_units, sent_arcs in zip(maps, units, arcs):
        if not sent_arcs:
            continue
        top = word_map(m, sent_units).argmax(axis=-1)  # [L, H, words]
        for head_word, dep_word, rel in sent_arcs:
            for direction, (query, target) in zip(DIRECTIONS, ((dep_word, head_word),
                                                               (head_word, dep_word))):
                if causal and target > query:
                    continue  # a later word: out of a causal head's reach
                key = f"{rel} {direction}"
                hit = top[:, :, query] == target
                hits[key] = hits[key] + hit if key in hits else hit.astype(np.int64)
                counts[key] += 1
    out = {}
    for rel in RELATIONS:
        for direction in DIRECTIONS:
            key = f"{rel} {direction}"
            if not counts[key]:
                continue
            offsets = word_offsets.get(key, Counter())
            if causal:
                offsets = Counter({k: v for k, v in offsets.items() if k < 0})
            baseline = offsets.most_common(1)[0][1] / sum(offsets.values()) if offsets else 0.0
            out[key] = {"accuracy": hits[key] / counts[key], "baseline": baseline,
                        "arcs": counts[key]}
    return out


def head_distances(maps: list[np.ndarray]) -> np.ndarray:
    """[layers · heads, layers · heads]: the Jensen–Shannon divergence between every two heads of
    a site, across its layers (head i of layer l is row l · heads + i). Clark et al. 2019 (§6):
    "we measure the distance between two heads H_i and H_j as Σ_{token ∈ data} JS(H_i(token),
    H_j(token)), where JS is the Jensen-Shannon Divergence between attention distributions". As
    their code computes it (natural log, each distribution smoothed to 0.999 p + 0.001 / keys, JS
    summed over a sentence's queries), divided by the sentence's query count so that sentences
    of any length weigh alike (heads-lab's change: Clark sums over queries and sentences),
    averaged over sentences. In [0, ln 2]."""
    total, counted = None, 0
    for m in maps:
        layers, heads, queries, keys = m.shape
        if queries == 0:
            continue
        counted += 1
        p = 0.999 * m.astype(np.float64).reshape(layers * heads, queries, keys) + CLARK_SMOOTH / keys
        logp = np.log(p)
        js = np.zeros((layers * heads, layers * heads))
        for i in range(layers * heads):  # one head against all: [heads, q, k], as Clark's loop
            mid = 0.5 * (p[i][None] + p)
            log_mid = np.log(mid)
            js[i] = 0.5 * ((p[i][None] * (logp[i][None] - log_mid)).sum(axis=(-1, -2))
                           + (p * (logp - log_mid)).sum(axis=(-1, -2))) / queries
        total = js if total is None else total + js
    if total is None:
        return np.zeros((0, 0))
    return total / counted


def diversity(distances: np.ndarray, layers: int) -> list[float]:
    """Each layer's mean distance over the pairs of its own heads (from head_distances)."""
    heads = distances.shape[0] // max(layers, 1)
    if heads < 2:
        return [0.0] * layers
    iu = np.triu_indices(heads, 1)
    return [float(distances[l * heads:(l + 1) * heads, l * heads:(l + 1) * heads][iu].mean())
            for l in range(layers)]
