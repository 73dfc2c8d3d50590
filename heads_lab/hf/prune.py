"""A point of Michel et al. 2019's iterative pruning of an `hf:` model (the loop is
heads_lab.analysis.subject.importance_curves): its task metric with heads masked (their outputs
zeroed where they enter the output projection, heads_lab.hf.heads), not removed: parameters
stay as they are.

The task metric is the family's: a translator's BLEU and chrF (sacrebleu, on beam-search
translations of the first prune.eval_sentences of the evaluation split) and its reference
perplexity; an encoder's masked-LM loss, perplexity and top-1 accuracy on the masked tokens (the
same fixed 15 % of tokens every time: heads_lab.hf.heads.masked_lm).
"""

from __future__ import annotations

import logging
import math
from typing import Any

import torch

from heads_lab.hf import heads as hf_heads
from heads_lab.hf.models import Pretrained

log = logging.getLogger(__name__)


@torch.no_grad()
def evaluate(pre: Pretrained, src: list[list[int]], tgt: list[list[int]] | None,
             refs: list[str] | None, masked: dict, beam: int, device="cpu",
             batch_size: int = 16) -> dict[str, Any]:
    """The task metric with `masked` heads zeroed (see the module doc)."""
    from heads_lab.training.evaluate import score  # lazy: start-up time (torch, sacrebleu)

    losses, tokens, correct = 0.0, 0, 0
    hyps: list[str] = []
    with hf_heads.masked(pre, masked):
        for start in range(0, len(src), batch_size):
            part = src[start:start + batch_size]
            part_tgt = tgt[start:start + batch_size] if tgt is not None else None
            b = hf_heads.batch(pre, part, part_tgt, device, mlm=not pre.family.seq2seq)
            out = pre.model(**b.kwargs)
            labels = b.kwargs["labels"]
            n = int((labels != -100).sum())
            losses += float(out.loss) * n
            tokens += n
            if not pre.family.seq2seq:
                hit = (out.logits.argmax(-1) == labels) & (labels != -100)
                correct += int(hit.sum())
            elif refs is not None:
                generated = pre.model.generate(
                    input_ids=b.kwargs["input_ids"], attention_mask=b.kwargs["attention_mask"],
                    num_beams=beam, max_new_tokens=int(1.5 * b.kwargs["input_ids"].shape[1]) + 10)
                hyps += pre.tokens.decode(generated.tolist())
    loss = losses / max(tokens, 1)
    row = {"loss": loss, "ppl": math.exp(min(loss, 50.0)), "tokens": tokens}
    if pre.family.seq2seq:
        s = score(hyps, refs, None)
        row |= {"bleu": s["bleu"], "chrf": s["chrf"], "bleu_signature": s["bleu_signature"]}
    else:
        row["accuracy"] = correct / max(tokens, 1)
    return row


def row(pre: Pretrained, masked: dict, eval_data: tuple, beam: int, device,
         fraction: float) -> dict[str, Any]:
    ev = evaluate(pre, *eval_data, masked, beam, device)
    kept = {}
    for (site, layer), n in pre.heads.items():
        kept[site] = kept.get(site, 0) + n - len(masked.get((site, layer), []))
    return {"fraction": fraction, "pruned_heads": sum(len(v) for v in masked.values()),
            "kept": kept, **{k: v for k, v in ev.items() if k != "tokens"},
            "masked": ",".join(f"{site}:{layer}:{h}" for (site, layer), hs in sorted(masked.items())
                               for h in sorted(hs))}
