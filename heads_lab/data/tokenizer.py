"""A joint source/target SentencePiece model, trained once per (training text, settings) and
cached on disk; later runs and every job of a sweep load it."""

from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
from collections.abc import Iterable
from pathlib import Path

import sentencepiece as spm

from heads_lab.errors import ConfigError

PAD, UNK, BOS, EOS = 0, 1, 2, 3
CACHE_VERSION = 2  # bump when what a cached model means changes


class Tokenizer:
    """Text ↔ subword ids. Ids 0-3 are pad, unk, bos, eos."""

    pad, unk, bos, eos = PAD, UNK, BOS, EOS

    def __init__(self, model_file: Path):
        self.path = Path(model_file)
        self.sp = spm.SentencePieceProcessor(model_file=str(model_file))

    def __len__(self) -> int:
        return self.sp.get_piece_size()

    def encode(self, texts: list[str]) -> list[list[int]]:
        return self.sp.encode(texts, num_threads=os.cpu_count() or 1)

    def decode(self, ids: list[list[int]]) -> list[str]:
        return self.sp.decode(ids)

    def pieces(self, ids: list[int]) -> list[str]:
        return [self.sp.id_to_piece(i) for i in ids]

    def encode_spans(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
        """The ids of one text and each piece's character span in it: SentencePiece maps its
        normalisation back, so a span covers the characters the piece came from (with its ▁
        space; a piece made by expanding one character, as "…" → "...", may be empty)."""
        out = self.sp.encode(text, return_type="offset_mapping")
        return list(out["ids"]), [tuple(span) for span in out["offsets"]]


def _settings(vocab_size: int, model_type: str) -> dict:
    return dict(vocab_size=vocab_size, model_type=model_type, character_coverage=1.0,
                pad_id=PAD, unk_id=UNK, bos_id=BOS, eos_id=EOS,
                input_sentence_size=1_000_000, shuffle_input_sentence=True)


def train_tokenizer(sentences: Iterable[str], vocab_size: int, model_type: str, path: Path) -> None:
    """Train a SentencePiece model on streamed sentences (SentencePiece samples at most 1 M of
    them, so memory stays bounded) and write it atomically to `path`; an impossible vocab size
    is a ConfigError."""
    path = Path(path)
    with tempfile.NamedTemporaryFile(dir=path.parent, suffix=".tmp", delete=False) as out:
        try:
            spm.SentencePieceTrainer.train(sentence_iterator=iter(sentences), model_writer=out,
                                           num_threads=os.cpu_count() or 1, minloglevel=2,
                                           **_settings(vocab_size, model_type))
        except RuntimeError as err:
            os.unlink(out.name)
            raise _vocab_error(vocab_size, str(err)) from None
    os.replace(out.name, path)  # atomic: concurrent sweep jobs never read a half-written model


def train_or_load(
    texts: list[str], vocab_size: int, model_type: str, cache_root: Path
) -> tuple[Tokenizer, bool]:
    """The tokenizer for these in-memory training texts and settings, trained on a cache miss.
    Returns (tokenizer, whether it came from the cache). The cache key hashes the settings and
    the text itself, so any change in data or cleaning makes a new model."""
    h = hashlib.sha256(json.dumps([CACHE_VERSION, spm.__version__,
                                   _settings(vocab_size, model_type)]).encode())
    for line in texts:
        h.update(line.encode())
        h.update(b"\n")
    path = Path(cache_root) / "tokenizers" / f"spm-{model_type}-{vocab_size}-{h.hexdigest()[:16]}.model"
    if path.is_file():
        return Tokenizer(path), True
    path.parent.mkdir(parents=True, exist_ok=True)
    train_tokenizer(texts, vocab_size, model_type, path)
    return Tokenizer(path), False


def _vocab_error(vocab_size: int, message: str) -> ConfigError:
    """SentencePiece's refusal of a vocabulary size, as a one-line config error."""
    too_large = re.search(r"value <= (\d+)", message)
    if too_large:
        return ConfigError(f"data.vocab_size={vocab_size} is too large for this training text: "
                           f"SentencePiece allows at most {too_large.group(1)}; lower it")
    too_small = re.search(r"required_chars\. (\d+) vs (\d+)", message)
    if too_small:
        return ConfigError(f"data.vocab_size={vocab_size} is smaller than the {too_small.group(2)} "
                           "pieces the training text needs (its characters + 4 special tokens); "
                           "raise it")
    return ConfigError(f"SentencePiece could not train with data.vocab_size={vocab_size}: "
                       f"{message.splitlines()[0]}")
