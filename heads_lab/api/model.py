"""`heads_lab.open(run dir or "hf:<model>", ...)`: a model whose heads are measured, in a notebook.

The model is opened as the CLI opens it (heads_lab/commands/command.py's `open_subject`: the
same checks, the same one-line errors, raised as `heads_lab.Error`), and every method calls the
code the CLI runs: its maps are `analyze`'s, its masks the hooks `eval.head_mask` and `prune`
use, its importance Michel et al.'s of `prune`, its evaluation the task metric of a pruning
point (a translator's BLEU, chrF and PPL; an encoder's masked-LM accuracy; a language model's
PPL and bits per byte). Results are numpy arrays and dataclasses, never console tables.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from heads_lab.analysis.publish import token_labels
from heads_lab.analysis.record import Source
from heads_lab.analysis.subject import analyze, importance_curves
from heads_lab.commands.analyze import COMMAND as ANALYZE
from heads_lab.commands.command import open_subject
from heads_lab.commands.prune import COMMAND as PRUNE
from heads_lab.config.sites import HeadSet, format_heads, parse_head_mask
from heads_lab.data import Split
from heads_lab.errors import ConfigError

OTHER_VERB = {"analyze": ("prune.", "eval."), "prune": ("analysis.",)}


@dataclass
class Maps:
    """Attention maps of texts: per text its tokens as the model reads them (`tokens`, special
    ones included) and per site an array [layers, heads, query, key] (`sites`)."""

    tokens: list[list[str]]
    sites: list[dict[str, np.ndarray]]

    def __len__(self) -> int:
        return len(self.tokens)

    def __getitem__(self, i: int) -> dict[str, np.ndarray]:
        return self.sites[i]


@dataclass
class Evaluation:
    """The task metric with some heads gone: `metrics` (bleu, chrf, ppl; accuracy, loss, ppl;
    or ppl, bits_per_byte), the heads `kept` per site, `params` where heads were removed for
    real (else None: masked), and which heads were `masked` (a head spec)."""

    metrics: dict[str, float]
    kept: dict[str, int]
    params: int | None
    masked: str


@dataclass
class Analysis:
    """`analyze`'s record (`record`: analysis.json's content) with each measure's grid as an
    array: `grid("confidence", "enc-self")` → [layers, heads], NaN where not measured."""

    record: dict[str, Any]
    measures: list[str] = field(default_factory=list)

    def grid(self, measure: str, site: str) -> np.ndarray:
        rows = self.record["grids"][measure][site]
        return np.array([[np.nan if v is None else v for v in row] for row in rows], float)

    def roles(self, site: str) -> list[list[str]]:
        """Each head's role (positional, syntactic, rare, other) per layer."""
        return self.record["functions"][site]


class Model:
    """A run trained here or a pretrained `hf:` model (see `heads_lab.open`)."""

    def __init__(self, spec: str, overrides: list[str]):
        self.spec, self.overrides = spec, overrides
        self._subjects: dict[str, Any] = {}
        first = self._subject("analyze")
        self.name, self.pretrained = first.name, first.pretrained

    def __repr__(self) -> str:
        heads = ", ".join(f"{site} {n}" for site, n in self.heads.items())
        return f"<heads_lab model {self.name}: {heads}>"

    def _subject(self, verb: str):
        """The model opened for `verb` (analyze or prune), as the CLI opens it, once."""
        if verb not in self._subjects:
            command = ANALYZE if verb == "analyze" else PRUNE
            mine = [o for o in self.overrides if not o.startswith(OTHER_VERB[verb])]
            spec, (checked,) = command.parse([str(self.spec), *mine])
            self._subjects[verb] = open_subject(spec, verb, checked)
        return self._subjects[verb]

    # what its heads are
    @property
    def task(self) -> str:
        """translate, mlm or lm."""
        subject = self._subject("analyze")
        return subject.pre.task.name if self.pretrained else str(subject.run.task)

    @property
    def heads(self) -> dict[str, int]:
        """Heads per attention site, all layers together."""
        return self._subject("analyze").heads()

    @property
    def layers(self) -> dict[tuple[str, int], int]:
        """Heads per (site, layer), as head specs and masks address them."""
        return dict(self._subject("analyze").map_heads)

    @property
    def groups(self) -> dict[tuple[str, int], int]:
        """Key/value groups per (site, layer) under grouped-query attention, else {}."""
        return dict(self._subject("analyze").groups)

    def head_set(self, heads: str | HeadSet | None) -> HeadSet:
        """A head spec ("enc:0:3,dec-enc:1:*", "lm:1:0+lm:1:2") or {(site, layer): [heads]}."""
        if heads is None:
            return {}
        if isinstance(heads, str):
            return parse_head_mask(heads, self.layers)
        return {tuple(k): sorted(v) for k, v in heads.items()}

    # what they do
    def maps(self, texts: list[str] | str | None = None, split: str = "test",
             n: int = 8) -> Maps:
        """Attention maps of `texts` (a list, or one text), else of the first `n` texts of the
        data's `split`: per text its tokens and its maps per site."""
        subject = self._subject("analyze")
        cfg = dataclasses.replace(subject.run.analysis, split=split, max_sentences=n)
        source = subject.source(cfg) if texts is None else self._texts(
            [texts] if isinstance(texts, str) else list(texts))
        with subject.masked(self._masked):
            sentences = subject.maps(source)
        tokens = []
        for s in sentences:
            src, tgt = token_labels(s, subject.tokenizer)
            tokens.append(src + (["|"] + tgt if tgt else []))
        return Maps(tokens, [dict(s.maps) for s in sentences])

    def _texts(self, texts: list[str]):
        """Texts as the analysis reads them (the model's tokenizer, its special tokens)."""
        rows = self._subject("analyze").tokenizer.encode(texts)  # as the model reads them
        split = Split(texts, None, rows, [[] for _ in rows])
        return Source("texts", split, texts, None, list(range(len(texts))))

    @contextlib.contextmanager
    def masked(self, heads: str | HeadSet) -> Iterator[Model]:
        """Within the block the heads are zeroed (their outputs, where they enter the output
        projection) for maps and the analysis, held at 0 for importance, and gone from an
        evaluation (removed for real where it removes heads); blocks nest."""
        before = self._masked
        chosen = {k: list(v) for k, v in before.items()}
        for key, more in self.head_set(heads).items():
            chosen[key] = sorted(set(chosen.get(key, [])) | set(more))
        self._masked = chosen
        try:
            yield self
        finally:
            self._masked = before

    _masked: HeadSet = {}

    def evaluate(self, masked: str | HeadSet | None = None) -> Evaluation:
        """The task metric on prune.eval_split (prune.eval_sentences of it), with `masked`
        heads (and those of an enclosing `masked` block) gone, as a pruning point measures it:
        removed for real where the attention allows, else masked."""
        subject = self._subject("prune")
        chosen = self.head_set(masked)
        for key, more in self._masked.items():
            chosen[key] = sorted(set(chosen.get(key, [])) | set(more))
        row = subject.point(chosen, 0.0)
        keep = ("bleu", "chrf", "ppl", "accuracy", "loss", "bits_per_byte", "forward_tok_s",
                "decode_s")
        removed = getattr(subject, "remove", False)  # else masked: the full model's parameters
        return Evaluation({k: float(row[k]) for k in keep if k in row}, dict(row["kept"]),
                          row.get("params") if removed else None, format_heads(chosen))

    def importance(self, sites: list[str] | None = None,
                   groups: bool = False) -> dict[tuple[str, int], np.ndarray]:
        """Michel et al.'s head importance (|∂L/∂ξ| per head, normalised per layer) on
        prune.split, with the heads of an enclosing `masked` block held at 0; with `groups`,
        per key/value group."""
        subject = self._subject("prune")
        scope = list(sites or self.heads)
        return dict(subject.importance(dict(self._masked), scope, groups=groups))

    def prune(self, step: float | None = None, sites: list[str] | None = None
              ) -> dict[str, list[dict[str, Any]]]:
        """Michel et al.'s iterative pruning, as `heads-lab prune method=importance` runs it (no
        files written): per curve (each attention type, all of them together, and under
        grouped-query attention the key/value groups) its points, each a dict of the task
        metric, the heads kept and those gone."""
        if self._masked:
            raise ConfigError("prune() starts from the whole model and takes its own heads "
                              "away: call it outside a masked block")
        subject = self._subject("prune")
        p = subject.run.prune
        return importance_curves(subject, list(sites or p.sites), step or p.step, subject.verb,
                                 lambda line: None)

    def analyze(self, **settings: Any) -> Analysis:
        """Every measure of `heads-lab analyze` (analysis.json's record, no files written),
        with analysis settings given by name: analyze(split="valid", max_sentences=50)."""
        subject = self._subject("analyze")
        cfg = subject.run.analysis
        unknown = [k for k in settings if not hasattr(cfg, k)]
        if unknown:
            raise ConfigError(f"analyze({unknown[0]}=...): not an analysis setting; choose from "
                              f"{', '.join(f.name for f in dataclasses.fields(cfg))}")
        with subject.masked(self._masked):
            record, _ = analyze(subject, dataclasses.replace(cfg, **settings))
        return Analysis(record, sorted(record["grids"]))


def open(spec: str | Path, *overrides: str, **settings: Any) -> Model:  # noqa: A001
    """A run dir of `heads-lab train`, or "hf:<hub name or save_pretrained dir>", opened as the
    CLI opens it. Overrides as the CLI takes them ("data=multi30k", "prune.eval_sentences=100")
    or by name with "__" for the dots (data="multi30k", prune__eval_sentences=100)."""
    given = [*overrides, *(f"{k.replace('__', '.')}={_value(v)}" for k, v in settings.items())]
    return Model(str(spec), given)


def _value(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(map(str, value)) + "]"
    return "null" if value is None else str(value).lower() if isinstance(value, bool) else str(value)
