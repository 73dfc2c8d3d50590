"""Data: a source of parallel text → a cached joint tokenizer → encoded splits."""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from heads_lab.config.schemas import DataConfig, SyntheticDataConfig
from heads_lab.data.batching import Batch, Split, bucket, collate, epoch_batches
from heads_lab.data.cleaning import keep_encoded, summary
from heads_lab.data.corpus import load_or_build
from heads_lab.data.lm import prepare_lm
from heads_lab.data.synthetic import generate
from heads_lab.data.tokenizer import Tokenizer, train_or_load
from heads_lab.errors import DataError

log = logging.getLogger(__name__)

__all__ = ["Batch", "Corpus", "Split", "Tokenizer", "bucket", "collate", "epoch_batches",
           "prepare", "train_subset"]


@dataclass
class Corpus:
    tokenizer: Tokenizer
    splits: dict[str, Split]
    stats: dict[str, Any] = field(default_factory=dict)  # pairs read / dropped / kept per split
    annotations: dict[str, list] = field(default_factory=dict)  # synthetic: Pair objects by split
    lm: str | None = None  # a language model's text: documents | sentences | repeats


SUBSET_SEED = 20261126  # the training subsets' own permutation: the same for every run


def train_subset(split: Split, fraction: float) -> tuple[Split, np.ndarray]:
    """The fixed share `fraction` of `split`'s pairs (data.train_fraction): the first
    round(fraction · n) (at least 1) of one permutation drawn with SUBSET_SEED, in corpus order,
    so that every seed and model trains on the same sentences and a smaller share is a subset
    of a larger one. Returns (the subset, its indices in `split`)."""
    n = len(split)
    k = max(1, int(round(fraction * n)))
    chosen = np.sort(np.random.default_rng(SUBSET_SEED).permutation(n)[:k])
    def pick(items):
        return None if items is None else [items[i] for i in chosen]

    return Split(pick(split.src_text), pick(split.tgt_text), pick(split.src),
                 pick(split.tgt), split.open_end,
                 None if split.bytes is None else split.bytes[chosen], pick(split.repeats)), chosen


def prepare(cfg: DataConfig, cache_root: Path, task: str = "translate") -> Corpus:
    """The encoded corpus of `cfg`: real sources through the streamed, cached pipeline
    (heads_lab.data.corpus); the synthetic pair is generated and encoded in memory (it is small
    and fast, and its annotations are needed too). Training pairs failing the subword filters
    are dropped; every split's counts are in `stats`. With task=lm, a language model's text:
    documents, one side's sentences or repeats (heads_lab.data.lm; `lm` says which kind)."""
    if task == "lm":
        text = prepare_lm(cfg, cache_root)
        return Corpus(text.tokenizer, text.splits, text.stats, lm=text.kind)
    if not isinstance(cfg, SyntheticDataConfig):
        tokenizer, splits, stats = load_or_build(cfg, cache_root)
        return Corpus(tokenizer, splits, {**stats, "vocab_size": len(tokenizer)})
    pairs = generate(cfg)
    train_text = [p.src_text for p in pairs["train"]] + [p.tgt_text for p in pairs["train"]]
    tokenizer, cached = train_or_load(train_text, cfg.vocab_size, cfg.tokenizer, cache_root)
    log.info("tokenizer %s (%d pieces, %s)", tokenizer.path.name, len(tokenizer),
             "cached" if cached else "trained")
    splits, stats, annotations = {}, {}, {}
    for name, items in pairs.items():
        src, tgt = [p.src_text for p in items], [p.tgt_text for p in items]
        src_ids, tgt_ids = tokenizer.encode(src), tokenizer.encode(tgt)
        counts = Counter(read=len(items))
        keep = [i for i in range(len(items)) if name != "train" or
                keep_encoded(len(src_ids[i]), len(tgt_ids[i]), cfg.max_len,
                             cfg.cleaning.max_ratio, counts)]
        counts["kept"] = len(keep)
        if not keep:
            raise DataError(f"the {name} split of data={cfg.name} is empty after filtering "
                            f"(data.max_len={cfg.max_len}): nothing to train on")
        stats[name] = summary(counts)
        splits[name] = Split([src[i] for i in keep], [tgt[i] for i in keep],
                             [src_ids[i] for i in keep], [tgt_ids[i] for i in keep])
        annotations[name] = [items[i] for i in keep]
    stats["vocab_size"] = len(tokenizer)
    stats["tokenizer_cached"] = cached
    return Corpus(tokenizer, splits, stats, annotations)
