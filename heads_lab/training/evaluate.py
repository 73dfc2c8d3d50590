"""Evaluation: perplexity from teacher-forced NLL, and BLEU / chrF of decoded text by
sacrebleu (the only BLEU here), each score kept with sacrebleu's signature."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from sacrebleu.metrics import BLEU, CHRF

from heads_lab.config.schemas import EvalConfig
from heads_lab.data import Split, Tokenizer, bucket, collate
from heads_lab.model import Transformer, evaluating
from heads_lab.model.decode import decode_batch


@torch.no_grad()
def perplexity(model: Transformer, split: Split, max_tokens: int, device) -> dict[str, float]:
    """Mean NLL per target token (subwords + EOS, natural log) and its exponential, the PPL."""
    nll, tokens = 0.0, 0
    with evaluating(model):
        for ids in bucket(split.src_lens, split.tgt_lens, max_tokens):
            batch = collate(split, ids).to(device)
            keep = batch.tgt_out != model.pad_id
            hidden = model.decode(batch.tgt_in, model.encode(batch.src))[keep]
            nll += F.cross_entropy(model.logits(hidden).float(), batch.tgt_out[keep],
                                   reduction="sum").item()
            tokens += int(keep.sum())
    loss = nll / max(tokens, 1)
    return {"loss": loss, "ppl": math.exp(min(loss, 50.0)), "tokens": tokens}


@torch.no_grad()
def translate(model: Transformer, split: Split, tokenizer: Tokenizer, cfg: EvalConfig,
              device) -> list[str]:
    """Detokenized translations of every source sentence of `split`, in the split's order.
    Sentences are decoded in batches of similar length (at most cfg.max_sentences each)."""
    hyps: list[list[int]] = [[] for _ in range(len(split))]
    lens = split.src_lens
    with evaluating(model):
        for ids in bucket(lens, lens, max_tokens=cfg.max_sentences * int(lens.max()),
                          max_sentences=cfg.max_sentences):
            src = collate(split, ids).src.to(device)
            for i, out in zip(ids, decode_batch(model, src, cfg.beam, cfg.lenpen, cfg.max_len_a,
                                                cfg.max_len_b)):
                hyps[int(i)] = out
    return tokenizer.decode(hyps)


def score(hyps: list[str], refs: list[str], tokenize: str | None = None,
          all_refs: list[list[str]] | None = None) -> dict[str, object]:
    """Corpus BLEU and chrF of detokenized hypotheses against one reference each; with
    `all_refs` (every reference of each segment, its own first: Tatoeba's other translations)
    the same against all of them too (`bleu_multiref`, `chrf_multiref`: sacrebleu's
    several-reference scores, chrF taking each segment's best reference)."""
    bleu = BLEU(tokenize=tokenize) if tokenize else BLEU()
    chrf = CHRF()
    b = bleu.corpus_score(hyps, [refs])
    c = chrf.corpus_score(hyps, [refs])
    out = {
        "bleu": b.score,
        "chrf": c.score,
        "bleu_signature": str(bleu.get_signature()),
        "chrf_signature": str(chrf.get_signature()),
        "bleu_detail": str(b),
        "hyp_len_ratio": b.sys_len / max(b.ref_len, 1),
    }
    if all_refs is not None:
        out.update(multiref_score(hyps, all_refs, tokenize))
    return out


MULTIREF_RECORDS = ("bleu_multiref_signature", "chrf_multiref_signature", "multiref")


def multiref_metrics(split: str, scores: dict[str, object]) -> dict[str, float]:
    """results.json's multi-reference metrics, where the data has several references."""
    return {f"{split}/{k}": scores[k] for k in ("bleu_multiref", "chrf_multiref") if k in scores}


def multiref_score(hyps: list[str], all_refs: list[list[str]],
                   tokenize: str | None = None) -> dict[str, object]:
    """BLEU and chrF against every reference of each segment: sacrebleu's reference streams,
    a segment with fewer references than the most padded with None (sacrebleu skips those;
    its signature says nrefs:var)."""
    width = max(len(r) for r in all_refs)
    streams = [[r[k] if k < len(r) else None for r in all_refs] for k in range(width)]
    bleu = BLEU(tokenize=tokenize) if tokenize else BLEU()
    chrf = CHRF()
    return {
        "bleu_multiref": bleu.corpus_score(hyps, streams).score,
        "chrf_multiref": chrf.corpus_score(hyps, streams).score,
        "bleu_multiref_signature": str(bleu.get_signature()),
        "chrf_multiref_signature": str(chrf.get_signature()),
        "multiref": {"segments": len(all_refs),
                     "with_several": sum(len(r) > 1 for r in all_refs),
                     "references": sum(len(r) for r in all_refs)},
    }
