"""One run's analysis: the sentences to read (a split of the run's corpus, or a treebank), their
maps and trees, and every measure of every head, per kind, as analysis.json holds it."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from heads_lab.analysis.head_map import mds_coordinates, within_layer
from heads_lab.analysis.importance import importance_by_kind
from heads_lab.analysis.lrp import head_relevance
from heads_lab.analysis.maps import Sentence, collect_maps
from heads_lab.analysis.metrics import (
    confidence,
    diversity,
    head_distances,
    positional,
    rare_share,
    syntactic,
)
from heads_lab.analysis.syntax import Matching, Tree, attach_arcs, read_conllu, treebank_split
from heads_lab.config.sites import SITE, SITES
from heads_lab.data import Split
from heads_lab.model.heads import attention_modules, head_kinds, map_kind, out_kind

MAP_METRICS = ("confidence", "importance", "lrp", "positional_share", "self_share",
               "rare_share", "syntactic_gain")


@dataclass
class Source:
    """What is analysed: `split` (its first sentences), their source texts, their trees (None
    where there is none), their numbers in the file or split, sentences left out before any
    map was made, and where the trees come from (treebank, conllu, gold or None)."""

    name: str
    split: Split
    texts: list[str]
    trees: list[Tree | None] | None
    indices: list[int]
    left_out: list[dict[str, Any]] = field(default_factory=list)
    syntax: str | None = None
    file: str | None = None

    @property
    def has_target(self) -> bool:
        return self.split.tgt_text is not None


def load_source(corpus, cfg, form: str, max_len: int) -> Source:
    """analysis.treebank's sentences, or the first analysis.max_sentences of analysis.split with
    the trees of analysis.conllu or of the synthetic pair's annotations."""
    if cfg.treebank:  # (config.validate refuses it beside analysis.conllu)
        trees = read_conllu(Path(cfg.treebank))
        trees = trees[:cfg.max_sentences] if cfg.max_sentences else trees
        split, kept, indices, left_out = treebank_split(trees, corpus.tokenizer, form,
                                                        cfg.treebank_ref, max_len)
        return Source(f"treebank {Path(cfg.treebank).name}", split, split.src_text, kept,
                      indices, left_out, "treebank", str(cfg.treebank))
    split = corpus.splits[cfg.split]
    n = len(split) if cfg.max_sentences is None else min(cfg.max_sentences, len(split))
    texts = list((split.src_text or [])[:n])
    trees, syntax = None, None
    if cfg.conllu:
        parsed = read_conllu(Path(cfg.conllu))[:n]
        trees, syntax = parsed + [None] * (n - len(parsed)), "conllu"
    elif corpus.annotations.get(cfg.split):
        trees = [Tree(p.src, p.heads, p.labels) for p in corpus.annotations[cfg.split][:n]]
        syntax = "gold"
    return Source(cfg.split, split, texts, trees if texts else None, list(range(n)), [],
                  syntax if texts else None, cfg.conllu)


def analyze(model, corpus, cfg, device, max_tokens: int, form: str = "NFC"
            ) -> tuple[dict[str, Any], list[Sentence]]:
    """Every measurement (heads_lab.analysis) on cfg's sentences; returns (the analysis record,
    the sentences with their maps). `form` is the corpus's Unicode normalisation."""
    source = load_source(corpus, cfg, form, model.cfg.max_positions - 1)
    sentences = collect_maps(model, source.split, len(source.indices), device,
                             decoder=source.has_target)
    matching = (attach_arcs(sentences, source.texts, source.trees, corpus.tokenizer,
                            source.indices) if source.trees else None)
    # importance needs a loss, so a target: a treebank without translations has none
    importance = (importance_by_kind(model, source.split, len(source.indices), max_tokens, device)
                  if source.has_target else {})
    # LRP (Voita) too: its seeds are the decoder's predictions, one backward pass per sentence
    lrp_n = len(source.indices) if cfg.lrp_sentences is None else min(cfg.lrp_sentences,
                                                                       len(source.indices))
    relevance = (head_relevance(model, source.split, lrp_n, device)
                 if source.has_target and cfg.lrp else {})
    train = corpus.splits["train"]
    freq = Counter(int(t) for i in range(len(train)) for t in train.src[i])
    modules = attention_modules(model)
    word_offsets = matching.offsets if matching else {}
    grids: dict[str, dict[str, list]] = {name: {} for name in MAP_METRICS}
    grid_kinds: dict[str, dict[str, str]] = {name: {} for name in MAP_METRICS}
    kinds, functions, distances, diversities, heads = {}, {}, {}, {}, []
    rare_counted: dict[str, int | None] = {}
    lrp_vs_importance: dict[str, float] = {}
    coords, spread = {}, {}
    syntax_tables = {}
    for site in SITES:
        maps = [s.maps[site] for s in sentences if site in s.maps]
        if not maps:
            continue
        first = modules[(site, 0)]
        kind, kinds[site] = map_kind(first), head_kinds(first)
        m = _measure(site, maps, sentences, freq, word_offsets, cfg.rare_top_k, cfg.min_arcs)
        rare_counted[site] = m["rare_sentences"]
        if site == "enc-self":
            syntax_tables = m["syntactic"]
        layers, n_heads = m["confidence"].shape
        m["importance"] = (np.stack([importance[(site, layer, kind)] for layer in range(layers)])
                           if importance else np.full((layers, n_heads), np.nan))
        out = out_kind(first)  # LRP is taken where the heads enter the output projection
        lrp = (np.stack([relevance[(site, layer)] for layer in range(layers)])
               if relevance else None)
        m["lrp"] = (lrp if out == kind and lrp is not None
                    else np.full((layers, n_heads), np.nan) if out == kind else None)
        if lrp is not None and importance:
            imp = np.stack([importance[(site, layer, out)] for layer in range(layers)])
            lrp_vs_importance[site] = _spearman(lrp.ravel(), imp.ravel())
        functions[site], entries = _site_heads(site, kind, m, cfg)
        heads += entries
        empty = [[None] * n_heads for _ in range(layers)]
        for metric in MAP_METRICS:
            grids[metric][site] = empty if m[metric] is None else _rows(m[metric])
            grid_kinds[metric][site] = kind
        if importance:
            heads += _other_kinds(site, kind, out, kinds[site], importance, lrp, layers, grids,
                                  grid_kinds)
        distances[site] = m["distances"].tolist()
        diversities[site] = diversity(m["distances"], layers)
        coords[site] = mds_coordinates(m["distances"]).tolist()
        spread[site] = within_layer(m["distances"], layers)
    mapped = [h for h in heads if "function" in h]
    return {
        "source": source.name, "split": None if source.syntax == "treebank" else source.name,
        "sentences": len(sentences), "head_kinds": kinds,
        "map_kind": {site: map_kind(modules[(site, 0)]) for site in kinds},
        "syntax": _syntax_summary(source, matching, syntax_tables, mapped, cfg),
        "thresholds": {"positional": cfg.positional_threshold, "rare": cfg.rare_threshold,
                       "rare_top_k": cfg.rare_top_k, "syntactic_margin": cfg.syntactic_margin,
                       "min_arcs": cfg.min_arcs},
        "rare_sentences": {site: n for site, n in rare_counted.items() if n is not None},
        "counts": {site: Counter(h["function"] for h in mapped if h["site"] == site)
                   for site in functions} | {"all": Counter(h["function"] for h in mapped)},
        "heads": heads, "grids": grids, "grid_kinds": grid_kinds, "functions": functions,
        "distances": distances, "diversity": diversities, "head_map": coords,
        "within_layer": spread, "lrp_vs_importance": lrp_vs_importance,
        "lrp_sentences": lrp_n if relevance else 0,
    }, sentences


def _other_kinds(site: str, kind: str, out: str, site_kinds, importance, lrp, layers: int,
                 grids: dict, grid_kinds: dict) -> list[dict[str, Any]]:
    """Talking heads: the importance of the query/key and value heads (and the LRP relevance of
    the kind that enters the output projection, when it is not the maps' kind) into `grids`,
    under importance_<kind> / lrp_<kind>; returns their entries in the heads list."""
    heads = []
    for other in site_kinds:
        if other == kind:
            continue
        scores = np.stack([importance[(site, layer, other)] for layer in range(layers)])
        grids.setdefault(f"importance_{other}", {})[site] = _rows(scores)
        grid_kinds.setdefault(f"importance_{other}", {})[site] = other
        if other == out and lrp is not None:
            grids.setdefault(f"lrp_{other}", {})[site] = _rows(lrp)
            grid_kinds.setdefault(f"lrp_{other}", {})[site] = other
        heads += [{"site": site, "layer": layer, "kind": other, "head": h,
                   "importance": float(scores[layer, h]),
                   **({"lrp": float(lrp[layer, h])} if other == out and lrp is not None else {})}
                  for layer in range(layers) for h in range(scores.shape[1])]
    return heads


def _measure(site: str, maps, sentences, freq, word_offsets, rare_top_k, min_arcs
             ) -> dict[str, Any]:
    """Every map measure of one site's heads, [layers, heads] arrays (None where the measure
    does not apply: positional needs self-attention, rare-word source keys, syntax enc-self).
    The encoder's EOS query and every source-side EOS key are left out (heads_lab.analysis).
    The syntactic gain is the best over the relations that can label a head (≥ min_arcs)."""
    enc, src_keys = site == "enc-self", SITE[site].key == "src"
    pos = positional(maps, skip_last_query=enc, eos_key=src_keys)
    syn = (syntactic(maps, [s.units for s in sentences], [s.arcs for s in sentences],
                     word_offsets) if enc else {})
    rare, rare_n = (rare_share(maps, [s.src for s in sentences], freq, skip_last_query=enc,
                               top_k=rare_top_k) if src_keys else (None, None))
    self_attention = SITE[site].self_attention
    counted = [v for v in syn.values() if v["arcs"] >= min_arcs]
    return {
        "confidence": confidence(maps, skip_last_query=enc, eos_key=src_keys),
        "positional_share": pos["share"] if self_attention else None,
        "self_share": pos["self"] if self_attention else None,
        "positional": pos,
        "rare_share": rare, "rare_sentences": rare_n,
        "syntactic": syn,
        "syntactic_gain": (np.max([v["accuracy"] - v["baseline"] for v in counted], axis=0)
                           if counted else None),
        "distances": head_distances(maps),
    }


def _site_heads(site: str, kind: str, m: dict[str, Any], cfg) -> tuple[list[list[str]], list]:
    """Each head's role (syntactic, positional, rare or other, in that precedence) and its
    analysis.json entry. Positional needs an offset ≠ 0: attending to oneself is not a role."""
    syn, share, rare, pos = m["syntactic"], m["positional_share"], m["rare_share"], m["positional"]
    counted = {k: v for k, v in syn.items() if v["arcs"] >= cfg.min_arcs}
    layers, n_heads = m["confidence"].shape
    labels, entries = [["other"] * n_heads for _ in range(layers)], []
    for layer in range(layers):
        for head in range(n_heads):
            rels = [k for k, v in counted.items()
                    if v["accuracy"][layer, head] - v["baseline"] >= cfg.syntactic_margin]
            offset = int(pos["offset"][layer, head])
            is_pos = (share is not None and offset != 0
                      and share[layer, head] >= cfg.positional_threshold)
            is_rare = rare is not None and rare[layer, head] > cfg.rare_threshold
            labels[layer][head] = ("syntactic" if rels else "positional" if is_pos
                                   else "rare" if is_rare else "other")
            entries.append({
                "site": site, "layer": layer, "kind": kind, "head": head,
                "function": labels[layer][head],
                "confidence": float(m["confidence"][layer, head]),
                "importance": _number(m["importance"][layer, head]),
                **({"lrp": _number(m["lrp"][layer, head])} if m["lrp"] is not None else {}),
                "positional": (None if share is None else
                               {"share": float(share[layer, head]), "offset": offset,
                                "self_share": float(pos["self"][layer, head]),
                                "prev_share": float(pos["prev"][layer, head]),
                                "next_share": float(pos["next"][layer, head]),
                                "is_positional": bool(is_pos)}),
                "rare": (None if rare is None else
                         {"share": float(rare[layer, head]), "is_rare": bool(is_rare)}),
                "syntactic": {k: {"accuracy": float(v["accuracy"][layer, head]),
                                  "baseline": float(v["baseline"]),
                                  "gain": float(v["accuracy"][layer, head] - v["baseline"])}
                              for k, v in syn.items()},
                "syntactic_relations": rels,
            })
    return labels, entries


def _syntax_summary(source: Source, matching: Matching | None, tables: dict, heads: list[dict],
                    cfg) -> dict[str, Any]:
    """Where the trees came from, which sentences matched, and per relation and direction: arcs,
    baseline, the best encoder head and how many heads beat the baseline by the margin."""
    analysed = len(source.indices)
    unmatched = source.left_out + (matching.unmatched if matching else [])
    if source.trees is None:
        return {"source": None, "sentences": analysed, "matched": 0, "skipped_sentences": analysed,
                "unmatched": [], "relations": {}}
    relations = {}
    enc = [h for h in heads if h["site"] == "enc-self"]
    for key, v in tables.items():
        best = max(enc, key=lambda h: h["syntactic"][key]["accuracy"])
        relations[key] = {
            "arcs": v["arcs"], "baseline": v["baseline"],
            "best": {"layer": best["layer"], "head": best["head"], "kind": best["kind"],
                     **best["syntactic"][key]},
            "heads_above_margin": (sum(h["syntactic"][key]["gain"] >= cfg.syntactic_margin
                                       for h in enc) if v["arcs"] >= cfg.min_arcs else 0)}
    total = analysed + len(source.left_out)
    return {"source": source.syntax, "file": source.file, "sentences": total,
            "matched": total - len(unmatched), "matched_share": (total - len(unmatched)) / total,
            "skipped_sentences": len(unmatched), "unmatched": unmatched,
            "arcs_within_a_token": matching.shared_arcs if matching else 0,
            "relations": relations}


def _spearman(a: np.ndarray, b: np.ndarray) -> float | None:
    """Spearman's rank correlation of two head scores (None when undefined)."""
    from scipy.stats import spearmanr  # lazy: start-up time (scipy, for this one number)

    if len(a) < 3 or np.ptp(a) == 0 or np.ptp(b) == 0:
        return None
    return float(spearmanr(a, b).statistic)


def _rows(values: np.ndarray) -> list[list[float | None]]:
    return [[_number(v) for v in row] for row in values]


def _number(v) -> float | None:
    return None if v is None or not np.isfinite(v) else float(v)
