"""`analyze` of an `hf:` model (its Subject: heads_lab.hf.subject): heads-lab's measures
(analysis/record.py `measure`) on the model's own attention maps.

- Sentences: analysis.treebank's (its `# text`, and with analysis.treebank_ref a translator's
  decoder teacher-forced on the translation), or the first analysis.max_sentences of a data
  set's analysis.split (its texts re-tokenized by the model's tokenizer).
- Words ↔ tokens for the syntactic measures through the model's tokenizer: its character
  offsets where it has them (BERT, DistilBERT), else its SentencePiece pieces (Marian).
- Rare words: token frequencies of the analysed sentences themselves (the model's training data
  is not at hand); so a "rare" token is rare in the analysed text.
- Importance (Michel): through the hooks of heads_lab.hf.heads, with the task's loss (a
  translator's reference cross-entropy: only with translations; an encoder's masked LM; a
  language model's next-token loss on the text itself).
- Length: a data set's texts are cut to analysis.max_tokens tokens where it is set; a text
  longer than the model's positions is refused in one line (a treebank's is left out, saying
  why).
- LRP: not measured for these families (its rules follow heads-lab's own layers); analysis.json
  says so under `not_measured`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from heads_lab.analysis.record import Source
from heads_lab.analysis.syntax import read_conllu, treebank_split
from heads_lab.data import Split
from heads_lab.errors import ConfigError
from heads_lab.hf.models import Pretrained

log = logging.getLogger(__name__)
NOT_MEASURED = {"lrp": "not measured for this family: heads-lab's LRP rules follow its own "
                       "layers (heads_lab.analysis.lrp)"}


@dataclass
class HeadsOf:
    """An `hf:` model's heads at one (site, layer), as analysis/record.py reads a module: one kind
    of head ("head", multi-head attention), `out_heads` of them."""

    out_heads: int
    variant: str = "mha"

    def kinds(self) -> dict[str, int]:
        return {"head": self.out_heads}


def source(pre: Pretrained, cfg, texts: tuple[list[str], list[str] | None] | None,
           form: str = "NFC") -> Source:
    """What is analysed: analysis.treebank's sentences, or `texts` (sources, references) of a
    data set's split. A translator's references are encoded as its labels."""
    # the positions a sequence may take: its tokens as encoded, special ones ([CLS] [SEP], </s>)
    # included (they were counted twice: a BERT sentence of 511 or 512 tokens was left out)
    max_len = pre.positions or 512
    if cfg.treebank:
        trees = read_conllu(Path(cfg.treebank))
        trees = trees[:cfg.max_sentences] if cfg.max_sentences else trees
        split, kept, indices, left_out = treebank_split(
            trees, pre.tokens, form, cfg.treebank_ref, max_len,
            pre.tokens.encode_target if pre.task.references else None)  # English by its own
        return Source(f"treebank {Path(cfg.treebank).name}", split, split.src_text, kept,
                      indices, left_out, "treebank", str(cfg.treebank))
    if texts is None:
        raise ConfigError("analyze hf:...: give analysis.treebank=<CoNLL-U file> of the model's "
                          "(source) language (e.g. $HEADS_LAB_DATA/ud-pud/en_pud-ud-test.conllu.gz "
                          "for English, de_pud-ud-test.conllu.gz for German), or a data set "
                          "(data=multi30k) and analysis.split")
    src_text, tgt_text = texts
    n = len(src_text) if cfg.max_sentences is None else min(cfg.max_sentences, len(src_text))
    src_text = src_text[:n]
    tgt_text = tgt_text[:n] if tgt_text is not None and pre.task.references else None
    src = fitted(pre, pre.tokens.encode(src_text), cfg.max_tokens, "analysis.max_tokens")
    tgt = pre.tokens.encode_target(tgt_text) if tgt_text is not None else [[] for _ in src]
    return Source(cfg.split, Split(src_text, tgt_text, src, tgt), src_text, None,
                  list(range(n)))


def fitted(pre: Pretrained, ids: list[list[int]], max_tokens: int | None,
           setting: str | None = None) -> list[list[int]]:
    """Texts' ids cut to `max_tokens` (None: as they are): the text's first tokens and the
    special tokens its task puts after it (a source's end token stays its end); a text longer
    than the model's positions is refused in one line (a ConfigError naming it and the fix)."""
    limit, end = pre.positions, pre.tokens.text_end
    if max_tokens is not None:
        if limit is not None and max_tokens > limit:
            raise ConfigError(f"{setting}={max_tokens} is over the model's {limit:,} positions: "
                              f"give {setting}={limit} or less")
        # the text's first tokens, and the special tokens after it (a source's </s>, [SEP])
        ids = [x if len(x) <= max_tokens else x[:max_tokens - end] + x[len(x) - end:]
               for x in ids]
    if limit is not None:
        longest = max(range(len(ids)), key=lambda i: len(ids[i]), default=None)
        if longest is not None and len(ids[longest]) > limit:
            fix = (f"set {setting}={limit} to cut each text to its first {limit} tokens, or "
                   "give shorter texts") if setting else "give shorter texts"
            raise ConfigError(f"text {longest} is {len(ids[longest]):,} tokens, longer than the "
                              f"model's {limit:,} positions (hf:{pre.name}): {fix}")
    return ids


def notes(pre: Pretrained, gradient: dict) -> dict[str, Any]:
    """What analysis.json adds of an `hf:` model: the measures not made (and why) and the model."""
    not_measured = dict(NOT_MEASURED)
    if "importance" not in gradient and pre.task.references:
        not_measured["importance"] = ("a translator's loss needs references: give "
                                      "analysis.treebank_ref (e.g. text_en)")
    return {"not_measured": not_measured,
            "model": {"name": pre.name, "family": pre.family.name, "task": pre.task.name,
                      "rare_frequencies": "the analysed sentences' own tokens"}}
