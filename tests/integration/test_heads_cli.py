"""`heads-lab analyze`, `heads-lab prune`, `eval.head_mask` and gates from scratch, end to end on
a tiny model trained on the synthetic pair."""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import TINY
from tests.integration.test_cli import _assert_one_line_error, _results, heads_lab

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


@pytest.mark.slow  # long end to end: `make test-slow` (CI runs it)
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
        for layer in result["grids"]["lrp"][site]:  # LRP: each layer's shares sum to 1
            assert sum(layer) == pytest.approx(1.0) and min(layer) >= 0
        # every head of the site against every other, across its 2 layers of 4 heads
        assert np.asarray(result["distances"][site]).shape == (8, 8)
        assert len(result["diversity"][site]) == 2 and len(result["head_map"][site]) == 8
        assert [round(v["mean"], 9) for v in result["within_layer"][site]] == \
            [round(v, 9) for v in result["diversity"][site]]
    for h in result["heads"]:  # self-attention: the self share apart, never offset 0
        if h["positional"]:
            assert h["positional"]["offset"] != 0 or h["positional"]["share"] == 0
            assert 0 <= h["positional"]["self_share"] <= 1
    assert result["thresholds"]["rare_top_k"] == 500 and "enc-self" in result["rare_sentences"]
    assert set(result["lrp_vs_importance"]) == {"enc-self", "dec-self", "dec-enc"}
    assert all(0 <= h["lrp"] <= 1 for h in result["heads"])
    assert "vs importance, Spearman's rank correlation" in " ".join(proc.stdout.split())
    assert result["lrp_sentences"] == 40  # every analysed sentence (max_sentences=40 < 200)
    for name in ("heads_confidence.png", "heads_importance.png", "heads_lrp.png",
                 "head_functions.png",
                 "head_distance.png", "head_diversity.png", "head_map.png", "head_view.html",
                 "attention_s0_enc-self_l1_h0.png", "attention_s3_dec-enc_l0_h3.png"):
        assert (out / name).is_file(), name
    assert "head roles per attention type" in proc.stdout
    md = (out / "analysis.md").read_text()  # the console's tables, for a results/ page
    assert "## head roles per attention type" in md
    assert "## syntactic heads (enc-self, gold, word level)" in md
    assert "## enc-self positions: most common offset ≠ 0" in md and "· self " in md
    assert "## distance between heads (Jensen–Shannon per query, nats; head_map.png)" in md
    amod = result["syntax"]["relations"]["amod dep→head"]
    assert f"| amod dep→head | {amod['arcs']:,} | {amod['baseline']:.2f} |" in md


@pytest.mark.slow  # long end to end: `make test-slow` (CI runs it)
def test_analyze_a_treebank_with_and_without_its_translations(trained, tmp_path):
    from tests.unit.test_treebank import CONLLU

    treebank = tmp_path / "tb.conllu.gz"
    treebank.write_bytes(gzip.compress(CONLLU.encode("utf-8")))
    before = set((trained / "analysis").iterdir()) if (trained / "analysis").is_dir() else set()
    runs = {}
    for ref in ([], ["analysis.treebank_ref=text_en"]):
        proc = heads_lab("analyze", str(trained), f"analysis.treebank={treebank}", *ref,
                         "analysis.heatmaps=[enc:0:1]", cwd=trained)
        assert proc.returncode == 0, proc.stderr + proc.stdout
        (out,) = set((trained / "analysis").iterdir()) - before
        before.add(out)
        runs[bool(ref)] = json.loads((out / "analysis.json").read_text()), proc.stdout, out
    alone, stdout, out = runs[False]  # the encoder alone: no target, no loss, no importance
    assert alone["source"] == "treebank tb.conllu.gz" and alone["sentences"] == 2
    assert list(alone["functions"]) == ["enc-self"]
    assert all(h["importance"] is None for h in alone["heads"])
    syntax = alone["syntax"]
    assert (syntax["source"], syntax["sentences"], syntax["matched"]) == ("treebank", 3, 2)
    assert syntax["unmatched"] == [{"index": 2, "sent_id": "s3",
                                    "reason": "no '# text = ...' line"}]
    assert syntax["arcs_within_a_token"] == 1  # dem → an inside "am"
    assert syntax["relations"]["case dep→head"]["arcs"] == 2
    assert syntax["relations"]["obl dep→head"]["arcs"] == 2  # obl:arg and obl:tmod
    assert "sentences matched to their trees: 2 of 3 (66.7 %)" in " ".join(stdout.split())
    assert (out / "attention_s0_enc-self_l0_h1.png").is_file()
    # says why importance is missing and how to get it, and draws no empty figure of it
    assert "importance: not measured" in stdout and "analysis.treebank_ref=" in stdout
    assert not (out / "heads_importance.png").exists() and (out / "heads_confidence.png").is_file()
    assert "LRP: not measured" in stdout and all("lrp" not in h or h["lrp"] is None
                                                 for h in alone["heads"])
    assert "importance: not measured" in (out / "analysis.md").read_text()
    both, stdout_both, _ = runs[True]
    assert "importance: not measured" not in stdout_both  # teacher-forced on text_en: the decoder too
    assert list(both["functions"]) == ["enc-self", "dec-self", "dec-enc"]
    assert both["sentences"] == 1 and both["syntax"]["matched"] == 1
    assert [u["sent_id"] for u in both["syntax"]["unmatched"]] == ["s2", "s3"]
    assert all(h["importance"] is not None for h in both["heads"])


# (h_K, h, h_V): fewer, more and as many softmax heads as value heads
TALKING = [(8, 4, 8), (8, 16, 8), (2, 8, 4)]


@pytest.fixture(scope="module", params=TALKING, ids=lambda k: "hK{}-h{}-hV{}".format(*k))
def talking(request, tmp_path_factory) -> tuple[Path, tuple[int, int, int]]:
    hk, h, hv = request.param
    cwd = tmp_path_factory.mktemp("talking")
    proc = heads_lab("train", *[a for a in SMALL if not a.startswith("trainer.max_steps")],
                     "trainer.max_steps=10", "model.attention=talking_heads", f"model.heads={h}",
                     f"model.heads_k={hk}", f"model.heads_v={hv}", cwd=cwd)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    (results,) = _results(cwd / "outputs")
    return results.parent, request.param


@pytest.mark.slow  # long end to end: `make test-slow` (CI runs it)
def test_analyze_talking_heads_says_which_heads_every_number_is_about(talking):
    run, (hk, h, hv) = talking
    proc = heads_lab("analyze", str(run), "analysis.max_sentences=20",
                     f"analysis.heatmaps=[enc:1:{h - 1}]", cwd=run)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    (out,) = (run / "analysis").iterdir()
    result = json.loads((out / "analysis.json").read_text())
    sites = ("enc-self", "dec-self", "dec-enc")
    assert result["head_kinds"] == dict.fromkeys(sites, {"qk": hk, "softmax": h, "value": hv})
    assert result["map_kind"] == dict.fromkeys(sites, "softmax")
    by_kind = {}
    for head in result["heads"]:
        by_kind.setdefault(head["kind"], []).append(head)
    count = {"qk": hk, "softmax": h, "value": hv}
    for kind, heads in by_kind.items():  # 3 sites × 2 layers × the kind's count, each once
        keys = {(x["site"], x["layer"], x["head"]) for x in heads}
        assert len(heads) == len(keys) == 3 * 2 * count[kind]
        assert max(x["head"] for x in heads) == count[kind] - 1
    for head in by_kind["softmax"]:  # map measures only on softmax heads, with their importance
        assert head["function"] in ("positional", "syntactic", "rare", "other")
        assert 0 < head["confidence"] <= 1 and head["importance"] >= 0
    assert all(set(x) == {"site", "layer", "kind", "head", "importance"} for x in by_kind["qk"])
    # LRP is taken at the value heads, whose outputs enter the output projection
    assert all(set(x) == {"site", "layer", "kind", "head", "importance", "lrp"}
               for x in by_kind["value"])
    assert all("lrp" not in x for x in by_kind["softmax"])
    grids, kinds = result["grids"], result["grid_kinds"]
    for site in sites:
        assert [len(r) for r in grids["confidence"][site]] == [h, h]
        assert [len(r) for r in grids["importance"][site]] == [h, h]
        assert [len(r) for r in grids["importance_value"][site]] == [hv, hv]
        assert [len(r) for r in grids["importance_qk"][site]] == [hk, hk]
        assert kinds["importance"][site] == kinds["confidence"][site] == "softmax"
        assert (kinds["importance_value"][site], kinds["importance_qk"][site]) == ("value", "qk")
        assert kinds["lrp_value"][site] == "value"
        assert [sum(r) for r in grids["lrp_value"][site]] == pytest.approx([1.0, 1.0])
        for layer in range(2):  # the per-kind grids are the heads' entries, not another kind's
            for kind, name, key in (("softmax", "importance", "importance"),
                                    ("value", "importance_value", "importance"),
                                    ("value", "lrp_value", "lrp")):
                want = [x[key] for x in by_kind[kind] if (x["site"], x["layer"]) == (site, layer)]
                assert grids[name][site][layer] == pytest.approx(want)
        assert np.asarray(result["distances"][site]).shape == (2 * h, 2 * h)  # 2 layers
    assert (out / f"attention_s0_enc-self_l1_softmax-h{h - 1}.png").is_file()
    for name in ("heads_importance_value.png", "heads_importance_qk.png", "head_functions.png"):
        assert (out / name).is_file(), name
    text = " ".join(proc.stdout.split())
    assert f"enc-self softmax heads (h = {h})" in text
    assert f"enc-self · value heads (h_V = {hv}): importance · LRP" in text
    bad = heads_lab("analyze", str(run), f"analysis.heatmaps=[enc:0:{h}]", cwd=run)
    assert bad.returncode == 2 and f"no enc-self layer 0 head '{h}'" in bad.stderr


def test_analyze_bad_input_is_one_line(trained):
    for args, text in ((["analysis.sentences=[999]"], "analysis.sentences has 999"),
                       (["analysis.heatmaps=[enc:7:0]"], "no enc-self layer '7'"),
                       (["model.heads=2"], "'model.heads=2' cannot change here"),
                       (["analysis.step=7"], "analysis.step=7: ")):
        proc = heads_lab("analyze", str(trained), *args, cwd=trained)
        assert proc.returncode == 2 and text in proc.stderr, proc.stderr
        assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_analyze_an_earlier_checkpoint(trained):
    from heads_lab.training.checkpoint import step_files

    steps = [step for step, _ in step_files(trained)]
    assert len(steps) >= 2
    before = set((trained / "analysis").iterdir()) if (trained / "analysis").is_dir() else set()
    proc = heads_lab("analyze", str(trained), f"analysis.step={steps[-1]}",
                     "analysis.max_sentences=5", "analysis.lrp=false", cwd=trained)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    (out,) = set((trained / "analysis").iterdir()) - before
    result = json.loads((out / "analysis.json").read_text())
    assert result["checkpoint"] == f"step_{steps[-1]:07d}.pt"
    assert "lrp" not in result["heads"][0] or result["heads"][0]["lrp"] is None


def test_prune_by_importance_removes_heads_for_real_step_by_step(trained):
    proc = heads_lab("prune", str(trained), "method=importance", "prune.step=0.5",
                     "prune.sites=[enc-self]", "prune.eval_sentences=20", "prune.gate_lr=0.2",
                     cwd=trained)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    assert ("prune.gate_lr=0.2 has no effect with method=importance: only method=gates reads it"
            in " ".join((proc.stderr + proc.stdout).split()))
    (out,) = (trained / "prune").iterdir()
    result = json.loads((out / "prune.json").read_text())
    assert result["precision"] == "fp32"  # what it computed in (TINY's default)
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
    # `report <run>/prune` (the README's next step) says what it reads and where the curve is
    proc = heads_lab("report", str(trained / "prune"), cwd=trained)
    _assert_one_line_error(proc, "importance-pruning curve", str(out), "prune.md", "method=gates")


def test_a_run_and_a_pretrained_model_are_pruned_through_one_seam(trained, tmp_path,
                                                                  monkeypatch):
    """heads_lab/analysis/subject.py's Subject: a run trained here and an `hf:` model both have
    every member it names, and the one loop (importance_curves) prunes both: each step takes
    away the step's share of heads, the least important still there by the scores the subject
    gave under the mask of that moment."""
    from heads_lab.analysis.subject import Subject, importance_curves
    from heads_lab.commands.command import open_subject

    monkeypatch.chdir(tmp_path)
    tiny = _tiny_hf(tmp_path)
    members = set(Subject.__annotations__) | {
        name for name, value in vars(Subject).items() if callable(value) and name[0] != "_"}
    assert {"source", "maps", "importance", "point", "modules", "tokenizer"} <= members
    prune = ["prune.eval_sentences=6", "prune.step=0.25", "prune.sites=[enc-self]"]
    data = ["data=synthetic", "data.train_size=200", "data.valid_size=20", "data.test_size=20",
            "data.vocab_size=300", "data.src=src"]
    for subject in (open_subject(trained, "prune", prune),
                    open_subject(f"hf:{tiny['bert']}", "prune", [*data, *prune])):
        assert not {m for m in members if not hasattr(subject, m)}, type(subject)
        seen, real = [], subject.importance

        def spy(masked, scope, real=real, seen=seen):
            scores = real(masked, scope)
            seen.append(({key: list(heads) for key, heads in masked.items()}, scores))
            return scores

        subject.importance = spy
        rows = importance_curves(subject, ["enc-self"], 0.25, subject.verb, lambda line: None)
        rows = rows["enc-self"]
        total = subject.heads()["enc-self"]
        assert total == 8 and [r["fraction"] for r in rows] == [0.0, 0.25, 0.5, 0.75, 1.0]
        assert [r["kept"]["enc-self"] for r in rows] == [8, 6, 4, 2, 0]
        for (before, scores), (after, _) in zip(seen, seen[1:]):
            left = sorted((float(v), key, h) for key, values in scores.items()
                          for h, v in enumerate(values) if h not in before.get(key, []))
            added = {(key, h) for key, heads in after.items() for h in heads} - {
                (key, h) for key, heads in before.items() for h in heads}
            assert added == {(key, h) for _, key, h in left[:2]}
        assert subject.groups == {}  # no grouped-query attention in either
    # the maps of given token ids (a language model's role probe), at the site that reads a
    # sequence alone: a translator's encoder, which reads them as a source (its EOS after them)
    run = open_subject(trained, "analyze", [])
    (made,) = run.sequence_maps([[5, 6, 7, 8, 9]])
    assert set(made.maps) == {"enc-self"} and made.maps["enc-self"].shape[-2:] == (6, 6)
    assert made.src[:5] == [5, 6, 7, 8, 9]
    np.testing.assert_allclose(made.maps["enc-self"].sum(-1), 1.0, rtol=1e-5)


def test_a_pretrained_models_bad_input_is_one_line_and_leaves_no_output_dir(tmp_path):
    """eval takes run dirs only (an hf: name is no run dir); prune of an hf: model whose data set
    cannot be read, or on attention types it lacks, stops in one line before any output dir."""
    _assert_one_line_error(heads_lab("eval", "hf:someone/model", cwd=tmp_path),
                           "no run dir hf:someone/model")
    tiny = _tiny_hf(tmp_path)
    bert = f"hf:{tiny['bert']}"
    _assert_one_line_error(heads_lab("prune", bert, "data=multi30k", "data.src=en",
                                     f"data.root={tmp_path / 'gone'}", cwd=tmp_path), "gone")
    _assert_one_line_error(heads_lab("prune", bert, "data=synthetic", "data.src=src",
                                     "data.train_size=100", "prune.sites=[dec-self]",
                                     cwd=tmp_path),
                           "prune.sites=['dec-self']", "it has enc-self")
    assert not list((tmp_path / "outputs").glob("hf/*/prune/*"))


@pytest.mark.slow  # long end to end: `make test-slow` (CI runs it)
def test_prune_with_gates_and_eval_with_a_head_mask(trained):
    proc = heads_lab("prune", str(trained), "-m", "method=gates", "prune.l0_lambda=0,5",
                     "prune.steps=8", "prune.gate_lr=3.0", "prune.eval_sentences=20",
                     cwd=trained)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    assert "heads kept (voita rule) vs BLEU" in " ".join(proc.stdout.split())
    found = sorted((trained / "prune").glob("*gates*/results.json"))
    assert len(found) == 2
    assert {json.loads(p.read_text())["prune"]["gate_eval"] for p in found} == {"voita"}
    assert {json.loads(p.read_text())["precision"] for p in found} == {"fp32"}
    kept = [json.loads(p.read_text())["metrics"] for p in found]
    for m, path in zip(kept, found):
        assert 0 <= m["heads_kept/enc-self"] <= 8 and 0 <= m["test/bleu"] <= 100
        # the PPL measured on the eval split is filed under it (it once read as valid/ppl)
        assert m["test/ppl"] == json.loads(path.read_text())["prune"]["ppl"]
        assert "valid/ppl" not in m
    total = [sum(m[f"heads_kept/{s}"] for s in ("enc-self", "dec-self", "dec-enc")) for m in kept]
    assert total[0] > total[1]  # λ = 5 closes more gates than λ = 0
    # the same run again gives the same numbers (the gates' noise and dropout are seeded)
    again = heads_lab("prune", str(trained), "method=gates", "prune.l0_lambda=5",
                      "prune.steps=8", "prune.gate_lr=3.0", "prune.eval_sentences=20",
                      cwd=trained)
    assert again.returncode == 0, again.stderr + again.stdout
    twice = [json.loads(p.read_text())["prune"] for p in
             sorted((trained / "prune").glob("*l0_lambda=5*/results.json"))]
    assert len(twice) == 2 and twice[0]["ppl"] == twice[1]["ppl"]
    assert twice[0]["removed"] == twice[1]["removed"] and twice[0]["bleu"] == twice[1]["bleu"]

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


@pytest.mark.slow  # long end to end: `make test-slow` (CI runs it)
def test_prune_masks_the_heads_of_attention_that_cannot_lose_them(tmp_path):
    """Multi-query attention (one key/value head) cannot lose a query head alone: both methods
    mask the pruned heads instead, the model keeps its parameters, and a masked point is what
    `heads-lab eval` with those heads masked computes."""
    proc = heads_lab("train", *SMALL, "model.kv_heads=1", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    (results,) = _results(tmp_path / "outputs")
    run = results.parent
    proc = heads_lab("prune", str(run), "method=importance", "prune.step=0.5",
                     "prune.sites=[enc-self]", "prune.eval_sentences=40", cwd=run)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    assert "masked (their outputs zeroed), not removed" in " ".join(proc.stdout.split())
    (out,) = (run / "prune").iterdir()
    result = json.loads((out / "prune.json").read_text())
    assert result["heads_pruned_by"] == "mask"
    rows = result["curves"]["enc-self"]
    assert [r["kept"]["enc-self"] for r in rows] == [8, 4, 0]
    assert len({r["params"] for r in rows}) == 1  # masked, not removed
    half = rows[1]
    proc = heads_lab("eval", str(run), f"eval.head_mask='{half['masked']}'", cwd=run)
    assert proc.returncode == 0, proc.stderr
    (done,) = (run / "evals").glob("*/eval.json")
    metrics = json.loads(done.read_text())["metrics"]
    assert metrics["test/ppl"] == pytest.approx(half["ppl"], rel=1e-6)
    assert metrics["test/bleu"] == pytest.approx(half["bleu"], abs=1e-9)
    # gates: under the binary rule every gate starts closed (init_keep 0.5), and λ keeps them so
    proc = heads_lab("prune", str(run), "method=gates", "prune.steps=2", "prune.init_keep=0.5",
                     "prune.gate_eval=binary", "prune.l0_lambda=1", "prune.eval_sentences=10",
                     cwd=run)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    (gated,) = (run / "prune").glob("*gates*/results.json")
    summary = json.loads(gated.read_text())
    assert json.loads((gated.parent / "prune.json").read_text())["heads_pruned_by"] == "mask"
    assert summary["metrics"]["heads_kept/enc-self"] < 8
    assert summary["metrics"]["cost/params"] == rows[0]["params"]


@pytest.mark.slow  # long end to end: `make test-slow` (CI runs it)
def test_gates_from_scratch_report_heads_kept_and_evaluate_again(tmp_path):
    proc = heads_lab("train", *SMALL, "prune.l0_lambda=1.0", "prune.gate_lr=0.3", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    (found,) = _results(tmp_path / "outputs")
    m = json.loads(found.read_text())["metrics"]
    for site in ("enc-self", "dec-self", "dec-enc"):
        assert 0 <= m[f"heads_kept/{site}"] <= 8
    # info of the run counts its gates (one log α per head) among the trained parameters
    (row,) = json.loads(heads_lab("info", "--json", str(found.parent), cwd=tmp_path).stdout)
    results = json.loads(found.read_text())
    model = results["config"]["model"]
    layers = model["encoder_layers"] + 2 * model["decoder_layers"]  # self; self and cross
    assert row["params"]["head_gates"] == model["heads"] * layers == 4 * 6
    assert row["params"]["total"] == results["params"]["total"] == m["cost/params"]
    again = heads_lab("eval", str(found.parent), "eval.beam=1", cwd=tmp_path)  # gates reload
    assert again.returncode == 0, again.stderr
    analyzed = heads_lab("analyze", str(found.parent), "analysis.max_sentences=10", cwd=tmp_path)
    assert analyzed.returncode == 0, analyzed.stderr  # importance under the closed gates


@pytest.mark.parametrize("mixes,counts", [("logits", (2, 4, 4)), ("weights", (4, 4, 2))],
                         ids=["logits only", "weights only"])
@pytest.mark.slow  # long end to end: `make test-slow` (CI runs it)
def test_talking_heads_with_one_mix_train_analyze_mask_and_gate(tmp_path, mixes, counts):
    hk, h, hv = counts
    proc = heads_lab("train", *[a for a in SMALL if not a.startswith("trainer.max_steps")],
                     "trainer.max_steps=10", "model.attention=talking_heads", f"model.mixes={mixes}",
                     f"model.heads={h}", f"model.heads_k={hk}", f"model.heads_v={hv}", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    (results,) = _results(tmp_path / "outputs")
    run = results.parent
    summary = json.loads(results.read_text())
    assert summary["metrics"]["cost/params"] > 0
    proc = heads_lab("analyze", str(run), "analysis.max_sentences=10", cwd=run)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    (out,) = (run / "analysis").iterdir()
    result = json.loads((out / "analysis.json").read_text())
    grids = result["grids"]
    # the kind without its mix is the same heads as its neighbour: the same importance
    twin = ("importance", "importance_value") if mixes == "logits" else ("importance_qk", "importance")
    for site in ("enc-self", "dec-self", "dec-enc"):
        np.testing.assert_allclose(grids[twin[0]][site], grids[twin[1]][site], rtol=1e-12)
        assert [sum(r) for r in grids["lrp_value"][site]] == pytest.approx([1.0, 1.0])
    masked = heads_lab("eval", str(run), "eval.beam=1", "eval.head_mask=enc:*:0", cwd=run)
    assert masked.returncode == 0, masked.stderr
    gates = heads_lab("prune", str(run), "method=gates", "prune.steps=4", "prune.eval_sentences=5",
                      cwd=run)
    assert gates.returncode == 0, gates.stderr + gates.stdout


def _tiny_hf(tmp_path) -> dict[str, Path]:
    import importlib.util
    import sys

    pytest.importorskip("transformers", reason="the hf extra (make test installs it)")
    path = Path(__file__).resolve().parents[2] / "scripts" / "hf_tiny_models.py"
    spec = importlib.util.spec_from_file_location("hf_tiny_models", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    data = os.environ.get("HEADS_LAB_DATA")
    return module.build(tmp_path / "hf", Path(data) if data else None)


PUD = Path(os.environ.get("HEADS_LAB_DATA", "/nonexistent")) / "ud-pud"


@pytest.mark.slow  # long end to end: `make test-slow` (CI runs it)
@pytest.mark.skipif(not (PUD / "de_pud-ud-test.conllu.gz").is_file(),
                    reason="PUD not found: set HEADS_LAB_DATA to the dir holding ud-pud/ "
                           "(.ci/run points it at ../shared/data)")
def test_pretrained_models_go_through_info_analyze_and_prune(tmp_path):
    tiny = _tiny_hf(tmp_path)
    proc = heads_lab("info", *[f"hf:{p}" for p in tiny.values()], "--json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    rows = json.loads(proc.stdout)
    assert [r["family"] for r in rows] == ["marian", "bert", "distilbert", "gpt2", "gpt_neox",
                                           "llama", "mistral", "qwen2"]
    assert rows[0]["layers"] == "2+2" and rows[1]["heads"] == {"enc-self": 4}
    assert all("lm-self" in r["heads"] for r in rows[3:])
    for family, lang, extra in (("marian", "de", ["analysis.treebank_ref=text_en"]),
                                ("bert", "en", []), ("distilbert", "en", [])):
        proc = heads_lab("analyze", f"hf:{tiny[family]}",
                         f"analysis.treebank={PUD / f'{lang}_pud-ud-test.conllu.gz'}",
                         "analysis.max_sentences=30", *extra, cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr + proc.stdout
        (found,) = (tmp_path / "outputs" / "hf").glob(f"*{family}/analysis/*/analysis.json")
        result = json.loads(found.read_text())
        assert result["syntax"]["matched"] == 30 and result["model"]["family"] == family
        sites = {"marian": {"enc-self", "dec-self", "dec-enc"}}.get(family, {"enc-self"})
        assert set(result["functions"]) == sites
        assert all(h["importance"] is not None for h in result["heads"])
        assert "lrp" in result["not_measured"] and "not measured for this family" in proc.stdout
    for family, args in (("marian", []), ("bert", ["data.src=en", "method=importance",
                                                   "prune.gate_lr=0.2"])):
        proc = heads_lab("prune", f"hf:{tiny[family]}", "data=multi30k", *args,
                         "prune.eval_sentences=12", "prune.step=0.5", "prune.sites=[enc-self]",
                         "eval.beam=1", cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr + proc.stdout
        assert ("warning: prune.gate_lr=0.2 has no effect with method=importance: prune hf:... "
                "runs method=importance only" in " ".join(proc.stdout.split())) == (
                    family == "bert")
        (found,) = (tmp_path / "outputs" / "hf").glob(f"*{family}/prune/*/prune.json")
        curve = json.loads(found.read_text())["curves"]["enc-self"]
        assert [r["fraction"] for r in curve] == [0.0, 0.5, 1.0]
        assert [r["kept"]["enc-self"] for r in curve] == [8, 4, 0]
        assert ("bleu" if family == "marian" else "accuracy") in curve[0]
    _assert_one_line_error(heads_lab("prune", f"hf:{tiny['bert']}", "method=gates",
                                     cwd=tmp_path), "prune hf:... runs method=importance")


@pytest.mark.parametrize("case,fragments", [
    ("offline", ["hf:someone/no-such-model", "unreachable (offline)", "save_pretrained"]),
    ("opt", ["is a 'opt' model", "marian, bert, distilbert, gpt2, gpt_neox, llama, mistral, "
                                 "qwen2"]),
    ("missing", ["no such save_pretrained dir"]),
    ("no-transformers", ["need the transformers package", "pip install 'heads-lab[hf]'"]),
])
def test_a_pretrained_model_that_cannot_be_read_is_one_line(tmp_path, case, fragments):
    pytest.importorskip("transformers", reason="the hf extra (make test installs it)")
    name = {"offline": "someone/no-such-model", "missing": str(tmp_path / "none"),
            "no-transformers": "bert-base-uncased"}.get(case)
    env = {"HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf-home")}
    if case == "no-transformers":  # a Python where `import transformers` fails
        (tmp_path / "hide").mkdir()
        (tmp_path / "hide" / "sitecustomize.py").write_text(
            "import sys\nsys.modules['transformers'] = None\n")
        env["PYTHONPATH"] = str(tmp_path / "hide")
    if case == "opt":  # a causal LM family heads-lab does not map
        from transformers import OPTConfig, OPTForCausalLM

        OPTForCausalLM(OPTConfig(num_hidden_layers=1, hidden_size=16, num_attention_heads=2,
                                 ffn_dim=32, word_embed_proj_dim=16,
                                 vocab_size=50)).save_pretrained(tmp_path / "opt")
        name = str(tmp_path / "opt")
    proc = heads_lab("info", f"hf:{name}", cwd=tmp_path, env=env)
    _assert_one_line_error(proc, *fragments)
