"""BLEU against training pairs, a line per h and corpus: heads_by_data studies of several corpora
in one figure, drawn from their `heads-lab report` tables (report.csv).

    python scripts/data_size_figure.py --out results/heads_by_data_tatoeba/bleu_by_data.png \
        'Multi30k (image captions)=results/heads_by_data_gpu/report.csv:29000' \
        'Tatoeba (everyday sentences)=results/heads_by_data_tatoeba/report.csv'

Each argument is LABEL=CSV[:PAIRS]. A row's x is its `train pairs` column where the report has
one, else round(data.train_fraction × PAIRS) (PAIRS: the corpus' training pairs, as
data.train_fraction subsets them; a report written before the column existed needs it). Left:
test BLEU (mean ± std over the row's seeds); right: each h's BLEU minus h = 8's at the same data
size (means), so a line above 0 is an h that beats 8 heads. In both, a data size whose points rest
on fewer seeds than the most is labelled once, below its lowest point: n = k, or the seeds per h
where its rows differ (a difference rests on the fewer seeds of its two rows). Colour is h, marker
and line style the corpus: the corpora differ in domain, so their lines are kept apart, never
joined.

A study whose report could not be rebuilt with its later seeds (their runs reported on their own)
takes them with --add LABEL=RUNS_CSV[:h=H,...]: the runs.csv of another report, each run folded
into LABEL's row of the same h and training pairs (its mean and std recomputed from the row's
mean, std and runs, so to the report's two decimals), or a row of its own; `:h=32` takes only
that h's runs, e.g. where the other report's h = 8 run is a seed the row already has (a
report.csv does not name its seeds, so only the filter keeps a seed from being counted twice):

    python scripts/data_size_figure.py --out results/heads_by_data_tatoeba/bleu_by_data.png \
        'Multi30k (image captions)=results/heads_by_data_gpu/report.csv:29000' \
        'Tatoeba (everyday sentences)=results/heads_by_data_tatoeba/report.csv' \
        --add 'Tatoeba (everyday sentences)=results/heads_by_data_tatoeba/30pct_seed_3/runs.csv' \
        --add 'Tatoeba (everyday sentences)=results/heads_by_data_tatoeba/30pct_seed_2/runs.csv:h=32'
"""

from __future__ import annotations

import argparse
import csv
import math
import re
from dataclasses import dataclass
from pathlib import Path

STYLES = (("o", "-"), ("s", "--"), ("^", ":"), ("D", "-."))
BASE_H = 8


@dataclass
class Point:
    corpus: str
    h: int
    pairs: int
    bleu: float
    std: float
    runs: int


def _number(text: str) -> float:
    return float(text.replace(",", ""))


def _mean_std(cell: str, sd: str | None = None) -> tuple[float, float]:
    """A report.csv's mean and sd: the column and its ' sd' column ('38.57', '0.54'), or one
    cell as reports wrote it before ('38.57 ± 0.54'); a single run's sd is 0."""
    parts = cell.split("±")
    if len(parts) > 1:
        return _number(parts[0]), _number(parts[1])
    return _number(parts[0]), (_number(sd) if sd else 0.0)


def read(label: str, path: Path, full_pairs: int | None) -> list[Point]:
    """The rows of one report.csv as points (h, training pairs, test BLEU)."""
    with open(path, newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    if not rows or "test BLEU" not in rows[0] or "h" not in rows[0]:
        raise SystemExit(f"error: {path} is not a heads-lab report.csv with h and test BLEU columns")
    points = []
    for row in rows:
        if row.get("train pairs"):
            pairs = int(_number(row["train pairs"]))
        else:
            found = re.search(r"train_fraction=([0-9.]+)", row["setting"])
            if not found or full_pairs is None:
                raise SystemExit(f"error: {path} has no train pairs column; give the corpus' "
                                 f"training pairs as {label}={path}:PAIRS")
            pairs = max(1, round(float(found.group(1)) * full_pairs))
        bleu, std = _mean_std(row["test BLEU"], row.get("test BLEU sd"))
        points.append(Point(label, int(row["h"]), pairs, bleu, std, int(row["runs"])))
    return points


def read_runs(path: Path, heads: set[int] | None) -> list[tuple[int, int, int, float]]:
    """A report's runs.csv as (h, training pairs, seed, test BLEU), one a run; `heads`: only
    those h."""
    try:
        with open(path, newline="", encoding="utf-8") as f:
            rows = list(csv.DictReader(f))
    except UnicodeDecodeError:
        raise SystemExit(f"error: {path} is not a UTF-8 runs.csv; give a heads-lab runs.csv "
                         f"as written") from None
    need = {"setting", "seed", "test BLEU", "train pairs"}
    if not rows or not need <= set(rows[0]):
        raise SystemExit(f"error: {path} is not a heads-lab runs.csv with "
                         f"{', '.join(sorted(need))} columns")
    runs = []
    for row in rows:
        found = re.search(r"(?:^|,)h=(\d+)", row["setting"])
        if not found:
            raise SystemExit(f"error: {path}: setting {row['setting']!r} names no h")
        h = int(found.group(1))
        if heads is None or h in heads:
            try:
                bleu = float(row["test BLEU"])
                if not math.isfinite(bleu):
                    raise ValueError(bleu)
                runs.append((h, int(_number(row["train pairs"])), int(row["seed"]), bleu))
            except (ValueError, TypeError, AttributeError):  # a cell not a number, or missing
                raise SystemExit(f"error: {path}: the run {row['setting']!r} has a seed, test BLEU "
                                 f"or train pairs that is not a number; give a heads-lab "
                                 f"runs.csv as written") from None
    if not runs:
        raise SystemExit(f"error: {path} has no run of h = {sorted(heads or [])}")
    return runs


def fold(points: list[Point], corpus: str, runs: list[tuple[int, int, int, float]],
         seen: set[tuple[str, int, int, int]] | None = None) -> list[str]:
    """Each run into `corpus`' point of its h and training pairs, in place (a point of its own
    where there is none): n runs of mean m and sample std s plus the new values x give
    mean = (n m + Σx) / N and std² = ((n − 1) s² + n m² + Σx² − N mean²) / (N − 1), N = n + k.
    `seen`: the (corpus, h, pairs, seed) folded so far, shared by the calls of one figure, so a
    run given by two runs.csv is refused. Returns a line per changed point."""
    if not any(p.corpus == corpus for p in points):
        raise SystemExit(f"error: --add names {corpus!r}, which no study is labelled; "
                         f"use one of {sorted({p.corpus for p in points})}")
    seen = set() if seen is None else seen
    lines = []
    for h, pairs in dict.fromkeys((h, pairs) for h, pairs, _, _ in runs):
        mine = [(seed, bleu) for rh, rp, seed, bleu in runs if (rh, rp) == (h, pairs)]
        for seed, _ in mine:
            if (corpus, h, pairs, seed) in seen:
                raise SystemExit(f"error: --add gives seed {seed} of h = {h} at {pairs:,} pairs "
                                 f"twice; take it from one runs.csv only")
            seen.add((corpus, h, pairs, seed))
        point = next((p for p in points if (p.corpus, p.h, p.pairs) == (corpus, h, pairs)), None)
        if point is None:
            point = Point(corpus, h, pairs, 0.0, 0.0, 0)
            points.append(point)
        n, k = point.runs, len(mine)
        total = n * point.bleu + sum(b for _, b in mine)
        squares = (n - 1) * point.std ** 2 + n * point.bleu ** 2 + sum(b * b for _, b in mine)
        mean = total / (n + k)
        std = math.sqrt(max(0.0, squares - (n + k) * mean ** 2) / (n + k - 1)) if n + k > 1 else 0.0
        seeds = ", ".join(str(s) for s, _ in mine)
        lines.append(f"{corpus}, h = {h} at {pairs:,} pairs: {n} run{'' if n == 1 else 's'} "
                     f"+ seed {seeds} → {mean:.2f} ± {std:.2f} over {n + k}")
        point.bleu, point.std, point.runs = mean, std, n + k
    return lines


def differences(points: list[Point]) -> dict[tuple[str, int], list[tuple[int, float]]]:
    """(corpus, h) → [(pairs, BLEU − BLEU of h = 8 at the same corpus and pairs)], h ≠ 8."""
    base = {(p.corpus, p.pairs): p.bleu for p in points if p.h == BASE_H}
    out: dict[tuple[str, int], list[tuple[int, float]]] = {}
    for p in sorted(points, key=lambda p: p.pairs):
        if p.h != BASE_H and (p.corpus, p.pairs) in base:
            out.setdefault((p.corpus, p.h), []).append((p.pairs, p.bleu - base[p.corpus, p.pairs]))
    return out


def few_seeds(points: list[Point], most: int | None = None) -> dict[tuple[str, int], str]:
    """(corpus, pairs) → its "n = …" label, at the data sizes where a point rests on fewer seeds
    than `most` (default: the most of any point): "n = 2" where all its points have 2, else the
    seeds per h, "n = 2 (h = 1, 8)" over "n = 1 (h = 32)"."""
    if not points:
        return {}
    most = most or max(p.runs for p in points)
    at: dict[tuple[str, int], dict[int, int]] = {}
    for p in points:
        at.setdefault((p.corpus, p.pairs), {})[p.h] = p.runs
    return {key: seeds_label(runs) for key, runs in at.items() if min(runs.values()) < most}


def diff_seeds(points: list[Point]) -> dict[tuple[str, int], str]:
    """few_seeds for the differences: h − 8 rests on the fewer seeds of its two rows."""
    base = {(p.corpus, p.pairs): p.runs for p in points if p.h == BASE_H}
    return few_seeds([Point(p.corpus, p.h, p.pairs, 0.0, 0.0, min(p.runs, base[p.corpus, p.pairs]))
                      for p in points if p.h != BASE_H and (p.corpus, p.pairs) in base],
                     most=max((p.runs for p in points), default=0))


def seeds_label(runs: dict[int, int]) -> str:
    """{h: seeds} → "n = 3", or a line per seed count, most first: "n = 2 (h = 1, 8)"."""
    counts = sorted(set(runs.values()), reverse=True)
    if len(counts) == 1:
        return f"n = {counts[0]}"
    return "\n".join(f"n = {n} (h = {', '.join(str(h) for h in sorted(runs) if runs[h] == n)})"
                     for n in counts)


def _lowest(items) -> dict[tuple[str, int], float]:
    """(corpus, pairs) → the lowest y drawn there, from ((corpus, pairs), y) items."""
    low: dict[tuple[str, int], float] = {}
    for key, y in items:
        low[key] = min(low.get(key, y), y)
    return low


def _mark(ax, marks: dict[tuple[str, int], str], lowest: dict[tuple[str, int], float]) -> None:
    """Each data size's label once, hanging below its lowest point drawn on `ax` on a white
    ground (lines pass behind it; room kept below the lowest point of all; at the largest size it
    ends at the point, inside the axes)."""
    if marks:
        ax.margins(y=0.3 if any("\n" in text for text in marks.values()) else 0.12)
    right = max((key[1] for key in lowest), default=0)
    for key, text in marks.items():
        if key in lowest:
            edge = key[1] == right
            ax.annotate(text, (key[1], lowest[key]), xytext=(6 if edge else 0, -8),
                        textcoords="offset points", ha="right" if edge else "center", va="top",
                        fontsize=7, bbox={"boxstyle": "round,pad=0.2", "fc": "white",
                                          "ec": "none", "alpha": 0.85})


def draw(points: list[Point], out: Path, title: str = "") -> None:
    import matplotlib  # lazy: start-up time (matplotlib)

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # lazy: after use("Agg")

    corpora = list(dict.fromkeys(p.corpus for p in points))
    heads = sorted({p.h for p in points})
    colours = {h: plt.get_cmap("tab10")(i) for i, h in enumerate(heads)}
    style = {c: STYLES[i % len(STYLES)] for i, c in enumerate(corpora)}
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.8))
    for corpus in corpora:
        marker, line = style[corpus]
        for h in heads:
            mine = sorted((p for p in points if p.corpus == corpus and p.h == h),
                          key=lambda p: p.pairs)
            if mine:
                left.errorbar([p.pairs for p in mine], [p.bleu for p in mine],
                              [p.std for p in mine], marker=marker, linestyle=line, capsize=3,
                              color=colours[h], label=f"{corpus}, h = {h}")
    diffs = differences(points)
    for (corpus, h), series in diffs.items():
        marker, line = style[corpus]
        right.plot([x for x, _ in series], [y for _, y in series], marker=marker, linestyle=line,
                   color=colours[h], label=f"{corpus}, h = {h}")
    right.axhline(0, color="grey", linewidth=1)
    most = max(p.runs for p in points)
    marks, diff_marks = few_seeds(points), diff_seeds(points)  # each data size says so once
    fewer = "; n = fewer, where marked"
    left.set_title(f"test BLEU\n(mean ± std over {most} seeds{fewer if marks else ''})",
                   fontsize=10)
    right.set_title(f"BLEU minus h = {BASE_H}'s at the same data size\n"
                    f"(means{fewer if diff_marks else ''})", fontsize=10)
    _mark(left, marks, _lowest(((p.corpus, p.pairs), p.bleu - p.std) for p in points))
    _mark(right, diff_marks, _lowest(((corpus, x), y) for (corpus, _), series in diffs.items()
                                     for x, y in series))
    ticks = sorted({p.pairs for p in points})
    for ax in (left, right):
        ax.set_xscale("log")
        ax.set_xticks(ticks, [f"{t / 1000:.1f}k" if t < 10_000 else f"{t / 1000:.0f}k"
                              for t in ticks], rotation=45)
        ax.minorticks_off()
        ax.set_xlabel("training pairs (log scale)")
        ax.grid(alpha=0.3)
    left.set_ylabel("test BLEU (each corpus' own test set)")
    right.set_ylabel(f"BLEU − BLEU(h = {BASE_H})")
    for ax in (left, right):  # below the axes: no point hidden behind a legend
        ax.legend(fontsize=7, ncol=2, loc="upper center", bbox_to_anchor=(0.5, -0.3))
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(out, dpi=120, bbox_inches="tight")
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("studies", nargs="+", help="LABEL=CSV[:PAIRS]")
    parser.add_argument("--out", required=True, help="the PNG to write")
    parser.add_argument("--title", default="More heads with more data? d_model 256, 3+3 layers, "
                        "d_k = 256 / h", help="the figure's title: say which model the studies "
                        "trained (default: the published study's)")
    parser.add_argument("--add", action="append", default=[], metavar="LABEL=RUNS_CSV[:h=H,...]",
                        help="fold another report's runs (runs.csv) into LABEL's rows")
    opts = parser.parse_args(argv)
    points = []
    for item in opts.studies:
        label, sep, where = item.partition("=")
        if not sep:
            raise SystemExit(f"error: {item!r}: expected LABEL=CSV[:PAIRS]")
        path, _, pairs = where.partition(":")
        if not Path(path).is_file():
            raise SystemExit(f"error: no report {path}")
        if pairs and not pairs.isdigit():
            raise SystemExit(f"error: {item!r}: PAIRS must be a whole number of training pairs, "
                             "e.g. :29000")
        points += read(label, Path(path), int(pairs) if pairs else None)
    folded: set[tuple[str, int, int, int]] = set()
    for item in opts.add:
        label, sep, where = item.partition("=")
        path, _, only = where.partition(":")
        heads = None
        if only:
            if not re.fullmatch(r"h=\d+(,h=\d+)*", only):
                raise SystemExit(f"error: {item!r}: expected LABEL=RUNS_CSV[:h=H,...], "
                                 f"e.g. :h=32 or :h=1,h=32")
            heads = {int(h) for h in re.findall(r"\d+", only)}
        if not sep or not Path(path).is_file():
            raise SystemExit(f"error: --add {item!r}: expected LABEL=RUNS_CSV[:h=H,...] "
                             f"with an existing runs.csv")
        for line in fold(points, label, read_runs(Path(path), heads), folded):
            print(line)
    Path(opts.out).parent.mkdir(parents=True, exist_ok=True)
    draw(points, Path(opts.out), opts.title)
    for (corpus, h), series in differences(points).items():
        text = ", ".join(f"{x:,}: {y:+.2f}" for x, y in series)
        print(f"{corpus}, h = {h} minus h = {BASE_H}: {text}")
    print(f"figure: {opts.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
