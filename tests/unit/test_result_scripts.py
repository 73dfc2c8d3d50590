"""The scripts that join published study reports: the data-size figure across corpora
(scripts/data_size_figure.py), the head-role table across analyses
(scripts/head_roles_table.py) and the table of a study reported seed by seed
(scripts/seeds_table.py)."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _script(name: str):
    path = ROOT / "scripts" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_data_size_figure_joins_two_corpora_from_their_reports(tmp_path, capsys, monkeypatch):
    import matplotlib.figure

    script = _script("data_size_figure")
    titles = []
    suptitle = matplotlib.figure.Figure.suptitle
    monkeypatch.setattr(matplotlib.figure.Figure, "suptitle",
                        lambda fig, t, **k: titles.append(t) or suptitle(fig, t, **k))
    header = "setting,h,kv,d_k,enc+dec,params,runs,valid PPL,test BLEU,test chrF,p vs base"
    old = tmp_path / "old.csv"  # a report from before the train pairs column
    old.write_text(header + "\n" + "\n".join(
        f'"train_fraction={f},h={h}",{h},{h},{256 // h},3+3,"7,578,624",3,6.1,{b},57.0,-'
        for f, h, b in [(0.1, 1, "20.00 ± 1.00"), (0.1, 8, "21.50 ± 0.50"), (1.0, 1, "38.00"),
                        (1.0, 8, '"37.00 ± 0.20"')]) + "\n")
    new = tmp_path / "new.csv"
    new.write_text(header + ",train pairs\n" + "\n".join(
        f'"train_fraction={f},h={h}",{h},{h},{256 // h},3+3,"7,578,624",1,6.1,{b},57.0,-,"{n}"'
        for f, h, b, n in [(0.1, 8, "30.00", "16,478"), (0.1, 32, "29.25", "16,478")]) + "\n")
    out = tmp_path / "new-folder" / "fig.png"  # its folder is made
    assert script.main(["--out", str(out), f"A={old}:29000", f"B={new}"]) == 0
    assert out.stat().st_size > 10_000
    assert titles == ["More heads with more data? d_model 256, 3+3 layers, d_k = 256 / h"]
    assert script.main(["--out", str(out), "--title", "d_model 64", f"A={old}:29000"]) == 0
    assert titles[-1] == "d_model 64"  # the model the user's studies trained
    with pytest.raises(SystemExit, match="PAIRS must be a whole number of training pairs"):
        script.main(["--out", str(out), f"A={old}:abc"])
    points = script.read("A", old, 29000) + script.read("B", new, None)
    assert [(p.pairs, p.bleu, p.std) for p in points[:2]] == [(2900, 20.0, 1.0), (2900, 21.5, 0.5)]
    assert [p.runs for p in points] == [3, 3, 3, 3, 1, 1]
    assert script.few_seeds(points) == {("B", 16478): "n = 1"}  # B's size on one seed
    assert script.diff_seeds(points) == {("B", 16478): "n = 1"}
    one = [p for p in points if p.corpus == "A" and p.pairs == 29000]
    one[0].runs = 2  # h = 1 on two seeds, h = 8 on three: each h's seeds, most first
    assert script.few_seeds(points) == {("A", 29000): "n = 3 (h = 8)\nn = 2 (h = 1)",
                                        ("B", 16478): "n = 1"}
    # ... and h = 1 − h = 8 rests on the fewer seeds of its two rows
    assert script.diff_seeds(points) == {("A", 29000): "n = 2", ("B", 16478): "n = 1"}
    assert script.few_seeds([p for p in points if p.corpus == "B"]) == {}  # all on one seed
    assert script.seeds_label({1: 2, 8: 2, 32: 1}) == "n = 2 (h = 1, 8)\nn = 1 (h = 32)"
    # differences are labelled against the figure's most seeds (3 here), not their own (2 each)
    fewer = [script.Point("C", h, 100, 20.0, 0.0, 3 if h == 32 else 2) for h in (1, 8, 32)]
    assert script.diff_seeds(fewer) == {("C", 100): "n = 2"}
    assert script.diff_seeds([p for p in points if p.h != 8]) == {}  # no h = 8 row: no differences
    assert script.differences(points) == {("A", 1): [(2900, -1.5), (29000, 1.0)],
                                          ("B", 32): [(16478, -0.75)]}
    assert "A, h = 1 minus h = 8: 2,900: -1.50, 29,000: +1.00" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="no train pairs column"):
        script.read("A", old, None)


def test_head_roles_table_reads_a_published_analysis():
    script = _script("head_roles_table")
    relpos = ROOT / "results" / "head_analysis" / "relpos16"
    pud = script.summarise("pud", (relpos / "pud" / "analysis.md").read_text())
    assert pud.roles == {"positional": 0, "syntactic": 1, "rare": 0, "other": 71}
    assert pud.positional == (0.87, "-1", "L2 H2")  # just under Voita's 0.90
    assert pud.syntactic == (0.13, "case dep→head", "L2 H1")
    assert pud.within["enc-self"] == [0.288, 0.407, 0.451]
    test = script.summarise("test", (relpos / "multi30k_test" / "analysis.md").read_text())
    assert test.positional == (0.91, "-1", "L2 H2") and test.syntactic is None  # no trees
    table = script.markdown([pud, test])
    assert "| pud | 0 / 1 / 0 of 72 | 0.87 at -1 (L2 H2) |" in table
    assert "– (no trees)" in table.splitlines()[-1]


def test_head_roles_table_reads_a_talking_heads_analysis():
    """Talking heads' analysis.md names its softmax heads (h = 8) and puts LRP on the value
    heads, where gates, masks and removal act."""
    script = _script("head_roles_table")
    path = ROOT / "results" / "head_analysis" / "talking_heads_h8" / "pud" / "analysis.md"
    th = script.summarise("th", path.read_text())
    assert th.roles == {"positional": 0, "syntactic": 0, "rare": 0, "other": 72}
    assert th.confidence == (0.14, 0.31) and th.lrp == 0.18  # enc-self L0 h4's value head
    assert th.positional == (0.20, "-1", "L0 H4")


def test_head_roles_table_reads_an_analysis_without_lrp():
    """analyze writes – (an en dash) where LRP was not measured: no LRP, not an error."""
    import re

    script = _script("head_roles_table")
    text = (ROOT / "results" / "head_analysis" / "relpos16" / "pud" / "analysis.md").read_text()
    no_lrp = re.sub(r"(\| [·PSR]+ [0-9.]+ [0-9.]+) [0-9.]+(?= \|)", r"\1 –", text)
    assert no_lrp.count(" –") >= 24
    pud = script.summarise("pud", no_lrp)
    assert pud.lrp != pud.lrp and pud.roles["other"] == 71  # nan: none measured


def test_head_roles_table_refuses_a_file_it_cannot_read(tmp_path):
    script = _script("head_roles_table")
    with pytest.raises(SystemExit, match="no section"):
        script.summarise("x", "# not an analysis\n")


def test_valid_history_from_log_keeps_a_resumed_runs_last_validation_of_a_step():
    """A run killed after step 400's validation but before its checkpoint validates step 400
    again when resumed: the log has both lines, and the second is the one the run went on from.
    PPL is exp of the 4-decimal loss, not the 2-decimal PPL printed beside it."""
    import math

    from heads_lab.output.tracking import VALID_LINE, valid_history_from_log

    prefix = "[2026-11-27 22:31:30,735][heads_lab.output.tracking][INFO] "
    lines = [prefix + VALID_LINE % (s, loss, math.exp(loss))
             for s, loss in [(200, 2.5), (400, 2.25), (400, 2.2612), (600, 2.0)]]
    text = "\n".join([prefix + "step 400/6000  loss 3.482  lr 7.74e-04  48,374 tok/s", *lines,
                      # rich's console line, padded to the terminal's width
                      "[11/27/26 22:31:30] INFO " + VALID_LINE % (800, 1.9, 6.69) + "    ",
                      prefix + VALID_LINE % (1000, 800.0, math.inf)])  # diverged: exp overflows
    got = valid_history_from_log(text + "\n")
    assert [(h["step"], h["valid/loss"]) for h in got] == [(200, 2.5), (400, 2.2612),
                                                          (600, 2.0), (800, 1.9), (1000, 800.0)]
    assert got[1]["valid/ppl"] == pytest.approx(math.exp(2.2612), rel=1e-12)
    assert got[4]["valid/ppl"] == math.exp(50.0)  # capped, as evaluate.perplexity caps it
    assert valid_history_from_log("no validation here\n") == []


def test_valid_curves_leaves_out_diverged_validations_and_takes_a_set_top(tmp_path, capsys,
                                                                          monkeypatch):
    """A NaN validation has no point (nor is it the lowest); --ymax sets the axis' top; a
    directory with no run files is refused in one line."""
    import json
    import math

    import matplotlib.axes

    script = _script("valid_curves")
    limits = []
    set_ylim = matplotlib.axes.Axes.set_ylim
    monkeypatch.setattr(matplotlib.axes.Axes, "set_ylim",
                        lambda ax, *a, **k: limits.append(a) or set_ylim(ax, *a, **k))
    run = tmp_path / "run"
    run.mkdir()
    (run / "results.json").write_text(json.dumps({"train": {"valid_history": [
        {"step": 100, "valid/loss": math.nan, "valid/ppl": math.nan},
        {"step": 200, "valid/loss": 2.0, "valid/ppl": math.exp(2.0)},
        {"step": 300, "valid/loss": 1.5, "valid/ppl": math.exp(1.5)}]}}))
    out = tmp_path / "curves.png"
    assert script.main(["--out", str(out), "--ymax", "30", "--run", "h = 8", str(run)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert limits[-1] == (math.exp(1.5) / 1.06, 30.0)  # the last: ours, after autoscaling
    assert [line.split(",")[1] for line in out.with_suffix(".csv").read_text().splitlines()] == \
        ["step", "200", "300"]
    assert f"lowest {math.exp(1.5):.2f} at step 300 (results.json)" in capsys.readouterr().out
    (tmp_path / "empty").mkdir()
    with pytest.raises(SystemExit, match="neither results.json nor train.log"):
        script.main(["--out", str(out), "--run", "x", str(tmp_path / "empty")])
    # bad input: one line each, refused before anything is written
    (tmp_path / "a-file").write_text("")
    good = ["--run", "x", str(run)]
    for argv, message in (
            (["--out", str(tmp_path / "d.png"), "--run", "x", str(tmp_path / "none")],
             "no run dir"),
            (["--out", str(tmp_path / "c.txt"), *good], "is not a .png"),
            (["--out", str(tmp_path / "d.png"), "--ymax", "-3", *good], "must be > 0"),
            (["--out", str(tmp_path / "a-file" / "c.png"), *good], "cannot write to")):
        with pytest.raises(SystemExit, match=message):
            script.main(argv)
    assert not (tmp_path / "c.csv").exists() and not (tmp_path / "d.png").exists()


def test_valid_curves_draws_a_gone_run_from_a_csv_it_wrote_keeping_points_and_source(tmp_path):
    """'OLD.csv::LABEL' redraws one line of an earlier figure's CSV: the same points, the same
    source (results.json or train.log; a train.log line's 'to step' note once, and its own);
    a run dir whose name holds '.csv::' is still a run dir; a missing CSV, another CSV, one
    with no lines, a bad number and an unknown label are refused in one line."""
    import csv
    import json

    script = _script("valid_curves")
    run = tmp_path / "run"
    run.mkdir()
    (run / "train.log").write_text("step 200  valid loss 2.0000  ppl 7.39\n"
                                   "step 400  valid loss 1.2345  ppl 3.44\n")
    done = tmp_path / "done.csv::1"  # a run dir, its name notwithstanding
    done.mkdir()
    (done / "results.json").write_text(json.dumps({"train": {"valid_history": [
        {"step": 100, "valid/loss": 1.5, "valid/ppl": 4.4817}]}}))
    first = tmp_path / "first.png"
    assert script.main(["--out", str(first), "--run", "h = 1, seed 3", str(run),
                        "--run", "h = 8", str(done)]) == 0
    old = list(csv.reader(first.with_suffix(".csv").open(newline="")))
    cut = "h = 1, seed 3 (train.log, to step 400)"
    assert old[1:] == [[cut, "200", "2.0000", "7.389", "train.log"],
                       [cut, "400", "1.2345", "3.437", "train.log"],
                       ["h = 8", "100", "1.5000", "4.482", "results.json"]]
    again = tmp_path / "again.png"
    table = first.with_suffix(".csv")
    assert script.main(["--out", str(again), "--run", "h = 1, seed 3", f"{table}::{cut}",
                        "--run", "h = 8", f"{table}::h = 8"]) == 0
    assert list(csv.reader(again.with_suffix(".csv").open(newline=""))) == old
    # a label that carries the note already (or a stale one) gets the line's own, once
    assert script.main(["--out", str(again), "--run", "h = 1 (train.log, to step 200)",
                        f"{table}::{cut}"]) == 0
    assert {r[0] for r in csv.reader(again.with_suffix(".csv").open(newline=""))} == \
        {"run", "h = 1 (train.log, to step 400)"}
    (tmp_path / "other.csv").write_text("a,b\n1,2\n")
    (tmp_path / "header.csv").write_text("run,step,valid loss,valid PPL,source\n")
    (tmp_path / "bad.csv").write_text("run,step,valid loss,valid PPL,source\nx,2e2,1,2,train.log\n")
    for spec, message in ((f"{tmp_path / 'none.csv'}::x", "no CSV"),
                          (f"{tmp_path / 'other.csv'}::x", "is not a CSV this script wrote"),
                          (f"{tmp_path / 'header.csv'}::x", "has no line 'x'; its lines: none$"),
                          (f"{tmp_path / 'bad.csv'}::x", "line 'x': invalid literal .* unedited"),
                          (f"{table}::h = 4", r"has no line 'h = 4'; its lines: 'h = 1, seed 3 "
                                              r"\(train.log, to step 400\)', 'h = 8'$")):
        with pytest.raises(SystemExit, match=message) as err:
            script.main(["--out", str(tmp_path / "x.png"), "--run", "x", spec])
        assert "\n" not in str(err.value)
    assert not (tmp_path / "x.png").exists()


def test_valid_curves_line_styles_go_by_the_first_text_a_label_holds():
    script = _script("valid_curves")
    styles = [("seed 2", "dashed"), ("seed 3", "dotted"), ("seed", "dashdot")]
    assert script.line_style("h = 8, seed 2", styles) == "dashed"
    assert script.line_style("h = 8, seed 3", styles) == "dotted"
    assert script.line_style("h = 8, seed 1", styles) == "dashdot"  # the catch-all, last
    assert script.line_style("h = 8", styles) == "solid"
    assert script.line_style("h = 8, seed 2", []) == "solid"


def test_data_size_figure_folds_later_seeds_from_a_runs_csv(tmp_path, capsys):
    """--add folds a runs.csv's runs into a report's rows: the pooled mean and sample std equal
    statistics' over all the values; `:h=32` takes that h only; a seed given twice, an unknown
    label and a malformed filter are refused in one line."""
    import statistics

    script = _script("data_size_figure")
    two = [39.62, 41.04]  # the row's two seeds, and a third in the runs.csv
    report = tmp_path / "report.csv"
    report.write_text(
        "setting,h,kv,d_k,enc+dec,params,runs,valid PPL,test BLEU,test chrF,p vs base,"
        "train pairs\n"
        f'"h=1",1,1,256,3+3,"7",2,4.6,{statistics.mean(two)!r} ± {statistics.stdev(two)!r},'
        '56.5,0.004,"49,435"\n'
        '"h=8 (base)",8,8,32,3+3,"7",1,4.7,39.43,55.3,-,"49,435"\n')
    runs = tmp_path / "runs.csv"
    runs.write_text("setting,seed,run,valid PPL,test BLEU,test chrF,train pairs\n"
                    'h=1,3,x,4.56,39.2593,55.8,49435\n'
                    'h=8,3,y,4.70,39.6711,56.1,49435\n'
                    '"train_fraction=0.3,h=32",3,z,4.92,38.7951,55.2,49435\n')
    out = tmp_path / "fig.png"
    assert script.main(["--out", str(out), f"T={report}", "--add", f"T={runs}"]) == 0
    printed = capsys.readouterr().out
    assert "T, h = 1 at 49,435 pairs: 2 runs + seed 3 → 39.97 ± 0.94 over 3" in printed
    assert "T, h = 32 at 49,435 pairs: 0 runs + seed 3 → 38.80 ± 0.00 over 1" in printed
    points = script.read("T", report, None)
    script.fold(points, "T", script.read_runs(runs, None))
    h1 = next(p for p in points if p.h == 1)
    assert h1.runs == 3
    assert h1.bleu == pytest.approx(statistics.mean(two + [39.2593]), abs=1e-9)
    assert h1.std == pytest.approx(statistics.stdev(two + [39.2593]), abs=1e-9)
    h8 = next(p for p in points if p.h == 8)  # one run (std 0) plus one
    assert h8.std == pytest.approx(statistics.stdev([39.43, 39.6711]), abs=1e-9)
    assert script.read_runs(runs, {32}) == [(32, 49435, 3, 38.7951)]
    with pytest.raises(SystemExit, match="seed 3 of h = 1 at 49,435 pairs twice"):
        script.fold(points, "T", script.read_runs(runs, {1}) * 2)
    with pytest.raises(SystemExit, match="seed 3 of h = 8 at 49,435 pairs twice"):  # two --add
        script.main(["--out", str(out), f"T={report}", "--add", f"T={runs}:h=8",
                     "--add", f"T={runs}"])
    with pytest.raises(SystemExit, match="which no study is labelled"):
        script.main(["--out", str(out), f"T={report}", "--add", f"U={runs}"])
    with pytest.raises(SystemExit, match="expected LABEL=RUNS_CSV"):
        script.main(["--out", str(out), f"T={report}", "--add", f"T={runs}:32"])
    bad = tmp_path / "bad.csv"
    for row in ("h=1,x,39.2,49435", "h=1,3,nan,49435", "h=1,3,39.2"):  # short row: no pairs
        bad.write_text(f"setting,seed,test BLEU,train pairs\n{row}\n")
        with pytest.raises(SystemExit, match="not a number"):
            script.read_runs(bad, None)
    bad.write_bytes(b"setting,seed,test BLEU,train pairs\nh=1,3,\xff,49435\n")
    with pytest.raises(SystemExit, match="not a UTF-8 runs.csv"):
        script.read_runs(bad, None)
    # two new runs into one row: N = n + k, not n + 1
    more = [script.Point("T", 1, 9, statistics.mean(two), statistics.stdev(two), 2)]
    script.fold(more, "T", [(1, 9, 3, 39.2), (1, 9, 4, 40.0)])
    assert more[0].runs == 4
    assert more[0].bleu == pytest.approx(statistics.mean(two + [39.2, 40.0]), abs=1e-9)
    assert more[0].std == pytest.approx(statistics.stdev(two + [39.2, 40.0]), abs=1e-9)
    with pytest.raises(SystemExit, match="no run of h = \\[16\\]"):
        script.main(["--out", str(out), f"T={report}", "--add", f"T={runs}:h=16"])


def test_seeds_table_joins_per_seed_reports_and_pairs_each_run_with_its_own_seeds_base(
        tmp_path, capsys):
    """Two per-seed runs.csv (another precision each): every row's mean ± sample std equals
    statistics' over its seeds, each difference is against the base run of the same seed and
    file, and a seed without a base run is named but not averaged; a run given twice, different
    base rows and a file that is no runs.csv are refused."""
    import statistics

    script = _script("seeds_table")
    header = ("setting,seed,run,valid PPL,test BLEU,test chrF,p vs base (its seed),best step,"
              "precision\n")
    one = tmp_path / "seed1.csv"
    one.write_text(header + "h=4,1,a,2.7991,50.2311,64.6536,0.1668,5800,fp32\n"
                   "h=8,1,b,2.8427,49.8642,64.4740,base,5800,fp32\n"
                   "h=16,1,c,2.8907,49.0901,63.8817,0.0509,5800,fp32\n")
    two = tmp_path / "seed2.csv"  # its h = 8 is lower than seed 1's: the pairing matters
    two.write_text(header + "h=8,2,d,2.90,48.50,63.00,base,6000,bf16\n"
                   "h=4,2,e,2.85,49.00,63.50,0.2000,6000,bf16\n")
    assert script.main([str(one), str(two)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(" | ")[0] for line in lines[2:]] == ["| h=4", "| h=8 (base)", "| h=16"]
    h4 = lines[2].strip("| ").split(" | ")
    d1, d2 = 50.2311 - 49.8642, 49.00 - 48.50
    assert h4 == ["h=4", "1 fp32, 2 bf16",
                  f"{statistics.mean([2.7991, 2.85]):.2f} ± {statistics.stdev([2.7991, 2.85]):.2f}",
                  f"{statistics.mean([50.2311, 49.0]):.2f} ± "
                  f"{statistics.stdev([50.2311, 49.0]):.2f}",
                  f"{statistics.mean([64.6536, 63.5]):.2f} ± "
                  f"{statistics.stdev([64.6536, 63.5]):.2f}",
                  f"seed 1: {d1:+.2f} (0.1668); seed 2: {d2:+.2f} (0.2000)",
                  f"{statistics.mean([d1, d2]):+.2f} ± {statistics.stdev([d1, d2]):.2f}"]
    assert h4[5] == "seed 1: +0.37 (0.1668); seed 2: +0.50 (0.2000)"
    assert lines[3].endswith("| 49.18 ± 0.96 | 63.74 ± 1.04 | – | – |")
    assert lines[4].strip("| ").split(" | ")[1:] == ["1 fp32", "2.89", "49.09", "63.88",
                                                     "seed 1: -0.77 (0.0509)", "-0.77"]
    lone = tmp_path / "seed3.csv"  # a seed whose report has no base run: named, not averaged
    lone.write_text(header + "h=16,3,g,2.95,48.00,62.00,0.0100,6000,bf16\n")
    assert script.main([str(one), str(lone)]) == 0
    h16 = capsys.readouterr().out.splitlines()[4].strip("| ").split(" | ")
    assert h16[1] == "1 fp32, 3 bf16"
    assert h16[5:] == ["seed 1: -0.77 (0.0509); seed 3: no base run", "-0.77"]
    other = tmp_path / "other.csv"
    other.write_text(header + "h=4,3,f,2.8,49.0,63.0,base,6000,bf16\n")
    report = tmp_path / "report.csv"
    report.write_text("setting,h,runs,valid PPL,test BLEU\nh=8,8,1,2.8,49.0\n")
    cases = [([one, one], "seed 1 of h=4 is in .*seed1.csv and in .*seed1.csv"),
             ([one, other], r"different base rows \(h=4, h=8\)"),
             ([report], "is not a heads-lab runs.csv"),
             ([tmp_path / "missing.csv"], "cannot read .*missing.csv")]
    for files, message in cases:  # a user error: one line on stderr, exit 2 (not 1)
        assert script.main([str(f) for f in files]) == 2
        err = capsys.readouterr().err.strip()
        assert "\n" not in err and err.startswith("error: ") and re.search(message, err), err


def test_hf_tiny_models_without_the_hf_extra_is_one_line(tmp_path, monkeypatch, capsys):
    """scripts/hf_tiny_models.py where `tokenizers` cannot be imported: one line naming it and
    the extra that installs it, exit 2, nothing written (it was a traceback)."""
    script = _script("hf_tiny_models")
    monkeypatch.setitem(sys.modules, "tokenizers", None)  # import tokenizers → ImportError
    assert script.main(["--out", str(tmp_path / "hf")]) == 2
    err = capsys.readouterr().err.strip()
    assert err == ("error: hf_tiny_models.py needs tokenizers (the hf extra): "
                   "pip install 'heads-lab[hf]'")
    assert not (tmp_path / "hf").exists()


def test_the_scripts_examples_name_published_files():
    """Every results/ file a script's own text names as an example exists (an example once named
    a directory the study never had)."""
    import re

    named = {(script.name, path) for script in sorted((ROOT / "scripts").glob("*.py"))
             for path in re.findall(r"results/[\w./-]*\.\w+", script.read_text(encoding="utf-8"))}
    assert named  # the scripts do name examples
    missing = [(script, path) for script, path in sorted(named) if not (ROOT / path).is_file()]
    assert not missing, missing


def test_every_published_runs_csv_reads_back_into_its_reports_rows():
    """Each study's runs.csv under results/ is what `heads-lab report` reads: its lines group
    into the published report.csv's rows, with the same run counts, and every row's mean test
    BLEU over its runs is the published one (to its 2 decimals, ± 0.01: per-run values were
    published to 2 decimals too)."""
    import csv
    import statistics

    from heads_lab.report.rows import collect, group

    studies = sorted(p.parent for p in (ROOT / "results").rglob("runs.csv"))
    assert len(studies) >= 25
    for study in studies:
        runs, problems = collect([study / "runs.csv"])
        assert not problems, study
        rows, varying = group(runs)
        if (study / "chosen.csv").is_file():  # `report --choose`: its choices, then its rows
            rows = _chosen_read_back(study, rows, varying)
            if not (study / "report.csv").is_file():  # a tuning stage: the choices alone
                continue
        with open(study / "report.csv", newline="", encoding="utf-8") as f:
            published = {r["setting"].removesuffix(" (base)").replace("=None", "=null"): r
                         for r in csv.DictReader(f)}  # (older reports wrote None for null)
        got = {row.label: row for row in rows}
        assert set(got) == set(published), study
        for label, row in got.items():
            assert int(published[label]["runs"]) == len(row.runs), (study, label)
            bleu = [r.metrics["test/bleu"] for r in row.runs if "test/bleu" in r.metrics]
            if len(bleu) == len(row.runs) and published[label]["test BLEU"] not in ("", "-"):
                mean = float(published[label]["test BLEU"].split(" ± ")[0].replace(",", ""))
                assert statistics.fmean(bleu) == pytest.approx(mean, abs=0.0101), (study, label)


def _chosen_read_back(study, rows, varying):
    """A `report --choose` study's chosen.csv against its runs.csv: every value's score and the
    value chosen per setting, as report/choose.py finds them again; the rows it keeps."""
    import csv

    from heads_lab.report.choose import choose, table

    with open(study / "chosen.csv", newline="", encoding="utf-8") as f:
        published = list(csv.DictReader(f))
    key = next(k for k in varying if any(f"{k.split('.')[-1]}=" in c for c in published[0]))
    lm = any(str(r.config.get("task")) == "lm" for row in rows for r in row.runs)
    kept, _, choices = choose(rows, varying, key, lm)
    again = table(choices, key, lm)
    assert [dict(zip(again["header"], [c.replace(",", "") for c in r])) for r in again["rows"]] \
        == [{k: v.replace(",", "") for k, v in r.items()} for r in published], study
    return kept


def test_seed_aware_p_puts_the_published_p_beside_the_one_over_seeds(tmp_path, capsys):
    """scripts/seed_aware_p.py on a study: each row's published p and Welch's t over its seeds
    (scipy's own) from its runs.csv; a row of one seed says why it has none."""
    from scipy import stats

    script = _script("seed_aware_p")
    study = ROOT / "results" / "table_a_tatoeba"
    assert script.main.__call__ and script.rows_of(study)
    sys.argv = ["seed_aware_p.py", str(study), str(study / "fp32_seed_1")]
    assert script.main() == 0
    out = capsys.readouterr().out.splitlines()
    import csv

    with open(study / "runs.csv", newline="", encoding="utf-8") as f:
        runs = list(csv.DictReader(f))
    bleu = {h: [float(r["test BLEU"]) for r in runs if r["setting"] == h] for h in ("h=1", "h=8")}
    p = stats.ttest_ind(bleu["h=1"], bleu["h=8"], equal_var=False).pvalue
    (line,) = [x for x in out if "| table_a_tatoeba | h=1 |" in x]
    assert line.endswith(f"| 0.0060 | {p:.4f} (seeds only) |")
    (line,) = [x for x in out if "| table_a_tatoeba/fp32_seed_1 | h=4 |" in x]
    assert line.endswith("| – (one seed a side, its translations gone) |")


def test_valid_curves_never_draws_two_lines_alike(tmp_path, monkeypatch):
    """Lines whose labels begin alike share a colour, told apart by --style; two that would be
    drawn alike (same colour, same style: 'h = 8, seed 1' and 'h = 8, seed 1 again', no style
    for either) get colours of their own, as do the 11th and later groups (matplotlib's cycle
    has ten)."""
    import json

    import matplotlib.axes

    script = _script("valid_curves")
    drawn = []
    plot = matplotlib.axes.Axes.plot
    monkeypatch.setattr(matplotlib.axes.Axes, "plot", lambda ax, *a, **k: drawn.append(k) or
                        plot(ax, *a, **k))
    run = tmp_path / "run"
    run.mkdir()
    (run / "results.json").write_text(json.dumps({"train": {"valid_history": [
        {"step": 100 * i, "valid/loss": 3.0 - 0.1 * i, "valid/ppl": 20.0 - i}
        for i in range(1, 4)]}}))
    labels = ["h = 8, seed 1", "h = 8, seed 1 again", "h = 8, seed 2"] + [f"h = {h}" for h in
                                                                         range(20, 32)]
    argv = ["--out", str(tmp_path / "c.png"), "--style", "seed 2", "dashed"]
    for label in labels:
        argv += ["--run", label, str(run)]
    assert script.main(argv) == 0
    lines = [(k["color"], k.get("linestyle")) for k in drawn if "label" in k]
    assert len(lines) == len(labels) and len(set(lines)) == len(lines)
    assert lines[0][0] == lines[2][0] and lines[2][1] == "dashed"  # seed 2: its group's colour
    # --max-step: the validations up to that step only
    assert script.main(["--out", str(tmp_path / "early.png"), "--max-step", "200", "--run",
                        "h = 8", str(run)]) == 0
    early = (tmp_path / "early.csv").read_text().splitlines()[1:]
    assert [line.split(",")[-4] for line in early] == ["100", "200"]
