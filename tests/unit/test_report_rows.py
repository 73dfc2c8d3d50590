"""The report's rows: runs of one model from two presets (one leaves a head count None, the other
sets the value the None stands for) are one row; shape columns say only what applies."""

from __future__ import annotations

import json
import os
import statistics
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from heads_lab.commands.report import render
from heads_lab.report.rows import (
    NOT_APPLICABLE,
    Comparison,
    Run,
    base_row,
    group,
    model_shape,
)


def _render(rows, varying):
    """The table with the first row as the one base (report.py's main picks it from the preset)."""
    return render(rows, [Comparison(rows, rows[0])], varying, "test", None)


def _table(runs):
    return _render(*group(runs))


def _run(seed: int, **model) -> Run:
    config = {"seed": seed, "model.d_model": 256, "model.heads": 8, "model.head_dim": None,
              "model.attention": "mha", "model.kv_heads": None, "model.heads_k": None,
              "model.heads_v": None, "model.encoder_layers": 3, "model.decoder_layers": 3}
    config.update({f"model.{k}": v for k, v in model.items()})
    return Run(Path(f"run{seed}"), config, {"test/bleu": 30.0 + seed}, {})


def test_a_kv_heads_study_joined_with_table_a_runs_of_the_same_model_has_one_base_row():
    kv = [_run(s, kv_heads=k) for k in (1, 4) for s in (1, 2)]
    for run in kv:
        run.config["report.base.model.kv_heads"] = 8  # the kv_heads preset's base row
    table_a = [_run(s) for s in (1, 2)]  # 8 heads, kv_heads None: the kv_heads = 8 model
    rows, varying = group(kv + table_a)
    assert varying == ["model.kv_heads"]
    assert [(r.label, len(r.runs)) for r in rows] == [("kv=1", 2), ("kv=4", 2), ("kv=8", 2)]
    assert base_row(rows, kv + table_a).label == "kv=8"


def test_talking_heads_with_explicit_and_defaulted_shape_keys_are_one_row():
    explicit = [_run(s, attention="talking_heads", heads=h, heads_k=8, heads_v=8, head_dim=32)
                for h in (4, 8) for s in (1, 2)]
    defaulted = [_run(3, attention="talking_heads")]  # heads_k = heads_v = 8, d_k = 256 / 8
    rows, varying = group(explicit + defaulted)
    assert varying == ["model.heads"]
    assert [(r.label, len(r.runs)) for r in rows] == [("h=4", 2), ("h=8", 3)]


def test_keys_none_in_every_run_stay_unset_and_shape_columns_follow_the_variant():
    mha = [_run(1, heads=h) for h in (1, 8)]
    rows, varying = group(mha)
    assert varying == ["model.heads"] and all(r.config["model.kv_heads"] is None for r in mha)
    table = _render(rows, varying)
    assert table["header"][:5] == ["setting", "h", "kv", "d_k", "enc+dec"]  # no h_K, h_V
    assert [b[1:5] for b in table["rows"]] == [["1", "1", "256", "3+3"], ["8", "8", "32", "3+3"]]

    both = mha + [_run(1, attention="talking_heads", heads=4, heads_k=2, heads_v=8)]
    rows, varying = group(both)
    table = _render(rows, varying)
    columns = {name: i for i, name in enumerate(table["header"])}
    talking = next(b for b in table["rows"] if b[0].startswith("attention=talking_heads"))
    multi = next(b for b in table["rows"] if b[0].startswith("attention=mha,h=8"))
    assert [talking[columns[k]] for k in ("h", "kv", "h_K", "h_V", "d_k")] == [
        "4", NOT_APPLICABLE, "2", "8", "64"]
    assert [multi[columns[k]] for k in ("h", "kv", "h_K", "h_V", "d_k")] == [
        "8", "8", NOT_APPLICABLE, NOT_APPLICABLE, "32"]


def test_a_config_without_head_counts_has_no_shape_and_is_shown_as_written():
    assert model_shape({}) == {} and model_shape({"model.heads": 4, "model.attention": "x"}) == {}
    odd = _run(1, attention="not_a_variant", heads=4)
    rows, varying = group([odd])
    table = _render(rows, varying)
    columns = {name: i for i, name in enumerate(table["header"])}
    assert table["rows"][0][columns["h"]] == "4" and table["rows"][0][columns["d_k"]] == "64"


def test_the_quality_plot_draws_a_line_per_attention_kind_against_h():
    from heads_lab.report.figures import curves

    runs = ([_run(1, heads=h) for h in (16, 4, 8)]
            + [_run(1, attention="talking_heads", heads=h) for h in (8, 4)])
    rows, varying = group(runs)
    x_key, lines = curves(rows, varying)
    assert x_key == "model.heads"
    assert {label: [rows[i].runs[0].config["model.heads"] for i in order]
            for label, order in lines.items()} == {"attention=mha": [4, 8, 16],
                                                   "attention=talking_heads": [4, 8]}
    x_key, lines = curves(*group([_run(1, heads=h) for h in (4, 1)]))  # table_a: one line
    assert x_key == "model.heads" and list(lines) == [""] and len(lines[""]) == 2
    both = [_run(1, heads=4, kv_heads=2), _run(1, heads=8, kv_heads=1)]  # two numbers vary
    assert curves(*group(both)) == (None, {"": [0, 1]})


def _talking(seed: int, heads_k: int, overrides: list[str]) -> Run:
    run = _run(seed, attention="talking_heads", heads_k=heads_k, heads_v=heads_k,
               head_dim=256 // heads_k)
    run.results["overrides"] = [f"seed={seed}", *overrides, "trainer.precision=fp32"]
    return run


def test_the_swept_setting_orders_the_rows_and_is_the_x_axis_where_others_follow_from_it():
    """talking_heads_kv sweeps h_K; d_k = d_model / h_K and h_V = h_K follow. Its base row h_K = 8
    is another preset's runs (talking_heads_h, swept on model.heads)."""
    from heads_lab.report.figures import curves

    kv = [_talking(s, k, ["+experiment=talking_heads_kv", f"model.heads_k={k}"])
          for s in (1, 2) for k in (16, 2, 4)]
    reused = [_talking(s, 8, ["+experiment=talking_heads_h", "model.heads=8"]) for s in (1, 2)]
    rows, varying = group(kv + reused)
    assert varying == ["model.heads_k", "model.head_dim", "model.heads_v"]
    assert [(r.label, len(r.runs)) for r in rows] == [
        ("h_K=2,d_k=128,h_V=2", 2), ("h_K=4,d_k=64,h_V=4", 2), ("h_K=8,d_k=32,h_V=8", 2),
        ("h_K=16,d_k=16,h_V=16", 2)]
    assert curves(rows, varying) == ("model.heads_k", {"": [0, 1, 2, 3]})

    # the same runs without their command lines (an older results.json): d_k sorts first and
    # no setting is the x axis, as before
    for run in kv + reused:
        run.results.pop("overrides")
    rows, varying = group(kv + reused)
    assert varying == ["model.head_dim", "model.heads_k", "model.heads_v"]
    assert [r.label for r in rows][0] == "d_k=16,h_K=16,h_V=16"
    assert curves(rows, varying) == (None, {"": [0, 1, 2, 3]})


def test_no_x_axis_where_a_second_number_varies_on_its_own():
    from heads_lab.report.figures import curves

    # two swept numbers (a grid): no single x
    grid = [_run(1, heads=h, kv_heads=k) for h in (4, 8) for k in (1, 2)]
    for run in grid:
        run.results["overrides"] = [f"model.heads={run.config['model.heads']}",
                                    f"model.kv_heads={run.config['model.kv_heads']}"]
    assert curves(*group(grid)) == (None, {"": [0, 1, 2, 3]})
    # one swept number and another set by hand per run, not following from it
    odd = [_run(1, heads=8, encoder_layers=3), _run(2, heads=8, encoder_layers=6),
           _run(3, heads=4, encoder_layers=3)]
    for run in odd:
        run.results["overrides"] = [f"model.heads={run.config['model.heads']}"]
    rows, varying = group(odd)
    assert varying == ["model.heads", "model.encoder_layers"]
    assert curves(rows, varying) == (None, {"": [0, 1, 2]})


def _by_data(seed: int, fraction: float, heads: int, best_step: int | None) -> Run:
    """A heads_by_data run: h and the data fraction swept, evaluated on its best weights."""
    run = _run(seed, heads=heads)
    run.config.update({"data.train_fraction": fraction, "report.x": "data.train_fraction"})
    run.results["overrides"] = [f"seed={seed}", f"data.train_fraction={fraction}",
                                f"model.heads={heads}"]
    run.results["train"] = {"evaluated": {"checkpoint": "best", "step": best_step}
                            if best_step else {"checkpoint": "last", "step": 1000}}
    run.results["data"] = {"train": {"read": 29000, "kept": round(fraction * 29000)}}
    return run


def test_rows_on_different_amounts_of_data_show_their_training_pairs():
    rows, varying = group([_by_data(s, f, 8, 300) for s in (1, 2) for f in (0.1, 1.0)])
    table = _render(rows, varying)
    column = table["header"].index("train pairs")
    assert [b[column] for b in table["rows"]] == ["2,900", "29,000"]
    same = _table([_by_data(1, 1.0, h, 300) for h in (1, 8)])
    assert "train pairs" not in same["header"]


def test_the_preset_names_the_x_axis_where_two_swept_numbers_vary():
    """heads_by_data sweeps h and the data fraction: without report.x no single x (a grid); with
    it, BLEU against data size, one line per h."""
    from heads_lab.report.figures import curves

    runs = [_by_data(1, f, h, 500) for h in (8, 1) for f in (1.0, 0.1, 0.3)]
    rows, varying = group(runs)
    x_key, lines = curves(rows, varying)
    assert x_key == "data.train_fraction"
    assert {label: [rows[i].runs[0].config["data.train_fraction"] for i in order]
            for label, order in lines.items()} == {"h=1": [0.1, 0.3, 1.0], "h=8": [0.1, 0.3, 1.0]}
    for run in runs:
        run.config["report.x"] = None
    assert curves(*group(runs)) == (None, {"": [0, 1, 2, 3, 4, 5]})
    for run in runs:  # a report.x that does not vary here is no x
        run.config["report.x"] = "model.d_model"
    assert curves(*group(runs))[0] is None


def test_runs_evaluated_on_their_best_weights_show_the_best_step_and_say_so():
    runs = [_by_data(1, 0.1, 8, 300), _by_data(2, 0.1, 8, 500), _by_data(1, 1.0, 8, 1000)]
    rows, varying = group(runs)
    table = _render(rows, varying)
    column = table["header"].index("best step")
    assert [b[column] for b in table["rows"]] == ["400 ± 141", "1,000"]
    assert "evaluated: the best validation's weights (eval.checkpoint=best)" in table["note"]
    assert "last weights" not in table["note"]
    mixed = runs + [_by_data(3, 0.1, 8, None)]  # one run evaluated its last weights
    table = _table(mixed)
    assert [b[table["header"].index("best step")] for b in table["rows"]][0] == "400 ± 141"
    assert "in the runs that have one; the others' last weights" in table["note"]
    plain = _table([_run(1, heads=h) for h in (1, 8)])
    assert "best step" not in plain["header"] and "evaluated" not in plain["note"]


def test_runs_under_a_time_budget_show_the_steps_it_bought_and_say_so():
    """equal_cost: every row has the same trainer.max_time, so the updates each row made in it
    (and their seconds) are part of the answer: two columns and the budget in the note."""
    def timed(seed, heads, steps, seconds, stopped_by="max_time"):
        run = _run(seed, heads=heads)
        run.results["train"] = {"steps": steps, "seconds": seconds, "max_time": 1800.0,
                                "stopped_by": stopped_by}
        return run

    runs = [timed(1, 8, 1965, 1800.6), timed(2, 8, 1935, 1800.2), timed(1, 32, 1200, 1801.0),
            timed(2, 32, 1000, 1500.0, "max_steps")]
    rows, varying = group(runs)
    table = _render(rows, varying)
    steps, seconds = table["header"].index("steps"), table["header"].index("train s")
    assert [(b[0], b[steps], b[seconds]) for b in table["rows"]] == [
        ("h=8 (base)", "1,950 ± 21", "1,800 ± 0"), ("h=32", "1,100 ± 141", "1,650 ± 213")]
    assert ("time budget: trainer.max_time = 1800 s of updates, which ended 3 of 4 runs"
            in table["note"])
    plain = _table([_run(1, heads=h) for h in (1, 8)])
    assert "steps" not in plain["header"] and "time budget" not in plain["note"]


def test_an_older_rectangular_talking_heads_run_is_its_own_row_with_the_start_it_had(tmp_path):
    """results.json written before model.mix_init: a rectangular run started as the identity
    (read back so), not as today's default; a square run's start is today's default (one row)."""
    import json

    from heads_lab.report.rows import collect

    def write(name, seed, heads, **model):
        run = tmp_path / name
        run.mkdir()
        config = {"seed": seed, "model": {"d_model": 256, "heads": heads, "heads_k": 8,
                                          "heads_v": 8, "head_dim": 32,
                                          "attention": "talking_heads", **model}}
        (run / "results.json").write_text(json.dumps(
            {"status": "complete", "config": config, "metrics": {"test/bleu": 30.0 + seed}}))

    write("old_rect", 1, 4)  # no model.mix_init: written before it existed
    write("new_rect", 1, 4, mix_init=None)
    write("old_square", 1, 8)
    write("new_square", 2, 8, mix_init=None)
    runs, problems = collect([tmp_path])
    assert not problems
    rows, varying = group(runs)
    assert varying == ["model.heads", "model.mix_init"]
    got = sorted((r.runs[0].config["model.heads"], str(r.runs[0].config.get("model.mix_init")),
                  sorted(run.dir.name for run in r.runs)) for r in rows)
    assert got == [(4, "None", ["new_rect"]), (4, "identity", ["old_rect"]),
                   (8, "None", ["new_square", "old_square"])]


def _scored(tmp_path: Path, name: str, heads: int, hyps: list[str], refs: list[str]) -> Run:
    """A run dir with its translations, its test/bleu sacrebleu's on them (as train writes)."""
    from sacrebleu.metrics import BLEU

    run = _run(1, heads=heads)
    run.dir = tmp_path / name
    run.dir.mkdir()
    (run.dir / "hyps.test.txt").write_text("\n".join(hyps) + "\n", encoding="utf-8")
    (run.dir / "refs.test.txt").write_text("\n".join(refs) + "\n", encoding="utf-8")
    run.metrics["test/bleu"] = BLEU().corpus_score(hyps, [refs]).score
    return run


def _seed_aware_p(mine: list[Run], base: list[Run], samples: int) -> float:
    """The seed-aware p written out (heads_lab/report/significance.py's docstring): each run's
    BLEU on each draw of the test sentences by sacrebleu on the drawn lines themselves, the test
    set's variance less the runs' own noise, Welch's t with its degrees of freedom."""
    import numpy as np
    from sacrebleu.metrics import BLEU
    from scipy import stats

    from heads_lab.report.significance import sentence_draws

    def text(run, kind):
        return (run.dir / f"{kind}.test.txt").read_text(encoding="utf-8").splitlines()

    refs = text(base[0], "refs")
    draws = sentence_draws(len(refs), samples)

    def on_draws(run):
        hyps, out = text(run, "hyps"), []
        for row in draws:
            picked = [i for i, c in enumerate(row) for _ in range(int(c))]
            out.append(BLEU().corpus_score([hyps[i] for i in picked],
                                           [[refs[i] for i in picked]]).score)
        return np.array(out)

    a, b = (np.array([r.metrics["test/bleu"] for r in x]) for x in (mine, base))
    da, db = (np.array([on_draws(r) for r in x]) for x in (mine, base))
    noise = sum(np.mean(np.var(d - d.mean(0), axis=1, ddof=1)) / (len(d) - 1) for d in (da, db))
    v_sents = max(np.var(da.mean(0) - db.mean(0), ddof=1) - noise, 0.0)
    va, vb = a.var(ddof=1) / len(a), b.var(ddof=1) / len(b)
    if va + vb + v_sents == 0:  # every run scores alike on every draw (a tiny model's BLEU 0)
        return 1.0 if a.mean() == b.mean() else 0.0
    df = (va + vb + v_sents) ** 2 / (va ** 2 / (len(a) - 1) + vb ** 2 / (len(b) - 1))
    t = (a.mean() - b.mean()) / np.sqrt(va + vb + v_sents)
    return float(2 * stats.t.sf(abs(t), df))


def test_p_values_pair_only_the_same_references_and_never_call_no_difference_significant(tmp_path):
    from sacrebleu.metrics import BLEU
    from sacrebleu.significance import PairedTest

    from heads_lab.report.seeds import p_text, significance

    refs = [f"the {w} dog runs over the green grass today" for w in
            ("small", "big", "old", "young", "brown", "black", "white", "tall")] * 5
    base = [r.replace("grass", "field") for r in refs]
    better = list(refs[:30]) + base[30:]
    equal = list(base)  # other words, same n-gram matches in every segment: the same BLEU
    equal[0] = equal[0].replace("field", "lawn")
    other_refs = [r.replace("dog", "cat") for r in refs]  # another test set, same line count
    runs = [_scored(tmp_path, "base", 8, base, refs), _scored(tmp_path, "better", 1, better, refs),
            _scored(tmp_path, "same", 2, base, refs), _scored(tmp_path, "equal", 4, equal, refs),
            _scored(tmp_path, "other", 16, base, other_refs)]
    rows, _ = group(runs)
    by_heads = {row.runs[0].config["model.heads"]: row for row in rows}
    assert significance(rows, by_heads[8], "test", 200) == [1]
    # a different system: sacrebleu's own paired bootstrap, unchanged
    _, scores = PairedTest([("base", base), ("better", better)], {"BLEU": BLEU()}, [refs],
                           test_type="bs", n_samples=200)()
    assert by_heads[1].p_value == scores["BLEU"][1].p_value < 0.05
    assert p_text(by_heads[1]) == f"{by_heads[1].p_value:.4f} (seed 1, sentences only)"
    assert p_text(by_heads[2]) == "– (same hypotheses)"
    # sacrebleu itself calls a difference of exactly zero significant (p = 1/(n + 1))
    _, scores = PairedTest([("base", base), ("equal", equal)], {"BLEU": BLEU()}, [refs],
                           test_type="bs", n_samples=200)()
    assert scores["BLEU"][1].score == scores["BLEU"][0].score and scores["BLEU"][1].p_value < 0.01
    assert by_heads[4].p_value == 1.0
    assert p_text(by_heads[4]) == "1.0000 (equal BLEU; seed 1, sentences only)"
    assert by_heads[16].p_value is None and p_text(by_heads[16]) == "– (other test set)"
    assert p_text(by_heads[8]) == "-"  # the base row itself


def test_rows_with_two_seeds_get_the_seed_aware_p_and_a_row_with_one_the_bootstrap(tmp_path):
    """A study still in progress: the base and h = 1 on seeds 1, 2, h = 32 on seed 1 only. h = 1
    gets Welch's t over its seeds with the test set's variance (the formula written out:
    _seed_aware_p), h = 32 sacrebleu's paired bootstrap on seed 1 (its seed spread unknown), its
    cell says so, and the note names both tests."""
    from sacrebleu.metrics import BLEU
    from sacrebleu.significance import PairedTest

    from heads_lab.report.rows import comparisons
    from heads_lab.report.seeds import p_note, p_text, significance

    refs = [f"the {w} dog runs over the green grass today" for w in
            ("small", "big", "old", "young", "brown", "black", "white", "tall")] * 12
    base = {1: [r.replace("grass", "field") for r in refs],
            2: [r.replace("grass", "lawn") for r in refs[:88]] + refs[88:]}
    one = {1: refs[:48] + base[1][48:], 2: refs[:44] + base[2][44:]}  # better in both seeds
    many = {1: base[1][:48] + [r.replace("dog", "cat") for r in base[1][48:]]}
    runs = []
    for heads, hyps in ((8, base), (1, one), (32, many)):
        for seed in hyps:
            run = _scored(tmp_path, f"h{heads}s{seed}", heads, hyps[seed], refs)
            run.config["seed"] = seed
            runs.append(run)
    alone = _scored(tmp_path, "h16s3", 16, one[1], refs)
    alone.config["seed"] = 3  # one seed, none of the base row's: no p
    runs.append(alone)
    rows, varying = group(runs)
    by_heads = {row.runs[0].config["model.heads"]: row for row in rows}
    assert significance(rows, by_heads[8], "test", 200) == [1]
    assert by_heads[16].p_value is None
    assert p_text(by_heads[16]) == "– (no seed of the base row)"
    want = _seed_aware_p(by_heads[1].runs, by_heads[8].runs, 200)
    assert by_heads[1].p_value == pytest.approx(want, rel=1e-9) and want < 0.001
    assert p_text(by_heads[1]) == "< 0.001"
    _, scores = PairedTest([("base", base[1]), ("row", many[1])], {"BLEU": BLEU()}, [refs],
                           test_type="bs", n_samples=200)()
    assert by_heads[32].p_value == scores["BLEU"][1].p_value
    assert p_text(by_heads[32]) == f"{by_heads[32].p_value:.4f} (seed 1, sentences only)"
    x, tested = comparisons(rows, runs)
    note = p_note(tested, varying, x)
    assert note.startswith("p: Welch's t-test of mean BLEU over seeds vs the base row, its "
                           "variance the seeds' spread plus the test set's")
    assert ("a p marked 'sentences only': sacrebleu paired bootstrap of BLEU vs the base row on "
            "the seed it shares with the base row") in note
    # without the translations (results.json copied back alone): Welch's t over the seeds
    for run in by_heads[1].runs:
        (run.dir / "hyps.test.txt").unlink()
    by_heads[1].p_value = None
    significance(rows, by_heads[8], "test", 200)
    welch = stats.ttest_ind([r.metrics["test/bleu"] for r in by_heads[1].runs],
                            [r.metrics["test/bleu"] for r in by_heads[8].runs], equal_var=False)
    assert by_heads[1].p_value == pytest.approx(welch.pvalue, rel=1e-9)
    assert p_text(by_heads[1]) == f"{welch.pvalue:.4f} (seeds only)"
    assert "(seeds only): the translations are not at hand" in p_note(tested, varying, x)


def test_each_run_has_its_own_p_against_the_base_run_of_its_seed(tmp_path):
    """runs.csv's per-seed p: each run against the base row's run of the same seed, on that
    seed's lines alone (sacrebleu's own p for the pair); the base's runs say "base", a run whose
    seed the base lacks or whose references differ says why."""
    from sacrebleu.metrics import BLEU
    from sacrebleu.significance import PairedTest

    from heads_lab.report.seeds import seed_p_values

    refs = {s: [f"the {w} dog number {s} runs over the green grass" for w in
                ("small", "big", "old", "young", "brown", "black", "white", "tall")] * 4
            for s in (1, 2, 3)}
    base = {s: [r.replace("grass", "field") for r in refs[s]] for s in (1, 2)}
    one = {1: refs[1][:3] + base[1][3:], 2: [r.replace("dog", "cat") for r in base[2][:9]]
           + base[2][9:], 3: refs[3]}
    runs = {}
    for heads, hyps in ((8, base), (1, one)):
        for seed in hyps:
            runs[heads, seed] = _scored(tmp_path, f"h{heads}s{seed}", heads, hyps[seed], refs[seed])
            runs[heads, seed].config["seed"] = seed
    # seed 1: h = 2 on other references (between two paired rows), h = 32 paired too;
    # seed 2: h = 4 with the base's hypotheses, h = 16 as good as the base (another wrong word)
    many = [r.replace("dog", "cat") for r in base[1][:20]] + base[1][20:]
    extra = {(2, 1): (base[1], [r + " ." for r in refs[1]]), (32, 1): (many, refs[1]),
             (4, 2): (base[2], refs[2]), (16, 2): ([base[2][0].replace("field", "meadow")]
                                                   + base[2][1:], refs[2])}
    for (heads, seed), (hyps, ref) in extra.items():
        runs[heads, seed] = _scored(tmp_path, f"h{heads}s{seed}", heads, hyps, ref)
        runs[heads, seed].config["seed"] = seed
    twice = _scored(tmp_path, "h1s2again", 1, one[2], refs[2])  # a second seed-2 run of h = 1
    twice.config["seed"] = 2
    rows, _ = group([*runs.values(), twice])
    by_heads = {row.runs[0].config["model.heads"]: row for row in rows}
    per_run = seed_p_values(Comparison(rows, by_heads[8]), "test", 200)

    def sacrebleu_p(seed: int, hyps: list[str]) -> float:
        _, scores = PairedTest([("base", base[seed]), ("row", hyps)], {"BLEU": BLEU()},
                               [refs[seed]], test_type="bs", n_samples=200)()
        return scores["BLEU"][1].p_value

    assert per_run[runs[8, 1].dir] == per_run[runs[8, 2].dir] == "base"
    assert per_run[runs[1, 1].dir] == f"{sacrebleu_p(1, one[1]):.4f}"
    assert per_run[runs[32, 1].dir] == f"{sacrebleu_p(1, many):.4f}" != per_run[runs[1, 1].dir]
    assert per_run[twice.dir] == f"{sacrebleu_p(2, one[2]):.4f}" != per_run[runs[1, 1].dir]
    assert per_run[runs[1, 2].dir] == "– (another run of its seed in its row is the one paired)"
    assert per_run[runs[1, 3].dir] == "– (no seed of the base row)"
    assert per_run[runs[2, 1].dir] == "– (other test set)"
    assert per_run[runs[4, 2].dir] == "– (same hypotheses)"
    assert per_run[runs[16, 2].dir] == "1.0000 (equal BLEU)"
    assert seed_p_values(Comparison(rows, None), "test", 200) == {}


def test_a_study_over_data_sizes_tests_each_row_against_the_base_at_its_own_size(tmp_path):
    """heads_by_data: report.base is h = 8 at 100 % and report.x the data fraction, so h = 1 at
    10 % is tested against h = 8 at 10 % (sacrebleu's own p for that pair), not against the 100 %
    model; a size without an h = 8 row says so instead of borrowing another size's base."""
    from sacrebleu.metrics import BLEU
    from sacrebleu.significance import PairedTest

    from heads_lab.report.rows import comparisons
    from heads_lab.report.seeds import p_text, significance

    refs = [f"the {w} dog runs over the green grass today" for w in
            ("small", "big", "old", "young", "brown", "black", "white", "tall")] * 5
    worse = [r.replace("grass", "field") for r in refs]
    good = list(refs[:30]) + worse[30:]
    hyps = {(0.1, 8): worse, (0.1, 1): good, (0.3, 1): good, (0.3, 32): worse,
            (1.0, 8): refs, (1.0, 1): good}
    runs = []
    for seed in (1, 2):
        for (fraction, heads), text in hyps.items():
            if seed == 2 and fraction == 1.0:
                continue  # the 100 % rows have seed 1 only
            run = _by_data(seed, fraction, heads, 300)
            run.config["report.base.model.heads"] = 8
            run.config["report.base.data.train_fraction"] = 1.0
            run.dir = tmp_path / f"f{fraction}_h{heads}_s{seed}"
            run.dir.mkdir()
            text = text if seed == 1 else [text[0].replace("dog", "cat"), *text[1:]]
            (run.dir / "hyps.test.txt").write_text("\n".join(text) + "\n", encoding="utf-8")
            (run.dir / "refs.test.txt").write_text("\n".join(refs) + "\n", encoding="utf-8")
            run.metrics["test/bleu"] = BLEU().corpus_score(text, [refs]).score
            runs.append(run)
    rows, varying = group(runs)
    x, tested = comparisons(rows, runs)
    assert x == "data.train_fraction"
    assert [(c.x_value, c.base.label if c.base else None) for c in tested] == [
        (0.1, "train_fraction=0.1,h=8"), (0.3, None), (1.0, "train_fraction=1.0,h=8")]
    for c in tested:
        if c.base is not None:
            c.seeds = significance(c.rows, c.base, "test", 200)
    by = {(r.runs[0].config["data.train_fraction"], r.runs[0].config["model.heads"]): r
          for r in rows}
    # against h = 8 at 10 %, seeds 1, 2: the seed-aware p
    assert by[0.1, 1].p_value == pytest.approx(_seed_aware_p(by[0.1, 1].runs, by[0.1, 8].runs,
                                                             200), rel=1e-9)
    _, scores = PairedTest([("h8", refs), ("h1", good)], {"BLEU": BLEU()}, [refs],
                           test_type="bs", n_samples=200)()
    assert by[1.0, 1].p_value == scores["BLEU"][1].p_value  # against h = 8 at 100 %, seed 1
    assert p_text(by[0.3, 1]) == p_text(by[0.3, 32]) == "– (no h=8 at train_fraction=0.3)"
    table = render(rows, tested, varying, "test", None, x)
    assert [b[0] for b in table["rows"] if b[0].endswith("(base)")] == [
        "train_fraction=0.1,h=8 (base)", "train_fraction=1.0,h=8 (base)"]
    assert ("vs the base row of the same train_fraction (h=8 at each train_fraction" in
            table["note"])
    assert table["note"].startswith("mean ± std over the runs (seeds) of a row; p: Welch's "
                                    "t-test of mean BLEU over seeds vs the base row of the same "
                                    "train_fraction (h=8 at each train_fraction)")
    assert "sentences only" in table["note"]  # h = 1 at 100 %: seed 1 alone
    assert p_text(by[1.0, 1]) == f"{by[1.0, 1].p_value:.4f} (seed 1, sentences only)"
    # the 10 % runs alone: h = 8 at 10 % is their base, not the first row
    ten = [r for r in runs if r.config["data.train_fraction"] == 0.1]
    rows, _ = group(ten)
    _, tested = comparisons(rows, ten)
    assert [c.base.label for c in tested] == ["h=8"]
    # without report.x every row is tested against the one base row, as before
    for run in runs:
        run.config["report.x"] = None
    rows, _ = group(runs)
    x, tested = comparisons(rows, runs)
    assert x is None and [c.base.label for c in tested] == ["train_fraction=1.0,h=8"]
    assert tested[0].rows == rows


def test_runs_csv_lines_are_each_runs_own_numbers_in_seed_order():
    """runs_table: a line per run, seeds in order within a row, four decimals, the run's own p
    (seed_p_values) or, where its comparison had no base row, the row's reason."""
    from heads_lab.report.seeds import runs_table

    runs = [_run(s, heads=h) for h in (1, 8) for s in (2, 1)]
    for run in runs:
        run.dir = Path(f"h{run.config['model.heads']}s{run.config['seed']}")
        run.metrics.update({"valid/ppl": 4.123456, "test/chrf": 55.0})
        run.results = {"train": {"steps": 2600, "stopped_by": "patience", "seconds": 3190.4,
                                 "best_step": 1800},
                       "env": {"cpu": "AMD EPYC (AVX2)", "git": {"commit": "0123456789abcdef"}}}
    rows, _ = group(runs)
    rows[0].p_reason = "no h=8 at train_fraction=0.3"
    table = runs_table(rows, "test", {Path("h8s1"): "base", Path("h8s2"): "base"})
    lines = [dict(zip(table["header"], line)) for line in table["rows"]]
    assert [(x["setting"], x["seed"]) for x in lines] == [("h=1", "1"), ("h=1", "2"),
                                                          ("h=8", "1"), ("h=8", "2")]
    assert lines[0]["test BLEU"] == "31.0000" and lines[1]["test BLEU"] == "32.0000"
    assert lines[0]["valid PPL"] == "4.1235" and lines[0]["train s"] == "3190"
    assert lines[0]["p vs base (its seed)"] == "– (no h=8 at train_fraction=0.3)"
    assert lines[2]["p vs base (its seed)"] == "base"
    assert (lines[0]["best step"], lines[0]["steps"], lines[0]["stopped by"]) == (
        "1800", "2600", "patience")
    assert lines[0]["cpu"] == "AMD EPYC (AVX2)" and lines[0]["commit"] == "0123456789ab"


def test_a_runs_csv_read_back_gives_the_same_table_and_parts_merge(tmp_path):
    """A study in two parts, each published as a runs.csv: `report` reads both back (and a run
    dir beside them) into one table whose numbers are the runs' own, and a runs.csv that is not
    one (no config column, a bad number) is one line naming it."""
    import csv

    from heads_lab.errors import DataError
    from heads_lab.output.tables import write_csv
    from heads_lab.report.rows import collect
    from heads_lab.report.seeds import runs_table

    runs = [_run(s, heads=h) for h in (1, 8) for s in (1, 2, 3)]
    for run in runs:
        h, seed = run.config["model.heads"], run.config["seed"]
        run.dir = tmp_path / f"gone_h{h}s{seed}"  # dirs that no longer exist
        run.metrics.update({"valid/ppl": 4.0 + h / 10 + seed / 100, "test/chrf": 55.0 + seed,
                            "test/bleu": 30.0 + h / 4 + seed / 3, "cost/params": 7578624})
        run.config.update({"report.base.model.heads": 8, "trainer.precision": "bf16"})
        run.results = {"train": {"steps": 6000, "stopped_by": "max_steps", "seconds": 300.0,
                                 "best_step": 5800}, "overrides": [f"model.heads={h}"],
                       "precision": "bf16", "device": "cuda",
                       "env": {"cpu": "Xeon", "git": {"commit": "abc"}}}
    parts = {"seeds12": [r for r in runs if r.config["seed"] < 3],
             "seed3": [r for r in runs if r.config["seed"] == 3]}
    for name, part in parts.items():
        rows, _ = group(part)
        (tmp_path / name).mkdir()
        write_csv(tmp_path / name / "runs.csv", runs_table(rows, "test", {}))
    live = runs[0]  # h = 1, seed 1 still has its run dir: its own results.json rules
    live.dir.mkdir()
    (live.dir / "results.json").write_text(json.dumps(
        {"status": "complete", "config": {"seed": 1, "model": {"heads": 1}},
         "metrics": {"test/bleu": 99.0}, "decoding": {"split": "test"}}))
    back, problems = collect([tmp_path / "seeds12" / "runs.csv", tmp_path / "seed3" / "runs.csv"])
    assert not problems and len(back) == 6
    by = {(r.config["model.heads"], r.config["seed"]): r for r in back}
    assert by[1, 1].metrics == {"test/bleu": 99.0}  # the run dir's own file
    for run in runs[1:]:
        got = by[run.config["model.heads"], run.config["seed"]]
        assert got.config == run.config and got.dir == run.dir
        for key in ("valid/ppl", "test/bleu", "test/chrf", "cost/params"):
            assert got.metrics[key] == pytest.approx(run.metrics[key], abs=5e-5)
        assert got.results["train"]["best_step"] == 5800 and got.results["precision"] == "bf16"
        assert got.results["overrides"] == run.results["overrides"]
    merged = _table([r for r in back if r is not by[1, 1]])  # (its first row the base)
    assert [(b[0], b[merged["header"].index("runs")]) for b in merged["rows"]] == [
        ("h=1 (base)", "2"), ("h=8", "3")]
    bleu = merged["rows"][1][merged["header"].index("test BLEU")]
    assert bleu == f"{statistics.fmean(30 + 2 + s / 3 for s in (1, 2, 3)):.2f} ± " \
                   f"{statistics.stdev(30 + 2 + s / 3 for s in (1, 2, 3)):.2f}"
    # the same runs again, their dir written otherwise (relative): each run once
    same, _ = collect([tmp_path / "seeds12" / "runs.csv",
                       Path(os.path.relpath(tmp_path / "seeds12" / "runs.csv"))])
    assert len(same) == 4
    # two machines, one sweep dir: another part's run under the same path is its own run
    clash = tmp_path / "clash.csv"
    clash.write_text((tmp_path / "seed3" / "runs.csv").read_text().replace("gone_h1s3",
                                                                          "gone_h1s2"))
    both, _ = collect([tmp_path / "seeds12" / "runs.csv", clash])
    assert sorted((r.config["model.heads"], r.config["seed"]) for r in both) == [
        (1, 1), (1, 2), (1, 3), (8, 1), (8, 2), (8, 3)]
    # not a runs.csv heads-lab can read: one line, naming the file or the line
    old = tmp_path / "old.csv"
    with open(tmp_path / "seeds12" / "runs.csv", newline="") as f:
        lines = list(csv.reader(f))
    old.write_text("\n".join(",".join(x for x in line[:5]) for line in lines) + "\n")
    with pytest.raises(DataError, match=r"old.csv is not a runs.csv with a 'config' column"):
        collect([old])
    bad = tmp_path / "bad.csv"
    lines[1][lines[0].index("test BLEU")] = "31,5"
    with open(bad, "w", newline="") as f:
        csv.writer(f).writerows(lines)
    with pytest.raises(DataError, match=r"bad.csv:2: 'test BLEU' is '31,5', not a number"):
        collect([bad])


def test_runs_scored_against_every_reference_show_those_scores_too():
    """Tatoeba runs carry test/bleu_multiref (every translation of each source): the table adds
    their mean ± std beside the one-reference scores, the note says what they are, and runs.csv
    keeps each run's."""
    from heads_lab.report.seeds import runs_table

    runs = [_run(s, heads=h) for h in (1, 8) for s in (1, 2)]
    for run in runs:
        run.metrics.update({"test/bleu_multiref": run.metrics["test/bleu"] + 2.5,
                            "test/chrf_multiref": 60.0 + run.config["seed"]})
    rows, varying = group(runs)
    table = _render(rows, varying)
    cells = dict(zip(table["header"], table["rows"][1]))
    assert cells["test BLEU all refs"] == "34.00 ± 0.71" and cells["test chrF all refs"] == (
        "61.50 ± 0.71")
    assert table["header"].index("test chrF all refs") + 1 == table["header"].index("p vs base")
    assert "all refs: against every translation of each test source" in table["note"]
    lines = runs_table(rows, "test", {})
    assert [dict(zip(lines["header"], x))["multiref test BLEU"] for x in lines["rows"]] == [
        "33.5000", "34.5000", "33.5000", "34.5000"]
    assert "test BLEU all refs" not in _table([_run(1, heads=8)])["header"]


def test_settings_are_labelled_as_overrides_write_them():
    """A row label reads max_time=null, not Python's max_time=None."""
    from heads_lab.report.rows import as_written

    assert [as_written(v) for v in (None, True, False, 8, 0.5, "mha", ["enc-self", "dec-enc"],
                                    [])] == ["null", "true", "false", "8", "0.5", "mha",
                                             "[enc-self,dec-enc]", "[]"]


def test_rows_whose_run_dirs_lack_translations_get_no_p_and_say_why(tmp_path):
    """Run dirs holding only results.json (copied back from a cluster): the bootstrap read
    hyps.test.txt and stopped with a traceback; now such a row, or every row where the base's
    are gone, has no p and says why."""
    from heads_lab.report.seeds import p_text, significance

    refs = [f"the {w} dog runs over the green grass" for w in ("small", "big", "old", "tall")] * 3
    base = _scored(tmp_path, "base", 8, [r.replace("grass", "field") for r in refs], refs)
    kept = _scored(tmp_path, "kept", 1, refs, refs)
    bare = _run(1, heads=4)
    bare.dir = tmp_path / "bare"
    bare.dir.mkdir()
    rows, _ = group([base, kept, bare])
    by_heads = {row.runs[0].config["model.heads"]: row for row in rows}
    significance(rows, by_heads[8], "test", 100)
    assert by_heads[1].p_value is not None
    assert p_text(by_heads[4]) == ("– (no test translations (hyps.test.txt, refs.test.txt) in "
                                   "its run dir)")
    (base.dir / "refs.test.txt").unlink()
    for row in rows:
        row.p_value = row.p_reason = None
    significance(rows, by_heads[8], "test", 100)
    assert [p_text(by_heads[h]) for h in (1, 4)] == [
        "– (no test translations (hyps.test.txt, refs.test.txt) in the base row's run dir)"] * 2


def test_a_results_json_report_cannot_read_is_passed_over_and_named(tmp_path):
    """A results.json that is not a heads-lab results file (a list, no config, a metric that is
    not a number) is listed as unreadable, not a traceback; where no run is left, the error names
    the first one passed over."""
    import json

    import pytest

    from heads_lab.errors import DataError
    from heads_lab.report.rows import collect

    good = {"status": "complete", "config": {"seed": 1, "model": {"heads": 8}},
            "metrics": {"test/bleu": 30.0, "valid/ppl": None}}
    cases = {"list": [], "no_config": {"status": "complete"},
             "text_metric": {**good, "metrics": {"test/bleu": "30"}}}
    for name, content in cases.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "results.json").write_text(json.dumps(content))
    with pytest.raises(DataError, match=r"^no finished runs \(results.json\) under .* \(3 run "
                                        r"dir\(s\) passed over, the first .*list: unreadable "
                                        r"results.json: not a JSON object\); "
                                        "point heads-lab report"):
        collect([tmp_path])
    (tmp_path / "good").mkdir()
    (tmp_path / "good" / "results.json").write_text(json.dumps(good))
    runs, problems = collect([tmp_path])
    assert [r.dir.name for r in runs] == ["good"]
    assert sorted((Path(d).name, why) for d, why in problems) == [
        ("list", "unreadable results.json: not a JSON object"),
        ("no_config", "unreadable results.json: it has no config or metrics (not written by "
                      "heads-lab train)"),
        ("text_metric", "unreadable results.json: metrics ['test/bleu'] are not numbers")]


def _png_figures(monkeypatch) -> list:
    """The figures plot() draws, kept open for their artists to be read."""
    import matplotlib.pyplot as plt

    kept = []
    monkeypatch.setattr(plt, "close", lambda fig=None: kept.append(fig))
    return kept


def test_report_figures_a_reader_can_trust(tmp_path, monkeypatch):
    """Settings side by side (no numeric x) are points, not a line joining them; long labels
    are wrapped, not squashing the plot; a metric no run has (pruned models' valid PPL) is said,
    not an empty panel with ticks -0.04...0.04; one row is '1 row'; every point label of the
    cost plot lies inside its frame."""
    from heads_lab.report.figures import plot

    runs = [_run(s, attention=a, heads=8, mixes=m) for s in (1, 2)
            for a, m in (("mha", None), ("talking_heads", "weights"), ("talking_heads", "both"))]
    for i, run in enumerate(runs):
        run.metrics.update({"train/tokens_per_s": 1000.0 + 37 * i, "test/bleu": 30.0 + i})
    rows, varying = group(runs)
    kept = _png_figures(monkeypatch)
    plot(rows, varying, "test", tmp_path)
    quality, cost = kept[0], kept[1]
    bleu_ax, ppl_ax = quality.axes
    assert all(line.get_linestyle() == "None" for line in bleu_ax.get_lines() if
               len(line.get_xdata()) == 3)  # three settings side by side: no joining line
    ticks = [t.get_text() for t in bleu_ax.get_xticklabels()]
    longest_part = max(len(part) for row in rows for part in row.label.split(","))
    assert max(len(line) for t in ticks for line in t.split("\n")) <= max(longest_part + 1, 19)
    assert any("\n" in t for t in ticks)
    assert [t.get_text() for t in ppl_ax.texts] == ["no valid PPL in these runs"]
    assert list(ppl_ax.get_yticks()) == []
    assert quality._suptitle.get_text().startswith("3 rows: ")
    assert bleu_ax.get_title() == "test BLEU (mean ± std over seeds)"
    assert cost.axes[0].get_title() == "test BLEU against training target tokens/s"
    assert cost.axes[0].get_ylabel() == "test BLEU"
    cost.canvas.draw()
    frame = cost.axes[0].get_window_extent()
    for text in cost.axes[0].texts:
        box = text.get_window_extent()
        assert box.x1 <= frame.x1 + 0.5 and box.y1 <= frame.y1 + 0.5, text.get_text()
    kept.clear()
    one = [_run(1, heads=8)]
    one[0].metrics.update({"valid/ppl": 6.0})
    plot(*group(one), "test", tmp_path)
    assert kept[0]._suptitle.get_text() == "1 row"
    kept.clear()  # a language model's quality: bits per byte, named in both figures
    one[0].metrics.update({"test/bits_per_byte": 2.2, "train/tokens_per_s": 900.0})
    plot(*group(one), "test", tmp_path, quality=("bits_per_byte", "bits per byte"))
    assert kept[1].axes[0].get_title() == "test bits per byte against training target tokens/s"
    assert kept[0].axes[0].get_ylabel() == "test bits per byte"
    assert len(kept) == 2  # one cache size: no KV-cache figure
    kept.clear()  # language models whose KV caches differ: bits per byte against cache bytes
    lm = [_run(s, kv_heads=k) for k in (1, 8) for s in (1, 2)]
    for run in lm:
        kv = run.config["model.kv_heads"]
        run.metrics.update({"test/bits_per_byte": 2.0 + 0.01 * kv + 0.001 * run.config["seed"],
                            "train/tokens_per_s": 900.0})
        run.results["cost"] = {"kv_cache_bytes_per_token": 1024 * kv}
    paths = plot(*group(lm), "test", tmp_path, quality=("bits_per_byte", "bits per byte"))
    assert tmp_path / "report_quality_vs_kv_cache.png" in paths
    ax = kept[2].axes[0]
    assert ax.get_title() == "test bits per byte against KV cache bytes per token (fp32)"
    assert [t.get_text() for t in ax.get_xticklabels()] == ["1,024", "8,192"]
    points = ax.get_lines()[0]  # the data line, before errorbar's cap lines
    assert list(points.get_xdata()) == [1024, 8192]
    assert list(points.get_ydata()) == pytest.approx([2.0115, 2.0815])


def test_the_seed_aware_p_refuses_what_it_cannot_weigh(tmp_path):
    """Without translations, rows scored on other test sets (another sacrebleu test set) get no
    p, saying so; rows whose runs all score alike within each row have no spread to weigh their
    difference by, and say that instead of p < 0.001; one sentence draw adds no variance."""
    from heads_lab.report import significance as sig
    from heads_lab.report.seeds import p_text, significance

    runs = [_run(s, heads=h) for h in (1, 8) for s in (1, 2, 3)]
    for run in runs:
        run.dir = tmp_path / f"none{run.config['model.heads']}{run.config['seed']}"
        run.metrics["test/bleu"] = 30.0 + run.config["seed"] / 10 + run.config["model.heads"]
        run.config["eval.sacrebleu_test"] = "wmt14" if run.config["model.heads"] == 1 else None
    rows, _ = group(runs)
    by = {row.runs[0].config["model.heads"]: row for row in rows}
    significance(rows, by[8], "test", 50)
    assert p_text(by[1]) == "– (other test set)"
    for run in runs:
        run.config["eval.sacrebleu_test"] = None
        run.metrics["test/bleu"] = 30.0 + run.config["model.heads"]  # no spread at all
    rows, _ = group(runs)
    by = {row.runs[0].config["model.heads"]: row for row in rows}
    significance(rows, by[8], "test", 50)
    assert p_text(by[1]) == "– (no spread between seeds to weigh the difference by)"
    assert sig.sentence_variance([np.array([1.0])] * 2, [np.array([0.5])] * 2) == 0.0
