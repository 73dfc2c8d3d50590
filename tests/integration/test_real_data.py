"""`heads-lab train` on real data files, as a user runs it."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest
import sacrebleu

from tests.integration.test_cli import _assert_one_line_error, _results, heads_lab
from tests.unit.test_data_sources import _corpus, _write

MULTI30K = Path(os.environ.get("HEADS_LAB_DATA", "/nonexistent")) / "multi30k"
SMALL = ["model=tiny", "trainer.max_steps=8", "trainer.max_tokens=2048", "trainer.valid_every=8",
         "eval.beam=2", "logger=none"]


@pytest.mark.skipif(not (MULTI30K / "train.de.gz").is_file(),
                    reason="Multi30k not found: set HEADS_LAB_DATA to the dir holding multi30k/ "
                           "(.ci/run points it at ../shared/data)")
def test_train_on_multi30k_de_en(tmp_path):
    proc = heads_lab("train", "data=multi30k", "data.vocab_size=1000", "data.max_train_pairs=3000",
                     *SMALL, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    (found,) = _results(tmp_path / "outputs")
    results = json.loads(found.read_text())
    assert results["data"]["train"] == {"read": 3000, "dropped": {}, "kept": 3000}
    assert results["data"]["test"]["kept"] == 1000 and results["decoding"]["sentences"] == 1000
    assert math.isfinite(results["metrics"]["test/ppl"])
    refs = (found.parent / "refs.test.txt").read_text(encoding="utf-8").splitlines()
    assert refs[0] == "A man in an orange hat starring at something."
    assert "data multi30k train: read 3,000, kept 3,000" in " ".join(proc.stdout.split())


def test_train_on_local_files_reports_cleaning_counts(tmp_path):
    root = _corpus(tmp_path / "corpus", gz=True)
    proc = heads_lab("train", "data=local", f"data.root={root}", "data.src=de", "data.tgt=en",
                     "data.vocab_size=60", "data.cleaning.dedup=true", *SMALL, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    (found,) = _results(tmp_path / "outputs")
    stats = json.loads(found.read_text())["data"]["train"]
    assert stats["read"] == 300 and stats["kept"] + sum(stats["dropped"].values()) == 300


@pytest.mark.parametrize("setup,args,fragments", [
    (None, ["data=local"], ["data.root is not set"]),
    ("mismatch", [], ["train.de has 300 lines but", "train.en has 299"]),
    ("missing", [], ["valid file is missing: tried"]),
    (None, ["data=local", "data.root=/does/not/exist"], ["train file is missing", "/does/not/exist"]),
    (None, ["data=multi30k", "data.root=/nowhere", "data.tgt=cs"], ["Multi30k files", "/nowhere"]),
    (None, ["eval.sacrebleu_test=wmt99"], ["'wmt99' is not a sacrebleu test set"]),
    (None, ["data.cleaning.on_decode_error=ignore"],
         ["data.cleaning.on_decode_error=ignore", "expected one of [error, skip]"]),
])
def test_bad_data_input_is_one_line(tmp_path, setup, args, fragments):
    root = _corpus(tmp_path / "c")
    if setup == "mismatch":
        _write(root / "train.en", ["x"] * 299)
    if setup == "missing":
        (root / "valid.en").unlink()
    if setup:
        args = ["data=local", f"data.root={root}", "data.src=de", "data.tgt=en", *args]
    proc = heads_lab("train", *args, *SMALL, cwd=tmp_path)
    _assert_one_line_error(proc, *fragments)


TATOEBA = Path(os.environ.get("HEADS_LAB_DATA", "/nonexistent")) / "tatoeba" / "deu-eng.zip"


@pytest.mark.slow  # long end to end: `make test-slow` (CI runs it)
@pytest.mark.skipif(not TATOEBA.is_file(),
                    reason="Tatoeba not found: set HEADS_LAB_DATA to the dir holding "
                           "tatoeba/deu-eng.zip (.ci/run points it at ../shared/data)")
def test_train_on_tatoeba_records_sha256_and_split(tmp_path):
    proc = heads_lab("train", "data=tatoeba", "data.vocab_size=1000", "data.train_fraction=0.1",
                     "eval.split=valid", *SMALL, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    (found,) = _results(tmp_path / "outputs")
    results = json.loads(found.read_text())
    source = results["data"]["source"]
    assert source["sha256"] == "b7688f84f99fa33c17397c14d8bd9cef1fdeb2ee0bf50074767023aee8926e28"
    split = source["split"]
    assert split["valid"]["english"] >= 2000 and split["test"]["english"] >= 2000
    assert results["data"]["train"]["of"] == split["train"]["pairs"]  # every pair kept
    assert results["data"]["train"]["kept"] == round(0.1 * split["train"]["pairs"])
    assert results["decoding"]["sentences"] == split["valid"]["pairs"]
    assert math.isfinite(results["metrics"]["valid/ppl"])
    # the multi-reference score: every translation of each source, read back from its file
    run_dir = Path(results["run_dir"])
    all_refs = [line.split("\t") for line in
                (run_dir / "refs.valid.all.tsv").read_text(encoding="utf-8").splitlines()]
    hyps = (run_dir / "hyps.valid.txt").read_text(encoding="utf-8").splitlines()
    assert [r[0] for r in all_refs] == (run_dir / "refs.valid.txt").read_text(
        encoding="utf-8").splitlines()
    assert (sum(len(r) > 1 for r in all_refs), sum(map(len, all_refs))) == (226, 2273)
    streams = [[r[k] if k < len(r) else None for r in all_refs]
               for k in range(max(map(len, all_refs)))]
    assert results["metrics"]["valid/bleu_multiref"] == pytest.approx(
        sacrebleu.corpus_bleu(hyps, streams).score)
    assert results["sacrebleu"]["multiref"]["references"] == 2273


def test_bad_tatoeba_zip_is_one_line_and_writes_nothing(tmp_path):
    zipped = tmp_path / "deu-eng.zip"
    zipped.write_bytes(b"PK\x03\x04 not really a zip")
    for args in (["data.sha256=null"], []):
        proc = heads_lab("train", "data=tatoeba", f"data.root={tmp_path}", *args, *SMALL,
                         cwd=tmp_path)
        _assert_one_line_error(proc, str(zipped),
                               *(["not a readable zip"] if args else ["sha256", "data.sha256=null"]))
    proc = heads_lab("train", "-m", "data=tatoeba", "data.root=/nowhere", "model.heads=1,2",
                     *SMALL, cwd=tmp_path)
    _assert_one_line_error(proc, "Tatoeba file deu-eng.zip not found", "/nowhere", "no job was run")
    assert not (tmp_path / "outputs").exists()
