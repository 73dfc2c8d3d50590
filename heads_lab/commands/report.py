"""`heads-lab report <multirun dirs, run dirs or runs.csv files>`: a study's table from the runs'
own files (a runs.csv a report wrote stands for its runs: a study in parts merges).

Reads every results.json under the dirs (no wandb needed), groups the runs by the settings that vary
between them (seeds pooled), and writes, next to the first dir (or --out): report.md, report.csv,
runs.csv (each run's own numbers and its p against the base row's run of its seed: runs_table)
and the PNGs (BLEU and PPL against the swept setting with error bars; quality against cost; the
validation curves). Each row:
the varied settings, the head shape (its variant's own kinds: h and kv_heads, or h_K, h and h_V;
d_k, layers), parameters, valid PPL, test BLEU and chrF as mean ± std over seeds, tokens/s and peak
memory (and the training pairs where rows differ in them), and the p of its BLEU against the base
row (the preset's `report.base`, else the first row): Welch's t over the seeds, its variance the
seeds' spread plus the test set's (docs/significance.md), where both rows have two or more seeds;
sacrebleu's paired bootstrap on the seed they share, marked, where one has one; where the
preset's `report.x` is one of
report.base's settings (heads_by_data), against the base at the row's own x (h = 8 at the same data
size). Rows are in the order of their settings, the ones swept on the command line first. Runs that
failed or never finished are listed, never averaged in; so are runs under another run's dir (a gates
run under <run>/prune/). With `report.paper=table_a` the published Table 3 (A) numbers are printed
beside ours, labelled as the paper's. With several dirs, the first one's runs' preset sets
report.base and report.paper (without a preset's report.base, the base is the first row in the
order of the settings, whichever dir it came from): `heads-lab report <new sweep> <runs of an
earlier sweep with the same settings>` reuses finished runs instead of repeating them; a head-shape
key one preset leaves None and another sets to the value the None stands for (model.kv_heads None =
model.heads) is one setting, so those runs share a row. `--choose KEY` (e.g. trainer.lr, tuned per
setting on seed 1): the table, p and figures keep only each setting's best value's row, compared on
the seeds its values share (report/choose.py); every value's score goes to chosen.md,
chosen.csv and chosen.png, and runs.csv keeps every run.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape

from heads_lab.config.sites import KEPT_COLUMNS, SITES
from heads_lab.errors import ConfigError
from heads_lab.output.files import ensure_writable
from heads_lab.output.tables import plain, to_rich, wide_console, write_csv, write_markdown
from heads_lab.output.trackers import report_to_wandb
from heads_lab.report import lm as lm_report
from heads_lab.report.choose import choose, metric
from heads_lab.report.choose import table as choice_table
from heads_lab.report.figures import plot, plot_choices
from heads_lab.report.lm import is_lm, split_of
from heads_lab.report.rows import (
    NOT_APPLICABLE,
    SHAPE,
    Comparison,
    Row,
    Run,
    collect,
    comparisons,
    data_sets,
    evaluated,
    group,
    model_shape,
    paper_of,
    params_text,
    stat,
    train_pairs,
)
from heads_lab.report.seeds import (
    p_note,
    p_text,
    runs_table,
    seed_p_values,
    significance,
)

USAGE = ("heads-lab report <dir> [<dir> ...] [--out DIR] [--samples N] [--choose KEY] "
         "[--wandb [--wandb-mode M]]")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="heads-lab report", usage=USAGE, description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dirs", nargs="+", help="multirun dirs, run dirs, dirs holding them, or "
                                                "runs.csv files a report wrote (a study in parts)")
    parser.add_argument("--out", help="where to write report.md/.csv, runs.csv and the PNGs (default: "
                                          "first dir)")
    parser.add_argument("--samples", type=int, default=1000, help="bootstrap resamples")
    parser.add_argument("--choose", metavar="KEY",
                        help="a setting tuned per row, e.g. trainer.lr: keep, for each setting of "
                             "the others, the value with the lowest validation score (valid bits "
                             "per byte, a translator's valid PPL) on the seeds its values share; "
                             "the choices go to chosen.md and chosen.csv (runs.csv keeps every "
                             "run)")
    parser.add_argument("--wandb", action="store_true",
                        help="also log the table and plots to a wandb run (job_type report, in "
                             "the runs' project and group), under <out>/wandb")
    parser.add_argument("--wandb-mode", choices=("offline", "online"), default=None,
                        help="with --wandb: offline (the default) | online (needs a network "
                             "and WANDB_API_KEY; without one: offline)")
    return parser


def main(args: list[str]) -> int:
    opts = _parser().parse_args(args)
    if opts.wandb_mode and not opts.wandb:
        raise ConfigError(f"--wandb-mode {opts.wandb_mode} without --wandb logs nothing: add "
                          "--wandb")
    opts.wandb_mode = opts.wandb_mode or "offline"
    if opts.samples < 1:
        raise ConfigError(f"--samples {opts.samples}: the paired bootstrap needs at least 1 "
                          "resample (1000 by default)")
    runs, problems = collect([Path(d) for d in opts.dirs])
    out = Path(opts.out or opts.dirs[0])
    inputs = [Path(d).resolve() for d in opts.dirs if Path(d).is_file()]  # runs.csv files
    if not opts.out and inputs and Path(opts.dirs[0]).is_file():
        raise ConfigError(f"the first argument {opts.dirs[0]} is a runs.csv: say where the report "
                          "goes with --out DIR")
    if (out / "runs.csv").resolve() in inputs:
        raise ConfigError(f"--out {out} holds {out / 'runs.csv'}, which this report reads: it "
                          "would be overwritten; write the report to another dir")
    every, varying = group(runs)  # every row; runs.csv keeps them all
    lm = is_lm(runs)  # language models: PPL and bits per byte (heads_lab/report/lm.py)
    rows, varying, choices = _choose(every, varying, opts.choose, lm)
    ensure_writable(out, "--out" if opts.out else "the first dir")  # before the bootstrap
    kept = [r for row in rows for r in row.runs]  # (the first dir's runs still set the preset)
    split = split_of(runs[0])
    # on stderr: stdout keeps the table alone; markup off, as the other consoles (paths print whole)
    status = Console(stderr=True, soft_wrap=True, markup=False)
    status.print(f"report: {len(kept)} runs in {len(rows)} rows; p of "
                 f"{'bits per byte' if lm else 'BLEU'} against the base row ({opts.samples} "
                 f"{'row' if lm else 'sentence'} draws) ...")
    started = time.monotonic()
    tables, seed_p = _tables(rows, runs, varying, split, opts.samples, lm)
    if choices is not None:
        for _, table in tables:
            table["note"] += (f"; rows: each setting's {opts.choose} with the lowest "
                              f"{metric(lm)[1]} (--choose; every value's score: chosen.md), "
                              f"{len(runs) - len(kept)} runs at the other values left out")
    status.print(f"report: bootstrap done in {time.monotonic() - started:.0f} s")
    console = wide_console()
    for name, table in tables:
        console.print(to_rich(table, f"heads-lab report{f': data={name}' if name else ''}"))
    if choices is not None:
        chosen = choice_table(choices, opts.choose, lm)
        console.print(to_rich(chosen, f"heads-lab report: {opts.choose} chosen per setting"))
    for where, status in problems:
        console.print(f"[yellow]not in the table[/]: {escape(str(where))} ({escape(str(status))})",
                      markup=True)
    write_markdown(out / "report.md", tables, problems)
    write_csv(out / "report.csv", [table for _, table in tables])
    if choices is not None:
        write_markdown(out / "chosen.md", chosen)
        write_csv(out / "chosen.csv", chosen)
    home = Path.home().resolve()
    write_csv(out / "runs.csv", lm_report.runs_table(every, split, lambda r: lm_report.where(
        r, home)) if lm else runs_table(every, split, seed_p))
    table = tables[0][1] if len(tables) == 1 else joined(tables)
    drawn = [k for k in varying if k != opts.choose]  # a chosen value is no axis of its own
    pngs = plot(rows, drawn, split, out,
                ("bits_per_byte", "bits per byte") if lm else ("bleu", "BLEU"))
    if choices is not None:
        pngs += [p for p in [plot_choices(choices, opts.choose, metric(lm)[1],
                                          out / "chosen.png")] if p]
    console.print(f"report: {out / 'report.md'}, {out / 'report.csv'}, {out / 'runs.csv'}, "
                  + "".join(f"{out / n}, " for n in ("chosen.md", "chosen.csv") if choices)
                  + ", ".join(map(str, pngs)))
    if not any(p.name == "report_valid_curves.png" for p in pngs):
        console.print("no report_valid_curves.png: no run validated twice or more "
                      "(trainer.valid_every below trainer.max_steps draws the curves)")
    if opts.wandb:
        where = report_to_wandb(
            [r.results.get("wandb") or {} for r in kept],
            runs[0].config.get("logger.project") or "heads-lab",
            sorted({t for r in runs for t in (r.config.get("tags") or [])}),
            {"report.dirs": sorted({str(r.dir.resolve()) for r in kept}),
             "report.runs": len(kept), "report.varying": table["varying"]},
            plain(table), pngs, out, opts.wandb_mode)  # numbers, as report.csv
        if where:
            console.print(f"wandb report run: {where} (upload: wandb sync {where})")
    return 0


def _choose(every: list[Row], varying: list[str], key: str | None, lm: bool):
    """--choose KEY: each setting's best value's row (heads_lab/report/choose.py), the others
    marked for runs.csv (no p, and not for being the base row); without it, every row."""
    if not key:
        return every, varying, None
    rows, varying, choices = choose(every, varying, key, lm)
    for row in every:
        if not any(row is k for k in rows):
            row.p_reason = f"another {key} chosen"
    return rows, varying, choices


def _tables(rows: list[Row], runs, varying: list[str], split: str, samples: int,
            lm: bool) -> tuple[list, dict[Path, str]]:
    """The table of each data set, with its own base row (p pairs one test set only), and each
    run's p against the base row's run of its seed (a translator's runs.csv)."""
    tables, seed_p = [], {}
    for name, subset in data_sets(rows).items():
        x, tested = comparisons(subset, runs)
        for c in tested:
            if c.base is not None and lm:
                lm_report.significance(c.rows, c.base, split, samples)
            elif c.base is not None:
                c.seeds = significance(c.rows, c.base, split, samples)
                seed_p.update(seed_p_values(c, split, samples))
        tables.append((name, lm_report.render(
            subset, [c.base for c in tested if c.base is not None], shape_cells,
            [n for n, _ in SHAPE], split) if lm else
            render(subset, tested, varying, split, paper_of(runs), x)))
    return tables, seed_p


def render(rows: list[Row], tested: list[Comparison], varying: list[str], split: str,
           paper: dict | None, x: str | None = None) -> dict[str, Any]:
    """The table as header + string rows (shared by the console, Markdown and CSV). tested: the
    rows' comparisons (report/rows.py: comparisons), one, or with x one per value of report.x."""
    bases = [c.base for c in tested if c.base is not None]
    header = ["setting", *[name for name, _ in SHAPE], "params", "runs", "valid PPL",
              f"{split} BLEU", f"{split} chrF", "p vs base", "tok/s", "peak MB"]
    multiref = any(f"{split}/bleu_multiref" in r.metrics for row in rows for r in row.runs)
    if multiref:  # several references per segment (Tatoeba): BLEU and chrF against all of them
        header[header.index("p vs base"):header.index("p vs base")] = [
            f"{split} BLEU all refs", f"{split} chrF all refs"]
    gated = any(k.startswith("heads_kept/") for row in rows for r in row.runs for k in r.metrics)
    if gated:  # Hard Concrete gates (prune.l0_lambda): heads kept per attention type
        header += list(KEPT_COLUMNS)
    pairs = {train_pairs(r) for row in rows for r in row.runs} - {None}
    if len(pairs) > 1:  # data.train_fraction or the data set varies: how much each row had
        header += ["train pairs"]
    best = any(evaluated(r) == "best" for row in rows for r in row.runs)
    if best:  # eval.checkpoint=best: which validation's weights were evaluated
        header += ["best step"]
    budgets = sorted({budget(r) for row in rows for r in row.runs} - {None})
    if budgets:  # trainer.max_time: a row's cost is fixed, its number of updates is the result
        header += ["steps", "train s"]
    if paper:
        header += ["paper PPL", "paper BLEU"]
    body = []
    for row in rows:
        c, m = row.runs[0].config, [r.metrics for r in row.runs]
        shape = shape_cells(row)
        cells = [row.label + (" (base)" if any(row is b for b in bases) else ""), *shape,
                 params_text([x.get("cost/params") for x in m]),
                 str(len(row.runs)), stat([x.get("valid/ppl") for x in m], 2),
                 stat([x.get(f"{split}/bleu") for x in m], 2),
                 stat([x.get(f"{split}/chrf") for x in m], 2),
                 *([stat([x.get(f"{split}/{k}_multiref") for x in m], 2) for k in ("bleu", "chrf")]
                   if multiref else []),
                 p_text(row),
                 stat([x.get("train/tokens_per_s") for x in m], 0),
                 stat([x.get("cost/peak_mem_mb") for x in m], 0)]
        if gated:
            cells += [stat([x.get(f"heads_kept/{site}") for x in m], 1)
                      for site in SITES]
        if len(pairs) > 1:
            cells += [params_text([train_pairs(r) for r in row.runs])]  # one number: seeds agree
        if best:
            cells += [stat([r.results.get("train", {}).get("evaluated", {}).get("step")
                            if evaluated(r) == "best" else None for r in row.runs], 0)]
        if budgets:
            cells += [stat([r.results.get("train", {}).get(k) for r in row.runs], 0)
                      for k in ("steps", "seconds")]
        if paper:
            published = paper["rows"].get(c.get(paper["key"]))
            cells += [f"{published[0]:.2f}", f"{published[1]:.1f}"] if published else ["", ""]
        body.append(cells)
    unused = [i for i in range(1, 1 + len(SHAPE)) if all(b[i] == NOT_APPLICABLE for b in body)]
    header = [x for i, x in enumerate(header) if i not in unused]  # e.g. h_K in table_a's
    body = [[x for i, x in enumerate(b) if i not in unused] for b in body]
    note = "mean ± std over the runs (seeds) of a row; " + p_note(tested, varying, x)
    if multiref:
        note += ("; all refs: against every translation of each test source (the data's other "
                 "references, sacrebleu nrefs:var), beside the one-reference scores")
    if gated:  # runs from before prune.gate_eval existed kept heads by the binary rule
        rules = sorted({r.config.get("prune.gate_eval") or "binary" for row in rows
                        for r in row.runs if "heads_kept/enc-self" in r.metrics})
        note += (f"; kept: heads the test-time gates keep, by the {' / '.join(rules)} rule "
                 "(prune.gate_eval)")
    if best:
        kinds = {evaluated(r) for row in rows for r in row.runs}
        note += ("; evaluated: the best validation's weights (eval.checkpoint=best), from the "
                 "best step" + ("" if kinds == {"best"} else ", in the runs that have one; the "
                                "others' last weights"))
    if budgets:
        note += budget_note(rows, budgets)
    if paper:
        note += f"; paper columns: {paper['label']} (theirs, not ours)"
    return {"header": header, "rows": body, "note": note, "varying": varying}


def shape_cells(row: Row) -> list[str]:
    """The row's head-shape columns (SHAPE): its variant's own kinds, d_k, layers."""
    c = row.runs[0].config
    known = model_shape(c)
    shape = []
    for _, key in SHAPE:
        if key is None and str(c.get("task")) == "lm":  # a decoder-only model's layers
            shape.append(f"{c.get('model.layers') or c.get('model.decoder_layers')} (LM)")
        elif key is None:
            shape.append(f"{c.get('model.encoder_layers')}+{c.get('model.decoder_layers')}")
        elif key == "model.head_dim":
            shape.append(str(row.runs[0].results.get("cost", {}).get("d_head")
                             or known.get(key) or c.get(key)
                             or c.get("model.d_model", 0) // (c.get("model.heads") or 1)))
        elif known:  # "–": not a key of this row's attention variant (h_K for multi-head)
            shape.append(str(known[key]) if key in known else NOT_APPLICABLE)
        else:  # a config this version cannot read: as written, unset = model.heads
            shape.append(str(c.get(key) if c.get(key) is not None else c.get("model.heads")))
    return shape


def joined(tables: list[tuple[str, dict[str, Any]]]) -> dict[str, Any]:
    """Several data sets' tables as one (for wandb): their columns' union, in order."""
    header = list(dict.fromkeys(col for _, t in tables for col in t["header"]))
    rows = [[dict(zip(t["header"], r)).get(col, "") for col in header]
            for _, t in tables for r in t["rows"]]
    return {"header": header, "rows": rows, "varying": tables[0][1]["varying"],
            "note": " / ".join(f"data={name}: {t['note']}" for name, t in tables)}


def budget_note(rows: list[Row], budgets: list[float]) -> str:
    """The note's words on a time budget: its seconds and how many runs it ended."""
    ended = sum(r.results.get("train", {}).get("stopped_by") == "max_time"
                for row in rows for r in row.runs)
    total = sum(len(row.runs) for row in rows)
    return (f"; time budget: trainer.max_time = {' / '.join(f'{b:g}' for b in budgets)} s of "
            f"updates, which ended {ended} of {total} runs; steps: the updates each made, "
            "train s: their seconds")


def budget(run: Run) -> float | None:
    """The run's time budget (trainer.max_time, seconds of updates), or None."""
    return run.results.get("train", {}).get("max_time")
