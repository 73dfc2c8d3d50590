"""The measures of `heads-lab analyze`, declared once, in the order analysis.json, the metric-grid
figures and the tables show them.

- A map measure reads one site's attention maps (`SiteMaps`) and gives a [layers, heads] array,
  or None where it does not apply (positional needs self-attention, rare words source keys,
  syntax the encoder's self-attention).
- A gradient measure runs backward passes through the model and gives, per (site, layer, kind),
  a [heads] array for the kinds of heads it scores (`kinds`); its grid is the maps' kind's
  (talking heads: the softmax heads), `<name>_<kind>` for another kind.

analysis/record.py runs every measure of `MEASURES` and puts each in analysis.json's grids, in
each head's entry (a map measure with `entry=True`, every gradient measure), in the metric-grid
figures and in the tables. A new measure is its function (analysis/metrics.py, or a module of its
own for a gradient measure), its entry here, and its setting in config/schemas.py's
AnalysisConfig where it has one: three files.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

from heads_lab.analysis.importance import importance_by_kind
from heads_lab.analysis.lrp import head_relevance
from heads_lab.analysis.metrics import confidence, positional, rare_share, syntactic
from heads_lab.config.sites import SITE
from heads_lab.model.heads import attention_modules, head_kinds, out_kind

Scores = dict[tuple[str, int, str], np.ndarray]  # (site, layer, kind) → [heads]


@dataclass
class SiteMaps:
    """One site's maps ([layers, heads, query, key] per sentence) and what several measures
    share, computed once. The encoder's EOS query and every source-side EOS key are left out
    (heads_lab.analysis)."""

    site: str
    maps: list
    sentences: list
    freq: Counter  # source-token frequencies in the training data (rare words)
    word_offsets: dict
    cfg: Any  # AnalysisConfig

    @property
    def enc(self) -> bool:
        return self.site == "enc-self"

    @property
    def src_keys(self) -> bool:
        return SITE[self.site].key == "src"

    @property
    def self_attention(self) -> bool:
        return SITE[self.site].self_attention

    @cached_property
    def positional(self) -> dict[str, np.ndarray]:
        return positional(self.maps, skip_last_query=self.enc, eos_key=self.src_keys)

    @cached_property
    def syntactic(self) -> dict[str, dict]:
        if not self.enc:
            return {}
        return syntactic(self.maps, [s.units for s in self.sentences],
                         [s.arcs for s in self.sentences], self.word_offsets)

    @cached_property
    def rare(self) -> tuple[np.ndarray | None, int | None]:
        """The rare-word share and how many sentences had a rare word (None: target keys)."""
        if not self.src_keys:
            return None, None
        return rare_share(self.maps, [s.src for s in self.sentences], self.freq,
                          skip_last_query=self.enc, top_k=self.cfg.rare_top_k)


@dataclass(frozen=True)
class MapMeasure:
    name: str
    compute: Callable[[SiteMaps], np.ndarray | None]
    entry: bool = False  # also a number in each head's analysis.json entry, under its name


@dataclass(frozen=True)
class GradientMeasure:
    name: str
    kinds: Callable[[Any], list[str]]  # of an attention module: the kinds of heads it scores
    sentences: Callable[[Any, int], int]  # (cfg, sentences analysed) → how many it reads
    wanted: Callable[[Any, bool], bool]  # (cfg, the source has a target) → run it
    compute: Callable[..., Scores]  # (model, split, sentences, device, max_tokens)


def _syntactic_gain(s: SiteMaps) -> np.ndarray | None:
    """The best gain over the word baseline among the relations that can label a head
    (≥ analysis.min_arcs arcs)."""
    counted = [v for v in s.syntactic.values() if v["arcs"] >= s.cfg.min_arcs]
    return np.max([v["accuracy"] - v["baseline"] for v in counted], axis=0) if counted else None


def _relevance(model, split, count: int, device, max_tokens: int) -> Scores:
    """LRP relevance at the heads the output projection reads (their out kind)."""
    modules = attention_modules(model)
    return {(site, layer, out_kind(modules[(site, layer)])): scores
            for (site, layer), scores in head_relevance(model, split, count, device).items()}


MEASURES: tuple[MapMeasure | GradientMeasure, ...] = (
    MapMeasure("confidence", lambda s: confidence(s.maps, skip_last_query=s.enc,
                                                  eos_key=s.src_keys), entry=True),
    # importance (Michel) needs a loss, so a target: a treebank without translations has none
    GradientMeasure("importance", kinds=lambda module: list(head_kinds(module)),
                    sentences=lambda cfg, n: n, wanted=lambda cfg, has_target: has_target,
                    compute=lambda model, split, n, device, max_tokens: importance_by_kind(
                        model, split, n, max_tokens, device)),
    # LRP (Voita) too: its seeds are the decoder's predictions, one backward pass per sentence
    GradientMeasure("lrp", kinds=lambda module: [out_kind(module)],
                    sentences=lambda cfg, n: n if cfg.lrp_sentences is None
                    else min(cfg.lrp_sentences, n),
                    wanted=lambda cfg, has_target: has_target and cfg.lrp, compute=_relevance),
    MapMeasure("positional_share", lambda s: s.positional["share"] if s.self_attention else None),
    MapMeasure("self_share", lambda s: s.positional["self"] if s.self_attention else None),
    MapMeasure("rare_share", lambda s: s.rare[0]),
    MapMeasure("syntactic_gain", _syntactic_gain),
)
MAP_MEASURES = tuple(m for m in MEASURES if isinstance(m, MapMeasure))
GRADIENT_MEASURES = tuple(m for m in MEASURES if isinstance(m, GradientMeasure))
