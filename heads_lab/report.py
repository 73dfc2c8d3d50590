"""`heads-lab report <multirun dirs or run dirs>`: a study's table from the runs' own files.

Reads every results.json under the dirs (no wandb needed), groups the runs by the settings that vary
between them (seeds pooled), and writes, next to the first dir (or --out): report.md, report.csv and
two PNGs (BLEU and PPL against the swept setting with error bars; quality against cost). Each row:
the varied settings, the head shape (its variant's own kinds: h and kv_heads, or h_K, h and h_V;
d_k, layers), parameters, valid PPL, test BLEU and chrF as mean ± std over seeds, tokens/s and peak
memory, and sacrebleu's paired bootstrap p-value of its BLEU against the base row (the preset's
`report.base`, else the first row), on the hypotheses of the seeds every row has (the note names
them). Rows are in the order of their settings, the ones swept on the command line first. Runs that
failed or never finished are listed, never averaged in; so are runs under another run's dir (a gates
run under <run>/prune/). With `report.paper=table_a` the published Table 3 (A) numbers are printed
beside ours, labelled as the paper's. With several dirs, the first one's runs set report.base and
report.paper: `heads-lab report <new sweep> <runs of an earlier sweep with the same settings>`
reuses finished runs instead of repeating them; a head-shape key one preset leaves None and another
sets to the value the None stands for (model.kv_heads None = model.heads) is one setting, so those
runs share a row.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console

from heads_lab.config import BOOKKEEPING, is_among, written_before
from heads_lab.errors import DataError
from heads_lab.sites import KEPT_COLUMNS, SITES
from heads_lab.tables import to_rich, wide_console, write_csv, write_markdown
from heads_lab.variants import shape_keys

USAGE = "heads-lab report <dir> [<dir> ...] [--out DIR] [--samples N] [--wandb [--wandb-mode M]]"
# Vaswani et al. 2017, Table 3 row (A): WMT14 en-de newstest2013, dev PPL (per wordpiece) / BLEU.
PAPER = {"table_a": {"key": "model.heads", "label": "Vaswani et al. 2017 Table 3 (A), WMT14 "
                     "en-de newstest2013", "rows": {1: (5.29, 24.9), 4: (5.00, 25.5),
                                                    8: (4.92, 25.8), 16: (4.91, 25.8),
                                                    32: (5.01, 25.4)}}}
# Settings that never define a row: where things go, how they are logged, the seed.
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


def main(args: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="heads-lab report", usage=USAGE, description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dirs", nargs="+", help="multirun dirs, run dirs, or dirs holding them")
    parser.add_argument("--out", help="where to write report.md/.csv/.png (default: first dir)")
    parser.add_argument("--samples", type=int, default=1000, help="bootstrap resamples")
    parser.add_argument("--wandb", action="store_true",
                        help="also log the table and plots to a wandb run (job_type report, in "
                             "the runs' project and group), under <out>/wandb")
    parser.add_argument("--wandb-mode", choices=("offline", "online"), default="offline",
                        help="online needs a network and WANDB_API_KEY; without one: offline")
    opts = parser.parse_args(args)
    runs, problems = collect([Path(d) for d in opts.dirs])
    rows, varying = group(runs)
    base = base_row(rows, runs)
    split = runs[0].results["decoding"]["split"]
    status = Console(stderr=True)  # progress on stderr: stdout keeps the table alone
    status.print(f"report: {len(runs)} runs in {len(rows)} rows; paired bootstrap of BLEU against "
                 f"the base row ({opts.samples} resamples) ...")
    started = time.monotonic()
    p_seeds = significance(rows, base, split, opts.samples)
    status.print(f"report: bootstrap done in {time.monotonic() - started:.0f} s")
    out = Path(opts.out or opts.dirs[0])
    out.mkdir(parents=True, exist_ok=True)
    table = render(rows, base, varying, split, paper_of(runs), p_seeds)
    console = wide_console()
    console.print(to_rich(table, "heads-lab report"))
    for where, status in problems:
        console.print(f"[yellow]not in the table[/]: {where} ({status})")
    write_markdown(out / "report.md", table, problems)
    write_csv(out / "report.csv", table)
    pngs = plot(rows, varying, split, out)
    console.print(f"report: {out / 'report.md'}, {out / 'report.csv'}, " + ", ".join(map(str, pngs)))
    if opts.wandb:
        where = log_to_wandb(runs, table, pngs, out, opts.wandb_mode)
        if where:
            console.print(f"wandb report run: {where} (upload: wandb sync {where})")
    return 0


def log_to_wandb(runs: list[Run], table: dict[str, Any], pngs: list[Path], out: Path,
                 mode: str) -> str | None:
    """The report as a wandb run (job_type report) in the runs' project and group (when they
    share one): the table as a wandb.Table, the plots as images. Returns the run's local dir."""
    from heads_lab.config import WandbConfig, WandbMode
    from heads_lab.tracking import start_wandb

    infos = [r.results.get("wandb") or {} for r in runs]
    groups = {i.get("group") for i in infos if i.get("group")}
    project = next((i["project"] for i in infos if i.get("project")),
                   runs[0].config.get("logger.project") or "heads-lab")
    tags = sorted({t for r in runs for t in (r.config.get("tags") or [])})
    config = {"report.dirs": sorted({str(r.dir.resolve()) for r in runs}), "report.runs": len(runs),
              "report.varying": table["varying"]}
    run = start_wandb(WandbConfig(project=project, mode=WandbMode(mode)), out, "report", config,
                      groups.pop() if len(groups) == 1 else None, tags, job_type="report",
                      resume=False)
    if run is None:
        return None
    import wandb

    try:
        run.log({"report/table": wandb.Table(columns=table["header"], data=table["rows"]),
                 **{f"report/{png.stem}": wandb.Image(str(png)) for png in pngs}})
        where = str(Path(run.dir).parent)
    finally:
        run.finish()
    return where


def collect(dirs: list[Path]) -> tuple[list[Run], list[tuple[str, str]]]:
    """Complete runs, and (dir, status) of runs that failed or have no results."""
    from heads_lab.tracking import flatten

    runs, problems = [], []
    for d in dirs:
        if not d.is_dir():
            raise DataError(f"no dir {d}; give multirun or run dirs (e.g. outputs/multiruns/...)")
    run_dirs: list[Path] = []  # dir by dir, in the order given: the first dir's preset rules
    for d in dirs:
        here = ({p.parent.parent for p in d.rglob(".hydra/config.yaml")} |
                {p.parent for p in d.rglob("results.json")})
        run_dirs += [r for r in sorted(here) if r not in run_dirs]
    found = set(run_dirs)
    for run_dir in run_dirs:
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
        except json.JSONDecodeError as err:
            problems.append((str(run_dir), f"unreadable results.json: {err}"))
            continue
        if results.get("status") != "complete":
            problems.append((str(run_dir), results.get("status", "incomplete")))
            continue
        config = flatten(results["config"])
        config.update(written_before(config))  # e.g. an older talking-heads run's mix start
        if str(config.get("trainer.precision")) == "auto":  # what the run computed in
            config["trainer.precision"] = results.get("precision", "auto")
        runs.append(Run(run_dir, config, results["metrics"], results))
    if not runs:
        raise DataError(f"no finished runs (results.json) under {', '.join(map(str, dirs))}; "
                        "point heads-lab report at the dirs `heads-lab train` wrote")
    return runs, problems


def model_shape(config: dict[str, Any]) -> dict[str, int]:
    """A run's head shape as its attention variant states it (heads_lab.variants), with what a
    None stands for given (model.kv_heads = model.heads, model.head_dim = d_model / heads, ...),
    from its flattened config; {} for a config this version cannot read."""
    from heads_lab.schemas import ModelConfig
    from heads_lab.variants import VARIANTS

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


def swept(runs: list[Run]) -> set[str]:
    """The settings the runs' own command lines set (results.json's overrides, `+`/`~` dropped),
    e.g. model.heads_k in `talking_heads_kv`, where model.head_dim and model.heads_v follow it."""
    return {item.split("=", 1)[0].lstrip("+~") for run in runs
            for item in run.results.get("overrides", []) if "=" in item}


def group(runs: list[Run]) -> tuple[list[Row], list[str]]:
    """Rows of runs with equal settings (seeds pooled), in the order of their settings, and the
    keys that vary: the swept ones (set on the command line) first, then those that follow from
    them or from the preset. Fills the runs' unset shape keys in place where others set them
    (fill_unset)."""
    from heads_lab.tracking import short_key

    fill_unset(runs)
    on_command_line = swept(runs)
    keys = sorted({k for r in runs for k in r.config}, key=lambda k: (k not in on_command_line, k))
    varying = [k for k in keys if not is_among(k, (*BOOKKEEPING, "seed"))
               and len({json.dumps(r.config.get(k), sort_keys=True) for r in runs}) > 1]
    rows: dict[tuple, Row] = {}
    for run in runs:
        key = tuple(json.dumps(run.config.get(k), sort_keys=True) for k in varying)
        label = ",".join(f"{short_key(k)}={run.config.get(k)}" for k in varying) or "all runs"
        rows.setdefault(key, Row(key, label)).runs.append(run)
    return sorted(rows.values(), key=lambda row: [_order(row.runs[0].config.get(k))
                                                  for k in varying]), varying


def _order(value: Any) -> tuple:
    """Rows in the order of their settings: numbers by value, then text, then null."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return (0, value, "")
    return (1, 0, json.dumps(value, sort_keys=True)) if value is not None else (2, 0, "")


def base_row(rows: list[Row], runs: list[Run]) -> Row:
    """The row matching the preset's report.base settings, else the first row."""
    wanted = {k[len("report.base."):]: v for k, v in runs[0].config.items()
              if k.startswith("report.base.")}
    for row in rows:
        cfg = row.runs[0].config
        if wanted and all(cfg.get(k) == v for k, v in wanted.items()):
            return row
    return rows[0]


def significance(rows: list[Row], base: Row, split: str, samples: int) -> list | None:
    """Paired bootstrap (sacrebleu) of each row's BLEU against the base row, on the hypotheses
    of the seeds every row has, concatenated in seed order. Returns those seeds (None: no test)."""
    from sacrebleu.metrics import BLEU
    from sacrebleu.significance import PairedTest

    common = set.intersection(*({r.config.get("seed") for r in row.runs} for row in rows))
    if len(rows) < 2 or not common:
        return None
    seeds = sorted(common)

    def texts(row: Row, kind: str) -> list[str]:
        by_seed = {r.config.get("seed"): r for r in row.runs}
        out = []
        for s in seeds:
            path = by_seed[s].dir / f"{kind}.{split}.txt"
            out += path.read_text(encoding="utf-8").splitlines()
        return out

    refs = texts(base, "refs")
    others = [row for row in rows if row is not base]
    named = [(base.label, texts(base, "hyps"))] + [(row.label, texts(row, "hyps")) for row in others]
    if any(len(h) != len(refs) for _, h in named):
        return None  # different test sets: no paired test
    test = PairedTest(named, {"BLEU": BLEU()}, [refs], test_type="bs", n_samples=samples)
    _, scores = test()
    for row, result in zip(others, scores["BLEU"][1:]):
        row.p_value = result.p_value
    return seeds


def _stat(values: list[float], digits: int) -> str:
    values = [v for v in values if v is not None and math.isfinite(v)]
    if not values:
        return "-"
    mean = statistics.fmean(values)
    if len(values) == 1:
        return f"{mean:,.{digits}f}"
    return f"{mean:,.{digits}f} ± {statistics.stdev(values):,.{digits}f}"


def _params(values: list[float | None]) -> str:
    """Parameter counts: one number when the runs agree (the usual case), else mean ± std."""
    known = {int(v) for v in values if v is not None}
    return f"{known.pop():,}" if len(known) == 1 else _stat(values, 0)


def paper_of(runs: list[Run]) -> dict | None:
    """The paper's published numbers for the preset's rows; none beside pruned models (a gates
    run keeps its trained run's report settings, but the paper has no such row)."""
    if any(r.results.get("prune") for r in runs):
        return None
    return PAPER.get(runs[0].config.get("report.paper") or "")


def render(rows: list[Row], base: Row, varying: list[str], split: str,
           paper: dict | None, p_seeds: list | None = None) -> dict[str, Any]:
    """The table as header + string rows (shared by the console, Markdown and CSV)."""
    header = ["setting", *[name for name, _ in SHAPE], "params", "runs", "valid PPL",
              f"{split} BLEU", f"{split} chrF", "p vs base", "tok/s", "peak MB"]
    gated = any(k.startswith("heads_kept/") for row in rows for r in row.runs for k in r.metrics)
    if gated:  # Hard Concrete gates (prune.l0_lambda): heads kept per attention type
        header += list(KEPT_COLUMNS)
    if paper:
        header += ["paper PPL", "paper BLEU"]
    body = []
    for row in rows:
        c, m = row.runs[0].config, [r.metrics for r in row.runs]
        known = model_shape(c)
        shape = []
        for _, key in SHAPE:
            if key is None:
                shape.append(f"{c.get('model.encoder_layers')}+{c.get('model.decoder_layers')}")
            elif key == "model.head_dim":
                shape.append(str(row.runs[0].results.get("cost", {}).get("d_head")
                                 or known.get(key) or c.get(key)
                                 or c.get("model.d_model", 0) // (c.get("model.heads") or 1)))
            elif known:  # "–": not a key of this row's attention variant (h_K for multi-head)
                shape.append(str(known[key]) if key in known else NOT_APPLICABLE)
            else:  # a config this version cannot read: as written, unset = model.heads
                shape.append(str(c.get(key) if c.get(key) is not None else c.get("model.heads")))
        cells = [row.label + (" (base)" if row is base else ""), *shape,
                 _params([x.get("cost/params") for x in m]),
                 str(len(row.runs)), _stat([x.get("valid/ppl") for x in m], 2),
                 _stat([x.get(f"{split}/bleu") for x in m], 2),
                 _stat([x.get(f"{split}/chrf") for x in m], 2),
                 "-" if row.p_value is None else f"{row.p_value:.4f}",
                 _stat([x.get("train/tokens_per_s") for x in m], 0),
                 _stat([x.get("cost/peak_mem_mb") for x in m], 0)]
        if gated:
            cells += [_stat([x.get(f"heads_kept/{site}") for x in m], 1)
                      for site in SITES]
        if paper:
            published = paper["rows"].get(c.get(paper["key"]))
            cells += [f"{published[0]:.2f}", f"{published[1]:.1f}"] if published else ["", ""]
        body.append(cells)
    unused = [i for i in range(1, 1 + len(SHAPE)) if all(b[i] == NOT_APPLICABLE for b in body)]
    header = [x for i, x in enumerate(header) if i not in unused]  # e.g. h_K in table_a's
    body = [[x for i, x in enumerate(b) if i not in unused] for b in body]
    note = ("mean ± std over the runs (seeds) of a row; p: sacrebleu paired bootstrap of BLEU "
            "vs the base row (seed-matched hypotheses)")
    if p_seeds:  # name them: where rows have different seeds, p uses only those all rows have
        partial = any({r.config.get("seed") for r in row.runs} != set(p_seeds) for row in rows)
        plural = "s" if len(p_seeds) > 1 else ""
        note += (f", on seed{plural} {', '.join(map(str, p_seeds))}"
                 + (f", the seed{plural} every row has" if partial else "")
                 + (" (concatenated)" if plural else ""))
    if gated:  # runs from before prune.gate_eval existed kept heads by the binary rule
        rules = sorted({r.config.get("prune.gate_eval") or "binary" for row in rows
                        for r in row.runs if "heads_kept/enc-self" in r.metrics})
        note += (f"; kept: heads the test-time gates keep, by the {' / '.join(rules)} rule "
                 "(prune.gate_eval)")
    if paper:
        note += f"; paper columns: {paper['label']} (theirs, not ours)"
    return {"header": header, "rows": body, "note": note, "varying": varying}


def curves(rows: list[Row], varying: list[str]) -> tuple[str | None, dict[str, list[int]]]:
    """What the quality plot draws: the x setting (the one numeric setting that varies; where
    several do, the one swept on the command line if the others follow from it, as d_k and h_V
    follow h_K; else None: the rows side by side) and one line per value of the other varying
    settings (attention=mha, attention=talking_heads), each as row indices in the order of x."""
    from heads_lab.tracking import short_key

    def is_number(value: Any) -> bool:
        return isinstance(value, (int, float)) and not isinstance(value, bool)

    side_by_side: tuple[None, dict[str, list[int]]] = (None, {"": list(range(len(rows)))})
    numbers = [k for k in varying if all(is_number(row.runs[0].config.get(k)) for row in rows)]
    on_command_line = swept([run for row in rows for run in row.runs])
    candidates = numbers if len(numbers) == 1 else [k for k in numbers if k in on_command_line]
    if len(candidates) != 1:
        return side_by_side
    x_key = candidates[0]
    lines: dict[str, list[int]] = {}
    for i, row in enumerate(rows):
        label = ",".join(f"{short_key(k)}={row.runs[0].config.get(k)}" for k in varying
                         if k not in numbers)
        lines.setdefault(label, []).append(i)
    if any(len({rows[i].runs[0].config.get(x_key) for i in order}) != len(order)
           for order in lines.values()):  # another number varies on its own: no single x
        return side_by_side
    for order in lines.values():
        order.sort(key=lambda i: rows[i].runs[0].config.get(x_key))
    return x_key, lines


def plot(rows: list[Row], varying: list[str], split: str, out: Path) -> list[Path]:
    """BLEU and PPL against the swept setting (numeric when one numeric setting varies, a line per
    value of the others), and BLEU against training tokens/s; error bars are the std over seeds."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def series(metric: str):
        values = [[r.metrics[metric] for r in row.runs if r.metrics.get(metric) is not None]
                  for row in rows]
        return ([statistics.fmean(v) if v else math.nan for v in values],
                [statistics.stdev(v) if len(v) > 1 else 0.0 for v in values])

    x_key, lines = curves(rows, varying)
    numeric = x_key is not None
    xs = [row.runs[0].config.get(x_key) for row in rows] if numeric else list(range(len(rows)))
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, metric, name in ((axes[0], f"{split}/bleu", f"{split} BLEU"),
                             (axes[1], "valid/ppl", "valid PPL")):
        mean, std = series(metric)
        for label, order in lines.items():
            ax.errorbar([xs[i] for i in order], [mean[i] for i in order],
                        [std[i] for i in order], marker="o", capsize=4, label=label or None)
        if len(lines) > 1:
            ax.legend(fontsize=8)
        ax.set_ylabel(name)
        ax.set_xlabel(x_key if numeric else "setting")
        if numeric and min(xs) > 0 and max(xs) / min(xs) >= 8:
            ax.set_xscale("log", base=2)
        if not numeric:
            ax.set_xticks(range(len(rows)), [rows[i].label for i in range(len(rows))],
                          rotation=30, ha="right", fontsize=8)
        ax.grid(alpha=0.3)
    fig.tight_layout()
    first = out / "report_quality.png"
    fig.savefig(first, dpi=120)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(5.5, 4))
    speed, speed_std = series("train/tokens_per_s")
    cost_name = "training target tokens/s"
    if all(math.isnan(x) for x in speed):  # e.g. pruned models (heads-lab prune): their size
        speed, speed_std = series("cost/params")
        cost_name = "parameters"
    bleu, bleu_std = series(f"{split}/bleu")
    ax.errorbar(speed, bleu, yerr=bleu_std, xerr=speed_std, fmt="o", capsize=3)
    for row, x, y in zip(rows, speed, bleu):
        ax.annotate(row.label, (x, y), fontsize=7, xytext=(3, 3), textcoords="offset points")
    ax.set_xlabel(cost_name)
    ax.set_ylabel(f"{split} BLEU")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    second = out / "report_quality_vs_cost.png"
    fig.savefig(second, dpi=120)
    plt.close(fig)
    return [first, second]


