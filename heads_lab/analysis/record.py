"""One run's analysis: the sentences to read (a split of the run's corpus, or a treebank), their
maps and trees, and every measure of every head, per kind, as analysis.json holds it."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from heads_lab.analysis.importance import importance_by_kind
from heads_lab.analysis.maps import Sentence, collect_maps
from heads_lab.analysis.metrics import (
    confidence,
    diversity,
    js_distances,
    positional,
    rare_share,
    syntactic,
)
from heads_lab.analysis.syntax import Matching, Tree, attach_arcs, read_conllu, treebank_split
from heads_lab.data import Split
from heads_lab.heads import attention_modules, head_kinds, map_kind
from heads_lab.sites import SITE, SITES

MAP_METRICS = ("confidence", "importance", "positional_share", "rare_share", "syntactic_gain")


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
    train = corpus.splits["train"]
    freq = Counter(int(t) for i in range(len(train)) for t in train.src[i])
    modules = attention_modules(model)
    word_offsets = matching.offsets if matching else {}
    grids: dict[str, dict[str, list]] = {name: {} for name in MAP_METRICS}
    grid_kinds: dict[str, dict[str, str]] = {name: {} for name in MAP_METRICS}
    kinds, functions, distances, diversities, heads = {}, {}, {}, {}, []
    syntax_tables = {}
    for site in SITES:
        maps = [s.maps[site] for s in sentences if site in s.maps]
        if not maps:
            continue
        first = modules[(site, 0)]
        kind, kinds[site] = map_kind(first), head_kinds(first)
        m = _measure(site, maps, sentences, freq, word_offsets)
        if site == "enc-self":
            syntax_tables = m["syntactic"]
        layers, n_heads = m["confidence"].shape
        m["importance"] = (np.stack([importance[(site, layer, kind)] for layer in range(layers)])
                           if importance else np.full((layers, n_heads), np.nan))
        functions[site], entries = _site_heads(site, kind, m, cfg)
        heads += entries
        empty = [[None] * n_heads for _ in range(layers)]
        for metric in MAP_METRICS:
            grids[metric][site] = empty if m[metric] is None else _rows(m[metric])
            grid_kinds[metric][site] = kind
        for other in kinds[site]:  # talking heads: importance of the query/key and value heads
            if other == kind or not importance:
                continue
            scores = np.stack([importance[(site, layer, other)] for layer in range(layers)])
            grids.setdefault(f"importance_{other}", {})[site] = _rows(scores)
            grid_kinds.setdefault(f"importance_{other}", {})[site] = other
            heads += [{"site": site, "layer": layer, "kind": other, "head": h,
                       "importance": float(scores[layer, h])}
                      for layer in range(layers) for h in range(scores.shape[1])]
        distances[site] = m["distances"].tolist()
        diversities[site] = diversity(m["distances"])
    mapped = [h for h in heads if "function" in h]
    return {
        "source": source.name, "split": None if source.syntax == "treebank" else source.name,
        "sentences": len(sentences), "head_kinds": kinds,
        "map_kind": {site: map_kind(modules[(site, 0)]) for site in kinds},
        "syntax": _syntax_summary(source, matching, syntax_tables, mapped, cfg),
        "thresholds": {"positional": cfg.positional_threshold, "rare": cfg.rare_threshold,
                       "syntactic_margin": cfg.syntactic_margin, "min_arcs": cfg.min_arcs},
        "counts": {site: Counter(h["function"] for h in mapped if h["site"] == site)
                   for site in functions} | {"all": Counter(h["function"] for h in mapped)},
        "heads": heads, "grids": grids, "grid_kinds": grid_kinds, "functions": functions,
        "distances": distances, "diversity": diversities,
    }, sentences


def _measure(site: str, maps, sentences, freq, word_offsets) -> dict[str, Any]:
    """Every map measure of one site's heads, [layers, heads] arrays (None where the measure
    does not apply: positional needs self-attention, rare-word source keys, syntax enc-self)."""
    enc = site == "enc-self"
    share, offset = positional(maps, skip_last_query=enc)
    syn = syntactic(maps, [s.arcs for s in sentences], word_offsets) if enc else {}
    return {
        "confidence": confidence(maps, skip_last_query=enc),
        "positional_share": share if SITE[site].self_attention else None,
        "positional_offset": offset,
        "rare_share": (rare_share(maps, [s.src for s in sentences], freq, skip_last_query=enc)
                       if SITE[site].key == "src" else None),
        "syntactic": syn,
        "syntactic_gain": (np.max([v["accuracy"] - v["baseline"] for v in syn.values()], axis=0)
                           if syn else None),
        "distances": js_distances(maps),
    }


def _site_heads(site: str, kind: str, m: dict[str, Any], cfg) -> tuple[list[list[str]], list]:
    """Each head's role (syntactic, positional, rare or other, in that precedence) and its
    analysis.json entry."""
    syn, share, rare = m["syntactic"], m["positional_share"], m["rare_share"]
    counted = {k: v for k, v in syn.items() if v["arcs"] >= cfg.min_arcs}
    layers, n_heads = m["confidence"].shape
    labels, entries = [["other"] * n_heads for _ in range(layers)], []
    for layer in range(layers):
        for head in range(n_heads):
            rels = [k for k, v in counted.items()
                    if v["accuracy"][layer, head] - v["baseline"] >= cfg.syntactic_margin]
            is_pos = share is not None and share[layer, head] >= cfg.positional_threshold
            is_rare = rare is not None and rare[layer, head] > cfg.rare_threshold
            labels[layer][head] = ("syntactic" if rels else "positional" if is_pos
                                   else "rare" if is_rare else "other")
            entries.append({
                "site": site, "layer": layer, "kind": kind, "head": head,
                "function": labels[layer][head],
                "confidence": float(m["confidence"][layer, head]),
                "importance": _number(m["importance"][layer, head]),
                "positional": (None if share is None else
                               {"share": float(share[layer, head]),
                                "offset": int(m["positional_offset"][layer, head]),
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


def _rows(values: np.ndarray) -> list[list[float | None]]:
    return [[_number(v) for v in row] for row in values]


def _number(v) -> float | None:
    return None if v is None or not np.isfinite(v) else float(v)
