"""Michel et al. 2019's iterative pruning of an `hf:` model: compute head importance under the
current mask, mask the prune.step least important heads still in scope, evaluate, repeat until
every head in scope is masked; one curve per attention type in prune.sites the model has and one
over them together. Heads are masked (their outputs zeroed where they enter the output
projection, heads_lab.hf.heads), not removed: parameters stay as they are.

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

from heads_lab.analysis.importance import least_important
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


def curves(pre: Pretrained, importance_data: tuple, eval_data: tuple, sites: list[str],
           step: float, beam: int, device="cpu", say=print) -> dict[str, list[dict[str, Any]]]:
    """{scope: rows}: each row the fraction of the scope's heads masked, how many per site are
    kept, the task metric and which heads are masked. `importance_data` = (src, tgt) where the
    importance is measured, `eval_data` = (src, tgt, refs) where the metric is."""
    have = [s for s in sites if any(key[0] == s for key in pre.heads)]
    scopes = [[s] for s in have] + ([have] if len(have) > 1 else [])
    start = _row(pre, {}, eval_data, beam, device, 0.0)
    out = {}
    for scope in scopes:
        name = "+".join(scope) if len(scope) > 1 else scope[0]
        keys = [key for key in pre.heads if key[0] in scope]
        in_scope = sum(pre.heads[key] for key in keys)
        per_step = max(1, round(step * in_scope))
        masked: dict[tuple[str, int], list[int]] = {}
        rows = [start]
        while sum(len(v) for v in masked.values()) < in_scope:
            with hf_heads.masked(pre, masked):
                scores = hf_heads.importance(pre, *importance_data, device)
            in_keys = {(site, layer): scores[(site, layer, "head")] for site, layer in keys}
            for site, layer, h in least_important(in_keys, masked, per_step):
                masked.setdefault((site, layer), []).append(h)
            n = sum(len(v) for v in masked.values())
            row = _row(pre, masked, eval_data, beam, device, n / in_scope)
            rows.append(row)
            say(f"importance pruning {name}: {n}/{in_scope} heads masked → "
                + ", ".join(f"{k} {row[k]:.3f}" for k in ("bleu", "accuracy", "ppl") if k in row))
        out[name] = rows
    return out


def _row(pre: Pretrained, masked: dict, eval_data: tuple, beam: int, device,
         fraction: float) -> dict[str, Any]:
    ev = evaluate(pre, *eval_data, masked, beam, device)
    kept = {}
    for (site, layer), n in pre.heads.items():
        kept[site] = kept.get(site, 0) + n - len(masked.get((site, layer), []))
    return {"fraction": fraction, "pruned_heads": sum(len(v) for v in masked.values()),
            "kept": kept, **{k: v for k, v in ev.items() if k != "tokens"},
            "masked": ",".join(f"{site}:{layer}:{h}" for (site, layer), hs in sorted(masked.items())
                               for h in sorted(hs))}
