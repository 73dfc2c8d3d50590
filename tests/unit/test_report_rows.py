"""The report's rows: runs of one model from two presets (one leaves a head count None, the other
sets the value the None stands for) are one row; shape columns say only what applies."""

from __future__ import annotations

from pathlib import Path

from heads_lab.commands.report import render
from heads_lab.commands.report_rows import (
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
    from heads_lab.commands.report import curves

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
    from heads_lab.commands.report import curves

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
    from heads_lab.commands.report import curves

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
    from heads_lab.commands.report import curves

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

    from heads_lab.commands.report_rows import collect

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
    run = _run(1, heads=heads)
    run.dir = tmp_path / name
    run.dir.mkdir()
    (run.dir / "hyps.test.txt").write_text("\n".join(hyps) + "\n", encoding="utf-8")
    (run.dir / "refs.test.txt").write_text("\n".join(refs) + "\n", encoding="utf-8")
    return run


def test_p_values_pair_only_the_same_references_and_never_call_no_difference_significant(tmp_path):
    from sacrebleu.metrics import BLEU
    from sacrebleu.significance import PairedTest

    from heads_lab.commands.report_seeds import p_text, significance

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
    assert p_text(by_heads[2]) == "– (same hypotheses)"
    # sacrebleu itself calls a difference of exactly zero significant (p = 1/(n + 1))
    _, scores = PairedTest([("base", base), ("equal", equal)], {"BLEU": BLEU()}, [refs],
                           test_type="bs", n_samples=200)()
    assert scores["BLEU"][1].score == scores["BLEU"][0].score and scores["BLEU"][1].p_value < 0.01
    assert by_heads[4].p_value == 1.0 and p_text(by_heads[4]) == "1.0000 (equal BLEU)"
    assert by_heads[16].p_value is None and p_text(by_heads[16]) == "– (other test set)"
    assert p_text(by_heads[8]) == "-"  # the base row itself


def test_a_row_with_fewer_seeds_is_tested_on_its_own_and_the_others_keep_all_theirs(tmp_path):
    """A study still in progress: the base and h = 1 on seeds 1, 2, h = 32 on seed 1 only. h = 1
    is paired on both seeds (sacrebleu on the two seeds' lines concatenated), h = 32 on seed 1
    (sacrebleu on seed 1's lines), its p cell names its seed, and the note says why."""
    from sacrebleu.metrics import BLEU
    from sacrebleu.significance import PairedTest

    from heads_lab.commands.report_rows import comparisons
    from heads_lab.commands.report_seeds import p_note, p_text, significance

    refs = {s: [f"the {w} dog number {s} runs over the green grass" for w in
                ("small", "big", "old", "young", "brown", "black", "white", "tall")] * 4
            for s in (1, 2)}
    base = {s: [r.replace("grass", "field") for r in refs[s]] for s in (1, 2)}
    one = {1: refs[1][:3] + base[1][3:],  # better in seed 1, worse in seed 2: p differs
           2: [r.replace("dog", "cat") for r in base[2][:2]] + base[2][2:]}
    many = {1: base[1][:16] + [r.replace("dog", "cat") for r in base[1][16:]]}
    runs = []
    for heads, hyps in ((8, base), (1, one), (32, many)):
        for seed in hyps:
            run = _scored(tmp_path, f"h{heads}s{seed}", heads, hyps[seed], refs[seed])
            run.config["seed"] = seed
            runs.append(run)
    alone = _scored(tmp_path, "h16s3", 16, one[1], refs[1])
    alone.config["seed"] = 3  # no seed of the base row's: no p
    runs.append(alone)
    rows, varying = group(runs)
    by_heads = {row.runs[0].config["model.heads"]: row for row in rows}
    assert significance(rows, by_heads[8], "test", 200) == [1, 2]
    assert by_heads[16].p_value is None
    assert p_text(by_heads[16]) == "– (no seed of the base row)"

    def sacrebleu_p(hyps: dict, seeds: list[int]) -> float:
        lines = [x for s in seeds for x in hyps[s]]
        _, scores = PairedTest([("base", [x for s in seeds for x in base[s]]), ("row", lines)],
                               {"BLEU": BLEU()}, [[x for s in seeds for x in refs[s]]],
                               test_type="bs", n_samples=200)()
        return scores["BLEU"][1].p_value

    assert by_heads[1].p_value == sacrebleu_p(one, [1, 2]) != sacrebleu_p(one, [1])
    assert by_heads[32].p_value == sacrebleu_p(many, [1])
    assert p_text(by_heads[1]) == f"{by_heads[1].p_value:.4f}"
    assert p_text(by_heads[32]) == f"{by_heads[32].p_value:.4f} (seed 1)"
    x, tested = comparisons(rows, runs)
    tested[0].seeds = significance(rows, by_heads[8], "test", 200)
    assert p_note(tested, varying, x).endswith(
        "on seeds 1, 2 (concatenated); a p cell that names seeds is on those alone (all its row "
        "shares with the base row)")


def test_each_run_has_its_own_p_against_the_base_run_of_its_seed(tmp_path):
    """runs.csv's per-seed p: each run against the base row's run of the same seed, on that
    seed's lines alone (sacrebleu's own p for the pair); the base's runs say "base", a run whose
    seed the base lacks or whose references differ says why."""
    from sacrebleu.metrics import BLEU
    from sacrebleu.significance import PairedTest

    from heads_lab.commands.report_seeds import seed_p_values

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

    from heads_lab.commands.report_rows import comparisons
    from heads_lab.commands.report_seeds import p_text, significance

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
            (run.dir / "hyps.test.txt").write_text("\n".join(text) + "\n", encoding="utf-8")
            (run.dir / "refs.test.txt").write_text("\n".join(refs) + "\n", encoding="utf-8")
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
    _, scores = PairedTest([("h8", worse + worse), ("h1", good + good)], {"BLEU": BLEU()},
                           [refs + refs], test_type="bs", n_samples=200)()
    assert by[0.1, 1].p_value == scores["BLEU"][1].p_value  # against h = 8 at 10 %, seeds 1, 2
    _, scores = PairedTest([("h8", refs), ("h1", good)], {"BLEU": BLEU()}, [refs],
                           test_type="bs", n_samples=200)()
    assert by[1.0, 1].p_value == scores["BLEU"][1].p_value  # against h = 8 at 100 %, seed 1
    assert p_text(by[0.3, 1]) == p_text(by[0.3, 32]) == "– (no h=8 at train_fraction=0.3)"
    table = render(rows, tested, varying, "test", None, x)
    assert [b[0] for b in table["rows"] if b[0].endswith("(base)")] == [
        "train_fraction=0.1,h=8 (base)", "train_fraction=1.0,h=8 (base)"]
    assert ("vs the base row of the same train_fraction (h=8 at each train_fraction" in
            table["note"])
    assert ("on train_fraction=0.1: seeds 1, 2 (concatenated); train_fraction=1.0: seed 1"
            in table["note"])

    # the same seeds at every size: named once
    done = [c for c in tested if c.seeds]
    done[1].seeds = [1, 2]
    done[1].rows[0].runs.append(done[0].rows[0].runs[1])  # (a seed-2 run: only its seed counts)
    done[1].rows[1].runs.append(done[0].rows[1].runs[1])
    assert render(rows, tested, varying, "test", None, x)["note"].count("seeds 1, 2") == 1
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
    from heads_lab.commands.report_seeds import runs_table

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


def test_settings_are_labelled_as_overrides_write_them():
    """A row label reads max_time=null, not Python's max_time=None."""
    from heads_lab.commands.report_rows import as_written

    assert [as_written(v) for v in (None, True, False, 8, 0.5, "mha", ["enc-self", "dec-enc"],
                                    [])] == ["null", "true", "false", "8", "0.5", "mha",
                                             "[enc-self,dec-enc]", "[]"]


def test_rows_whose_run_dirs_lack_translations_get_no_p_and_say_why(tmp_path):
    """Run dirs holding only results.json (copied back from a cluster): the bootstrap read
    hyps.test.txt and stopped with a traceback; now such a row, or every row where the base's
    are gone, has no p and says why."""
    from heads_lab.commands.report_seeds import p_text, significance

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

    from heads_lab.commands.report_rows import collect
    from heads_lab.errors import DataError

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
