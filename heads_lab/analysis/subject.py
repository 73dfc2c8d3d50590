"""The seam for "a model whose heads heads-lab measures": a run trained here
(heads_lab.subjects.trained) or a pretrained model (heads_lab.hf.subject) is a `Subject`, and
`analyze` and `prune` are written once against it, here and in analysis/pruning.py.

A Subject says what its heads are (`modules`: each (site, layer)'s kinds of heads; `heads`: how
many per attention type; `map_heads`: those its attention maps show; `groups`: its key/value
groups where several query heads share one), reads the sentences to analyse (`source`), makes
their maps (`maps`, and `sequence_maps` of given token ids: a language model's role probe),
runs the gradient measures its loss allows (`gradients`: importance, LRP), counts the source
tokens that make a word rare (`frequencies`), aligns words with its tokenizer's pieces
(`tokenizer`), and for pruning measures importance under a head mask and evaluates its task with
heads masked or removed (`importance`, `point`); `importance(..., groups=True)` scores whole
key/value groups, each through one gate over all its query heads.

A new family of models is one new file: a class with these members (a Protocol: nothing to
inherit), and one line in heads_lab/commands/command.py's `open_subject` that recognises its
name.
"""

from __future__ import annotations

import os
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
from heads_lab.analysis.roles import repeated_tokens
from heads_lab.config.sites import SITE
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
    # key/value groups per (site, layer) where several query heads share one key/value head
    # (grouped-query attention: query head i in group i // (heads / groups)); {} where none do
    groups: dict[tuple[str, int], int]
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

    def masked(self, heads: HeadSet):
        """A context manager within which `heads` are zeroed (their outputs where they enter
        the output projection), as `eval.head_mask` zeroes them."""

    def sequence_maps(self, ids: list[list[int]]) -> list[Sentence]:
        """The attention maps of token sequences given as ids, at the site where the model
        reads a sequence alone (a language model's lm-self: the ids as they are)."""

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

    def importance(self, masked: HeadSet, scope: list[str], groups: bool = False
                   ) -> dict[tuple[str, int], np.ndarray]:
        """Head importance (Michel et al. 2019) of the scope's heads with `masked` heads off;
        with `groups`, of its key/value groups (one gate ξ_g over all query heads of group g:
        |∂L/∂ξ_g|), [groups] per (site, layer)."""

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
    check_memory(source, subject.map_heads, cfg)
    sentences = subject.maps(source)
    gradient = subject.gradients(source, cfg)
    probe, roles = role_probe(subject, cfg)
    result = measure(sentences, source, subject.modules, gradient, subject.frequencies(source),
                     subject.tokenizer, cfg, probe)
    if roles:
        result["roles"] = roles
    result.update(subject.notes(gradient))
    return result, sentences


def language_model_sites(heads: dict[tuple[str, int], int]) -> list[str]:
    """The sites of `heads` that are a causal self-attention over the text a model reads alone
    (lm-self): where the LM head roles are measured."""
    return list(dict.fromkeys(site for site, _ in heads if SITE[site].causal
                              and SITE[site].self_attention and SITE[site].text_keys))


def role_probe(subject: Subject, cfg) -> tuple[dict[str, tuple] | None, dict[str, Any] | None]:
    """A language model's role probe (analysis/roles.py): analysis.role_sequences sequences of
    analysis.role_length random ordinary tokens, each repeated once after the BOS, and the
    maps the subject makes of them; (per site (maps, sequences), what analysis.json records of
    the probe), or (None, None) for a model without a language model's site."""
    sites = language_model_sites(subject.map_heads)
    if not sites:
        return None, None
    tok = subject.tokenizer
    try:
        sequences = repeated_tokens(tok.ordinary_ids(), tok.bos_id, cfg.role_sequences,
                                    cfg.role_length)
    except ValueError as err:
        raise ConfigError(f"analysis.role_length={cfg.role_length}: {err}; give a shorter "
                          "analysis.role_length") from None
    made = subject.sequence_maps(sequences)
    probe = {site: ([s.maps[site] for s in made], sequences) for site in sites}
    return probe, {"sequences": len(sequences), "length": cfg.role_length,
                   "tokens": "distinct random ordinary tokens, each sequence repeated once after "
                             "the BOS; induction over the second copy's queries"}


def free_memory() -> int | None:
    """Bytes of memory available now (Linux's MemAvailable: free memory and what the page cache
    would give back), None where it cannot be read."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):  # not on this system: no guard
        return None


def check_memory(source: Source, heads: dict[tuple[str, int], int], cfg=None,
                 share: float = 0.5) -> None:
    """Refuses, in one line, an analysis whose maps would not fit in memory: every analysed
    sentence's maps are kept (layers · heads · query · key float32 per site) while the measures
    run, and a language model's role probe's beside them (analysis.role_sequences sequences of
    2 · analysis.role_length + 1 tokens). The estimate is against `share` of the memory
    available now."""
    free = free_memory()
    if free is None:
        return
    picked = range(min(len(source.indices), len(source.split)))  # the first: those analysed
    sides = {"src": [len(source.split.src[i]) + 1 for i in picked],
             "tgt": [len(source.split.tgt[i]) + 1 for i in picked]}
    per_site: dict[str, int] = {}
    for (site, _), n in heads.items():
        per_site[site] = per_site.get(site, 0) + n
    floats = sum(n * sum(q * k for q, k in zip(sides[SITE[site].query], sides[SITE[site].key]))
                 for site, n in per_site.items())
    if cfg is not None:
        probe = 2 * cfg.role_length + 1
        floats += sum(n * cfg.role_sequences * probe * probe for site, n in per_site.items()
                      if site in language_model_sites(heads))
    need = 4 * floats
    if need > share * free:
        longest = max(sides["src"], default=0)
        raise ConfigError(f"the attention maps of {len(picked):,} sentences (up to "
                          f"{longest:,} tokens) would take {_size(need)}, over half the "
                          f"{_size(free)} available: analyse fewer or shorter texts "
                          "(analysis.max_sentences=..., analysis.max_tokens=...)")


def _size(n: float) -> str:
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


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
    together; where a type has grouped-query attention, also one over its key/value groups
    (`<site> kv groups`: a pruned group is its key/value head and all its query heads, as
    LLM-Pruner removes groups); each row is `subject.point` (the first, nothing pruned, is
    shared). `verb`: what happens to a head ("pruned", "masked")."""
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
    for site in have:
        groups = {key: g for key, g in subject.groups.items() if key[0] == site}
        if groups:
            curves[f"{site} kv groups"] = _group_curve(subject, site, groups, step, start, verb,
                                                       say)
    return curves


def group_heads(groups: HeadSet, heads: dict[tuple[str, int], int],
                per_layer: dict[tuple[str, int], int]) -> HeadSet:
    """The query heads of key/value `groups` ((site, layer) → groups): query head i is in group
    i // (heads / groups), so group g holds heads g·r … g·r + r − 1, r = heads / groups."""
    out: HeadSet = {}
    for key, chosen in groups.items():
        r = heads[key] // per_layer[key]
        out[key] = sorted(h for g in chosen for h in range(g * r, (g + 1) * r))
    return out


def _group_curve(subject: Subject, site: str, groups: dict[tuple[str, int], int], step: float,
                 start: dict[str, Any], verb: str, say: Callable[[str], None]) -> list[dict]:
    """Michel et al.'s loop over the key/value groups of `site`: score every group left (one
    gate over all its query heads), take away the `step` share that matters least (each its
    key/value head and its query heads), evaluate, repeat."""
    in_scope = sum(groups.values())
    per_step = max(1, round(step * in_scope))
    gone: HeadSet = {}
    rows = [{**start, "kv_groups_pruned": 0}]
    while sum(len(v) for v in gone.values()) < in_scope:
        masked = group_heads(gone, subject.map_heads, groups)
        scores = subject.importance(masked, [site], groups=True)
        for s, layer, g in least_important(scores, gone, per_step):
            gone.setdefault((s, layer), []).append(g)
        n = sum(len(v) for v in gone.values())
        row = {**subject.point(group_heads(gone, subject.map_heads, groups), n / in_scope),
               "kv_groups_pruned": n}
        rows.append(row)
        say(f"importance pruning {site} kv groups: {n}/{in_scope} key/value groups {verb} "
            f"(with their query heads) → {subject.summary(row)}")
    return rows
