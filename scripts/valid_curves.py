"""Valid PPL against training step for single runs, finished or not: a study's figure where some
runs were cut before their results.json (a time limit, a killed job), drawn from the runs' files.

    python scripts/valid_curves.py --out results/table_a_tatoeba_base_gpu/valid_curves.png \
        --run 'h = 1' RUN_DIR --run 'h = 8' RUN_DIR ...

Each --run is a label and a run's directory (its name may hold '=': Hydra's). A run's curve is
results.json's train.valid_history where the run finished, else the validations its train.log
recorded (heads_lab.output.tracking.VALID_LINE); such a run's label says so, and where it
stopped. A validation that diverged (NaN) has no point.
A run whose directory is gone can be drawn from a CSV this script wrote before:
--run LABEL 'OLD.csv::ITS LABEL IN OLD.csv' takes that line's points and keeps their source.
Lines whose labels begin alike (up to the first comma: 'h = 8, base size') share a colour;
--style TEXT STYLE (repeatable) draws the lines whose label holds TEXT in a matplotlib line style
(dashed, dotted, dashdot; the first TEXT found wins; else solid): e.g. a style per seed. The
legend sits below the axes; --max-step N keeps the validations up to step N. Writes the figure
(--out) and, beside it, a CSV of every point
(label, step, valid loss, valid PPL, source), and prints each run's last and lowest validation.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import re
import sys
from pathlib import Path

from heads_lab.errors import ConfigError
from heads_lab.output.curves import draw_valid_curves
from heads_lab.output.files import ensure_writable
from heads_lab.output.tracking import valid_history_from_log

CSV_LINE = ".csv::"  # 'OLD.csv::ITS LABEL': a line of a CSV this script wrote
CSV_COLUMNS = ("run", "step", "valid loss", "valid PPL", "source")
LOG_NOTE = re.compile(r" \(train\.log, to step [\d,]+\)$")  # what a label from a train.log gets


def history_from_csv(spec: str) -> tuple[list[dict[str, float]], str]:
    """The points of one line of a CSV this script wrote ('OLD.csv::ITS LABEL'), and their
    source there (results.json or train.log)."""
    name, _, label = spec.partition(CSV_LINE)
    path = Path(name + ".csv").expanduser()
    if not path.is_file():
        raise SystemExit(f"valid_curves: no CSV {path}: pass a CSV this script wrote, as "
                         "'OLD.csv::ITS LABEL'")
    with path.open(newline="") as f:
        reader = csv.DictReader(f)
        rows = list(reader)
        if not set(CSV_COLUMNS) <= set(reader.fieldnames or ()):
            raise SystemExit(f"valid_curves: {path} is not a CSV this script wrote (its "
                             f"columns: {', '.join(CSV_COLUMNS)})")
    mine = [r for r in rows if r["run"] == label]
    if not mine:
        known = ", ".join(f"'{r}'" for r in dict.fromkeys(r["run"] for r in rows)) or "none"
        raise SystemExit(f"valid_curves: {path} has no line '{label}'; its lines: {known}")
    try:
        points = [{"step": int(r["step"]), "valid/loss": float(r["valid loss"]),
                   "valid/ppl": float(r["valid PPL"])} for r in mine]
    except ValueError as err:
        raise SystemExit(f"valid_curves: {path}, line '{label}': {err}: pass a CSV this script "
                         "wrote, unedited") from None
    return points, mine[0]["source"]


def history(run: Path | str) -> tuple[list[dict[str, float]], str]:
    """The run's validations and where they were read: results.json, else train.log; or a line
    of a CSV this script wrote, where `run` is no directory and names one ('OLD.csv::LABEL')."""
    if CSV_LINE in str(run) and not Path(run).expanduser().is_dir():
        return history_from_csv(str(run))
    run = Path(run).expanduser()
    results = run / "results.json"
    if results.is_file():
        return json.loads(results.read_text()).get("train", {}).get("valid_history") or [], \
            "results.json"
    log = run / "train.log"
    if not run.is_dir():
        raise SystemExit(f"valid_curves: no run dir {run}: pass a run's directory (the one with "
                         ".hydra/)")
    if not log.is_file():
        raise SystemExit(f"valid_curves: {run} has neither results.json nor train.log: "
                         "pass a run's directory (the one with .hydra/)")
    return valid_history_from_log(log.read_text(errors="replace")), "train.log"


LINE_STYLES = ("solid", "dashed", "dotted", "dashdot")


def palette(i: int) -> str:
    """The i-th line colour: matplotlib's ten, then tab20's others (never a colour twice)."""
    from matplotlib import colormaps, colors  # lazy: start-up time (matplotlib)

    if i < 10:
        return f"C{i}"
    return colors.to_hex(colormaps["tab20"](((i - 10) * 2 + 1) % 20 / 20 + 0.025))


def line_style(label: str, styles: list[tuple[str, str]]) -> str:
    """The style of the first (TEXT, STYLE) whose TEXT the label holds; solid where none."""
    return next((style for text, style in styles if text in label), "solid")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, type=Path, help="the figure (.png)")
    parser.add_argument("--title", default="valid PPL during training (★ its lowest; one run each)")
    parser.add_argument("--ymax", type=float, default=None,
                        help="the PPL axis' top (default: at most 3× the lowest point)")
    parser.add_argument("--max-step", type=int, default=None,
                        help="only the validations up to this step (the early part of runs that "
                             "went on, beside runs that stopped there)")
    parser.add_argument("--style", nargs=2, action="append", default=[],
                        metavar=("TEXT", "STYLE"), help="lines whose label holds TEXT in STYLE: "
                        + ", ".join(LINE_STYLES))
    parser.add_argument("--run", nargs=2, action="append", required=True,
                        metavar=("LABEL", "RUN_DIR"), help="a line: its label and run directory (or "
                        "'OLD.csv::ITS LABEL': a line of a CSV this script wrote)")
    opts = parser.parse_args(argv)
    if opts.out.suffix.lower() != ".png":
        raise SystemExit(f"valid_curves: --out {opts.out} is not a .png (its CSV goes beside it)")
    if opts.max_step is not None and opts.max_step < 1:
        raise SystemExit(f"valid_curves: --max-step {opts.max_step}: give a step > 0")
    if opts.ymax is not None and not opts.ymax > 0:
        raise SystemExit(f"valid_curves: --ymax {opts.ymax:g}: the PPL axis' top must be > 0")
    try:  # before any run is read
        ensure_writable(opts.out.parent, "--out's folder")
    except ConfigError as err:
        raise SystemExit(f"valid_curves: {err}") from None
    for _, style in opts.style:
        if style not in LINE_STYLES:
            raise SystemExit(f"valid_curves: --style STYLE '{style}' is not one of "
                             f"{', '.join(LINE_STYLES)}")
    data, rows, styles, colours, drawn = {}, [], {}, {}, set()
    for label, run in opts.run:
        colour = colours.setdefault(label.split(",")[0], palette(len(colours)))
        linestyle = line_style(label, opts.style)
        if (colour, linestyle) in drawn:  # two lines alike: the later one a colour of its own
            colour = colours[f"{label} (own colour)"] = palette(len(colours))
        drawn.add((colour, linestyle))
        style = {"color": colour, "linestyle": linestyle}
        points, source = history(run)
        points = [p for p in points if math.isfinite(p["valid/ppl"])
                  and (opts.max_step is None or p["step"] <= opts.max_step)]
        if not points:
            raise SystemExit(f"valid_curves: {run} recorded no finite validation ({source})")
        if source == "train.log":  # its own note, where the label (from a CSV) had one
            label = f"{LOG_NOTE.sub('', label)} (train.log, to step {points[-1]['step']:,})"
        styles[label] = style
        data[label] = ([p["step"] for p in points], [p["valid/ppl"] for p in points])
        rows += [[label, p["step"], f"{p['valid/loss']:.4f}", f"{p['valid/ppl']:.3f}", source]
                 for p in points]
        best = min(points, key=lambda p: p["valid/ppl"])
        print(f"{label}: last step {points[-1]['step']:,} PPL {points[-1]['valid/ppl']:.2f}; "
              f"lowest {best['valid/ppl']:.2f} at step {best['step']:,} ({source})")
    if draw_valid_curves(data, opts.out, opts.title, styles, True, opts.ymax) is None:
        raise SystemExit("valid_curves: no run has two validations: nothing to draw")
    with opts.out.with_suffix(".csv").open("w", newline="") as f:
        csv.writer(f).writerows([["run", "step", "valid loss", "valid PPL", "source"], *rows])
    print(f"wrote {opts.out} and {opts.out.with_suffix('.csv')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
