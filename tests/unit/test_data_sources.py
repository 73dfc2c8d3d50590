"""Real-data sources: local files (text, gz, TSV), cleaning counts, bad input, the cache."""

from __future__ import annotations

import gzip
import multiprocessing
import os
import time
from pathlib import Path

import pytest

from heads_lab.config.schemas import CleaningConfig, TextFilesDataConfig
from heads_lab.data import prepare
from heads_lab.data.cleaning import normalize
from heads_lab.errors import ConfigError, DataError

WORDS = "a small dog runs over the green grass while two children watch from the old bench".split()


def _sentences(n: int, seed: int, lang: str) -> list[str]:
    import random

    rng = random.Random(f"{seed}-{lang}")
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 9))) for _ in range(n)]


def _write(path: Path, lines: list[str] | bytes) -> None:
    data = lines if isinstance(lines, bytes) else "".join(f"{x}\n" for x in lines).encode()
    if path.suffix == ".gz":
        with gzip.open(path, "wb") as f:
            f.write(data)
    else:
        path.write_bytes(data)


def _corpus(root: Path, sizes=(300, 20, 30), gz=False) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for split, n in zip(("train", "valid", "test"), sizes):
        for lang in ("de", "en"):
            _write(root / f"{split}.{lang}{'.gz' if gz else ''}", _sentences(n, hash(split) % 97, lang))
    return root


def _cfg(root: Path, **kw) -> TextFilesDataConfig:
    settings = {"root": str(root), "src": "de", "tgt": "en", "vocab_size": 60,
                "cleaning": CleaningConfig(max_ratio=None), **kw}
    return TextFilesDataConfig(**settings)


@pytest.mark.parametrize("gz", [False, True])
def test_text_files_read_encode_and_round_trip(tmp_path, gz):
    root = _corpus(tmp_path / "c", gz=gz)
    corpus = prepare(_cfg(root), tmp_path / "cache")
    assert [len(corpus.splits[s]) for s in ("train", "valid", "test")] == [300, 20, 30]
    test = corpus.splits["test"]
    assert test.src_text == _sentences(30, hash("test") % 97, "de")
    assert corpus.tokenizer.decode([test.src[i].tolist() for i in range(3)]) == test.src_text[:3]
    assert corpus.splits["train"].src_text is None  # training text is not kept in memory
    assert corpus.stats["train"] == {"read": 300, "dropped": {}, "kept": 300}


def test_tsv_format(tmp_path):
    root = tmp_path / "tsv"
    root.mkdir()
    for split, n in (("train", 200), ("valid", 10), ("test", 12)):
        src, tgt = _sentences(n, 1, "de"), _sentences(n, 1, "en")
        _write(root / f"{split}.tsv", [f"{a}\t{b}" for a, b in zip(src, tgt)])
    corpus = prepare(_cfg(root, format="tsv", pattern="{split}.tsv"), tmp_path / "cache")
    assert len(corpus.splits["test"]) == 12
    assert corpus.splits["test"].tgt_text == _sentences(12, 1, "en")
    # the default pattern names the files {split}.{lang} with lang de-en: the error says how
    with pytest.raises(DataError, match=r"train\.de-en.*data\.format=tsv reads data\.pattern="
                                        r"'\{split\}\.\{lang\}'.*data\.pattern='\{split\}\.tsv'"):
        prepare(_cfg(root, format="tsv"), tmp_path / "cache")


def test_cleaning_normalises_and_counts_every_drop(tmp_path):
    root = _corpus(tmp_path / "c")
    src = ["cafe\u0301  au\tlait", "", "the dog", "the dog", "x " * 40, "a b c d e f g h", "ok"]
    tgt = ["coffee with milk", "empty source", "der hund", "der hund", "y", "a", "gut"]
    _write(root / "train.de", src * 20)
    _write(root / "train.en", tgt * 20)
    cfg = _cfg(root, max_len=30, cleaning=CleaningConfig(dedup=True, max_ratio=3.0))
    corpus = prepare(cfg, tmp_path / "cache")
    stats = corpus.stats["train"]
    assert stats["read"] == 140
    assert stats["dropped"]["empty"] == 20  # the empty source, each time
    assert stats["dropped"]["duplicate"] == 6 * 19 + 1  # repeats of the rest + the twin pair
    assert stats["dropped"]["too_long"] + stats["dropped"].get("ratio", 0) == 2
    assert stats["kept"] == 140 - 20 - 115 - 2 == 3
    assert normalize("cafe\u0301  au\tlait", "NFC") == "café au lait"


def test_held_out_splits_are_never_filtered(tmp_path):
    root = _corpus(tmp_path / "c")
    _write(root / "test.de", ["", "a", "x " * 300])
    _write(root / "test.en", ["empty source", "a", "y"])
    corpus = prepare(_cfg(root, max_len=20), tmp_path / "cache")
    assert len(corpus.splits["test"]) == 3 and corpus.stats["test"]["dropped"] == {}


def test_max_train_pairs_keeps_the_first_pairs(tmp_path):
    corpus = prepare(_cfg(_corpus(tmp_path / "c"), max_train_pairs=50), tmp_path / "cache")
    assert len(corpus.splits["train"]) == 50 and corpus.stats["train"]["read"] == 50


def test_mismatched_line_counts_name_both_files_and_counts(tmp_path):
    root = _corpus(tmp_path / "c")
    _write(root / "train.en", _sentences(297, 0, "en"))
    with pytest.raises(DataError, match=r"train\.de has 300 lines but .*train\.en has 297"):
        prepare(_cfg(root), tmp_path / "cache")
    _write(root / "train.en", _sentences(305, 0, "en"))
    with pytest.raises(DataError, match=r"train\.de has 300 lines but .*train\.en has 305"):
        prepare(_cfg(root), tmp_path / "cache")


def test_undecodable_bytes_error_with_line_or_skip_with_count(tmp_path):
    root = _corpus(tmp_path / "c")
    lines = "".join(f"{s}\n" for s in _sentences(300, 5, "de")).encode().split(b"\n")
    lines[6] = b"caf\xe9 latin-1"
    _write(root / "train.de", b"\n".join(lines))
    with pytest.raises(DataError, match=r"train\.de:7: not UTF-8.*on_decode_error=skip"):
        prepare(_cfg(root), tmp_path / "cache")
    corpus = prepare(_cfg(root, cleaning=CleaningConfig(max_ratio=None, on_decode_error="skip")),
                     tmp_path / "cache")
    assert corpus.stats["train"]["dropped"] == {"undecodable": 1}
    assert len(corpus.splits["train"]) == 299


def test_missing_file_lists_the_paths_tried(tmp_path):
    root = _corpus(tmp_path / "c")
    (root / "valid.en").unlink()
    with pytest.raises(DataError, match=r"valid file is missing: tried .*valid\.en, .*valid\.en\.gz"):
        prepare(_cfg(root), tmp_path / "cache")


def test_empty_split_and_bad_tsv_line(tmp_path):
    root = _corpus(tmp_path / "c")
    _write(root / "test.de", [])
    _write(root / "test.en", [])
    with pytest.raises(DataError, match="the test split of data=local is empty"):
        prepare(_cfg(root), tmp_path / "cache")
    tsv = tmp_path / "t"
    tsv.mkdir()
    for split in ("train", "valid", "test"):
        _write(tsv / f"{split}.tsv", ["a\tb", "no tab here", "c\td"])
    with pytest.raises(DataError, match=r"train\.tsv:2: expected one tab"):
        prepare(_cfg(tsv, format="tsv", pattern="{split}.tsv"), tmp_path / "cache")


def test_root_not_set_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="data.root is not set"):
        prepare(TextFilesDataConfig(), tmp_path / "cache")


def _entries(cache: Path) -> list[Path]:
    return sorted(p for p in (cache / "corpora").iterdir() if p.is_dir())


def test_cache_is_hit_then_invalidated_by_settings_and_files(tmp_path):
    root, cache = _corpus(tmp_path / "c"), tmp_path / "cache"
    first = prepare(_cfg(root), cache)
    built = (Path(first.stats["cache_dir"]) / "meta.json").stat().st_mtime_ns
    again = prepare(_cfg(root), cache)
    assert again.stats["cache_dir"] == first.stats["cache_dir"]
    assert (Path(again.stats["cache_dir"]) / "meta.json").stat().st_mtime_ns == built
    assert len(_entries(cache)) == 1
    prepare(_cfg(root, vocab_size=70), cache)
    prepare(_cfg(root, cleaning=CleaningConfig(max_ratio=None, dedup=True)), cache)
    assert len(_entries(cache)) == 3
    time.sleep(0.01)
    _write(root / "train.en", _sentences(300, 9, "en"))  # same size class, new content/mtime
    prepare(_cfg(root), cache)
    assert len(_entries(cache)) == 4
    assert not [p for p in (cache / "corpora").iterdir() if p.name.startswith(".")]  # no temp dirs


def _build_in_process(root: str, cache: str, out) -> None:
    from heads_lab.data import corpus as corpus_module

    build = corpus_module._build

    def counted(*args):  # record every real build
        with open(Path(cache).parent / "builds.txt", "a") as f:
            f.write(f"{os.getpid()}\n")
        time.sleep(1.0)  # hold the lock long enough that the other jobs arrive meanwhile
        build(*args)

    corpus_module._build = counted
    corpus = prepare(_cfg(Path(root)), Path(cache))
    out.put(corpus.stats["cache_dir"])


def test_concurrent_jobs_build_the_cache_once(tmp_path):
    root, cache = _corpus(tmp_path / "c", sizes=(3000, 20, 30)), tmp_path / "cache"
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    procs = [ctx.Process(target=_build_in_process, args=(str(root), str(cache), out))
             for _ in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert [p.exitcode for p in procs] == [0, 0, 0]
    dirs = {out.get(timeout=5) for _ in procs}
    assert len(dirs) == 1 and len(_entries(cache)) == 1
    assert len((tmp_path / "builds.txt").read_text().split()) == 1  # built once, by one job
    assert not [p for p in (cache / "corpora").iterdir() if p.name.startswith(".")]
