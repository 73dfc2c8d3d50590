"""The rows of `heads-lab report`: the finished runs read back from their results.json, grouped
by the settings that vary between them (seeds pooled), the base row, sacrebleu's paired bootstrap
against it (report/seeds.py), and the paper's published numbers beside them. Torch-free."""

from __future__ import annotations

import dataclasses
import json
import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from heads_lab.config.compose import BOOKKEEPING, is_among, written_before
from heads_lab.config.schemas import ModelConfig
from heads_lab.config.variants import VARIANTS, shape_keys
from heads_lab.errors import DataError
from heads_lab.output.tracking import flatten, short_key
from heads_lab.report import runs_csv
from heads_lab.report.labels import as_written, swept

# Vaswani et al. 2017, Table 3 row (A): WMT14 en-de newstest2013, dev PPL (per wordpiece) / BLEU.
PAPER = {"table_a": {"key": "model.heads", "label": "Vaswani et al. 2017 Table 3 (A), WMT14 "
                     "en-de newstest2013", "rows": {1: (5.29, 24.9), 4: (5.00, 25.5),
                                                    8: (4.92, 25.8), 16: (4.91, 25.8),
                                                    32: (5.01, 25.4)}}}


SHAPE = (*shape_keys(), ("d_k", "model.head_dim"), ("enc+dec", None))  # every variant's keys


NOT_APPLICABLE = "–"  # a shape column that is not a key of the row's attention variant


@dataclass
class Run:
    dir: Path
    config: dict[str, Any]  # flattened
    metrics: dict[str, float]
    results: dict[str, Any]


@dataclass
class Row:
    key: tuple
    label: str
    runs: list[Run] = field(default_factory=list)
    p_value: float | None = None
    p_reason: str | None = None  # why a row has no p, or p = 1 (significance)
    p_seeds: list | None = None  # the seeds a one-seed bootstrap paired (significance)
    p_test: str | None = None  # which test gave p (report/seeds.py: significance)


def collect(dirs: list[Path]) -> tuple[list[Run], list[tuple[str, str]]]:
    """Complete runs, and (dir, status) of runs that failed or have no results."""
    runs, problems = [], []
    for d in dirs:
        if not d.is_dir() and not (d.is_file() and d.suffix == ".csv"):
            raise DataError(f"no dir {d}; give multirun or run dirs (e.g. outputs/multiruns/...) "
                            "or a report's runs.csv")
    run_dirs, from_csv = _gather(dirs)
    found = set(run_dirs)
    for run_dir in run_dirs:
        if run_dir in from_csv and not (run_dir / "results.json").is_file():
            record = from_csv[run_dir]  # (where the run dir is still here, its own files rule)
            runs.append(Run(run_dir, record["config"], record["metrics"], record["results"]))
            continue
        if any(a in found for a in run_dir.parents):  # e.g. a gates run under <run>/prune/
            problems.append((str(run_dir), "derived from the run it is under (heads-lab prune), "
                                           "not a run of this sweep: report its dir on its own"))
            continue
        path = run_dir / "results.json"
        if not path.is_file():
            failed = [p for p in (run_dir / "failed.json", run_dir / "stopped.json")
                      if p.is_file()]
            status = (json.loads(failed[0].read_text()).get("error", "failed") if failed
                      else "no results.json: still running, killed, or not started")
            problems.append((str(run_dir), status))
            continue
        try:
            results = json.loads(path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            problems.append((str(run_dir), f"unreadable results.json: {err}"))
            continue
        if not isinstance(results, dict):
            problems.append((str(run_dir), "unreadable results.json: not a JSON object"))
            continue
        if results.get("status") != "complete":
            problems.append((str(run_dir), str(results.get("status") or "incomplete")))
            continue
        problem = _not_results(results)
        if problem:
            problems.append((str(run_dir), f"unreadable results.json: {problem}"))
            continue
        config = flatten(results["config"])
        config.update(written_before(config))  # e.g. an older talking-heads run's mix start
        if str(config.get("trainer.precision")) == "auto":  # what the run computed in
            config["trainer.precision"] = results.get("precision", "auto")
        runs.append(Run(run_dir, config, results["metrics"], results))
    if not runs:
        curves = sorted(p.parent for d in dirs for p in d.rglob("prune.json"))
        if curves:  # `prune method=importance` writes its own report, no run to tabulate
            raise DataError(f"no finished runs (results.json) under {', '.join(map(str, dirs))}: "
                            f"it holds {len(curves)} importance-pruning curve(s) ({curves[0]}), "
                            "whose table and plot are their own prune.md, prune.csv and PNG; "
                            "`report` reads runs: `heads-lab prune method=gates` runs, or train runs")
        skipped = (f" ({len(problems)} run dir(s) passed over, the first {problems[0][0]}: "
                   f"{problems[0][1]})" if problems else "")
        raise DataError(f"no finished runs (results.json) under {', '.join(map(str, dirs))}"
                        f"{skipped}; point heads-lab report at the dirs `heads-lab train` wrote")
    return runs, problems


def _gather(dirs: list[Path]) -> tuple[list[Path], dict[Path, dict]]:
    """collect's run dirs, dir by dir in the order given (the first dir's preset rules), each run
    once however its dir is written, and the records of the runs read from runs.csv files."""
    run_dirs: list[Path] = []  # dir by dir, in the order given: the first dir's preset rules
    from_csv: dict[Path, dict] = {}  # runs read from runs.csv files, by their run dir
    seen: dict[Path, Path] = {}  # each run once, however its dir is written (relative, ~)
    for d in dirs:
        if d.is_file():
            for record in runs_csv.read(d):
                key = _where(record["dir"])
                if key in seen:  # the same run again (its dir given too: its own files rule)
                    earlier = from_csv.get(seen[key])
                    if earlier is None or (earlier["config"], earlier["metrics"]) == (
                            record["config"], record["metrics"]):
                        continue
                    # another run that had the same dir (two machines, one sweep dir): its own
                    record["dir"] = Path(record["results"]["from_csv"])
                    key = _where(record["dir"])
                seen[key] = record["dir"]
                from_csv[record["dir"]] = record
                run_dirs.append(record["dir"])
            continue
        here = ({p.parent.parent for p in d.rglob(".hydra/config.yaml")} |
                {p.parent for p in d.rglob("results.json")})
        for run_dir in sorted(here):
            if _where(run_dir) not in seen:
                seen[_where(run_dir)] = run_dir
                run_dirs.append(run_dir)
    return run_dirs, from_csv


def _where(path: Path) -> Path:
    """A run dir as one key, however it is written (relative, with ~)."""
    return Path(path).expanduser().resolve()


def _not_results(results: dict) -> str | None:
    """What makes a complete results.json unreadable to `report`, or None."""
    if not isinstance(results.get("config"), dict) or not isinstance(results.get("metrics"), dict):
        return "it has no config or metrics (not written by heads-lab train)"
    bad = [k for k, v in results["metrics"].items()
           if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)))]
    return f"metrics {bad} are not numbers" if bad else None


def model_shape(config: dict[str, Any]) -> dict[str, int]:
    """A run's head shape as its attention variant states it (heads_lab.config.variants), with what a
    None stands for given (model.kv_heads = model.heads, model.head_dim = d_model / heads, ...),
    from its flattened config; {} for a config this version cannot read."""
    names = {f.name for f in dataclasses.fields(ModelConfig)}
    if config.get("model.heads") is None:
        return {}
    try:
        cfg = ModelConfig(**{k[len("model."):]: v for k, v in config.items()
                             if k.startswith("model.") and k[len("model."):] in names})
        kind = VARIANTS[getattr(cfg.attention, "value", cfg.attention)]
        return {**kind.shape_values(cfg), "model.head_dim": cfg.d_head}
    except (KeyError, TypeError, ZeroDivisionError):
        return {}


def fill_unset(runs: list[Run]) -> None:
    """Runs of one model from two presets are one row: a shape key that some runs set and others
    leave None (kv_heads 8 in `kv_heads`, None in `table_a`, both with 8 heads) takes, where
    None, the value the None stands for. A key None in every run stays None (not a setting)."""
    shapes = [model_shape(r.config) for r in runs]
    for key in sorted({k for shape in shapes for k in shape}):
        values = [r.config.get(key) for r in runs]
        if None in values and any(v is not None for v in values):
            for run, shape in zip(runs, shapes):
                if run.config.get(key) is None and key in shape:
                    run.config[key] = shape[key]


def group(runs: list[Run]) -> tuple[list[Row], list[str]]:
    """Rows of runs with equal settings (seeds pooled), in the order of their settings, and the
    keys that vary: the swept ones (set on the command line) first, then those that follow from
    them or from the preset. Fills the runs' unset shape keys in place where others set them
    (fill_unset)."""
    fill_unset(runs)
    on_command_line = swept(runs)
    keys = sorted({k for r in runs for k in r.config}, key=lambda k: (k not in on_command_line, k))
    varying = [k for k in keys if not is_among(k, (*BOOKKEEPING, "seed"))
               and len({json.dumps(r.config.get(k), sort_keys=True) for r in runs}) > 1]
    if "data.name" in varying:  # several data sets: the rows group by data set, labelled by it
        varying = ["data.name"] + [k for k in varying if k != "data.name" and not (
            k.startswith("data.") and follows(runs, k, "data.name"))]
    rows: dict[tuple, Row] = {}
    for run in runs:
        key = tuple(json.dumps(run.config.get(k), sort_keys=True) for k in varying)
        label = ",".join(f"{short_key(k)}={as_written(run.config.get(k))}"
                         for k in varying) or "all runs"
        rows.setdefault(key, Row(key, label)).runs.append(run)
    first = {}  # data sets in the order their runs came (the dirs given): the first dir's first
    for run in runs:
        first.setdefault(json.dumps(run.config.get("data.name")), (0, len(first), ""))
    return sorted(rows.values(), key=lambda row: [
        first[json.dumps(row.runs[0].config.get(k))] if k == "data.name"
        else value_order(row.runs[0].config.get(k)) for k in varying]), varying


def follows(runs: list[Run], key: str, by: str) -> bool:
    """Whether `key`'s value is one per value of `by` (a data set's files, splits and languages
    follow from the data set): then it is no setting of its own beside `by`."""
    seen: dict[str, str] = {}
    for run in runs:
        value = json.dumps(run.config.get(key), sort_keys=True)
        if seen.setdefault(json.dumps(run.config.get(by)), value) != value:
            return False
    return True


def data_sets(rows: list[Row]) -> dict[str, list[Row]]:
    """The rows by data set (data.name), in row order; {"": rows} for one data set."""
    names = {row.runs[0].config.get("data.name") for row in rows}
    if len(names) < 2:
        return {"": rows}
    out: dict[str, list[Row]] = {}
    for row in rows:
        out.setdefault(str(row.runs[0].config.get("data.name")), []).append(row)
    return out


def value_order(value: Any) -> tuple:
    """Rows in the order of their settings: numbers by value, then text, then null."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return (0, value, "")
    return (1, 0, json.dumps(value, sort_keys=True)) if value is not None else (2, 0, "")


def base_row(rows: list[Row], runs: list[Run]) -> Row:
    """The row matching the preset's report.base settings, else the first row."""
    return _matching(rows, _wanted(runs)) or rows[0]


def _wanted(runs: list[Run]) -> dict[str, Any]:
    """The preset's report.base settings (the first run's: the first dir given rules)."""
    return {k[len("report.base."):]: v for k, v in runs[0].config.items()
            if k.startswith("report.base.")}


def _matching(rows: list[Row], wanted: dict[str, Any]) -> Row | None:
    for row in rows:
        cfg = row.runs[0].config
        if wanted and all(cfg.get(k) == v for k, v in wanted.items()):
            return row
    return None


@dataclass
class Comparison:
    """Rows whose p is against one base row: all of a table's rows, or those of one value of
    report.x (x_value). base None: that value has no base row, so its rows get no p."""
    rows: list[Row]
    base: Row | None
    x_value: Any = None
    seeds: list | None = None  # the seeds significance paired (None: no test)


def comparisons(rows: list[Row], runs: list[Run]) -> tuple[str | None, list[Comparison]]:
    """Which base row each row's p is against: (x, comparisons). Where the preset's `report.x`
    is one of its `report.base` settings (heads_by_data: base h = 8 at data.train_fraction 1.0,
    x the data size), each value of x has its own base row, the base's other settings at that x
    (h = 8 at 10 %, at 30 %, at 100 %), and a row is tested against the base of its own x: the
    question such a study asks is h against 8 heads at the same data size, not a 10 % model
    against the 100 % one. Else one comparison, every row against base_row; x is None."""
    wanted = _wanted(runs)
    x = runs[0].config.get("report.x")
    if not x or x not in wanted:
        return None, [Comparison(rows, base_row(rows, runs))]
    by_x: dict[str, list[Row]] = {}
    for row in rows:
        by_x.setdefault(json.dumps(row.runs[0].config.get(x)), []).append(row)
    out = []
    for mine in by_x.values():
        at_x = mine[0].runs[0].config.get(x)
        out.append(Comparison(mine, _matching(mine, {**wanted, x: at_x}), at_x))
    if all(c.base is None for c in out):  # no value has the base: one comparison, as without x
        return None, [Comparison(rows, base_row(rows, runs))]
    like = ",".join(f"{short_key(k)}={as_written(v)}" for k, v in wanted.items() if k != x)
    for c in out:
        for row in c.rows if c.base is None else []:
            row.p_reason = f"no {like} at {short_key(x)}={c.x_value}"
    return x, out


def stat(values: list[float], digits: int) -> str:
    values = [v for v in values if v is not None and math.isfinite(v)]
    if not values:
        return "-"
    mean = statistics.fmean(values)
    if len(values) == 1:
        return f"{mean:,.{digits}f}"
    return f"{mean:,.{digits}f} ± {statistics.stdev(values):,.{digits}f}"


def params_text(values: list[float | None]) -> str:
    """Parameter counts: one number when the runs agree (the usual case), else mean ± std."""
    known = {int(v) for v in values if v is not None}
    return f"{known.pop():,}" if len(known) == 1 else stat(values, 0)


def paper_of(runs: list[Run]) -> dict | None:
    """The paper's published numbers for the preset's rows; none beside pruned models (a gates
    run keeps its trained run's report settings, but the paper has no such row)."""
    if any(r.results.get("prune") for r in runs):
        return None
    return PAPER.get(runs[0].config.get("report.paper") or "")


def train_pairs(run: Run) -> int | None:
    """The training pairs the run trained on (results.json data.train.kept: after cleaning and
    data.train_fraction), or None where not recorded."""
    return (run.results.get("data") or {}).get("train", {}).get("kept")


def evaluated(run: Run) -> str:
    """Which weights a run's BLEU and PPL come from: "best" (eval.checkpoint=best) or "last"."""
    return (run.results.get("train", {}).get("evaluated") or {}).get("checkpoint") or "last"
