"""`heads-lab train task=lm` end to end on the embedded pair's source side and on random repeats:
results.json's perplexity and bits per byte read back against the per-row scores it wrote, the
samples, `heads-lab eval` of the run, and the same numbers again from the same seed."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from tests.integration.test_cli import _assert_one_line_error, _results, heads_lab

LM = ["task=lm", "model=tiny", "data.train_size=600", "data.valid_size=40", "data.test_size=40",
      "data.vocab_size=400", "data.held_out=40", "data.nouns=60", "data.verbs=20",
      "data.adjectives=20", "data.adverbs=10", "trainer.max_steps=20", "trainer.max_tokens=1024",
      "trainer.valid_every=10", "trainer.warmup_steps=5", "logger=none", "trainer.threads=1"]


@pytest.fixture(scope="module")
def lm_run(tmp_path_factory) -> Path:
    cwd = tmp_path_factory.mktemp("lm")
    proc = heads_lab("train", *LM, cwd=cwd)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    (results,) = _results(cwd / "outputs")
    return results.parent


def test_a_language_model_trains_and_reports_ppl_and_bits_per_byte(lm_run):
    results = json.loads((lm_run / "results.json").read_text())
    m = results["metrics"]
    assert {"valid/ppl", "valid/bits_per_byte", "test/ppl", "test/bits_per_byte"} <= set(m)
    assert "test/bleu" not in m and "sacrebleu" not in results
    rows = [line.split("\t") for line in (lm_run / "scores.test.tsv").read_text().splitlines()]
    assert rows[0] == ["tokens", "bytes", "nll"] and len(rows) == 41
    nll = sum(float(r[2]) for r in rows[1:])
    tokens = sum(int(r[0]) for r in rows[1:])
    size = sum(int(r[1]) for r in rows[1:])
    assert m["test/bits_per_byte"] == pytest.approx(nll / (math.log(2) * size), rel=1e-12)
    assert m["test/ppl"] == pytest.approx(math.exp(nll / tokens), rel=1e-12)
    assert results["scoring"]["how"].startswith("each sentence from its BOS")
    assert results["recipe"]["optimizer"] == "adamw" and results["recipe"]["label_smoothing"] == 0
    assert results["params"]["total"] == results["cost"]["params"]["total"]
    assert "greedy" in (lm_run / "samples.txt").read_text()
    assert (lm_run / "checkpoints").is_dir()


def test_eval_of_a_language_model_gives_its_numbers_again(lm_run):
    proc = heads_lab("eval", str(lm_run), cwd=lm_run)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    (found,) = (lm_run / "evals").glob("*/eval.json")
    again = json.loads(found.read_text())["metrics"]
    first = json.loads((lm_run / "results.json").read_text())["metrics"]
    assert again["test/bits_per_byte"] == pytest.approx(first["test/bits_per_byte"], rel=1e-9)
    assert "bits per byte" in proc.stdout


@pytest.mark.slow  # two more trainings: `make test-slow` (CI runs it)
def test_the_same_seed_gives_the_same_numbers_and_repeats_give_copy_accuracy(lm_run, tmp_path):
    proc = heads_lab("train", *LM, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    (again,) = _results(tmp_path / "outputs")
    first = json.loads((lm_run / "results.json").read_text())["metrics"]
    second = json.loads(again.read_text())["metrics"]
    assert {k: v for k, v in first.items() if "/tokens_per_s" not in k and "gflops" not in k
            and "peak_mem" not in k} == {k: v for k, v in second.items() if "/tokens_per_s"
                                          not in k and "gflops" not in k and "peak_mem" not in k}
    (tmp_path / "repeats").mkdir()
    proc = heads_lab("train", "task=lm", "data=repeats", "model=tiny", "data.train_size=300",
                     "data.valid_size=20", "data.test_size=20", "trainer.max_steps=10",
                     "trainer.valid_every=10", "logger=none", cwd=tmp_path / "repeats")
    assert proc.returncode == 0, proc.stderr + proc.stdout
    (results,) = _results(tmp_path / "repeats" / "outputs")
    m = json.loads(results.read_text())["metrics"]
    assert 0 <= m["test/copy_accuracy"] <= 1 and "test/bits_per_byte" not in m


def test_a_language_models_bad_input_is_one_line(tmp_path):
    _assert_one_line_error(heads_lab("train", *LM, "prune.sites=[dec-enc]", cwd=tmp_path),
                           "task=lm has no dec-enc attention")
    _assert_one_line_error(heads_lab("train", "task=lm", "data=tatoeba", "data.src=fr",
                                     "logger=none", cwd=tmp_path),
                           "data.src=fr and data.tgt=en must be de and en")
    _assert_one_line_error(heads_lab("train", "data=shakespeare", "logger=none", cwd=tmp_path),
                           "data=shakespeare is text for a language model: add task=lm")


@pytest.mark.slow  # analyze and prune of a trained language model: `make test-slow`
def test_a_language_model_run_is_analysed_and_pruned(lm_run):
    """analyze: its lm-self heads with the LM roles and sink; prune: PPL and bits per byte as
    heads go, removed for real (multi-head attention)."""
    proc = heads_lab("analyze", str(lm_run), "analysis.max_sentences=20",
                     "analysis.role_length=20", "analysis.split=valid", cwd=lm_run)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    (found,) = (lm_run / "analysis").glob("*/analysis.json")
    result = json.loads(found.read_text())
    assert set(result["functions"]) == {"lm-self"}
    assert all(0 <= h["previous_token"] <= 1 and h["importance"] is not None
               for h in result["heads"])
    assert "lrp" in result["not_measured"]
    proc = heads_lab("prune", str(lm_run), "method=importance", "prune.step=0.5",
                     "prune.eval_sentences=20", cwd=lm_run)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    (found,) = (lm_run / "prune").glob("*/prune.json")
    curve = json.loads(found.read_text())["curves"]["lm-self"]
    assert [r["kept"]["lm-self"] for r in curve] == [4, 2, 0]
    assert curve[0]["params"] > curve[1]["params"] > curve[2]["params"]  # removed for real
    assert all(r["bits_per_byte"] > 0 for r in curve)
    _assert_one_line_error(heads_lab("prune", str(lm_run), "method=gates", cwd=lm_run),
                           "use method=importance")
