"""The preprocessed corpus cache: read → clean → tokenizer → encode, once per setting.

A cache entry is a dir keyed by a hash of the data and cleaning settings, the tokenizer settings
and the sources' fingerprints (file path/size/mtime, or the dataset's fingerprint). It holds the
SentencePiece model, per split and side a flat token file (uint16 or int32) with an offsets
array, memory-mapped on load, and the held-out texts. It is built in a temp dir and renamed into
place, under a file lock, so concurrent jobs of a sweep build it once and never read half of it.
Everything streams: the text is read twice (tokenizer training, then encoding in chunks on all
cores), never held in memory, and training memory does not grow with the corpus.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import json
import logging
import os
import shutil
import tempfile
import time
from array import array
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import sentencepiece as spm

from heads_lab.config.schemas import DataConfig
from heads_lab.data.batching import Split, TokenArray
from heads_lab.data.cleaning import clean, keep_encoded, summary
from heads_lab.data.sources import SPLITS, open_source
from heads_lab.data.tokenizer import Tokenizer, train_tokenizer
from heads_lab.errors import DataError

log = logging.getLogger(__name__)
CORPUS_VERSION = 1  # bump when the cache layout or the cleaning code changes meaning
CHUNK = 20_000  # pairs encoded at a time


def load_or_build(cfg: DataConfig, cache_root: Path):
    """The corpus of `cfg`, from the cache or built into it. Returns (tokenizer, splits, stats)."""
    readers = open_source(cfg)
    material = {"version": CORPUS_VERSION, "sentencepiece": spm.__version__,
                "data": dataclasses.asdict(cfg),
                "sources": {s: readers[s].fingerprint for s in SPLITS}}
    key = hashlib.sha256(json.dumps(material, sort_keys=True, default=str).encode()).hexdigest()
    root = Path(cache_root) / "corpora"
    entry = root / f"{cfg.name}-{cfg.src}-{cfg.tgt}-{key[:16]}"
    if not (entry / "meta.json").is_file():
        root.mkdir(parents=True, exist_ok=True)
        with _locked(root / f"{entry.name}.lock"):
            if not (entry / "meta.json").is_file():  # another job may have built it meanwhile
                _build(cfg, readers, material, entry)
    else:
        log.info("corpus cache hit: %s", entry)
    return _load(entry)


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    with open(path, "a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log.info("waiting for another job building the same corpus cache (%s)", path)
            fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _build(cfg: DataConfig, readers, material: dict, entry: Path) -> None:
    started = time.perf_counter()
    tmp = Path(tempfile.mkdtemp(prefix=f".{entry.name}-", dir=entry.parent))
    try:
        counts = {s: Counter() for s in SPLITS}
        for split in SPLITS:  # pass 1: read and clean into a compact TSV
            log.info("reading %s split: %s", split, readers[split].description)
            limit = cfg.max_train_pairs if split == "train" else None
            written = 0
            with open(tmp / f"{split}.tsv", "w", encoding="utf-8") as out:
                for src, tgt in clean(readers[split].read(), cfg.cleaning, split == "train",
                                      counts[split], limit):
                    out.write(f"{src}\t{tgt}\n")
                    written += 1
            if not written:  # before the tokenizer, which would blame its vocabulary size
                dropped = "".join(f", {n:,} {why}" for why, n in counts[split].items()
                                  if why != "read" and n)
                raise DataError(f"the {split} split of data={cfg.name} is empty: "
                                f"{readers[split].description} gave {counts[split]['read']:,} "
                                f"pairs{dropped}; check the files (data.root, data.pattern) "
                                "and the cleaning filters")
        log.info("training the %s tokenizer (%d pieces)", cfg.tokenizer, cfg.vocab_size)
        train_tokenizer(_sides(tmp / "train.tsv"), cfg.vocab_size, cfg.tokenizer, tmp / "spm.model")
        sp = spm.SentencePieceProcessor(model_file=str(tmp / "spm.model"))
        dtype = np.uint16 if sp.get_piece_size() <= 2**16 else np.int32
        for split in SPLITS:  # pass 2: encode in chunks on every core
            _encode(sp, tmp, split, dtype, cfg, counts[split])
            if not counts[split]["kept"]:
                raise DataError(f"the {split} split of data={cfg.name} is empty after cleaning "
                                f"({summary(counts[split])}); check the files and filters")
        (tmp / "train.tsv").unlink()  # held-out texts stay (references); training text not needed
        meta = {"key": material, "dtype": np.dtype(dtype).name, "vocab_size": sp.get_piece_size(),
                "stats": {s: summary(counts[s]) for s in SPLITS},
                "build_s": time.perf_counter() - started}
        if readers["train"].info is not None:  # e.g. Tatoeba: the file's sha256, split counts
            meta["source"] = readers["train"].info()
        (tmp / "meta.json").write_text(json.dumps(meta, indent=2, default=str))
        os.replace(tmp, entry)  # atomic: readers see all of it or nothing
        log.info("corpus cache built in %.1fs: %s", meta["build_s"], entry)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _tsv(path: Path) -> Iterator[tuple[str, str]]:
    with open(path, encoding="utf-8") as f:
        for line in f:
            src, tgt = line.rstrip("\n").split("\t")
            yield src, tgt


def _sides(path: Path) -> Iterator[str]:
    for src, tgt in _tsv(path):
        yield src
        yield tgt


def _chunks(it, size: int):
    chunk = []
    for item in it:
        chunk.append(item)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def _encode(sp, tmp: Path, split: str, dtype, cfg: DataConfig, counts: Counter) -> None:
    threads = os.cpu_count() or 1
    train = split == "train"
    lengths = {"src": array("i"), "tgt": array("i")}  # 4 bytes a sentence, not a Python int
    files = {side: open(tmp / f"{split}.{side}.bin", "wb") for side in lengths}
    try:
        for chunk in _chunks(_tsv(tmp / f"{split}.tsv"), CHUNK):
            src_ids = sp.encode([s for s, _ in chunk], num_threads=threads)
            tgt_ids = sp.encode([t for _, t in chunk], num_threads=threads)
            for s, t in zip(src_ids, tgt_ids):
                if train and not keep_encoded(len(s), len(t), cfg.max_len,
                                              cfg.cleaning.max_ratio, counts):
                    continue
                for side, ids in (("src", s), ("tgt", t)):
                    np.asarray(ids, dtype=dtype).tofile(files[side])
                    lengths[side].append(len(ids))
                counts["kept"] += 1
    finally:
        for f in files.values():
            f.close()
    for side, lens in lengths.items():
        offsets = np.zeros(len(lens) + 1, dtype=np.int64)
        np.cumsum(np.frombuffer(lens, dtype=np.int32), out=offsets[1:])
        np.save(tmp / f"{split}.{side}.off.npy", offsets)


def _load(entry: Path):
    meta = json.loads((entry / "meta.json").read_text())
    dtype = np.dtype(meta["dtype"])
    splits = {}
    for split in SPLITS:
        arrays = {}
        for side in ("src", "tgt"):
            offsets = np.load(entry / f"{split}.{side}.off.npy", mmap_mode="r")
            data = np.memmap(entry / f"{split}.{side}.bin", dtype=dtype, mode="r")
            arrays[side] = TokenArray(data, offsets)
        texts = list(_tsv(entry / f"{split}.tsv")) if split != "train" else None
        splits[split] = Split([s for s, _ in texts] if texts else None,
                              [t for _, t in texts] if texts else None,
                              arrays["src"], arrays["tgt"])
    stats = {**meta["stats"], "cache_dir": str(entry), "build_s": meta["build_s"]}
    if "source" in meta:
        stats["source"] = meta["source"]
    return Tokenizer(entry / "spm.model"), splits, stats
