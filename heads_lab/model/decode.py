"""Greedy and beam-search decoding with a key/value cache.

The cache grows the decoder self-attention keys/values by one position per step (in a buffer
made once, as long as the length limit) and projects the encoder memory for cross-attention
once per sentence (a sentence's beams attend to it as one block of queries); `use_cache=False`
recomputes the whole prefix every step (the reference the cached path must match). Beam search
keeps, per sentence, K alive and K finished hypotheses as tensors (Tensor2Tensor style):
finished ones are ranked by the GNMT length-normalised score log p(y) / ((5 + |y|) / 6)^α, and
a sentence stops once no alive hypothesis can beat its worst finished one.

Per step, what a profile of 64 sentences × 20 steps on CPU showed worth removing is gone: greedy
ranks logits (no log-softmax) in the dtype they come in (under bf16 autocast, copying each
step's [rows, vocab] logits to fp32 was 12 % of greedy decoding's profiled self time, 1.02× end to
end; bf16 → fp32 is exact, so the ranking is the same), candidates come from `top_k`
(vectorised, not torch's element-by-element CPU top-k over a sentence's k · vocab scores), and
the output layer uses a weight laid out once for the whole decode
(`Transformer.decoding_logits`).
"""

from __future__ import annotations

import torch
from torch import Tensor

from heads_lab.data.tokenizer import BOS, EOS, PAD
from heads_lab.model import Encoded, Transformer, reorder_cache


class _Stepper:
    """Next-token scores for the last position of each row, cached or not."""

    def __init__(self, model: Transformer, enc: Encoded, use_cache: bool, repeat: int = 1,
                 positions: int = 0):
        # repeat: each sentence `repeat` times in a row (beam search's k hypotheses); with the
        # cache, its memory's keys and values are computed and kept once per sentence
        self.model, self.enc, self.logits = model, enc, model.decoding_logits()
        self.caches = model.new_caches(positions) if use_cache else None
        if self.caches is not None:
            for layer, cache in zip(model.decoder, self.caches):
                layer.cross_attn.cache_memory(cache["cross"], enc.memory)
        elif repeat > 1:
            self.enc = enc.repeat(repeat)

    def __call__(self, prefix: Tensor) -> Tensor:
        # prefix [rows, t] (BOS first) → logits [rows, vocab] of token t+1, in the dtype the
        # model computed them in (bf16 under autocast: greedy ranks them as they are, beam search
        # takes their log-softmax in fp32; no separate fp32 copy of [rows, vocab] per step)
        t = prefix.shape[1] - 1
        if self.caches is not None:
            hidden = self.model.decode(prefix[:, -1:], self.enc, caches=self.caches, offset=t)
        else:
            hidden = self.model.decode(prefix, self.enc)
        return self.logits(hidden[:, -1])

    def reorder(self, rows: Tensor) -> None:
        if self.caches is not None:
            reorder_cache([c["self"] for c in self.caches], rows)


def max_length(model: Transformer, src: Tensor, a: float, b: int) -> int:
    """Output length limit for a batch: a · (longest source) + b, within the model's positions."""
    return max(1, min(int(a * src.shape[1] + b), model.cfg.max_positions - 1))


@torch.no_grad()
def greedy(model: Transformer, src: Tensor, max_len: int, use_cache: bool = True,
           min_len: int = 0) -> list[list[int]]:
    """src [batch, src] → token ids per sentence (without BOS/EOS), at least `min_len` tokens
    (the length limit max_len - 1 coming first)."""
    if src.shape[0] == 0:
        return []
    step = _Stepper(model, model.encode(src), use_cache, positions=max_len)
    prefix = torch.full((src.shape[0], 1), BOS, dtype=torch.long, device=src.device)
    done = torch.zeros(src.shape[0], dtype=torch.bool, device=src.device)
    for t in range(max_len):
        # a row's best logit is its best log-probability: no log-softmax needed
        token = top_k(_constrain(step(prefix), t, min_len, max_len), 1)[1][:, 0].masked_fill(done, PAD)
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
    if src.shape[0] == 0:
        return []
    n, k = src.shape[0], beam
    device = src.device
    step = _Stepper(model, model.encode(src), use_cache, repeat=k, positions=max_len)
    per_beam = min(2 * k, model.vocab_size)
    alive = torch.full((n, k, 1), BOS, dtype=torch.long, device=device)  # [sentence, beam, t]
    alive_lp = torch.full((n, k), float("-inf"), device=device)
    alive_lp[:, 0] = 0.0  # the first step expands one beam only
    finished = torch.full((n, k, 1), PAD, dtype=torch.long, device=device)
    finished_score = torch.full((n, k), float("-inf"), device=device)
    row_base = (torch.arange(n, device=device) * k)[:, None]

    def penalty(length: int) -> float:
        return ((5.0 + length) / 6.0) ** lenpen

    for t in range(max_len):
        lprobs = _constrain(step(alive.view(n * k, -1)).log_softmax(dim=-1, dtype=torch.float32),
                            t, min_len, max_len)
        # candidates [sentence, 2k], enough that k of them do not end in EOS: a sentence's best
        # 2k continuations are among its beams' own best 2k each, so only those are ranked
        best, word = top_k(lprobs, per_beam)  # [n · k, per_beam]
        scores = alive_lp[..., None] + best.view(n, k, per_beam)
        scores, flat = scores.view(n, k * per_beam).topk(2 * k, dim=-1)
        origin, token = flat // per_beam, word.view(n, k * per_beam).gather(1, flat)
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
    """Scores of step t (0-based), in place, with what may not come next at -inf: PAD and BOS
    never, EOS before min_len tokens (unless at the length limit), anything but EOS at the
    length limit."""
    lprobs[:, PAD] = lprobs[:, BOS] = float("-inf")
    if t < min_len and t < max_len - 1:
        lprobs[:, EOS] = float("-inf")
    if t == max_len - 1:
        lprobs[:, :EOS] = lprobs[:, EOS + 1 :] = float("-inf")
    return lprobs


def top_k(x: Tensor, k: int, depth: int = 16) -> tuple[Tensor, Tensor]:
    """The k largest entries of each row of x [rows, width] and their columns, largest first:
    `x.topk(k, dim=-1)` (which of several equal entries is taken aside), but several times
    faster over a vocabulary. torch's CPU top-k and argmax visit a row one element at a time,
    while its max-reductions are vectorised; so the first `depth · n` columns are dealt into n
    blocks (column j into block j mod n) and each block's maximum taken. A row's k largest
    entries lie in its k blocks with the largest maxima (each block holding one of them has a
    maximum at least the k-th largest entry, and at most k blocks can), so only those blocks'
    k · depth entries, and the few columns past depth · n, are ranked."""
    rows, width = x.shape
    n = width // depth
    if n <= 4 * k:  # narrow rows: nothing to gain
        return x.topk(k, dim=-1)
    dealt = x.as_strided((rows, depth, n), (x.stride(0), n * x.stride(1), x.stride(1)))
    blocks = dealt.amax(dim=1).topk(k, dim=-1).indices  # [rows, k]
    cols = (blocks[..., None] + torch.arange(0, depth * n, n, device=x.device)).view(rows, -1)
    if width > depth * n:
        tail = torch.arange(depth * n, width, device=x.device).expand(rows, -1)
        cols = torch.cat([cols, tail], dim=1)
    values, pick = x.gather(1, cols).topk(k, dim=-1)
    return values, cols.gather(1, pick)


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
