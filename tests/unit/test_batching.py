"""Token-budget batches with length bucketing."""

from __future__ import annotations

import numpy as np

from heads_lab.data.batching import Split, bucket, collate, epoch_batches, padding_fraction
from heads_lab.data.tokenizer import BOS, EOS, PAD


def _split(n: int = 500, seed: int = 0) -> Split:
    rng = np.random.default_rng(seed)
    src = [rng.integers(4, 100, rng.integers(1, 30)).astype(np.int32) for _ in range(n)]
    tgt = [rng.integers(4, 100, max(1, len(s) + rng.integers(-3, 4))).astype(np.int32) for s in src]
    return Split([""] * n, [""] * n, src, tgt)


def test_every_example_once_and_within_the_token_budget():
    split = _split()
    batches = epoch_batches(split, max_tokens=256, seed=1, epoch=0)
    ids = np.concatenate(batches)
    assert sorted(ids.tolist()) == list(range(len(split)))
    longest = np.maximum(split.src_lens, split.tgt_lens)
    for b in batches:
        assert len(b) * longest[b].max() <= 256


def test_batches_are_deterministic_per_seed_and_epoch():
    split = _split()
    a = epoch_batches(split, 256, seed=1, epoch=0)
    b = epoch_batches(split, 256, seed=1, epoch=0)
    c = epoch_batches(split, 256, seed=1, epoch=1)
    assert all(np.array_equal(x, y) for x, y in zip(a, b)) and len(a) == len(b)
    assert not all(np.array_equal(x, y) for x, y in zip(a, c))


def test_bucketing_keeps_padding_low():
    split = _split(2000)
    bucketed = epoch_batches(split, 1024, seed=1, epoch=0)
    rng = np.random.default_rng(0)
    order = rng.permutation(len(split))
    size = int(np.mean([len(b) for b in bucketed]))
    unsorted = [order[i : i + size] for i in range(0, len(order), size)]
    assert padding_fraction(split, bucketed) < 0.15
    assert padding_fraction(split, bucketed) < padding_fraction(split, unsorted) / 2


def test_max_sentences_caps_batch_size():
    split = _split()
    assert max(len(b) for b in bucket(split.src_lens, split.tgt_lens, 10**6, max_sentences=7)) == 7


def test_collate_places_bos_eos_and_padding():
    split = Split(["", ""], ["", ""], [np.array([5, 6, 7]), np.array([8])],
                  [np.array([9, 10]), np.array([11, 12, 13, 14])])
    batch = collate(split, np.array([0, 1]))
    assert batch.src.tolist() == [[5, 6, 7, EOS], [8, EOS, PAD, PAD]]
    assert batch.tgt_in.tolist() == [[BOS, 9, 10, PAD, PAD], [BOS, 11, 12, 13, 14]]
    assert batch.tgt_out.tolist() == [[9, 10, EOS, PAD, PAD], [11, 12, 13, 14, EOS]]
    assert int((batch.tgt_out != PAD).sum()) == 3 + 5
