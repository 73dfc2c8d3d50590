"""A language model trained here (task=lm) as a Subject (heads_lab/analysis/subject.py): the
run read back as a translator run is (heads_lab/subjects/trained.py), its heads at lm-self.

- What it reads, as `hf:` language models do: BOS + text. The analysed texts are the run's
  held-out rows (a split's blocks or sentences, analysis.max_sentences of them) or a treebank's
  sentences; rare words count its training text's tokens.
- Importance (Michel et al.): the next-token loss on the analysed text itself; LRP is not
  measured (its rules follow a translator's decoder: heads_lab.analysis.lrp).
- Pruning: perplexity and bits per byte of prune.eval_split with heads removed for real where
  its attention allows (multi-head attention), else masked (grouped-query, talking heads); under
  grouped-query attention also whole key/value groups (analysis/subject.py's second curve).
- prune method=gates fine-tunes a translator with its BLEU read before and after: refused here
  in one line.
"""

from __future__ import annotations

import copy
from collections import Counter
from pathlib import Path
from typing import Any

from heads_lab.analysis.maps import collect_lm_maps
from heads_lab.analysis.record import Source
from heads_lab.analysis.syntax import read_conllu, treebank_split
from heads_lab.data import Split
from heads_lab.data.tokenizer import BOS, EOS
from heads_lab.errors import ConfigError
from heads_lab.subjects.trained import (
    FORWARD_REPEATS,
    TrainedSubject,
    _timed,
    open_trained,
)

NOT_MEASURED = {"lrp": "not measured for a language model: heads-lab's LRP is seeded with a "
                       "translator decoder's predictions (heads_lab.analysis.lrp)"}


class LMTokens:
    """heads-lab's own tokenizer as the analysis reads a language model's text: BOS + pieces
    (`encode`), the BOS an empty span before the text's (`encode_spans`), maps labelled with the
    pieces as they are, BOS included."""

    pretrained = True  # (token_labels: its pieces as the model reads them, no target side)
    text_end = 0  # nothing after the text

    def __init__(self, tokenizer):
        self.tok, self.bos_id = tokenizer, BOS

    def __len__(self) -> int:
        return len(self.tok)

    def encode(self, texts: list[str]) -> list[list[int]]:
        return [[BOS, *ids] for ids in self.tok.encode(texts)]

    def encode_spans(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
        ids, spans = self.tok.encode_spans(text)
        return [BOS, *ids], [(0, 0), *spans]

    def pieces(self, ids: list[int]) -> list[str]:
        return self.tok.pieces(ids)

    def decode(self, ids: list[list[int]]) -> list[str]:
        return self.tok.decode([[i for i in row if i not in (BOS, EOS)] for row in ids])

    def lead(self, ids: list[int]) -> int:
        return int(bool(ids) and ids[0] == BOS)

    def ordinary_ids(self) -> list[int]:
        return list(range(EOS + 1, len(self.tok)))


def _rows(split: Split, n: int) -> list[list[int]]:
    """The first n rows as the model reads them: BOS + tokens."""
    return [[BOS, *(int(t) for t in split.tgt[i])] for i in range(n)]


def text_split(rows: list[list[int]], open_end: bool = False) -> Split:
    """Rows read from their BOS as a language model's split (the text on the target side);
    `open_end`: blocks cut from documents, nothing predicted after their last token."""
    return Split(None, None, [[] for _ in rows], [r[1:] for r in rows], open_end)


class TrainedLMSubject(TrainedSubject):
    """A language model run (see the module doc)."""

    prune_note = "heads removed for real where the attention allows, else masked; kept: lm-self"

    def __init__(self, run_dir: Path, trained, verb: str):
        super().__init__(run_dir, trained, verb)
        self.tokenizer = LMTokens(trained.corpus.tokenizer)
        cfg = self.run.model
        kv = cfg.kv_heads or cfg.heads
        grouped = getattr(cfg.attention, "value", cfg.attention) == "mha" and kv < cfg.heads
        self.groups = {key: kv for key in self.map_heads} if grouped else {}
        split = self.run.prune.eval_split
        self.task_metric = ("bits_per_byte", f"{split} bits per byte")
        self.curve_columns = [
            ("fraction", lambda r: f"{r['fraction']:.2f}"),
            ("kept l", lambda r: str(r["kept"]["lm-self"])),
            *((("kv groups pruned", lambda r: str(r.get("kv_groups_pruned", "–"))),)
              if self.groups else ()),
            ("params", lambda r: f"{r['params']:,}"), ("PPL", lambda r: f"{r['ppl']:.2f}"),
            ("bits/byte", lambda r: f"{r['bits_per_byte']:.4f}"),
            ("fwd tok/s", lambda r: f"{r['forward_tok_s']:,.0f}")]

    # analyze
    def source(self, cfg):
        max_len = self.run.model.max_positions
        if cfg.treebank:
            trees = read_conllu(Path(cfg.treebank))
            trees = trees[:cfg.max_sentences] if cfg.max_sentences else trees
            split, kept, indices, left_out = treebank_split(trees, self.tokenizer, "none", None,
                                                            max_len)
            return Source(f"treebank {Path(cfg.treebank).name}", split, split.src_text, kept,
                          indices, left_out, "treebank", str(cfg.treebank))
        part = self.corpus.splits[cfg.split]
        n = len(part) if cfg.max_sentences is None else min(cfg.max_sentences, len(part))
        rows = _rows(part, n)
        texts = list(part.tgt_text[:n]) if part.tgt_text else self.tokenizer.decode(rows)
        trees, syntax = None, None
        if cfg.conllu:
            parsed = read_conllu(Path(cfg.conllu))[:n]
            trees, syntax = parsed + [None] * (n - len(parsed)), "conllu"
        return Source(cfg.split, Split(texts, None, rows, [[] for _ in rows], part.open_end),
                      texts, trees, list(range(n)), [], syntax, cfg.conllu)

    def _read(self, source) -> list[list[int]]:
        return [[int(t) for t in source.split.src[i]] for i in range(len(source.indices))]

    def maps(self, source):
        return collect_lm_maps(self.model, self._read(source), self.device)

    def sequence_maps(self, ids):
        return collect_lm_maps(self.model, [list(x) for x in ids], self.device)

    def gradients(self, source, cfg):
        from heads_lab.analysis.importance import importance_by_kind  # lazy: torch

        rows = self._read(source)
        return {"importance": importance_by_kind(self.model, text_split(
            rows, source.split.open_end), None,
                                                 self.run.trainer.max_tokens, self.device)}

    def frequencies(self, source) -> Counter:
        train = self.corpus.splits["train"]
        return Counter(int(t) for i in range(len(train)) for t in train.tgt[i])

    def notes(self, gradient) -> dict[str, Any]:
        return {"not_measured": dict(NOT_MEASURED)}

    # prune (eval_split and importance_split: the translator's)
    def importance(self, masked, scope, groups: bool = False):
        from heads_lab.analysis import head_importance  # lazy: start-up time (torch)

        cfg = self.run.model
        group = cfg.heads // (cfg.kv_heads or cfg.heads) if groups else 1
        return head_importance(self.model, self.importance_split, None,
                               self.run.trainer.max_tokens, self.device, masked,
                               sites=tuple(scope), group=group)

    def point(self, masked, fraction: float) -> dict[str, Any]:
        from heads_lab.model import heads  # lazy: start-up time (torch)

        if self.remove:
            model = copy.deepcopy(self.model)
            heads.remove_heads(model, masked)
            ev = self._evaluate(model)
            kept = heads.count_heads(model)
        else:
            model = self.model
            with heads.masked(model, masked):
                ev = self._evaluate(model)
            kept = heads.kept_after(heads.count_heads(model), masked)
        return {"fraction": fraction, "pruned_heads": sum(len(v) for v in masked.values()),
                "kept": kept, "params": sum(p.numel() for p in model.parameters()), **ev,
                "masked": heads.format_heads(masked)}

    def _evaluate(self, model) -> dict[str, float]:
        from heads_lab.training.device import autocast  # lazy: start-up time (torch)
        from heads_lab.training.language import lm_perplexity  # lazy: as above

        run, split = self.run, self.eval_split
        model.eval()
        with autocast(self.device, run.trainer.precision):
            got = lm_perplexity(model, split, run.trainer.max_tokens, self.device)
            seconds = min(_timed(lm_perplexity, model, split, run.trainer.max_tokens,
                                 self.device) for _ in range(FORWARD_REPEATS))
        return {"ppl": got["ppl"], "loss": got["loss"],
                "bits_per_byte": got.get("bits_per_byte", float("nan")),
                "forward_tok_s": got["tokens"] / max(seconds, 1e-9)}

    def summary(self, row) -> str:
        return f"bits/byte {row['bits_per_byte']:.4f}, PPL {row['ppl']:.2f}"

    def gates(self, out: Path) -> dict[str, Any]:
        raise ConfigError("prune method=gates fine-tunes with a translator's BLEU read before and "
                          "after; for a language model (task=lm) use method=importance")


def open_run_subject(run_dir: Path, verb: str, overrides: list[str]) -> TrainedSubject:
    """A run trained here read back for `verb`: a language model's (task=lm) subject, else a
    translator's (heads_lab.subjects.trained). A language model refuses prune's method=gates
    before any work."""
    from heads_lab.training.runs import compose_run, load  # lazy: start-up time (torch)

    _, run = compose_run(run_dir, overrides)
    if str(run.task) != "lm":
        return open_trained(run_dir, verb, overrides)
    if verb == "prune" and run.prune.method == "gates":
        raise ConfigError("prune method=gates fine-tunes with a translator's BLEU read before "
                          "and after; for a language model (task=lm) use method=importance")
    trained = load(run_dir, overrides, computes="fp32" if verb == "analyze" else None)
    return TrainedLMSubject(run_dir, trained, verb)
