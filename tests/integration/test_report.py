"""`heads-lab report` on a real (tiny) Table (A) sweep with two seeds: the table's numbers are
the runs' own, the p-values are sacrebleu's paired bootstrap, the files are written."""

from __future__ import annotations

import csv
import json
import math
import statistics
from pathlib import Path

import pytest
from sacrebleu.metrics import BLEU
from sacrebleu.significance import PairedTest

from heads_lab.report.rows import Run
from tests.conftest import TINY
from tests.integration.test_cli import _assert_one_line_error, heads_lab
from tests.unit.test_report_rows import _seed_aware_p

# the preset trains in bf16, which CPUs without native bf16 refuse: fp32 runs on every CPU
SMALL = [o for o in TINY if not o.startswith(("trainer.max_steps", "trainer.valid_every"))] + [
    "trainer.max_steps=12", "trainer.valid_every=4", "data=synthetic", "trainer.precision=fp32"]


@pytest.fixture(scope="module")
def sweep(tmp_path_factory) -> Path:
    cwd = tmp_path_factory.mktemp("sweep")
    proc = heads_lab("train", "-m", "+experiment=table_a", *SMALL, "model.heads=1,4", "seed=1,2",
                     f"hydra.sweep.dir={cwd / 'study'}", cwd=cwd, timeout=600)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    return cwd / "study"


def test_table_a_preset_holds_its_sweep_values(tmp_path):
    proc = heads_lab("train", "+experiment=table_a", *SMALL, "--cfg", "hydra", cwd=tmp_path)
    assert "model.heads: 1,4,8,16,32" in proc.stdout, proc.stdout[-2000:] + proc.stderr


def test_report_table_numbers_and_significance(sweep):
    proc = heads_lab("report", str(sweep), "--samples", "200", cwd=sweep)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    results = [json.loads(p.read_text()) for p in sorted(sweep.rglob("results.json"))]
    assert len(results) == 4
    with open(sweep / "report.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    # the preset's base row (h = 8) is not in this sweep: the first row is the base
    assert [r["setting"] for r in rows] == ["h=1 (base)", "h=4"]
    by_h = {h: [r for r in results if r["config"]["model"]["heads"] == h] for h in (1, 4)}
    for row, h in zip(rows, (1, 4)):
        bleus = [r["metrics"]["test/bleu"] for r in by_h[h]]
        assert row["runs"] == "2" and row["h"] == str(h)
        # for programs: plain numbers, a mean ± sd as two columns (report.md keeps "x ± y")
        assert row["test BLEU"] == f"{statistics.fmean(bleus):.2f}"
        assert row["test BLEU sd"] == f"{statistics.stdev(bleus):.2f}"
        assert int(row["params"]) == by_h[h][0]["metrics"]["cost/params"] > 1000
        assert row["paper BLEU"] == {1: "24.9", 4: "25.5"}[h]  # labelled as the paper's

    # two seeds a row: Welch's t over the seeds with the test set's variance, written out
    def as_run(result: dict) -> Run:
        return Run(Path(result["run_dir"]), {}, result["metrics"], result)

    want = _seed_aware_p([as_run(r) for r in by_h[4]], [as_run(r) for r in by_h[1]], 200)
    assert rows[1]["p vs base"] == ("< 0.001" if want < 0.001 else f"{want:.4f}")
    assert rows[0]["p vs base"] == "-"
    # runs.csv: each run's own numbers, and its p against the base row's run of its seed alone
    with open(sweep / "runs.csv", newline="") as f:
        per_run = list(csv.DictReader(f))
    assert [(r["setting"], r["seed"]) for r in per_run] == [
        ("h=1", "1"), ("h=1", "2"), ("h=4", "1"), ("h=4", "2")]
    for line in per_run:
        (run,) = [r for r in by_h[int(line["setting"][2:])]
                  if r["config"]["seed"] == int(line["seed"])]
        assert line["test BLEU"] == f"{run['metrics']['test/bleu']:.4f}"
        assert line["valid PPL"] == f"{run['metrics']['valid/ppl']:.4f}"
        assert line["steps"] == str(run["train"]["steps"]) == "12"
        assert line["precision"] == "fp32" and line["device"] == "cpu"
        assert line["cpu"] == run["env"]["cpu"] and line["cpu"]
        assert Path(line["run"]).expanduser() == Path(run["run_dir"]).resolve()
        assert line["best step"] == str(run["train"]["best_step"])
        assert line["train pairs"] == str(run["data"]["train"]["kept"])
        assert all(line[k] for k in ("test chrF", "train s", "tok/s", "peak MB"))
        if line["setting"] == "h=1":
            assert line["p vs base (its seed)"] == "base"
            continue
        (base,) = [r for r in by_h[1] if r["config"]["seed"] == int(line["seed"])]
        hyps = [(Path(r["run_dir"]) / "hyps.test.txt").read_text().splitlines()
                for r in (base, run)]
        _, scores = PairedTest([("1", hyps[0]), ("4", hyps[1])], {"BLEU": BLEU()},
                               [(Path(base["run_dir"]) / "refs.test.txt").read_text().splitlines()],
                               test_type="bs", n_samples=200)()
        assert line["p vs base (its seed)"] == (
            "– (same hypotheses)" if hyps[0] == hyps[1] else _expected_p(scores))
    md = (sweep / "report.md").read_text()
    assert "Vaswani et al. 2017 Table 3 (A)" in md and "| h=4 |" in md
    assert ("p: Welch's t-test of mean BLEU over seeds vs the base row, its variance the seeds' "
            "spread plus the test set's") in md
    for png in ("report_quality.png", "report_quality_vs_cost.png", "report_valid_curves.png"):
        assert (sweep / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _expected_p(scores, mark: str | None = None) -> str:
    """The report's p of the second system: sacrebleu's, except where the BLEU scores are equal
    (a tiny model's hypotheses often score alike), where sacrebleu's bootstrap reads the zero
    difference as significant and the report says p = 1; with the cell's mark."""
    base, other = scores["BLEU"][0], scores["BLEU"][1]
    if base.score == other.score:
        return "1.0000 (equal BLEU" + (f"; {mark})" if mark else ")")
    p = "< 0.001" if other.p_value < 0.001 else f"{other.p_value:.4f}"
    return p + (f" ({mark})" if mark else "")


def test_a_report_read_back_from_its_runs_csv_is_the_same_table(sweep, tmp_path):
    """`heads-lab report <runs.csv> --out DIR`: the same table as from the run dirs (their
    translations still here, so the same p); with the translations gone, p over the seeds alone,
    marked; the runs.csv is never the report's own output."""
    first = tmp_path / "first"
    assert heads_lab("report", str(sweep), "--samples", "200", "--out", str(first),
                     cwd=tmp_path).returncode == 0
    again = tmp_path / "again"
    proc = heads_lab("report", str(first / "runs.csv"), "--samples", "200", "--out", str(again),
                     cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    assert (again / "report.csv").read_text() == (first / "report.csv").read_text()
    assert (again / "runs.csv").read_text() == (first / "runs.csv").read_text()
    _assert_one_line_error(heads_lab("report", str(first / "runs.csv"), cwd=tmp_path),
                           "is a runs.csv: say where the report goes with --out DIR")
    _assert_one_line_error(heads_lab("report", str(first / "runs.csv"), "--out", str(first),
                                     cwd=tmp_path), "which this report reads: it would be")
    moved = tmp_path / "moved.csv"  # the run dirs elsewhere: their translations not at hand
    moved.write_text((first / "runs.csv").read_text().replace(str(sweep), str(tmp_path / "gone")))
    proc = heads_lab("report", str(moved), "--samples", "200", "--out", str(tmp_path / "csv"),
                     cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    with open(tmp_path / "csv" / "report.csv", newline="") as f:
        row = list(csv.DictReader(f))[1]
    with open(first / "runs.csv", newline="") as f:
        lines = list(csv.DictReader(f))
    bleu = {h: [float(x["test BLEU"]) for x in lines if x["setting"] == h] for h in ("h=1", "h=4")}
    if bleu["h=1"] != bleu["h=4"]:
        from scipy import stats
        p = stats.ttest_ind(bleu["h=4"], bleu["h=1"], equal_var=False).pvalue
        assert row["p vs base"].endswith("(seeds only)")
        assert row["p vs base"].split(" (")[0] == ("< 0.001" if p < 0.001 else f"{p:.4f}")


def test_with_uneven_seeds_p_uses_the_seeds_a_row_shares_with_the_base_and_says_which(sweep,
                                                                                    tmp_path):
    """h = 1 (the base) with seeds 1, 2, h = 4 with seed 1 only: h = 4's seed spread is unknown,
    so p is the bootstrap on seed 1's hypotheses alone (not both seeds of h = 1 against one of
    h = 4), and the cell and the note say so."""
    runs = {(r["config"]["model"]["heads"], r["config"]["seed"]): Path(r["run_dir"])
            for r in (json.loads(p.read_text()) for p in sweep.rglob("results.json"))}
    dirs = [runs[1, 1], runs[1, 2], runs[4, 1]]
    proc = heads_lab("report", *map(str, dirs), "--samples", "200", "--out", str(tmp_path),
                     cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    with open(tmp_path / "report.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [(r["setting"], r["runs"]) for r in rows] == [("h=1 (base)", "2"), ("h=4", "1")]

    def lines(h: int, kind: str) -> list[str]:
        return (runs[h, 1] / f"{kind}.test.txt").read_text().splitlines()

    test = PairedTest([("1", lines(1, "hyps")), ("4", lines(4, "hyps"))], {"BLEU": BLEU()},
                      [lines(1, "refs")], test_type="bs", n_samples=200)
    _, scores = test()
    assert rows[1]["p vs base"] == _expected_p(scores, "seed 1, sentences only")
    md = (tmp_path / "report.md").read_text()
    assert ("p: sacrebleu paired bootstrap of BLEU vs the base row on the seed it shares with the "
            "base row") in md


def test_report_lists_failed_and_unfinished_runs(sweep, tmp_path):
    broken = sweep / "9_broken"
    (broken / ".hydra").mkdir(parents=True)
    (broken / ".hydra" / "config.yaml").write_text("{}\n")
    (broken / "failed.json").write_text(json.dumps({"status": "failed", "error": "boom"}))
    try:
        proc = heads_lab("report", str(sweep), "--out", str(tmp_path), cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr
        md = (tmp_path / "report.md").read_text()
        assert "Not in the table" in md and "9_broken`: boom" in md
        assert "| h=1 (base)" in md  # the four finished runs are all still there
    finally:
        import shutil

        shutil.rmtree(broken)


def test_report_leaves_out_runs_derived_from_a_run(sweep, tmp_path):
    """A gates run (`heads-lab prune <run> method=gates`) writes results.json under <run>/prune/:
    reporting the sweep must not make it a row or a seed of the sweep's table."""
    import shutil

    (run_dir,) = [p.parent for p in sweep.glob("*/results.json")
                  if json.loads(p.read_text())["config"]["model"]["heads"] == 1
                  and json.loads(p.read_text())["config"]["seed"] == 1]
    derived = run_dir / "prune" / "2026-01-01_00-00-00_prune.method=gates"
    derived.mkdir(parents=True)
    results = json.loads((run_dir / "results.json").read_text())
    results["config"]["prune"] = {**results["config"].get("prune", {}), "method": "gates",
                                  "l0_lambda": 0.05}
    results["metrics"]["test/bleu"] = 99.0
    results["prune"] = {"method": "gates", "l0_lambda": 0.05}  # as heads-lab prune writes it
    (derived / "results.json").write_text(json.dumps(results))
    try:
        proc = heads_lab("report", str(sweep), "--out", str(tmp_path), cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr
        with open(tmp_path / "report.csv", newline="") as f:
            rows = list(csv.DictReader(f))
        assert [(r["setting"], r["runs"]) for r in rows] == [("h=1 (base)", "2"), ("h=4", "2")]
        md = (tmp_path / "report.md").read_text()
        assert "99.0" not in md and f"{derived.name}`: derived from the run it is under" in md
        # pointed at on its own, the derived run is reported
        alone = tmp_path / "alone"
        proc = heads_lab("report", str(derived.parent), "--out", str(alone), cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr
        md = (alone / "report.md").read_text()
        assert "99.00" in md  # and Table 3 (A)'s numbers are not beside a pruned model
        assert "paper BLEU" not in md and "Vaswani" not in md
    finally:
        shutil.rmtree(run_dir / "prune")


def test_report_joins_runs_of_two_sweeps_in_setting_order_first_dir_sets_the_preset(sweep,
                                                                                    tmp_path):
    """A new study reuses identical runs of an earlier sweep: rows sorted by their settings, and
    the first dir given sets the base row and the paper columns."""
    other = tmp_path / "th"
    proc = heads_lab("train", "-m", "+experiment=talking_heads", *SMALL, "model.heads=4",
                     "model.attention=talking_heads", "seed=1", f"hydra.sweep.dir={other}",
                     cwd=tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stderr + proc.stdout

    def report(*dirs: Path) -> list[dict]:
        out = tmp_path / f"out{len(list(tmp_path.glob('out*')))}"
        proc = heads_lab("report", *map(str, dirs), "--out", str(out), "--samples", "50",
                         cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr + proc.stdout
        with open(out / "report.csv", newline="") as f:
            return list(csv.DictReader(f))

    first_th = report(other, sweep)  # talking_heads' preset: no paper, base mha h = 8 is absent
    assert [r["setting"] for r in first_th] == ["attention=mha,h=1 (base)", "attention=mha,h=4",
                                                "attention=talking_heads,h=4"]
    assert [r["runs"] for r in first_th] == ["2", "2", "1"] and "paper BLEU" not in first_th[0]
    # each row's head shape read back from its results.json, by its variant's own keys
    assert [(r["h"], r["kv"], r["h_K"], r["h_V"]) for r in first_th] == [
        ("1", "1", "–", "–"), ("4", "4", "–", "–"), ("4", "–", "4", "4")]
    first_a = report(sweep, other)  # table_a's preset: Vaswani et al.'s columns beside ours
    assert [r["setting"] for r in first_a] == [r["setting"] for r in first_th]
    assert [r["paper BLEU"] for r in first_a][:2] == ["24.9", "25.5"]


def test_report_on_a_dir_without_results_is_one_line(tmp_path):
    _assert_one_line_error(heads_lab("report", str(tmp_path), cwd=tmp_path),
                           "no finished runs (results.json) under", "point heads-lab report")


def test_report_to_an_unwritable_out_is_one_line_before_the_bootstrap(sweep, tmp_path):
    (tmp_path / "a-file").write_text("")
    for out in (tmp_path / "a-file", tmp_path / "a-file" / "sub"):
        proc = heads_lab("report", str(sweep), "--out", str(out), cwd=tmp_path)
        _assert_one_line_error(proc, f"cannot write to --out {out}", "choose a writable dir")
        assert "paired bootstrap" not in proc.stderr  # refused before the slow part
    _assert_one_line_error(heads_lab("report", str(sweep), "--wandb-mode", "online",
                                     cwd=tmp_path), "--wandb-mode online without --wandb")


def test_running_the_same_sweep_again_skips_finished_jobs(sweep):
    before = {p: p.read_bytes() for p in sweep.rglob("results.json")}
    proc = heads_lab("train", "-m", "+experiment=table_a", *SMALL, "model.heads=1,4", "seed=1,2",
                     f"hydra.sweep.dir={sweep}", cwd=sweep.parent)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.count("is already complete: skipped") == 4
    assert {p: p.read_bytes() for p in sweep.rglob("results.json")} == before


@pytest.mark.slow  # long end to end: `make test-slow` (CI runs it)
@pytest.mark.parametrize("launcher", ["joblib", "submitit_local", "ray"])
def test_launcher_plugins_run_a_two_job_sweep_that_report_reads(launcher, tmp_path):
    """Hydra's own launchers (the `launchers` and `ray` extras): parallel jobs via joblib,
    separate processes via submitit (as on SLURM, locally), Ray tasks on a local Ray instance
    that the launcher starts in-process (ray.init()) and that stops with the command."""
    if launcher == "ray":
        pytest.importorskip("hydra_plugins.hydra_ray_launcher",
                            reason="the Ray launcher is not installed: pip install 'heads-lab[ray]'")
    study = tmp_path / "study"
    proc = heads_lab("train", "-m", f"hydra/launcher={launcher}", *SMALL, "trainer.threads=1",
                     "model.heads=1,2", f"hydra.sweep.dir={study}", cwd=tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert len(list(study.rglob("results.json"))) == 2
    report = heads_lab("report", str(study), "--samples", "100", cwd=tmp_path)
    assert report.returncode == 0, report.stderr
    with open(study / "report.csv", newline="") as f:
        assert [r["setting"] for r in csv.DictReader(f)] == ["h=1 (base)", "h=2"]


def test_deep_vs_shallow_pairs_models_of_equal_heads_parameters_and_flops(tmp_path):
    proc = heads_lab("info", "+experiment=deep_vs_shallow", "+depth=shallow,deep", "--json",
                     cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    shallow, deep = json.loads(proc.stdout)
    assert shallow["flops_per_token"]["train"] == deep["flops_per_token"]["train"]
    # the same weights up to the deep model's extra LayerNorms and Admin ω vectors
    assert 0 < deep["params"]["total"] - shallow["params"]["total"] < 0.02 * shallow["params"]["total"]
    hydra = heads_lab("train", "+experiment=deep_vs_shallow", "--cfg", "hydra", cwd=tmp_path)
    assert "+depth: shallow,deep" in hydra.stdout


def test_admin_trains_end_to_end(tmp_path):
    proc = heads_lab("train", *SMALL, "model.norm=post", "model.init=admin",
                     f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    assert "Admin: ω from" in (tmp_path / "run" / "train.log").read_text()
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert math.isfinite(results["metrics"]["valid/loss"])
    history = results["train"]["valid_history"]
    assert history[-1]["valid/loss"] < history[0]["valid/loss"] or len(history) == 1


def test_runs_on_two_data_sets_get_a_table_each_short_labels_and_no_cross_pairing(sweep, tmp_path):
    """The table_a sweep (synthetic) joined with the same models on a local corpus: a section per
    data set, each with its own base row and p-values; rows labelled by the data set, not by
    every data.* key; quality lines never join two corpora; no matplotlib warning leaks."""
    from tests.unit.test_data_sources import _corpus

    root = _corpus(tmp_path / "corpus", sizes=(300, 40, 40))
    local = tmp_path / "local"
    proc = heads_lab("train", "-m", "+experiment=table_a",
                     *[o for o in SMALL if not o.startswith("data")], "data=local",
                     f"data.root={root}", "data.src=de", "data.tgt=en", "data.vocab_size=60",
                     "model.heads=1,4", "seed=1", f"hydra.sweep.dir={local}", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    out = tmp_path / "report"
    proc = heads_lab("report", str(sweep), str(local), "--samples", "50", "--out", str(out),
                     cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    assert "Warning" not in proc.stderr and "tight_layout" not in proc.stderr
    md = (out / "report.md").read_text()
    assert md.index("## data=synthetic") < md.index("## data=local")
    with open(out / "report.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [r["setting"] for r in rows] == ["data=synthetic,h=1 (base)", "data=synthetic,h=4",
                                            "data=local,h=1 (base)", "data=local,h=4"]
    assert "other test set" not in md  # each data set's rows are paired with its own base
    assert rows[3]["p vs base"] not in ("", "-")


def test_valid_curves_are_each_rows_mean_over_its_seeds(sweep):
    """report_valid_curves.png draws, per row, the mean valid PPL of its runs at each step they
    all validated: the numbers read back from the runs' results.json."""
    from heads_lab.report.figures import valid_curves
    from heads_lab.report.rows import collect, group

    runs, _ = collect([sweep])
    rows, _ = group(runs)
    curves = valid_curves(rows)
    results = [json.loads(p.read_text()) for p in sorted(sweep.rglob("results.json"))]
    for h in (1, 4):
        histories = [r["train"]["valid_history"] for r in results
                     if r["config"]["model"]["heads"] == h]
        steps, ppl = curves[f"h={h}"]
        assert steps == [e["step"] for e in histories[0]] and len(steps) >= 2
        for i, step in enumerate(steps):
            want = sum(next(e["valid/ppl"] for e in hist if e["step"] == step)
                       for hist in histories) / len(histories)
            assert ppl[i] == pytest.approx(want, rel=1e-12)


def test_valid_curves_skip_diverged_validations_and_show_every_rows_best(tmp_path):
    """A NaN validation (a diverged step) has no point and breaks no axis; a row far above
    another (another data set) keeps its best point inside the plot."""
    from heads_lab.report.figures import plot_valid_curves, valid_curves
    from heads_lab.report.rows import Row, Run

    def run(history):
        return Run(tmp_path, {}, {}, {"train": {"valid_history": [
            {"step": s, "valid/ppl": p} for s, p in history]}})

    rows = [Row(("a",), "low", [run([(1, math.nan), (2, 10.0), (3, 5.0)])]),
            Row(("b",), "high", [run([(1, 100.0), (2, 60.0), (3, 40.0)])])]
    curves = valid_curves(rows)
    assert curves["low"] == ([2, 3], [10.0, 5.0])
    path = plot_valid_curves(rows, tmp_path / "curves.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_runs_validations_read_back_from_its_log_match_its_results(sweep, tmp_path, capsys):
    """scripts/valid_curves.py draws a run without results.json (cut by a time limit) from its
    train.log: the validations read back from real runs' logs equal their results.json's, and a
    copy of a run with its results.json deleted is drawn from its log, its label saying so."""
    import shutil

    from heads_lab.output.tracking import valid_history_from_log
    from tests.unit.test_result_scripts import _script

    found = sorted(sweep.rglob("results.json"))
    for path in found:
        history = json.loads(path.read_text())["train"]["valid_history"]
        logged = valid_history_from_log((path.parent / "train.log").read_text())
        assert [h["step"] for h in logged] == [h["step"] for h in history] and len(history) >= 2
        for got, want in zip(logged, history, strict=True):
            assert got["valid/loss"] == pytest.approx(want["valid/loss"], abs=5.1e-5)
            assert got["valid/ppl"] == pytest.approx(want["valid/ppl"], rel=1e-4)
    cut = tmp_path / "cut"
    shutil.copytree(found[0].parent, cut)
    (cut / "results.json").unlink()
    out = tmp_path / "fig" / "curves.png"
    script = _script("valid_curves")
    assert script.main(["--out", str(out), "--style", "cut", "dashed", "--run", "h = 1, done",
                        str(found[0].parent), "--run", "h = 1, cut", str(cut)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with open(out.with_suffix(".csv"), newline="") as f:
        rows = list(csv.DictReader(f))
    last = json.loads(found[0].read_text())["train"]["valid_history"][-1]["step"]
    assert {r["source"] for r in rows} == {"results.json", "train.log"}
    assert f"h = 1, cut (train.log, to step {last:,})" in {r["run"] for r in rows}
    assert f"h = 1, cut (train.log, to step {last:,}): last step {last:,}" \
        in capsys.readouterr().out
    with pytest.raises(SystemExit, match="--style STYLE 'wavy' is not one of solid, dashed"):
        script.main(["--out", str(out), "--style", "cut", "wavy", "--run", "x", str(cut)])
    (cut / "train.log").unlink()
    with pytest.raises(SystemExit, match="neither results.json nor train.log"):
        script.main(["--out", str(out), "--run", "x", str(cut)])


def test_a_report_without_curves_says_why(tmp_path):
    """Runs that validated once have no curve: the report says so, naming the setting."""
    proc = heads_lab("train", *TINY, "trainer.max_steps=4", cwd=tmp_path)  # valid_every 15
    assert proc.returncode == 0, proc.stderr + proc.stdout
    proc = heads_lab("report", str(tmp_path / "outputs"), "--out", str(tmp_path / "r"),
                     cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    assert "no report_valid_curves.png: no run validated twice" in " ".join(proc.stdout.split())
    assert not (tmp_path / "r" / "report_valid_curves.png").exists()
    assert (tmp_path / "r" / "report_quality.png").is_file()
