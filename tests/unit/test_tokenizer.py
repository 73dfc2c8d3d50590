"""The cached joint SentencePiece model."""

from __future__ import annotations

import pytest

from heads_lab.data.tokenizer import train_or_load
from heads_lab.errors import ConfigError

TEXTS = [f"the {w} sat on the {v} mat ." for w in ("cat", "dog", "bird", "fish") for v in
         ("red", "blue", "green")] * 20


def test_trained_once_then_loaded_from_cache(tmp_path):
    first, cached = train_or_load(TEXTS, 60, "bpe", tmp_path)
    assert not cached
    again, cached = train_or_load(TEXTS, 60, "bpe", tmp_path)
    assert cached and again.path == first.path
    ids = first.encode(["the cat sat on the red mat ."])
    assert again.decode(ids) == ["the cat sat on the red mat ."]
    assert (first.pad, first.unk, first.bos, first.eos) == (0, 1, 2, 3)
    assert first.sp.id_to_piece(3) == "</s>"


def test_other_text_or_settings_make_a_new_model(tmp_path):
    base, _ = train_or_load(TEXTS, 60, "bpe", tmp_path)
    _, cached = train_or_load(TEXTS + ["a new line ."], 60, "bpe", tmp_path)
    assert not cached
    other, cached = train_or_load(TEXTS, 50, "bpe", tmp_path)
    assert not cached and other.path != base.path
    _, cached = train_or_load(TEXTS, 26, "unigram", tmp_path)
    assert not cached
    assert len(list((tmp_path / "tokenizers").glob("*.model"))) == 4
    assert not list((tmp_path / "tokenizers").glob("*.tmp"))


@pytest.mark.parametrize("size,message", [(5000, "too large"), (10, "smaller than the")])
def test_impossible_vocabulary_sizes_are_config_errors(tmp_path, size, message):
    with pytest.raises(ConfigError, match=message):
        train_or_load(TEXTS, size, "bpe", tmp_path)
    assert not list((tmp_path / "tokenizers").glob("*"))  # nothing half-written left behind
