"""Greedy and beam-search decoding with a key/value cache.

The cache grows the decoder self-attention keys/values by one position per step and projects
the encoder memory for cross-attention once; `use_cache=False` recomputes the whole prefix every
step (the reference the cached path must match). Beam search keeps, per sentence, K alive and K
finished hypotheses as tensors (Tensor2Tensor style): finished ones are ranked by the GNMT
length-normalised score log p(y) / ((5 + |y|) / 6)^α, and a sentence stops once no alive
hypothesis can beat its worst finished one.
"""

from __future__ import annotations

import torch
from torch import Tensor

from heads_lab.data.tokenizer import BOS, EOS, PAD
from heads_lab.model import Encoded, Transformer, reorder_cache


class _Stepper:
    """Next-token log-probabilities for the last position of each row, cached or not."""

    def __init__(self, model: Transformer, enc: Encoded, use_cache: bool, repeat: int = 1):
        # repeat: each sentence `repeat` times in a row (beam search's k hypotheses)
        self.model, self.enc = model, enc.repeat(repeat) if repeat > 1 else enc
        self.caches = model.new_caches() if use_cache else None
        if self.caches is not None and repeat > 1:  # memory keys/values once per sentence
            for layer, cache in zip(model.decoder, self.caches):
                layer.cross_attn.cache_memory(cache["cross"], enc.memory, repeat)

    def __call__(self, prefix: Tensor) -> Tensor:
        # prefix [rows, t] (BOS first) → log-probs [rows, vocab] of token t+1
        t = prefix.shape[1] - 1
        if self.caches is not None:
            hidden = self.model.decode(prefix[:, -1:], self.enc, caches=self.caches, offset=t)
        else:
            hidden = self.model.decode(prefix, self.enc)
        lprobs = self.model.logits(hidden[:, -1]).float().log_softmax(dim=-1)
        lprobs[:, PAD] = lprobs[:, BOS] = float("-inf")
        return lprobs

    def reorder(self, rows: Tensor) -> None:
        if self.caches is not None:
            reorder_cache([c["self"] for c in self.caches], rows)


def max_length(model: Transformer, src: Tensor, a: float, b: int) -> int:
    """Output length limit for a batch: a · (longest source) + b, within the model's positions."""
    return max(1, min(int(a * src.shape[1] + b), model.cfg.max_positions - 1))


@torch.no_grad()
def greedy(model: Transformer, src: Tensor, max_len: int, use_cache: bool = True,
           min_len: int = 0) -> list[list[int]]:
    """src [batch, src] → token ids per sentence (without BOS/EOS), at least `min_len` tokens."""
    step = _Stepper(model, model.encode(src), use_cache)
    prefix = torch.full((src.shape[0], 1), BOS, dtype=torch.long, device=src.device)
    done = torch.zeros(src.shape[0], dtype=torch.bool, device=src.device)
    for t in range(max_len):
        lprobs = _constrain(step(prefix), t, min_len, max_len)
        token = lprobs.argmax(dim=-1).masked_fill(done, PAD)
        prefix = torch.cat([prefix, token[:, None]], dim=1)
        done |= token == EOS
        if done.all():
            break
    return [_strip(row) for row in prefix[:, 1:].tolist()]


@torch.no_grad()
def beam_search(
    model: Transformer, src: Tensor, beam: int, lenpen: float, max_len: int, use_cache: bool = True,
    min_len: int = 0,
) -> list[list[int]]:
    """src [batch, src] → the best hypothesis per sentence by length-normalised score."""
    n, k = src.shape[0], beam
    device = src.device
    step = _Stepper(model, model.encode(src), use_cache, repeat=k)
    vocab = model.vocab_size
    alive = torch.full((n, k, 1), BOS, dtype=torch.long, device=device)  # [sentence, beam, t]
    alive_lp = torch.full((n, k), float("-inf"), device=device)
    alive_lp[:, 0] = 0.0  # the first step expands one beam only
    finished = torch.full((n, k, 1), PAD, dtype=torch.long, device=device)
    finished_score = torch.full((n, k), float("-inf"), device=device)
    row_base = (torch.arange(n, device=device) * k)[:, None]

    def penalty(length: int) -> float:
        return ((5.0 + length) / 6.0) ** lenpen

    for t in range(max_len):
        lprobs = _constrain(step(alive.view(n * k, -1)), t, min_len, max_len).view(n, k, vocab)
        # candidates [sentence, 2k]: enough that k of them do not end in EOS
        scores, flat = (alive_lp[..., None] + lprobs).view(n, k * vocab).topk(2 * k, dim=-1)
        origin, token = flat // vocab, flat % vocab
        seqs = torch.cat([alive.gather(1, origin[..., None].expand(-1, -1, t + 1)), token[..., None]], 2)
        is_eos = token == EOS

        alive_lp, pick = scores.masked_fill(is_eos, float("-inf")).topk(k, dim=-1)
        alive = seqs.gather(1, pick[..., None].expand(-1, -1, t + 2))
        step.reorder((row_base + origin.gather(1, pick)).view(-1))

        ended = (scores / penalty(t + 1)).masked_fill(~is_eos, float("-inf"))
        finished = torch.cat([torch.nn.functional.pad(finished, (0, 1), value=PAD), seqs], 1)
        finished_score, pick = torch.cat([finished_score, ended], 1).topk(k, dim=-1)
        finished = finished.gather(1, pick[..., None].expand(-1, -1, t + 2))

        best_alive = alive_lp[:, 0] / penalty(max_len)  # the most any alive beam can still score
        if (finished_score[:, -1] >= best_alive).all():
            break
    return [_strip(row[1:]) for row in finished[:, 0].tolist()]


def _constrain(lprobs: Tensor, t: int, min_len: int, max_len: int) -> Tensor:
    """Step t (0-based) may not end before min_len tokens and must end at the length limit."""
    if t < min_len:
        lprobs[:, EOS] = float("-inf")
    if t == max_len - 1:
        lprobs[:, :EOS] = lprobs[:, EOS + 1 :] = float("-inf")
    return lprobs


def _strip(ids: list[int]) -> list[int]:
    out = []
    for i in ids:
        if i in (EOS, PAD):
            break
        out.append(i)
    return out


def decode_batch(model, src, beam: int, lenpen: float, max_len_a: float, max_len_b: int):
    """Greedy when beam == 1, beam search otherwise."""
    limit = max_length(model, src, max_len_a, max_len_b)
    if beam == 1:
        return greedy(model, src, limit)
    return beam_search(model, src, beam, lenpen, limit)
