"""The seam for "a model whose heads heads-lab measures": a run trained here
(heads_lab.subjects.trained) or a pretrained model (heads_lab.hf.subject) is a `Subject`, and
`analyze` and `prune` are written once against it, here and in analysis/pruning.py.

A Subject says what its heads are (`modules`: each (site, layer)'s kinds of heads; `heads`: how
many per attention type; `map_heads`: those its attention maps show), reads the sentences to
analyse (`source`), makes their maps (`maps`), runs the gradient measures its loss allows
(`gradients`: importance, LRP), counts the source tokens that make a word rare (`frequencies`),
aligns words with its tokenizer's pieces (`tokenizer`), and for pruning measures importance
under a head mask and evaluates its task with heads masked or removed (`importance`, `point`).

A new family of models is one new file: a class with these members (a Protocol: nothing to
inherit), and one line in heads_lab/commands/command.py's `open_subject` that recognises its
name.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from heads_lab.analysis.importance import least_important
from heads_lab.analysis.maps import Sentence
from heads_lab.analysis.measures import Scores
from heads_lab.analysis.publish import check_sentences
from heads_lab.analysis.record import Source, measure
from heads_lab.errors import ConfigError

HeadSet = dict[tuple[str, int], list[int]]  # (site, layer) → heads masked or removed


class Subject(Protocol):
    """A model whose heads are analysed and pruned (see the module doc)."""

    name: str  # as outputs name it: the run dir's name, hf:<model>
    home: Path  # outputs go to home/<analysis|prune>/<time>_<overrides>/
    run: Any  # the composed, validated config (run.analysis, run.prune, run.data, ...)
    pretrained: bool  # no training of its own here (the settings it cannot read say so)
    tokenizer: Any  # ids ↔ pieces, word spans (analysis/syntax.py), decode
    modules: dict[tuple[str, int], Any]  # each (site, layer): kinds(), variant, out_heads
    map_heads: dict[tuple[str, int], int]  # the heads its maps show, per (site, layer)
    identity: dict[str, Any]  # what analysis.json and prune.json say was measured
    # pruning: what happens to a pruned head ("pruned": removed where it can be, "masked"), the
    # table's columns after the curve's name, its title and the note under it, the figure's
    # task metric (key, label; None: BLEU), and what prune.json says of how it was pruned
    verb: str
    curve_columns: list[tuple[str, Callable[[dict], str]]]
    prune_title: str
    prune_note: str
    task_metric: tuple[str, str] | None
    pruning: dict[str, Any]

    def warn(self, line: str) -> None:
        """Says a warning where this family's warnings go."""

    def source(self, cfg) -> Source:
        """The sentences analysis `cfg` reads (a split, or a treebank)."""

    def maps(self, source: Source) -> list[Sentence]:
        """Each sentence's attention maps per site."""

    def gradients(self, source: Source, cfg) -> dict[str, Scores]:
        """The gradient measures it runs on `source` (name → scores per (site, layer, kind))."""

    def frequencies(self, source: Source) -> Counter:
        """Source-token counts that make a token rare."""

    def notes(self, gradient: dict[str, Scores]) -> dict[str, Any]:
        """Fields analysis.json adds after the measures (what was not measured, and why)."""

    def said(self, result: dict[str, Any]) -> str:
        """The line analyze prints before its paths: which weights were analysed."""

    def heads(self) -> dict[str, int]:
        """Heads per attention type (site) it has."""

    def importance(self, masked: HeadSet, scope: list[str]) -> dict[tuple[str, int], np.ndarray]:
        """Head importance (Michel et al. 2019) of the scope's heads with `masked` heads off."""

    def point(self, masked: HeadSet, fraction: float) -> dict[str, Any]:
        """A curve's row: its task metric with `masked` heads gone, at `fraction` of the scope."""

    def summary(self, row: dict[str, Any]) -> str:
        """A row's metric, as the progress line gives it."""

    def gates(self, out: Path) -> dict[str, Any]:
        """prune method=gates (Voita et al. 2019's Hard Concrete gates, fine-tuned with the
        model) into `out`: prune.json's record. A family that cannot be fine-tuned here refuses
        it when opened for prune (a ConfigError), before any work."""


def analyze(subject: Subject, cfg) -> tuple[dict[str, Any], list[Sentence]]:
    """Every measure (analysis/measures.py) of `subject`'s heads on cfg's sentences: the
    analysis record and the sentences with their maps."""
    source = subject.source(cfg)
    check_sentences(cfg.sentences, len(source.indices))
    sentences = subject.maps(source)
    gradient = subject.gradients(source, cfg)
    result = measure(sentences, source, subject.modules, gradient, subject.frequencies(source),
                     subject.tokenizer, cfg)
    result.update(subject.notes(gradient))
    return result, sentences


def sites_present(sites: list[str], total: dict[str, int]) -> list[str]:
    """The attention types of `sites` a model has (`total`: its heads per type); a ConfigError
    where it has none of them."""
    have = [s for s in sites if total.get(s)]
    if not have:
        raise ConfigError(f"prune.sites={list(sites)}: the model has none of these attention "
                          f"types; it has {', '.join(total)} (e.g. prune.sites=[{next(iter(total))}])")
    return have


def importance_curves(subject: Subject, sites: list[str], step: float, verb: str,
                      say: Callable[[str], None]) -> dict[str, list[dict[str, Any]]]:
    """Michel et al. 2019's iterative pruning: compute head importance under the current mask,
    take away the `step` share of the scope's heads that matter least, evaluate, repeat until
    none is left. One curve per attention type of `sites` the subject has, and one over them
    together; each row is `subject.point` (the first, nothing pruned, is shared). `verb`: what
    happens to a head ("pruned", "masked")."""
    total = subject.heads()
    have = sites_present(sites, total)
    scopes = [[s] for s in have] + ([have] if len(have) > 1 else [])
    start = subject.point({}, 0.0)
    curves = {}
    for scope in scopes:
        name = "+".join(scope) if len(scope) > 1 else scope[0]
        in_scope = sum(total[s] for s in scope)
        per_step = max(1, round(step * in_scope))
        masked: HeadSet = {}
        rows = [start]
        while sum(len(v) for v in masked.values()) < in_scope:
            importance = subject.importance(masked, scope)
            for site, layer, h in least_important(importance, masked, per_step):
                masked.setdefault((site, layer), []).append(h)
            n = sum(len(v) for v in masked.values())
            row = subject.point(masked, n / in_scope)
            rows.append(row)
            say(f"importance pruning {name}: {n}/{in_scope} heads {verb} → {subject.summary(row)}")
        curves[name] = rows
    return curves
