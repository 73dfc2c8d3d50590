"""The measures of `heads-lab analyze`, declared once, in the order analysis.json, the metric-grid
figures and the tables show them.

- A map measure reads one site's attention maps (`SiteMaps`) and gives a [layers, heads] array,
  or None where it does not apply (positional needs self-attention, rare words source keys,
  syntax a self-attention over the analysed text, a language model's roles and sink its causal
  self-attention), and says why (`why_not`: analysis.json's `not_applicable`).
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
from heads_lab.analysis.roles import role_scores, sink_scores
from heads_lab.config.sites import SITE
from heads_lab.model.heads import attention_modules, head_kinds, out_kind

Scores = dict[tuple[str, int, str], np.ndarray]  # (site, layer, kind) → [heads]


@dataclass
class SiteMaps:
    """One site's maps ([layers, heads, query, key] per sentence) and what several measures
    share, computed once. The site's special token is left out of the argmax measures (the
    encoder's EOS query and every source-side EOS key; a language model's BOS query and key:
    heads_lab.config.sites). `probe`: the site's maps of repeated random tokens and the
    sequences (analysis/roles.py), where the site is a language model's."""

    site: str
    maps: list
    sentences: list
    freq: Counter  # source-token frequencies in the training data (rare words)
    word_offsets: dict
    cfg: Any  # AnalysisConfig
    probe: tuple[list, list[list[int]]] | None = None

    @property
    def enc(self) -> bool:
        return self.site == "enc-self"

    @property
    def eos_query(self) -> bool:
        """Its queries end with the source's EOS (the encoder's self-attention)."""
        return SITE[self.site].special == "eos" and SITE[self.site].query == "src"

    @property
    def src_keys(self) -> bool:
        """Its keys are the source's tokens, ending with EOS (enc-self, dec-enc)."""
        return SITE[self.site].special == "eos" and SITE[self.site].text_keys

    @property
    def bos(self) -> bool:
        return SITE[self.site].special == "bos"

    @property
    def self_attention(self) -> bool:
        return SITE[self.site].self_attention

    @property
    def over_text(self) -> bool:
        """Queries and keys are both the analysed text's tokens (enc-self, lm-self): where
        dependency arcs between its words can be read."""
        return self.self_attention and SITE[self.site].text_keys

    @property
    def language_model(self) -> bool:
        """A causal self-attention over text the model reads alone (lm-self): where the LM head
        roles apply."""
        return self.over_text and SITE[self.site].causal

    @cached_property
    def positional(self) -> dict[str, np.ndarray]:
        return positional(self.maps, skip_last_query=self.eos_query, eos_key=self.src_keys,
                          bos=self.bos)

    @cached_property
    def syntactic(self) -> dict[str, dict]:
        if not self.over_text:
            return {}
        return syntactic(self.maps, [s.units for s in self.sentences],
                         [s.arcs for s in self.sentences], self.word_offsets,
                         causal=SITE[self.site].causal)

    @cached_property
    def rare(self) -> tuple[np.ndarray | None, int | None]:
        """The rare-word share and how many sentences had a rare word (None: target keys)."""
        if not SITE[self.site].text_keys:
            return None, None
        return rare_share(self.maps, [s.src for s in self.sentences], self.freq,
                          skip_last_query=self.eos_query, top_k=self.cfg.rare_top_k,
                          bos=self.bos, causal=SITE[self.site].causal)

    @cached_property
    def roles(self) -> dict[str, np.ndarray] | None:
        """Previous-token, duplicate-token and induction scores on the probe's repeats."""
        if not self.language_model or self.probe is None:
            return None
        maps, sequences = self.probe
        return role_scores(maps, sequences, self.cfg.role_length)

    @cached_property
    def sink(self) -> dict[str, np.ndarray] | None:
        """Gu et al.'s α per head on the analysed text (its BOS at position 0)."""
        if not self.language_model:
            return None
        return sink_scores(self.maps, [s.src for s in self.sentences])


@dataclass(frozen=True)
class MapMeasure:
    name: str
    compute: Callable[[SiteMaps], np.ndarray | None]
    entry: bool = False  # also a number in each head's analysis.json entry, under its name
    # why it gave None at a site (analysis.json's `not_applicable`), never an empty grid unsaid
    why_not: Callable[[SiteMaps], str] = lambda s: "does not apply to this attention"


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


SELF = "needs a self-attention: queries and keys over one sequence"
LM_ONLY = ("measured on a causal self-attention over text the model reads alone (a language "
           "model's lm-self)")


def _why_no_syntax(s: SiteMaps) -> str:
    if not s.over_text:
        return ("dependency arcs join words of the analysed text: measured where queries and keys "
                "are both its tokens (enc-self, lm-self)")
    if not s.syntactic:
        return ("no dependency arcs: give analysis.treebank (or analysis.conllu) for the analysed "
                "text" + ("; a causal head sees only earlier words, and none of the arcs points "
                          "back" if SITE[s.site].causal and any(x.arcs for x in s.sentences)
                          else ""))
    return f"no relation has {s.cfg.min_arcs} or more arcs (analysis.min_arcs)"


MEASURES: tuple[MapMeasure | GradientMeasure, ...] = (
    MapMeasure("confidence", lambda s: confidence(s.maps, skip_last_query=s.eos_query,
                                                  eos_key=s.src_keys, bos=s.bos), entry=True),
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
    MapMeasure("positional_share", lambda s: s.positional["share"] if s.self_attention else None,
               why_not=lambda s: SELF),
    MapMeasure("self_share", lambda s: s.positional["self"] if s.self_attention else None,
               why_not=lambda s: SELF),
    MapMeasure("rare_share", lambda s: s.rare[0],
               why_not=lambda s: "its keys are target tokens: rare words are those of the "
                                 "analysed (source) text"),
    MapMeasure("syntactic_gain", _syntactic_gain, why_not=_why_no_syntax),
    # a language model's head roles (analysis/roles.py)
    MapMeasure("previous_token", lambda s: s.roles and s.roles["previous_token"], entry=True,
               why_not=lambda s: LM_ONLY),
    MapMeasure("duplicate_token", lambda s: s.roles and s.roles["duplicate_token"], entry=True,
               why_not=lambda s: LM_ONLY),
    MapMeasure("induction", lambda s: s.roles and s.roles["induction"], entry=True,
               why_not=lambda s: LM_ONLY),
    MapMeasure("sink", lambda s: s.sink and s.sink["alpha0"], entry=True,
               why_not=lambda s: LM_ONLY),
)
MAP_MEASURES = tuple(m for m in MEASURES if isinstance(m, MapMeasure))
GRADIENT_MEASURES = tuple(m for m in MEASURES if isinstance(m, GradientMeasure))
