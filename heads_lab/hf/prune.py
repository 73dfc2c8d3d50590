"""A point of Michel et al. 2019's iterative pruning of an `hf:` model (the loop is
heads_lab.analysis.subject.importance_curves): its task metric with heads masked (their outputs
zeroed where they enter the output projection, heads_lab.hf.heads), not removed: parameters
stay as they are. A key/value group is pruned as all its query heads masked, which leaves the
model's output exactly as with the group's key/value head and query heads taken out.

The task metric is its task's (heads_lab/hf/tasks.py): a translator's BLEU and chrF (sacrebleu,
on beam-search translations of the first prune.eval_sentences of the evaluation split) and its
reference perplexity; an encoder's masked-LM loss, perplexity and top-1 accuracy on the masked
tokens (the same fixed 15 % of tokens every time); a language model's perplexity per token and
bits per byte of the texts.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from heads_lab.hf import heads as hf_heads
from heads_lab.hf.models import Pretrained
from heads_lab.hf.tasks import EvalData

log = logging.getLogger(__name__)


@torch.no_grad()
def evaluate(pre: Pretrained, data: EvalData, masked: dict, beam: int, device="cpu",
             batch_size: int = 16) -> dict[str, Any]:
    """The task metric with `masked` heads zeroed (see the module doc)."""
    with hf_heads.masked(pre, masked):
        return pre.task.evaluate(pre, data, device, batch_size, beam)


def row(pre: Pretrained, masked: dict, data: EvalData, beam: int, device,
        fraction: float) -> dict[str, Any]:
    ev = evaluate(pre, data, masked, beam, device)
    kept = {}
    for (site, layer), n in pre.heads.items():
        kept[site] = kept.get(site, 0) + n - len(masked.get((site, layer), []))
    return {"fraction": fraction, "pruned_heads": sum(len(v) for v in masked.values()),
            "kept": kept, **{k: v for k, v in ev.items() if k not in ("tokens", "bytes")},
            "masked": ",".join(f"{site}:{layer}:{h}" for (site, layer), hs in sorted(masked.items())
                               for h in sorted(hs))}
