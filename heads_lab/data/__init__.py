"""Data: a source of parallel text → a cached joint tokenizer → encoded splits."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from heads_lab.config import DataConfig, SyntheticDataConfig
from heads_lab.data.batching import Batch, Split, bucket, collate, epoch_batches
from heads_lab.data.tokenizer import Tokenizer, train_or_load
from heads_lab.errors import ConfigError, DataError

log = logging.getLogger(__name__)

__all__ = ["Batch", "Corpus", "Split", "Tokenizer", "bucket", "collate", "epoch_batches",
           "prepare"]


@dataclass
class Corpus:
    tokenizer: Tokenizer
    splits: dict[str, Split]
    stats: dict[str, Any] = field(default_factory=dict)  # pairs read / dropped / kept per split
    annotations: dict[str, list] = field(default_factory=dict)  # synthetic: Pair objects by split


def _load_texts(cfg: DataConfig) -> tuple[dict[str, tuple[list[str], list[str]]], dict[str, list]]:
    """Raw (source, target) texts per split, plus any annotations the source provides."""
    if isinstance(cfg, SyntheticDataConfig):
        from heads_lab.data.synthetic import generate

        pairs = generate(cfg)
        texts = {k: ([p.src_text for p in v], [p.tgt_text for p in v]) for k, v in pairs.items()}
        return texts, pairs
    raise ConfigError(f"data={cfg.name!r} is not a known data source: use data=synthetic")


def prepare(cfg: DataConfig, cache_root: Path) -> Corpus:
    """Load the texts, train (or load) the joint tokenizer on the training split, encode all
    splits, and drop training pairs longer than `cfg.max_len` subwords (counted in `stats`)."""
    texts, annotations = _load_texts(cfg)
    for name, (src, _) in texts.items():
        if not src:
            raise DataError(f"the {name} split of data={cfg.name} is empty: nothing to train on")
    train_src, train_tgt = texts["train"]
    tokenizer, cached = train_or_load(train_src + train_tgt, cfg.vocab_size, cfg.tokenizer,
                                      cache_root)
    log.info("tokenizer %s (%d pieces, %s)", tokenizer.path.name, len(tokenizer),
             "cached" if cached else "trained")
    splits, stats = {}, {}
    for name, (src, tgt) in texts.items():
        src_ids = [np.asarray(x, dtype=np.int32) for x in tokenizer.encode(src)]
        tgt_ids = [np.asarray(x, dtype=np.int32) for x in tokenizer.encode(tgt)]
        keep = list(range(len(src)))
        if name == "train":
            keep = [i for i in keep if len(src_ids[i]) <= cfg.max_len and len(tgt_ids[i]) <= cfg.max_len]
        stats[name] = {"read": len(src), "dropped_too_long": len(src) - len(keep), "kept": len(keep)}
        splits[name] = Split([src[i] for i in keep], [tgt[i] for i in keep],
                             [src_ids[i] for i in keep], [tgt_ids[i] for i in keep])
        if name in annotations and len(keep) < len(src):
            annotations[name] = [annotations[name][i] for i in keep]
    if not len(splits["train"]):
        raise DataError(f"every training pair is longer than data.max_len={cfg.max_len}: raise it")
    stats["vocab_size"] = len(tokenizer)
    stats["tokenizer_cached"] = cached
    return Corpus(tokenizer, splits, stats, annotations)
