"""Every published study's p-values again, counting seeds: for each study under results/ with a
runs.csv, each row's p against its base row as `heads-lab report <runs.csv>` computes it now
(Welch's t over the seeds, docs/significance.md; over the seeds alone, since the published runs'
translations are gone), beside the p its published report.csv printed (sacrebleu's paired
bootstrap on the seeds' hypotheses pooled, in the reports made before the seed-aware test; the
seed-aware p itself, marked, in those made since).

    python scripts/seed_aware_p.py > results/significance/seed_aware_p.md
    python scripts/seed_aware_p.py results/table_a_tatoeba results/heads_by_data_tatoeba

Rows are the report's, grouped from runs.csv; a row of one seed (or a base of one) has no
seed-aware p and says why. Each row's mean BLEU is recomputed from runs.csv's per-run values (as
published, often to two decimals). A published p is against the base row of its own report,
and so is the seed-aware one (for a study with one base per data size, each size's h = 8,
whatever an older report took). A study's pairs/ folders compare two of its rows.
"""

from __future__ import annotations

import argparse
import csv
import re
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from heads_lab.errors import DataError  # noqa: E402
from heads_lab.report.rows import (  # noqa: E402
    Comparison,
    collect,
    comparisons,
    data_sets,
    group,
)
from heads_lab.report.seeds import p_text, significance  # noqa: E402

RESULTS = Path(__file__).resolve().parents[1] / "results"


def published(study: Path) -> tuple[dict[str, str], list[str]]:
    """The published report.csv's p per row label (without ' (base)'), and its base rows."""
    with open(study / "report.csv", newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    label = [row["setting"].removesuffix(" (base)").replace("=None", "=null") for row in rows]
    return ({name: floor(row.get("p vs base", "")) for name, row in zip(label, rows)},
            [name for name, row in zip(label, rows) if row["setting"].endswith(" (base)")])


def floor(p: str) -> str:
    """A printed p as the results pages write it: at the bootstrap's floor (1,000 resamples:
    0.001) "≤ 0.001", and a one-seed bootstrap's mark "(seed 1)" as "(seed 1, sentences
    only)"."""
    p = re.sub(r"\((seeds? [\d, ]+)\)", r"(\1, sentences only)", p)
    head, sep, rest = p.partition(" ")
    return f"≤ 0.001{sep}{rest}" if head in ("0.001", "0.0010") else p


def rows_of(study: Path) -> list[tuple[str, int, str, str, str]]:
    """(label, runs, mean ± sd BLEU, published p, seed-aware p) per row of the study."""
    runs, _ = collect([study / "runs.csv"])
    split = runs[0].results["decoding"]["split"]
    rows, _ = group(runs)
    before, bases = published(study)
    out = []
    for subset in data_sets(rows).values():
        x, tested = comparisons(subset, runs)
        mine = [row for row in subset if row.label in bases]
        if x is None and len(bases) == 1 and mine:  # the published report's base row
            tested = [Comparison(subset, mine[0])]
        for c in tested:
            if c.base is not None:
                significance(c.rows, c.base, split, 200)
        for row in subset:
            bleu = [r.metrics[f"{split}/bleu"] for r in row.runs if f"{split}/bleu" in r.metrics]
            mean = (f"{statistics.fmean(bleu):.2f}" + (f" ± {statistics.stdev(bleu):.2f}"
                                                       if len(bleu) > 1 else "")) if bleu else "-"
            base = any(row is c.base for c in tested)
            after = p_text(row)
            if row.p_value is None and row.p_reason and \
                    row.p_reason.startswith(f"no {split} translations"):
                after = "– (one seed a side, its translations gone)"
            out.append((row.label + (" (base)" if base else ""), len(row.runs), mean,
                        before.get(row.label, ""), after))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("studies", nargs="*", type=Path,
                        help="study dirs (default: every results/ dir with runs.csv and "
                             "report.csv)")
    opts = parser.parse_args()
    studies = opts.studies or sorted(p.parent for p in RESULTS.rglob("runs.csv")
                                     if (p.parent / "report.csv").is_file())
    print("| study | row | runs | test BLEU | p the published report printed (pooled, sentences "
          "only, unless marked) | p over seeds |")
    print("|---|---|---:|---:|---:|---:|")
    for study in studies:
        name = study.resolve().relative_to(RESULTS) if study.resolve().is_relative_to(
            RESULTS) else study
        try:
            found = rows_of(study)
        except (DataError, OSError) as err:
            print(f"error: {study}: {err}", file=sys.stderr)
            return 2
        for label, n, mean, before, after in found:
            print(f"| {name} | {label} | {n} | {mean} | {before} | {after} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
