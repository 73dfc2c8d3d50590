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
    _assert_one_line_error(heads_lab("eval", str(lm_run), "eval.context=8", cwd=lm_run),
                           "eval.context=8 reads a document's held-out blocks after the text")
    assert len(list((lm_run / "evals").glob("*/eval.json"))) == 1  # nothing written for it


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


@pytest.mark.slow
@pytest.mark.serial  # a kill: alone in `make test-slow`
def test_a_language_model_killed_and_resumed_gives_the_uninterrupted_numbers(lm_run, tmp_path):
    """The trainer is the translator's: SIGKILL after a checkpoint, the same command again,
    and every number equals the uninterrupted run's (which made lm_run: the same config)."""
    import os
    import signal
    import subprocess

    from tests.integration.test_cli import EXE
    from tests.integration.test_resume import _wait_for_checkpoint

    args = [EXE, "train", *LM, "trainer.save_every=4", "trainer.keep_last=3",
            f"hydra.run.dir={tmp_path / 'run'}"]
    proc = subprocess.Popen(args, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    _wait_for_checkpoint(tmp_path / "run", proc)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    again = subprocess.run(args, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr
    resumed = json.loads((tmp_path / "run" / "results.json").read_text())
    first = json.loads((lm_run / "results.json").read_text())
    assert resumed["train"]["resumed_from"] is not None
    for key in ("train/loss", "valid/bits_per_byte", "test/ppl", "test/bits_per_byte"):
        assert resumed["metrics"][key] == first["metrics"][key], key


@pytest.mark.slow  # two processes: `make test-slow`
def test_a_language_model_trains_data_parallel_as_one_process_does(tmp_path):
    """torchrun with 2 CPU processes against one process with the same global batch: the same
    tokens and the same validation losses (the trainer is shared)."""
    import os
    import subprocess
    import sys

    run = [*LM, "trainer.max_steps=6", "trainer.valid_every=3"]
    one = heads_lab("train", *run, "trainer.update_freq=2", f"hydra.run.dir={tmp_path / 'one'}",
                    cwd=tmp_path)
    assert one.returncode == 0, one.stderr
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK")}
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           "--nproc_per_node=2", "-m", "heads_lab", "train", *run,
                           f"hydra.run.dir={tmp_path / 'two'}"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    a = json.loads((tmp_path / "one" / "results.json").read_text())
    b = json.loads((tmp_path / "two" / "results.json").read_text())
    assert b["train"]["data_parallel"] == 2 and a["train"]["tokens"] == b["train"]["tokens"]
    for x, y in zip(a["train"]["valid_history"], b["train"]["valid_history"], strict=True):
        assert x["valid/bits_per_byte"] == pytest.approx(y["valid/bits_per_byte"], rel=1e-4)


def test_report_choose_keeps_each_settings_best_rate_from_the_run_files(lm_run, tmp_path):
    """`heads-lab report --choose trainer.lr` on a study's run dirs (copies of one trained run,
    their rate, seed and valid score rewritten): per head count the rate with the lowest valid
    bits per byte on seed 1 is kept with its other seeds, the choices are written and flagged."""
    import shutil

    heads = json.loads((lm_run / "results.json").read_text())["config"]["model"]["heads"]
    grid = {(1, 5e-4): 2.3, (1, 1e-3): 2.2, (1, 2e-3): 2.25,  # h = 1: 1e-3, inside
            (heads, 5e-4): 2.3, (heads, 1e-3): 2.1}  # h = heads: 1e-3, the largest tried
    later = [(1, 1e-3, 2, 2.6), (heads, 1e-3, 2, 2.7), (heads, 5e-4, 3, 1.0)]
    for h, lr, seed, bpb in [(h, lr, 1, bpb) for (h, lr), bpb in grid.items()] + later:
        run = tmp_path / "study" / f"h{h}_lr{lr}_s{seed}"
        shutil.copytree(lm_run, run, ignore=shutil.ignore_patterns("checkpoints", "evals"))
        results = json.loads((run / "results.json").read_text())
        results["config"]["model"]["heads"] = h
        results["config"]["trainer"]["lr"], results["config"]["seed"] = lr, seed
        results["overrides"] = [f"model.heads={h}", f"trainer.lr={lr}", f"seed={seed}"]
        results["metrics"]["valid/bits_per_byte"] = bpb
        (run / "results.json").write_text(json.dumps(results))
    proc = heads_lab("report", str(tmp_path / "study"), "--choose", "trainer.lr", "--out",
                     str(tmp_path / "out"), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    report = (tmp_path / "out" / "report.md").read_text()
    rows = [line.split("|")[1].strip().removesuffix(" (base)") for line in report.splitlines()
            if line.startswith("| h=")]
    assert rows == ["h=1,lr=0.001", f"h={heads},lr=0.001"]  # seed 3's 1.0 at 5e-4 counts not
    import csv

    with open(tmp_path / "out" / "runs.csv", newline="") as f:  # every run, chosen or not
        records = list(csv.DictReader(f))
    lines = sorted((r["setting"], r["seed"]) for r in records)
    assert {r["p vs base"] for r in records if "lr=0.001" not in r["setting"]} == {
        "– (another trainer.lr chosen)"}  # no p, and not the base row's
    assert lines == sorted([("h=1,lr=0.0005", "1"), ("h=1,lr=0.001", "1"), ("h=1,lr=0.001", "2"),
                            ("h=1,lr=0.002", "1"), (f"h={heads},lr=0.0005", "1"),
                            (f"h={heads},lr=0.0005", "3"), (f"h={heads},lr=0.001", "1"),
                            (f"h={heads},lr=0.001", "2")])
    assert "4 runs at the other values left out" in report
    chosen = (tmp_path / "out" / "chosen.csv").read_text().splitlines()
    assert chosen[0] == ("setting,lr=0.0005,lr=0.001,lr=0.002,chosen lr,compared on seeds,"
                         "runs at the chosen value,note")
    assert chosen[1:] == ["h=1,2.3000,2.2000,2.2500,0.001,1,2,",
                          f"h={heads},2.3000,2.1000,,0.001,1,2,the largest value tried: a larger one "
                          "may be better"]
    assert "trainer.lr chosen per setting" in proc.stdout
    assert (tmp_path / "out" / "chosen.png").is_file()
    from heads_lab.api.tables import rows as report_rows  # heads_lab.rows

    table = report_rows(tmp_path / "study", samples=10, choose="trainer.lr")
    assert [s.removesuffix(" (base)") for s in table["setting"]] == rows
    assert table["runs"].tolist() == [2, 2]
    _assert_one_line_error(heads_lab("report", str(tmp_path / "study"), "--choose", "model.d_ff",
                                     "--out", str(tmp_path / "bad"), cwd=tmp_path),
                           "--choose model.d_ff: it does not vary between these runs")
    assert not (tmp_path / "bad").exists()  # refused before anything is written
