"""`heads-lab analyze <run dir> [analysis.KEY=VALUE ...]`: what each head of a trained run does.

For every head (layer × enc-self / dec-self / dec-enc × head), on analysis.split or on the
sentences of analysis.treebank (a CoNLL-U file; analysis.treebank_ref=text_en: teacher-forced on
its translations): confidence, positional / syntactic / rare-word roles (Voita et al. 2019),
importance (Michel et al. 2019) and the Jensen–Shannon distance between heads (Clark et al.
2019); see heads_lab/analysis/ for the exact definitions. Talking heads are measured per kind:
maps per softmax head, importance per query/key, softmax and value head. The weights are those
`train` evaluated (checkpoints/best.pt for an eval.checkpoint=best run, else the newest step
checkpoint), or analysis.step's; analysis.json's `checkpoint` and the console say which.

Writes <run dir>/analysis/<time>_<overrides>/: analysis.json, the tables (on the console and
in analysis.md), heads_<metric>.png grids, head_functions.png (the head-function map),
head_distance.png and head_diversity.png, heatmaps of analysis.heatmaps heads on analysis.sentences, and
head_view.html (every layer and head of one sentence; with the bertviz extra installed also
bertviz_head_view.html).
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

from rich.markup import escape

from heads_lab.analysis import analyze
from heads_lab.analysis.publish import check_sentences, publish
from heads_lab.commands.command import Command, open_run
from heads_lab.config.unread import unread_analysis_settings
from heads_lab.hf import is_hf
from heads_lab.model.heads import attention_modules, head_kinds, map_kind, parse_head_mask
from heads_lab.output.files import output_dir
from heads_lab.output.tables import wide_console

log = logging.getLogger(__name__)
COMMAND = Command("analyze", "analysis", ("analysis.",), __doc__)


def _check_treebank_language(path: str, src: str, console) -> str | None:
    """One line when analysis.treebank's language (UD's file name, <lang>_<name>-ud-<split>.conllu)
    is not the model's source language: its sentences may still match the tokenizer (a joint
    vocabulary reads both), but the heads then read text they were not trained to read. The
    analysis goes on; the line says so. Returns the treebank's language code, if the name has one."""
    if not path:
        return None
    name = Path(path).name
    lang = name.split("_", 1)[0] if "_" in name and "-ud-" in name else None
    if lang and src and lang != src:
        console.print(f"[yellow]analysis.treebank {escape(name)} is in '{lang}', but the model's "
                      f"source language is '{src}' (data.src): its heads are analysed on text of "
                      f"another language; use a {src} treebank (e.g. {src}_pud-ud-test.conllu.gz)[/]",
                      markup=True)
    return lang


def main(args: list[str]) -> int:
    started = time.perf_counter()
    if args and is_hf(args[0]):  # a pretrained Hugging Face model (heads_lab.hf)
        from heads_lab.commands.hf import analyze_hf  # lazy: start-up time (transformers)

        return analyze_hf(args[0], args[1:], started)
    opened = open_run(COMMAND, args, computes="fp32")  # no autocast: fp32 always
    if isinstance(opened, int):
        return opened
    run_dir, overrides, t = opened
    run, model, corpus, device = t.run, t.model, t.corpus, t.device
    cfg = run.analysis
    for warning in unread_analysis_settings(overrides, cfg, pretrained=False):
        log.warning(warning)
    modules = attention_modules(model)
    # heatmaps draw attention maps: their heads are the maps' kind (softmax heads, h of them)
    map_heads = {key: head_kinds(m)[map_kind(m)] for key, m in modules.items()}
    chosen = parse_head_mask(",".join(cfg.heatmaps), map_heads)  # early errors
    _check_treebank_language(cfg.treebank, run.data.src, console=wide_console())
    if not cfg.treebank:  # known before the maps are made; a treebank's count after
        split = corpus.splits[cfg.split]
        check_sentences(cfg.sentences, len(split) if cfg.max_sentences is None
                         else min(len(split), cfg.max_sentences))
    result, sentences = analyze(model, corpus, cfg, device, run.trainer.max_tokens,
                                run.data.cleaning.normalize)
    check_sentences(cfg.sentences, len(sentences))
    out = output_dir(run_dir, "analysis", overrides)
    result.update({"run_dir": str(run_dir), "checkpoint": t.checkpoints[0],
                   "overrides": overrides})
    publish(result, sentences, cfg, chosen, corpus.tokenizer, out, run_dir.name, started,
            f"weights: {t.checkpoints[0]}")
    return 0
