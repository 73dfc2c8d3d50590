"""One model's analysis: the sentences to read (a split of a run's corpus, or a treebank), their
maps and trees, and every measure of every head, per kind, as analysis.json holds it (the maps
and gradients come from the model's Subject: heads_lab/analysis/subject.py)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from heads_lab.analysis.head_map import mds_coordinates, within_layer
from heads_lab.analysis.maps import Sentence
from heads_lab.analysis.measures import (
    GRADIENT_MEASURES,
    MAP_MEASURES,
    MEASURES,
    GradientMeasure,
    Scores,
    SiteMaps,
)
from heads_lab.analysis.metrics import (
    diversity,
    head_distances,
)
from heads_lab.analysis.syntax import Matching, Tree, attach_arcs, read_conllu, treebank_split
from heads_lab.config.sites import ALL_SITES, SITE
from heads_lab.data import Split
from heads_lab.model.heads import head_kinds, map_kind, out_kind


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


def measure(sentences: list[Sentence], source: Source, modules: dict, gradient: dict[str, Scores],
            freq: Counter, tokenizer, cfg, probe: dict[str, tuple] | None = None
            ) -> dict[str, Any]:
    """The analysis record of sentences whose maps are made: every map measure, the gradient
    measures already run (`gradient`: name → scores; a measure not run is NaN), roles, distances
    and the head map. `modules` gives each (site, layer)'s kinds of heads (heads_lab.model.heads:
    kinds(), variant, out_heads), `freq` the source-token frequencies for rare words, `tokenizer`
    the subword spans that match trees' words (encode_spans, pieces). Any model whose heads can
    be described so is measured alike: heads-lab's own, or a pretrained one (heads_lab.hf).
    `probe`: per language-model site, the maps of repeated random tokens and the sequences
    (analysis/roles.py)."""
    matching = (attach_arcs(sentences, source.texts, source.trees, tokenizer, source.indices)
                if source.trees else None)
    n = len(source.indices)
    word_offsets = matching.offsets if matching else {}
    grids: dict[str, dict[str, list]] = {m.name: {} for m in MEASURES}
    grid_kinds: dict[str, dict[str, str]] = {m.name: {} for m in MEASURES}
    kinds, functions, distances, diversities, heads = {}, {}, {}, {}, []
    rare_counted: dict[str, int | None] = {}
    lrp_vs_importance: dict[str, float] = {}
    coords, spread = {}, {}
    syntax_tables, syntax_site = {}, None
    not_applicable: dict[str, dict[str, str]] = {}
    sinks = {}
    for site in ALL_SITES:
        maps = [s.maps[site] for s in sentences if site in s.maps]
        if not maps:
            continue
        first = modules[(site, 0)]
        kind, kinds[site] = map_kind(first), head_kinds(first)
        s = SiteMaps(site, maps, sentences, freq, word_offsets, cfg, (probe or {}).get(site))
        layers, n_heads = maps[0].shape[:2]
        m = {x.name: x.compute(s) for x in MAP_MEASURES}
        m |= {g.name: _at_kind(g, gradient, site, kind, first, layers, n_heads)
              for g in GRADIENT_MEASURES}
        for x in MAP_MEASURES:
            if m[x.name] is None:
                not_applicable.setdefault(x.name, {})[site] = x.why_not(s)
        rare_counted[site] = s.rare[1]
        if s.over_text:
            syntax_tables, syntax_site = s.syntactic, site
        if s.sink is not None:
            sinks[site] = s.sink
        if "lrp" in gradient and "importance" in gradient:  # Voita's LRP vs Michel's importance
            out = out_kind(first)  # LRP is taken where the heads enter the output projection
            lrp, imp = (np.stack([gradient[name][(site, layer, out)] for layer in range(layers)])
                        for name in ("lrp", "importance"))
            lrp_vs_importance[site] = _spearman(lrp.ravel(), imp.ravel())
        functions[site], entries = _site_heads(site, kind, m, s, cfg, sinks.get(site), tokenizer)
        heads += entries
        empty = [[None] * n_heads for _ in range(layers)]
        for measure in MEASURES:
            grids[measure.name][site] = (empty if m[measure.name] is None
                                         else _rows(m[measure.name]))
            grid_kinds[measure.name][site] = kind
        heads += _other_kinds(site, kind, first, gradient, layers, grids, grid_kinds)
        site_distances = head_distances(maps)
        distances[site] = site_distances.tolist()
        diversities[site] = diversity(site_distances, layers)
        coords[site] = mds_coordinates(site_distances).tolist()
        spread[site] = within_layer(site_distances, layers)
    mapped = [h for h in heads if "function" in h]
    lrp = next(g for g in GRADIENT_MEASURES if g.name == "lrp")
    return {
        "source": source.name, "split": None if source.syntax == "treebank" else source.name,
        "sentences": len(sentences), "head_kinds": kinds,
        "map_kind": {site: map_kind(modules[(site, 0)]) for site in kinds},
        "syntax": _syntax_summary(source, matching, syntax_tables, mapped, cfg, syntax_site),
        "not_applicable": not_applicable,
        "thresholds": {"positional": cfg.positional_threshold, "rare": cfg.rare_threshold,
                       "rare_top_k": cfg.rare_top_k, "syntactic_margin": cfg.syntactic_margin,
                       "min_arcs": cfg.min_arcs},
        "rare_sentences": {site: n for site, n in rare_counted.items() if n is not None},
        "counts": {site: Counter(h["function"] for h in mapped if h["site"] == site)
                   for site in functions} | {"all": Counter(h["function"] for h in mapped)},
        "heads": heads, "grids": grids, "grid_kinds": grid_kinds, "functions": functions,
        "distances": distances, "diversity": diversities, "head_map": coords,
        "within_layer": spread, "lrp_vs_importance": lrp_vs_importance,
        "lrp_sentences": lrp.sentences(cfg, n) if "lrp" in gradient else 0,
    }


def _at_kind(measure: GradientMeasure, gradient: dict[str, Scores], site: str, kind: str,
             first, layers: int, n_heads: int) -> np.ndarray | None:
    """A gradient measure's [layers, heads] at the maps' kind: NaN where it did not run (no
    target, or switched off), None where it does not score that kind (talking heads' LRP: the
    value heads)."""
    if kind not in measure.kinds(first):
        return None
    if measure.name not in gradient:
        return np.full((layers, n_heads), np.nan)
    return np.stack([gradient[measure.name][(site, layer, kind)] for layer in range(layers)])


def _other_kinds(site: str, kind: str, first, gradient: dict[str, Scores], layers: int,
                 grids: dict, grid_kinds: dict) -> list[dict[str, Any]]:
    """Talking heads: the gradient measures of the kinds other than the maps' (importance of the
    query/key and value heads, LRP of the value heads) into `grids` as <measure>_<kind>; returns
    their entries in the heads list."""
    heads = []
    for other in head_kinds(first):
        if other == kind:
            continue
        scores = {g.name: np.stack([gradient[g.name][(site, layer, other)]
                                    for layer in range(layers)])
                  for g in GRADIENT_MEASURES if g.name in gradient and other in g.kinds(first)}
        for name, values in scores.items():
            grids.setdefault(f"{name}_{other}", {})[site] = _rows(values)
            grid_kinds.setdefault(f"{name}_{other}", {})[site] = other
        if scores:
            count = next(iter(scores.values())).shape[1]
            heads += [{"site": site, "layer": layer, "kind": other, "head": h,
                       **{name: float(values[layer, h]) for name, values in scores.items()}}
                      for layer in range(layers) for h in range(count)]
    return heads


def reaches(gain: float, margin: float) -> bool:
    """A syntactic gain at or above the margin. Accuracy and baseline are shares of arcs (k / n)
    and their difference is rounded, so 12/20 − 10/20 is 0.09999999999999998: a gain within
    1e-9 of the margin reaches it."""
    return bool(gain >= margin - 1e-9)


def _site_heads(site: str, kind: str, m: dict[str, Any], s: SiteMaps, cfg,
                sink: dict[str, np.ndarray] | None = None, tokenizer=None
                ) -> tuple[list[list[str]], list]:
    """Each head's role (syntactic, positional, rare or other, in that precedence) and its
    analysis.json entry. Positional needs an offset ≠ 0: attending to oneself is not a role."""
    syn, share, rare, pos = s.syntactic, m["positional_share"], m["rare_share"], s.positional
    counted = {k: v for k, v in syn.items() if v["arcs"] >= cfg.min_arcs}
    layers, n_heads = pos["offset"].shape
    labels, entries = [["other"] * n_heads for _ in range(layers)], []
    for layer in range(layers):
        for head in range(n_heads):
            rels = [k for k, v in counted.items()
                    if reaches(v["accuracy"][layer, head] - v["baseline"], cfg.syntactic_margin)]
            offset = int(pos["offset"][layer, head])
            is_pos = (share is not None and offset != 0
                      and share[layer, head] >= cfg.positional_threshold)
            is_rare = rare is not None and rare[layer, head] > cfg.rare_threshold
            labels[layer][head] = ("syntactic" if rels else "positional" if is_pos
                                   else "rare" if is_rare else "other")
            entries.append({
                "site": site, "layer": layer, "kind": kind, "head": head,
                "function": labels[layer][head],
                **{x.name: float(m[x.name][layer, head]) for x in MAP_MEASURES
                   if x.entry and m[x.name] is not None},
                **({"sink_max": _sink_max(sink, layer, head, tokenizer)} if sink else {}),
                **{g.name: _number(m[g.name][layer, head]) for g in GRADIENT_MEASURES
                   if m[g.name] is not None},
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


def _sink_max(sink: dict[str, np.ndarray], layer: int, head: int, tokenizer) -> dict[str, Any]:
    """A head's largest attention-sink score past the first position (analysis/roles.py): α_k,
    its position k and the token most often there."""
    token = int(sink["tokens"][layer, head])
    piece = tokenizer.pieces([token])[0] if tokenizer is not None and token >= 0 else None
    return {"alpha": _number(sink["max_alpha"][layer, head]),
            "position": int(sink["max_position"][layer, head]), "token": piece}


def _syntax_summary(source: Source, matching: Matching | None, tables: dict, heads: list[dict],
                    cfg, site: str | None = "enc-self") -> dict[str, Any]:
    """Where the trees came from, which sentences matched, and per relation and direction: arcs,
    baseline, the best head of `site` (the self-attention over the analysed text: an encoder's
    enc-self, a language model's lm-self) and how many heads beat the baseline by the margin;
    a causal site counts only the arcs to earlier words (heads_lab.analysis.metrics.syntactic)."""
    analysed = len(source.indices)
    unmatched = source.left_out + (matching.unmatched if matching else [])
    if source.trees is None:
        return {"source": None, "sentences": analysed, "matched": 0, "skipped_sentences": analysed,
                "unmatched": [], "relations": {}}
    relations = {}
    enc = [h for h in heads if h["site"] == site]
    for key, v in tables.items():
        best = max(enc, key=lambda h: h["syntactic"][key]["accuracy"])
        relations[key] = {
            "arcs": v["arcs"], "baseline": v["baseline"],
            "best": {"layer": best["layer"], "head": best["head"], "kind": best["kind"],
                     **best["syntactic"][key]},
            "heads_above_margin": (sum(reaches(h["syntactic"][key]["gain"], cfg.syntactic_margin)
                                       for h in enc) if v["arcs"] >= cfg.min_arcs else 0)}
    total = analysed + len(source.left_out)
    causal = site is not None and SITE[site].causal
    return {"source": source.syntax, "file": source.file, "site": site,
            "arcs_counted": ("to earlier words only: a causal head cannot see later ones"
                             if causal else "all"), "sentences": total,
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
