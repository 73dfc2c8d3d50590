"""What a trained model is evaluated on, by its task (`task=`): a translator's perplexity and
BLEU/chrF of its decoded translations (sacrebleu, with signatures; the multi-reference scores
where the data has several references), a language model's perplexity and bits per byte of its
held-out text (heads_lab.training.language), with samples. `heads-lab train` and `heads-lab eval`
call `evaluate` of the run's task and write what it returns; a new task kind is a class here.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from heads_lab.data import testsets
from heads_lab.data.sources import references
from heads_lab.errors import DataError
from heads_lab.model.heads import head_counts, masked, parse_head_mask
from heads_lab.model.lm import LanguageModel
from heads_lab.model.transformer import Transformer
from heads_lab.output.files import write_lines
from heads_lab.training import language
from heads_lab.training.device import autocast
from heads_lab.training.evaluate import (
    MULTIREF_RECORDS,
    multiref_metrics,
    perplexity,
    score,
    translate,
)

log = logging.getLogger(__name__)


@dataclass
class Evaluated:
    """One evaluation: the split scored, its metrics (results.json's keys, `<split>/...`),
    what results.json records of how it was scored, the summary table's rows and the lines
    printed under it."""

    split: Any
    metrics: dict[str, float]
    records: dict[str, Any]
    rows: list[tuple[str, str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def _heads(run, model):
    """eval.head_mask: heads zeroed for this evaluation only."""
    heads = parse_head_mask(run.eval.head_mask or "", head_counts(model))
    if heads:
        log.info("evaluating with %d head(s) masked: %s", sum(map(len, heads.values())),
                 run.eval.head_mask)
    return heads


class Translate:
    name = "translate"
    model_class = Transformer

    def evaluate(self, run, model, corpus, device, out_dir: Path, prefix: str) -> Evaluated:
        """Perplexity, translation and sacrebleu scores on run.eval.split (or the sacrebleu
        test set), with hyps/refs/src written to out_dir/{prefix}hyps.{split}.txt etc."""
        name = run.eval.split
        split = corpus.splits[name]
        heads = _heads(run, model)
        if run.eval.sacrebleu_test:
            split = testsets.load(run.eval.sacrebleu_test, run.data.src, run.data.tgt,
                                  corpus.tokenizer, run.data.cleaning.normalize)
        with autocast(device, run.trainer.precision), masked(model, heads):  # as trained
            ppl = perplexity(model, split, run.trainer.max_tokens, device)
            hyps = translate(model, split, corpus.tokenizer, run.eval, device)
        write_lines(out_dir / f"{prefix}hyps.{name}.txt", hyps)
        write_lines(out_dir / f"{prefix}refs.{name}.txt", split.tgt_text)
        write_lines(out_dir / f"{prefix}src.{name}.txt", split.src_text)
        try:  # the extra score never fails a finished run (e.g. the zip moved while it trained)
            all_refs = None if run.eval.sacrebleu_test else references(run.data, name)
        except DataError as err:
            log.warning("no multi-reference score: %s", err)
            all_refs = None
        if all_refs is not None and [r[0] for r in all_refs] != list(split.tgt_text):
            log.warning("the %s split's references differ from the data's: no multi-reference "
                        "score", name)  # (cannot happen: both are read from one file)
            all_refs = None
        if all_refs is not None:  # a line per segment, its references tab-separated
            write_lines(out_dir / f"{prefix}refs.{name}.all.tsv", map("\t".join, all_refs))
        scores = score(hyps, split.tgt_text, run.eval.bleu_tokenize, all_refs)
        metrics = {f"{name}/loss": ppl["loss"], f"{name}/ppl": ppl["ppl"],
                   f"{name}/bleu": scores["bleu"], f"{name}/chrf": scores["chrf"],
                   **multiref_metrics(name, scores)}
        records = {
            "sacrebleu": {k: scores[k] for k in ("bleu_signature", "chrf_signature",
                                                 "bleu_detail", "hyp_len_ratio",
                                                 *MULTIREF_RECORDS) if k in scores},
            "decoding": {"split": name, "beam": run.eval.beam, "lenpen": run.eval.lenpen,
                         "sentences": len(split),
                         "test_set": (f"sacrebleu:{run.eval.sacrebleu_test}"
                                      if run.eval.sacrebleu_test else run.data.name)}}
        rows = [(f"{name} PPL", f"{ppl['ppl']:.2f}"),
                (f"{name} BLEU (beam {run.eval.beam})", f"{scores['bleu']:.2f}"),
                (f"{name} chrF", f"{scores['chrf']:.2f}"),
                *([(f"{name} BLEU · chrF, all references",
                    f"{scores['bleu_multiref']:.2f} · {scores['chrf_multiref']:.2f}")]
                  if "bleu_multiref" in scores else [])]
        return Evaluated(split, metrics, records, rows,
                         [f"BLEU signature: {scores['bleu_signature']}"])


class LM:
    name = "lm"
    model_class = LanguageModel

    def evaluate(self, run, model, corpus, device, out_dir: Path, prefix: str) -> Evaluated:
        """Perplexity and bits per byte of run.eval.split, row by row (scores.<split>.tsv), its
        copy accuracy on repeats, and samples (samples.txt)."""
        name = run.eval.split
        split = corpus.splits[name]
        with autocast(device, run.trainer.precision), masked(model, _heads(run, model)):
            nll, tokens = language.row_nll(model, split, run.trainer.max_tokens, device,
                                           run.eval.context)
            copy = language.copy_accuracy(model, split, run.trainer.max_tokens, device)
            samples = language.write_samples(model, corpus.tokenizer, split,
                                             out_dir / f"{prefix}samples.txt", device, run.seed)
        got = language.totals(nll, tokens, split.bytes)
        language.write_rows(out_dir / f"{prefix}scores.{name}.tsv", nll, tokens, split.bytes)
        metrics = {f"{name}/loss": got["loss"], f"{name}/ppl": got["ppl"]}
        if "bits_per_byte" in got:
            metrics[f"{name}/bits_per_byte"] = got["bits_per_byte"]
        if copy is not None:
            metrics[f"{name}/copy_accuracy"] = copy
        how = {"documents": f"non-overlapping blocks of up to {run.data.block_size} tokens, "
                            + (f"each read from its BOS after up to {run.eval.context} tokens "
                               "of the text before it (eval.context; only the block's own "
                               "tokens scored)" if run.eval.context else
                               "each read from its BOS (no sliding window)"),
               "sentences": "each sentence from its BOS, its EOS predicted",
               "repeats": "each sequence from its BOS, its EOS predicted; copy accuracy over "
                          "the second copy's tokens but its first"}[corpus.lm]
        records = {"scoring": {"split": name, "rows": len(split), "how": how,
                               "tokens": got["tokens"], "bytes": got.get("bytes"),
                               "per_row": f"{prefix}scores.{name}.tsv",
                               "samples": samples.name}}
        rows = [(f"{name} PPL (per token)", f"{got['ppl']:.2f}")]
        if "bits_per_byte" in got:
            rows.append((f"{name} bits per byte", f"{got['bits_per_byte']:.4f}"))
        if copy is not None:
            rows.append((f"{name} copy accuracy (second copy)", f"{copy:.3f}"))
        return Evaluated(split, metrics, records, rows, [f"samples: {out_dir / samples.name}"])


TASKS = {task.name: task for task in (Translate(), LM())}


def task_of(run) -> Translate | LM:
    return TASKS[str(getattr(run, "task", "translate"))]
