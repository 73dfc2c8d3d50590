"""The Hugging Face path on local datasets in the WMT schema, Multi30k, sacrebleu test sets."""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path

import pytest

from heads_lab.config.schemas import CleaningConfig, HFDataConfig, Multi30kDataConfig
from heads_lab.config.validate import check_sacrebleu_test
from heads_lab.data import prepare, sources, testsets
from heads_lab.errors import ConfigError, DataError
from tests.unit.test_data_sources import _sentences

datasets = pytest.importorskip("datasets")
SIZES = {"train": 200, "validation": 15, "test": 20}


def _rows(split: str, n: int) -> list[dict]:
    de, en = _sentences(n, len(split), "de"), _sentences(n, len(split), "en")
    return [{"translation": {"de": a, "en": b}} for a, b in zip(de, en)]


def _hf(**kw) -> HFDataConfig:
    settings = {"src": "de", "tgt": "en", "vocab_size": 60, "cleaning": CleaningConfig(max_ratio=None),
                **kw}
    return HFDataConfig(**settings)


def test_save_to_disk_dataset_in_wmt_schema(tmp_path):
    dd = datasets.DatasetDict({s: datasets.Dataset.from_list(_rows(s, n)) for s, n in SIZES.items()})
    dd.save_to_disk(str(tmp_path / "ds"))
    corpus = prepare(_hf(dataset=str(tmp_path / "ds")), tmp_path / "cache")
    assert [len(corpus.splits[s]) for s in ("train", "valid", "test")] == [200, 15, 20]
    assert corpus.splits["test"].tgt_text == [r["translation"]["en"] for r in _rows("test", 20)]
    again = prepare(_hf(dataset=str(tmp_path / "ds")), tmp_path / "cache")
    assert again.stats["cache_dir"] == corpus.stats["cache_dir"]  # dataset fingerprint: a hit


def test_json_lines_files_and_reversed_direction(tmp_path):
    files = {}
    for split, n in SIZES.items():
        path = tmp_path / f"{split}.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in _rows(split, n)))
        files[split] = str(path)
    corpus = prepare(_hf(dataset="json", files=files, src="en", tgt="de"), tmp_path / "cache")
    assert corpus.splits["valid"].src_text == [r["translation"]["en"] for r in _rows("validation", 15)]


def test_parquet_with_one_column_per_language(tmp_path):
    files = {}
    for split, n in SIZES.items():
        rows = [r["translation"] for r in _rows(split, n)]
        path = tmp_path / f"{split}.parquet"
        datasets.Dataset.from_list(rows).to_parquet(str(path))
        files[split] = str(path)
    corpus = prepare(_hf(dataset="parquet", files=files, column=None), tmp_path / "cache")
    assert len(corpus.splits["train"]) == 200


def test_hf_bad_input(tmp_path):
    dd = datasets.DatasetDict({s: datasets.Dataset.from_list(_rows(s, n)) for s, n in SIZES.items()})
    dd.save_to_disk(str(tmp_path / "ds"))
    with pytest.raises(DataError, match=r"has no \['fr'\] in column 'translation'.*\['de', 'en'\]"):
        prepare(_hf(dataset=str(tmp_path / "ds"), tgt="fr"), tmp_path / "cache")
    with pytest.raises(DataError, match=r"has no split 'dev' \(data.valid\)"):
        prepare(_hf(dataset=str(tmp_path / "ds"), valid="dev"), tmp_path / "cache")
    with pytest.raises(ConfigError, match="data.dataset is not set"):
        prepare(_hf(), tmp_path / "cache")
    with pytest.raises(ConfigError, match="needs data.files"):
        prepare(_hf(dataset="json"), tmp_path / "cache")
    # a path that is not a dir: said so, not "the hub is unreachable" (it named no hub dataset)
    for path in (str(tmp_path / "nonexistent"), str(tmp_path / "ds" / "dataset_dict.json")):
        with pytest.raises(DataError, match=f"^data.dataset={path} is not a dir: give a dataset "
                                            "saved with save_to_disk"):
            prepare(_hf(dataset=path), tmp_path / "cache")


def test_hub_unreachable_is_one_clear_error(tmp_path, monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(sources, "_hub_reachable", lambda timeout=3.0: False)
    with pytest.raises(DataError, match="hub is unreachable, so wmt/wmt14 cannot be downloaded"):
        prepare(_hf(dataset="wmt/wmt14", config="de-en"), tmp_path / "cache")


def test_multi30k_absent_and_offline_says_where_to_put_files(tmp_path, monkeypatch):
    monkeypatch.setenv("HEADS_LAB_DATA", str(tmp_path / "nowhere"))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(sources, "_hub_reachable", lambda timeout=3.0: False)
    with pytest.raises(DataError, match=r"Multi30k files .* not found .*nowhere/multi30k.*hub copy "
                                        r"failed .*set data.root or HEADS_LAB_DATA"):
        prepare(Multi30kDataConfig(), tmp_path / "cache")
    with pytest.raises(DataError, match=r"Multi30k files .*cs.* not found"):
        prepare(Multi30kDataConfig(tgt="cs"), tmp_path / "cache")


MULTI30K = Path(os.environ.get("HEADS_LAB_DATA", "/nonexistent")) / "multi30k"


@pytest.mark.skipif(not (MULTI30K / "train.de.gz").is_file(),
                    reason="Multi30k not found: set HEADS_LAB_DATA to the dir holding multi30k/ "
                           "(.ci/run points it at ../shared/data)")
@pytest.mark.parametrize("src,tgt,test", [("de", "en", "test_2016_flickr"),
                                          ("en", "fr", "test_2017_mscoco")])
def test_multi30k_from_the_shared_data(tmp_path, src, tgt, test):
    corpus = prepare(Multi30kDataConfig(src=src, tgt=tgt, test=test, vocab_size=2000,
                                        cleaning=CleaningConfig(max_ratio=None)), tmp_path / "cache")
    assert corpus.stats["train"] == {"read": 29000, "dropped": {}, "kept": 29000}
    assert len(corpus.splits["valid"]) == 1014
    with gzip.open(MULTI30K / f"{test}.{tgt}.gz", "rt", encoding="utf-8") as f:
        refs = [line.rstrip("\n") for line in f]
    assert corpus.splits["test"].tgt_text == [" ".join(r.split()) for r in refs]


def test_sacrebleu_test_sets_are_checked_and_loaded(tmp_path, monkeypatch):
    with pytest.raises(ConfigError, match="'wmt99' is not a sacrebleu test set"):
        check_sacrebleu_test("wmt99", "en", "de")
    with pytest.raises(ConfigError, match="wmt14 has no en-xx"):
        check_sacrebleu_test("wmt14", "en", "xx")
    check_sacrebleu_test("wmt14", "en", "de")

    import sacrebleu.utils

    def offline(*args):
        raise OSError("<urlopen error [Errno -2] Name or service not known>")

    monkeypatch.setattr(sacrebleu.utils, "get_source_file", offline)
    with pytest.raises(DataError, match="sacrebleu could not fetch test set wmt14 .*needs a network"):
        testsets.load("wmt14", "en", "de", None, "NFC")
    src, ref = tmp_path / "src.txt", tmp_path / "ref.txt"
    src.write_text("a  small\tdog\nthe grass\n")
    ref.write_text("ein kleiner Hund\ndas Gras\n")
    monkeypatch.setattr(sacrebleu.utils, "get_source_file", lambda *a: str(src))
    monkeypatch.setattr(sacrebleu.utils, "get_reference_files", lambda *a: [str(ref)])

    class Tok:
        def encode(self, texts):
            return [[4 + len(w) for w in t.split()] for t in texts]

    split = testsets.load("wmt14", "en", "de", Tok(), "NFC")
    assert split.src_text == ["a small dog", "the grass"]
    assert split.tgt_text == ["ein kleiner Hund", "das Gras"]
