"""Encoded splits and batches by token budget with length bucketing (fairseq `max_tokens`):
sentences of similar length share a batch, so little compute goes to padding."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from heads_lab.data.tokenizer import BOS, EOS, PAD


class TokenArray:
    """Many token sequences in one flat array with offsets (memory-mapped for cached corpora):
    item i is data[offsets[i]:offsets[i + 1]]."""

    def __init__(self, data: np.ndarray, offsets: np.ndarray):
        self.data, self.offsets = data, offsets
        self.lengths = np.diff(offsets).astype(np.int32)  # 4 bytes a sentence

    @classmethod
    def from_list(cls, seqs: list) -> TokenArray:
        lengths = np.fromiter((len(s) for s in seqs), dtype=np.int64, count=len(seqs))
        offsets = np.zeros(len(seqs) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        data = np.concatenate([np.asarray(s, dtype=np.int32) for s in seqs]) if seqs else \
            np.zeros(0, dtype=np.int32)
        return cls(data, offsets)

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, i: int) -> np.ndarray:
        return self.data[self.offsets[i] : self.offsets[i + 1]]


@dataclass
class Split:
    """One split: its texts (held-out splits; None for a cached training split) and subword ids
    without BOS/EOS, as TokenArrays (lists of id arrays are converted). `open_end`: each target
    row is a block cut from a longer text (a language model's documents), so nothing is
    predicted after its last token (no EOS there: the text goes on in the next block)."""

    src_text: list[str] | None
    tgt_text: list[str] | None
    src: TokenArray
    tgt: TokenArray
    open_end: bool = False
    bytes: np.ndarray | None = None  # a language model's text: each row's scored UTF-8 bytes
    repeats: list | None = None  # data=repeats: each row's (prefix length, repeated length)

    def __post_init__(self) -> None:
        if not isinstance(self.src, TokenArray):
            self.src = TokenArray.from_list(self.src)
        if not isinstance(self.tgt, TokenArray):
            self.tgt = TokenArray.from_list(self.tgt)
        # lengths with the EOS (source) or BOS/EOS (target) position each side gets
        self.src_lens = self.src.lengths + 1
        self.tgt_lens = self.tgt.lengths + 1
        # the target tokens scored: the text and its EOS (a block: the text only)
        self.scored_lens = self.tgt.lengths + (0 if self.open_end else 1)

    def __len__(self) -> int:
        return len(self.src)

    def target_tokens(self) -> int:
        """Target tokens scored, EOS included where there is one: what perplexity and tokens/s
        count."""
        return int(self.scored_lens.sum())


@dataclass
class Batch:
    ids: np.ndarray  # example indices in the split
    src: Tensor  # [batch, src]  tokens + EOS, right-padded
    tgt_in: Tensor  # [batch, tgt] BOS + tokens
    tgt_out: Tensor  # [batch, tgt] tokens + EOS

    def to(self, device: torch.device) -> Batch:
        nb = device.type == "cuda"
        return Batch(self.ids, self.src.to(device, non_blocking=nb),
                     self.tgt_in.to(device, non_blocking=nb), self.tgt_out.to(device, non_blocking=nb))


def bucket(
    src_lens: np.ndarray,
    tgt_lens: np.ndarray,
    max_tokens: int,
    rng: np.random.Generator | None = None,
    max_sentences: int | None = None,
) -> list[np.ndarray]:
    """Indices grouped into batches of at most `max_tokens` padded tokens (batch size × the
    longest source or target in it). Sorted by length; with `rng`, ties are broken randomly and
    the batch order is shuffled (a new grouping each epoch)."""
    n = len(src_lens)
    tie = rng.random(n) if rng is not None else np.arange(n)
    order = np.lexsort((tie, tgt_lens, src_lens))
    longest = np.maximum(src_lens, tgt_lens)[order]
    batches, start, width = [], 0, 0
    for i in range(n):
        width = max(width, int(longest[i]))
        size = i - start + 1
        too_big = size * width > max_tokens or (max_sentences and size > max_sentences)
        if too_big and size > 1:  # a sentence alone over budget still gets a batch
            batches.append(order[start:i])
            start, width = i, int(longest[i])
    if start < n:
        batches.append(order[start:])
    if rng is not None:
        batches = [batches[i] for i in rng.permutation(len(batches))]
    return batches


def collate(split: Split, ids: np.ndarray) -> Batch:
    src = [split.src[i] for i in ids]
    tgt = [split.tgt[i] for i in ids]
    s_len, t_len = max(len(s) for s in src) + 1, max(len(t) for t in tgt) + 1
    src_arr = np.full((len(ids), s_len), PAD, dtype=np.int64)
    tgt_in = np.full((len(ids), t_len), PAD, dtype=np.int64)
    tgt_out = np.full((len(ids), t_len), PAD, dtype=np.int64)
    end = PAD if split.open_end else EOS  # a block's end predicts nothing (padding)
    for row, (s, t) in enumerate(zip(src, tgt)):
        src_arr[row, : len(s)], src_arr[row, len(s)] = s, EOS
        tgt_in[row, 0], tgt_in[row, 1 : len(t) + 1] = BOS, t
        tgt_out[row, : len(t)], tgt_out[row, len(t)] = t, end
    return Batch(ids, torch.from_numpy(src_arr), torch.from_numpy(tgt_in), torch.from_numpy(tgt_out))


def epoch_batches(split: Split, max_tokens: int, seed: int, epoch: int) -> list[np.ndarray]:
    """The training batches of one epoch: deterministic in (seed, epoch)."""
    rng = np.random.default_rng([seed, epoch])
    return bucket(split.src_lens, split.tgt_lens, max_tokens, rng)


def padding_fraction(split: Split, batches: list[np.ndarray]) -> float:
    """Fraction of source + target batch positions that are padding."""
    src_lens, tgt_lens = split.src_lens, split.tgt_lens
    real = padded = 0
    for ids in batches:
        real += int(src_lens[ids].sum() + tgt_lens[ids].sum())
        padded += len(ids) * int(src_lens[ids].max() + tgt_lens[ids].max())
    return 1.0 - real / max(padded, 1)
