"""A language model's data (task=lm): its text as the target side of a split (the source side
empty), one of three kinds.

- Documents (data=shakespeare): each split's works as one token stream, an EOS between works
  (and after the last), cut into non-overlapping blocks of data.block_size tokens. A block is
  read from the BOS and every token of it is predicted from the BOS and the block's tokens
  before it; nothing is predicted after its last token (the split's `open_end`), so every token
  of the stream is scored exactly once.
- Sentences (any translation corpus with task=lm: its data.src side): every sentence of that
  side, from all three of the corpus's splits, de-duplicated and shuffled with data.seed (never
  the training seed, so the held-out text is the same for every run), then data.held_out each
  for valid and test and the rest for training; each sentence a row from its BOS, its EOS
  predicted and scored.
- Repeats (data=repeats): random token sequences each repeated once after a random prefix
  (the induction-head control), token ids with no text.

The tokenizer (documents and sentences): SentencePiece BPE trained on the training text, with
byte fallback and no normalisation (no Unicode normal form, no whitespace folded, no space added
in front), a newline its own piece: decoding the ids gives the text back byte for byte, so every
byte is scored. Bits per byte divides the summed NLL (nats) by ln 2 and the UTF-8 bytes of the
scored text, an EOS counting one byte: each held-out row's byte count is its tokens' bytes
(`byte_lengths`) plus its EOS tokens, and a split's sum is its text's size (tested).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import tempfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import sentencepiece as spm

from heads_lab.config.data_schemas import (
    DataConfig,
    RepeatsDataConfig,
    ShakespeareDataConfig,
    SyntheticDataConfig,
)
from heads_lab.data.batching import Split
from heads_lab.data.tokenizer import BOS, EOS, PAD, UNK, Tokenizer, _vocab_error
from heads_lab.errors import DataError

log = logging.getLogger(__name__)
LM_CACHE_VERSION = 1


def _settings(vocab_size: int) -> dict:
    return dict(vocab_size=vocab_size, model_type="bpe", character_coverage=1.0,
                byte_fallback=True, normalization_rule_name="identity",
                remove_extra_whitespaces=False, add_dummy_prefix=False,
                allow_whitespace_only_pieces=True, split_digits=True,
                user_defined_symbols=["\n"], pad_id=PAD, unk_id=UNK, bos_id=BOS, eos_id=EOS,
                input_sentence_size=1_000_000, shuffle_input_sentence=True)


def lm_tokenizer(lines: list[str], vocab_size: int, cache_root: Path) -> Tokenizer:
    """The byte-exact tokenizer of training `lines` (see the module doc), cached by a hash of
    the lines and settings."""
    h = hashlib.sha256(json.dumps([LM_CACHE_VERSION, spm.__version__,
                                   _settings(vocab_size)]).encode())
    for line in lines:
        h.update(line.encode())
        h.update(b"\n")
    path = Path(cache_root) / "tokenizers" / f"spm-lm-{vocab_size}-{h.hexdigest()[:16]}.model"
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path.parent, suffix=".tmp", delete=False) as out:
            try:
                spm.SentencePieceTrainer.train(sentence_iterator=iter(lines), model_writer=out,
                                               num_threads=os.cpu_count() or 1, minloglevel=2,
                                               **_settings(vocab_size))
            except RuntimeError as err:
                os.unlink(out.name)
                raise _vocab_error(vocab_size, str(err)) from None
        os.replace(out.name, path)
    return Tokenizer(path)


def byte_lengths(tokenizer) -> np.ndarray:
    """UTF-8 bytes of the text each id stands for: a byte piece 1, a special token 0 (an EOS is
    counted apart, one byte each), a piece its characters (▁ a space)."""
    sp = getattr(tokenizer, "sp", None)
    if sp is None:  # a tokenizer of ids alone (data=repeats): no text, no bytes
        return np.zeros(len(tokenizer), dtype=np.int64)
    return np.array([1 if sp.is_byte(i) else 0 if sp.is_control(i) or sp.is_unknown(i)
                     else len(sp.id_to_piece(i).replace("▁", " ").encode("utf-8"))
                     for i in range(sp.get_piece_size())], dtype=np.int64)


def row_bytes(split: Split, lengths: np.ndarray) -> np.ndarray:
    """Each row's scored bytes: its tokens' (`byte_lengths`) and one per EOS scored (those in
    the row, and the one after it where the row is a sentence)."""
    out = np.zeros(len(split), dtype=np.int64)
    for i in range(len(split)):
        ids = np.asarray(split.tgt[i], dtype=np.int64)
        out[i] = int(lengths[ids].sum()) + int((ids == EOS).sum()) + (0 if split.open_end else 1)
    return out


class IdTokenizer:
    """A language without text (data=repeats): ids are tokens `t<id>`; 0-3 pad, unk, bos, eos."""

    pad, unk, bos, eos = PAD, UNK, BOS, EOS
    path = None

    def __init__(self, size: int):
        self.size = size

    def __len__(self) -> int:
        return self.size

    def encode(self, texts: list[str]) -> list[list[int]]:
        return [[int(t[1:]) for t in text.split()] for text in texts]

    def decode(self, ids: list[list[int]]) -> list[str]:
        return [" ".join(f"t{i}" for i in row if i > EOS) for row in ids]

    def pieces(self, ids: list[int]) -> list[str]:
        return [("<pad>", "<unk>", "<s>", "</s>")[i] if i <= EOS else f"t{i}" for i in ids]

    def encode_spans(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
        found = list(re.finditer(r"\S+", text))
        return [int(m.group()[1:]) for m in found], [(m.start(), m.end()) for m in found]


@dataclass
class LMText:
    """A language model's corpus before it is a Corpus: its kind, tokenizer and splits."""

    kind: str  # documents | sentences | repeats
    tokenizer: object
    splits: dict[str, Split]
    stats: dict


def shakespeare_root(cfg: ShakespeareDataConfig) -> Path:
    root = Path(cfg.root).expanduser() if cfg.root else None
    if root is None:
        data = os.environ.get("HEADS_LAB_DATA")
        root = Path(data) / "shakespeare" if data else None
    if root is None or not (root / "works").is_dir():
        where = f"{root}/works" if root else "$HEADS_LAB_DATA/shakespeare/works"
        raise DataError(f"data=shakespeare: no works/ dir at {where}; set HEADS_LAB_DATA to the "
                        "dir holding shakespeare/ (or data.root to the shakespeare dir)")
    return root


def _documents(cfg: ShakespeareDataConfig, cache_root: Path) -> LMText:
    root = shakespeare_root(cfg)
    works = {p.stem: p for p in sorted((root / "works").glob("*.txt"))}
    held = {"valid": list(cfg.valid), "test": list(cfg.test)}
    missing = [w for names in held.values() for w in names if w not in works]
    if missing:
        raise DataError(f"data=shakespeare: no work {missing[0]!r} in {root / 'works'}; choose "
                        f"from {', '.join(works)}")
    held["train"] = [w for w in works if w not in held["valid"] + held["test"]]
    texts = {name: [works[w].read_text(encoding="utf-8") for w in names]
             for name, names in held.items()}
    lines = [line for text in texts["train"] for line in text.split("\n") if line]
    tokenizer = lm_tokenizer(lines, cfg.vocab_size, cache_root)
    splits, stats = {}, {}
    for name, docs in texts.items():
        stream: list[int] = []
        for ids in tokenizer.encode(docs):
            stream += list(ids) + [EOS]
        blocks = [stream[i:i + cfg.block_size] for i in range(0, len(stream), cfg.block_size)]
        text = tokenizer.decode(blocks) if name != "train" else None
        splits[name] = Split(None, text, [[] for _ in blocks], blocks, open_end=True)
        stats[name] = {"works": held[name], "tokens": len(stream), "blocks": len(blocks),
                       "bytes": sum(len(d.encode("utf-8")) for d in docs) + len(docs)}
    return LMText("documents", tokenizer, splits, stats)


def _side(cfg: DataConfig) -> list[str]:
    """Every sentence of the corpus's data.src side, all splits, in the files' order."""
    if isinstance(cfg, SyntheticDataConfig):
        from heads_lab.data.synthetic import generate  # lazy: only for this corpus

        return [p.src_text for items in generate(cfg).values() for p in items]
    from heads_lab.data.sources import SPLITS, open_source  # lazy: start-up time

    readers = open_source(cfg)
    return [src for split in SPLITS for src, _ in readers[split].read()]


def _sentences(cfg: DataConfig, cache_root: Path) -> LMText:
    every = [s for s in (line.strip("\r\n") for line in _side(cfg)) if s.strip()]
    distinct = list(dict.fromkeys(every))
    if len(distinct) <= 2 * cfg.held_out:
        raise DataError(f"data={cfg.name} data.src={cfg.src}: {len(distinct):,} distinct "
                        f"sentences, not more than twice data.held_out={cfg.held_out}: lower "
                        "data.held_out")
    order = np.random.default_rng(cfg.seed).permutation(len(distinct))
    shuffled = [distinct[i] for i in order]
    parts = {"valid": shuffled[:cfg.held_out], "test": shuffled[cfg.held_out:2 * cfg.held_out],
             "train": shuffled[2 * cfg.held_out:]}
    tokenizer = lm_tokenizer(parts["train"], cfg.vocab_size, cache_root)
    splits, stats = {}, {}
    for name, sentences in parts.items():
        ids = tokenizer.encode(sentences)
        splits[name] = Split(None, sentences if name != "train" else None,
                             [[] for _ in ids], ids)
        stats[name] = {"sentences": len(ids), "tokens": sum(len(x) + 1 for x in ids),
                       "bytes": sum(len(s.encode("utf-8")) + 1 for s in sentences)}
    stats["side"] = {"language": cfg.src, "lines": len(every), "distinct": len(distinct),
                     "shuffle_seed": cfg.seed}
    return LMText("sentences", tokenizer, splits, stats)


def repeats(cfg: RepeatsDataConfig) -> dict[str, list[tuple[list[int], int, int]]]:
    """Per split, (tokens, prefix length, repeated length): a random prefix of 0 to
    data.max_prefix tokens, then x of data.min_repeat to data.max_repeat distinct tokens, then
    x again; tokens drawn from 4 .. vocab_size − 1, seeded by data.seed and the split."""
    sizes = {"train": cfg.train_size, "valid": cfg.valid_size, "test": cfg.test_size}
    out = {}
    for k, (name, n) in enumerate(sizes.items()):
        rng = np.random.default_rng([cfg.seed, k])
        rows = []
        for _ in range(n):
            p = int(rng.integers(0, cfg.max_prefix + 1))
            length = int(rng.integers(cfg.min_repeat, cfg.max_repeat + 1))
            prefix = rng.integers(EOS + 1, cfg.vocab_size, size=p).tolist()
            x = rng.choice(np.arange(EOS + 1, cfg.vocab_size), size=length, replace=False).tolist()
            rows.append((prefix + x + x, p, length))
        out[name] = rows
    return out


def _repeats(cfg: RepeatsDataConfig) -> LMText:
    if cfg.max_repeat > cfg.vocab_size - EOS - 1 or cfg.min_repeat > cfg.max_repeat:
        raise DataError(f"data=repeats: a repeat of {cfg.min_repeat}-{cfg.max_repeat} distinct "
                        f"tokens from {cfg.vocab_size - EOS - 1}: set data.min_repeat <= "
                        "data.max_repeat <= data.vocab_size - 4")
    tokenizer = IdTokenizer(cfg.vocab_size)
    splits, stats = {}, {}
    for name, rows in repeats(cfg).items():
        seqs = [r[0] for r in rows]
        splits[name] = Split(None, tokenizer.decode(seqs) if name != "train" else None,
                             [[] for _ in seqs], seqs, repeats=[(p, n) for _, p, n in rows])
        stats[name] = {"sequences": len(seqs), "tokens": sum(len(s) + 1 for s in seqs)}
    return LMText("repeats", tokenizer, splits, stats)


def prepare_lm(cfg: DataConfig, cache_root: Path) -> LMText:
    """The text of data `cfg` for a language model (see the module doc)."""
    if isinstance(cfg, ShakespeareDataConfig):
        text = _documents(cfg, cache_root)
    elif isinstance(cfg, RepeatsDataConfig):
        text = _repeats(cfg)
    else:
        text = _sentences(cfg, cache_root)
    lengths = byte_lengths(text.tokenizer)
    for name, split in text.splits.items():
        split.bytes = row_bytes(split, lengths) if text.kind != "repeats" else None
        text.stats[name] = dict(text.stats[name], **(
            {"scored_bytes": int(split.bytes.sum())} if split.bytes is not None else {}))
    text.stats["kind"] = text.kind
    text.stats["vocab_size"] = len(text.tokenizer)
    text.stats["counts"] = dict(Counter({k: len(v) for k, v in text.splits.items()}))
    return text
