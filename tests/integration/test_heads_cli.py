"""`heads-lab analyze`, `heads-lab prune`, `eval.head_mask` and gates from scratch, end to end on
a tiny model trained on the synthetic pair."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import TINY
from tests.integration.test_cli import _results, heads_lab

# 2+2 layers so the dec-self / dec-enc sites have more than one layer
SMALL = [a for a in TINY if not a.startswith("trainer.max_steps")] + [
    "trainer.max_steps=40", "model.encoder_layers=2", "model.decoder_layers=2"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    cwd = tmp_path_factory.mktemp("heads")
    proc = heads_lab("train", *SMALL, cwd=cwd)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    (results,) = _results(cwd / "outputs")
    return results.parent


def test_analyze_writes_every_head_figures_and_head_view(trained):
    proc = heads_lab("analyze", str(trained), "analysis.max_sentences=40",
                     "analysis.heatmaps=[enc:1:0,dec-enc:0:*]", "analysis.sentences=[0,3]",
                     cwd=trained)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    (out,) = (trained / "analysis").iterdir()
    result = json.loads((out / "analysis.json").read_text())
    assert len(result["heads"]) == (2 + 2 + 2) * 4 and result["sentences"] == 40
    assert result["syntax"]["source"] == "gold" and result["syntax"]["skipped_sentences"] == 0
    assert result["syntax"]["relations"]["amod dep→head"]["arcs"] > 0
    for head in result["heads"]:
        assert 0 < head["confidence"] <= 1 and head["importance"] >= 0
        assert head["function"] in ("positional", "syntactic", "rare", "other")
    for site in ("enc-self", "dec-self", "dec-enc"):
        imp = result["grids"]["importance"][site]
        for layer in imp:  # normalised per layer by the ℓ2 norm
            assert sum(x * x for x in layer) == pytest.approx(1.0)
        assert len(result["distances"][site]) == 2 and len(result["diversity"][site]) == 2
    for name in ("heads_confidence.png", "heads_importance.png", "head_functions.png",
                 "head_distance.png", "head_diversity.png", "head_view.html",
                 "attention_s0_enc-self_l1_h0.png", "attention_s3_dec-enc_l0_h3.png"):
        assert (out / name).is_file(), name
    assert "head roles per attention type" in proc.stdout


def test_analyze_bad_input_is_one_line(trained):
    for args, text in ((["analysis.sentences=[999]"], "analysis.sentences has 999"),
                       (["analysis.heatmaps=[enc:7:0]"], "no enc-self layer '7'"),
                       (["model.heads=2"], "'model.heads=2' cannot change here")):
        proc = heads_lab("analyze", str(trained), *args, cwd=trained)
        assert proc.returncode == 2 and text in proc.stderr, proc.stderr
        assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_prune_by_importance_removes_heads_for_real_step_by_step(trained):
    proc = heads_lab("prune", str(trained), "method=importance", "prune.step=0.5",
                     "prune.sites=[enc-self]", "prune.eval_sentences=20", cwd=trained)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    (out,) = (trained / "prune").iterdir()
    result = json.loads((out / "prune.json").read_text())
    rows = result["curves"]["enc-self"]
    assert [r["fraction"] for r in rows] == [0.0, 0.5, 1.0]
    assert [r["kept"]["enc-self"] for r in rows] == [8, 4, 0]
    assert all(r["kept"]["dec-self"] == 8 for r in rows)
    params = [r["params"] for r in rows]
    assert params[0] > params[1] > params[2]  # removed, not masked
    assert (out / "prune_importance.png").is_file() and (out / "prune.csv").is_file()
    assert all(r["forward_tok_s"] > 0 for r in rows)  # speed of the same reference tokens
    header = (out / "prune.csv").read_text().splitlines()[0]
    assert "fwd tok/s" in header and "decode s" in header


def test_prune_with_gates_and_eval_with_a_head_mask(trained):
    proc = heads_lab("prune", str(trained), "-m", "method=gates", "prune.l0_lambda=0,5",
                     "prune.steps=8", "prune.gate_lr=1.0", "prune.eval_sentences=20",
                     cwd=trained)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    assert "heads kept vs BLEU" in proc.stdout
    found = sorted((trained / "prune").glob("*gates*/results.json"))
    assert len(found) == 2
    kept = [json.loads(p.read_text())["metrics"] for p in found]
    for m in kept:
        assert 0 <= m["heads_kept/enc-self"] <= 8 and 0 <= m["test/bleu"] <= 100
    total = [sum(m[f"heads_kept/{s}"] for s in ("enc-self", "dec-self", "dec-enc")) for m in kept]
    assert total[0] > total[1]  # λ = 5 closes more gates than λ = 0

    base = heads_lab("eval", str(trained), "eval.beam=1", cwd=trained)
    masked = heads_lab("eval", str(trained), "eval.beam=1", "eval.head_mask=enc:*:*", cwd=trained)
    assert base.returncode == 0 and masked.returncode == 0, masked.stderr
    evals = sorted((trained / "evals").glob("*/eval.json"), key=lambda p: p.parent.name)
    ppl = {}
    for path in evals:
        done = json.loads(path.read_text())
        ppl["mask" if "eval.head_mask=enc:*:*" in done["overrides"] else "base"] = \
            done["metrics"]["test/ppl"]
    assert ppl["mask"] != ppl["base"]
    bad = heads_lab("eval", str(trained), "eval.head_mask=enc:0:9", cwd=trained)
    assert bad.returncode == 2 and "no enc-self layer 0 head '9'" in bad.stderr


def test_gates_from_scratch_report_heads_kept_and_evaluate_again(tmp_path):
    proc = heads_lab("train", *SMALL, "prune.l0_lambda=1.0", "prune.gate_lr=0.3", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    (found,) = _results(tmp_path / "outputs")
    m = json.loads(found.read_text())["metrics"]
    for site in ("enc-self", "dec-self", "dec-enc"):
        assert 0 <= m[f"heads_kept/{site}"] <= 8
    again = heads_lab("eval", str(found.parent), "eval.beam=1", cwd=tmp_path)  # gates reload
    assert again.returncode == 0, again.stderr
    analyzed = heads_lab("analyze", str(found.parent), "analysis.max_sentences=10", cwd=tmp_path)
    assert analyzed.returncode == 0, analyzed.stderr  # importance under the closed gates
