"""One study's seeds, reported one seed at a time, as one table.

    python scripts/seeds_table.py results/table_a_tatoeba/fp32_seed_1/runs.csv \
        results/table_a_tatoeba/bf16_seed_2/runs.csv results/table_a_tatoeba/bf16_seed_3/runs.csv

A study whose seeds were trained on different machines or in different precisions is reported
seed by seed (`heads-lab report` of each seed's run dirs, one `--out` a seed): its p-values
pair each run with the base run of its own seed, and a run whose base is of another precision
would mix two effects. This prints the rows of those reports together, as Markdown: each
setting's mean ± sample std over its seeds (valid PPL, test BLEU, test chrF), and each seed's
test BLEU minus the base run's of the same seed and runs.csv, with that seed's p, then the
mean ± std of those differences. Every number is read from the runs.csv files (`heads-lab
report` writes them); no p is pooled over seeds here, since that needs the runs' translations.
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

NEEDED = ("setting", "seed", "valid PPL", "test BLEU", "test chrF", "p vs base (its seed)")


@dataclass
class Run:
    setting: str
    seed: int
    ppl: float
    bleu: float
    chrf: float
    p: str  # "base" for the base run, else the paired bootstrap's p against it
    precision: str
    source: Path


def read(path: Path) -> list[Run]:
    """The runs of one runs.csv, one per line."""
    try:
        with open(path, newline="", encoding="utf-8") as f:
            rows = list(csv.DictReader(f))
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"error: cannot read {path} ({e.__class__.__name__}); give the runs.csv "
                         "that heads-lab report writes") from None
    if not rows or any(key not in rows[0] for key in NEEDED):
        raise UserError(f"error: {path} is not a heads-lab runs.csv (needs the columns "
                         f"{', '.join(NEEDED)}); give the runs.csv beside a report.md")
    runs = []
    for i, row in enumerate(rows, start=2):
        try:
            runs.append(Run(row["setting"], int(row["seed"]), float(row["valid PPL"]),
                            float(row["test BLEU"]), float(row["test chrF"]),
                            row["p vs base (its seed)"], row.get("precision") or "?", path))
        except ValueError:
            raise UserError(f"error: {path} line {i}: a run without its seed or numbers "
                             "(not evaluated?); report only evaluated runs") from None
    return runs


def _mean_std(values: list[float], digits: int, sign: str = "") -> str:
    if len(values) == 1:
        return f"{values[0]:{sign}.{digits}f}"
    return f"{statistics.mean(values):{sign}.{digits}f} ± {statistics.stdev(values):.{digits}f}"


def table(runs: list[Run]) -> str:
    """The Markdown table (see the module's docstring). Refuses a seed of a setting given twice
    and runs.csv files whose base runs are of different settings."""
    seen: dict[tuple[str, int], Path] = {}
    for run in runs:
        key = (run.setting, run.seed)
        if key in seen:
            raise UserError(f"error: seed {run.seed} of {run.setting} is in {seen[key]} and in "
                             f"{run.source}; give each run once")
        seen[key] = run.source
    bases = {run.setting for run in runs if run.p == "base"}
    if len(bases) > 1:
        raise UserError(f"error: the runs.csv files have different base rows ({', '.join(sorted(bases))}); "
                         "give reports made with one report.base")
    base = {(run.source, run.seed): run for run in runs if run.p == "base"}
    settings = list(dict.fromkeys(run.setting for run in runs))
    lines = ["| setting | seeds (precision) | valid PPL | test BLEU | test chrF | "
             "BLEU − its seed's base (p) | mean ± std |",
             "|---|---|---:|---:|---:|---|---:|"]
    for setting in settings:
        mine = sorted((run for run in runs if run.setting == setting), key=lambda r: r.seed)
        seeds = ", ".join(f"{run.seed} {run.precision}" for run in mine)
        diffs, cells = [], []
        for run in mine:
            partner = base.get((run.source, run.seed))
            if run.p == "base":
                continue
            if partner is None:
                cells.append(f"seed {run.seed}: no base run")
                continue
            diffs.append(run.bleu - partner.bleu)
            cells.append(f"seed {run.seed}: {diffs[-1]:+.2f} ({run.p})")
        name = f"{setting} (base)" if setting in bases else setting
        lines.append(
            f"| {name} | {seeds} | {_mean_std([r.ppl for r in mine], 2)} | "
            f"{_mean_std([r.bleu for r in mine], 2)} | {_mean_std([r.chrf for r in mine], 2)} | "
            f"{'; '.join(cells) or '–'} | {_mean_std(diffs, 2, '+') if diffs else '–'} |")
    return "\n".join(lines)


class UserError(Exception):
    """A file this script cannot use: one line on stderr, exit 2 (as heads-lab's commands)."""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("runs", nargs="+", type=Path, help="runs.csv files, a seed (or more) each")
    args = parser.parse_args(argv)
    try:
        print(table([run for path in args.runs for run in read(path)]))
    except UserError as err:
        print(err, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
