"""What each head does: the measurements of Voita et al. 2019 (confidence, positional,
syntactic and rare-word heads), Michel et al. 2019 (importance) and Clark et al. 2019 (distance
between heads), on teacher-forced attention maps of a split.

Conventions (every metric below is over the first `analysis.max_sentences` sentences):
- Maps are per sentence and site: [layers, heads, query, key], without padding. Source keys end
  with EOS; decoder queries are BOS + the reference tokens (teacher forcing).
- A head "points at" the key of its maximum weight (argmax) for each query.
- Confidence: mean over queries of the maximum weight; EOS queries (the encoder's last
  position) are left out.
- Positional (self-attention): the share of queries whose argmax is at the head's most common
  relative offset (argmax − query), among the queries for which that offset is inside the
  sentence (query 0 has no offset −1); positional when ≥ analysis.positional_threshold.
- Rare-word (source keys: enc-self, dec-enc): the share of queries whose argmax is a source token
  with the lowest training-data frequency in the sentence (EOS excluded); rare when
  > analysis.rare_threshold.
- Syntactic (enc-self): for each relation (nsubj, dobj, amod, advmod) and direction (dep→head:
  the dependent's first subword queries; head→dep: the head's), the share of arcs whose argmax
  is any subword of the other word, against the baseline accuracy of always pointing at the
  relation's most common word offset; syntactic for a relation when the head beats it by
  analysis.syntactic_margin. Words are matched to subwords by character spans of the source
  text (synthetic data: gold arcs; real data: a CoNLL-U file of the split, one sentence per
  source line, tokens located left to right in the text, UD `obj` read as dobj; sentences
  whose tokens cannot be found are skipped and counted).
- Importance (Michel): I_h = mean over batches of |∂L/∂ξ_h|, ξ a gate on each head's output at
  1, L the mean NLL per target token of the batch; normalised by the ℓ2 norm of its layer.
- Distance (Clark): Jensen–Shannon divergence (base 2, so in [0, 1]) between two heads' weights
  (smoothed by 1e-9 and renormalised) summed over a sentence's queries, averaged over sentences;
  a layer's diversity is the mean distance over its head pairs.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from heads_lab.data import Split, collate
from heads_lab.errors import DataError
from heads_lab.heads import SITES, HeadSet, attention_modules, gated_heads

log = logging.getLogger(__name__)
RELATIONS = ("nsubj", "dobj", "amod", "advmod")
UD_NAMES = {"obj": "dobj"}  # Universal Dependencies v2 → the names used here
SMOOTH = 1e-9


@dataclass
class Sentence:
    """One sentence's teacher-forced attention: src ids (+ EOS), tgt_in ids (BOS + tokens) and
    maps[site] [layers, heads, query, key] (float32)."""

    src: list[int]
    tgt_in: list[int]
    maps: dict[str, np.ndarray]
    arcs: list[tuple[list[int], list[int], str]] = field(default_factory=list)
    # arcs over source subword positions: (head word's positions, dependent's positions, rel)


@torch.no_grad()
def collect_maps(model, split: Split, count: int, device, batch_size: int = 32) -> list[Sentence]:
    """Teacher-forced attention maps of the first `count` sentences of `split`."""
    was_training = model.training
    model.eval()
    out: list[Sentence] = []
    ids_all = np.arange(min(count, len(split)))
    for start in range(0, len(ids_all), batch_size):
        batch = collate(split, ids_all[start:start + batch_size]).to(device)
        model.decode(batch.tgt_in, model.encode(batch.src, need_weights=True), need_weights=True)
        weights = model.attention_weights()
        for row in range(batch.src.shape[0]):
            n_src = int((batch.src[row] != model.pad_id).sum())
            n_tgt = int((batch.tgt_in[row] != model.pad_id).sum())
            size = {"enc-self": (n_src, n_src), "dec-self": (n_tgt, n_tgt),
                    "dec-enc": (n_tgt, n_src)}
            maps = {site: np.stack([w[row, :, :size[site][0], :size[site][1]].float().cpu().numpy()
                                    for w in weights[site]]) for site in SITES if weights[site]}
            out.append(Sentence(batch.src[row, :n_src].tolist(), batch.tgt_in[row, :n_tgt].tolist(),
                                maps))
    model.train(was_training)
    return out


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
    """Per relation and direction: accuracy [layers, heads], the offset baseline, arc count."""
    out = {}
    for rel in RELATIONS:
        for direction in ("dep→head", "head→dep"):
            key = f"{rel} {direction}"
            hits, n = 0, 0
            for m, sent_arcs in zip(maps, arcs):
                for head_pos, dep_pos, r in sent_arcs:
                    if r != rel:
                        continue
                    query, target = ((dep_pos[0], head_pos) if direction == "dep→head"
                                     else (head_pos[0], dep_pos))
                    top = m[:, :, query, :].argmax(axis=-1)  # [L, H]
                    hits = hits + np.isin(top, target)
                    n += 1
            if not n:
                continue
            offsets = word_offsets.get(key, Counter())
            baseline = offsets.most_common(1)[0][1] / sum(offsets.values()) if offsets else 0.0
            out[key] = {"accuracy": hits / n, "baseline": baseline, "arcs": n}
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


def head_importance(model, split: Split, count: int | None, max_tokens: int, device,
                    masked: HeadSet | None = None, sites=SITES) -> dict[tuple[str, int], np.ndarray]:
    """Michel et al. 2019: mean over batches of |∂L/∂ξ_h| with ξ a gate at each head's output
    (0 for heads in `masked`, else 1), L the mean NLL per target token; normalised per layer by
    the ℓ2 norm. Modules outside `sites` are not scored."""
    from heads_lab.data import bucket

    was_training = model.training
    model.eval()
    gates, model.gates = model.gates, None  # a gated model: its closed heads count as masked
    if gates is not None:
        masked = {k: sorted(set(v) | set((masked or {}).get(k, [])))
                  for k, v in {**(masked or {}), **gates.closed()}.items()}
    modules = {k: m for k, m in attention_modules(model).items()}
    xi = {}
    for key, module in modules.items():
        gate = torch.ones(gated_heads(module), device=device)
        if masked and key in masked:
            gate[masked[key]] = 0.0
        xi[key] = gate.requires_grad_(key[0] in sites)
        module.head_gate = xi[key]
    scores = {key: np.zeros(len(g)) for key, g in xi.items() if key[0] in sites}
    n = min(count or len(split), len(split))
    sub = np.arange(n)
    batches = 0
    params = [p.requires_grad for p in model.parameters()]
    for p in model.parameters():
        p.requires_grad_(False)
    try:
        for ids in bucket(split.src_lens[sub], split.tgt_lens[sub], max_tokens):
            batch = collate(split, ids).to(device)
            keep = batch.tgt_out != model.pad_id
            hidden = model.decode(batch.tgt_in, model.encode(batch.src))[keep]
            logits = model.logits(hidden)
            if logits.dtype in (torch.float16, torch.bfloat16):
                logits = logits.float()
            loss = F.cross_entropy(logits, batch.tgt_out[keep])
            grads = torch.autograd.grad(loss, [xi[k] for k in scores])
            for key, g in zip(scores, grads):
                scores[key] += g.abs().double().cpu().numpy()
            batches += 1
    finally:
        for p, flag in zip(model.parameters(), params):
            p.requires_grad_(flag)
        for module in modules.values():
            module.head_gate = None
        if masked and gates is None:
            from heads_lab.heads import mask_heads

            mask_heads(model, masked)
        model.gates = gates
        model.train(was_training)
    out = {}
    for key, s in scores.items():
        s = s / max(batches, 1)
        norm = np.linalg.norm(s)
        out[key] = s / norm if norm > 0 else s
    return out


# --- words ↔ subwords ------------------------------------------------------------------------

def piece_spans(pieces: list[str]) -> list[tuple[int, int]]:
    """Character spans of SentencePiece pieces in the text they encode (▁ = a space; the first
    piece's leading space is not in the text)."""
    spans, pos = [], 0
    for i, piece in enumerate(pieces):
        text = piece.replace("▁", " ")
        if i == 0 and text.startswith(" "):
            text = text[1:]
        start = pos + (len(text) - len(text.lstrip(" ")))
        pos += len(text)
        spans.append((start, pos))
    return spans


def word_spans(text: str, words: list[str]) -> list[tuple[int, int]] | None:
    """Character spans of `words` found left to right in `text` (None if one is missing)."""
    spans, pos = [], 0
    lowered = text.lower()
    for word in words:
        at = lowered.find(word.lower(), pos)
        if at < 0:
            return None
        spans.append((at, at + len(word)))
        pos = at + len(word)
    return spans


def words_to_subwords(word_span: list[tuple[int, int]],
                      sub_span: list[tuple[int, int]]) -> list[list[int]]:
    """For each word, the subword positions overlapping its characters."""
    return [[j for j, (s, e) in enumerate(sub_span) if s < we and e > ws and e > s]
            for ws, we in word_span]


def attach_arcs(sentences: list[Sentence], texts: list[str],
                trees: list[tuple[list[str], list[int], list[str]] | None], tokenizer
                ) -> tuple[int, dict[str, Counter]]:
    """Put each sentence's arcs (over subword positions) on it from its word-level tree (words,
    head per word (-1 root), relation per word). Returns (sentences skipped, word-offset counts
    per relation and direction, for the baselines)."""
    skipped = 0
    offsets: dict[str, Counter] = {}
    for sent, text, tree in zip(sentences, texts, trees):
        if tree is None:
            skipped += 1
            continue
        words, heads, rels = tree
        spans = word_spans(text, words)
        if spans is None:
            skipped += 1
            continue
        subs = words_to_subwords(spans, piece_spans(tokenizer.pieces(sent.src[:-1])))
        for dep, (head, rel) in enumerate(zip(heads, rels)):
            rel = UD_NAMES.get(rel.split(":")[0], rel.split(":")[0])
            if head < 0 or rel not in RELATIONS or not subs[dep] or not subs[head]:
                continue
            sent.arcs.append((subs[head], subs[dep], rel))
            offsets.setdefault(f"{rel} dep→head", Counter())[head - dep] += 1
            offsets.setdefault(f"{rel} head→dep", Counter())[dep - head] += 1
    return skipped, offsets


def read_conllu(path: Path) -> list[tuple[list[str], list[int], list[str]]]:
    """Sentences of a CoNLL-U file as (forms, 0-based heads with -1 for the root, relations);
    multiword-token lines (1-2) and empty nodes (1.1) are skipped."""
    if not path.is_file():
        raise DataError(f"no CoNLL-U file {path}; set analysis.conllu to a file with one parsed "
                        "sentence per source sentence of the split")
    out, forms, heads, rels = [], [], [], []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        line = line.strip()
        if not line:
            if forms:
                out.append((forms, heads, rels))
            forms, heads, rels = [], [], []
            continue
        if line.startswith("#"):
            continue
        cols = line.split("\t")
        if len(cols) != 10:
            raise DataError(f"{path}:{number}: a CoNLL-U line has 10 tab-separated columns, "
                            f"this one {len(cols)}")
        if "-" in cols[0] or "." in cols[0]:
            continue
        try:
            head = int(cols[6]) - 1
        except ValueError:
            raise DataError(f"{path}:{number}: HEAD {cols[6]!r} is not a number") from None
        forms.append(cols[1])
        heads.append(head)
        rels.append(cols[7])
    if forms:
        out.append((forms, heads, rels))
    return out


# --- one run's analysis ---------------------------------------------------------------------

def analyze(model, corpus, cfg, device, max_tokens: int) -> tuple[dict[str, Any],
                                                                   list[Sentence]]:
    """Every measurement on cfg.split; returns (analysis dict, the sentences' maps)."""
    split = corpus.splits[cfg.split]
    sentences = collect_maps(model, split, cfg.max_sentences, device)
    freq = Counter(int(t) for i in range(len(corpus.splits["train"]))
                   for t in corpus.splits["train"].src[i])
    texts = (split.src_text or [])[:len(sentences)]
    trees = None
    if cfg.conllu:
        parsed = read_conllu(Path(cfg.conllu))
        trees = parsed[:len(sentences)] + [None] * max(0, len(sentences) - len(parsed))
    elif corpus.annotations.get(cfg.split):
        pairs = corpus.annotations[cfg.split][:len(sentences)]
        trees = [(p.src, p.heads, p.labels) for p in pairs]
    skipped, word_offsets = (attach_arcs(sentences, texts, trees, corpus.tokenizer)
                             if trees and texts else (len(sentences), {}))
    importance = head_importance(model, split, cfg.max_sentences, max_tokens, device)
    grids: dict[str, dict[str, list]] = {name: {} for name in (
        "confidence", "importance", "positional_share", "rare_share", "syntactic_gain")}
    functions, distances, diversities, heads = {}, {}, {}, []
    for site in SITES:
        maps = [s.maps[site] for s in sentences if site in s.maps]
        if not maps:
            continue
        enc = site == "enc-self"
        conf = confidence(maps, skip_last_query=enc)
        pos_share, pos_offset = positional(maps, skip_last_query=enc)
        rare = (rare_share(maps, [s.src for s in sentences], freq, skip_last_query=enc)
                if site in ("enc-self", "dec-enc") else None)
        syn = syntactic(maps, [s.arcs for s in sentences], word_offsets) if enc else {}
        dist = js_distances(maps)
        layers, n_heads = conf.shape
        imp = np.stack([importance[(site, layer)] for layer in range(layers)])
        gain = (np.max([v["accuracy"] - v["baseline"] for v in syn.values()], axis=0)
                if syn else None)
        labels = [["other"] * n_heads for _ in range(layers)]
        for layer in range(layers):
            for head in range(n_heads):
                rels = [k for k, v in syn.items()
                        if v["accuracy"][layer, head] - v["baseline"] >= cfg.syntactic_margin]
                is_pos = site != "dec-enc" and pos_share[layer, head] >= cfg.positional_threshold
                is_rare = rare is not None and rare[layer, head] > cfg.rare_threshold
                labels[layer][head] = ("syntactic" if rels else "positional" if is_pos
                                       else "rare" if is_rare else "other")
                heads.append({
                    "site": site, "layer": layer, "head": head,
                    "function": labels[layer][head],
                    "confidence": float(conf[layer, head]),
                    "importance": float(imp[layer, head]),
                    "positional": ({"share": float(pos_share[layer, head]),
                                    "offset": int(pos_offset[layer, head]),
                                    "is_positional": bool(is_pos)} if site != "dec-enc" else None),
                    "rare": (None if rare is None else
                             {"share": float(rare[layer, head]), "is_rare": bool(is_rare)}),
                    "syntactic": {k: {"accuracy": float(v["accuracy"][layer, head]),
                                      "baseline": float(v["baseline"]),
                                      "gain": float(v["accuracy"][layer, head] - v["baseline"])}
                                  for k, v in syn.items()},
                    "syntactic_relations": rels,
                })
        grids["confidence"][site] = conf.tolist()
        grids["importance"][site] = imp.tolist()
        grids["positional_share"][site] = (pos_share.tolist() if site != "dec-enc"
                                           else [[None] * n_heads for _ in range(layers)])
        grids["rare_share"][site] = (rare.tolist() if rare is not None
                                     else [[None] * n_heads for _ in range(layers)])
        grids["syntactic_gain"][site] = (gain.tolist() if gain is not None
                                         else [[None] * n_heads for _ in range(layers)])
        functions[site] = labels
        distances[site] = dist.tolist()
        diversities[site] = diversity(dist)
    baselines = {k: {"baseline": v["baseline"], "arcs": v["arcs"]}
                 for k, v in (syntactic([s.maps["enc-self"] for s in sentences],
                                        [s.arcs for s in sentences], word_offsets)
                              if "enc-self" in sentences[0].maps else {}).items()}
    counts = Counter(h["function"] for h in heads)
    return {
        "split": cfg.split, "sentences": len(sentences),
        "syntax": {"source": "conllu" if cfg.conllu else ("gold" if trees else None),
                   "skipped_sentences": skipped, "relations": baselines},
        "thresholds": {"positional": cfg.positional_threshold, "rare": cfg.rare_threshold,
                       "syntactic_margin": cfg.syntactic_margin},
        "counts": {site: Counter(h["function"] for h in heads if h["site"] == site)
                   for site in functions} | {"all": counts},
        "heads": heads, "grids": grids, "functions": functions, "distances": distances,
        "diversity": diversities,
    }, sentences


def head_importance_flat(importance: dict[tuple[str, int], np.ndarray]) -> list[tuple[float, str,
                                                                                       int, int]]:
    """(importance, site, layer, head) for every scored head, least important first."""
    return sorted((float(v), site, layer, h) for (site, layer), vals in importance.items()
                  for h, v in enumerate(vals))
