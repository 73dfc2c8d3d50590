"""`heads-lab report --choose KEY` (heads_lab/report/choose.py): the value of a tuned setting kept
per row, compared on the seeds every value shares; edges flagged; bad use refused in one line."""

from __future__ import annotations

from pathlib import Path

import pytest

from heads_lab.errors import ConfigError
from heads_lab.report.choose import choose, table
from heads_lab.report.rows import Run, group


def _run(kv: int, lr: float, seed: int, bpb: float | None, *, lm: bool = True) -> Run:
    config = {"seed": seed, "task": "lm" if lm else "translate", "model.d_model": 256,
              "model.heads": 8, "model.head_dim": None, "model.attention": "mha",
              "model.kv_heads": kv, "model.heads_k": None, "model.heads_v": None,
              "trainer.lr": lr}
    metrics = {} if bpb is None else {"valid/bits_per_byte" if lm else "valid/ppl": bpb}
    return Run(Path(f"kv{kv}-lr{lr}-s{seed}"), config, metrics, {})


# seed 1 tunes the rate of each kv setting; seeds 2 and 3 ran at the rate seed 1 chose
GRID = {1: {5e-4: 2.33, 1e-3: 2.20, 2e-3: 2.10},  # 2e-3: the largest tried
        2: {5e-4: 2.33, 1e-3: 2.05, 2e-3: 2.11}}  # 1e-3: inside the grid
LATER = {1: (2e-3, [2.40, 2.41]), 2: (1e-3, [2.50, 2.52])}  # seeds 2, 3: far worse than seed 1


def _study() -> list[Run]:
    runs = [_run(kv, lr, 1, bpb) for kv, rates in GRID.items() for lr, bpb in rates.items()]
    runs += [_run(kv, lr, seed, bpb) for kv, (lr, scores) in LATER.items()
             for seed, bpb in zip((2, 3), scores)]
    return runs


def test_each_setting_keeps_its_best_rate_on_the_seed_all_its_rates_share():
    rows, varying = group(_study())
    assert varying == ["model.kv_heads", "trainer.lr"]
    kept, varying_after, choices = choose(rows, varying, "trainer.lr", lm=True)
    assert varying_after == ["model.kv_heads", "trainer.lr"]  # the labels keep each row's rate
    assert [(row.label, sorted(r.config["seed"] for r in row.runs)) for row in kept] == [
        ("kv=1,lr=0.002", [1, 2, 3]), ("kv=2,lr=0.001", [1, 2, 3])]
    one, two = choices
    # on seed 1 alone: the later seeds' worse scores at the chosen rate do not count (their mean
    # over all of a rate's runs would have chosen 1e-3 for kv=1 and 2e-3 for kv=2)
    assert one.seeds == two.seeds == [1]
    assert one.scores == {"0.0005": 2.33, "0.001": 2.20, "0.002": 2.10}
    assert (one.chosen, one.edge, one.runs["0.002"]) == ("0.002", "largest", 3)
    assert (two.chosen, two.edge) == ("0.001", None)


def test_the_smallest_value_is_flagged_too_and_a_lone_value_compares_nothing():
    runs = [_run(1, lr, 1, bpb) for lr, bpb in ((1e-4, 2.0), (1e-3, 2.1))] + [_run(2, 1e-3, 1, 2.2)]
    rows, varying = group(runs)
    _, _, choices = choose(rows, varying, "trainer.lr", lm=True)
    assert [(c.label, c.chosen, c.edge) for c in choices] == [("kv=1", "0.0001", "smallest"),
                                                               ("kv=2", "0.001", None)]
    shown = table(choices, "trainer.lr", lm=True)
    assert shown["header"] == ["setting", "lr=0.0001", "lr=0.001", "chosen lr",
                               "compared on seeds", "runs at the chosen value", "note"]
    assert shown["rows"] == [
        ["kv=1", "2.0000", "2.1000", "0.0001", "1", "1",
         "the smallest value tried: a smaller one may be better"],
        ["kv=2", "", "2.2000", "0.001", "1", "1", "one value: nothing compared"]]
    assert "lowest valid bits per byte" in shown["note"]


def test_a_translator_chooses_by_valid_perplexity_and_means_over_shared_seeds():
    runs = [_run(8, lr, seed, ppl, lm=False) for lr, scores in ((1e-3, (6.0, 6.4)),
                                                                (2e-3, (6.3, 6.0)))
            for seed, ppl in zip((1, 2), scores)]
    rows, varying = group(runs)
    kept, _, (choice,) = choose(rows, varying, "trainer.lr", lm=False)
    assert choice.scores == pytest.approx({"0.001": 6.2, "0.002": 6.15})
    assert choice.seeds == [1, 2] and [row.label for row in kept] == ["lr=0.002"]
    assert "valid PPL" in table([choice], "trainer.lr", lm=False)["note"]


@pytest.mark.parametrize("runs, key, message", [
    ([_run(1, 1e-3, 1, 2.0), _run(2, 1e-3, 1, 2.1)], "trainer.lr",
     "--choose trainer.lr: it does not vary between these runs (what varies: model.kv_heads)"),
    ([_run(1, 1e-3, 1, 2.0), _run(1, 2e-3, 2, 2.1)], "trainer.lr",
     "--choose trainer.lr: at all runs its values share no seed to compare them on (0.001: seeds"
     " 1; 0.002: seeds 2); run every value with one same seed"),
    ([_run(1, 1e-3, 1, 2.0), _run(1, 2e-3, 1, None)], "trainer.lr",
     "--choose trainer.lr: a run of lr=0.002 has no valid bits per byte"),
])
def test_bad_use_is_one_line_naming_the_fix(runs, key, message):
    rows, varying = group(runs)
    with pytest.raises(ConfigError) as caught:
        choose(rows, varying, key, lm=True)
    assert str(caught.value).startswith(message) and "\n" not in str(caught.value)


def test_kept_rows_follow_the_other_settings_order_whatever_the_key_sorts_before():
    """--choose model.dropout: rows ordered by h (as the report orders them without the key),
    not by the dropout each h chose; the choices in the same order."""
    runs = []
    for h, best in ((1, 0.2), (8, 0.0)):
        for dropout in (0.0, 0.2):
            run = _run(8, 1e-3, 1, 2.0 if dropout == best else 2.5)
            run.config.update({"model.heads": h, "model.kv_heads": h, "model.dropout": dropout})
            runs.append(run)
    rows, varying = group(runs)
    kept, _, choices = choose(rows, varying, "model.dropout", lm=True)
    assert [row.runs[0].config["model.heads"] for row in kept] == [1, 8]
    assert [(c.chosen, c.edge) for c in choices] == [("0.2", "largest"), ("0.0", "smallest")]


def test_a_diverged_score_loses_and_a_lone_value_needs_no_score():
    runs = [_run(1, 1e-4, 1, float("nan")), _run(1, 1e-3, 1, 2.1), _run(1, 2e-3, 1, 2.0),
            _run(2, 1e-3, 1, None)]
    rows, varying = group(runs)
    kept, _, (one, two) = choose(rows, varying, "trainer.lr", lm=True)
    assert (one.chosen, one.edge, two.chosen) == ("0.002", "largest", "0.001")
    assert table([one, two], "trainer.lr", lm=True)["rows"][0][1] == ""  # NaN: no score shown


@pytest.mark.parametrize("key, message", [
    ("data.name", "--choose data.name: scores on different corpora do not compare"),
    ("seed", "--choose seed: seeds are pooled in a row, never chosen"),
])
def test_keys_that_cannot_be_chosen_are_refused(key, message):
    rows, varying = group(_study())
    with pytest.raises(ConfigError, match=message):
        choose(rows, varying, key, lm=True)


def test_a_key_set_with_each_value_leaves_nothing_to_compare_and_says_so():
    runs = [_run(1, 1e-3, 1, 2.0), _run(1, 2e-3, 1, 2.1)]
    runs[1].config["trainer.warmup_steps"] = 50  # set with the second rate only
    runs[0].config["trainer.warmup_steps"] = 100
    rows, varying = group(runs)
    with pytest.raises(ConfigError, match=r"--choose trainer.lr: no setting has two values of it "
                                          r"to compare: it varies together with "
                                          r"trainer.warmup_steps"):
        choose(rows, varying, "trainer.lr", lm=True)


def test_the_choice_figure_draws_each_settings_scores_and_stars_its_choice(tmp_path, monkeypatch):
    import matplotlib.pyplot as plt

    from heads_lab.report.figures import plot_choices

    kept = []
    monkeypatch.setattr(plt, "close", lambda fig=None: kept.append(fig))
    rows, varying = group(_study())
    _, _, choices = choose(rows, varying, "trainer.lr", lm=True)
    path = plot_choices(choices, "trainer.lr", "valid bits per byte", tmp_path / "chosen.png")
    assert path.is_file()
    (ax,) = kept[0].axes
    lines = [(list(line.get_xdata()), list(line.get_ydata()), line.get_marker())
             for line in ax.get_lines()]
    assert lines == [([5e-4, 1e-3, 2e-3], [2.33, 2.20, 2.10], "o"), ([2e-3], [2.10], "*"),
                     ([5e-4, 1e-3, 2e-3], [2.33, 2.05, 2.11], "o"), ([1e-3], [2.05], "*")]
    assert ax.get_xscale() == "linear"  # 5e-4 to 2e-3 spans 4×: no log axis
    assert ax.get_title() == "valid bits per byte against lr (★ chosen; compared on seed 1)"
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["kv=1", "kv=2"]
    runs = [_run(8, 1e-3, 1, 2.0), _run(8, 2e-3, 1, 2.1)]
    for run, attention in zip(runs, ("mha", "talking_heads")):
        run.config["trainer.lr"] = 1e-3
        run.config["model.attention"] = attention
    rows, varying = group(runs)
    _, _, words = choose(rows, varying, "model.attention", lm=True)
    assert plot_choices(words, "model.attention", "valid bits per byte",
                        tmp_path / "none.png") is None  # no numbers: no axis
