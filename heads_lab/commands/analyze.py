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

import time

from heads_lab.analysis.publish import publish
from heads_lab.analysis.subject import analyze
from heads_lab.commands.command import Command, open_subject
from heads_lab.config.sites import parse_head_mask
from heads_lab.config.unread import unread_analysis_settings
from heads_lab.output.files import output_dir

COMMAND = Command("analyze", "analysis", ("analysis.",), __doc__, pretrained=True)


def main(args: list[str]) -> int:
    started = time.perf_counter()
    parsed = COMMAND.parse(args)
    if isinstance(parsed, int):
        return parsed
    spec, (overrides,) = parsed
    subject = open_subject(spec, "analyze", overrides)  # a run dir, or hf:<model>
    cfg = subject.run.analysis
    for warning in unread_analysis_settings(overrides, cfg, pretrained=subject.pretrained):
        subject.warn(warning)
    chosen = parse_head_mask(",".join(cfg.heatmaps), subject.map_heads)  # early errors
    result, sentences = analyze(subject, cfg)
    out = output_dir(subject.home, "analysis", overrides)
    result.update({**subject.identity, "overrides": overrides})
    publish(result, sentences, cfg, chosen, subject.tokenizer, out, subject.name, started,
            subject.said(result))
    return 0
